/*
 * socket-pingpong: a kernel UDP ping-pong whose sockets use, one by one, what Braid's UDP
 * datapath asks of the kernel, to price each against plain send/recv on the same path.
 *
 *   socket-pingpong server IP PORT [features...]
 *   socket-pingpong client IP PORT [features...]      prints "p50 X p99 Y" (µs)
 *
 * Features (give the same to both sides): msg (sendmsg/recvmsg with a control buffer),
 * mm (sendmmsg/recvmmsg, one slot), s64 (recvmmsg asks for 64 slots, with mm), ts
 * (SO_TIMESTAMPNS, and a CLOCK_REALTIME read per receive, as Braid does), tos (IP_RECVTOS),
 * gro (UDP_GRO). Both sides busy-poll nonblocking sockets. Build: gcc -O2.
 * bench/tools/socket-pingpong.sh runs the sets alternately and prints medians.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

enum { SLOTS_MAX = 64, BUF = 2048, CTRL = 128, WARMUP = 1000, ITERS = 20000 };

static int use_msg, use_mm, use_ts, use_tos, use_gro, slots = 1;
static char bufs[SLOTS_MAX][BUF];
static char ctl[SLOTS_MAX][CTRL];
static struct mmsghdr hdrs[SLOTS_MAX];
static struct iovec iovs[SLOTS_MAX];
static struct sockaddr_in from[SLOTS_MAX];

static double now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static int open_socket(const char *ip, int port)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
	int one = 1;
	if (s < 0) {
		perror("socket");
		exit(1);
	}
	if (use_ts)
		setsockopt(s, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
	if (use_tos)
		setsockopt(s, IPPROTO_IP, IP_RECVTOS, &one, sizeof one);
	if (use_gro && setsockopt(s, SOL_UDP, UDP_GRO, &one, sizeof one)) {
		perror("UDP_GRO");
		exit(1);
	}
	if (ip) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
		if (inet_pton(AF_INET, ip, &a.sin_addr) != 1 || bind(s, (void *)&a, sizeof a)) {
			perror("bind");
			exit(1);
		}
	}
	return s;
}

/* One receive attempt: whether a datagram came (its source in from[0]). */
static int receive(int s)
{
	if (use_msg) {
		struct msghdr h = { 0 };
		iovs[0] = (struct iovec){ bufs[0], BUF };
		h.msg_iov = &iovs[0];
		h.msg_iovlen = 1;
		h.msg_name = &from[0];
		h.msg_namelen = sizeof from[0];
		h.msg_control = ctl[0];
		h.msg_controllen = CTRL;
		if (recvmsg(s, &h, MSG_DONTWAIT) <= 0)
			return 0;
	} else if (use_mm) {
		for (int i = 0; i < slots; i++) {
			iovs[i] = (struct iovec){ bufs[i], BUF };
			memset(&hdrs[i], 0, sizeof hdrs[i]);
			hdrs[i].msg_hdr.msg_iov = &iovs[i];
			hdrs[i].msg_hdr.msg_iovlen = 1;
			hdrs[i].msg_hdr.msg_name = &from[i];
			hdrs[i].msg_hdr.msg_namelen = sizeof from[i];
			hdrs[i].msg_hdr.msg_control = ctl[i];
			hdrs[i].msg_hdr.msg_controllen = CTRL;
		}
		if (recvmmsg(s, hdrs, slots, MSG_DONTWAIT, NULL) <= 0)
			return 0;
	} else {
		socklen_t l = sizeof from[0];
		if (recvfrom(s, bufs[0], BUF, MSG_DONTWAIT, (void *)&from[0], &l) <= 0)
			return 0;
	}
	if (use_ts) {
		struct timespec t;
		clock_gettime(CLOCK_REALTIME, &t);
	}
	return 1;
}

static void transmit(int s, struct sockaddr_in *to, int len)
{
	struct iovec v = { bufs[0], len };
	if (use_msg) {
		struct msghdr h = { .msg_iov = &v, .msg_iovlen = 1, .msg_name = to,
				    .msg_namelen = sizeof *to };
		sendmsg(s, &h, 0);
	} else if (use_mm) {
		struct mmsghdr m = { 0 };
		m.msg_hdr.msg_iov = &v;
		m.msg_hdr.msg_iovlen = 1;
		m.msg_hdr.msg_name = to;
		m.msg_hdr.msg_namelen = sizeof *to;
		sendmmsg(s, &m, 1, 0);
	} else {
		sendto(s, bufs[0], len, 0, (void *)to, sizeof *to);
	}
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	if (argc < 4 || (strcmp(argv[1], "server") && strcmp(argv[1], "client"))) {
		fprintf(stderr, "usage: %s server|client IP PORT [msg|mm|s64|ts|tos|gro]...\n", argv[0]);
		return 2;
	}
	for (int i = 4; i < argc; i++) {
		const char *f = argv[i];
		if (!strcmp(f, "msg"))
			use_msg = 1;
		else if (!strcmp(f, "mm"))
			use_mm = 1;
		else if (!strcmp(f, "s64"))
			slots = SLOTS_MAX;
		else if (!strcmp(f, "ts"))
			use_ts = 1;
		else if (!strcmp(f, "tos"))
			use_tos = 1;
		else if (!strcmp(f, "gro"))
			use_gro = 1;
		else {
			fprintf(stderr, "unknown feature %s\n", f);
			return 2;
		}
	}
	int port = atoi(argv[3]);
	if (!strcmp(argv[1], "server")) {
		int s = open_socket(argv[2], port);
		for (;;)
			if (receive(s)) {
				struct sockaddr_in back = from[0];
				transmit(s, &back, 8);
			}
	}
	int s = open_socket(NULL, 0);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port) };
	if (inet_pton(AF_INET, argv[2], &to.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[2]);
		return 2;
	}
	static double lat[ITERS];
	for (int i = 0; i < WARMUP + ITERS; i++) {
		double t0 = now_ns();
		transmit(s, &to, 8);
		while (!receive(s))
			;
		if (i >= WARMUP)
			lat[i - WARMUP] = now_ns() - t0;
	}
	qsort(lat, ITERS, sizeof lat[0], cmp);
	printf("p50 %.2f p99 %.2f\n", lat[ITERS / 2] / 1e3, lat[ITERS * 99 / 100] / 1e3);
	return 0;
}
