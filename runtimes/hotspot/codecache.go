package hotspot

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

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
	lay, ok := vm.blobLayout()
	if !ok {
		return nil, fmt.Errorf("this JVM's CodeBlob has neither _code_begin nor _code_offset")
	}
	hb := make([]byte, hbSize)
	var runs []blobRun
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
		r := blobRun{low: low, i: len(cc.Blobs)}
		for p := low; p < high; {
			if err := vm.readInto(hb, p); err != nil {
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
				if b, ok := vm.blobAt(p+hbSize, lay); ok {
					cc.Blobs = append(cc.Blobs, b)
				}
			}
			p += n << shift
		}
		r.j = len(cc.Blobs)
		runs = append(runs, r)
	}
	if len(cc.Blobs) == 0 || cc.Low >= cc.High {
		return nil, errNotReady
	}
	cc.Blobs = inOrder(cc.Blobs, runs)
	return cc, nil
}

// blobRun is one heap's blobs, blobs[i:j], in address order.
type blobRun struct {
	low  uint64
	i, j int
}

// inOrder sorts the blobs by address: each heap's are in order already,
// so the heaps in order of their addresses make the whole (sorting the
// 64-byte Blobs was a third of a walk).
func inOrder(blobs []Blob, runs []blobRun) []Blob {
	slices.SortFunc(runs, func(a, b blobRun) int { return cmp.Compare(a.low, b.low) })
	sorted := make([]Blob, 0, len(blobs))
	for _, r := range runs {
		sorted = append(sorted, blobs[r.i:r.j]...)
	}
	byStart := func(a, b Blob) int { return cmp.Compare(a.Start, b.Start) }
	if !slices.IsSortedFunc(sorted, byStart) {
		slices.SortFunc(sorted, byStart)
	}
	return sorted
}

// window serves reads from the last few blocks of memory read (32 KiB
// each); reads crossing a block's end, or larger, go to r. Walks read
// memory mostly in order: the code heap's blocks, the introspection table
// and the strings it points to. Smaller blocks read less of the free
// space between blobs: 5,500 compiled methods, read with process_vm_readv,
// 2.2-2.4 ms a walk with 32 KiB, 2.4-2.8 with 256 KiB, 2.6 with 16 KiB,
// 4.0 with 4 KiB (BenchmarkCodeCacheWalk, sizes interleaved in one run).
type window struct {
	r    io.ReaderAt
	base [4]int64
	buf  [4][]byte
	next int
}

const windowSize = 32 << 10

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

// blobLayout is where a CodeBlob's fields are, looked up once a walk: its
// code range is two pointers up to JDK 22 (_code_begin, _code_end) and
// offsets from JDK 23 (_code_offset, _data_offset).
type blobLayout struct {
	begin, end     uint64 // _code_begin, _code_end; or with offsets:
	offsets        bool   // _code_offset, _data_offset (int32, from the blob)
	frameSize, nam uint64
	method         uint64 // nmethod::_method
	hasMethod      bool
	buf            []byte
}

func (vm *VM) blobLayout() (*blobLayout, bool) {
	o := vm.off
	l := &blobLayout{frameSize: o["CodeBlob::_frame_size"], nam: o["CodeBlob::_name"], buf: make([]byte, 256)}
	if b, ok := o["CodeBlob::_code_begin"]; ok {
		l.begin, l.end = b, o["CodeBlob::_code_end"]
	} else if b, ok := o["CodeBlob::_code_offset"]; ok {
		l.begin, l.end, l.offsets = b, o["CodeBlob::_data_offset"], true
	} else {
		return nil, false
	}
	l.method, l.hasMethod = vm.field("nmethod::_method", "CompiledMethod::_method")
	return l, true
}

// blobAt describes the CodeBlob at a.
func (vm *VM) blobAt(a uint64, l *blobLayout) (Blob, bool) {
	hdr := l.buf
	if err := vm.readInto(hdr, a); err != nil {
		return Blob{}, false
	}
	ptr := func(off uint64) uint64 { return binary.LittleEndian.Uint64(hdr[off:]) }
	i32 := func(off uint64) int32 { return int32(binary.LittleEndian.Uint32(hdr[off:])) }
	b := Blob{Addr: a}
	if l.offsets {
		b.Start, b.End = a+uint64(i32(l.begin)), a+uint64(i32(l.end))
	} else {
		b.Start, b.End = ptr(l.begin), ptr(l.end)
	}
	if b.End <= b.Start || b.Start < a || b.End-b.Start > 1<<28 {
		return Blob{}, false
	}
	if fs := i32(l.frameSize); fs > 0 && fs < 1<<16 {
		b.FrameSize = uint32(fs) * 8
	}
	b.Name, _ = vm.cstring(ptr(l.nam))
	switch b.Name {
	case "Interpreter":
		b.Kind = KindInterpreter
	case "nmethod", "native nmethod": // JDK 25 names native wrappers apart
		b.Kind = KindCompiled
		switch {
		case l.hasMethod && l.method+8 <= uint64(len(hdr)):
			b.Method = ptr(l.method)
		case l.hasMethod:
			b.Method, _ = vm.u64(a + l.method)
		}
	}
	return b, true
}
