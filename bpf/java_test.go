package bpf

import "testing"

// The entry the BPF walker writes for an interpreter frame (unwind.bpf.h,
// UNWIND_JAVA_INTERP) splits back into its Method* and bci.
func TestJavaFrame(t *testing.T) {
	for _, c := range []struct {
		method uint64
		bci    int
	}{{0x7f33ab400808, 0}, {0x7f33ab400808, 7}, {0x10, 8}, {0x7ffffffffff8, 65534}, {0x7f0000001000, JavaBciNone}} {
		entry := uint64(JavaMethodTag) | uint64(c.bci>>3)<<47 | c.method | uint64(c.bci&7)
		m, bci := JavaFrame(entry)
		if m != c.method || bci != c.bci {
			t.Errorf("JavaFrame(%#x) = %#x, %d; want %#x, %d", entry, m, bci, c.method, c.bci)
		}
		if entry>>60 != JavaMethodTag>>60 {
			t.Errorf("entry %#x lost its tag", entry)
		}
	}
}
