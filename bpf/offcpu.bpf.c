//go:build ignore

// Off-CPU recorder: sched_switch measures how long each thread stays off a
// CPU and aggregates that time in the kernel by (thread, user stack, kernel
// stack, state). Nothing is sent per event; user space drains the maps.
// Formats: /sys/kernel/tracing/events/sched/sched_switch/format,
// /sys/kernel/tracing/events/sched/sched_process_fork/format.
//
// One program, by concern: this file holds the configuration, what every
// part shares and the scheduler's entry points (sched_switch in both
// attach types, sched_exit_tp, the end-of-window iterators); stacks.bpf.h,
// unwind.bpf.h (.eh_frame and HotSpot), procs.bpf.h (targets, threads,
// process events, mappings), sched.bpf.h (interval accounting),
// wakeup.bpf.h, cpu.bpf.h and tctx.bpf.h (OpenTelemetry thread
// context) hold the rest, each with its maps.

#include "common.bpf.h"
#include "stacks.bpf.h"
#include "unwind.bpf.h"
#include "procs.bpf.h"
#include "sched.bpf.h"
#include "wakeup.bpf.h"
#include "cpu.bpf.h"

SEC("tp_btf/sched_switch")
int BPF_PROG(offcpu_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	if (rec_stop_ns)
		return 0; /* the window closed: open intervals are flushed to its end */
	/* Both threads' run queue: this CPU's. */
	u64 now_rq = rq_clock_of(prev), now = bpf_ktime_get_ns();
	u32 ptid = prev->pid, ptgid = prev->tgid;
	u8 state = classify(preempt, prev_state);
	bool kthread = prev->flags & PF_KTHREAD;

	/* A recorded thread's time on a CPU counts whatever the state filter. */
	if (recorded(ptgid, ptid, kthread)) {
		struct start_rec *s = bpf_task_storage_get(&task_starts, prev, 0,
							   BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s && (prev_state & TASK_DEAD))
			nd_flush(prev, s);
		if (s)
			switch_out(ctx, s, prev, prev_state, state, kthread, now, now_rq);
		else
			stat_add(STAT_START_FULL, 1);
	}

	u32 ntid = next->pid;
	if (ntid == 0)
		return 0;
	struct start_rec *s = bpf_task_storage_get(&task_starts, next, 0, 0);
	if (s) {
		if (s->pending && s->gil)
			lock_wait_ends(ntid, s, &s->waker, now);
		if (s->pending && deferred_walks) {
			s->pending = 0;
			if (account_deferred(ntid, next, s, now, now_rq)) {
				u32 zero = 0;
				u32 *due = bpf_map_lookup_elem(&walk_due, &zero);
				if (due)
					*due = ntid;
			} else {
				remember_wait(s, now);
				s->waker.valid = 0;
			}
		} else if (s->pending) {
			s->pending = 0;
			account(ntid, next, s, &s->waker, now, now_rq);
			remember_wait(s, now);
			s->waker.valid = 0;
		} else if (!s->counting && skip_first_in) {
			return 0;
		} else if (!s->counting && target_task(next)) {
			/* No switch seen, blocked since before the start (the record
			 * is a waker's stack cache): as below. */
			account_prestart(next, STATE_UNKNOWN, 0, prestart_runq(next), 0, true);
		}
		switched_in(s, next, now);
	} else if (skip_first_in) {
		return 0;
	} else if (target_task(next)) {
		/* First switch-in, no switch-out seen: off-CPU since before
		 * the start, waiting for a CPU since its enqueue. The record
		 * created here marks it counted. */
		account_prestart(next, STATE_UNKNOWN, 0, prestart_runq(next), 0, true);
		s = bpf_task_storage_get(&task_starts, next, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s)
			switched_in(s, next, now);
	}
	return 0;
}

/* Deferred walks: the end of __schedule, in the context of the thread
 * that was switched in (its kernel stack below __schedule and its user
 * registers are those it slept with). Walks its stacks if its switch-in
 * chose to, and adds the interval. */
SEC("tp_btf/sched_exit_tp")
int BPF_PROG(offcpu_switched_in, bool is_switch)
{
	u32 zero = 0;
	u32 *due = bpf_map_lookup_elem(&walk_due, &zero);
	if (!due || !*due)
		return 0;
	struct task_struct *t = bpf_get_current_task_btf();
	u32 tid = t->pid;
	if (*due != tid)
		return 0;
	*due = 0;
	struct start_rec *s = bpf_task_storage_get(&task_starts, t, 0, 0);
	if (!s || !s->walk)
		return 0;
	s->walk = 0;
	walk_stacks(ctx, s, t, t->flags & PF_KTHREAD, s->ts);
	aggregate(tid, s, &s->waker, 0, s->d_ns, s->d_runq, s->d_chain, s->d_sampled, AGG_SCHED);
	stream_wait(tid, s, &s->waker, 0, s->d_end, s->d_runq_raw);
	remember_wait(s, s->d_end);
	s->waker.valid = 0;
	return 0;
}

SEC("tracepoint/sched/sched_switch")
int offcpu_switch_tp(struct trace_event_raw_sched_switch *ctx)
{
	u64 now = bpf_ktime_get_ns();
	if (rec_stop_ns)
		return 0; /* the window closed: pending starts end at its end */
	u64 id = bpf_get_current_pid_tgid();
	u32 ptid = (u32)id, ptgid = id >> 32;
	long pstate = BPF_CORE_READ(ctx, prev_state);
	u8 state = classify(false, pstate);
	struct task_struct *cur = (struct task_struct *)bpf_get_current_task();
	bool kthread = BPF_CORE_READ(cur, flags) & PF_KTHREAD;

	bool out = want_out(ptgid, ptid, state, kthread);
	u64 ran = out ? BPF_CORE_READ(cur, se.sum_exec_runtime) : 0;
	struct start_rec *old = out ? bpf_map_lookup_elem(&starts, &ptid) : 0;
	if (old) { /* replaced or deleted below: adjusted in place */
		recover_missed_in(ptid, old, ran, BPF_CORE_READ(cur, sched_info.run_delay), now);
		if (want_wakeups)
			bpf_map_delete_elem(&last_waker, &ptid);
	}
	if (pstate & REPORT_EXITING) {
		/* The task's last switch-out: no interval, and no record left
		 * behind to read as still blocked at the end. */
		bpf_map_delete_elem(&starts, &ptid);
		if (out)
			thread_exit(ptgid, ptid);
	} else if (out) {
		u32 zero = 0;
		struct start_rec *s = bpf_map_lookup_elem(&start_scratch, &zero);
		if (!s)
			return 0;
		__builtin_memset(s, 0, sizeof(*s));
		s->tgid = ptgid;
		s->tgen = (u32)(BPF_CORE_READ(cur, start_time) / 1000); /* task_gen, for an untyped pointer */
		s->state = state;
		s->pending = 1;
		s->ran = ran;
		s->rd = BPF_CORE_READ(cur, sched_info.run_delay);
		s->task = (u64)cur;
		announce(ptgid, ptid);
		capture(ctx, s, kthread, now);
		if (!kthread)
			s->link = tctx_read(ptgid);
		if (!kthread)
			interp_lock_wait(bpf_get_current_task_btf(), ptgid, &s->gil, &s->gil_holder, &s->gil_holder_stack);
		if (bpf_map_update_elem(&starts, &ptid, s, BPF_ANY))
			stat_add(STAT_START_FULL, 1);
	}

	u32 ntid = BPF_CORE_READ(ctx, next_pid);
	if (ntid == 0)
		return 0;
	struct start_rec *s = bpf_map_lookup_elem(&starts, &ntid);
	if (s) {
		struct waker_rec *w = want_wakeups ? bpf_map_lookup_elem(&last_waker, &ntid) : 0;
		if (s->gil)
			lock_wait_ends(ntid, s, w, now);
		account(ntid, 0, s, w, now, 0);
		bpf_map_delete_elem(&starts, &ntid);
		if (w)
			bpf_map_delete_elem(&last_waker, &ntid);
	} else if (!filter_tgid && is_target(0, ntid) &&
		   bpf_map_delete_elem(&newborn, &ntid) != 0) {
		/* Not created during the recording: blocked since before it. */
		stat_add(STAT_NO_START, 1);
	}
	return 0;
}

/* Run once when recording stops: accounts the intervals of threads still
 * off-CPU, so a thread blocked until the end (a deadlock, a long wait) is
 * not lost. */
SEC("iter/task")
int offcpu_flush_open(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task)
		return 0;
	u64 end = window_now();
	struct start_rec *s = bpf_task_storage_get(&task_starts, task, 0, 0);
	if (s)
		nd_flush(task, s);
	if (s && s->walk)
		walk_missed(task->pid, s, AGG_ITER);
	if (s && s->pending) {
		s->pending = 0;
		if (deferred_walks && end > s->ts) {
			/* Still blocked: its stacks are walked now, the user one by
			 * offcpu_snap_blocked just before. */
			u32 tid = task->pid;
			s64 *us = bpf_map_lookup_elem(&blocked_ustacks, &tid);
			s->ustack = us ? *us : -ENODATA;
			s->kstack = want_kernel_stacks ? task_kernel_stack_id(task) : -1;
		}
		if (end > s->ts)
			account_interval(task->pid, s, 0, 1, end, end - s->ts, queued_since(task, s, rq_clock_of(task)), 0, AGG_ITER);
	}
	if (s && task->pid && target_task(task)) {
		/* On a CPU at the end: its run so far, by the clock (the
		 * scheduler updates a running thread's count only at ticks). */
		if (s->running && end > s->in_ts)
			s->oncpu += end - s->in_ts;
		else if (!s->counting && rec_start_ns && end > rec_start_ns)
			s->oncpu += end - rec_start_ns;
		store_oncpu(task, s->oncpu, s);
		return 0;
	}
	/* Never switched during the recording: blocked, or on a CPU, for all
	 * of it. Only for -p/--tid targets (system-wide this would list every
	 * idle thread of the machine). */
	if (!s && (filter_tgid || filter_tid) && task->pid && target_task(task)) {
		unsigned int st = task->__state;
		if (st != 0) {
			account_prestart(task, classify(false, st), 1, 0, 0, true);
		} else if (task->on_cpu && rec_start_ns && end > rec_start_ns) {
			store_oncpu(task, end - rec_start_ns, 0);
		}
	}
	return 0;
}

/* Run at each cut of a continuous recording: stores every recorded
 * thread's on-CPU total so far, its current run by the scheduler's own
 * count (what its switch-out will add to, so the totals never go back). */
SEC("iter/task")
int offcpu_snap_oncpu(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task->pid)
		return 0;
	struct start_rec *s = bpf_task_storage_get(&task_starts, task, 0, 0);
	if (s)
		nd_flush(task, s);
	if (!s || !s->counting)
		return 0;
	u64 oncpu = s->oncpu, ran = task->se.sum_exec_runtime;
	if (s->running && ran > s->in_ran)
		oncpu += ran - s->in_ran;
	store_oncpu(task, oncpu, s);
	return 0;
}

/* Run before a cut of a continuous recording evicts stacks: writes every
 * stack id a live thread still holds (its pending interval, the stacks it
 * may reuse, its waker's, its past waits), which must not be evicted. */
SEC("iter/task")
int offcpu_live_stacks(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task->pid)
		return 0;
	/* Past waits are kept only for threads with a start record. */
	struct start_rec *s = bpf_task_storage_get(&task_starts, task, 0, 0);
	if (!s)
		return 0;
	s64 ids[15 + 2 * PAST_WAITS] = {};
	ids[0] = s->ustack;
	ids[1] = s->kstack;
	ids[2] = s->sleep_cache.ustack[0];
	ids[3] = s->sleep_cache.kstack[0];
	ids[4] = s->waker.ustack;
	ids[5] = s->waker.kstack;
	ids[6] = s->waker.wait_ustack;
	ids[7] = s->waker.wait_kstack;
	ids[8] = s->wake_cache.ustack[0];
	ids[9] = s->wake_cache.kstack[0];
	ids[10] = s->sleep_cache.ustack[1];
	ids[11] = s->sleep_cache.kstack[1];
	ids[12] = s->wake_cache.ustack[1];
	ids[13] = s->wake_cache.kstack[1];
	ids[14 + 2 * PAST_WAITS] = s->gil_holder_stack;
	struct past_waits *p = waits_of(s);
	for (int i = 0; i < PAST_WAITS; i++) {
		ids[14 + i] = p->ustack[i];
		ids[14 + PAST_WAITS + i] = p->kstack[i];
	}
	bpf_seq_write(ctx->meta->seq, ids, sizeof(ids));
	return 0;
}

/* Run once right after the probes attach: walks the user stack of every
 * target thread blocked at that moment (another task's memory can only be
 * read from a sleepable program), so an interval blocked since before the
 * start has its user stack too. A thread that runs before its interval is
 * accounted has a switch-out of its own and does not use it. */
SEC("iter.s/task")
int offcpu_snap_blocked(struct bpf_iter__task *ctx)
{
	struct task_struct *task = ctx->task;
	if (!task || !task->pid || (task->__state == 0 && task->on_cpu))
		return 0; /* running */
	u32 tid = task->pid;
	if (!is_target(task->tgid, tid))
		return 0;
	/* Its run-queue time so far (the first run: kept at the end). */
	u64 rd = task->sched_info.run_delay;
	bpf_map_update_elem(&blocked_rd, &tid, &rd, BPF_NOEXIST);
	if (!want_user_stacks || (task->flags & PF_KTHREAD))
		return 0;
	s64 id = task_user_stack_id(task);
	if (id >= 0)
		bpf_map_update_elem(&blocked_ustacks, &tid, &id, BPF_ANY);
	return 0;
}
