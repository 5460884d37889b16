package collector

import (
	"sort"
	"time"

	"github.com/google/pprof/profile"
)

// ThreadTotal is one thread's off-CPU time and switches in a recording.
type ThreadTotal struct {
	Thread   string
	TID      int64
	OffCPU   time.Duration
	Switches int64
}

// ThreadTotals sums a recorded profile's off-CPU samples per thread, most
// off-CPU time first; on-CPU samples are left out.
func ThreadTotals(p *profile.Profile) []ThreadTotal {
	byTID := map[int64]*ThreadTotal{}
	for _, s := range p.Sample {
		if s.Value[0] == 0 && s.Value[1] == 0 {
			continue // on-CPU sample
		}
		tid := s.NumLabel[LabelTID][0]
		t := byTID[tid]
		if t == nil {
			t = &ThreadTotal{TID: tid}
			if names := s.Label[LabelThread]; len(names) > 0 {
				t.Thread = names[0]
			}
			byTID[tid] = t
		}
		t.OffCPU += time.Duration(s.Value[0])
		t.Switches += s.Value[1]
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
