package daemon

import (
	"encoding/binary"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// No PHC on the machine (veth has none): mode 2 (best) falls back to
// disable with one clear log line naming the interface; so do sync and
// PTP. Mode 0 says so without probing.
func TestHWTimestampModeNoPHC(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	ifaces := []config.Interface{{Name: p.A.Name}, {Name: p.A.Name, Queue: 1}}
	for _, requested := range []tsconv.Mode{tsconv.ModeBest, tsconv.ModeSync, tsconv.ModePTP, tsconv.ModeRaw, tsconv.ModeDisable} {
		core, logs := observer.New(zap.DebugLevel)
		var got tsconv.Mode
		if err := p.A.NS.Do(func() (err error) {
			got, err = hwTimestampMode(ifaces, requested, zap.New(core))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if got != tsconv.ModeDisable {
			t.Errorf("mode %v on veth: effective %v, want disable", requested, got)
		}
		all := logs.All()
		if len(all) != 1 {
			t.Fatalf("mode %v: %d log lines, want one: %+v", requested, len(all), all)
		}
		msg := all[0].Message
		t.Logf("mode %d: %s", requested, msg)
		if requested != tsconv.ModeDisable && (!strings.Contains(msg, "no PHC on "+p.A.Name) || !strings.Contains(msg, "using mode 0")) {
			t.Errorf("mode %v: log line %q does not say which interface lacks a PHC and which mode is used", requested, msg)
		}
	}
}

// The daemon's rings run in the effective mode; the default request is 3.
func TestDaemonHWTimestampMode(t *testing.T) {
	l := newLab(t, config.Config{})
	if got := *l.d.cfg.HWTSConversion; got != tsconv.ModeSync {
		t.Fatalf("default requested mode %v, want sync", got)
	}
	for _, r := range l.d.Rings() {
		if m := r.HWTimestampMode(); m != tsconv.ModeDisable {
			t.Fatalf("ring mode %v on veth, want disable", m)
		}
	}
	bad := tsconv.Mode(7)
	if err := (config.Config{Interfaces: []config.Interface{{Name: "eth9"}}, HWTSConversion: &bad}).Validate(); err == nil || !strings.Contains(err.Error(), "conversion mode 7") {
		t.Fatalf("mode 7 accepted: %v", err)
	}
}

func TestSOTimestamping(t *testing.T) {
	k := testSocket(unix.AF_INET)
	get := func(name int32) int32 {
		t.Helper()
		b, err := k.option(unix.SOL_SOCKET, name)
		if err != nil || len(b) != 4 {
			t.Fatalf("get %s: %v %v", optName(unix.SOL_SOCKET, name), b, err)
		}
		return int32(binary.LittleEndian.Uint32(b))
	}
	if get(unix.SO_TIMESTAMPING) != 0 {
		t.Fatal("timestamps reported before they were asked for")
	}
	all := int32(unix.SOF_TIMESTAMPING_RX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE | unix.SOF_TIMESTAMPING_RX_HARDWARE |
		unix.SOF_TIMESTAMPING_RAW_HARDWARE | unix.SOF_TIMESTAMPING_SYS_HARDWARE)
	if err := k.setOption(unix.SOL_SOCKET, unix.SO_TIMESTAMPING, le32(all)); err != nil {
		t.Fatal(err)
	}
	if got := get(unix.SO_TIMESTAMPING); got != all || get(unix.SO_TIMESTAMPING_NEW) != all {
		t.Fatalf("after set: %#x, want %#x", got, all)
	}
	// struct so_timestamping {flags, bind_phc} is accepted too; the
	// cmsg-format option is kept without meaning.
	st := append(le32(unix.SOF_TIMESTAMPING_SOFTWARE|unix.SOF_TIMESTAMPING_OPT_CMSG), le32(0)...)
	if err := k.setOption(unix.SOL_SOCKET, unix.SO_TIMESTAMPING_NEW, st); err != nil || get(unix.SO_TIMESTAMPING) != unix.SOF_TIMESTAMPING_SOFTWARE|unix.SOF_TIMESTAMPING_OPT_CMSG {
		t.Fatalf("struct form: %v, flags %#x", err, get(unix.SO_TIMESTAMPING))
	}
	for _, tc := range []struct {
		val   []byte
		errno unix.Errno
		text  string
	}{
		{le32(unix.SOF_TIMESTAMPING_TX_SOFTWARE | unix.SOF_TIMESTAMPING_SOFTWARE), unix.EOPNOTSUPP, "transmit"},
		{le32(unix.SOF_TIMESTAMPING_BIND_PHC), unix.EOPNOTSUPP, "BIND_PHC"},
		{le32(1 << 30), unix.EINVAL, "unknown flags"},
		{[]byte{1, 2}, unix.EINVAL, "2 bytes"},
	} {
		err := k.setOption(unix.SOL_SOCKET, unix.SO_TIMESTAMPING, tc.val)
		if errnoOf(err) != tc.errno || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("set SO_TIMESTAMPING % x: %v, want %v mentioning %q", tc.val, err, tc.errno, tc.text)
		}
	}
	// A refused value leaves the flags as they were.
	if get(unix.SO_TIMESTAMPING) != unix.SOF_TIMESTAMPING_SOFTWARE|unix.SOF_TIMESTAMPING_OPT_CMSG {
		t.Fatal("a refused set changed the flags")
	}
}
