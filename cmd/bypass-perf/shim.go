package main

import (
	"errors"
	"net/netip"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/socket"
)

// shimTransport is bypassd's sockets: one session with the daemon, whose
// sockets carry their datagrams through shared memory.
type shimTransport struct {
	client *socket.Client
}

// openShim connects to the daemon at path ("" means $BYPASSD_SOCKET or the
// default path).
func openShim(path string) (*shimTransport, error) {
	c, err := socket.Dial(path)
	if err != nil {
		return nil, err
	}
	return &shimTransport{client: c}, nil
}

func (t *shimTransport) Name() string { return "bypassd shim" }

// Close ends the session (and with it any socket still open).
func (t *shimTransport) Close() error { return t.client.Close() }

func (t *shimTransport) ListenUDP(network string, laddr netip.AddrPort) (Conn, error) {
	c, err := t.client.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	return &shimConn{UDPConn: c}, nil
}

// shimConn adapts *socket.UDPConn's batch read to the seam's Datagram; the
// rest (including WriteBatch and SetMaxPacingRate) it has already.
type shimConn struct {
	*socket.UDPConn
	scratch []socket.Message // reused by ReadBatch (one reader at a time)
}

var _ BatchConn = (*shimConn)(nil)
var _ Pacer = (*shimConn)(nil)
var _ Poller = (*shimConn)(nil)

// TryRead reads in non-blocking mode (only the polling under-load reads
// such a socket, so the mode stays set).
func (c *shimConn) TryRead(b []byte) (int, netip.AddrPort, bool, error) {
	c.SetNonblock(true)
	n, from, err := c.ReadFromUDPAddrPort(b)
	if errors.Is(err, unix.EAGAIN) {
		return 0, netip.AddrPort{}, false, nil
	}
	return n, from, err == nil, err
}

func (c *shimConn) ReadBatch(msgs []Datagram) (int, error) {
	if cap(c.scratch) < len(msgs) {
		c.scratch = make([]socket.Message, len(msgs))
	}
	sm := c.scratch[:len(msgs)]
	for i := range msgs {
		sm[i] = socket.Message{Buf: msgs[i].Buf}
	}
	n, err := c.UDPConn.ReadBatch(sm)
	for i := range n {
		msgs[i].N, msgs[i].Addr = sm[i].N, sm[i].Addr
		switch ts := &sm[i].TS; {
		case ts.HardwareSysOK:
			msgs[i].RX, msgs[i].RXHardware = ts.HardwareSys, true
		case ts.SoftwareOK:
			msgs[i].RX, msgs[i].RXHardware = ts.Software, false
		}
	}
	if err != nil {
		return n, err
	}
	return n, nil
}
