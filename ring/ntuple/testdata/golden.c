/* golden.c: prints struct ethtool_rxnfc requests as the kernel's own headers
 * lay them out, one hex line per rule, for ntuple's byte-for-byte test
 * (TestEncodeMatchesKernelHeaders). Built by the test when a C compiler and
 * <linux/ethtool.h> are present; its output is committed as golden.hex. */
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <linux/ethtool.h>

static void dump(const char *name, const struct ethtool_rxnfc *n)
{
	const unsigned char *b = (const unsigned char *)n;
	size_t i;

	printf("%s ", name);
	for (i = 0; i < sizeof(*n); i++)
		printf("%02x", b[i]);
	printf("\n");
}

int main(void)
{
	struct ethtool_rxnfc n;

	/* ethtool -N eth1 flow-type udp4 dst-ip 10.1.2.3 dst-port 7000 action 3 */
	memset(&n, 0, sizeof(n));
	n.cmd = ETHTOOL_SRXCLSRLINS;
	n.fs.flow_type = UDP_V4_FLOW;
	n.fs.h_u.udp_ip4_spec.ip4dst = inet_addr("10.1.2.3");
	n.fs.m_u.udp_ip4_spec.ip4dst = 0xffffffff;
	n.fs.h_u.udp_ip4_spec.pdst = htons(7000);
	n.fs.m_u.udp_ip4_spec.pdst = 0xffff;
	n.fs.ring_cookie = 3;
	n.fs.location = RX_CLS_LOC_ANY;
	dump("udp4-3tuple", &n);

	/* ... src-ip 10.9.8.7 src-port 40000 action 1, TCP */
	memset(&n, 0, sizeof(n));
	n.cmd = ETHTOOL_SRXCLSRLINS;
	n.fs.flow_type = TCP_V4_FLOW;
	n.fs.h_u.tcp_ip4_spec.ip4dst = inet_addr("10.1.2.3");
	n.fs.m_u.tcp_ip4_spec.ip4dst = 0xffffffff;
	n.fs.h_u.tcp_ip4_spec.pdst = htons(80);
	n.fs.m_u.tcp_ip4_spec.pdst = 0xffff;
	n.fs.h_u.tcp_ip4_spec.ip4src = inet_addr("10.9.8.7");
	n.fs.m_u.tcp_ip4_spec.ip4src = 0xffffffff;
	n.fs.h_u.tcp_ip4_spec.psrc = htons(40000);
	n.fs.m_u.tcp_ip4_spec.psrc = 0xffff;
	n.fs.ring_cookie = 1;
	n.fs.location = RX_CLS_LOC_ANY;
	dump("tcp4-5tuple", &n);

	/* ethtool -N eth1 flow-type udp6 dst-ip fd00::1 dst-port 53 action 7 */
	memset(&n, 0, sizeof(n));
	n.cmd = ETHTOOL_SRXCLSRLINS;
	n.fs.flow_type = UDP_V6_FLOW;
	inet_pton(AF_INET6, "fd00::1", n.fs.h_u.udp_ip6_spec.ip6dst);
	memset(n.fs.m_u.udp_ip6_spec.ip6dst, 0xff, 16);
	n.fs.h_u.udp_ip6_spec.pdst = htons(53);
	n.fs.m_u.udp_ip6_spec.pdst = 0xffff;
	n.fs.ring_cookie = 7;
	n.fs.location = RX_CLS_LOC_ANY;
	dump("udp6-3tuple", &n);

	/* ethtool -N eth1 delete 1023 */
	memset(&n, 0, sizeof(n));
	n.cmd = ETHTOOL_SRXCLSRLDEL;
	n.fs.location = 1023;
	dump("delete-1023", &n);
	return 0;
}
