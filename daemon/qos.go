package daemon

import (
	"encoding/json"
	"fmt"
	"os"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring/sched/qos"
	"github.com/bypassd/bypassd/stats"
)

// Traffic classes on the daemon's side: one qos.Config per interface,
// shared by the interface's rings (mlnx_qos configures a port), from the
// QoS file given with --qos-file, else the defaults with the forced
// traffic class and TTL of the command line. The engine (package ring)
// schedules by it.

// applyQoS gives ri's ring its interface's QoS state.
func (d *Daemon) applyQoS(ri *ringInfo) {
	d.qosMu.Lock()
	defer d.qosMu.Unlock()
	q, ok := d.qosNow[ri.it.Name]
	if !ok {
		q = d.cfg.InterfaceQoS(ri.it.Name)
		d.qosNow[ri.it.Name] = q
	}
	ri.ring().SetQoS(&q)
}

// setQoS changes an interface's QoS state at run time: every ring of it
// from its next pass, and the QoS file if there is one.
func (d *Daemon) setQoS(iface string, q qos.Config) error {
	if err := q.Validate(); err != nil {
		return fmt.Errorf("QoS for %s: %w: %w", iface, err, unix.EINVAL)
	}
	d.qosMu.Lock()
	defer d.qosMu.Unlock()
	if _, ok := d.qosNow[iface]; !ok {
		return fmt.Errorf("QoS for %s: bypassd does not serve that interface: %w", iface, unix.ENODEV)
	}
	prev := d.qosNow[iface]
	d.qosNow[iface] = q
	if err := d.saveQoS(); err != nil {
		d.qosNow[iface] = prev
		return fmt.Errorf("QoS for %s not changed: %w: %w", iface, err, unix.EIO)
	}
	for _, ri := range d.rings {
		if ri.it.Name == iface {
			ri.ring().SetQoS(&q)
		}
	}
	return nil
}

// saveQoS writes every interface's state to the QoS file (no file: no
// saving), atomically: a crash leaves the old file or the new one.
func (d *Daemon) saveQoS() error {
	path := d.cfg.QoSPath
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(config.QoSFile{Interfaces: d.qosNow}, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("save QoS file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("save QoS file: %w", err)
	}
	return nil
}

// onSetQoS serves SET_QOS (bypassctl qos with settings).
func (s *session) onSetQoS(h ctlproto.Header, m *ctlproto.SetQoS) bool {
	if !s.isAdmin() {
		return s.fail(h, fmt.Errorf("set QoS: uid %d is neither root nor the daemon's user (uid %d): %w", s.cred.Uid, os.Geteuid(), unix.EPERM))
	}
	q := ctldoc.QoSFromWire(m)
	if err := s.d.setQoS(m.Interface, q); err != nil {
		s.log.Warn("QoS change refused", zap.String("interface", m.Interface), zap.Error(err))
		return s.fail(h, err)
	}
	s.log.Info("QoS set by a client", zap.String("interface", m.Interface), zap.Any("config", q))
	return s.reply(ctlproto.ReplyHeader(h), ctlproto.Empty{})
}

// logQoS notes non-default QoS state at start.
func (d *Daemon) logQoS() {
	seen := map[string]bool{}
	for _, ri := range d.rings {
		if seen[ri.it.Name] {
			continue
		}
		seen[ri.it.Name] = true
		if q := ri.ring().QoS(); q != qos.Default() {
			ri.log.Info("QoS", zap.Any("config", q))
		}
	}
}

func (d *Daemon) queryQoS(*session) (any, error) {
	var doc ctldoc.QoSDoc
	byName := map[string]int{}
	for _, ri := range d.rings {
		r := ri.ring()
		i, ok := byName[ri.it.Name]
		if !ok {
			i = len(doc.Interfaces)
			byName[ri.it.Name] = i
			doc.Interfaces = append(doc.Interfaces, ctldoc.QoSInterface{Interface: ri.it.Name, Config: r.QoS()})
		}
		it := &doc.Interfaces[i]
		it.Rings++
		for tc := range qos.NumTC {
			s := r.TCStats(tc)
			c := &it.TC[tc]
			c.TXPackets += s.TXPackets.Load()
			c.TXBytes += s.TXBytes.Load()
			c.TXBacklog += s.TXBacklog.Load()
			c.TXHeld += s.TXHeld.Load()
			c.RXPackets += s.RXPackets.Load()
			c.RXBytes += s.RXBytes.Load()
		}
	}
	return doc, nil
}

// tcMetrics reads every ring's traffic-class counters for /metrics.
func (d *Daemon) tcMetrics() []stats.TCMetrics {
	out := make([]stats.TCMetrics, 0, len(d.rings)*qos.NumTC)
	for _, ri := range d.rings {
		r := ri.ring()
		for tc := range qos.NumTC {
			s := r.TCStats(tc)
			out = append(out, stats.TCMetrics{Interface: ri.it.Name, Queue: ri.it.Queue, TC: tc,
				TXPackets: s.TXPackets.Load(), TXBytes: s.TXBytes.Load(), TXBacklog: s.TXBacklog.Load(),
				TXHeld: s.TXHeld.Load(), RXPackets: s.RXPackets.Load(), RXBytes: s.RXBytes.Load()})
		}
	}
	return out
}
