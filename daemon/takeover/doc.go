// Package takeover moves a running bypassd's state into a new bypassd
// process (live upgrade): a versioned JSON state document and the file
// descriptors it names, over a connected SOCK_SEQPACKET Unix socket, with
// SCM_RIGHTS batches counted by a manifest.
//
// What it owns: the takeover stream after the control protocol's TAKEOVER
// request (manifest, document chunks, descriptor batches, the taker's
// TAKE or REFUSE verdict, the offerer's RELEASED), the state document's
// schema and its version rules (Version, MinVersion, Choose), and the
// bookkeeping that guarantees every received descriptor is either claimed
// or closed (Files).
//
// What it does not own: deciding what goes into the document and adopting
// it (package daemon), the TAKEOVER request itself (internal/ctlproto), or
// the rings and their kernel objects (package ring, package bpf).
//
// # Versions
//
// Version is the document version this build writes; MinVersion the oldest
// it still reads. Fields are only ever added within a version (a reader
// ignores fields it does not know, and a missing field reads as its zero
// value, which must mean "not in use"); a change an older reader would
// misread bumps Version. The taker states the range it reads in TAKEOVER,
// the offerer writes the newest version both know (Choose) or refuses, so
// an upgrade and a roll-back between neighbouring releases both work.
package takeover
