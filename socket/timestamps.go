package socket

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/sockq"
)

// SO_TIMESTAMPING flags a socket takes (Linux's SOF_TIMESTAMPING_*
// values). Generation is always on in bypassd, so the RX flags are
// accepted for compatibility; the reporting flags choose the slots.
const (
	// TimestampRXSoftware and TimestampRXHardware ask for generation.
	TimestampRXSoftware = unix.SOF_TIMESTAMPING_RX_SOFTWARE
	TimestampRXHardware = unix.SOF_TIMESTAMPING_RX_HARDWARE
	// TimestampSoftware reports the software receive time (the ring
	// engine's clock when it took the frame off the NIC queue).
	TimestampSoftware = unix.SOF_TIMESTAMPING_SOFTWARE
	// TimestampRawHardware reports the NIC's receive time on its own
	// clock (the PHC's time scale, TAI when ptp4l disciplines it).
	TimestampRawHardware = unix.SOF_TIMESTAMPING_RAW_HARDWARE
	// TimestampSysHardware reports the NIC's receive time converted to
	// system time (BYPASSD_HW_TS_CONVERSION 3 or 4).
	TimestampSysHardware = unix.SOF_TIMESTAMPING_SYS_HARDWARE
	// TimestampAll is every receive timestamp.
	TimestampAll = TimestampRXSoftware | TimestampRXHardware | TimestampSoftware | TimestampRawHardware | TimestampSysHardware
)

// Timestamps are a received datagram's timestamps, the three slots of
// Linux's SCM_TIMESTAMPING (software, converted hardware, raw hardware).
// A slot's OK flag is false when the socket did not ask for it
// (SetTimestamping) or the datagram has none: on a NIC without hardware
// timestamps (veth, or mode 0) the hardware slots are never OK. An absent
// slot is the zero Time; a present one can be any time, so check the flag.
type Timestamps struct {
	Software      time.Time
	SoftwareOK    bool
	HardwareRaw   time.Time
	HardwareRawOK bool
	HardwareSys   time.Time
	HardwareSysOK bool
}

// SetTimestamping sets SO_TIMESTAMPING: which receive timestamps
// ReadMsgUDPTimestamps and ReadBatch report (Timestamp* flags). Transmit
// timestamps are refused with an error matching unix.EOPNOTSUPP.
func (u *UDPConn) SetTimestamping(flags int) error {
	return u.SetOption("SO_TIMESTAMPING", flags)
}

// ReadMsgUDPTimestamps reads one datagram like ReadFromUDPAddrPort and
// returns its timestamps, as recvmsg(2) returns SCM_TIMESTAMPING.
func (u *UDPConn) ReadMsgUDPTimestamps(b []byte) (n int, addr netip.AddrPort, ts Timestamps, err error) {
	var m [1]sockq.Message
	m[0].Buf = b
	if _, err := u.recv(m[:], nil); err != nil {
		return 0, netip.AddrPort{}, Timestamps{}, err
	}
	u.timestamps(&ts, &m[0].Header)
	return m[0].N, m[0].Addr, ts, nil
}

// timestamps sets ts to the slots the socket asked for out of a record
// header (in place: the batch path fills each Message without a copy).
func (u *UDPConn) timestamps(ts *Timestamps, h *dgram.Header) {
	*ts = Timestamps{}
	f := u.tsFlags.Load()
	if f == 0 {
		return
	}
	if f&TimestampSoftware != 0 && h.Flags&dgram.FlagSWTimestamp != 0 {
		ts.Software, ts.SoftwareOK = time.Unix(0, h.TSSW), true
	}
	if f&TimestampRawHardware != 0 && h.Flags&dgram.FlagHWRaw != 0 {
		ts.HardwareRaw, ts.HardwareRawOK = time.Unix(0, h.TSHWRaw), true
	}
	if f&TimestampSysHardware != 0 && h.Flags&dgram.FlagHWSys != 0 {
		ts.HardwareSys, ts.HardwareSysOK = time.Unix(0, h.TSHWSys), true
	}
}
