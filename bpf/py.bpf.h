/* CPython: the thread state of a Python thread, its Python frames (the
 * walker records them in place of the interpreter loop's activation that
 * runs them, unwind.bpf.h) and GIL waits with the thread that held the
 * GIL. The layouts are CPython's own for each version (collector/python.go
 * fills py_procs); frames are read as the OpenTelemetry eBPF profiler's
 * Python unwinder reads them. */
#ifndef OFFCPU_PY_H
#define OFFCPU_PY_H

#include "common.bpf.h"
#include "stacks.bpf.h"

#define PY_MAX_THREADS 64   /* thread states searched for a thread's */
#define PY_HOLDER_FRAMES 32 /* Python frames kept of a GIL holder's stack */
#define PY_FRAME_READ 112   /* bytes read of a frame: every offset used is below */
/* A frame read's buffer (Python and Java), in a per-CPU map rather than on
 * the BPF stack (512 bytes across a call chain on kernels without private
 * stacks). Offsets into it are masked by FRAME_MASK, and an 8-byte read at
 * the largest stays inside: some verifiers (6.1) lose a checked offset's
 * bounds. */
#define FRAME_MASK 127
#define FRAME_BUF (FRAME_MASK + 1 + 8)

struct frame_buf {
	u8 b[FRAME_BUF];
};

/* Entry 0 for the tracepoint and perf-event programs, 1 for the sleepable
 * iterator, as stack_scratch. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct frame_buf);
} frame_scratch SEC(".maps");

/* Set by user space while py_procs holds a process: nothing is looked up
 * for Python before (a switch's cost is unchanged without Python). */
volatile u32 py_active = 0;

/* Key: tgid. Value: py_proc, written by user space for each CPython
 * process. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct py_proc);
} py_procs SEC(".maps");

/* A thread's PyThreadState, found once by a search of its interpreter's
 * thread states, checked at each use. */
struct py_thread {
	u64 tstate;
	u32 tgid;
	u32 pad;
};

/* Key: tid. Value: py_thread. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, struct py_thread);
} py_tstates SEC(".maps");

/* Code objects seen in stacks, named by user space while their process
 * lives (it deletes what it named). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct py_code_key);
	__type(value, u8);
} py_codes SEC(".maps");

static __always_inline u64 py_read_u64_of(u64 addr, struct task_struct *task, bool remote)
{
	u64 v = 0;
	if (read_user(&v, sizeof(v), addr, task, remote))
		return 0;
	return v;
}

static __always_inline u64 py_read_u64(u64 addr)
{
	return py_read_u64_of(addr, 0, false);
}

struct py_search {
	struct py_proc *pp;
	struct task_struct *task; /* remote: whose memory is read */
	u64 self, ts, found;
};

static __always_inline long py_search_at(struct py_search *s, bool remote)
{
	if (!s->ts)
		return 1;
	if (py_read_u64_of(s->ts + s->pp->tstate_thread_id, s->task, remote) == s->self) {
		s->found = s->ts;
		return 1;
	}
	s->ts = py_read_u64_of(s->ts + s->pp->tstate_next, s->task, remote);
	return 0;
}

/* bpf_loop callbacks: the remote one for the sleepable iterator only. */
static long py_search_step(u64 i, struct py_search *s)
{
	return py_search_at(s, false);
}

static long py_search_step_remote(u64 i, struct py_search *s)
{
	return py_search_at(s, true);
}

/* A thread's PyThreadState: the one whose thread_id is its pthread_self
 * (the thread pointer, fsbase on x86-64, saved in the task when it is
 * off a CPU). remote: t is not the current task (sleepable programs). */
static __always_inline u64 py_tstate(struct py_proc *pp, struct task_struct *t, u32 tid, bool remote)
{
	u64 self = BPF_CORE_READ(t, TASK_TP);
	if (!self)
		return 0;
	struct py_thread *cached = bpf_map_lookup_elem(&py_tstates, &tid);
	if (cached && cached->tstate && py_read_u64_of(cached->tstate + pp->tstate_thread_id, t, remote) == self)
		return cached->tstate;
	u64 interp = py_read_u64_of(pp->interp_head, t, remote);
	if (!interp)
		return 0;
	struct py_search s = { .pp = pp, .task = t, .self = self,
			       .ts = py_read_u64_of(interp + pp->threads_head, t, remote) };
	if (remote)
		bpf_loop(PY_MAX_THREADS, py_search_step_remote, &s, 0);
	else
		bpf_loop(PY_MAX_THREADS, py_search_step, &s, 0);
	if (s.found) {
		struct py_thread th = { .tstate = s.found, .tgid = BPF_CORE_READ(t, tgid) };
		bpf_map_update_elem(&py_tstates, &tid, &th, BPF_ANY);
	}
	return s.found;
}

/* A thread state's current frame (0: none, or not running Python). */
static __always_inline u64 py_frame_at(struct py_proc *pp, u64 tstate, struct task_struct *task, bool remote)
{
	if (!tstate)
		return 0;
	u64 f = py_read_u64_of(tstate + pp->tstate_frame, task, remote);
	if (f && (pp->flags & PY_CFRAME))
		f = py_read_u64_of(f + pp->cframe_frame, task, remote);
	return f;
}

static __always_inline u64 py_frame_of(struct py_proc *pp, u64 tstate)
{
	return py_frame_at(pp, tstate, 0, false);
}

/* fr: a frame_buf's bytes. */
static __always_inline bool py_read_frame_of(struct py_proc *pp, u64 frame, struct interp_step *st,
					     struct task_struct *task, bool remote, u8 *fr)
{
	if (read_user(fr, PY_FRAME_READ, frame, task, remote))
		return false;
	u32 oc = pp->frame_code, ob = pp->frame_back, oi = pp->frame_instr, oe = pp->frame_entry;
	if (oc > PY_FRAME_READ - 8 || ob > PY_FRAME_READ - 8 || oi > PY_FRAME_READ - 8 || oe > PY_FRAME_READ - 1)
		return false;
	u64 code = *(u64 *)&fr[oc & FRAME_MASK];
	u64 instr = *(u64 *)&fr[oi & FRAME_MASK];
	bool entry = fr[oe & FRAME_MASK] == pp->entry_val;
	st->back = *(u64 *)&fr[ob & FRAME_MASK];
	st->last = (pp->flags & PY_ONE_PER_EVAL) || entry || !st->back;
	st->entry = 0;
	if (!code || code > JAVA_METHOD_MASK || (entry && (pp->flags & PY_ENTRY_SHIM)))
		return true;
	u64 idx = PY_INSTR_NONE;
	if (pp->flags & PY_INSTR_PTR) {
		u64 first = code + pp->code_first_instr;
		if (instr >= first && (instr - first) / 2 < PY_INSTR_NONE)
			idx = (instr - first) / 2;
	} else if ((u32)instr < PY_INSTR_NONE) {
		idx = (u32)instr;
	}
	st->entry = PY_FRAME_TAG | (idx << 47) | code;
	return true;
}

/* Notes a code object for user space to name. */
static __always_inline void py_seen(u32 tgid, u64 entry)
{
	struct py_code_key k = { .tgid = tgid, .code = entry & JAVA_METHOD_MASK };
	u8 one = 1;
	bpf_map_update_elem(&py_codes, &k, &one, BPF_NOEXIST);
}

struct py_holder_walk {
	struct py_proc *pp;
	struct stack_buf *b;
	u8 *fr;
	u64 f;
	u32 n, tgid;
};

static long py_holder_step(u64 i, struct py_holder_walk *w)
{
	struct interp_step st;
	if (!w->f || !py_read_frame_of(w->pp, w->f, &st, 0, false, w->fr))
		return 1;
	if (st.entry) {
		w->b->ips[w->n & (PY_HOLDER_FRAMES - 1)] = st.entry;
		py_seen(w->tgid, st.entry);
		w->n++;
	}
	w->f = st.back;
	return w->n >= PY_HOLDER_FRAMES;
}

/* The thread of a thread state of process tgid, among those found so far
 * (versions whose thread state has no native thread id). */
struct py_owner {
	u64 tstate;
	u32 tgid, tid;
};

struct bpf_map;

static long py_owner_step(struct bpf_map *map, u32 *tid, struct py_thread *th, struct py_owner *o)
{
	if (th->tstate == o->tstate && th->tgid == o->tgid) {
		o->tid = *tid;
		return 1;
	}
	return 0;
}

/* The Python stack of thread state ts of process tgid, stored: its id, 0
 * if none was read. */
static __always_inline s64 py_tstate_stack(struct py_proc *pp, u64 ts, u32 tgid, struct py_holder_walk *w)
{
	u32 slot = 0;
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &slot);
	struct frame_buf *fb = bpf_map_lookup_elem(&frame_scratch, &slot);
	if (!b || !fb)
		return 0;
	*w = (struct py_holder_walk){ .pp = pp, .b = b, .fr = fb->b, .f = py_frame_of(pp, ts), .tgid = tgid };
	bpf_loop(PY_HOLDER_FRAMES, py_holder_step, w, 0);
	return store_frames(b, w->n);
}

/* At a switch-out: a futex wait inside the GIL's struct is a GIL wait;
 * the GIL's last holder is named, with its Python stack (another thread
 * of the same process: its frames are read through this one's memory). */
static __always_inline void py_gil_wait(struct task_struct *t, u32 tgid, u32 *gil, u32 *holder, s64 *holder_stack,
					struct py_holder_walk *w)
{
	*gil = 0;
	*holder = 0;
	*holder_stack = 0;
	if (!py_active)
		return;
	struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!pp || !pp->gil)
		return;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	if (!regs || regs->REG_SYSNR != SYS_FUTEX || regs->REG_ARG0 < pp->gil || regs->REG_ARG0 >= pp->gil + pp->gil_size)
		return;
	*gil = LOCK_QUEUED;
	u64 hts = py_read_u64(pp->gil + pp->gil_holder);
	if (!hts)
		return;
	u64 tid;
	if (pp->tstate_native_id) {
		tid = py_read_u64(hts + pp->tstate_native_id);
	} else {
		struct py_owner o = { .tstate = hts, .tgid = tgid };
		bpf_for_each_map_elem(&py_tstates, py_owner_step, &o, 0);
		tid = o.tid;
	}
	if (tid == t->pid)
		return; /* its own state: the GIL was released to it already */
	*holder = (u32)tid;
	s64 st = py_tstate_stack(pp, hts, tgid, w);
	if (st)
		*holder_stack = st;
}

/* On a sample of t on a CPU: its Python stack (stored: the id) when it
 * holds its process's GIL, else 0. The GIL is held while its locked flag,
 * the int after last_holder (_gil_runtime_state in CPython 3.8-3.13), is
 * set. */
static __always_inline s64 py_gil_owned(struct task_struct *t, u32 tgid, u32 tid, struct py_holder_walk *w)
{
	if (!py_active)
		return 0;
	struct py_proc *pp = bpf_map_lookup_elem(&py_procs, &tgid);
	if (!pp || !pp->gil)
		return 0;
	u64 hts = py_read_u64(pp->gil + pp->gil_holder);
	u32 locked = 0;
	if (!hts || read_user(&locked, sizeof(locked), pp->gil + pp->gil_holder + 8, 0, false) || !locked)
		return 0;
	if (py_tstate(pp, t, tid, false) != hts)
		return 0;
	return py_tstate_stack(pp, hts, tgid, w);
}

#endif /* OFFCPU_PY_H */
