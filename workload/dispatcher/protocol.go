package dispatcher

import (
	"encoding/binary"
	"hash/crc32"
)

// Frame types of the model's binary protocol. A frame is a 4-byte
// big-endian length (of what follows), a type byte and a body.
const (
	cmdSend        = 1 // producer → broker: producerID u32, seq u64, topic u32, body
	cmdSendReceipt = 2 // broker → producer: producerID u32, seq u64, entryID u64
	cmdFlow        = 3 // consumer → broker: consumerID u32, permits u32
	cmdMessage     = 4 // broker → consumer: consumerID u32, entryID u64, redeliveries u32, body
	cmdAck         = 5 // consumer → broker: consumerID u32, count u32, entryIDs u64...
	cmdSubscribe   = 6 // consumer → broker: consumerID u32, subscription u32
	cmdClose       = 7 // consumer → broker: consumerID u32
)

// sendHeader is the length of a Send frame's fields before the body.
const sendHeader = 4 + 8 + 4

// A message body as published and delivered: producerID u32, seq u64,
// key index u32, publish time ns i64, payload, crc32 of everything before.
const bodyHeader = 4 + 8 + 4 + 8

func appendFrame(dst []byte, typ byte, parts ...[]byte) []byte {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, typ)
	for _, p := range parts {
		dst = append(dst, p...)
	}
	return dst
}

// makeBody builds a message body with its checksum.
func makeBody(producerID uint32, seq uint64, key uint32, publishNs int64, payload []byte) []byte {
	b := make([]byte, 0, bodyHeader+len(payload)+4)
	b = binary.BigEndian.AppendUint32(b, producerID)
	b = binary.BigEndian.AppendUint64(b, seq)
	b = binary.BigEndian.AppendUint32(b, key)
	b = binary.BigEndian.AppendUint64(b, uint64(publishNs))
	b = append(b, payload...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

type body struct {
	producerID uint32
	seq        uint64
	key        uint32
	publishNs  int64
	valid      bool
}

func parseBody(b []byte) body {
	if len(b) < bodyHeader+4 {
		return body{}
	}
	n := len(b) - 4
	return body{
		producerID: binary.BigEndian.Uint32(b[0:]),
		seq:        binary.BigEndian.Uint64(b[4:]),
		key:        binary.BigEndian.Uint32(b[12:]),
		publishNs:  int64(binary.BigEndian.Uint64(b[16:])),
		valid:      crc32.ChecksumIEEE(b[:n]) == binary.BigEndian.Uint32(b[n:]),
	}
}

// frameReader splits a byte stream into frames.
type frameReader struct {
	buf []byte
}

// next returns the next complete frame's type and body, or ok=false.
func (r *frameReader) next() (typ byte, body []byte, ok bool) {
	if len(r.buf) < 5 {
		return 0, nil, false
	}
	n := int(binary.BigEndian.Uint32(r.buf))
	if len(r.buf) < 4+n {
		return 0, nil, false
	}
	typ, body = r.buf[4], r.buf[5:4+n]
	r.buf = r.buf[4+n:]
	return typ, body, true
}

func u32(b []byte, off int) uint32 { return binary.BigEndian.Uint32(b[off:]) }
func u64(b []byte, off int) uint64 { return binary.BigEndian.Uint64(b[off:]) }
