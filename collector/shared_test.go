package collector

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/collector/unwind"
)

// cConstants reads the enum members (with C's implicit increments) and
// the numeric #defines of C sources.
func cConstants(t *testing.T, paths ...string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	enum := regexp.MustCompile(`(?s)enum\s+\w+\s*\{(.*?)\}`)
	define := regexp.MustCompile(`(?m)^#define\s+(\w+)\s+\(?\s*(0x[0-9a-fA-F]+|\d+)(?:ULL|UL|U)?\s*(?:<<\s*(\d+))?\s*\)?\s*$`)
	comment := regexp.MustCompile(`(?s)/\*.*?\*/|//[^\n]*`)
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		src := comment.ReplaceAllString(string(b), "")
		for _, m := range enum.FindAllStringSubmatch(src, -1) {
			next := uint64(0)
			for _, item := range strings.Split(m[1], ",") {
				name, val, hasVal := strings.Cut(strings.TrimSpace(item), "=")
				name = strings.TrimSpace(name)
				if name == "" {
					continue
				}
				if hasVal {
					v, err := strconv.ParseUint(strings.TrimSpace(val), 0, 64)
					if err != nil {
						continue // an expression: not compared
					}
					next = v
				}
				out[name] = next
				next++
			}
		}
		for _, m := range define.FindAllStringSubmatch(src, -1) {
			v, err := strconv.ParseUint(m[2], 0, 64)
			if err != nil {
				continue
			}
			if m[3] != "" {
				sh, _ := strconv.Atoi(m[3])
				v <<= sh
			}
			out[m[1]] = v
		}
	}
	return out
}

// The values Go copies from the BPF sources are the C ones.
func TestSharedConstants(t *testing.T) {
	c := cConstants(t, "../bpf/offcpu_shared.h", "../bpf/offcpu.bpf.c")
	for name, goVal := range map[string]uint64{
		"STATE_SLEEPING": uint64(StateSleeping), "STATE_UNINTERRUPTIBLE": uint64(StateUninterruptible),
		"STATE_PREEMPTED": uint64(StatePreempted), "STATE_OTHER": uint64(StateOther), "STATE_UNKNOWN": uint64(StateUnknown),
		"EV_SEEN": evSeen, "EV_EXEC": evExec, "EV_FORK": evFork, "EV_EXIT": evExit, "EV_THREAD_EXIT": evThreadExit,
		"EV_MAP": evMap, "EV_REREAD": evReread,
		"UNWIND_RSP": uint64(unwind.KindRSP), "UNWIND_RBP": uint64(unwind.KindRBP), "UNWIND_END": uint64(unwind.KindEnd),
		"UNWIND_NONE": uint64(unwind.KindNone), "UNWIND_PLT": uint64(unwind.KindPLT), "UNWIND_JAVA_INTERP": uint64(unwind.KindJavaInterp),
		"UNWIND_JAVA_COMPILED": uint64(unwind.KindJavaCompiled), "UNWIND_JAVA_GAP": uint64(unwind.KindJavaGap),
		"JAVA_METHOD_TAG": bpf.JavaMethodTag, "JAVA_METHOD_MASK": bpf.JavaMethodMask, "JAVA_BCI_NONE": bpf.JavaBCINone,
		"UNWIND_MAX_ROWS": maxMapEntries,
	} {
		cVal, ok := c[name]
		if !ok {
			t.Errorf("%s not found in the BPF sources", name)
			continue
		}
		if cVal != goVal {
			t.Errorf("%s is %#x in C, %#x in Go", name, cVal, goVal)
		}
	}
	if c["STATE_UNKNOWN"] != uint64(len(stateNames)-1) {
		t.Errorf("states: %d names in Go, the last C state is %d", len(stateNames), c["STATE_UNKNOWN"])
	}
}
