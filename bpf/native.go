package bpf

import "unsafe"

// NativeUint32 decodes a u32 written by a BPF program on this host.
func NativeUint32(b []byte) uint32 {
	_ = b[3]
	return *(*uint32)(unsafe.Pointer(&b[0]))
}
