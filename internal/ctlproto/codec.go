package ctlproto

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/bypassd/bypassd/internal/shmq"
	"golang.org/x/sys/unix"
)

// Protocol constants.
const (
	// Version is the protocol version this package speaks: 2, the
	// session-memory protocol (one memfd per session, see internal/shmsess).
	Version = 2
	// MaxMessage is the largest packet (header included) either side sends or accepts.
	MaxMessage = 512
	// HeaderLen is the size of the header that starts every packet.
	HeaderLen = 16
	// DefaultPath is where the daemon listens unless configured otherwise.
	DefaultPath = "/run/bypassd/bypassd.sock"
	// EnvSocket names the environment variable that overrides DefaultPath for clients.
	EnvSocket = "BYPASSD_SOCKET"

	// OptionValueMax is the largest socket option value SETSOCKOPT and the
	// GETSOCKOPT reply carry.
	OptionValueMax = 64
	// NameMax is the size of HELLO's program name field.
	NameMax = 32
	// MinQueueBytes and MaxQueueBytes bound OPEN's queue_bytes (a power of two; 0 = daemon default).
	MinQueueBytes = 4 << 10
	MaxQueueBytes = 16 << 20
	// MaxLanes bounds HELLO's lanes (one doorbell descriptor each).
	MaxLanes = 64
	// MaxSlots bounds HELLO's max_sockets (the session memory's slots).
	MaxSlots = 64 * 64 * 64
	// maxErrno bounds Header.Status in replies (Linux's MAX_ERRNO).
	maxErrno = 4095
)

// Indexes of the file descriptors of a successful HELLO reply with session
// memory: FDSession, FDClientWake, then lane i's doorbell at FDDoorbell+i.
const (
	FDSession    = 0 // sealed session memfd
	FDClientWake = 1 // eventfd the daemon writes when it sets events for a sleeping client
	FDDoorbell   = 2 // lane 0's doorbell: the client writes it to wake a sleeping engine
)

// Socket families and types OPEN accepts (Linux numbers).
const (
	FamilyInet  = unix.AF_INET  // 2
	FamilyInet6 = unix.AF_INET6 // 10
	TypeDgram   = unix.SOCK_DGRAM
	TypeStream  = unix.SOCK_STREAM // TCP: byte streams as internal/stream records
)

// BindReuseAddr is BIND's flag bit 0 (SO_REUSEADDR semantics).
const BindReuseAddr = 1

// HelloFlagNoStats is HELLO's flag bit 0: the client is a tool
// (bypass-stats, bypassctl) that opens no sockets, so the daemon publishes
// no stats file for it.
const HelloFlagNoStats = 1

// HelloFlagNoSockets is HELLO's flag bit 1: the client opens no sockets, so
// the daemon creates no session memory (the reply has no descriptors).
const HelloFlagNoSockets = 2

// ZeroStatsAll is ZERO_STATS's pid asking to zero every stats file: the
// daemon's and every client's.
const ZeroStatsAll = 0

// ZeroStatsDaemon is ZERO_STATS's flag bit 0: zero the daemon's own file
// (its rings and control counters); the pid must then be 0.
const ZeroStatsDaemon = 1

// ShutdownDaemonStopping is SHUTDOWN's reason when the daemon exits. Clients
// treat any other reason the same way.
const ShutdownDaemonStopping = 1

// Code identifies a message. A reply carries the request's code | ReplyBit.
type Code uint16

// Message codes.
const (
	CodeHello      Code = 1
	CodeOpen       Code = 2
	CodeBind       Code = 3
	CodeConnect    Code = 4
	CodeSetSockOpt Code = 5
	CodeGetSockOpt Code = 6
	CodeJoin       Code = 7
	CodeLeave      Code = 8
	CodeClose      Code = 9
	// CodeSetLogLevel and CodeZeroStats are administrative requests
	// (bypass-stats -l and -z); the daemon checks the caller's uid.
	CodeSetLogLevel Code = 10
	CodeZeroStats   Code = 11
	// CodeQuery asks the daemon for a read-only JSON document on a topic
	// (bypassctl); the reply carries the document in a sealed memfd.
	CodeQuery Code = 12
	// CodeTakeover is a new bypassd asking the running one to hand it
	// everything (live upgrade, package daemon/takeover); after a
	// successful reply the connection carries the takeover stream.
	CodeTakeover Code = 13
	// CodeSetQoS sets an interface's traffic-class state (bypassctl qos,
	// mlnx_qos's settings); the daemon checks the caller's uid.
	CodeSetQoS   Code = 14
	CodeShutdown Code = 16
	// CodeSocketError tells a client that one of its sockets is dead (its
	// interface vanished); the daemon has released it already.
	CodeSocketError Code = 17
	// CodeListen makes a bound stream socket listen; CodeAccept takes one
	// of its connections as a new socket (its reply, like OPEN's, carries
	// no descriptors). Stream socket codes start at 24.
	CodeListen Code = 24
	CodeAccept Code = 25
	ReplyBit   Code = 0x8000
)

var codeNames = map[Code]string{
	CodeHello:       "HELLO",
	CodeOpen:        "OPEN",
	CodeBind:        "BIND",
	CodeConnect:     "CONNECT",
	CodeSetSockOpt:  "SETSOCKOPT",
	CodeGetSockOpt:  "GETSOCKOPT",
	CodeJoin:        "JOIN",
	CodeLeave:       "LEAVE",
	CodeClose:       "CLOSE",
	CodeSetLogLevel: "SET_LOG_LEVEL",
	CodeZeroStats:   "ZERO_STATS",
	CodeQuery:       "QUERY",
	CodeTakeover:    "TAKEOVER",
	CodeListen:      "LISTEN",
	CodeAccept:      "ACCEPT",
	CodeSetQoS:      "SET_QOS",
	CodeShutdown:    "SHUTDOWN",
	CodeSocketError: "SOCKET_ERROR",
}

// String returns the code's name ("BIND", "BIND-REPLY", "Code(0x63)").
func (c Code) String() string {
	base := c &^ ReplyBit
	name, ok := codeNames[base]
	if !ok {
		name = fmt.Sprintf("Code(%#x)", uint16(base))
	}
	if c&ReplyBit != 0 {
		return name + "-REPLY"
	}
	return name
}

// IsReply reports whether c has ReplyBit set.
func (c Code) IsReply() bool { return c&ReplyBit != 0 }

// Request returns c without ReplyBit.
func (c Code) Request() Code { return c &^ ReplyBit }

// Known reports whether c (without ReplyBit) is a code of this version.
func (c Code) Known() bool {
	_, ok := codeNames[c.Request()]
	return ok
}

// Header starts every packet.
type Header struct {
	Code    Code
	Version uint16 // Marshal writes 0 as Version and refuses any other value
	ReqID   uint32
	Status  unix.Errno // replies only: 0 or a positive errno
	Socket  uint32     // 0 = none
}

// ReplyHeader returns the header of a successful reply to h (socket id
// echoed; OPEN replies set Socket to the new id).
func ReplyHeader(h Header) Header {
	return Header{Code: h.Code | ReplyBit, Version: Version, ReqID: h.ReqID, Socket: h.Socket}
}

// ErrorReply returns the header of a failed reply to h with the given errno
// (send it with an Empty body). A zero errno becomes EIO so that a failure is
// never reported as success.
func ErrorReply(h Header, errno unix.Errno) Header {
	if errno == 0 || errno > maxErrno {
		errno = unix.EIO
	}
	r := ReplyHeader(h)
	r.Status = errno
	return r
}

// Message is one of the body types of this package. Unmarshal returns
// pointers (*Hello, *HelloReply, ...); Marshal accepts pointers or values.
type Message interface{ isMessage() }

// Hello is the HELLO request body. Build it with NewHello.
type Hello struct {
	MinVersion, MaxVersion uint16
	// Flags: HelloFlagNoStats, HelloFlagNoSockets or 0.
	Flags uint32
	Name  string // program name, informational; at most NameMax bytes, no NUL
}

// HelloReply is the HELLO reply body.
type HelloReply struct {
	Version uint16 // the version the session speaks from now on
	// Lanes is the number of lane doorbells (the daemon's rings); 0 with
	// HelloFlagNoSockets.
	Lanes             uint16
	DaemonPID         uint32
	MaxSockets        uint32 // also the session memory's slots
	DefaultQueueBytes uint32
	RXPollMicros      int32 // -1 = spin forever, 0 = never spin
	// SessionSize is the session memfd's size; 0 with HelloFlagNoSockets.
	SessionSize uint64
}

// Open is the OPEN request body.
type Open struct {
	Family     uint16 // FamilyInet or FamilyInet6
	Type       uint16 // TypeDgram
	QueueBytes uint32 // 0 = daemon default; else a power of two in [MinQueueBytes, MaxQueueBytes]
}

// OpenReply is the OPEN reply body (no descriptors); Header.Socket is
// the new socket's id.
type OpenReply struct {
	QueueBytes uint32
	// Slot is the socket's bit in the session's bitmaps, Lane the ring
	// serving it.
	Slot               uint32
	TXOffset, RXOffset uint64 // queue offsets in the session memfd
	Lane               uint16
}

// Bind is the BIND request body.
type Bind struct {
	Addr      netip.AddrPort // a valid address (wildcard: IPv4Unspecified or IPv6Unspecified); port 0 = any
	ReuseAddr bool
}

// BindReply is the BIND reply body: the address actually bound.
type BindReply struct {
	Addr netip.AddrPort
}

// Connect is the CONNECT request body. The zero AddrPort disconnects.
type Connect struct {
	Addr netip.AddrPort
}

// SetSockOpt is the SETSOCKOPT request body (Linux level and name numbers).
type SetSockOpt struct {
	Level, Name int32
	Value       []byte // at most OptionValueMax bytes
}

// GetSockOpt is the GETSOCKOPT request body.
type GetSockOpt struct {
	Level, Name int32
}

// SockOptValue is the GETSOCKOPT reply body.
type SockOptValue struct {
	Value []byte // at most OptionValueMax bytes
}

// Group is the JOIN and LEAVE request body.
type Group struct {
	Group   netip.Addr
	Source  netip.Addr // the zero Addr = any-source
	Ifindex uint32     // 0 = the socket's ring
}

// Shutdown is the body of the unsolicited SHUTDOWN message (daemon → client).
type Shutdown struct {
	Reason uint32
}

// SocketError is the SOCKET_ERROR body (daemon → client, unsolicited): the
// socket in the header is dead, for the reason Errno gives (ENETDOWN: its
// interface vanished). The daemon released it; every call on it fails, and
// the client should CLOSE it and open a new one.
type SocketError struct {
	Errno uint32
}

// LogLevel is the SET_LOG_LEVEL request body (the level to set) and its
// reply body (the level before). Levels are zap's: -1 debug, 0 info,
// 1 warn, 2 error.
type LogLevel struct {
	Level int32
}

// Log levels SET_LOG_LEVEL accepts.
const (
	LogLevelDebug = -1
	LogLevelError = 2
)

// ZeroStats is the ZERO_STATS request body: the client pid whose stats
// file is zeroed, ZeroStatsAll, or (Daemon) the daemon's own file.
type ZeroStats struct {
	PID    uint32
	Daemon bool
}

// Query is the QUERY request body: the topic asked for (TopicMax bytes at
// most, lowercase letters, digits and '-').
type Query struct {
	Topic string
}

// QueryReply is the QUERY reply body. The packet carries one file
// descriptor (FDQueryDocument): a sealed memfd whose first Size bytes are
// the topic's JSON document.
type QueryReply struct {
	Size uint64
}

// Takeover is the TAKEOVER request body: the state document versions the
// new daemon can read.
type Takeover struct {
	MinState, MaxState uint16
}

// TakeoverReply is the TAKEOVER reply body: the state document version
// the running daemon will write, and its pid.
type TakeoverReply struct {
	State     uint16
	DaemonPID uint32
}

// ListenReq is the LISTEN request body.
type ListenReq struct {
	// Backlog is how many connections may wait for ACCEPT (0: the
	// daemon's default; larger values are capped by it, as by somaxconn).
	Backlog uint32
}

// AcceptReq is the ACCEPT request body.
type AcceptReq struct {
	QueueBytes uint32 // the new socket's queues: 0 = daemon default; else as Open's
}

// AcceptReply is the ACCEPT reply body: the new socket (Header.Socket is
// its id) as OpenReply describes it, its peer and its local address. Like
// OPEN's, it carries no file descriptors.
type AcceptReply struct {
	OpenReply
	Peer, Local netip.AddrPort
}

// SetQoS is the SET_QOS request body: the whole traffic-class state of one
// interface, in the fields of qos.Config (internal/ctldoc converts). The
// codec checks the structure (NUL-padded name, enumerations, ranges); the
// daemon the semantics (shares summing to 100, ...).
type SetQoS struct {
	Interface    string
	TSA          [8]uint8 // 0 ets, 1 strict
	BW           [8]uint8
	PrioTC       [8]uint8
	SkPrioUP     [16]uint8
	DSCP2Prio    [64]uint8
	Trust        uint8 // 0 pcp, 1 dscp
	TTL          uint8
	TrafficClass int16 // -1: off
	RateKbps     [8]uint64
	MaxRateKbps  uint64
}

// IfNameMax is the size of an interface name field (IFNAMSIZ).
const IfNameMax = 16

// Empty is the body of CLOSE requests, of replies without a body and of
// every failed reply.
type Empty struct{}

func (Hello) isMessage()         {}
func (HelloReply) isMessage()    {}
func (Open) isMessage()          {}
func (OpenReply) isMessage()     {}
func (Bind) isMessage()          {}
func (BindReply) isMessage()     {}
func (Connect) isMessage()       {}
func (SetSockOpt) isMessage()    {}
func (GetSockOpt) isMessage()    {}
func (SockOptValue) isMessage()  {}
func (Group) isMessage()         {}
func (Shutdown) isMessage()      {}
func (SocketError) isMessage()   {}
func (LogLevel) isMessage()      {}
func (ZeroStats) isMessage()     {}
func (Query) isMessage()         {}
func (QueryReply) isMessage()    {}
func (Takeover) isMessage()      {}
func (SetQoS) isMessage()        {}
func (TakeoverReply) isMessage() {}
func (ListenReq) isMessage()     {}
func (AcceptReq) isMessage()     {}
func (AcceptReply) isMessage()   {}
func (Empty) isMessage()         {}

// Body sizes in bytes.
const (
	lenHello        = 40
	lenHelloReply   = 32
	lenOpen         = 8
	lenOpenReply    = 32
	lenAddrPort     = 20 // addr[16] port u16 u16
	lenSetSockOpt   = 76
	lenGetSockOpt   = 8
	lenSockOptValue = 68
	lenGroup        = 36
	lenShutdown     = 4
	lenSocketError  = 4
	lenLogLevel     = 4
	lenZeroStats    = 8
	lenQuery        = TopicMax
	lenQueryReply   = 8
	lenTakeover     = 8
	lenTakeoverRepl = 8
	lenListen       = 4
	lenAccept       = 4
	lenAcceptReply  = lenOpenReply + 2*lenAddrPort
	lenSetQoS       = 200
)

// NewHello returns a HELLO body offering exactly this package's Version,
// with name made acceptable: NUL bytes dropped and cut to NameMax bytes at a
// UTF-8 boundary.
func NewHello(name string) Hello {
	name = strings.ReplaceAll(name, "\x00", "")
	if len(name) > NameMax {
		cut := NameMax
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut-- // do not split a multi-byte rune
		}
		name = name[:cut]
	}
	return Hello{MinVersion: Version, MaxVersion: Version, Name: name}
}

// ExpectFDs returns how many file descriptors a packet with header h and
// body must carry: 2 + lanes for a successful HELLO reply with session
// memory, 1 for a successful QUERY reply, 0 for everything else.
func ExpectFDs(h Header, body Message) int {
	if h.Status != 0 {
		return 0
	}
	switch h.Code {
	case CodeHello | ReplyBit:
		if m, ok := as[HelloReply](body); ok && m.SessionSize != 0 {
			return FDDoorbell + int(m.Lanes)
		}
	case CodeQuery | ReplyBit:
		return 1
	}
	return 0
}

// Marshal appends the encoding of h and body to dst. The body's type must
// match h.Code: the request form for a request code, the reply form for
// code|ReplyBit, and Empty (or nil) for a failed reply (Status != 0), which
// may carry any code. It refuses values that Unmarshal would refuse.
func Marshal(dst []byte, h Header, body Message) ([]byte, error) {
	if h.Version == 0 {
		h.Version = Version
	}
	if body == nil {
		body = Empty{}
	}
	if h.Version != Version {
		return dst, fmt.Errorf("ctlproto: marshal %v: version %d (this package speaks only %d)", h.Code, h.Version, Version)
	}
	if err := checkHeader(h); err != nil {
		return dst, fmt.Errorf("ctlproto: marshal %v: %w", h.Code, err)
	}
	start := len(dst)
	dst = binary.LittleEndian.AppendUint16(dst, uint16(h.Code))
	dst = binary.LittleEndian.AppendUint16(dst, h.Version)
	dst = binary.LittleEndian.AppendUint32(dst, h.ReqID)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(int32(h.Status)))
	dst = binary.LittleEndian.AppendUint32(dst, h.Socket)
	out, err := appendBody(dst, h, body)
	if err != nil {
		return dst[:start], fmt.Errorf("ctlproto: marshal %v: %w", h.Code, err)
	}
	return out, nil
}

// checkHeader applies the header rules shared by Marshal and Unmarshal,
// except the version (Unmarshal reports it separately).
func checkHeader(h Header) error {
	if h.Code.IsReply() {
		if h.Status > maxErrno {
			return fmt.Errorf("status %d is not an errno (0..%d)", uint32(h.Status), maxErrno)
		}
		if h.Status != 0 {
			return nil // failed replies have a fixed form whatever the code
		}
	} else if h.Status != 0 {
		return fmt.Errorf("status %d in a request (must be 0)", uint32(h.Status))
	}
	if !h.Code.Known() || h.Code == CodeShutdown|ReplyBit || h.Code == CodeSocketError|ReplyBit {
		return ErrUnknownCode
	}
	switch h.Code {
	case CodeHello, CodeHello | ReplyBit, CodeOpen, CodeShutdown, CodeSetLogLevel, CodeSetLogLevel | ReplyBit,
		CodeZeroStats, CodeZeroStats | ReplyBit, CodeQuery, CodeQuery | ReplyBit, CodeTakeover, CodeTakeover | ReplyBit,
		CodeSetQoS, CodeSetQoS | ReplyBit:
		if h.Socket != 0 {
			return fmt.Errorf("socket id %d must be 0 for %v", h.Socket, h.Code)
		}
	case CodeOpen | ReplyBit, CodeAccept | ReplyBit:
		if h.Socket == 0 {
			return fmt.Errorf("successful %v without a socket id", h.Code)
		}
	case CodeSocketError:
		if h.Socket == 0 {
			return fmt.Errorf("SOCKET_ERROR without a socket id")
		}
	}
	return nil
}

func wrongBody(h Header, body Message) error {
	if h.Status != 0 {
		return fmt.Errorf("body %T in a failed reply (send Empty)", body)
	}
	return fmt.Errorf("body %T does not belong to %v", body, h.Code)
}

func appendBody(b []byte, h Header, body Message) ([]byte, error) {
	le := binary.LittleEndian
	if h.Code.IsReply() && h.Status != 0 {
		if !isEmpty(body) {
			return b, wrongBody(h, body)
		}
		return b, nil
	}
	switch h.Code {
	case CodeHello:
		m, ok := as[Hello](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkHello(m); err != nil {
			return b, err
		}
		b = le.AppendUint16(b, m.MinVersion)
		b = le.AppendUint16(b, m.MaxVersion)
		b = le.AppendUint32(b, m.Flags)
		var name [NameMax]byte
		copy(name[:], m.Name)
		return append(b, name[:]...), nil
	case CodeHello | ReplyBit:
		m, ok := as[HelloReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkHelloReply(m); err != nil {
			return b, err
		}
		b = le.AppendUint16(b, m.Version)
		b = le.AppendUint16(b, m.Lanes)
		b = le.AppendUint32(b, m.DaemonPID)
		b = le.AppendUint32(b, m.MaxSockets)
		b = le.AppendUint32(b, m.DefaultQueueBytes)
		b = le.AppendUint32(b, uint32(m.RXPollMicros))
		b = le.AppendUint32(b, 0)
		return le.AppendUint64(b, m.SessionSize), nil
	case CodeOpen:
		m, ok := as[Open](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkOpen(m); err != nil {
			return b, err
		}
		b = le.AppendUint16(b, m.Family)
		b = le.AppendUint16(b, m.Type)
		return le.AppendUint32(b, m.QueueBytes), nil
	case CodeOpen | ReplyBit:
		m, ok := as[OpenReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return appendOpenReply(b, m)
	case CodeAccept | ReplyBit:
		m, ok := as[AcceptReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		b, err := appendOpenReply(b, m.OpenReply)
		if err != nil {
			return b, err
		}
		if b, err = appendAddrPort(b, m.Peer, 0, false); err != nil {
			return b, err
		}
		return appendAddrPort(b, m.Local, 0, false)
	case CodeListen:
		m, ok := as[ListenReq](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return le.AppendUint32(b, m.Backlog), nil
	case CodeAccept:
		m, ok := as[AcceptReq](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if m.QueueBytes != 0 && !validQueueBytes(m.QueueBytes) {
			return b, fmt.Errorf("queue size %d (want 0 or a power of two in %d..%d)", m.QueueBytes, MinQueueBytes, MaxQueueBytes)
		}
		return le.AppendUint32(b, m.QueueBytes), nil
	case CodeBind:
		m, ok := as[Bind](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		var flags uint16
		if m.ReuseAddr {
			flags = BindReuseAddr
		}
		return appendAddrPort(b, m.Addr, flags, false)
	case CodeBind | ReplyBit, CodeListen | ReplyBit:
		m, ok := as[BindReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return appendAddrPort(b, m.Addr, 0, false)
	case CodeConnect:
		m, ok := as[Connect](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return appendAddrPort(b, m.Addr, 0, true)
	case CodeSetSockOpt:
		m, ok := as[SetSockOpt](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if len(m.Value) > OptionValueMax {
			return b, fmt.Errorf("option value of %d bytes exceeds %d", len(m.Value), OptionValueMax)
		}
		b = le.AppendUint32(b, uint32(m.Level))
		b = le.AppendUint32(b, uint32(m.Name))
		b = le.AppendUint32(b, uint32(len(m.Value)))
		var v [OptionValueMax]byte
		copy(v[:], m.Value)
		return append(b, v[:]...), nil
	case CodeGetSockOpt:
		m, ok := as[GetSockOpt](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		b = le.AppendUint32(b, uint32(m.Level))
		return le.AppendUint32(b, uint32(m.Name)), nil
	case CodeGetSockOpt | ReplyBit:
		m, ok := as[SockOptValue](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if len(m.Value) > OptionValueMax {
			return b, fmt.Errorf("option value of %d bytes exceeds %d", len(m.Value), OptionValueMax)
		}
		b = le.AppendUint32(b, uint32(len(m.Value)))
		var v [OptionValueMax]byte
		copy(v[:], m.Value)
		return append(b, v[:]...), nil
	case CodeJoin, CodeLeave:
		m, ok := as[Group](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if !m.Group.IsValid() {
			return b, fmt.Errorf("group address missing")
		}
		var err error
		if b, err = appendAddr(b, m.Group, false); err != nil {
			return b, err
		}
		if b, err = appendAddr(b, m.Source, true); err != nil {
			return b, err
		}
		return le.AppendUint32(b, m.Ifindex), nil
	case CodeShutdown:
		m, ok := as[Shutdown](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return le.AppendUint32(b, m.Reason), nil
	case CodeSocketError:
		m, ok := as[SocketError](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if m.Errno == 0 || m.Errno > maxErrno {
			return b, fmt.Errorf("SOCKET_ERROR errno %d: must be 1..%d", m.Errno, maxErrno)
		}
		return le.AppendUint32(b, m.Errno), nil
	case CodeSetLogLevel, CodeSetLogLevel | ReplyBit:
		m, ok := as[LogLevel](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkLogLevel(m); err != nil {
			return b, err
		}
		return le.AppendUint32(b, uint32(m.Level)), nil
	case CodeZeroStats:
		m, ok := as[ZeroStats](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkZeroStats(m); err != nil {
			return b, err
		}
		var flags uint32
		if m.Daemon {
			flags = ZeroStatsDaemon
		}
		b = le.AppendUint32(b, m.PID)
		return le.AppendUint32(b, flags), nil
	case CodeZeroStats | ReplyBit:
		if !isEmpty(body) {
			return b, wrongBody(h, body)
		}
		return b, nil
	case CodeQuery:
		m, ok := as[Query](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := CheckTopic(m.Topic); err != nil {
			return b, err
		}
		var topic [TopicMax]byte
		copy(topic[:], m.Topic)
		return append(b, topic[:]...), nil
	case CodeQuery | ReplyBit:
		m, ok := as[QueryReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		return le.AppendUint64(b, m.Size), nil
	case CodeTakeover:
		m, ok := as[Takeover](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkTakeover(m); err != nil {
			return b, err
		}
		b = le.AppendUint16(b, m.MinState)
		b = le.AppendUint16(b, m.MaxState)
		return le.AppendUint32(b, 0), nil
	case CodeTakeover | ReplyBit:
		m, ok := as[TakeoverReply](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if m.State == 0 {
			return b, fmt.Errorf("state version 0")
		}
		b = le.AppendUint16(b, m.State)
		b = le.AppendUint16(b, 0)
		return le.AppendUint32(b, m.DaemonPID), nil
	case CodeSetQoS:
		m, ok := as[SetQoS](body)
		if !ok {
			return b, wrongBody(h, body)
		}
		if err := checkSetQoS(m); err != nil {
			return b, err
		}
		var name [IfNameMax]byte
		copy(name[:], m.Interface)
		b = append(b, name[:]...)
		b = append(b, m.TSA[:]...)
		b = append(b, m.BW[:]...)
		b = append(b, m.PrioTC[:]...)
		b = append(b, m.SkPrioUP[:]...)
		b = append(b, m.DSCP2Prio[:]...)
		b = append(b, m.Trust, m.TTL)
		b = le.AppendUint16(b, uint16(m.TrafficClass))
		b = le.AppendUint32(b, 0)
		for _, r := range m.RateKbps {
			b = le.AppendUint64(b, r)
		}
		return le.AppendUint64(b, m.MaxRateKbps), nil
	case CodeClose, CodeConnect | ReplyBit, CodeSetSockOpt | ReplyBit, CodeJoin | ReplyBit,
		CodeLeave | ReplyBit, CodeClose | ReplyBit, CodeSetQoS | ReplyBit:
		if !isEmpty(body) {
			return b, wrongBody(h, body)
		}
		return b, nil
	}
	return b, ErrUnknownCode
}

func appendOpenReply(b []byte, m OpenReply) ([]byte, error) {
	if err := checkOpenReply(m); err != nil {
		return b, err
	}
	le := binary.LittleEndian
	b = le.AppendUint32(b, m.QueueBytes)
	b = le.AppendUint32(b, m.Slot)
	b = le.AppendUint64(b, m.TXOffset)
	b = le.AppendUint64(b, m.RXOffset)
	b = le.AppendUint16(b, m.Lane)
	b = le.AppendUint16(b, 0)
	return le.AppendUint32(b, 0), nil
}

// appendAddr writes a 16-byte address: IPv6 as is, IPv4 v4-mapped. The zero
// Addr is written as 16 zero bytes when zeroOK.
func appendAddr(b []byte, a netip.Addr, zeroOK bool) ([]byte, error) {
	if !a.IsValid() {
		if !zeroOK {
			return b, fmt.Errorf("address missing (use netip.IPv4Unspecified() or netip.IPv6Unspecified() for the wildcard)")
		}
		var z [16]byte
		return append(b, z[:]...), nil
	}
	if a.Zone() != "" {
		return b, fmt.Errorf("address %v has a zone; zones are not supported (pass the interface index instead)", a)
	}
	if a.Is4() {
		a = netip.AddrFrom16(a.As16())
	}
	a16 := a.As16()
	return append(b, a16[:]...), nil
}

func appendAddrPort(b []byte, ap netip.AddrPort, flags uint16, zeroOK bool) ([]byte, error) {
	if !ap.Addr().IsValid() && ap.Port() != 0 {
		return b, fmt.Errorf("port %d without an address", ap.Port())
	}
	b, err := appendAddr(b, ap.Addr(), zeroOK)
	if err != nil {
		return b, err
	}
	b = binary.LittleEndian.AppendUint16(b, ap.Port())
	return binary.LittleEndian.AppendUint16(b, flags), nil
}

func checkHello(m Hello) error {
	if m.Flags&^(HelloFlagNoStats|HelloFlagNoSockets) != 0 {
		return fmt.Errorf("flags %#x (only bits 0 NO_STATS and 1 NO_SOCKETS are defined)", m.Flags)
	}
	if m.MinVersion == 0 || m.MinVersion > m.MaxVersion {
		return fmt.Errorf("version range %d..%d is empty or starts at 0", m.MinVersion, m.MaxVersion)
	}
	if len(m.Name) > NameMax {
		return fmt.Errorf("program name of %d bytes exceeds %d (use NewHello)", len(m.Name), NameMax)
	}
	if strings.IndexByte(m.Name, 0) >= 0 {
		return fmt.Errorf("program name contains a NUL byte (use NewHello)")
	}
	return nil
}

// checkSetQoS checks SET_QOS's structure: a name that fits IFNAMSIZ with
// its NUL, and every enumeration and map entry in range.
func checkSetQoS(m SetQoS) error {
	if m.Interface == "" || len(m.Interface) >= IfNameMax || strings.IndexByte(m.Interface, 0) >= 0 {
		return fmt.Errorf("interface name %q: 1..%d bytes, no NUL", m.Interface, IfNameMax-1)
	}
	for i := range 8 {
		if m.TSA[i] > 1 {
			return fmt.Errorf("tc %d: algorithm %d (0 ets, 1 strict)", i, m.TSA[i])
		}
		if m.BW[i] > 100 || m.PrioTC[i] > 7 {
			return fmt.Errorf("tc %d: bandwidth %d or priority %d's tc %d out of range", i, m.BW[i], i, m.PrioTC[i])
		}
	}
	for i, up := range m.SkPrioUP {
		if up > 7 {
			return fmt.Errorf("sk_prio %d: priority %d out of range 0..7", i, up)
		}
	}
	for i, p := range m.DSCP2Prio {
		if p > 7 {
			return fmt.Errorf("dscp %d: priority %d out of range 0..7", i, p)
		}
	}
	if m.Trust > 1 || m.TrafficClass < -1 || m.TrafficClass > 255 {
		return fmt.Errorf("trust %d (0 pcp, 1 dscp) or traffic class %d (-1..255) out of range", m.Trust, m.TrafficClass)
	}
	return nil
}

func checkTakeover(m Takeover) error {
	if m.MinState == 0 || m.MinState > m.MaxState {
		return fmt.Errorf("state version range %d..%d is empty or starts at 0", m.MinState, m.MaxState)
	}
	return nil
}

func checkZeroStats(m ZeroStats) error {
	if m.Daemon && m.PID != 0 {
		return fmt.Errorf("pid %d with the DAEMON flag (the flag names the daemon's file: give pid 0)", m.PID)
	}
	return nil
}

func checkLogLevel(m LogLevel) error {
	if m.Level < LogLevelDebug || m.Level > LogLevelError {
		return fmt.Errorf("log level %d (want -1 debug, 0 info, 1 warn or 2 error)", m.Level)
	}
	return nil
}

func checkHelloReply(m HelloReply) error {
	if m.Version == 0 {
		return fmt.Errorf("version 0")
	}
	if m.RXPollMicros < -1 {
		return fmt.Errorf("rx poll %d µs (must be >= -1)", m.RXPollMicros)
	}
	if m.Lanes > MaxLanes {
		return fmt.Errorf("%d lanes (at most %d)", m.Lanes, MaxLanes)
	}
	if m.MaxSockets > MaxSlots {
		return fmt.Errorf("max sockets %d (at most %d)", m.MaxSockets, MaxSlots)
	}
	if (m.Lanes == 0) != (m.SessionSize == 0) {
		return fmt.Errorf("%d lanes with a session memory of %d bytes (both or neither must be 0)", m.Lanes, m.SessionSize)
	}
	return nil
}

func validQueueBytes(q uint32) bool {
	return q >= MinQueueBytes && q <= MaxQueueBytes && bits.OnesCount32(q) == 1
}

func checkOpen(m Open) error {
	if m.Family != FamilyInet && m.Family != FamilyInet6 {
		return fmt.Errorf("family %d (want %d AF_INET or %d AF_INET6)", m.Family, FamilyInet, FamilyInet6)
	}
	if m.Type != TypeDgram && m.Type != TypeStream {
		return fmt.Errorf("socket type %d (want %d SOCK_DGRAM or %d SOCK_STREAM)", m.Type, TypeDgram, TypeStream)
	}
	if m.QueueBytes != 0 && !validQueueBytes(m.QueueBytes) {
		return fmt.Errorf("queue size %d (want 0 or a power of two in %d..%d)", m.QueueBytes, MinQueueBytes, MaxQueueBytes)
	}
	return nil
}

// checkOpenReply checks what it can without the session: aligned,
// disjoint queues (the client checks them against its session's arena).
func checkOpenReply(m OpenReply) error {
	if !validQueueBytes(m.QueueBytes) {
		return fmt.Errorf("queue size %d (want a power of two in %d..%d)", m.QueueBytes, MinQueueBytes, MaxQueueBytes)
	}
	qs := uint64(shmq.Size(int(m.QueueBytes)))
	for _, off := range []uint64{m.TXOffset, m.RXOffset} {
		if off%8 != 0 {
			return fmt.Errorf("queue offset %d is not 8-byte aligned", off)
		}
		if off > 1<<62 {
			return fmt.Errorf("queue offset %d beyond any session memory", off)
		}
	}
	if m.Slot >= MaxSlots || m.Lane >= MaxLanes {
		return fmt.Errorf("slot %d / lane %d out of range", m.Slot, m.Lane)
	}
	lo, hi := m.TXOffset, m.RXOffset
	if lo > hi {
		lo, hi = hi, lo
	}
	if hi-lo < qs {
		return fmt.Errorf("TX queue at %d and RX queue at %d overlap (%d bytes each)", m.TXOffset, m.RXOffset, qs)
	}
	return nil
}

func isEmpty(m Message) bool {
	switch m.(type) {
	case nil, Empty, *Empty:
		return true
	}
	return false
}

// as accepts a body as a value or a non-nil pointer.
func as[T Message](m Message) (T, bool) {
	switch v := any(m).(type) {
	case T:
		return v, true
	case *T:
		if v != nil {
			return *v, true
		}
	}
	var zero T
	return zero, false
}
