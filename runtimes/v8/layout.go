// Package v8 reads V8's JavaScript functions (Node.js) from a process's
// memory: where the walker finds them in a frame, and their names,
// scripts and lines. The layout comes from the binary's own v8dbg_*
// constants (V8's tools/gen-postmortem-metadata.py writes them for
// debuggers), so a Node version is read without a table of its own.
package v8

import (
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// Layout is where one V8 build keeps what the walker and the namer read.
// Offsets are bytes into an object (untagged), frame offsets from the
// frame pointer.
type Layout struct {
	SmiShift int // a Smi's value is its word shifted right by this

	FPContext, FPFunction, FPBytecodeOffset int // a frame's slots

	// Object fields.
	HeapObjectMap, MapInstanceType                 uint64
	JSFunctionShared                               uint64
	SFINameOrScopeInfo, SFIFunctionData, SFIScript uint64
	ScriptName, ScriptSource, ScriptLineEnds       uint64
	StringLength, SeqOneByteChars, SeqTwoByteChars uint64
	ConsFirst, ConsSecond, ThinActual              uint64
	SlicedParent, SlicedOffset                     uint64
	FixedArrayLength, FixedArrayData               uint64
	BytecodeData, BytecodeSourcePositions          uint64
	UncompiledStart, UncompiledInferredName        uint64
	InterpreterDataBytecode                        uint64
	CodeBytecode                                   uint64 // baseline code: its BytecodeArray
	ExternalData                                   uint64 // an external string's cached characters

	// Instance types.
	TypeSFI, TypeScript, TypeScopeInfo, TypeBytecode, TypeFixedArray, TypeByteArray uint16
	TypeInterpreterData, TypeCode                                                   uint16
	TypeUncompiled                                                                  [4]uint16
	FirstNonString                                                                  uint16
	StringRepMask, StringEncMask, SeqTag, ConsTag, ThinTag, SlicedTag, OneByteTag   uint16
	ExtTag                                                                          uint16
}

// ErrNotV8 is returned for a binary without V8's constants.
var ErrNotV8 = errors.New("no v8dbg_* constants")

// Interp is the address range of the interpreter's entry builtins in the
// binary (link-time addresses): a return address there is an interpreted
// frame's.
type Interp struct{ Lo, Hi uint64 }

// ReadLayout reads a binary's V8 layout from its v8dbg_* symbols, and the
// range of its Builtins_Interpreter* code.
func ReadLayout(ef *elf.File) (*Layout, Interp, error) {
	syms, err := ef.Symbols()
	if err != nil || len(syms) == 0 {
		if syms, err = ef.DynamicSymbols(); err != nil {
			return nil, Interp{}, ErrNotV8
		}
	}
	c := map[string]int64{}
	var in Interp
	for _, s := range syms {
		switch {
		case strings.HasPrefix(s.Name, "v8dbg_"):
			if v, ok := symbolValue(ef, s); ok {
				c[strings.TrimPrefix(s.Name, "v8dbg_")] = v
			}
		case strings.HasPrefix(s.Name, "Builtins_InterpreterEntryTrampoline"), strings.HasPrefix(s.Name, "Builtins_InterpreterEnterAt"):
			if in.Lo == 0 || s.Value < in.Lo {
				in.Lo = s.Value
			}
			in.Hi = max(in.Hi, s.Value+s.Size)
		}
	}
	if len(c) == 0 {
		return nil, Interp{}, ErrNotV8
	}
	return layoutOf(c), in, layoutOf(c).check(c)
}

// symbolValue reads the integer a v8dbg_ symbol holds.
func symbolValue(ef *elf.File, s elf.Symbol) (int64, bool) {
	if s.Section >= elf.SectionIndex(len(ef.Sections)) || (s.Size != 4 && s.Size != 8) {
		return 0, false
	}
	sec := ef.Sections[s.Section]
	if s.Value < sec.Addr || s.Value+s.Size > sec.Addr+sec.Size {
		return 0, false
	}
	if sec.Type == elf.SHT_NOBITS {
		return 0, true // a constant of 0, zero-initialised
	}
	b := make([]byte, s.Size)
	if _, err := sec.ReadAt(b, int64(s.Value-sec.Addr)); err != nil {
		return 0, false
	}
	if s.Size == 4 {
		return int64(int32(binary.LittleEndian.Uint32(b))), true
	}
	return int64(binary.LittleEndian.Uint64(b)), true
}

// required: the constants without which nothing is named.
var required = []string{
	"SmiShiftSize", "off_fp_context", "off_fp_function",
	"class_HeapObject__map__Map", "class_Map__instance_type__uint16_t",
	"class_JSFunction__shared__SharedFunctionInfo",
	"class_SharedFunctionInfo__name_or_scope_info__Object",
	"class_SharedFunctionInfo__script_or_debug_info__HeapObject",
	"class_Script__name__Object", "class_String__length__int32_t",
	"class_SeqOneByteString__chars__char", "type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
}

func (l *Layout) check(c map[string]int64) error {
	var missing []string
	for _, k := range required {
		if _, ok := c[k]; !ok {
			missing = append(missing, "v8dbg_"+k)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("V8 build without %s", strings.Join(missing, ", "))
	}
	if v, ok := c["TaggedSize"]; ok && v != 8 {
		return fmt.Errorf("V8 built with pointer compression (tagged size %d): not read yet", v)
	}
	return nil
}

func layoutOf(c map[string]int64) *Layout {
	u := func(k string) uint64 { return uint64(c[k]) }
	t := func(k string) uint16 { return uint16(c[k]) }
	l := &Layout{
		SmiShift:  int(c["SmiShiftSize"]) + 1,
		FPContext: int(c["off_fp_context"]), FPFunction: int(c["off_fp_function"]),
		FPBytecodeOffset: int(c["off_fp_bytecode_offset"]),

		HeapObjectMap: u("class_HeapObject__map__Map"), MapInstanceType: u("class_Map__instance_type__uint16_t"),
		JSFunctionShared:        u("class_JSFunction__shared__SharedFunctionInfo"),
		SFINameOrScopeInfo:      u("class_SharedFunctionInfo__name_or_scope_info__Object"),
		SFIFunctionData:         u("class_SharedFunctionInfo__function_data__Object"),
		SFIScript:               u("class_SharedFunctionInfo__script_or_debug_info__HeapObject"),
		ScriptName:              u("class_Script__name__Object"),
		ScriptSource:            u("class_Script__source__Object"),
		ScriptLineEnds:          u("class_Script__line_ends__Object"),
		StringLength:            u("class_String__length__int32_t"),
		SeqOneByteChars:         u("class_SeqOneByteString__chars__char"),
		SeqTwoByteChars:         u("class_SeqTwoByteString__chars__char"),
		ConsFirst:               u("class_ConsString__first__String"),
		ConsSecond:              u("class_ConsString__second__String"),
		ThinActual:              u("class_ThinString__actual__String"),
		SlicedParent:            u("class_SlicedString__parent__String"),
		SlicedOffset:            u("class_SlicedString__offset__SMI"),
		FixedArrayLength:        u("class_FixedArrayBase__length__SMI"),
		FixedArrayData:          u("class_FixedArray__data__uintptr_t"),
		BytecodeData:            u("class_BytecodeArray__data__uintptr_t"),
		UncompiledStart:         u("class_UncompiledData__start_position__int32_t"),
		UncompiledInferredName:  u("class_UncompiledData__inferred_name__String"),
		InterpreterDataBytecode: u("class_InterpreterData__bytecode_array__BytecodeArray"),

		TypeSFI:             t("type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE"),
		TypeScript:          t("type_Script__SCRIPT_TYPE"),
		TypeScopeInfo:       t("type_ScopeInfo__SCOPE_INFO_TYPE"),
		TypeBytecode:        t("type_BytecodeArray__BYTECODE_ARRAY_TYPE"),
		TypeFixedArray:      t("type_FixedArray__FIXED_ARRAY_TYPE"),
		TypeByteArray:       t("type_ByteArray__BYTE_ARRAY_TYPE"),
		TypeInterpreterData: t("type_InterpreterData__INTERPRETER_DATA_TYPE"),
		TypeCode:            t("type_Code__CODE_TYPE"),
		TypeUncompiled: [4]uint16{
			t("type_UncompiledDataWithoutPreparseData__UNCOMPILED_DATA_WITHOUT_PREPARSE_DATA_TYPE"),
			t("type_UncompiledDataWithPreparseData__UNCOMPILED_DATA_WITH_PREPARSE_DATA_TYPE"),
			t("type_UncompiledDataWithoutPreparseDataWithJob__UNCOMPILED_DATA_WITHOUT_PREPARSE_DATA_WITH_JOB_TYPE"),
			t("type_UncompiledDataWithPreparseDataAndJob__UNCOMPILED_DATA_WITH_PREPARSE_DATA_AND_JOB_TYPE"),
		},
		FirstNonString: uint16(-c["IsNotStringMask"]),
		StringRepMask:  t("StringRepresentationMask"), StringEncMask: t("StringEncodingMask"),
		SeqTag: t("SeqStringTag"), ConsTag: t("ConsStringTag"), ThinTag: t("ThinStringTag"),
		SlicedTag: t("SlicedStringTag"), OneByteTag: t("OneByteStringTag"),
		ExtTag: t("ExternalStringTag"),
	}
	// Fields V8 publishes no constant for, as V8 11 lays them out (each
	// read is checked by the type of what it points to): a BytecodeArray's
	// source position table follows its constant pool and handler table;
	// baseline code keeps its bytecode where other code keeps its
	// deoptimization data; an external string caches a pointer to its
	// characters after its resource.
	if l.BytecodeData != 0 {
		l.BytecodeSourcePositions = 32
	}
	if v, ok := c["class_Code__deoptimization_data__FixedArray"]; ok {
		l.CodeBytecode = uint64(v)
	}
	if v, ok := c["class_ExternalString__resource__Object"]; ok {
		l.ExternalData = uint64(v) + 8
	}
	return l
}
