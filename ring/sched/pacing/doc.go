// Package pacing owns the arithmetic of packet pacing: the rate a socket
// asked for (Rate, with its burst allowance), the per-queue departure-time
// state that enforces it (Pacer), the timing wheel that orders paced queues
// by their next departure (Wheel), and the per-device rate table that hands
// out shared, reference-counted rate entries within the device's limits
// (Table).
//
// It does no I/O and reads no clock: callers pass the time (monotonic
// nanoseconds) in. The ring engine (package ring) drives the pacers and the
// wheel on its thread; the daemon owns one Table per interface and decides
// which sockets hold which entries. Hardware pacing (qp.RateLimiter) is the
// engine's business, not this package's.
//
// What is counted: a rate limits wire bytes, the whole Ethernet frame as
// built (Ethernet, IP and UDP headers plus payload, each fragment with its
// own headers), without preamble, inter-frame gap and FCS. A receiver that
// sees only UDP payloads adds 42 bytes per IPv4 datagram (62 for IPv6).
package pacing
