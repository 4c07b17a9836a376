package socket_test

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/bypassd/bypassd/socket"
)

// A UDP echo through bypassd: open a socket connected to a peer, send a
// datagram and wait up to a second for the answer. Without a running
// daemon, DialUDP's error says how to start one.
func Example() {
	conn, err := socket.DialUDP("udp4", netip.AddrPort{}, netip.MustParseAddrPort("192.0.2.10:7"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("ping")); err != nil {
		fmt.Println(err)
		return
	}
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 1500)
	n, err := conn.Read(buf)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%s from %v\n", buf[:n], conn.RemoteAddr())
}

// Receiving a multicast group on two sockets of one process: both bind the
// group's port with ReuseAddr, both join, and each gets every datagram.
func ExampleClient_ListenUDPConfig() {
	c, err := socket.Dial("") // $BYPASSD_SOCKET or /run/bypassd/bypassd.sock
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	group := netip.MustParseAddr("239.1.2.3")
	for i := 0; i < 2; i++ {
		u, err := c.ListenUDPConfig("udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), 5000), socket.ListenConfig{ReuseAddr: true})
		if err != nil {
			fmt.Println(err)
			return
		}
		if err := u.JoinGroup(group); err != nil {
			fmt.Println(err)
			return
		}
		go func() {
			buf := make([]byte, 65536)
			for {
				n, from, err := u.ReadFromUDPAddrPort(buf)
				if err != nil {
					return // closed with the Client
				}
				fmt.Printf("socket %d: %d bytes from %v\n", i, n, from)
			}
		}()
	}
}
