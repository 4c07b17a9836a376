package takeover

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Packet kinds of the takeover stream.
const (
	kindManifest = 1 // offerer -> taker: JSON manifest
	kindDoc      = 2 // offerer -> taker: a chunk of the state document
	kindFDs      = 3 // offerer -> taker: a batch of descriptors
	kindTake     = 4 // taker -> offerer: commit
	kindRefuse   = 5 // either way: give up, with a reason
	kindReleased = 6 // offerer -> taker: the data path is released (Final)
)

// magic starts every takeover packet, so a stray control packet is never
// read as one.
var magic = [4]byte{'B', 'P', 'T', 'K'}

const (
	headerLen = 8
	// chunkBytes bounds one packet's payload (well under the socket
	// buffer, so one sendmsg always fits).
	chunkBytes = 32 << 10
	// batchFDs bounds one packet's descriptors (the kernel's SCM_MAX_FD
	// is 253).
	batchFDs = 200
	// maxDoc bounds the state document a taker accepts.
	maxDoc = 256 << 20
	// maxFDs bounds the descriptors a taker accepts.
	maxFDs = 1 << 20
)

// manifest announces what follows it.
type manifest struct {
	Version  int `json:"version"`
	DocBytes int `json:"doc_bytes"`
	FDs      int `json:"fds"`
}

// RefusedError is the peer's REFUSE: it gave up, and why.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return "takeover refused by the other daemon: " + e.Reason }

// Conn is one end of a takeover stream: a connected AF_UNIX SOCK_SEQPACKET
// socket driven by the runtime poller, so deadlines apply.
type Conn struct {
	f    *os.File
	rc   syscall.RawConn
	rbuf []byte
	oob  []byte
	// more is the last received packet's flagMore; countersPending says
	// that endpoint counters follow a RELEASED head.
	more, counters, countersPending bool
}

// NewConn wraps fd and takes ownership of it.
func NewConn(fd int) (*Conn, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("takeover: set non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bypassd-takeover")
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("takeover: %w", err)
	}
	return &Conn{f: f, rc: rc, rbuf: make([]byte, headerLen+chunkBytes), oob: make([]byte, unix.CmsgSpace(batchFDs*4))}, nil
}

// Close closes the stream.
func (c *Conn) Close() error { return c.f.Close() }

// SetDeadline bounds every pending and future read and write.
func (c *Conn) SetDeadline(t time.Time) error { return c.f.SetDeadline(t) }

// flagMore in a packet's header (byte 5) says that the payload continues
// in the next packet of the same kind (a RELEASED longer than one packet,
// state version 2 on).
const flagMore = 1

// flagCounters on the last packet of a RELEASED head says that endpoint
// counters follow (ReleasedCounters).
const flagCounters = 2

func (c *Conn) send(kind byte, payload []byte, fds []int) error {
	return c.sendFlags(kind, 0, payload, fds)
}

func (c *Conn) sendFlags(kind, flags byte, payload []byte, fds []int) error {
	b := make([]byte, headerLen, headerLen+len(payload))
	copy(b, magic[:])
	b[4] = kind
	b[5] = flags
	binary.LittleEndian.PutUint16(b[6:], uint16(len(fds)))
	b = append(b, payload...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var serr error
	err := c.rc.Write(func(fd uintptr) bool {
		for {
			serr = unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_NOSIGNAL)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("takeover: send: %w", err)
	}
	return nil
}

// recv reads one packet. Descriptors come back only for kindFDs; any on
// another packet are closed and the packet refused.
func (c *Conn) recv() (kind byte, payload []byte, fds []int, err error) {
	var n, oobn, flags int
	var rerr error
	err = c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.rbuf, c.oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, nil, nil, fmt.Errorf("takeover: receive: %w", err)
	}
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(c.oob[:oobn])
		for _, m := range msgs {
			if got, e := unix.ParseUnixRights(&m); e == nil {
				fds = append(fds, got...)
			}
		}
		if perr != nil {
			closeAll(fds)
			return 0, nil, nil, fmt.Errorf("takeover: receive: ancillary data: %w", perr)
		}
	}
	fail := func(e error) (byte, []byte, []int, error) {
		closeAll(fds)
		return 0, nil, nil, e
	}
	if n == 0 && oobn == 0 {
		return fail(fmt.Errorf("takeover: the other daemon closed the connection: %w", io.EOF))
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		return fail(errors.New("takeover: receive: packet or descriptors truncated"))
	}
	if n < headerLen || [4]byte(c.rbuf[:4]) != magic {
		return fail(errors.New("takeover: receive: not a takeover packet"))
	}
	kind = c.rbuf[4]
	if want := int(binary.LittleEndian.Uint16(c.rbuf[6:])); want != len(fds) || (kind != kindFDs && want != 0) {
		return fail(fmt.Errorf("takeover: receive: packet kind %d announces %d descriptors, carries %d", kind, want, len(fds)))
	}
	if kind == kindRefuse {
		closeAll(fds)
		return 0, nil, nil, &RefusedError{Reason: string(c.rbuf[headerLen:n])}
	}
	c.more, c.counters = c.rbuf[5]&flagMore != 0, c.rbuf[5]&flagCounters != 0
	return kind, append([]byte(nil), c.rbuf[headerLen:n]...), fds, nil
}

func (c *Conn) expect(want byte) ([]byte, []int, error) {
	kind, p, fds, err := c.recv()
	if err != nil {
		return nil, nil, err
	}
	if kind != want {
		closeAll(fds)
		return nil, nil, fmt.Errorf("takeover: protocol error: packet kind %d, want %d", kind, want)
	}
	return p, fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// Offer sends the state document doc (of the given version) and fds: the
// manifest, the document in chunks, the descriptors in batches. The
// descriptors stay the caller's.
func (c *Conn) Offer(version int, doc []byte, fds []int) error {
	m, err := json.Marshal(manifest{Version: version, DocBytes: len(doc), FDs: len(fds)})
	if err != nil {
		return fmt.Errorf("takeover: manifest: %w", err)
	}
	if err := c.send(kindManifest, m, nil); err != nil {
		return err
	}
	for off := 0; off < len(doc); off += chunkBytes {
		if err := c.send(kindDoc, doc[off:min(off+chunkBytes, len(doc))], nil); err != nil {
			return err
		}
	}
	for off := 0; off < len(fds); off += batchFDs {
		if err := c.send(kindFDs, nil, fds[off:min(off+batchFDs, len(fds))]); err != nil {
			return err
		}
	}
	return nil
}

// Receive reads what Offer sent, refusing (with a REFUSE to the offerer) a
// document whose version is outside minV..maxV. On error every received
// descriptor is closed.
func (c *Conn) Receive(minV, maxV int) (version int, doc []byte, files *Files, err error) {
	p, _, err := c.expect(kindManifest)
	if err != nil {
		return 0, nil, nil, err
	}
	var m manifest
	if err := json.Unmarshal(p, &m); err != nil {
		return 0, nil, nil, c.refuse(fmt.Errorf("takeover: manifest: %w", err))
	}
	if m.Version < minV || m.Version > maxV {
		return 0, nil, nil, c.refuse(fmt.Errorf("takeover: the running daemon sent state version %d, this daemon reads %d..%d", m.Version, minV, maxV))
	}
	if m.DocBytes <= 0 || m.DocBytes > maxDoc || m.FDs < 0 || m.FDs > maxFDs {
		return 0, nil, nil, c.refuse(fmt.Errorf("takeover: manifest announces %d document bytes and %d descriptors: out of bounds", m.DocBytes, m.FDs))
	}
	doc = make([]byte, 0, m.DocBytes)
	for len(doc) < m.DocBytes {
		p, _, err := c.expect(kindDoc)
		if err != nil {
			return 0, nil, nil, err
		}
		if len(doc)+len(p) > m.DocBytes {
			return 0, nil, nil, c.refuse(errors.New("takeover: state document longer than announced"))
		}
		doc = append(doc, p...)
	}
	all := make([]int, 0, m.FDs)
	for len(all) < m.FDs {
		_, fds, err := c.expect(kindFDs)
		all = append(all, fds...)
		if err == nil && len(all) > m.FDs {
			err = c.refuse(fmt.Errorf("takeover: %d descriptors received, %d announced", len(all), m.FDs))
		}
		if err != nil {
			closeAll(all)
			return 0, nil, nil, err
		}
	}
	return m.Version, doc, &Files{fds: all}, nil
}

// refuse sends REFUSE with err's text (best effort) and returns err.
func (c *Conn) refuse(err error) error {
	_ = c.Refuse(err.Error())
	return err
}

// Refuse tells the peer that this side gives up, and why.
func (c *Conn) Refuse(reason string) error { return c.send(kindRefuse, []byte(reason), nil) }

// Commit is the taker's TAKE: it adopts what it received, and the
// offerer must release the data path and go.
func (c *Conn) Commit() error { return c.send(kindTake, nil, nil) }

// Verdict waits for the taker's TAKE (nil) or REFUSE (*RefusedError); any
// other outcome (end of stream, deadline) is an error too: the offerer
// then keeps serving.
func (c *Conn) Verdict() error {
	_, _, err := c.expect(kindTake)
	return err
}

// Released tells the taker that the data path is released, with the
// counters that moved since the document (and the engines' state). A
// version 1 taker reads one packet, so counters past one packet are
// dropped for it rather than the upgrade. From version 2 on it is
// ReleasedHead and ReleasedCounters.
func (c *Conn) Released(f *Final, version int) error {
	if version >= 2 {
		if err := c.ReleasedHead(f, len(f.Endpoints) > 0); err != nil {
			return err
		}
		if len(f.Endpoints) == 0 {
			return nil
		}
		return c.ReleasedCounters(f.Endpoints)
	}
	b, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("takeover: encode final counters: %w", err)
	}
	if len(b) > chunkBytes {
		b = []byte(`{"rings":[]}`)
	}
	return c.send(kindReleased, b, nil)
}

// ReleasedHead is the first part of a version 2 RELEASED: f without its
// endpoint counters (the engines' state fits one packet unless the UMEMs
// are very large), so the taker can start its engines at once; with more,
// ReleasedCounters must follow.
func (c *Conn) ReleasedHead(f *Final, more bool) error {
	head := *f
	head.Endpoints = nil
	b, err := json.Marshal(&head)
	if err != nil {
		return fmt.Errorf("takeover: encode final state: %w", err)
	}
	for len(b) > chunkBytes {
		if err := c.sendFlags(kindReleased, flagMore, b[:chunkBytes], nil); err != nil {
			return err
		}
		b = b[chunkBytes:]
	}
	var flags byte
	if more {
		flags = flagCounters
	}
	return c.sendFlags(kindReleased, flags, b, nil)
}

// ReleasedCounters sends the endpoint counters after ReleasedHead, in as
// many packets as they need.
func (c *Conn) ReleasedCounters(eps map[uint32]map[string]uint64) error {
	b, err := json.Marshal(eps)
	if err != nil {
		return fmt.Errorf("takeover: encode final counters: %w", err)
	}
	for len(b) > chunkBytes {
		if err := c.sendFlags(kindReleased, flagMore, b[:chunkBytes], nil); err != nil {
			return err
		}
		b = b[chunkBytes:]
	}
	return c.send(kindReleased, b, nil)
}

// AwaitReleased waits for the offerer's RELEASED (version 2: its head;
// AwaitCounters then reads the endpoint counters).
func (c *Conn) AwaitReleased() (*Final, error) {
	all, err := c.chunks()
	if err != nil {
		return nil, err
	}
	c.countersPending = c.counters
	var f Final
	if err := json.Unmarshal(all, &f); err != nil {
		return nil, fmt.Errorf("takeover: final counters: %w", err)
	}
	return &f, nil
}

// chunks reads RELEASED packets up to one without flagMore.
func (c *Conn) chunks() ([]byte, error) {
	var all []byte
	for {
		p, _, err := c.expect(kindReleased)
		if err != nil {
			return nil, err
		}
		all = append(all, p...)
		if !c.more {
			return all, nil
		}
		if len(all) > maxDoc {
			return nil, errors.New("takeover: RELEASED longer than a state document may be")
		}
	}
}

// AwaitCounters reads the endpoint counters that follow a version 2
// RELEASED head (nil if none do).
func (c *Conn) AwaitCounters() (map[uint32]map[string]uint64, error) {
	if !c.countersPending {
		return nil, nil
	}
	c.countersPending = false
	all, err := c.chunks()
	if err != nil {
		return nil, err
	}
	var eps map[uint32]map[string]uint64
	if err := json.Unmarshal(all, &eps); err != nil {
		return nil, fmt.Errorf("takeover: final counters: %w", err)
	}
	return eps, nil
}

// Files are received descriptors, by index. Each is taken at most once;
// Close closes the ones nobody took, so none leaks whatever the adopter
// did.
type Files struct {
	fds   []int
	taken []bool
}

// Len returns the number of descriptors.
func (f *Files) Len() int { return len(f.fds) }

// Take returns descriptor i and makes it the caller's.
func (f *Files) Take(i int) (int, error) {
	if f.taken == nil {
		f.taken = make([]bool, len(f.fds))
	}
	if i < 0 || i >= len(f.fds) {
		return -1, fmt.Errorf("takeover: descriptor %d of %d", i, len(f.fds))
	}
	if f.taken[i] {
		return -1, fmt.Errorf("takeover: descriptor %d named twice in the state document", i)
	}
	f.taken[i] = true
	return f.fds[i], nil
}

// Close closes every descriptor not taken, and returns how many.
func (f *Files) Close() int {
	n := 0
	for i, fd := range f.fds {
		if f.taken == nil || !f.taken[i] {
			unix.Close(fd)
			n++
		}
	}
	f.fds, f.taken = nil, nil
	return n
}
