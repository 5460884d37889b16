/* Targets, threads and processes: who is recorded, thread names, process
 * events (fork, exec, exit) and the code mappings they make. */
#ifndef OFFCPU_PROCS_H
#define OFFCPU_PROCS_H

#include "common.bpf.h"
#include "unwind.bpf.h"

struct path_walk {
	struct map_event *ev;
	struct dentry *d;
	struct vfsmount *vm;
	struct mount *m;
	u32 n;
};

/* sys_enter_mmap / sys_exit_mmap records
 * (/sys/kernel/tracing/events/syscalls/sys_enter_mmap/format): the layout
 * of syscall tracepoints is fixed. */
struct mmap_enter_args {
	u64 common;
	s32 nr;
	u32 pad;
	u64 addr, len, prot, flags, fd, off;
};

struct mmap_exit_args {
	u64 common;
	s32 nr;
	u32 pad;
	s64 ret;
};

struct vma_copy {
	u64 start, end, pgoff;
	struct file *file;
};

/* Key: tid. Value: unused. Threads created during a recording, until their
 * first switch-in (classic tracepoint mode, which cannot read the task's
 * start time there): that switch-in is not a thread blocked since before the
 * start. Written by offcpu_fork_tp, deleted by offcpu_switch_tp. LRU: an
 * evicted entry only miscounts before_start. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 8192);
	__type(key, u32);
	__type(value, u8);
} newborn SEC(".maps");

/* Key: tid. Value: tgid and the thread's name when first seen (updated on
 * rename), so threads that exit before the end keep their name. Size:
 * --max-threads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct thread_info);
} threads SEC(".maps");

/* Key: tgid. Value: unused. Processes already announced to user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, u32);
	__type(value, u8);
} procs SEC(".maps");

/* proc_event per newly seen process, exec, fork and exit, and map_event per
 * code mapping. Sized for bursts of short-lived processes (each exec maps
 * three to six code files, 1 KiB each). */
#define PROC_EVENTS_SIZE (4 * 1024 * 1024)
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, PROC_EVENTS_SIZE);
} proc_events SEC(".maps");

/* A record sent without waking the reader wakes it when it takes the ring
 * past a quarter full (before: the bytes queued before it): the reader's
 * own timer (a second in continuous mode) lets a burst of process churn
 * overflow the ring when it is slow. */
static __always_inline u64 ring_wake(u64 flags, u64 before, u64 size)
{
	const u64 mark = PROC_EVENTS_SIZE / 4;
	if (flags == BPF_RB_NO_WAKEUP && before < mark && before + size + 8 >= mark)
		return BPF_RB_FORCE_WAKEUP;
	return flags;
}

/* Key: tgid / tid. Value: unused. The -p / --tid sets; with follow_forks,
 * children of a target tgid are added by sched_process_fork. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} target_tgids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} target_tids SEC(".maps");

/* Key: tid. Value: unused. Threads inside an executable mmap. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} exec_mmaps SEC(".maps");

static __always_inline bool is_target(u32 tgid, u32 tid)
{
	if (exclude_tgid && tgid == exclude_tgid)
		return false;
	if (!filter_tgid && !filter_tid)
		return true;
	if (filter_tgid && bpf_map_lookup_elem(&target_tgids, &tgid))
		return true;
	if (filter_tid && bpf_map_lookup_elem(&target_tids, &tid))
		return true;
	return false;
}

/* A task the target and thread-kind filters keep, other than the current
 * one (recorded() also checks the current task's cgroup). */
static __always_inline bool target_task(struct task_struct *t)
{
	return is_target(t->tgid, t->pid) && !((t->flags & PF_KTHREAD) ? user_threads_only : kernel_threads_only);
}

/* Filters that need the outgoing (current) task, but for the state. */
static __always_inline bool recorded(u32 tgid, u32 tid, bool kthread)
{
	if (tid == 0)
		return false; /* idle */
	if (user_threads_only && kthread)
		return false;
	if (kernel_threads_only && !kthread)
		return false;
	if (!is_target(tgid, tid))
		return false;
	if (filter_cgroup && bpf_get_current_cgroup_id() != filter_cgroup)
		return false;
	return true;
}

static __always_inline bool want_out(u32 tgid, u32 tid, u8 state, bool kthread)
{
	return (state_mask & (1u << state)) && recorded(tgid, tid, kthread);
}

/* A thread's incarnation: its creation time in µs (32 bits wrap after 71
 * minutes). With pid_max at 32768 a churning system reuses tids within
 * a recording; names and intervals are told apart by it. */
static __always_inline u32 task_gen(struct task_struct *t)
{
	return (u32)(t->start_time / 1000); /* a BTF pointer: a plain load */
}

/* Events are sent without waking the reader (a wake-up from a program
 * run with interrupts on costs tens of µs in a VM: an IPI); it reads what
 * is queued every 50 ms. Nothing waits for it: a process's unwind entry
 * is made here (install_unwind), and only a file mapped for the first
 * time waits for user space to load its rows. A new process to snapshot
 * from /proc (EV_SEEN, EV_REREAD) wakes it if it is idle. */
static __always_inline void proc_event(u32 kind, u32 tgid, u32 tid, u32 parent)
{
	struct proc_event ev = { .kind = kind, .tgid = tgid, .tid = tid, .parent = parent };
	u64 flags = ring_wake(kind == EV_SEEN || kind == EV_REREAD ? 0 : BPF_RB_NO_WAKEUP,
			      bpf_ringbuf_query(&proc_events, BPF_RB_AVAIL_DATA), sizeof(ev));
	if (bpf_ringbuf_output(&proc_events, &ev, sizeof(ev), flags))
		stat_add(STAT_EVENTS_LOST, 1);
}

/* Records the thread's name once, and announces a new process. */
static __always_inline void announce(u32 tgid, u32 tid)
{
	struct thread_info ti = { .tgid = tgid, .gen = task_gen(bpf_get_current_task_btf()) };
	bpf_get_current_comm(&ti.comm, sizeof(ti.comm));
	if (bpf_map_update_elem(&threads, &tid, &ti, BPF_NOEXIST) == -EEXIST)
		return;
	u8 one = 1;
	if (bpf_map_update_elem(&procs, &tgid, &one, BPF_NOEXIST) != 0)
		return;
	proc_event(EV_SEEN, tgid, tid, 0);
}

/* A thread's last switch-out: its name moves from the threads map to user
 * space, and its process's entries go when the leader dies, so that the
 * maps stay bounded however many processes come and go. */
static __always_inline void thread_exit(u32 tgid, u32 tid)
{
	struct thread_info *ti = bpf_map_lookup_elem(&threads, &tid);
	struct proc_event ev = { .kind = EV_THREAD_EXIT, .tgid = tgid, .tid = tid,
				 .gen = task_gen(bpf_get_current_task_btf()) };
	if (ti)
		__builtin_memcpy(ev.comm, ti->comm, sizeof(ev.comm));
	else
		bpf_get_current_comm(&ev.comm, sizeof(ev.comm));
	u64 flags = ring_wake(BPF_RB_NO_WAKEUP, bpf_ringbuf_query(&proc_events, BPF_RB_AVAIL_DATA), sizeof(ev));
	if (bpf_ringbuf_output(&proc_events, &ev, sizeof(ev), flags)) {
		stat_add(STAT_EVENTS_LOST, 1);
		return; /* the name stays in the map */
	}
	bpf_map_delete_elem(&threads, &tid);
	if (tid == tgid) {
		bpf_map_delete_elem(&procs, &tgid);
		bpf_map_delete_elem(&unwind_procs, &tgid);
		proc_event(EV_EXIT, tgid, tid, 0);
	}
}

static __always_inline void on_fork(u32 parent_tgid, u32 child_tgid)
{
	if (!follow_forks || !filter_tgid || parent_tgid == child_tgid)
		return;
	if (!bpf_map_lookup_elem(&target_tgids, &parent_tgid))
		return;
	u8 one = 1;
	bpf_map_update_elem(&target_tgids, &child_tgid, &one, BPF_ANY);
}

/* One step of the name walk, as d_path builds a name: a dentry up to the
 * mount's root, then the mount point in the parent mount, up to the root
 * mount. A callback: the verifier checks its body once. */
static long path_step(u64 i, struct path_walk *w)
{
	/* Locals, not w->...: BPF_CORE_READ would relocate w's own fields. */
	struct dentry *d = w->d;
	struct vfsmount *vm = w->vm;
	struct mount *m = w->m;
	struct dentry *parent = BPF_CORE_READ(d, d_parent);
	struct dentry *root = BPF_CORE_READ(vm, mnt_root);
	if (d == root || d == parent) {
		struct mount *mp = BPF_CORE_READ(m, mnt_parent);
		if (d != root || mp == m)
			return 1; /* the root of the mount tree */
		w->d = BPF_CORE_READ(m, mnt_mountpoint);
		w->m = mp;
		w->vm = (void *)mp + bpf_core_field_offset(struct mount, mnt);
		return 0;
	}
	u32 n = w->n;
	if (n >= MAP_PATH_DEPTH)
		return 1;
	struct map_event *ev = w->ev;
	bpf_probe_read_kernel_str(ev->names[n], MAP_NAME_LEN, BPF_CORE_READ(d, d_name.name));
	w->n = n + 1;
	w->d = parent;
	return 0;
}

/* Sends a code mapping with its file's identity and name. f is read with
 * probe reads: the caller may no longer hold the mapping lock. */
/* tgid_wake: the tgid, and the ring buffer's wake-up flag << 32 (BPF
 * functions take at most five arguments). */
static __noinline void emit_map(u64 tgid_wake, u64 start, u64 end, u64 pgoff, struct file *f)
{
	u64 before = bpf_ringbuf_query(&proc_events, BPF_RB_AVAIL_DATA);
	struct map_event *ev = bpf_ringbuf_reserve(&proc_events, sizeof(*ev), 0);
	if (!ev) {
		stat_add(STAT_EVENTS_LOST, 1);
		return;
	}
	ev->kind = EV_MAP;
	ev->tgid = (u32)tgid_wake;
	ev->start = start;
	ev->end = end;
	ev->offset = pgoff << PAGE_SHIFT;
	ev->ino = BPF_CORE_READ(f, f_inode, i_ino);
	ev->dev = BPF_CORE_READ(f, f_inode, i_sb, s_dev);
	if (want_unwind) {
		struct file_key k = { .ino = ev->ino, .dev = ev->dev };
		install_unwind((u32)tgid_wake, start, end, pgoff << PAGE_SHIFT, &k);
	}
	struct vfsmount *vm = BPF_CORE_READ(f, f_path.mnt);
	struct path_walk w = {
		.ev = ev,
		.d = BPF_CORE_READ(f, f_path.dentry),
		.vm = vm,
		.m = (void *)vm - bpf_core_field_offset(struct mount, mnt),
	};
	bpf_loop(MAP_PATH_DEPTH + 8, path_step, &w, 0);
	ev->depth = w.n;
	bpf_ringbuf_submit(ev, ring_wake(tgid_wake >> 32, before, sizeof(*ev)));
}

static long copy_vma(struct task_struct *task, struct vm_area_struct *vma, struct vma_copy *c)
{
	c->start = vma->vm_start;
	c->end = vma->vm_end;
	c->pgoff = vma->vm_pgoff;
	c->file = vma->vm_file;
	return 0;
}

/* Sends p's file-backed executable mappings (Linux 6.7+: the VMA
 * iterator), but for the program's own file and the mapping holding skip
 * (the loader, already sent at exec) when from_loader. */
static __always_inline void emit_code_maps(struct task_struct *p, u32 tgid, bool from_loader, u64 skip)
{
	if (!want_maps || !bpf_ksym_exists(bpf_iter_task_vma_new))
		return;
	struct inode *exe = 0;
	if (from_loader && p->mm && p->mm->exe_file)
		exe = p->mm->exe_file->f_inode;
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;
	bpf_iter_task_vma_new(&it, p, 0);
	while ((vma = bpf_iter_task_vma_next(&it))) {
		struct file *f = vma->vm_file;
		if (!f || !(vma->vm_flags & VM_EXEC))
			continue;
		if (from_loader && (f->f_inode == exe || (skip >= vma->vm_start && skip < vma->vm_end)))
			continue;
		emit_map(tgid | (u64)BPF_RB_NO_WAKEUP << 32, vma->vm_start, vma->vm_end, vma->vm_pgoff, f);
	}
	bpf_iter_task_vma_destroy(&it);
}

SEC("tp_btf/sched_process_fork")
int BPF_PROG(offcpu_fork, struct task_struct *parent, struct task_struct *child)
{
	u32 ptgid = parent->tgid, ctgid = child->tgid;
	on_fork(ptgid, ctgid);
	if (ptgid != ctgid && is_target(ctgid, child->pid)) {
		proc_event(EV_FORK, ctgid, child->pid, ptgid);
		/* A new process runs its parent's code until it execs (prefork
		 * servers, database backends never do): it is walked with the
		 * parent's unwind entry, copied now, before it first runs. */
		struct unwind_proc *pe = want_unwind ? bpf_map_lookup_elem(&unwind_procs, &ptgid) : 0;
		if (pe && bpf_map_update_elem(&unwind_procs, &ctgid, pe, BPF_NOEXIST) == -E2BIG)
			stat_add(STAT_FORK_UNWIND_FULL, 1);
	}
	return 0;
}

SEC("tracepoint/sched/sched_process_fork")
int offcpu_fork_tp(struct trace_event_raw_sched_process_fork *ctx)
{
	/* The classic event has no tgid: a new thread's tid is added too,
	 * which is harmless since no process can hold that id meanwhile. */
	u32 child = BPF_CORE_READ(ctx, child_pid);
	on_fork(bpf_get_current_pid_tgid() >> 32, child);
	if (rec_start_ns && !filter_tgid && is_target(0, child)) {
		u8 one = 1;
		bpf_map_update_elem(&newborn, &child, &one, BPF_ANY);
	}
	return 0;
}

/* An exec replaces the mappings: the new program's and its loader's code
 * mappings are sent now (the kernel made them, no mmap call did), and
 * user space snapshots /proc too if the process lives long enough. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(offcpu_exec, struct task_struct *p)
{
	u32 tgid = p->tgid;
	if (!is_target(tgid, p->pid))
		return 0;
	proc_event(EV_EXEC, tgid, p->pid, 0);
	if (want_unwind) {
		/* The old program's code is gone: an empty entry, counting the
		 * execs, that the new program's mappings fill. */
		u32 zero = 0, execs = 1;
		struct unwind_proc *old = bpf_map_lookup_elem(&unwind_procs, &tgid);
		if (old)
			execs = old->execs + 1;
		struct unwind_proc *z = bpf_map_lookup_elem(&unwind_zero, &zero);
		if (z && bpf_map_update_elem(&unwind_procs, &tgid, z, BPF_ANY) == 0) {
			struct unwind_proc *e = bpf_map_lookup_elem(&unwind_procs, &tgid);
			if (e)
				e->execs = execs;
		}
	}
	emit_code_maps(p, tgid, false, 0);
	return 0;
}

/* The dynamic loader's debugger hook (_dl_debug_state, the r_debug
 * protocol's breakpoint), called before and after it maps objects: at
 * startup, once the needed libraries are mapped, and at each dlopen. A
 * uprobe there costs nothing between loads; following mmap through the
 * syscall tracepoints sends every syscall of every task through the
 * kernel's slow syscall path (about +13 ns each here). */
SEC("uprobe")
int offcpu_dl_state(struct pt_regs *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tgid = id >> 32;
	if (!is_target(tgid, (u32)id))
		return 0;
	/* It is called before the objects are mapped too: what the exec
	 * program sent (the program and the loader) is not sent again. */
	emit_code_maps(bpf_get_current_task_btf(), tgid, true, ctx->REG_PC);
	return 0;
}

/* Keeps the recorded name current when a thread renames itself. */
SEC("tp_btf/task_rename")
int BPF_PROG(offcpu_rename, struct task_struct *task, const char *comm)
{
	u32 tid = task->pid;
	struct thread_info *ti = bpf_map_lookup_elem(&threads, &tid);
	if (ti)
		bpf_probe_read_kernel_str(ti->comm, sizeof(ti->comm), comm);
	return 0;
}

SEC("tracepoint/task/task_rename")
int offcpu_rename_tp(struct trace_event_raw_task_rename *ctx)
{
	u32 tid = BPF_CORE_READ(ctx, pid);
	struct thread_info *ti = bpf_map_lookup_elem(&threads, &tid);
	if (ti)
		bpf_probe_read_kernel_str(ti->comm, sizeof(ti->comm), ctx->newcomm);
	return 0;
}

/* A target mapping code (the dynamic loader placing a library, dlopen):
 * once the mapping exists, user space is told to read the mappings and
 * load the new file's unwind table before its code blocks. */
SEC("tracepoint/syscalls/sys_enter_mmap")
int offcpu_mmap_enter(struct mmap_enter_args *ctx)
{
	if (!(want_unwind || want_maps) || !(ctx->prot & PROT_EXEC))
		return 0;
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id;
	if (!is_target(id >> 32, tid))
		return 0;
	u8 one = 1;
	bpf_map_update_elem(&exec_mmaps, &tid, &one, BPF_ANY);
	return 0;
}

SEC("tracepoint/syscalls/sys_exit_mmap")
int offcpu_mmap_exit(struct mmap_exit_args *ctx)
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;
	if (!bpf_map_lookup_elem(&exec_mmaps, &tid))
		return 0;
	bpf_map_delete_elem(&exec_mmaps, &tid);
	if (ctx->ret < 0)
		return 0;
	struct vma_copy c = {};
	if (want_maps && bpf_find_vma(bpf_get_current_task_btf(), ctx->ret, copy_vma, &c, 0) == 0 && c.file)
		emit_map(tgid | (u64)BPF_RB_NO_WAKEUP << 32, c.start, c.end, c.pgoff, c.file);
	else
		proc_event(EV_REREAD, tgid, tid, 0);
	return 0;
}

#endif
