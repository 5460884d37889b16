package symtab

import (
	"bufio"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// PerfMap is a JIT's /tmp/perf-PID.map: "START SIZE name" in hex.
type PerfMap struct {
	starts, ends []uint64
	names        []string
}

// ParsePerfMap reads a perf map; HotSpot's method names are shortened
// to pkg.Class.method.
func ParsePerfMap(r io.Reader) *PerfMap {
	type ent struct {
		s, e uint64
		n    string
	}
	var es []ent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.SplitN(line, " ", 3)
		if len(f) < 3 {
			continue
		}
		s, err1 := strconv.ParseUint(strings.TrimPrefix(f[0], "0x"), 16, 64)
		n, err2 := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		es = append(es, ent{s, s + n, javaMethod(f[2])})
	}
	// Later entries win: a JIT may reuse an address range.
	sort.SliceStable(es, func(i, j int) bool { return es[i].s < es[j].s })
	m := &PerfMap{}
	for _, e := range es {
		m.starts = append(m.starts, e.s)
		m.ends = append(m.ends, e.e)
		m.names = append(m.names, e.n)
	}
	return m
}

// hotspotMethod matches a JIT-compiled method as HotSpot's
// Compiler.perfmap writes it: "void pkg.Class.method(int, long)".
var hotspotMethod = regexp.MustCompile(`^\S+ ([\w$.]+\.(?:[\w$]+|<init>|<clinit>))\(.*\)$`)

// javaMethod shortens a HotSpot perf-map name to pkg.Class.method, the
// form other Java profilers print and the analysis rules match; other
// names pass unchanged.
func javaMethod(name string) string {
	if m := hotspotMethod.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return name
}

// Lookup names a JIT address; a nil map names nothing.
func (m *PerfMap) Lookup(addr uint64) (string, bool) {
	if m == nil {
		return "", false
	}
	i := sort.Search(len(m.starts), func(i int) bool { return m.starts[i] > addr }) - 1
	// Entries may overlap when code is re-JITed: check a few back.
	for j := i; j >= 0 && j > i-8; j-- {
		if addr < m.ends[j] {
			return m.names[j], true
		}
	}
	return "", false
}
