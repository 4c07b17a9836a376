// Package stats owns bypassd's published statistics: the versioned,
// memory-mapped stats files (one per client process, one for the daemon),
// their writer and reader, the stats directory's naming and clean-up, and
// the Prometheus collector that exports the same counters over HTTP.
//
// A stats file is a fixed header followed by fixed-size blocks: a summary
// block (the client's totals, or the daemon's control-plane counters), one
// block per ring (daemon file) or per socket (client file). All integers are
// little-endian; every counter is 64 bits wide and never wraps at 32. The
// layout is specified byte by byte in docs/stats-file.md; the constants and
// offsets here are the truth and a test checks the document against them.
//
// Consistency: the writer (the daemon) publishes whole snapshots under a
// sequence counter (a seqlock). It makes the counter odd, stores the blocks
// word by word with atomic 64-bit stores, and makes it even again. A reader
// copies what it needs with atomic loads and retries when the counter was odd
// or changed, so it never sees a torn value, and it never writes to the file,
// so it can never slow the writer down.
//
// What the package does not own: where the counters come from (the ring
// engine and the daemon keep them as atomics and hand snapshots to Publish),
// what is written when (package daemon decides the interval), the command-line
// views (cmd/bypass-stats) and the HTTP server (package daemon serves the
// registry built with NewRegistry).
package stats
