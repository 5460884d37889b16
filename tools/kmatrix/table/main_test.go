package main

import (
	"bytes"
	"strings"
	"testing"
)

const sample = "\x1bc\x1b[?7lSeaBIOS\nKMATRIX-BEGIN 6.1.0-57-cloud-amd64\nKMATRIX-JSON-BEGIN\n" +
	`{"release":"6.1.0-57-cloud-amd64","btf":true,"features":[{"name":"BTF","since":"5.4","have":true,"for":"x"},{"name":"sched_exit_tp tracepoint","since":"6.16","have":false,"for":"y"}],` +
	`"attach":"tp_btf","deferred":false,"programs":[{"mode":"tp_btf","name":"offcpu_switch","loaded":true,"insns":32723,"limit":1000000,"stack":"280+24"},` +
	`{"mode":"tp_btf","name":"offcpu_snap_blocked","loaded":false,"insns":2634,"limit":1000000,"error":"R1 unbounded memory access"}]}` +
	"\nKMATRIX-JSON-END\nstarted in 9.1s (programs loaded and verified in 7.2s)\n=== RUN   TestWakeups\n--- PASS: TestWakeups (14.57s)\n    --- FAIL: TestWakeups/net-rx (0.00s)\n--- SKIP: TestX (0.00s)\nKMATRIX-EXIT 1\n"

func TestParseAndWrite(t *testing.T) {
	r, err := parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if r.kernel != "6.1.0-57-cloud-amd64" || r.exit != "1" || r.report.Attach != "tp_btf" || r.start != "9.1s (programs loaded and verified in 7.2s)" {
		t.Errorf("parsed %+v", r)
	}
	if r.tests["TestWakeups"] != "PASS 14.57s" || r.tests["TestWakeups/net-rx"] != "FAIL 0.00s" || r.tests["TestX"] != "SKIP 0.00s" {
		t.Errorf("tests %v", r.tests)
	}
	host, err := parse(strings.NewReader("KMATRIX-BEGIN 6.18 (host)\nKMATRIX-TESTS-ELSEWHERE go test ./...\nKMATRIX-EXIT 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	write(&b, []*run{r, host})
	out := b.String()
	for _, want := range []string{
		"| has sched_exit_tp tracepoint | no | ? |",
		"| TestWakeups/net-rx | FAIL 0.00s | in `go test ./...` |",
		"| offcpu_switch (tp_btf) | 32723, 97%, 280+24 | - |",
		"| offcpu_snap_blocked (tp_btf) | REJECTED: R1 unbounded memory access | - |",
		"| suite exit status | 1 | 0 |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}
