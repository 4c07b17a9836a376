package shmq

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func closeFD(fd int) {
	if fd >= 0 {
		unix.Close(fd)
	}
}

func TestCreateMemfdSealed(t *testing.T) {
	size := 2 * Size(4096)
	fd, mem, err := CreateMemfd("shmq-test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeFD(fd) })
	t.Cleanup(func() {
		if err := Unmap(mem); err != nil {
			t.Error(err)
		}
	})
	if len(mem) != size {
		t.Fatalf("mapping is %d bytes, want %d", len(mem), size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	if seals&RequiredSeals != RequiredSeals {
		t.Fatalf("seals %#x lack %#x", seals, RequiredSeals)
	}
	if err := unix.Ftruncate(fd, int64(size/2)); !errors.Is(err, unix.EPERM) {
		t.Errorf("shrinking the sealed memfd: %v, want EPERM", err)
	}
	if err := unix.Ftruncate(fd, int64(size*2)); !errors.Is(err, unix.EPERM) {
		t.Errorf("growing the sealed memfd: %v, want EPERM", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); !errors.Is(err, unix.EPERM) {
		t.Errorf("adding a seal after F_SEAL_SEAL: %v, want EPERM", err)
	}
	if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Errorf("memfd not close-on-exec: flags %#x err %v", flags, err)
	}

	// A second mapping (what the peer gets) shares the bytes.
	peer, err := MapMemfd(fd, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(peer) })
	q, err := Init(mem[Size(4096):], 4096)
	if err != nil {
		t.Fatal(err)
	}
	q.Push(5, []byte("via memfd"))
	q.Publish()
	pq, err := Attach(peer[Size(4096):])
	if err != nil {
		t.Fatal(err)
	}
	if p, typ, err := pq.Peek(); err != nil || typ != 5 || string(p) != "via memfd" {
		t.Fatalf("Peek through the peer mapping: %q %d %v", p, typ, err)
	}
	if any0, err := MapMemfd(fd, 0); err != nil || len(any0) != size {
		t.Errorf("MapMemfd(size 0): %d bytes, %v", len(any0), err)
	} else {
		Unmap(any0)
	}
}

func TestCreateMemfdErrors(t *testing.T) {
	for _, size := range []int{0, -1} {
		if fd, _, err := CreateMemfd("x", size); err == nil {
			closeFD(fd)
			t.Errorf("CreateMemfd(size %d) succeeded", size)
		}
	}
	if fd, _, err := CreateMemfd(string(make([]byte, 300)), 4096); err == nil {
		closeFD(fd)
		t.Error("CreateMemfd with a 300-byte name succeeded")
	}
}

func TestMapMemfdRefuses(t *testing.T) {
	mk := func(t *testing.T, seals int) int {
		fd, err := unix.MemfdCreate("shmq-unsealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeFD(fd) })
		if err := unix.Ftruncate(fd, 8192); err != nil {
			t.Fatal(err)
		}
		if seals != 0 {
			if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
				t.Fatal(err)
			}
		}
		return fd
	}
	for name, seals := range map[string]int{
		"unsealed":      0,
		"shrink only":   unix.F_SEAL_SHRINK,
		"no seal-seal":  unix.F_SEAL_SHRINK | unix.F_SEAL_GROW,
		"no grow seal":  unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL,
		"no shrink sea": unix.F_SEAL_GROW | unix.F_SEAL_SEAL,
	} {
		t.Run(name, func(t *testing.T) {
			fd := mk(t, seals)
			if mem, err := MapMemfd(fd, 8192); !errors.Is(err, ErrNotSealed) {
				if err == nil {
					Unmap(mem)
				}
				t.Fatalf("MapMemfd = %v, want ErrNotSealed", err)
			}
		})
	}
	t.Run("write sealed", func(t *testing.T) {
		fd := mk(t, RequiredSeals|unix.F_SEAL_WRITE)
		if mem, err := MapMemfd(fd, 8192); err == nil {
			Unmap(mem)
			t.Fatal("MapMemfd mapped a write-sealed memfd")
		}
	})
	t.Run("wrong size", func(t *testing.T) {
		fd, mem, err := CreateMemfd("shmq-size", 8192)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { Unmap(mem); closeFD(fd) })
		if m, err := MapMemfd(fd, 4096); err == nil {
			Unmap(m)
			t.Fatal("MapMemfd accepted a size mismatch")
		}
	})
	t.Run("not a memfd", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "plain"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		f.Truncate(8192)
		if m, err := MapMemfd(int(f.Fd()), 0); err == nil {
			Unmap(m)
			t.Fatal("MapMemfd mapped a plain file")
		}
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		defer closeFD(p[0])
		defer closeFD(p[1])
		if m, err := MapMemfd(p[0], 0); err == nil {
			Unmap(m)
			t.Fatal("MapMemfd mapped a pipe")
		}
	})
	t.Run("bad args", func(t *testing.T) {
		if _, err := MapMemfd(-1, 0); err == nil {
			t.Error("MapMemfd(-1) succeeded")
		}
		if _, err := MapMemfd(0, -5); err == nil {
			t.Error("MapMemfd with negative size succeeded")
		}
	})
}

func TestUnmapErrors(t *testing.T) {
	if err := Unmap(nil); err == nil {
		t.Error("Unmap(nil) succeeded")
	}
	if err := Unmap(make([]byte, 4096)); err == nil {
		t.Error("Unmap of heap memory succeeded")
	}
	fd, mem, err := CreateMemfd("shmq-unmap", 4096)
	if err != nil {
		t.Fatal(err)
	}
	closeFD(fd)
	if err := Unmap(mem); err != nil {
		t.Fatal(err)
	}
	if err := Unmap(mem); err == nil {
		t.Error("second Unmap succeeded")
	}
}
