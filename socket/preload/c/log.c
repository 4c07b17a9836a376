/* Logging: one line per event, to stderr or BYPASSD_LOG_FILE, at or above
 * BYPASSD_LOG_LEVEL (error, warn (default), info, debug). Lines are written
 * with one write(2) so that threads and processes do not interleave them. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "bpd.h"

int bpd_log_level = BPD_LOG_WARN;
static int log_fd = 2;

void bpd_log_init(void)
{
	const char *l = getenv("BYPASSD_LOG_LEVEL");
	if (l && *l) {
		static const char *names[] = {"error", "warn", "info", "debug"};
		for (int i = 0; i < 4; i++)
			if (!strcasecmp(l, names[i]))
				bpd_log_level = i;
	}
	const char *f = getenv("BYPASSD_LOG_FILE");
	if (f && *f) {
		int fd = open(f, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
		if (fd >= 0)
			log_fd = fd;
		else
			bpd_log(BPD_LOG_WARN, "cannot open BYPASSD_LOG_FILE=%s; logging to stderr", f);
	}
}

void bpd_log(int level, const char *fmt, ...)
{
	static const char *tags[] = {"error", "warn", "info", "debug"};
	char buf[768];
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(buf, sizeof(buf), "%02d:%02d:%02d.%06ld libbypassd[%d] %s: ", tm.tm_hour,
			 tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, (int)getpid(),
			 tags[level < 0 ? 0 : level > 3 ? 3 : level]);
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
	if (len > sizeof(buf) - 2)
		len = sizeof(buf) - 2;
	buf[len++] = '\n';
	(void)!bpd_sys_write(log_fd, buf, len);
}

const char *bpd_fmt_addr(const struct bpd_addr *a, char *buf, size_t n)
{
	static const uint8_t v4[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	char ip[INET6_ADDRSTRLEN];
	if (!memcmp(a->addr, v4, 12)) {
		inet_ntop(AF_INET, a->addr + 12, ip, sizeof(ip));
		snprintf(buf, n, "%s:%u", ip, a->port);
	} else {
		inet_ntop(AF_INET6, a->addr, ip, sizeof(ip));
		snprintf(buf, n, "[%s]:%u", ip, a->port);
	}
	return buf;
}
