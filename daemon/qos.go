package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

// Traffic classes on the daemon's side: one qos.Config per interface,
// shared by the interface's rings (mlnx_qos configures a port), from the
// QoS file given with --qos-file, else the defaults with the forced
// traffic class and TTL of the command line. The engine (package ring)
// schedules by it.

// QoSFile is the document of --qos-file: the QoS state of the interfaces
// it names (others get the defaults). Each entry's keys are those of
// qos.Config; missing keys take the defaults.
type QoSFile struct {
	Interfaces map[string]qos.Config `json:"interfaces"`
}

// LoadQoSFile reads and validates a QoS file.
func LoadQoSFile(path string) (QoSFile, error) {
	var f QoSFile
	b, err := os.ReadFile(path)
	if err != nil {
		return f, fmt.Errorf("QoS file: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("QoS file %s: %w (see docs/configuration.md, \"QoS file\")", path, err)
	}
	return f, nil
}

// interfaceQoS returns the QoS state an interface starts with.
func (c *Config) interfaceQoS(name string) qos.Config {
	q, ok := c.QoS.Interfaces[name]
	if !ok {
		q = qos.Default()
		if c.TrafficClass != nil {
			q.TrafficClass = int(*c.TrafficClass)
		}
		q.TTL = c.TTL
	}
	return q
}

// validateQoS checks the QoS part of the configuration.
func (c *Config) validateQoS() error {
	var errs []error
	for name, q := range c.QoS.Interfaces {
		if !slices.ContainsFunc(c.Interfaces, func(it Interface) bool { return it.Name == name }) {
			errs = append(errs, fmt.Errorf("QoS for interface %s, which bypassd does not serve (check --interface)", name))
		}
		if err := q.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("QoS for %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// applyQoS gives ri's ring its interface's QoS state.
func (d *Daemon) applyQoS(ri *ringInfo) {
	q := d.cfg.interfaceQoS(ri.it.Name)
	ri.ring().SetQoS(&q)
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
