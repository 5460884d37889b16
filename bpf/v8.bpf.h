/* V8 (Node.js): JavaScript frames named from V8's own layout (its
 * v8dbg_* constants, read by user space from the binary). The walker
 * follows V8's frames by their frame pointer; a frame whose context slot
 * holds a heap object is a JavaScript frame, and its function's
 * SharedFunctionInfo is recorded in its place. */
#ifndef OFFCPU_V8_H
#define OFFCPU_V8_H

#include "common.bpf.h"

/* Set by user space while v8_procs holds a process: a walk of another
 * process looks nothing up. */
volatile u32 v8_active = 0;

/* Key: tgid. Value: v8_proc, written by user space for each process that
 * maps V8. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, u32);
	__type(value, struct v8_proc);
} v8_procs SEC(".maps");

/* Key: v8_sfi_key. Value: unused. SharedFunctionInfos seen in stacks, for
 * user space to name while the process lives and remove. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct v8_sfi_key);
	__type(value, u8);
} v8_sfis SEC(".maps");

/* Functions handed to user space lately, per CPU, by a hash of the
 * SharedFunctionInfo's address. */
#define V8_SEEN_SLOTS 1024
struct v8_seen {
	u64 sfi;
	u32 tgid, pad;
};
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, V8_SEEN_SLOTS);
	__type(key, u32);
	__type(value, struct v8_seen);
} v8_seen SEC(".maps");

/* The stack entry of a JavaScript frame at frame pointer bp, or 0 for a
 * frame of another kind (a stub, an exit, native code). fr: a frame_buf
 * holding the V8_FRAME_WORDS words from bp - 40 to bp + 8; the rest of it
 * is scratch (the walker's callback has little stack left). */
static __always_inline u64 v8_frame(struct v8_proc *vp, u32 tgid, u64 pc, u64 *fr, struct task_struct *task,
				    bool remote)
{
	u64 ctx = fr[V8_FRAME_WORDS - 1 - 2];  /* bp - 8 */
	u64 func = fr[V8_FRAME_WORDS - 1 - 3]; /* bp - 16 */
	/* A typed frame holds a marker (a small integer) where a JavaScript
	 * frame holds its context; both slots of a JavaScript frame are
	 * heap objects (tagged: low bit set). */
	if ((ctx & V8_TAG_MASK) != V8_HEAP_TAG || (func & V8_TAG_MASK) != V8_HEAP_TAG || func > V8_SFI_MASK)
		return 0;
	struct v8_sfi_key *k = (struct v8_sfi_key *)&fr[V8_FRAME_WORDS];
	if (read_user(&k->sfi, sizeof(k->sfi), func - V8_HEAP_TAG + vp->function_shared, task, remote))
		return 0;
	u64 sfi = k->sfi;
	if ((sfi & V8_TAG_MASK) != V8_HEAP_TAG || sfi > V8_SFI_MASK)
		return 0;
	u64 off = V8_OFFSET_NONE;
	if (pc >= vp->interp_lo && pc < vp->interp_hi) {
		/* An interpreted frame: its bytecode offset slot (a Smi). */
		u64 smi = fr[V8_FRAME_WORDS - 1 - 6]; /* bp - 40 */
		if (!(smi & 1)) {
			u64 v = smi >> (vp->smi_shift & 63);
			off = v < V8_OFFSET_NONE ? v : V8_OFFSET_NONE;
		}
	}
	k->tgid = tgid;
	k->pad = 0;
	/* User space names each function once: a per-CPU filter of the ones
	 * already handed over saves a hash map update at most frames. */
	u32 slot = (u32)((sfi >> 3) ^ (sfi >> 17) ^ tgid) & (V8_SEEN_SLOTS - 1);
	struct v8_seen *seen = bpf_map_lookup_elem(&v8_seen, &slot);
	if (seen && seen->sfi == sfi && seen->tgid == tgid)
		return V8_FRAME_TAG | (off << 47) | sfi;
	u8 *one = (u8 *)&fr[V8_FRAME_WORDS + 2];
	*one = 1;
	if (bpf_map_update_elem(&v8_sfis, k, one, BPF_NOEXIST) != -E2BIG && seen) {
		seen->sfi = sfi;
		seen->tgid = tgid;
	}
	return V8_FRAME_TAG | (off << 47) | sfi;
}

#endif
