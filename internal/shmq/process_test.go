package shmq

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childEnv makes the re-executed test binary run childMain instead of the
// tests. Its value is the queue capacity.
const childEnv = "BYPASSD_SHMQ_TEST_CHILD"

func TestMain(m *testing.M) {
	if v := os.Getenv(childEnv); v != "" {
		if err := childMain(v); err != nil {
			fmt.Fprintln(os.Stderr, "shmq child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Child fds (ExtraFiles order): memfd holding queue 0 (parent→child) and
// queue 1 (child→parent), the child's two eventfds (data in queue 0, space in
// queue 1) and the parent's two (data in queue 1, space in queue 0).
const (
	fdMem = 3 + iota
	fdChildRX
	fdChildTX
	fdParentRX
	fdParentTX
)

const typeEnd = 0x7FFFFFF0 // above any record number the test uses

// childMain echoes every record of queue 0 into queue 1 with its type
// incremented, until a record of typeEnd, which it echoes and then exits.
func childMain(capArg string) error {
	capacity, err := strconv.Atoi(capArg)
	if err != nil {
		return err
	}
	mem, err := MapMemfd(fdMem, 2*Size(capacity))
	if err != nil {
		return err
	}
	defer Unmap(mem)
	in, err := Attach(mem[:Size(capacity)])
	if err != nil {
		return err
	}
	out, err := Attach(mem[Size(capacity):])
	if err != nil {
		return err
	}
	var w [4]*Waiter
	for i, fd := range []int{fdChildRX, fdChildTX, fdParentRX, fdParentTX} {
		if w[i], err = NewWaiterFD(fd); err != nil {
			return err
		}
		defer w[i].Close()
	}
	rx, tx, peerRX, peerTX := w[0], w[1], w[2], w[3]
	policy := Policy{Spin: 10 * time.Microsecond}
	deadline := func() time.Time { return time.Now().Add(60 * time.Second) }
	for {
		if err := policy.WaitReadable(in, rx, deadline()); err != nil {
			return fmt.Errorf("wait for data: %w", err)
		}
		for {
			p, typ, err := in.Peek()
			if err == ErrEmpty {
				break
			}
			if err != nil {
				return err
			}
			b, err := out.Reserve(len(p))
			if err == ErrFull {
				if out.Publish() {
					peerRX.Wake()
				}
				if err := policy.WaitWritable(out, len(p), tx, deadline()); err != nil {
					return fmt.Errorf("wait for space: %w", err)
				}
				b, err = out.Reserve(len(p))
			}
			if err != nil {
				return err
			}
			copy(b, p)
			if err := out.Commit(len(p), typ+1); err != nil {
				return err
			}
			in.Advance()
			if typ == typeEnd {
				in.Release()
				out.Publish()
				return peerRX.Wake()
			}
		}
		if in.Release() {
			peerTX.Wake()
		}
		if out.Publish() {
			peerRX.Wake()
		}
	}
}

func TestCrossProcess(t *testing.T) {
	const capacity = 1 << 14
	records := uint64(200_000)
	if raceEnabled {
		records = 50_000
	}
	fd, mem, err := CreateMemfd("shmq-xproc", 2*Size(capacity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(mem) })
	t.Cleanup(func() { closeFD(fd) })
	// The sender goroutine must be gone before the memory is unmapped;
	// closing the Waiters (later cleanups run first) unblocks it.
	senderDone := make(chan struct{})
	senderStarted := false
	t.Cleanup(func() {
		if senderStarted {
			<-senderDone
		}
	})
	out, err := Init(mem[:Size(capacity)], capacity)
	if err != nil {
		t.Fatal(err)
	}
	in, err := Init(mem[Size(capacity):], capacity)
	if err != nil {
		t.Fatal(err)
	}
	var w [4]*Waiter
	for i := range w {
		w[i] = newTestWaiter(t)
	}
	childRX, childTX, rx, tx := w[0], w[1], w[2], w[3]

	files := []*os.File{}
	for _, f := range []int{fd, childRX.FD(), childTX.FD(), rx.FD(), tx.FD()} {
		d, err := unix.Dup(f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, os.NewFile(uintptr(d), "child-fd"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+strconv.Itoa(capacity))
	cmd.ExtraFiles = files
	var stderr lockedBuffer // read on failure while the child may still write
	cmd.Stderr = &stderr
	err = cmd.Start()
	for _, f := range files {
		f.Close() // the child has its copies
	}
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			cmd.Process.Kill()
			<-exited
		}
	})

	// Sender and receiver run concurrently so the queues fill up and both
	// sides exercise waiting for space as well as for data.
	policy := Policy{Spin: 10 * time.Microsecond}
	deadline := func() time.Time { return time.Now().Add(60 * time.Second) }
	sendErr := make(chan error, 1)
	senderStarted = true
	go func() {
		defer close(senderDone)
		for i := uint64(0); i <= records; i++ {
			n, typ := recordSize(i, 1000), uint32(i)
			if i == records {
				n, typ = 0, typeEnd
			}
			b, err := out.Reserve(n)
			if err == ErrFull {
				if out.Publish() {
					childRX.Wake()
				}
				if err := policy.WaitWritable(out, n, tx, deadline()); err != nil {
					sendErr <- fmt.Errorf("send %d: %w", i, err)
					return
				}
				b, err = out.Reserve(n)
			}
			if err != nil {
				sendErr <- fmt.Errorf("send %d: %w", i, err)
				return
			}
			copy(b, recordBytes(i, n))
			out.Commit(n, typ)
			if i%16 == 15 || i == records {
				if out.Publish() {
					childRX.Wake()
				}
			}
		}
		sendErr <- nil
	}()
	for i := uint64(0); i <= records; {
		if err := policy.WaitReadable(in, rx, deadline()); err != nil {
			t.Fatalf("receive %d: %v (child stderr: %s)", i, err, stderr.String())
		}
		for {
			p, typ, err := in.Peek()
			if err == ErrEmpty {
				break
			}
			if err != nil {
				t.Fatalf("receive %d: %v", i, err)
			}
			n, want := recordSize(i, 1000), uint32(i)+1
			if i == records {
				n, want = 0, typeEnd+1
			}
			if typ != want || !bytes.Equal(p, recordBytes(i, n)) {
				t.Fatalf("record %d: type %d (want %d), %d bytes (want %d) or content differs", i, typ, want, len(p), n)
			}
			in.Advance()
			i++
		}
		if in.Release() {
			childTX.Wake()
		}
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("child: %v: %s", waitErr, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("child did not exit after the end record")
	}
}

// TestCrossProcessRefusesUnsealed runs MapMemfd in a child on an unsealed
// memfd, the way a daemon receives one from a client.
func TestCrossProcessRefusesUnsealed(t *testing.T) {
	fd, err := unix.MemfdCreate("shmq-unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFD(fd) })
	if err := unix.Ftruncate(fd, int64(2*Size(4096))); err != nil {
		t.Fatal(err)
	}
	d, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(d), "memfd")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=4096")
	cmd.ExtraFiles = []*os.File{f}
	out, err := cmd.CombinedOutput()
	f.Close()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !bytes.Contains(out, []byte("not sealed")) {
		t.Fatalf("child on an unsealed memfd: %v, output %q", err, out)
	}
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
