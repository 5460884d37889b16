package timeline

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers and enum values of Perfetto's trace protos, from
// github.com/google/perfetto (read at ec5d16b14b743ba6063d720956d6d6af6610fd72):
//
//	protos/perfetto/trace/trace.proto                            Trace
//	protos/perfetto/trace/trace_packet.proto                     TracePacket, SequenceFlags
//	protos/perfetto/trace/trace_packet_defaults.proto            TracePacketDefaults
//	protos/perfetto/common/builtin_clock.proto                   BuiltinClock
//	protos/perfetto/trace/clock_snapshot.proto                   ClockSnapshot
//	protos/perfetto/trace/track_event/track_descriptor.proto     TrackDescriptor
//	protos/perfetto/trace/track_event/process_descriptor.proto   ProcessDescriptor
//	protos/perfetto/trace/track_event/thread_descriptor.proto    ThreadDescriptor
//	protos/perfetto/trace/track_event/track_event.proto          TrackEvent, EventName, EventCategory
//	protos/perfetto/trace/track_event/debug_annotation.proto     DebugAnnotation, DebugAnnotationName
//	protos/perfetto/trace/interned_data/interned_data.proto      InternedData
//	protos/perfetto/trace/profiling/profile_common.proto         InternedString, Mapping, Frame, Callstack
//
// Values of the fields below.
const (
	seqIncrementalCleared = 1 // SEQ_INCREMENTAL_STATE_CLEARED
	clockMonotonic        = 3 // BUILTIN_CLOCK_MONOTONIC
	// clockDeltas: a clock of the sequence's own (64..127) whose packet
	// timestamps are deltas (ClockSnapshot.Clock.is_incremental), as the
	// Perfetto SDK's TrackEventIncrementalState::kClockIdIncremental.
	clockDeltas = 64
)

const (
	fTracePacket protowire.Number = 1 // Trace.packet

	// TracePacket.
	fPacketClockSnapshot protowire.Number = 6
	fPacketTimestamp     protowire.Number = 8
	fPacketSequenceID    protowire.Number = 10 // trusted_packet_sequence_id
	fPacketTrackEvent    protowire.Number = 11
	fPacketInternedData  protowire.Number = 12
	fPacketSequenceFlags protowire.Number = 13
	fPacketDefaults      protowire.Number = 59 // trace_packet_defaults
	fPacketTrackDesc     protowire.Number = 60 // track_descriptor
	fPacketFirstOnSeq    protowire.Number = 87 // first_packet_on_sequence

	fDefaultsClockID protowire.Number = 58 // TracePacketDefaults.timestamp_clock_id

	// ClockSnapshot, ClockSnapshot.Clock.
	fSnapshotClocks     protowire.Number = 1
	fSnapshotPrimary    protowire.Number = 2 // primary_trace_clock
	fClockID            protowire.Number = 1
	fClockTimestamp     protowire.Number = 2
	fClockIsIncremental protowire.Number = 3

	// TrackDescriptor.
	fTrackUUID    protowire.Number = 1
	fTrackName    protowire.Number = 2
	fTrackProcess protowire.Number = 3
	fTrackThread  protowire.Number = 4
	fTrackParent  protowire.Number = 5 // parent_uuid

	// ProcessDescriptor.
	fProcessPID  protowire.Number = 1
	fProcessName protowire.Number = 6 // process_name

	// ThreadDescriptor.
	fThreadPID  protowire.Number = 1
	fThreadTID  protowire.Number = 2
	fThreadName protowire.Number = 5 // thread_name

	// TrackEvent.
	fEventCategoryIIDs  protowire.Number = 3
	fEventAnnotations   protowire.Number = 4 // debug_annotations
	fEventType          protowire.Number = 9
	fEventNameIID       protowire.Number = 10
	fEventTrackUUID     protowire.Number = 11
	fEventFlowIDs       protowire.Number = 47 // repeated fixed64 flow_ids
	fEventTermFlowIDs   protowire.Number = 48 // repeated fixed64 terminating_flow_ids
	fEventCallstackIID  protowire.Number = 56
	typeSliceBegin                       = 1 // TYPE_SLICE_BEGIN
	typeSliceEnd                         = 2 // TYPE_SLICE_END
	typeInstant                          = 3 // TYPE_INSTANT
	fInternIID          protowire.Number = 1 // EventName, EventCategory, DebugAnnotationName, InternedString .iid
	fInternName         protowire.Number = 2 // .name, InternedString.str
	fAnnotationNameIID  protowire.Number = 1
	fAnnotationBool     protowire.Number = 2
	fAnnotationUint     protowire.Number = 3
	fAnnotationInt      protowire.Number = 4
	fAnnotationString   protowire.Number = 6
	fAnnotationName     protowire.Number = 10
	fAnnotationDict     protowire.Number = 11 // dict_entries
	fAnnotationArray    protowire.Number = 12 // array_values
	fAnnotationStrIID   protowire.Number = 17 // string_value_iid
	fInternedCategories protowire.Number = 1  // InternedData.event_categories
	fInternedNames      protowire.Number = 2  // event_names
	fInternedAnnNames   protowire.Number = 3  // debug_annotation_names
	fInternedAnnStrings protowire.Number = 29 // debug_annotation_string_values
	fInternedFunctions  protowire.Number = 5  // function_names
	fInternedFrames     protowire.Number = 6
	fInternedCallstacks protowire.Number = 7
	fInternedPaths      protowire.Number = 17 // mapping_paths
	fInternedMappings   protowire.Number = 19

	// profile_common.proto.
	fMappingIID      protowire.Number = 1
	fMappingPathIDs  protowire.Number = 7 // path_string_ids
	fFrameIID        protowire.Number = 1
	fFrameFunction   protowire.Number = 2 // function_name_id
	fFrameMapping    protowire.Number = 3 // mapping_id
	fFrameRelPC      protowire.Number = 4
	fFrameKind       protowire.Number = 7
	fFrameKindStr    protowire.Number = 8
	kindNative                        = 1 // Frame.KIND_NATIVE
	kindKernel                        = 2 // Frame.KIND_KERNEL
	fCallstackIID    protowire.Number = 1
	fCallstackFrames protowire.Number = 2 // frame_ids
)

// sequenceID is the one packet sequence WritePerfetto writes.
const sequenceID = 1

// pb appends protobuf fields.
type pb []byte

func (b pb) varint(n protowire.Number, v uint64) pb {
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func (b pb) fixed64(n protowire.Number, v uint64) pb {
	b = protowire.AppendTag(b, n, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, v)
}

func (b pb) bytes(n protowire.Number, v []byte) pb {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func (b pb) str(n protowire.Number, v string) pb {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, v)
}

// field is one decoded protobuf field: u holds varints and fixed values,
// b the bytes of a length-delimited one.
type field struct {
	num protowire.Number
	typ protowire.Type
	u   uint64
	b   []byte
}

// fields calls fn on each field of the message b, skipping groups.
func fields(b []byte, fn func(f field) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		f := field{num: num, typ: typ}
		switch typ {
		case protowire.VarintType:
			f.u, n = protowire.ConsumeVarint(b)
		case protowire.Fixed64Type:
			f.u, n = protowire.ConsumeFixed64(b)
		case protowire.Fixed32Type:
			var v uint32
			v, n = protowire.ConsumeFixed32(b)
			f.u = uint64(v)
		case protowire.BytesType:
			f.b, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(f); err != nil {
			return err
		}
	}
	return nil
}

// uints are the values of a repeated integer field, packed or not.
func (f field) uints() ([]uint64, error) {
	switch f.typ {
	case protowire.VarintType, protowire.Fixed64Type:
		return []uint64{f.u}, nil
	case protowire.BytesType:
		var out []uint64
		for b := f.b; len(b) > 0; {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return nil, protowire.ParseError(n)
			}
			out, b = append(out, v), b[n:]
		}
		return out, nil
	}
	return nil, errWireType(f)
}

type wireTypeError struct{ f field }

func (e wireTypeError) Error() string {
	return "field " + itoa(int64(e.f.num)) + " has wire type " + itoa(int64(e.f.typ))
}

func errWireType(f field) error { return wireTypeError{f} }

// want checks a field's wire type.
func (f field) want(t protowire.Type) error {
	if f.typ != t {
		return errWireType(f)
	}
	return nil
}
