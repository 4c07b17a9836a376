package shmq

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestBell(t *testing.T) {
	w := newTestWaiter(t)
	dup, err := unix.Dup(w.FD())
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewBellFD(dup)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Wake(); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatalf("Wait after the Bell's Wake: %v", err)
	}
	// Not in this process's netpoller: every epoll set an eventfd is in
	// is signalled by each write and read of it (by any process).
	if inEpoll(t, dup) {
		t.Error("the Bell's eventfd is registered with an epoll set")
	}
	if !inEpoll(t, w.FD()) {
		t.Error("the check does not see the Waiter's eventfd in the netpoller")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Wake(); !errors.Is(err, ErrClosed) {
		t.Errorf("Wake after Close: %v", err)
	}
	if err := b.Close(); !errors.Is(err, ErrClosed) {
		t.Errorf("second Close: %v", err)
	}

	refusesPipe(t, func(fd int) error { _, err := NewBellFD(fd); return err })
}

// inEpoll reports whether fd is in one of this process's epoll sets.
func inEpoll(t *testing.T, fd int) bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue // closed meanwhile
		}
		for _, line := range strings.Split(string(info), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "tfd:" && f[1] == strconv.Itoa(fd) {
				return true
			}
		}
	}
	return false
}
