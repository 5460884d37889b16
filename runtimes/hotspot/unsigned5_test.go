package hotspot

import "testing"

// encode is HotSpot's UNSIGNED5 writer (unsigned5.hpp write_uint): x is
// the excluded byte count (0 before JDK 21, 1 from 21).
func encode(v uint32, x byte) []byte {
	l := uint32(256 - 64 - uint32(x))
	var out []byte
	for i := 0; ; i++ {
		if v < l || i == 4 {
			return append(out, x+byte(v))
		}
		v -= l
		out = append(out, x+byte(l+v%64))
		v >>= 6
	}
}

func TestUnsigned5RoundTrip(t *testing.T) {
	for _, x := range []byte{0, 1} {
		var stream []byte
		var want []uint32
		for v := uint32(0); v < 1<<22; v = v*3 + 1 {
			want = append(want, v)
			stream = append(stream, encode(v, x)...)
		}
		want = append(want, 191, 192, 255, 256, 12479, 12480)
		for _, v := range want[len(want)-6:] {
			stream = append(stream, encode(v, x)...)
		}
		r := unsigned5{b: stream, x: x}
		for _, v := range want {
			if got := r.next(); got != v || r.err {
				t.Fatalf("x=%d: read %d (err %v), want %d", x, got, r.err, v)
			}
		}
		if len(r.b) != 0 {
			t.Errorf("x=%d: %d bytes left", x, len(r.b))
		}
	}
	if r := (&unsigned5{b: []byte{0}, x: 1}); r.next() != 0 || !r.err {
		t.Error("an excluded byte read without error")
	}
}
