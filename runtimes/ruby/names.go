package ruby

import (
	"encoding/binary"
	"errors"
	"io"
	"math/bits"
)

// Iseq is a Ruby method's or block's code as read: its label, file,
// first line and line table.
type Iseq struct {
	Label     string
	Path      string
	FirstLine int64
	lines     []int32 // line of each instruction-info entry
	succ      []byte  // the succinct index from instruction to entry
	single    bool
}

// mem reads a process's memory.
type mem struct {
	r io.ReaderAt
	l *Layout
}

func (m mem) u64(addr uint64) (uint64, error) {
	var b [8]byte
	if _, err := m.r.ReadAt(b[:], int64(addr)); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// str reads a Ruby String (embedded or not), at most 256 bytes.
func (m mem) str(v uint64) (string, error) {
	if v == 0 || v&7 != 0 {
		return "", errors.New("not a string")
	}
	flags, err := m.u64(v)
	if err != nil {
		return "", err
	}
	if flags&0x1f != 5 { // T_STRING
		return "", errors.New("not a string")
	}
	ptr, n := v+m.l.StringEmbed, (flags>>m.l.StringEmbedLenShift)&0x1f
	if flags&m.l.StringNoEmbed != 0 {
		if n, err = m.u64(v + m.l.StringHeapLen); err != nil {
			return "", err
		}
		if ptr, err = m.u64(v + m.l.StringHeapPtr); err != nil {
			return "", err
		}
	}
	b := make([]byte, min(n, 256))
	if _, err := m.r.ReadAt(b, int64(ptr)); err != nil {
		return "", err
	}
	return string(b), nil
}

// path reads an iseq's pathobj: a String, or an Array [path, realpath].
func (m mem) path(v uint64) (string, error) {
	flags, err := m.u64(v)
	if err != nil {
		return "", err
	}
	if flags&0x1f != 7 { // T_ARRAY
		return m.str(v)
	}
	first := v + m.l.ArrayEmbedAry
	if flags&m.l.ArrayEmbed == 0 {
		if first, err = m.u64(v + m.l.ArrayHeapPtr); err != nil {
			return "", err
		}
	}
	p, err := m.u64(first)
	if err != nil {
		return "", err
	}
	return m.str(p)
}

// ReadIseq reads an iseq's label, path and line table.
func ReadIseq(r io.ReaderAt, l *Layout, iseq uint64) (*Iseq, error) {
	m := mem{r, l}
	body, err := m.u64(iseq + uint64(l.IseqBody))
	if err != nil || body == 0 {
		return nil, errors.New("iseq without a body")
	}
	var hdr [0x98]byte
	if _, err := r.ReadAt(hdr[:], int64(body)); err != nil {
		return nil, err
	}
	at := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	is := &Iseq{FirstLine: int64(at(l.BodyFirstLine)) >> 1}
	if is.Label, err = m.str(at(l.BodyLabel)); err != nil {
		return nil, err
	}
	is.Path, _ = m.path(at(l.BodyPath))
	size := uint64(binary.LittleEndian.Uint32(hdr[l.BodyInsnsSize:]))
	info, succ := at(l.BodyInsnsInfo), at(l.BodySucc)
	if size == 0 || size > 1<<20 || info == 0 {
		return is, nil
	}
	raw := make([]byte, size*l.InsnInfoSize)
	if _, err := r.ReadAt(raw, int64(info)); err != nil {
		return is, nil
	}
	is.lines = make([]int32, size)
	for i := range is.lines {
		is.lines[i] = int32(binary.LittleEndian.Uint32(raw[uint64(i)*l.InsnInfoSize:]))
	}
	if is.single = size == 1; is.single || succ == 0 {
		return is, nil
	}
	// The index covers one bit per instruction word: imm_part, then
	// 80-byte blocks of 512 bits each. Read what the largest position
	// needs, bounded by the iseq's size.
	encSize := uint64(binary.LittleEndian.Uint32(hdr[4:])) // iseq_size, in words
	blocks := (max(encSize, 54) - 54 + 511) / 512
	is.succ = make([]byte, 48+blocks*80)
	if _, err := r.ReadAt(is.succ, int64(succ)); err != nil {
		is.succ = nil
	}
	return is, nil
}

// Line is the line of the instruction at pos (words from the iseq's
// start; the pc is past the instruction running, as rb_profile_frames
// reads it).
func (is *Iseq) Line(pos uint64) int64 {
	if len(is.lines) == 0 {
		return is.FirstLine
	}
	if is.single {
		return int64(is.lines[0])
	}
	if pos > 0 {
		pos--
	}
	idx, ok := succIndex(is.succ, pos)
	if !ok || idx == 0 || int(idx) > len(is.lines) {
		return is.FirstLine
	}
	return int64(is.lines[idx-1])
}

// succIndex is iseq.c's succ_index_lookup: the number of entries that
// start at or before instruction x.
func succIndex(t []byte, x uint64) (uint64, bool) {
	const imm = 54
	if x < imm {
		if len(t) < 48 {
			return 0, false
		}
		w := binary.LittleEndian.Uint64(t[x/9*8:])
		return (w >> (x % 9 * 7)) & 0x7f, true
	}
	blk := 48 + (x-imm)/512*80
	if uint64(len(t)) < blk+80 {
		return 0, false
	}
	bit := (x - imm) % 512
	small := bit / 64
	rank := uint64(binary.LittleEndian.Uint32(t[blk:]))
	var smallRank uint64
	if small > 0 {
		smallRank = binary.LittleEndian.Uint64(t[blk+8:]) >> ((small - 1) * 9) & 0x1ff
	}
	word := binary.LittleEndian.Uint64(t[blk+16+small*8:])
	return rank + smallRank + uint64(bits.OnesCount64(word<<(63-bit%64))), true
}
