package qos

import "testing"

// The QoS document's fixed translation: ToS 0 <=> sk_prio 0, 8 <=> 2,
// 24 <=> 4, 16 <=> 6.
func TestTOSToSkPrioDocument(t *testing.T) {
	for _, c := range []struct{ tos, prio uint8 }{{0, 0}, {8, 2}, {24, 4}, {16, 6}} {
		if got := TOSToSkPrio(c.tos); got != c.prio {
			t.Errorf("ToS %d: sk_prio %d, want %d", c.tos, got, c.prio)
		}
		if c.prio == 0 {
			continue
		}
		if tos, ok := SkPrioTOS(c.prio); !ok || tos != c.tos {
			t.Errorf("sk_prio %d: ToS %d (%v), want %d", c.prio, tos, ok, c.tos)
		}
	}
}

// Every ToS byte lands on one of the document's four sk_prios, as in the
// kernel's rt_tos2priority: the ECN bits and the precedence bits do not
// matter, bit 1 (ECN_OR_COST, "minimise cost") does not either.
func TestTOSToSkPrioEveryValue(t *testing.T) {
	for tos := range 256 {
		want := map[int]uint8{0: 0, 8: 2, 16: 6, 24: 4}[tos&0x18]
		if got := TOSToSkPrio(uint8(tos)); got != want {
			t.Errorf("ToS %#02x: sk_prio %d, want %d", tos, got, want)
		}
	}
}

func TestDSCPArithmetic(t *testing.T) {
	// The RoCE document: DSCP 24 is ToS 96 (24 × 4).
	if TOSOfDSCP(24) != 96 || DSCP(96) != 24 {
		t.Fatalf("DSCP 24 <-> ToS %d, ToS 96 -> DSCP %d", TOSOfDSCP(24), DSCP(96))
	}
	// EF (46) is ToS 0xb8; ECN bits do not change the DSCP.
	if TOSOfDSCP(46) != 0xb8 || DSCP(0xbb) != 46 {
		t.Fatalf("EF: ToS %#x, DSCP of 0xbb %d", TOSOfDSCP(46), DSCP(0xbb))
	}
}

// The document's second mlnx_qos example: -s ets,ets,strict
// -p 0,1,1,1,2,2,2 -t 30,70 on the default egress map sends sk_prio 0..15
// (ToS 0, 8, 24, 16 among them) to UP 0 and TC 0 there because its
// egress map is all zeros; with the identity map each UP goes where -p
// says.
func TestEgressDocumentExample(t *testing.T) {
	c := Default()
	for _, f := range []func() error{
		func() error { return c.SetTSA("ets,ets,strict") },
		func() error { return c.SetPrioTC("0,1,1,1,2,2,2") },
		func() error { return c.SetTCBW("30,70") },
	} {
		if err := f(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	wantTC := [NumTC]uint8{0, 1, 1, 1, 2, 2, 2, 0}
	for up := range NumTC {
		if got := c.Egress(uint32(up)); got.UP != uint8(up) || got.TC != wantTC[up] {
			t.Errorf("sk_prio %d: %+v, want UP %d TC %d", up, got, up, wantTC[up])
		}
	}
	// ToS through sk_prio: 8 -> 2 -> TC 1, 24 -> 4 -> TC 2, 16 -> 6 -> TC 2.
	for _, x := range []struct{ tos, tc uint8 }{{0, 0}, {8, 1}, {24, 2}, {16, 2}} {
		if got := c.Egress(uint32(TOSToSkPrio(x.tos))); got.TC != x.tc {
			t.Errorf("ToS %d: TC %d, want %d", x.tos, got.TC, x.tc)
		}
	}
	// The document's map, all sk_prios to UP 0.
	if err := c.SetSkPrioUP("0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0"); err != nil {
		t.Fatal(err)
	}
	for p := range NumSkPrio {
		if got := c.Egress(uint32(p)); got.UP != 0 || got.TC != 0 {
			t.Errorf("all-zero egress map: sk_prio %d: %+v", p, got)
		}
	}
	// sk_prio is masked with 15 as the kernel masks it.
	if err := c.SetSkPrioUP("0,7"); err != nil {
		t.Fatal(err)
	}
	if got := c.Egress(17); got.UP != 7 {
		t.Errorf("sk_prio 17: %+v, want UP 7 (17 & 15 = 1)", got)
	}
}

func TestDefaultMaps(t *testing.T) {
	c := Default()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// The document's default listing: UP 0 in TC 1, UP 1 in TC 0, the
	// others in their own; dscp2prio DSCP/8.
	want := [NumTC]uint8{1, 0, 2, 3, 4, 5, 6, 7}
	if c.PrioTC != want {
		t.Errorf("prio_tc %v, want %v", c.PrioTC, want)
	}
	for d := range 64 {
		if c.DSCP2Prio[d] != uint8(d/8) {
			t.Errorf("dscp %d -> prio %d, want %d", d, c.DSCP2Prio[d], d/8)
		}
	}
	if c.Trust != TrustPCP || c.TrafficClass != -1 || c.TTL != 0 {
		t.Errorf("default trust %v, traffic_class %d, ttl %d", c.Trust, c.TrafficClass, c.TTL)
	}
}

func TestIngress(t *testing.T) {
	c := Default()
	// Trust PCP: the tag's PCP; untagged frames are priority 0.
	if p, tc := c.Ingress(0xb8, 5, true); p != 5 || tc != 5 {
		t.Errorf("pcp 5: prio %d tc %d", p, tc)
	}
	if p, tc := c.Ingress(0xb8, 5, false); p != 0 || tc != 1 {
		t.Errorf("untagged: prio %d tc %d, want 0 and 1", p, tc)
	}
	// Trust DSCP: the document's 'set,30,2' example.
	c.Trust = TrustDSCP
	if err := c.SetDSCP2Prio("set,30,2"); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Ingress(TOSOfDSCP(30)|1, 7, true); p != 2 {
		t.Errorf("dscp 30: prio %d, want 2", p)
	}
	if p, _ := c.Ingress(TOSOfDSCP(46), 0, false); p != 5 {
		t.Errorf("dscp 46: prio %d, want 5 (the default 46/8)", p)
	}
	if err := c.SetDSCP2Prio("del,30,2"); err != nil {
		t.Fatal(err)
	}
	if p, _ := c.Ingress(TOSOfDSCP(30), 0, false); p != 0 {
		t.Errorf("after del: dscp 30 prio %d, want 0", p)
	}
}
