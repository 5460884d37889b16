// Command gosleepers runs N goroutines that sleep 1 ms in a loop until
// killed: a goroutine's time is almost all waits, back to back.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func sleeper() {
	for {
		time.Sleep(time.Millisecond)
	}
}

func main() {
	n := 4
	if len(os.Args) > 1 {
		n, _ = strconv.Atoi(os.Args[1])
	}
	for i := 0; i < n; i++ {
		go sleeper()
	}
	fmt.Println("ready")
	select {}
}
