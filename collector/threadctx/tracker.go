// Package threadctx reads OpenTelemetry thread context for the recorder:
// it finds the processes that publish it (OTEP 4947's otel_thread_ctx_v1,
// and Go programs' goroutine labels), tells the BPF programs where each
// thread keeps it (tctx_procs), and turns the records they read at each
// wait (tctx_links, go_links, the OpenTelemetry eBPF Instrumentation's
// otel_traces_ctx_v1) into sample labels: trace_id, span_id and the
// attributes under the names the process publishes (OTEP 4719).
package threadctx

import (
	"debug/elf"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/prometheus/procfs"

	"github.com/offcpu/offcpu/bpf"
)

// Tracker finds the processes among the targets that publish
// OpenTelemetry thread context (OTEP 4947: otel_thread_ctx_v1), tells the
// recorder where each keeps it (tctx_procs), and moves the records the
// recorder read (tctx_links) into labels for the waits that carry them.
type Tracker struct {
	procs   *ebpf.Map
	obi     *ebpf.Map      // otel_traces_ctx_v1
	targets *ebpf.Map      // target_tgids where the recording has targets: others are not read
	sources *ebpf.Variable // tctx_sources: the programs look only where there is something
	srcBits uint32

	mu      sync.Mutex
	pending map[uint32]*pending // processes to look at
	wake    chan struct{}
	found   map[uint32]string   // processes read, with their access model
	files   map[string]*ctxFile // by path and inode; nil: none
	stats   Stats

	labels *Labels
	stop   chan struct{}
	done   sync.WaitGroup
}

// Stats describes the OpenTelemetry thread context and the
// Go threads' labels read.
type Stats struct {
	Processes int `json:"processes"` // processes that publish it, read
	// Records read (one per span), the waits counted without theirs (the
	// kernel's map full), those whose attributes were cut (612 bytes), and
	// those past the recording's bound (262,144).
	Records   uint64 `json:"records"`
	Lost      uint64 `json:"lost_records"`
	Truncated uint64 `json:"truncated_records"`
	Shed      uint64 `json:"shed_records"`
	// Instrumentation: records from the OpenTelemetry eBPF
	// Instrumentation's map (OTEP 4855), by thread rather than process.
	Instrumentation uint64 `json:"instrumentation_records"`
	// Go programs: processes whose threads' goroutine labels are read at
	// their waits (a thread in a system call or preempted inside a
	// labelled request), the label sets read, the waits counted without
	// theirs (the kernel's map full), and the sets cut short.
	GoProcesses     int    `json:"go_processes"`
	GoLabelSets     uint64 `json:"go_label_sets"`
	LostGoLabelSets uint64 `json:"lost_go_label_sets"`
	TruncatedGoSets uint64 `json:"truncated_go_label_sets"`
	// GoIDsByAddress: Go processes whose sets are told apart by their
	// addresses alone (runtime.memstats stripped; GoroutineStats).
	GoIDsByAddress int      `json:"go_label_ids_by_address,omitempty"`
	Skipped        []string `json:"skipped,omitempty"` // processes whose variable could not be reached
}

// pending: a process looked at until its variable is found or until
// until, first right away, then at doubling gaps from 20 ms (its loader
// fills the variable's slot before main, a dlopen later).
type pending struct {
	until, next time.Time
	gap         time.Duration
}

// linkEvery: how often records are moved out of the kernel's map, which
// holds a bounded number between moves (past it, lost: counted).
const linkEvery = 250 * time.Millisecond

// maxRecords bounds the records a recording keeps: past it a wait keeps
// its time, not its labels (counted as shed).
const maxRecords = 1 << 18

// lookFor: how long after a process is seen (or execs, or maps new code)
// its libraries are looked at.
const lookFor = 10 * time.Second

// targets: the recording's target filter (target_tgids), nil when it
// records every process.
func New(coll *ebpf.Collection, targets *ebpf.Map) *Tracker {
	t := &Tracker{procs: coll.Maps[bpf.OffcpuMapTctxProcs], obi: coll.Maps[bpf.OffcpuMapOtelTracesCtxV1], targets: targets,
		sources: coll.Variables[bpf.OffcpuVarTctxSources], pending: map[uint32]*pending{}, wake: make(chan struct{}, 1), found: map[uint32]string{},
		files: map[string]*ctxFile{}, labels: newLabels(coll.Maps[bpf.OffcpuMapTctxLinks], coll.Maps[bpf.OffcpuMapGoLinks]), stop: make(chan struct{})}
	t.done.Add(1)
	go t.run()
	return t
}

// add: process pid is recorded (seen, exec'd, mapped code): looked at
// for lookFor unless already read.
func (t *Tracker) Add(pid uint32) {
	t.mu.Lock()
	if _, ok := t.found[pid]; !ok {
		now := time.Now()
		t.pending[pid] = &pending{until: now.Add(lookFor), next: now, gap: 20 * time.Millisecond}
	}
	t.mu.Unlock()
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// addNow: as add, and looked at before it returns: a command held at its
// exec has its links from its first wait.
func (t *Tracker) AddNow(pid uint32) {
	t.Add(pid)
	t.lookAt(pid)
}

// exec: pid runs a new program: its variable is looked for again.
func (t *Tracker) Exec(pid uint32) {
	t.mu.Lock()
	// Counted for the program it runs now (a command's child is often
	// seen as its Go parent's image before its exec).
	if a, ok := t.found[pid]; ok && strings.HasPrefix(a, tlsGo.String()) {
		t.stats.GoProcesses--
		if a != tlsGo.String() {
			t.stats.GoIDsByAddress--
		}
	} else if ok {
		t.stats.Processes--
	}
	delete(t.found, pid)
	t.mu.Unlock()
	_ = t.procs.Delete(pid)
	t.Add(pid)
}

func (t *Tracker) Exit(pid uint32) {
	t.mu.Lock()
	delete(t.pending, pid)
	delete(t.found, pid)
	t.mu.Unlock()
	_ = t.procs.Delete(pid)
}

// run looks at pending processes and moves records until close.
func (t *Tracker) run() {
	defer t.done.Done()
	tick := time.NewTicker(linkEvery)
	defer tick.Stop()
	obi := time.NewTicker(InstrumentationPoll)
	defer obi.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			t.labels.Take()
			continue
		case <-obi.C:
			t.watchOBI()
			continue
		case <-t.wake:
		case <-retry.C:
		}
		if next := t.look(); !next.IsZero() {
			retry.Reset(time.Until(next))
		}
	}
}

// close stops the tracker; the records left are moved.
func (t *Tracker) Close() {
	select {
	case <-t.stop:
	default:
		close(t.stop)
	}
	t.done.Wait()
	t.labels.Take()
}

// look looks at the processes due; returns when the next one is (zero:
// none pending).
func (t *Tracker) look() time.Time {
	now := time.Now()
	t.mu.Lock()
	var pids []uint32
	for pid, p := range t.pending {
		switch {
		case now.After(p.until):
			delete(t.pending, pid)
		case !now.Before(p.next):
			pids = append(pids, pid)
			p.next, p.gap = now.Add(p.gap), 2*p.gap
		}
	}
	t.mu.Unlock()
	for _, pid := range pids {
		t.lookAt(pid)
	}
	var next time.Time
	t.mu.Lock()
	for _, p := range t.pending {
		if next.IsZero() || p.next.Before(next) {
			next = p.next
		}
	}
	t.mu.Unlock()
	return next
}

// lookAt finds pid's variable; a process whose loader has not yet filled
// in its slot stays pending.
func (t *Tracker) lookAt(pid uint32) {
	// A process seen as a waker of a target is no target: its own waits
	// are not recorded.
	var one uint8
	if t.targets != nil && t.targets.Lookup(pid, &one) != nil {
		t.forgetPending(pid)
		return
	}
	p, err := procfs.NewProc(int(pid))
	if err != nil {
		t.forgetPending(pid)
		return
	}
	maps, err := p.ProcMaps()
	if err != nil {
		t.forgetPending(pid)
		return
	}
	for _, m := range maps {
		if m.Inode == 0 || m.Offset != 0 || !strings.HasPrefix(m.Pathname, "/") ||
			strings.HasPrefix(m.Pathname, "/memfd:") || strings.HasSuffix(m.Pathname, " (deleted)") {
			continue
		}
		f := t.file(pid, m)
		if f == nil {
			continue
		}
		v, err := tctxLocate(pid, f, uint64(m.StartAddr)-f.load)
		if err == errTctxNotYet {
			return
		}
		t.mu.Lock()
		delete(t.pending, pid)
		if _, ok := t.found[pid]; ok { // looked at by addNow and run at once
			t.mu.Unlock()
			return
		}
		if err != nil {
			t.stats.Skipped = appendSkipped(t.stats.Skipped, fmt.Sprintf("pid %d (%s): %v", pid, m.Pathname, err))
		} else if err = t.procs.Put(pid, v); err != nil {
			t.stats.Skipped = appendSkipped(t.stats.Skipped, fmt.Sprintf("pid %d: tctx_procs: %v", pid, err))
		} else {
			t.found[pid] = f.access.String()
			if f.access == tlsGo {
				t.stats.GoProcesses++
				if f.goGC == 0 {
					t.stats.GoIDsByAddress++
					t.found[pid] += ", ids by address"
				}
			} else {
				t.stats.Processes++
			}
			t.setSource(bpf.TctxSrcProcs, true)
		}
		t.mu.Unlock()
		if err == nil && f.access != tlsGo {
			t.labels.readKeys(pid)
		}
		return
	}
}

// InstrumentationPoll: how often otel_traces_ctx_v1 is looked at for entries (one
// system call): the instrumentation's first entries are read from then on.
const InstrumentationPoll = 50 * time.Millisecond

// watchOBI tells the programs whether otel_traces_ctx_v1 holds anything
// (the instrumentation's entries are looked up from the next tick on).
func (t *Tracker) watchOBI() {
	var k uint64
	err := t.obi.NextKey(nil, &k)
	t.mu.Lock()
	t.setSource(bpf.TctxSrcObi, err == nil)
	t.mu.Unlock()
}

// setSource sets or clears a source bit of tctx_sources (t.mu held).
func (t *Tracker) setSource(bit uint32, on bool) {
	b := t.srcBits &^ bit
	if on {
		b |= bit
	}
	if b != t.srcBits && t.sources != nil && t.sources.Set(b) == nil {
		t.srcBits = b
	}
}

func (t *Tracker) forgetPending(pid uint32) {
	t.mu.Lock()
	delete(t.pending, pid)
	t.mu.Unlock()
}

// file: the variable's access in a mapped file, read once per file.
func (t *Tracker) file(pid uint32, m *procfs.ProcMap) *ctxFile {
	key := fmt.Sprintf("%s:%d:%d", m.Pathname, m.Dev, m.Inode)
	t.mu.Lock()
	f, ok := t.files[key]
	t.mu.Unlock()
	if ok {
		return f
	}
	f, err := openTctxFile(fmt.Sprintf("/proc/%d/root%s", pid, m.Pathname))
	if err != nil && err != errNoTctx {
		t.mu.Lock()
		t.stats.Skipped = appendSkipped(t.stats.Skipped, fmt.Sprintf("%s: %v", m.Pathname, err))
		t.mu.Unlock()
	}
	t.mu.Lock()
	t.files[key] = f
	t.mu.Unlock()
	return f
}

// openTctxFile reads the variable's access in an ELF file; files that are
// not ELF (locale archives, fonts, the kernel's BTF a forked child still
// maps before its exec) have none and are no error.
func openTctxFile(path string) (*ctxFile, error) {
	r, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var magic [4]byte
	if _, err := r.ReadAt(magic[:], 0); err != nil || string(magic[:]) != elf.ELFMAG {
		return nil, errNoTctx
	}
	ef, err := elf.NewFile(r)
	if err != nil {
		return nil, err
	}
	defer ef.Close()
	f, err := readTctxFile(ef)
	if err == errNoTctx {
		return goTctxFile(r, ef)
	}
	return f, err
}

func appendSkipped(s []string, why string) []string {
	if len(s) < 20 {
		s = append(s, why)
	}
	return s
}

// statsCopy: the stats with the kernel's counts of records read and lost;
// nil where no process publishes thread context.
func (t *Tracker) Stats(records, lost, goSets, goLost uint64) *Stats {
	t.mu.Lock()
	st := t.stats
	st.Records, st.Lost, st.GoLabelSets, st.LostGoLabelSets = records, lost, goSets, goLost
	st.Skipped = append([]string(nil), t.stats.Skipped...)
	t.mu.Unlock()
	t.labels.addStats(&st)
	if st.Processes == 0 && st.GoProcesses == 0 && len(st.Skipped) == 0 && records == 0 {
		return nil
	}
	return &st
}

// errTctxNotYet: the loader has not filled in the slot yet.
var errTctxNotYet = fmt.Errorf("%s not resolved yet", tctxSymbol)

// tctxLocate reads where pid's threads keep the variable of file f, loaded
// at bias.
func tctxLocate(pid uint32, f *ctxFile, bias uint64) (bpf.OffcpuTctxProc, error) {
	switch f.access {
	case tlsLocalExec:
		return bpf.OffcpuTctxProc{Offset: f.offset}, nil
	case tlsGo:
		v := bpf.OffcpuTctxProc{Offset: f.offset, GoLabels: f.goLabels, GoLayout: f.goLayout, GoM: f.goM, GoCurg: f.goCurg}
		if f.goGC != 0 {
			v.GoGc = bias + f.goGC
		}
		return v, nil
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return bpf.OffcpuTctxProc{}, err
	}
	defer mem.Close()
	var buf [16]byte
	read := func(addr uint64) ([2]uint64, error) {
		if _, err := mem.ReadAt(buf[:], int64(addr)); err != nil {
			return [2]uint64{}, fmt.Errorf("reading its slot: %w", err)
		}
		return [2]uint64{binary.LittleEndian.Uint64(buf[:]), binary.LittleEndian.Uint64(buf[8:])}, nil
	}
	w, err := read(bias + f.slot)
	if err != nil {
		return bpf.OffcpuTctxProc{}, err
	}
	switch f.access {
	case tlsInitialExec:
		if w[0] == 0 {
			return bpf.OffcpuTctxProc{}, errTctxNotYet
		}
		return bpf.OffcpuTctxProc{Offset: int64(w[0])}, nil
	case tlsGlobalDynamic, tlsLocalDynamic:
		if w[0] == 0 {
			return bpf.OffcpuTctxProc{}, errTctxNotYet
		}
		off := int64(w[1])
		if f.access == tlsLocalDynamic {
			off = f.offset
		}
		return bpf.OffcpuTctxProc{Module: uint32(w[0]), Offset: off}, nil
	}
	// A descriptor: {resolver, argument}. Static TLS: the argument is the
	// (negative) offset from the thread pointer; dynamic: a pointer to
	// {module, offset} (glibc's tlsdesc_dynamic_arg).
	if w[0] == 0 {
		return bpf.OffcpuTctxProc{}, errTctxNotYet
	}
	if int64(w[1]) < 0 {
		return bpf.OffcpuTctxProc{Offset: int64(w[1]) + f.offset}, nil
	}
	ti, err := read(w[1])
	if err != nil {
		return bpf.OffcpuTctxProc{}, err
	}
	if ti[0] == 0 {
		return bpf.OffcpuTctxProc{}, errTctxNotYet
	}
	return bpf.OffcpuTctxProc{Module: uint32(ti[0]), Offset: int64(ti[1]) + f.offset}, nil
}

// Labels are the records read so far, as labels.
func (t *Tracker) Labels() *Labels { return t.labels }

// Access is how a thread of a process that maps a file reaches its
// context: the TLS access model ("go": a Go executable's g, for its
// labels) and, where the file tells, the offset from the thread pointer.
type Access struct {
	Model  string
	Offset int64
}

// FileAccess reads a file's Access.
func FileAccess(path string) (Access, error) {
	f, err := openTctxFile(path)
	if err != nil {
		return Access{}, err
	}
	if f == nil {
		return Access{}, errNoTctx
	}
	return Access{Model: f.access.String(), Offset: f.offset}, nil
}
