package goroutines

import (
	"fmt"
	"strings"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/runtimes/golang"
)

// Stats describes the goroutine waits recorded.
type Stats struct {
	Processes int    `json:"processes"` // Go processes probed
	Parks     uint64 `json:"parks"`
	Readies   uint64 `json:"readies"`
	// Requeues: running goroutines put back on a run queue (preempted,
	// yielded, back from a system call without a P): waits for a P alone.
	Requeues uint64 `json:"requeues"`
	// Suspends: running goroutines the GC stopped to scan their stacks
	// (wait reason "preempted"), until it made them runnable.
	Suspends  uint64 `json:"suspends"`
	Runs      uint64 `json:"runs"`
	Open      uint64 `json:"open"`       // still parked or runnable at the end, counted up to it
	Unseen    uint64 `json:"unseen"`     // made runnable, parked before the probe: counted from the probe (or the start)
	LostParks uint64 `json:"lost_parks"` // goroutine map full (--goroutines-max)
	LostWaits uint64 `json:"lost_waits"` // aggregation map full
	// Merged: waits counted without their goroutine ids (goid -1), the
	// aggregation map being full of other goroutines'.
	Merged    uint64 `json:"merged_waits"`
	LostStack uint64 `json:"lost_stacks"` // stack map full: counted without a stack
	// ReusedStacks: parks and wake-ups at the place of the goroutine's previous one,
	// whose stack was reused rather than walked again.
	ReusedStacks uint64 `json:"reused_stacks"`
	// Label sets (pprof labels) read, the waits counted without theirs
	// (label map full), and the sets cut short (more than 8 labels, a key
	// over 32 bytes or a value over 64).
	LabelSets      uint64 `json:"label_sets"`
	LostLabelSets  uint64 `json:"lost_label_sets"`
	TruncatedLabel uint64 `json:"truncated_label_sets"`
	ShedLabelSets  uint64 `json:"shed_label_sets"` // past the recording's bound (262,144 sets)
	// StreamLost: waits the goroutine stream's ring had no room for
	// (--timeline).
	StreamLost uint64 `json:"stream_lost,omitempty"`
	// IDsByAddress: processes whose sets are told apart by their addresses
	// alone (runtime.memstats stripped): after a collection a set at a
	// freed one's address can take its id.
	IDsByAddress int      `json:"label_ids_by_address,omitempty"`
	Skipped      []string `json:"skipped,omitempty"`
}

// Func is the function at pc: for a go statement's wrapper, the
// function it calls, as Go shows it.
func Func(sym *symbolize.Symbolizer, pid uint32, pc uint64) symtab.Frame {
	fr, _ := sym.User(pid, pc)
	if fr.Wrapper {
		if to, ok := sym.Wrapped(pid, pc); ok {
			return to
		}
	}
	return fr
}

// Creator names a goroutine's creator as Go's "created by" does: the
// innermost function at the go statement, inlined or not.
func Creator(sym *symbolize.Symbolizer, pid uint32, pc uint64) string {
	frames, _ := sym.UserFrames(pid, pc)
	for _, fr := range frames {
		if !fr.Wrapper {
			return fr.Func
		}
	}
	return frames[len(frames)-1].Func
}

// Comments are the profile's comments on what was recorded and lost.
func (st *Stats) Comments() []string {
	out := []string{fmt.Sprintf("offcpu goroutines: processes=%d parks=%d readies=%d requeues=%d suspends=%d runs=%d open=%d unseen=%d lost_parks=%d lost_waits=%d lost_stacks=%d merged_waits=%d reused_stacks=%d label_sets=%d lost_label_sets=%d truncated_label_sets=%d shed_label_sets=%d",
		st.Processes, st.Parks, st.Readies, st.Requeues, st.Suspends, st.Runs, st.Open, st.Unseen, st.LostParks, st.LostWaits, st.LostStack, st.Merged, st.ReusedStacks,
		st.LabelSets, st.LostLabelSets, st.TruncatedLabel, st.ShedLabelSets)}
	if st.IDsByAddress > 0 {
		out = append(out, fmt.Sprintf("label_ids_by_address=%d (runtime.memstats not found: a label set freed can lend its id to one allocated at its address)", st.IDsByAddress))
	}
	for _, s := range st.Skipped {
		out = append(out, "skipped: "+s)
	}
	return out
}

// Interval labels a wait as the thread profile does: open at the end,
// begun before the start, or both (whole).
func Interval(w Wait) string {
	before := w.Key.Flags&BeforeStart != 0
	switch {
	case before && w.Open:
		return "whole"
	case before:
		return "before-start"
	case w.Open:
		return "open"
	}
	return ""
}

// ReasonClass groups the Go runtime's wait reasons (as it names them in
// g.waitreason, every release since 1.11) into the kinds a developer
// acts on: chan, select, sync (mutexes, conditions, wait groups,
// semaphores), network, sleep, gc (the runtime's "preempted": suspended
// by the GC), runnable (waiting for a P), other.
func ReasonClass(reason string) string {
	switch {
	case strings.HasPrefix(reason, "chan "):
		return "chan"
	case strings.HasPrefix(reason, "select"):
		return "select"
	case strings.HasPrefix(reason, "sync."), reason == "semacquire":
		return "sync"
	case reason == "IO wait":
		return "network"
	case reason == "sleep":
		return "sleep"
	case reason == golang.ReasonRunnable:
		return "runnable"
	case strings.Contains(strings.ToLower(reason), "gc") || strings.HasPrefix(reason, "garbage collection") ||
		reason == "wait for GC cycle" || reason == "finalizer wait" || reason == "preempted":
		return "gc"
	}
	return "other"
}
