package main

import (
	"encoding/json"
	"fmt"
	"io"

	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/collector"
	"github.com/offcpu/offcpu/kernel"
)

func newKernelCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "kernel",
		Short: "Check what offcpu can use on this kernel (BPF facilities, each program's verification)",
		Long: `kernel probes the BPF facilities offcpu uses, then loads every program of
each attach mode (tp_btf, tp_btf with walks at the switch-in for
--walk-threshold/--budget, classic tracepoints) without attaching them, and
prints what the kernel's verifier said: loaded or why not, the instructions
it processed against its limit, and the stack depth of each function.
Needs root (or CAP_BPF and CAP_PERFMON).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := collector.CheckKernel(collector.Options{})
			if err != nil && r == nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if e := enc.Encode(r); e != nil {
					return e
				}
			} else {
				printKernel(cmd.OutOrStdout(), r)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

func printKernel(w io.Writer, r *kernel.Report) {
	fmt.Fprintf(w, "kernel %s: recordings attach %s", r.Release, r.Attach)
	if r.Deferred {
		fmt.Fprint(w, ", --walk-threshold and --budget available")
	} else {
		fmt.Fprint(w, ", --walk-threshold and --budget not available (stacks walked at every switch-out)")
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "facility\tsince\thave\tneeded for")
	for _, f := range r.Features {
		have := "yes"
		if !f.Have {
			have = "NO"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Name, f.Since, have, f.For)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mode\tprogram\tverified\tinsns\tmargin\tstack")
	for _, p := range r.Programs {
		status := "ok"
		if !p.Loaded {
			status = "REJECTED: " + p.Error
		}
		margin := ""
		if p.Limit > 0 {
			margin = fmt.Sprintf("%.0f%%", 100*p.Margin())
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Mode, p.Name, status, p.Insns, margin, p.Stack)
	}
	tw.Flush()
}
