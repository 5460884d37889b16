package symtab

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
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
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 3 {
			continue
		}
		switch f[1] {
		case "T", "t", "W", "w":
		default:
			continue
		}
		a, err := strconv.ParseUint(f[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		es = append(es, ent{a, f[2]})
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
