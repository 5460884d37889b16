/* On-CPU samples: a perf event per CPU, stacks counted in the kernel. */
#ifndef OFFCPU_CPU_H
#define OFFCPU_CPU_H

#include "common.bpf.h"
#include "procs.bpf.h"
#include "unwind.bpf.h" /* interp_lock_sample */

/* Key: cpu_key (thread and on-CPU stacks). Value: number of samples taken
 * by the perf-event program at --cpu-hz. Size: --agg-entries. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct cpu_key);
	__type(value, u64);
} cpu_samples SEC(".maps");

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
	if (!kthread && (py_active || ruby_active))
		interp_lock_sample(cur, tgid, tid);
	return 0;
}

#endif
