package symtab

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"
)

// Small enough to be inlined into their callers.
func inlinedLeaf() []uintptr {
	pcs := make([]uintptr, 32)
	return pcs[:runtime.Callers(1, pcs)]
}

func inlinedMiddle() []uintptr { return inlinedLeaf() }

// The frames of this test binary's own stack, inlined calls included,
// are those Go's runtime.CallersFrames gives (wrappers left out).
func TestInlinedFramesMatchRuntime(t *testing.T) {
	pcs := inlinedMiddle()
	var want []string
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		want = append(want, f.Function)
		if !more {
			break
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sf, err := openSymFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	// runtime.Callers gives a pc for each inlined call too: one lookup
	// expands the inlined calls of a pc, and stands for that many pcs.
	var got []string
	for i := 0; i < len(pcs); {
		fr, ok := sf.LookupFrames(uint64(pcs[i]) - 1) // return addresses: the call is before
		if !ok {
			t.Fatalf("pc %#x not found", pcs[i])
		}
		for _, f := range fr {
			if !f.Wrapper {
				got = append(got, f.Func)
			}
		}
		i += len(fr)
	}
	if want[0] != "github.com/offcpu/offcpu/collector/symtab.inlinedLeaf" || want[1] != "github.com/offcpu/offcpu/collector/symtab.inlinedMiddle" {
		t.Skipf("the compiler did not inline the test's functions: %v", want[:2])
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("frames\n%q\nwant (runtime.CallersFrames)\n%q", got, want)
	}
}

// A stripped Go binary (no symbols: the function data found through the
// runtime's module data) names every address as the same binary with
// symbols does, inlined calls included; Go 1.19's layout too where it is
// installed.
func TestInlinedFramesStripped(t *testing.T) {
	dir := t.TempDir()
	type pair struct{ gobin, name string }
	tools := []pair{{"go", "current"}}
	if fileExists("/usr/lib/go-1.19/bin/go") {
		tools = append(tools, pair{"/usr/lib/go-1.19/bin/go", "go1.19"})
	}
	for _, tc := range tools {
		t.Run(tc.name, func(t *testing.T) {
			src := filepath.Join(dir, tc.name)
			os.MkdirAll(src, 0o755)
			os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n\nimport (\"fmt\"; \"net/http\")\n\nfunc main() { fmt.Println(http.ListenAndServe(\"127.0.0.1:0\", nil)) }\n"), 0o644)
			with, without := filepath.Join(src, "with"), filepath.Join(src, "without")
			for _, args := range [][]string{{"-o", with}, {"-ldflags=-s -w", "-o", without}} {
				cmd := exec.Command(tc.gobin, append(append([]string{"build"}, args...), "main.go")...)
				cmd.Dir, cmd.Env = src, append(os.Environ(), "GO111MODULE=off", "GOTOOLCHAIN=local", "GOFLAGS=")
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%s build: %v\n%s", tc.gobin, err, out)
				}
			}
			a, err := openSymFile(with)
			if err != nil {
				t.Fatal(err)
			}
			b, err := openSymFile(without)
			if err != nil {
				t.Fatal(err)
			}
			if b.gofn == nil || b.gofn.data == nil {
				t.Fatal("the stripped binary's function data was not found")
			}
			ef, err := elf.Open(with)
			if err != nil {
				t.Fatal(err)
			}
			defer ef.Close()
			tab := GoTable(ef)
			inlined := 0
			for _, fn := range tab.Funcs {
				for pc := fn.Entry; pc < fn.End; pc += 29 {
					fa, _ := a.LookupFrames(pc)
					fb, _ := b.LookupFrames(pc)
					if !reflect.DeepEqual(fa, fb) {
						t.Fatalf("pc %#x: %+v with symbols, %+v stripped", pc, fa, fb)
					}
					if len(fa) > 1 {
						inlined++
					}
				}
			}
			if inlined == 0 {
				t.Error("no address inside an inlined call")
			}
			t.Logf("%d functions; %d addresses inside inlined calls named alike", len(tab.Funcs), inlined)
		})
	}
}
