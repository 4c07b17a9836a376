package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// keyBytes returns the exact bytes the kernel sees for k.
func keyBytes(t *testing.T, k flowKey) []byte {
	t.Helper()
	b, err := binary.Append(nil, binary.NativeEndian, k)
	if err != nil {
		t.Fatalf("encode key: %v", err)
	}
	return b
}

func mustKey(t *testing.T, f Flow) flowKey {
	t.Helper()
	k, err := f.key()
	if err != nil {
		t.Fatalf("key(%s): %v", f, err)
	}
	return k
}

func TestFlowKeyEncoding(t *testing.T) {
	v4mapped := func(a, b, c, d byte) []byte {
		return []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a, b, c, d}
	}
	zero16 := make([]byte, 16)
	v6 := netip.MustParseAddr("2001:db8::1")
	v6b := v6.As16()
	v6src := netip.MustParseAddr("2001:db8::2")
	v6srcb := v6src.As16()

	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	tests := []struct {
		name string
		flow Flow
		want []byte
	}{
		{
			name: "ipv4 3-tuple",
			flow: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:5000")},
			want: cat([]byte{17, 0, 0, 0, 0x13, 0x88, 0, 0}, v4mapped(10, 1, 2, 3), zero16),
		},
		{
			name: "ipv4 5-tuple",
			flow: Flow{
				Proto: unix.IPPROTO_UDP,
				Dst:   netip.MustParseAddrPort("10.1.2.3:5000"),
				Src:   netip.MustParseAddrPort("192.168.0.9:258"),
			},
			want: cat([]byte{17, 0, 0, 0, 0x13, 0x88, 0x01, 0x02}, v4mapped(10, 1, 2, 3), v4mapped(192, 168, 0, 9)),
		},
		{
			name: "ipv4-mapped ipv6 input encodes like ipv4",
			flow: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[::ffff:10.1.2.3]:5000")},
			want: cat([]byte{17, 0, 0, 0, 0x13, 0x88, 0, 0}, v4mapped(10, 1, 2, 3), zero16),
		},
		{
			name: "ipv6 5-tuple",
			flow: Flow{
				Proto: unix.IPPROTO_UDP,
				Dst:   netip.AddrPortFrom(v6, 11111),
				Src:   netip.AddrPortFrom(v6src, 65535),
			},
			want: cat([]byte{17, 0, 0, 0, 0x2b, 0x67, 0xff, 0xff}, v6b[:], v6srcb[:]),
		},
		{
			name: "zone is dropped",
			flow: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[fe80::1%veth0]:53")},
			want: cat([]byte{17, 0, 0, 0, 0, 53, 0, 0},
				[]byte{0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, zero16),
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := keyBytes(t, mustKey(t, tc.flow))
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("key bytes\n got %x\nwant %x", got, tc.want)
			}
		})
	}
}

func TestFlowKeyRoundTrip(t *testing.T) {
	tests := []struct{ in, want Flow }{
		{
			in:   Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:1")},
			want: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:1")},
		},
		{
			in: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[::ffff:10.0.0.1]:1"),
				Src: netip.MustParseAddrPort("[::ffff:10.0.0.2]:2")},
			want: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:1"),
				Src: netip.MustParseAddrPort("10.0.0.2:2")},
		},
		{
			in: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[2001:db8::1]:65535"),
				Src: netip.MustParseAddrPort("[2001:db8::2]:0")},
			want: Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[2001:db8::1]:65535"),
				Src: netip.MustParseAddrPort("[2001:db8::2]:0")},
		},
	}
	vx := Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("192.168.17.1:5000"), VNI: 0xabcdef, VXLANPort: 4789}
	tests = append(tests, struct{ in, want Flow }{vx, vx})
	for _, tc := range tests {
		var v flowVal
		binary.BigEndian.PutUint16(v.VXLANPort[:], tc.in.VXLANPort)
		if got := mustKey(t, tc.in).flow(v); got != tc.want {
			t.Errorf("round trip of %s = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestFlowKeyRejects(t *testing.T) {
	dst := netip.MustParseAddrPort("10.0.0.1:53")
	tests := []struct {
		name string
		flow Flow
		want string
	}{
		{"zero proto", Flow{Dst: dst}, "IPPROTO_UDP"},
		{"icmp", Flow{Proto: unix.IPPROTO_ICMP, Dst: dst}, "protocol 1"},
		{"no dst", Flow{Proto: unix.IPPROTO_UDP}, "destination address and port are required"},
		{"dst port 0", Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:0")}, "required"},
		{"unspecified dst", Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("0.0.0.0:53")}, "concrete"},
		{"unspecified src", Flow{Proto: unix.IPPROTO_UDP, Dst: dst, Src: netip.MustParseAddrPort("[::]:9")}, "zero netip.AddrPort"},
		{"family mismatch", Flow{Proto: unix.IPPROTO_UDP, Dst: dst, Src: netip.MustParseAddrPort("[2001:db8::1]:9")}, "both be IPv4"},
		{"overlay tcp", Flow{Proto: unix.IPPROTO_TCP, Dst: dst, VNI: 1, VXLANPort: 4789}, "only UDP"},
		{"vni too big", Flow{Proto: unix.IPPROTO_UDP, Dst: dst, VNI: 1 << 24, VXLANPort: 4789}, "VNI 16777216 out of range"},
		{"port without vni", Flow{Proto: unix.IPPROTO_UDP, Dst: dst, VXLANPort: 4789}, "VNI 0 out of range"},
		{"vni without port", Flow{Proto: unix.IPPROTO_UDP, Dst: dst, VNI: 7}, "needs its VXLAN port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.flow.key()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("key(%s) error = %v, want mention of %q", tc.flow, err, tc.want)
			}
		})
	}
}

func TestFlowString(t *testing.T) {
	f := Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:53")}
	if got, want := f.String(), "udp 10.0.0.1:53 from any"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	f.Src = netip.MustParseAddrPort("10.0.0.2:9")
	if got, want := f.String(), "udp 10.0.0.1:53 from 10.0.0.2:9"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestAttachModeString(t *testing.T) {
	for m, want := range map[AttachMode]string{ModeAuto: "auto", ModeNative: "native", ModeGeneric: "generic", 7: "AttachMode(7)"} {
		if got := m.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(m), got, want)
		}
	}
}

// checkLayout compares a Go mirror struct with the C struct in the object's
// BTF: same size, same member order and offsets.
func checkLayout(t *testing.T, goType any, cType btf.Type) {
	t.Helper()
	st, ok := btf.UnderlyingType(cType).(*btf.Struct)
	if !ok {
		t.Fatalf("BTF type %v is not a struct", cType)
	}
	rt := reflect.TypeOf(goType)
	if int(st.Size) != int(rt.Size()) || binary.Size(goType) != int(rt.Size()) {
		t.Fatalf("%s: Go size %d (packed %d), C size %d", st.Name, rt.Size(), binary.Size(goType), st.Size)
	}
	if len(st.Members) != rt.NumField() {
		t.Fatalf("%s: Go has %d fields, C has %d members", st.Name, rt.NumField(), len(st.Members))
	}
	for i, m := range st.Members {
		f := rt.Field(i)
		if !strings.EqualFold(f.Name, m.Name) || uint32(f.Offset) != m.Offset.Bytes() {
			t.Errorf("%s member %d: Go %s@%d, C %s@%d", st.Name, i, f.Name, f.Offset, m.Name, m.Offset.Bytes())
		}
		if sz, err := btf.Sizeof(m.Type); err != nil || sz != int(f.Type.Size()) {
			t.Errorf("%s.%s: Go size %d, C size %d (%v)", st.Name, m.Name, f.Type.Size(), sz, err)
		}
	}
}

// TestObjectMatchesGoMirrors checks the committed object against the Go
// side without loading it into the kernel (no privileges needed).
func TestObjectMatchesGoMirrors(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	flows := spec.Maps[steerMapFlows]
	checkLayout(t, flowKey{}, flows.Key)
	checkLayout(t, flowVal{}, flows.Value)
	vp := spec.Maps[steerMapVxlanPorts]
	checkLayout(t, vxlanPorts{}, vp.Value)
	if vp.Type != ebpf.Array || vp.MaxEntries != 1 {
		t.Errorf("vxlan_ports: type %v max %d, want Array max 1", vp.Type, vp.MaxEntries)
	}
	if flows.Type != ebpf.Hash || flows.MaxEntries != DefaultMaxFlows {
		t.Errorf("flows: type %v max %d, want Hash max %d", flows.Type, flows.MaxEntries, DefaultMaxFlows)
	}
	xsks := spec.Maps[steerMapXsks]
	if xsks.Type != ebpf.XSKMap || xsks.MaxEntries != MaxSockets {
		t.Errorf("xsks: type %v max %d, want XSKMap max %d", xsks.Type, xsks.MaxEntries, MaxSockets)
	}
	if frags := spec.Maps[steerMapFrags]; frags.Type != ebpf.LRUHash {
		t.Errorf("frags: type %v, want LRUHash", frags.Type)
	}
	counters := spec.Maps[steerMapCounters]
	if counters.Type != ebpf.PerCPUArray || counters.MaxEntries != counterMax || counters.ValueSize != 8 {
		t.Errorf("counters: type %v max %d value %d, want PerCPUArray max %d value 8",
			counters.Type, counters.MaxEntries, counters.ValueSize, counterMax)
	}
	prog := spec.Programs[steerProgSteer]
	if prog.Type != ebpf.XDP || prog.SectionName != "xdp" || prog.License != "Dual MIT/GPL" {
		t.Errorf("program: type %v section %q license %q", prog.Type, prog.SectionName, prog.License)
	}
}

func TestAttachRejectsBadArguments(t *testing.T) {
	if _, err := Attach(0, Options{}); err == nil || !strings.Contains(err.Error(), "invalid ifindex") {
		t.Errorf("Attach(0) error = %v", err)
	}
	if _, err := Attach(1<<30, Options{Mode: 9}); err == nil || !strings.Contains(err.Error(), "unknown mode") {
		t.Errorf("Attach(mode 9) error = %v", err)
	}
}

func TestAttachErrorTranslation(t *testing.T) {
	wrapped := func(errno unix.Errno) error { return fmt.Errorf("failed to attach link: create link: %w", errno) }
	tests := []struct {
		errno unix.Errno
		mode  AttachMode
		want  string
	}{
		{unix.ERANGE, ModeNative, "peer MTU too large for native XDP (lower the peer MTU below ~3500 or use generic mode)"},
		{unix.ENOSPC, ModeNative, "more TX queues than this side has RX queues"},
		{unix.EBUSY, ModeNative, "bpftool net"},
		{unix.EEXIST, ModeGeneric, "native and generic cannot be mixed"},
		{unix.EPERM, ModeGeneric, "CAP_BPF and CAP_NET_ADMIN"},
		{unix.EOPNOTSUPP, ModeNative, "no native XDP support"},
		{unix.ENODEV, ModeGeneric, "no such interface"},
	}
	for _, tc := range tests {
		// An ifindex no interface has, so the message falls back to the number.
		err := attachError(1<<30, tc.mode, wrapped(tc.errno))
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.mode.String()+" mode") {
			t.Errorf("%v: %v, want mention of %q", tc.errno, err, tc.want)
		}
		if !errors.Is(err, tc.errno) {
			t.Errorf("%v: errno lost from chain: %v", tc.errno, err)
		}
	}
}
