package analysis

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
)

// LabelRow is one value of a program's label (a route, a tenant, a span):
// the blocked time of the waits that carry it, and its causes.
type LabelRow struct {
	Value     string       `json:"value"`
	BlockedNs int64        `json:"blocked_ns"` // waits in blocked categories
	IdleNs    int64        `json:"idle_ns"`    // waits in idle categories
	RunqNs    int64        `json:"runqueue_ns"`
	Waits     int64        `json:"waits"`
	Causes    []LabelCause `json:"causes"` // blocked time by first category, largest first
}

// LabelCause is a category's share of one label value's blocked time.
type LabelCause struct {
	Category string  `json:"category"`
	Ns       int64   `json:"ns"`
	Share    float64 `json:"share"`
}

// ByLabel sums the off-CPU stacks carrying program label key by its
// value, each value's blocked time by cause (the first category, after
// the waker's verdict), largest first. Call Analyze on d first: it marks
// the waits inside requests and the chains the verdicts read.
func ByLabel(d *Data, r *Rules, key string, top int) []LabelRow {
	rows := map[string]*LabelRow{}
	causes := map[string]map[string]int64{}
	for i := range d.Stacks {
		s := &d.Stacks[i]
		v, ok := s.Links[key]
		if s.Kind != KindOffCPU || !ok {
			continue
		}
		row := rows[v]
		if row == nil {
			row = &LabelRow{Value: v}
			rows[v], causes[v] = row, map[string]int64{}
		}
		if s.WaitsForCPU() {
			row.RunqNs += s.Value
			continue
		}
		row.Waits += s.Count
		c := r.Categorize(s)[0]
		if r.IsIdle(c) {
			row.IdleNs += s.Value
			continue
		}
		row.BlockedNs += s.Value
		causes[v][c] += s.Value
	}
	out := make([]LabelRow, 0, len(rows))
	for v, row := range rows {
		for c, ns := range causes[v] {
			row.Causes = append(row.Causes, LabelCause{Category: c, Ns: ns, Share: float64(ns) / float64(max(row.BlockedNs, 1))})
		}
		sort.Slice(row.Causes, func(i, j int) bool {
			a, b := row.Causes[i], row.Causes[j]
			return a.Ns > b.Ns || (a.Ns == b.Ns && a.Category < b.Category)
		})
		out = append(out, *row)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].BlockedNs > out[j].BlockedNs || (out[i].BlockedNs == out[j].BlockedNs && out[i].Value < out[j].Value)
	})
	if top > 0 && len(out) > top {
		out = out[:top]
	}
	return out
}

// KeepLinked keeps the stacks that carry program label key with value
// (a span, a trace): one request's waits. It returns how many are kept.
func KeepLinked(d *Data, key, value string) int {
	kept := d.Stacks[:0]
	for _, s := range d.Stacks {
		if s.Links[key] == value {
			kept = append(kept, s)
		}
	}
	d.Stacks = kept
	return len(kept)
}

// LabelKeys are the program label keys the data's stacks carry, sorted.
func LabelKeys(d *Data) []string {
	keys := map[string]bool{}
	for i := range d.Stacks {
		for k := range d.Stacks[i].Links {
			keys[k] = true
		}
	}
	out := make([]string, 0, len(keys))
	for k := range keys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// WriteByLabel writes rows as text, markdown or json.
func WriteByLabel(w io.Writer, key string, rows []LabelRow, format string) error {
	switch format {
	case "json":
		e := json.NewEncoder(w)
		e.SetIndent("", "  ")
		return e.Encode(struct {
			Label string     `json:"label"`
			Rows  []LabelRow `json:"rows"`
		}{key, rows})
	case "text", "markdown":
	default:
		return fmt.Errorf("unknown format %q: use text, json or markdown", format)
	}
	causes := func(r LabelRow) string {
		var parts []string
		for _, c := range r.Causes[:min(3, len(r.Causes))] {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", c.Category, 100*c.Share))
		}
		return strings.Join(parts, ", ")
	}
	if format == "markdown" {
		fmt.Fprintf(w, "| %s | blocked | idle | waiting for a CPU | waits | top causes |\n|---|---:|---:|---:|---:|---|\n", key)
		for _, r := range rows {
			fmt.Fprintf(w, "| %s | %s | %s | %s | %d | %s |\n", r.Value, Secs(r.BlockedNs), Secs(r.IdleNs), Secs(r.RunqNs), r.Waits, causes(r))
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tblocked\tidle\twaiting for a CPU\twaits\ttop causes\n", strings.ToUpper(key))
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", r.Value, Secs(r.BlockedNs), Secs(r.IdleNs), Secs(r.RunqNs), r.Waits, causes(r))
	}
	return tw.Flush()
}
