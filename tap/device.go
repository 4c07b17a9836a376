package tap

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NamePrefix starts the name of every TAP device bypassd creates.
const NamePrefix = "bpt"

// DeviceConfig describes a TAP device.
type DeviceConfig struct {
	// Name of the device (at most 15 bytes); DeviceName builds the usual one.
	Name string
	// MAC is given to the device (the NIC's, so frames look the same on
	// both paths).
	MAC net.HardwareAddr
	// MTU of the device (the NIC's).
	MTU int
	// TxQueueLen bounds the frames queued for the reader (default and
	// minimum 8192): what the TAP absorbs while the ring is busy or
	// switching paths.
	TxQueueLen int
}

// DeviceName is the TAP name of the ring on (ifindex, queue), e.g. "bpt5q0".
func DeviceName(ifindex, queue int) string {
	return fmt.Sprintf("%s%dq%d", NamePrefix, ifindex, queue)
}

// Device is an open TAP device: its file descriptor (IFF_TAP|IFF_NO_PI, no
// packet information header, non-blocking) and its link. It is not
// persistent: the kernel removes the device when the descriptor closes, so a
// daemon that dies leaves no TAP behind.
type Device struct {
	name    string
	ifindex int
	// fd is -1 once closed; atomic because stats readers ask for it
	// while the owner may be closing the device.
	fd atomic.Int32
}

// Create makes a TAP device in the calling thread's network namespace,
// turns IPv6 off on it (no router solicitations or MLD reports come out of
// the descriptor), gives it cfg's MAC, MTU and queue length and sets it up.
func Create(cfg DeviceConfig) (_ *Device, err error) {
	if cfg.Name == "" || len(cfg.Name) >= unix.IFNAMSIZ || strings.ContainsAny(cfg.Name, "/ \t\n") {
		return nil, fmt.Errorf("tap: invalid device name %q (1-15 bytes, no slash or space)", cfg.Name)
	}
	cfg.TxQueueLen = max(cfg.TxQueueLen, 8192)
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("tap %s: open /dev/net/tun: %w (the TAP fallback needs root or CAP_NET_ADMIN with access to /dev/net/tun; or run with --fallback none)", cfg.Name, err)
		}
		return nil, fmt.Errorf("tap %s: open /dev/net/tun: %w (is the tun module loaded? `modprobe tun`)", cfg.Name, err)
	}
	d := &Device{name: cfg.Name}
	d.fd.Store(int32(fd))
	defer func() {
		if err != nil {
			_ = unix.Close(fd)
		}
	}()
	ifr, err := unix.NewIfreq(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", cfg.Name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("tap %s: the device exists and is in use (another bypassd on this interface?): %w", cfg.Name, err)
		}
		if errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("tap %s: TUNSETIFF: %w (creating a TAP device needs CAP_NET_ADMIN: grant it, or run with --fallback none)", cfg.Name, err)
		}
		return nil, fmt.Errorf("tap %s: TUNSETIFF: %w", cfg.Name, err)
	}
	// IPv6 off before the link comes up, or the kernel already sent a
	// router solicitation through it.
	if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+cfg.Name+"/disable_ipv6", []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("tap %s: disable IPv6: %w", cfg.Name, err)
	}
	link, err := netlink.LinkByName(cfg.Name)
	if err != nil {
		return nil, fmt.Errorf("tap %s: look up the new device: %w", cfg.Name, err)
	}
	d.ifindex = link.Attrs().Index
	if len(cfg.MAC) > 0 {
		if err := netlink.LinkSetHardwareAddr(link, cfg.MAC); err != nil {
			return nil, fmt.Errorf("tap %s: set MAC %s: %w", cfg.Name, cfg.MAC, err)
		}
	}
	if cfg.MTU > 0 {
		if err := netlink.LinkSetMTU(link, cfg.MTU); err != nil {
			return nil, fmt.Errorf("tap %s: set MTU %d: %w", cfg.Name, cfg.MTU, err)
		}
	}
	if err := netlink.LinkSetTxQLen(link, cfg.TxQueueLen); err != nil {
		return nil, fmt.Errorf("tap %s: set queue length %d: %w", cfg.Name, cfg.TxQueueLen, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return nil, fmt.Errorf("tap %s: set up: %w", cfg.Name, err)
	}
	return d, nil
}

// Name returns the device name.
func (d *Device) Name() string { return d.name }

// Ifindex returns the device's interface index.
func (d *Device) Ifindex() int { return d.ifindex }

// FD returns the non-blocking TAP descriptor: reading it yields the frames
// the device transmits (what tc redirected to it), writing it injects frames
// the device receives.
func (d *Device) FD() int { return int(d.fd.Load()) }

// Read reads one frame; unix.EAGAIN when none is queued.
func (d *Device) Read(b []byte) (int, error) {
	n, _, e := unix.Syscall(unix.SYS_READ, uintptr(d.fd.Load()), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// Write injects one frame.
func (d *Device) Write(b []byte) error {
	_, _, e := unix.Syscall(unix.SYS_WRITE, uintptr(d.fd.Load()), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return e
	}
	return nil
}

// Close closes the descriptor; the kernel removes the device with it (and
// the device's qdiscs and filters).
func (d *Device) Close() error {
	fd := d.fd.Swap(-1)
	if fd < 0 {
		return nil
	}
	if err := unix.Close(int(fd)); err != nil {
		return fmt.Errorf("tap %s: close: %w", d.name, err)
	}
	return nil
}

// Dup returns a duplicate of the device's descriptor (the caller's to
// close): a new daemon taking over holds the device with it, so the
// device outlives this process's Close.
func (d *Device) Dup() (int, error) {
	fd, err := unix.FcntlInt(uintptr(d.fd.Load()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("tap %s: duplicate descriptor: %w", d.name, err)
	}
	return fd, nil
}

// Adopt makes a Device of a TAP descriptor another process handed over
// (owned by the Device from now on, also on error). The device is looked
// up in the calling thread's network namespace.
func Adopt(fd int) (_ *Device, err error) {
	defer func() {
		if err != nil {
			_ = unix.Close(fd)
		}
	}()
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlIfreq(fd, unix.TUNGETIFF, ifr); err != nil {
		return nil, fmt.Errorf("tap: adopt descriptor %d: TUNGETIFF: %w", fd, err)
	}
	name := ifr.Name()
	link, err := netlink.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("tap %s: adopt: look up the device: %w", name, err)
	}
	d := &Device{name: name, ifindex: link.Attrs().Index}
	d.fd.Store(int32(fd))
	return d, nil
}
