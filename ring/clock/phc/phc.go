// Package phc reads PTP hardware clocks (PHCs, /dev/ptpN) together with the
// system clock, and finds which PHC belongs to a network interface.
//
// It owns the clock side of hardware timestamping: opening /dev/ptpN,
// reading it through its dynamic POSIX clock id, taking bracketed
// (system, hardware, system) samples with PTP_SYS_OFFSET_EXTENDED (or the
// older PTP_SYS_OFFSET, or plain clock_gettime pairs when neither ioctl
// works), and asking ethtool's timestamping info (ETHTOOL_GET_TS_INFO) for an
// interface's PHC index and hardware timestamping abilities. A Clock
// implements tsconv.BatchClock, so package ring/clock/tsconv can keep the PHC
// mapped onto CLOCK_REALTIME.
//
// It does not own the conversion itself (ring/clock/tsconv), reading timestamps
// off frames (the providers) or enabling timestamping on a NIC
// (SIOCSHWTSTAMP; the XDP metadata path needs none).
package phc

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// MaxSamples is the most bracketed samples one PTP_SYS_OFFSET_EXTENDED (or
// PTP_SYS_OFFSET) ioctl takes (PTP_MAX_SAMPLES in linux/ptp_clock.h).
const MaxSamples = 25

// Method is how a Clock takes its samples, best first.
type Method int

const (
	// MethodExtended is PTP_SYS_OFFSET_EXTENDED(2): the driver reads the
	// system clock immediately before and after the device register, the
	// tightest bracket short of PTP_SYS_OFFSET_PRECISE.
	MethodExtended Method = iota
	// MethodOffset is PTP_SYS_OFFSET(2): system and PHC readings
	// interleaved by the PTP core, brackets include the driver's locking.
	MethodOffset
	// MethodGettime is clock_gettime(CLOCK_REALTIME), clock_gettime(the
	// clock), clock_gettime(CLOCK_REALTIME): no ioctl at all, widest
	// brackets (two extra system calls inside each).
	MethodGettime
)

func (m Method) String() string {
	switch m {
	case MethodExtended:
		return "PTP_SYS_OFFSET_EXTENDED"
	case MethodOffset:
		return "PTP_SYS_OFFSET"
	case MethodGettime:
		return "clock_gettime"
	}
	return fmt.Sprintf("Method(%d)", int(m))
}

// The ioctl numbers, first the *2 variants (Linux 5.8+, which check that the
// reserved fields are zero), then the originals for older kernels.
var (
	extendedIoctls = []uintptr{unix.PTP_SYS_OFFSET_EXTENDED2, unix.PTP_SYS_OFFSET_EXTENDED}
	offsetIoctls   = []uintptr{unix.PTP_SYS_OFFSET2, unix.PTP_SYS_OFFSET}
)

// Clock is an open hardware clock that can be sampled against
// CLOCK_REALTIME. It implements tsconv.BatchClock. Like tsconv.Clock
// requires, one goroutine at a time may use it.
type Clock struct {
	name   string
	f      *os.File // nil for a kernel clock id (no device)
	id     int32
	method Method
	req    uintptr // the ioctl that works for method

	ext unix.PtpSysOffsetExtended
	off unix.PtpSysOffset
}

var _ tsconv.BatchClock = (*Clock)(nil)

// ClockID returns the dynamic POSIX clock id of an open /dev/ptpN file
// descriptor: (^fd << 3) | 3, CLOCKFD in the kernel's posix-timers.
func ClockID(fd int) int32 { return int32((^fd << 3) | 3) }

// Path returns the device path of PHC index.
func Path(index int) string { return fmt.Sprintf("/dev/ptp%d", index) }

// Open opens PHC index (/dev/ptpN) and picks the best sampling method the
// driver answers.
func Open(index int) (*Clock, error) {
	if index < 0 {
		return nil, fmt.Errorf("phc: index %d: %w", index, ErrNoPHC)
	}
	return OpenPath(Path(index))
}

// OpenPath opens a PTP clock device by path (e.g. /dev/ptp0) and picks the
// best sampling method it answers.
func OpenPath(path string) (*Clock, error) {
	// Reading the clock needs only read access; O_RDWR would be needed to
	// adjust it, which bypassd never does (ptp4l's job).
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("phc: open %s: %w (the device is gone, or this machine's NIC has no PTP clock: use hardware timestamp conversion mode 0 or 1)", path, err)
		}
		return nil, fmt.Errorf("phc: open %s: %w (needs read access to the device, root or a udev rule)", path, err)
	}
	c := &Clock{name: path, f: f, id: ClockID(int(f.Fd()))}
	var ts unix.Timespec
	if err := unix.ClockGettime(c.id, &ts); err != nil {
		f.Close()
		return nil, fmt.Errorf("phc: read %s: %w (not a PTP clock device?)", path, err)
	}
	c.probe()
	return c, nil
}

// probe tries the ioctls best first and keeps the first that answers.
func (c *Clock) probe() {
	for _, req := range extendedIoctls {
		c.ext = unix.PtpSysOffsetExtended{Samples: 1}
		if c.ioctl(req, unsafe.Pointer(&c.ext)) == nil {
			c.method, c.req = MethodExtended, req
			return
		}
	}
	for _, req := range offsetIoctls {
		c.off = unix.PtpSysOffset{Samples: 1}
		if c.ioctl(req, unsafe.Pointer(&c.off)) == nil {
			c.method, c.req = MethodOffset, req
			return
		}
	}
	c.method = MethodGettime
}

func (c *Clock) ioctl(req uintptr, p unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, c.f.Fd(), req, uintptr(p))
	if e != 0 {
		return e
	}
	return nil
}

// newKernelClock samples a kernel clock id (CLOCK_MONOTONIC_RAW, CLOCK_TAI,
// ...) with the clock_gettime method: the same code path a PHC without the
// sampling ioctls takes. Tests use it as a hardware clock that exists on
// every machine.
func newKernelClock(id int32) *Clock {
	return &Clock{name: fmt.Sprintf("clock %d", id), id: id, method: MethodGettime}
}

// Name is the device path.
func (c *Clock) Name() string { return c.name }

// ID is the clock's POSIX clock id (dynamic for a PHC).
func (c *Clock) ID() int32 { return c.id }

// Method reports how the clock is sampled.
func (c *Clock) Method() Method { return c.method }

// Now reads the clock: nanoseconds on its own time scale (TAI when ptp4l
// disciplines it).
func (c *Clock) Now() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(c.id, &ts); err != nil {
		return 0, fmt.Errorf("phc: read %s: %w", c.name, err)
	}
	return ts.Nano(), nil
}

// Sample implements tsconv.Clock: one bracketed reading.
func (c *Clock) Sample() (tsconv.Sample, error) {
	var s [1]tsconv.Sample
	if _, err := c.Samples(s[:]); err != nil {
		return tsconv.Sample{}, err
	}
	return s[0], nil
}

// Samples implements tsconv.BatchClock: up to len(dst) bracketed readings,
// at most MaxSamples per ioctl, in one ioctl with the extended or offset
// method. It returns how many entries of dst are valid.
func (c *Clock) Samples(dst []tsconv.Sample) (int, error) {
	n := min(len(dst), MaxSamples)
	if n == 0 {
		return 0, nil
	}
	switch c.method {
	case MethodExtended:
		c.ext = unix.PtpSysOffsetExtended{Samples: uint32(n), Clockid: unix.CLOCK_REALTIME}
		if err := c.ioctl(c.req, unsafe.Pointer(&c.ext)); err != nil {
			return 0, fmt.Errorf("phc: %s on %s: %w", c.method, c.name, err)
		}
		return fromExtended(&c.ext, dst), nil
	case MethodOffset:
		c.off = unix.PtpSysOffset{Samples: uint32(n)}
		if err := c.ioctl(c.req, unsafe.Pointer(&c.off)); err != nil {
			return 0, fmt.Errorf("phc: %s on %s: %w", c.method, c.name, err)
		}
		return fromOffset(&c.off, dst), nil
	}
	var before, hw, after unix.Timespec
	for i := range n {
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &before); err != nil {
			return i, fmt.Errorf("phc: read CLOCK_REALTIME: %w", err)
		}
		if err := unix.ClockGettime(c.id, &hw); err != nil {
			return i, fmt.Errorf("phc: read %s: %w", c.name, err)
		}
		if err := unix.ClockGettime(unix.CLOCK_REALTIME, &after); err != nil {
			return i, fmt.Errorf("phc: read CLOCK_REALTIME: %w", err)
		}
		dst[i] = tsconv.Sample{SysBefore: before.Nano(), HW: uint64(hw.Nano()), SysAfter: after.Nano()}
	}
	return n, nil
}

func clockNs(t unix.PtpClockTime) int64 { return t.Sec*1e9 + int64(t.Nsec) }

// fromExtended decodes PTP_SYS_OFFSET_EXTENDED's triplets: ts[i] is
// {system before, PHC, system after}.
func fromExtended(x *unix.PtpSysOffsetExtended, dst []tsconv.Sample) int {
	n := min(int(x.Samples), len(dst), len(x.Ts))
	for i := range n {
		t := &x.Ts[i]
		dst[i] = tsconv.Sample{SysBefore: clockNs(t[0]), HW: uint64(clockNs(t[1])), SysAfter: clockNs(t[2])}
	}
	return n
}

// fromOffset decodes PTP_SYS_OFFSET's interleaved readings: ts[2i] system,
// ts[2i+1] PHC, ts[2i+2] system, so consecutive samples share a system
// reading.
func fromOffset(x *unix.PtpSysOffset, dst []tsconv.Sample) int {
	n := min(int(x.Samples), len(dst), (len(x.Ts)-1)/2)
	for i := range n {
		dst[i] = tsconv.Sample{SysBefore: clockNs(x.Ts[2*i]), HW: uint64(clockNs(x.Ts[2*i+1])), SysAfter: clockNs(x.Ts[2*i+2])}
	}
	return n
}

// Close closes the device.
func (c *Clock) Close() error {
	if c.f == nil {
		return nil
	}
	err := c.f.Close()
	c.f = nil
	if err != nil {
		return fmt.Errorf("phc: close %s: %w", c.name, err)
	}
	return nil
}
