package bpf

import "sort"

// Pairs reads one goroutine label set of the probes' (go_links): its
// pairs sorted by key, and whether some were cut short.
func (v *GoroutinesGoLinkVal) Pairs() (pairs [][2]string, truncated bool) {
	str := func(b []int8, n uint8) string {
		out := make([]byte, min(int(n), len(b)))
		for i := range out {
			out[i] = byte(b[i])
		}
		return string(out)
	}
	for i := 0; i < int(min(v.N, uint32(len(v.L)))); i++ {
		e := &v.L[i]
		if e.Klen == 0 {
			continue
		}
		pairs = append(pairs, [2]string{str(e.Key[:], e.Klen), str(e.Value[:], e.Vlen)})
	}
	sort.Slice(pairs, func(i, j int) bool { return pairs[i][0] < pairs[j][0] })
	return pairs, v.Flags&GoLinkTruncated != 0
}
