/* CRuby: a Ruby thread's frames (the walker records them in place of the
 * VM's activation that runs them, unwind.bpf.h) and GVL waits with the
 * thread that held the GVL and its Ruby stack. The layouts are CRuby's own
 * for each version (runtimes/ruby fills ruby_procs); frames are walked as
 * rb_profile_frames walks them (vm_backtrace.c). */
#ifndef OFFCPU_RUBY_H
#define OFFCPU_RUBY_H

#include "common.bpf.h"
#include "stacks.bpf.h"
#include "py.bpf.h" /* frame_scratch */
#include "ruby_shared.h"

#define RUBY_HOLDER_FRAMES 32 /* Ruby frames kept of a GVL holder's stack */

/* Set by user space while ruby_procs holds a process. */
volatile u32 ruby_active = 0;

/* Key: tgid. Value: ruby_proc. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct ruby_proc);
} ruby_procs SEC(".maps");

/* Frames seen in stacks, named by user space while their process lives
 * (it deletes what it named). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ruby_frame_key);
	__type(value, u8);
} ruby_frames SEC(".maps");

const struct ruby_frame_key *unused_ruby_frame_key __attribute__((unused));

/* Reads a word into fr's last 8 bytes (a frame_buf's: not the BPF stack,
 * which the walker and the switch program use near their limits). */
static __always_inline u64 ruby_u64(u64 addr, struct task_struct *task, bool remote, u8 *fr)
{
	u64 *v = (u64 *)&fr[FRAME_MASK + 1];
	if (!addr || read_user(v, sizeof(*v), addr, task, remote))
		return 0;
	return *v;
}

/* A thread's execution context: ruby_current_ec, through its DTV (the
 * module's id is in libruby's GOT once the loader has run). */
static __always_inline u64 ruby_ec(struct ruby_proc *rp, struct task_struct *t, bool remote, u8 *fr)
{
	u64 tp = BPF_CORE_READ(t, TASK_TP);
	if (!tp)
		return 0;
	u64 mod = ruby_u64(rp->tls_got, t, remote, fr);
	u64 dtv = ruby_u64(tp + 8, t, remote, fr);
	if (!mod || !dtv || mod > 4096)
		return 0;
	u64 blk = ruby_u64(dtv + mod * 16, t, remote, fr);
	if (!blk || blk == ~0ULL)
		return 0;
	return ruby_u64(blk + rp->tls_offset, t, remote, fr);
}

/* The first control frame of ec and where the frames end. */
static __always_inline u64 ruby_cfp(struct ruby_proc *rp, u64 ec, u64 *end, struct task_struct *t, bool remote, u8 *fr)
{
	if (!ec)
		return 0;
	u64 stack = ruby_u64(ec + rp->ec_vm_stack, t, remote, fr);
	u64 size = ruby_u64(ec + rp->ec_vm_stack_size, t, remote, fr);
	if (!stack || !size || size > (1 << 24))
		return 0;
	/* The last two frames are the VM's dummy ones (rb_profile_frames). */
	*end = stack + size * 8 - rp->cfp_size;
	return ruby_u64(ec + rp->ec_cfp, t, remote, fr);
}

/* Where the walker starts the current thread's Ruby frames: its
 * execution context's current frame, and (in *end) where they end. Not
 * inlined: the walk's own stack is near its limit on 6.1. */
static __noinline u64 ruby_walk_start(struct ruby_proc *rp, u64 *end, struct task_struct *t, u8 *fr)
{
	if (!rp || !end || !t || !fr)
		return 0;
	return ruby_cfp(rp, ruby_ec(rp, t, false, fr), end, t, false, fr);
}

/* Notes a frame for user space to name. */
static __always_inline void ruby_seen(u32 tgid, u64 entry)
{
	struct ruby_frame_key k = { .tgid = tgid, .entry = entry & (RUBY_CFUNC_BIT | RUBY_PTR_MASK) };
	u8 one = 1;
	bpf_map_update_elem(&ruby_frames, &k, &one, BPF_NOEXIST);
}

/* One control frame: its entry (0: not shown, as the VM's own frames),
 * the caller's frame, and whether it is its VM activation's first. fr: a
 * frame_buf's bytes, where the frame is read (not the BPF stack: the
 * walker's callback is near its limit). */
static __always_inline bool ruby_read_frame(struct ruby_proc *rp, u64 cfp, u64 end, struct interp_step *st,
					    struct task_struct *t, bool remote, u8 *fr)
{
	if (!cfp || cfp >= end || read_user(fr, 64, cfp, t, remote))
		return false;
	u32 opc = rp->cfp_pc, ois = rp->cfp_iseq, oep = rp->cfp_ep;
	if (opc > 56 || ois > 56 || oep > 56)
		return false;
	u64 pc = *(u64 *)&fr[opc & 63];
	u64 iseq = *(u64 *)&fr[ois & 63];
	u64 ep = *(u64 *)&fr[oep & 63];
	/* ep[-2]: a C method's entry; ep[0]: the frame's flags. */
	if (!ep || read_user(&fr[64], 24, ep - 16, t, remote))
		return false;
	u64 me = *(u64 *)&fr[64], flags = *(u64 *)&fr[80];
	st->back = cfp + rp->cfp_size;
	st->last = (flags & RUBY_FLAG_FINISH) || st->back >= end;
	st->entry = 0;
	if ((flags & RUBY_MAGIC_MASK) == RUBY_MAGIC_CFUNC) {
		if (me && me <= RUBY_PTR_MASK)
			st->entry = RUBY_FRAME_TAG | RUBY_CFUNC_BIT | (RUBY_POS_NONE << 47) | me;
		return true;
	}
	if (!iseq || !pc || iseq > RUBY_PTR_MASK)
		return true;
	u64 pos = RUBY_POS_NONE;
	if (!read_user(&fr[88], 8, iseq + rp->iseq_body, t, remote) &&
	    !read_user(&fr[96], 8, *(u64 *)&fr[88] + rp->body_encoded, t, remote)) {
		u64 first = *(u64 *)&fr[96];
		if (first && pc >= first && (pc - first) / 8 < RUBY_POS_NONE)
			pos = (pc - first) / 8;
	}
	st->entry = RUBY_FRAME_TAG | (pos << 47) | iseq;
	return true;
}

struct ruby_holder_walk {
	struct ruby_proc *rp;
	struct stack_buf *b;
	u8 *fr;
	u64 cfp, end;
	u32 n, tgid;
};

static long ruby_holder_step(u64 i, struct ruby_holder_walk *w)
{
	struct interp_step st;
	if (!ruby_read_frame(w->rp, w->cfp, w->end, &st, 0, false, w->fr))
		return 1;
	if (st.entry) {
		w->b->ips[w->n & (RUBY_HOLDER_FRAMES - 1)] = st.entry;
		ruby_seen(w->tgid, st.entry);
		w->n++;
	}
	w->cfp = st.back;
	return w->n >= RUBY_HOLDER_FRAMES;
}

/* The Ruby stack of owner (an rb_thread_t of process tgid), stored: its
 * id, 0 if none was read. */
static __always_inline s64 ruby_owner_stack(struct ruby_proc *rp, u64 owner, u32 tgid, u8 *fr,
					    struct ruby_holder_walk *w)
{
	u32 slot = 0;
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &slot);
	if (!b)
		return 0;
	w->rp = rp;
	w->fr = fr;
	w->b = b;
	w->tgid = tgid;
	w->n = 0;
	w->cfp = ruby_cfp(rp, ruby_u64(owner + rp->th_ec, 0, false, fr), &w->end, 0, false, fr);
	bpf_loop(RUBY_HOLDER_FRAMES, ruby_holder_step, w, 0);
	return store_frames(b, w->n);
}

/* At a switch-out: a thread waiting for the GVL (a futex wait on its own
 * condition variable while queued for the GVL, or on the GVL's mutex) has
 * the GVL's holder named, with its Ruby stack (read through this thread's
 * memory: the same process). w: the walk's state, on the caller's stack
 * (shared with CPython's). */
static __always_inline bool ruby_gvl_wait(struct task_struct *t, u32 tgid, u32 *gvl, u32 *holder, s64 *holder_stack,
					  struct ruby_holder_walk *w)
{
	if (!ruby_active)
		return false;
	struct ruby_proc *rp = bpf_map_lookup_elem(&ruby_procs, &tgid);
	if (!rp)
		return false;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(t);
	if (!regs || regs->REG_SYSNR != SYS_FUTEX)
		return false;
	u32 slot = 0;
	struct frame_buf *fb = bpf_map_lookup_elem(&frame_scratch, &slot);
	if (!fb)
		return false;
	u8 *fr = fb->b;
	u64 ec = ruby_ec(rp, t, false, fr);
	u64 th = ruby_u64(ec + rp->ec_thread, 0, false, fr);
	u64 ractor = ruby_u64(th + rp->th_ractor, 0, false, fr);
	if (!th || !ractor)
		return false;
	u64 g = ractor + rp->ractor_gvl, uaddr = regs->REG_ARG0;
	u64 node = th + rp->th_gvl_node, cond = th + rp->th_gvl_cond;
	bool queued = uaddr >= cond && uaddr < cond + 48 && ruby_u64(node, 0, false, fr) != node;
	/* A thread yielding the GVL at its timeslice's end waits until
	 * another takes it (gvl_yield), then queues for it. */
	u64 yield = g + rp->gvl_switch;
	if (!queued && uaddr != g + rp->gvl_lock && (uaddr < yield || uaddr >= yield + 96))
		return false;
	/* The owner itself waits for the GVL's mutex when it yields. */
	u64 owner = ruby_u64(g, 0, false, fr);
	*gvl = queued ? LOCK_QUEUED : LOCK_OTHER;
	if (!owner || owner == th)
		return true;
	*holder = (u32)ruby_u64(owner + rp->th_tid, 0, false, fr); /* an int, then padding */
	s64 st = ruby_owner_stack(rp, owner, tgid, fr, w);
	if (st)
		*holder_stack = st;
	return true;
}

/* On a sample of t on a CPU: its Ruby stack (stored: the id) when it
 * owns its process's GVL, else 0. */
static __always_inline s64 ruby_gvl_owned(struct task_struct *t, u32 tgid, struct ruby_holder_walk *w)
{
	if (!ruby_active)
		return 0;
	struct ruby_proc *rp = bpf_map_lookup_elem(&ruby_procs, &tgid);
	u32 slot = 0;
	struct frame_buf *fb = bpf_map_lookup_elem(&frame_scratch, &slot);
	if (!rp || !fb)
		return 0;
	u8 *fr = fb->b;
	u64 ec = ruby_ec(rp, t, false, fr);
	u64 th = ec ? ruby_u64(ec + rp->ec_thread, 0, false, fr) : 0;
	u64 ractor = ruby_u64(th + rp->th_ractor, 0, false, fr);
	if (!th || !ractor || ruby_u64(ractor + rp->ractor_gvl, 0, false, fr) != th)
		return 0;
	return ruby_owner_stack(rp, th, tgid, fr, w);
}

#endif /* OFFCPU_RUBY_H */
