package netlab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

const helperEnv = "NETLAB_TEST_HELPER"

// TestMain lets the test binary act as an "abandoning" lab process for
// TestSweepRemovesDeadOwners: it creates a pair and exits without Close.
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "orphan" {
		p, err := CreatePair(Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		fmt.Printf("NS %s %s\nIF %s %s\n", p.A.NS.Name, p.B.NS.Name, p.A.Name, p.B.Name)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func execCommand(name string, args ...string) *exec.Cmd { return exec.Command(name, args...) }

var testNameSeq atomic.Uint32

// uniqueName returns a lab name unique to this test process.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s%d-%d", prefix, os.Getpid(), testNameSeq.Add(1))
}

func TestOptionsValidation(t *testing.T) {
	bad := []Options{
		{MTU: 1279},
		{MTU: 65536},
		{MTU: -1},
		{RxQueues: -1},
		{TxQueues: 4097},
		{Name: "1abc"},
		{Name: "a/b"},
		{Name: "a b"},
		{Name: strings.Repeat("a", 33)},
	}
	for _, o := range bad {
		if _, err := o.normalized(); err == nil {
			t.Errorf("normalized(%+v): no error", o)
		}
		if p, err := CreatePair(o); err == nil {
			p.Close()
			t.Errorf("CreatePair(%+v): no error", o)
		}
	}
	o, err := Options{}.normalized()
	if err != nil {
		t.Fatal(err)
	}
	if o.MTU != 1500 || o.RxQueues != 1 || o.TxQueues != 1 || o.TxChecksum || o.StaticNeigh {
		t.Errorf("defaults: %+v", o)
	}
	if err := Destroy("../etc"); err == nil {
		t.Error("Destroy accepted a path")
	}
}

func TestNamingAndAddressing(t *testing.T) {
	v4, v6 := addrs(7, 1)
	if v4.String() != "10.200.7.1/24" || v6.String() != "fd00:bd:7::1/64" {
		t.Errorf("addrs(7,1) = %s %s", v4, v6)
	}
	v4, v6 = addrs(256*51+3, 2)
	if v4.String() != "10.201.3.2/24" || v6.String() != "fd00:bd:3303::2/64" {
		t.Errorf("addrs(256*51+3,2) = %s %s", v4, v6)
	}
	if m := mac(0x123456, 1); m.String() != "02:bd:12:34:56:01" {
		t.Errorf("mac = %s", m)
	}

	id := newIdentity("")
	pid, ok := ownerPID(id.nsA)
	if !ok || pid != os.Getpid() {
		t.Errorf("ownerPID(%s) = %d, %v", id.nsA, pid, ok)
	}
	for _, n := range []string{id.ifA, id.ifB} {
		if len(n) > 15 {
			t.Errorf("interface name %q longer than 15", n)
		}
	}
	// Worst case: the largest pid and a huge counter still fit IFNAMSIZ.
	if n := "bd" + "2hmbk" + "-" + "zzzzzz" + "a"; len(n) > 15 {
		t.Errorf("worst-case name %q too long", n)
	}
	named := newIdentity("demo")
	if named.nsA != "bdlab-demo-a" || named.nsB != "bdlab-demo-b" || len(named.ifA) > 15 {
		t.Errorf("named identity %+v", named)
	}
	if again := newIdentity("demo"); again != named {
		t.Errorf("named identity not deterministic: %+v vs %+v", again, named)
	}
	for _, n := range []string{"bdlab-demo-a", "bdlab-12-x-a", "bdlab-12-3-c", "other-12-3-a", "bdlab-0-1-a", "bdlab-12-3-a-b"} {
		if _, ok := ownerPID(n); ok {
			t.Errorf("ownerPID(%q) matched", n)
		}
	}
	if p, ok := ownerPID("bdlab-12-3-b"); !ok || p != 12 {
		t.Errorf("ownerPID(bdlab-12-3-b) = %d %v", p, ok)
	}
}

func TestPairDefaults(t *testing.T) {
	p := NewPair(t, Options{})
	for _, c := range []struct {
		l, peer *Link
		end     byte
	}{{p.A, p.B, 1}, {p.B, p.A, 2}} {
		l := c.l
		if !strings.HasPrefix(l.NS.Name, Prefix) || len(l.Name) > 15 || l.Index <= 0 {
			t.Errorf("link %+v", l)
		}
		if _, err := os.Stat(l.NS.Path()); err != nil {
			t.Errorf("namespace file: %v", err)
		}
		link := linkInfo(t, l)
		a := link.Attrs()
		if a.Index != l.Index || a.MTU != 1500 || l.MTU != 1500 || a.HardwareAddr.String() != l.MAC.String() {
			t.Errorf("%s: index %d mtu %d mac %s; Link says %d %d %s", l.Name, a.Index, a.MTU, a.HardwareAddr, l.Index, l.MTU, l.MAC)
		}
		if a.OperState != netlink.OperUp || a.NumTxQueues != 1 || a.NumRxQueues != 1 {
			t.Errorf("%s: operstate %s queues tx %d rx %d", l.Name, a.OperState, a.NumTxQueues, a.NumRxQueues)
		}
		if l.MAC[0]&0x02 == 0 || l.MAC[0]&0x01 != 0 {
			t.Errorf("MAC %s not locally administered unicast", l.MAC)
		}
		if l.Addr4() != l.IPv4.Addr() || !l.Addr4().Is4() || !l.Addr6().Is6() || l.IPv4.Bits() != 24 || l.IPv6.Bits() != 64 {
			t.Errorf("addresses %s %s", l.IPv4, l.IPv6)
		}
		if !l.IPv4.Masked().Contains(c.peer.Addr4()) || !l.IPv6.Masked().Contains(c.peer.Addr6()) {
			t.Errorf("%s and %s not in one subnet", l.IPv4, c.peer.IPv4)
		}
		want := map[string]bool{l.IPv4.String(): false, l.IPv6.String(): false}
		addrs, err := l.NS.Netlink().AddrList(link, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, ad := range addrs {
			pfx, _ := netip.AddrFromSlice(ad.IP)
			ones, _ := ad.Mask.Size()
			key := netip.PrefixFrom(pfx.Unmap(), ones).String()
			if _, ok := want[key]; ok {
				want[key] = true
				if pfx.Is6() && (ad.Flags&unix.IFA_F_NODAD == 0 || ad.Flags&unix.IFA_F_TENTATIVE != 0) {
					t.Errorf("%s flags %#x: want nodad, not tentative", key, ad.Flags)
				}
			}
		}
		for k, found := range want {
			if !found {
				t.Errorf("address %s missing on %s", k, l.Name)
			}
		}
		lo, err := l.NS.Netlink().LinkByName("lo")
		if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("lo in %s not up (%v)", l.NS.Name, err)
		}
		if on, err := l.TxChecksum(); err != nil || on {
			t.Errorf("%s tx checksum offload = %v, %v; want off", l.Name, on, err)
		}
		neighs, err := l.NS.Netlink().NeighList(l.Index, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range neighs {
			if n.State&netlink.NUD_PERMANENT != 0 {
				t.Errorf("unexpected permanent neighbour %s on %s", n.IP, l.Name)
			}
		}
		if h := l.NS.Handle(); !h.IsOpen() {
			t.Errorf("handle of %s not open", l.NS.Name)
		}
	}
	if p.A.NS == p.B.NS || nsInode(t, p.A.NS) == nsInode(t, p.B.NS) {
		t.Error("A and B share a namespace")
	}
	a, b := p.Namespaces()
	if a != p.A.NS.Name || b != p.B.NS.Name {
		t.Errorf("Namespaces() = %s %s", a, b)
	}
	// Neither end exists in the root namespace.
	for _, n := range []string{p.A.Name, p.B.Name} {
		if _, err := netlink.LinkByName(n); err == nil {
			t.Errorf("%s visible in the root namespace", n)
		}
	}
}

func TestCommandRunsInNamespace(t *testing.T) {
	p := NewPair(t, Options{})
	out, err := p.B.NS.Command(context.Background(), "ip", "-o", "addr", "show", "dev", p.B.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("ip addr in %s: %v\n%s", p.B.NS.Name, err, out)
	}
	for _, want := range []string{p.B.IPv4.String(), p.B.IPv6.String()} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %s:\n%s", want, out)
		}
	}
	// A nil context must not panic.
	if out, err := p.A.NS.Command(nil, "true").CombinedOutput(); err != nil {
		t.Errorf("Command with nil ctx: %v %s", err, out)
	}
	if _, err := exec.LookPath("ping"); err == nil {
		for _, dst := range []netip.Addr{p.B.Addr4(), p.B.Addr6()} {
			if out, err := p.A.NS.Command(context.Background(), "ping", "-c1", "-W2", dst.String()).CombinedOutput(); err != nil {
				t.Errorf("ping %s: %v\n%s", dst, err, out)
			}
		}
	}
}

func TestPingAndUDPBothFamilies(t *testing.T) {
	p := NewPair(t, Options{})
	for _, c := range []struct {
		src, dst *Link
		addr     netip.Addr
	}{
		{p.A, p.B, p.B.Addr4()}, {p.A, p.B, p.B.Addr6()},
		{p.B, p.A, p.A.Addr4()}, {p.B, p.A, p.A.Addr6()},
	} {
		if err := icmpPing(c.src, c.addr); err != nil {
			t.Errorf("ping %s from %s: %v", c.addr, c.src.NS.Name, err)
		}
		msg := []byte("hello " + c.addr.String())
		if got := udpEcho(t, c.src, c.dst, c.addr, msg); !bytes.Equal(got, msg) {
			t.Errorf("echo via %s: got %q", c.addr, got)
		}
	}
	// Resolution was real: A learned B's MAC dynamically for both families.
	neighs, err := p.A.NS.Netlink().NeighList(p.A.Index, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	learned := map[netip.Addr]bool{}
	for _, n := range neighs {
		ip, _ := netip.AddrFromSlice(n.IP)
		if n.HardwareAddr.String() == p.B.MAC.String() && n.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 {
			learned[ip.Unmap()] = true
		}
	}
	if !learned[p.B.Addr4()] || !learned[p.B.Addr6()] {
		t.Errorf("A did not learn B's MAC by ARP and ND: %v", neighs)
	}
}

func TestPairOptions(t *testing.T) {
	p := NewPair(t, Options{MTU: 9000, RxQueues: 2, TxQueues: 2, StaticNeigh: true, TxChecksum: true})
	for _, l := range []*Link{p.A, p.B} {
		a := linkInfo(t, l).Attrs()
		if a.MTU != 9000 || l.MTU != 9000 || a.NumRxQueues != 2 || a.NumTxQueues != 2 {
			t.Errorf("%s: mtu %d rxq %d txq %d", l.Name, a.MTU, a.NumRxQueues, a.NumTxQueues)
		}
		if on, err := l.TxChecksum(); err != nil || !on {
			t.Errorf("%s tx checksum offload = %v, %v; want on", l.Name, on, err)
		}
	}
	for _, c := range []struct{ l, peer *Link }{{p.A, p.B}, {p.B, p.A}} {
		neighs, err := c.l.NS.Netlink().NeighList(c.l.Index, netlink.FAMILY_ALL)
		if err != nil {
			t.Fatal(err)
		}
		perm := map[netip.Addr]bool{}
		for _, n := range neighs {
			ip, _ := netip.AddrFromSlice(n.IP)
			if n.State == netlink.NUD_PERMANENT && n.HardwareAddr.String() == c.peer.MAC.String() {
				perm[ip.Unmap()] = true
			}
		}
		if !perm[c.peer.Addr4()] || !perm[c.peer.Addr6()] {
			t.Errorf("%s: permanent neighbours %v, want %s and %s", c.l.Name, perm, c.peer.Addr4(), c.peer.Addr6())
		}
	}
	big := bytes.Repeat([]byte{0xa5}, 8000) // fits the 9000 MTU unfragmented
	if got := udpEcho(t, p.A, p.B, p.B.Addr6(), big); !bytes.Equal(got, big) {
		t.Errorf("8000-byte echo came back with %d bytes", len(got))
	}
}

// TestUDPChecksumOnWire checks what an XDP program would see: with the
// default options, frames captured in B carry complete, valid UDP checksums
// and B's UDP stack counts no checksum errors. With TxChecksum the same
// capture shows partial checksums, proving the check can tell them apart.
func TestUDPChecksumOnWire(t *testing.T) {
	for _, txCsum := range []bool{false, true} {
		for _, v6 := range []bool{false, true} {
			t.Run(fmt.Sprintf("txcsum=%v/ipv6=%v", txCsum, v6), func(t *testing.T) {
				p := NewPair(t, Options{TxChecksum: txCsum})
				dst := p.B.Addr4()
				table, field := "Udp", "InCsumErrors"
				if v6 {
					dst = p.B.Addr6()
					table, field = "", "Udp6InCsumErrors"
				}
				var csumErrsBefore uint64
				var pkt int
				var srv *net.UDPConn
				err := p.B.NS.Do(func() error {
					var err error
					if csumErrsBefore, err = snmpCounter(table, field); err != nil {
						return err
					}
					if srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 0))); err != nil {
						return err
					}
					pkt, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
					if err != nil {
						return err
					}
					return unix.Bind(pkt, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: p.B.Index})
				})
				if srv != nil {
					defer srv.Close()
				}
				if pkt > 0 {
					defer unix.Close(pkt)
				}
				if err != nil {
					t.Fatalf("set up receiver in B: %v", err)
				}
				tv := unix.NsecToTimeval(ioTimeout.Nanoseconds())
				if err := unix.SetsockoptTimeval(pkt, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
					t.Fatal(err)
				}
				port := srv.LocalAddr().(*net.UDPAddr).AddrPort().Port()

				var cli *net.UDPConn
				if err := p.A.NS.Do(func() error {
					var err error
					cli, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, port)))
					return err
				}); err != nil {
					t.Fatal(err)
				}
				defer cli.Close()
				payload := []byte("netlab checksum probe, odd length.")
				if _, err := cli.Write(payload); err != nil {
					t.Fatal(err)
				}

				srv.SetReadDeadline(time.Now().Add(ioTimeout))
				buf := make([]byte, 2048)
				if n, err := srv.Read(buf); err != nil || !bytes.Equal(buf[:n], payload) {
					t.Fatalf("datagram not delivered in B: %q, %v", buf[:n], err)
				}
				for {
					n, _, err := unix.Recvfrom(pkt, buf, 0)
					if err != nil {
						t.Fatalf("frame not captured in B: %v", err)
					}
					ours, valid := frameUDPChecksumOK(buf[:n], port)
					if !ours {
						continue // ARP, ND, MLD ...
					}
					if valid == txCsum {
						t.Errorf("checksum valid=%v on the wire with TxChecksum=%v", valid, txCsum)
					}
					break
				}
				if err := p.B.NS.Do(func() error {
					after, err := snmpCounter(table, field)
					if err == nil && after != csumErrsBefore {
						err = fmt.Errorf("%s went from %d to %d", field, csumErrsBefore, after)
					}
					return err
				}); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}

// TestCloseLeavesNothing uses the pair (sockets, Do, ethtool, raw ping),
// closes it and checks that no file, mount, root link or reference from
// this process (fd, thread) to the namespaces remains.
func TestCloseLeavesNothing(t *testing.T) {
	RequirePriv(t)
	p, err := CreatePair(Options{StaticNeigh: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if got := udpEcho(t, p.A, p.B, p.B.Addr4(), []byte("x")); string(got) != "x" {
		t.Fatalf("echo: %q", got)
	}
	if err := icmpPing(p.A, p.B.Addr6()); err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Link{p.A, p.B} {
		if _, err := l.TxChecksum(); err != nil {
			t.Fatal(err)
		}
	}
	nsNames := []string{p.A.NS.Name, p.B.NS.Name}
	ifNames := []string{p.A.Name, p.B.Name}
	inodes := []uint64{nsInode(t, p.A.NS), nsInode(t, p.B.NS)}
	// Sanity check of the checker: files, list entries, mounts, the two
	// namespace fds and at least the netlink sockets.
	if left := leftovers(t, nsNames, ifNames, inodes); len(left) < 2+2+2+2+2 {
		t.Fatalf("leftovers() before Close found only %d items: %v", len(left), left)
	} else {
		t.Logf("before Close: %v", left)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if left := leftovers(t, nsNames, ifNames, inodes); len(left) != 0 {
		t.Errorf("left behind after Close: %v", left)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := p.A.NS.Do(func() error { return nil }); err == nil {
		t.Error("Do after Close succeeded")
	}
	if h := p.A.NS.Handle(); h.IsOpen() {
		t.Error("handle still open after Close")
	}
}

func TestDoRestoresThread(t *testing.T) {
	p := NewPair(t, Options{})
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer before.Close()
	check := func(when string) {
		t.Helper()
		now, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer now.Close()
		if !now.Equal(before) {
			t.Fatalf("%s: thread left in another namespace", when)
		}
	}

	var inside netns.NsHandle
	sentinel := errors.New("sentinel")
	err = p.A.NS.Do(func() error {
		var err error
		inside, err = netns.Get()
		if err != nil {
			return err
		}
		return sentinel
	})
	if !errors.Is(err, sentinel) {
		t.Fatalf("Do error = %v, want sentinel", err)
	}
	defer inside.Close()
	if !inside.Equal(p.A.NS.Handle()) {
		t.Error("fn did not run in namespace A")
	}
	check("after Do")

	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Errorf("recovered %v, want boom", r)
			}
		}()
		_ = p.B.NS.Do(func() error { panic("boom") })
	}()
	check("after panic in Do")

	if err := p.A.NS.Do(nil); err == nil {
		t.Error("Do(nil) succeeded")
	}
	check("after Do(nil)")
}

// TestDoGoexit checks that t.Fatal inside Do (runtime.Goexit) still runs
// the restore: the subtest's goroutine must not die in the namespace with
// its thread handed back to the scheduler.
func TestDoGoexit(t *testing.T) {
	p := NewPair(t, Options{})
	done := make(chan bool, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		before, _ := netns.Get()
		defer before.Close()
		defer func() {
			now, _ := netns.Get()
			defer now.Close()
			done <- now.Equal(before)
		}()
		_ = p.A.NS.Do(func() error { runtime.Goexit(); return nil })
	}()
	if !<-done {
		t.Error("thread not restored after Goexit inside Do")
	}
}

func TestNamedPairAndDestroy(t *testing.T) {
	RequirePriv(t)
	name := uniqueName("t")
	t.Cleanup(func() { Destroy(name) })
	p, err := CreatePair(Options{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if p.A.NS.Name != Prefix+name+"-a" || p.B.NS.Name != Prefix+name+"-b" {
		t.Errorf("names %s %s", p.A.NS.Name, p.B.NS.Name)
	}
	if _, err := CreatePair(Options{Name: name}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second CreatePair with the same name: %v", err)
	}
	// The failed attempt must not have damaged the first pair.
	if err := icmpPing(p.A, p.B.Addr4()); err != nil {
		t.Errorf("first pair broken by the failed duplicate: %v", err)
	}
	if err := Sweep(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.A.NS.Path()); err != nil {
		t.Errorf("Sweep removed a named pair: %v", err)
	}
	if err := p.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.A.NS.Path()); err != nil {
		t.Errorf("Release removed the namespace: %v", err)
	}
	if err := Destroy(name); err != nil {
		t.Fatal(err)
	}
	if err := Destroy(name); err != nil {
		t.Errorf("second Destroy: %v", err)
	}
	if left := leftovers(t, []string{p.A.NS.Name, p.B.NS.Name}, []string{p.A.Name, p.B.Name}, nil); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
	if err := p.Close(); err != nil {
		t.Errorf("Close after Destroy: %v", err)
	}
}

// TestStaleNameFromReusedPid simulates a leftover of a dead process that
// had our pid: the next unnamed pair must skip the taken name, not fail and
// not delete the leftover.
func TestStaleNameFromReusedPid(t *testing.T) {
	RequirePriv(t)
	next := pairSeq.Load()
	stale := fmt.Sprintf("%s%d-%d-a", Prefix, os.Getpid(), next)
	if err := createNamedNS(stale); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deleteNamedNS(stale) })
	p := NewPair(t, Options{})
	if p.A.NS.Name == stale {
		t.Fatalf("reused the stale name %s", stale)
	}
	if _, err := os.Stat(filepath.Join(netnsRunDir, stale)); err != nil {
		t.Errorf("stale namespace was deleted: %v", err)
	}
	// The half-created pair of the failed attempt left nothing behind.
	staleB := fmt.Sprintf("%s%d-%d-b", Prefix, os.Getpid(), next)
	if left := leftovers(t, []string{staleB}, nil, nil); len(left) != 0 {
		t.Errorf("left behind: %v", left)
	}
}

// helperOutput parses "NS a b" and "IF a b" lines printed by helpers.
func helperOutput(out string) (nsNames, ifNames []string) {
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 3 && f[0] == "NS" {
			nsNames = append(nsNames, f[1], f[2])
		}
		if len(f) == 3 && f[0] == "IF" {
			ifNames = append(ifNames, f[1], f[2])
		}
	}
	return nsNames, ifNames
}

// TestHelperPanicSubtest is run only as a child of TestPanicInSubtestCleansUp.
func TestHelperPanicSubtest(t *testing.T) {
	if os.Getenv(helperEnv) != "panic" {
		t.Skip("helper for TestPanicInSubtestCleansUp")
	}
	t.Run("sub", func(t *testing.T) {
		p := NewPair(t, Options{})
		fmt.Printf("NS %s %s\nIF %s %s\n", p.A.NS.Name, p.B.NS.Name, p.A.Name, p.B.Name)
		panic("deliberate panic in subtest")
	})
}

func TestPanicInSubtestCleansUp(t *testing.T) {
	RequirePriv(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPanicSubtest$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=panic", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	nsNames, ifNames := helperOutput(string(out))
	t.Cleanup(func() {
		for _, n := range nsNames {
			deleteNamedNS(n)
		}
	})
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || !strings.Contains(string(out), "deliberate panic in subtest") {
		t.Fatalf("helper did not panic as planned: %v\n%s", err, out)
	}
	if len(nsNames) != 2 {
		t.Fatalf("helper printed no namespace names:\n%s", out)
	}
	if left := leftovers(t, nsNames, ifNames, nil); len(left) != 0 {
		t.Errorf("left behind after a panicking subtest: %v\n%s", left, out)
	}
}

func TestSweepRemovesDeadOwners(t *testing.T) {
	live := NewPair(t, Options{})

	cmd := exec.Command(os.Args[0])
	// GORACE: a -race child otherwise sleeps a second before exiting.
	cmd.Env = append(os.Environ(), helperEnv+"=orphan", "GORACE=atexit_sleep_ms=0")
	out, err := cmd.CombinedOutput()
	nsNames, ifNames := helperOutput(string(out))
	t.Cleanup(func() {
		for _, n := range nsNames {
			deleteNamedNS(n)
		}
	})
	if err != nil || len(nsNames) != 2 {
		t.Fatalf("orphan helper: %v\n%s", err, out)
	}
	for _, n := range nsNames {
		if _, err := os.Stat(filepath.Join(netnsRunDir, n)); err != nil {
			t.Fatalf("helper's namespace %s missing before Sweep: %v", n, err)
		}
		if pid, ok := ownerPID(n); !ok || pid != cmd.Process.Pid {
			t.Fatalf("%s does not encode the helper pid %d", n, cmd.Process.Pid)
		}
	}
	if err := Sweep(); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	if left := leftovers(t, nsNames, ifNames, nil); len(left) != 0 {
		t.Errorf("Sweep left: %v", left)
	}
	// Our own (live) pair is untouched and still works.
	if err := icmpPing(live.A, live.B.Addr4()); err != nil {
		t.Errorf("Sweep damaged a live pair: %v", err)
	}
}

func TestParallelPairs(t *testing.T) {
	for i := 0; i < 4; i++ {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			p := NewPair(t, Options{})
			for _, dst := range []netip.Addr{p.B.Addr4(), p.B.Addr6()} {
				msg := []byte(fmt.Sprintf("pair %d to %s", i, dst))
				if got := udpEcho(t, p.A, p.B, dst, msg); !bytes.Equal(got, msg) {
					t.Errorf("echo: %q", got)
				}
			}
		})
	}
}

func TestRequirePriv(t *testing.T) {
	real := privileged
	t.Cleanup(func() { privileged = real })
	for _, c := range []struct {
		priv       bool
		env        string
		skip, fail bool
	}{
		{true, "", false, false},
		{true, "1", false, false},
		{false, "", true, false},
		{false, "0", true, false},
		{false, "1", false, true},
	} {
		privileged = func() (bool, string) { return c.priv, "netlab: pretend unprivileged" }
		t.Setenv(RequirePrivEnv, c.env)
		ft := &fakeTB{TB: t}
		RequirePriv(ft)
		if ft.skipped != c.skip || ft.failed != c.fail {
			t.Errorf("priv=%v env=%q: skipped=%v failed=%v", c.priv, c.env, ft.skipped, ft.failed)
		}
	}
}

// fakeTB records Skip/Fatal instead of stopping the test.
type fakeTB struct {
	testing.TB
	skipped, failed bool
}

func (f *fakeTB) Helper()               {}
func (f *fakeTB) Skip(...any)           { f.skipped = true }
func (f *fakeTB) Fatalf(string, ...any) { f.failed = true }
