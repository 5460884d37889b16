/* The constants the goroutine probe shares with Go (bpf/constants_gen.go
 * is generated from this file; the structures come from bpf2go). */
#pragma once

#define GO_STACK_DEPTH 32 /* frames of a parked goroutine's stack */

/* go_key.reason of a goroutine put back on a run queue (preempted,
 * yielded, or back from a system call without a P): above any of the
 * runtime's (a uint8). */
#define GO_REASON_RUNNABLE 0x100

/* go_key.flags */
#define GO_BEFORE_START 1 /* the wait began before the window (or the probe) */

/* runtime.g's first words read in one go (each field the probe needs at
 * a multiple of 8 below G_BASE_WORDS * 8): a power of two, indexes are
 * masked. */
#define G_BASE_WORDS 32

/* A goroutine's pprof labels, read at its park (go_link_val): at most
 * GO_LINK_LABELS pairs, a key's first GO_LINK_KEY bytes and a value's
 * first GO_LINK_VALUE (a W3C trace id is 32, a span id 16). */
#define GO_LINK_LABELS 8
#define GO_LINK_KEY 32
#define GO_LINK_VALUE 64

/* go_offsets.label_layout: how runtime/pprof keeps a goroutine's labels
 * (g.labels points to its labelMap). */
#define GO_LABELS_NONE 0  /* not known: no labels read */
#define GO_LABELS_MAP 1   /* go1.19 to go1.23: map[string]string */
#define GO_LABELS_SLICE 2 /* go1.24 on: a sorted slice of {key, value} */

/* go_link_val.flags */
#define GO_LINK_TRUNCATED 1 /* more labels than were read, or a string cut short */
