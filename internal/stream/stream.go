// Package stream defines the records that carry a TCP socket's byte
// stream and its events through the socket's two shared-memory queues
// (internal/shmq): data records in both directions, and event records
// (connected, end of stream, error, a connection to accept). The byte
// layout is in docs/shm-queue.md ("Stream records"); this package is its
// Go form, shared by the daemon's pumps (ring/tcpstack) and the client
// (package socket). It owns neither the queues nor the connections.
package stream

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Record types of a stream socket's queues (the shmq record type field).
// internal/dgram's datagram records are type 1.
const (
	// TypeData is a record whose payload is the next bytes of the
	// stream (at least one).
	TypeData uint32 = 2
	// TypeEvent is a record whose payload is one Event (EventLen bytes).
	TypeEvent uint32 = 3
)

// EventLen is the size of an event record's payload.
const EventLen = 24

// Event kinds.
const (
	// Connected (daemon → client): the handshake of a CONNECT ended
	// well; Addr is the socket's local address.
	Connected uint16 = 1
	// EOF: the end of one direction of the stream. Daemon → client: the
	// peer sent FIN (reads return io.EOF once the data before it is
	// read). Client → daemon: shutdown(SHUT_WR), the daemon sends FIN
	// after the data before it.
	EOF uint16 = 2
	// Error (daemon → client): the connection failed or was reset;
	// Errno says how (ECONNREFUSED, ECONNRESET, ETIMEDOUT, ...). Nothing
	// follows it.
	Error uint16 = 3
	// Acceptable (daemon → client, on a listening socket): one
	// connection completed its handshake and waits for ACCEPT; Addr is
	// the peer.
	Acceptable uint16 = 4
)

// Event is the payload of a TypeEvent record:
//
//	offset size field
//	0      2    kind (Connected, EOF, Error, Acceptable)
//	2      2    port (of Addr; 0 when Addr is unused)
//	4      4    errno (Error; otherwise 0)
//	8      16   addr (IPv6, or IPv4 as ::ffff:a.b.c.d; zero when unused)
//
// All integers little-endian.
type Event struct {
	Kind  uint16
	Errno uint32
	Addr  netip.AddrPort
}

// Put encodes e into b (at least EventLen bytes).
func Put(b []byte, e Event) {
	le := binary.LittleEndian
	le.PutUint16(b[0:], e.Kind)
	le.PutUint16(b[2:], e.Addr.Port())
	le.PutUint32(b[4:], e.Errno)
	var a [16]byte
	if e.Addr.Addr().IsValid() {
		a = e.Addr.Addr().As16()
	}
	copy(b[8:24], a[:])
}

// Parse decodes an event record's payload.
func Parse(b []byte) (Event, error) {
	if len(b) != EventLen {
		return Event{}, fmt.Errorf("stream: event record of %d bytes, want %d", len(b), EventLen)
	}
	le := binary.LittleEndian
	e := Event{Kind: le.Uint16(b[0:]), Errno: le.Uint32(b[4:])}
	if e.Kind < Connected || e.Kind > Acceptable {
		return Event{}, fmt.Errorf("stream: unknown event kind %d", e.Kind)
	}
	a := netip.AddrFrom16([16]byte(b[8:24])).Unmap()
	if port := le.Uint16(b[2:]); port != 0 || a != netip.IPv6Unspecified() {
		e.Addr = netip.AddrPortFrom(a, port)
	}
	return e, nil
}
