package collector

import (
	"fmt"
	"os"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/offcpu/offcpu/collector/symbolize"
	"github.com/offcpu/offcpu/collector/symtab"
	"github.com/offcpu/offcpu/schema"
)

// threadNames names threads that may lie outside the recorded set.
type threadNames struct {
	d     *recording
	procs *symbolize.Procs
}

// threadGen names a thread of a known incarnation (gen 0: unknown), so
// that a reused tid names the thread that was sampled or woken.
func (n *threadNames) threadGen(tgid, tid, gen uint32) string {
	if gen != 0 {
		if th, ok := n.d.threads[tid]; ok && th.gen == gen {
			return th.comm
		}
		if th, ok := n.d.exited[[2]uint32{tid, gen}]; ok {
			return th.comm
		}
	}
	return n.thread(tgid, tid)
}

func (n *threadNames) thread(tgid, tid uint32) string {
	if th, ok := n.d.threads[tid]; ok {
		return th.comm
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/comm", tgid, tid)); err == nil {
		c := strings.TrimSpace(string(b))
		n.d.threads[tid] = thread{tgid: tgid, comm: c}
		return c
	}
	if tid == 0 {
		return "swapper"
	}
	return fmt.Sprintf("tid-%d", tid)
}

func (n *threadNames) waker(w waker, k *symtab.Kernel) string {
	if w.irq {
		for _, a := range w.kernel {
			switch name := k.Lookup(a); name {
			case "handle_softirqs", "__do_softirq", "do_softirq", "net_rx_action", "run_timer_softirq":
				return schema.WakerSoftirq
			}
		}
		return schema.WakerInterrupt
	}
	return n.thread(w.tgid, w.tid)
}

// classifyWakeup names the kernel path of a wake-up from the waker's
// kernel stack. A wake-up raised by an interrupt, or by a softirq run in
// ksoftirqd, is classed by the interrupt's own frames (those leafward of
// the interrupt entry or the softirq dispatcher), never by the code the
// interrupt happened to stop.
func classifyWakeup(w waker, k *symtab.Kernel) string {
	names := make([]string, len(w.kernel))
	for i, a := range w.kernel {
		names[i] = k.Lookup(a)
	}
	if cut, ok := interruptFrames(names, w.irq); ok {
		return classifyInterrupt(names[:cut])
	}
	return classifyTask(names)
}

// interruptFrames finds, in a waker's kernel stack (leaf first), where the
// interrupt's own frames end: at the softirq dispatcher, or past the
// hard-irq entry (whose name tells the vector). ok is false for a wake-up
// in task context.
func interruptFrames(names []string, irq bool) (cut int, ok bool) {
	softirqThread := slices.Contains(names, "run_ksoftirqd")
	if !irq && !softirqThread {
		return 0, false
	}
	for i, n := range names {
		switch {
		case n == "handle_softirqs" || n == "__do_softirq":
			return i, true
		case strings.HasPrefix(n, "sysvec_") || strings.HasPrefix(n, "__sysvec_") || n == "common_interrupt" || n == "__common_interrupt" ||
			strings.HasPrefix(n, "asm_"):
			return i + 1, true
		}
	}
	return len(names), true
}

func classifyInterrupt(names []string) string {
	has := func(subs ...string) bool { return hasAny(names, subs) }
	switch {
	case has("blk_", "bio_endio", "end_buffer", "scsi_", "nvme_", "virtblk", "end_page_writeback", "folio_end_writeback", "_end_io"):
		return schema.WakeBlockIO
	case has("net_rx_action", "netif_receive", "napi_", "process_backlog", "ip_rcv", "ip6_rcv", "tcp_v4_rcv", "tcp_v6_rcv", "udp_rcv"):
		return schema.WakeNetRx
	case has("hrtimer_", "run_timer", "call_timer_fn", "tick_", "timerfd", "process_timeout", "it_real_fn", "posix_timer", "apic_timer"):
		return schema.WakeTimer
	case has("call_function", "smp_call_function", "irq_work", "reschedule_ipi"):
		return schema.WakeIPI
	}
	return schema.WakeIRQ
}

func hasAny(names, subs []string) bool {
	for _, n := range names {
		for _, s := range subs {
			if strings.Contains(n, s) {
				return true
			}
		}
	}
	return false
}

// classifyTask classes a wake-up made by a thread, from its kernel path.
func classifyTask(names []string) string {
	has := func(subs ...string) bool { return hasAny(names, subs) }
	switch {
	case has("eventfd"):
		return schema.WakeEventfd
	case has("futex"):
		return schema.WakeFutex
	case has("hrtimer_wakeup", "timerfd", "process_timeout", "it_real_fn", "posix_timer"):
		return schema.WakeTimer
	case has("pipe_", "sock_def", "unix_stream", "unix_dgram", "tcp_", "udp_", "sk_", "sock_"):
		return schema.WakePipeSocket
	}
	return schema.WakeOther
}

// trimWaker drops the tracing frames above try_to_wake_up.
func trimWaker(st []uint64, k *symtab.Kernel) []uint64 {
	for i, a := range st {
		if n := k.Lookup(a); n == "try_to_wake_up" || n == "wake_up_new_task" || n == "wake_up_q" {
			return st[i:]
		}
	}
	return st
}

func isKernelThread(r record) bool { return len(r.user) == 0 && r.userErr == -1 }

func errnoName(e int64) string {
	if e == 0 {
		return "none"
	}
	return unix.ErrnoName(unix.Errno(-e))
}

func processName(d *recording, tgid uint32, procs *symbolize.Procs) string {
	if th, ok := d.threads[tgid]; ok && th.tgid == tgid {
		if p := procs.Get(tgid); p != nil && p.Comm != "" {
			return p.Comm
		}
		return th.comm
	}
	if p := procs.Get(tgid); p != nil && p.Comm != "" {
		return p.Comm
	}
	return fmt.Sprintf("pid-%d", tgid)
}

// trimKernel drops the frames above __schedule (tracing and BPF glue).
func trimKernel(st []uint64, k *symtab.Kernel) []uint64 {
	for i, a := range st {
		if n := k.Lookup(a); n == "__schedule" || n == "__schedule_loop" {
			return st[i:]
		}
	}
	return st
}
