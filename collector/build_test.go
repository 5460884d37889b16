package collector

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/schema"
)

// A recording made by hand, built into profiles without root or BPF: the
// time split, the waker's labels and class, exact on-CPU time shared by
// the samples, and a thread that ran unsampled.
func TestBuildProfilesFromRecording(t *testing.T) {
	kern, err := symtab.LoadKallsyms(strings.NewReader(`ffffffff81000000 T schedule
ffffffff81000100 T __schedule
ffffffff81000200 T futex_wait
ffffffff81000300 T do_syscall_64
ffffffff81000400 T try_to_wake_up
ffffffff81000500 T end_buffer_write_sync
ffffffff81000600 T blk_done_softirq
ffffffff81000700 T handle_softirqs
ffffffff81000800 T irq_exit_rcu
ffffffff81000900 T futex_wake
ffffffff81000a00 T zz_end
`))
	if err != nil {
		t.Fatal(err)
	}
	sym := &symbolize.Symbolizer{Procs: symbolize.NewProcs(), PerfMaps: map[uint32]*symtab.PerfMap{}, Kern: kern}
	const pid, waiter, holder, idler = 4000000, 4000001, 4000002, 4000003
	d := &recording{
		threads: map[uint32]thread{
			waiter: {tgid: pid, comm: "waiter"}, holder: {tgid: pid, comm: "holder"}, idler: {tgid: pid, comm: "idler"},
		},
		records: []record{
			// 10 ms blocked on a futex, woken by holder's futex_wake, then
			// 2 ms waiting for a CPU; holder itself off-CPU 4 ms of it.
			{tgid: pid, tid: waiter, state: StateSleeping, ns: 12e6, count: 3, runq: 2e6, chain: 4e6,
				kernel: []uint64{0xffffffff81000110, 0xffffffff81000010, 0xffffffff81000210, 0xffffffff81000310},
				waker: waker{valid: true, tgid: pid, tid: holder, kernel: []uint64{0xffffffff81000410, 0xffffffff81000910, 0xffffffff81000310}, kernelID: 1,
					waitKernel: []uint64{0xffffffff81000110}, waitKernelID: 2}},
			// 5 ms, woken from the block-I/O softirq.
			{tgid: pid, tid: idler, state: StateUninterruptible, ns: 5e6, count: 1,
				kernel: []uint64{0xffffffff81000110},
				waker:  waker{valid: true, irq: true, kernel: []uint64{0xffffffff81000410, 0xffffffff81000510, 0xffffffff81000610, 0xffffffff81000710, 0xffffffff81000810}, kernelID: 3}},
		},
		// waiter: 2 + 1 samples of 30 ms on a CPU; holder: 7 ms, unsampled.
		cpu: []cpuRecord{
			{tgid: pid, tid: waiter, count: 2, kernel: []uint64{0xffffffff81000310}},
			{tgid: pid, tid: waiter, count: 1, kernel: []uint64{0xffffffff81000210}},
		},
		oncpu: map[[2]uint32]cpuTotal{{waiter, 0}: {tgid: pid, ns: 30e6}, {holder, 0}: {tgid: pid, ns: 7e6}},
		// holder woke waiter 3 times from futex_wake.
		wakes: []wakeRecord{{tgid: pid, tid: waiter, count: 3,
			waker: waker{valid: true, tgid: pid, tid: holder, kernel: []uint64{0xffffffff81000410, 0xffffffff81000910, 0xffffffff81000310}, kernelID: 1}}},
	}
	ps, st, err := build(d, sym, buildOptions{cpuHz: 100, wakeups: true})
	p, wake, offwake := ps.OffCPU, ps.Wakeups, ps.Offwake
	if err != nil {
		t.Fatal(err)
	}
	if len(wake.Sample) != 1 || wake.Sample[0].Value[0] != 3 || wake.Sample[0].Value[1] != 12e6 ||
		wake.Sample[0].Label[schema.LabelTarget][0] != "waiter" || wake.Sample[0].Label[schema.LabelThread][0] != "holder" {
		t.Errorf("wake-up profile: want one sample, holder woke waiter 3 times ending 12 ms, got %v", wake.Sample)
	}
	if got := st.WakeupsByClass; len(got) != 1 || got["futex"] != 3 {
		t.Errorf("wake-ups by class %v, want futex: 3", got)
	}
	if len(offwake.Sample) != 2 {
		t.Errorf("offwake profile: %d samples, want one per interval with a waker (2)", len(offwake.Sample))
	}
	idx := map[string]int{}
	for i, st := range p.SampleType {
		idx[st.Type] = i
	}
	byThread := map[string][]*profile.Sample{}
	for _, smp := range p.Sample {
		th := smp.Label[schema.LabelThread][0]
		byThread[th] = append(byThread[th], smp)
	}
	val := func(smp *profile.Sample, typ string) int64 { return smp.Value[idx[typ]] }

	var w *profile.Sample
	var cpu []int64
	for _, smp := range byThread["waiter"] {
		if val(smp, schema.OffCPU) > 0 {
			w = smp
		} else {
			cpu = append(cpu, val(smp, schema.CPU))
		}
	}
	if w == nil {
		t.Fatal("no off-CPU sample of the waiter")
	}
	if got := [4]int64{val(w, schema.OffCPU), val(w, schema.Blocked), val(w, schema.RunQueue), val(w, schema.WakerWaiting)}; got != [4]int64{12e6, 10e6, 2e6, 4e6} {
		t.Errorf("waiter off_cpu, blocked, runqueue, waker_waiting = %v, want [12e6 10e6 2e6 4e6]", got)
	}
	if got := w.Label[schema.LabelWaker]; len(got) != 1 || got[0] != "holder" {
		t.Errorf("waiter's waker label %v, want holder", got)
	}
	if got := w.Label[schema.LabelWakerStack]; len(got) != 1 || !strings.Contains(got[0], "futex_wake") {
		t.Errorf("waiter's waker stack %v, want the waker's futex_wake", got)
	}
	if got := w.NumLabel[schema.LabelWakerTID]; len(got) != 1 || got[0] != holder {
		t.Errorf("waiter's waker tid %v, want %d", got, holder)
	}
	leaf := w.Location[0].Line[0].Function.Name
	if leaf != "__schedule" {
		t.Errorf("waiter's leaf frame %q, want __schedule (frames below it trimmed)", leaf)
	}
	slices.Sort(cpu)
	if !slices.Equal(cpu, []int64{10e6, 20e6}) {
		t.Errorf("waiter's on-CPU samples %v ns, want its exact 30 ms shared 1:2", cpu)
	}
	if len(byThread["holder"]) != 1 || byThread["holder"][0].Location[0].Line[0].Function.Name != schema.OnCPUUnsampled || val(byThread["holder"][0], schema.CPU) != 7e6 {
		t.Errorf("holder: want one %s sample of 7 ms, got %d samples", schema.OnCPUUnsampled, len(byThread["holder"]))
	}
	if got := byThread["idler"]; len(got) != 1 || got[0].Label[schema.LabelWakeupClass][0] != "block-io" {
		t.Errorf("idler's wake-up class: want block-io (the softirq that woke it), got %v", got)
	}
}

// Under process churn the samples of exited processes beyond
// ExitedDetail merge per command and stack: the time adds up, the busiest
// exited processes and the live ones keep their pids, and a parent woken by
// each of its children keeps one sample, not one per child.
func TestFoldExitedProcesses(t *testing.T) {
	kern, err := symtab.LoadKallsyms(strings.NewReader("ffffffff81000000 T schedule\nffffffff81000100 T __schedule\nffffffff81000200 T do_nanosleep\nffffffff81000300 T zz_end\n"))
	if err != nil {
		t.Fatal(err)
	}
	sym := &symbolize.Symbolizer{Procs: symbolize.NewProcs(), PerfMaps: map[uint32]*symtab.PerfMap{}, Kern: kern}
	const parent, first = 100, 1000
	sleep := []uint64{0xffffffff81000110, 0xffffffff81000210}
	d := &recording{threads: map[uint32]thread{parent: {tgid: parent, comm: "launcher"}}, exited: map[[2]uint32]thread{},
		oncpu: map[[2]uint32]cpuTotal{}}
	o := buildOptions{wakeups: true, exitedDetail: 2}
	var total int64
	for i := range uint32(50) {
		pid := first + i
		d.exited[[2]uint32{pid, 0}] = thread{tgid: pid, comm: "nap", exited: true}
		d.threads[pid] = d.exited[[2]uint32{pid, 0}] // as nameExited does
		ns := uint64(1e6 + i)                        // the last two are the busiest
		d.records = append(d.records,
			record{tgid: pid, tid: pid, state: StateSleeping, ns: ns, count: 1, kernel: sleep},
			// The parent waits for each child, woken by its exit.
			record{tgid: parent, tid: parent, state: StateSleeping, ns: 2e6, count: 1, kernel: sleep,
				waker: waker{valid: true, tgid: pid, tid: pid, kernel: sleep, kernelID: 1}})
		total += int64(ns) + 2e6
		d.wakes = append(d.wakes, wakeRecord{tgid: parent, tid: parent, count: 1, waker: waker{valid: true, tgid: pid, tid: pid, kernel: sleep, kernelID: 1}})
	}
	ps, _, err := build(d, sym, o)
	p, wake := ps.OffCPU, ps.Wakeups
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	pids := map[int64]bool{}
	folded := 0
	for _, smp := range p.Sample {
		sum += smp.Value[0]
		if len(smp.Label[schema.LabelFolded]) > 0 {
			folded++
			if len(smp.NumLabel) > 0 {
				t.Errorf("a folded sample keeps numeric labels %v", smp.NumLabel)
			}
			continue
		}
		pids[smp.NumLabel[schema.LabelPID][0]] = true
	}
	if sum != total {
		t.Errorf("off-CPU total %d after folding, want %d", sum, total)
	}
	// The parent, live, keeps its pid where its waker does.
	if !pids[first+49] || !pids[first+48] || !pids[parent] || len(pids) != 3 {
		t.Errorf("processes kept in detail %v, want the two busiest exited ones (%d, %d) and the parent", pids, first+48, first+49)
	}
	// The children's sleeps and the parent's waits woken by the children:
	// one sample each, whatever the number of children.
	if folded != 2 {
		t.Errorf("%d folded samples, want 2 (one per command, state, waker and stack)", folded)
	}
	if len(wake.Sample) > 3 {
		t.Errorf("%d wake-up samples, want at most 3 (two children in detail, the rest merged)", len(wake.Sample))
	}
	var merged *schema.ThreadTotal
	for _, tt := range schema.ThreadTotals(p) {
		if tt.TID == -1 {
			merged = &tt
		}
	}
	if merged == nil || merged.Thread != "nap" {
		t.Errorf("thread totals: want a row for the merged nap processes (tid -1), got %+v", merged)
	}
	o.exitedDetail = -1
	if ps, _, err = build(d, sym, o); err != nil || len(ps.OffCPU.Sample) != 100 {
		t.Errorf("with every exited process kept: %d samples (err %v), want 100", len(ps.OffCPU.Sample), err)
	}
}

// Samples with equal labels share one label map; folding a sample later
// changes neither the shared maps nor the samples already added.
func TestSampleMergerSharesLabels(t *testing.T) {
	p := &profile.Profile{}
	m := newSampleMerger(p)
	loc := &profile.Location{ID: 1}
	mk := func(tid int64) *profile.Sample {
		return &profile.Sample{Location: []*profile.Location{loc}, Value: []int64{1},
			Label:    map[string][]string{schema.LabelThread: {"w"}, schema.LabelState: {"S"}},
			NumLabel: map[string][]int64{schema.LabelTID: {tid}}}
	}
	a, b, c, f := mk(1), mk(1), mk(2), mk(3)
	for _, s := range []*profile.Sample{a, b, c} {
		m.add(s, false)
	}
	m.add(f, true)
	if reflect.ValueOf(a.Label).Pointer() != reflect.ValueOf(b.Label).Pointer() || reflect.ValueOf(a.Label).Pointer() != reflect.ValueOf(c.Label).Pointer() {
		t.Error("equal string labels not shared")
	}
	if reflect.ValueOf(a.NumLabel).Pointer() != reflect.ValueOf(b.NumLabel).Pointer() || reflect.ValueOf(a.NumLabel).Pointer() == reflect.ValueOf(c.NumLabel).Pointer() {
		t.Error("numeric labels: want shared for tid 1, apart for tid 2")
	}
	if _, ok := a.Label[schema.LabelFolded]; ok || f.Label[schema.LabelFolded] == nil || f.NumLabel != nil {
		t.Errorf("folding: kept sample labels %v, folded %v %v", a.Label, f.Label, f.NumLabel)
	}
	if len(p.Sample) != 4 {
		t.Errorf("%d samples, want 4", len(p.Sample))
	}
}
