package schema

import (
	"strings"
	"testing"
)

func TestScanFolded(t *testing.T) {
	var got []string
	err := ScanFolded([]byte("# comment\n\na;b;c 10\r\n  x;-;y  3\nlast 1"), func(stack []byte, v int64) error {
		got = append(got, string(stack)+"="+strings.Repeat("|", int(v)))
		return nil
	})
	want := []string{"a;b;c=||||||||||", "x;-;y=|||", "last=|"}
	if err != nil || strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("got %q, %v; want %q", got, err, want)
	}
	for _, bad := range []string{"a;b\n", "a;b x\n", "ok 1\nno-value\n"} {
		if err := ScanFolded([]byte(bad), func([]byte, int64) error { return nil }); err == nil || !strings.Contains(err.Error(), "not folded stacks") {
			t.Errorf("%q: error %v, want one saying it is not folded stacks", bad, err)
		}
	}
	if FoldedFrame("std::map<a;b>") != "std::map<a:b>" {
		t.Errorf("FoldedFrame kept a ';'")
	}
}
