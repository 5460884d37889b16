package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/offcpu/offcpu/workload/dispatcher"
)

type dispatchFlags struct {
	scenario  string
	variant   string
	messages  int64
	duration  time.Duration
	rate      float64
	producers int
	consumers int
	churn     time.Duration
	jsonOut   string
	list      bool
	quiet     bool
	pin       bool
	drain     time.Duration
}

func newDispatchCmd() *cobra.Command {
	f := &dispatchFlags{}
	cmd := &cobra.Command{
		Use:   "dispatch",
		Short: "Run the bundled broker dispatch core (a Go model of Pulsar's Shared and Key_Shared dispatch)",
		Long: `Run the bundled dispatch core: broker IO event loops (broker-io-N) on epoll with
eventfd wake-ups, the managed-ledger thread (ml-worker), topic workers, and
producer and consumer clients over unix sockets, all in this process. Every
run verifies that every message reached every subscription, with no
duplicates, no per-key order violation and no corrupted payload, and exits
non-zero on any violation.`,
		Example: `  offcpu dispatch --variant baseline --json base.json
  offcpu dispatch --scenario telemetry-high-rate --rate 10000 --duration 5s
  sudo offcpu record -o run.pb.gz -- offcpu dispatch --variant candidate`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if f.list {
				return listDispatch(cmd.OutOrStdout())
			}
			return runDispatch(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.scenario, "scenario", "key-shared-500x20", "built-in scenario name or YAML file ("+strings.Join(dispatcher.ScenarioNames(), ", ")+")")
	fl.StringVar(&f.variant, "variant", "baseline", "side of the scenario's change: baseline or candidate (see --list)")
	fl.Int64Var(&f.messages, "messages", 0, "messages to publish (overrides the scenario)")
	fl.DurationVar(&f.duration, "duration", 0, "publish for this long instead of a message count")
	fl.Float64Var(&f.rate, "rate", -1, "total publish rate in msg/s (0: as fast as possible)")
	fl.IntVar(&f.producers, "producers", 0, "producers (overrides the scenario)")
	fl.IntVar(&f.consumers, "consumers", 0, "consumers per subscription (overrides the scenario)")
	fl.DurationVar(&f.churn, "churn", -1, "a consumer leaves and a new one joins this often (0: never)")
	fl.StringVar(&f.jsonOut, "json", "", "write the run's metrics as JSON to this file")
	fl.BoolVar(&f.list, "list", false, "list the scenarios and variants")
	fl.BoolVarP(&f.quiet, "quiet", "q", false, "print no progress")
	fl.DurationVar(&f.drain, "drain", 60*time.Second, "after publishing, wait this long for every message to be delivered")
	fl.BoolVar(&f.pin, "pin", false, "put broker threads on the first half of the CPUs, clients on the rest")
	return cmd
}

func listDispatch(w io.Writer) error {
	fmt.Fprintln(w, "scenarios:")
	for _, n := range dispatcher.ScenarioNames() {
		s, _ := dispatcher.LoadScenario(n)
		fmt.Fprintf(w, "  %-22s %s\n", n, s.Description)
	}
	for _, ch := range dispatcher.Changes() {
		fmt.Fprintf(w, "variants of change %s (scenarios with change: %s):\n", ch, ch)
		for _, v := range dispatcher.ChangeVariants(ch) {
			fmt.Fprintf(w, "  %-22s %s\n", v[0], v[1])
		}
	}
	return nil
}

// scenarioFromFlags loads a scenario and applies the scaling flags.
func scenarioFromFlags(name string, messages int64, duration time.Duration, rate float64, producers, consumers int, churn time.Duration) (dispatcher.Scenario, error) {
	sc, err := dispatcher.LoadScenario(name)
	if err != nil {
		return sc, err
	}
	return sc.Scaled(dispatcher.Scale{Messages: messages, Duration: duration, Rate: rate, Producers: producers, Consumers: consumers, Churn: churn})
}

func runDispatch(cmd *cobra.Command, f *dispatchFlags) error {
	sc, err := scenarioFromFlags(f.scenario, f.messages, f.duration, f.rate, f.producers, f.consumers, f.churn)
	if err != nil {
		return err
	}
	if err := sc.CheckVariant(f.variant); err != nil {
		return err
	}
	if f.jsonOut != "" {
		if err := checkWritable(f.jsonOut); err != nil {
			return err
		}
	}
	stderr := cmd.ErrOrStderr()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	cfg := dispatcher.Config{Scenario: sc, Variant: f.variant, Pin: f.pin, Drain: f.drain}
	if !f.quiet {
		fmt.Fprintf(stderr, "offcpu dispatch: %s, variant %s, pid %d\n", sc.Name, f.variant, os.Getpid())
		cfg.Progress = stderr
	}
	res, runErr := dispatcher.Run(ctx, cfg)
	if res == nil {
		return runErr
	}
	if f.jsonOut != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		if err := os.WriteFile(f.jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", f.jsonOut, err)
		}
	}
	printDispatch(cmd.OutOrStdout(), res)
	if runErr != nil {
		return &exitError{code: 130, msg: "interrupted: partial results written"}
	}
	if err := res.Verify(); err != nil {
		return &exitError{code: 2, msg: err.Error()}
	}
	return nil
}

func printDispatch(w io.Writer, r *dispatcher.Result) {
	fmt.Fprintf(w, "%s / %s: published %d in %.1fs (%.0f msg/s), publish p50 %.2f ms p99 %.2f ms, end-to-end p50 %.2f ms p99 %.2f ms\n",
		r.Scenario, r.Variant, r.Published, r.DurationS, r.PublishRate, r.PublishP50ms, r.PublishP99ms, r.E2EP50ms, r.E2EP99ms)
	fmt.Fprintf(w, "broker CPU %.2fs (%.1f µs/msg), eventfd wake-ups %.2f/msg, monitor waits %d, flow tasks %d, %.1f entries/read\n",
		r.BrokerCPUs, r.CPUPerMsgUs, r.WakeupsPerMsg, r.MonitorWaits, r.FlowTasks, r.EntriesPerRead)
	if r.RateLimitBytesPerS > 0 {
		fmt.Fprintf(w, "throttling: %.0f bytes/s published against a limit of %.0f (%.1f×), publish p50/p99 %.0f/%.0f ms in the first seconds and %.0f/%.0f ms in the last, reading turned off %d times (%d by the connection's own handleSend), %d checks\n",
			r.PublishBytesPerS, r.RateLimitBytesPerS, r.RateOverLimit, r.PublishFirstP50ms, r.PublishFirstP99ms, r.PublishLastP50ms, r.PublishLastP99ms, r.AutoReadOff, r.AutoReadOffBySend, r.ThrottleChecks)
	}
	if r.ScenarioDetails.Topics > 1 {
		fmt.Fprintf(w, "applications: %.0f msg/s received, CPU %.2fs (%.2f µs/msg), %d batch receives timed out (%d empty), %.2f timer tasks/msg (%.2f called futex wake, %.2f woke the executor), worst application's e2e p99 %.2f ms\n",
			r.ConsumeRate, r.AppCPUs, r.AppCPUPerMsgUs, r.BatchReceiveTimeouts, r.EmptyBatchReceives, r.TimerTasksPerMsg, r.TimerWakeCallsPerMsg, r.TimerWakesPerMsg, r.WorstAppE2EP99ms)
	} else if r.ScenarioDetails.Listener {
		fmt.Fprintf(w, "listeners: %.0f msg/s received, %.2f hand-offs/msg between the internal and listener pools (%.2f called futex wake), pools' CPU %.2fs (%.2f µs/msg)\n",
			r.ConsumeRate, r.ListenerHandoffsPerMsg, r.ListenerWakeCallsPerMsg, r.PoolsCPUs, r.PoolsCPUPerMsgUs)
	}
	for _, s := range r.Subscriptions {
		fmt.Fprintf(w, "  %-10s %-10s delivered %d undelivered %d duplicates %d order violations %d invalid %d backlog %d e2e p99 %.2f ms, %.0f msg/s\n",
			s.Name, s.Type, s.Delivered, s.Undelivered, s.Duplicates, s.OrderViolations, s.Invalid, s.Backlog, s.E2EP99ms, s.ConsumeRate)
	}
}
