/* A peer killed mid-transfer: the child process receives one message, then stops receiving;
 * the parent starts a 4 MiB rendezvous send the child never completes and kills the child
 * with SIGKILL. The pending send and a later one complete with error entries (read with
 * fi_cq_readerr) within a bounded time: no hang. */
#include "common.h"
#include <signal.h>
#include <sys/wait.h>

#define BIG (4 << 20)

int main(void)
{
	int names[2];
	EXPECT(pipe(names) == 0);
	pid_t pid = fork();
	EXPECT(pid >= 0);
	if (pid == 0) {
		struct end c;
		char buf[64];
		end_open(&c, FI_TAGGED);
		EXPECT(write(names[1], c.name, c.namelen) == (ssize_t)c.namelen);
		CHECK(fi_trecv(c.ep, buf, sizeof(buf), NULL, FI_ADDR_UNSPEC, 1, 0, buf));
		wait_ok(c.cq, NULL);
		for (;;)
			pause();
	}
	struct end p;
	struct fi_cq_tagged_entry ce;
	struct fi_cq_err_entry err;
	end_open(&p, FI_TAGGED);
	char name[64];
	EXPECT(read(names[0], name, sizeof(name)) == (ssize_t)sizeof(struct sockaddr_in));
	fi_addr_t to = FI_ADDR_NOTAVAIL;
	EXPECT(fi_av_insert(p.av, name, 1, &to, 0, NULL) == 1);

	char hello[16] = "hello";
	CHECK(fi_tsend(p.ep, hello, sizeof(hello), NULL, to, 1, hello));
	wait_ok(p.cq, &ce);
	EXPECT(ce.op_context == hello);

	char *big = malloc(BIG);
	EXPECT(big);
	fill(big, BIG, 3);
	CHECK(fi_tsend(p.ep, big, BIG, NULL, to, 2, big));
	struct timespec d = { 0, 200 * 1000 * 1000 };
	nanosleep(&d, NULL);
	EXPECT(kill(pid, SIGKILL) == 0);
	EXPECT(waitpid(pid, NULL, 0) == pid);

	double t0 = now_s();
	EXPECT(wait_comp(p.cq, &ce, &err, 60) == 0);
	EXPECT(err.op_context == big && err.err != 0);
	fprintf(stderr, "pending send failed after %.1f s: %s\n", now_s() - t0, fi_strerror(err.err));

	/* A new send to the dead peer fails too (eager; or at once if the peer is known gone). */
	ssize_t r = fi_tsend(p.ep, hello, sizeof(hello), NULL, to, 1, hello);
	if (r == 0) {
		EXPECT(wait_comp(p.cq, &ce, &err, 60) == 0);
		EXPECT(err.op_context == hello && err.err != 0);
	} else {
		EXPECT(r < 0 && r != -FI_EAGAIN);
	}
	free(big);
	end_close(&p);
	printf("PASS killed\n");
	return 0;
}
