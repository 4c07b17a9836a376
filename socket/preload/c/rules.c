/* Offload rules, in the spirit of libvma.conf (docs/preload.md):
 *
 *   offload|kernel [program=GLOB] [local=SPEC] [remote=SPEC]
 *   default offload|kernel
 *
 * SPEC is ADDR[/LEN][:PORTS], [IPV6][/LEN][:PORTS] or *[:PORTS]; PORTS is N,
 * N-M or *. Rules are separated by ';' or newlines, '#' starts a comment.
 * The first rule that matches decides; a rule naming local or remote
 * matches only when that address is known (local at bind, remote at
 * connect or at the first send of an unbound socket). */
#include <arpa/inet.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bpd.h"

static int parse_ports(const char *s, struct bpd_prefix *p)
{
	if (!strcmp(s, "*")) {
		p->port_lo = 0;
		p->port_hi = 65535;
		return 0;
	}
	char *end;
	unsigned long lo = strtoul(s, &end, 10), hi = lo;
	if (end == s)
		return -1;
	if (*end == '-') {
		const char *h = end + 1;
		hi = strtoul(h, &end, 10);
		if (end == h)
			return -1;
	}
	if (*end || lo > 65535 || hi > 65535 || lo > hi)
		return -1;
	p->port_lo = (uint16_t)lo;
	p->port_hi = (uint16_t)hi;
	return 0;
}

static int parse_spec(const char *s, struct bpd_prefix *p)
{
	char addr[64] = {0};
	const char *rest;
	memset(p, 0, sizeof(*p));
	p->port_hi = 65535;
	if (s[0] == '[') {
		const char *e = strchr(s, ']');
		if (!e || (size_t)(e - s - 1) >= sizeof(addr))
			return -1;
		memcpy(addr, s + 1, (size_t)(e - s - 1));
		rest = e + 1;
	} else {
		size_t n = strcspn(s, "/:");
		if (n >= sizeof(addr))
			return -1;
		memcpy(addr, s, n);
		rest = s + n;
	}
	int bits = -1;
	if (*rest == '/') {
		char *end;
		long b = strtol(rest + 1, &end, 10);
		if (end == rest + 1 || b < 0 || b > 128)
			return -1;
		bits = (int)b;
		rest = end;
	}
	if (*rest == ':') {
		if (parse_ports(rest + 1, p))
			return -1;
	} else if (*rest) {
		return -1;
	}
	if (!strcmp(addr, "*")) {
		p->any = 1;
		return bits < 0 ? 0 : -1;
	}
	struct in_addr a4;
	if (inet_pton(AF_INET, addr, &a4) == 1) {
		if (bits > 32)
			return -1;
		p->addr[10] = p->addr[11] = 0xff;
		memcpy(p->addr + 12, &a4, 4);
		p->bits = 96 + (bits < 0 ? 32 : bits);
		return 0;
	}
	if (inet_pton(AF_INET6, addr, p->addr) == 1) {
		p->bits = bits < 0 ? 128 : bits;
		return 0;
	}
	return -1;
}

static int parse_rule(char *line, struct bpd_rule *r, struct bpd_rules *rs, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	char *save = NULL, *tok = strtok_r(line, " \t\r", &save);
	if (!tok)
		return 1; /* empty */
	if (!strcmp(tok, "default")) {
		char *a = strtok_r(NULL, " \t\r", &save);
		if (!a || (strcmp(a, "offload") && strcmp(a, "kernel")) || strtok_r(NULL, " \t\r", &save)) {
			snprintf(err, errlen, "\"default\" takes offload or kernel");
			return -1;
		}
		rs->dflt = !strcmp(a, "offload") ? BPD_RULE_OFFLOAD : BPD_RULE_KERNEL;
		return 1;
	}
	if (!strcmp(tok, "offload"))
		r->action = BPD_RULE_OFFLOAD;
	else if (!strcmp(tok, "kernel"))
		r->action = BPD_RULE_KERNEL;
	else {
		snprintf(err, errlen, "rule starts with \"%s\"; want offload, kernel or default", tok);
		return -1;
	}
	while ((tok = strtok_r(NULL, " \t\r", &save))) {
		if (!strncmp(tok, "program=", 8) && strlen(tok + 8) < sizeof(r->program)) {
			strcpy(r->program, tok + 8);
		} else if (!strncmp(tok, "local=", 6) && !parse_spec(tok + 6, &r->local)) {
			r->has_local = 1;
		} else if (!strncmp(tok, "remote=", 7) && !parse_spec(tok + 7, &r->remote)) {
			r->has_remote = 1;
		} else {
			snprintf(err, errlen,
				 "cannot parse \"%s\"; want program=GLOB, local=ADDR[/LEN][:PORTS] or "
				 "remote=ADDR[/LEN][:PORTS]",
				 tok);
			return -1;
		}
	}
	return 0;
}

int bpd_rules_parse(struct bpd_rules *rs, const char *text, char *err, size_t errlen)
{
	rs->r = NULL;
	rs->n = 0;
	rs->dflt = BPD_RULE_OFFLOAD;
	if (!text)
		return 0;
	char *copy = strdup(text);
	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	int cap = 0, rc = 0, lineno = 0;
	char *save = NULL;
	for (char *line = strtok_r(copy, ";\n", &save); line; line = strtok_r(NULL, ";\n", &save)) {
		lineno++;
		char *hash = strchr(line, '#');
		if (hash)
			*hash = 0;
		struct bpd_rule r;
		char e[160];
		int k = parse_rule(line, &r, rs, e, sizeof(e));
		if (k < 0) {
			snprintf(err, errlen, "rule %d: %s", lineno, e);
			rc = -1;
			break;
		}
		if (k > 0)
			continue;
		if (rs->n == cap) {
			cap = cap ? cap * 2 : 8;
			struct bpd_rule *nr = realloc(rs->r, (size_t)cap * sizeof(*nr));
			if (!nr) {
				snprintf(err, errlen, "out of memory");
				rc = -1;
				break;
			}
			rs->r = nr;
		}
		rs->r[rs->n++] = r;
	}
	free(copy);
	if (rc)
		bpd_rules_free(rs);
	return rc;
}

void bpd_rules_free(struct bpd_rules *rs)
{
	free(rs->r);
	rs->r = NULL;
	rs->n = 0;
}

static int prefix_match(const struct bpd_prefix *p, const struct bpd_addr *a)
{
	if (a->port < p->port_lo || a->port > p->port_hi)
		return 0;
	if (p->any)
		return 1;
	int bits = p->bits;
	for (int i = 0; i < 16 && bits > 0; i++, bits -= 8) {
		uint8_t mask = bits >= 8 ? 0xff : (uint8_t)(0xff << (8 - bits));
		if ((a->addr[i] ^ p->addr[i]) & mask)
			return 0;
	}
	return 1;
}

int bpd_rules_match(const struct bpd_rules *rs, const char *program, const struct bpd_addr *local,
		    const struct bpd_addr *remote)
{
	for (int i = 0; i < rs->n; i++) {
		const struct bpd_rule *r = &rs->r[i];
		if (r->program[0] && fnmatch(r->program, program, 0))
			continue;
		if (r->has_local && (!local || !prefix_match(&r->local, local)))
			continue;
		if (r->has_remote && (!remote || !prefix_match(&r->remote, remote)))
			continue;
		return r->action;
	}
	return rs->dflt;
}
