/* Scheduler accounting: an off-CPU interval from switch-out to switch-in,
 * split at the wake-up, with its stacks; on-CPU time; wait chains. */
#ifndef OFFCPU_SCHED_H
#define OFFCPU_SCHED_H

#include "common.bpf.h"
#include "procs.bpf.h"
#include "tctx.bpf.h"

/* A switch-out waiting for its switch-in. */
struct start_rec {
	u64 ts;      /* bpf_ktime_get_ns() at switch-out */
	s64 ustack;  /* stack id in stacks, or negative errno */
	s64 kstack;
	u32 tgid;
	u32 tgen;    /* task_gen of the thread */
	u8 state;    /* enum offcpu_state */
	u8 pending;  /* 1 while the thread is off-CPU */
	u8 seen;     /* thread already announced in threads */
	u8 running;  /* 1 from a switch-in seen to the next switch-out */
	u8 counting; /* its on-CPU time is counted from a switch seen */
	u8 walk;     /* deferred walks: its stacks are walked at the switch-in's end */
	/* The stacks of its last sleep walked whole (tp_btf only). */
	struct stack_cache sleep_cache;
	/* A CPython GIL wait (offcpu_key.gil, gil_holder, gil_holder_stack). */
	u32 gil, gil_holder;
	s64 gil_holder_stack;
	u64 link; /* its request's thread context (offcpu_key.link) */
	/* The waker of the thread's current sleep (written by the waker), and
	 * how long, since this sleep began, the waker was itself off a CPU. */
	struct waker_rec waker;
	u64 waker_wait_ns;
	/* As a waker: the stacks of its last wake-up walked whole. */
	struct stack_cache wake_cache;
	u64 ran;        /* the thread's se.sum_exec_runtime at switch-out */
	/* ts by the run queue's clock (rq_clock_of); 0: unknown. */
	u64 ts_rq;
	/* The kernel's count of its waits for a CPU (sched_info.run_delay,
	 * schedstat's second field) at the switch-out. */
	u64 rd;
	/* The last switch-in: its time and se.sum_exec_runtime then. */
	u64 in_ts, in_ran;
	u64 oncpu;      /* ns on a CPU inside the window so far */
	/* Deferred walks: the interval chosen at the switch-in (its end, and
	 * its values, weighted when sampled), for sched_exit_tp to walk. */
	u64 d_end, d_ns, d_runq, d_chain;
	u32 d_sampled;
	u64 d_runq_raw; /* d_runq before weighting (the wait stream's) */
	/* Its intervals below the threshold, exact, by state (thread_cpu). */
	u64 below_ns[4], below_n[4];
	/* Deferred walks: its wake-ups not drawn, from one waker in a row
	 * (wakeup.bpf.h, nd_count), not yet added to wakeups. */
	u64 nd_n;
	u32 nd_tid, nd_tgid, nd_irq;
	/* Classic tracepoints: the task, whose run-queue counts are read at
	 * its switch-in (the record names it by tid only). */
	u64 task;
};

/* Deferred walks: the thread whose stacks sched_exit_tp is to walk on
 * this CPU (0: none), so the switch-ins with nothing to walk cost one
 * per-CPU read. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} walk_due SEC(".maps");

/* A thread's last waits (bpf_ktime_get_ns bounds and stack ids), for the
 * chains of the threads it wakes; the newest at next - 1. */
struct past_waits {
	u64 from[PAST_WAITS], to[PAST_WAITS];
	s64 ustack[PAST_WAITS], kstack[PAST_WAITS];
	u32 next;
};

/* Key: tid. Value: start_rec. Written at switch-out, consumed at switch-in
 * by the classic tracepoint program, which has no task pointer for next.
 * Size: --max-threads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct start_rec);
} starts SEC(".maps");

/* A start_rec being made by the classic tracepoint program: too large
 * for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct start_rec);
} start_scratch SEC(".maps");

/* Same record kept on the task itself by the tp_btf program: no capacity
 * limit and no hash lookup. Freed by the kernel when the task exits. With
 * it, the thread's last waits, written at each switch-in and read by
 * sched_waking when the thread wakes another: one storage lookup per
 * switch-in, not two (a second one cost ~25 ns a switch). */
struct task_rec {
	struct start_rec s; /* first: a task_starts value is used as a start_rec */
	struct past_waits w;
};
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct task_rec);
} task_starts SEC(".maps");

/* The past waits of a record from task_starts. */
static __always_inline struct past_waits *waits_of(struct start_rec *s)
{
	return &((struct task_rec *)s)->w;
}

/* Key: offcpu_key. Value: offcpu_val (ns and count). Written at switch-in,
 * drained by user space at the end. Size: --agg-entries. */
struct offcpu_agg {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_val);
} offcpu SEC(".maps");

/* The aggregation map the programs write to: offcpu, or while a
 * continuous recording runs a second one swapped in at each cut, so the
 * one swapped out is read and emptied with no program adding to it (the
 * kernel waits for running programs when the slot changes). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, u32);
	__array(values, struct offcpu_agg);
} offcpu_maps SEC(".maps") = {
	.values = { [0] = &offcpu },
};

/* Key: tid. Value: prestart_val. Written at a target's first switch-in
 * with no switch-out seen, and at Stop for targets that never switched.
 * Size: --max-threads, allocated on use. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct prestart_val);
} prestart SEC(".maps");

/* Scratch space for a prestart_val, too large for the BPF stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct prestart_val);
} prestart_scratch SEC(".maps");

/* Key: tid. Value: the user stack id of a thread that was blocked when
 * recording started, walked once by offcpu_snap_blocked right after the
 * probes attached; used for its interval blocked since before the start.
 * Size: --max-threads, allocated on use. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, s64);
} blocked_ustacks SEC(".maps");

/* Key: tid. Value: sched_info.run_delay of a thread not running when
 * recording started, read by offcpu_snap_blocked. Size: --max-threads,
 * allocated on use. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, u64);
} blocked_rd SEC(".maps");

/* Key: thread_key. Value: thread_cpu, the thread's exact on-CPU time in
 * the window. Written at a thread's last switch-out (tp_btf) and by
 * offcpu_flush_open for the threads alive at the end; drained by user
 * space at the end. Size: --max-threads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct thread_key);
	__type(value, struct thread_cpu);
} thread_cpus SEC(".maps");

static __always_inline u8 classify(bool preempt, long state)
{
	if (preempt || state == 0 || (state & TASK_REPORT_MAX))
		return STATE_PREEMPTED;
	if (state & TASK_INTERRUPTIBLE)
		return STATE_SLEEPING;
	if (state & TASK_UNINTERRUPTIBLE)
		return (state & TASK_NOLOAD) ? STATE_SLEEPING : STATE_UNINTERRUPTIBLE;
	if (state & 0x80) /* classic tracepoint reports TASK_IDLE as I */
		return STATE_SLEEPING;
	return STATE_OTHER;
}

/* now: the switch-out's time, read on entry, so the stack walks (the
 * program's own cost) do not count as the thread's time on a CPU. */
static __always_inline void capture(void *ctx, struct start_rec *s, bool kthread, u64 now)
{
	s->kstack = -1;
	s->ustack = -1;
	if (want_kernel_stacks)
		s->kstack = get_stack_id(ctx, 0, STAT_KSTACK_LOST);
	if (want_user_stacks && !kthread) {
		s->ustack = user_stack_id(ctx, STAT_USTACK_LOST);
		if (s->ustack < 0 && s->ustack != -ENOMEM)
			stat_add(STAT_USTACK_FAULT, 1);
	}
	s->ts = now;
}

/* The clock of the run queue a task is on (rq->clock): the scheduler
 * stamps a switch at the start of __schedule and a wake-up at its enqueue
 * with it, a few µs before the tracepoints fire, and counts CPU time and
 * schedstat's run_delay from those stamps. 0 where it cannot be read
 * (kernels without CONFIG_FAIR_GROUP_SCHED). */
static __always_inline u64 rq_clock_of(struct task_struct *t)
{
	if (!bpf_core_field_exists(t->se.cfs_rq))
		return 0;
	return t->se.cfs_rq->rq->clock; /* BTF pointers: plain loads, no helper calls */
}

/* The part of the interval from start to end spent waiting for a CPU
 * where only its ends are known (classic tracepoints): all of a preempted
 * one, none of a sleep. */
static __always_inline u64 runq_part(struct start_rec *s, u64 start, u64 end)
{
	return s->state == STATE_PREEMPTED ? end - start : 0;
}

/* t's wait for a CPU since it was last enqueued (sched_info.last_queued,
 * set at the wake-up's or preemption's enqueue and cleared only after
 * sched_switch fires, at the arrival that adds it to run_delay). now_rq:
 * the run queue's clock now, which last_queued is stamped with; 0 if it
 * cannot be read. */
static __always_inline u64 queued_now(struct task_struct *t, u64 now_rq)
{
	u64 q = t->sched_info.last_queued;
	return q && now_rq > q ? now_rq - q : 0;
}

/* t's wait for a CPU since its switch-out, by the kernel's own count: what
 * run_delay gained (waits ended by a migration or a missed switch-in) and
 * the wait since its enqueue. A sched_wakeup stamp gave this before, with
 * a program at every wake-up. */
static __always_inline u64 queued_since(struct task_struct *t, struct start_rec *s, u64 now_rq)
{
	u64 rd = t->sched_info.run_delay;
	return (rd > s->rd ? rd - s->rd : 0) + queued_now(t, now_rq);
}

/* queued_since for classic tracepoints, through the task kept at the
 * switch-out: a task being switched in cannot be freed meanwhile. */
static __always_inline u64 queued_since_tp(struct start_rec *s, u64 now)
{
	struct task_struct *t = (struct task_struct *)s->task;
	if (!t)
		return runq_part(s, s->ts, now);
	u64 rd = BPF_CORE_READ(t, sched_info.run_delay);
	u64 q = BPF_CORE_READ(t, sched_info.last_queued);
	u64 clock = bpf_core_field_exists(t->se.cfs_rq) ? BPF_CORE_READ(t, se.cfs_rq, rq, clock) : 0;
	return (rd > s->rd ? rd - s->rd : 0) + (q && clock > q ? clock - q : 0);
}

/* Adds an interval's values (delta ns, of which runq waiting for a CPU
 * and chain the waker itself off a CPU) to its key; sampled: a
 * below-threshold interval walked by lot, its values weighted. */
/* Aggregation keys are built in a per-CPU map value, not on the BPF stack
 * (512 bytes across a call chain). By context: AGG_SCHED the scheduler's
 * programs (switch, switch-in's end: never nested on a CPU), AGG_ITER the
 * end-of-window iterator, which a switch may preempt. */
#define AGG_SCHED 0
#define AGG_ITER 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct offcpu_key);
} agg_keys SEC(".maps");

static __always_inline void aggregate(u32 tid, struct start_rec *s, struct waker_rec *w, u32 open, u64 delta,
				      u64 runq, u64 chain, u32 sampled, u32 ks)
{
	struct offcpu_key *key = bpf_map_lookup_elem(&agg_keys, &ks);
	if (!key)
		return;
	__builtin_memset(key, 0, sizeof(*key)); /* padding too: the key is hashed whole */
	key->tgid = s->tgid;
	key->tid = tid;
	key->ustack = s->ustack;
	key->kstack = s->kstack;
	key->state = s->state;
	key->open = open;
	key->gen = s->tgen;
	key->sampled = sampled;
	key->gil = s->gil != 0;
	key->gil_holder = s->gil_holder;
	key->gil_holder_stack = s->gil_holder_stack;
	key->link = s->link;
	if (w && w->valid) {
		key->waker = *w;
		if (w->irq) { /* the interrupted task (stream only) */
			key->waker.tid = 0;
			key->waker.tgid = 0;
		}
		if (!chain) {
			key->waker.wait_ustack = 0;
			key->waker.wait_kstack = 0;
		}
	}
	u32 slot = 0;
	void *agg = bpf_map_lookup_elem(&offcpu_maps, &slot);
	if (!agg)
		return;
	struct offcpu_val *v = bpf_map_lookup_elem(agg, key);
	if (!v) {
		struct offcpu_val init = { .ns = delta, .count = 1, .runq_ns = runq, .chain_ns = chain };
		long err = bpf_map_update_elem(agg, key, &init, BPF_NOEXIST);
		if (err == 0) {
			stat_add(STAT_AGG_STORED, 1);
			return;
		}
		v = bpf_map_lookup_elem(agg, key); /* lost a race on insert */
		if (!v) {
			stat_add(STAT_AGG_FULL, 1);
			stat_add(STAT_AGG_FULL_NS, delta);
			return;
		}
	}
	__sync_fetch_and_add(&v->ns, delta);
	__sync_fetch_and_add(&v->count, 1);
	if (runq)
		__sync_fetch_and_add(&v->runq_ns, runq);
	if (chain)
		__sync_fetch_and_add(&v->chain_ns, chain);
}

/* The wait stream (--timeline): every interval accounted, in order,
 * beside the aggregation. Sized by user space (a page when off, when
 * stream_wait is pruned as dead code). User space reads it on a timer:
 * a wake-up per wait would cost a reader's wake-up per switch. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} wait_stream SEC(".maps");

/* Sends an interval from the thread's switch-out (s->ts) to end, of which
 * runq (at its end) waiting for a CPU, with its stacks and waker. */
static __always_inline void stream_wait(u32 tid, struct start_rec *s, struct waker_rec *w, u32 open, u64 end,
					u64 runq)
{
	if (!want_stream)
		return;
	struct wait_event *e = bpf_ringbuf_reserve(&wait_stream, sizeof(*e), 0);
	if (!e) {
		stat_add(STAT_STREAM_LOST, 1);
		return;
	}
	e->out_ns = s->ts;
	e->in_ns = end;
	e->runq_ns = runq < end - s->ts ? runq : end - s->ts;
	e->tgid = s->tgid;
	e->tid = tid;
	e->ustack = s->ustack;
	e->kstack = s->kstack;
	e->link = s->link;
	if (w && w->valid)
		e->waker = *w;
	else
		__builtin_memset(&e->waker, 0, sizeof(e->waker));
	e->gen = s->tgen;
	e->state = s->state;
	e->open = open;
	e->gil = s->gil != 0;
	e->pad = 0;
	e->gil_holder = s->gil_holder;
	e->pad2 = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* A wait for an interpreter lock ends now: its holder, the thread that
 * held the lock longest within it. Woken by another thread of its
 * process, a queued waiter was handed the lock (a timeout is not);
 * without wake-ups recorded, assumed. */
static __always_inline void lock_wait_ends(u32 tid, struct start_rec *s, struct waker_rec *w, u64 now)
{
	u64 id = (u64)s->tgid << 32 | tid;
	if (s->gil == LOCK_QUEUED && (!want_wakeups || (w && w->valid && !w->irq && w->tgid == s->tgid)))
		id |= LOCK_TAKES;
	interp_lock_held(id, s->ts, &s->gil_holder, &s->gil_holder_stack, now);
}

/* Bounds an interval's parts by its length; false (counted) when the
 * block bounds leave it out. */
static __always_inline bool kept(u64 len, u64 *runq, u64 *chain)
{
	if (*runq > len)
		*runq = len;
	if (*chain > len - *runq)
		*chain = len - *runq;
	if (len < min_block_ns || len > max_block_ns) {
		stat_add(STAT_OUT_OF_RANGE, 1);
		stat_add(STAT_OUT_OF_RANGE_NS, len);
		return false;
	}
	return true;
}

/* Adds one interval ending at end to the aggregation map, with its
 * waker and the part of it (runq, <= its length) spent waiting for a
 * CPU; open marks one still running when recording stops. len: its
 * length, by the run queue's clock where both ends have it. */
static __always_inline void account_interval(u32 tid, struct start_rec *s, struct waker_rec *w, u32 open, u64 end,
					     u64 len, u64 runq, u64 chain, u32 ks)
{
	if (end <= s->ts)
		return; /* started as the window closed */
	if (!kept(len, &runq, &chain))
		return;
	aggregate(tid, s, w, open, len, runq, chain, 0, ks);
	stream_wait(tid, s, w, open, end, runq);
}

/* How long, of the waiter's wait, its waker was itself off a CPU. */
static __always_inline u64 chain_part(struct start_rec *s, u64 now)
{
	return s->waker.valid ? s->waker_wait_ns : 0;
}

/* Remembers a wait that ended now, for the chains of the threads this
 * thread wakes next (s: from task_starts). */
static __always_inline void remember_wait(struct start_rec *s, u64 now)
{
	if (!want_wakeups)
		return;
	struct past_waits *p = waits_of(s);
	u32 i = p->next % PAST_WAITS;
	p->from[i] = s->ts;
	p->to[i] = now;
	p->ustack[i] = s->ustack > 0 ? s->ustack : 0;
	p->kstack[i] = s->kstack > 0 ? s->kstack : 0;
	p->next++;
}

/* How long the waker (me) was off a CPU since the waiter's wait began:
 * its remembered waits' overlap with [since, now]; w gets the stacks of
 * the one that overlapped most. */
static __always_inline u64 waits_since(struct past_waits *me, u64 since, u64 now, struct waker_rec *w)
{
	u64 sum = 0, best = 0;
#pragma unroll
	for (int i = 0; i < PAST_WAITS; i++) {
		u64 from = me->from[i] > since ? me->from[i] : since;
		u64 to = me->to[i] < now ? me->to[i] : now;
		if (to <= from)
			continue;
		sum += to - from;
		if (to - from > best) {
			best = to - from;
			w->wait_ustack = me->ustack[i];
			w->wait_kstack = me->kstack[i];
		}
	}
	return sum;
}

/* A thread that sleeps again where it last slept (stack_cache) reuses
 * that sleep's stack ids instead of walking both stacks again, the
 * largest cost of a switch. Preemptions are always captured: they can
 * stop a thread anywhere. */
static __always_inline void capture_sleep(void *ctx, struct start_rec *s, struct task_struct *prev, u64 now)
{
	u32 slot = WHERE_SCHED;
	struct stack_where *at = bpf_map_lookup_elem(&where_scratch, &slot);
	if (!at) {
		capture(ctx, s, false, now);
		return;
	}
	bool known = stack_where_of(prev, prev->tgid, 0, at);
	if (known && stack_cache_get(&s->sleep_cache, at, &s->ustack, &s->kstack)) {
		s->ts = now;
		stat_add(STAT_STACKS_REUSED, 1);
		return;
	}
	capture(ctx, s, false, now);
	if (known)
		stack_cache_put(&s->sleep_cache, at, s->ustack, s->kstack);
	else
		stack_cache_clear(&s->sleep_cache);
}

/* The length of an interval that ended at now, read on entry to the
 * program (the program's own cost is on-CPU time on both ends), and in
 * runq its wait for a CPU; now_rq: the switch's run-queue clock. With the
 * run queue's clock at both ends the interval is the scheduler's own: it
 * ends where the thread's CPU time starts, and its wait for a CPU is
 * run_delay's. */
static __always_inline u64 measure(struct start_rec *s, struct task_struct *t, u64 now, u64 now_rq, u64 *runq)
{
	*runq = t ? queued_since(t, s, now_rq) : queued_since_tp(s, now);
	if (now_rq > s->ts_rq && s->ts_rq)
		return now_rq - s->ts_rq;
	return now - s->ts;
}

/* Accounts an interval that ended at now, its stacks walked already. */
static __always_inline void account(u32 tid, struct task_struct *t, struct start_rec *s, struct waker_rec *w,
				    u64 now, u64 now_rq)
{
	u64 runq, len = measure(s, t, now, now_rq, &runq);
	account_interval(tid, s, w, 0, now, len, runq, chain_part(s, now), AGG_SCHED);
}

/* A random number below n (0 < n < 2^32: the threshold is at most 1 ms). */
static __always_inline u32 below(u64 n)
{
	return bpf_get_prandom_u32() % (u32)n;
}

/* Deferred walks, at the switch-in of t: every interval is counted, and
 * one at least walk_threshold_ns long has its stacks walked; a shorter
 * one is walked with probability length / threshold, its values then
 * weighted by threshold / length (the estimate of the time of each stack
 * is unbiased), and its exact time kept per thread and state so user
 * space can calibrate. The walk happens in t's own context at the end of
 * __schedule (offcpu_switched_in), where its stacks are still those it
 * slept with. Returns true when a walk is due. */
static __always_inline bool account_deferred(u32 tid, struct task_struct *t, struct start_rec *s, u64 now,
					     u64 now_rq)
{
	if (now <= s->ts)
		return false;
	u64 runq, len = measure(s, t, now, now_rq, &runq);
	u64 chain = chain_part(s, now);
	if (!kept(len, &runq, &chain))
		return false;
	u64 thr = walk_threshold_ns;
	u32 sampled = 0;
	u64 raw_runq = runq;
	if (thr && len < thr) {
		u32 st = s->state & 3;
		s->below_ns[st] += len;
		s->below_n[st]++;
		stat_add(STAT_BELOW_N, 1);
		stat_add(STAT_BELOW_NS, len);
		stat_add(STAT_BELOW_VAR, (len * (thr - len)) >> 10);
		if (below(thr) >= len) {
			stream_wait(tid, s, &s->waker, 0, now, runq);
			return false;
		}
		stat_add(STAT_BELOW_WALKED, 1);
		runq = runq * thr / len;
		chain = chain * thr / len;
		len = thr;
		sampled = 1;
	}
	s->d_runq_raw = raw_runq;
	s->d_end = now;
	s->d_ns = len;
	s->d_runq = runq;
	s->d_chain = chain;
	s->d_sampled = sampled;
	s->walk = 1;
	return true;
}

/* Walks the stacks a thread slept with: at its switch-out, or with
 * deferred walks at its switch-in (ts: the switch-out's time, kept). */
static __always_inline void walk_stacks(void *ctx, struct start_rec *s, struct task_struct *t, bool kthread, u64 ts)
{
	if (reuse_stacks && !kthread && s->state == STATE_SLEEPING &&
	    want_user_stacks && want_kernel_stacks)
		capture_sleep(ctx, s, t, ts);
	else
		capture(ctx, s, kthread, ts);
	s->link = kthread ? 0 : tctx_read(s->tgid);
}

/* A chosen interval whose walk never ran (no program at its switch-in's
 * end): counted, without stacks. */
static __always_inline void walk_missed(u32 tid, struct start_rec *s, u32 ks)
{
	s->walk = 0;
	s->ustack = -EAGAIN;
	s->kstack = -EAGAIN;
	stat_add(STAT_WALK_MISSED, 1);
	aggregate(tid, s, &s->waker, 0, s->d_ns, s->d_runq, s->d_chain, s->d_sampled, ks);
	stream_wait(tid, s, &s->waker, 0, s->d_end, s->d_runq_raw);
}

/* The CPU time of the run a switch-out ends (ran: se.sum_exec_runtime
 * now): the scheduler's own count since the switch-in; for a thread on a
 * CPU since before the window, the wall time since the window opened. */
static __always_inline void add_run(struct start_rec *s, struct task_struct *t, u64 ran, u64 now)
{
	if (s->running) {
		if (ran > s->in_ran)
			s->oncpu += ran - s->in_ran;
	} else if (!s->counting && rec_start_ns && now > rec_start_ns) {
		/* No switch-in seen: it ran since the start, or since a switch-in
		 * the program missed (before the filters were in place). Its
		 * current stint's CPU time (the scheduler's prev_sum_exec_runtime
		 * marks where it began), at most the window. */
		u64 span = now - rec_start_ns, stint_start = t->se.prev_sum_exec_runtime;
		u64 stint = ran > stint_start ? ran - stint_start : span;
		s->oncpu += stint < span ? stint : span;
	}
	s->running = 0;
	s->counting = 1;
}

static __always_inline void switched_in(struct start_rec *s, struct task_struct *t, u64 now)
{
	s->running = 1;
	s->counting = 1;
	s->in_ts = now;
	s->in_ran = t->se.sum_exec_runtime;
}

/* Stores a thread's on-CPU total: at its last switch-out, or at the end. */
static __always_inline void store_oncpu(struct task_struct *t, u64 oncpu, struct start_rec *s)
{
	struct thread_key k = { .tid = t->pid, .gen = task_gen(t) };
	struct thread_cpu v = { .tgid = t->tgid, .oncpu_ns = oncpu };
	if (s && deferred_walks) {
		for (int i = 0; i < 4; i++) {
			v.below_ns[i] = s->below_ns[i];
			v.below_n[i] = s->below_n[i];
		}
	}
	if (bpf_map_update_elem(&thread_cpus, &k, &v, BPF_ANY))
		stat_add(STAT_THREAD_CPU_FULL, 1);
}

/* A switch-out of a thread whose interval is still pending: the kernel ran
 * no program for its switch-in (seen on 6.18 without any recursion miss,
 * about one switch in 10^4). Its CPU time since the last switch-out is
 * exact, so the interval is that wall time less the CPU time; it keeps the
 * stacks of that switch-out. */
static __always_inline void recover_missed_in(u32 tid, struct start_rec *s, u64 ran, u64 rd, u64 now)
{
	stat_add(STAT_MISSED_IN, 1);
	u64 oncpu = ran - s->ran;
	if (ran >= s->ran && now - s->ts > oncpu) {
		/* Its wait for a CPU before the missed switch-in is in run_delay
		 * (rd: run_delay now) already. */
		u64 runq = rd > s->rd ? rd - s->rd : 0;
		s->ts += oncpu;
		account_interval(tid, s, &s->waker, 0, now, now - s->ts, runq, 0, AGG_SCHED);
	}
	/* Its run since the missed switch-in is counted by add_run. */
	s->running = 1;
	s->in_ran = s->ran;
	s->pending = 0;
	s->waker.valid = 0;
}

/* The wait for a CPU at the first switch-in of a thread blocked since
 * before the start: since its enqueue, and what the scheduler added to
 * run_delay since the start (the wait cut by a migration). */
static __always_inline u64 prestart_runq(struct task_struct *t)
{
	u32 tid = t->pid;
	u64 *rd = bpf_map_lookup_elem(&blocked_rd, &tid);
	u64 now = t->sched_info.run_delay, gained = rd && now > *rd ? now - *rd : 0;
	return gained + queued_now(t, rq_clock_of(t));
}

/* Accounts a thread blocked since before the start of the window until
 * end (0: now), with its kernel stack if kstack (it is still in the wait's
 * __schedule); whole: it is still blocked at the end. */
static __always_inline void account_prestart(struct task_struct *t, u32 state, u32 whole, u64 runq, u64 end,
					     bool kstack)
{
	u64 start = rec_start_ns, now = end ? end : window_now();
	if (!start || now <= start)
		return;
	/* Created inside the window: its wait for a first run is not blocking. */
	if (t->start_time >= start)
		return;
	/* The filters apply; an unknown state passes only an unfiltered one. */
	if (state >= STATE_UNKNOWN ? state_mask != 0xf : !(state_mask & (1u << state)))
		return;
	if (now - start < min_block_ns || now - start > max_block_ns) {
		stat_add(STAT_OUT_OF_RANGE, 1);
		stat_add(STAT_OUT_OF_RANGE_NS, now - start);
		return;
	}
	u32 zero = 0, tid = t->pid;
	struct prestart_val *v = bpf_map_lookup_elem(&prestart_scratch, &zero);
	if (!v)
		return;
	v->ns = now - start;
	v->runq_ns = runq < v->ns ? runq : v->ns;
	v->tgid = t->tgid;
	v->gen = task_gen(t);
	v->state = state;
	v->whole = whole;
	v->kthread = (t->flags & PF_KTHREAD) != 0;
	s64 *us = bpf_map_lookup_elem(&blocked_ustacks, &tid);
	v->ustack = us ? *us : -1;
	/* The helper zero-fills what the stack does not use. */
	v->kstack[0] = 0;
	if (kstack && want_kernel_stacks && bpf_get_task_stack(t, v->kstack, sizeof(v->kstack), 0) < 0)
		v->kstack[0] = 0;
	if (bpf_map_update_elem(&prestart, &tid, v, BPF_NOEXIST) == 0)
		stat_add(STAT_NO_START, 1);
}

/* The first switch-out of a target with no switch-in seen (the kernel ran
 * no program for it, about one switch in 10^4): if its run began inside
 * the window, it was blocked from the start until that switch-in (the
 * run queue's clock at its arrival), as a first switch-in would have
 * counted. Its kernel stack is no longer the wait's. */
static __always_inline void prestart_missed_in(struct task_struct *t, u64 now, u64 now_rq)
{
	u64 start = rec_start_ns, arrived = t->sched_info.last_arrival;
	if (!start || !arrived || now_rq < arrived || now - start <= now_rq - arrived)
		return;
	stat_add(STAT_MISSED_IN, 1);
	account_prestart(t, STATE_UNKNOWN, 0, prestart_runq(t), now - (now_rq - arrived), false);
}

/* A recorded thread leaves the CPU: its run is counted, and unless it is
 * dying or its state is filtered out, its interval starts with its
 * stacks. */
static __always_inline void switch_out(void *ctx, struct start_rec *s, struct task_struct *prev,
				       unsigned int prev_state, u8 state, bool kthread, u64 now, u64 now_rq)
{
	u32 ptid = prev->pid, ptgid = prev->tgid;
	u64 ran = prev->se.sum_exec_runtime;
	if (s->walk)
		walk_missed(ptid, s, AGG_SCHED);
	if (s->pending)
		recover_missed_in(ptid, s, ran, prev->sched_info.run_delay, now);
	else if (!s->running && !s->counting)
		prestart_missed_in(prev, now, now_rq);
	add_run(s, prev, ran, now);
	if (prev_state & TASK_DEAD) {
		/* Its last switch-out starts no interval; its name is still
		 * kept (it may never have switched out before). */
		thread_exit(ptgid, ptid);
		store_oncpu(prev, s->oncpu, s);
		return;
	}
	if (!(state_mask & (1u << state)))
		return;
	if (!s->seen) {
		announce(ptgid, ptid);
		s->seen = 1;
	}
	s->tgid = ptgid;
	s->tgen = task_gen(prev);
	s->state = state;
	s->rd = prev->sched_info.run_delay;
	s->ts_rq = now_rq;
	if (deferred_walks) {
		/* Walked at the switch-in, if at all. */
		s->ustack = -EAGAIN;
		s->kstack = -EAGAIN;
		s->link = 0;
		s->ts = now;
	} else {
		walk_stacks(ctx, s, prev, kthread, now);
	}
	s->ran = ran;
	s->pending = 1;
	/* Last: nothing else is live across the call. */
	interp_lock_wait(prev, ptgid, &s->gil, &s->gil_holder, &s->gil_holder_stack);
}

#endif
