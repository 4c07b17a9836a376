package netlab

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Prefix starts the name of every namespace the lab creates. Sweep and
// Destroy never touch a namespace without it.
const Prefix = "bdlab-"

// Defaults applied to zero Options fields.
const (
	DefaultMTU    = 1500
	defaultQueues = 1
	maxQueues     = 4096 // the kernel's limit for a device's queue count
	minMTU        = 1280 // IPv6 minimum: both families are always configured
	maxMTU        = 65535
)

// readyTimeout bounds the wait for the kernel to bring the links up; it is a
// safety net against hangs, not a performance assertion.
const readyTimeout = 10 * time.Second

// Link is one end of a veth pair.
type Link struct {
	NS    *NS
	Name  string // interface name inside NS (<= 15 chars, unique)
	Index int
	MAC   net.HardwareAddr
	IPv4  netip.Prefix // e.g. 10.201.7.1/24
	IPv6  netip.Prefix // e.g. fd00:bd:7::1/64 (nodad so it is usable immediately)
	MTU   int
}

// Addr4 returns the link's IPv4 address.
func (l *Link) Addr4() netip.Addr { return l.IPv4.Addr() }

// Addr6 returns the link's IPv6 address.
func (l *Link) Addr6() netip.Addr { return l.IPv6.Addr() }

// Pair is two namespaces A and B joined by one veth pair (A <-> B), both ends
// up with addresses, and lo up in both namespaces. Neighbour resolution
// (ARP/ND) is real unless Options.StaticNeigh is set. DAD and router
// solicitations are off, but the kernel still sends a few IPv6 MLD reports
// when the link comes up (and ARP/ND without StaticNeigh): code that counts
// frames on the link should filter by protocol and port.
type Pair struct {
	A, B *Link

	mu  sync.Mutex
	nss []*NS // namespaces to delete on Close, in creation order
}

// Options configure a Pair. The zero value is a sensible default.
type Options struct {
	// MTU of both ends; 0 means 1500. Must be 1280..65535.
	MTU int
	// TxChecksum keeps veth's TX checksum offload on. By default it is
	// turned off on both ends so frames carry complete checksums like a real
	// NIC's (with offload on, XDP/AF_XDP see partial checksums).
	TxChecksum bool
	// RxQueues and TxQueues are the veth queue counts of both ends;
	// 0 means 1.
	RxQueues, TxQueues int
	// StaticNeigh installs permanent neighbour entries (ARP and ND) for the
	// other end, so no resolution traffic appears on the link.
	StaticNeigh bool
	// Name, if set, names the namespaces bdlab-<Name>-a and -b instead of
	// encoding the pid, and derives addresses and MACs from it, so scripts get
	// stable values. Such pairs are never removed by Sweep; use Destroy.
	// Must match [A-Za-z][A-Za-z0-9_.-]{0,31}.
	Name string
}

var nameRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_.-]{0,31}$`)

// ValidName reports whether name is acceptable as Options.Name.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("netlab: invalid lab name %q: use 1-32 characters from [A-Za-z0-9_.-], starting with a letter", name)
	}
	return nil
}

func (o Options) normalized() (Options, error) {
	if o.MTU == 0 {
		o.MTU = DefaultMTU
	}
	if o.MTU < minMTU || o.MTU > maxMTU {
		return o, fmt.Errorf("netlab: MTU %d out of range: use %d..%d (IPv6 needs at least %d)", o.MTU, minMTU, maxMTU, minMTU)
	}
	if o.RxQueues == 0 {
		o.RxQueues = defaultQueues
	}
	if o.TxQueues == 0 {
		o.TxQueues = defaultQueues
	}
	if o.RxQueues < 1 || o.RxQueues > maxQueues || o.TxQueues < 1 || o.TxQueues > maxQueues {
		return o, fmt.Errorf("netlab: queue counts rx=%d tx=%d out of range: use 1..%d", o.RxQueues, o.TxQueues, maxQueues)
	}
	if o.Name != "" {
		if err := ValidName(o.Name); err != nil {
			return o, err
		}
	}
	return o, nil
}

// pairSeq numbers the pairs of this process.
var pairSeq atomic.Uint32

// identity is everything derived from a pair's number.
type identity struct {
	nsA, nsB string
	ifA, ifB string
	k        uint32 // selects subnets and MACs
}

func newIdentity(name string) identity {
	pid := os.Getpid()
	if name != "" {
		h := fnv.New32a()
		h.Write([]byte(name))
		k := h.Sum32()
		base := "bd" + strconv.FormatUint(uint64(k), 36)
		return identity{
			nsA: Prefix + name + "-a", nsB: Prefix + name + "-b",
			ifA: base + "a", ifB: base + "b",
			k: k,
		}
	}
	n := pairSeq.Add(1) - 1
	// The pid in the interface names keeps them unique across processes,
	// which helps when reading kernel logs; the pid in the namespace names is
	// what Sweep relies on.
	base := "bd" + strconv.FormatUint(uint64(pid), 36) + "-" + strconv.FormatUint(uint64(n%(36*36*36*36*36*36)), 36)
	return identity{
		nsA: fmt.Sprintf("%s%d-%d-a", Prefix, pid, n),
		nsB: fmt.Sprintf("%s%d-%d-b", Prefix, pid, n),
		ifA: base + "a", ifB: base + "b",
		// Seeded by the pid so concurrent test binaries rarely share subnets.
		k: uint32(pid)*16 + n,
	}
}

// addrs returns the IPv4 and IPv6 prefixes of end (1 = A, 2 = B) for k:
// 10.<200+(k/256)%50>.<k%256>.end/24 and fd00:bd:<k%65536>::end/64.
func addrs(k uint32, end byte) (netip.Prefix, netip.Prefix) {
	v4 := netip.AddrFrom4([4]byte{10, byte(200 + (k/256)%50), byte(k % 256), end})
	v6 := netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0xbd, byte(k >> 8), byte(k), 15: end})
	return netip.PrefixFrom(v4, 24), netip.PrefixFrom(v6, 64)
}

// mac returns a locally administered unicast MAC for end (1 = A, 2 = B).
func mac(k uint32, end byte) net.HardwareAddr {
	return net.HardwareAddr{0x02, 0xbd, byte(k >> 16), byte(k >> 8), byte(k), end}
}

// NewPair creates a pair for a test and registers a cleanup that removes
// everything, also when the test fails or panics. It calls RequirePriv.
func NewPair(tb testing.TB, opts Options) *Pair {
	tb.Helper()
	RequirePriv(tb)
	p, err := CreatePair(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := p.Close(); err != nil {
			tb.Errorf("netlab: cleanup of %s/%s: %v", p.A.NS.Name, p.B.NS.Name, err)
		}
	})
	return p
}

// sweepOnce runs one best-effort Sweep per process before the first pair,
// so namespaces abandoned by killed test binaries (e.g. a -timeout panic,
// which skips cleanups) do not pile up. Its error is deliberately ignored:
// leftovers must not fail an unrelated test; call Sweep to see errors.
var sweepOnce sync.Once

// CreatePair creates a pair for scripts, benchmarks and demos. The caller
// must call Close. On error nothing is left behind.
func CreatePair(opts Options) (*Pair, error) {
	o, err := opts.normalized()
	if err != nil {
		return nil, err
	}
	if ok, reason := Privileged(); !ok {
		return nil, errors.New(reason)
	}
	sweepOnce.Do(func() { _ = Sweep() })

	for attempt := 1; ; attempt++ {
		p := &Pair{}
		err := p.build(newIdentity(o.Name), o)
		if err == nil {
			return p, nil
		}
		err = errors.Join(err, p.Close())
		// An unnamed pair's name can only exist already if a dead process
		// had our pid (pids wrap) and left it behind while its pid is ours,
		// so Sweep cannot take it: skip to the next number rather than
		// deleting something we did not create.
		if o.Name != "" || !errors.Is(err, errNSExists) || attempt >= maxNameAttempts {
			return nil, err
		}
	}
}

// maxNameAttempts bounds the skipping of stale names in CreatePair.
const maxNameAttempts = 64

func (p *Pair) build(id identity, o Options) error {
	nsA, err := openNS(id.nsA)
	if err != nil {
		return err
	}
	p.nss = append(p.nss, nsA)
	nsB, err := openNS(id.nsB)
	if err != nil {
		return err
	}
	p.nss = append(p.nss, nsB)

	v4A, v6A := addrs(id.k, 1)
	v4B, v6B := addrs(id.k, 2)
	p.A = &Link{NS: nsA, Name: id.ifA, MAC: mac(id.k, 1), IPv4: v4A, IPv6: v6A, MTU: o.MTU}
	p.B = &Link{NS: nsB, Name: id.ifB, MAC: mac(id.k, 2), IPv4: v4B, IPv6: v6B, MTU: o.MTU}

	for _, ns := range p.nss {
		if err := prepareNS(ns); err != nil {
			return err
		}
	}

	// Create the veth inside A with its peer directly in B: neither end ever
	// exists in the root namespace, so its names cannot clash there.
	attrs := netlink.NewLinkAttrs()
	attrs.Name = p.A.Name
	attrs.MTU = o.MTU
	attrs.HardwareAddr = p.A.MAC
	attrs.NumTxQueues = o.TxQueues
	attrs.NumRxQueues = o.RxQueues
	veth := &netlink.Veth{
		LinkAttrs:        attrs,
		PeerName:         p.B.Name,
		PeerHardwareAddr: p.B.MAC,
		PeerNamespace:    netlink.NsFd(nsB.Handle()),
		PeerTxQLen:       -1,
		PeerNumTxQueues:  uint32(o.TxQueues),
		PeerNumRxQueues:  uint32(o.RxQueues),
		PeerMTU:          uint32(o.MTU),
	}
	if err := nsA.Netlink().LinkAdd(veth); err != nil {
		return fmt.Errorf("netlab: create veth %s (peer %s in %s) in %s: %w", p.A.Name, p.B.Name, nsB.Name, nsA.Name, err)
	}

	for _, l := range []*Link{p.A, p.B} {
		if err := configureLink(l, o); err != nil {
			return err
		}
	}
	for _, l := range []*Link{p.A, p.B} {
		if err := l.NS.Netlink().LinkSetUp(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: l.Index}}); err != nil {
			return fmt.Errorf("netlab: set %s up in %s: %w", l.Name, l.NS.Name, err)
		}
	}
	if o.StaticNeigh {
		if err := addStaticNeigh(p.A, p.B); err != nil {
			return err
		}
		if err := addStaticNeigh(p.B, p.A); err != nil {
			return err
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for _, c := range [][2]*Link{{p.A, p.B}, {p.B, p.A}} {
		if err := waitReady(c[0], c[1], deadline); err != nil {
			return err
		}
	}
	return nil
}

// prepareNS brings lo up and sets IPv6 defaults before the veth appears, so
// the veth inherits them: no DAD (addresses usable at once) and no router
// solicitations (no unexpected frames on the link).
func prepareNS(ns *NS) error {
	err := ns.Do(func() error {
		for _, s := range []struct{ key, val string }{
			{"net/ipv6/conf/all/accept_dad", "0"},
			{"net/ipv6/conf/default/accept_dad", "0"},
			{"net/ipv6/conf/all/accept_ra", "0"},
			{"net/ipv6/conf/default/accept_ra", "0"},
		} {
			// /proc/sys/net follows the netns of the opening thread.
			p := filepath.Join("/proc/sys", s.key)
			if err := os.WriteFile(p, []byte(s.val), 0o644); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("%s missing: IPv6 seems disabled in this kernel (ipv6.disable=1?); the lab needs IPv6", p)
				}
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("netlab: set sysctls in %s: %w", ns.Name, err)
	}
	lo, err := ns.Netlink().LinkByName("lo")
	if err != nil {
		return fmt.Errorf("netlab: find lo in %s: %w", ns.Name, err)
	}
	if err := ns.Netlink().LinkSetUp(lo); err != nil {
		return fmt.Errorf("netlab: set lo up in %s: %w", ns.Name, err)
	}
	return nil
}

// configureLink looks up the link, sets TX checksum offload and adds the
// addresses. The link is still down.
func configureLink(l *Link, o Options) error {
	nl := l.NS.Netlink()
	link, err := nl.LinkByName(l.Name)
	if err != nil {
		return fmt.Errorf("netlab: find %s in %s: %w", l.Name, l.NS.Name, err)
	}
	l.Index = link.Attrs().Index
	err = l.NS.Do(func() error { return setTxChecksum(l.Name, o.TxChecksum) })
	if err != nil {
		return err
	}
	for _, a := range []struct {
		pfx   netip.Prefix
		flags int
	}{
		{l.IPv4, 0},
		{l.IPv6, unix.IFA_F_NODAD},
	} {
		addr := &netlink.Addr{IPNet: prefixNet(a.pfx), Flags: a.flags}
		if err := nl.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("netlab: add address %s to %s in %s: %w", a.pfx, l.Name, l.NS.Name, err)
		}
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// addStaticNeigh makes l know peer's MAC permanently for both families.
func addStaticNeigh(l, peer *Link) error {
	for _, a := range []struct {
		ip  netip.Addr
		fam int
	}{
		{peer.Addr4(), netlink.FAMILY_V4},
		{peer.Addr6(), netlink.FAMILY_V6},
	} {
		n := &netlink.Neigh{
			LinkIndex:    l.Index,
			Family:       a.fam,
			State:        netlink.NUD_PERMANENT,
			IP:           a.ip.AsSlice(),
			HardwareAddr: peer.MAC,
		}
		if err := l.NS.Netlink().NeighAdd(n); err != nil {
			return fmt.Errorf("netlab: add neighbour %s -> %s on %s in %s: %w", a.ip, peer.MAC, l.Name, l.NS.Name, err)
		}
	}
	return nil
}

// waitReady waits until the kernel can carry traffic over l: the link is
// operationally up (until then it has no active qdisc and drops what is
// sent), and the routes for l's own addresses (type local) and for the
// peer's exist. IPv6 installs the local route from a workqueue even for
// nodad addresses; a packet arriving before that is dropped as an address
// error.
func waitReady(l, peer *Link, deadline time.Time) error {
	nl := l.NS.Netlink()
	for {
		why, err := notReady(nl, l, peer)
		if err != nil {
			return err
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("netlab: %s in %s not ready after %v: %s; inspect with `ip netns exec %s ip addr; ip netns exec %s ip route show table all`", l.Name, l.NS.Name, readyTimeout, why, l.NS.Name, l.NS.Name)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// notReady returns why l is not ready yet, or "" if it is.
func notReady(nl *netlink.Handle, l, peer *Link) (string, error) {
	link, err := nl.LinkByIndex(l.Index)
	if err != nil {
		return "", fmt.Errorf("netlab: query %s in %s: %w", l.Name, l.NS.Name, err)
	}
	if st := link.Attrs().OperState; st != netlink.OperUp {
		return "operstate " + st.String(), nil
	}
	for _, c := range []struct {
		dst   netip.Addr
		local bool
	}{
		{l.Addr4(), true}, {l.Addr6(), true},
		{peer.Addr4(), false}, {peer.Addr6(), false},
	} {
		routes, err := nl.RouteGet(c.dst.AsSlice())
		if err != nil {
			if errors.Is(err, unix.ENETUNREACH) || errors.Is(err, unix.EHOSTUNREACH) {
				return "no route to " + c.dst.String(), nil
			}
			return "", fmt.Errorf("netlab: route lookup for %s in %s: %w", c.dst, l.NS.Name, err)
		}
		ok := len(routes) > 0
		for _, r := range routes {
			if c.local {
				ok = ok && r.Type == unix.RTN_LOCAL
			} else {
				ok = ok && r.Type == unix.RTN_UNICAST && r.LinkIndex == l.Index
			}
		}
		if !ok {
			return "route to " + c.dst.String() + " not installed yet", nil
		}
	}
	return "", nil
}

// Close deletes both namespaces, which destroys the veth. It is idempotent,
// and after a partial failure a later call retries what is left.
func (p *Pair) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, ns := range p.nss {
		errs = append(errs, ns.close())
	}
	return errors.Join(errs...)
}

// Release closes the lab's handles to the namespaces but leaves the
// namespaces and the veth in place, for tools such as `netlab up` whose
// labs outlive the process (remove them later with Destroy). After Release,
// NS.Do, NS.Handle and NS.Netlink no longer work; Close still deletes the
// namespaces.
func (p *Pair) Release() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, ns := range p.nss {
		errs = append(errs, ns.release())
	}
	return errors.Join(errs...)
}

// Namespaces returns the names of the pair's namespaces (A, then B).
func (p *Pair) Namespaces() (a, b string) { return p.A.NS.Name, p.B.NS.Name }

// AddAddr4 gives the link one more IPv4 address in its /24, host part host
// (not 1 or 2, the ends' own), and returns it; the address goes with the
// namespace. Tests that bind more UDP ports than one address has ephemeral
// ports use it.
func (l *Link) AddAddr4(tb testing.TB, host byte) netip.Addr {
	tb.Helper()
	if host < 3 || host == 255 {
		tb.Fatalf("netlab: AddAddr4: host part %d: want 3..254 (1 and 2 are the ends')", host)
	}
	a := l.IPv4.Addr().As4()
	a[3] = host
	pfx := netip.PrefixFrom(netip.AddrFrom4(a), l.IPv4.Bits())
	nl := l.NS.Netlink()
	link, err := nl.LinkByName(l.Name)
	if err == nil {
		err = nl.AddrAdd(link, &netlink.Addr{IPNet: prefixNet(pfx)})
	}
	if err != nil {
		tb.Fatalf("netlab: add address %s to %s in %s: %v", pfx, l.Name, l.NS.Name, err)
	}
	return pfx.Addr()
}
