// Package devmem owns the egress staging allocator: the bookkeeping that
// decides whether an outgoing packet is copied into a provider's
// device-visible memory (an AF_XDP UMEM area reserved for it, or ConnectX
// on-device memory) and where in that memory it goes.
//
// The allocator is circular over a region of N bytes with 8-byte-aligned
// offsets, following the semantics of VMA's on-device-memory path:
//
//   - Packets at or under the inline threshold (default 204 bytes) are never
//     staged; the provider sends them inline or from host memory.
//   - Space is taken at the head. When a packet does not fit between the head
//     and the end of the region but does fit at its start, the skipped tail
//     bytes are charged to that packet and come back when it is released.
//   - In a Chunked region (AF_XDP UMEM) no packet crosses a chunk boundary:
//     one that would starts at the next chunk, and the skipped bytes are
//     charged to it like a wrap.
//   - Space comes back strictly in allocation order, the order in which a
//     send queue completes. A packet whose send completes before an older
//     one's (several send queues sharing the region) is marked done, and its
//     space returns with the older one's.
//   - When the region cannot hold a packet (full, fragmented at the wrap, or
//     the packet is larger than the region) the packet is not staged, goes
//     from host memory, and is counted as oob (out of buffer).
//   - A staged packet that is never posted is given back with Cancel,
//     newest first.
//   - When free space falls below the completion threshold (default 8 KiB),
//     NeedCompletion reports true so the provider forces a completion and the
//     space comes back before the region runs dry.
//   - A region of size 0 (or none) disables staging: nothing is staged and
//     nothing is counted.
//
// The package does not own the memory itself, how it is registered with a
// device, or how a staged frame is posted: those belong to the providers
// (ring/provider/afxdp, the verbs provider), which supply a Region. Neither does it
// own configuration (BYPASSD_RING_DEV_MEM_TX, per-device caps) or the
// presentation of its counters in bypass-stats and Prometheus; it only
// exposes the counters through Manager.Stats.
package devmem
