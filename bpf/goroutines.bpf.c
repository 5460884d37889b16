//go:build ignore

// Goroutine waits, from outside: a uprobe on the Go runtime's casgstatus
// (every goroutine state change goes through it) sees a goroutine park
// (running -> waiting), made runnable (waiting -> runnable) and run again
// (runnable -> running); and put back on a run queue (running or in a
// system call -> runnable: preempted, yielded, or back from a system call
// without a P), a wait for a P alone. A second uprobe, on preemptPark,
// sees a running goroutine the GC suspends to scan its stack (it leaves
// running without casgstatus; the GC makes it runnable through it). The park's stack is walked from the
// goroutine's saved state by frame pointers (Go keeps them); the waker is the
// goroutine running on the thread that made it runnable, or none (the
// scheduler: netpoll, timers). Time is aggregated in the kernel by
// (process, goroutine, reason, park stack, waker, waker stack).
// Go's ABIInternal: arguments in rax, rbx, rcx and the current g in r14 on
// amd64, x0-x2 and x28 on arm64 (g0 on the scheduler's stack).

#include "offcpu_types.h"
#include <bpf/bpf_helpers.h>
#include "goroutines_shared.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define G_RUNNABLE 1
#define G_RUNNING 2
#define G_SYSCALL 3
#define G_WAITING 4

/* User registers as a uprobe sees them, and where Go's ABIInternal puts
 * the first three arguments and the current g. At a function's entry its
 * return address is on the stack (x86-64) or in the link register (arm64:
 * read at the program's entry, GO_LR; the verifier refuses the context
 * pointer passed on and offset). */
#if defined(__TARGET_ARCH_arm64)
struct go_regs {
	u64 regs[31], sp, pc, pstate;
};
#define GO_ARG0 regs[0]
#define GO_ARG1 regs[1]
#define GO_ARG2 regs[2]
#define GO_G regs[28]
#define GO_PC pc
#define GO_SP sp
#define GO_FP regs[29]
#define GO_LR(c) ((c)->regs[30])
#define GO_ENTRY_RA(c, lr) (lr)
#elif defined(__TARGET_ARCH_x86)
struct go_regs {
	u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di, orig_ax, ip, cs, flags, sp, ss;
};
#define GO_ARG0 ax
#define GO_ARG1 bx
#define GO_ARG2 cx
#define GO_G r14
#define GO_PC ip
#define GO_SP sp
#define GO_FP bp
#define GO_LR(c) 0
#define GO_ENTRY_RA(c, lr) go_u64((c)->sp)
#else
#error "build with bpf2go -target amd64 or arm64"
#endif

/* Where the runtime keeps what is read, per process: offsets into
 * runtime.g and runtime.m, from the binary's DWARF or its Go release. */
struct go_offsets {
	u32 goid;
	u32 waitreason;
	u32 m;
	u32 sched_sp;
	u32 sched_pc;
	u32 sched_bp;
	u32 m_curg;
	u32 gopc;    /* the pc of the go statement that created it; 0: not known */
	u32 startpc; /* the function it runs; 0: not known */
	u32 preempted; /* the wait reason of a goroutine the GC suspended (go_preempt_park); 0xff: none */
	u32 labels;       /* g.labels (pprof labels); 0: not known */
	u32 label_layout; /* GO_LABELS_* */
	u32 framed;       /* the probe sits past casgstatus's frame set-up: the return address is at bp+8 */
	u64 probed_ns; /* when the probe was put on the process */
	u64 gc_cycles; /* runtime.memstats.numgc's address; 0: not known */
};

/* A parked goroutine, by its runtime.g's address: every transition has
 * it in a register, and a g is not reused while it waits. */
struct go_gkey {
	u32 tgid;
	u32 pad;
	u64 g;
};

/* Where a goroutine was when its stack was last walked (registers, the
 * return address, the caller's return address) and the stack: at the
 * same place again it has the same stack, and the walk (a 2 KiB read and
 * a hash) is skipped. */
struct go_site {
	u64 ip, sp, bp, ret, ret2, stack;
};

/* A goroutine between its park and its next run; after the run (run_ns
 * set) its last wait, which a goroutine it wakes next chains through. */
struct go_park {
	u64 goid;
	u64 park_ns;
	u64 ready_ns; /* 0: still waiting */
	u64 run_ns;   /* 0: not run since */
	u64 stack;
	u64 waker_stack;
	u64 waker_goid; /* 0: the scheduler, no goroutine */
	u64 waker_wait_stack; /* the waker's own last wait, while this one lasted */
	u64 waker_wait_ns;
	u64 gopc;
	u64 startpc;
	u64 link;   /* its labels at the park (go_links), 0: none */
	u64 labels; /* g.labels then, the GC cycle in its top 16 bits (go_link) */
	u32 reason;
	u32 tid;       /* the thread it parked on */
	u32 waker_tid; /* the thread that made it runnable */
	u32 flags;     /* go_key.flags known at the park */
	struct go_site at; /* where it parked */
	struct go_site wk; /* where it last made a goroutine runnable, as a waker */
};

/* go_key.flags */

struct go_key {
	u32 tgid;
	u16 reason;
	u16 flags;
	u64 goid;
	u64 stack;
	u64 waker_stack;
	u64 waker_goid;
	u64 waker_wait_stack;
	u64 gopc;
	u64 startpc;
	u64 link;
};

struct go_val {
	u64 count;
	u64 blocked_ns;    /* park to runnable */
	u64 runq_ns;       /* runnable to running */
	u64 waker_wait_ns; /* of blocked_ns, the waker's own wait */
};

struct go_stack {
	u64 ips[GO_STACK_DEPTH];
};

/* One goroutine wait, as go_aggregate counts it (the wait stream). */
struct go_wait_event {
	u64 goid;
	u64 park_ns; /* from the window's start at the earliest */
	u64 ready_ns;
	u64 run_ns;
	u64 stack; /* ids in go_stacks (0: none) */
	u64 waker_stack;
	u64 waker_goid;
	u64 startpc;
	u64 link;
	u32 tgid;
	u32 tid;       /* the thread it parked on */
	u32 run_tid;   /* the thread it runs on now */
	u32 waker_tid; /* the thread that made it runnable */
	u16 reason;
	u16 flags;
	u32 pad;
};

/* Ring records: named so that bpf2go generates their Go type. */
const struct go_wait_event *unused_go_wait_event __attribute__((unused));

enum go_stat {
	GO_STAT_PARKS,
	GO_STAT_READIES,
	GO_STAT_RUNS,
	GO_STAT_LOST_PARKS,  /* go_parked full: the wait is not counted */
	GO_STAT_LOST_WAITS,  /* go_waits full, even without goroutine ids */
	GO_STAT_LOST_STACKS, /* go_stacks full: counted without its stack */
	GO_STAT_UNSEEN,      /* made runnable, its park not seen (before the probe): counted since the probe */
	GO_STAT_MERGED,      /* go_waits full: counted without its goroutine ids */
	GO_STAT_REUSED,      /* parks and wake-ups at a goroutine's last place: stack reused */
	GO_STAT_LINKS,       /* label sets read */
	GO_STAT_LOST_LINKS,  /* go_links full: waits counted without their labels */
	GO_STAT_REQUEUES,    /* running goroutines put back on a run queue */
	GO_STAT_SUSPENDS,    /* running goroutines the GC suspended (preemptPark) */
	GO_STAT_STREAM_LOST, /* waits go_stream had no room for */
	GO_STAT_MAX,
};

/* Read by user space: the number of counters. */
const volatile enum go_stat go_stat_count = GO_STAT_MAX;

/* Send every wait to go_stream too (--timeline): sized by user space, a
 * page when off, when the verifier prunes the send as dead code. */
const volatile bool go_want_stream = false;

/* The recorded window (bpf_ktime_get_ns clock), written by user space as
 * the thread programs' are: nothing before the start or after the stop
 * is counted; waits open at the stop are counted up to it by drain. */
u64 go_start_ns = 0;
u64 go_stop_ns = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct go_offsets);
} go_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 131072); /* --goroutines-max */
	__type(key, struct go_gkey);
	__type(value, struct go_park);
} go_parked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct go_key);
	__type(value, struct go_val);
} go_waits SEC(".maps");

/* Waits aggregated without goroutine ids, when go_waits is full. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct go_key);
	__type(value, struct go_val);
} go_waits_merged SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u64);
	__type(value, struct go_stack);
} go_stacks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, GO_STAT_MAX);
	__type(key, u32);
	__type(value, u64);
} go_stats SEC(".maps");

/* The goroutine wait stream, read by user space on a timer. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4096);
} go_stream SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct go_stack);
} go_scratch SEC(".maps");

/* runtime.g's first words: stack.hi, m, sched, goid and waitreason (each
 * at a multiple of 8) are read in one go; gopc and startpc lie further. */
#define G_STACK_HI 8     /* g.stack.hi: the stack is g's first field */
struct go_gwords {
	u64 w[G_BASE_WORDS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct go_gwords);
} go_gbuf SEC(".maps");

/* go_gread reads g's first words into buffer slot (0 or 1). */
static __always_inline struct go_gwords *go_gread(u64 g, u32 slot)
{
	struct go_gwords *b = bpf_map_lookup_elem(&go_gbuf, &slot);
	if (!b)
		return 0;
	if (!g || bpf_probe_read_user(b, sizeof(*b), (void *)g))
		__builtin_memset(b, 0, sizeof(*b));
	return b;
}

/* go_gword is the word of g at offset off (a multiple of 8), read by
 * go_gread; go_gbyte the byte. */
static __always_inline u64 go_gword(struct go_gwords *b, u32 off)
{
	u64 i = ((u64)off / 8) & (G_BASE_WORDS - 1);
	return b->w[i]; /* user space checks the offsets are in range */
}

static __always_inline u8 go_gbyte(struct go_gwords *b, u32 off)
{
	return go_gword(b, off & ~7U) >> ((off & 7) * 8);
}

static __always_inline void go_count(u32 stat)
{
	u64 *v = bpf_map_lookup_elem(&go_stats, &stat);
	if (v)
		(*v)++;
}

#define GO_LINKS_MAX 4096 /* 3.5 MB */
#define GO_LINK_KEPT() go_count(GO_STAT_LINKS)
#define GO_LINK_LOST() go_count(GO_STAT_LOST_LINKS)
#include "golinks.bpf.h"

/* The label set the goroutine at gp carries (pprof.Do,
 * SetGoroutineLabels), g.labels kept in p. */
static __always_inline u64 go_link(struct go_offsets *o, u32 tgid, u64 gp, struct go_park *p, struct go_park *prev)
{
	if (!o->labels || o->label_layout == GO_LABELS_NONE)
		return 0;
	u64 lp = go_u64(gp + o->labels);
	if (!lp)
		return 0;
	/* A set never changes: the same pointer as at its last park, in the
	 * same GC cycle, is the same set (golinks.bpf.h). A user address
	 * fits 47 bits: the cycle's low 16 go above it (a field of their own
	 * cost the verifier 40% more instructions). */
	u32 gc = go_gc_cycles(o->gc_cycles);
	p->labels = lp ^ (u64)gc << 48;
	if (prev && prev->goid == p->goid && prev->labels == p->labels && prev->link)
		return prev->link;
	return go_link_read(tgid, lp, o->label_layout, gc);
}

/* A goroutine's frames, read in one go from its innermost frame pointer
 * up: most stacks fit, and one read costs what one frame's does. */
#define GO_CHUNK 2048
struct go_chunk {
	u64 w[GO_CHUNK / 8];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct go_chunk);
} go_chunkbuf SEC(".maps");

/* Walks frame pointers from pc and bp (ret, when not 0, is the return
 * address of a function that has not pushed its frame yet; hi, when not
 * 0, the top of the stack), stores the stack by its hash and returns the
 * hash (0: none). Frames within GO_CHUNK of bp are read in one go, the
 * rest one by one. A stack ends at its first 0: what follows in the
 * scratch buffer is left from earlier walks and neither hashed nor read.
 * Most stacks are seen before: a lookup, not an update, finds them. */
static __always_inline u64 go_walk(u64 pc, u64 ret, u64 bp, u64 hi)
{
	u32 zero = 0;
	struct go_stack *st = bpf_map_lookup_elem(&go_scratch, &zero);
	struct go_chunk *c = bpf_map_lookup_elem(&go_chunkbuf, &zero);
	if (!st || !c || !pc)
		return 0;
	u64 base = bp, len = GO_CHUNK - 8;
	if (hi > bp && hi - bp < len)
		len = hi - bp; /* not past the top of the stack */
	len &= GO_CHUNK - 1;
	if (!bp || bpf_probe_read_user(c, len, (void *)bp))
		len = 0;
	u64 h = 14695981039346656037ULL; /* FNV-1a over the addresses */
	st->ips[0] = pc;
	h = (h ^ pc) * 1099511628211ULL;
	u32 n = 1;
	if (ret) {
		st->ips[1] = ret;
		h = (h ^ ret) * 1099511628211ULL;
		n = 2;
	}
	for (int i = 0; i < GO_STACK_DEPTH; i++) {
		u64 fr[2];
		if (n >= GO_STACK_DEPTH || !bp)
			break;
		u64 off = bp - base;
		if (bp >= base && off + 16 <= len) {
			fr[0] = c->w[(off / 8) & (GO_CHUNK / 8 - 1)];
			fr[1] = c->w[(off / 8 + 1) & (GO_CHUNK / 8 - 1)];
		} else if (bpf_probe_read_user(fr, sizeof(fr), (void *)bp)) {
			break;
		}
		if (!fr[1])
			break;
		st->ips[n & (GO_STACK_DEPTH - 1)] = fr[1];
		h = (h ^ fr[1]) * 1099511628211ULL;
		n++;
		if (fr[0] <= bp) /* stacks grow down: a caller's frame is above */
			break;
		bp = fr[0];
	}
	if (n < GO_STACK_DEPTH)
		st->ips[n & (GO_STACK_DEPTH - 1)] = 0;
	if (!h)
		h = 1;
	if (bpf_map_lookup_elem(&go_stacks, &h))
		return h;
	if (bpf_map_update_elem(&go_stacks, &h, st, BPF_NOEXIST) && !bpf_map_lookup_elem(&go_stacks, &h)) {
		go_count(GO_STAT_LOST_STACKS);
		return 0;
	}
	return h;
}

/* The stack walked from ip (ret: a return address not yet in a frame),
 * or the one cached in c when the goroutine is at the same place. */
static __always_inline u64 go_stack_at(struct go_site *c, u64 ip, u64 sp, u64 bp, u64 ret, u64 hi)
{
	u64 ret2 = bp ? go_u64(bp + 8) : 0;
	if (c && c->stack && c->ip == ip && c->sp == sp && c->bp == bp && c->ret == ret && c->ret2 == ret2) {
		go_count(GO_STAT_REUSED);
		return c->stack;
	}
	u64 h = go_walk(ip, ret, bp, hi);
	if (c) {
		c->ip = ip;
		c->sp = sp;
		c->bp = bp;
		c->ret = ret;
		c->ret2 = ret2;
		c->stack = h;
	}
	return h;
}

/* casgstatus's return address and its caller's frame pointer (*bp), as
 * at its entry: at sp and in bp there, in its own frame past the frame's
 * set-up (o->framed). The walks and the stack cache see the same either
 * way. */
static __always_inline u64 go_entry_ret(struct go_offsets *o, struct go_regs *ctx, u64 lr, u64 *bp)
{
	u64 fr[2] = {};
	if (!o->framed) {
		*bp = ctx->GO_FP;
		return GO_ENTRY_RA(ctx, lr);
	}
	bpf_probe_read_user(fr, sizeof(fr), (void *)ctx->GO_FP);
	*bp = fr[0];
	return fr[1];
}

/* GO_MERGED stands for the goroutine ids of waits aggregated without
 * them: with more goroutines than go_waits holds, their time still counts. */
#define GO_MERGED (~0ULL)

static __always_inline struct go_val *go_waits_entry(void *map, struct go_key *k)
{
	struct go_val *v = bpf_map_lookup_elem(map, k);
	if (v)
		return v;
	struct go_val zero = {};
	bpf_map_update_elem(map, k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(map, k);
}

/* Sends a wait ended by a run at now to go_stream. */
static __always_inline void go_stream_wait(u32 tgid, struct go_park *p, u64 park, u64 ready, u64 now)
{
	struct go_wait_event *e = bpf_ringbuf_reserve(&go_stream, sizeof(*e), 0);
	if (!e) {
		go_count(GO_STAT_STREAM_LOST);
		return;
	}
	e->goid = p->goid;
	e->park_ns = park;
	e->ready_ns = ready;
	e->run_ns = now;
	e->stack = p->stack;
	e->waker_stack = p->waker_stack;
	e->waker_goid = p->waker_goid;
	e->startpc = p->startpc;
	e->link = p->link;
	e->tgid = tgid;
	e->tid = p->tid;
	e->run_tid = (u32)bpf_get_current_pid_tgid();
	e->waker_tid = p->waker_tid;
	e->reason = p->reason;
	e->flags = p->flags | (p->park_ns < go_start_ns ? GO_BEFORE_START : 0);
	e->pad = 0;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP); /* read on a timer */
}

/* Counts a wait ended by a run at now, the part of it inside the window. */
static __always_inline void go_aggregate(u32 tgid, struct go_park *p, u64 now)
{
	u64 start = go_start_ns;
	if (!start || now <= start)
		return;
	u64 park = p->park_ns > start ? p->park_ns : start;
	u64 ready = p->ready_ns > park ? p->ready_ns : park;
	if (go_want_stream)
		go_stream_wait(tgid, p, park, ready, now);
	struct go_key k = { .tgid = tgid, .reason = p->reason, .goid = p->goid, .stack = p->stack,
			    .waker_stack = p->waker_stack, .waker_goid = p->waker_goid,
			    .waker_wait_stack = p->waker_wait_stack, .gopc = p->gopc, .startpc = p->startpc, .link = p->link,
			    .flags = p->flags | (p->park_ns < start ? GO_BEFORE_START : 0) };
	struct go_val *v = go_waits_entry(&go_waits, &k);
	if (!v) {
		k.goid = GO_MERGED;
		k.waker_goid = p->waker_goid ? GO_MERGED : 0;
		k.link = 0; /* per-request sets are what fills go_waits */
		v = go_waits_entry(&go_waits_merged, &k);
		go_count(v ? GO_STAT_MERGED : GO_STAT_LOST_WAITS);
		if (!v)
			return;
	}
	u64 ww = p->waker_wait_ns < ready - park ? p->waker_wait_ns : ready - park;
	if (k.goid == GO_MERGED) {
		__sync_fetch_and_add(&v->count, 1);
		__sync_fetch_and_add(&v->blocked_ns, ready - park);
		__sync_fetch_and_add(&v->runq_ns, now - ready);
		__sync_fetch_and_add(&v->waker_wait_ns, ww);
		return;
	}
	/* One writer: the key holds the goroutine, which runs on one thread
	 * at a time (the runtime's CAS on its status orders the runs). */
	v->count++;
	v->blocked_ns += ready - park;
	v->runq_ns += now - ready;
	v->waker_wait_ns += ww;
}

/* The waker's own entry, if it has one (it parked before): its last wait
 * and where it last made a goroutine runnable. */
static __always_inline struct go_park *go_waker_entry(u32 tgid, u64 waker_g, u64 waker_goid)
{
	struct go_gkey wk = { .tgid = tgid, .g = waker_g };
	struct go_park *w = bpf_map_lookup_elem(&go_parked, &wk);
	return w && w->goid == waker_goid ? w : 0;
}

/* The waker's own wait during p's: its last wait (park to run), if that
 * ended after p began; chains follow it to what the waker waited for. */
static __always_inline void go_waker_wait(struct go_park *w, struct go_park *p)
{
	p->waker_wait_stack = 0;
	p->waker_wait_ns = 0;
	if (!w || !w->run_ns)
		return;
	u64 from = w->park_ns > p->park_ns ? w->park_ns : p->park_ns;
	if (w->run_ns <= from)
		return;
	p->waker_wait_stack = w->stack;
	p->waker_wait_ns = w->run_ns - from;
}

/* Fills p with goroutine gp's park at `at`: its id, reason, creator and
 * start, and its stack, from the registers when it parks itself (ctx),
 * else from its saved state. Creator and start never change: they are
 * read at a goroutine's first park and kept from its entry (prev) after.
 * Not 0: g unreadable. */
static __always_inline int go_park_state(struct go_offsets *o, u32 tgid, u64 gp, struct go_regs *ctx, u64 lr, u64 at,
					 u32 tid, struct go_park *p, struct go_park *prev)
{
	struct go_gwords *g = go_gread(gp, 0);
	if (!g)
		return 1;
	p->goid = go_gword(g, o->goid);
	p->park_ns = at;
	p->tid = tid;
	p->reason = go_gbyte(g, o->waitreason);
	p->link = go_link(o, tgid, gp, p, prev);
	if (prev && prev->goid == p->goid) {
		p->gopc = prev->gopc;
		p->startpc = prev->startpc;
	} else {
		p->gopc = o->gopc ? go_u64(gp + o->gopc) : 0;
		p->startpc = o->startpc ? go_u64(gp + o->startpc) : 0;
	}
	struct go_site site = {};
	if (prev && prev->goid == p->goid)
		site = prev->at;
	if (ctx) { /* changed its own state, not parked by mcall: sched is stale */
		u64 bp, ret = go_entry_ret(o, ctx, lr, &bp);
		p->stack = go_stack_at(&site, ctx->GO_PC, ctx->GO_SP, bp, ret, go_gword(g, G_STACK_HI));
	} else {
		p->stack = go_stack_at(&site, go_gword(g, o->sched_pc), go_gword(g, o->sched_sp), go_gword(g, o->sched_bp), 0,
				       go_gword(g, G_STACK_HI));
	}
	p->at = site;
	if (prev && prev->goid == p->goid)
		p->wk = prev->wk;
	return 0;
}

SEC("uprobe/casgstatus")
int go_casgstatus(struct go_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	struct go_offsets *o = bpf_map_lookup_elem(&go_procs, &tgid);
	if (!o || go_stop_ns)
		return 0; /* not a target, or the window closed: drain counts what is open */
	u64 gp = ctx->GO_ARG0, lr = GO_LR(ctx);
	u32 from = ctx->GO_ARG1, to = ctx->GO_ARG2;
	/* Requeued: goschedImpl (preempted, Gosched), exitsyscall0 and from
	 * go1.26 exitsyscallNoP (its P taken while in a system call). */
	int requeue = to == G_RUNNABLE && (from == G_RUNNING || from == G_SYSCALL);
	int park = (from == G_RUNNING && to == G_WAITING) || requeue;
	int ready = from == G_WAITING && (to == G_RUNNABLE || to == G_RUNNING);
	if (!park && !ready && !(from == G_RUNNABLE && to == G_RUNNING))
		return 0; /* system calls, exits, the GC's suspensions: not followed */
	u64 now = bpf_ktime_get_ns();
	struct go_gkey gk = { .tgid = tgid, .g = gp };

	if (park) {
		/* Its entry, if any, is its last wait: written over in place. */
		struct go_park *prev = bpf_map_lookup_elem(&go_parked, &gk);
		struct go_park p = {};
		if (go_park_state(o, tgid, gp, gp == ctx->GO_G ? ctx : 0, lr, now, (u32)id, &p, prev))
			return 0;
		if (requeue) { /* runnable at once: no waker, its g.waitreason stale */
			p.reason = GO_REASON_RUNNABLE;
			p.ready_ns = now;
		}
		go_count(requeue ? GO_STAT_REQUEUES : GO_STAT_PARKS);
		if (prev)
			*prev = p;
		else if (bpf_map_update_elem(&go_parked, &gk, &p, BPF_ANY))
			go_count(GO_STAT_LOST_PARKS);
		return 0;
	}
	if (ready) {
		struct go_park *p = bpf_map_lookup_elem(&go_parked, &gk);
		if (p && p->run_ns)
			return 0; /* seen running since: a GC suspension go_preempt_park missed */
		if (!p) {
			/* Never seen: parked before the probe, its saved state
			 * still the park's; its wait counted from the probe. */
			struct go_park np = { .flags = GO_BEFORE_START };
			u64 since = o->probed_ns > go_start_ns ? o->probed_ns : go_start_ns;
			if (go_park_state(o, tgid, gp, 0, 0, since, 0, &np, 0) || np.reason == o->preempted)
				return 0;
			go_count(GO_STAT_UNSEEN);
			if (bpf_map_update_elem(&go_parked, &gk, &np, BPF_ANY))
				return 0;
			p = bpf_map_lookup_elem(&go_parked, &gk);
			if (!p)
				return 0;
		}
		go_count(GO_STAT_READIES);
		p->ready_ns = now;
		p->waker_tid = (u32)id;
		/* The waker: the current g, or on the scheduler's stack (g0,
		 * goid 0) the goroutine the thread was running, whose state
		 * systemstack saved. */
		u64 cur = ctx->GO_G;
		struct go_gwords *g = go_gread(cur, 0);
		if (!g)
			return 0;
		u64 cur_goid = go_gword(g, o->goid);
		if (cur && cur_goid) {
			p->waker_goid = cur_goid;
			struct go_park *w = go_waker_entry(tgid, cur, cur_goid);
			u64 bp, ret = go_entry_ret(o, ctx, lr, &bp);
			p->waker_stack = go_stack_at(w ? &w->wk : 0, ctx->GO_PC, ctx->GO_SP, bp, ret, go_gword(g, G_STACK_HI));
			go_waker_wait(w, p);
		} else {
			u64 curg = go_u64(go_gword(g, o->m) + o->m_curg);
			struct go_gwords *cg = go_gread(curg, 1);
			u64 curg_goid = cg ? go_gword(cg, o->goid) : 0;
			if (curg_goid) {
				p->waker_goid = curg_goid;
				struct go_park *w = go_waker_entry(tgid, curg, curg_goid);
				p->waker_stack = go_stack_at(w ? &w->wk : 0, go_gword(cg, o->sched_pc), go_gword(cg, o->sched_sp),
							     go_gword(cg, o->sched_bp), 0, go_gword(cg, G_STACK_HI));
				go_waker_wait(w, p);
			} else {
				p->waker_goid = 0;
				u64 bp, ret = go_entry_ret(o, ctx, lr, &bp);
				p->waker_stack = go_walk(ctx->GO_PC, ret, bp, go_gword(g, G_STACK_HI));
				p->waker_wait_stack = 0;
				p->waker_wait_ns = 0;
			}
		}
		if (to == G_RUNNING) { /* run at once: no run-queue wait */
			go_aggregate(tgid, p, now);
			p->run_ns = now;
		}
		return 0;
	}
	/* runnable -> running: the wait ends; the entry stays as the
	 * goroutine's last wait until it parks again. */
	struct go_park *p = bpf_map_lookup_elem(&go_parked, &gk);
	if (!p || !p->ready_ns || p->run_ns)
		return 0;
	go_count(GO_STAT_RUNS);
	go_aggregate(tgid, p, now);
	p->run_ns = now;
	return 0;
}

/* runtime.preemptPark(gp), on g0: the GC suspends a running goroutine
 * (suspendG, to scan its stack) until resumeG readies it; its state was
 * saved (mcall, morestack). A park with the runtime's reason "preempted":
 * casgstatus sees the rest. */
SEC("uprobe/preemptPark")
int go_preempt_park(struct go_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	struct go_offsets *o = bpf_map_lookup_elem(&go_procs, &tgid);
	if (!o || go_stop_ns || o->preempted >= 0xff)
		return 0;
	u64 gp = ctx->GO_ARG0;
	struct go_gkey gk = { .tgid = tgid, .g = gp };
	struct go_park *prev = bpf_map_lookup_elem(&go_parked, &gk);
	struct go_park p = {};
	if (go_park_state(o, tgid, gp, 0, 0, bpf_ktime_get_ns(), (u32)id, &p, prev))
		return 0;
	p.reason = o->preempted;
	go_count(GO_STAT_SUSPENDS);
	if (prev)
		*prev = p;
	else if (bpf_map_update_elem(&go_parked, &gk, &p, BPF_ANY))
		go_count(GO_STAT_LOST_PARKS);
	return 0;
}
