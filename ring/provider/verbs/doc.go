// Package verbs is the ring provider for NVIDIA ConnectX NICs: a raw
// Ethernet queue pair (IBV_QPT_RAW_PACKET) per ring, through rdma-core's
// libibverbs, with hardware packet pacing (ibv_modify_qp_rate_limit, one QP
// per paced send queue), on-device staging memory (ibv_alloc_dm), completion
// timestamps and the device clock (ibv_query_rt_values_ex) for ring/clock/tsconv,
// and receive steering with one ibv_create_flow rule per offloaded flow in
// place of the XDP program.
//
// The provider is behind the `verbs` build tag because it needs cgo and
// libibverbs (Debian: libibverbs-dev to build, libibverbs1 and
// ibverbs-providers to run). Without the tag the package still builds, in
// pure Go: it maps a network interface to its RDMA device and port through
// sysfs (Lookup), says whether the binary has the provider (Built), and
// explains how to get it (ErrNotBuilt), so that provider selection and
// `bypassctl devices` work in every build. Only a tagged build registers the
// provider as "verbs" with qp.Register (path.go).
//
// The cgo surface is one file, cverbs.go: small C helpers, each one or a few
// libibverbs calls, and thin Go wrappers around them. Everything that decides
// something — attribute structs and masks, the INIT → RTR → RTS walk, flow
// rule layout, capability parsing, error translation, buffer and completion
// bookkeeping — is Go, and its device-free parts are unit-tested with
// `go test -tags verbs ./ring/provider/verbs/`.
//
// None of this has run on a ConnectX device yet: our machines have no RDMA
// hardware and their kernel has no InfiniBand support (so no Soft-RoCE
// either). docs/hardware-testing.md lists what has only been compiled and
// how to run the device tests on a ConnectX host.
//
// The package does not own the ring engine, the XDP program, the staging
// allocator's bookkeeping (ring/devmem), the conversion of timestamps
// (ring/clock/tsconv) or the rate table shared by sockets (the TX scheduler).
package verbs
