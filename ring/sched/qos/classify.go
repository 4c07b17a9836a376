package qos

// NumTC is the number of traffic classes (and of user priorities).
const NumTC = 8

// NumSkPrio is the number of socket priorities the egress map covers: the
// kernel masks sk_prio with 15 (TC_BITMASK) before its priority map.
const NumSkPrio = 16

// tos2prio is Linux's ip_tos2prio (rt_tos2priority): the sk_prio a socket
// gets from IP_TOS, indexed by the ToS bits 1..4. The QoS document lists
// the four distinct values (ToS 0 → 0, 8 → 2, 24 → 4, 16 → 6); every other
// ToS byte falls on one of them, as it does in the kernel.
var tos2prio = [16]uint8{0, 0, 0, 0, 2, 2, 2, 2, 6, 6, 6, 6, 4, 4, 4, 4}

// TOSToSkPrio returns the socket priority setting IP_TOS (or IPV6_TCLASS)
// to tos gives a socket.
func TOSToSkPrio(tos uint8) uint8 { return tos2prio[(tos&0x1e)>>1] }

// SkPrioTOS returns the ToS byte whose fixed translation is skprio (what
// mlnx_qos prints beside it), or ok=false when none is (only 2, 4 and 6
// have one; 0 is the default and is shown without it).
func SkPrioTOS(skprio uint8) (tos uint8, ok bool) {
	switch skprio {
	case 2:
		return 8, true
	case 4:
		return 24, true
	case 6:
		return 16, true
	}
	return 0, false
}

// DSCP returns the DSCP of a ToS byte (the document's "multiply by 4"
// read backwards: ToS = DSCP × 4 + ECN).
func DSCP(tos uint8) uint8 { return tos >> 2 }

// TOSOfDSCP returns the ToS byte carrying dscp with ECN 0 (DSCP × 4).
func TOSOfDSCP(dscp uint8) uint8 { return dscp << 2 }

// Class is the result of classifying a transmitted datagram.
type Class struct {
	SkPrio uint32 // the socket priority
	UP     uint8  // user priority (the VLAN PCP)
	TC     uint8  // traffic class
}

// Egress classifies a socket's datagrams: its sk_prio through the egress
// map to a user priority, and that through prio_tc to a traffic class.
func (c *Config) Egress(skprio uint32) Class {
	up := c.SkPrioUP[skprio&(NumSkPrio-1)]
	return Class{SkPrio: skprio, UP: up, TC: c.PrioTC[up]}
}

// Ingress returns the priority and traffic class of a received frame under
// the trust state: its VLAN PCP (untagged frames: priority 0) when trusting
// PCP, its DSCP through dscp2prio when trusting DSCP.
func (c *Config) Ingress(tos uint8, pcp uint8, tagged bool) (prio, tc uint8) {
	switch c.Trust {
	case TrustDSCP:
		prio = c.DSCP2Prio[DSCP(tos)]
	default:
		if tagged {
			prio = pcp & 7
		}
	}
	return prio, c.PrioTC[prio]
}
