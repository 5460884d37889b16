package threadctx

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/google/pprof/profile"
	"github.com/prometheus/procfs"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/bpf"
	"github.com/offcpu/offcpu/schema"
)

// Labels holds the thread-context records moved out of tctx_links, as
// sample labels: trace_id and span_id (lowercase hex, as W3C writes them)
// and each attribute under the name the process's context gives its key
// index (OTEP 4719's threadlocal.attribute_key_map; attr.N when it
// publishes none).
type Labels struct {
	m      *ebpf.Map
	goSets *ebpf.Map // go_links: Go threads' label sets (ids with TCTX_GO_BIT)

	mu      sync.Mutex
	recs    map[bpf.OffcpuTctxKey]record
	use     map[bpf.OffcpuTctxKey]int // the last cut that used a record
	cuts    int
	keys    map[uint32][]string // attribute names by process
	shed    uint64
	nTrunc  uint64
	nObi    uint64
	goTrunc uint64
}

// record is one record (or Go label set) as labels; truncated: its
// attributes were cut.
type record struct {
	pairs     [][2]string
	truncated bool
}

func newLabels(m, goSets *ebpf.Map) *Labels {
	return &Labels{m: m, goSets: goSets, recs: map[bpf.OffcpuTctxKey]record{}, use: map[bpf.OffcpuTctxKey]int{},
		keys: map[uint32][]string{}}
}

// take moves the records read since the last time.
func (l *Labels) Take() {
	l.mu.Lock()
	defer l.mu.Unlock()
	bpf.MoveOut(l.m, func(k bpf.OffcpuTctxKey, v *bpf.OffcpuTctxLink) {
		if !l.fresh(k) {
			return
		}
		r := l.decode(k.Tgid, v)
		if r.truncated {
			l.nTrunc++
		}
		if v.Flags&bpf.TctxObi != 0 {
			l.nObi++
		}
		l.recs[k] = r
	})
	if l.goSets == nil {
		return
	}
	// Go threads' label sets, under their ids as waits carry them.
	bpf.MoveOut(l.goSets, func(k bpf.OffcpuGoLinkKey, v *bpf.OffcpuGoLinkVal) {
		rk := bpf.OffcpuTctxKey{Tgid: k.Tgid, Id: k.Id | 1<<bpf.TctxGoBit}
		if !l.fresh(rk) {
			return
		}
		pairs, truncated := (*bpf.GoroutinesGoLinkVal)(v).Pairs()
		if truncated {
			l.goTrunc++
		}
		l.recs[rk] = record{pairs: pairs, truncated: truncated}
	})
}

// fresh: record k is not held yet and the recording's bound leaves room
// for it (else counted as shed). l.mu held.
func (l *Labels) fresh(k bpf.OffcpuTctxKey) bool {
	if _, ok := l.recs[k]; ok {
		return false
	}
	if len(l.recs) >= maxRecords {
		l.shed++
		return false
	}
	return true
}

// decode reads one record; unknown key indexes refresh the process's key
// map first (the specification's rule: the map only grows).
func (l *Labels) decode(pid uint32, v *bpf.OffcpuTctxLink) record {
	r := record{truncated: v.Flags&bpf.TctxTruncated != 0}
	if v.TraceId != [16]uint8{} {
		r.pairs = append(r.pairs, [2]string{schema.LabelTraceID, hex.EncodeToString(v.TraceId[:])})
	}
	if v.SpanId != [8]uint8{} {
		r.pairs = append(r.pairs, [2]string{schema.LabelSpanID, hex.EncodeToString(v.SpanId[:])})
	}
	attrs := v.Attrs[:min(int(v.AttrsSize), len(v.Attrs))]
	last := map[uint8]string{} // the last occurrence of a key wins
	var order []uint8
	for len(attrs) >= 2 {
		k, n := attrs[0], int(attrs[1])
		if 2+n > len(attrs) {
			r.truncated = true
			break
		}
		if _, ok := last[k]; !ok {
			order = append(order, k)
		}
		last[k] = string(attrs[2 : 2+n])
		attrs = attrs[2+n:]
	}
	names := l.keys[pid]
	for _, k := range order {
		if int(k) >= len(names) {
			if fresh := tctxKeyMap(pid); len(fresh) > len(names) {
				names = fresh
				l.keys[pid] = names
			}
			break
		}
	}
	for _, k := range order {
		name := "attr." + strconv.Itoa(int(k))
		if int(k) < len(names) && names[k] != "" {
			name = names[k]
		}
		r.pairs = append(r.pairs, [2]string{name, last[k]})
	}
	return r
}

// readKeys reads pid's attribute names as it is found: they stay after it
// exits, for the records moved out after (a pid reused by a process that
// publishes is read again).
func (l *Labels) readKeys(pid uint32) {
	names := tctxKeyMap(pid)
	l.mu.Lock()
	l.keys[pid] = names
	l.mu.Unlock()
}

// put puts record link of process pid on s; false: not read.
func (l *Labels) Put(s *profile.Sample, pid uint32, link uint64) bool {
	k := bpf.OffcpuTctxKey{Tgid: pid, Id: link}
	l.mu.Lock()
	r, ok := l.recs[k]
	if ok {
		l.use[k] = l.cuts
	}
	l.mu.Unlock()
	for _, kv := range r.pairs {
		s.Label[schema.ProgramLabelKey(kv[0])] = []string{kv[1]}
	}
	return ok
}

// cut ends a continuous recording's interval: records unused for four
// cuts are forgotten (a span's waits end with it).
func (l *Labels) Cut() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cuts++
	for k := range l.recs {
		if l.cuts-l.use[k] > 4 {
			delete(l.recs, k)
			delete(l.use, k)
		}
	}
}

func (l *Labels) addStats(st *Stats) {
	l.mu.Lock()
	st.Shed, st.Truncated, st.Instrumentation, st.TruncatedGoSets = l.shed, l.nTrunc, l.nObi, l.goTrunc
	l.mu.Unlock()
}

// tctxKeyMap reads the attribute names of pid's thread context from its
// process context (OTEP 4719): a mapping named OTEL_CTX whose header
// {"OTEL_CTX", version, payload size, published at, payload pointer}
// points to a ProcessContext protobuf; nil where it has none.
func tctxKeyMap(pid uint32) []string {
	p, err := procfs.NewProc(int(pid))
	if err != nil {
		return nil
	}
	maps, err := p.ProcMaps()
	if err != nil {
		return nil
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil
	}
	defer mem.Close()
	for _, m := range maps {
		name := m.Pathname
		if !strings.HasPrefix(name, "[anon_shmem:OTEL_CTX]") && !strings.HasPrefix(name, "/memfd:OTEL_CTX") &&
			!strings.HasPrefix(name, "[anon:OTEL_CTX]") {
			continue
		}
		if payload, err := readProcessContext(mem, uint64(m.StartAddr)); err == nil {
			return attributeKeyMap(payload)
		}
	}
	return nil
}

// readProcessContext reads the payload at header addr, consistent when
// published_at_ns is the same before and after (the update protocol).
func readProcessContext(mem *os.File, addr uint64) ([]byte, error) {
	var h [32]byte
	for try := 0; try < 3; try++ {
		if _, err := mem.ReadAt(h[:], int64(addr)); err != nil {
			return nil, err
		}
		if !bytes.Equal(h[:8], []byte("OTEL_CTX")) {
			return nil, errors.New("no signature")
		}
		if v := binary.LittleEndian.Uint32(h[8:]); v != 1 && v != 2 {
			return nil, fmt.Errorf("version %d", v)
		}
		size, at, ptr := binary.LittleEndian.Uint32(h[12:]), binary.LittleEndian.Uint64(h[16:]), binary.LittleEndian.Uint64(h[24:])
		if at == 0 || size > 1<<20 {
			continue // being updated
		}
		payload := make([]byte, size)
		if _, err := mem.ReadAt(payload, int64(ptr)); err != nil {
			return nil, err
		}
		var again [32]byte
		if _, err := mem.ReadAt(again[:], int64(addr)); err == nil && binary.LittleEndian.Uint64(again[16:]) == at {
			return payload, nil
		}
	}
	return nil, errors.New("being updated")
}

// attributeKeyMap finds threadlocal.attribute_key_map in a ProcessContext
// {Resource resource = 1 {repeated KeyValue attributes = 1}; repeated
// KeyValue extra_attributes = 2}: its array of strings.
func attributeKeyMap(payload []byte) []string {
	var out []string
	eachField(payload, func(num protowire.Number, b []byte) {
		switch num {
		case 1: // resource
			eachField(b, func(n protowire.Number, kv []byte) {
				if n == 1 && out == nil {
					out = keyMapOf(kv)
				}
			})
		case 2: // extra_attributes
			if out == nil {
				out = keyMapOf(b)
			}
		}
	})
	return out
}

// keyMapOf: a KeyValue{key = 1, AnyValue value = 2}'s array of strings
// (AnyValue.array_value = 5 → ArrayValue.values = 1 → string_value = 1)
// when its key is threadlocal.attribute_key_map.
func keyMapOf(kv []byte) []string {
	var key string
	var val []byte
	eachField(kv, func(n protowire.Number, b []byte) {
		switch n {
		case 1:
			key = string(b)
		case 2:
			val = b
		}
	})
	if key != "threadlocal.attribute_key_map" {
		return nil
	}
	names := []string{}
	eachField(val, func(n protowire.Number, arr []byte) {
		if n != 5 {
			return
		}
		eachField(arr, func(n protowire.Number, any []byte) {
			if n != 1 {
				return
			}
			s := ""
			eachField(any, func(n protowire.Number, b []byte) {
				if n == 1 {
					s = string(b)
				}
			})
			names = append(names, s)
		})
	})
	return names
}

// eachField calls f with each length-delimited field of a message (others
// skipped); a malformed message ends the walk.
func eachField(b []byte, f func(protowire.Number, []byte)) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return
			}
			f(num, v)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return
		}
		b = b[m:]
	}
}
