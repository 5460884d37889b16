package schema

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// Folded stacks (flamegraph.pl, bcc -f, speedscope): one line per stack,
// "frame;frame;... VALUE", root first. offcpu writes the thread first and
// "-" between user and kernel frames.

// FoldedFrame makes a frame name safe inside a folded line.
func FoldedFrame(name string) string { return strings.ReplaceAll(name, ";", ":") }

// ScanFolded calls fn with each stack (without its value) and value of
// folded text b, skipping blank and '#' lines. The stack refers to b.
func ScanFolded(b []byte, fn func(stack []byte, value int64) error) error {
	for n := 1; len(b) > 0; n++ {
		var l []byte
		if end := bytes.IndexByte(b, '\n'); end < 0 {
			l, b = b, nil
		} else {
			l, b = b[:end], b[end+1:]
		}
		l = bytes.TrimSpace(l)
		if len(l) == 0 || l[0] == '#' {
			continue
		}
		sp := bytes.LastIndexByte(l, ' ')
		if sp < 0 {
			return fmt.Errorf("line %d: no value at the end: not folded stacks", n)
		}
		v, err := strconv.ParseInt(string(l[sp+1:]), 10, 64)
		if err != nil {
			return fmt.Errorf("line %d: value %q is not a number: not folded stacks", n, l[sp+1:])
		}
		if err := fn(bytes.TrimRight(l[:sp], " "), v); err != nil {
			return err
		}
	}
	return nil
}
