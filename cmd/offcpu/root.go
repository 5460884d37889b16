package main

import (
	"github.com/spf13/cobra"
)

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "offcpu",
		Short: "eBPF off-CPU and wake-up profiler",
		Long: `offcpu records where threads block and who wakes them (eBPF, aggregated in the
kernel), attributes the blocked time to causes, and compares a baseline with
a candidate: interleaved runs, statistics, attribution and flame graphs.
Profiles are pprof files (go tool pprof) and folded stacks (flamegraph.pl,
speedscope).

Start with 'sudo offcpu bench': the whole method on the bundled broker
dispatch core, written as a Measurements report.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newRecordCmd(), newDispatchCmd(), newAnalyzeCmd(), newDiffCmd(), newBenchCmd(), newFlamegraphCmd(), newKernelCmd(), newExpectCmd())
	return root
}
