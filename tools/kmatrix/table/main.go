// Command table turns the kernel matrix's runs (tools/kmatrix/matrix.sh)
// into one markdown table: each check by kernel, then each program's
// verifier figures by kernel.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/offcpu/offcpu/kernel"
)

// run is one kernel's output.
type run struct {
	kernel string
	report kernel.Report
	tests  map[string]string // name: PASS, FAIL or SKIP with its time
	order  []string
	exit   string
	start  string // record's start-up line
	// elsewhere: the command that ran this kernel's tests instead (the
	// host's, in the main pass).
	elsewhere string
}

var testLine = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(([0-9.]+)s\)`)

func parse(r io.Reader) (*run, error) {
	out := &run{tests: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var js strings.Builder
	inJSON := false
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		switch {
		case strings.HasPrefix(line, "KMATRIX-BEGIN "):
			out.kernel = strings.TrimPrefix(line, "KMATRIX-BEGIN ")
		case line == "KMATRIX-JSON-BEGIN":
			inJSON = true
		case line == "KMATRIX-JSON-END":
			inJSON = false
			if err := json.Unmarshal([]byte(js.String()), &out.report); err != nil {
				return nil, fmt.Errorf("kernel report: %v", err)
			}
		case inJSON:
			js.WriteString(line + "\n")
		case strings.HasPrefix(line, "started in "):
			out.start = strings.TrimPrefix(line, "started in ")
		case strings.HasPrefix(line, "KMATRIX-TESTS-ELSEWHERE "):
			out.elsewhere = strings.TrimPrefix(line, "KMATRIX-TESTS-ELSEWHERE ")
		case strings.HasPrefix(line, "KMATRIX-EXIT "):
			out.exit = strings.TrimPrefix(line, "KMATRIX-EXIT ")
		default:
			if m := testLine.FindStringSubmatch(line); m != nil {
				if _, ok := out.tests[m[2]]; !ok {
					out.order = append(out.order, m[2])
				}
				out.tests[m[2]] = fmt.Sprintf("%s %ss", m[1], m[3])
			}
		}
	}
	return out, sc.Err()
}

func main() {
	var runs []*run
	for _, path := range os.Args[1:] {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "table:", err)
			os.Exit(1)
		}
		r, err := parse(f)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "table: %s: %v\n", path, err)
			os.Exit(1)
		}
		if r.kernel == "" {
			r.kernel = path + " (did not boot)"
		}
		runs = append(runs, r)
	}
	write(os.Stdout, runs)
}

func write(w io.Writer, runs []*run) {
	fmt.Fprintf(w, "Kernel matrix, %s (tools/kmatrix/matrix.sh)\n\n", time.Now().UTC().Format("2006-01-02"))
	row := func(name string, cell func(*run) string) { tableRow(w, runs, name, cell) }
	row("check", func(r *run) string { return r.kernel })
	row("---", func(*run) string { return "---" })
	row("attach mode", func(r *run) string { return r.report.Attach })
	row("walks at the switch-in (`--walk-threshold`, `--budget`)", func(r *run) string { return yesNo(r.report.Deferred) })
	row("`record` start-up (programs loaded and verified in)", func(r *run) string { return r.start })
	var features []string
	seen := map[string]bool{}
	for _, r := range runs {
		for _, f := range r.report.Features {
			if !seen[f.Name] {
				seen[f.Name] = true
				features = append(features, f.Name)
			}
		}
	}
	for _, name := range features {
		row("has "+name, func(r *run) string {
			for _, f := range r.report.Features {
				if f.Name == name {
					return yesNo(f.Have)
				}
			}
			return "?"
		})
	}
	var tests []string
	seen = map[string]bool{}
	for _, r := range runs {
		for _, t := range r.order {
			if !seen[t] {
				seen[t] = true
				tests = append(tests, t)
			}
		}
	}
	for _, t := range tests {
		row(t, func(r *run) string {
			if v, ok := r.tests[t]; ok {
				return v
			}
			if r.elsewhere != "" {
				return "in `" + r.elsewhere + "`"
			}
			return "not run"
		})
	}
	row("suite exit status", func(r *run) string { return r.exit })
	fmt.Fprintln(w)
	writePrograms(w, runs)
}

// tableRow writes one row: a name and a cell per kernel.
func tableRow(w io.Writer, runs []*run, name string, cell func(*run) string) {
	fmt.Fprintf(w, "| %s |", name)
	for _, r := range runs {
		fmt.Fprintf(w, " %s |", cell(r))
	}
	fmt.Fprintln(w)
}

// writePrograms: per program and mode, the instructions the verifier
// processed, the share of its budget left and the stack depth per
// function.
func writePrograms(w io.Writer, runs []*run) {
	row := func(name string, cell func(*run) string) { tableRow(w, runs, name, cell) }
	type key struct{ mode, name string }
	var progs []key
	have := map[key]bool{}
	for _, r := range runs {
		for _, p := range r.report.Programs {
			k := key{p.Mode, p.Name}
			if !have[k] {
				have[k] = true
				progs = append(progs, k)
			}
		}
	}
	sort.SliceStable(progs, func(i, j int) bool { return progs[i].mode < progs[j].mode })
	row("program (mode): verifier instructions, budget left, stack", func(r *run) string { return r.kernel })
	row("---", func(*run) string { return "---" })
	for _, k := range progs {
		row(fmt.Sprintf("%s (%s)", k.name, k.mode), func(r *run) string {
			for _, p := range r.report.Programs {
				if p.Mode == k.mode && p.Name == k.name {
					if !p.Loaded {
						return "REJECTED: " + strings.ReplaceAll(p.Error, "|", "/")
					}
					return fmt.Sprintf("%d, %.0f%%, %s", p.Insns, 100*p.Margin(), p.Stack)
				}
			}
			return "-"
		})
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
