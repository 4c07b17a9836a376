package main

import (
	"encoding/binary"
	"fmt"
)

// sockperf's UDP message: a 14-byte big-endian header followed by the
// payload. sockperf frames datagrams by the header's length field, so every
// message bypass-perf sends is exactly one datagram with length equal to the
// datagram's size (see docs in lab-facts: a runt or a length of 0 can wedge
// a real sockperf server).
const (
	headerSize = 14
	// maxMessage is the largest UDP payload over IPv4, which is also
	// sockperf's limit (it speaks IPv4 only).
	maxMessage = 65507

	flagClient = 0x1 // set by clients, cleared in replies
	flagPong   = 0x2 // the sender wants a reply
	flagWarmup = 0x4 // multicast warm-up: neither counted nor answered
)

// header is a decoded sockperf message header.
type header struct {
	Seq    uint64
	Flags  uint16
	Length uint32 // the whole message, header included
}

// putHeader writes h into b, which must hold at least headerSize bytes.
func putHeader(b []byte, h header) {
	binary.BigEndian.PutUint64(b[0:8], h.Seq)
	binary.BigEndian.PutUint16(b[8:10], h.Flags)
	binary.BigEndian.PutUint32(b[10:14], h.Length)
}

// putSeq rewrites only the sequence number of an encoded message; the hot
// send loops change nothing else.
func putSeq(b []byte, seq uint64) { binary.BigEndian.PutUint64(b[0:8], seq) }

// putFlags rewrites only the flags of an encoded message.
func putFlags(b []byte, flags uint16) { binary.BigEndian.PutUint16(b[8:10], flags) }

// parseHeader decodes the header of one received datagram and checks that it
// frames exactly that datagram: sockperf would otherwise treat the rest as
// another message (length < size) or wait for more bytes that never come
// (length > size), so bypass-perf drops such datagrams instead.
func parseHeader(dgram []byte) (header, error) {
	if len(dgram) < headerSize {
		return header{}, fmt.Errorf("runt datagram of %d bytes (a sockperf header is %d)", len(dgram), headerSize)
	}
	h := header{
		Seq:    binary.BigEndian.Uint64(dgram[0:8]),
		Flags:  binary.BigEndian.Uint16(dgram[8:10]),
		Length: binary.BigEndian.Uint32(dgram[10:14]),
	}
	if h.Length < headerSize || h.Length > maxMessage {
		return h, fmt.Errorf("header length %d outside %d..%d", h.Length, headerSize, maxMessage)
	}
	if int(h.Length) != len(dgram) {
		return h, fmt.Errorf("header length %d does not match the %d-byte datagram", h.Length, len(dgram))
	}
	return h, nil
}

// newMessage returns a size-byte message with the given flags, sequence 0
// and a recognizable payload (sockperf does not look at it).
func newMessage(size int, flags uint16) []byte {
	b := make([]byte, size)
	putHeader(b, header{Flags: flags, Length: uint32(size)})
	for i := headerSize; i < size; i++ {
		b[i] = byte(i)
	}
	return b
}
