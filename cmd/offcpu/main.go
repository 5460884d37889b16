// Command offcpu records where threads block and who wakes them.
package main

import (
	"errors"
	"fmt"
	"os"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		var ee *exitError
		if errors.As(err, &ee) {
			if ee.msg != "" {
				fmt.Fprintln(os.Stderr, "offcpu:", ee.msg)
			}
			os.Exit(ee.code)
		}
		fmt.Fprintln(os.Stderr, "offcpu:", err)
		os.Exit(1)
	}
}

// exitError carries a specific exit status, such as a recorded command's.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }
