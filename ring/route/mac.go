package route

import (
	"fmt"
	"net"
	"net/netip"
)

// BroadcastMAC is the Ethernet broadcast address, used for the limited
// broadcast 255.255.255.255 and for a subnet's directed broadcast.
var BroadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// MulticastMAC returns the Ethernet group address a multicast IP maps to:
// 01:00:5e plus the low 23 bits of an IPv4 group (RFC 1112), 33:33 plus the
// low 32 bits of an IPv6 group (RFC 2464). No neighbour lookup is involved.
func MulticastMAC(group netip.Addr) (net.HardwareAddr, error) {
	group = group.Unmap()
	if !group.IsMulticast() {
		return nil, fmt.Errorf("route: %s is not a multicast address", group)
	}
	if group.Is4() {
		b := group.As4()
		return net.HardwareAddr{0x01, 0x00, 0x5e, b[1] & 0x7f, b[2], b[3]}, nil
	}
	b := group.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}, nil
}

// limitedBroadcast is 255.255.255.255, which no routing table holds: it is
// always sent on the chosen interface.
var limitedBroadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})
