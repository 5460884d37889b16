package collector

import (
	"testing"

	"github.com/offcpu/offcpu/schema"
)

// A wake-up raised in interrupt context is classed by the interrupt's own
// frames, whatever code the interrupt stopped (here a futex wait and an
// eventfd write, which once gave their names to block-I/O completions).
func TestWakeupClassFromInterruptFrames(t *testing.T) {
	for _, c := range []struct {
		name   string
		irq    bool
		frames []string // leaf first
		want   string
	}{
		{"block I/O softirq at irq exit", true, []string{"try_to_wake_up", "wake_up_bit", "end_buffer_write_sync", "end_bio_bh_io_sync", "blk_update_request", "blk_mq_end_request", "blk_done_softirq", "handle_softirqs", "__irq_exit_rcu", "common_interrupt", "asm_common_interrupt", "futex_wait_queue", "futex_wait", "do_syscall_64"}, schema.WakeBlockIO},
		{"block I/O in hard irq", true, []string{"try_to_wake_up", "end_buffer_write_sync", "blk_mq_complete_request", "vring_interrupt", "__handle_irq_event_percpu", "handle_edge_irq", "__common_interrupt", "common_interrupt", "asm_common_interrupt", "eventfd_write", "ksys_write"}, schema.WakeBlockIO},
		{"network receive softirq", true, []string{"try_to_wake_up", "__wake_up_common", "sock_def_readable", "tcp_data_queue", "tcp_v4_rcv", "ip_rcv", "__netif_receive_skb", "net_rx_action", "handle_softirqs", "do_softirq", "asm_sysvec_apic_timer_interrupt", "futex_wait"}, schema.WakeNetRx},
		{"hrtimer", true, []string{"try_to_wake_up", "hrtimer_wakeup", "__hrtimer_run_queues", "hrtimer_interrupt", "__sysvec_apic_timer_interrupt", "sysvec_apic_timer_interrupt", "asm_sysvec_apic_timer_interrupt", "eventfd_write"}, schema.WakeTimer},
		{"IPI", true, []string{"try_to_wake_up", "irq_work_run_list", "__sysvec_irq_work", "sysvec_irq_work", "asm_sysvec_irq_work", "futex_wake"}, schema.WakeIPI},
		{"ksoftirqd", false, []string{"try_to_wake_up", "end_buffer_write_sync", "blk_done_softirq", "handle_softirqs", "run_ksoftirqd", "smpboot_thread_fn", "kthread", "ret_from_fork"}, schema.WakeBlockIO},
		{"task: futex", false, []string{"try_to_wake_up", "wake_up_q", "futex_wake", "do_futex", "__x64_sys_futex", "do_syscall_64"}, "futex"},
		{"task: eventfd", false, []string{"try_to_wake_up", "__wake_up_common", "eventfd_write", "ksys_write"}, "eventfd"},
		{"unknown interrupt", true, []string{"try_to_wake_up", "some_driver_isr", "common_interrupt", "asm_common_interrupt", "futex_wait"}, schema.WakeIRQ},
	} {
		got := classifyTask(c.frames)
		if cut, ok := interruptFrames(c.frames, c.irq); ok {
			got = classifyInterrupt(c.frames[:cut])
		}
		if got != c.want {
			t.Errorf("%s: class %q, want %q", c.name, got, c.want)
		}
	}
}
