// Package ctlproto is the bypassd control protocol, version 1: the
// fixed-layout binary messages an application (the socket shim) and the
// daemon exchange over a SOCK_SEQPACKET Unix socket, and the connection
// plumbing that carries them (Conn, Dial, Listen) including file
// descriptors passed with SCM_RIGHTS and the peer's SO_PEERCRED identity.
//
// This package owns: the byte layout of every message (docs/protocol.md is the
// language-neutral specification of the same thing), validation of
// everything a peer can send (a packet is either decoded completely or
// refused with an error that says which errno to reply with), which messages
// carry file descriptors and how many, the socket file's creation, mode,
// group and stale-file handling, and the wording of connection errors shown
// to users.
//
// It does not own: what the messages mean to the daemon (sessions, limits,
// rings, permission checks such as privileged ports), request/reply matching
// and concurrency on the client side, the shared-memory queues the OPEN
// reply's memfd holds (package internal/shmq), or what either side does when
// the peer misbehaves beyond replying with an errno.
//
// # Usage
//
// A client dials, sends HELLO, then requests:
//
//	c, err := ctlproto.Dial("")  // $BYPASSD_SOCKET or DefaultPath
//	err = c.Send(ctlproto.Header{Code: ctlproto.CodeHello, ReqID: 1}, ctlproto.NewHello("myprog"))
//	h, msg, fds, err := c.Recv() // h.Code == CodeHello|ReplyBit, msg.(*ctlproto.HelloReply)
//
// The daemon listens, accepts, reads the client's identity from PeerCred and
// replies with the request's code|ReplyBit and request id; a failed request
// is answered with a positive errno in Header.Status and an Empty body
// (ErrorReply builds that header). Unmarshal and Conn.Recv return, for a
// packet they refuse, an error from which Errno gives the status to reply
// with, and the Header whenever it could be decoded so that its request id
// can be echoed.
package ctlproto
