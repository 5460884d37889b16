package schema

import (
	"maps"
	"slices"
	"strings"

	"github.com/google/pprof/profile"
)

// A wait's link to a request: the labels the program itself put on the
// waiting goroutine or thread (Go's pprof labels, an OpenTelemetry
// context), carried as sample labels under the program's own keys. Two of
// them are the trace's: a W3C trace id and span id (lowercase hex).
const (
	LabelTraceID = "trace_id"
	LabelSpanID  = "span_id"
	// ProgramLabelPrefix is put before a program's label key that is one
	// of the recorder's own ("thread", "state"), so neither is lost.
	ProgramLabelPrefix = "label."
)

// recorderLabels are the string labels the recorder sets itself.
var recorderLabels = map[string]bool{
	LabelThread: true, LabelProcess: true, LabelState: true, LabelWaker: true, LabelWakeupClass: true, LabelTarget: true,
	LabelTargetProcess: true, LabelInterval: true, LabelFolded: true, LabelWakerStack: true, LabelWakerProcess: true,
	LabelWakerWaitStack: true, LabelReason: true, LabelGoCreator: true, LabelGoStart: true, LabelGIL: true,
	LabelGILHolder: true, LabelGILHolderStack: true,
}

// ProgramLabelKey is the sample label key of a program's label key.
func ProgramLabelKey(k string) string {
	if recorderLabels[k] || strings.HasPrefix(k, ProgramLabelPrefix) {
		return ProgramLabelPrefix + k
	}
	return k
}

// ProgramLabels are a sample's labels that the program set (nil: none),
// under the program's own keys.
func ProgramLabels(s *profile.Sample) map[string]string {
	var out map[string]string
	for k, v := range s.Label {
		if recorderLabels[k] || len(v) == 0 {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[strings.TrimPrefix(k, ProgramLabelPrefix)] = v[0]
	}
	return out
}

// ProgramLabelKeys are the program label keys of a profile, sorted.
func ProgramLabelKeys(p *profile.Profile) []string {
	keys := map[string]bool{}
	for _, s := range p.Sample {
		for k := range ProgramLabels(s) {
			keys[k] = true
		}
	}
	return slices.Sorted(maps.Keys(keys))
}

// InTrace tells whether a stack carries a trace's link: a span or a trace
// id, which only a request's work carries.
func (s *Stack) InTrace() bool { return s.Links[LabelSpanID] != "" || s.Links[LabelTraceID] != "" }

// TraceLink names a stack's trace link: its span, else its trace ("":
// none).
func (s *Stack) TraceLink() string {
	if v := s.Links[LabelSpanID]; v != "" {
		return "span_id " + v
	}
	if v := s.Links[LabelTraceID]; v != "" {
		return "trace_id " + v
	}
	return ""
}
