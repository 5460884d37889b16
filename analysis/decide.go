package analysis

import "fmt"

// Decided names the rule or verdict that gave a stack its first category
// (Categorize), where it was written: "default rules:123 (queue-wait,
// verdict)", "rules.yaml:7 (io, rule)", or "no rule (other)". It follows
// categorize step by step, so that a judgement one disagrees with leads
// to the line to change.
func (r *Rules) Decided(s *Stack) string {
	inner := r.InnermostApp(s)
	var first *rule
	for i := range r.rules {
		if ru := &r.rules[i]; ru.matches(s, inner) {
			first = ru
			break
		}
	}
	cat := "other"
	if first != nil {
		cat = first.category
	}
	// The verdict wins where categorize lets it: on idleness, or over "other".
	if v := r.verdict(s, inner); v != nil && v.category != cat && (r.IsIdle(v.category) != r.IsIdle(cat) || cat == "other") {
		return fmt.Sprintf("%s (%s, verdict)", v.at, v.category)
	}
	if first == nil {
		return "no rule (other)"
	}
	return fmt.Sprintf("%s (%s, rule)", first.at, first.category)
}
