/* A Go program's pprof labels (runtime/pprof.Do, SetGoroutineLabels):
 * the set a goroutine's g.labels points to, read into go_links once per
 * set. Included by the goroutine probe (at a park) and by the thread
 * programs (a Go thread's own goroutine at a walked wait). The includer
 * defines GO_LINKS_MAX (the map's size), GO_LINK_KEPT() and GO_LINK_LOST()
 * (its counters). */
#ifndef OFFCPU_GOLINKS_H
#define OFFCPU_GOLINKS_H

#include "offcpu_types.h"
#include <bpf/bpf_helpers.h>
#include "goroutines_shared.h"

#ifndef GO_LINKS_MAX
#define GO_LINKS_MAX 1024
#endif
#ifndef GO_LINK_KEPT
#define GO_LINK_KEPT()
#define GO_LINK_LOST()
#endif

/* A label set by its id: the labelMap's address, its array's and length
 * (a map's hash seed too), and the GC cycles completed when it was read
 * (runtime.memstats.numgc): a set read in cycle n is alive then, so it is
 * not freed before cycle n+1's sweep, and a later set at its address is
 * read in a later cycle. Without the count (a stripped executable) a
 * freed set's address reused can take its id. */
struct go_link_key {
	u32 tgid;
	u32 pad;
	u64 id;
};

struct go_label {
	u8 klen, vlen; /* bytes held */
	char key[GO_LINK_KEY];
	char value[GO_LINK_VALUE];
};

struct go_link_val {
	u32 n; /* labels held */
	u32 flags;
	struct go_label l[GO_LINK_LABELS];
};

/* User space moves these out every quarter second (and at the stop): a
 * set is read once per burst of waits, not once per wait. Each object
 * has its own. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, GO_LINKS_MAX); /* preallocated: an update allocates nothing */
	__type(key, struct go_link_key);
	__type(value, struct go_link_val);
} go_links SEC(".maps");

/* go_link_read's scratch: off the stack, which its caller fills. */
struct go_link_buf {
	u64 hdr[4];
	u8 top[8];
	struct go_link_val v;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, u32);
	__type(value, struct go_link_buf);
} go_link_scratch SEC(".maps");

static __always_inline u64 go_u64(u64 addr)
{
	u64 v = 0;
	if (addr)
		bpf_probe_read_user(&v, sizeof(v), (void *)addr);
	return v;
}

/* One label's strings, from their Go string headers (ptr, len, ptr,
 * len); a string cut short sets GO_LINK_TRUNCATED. */
static __always_inline void go_label_read(struct go_label *l, u64 *hdr, u32 *flags)
{
	u32 kl = hdr[1] > GO_LINK_KEY ? GO_LINK_KEY : hdr[1];
	u32 vl = hdr[3] > GO_LINK_VALUE ? GO_LINK_VALUE : hdr[3];
	if (hdr[1] > GO_LINK_KEY || hdr[3] > GO_LINK_VALUE)
		*flags |= GO_LINK_TRUNCATED;
	l->klen = 0;
	l->vlen = 0;
	if (kl > 0 && kl <= GO_LINK_KEY && !bpf_probe_read_user(l->key, kl, (void *)hdr[0]))
		l->klen = kl;
	if (vl > 0 && vl <= GO_LINK_VALUE && !bpf_probe_read_user(l->value, vl, (void *)hdr[2]))
		l->vlen = vl;
}

/* The GC cycles completed, at gc (runtime.memstats.numgc); 0: not known
 * (a read of address 0 fails and leaves 0). No branch: either way the
 * count is unknown to the verifier, which keeps one state, not two. */
static __always_inline u32 go_gc_cycles(u64 gc)
{
	u32 n = 0;
	bpf_probe_read_user(&n, sizeof(n), (void *)gc);
	return n;
}

/* The label set at lp (a g.labels) of process tgid, laid out as layout
 * says, read in GC cycle gc: its id, read into go_links the first time it
 * is seen; 0: none, or not kept (go_links full: counted). A global
 * function: verified once, apart from the probe that calls it. */
__attribute__((noinline)) u64 go_link_read(u32 tgid, u64 lp, u32 layout, u32 gc)
{
	u32 zero = 0;
	struct go_link_buf *b = bpf_map_lookup_elem(&go_link_scratch, &zero);
	if (!b)
		return 0;
	u64 *hdr = b->hdr;
	u64 h = 14695981039346656037ULL;
	u64 n = 0, arr = 0;
	if (!lp)
		return 0;
	if (layout == GO_LABELS_SLICE) {
		/* labelMap{LabelSet{list []label}}: the array and its length */
		if (bpf_probe_read_user(hdr, 16, (void *)lp))
			return 0;
		arr = hdr[0];
		n = hdr[1];
		h = (h ^ lp) * 1099511628211ULL;
		h = (h ^ arr) * 1099511628211ULL;
		h = (h ^ n) * 1099511628211ULL;
	} else {
		/* *labelMap -> hmap{count, flags, B, noverflow, hash0, buckets} */
		u64 m = go_u64(lp);
		if (!m || bpf_probe_read_user(hdr, 24, (void *)m))
			return 0;
		n = hdr[0];
		arr = hdr[2]; /* bucket 0 */
		h = (h ^ m) * 1099511628211ULL;
		h = (h ^ (hdr[1] >> 32)) * 1099511628211ULL; /* hash0: a random seed per map */
		h = (h ^ arr) * 1099511628211ULL;
		h = (h ^ n) * 1099511628211ULL;
	}
	if (!n || !arr)
		return 0;
	h = (h ^ gc) * 1099511628211ULL;
	if (!h)
		h = 1;
	struct go_link_key k = { .tgid = tgid, .id = h };
	if (bpf_map_lookup_elem(&go_links, &k))
		return h;
	struct go_link_val *v = &b->v;
	v->n = 0;
	v->flags = 0;
	if (layout == GO_LABELS_SLICE) {
		if (n > GO_LINK_LABELS)
			v->flags |= GO_LINK_TRUNCATED;
		for (u32 i = 0; i < GO_LINK_LABELS; i++) {
			if (i >= n || bpf_probe_read_user(hdr, 32, (void *)(arr + i * 32)))
				break;
			go_label_read(&v->l[i], hdr, &v->flags);
			v->n = i + 1;
		}
	} else {
		/* One bucket: tophash[8], keys[8], elems[8]; a map of more than
		 * 8 labels has more buckets, of which the first is read. */
		u8 *top = b->top;
		if (n > 8)
			v->flags |= GO_LINK_TRUNCATED;
		if (bpf_probe_read_user(top, 8, (void *)arr))
			return 0;
		u32 j = 0;
		for (u32 i = 0; i < 8; i++) {
			if (top[i] < 5) /* emptyRest, emptyOne, evacuated: no entry */
				continue;
			if (bpf_probe_read_user(hdr, 16, (void *)(arr + 8 + i * 16)) ||
			    bpf_probe_read_user(&hdr[2], 16, (void *)(arr + 8 + 128 + i * 16)))
				continue;
			if (j >= GO_LINK_LABELS)
				break;
			go_label_read(&v->l[j], hdr, &v->flags);
			j++;
			v->n = j;
		}
	}
	if (!v->n)
		return 0;
	if (bpf_map_update_elem(&go_links, &k, v, BPF_NOEXIST) && !bpf_map_lookup_elem(&go_links, &k)) {
		GO_LINK_LOST();
		return 0;
	}
	GO_LINK_KEPT();
	return h;
}

#endif
