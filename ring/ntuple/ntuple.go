// Package ntuple programs a NIC's receive flow rules, ethtool's n-tuple
// filters (`ethtool -N IF flow-type udp4 dst-ip A dst-port P action Q`),
// over the SIOCETHTOOL ioctl: ETHTOOL_SRXCLSRLINS inserts a rule,
// ETHTOOL_SRXCLSRLDEL deletes one, ETHTOOL_GRXCLSRLALL and
// ETHTOOL_GRXCLSRULE list them. A rule sends a flow's frames to one receive
// queue, whatever RSS would have chosen: the AF_XDP analogue of VMA's
// ibv_create_flow per ring.
//
// The request is struct ethtool_rxnfc of linux/ethtool.h, 192 bytes, laid
// out here byte by byte (host byte order for the numbers, network order for
// addresses and ports, as the kernel expects); TestEncodeMatchesKernelHeaders
// compares the encoding with what a C program built against the kernel's
// headers produces.
//
// The package does not decide which flows get rules or which queue (the
// ring's steering does), and it does not keep rules across a crash: the
// caller records what it inserted (Location) to delete it later. Drivers
// without flow rules (veth, virtio_net) answer EOPNOTSUPP: Supported says so.
package ntuple

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Sizes and offsets of struct ethtool_rxnfc and its struct
// ethtool_rx_flow_spec fs (linux/ethtool.h).
const (
	rxnfcSize        = 192
	offCmd           = 0
	offFlowType      = 4 // rxnfc.flow_type (unused by rule commands)
	offData          = 8 // rxnfc.data: the table size for GRXCLSRLCNT/ALL
	offFS            = 16
	offRuleCnt       = 184
	offRuleLocs      = 188
	fsFlowType       = offFS + 0
	fsHU             = offFS + 4   // union ethtool_flow_union h_u (52 bytes)
	fsMU             = offFS + 76  // m_u: 1 bits are matched
	fsRingCookie     = offFS + 152 // the queue (action)
	fsLocation       = offFS + 160
	ip4Src, ip4Dst   = 0, 4 // within ethtool_tcpip4_spec
	ip4PSrc, ip4PDst = 8, 10
	ip6Src, ip6Dst   = 0, 16 // within ethtool_tcpip6_spec
	ip6PSrc, ip6PDst = 32, 34
)

// ethtool commands and flow types.
const (
	cmdGetCount  = 0x2e // ETHTOOL_GRXCLSRLCNT
	cmdGetRule   = 0x2f // ETHTOOL_GRXCLSRULE
	cmdGetAll    = 0x30 // ETHTOOL_GRXCLSRLALL
	cmdDelete    = 0x31 // ETHTOOL_SRXCLSRLDEL
	cmdInsert    = 0x32 // ETHTOOL_SRXCLSRLINS
	flowTCP4     = 0x01
	flowUDP4     = 0x02
	flowTCP6     = 0x05
	flowUDP6     = 0x06
	flowTypeMask = 0xff // FLOW_EXT, FLOW_MAC_EXT, FLOW_RSS are flags above it

	// LocationAny asks the driver to choose where the rule goes
	// (RX_CLS_LOC_ANY); Insert returns the location it chose.
	LocationAny = 0xffffffff
)

// Rule steers one flow to a receive queue.
type Rule struct {
	// Proto is unix.IPPROTO_UDP or unix.IPPROTO_TCP.
	Proto uint8
	// Dst is the local address and port; Src the peer's, zero for any.
	Dst, Src netip.AddrPort
	// Queue is the receive queue the flow's frames go to.
	Queue uint32
	// Location is the rule's slot in the NIC's table (LocationAny on
	// insert: the driver picks).
	Location uint32
}

func (r Rule) String() string {
	proto := "udp"
	if r.Proto == unix.IPPROTO_TCP {
		proto = "tcp"
	}
	src := "any"
	if r.Src.IsValid() {
		src = r.Src.String()
	}
	return fmt.Sprintf("%s %s from %s to queue %d", proto, r.Dst, src, r.Queue)
}

// encodeInsert lays r out as an ETHTOOL_SRXCLSRLINS request.
func (r Rule) encodeInsert() ([]byte, error) {
	b := make([]byte, rxnfcSize)
	ne := binary.NativeEndian
	ne.PutUint32(b[offCmd:], cmdInsert)
	dst := r.Dst.Addr().Unmap()
	if !r.Dst.IsValid() || dst.IsUnspecified() || r.Dst.Port() == 0 {
		return nil, fmt.Errorf("ntuple: rule %s: a concrete destination address and port are required", r)
	}
	src := r.Src.Addr().Unmap()
	if r.Src.IsValid() && src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("ntuple: rule %s: source and destination must be of one family", r)
	}
	var ft uint32
	switch {
	case r.Proto == unix.IPPROTO_UDP && dst.Is4():
		ft = flowUDP4
	case r.Proto == unix.IPPROTO_UDP:
		ft = flowUDP6
	case r.Proto == unix.IPPROTO_TCP && dst.Is4():
		ft = flowTCP4
	case r.Proto == unix.IPPROTO_TCP:
		ft = flowTCP6
	default:
		return nil, fmt.Errorf("ntuple: rule %s: protocol %d: only UDP and TCP", r, r.Proto)
	}
	ne.PutUint32(b[fsFlowType:], ft)
	h, m := b[fsHU:fsHU+52], b[fsMU:fsMU+52]
	put := func(off int, v []byte) {
		copy(h[off:], v)
		for i := range v {
			m[off+i] = 0xff
		}
	}
	port := func(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }
	if dst.Is4() {
		a := dst.As4()
		put(ip4Dst, a[:])
		put(ip4PDst, port(r.Dst.Port()))
		if r.Src.IsValid() {
			s := src.As4()
			put(ip4Src, s[:])
			put(ip4PSrc, port(r.Src.Port()))
		}
	} else {
		a := dst.As16()
		put(ip6Dst, a[:])
		put(ip6PDst, port(r.Dst.Port()))
		if r.Src.IsValid() {
			s := src.As16()
			put(ip6Src, s[:])
			put(ip6PSrc, port(r.Src.Port()))
		}
	}
	ne.PutUint64(b[fsRingCookie:], uint64(r.Queue))
	ne.PutUint32(b[fsLocation:], r.Location)
	return b, nil
}

// decodeRule reads the rule of a GRXCLSRULE answer. ok is false for a rule
// this package does not write (another flow type, masks on other fields, a
// drop or RSS-context action): someone else's.
func decodeRule(b []byte) (r Rule, ok bool) {
	ne := binary.NativeEndian
	ft := ne.Uint32(b[fsFlowType:])
	if ft&^flowTypeMask != 0 {
		return Rule{}, false
	}
	h, m := b[fsHU:fsHU+52], b[fsMU:fsMU+52]
	full := func(off, n int) bool {
		for _, x := range m[off : off+n] {
			if x != 0xff {
				return false
			}
		}
		return true
	}
	empty := func(off, n int) bool {
		for _, x := range m[off : off+n] {
			if x != 0 {
				return false
			}
		}
		return true
	}
	var v4 bool
	switch ft {
	case flowUDP4, flowTCP4:
		v4 = true
		r.Proto = unix.IPPROTO_UDP
		if ft == flowTCP4 {
			r.Proto = unix.IPPROTO_TCP
		}
	case flowUDP6, flowTCP6:
		r.Proto = unix.IPPROTO_UDP
		if ft == flowTCP6 {
			r.Proto = unix.IPPROTO_TCP
		}
	default:
		return Rule{}, false
	}
	cookie := ne.Uint64(b[fsRingCookie:])
	if cookie > 0xffffffff {
		return Rule{}, false // drop (RX_CLS_FLOW_DISC), a VF, or an RSS context
	}
	r.Queue, r.Location = uint32(cookie), ne.Uint32(b[fsLocation:])
	if v4 {
		if !full(ip4Dst, 4) || !full(ip4PDst, 2) || m[12] != 0 {
			return Rule{}, false
		}
		r.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(h[ip4Dst:ip4Dst+4])), binary.BigEndian.Uint16(h[ip4PDst:]))
		switch {
		case full(ip4Src, 4) && full(ip4PSrc, 2):
			r.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(h[ip4Src:ip4Src+4])), binary.BigEndian.Uint16(h[ip4PSrc:]))
		case !empty(ip4Src, 4) || !empty(ip4PSrc, 2):
			return Rule{}, false
		}
		return r, empty(16, 36)
	}
	if !full(ip6Dst, 16) || !full(ip6PDst, 2) || m[36] != 0 {
		return Rule{}, false
	}
	r.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(h[ip6Dst:ip6Dst+16])), binary.BigEndian.Uint16(h[ip6PDst:]))
	switch {
	case full(ip6Src, 16) && full(ip6PSrc, 2):
		r.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(h[ip6Src:ip6Src+16])), binary.BigEndian.Uint16(h[ip6PSrc:]))
	case !empty(ip6Src, 16) || !empty(ip6PSrc, 2):
		return Rule{}, false
	}
	return r, empty(40, 12)
}

// Device is one interface's flow rule table, reached in the network
// namespace of the thread that opened it.
type Device struct {
	name string
	fd   int
}

// Open returns the interface's rule table. It fails only when no socket
// can be made; whether the driver has rules at all is Supported's answer.
func Open(ifname string) (*Device, error) {
	if ifname == "" || len(ifname) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("ntuple: invalid interface name %q", ifname)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ntuple: socket for ethtool: %w", err)
	}
	return &Device{name: ifname, fd: fd}, nil
}

// Close releases the device's socket (the rules stay).
func (d *Device) Close() error { return unix.Close(d.fd) }

// ifreqPtr is struct ifreq with its union used as a pointer (ifr_data).
type ifreqPtr struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [unsafe.Sizeof(unix.Ifreq{}) - unix.IFNAMSIZ - unsafe.Sizeof(uintptr(0))]byte
}

func (d *Device) ioctl(b []byte) error {
	var ifr ifreqPtr
	copy(ifr.name[:], d.name)
	ifr.data = unsafe.Pointer(&b[0])
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(b)
	if errno != 0 {
		return errno
	}
	return nil
}

// ErrUnsupported is returned (wrapped) when the driver has no flow rules
// or they are off (`ethtool -K IF ntuple off`).
var ErrUnsupported = errors.New("the driver has no n-tuple flow rules, or they are off")

func (d *Device) wrap(op string, err error) error {
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSUP) {
		return fmt.Errorf("ntuple: %s on %s: %w (turn them on with `ethtool -K %s ntuple on` where the NIC has them): %w", op, d.name, ErrUnsupported, d.name, err)
	}
	return fmt.Errorf("ntuple: %s on %s: %w", op, d.name, err)
}

// count returns the rule count and the table size.
func (d *Device) count() (n, size uint32, err error) {
	b := make([]byte, rxnfcSize)
	binary.NativeEndian.PutUint32(b[offCmd:], cmdGetCount)
	if err := d.ioctl(b); err != nil {
		return 0, 0, d.wrap("count rules", err)
	}
	return binary.NativeEndian.Uint32(b[offRuleCnt:]), binary.NativeEndian.Uint32(b[offData:]), nil
}

// Supported reports nil when the interface's driver takes flow rules.
func (d *Device) Supported() error {
	_, _, err := d.count()
	return err
}

// Insert installs r and returns the location it got.
func (d *Device) Insert(r Rule) (uint32, error) {
	b, err := r.encodeInsert()
	if err != nil {
		return 0, err
	}
	if err := d.ioctl(b); err != nil {
		return 0, d.wrap("insert rule "+r.String(), err)
	}
	return binary.NativeEndian.Uint32(b[fsLocation:]), nil
}

// Delete removes the rule at loc.
func (d *Device) Delete(loc uint32) error {
	b := encodeDelete(loc)
	if err := d.ioctl(b); err != nil {
		return d.wrap(fmt.Sprintf("delete rule %d", loc), err)
	}
	return nil
}

func encodeDelete(loc uint32) []byte {
	b := make([]byte, rxnfcSize)
	binary.NativeEndian.PutUint32(b[offCmd:], cmdDelete)
	binary.NativeEndian.PutUint32(b[fsLocation:], loc)
	return b
}

// List returns the rules this package could have written (others' rules,
// such as drop rules, are left out).
func (d *Device) List() ([]Rule, error) {
	n, _, err := d.count()
	if err != nil {
		return nil, err
	}
	b := make([]byte, offRuleLocs+4*int(n)+4)
	ne := binary.NativeEndian
	ne.PutUint32(b[offCmd:], cmdGetAll)
	ne.PutUint32(b[offRuleCnt:], n)
	if err := d.ioctl(b); err != nil {
		return nil, d.wrap("list rules", err)
	}
	n = min(n, ne.Uint32(b[offRuleCnt:]))
	var out []Rule
	for i := range n {
		loc := ne.Uint32(b[offRuleLocs+4*int(i):])
		q := make([]byte, rxnfcSize)
		ne.PutUint32(q[offCmd:], cmdGetRule)
		ne.PutUint32(q[fsLocation:], loc)
		if err := d.ioctl(q); err != nil {
			return nil, d.wrap(fmt.Sprintf("read rule %d", loc), err)
		}
		if r, ok := decodeRule(q); ok {
			out = append(out, r)
		}
	}
	return out, nil
}
