/* 64 peers through the braid provider: one server endpoint, 64 clients. Each client sends
 * to the server before the server has any of them in its address vector (connections are
 * accepted from unknown peers: the source is FI_ADDR_NOTAVAIL); then the server inserts all
 * 64, replies to each, and every reply reaches its client, with the source now known. */
#include "common.h"

#define PEERS 64

int main(void)
{
	static struct end srv, cl[PEERS];
	struct fi_cq_tagged_entry ce;
	static char rbuf[PEERS][32], sbuf[PEERS][32];
	fi_addr_t to_srv[PEERS], to_cl[PEERS];
	int seen[PEERS] = { 0 };

	end_open(&srv, FI_TAGGED | FI_SOURCE);
	for (int i = 0; i < PEERS; i++) {
		end_open(&cl[i], FI_TAGGED | FI_SOURCE);
		to_srv[i] = end_insert(&cl[i], &srv);
	}
	for (int i = 0; i < PEERS; i++)
		CHECK(fi_trecv(srv.ep, rbuf[i], 32, NULL, FI_ADDR_UNSPEC, 1, 0, rbuf[i]));
	for (int i = 0; i < PEERS; i++) {
		snprintf(sbuf[i], 32, "client %d", i);
		CHECK(fi_tsend(cl[i].ep, sbuf[i], 32, NULL, to_srv[i], 1, NULL));
	}
	for (int n = 0; n < PEERS; n++) {
		fi_addr_t src = 0;
		double t0 = now_s();
		ssize_t r;
		while ((r = fi_cq_readfrom(srv.cq, &ce, 1, &src)) == -FI_EAGAIN) {
			/* The clients' send completions need their CQs read too. */
			for (int i = 0; i < PEERS; i++) {
				struct fi_cq_tagged_entry x;
				if (fi_cq_read(cl[i].cq, &x, 1) == 1)
					seen[i]++;
			}
			EXPECT(now_s() - t0 < 60);
		}
		EXPECT(r == 1);
		EXPECT(src == FI_ADDR_NOTAVAIL);
		int who = -1;
		EXPECT(sscanf((char *)ce.buf, "client %d", &who) == 1 && who >= 0 && who < PEERS);
	}
	for (int i = 0; i < PEERS; i++) {
		while (!seen[i]) {
			struct fi_cq_tagged_entry x;
			if (fi_cq_read(cl[i].cq, &x, 1) == 1)
				seen[i]++;
		}
		to_cl[i] = end_insert(&srv, &cl[i]);
		CHECK(fi_trecv(cl[i].ep, rbuf[i], 32, NULL, FI_ADDR_UNSPEC, 2, 0, rbuf[i]));
	}
	for (int i = 0; i < PEERS; i++) {
		snprintf(sbuf[i], 32, "reply %d", i);
		CHECK(fi_tsend(srv.ep, sbuf[i], 32, NULL, to_cl[i], 2, NULL));
	}
	for (int i = 0; i < PEERS; i++) {
		fi_addr_t src = 0;
		double t0 = now_s();
		ssize_t r;
		while ((r = fi_cq_readfrom(cl[i].cq, &ce, 1, &src)) == -FI_EAGAIN) {
			struct fi_cq_tagged_entry x;
			(void)fi_cq_read(srv.cq, &x, 1);
			EXPECT(now_s() - t0 < 60);
		}
		EXPECT(r == 1 && src == to_srv[i]);
		char want[32];
		snprintf(want, 32, "reply %d", i);
		EXPECT(strcmp(rbuf[i], want) == 0);
	}
	for (int i = 0; i < PEERS; i++)
		end_close(&cl[i]);
	end_close(&srv);
	printf("PASS peers64\n");
	return 0;
}
