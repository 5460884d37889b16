package schema

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/google/pprof/profile"
)

// A SampleReader that reuses its buffers, with a RequestIndex, reads what
// FromProfile does, stack for stack: real recordings (waker stacks, GIL
// holders, waits split at the wake-up, on-CPU samples).
func TestSampleReaderMatchesFromProfile(t *testing.T) {
	files, _ := filepath.Glob("../analysis/testdata/real/*.pb.gz")
	files = append(files, "../analysis/testdata/jvm-contend.pb.gz")
	for _, path := range files {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		p, err := profile.Parse(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		want, err := FromProfile(p)
		if err != nil {
			t.Fatal(err)
		}
		r, err := NewSampleReader(p)
		if err != nil {
			t.Fatal(err)
		}
		r.Reuse()
		x := r.RequestIndex(p.Sample)
		var buf, got []Stack
		for _, s := range p.Sample {
			buf = r.Stacks(buf[:0], s)
			for _, st := range buf {
				x.Mark(&st)
				st.Frames = slices.Clone(st.Frames) // the buffer is reused
				got = append(got, st)
			}
		}
		if len(got) != len(want.Stacks) {
			t.Fatalf("%s: %d stacks, FromProfile %d", path, len(got), len(want.Stacks))
		}
		for i := range got {
			if !reflect.DeepEqual(got[i], want.Stacks[i]) {
				t.Fatalf("%s: stack %d differs:\n%+v\nFromProfile:\n%+v", path, i, got[i], want.Stacks[i])
			}
		}
		t.Logf("%s: %d stacks alike", filepath.Base(path), len(got))
	}
}
