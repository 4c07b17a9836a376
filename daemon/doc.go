// Package daemon is bypassd's process core: it opens the rings of the
// configured interface queues, serves the control socket, and keeps one
// session per connected client.
//
// What it owns:
//   - the daemon's life cycle: per-interface lock files (so a second daemon
//     is refused with the first one's pid), the control socket (through
//     ctlproto.Listen), the stats directory and the clean-up of what a
//     crashed daemon left there, the graceful shutdown that tells every
//     client (SHUTDOWN) before closing the rings;
//   - sessions: the client's identity from SO_PEERCRED, the HELLO-first
//     rule, request handling in order with errno replies, the malformed
//     message budget, per-client limits (sockets, queue memory), and the
//     release of everything a client held when its connection ends for any
//     reason (close, crash, kill -9);
//   - sockets: the sealed memfd holding a socket's two shmq queues (formatted
//     here), the eventfds passed to the client, the choice of ring at BIND,
//     the privileged-port check, and the mapping of socket options onto
//     ring.HeaderOptions;
//   - publishing the counters: the stats file of each client process and of
//     the daemon, rewritten every StatsInterval from the atomics the ring
//     engine keeps (so the data path pays nothing), their zeroing baselines
//     (ZERO_STATS), the run-time log level (SET_LOG_LEVEL), the control
//     plane's counters, and the HTTP server of /metrics.
//
// What it does not own: the stats file layout and the Prometheus metric
// names (package stats), the wire format (internal/ctlproto), the queue
// layout and wake-up protocol (internal/shmq), the fast path, steering,
// port reservations and multicast memberships (package ring, which the
// daemon drives through ring.Ring.Bind and ring.Endpoint), flag and
// environment parsing (cmd/bypassd), or the client side (package socket).
//
// # Rings and doorbells
//
// A client wakes a sleeping ring engine through the ring's doorbell eventfd,
// which the OPEN reply carries before the socket is bound. The daemon
// therefore gives each socket a home ring at OPEN: of the rings of the
// first configured interface with an address of the socket's family (a ring
// per receive queue by default, queues.go), the least loaded. BIND must then
// land on that ring's interface, and binds on the home ring; an address of
// another interface is refused with EADDRNOTAVAIL. With one interface per
// address family (the usual set-up) this never matters. Frames of the
// socket's flows that RSS puts on other queues reach it through the ring
// that received them (ring/handoff.go).
package daemon
