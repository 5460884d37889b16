package hotspot

import (
	"bytes"
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Remote reads what /proc/PID/mem reads, and stops short at an unreadable
// page with an error.
func TestRemoteReadsLikeProcMem(t *testing.T) {
	src := bytes.Repeat([]byte("offcpu-remote-"), 1000)
	r := Remote{PID: os.Getpid()}
	at := int64(uintptr(unsafe.Pointer(&src[0])))
	if !r.Usable(uint64(at)) {
		t.Skip("process_vm_readv refused here")
	}
	got := make([]byte, len(src))
	if n, err := r.ReadAt(got, at); err != nil || n != len(src) || !bytes.Equal(got, src) {
		t.Fatalf("ReadAt: %d, %v; equal %v", n, err, bytes.Equal(got, src))
	}
	// A page readable, the next one not.
	m, err := unix.Mmap(-1, 0, 2*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	page := os.Getpagesize()
	if err := unix.Mprotect(m[page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	m[0] = 7
	buf := make([]byte, 2*page)
	n, err := r.ReadAt(buf, int64(uintptr(unsafe.Pointer(&m[0]))))
	if n != page || err == nil || buf[0] != 7 {
		t.Errorf("read across the unreadable page: %d, %v (want %d and an error)", n, err, page)
	}
}
