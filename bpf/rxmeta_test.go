package bpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// struct rx_meta is only cast to, so clang leaves it out of the object's
// BTF; TestRXTimestampsVariant checks the layout against what the loaded
// program writes instead.
func TestRXMetaLayout(t *testing.T) {
	spec, err := loadSteer()
	if err != nil {
		t.Fatal(err)
	}
	ts := spec.Programs[steerProgSteerTs]
	if ts == nil || ts.Type != spec.Programs[steerProgSteer].Type || ts.SectionName != "xdp" {
		t.Fatalf("steer_ts program spec %+v", ts)
	}

	b := make([]byte, RXMetaSize)
	if _, _, ok := ParseRXMeta(b); ok {
		t.Fatal("zero bytes parsed as present")
	}
	binary.LittleEndian.PutUint64(b, 1234567890123)
	status := -int32(unix.ENODATA)
	binary.LittleEndian.PutUint32(b[8:], uint32(status))
	binary.LittleEndian.PutUint32(b[12:], RXMetaMagic)
	if ts, status, ok := ParseRXMeta(b); !ok || ts != 1234567890123 || status != -int32(unix.ENODATA) {
		t.Fatalf("ParseRXMeta = %d, %d, %v", ts, status, ok)
	}
	if _, _, ok := ParseRXMeta(b[:8]); ok {
		t.Fatal("short slice parsed as present")
	}
}

// metaFrames returns the frames received so far with the metadata bytes in
// front of each: the flow tag, then RXMeta.
func (x *testXSK) metaFrames() (frames, metas [][]byte) {
	prod := atomic.LoadUint32(x.rxProd)
	cons := atomic.LoadUint32(x.rxCons)
	for ; cons != prod; cons++ {
		d := x.rxDescs[cons%xskRingSize]
		frames = append(frames, bytes.Clone(x.umem[d.Addr:d.Addr+uint64(d.Len)]))
		metas = append(metas, bytes.Clone(x.umem[d.Addr-RXMetaSize-FlowMetaSize:d.Addr]))
	}
	atomic.StoreUint32(x.rxCons, cons)
	return frames, metas
}

// The device-bound variant loads and attaches natively on veth, and the
// metadata it writes reaches a copy-mode AF_XDP socket: present, with
// veth's answer (status 0, timestamp 0: no hardware clock).
func TestRXTimestampsVariant(t *testing.T) {
	// Run-time statistics for RunStats, only while this test holds them.
	stats, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
	if err != nil {
		t.Fatal(err)
	}
	defer stats.Close()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{RXTimestamps: true})
	if !p.RXTimestamps() || p.Mode() != ModeNative || p.RXTimestampsRefused() != nil {
		t.Fatalf("RXTimestamps %v mode %v refused %v: want the device-bound variant in native mode",
			p.RXTimestamps(), p.Mode(), p.RXTimestampsRefused())
	}
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	dst := netip.AddrPortFrom(lab.A.Addr4(), 40123)
	if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: dst}, 0); err != nil {
		t.Fatal(err)
	}
	src := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(lab.B.Addr4(), 0))
	const n = 4
	for i := range n {
		send(t, src, dst, []byte{byte(i), 'm', 'e', 't', 'a'})
	}
	var frames, metas [][]byte
	deadline := time.Now().Add(ioTimeout)
	for len(frames) < n && time.Now().Before(deadline) {
		f, m := x.metaFrames()
		frames, metas = append(frames, f...), append(metas, m...)
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(x.fd), Events: unix.POLLIN}}, 50)
	}
	if len(frames) != n {
		t.Fatalf("received %d frames, want %d", len(frames), n)
	}
	for i, m := range metas {
		if home, ok := ParseFlowMeta(m); !ok || home != 0 {
			t.Fatalf("frame %d: flow tag present %v home %d, want home 0 in front of the timestamp", i, ok, home)
		}
		ts, status, ok := ParseRXMeta(m[FlowMetaSize:])
		t.Logf("frame %d: metadata % x: present %v ts %d status %d", i, m, ok, ts, status)
		if !ok {
			t.Fatalf("frame %d: no metadata in front of the frame in copy mode", i)
		}
		if ts != 0 || (status != 0 && status != -int32(unix.ENODATA)) {
			t.Fatalf("frame %d: veth gave ts %d status %d, want 0 and 0 or -ENODATA", i, ts, status)
		}
	}
	runs, total, err := p.RunStats()
	if err != nil || runs < n || total <= 0 {
		t.Fatalf("RunStats = %d runs, %v, %v; want at least %d runs", runs, total, err, n)
	}
	t.Logf("timestamping program: %d runs, %v per run", runs, total/time.Duration(runs))
}

// Generic mode cannot run device-bound programs: the plain program is used
// and the refusal is reported.
func TestRXTimestampsGeneric(t *testing.T) {
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeGeneric, RXTimestamps: true})
	if p.RXTimestamps() || p.Mode() != ModeGeneric || p.RXTimestampsRefused() == nil {
		t.Fatalf("RXTimestamps %v mode %v refused %v: want the plain program in generic mode with a reason",
			p.RXTimestamps(), p.Mode(), p.RXTimestampsRefused())
	}
}
