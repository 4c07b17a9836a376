// Package socket is the client shim applications link to have their UDP
// and TCP traffic carried by bypassd: a Client is one session with the
// daemon over its Unix control socket, a UDPConn is a UDP socket whose
// datagrams leave and arrive through the daemon's kernel-bypass rings, and
// a TCPConn (DialTCP, TCPListener.Accept) a TCP connection held by the
// daemon's TCP stack whose bytes move through the same kind of
// shared-memory queues.
//
// Sockets behave like Go's: UDPConn implements net.PacketConn and net.Conn,
// TCPConn net.Conn (with CloseWrite, SetNoDelay, SetKeepAlive*, SetLinger),
// TCPListener net.Listener; they honour deadlines (also for calls already
// blocked), unblock pending calls
// with net.ErrClosed on Close, and returns *net.OpError values whose causes
// match syscall errnos with errors.Is (unix.EADDRINUSE, unix.EMSGSIZE,
// unix.EAGAIN in non-blocking mode, os.ErrDeadlineExceeded at a deadline).
// Options are set by their Linux names (SetOption("IP_TOS", 0x10)).
//
// Data never crosses the control socket. Each socket has a sealed memfd,
// shared with the daemon, holding a send and a receive queue
// (internal/shmq) of datagram records (internal/dgram), plus eventfds through
// which either side wakes the other only when it sleeps. A blocked call
// spins for the daemon's polling time first (BYPASSD_RX_POLL in µs
// overrides it for this process: -1 spins forever, 0 never spins).
//
// When the daemon goes away (it stopped, said SHUTDOWN, or died), every
// socket of the session fails promptly with an error matching ErrDaemonGone
// and net.ErrClosed; restart the daemon and open new sockets (Default dials
// again by itself).
//
// The package owns the client side of the control protocol (request/reply
// matching, the HELLO handshake, turning the daemon's errnos into errors
// with advice) and the user side of the socket queues. It does not own the
// protocol encoding (internal/ctlproto), the queue layout (internal/shmq,
// internal/sockq), or anything the daemon decides: which interface serves an
// address, port permissions, multicast steering, pacing.
package socket
