package socket

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

// ErrDaemonGone is matched (errors.Is) by every error caused by losing the
// daemon: its control connection closed, or it announced SHUTDOWN. Such
// errors also match net.ErrClosed. The only remedy is to restart bypassd and
// open new sockets (a new Client; Default dials again by itself).
var ErrDaemonGone = errors.New("bypassd went away")

// goneError is the reason a Client broke. It matches ErrDaemonGone and
// net.ErrClosed so callers that only know Go's net conventions stop their
// loops as they would on a closed socket.
type goneError struct{ detail string }

func (e *goneError) Error() string {
	return fmt.Sprintf("bypassd went away (%s); restart it and reopen the socket", e.detail)
}

func (e *goneError) Is(target error) bool {
	return target == ErrDaemonGone || target == net.ErrClosed
}

// socketDeadError is why a socket the daemon declared dead (SOCKET_ERROR)
// fails: its errno (ENETDOWN when its interface vanished) and what to do.
// It also matches net.ErrClosed, as the socket is unusable for good.
type socketDeadError struct{ errno unix.Errno }

func (e *socketDeadError) Error() string {
	if e.errno == unix.ENETDOWN {
		return "bypassd dropped the socket: its interface went away (" + e.errno.Error() + "); open a new socket once the interface is back"
	}
	return "bypassd dropped the socket (" + e.errno.Error() + "); open a new one"
}

func (e *socketDeadError) Unwrap() error { return e.errno }

func (e *socketDeadError) Is(target error) bool { return target == net.ErrClosed }

// DaemonError is a request the daemon refused: Errno is the status of its
// reply. errors.Is(err, unix.EADDRINUSE) and the like work through Unwrap.
type DaemonError struct {
	Request string     // "OPEN", "BIND", ...
	Errno   unix.Errno // the daemon's answer
	Hint    string     // what to do about it, if known
}

func (e *DaemonError) Error() string {
	s := fmt.Sprintf("bypassd refused %s: %v", e.Request, e.Errno)
	if e.Hint != "" {
		s += " (" + e.Hint + ")"
	}
	return s
}

func (e *DaemonError) Unwrap() error { return e.Errno }

// daemonError builds the error for a refused request, adding advice for the
// errnos a user can act on. The daemon sends only the number, so the advice
// lives here, next to the request that produced it.
func (c *Client) daemonError(code ctlproto.Code, errno unix.Errno) error {
	e := &DaemonError{Request: code.Request().String(), Errno: errno}
	switch errno {
	case unix.ENOSYS:
		e.Hint = "this bypassd does not implement the request; upgrade bypassd to match this program"
	case unix.EPROTO, unix.EPROTONOSUPPORT:
		e.Hint = "the daemon and this program disagree about the control protocol; run matching versions"
	case unix.EBADF:
		e.Hint = "the daemon no longer knows this socket; open a new one"
	}
	switch code.Request() {
	case ctlproto.CodeOpen, ctlproto.CodeAccept:
		switch errno {
		case unix.EMFILE:
			e.Hint = fmt.Sprintf("this client already has the %d sockets bypassd allows; close some or raise the daemon's per-client limit (bypassd --max-sockets)", c.hello.MaxSockets)
		case unix.ENOMEM:
			e.Hint = "this client's shared-memory budget at bypassd is used up; close sockets, ask for smaller queues (ListenConfig.QueueBytes) or raise the daemon's limit (bypassd --max-queue-memory)"
		case unix.EAFNOSUPPORT:
			e.Hint = "bypassd accelerates no interface of this address family"
		case unix.EINVAL:
			e.Hint = fmt.Sprintf("queue sizes must be 0 or a power of two from %d to %d bytes", ctlproto.MinQueueBytes, ctlproto.MaxQueueBytes)
		}
	case ctlproto.CodeBind:
		switch errno {
		case unix.EADDRINUSE:
			e.Hint = "another socket holds this address and port; pick another port, or set ListenConfig.ReuseAddr on every socket that shares it"
		case unix.EACCES:
			e.Hint = "ports below 1024 need root or CAP_NET_BIND_SERVICE; use a port of 1024 or above"
		case unix.EADDRNOTAVAIL:
			e.Hint = "no interface bypassd accelerates has this address; bind an address of an accelerated interface (the wildcard address works only when bypassd has a single interface of the family)"
		case unix.EINVAL:
			e.Hint = "the socket is already bound"
		}
	case ctlproto.CodeConnect:
		switch errno {
		case unix.ENETUNREACH, unix.EHOSTUNREACH:
			e.Hint = "the accelerated interface has no route to this peer"
		case unix.EADDRNOTAVAIL:
			e.Hint = "bypassd could not bind the socket implicitly; bind it to an address of an accelerated interface first"
		}
	case ctlproto.CodeSetSockOpt, ctlproto.CodeGetSockOpt:
		switch errno {
		case unix.ENOPROTOOPT:
			e.Hint = "bypassd does not support this option"
		case unix.EOPNOTSUPP:
			e.Hint = "bypassd does not support this option yet"
		}
	case ctlproto.CodeJoin, ctlproto.CodeLeave:
		switch errno {
		case unix.EADDRNOTAVAIL:
			e.Hint = "not a member of this group, or no accelerated interface can join it; bind the socket first"
		case unix.EINVAL:
			e.Hint = "the group must be a multicast address of the socket's family, and the source (if any) a unicast address"
		}
	}
	return e
}

// opError wraps err the way Go's net package does, so that callers can
// print "read udp4 10.0.0.1:5000: ..." and use errors.Is on the cause.
func opError(op, network string, source, addr net.Addr, err error) error {
	if err == nil {
		return nil
	}
	return &net.OpError{Op: op, Net: network, Source: source, Addr: addr, Err: err}
}

// udpAddr converts ap for an OpError or LocalAddr; the invalid AddrPort gives
// a nil interface (not a typed nil) so OpError leaves it out.
func udpAddr(ap netip.AddrPort) net.Addr {
	if !ap.Addr().IsValid() {
		return nil
	}
	return net.UDPAddrFromAddrPort(ap)
}
