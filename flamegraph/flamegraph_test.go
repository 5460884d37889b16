package flamegraph

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/pprof/profile"

	"github.com/offcpu/offcpu/internal/testenv"
	"github.com/offcpu/offcpu/schema"
)

func load(t *testing.T, path string) *Profile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, err := ParseFolded(b, "us")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func render(t *testing.T, tr *Profile, o Options) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := Write(&buf, tr, o); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func wellFormed(t *testing.T, b []byte) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	for {
		if _, err := d.Token(); err == io.EOF {
			return
		} else if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
	}
}

func TestGoldenSVG(t *testing.T) {
	tr := load(t, "testdata/small.folded")
	for _, tc := range []struct {
		name string
		o    Options
	}{
		{"small.svg", Options{Title: "Off-CPU time"}},
		{"small-inverted.svg", Options{Title: "Icicle", Inverted: true, Palette: "wakeup"}},
	} {
		got := render(t, tr, tc.o)
		wellFormed(t, got)
		testenv.Golden(t, "testdata/"+tc.name, got)
	}
}

// fillOf returns the fill of the first frame whose tooltip starts with name.
func fillOf(t *testing.T, svg, name string) string {
	t.Helper()
	i := strings.Index(svg, "<title>"+name+" (")
	if i < 0 {
		t.Fatalf("no frame %s", name)
	}
	j := strings.Index(svg[i:], "fill=\"")
	return svg[i+j+6 : i+j+6+strings.Index(svg[i+j+6:], "\"")]
}

func TestSeparatorsAndKernelFrames(t *testing.T) {
	svg := string(render(t, load(t, "testdata/small.folded"), Options{}))
	for _, want := range []string{"all (10.401 ms, 100.00%)", "broker-io-0 (8.000 ms", "internalConsumerFlow (3.000 ms, 28.84%)"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	user := func(c string) bool { // the off-CPU user palette has r == g
		var r, g, b int
		fmt.Sscanf(c, "rgb(%d,%d,%d)", &r, &g, &b)
		return r == g
	}
	if c := fillOf(t, svg, "futex_wait"); user(c) {
		t.Errorf("kernel frame after '-' drawn as user code: %s", c)
	}
	if c := fillOf(t, svg, "dispatcher.(*Monitor).Enter"); !user(c) {
		t.Errorf("user frame drawn as kernel: %s", c)
	}
	// Offwake: after "--" the waker's kernel frames, after the next "-" its user frames.
	if c := fillOf(t, svg, "try_to_wake_up"); user(c) {
		t.Errorf("waker kernel frame after '--' drawn as user code: %s", c)
	}
	if c := fillOf(t, svg, "dispatcher.(*EventLoop).wakeup"); !user(c) {
		t.Errorf("waker user frame drawn as kernel: %s", c)
	}
	if c := fillOf(t, svg, "-"); c != "rgb(170,170,170)" {
		t.Errorf("'-' separator fill %s", c)
	}
	if c := fillOf(t, svg, "--"); c != "rgb(70,70,70)" {
		t.Errorf("'--' separator fill %s", c)
	}
	if _, err := ParseFolded([]byte("a;b\n"), "us"); err == nil {
		t.Error("a line without a value was accepted")
	}
}

func TestDiffColours(t *testing.T) {
	base, _ := ParseFolded([]byte("t;grows 100\nt;shrinks 300\nt;same 50\n"), "us")
	cand, _ := ParseFolded([]byte("t;grows 300\nt;shrinks 100\nt;same 50\n"), "us")
	cand.SetBase(base, false)
	svg := string(render(t, cand, Options{}))
	frame := func(name string) string { return fillOf(t, svg, name) }
	if c := frame("grows"); !strings.HasPrefix(c, "rgb(255,") {
		t.Errorf("grown frame is %s, want red", c)
	}
	if c := frame("shrinks"); !strings.HasSuffix(c, ",255)") {
		t.Errorf("shrunk frame is %s, want blue", c)
	}
	if c := frame("same"); c != "rgb(250,250,250)" {
		t.Errorf("unchanged frame is %s", c)
	}
	if !strings.Contains(svg, "base 0.300 ms, change -0.200 ms") {
		t.Error("tooltip lacks the change")
	}
}

func TestNarrowFramesMerged(t *testing.T) {
	var b bytes.Buffer
	b.WriteString("t;big 1000000\n")
	for i := 0; i < 5000; i++ {
		fmt.Fprintf(&b, "t;small%d;x 10\n", i)
	}
	tr, _ := ParseFolded(b.Bytes(), "us")
	svg := render(t, tr, Options{})
	wellFormed(t, svg)
	if !bytes.Contains(svg, []byte("[5000 narrow frames]")) {
		t.Error("narrow frames were not merged")
	}
	if bytes.Contains(svg, []byte("small42")) {
		t.Error("a frame narrower than --min-width was drawn")
	}
	// 5000 frames of 0.012 px make a 59 px group; 50 make a 0.59 px one,
	// too narrow to see: not drawn, as flamegraph.pl draws no such frame.
	var few bytes.Buffer
	few.WriteString("t;big 1000000\n")
	for i := 0; i < 50; i++ {
		fmt.Fprintf(&few, "t;small%d;x 10\n", i)
	}
	tr, _ = ParseFolded(few.Bytes(), "us")
	if svg := render(t, tr, Options{}); bytes.Contains(svg, []byte("narrow frames]")) {
		t.Error("a group of narrow frames under a pixel wide was drawn")
	}
	if len(svg) > 25000 {
		t.Errorf("SVG of %d bytes for 2 visible frames", len(svg))
	}
}

func TestHTMLTopFunctions(t *testing.T) {
	tr := load(t, "testdata/small.folded")
	h := string(render(t, tr, Options{HTML: true}))
	if !strings.HasPrefix(h, "<!DOCTYPE html>") || !strings.Contains(h, `<table id="top">`) || !strings.Contains(h, "<td>schedule</td>") {
		t.Errorf("HTML variant lacks the top-functions table")
	}
}

// GenerateFolded writes n unique stacks of depth 10 to 40, about 360
// bytes a stack (100,000 stacks: about 36 MB), like the input.
func GenerateFolded(n int) []byte {
	rng := rand.New(rand.NewSource(1))
	funcs := make([]string, 2000)
	for i := range funcs {
		funcs[i] = fmt.Sprintf("pkg%d.func%d", i%23, i)
	}
	var b bytes.Buffer
	for i := 0; i < n; i++ {
		depth := 10 + rng.Intn(31)
		fmt.Fprintf(&b, "thread-%d", rng.Intn(16))
		for d := 0; d < depth; d++ {
			f := funcs[(rng.Intn(8)+d*61)%len(funcs)]
			if d == depth-1 {
				f = fmt.Sprintf("leaf%d", i) // every stack unique
			}
			b.WriteByte(';')
			b.WriteString(f)
		}
		fmt.Fprintf(&b, " %d\n", 1+rng.Intn(5000))
	}
	return b.Bytes()
}

func BenchmarkFlamegraph100k(b *testing.B) {
	data := GenerateFolded(100000)
	b.SetBytes(int64(len(data)))
	var size int
	for i := 0; i < b.N; i++ {
		tr, err := ParseFolded(data, "us")
		if err != nil {
			b.Fatal(err)
		}
		var cw countWriter
		if err := Write(&cw, tr, Options{}); err != nil {
			b.Fatal(err)
		}
		size = int(cw)
	}
	b.ReportMetric(float64(size), "svg-bytes")
	b.ReportMetric(float64(len(data)), "input-bytes")
}

type countWriter int

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

// TestWriteBenchInput writes the benchmark's input for bench/flamegraph.sh
// when OFFCPU_FOLDED_OUT names a file.
func TestWriteBenchInput(t *testing.T) {
	path := os.Getenv("OFFCPU_FOLDED_OUT")
	if path == "" {
		t.Skip("OFFCPU_FOLDED_OUT not set (used by bench/flamegraph.sh)")
	}
	if err := os.WriteFile(path, GenerateFolded(100000), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Select keeps the named threads, groups them and shortens Go names.
func TestSelect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "in.folded")
	in := "broker-io-0;github.com/offcpu/offcpu/workload/dispatcher.(*Dispatcher).internalConsumerFlow;-;schedule 10\n" +
		"broker-io-1;github.com/offcpu/offcpu/workload/dispatcher.(*Dispatcher).internalConsumerFlow;-;schedule 5\n" +
		"client-io-0;main.loop 7\n"
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := Load("off_cpu", Select{Threads: regexp.MustCompile(`^broker`), GroupThreads: true}, path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range p.sorted() {
		got = append(got, fmt.Sprintf("%s %d", l.Stack, l.Value))
	}
	want := []string{"broker-io-N;dispatcher.(*Dispatcher).internalConsumerFlow;-;schedule 15"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	if _, err := Load("off_cpu", Select{Threads: regexp.MustCompile(`^nobody`)}, path); err == nil || !strings.Contains(err.Error(), "no samples of threads") {
		t.Errorf("err = %v, want no samples of threads", err)
	}
}

// A pprof profile whose stacks the selection leaves out holds nothing to
// draw: ErrNoSamples, which callers tell from a bad file (a bench whose
// candidate removed every blocked wait draws no graph of it, and still
// its diff).
func TestSelectNoneOfAProfile(t *testing.T) {
	p := &profile.Profile{SampleType: []*profile.ValueType{{Type: "off_cpu", Unit: "nanoseconds"}}}
	fn := &profile.Function{ID: 1, Name: "main.wait"}
	loc := &profile.Location{ID: 1, Line: []profile.Line{{Function: fn}}}
	p.Function, p.Location = []*profile.Function{fn}, []*profile.Location{loc}
	p.Sample = []*profile.Sample{{Location: []*profile.Location{loc}, Value: []int64{1000}}}
	path := filepath.Join(t.TempDir(), "p.pb.gz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(f); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if _, err := Load("off_cpu", Select{}, path); err != nil {
		t.Fatalf("kept: %v", err)
	}
	_, err = Load("off_cpu", Select{Keep: func(*schema.Stack) bool { return false }}, path)
	if !errors.Is(err, ErrNoSamples) {
		t.Errorf("err = %v, want ErrNoSamples", err)
	}
}
