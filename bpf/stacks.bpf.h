/* Stacks: kernel and user stacks stored by a hash of their addresses. */
#ifndef OFFCPU_STACKS_H
#define OFFCPU_STACKS_H

#include "common.bpf.h"

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

/* Where a thread blocks or wakes another: its user registers, syscall
 * and first argument, the woken thread (0 for a sleep) and its unwind
 * tables' generation (unwind_gen_of). */
struct stack_where {
	u64 ip, sp, bp, sysnr, arg0;
	u32 target, gen;
};

/* The stack ids last walked at two places, reused while the thread is at
 * one again: a thread in the same syscall, with the same first argument,
 * from the same user instruction with the same stack and frame pointers
 * is at the same place, and a stack id is a hash of its addresses, never
 * replaced, so a reused id stays valid. Two: a condition variable's
 * waiter alternates between the futex words of its two groups (the C
 * library's pthread_cond_wait), a waker between two targets. Both a
 * sleep's stacks (capture_sleep) and a waker's (offcpu_waking) use one.
 * at[i].ip == 0: nothing cached there. */
#define STACK_CACHE_WAYS 2
struct stack_cache {
	struct stack_where at[STACK_CACHE_WAYS];
	s64 ustack[STACK_CACHE_WAYS], kstack[STACK_CACHE_WAYS];
	u32 next; /* the entry the next miss replaces */
};

/* Where a thread is, built in a per-CPU value rather than on the BPF stack
 * (6.1 counts the switch program's call chain to its 512 bytes). Entry 0
 * for the scheduler's programs, 1 for the wake-up's. */
#define WHERE_SCHED 0
#define WHERE_WAKE 1
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct stack_where);
} where_scratch SEC(".maps");

static __always_inline bool stack_where_eq(struct stack_where *a, struct stack_where *b)
{
	return a->ip && a->ip == b->ip && a->sp == b->sp && a->bp == b->bp && a->sysnr == b->sysnr &&
	       a->arg0 == b->arg0 && a->target == b->target && a->gen == b->gen;
}

static __always_inline bool stack_cache_get(struct stack_cache *c, struct stack_where *at, s64 *ustack, s64 *kstack)
{
	for (int i = 0; i < STACK_CACHE_WAYS; i++) {
		if (stack_where_eq(&c->at[i], at)) {
			*ustack = c->ustack[i];
			*kstack = c->kstack[i];
			return true;
		}
	}
	return false;
}

/* stack_cache_put keeps stacks both walked whole, in place of the older
 * entry. */
static __always_inline void stack_cache_put(struct stack_cache *c, struct stack_where *at, s64 ustack, s64 kstack)
{
	if (ustack < 0 || kstack < 0)
		return;
	u32 i = c->next & (STACK_CACHE_WAYS - 1);
	c->at[i] = *at;
	c->ustack[i] = ustack;
	c->kstack[i] = kstack;
	c->next = i + 1;
}

/* stack_cache_clear forgets every entry. */
static __always_inline void stack_cache_clear(struct stack_cache *c)
{
	for (int i = 0; i < STACK_CACHE_WAYS; i++)
		c->at[i].ip = 0;
}

/* Stack buffers per CPU: too large for the BPF stack. Entry 0 for the
 * tracepoint and perf-event programs, 1 for the sleepable iterator. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, u32);
	__type(value, struct stack_buf);
} stack_scratch SEC(".maps");

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

/* A runtime's n frames in b (a lock holder's), stored: their id, 0 if
 * there are none. */
static __always_inline s64 store_frames(struct stack_buf *b, u32 n)
{
	if (!n)
		return 0;
	if (n < PERF_MAX_STACK_DEPTH)
		b->ips[IDX(n, PERF_MAX_STACK_DEPTH)] = 0;
	return store_stack(b, STAT_USTACK_LOST);
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

/* The kernel stack of a task that is not running (non-sleepable
 * programs), by the same ids. */
static __always_inline s64 task_kernel_stack_id(struct task_struct *t)
{
	u32 zero = 0;
	struct stack_buf *b = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!b)
		return -1;
	/* The helper zero-fills what the stack does not use. */
	long n = bpf_get_task_stack(t, b->ips, sizeof(b->ips), 0);
	if (n <= 0)
		return n < 0 ? n : -ENODATA;
	return store_stack(b, STAT_KSTACK_LOST);
}

/* One interpreter frame read (CPython's, CRuby's): its entry (0: not
 * shown), the frame before it, and whether it is its activation's first. */
struct interp_step {
	u64 entry, back;
	bool last;
};

#endif
