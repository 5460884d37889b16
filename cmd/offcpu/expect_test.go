package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// expect passes a recording whose sites are judged as stated, and fails
// (an error, so a non-zero exit) one whose expectations say otherwise,
// naming why; the values of folded stacks are nanoseconds.
func TestExpectCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	folded := write("nginx.folded", `nginx;main;ngx_process_events_and_timers;epoll_wait;-;do_epoll_wait 9000000000
nginx;main;ngx_http_read_file;pread64;-;io_schedule 1000000000
`)
	passText := `program: nginx
expect:
  - site: ngx_process_events_and_timers
    verdict: idle
    category: event-loop-idle
    why: the worker's loop
  - site: ngx_http_read_file
    verdict: blocked
    why: a file read
`
	pass := write("pass.yaml", passText)
	out, err := run(t, "expect", pass, folded)
	if err != nil {
		t.Fatalf("passing expectations: %v\n%s", err, out)
	}
	for _, want := range []string{"program: nginx", "judged off-CPU time: 10.0 s", "agreement: 100.0%", "PASS"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}

	// The file read stated idle: 10% disagrees.
	fail := write("fail.yaml", strings.Replace(passText, "verdict: blocked", "verdict: idle", 1))
	out, err = run(t, "expect", fail, folded)
	if err == nil || err.Error() != "expectations not met: agreement 90.0% < 95%" {
		t.Errorf("failing expectations: err %v\n%s", err, out)
	}
	if !strings.Contains(out, "decided by default rules:") || !strings.Contains(out, "FAIL") {
		t.Errorf("no mismatch or FAIL in:\n%s", out)
	}

	// Only the event loop stated: the file read is an uncovered site.
	uncovered := write("uncovered.yaml", strings.SplitAfter(passText, "why: the worker's loop\n")[0])
	out, err = run(t, "expect", "--format", "json", uncovered, folded)
	if err == nil || !strings.Contains(err.Error(), "1 uncovered site") {
		t.Errorf("uncovered site: err %v", err)
	}
	var rep struct {
		JudgedNs  int64 `json:"judged_ns"`
		Uncovered []struct {
			Frames string `json:"frames"`
		} `json:"uncovered"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.JudgedNs != 10e9 || len(rep.Uncovered) != 1 || rep.Uncovered[0].Frames != "main;ngx_http_read_file;pread64" {
		t.Errorf("JSON (%v): %+v\n%s", err, rep, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"expect", pass}, "at least one profile"},
		{[]string{"expect", "--format", "xml", pass, folded}, `unknown format "xml"`},
		{[]string{"expect", write("bad.yaml", "expect:\n  - site: a\n    verdict: maybe\n    why: w\n"), folded}, "bad.yaml:3: unknown verdict"},
	} {
		if _, err := run(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err %v, want %q", c.args, err, c.want)
		}
	}
}
