package schema

import (
	"sort"
	"time"

	"github.com/google/pprof/profile"
)

// ThreadTotal is one thread's time in a recording: off a CPU (blocked,
// then waiting for a CPU) and on one.
type ThreadTotal struct {
	Thread   string
	TID      int64         // -1: exited processes merged (Options.ExitedDetail)
	OffCPU   time.Duration // Blocked + RunQueue
	Blocked  time.Duration // from switch-outs to the wake-ups
	RunQueue time.Duration // waiting for a CPU: from wake-ups to switch-ins, and preempted
	OnCPU    time.Duration
	Switches int64
}

// ThreadTotals sums a recorded profile's samples per thread, most off-CPU
// time first. Sample types are found by name; a profile without the
// blocked/runqueue split counts all off-CPU time as blocked.
func ThreadTotals(p *profile.Profile) []ThreadTotal {
	idx := map[string]int{}
	for i, st := range p.SampleType {
		idx[st.Type] = i
	}
	value := func(s *profile.Sample, typ string) int64 {
		if i, ok := idx[typ]; ok {
			return s.Value[i]
		}
		return 0
	}
	_, split := idx[RunQueue]
	type key struct {
		tid    int64
		folded string // exited processes merged: their thread name, tid -1
	}
	byTID := map[key]*ThreadTotal{}
	for _, s := range p.Sample {
		k := key{tid: -1}
		if tids := s.NumLabel[LabelTID]; len(tids) > 0 {
			k.tid = tids[0]
		} else if names := s.Label[LabelThread]; len(names) > 0 {
			k.folded = names[0]
		}
		t := byTID[k]
		if t == nil {
			t = &ThreadTotal{TID: k.tid, Thread: k.folded}
			byTID[k] = t
		}
		if names := s.Label[LabelThread]; len(names) > 0 && (t.Thread == "" || value(s, OffCPU) != 0) {
			t.Thread = names[0]
		}
		off := value(s, OffCPU)
		t.OffCPU += time.Duration(off)
		t.Switches += value(s, Switches)
		t.OnCPU += time.Duration(value(s, CPU))
		if split {
			t.Blocked += time.Duration(value(s, Blocked))
			t.RunQueue += time.Duration(value(s, RunQueue))
		} else {
			t.Blocked += time.Duration(off)
		}
	}
	out := make([]ThreadTotal, 0, len(byTID))
	for _, t := range byTID {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].OffCPU != out[j].OffCPU {
			return out[i].OffCPU > out[j].OffCPU
		}
		return out[i].TID < out[j].TID
	})
	return out
}
