package phc

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// ErrNoPHC means an interface has no PTP hardware clock (veth, most
// virtual devices, NICs without timestamping).
var ErrNoPHC = errors.New("no PTP hardware clock")

// Info is what ethtool's timestamping info says about an interface.
type Info struct {
	// Interface is the name asked about.
	Interface string
	// Index is the interface's PHC (/dev/ptpN), -1 when it has none.
	Index int
	// SoTimestamping is the SOF_TIMESTAMPING_* mask the device supports.
	SoTimestamping uint32
	// RXFilters is the HWTSTAMP_FILTER_* mask of receive filters.
	RXFilters uint32
}

// HasPHC reports whether the interface has a PTP hardware clock.
func (i Info) HasPHC() bool { return i.Index >= 0 }

// RXHardware reports whether the device stamps received frames in
// hardware (SOF_TIMESTAMPING_RX_HARDWARE and RAW_HARDWARE).
func (i Info) RXHardware() bool {
	const want = unix.SOF_TIMESTAMPING_RX_HARDWARE | unix.SOF_TIMESTAMPING_RAW_HARDWARE
	return i.SoTimestamping&want == want
}

// Capabilities returns the conversion capabilities the device offers:
// hardware receive stamps, and a PHC to sample against the system clock.
// PTP (the PHC disciplined by ptp4l) cannot be seen from here: an operator
// asking for mode 4 asserts it, so PTP follows Clock.
func (i Info) Capabilities() tsconv.Capabilities {
	return tsconv.Capabilities{Timestamps: i.RXHardware(), Clock: i.HasPHC(), PTP: i.HasPHC()}
}

// Reason says in one phrase why the device offers no hardware timestamps,
// or "" when it does.
func (i Info) Reason() string {
	switch {
	case !i.HasPHC() && !i.RXHardware():
		return fmt.Sprintf("no PHC on %s and no hardware receive timestamping", i.Interface)
	case !i.HasPHC():
		return fmt.Sprintf("no PHC on %s", i.Interface)
	case !i.RXHardware():
		return fmt.Sprintf("%s has PHC %s but no hardware receive timestamping", i.Interface, Path(i.Index))
	}
	return ""
}

// Discover asks the kernel (ETHTOOL_GET_TS_INFO over SIOCETHTOOL) for
// ifname's PHC index and timestamping abilities, in the calling thread's
// network namespace. A device without a PHC is not an error: Index is -1.
func Discover(ifname string) (Info, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return Info{}, fmt.Errorf("phc: %s: socket for ethtool: %w", ifname, err)
	}
	defer unix.Close(fd)
	ti, err := unix.IoctlGetEthtoolTsInfo(fd, ifname)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP):
		// Drivers without get_ts_info: the kernel answers with software
		// stamps only on newer kernels, EOPNOTSUPP on older ones.
		return Info{Interface: ifname, Index: -1}, nil
	case errors.Is(err, unix.ENODEV):
		return Info{}, fmt.Errorf("phc: %s: no such interface in this network namespace (check `ip link`): %w", ifname, err)
	case err != nil:
		return Info{}, fmt.Errorf("phc: %s: ethtool timestamping info: %w", ifname, err)
	}
	return Info{Interface: ifname, Index: int(ti.Phc_index), SoTimestamping: ti.So_timestamping, RXFilters: ti.Rx_filters}, nil
}
