package bpf

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// holdEnv makes the test binary a helper that attaches to the ifindex in
// the variable, reports the link id and waits to be killed (see
// TestCrashDetaches).
const holdEnv = "BYPASSD_BPF_TEST_HOLD_IFINDEX"

func TestMain(m *testing.M) {
	if v := os.Getenv(holdEnv); v != "" {
		os.Exit(holdAttached(v))
	}
	os.Exit(m.Run())
}

func holdAttached(v string) int {
	ifindex, err := strconv.Atoi(v)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bad %s=%q\n", holdEnv, v)
		return 2
	}
	p, err := Attach(ifindex, Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	id, err := p.LinkID()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("attached %d\n", id)
	// Block until killed; EOF on stdin (the test died) also ends the helper.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

func progID(t *testing.T, p *Program) uint32 {
	t.Helper()
	info, err := p.prog.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("kernel did not report a program id")
	}
	return uint32(id)
}

func TestAttachAndClose(t *testing.T) {
	tests := []struct {
		opts     Options
		wantMode AttachMode
		wantXDP  uint32
		ipFlag   string
	}{
		{Options{}, ModeNative, xdpAttachedDrv, "xdp "},
		{Options{Mode: ModeNative}, ModeNative, xdpAttachedDrv, "xdp "},
		{Options{Mode: ModeGeneric}, ModeGeneric, xdpAttachedSkb, "xdpgeneric"},
	}
	for _, tc := range tests {
		t.Run(tc.opts.Mode.String(), func(t *testing.T) {
			t.Parallel()
			lab := netlab.NewPair(t, netlab.Options{})
			p, err := tryAttachIn(lab.A, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() {
				if !closed {
					p.Close()
				}
			})
			if p.Mode() != tc.wantMode || p.Ifindex() != lab.A.Index || p.FallbackReason() != nil {
				t.Fatalf("Mode() = %s, Ifindex() = %d, FallbackReason() = %v; want %s, %d, nil",
					p.Mode(), p.Ifindex(), p.FallbackReason(), tc.wantMode, lab.A.Index)
			}
			if id, mode := xdpState(t, lab.A); id != progID(t, p) || mode != tc.wantXDP {
				t.Fatalf("netlink shows prog %d mode %d, want prog %d mode %d", id, mode, progID(t, p), tc.wantXDP)
			}
			out, err := lab.A.NS.Command(context.Background(), "ip", "link", "show", "dev", lab.A.Name).CombinedOutput()
			if err != nil || !strings.Contains(string(out), tc.ipFlag) {
				t.Fatalf("`ip link show` while attached (err %v) lacks %q:\n%s", err, tc.ipFlag, out)
			}
			if ok, err := p.Attached(); err != nil || !ok {
				t.Fatalf("Attached() = %v, %v; want true", ok, err)
			}
			linkID, err := p.LinkID()
			if err != nil || linkID == 0 {
				t.Fatalf("LinkID() = %d, %v", linkID, err)
			}
			if out, err := exec.Command("bpftool", "link", "show", "id", fmt.Sprint(linkID)).CombinedOutput(); err != nil {
				t.Fatalf("bpftool link show id %d while attached: %v\n%s", linkID, err, out)
			}

			if err := p.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			closed = true
			if err := p.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			if id, _ := xdpState(t, lab.A); id != 0 {
				t.Fatalf("prog %d still attached after Close", id)
			}
			out, err = lab.A.NS.Command(context.Background(), "ip", "link", "show", "dev", lab.A.Name).CombinedOutput()
			if err != nil || strings.Contains(string(out), "xdp") {
				t.Fatalf("`ip link show` after Close (err %v) still mentions xdp:\n%s", err, out)
			}
			if out, err := exec.Command("bpftool", "link", "show", "id", fmt.Sprint(linkID)).CombinedOutput(); err == nil {
				t.Fatalf("bpf link %d still exists after Close:\n%s", linkID, out)
			}
			if _, err := p.Counters(); !errors.Is(err, errClosed) {
				t.Fatalf("Counters after Close: %v, want errClosed", err)
			}
			if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort("10.0.0.1:1")}, 0); !errors.Is(err, errClosed) {
				t.Fatalf("AddFlow after Close: %v, want errClosed", err)
			}
		})
	}
}

// TestAttachMaxFlowsTooLarge fails at map creation, before any interface
// is touched (the ifindex does not exist either).
func TestAttachMaxFlowsTooLarge(t *testing.T) {
	netlab.RequirePriv(t)
	p, err := Attach(1<<30, Options{MaxFlows: 1 << 31})
	if err == nil {
		p.Close()
		t.Fatal("Attach with 2^31 flows succeeded")
	}
	if !strings.Contains(err.Error(), "lower Options.MaxFlows") {
		t.Fatalf("Attach with 2^31 flows: %v; want advice to lower MaxFlows", err)
	}
}

func TestAttachConflicts(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	attachIn(t, lab.A, Options{Mode: ModeNative})

	for _, mode := range []AttachMode{ModeNative, ModeAuto} {
		p, err := tryAttachIn(lab.A, Options{Mode: mode})
		if err == nil {
			p.Close()
			t.Fatalf("second %s attach succeeded", mode)
		}
		msg := err.Error()
		if !errors.Is(err, unix.EBUSY) || !strings.Contains(msg, "already attached") ||
			!strings.Contains(msg, "ip link show dev "+lab.A.Name) || !strings.Contains(msg, "bpftool net") {
			t.Errorf("second %s attach: %v; want EBUSY saying how to find the other program", mode, err)
		}
	}
	p, err := tryAttachIn(lab.A, Options{Mode: ModeGeneric})
	if err == nil {
		p.Close()
		t.Fatal("generic attach next to a native program succeeded")
	}
	if !errors.Is(err, unix.EEXIST) || !strings.Contains(err.Error(), "cannot be mixed") {
		t.Errorf("generic attach next to native: %v; want EEXIST explaining the mode clash", err)
	}
}

func TestAttachNativeRefusedByVeth(t *testing.T) {
	tests := []struct {
		name  string
		lab   netlab.Options
		errno unix.Errno
		want  string
	}{
		{"peer MTU 9000", netlab.Options{MTU: 9000}, unix.ERANGE, "peer MTU too large for native XDP"},
		{"peer has more TX queues", netlab.Options{RxQueues: 1, TxQueues: 2}, unix.ENOSPC, "more TX queues"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			lab := netlab.NewPair(t, tc.lab)
			p, err := tryAttachIn(lab.A, Options{Mode: ModeNative})
			if err == nil {
				p.Close()
				t.Fatal("native attach succeeded")
			}
			if !errors.Is(err, tc.errno) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("native attach: %v; want %v mentioning %q", err, tc.errno, tc.want)
			}
			if id, _ := xdpState(t, lab.A); id != 0 {
				t.Fatalf("failed attach left prog %d behind", id)
			}
			// Auto mode falls back to generic and says so.
			p = attachIn(t, lab.A, Options{})
			if p.Mode() != ModeGeneric {
				t.Fatalf("auto attach chose %s, want generic", p.Mode())
			}
			if r := p.FallbackReason(); !errors.Is(r, tc.errno) || !strings.Contains(r.Error(), tc.want) {
				t.Fatalf("FallbackReason() = %v, want the native refusal", r)
			}
			if _, mode := xdpState(t, lab.A); mode != xdpAttachedSkb {
				t.Fatalf("netlink mode %d, want generic (%d)", mode, xdpAttachedSkb)
			}
		})
	}
}

// TestDetachedByOperator simulates `bpftool link detach`, the only way an
// operator can remove a link-attached program.
func TestDetachedByOperator(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{})
	id, err := p.LinkID()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("bpftool", "link", "detach", "id", fmt.Sprint(id)).CombinedOutput(); err != nil {
		t.Fatalf("bpftool link detach id %d: %v\n%s", id, err, out)
	}
	if ok, err := p.Attached(); err != nil || ok {
		t.Fatalf("Attached() after detach = %v, %v; want false", ok, err)
	}
	if prog, _ := xdpState(t, lab.A); prog != 0 {
		t.Fatalf("prog %d still on the interface", prog)
	}
	// The owner can attach again on the now free interface.
	attachIn(t, lab.A, Options{})
}

// TestCrashDetaches kills a process holding the program with SIGKILL: the
// bpf_link dies with it and the interface is clean.
func TestCrashDetaches(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := lab.A.NS.Command(ctx, self)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", holdEnv, lab.A.Index))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		stdin.Close()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "attached ") {
		t.Fatalf("helper did not attach: %q, %v; stderr:\n%s", line, err, stderr.String())
	}
	if prog, mode := xdpState(t, lab.A); prog == 0 || mode != xdpAttachedDrv {
		t.Fatalf("helper's program not visible on %s (prog %d mode %d)", lab.A.Name, prog, mode)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waited = true
	// Link release happens while the process exits; the loop is only a
	// safety net against a slow teardown, not a timing assertion.
	deadline := time.Now().Add(ioTimeout)
	for {
		prog, _ := xdpState(t, lab.A)
		if prog == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("prog %d still attached after its owner was killed", prog)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestFlowMapAPI(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeGeneric, MaxFlows: 4})

	a := lab.A.Addr4()
	udp := func(dst string, src string) Flow {
		f := Flow{Proto: unix.IPPROTO_UDP, Dst: netip.MustParseAddrPort(dst)}
		if src != "" {
			f.Src = netip.MustParseAddrPort(src)
		}
		return f
	}
	three := udp(netip.AddrPortFrom(a, 5000).String(), "")
	five := udp(netip.AddrPortFrom(a, 5000).String(), netip.AddrPortFrom(lab.B.Addr4(), 6000).String())
	six := udp(netip.AddrPortFrom(lab.A.Addr6(), 5000).String(), "")
	mapped := Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(netip.AddrFrom16(a.As16()), 5001)}

	for f, slot := range map[Flow]uint32{three: 1, five: 2, six: 3, mapped: 4} {
		if err := p.AddFlow(f, slot); err != nil {
			t.Fatalf("AddFlow(%s): %v", f, err)
		}
	}
	if err := p.AddFlow(three, 7); err != nil { // replace
		t.Fatalf("replace %s: %v", three, err)
	}
	got, err := p.Flows()
	if err != nil {
		t.Fatal(err)
	}
	want := map[Flow]uint32{
		three: 7, five: 2, six: 3,
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(a, 5001)}: 4, // normalised to IPv4
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Flows() = %v\nwant %v", got, want)
	}

	full := udp(netip.AddrPortFrom(a, 5002).String(), "")
	if err := p.AddFlow(full, 0); !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "--max-flows") {
		t.Fatalf("AddFlow into a full map: %v; want ENOSPC mentioning --max-flows", err)
	}
	if err := p.AddFlow(full, MaxSockets); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("AddFlow slot %d: %v", MaxSockets, err)
	}

	if err := p.DeleteFlow(five); err != nil {
		t.Fatalf("DeleteFlow(%s): %v", five, err)
	}
	err = p.DeleteFlow(five)
	if !errors.Is(err, os.ErrNotExist) || !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("DeleteFlow of a missing flow: %v; want os.ErrNotExist and ebpf.ErrKeyNotExist", err)
	}
	if err := p.AddFlow(full, 0); err != nil {
		t.Fatalf("AddFlow after making room: %v", err)
	}

	// Sockets: anything but an AF_XDP socket is refused.
	c := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(a, 0))
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = p.SetSocket(0, int(fd)) }); err != nil {
		t.Fatal(err)
	}
	if serr == nil || !strings.Contains(serr.Error(), "not an AF_XDP socket") {
		t.Fatalf("SetSocket(UDP socket): %v", serr)
	}
	if err := p.SetSocket(MaxSockets, 0); err == nil {
		t.Fatal("SetSocket accepted an out-of-range slot")
	}
	if err := p.SetSocket(0, -1); err == nil {
		t.Fatal("SetSocket accepted fd -1")
	}
	if err := p.ClearSocket(9); err != nil {
		t.Fatalf("ClearSocket of an empty slot: %v", err)
	}
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(9, x.fd); err != nil {
		t.Fatalf("SetSocket(AF_XDP): %v", err)
	}
	if err := p.ClearSocket(9); err != nil {
		t.Fatalf("ClearSocket: %v", err)
	}
}

type family struct {
	name string
	v6   bool
}

var families = []family{{"ipv4", false}, {"ipv6", true}}

func (f family) addrs(l *netlab.Link) netip.Addr {
	if f.v6 {
		return l.Addr6()
	}
	return l.Addr4()
}

// TestKernelFallback checks what happens without an AF_XDP socket: matched
// flows, unmatched ports, ping and fragments all reach the kernel, and the
// counters say why.
func TestKernelFallback(t *testing.T) {
	for _, fam := range families {
		t.Run(fam.name, func(t *testing.T) {
			t.Parallel()
			lab := netlab.NewPair(t, netlab.Options{})
			p := attachIn(t, lab.A, Options{})
			if p.Mode() != ModeNative {
				t.Fatalf("attached in %s mode, want native on a default lab veth", p.Mode())
			}
			addrA, addrB := fam.addrs(lab.A), fam.addrs(lab.B)

			offloaded := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(addrA, 0))
			offloadedDst := netip.AddrPortFrom(addrA, localPort(offloaded))
			other := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(addrA, 0))
			otherDst := netip.AddrPortFrom(addrA, localPort(other))
			if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: offloadedDst}, 5); err != nil {
				t.Fatal(err)
			}
			sender := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(addrB, 0))

			// A flow with no socket at its slot: kernel delivery, NoSocket.
			before := counters(t, p)
			send(t, sender, offloadedDst, payloads("nosock", 5, 64)...)
			recvUDP(t, offloaded, 5)
			d := counters(t, p).sub(before)
			if d.NoSocket != 5 || d.Redirected != 0 || d.Fragments != 0 || d.Malformed != 0 {
				t.Fatalf("no-socket flow: counter delta %+v, want NoSocket 5 only", d)
			}

			// A port nobody offloaded: kernel delivery, Passed.
			before = counters(t, p)
			send(t, sender, otherDst, payloads("other", 3, 64)...)
			recvUDP(t, other, 3)
			d = counters(t, p).sub(before)
			if d.Passed < 3 || d.NoSocket != 0 || d.Redirected != 0 {
				t.Fatalf("unregistered port: counter delta %+v, want Passed >= 3 and nothing else", d)
			}

			ping(t, lab.B.NS, addrA)

			// A fragmented datagram to the offloaded port: every fragment is
			// matched (first by the flow, the rest by the fragment map) and
			// passed, and the kernel reassembles it.
			const size = 4000
			n := uint64(fragmentCount(lab.A.MTU, size, fam.v6))
			if n < 3 {
				t.Fatalf("%d-byte datagram makes only %d fragments at MTU %d", size, n, lab.A.MTU)
			}
			before = counters(t, p)
			big := payloads("frag", 1, size)[0]
			send(t, sender, offloadedDst, big)
			if got := recvUDP(t, offloaded, 1)[0]; !bytes.Equal(got, big) {
				t.Fatalf("reassembled datagram differs (len %d, want %d)", len(got), size)
			}
			d = counters(t, p).sub(before)
			if d.NoSocket != n || d.Fragments != 0 || d.Redirected != 0 || d.Malformed != 0 {
				t.Fatalf("fragmented no-socket datagram: counter delta %+v, want NoSocket %d only", d, n)
			}
			assertNoFragState(t, p)

			// Fragments to a port nobody offloaded are simply passed.
			before = counters(t, p)
			send(t, sender, otherDst, big)
			recvUDP(t, other, 1)
			d = counters(t, p).sub(before)
			if d.Passed < n || d.NoSocket != 0 || d.Redirected != 0 {
				t.Fatalf("fragmented unregistered datagram: counter delta %+v, want Passed >= %d", d, n)
			}
			assertNoFragState(t, p)
		})
	}
}

// assertNoFragState checks that the last fragment cleaned up its entry.
func assertNoFragState(t *testing.T, p *Program) {
	t.Helper()
	var next [40]byte // struct frag_key
	if err := p.objs.Frags.NextKey(nil, &next); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Fatalf("frags map not empty after complete datagrams (NextKey: %v, key %x)", err, next)
	}
}

// TestSteering uses a real (minimal) AF_XDP socket to show that matched
// traffic leaves the kernel path, that a 5-tuple beats a 3-tuple, and that
// fragments follow their first fragment.
func TestSteering(t *testing.T) {
	for _, fam := range families {
		for _, mode := range []AttachMode{ModeNative, ModeGeneric} {
			t.Run(fam.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				testSteering(t, fam, mode)
			})
		}
	}
}

func testSteering(t *testing.T, fam family, mode AttachMode) {
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: mode})
	addrA, addrB := fam.addrs(lab.A), fam.addrs(lab.B)

	kernel := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(addrA, 0))
	dst := netip.AddrPortFrom(addrA, localPort(kernel))
	pinned := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(addrB, 0)) // the 5-tuple's source
	anySrc := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(addrB, 0))

	// The socket is bound to queue 0, the only one: its slot is 0.
	const xskSlot, emptySlot = 0, 2
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(xskSlot, x.fd); err != nil {
		t.Fatal(err)
	}
	three := Flow{Proto: unix.IPPROTO_UDP, Dst: dst}
	five := Flow{Proto: unix.IPPROTO_UDP, Dst: dst, Src: netip.AddrPortFrom(addrB, localPort(pinned))}
	if err := p.AddFlow(three, xskSlot); err != nil {
		t.Fatal(err)
	}
	if err := p.AddFlow(five, emptySlot); err != nil {
		t.Fatal(err)
	}
	if got, err := p.Flows(); err != nil || len(got) != 2 || got[three] != xskSlot || got[five] != emptySlot {
		t.Fatalf("Flows() = %v, %v", got, err)
	}

	// 5-tuple wins: its slot is empty, so the kernel gets the datagram.
	before := counters(t, p)
	send(t, pinned, dst, []byte("five-tuple"))
	if got := recvUDP(t, kernel, 1)[0]; string(got) != "five-tuple" {
		t.Fatalf("kernel got %q", got)
	}
	if d := counters(t, p).sub(before); d.NoSocket != 1 || d.Redirected != 0 {
		t.Fatalf("5-tuple datagram: counter delta %+v, want NoSocket 1", d)
	}

	// Any other source falls back to the 3-tuple and lands in the socket.
	before = counters(t, p)
	send(t, anySrc, dst, []byte("three-tuple"))
	frames := x.waitFrames(t, 1)
	if !bytes.Contains(frames[0], []byte("three-tuple")) {
		t.Fatalf("AF_XDP frame does not carry the datagram: %x", frames[0])
	}
	if d := counters(t, p).sub(before); d.Redirected != 1 || d.NoSocket != 0 || d.Fragments != 0 {
		t.Fatalf("3-tuple datagram: counter delta %+v, want Redirected 1", d)
	}

	// Fragments follow the first fragment into the socket.
	const size = 4000
	n := fragmentCount(lab.A.MTU, size, fam.v6)
	big := payloads("steered", 1, size)[0]
	before = counters(t, p)
	send(t, anySrc, dst, big)
	frames = x.waitFrames(t, n)
	if len(frames) != n {
		t.Fatalf("AF_XDP socket got %d frames, want %d fragments", len(frames), n)
	}
	var joined []byte
	for _, f := range frames {
		joined = append(joined, f...)
	}
	if !bytes.Contains(joined, big[:64]) || !bytes.Contains(joined, big[size-64:]) {
		t.Fatal("fragments in the AF_XDP socket do not carry the datagram")
	}
	if d := counters(t, p).sub(before); d.Redirected != uint64(n) || d.Fragments != uint64(n) || d.NoSocket != 0 {
		t.Fatalf("fragmented datagram: counter delta %+v, want Redirected = Fragments = %d", d, n)
	}
	assertNoFragState(t, p)

	// Nothing steered reached the kernel: the next datagram it sees is a
	// marker sent after them on the same path.
	send(t, pinned, dst, []byte("marker"))
	if got := recvUDP(t, kernel, 1)[0]; string(got) != "marker" {
		t.Fatalf("kernel socket got %q, want only the marker", got)
	}

	// Without the socket the 3-tuple falls back to the kernel.
	if err := p.ClearSocket(xskSlot); err != nil {
		t.Fatal(err)
	}
	before = counters(t, p)
	send(t, anySrc, dst, []byte("cleared"))
	if got := recvUDP(t, kernel, 1)[0]; string(got) != "cleared" {
		t.Fatalf("kernel got %q", got)
	}
	if d := counters(t, p).sub(before); d.NoSocket != 1 || d.Redirected != 0 {
		t.Fatalf("after ClearSocket: counter delta %+v, want NoSocket 1", d)
	}
}
