// Package qos holds bypassd's traffic-class semantics, taken from the
// ConnectX QoS document (docs/operations.md, "QoS"): how a datagram is
// classified (ToS or SO_PRIORITY → sk_prio → user priority → traffic class,
// and on receive the trust state with its DSCP → priority map), the
// per-interface configuration an operator sets with bypassctl qos (an
// mlnx_qos look-alike), its validation and list syntax, and the two-level
// transmit scheduler that arbitrates a ring's egress among the eight
// traffic classes (strict priority by number, then ETS by deficit round
// robin on wire bytes, each class under an optional token-bucket limit,
// all under an optional port limit).
//
// Everything here is pure: classification is a function of (ToS or
// sk_prio, Config), and the Scheduler is a state machine driven by the
// caller's clock and byte counts. It owns no packets, no endpoints and no
// threads: the ring engine (package ring) asks it which class sends next
// and tells it what was sent; per-socket pacing stays in package pacing
// and sits below the classes (a paced socket waits for its departure time
// whatever its class's turn).
package qos
