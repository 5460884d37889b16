package hotspot

// unsigned5 reads HotSpot's compressed stream (CompressedReadStream:
// UNSIGNED5, up to five bytes, values of 192 and up continue).
type unsigned5 struct {
	b   []byte
	x   byte
	err bool
}

func (r *unsigned5) next() uint32 {
	var sum uint32
	for i, shift := 0, 0; i < 5; i, shift = i+1, shift+6 {
		if len(r.b) == 0 || r.b[0] < r.x {
			r.err = true
			return 0
		}
		c := r.b[0]
		r.b = r.b[1:]
		sum += uint32(c-r.x) << shift
		if c < 192 {
			break
		}
	}
	return sum
}
