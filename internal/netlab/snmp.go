package netlab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SNMPCounter reads one counter of ns's IP stack from /proc/net/snmp
// (table "Udp", "Ip", ...; field "InDatagrams", "ReasmReqds", ...) or, with
// table "", from /proc/net/snmp6 (field "Udp6InDatagrams"): what tests
// compare before and after to prove traffic did or did not go through the
// kernel.
func (ns *NS) SNMPCounter(table, field string) (uint64, error) {
	var v uint64
	err := ns.Do(func() error {
		var err error
		v, err = snmpCounter(table, field)
		return err
	})
	return v, err
}

// snmpCounter reads one counter of the calling thread's namespace from
// /proc/thread-self/net/snmp ("Udp", "InCsumErrors") or snmp6 ("",
// "Udp6InCsumErrors"). /proc/self/net would show the namespace of the
// process's main thread instead, so it must not be used inside NS.Do.
func snmpCounter(table, field string) (uint64, error) {
	if table == "" {
		data, err := os.ReadFile("/proc/thread-self/net/snmp6")
		if err != nil {
			return 0, err
		}
		for _, line := range strings.Split(string(data), "\n") {
			f := strings.Fields(line)
			if len(f) == 2 && f[0] == field {
				return strconv.ParseUint(f[1], 10, 64)
			}
		}
		return 0, fmt.Errorf("snmp6 has no %s", field)
	}
	f, err := os.Open("/proc/thread-self/net/snmp")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var header []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != table+":" {
			continue
		}
		if header == nil {
			header = fields
			continue
		}
		for i := 1; i < len(header) && i < len(fields); i++ {
			if header[i] == field {
				return strconv.ParseUint(fields[i], 10, 64)
			}
		}
		return 0, fmt.Errorf("snmp table %s has no %s", table, field)
	}
	return 0, errors.Join(sc.Err(), fmt.Errorf("snmp has no table %s", table))
}
