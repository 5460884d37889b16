/* The constants the goroutine probe shares with Go (bpf/constants_gen.go
 * is generated from this file; the structures come from bpf2go). */
#pragma once

#define GO_STACK_DEPTH 32 /* frames of a parked goroutine's stack */

/* go_key.flags */
#define GO_BEFORE_START 1 /* the wait began before the window (or the probe) */

/* runtime.g's first words read in one go (each field the probe needs at
 * a multiple of 8 below G_BASE_WORDS * 8): a power of two, indexes are
 * masked. */
#define G_BASE_WORDS 32
