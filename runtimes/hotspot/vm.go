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

// readInto fills b from addr, without allocating.
func (vm *VM) readInto(b []byte, addr uint64) error {
	if addr == 0 {
		return errors.New("null pointer")
	}
	_, err := vm.mem.ReadAt(b, int64(addr))
	return err
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
