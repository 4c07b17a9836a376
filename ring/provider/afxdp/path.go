package afxdp

import (
	"encoding/json"
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/qp"
)

// Name is the provider's name in qp.Caps and ring.Config.Provider.
const Name = "afxdp"

// The default path: an AF_XDP socket on the ring's queue, fed by the XDP
// steering program (shared by the rings of an interface, see program.go).
func init() { qp.Register(Name, openXDPPath) }

func openXDPPath(pc qp.PathConfig) (_ qp.Provider, _ qp.Steering, err error) {
	key, err := qp.IfaceKeyOf(pc.Ifindex)
	if err != nil {
		return nil, nil, err
	}
	// An MTU whose frames do not fit one buffer needs the frags-aware
	// program (and a multi-buffer socket, which afxdp.Open decides the
	// same way). Where the kernel has multi-buffer AF_XDP the program is
	// frags-aware anyway (unless hardware timestamps want the device-bound
	// variant): a driver then accepts native XDP at any MTU (veth refuses
	// a plain program when the peer's MTU exceeds about 3,500, ERANGE) and
	// the MTU can be raised later without detaching it (mtu.go).
	frags := NeedsMultiBuffer(pc.MTU, pc.FrameSize) || !pc.HWTimestamps && MultiBufferKernel()
	var sp *sharedProgram
	if pc.Adopt != nil {
		sp = adoptProgram(key, pc.Adopt)
	} else {
		sp, err = acquireProgram(key, bpf.Options{Mode: pc.XDPMode, RXTimestamps: pc.HWTimestamps, Queues: pc.Queues, MaxFlows: uint32(pc.MaxFlows), Frags: frags})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("attach XDP program: %w", err)
	}
	defer func() {
		if err != nil {
			_ = releaseProgram(key)
		}
	}()
	prog := sp.prog
	cfg := Config{Ifindex: pc.Ifindex, IfName: pc.Interface, Queue: pc.Queue,
		Frames: pc.Frames, FrameSize: pc.FrameSize, MTU: pc.MTU, Copy: pc.Copy, XDPMode: prog.Mode().String(),
		DeviceMemory: pc.DeviceMemory, RXMetadata: prog.RXTimestamps()}
	var sock *Socket
	if h := pc.AdoptPath; h != nil {
		// The handed-over socket is in its XSKMAP slot already.
		xsk, umem := h.XSK, h.UMEM
		h.XSK, h.UMEM = -1, -1
		var l Layout
		if err = json.Unmarshal(h.Layout, &l); err != nil {
			unix.Close(xsk)
			unix.Close(umem)
			return nil, nil, fmt.Errorf("handed-over socket layout: %w", err)
		}
		sock, err = Adopt(cfg, xsk, umem, l)
	} else {
		sock, err = Open(cfg)
	}
	if err != nil {
		return nil, nil, err
	}
	st := &Steering{key: key, sp: sp, prog: prog, slot: uint32(pc.Queue), xsk: sock.FD()}
	if pc.Adopt != nil {
		// Activate registers it, once the handed-over endpoints are bound.
		return sock, st, nil
	}
	if err = st.Activate(); err != nil {
		_ = sock.Close()
		return nil, nil, err
	}
	return sock, st, nil
}

// Activate puts the ring's socket in its XSKMAP slot: steered frames reach
// it from now on (at open, or after a hand-over at Ring.Activate).
func (s *Steering) Activate() error {
	if err := s.prog.SetSocket(s.slot, s.xsk); err != nil {
		return fmt.Errorf("register socket in XSKMAP: %w", err)
	}
	return nil
}

// Steering is a ring's view of the interface's XDP program: its flows
// point at the ring's XSKMAP slot (the flows of several rings of the
// interface are reference-counted in sp).
type Steering struct {
	key  qp.IfaceKey
	sp   *sharedProgram
	prog *bpf.Program
	slot uint32
	xsk  int // the AF_XDP socket's descriptor
}

// Program is the interface's XDP steering program, shared by its rings.
func (s *Steering) Program() *bpf.Program { return s.prog }

func (s *Steering) AddFlow(f qp.Flow) error { return s.sp.addFlow(f, s.slot) }

func (s *Steering) DeleteFlow(f qp.Flow) error { return s.sp.deleteFlow(f, s.slot) }

// Flows lists the flows steered to this ring's slot (other rings of the
// interface share the map).
func (s *Steering) Flows() ([]qp.Flow, error) {
	m, err := s.prog.Flows()
	if err != nil {
		return nil, err
	}
	var out []qp.Flow
	for f, slot := range m {
		if slot == s.slot {
			out = append(out, qp.Flow(f))
		}
	}
	return out, nil
}

func (s *Steering) Healthy() error {
	ok, err := s.prog.Attached()
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the XDP program was detached from the interface")
	}
	return nil
}

// Close removes the ring's flows (endpoints normally took theirs with
// them), empties its XSKMAP slot and, with the last ring of the interface,
// detaches the program.
func (s *Steering) Close() error {
	var errs []error
	for _, f := range s.sp.slotFlows(s.slot) {
		errs = append(errs, s.DeleteFlow(f))
	}
	errs = append(errs, s.prog.ClearSocket(s.slot), releaseProgram(s.key))
	return errors.Join(errs...)
}

// ClearSlot empties the ring's XSKMAP slot: the interface's frames of its
// flows go to the kernel from now on (the hand-over's first step).
func (s *Steering) ClearSlot() error { return s.prog.ClearSocket(s.slot) }

// Forget drops the ring's references to flows without touching the
// program's map: the ring was handed over, and the new daemon's ring (in
// tests, in this very process) holds references of its own.
func (s *Steering) Forget(flows []qp.Flow) { s.sp.forget(flows, s.slot) }

// Abandon drops the ring's reference to the shared program like Close
// does, but the last one closes this process's descriptors without
// detaching the program: a new daemon holds it now.
func (s *Steering) Abandon() error { return abandonProgram(s.key) }
