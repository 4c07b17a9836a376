// Package tap owns the kernel objects of bypassd's TAP fallback path: a TAP
// device per ring (Device) and the tc programming that steers offloaded
// flows into it and its output back to the NIC (Steering, over netlink;
// nothing shells out to tc).
//
// The path, for a ring on NIC eth1:
//
//	eth1 ingress qdisc ── u32 (our priority) ── flow match ── mirred ──> TAP egress ──> TAP fd (ring reads)
//	TAP fd (ring writes) ──> TAP ingress qdisc ── u32 match-all ── mirred ──> eth1 egress
//
// On eth1, one u32 classifier instance per IP version at a priority that is
// ours (PrioIPv4, PrioIPv6) holds an entry table and, per destination
// address, a 256-bucket hash table indexed by the low byte of the
// destination port, with one filter per flow: its protocol (UDP or TCP,
// whose ports sit in the same place) and 3-tuple, or 5-tuple with the
// source. The address's link filter takes every protocol; a packet no flow
// filter takes goes on to the kernel. Every filter we create carries
// ClassMark as its class id. That mark and the priority are how a restarted daemon tells its predecessor's
// leftovers (Sweep) from anyone else's filters, which it never touches.
//
// Fragments: only the first IPv4 fragment carries the UDP header, so u32
// cannot tell which port a later fragment belongs to. Fragments (first
// included, and every IPv6 fragment) of UDP datagrams to an address that has
// at least one offloaded flow are all redirected to the TAP; the ring
// reassembles them and drops datagrams of ports it does not serve. While the
// TAP path steers an address, fragmented datagrams to its other ports are
// therefore lost; unfragmented ones reach the kernel as usual.
//
// Objects are reference counted: the ingress qdisc and the classifier per
// interface (shared by the rings of the interface in this process), a hash
// table per destination address, a filter per flow. Deletions the kernel
// answers with EBUSY (a hash table whose last link is still being released)
// are retried.
//
// The package does not decide when the TAP path carries traffic (package
// ring does), and it does not read or write frames (ring/provider/tapfd does).
package tap
