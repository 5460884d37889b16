package bpf

import "github.com/cilium/ebpf"

// DeleteKeys deletes keys from m, in batches where the kernel can; a key
// already gone is no error.
func DeleteKeys[K any](m *ebpf.Map, keys []K) int {
	if m == nil || len(keys) == 0 {
		return 0
	}
	if n, err := m.BatchDelete(keys, nil); err == nil {
		return n
	}
	n := 0
	for _, k := range keys {
		if m.Delete(k) == nil {
			n++
		}
	}
	return n
}

// MoveOut calls f for each entry of m, then deletes the entries seen.
func MoveOut[K, V any](m *ebpf.Map, f func(K, *V)) {
	var k K
	var v V
	var keys []K
	for it := m.Iterate(); it.Next(&k, &v); {
		keys = append(keys, k)
		f(k, &v)
	}
	DeleteKeys(m, keys)
}
