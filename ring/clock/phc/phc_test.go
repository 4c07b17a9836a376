package phc

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// ioc splits a Linux ioctl number into direction, size, type and number.
func ioc(req uintptr) (dir, size, typ, nr uintptr) {
	return req >> 30, (req >> 16) & 0x3fff, (req >> 8) & 0xff, req & 0xff
}

// The ioctl numbers encode the struct sizes the kernel copies: a layout
// mismatch would make the kernel read or write past our buffers.
func TestIoctlEncoding(t *testing.T) {
	const iocRead, iocWrite = 2, 1
	cases := []struct {
		name        string
		req         uintptr
		dir, nr     uintptr
		structBytes uintptr
	}{
		{"PTP_SYS_OFFSET_EXTENDED", unix.PTP_SYS_OFFSET_EXTENDED, iocRead | iocWrite, 9, unsafe.Sizeof(unix.PtpSysOffsetExtended{})},
		{"PTP_SYS_OFFSET_EXTENDED2", unix.PTP_SYS_OFFSET_EXTENDED2, iocRead | iocWrite, 18, unsafe.Sizeof(unix.PtpSysOffsetExtended{})},
		{"PTP_SYS_OFFSET", unix.PTP_SYS_OFFSET, iocWrite, 5, unsafe.Sizeof(unix.PtpSysOffset{})},
		{"PTP_SYS_OFFSET2", unix.PTP_SYS_OFFSET2, iocWrite, 14, unsafe.Sizeof(unix.PtpSysOffset{})},
	}
	for _, c := range cases {
		dir, size, typ, nr := ioc(c.req)
		if dir != c.dir || typ != '=' || nr != c.nr || size != c.structBytes {
			t.Errorf("%s = %#x: dir %d type %q nr %d size %d; want dir %d type '=' nr %d size %d",
				c.name, c.req, dir, rune(typ), nr, size, c.dir, c.nr, c.structBytes)
		}
	}
	// linux/ptp_clock.h: header of 4 u32, then 25 triplets (extended) or
	// 2*25+1 readings of struct ptp_clock_time (16 bytes).
	if got := unsafe.Sizeof(unix.PtpClockTime{}); got != 16 {
		t.Errorf("ptp_clock_time is %d bytes, want 16", got)
	}
	if got := unsafe.Sizeof(unix.PtpSysOffsetExtended{}); got != 16+MaxSamples*3*16 {
		t.Errorf("ptp_sys_offset_extended is %d bytes, want %d", got, 16+MaxSamples*3*16)
	}
	if got := unsafe.Sizeof(unix.PtpSysOffset{}); got != 16+(2*MaxSamples+1)*16 {
		t.Errorf("ptp_sys_offset is %d bytes, want %d", got, 16+(2*MaxSamples+1)*16)
	}
	if off := unsafe.Offsetof(unix.PtpSysOffsetExtended{}.Ts); off != 16 {
		t.Errorf("ptp_sys_offset_extended.ts at offset %d, want 16", off)
	}
	if off := unsafe.Offsetof(unix.PtpSysOffsetExtended{}.Clockid); off != 4 {
		t.Errorf("ptp_sys_offset_extended.clockid at offset %d, want 4", off)
	}
}

func TestClockID(t *testing.T) {
	// CLOCKFD = 3, FD_TO_CLOCKID(fd) = (~fd << 3) | CLOCKFD.
	for fd, want := range map[int]int32{0: -5, 3: -29, 7: -61} {
		if got := ClockID(fd); got != want || got != unix.FdToClockID(fd) {
			t.Errorf("ClockID(%d) = %d, want %d", fd, got, want)
		}
	}
}

func ptpTime(ns int64) unix.PtpClockTime {
	return unix.PtpClockTime{Sec: ns / 1e9, Nsec: uint32(ns % 1e9)}
}

// The decoders are fed what the kernel writes, built from real clock
// readings: (system, hardware, system) per sample.
func TestDecode(t *testing.T) {
	hwc := newKernelClock(unix.CLOCK_MONOTONIC_RAW)
	var want [MaxSamples]tsconv.Sample
	if n, err := hwc.Samples(want[:]); err != nil || n != MaxSamples {
		t.Fatalf("Samples = %d, %v", n, err)
	}

	x := unix.PtpSysOffsetExtended{Samples: MaxSamples}
	for i, s := range want {
		x.Ts[i] = [3]unix.PtpClockTime{ptpTime(s.SysBefore), ptpTime(int64(s.HW)), ptpTime(s.SysAfter)}
	}
	var got [MaxSamples + 5]tsconv.Sample
	if n := fromExtended(&x, got[:]); n != MaxSamples {
		t.Fatalf("fromExtended decoded %d samples, want %d", n, MaxSamples)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("extended sample %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// A short destination bounds the decode.
	if n := fromExtended(&x, got[:3]); n != 3 {
		t.Fatalf("fromExtended into 3 slots = %d", n)
	}

	// PTP_SYS_OFFSET interleaves: sys0 phc0 sys1 phc1 ... sysN.
	o := unix.PtpSysOffset{Samples: 3}
	sys := []int64{1_000_000_100, 1_000_000_300, 1_000_000_500, 1_000_000_700}
	phc := []int64{5_000_000_200, 5_000_000_400, 5_000_000_600}
	for i := range phc {
		o.Ts[2*i] = ptpTime(sys[i])
		o.Ts[2*i+1] = ptpTime(phc[i])
	}
	o.Ts[6] = ptpTime(sys[3])
	if n := fromOffset(&o, got[:]); n != 3 {
		t.Fatalf("fromOffset decoded %d samples, want 3", n)
	}
	for i := range phc {
		w := tsconv.Sample{SysBefore: sys[i], HW: uint64(phc[i]), SysAfter: sys[i+1]}
		if got[i] != w {
			t.Errorf("offset sample %d = %+v, want %+v", i, got[i], w)
		}
	}
	// A count beyond what the struct holds is clamped, never an overrun.
	o.Samples = 1000
	if n := fromOffset(&o, make([]tsconv.Sample, 100)); n != MaxSamples {
		t.Errorf("fromOffset with a bogus count decoded %d, want %d", n, MaxSamples)
	}
}

func TestKernelClockSamples(t *testing.T) {
	c := newKernelClock(unix.CLOCK_MONOTONIC_RAW)
	if c.Method() != MethodGettime {
		t.Fatalf("method %v", c.Method())
	}
	s := make([]tsconv.Sample, 40)
	n, err := c.Samples(s)
	if err != nil || n != MaxSamples {
		t.Fatalf("Samples = %d, %v; want %d", n, err, MaxSamples)
	}
	for i := range n {
		if s[i].Width() < 0 {
			t.Errorf("sample %d: inverted bracket %+v", i, s[i])
		}
		if i > 0 && (s[i].HW <= s[i-1].HW || s[i].SysBefore < s[i-1].SysAfter) {
			t.Errorf("sample %d not after sample %d: %+v %+v", i, i-1, s[i-1], s[i])
		}
	}
	if _, err := c.Sample(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Now(); err != nil || v <= 0 {
		t.Fatalf("Now = %d, %v", v, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// The sync-mode converter, fed by the same sampling code a PHC without the
// sampling ioctls uses, maps CLOCK_MONOTONIC_RAW (a free-running "hardware"
// clock with its own epoch and rate) onto CLOCK_REALTIME.
func TestKernelClockThroughConverter(t *testing.T) {
	hw := newKernelClock(unix.CLOCK_MONOTONIC_RAW)
	conv, err := tsconv.New(tsconv.ModeSync, hw, tsconv.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Drive the schedule (first update, 100 ms, 200 ms, then 1 s) with
	// times that are due at once; the samples themselves are real, taken
	// 60 ms apart so the frequency fit has a baseline.
	start := time.Now()
	for _, at := range []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, time.Second, 2 * time.Second} {
		if err := conv.Update(start.Add(at)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond)
	}
	p, ok := conv.Snapshot()
	if !ok || p.Updates != 5 {
		t.Fatalf("params %+v, %v: want 5 updates", p, ok)
	}
	var worst int64
	for range 100 {
		s, err := hw.Sample()
		if err != nil {
			t.Fatal(err)
		}
		got, ok := conv.Convert(s.HW)
		if !ok {
			t.Fatal("no conversion")
		}
		// The true system time of the hardware read is inside the bracket.
		var e int64
		if got < s.SysBefore {
			e = s.SysBefore - got
		} else if got > s.SysAfter {
			e = got - s.SysAfter
		}
		worst = max(worst, e)
	}
	est, _ := conv.EstimatedErrorNs()
	t.Logf("CLOCK_MONOTONIC_RAW → CLOCK_REALTIME: worst error outside the bracket %d ns, estimated error %d ns, rate %.9f ns/tick",
		worst, est, p.NsPerTick)
	// NTP may slew CLOCK_REALTIME against MONOTONIC_RAW, and the samples
	// span only ~0.3 s here: a generous bound, the simulated-clock tests
	// in ring/clock/tsconv pin the accuracy.
	if worst > 50_000 {
		t.Fatalf("conversion off by %d ns", worst)
	}
}

func TestOpenErrors(t *testing.T) {
	if _, err := Open(-1); !errors.Is(err, ErrNoPHC) {
		t.Errorf("Open(-1) = %v, want ErrNoPHC", err)
	}
	missing := filepath.Join(t.TempDir(), "ptp99")
	if _, err := OpenPath(missing); !errors.Is(err, os.ErrNotExist) || !strings.Contains(err.Error(), "mode 0 or 1") {
		t.Errorf("OpenPath(missing) = %v", err)
	}
	// Not a clock: the dynamic clock id of an ordinary file is refused.
	if c, err := OpenPath("/dev/null"); err == nil {
		c.Close()
		t.Error("OpenPath(/dev/null) succeeded")
	} else if !strings.Contains(err.Error(), "not a PTP clock") {
		t.Errorf("OpenPath(/dev/null) = %v", err)
	}
}

// On a machine with a PHC the real device is opened and sampled; the lab
// machines have none (say so rather than pretend).
func TestRealPHC(t *testing.T) {
	paths, _ := filepath.Glob("/dev/ptp[0-9]*")
	if len(paths) == 0 {
		t.Skip("no /dev/ptp* on this machine: the PHC ioctl path is covered by TestIoctlEncoding and TestDecode only")
	}
	c, err := OpenPath(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := make([]tsconv.Sample, MaxSamples)
	n, err := c.Samples(s)
	if err != nil || n == 0 {
		t.Fatalf("%s (%v): Samples = %d, %v", paths[0], c.Method(), n, err)
	}
	t.Logf("%s: method %v, first bracket %d ns", paths[0], c.Method(), s[0].Width())
}

func TestDiscoverVeth(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	var info Info
	var missingErr error
	if err := p.A.NS.Do(func() (err error) {
		info, err = Discover(p.A.Name)
		_, missingErr = Discover("bdnosuchif0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if info.HasPHC() || info.Index != -1 || info.RXHardware() {
		t.Fatalf("veth reports %+v, want PHC index -1 and no hardware receive stamps", info)
	}
	if c := info.Capabilities(); c.Timestamps || c.Clock {
		t.Fatalf("veth capabilities %+v", c)
	}
	if r := info.Reason(); !strings.Contains(r, "no PHC on "+p.A.Name) {
		t.Fatalf("reason %q", r)
	}
	// veth does stamp in software.
	if info.SoTimestamping&unix.SOF_TIMESTAMPING_RX_SOFTWARE == 0 {
		t.Errorf("veth so_timestamping %#x lacks RX_SOFTWARE", info.SoTimestamping)
	}
	if !errors.Is(missingErr, unix.ENODEV) {
		t.Errorf("Discover(missing) = %v, want ENODEV", missingErr)
	}
	if _, err := Open(info.Index); !errors.Is(err, ErrNoPHC) {
		t.Errorf("Open(%d) = %v, want ErrNoPHC", info.Index, err)
	}
}

// A device that answers neither sampling ioctl (here /dev/null, which
// answers ENOTTY) falls back to clock_gettime brackets.
func TestProbeFallsBackToGettime(t *testing.T) {
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	c := &Clock{name: "/dev/null", f: f, id: unix.CLOCK_MONOTONIC_RAW}
	defer c.Close()
	c.probe()
	if c.Method() != MethodGettime {
		t.Fatalf("method %v, want clock_gettime", c.Method())
	}
	if n, err := c.Samples(make([]tsconv.Sample, 4)); n != 4 || err != nil {
		t.Fatalf("Samples = %d, %v", n, err)
	}
}
