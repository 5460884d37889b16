/* The structures and constants offcpu's BPF programs share with Go
 * (bpf2go generates their Go types from this file's BTF), in the order
 * the programs use them. Kernel views are in offcpu_types.h. */
#pragma once

#include "offcpu_types.h"

#define PERF_MAX_STACK_DEPTH 127

/* unwind_rows' largest size (--unwind-rows). */
#define UNWIND_MAX_ROWS (1 << 24)

/* Why a thread left the CPU; the --state filter is a mask of 1 << state. */
enum offcpu_state {
	STATE_SLEEPING = 0,       /* S (and I: idle kernel threads) */
	STATE_UNINTERRUPTIBLE = 1, /* D */
	STATE_PREEMPTED = 2,      /* R: runnable, waiting for a CPU */
	STATE_OTHER = 3,          /* stopped, traced, dead */
	STATE_UNKNOWN = 4,        /* blocked since before the start, state not seen */
};

/* Every loss and every filtered event is counted; indexes of stats. */
enum offcpu_stat {
	STAT_USTACK_LOST = 0,  /* user stack not stored: stack map full */
	STAT_KSTACK_LOST,      /* kernel stack not stored: stack map full */
	STAT_USTACK_FAULT,     /* user stack unreadable (no frame to walk) */
	STAT_AGG_FULL,         /* aggregation map full: interval dropped */
	STAT_AGG_FULL_NS,      /* off-CPU ns of those dropped intervals */
	STAT_START_FULL,       /* no room to remember a switch-out */
	STAT_NO_START,         /* switch-in of a target blocked since before the start */
	STAT_OUT_OF_RANGE,     /* interval outside --min-block/--max-block (filter, not a loss) */
	STAT_THREADS_FULL,     /* thread-name map full: name taken from /proc later */
	STAT_EVENTS_LOST,      /* new-process notification lost (ring buffer full) */
	STAT_STACKS_REUSED,    /* switch-outs that reused the thread's previous stack ids */
	STAT_WAKE_FULL,        /* wake-up aggregation map full: wake-up dropped */
	STAT_WAKER_STACK_LOST, /* waker stack not stored */
	STAT_WAKES_REUSED,     /* wake-ups that reused the waker's previous stack ids */
	STAT_CPU_FULL,         /* on-CPU samples dropped: map full */
	STAT_DWARF_STACKS,     /* user stacks walked with unwind tables */
	STAT_DWARF_FRAMES,     /* frames those walks found through unwind rows */
	STAT_DWARF_END,        /* walks that reached an outermost frame (thread start) */
	STAT_DWARF_DEPTH,      /* walks cut at the maximum depth */
	STAT_MISSED_IN,        /* switch-ins the program did not see, recovered at the next switch-out */
	STAT_STACKS_STORED,    /* stacks added to the stacks map (user space moves them out when it fills) */
	STAT_THREAD_CPU_FULL,  /* a thread's on-CPU total not stored: thread_cpu map full */
	STAT_FORK_UNWIND_FULL, /* a forked child left to frame pointers: unwind_procs full */
	STAT_OUT_OF_RANGE_NS,  /* off-CPU ns of the STAT_OUT_OF_RANGE intervals */
	STAT_AGG_STORED,       /* keys added to the aggregation map (an agent empties it when it fills) */
	/* Deferred walks (a walk threshold): intervals shorter than it, and
	 * what the estimate of their time rests on. */
	STAT_BELOW_N,          /* intervals below the threshold */
	STAT_BELOW_NS,         /* their exact off-CPU ns */
	STAT_BELOW_WALKED,     /* of them, walked (chosen with probability length / threshold) */
	STAT_BELOW_VAR,        /* sum of length * (threshold - length) >> 10: the estimate's variance */
	STAT_WALK_MISSED,      /* chosen, but no program ran at the switch-in to walk: kept without stacks */
	STAT_WAKER_SKIPPED,    /* wake-ups whose waker stacks were not walked (the wait below the threshold) */
	STAT_IRQ_WAKES_REUSED, /* interrupt wake-ups that reused a kernel stack (same path fingerprint) */
	/* OpenTelemetry thread context (tctx.bpf.h). */
	STAT_TCTX_LINKS,       /* thread-context records read into tctx_links */
	STAT_TCTX_LOST,        /* records not kept: tctx_links full (waits counted without their link) */
	STAT_TCTX_GO_SETS,     /* a Go thread's goroutine's label sets read into go_links */
	STAT_TCTX_GO_LOST,     /* label sets not kept: go_links full (waits counted without their labels) */
	STAT_STREAM_LOST,      /* waits not streamed: the wait ring was full (--timeline) */
	STAT_MAX,
};

/* Who woke a thread. irq set: an interrupt woke it, and tid is 0, or
 * (the wait stream's) the task it interrupted. */
struct waker_rec {
	u32 tgid;
	u32 tid;
	s64 ustack; /* waker stacks (ids in stacks), or negative: none */
	s64 kstack;
	u32 irq;    /* 1: raised in hard or soft interrupt context */
	u32 valid;
	/* The waker's own last wait, where it overlapped the waiter's (a lock
	 * holder that waited on fdatasync while the waiter waited on it): its
	 * stacks; 0 otherwise. The overlap is offcpu_val.chain_ns. */
	s64 wait_ustack;
	s64 wait_kstack;
};

struct offcpu_key {
	u32 tgid;
	u32 tid;
	s64 ustack; /* id in stacks; negative: no stack (-errno) */
	s64 kstack;
	u32 state;  /* enum offcpu_state */
	u32 open;   /* 1: still blocked when recording stopped */
	u32 gen;    /* the thread's incarnation (task_gen): tids are reused */
	u32 sampled; /* 1: below the walk threshold, walked by lot; values weighted by threshold / length */
	struct waker_rec waker; /* who ended the interval (zero: unknown or off) */
	/* A CPython GIL wait: 1, the thread that held the GIL when it began
	 * (0: not known) and that thread's Python stack then (an id in stacks). */
	u32 gil;
	u32 gil_holder;
	s64 gil_holder_stack;
	/* The request the thread waited in: an id in tctx_links (0: none). */
	u64 link;
};

/* One wait of the stream (--timeline), sent as its interval is
 * accounted: switch-out, switch-in (or the window's end, open) and the
 * part before the switch-in spent waiting for a CPU, which puts its
 * wake-up at in_ns - runq_ns. bpf_ktime_get_ns times. */
struct wait_event {
	u64 out_ns;
	u64 in_ns;
	u64 runq_ns;
	u32 tgid;
	u32 tid;
	s64 ustack; /* ids in stacks, or negative: none */
	s64 kstack;
	u64 link;   /* its request (offcpu_key.link) */
	struct waker_rec waker; /* valid 0: no waker known */
	u32 gen;
	u8 state;
	u8 open;
	u8 gil;
	u8 pad;
	u32 gil_holder;
	u32 pad2;
};

struct wake_key {
	u32 target_tgid;
	u32 target_tid;
	u32 target_gen; /* the woken thread's incarnation (tp_btf; 0 classic) */
	u32 pad;
	struct waker_rec waker; /* valid is always 1 */
};

struct offcpu_val {
	u64 ns;      /* total off-CPU nanoseconds: switch-out to switch-in */
	u64 count;   /* number of off-CPU intervals */
	u64 runq_ns; /* of ns, waiting for a CPU: from the wake-up to the
		      * switch-in, or all of a preempted interval */
	u64 chain_ns; /* of ns, before the wake-up, the waker was itself off
		       * a CPU in waker.wait_ustack/wait_kstack */
};

/* A thread incarnation (tids are reused). */
struct thread_key {
	u32 tid;
	u32 gen; /* task_gen */
};

/* A thread's exact time on a CPU inside the window, from the scheduler's
 * own accounting (se.sum_exec_runtime) between its switches. */
struct thread_cpu {
	u32 tgid;
	u32 pad;
	u64 oncpu_ns;
	/* Deferred walks: the exact time and number of its intervals below the
	 * threshold, by state, what its sampled keys estimate. */
	u64 below_ns[4];
	u64 below_n[4];
};

struct thread_info {
	u32 tgid;
	u32 gen; /* task_gen: which thread of that tid */
	char comm[16];
};

/* Process events, read by user space as they come (rare: not per switch). */
enum proc_event_kind {
	EV_SEEN = 0,        /* a new process: snapshot its mappings */
	EV_EXEC = 1,        /* an exec: its new code mappings follow as EV_MAPs */
	EV_FORK = 2,        /* a new process runs its parent's code until it execs */
	EV_EXIT = 3,        /* a process's leader exited: free what is kept per process */
	EV_THREAD_EXIT = 4, /* a thread's last switch-out: its name leaves the threads map */
	EV_MAP = 5,         /* a code mapping (struct map_event) */
	EV_REREAD = 6,      /* a code mapping the kernel could not describe: read /proc */
};

struct proc_event {
	u32 kind;
	u32 tgid;
	u32 tid;
	u32 parent; /* EV_FORK: the parent's tgid */
	u32 gen;    /* EV_THREAD_EXIT: task_gen */
	char comm[16];
};

#define MAP_PATH_DEPTH 16

#define MAP_NAME_LEN 64

/* A code mapping captured when it is made (exec, mmap), so that a process
 * that exits within milliseconds is symbolized without /proc. The file is
 * named by its dentries, innermost first, and identified by device and
 * inode, which user space checks against the path it opens. */
struct map_event {
	u32 kind; /* EV_MAP */
	u32 tgid;
	u64 start;
	u64 end;
	u64 offset; /* file offset of start */
	u64 ino;
	u32 dev; /* kernel dev_t: major << 20 | minor */
	u32 depth;
	char names[MAP_PATH_DEPTH][MAP_NAME_LEN];
};

struct stack_buf {
	u64 ips[PERF_MAX_STACK_DEPTH]; /* leaf first, zero-filled after the last */
};

/* How the unwinder finds the caller at a pc (collector/unwind.Kind). */
enum unwind_kind {
	UNWIND_RSP = 0, /* CFA = rsp + cfa_off */
	UNWIND_RBP,     /* CFA = rbp + cfa_off */
	UNWIND_END,     /* outermost frame: the thread's start */
	UNWIND_NONE,    /* no rule: follow the frame pointer */
	UNWIND_PLT,     /* PLT stub: CFA = rsp + 8, + 8 when (pc & 15) >= rbp_off */
	UNWIND_JAVA_INTERP, /* HotSpot interpreter frame: rbp frame holding its Method* */
	UNWIND_JAVA_COMPILED, /* HotSpot compiled method: as UNWIND_RSP, its pc noted */
	UNWIND_JAVA_GAP,      /* HotSpot code cache, no blob known here yet: frame pointer, pc noted */
};

/* HotSpot's x86-64 interpreter frame (frame_x86.hpp, JDK 9-25), in words
 * from rbp: the bcp at -8, the Method* at -3, the caller's sp at -1 (the
 * caller may be compiled code whose sp an adapter moved), the caller's
 * rbp at 0 and the return address at 1. The frame's entry in the stack
 * is the Method* with this tag in its top bits (user addresses are below
 * 1 << 47) and its bci. */
#define JAVA_METHOD_TAG 0xa000000000000000ULL
#define JAVA_METHOD_MASK 0x00007fffffffffffULL
/* The frame's bci rides in the bits a Method* leaves free: its low 3
 * bits in the Method*'s (8-byte aligned) low bits, the rest in bits
 * 47-59. JAVA_BCI_NONE: not known. */
#define JAVA_BCI_NONE 0xffffULL

/* A JVM's layout for bcis: where Method* points to its ConstMethod, and
 * the ConstMethod's size (its bytecodes follow it). */
struct java_proc {
	u32 const_method_off;
	u32 const_method_size;
};

/* What user space names while the process lives: a Method* seen in an
 * interpreter frame (kind 0), or a pc in a compiled method (kind 1),
 * whose inlined methods are read from the method's debug information;
 * or a pc in code compiled since user space last read the code cache
 * (kind 2), which has it read again. */
struct java_method_key {
	u32 tgid;
	u32 kind;
	u64 method; /* or the pc */
};

/* A row's kind byte: the kind (enum unwind_kind) in its low bits, flags
 * in its high ones. */
#define UNWIND_KIND_MASK 0x0f
/* Flag: code of the process's interpreter loop (CPython's
 * _PyEval_EvalFrameDefault): the runtime's frames that activation runs
 * are recorded in its place, by the runtime whose layout the process has.
 * A Python frame's entry in a stack is its code object with PY_FRAME_TAG
 * in the top bits and the index of the instruction it is at in bits 47-60
 * (PY_INSTR_NONE: not known). */
#define UNWIND_INTERP_LOOP 0x80
/* Flag: cfa_off in units of 8 bytes: a frame larger than 32 KiB
 * (select() keeps three fd_sets on its stack). */
#define UNWIND_CFA_X8 0x40
/* arm64 rows (AAPCS64: the return address in x30, the frame pointer x29
 * saved just below it in a frame record): with neither flag the caller's
 * x29 is at CFA + 8 * rbp_off and the return address 8 above it. */
/* Flag: the return address is still in x30 (a function's entry, a leaf,
 * an epilogue's end) and x29 unchanged: only the innermost frame. */
#define UNWIND_RA_LR 0x10
/* Flag: the return address is at CFA + 8 * rbp_off and x29 unchanged. */
#define UNWIND_RA_NO_FP 0x20
#define PY_FRAME_TAG 0xc000000000000000ULL
#define PY_INSTR_NONE 0x3fffULL

/* py_proc.flags */
#define PY_INSTR_PTR 1   /* frame_instr is a pointer to the instruction (3.11+), else an index (f_lasti) */
#define PY_ONE_PER_EVAL 2 /* each interpreter activation runs one frame (3.10 and older) */
#define PY_ENTRY_SHIM 4  /* the entry frame is a shim, not shown (3.12+: owner FRAME_OWNED_BY_CSTACK) */
#define PY_CFRAME 8      /* tstate_frame points to a _PyCFrame holding the frame (3.11, 3.12) */

/* A CPython process's layout (from CPython's own headers for its version)
 * and addresses. Offsets are bytes; frame offsets are below 112. */
struct py_proc {
	u64 interp_head; /* &_PyRuntime.interpreters.head */
	u64 gil;         /* the GIL's struct: a futex wait inside it is a GIL wait */
	u32 gil_size;
	u16 gil_holder;  /* its last_holder (a PyThreadState *) */
	u16 threads_head; /* PyInterpreterState: its first thread state */
	u16 tstate_next, tstate_thread_id, tstate_native_id, tstate_frame;
	u16 cframe_frame; /* _PyCFrame.current_frame (PY_CFRAME) */
	u16 frame_code, frame_back, frame_instr, frame_entry;
	u16 code_first_instr; /* a code object's first instruction (PY_INSTR_PTR) */
	u8 entry_val;     /* frame_entry's byte on an entry frame */
	u8 flags;
};

/* A code object seen in a stack, for user space to name while the process
 * lives. */
struct py_code_key {
	u32 tgid;
	u32 pad;
	u64 code;
};

/* What a user stack entry is, by its top three bits (user addresses are
 * below 1 << 47): native code, or a runtime's frame named by user space
 * from the runtime's own structures (collector.FrameKindOf). */
enum frame_kind {
	FRAME_NATIVE = 0,
	FRAME_V8 = 4,     /* V8_FRAME_TAG */
	FRAME_JAVA = 5,   /* JAVA_METHOD_TAG */
	FRAME_PYTHON = 6, /* PY_FRAME_TAG */
};
#define FRAME_KIND_SHIFT 61

/* V8 (Node.js). A JavaScript frame's entry in a stack is its function's
 * SharedFunctionInfo (a tagged pointer) with V8_FRAME_TAG in the top bits
 * and, for an interpreted frame, its bytecode offset slot's value in bits
 * 47-60 (V8_OFFSET_NONE: not known). */
#define V8_FRAME_TAG 0x8000000000000000ULL
#define V8_SFI_MASK 0x00007fffffffffffULL
#define V8_OFFSET_NONE 0x3fffULL
#define V8_TAG_MASK 3ULL  /* kHeapObjectTagMask */
#define V8_HEAP_TAG 1ULL  /* kHeapObjectTag */
/* A frame's words read, from bp - 40 (an interpreted frame's bytecode
 * offset) to bp + 8 (the return address). */
#define V8_FRAME_WORDS 7

/* A V8 process's layout (from its binary's v8dbg_* constants) and the
 * interpreter's entry trampoline, whose frames are interpreted ones. */
struct v8_proc {
	u64 interp_lo, interp_hi;
	u32 function_shared; /* JSFunction: its SharedFunctionInfo */
	u32 smi_shift;       /* a Smi's value: the word shifted right by this */
};

/* A SharedFunctionInfo seen in a stack, for user space to name while the
 * process lives. */
struct v8_sfi_key {
	u32 tgid;
	u32 pad;
	u64 sfi;
};

/* One row of a file's unwind table, valid up to the next row's pc. The
 * return address is at CFA - 8. */
struct unwind_row {
	u32 pc;      /* ELF virtual address */
	s16 cfa_off;
	u8 kind;     /* enum unwind_kind */
	s8 rbp_off;  /* caller's rbp at CFA + 8 * rbp_off; 0: rbp unchanged */
};

#define UNWIND_MAX_MAPS 64

struct unwind_map {
	u64 start, end;   /* executable mapping [start, end) */
	u64 bias;         /* ELF virtual address = pc - bias */
	u32 first, count; /* its file's rows in unwind_rows */
};

/* A process whose code needs unwind tables: its mappings that have them,
 * sorted by start. Mappings absent here are walked by frame pointers. */
struct unwind_proc {
	u32 n;
	u32 gen;   /* changes with the entry: cached stacks walked before are stale */
	u32 execs; /* execs seen while recording: user space writes only an entry of the image it knows */
	u32 pad;
	struct unwind_map maps[UNWIND_MAX_MAPS];
};

/* A file whose rows are loaded, by identity: where its code segment is
 * in the file and where its rows are. Written by user space when it
 * loads a file's rows; read when a process maps the file, so that the
 * process's entry in unwind_procs is made at once, in the kernel, not
 * when user space gets to it (a process living for milliseconds has
 * often slept by then). */
struct file_key {
	u64 ino;
	u32 dev; /* kernel dev_t */
	u32 pad;
};

struct file_unwind {
	u64 seg_off, seg_end; /* file offsets of the code segment [page start, end) */
	s64 off_vaddr;        /* its file offset less its virtual address */
	u32 first, count;     /* its rows in unwind_rows */
};

struct cpu_key {
	u32 tgid;
	u32 tid;
	s64 ustack;
	s64 kstack;
	u32 gen; /* the thread's incarnation (task_gen) */
	u32 pad;
};

#define PRESTART_DEPTH 40

/* A thread blocked since before the recording started: its time from the
 * start of the window and its kernel stack (its user stack cannot be read
 * from another task's context). */
struct prestart_val {
	u64 ns;    /* off-CPU time inside the window */
	u64 runq_ns; /* of ns, waiting for a CPU after its wake-up */
	u32 tgid;
	u32 gen;   /* task_gen */
	u32 state; /* enum offcpu_state */
	u32 whole; /* 1: still blocked when recording stopped */
	u32 kthread;
	s64 ustack; /* id in stacks, from the walk at the start; negative: none */
	u64 kstack[PRESTART_DEPTH]; /* kernel return addresses, leaf first, 0-terminated */
};

/* OpenTelemetry thread context (OTEP 4947): where a process keeps its
 * otel_thread_ctx_v1, a pointer to the record of the request its thread
 * serves. Static TLS: the variable's offset from the thread pointer;
 * dynamic TLS (module != 0): its offset in the module's block, found
 * through glibc's DTV. A Go process (go_labels != 0): offset is where
 * the thread's current g is kept from the thread pointer, go_labels
 * g.labels' offset, go_layout how the set is laid out (GO_LABELS_*). */
struct tctx_proc {
	s64 offset;
	u32 module;
	u16 go_labels;
	u8 go_layout;
	u8 pad;
	u64 go_gc; /* runtime.memstats.numgc's address; 0: not known */
	u16 go_m;    /* g.m's offset */
	u16 go_curg; /* m.curg's offset; 0: not known */
	u32 pad2;
};

/* The record's fixed head (28 bytes) and its attributes: key index,
 * length, value, packed; the first TCTX_ATTRS bytes are read. */
#define TCTX_HEAD 28
#define TCTX_ATTRS 612
#define TCTX_TRUNCATED 1 /* tctx_link.flags: attributes cut at TCTX_ATTRS */
#define TCTX_OBI 2       /* tctx_link.flags: from otel_traces_ctx_v1 */
/* A wait's link with this bit (1 << TCTX_GO_BIT) names a Go label set in
 * the thread programs' go_links, without it a record in tctx_links. */
#define TCTX_GO_BIT 63
/* tctx_sources */
#define TCTX_SRC_PROCS 1 /* some process in tctx_procs */
#define TCTX_SRC_OBI 2   /* otel_traces_ctx_v1 not empty */

struct tctx_key {
	u32 tgid;
	u32 pad;
	u64 id; /* a hash of the trace and span ids */
};

/* OTEP 4855's value: a thread's trace context. */
struct obi_trace_ctx {
	u8 trace_id[16];
	u8 span_id[8];
};

struct tctx_link {
	u8 trace_id[16];
	u8 span_id[8];
	u8 valid;
	u8 trace_flags;
	u16 attrs_size;
	u8 flags;
	u8 pad[3];
	u8 attrs[TCTX_ATTRS];
};
