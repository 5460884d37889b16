package hotspot

import (
	"errors"
	"io"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Remote reads another process's memory with process_vm_readv: one copy
// into p, its pages pinned in batches. /proc/PID/mem copies each page twice
// (through a kernel page) and takes the address-space lock for each.
type Remote struct{ PID int }

// ReadAt reads len(p) bytes at address off; short where the range stops
// being mapped, with an error.
func (r Remote) ReadAt(p []byte, off int64) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	local := []unix.Iovec{{Base: unsafe.SliceData(p), Len: uint64(len(p))}}
	remote := []unix.RemoteIovec{{Base: uintptr(off), Len: len(p)}}
	n, err := unix.ProcessVMReadv(r.PID, local, remote, 0)
	if err != nil {
		return 0, err
	}
	if n < len(p) {
		return n, io.ErrUnexpectedEOF
	}
	return n, nil
}

// Usable says whether process_vm_readv works here (seccomp or an old
// kernel may refuse it): a read of addr, which must be mapped.
func (r Remote) Usable(addr uint64) bool {
	var b [8]byte
	_, err := r.ReadAt(b[:], int64(addr))
	return err == nil || !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EPERM)
}
