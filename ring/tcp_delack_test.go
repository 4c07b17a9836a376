package ring

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// tcpPacket builds an IPv4 TCP packet from a to b with the given flags,
// TCP options and payload length.
func tcpPacket(a, b netip.AddrPort, flags byte, opts []byte, payload int) []byte {
	doff := 20 + len(opts)
	ip := make([]byte, 20+doff+payload)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[9] = 6
	copy(ip[12:16], a.Addr().AsSlice())
	copy(ip[16:20], b.Addr().AsSlice())
	tcp := ip[20:]
	binary.BigEndian.PutUint16(tcp[0:], a.Port())
	binary.BigEndian.PutUint16(tcp[2:], b.Port())
	tcp[12] = byte(doff/4) << 4
	tcp[13] = flags
	copy(tcp[20:], opts)
	return ip
}

func TestParseTCPSegment(t *testing.T) {
	a, b := netip.MustParseAddrPort("10.0.0.1:4000"), netip.MustParseAddrPort("10.0.0.2:80")
	ts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2}                                         // NOP NOP timestamps
	sack := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2, 1, 1, 5, 10, 0, 0, 0, 9, 0, 0, 0, 19} // + one SACK block
	for _, tc := range []struct {
		name     string
		ip       []byte
		received bool
		want     tcpSegment
	}{
		{"pure ACK", tcpPacket(a, b, 0x10, ts, 0), false, tcpSegment{local: a, remote: b, flags: 0x10}},
		{"ACK with SACK", tcpPacket(a, b, 0x10, sack, 0), false, tcpSegment{local: a, remote: b, flags: 0x10, sack: true}},
		{"received data", tcpPacket(b, a, 0x18, ts, 1400), true, tcpSegment{local: a, remote: b, payload: 1400, flags: 0x18}},
		{"options end early", tcpPacket(a, b, 0x10, []byte{0, 0, 5, 10}, 0), false, tcpSegment{local: a, remote: b, flags: 0x10}},
		{"bad option length", tcpPacket(a, b, 0x10, []byte{8, 40, 5, 10}, 0), false, tcpSegment{local: a, remote: b, flags: 0x10}},
	} {
		got, ok := parseTCPSegment(tc.ip, tc.received)
		if !ok || got != tc.want {
			t.Errorf("%s: got %+v (ok %v), want %+v", tc.name, got, ok, tc.want)
		}
	}
	if _, ok := parseTCPSegment(tcpPacket(a, b, 0x10, nil, 0)[:30], false); ok {
		t.Error("a truncated TCP header parsed")
	}
}
