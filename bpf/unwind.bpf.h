/* User stacks without frame pointers: .eh_frame rows loaded by user space,
 * HotSpot frames named from the JVM's own structures. */
#ifndef OFFCPU_UNWIND_H
#define OFFCPU_UNWIND_H

#include "common.bpf.h"
#include "stacks.bpf.h"
#include "py.bpf.h"
#include "v8.bpf.h"
#include "ruby.bpf.h"

struct insert_ctx {
	struct unwind_proc *p;
	u64 start;
	u32 n, pos;
};

/* The walk's state. It lives in a per-CPU map value, not on the BPF stack:
 * the verifier tracks stack scalars exactly, so every frame and every
 * search step would be verified apart; values loaded from a map are
 * unknown to it, and one pass over the loop bodies suffices. */
struct unwind_state {
	u64 pc, sp, bp;
	u32 n;     /* frames stored */
	u32 dwarf; /* frames found through rows */
	u32 end;   /* reached the outermost frame */
	u32 lo, hi; /* binary search bounds */
	u32 callers; /* frames unwound: pc is a return address */
	/* An interpreter's (CPython's, CRuby's) next frame to record, at the
	 * next activation of its loop; interp_skip: the current activation's
	 * frames are recorded, its own frame is unwound unrecorded;
	 * interp_end: where CRuby's frames end. */
	u64 interp_frame, interp_end;
	u32 interp_emitted, interp_skip;
	/* Whose interpreter: its layout is looked up by tgid at each frame,
	 * not kept in the context (the walk's stack is near 6.1's limit). */
	u32 interp_py, interp_rb;
	struct interp_step step; /* here: the callback's stack is near its limit */
	/* Here, not in unwind_ctx: 6.1 counts the walk's stack to the
	 * limit. tgid: whose stack it is; v8: its process is V8's, with its
	 * layout copied from v8_procs at the walk's start. */
	u32 tgid, v8;
	struct v8_proc v8p;
};

struct unwind_ctx {
	struct unwind_state *u;
	struct unwind_proc *proc; /* 0: walk by frame pointers only */
	struct stack_buf *buf;
	struct task_struct *task; /* walked from another task (iterator) */
	u8 *fr;                   /* a frame_buf's bytes: interpreter frames are read there */
};

/* Index: row number. Value: unwind_row. The rows of every file loaded so
 * far, one contiguous sorted run per file, written by user space from the
 * file's .eh_frame. Size: --unwind-rows. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

/* Key: tgid. Value: unwind_proc. Written by user space when it sees a
 * process mapping code without frame pointers; a process absent here has
 * its user stacks walked by the kernel's frame-pointer walker. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct file_key);
	__type(value, struct file_unwind);
} unwind_files SEC(".maps");

/* Key: java_method_key. Value: unused. Method* values found in
 * interpreter frames and pcs in compiled methods; user space names them
 * and removes them. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct java_method_key);
	__type(value, u8);
} java_methods SEC(".maps");

/* Key: tgid. Value: java_proc. Written by user space once it has read a
 * JVM's structures: what turns an interpreter frame's bcp into a bci. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct java_proc);
} java_procs SEC(".maps");

/* A zeroed unwind_proc to create entries from (too large for the stack),
 * and the generation counter of entries made here. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct unwind_proc);
} unwind_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, u32);
} unwind_gen SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2); /* as stack_scratch */
	__type(key, u32);
	__type(value, struct unwind_state);
} unwind_scratch SEC(".maps");

/* pos: the first mapping starting at or after start. */
static long insert_find(u64 i, struct insert_ctx *c)
{
	struct unwind_proc *p = c->p;
	if (i >= c->n)
		return 1;
	if (p->maps[i & (UNWIND_MAX_MAPS - 1)].start >= c->start) {
		c->pos = i;
		return 1;
	}
	return 0;
}

/* Moves maps[pos, n) up one, last first. */
static long insert_shift(u64 i, struct insert_ctx *c)
{
	struct unwind_proc *p = c->p;
	u32 j = c->n - (u32)i;
	if (j <= c->pos || j == 0 || j >= UNWIND_MAX_MAPS)
		return 1;
	p->maps[j & (UNWIND_MAX_MAPS - 1)] = p->maps[(j - 1) & (UNWIND_MAX_MAPS - 1)];
	return 0;
}

/* Adds a code mapping of a file with loaded rows to the process's entry,
 * keeping the entry sorted by start. */
static __noinline void install_unwind(u32 tgid, u64 start, u64 end, u64 offset, struct file_key *k)
{
	struct file_unwind *f = bpf_map_lookup_elem(&unwind_files, k);
	if (!f || offset < f->seg_off || offset >= f->seg_end)
		return;
	u32 zero = 0;
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	if (!p) {
		struct unwind_proc *z = bpf_map_lookup_elem(&unwind_zero, &zero);
		if (!z || bpf_map_update_elem(&unwind_procs, &tgid, z, BPF_NOEXIST))
			return;
		p = bpf_map_lookup_elem(&unwind_procs, &tgid);
		if (!p)
			return;
	}
	u32 n = p->n;
	if (n >= UNWIND_MAX_MAPS)
		return;
	/* Callbacks: the verifier checks each body once. */
	struct insert_ctx c = { .p = p, .start = start, .n = n, .pos = n };
	bpf_loop(UNWIND_MAX_MAPS, insert_find, &c, 0);
	u32 pos = c.pos;
	if (pos >= n || p->maps[pos & (UNWIND_MAX_MAPS - 1)].start != start) {
		bpf_loop(UNWIND_MAX_MAPS, insert_shift, &c, 0);
		p->n = n + 1;
	}
	struct unwind_map *m = &p->maps[pos & (UNWIND_MAX_MAPS - 1)];
	m->start = start;
	m->end = end;
	m->bias = start - offset + f->off_vaddr;
	m->first = f->first;
	m->count = f->count;
	/* A new generation: stacks cached before are walked again. Entries
	 * made here count down from the top, user space's up from 1. */
	u32 *g = bpf_map_lookup_elem(&unwind_gen, &zero);
	if (g) {
		u32 next = *g + 1; /* racy, harmless: it need only differ from the last */
		*g = next;
		p->gen = ~next;
	}
}

/* The generation of a process's unwind entry (0: none). A thread's cached
 * stack ids are reused only while it is unchanged, so stacks walked before
 * the process's tables were loaded are walked again. */
static __always_inline u32 unwind_gen_of(u32 tgid)
{
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	return p ? p->gen : 0;
}

/* Finds the row for pc in the process's tables; 0 if pc is in a mapping
 * walked by frame pointers. */
static __always_inline struct unwind_row *find_row(struct unwind_proc *p, struct unwind_state *u, u64 pc)
{
	if (!p)
		return 0;
	u32 n = p->n;
	if (n > UNWIND_MAX_MAPS)
		return 0;
	/* First mapping starting above pc. */
	u->lo = 0;
	u->hi = n;
	for (int i = 0; i < MAP_SEARCH_STEPS; i++) {
		u32 lo = RELOAD(u->lo), hi = RELOAD(u->hi);
		if (lo >= hi)
			break;
		u32 mid = ((lo + hi) / 2) & (UNWIND_MAX_MAPS - 1);
		if (p->maps[mid].start <= pc)
			u->lo = mid + 1;
		else
			u->hi = mid;
	}
	u32 lo = RELOAD(u->lo);
	if (lo == 0)
		return 0;
	struct unwind_map *m = &p->maps[(lo - 1) & (UNWIND_MAX_MAPS - 1)];
	if (pc >= m->end || m->count == 0)
		return 0;
	u64 va = pc - m->bias;
	if (va > 0xffffffffULL)
		return 0;
	/* First row starting above va. */
	u32 first = m->first;
	u->lo = first;
	u->hi = first + m->count;
	for (int i = 0; i < ROW_SEARCH_STEPS; i++) {
		u32 l = RELOAD(u->lo), h = RELOAD(u->hi);
		if (l >= h)
			break;
		u32 mid = l + (h - l) / 2;
		struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &mid);
		if (!r)
			return 0;
		if (r->pc <= (u32)va)
			u->lo = mid + 1;
		else
			u->hi = mid;
	}
	u32 idx = RELOAD(u->lo);
	if (idx <= first)
		return 0;
	idx--;
	return bpf_map_lookup_elem(&unwind_rows, &idx);
}

/* The bytecode index an interpreter frame is at: its bcp less the start
 * of its method's bytecodes, which follow the ConstMethod. JAVA_BCI_NONE
 * when the process's layout is not known or the bcp is not in range. */
static __always_inline u64 java_bci(struct unwind_ctx *c, u64 method, u64 bcp, bool remote)
{
	struct java_proc *jp = bpf_map_lookup_elem(&java_procs, &c->u->tgid);
	u64 cm;
	if (!jp || !bcp || read_user(&cm, sizeof(cm), method + jp->const_method_off, c->task, remote))
		return JAVA_BCI_NONE;
	u64 code = cm + jp->const_method_size;
	if (bcp < code || bcp - code >= JAVA_BCI_NONE)
		return JAVA_BCI_NONE;
	return bcp - code;
}

/* One interpreter frame of the activation the walk is at, in its place:
 * the runtimes' one hook into the walker. */
static __always_inline long interp_frame(struct unwind_ctx *c, u32 n, bool remote)
{
	struct unwind_state *u = c->u;
	struct interp_step *st = &u->step;
	bool ok = false;
	if (u->interp_py) {
		struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &u->tgid);
		ok = pp && py_read_frame_of(pp, u->interp_frame, st, c->task, remote, c->fr);
		if (ok && st->entry)
			py_seen(u->tgid, st->entry);
	} else if (u->interp_rb) {
		struct ruby_proc *rp = bpf_map_lookup_elem(&ruby_procs, &u->tgid);
		ok = rp && ruby_read_frame(rp, u->interp_frame, u->interp_end, st, c->task, remote, c->fr);
		if (ok && st->entry)
			ruby_seen(u->tgid, st->entry);
	}
	if (!ok) {
		u->interp_frame = 0;
		u->interp_skip = u->interp_emitted > 0;
		return 0;
	}
	if (st->entry) {
		c->buf->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = st->entry;
		u->n = n + 1;
		u->interp_emitted++;
	}
	u->interp_frame = st->back;
	if (st->last) {
		u->interp_skip = u->interp_emitted > 0;
		u->interp_emitted = 0;
	}
	return 0;
}

/* A process's last hand-overs of its interpreter lock, for a wait's
 * holder to be the thread that held the lock for most of the wait rather
 * than the one that held it as the wait began (a yield hands the lock to
 * the head of its queue, often a short holder back from I/O, ahead of a
 * long one). Entries in the order written; written without a lock by any
 * CPU: an entry torn by a race misplaces at most one hand-over. */
#define LOCK_HANDOVERS 32
struct lock_ledger {
	u64 ts[LOCK_HANDOVERS];
	s64 stack[LOCK_HANDOVERS]; /* the holder's stack id, 0: not read */
	u32 tid[LOCK_HANDOVERS];
	u32 head;
	u32 sampled; /* bit i: stack[i] was sampled on a CPU */
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, u32); /* tgid */
	__type(value, struct lock_ledger);
} lock_ledgers SEC(".maps");

/* A new ledger's value (never written: the stack has no room for one). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct lock_ledger);
} lock_blank SEC(".maps");

/* Notes that tid holds tgid's lock from ts (stack: its stack then, 0 if
 * not read; sampled: read by an on-CPU sample of the holder); a holder
 * already newest gets the newer stack. A sampled stack is not replaced by
 * one a waiter read as it blocked: a waiter often blocks just after the
 * holder woke it, so reads there see the holder's hand-over code rather
 * than where it spends its stretch. */
static __always_inline void lock_handover(u32 tgid, u32 tid, s64 stack, u64 ts, bool sampled)
{
	struct lock_ledger *l = bpf_map_lookup_elem(&lock_ledgers, &tgid);
	if (!l) {
		u32 zero = 0;
		struct lock_ledger *blank = bpf_map_lookup_elem(&lock_blank, &zero);
		if (!blank)
			return;
		bpf_map_update_elem(&lock_ledgers, &tgid, blank, BPF_NOEXIST);
		l = bpf_map_lookup_elem(&lock_ledgers, &tgid);
		if (!l)
			return;
	}
	u32 last = (l->head - 1) & (LOCK_HANDOVERS - 1);
	if (l->head && l->tid[last] == tid) {
		if (stack > 0 && (sampled || !(l->sampled & (1u << last)))) {
			l->stack[last] = stack;
			if (sampled)
				l->sampled |= 1u << last;
		}
		return;
	}
	u32 i = l->head++ & (LOCK_HANDOVERS - 1);
	l->tid[i] = tid;
	l->stack[i] = stack > 0 ? stack : 0;
	l->ts[i] = ts;
	if (sampled && stack > 0)
		l->sampled |= 1u << i;
	else
		l->sampled &= ~(1u << i);
}

/* interp_lock_held's state (a per-CPU value: the stack has no room):
 * stretch j of the wait (hand-over j of the ledger, or the holder as the
 * wait began at LOCK_HANDOVERS) lasted span[j] ns. */
struct lock_scratch {
	u64 span[LOCK_HANDOVERS + 1];
	u64 t0, now, first, most;
	s64 stack0, stack;
	u32 holder0, best;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct lock_scratch);
} lock_scratches SEC(".maps");

struct lock_tally {
	struct lock_ledger *l;
	struct lock_scratch *sc;
};

static __always_inline u32 tally_tid(struct lock_tally *c, u32 j)
{
	return j < LOCK_HANDOVERS ? c->l->tid[j & (LOCK_HANDOVERS - 1)] : c->sc->holder0;
}

/* Hand-over j: from it to the next one written, within the wait. */
static long lock_span(u64 j, struct lock_tally *c)
{
	if (j >= LOCK_HANDOVERS)
		return 1;
	struct lock_scratch *sc = c->sc;
	u32 head = c->l->head, next = (j + 1) & (LOCK_HANDOVERS - 1);
	u64 from = c->l->ts[j & (LOCK_HANDOVERS - 1)], to = sc->now;
	if (next != (head & (LOCK_HANDOVERS - 1)) && c->l->ts[next] < to)
		to = c->l->ts[next];
	sc->span[j] = 0;
	if (from <= sc->t0) {
		/* The stretch the wait began in, when its holder is the one the
		 * waiter saw: from the wait's start, with the ledger's stack (read
		 * or sampled later within the stretch than the waiter's read). */
		if (to <= sc->t0 || c->l->tid[j & (LOCK_HANDOVERS - 1)] != sc->holder0)
			return 0;
		from = sc->t0;
	}
	if (to <= from)
		return 0;
	sc->span[j] = to - from;
	if (from < sc->first)
		sc->first = from;
	return 0;
}

/* Stretch j's holder: its time over all its stretches. */
static long lock_sum(u64 j, struct lock_tally *c)
{
	if (j > LOCK_HANDOVERS)
		return 1;
	u32 who = tally_tid(c, j);
	if (!who || !c->sc->span[j])
		return 0;
	u64 sum = 0, longest = 0;
	s64 st = 0;
#pragma unroll
	for (int k = 0; k <= LOCK_HANDOVERS; k++) {
		u64 span = c->sc->span[k];
		if (!span || tally_tid(c, k) != who)
			continue;
		sum += span;
		/* Its stack in its longest stretch read (another stretch may be
		 * another request's). */
		s64 ks = k < LOCK_HANDOVERS ? c->l->stack[k & (LOCK_HANDOVERS - 1)] : c->sc->stack0;
		if (ks > 0 && span > longest) {
			longest = span;
			st = ks;
		}
	}
	if (sum > c->sc->most) {
		c->sc->most = sum;
		c->sc->best = who;
		c->sc->stack = st;
	}
	return 0;
}

/* At the switch-in ending a wait for an interpreter lock (from t0 to now;
 * holder and holder_stack: the holder as it began): the holder becomes
 * the thread that held the lock longest within the wait by the ledger.
 * id: tgid << 32 | tid, and LOCK_TAKES when the waiter takes the lock now
 * (noted as its next holder). Global: verified once, not at each path
 * that reaches it (the classic switch program's count fell by a third). */
__noinline int interp_lock_held(u64 id, u64 t0, u32 *holder, s64 *holder_stack, u64 now)
{
	u32 key = id >> 32;
	if (!holder || !holder_stack)
		return 0;
	struct lock_tally c = { .l = bpf_map_lookup_elem(&lock_ledgers, &key) };
	key = 0;
	c.sc = bpf_map_lookup_elem(&lock_scratches, &key);
	if (c.l && c.sc) {
		struct lock_scratch *sc = c.sc;
		struct lock_ledger *l = c.l;
		sc->t0 = t0;
		sc->now = now;
		sc->first = now;
		sc->most = 0;
		sc->best = 0;
		sc->stack = 0;
		sc->holder0 = *holder;
		sc->stack0 = *holder_stack;
		bpf_loop(LOCK_HANDOVERS, lock_span, &c, 0);
		/* The holder as the wait began holds until the first hand-over
		 * kept: unknown when later ones wrote over those of the wait. */
		u64 oldest = l->ts[l->head & (LOCK_HANDOVERS - 1)];
		bool covered = l->head <= LOCK_HANDOVERS || oldest <= t0;
		sc->span[LOCK_HANDOVERS] = covered && sc->first > t0 ? sc->first - t0 : 0;
		bpf_loop(LOCK_HANDOVERS + 1, lock_sum, &c, 0);
		/* The same holder too: its stack may be read later than the
		 * waiter's own read, or sampled. */
		if (sc->best && (sc->best != *holder || sc->stack > 0)) {
			*holder = sc->best;
			*holder_stack = sc->stack;
		}
	}
	if (id & LOCK_TAKES)
		lock_handover(id >> 32, (u32)id & ~LOCK_TAKES, 0, now, false);
	return 0;
}

/* The runtimes' interpreter locks (CPython's GIL, CRuby's GVL): at a
 * switch-out, a wait for one and who held it. Not inlined: the switch
 * program's own stack, with the walker's, is near 6.1's limit. */
static __noinline void interp_lock_wait(struct task_struct *t, u32 tgid, u32 *lock, u32 *holder, s64 *holder_stack)
{
	union {
		struct py_holder_walk py;
		struct ruby_holder_walk rb;
	} w;
	if (!t || !lock || !holder || !holder_stack)
		return;
	py_gil_wait(t, tgid, lock, holder, holder_stack, &w.py);
	if (!*lock)
		ruby_gvl_wait(t, tgid, lock, holder, holder_stack, &w.rb);
	if (*lock && *holder)
		lock_handover(tgid, *holder, *holder_stack, bpf_ktime_get_ns(), false);
}

/* An on-CPU sample of thread tid of tgid, a process whose lock waits were
 * seen: when it holds the interpreter lock, its stack now stands for its
 * stretch in the ledger (noting the hand-over if no waiter saw it). Not
 * inlined: the sampling program's own walk is on its stack. */
static __noinline void interp_lock_sample(struct task_struct *t, u32 tgid, u32 tid)
{
	union {
		struct py_holder_walk py;
		struct ruby_holder_walk rb;
	} w;
	if (!t || !bpf_map_lookup_elem(&lock_ledgers, &tgid))
		return;
	s64 st = py_gil_owned(t, tgid, tid, &w.py);
	if (st <= 0)
		st = ruby_gvl_owned(t, tgid, &w.rb);
	if (st > 0)
		lock_handover(tgid, tid, st, bpf_ktime_get_ns(), true);
}

#ifdef __TARGET_ARCH_arm64
#define IS_ARM64 1
#else
#define IS_ARM64 0
#endif
/* arm64: sp's low bit set, a caller's sp guessed from its frame record;
 * sp-based rows are not followed from it. */
#define SP_GUESS 1ULL

/* A return address without what arm64's pointer authentication signs
 * into its top bits (user addresses are below 1 << 48). */
static __always_inline u64 strip_ra(u64 ra)
{
	return IS_ARM64 ? ra & ((1ULL << 48) - 1) : ra;
}

#ifdef __TARGET_ARCH_arm64
/* An arm64 row's step to the caller: its return address and x29 from
 * the CFA (still in x30, the innermost frame only; saved alone; or in a
 * frame record, x29 below it), read through the frame buffer (the walk's
 * stack is at 6.1's limit). 1: no caller found. */
static __always_inline long unwind_arm64(struct unwind_ctx *c, struct unwind_row *r, u64 cfa, bool remote)
{
	struct unwind_state *u = c->u;
	u64 *w = (u64 *)c->fr;
	u8 flags = r->kind;
	if (flags & UNWIND_RA_LR) {
		/* A frame not yet set up: no progress in sp, but in pc. Its
		 * x30 is read here, not at the walk's start: there the switch
		 * program's walk would pass 6.1's 512 bytes of stack. */
		struct task_struct *t = c->task ? c->task : bpf_get_current_task_btf();
		struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
		if (cfa < u->sp || !regs || bpf_core_read(w, sizeof(u64), &regs->REG_LR) || !w[0])
			return 1;
		w[1] = u->bp;
	} else {
		if (cfa <= u->sp)
			return 1; /* no progress: corrupt stack or wrong row */
		s64 fp = r->rbp_off;
		if (flags & UNWIND_RA_NO_FP) {
			if (read_user(w, sizeof(u64), cfa + 8 * fp, c->task, remote))
				return 1;
			w[1] = u->bp;
		} else if (read_user(w, 2 * sizeof(u64), cfa + 8 * fp, c->task, remote)) {
			return 1;
		} else {
			u64 saved = w[0]; /* the frame record: x29, then x30 */
			w[0] = w[1];
			w[1] = saved;
		}
	}
	u->dwarf++;
	u->callers++;
	u->pc = strip_ra(w[0]);
	u->sp = cfa;
	u->bp = w[1];
	return 0;
}

#endif

/* One frame: records pc, then finds the caller's pc, sp and bp, by the
 * unwind row when the code has one, else by the frame pointer. */
static __always_inline long unwind_frame(struct unwind_ctx *c, bool remote)
{
	struct unwind_state *u = c->u;
	u64 pc = u->pc, sp = u->sp, bp = u->bp;
	u32 n = u->n;
	if (!pc || n >= PERF_MAX_STACK_DEPTH)
		return 1;
	/* A return address points after the call: look up the call itself. */
	struct unwind_row *r = find_row(c->proc, u, u->callers ? pc - 1 : pc);
	u8 kind = r ? r->kind : UNWIND_NONE;
	if ((kind & UNWIND_INTERP_LOOP) && u->interp_frame && !u->interp_skip)
		return interp_frame(c, n, remote);
	s64 cfa_off = r ? r->cfa_off : 0;
	if (kind & UNWIND_CFA_X8)
		cfa_off *= 8;
	kind &= UNWIND_KIND_MASK;
	if (u->interp_skip) {
		u->interp_skip = 0;
	} else {
		c->buf->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = pc;
		u->n = n + 1;
	}
	u64 cfa = 0;
	switch (kind) {
	case UNWIND_JAVA_COMPILED: {
		struct java_method_key k = { .tgid = c->u->tgid, .kind = 1, .method = pc };
		u8 one = 1;
		bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		cfa = sp + cfa_off;
		break;
	}
	case UNWIND_RSP:
		/* arm64: sp from a frame record is not this frame's; and only
		 * the innermost frame has its return address in x30. */
		if (IS_ARM64 && ((sp & SP_GUESS) || ((r->kind & UNWIND_RA_LR) && u->callers)))
			goto frame_pointer;
		cfa = sp + cfa_off;
		break;
	case UNWIND_RBP:
		if (IS_ARM64 && (r->kind & UNWIND_RA_LR) && u->callers)
			goto frame_pointer;
		cfa = bp + cfa_off;
		break;
	case UNWIND_PLT:
		cfa = sp + 8 + ((pc & 15) >= (u64)r->rbp_off ? 8 : 0);
		break;
	case UNWIND_END:
		u->end = 1;
		return 1;
	case UNWIND_JAVA_GAP: {
		struct java_method_key k = { .tgid = c->u->tgid, .kind = 2, .method = pc };
		u8 one = 1;
		bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		goto frame_pointer;
	}
	case UNWIND_JAVA_INTERP: {
		/* rbp - 64 .. rbp + 8: bcp, locals, cache, mdp, mirror, method,
		 * last sp, sender sp, rbp, ra */
		u64 *fr = (u64 *)c->fr;
		if (!bp || bp < sp || read_user(fr, 10 * sizeof(u64), bp - 64, c->task, remote)) {
			__builtin_memset(fr, 0, 10 * sizeof(u64));
			if (!bp || bp < sp || read_user(&fr[5], 5 * sizeof(u64), bp - 24, c->task, remote))
				return 1;
		}
		u64 method = fr[5];
		if (method && method <= JAVA_METHOD_MASK && !(method & 7)) {
			u64 bci = java_bci(c, method, fr[0], remote);
			c->buf->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = JAVA_METHOD_TAG | ((bci >> 3) << 47) | method | (bci & 7);
			struct java_method_key k = { .tgid = c->u->tgid, .method = method };
			u8 one = 1;
			bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		}
		u->dwarf++;
		u->callers++;
		u->pc = fr[9];
		u->sp = fr[7] >= bp + 16 ? fr[7] : bp + 16;
		u->bp = fr[8];
		return 0;
	}
	default:
	frame_pointer: {
		/* Frame pointer: [bp] is the caller's bp, [bp + 8] the return address. */
		u64 *frame = (u64 *)c->fr;
		if (!bp || bp + FP_BELOW_SP < sp)
			return 1;
		struct v8_proc *vp = u->v8 ? &u->v8p : 0;
		if (vp && !read_user(frame, V8_FRAME_WORDS * sizeof(u64), bp - (V8_FRAME_WORDS - 2) * 8, c->task, remote)) {
			/* A JavaScript frame is named in place of its pc. */
			u64 e = v8_frame(vp, u->tgid, pc, frame, c->task, remote);
			if (e && u->n == n + 1)
				c->buf->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = e;
			frame += V8_FRAME_WORDS - 2;
		} else if (read_user(frame, 2 * sizeof(u64), bp, c->task, remote)) {
			return 1;
		}
		u->callers++;
		u->pc = strip_ra(frame[1]);
		/* arm64: a frame record says where a frame is, not its size:
		 * the caller's sp is a guess, marked (sp is 16-byte aligned). */
		u->sp = (bp + 16) | (IS_ARM64 ? SP_GUESS : 0);
		u->bp = frame[0];
		return 0;
	}
	}
#ifdef __TARGET_ARCH_arm64
	return unwind_arm64(c, r, cfa, remote);
#else
	if (cfa <= sp)
		return 1; /* no progress: corrupt stack or wrong row */
	u64 ra;
	if (read_user(&ra, sizeof(ra), cfa - 8, c->task, remote))
		return 1;
	if (kind != UNWIND_PLT && r->rbp_off &&
	    read_user(&bp, sizeof(bp), cfa + 8 * (s64)r->rbp_off, c->task, remote))
		return 1;
	u->dwarf++;
	u->callers++;
	u->pc = ra;
	u->sp = cfa;
	u->bp = bp;
	return 0;
#endif
}

/* bpf_loop callbacks: the remote one is used by the sleepable iterator
 * only, since its helper is refused elsewhere. */
static long unwind_step(u64 i, struct unwind_ctx *c)
{
	return unwind_frame(c, false);
}

static long unwind_step_remote(u64 i, struct unwind_ctx *c)
{
	return unwind_frame(c, true);
}

/* Walks a user stack from regs into the scratch entries of slot (0: the
 * tracepoint and perf-event programs; 1: the sleepable iterator, which
 * may sleep mid-walk while those run on its CPU) and stores it. p: the
 * process's tables, or 0 to walk by frame pointers; task: the task whose
 * memory is read (remote) or 0 for the current one. */
static __always_inline s64 walk_user(u32 slot, struct unwind_proc *p, struct task_struct *task,
				     struct pt_regs *regs, bool remote, u32 lost)
{
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &slot);
	struct unwind_state *u = bpf_map_lookup_elem(&unwind_scratch, &slot);
	struct frame_buf *fb = bpf_map_lookup_elem(&frame_scratch, &slot);
	if (!b || !u || !fb)
		return -1;
	if (!regs)
		return -ENODATA;
	u->pc = BPF_CORE_READ(regs, REG_PC);
	u->sp = BPF_CORE_READ(regs, REG_SP);
	u->bp = BPF_CORE_READ(regs, REG_FP);
	u->n = 0;
	u->dwarf = 0;
	u->end = 0;
	u->callers = 0;
	u->interp_frame = 0;
	u->interp_end = 0;
	u->interp_emitted = 0;
	u->interp_skip = 0;
	u->interp_py = 0;
	u->interp_rb = 0;
	u->tgid = task ? BPF_CORE_READ(task, tgid) : bpf_get_current_pid_tgid() >> 32;
	struct unwind_ctx c = { .u = u, .proc = p, .buf = b, .task = task, .fr = fb->b };
	u->v8 = 0;
	if (p && v8_active) {
		struct v8_proc *vp = bpf_map_lookup_elem(&v8_procs, &u->tgid);
		if (vp) {
			u->v8p = *vp;
			u->v8 = 1;
		}
	}
	if (p && py_active) {
		/* The thread's Python frames: its thread state is found by its
		 * thread pointer (another task's, from the sleepable iterator,
		 * is read from its memory). */
		struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &u->tgid);
		if (pp && remote)
			u->interp_frame = py_frame_at(pp, py_tstate(pp, task, BPF_CORE_READ(task, pid), true), task, true);
		else if (pp)
			u->interp_frame = py_frame_of(pp, py_tstate(pp, bpf_get_current_task_btf(), (u32)bpf_get_current_pid_tgid(), false));
		u->interp_py = pp != 0;
	}
	if (p && ruby_active && !u->interp_py) {
		/* The thread's Ruby frames, from its execution context. */
		struct ruby_proc *rp = bpf_map_lookup_elem(&ruby_procs, &u->tgid);
		if (rp && remote)
			u->interp_frame = ruby_cfp(rp, ruby_ec(rp, task, true, c.fr), &u->interp_end, task, true, c.fr);
		else if (rp)
			u->interp_frame = ruby_walk_start(rp, &u->interp_end, bpf_get_current_task_btf(), c.fr);
		u->interp_rb = rp != 0;
	}
	if (remote)
		bpf_loop(PERF_MAX_STACK_DEPTH, unwind_step_remote, &c, 0);
	else
		bpf_loop(PERF_MAX_STACK_DEPTH, unwind_step, &c, 0);
	u32 n = u->n;
	if (n == 0)
		return -ENODATA;
	if (n < PERF_MAX_STACK_DEPTH)
		b->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = 0;
	if (p) {
		stat_add(STAT_DWARF_STACKS, 1);
		stat_add(STAT_DWARF_FRAMES, u->dwarf);
		if (u->end)
			stat_add(STAT_DWARF_END, 1);
		if (n >= PERF_MAX_STACK_DEPTH)
			stat_add(STAT_DWARF_DEPTH, 1);
	}
	return store_stack(b, lost);
}

/* Where t is, for its stack cache: its user registers, syscall and first
 * argument (and the thread it wakes); false where not in a syscall or
 * its registers are not known. */
static __always_inline bool stack_where_of(struct task_struct *t, u32 tgid, u32 target, struct stack_where *at)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	if (!regs)
		return false;
	at->ip = regs->REG_PC;
	at->sp = regs->REG_SP;
	at->sysnr = regs->REG_SYSNR;
	at->arg0 = regs->REG_ARG0;
	at->target = target;
	at->gen = unwind_gen_of(tgid);
	/* A walk by frame pointers follows bp; one by tables restores each
	 * caller's bp from the stack, so a leaf that uses bp as scratch (the C
	 * library's condition variables keep a sequence number there) still
	 * sleeps at the same place. */
	at->bp = at->gen ? 0 : regs->REG_FP;
	/* An interpreter's thread sleeps at the same native place under any
	 * of its interpreted functions: its registers do not tell where. */
	if ((py_active && bpf_map_lookup_elem(&py_procs, &tgid)) || (ruby_active && bpf_map_lookup_elem(&ruby_procs, &tgid)))
		return false;
	return (s64)at->sysnr >= 0 && at->ip;
}

/* The current thread's user stack id. Processes with unwind tables are
 * walked here through .eh_frame rows (code built without frame pointers);
 * the others by the kernel's frame-pointer walker. */
#define NO_TABLES (-18) /* EXDEV */

/* The current thread's user stack walked by its process's unwind tables,
 * or NO_TABLES. A global function: the verifier checks it once, not at
 * each call in every program (inlined, it took most of the switch
 * program's budget on 6.18). */
__noinline s64 walk_current(u32 lost)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	if (!p || !p->n)
		return NO_TABLES;
	struct task_struct *task = bpf_get_current_task_btf();
	return walk_user(0, p, 0, (struct pt_regs *)bpf_task_pt_regs(task), false, lost);
}

static __always_inline s64 user_stack_id(void *ctx, u32 lost)
{
	struct task_struct *task = bpf_get_current_task_btf();
	s64 id = walk_current(lost);
	if (id == NO_TABLES) /* no mapping needs tables: the kernel's walker */
		id = get_stack_id(ctx, BPF_F_USER_STACK, lost);
	if (id != -ENODATA || !(task->flags & PF_EXITING))
		return id;
	/* An exiting process whose memory is gone (do_exit after exit_mm):
	 * no stack to read, but its registers still say where it called
	 * exit from. */
	u32 zero = 0;
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &zero);
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	if (!b || !regs)
		return id;
	b->ips[0] = BPF_CORE_READ(regs, REG_PC);
	b->ips[1] = 0;
	return b->ips[0] ? store_stack(b, lost) : id;
}

/* The user stack id of another task, blocked now (sleepable iterator):
 * by its tables when it has some, else by frame pointers. */
static __always_inline s64 task_user_stack_id(struct task_struct *task)
{
	u32 tgid = task->tgid;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	return walk_user(1, p && p->n ? p : 0, task, regs, true, STAT_USTACK_LOST);
}

#endif
