package netlab

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ethtoolValue is struct ethtool_value from linux/ethtool.h.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with the union used as a pointer (ifr_data).
// The pointer must stay an unsafe.Pointer so the GC keeps its target alive.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [unsafe.Sizeof(unix.Ifreq{}) - unix.IFNAMSIZ - unsafe.Sizeof(uintptr(0))]byte
}

// ethtoolValueIoctl runs one SIOCETHTOOL command carrying an ethtool_value
// on ifname, in the namespace of the calling thread.
func ethtoolValueIoctl(ifname string, cmd, data uint32) (uint32, error) {
	if len(ifname) >= unix.IFNAMSIZ || ifname == "" {
		return 0, fmt.Errorf("invalid interface name %q", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for ethtool: %w", err)
	}
	defer unix.Close(fd)
	val := &ethtoolValue{cmd: cmd, data: data}
	var ifr ifreqData
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(val)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(val)
	if errno != 0 {
		return 0, errno
	}
	return val.data, nil
}

// setTxChecksum turns TX checksum offload of ifname on or off, like
// `ethtool -K ifname tx on|off`. Must run inside the interface's namespace.
func setTxChecksum(ifname string, on bool) error {
	var v uint32
	if on {
		v = 1
	}
	if _, err := ethtoolValueIoctl(ifname, unix.ETHTOOL_STXCSUM, v); err != nil {
		return fmt.Errorf("netlab: set tx checksum offload of %s to %v: %w", ifname, on, err)
	}
	got, err := txChecksum(ifname)
	if err != nil {
		return err
	}
	if got != on {
		return fmt.Errorf("netlab: tx checksum offload of %s is still %v after setting it to %v", ifname, got, on)
	}
	return nil
}

// txChecksum reports whether TX checksum offload is on for ifname
// (`ethtool -k ifname | grep tx-checksumming`). Must run inside the
// interface's namespace.
func txChecksum(ifname string) (bool, error) {
	v, err := ethtoolValueIoctl(ifname, unix.ETHTOOL_GTXCSUM, 0)
	if err != nil {
		return false, fmt.Errorf("netlab: get tx checksum offload of %s: %w", ifname, err)
	}
	return v != 0, nil
}

// TxChecksum reports whether TX checksum offload is enabled on the link,
// i.e. whether locally generated frames leave it with partial checksums.
func (l *Link) TxChecksum() (bool, error) {
	var on bool
	err := l.NS.Do(func() error {
		var err error
		on, err = txChecksum(l.Name)
		return err
	})
	return on, err
}

// QueueDrops sums the per-queue receive drop counters `ethtool -S` shows
// for the link (veth: rx_queue_N_drops and rx_queue_N_xdp_drops): frames
// a queue lost, for example to an AF_XDP socket of another queue.
func (l *Link) QueueDrops() (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := l.NS.Command(ctx, "ethtool", "-S", l.Name).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("netlab: ethtool -S %s: %w: %s", l.Name, err, out)
	}
	var sum uint64
	for _, line := range strings.Split(string(out), "\n") {
		name, val, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "rx_queue_") || !strings.HasSuffix(name, "drops") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(val), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("netlab: ethtool -S %s: %q: %w", l.Name, line, err)
		}
		sum += n
	}
	return sum, nil
}
