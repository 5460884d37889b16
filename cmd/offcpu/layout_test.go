package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// workloadPkg is the bundled workload's tree: the profiler's commands and
// packages never import it; bench (and its command) is the one bridge.
const workloadPkg = "github.com/offcpu/offcpu/workload"

// bridges are the command files that run the bundled workload.
var bridges = map[string]bool{"bench.go": true, "dispatch.go": true}

func TestCommandsDoNotImportTheWorkload(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || bridges[f] {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		checked++
		for _, imp := range af.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.HasPrefix(p, workloadPkg) {
				t.Errorf("%s imports %s: only %v may", f, p, bridges)
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d command files, want the record, analyze, diff, flamegraph... ones", checked)
	}
}

func TestProfilerPackagesDoNotDependOnTheWorkload(t *testing.T) {
	mod := "github.com/offcpu/offcpu/"
	pkgs := []string{"analysis", "collector/...", "runtimes/...", "kernel", "flamegraph", "otlp", "schema", "bpf"}
	for i, p := range pkgs {
		pkgs[i] = mod + p
	}
	out, err := exec.Command("go", append([]string{"list", "-deps", "-f", "{{.ImportPath}}"}, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, workloadPkg) {
			t.Errorf("the profiler's packages depend on %s", dep)
		}
	}
	if !strings.Contains(string(out), mod+"collector") {
		t.Fatalf("go list gave no collector package: %s", out)
	}
}

// The house's limits: no hand-written Go file over 700 lines, no type
// with more than 30 methods, no package over 6,000 lines of product code.
func TestHouseLimits(t *testing.T) {
	const maxLines, maxMethods, maxPackage = 700, 30, 6000
	methods := map[string]int{}  // by package directory and type
	pkgLines := map[string]int{} // by package directory
	files := 0
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || strings.HasSuffix(path, "_bpfel.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		files++
		n := bytes.Count(b, []byte("\n"))
		if n > maxLines {
			t.Errorf("%s: %d lines, want at most %d", path, n, maxLines)
		}
		pkgLines[filepath.Dir(path)] += n
		af, err := parser.ParseFile(token.NewFileSet(), path, b, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range af.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
				continue
			}
			typ := fd.Recv.List[0].Type
			if st, ok := typ.(*ast.StarExpr); ok {
				typ = st.X
			}
			if ix, ok := typ.(*ast.IndexExpr); ok {
				typ = ix.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				methods[filepath.Dir(path)+"."+id.Name]++
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("walked %d Go files, want the whole module", files)
	}
	for typ, n := range methods {
		if n > maxMethods {
			t.Errorf("%s has %d methods, want at most %d", typ, n, maxMethods)
		}
	}
	for dir, n := range pkgLines {
		rel, _ := filepath.Rel("../..", dir)
		if n > maxPackage {
			t.Errorf("package %s: %d lines of product code, want at most %d (split it by concept)", rel, n, maxPackage)
		}
	}
	if len(pkgLines) < 10 {
		t.Fatalf("counted %d packages, want the whole module", len(pkgLines))
	}
}

// The output packages take what they need of the analysis as interfaces
// (otlp.Categorizer): neither imports analysis.
func TestOutputsDoNotImportAnalysis(t *testing.T) {
	mod := "github.com/offcpu/offcpu/"
	for _, p := range []string{"otlp", "flamegraph"} {
		out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", mod+p).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), mod+"schema") && p == "otlp" {
			t.Fatalf("go list %s gave no schema dependency: %s", p, out)
		}
		for _, dep := range strings.Fields(string(out)) {
			if dep == mod+"analysis" {
				t.Errorf("%s depends on analysis", p)
			}
		}
	}
}
