// Package soak is bypassd's chaos soak (`make soak`, not part of `make
// test`): a bypassd process serving a streaming client in a network
// namespace lab while, at random, it is upgraded in place (--takeover),
// killed with -9 and restarted, a second client is killed with -9, and the
// peer's link flaps. It accounts for every datagram (received, or lost in
// a crash or flap window, which it reports; lost anywhere else fails) and
// checks that the daemon's descriptors, memory, tc filters and TAP devices
// do not grow. The test is in soak_test.go behind the `soak` build tag;
// BYPASSD_SOAK_BIN names the bypassd binary, BYPASSD_SOAK_MINUTES the
// duration (default 10).
package soak
