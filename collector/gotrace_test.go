package collector

import (
	"os"
	"testing"

	"golang.org/x/exp/trace"

	"github.com/offcpu/offcpu/internal/testenv"
)

// haveGo119: Debian's Go 1.19 is there, or its builds are (the kernel
// matrix's guests); under CI its absence fails the test.
func haveGo119(t *testing.T) bool {
	t.Helper()
	if _, err := os.Stat(go119Bin); err == nil || os.Getenv(testenv.EnvPrebuilt) != "" {
		return true
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("no %s: .ci/run installs golang-1.19-go", go119Bin)
	}
	return false
}

// goTransition is ev as a goroutine's change of state, if it is one.
func goTransition(ev *trace.Event) (st trace.StateTransition, from, to trace.GoState, ok bool) {
	if ev.Kind() != trace.EventStateTransition {
		return st, 0, 0, false
	}
	st = ev.StateTransition()
	if st.Resource.Kind != trace.ResourceGoroutine {
		return st, 0, 0, false
	}
	from, to = st.Goroutine()
	return st, from, to, true
}

// eachGoTransition calls f with each goroutine state transition of the
// execution trace at path, in order, up to its end.
func eachGoTransition(t *testing.T, path string, f func(ev *trace.Event, st trace.StateTransition, id trace.GoID, from, to trace.GoState)) {
	t.Helper()
	r := openTrace(t, path)
	for {
		ev, err := r.ReadEvent()
		if err != nil {
			return
		}
		if st, from, to, ok := goTransition(&ev); ok {
			f(&ev, st, st.Resource.Goroutine(), from, to)
		}
	}
}
