// Package ruby reads CRuby's frames from a running process: the layout
// of each version's structures (from its headers), the library that holds
// the VM (libruby), the iseqs and method entries the walker found, and
// their lines. Modelled on CRuby's own rb_profile_frames and
// rb_iseq_line_no (vm_backtrace.c, iseq.c; 3.1.2's sources were read).
package ruby

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Layout: the offsets of one CRuby version's structures (x86-64).
type Layout struct {
	ECVMStack, ECVMStackSize, ECCfp, ECThread uint16
	CfpSize, CfpPC, CfpIseq, CfpEP            uint16
	IseqBody, BodyEncoded                     uint16
	ThRactor, ThEC, ThTID, ThGVLNode          uint16
	ThGVLCond, RactorGVL, GVLLock, GVLSwitch  uint16

	// Read by user space: an iseq body's location and line table.
	BodyPath, BodyLabel, BodyFirstLine     uint64
	BodyInsnsInfo, BodyInsnsSize, BodySucc uint64
	InsnInfoSize                           uint64 // an iseq_insn_info_entry; line_no at 0
	StringNoEmbed                          uint64 // RSTRING_NOEMBED
	StringEmbedLenShift                    uint   // an embedded string's length in its flags
	StringHeapLen, StringHeapPtr           uint64 // as.heap
	StringEmbed                            uint64 // as.embed.ary
	ArrayEmbed                             uint64 // RARRAY_EMBED_FLAG
	ArrayHeapPtr, ArrayEmbedAry            uint64
}

// layouts by major.minor, from vm_core.h, iseq.h, thread_pthread.h and
// ractor_core.h of each version; 3.1's were checked against Debian 12's
// libruby 3.1.2 by disassembly and in a running process.
var layouts = map[string]Layout{
	"3.1": {
		ECVMStack: 0, ECVMStackSize: 8, ECCfp: 0x10, ECThread: 0x30,
		CfpSize: 64, CfpPC: 0, CfpIseq: 0x10, CfpEP: 0x20,
		IseqBody: 0x10, BodyEncoded: 8,
		ThRactor: 0x18, ThEC: 0x28, ThTID: 0x58, ThGVLNode: 0x68,
		ThGVLCond: 0x78, RactorGVL: 0x150, GVLLock: 8, GVLSwitch: 0x50,
		BodyPath: 0x40, BodyLabel: 0x50, BodyFirstLine: 0x58,
		BodyInsnsInfo: 0x78, BodyInsnsSize: 0x88, BodySucc: 0x90, InsnInfoSize: 12,
		StringNoEmbed: 1 << 13, StringEmbedLenShift: 14, StringHeapLen: 0x10, StringHeapPtr: 0x18, StringEmbed: 0x10,
		ArrayEmbed: 1 << 13, ArrayHeapPtr: 0x20, ArrayEmbedAry: 0x10,
	},
}

// Lib is a libruby as read once: its version, its layout, where the VM's
// loop is, and how a thread reaches ruby_current_ec.
type Lib struct {
	Version     string
	Layout      Layout
	ExecLo      uint64 // rb_vm_exec: each activation runs frames up to a FINISH frame
	ExecHi      uint64
	TLSGot      uint64 // the GOT slot of ruby_current_ec's module id (file address)
	TLSOffset   uint64 // ruby_current_ec in the module's TLS block
	Unsupported string // why a libruby is not read ("" when it is)
}

// ErrNotRuby: the file holds no CRuby VM.
var ErrNotRuby = errors.New("not libruby")

// ReadLib recognises a libruby (or a ruby statically linked) by its
// dynamic symbols.
func ReadLib(ef *elf.File) (*Lib, error) {
	syms, err := ef.DynamicSymbols()
	if err != nil {
		return nil, ErrNotRuby
	}
	l := &Lib{}
	ecIdx := -1
	var version elf.Symbol
	for i, s := range syms {
		if s.Section == elf.SHN_UNDEF {
			continue
		}
		switch s.Name {
		case "ruby_current_ec":
			ecIdx, l.TLSOffset = i+1, s.Value // DynamicSymbols leaves out symbol 0
		case "rb_vm_exec":
			l.ExecLo, l.ExecHi = s.Value, s.Value+s.Size
		case "ruby_version":
			version = s
		}
	}
	if ecIdx < 0 || l.ExecLo == 0 {
		return nil, ErrNotRuby
	}
	l.Version = readCString(ef, version.Value)
	mm := l.Version
	if parts := strings.SplitN(l.Version, ".", 3); len(parts) >= 2 {
		mm = parts[0] + "." + parts[1]
	}
	lay, ok := layouts[mm]
	if !ok || ef.Machine != elf.EM_X86_64 {
		l.Unsupported = fmt.Sprintf("Ruby %q on %v: layout not known (known: 3.1 on x86-64)", l.Version, ef.Machine)
		return l, nil
	}
	l.Layout = lay
	if l.TLSGot = dtpmodSlot(ef, uint32(ecIdx)); l.TLSGot == 0 {
		l.Unsupported = "Ruby " + l.Version + ": ruby_current_ec not reached through a GOT module slot"
	}
	return l, nil
}

// dtpmodSlot is the GOT slot a R_X86_64_DTPMOD64 relocation of symbol
// sym fills (the global-dynamic model: the module id, then the offset).
func dtpmodSlot(ef *elf.File, sym uint32) uint64 {
	const rDTPMOD64 = 16
	for _, sec := range ef.Sections {
		if sec.Type != elf.SHT_RELA {
			continue
		}
		b, err := sec.Data()
		if err != nil {
			continue
		}
		for i := 0; i+24 <= len(b); i += 24 {
			off := binary.LittleEndian.Uint64(b[i:])
			info := binary.LittleEndian.Uint64(b[i+8:])
			if uint32(info) == rDTPMOD64 && uint32(info>>32) == sym {
				return off
			}
		}
	}
	return 0
}

// readCString reads a NUL-terminated string at a file address.
func readCString(ef *elf.File, addr uint64) string {
	for _, p := range ef.Progs {
		if p.Type != elf.PT_LOAD || addr < p.Vaddr || addr >= p.Vaddr+p.Filesz {
			continue
		}
		b := make([]byte, 32)
		n, _ := p.ReadAt(b, int64(addr-p.Vaddr))
		b = b[:n]
		if i := bytes.IndexByte(b, 0); i >= 0 {
			b = b[:i]
		}
		return string(b)
	}
	return ""
}
