package threadctx

import (
	"debug/elf"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/offcpu/offcpu/bpf"
)

// The process context's key map is found in Resource attributes and in
// extra attributes; a malformed payload yields none.
func TestAttributeKeyMap(t *testing.T) {
	str := func(s string) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte(s))
	}
	field := func(n protowire.Number, b []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, n, protowire.BytesType), b)
	}
	var arr []byte
	for _, s := range []string{"http.route", "", "tenant"} {
		arr = append(arr, field(1, str(s))...)
	}
	kv := append(field(1, []byte("threadlocal.attribute_key_map")), field(2, field(5, arr))...)
	other := append(field(1, []byte("service.name")), field(2, str("x"))...)
	want := "http.route,,tenant"
	for name, payload := range map[string][]byte{
		"extra":    append(field(2, other), field(2, kv)...),
		"resource": field(1, append(field(1, other), field(1, kv)...)),
	} {
		if got := strings.Join(attributeKeyMap(payload), ","); got != want {
			t.Errorf("%s: %q, want %q", name, got, want)
		}
	}
	if got := attributeKeyMap([]byte{0x12, 0xff, 0x01}); got != nil {
		t.Errorf("malformed: %q", got)
	}
}

// Mapped files that are not ELF (the kernel's BTF a forked child maps
// before its exec, locale archives) hold no variable and are no error; a
// damaged ELF file is one; a Go executable is read for its labels.
func TestTctxFileKinds(t *testing.T) {
	dir := t.TempDir()
	for name, b := range map[string][]byte{
		"btf":   {0x9f, 0xeb, 0x01, 0x00, 0x18, 0, 0, 0},
		"empty": nil,
		"elf":   append([]byte(elf.ELFMAG), 2, 1, 1, 0, 0xff),
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := openTctxFile(path)
		if f != nil || (err == errNoTctx) != (name != "elf") || err == nil {
			t.Errorf("%s: %v, %v", name, f, err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A Go executable: its threads' goroutine labels.
	if f, err := openTctxFile(self); f == nil || f.access != tlsGo || f.offset != -8 || f.goLabels == 0 || f.goLayout != bpf.GoLabelsSlice {
		t.Errorf("test binary: %+v, %v", f, err)
	}
}
