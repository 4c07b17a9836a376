/* An ordinary TCP program (it knows nothing of bypassd) that socket/preload's
 * lab test runs under libbypassd.so, built with ASan and UBSan. Its peers
 * are kernel sockets in the other namespace (the Go test serves them):
 *
 *   tcp LOCAL_IP PEER_IP ECHO_PORT CLOSED_PORT SINK_PORT CALLBACK_PORT RESET_PORT [MAX]
 *
 * ECHO echoes every byte and half-closes after the client's FIN; nothing
 * listens on CLOSED; SINK reads until the connection ends and the test
 * checks it saw a reset; CALLBACK reads a port number, connects back to
 * LOCAL_IP:port from the kernel, sends 1 MiB, half-closes, reads the echo
 * and answers "ok" or "bad" on the first connection; RESET accepts and
 * resets the connection at once (SO_LINGER 0). MAX (default 16 MiB)
 * is the largest transfer.
 *
 * Covers blocking and non-blocking connect (EINPROGRESS, SO_ERROR),
 * ECONNREFUSED (POLLERR|POLLHUP), 1 B .. 16 MiB byte-exact both ways (write/read, writev/
 * readv, sendmsg/recvmsg), partial non-blocking writes, MSG_PEEK,
 * MSG_DONTWAIT, MSG_WAITALL, shutdown(SHUT_WR) with EOF to the reader,
 * epoll and poll readiness (data, EOF with EPOLLRDHUP and EPOLLHUP, a
 * reset: ECONNRESET once, then EOF and EPIPE; a writer's next write after
 * a reset: ECONNRESET, then EPIPE), SO_LINGER 0 -> RST, listen + accept4 flags,
 * getsockname/getpeername, the TCP options, and fork (the child's
 * inherited socket fails with EBADFD). Prints "ok NAME" per check and
 * "bytes N" (sent through the library); exits 1 on a failure. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                                       \
	do {                                                                                   \
		if (!(cond)) {                                                                 \
			fprintf(stderr, "FAIL line %d: ", __LINE__);                            \
			fprintf(stderr, __VA_ARGS__);                                          \
			fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));           \
			exit(1);                                                               \
		}                                                                              \
	} while (0)

static struct sockaddr_in local, echo_addr, closed_addr, sink_addr, callback_addr, reset_addr;
static long long bytes_sent;
static size_t max_transfer = 16 << 20;

static void ok(const char *name)
{
	printf("ok %s\n", name);
	fflush(stdout);
}

static uint8_t pattern(size_t i, unsigned seed) { return (uint8_t)((i * 131u + seed + (i >> 12)) & 0xff); }

static int tcp_socket(int flags) { return socket(AF_INET, SOCK_STREAM | flags, 0); }

static int connect_to(const struct sockaddr_in *a)
{
	int fd = tcp_socket(0);
	CHECK(fd >= 0, "socket");
	CHECK(connect(fd, (const struct sockaddr *)a, sizeof(*a)) == 0, "connect");
	return fd;
}

static void write_all(int fd, const uint8_t *b, size_t n)
{
	while (n) {
		ssize_t k = write(fd, b, n);
		CHECK(k > 0, "write");
		b += k;
		n -= (size_t)k;
		bytes_sent += k;
	}
}

struct writer {
	int fd;
	size_t n;
	unsigned seed;
	int use_sendmsg;
};

/* writer_main sends the pattern in pieces of varying size, then FIN. */
static void *writer_main(void *arg)
{
	struct writer *w = arg;
	size_t chunk = 1 << 16;
	uint8_t *buf = malloc(chunk);
	CHECK(buf, "malloc");
	for (size_t off = 0; off < w->n;) {
		size_t k = w->n - off < chunk ? w->n - off : chunk;
		k = k > 7 && (off / chunk) % 3 == 1 ? k - 7 : k; /* uneven pieces */
		for (size_t i = 0; i < k; i++)
			buf[i] = pattern(off + i, w->seed);
		ssize_t r;
		if (w->use_sendmsg) {
			struct iovec v[2] = {{buf, k / 2}, {buf + k / 2, k - k / 2}};
			struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
			r = sendmsg(w->fd, &m, MSG_NOSIGNAL);
		} else {
			struct iovec v[2] = {{buf, k / 3}, {buf + k / 3, k - k / 3}};
			r = writev(w->fd, v, 2);
		}
		CHECK(r > 0, "write of %zu", k);
		off += (size_t)r;
		bytes_sent += r;
	}
	free(buf);
	CHECK(shutdown(w->fd, SHUT_WR) == 0, "shutdown(SHUT_WR)");
	return NULL;
}

/* exchange sends n pattern bytes to the echo server and reads them back
 * byte-exact until EOF (the server's half-close after our FIN). */
static void exchange(size_t n, unsigned seed, int use_sendmsg)
{
	int fd = connect_to(&echo_addr);
	struct writer w = {fd, n, seed, use_sendmsg};
	pthread_t th;
	CHECK(!pthread_create(&th, NULL, writer_main, &w), "pthread_create");
	uint8_t buf[70000];
	size_t got = 0, want = sizeof(buf);
	for (;;) {
		ssize_t k;
		want = want == sizeof(buf) ? 1 : want * 3 + 1 > sizeof(buf) ? sizeof(buf) : want * 3 + 1;
		if (use_sendmsg) {
			struct iovec v[2] = {{buf, want / 2}, {buf + want / 2, want - want / 2}};
			struct msghdr m = {.msg_iov = v, .msg_iovlen = 2};
			k = recvmsg(fd, &m, 0);
		} else {
			struct iovec v[2] = {{buf, want / 2}, {buf + want / 2, want - want / 2}};
			k = readv(fd, v, 2);
		}
		CHECK(k >= 0, "read after %zu of %zu bytes", got, n);
		if (k == 0)
			break;
		for (ssize_t i = 0; i < k; i++)
			CHECK(buf[i] == pattern(got + (size_t)i, seed), "byte %zu differs", got + (size_t)i);
		got += (size_t)k;
	}
	pthread_join(th, NULL);
	CHECK(got == n, "echo of %zu bytes, want %zu", got, n);
	CHECK(read(fd, buf, 1) == 0, "read after EOF is not 0");
	close(fd);
}

static void test_transfers(void)
{
	size_t sizes[] = {1, 1000, 65536 + 3, 1 << 20, max_transfer};
	for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		exchange(sizes[i], i * 17, i % 2);
	printf("largest %zu\n", max_transfer);
	ok("transfers byte-exact, half-close, EOF");
}

static void test_names_and_options(void)
{
	int fd = tcp_socket(0);
	int one = 1, v;
	socklen_t l = sizeof(v);
	CHECK(setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &(int){1200}, sizeof(int)) == 0, "TCP_MAXSEG before connect");
	CHECK(setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0, "TCP_NODELAY before connect");
	CHECK(connect(fd, (struct sockaddr *)&echo_addr, sizeof(echo_addr)) == 0, "connect");
	struct sockaddr_in a;
	socklen_t al = sizeof(a);
	CHECK(getsockname(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_addr.s_addr == local.sin_addr.s_addr &&
		      a.sin_port != 0,
	      "getsockname");
	al = sizeof(a);
	CHECK(getpeername(fd, (struct sockaddr *)&a, &al) == 0 && a.sin_addr.s_addr == echo_addr.sin_addr.s_addr &&
		      a.sin_port == echo_addr.sin_port,
	      "getpeername");
	CHECK(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &l) == 0 && v == 1, "TCP_NODELAY replayed: %d", v);
	CHECK(getsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &v, &l) == 0 && v > 0 && v <= 1200, "TCP_MAXSEG %d", v);
	CHECK(setsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof(one)) == 0, "TCP_QUICKACK");
	CHECK(getsockopt(fd, IPPROTO_TCP, TCP_QUICKACK, &v, &l) == 0 && v == 1, "TCP_QUICKACK get");
	CHECK(setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) == 0, "SO_KEEPALIVE");
	int ka[3][2] = {{TCP_KEEPIDLE, 30}, {TCP_KEEPINTVL, 5}, {TCP_KEEPCNT, 4}};
	for (int i = 0; i < 3; i++) {
		CHECK(setsockopt(fd, IPPROTO_TCP, ka[i][0], &ka[i][1], sizeof(int)) == 0, "keepalive opt %d", ka[i][0]);
		CHECK(getsockopt(fd, IPPROTO_TCP, ka[i][0], &v, &l) == 0 && v == ka[i][1], "keepalive get %d: %d", ka[i][0], v);
	}
	CHECK(getsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &v, &l) == 0 && v == 1, "SO_KEEPALIVE get");
	CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &(int){1 << 20}, sizeof(int)) == 0, "SO_RCVBUF");
	CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &(int){1 << 20}, sizeof(int)) == 0, "SO_SNDBUF");
	CHECK(getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, &l) == 0 && v > 0, "SO_RCVBUF get");
	CHECK(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, &l) == 0 && v > 0, "SO_SNDBUF get");
	CHECK(getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) == 0 && v == SOCK_STREAM, "SO_TYPE");
	CHECK(getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &v, &l) == 0 && v == IPPROTO_TCP, "SO_PROTOCOL");
	struct linger lg = {1, 5};
	socklen_t ll = sizeof(lg);
	CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0, "SO_LINGER");
	memset(&lg, 0, sizeof(lg));
	CHECK(getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &ll) == 0 && lg.l_onoff == 1 && lg.l_linger == 5, "SO_LINGER get");

	/* MSG_DONTWAIT on nothing, MSG_PEEK, MSG_WAITALL. */
	char b[16];
	CHECK(recv(fd, b, sizeof(b), MSG_DONTWAIT) == -1 && errno == EAGAIN, "MSG_DONTWAIT on an empty socket");
	write_all(fd, (const uint8_t *)"hello world", 11);
	CHECK(recv(fd, b, 11, MSG_WAITALL) == 11 && !memcmp(b, "hello world", 11), "MSG_WAITALL");
	write_all(fd, (const uint8_t *)"peek", 4);
	struct pollfd p = {fd, POLLIN, 0};
	CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLIN), "poll POLLIN");
	ssize_t k = recv(fd, b, sizeof(b), MSG_PEEK);
	CHECK(k > 0 && k <= 4 && !memcmp(b, "peek", (size_t)k), "MSG_PEEK");
	CHECK(recv(fd, b, 4, MSG_WAITALL) == 4 && !memcmp(b, "peek", 4), "read after MSG_PEEK");
	int avail = -1;
	CHECK(ioctl(fd, FIONREAD, &avail) == 0 && avail == 0, "FIONREAD %d", avail);
	close(fd); /* linger 5 s: waits until the daemon took the (empty) queue */
	ok("names, options, MSG_DONTWAIT/PEEK/WAITALL");
}

static void test_nonblocking_and_epoll(void)
{
	int fd = tcp_socket(SOCK_NONBLOCK);
	CHECK(connect(fd, (struct sockaddr *)&echo_addr, sizeof(echo_addr)) == -1 && errno == EINPROGRESS,
	      "non-blocking connect: EINPROGRESS");
	struct pollfd p = {fd, POLLOUT, 0};
	CHECK(poll(&p, 1, 10000) == 1 && (p.revents & POLLOUT), "POLLOUT after connect");
	int v = -1;
	socklen_t l = sizeof(v);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l) == 0 && v == 0, "SO_ERROR %d", v);
	CHECK(connect(fd, (struct sockaddr *)&echo_addr, sizeof(echo_addr)) == -1 && errno == EISCONN, "EISCONN");

	/* Partial writes: a non-blocking writer fills the queue, then EAGAIN. */
	size_t chunk = 1 << 20, total = 0;
	uint8_t *buf = malloc(chunk);
	CHECK(buf, "malloc");
	for (size_t i = 0; i < chunk; i++)
		buf[i] = pattern(i, 99);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = fd}, out[4];
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl");
	size_t got = 0, target = 4 * chunk;
	uint8_t rb[65536];
	int wdone = 0, eof = 0;
	while (!eof) {
		while (!wdone) {
			size_t off = total % chunk, k = chunk - off;
			if (k > target - total)
				k = target - total;
			ssize_t r = send(fd, buf + off, k, MSG_NOSIGNAL);
			if (r < 0) {
				CHECK(errno == EAGAIN, "non-blocking send");
				break;
			}
			total += (size_t)r;
			bytes_sent += r;
			if (total == target) {
				CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
				wdone = 1;
			}
		}
		/* Writable is always reported: wait briefly for room while
		 * sending, for data (EPOLLIN) once done. */
		int n = epoll_wait(ep, out, 4, wdone ? 10000 : 1);
		CHECK(n >= 0, "epoll_wait");
		CHECK(!wdone || n > 0, "no epoll event in 10 s with %zu of %zu bytes back", got, target);
		for (;;) {
			ssize_t r = read(fd, rb, sizeof(rb));
			if (r < 0) {
				CHECK(errno == EAGAIN, "non-blocking read");
				break;
			}
			if (r == 0) {
				eof = 1;
				break;
			}
			for (ssize_t i = 0; i < r; i++)
				CHECK(rb[i] == pattern((got + (size_t)i) % chunk, 99), "byte %zu", got + (size_t)i);
			got += (size_t)r;
		}
	}
	CHECK(got == target, "echoed %zu of %zu", got, target);
	/* At the end of the stream the descriptor stays readable (as a kernel
	 * socket's): epoll reports it again, read returns 0 again. */
	uint32_t want = EPOLLIN | EPOLLRDHUP | EPOLLHUP; /* FIN both ways */
	CHECK(epoll_wait(ep, out, 4, 1000) == 1 && (out[0].events & want) == want, "EPOLLIN|RDHUP|HUP at EOF: %#x",
	      out[0].events);
	struct pollfd pr = {fd, POLLIN | POLLRDHUP, 0};
	CHECK(poll(&pr, 1, 1000) == 1 && (pr.revents & (POLLIN | POLLRDHUP | POLLHUP)) == (POLLIN | POLLRDHUP | POLLHUP),
	      "poll at EOF: %#x", (unsigned)pr.revents);
	CHECK(read(fd, rb, 1) == 0, "read at EOF");
	free(buf);
	close(ep);
	close(fd);
	ok("non-blocking connect, SO_ERROR, partial writes, epoll to EOF");
}

static void test_refused(void)
{
	int fd = tcp_socket(0);
	CHECK(connect(fd, (struct sockaddr *)&closed_addr, sizeof(closed_addr)) == -1 && errno == ECONNREFUSED,
	      "blocking connect to a closed port");
	close(fd);
	fd = tcp_socket(SOCK_NONBLOCK);
	CHECK(connect(fd, (struct sockaddr *)&closed_addr, sizeof(closed_addr)) == -1 && errno == EINPROGRESS,
	      "non-blocking connect to a closed port");
	/* Writable at once (always); POLLERR|POLLHUP once the refusal came. */
	struct pollfd p = {fd, POLLOUT, 0};
	for (int i = 0; i < 1000 && !(p.revents & POLLERR); i++) {
		CHECK(poll(&p, 1, 10000) == 1, "poll");
		if (!(p.revents & POLLERR))
			usleep(10000);
	}
	CHECK((p.revents & (POLLERR | POLLHUP)) == (POLLERR | POLLHUP), "POLLERR|POLLHUP after the refusal: %#x",
	      (unsigned)p.revents);
	int v = 0;
	socklen_t l = sizeof(v);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l) == 0 && v == ECONNREFUSED, "SO_ERROR %d", v);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &v, &l) == 0 && v == 0, "SO_ERROR cleared");
	close(fd);
	ok("ECONNREFUSED blocking and non-blocking");
}

static void test_reset(void)
{
	int fd = connect_to(&sink_addr);
	write_all(fd, (const uint8_t *)"some bytes before the reset", 27);
	usleep(200 * 1000); /* the sink has read them */
	struct linger lg = {1, 0};
	CHECK(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)) == 0, "SO_LINGER {1, 0}");
	close(fd);
	ok("close with SO_LINGER 0");
}

static void test_peer_reset(void)
{
	int fd = connect_to(&reset_addr);
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP | EPOLLET, .data.u64 = 0x1234567890ull}, out;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0, "epoll_ctl");
	CHECK(epoll_wait(ep, &out, 1, 10000) == 1 && out.data.u64 == 0x1234567890ull && (out.events & EPOLLIN),
	      "EPOLLIN on the reset");
	char b[8];
	CHECK(read(fd, b, sizeof(b)) == -1 && errno == ECONNRESET, "read after the peer's reset: ECONNRESET");
	CHECK(read(fd, b, sizeof(b)) == 0, "then EOF");
	CHECK(send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE, "write after a reset: EPIPE");
	CHECK(epoll_wait(ep, &out, 1, 1000) == 1 && (out.events & (EPOLLHUP | EPOLLRDHUP)) == (EPOLLHUP | EPOLLRDHUP),
	      "EPOLLHUP|EPOLLRDHUP after the reset: %#x", out.events);
	close(ep);
	close(fd);
	ok("peer reset: ECONNRESET, EOF, EPIPE, EPOLLHUP");
}

/* A program that only writes learns of the peer's reset at its next write,
 * as with a kernel socket: ECONNRESET once, then EPIPE (SIGPIPE without
 * MSG_NOSIGNAL), and its reads then see the end of the stream. */
static void test_peer_reset_writer(void)
{
	int fd = connect_to(&reset_addr);
	char chunk[1024];
	memset(chunk, 'w', sizeof(chunk));
	ssize_t r = 0;
	for (int i = 0; i < 1000 && r >= 0; i++) {
		r = send(fd, chunk, sizeof(chunk), MSG_NOSIGNAL);
		if (r >= 0)
			usleep(10 * 1000);
	}
	CHECK(r == -1 && errno == ECONNRESET, "a write after the peer's reset: ECONNRESET (got %zd)", r);
	CHECK(send(fd, "x", 1, MSG_NOSIGNAL) == -1 && errno == EPIPE, "the next write: EPIPE");
	signal(SIGPIPE, SIG_IGN);
	CHECK(write(fd, "x", 1) == -1 && errno == EPIPE, "write(2): EPIPE (SIGPIPE ignored)");
	signal(SIGPIPE, SIG_DFL);
	char b[8];
	CHECK(read(fd, b, sizeof(b)) == 0, "then a read: EOF (the reset was reported)");
	close(fd);
	ok("peer reset seen by a writer: ECONNRESET, EPIPE, EOF");
}

static void test_listen_accept(void)
{
	int l = tcp_socket(0);
	CHECK(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &(int){1}, sizeof(int)) == 0, "SO_REUSEADDR");
	struct sockaddr_in a = local;
	a.sin_port = 0;
	CHECK(bind(l, (struct sockaddr *)&a, sizeof(a)) == 0, "bind");
	CHECK(listen(l, 16) == 0, "listen");
	socklen_t al = sizeof(a);
	CHECK(getsockname(l, (struct sockaddr *)&a, &al) == 0 && a.sin_port != 0, "listener's port");
	int v;
	socklen_t vl = sizeof(v);
	CHECK(getsockopt(l, SOL_SOCKET, SO_ACCEPTCONN, &v, &vl) == 0 && v == 1, "SO_ACCEPTCONN");
	CHECK(fcntl(l, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	CHECK(accept(l, NULL, NULL) == -1 && errno == EAGAIN, "accept on nothing: EAGAIN");

	int ctl = connect_to(&callback_addr);
	char msg[16];
	int ml = snprintf(msg, sizeof(msg), "%d\n", ntohs(a.sin_port));
	write_all(ctl, (const uint8_t *)msg, (size_t)ml);

	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN, .data.fd = l}, out;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev) == 0, "epoll_ctl");
	CHECK(epoll_wait(ep, &out, 1, 10000) == 1 && out.data.fd == l, "listener readable");
	struct sockaddr_in peer;
	socklen_t pl = sizeof(peer);
	int c = accept4(l, (struct sockaddr *)&peer, &pl, SOCK_NONBLOCK | SOCK_CLOEXEC);
	CHECK(c >= 0, "accept4");
	CHECK(pl == sizeof(peer) && peer.sin_family == AF_INET && peer.sin_addr.s_addr == callback_addr.sin_addr.s_addr,
	      "accept4's peer address");
	CHECK(fcntl(c, F_GETFL) & O_NONBLOCK, "SOCK_NONBLOCK");
	CHECK(fcntl(c, F_GETFD) & FD_CLOEXEC, "SOCK_CLOEXEC");
	ev.data.fd = c;
	CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) == 0, "epoll_ctl");
	/* Echo what the kernel client sends until its FIN, then ours. */
	uint8_t buf[32768];
	size_t echoed = 0;
	for (int eof = 0; !eof;) {
		CHECK(epoll_wait(ep, &out, 1, 10000) == 1, "epoll_wait on the accepted socket");
		for (;;) {
			ssize_t r = read(c, buf, sizeof(buf));
			if (r < 0) {
				CHECK(errno == EAGAIN, "read");
				break;
			}
			if (r == 0) {
				eof = 1;
				break;
			}
			for (ssize_t off = 0; off < r;) {
				ssize_t w = write(c, buf + off, (size_t)(r - off));
				if (w < 0) {
					CHECK(errno == EAGAIN, "write");
					usleep(100);
					continue;
				}
				off += w;
				bytes_sent += w;
			}
			echoed += (size_t)r;
		}
	}
	CHECK(shutdown(c, SHUT_WR) == 0, "shutdown");
	CHECK(read(ctl, msg, 3) == 3 && !memcmp(msg, "ok\n", 3), "the kernel client's verdict");
	close(c);
	close(ctl);
	close(ep);
	close(l);
	printf("echoed %zu\n", echoed);
	ok("listen, accept4 flags, echo to a kernel client");
}

static void test_fork(void)
{
	int fd = connect_to(&echo_addr);
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		char b;
		_exit(write(fd, "x", 1) == -1 && errno == EBADFD && read(fd, &b, 1) == -1 && errno == EBADFD ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child's calls fail with EBADFD");
	write_all(fd, (const uint8_t *)"parent", 6);
	char b[6];
	CHECK(recv(fd, b, 6, MSG_WAITALL) == 6 && !memcmp(b, "parent", 6), "the parent's socket works");
	close(fd);
	ok("fork");
}

static void addr(struct sockaddr_in *a, const char *ip, const char *port)
{
	memset(a, 0, sizeof(*a));
	a->sin_family = AF_INET;
	a->sin_port = htons((uint16_t)atoi(port));
	CHECK(inet_pton(AF_INET, ip, &a->sin_addr) == 1, "address %s", ip);
}

int main(int argc, char **argv)
{
	if (argc != 8 && argc != 9) {
		fprintf(stderr, "usage: %s LOCAL_IP PEER_IP ECHO CLOSED SINK CALLBACK RESET [MAX]\n", argv[0]);
		return 2;
	}
	if (argc == 9)
		max_transfer = (size_t)atol(argv[8]);
	addr(&local, argv[1], "0");
	addr(&echo_addr, argv[2], argv[3]);
	addr(&closed_addr, argv[2], argv[4]);
	addr(&sink_addr, argv[2], argv[5]);
	addr(&callback_addr, argv[2], argv[6]);
	addr(&reset_addr, argv[2], argv[7]);
	test_names_and_options();
	test_refused();
	test_nonblocking_and_epoll();
	test_reset();
	test_peer_reset();
	test_peer_reset_writer();
	test_listen_accept();
	test_fork();
	test_transfers();
	printf("bytes %lld\n", bytes_sent);
	return 0;
}
