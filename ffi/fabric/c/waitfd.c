/* Waiting through the braid provider: a CQ opened with FI_WAIT_FD hands out a file
 * descriptor (fi_control FI_GETWAIT) that epoll reports readable once a completion is
 * ready, fi_trywait says when blocking is safe, fi_cq_sread blocks until a completion (and
 * times out with -FI_EAGAIN when there is none); counters bound to an endpoint count sends
 * and receives, and fi_cntr_wait blocks until a threshold (or times out). */
#include "common.h"
#include <rdma/fi_eq.h>
#include <sys/epoll.h>

int main(void)
{
	struct end a, b;
	struct fi_cq_tagged_entry ce;
	char sbuf[64] = "wake up", rbuf[64];
	int fd = -1;

	end_open_cq(&a, FI_MSG, FI_WAIT_FD);
	end_open_cq(&b, FI_MSG, FI_WAIT_FD);
	fi_addr_t b_at_a = end_insert(&a, &b);
	end_insert(&b, &a);

	CHECK(fi_control(&b.cq->fid, FI_GETWAIT, &fd));
	EXPECT(fd >= 0);
	int ep = epoll_create1(0);
	struct epoll_event ev = { .events = EPOLLIN };
	EXPECT(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) == 0);

	/* Nothing posted: sread times out, trywait says it is safe to block, epoll sees nothing. */
	EXPECT(fi_cq_sread(b.cq, &ce, 1, NULL, 100) == -FI_EAGAIN);
	struct fid *fids[1] = { &b.cq->fid };
	EXPECT(fi_trywait(b.fabric, fids, 1) == FI_SUCCESS);
	EXPECT(epoll_wait(ep, &ev, 1, 100) == 0);

	CHECK(fi_recv(b.ep, rbuf, sizeof(rbuf), NULL, FI_ADDR_UNSPEC, rbuf));
	CHECK(fi_send(a.ep, sbuf, 8, NULL, b_at_a, sbuf));
	/* The provider's own progress fills the CQ: epoll wakes without any provider call. */
	EXPECT(epoll_wait(ep, &ev, 1, 30000) == 1);
	EXPECT(fi_trywait(b.fabric, fids, 1) == -FI_EAGAIN);
	EXPECT(fi_cq_read(b.cq, &ce, 1) == 1);
	EXPECT(ce.op_context == rbuf && ce.len == 8 && strcmp(rbuf, "wake up") == 0);
	/* Drained: the descriptor is quiet again. */
	EXPECT(epoll_wait(ep, &ev, 1, 50) == 0);
	EXPECT(fi_cq_sread(a.cq, &ce, 1, NULL, 30000) == 1);
	EXPECT(ce.op_context == sbuf);

	/* sread blocks until the completion comes. */
	CHECK(fi_recv(b.ep, rbuf, sizeof(rbuf), NULL, FI_ADDR_UNSPEC, rbuf));
	CHECK(fi_send(a.ep, sbuf, 8, NULL, b_at_a, sbuf));
	EXPECT(fi_cq_sread(b.cq, &ce, 1, NULL, 30000) == 1);
	EXPECT(ce.op_context == rbuf);
	EXPECT(fi_cq_sread(a.cq, &ce, 1, NULL, 30000) == 1);
	close(ep);
	end_close(&b);
	end_close(&a);

	/* Counters. */
	{
		struct end s, r;
		struct fid_cntr *sc, *rc;
		struct fi_cntr_attr attr = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
		memset(&s, 0, sizeof(s));
		memset(&r, 0, sizeof(r));
		/* Open by hand: the counters must be bound before enable. */
		for (int k = 0; k < 2; k++) {
			struct end *e = k ? &r : &s;
			struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_CONTEXT };
			struct fi_av_attr av_attr = { .type = FI_AV_MAP };
			e->info = braid_info(FI_MSG, FI_WAIT_NONE);
			CHECK(fi_fabric(e->info->fabric_attr, &e->fabric, NULL));
			CHECK(fi_domain(e->fabric, e->info, &e->domain, NULL));
			CHECK(fi_cq_open(e->domain, &cq_attr, &e->cq, NULL));
			CHECK(fi_av_open(e->domain, &av_attr, &e->av, NULL));
			CHECK(fi_endpoint(e->domain, e->info, &e->ep, NULL));
			CHECK(fi_cntr_open(e->domain, &attr, k ? &rc : &sc, NULL));
			CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV));
			CHECK(fi_ep_bind(e->ep, &e->av->fid, 0));
			CHECK(fi_ep_bind(e->ep, k ? &rc->fid : &sc->fid, k ? FI_RECV : FI_SEND));
			CHECK(fi_enable(e->ep));
			e->namelen = sizeof(e->name);
			CHECK(fi_getname(&e->ep->fid, e->name, &e->namelen));
		}
		fi_addr_t to = end_insert(&s, &r);
		EXPECT(fi_cntr_read(sc) == 0 && fi_cntr_read(rc) == 0);
		EXPECT(fi_cntr_wait(rc, 1, 100) == -FI_ETIMEDOUT);
		static char bufs[10][32];
		for (int i = 0; i < 10; i++)
			CHECK(fi_recv(r.ep, bufs[i], 32, NULL, FI_ADDR_UNSPEC, bufs[i]));
		for (int i = 0; i < 10; i++)
			CHECK(fi_send(s.ep, sbuf, 8, NULL, to, NULL));
		CHECK(fi_cntr_wait(rc, 10, 30000));
		CHECK(fi_cntr_wait(sc, 10, 30000));
		EXPECT(fi_cntr_read(rc) == 10 && fi_cntr_read(sc) == 10);
		EXPECT(fi_cntr_readerr(rc) == 0);
		CHECK(fi_cntr_set(sc, 3));
		CHECK(fi_cntr_add(sc, 4));
		EXPECT(fi_cntr_read(sc) == 7);
		/* Drain the CQs before closing. */
		for (int i = 0; i < 10; i++) {
			wait_ok(s.cq, NULL);
			wait_ok(r.cq, NULL);
		}
		CHECK(fi_close(&s.ep->fid));
		CHECK(fi_close(&r.ep->fid));
		CHECK(fi_close(&sc->fid));
		CHECK(fi_close(&rc->fid));
		for (int k = 0; k < 2; k++) {
			struct end *e = k ? &r : &s;
			CHECK(fi_close(&e->av->fid));
			CHECK(fi_close(&e->cq->fid));
			CHECK(fi_close(&e->domain->fid));
			CHECK(fi_close(&e->fabric->fid));
			fi_freeinfo(e->info);
		}
	}
	printf("PASS waitfd\n");
	return 0;
}
