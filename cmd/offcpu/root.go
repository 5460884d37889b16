package main

import (
	"github.com/spf13/cobra"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "offcpu",
		Short: "eBPF off-CPU and wake-up profiler",
		Long: `offcpu records where threads block, for how long and with which user and
kernel stacks, aggregated in the kernel, and writes pprof profiles and
folded stacks that go tool pprof, flamegraph.pl and speedscope read.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRecordCmd(), newDispatchCmd(), newAnalyzeCmd(), newDiffCmd(), newBenchCmd(), newFlamegraphCmd())
	return root
}
