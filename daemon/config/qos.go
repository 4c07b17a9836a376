package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"

	"github.com/bypassd/bypassd/ring/sched/qos"
)

// QoSFile is the document of --qos-file: the QoS state of the interfaces
// it names (others get the defaults). Each entry's keys are those of
// qos.Config; missing keys take the defaults.
type QoSFile struct {
	Interfaces map[string]qos.Config `json:"interfaces"`
}

// LoadQoSFile reads and validates a QoS file. A file that does not exist
// yet is empty: the daemon creates it at the first change.
func LoadQoSFile(path string) (QoSFile, error) {
	var f QoSFile
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return f, nil
	}
	if err != nil {
		return f, fmt.Errorf("QoS file: %w", err)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("QoS file %s: %w (see docs/configuration.md, \"QoS file\")", path, err)
	}
	return f, nil
}

// InterfaceQoS returns the QoS state an interface starts with.
func (c *Config) InterfaceQoS(name string) qos.Config {
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
