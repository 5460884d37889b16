package agent

import (
	"testing"
	"time"
)

func TestParseTrigger(t *testing.T) {
	for in, want := range map[string]Trigger{
		"http.route=/checkout>200ms": {"http.route", "/checkout", 200 * time.Millisecond},
		"tenant=a=b>1.5s":            {"tenant", "a=b", 1500 * time.Millisecond},
		"k=>10µs":                    {"k", "", 10 * time.Microsecond},
	} {
		got, err := ParseTrigger(in)
		if err != nil || got != want {
			t.Errorf("ParseTrigger(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "http.route>200ms", "=x>1s", "a=b>0s", "a=b>-1s", "a=b>fast", "a=b"} {
		if _, err := ParseTrigger(in); err == nil {
			t.Errorf("ParseTrigger(%q): no error", in)
		}
	}
}
