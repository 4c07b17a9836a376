package ring

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/ring/clock/phc"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/qp"
)

// HWTimestampSupport is what an interface offers for hardware receive
// timestamps, and what a requested conversion mode becomes on it.
type HWTimestampSupport struct {
	Info phc.Info
	// Mode is the effective mode for the requested one; Reason says why
	// it differs ("" when it does not).
	Mode   tsconv.Mode
	Reason string
}

// ProbeHWTimestamps asks ethtool about ifname's PHC and receive
// timestamping (in the calling thread's network namespace) and resolves
// the requested conversion mode on it. The daemon takes the lowest mode of
// all its interfaces and opens every ring with it.
func ProbeHWTimestamps(ifname string, requested tsconv.Mode) (HWTimestampSupport, error) {
	info, err := phc.Discover(ifname)
	if err != nil {
		return HWTimestampSupport{}, err
	}
	mode, why := tsconv.Resolve(requested, info.Capabilities())
	if why != "" {
		if r := info.Reason(); r != "" {
			why = r + ": " + why
		}
	}
	return HWTimestampSupport{Info: info, Mode: mode, Reason: why}, nil
}

// deviceStamps reports whether the ring should load the device-bound
// timestamping XDP program: conversion is asked for and the device stamps
// received frames in hardware. A device-bound program on a device without
// stamps gains nothing, and on Linux 6.18 a device-bound program still
// alive when its netdev is unregistered (a namespace deleted, a veth
// removed) can oops the kernel in __bpf_prog_offload_destroy with RTNL
// held, wedging every later netlink call until reboot; so it is loaded
// only where it serves a purpose (docs/operations.md, "Kernel hazard").
func deviceStamps(cfg Config) bool {
	if cfg.HWTimestamps == tsconv.ModeDisable {
		return false
	}
	info, err := phc.Discover(cfg.Interface)
	return err == nil && info.RXHardware()
}

// hwClock is a ring's hardware timestamp conversion: the converter in the
// effective mode and, in sync mode, the PHC it samples.
type hwClock struct {
	conv  *tsconv.Converter
	clock *phc.Clock
	done  chan struct{}
}

// openHWClock resolves cfg.HWTimestamps on the ring's interface and
// prepares the converter. It returns nil when the effective mode is
// disable, and why the mode is lower than asked ("" when it is not).
func (r *Ring) openHWClock() (*hwClock, string, error) {
	if r.cfg.HWTimestamps == tsconv.ModeDisable {
		return nil, "", nil
	}
	if cp, ok := r.prov.(qp.DeviceClock); ok {
		return r.openProviderClock(cp)
	}
	sup, err := ProbeHWTimestamps(r.cfg.Interface, r.cfg.HWTimestamps)
	if err != nil {
		return nil, "", err
	}
	if sup.Mode != tsconv.ModeDisable && !r.prov.Caps().HWTimestamps {
		// The device stamps frames, but this path cannot carry the stamps
		// to the ring (generic XDP, or a provider without them).
		sup.Mode, sup.Reason = tsconv.ModeDisable, fmt.Sprintf("%s delivers hardware timestamps, but the %s provider in mode %s cannot pass them on (the timestamping XDP program needs native mode): using disable",
			r.cfg.Interface, r.prov.Caps().Provider, r.prov.Caps().Mode)
		if prog := r.Program(); prog != nil && prog.RXTimestampsRefused() != nil {
			sup.Reason += ": " + prog.RXTimestampsRefused().Error()
		}
	}
	if sup.Mode == tsconv.ModeDisable {
		return nil, sup.Reason, nil
	}
	h := &hwClock{done: make(chan struct{})}
	var clock tsconv.Clock
	if sup.Mode == tsconv.ModeSync {
		if h.clock, err = phc.Open(sup.Info.Index); err != nil {
			return nil, "", err
		}
		clock = h.clock
	}
	h.conv, err = tsconv.New(sup.Mode, clock, tsconv.Config{OnError: func(err error) {
		r.log.Warn("hardware clock sample failed", zap.String("clock", h.clock.Name()), zap.Error(err))
	}})
	if err != nil {
		h.close()
		return nil, "", fmt.Errorf("hardware timestamp conversion: %w", err)
	}
	return h, sup.Reason, nil
}

// run keeps the sync-mode parameters fresh until ctx ends.
func (h *hwClock) run(ctx context.Context) {
	defer close(h.done)
	_ = h.conv.Run(ctx)
}

// close releases the clock; run must have returned (or never started).
func (h *hwClock) close() error {
	if h.clock != nil {
		return h.clock.Close()
	}
	return nil
}

// HWTimestampMode returns the ring's effective conversion mode.
func (r *Ring) HWTimestampMode() tsconv.Mode {
	if r.hw == nil {
		return tsconv.ModeDisable
	}
	return r.hw.conv.Mode()
}

// HWTimestampErrorNs returns the estimated error of converted hardware
// timestamps in ns, and false when the mode has no estimate (every mode
// but sync, or sync before its first sample).
func (r *Ring) HWTimestampErrorNs() (int64, bool) {
	if r.hw == nil {
		return 0, false
	}
	return r.hw.conv.EstimatedErrorNs()
}

// rxStamps are the receive timestamps a datagram record carries.
type rxStamps struct {
	flags        uint16
	sw           int64
	hwRaw, hwSys int64
}

// stamps builds a datagram's timestamps from the engine's software time
// and the frame's hardware timestamp (0: none). The raw slot holds the
// device's nanoseconds; the converted slot is filled in sync and PTP modes,
// whose results are on the system clock's scale.
func (e *engine) stamps(sw int64, hw uint64) rxStamps {
	st := rxStamps{flags: dgram.FlagSWTimestamp, sw: sw}
	h := e.r.hw
	if hw == 0 || h == nil {
		return st
	}
	// The XDP metadata gives nanoseconds on the device's scale already.
	if int64(hw) > 0 {
		st.flags |= dgram.FlagHWRaw
		st.hwRaw = int64(hw)
	}
	if m := h.conv.Mode(); m == tsconv.ModeSync || m == tsconv.ModePTP {
		if sys, ok := h.conv.Convert(hw); ok {
			st.flags |= dgram.FlagHWSys
			st.hwSys = sys
		}
	}
	return st
}

// openProviderClock resolves cfg.HWTimestamps against the provider's clock
// and prepares the converter, like openHWClock does with a PHC.
func (r *Ring) openProviderClock(cp qp.DeviceClock) (*hwClock, string, error) {
	clock, caps := cp.Clock()
	mode, why := tsconv.Resolve(r.cfg.HWTimestamps, caps)
	if mode == tsconv.ModeDisable {
		return nil, why, nil
	}
	if mode != tsconv.ModeSync {
		clock = nil
	}
	h := &hwClock{done: make(chan struct{})}
	var err error
	h.conv, err = tsconv.New(mode, clock, tsconv.Config{OnError: func(err error) {
		r.log.Warn("device clock sample failed", zap.String("provider", r.prov.Caps().Provider), zap.Error(err))
	}})
	if err != nil {
		return nil, "", fmt.Errorf("hardware timestamp conversion: %w", err)
	}
	return h, why, nil
}
