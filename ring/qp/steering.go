package qp

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Flow identifies offloaded traffic by destination (3-tuple: protocol,
// destination address and port) or, with a valid Src, by both ends
// (5-tuple). A 5-tuple flow takes precedence over the 3-tuple flow of the
// same destination.
type Flow struct {
	Proto uint8          // unix.IPPROTO_UDP
	Dst   netip.AddrPort // a concrete local address and a port
	Src   netip.AddrPort // zero value: any source
	// VNI, when not 0, puts the flow inside a VXLAN overlay: Dst and Src
	// are the inner datagram's, carried in UDP to VXLANPort.
	VNI       uint32
	VXLANPort uint16
}

// String renders the flow for errors and logs, e.g. "udp 10.0.0.1:53 from any".
func (f Flow) String() string {
	proto := fmt.Sprintf("proto %d", f.Proto)
	if f.Proto == unix.IPPROTO_UDP {
		proto = "udp"
	}
	src := "any"
	if f.Src.IsValid() {
		src = f.Src.String()
	}
	if f.VNI != 0 {
		return fmt.Sprintf("%s %s from %s in vxlan %d port %d", proto, f.Dst, src, f.VNI, f.VXLANPort)
	}
	return fmt.Sprintf("%s %s from %s", proto, f.Dst, src)
}

// Steering directs a ring's flows from the NIC to its provider: the XDP
// program's flow map for afxdp, tc u32 filters with mirred redirects for the
// TAP, ibv_create_flow rules for verbs. Opening one attaches it (the
// constructor belongs to the provider's package); Close detaches it and
// removes every flow it installed.
//
// The ring counts references: AddFlow and DeleteFlow are called once per
// distinct flow, under the ring's lock, never concurrently.
type Steering interface {
	// AddFlow makes frames of f reach the provider.
	AddFlow(f Flow) error
	// DeleteFlow stops steering f; deleting a flow that is not installed
	// is not an error.
	DeleteFlow(f Flow) error
	// Flows lists what is installed, as the kernel or device reports it.
	Flows() ([]Flow, error)
	// Healthy returns nil while installed flows reach the provider, and
	// otherwise an error saying what broke (the XDP program was detached,
	// the device vanished). Cheap enough to call every millisecond.
	Healthy() error
	// Close removes the flows still installed and detaches the steering.
	Close() error
}
