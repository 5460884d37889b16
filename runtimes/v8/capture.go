package v8

import (
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
)

// Fixture is what a Reader read from a live process while naming some of
// its functions, and what it named them: a test replays it without the
// process (and without root).
type Fixture struct {
	Layout    Layout            `json:"layout"`
	Reads     map[uint64][]byte `json:"reads"`
	Functions []FixtureFunction `json:"functions"`
}

// FixtureFunction is one SharedFunctionInfo and the frame slots it was
// named at.
type FixtureFunction struct {
	SFI    uint64 `json:"sfi"`
	Name   string `json:"name"`
	Script string `json:"script"`
	Line   int    `json:"line"`
}

// Capture records a Reader's reads into a Fixture, keeping those made for
// the functions of scripts whose name ends with Keep.
type Capture struct {
	Mem  io.ReaderAt
	Keep string

	mu      sync.Mutex
	pending map[uint64][]byte
	fx      Fixture
}

func (c *Capture) ReadAt(b []byte, off int64) (int, error) {
	n, err := c.Mem.ReadAt(b, off)
	c.mu.Lock()
	if c.pending == nil {
		c.pending = map[uint64][]byte{}
	}
	if n > 0 {
		c.pending[uint64(off)] = append([]byte(nil), b[:n]...)
	}
	c.mu.Unlock()
	return n, err
}

// Function names sfi through r (whose Mem is c) and keeps its reads if
// its script is one kept.
func (c *Capture) Function(r *Reader, sfi uint64) (*Function, error) {
	c.mu.Lock()
	c.pending = map[uint64][]byte{}
	c.mu.Unlock()
	f, err := r.Function(sfi)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.Keep != "" && strings.HasSuffix(f.Script, c.Keep) {
		if c.fx.Reads == nil {
			c.fx.Reads = map[uint64][]byte{}
		}
		for a, b := range c.pending {
			c.fx.Reads[a] = b
		}
		c.fx.Functions = append(c.fx.Functions, FixtureFunction{SFI: sfi, Name: f.Name, Script: f.Script, Line: f.Line})
	}
	c.pending = nil
	return f, err
}

// Save writes the fixture, gzipped JSON.
func (c *Capture) Save(path string, l *Layout) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fx.Layout = *l
	sort.Slice(c.fx.Functions, func(i, j int) bool { return c.fx.Functions[i].SFI < c.fx.Functions[j].SFI })
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	z := gzip.NewWriter(f)
	if err := json.NewEncoder(z).Encode(&c.fx); err != nil {
		f.Close()
		return err
	}
	if err := z.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// LoadFixture reads a fixture Save wrote.
func LoadFixture(path string) (*Fixture, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, err
	}
	var fx Fixture
	if err := json.NewDecoder(z).Decode(&fx); err != nil {
		return nil, err
	}
	return &fx, nil
}

// ReadAt replays the fixture's reads: a read must fall inside one made
// when it was captured.
func (fx *Fixture) ReadAt(b []byte, off int64) (int, error) {
	a := uint64(off)
	for start, data := range fx.Reads {
		if a >= start && a+uint64(len(b)) <= start+uint64(len(data)) {
			return copy(b, data[a-start:]), nil
		}
	}
	return 0, io.ErrUnexpectedEOF
}
