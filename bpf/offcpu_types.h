/* CO-RE views of the few kernel structures offcpu reads. Fields are
 * relocated against the running kernel's BTF at load time, so only the
 * names must match, not the layout. */
#pragma once

#include <linux/types.h>
#include <linux/bpf.h>
#include <stdbool.h>

typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __s8 s8;
typedef __s16 s16;
typedef __s32 s32;
typedef __u64 u64;
typedef __s64 s64;

struct rq {
	u64 clock; /* updated at the start of __schedule and when a wake-up locks the rq */
} __attribute__((preserve_access_index));

struct cfs_rq {
	struct rq *rq; /* CONFIG_FAIR_GROUP_SCHED */
} __attribute__((preserve_access_index));

struct sched_entity {
	u64 sum_exec_runtime; /* ns on a CPU, updated before sched_switch fires */
	u64 prev_sum_exec_runtime; /* sum_exec_runtime when the task was last picked to run */
	struct cfs_rq *cfs_rq; /* the task's CPU's, set with its CPU (any class) */
} __attribute__((preserve_access_index));

/* The scheduler's per-task run-queue accounting (CONFIG_SCHED_INFO,
 * /proc/PID/task/TID/schedstat). */
struct sched_info {
	unsigned long long run_delay;
	unsigned long long last_arrival; /* rq clock at its last switch-in */
	unsigned long long last_queued;
} __attribute__((preserve_access_index));

/* The thread pointer (pthread_self) of a user thread: fsbase on x86-64,
 * TPIDR_EL0 as the task keeps it on arm64. */
#if defined(__TARGET_ARCH_arm64)
struct thread_struct {
	struct {
		unsigned long tp_value;
	} uw;
} __attribute__((preserve_access_index));
#else
struct thread_struct {
	unsigned long fsbase;
} __attribute__((preserve_access_index));
#endif

struct task_struct {
	unsigned int __state;
	void *stack;
	int on_cpu;
	unsigned int flags;
	int pid;
	int tgid;
	u64 start_time; /* creation, CLOCK_MONOTONIC ns (bpf_ktime_get_ns) */
	struct sched_entity se;
	struct sched_info sched_info;
	char comm[16];
	struct mm_struct *mm;
	struct task_struct *group_leader;
	struct thread_struct thread;
} __attribute__((preserve_access_index));

/* What a code mapping is read from: its file, the file's identity and
 * name (dentries up to the mount root, mounts up to the namespace root). */
struct qstr {
	const unsigned char *name;
} __attribute__((preserve_access_index));

struct dentry {
	struct dentry *d_parent;
	struct qstr d_name;
} __attribute__((preserve_access_index));

struct vfsmount {
	struct dentry *mnt_root;
} __attribute__((preserve_access_index));

struct mount {
	struct mount *mnt_parent;
	struct dentry *mnt_mountpoint;
	struct vfsmount mnt;
} __attribute__((preserve_access_index));

struct path {
	struct vfsmount *mnt;
	struct dentry *dentry;
} __attribute__((preserve_access_index));

struct super_block {
	unsigned int s_dev; /* kernel dev_t: major << 20 | minor */
} __attribute__((preserve_access_index));

struct inode {
	unsigned long i_ino;
	struct super_block *i_sb;
} __attribute__((preserve_access_index));

struct file {
	struct path f_path;
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	unsigned long vm_flags;
	unsigned long vm_pgoff; /* in pages */
	struct file *vm_file;
} __attribute__((preserve_access_index));

struct mm_struct {
	struct file *exe_file;
} __attribute__((preserve_access_index));

/* Open-coded VMA iterator (kfuncs, Linux 6.7+). */
struct bpf_iter_task_vma {
	__u64 __opaque[1];
} __attribute__((aligned(8)));

/* The common fields of every classic tracepoint record. */
struct trace_entry {
	unsigned short type;
	unsigned char flags;
	unsigned char preempt_count;
	int pid;
} __attribute__((preserve_access_index));

/* /sys/kernel/tracing/events/sched/sched_waking/format */
struct trace_event_raw_sched_wakeup_template {
	struct trace_entry ent;
	int pid;
} __attribute__((preserve_access_index));

/* User registers saved at kernel entry (a uprobe's context too). On
 * arm64 the first four are the kernel's struct user_pt_regs, inside an
 * anonymous union: CO-RE finds them by name. */
#if defined(__TARGET_ARCH_arm64)
struct pt_regs {
	u64 regs[31];
	u64 sp;
	u64 pc;
	u64 pstate;
	u64 orig_x0;
	s32 syscallno;
} __attribute__((preserve_access_index));
#else
struct pt_regs {
	unsigned long bp;
	unsigned long di;
	unsigned long orig_ax;
	unsigned long ip;
	unsigned long cs;
	unsigned long sp;
} __attribute__((preserve_access_index));
#endif

/* /sys/kernel/tracing/events/sched/sched_switch/format */
struct trace_event_raw_sched_switch {
	unsigned long long unused;
	char prev_comm[16];
	int prev_pid;
	int prev_prio;
	long prev_state;
	char next_comm[16];
	int next_pid;
	int next_prio;
} __attribute__((preserve_access_index));

/* /sys/kernel/tracing/events/sched/sched_process_fork/format */
struct trace_event_raw_sched_process_fork {
	unsigned long long unused;
	int parent_pid;
	int child_pid;
} __attribute__((preserve_access_index));

/* /sys/kernel/tracing/events/task/task_rename/format */
struct trace_event_raw_task_rename {
	unsigned long long unused;
	int pid;
	char newcomm[16];
} __attribute__((preserve_access_index));

/* Context of iter/task programs. */
struct seq_file;
struct bpf_iter_meta {
	struct seq_file *seq;
} __attribute__((preserve_access_index));
struct bpf_iter__task {
	struct bpf_iter_meta *meta;
	struct task_struct *task;
} __attribute__((preserve_access_index));
