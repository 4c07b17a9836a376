package stats

import (
	"encoding/binary"
	"net/netip"
	"time"
	"unicode/utf8"
)

var le = binary.LittleEndian

// Socket block offsets.
const (
	offSID         = 0
	offSFlags      = 4
	offSFamily     = 8
	offSRing       = 10
	offSTTL        = 12
	offSMcastTTL   = 13
	offSTOS        = 14
	offSLocal      = 16
	offSLocalPort  = 32
	offSPeerPort   = 34
	offSQueueBytes = 36
	offSPeer       = 40
	offSGroupCount = 56
	offSCounters   = 64
	offSGroups     = 256
	lenGroup       = 32
	noRing         = 0xFFFF
)

// Ring block offsets.
const (
	offRIndex     = 0
	offRQueue     = 4
	offRIfindex   = 8
	offRFlags     = 12
	offRInterface = 16
	offRProvider  = 32
	offRMode      = 48
	lenRName      = 16
	offRRXFrames  = 64
	offRTXFrames  = 68
	offRFrameSize = 72
	offRSockets   = 76
	offRDevMem    = 80
)

// Client block offsets.
const (
	offCSockets     = 0
	offCMaxSockets  = 4
	offCOpened      = 8
	offCQueueMemory = 16
	offCQueueLimit  = 24
)

// putString writes s NUL-padded into b, cut at a UTF-8 boundary so that at
// least one NUL remains.
func putString(b []byte, s string) {
	n := min(len(s), len(b)-1)
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	copy(b, s[:n])
	clear(b[n:])
}

// getString reads a NUL-padded string (a field without NUL is read whole).
func getString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// putAddr writes a 16-byte address, IPv4 v4-mapped; the zero Addr is 16
// zero bytes.
func putAddr(b []byte, a netip.Addr) {
	if !a.IsValid() {
		clear(b[:16])
		return
	}
	a16 := a.As16()
	copy(b, a16[:])
}

// getAddr reads a 16-byte address, unmapping v4-mapped ones. zeroValid
// says whether 16 zero bytes are the IPv6 wildcard (else the zero Addr).
func getAddr(b []byte, zeroValid bool) netip.Addr {
	a := netip.AddrFrom16([16]byte(b[:16]))
	if a == netip.IPv6Unspecified() && !zeroValid {
		return netip.Addr{}
	}
	return a.Unmap()
}

func putTime(b []byte, t time.Time) {
	if t.IsZero() {
		le.PutUint64(b, 0)
		return
	}
	le.PutUint64(b, uint64(t.UnixNano()))
}

func getTime(b []byte) time.Time {
	ns := le.Uint64(b)
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(ns))
}

func putCounters(b []byte, c []uint64) {
	for i, v := range c {
		le.PutUint64(b[8*i:], v)
	}
}

func getCounters(b []byte, c []uint64) {
	for i := range c {
		c[i] = le.Uint64(b[8*i:])
	}
}

func clampU32(n int) uint32 {
	if n < 0 {
		return 0
	}
	if uint64(n) > 0xFFFFFFFF {
		return 0xFFFFFFFF
	}
	return uint32(n)
}

func encodeSocket(b []byte, s *Socket) {
	clear(b[:SocketBlockSize])
	le.PutUint32(b[offSID:], s.ID)
	le.PutUint32(b[offSFlags:], uint32(s.Flags))
	le.PutUint16(b[offSFamily:], s.Family)
	ring := uint16(noRing)
	if s.Ring >= 0 && s.Ring < noRing {
		ring = uint16(s.Ring)
	}
	le.PutUint16(b[offSRing:], ring)
	b[offSTTL], b[offSMcastTTL], b[offSTOS] = s.TTL, s.MulticastTTL, s.TOS
	if s.Flags&SocketBound != 0 {
		putAddr(b[offSLocal:], s.Local.Addr())
		le.PutUint16(b[offSLocalPort:], s.Local.Port())
	}
	if s.Flags&SocketConnected != 0 {
		putAddr(b[offSPeer:], s.Peer.Addr())
		le.PutUint16(b[offSPeerPort:], s.Peer.Port())
	}
	le.PutUint32(b[offSQueueBytes:], s.QueueBytes)
	le.PutUint32(b[offSGroupCount:], clampU32(max(s.GroupCount, len(s.Groups))))
	putCounters(b[offSCounters:], s.Counters[:])
	for i, g := range s.Groups[:min(len(s.Groups), MaxGroups)] {
		o := offSGroups + i*lenGroup
		putAddr(b[o:], g.Group)
		putAddr(b[o+16:], g.Source)
	}
}

func decodeSocket(b []byte, s *Socket) {
	*s = Socket{
		ID:           le.Uint32(b[offSID:]),
		Flags:        SocketFlags(le.Uint32(b[offSFlags:])),
		Family:       le.Uint16(b[offSFamily:]),
		Ring:         int(le.Uint16(b[offSRing:])),
		TTL:          b[offSTTL],
		MulticastTTL: b[offSMcastTTL],
		TOS:          b[offSTOS],
		QueueBytes:   le.Uint32(b[offSQueueBytes:]),
		GroupCount:   int(le.Uint32(b[offSGroupCount:])),
	}
	if s.Ring == noRing {
		s.Ring = -1
	}
	if s.Flags&SocketBound != 0 {
		s.Local = netip.AddrPortFrom(getAddr(b[offSLocal:], true), le.Uint16(b[offSLocalPort:]))
	}
	if s.Flags&SocketConnected != 0 {
		s.Peer = netip.AddrPortFrom(getAddr(b[offSPeer:], true), le.Uint16(b[offSPeerPort:]))
	}
	getCounters(b[offSCounters:], s.Counters[:])
	// Listed memberships end at the first empty entry (a group is never
	// the all-zero address).
	for i := 0; i < MaxGroups; i++ {
		o := offSGroups + i*lenGroup
		g := getAddr(b[o:], false)
		if !g.IsValid() {
			break
		}
		s.Groups = append(s.Groups, Membership{Group: g, Source: getAddr(b[o+16:], false)})
	}
}

func encodeRing(b []byte, r *Ring) {
	clear(b[:RingBlockSize])
	le.PutUint32(b[offRIndex:], clampU32(r.Index))
	le.PutUint32(b[offRQueue:], clampU32(r.Queue))
	le.PutUint32(b[offRIfindex:], clampU32(r.Ifindex))
	le.PutUint32(b[offRFlags:], uint32(r.Flags))
	putString(b[offRInterface:offRInterface+lenRName], r.Interface)
	putString(b[offRProvider:offRProvider+lenRName], r.Provider)
	putString(b[offRMode:offRMode+lenRName], r.Mode)
	le.PutUint32(b[offRRXFrames:], clampU32(r.RXFrames))
	le.PutUint32(b[offRTXFrames:], clampU32(r.TXFrames))
	le.PutUint32(b[offRFrameSize:], clampU32(r.FrameSize))
	le.PutUint32(b[offRSockets:], clampU32(r.Sockets))
	le.PutUint64(b[offRDevMem:], uint64(max(r.DevMemAlloc, 0)))
	putCounters(b[ringCounterOff:], r.Counters[:])
}

func decodeRing(b []byte, r *Ring) {
	*r = Ring{
		Index:       int(le.Uint32(b[offRIndex:])),
		Queue:       int(le.Uint32(b[offRQueue:])),
		Ifindex:     int(le.Uint32(b[offRIfindex:])),
		Flags:       RingFlags(le.Uint32(b[offRFlags:])),
		Interface:   getString(b[offRInterface : offRInterface+lenRName]),
		Provider:    getString(b[offRProvider : offRProvider+lenRName]),
		Mode:        getString(b[offRMode : offRMode+lenRName]),
		RXFrames:    int(le.Uint32(b[offRRXFrames:])),
		TXFrames:    int(le.Uint32(b[offRTXFrames:])),
		FrameSize:   int(le.Uint32(b[offRFrameSize:])),
		Sockets:     int(le.Uint32(b[offRSockets:])),
		DevMemAlloc: int64(le.Uint64(b[offRDevMem:])),
	}
	getCounters(b[ringCounterOff:], r.Counters[:])
}

func encodeClient(b []byte, c *Client) {
	clear(b[:ClientBlockSize])
	le.PutUint32(b[offCSockets:], clampU32(c.Sockets))
	le.PutUint32(b[offCMaxSockets:], clampU32(c.MaxSockets))
	le.PutUint64(b[offCOpened:], c.SocketsOpened)
	le.PutUint64(b[offCQueueMemory:], uint64(max(c.QueueMemory, 0)))
	le.PutUint64(b[offCQueueLimit:], uint64(max(c.QueueMemoryLimit, 0)))
	putCounters(b[clientCounterOff:], c.Totals[:])
}

func decodeClient(b []byte, c *Client) {
	*c = Client{
		Sockets:          int(le.Uint32(b[offCSockets:])),
		MaxSockets:       int(le.Uint32(b[offCMaxSockets:])),
		SocketsOpened:    le.Uint64(b[offCOpened:]),
		QueueMemory:      int64(le.Uint64(b[offCQueueMemory:]) & (1<<63 - 1)),
		QueueMemoryLimit: int64(le.Uint64(b[offCQueueLimit:]) & (1<<63 - 1)),
	}
	getCounters(b[clientCounterOff:], c.Totals[:])
}

func encodeDaemon(b []byte, d *Daemon) {
	clear(b[:DaemonBlockSize])
	le.PutUint32(b[offDLogLevel:], uint32(int32(d.LogLevel)))
	le.PutUint32(b[offDMaxSockets:], clampU32(d.MaxSockets))
	le.PutUint32(b[offDQueueBytes:], clampU32(d.QueueBytes))
	putString(b[offDVersion:offDVersion+lenDVersion], d.Version)
	putString(b[offDSocketPath:offDSocketPath+lenDSocketPath], d.SocketPath)
	putCounters(b[daemonCounterOff:], d.Counters[:])
}

func decodeDaemon(b []byte, d *Daemon) {
	*d = Daemon{
		LogLevel:   int8(int32(le.Uint32(b[offDLogLevel:]))),
		MaxSockets: int(le.Uint32(b[offDMaxSockets:])),
		QueueBytes: int(le.Uint32(b[offDQueueBytes:])),
		Version:    getString(b[offDVersion : offDVersion+lenDVersion]),
		SocketPath: getString(b[offDSocketPath : offDSocketPath+lenDSocketPath]),
	}
	getCounters(b[daemonCounterOff:], d.Counters[:])
}
