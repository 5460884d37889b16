/* OpenTelemetry thread context (OTEP 4947): an SDK that adopts it keeps,
 * in the TLS variable otel_thread_ctx_v1, a pointer to the record of the
 * request the thread serves (trace id, span id, valid, trace flags,
 * attributes). Read in the waiting thread's own context when its wait's
 * stacks are walked; a record is copied into tctx_links once per span,
 * a wait keeps its id (offcpu_key.link). User space finds where each
 * process keeps the variable (tctx_procs). A thread without one may have
 * its trace context in the OpenTelemetry eBPF Instrumentation's map
 * (OTEP 4855: otel_traces_ctx_v1, pinned by user space). A Go thread's
 * request is its running goroutine's pprof labels (golinks.bpf.h). */
#ifndef OFFCPU_TCTX_H
#define OFFCPU_TCTX_H

#include "common.bpf.h"

#define GO_LINKS_MAX 1024 /* 0.8 MB */
#define GO_LINK_KEPT() stat_add(STAT_TCTX_GO_SETS, 1)
#define GO_LINK_LOST() stat_add(STAT_TCTX_GO_LOST, 1)
#include "golinks.bpf.h"

/* Which sources user space has seen (TCTX_SRC_*): with none, a walked
 * wait costs one load here rather than two map lookups. */
u32 tctx_sources = 0;

/* Key: tgid. Written by user space for the processes that export
 * otel_thread_ctx_v1. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct tctx_proc);
} tctx_procs SEC(".maps");

/* The records read, by process and span; user space moves them out every
 * 250 ms. Preallocated: an insert costs no allocation. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2048);
	__type(key, struct tctx_key);
	__type(value, struct tctx_link);
} tctx_links SEC(".maps");

/* OTEP 4855: the trace context the OpenTelemetry eBPF Instrumentation
 * keeps for a thread it sees serving a request, by pid_tgid. User space
 * pins it (--trace-map-pin), shared with the instrumentation. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 14);
	__type(key, u64);
	__type(value, struct obi_trace_ctx);
} otel_traces_ctx_v1 SEC(".maps");

/* tctx_read's record, off the stack. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct tctx_link);
} tctx_scratch SEC(".maps");

/* murmur3's 64-bit finalizer step over one word. */
static __always_inline u64 tctx_mix(u64 h, u64 w)
{
	h ^= w;
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdULL;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ULL;
	h ^= h >> 33;
	return h;
}

/* Keeps record v (its head read; rec: where its attributes are, 0 for
 * none) of process tgid in tctx_links once per trace and span: its id
 * (0: no ids, or not kept: counted). */
static __always_inline u64 tctx_keep(u32 tgid, struct tctx_link *v, u64 rec)
{
	u64 h = 14695981039346656037ULL, id0 = 0, id1 = 0, sp = 0;
	__builtin_memcpy(&id0, v->trace_id, 8);
	__builtin_memcpy(&id1, v->trace_id + 8, 8);
	__builtin_memcpy(&sp, v->span_id, 8);
	if (!id0 && !id1 && !sp)
		return 0;
	/* Each word mixed down as well as up (a product alone never carries a
	 * high byte's change into the low ones): ids that differ only in
	 * their last bytes, as sequential ones do, stay apart. */
	h = tctx_mix(h, id0);
	h = tctx_mix(h, id1);
	h = tctx_mix(h, sp) & ~(1ULL << TCTX_GO_BIT);
	if (!h)
		h = 1;
	struct tctx_key k = { .tgid = tgid, .id = h };
	if (bpf_map_lookup_elem(&tctx_links, &k))
		return h;
	u64 n = rec ? v->attrs_size : 0;
	if (n > TCTX_ATTRS)
		v->flags |= TCTX_TRUNCATED;
	/* Clamped in the register the read uses: every verifier sees the bound. */
	asm volatile("if %0 <= %1 goto +1; %0 = %1" : "+r"(n) : "i"(TCTX_ATTRS));
	if (n && bpf_probe_read_user(v->attrs, n, (void *)(rec + TCTX_HEAD)))
		v->attrs_size = 0;
	else
		v->attrs_size = n;
	if (bpf_map_update_elem(&tctx_links, &k, v, BPF_NOEXIST) && !bpf_map_lookup_elem(&tctx_links, &k)) {
		stat_add(STAT_TCTX_LOST, 1);
		return 0;
	}
	stat_add(STAT_TCTX_LINKS, 1);
	return h;
}

/* The request the current thread (of process tgid) serves: the id of its
 * record in tctx_links, 0 for none (no record, not valid, no trace id) or
 * not kept (tctx_links full: counted); without a variable, its entry in
 * otel_traces_ctx_v1; in a Go process, the id of its goroutine's label
 * set in go_links, with TCTX_GO_BIT. glibc's x86-64 layout: the thread
 * pointer is fsbase, the DTV's address at fsbase + 8, 16 bytes a module.
 * A global function: verified once, apart from its callers. */
__attribute__((noinline)) u64 tctx_read(u32 tgid)
{
	u32 src = tctx_sources, zero = 0;
	if (!src)
		return 0;
	struct tctx_link *v = bpf_map_lookup_elem(&tctx_scratch, &zero);
	if (!v)
		return 0;
	struct tctx_proc *p = src & TCTX_SRC_PROCS ? bpf_map_lookup_elem(&tctx_procs, &tgid) : 0;
	if (!p) {
		if (!(src & TCTX_SRC_OBI))
			return 0;
		u64 id = bpf_get_current_pid_tgid();
		struct obi_trace_ctx *o = bpf_map_lookup_elem(&otel_traces_ctx_v1, &id);
		if (!o)
			return 0;
		__builtin_memcpy(v->trace_id, o->trace_id, 16);
		__builtin_memcpy(v->span_id, o->span_id, 8);
		v->valid = 1;
		v->trace_flags = 0;
		v->attrs_size = 0;
		v->flags = TCTX_OBI;
		return tctx_keep(tgid, v, 0);
	}
	struct task_struct *t = bpf_get_current_task_btf();
	u64 tp = t->TASK_TP, slot = 0, rec = 0;
	if (!tp)
		return 0;
	if (p->go_labels) {
		/* The goroutine the thread runs: m.curg, also on the system
		 * stack (g0) on its behalf (exitsyscall taking a P, a lock in
		 * the runtime); none when parked or idle (dropg). */
		u64 g = 0, lp = 0;
		if (bpf_probe_read_user(&g, 8, (void *)(tp + p->offset)) || !g)
			return 0;
		if (p->go_curg) {
			u64 m = 0;
			if (bpf_probe_read_user(&m, 8, (void *)(g + p->go_m)) || !m ||
			    bpf_probe_read_user(&g, 8, (void *)(m + p->go_curg)) || !g)
				return 0;
		}
		if (bpf_probe_read_user(&lp, 8, (void *)(g + p->go_labels)) || !lp)
			return 0;
		u64 id = go_link_read(tgid, lp, p->go_layout, go_gc_cycles(p->go_gc));
		return id ? id | 1ULL << TCTX_GO_BIT : 0;
	}
	if (p->module) {
		u64 dtv = 0, blk = 0;
		if (bpf_probe_read_user(&dtv, 8, (void *)(tp + 8)) || !dtv)
			return 0;
		if (bpf_probe_read_user(&blk, 8, (void *)(dtv + (u64)p->module * 16)) || !blk || blk == ~0ULL)
			return 0; /* the module's block not allocated for this thread */
		slot = blk + p->offset;
	} else {
		slot = tp + p->offset;
	}
	if (bpf_probe_read_user(&rec, 8, (void *)slot) || !rec)
		return 0;
	if (bpf_probe_read_user(v, TCTX_HEAD, (void *)rec) || v->valid != 1)
		return 0;
	v->flags = 0;
	return tctx_keep(tgid, v, rec);
}

#endif
