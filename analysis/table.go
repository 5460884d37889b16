package analysis

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// table is one table of a report, rendered as aligned text or markdown
// from the same rows.
type table struct {
	head []string // text headers; md overrides them in markdown when set
	md   []string
	rows [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

// text writes the table aligned, after a blank line.
func (t *table) text(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "\n%s\t\n", strings.Join(t.head, "\t"))
	for _, r := range t.rows {
		fmt.Fprintf(tw, "%s\t\n", strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// markdown writes the table with its first column left-aligned and the
// others right-aligned, after a blank line.
func (t *table) markdown(w io.Writer) {
	head := t.head
	if t.md != nil {
		head = t.md
	}
	fmt.Fprintf(w, "\n| %s |\n|---%s|\n", strings.Join(head, " | "), strings.Repeat("|---:", len(head)-1))
	for _, r := range t.rows {
		fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | "))
	}
}
