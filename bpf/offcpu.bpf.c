//go:build ignore

// Off-CPU recorder: sched_switch measures how long each thread stays off a
// CPU and aggregates that time in the kernel by (thread, user stack, kernel
// stack, state). Nothing is sent per event; user space drains the maps.
// Formats: /sys/kernel/tracing/events/sched/sched_switch/format,
// /sys/kernel/tracing/events/sched/sched_process_fork/format.

#include "offcpu_types.h"
#include "offcpu_shared.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* ---- constants ---- */

#define PF_KTHREAD 0x00200000
#define PF_EXITING 0x00000004
#define TASK_INTERRUPTIBLE 0x1
#define TASK_UNINTERRUPTIBLE 0x2
#define TASK_NOLOAD 0x400
#define TASK_REPORT_MAX 0x100 /* classic tracepoint: preempted */
#define TASK_DEAD 0x80        /* raw state (tp_btf): the task's last switch */
#define REPORT_EXITING 0x30   /* classic tracepoint: X or Z, the task's last switch */
#define PAST_WAITS 16 /* waits remembered per thread for chains */
#define EEXIST 17
#define E2BIG 7
#define ENOMEM 12
#define ENODATA 61

/* Unrolled binary searches: over a process's mappings (n <= UNWIND_MAX_MAPS)
 * and over one file's rows (at most --unwind-rows, checked against
 * maxMapEntries in collector/options.go). ceil(log2(n + 1)) steps each. */
#define MAP_SEARCH_STEPS 7
#define ROW_SEARCH_STEPS 25
#define UNWIND_MAX_ROWS (1 << 24)
_Static_assert((1 << MAP_SEARCH_STEPS) >= UNWIND_MAX_MAPS + 1, "mapping search too short");
_Static_assert((1ULL << ROW_SEARCH_STEPS) >= (unsigned long long)UNWIND_MAX_ROWS + 1, "row search too short");

/* Reads a search bound again from the map value: kept in a register, the
 * verifier would follow every path of the search apart. */
#define RELOAD(x) (*(volatile typeof(x) *)&(x))
#define VM_EXEC 0x4
#define PAGE_SHIFT 12

#ifndef bpf_ksym_exists
#define bpf_ksym_exists(sym) (!!(sym))
#endif

#define TRACE_FLAG_HARDIRQ 0x08
#define TRACE_FLAG_SOFTIRQ 0x10
#define TRACE_FLAG_NMI 0x40
#define PROT_EXEC 0x4

/* ---- configuration, set by user space before loading ---- */

/* Exposes the enum to bpf2go so Go and C share one list. */
const volatile enum offcpu_stat stat_count = STAT_MAX;

/* Load-time knobs, set from Go before loading (read-only globals). */
const volatile bool filter_tgid = false;   /* only tgids in target_tgids */
const volatile bool filter_tid = false;    /* only tids in target_tids */
const volatile u64 filter_cgroup = 0;      /* cgroup v2 id, 0 = any */
const volatile bool follow_forks = false;  /* children of targets become targets */
const volatile u64 min_block_ns = 0;
const volatile u64 max_block_ns = ~0ULL;
const volatile u32 state_mask = 0xf;       /* 1 << enum offcpu_state */
const volatile bool user_threads_only = false;
const volatile bool kernel_threads_only = false;
const volatile bool want_kernel_stacks = true;
const volatile bool want_user_stacks = true;
const volatile bool reuse_stacks = true;   /* see capture_sleep() */
const volatile bool want_wakeups = false;  /* record wakers and link them to intervals */
const volatile u64 thread_size = 16384;    /* kernel stack size (THREAD_SIZE) */
const volatile bool want_unwind = false;   /* unwind tables in use: report code mappings */
const volatile bool want_maps = false;     /* send code mappings as they are made (map_event) */

/* Written by user space once the programs are attached: the start of the
 * recorded window (bpf_ktime_get_ns clock). 0 until then. */
u64 rec_start_ns = 0;

/* Written by user space when recording stops, before the open intervals
 * are flushed: no interval is accounted after it, open ones end there. */
u64 rec_stop_ns = 0;

/* Keep both event layouts in the BTF for the Go bindings. */
const struct proc_event *unused_proc_event __attribute__((unused));
const struct map_event *unused_map_event __attribute__((unused));

/* ---- internal structures ---- */

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
	/* The last sleep whose stacks were both captured: user registers,
	 * syscall and its first argument, and the stack ids (tp_btf only).
	 * ip == 0: nothing cached. */
	u64 ip, sp, bp, sysnr, arg0;
	s64 c_ustack, c_kstack;
	/* The waker of the thread's current sleep (written by the waker), and
	 * how long, since this sleep began, the waker was itself off a CPU. */
	struct waker_rec waker;
	u64 waker_wait_ns;
	/* As a waker: the last wake-up whose stacks were captured, for reuse. */
	u64 w_ip, w_sp, w_bp, w_sysnr, w_arg0;
	u32 w_target;
	s64 w_ustack, w_kstack;
	u32 gen, w_gen; /* unwind_gen_of() when the cached stacks were walked */
	u64 ran;        /* the thread's se.sum_exec_runtime at switch-out */
	/* The time of the wake-up that ended the current sleep (sched_wakeup:
	 * the thread is on a run queue from then); 0 until it is woken. */
	u64 wake_ts;
	/* ts and wake_ts by the run queue's clock (rq_clock_of); 0: unknown. */
	u64 ts_rq, wake_rq;
	/* The last switch-in: its time and se.sum_exec_runtime then. */
	u64 in_ts, in_ran;
	u64 oncpu;      /* ns on a CPU inside the window so far */
};

/* A thread's last waits (bpf_ktime_get_ns bounds and stack ids), for the
 * chains of the threads it wakes; the newest at next - 1. */
struct past_waits {
	u64 from[PAST_WAITS], to[PAST_WAITS];
	s64 ustack[PAST_WAITS], kstack[PAST_WAITS];
	u32 next;
};

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
};

struct unwind_ctx {
	struct unwind_state *u;
	struct unwind_proc *proc; /* 0: walk by frame pointers only */
	struct stack_buf *buf;
	struct task_struct *task; /* walked from another task (iterator) */
	u32 tgid;                 /* whose stack it is */
};

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

/* ---- maps ---- */

/* Key: tid. Value: start_rec. Written at switch-out, consumed at switch-in
 * by the classic tracepoint program, which has no task pointer for next.
 * Size: --max-threads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct start_rec);
} starts SEC(".maps");

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

/* Same record kept on the task itself by the tp_btf program: no capacity
 * limit and no hash lookup. Freed by the kernel when the task exits. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct start_rec);
} task_starts SEC(".maps");

/* A recorded thread's last waits (past_waits), kept on the task by the
 * tp_btf switch program at each switch-in, read by sched_waking when the
 * thread wakes another. */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct past_waits);
} task_waits SEC(".maps");

/* Key: stack id, a 64-bit hash of the addresses (positive). Value: the
 * stack. A plain hash map rather than a stack-trace map: a stack-trace
 * map has no chaining, so two stacks meeting in one bucket lose the
 * second; here only a full map loses a stack. Written by get_stack_id,
 * read by user space at drain. Size: --stack-entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, s64);
	__type(value, struct stack_buf);
} stacks SEC(".maps");

/* Stack buffers per CPU: too large for the BPF stack. Entry 0 for the
 * tracepoint and perf-event programs, 1 for the sleepable iterator. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct stack_buf);
} stack_scratch SEC(".maps");

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

/* Key: offcpu_key. Value: offcpu_val (ns and count). Written at switch-in,
 * drained by user space at the end. Size: --agg-entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct offcpu_key);
	__type(value, struct offcpu_val);
} offcpu SEC(".maps");

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

/* Key: cpu_key (thread and on-CPU stacks). Value: number of samples taken
 * by the perf-event program at --cpu-hz. Size: --agg-entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cpu_key);
	__type(value, u64);
} cpu_samples SEC(".maps");

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

/* Key: tid. Value: tgid and the thread's name when first seen (updated on
 * rename), so threads that exit before the end keep their name. Size:
 * --max-threads. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, u32);
	__type(value, struct thread_info);
} threads SEC(".maps");

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
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 * 1024 * 1024);
} proc_events SEC(".maps");

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

/* Index: enum offcpu_stat. Value: per-CPU count, summed by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, u32);
	__type(value, u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2); /* as stack_scratch */
	__type(key, u32);
	__type(value, struct unwind_state);
} unwind_scratch SEC(".maps");

/* Key: tid. Value: unused. Threads inside an executable mmap. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, u8);
} exec_mmaps SEC(".maps");

/* ---- kernel functions ---- */

extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task, u64 addr) __weak __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __weak __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __weak __ksym;

/* ---- helpers ---- */

/* The end of an interval accounted now: the stop of the window, once set. */
static __always_inline u64 window_now(void)
{
	u64 stop = rec_stop_ns;
	return stop ? stop : bpf_ktime_get_ns();
}

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

static __always_inline void stat_add(u32 idx, u64 n)
{
	u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

/* Stores the stack in b (leaf first, 0-terminated unless full) under its
 * hash and returns the id, or -ENOMEM when the map is full (counted under
 * lost). */
static __always_inline s64 store_stack(struct stack_buf *b, u32 lost)
{
	u64 h = 14695981039346656037ULL; /* FNV-1a over the addresses */
	for (int i = 0; i < PERF_MAX_STACK_DEPTH; i++) {
		u64 ip = b->ips[i];
		if (!ip)
			break;
		h = (h ^ ip) * 1099511628211ULL;
	}
	s64 id = (s64)((h >> 1) | 1);
	if (!bpf_map_lookup_elem(&stacks, &id)) {
		long err = bpf_map_update_elem(&stacks, &id, b, BPF_NOEXIST);
		if (err && err != -EEXIST) {
			stat_add(lost, 1);
			return -ENOMEM;
		}
		if (!err)
			stat_add(STAT_STACKS_STORED, 1);
	}
	return id;
}

/* Captures the current stack (flags: 0 or BPF_F_USER_STACK) and returns
 * its id, or a negative errno: -ENOMEM when the map is full (counted
 * under lost), other errors when there is no stack to walk. */
static __always_inline s64 get_stack_id(void *ctx, u64 flags, u32 lost)
{
	u32 zero = 0;
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!b)
		return -1;
	long n = bpf_get_stack(ctx, b->ips, sizeof(b->ips), flags);
	if (n <= 0)
		return n < 0 ? n : -ENODATA;
	return store_stack(b, lost);
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

/* Reads user memory of the current task, or (remote, sleepable programs
 * only) of task. */
static __always_inline long read_user(void *dst, u32 size, u64 addr, struct task_struct *task, bool remote)
{
	if (remote)
		return bpf_copy_from_user_task(dst, size, (void *)addr, task, 0);
	return bpf_probe_read_user(dst, size, (void *)addr);
}

/* The bytecode index an interpreter frame is at: its bcp less the start
 * of its method's bytecodes, which follow the ConstMethod. JAVA_BCI_NONE
 * when the process's layout is not known or the bcp is not in range. */
static __always_inline u64 java_bci(struct unwind_ctx *c, u64 method, u64 bcp, bool remote)
{
	struct java_proc *jp = bpf_map_lookup_elem(&java_procs, &c->tgid);
	u64 cm;
	if (!jp || !bcp || read_user(&cm, sizeof(cm), method + jp->const_method_off, c->task, remote))
		return JAVA_BCI_NONE;
	u64 code = cm + jp->const_method_size;
	if (bcp < code || bcp - code >= JAVA_BCI_NONE)
		return JAVA_BCI_NONE;
	return bcp - code;
}

/* One frame: records pc, then finds the caller's pc, sp and bp, by the
 * unwind row when the code has one, else by the frame pointer. */
static __always_inline long unwind_frame(struct unwind_ctx *c, bool remote)
{
	struct unwind_state *u = c->u;
	u64 pc = u->pc, sp = u->sp, bp = u->bp;
	u32 n = u->n;
	if (!pc || n >= PERF_MAX_STACK_DEPTH)
		return 1;
	c->buf->ips[n] = pc;
	u->n = n + 1;
	/* A return address points after the call: look up the call itself. */
	struct unwind_row *r = find_row(c->proc, u, n ? pc - 1 : pc);
	u8 kind = r ? r->kind : UNWIND_NONE;
	u64 cfa = 0;
	switch (kind) {
	case UNWIND_JAVA_COMPILED: {
		struct java_method_key k = { .tgid = c->tgid, .kind = 1, .method = pc };
		u8 one = 1;
		bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		cfa = sp + r->cfa_off;
		break;
	}
	case UNWIND_RSP:
		cfa = sp + r->cfa_off;
		break;
	case UNWIND_RBP:
		cfa = bp + r->cfa_off;
		break;
	case UNWIND_PLT:
		cfa = sp + 8 + ((pc & 15) >= (u64)r->rbp_off ? 8 : 0);
		break;
	case UNWIND_END:
		u->end = 1;
		return 1;
	case UNWIND_JAVA_GAP: {
		struct java_method_key k = { .tgid = c->tgid, .kind = 2, .method = pc };
		u8 one = 1;
		bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		goto frame_pointer;
	}
	case UNWIND_JAVA_INTERP: {
		/* rbp - 64 .. rbp + 8: bcp, locals, cache, mdp, mirror, method,
		 * last sp, sender sp, rbp, ra */
		u64 fr[10];
		if (!bp || bp < sp || read_user(fr, sizeof(fr), bp - 64, c->task, remote)) {
			__builtin_memset(fr, 0, sizeof(fr));
			if (!bp || bp < sp || read_user(&fr[5], 5 * sizeof(u64), bp - 24, c->task, remote))
				return 1;
		}
		u64 method = fr[5];
		if (method && method <= JAVA_METHOD_MASK && !(method & 7)) {
			u64 bci = java_bci(c, method, fr[0], remote);
			c->buf->ips[n] = JAVA_METHOD_TAG | ((bci >> 3) << 47) | method | (bci & 7);
			struct java_method_key k = { .tgid = c->tgid, .method = method };
			u8 one = 1;
			bpf_map_update_elem(&java_methods, &k, &one, BPF_NOEXIST);
		}
		u->dwarf++;
		u->pc = fr[9];
		u->sp = fr[7] >= bp + 16 ? fr[7] : bp + 16;
		u->bp = fr[8];
		return 0;
	}
	default:
	frame_pointer: {
		/* Frame pointer: [bp] is the caller's bp, [bp + 8] the return address. */
		u64 frame[2];
		if (!bp || bp < sp || read_user(frame, sizeof(frame), bp, c->task, remote))
			return 1;
		u->pc = frame[1];
		u->sp = bp + 16;
		u->bp = frame[0];
		return 0;
	}
	}
	if (cfa <= sp)
		return 1; /* no progress: corrupt stack or wrong row */
	u64 ra;
	if (read_user(&ra, sizeof(ra), cfa - 8, c->task, remote))
		return 1;
	if (kind != UNWIND_PLT && r->rbp_off &&
	    read_user(&bp, sizeof(bp), cfa + 8 * (s64)r->rbp_off, c->task, remote))
		return 1;
	u->dwarf++;
	u->pc = ra;
	u->sp = cfa;
	u->bp = bp;
	return 0;
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
	if (!b || !u)
		return -1;
	if (!regs)
		return -ENODATA;
	u->pc = BPF_CORE_READ(regs, ip);
	u->sp = BPF_CORE_READ(regs, sp);
	u->bp = BPF_CORE_READ(regs, bp);
	u->n = 0;
	u->dwarf = 0;
	u->end = 0;
	struct unwind_ctx c = { .u = u, .proc = p, .buf = b, .task = task,
				.tgid = task ? BPF_CORE_READ(task, tgid) : bpf_get_current_pid_tgid() >> 32 };
	if (remote)
		bpf_loop(PERF_MAX_STACK_DEPTH, unwind_step_remote, &c, 0);
	else
		bpf_loop(PERF_MAX_STACK_DEPTH, unwind_step, &c, 0);
	u32 n = u->n;
	if (n == 0)
		return -ENODATA;
	if (n < PERF_MAX_STACK_DEPTH)
		b->ips[n] = 0;
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

/* The current thread's user stack id. Processes with unwind tables are
 * walked here through .eh_frame rows (code built without frame pointers);
 * the others by the kernel's frame-pointer walker. */
static __always_inline s64 user_stack_id(void *ctx, u32 lost)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct unwind_proc *p = bpf_map_lookup_elem(&unwind_procs, &tgid);
	struct task_struct *task = bpf_get_current_task_btf();
	s64 id;
	if (!p || !p->n) /* no mapping needs tables: the kernel's walker */
		id = get_stack_id(ctx, BPF_F_USER_STACK, lost);
	else
		id = walk_user(0, p, 0, (struct pt_regs *)bpf_task_pt_regs(task), false, lost);
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
	b->ips[0] = BPF_CORE_READ(regs, ip);
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

static __always_inline bool is_target(u32 tgid, u32 tid)
{
	if (!filter_tgid && !filter_tid)
		return true;
	if (filter_tgid && bpf_map_lookup_elem(&target_tgids, &tgid))
		return true;
	if (filter_tid && bpf_map_lookup_elem(&target_tids, &tid))
		return true;
	return false;
}

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
	return (u32)(BPF_CORE_READ(t, start_time) / 1000);
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
	if (bpf_ringbuf_output(&proc_events, &ev, sizeof(ev), kind == EV_SEEN || kind == EV_REREAD ? 0 : BPF_RB_NO_WAKEUP))
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
	if (bpf_ringbuf_output(&proc_events, &ev, sizeof(ev), BPF_RB_NO_WAKEUP)) {
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
	return BPF_CORE_READ(t, se.cfs_rq, rq, clock);
}

/* The part of the interval from start to end spent waiting for a CPU:
 * all of a preempted one; for a sleep, from its wake-up (woken) on. */
static __always_inline u64 runq_part(struct start_rec *s, u64 start, u64 woken, u64 end)
{
	if (s->state == STATE_PREEMPTED)
		return end - start;
	if (woken > start && woken < end)
		return end - woken;
	return 0;
}

/* Adds one interval ending at end to the aggregation map, with its
 * waker and the part of it (runq, <= its length) spent waiting for a
 * CPU; open marks one still running when recording stops. len: its
 * length, by the run queue's clock where both ends have it. */
static __always_inline void account_interval(u32 tid, struct start_rec *s, struct waker_rec *w, u32 open, u64 end,
					     u64 len, u64 runq, u64 chain)
{
	if (end <= s->ts)
		return; /* started as the window closed */
	u64 delta = len;
	if (runq > delta)
		runq = delta;
	if (chain > delta - runq)
		chain = delta - runq;
	if (delta < min_block_ns || delta > max_block_ns) {
		stat_add(STAT_OUT_OF_RANGE, 1);
		return;
	}
	struct offcpu_key key = {
		.tgid = s->tgid,
		.tid = tid,
		.ustack = s->ustack,
		.kstack = s->kstack,
		.state = s->state,
		.open = open,
		.gen = s->tgen,
	};
	if (w && w->valid) {
		key.waker = *w;
		if (!chain) {
			key.waker.wait_ustack = 0;
			key.waker.wait_kstack = 0;
		}
	}
	struct offcpu_val *v = bpf_map_lookup_elem(&offcpu, &key);
	if (!v) {
		struct offcpu_val init = { .ns = delta, .count = 1, .runq_ns = runq, .chain_ns = chain };
		long err = bpf_map_update_elem(&offcpu, &key, &init, BPF_NOEXIST);
		if (err == 0)
			return;
		v = bpf_map_lookup_elem(&offcpu, &key); /* lost a race on insert */
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

/* How long, of the waiter's wait, its waker was itself off a CPU. */
static __always_inline u64 chain_part(struct start_rec *s, u64 now)
{
	return s->waker.valid ? s->waker_wait_ns : 0;
}

/* Remembers a wait that ended now, for the chains of the threads this
 * thread wakes next. */
static __always_inline void remember_wait(struct task_struct *t, struct start_rec *s, u64 now)
{
	if (!want_wakeups)
		return;
	struct past_waits *p = bpf_task_storage_get(&task_waits, t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!p)
		return;
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

/* A thread that sleeps again in the same syscall, with the same first
 * argument, from the same user instruction with the same stack and frame
 * pointers is blocking at the same place: its previous stack ids are
 * reused instead of walking both stacks again, the largest cost of a
 * switch. A stack id is a hash of its addresses and is never replaced, so a
 * reused id stays valid. Preemptions are always captured: they can stop
 * a thread anywhere. */
static __always_inline void capture_sleep(void *ctx, struct start_rec *s, struct task_struct *prev, u64 now)
{
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(prev);
	u64 ip = 0, sp = 0, bp = 0, nr = -1, a0 = 0;
	if (regs) {
		ip = BPF_CORE_READ(regs, ip);
		sp = BPF_CORE_READ(regs, sp);
		bp = BPF_CORE_READ(regs, bp);
		nr = BPF_CORE_READ(regs, orig_ax);
		a0 = BPF_CORE_READ(regs, di);
	}
	u32 gen = unwind_gen_of(prev->tgid);
	if (ip && s->ip == ip && s->sp == sp && s->bp == bp && s->sysnr == nr && s->arg0 == a0 &&
	    s->gen == gen) {
		s->ustack = s->c_ustack;
		s->kstack = s->c_kstack;
		s->ts = now;
		stat_add(STAT_STACKS_REUSED, 1);
		return;
	}
	capture(ctx, s, false, now);
	s->ip = 0;
	if ((s64)nr < 0 || s->ustack < 0 || s->kstack < 0)
		return; /* not in a syscall (fault, interrupt) or stacks missing */
	s->ip = ip;
	s->sp = sp;
	s->bp = bp;
	s->sysnr = nr;
	s->arg0 = a0;
	s->c_ustack = s->ustack;
	s->c_kstack = s->kstack;
	s->gen = gen;
}

/* An interval that ended at now, read on entry to the program (the
 * program's own cost is on-CPU time on both ends); now_rq: the switch's
 * run-queue clock. With the run queue's clock at both ends the interval
 * is the scheduler's own: it ends where the thread's CPU time starts, and
 * its wait for a CPU is run_delay's. */
static __always_inline void account(u32 tid, struct start_rec *s, struct waker_rec *w, u64 now, u64 now_rq)
{
	if (now_rq > s->ts_rq && s->ts_rq) {
		u64 woken = s->wake_rq ? s->wake_rq : (s->wake_ts ? now_rq - (now - s->wake_ts) : 0);
		account_interval(tid, s, w, 0, now, now_rq - s->ts_rq, runq_part(s, s->ts_rq, woken, now_rq), chain_part(s, now));
		return;
	}
	account_interval(tid, s, w, 0, now, now - s->ts, runq_part(s, s->ts, s->wake_ts, now), chain_part(s, now));
}

/* The CPU time of the run a switch-out ends (ran: se.sum_exec_runtime
 * now): the scheduler's own count since the switch-in; for a thread on a
 * CPU since before the window, the wall time since the window opened. */
static __always_inline void add_run(struct start_rec *s, u64 ran, u64 now)
{
	if (s->running) {
		if (ran > s->in_ran)
			s->oncpu += ran - s->in_ran;
	} else if (!s->counting && rec_start_ns && now > rec_start_ns) {
		s->oncpu += now - rec_start_ns;
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
static __always_inline void store_oncpu(struct task_struct *t, u64 oncpu)
{
	struct thread_key k = { .tid = t->pid, .gen = task_gen(t) };
	struct thread_cpu v = { .tgid = t->tgid, .oncpu_ns = oncpu };
	if (bpf_map_update_elem(&thread_cpus, &k, &v, BPF_ANY))
		stat_add(STAT_THREAD_CPU_FULL, 1);
}

/* A switch-out of a thread whose interval is still pending: the kernel ran
 * no program for its switch-in (seen on 6.18 without any recursion miss,
 * about one switch in 10^4). Its CPU time since the last switch-out is
 * exact, so the interval is that wall time less the CPU time; it keeps the
 * stacks of that switch-out. */
static __always_inline void recover_missed_in(u32 tid, struct start_rec *s, u64 ran, u64 now)
{
	stat_add(STAT_MISSED_IN, 1);
	u64 oncpu = ran - s->ran;
	if (ran >= s->ran && now - s->ts > oncpu) {
		/* It waited for a CPU from its wake-up to the missed switch-in,
		 * and has run since: the run queue part is the rest. */
		u64 runq = runq_part(s, s->ts, s->wake_ts, now);
		runq = runq > oncpu ? runq - oncpu : 0;
		s->ts += oncpu;
		account_interval(tid, s, &s->waker, 0, now, now - s->ts, runq, 0);
	}
	/* Its run since the missed switch-in is counted by add_run. */
	s->running = 1;
	s->in_ran = s->ran;
	s->pending = 0;
	s->waker.valid = 0;
}

/* Accounts a thread blocked since before the start of the window, with its
 * kernel stack; whole: it is still blocked at the end. */
static __always_inline void account_prestart(struct task_struct *t, u32 state, u32 whole, u64 runq)
{
	u64 start = rec_start_ns, now = window_now();
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
	if (want_kernel_stacks && bpf_get_task_stack(t, v->kstack, sizeof(v->kstack), 0) < 0)
		v->kstack[0] = 0;
	if (bpf_map_update_elem(&prestart, &tid, v, BPF_NOEXIST) == 0)
		stat_add(STAT_NO_START, 1);
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
	bpf_ringbuf_submit(ev, tgid_wake >> 32);
}

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
	u64 base = (u64)BPF_CORE_READ(cur, stack);
	u64 sp = (u64)ctx;
	if (sp < base || sp >= base + thread_size)
		return true;
	if (cur->flags & PF_KTHREAD)
		return false;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(cur);
	if (!regs)
		return false;
	return (BPF_CORE_READ(regs, cs) & 3) && (s64)BPF_CORE_READ(regs, orig_ax) < 0;
}

/* Adds one to a u64 counter map entry, creating it; a full map is
 * counted under stat. */
static __always_inline void count_one(void *map, void *key, u32 stat)
{
	u64 *n = bpf_map_lookup_elem(map, key);
	if (n) {
		__sync_fetch_and_add(n, 1);
		return;
	}
	u64 one = 1;
	if (bpf_map_update_elem(map, key, &one, BPF_NOEXIST)) {
		n = bpf_map_lookup_elem(map, key); /* lost a race on insert */
		if (n)
			__sync_fetch_and_add(n, 1);
		else
			stat_add(stat, 1);
	}
}

static __always_inline void count_wakeup(u32 ttgid, u32 ttid, u32 tgen, struct waker_rec *w)
{
	struct wake_key k = { .target_tgid = ttgid, .target_tid = ttid, .target_gen = tgen, .waker = *w };
	count_one(&wakeups, &k, STAT_WAKE_FULL);
}

/* Fills w with the current (waking) context: an interrupt, or the current
 * thread with its stacks. ws is the waker's own start_rec for reusing its
 * previous stacks when it wakes the same target from the same place. */
static __always_inline void waker_context(void *ctx, struct waker_rec *w, bool irq,
					  struct start_rec *ws, u32 target)
{
	w->valid = 1;
	w->ustack = -1;
	w->kstack = get_stack_id(ctx, 0, STAT_WAKER_STACK_LOST);
	if (irq) {
		w->irq = 1;
		return;
	}
	u64 id = bpf_get_current_pid_tgid();
	w->tid = (u32)id;
	w->tgid = id >> 32;
	struct task_struct *cur = bpf_get_current_task_btf();
	if (BPF_CORE_READ(cur, flags) & PF_KTHREAD)
		return;
	/* A waker outside the recorded set (a load generator) is announced
	 * as a recorded thread is: its name is kept after it exits, and its
	 * process's mappings and unwind tables are read, so its next stacks
	 * are walked whole. */
	if (!is_target(w->tgid, w->tid))
		announce(w->tgid, w->tid);
	w->ustack = user_stack_id(ctx, STAT_WAKER_STACK_LOST);
}

/* A recorded thread leaves the CPU: its run is counted, and unless it is
 * dying or its state is filtered out, its interval starts with its
 * stacks. */
static __always_inline void switch_out(void *ctx, struct start_rec *s, struct task_struct *prev,
				       unsigned int prev_state, u8 state, bool kthread, u64 now)
{
	u32 ptid = prev->pid, ptgid = prev->tgid;
	u64 ran = prev->se.sum_exec_runtime;
	if (s->pending)
		recover_missed_in(ptid, s, ran, now);
	add_run(s, ran, now);
	if (prev_state & TASK_DEAD) {
		/* Its last switch-out starts no interval; its name is still
		 * kept (it may never have switched out before). */
		thread_exit(ptgid, ptid);
		store_oncpu(prev, s->oncpu);
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
	s->wake_ts = 0;
	s->wake_rq = 0;
	s->ts_rq = rq_clock_of(prev);
	if (reuse_stacks && !kthread && state == STATE_SLEEPING &&
	    want_user_stacks && want_kernel_stacks)
		capture_sleep(ctx, s, prev, now);
	else
		capture(ctx, s, kthread, now);
	s->ran = ran;
	s->pending = 1;
}

static long copy_vma(struct task_struct *task, struct vm_area_struct *vma, struct vma_copy *c)
{
	c->start = vma->vm_start;
	c->end = vma->vm_end;
	c->pgoff = vma->vm_pgoff;
	c->file = vma->vm_file;
	return 0;
}

/* ---- programs ---- */

SEC("tp_btf/sched_switch")
int BPF_PROG(offcpu_switch, bool preempt, struct task_struct *prev,
	     struct task_struct *next, unsigned int prev_state)
{
	u64 now = bpf_ktime_get_ns();
	if (rec_stop_ns)
		return 0; /* the window closed: open intervals are flushed to its end */
	u32 ptid = prev->pid, ptgid = prev->tgid;
	u8 state = classify(preempt, prev_state);
	bool kthread = prev->flags & PF_KTHREAD;

	/* A recorded thread's time on a CPU counts whatever the state filter. */
	if (recorded(ptgid, ptid, kthread)) {
		struct start_rec *s = bpf_task_storage_get(&task_starts, prev, 0,
							   BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s)
			switch_out(ctx, s, prev, prev_state, state, kthread, now);
		else
			stat_add(STAT_START_FULL, 1);
	}

	u32 ntid = next->pid;
	if (ntid == 0)
		return 0;
	struct start_rec *s = bpf_task_storage_get(&task_starts, next, 0, 0);
	if (s) {
		if (s->pending) {
			s->pending = 0;
			account(ntid, s, &s->waker, now, rq_clock_of(next));
			remember_wait(next, s, now);
			s->waker.valid = 0;
		} else if (!s->counting && s->wake_ts && now > s->wake_ts) {
			/* Blocked since before the start, woken inside the window
			 * (offcpu_wakeup made the record). */
			account_prestart(next, STATE_UNKNOWN, 0, now - s->wake_ts);
		}
		switched_in(s, next, now);
	} else if (is_target(next->tgid, ntid) &&
		   !((next->flags & PF_KTHREAD) ? user_threads_only : kernel_threads_only)) {
		/* First switch-in, no switch-out seen: off-CPU since before
		 * the start. The record created here marks it counted. */
		account_prestart(next, STATE_UNKNOWN, 0, 0);
		s = bpf_task_storage_get(&task_starts, next, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
		if (s)
			switched_in(s, next, now);
	}
	return 0;
}

/* The wake-up's enqueue: the woken thread waits for a CPU from here on,
 * as the kernel's run_delay (schedstat) counts it. sched_waking, earlier
 * and in the waker's context, names the waker. */
SEC("tp_btf/sched_wakeup")
int BPF_PROG(offcpu_wakeup, struct task_struct *p)
{
	struct start_rec *s = bpf_task_storage_get(&task_starts, p, 0, 0);
	if (s) {
		if (s->pending && !s->wake_ts) {
			s->wake_ts = bpf_ktime_get_ns();
			s->wake_rq = rq_clock_of(p);
		}
		return 0;
	}
	/* Blocked since before the start: a record with only the wake-up's
	 * time, for its first switch-in. */
	if (!rec_start_ns || !is_target(p->tgid, p->pid) ||
	    ((p->flags & PF_KTHREAD) ? user_threads_only : kernel_threads_only))
		return 0;
	s = bpf_task_storage_get(&task_starts, p, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (s && !s->counting && !s->pending)
		s->wake_ts = bpf_ktime_get_ns();
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
		recover_missed_in(ptid, old, ran, now);
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
		struct start_rec s = { .tgid = ptgid, .tgen = task_gen(cur), .state = state, .pending = 1, .ran = ran };
		announce(ptgid, ptid);
		capture(ctx, &s, kthread, now);
		if (bpf_map_update_elem(&starts, &ptid, &s, BPF_ANY))
			stat_add(STAT_START_FULL, 1);
	}

	u32 ntid = BPF_CORE_READ(ctx, next_pid);
	if (ntid == 0)
		return 0;
	struct start_rec *s = bpf_map_lookup_elem(&starts, &ntid);
	if (s) {
		struct start_rec copy = *s;
		bpf_map_delete_elem(&starts, &ntid);
		struct waker_rec *w = want_wakeups ? bpf_map_lookup_elem(&last_waker, &ntid) : 0;
		account(ntid, &copy, w, now, 0);
		if (w)
			bpf_map_delete_elem(&last_waker, &ntid);
	} else if (!filter_tgid && is_target(0, ntid) &&
		   bpf_map_delete_elem(&newborn, &ntid) != 0) {
		/* Not created during the recording: blocked since before it. */
		stat_add(STAT_NO_START, 1);
	}
	return 0;
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
	if (!want_maps || !bpf_ksym_exists(bpf_iter_task_vma_new))
		return 0;
	struct bpf_iter_task_vma it;
	struct vm_area_struct *vma;
	bpf_iter_task_vma_new(&it, p, 0);
	while ((vma = bpf_iter_task_vma_next(&it))) {
		struct file *f = vma->vm_file;
		if (f && (vma->vm_flags & VM_EXEC))
			emit_map(tgid | (u64)BPF_RB_NO_WAKEUP << 32, vma->vm_start, vma->vm_end, vma->vm_pgoff, f);
	}
	bpf_iter_task_vma_destroy(&it);
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

SEC("tp_btf/sched_waking")
int BPF_PROG(offcpu_waking, struct task_struct *p)
{
	u32 ttid = p->pid, ttgid = p->tgid;
	if (!want_wakeups || ttid == 0 || !is_target(ttgid, ttid))
		return 0;
	bool irq = in_interrupt_ctx(ctx);
	struct waker_rec w = {};
	struct start_rec *ws = 0;
	if (!irq && reuse_stacks)
		ws = bpf_task_storage_get(&task_starts, bpf_get_current_task_btf(), 0,
					  BPF_LOCAL_STORAGE_GET_F_CREATE);
	struct pt_regs *regs = 0;
	if (ws)
		regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	if (regs) {
		u64 ip = BPF_CORE_READ(regs, ip), sp = BPF_CORE_READ(regs, sp);
		u64 bp = BPF_CORE_READ(regs, bp), nr = BPF_CORE_READ(regs, orig_ax);
		u64 a0 = BPF_CORE_READ(regs, di);
		u32 gen = unwind_gen_of(bpf_get_current_pid_tgid() >> 32);
		if ((s64)nr >= 0 && ws->w_ip == ip && ws->w_sp == sp && ws->w_bp == bp &&
		    ws->w_sysnr == nr && ws->w_arg0 == a0 && ws->w_target == ttid &&
		    ws->w_gen == gen) {
			u64 id = bpf_get_current_pid_tgid();
			w.valid = 1;
			w.tid = (u32)id;
			w.tgid = id >> 32;
			w.ustack = ws->w_ustack;
			w.kstack = ws->w_kstack;
			stat_add(STAT_WAKES_REUSED, 1);
		} else {
			waker_context(ctx, &w, false, ws, ttid);
			ws->w_ip = 0;
			if ((s64)nr >= 0 && w.ustack >= 0 && w.kstack >= 0) {
				ws->w_ip = ip;
				ws->w_sp = sp;
				ws->w_bp = bp;
				ws->w_sysnr = nr;
				ws->w_arg0 = a0;
				ws->w_target = ttid;
				ws->w_ustack = w.ustack;
				ws->w_kstack = w.kstack;
				ws->w_gen = gen;
			}
		}
	} else {
		waker_context(ctx, &w, irq, 0, ttid);
	}
	count_wakeup(ttgid, ttid, task_gen(p), &w);
	struct start_rec *ts = bpf_task_storage_get(&task_starts, p, 0, 0);
	if (!ts || !ts->pending)
		return 0;
	/* The waker's own waits since the waiter's began: the waiter waited on
	 * a thread that was itself waiting (a chain). */
	ts->waker_wait_ns = 0;
	struct past_waits *me = irq ? 0 : bpf_task_storage_get(&task_waits, bpf_get_current_task_btf(), 0, 0);
	if (me)
		ts->waker_wait_ns = waits_since(me, ts->ts, bpf_ktime_get_ns(), &w);
	ts->waker = w;
	return 0;
}

SEC("tracepoint/sched/sched_waking")
int offcpu_waking_tp(struct trace_event_raw_sched_wakeup_template *ctx)
{
	u32 ttid = BPF_CORE_READ(ctx, pid);
	if (!want_wakeups || ttid == 0 || !is_target(0, ttid) || filter_tgid)
		return 0;
	u8 flags = BPF_CORE_READ(ctx, ent.flags);
	bool irq = flags & (TRACE_FLAG_HARDIRQ | TRACE_FLAG_SOFTIRQ | TRACE_FLAG_NMI);
	struct waker_rec w = {};
	waker_context(ctx, &w, irq, 0, ttid);
	count_wakeup(0, ttid, 0, &w);
	bpf_map_update_elem(&last_waker, &ttid, &w, BPF_ANY);
	return 0;
}

/* On-CPU sampling: a perf event per CPU at --cpu-hz runs this. */
SEC("perf_event")
int offcpu_cpu_sample(void *ctx) /* struct bpf_perf_event_data, only passed on */
{
	u64 id = bpf_get_current_pid_tgid();
	u32 tid = (u32)id, tgid = id >> 32;
	if (tid == 0 || !is_target(tgid, tid))
		return 0;
	if (filter_cgroup && bpf_get_current_cgroup_id() != filter_cgroup)
		return 0;
	struct task_struct *cur = bpf_get_current_task_btf();
	bool kthread = BPF_CORE_READ(cur, flags) & PF_KTHREAD;
	if ((user_threads_only && kthread) || (kernel_threads_only && !kthread))
		return 0;
	announce(tgid, tid);
	struct cpu_key k = { .tgid = tgid, .tid = tid, .ustack = -1, .kstack = -1, .gen = task_gen(cur) };
	if (want_kernel_stacks)
		k.kstack = get_stack_id(ctx, 0, STAT_KSTACK_LOST);
	if (want_user_stacks && !kthread)
		k.ustack = user_stack_id(ctx, STAT_USTACK_LOST);
	count_one(&cpu_samples, &k, STAT_CPU_FULL);
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
	bool kthread = task->flags & PF_KTHREAD;
	struct start_rec *s = bpf_task_storage_get(&task_starts, task, 0, 0);
	if (s && s->pending) {
		s->pending = 0;
		if (end > s->ts)
			account_interval(task->pid, s, 0, 1, end, end - s->ts, runq_part(s, s->ts, s->wake_ts, end), 0);
	}
	if (s && task->pid && is_target(task->tgid, task->pid) &&
	    !(kthread ? user_threads_only : kernel_threads_only)) {
		/* On a CPU at the end: its run so far, by the clock (the
		 * scheduler updates a running thread's count only at ticks). */
		if (s->running && end > s->in_ts)
			s->oncpu += end - s->in_ts;
		else if (!s->counting && rec_start_ns && end > rec_start_ns)
			s->oncpu += end - rec_start_ns;
		store_oncpu(task, s->oncpu);
		return 0;
	}
	/* Never switched during the recording: blocked, or on a CPU, for all
	 * of it. Only for -p/--tid targets (system-wide this would list every
	 * idle thread of the machine). */
	if (!s && (filter_tgid || filter_tid) && task->pid && is_target(task->tgid, task->pid) &&
	    !(kthread ? user_threads_only : kernel_threads_only)) {
		unsigned int st = task->__state;
		if (st != 0) {
			account_prestart(task, classify(false, st), 1, 0);
		} else if (task->on_cpu && rec_start_ns && end > rec_start_ns) {
			store_oncpu(task, end - rec_start_ns);
		}
	}
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
	if (!task || !task->pid || !want_user_stacks)
		return 0;
	if ((task->flags & PF_KTHREAD) || task->__state == 0)
		return 0; /* kernel thread, or running or runnable */
	u32 tid = task->pid;
	if (!is_target(task->tgid, tid))
		return 0;
	s64 id = task_user_stack_id(task);
	if (id >= 0)
		bpf_map_update_elem(&blocked_ustacks, &tid, &id, BPF_ANY);
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
