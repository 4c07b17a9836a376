package ntuple

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// golden are the requests of testdata/golden.c, the rules it builds.
var golden = map[string]func() []byte{
	"udp4-3tuple": func() []byte {
		return mustInsert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:7000"), Queue: 3, Location: LocationAny})
	},
	"tcp4-5tuple": func() []byte {
		return mustInsert(Rule{Proto: unix.IPPROTO_TCP, Dst: netip.MustParseAddrPort("10.1.2.3:80"),
			Src: netip.MustParseAddrPort("10.9.8.7:40000"), Queue: 1, Location: LocationAny})
	},
	"udp6-3tuple": func() []byte {
		return mustInsert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[fd00::1]:53"), Queue: 7, Location: LocationAny})
	},
	"delete-1023": func() []byte { return encodeDelete(1023) },
}

func mustInsert(r Rule) []byte {
	b, err := r.encodeInsert()
	if err != nil {
		panic(err)
	}
	return b
}

func readGolden(t *testing.T, text []byte) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	s := bufio.NewScanner(bytes.NewReader(text))
	for s.Scan() {
		name, h, ok := strings.Cut(s.Text(), " ")
		if !ok {
			continue
		}
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatalf("golden %s: %v", name, err)
		}
		out[name] = b
	}
	return out
}

// TestEncodeMatchesKernelHeaders: every request is byte for byte what a C
// program built against linux/ethtool.h lays out (testdata/golden.hex,
// regenerated here when a C compiler and the header are present). The
// golden requests were made on a little-endian host.
func TestEncodeMatchesKernelHeaders(t *testing.T) {
	committed, err := os.ReadFile("testdata/golden.hex")
	if err != nil {
		t.Fatal(err)
	}
	if cc, err := exec.LookPath("cc"); err == nil {
		if _, err := os.Stat("/usr/include/linux/ethtool.h"); err == nil {
			bin := filepath.Join(t.TempDir(), "golden")
			if out, err := exec.Command(cc, "-Wall", "-Wextra", "-Werror", "-o", bin, "testdata/golden.c").CombinedOutput(); err != nil {
				t.Fatalf("build testdata/golden.c: %v\n%s", err, out)
			}
			fresh, err := exec.Command(bin).Output()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(fresh, committed) {
				t.Fatalf("testdata/golden.hex differs from what golden.c prints with this kernel's headers:\n%s", fresh)
			}
		}
	}
	want := readGolden(t, committed)
	if len(want) != len(golden) {
		t.Fatalf("golden.hex has %d requests, the test %d", len(want), len(golden))
	}
	for name, enc := range golden {
		got := enc()
		if len(got) != rxnfcSize || !bytes.Equal(got, want[name]) {
			t.Errorf("%s:\n got %x\nwant %x", name, got, want[name])
		}
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	for _, r := range []Rule{
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:7000"), Queue: 3, Location: 12},
		{Proto: unix.IPPROTO_TCP, Dst: netip.MustParseAddrPort("10.1.2.3:80"), Src: netip.MustParseAddrPort("10.9.8.7:40000"), Queue: 1, Location: 0},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("[fd00::1]:53"), Queue: 7, Location: 1023},
		{Proto: unix.IPPROTO_TCP, Dst: netip.MustParseAddrPort("[fd00::1]:53"), Src: netip.MustParseAddrPort("[fd00::2]:9"), Queue: 63},
	} {
		b := mustInsert(r)
		got, ok := decodeRule(b)
		if !ok || got != r {
			t.Errorf("decode(encode(%v)) = %v, %v", r, got, ok)
		}
	}
	// Someone else's rules are not ours to list (or sweep).
	drop := mustInsert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:7000")})
	binaryPutCookie(drop, ^uint64(0)) // RX_CLS_FLOW_DISC
	tos := mustInsert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:7000")})
	tos[fsMU+12] = 0xff
	partial := mustInsert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.1.2.3:7000")})
	partial[fsMU+ip4Dst+3] = 0
	for name, b := range map[string][]byte{"drop": drop, "tos": tos, "partial mask": partial} {
		if r, ok := decodeRule(b); ok {
			t.Errorf("%s rule decoded as ours: %v", name, r)
		}
	}
}

func binaryPutCookie(b []byte, v uint64) {
	for i := range 8 {
		b[fsRingCookie+i] = byte(v >> (8 * i))
	}
}

func TestBadRules(t *testing.T) {
	for _, r := range []Rule{
		{Proto: unix.IPPROTO_UDP},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("0.0.0.0:7")},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:0")},
		{Proto: unix.IPPROTO_ICMP, Dst: netip.MustParseAddrPort("10.0.0.1:7")},
		{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:7"), Src: netip.MustParseAddrPort("[fd00::1]:7")},
	} {
		if _, err := r.encodeInsert(); err == nil {
			t.Errorf("rule %v encoded", r)
		}
	}
}

// TestVethHasNoRules: the real ioctl against a driver without flow rules
// (veth) fails with ErrUnsupported, and says how to turn them on.
func TestVethHasNoRules(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	err := p.A.NS.Do(func() error {
		d, err := Open(p.A.Name)
		if err != nil {
			return err
		}
		defer d.Close()
		if err := d.Supported(); !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "ntuple on") {
			t.Errorf("Supported on veth = %v, want ErrUnsupported with advice", err)
		}
		if _, err := d.Insert(Rule{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(p.A.Addr4(), 7000), Location: LocationAny}); !errors.Is(err, ErrUnsupported) {
			t.Errorf("Insert on veth = %v, want ErrUnsupported", err)
		}
		if _, err := d.List(); !errors.Is(err, ErrUnsupported) {
			t.Errorf("List on veth = %v, want ErrUnsupported", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(""); err == nil {
		t.Error("Open(\"\") accepted")
	}
}
