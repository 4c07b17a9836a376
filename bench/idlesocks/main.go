// Command idlesocks opens N idle UDP sockets through bypassd (one client
// session), bound to ADDR with a port each, prints "ready" and holds them
// until it is signalled. scripts/bench-scale.sh (make scale) runs many of
// them to measure what idle sockets cost the daemon and a busy socket.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/bypassd/bypassd/socket"
)

func main() {
	n := flag.Int("n", 1000, "sockets to open")
	addr := flag.String("addr", "", "local IPv4 address to bind (required)")
	queue := flag.Int("queue-bytes", 4096, "capacity of each socket queue")
	flag.Parse()
	a, err := netip.ParseAddr(*addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "idlesocks: -addr %q: %v\n", *addr, err)
		os.Exit(2)
	}
	c, err := socket.Dial("")
	if err != nil {
		fmt.Fprintf(os.Stderr, "idlesocks: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	laddr := netip.AddrPortFrom(a, 0)
	conns := make([]*socket.UDPConn, 0, *n)
	for i := 0; i < *n; i++ {
		u, err := c.ListenUDPConfig("udp4", laddr, socket.ListenConfig{QueueBytes: *queue})
		if err != nil {
			fmt.Fprintf(os.Stderr, "idlesocks: socket %d of %d: %v\n", i, *n, err)
			os.Exit(1)
		}
		conns = append(conns, u)
	}
	fmt.Println("ready")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	<-ctx.Done()
	for _, u := range conns {
		_ = u.Close()
	}
}
