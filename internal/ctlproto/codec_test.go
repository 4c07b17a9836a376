package ctlproto

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

type sample struct {
	name string
	h    Header
	body Message
}

// samples covers every code in request and reply form, with IPv4 and IPv6
// addresses; the fuzz seed corpus is generated from the same list.
func samples() []sample {
	v4 := netip.MustParseAddrPort("192.0.2.10:5001")
	v6 := netip.MustParseAddrPort("[2001:db8::7]:65535")
	return []sample{
		{"hello", Header{Code: CodeHello, ReqID: 1}, &Hello{MinVersion: 1, MaxVersion: 3, Name: "sockperf"}},
		{"hello-noname", Header{Code: CodeHello, ReqID: 1}, &Hello{MinVersion: 1, MaxVersion: 1}},
		{"hello-fullname", Header{Code: CodeHello, ReqID: 1}, &Hello{MinVersion: 1, MaxVersion: 1, Name: strings.Repeat("n", NameMax)}},
		{"hello-reply", Header{Code: CodeHello | ReplyBit, ReqID: 1}, &HelloReply{Version: 2, Lanes: 2, DaemonPID: 4242, MaxSockets: 1024, DefaultQueueBytes: 1 << 20, RXPollMicros: 100, SessionSize: 1 << 30}},
		{"hello-reply-spin", Header{Code: CodeHello | ReplyBit, ReqID: 1}, &HelloReply{Version: 2, Lanes: 64, DaemonPID: 1, MaxSockets: MaxSlots, DefaultQueueBytes: 4096, RXPollMicros: -1, SessionSize: 1 << 40}},
		{"hello-reply-tool", Header{Code: CodeHello | ReplyBit, ReqID: 1}, &HelloReply{Version: 2, DaemonPID: 1, MaxSockets: 1, DefaultQueueBytes: 4096}},
		{"open-inet", Header{Code: CodeOpen, ReqID: 2}, &Open{Family: FamilyInet, Type: TypeDgram}},
		{"open-inet6", Header{Code: CodeOpen, ReqID: 2}, &Open{Family: FamilyInet6, Type: TypeDgram, QueueBytes: MaxQueueBytes}},
		{"open-reply", Header{Code: CodeOpen | ReplyBit, ReqID: 2, Socket: 7}, &OpenReply{QueueBytes: 1 << 20, Slot: 9, TXOffset: 0x3000, RXOffset: 0x3000 + 0x101000, Lane: 1}},
		{"open-reply-swapped", Header{Code: CodeOpen | ReplyBit, ReqID: 2, Socket: 0xffffffff}, &OpenReply{QueueBytes: 4096, Slot: MaxSlots - 1, TXOffset: 8192, RXOffset: 0, Lane: MaxLanes - 1}},
		{"bind-v4", Header{Code: CodeBind, ReqID: 3, Socket: 7}, &Bind{Addr: v4, ReuseAddr: true}},
		{"bind-v6", Header{Code: CodeBind, ReqID: 3, Socket: 7}, &Bind{Addr: v6}},
		{"bind-any4", Header{Code: CodeBind, ReqID: 3, Socket: 7}, &Bind{Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), 0)}},
		{"bind-any6", Header{Code: CodeBind, ReqID: 3, Socket: 7}, &Bind{Addr: netip.AddrPortFrom(netip.IPv6Unspecified(), 0)}},
		{"bind-reply-v4", Header{Code: CodeBind | ReplyBit, ReqID: 3, Socket: 7}, &BindReply{Addr: v4}},
		{"bind-reply-v6", Header{Code: CodeBind | ReplyBit, ReqID: 3, Socket: 7}, &BindReply{Addr: v6}},
		{"connect-v4", Header{Code: CodeConnect, ReqID: 4, Socket: 7}, &Connect{Addr: v4}},
		{"connect-v6", Header{Code: CodeConnect, ReqID: 4, Socket: 7}, &Connect{Addr: v6}},
		{"disconnect", Header{Code: CodeConnect, ReqID: 4, Socket: 7}, &Connect{}},
		{"connect-reply", Header{Code: CodeConnect | ReplyBit, ReqID: 4, Socket: 7}, &Empty{}},
		{"setsockopt", Header{Code: CodeSetSockOpt, ReqID: 5, Socket: 7}, &SetSockOpt{Level: unix.IPPROTO_IP, Name: unix.IP_TOS, Value: []byte{0x10, 0, 0, 0}}},
		{"setsockopt-full", Header{Code: CodeSetSockOpt, ReqID: 5, Socket: 7}, &SetSockOpt{Level: -1, Name: -2, Value: bytes.Repeat([]byte{0xab}, OptionValueMax)}},
		{"setsockopt-empty", Header{Code: CodeSetSockOpt, ReqID: 5, Socket: 7}, &SetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_REUSEADDR, Value: []byte{}}},
		{"setsockopt-reply", Header{Code: CodeSetSockOpt | ReplyBit, ReqID: 5, Socket: 7}, &Empty{}},
		{"getsockopt", Header{Code: CodeGetSockOpt, ReqID: 6, Socket: 7}, &GetSockOpt{Level: unix.IPPROTO_IPV6, Name: unix.IPV6_TCLASS}},
		{"getsockopt-reply", Header{Code: CodeGetSockOpt | ReplyBit, ReqID: 6, Socket: 7}, &SockOptValue{Value: []byte{1, 0, 0, 0}}},
		{"join-v4-asm", Header{Code: CodeJoin, ReqID: 7, Socket: 7}, &Group{Group: netip.MustParseAddr("239.1.2.3")}},
		{"join-v4-ssm", Header{Code: CodeJoin, ReqID: 7, Socket: 7}, &Group{Group: netip.MustParseAddr("232.1.2.3"), Source: netip.MustParseAddr("192.0.2.1"), Ifindex: 3}},
		{"join-v6", Header{Code: CodeJoin, ReqID: 7, Socket: 7}, &Group{Group: netip.MustParseAddr("ff3e::1234"), Source: netip.MustParseAddr("2001:db8::1")}},
		{"join-reply", Header{Code: CodeJoin | ReplyBit, ReqID: 7, Socket: 7}, &Empty{}},
		{"leave", Header{Code: CodeLeave, ReqID: 8, Socket: 7}, &Group{Group: netip.MustParseAddr("239.1.2.3"), Ifindex: 1}},
		{"leave-reply", Header{Code: CodeLeave | ReplyBit, ReqID: 8, Socket: 7}, &Empty{}},
		{"open-stream", Header{Code: CodeOpen, ReqID: 2}, &Open{Family: FamilyInet6, Type: TypeStream}},
		{"listen", Header{Code: CodeListen, ReqID: 12, Socket: 7}, &ListenReq{Backlog: 128}},
		{"listen-reply", Header{Code: CodeListen | ReplyBit, ReqID: 12, Socket: 7}, &BindReply{Addr: v4}},
		{"accept", Header{Code: CodeAccept, ReqID: 13, Socket: 7}, &AcceptReq{QueueBytes: 1 << 16}},
		{"accept-reply", Header{Code: CodeAccept | ReplyBit, ReqID: 13, Socket: 8}, &AcceptReply{
			OpenReply: OpenReply{QueueBytes: 4096, Slot: 2, TXOffset: 0x3000, RXOffset: 0x5000, Lane: 1}, Peer: v4, Local: netip.MustParseAddrPort("192.0.2.1:80")}},
		{"close", Header{Code: CodeClose, ReqID: 9, Socket: 7}, &Empty{}},
		{"close-reply", Header{Code: CodeClose | ReplyBit, ReqID: 9, Socket: 7}, &Empty{}},
		{"shutdown", Header{Code: CodeShutdown}, &Shutdown{Reason: ShutdownDaemonStopping}},
		{"socket-error", Header{Code: CodeSocketError, Socket: 7}, &SocketError{Errno: uint32(unix.ENETDOWN)}},
		{"hello-nostats", Header{Code: CodeHello, ReqID: 1}, &Hello{MinVersion: 1, MaxVersion: 1, Flags: HelloFlagNoStats | HelloFlagNoSockets, Name: "bypass-stats"}},
		{"set-log-level", Header{Code: CodeSetLogLevel, ReqID: 11}, &LogLevel{Level: LogLevelDebug}},
		{"set-log-level-reply", Header{Code: CodeSetLogLevel | ReplyBit, ReqID: 11}, &LogLevel{Level: LogLevelError}},
		{"zero-stats", Header{Code: CodeZeroStats, ReqID: 12}, &ZeroStats{PID: 4242}},
		{"zero-stats-all", Header{Code: CodeZeroStats, ReqID: 12}, &ZeroStats{PID: ZeroStatsAll}},
		{"zero-stats-daemon", Header{Code: CodeZeroStats, ReqID: 12}, &ZeroStats{Daemon: true}},
		{"zero-stats-reply", Header{Code: CodeZeroStats | ReplyBit, ReqID: 12}, &Empty{}},
		{"query", Header{Code: CodeQuery, ReqID: 13}, &Query{Topic: "rings"}},
		{"query-fulltopic", Header{Code: CodeQuery, ReqID: 13}, &Query{Topic: strings.Repeat("a-9", TopicMax/3) + "zz"}},
		{"query-reply", Header{Code: CodeQuery | ReplyBit, ReqID: 13}, &QueryReply{Size: 1234}},
		{"takeover", Header{Code: CodeTakeover, ReqID: 14}, &Takeover{MinState: 1, MaxState: 3}},
		{"takeover-reply", Header{Code: CodeTakeover | ReplyBit, ReqID: 14}, &TakeoverReply{State: 2, DaemonPID: 4321}},
		{"set-qos", Header{Code: CodeSetQoS, ReqID: 15}, sampleSetQoS()},
		{"set-qos-reply", Header{Code: CodeSetQoS | ReplyBit, ReqID: 15}, &Empty{}},
		{"error-reply", Header{Code: CodeBind | ReplyBit, ReqID: 3, Socket: 7, Status: unix.EADDRINUSE}, &Empty{}},
		{"error-reply-unknown-code", Header{Code: 0x63 | ReplyBit, ReqID: 10, Status: unix.ENOSYS}, &Empty{}},
		{"error-reply-open", Header{Code: CodeOpen | ReplyBit, ReqID: 2, Status: unix.EMFILE}, &Empty{}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, s := range samples() {
		t.Run(s.name, func(t *testing.T) {
			b, err := Marshal(nil, s.h, s.body)
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if len(b) != HeaderLen+bodyLen(s.h) {
				t.Fatalf("encoded %d bytes, want %d", len(b), HeaderLen+bodyLen(s.h))
			}
			h, m, err := Unmarshal(b)
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			want := s.h
			want.Version = Version
			if h != want {
				t.Fatalf("header %+v, want %+v", h, want)
			}
			if !reflect.DeepEqual(m, s.body) {
				t.Fatalf("body %#v, want %#v", m, s.body)
			}
			// Values marshal like pointers.
			b2, err := Marshal(nil, s.h, reflect.ValueOf(s.body).Elem().Interface().(Message))
			if err != nil || !bytes.Equal(b, b2) {
				t.Fatalf("value form: %v, % x vs % x", err, b2, b)
			}
		})
	}
}

// TestLayout pins byte offsets documented in docs/protocol.md.
func TestLayout(t *testing.T) {
	cases := []struct {
		h    Header
		body Message
		hex  string
	}{
		{Header{Code: CodeBind, ReqID: 0x01020304, Socket: 9}, Bind{Addr: netip.MustParseAddrPort("192.0.2.1:5000"), ReuseAddr: true},
			"0300" + "0200" + "04030201" + "00000000" + "09000000" +
				"00000000000000000000ffffc0000201" + "8813" + "0100"},
		{Header{Code: CodeOpen | ReplyBit, ReqID: 2, Socket: 5}, OpenReply{QueueBytes: 4096, Slot: 3, TXOffset: 0x3000, RXOffset: 0x5000},
			"0280" + "0200" + "02000000" + "00000000" + "05000000" +
				"00100000" + "03000000" + "0030000000000000" + "0050000000000000" + "0000" + "0000" + "00000000"},
		{Header{Code: CodeHello | ReplyBit, ReqID: 1}, HelloReply{Version: 2, Lanes: 1, DaemonPID: 1234, MaxSockets: 16384, DefaultQueueBytes: 1 << 20, SessionSize: 1073754112},
			"0180" + "0200" + "01000000" + "00000000" + "00000000" +
				"0200" + "0100" + "d2040000" + "00400000" + "00001000" + "00000000" + "00000000" + "0030004000000000"},
		{Header{Code: CodeGetSockOpt | ReplyBit, ReqID: 6, Socket: 1, Status: unix.ENOPROTOOPT}, nil,
			"0680" + "0200" + "06000000" + "5c000000" + "01000000"},
		{Header{Code: CodeHello, ReqID: 1}, Hello{MinVersion: 1, MaxVersion: 2, Name: "ab"},
			"0100" + "0200" + "01000000" + "00000000" + "00000000" +
				"0100" + "0200" + "00000000" + "6162" + strings.Repeat("00", 30)},
		{Header{Code: CodeSetLogLevel, ReqID: 5}, LogLevel{Level: LogLevelDebug},
			"0a00" + "0200" + "05000000" + "00000000" + "00000000" + "ffffffff"},
		{Header{Code: CodeZeroStats, ReqID: 6}, ZeroStats{PID: 4242},
			"0b00" + "0200" + "06000000" + "00000000" + "00000000" + "92100000" + "00000000"},
		{Header{Code: CodeZeroStats, ReqID: 7}, ZeroStats{Daemon: true},
			"0b00" + "0200" + "07000000" + "00000000" + "00000000" + "00000000" + "01000000"},
		{Header{Code: CodeQuery, ReqID: 8}, Query{Topic: "rings"},
			"0c00" + "0200" + "08000000" + "00000000" + "00000000" + "72696e6773" + strings.Repeat("00", 27)},
		{Header{Code: CodeQuery | ReplyBit, ReqID: 8}, QueryReply{Size: 0x1234},
			"0c80" + "0200" + "08000000" + "00000000" + "00000000" + "3412000000000000"},
		{Header{Code: CodeTakeover, ReqID: 9}, Takeover{MinState: 1, MaxState: 2},
			"0d00" + "0200" + "09000000" + "00000000" + "00000000" + "0100" + "0200" + "00000000"},
		{Header{Code: CodeTakeover | ReplyBit, ReqID: 9}, TakeoverReply{State: 1, DaemonPID: 0x1234},
			"0d80" + "0200" + "09000000" + "00000000" + "00000000" + "0100" + "0000" + "34120000"},
		{Header{Code: CodeListen, ReqID: 9, Socket: 3}, ListenReq{Backlog: 128},
			"1800" + "0200" + "09000000" + "00000000" + "03000000" + "80000000"},
		{Header{Code: CodeAccept, ReqID: 10, Socket: 3}, AcceptReq{},
			"1900" + "0200" + "0a000000" + "00000000" + "03000000" + "00000000"},
		{Header{Code: CodeAccept | ReplyBit, ReqID: 10, Socket: 4}, AcceptReply{
			OpenReply: OpenReply{QueueBytes: 4096, Slot: 3, TXOffset: 0x3000, RXOffset: 0x5000, Lane: 1},
			Peer:      netip.MustParseAddrPort("192.0.2.2:40000"), Local: netip.MustParseAddrPort("192.0.2.1:80")},
			"1980" + "0200" + "0a000000" + "00000000" + "04000000" +
				"00100000" + "03000000" + "0030000000000000" + "0050000000000000" + "0100" + "0000" + "00000000" +
				"00000000000000000000ffffc0000202" + "409c" + "0000" +
				"00000000000000000000ffffc0000201" + "5000" + "0000"},
		{Header{Code: CodeSetQoS, ReqID: 10}, *sampleSetQoS(),
			"0e00" + "0200" + "0a000000" + "00000000" + "00000000" +
				"657468300000000000000000" + "00000000" + // "eth0"
				"0000010000000000" + "1e46000000000000" + "0001010102020200" + // tsa, tcbw, prio_tc
				"00010203040506070000000000000000" + strings.Repeat("00", 30) + "0200" + strings.Repeat("00", 32) + // skprio_up, dscp2prio (30 -> 2)
				"01" + "07" + "6000" + "00000000" + // trust dscp, ttl 7, traffic class 96
				"c0c62d0000000000" + "00093d0000000000" + "80841e0000000000" + strings.Repeat("00", 40) + // 3, 4, 2 Gbit/s
				"a086010000000000"}, // maxrate 100 Mbit/s
	}
	for _, c := range cases {
		b, err := Marshal(nil, c.h, c.body)
		if err != nil {
			t.Fatalf("%v: %v", c.h.Code, err)
		}
		if got := hex.EncodeToString(b); got != c.hex {
			t.Errorf("%v:\n got %s\nwant %s", c.h.Code, got, c.hex)
		}
	}
}

func TestMarshalAppends(t *testing.T) {
	prefix := []byte("xyz")
	b, err := Marshal(prefix, Header{Code: CodeClose, ReqID: 1, Socket: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(b[:3]) != "xyz" || len(b) != 3+HeaderLen {
		t.Fatalf("got % x", b)
	}
	// A failed Marshal leaves dst as it was.
	b, err = Marshal(prefix, Header{Code: CodeBind, Socket: 1}, Bind{})
	if err == nil || len(b) != 3 {
		t.Fatalf("got %v, % x", err, b)
	}
}

func TestMarshalRefuses(t *testing.T) {
	cases := []struct {
		name string
		h    Header
		body Message
	}{
		{"wrong body", Header{Code: CodeBind, Socket: 1}, Connect{}},
		{"nil pointer body", Header{Code: CodeBind, Socket: 1}, (*Bind)(nil)},
		{"body in error reply", Header{Code: CodeBind | ReplyBit, Status: unix.EINVAL}, BindReply{}},
		{"body in close", Header{Code: CodeClose, Socket: 1}, Shutdown{}},
		{"missing body", Header{Code: CodeShutdown}, nil},
		{"unknown code", Header{Code: 0x63}, Empty{}},
		{"other version", Header{Code: CodeClose, Version: 1, Socket: 1}, Empty{}},
		{"shutdown reply", Header{Code: CodeShutdown | ReplyBit}, Empty{}},
		{"status in request", Header{Code: CodeClose, Status: unix.EINVAL, Socket: 1}, Empty{}},
		{"status too big", Header{Code: CodeClose | ReplyBit, Status: 5000}, Empty{}},
		{"socket in hello", Header{Code: CodeHello, Socket: 1}, NewHello("x")},
		{"socket in open", Header{Code: CodeOpen, Socket: 1}, Open{Family: FamilyInet, Type: TypeDgram}},
		{"open reply without socket", Header{Code: CodeOpen | ReplyBit}, OpenReply{QueueBytes: 4096, RXOffset: 8192}},
		{"long name", Header{Code: CodeHello}, Hello{MinVersion: 1, MaxVersion: 1, Name: strings.Repeat("x", NameMax+1)}},
		{"NUL in name", Header{Code: CodeHello}, Hello{MinVersion: 1, MaxVersion: 1, Name: "a\x00b"}},
		{"version 0", Header{Code: CodeHello}, Hello{MinVersion: 0, MaxVersion: 1}},
		{"empty version range", Header{Code: CodeHello}, Hello{MinVersion: 2, MaxVersion: 1}},
		{"reply version 0", Header{Code: CodeHello | ReplyBit}, HelloReply{}},
		{"rx poll -2", Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, RXPollMicros: -2}},
		{"unknown hello flag", Header{Code: CodeHello}, Hello{MinVersion: 1, MaxVersion: 1, Flags: 4}},
		{"log level 5", Header{Code: CodeSetLogLevel}, LogLevel{Level: 5}},
		{"socket in zero-stats", Header{Code: CodeZeroStats, Socket: 3}, ZeroStats{}},
		{"zero-stats daemon with pid", Header{Code: CodeZeroStats}, ZeroStats{PID: 5, Daemon: true}},
		{"body in zero-stats reply", Header{Code: CodeZeroStats | ReplyBit}, ZeroStats{}},
		{"empty topic", Header{Code: CodeQuery}, Query{}},
		{"long topic", Header{Code: CodeQuery}, Query{Topic: strings.Repeat("a", TopicMax+1)}},
		{"uppercase topic", Header{Code: CodeQuery}, Query{Topic: "Rings"}},
		{"socket in query", Header{Code: CodeQuery, Socket: 2}, Query{Topic: "rings"}},
		{"takeover state 0", Header{Code: CodeTakeover}, Takeover{MaxState: 1}},
		{"takeover empty range", Header{Code: CodeTakeover}, Takeover{MinState: 2, MaxState: 1}},
		{"takeover reply state 0", Header{Code: CodeTakeover | ReplyBit}, TakeoverReply{DaemonPID: 1}},
		{"set-qos no name", Header{Code: CodeSetQoS}, SetQoS{}},
		{"set-qos long name", Header{Code: CodeSetQoS}, SetQoS{Interface: strings.Repeat("e", IfNameMax)}},
		{"set-qos tsa 2", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", TSA: [8]uint8{2}}},
		{"set-qos tc 8", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", PrioTC: [8]uint8{8}}},
		{"set-qos bw 101", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", BW: [8]uint8{101}}},
		{"set-qos up 8", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", SkPrioUP: [16]uint8{15: 8}}},
		{"set-qos dscp prio 8", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", DSCP2Prio: [64]uint8{63: 8}}},
		{"set-qos trust 2", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", Trust: 2}},
		{"set-qos tclass -2", Header{Code: CodeSetQoS}, SetQoS{Interface: "eth0", TrafficClass: -2}},
		{"socket in set-qos", Header{Code: CodeSetQoS, Socket: 1}, SetQoS{Interface: "eth0"}},
		{"bad family", Header{Code: CodeOpen}, Open{Family: 1, Type: TypeDgram}},
		{"bad type", Header{Code: CodeOpen}, Open{Family: FamilyInet, Type: unix.SOCK_RAW}},
		{"queue not pow2", Header{Code: CodeOpen}, Open{Family: FamilyInet, Type: TypeDgram, QueueBytes: 5000}},
		{"queue too small", Header{Code: CodeOpen}, Open{Family: FamilyInet, Type: TypeDgram, QueueBytes: 2048}},
		{"queue too big", Header{Code: CodeOpen}, Open{Family: FamilyInet, Type: TypeDgram, QueueBytes: 32 << 20}},
		{"overlapping queues", Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, TXOffset: 0, RXOffset: 4096}},
		{"offset overflow", Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, TXOffset: 0, RXOffset: ^uint64(0) - 7}},
		{"misaligned offset", Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, TXOffset: 0, RXOffset: 4356}},
		{"slot out of range", Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, RXOffset: 8192, Slot: MaxSlots}},
		{"lane out of range", Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{QueueBytes: 4096, RXOffset: 8192, Lane: MaxLanes}},
		{"hello reply lanes without session", Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, Lanes: 1}},
		{"hello reply session without lanes", Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, SessionSize: 1 << 20}},
		{"hello reply too many lanes", Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, Lanes: MaxLanes + 1, SessionSize: 1 << 20}},
		{"hello reply too many sockets", Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, MaxSockets: MaxSlots + 1}},
		{"bind without address", Header{Code: CodeBind, Socket: 1}, Bind{}},
		{"bind zone", Header{Code: CodeBind, Socket: 1}, Bind{Addr: netip.MustParseAddrPort("[fe80::1%eth0]:1")}},
		{"connect port without address", Header{Code: CodeConnect, Socket: 1}, Connect{Addr: netip.AddrPortFrom(netip.Addr{}, 5)}},
		{"oversized option", Header{Code: CodeSetSockOpt, Socket: 1}, SetSockOpt{Value: make([]byte, OptionValueMax+1)}},
		{"oversized option reply", Header{Code: CodeGetSockOpt | ReplyBit, Socket: 1}, SockOptValue{Value: make([]byte, OptionValueMax+1)}},
		{"group missing", Header{Code: CodeJoin, Socket: 1}, Group{}},
	}
	for _, c := range cases {
		if b, err := Marshal(nil, c.h, c.body); err == nil {
			t.Errorf("%s: Marshal accepted it: % x", c.name, b)
		}
	}
}

// valid returns the encoding of a sample by name.
func valid(t *testing.T, name string) []byte {
	t.Helper()
	for _, s := range samples() {
		if s.name == name {
			b, err := Marshal(nil, s.h, s.body)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
	}
	t.Fatalf("no sample %q", name)
	return nil
}

func TestUnmarshalRefuses(t *testing.T) {
	le := binary.LittleEndian
	mut := func(name string, f func(b []byte) []byte) func(t *testing.T) []byte {
		return func(t *testing.T) []byte { return f(valid(t, name)) }
	}
	set16 := func(off int, v uint16) func([]byte) []byte {
		return func(b []byte) []byte { le.PutUint16(b[off:], v); return b }
	}
	set32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { le.PutUint32(b[off:], v); return b }
	}
	set8 := func(off int, v byte) func([]byte) []byte {
		return func(b []byte) []byte { b[off] = v; return b }
	}
	const H = HeaderLen
	cases := []struct {
		name   string
		packet func(t *testing.T) []byte
		want   error
		errno  unix.Errno
		header bool // the header is returned
	}{
		{"empty", func(*testing.T) []byte { return nil }, ErrShort, unix.EINVAL, false},
		{"short header", mut("close", func(b []byte) []byte { return b[:H-1] }), ErrShort, unix.EINVAL, false},
		{"short body", mut("bind-v4", func(b []byte) []byte { return b[:len(b)-1] }), ErrMalformed, unix.EINVAL, true},
		{"long body", mut("bind-v4", func(b []byte) []byte { return append(b, 0) }), ErrMalformed, unix.EINVAL, true},
		{"body on close", mut("close", func(b []byte) []byte { return append(b, 0, 0, 0, 0) }), ErrMalformed, unix.EINVAL, true},
		{"body on error reply", mut("error-reply", func(b []byte) []byte { return append(b, make([]byte, 20)...) }), ErrMalformed, unix.EINVAL, true},
		{"over max", mut("close", func(b []byte) []byte { return append(b, make([]byte, MaxMessage)...) }), ErrMalformed, unix.EINVAL, true},
		{"version 0", mut("close", set16(2, 0)), ErrVersion, unix.EPROTONOSUPPORT, true},
		{"version 1", mut("hello", set16(2, 1)), ErrVersion, unix.EPROTONOSUPPORT, true},
		{"version 3", mut("close", set16(2, 3)), ErrVersion, unix.EPROTONOSUPPORT, true},
		{"unknown code", mut("close", set16(0, 0x63)), ErrUnknownCode, unix.ENOSYS, true},
		{"code 0", mut("close", set16(0, 0)), ErrUnknownCode, unix.ENOSYS, true},
		{"shutdown reply", mut("shutdown", set16(0, uint16(CodeShutdown|ReplyBit))), ErrUnknownCode, unix.ENOSYS, true},
		{"status in request", mut("close", set32(8, 22)), ErrMalformed, unix.EINVAL, true},
		{"negative status", mut("close-reply", set32(8, 0xffffffff)), ErrMalformed, unix.EINVAL, true},
		{"status beyond errno range", mut("close-reply", set32(8, 4096)), ErrMalformed, unix.EINVAL, true},
		{"socket in hello", mut("hello", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"socket in open", mut("open-inet", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"socket in shutdown", mut("shutdown", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"socket-error reply", mut("socket-error", set16(0, uint16(CodeSocketError|ReplyBit))), ErrUnknownCode, unix.ENOSYS, true},
		{"socket-error without socket", mut("socket-error", set32(12, 0)), ErrMalformed, unix.EINVAL, true},
		{"socket-error errno 0", mut("socket-error", set32(H, 0)), ErrMalformed, unix.EINVAL, true},
		{"socket-error errno beyond range", mut("socket-error", set32(H, 4096)), ErrMalformed, unix.EINVAL, true},
		{"open reply without socket", mut("open-reply", set32(12, 0)), ErrMalformed, unix.EINVAL, true},
		{"hello flags", mut("hello", set8(H+4, 4)), ErrMalformed, unix.EINVAL, true},
		{"log level -2", mut("set-log-level", set32(H, 0xfffffffe)), ErrMalformed, unix.EINVAL, true},
		{"log level 3", mut("set-log-level-reply", set32(H, 3)), ErrMalformed, unix.EINVAL, true},
		{"socket in set-log-level", mut("set-log-level", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"socket in zero-stats", mut("zero-stats", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"zero-stats flags", mut("zero-stats", set8(H+4, 2)), ErrMalformed, unix.EINVAL, true},
		{"zero-stats daemon with pid", mut("zero-stats", set8(H+4, 1)), ErrMalformed, unix.EINVAL, true},
		{"body on zero-stats reply", mut("zero-stats-reply", func(b []byte) []byte { return append(b, 0, 0, 0, 0) }), ErrMalformed, unix.EINVAL, true},
		{"query topic not NUL padded", mut("query", set8(H+TopicMax-1, 'x')), ErrMalformed, unix.EINVAL, true},
		{"query empty topic", mut("query", set8(H, 0)), ErrMalformed, unix.EINVAL, true},
		{"query topic with a space", mut("query", set8(H+1, ' ')), ErrMalformed, unix.EINVAL, true},
		{"socket in query", mut("query", set32(12, 1)), ErrMalformed, unix.EINVAL, true},
		{"hello min 0", mut("hello", set16(H, 0)), ErrMalformed, unix.EINVAL, true},
		{"hello min > max", mut("hello", set16(H, 4)), ErrMalformed, unix.EINVAL, true},
		{"hello name not NUL padded", mut("hello", set8(H+8+NameMax-1, 'x')), ErrMalformed, unix.EINVAL, true},
		{"hello reply reserved", mut("hello-reply", set32(H+20, 1)), ErrMalformed, unix.EINVAL, true},
		{"hello reply lanes", mut("hello-reply", set16(H+2, MaxLanes+1)), ErrMalformed, unix.EINVAL, true},
		{"hello reply version 0", mut("hello-reply", set16(H, 0)), ErrMalformed, unix.EINVAL, true},
		{"hello reply rx poll -2", mut("hello-reply", set32(H+16, 0xfffffffe)), ErrMalformed, unix.EINVAL, true},
		{"bad family", mut("open-inet", set16(H, 1)), ErrMalformed, unix.EINVAL, true},
		{"bad type", mut("open-inet", set16(H+2, unix.SOCK_RAW)), ErrMalformed, unix.EINVAL, true},
		{"bad queue size", mut("open-inet", set32(H+4, 12345)), ErrMalformed, unix.EINVAL, true},
		{"open reply reserved", mut("open-reply", set32(H+28, 1)), ErrMalformed, unix.EINVAL, true},
		{"open reply reserved 16", mut("open-reply", set16(H+26, 1)), ErrMalformed, unix.EINVAL, true},
		{"open reply queue size 0", mut("open-reply", set32(H, 0)), ErrMalformed, unix.EINVAL, true},
		{"open reply overlap", mut("open-reply", set32(H+8, 0x3000+0x100000)), ErrMalformed, unix.EINVAL, true},
		{"bind flags", mut("bind-v4", set16(H+18, 2)), ErrMalformed, unix.EINVAL, true},
		{"bind reply reserved", mut("bind-reply-v4", set16(H+18, 1)), ErrMalformed, unix.EINVAL, true},
		{"connect reserved", mut("connect-v4", set16(H+18, 1)), ErrMalformed, unix.EINVAL, true},
		{"disconnect with port", mut("disconnect", set16(H+16, 80)), ErrMalformed, unix.EINVAL, true},
		{"oversized option", mut("setsockopt", set32(H+8, OptionValueMax+1)), ErrMalformed, unix.EINVAL, true},
		{"option padding", mut("setsockopt", set8(H+12+OptionValueMax-1, 1)), ErrMalformed, unix.EINVAL, true},
		{"oversized option reply", mut("getsockopt-reply", set32(H, 0xffffffff)), ErrMalformed, unix.EINVAL, true},
		{"option reply padding", mut("getsockopt-reply", set8(H+4+OptionValueMax-1, 1)), ErrMalformed, unix.EINVAL, true},
		{"join short", mut("join-v4-asm", func(b []byte) []byte { return b[:len(b)-4] }), ErrMalformed, unix.EINVAL, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.packet(t)
			h, m, err := Unmarshal(b)
			if !errors.Is(err, c.want) {
				t.Fatalf("err %v, want %v", err, c.want)
			}
			if !errors.Is(err, c.errno) || Errno(err) != c.errno {
				t.Fatalf("err %v: errno %v, want %v", err, Errno(err), c.errno)
			}
			if m != nil {
				t.Fatalf("body %#v returned with an error", m)
			}
			if c.header && h.ReqID != le.Uint32(b[4:]) {
				t.Fatalf("request id %d not returned (packet % x)", h.ReqID, b)
			}
		})
	}
}

func TestAddresses(t *testing.T) {
	// v4-mapped on the wire, unmapped when decoded.
	b := valid(t, "bind-v4")
	if !bytes.Equal(b[HeaderLen:HeaderLen+16], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 10}) {
		t.Fatalf("v4 address encoded as % x", b[HeaderLen:HeaderLen+16])
	}
	// A v4-mapped IPv6 address given by the caller decodes unmapped too.
	mapped := netip.AddrPortFrom(netip.MustParseAddr("::ffff:192.0.2.10"), 5001)
	b2, err := Marshal(nil, Header{Code: CodeBind, ReqID: 3, Socket: 7}, Bind{Addr: mapped, ReuseAddr: true})
	if err != nil || !bytes.Equal(b, b2) {
		t.Fatalf("mapped: %v", err)
	}
	_, m, err := Unmarshal(b2)
	if err != nil || !m.(*Bind).Addr.Addr().Is4() {
		t.Fatalf("decoded %v, %v", m, err)
	}
	// The IPv4 and IPv6 wildcards stay distinct.
	_, m4, _ := Unmarshal(valid(t, "bind-any4"))
	_, m6, _ := Unmarshal(valid(t, "bind-any6"))
	if m4.(*Bind).Addr.Addr() != netip.IPv4Unspecified() || m6.(*Bind).Addr.Addr() != netip.IPv6Unspecified() {
		t.Fatalf("wildcards: %v %v", m4, m6)
	}
	// Any-source decodes to the zero Addr, :: as a source too.
	_, g, _ := Unmarshal(valid(t, "join-v4-asm"))
	if g.(*Group).Source.IsValid() {
		t.Fatalf("source %v, want zero", g.(*Group).Source)
	}
}

func TestNewHello(t *testing.T) {
	cases := map[string]string{
		"sockperf":                          "sockperf",
		"a\x00b":                            "ab",
		strings.Repeat("x", 40):             strings.Repeat("x", NameMax),
		strings.Repeat("x", 31) + "é":       strings.Repeat("x", 31), // 2-byte rune cut at byte 32
		strings.Repeat("x", 30) + "é" + "y": strings.Repeat("x", 30) + "é",
	}
	for in, want := range cases {
		h := NewHello(in)
		if h.Name != want || h.MinVersion != Version || h.MaxVersion != Version {
			t.Errorf("NewHello(%q) = %+v, want name %q", in, h, want)
		}
		if _, err := Marshal(nil, Header{Code: CodeHello}, h); err != nil {
			t.Errorf("NewHello(%q): %v", in, err)
		}
	}
}

func TestCodeString(t *testing.T) {
	cases := map[Code]string{
		CodeBind:                   "BIND",
		CodeBind | ReplyBit:        "BIND-REPLY",
		CodeShutdown:               "SHUTDOWN",
		CodeZeroStats:              "ZERO_STATS",
		CodeSetLogLevel | ReplyBit: "SET_LOG_LEVEL-REPLY",
		0x63:                       "Code(0x63)",
		0x63 | ReplyBit:            "Code(0x63)-REPLY",
	}
	for c, want := range cases {
		if got := c.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint16(c), got, want)
		}
	}
}

func TestReplyHeaders(t *testing.T) {
	req := Header{Code: CodeBind, Version: Version, ReqID: 77, Socket: 3}
	if r := ReplyHeader(req); r != (Header{Code: CodeBind | ReplyBit, Version: Version, ReqID: 77, Socket: 3}) {
		t.Fatalf("ReplyHeader: %+v", r)
	}
	if r := ErrorReply(req, unix.EACCES); r.Status != unix.EACCES || r.Code != CodeBind|ReplyBit || r.ReqID != 77 {
		t.Fatalf("ErrorReply: %+v", r)
	}
	if r := ErrorReply(req, 0); r.Status != unix.EIO {
		t.Fatalf("ErrorReply(0): %+v", r)
	}
	// An unknown request is answered with its own code and ENOSYS.
	h, _, err := Unmarshal(valid(t, "error-reply-unknown-code")[:HeaderLen])
	if err != nil || h.Status != unix.ENOSYS {
		t.Fatalf("error reply to unknown code: %+v %v", h, err)
	}
	if _, err := Marshal(nil, ErrorReply(Header{Code: 0x63, ReqID: 1}, unix.ENOSYS), nil); err != nil {
		t.Fatal(err)
	}
}

func TestErrno(t *testing.T) {
	if Errno(nil) != 0 {
		t.Fatal("nil")
	}
	if Errno(errors.New("x")) != unix.EIO {
		t.Fatal("plain error")
	}
	if Errno(unix.EADDRINUSE) != unix.EADDRINUSE {
		t.Fatal("errno")
	}
	_, _, err := Unmarshal(valid(t, "hello")[:3])
	if Errno(err) != unix.EINVAL {
		t.Fatal(err)
	}
}

func sampleSetQoS() *SetQoS {
	m := &SetQoS{Interface: "eth0", TSA: [8]uint8{0, 0, 1}, BW: [8]uint8{30, 70},
		PrioTC: [8]uint8{0, 1, 1, 1, 2, 2, 2}, SkPrioUP: [16]uint8{0, 1, 2, 3, 4, 5, 6, 7},
		Trust: 1, TTL: 7, TrafficClass: 96, RateKbps: [8]uint64{3e6, 4e6, 2e6}, MaxRateKbps: 1e5}
	m.DSCP2Prio[30] = 2
	return m
}
