package bpf

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/offcpu/offcpu/bpf/internal/cconst"
)

// constants_gen.go is what the shared headers say now (go generate ./bpf
// after editing them).
func TestConstantsGenerated(t *testing.T) {
	want, err := cconst.Generate("bpf", []string{"offcpu_shared.h", "goroutines_shared.h", "ruby_shared.h"}, map[string]bool{"offcpu_stat": true})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("constants_gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("constants_gen.go is stale: run go generate ./bpf")
	}
}

// Every header includes what it uses: alone, or in any order, it compiles.
func TestHeadersStandAlone(t *testing.T) {
	if _, err := exec.LookPath("clang"); err != nil {
		if os.Getenv("CI") != "" || os.Getenv("OFFCPU_REQUIRE_BPF") != "" {
			t.Fatalf("clang not found: run bash .ci/deps (apt-get install clang llvm libbpf-dev)")
		}
		t.Skip("clang not found")
	}
	headers, err := filepath.Glob("*.bpf.h")
	if err != nil || len(headers) < 5 {
		t.Fatalf("headers: %v %v", headers, err)
	}
	reversed := ""
	for i := len(headers) - 1; i >= 0; i-- {
		reversed += `#include "` + headers[i] + "\"\n"
	}
	units := map[string]string{"all, reversed": reversed}
	for _, h := range headers {
		units[h] = `#include "` + h + "\"\n"
	}
	dir := t.TempDir()
	wd, _ := os.Getwd()
	for name, src := range units {
		f := filepath.Join(dir, "unit.c")
		if err := os.WriteFile(f, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		for _, arch := range []string{"x86", "arm64"} {
			out, err := exec.Command("clang", "-target", "bpf", "-D__TARGET_ARCH_"+arch, "-O2", "-g", "-fsyntax-only",
				"-Werror=implicit-function-declaration", "-I", wd, "-I/usr/include/x86_64-linux-gnu", f).CombinedOutput()
			if err != nil {
				t.Errorf("%s does not compile alone for %s: %v\n%s", name, arch, err, out)
			}
		}
	}
}

func TestGoName(t *testing.T) {
	for c, want := range map[string]string{"STATE_SLEEPING": "StateSleeping", "G_BASE_WORDS": "GBaseWords", "EV_MAP": "EvMap"} {
		if got := cconst.GoName(c); got != want {
			t.Errorf("GoName(%s) = %s, want %s", c, got, want)
		}
	}
}
