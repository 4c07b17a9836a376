package daemon

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"
)

// SO_TIMESTAMPING on a bypassd socket (Linux numbering: SO_TIMESTAMPING,
// 37, and its _NEW twin, 65, which only changes the kernel's cmsg format).
// The value is the kernel's: a C int of SOF_TIMESTAMPING_* flags, or
// struct so_timestamping {int flags; int bind_phc}.
//
// Every received datagram record carries the software stamp and, where the
// ring has them, the hardware stamps; the flags decide which slots the
// shim reports (like SCM_TIMESTAMPING's three): SOFTWARE the software
// stamp, RAW_HARDWARE the NIC's own time, SYS_HARDWARE the NIC's time
// converted to system time. RX_SOFTWARE and RX_HARDWARE (generation) are
// accepted: generation is always on. Transmit timestamps and BIND_PHC are
// not supported (EOPNOTSUPP); OPT_CMSG, OPT_PKTINFO and OPT_RX_FILTER are
// accepted and mean nothing here.
const (
	tsReport = unix.SOF_TIMESTAMPING_SOFTWARE | unix.SOF_TIMESTAMPING_RAW_HARDWARE | unix.SOF_TIMESTAMPING_SYS_HARDWARE
	tsRX     = unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_RX_HARDWARE
	tsIgnore = unix.SOF_TIMESTAMPING_OPT_CMSG | unix.SOF_TIMESTAMPING_OPT_PKTINFO | sofTimestampingOptRXFilter
	tsTX     = unix.SOF_TIMESTAMPING_TX_HARDWARE | unix.SOF_TIMESTAMPING_TX_SOFTWARE | unix.SOF_TIMESTAMPING_TX_SCHED |
		unix.SOF_TIMESTAMPING_TX_ACK | unix.SOF_TIMESTAMPING_OPT_ID | unix.SOF_TIMESTAMPING_OPT_TSONLY |
		unix.SOF_TIMESTAMPING_OPT_STATS | unix.SOF_TIMESTAMPING_OPT_TX_SWHW | unix.SOF_TIMESTAMPING_OPT_ID_TCP
	// sofTimestampingOptRXFilter is SOF_TIMESTAMPING_OPT_RX_FILTER
	// (Linux 6.10), not in x/sys yet.
	sofTimestampingOptRXFilter = 1 << 17
)

// timestampingValue checks an SO_TIMESTAMPING value and returns its flags.
func timestampingValue(v []byte) (uint32, error) {
	if len(v) != 4 && len(v) != 8 {
		return 0, fmt.Errorf("SO_TIMESTAMPING: value of %d bytes, want an int of SOF_TIMESTAMPING_* flags (or struct so_timestamping): %w", len(v), unix.EINVAL)
	}
	f := binary.LittleEndian.Uint32(v)
	switch {
	case f&^uint32(unix.SOF_TIMESTAMPING_MASK) != 0:
		return 0, fmt.Errorf("SO_TIMESTAMPING: unknown flags %#x: %w", f&^uint32(unix.SOF_TIMESTAMPING_MASK), unix.EINVAL)
	case f&tsTX != 0:
		return 0, fmt.Errorf("SO_TIMESTAMPING: flags %#x ask for transmit timestamps, which bypassd does not take; use the receive flags (RX_SOFTWARE, RX_HARDWARE, SOFTWARE, RAW_HARDWARE, SYS_HARDWARE): %w", f&tsTX, unix.EOPNOTSUPP)
	case f&unix.SOF_TIMESTAMPING_BIND_PHC != 0:
		return 0, fmt.Errorf("SO_TIMESTAMPING: BIND_PHC is not supported (hardware stamps come from the interface's own PHC): %w", unix.EOPNOTSUPP)
	}
	return f & (tsReport | tsRX | tsIgnore), nil
}
