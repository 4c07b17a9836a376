//go:build verbs

package verbs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

func TestQPWalk(t *testing.T) {
	steps := qpWalk(2)
	want := []qpStep{
		{Name: "INIT", State: qpsInit, Mask: 0x1 | 0x20, Port: 2},
		{Name: "RTR", State: qpsRTR, Mask: 0x1},
		{Name: "RTS", State: qpsRTS, Mask: 0x1},
	}
	if len(steps) != len(want) {
		t.Fatalf("walk has %d steps, want %d", len(steps), len(want))
	}
	for i := range want {
		if steps[i] != want[i] {
			t.Errorf("step %d = %+v, want %+v", i, steps[i], want[i])
		}
	}
}

// The walk stops at the failing step and says which one it was, with the
// errno that libibverbs' ibv_modify_qp documents for the case.
func TestWalkQPErrors(t *testing.T) {
	for _, tc := range []struct {
		failAt string
		errno  unix.Errno
		want   string
	}{
		{"INIT", unix.EPERM, "CAP_NET_RAW"},
		{"INIT", unix.EINVAL, "port that does not exist"},
		{"RTR", unix.EINVAL, "refused the attributes"},
		{"RTS", unix.ENOMEM, "exhausted"},
	} {
		var done []string
		err := walkQP(1, func(st qpStep) error {
			done = append(done, st.Name)
			if st.Name == tc.failAt {
				return tc.errno
			}
			return nil
		})
		if !errors.Is(err, tc.errno) {
			t.Fatalf("fail at %s with %v: err = %v", tc.failAt, tc.errno, err)
		}
		if !strings.Contains(err.Error(), "to "+tc.failAt) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("fail at %s: error %q should name the step and say %q", tc.failAt, err, tc.want)
		}
		if done[len(done)-1] != tc.failAt {
			t.Errorf("walk went on after %s failed: %v", tc.failAt, done)
		}
	}
	if err := walkQP(1, func(qpStep) error { return nil }); err != nil {
		t.Fatalf("clean walk: %v", err)
	}
}

var testMAC = net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}

func udpFlow(dst, src string) qp.Flow {
	f := qp.Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort(dst)}
	if src != "" {
		f.Src = netip.MustParseAddrPort(src)
	}
	return f
}

func TestFlowRuleIPv4ThreeTuple(t *testing.T) {
	b, err := flowRule(udpFlow("10.1.2.3:7000", ""), testMAC, 1)
	if err != nil {
		t.Fatal(err)
	}
	ne, be := binary.NativeEndian, binary.BigEndian
	if len(b) != 20+40+24+16 || int(ne.Uint16(b[8:])) != len(b) {
		t.Fatalf("rule is %d bytes with size field %d, want 100", len(b), ne.Uint16(b[8:]))
	}
	if ne.Uint32(b[4:]) != flowAttrNormal || ne.Uint16(b[10:]) != 1 || b[12] != 3 || b[13] != 1 {
		t.Fatalf("attr header: type %d priority %d specs %d port %d", ne.Uint32(b[4:]), ne.Uint16(b[10:]), b[12], b[13])
	}
	e := b[20:]
	if ne.Uint32(e) != flowSpecEth || ne.Uint16(e[4:]) != 40 {
		t.Fatalf("eth spec header %#x/%d", ne.Uint32(e), ne.Uint16(e[4:]))
	}
	if !bytes.Equal(e[6:12], testMAC) || be.Uint16(e[18:]) != 0x0800 {
		t.Fatalf("eth val: dst %x type %#x", e[6:12], be.Uint16(e[18:]))
	}
	if !bytes.Equal(e[22:28], bytes.Repeat([]byte{0xff}, 6)) || !bytes.Equal(e[28:34], make([]byte, 6)) || be.Uint16(e[34:]) != 0xffff {
		t.Fatalf("eth mask: %x", e[22:38])
	}
	ip := e[40:]
	if ne.Uint32(ip) != flowSpecIPv4 || ne.Uint16(ip[4:]) != 24 {
		t.Fatalf("ipv4 spec header %#x/%d", ne.Uint32(ip), ne.Uint16(ip[4:]))
	}
	if !bytes.Equal(ip[8:12], make([]byte, 4)) || !bytes.Equal(ip[12:16], []byte{10, 1, 2, 3}) ||
		!bytes.Equal(ip[16:20], make([]byte, 4)) || !bytes.Equal(ip[20:24], []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Fatalf("ipv4 val/mask: %x", ip[8:24])
	}
	u := ip[24:]
	if ne.Uint32(u) != flowSpecUDP || ne.Uint16(u[4:]) != 16 {
		t.Fatalf("udp spec header %#x/%d", ne.Uint32(u), ne.Uint16(u[4:]))
	}
	if be.Uint16(u[6:]) != 7000 || be.Uint16(u[8:]) != 0 || be.Uint16(u[10:]) != 0xffff || be.Uint16(u[12:]) != 0 {
		t.Fatalf("udp val/mask: %x", u[6:14])
	}
}

func TestFlowRuleIPv4FiveTuple(t *testing.T) {
	b, err := flowRule(udpFlow("10.1.2.3:7000", "10.9.9.9:5000"), testMAC, 1)
	if err != nil {
		t.Fatal(err)
	}
	ne, be := binary.NativeEndian, binary.BigEndian
	if ne.Uint16(b[10:]) != 0 {
		t.Fatalf("5-tuple priority %d, want 0 (ahead of the 3-tuple rules)", ne.Uint16(b[10:]))
	}
	ip := b[60:]
	if !bytes.Equal(ip[8:12], []byte{10, 9, 9, 9}) || !bytes.Equal(ip[16:20], []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Fatalf("ipv4 source val/mask: %x %x", ip[8:12], ip[16:20])
	}
	u := ip[24:]
	if be.Uint16(u[8:]) != 5000 || be.Uint16(u[12:]) != 0xffff {
		t.Fatalf("udp source val/mask: %x", u[6:14])
	}
}

func TestFlowRuleIPv6(t *testing.T) {
	b, err := flowRule(udpFlow("[2001:db8::1]:9000", "[2001:db8::2]:9001"), testMAC, 1)
	if err != nil {
		t.Fatal(err)
	}
	ne, be := binary.NativeEndian, binary.BigEndian
	if len(b) != 20+40+88+16 {
		t.Fatalf("rule is %d bytes, want 164", len(b))
	}
	if be.Uint16(b[20+18:]) != 0x86dd {
		t.Fatalf("ethertype %#x, want 0x86dd", be.Uint16(b[20+18:]))
	}
	ip := b[60:]
	if ne.Uint32(ip) != flowSpecIPv6 || ne.Uint16(ip[4:]) != 88 {
		t.Fatalf("ipv6 spec header %#x/%d", ne.Uint32(ip), ne.Uint16(ip[4:]))
	}
	dst := netip.MustParseAddr("2001:db8::1").As16()
	src := netip.MustParseAddr("2001:db8::2").As16()
	if !bytes.Equal(ip[24:40], dst[:]) || !bytes.Equal(ip[8:24], src[:]) {
		t.Fatalf("ipv6 addresses: src %x dst %x", ip[8:24], ip[24:40])
	}
	all := bytes.Repeat([]byte{0xff}, 16)
	if !bytes.Equal(ip[48:64], all) || !bytes.Equal(ip[64:80], all) || !bytes.Equal(ip[80:88], make([]byte, 8)) {
		t.Fatalf("ipv6 mask: %x", ip[48:88])
	}
	if u := ip[88:]; be.Uint16(u[6:]) != 9000 || be.Uint16(u[8:]) != 9001 {
		t.Fatalf("udp ports: %x", u[6:10])
	}
}

func TestFlowMAC(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want net.HardwareAddr
	}{
		{"239.129.2.3", net.HardwareAddr{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}},
		{"224.0.0.251", net.HardwareAddr{0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb}},
		{"ff02::1:ff00:1234", net.HardwareAddr{0x33, 0x33, 0xff, 0x00, 0x12, 0x34}},
		{"255.255.255.255", net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"10.0.0.1", testMAC},
	} {
		got, err := flowMAC(netip.MustParseAddr(tc.addr), testMAC)
		if err != nil || !bytes.Equal(got[:], tc.want) {
			t.Errorf("flowMAC(%s) = %x, %v; want %s", tc.addr, got, err, tc.want)
		}
	}
	if _, err := flowMAC(netip.MustParseAddr("10.0.0.1"), nil); err == nil {
		t.Error("unicast flow without an interface MAC accepted")
	}
}

func TestFlowRuleRefuses(t *testing.T) {
	for name, f := range map[string]qp.Flow{
		"tcp":        {Proto: unix.IPPROTO_TCP, Dst: netip.MustParseAddrPort("10.0.0.1:80")},
		"no port":    {Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:0")},
		"no address": {Proto: unix.IPPROTO_UDP},
		"families":   udpFlow("10.0.0.1:80", "[2001:db8::1]:80"),
	} {
		if _, err := flowRule(f, testMAC, 1); err == nil {
			t.Errorf("%s: flow %s accepted", name, f)
		}
	}
}

func TestCheckRateLimit(t *testing.T) {
	pc := &PacingCaps{MinKbps: 1000, MaxKbps: 100_000_000}
	if err := checkRateLimit(qp.RateLimit{Kbps: 10_000}, pc); err != nil {
		t.Fatalf("in range: %v", err)
	}
	if err := checkRateLimit(qp.RateLimit{}, pc); err != nil {
		t.Fatalf("rate 0 (no limit): %v", err)
	}
	for _, k := range []uint32{999, 100_000_001} {
		err := checkRateLimit(qp.RateLimit{Kbps: k}, pc)
		if !errors.Is(err, unix.ERANGE) || !strings.Contains(err.Error(), "1000..100000000") {
			t.Errorf("rate %d: err = %v, want ERANGE naming the range", k, err)
		}
	}
	if err := checkRateLimit(qp.RateLimit{Kbps: 10_000}, nil); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Errorf("no pacing: err = %v, want EOPNOTSUPP", err)
	}
}

func TestSizeQueues(t *testing.T) {
	cfg := Config{Frames: 4096, MaxPacedQueues: 3}
	s, err := sizeQueues(cfg, DeviceCaps{})
	if err != nil {
		t.Fatal(err)
	}
	if s.RXFrames != 2048 || s.TXFrames != 2048 || s.SendWR != 2048 || s.RecvWR != 2048 || s.PacedWR != 256 || s.SendCQE != 2048+3*256 || s.RecvCQE != 2048 {
		t.Fatalf("unclamped sizes %+v", s)
	}
	s, err = sizeQueues(Config{Frames: 4096, MaxPacedQueues: 64}, DeviceCaps{MaxQPWR: 1024, MaxCQE: 4000})
	if err != nil {
		t.Fatal(err)
	}
	if s.RXFrames != 1024 || s.SendWR != 1024 || s.RecvWR != 1024 || s.SendCQE != 4000 || s.RecvCQE != 1024 {
		t.Fatalf("clamped sizes %+v", s)
	}
}

func TestTranslate(t *testing.T) {
	for errno, want := range map[unix.Errno]string{
		unix.EPERM:      "CAP_NET_RAW",
		unix.ENOSYS:     "ib_uverbs",
		unix.ENODEV:     "ibv_devices",
		unix.EOPNOTSUPP: "ibverbs-providers",
		unix.ENOMEM:     "RLIMIT_MEMLOCK",
		unix.EEXIST:     "flow rule",
	} {
		err := translate("do it", errno)
		if !errors.Is(err, errno) || !strings.HasPrefix(err.Error(), "do it: ") || !strings.Contains(err.Error(), want) {
			t.Errorf("translate(%v) = %q, want the errno kept and %q said", errno, err, want)
		}
	}
	if err := translate("do it", unix.E2BIG); err.Error() != "do it: "+unix.E2BIG.Error() {
		t.Errorf("unknown errno: %q", err)
	}
	plain := errors.New("plain")
	if err := translate("do it", plain); !errors.Is(err, plain) {
		t.Errorf("non-errno error lost: %v", err)
	}
	if errnoOf(0) != nil || !errors.Is(errnoOf(-int(unix.EINVAL)), unix.EINVAL) || !errors.Is(errnoOf(int(unix.EIO)), unix.EIO) {
		t.Error("errnoOf does not map 0, -errno and errno")
	}
}
