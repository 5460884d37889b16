// Command crossbuild builds, for another architecture, the programs the
// kernel matrix's guests of that architecture run in their tests, under
// the names the tests take them prebuilt by (internal/testenv).
//
// Usage: go run ./tools/kmatrix/crossbuild -arch arm64 [-full] -o DIR
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/offcpu/offcpu/internal/testenv"
)

// programs: the build commands of the tests suite.sh runs on arm64, as
// each test writes it (keyDir: BuildIn's dir; dir: where that is from
// the repository's root).
var programs = []struct {
	keyDir, dir string
	full        bool // for KMATRIX_FULL's tests alone
	cmd         []string
}{
	{"", "collector", false, []string{"go", "build", "-o", "workload", "./testdata/workload"}},
	{"", "collector", false, []string{"gcc", "-O2", "-pthread", "-o", "split", "testdata/split/split.c"}},
	{"", "collector", false, []string{"gcc", "-O2", "-g0", "-pthread", "-o", "blocker", "testdata/unwind/blocker.c", "-fomit-frame-pointer"}},
	{"", "collector", false, []string{"gcc", "-O2", "-g0", "-pthread", "-o", "blocker", "testdata/unwind/blocker.c", "-fno-omit-frame-pointer"}},
	{"../../tools/otelcol", "tools/otelcol", true, []string{"go", "build", "-o", "offcpu-otelcol", "."}},
}

func main() {
	arch := flag.String("arch", "arm64", "the guests' GOARCH")
	out := flag.String("o", "", "the prebuilt directory (required)")
	full := flag.Bool("full", false, "the slow tests' programs too (KMATRIX_FULL)")
	flag.Parse()
	if *out == "" {
		fmt.Fprintln(os.Stderr, "crossbuild: -o DIR is required")
		os.Exit(2)
	}
	for _, p := range programs {
		if p.full && !*full {
			continue
		}
		if err := testenv.CrossBuild(*out, *arch, p.keyDir, p.dir, p.cmd[0], p.cmd[1:]...); err != nil {
			fmt.Fprintln(os.Stderr, "crossbuild:", err)
			os.Exit(1)
		}
	}
}
