package hotspot

import (
	"encoding/binary"
	"fmt"
)

// Frames names the Java frames at pc in compiled method b, innermost
// first: the methods inlined there, then the one compiled. They come from
// the nmethod's debug information: the PcDesc for pc (the last at or
// before it) gives a scope, each scope an enclosing one, a metadata index
// (the Method*) and a bci, as UNSIGNED5 numbers (libjvm_db.c
// scopeDesc_chain; the OpenTelemetry profiler's hotspotJITInfo.symbolize).
func (vm *VM) Frames(b Blob, pc uint64) ([]Frame, error) {
	if b.Kind != KindCompiled || pc < b.Start || pc >= b.End {
		return nil, fmt.Errorf("pc %#x not in compiled method at %#x", pc, b.Addr)
	}
	sc, ok := vm.scopeCache[b]
	if !ok {
		var err error
		if sc.meta, sc.pcs, sc.data, err = vm.scopes(b.Addr); err != nil {
			return nil, err
		}
		if len(vm.scopeCache) >= 4096 {
			clear(vm.scopeCache)
		}
		vm.scopeCache[b] = sc
	}
	meta, pcs, data := sc.meta, sc.pcs, sc.data
	o := vm.off
	descSize := vm.sizes["PcDesc"]
	if descSize == 0 {
		descSize = 16
	}
	at := int64(pc - b.Start)
	best, scope := int64(-2), uint64(0)
	for i := uint64(0); i+descSize <= uint64(len(pcs)); i += descSize {
		d := int64(int32(binary.LittleEndian.Uint32(pcs[i+o["PcDesc::_pc_offset"]:])))
		if d >= best && d <= at {
			best = d
			scope = uint64(binary.LittleEndian.Uint32(pcs[i+o["PcDesc::_scope_decode_offset"]:]))
			if d == at {
				break
			}
		}
	}
	var out []Frame
	limit := uint64(len(data))
	for n := 0; scope != 0 && scope < limit && n < 64; n++ {
		limit = scope // scopes point back: the chain ends
		r := unsigned5{b: data[scope:], x: vm.x}
		next, idx := r.next(), r.next()
		bci := int(r.next()) - 1 // stored plus one (InvocationEntryBci is -1)
		if r.err {
			return nil, fmt.Errorf("bad scope data in compiled method at %#x", b.Addr)
		}
		if idx > 0 && 8*uint64(idx) <= uint64(len(meta)) {
			m := binary.LittleEndian.Uint64(meta[8*(idx-1):])
			name, err := vm.MethodName(m)
			if err != nil {
				return nil, err
			}
			out = append(out, Frame{Name: name, Line: vm.Line(m, bci)})
		}
		scope = uint64(next)
	}
	if len(out) == 0 {
		name, err := vm.MethodName(b.Method)
		if err != nil {
			return nil, err
		}
		out = []Frame{{Name: name}}
	}
	return out, nil
}

// BCILayout is what turns an interpreter frame's bcp into a bci: the
// offset of Method::_constMethod and the size of a ConstMethod, whose
// bytecodes follow it.
func (vm *VM) BCILayout() (constMethodOff, constMethodSize uint32) {
	return uint32(vm.off["Method::_constMethod"]), uint32(vm.sizes["ConstMethod"])
}

// Frame is a Java frame: its method and its source line (0: unknown).
type Frame struct {
	Name string
	Line int
}

// Line is the source line of bci in method m, from the method's
// compressed line number table (after its bytecodes; each entry a byte of
// bci and line deltas, or 0xff and two signed UNSIGNED5 deltas; 0 ends
// it), as the JVM keeps it. 0 when the method has none or bci is outside.
func (vm *VM) Line(m uint64, bci int) int {
	if bci < 0 {
		return 0
	}
	t, ok := vm.lines[m]
	if !ok {
		t = vm.lineTable(m)
		vm.lines[m] = t
	}
	line, best := 0, -1
	for _, e := range t {
		if e[0] <= bci && e[0] >= best {
			best, line = e[0], e[1]
		}
	}
	return line
}

func (vm *VM) lineTable(m uint64) [][2]int {
	o := vm.off
	cm, err := vm.u64(m + o["Method::_constMethod"])
	if err != nil {
		return nil
	}
	flagsOff, ok := vm.field("ConstMethod::_flags._flags", "ConstMethod::_flags")
	codeOff, ok2 := o["ConstMethod::_code_size"]
	size := vm.sizes["ConstMethod"]
	if !ok || !ok2 || size == 0 {
		return nil
	}
	hdr, err := vm.read(cm, int(size))
	if err != nil || hdr[flagsOff]&1 == 0 { // _has_linenumber_table
		return nil
	}
	code := uint64(binary.LittleEndian.Uint16(hdr[codeOff:]))
	var buf []byte
	for n := 4096; n >= 64 && buf == nil; n /= 4 { // the table may end near unmapped memory
		buf, _ = vm.read(cm+size+code, n)
	}
	if buf == nil {
		return nil
	}
	r := unsigned5{b: buf, x: vm.x}
	var out [][2]int
	bci, line := 0, 0
	for len(r.b) > 0 && len(out) < 65536 {
		c := r.b[0]
		r.b = r.b[1:]
		switch c {
		case 0:
			return out
		case 0xff:
			bci += int(zigzag(r.next()))
			line += int(zigzag(r.next()))
			if r.err {
				return out
			}
		default:
			bci += int(c >> 3)
			line += int(c & 7)
		}
		out = append(out, [2]int{bci, line})
	}
	return out
}

// zigzag decodes a signed UNSIGNED5 number.
func zigzag(v uint32) int32 { return int32(v>>1) ^ -int32(v&1) }

// scopes reads a compiled method's metadata (Method* and other pointers),
// PcDesc table and scope data. Up to JDK 22 they follow the code in the
// blob; from 23 the scopes are in "immutable data" and from 25 the
// metadata in "mutable data", each allocated apart.
func (vm *VM) scopes(a uint64) (meta, pcs, data []byte, err error) {
	o := vm.off
	hdr, err := vm.read(a, int(max(vm.sizes["nmethod"], 256)))
	if err != nil {
		return nil, nil, nil, err
	}
	u32 := func(f string) uint64 { return uint64(binary.LittleEndian.Uint32(hdr[o[f]:])) }
	ptr := func(f string) uint64 { return binary.LittleEndian.Uint64(hdr[o[f]:]) }
	const maxSize = 1 << 20
	if _, ok := o["CompiledMethod::_scopes_data_begin"]; ok {
		m, d := a+u32("nmethod::_metadata_offset"), ptr("CompiledMethod::_scopes_data_begin")
		p, end := a+u32("nmethod::_scopes_pcs_offset"), a+u32("nmethod::_dependencies_offset")
		if !(m <= d && d <= p && p <= end && end-m < maxSize) {
			return nil, nil, nil, fmt.Errorf("compiled method at %#x: unexpected layout", a)
		}
		buf, err := vm.read(m, int(end-m))
		if err != nil {
			return nil, nil, nil, err
		}
		return buf[:d-m], buf[p-m:], buf[d-m : p-m], nil
	}
	imm, immSize := ptr("nmethod::_immutable_data"), u32("nmethod::_immutable_data_size")
	po, do := u32("nmethod::_scopes_pcs_offset"), u32("nmethod::_scopes_data_offset")
	if imm == 0 || !(po <= do && do <= immSize && immSize < maxSize) {
		return nil, nil, nil, fmt.Errorf("compiled method at %#x: unexpected layout", a)
	}
	var mAddr, mSize uint64
	if _, ok := o["CodeBlob::_mutable_data"]; ok {
		rel := u32("CodeBlob::_relocation_size")
		mAddr, mSize = ptr("CodeBlob::_mutable_data")+rel, u32("CodeBlob::_mutable_data_size")-rel
	} else {
		off := u32("CodeBlob::_data_offset") + uint64(binary.LittleEndian.Uint16(hdr[o["nmethod::_metadata_offset"]:]))
		mAddr, mSize = a+off, u32("CodeBlob::_size")-off
	}
	if mSize >= maxSize {
		return nil, nil, nil, fmt.Errorf("compiled method at %#x: metadata of %d bytes", a, mSize)
	}
	if meta, err = vm.read(mAddr, int(mSize)); err != nil {
		return nil, nil, nil, err
	}
	buf, err := vm.read(imm+po, int(immSize-po))
	if err != nil {
		return nil, nil, nil, err
	}
	return meta, buf[:do-po], buf[do-po:], nil
}
