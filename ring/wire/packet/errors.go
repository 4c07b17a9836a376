package packet

import (
	"errors"
	"fmt"
	"io"

	"golang.org/x/sys/unix"
)

// ErrTooBig is matched (errors.Is) by every error reporting a datagram that
// cannot be sent: larger than the UDP limit of its family (65507 bytes of
// payload over IPv4, 65527 over IPv6), or larger than the MTU allows when
// fragmentation is forbidden. It wraps unix.EMSGSIZE, so errors.Is(err,
// unix.EMSGSIZE) holds as well and the socket layer can return EMSGSIZE as
// the kernel would. Use errors.As with *TooBigError to read the limit.
var ErrTooBig = fmt.Errorf("packet: datagram too big (UDP payload limit %d bytes over IPv4, %d over IPv6): %w",
	MaxUDPPayload4, MaxUDPPayload6, unix.EMSGSIZE)

// TooBigError is the concrete error for an oversized datagram.
type TooBigError struct {
	Size  int    // UDP payload bytes requested
	Limit int    // largest UDP payload accepted by this template
	Why   string // which limit applies
}

func (e *TooBigError) Error() string {
	return fmt.Sprintf("packet: UDP payload of %d bytes exceeds the %d-byte limit (%s); send smaller datagrams: %v",
		e.Size, e.Limit, e.Why, unix.EMSGSIZE)
}

// Is makes errors.Is(err, ErrTooBig) hold.
func (e *TooBigError) Is(target error) bool { return target == ErrTooBig }

// Unwrap makes errors.Is(err, unix.EMSGSIZE) hold.
func (e *TooBigError) Unwrap() error { return unix.EMSGSIZE }

// ErrMalformed is matched (errors.Is) by every error Parse and
// ParseUDPSegment return for bad input. The frame should be
// dropped and counted; there is nothing to retry.
var ErrMalformed = errors.New("packet: malformed frame")

// malformedError is a static, allocation-free error that matches
// ErrMalformed. Parse runs on every received frame, including hostile ones, so
// its errors must not allocate.
type malformedError struct{ msg string }

func (e *malformedError) Error() string        { return e.msg }
func (e *malformedError) Is(target error) bool { return target == ErrMalformed }

func malformed(msg string) error { return &malformedError{msg: msg} }

var (
	errShortEthernet  = malformed("packet: frame shorter than its Ethernet header")
	errShortVLAN      = malformed("packet: frame truncated inside a VLAN tag")
	errTooManyVLANs   = malformed("packet: more than two VLAN tags")
	errShortIPv4      = malformed("packet: IPv4 header truncated")
	errIPv4Version    = malformed("packet: IPv4 EtherType but IP version is not 4")
	errIPv4IHL        = malformed("packet: IPv4 header length field below 20 bytes or beyond the frame")
	errIPv4TotalLen   = malformed("packet: IPv4 total length inconsistent with header length or frame length")
	errIPv4Checksum   = malformed("packet: IPv4 header checksum mismatch")
	errShortIPv6      = malformed("packet: IPv6 header truncated")
	errIPv6Version    = malformed("packet: IPv6 EtherType but IP version is not 6")
	errIPv6PayloadLen = malformed("packet: IPv6 payload length beyond the frame")
	errIPv6ExtHdr     = malformed("packet: IPv6 extension header truncated")
	errIPv6TwoFrag    = malformed("packet: IPv6 packet with a second fragment header")
	errFragAlign      = malformed("packet: non-final IP fragment whose length is not a multiple of 8 bytes")
	errFragEmpty      = malformed("packet: IP fragment without data")
	errShortUDP       = malformed("packet: UDP header truncated")
	errUDPLen         = malformed("packet: UDP length field below 8 bytes or beyond the IP payload")
)

// Caller mistakes in BuildFrame/Frames; static so the hot path never allocates.
var (
	errBadPayloadLen = errors.New("packet: negative payload length")
	errFrameIndex    = errors.New("packet: frame index out of range for this datagram; iterate i from 0 to Frames(len(payload))-1")
	errShortBuffer   = fmt.Errorf("packet: buffer shorter than the frame; size buffers with Template.MaxFrameLen: %w", io.ErrShortBuffer)
)
