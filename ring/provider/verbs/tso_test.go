//go:build verbs

package verbs

import (
	"runtime"
	"testing"

	"github.com/bypassd/bypassd/ring/qp"
)

// Large sends (hardware TSO) without a device: which devices get them, the
// buffers, and the work request rdma-core's ibv_post_send is given, read
// back from its own structs.

func TestTSOLimit(t *testing.T) {
	cx5 := DeviceCaps{MaxTSO: 262144, RawPacketCaps: []string{"cvlan_stripping", "ip_csum"}}
	for _, c := range []struct {
		name string
		caps DeviceCaps
		want int
	}{
		{"ConnectX-5: a buffer's worth", cx5, tsoBufSize},
		{"small max_tso", DeviceCaps{MaxTSO: 16384, RawPacketCaps: []string{"ip_csum"}}, 16384},
		{"no TSO for raw packet QPs", DeviceCaps{RawPacketCaps: []string{"ip_csum"}}, 0},
		{"TSO without checksum offload", DeviceCaps{MaxTSO: 262144, RawPacketCaps: []string{"cvlan_stripping"}}, 0},
	} {
		if got := tsoLimit(c.caps); got != c.want {
			t.Errorf("%s: tsoLimit = %d, want %d", c.name, got, c.want)
		}
	}
	if tsoBufSize < 14+65535 {
		t.Fatalf("a %d-byte large-send buffer cannot hold the stack's largest packet", tsoBufSize)
	}
}

// tsoProvider is bookkeepingProvider with large-send buffers after the
// frames, as Open lays them out on a device with TSO.
func tsoProvider(t *testing.T) *Provider {
	t.Helper()
	p := bookkeepingProvider(0)
	p.tso = tsoBufSize
	p.tsoBase = uint64(len(p.pool))
	p.pool = append(p.pool, make([]byte, tsoBuffers*tsoBufSize)...)
	for i := range tsoBuffers {
		p.tsoFree = append(p.tsoFree, p.tsoBase+uint64(i*tsoBufSize))
	}
	p.lkey = 7
	return p
}

func TestAllocTSO(t *testing.T) {
	p := tsoProvider(t)
	var f qp.Frame
	for _, c := range []struct {
		name      string
		size, hdr int
	}{
		{"larger than the device takes", tsoBufSize + 1, 66},
		{"headers larger than the QP takes", 30000, tsoMaxHeader + 1},
		{"no payload", 66, 66},
	} {
		if p.AllocTSO(&f, c.size, c.hdr) {
			t.Errorf("%s: AllocTSO(%d, %d) gave a buffer", c.name, c.size, c.hdr)
		}
	}
	var got []qp.Frame
	for p.AllocTSO(&f, 14+65535, 66) {
		if f.Handle < p.tsoBase || len(f.Buf) != tsoBufSize || &f.Buf[0] != &p.pool[f.Handle] {
			t.Fatalf("large buffer %+v outside the large-send region at %d", f.Handle, p.tsoBase)
		}
		got = append(got, f)
	}
	if len(got) != tsoBuffers || p.txNoBuffer.Load() != 1 {
		t.Fatalf("%d large buffers before running out (no-buffer count %d), want %d", len(got), p.txNoBuffer.Load(), tsoBuffers)
	}
	p.FreeTX(got[:1])
	if len(p.tsoFree) != 1 || p.free.Len() != 0 {
		t.Fatalf("FreeTX of a large buffer: %d large, %d frame buffers free", len(p.tsoFree), p.free.Len())
	}
	p.bind = Binding{Device: "mlx5_0", Port: 1}
	if m := p.mode(); m != "raw-packet mlx5_0:1, tso 69632" {
		t.Errorf("mode %q does not say the device segments", m)
	}
	// A provider whose device does not segment never hands one out.
	p.tso = 0
	if p.AllocTSO(&f, 3000, 66) {
		t.Fatal("AllocTSO without TSO gave a buffer")
	}
	if m := p.mode(); m != "raw-packet mlx5_0:1" {
		t.Errorf("mode %q without TSO", m)
	}
}

func TestLargeSendWorkRequest(t *testing.T) {
	p := tsoProvider(t)
	var big qp.Frame
	const size, hdr, mss = 14 + 20 + 32 + 40000, 14 + 20 + 32, 1448
	if !p.AllocTSO(&big, size, hdr) {
		t.Fatal("no large buffer")
	}
	big.Buf, big.MSS, big.HeaderLen = big.Buf[:size], mss, hdr
	small := qp.Frame{Buf: p.pool[32*2048 : 32*2048+100], Handle: 32 * 2048}
	plain := qp.Frame{Buf: p.pool[33*2048 : 33*2048+1500], Handle: 33 * 2048}
	wrs := p.buildSends(0, []qp.Frame{big, small, plain})
	w := wrs[0]
	if w.MSS != mss || w.HdrLen != hdr || w.Len != size || w.Addr != uint64(p.base)+big.Handle ||
		w.Flags&sendIPCsum == 0 || w.Flags&sendInline != 0 {
		t.Fatalf("large send %+v: want MSS %d, headers %d, %d bytes, checksums by the device, not inline", w, mss, hdr, size)
	}
	// What ibv_post_send gets, from rdma-core's struct ibv_send_wr.
	v := cViewSend(w)
	want := sendView{WRID: w.WRID, Opcode: wrTSO, Flags: w.Flags, NumSGE: 1,
		TSOHdr: w.Addr, TSOHdrSize: hdr, TSOMSS: mss,
		SGEAddr: w.Addr + hdr, SGELen: size - hdr, Key: 7}
	if v != want {
		t.Fatalf("IBV_WR_TSO request:\n got %+v\nwant %+v", v, want)
	}
	for i, w := range wrs[1:] {
		v := cViewSend(w)
		want := sendView{WRID: w.WRID, Opcode: wrSend, Flags: w.Flags, NumSGE: 1, SGEAddr: w.Addr, SGELen: w.Len, Key: 7}
		if v != want || w.MSS != 0 || w.Flags&sendIPCsum != 0 {
			t.Errorf("frame %d: request %+v (built %+v), want a plain IBV_WR_SEND %+v", i+1, v, w, want)
		}
	}
	if wrs[1].Flags&sendInline == 0 || wrs[2].Flags&sendInline != 0 {
		t.Errorf("inline flags: small %#x, full-size %#x", wrs[1].Flags, wrs[2].Flags)
	}
	// The completion gives the large buffer back to its own list.
	p.sq[0].inflight = append(p.sq[0].inflight, postedFrame{seq: 0, handle: big.Handle})
	p.pending = 1
	free := len(p.tsoFree)
	if n := p.takeTX([]completion{{WRID: 0}}); n != 1 || len(p.tsoFree) != free+1 || p.free.Len() != 0 {
		t.Fatalf("completion: %d retired, %d large buffers free (want %d), %d frame buffers", n, len(p.tsoFree), free+1, p.free.Len())
	}
}

// TestSendWRLayout: where verbs.h puts the tso member of struct
// ibv_send_wr on x86-64 (rdma-core's ABI since the member was added).
func TestSendWRLayout(t *testing.T) {
	hdr, hdrSize, mss, size := sendWRLayout()
	t.Logf("struct ibv_send_wr: %d bytes, tso.hdr at %d, tso.hdr_sz at %d, tso.mss at %d", size, hdr, hdrSize, mss)
	if hdrSize != hdr+8 || mss != hdrSize+2 || hdr%8 != 0 || mss+2 > size {
		t.Fatalf("tso member {hdr at %d, hdr_sz at %d, mss at %d} in %d bytes is not {void *, uint16_t, uint16_t}", hdr, hdrSize, mss, size)
	}
	if runtime.GOARCH == "amd64" && (hdr != 80 || size != 128) {
		t.Fatalf("x86-64: tso.hdr at %d in a %d-byte struct, want 80 in 128", hdr, size)
	}
}
