// Package netlab builds throw-away network labs out of Linux network
// namespaces and veth pairs for the tests, benchmarks and demo scripts of
// bypassd.
//
// What it owns: named network namespaces whose names start with "bdlab-"
// (bind-mounted under /run/netns, so `ip netns exec NAME` works), the veth
// pair joining each pair of them, the addresses, neighbour entries and
// sysctls inside those namespaces, and the /run/netns mount set-up that
// iproute2 also performs. A Pair is torn down by deleting its two namespaces,
// which destroys the veths with them; nothing is ever created in, or changed
// on any interface of, the namespace the process runs in.
//
// What it does not own: XDP programs, AF_XDP sockets, qdiscs, TAP devices or
// processes started in a namespace. Whoever creates those must remove them
// (or stop them) before the Pair is closed; a process still running in a
// namespace keeps it alive after Close.
//
// Naming: namespaces are "bdlab-<pid>-<n>-a" and "bdlab-<pid>-<n>-b" (or
// "bdlab-<name>-a/-b" for Options.Name), so Sweep can tell which ones were
// abandoned by processes that no longer exist. The veth is created directly
// inside the two lab namespaces, so its names never appear in, or clash
// with, the root namespace.
//
// Every privileged test should start with RequirePriv (NewPair calls it).
package netlab
