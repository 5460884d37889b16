/* Wake-ups: who woke each recorded thread, from which stack or interrupt. */
#ifndef OFFCPU_WAKEUP_H
#define OFFCPU_WAKEUP_H

#include "common.bpf.h"
#include "procs.bpf.h"
#include "sched.bpf.h"

/* Key: wake_key (target thread, waker thread and stacks). Value: number
 * of wake-ups. Written by sched_waking, drained at the end. Size:
 * --agg-entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct wake_key);
	__type(value, u64);
} wakeups SEC(".maps");

/* Key: tid of a woken thread. Value: its waker, for the classic
 * tracepoint programs, which cannot reach task storage of the target. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct waker_rec);
} last_waker SEC(".maps");

/* True in hard or soft interrupt context. An interrupt taken in kernel
 * mode runs on the CPU's interrupt stack (x86-64), and so do the softirqs
 * run at its exit: the tracepoint's argument array (ctx, in the kernel's
 * own frame; the program's locals may be on a BPF private stack, Linux
 * 6.14+) is then outside the task's stack. An interrupt taken in user mode
 * stays on the task stack, but the task's saved registers are then
 * user-mode ones without a syscall number (orig_ax is ~vector or -1).
 * Softirqs run in task context (local_bh_enable, ksoftirqd) stay charged
 * to that task. */
static __always_inline bool in_interrupt_ctx(void *ctx)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	u64 base = (u64)cur->stack;
	u64 sp = (u64)ctx;
	if (sp < base || sp >= base + thread_size)
		return true;
	if (cur->flags & PF_KTHREAD)
		return false;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);
	if (!regs)
		return false;
	return USER_IRQ(regs);
}

/* Interrupt wakers' kernel stacks, by CPU. Walking a stack from the
 * interrupt stack costs several microseconds (the unwinder crosses into
 * the interrupted task's stack), and on a network server the receive
 * softirq wakes nearly every waiter. A waking from the same depth of the
 * interrupt stack (ctx's address), interrupting the same thread at the
 * same syscall and user registers, waking the same thread, reuses the
 * stack id; one such waking in IRQ_STACK_REUSE walks again, so a path
 * that shares a fingerprint with another is drawn in proportion to its
 * share (the counts stay exact, only the stacks are drawn). */
#define IRQ_WAKER_SLOTS 256
#define IRQ_STACK_REUSE 128
struct irq_waker {
	u64 ctx, ip, sp, nr;
	u32 cur, target;
	s64 kstack;
	u32 uses;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, IRQ_WAKER_SLOTS + 1); /* the last: scratch */
	__type(key, u32);
	__type(value, struct irq_waker);
} irq_wakers SEC(".maps");

static __always_inline s64 irq_waker_kstack(void *ctx, u32 target)
{
	struct task_struct *cur = bpf_get_current_task_btf();
	u64 ip = 0, sp = 0, nr = ~0ULL;
	if (!(cur->flags & PF_KTHREAD)) {
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);
		if (regs) {
			nr = regs->REG_SYSNR;
			/* Interrupted in user mode (no syscall: ~vector): the
			 * kernel stack below is the entry alone, whatever the
			 * user registers. */
			if ((s64)nr >= 0) {
				ip = regs->REG_PC;
				sp = regs->REG_SP;
			}
		}
	}
	u32 tid = cur->pid;
	/* The verifier allows no hashing of a pointer: a round trip through
	 * the map makes the address a number. */
	u32 slot = IRQ_WAKER_SLOTS;
	struct irq_waker *c = bpf_map_lookup_elem(&irq_wakers, &slot);
	if (!c)
		return get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
	*(volatile u64 *)&c->ctx = (u64)ctx;
	u64 at = *(volatile u64 *)&c->ctx;
	slot = (u32)(((at >> 3) ^ target ^ (u64)tid << 16 ^ ip << 7 ^ nr << 40) * 0x9E3779B97F4A7C15ULL >> 56);
	c = bpf_map_lookup_elem(&irq_wakers, &slot);
	if (!c)
		return get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
	if (c->ctx == at && c->cur == tid && c->target == target && c->ip == ip &&
	    c->sp == sp && c->nr == nr && c->uses < IRQ_STACK_REUSE) {
		c->uses++;
		stat_add(STAT_IRQ_WAKES_REUSED, 1);
		return c->kstack;
	}
	s64 id = get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
	*c = (struct irq_waker){ .ctx = id >= 0 ? at : 0, .ip = ip, .sp = sp, .nr = nr,
				 .cur = tid, .target = target, .kstack = id, .uses = 1 };
	return id;
}

static __always_inline void count_wakeup(u32 ttgid, u32 ttid, u32 tgen, struct waker_rec *w)
{
	struct wake_key k = { .target_tgid = ttgid, .target_tid = ttid, .target_gen = tgen, .waker = *w };
	count_one(&wakeups, &k, STAT_WAKE_FULL);
}

/* Deferred walks: the wake-ups not drawn (the waiter had waited less than
 * the threshold and lost the draw: most of them at 100 µs) from one waker
 * in a row are counted on the woken thread, not each in wakeups (hashing
 * its 64-byte key was ~45 of ~200 ns a wake-up in a ping-pong). The count
 * moves to wakeups when the waker changes, at the thread's last switch-out
 * and in the task iterators of each cut and of the end. Wake-ups of one
 * thread are serialized (sched_waking runs under its pi_lock); an iterator
 * racing one may credit a count to the waker that replaced it. */
static __always_inline void nd_flush(struct task_struct *t, struct start_rec *s)
{
	u64 n = s->nd_n;
	if (!n)
		return;
	struct wake_key k = {
		.target_tgid = t->tgid,
		.target_tid = t->pid,
		.target_gen = task_gen(t),
		.waker = { .valid = 1, .irq = s->nd_irq, .tid = s->nd_tid, .tgid = s->nd_tgid,
			   .ustack = -EAGAIN, .kstack = -EAGAIN },
	};
	count_add(&wakeups, &k, n, STAT_WAKE_FULL);
	__sync_fetch_and_add(&s->nd_n, -n);
}

static __always_inline void nd_count(struct task_struct *t, struct start_rec *s, struct waker_rec *w)
{
	if (!s->nd_n || s->nd_tid != w->tid || s->nd_tgid != w->tgid || s->nd_irq != w->irq) {
		nd_flush(t, s);
		s->nd_tid = w->tid;
		s->nd_tgid = w->tgid;
		s->nd_irq = w->irq;
	}
	__sync_fetch_and_add(&s->nd_n, 1);
}

/* Fills w with the current (waking) context: an interrupt, or the current
 * thread with its stacks. irq_reuse: an interrupt's kernel stack may be
 * reused (ctx is on the kernel stack: tp_btf). */
static __always_inline void waker_context(void *ctx, struct waker_rec *w, bool irq,
					  bool irq_reuse, u32 target)
{
	w->valid = 1;
	w->ustack = -1;
	if (irq) {
		w->irq = 1;
		w->kstack = irq_reuse ? irq_waker_kstack(ctx, target)
					 : get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
		return;
	}
	w->kstack = get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
	u64 id = bpf_get_current_pid_tgid();
	w->tid = (u32)id;
	w->tgid = id >> 32;
	struct task_struct *cur = bpf_get_current_task_btf();
	if (cur->flags & PF_KTHREAD)
		return;
	/* A waker outside the recorded set (a load generator) is announced
	 * as a recorded thread is: its name is kept after it exits, and its
	 * process's mappings and unwind tables are read, so its next stacks
	 * are walked whole. */
	if (!is_target(w->tgid, w->tid))
		announce(w->tgid, w->tid);
	w->ustack = user_stack_id(ctx, STAT_WAKER_STACK_LOST);
}

/* Deferred walks: the waker's stacks are walked when the wait it ends
 * has lasted the threshold, and before that with probability wait /
 * threshold, as the waiter's own stacks will be. */
static __always_inline bool waker_walked(struct start_rec *ts)
{
	u64 thr = walk_threshold_ns;
	if (!thr || !ts || !ts->pending)
		return true;
	u64 now = bpf_ktime_get_ns();
	u64 b = now > ts->ts ? now - ts->ts : 0;
	return b >= thr || below(thr) < b;
}

SEC("tp_btf/sched_waking")
int BPF_PROG(offcpu_waking, struct task_struct *p)
{
	u32 ttid = p->pid, ttgid = p->tgid;
	if (!want_wakeups || ttid == 0 || !is_target(ttgid, ttid))
		return 0;
	bool irq = in_interrupt_ctx(ctx);
	struct waker_rec w = {};
	struct start_rec *ts = bpf_task_storage_get(&task_starts, p, 0, 0);
	if (deferred_walks && !waker_walked(ts)) {
		/* Below the threshold and not drawn: the waker without stacks. */
		u64 id = bpf_get_current_pid_tgid();
		w.valid = 1;
		w.irq = irq;
		w.tid = irq ? 0 : (u32)id;
		w.tgid = irq ? 0 : id >> 32;
		w.ustack = -EAGAIN;
		w.kstack = -EAGAIN;
		stat_add(STAT_WAKER_SKIPPED, 1);
		if (ts) /* always: not drawn means pending */
			nd_count(p, ts, &w);
		else
			count_wakeup(ttgid, ttid, task_gen(p), &w);
		if (ts && ts->pending) {
			ts->waker_wait_ns = 0;
			ts->waker = w;
		}
		return 0;
	}
	struct start_rec *ws = 0;
	if (!irq && reuse_stacks)
		ws = bpf_task_storage_get(&task_starts, bpf_get_current_task_btf(), 0,
					  BPF_LOCAL_STORAGE_GET_F_CREATE);
	u32 slot = WHERE_WAKE;
	struct stack_where *at = ws ? bpf_map_lookup_elem(&where_scratch, &slot) : 0;
	if (at && stack_where_of(bpf_get_current_task_btf(), bpf_get_current_pid_tgid() >> 32, ttid, at)) {
		if (stack_cache_get(&ws->wake_cache, at, &w.ustack, &w.kstack)) {
			u64 id = bpf_get_current_pid_tgid();
			w.valid = 1;
			w.tid = (u32)id;
			w.tgid = id >> 32;
			stat_add(STAT_WAKES_REUSED, 1);
		} else {
			waker_context(ctx, &w, false, false, ttid);
			stack_cache_put(&ws->wake_cache, at, w.ustack, w.kstack);
		}
	} else {
		waker_context(ctx, &w, irq, reuse_stacks, ttid);
	}
	count_wakeup(ttgid, ttid, task_gen(p), &w);
	if (!ts || !ts->pending)
		return 0;
	if (irq && want_stream) {
		/* The stream names the task the interrupt ran on (its own
		 * softirq, run as it enabled them, on loopback); the
		 * aggregation keys leave it out. */
		u64 id = bpf_get_current_pid_tgid();
		w.tid = (u32)id;
		w.tgid = id >> 32;
	}
	/* The waker's own waits since the waiter's began: the waiter waited on
	 * a thread that was itself waiting (a chain). */
	ts->waker_wait_ns = 0;
	struct start_rec *me = irq ? 0 : bpf_task_storage_get(&task_starts, bpf_get_current_task_btf(), 0, 0);
	if (me)
		ts->waker_wait_ns = waits_since(waits_of(me), ts->ts, bpf_ktime_get_ns(), &w);
	ts->waker = w;
	return 0;
}

/* in_interrupt_ctx for classic tracepoints: their record's first 8 bytes
 * hold, for BPF programs, the tracepoint caller's registers (not the
 * trace_entry header, whose flags are written after the programs run),
 * whose sp says which stack the event was raised on. */
static __always_inline bool tp_in_interrupt(void *ctx)
{
	struct pt_regs *regs = 0;
	u64 sp = 0;
	if (bpf_probe_read_kernel(&regs, sizeof(regs), ctx) || !regs ||
	    bpf_probe_read_kernel(&sp, sizeof(sp), &regs->sp))
		return false;
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	u64 base = (u64)BPF_CORE_READ(cur, stack);
	return sp < base || sp >= base + thread_size;
}

SEC("tracepoint/sched/sched_waking")
int offcpu_waking_tp(struct trace_event_raw_sched_wakeup_template *ctx)
{
	u32 ttid = BPF_CORE_READ(ctx, pid), ttgid = 0;
	if (!want_wakeups || ttid == 0)
		return 0;
	if (filter_tgid) {
		/* The record has the woken thread's tid only: its process is the
		 * one its pending interval was started for. A wake-up that ends
		 * no interval of a recorded thread is not counted. */
		struct start_rec *s = bpf_map_lookup_elem(&starts, &ttid);
		if (!s)
			return 0;
		ttgid = s->tgid;
	}
	if (!is_target(ttgid, ttid))
		return 0;
	bool irq = tp_in_interrupt(ctx);
	struct waker_rec w = {};
	waker_context(ctx, &w, irq, false, ttid);
	count_wakeup(ttgid, ttid, 0, &w);
	bpf_map_update_elem(&last_waker, &ttid, &w, BPF_ANY);
	return 0;
}

#endif
