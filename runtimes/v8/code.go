package v8

import "encoding/binary"

// scopeInfo reads a function's name and start position from its
// ScopeInfo, as the OpenTelemetry eBPF profiler does
// (interpreter/nodev8/v8.go): slots of a word from +8, the count of
// context locals in slot 2, then that many names and as many infos; past
// them, the first non-empty string is the function's name (or the name
// V8 inferred for an anonymous one) and the first two Smis in increasing
// order its start and end positions.
func (r *Reader) scopeInfo(obj uint64) (string, int64) {
	const slots = 24
	var b [8 * slots]byte
	if _, err := r.Mem.ReadAt(b[:], int64(obj-1+8)); err != nil {
		return "", -1
	}
	slot := func(i int) uint64 { return binary.LittleEndian.Uint64(b[8*i:]) }
	n, ok := r.smi(slot(2))
	if !ok || n < 0 || n > 1<<16 {
		return "", -1
	}
	first := 3 + 2*int(n)
	name, start := "", int64(-1)
	extra := make([]uint64, 0, 8)
	if first+8 <= slots {
		for i := first; i < first+8; i++ {
			extra = append(extra, slot(i))
		}
	} else {
		var e [64]byte
		if _, err := r.Mem.ReadAt(e[:], int64(obj-1+8+8*uint64(first))); err != nil {
			return "", -1
		}
		for i := range 8 {
			extra = append(extra, binary.LittleEndian.Uint64(e[8*i:]))
		}
	}
	for i, v := range extra {
		if name == "" && isHeap(v) {
			name = r.String(v)
		}
		if i+1 < len(extra) && start < 0 {
			a, ok1 := r.smi(v)
			z, ok2 := r.smi(extra[i+1])
			if ok1 && ok2 && a >= 0 && a < z {
				start = a
			}
		}
	}
	return name, start
}

// bytecode is the BytecodeArray of a function's data (directly, or
// through its InterpreterData), 0 if it has none.
func (r *Reader) bytecode(data uint64, t uint16) uint64 {
	if t == r.L.TypeInterpreterData && r.L.InterpreterDataBytecode != 0 {
		bc, err := r.field(data, r.L.InterpreterDataBytecode)
		if err != nil {
			return 0
		}
		if bt, err := r.typeOf(bc); err != nil || bt != r.L.TypeBytecode {
			return 0
		}
		return bc
	}
	if t == r.L.TypeBytecode {
		return data
	}
	if t == r.L.TypeCode && r.L.TypeCode != 0 {
		// Baseline (Sparkplug) code keeps its function's bytecode.
		bc, err := r.field(data, r.L.CodeBytecode)
		if bt, err2 := r.typeOf(bc); err != nil || err2 != nil || bt != r.L.TypeBytecode {
			return 0
		}
		return bc
	}
	return 0
}

// positions decodes a BytecodeArray's source position table (V8's
// source-position-table.cc): entries of zig-zag VLQ deltas, the code
// offset's sign telling a statement, the source position a
// SourcePosition whose bits 1-30 hold the script offset plus one.
func (r *Reader) positions(bc uint64) []position {
	if r.L.BytecodeSourcePositions == 0 {
		return nil
	}
	tbl, err := r.field(bc, r.L.BytecodeSourcePositions)
	if err != nil {
		return nil
	}
	if t, err := r.typeOf(tbl); err != nil || t != r.L.TypeByteArray {
		return nil
	}
	lw, err := r.field(tbl, r.L.FixedArrayLength)
	n, ok := r.smi(lw)
	if err != nil || !ok || n <= 0 || n > 1<<20 {
		return nil
	}
	b := make([]byte, n)
	if _, err := r.Mem.ReadAt(b, int64(tbl-1+r.L.FixedArrayData)); err != nil {
		return nil
	}
	return decodePositions(b)
}

func decodePositions(b []byte) []position {
	var out []position
	var code, src int64
	i := 0
	next := func() (int64, bool) {
		var u uint64
		for shift := 0; i < len(b) && shift < 64; shift += 7 {
			c := b[i]
			i++
			u |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				return int64(u>>1) ^ -int64(u&1), true
			}
		}
		return 0, false
	}
	for i < len(b) {
		dc, ok1 := next()
		ds, ok2 := next()
		if !ok1 || !ok2 {
			break
		}
		if dc < 0 {
			dc = -dc - 1
		}
		code += dc
		src += ds
		out = append(out, position{code: code, script: (src>>1)&(1<<30-1) - 1})
	}
	return out
}
