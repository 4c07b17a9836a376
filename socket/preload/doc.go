// Package preload holds libbypassd.so, the LD_PRELOAD client that carries
// the UDP sockets of unmodified, dynamically linked programs through
// bypassd (docs/preload.md). The library itself is C, in c/; this package
// has no Go API. Its tests hold the C client to the Go implementation
// (golden control messages and queue images written by internal/ctlproto
// and internal/shmq, read by the C unit test under AddressSanitizer and
// UndefinedBehaviorSanitizer) and run real programs under the library in a
// netns lab: Debian's sockperf, a C program exercising epoll, poll,
// select, non-blocking calls and fork, and Python's asyncio.
//
// It owns nothing of the protocol: docs/protocol.md and docs/shm-queue.md
// are the contract, and the Go code (package socket is the reference
// client) is the source of truth.
package preload
