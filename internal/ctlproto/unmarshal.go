package ctlproto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Unmarshal decodes one packet. The returned body is a pointer to the type
// that belongs to the header's code (see Marshal). Errors wrap ErrShort,
// ErrVersion, ErrUnknownCode or ErrMalformed; for every error but ErrShort
// the Header is returned as decoded so that the daemon can echo its request
// id. Decoded addresses are unmapped (IPv4 as 4-byte netip.Addr); the body
// shares no memory with b.
func Unmarshal(b []byte) (Header, Message, error) {
	if len(b) < HeaderLen {
		return Header{}, nil, fmt.Errorf("%w (%d bytes)", ErrShort, len(b))
	}
	le := binary.LittleEndian
	h := Header{
		Code:    Code(le.Uint16(b[0:])),
		Version: le.Uint16(b[2:]),
		ReqID:   le.Uint32(b[4:]),
		Socket:  le.Uint32(b[12:]),
	}
	status := int32(le.Uint32(b[8:]))
	if h.Version != Version {
		return h, nil, fmt.Errorf("%w: peer speaks version %d, this side %d", ErrVersion, h.Version, Version)
	}
	if status < 0 {
		return h, nil, fmt.Errorf("%w: %v: negative status %d", ErrMalformed, h.Code, status)
	}
	h.Status = unix.Errno(status)
	if len(b) > MaxMessage {
		return h, nil, fmt.Errorf("%w: %v: %d bytes exceed the %d-byte maximum", ErrMalformed, h.Code, len(b), MaxMessage)
	}
	if err := checkHeader(h); err != nil {
		if err == ErrUnknownCode {
			return h, nil, fmt.Errorf("%w %#x", ErrUnknownCode, uint16(h.Code))
		}
		return h, nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	m, err := decodeBody(h, b[HeaderLen:])
	if err != nil {
		return h, nil, fmt.Errorf("%w: %v: %v", ErrMalformed, h.Code, err)
	}
	return h, m, nil
}

// bodyLen returns the fixed body length for a header that passed checkHeader.
func bodyLen(h Header) int {
	if h.Code.IsReply() && h.Status != 0 {
		return 0
	}
	switch h.Code {
	case CodeHello:
		return lenHello
	case CodeHello | ReplyBit:
		return lenHelloReply
	case CodeOpen:
		return lenOpen
	case CodeOpen | ReplyBit:
		return lenOpenReply
	case CodeBind, CodeBind | ReplyBit, CodeConnect, CodeListen | ReplyBit:
		return lenAddrPort
	case CodeListen:
		return lenListen
	case CodeAccept:
		return lenAccept
	case CodeAccept | ReplyBit:
		return lenAcceptReply
	case CodeSetSockOpt:
		return lenSetSockOpt
	case CodeGetSockOpt:
		return lenGetSockOpt
	case CodeGetSockOpt | ReplyBit:
		return lenSockOptValue
	case CodeJoin, CodeLeave:
		return lenGroup
	case CodeShutdown:
		return lenShutdown
	case CodeSocketError:
		return lenSocketError
	case CodeSetLogLevel, CodeSetLogLevel | ReplyBit:
		return lenLogLevel
	case CodeZeroStats:
		return lenZeroStats
	case CodeQuery:
		return lenQuery
	case CodeQuery | ReplyBit:
		return lenQueryReply
	case CodeTakeover:
		return lenTakeover
	case CodeTakeover | ReplyBit:
		return lenTakeoverRepl
	case CodeSetQoS:
		return lenSetQoS
	}
	return 0
}

func decodeBody(h Header, b []byte) (Message, error) {
	if want := bodyLen(h); len(b) != want {
		return nil, fmt.Errorf("body of %d bytes, want %d", len(b), want)
	}
	le := binary.LittleEndian
	if h.Code.IsReply() && h.Status != 0 {
		return &Empty{}, nil
	}
	switch h.Code {
	case CodeHello:
		name := b[8 : 8+NameMax]
		n := bytes.IndexByte(name, 0)
		if n < 0 {
			n = NameMax
		}
		for _, c := range name[n:] {
			if c != 0 {
				return nil, fmt.Errorf("program name is not NUL padded")
			}
		}
		m := &Hello{MinVersion: le.Uint16(b[0:]), MaxVersion: le.Uint16(b[2:]), Flags: le.Uint32(b[4:]), Name: string(name[:n])}
		return m, checkHello(*m)
	case CodeHello | ReplyBit:
		if r := le.Uint32(b[20:]); r != 0 {
			return nil, fmt.Errorf("reserved field %#x (must be 0)", r)
		}
		m := &HelloReply{
			Version:           le.Uint16(b[0:]),
			Lanes:             le.Uint16(b[2:]),
			DaemonPID:         le.Uint32(b[4:]),
			MaxSockets:        le.Uint32(b[8:]),
			DefaultQueueBytes: le.Uint32(b[12:]),
			RXPollMicros:      int32(le.Uint32(b[16:])),
			SessionSize:       le.Uint64(b[24:]),
		}
		return m, checkHelloReply(*m)
	case CodeOpen:
		m := &Open{Family: le.Uint16(b[0:]), Type: le.Uint16(b[2:]), QueueBytes: le.Uint32(b[4:])}
		return m, checkOpen(*m)
	case CodeOpen | ReplyBit:
		m, err := decodeOpenReply(b)
		return &m, err
	case CodeAccept | ReplyBit:
		or, err := decodeOpenReply(b[:lenOpenReply])
		if err != nil {
			return nil, err
		}
		m := &AcceptReply{OpenReply: or}
		var f1, f2 uint16
		m.Peer, f1 = decodeAddrPort(b[lenOpenReply:], false)
		m.Local, f2 = decodeAddrPort(b[lenOpenReply+lenAddrPort:], false)
		if f1 != 0 || f2 != 0 {
			return nil, fmt.Errorf("reserved field %#x/%#x (must be 0)", f1, f2)
		}
		return m, nil
	case CodeListen:
		return &ListenReq{Backlog: le.Uint32(b)}, nil
	case CodeAccept:
		m := &AcceptReq{QueueBytes: le.Uint32(b)}
		if m.QueueBytes != 0 && !validQueueBytes(m.QueueBytes) {
			return nil, fmt.Errorf("queue size %d (want 0 or a power of two in %d..%d)", m.QueueBytes, MinQueueBytes, MaxQueueBytes)
		}
		return m, nil
	case CodeBind:
		ap, flags := decodeAddrPort(b, false)
		if flags&^BindReuseAddr != 0 {
			return nil, fmt.Errorf("flags %#x (only bit 0 REUSEADDR is defined)", flags)
		}
		return &Bind{Addr: ap, ReuseAddr: flags&BindReuseAddr != 0}, nil
	case CodeBind | ReplyBit, CodeListen | ReplyBit:
		ap, flags := decodeAddrPort(b, false)
		if flags != 0 {
			return nil, fmt.Errorf("reserved field %#x (must be 0)", flags)
		}
		return &BindReply{Addr: ap}, nil
	case CodeConnect:
		ap, flags := decodeAddrPort(b, true)
		if flags != 0 {
			return nil, fmt.Errorf("reserved field %#x (must be 0)", flags)
		}
		if !ap.Addr().IsValid() && ap.Port() != 0 {
			return nil, fmt.Errorf("port %d with an all-zero address", ap.Port())
		}
		return &Connect{Addr: ap}, nil
	case CodeSetSockOpt:
		n := le.Uint32(b[8:])
		v, err := decodeOptValue(n, b[12:])
		if err != nil {
			return nil, err
		}
		return &SetSockOpt{Level: int32(le.Uint32(b[0:])), Name: int32(le.Uint32(b[4:])), Value: v}, nil
	case CodeGetSockOpt:
		return &GetSockOpt{Level: int32(le.Uint32(b[0:])), Name: int32(le.Uint32(b[4:]))}, nil
	case CodeGetSockOpt | ReplyBit:
		v, err := decodeOptValue(le.Uint32(b[0:]), b[4:])
		if err != nil {
			return nil, err
		}
		return &SockOptValue{Value: v}, nil
	case CodeJoin, CodeLeave:
		g := decodeAddr(b[0:16], false)
		return &Group{Group: g, Source: decodeAddr(b[16:32], true), Ifindex: le.Uint32(b[32:])}, nil
	case CodeShutdown:
		return &Shutdown{Reason: le.Uint32(b[0:])}, nil
	case CodeSocketError:
		e := le.Uint32(b[0:])
		if e == 0 || e > maxErrno {
			return nil, fmt.Errorf("SOCKET_ERROR errno %d: must be 1..%d", e, maxErrno)
		}
		return &SocketError{Errno: e}, nil
	case CodeSetLogLevel, CodeSetLogLevel | ReplyBit:
		m := &LogLevel{Level: int32(le.Uint32(b[0:]))}
		return m, checkLogLevel(*m)
	case CodeZeroStats:
		flags := le.Uint32(b[4:])
		if flags&^ZeroStatsDaemon != 0 {
			return nil, fmt.Errorf("flags %#x (only bit 0 DAEMON is defined)", flags)
		}
		m := &ZeroStats{PID: le.Uint32(b[0:]), Daemon: flags&ZeroStatsDaemon != 0}
		return m, checkZeroStats(*m)
	case CodeQuery:
		n := bytes.IndexByte(b, 0)
		if n < 0 {
			n = TopicMax
		}
		for _, c := range b[n:] {
			if c != 0 {
				return nil, fmt.Errorf("topic is not NUL padded")
			}
		}
		m := &Query{Topic: string(b[:n])}
		return m, CheckTopic(m.Topic)
	case CodeQuery | ReplyBit:
		return &QueryReply{Size: le.Uint64(b[0:])}, nil
	case CodeTakeover:
		if r := le.Uint32(b[4:]); r != 0 {
			return nil, fmt.Errorf("reserved field %#x (must be 0)", r)
		}
		m := &Takeover{MinState: le.Uint16(b[0:]), MaxState: le.Uint16(b[2:])}
		return m, checkTakeover(*m)
	case CodeTakeover | ReplyBit:
		if r := le.Uint16(b[2:]); r != 0 {
			return nil, fmt.Errorf("reserved field %#x (must be 0)", r)
		}
		m := &TakeoverReply{State: le.Uint16(b[0:]), DaemonPID: le.Uint32(b[4:])}
		if m.State == 0 {
			return nil, fmt.Errorf("state version 0")
		}
		return m, nil
	case CodeSetQoS:
		return decodeSetQoS(b)
	case CodeClose, CodeZeroStats | ReplyBit, CodeConnect | ReplyBit, CodeSetSockOpt | ReplyBit, CodeJoin | ReplyBit, CodeSetQoS | ReplyBit,
		CodeLeave | ReplyBit, CodeClose | ReplyBit:
		return &Empty{}, nil
	}
	return nil, fmt.Errorf("no body layout") // unreachable after checkHeader
}

func decodeOpenReply(b []byte) (OpenReply, error) {
	le := binary.LittleEndian
	if r := uint64(le.Uint16(b[26:])) | uint64(le.Uint32(b[28:])); r != 0 {
		return OpenReply{}, fmt.Errorf("reserved field %#x (must be 0)", r)
	}
	m := OpenReply{QueueBytes: le.Uint32(b[0:]), Slot: le.Uint32(b[4:]), TXOffset: le.Uint64(b[8:]), RXOffset: le.Uint64(b[16:]), Lane: le.Uint16(b[24:])}
	return m, checkOpenReply(m)
}

// decodeAddr reads a 16-byte address, unmapping v4-mapped ones. All zeros
// decode to the zero Addr when zeroIsNone, else to "::".
func decodeAddr(b []byte, zeroIsNone bool) netip.Addr {
	a := netip.AddrFrom16([16]byte(b[:16]))
	if zeroIsNone && a == netip.IPv6Unspecified() {
		return netip.Addr{}
	}
	return a.Unmap()
}

func decodeAddrPort(b []byte, zeroIsNone bool) (netip.AddrPort, uint16) {
	a := decodeAddr(b[0:16], zeroIsNone)
	port := binary.LittleEndian.Uint16(b[16:])
	flags := binary.LittleEndian.Uint16(b[18:])
	if !a.IsValid() {
		// Keep the port so the caller can refuse "no address, some port".
		return netip.AddrPortFrom(netip.Addr{}, port), flags
	}
	return netip.AddrPortFrom(a, port), flags
}

func decodeOptValue(n uint32, v []byte) ([]byte, error) {
	if n > OptionValueMax {
		return nil, fmt.Errorf("option length %d exceeds %d", n, OptionValueMax)
	}
	for _, c := range v[n:] {
		if c != 0 {
			return nil, fmt.Errorf("option value bytes beyond its length %d are not zero", n)
		}
	}
	return bytes.Clone(v[:n:n]), nil
}

func decodeSetQoS(b []byte) (Message, error) {
	le := binary.LittleEndian
	name := b[:IfNameMax]
	n := bytes.IndexByte(name, 0)
	if n < 0 {
		return nil, fmt.Errorf("interface name is not NUL terminated")
	}
	for _, c := range name[n:] {
		if c != 0 {
			return nil, fmt.Errorf("interface name is not NUL padded")
		}
	}
	m := &SetQoS{Interface: string(name[:n])}
	p := b[IfNameMax:]
	p = p[copy(m.TSA[:], p):]
	p = p[copy(m.BW[:], p):]
	p = p[copy(m.PrioTC[:], p):]
	p = p[copy(m.SkPrioUP[:], p):]
	p = p[copy(m.DSCP2Prio[:], p):]
	m.Trust, m.TTL = p[0], p[1]
	m.TrafficClass = int16(le.Uint16(p[2:]))
	if r := le.Uint32(p[4:]); r != 0 {
		return nil, fmt.Errorf("reserved field %#x (must be 0)", r)
	}
	p = p[8:]
	for i := range m.RateKbps {
		m.RateKbps[i] = le.Uint64(p[8*i:])
	}
	m.MaxRateKbps = le.Uint64(p[64:])
	return m, checkSetQoS(*m)
}
