//go:build ctls

package main

// C thread-local storage in the executable: linked externally, Go's g
// shares the executable's TLS block with it, no longer at -8.

/*
__thread long golabels_ctls[6];
long golabels_touch(void) { return ++golabels_ctls[0]; }
*/
import "C"

func init() { C.golabels_touch() }
