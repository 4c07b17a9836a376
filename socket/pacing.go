package socket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

// Pacing is a socket's packet pacing setting: SO_MAX_PACING_RATE's
// extended form. bypassd paces wire bytes (Ethernet, IP and UDP headers
// included) and enforces it per socket, like a NIC's per-queue rate limit.
type Pacing struct {
	// Kbps is the rate in kbit/s; 0 removes the limit.
	Kbps uint32
	// MaxBurst is how many bytes may leave back to back before the rate
	// applies (0: bypassd's default, 200 µs at the rate and at least two
	// typical packets).
	MaxBurst uint32
	// TypicalBytes is the typical packet size, used to size the default
	// burst (0: 1514).
	TypicalBytes uint16
}

// PacingInfo is what bypassd reports about a socket's pacing.
type PacingInfo struct {
	// Pacing is the rate the socket is paced at (Kbps 0: unpaced), with
	// the burst in effect. With the daemon's nearest-rate policy it may
	// differ from the rate asked for.
	Pacing
	// MinKbps and MaxKbps are the range the socket's interface accepts.
	MinKbps, MaxKbps uint32
}

// pacingReplyLen is the GETSOCKOPT SO_MAX_PACING_RATE answer: the C struct
// {u32 rate, u32 max_burst_sz, u16 typical_pkt_sz} with its padding to 12
// bytes, then the interface's u32 minimum and maximum in kbit/s.
const pacingReplyLen = 20

func decodePacing(v []byte) (PacingInfo, error) {
	if len(v) != pacingReplyLen {
		return PacingInfo{}, fmt.Errorf("SO_MAX_PACING_RATE: bypassd answered %d bytes, want %d: %w", len(v), pacingReplyLen, unix.EPROTO)
	}
	le := binary.LittleEndian
	return PacingInfo{
		Pacing:  Pacing{Kbps: le.Uint32(v), MaxBurst: le.Uint32(v[4:]), TypicalBytes: le.Uint16(v[8:])},
		MinKbps: le.Uint32(v[12:]), MaxKbps: le.Uint32(v[16:]),
	}, nil
}

// bytesPerSecond is the u32 reading of SO_MAX_PACING_RATE (kbit/s × 125,
// saturated).
func (p Pacing) bytesPerSecond() int {
	return int(min(uint64(p.Kbps)*125, math.MaxUint32))
}

// SetPacing paces the socket with the extended form of
// SO_MAX_PACING_RATE. It may be called before or after bind and connect,
// and again to change the rate on the fly. Errors match unix.ERANGE (rate
// outside the interface's range, named in the message), unix.ENOSPC (the
// interface's rate table is full) and unix.EINVAL.
func (u *UDPConn) SetPacing(p Pacing) error {
	v := make([]byte, 10)
	binary.LittleEndian.PutUint32(v, p.Kbps)
	binary.LittleEndian.PutUint32(v[4:], p.MaxBurst)
	binary.LittleEndian.PutUint16(v[8:], p.TypicalBytes)
	_, err := u.request(ctlproto.CodeSetSockOpt, ctlproto.SetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_MAX_PACING_RATE, Value: v})
	if err != nil {
		u.pacingHint(err)
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("setsockopt SO_MAX_PACING_RATE %d kbit/s burst %d typical %d: %w", p.Kbps, p.MaxBurst, p.TypicalBytes, err))
	}
	return nil
}

// PacingInfo returns the socket's pacing and its interface's range.
func (u *UDPConn) PacingInfo() (PacingInfo, error) {
	m, err := u.request(ctlproto.CodeGetSockOpt, ctlproto.GetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_MAX_PACING_RATE})
	if err != nil {
		return PacingInfo{}, u.opErr("get", netip.AddrPort{}, fmt.Errorf("getsockopt SO_MAX_PACING_RATE: %w", err))
	}
	v, ok := m.(*ctlproto.SockOptValue)
	if !ok {
		return PacingInfo{}, u.opErr("get", netip.AddrPort{}, fmt.Errorf("getsockopt SO_MAX_PACING_RATE: bypassd answered with %T: %w", m, unix.EPROTO))
	}
	info, err := decodePacing(v.Value)
	if err != nil {
		return PacingInfo{}, u.opErr("get", netip.AddrPort{}, err)
	}
	return info, nil
}

// pacingHint adds advice to a refused SO_MAX_PACING_RATE. The daemon sends
// only the errno, so for ERANGE the range is asked for separately.
func (u *UDPConn) pacingHint(err error) {
	var de *DaemonError
	if !errors.As(err, &de) {
		return
	}
	switch de.Errno {
	case unix.EOPNOTSUPP:
		de.Hint = "this bypassd cannot pace; send unpaced, or upgrade bypassd"
	case unix.ERANGE:
		de.Hint = "the rate is outside what this interface can pace"
		if info, ierr := u.PacingInfo(); ierr == nil {
			de.Hint = fmt.Sprintf("this interface paces from %d to %d kbit/s (SO_MAX_PACING_RATE %d to %d bytes/s)",
				info.MinKbps, info.MaxKbps, uint64(info.MinKbps)*125, min(uint64(info.MaxKbps)*125, math.MaxUint32))
		}
	case unix.ENOSPC:
		de.Hint = "the interface's rate table has no free entry for another rate, or paces as many sockets as it may; " +
			"use a rate another socket already uses, close paced sockets, or raise bypassd's --pacing-table-size / --pacing-max-queues " +
			"(`bypassctl rates` shows the table)"
	case unix.EINVAL:
		de.Hint = "SO_MAX_PACING_RATE takes a u32 in bytes/s or the 10-byte struct {rate kbit/s u32, max_burst_sz u32, typical_pkt_sz u16}"
	}
}
