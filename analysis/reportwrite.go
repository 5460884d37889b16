package analysis

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/offcpu/offcpu/schema"
)

// chainsTable lists the root causes of the blocked time.
func (rep *Report) chainsTable() *table {
	t := &table{head: []string{"waiting group", "root cause (path from the thread waited on)", "blocked", "share"}}
	for _, rc := range rep.Chains {
		t.add(rc.Waiters, pathString(rc.Path), Secs(rc.Ns), fmt.Sprintf("%.0f%%", 100*rc.Share))
	}
	return t
}

// WriteChains renders only the root causes, as text or markdown.
func (rep *Report) WriteChains(w io.Writer, format string) error {
	t := rep.chainsTable()
	if format == "markdown" || format == "md" {
		t.markdown(w)
		return nil
	}
	return t.text(w)
}

// Secs renders nanoseconds as seconds with sensible precision.
func Secs(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f µs", float64(d)/1e3)
}

func statements(rep *Report) []string {
	var out []string
	if rep.AppBlockedNs == 0 {
		return []string{fmt.Sprintf("No blocked time with an application frame (%s off-CPU in all).", Secs(rep.TotalOffCPUNs))}
	}
	// The largest blocked category by the app time it is the first match
	// of, other than "other": an idle category matched second (a lock's
	// condition wait is a queue's wait too) is not what blocked.
	var best *CategoryResult
	for i := range rep.Categories {
		c := &rep.Categories[i]
		if c.Name != "other" && !c.Idle && c.FirstNs > 0 && (best == nil || c.FirstNs > best.FirstNs) {
			best = c
		}
	}
	if best != nil {
		where := ""
		var bestGroup string
		var bestNs int64
		for _, g := range rep.ThreadGroups {
			if g.Categories[best.Name] > bestNs {
				bestGroup, bestNs = g.Name, g.Categories[best.Name]
			}
		}
		if bestGroup != "" {
			where = fmt.Sprintf(" %s %s", bestGroup, rep.unit())
		}
		fn := ""
		if len(rep.TopAppFunctions) > 0 {
			fn = fmt.Sprintf(" (the most blocked application function: %s, %s)", schema.ShortFunc(rep.TopAppFunctions[0].Name), Secs(rep.TopAppFunctions[0].Value))
		}
		out = append(out, fmt.Sprintf("%s is %.0f%% of the blocked time with an application frame (%s of %s), mostly%s%s.",
			best.Name, 100*float64(best.FirstNs)/float64(max(rep.AppBlockedNs, 1)), Secs(best.FirstNs), Secs(rep.AppBlockedNs), where, fn))
	}
	if len(rep.BlockedOn) > 0 {
		b := rep.BlockedOn[0]
		by := b.Waker + " " + rep.unit()
		if strings.HasPrefix(b.Waker, "[") {
			by = b.Waker
		}
		if b.WakerFunction != "" {
			by += " in " + schema.ShortFunc(b.WakerFunction)
		}
		how := "woken by " + by
		if strings.Contains(b.Waker, heldBy) {
			how = "the " + by // the GIL held by ...
		}
		out = append(out, fmt.Sprintf("%s %s blocked %s in %s, %s (%.0f%% of the blocked time with an application frame).",
			b.Waiters, rep.unit(), Secs(b.Ns), b.Category, how, 100*float64(b.Ns)/float64(rep.AppBlockedNs)))
	}
	out = append(out, fmt.Sprintf("Blocked time with an application frame: %s of %s off-CPU.", Secs(rep.AppBlockedNs), Secs(rep.TotalOffCPUNs)))
	if rep.RunQueueNs > 0 {
		out = append(out, fmt.Sprintf("Waiting for a CPU (woken or preempted, not yet running; not blocked): %s, %s of the off-CPU time.", Secs(rep.RunQueueNs), pct(rep.RunQueueNs, rep.TotalOffCPUNs)))
	}
	if rep.Wakeups.Total > 0 {
		s := fmt.Sprintf("Wake-ups: %d, of them %d through an eventfd", rep.Wakeups.Total, rep.Wakeups.ByClass[schema.WakeEventfd])
		if rep.Messages > 0 {
			s += fmt.Sprintf(" (%.3f eventfd wake-ups per message)", rep.Wakeups.EventfdPerMessage)
		}
		out = append(out, s+".")
	}
	return out
}

// Write renders the report as text, json or markdown.
func (rep *Report) Write(w io.Writer, format string) error {
	return write(w, format, rep, rep.writeText, rep.writeMarkdown)
}

// write renders v in one of the output formats.
func write(w io.Writer, format string, v any, text, markdown func(io.Writer) error) error {
	switch format {
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case "markdown", "md":
		return markdown(w)
	case "text", "":
		return text(w)
	}
	return fmt.Errorf("unknown format %q: use text, json or markdown", format)
}

func pct(a, b int64) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
}

func (rep *Report) writeText(w io.Writer) error {
	fmt.Fprintf(w, "off-CPU %s (waiting for a CPU %s), idle %s, blocked with an application frame %s", Secs(rep.TotalOffCPUNs), Secs(rep.RunQueueNs), Secs(rep.IdleNs), Secs(rep.AppBlockedNs))
	if rep.ThreadFilter != "" {
		fmt.Fprintf(w, " (threads matching %s)", rep.ThreadFilter)
	}
	fmt.Fprintln(w)
	if len(rep.IdleCategories) > 0 {
		fmt.Fprintf(w, "idle (waiting for work, never blocked): %s\n", strings.Join(rep.IdleCategories, ", "))
	}
	if rep.UserStackNs > 0 {
		fmt.Fprintf(w, "user stacks reaching a thread start: %s of the off-CPU time with a user stack\n", pct(rep.WholeStackNs, rep.UserStackNs))
	}
	for _, s := range rep.Statements {
		fmt.Fprintln(w, "  "+s)
	}
	for _, u := range rep.UnmatchedRules {
		fmt.Fprintf(w, "warning: rule %s matched no stack\n", u)
	}
	for _, t := range rep.tables() {
		if err := t.text(w); err != nil {
			return err
		}
	}
	fns := &table{head: []string{"waker function", "wake-ups"}}
	for _, c := range rep.Wakeups.ByWakerFunction {
		fns.add(schema.ShortFunc(c.Name), fmt.Sprint(c.Value))
	}
	if rep.Wakeups.Total > 0 {
		if err := fns.text(w); err != nil {
			return err
		}
	}
	app := &table{head: []string{"application function (innermost)", "blocked"}}
	for _, c := range rep.TopAppFunctions {
		app.add(schema.ShortFunc(c.Name), Secs(c.Value))
	}
	return app.text(w)
}

// unit is what the report's stacks wait in: threads or goroutines.
func (rep *Report) unit() string {
	if rep.Goroutines {
		return "goroutines"
	}
	return "threads"
}

// tables are the report's category, thread group and woken group tables.
func (rep *Report) tables() []*table {
	cats := &table{head: []string{"category", "all", "with app frame", "share", "first match"},
		md: []string{"category", "off-CPU", "with an application frame", "share", "first match"}}
	for _, c := range rep.Categories {
		if c.Ns != 0 || c.AppNs != 0 {
			cats.add(c.label(), Secs(c.Ns), Secs(c.AppNs), pct(c.AppNs, rep.AppBlockedNs), pct(c.FirstNs, rep.AppBlockedNs))
		}
	}
	group := "thread group"
	if rep.Goroutines {
		group = "goroutines by start function"
	}
	groups := &table{head: []string{group, "off-CPU", "waiting for CPU", "with app frame", "on-CPU"},
		md: []string{group, "off-CPU", "of it waiting for a CPU", "blocked with an application frame", "on-CPU"}}
	for _, g := range rep.ThreadGroups {
		groups.add(g.Name, Secs(g.OffCPUNs), Secs(g.RunQueueNs), Secs(g.AppBlockedNs), Secs(g.CPUNs))
	}
	out := []*table{cats, groups}
	if t := rep.intervalsTable(); t != nil {
		out = append(out, t)
	}
	if len(rep.Chains) > 0 {
		out = append(out, rep.chainsTable())
	}
	if len(rep.BlockedOn) > 0 {
		on := &table{head: []string{"waiting group", "category", "woken by", "in", "blocked"}}
		for _, b := range rep.BlockedOn {
			on.add(b.Waiters, b.Category, b.Waker, schema.ShortFunc(b.WakerFunction), Secs(b.Ns))
		}
		out = append(out, on)
	}
	if rep.Wakeups.Total > 0 {
		// A column per class seen, most wake-ups first.
		classes := TopCounts(rep.Wakeups.ByClass, len(rep.Wakeups.ByClass))
		woken := &table{head: []string{"woken group", "wake-ups"}}
		for _, c := range classes {
			woken.head = append(woken.head, c.Name)
		}
		for _, t := range rep.Wakeups.ByTargetGroup {
			row := []string{t.Group, fmt.Sprint(t.Total)}
			for _, c := range classes {
				row = append(row, fmt.Sprint(t.ByClass[c.Name]))
			}
			woken.add(row...)
		}
		out = append(out, woken)
	}
	return out
}

func (rep *Report) writeMarkdown(w io.Writer) error {
	fmt.Fprintf(w, "Off-CPU time: %s (of it waiting for a CPU: %s); idle: %s; blocked time with an application frame: %s", Secs(rep.TotalOffCPUNs), Secs(rep.RunQueueNs), Secs(rep.IdleNs), Secs(rep.AppBlockedNs))
	if rep.ThreadFilter != "" {
		fmt.Fprintf(w, " (threads matching `%s`)", rep.ThreadFilter)
	}
	fmt.Fprint(w, ".")
	if rep.UserStackNs > 0 {
		fmt.Fprintf(w, " User stacks reaching a thread start: %s of the off-CPU time with a user stack.", pct(rep.WholeStackNs, rep.UserStackNs))
	}
	fmt.Fprint(w, "\n\n")
	if len(rep.IdleCategories) > 0 {
		fmt.Fprintf(w, "Idle categories (waiting for work, never counted as blocked): %s.\n\n", strings.Join(rep.IdleCategories, ", "))
	}
	for _, s := range rep.Statements {
		fmt.Fprintf(w, "- %s\n", s)
	}
	for _, u := range rep.UnmatchedRules {
		fmt.Fprintf(w, "- Warning: rule %s matched no stack.\n", u)
	}
	for _, t := range rep.tables() {
		t.markdown(w)
	}
	return nil
}

func (c CategoryResult) label() string {
	if c.Idle {
		return c.Name + " (idle)"
	}
	return c.Name
}
