/* Tagged matching through the braid provider: unexpected messages (sent before any receive
 * is posted) are buffered and matched later, in order; the ignore mask works as a wildcard;
 * a directed receive takes only its peer's messages; FI_PEEK finds without taking; a 1 MiB
 * tagged message (rendezvous: a Braid READ into the receive buffer) arrives intact;
 * FI_PEEK|FI_CLAIM reserves a message and fi_cancel cancels a receive; a short
 * receive buffer gives an FI_ETRUNC error entry with the overflow in olen; a send with
 * FI_DELIVERY_COMPLETE completes only once its bytes are in the receive buffer. */
#include "common.h"

#define BIG (1 << 20)

int main(void)
{
	struct end a, b, c;
	struct fi_cq_tagged_entry ce;
	struct fi_cq_err_entry err;
	char buf[8][64];
	fi_addr_t a_at_b, b_at_a, c_at_b, b_at_c;

	end_open(&a, FI_TAGGED | FI_DIRECTED_RECV);
	end_open(&b, FI_TAGGED | FI_DIRECTED_RECV);
	end_open(&c, FI_TAGGED | FI_DIRECTED_RECV);
	b_at_a = end_insert(&a, &b);
	a_at_b = end_insert(&b, &a);
	b_at_c = end_insert(&c, &b);
	c_at_b = end_insert(&b, &c);

	/* Unexpected: a sends tags 0x10, 0x11, 0x20 before b posts anything. */
	for (int i = 0; i < 3; i++) {
		uint64_t tag = i == 2 ? 0x20 : 0x10 + i;
		snprintf(buf[i], sizeof(buf[i]), "msg-%d", i);
		CHECK(fi_tsend(a.ep, buf[i], 16, NULL, b_at_a, tag, &buf[i]));
	}
	for (int i = 0; i < 3; i++)
		wait_ok(a.cq, &ce);

	/* Make sure all three have arrived (and are buffered) before posting receives. */
	{
		double t0 = now_s();
		int seen = 0;
		while (!seen && now_s() - t0 < 30) {
			struct fi_msg_tagged m = { 0 };
			struct iovec iov = { buf[7], 64 };
			m.msg_iov = &iov;
			m.iov_count = 1;
			m.addr = FI_ADDR_UNSPEC;
			m.tag = 0x20;
			m.ignore = 0;
			m.context = &buf[7];
			CHECK(fi_trecvmsg(b.ep, &m, FI_PEEK));
			if (wait_comp(b.cq, &ce, &err, 30)) {
				EXPECT(ce.op_context == &buf[7] && ce.tag == 0x20 && ce.len == 16);
				seen = 1;
			} else {
				EXPECT(err.err == FI_ENOMSG);
			}
		}
		EXPECT(seen);
	}

	/* A wildcard over the low byte takes 0x10 then 0x11 (oldest first), not 0x20. */
	CHECK(fi_trecv(b.ep, buf[3], 64, NULL, FI_ADDR_UNSPEC, 0x10, 0x0f, &buf[3]));
	wait_ok(b.cq, &ce);
	EXPECT(ce.op_context == &buf[3] && ce.tag == 0x10 && ce.len == 16);
	EXPECT(strcmp(buf[3], "msg-0") == 0);
	EXPECT(ce.flags & FI_TAGGED && ce.flags & FI_RECV);
	CHECK(fi_trecv(b.ep, buf[4], 64, NULL, FI_ADDR_UNSPEC, 0x1f, 0x0f, &buf[4]));
	wait_ok(b.cq, &ce);
	EXPECT(ce.tag == 0x11 && strcmp(buf[4], "msg-1") == 0);
	/* The exact tag 0x20 still waits. */
	CHECK(fi_trecv(b.ep, buf[5], 64, NULL, FI_ADDR_UNSPEC, 0x20, 0, &buf[5]));
	wait_ok(b.cq, &ce);
	EXPECT(ce.tag == 0x20 && strcmp(buf[5], "msg-2") == 0);

	/* Directed receive: b waits for tag 7 from c only; a's tag-7 message must not match. */
	CHECK(fi_trecv(b.ep, buf[6], 64, NULL, c_at_b, 7, 0, &buf[6]));
	strcpy(buf[0], "from-a");
	CHECK(fi_tsend(a.ep, buf[0], 8, NULL, b_at_a, 7, NULL));
	wait_ok(a.cq, NULL);
	strcpy(buf[1], "from-c");
	CHECK(fi_tsend(c.ep, buf[1], 8, NULL, b_at_c, 7, NULL));
	wait_ok(c.cq, NULL);
	wait_ok(b.cq, &ce);
	EXPECT(ce.op_context == &buf[6] && strcmp(buf[6], "from-c") == 0);
	/* a's message is still there for an undirected receive. */
	CHECK(fi_trecv(b.ep, buf[2], 64, NULL, FI_ADDR_UNSPEC, 7, 0, &buf[2]));
	wait_ok(b.cq, &ce);
	EXPECT(strcmp(buf[2], "from-a") == 0);
	(void)a_at_b;

	/* 1 MiB tagged message, receive posted first, then one sent before its receive. */
	{
		char *src = malloc(BIG), *dst = malloc(BIG);
		EXPECT(src && dst);
		for (int round = 0; round < 2; round++) {
			fill(src, BIG, 7 + round);
			memset(dst, 0, BIG);
			if (round == 0)
				CHECK(fi_trecv(b.ep, dst, BIG, NULL, FI_ADDR_UNSPEC, 99, 0, dst));
			CHECK(fi_tsend(a.ep, src, BIG, NULL, b_at_a, 99, src));
			if (round == 1) {
				/* Let the request to send arrive first: it waits unexpected. */
				struct timespec d = { 0, 50 * 1000 * 1000 };
				nanosleep(&d, NULL);
				CHECK(fi_trecv(b.ep, dst, BIG, NULL, FI_ADDR_UNSPEC, 99, 0, dst));
			}
			/* Both sides make progress while waiting. */
			int got_tx = 0, got_rx = 0;
			double t0 = now_s();
			while ((!got_tx || !got_rx) && now_s() - t0 < 60) {
				if (!got_tx && fi_cq_read(a.cq, &ce, 1) == 1) {
					EXPECT(ce.op_context == src);
					got_tx = 1;
				}
				if (!got_rx && fi_cq_read(b.cq, &ce, 1) == 1) {
					EXPECT(ce.op_context == dst && ce.len == BIG && ce.tag == 99);
					got_rx = 1;
				}
			}
			EXPECT(got_tx && got_rx);
			EXPECT(check_fill(dst, BIG, 7 + round));
		}
		free(src);
		free(dst);
	}

	/* Truncation: 100 bytes into a 40-byte buffer. */
	{
		char big[100], small[40];
		memset(big, 'x', sizeof(big));
		CHECK(fi_trecv(b.ep, small, sizeof(small), NULL, FI_ADDR_UNSPEC, 5, 0, small));
		CHECK(fi_tsend(a.ep, big, sizeof(big), NULL, b_at_a, 5, NULL));
		wait_ok(a.cq, NULL);
		EXPECT(wait_comp(b.cq, &ce, &err, 30) == 0);
		EXPECT(err.err == FI_ETRUNC && err.olen == 60 && err.op_context == small);
		EXPECT(err.tag == 5);
	}

	/* FI_PEEK | FI_CLAIM reserves an unexpected message for a later FI_CLAIM receive with
	 * the same context; an ordinary receive no longer matches it. */
	{
		static char claimed[64], other[64];
		static struct fi_context cctx;
		CHECK(fi_tsend(a.ep, "claim me", 9, NULL, b_at_a, 0x30, NULL));
		wait_ok(a.cq, NULL);
		struct iovec iov = { claimed, sizeof(claimed) };
		struct fi_msg_tagged m = { .msg_iov = &iov, .iov_count = 1, .addr = FI_ADDR_UNSPEC,
					   .tag = 0x30, .context = &cctx };
		int found = 0;
		double t0 = now_s();
		while (!found && now_s() - t0 < 30) {
			CHECK(fi_trecvmsg(b.ep, &m, FI_PEEK | FI_CLAIM));
			if (wait_comp(b.cq, &ce, &err, 30))
				found = 1;
			else
				EXPECT(err.err == FI_ENOMSG);
		}
		EXPECT(found && ce.op_context == &cctx && ce.len == 9);
		/* Claimed: an ordinary receive for the same tag does not get it. */
		CHECK(fi_trecv(b.ep, other, sizeof(other), NULL, FI_ADDR_UNSPEC, 0x30, 0, other));
		CHECK(fi_trecvmsg(b.ep, &m, FI_CLAIM));
		wait_ok(b.cq, &ce);
		EXPECT(ce.op_context == &cctx && strcmp(claimed, "claim me") == 0);
		EXPECT(fi_cancel(&b.ep->fid, other) == 0);
		EXPECT(wait_comp(b.cq, &ce, &err, 30) == 0 && err.err == FI_ECANCELED);
		EXPECT(err.op_context == other);
	}

	/* FI_DELIVERY_COMPLETE: the send completes only once its bytes are in the receive
	 * buffer. The receiver uses manual progress, so nothing moves into its buffer until it
	 * calls the provider: until then the sender sees no completion. */
	{
		struct end m;
		static char dc_src[100], dc_dst[100];
		want_manual_progress = 1;
		end_open(&m, FI_TAGGED);
		want_manual_progress = 0;
		EXPECT(m.info->domain_attr->data_progress == FI_PROGRESS_MANUAL);
		fi_addr_t m_at_a = end_insert(&a, &m);
		end_insert(&m, &a);
		/* One plain message first, so the connection and its receive buffers are up. */
		CHECK(fi_trecv(m.ep, dc_dst, sizeof(dc_dst), NULL, FI_ADDR_UNSPEC, 76, 0, dc_dst));
		CHECK(fi_tsend(a.ep, "warm", 5, NULL, m_at_a, 76, NULL));
		wait_ok(m.cq, &ce);
		wait_ok(a.cq, &ce);
		memset(dc_dst, 0, sizeof(dc_dst));
		memset(dc_src, 'D', sizeof(dc_src));
		CHECK(fi_trecv(m.ep, dc_dst, sizeof(dc_dst), NULL, FI_ADDR_UNSPEC, 77, 0, dc_dst));
		struct iovec iov = { dc_src, sizeof(dc_src) };
		struct fi_msg_tagged msg = { .msg_iov = &iov, .iov_count = 1, .addr = m_at_a,
					     .tag = 77, .context = dc_src };
		CHECK(fi_tsendmsg(a.ep, &msg, FI_DELIVERY_COMPLETE));
		double t0 = now_s();
		while (now_s() - t0 < 0.3)
			EXPECT(fi_cq_read(a.cq, &ce, 1) == -FI_EAGAIN);
		EXPECT(dc_dst[0] == 0);
		/* The receiver makes progress: the data lands, then the sender completes. */
		int got_rx = 0, got_tx = 0;
		t0 = now_s();
		while ((!got_rx || !got_tx) && now_s() - t0 < 30) {
			if (!got_rx && fi_cq_read(m.cq, &ce, 1) == 1) {
				EXPECT(ce.op_context == dc_dst && ce.len == sizeof(dc_dst));
				got_rx = 1;
			}
			if (!got_tx && fi_cq_read(a.cq, &ce, 1) == 1) {
				EXPECT(ce.op_context == dc_src);
				EXPECT(dc_dst[0] == 'D' && dc_dst[99] == 'D');
				got_tx = 1;
			}
		}
		EXPECT(got_rx && got_tx);
		end_close(&m);
	}

	end_close(&c);
	end_close(&b);
	end_close(&a);
	printf("PASS tagged\n");
	return 0;
}
