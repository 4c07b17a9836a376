// Package shmq is the shared-memory single-producer/single-consumer queue that
// carries datagrams between an application (the shim) and the bypassd daemon.
//
// Each offloaded socket owns two queues (TX: application → daemon, RX:
// daemon → application) in one memfd mapped by both processes. The ring
// engine also uses the same queue in-process over an ordinary []byte.
//
// This package owns: the byte layout of one queue, the producer and consumer
// algorithms, validation of everything the peer can scribble on, the
// eventfd wake-up protocol (Waiter, Policy) and the memfd helpers
// (CreateMemfd, MapMemfd, Unmap). It does not own: where the queues of a
// socket sit inside the memfd, how the memfd and eventfds travel between
// processes (control protocol, SCM_RIGHTS), what record types mean, or what a
// caller does when the peer is found corrupt (close that one socket).
//
// # Memory layout (version 1)
//
// All multi-byte fields are little-endian; the package refuses to run on a
// big-endian host. The memory of one queue is Size(capacity) = 256 +
// capacity bytes and must start 8-byte aligned (64-byte aligned is
// recommended so that every field below sits on the cache line it was
// placed on; a page-aligned mmap satisfies both).
//
//	offset size field            written by
//	     0    4 magic            creator: 0x51445042 (bytes "BPDQ")
//	     4    4 version          creator: 1
//	     8    8 capacity         creator: data area bytes, power of two, 4096..1<<30
//	    16    4 header size      creator: 256 (the data area offset)
//	    20   44 reserved         zero
//	    64    8 producer index   producer only (atomic)
//	    72    8 dropped          producer only (atomic): records dropped because full
//	    80   48 reserved         zero
//	   128    8 consumer index   consumer only (atomic)
//	   136    4 consumer error   consumer sets an errno when it stops for good (atomic)
//	   140   52 reserved         zero
//	   192    4 consumer waiting consumer sets 1, producer clears (atomic)
//	   196    4 producer waiting producer sets 1, consumer clears (atomic)
//	   200   56 reserved         zero
//	   256  cap data area
//
// The producer and consumer indexes are free-running byte counts (they
// never wrap in practice: 2^64 bytes); the data offset of an index i is
// i & (capacity-1). Both are always multiples of 8, and 0 <= producer -
// consumer <= capacity. The queue is empty when they are equal.
//
// # Records
//
// A record starts at an 8-byte aligned data offset:
//
//	offset size field
//	     0    4 length   payload bytes (0..MaxPayload)
//	     4    4 type     opaque to the queue, for the layer above; 0xFFFFFFFF is reserved (padding)
//	     8  len payload  followed by zero to seven bytes of padding up to a multiple of 8
//
// A record never wraps around the end of the data area. When the next record
// does not fit before the end, the producer writes a padding record (type
// TypePad, length = bytes from the end of its 8-byte header to the end of the
// data area) and continues at offset 0. A padding record never starts at
// offset 0. The largest record, header included, is capacity/2 bytes, so
// MaxPayload = capacity/2 - 8: this guarantees that an empty queue accepts any
// record whatever the current offset.
//
// # Memory ordering
//
// The producer writes records with plain stores and then stores the
// producer index (release); the consumer loads the producer index (acquire),
// reads the records, and then stores the consumer index (release) so the
// producer may reuse the space. The wake-up protocol below needs the four
// operations marked "Dekker" to be sequentially consistent; this package
// performs those stores as atomic swaps, which are full barriers even in
// race-detector builds (whose plain atomic stores are only release stores).
// A C peer must use memory_order_seq_cst (or a seq_cst fence) for them;
// acquire/release suffices for the rest.
//
// # Wake-ups
//
// A consumer that found the queue empty and wants to sleep stores 1 into the
// consumer-waiting word (Dekker), re-checks the producer index (Dekker) and
// sleeps on its eventfd only if the queue is still empty. A producer, after
// storing the producer index (Dekker), loads the consumer-waiting word
// (Dekker); if it is 1 it swaps it to 0 and, if the swap returned 1, writes 1
// to the consumer's eventfd. The producer waiting for space is symmetric
// (producer-waiting word, consumer index, producer's eventfd). Spurious
// wake-ups are possible and harmless: a woken side always re-checks the queue.
//
// # Untrusted peer
//
// The peer process may write anything anywhere in the shared memory at any
// time. Header constants are read once by Attach and cached; the peer's index
// is validated on every load (alignment, range, monotonicity) and every
// record header is validated before use. Any violation yields ErrCorrupt,
// which is sticky for that side of that Queue; nothing ever panics, reads or
// writes outside the queue memory, or loops without bound. Payload bytes
// returned by Peek may still change under the reader: copy them before
// parsing when the producer is untrusted.
//
// docs/shm-queue.md repeats this specification for implementers in other
// languages.
package shmq
