package collector

import (
	"testing"

	"github.com/offcpu/offcpu/collector/symbolize"
)

// A tid used by two threads while recording names each one's samples and
// wake-ups by the incarnation that made them.
func TestReusedTIDNames(t *testing.T) {
	d := &recording{
		threads: map[uint32]thread{7: {tgid: 7, gen: 200, comm: "kworker/0:1"}},
		exited:  map[[2]uint32]thread{{7, 100}: {tgid: 7, gen: 100, comm: "nap", exited: true}},
	}
	n := &threadNames{d: d, procs: symbolize.NewProcs()}
	if got := n.threadGen(7, 7, 100); got != "nap" {
		t.Errorf("incarnation 100: %q, want nap", got)
	}
	if got := n.threadGen(7, 7, 200); got != "kworker/0:1" {
		t.Errorf("incarnation 200: %q, want kworker/0:1", got)
	}
	if got := d.threadOf(&record{tid: 7, gen: 100}).comm; got != "nap" {
		t.Errorf("record of incarnation 100: %q, want nap", got)
	}
	if got := n.threadGen(7, 7, 0); got != "kworker/0:1" {
		t.Errorf("unknown incarnation: %q, want the live thread", got)
	}
}

// Every state the programs report has a name.
func TestStateNames(t *testing.T) {
	if len(stateNames) != int(StateUnknown)+1 {
		t.Errorf("%d state names, the last state is %d", len(stateNames), StateUnknown)
	}
}
