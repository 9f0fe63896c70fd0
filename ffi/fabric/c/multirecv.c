/* FI_MULTI_RECV through the braid provider: one posted buffer takes several messages, each
 * completion points at where its message landed, and the one that leaves less than
 * FI_OPT_MIN_MULTI_RECV bytes carries FI_MULTI_RECV (the buffer is released). */
#include "common.h"

int main(void)
{
	struct end a, b;
	struct fi_cq_tagged_entry ce;
	static char big[1024], msg[200];
	size_t min = 64;

	end_open(&a, FI_MSG | FI_MULTI_RECV);
	end_open(&b, FI_MSG | FI_MULTI_RECV);
	fi_addr_t to = end_insert(&a, &b);
	CHECK(fi_setopt(&b.ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &min, sizeof(min)));
	size_t got = 0, len = sizeof(got);
	CHECK(fi_getopt(&b.ep->fid, FI_OPT_ENDPOINT, FI_OPT_MIN_MULTI_RECV, &got, &len));
	EXPECT(got == 64);

	struct iovec iov = { big, sizeof(big) };
	struct fi_msg m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC, .context = big };
	CHECK(fi_recvmsg(b.ep, &m, FI_MULTI_RECV));
	for (int i = 0; i < 5; i++) {
		memset(msg, 'a' + i, sizeof(msg));
		CHECK(fi_send(a.ep, msg, sizeof(msg), NULL, to, NULL));
		wait_ok(a.cq, NULL);
		wait_ok(b.cq, &ce);
		EXPECT(ce.op_context == big && ce.len == sizeof(msg));
		EXPECT(ce.buf == big + i * sizeof(msg));
		EXPECT(((char *)ce.buf)[0] == 'a' + i && ((char *)ce.buf)[199] == 'a' + i);
		/* 1024 - 5 * 200 = 24 < 64 left after the fifth: released with it. */
		EXPECT(!!(ce.flags & FI_MULTI_RECV) == (i == 4));
	}
	/* The buffer is gone: the next message waits for a new receive. */
	memset(msg, 'z', sizeof(msg));
	CHECK(fi_send(a.ep, msg, sizeof(msg), NULL, to, NULL));
	wait_ok(a.cq, NULL);
	static char one[256];
	CHECK(fi_recv(b.ep, one, sizeof(one), NULL, FI_ADDR_UNSPEC, one));
	wait_ok(b.cq, &ce);
	EXPECT(ce.op_context == one && one[0] == 'z');
	end_close(&b);
	end_close(&a);
	printf("PASS multirecv\n");
	return 0;
}
