// Command gen writes the Go constants of the BPF programs' shared headers
// (package cconst): gen -o FILE -pkg PKG [-skip ENUM,...] HEADER...
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/offcpu/offcpu/bpf/internal/cconst"
)

func main() {
	out := flag.String("o", "", "the Go file to write")
	pkg := flag.String("pkg", "bpf", "its package")
	skip := flag.String("skip", "", "enums bpf2go exports, comma-separated")
	flag.Parse()
	sk := map[string]bool{}
	for _, e := range strings.Split(*skip, ",") {
		sk[e] = e != ""
	}
	b, err := cconst.Generate(*pkg, flag.Args(), sk)
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cconst:", err)
		os.Exit(1)
	}
}
