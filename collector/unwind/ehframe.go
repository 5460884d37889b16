// Package unwind turns an ELF file's .eh_frame (DWARF call frame
// information) into the compact table the BPF unwinder walks: one row per
// address range saying where the caller's frame is. Only what x86-64
// compilers emit for ordinary code is kept; anything else becomes a row
// that tells the unwinder to fall back to frame pointers.
package unwind

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// DWARF register numbers on x86-64.
const (
	regRBP = 6
	regRSP = 7
	regRA  = 16
)

// Pointer encodings (DW_EH_PE_*).
const (
	peOmit    = 0xff
	peAbsptr  = 0x00
	peULEB128 = 0x01
	peUdata2  = 0x02
	peUdata4  = 0x03
	peUdata8  = 0x08
	peSLEB128 = 0x09
	peSdata2  = 0x0a
	peSdata4  = 0x0b
	peSdata8  = 0x0c
	pePCRel   = 0x10
	peDataRel = 0x30
	peIndir   = 0x80
)

// cie is a Common Information Entry: what its FDEs share.
type cie struct {
	codeAlign uint64
	dataAlign int64
	raReg     uint64
	fdeEnc    byte
	hasAug    bool // 'z': FDEs carry an augmentation length
	signalFrm bool
	initial   []byte
}

// fde is a Frame Description Entry: the CFI program of one address range.
type fde struct {
	cie         *cie
	begin, size uint64
	program     []byte
}

type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("truncated %s at offset %#x", what, r.off)
	}
}

func (r *reader) u8() byte {
	if r.off >= len(r.b) {
		r.fail("byte")
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) bytes(n int) []byte {
	if n < 0 || r.off+n > len(r.b) {
		r.fail("block")
		r.off = len(r.b)
		return nil
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v
}

func (r *reader) u16() uint16 {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint16(b)
}
func (r *reader) u32() uint32 {
	b := r.bytes(4)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint32(b)
}
func (r *reader) u64() uint64 {
	b := r.bytes(8)
	if b == nil {
		return 0
	}
	return binary.LittleEndian.Uint64(b)
}

func (r *reader) uleb() uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		c := r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= uint64(c&0x7f) << shift
		}
		if c&0x80 == 0 {
			return v
		}
	}
}

func (r *reader) sleb() int64 {
	var v int64
	var shift uint
	var c byte
	for {
		c = r.u8()
		if r.err != nil {
			return 0
		}
		if shift < 64 {
			v |= int64(c&0x7f) << shift
		}
		shift += 7
		if c&0x80 == 0 {
			break
		}
	}
	if shift < 64 && c&0x40 != 0 {
		v |= -1 << shift
	}
	return v
}

// pointer reads a value in encoding enc; at is the section address of the
// value (for pc-relative encodings).
func (r *reader) pointer(enc byte, at uint64) uint64 {
	if enc == peOmit {
		return 0
	}
	var v uint64
	switch enc & 0x0f {
	case peAbsptr, peUdata8, peSdata8:
		v = r.u64()
	case peULEB128:
		v = r.uleb()
	case peUdata2:
		v = uint64(r.u16())
	case peSdata2:
		v = uint64(int64(int16(r.u16())))
	case peUdata4:
		v = uint64(r.u32())
	case peSdata4:
		v = uint64(int64(int32(r.u32())))
	case peSLEB128:
		v = uint64(r.sleb())
	default:
		r.fail(fmt.Sprintf("pointer encoding %#x", enc))
		return 0
	}
	switch enc & 0x70 {
	case pePCRel:
		v += at
	case 0:
	default:
		// datarel/textrel/funcrel do not occur in x86-64 .eh_frame.
		r.fail(fmt.Sprintf("pointer encoding %#x", enc))
	}
	return v
}

// parseEhFrame reads every FDE of an .eh_frame section loaded at addr.
func parseEhFrame(data []byte, addr uint64) ([]fde, error) {
	cies := map[int]*cie{}
	var fdes []fde
	r := &reader{b: data}
	for r.off < len(data) {
		start := r.off
		length := uint64(r.u32())
		if r.err != nil {
			return nil, r.err
		}
		if length == 0 {
			break // terminator
		}
		if length == 0xffffffff {
			length = r.u64()
		}
		bodyStart := r.off
		end := bodyStart + int(length)
		if length > uint64(len(data)) || end > len(data) {
			return nil, fmt.Errorf("entry at %#x runs past the section", start)
		}
		id := r.u32()
		if id == 0 {
			c, err := parseCIE(data[r.off:end])
			if err != nil {
				return nil, fmt.Errorf("CIE at %#x: %w", start, err)
			}
			cies[start] = c
		} else {
			cieOff := bodyStart - int(id)
			c, ok := cies[cieOff]
			if !ok {
				if cieOff < 0 || cieOff >= len(data) {
					return nil, fmt.Errorf("FDE at %#x names a CIE outside the section", start)
				}
				// CIEs normally come first; read this one out of order.
				sub := &reader{b: data, off: cieOff}
				l := int(sub.u32())
				sub.u32()
				if sub.err != nil || cieOff+4+l > len(data) {
					return nil, fmt.Errorf("FDE at %#x: bad CIE pointer", start)
				}
				var err error
				if c, err = parseCIE(data[sub.off : cieOff+4+l]); err != nil {
					return nil, fmt.Errorf("CIE at %#x: %w", cieOff, err)
				}
				cies[cieOff] = c
			}
			f := fde{cie: c}
			f.begin = r.pointer(c.fdeEnc, addr+uint64(r.off))
			f.size = r.pointer(c.fdeEnc&0x0f, 0)
			if c.hasAug {
				n := r.uleb()
				r.bytes(int(n))
			}
			if r.err != nil {
				return nil, fmt.Errorf("FDE at %#x: %w", start, r.err)
			}
			f.program = data[r.off:end]
			if f.size > 0 {
				fdes = append(fdes, f)
			}
		}
		r.off = end
	}
	return fdes, nil
}

func parseCIE(b []byte) (*cie, error) {
	r := &reader{b: b}
	version := r.u8()
	if version != 1 && version != 3 {
		return nil, fmt.Errorf("unsupported CIE version %d", version)
	}
	aug := ""
	for {
		c := r.u8()
		if c == 0 || r.err != nil {
			break
		}
		aug += string(c)
	}
	c := &cie{fdeEnc: peAbsptr}
	c.codeAlign = r.uleb()
	c.dataAlign = r.sleb()
	if version == 1 {
		c.raReg = uint64(r.u8())
	} else {
		c.raReg = r.uleb()
	}
	if len(aug) > 0 && aug[0] == 'z' {
		c.hasAug = true
		n := r.uleb()
		augEnd := r.off + int(n)
		for _, a := range aug[1:] {
			switch a {
			case 'R':
				c.fdeEnc = r.u8()
			case 'P':
				enc := r.u8()
				r.pointer(enc&^peIndir, 0)
			case 'L':
				r.u8()
			case 'S':
				c.signalFrm = true
			case 'B', 'G':
			default:
				r.off = augEnd // unknown letters: the length lets us skip them
			}
		}
		r.off = augEnd
	} else if aug != "" {
		return nil, fmt.Errorf("unsupported augmentation %q", aug)
	}
	if r.err != nil {
		return nil, r.err
	}
	if r.off > len(b) {
		return nil, errors.New("augmentation runs past the CIE")
	}
	c.initial = b[r.off:]
	return c, nil
}
