package symtab

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sort"
	"strconv"
)

// Kernel is /proc/kallsyms, text symbols sorted by address.
type Kernel struct {
	addrs []uint64
	names []string
}

// LoadKallsyms reads text symbols in /proc/kallsyms's format.
func LoadKallsyms(r io.Reader) (*Kernel, error) {
	k := &Kernel{}
	type ent struct {
		a uint64
		n string
	}
	var es []ent
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	// The names are copied out of the lines, so that a name does not keep
	// its whole line (addresses, types, modules) alive: 200,000 symbols.
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
		es = append(es, ent{a, string(name)})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading kallsyms: %w", err)
	}
	sort.Slice(es, func(i, j int) bool { return es[i].a < es[j].a })
	for _, e := range es {
		k.addrs = append(k.addrs, e.a)
		k.names = append(k.names, e.n)
	}
	return k, nil
}

// Lookup names a kernel address; an address below every symbol reads
// [kernel]+0x....
func (k *Kernel) Lookup(addr uint64) string {
	i := sort.Search(len(k.addrs), func(i int) bool { return k.addrs[i] > addr }) - 1
	if i < 0 {
		return fmt.Sprintf("[kernel]+0x%x", addr)
	}
	return k.names[i]
}
