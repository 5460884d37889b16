package collector_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/offcpu/offcpu/collector"
)

// Record this process for a moment and write what it was blocked on.
// Needs root (or CAP_BPF and CAP_PERFMON).
func Example() {
	s, err := collector.Start(context.Background(), collector.Options{
		PIDs:     []int{os.Getpid()},
		MinBlock: 100 * time.Microsecond,
	})
	if err != nil {
		log.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the work being profiled
	prof, err := s.Stop()
	if err != nil {
		log.Fatal(err)
	}
	out, err := os.Create("offcpu.pb.gz")
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	if err := prof.Write(out); err != nil {
		log.Fatal(err)
	}
	st := s.Stats()
	fmt.Printf("%d intervals, %v off-CPU, %d lost\n", st.Intervals, st.OffCPU, st.Lost())
}
