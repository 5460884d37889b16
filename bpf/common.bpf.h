/* What every part of the recorder shares: the types and the contract
 * with Go (offcpu_shared.h), libbpf's helpers, the settings user space
 * writes before loading, and the counting helpers. Every .bpf.h includes
 * it and what else it uses, so the order of includes does not matter. */
#ifndef OFFCPU_COMMON_H
#define OFFCPU_COMMON_H

#include "offcpu_types.h"
#include "offcpu_shared.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PF_KTHREAD 0x00200000
/* A wait for an interpreter lock (start_rec.gil): queued for it (the
 * waiter takes it when another thread hands it over), or another (a yield
 * waiting for the next holder, the lock's own mutex). LOCK_TAKES marks a
 * waiter that takes it (interp_lock_held's id). */
#define LOCK_QUEUED 1
#define LOCK_OTHER 2
#define LOCK_TAKES (1ull << 31)
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
#define EAGAIN 11 /* stack ids: not walked (deferred walks) */

/* Unrolled binary searches: over a process's mappings (n <= UNWIND_MAX_MAPS)
 * and over one file's rows (at most --unwind-rows, checked against
 * maxMapEntries in collector/options.go). ceil(log2(n + 1)) steps each. */
#define MAP_SEARCH_STEPS 7
#define ROW_SEARCH_STEPS 25
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

#define PROT_EXEC 0x4

/* A user thread's registers and thread pointer by architecture (bpf2go's
 * -target sets __TARGET_ARCH_*), as field names of struct pt_regs and
 * task_struct: the walk's start (pc, stack pointer, frame pointer; on
 * arm64 the link register holds a leaf's return address), a blocked system
 * call's number and first argument. USER_IRQ: registers saved by an
 * interrupt taken in user mode (no system call). */
#if defined(__TARGET_ARCH_arm64)
#define REG_PC pc
#define REG_SP sp
#define REG_FP regs[29]
#define REG_LR regs[30]
#define REG_SYSNR syscallno
#define REG_ARG0 orig_x0
#define TASK_TP thread.uw.tp_value
#define SYS_FUTEX 98
#define USER_IRQ(r) (((r)->pstate & 0xf) == 0 && (r)->syscallno < 0)
/* Go on arm64 keeps its frame record 8 bytes below its frame's sp
 * (cmd/internal/obj/arm64: the saved fp at -8(RSP)): a frameless leaf's
 * fp, its caller's, is below its sp. */
#define FP_BELOW_SP 16
#elif defined(__TARGET_ARCH_x86)
#define REG_PC ip
#define REG_SP sp
#define REG_FP bp
#define REG_SYSNR orig_ax
#define REG_ARG0 di
#define TASK_TP thread.fsbase
#define SYS_FUTEX 202
#define USER_IRQ(r) (((r)->cs & 3) && (s64)(r)->orig_ax < 0)
#define FP_BELOW_SP 0
#else
#error "build with bpf2go -target amd64 or arm64 (__TARGET_ARCH_x86 or __TARGET_ARCH_arm64)"
#endif

/* Exposes the enum to bpf2go so Go and C share one list. */
const volatile enum offcpu_stat stat_count = STAT_MAX;

/* Load-time knobs, set from Go before loading (read-only globals). */
const volatile bool filter_tgid = false;   /* only tgids in target_tgids */
const volatile bool filter_tid = false;    /* only tids in target_tids */
const volatile u64 filter_cgroup = 0;      /* cgroup v2 id, 0 = any */
const volatile bool follow_forks = false;  /* children of targets become targets */
const volatile u32 exclude_tgid = 0;       /* not recorded: the agent itself (0: none) */
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
const volatile bool want_stream = false;   /* send every wait to wait_stream (--timeline) */
/* Stacks are walked at the switch-in, in the thread's own context at the
 * end of __schedule (sched_exit_tp), once the interval's length is known,
 * rather than at every switch-out: see account_deferred(). */
const volatile bool deferred_walks = false;
/* Tests only: a target's first switch-in runs no program, as the kernel
 * sometimes skips one (pruned as dead code when false). */
const volatile bool skip_first_in = false;

/* With deferred walks: intervals at least this long are always walked,
 * shorter ones by lot. Written by user space (the --budget controller). */
u64 walk_threshold_ns = 0;

/* Written by user space once the programs are attached: the start of the
 * recorded window (bpf_ktime_get_ns clock). 0 until then. */
u64 rec_start_ns = 0;

/* Written by user space when recording stops, before the open intervals
 * are flushed: no interval is accounted after it, open ones end there. */
u64 rec_stop_ns = 0;

/* Keep both event layouts in the BTF for the Go bindings. */
const struct proc_event *unused_proc_event __attribute__((unused));
const struct map_event *unused_map_event __attribute__((unused));
const struct wait_event *unused_wait_event __attribute__((unused));

/* Index: enum offcpu_stat. Value: per-CPU count, summed by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, u32);
	__type(value, u64);
} stats SEC(".maps");

extern int bpf_iter_task_vma_new(struct bpf_iter_task_vma *it, struct task_struct *task, u64 addr) __weak __ksym;
extern struct vm_area_struct *bpf_iter_task_vma_next(struct bpf_iter_task_vma *it) __weak __ksym;
extern void bpf_iter_task_vma_destroy(struct bpf_iter_task_vma *it) __weak __ksym;

/* The end of an interval accounted now: the stop of the window, once set. */
static __always_inline u64 window_now(void)
{
	u64 stop = rec_stop_ns;
	return stop ? stop : bpf_ktime_get_ns();
}

static __always_inline void stat_add(u32 idx, u64 n)
{
	u64 *v = bpf_map_lookup_elem(&stats, &idx);
	if (v)
		*v += n;
}

/* Adds n to a u64 counter map entry, creating it; a full map is counted
 * under stat. */
static __always_inline void count_add(void *map, void *key, u64 n, u32 stat)
{
	u64 *v = bpf_map_lookup_elem(map, key);
	if (v) {
		__sync_fetch_and_add(v, n);
		return;
	}
	if (bpf_map_update_elem(map, key, &n, BPF_NOEXIST)) {
		v = bpf_map_lookup_elem(map, key); /* lost a race on insert */
		if (v)
			__sync_fetch_and_add(v, n);
		else
			stat_add(stat, n);
	}
}

static __always_inline void count_one(void *map, void *key, u32 stat)
{
	count_add(map, key, 1, stat);
}

/* Reads user memory of the current task, or (remote, sleepable programs
 * only) of task. */
/* An index into an array of n entries, checked where it is used: i, or 0
 * if i >= n. The test and the use are one register, so every verifier
 * knows the bound (6.1's lost one checked earlier on a copy that went
 * through the stack: "unbounded memory access"). n: a constant. */
#define IDX(i, n) ({                                                   \
	u64 __i = (i);                                                 \
	asm volatile("if %0 < %1 goto +1; %0 = 0" : "+r"(__i) : "i"(n)); \
	__i;                                                           \
})

static __always_inline long read_user(void *dst, u32 size, u64 addr, struct task_struct *task, bool remote)
{
	if (remote)
		return bpf_copy_from_user_task(dst, size, (void *)addr, task, 0);
	return bpf_probe_read_user(dst, size, (void *)addr);
}

#endif /* OFFCPU_COMMON_H */
