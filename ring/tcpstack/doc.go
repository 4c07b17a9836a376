// Package tcpstack is the TCP half of a ring: a gVisor pkg/tcpip network
// stack whose only network interface is a link endpoint of ours, fed by the
// ring's engine (as gVisor's own fdbased and xdp endpoints are fed by a
// descriptor), and the pumps that connect its TCP endpoints to a client
// socket's shared-memory queues as stream records (internal/stream).
//
// # One stack per ring
//
// A Stack serves one ring. The alternative, one stack per network namespace
// shared by the rings of all interfaces and queues, would need the engines
// of several rings to hand each other frames: the stack's outbound queue
// would have to pick a ring per packet and the rings would share one
// segment-processing state. With one stack per ring, a connection lives
// where its frames arrive (its flow is steered to that ring's queue), the
// engine that receives a segment is the one that sends the answer, nothing
// crosses rings, and a ring going away takes exactly its own connections.
// The price is memory per ring (a few goroutines and buffers, created only
// when the ring carries its first TCP socket) and that a port is unique per
// ring, not per namespace — which the kernel port reservation (package
// ring/route) enforces anyway.
//
// # Link endpoint
//
// The link endpoint is IP-level (no link header, no link resolution): the
// engine strips the Ethernet header of a received frame and hands the IP
// packet to Deliver, and it takes the stack's outbound IP packets with
// Outbound, resolving the next hop and prepending the Ethernet header with
// the same route and neighbour machinery, statistics and provider as UDP.
// The stack therefore never sends ARP or neighbour discovery of its own and
// treats every destination as on-link. Only TCP leaves it: anything else
// the stack would send (ICMP, MLD) is dropped and counted.
//
// Checksums and TSO: the stack verifies received TCP checksums (a frame
// with a partial checksum, as veth produces with TX offload on, fails).
// For what it sends, the link offers segmentation offload as a NIC does
// (gVisor's host GSO): the stack hands it segments of up to 64 KiB with the
// TCP checksum left to the link, and the engine cuts each into frames of
// one MSS, completing every checksum in the same pass as the copy
// (segment.go).
//
// The package does not own steering, port reservations or frames (package
// ring), nor the control protocol (package daemon).
package tcpstack
