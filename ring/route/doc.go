// Package route answers, for the ring engine, where a datagram goes: the
// egress interface, the source address the kernel would pick, the next hop and
// its MAC, and the MTU. Every answer comes from the kernel's own tables over
// rtnetlink in the ring's network namespace; a missing neighbour is resolved
// by asking the kernel to run ARP/ND (RTM_NEWNEIGH with NTF_USE), never by
// sending or guessing anything ourselves. Answers are cached and the cache is
// invalidated by rtnetlink notifications; Generation tells the engine when its
// header templates may be stale.
//
// The package also reserves ports in the kernel (ReservePort) so that the
// kernel never hands an offloaded UDP port to another socket.
//
// It does not own header templates or transmission (package ring does), does
// not follow path-MTU discoveries (the kernel does not notify them), and does
// not keep kernel neighbour entries confirmed while only bypass traffic flows
// (the kernel ages them to STALE; a MAC change is still seen through
// gratuitous ARP / unsolicited ND updates, and a deleted entry invalidates the
// cache).
package route
