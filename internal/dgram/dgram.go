// Package dgram defines the record that carries one UDP datagram through a
// socket's shared-memory queues (package internal/shmq moves the records; this
// package says what is inside them). The daemon's ring engine writes RX
// records and reads TX records; the client shim does the opposite. A future C
// shim reads the same bytes, so the layout is fixed and documented here.
//
// Layout (little-endian), HeaderLen = 48 bytes, then the payload:
//
//	off  size  field
//	  0    16  addr: peer IPv6 address, or an IPv4 address as ::ffff:a.b.c.d.
//	           RX: the sender. TX: the destination (all zero = the socket's
//	           connected peer).
//	 16     2  port: peer UDP port
//	 18     2  flags: FlagSWTimestamp, FlagHWRaw, FlagHWSys (which timestamp
//	           slots hold values)
//	 20     4  reserved, zero
//	 24     8  ts_sw: software receive time, ns since the Unix epoch (CLOCK_REALTIME)
//	 32     8  ts_hw_raw: hardware timestamp as the device reports it (ns)
//	 40     8  ts_hw_sys: hardware timestamp converted to system time (ns)
//	 48     -  payload (the record's length minus 48)
//
// The three timestamp slots mirror SCM_TIMESTAMPING's ts[0], ts[2] and the
// converted hardware value.
package dgram

import (
	"encoding/binary"
	"errors"
	"net/netip"
)

// HeaderLen is the size of the fixed record header before the payload.
const HeaderLen = 48

// Record type values used with shmq records.
const (
	// TypeDatagram is a datagram record.
	TypeDatagram uint32 = 1
)

// Flags in the header's flags field.
const (
	FlagSWTimestamp uint16 = 1 << 0
	FlagHWRaw       uint16 = 1 << 1
	FlagHWSys       uint16 = 1 << 2
)

// Header is the decoded fixed part of a record.
type Header struct {
	Addr    netip.AddrPort
	Flags   uint16
	TSSW    int64
	TSHWRaw int64
	TSHWSys int64
}

// ErrShort is returned for a record shorter than HeaderLen.
var ErrShort = errors.New("dgram: record shorter than its header")

// Put writes h into the first HeaderLen bytes of rec.
func Put(rec []byte, h *Header) {
	_ = rec[HeaderLen-1]
	a := h.Addr.Addr().As16()
	copy(rec[0:16], a[:])
	binary.LittleEndian.PutUint16(rec[16:], h.Addr.Port())
	binary.LittleEndian.PutUint16(rec[18:], h.Flags)
	binary.LittleEndian.PutUint32(rec[20:], 0)
	binary.LittleEndian.PutUint64(rec[24:], uint64(h.TSSW))
	binary.LittleEndian.PutUint64(rec[32:], uint64(h.TSHWRaw))
	binary.LittleEndian.PutUint64(rec[40:], uint64(h.TSHWSys))
}

// Parse decodes the header of rec and returns it with the payload.
// IPv4-mapped addresses are returned as IPv4; an all-zero address as the
// zero AddrPort (meaning "the connected peer" on TX).
func Parse(rec []byte, h *Header) (payload []byte, err error) {
	if len(rec) < HeaderLen {
		return nil, ErrShort
	}
	var a [16]byte
	copy(a[:], rec[0:16])
	port := binary.LittleEndian.Uint16(rec[16:])
	if a == ([16]byte{}) && port == 0 {
		h.Addr = netip.AddrPort{}
	} else {
		h.Addr = netip.AddrPortFrom(netip.AddrFrom16(a).Unmap(), port)
	}
	h.Flags = binary.LittleEndian.Uint16(rec[18:])
	h.TSSW = int64(binary.LittleEndian.Uint64(rec[24:]))
	h.TSHWRaw = int64(binary.LittleEndian.Uint64(rec[32:]))
	h.TSHWSys = int64(binary.LittleEndian.Uint64(rec[40:]))
	return rec[HeaderLen:], nil
}
