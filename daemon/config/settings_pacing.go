package config

import (
	"fmt"
	"strconv"

	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// Packet pacing settings: the engine thread's scheduling and each
// interface's rate table (Config.Pacing).
func init() {
	settings = append(settings,
		setting{name: "engine-priority", arg: "N", def: "0",
			usage: "run ring engine threads under SCHED_FIFO at this priority (1..99; 0: normal scheduler), so paced departures keep time on a busy machine",
			apply: func(o *Options, v string) error {
				n, err := strconv.Atoi(v)
				if err != nil || n < 0 || n > 99 {
					return fmt.Errorf("%q: want 0 (normal scheduler) or a SCHED_FIFO priority 1..99", v)
				}
				o.Config.EnginePriority = n
				return nil
			}},
		setting{name: "pacing-table-size", arg: "N", def: strconv.Itoa(pacing.DefaultCapacity),
			usage: "distinct pacing rates per interface (the rate table's entries)",
			apply: func(o *Options, v string) (err error) { o.Config.Pacing.Capacity, err = parseCount(v); return err }},
		setting{name: "pacing-min-kbps", arg: "KBIT/S", def: strconv.Itoa(pacing.DefaultMinKbps),
			usage: "lowest pacing rate software pacing accepts (hardware: the device's own)",
			apply: func(o *Options, v string) error { return parseKbps(v, &o.Config.Pacing.MinKbps) }},
		setting{name: "pacing-max-kbps", arg: "KBIT/S", def: strconv.Itoa(pacing.DefaultMaxKbps),
			usage: "highest pacing rate software pacing accepts (hardware: the device's own)",
			apply: func(o *Options, v string) error { return parseKbps(v, &o.Config.Pacing.MaxKbps) }},
		setting{name: "pacing-max-queues", arg: "N", def: strconv.Itoa(pacing.DefaultMaxQueues),
			usage: "most paced sockets per interface",
			apply: func(o *Options, v string) (err error) { o.Config.Pacing.MaxQueues, err = parseCount(v); return err }},
		setting{name: "pacing-full-policy", arg: "POLICY", def: "refuse",
			usage: "when the rate table is full: refuse (ENOSPC) or nearest (share the closest rate in use)",
			apply: func(o *Options, v string) (err error) {
				o.Config.Pacing.Policy, err = pacing.ParseFullPolicy(v)
				return err
			}},
	)
	for i := range settings {
		if settings[i].env == "" {
			settings[i].env = envName(settings[i].name)
		}
	}
}

func parseKbps(v string, dst *uint32) error {
	n, err := strconv.ParseUint(v, 10, 32)
	if err != nil || n == 0 {
		return fmt.Errorf("%q: want a rate in kbit/s, 1..%d", v, uint32(1<<32-1))
	}
	*dst = uint32(n)
	return nil
}
