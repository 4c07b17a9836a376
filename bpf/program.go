package bpf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// AttachMode selects where in the receive path the program runs.
type AttachMode int

const (
	// ModeAuto tries native (driver) mode and falls back to generic mode if
	// the driver refuses; Program.Mode reports which one was used.
	ModeAuto AttachMode = iota
	// ModeNative runs the program in the driver (XDP_FLAGS_DRV_MODE).
	ModeNative
	// ModeGeneric runs the program on the skb path (XDP_FLAGS_SKB_MODE);
	// works on every interface, slower.
	ModeGeneric
)

func (m AttachMode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeNative:
		return "native"
	case ModeGeneric:
		return "generic"
	default:
		return fmt.Sprintf("AttachMode(%d)", int(m))
	}
}

func (m AttachMode) flags() link.XDPAttachFlags {
	if m == ModeGeneric {
		return link.XDPGenericMode
	}
	return link.XDPDriverMode
}

// Options tune Attach. The zero value is valid.
type Options struct {
	Mode     AttachMode // ModeAuto (0): native first, generic if the driver refuses
	MaxFlows uint32     // capacity of the flows map; 0 = DefaultMaxFlows
	// Queues is how many receive queues the interface can have (its
	// allocated count, which `ethtool -L` cannot exceed); the xsks map gets
	// a slot per queue, at least MaxSockets.
	Queues int
	// RXTimestamps asks for the device-bound variant that writes each
	// redirected frame's hardware receive timestamp into its metadata
	// area (see RXMeta). It runs in native mode only; when the driver or
	// kernel refuses it, the plain program is used and
	// Program.RXTimestampsRefused says why.
	RXTimestamps bool
	// Frags loads the program frags-aware (BPF_F_XDP_HAS_FRAGS, what
	// SEC("xdp.frags") declares): frames larger than one buffer then
	// reach it as multi-buffer xdp_buffs, of which it parses the headers
	// in the first buffer, instead of being dropped by the driver or
	// refused at attach (veth refuses a plain program in native mode
	// when the peer's MTU exceeds a page: ERANGE). Needs Linux 5.18;
	// the timestamping variant is not loaded frags-aware, so Frags wins
	// over RXTimestamps.
	Frags bool
}

// Counters are the program's statistics summed over all CPUs.
type Counters struct {
	Redirected uint64 // frames redirected into an AF_XDP socket (fragments included)
	Passed     uint64 // frames that match no flow: handed to the kernel
	NoSocket   uint64 // frames that matched a flow whose slot has no socket: handed to the kernel
	Fragments  uint64 // IP fragments redirected (a subset of Redirected)
	Malformed  uint64 // truncated or inconsistent headers: handed to the kernel
	// OtherQueue counts frames redirected to the socket of the queue that
	// received them rather than their flow's home slot (a subset of
	// Redirected): the receiving ring hands them on.
	OtherQueue uint64
	// NoQueueSocket counts frames of a flow that arrived on a queue with
	// no socket (a queue no ring serves): handed to the kernel.
	NoQueueSocket uint64
}

// Program is the steering program attached to one interface. Map updates
// may be called from any goroutine; Close must not race with them.
type Program struct {
	mu     sync.RWMutex // guards closed against use-after-Close; map ops are syscalls
	closed bool
	// fiveMu serializes changes of 5-tuple flows with the count of them
	// the program reads.
	fiveMu sync.Mutex
	// vxMu serializes changes of overlay flows with the VXLAN ports' counts.
	vxMu    sync.Mutex
	objs    steerMaps
	prog    *ebpf.Program
	link    link.Link
	ifindex int
	slots   uint32 // size of the xsks map
	mode    AttachMode
	// fallback is why native mode was refused when ModeAuto chose generic.
	fallback error
	// rxts: the device-bound timestamping variant is attached; tsRefused
	// is why it is not when Options.RXTimestamps asked for it.
	rxts      bool
	tsRefused error
	// frags: loaded frags-aware (Options.Frags).
	frags bool
}

// bpfFXDPDevBoundOnly is BPF_F_XDP_DEV_BOUND_ONLY (linux/bpf.h): load an XDP
// program for one device without offloading it to the NIC.
const bpfFXDPDevBoundOnly = 1 << 6

// Program variants: the maps plus one entry point each.
type plainObjects struct {
	steerMaps
	Prog *ebpf.Program `ebpf:"steer"`
}

type tsObjects struct {
	steerMaps
	Prog *ebpf.Program `ebpf:"steer_ts"`
}

// errClosed is returned by every method called after Close.
var errClosed = errors.New("bpf: program is closed (attach it again with bpf.Attach)")

// Attach loads the program and attaches it to ifindex (resolved in the
// calling thread's network namespace) through a bpf_link, so that it is
// detached when the process dies. Kernel refusals are translated into
// errors that say what to do; the original errno stays in the chain.
func Attach(ifindex int, opts Options) (*Program, error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("bpf: attach: invalid ifindex %d (find it with `ip link show`)", ifindex)
	}
	switch opts.Mode {
	case ModeAuto, ModeNative, ModeGeneric:
	default:
		return nil, fmt.Errorf("bpf: attach: unknown mode %s (use ModeAuto, ModeNative or ModeGeneric)", opts.Mode)
	}
	maxFlows := opts.MaxFlows
	if maxFlows == 0 {
		maxFlows = DefaultMaxFlows
	}

	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("bpf: read embedded steering object: %w", err)
	}
	spec.Maps[steerMapFlows].MaxEntries = maxFlows
	if opts.Queues < 0 {
		return nil, fmt.Errorf("bpf: attach: negative queue count %d", opts.Queues)
	}
	slots := uint32(max(opts.Queues, MaxSockets))
	spec.Maps[steerMapXsks].MaxEntries = slots

	p := &Program{ifindex: ifindex, slots: slots, frags: opts.Frags}
	if opts.Frags {
		spec.Programs[steerProgSteer].Flags |= unix.BPF_F_XDP_HAS_FRAGS
	}
	if opts.RXTimestamps {
		if opts.Frags {
			p.tsRefused = errors.New("hardware receive timestamps through XDP are not available with multi-buffer frames (MTU larger than the frame size)")
		} else if opts.Mode == ModeGeneric {
			p.tsRefused = errors.New("hardware receive timestamps need native XDP (device-bound programs do not run in generic mode)")
		} else if err := p.attachTimestamping(spec); err == nil {
			return p, nil
		} else {
			p.tsRefused = err
			if opts.Mode == ModeNative && !errors.Is(err, errTSLoad) {
				// Native attach itself failed: the plain program would
				// fail the same way.
				return nil, err
			}
		}
	}
	var objs plainObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		if opts.Frags && errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("bpf: load the frags-aware (multi-buffer) steering program: %w (needs Linux 5.18+, and AF_XDP multi-buffer Linux 6.6+; this kernel is %s): "+
				"use a frame size that holds a whole frame (--frame-size 4096 takes MTUs up to 3822) or lower the MTU", loadError(err), KernelRelease())
		}
		return nil, loadError(err)
	}
	p.objs, p.prog = objs.steerMaps, objs.Prog

	modes := []AttachMode{opts.Mode}
	if opts.Mode == ModeAuto {
		modes = []AttachMode{ModeNative, ModeGeneric}
	}
	var errs []error
	for _, mode := range modes {
		l, err := link.AttachXDP(link.XDPOptions{
			Program:   p.prog,
			Interface: ifindex,
			Flags:     mode.flags(),
		})
		if err == nil {
			p.link, p.mode = l, mode
			if len(errs) > 0 {
				p.fallback = errs[0]
			}
			return p, nil
		}
		errs = append(errs, attachError(ifindex, mode, err))
		// Only a driver refusing native mode is worth a generic retry; a
		// conflict or missing privilege fails generic mode the same way.
		if errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST) ||
			errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENODEV) {
			break
		}
	}
	p.closeObjects()
	return nil, errors.Join(errs...)
}

// errTSLoad marks a refusal to load (not attach) the timestamping variant:
// an older kernel or a driver without XDP metadata support.
var errTSLoad = errors.New("load the device-bound timestamping program")

// attachTimestamping loads steer_ts bound to p.ifindex and attaches it in
// native mode.
func (p *Program) attachTimestamping(spec *ebpf.CollectionSpec) error {
	ps := spec.Programs[steerProgSteerTs]
	ps.Ifindex = uint32(p.ifindex)
	ps.Flags |= bpfFXDPDevBoundOnly
	var objs tsObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		return fmt.Errorf("bpf: %w (needs Linux 6.3+ and a driver with XDP RX metadata): %w", errTSLoad, loadError(err))
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: objs.Prog, Interface: p.ifindex, Flags: ModeNative.flags()})
	if err != nil {
		closeDevBound(objs.Prog)
		objs.steerMaps.Close()
		return attachError(p.ifindex, ModeNative, err)
	}
	p.objs, p.prog, p.link, p.mode, p.rxts = objs.steerMaps, objs.Prog, l, ModeNative, true
	return nil
}

func loadError(err error) error {
	if errors.Is(err, unix.EPERM) {
		return fmt.Errorf("bpf: load steering program: permission denied: run as root or grant CAP_BPF and CAP_NET_ADMIN: %w", err)
	}
	if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.E2BIG) {
		return fmt.Errorf("bpf: load steering program: the kernel could not allocate the maps; lower Options.MaxFlows (each flow preallocates about 100 bytes): %w", err)
	}
	var verr *ebpf.VerifierError
	if errors.As(err, &verr) {
		if strings.Contains(verr.Error(), "!root") {
			return fmt.Errorf("bpf: load steering program: the verifier needs CAP_PERFMON (or root) for packet pointer arithmetic: grant CAP_PERFMON besides CAP_BPF and CAP_NET_ADMIN: %w", err)
		}
		return fmt.Errorf("bpf: load steering program: rejected by the kernel verifier (needs Linux 5.10+ with BTF and AF_XDP; report the log below): %w", err)
	}
	return fmt.Errorf("bpf: load steering program: %w", err)
}

// attachError turns the bare errno of BPF_LINK_CREATE into advice. The
// kernel only explains itself in netlink extack messages, which the
// bpf_link path does not return.
func attachError(ifindex int, mode AttachMode, err error) error {
	dev := fmt.Sprintf("ifindex %d", ifindex)
	name := dev
	if ifi, ierr := net.InterfaceByIndex(ifindex); ierr == nil {
		name = ifi.Name
		dev = fmt.Sprintf("%s (ifindex %d)", ifi.Name, ifindex)
	}
	var hint string
	switch {
	case errors.Is(err, unix.ERANGE):
		hint = "peer MTU too large for native XDP (lower the peer MTU below ~3500 or use generic mode)"
	case errors.Is(err, unix.ENOSPC):
		hint = "the veth peer has more TX queues than this side has RX queues; create the pair with equal " +
			"numtxqueues/numrxqueues (or lower the peer's with `ethtool -L`), or use generic mode"
	case errors.Is(err, unix.EBUSY):
		hint = fmt.Sprintf("another XDP program is already attached; find it with `ip link show dev %s` "+
			"and `bpftool net`, and detach it (`bpftool link detach id N` for a bpf_link) before attaching", name)
	case errors.Is(err, unix.EEXIST):
		hint = fmt.Sprintf("an XDP program is attached in the other mode (native and generic cannot be mixed); "+
			"find it with `ip link show dev %s` and `bpftool net`", name)
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		hint = "permission denied: run as root or grant CAP_BPF and CAP_NET_ADMIN"
	case errors.Is(err, unix.ENODEV):
		hint = "no such interface in this network namespace (check `ip link show`)"
	case errors.Is(err, unix.EOPNOTSUPP) && mode == ModeNative:
		hint = "the driver has no native XDP support; use generic mode (or auto)"
	case errors.Is(err, unix.EINVAL) && mode == ModeNative:
		hint = "the driver refused native XDP (often MTU, LRO or queue settings); use generic mode (or auto)"
	case errors.Is(err, ebpf.ErrNotSupported):
		hint = "this kernel cannot attach XDP through a bpf_link (needs Linux 5.9+)"
	}
	if hint == "" {
		return fmt.Errorf("bpf: attach XDP in %s mode to %s: %w", mode, dev, err)
	}
	return fmt.Errorf("bpf: attach XDP in %s mode to %s: %s: %w", mode, dev, hint, err)
}

// Frags reports whether the program was loaded frags-aware (Options.Frags).
func (p *Program) Frags() bool { return p.frags }

// KernelRelease is the running kernel's release (uname -r), for messages
// that name the version a feature needs.
func KernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "unknown"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// Mode reports the mode the program is attached in (never ModeAuto).
func (p *Program) Mode() AttachMode { return p.mode }

// FallbackReason explains why ModeAuto ended up in generic mode (the
// translated native-mode error, worth logging for operators); nil when the
// requested or first-choice mode was used.
func (p *Program) FallbackReason() error { return p.fallback }

// RXTimestamps reports whether the attached program is the device-bound
// variant that puts hardware receive timestamps in front of redirected
// frames (RXMeta).
func (p *Program) RXTimestamps() bool { return p.rxts }

// RXTimestampsRefused says why Options.RXTimestamps could not be honoured
// (nil when it was, or was not asked for).
func (p *Program) RXTimestampsRefused() error { return p.tsRefused }

// Slots is the size of the xsks map: valid slots are 0..Slots()-1.
func (p *Program) Slots() int { return int(p.slots) }

// Ifindex is the interface the program was attached to.
func (p *Program) Ifindex() int { return p.ifindex }

// AddFlow steers f to slot, replacing any previous slot for f.
func (p *Program) AddFlow(f Flow, slot uint32) (err error) {
	k, err := f.key()
	if err != nil {
		return err
	}
	if slot >= p.slots {
		return fmt.Errorf("bpf: add flow %s: slot %d out of range (0..%d)", f, slot, p.slots-1)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	val := flowVal{Slot: slot}
	if f.VNI != 0 {
		// The port's count of overlay flows changes with new keys only.
		p.vxMu.Lock()
		defer p.vxMu.Unlock()
		var v flowVal
		if p.objs.Flows.Lookup(&k, &v) != nil {
			if err := p.countVXLANPort(f, +1); err != nil {
				return err
			}
			defer func() {
				if err != nil {
					_ = p.countVXLANPort(f, -1)
				}
			}()
		}
		binary.BigEndian.PutUint16(val.VXLANPort[:], f.VXLANPort)
	}
	five := f.Src.IsValid()
	if five {
		// The count of 5-tuple entries changes with new keys only.
		p.fiveMu.Lock()
		defer p.fiveMu.Unlock()
		var v flowVal
		if p.objs.Flows.Lookup(&k, &v) == nil {
			five = false
		}
	}
	if err := p.objs.Flows.Update(&k, &val, ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.E2BIG) {
			// ENOSPC, not the map's E2BIG: the errno a client gets for a
			// full table (as for a full rate table).
			return fmt.Errorf("bpf: add flow %s: flows map full (%d entries); close sockets or raise --max-flows: %w",
				f, p.objs.Flows.MaxEntries(), unix.ENOSPC)
		}
		return fmt.Errorf("bpf: add flow %s: %w", f, err)
	}
	if five {
		return p.countFiveTuples(+1)
	}
	return nil
}

// countFiveTuples adjusts the program's count of 5-tuple flows (p.fiveMu
// held), which lets it skip the 5-tuple lookup while there are none.
func (p *Program) countFiveTuples(delta int32) error {
	var n uint32
	if err := p.objs.FiveTuples.Lookup(uint32(0), &n); err != nil {
		return fmt.Errorf("bpf: read the 5-tuple count: %w", err)
	}
	n = uint32(int32(n) + delta)
	if err := p.objs.FiveTuples.Update(uint32(0), n, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: update the 5-tuple count: %w", err)
	}
	return nil
}

// countVXLANPort adjusts how many overlay flows use f's VXLAN port (p.vxMu
// held): the program looks into the datagrams of ports with flows only.
func (p *Program) countVXLANPort(f Flow, delta int32) error {
	var vp vxlanPorts
	if err := p.objs.VxlanPorts.Lookup(uint32(0), &vp); err != nil {
		return fmt.Errorf("bpf: read the VXLAN ports: %w", err)
	}
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], f.VXLANPort)
	i := slices.Index(vp.Port[:], port)
	if i < 0 {
		if delta < 0 {
			return nil
		}
		if i = slices.Index(vp.Port[:], [2]byte{}); i < 0 {
			return fmt.Errorf("bpf: add flow %s: %d VXLAN ports are in use already, the most the program looks into; use one dstport for the overlays: %w",
				f, MaxVXLANPorts, unix.ENOSPC)
		}
		vp.Port[i] = port
	}
	vp.Refs[i] = uint32(int32(vp.Refs[i]) + delta)
	if vp.Refs[i] == 0 || int32(vp.Refs[i]) < 0 {
		vp.Port[i], vp.Refs[i] = [2]byte{}, 0
	}
	if err := p.objs.VxlanPorts.Update(uint32(0), &vp, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("bpf: update the VXLAN ports: %w", err)
	}
	return nil
}

// VXLANPorts returns the VXLAN ports the program looks into, with the
// number of overlay flows of each.
func (p *Program) VXLANPorts() (map[uint16]uint32, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, errClosed
	}
	var vp vxlanPorts
	if err := p.objs.VxlanPorts.Lookup(uint32(0), &vp); err != nil {
		return nil, fmt.Errorf("bpf: read the VXLAN ports: %w", err)
	}
	out := map[uint16]uint32{}
	for i, port := range vp.Port {
		if port != ([2]byte{}) {
			out[binary.BigEndian.Uint16(port[:])] = vp.Refs[i]
		}
	}
	return out, nil
}

// DeleteFlow removes f. If f is not present the error matches both
// os.ErrNotExist and ebpf.ErrKeyNotExist.
func (p *Program) DeleteFlow(f Flow) error {
	k, err := f.key()
	if err != nil {
		return err
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	if f.Src.IsValid() {
		p.fiveMu.Lock()
		defer p.fiveMu.Unlock()
	}
	if f.VNI != 0 {
		p.vxMu.Lock()
		defer p.vxMu.Unlock()
	}
	if err := p.objs.Flows.Delete(&k); err != nil {
		return fmt.Errorf("bpf: delete flow %s: %w", f, err)
	}
	if f.VNI != 0 {
		if err := p.countVXLANPort(f, -1); err != nil {
			return err
		}
	}
	if f.Src.IsValid() {
		return p.countFiveTuples(-1)
	}
	return nil
}

// Flows returns every flow and its slot, in normalised form (IPv4-mapped
// IPv6 addresses as IPv4, zones dropped). The map is read entry by entry,
// so concurrent updates may or may not be reflected.
func (p *Program) Flows() (map[Flow]uint32, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return nil, errClosed
	}
	out := make(map[Flow]uint32)
	var (
		k flowKey
		v flowVal
	)
	it := p.objs.Flows.Iterate()
	for it.Next(&k, &v) {
		out[k.flow(v)] = v.Slot
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bpf: list flows: %w", err)
	}
	return out, nil
}

// SetSocket stores the AF_XDP socket xskFD at slot. The socket must be bound
// to this interface; the kernel keeps its own reference, so the caller may
// close its fd only when it wants the socket gone.
func (p *Program) SetSocket(slot uint32, xskFD int) error {
	if slot >= p.slots {
		return fmt.Errorf("bpf: set socket: slot %d out of range (0..%d)", slot, p.slots-1)
	}
	if xskFD < 0 {
		return fmt.Errorf("bpf: set socket at slot %d: invalid fd %d", slot, xskFD)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	if err := p.objs.Xsks.Update(slot, uint32(xskFD), ebpf.UpdateAny); err != nil {
		if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTSOCK) {
			return fmt.Errorf("bpf: set socket at slot %d: fd %d is not an AF_XDP socket: %w", slot, xskFD, err)
		}
		return fmt.Errorf("bpf: set socket at slot %d (fd %d): %w", slot, xskFD, err)
	}
	return nil
}

// ClearSocket empties slot; frames of flows pointing at it then go to the
// kernel and count as NoSocket. Clearing an empty slot is not an error.
func (p *Program) ClearSocket(slot uint32) error {
	if slot >= p.slots {
		return fmt.Errorf("bpf: clear socket: slot %d out of range (0..%d)", slot, p.slots-1)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	if err := p.objs.Xsks.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("bpf: clear socket at slot %d: %w", slot, err)
	}
	return nil
}

// Counters sums the per-CPU counters.
func (p *Program) Counters() (Counters, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return Counters{}, errClosed
	}
	var sums [counterMax]uint64
	var perCPU []uint64
	for i := range counterMax {
		if err := p.objs.Counters.Lookup(i, &perCPU); err != nil {
			return Counters{}, fmt.Errorf("bpf: read counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			sums[i] += v
		}
	}
	return Counters{
		Redirected: sums[counterRedirected],
		Passed:     sums[counterPassed],
		NoSocket:   sums[counterNoSocket],
		Fragments:  sums[counterFragments],
		Malformed:  sums[counterMalformed],

		OtherQueue:    sums[counterOtherQueue],
		NoQueueSocket: sums[counterNoQueueSocket],
	}, nil
}

// LinkID is the kernel's id of the bpf_link, as shown by `bpftool link`.
func (p *Program) LinkID() (uint32, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return 0, errClosed
	}
	info, err := p.link.Info()
	if err != nil {
		return 0, fmt.Errorf("bpf: read link info: %w", err)
	}
	return uint32(info.ID), nil
}

// Attached reports whether the link still holds the program on the
// interface. It turns false when someone detaches the link (`bpftool link
// detach`) or the interface disappears; the program does not come back by
// itself, the owner must Close and Attach again.
func (p *Program) Attached() (bool, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return false, errClosed
	}
	info, err := p.link.Info()
	if err != nil {
		return false, fmt.Errorf("bpf: read link info: %w", err)
	}
	xdp := info.XDP()
	if xdp == nil {
		return false, fmt.Errorf("bpf: link %d is not an XDP link (type %v)", info.ID, info.Type)
	}
	// The kernel reports ifindex 0 once the link lost its device.
	return xdp.Ifindex != 0 && int(xdp.Ifindex) == p.ifindex, nil
}

// Close detaches the program (it is off the interface when Close returns)
// and frees its maps. Sockets stored with
// SetSocket are released by the kernel, not closed for the caller.
// Calling Close again is a no-op.
func (p *Program) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.link != nil {
		// Detach explicitly: closing our fd alone detaches only when it is
		// the last reference, and a child forked concurrently by this
		// process briefly holds one too (until its exec).
		if err := p.link.Detach(); err != nil && !errors.Is(err, ebpf.ErrNotSupported) {
			errs = append(errs, fmt.Errorf("bpf: detach from ifindex %d: %w", p.ifindex, err))
		}
		if err := p.link.Close(); err != nil {
			errs = append(errs, fmt.Errorf("bpf: close link on ifindex %d: %w", p.ifindex, err))
		}
	}
	if err := p.closeObjects(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (p *Program) closeObjects() error {
	var perr error
	if p.rxts {
		perr = closeDevBound(p.prog)
	} else {
		perr = p.prog.Close()
	}
	if err := errors.Join(perr, p.objs.Close()); err != nil {
		return fmt.Errorf("bpf: free program and maps: %w", err)
	}
	return nil
}

// closeDevBound closes a device-bound program and waits until the kernel
// has freed it. Linux 6.18 can oops when a netdev is unregistered while a
// device-bound program of it is still being torn down (the program is
// freed after an RCU grace period, not at close); callers that delete the
// device next (a test's namespace, an operator's veth) must not race it.
func closeDevBound(prog *ebpf.Program) error {
	var id ebpf.ProgramID
	if info, err := prog.Info(); err == nil {
		id, _ = info.ID()
	}
	err := prog.Close()
	if id == 0 {
		return err
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		p, lerr := ebpf.NewProgramFromID(id)
		if lerr != nil {
			break
		}
		p.Close()
		time.Sleep(10 * time.Millisecond)
	}
	// The offload bookkeeping goes after the program's own id.
	time.Sleep(100 * time.Millisecond)
	return err
}
