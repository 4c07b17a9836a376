package ctlproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/shmq"
	"golang.org/x/sys/unix"
)

var memfdSeq atomic.Uint64

// testMemfd returns a memfd with a name unique to this process, closed at
// cleanup; countOpen reports how many descriptors of the process refer to it.
func testMemfd(t *testing.T) (fd int, name string) {
	t.Helper()
	name = fmt.Sprintf("ctlproto-test-%d-%d", os.Getpid(), memfdSeq.Add(1))
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd, name
}

func countOpen(t *testing.T, memfdName string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err == nil && strings.HasPrefix(target, "/memfd:"+memfdName+" ") {
			n++
		}
	}
	return n
}

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	a, b, err := Pair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// rawPair returns a raw socket end (to send arbitrary packets) and a Conn.
func rawPair(t *testing.T) (int, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConn(fds[1])
	if err != nil {
		unix.Close(fds[0])
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[0]); c.Close() })
	return fds[0], c
}

func sameFile(t *testing.T, a, b int) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Fstat(a, &sa); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(b, &sb); err != nil {
		t.Fatal(err)
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

func TestConnPassesFDs(t *testing.T) {
	t.Parallel()
	daemon, client := pair(t)
	const q = 4096
	size := 2 * shmq.Size(q)
	memfd, _, err := shmq.CreateMemfd("ctlproto-test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(memfd) })
	sent := []int{memfd}
	for range 3 {
		w, err := shmq.NewWaiter()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		sent = append(sent, w.FD())
	}
	reply := HelloReply{Version: Version, Lanes: 2, MaxSockets: 16, DefaultQueueBytes: q, SessionSize: uint64(size)}
	h := Header{Code: CodeHello | ReplyBit, ReqID: 9}
	if err := daemon.Send(h, reply, sent...); err != nil {
		t.Fatal(err)
	}
	gh, m, fds, err := client.Recv()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFDs(fds) })
	if gh.ReqID != 9 || *m.(*HelloReply) != reply {
		t.Fatalf("got %+v %+v", gh, m)
	}
	if len(fds) != FDDoorbell+2 {
		t.Fatalf("%d fds", len(fds))
	}
	for i := range fds {
		if fds[i] == sent[i] || !sameFile(t, fds[i], sent[i]) {
			t.Errorf("fd %d: received %d is not a new descriptor of sent %d", i, fds[i], sent[i])
		}
		flags, err := unix.FcntlInt(uintptr(fds[i]), unix.F_GETFD, 0)
		if err != nil || flags&unix.FD_CLOEXEC == 0 {
			t.Errorf("fd %d not close-on-exec (%v)", i, err)
		}
	}
	// The received memfd is usable as the spec says: sealed, mappable.
	mem, err := shmq.MapMemfd(fds[FDSession], size)
	if err != nil {
		t.Fatal(err)
	}
	shmq.Unmap(mem)
}

func TestConnSendChecksFDCount(t *testing.T) {
	t.Parallel()
	a, _ := pair(t)
	fd, _ := testMemfd(t)
	if err := a.Send(Header{Code: CodeClose, Socket: 1}, nil, fd); err == nil {
		t.Fatal("CLOSE with an fd accepted")
	}
	reply := HelloReply{Version: Version, Lanes: 1, MaxSockets: 1, DefaultQueueBytes: 4096, SessionSize: 1 << 20}
	if err := a.Send(Header{Code: CodeHello | ReplyBit}, reply, fd); err == nil {
		t.Fatal("HELLO reply with one fd accepted")
	}
	if err := a.Send(Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, RXOffset: 8192}, fd); err == nil {
		t.Fatal("OPEN reply with an fd accepted")
	}
	if err := a.Send(Header{Code: CodeBind, Socket: 1}, Bind{}); err == nil {
		t.Fatal("invalid body accepted")
	}
}

func TestConnRefusedPacketsCloseFDs(t *testing.T) {
	t.Parallel()
	raw, c := rawPair(t)
	memfd, name := testMemfd(t)
	closeMsg, _ := Marshal(nil, Header{Code: CodeClose, ReqID: 41, Socket: 1}, nil)
	helloReply, _ := Marshal(nil, Header{Code: CodeHello | ReplyBit, ReqID: 42},
		HelloReply{Version: Version, Lanes: 1, MaxSockets: 1, DefaultQueueBytes: 4096, SessionSize: 1 << 20})
	big := make([]byte, MaxMessage+100)
	copy(big, closeMsg)
	big[4] = 43
	many := make([]int, maxRecvFDs+5)
	for i := range many {
		many[i] = memfd
	}
	cases := []struct {
		name  string
		pkt   []byte
		fds   []int
		reqID uint32
	}{
		{"fds on CLOSE", closeMsg, []int{memfd, memfd}, 41},
		{"too few fds on HELLO reply", helloReply, []int{memfd}, 42},
		{"too many fds on HELLO reply", helloReply, []int{memfd, memfd, memfd, memfd}, 42},
		{"control truncated", closeMsg, many, 41},
		{"truncated packet", big, []int{memfd}, 43},
	}
	for _, tc := range cases {
		var oob []byte
		if len(tc.fds) > 0 {
			oob = unix.UnixRights(tc.fds...)
		}
		if err := unix.Sendmsg(raw, tc.pkt, oob, nil, 0); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		h, m, fds, err := c.Recv()
		if !errors.Is(err, ErrMalformed) || m != nil || fds != nil {
			t.Fatalf("%s: got %v %v %v", tc.name, m, fds, err)
		}
		if h.ReqID != tc.reqID {
			t.Errorf("%s: request id %d, want %d", tc.name, h.ReqID, tc.reqID)
		}
		if n := countOpen(t, name); n != 1 {
			t.Fatalf("%s: %d descriptors of the memfd open, want only the test's own", tc.name, n)
		}
	}
	// The connection is still usable.
	if err := unix.Sendmsg(raw, closeMsg, nil, nil, 0); err != nil {
		t.Fatal(err)
	}
	if h, _, _, err := c.Recv(); err != nil || h.Code != CodeClose {
		t.Fatalf("after refused packets: %+v %v", h, err)
	}
	// A short packet and one from an unknown version.
	for _, pkt := range [][]byte{{1, 2, 3}, append([]byte{1, 0, 9, 0}, make([]byte, 12)...)} {
		if err := unix.Sendmsg(raw, pkt, nil, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, _, err := c.Recv(); !errors.Is(err, ErrShort) {
		t.Fatalf("short: %v", err)
	}
	if _, _, _, err := c.Recv(); !errors.Is(err, ErrVersion) || !errors.Is(err, unix.EPROTONOSUPPORT) {
		t.Fatalf("version: %v", err)
	}
}

func TestConnPeerCred(t *testing.T) {
	t.Parallel()
	a, _ := pair(t)
	cred, err := a.PeerCred()
	if err != nil {
		t.Fatal(err)
	}
	if int(cred.Pid) != os.Getpid() || int(cred.Uid) != os.Geteuid() || int(cred.Gid) != os.Getegid() {
		t.Fatalf("cred %+v, process %d %d %d", cred, os.Getpid(), os.Geteuid(), os.Getegid())
	}
}

func TestConnDeadlines(t *testing.T) {
	t.Parallel()
	a, b := pair(t)
	if err := a.SetReadDeadline(time.Now().Add(20 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := a.Recv(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Recv past deadline: %v", err)
	}
	// Clearing the deadline makes Recv work again.
	if err := a.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(Header{Code: CodeShutdown}, Shutdown{Reason: 1}); err != nil {
		t.Fatal(err)
	}
	if _, m, _, err := a.Recv(); err != nil || m.(*Shutdown).Reason != 1 {
		t.Fatalf("%v %v", m, err)
	}
	// A peer that never reads: Send blocks once the buffer is full, until the write deadline.
	if err := b.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 1_000_000 && err == nil; i++ {
		err = b.Send(Header{Code: CodeClose, Socket: 1}, nil)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Send to a full peer: %v", err)
	}
}

func TestConnCloseUnblocksRecv(t *testing.T) {
	t.Parallel()
	a, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		_, _, _, err := a.Recv()
		done <- err
	}()
	time.Sleep(10 * time.Millisecond) // usually enough for Recv to block; the outcome is the same if not
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Recv after Close: %v", err)
	}
	if err := a.Send(Header{Code: CodeClose, Socket: 1}, nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Send after Close: %v", err)
	}
	if _, err := a.PeerCred(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("PeerCred after Close: %v", err)
	}
}

func TestConnPeerGone(t *testing.T) {
	t.Parallel()
	a, b := pair(t)
	b.Close()
	if _, _, _, err := a.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv from closed peer: %v", err)
	}
	if err := a.Send(Header{Code: CodeClose, Socket: 1}, nil); !errors.Is(err, unix.EPIPE) {
		t.Fatalf("Send to closed peer: %v", err)
	}
}

func TestConnConcurrentSenders(t *testing.T) {
	t.Parallel()
	a, b := pair(t)
	const senders, each = 8, 200
	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for s := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				ap := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(s), byte(i)}), uint16(i))
				if err := a.Send(Header{Code: CodeConnect, ReqID: uint32(s<<16 | i), Socket: uint32(s + 1)}, Connect{Addr: ap}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	seen := make(map[uint32]bool)
	for range senders * each {
		h, m, _, err := b.Recv()
		if err != nil {
			t.Fatal(err)
		}
		s, i := int(h.ReqID>>16), int(h.ReqID&0xffff)
		want := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(s), byte(i)}), uint16(i))
		if m.(*Connect).Addr != want || h.Socket != uint32(s+1) || seen[h.ReqID] {
			t.Fatalf("packet %+v %+v mixed up or repeated", h, m)
		}
		seen[h.ReqID] = true
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestNewConnRefusesOtherSockets(t *testing.T) {
	t.Parallel()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	if _, err := NewConn(fds[0]); err == nil || !strings.Contains(err.Error(), "SOCK_SEQPACKET") {
		t.Fatalf("stream socket: %v", err)
	}
	// fds[0] was closed by NewConn: the peer sees end of stream.
	var buf [1]byte
	if n, err := unix.Read(fds[1], buf[:]); n != 0 || err != nil {
		t.Fatalf("peer of refused fd: %d %v", n, err)
	}
}
