// Package hotspot reads a running HotSpot JVM's own description of its
// structures (the gHotSpotVMStructs and gHotSpotVMTypes tables libjvm.so
// exports for the Serviceability Agent) to list its code cache and name
// its methods, with no flag, agent or attach. The fields read are those
// the OpenTelemetry eBPF profiler (interpreter/hotspot/data.go) and the
// Serviceability Agent (sun.jvm.hotspot.code.CodeCache, CodeHeap) use.
package hotspot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
)

// Frame layout of the x86-64 template interpreter (frame_x86.hpp, JDK 9
// to 25): slots below the frame pointer, in words.
const (
	InterpreterMethodSlot   = -3 // interpreter_frame_method_offset: the Method*
	InterpreterSenderSPSlot = -1 // interpreter_frame_sender_sp_offset: the caller's sp
)

// VM is one JVM process's introspection data and the names read so far.
type VM struct {
	mem     io.ReaderAt
	Version string // e.g. "17.0.15+6-Debian-1deb12u1"
	// x is the byte value UNSIGNED5 numbers start from: 1 from JDK 21
	// (and 20.0.15), where 0 was set apart; 0 before.
	x byte

	off   map[string]uint64 // "Type::_field" -> offset in the type
	addr  map[string]uint64 // "Type::_field" -> address of a static field
	sizes map[string]uint64 // type -> sizeof

	methods map[uint64]string // Method* -> pkg.Class.method
	symbols map[uint64]string // Symbol* -> text
	cstrs   map[uint64]string // char* -> text (blob names)

	// A compiled method's debug information, read once for all its pcs;
	// by the whole Blob, so that code replaced at the same address is read
	// again.
	scopeCache map[Blob]scopeData
	lines      map[uint64][][2]int // Method* -> (bci, line) pairs
}

type scopeData struct{ meta, pcs, data []byte }

// tables names the exported symbols of one introspection table.
type table struct {
	base, stride, typeName, fieldName, isStatic, offset, address, size string
}

var (
	structTable = table{base: "gHotSpotVMStructs", stride: "gHotSpotVMStructEntryArrayStride",
		typeName: "gHotSpotVMStructEntryTypeNameOffset", fieldName: "gHotSpotVMStructEntryFieldNameOffset",
		isStatic: "gHotSpotVMStructEntryIsStaticOffset", offset: "gHotSpotVMStructEntryOffsetOffset",
		address: "gHotSpotVMStructEntryAddressOffset"}
	typeTable = table{base: "gHotSpotVMTypes", stride: "gHotSpotVMTypeEntryArrayStride",
		typeName: "gHotSpotVMTypeEntryTypeNameOffset", size: "gHotSpotVMTypeEntrySizeOffset"}
)

// ErrNotJVM: the file exports no introspection tables.
var ErrNotJVM = errors.New("no HotSpot introspection tables (gHotSpotVMStructs) in this library")

// errNotReady: the VM has not set up its code cache yet; try again later.
var errNotReady = errors.New("the JVM's code cache is not set up yet")

// IsNotReady says whether err means the JVM is still starting.
func IsNotReady(err error) bool { return errors.Is(err, errNotReady) }

// Open reads the introspection tables of the JVM whose libjvm.so (lib) is
// loaded at bias (run-time address less ELF virtual address) in the
// process whose memory mem reads (/proc/PID/mem).
func Open(mem io.ReaderAt, lib *elf.File, bias uint64) (*VM, error) {
	at, err := exported(lib, "gHotSpotVM")
	if err != nil {
		return nil, ErrNotJVM
	}
	for n := range at {
		at[n] += bias
	}
	if at[structTable.base] == 0 || at[typeTable.base] == 0 {
		return nil, ErrNotJVM
	}
	vm := &VM{mem: &window{r: mem}, off: map[string]uint64{}, addr: map[string]uint64{}, sizes: map[string]uint64{},
		methods: map[uint64]string{}, symbols: map[uint64]string{}, cstrs: map[uint64]string{},
		scopeCache: map[Blob]scopeData{}, lines: map[uint64][][2]int{}}
	if err := vm.readTable(at, structTable); err != nil {
		return nil, err
	}
	if err := vm.readTable(at, typeTable); err != nil {
		return nil, err
	}
	vm.mem = mem // later reads are scattered: read what is asked
	if a := vm.addr["Abstract_VM_Version::_s_vm_release"]; a != 0 {
		if p, err := vm.u64(a); err == nil {
			vm.Version, _ = vm.cstring(p)
		}
	}
	major := 0
	fmt.Sscanf(vm.Version, "%d", &major)
	if major >= 21 {
		vm.x = 1
	}
	for _, need := range []string{"CodeCache::_heaps", "CodeHeap::_memory", "CodeHeap::_log2_segment_size",
		"VirtualSpace::_low", "VirtualSpace::_high", "VirtualSpace::_low_boundary", "VirtualSpace::_high_boundary",
		"CodeBlob::_name", "CodeBlob::_frame_size", "Method::_constMethod", "ConstMethod::_constants",
		"ConstMethod::_name_index", "ConstantPool::_pool_holder", "Klass::_name", "Symbol::_body"} {
		if _, ok := vm.field(need); !ok {
			return nil, fmt.Errorf("JVM %s: %s not described by its introspection tables", vm.Version, need)
		}
	}
	return vm, nil
}

// exported returns the dynamic symbols whose names start with prefix,
// scanning .dynsym in place: libjvm exports some 50,000 symbols, and
// decoding them all (elf.File.DynamicSymbols) took most of a second
// under the race detector.
func exported(lib *elf.File, prefix string) (map[string]uint64, error) {
	syms, strs := lib.Section(".dynsym"), lib.Section(".dynstr")
	if syms == nil || strs == nil || lib.Class != elf.ELFCLASS64 {
		return nil, ErrNotJVM
	}
	sd, err := syms.Data()
	if err != nil {
		return nil, err
	}
	st, err := strs.Data()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	p := []byte(prefix)
	for i := 0; i+elf.Sym64Size <= len(sd); i += elf.Sym64Size {
		name := binary.LittleEndian.Uint32(sd[i:])
		if int(name)+len(p) > len(st) || string(st[name:int(name)+len(p)]) != prefix {
			continue
		}
		end := int(name)
		for end < len(st) && st[end] != 0 {
			end++
		}
		out[string(st[name:end])] = binary.LittleEndian.Uint64(sd[i+8:])
	}
	return out, nil
}

func (vm *VM) readTable(at map[string]uint64, t table) error {
	word := func(name string) (uint64, error) {
		a, ok := at[name]
		if !ok {
			return 0, fmt.Errorf("%s not exported", name)
		}
		return vm.u64(a)
	}
	base, err := word(t.base)
	if err != nil {
		return err
	}
	stride, err := word(t.stride)
	if err != nil {
		return err
	}
	offs := map[string]uint64{}
	for _, n := range []string{t.typeName, t.fieldName, t.isStatic, t.offset, t.address, t.size} {
		if n == "" {
			continue
		}
		if offs[n], err = word(n); err != nil {
			return err
		}
	}
	if base == 0 || stride == 0 || stride > 256 {
		return fmt.Errorf("bad introspection table %s (base %#x, stride %d)", t.base, base, stride)
	}
	e := make([]byte, stride)
	for i := uint64(0); i < 1<<16; i++ {
		if _, err := vm.mem.ReadAt(e, int64(base+i*stride)); err != nil {
			return fmt.Errorf("reading %s: %w", t.base, err)
		}
		get := func(name string) uint64 { return binary.LittleEndian.Uint64(e[offs[name]:]) }
		tp := get(t.typeName)
		if tp == 0 {
			return nil
		}
		typeName, err := vm.cstring(tp)
		if err != nil {
			return err
		}
		if t.size != "" {
			vm.sizes[typeName] = get(t.size)
			continue
		}
		fieldName, err := vm.cstring(get(t.fieldName))
		if err != nil {
			return err
		}
		key := typeName + "::" + fieldName
		if binary.LittleEndian.Uint32(e[offs[t.isStatic]:]) != 0 {
			vm.addr[key] = get(t.address)
		} else {
			vm.off[key] = get(t.offset)
		}
	}
	return fmt.Errorf("%s: no end", t.base)
}

// field is the offset of a field, by any of its names across versions.
func (vm *VM) field(names ...string) (uint64, bool) {
	for _, n := range names {
		if o, ok := vm.off[n]; ok {
			return o, true
		}
		if a, ok := vm.addr[n]; ok {
			return a, true
		}
	}
	return 0, false
}

func (vm *VM) read(addr uint64, n int) ([]byte, error) {
	b := make([]byte, n)
	if addr == 0 {
		return nil, errors.New("null pointer")
	}
	if _, err := vm.mem.ReadAt(b, int64(addr)); err != nil {
		return nil, err
	}
	return b, nil
}

func (vm *VM) u64(addr uint64) (uint64, error) {
	b, err := vm.read(addr, 8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

func (vm *VM) u32(addr uint64) (uint32, error) {
	b, err := vm.read(addr, 4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (vm *VM) u16(addr uint64) (uint16, error) {
	b, err := vm.read(addr, 2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(b), nil
}

func (vm *VM) cstring(addr uint64) (string, error) {
	if s, ok := vm.cstrs[addr]; ok {
		return s, nil
	}
	var out []byte
	for len(out) < 4096 {
		b := make([]byte, 64)
		n, err := vm.mem.ReadAt(b, int64(addr)+int64(len(out)))
		if n == 0 && err != nil {
			return "", err
		}
		if i := bytes.IndexByte(b[:n], 0); i >= 0 {
			out = append(out, b[:i]...)
			s := string(out)
			vm.cstrs[addr] = s
			return s, nil
		}
		out = append(out, b[:n]...)
	}
	return "", fmt.Errorf("string at %#x too long", addr)
}

var hiddenSuffix = regexp.MustCompile(`[+/]0x[0-9a-f]+$`)

// Kind says how a frame in a blob is unwound and named.
type Kind uint8

const (
	KindStub        Kind = iota // frame of FrameSize bytes, or a frame-pointer frame when 0
	KindInterpreter             // template interpreter: rbp frames holding their Method*
	KindCompiled                // an nmethod: FrameSize bytes, named by its Method
)

// Blob is one piece of code in the code cache.
type Blob struct {
	Addr       uint64 // the CodeBlob
	Start, End uint64 // its instructions [Start, End)
	FrameSize  uint32 // bytes from sp to the caller's sp (return address included); 0: unknown
	Kind       Kind
	Name       string // the blob's own name ("nmethod", "Interpreter", a stub's)
	Method     uint64 // KindCompiled: its Method*
}

// CodeCache is where the JVM's generated code may be, and what is there now.
type CodeCache struct {
	Low, High uint64 // reserved bounds of all code heaps
	Blobs     []Blob // sorted by Start
}

// CodeCache walks every code heap's blocks (CodeHeap::next_block: a block
// header's length in segments leads to the next) and describes each blob.
func (vm *VM) CodeCache() (*CodeCache, error) {
	heaps, err := vm.heaps()
	if err != nil {
		return nil, err
	}
	o := vm.off
	memory, segShift := o["CodeHeap::_memory"], o["CodeHeap::_log2_segment_size"]
	hbSize := vm.sizes["HeapBlock"]
	if hbSize == 0 {
		hbSize = 16
	}
	lenOff, usedOff := uint64(0), uint64(8)
	if v, ok := vm.field("HeapBlock::Header::_length"); ok {
		lenOff = v
	}
	if v, ok := vm.field("HeapBlock::Header::_used"); ok {
		usedOff = v
	}
	cc := &CodeCache{Low: ^uint64(0)}
	// The walk reads every block: through windows of the heap, not a read
	// per block (5,500 compiled methods: 47 ms of CPU a walk on average,
	// naming included, read by block; 15 ms through windows).
	mem := vm.mem
	defer func() { vm.mem = mem }()
	vm.mem = &window{r: mem}
	for _, h := range heaps {
		hdr, err := vm.read(h, int(max(memory, segShift)+64))
		if err != nil {
			return nil, err
		}
		vs := func(f string) uint64 { return binary.LittleEndian.Uint64(hdr[memory+o["VirtualSpace::"+f]:]) }
		low, high := vs("_low"), vs("_high")
		cc.Low = min(cc.Low, vs("_low_boundary"))
		cc.High = max(cc.High, vs("_high_boundary"))
		shift := binary.LittleEndian.Uint32(hdr[segShift:])
		if shift == 0 || shift > 20 || high < low {
			return nil, fmt.Errorf("bad code heap at %#x", h)
		}
		for p := low; p < high; {
			hb, err := vm.read(p, int(hbSize))
			if err != nil {
				return nil, err
			}
			var n uint64
			if usedOff-lenOff >= 8 { // size_t up to JDK 24, uint32_t from 25
				n = binary.LittleEndian.Uint64(hb[lenOff:])
			} else {
				n = uint64(binary.LittleEndian.Uint32(hb[lenOff:]))
			}
			if n == 0 {
				break
			}
			if hb[usedOff] != 0 {
				if b, ok := vm.blob(p + hbSize); ok {
					cc.Blobs = append(cc.Blobs, b)
				}
			}
			p += n << shift
		}
	}
	if len(cc.Blobs) == 0 || cc.Low >= cc.High {
		return nil, errNotReady
	}
	sort.Slice(cc.Blobs, func(i, j int) bool { return cc.Blobs[i].Start < cc.Blobs[j].Start })
	return cc, nil
}

// window serves reads from the last few blocks of memory read (256 KiB
// each); reads crossing a block's end, or larger, go to r. Walks read
// memory mostly in order: the code heap's blocks, the introspection table
// and the strings it points to.
type window struct {
	r    io.ReaderAt
	base [4]int64
	buf  [4][]byte
	next int
}

const windowSize = 256 << 10

func (w *window) ReadAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	for i, b := range w.buf {
		if off >= w.base[i] && end <= w.base[i]+int64(len(b)) {
			return copy(p, b[off-w.base[i]:]), nil
		}
	}
	if len(p) > windowSize/4 {
		return w.r.ReadAt(p, off)
	}
	i := w.next
	w.next = (w.next + 1) % len(w.buf)
	if w.buf[i] == nil {
		w.buf[i] = make([]byte, windowSize)
	}
	w.base[i] = off &^ 4095
	n, _ := w.r.ReadAt(w.buf[i][:windowSize], w.base[i])
	w.buf[i] = w.buf[i][:n]
	if end > w.base[i]+int64(n) {
		return w.r.ReadAt(p, off) // the block ends early (unmapped): read just p
	}
	return copy(p, w.buf[i][off-w.base[i]:]), nil
}

// heaps returns the CodeHeap* of CodeCache::_heaps (a GrowableArray).
func (vm *VM) heaps() ([]uint64, error) {
	arr, err := vm.u64(vm.addr["CodeCache::_heaps"])
	if err != nil || arr == 0 {
		return nil, errNotReady
	}
	lenOff, ok := vm.field("GrowableArrayBase::_len", "GenericGrowableArray::_len")
	if !ok {
		return nil, fmt.Errorf("JVM %s: GrowableArray length not described", vm.Version)
	}
	dataOff, ok := vm.field("GrowableArray<int>::_data")
	if !ok {
		return nil, fmt.Errorf("JVM %s: GrowableArray data not described", vm.Version)
	}
	n, err := vm.u32(arr + lenOff)
	if err != nil || n == 0 {
		return nil, errNotReady
	}
	if n > 16 {
		return nil, fmt.Errorf("JVM %s: %d code heaps", vm.Version, n)
	}
	data, err := vm.u64(arr + dataOff)
	if err != nil || data == 0 {
		return nil, errNotReady
	}
	b, err := vm.read(data, int(8*n))
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n)
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
		if out[i] == 0 {
			return nil, errNotReady
		}
	}
	return out, nil
}

// blob describes the CodeBlob at a: its code range is two pointers up to
// JDK 22 (_code_begin, _code_end) and offsets from JDK 23 (_code_offset,
// _data_offset).
func (vm *VM) blob(a uint64) (Blob, bool) {
	hdr, err := vm.read(a, 256)
	if err != nil {
		return Blob{}, false
	}
	o := vm.off
	ptr := func(f string) uint64 { return binary.LittleEndian.Uint64(hdr[o[f]:]) }
	i32 := func(f string) int32 { return int32(binary.LittleEndian.Uint32(hdr[o[f]:])) }
	b := Blob{Addr: a}
	if _, ok := o["CodeBlob::_code_begin"]; ok {
		b.Start, b.End = ptr("CodeBlob::_code_begin"), ptr("CodeBlob::_code_end")
	} else if _, ok := o["CodeBlob::_code_offset"]; ok {
		b.Start, b.End = a+uint64(i32("CodeBlob::_code_offset")), a+uint64(i32("CodeBlob::_data_offset"))
	} else {
		return Blob{}, false
	}
	if b.End <= b.Start || b.Start < a || b.End-b.Start > 1<<28 {
		return Blob{}, false
	}
	if fs := i32("CodeBlob::_frame_size"); fs > 0 && fs < 1<<16 {
		b.FrameSize = uint32(fs) * 8
	}
	b.Name, _ = vm.cstring(ptr("CodeBlob::_name"))
	switch b.Name {
	case "Interpreter":
		b.Kind = KindInterpreter
	case "nmethod", "native nmethod": // JDK 25 names native wrappers apart
		b.Kind = KindCompiled
		if mo, ok := vm.field("nmethod::_method", "CompiledMethod::_method"); ok {
			b.Method, _ = vm.u64(a + mo)
		}
	}
	return b, true
}

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

// MethodName names a Method* as pkg.Class.method (the class's name from
// its constant pool holder, the method's from the pool entry at its name
// index), remembering the answer: the method stays named after the
// process exits.
func (vm *VM) MethodName(m uint64) (string, error) {
	if s, ok := vm.methods[m]; ok {
		return s, nil
	}
	o := vm.off
	cm, err := vm.u64(m + o["Method::_constMethod"])
	if err != nil {
		return "", err
	}
	cp, err := vm.u64(cm + o["ConstMethod::_constants"])
	if err != nil {
		return "", err
	}
	idx, err := vm.u16(cm + o["ConstMethod::_name_index"])
	if err != nil {
		return "", err
	}
	holder, err := vm.u64(cp + o["ConstantPool::_pool_holder"])
	if err != nil {
		return "", err
	}
	ksym, err := vm.u64(holder + o["Klass::_name"])
	if err != nil {
		return "", err
	}
	class, err := vm.symbol(ksym)
	if err != nil {
		return "", err
	}
	cpSize := vm.sizes["ConstantPool"]
	if cpSize == 0 || idx == 0 {
		return "", fmt.Errorf("method %#x: no name index", m)
	}
	nsym, err := vm.u64(cp + cpSize + 8*uint64(idx))
	if err != nil {
		return "", err
	}
	name, err := vm.symbol(nsym &^ 1)
	if err != nil {
		return "", err
	}
	// A hidden class (lambda forms) carries its address: drop it, so
	// that one lambda has one name across runs.
	class = hiddenSuffix.ReplaceAllString(class, "")
	s := strings.ReplaceAll(class, "/", ".") + "." + name
	vm.methods[m] = s
	return s, nil
}

// symbol reads a Symbol's text: a u16 length (in _length_and_refcount's
// upper half from JDK 12) and the bytes at _body.
func (vm *VM) symbol(a uint64) (string, error) {
	if s, ok := vm.symbols[a]; ok {
		return s, nil
	}
	o := vm.off
	lenOff, ok := o["Symbol::_length"]
	if !ok {
		lr, ok := o["Symbol::_length_and_refcount"]
		if !ok {
			return "", fmt.Errorf("JVM %s: Symbol length not described", vm.Version)
		}
		lenOff = lr + 2
	}
	n, err := vm.u16(a + lenOff)
	if err != nil {
		return "", err
	}
	b, err := vm.read(a+o["Symbol::_body"], int(n))
	if err != nil {
		return "", err
	}
	for _, c := range b {
		if c < 0x20 || c == 0x7f {
			return "", fmt.Errorf("symbol at %#x is not text", a)
		}
	}
	s := string(b)
	vm.symbols[a] = s
	return s, nil
}

// Method returns a name read before, without reading memory.
func (vm *VM) Method(m uint64) (string, bool) {
	s, ok := vm.methods[m]
	return s, ok
}
