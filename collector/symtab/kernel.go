package symtab

import (
	"bufio"
	"bytes"
	"cmp"
	"fmt"
	"io"
	"slices"
	"sort"
	"strconv"
	"unsafe"
)

// Kernel is /proc/kallsyms, text symbols sorted by address. The names
// are one block of bytes, read in place: about 120,000 symbols, which as
// separate strings took twice the memory.
type Kernel struct {
	addrs []uint64
	ends  []uint32 // names[i] is blob[ends[i-1]:ends[i]]
	blob  []byte
}

// LoadKallsyms reads text symbols in /proc/kallsyms's format.
func LoadKallsyms(r io.Reader) (*Kernel, error) {
	var addrs []uint64
	var ends []uint32
	var blob []byte
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		addr, rest, ok1 := bytes.Cut(line, []byte{' '})
		typ, rest, ok2 := bytes.Cut(rest, []byte{' '})
		if !ok1 || !ok2 || len(typ) != 1 {
			continue
		}
		switch typ[0] {
		case 'T', 't', 'W', 'w':
		default:
			continue
		}
		name, _, _ := bytes.Cut(rest, []byte{'\t'}) // "name\t[module]"
		name = bytes.TrimSpace(name)
		if len(name) == 0 {
			continue
		}
		a, err := strconv.ParseUint(string(addr), 16, 64)
		if err != nil || a == 0 {
			continue
		}
		addrs = append(addrs, a)
		blob = append(blob, name...)
		ends = append(ends, uint32(len(blob)))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading kallsyms: %w", err)
	}
	// Mostly in address order already (modules are not): sort an index.
	order := make([]uint32, len(addrs))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortStableFunc(order, func(i, j uint32) int { return cmp.Compare(addrs[i], addrs[j]) })
	k := &Kernel{addrs: make([]uint64, len(addrs)), ends: make([]uint32, len(addrs)), blob: make([]byte, 0, len(blob))}
	for n, i := range order {
		from := uint32(0)
		if i > 0 {
			from = ends[i-1]
		}
		k.addrs[n] = addrs[i]
		k.blob = append(k.blob, blob[from:ends[i]]...)
		k.ends[n] = uint32(len(k.blob))
	}
	return k, nil
}

func (k *Kernel) name(i int) string {
	from := uint32(0)
	if i > 0 {
		from = k.ends[i-1]
	}
	// The block is never written after loading: names share it.
	return unsafe.String(&k.blob[from], int(k.ends[i]-from))
}

// Lookup names a kernel address; an address below every symbol reads
// [kernel]+0x....
func (k *Kernel) Lookup(addr uint64) string {
	i := sort.Search(len(k.addrs), func(i int) bool { return k.addrs[i] > addr }) - 1
	if i < 0 {
		return fmt.Sprintf("[kernel]+0x%x", addr)
	}
	return k.name(i)
}
