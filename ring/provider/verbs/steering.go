//go:build verbs

package verbs

import (
	"errors"
	"fmt"

	"github.com/bypassd/bypassd/ring/qp"
)

// Steering is a verbs ring's qp.Steering: one ibv_create_flow rule per
// flow, attached to the ring's main QP. It takes the place of the XDP
// program; frames that match no rule stay with the kernel.
type Steering struct{ p *Provider }

var _ qp.Steering = (*Steering)(nil)

// Steering returns the provider's flow steering.
func (p *Provider) Steering() *Steering { return &Steering{p} }

// AddFlow implements qp.Steering.
func (s *Steering) AddFlow(f qp.Flow) error {
	p := s.p
	p.flowMu.Lock()
	defer p.flowMu.Unlock()
	if p.closed {
		return qp.ErrClosed
	}
	if _, ok := p.flows[f]; ok {
		return nil
	}
	attr, err := flowRule(f, p.mac, uint8(p.bind.Port))
	if err != nil {
		return fmt.Errorf("verbs %s/%d: %w", p.cfg.Interface, p.cfg.Queue, err)
	}
	h, err := cCreateFlow(p.sq[0].qp, attr)
	if err != nil {
		return translate(fmt.Sprintf("verbs %s/%d: steer %s", p.cfg.Interface, p.cfg.Queue, f), err)
	}
	p.flows[f] = h
	return nil
}

// DeleteFlow implements qp.Steering.
func (s *Steering) DeleteFlow(f qp.Flow) error {
	p := s.p
	p.flowMu.Lock()
	defer p.flowMu.Unlock()
	h, ok := p.flows[f]
	if !ok {
		return nil
	}
	delete(p.flows, f)
	if err := cDestroyFlow(h); err != nil {
		return translate(fmt.Sprintf("verbs %s/%d: remove steering of %s", p.cfg.Interface, p.cfg.Queue, f), err)
	}
	return nil
}

// Flows implements qp.Steering: the rules this ring installed (the device
// has no verb to list them).
func (s *Steering) Flows() ([]qp.Flow, error) {
	p := s.p
	p.flowMu.Lock()
	defer p.flowMu.Unlock()
	out := make([]qp.Flow, 0, len(p.flows))
	for f := range p.flows {
		out = append(out, f)
	}
	return out, nil
}

// Healthy implements qp.Steering: rules stop reaching the QP when the QP or
// the device failed (a fatal async event, an error completion).
func (s *Steering) Healthy() error {
	if e := s.p.broken.Load(); e != nil {
		return *e
	}
	return nil
}

// Close implements qp.Steering: it removes every rule; the provider stays
// open until its own Close.
func (s *Steering) Close() error {
	flows, _ := s.Flows()
	var errs []error
	for _, f := range flows {
		errs = append(errs, s.DeleteFlow(f))
	}
	return errors.Join(errs...)
}
