/* FI_RMA_EVENT through the braid provider: the target's counters bound with FI_REMOTE_WRITE
 * and FI_REMOTE_READ count RMA writes (and atomics) and reads into its memory, checked with
 * fi_cntr_wait and exact values; a failed write (bad key) is not counted; fi_getinfo returns
 * FI_RMA_EVENT only when asked; without it, binding a remote counter is -FI_EBADFLAGS;
 * binding a counter to a memory region is -FI_ENOSYS (not silently accepted). */
#include "common.h"
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>

static struct fi_info *info_with(uint64_t caps)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->caps = caps;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->domain_attr->name = strdup("lo");
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_LOCAL;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	return info;
}

static void open_with(struct end *e, uint64_t caps)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(e, 0, sizeof(*e));
	e->info = info_with(caps);
	CHECK(fi_fabric(e->info->fabric_attr, &e->fabric, NULL));
	CHECK(fi_domain(e->fabric, e->info, &e->domain, NULL));
	CHECK(fi_cq_open(e->domain, &cq_attr, &e->cq, NULL));
	CHECK(fi_av_open(e->domain, &av_attr, &e->av, NULL));
	CHECK(fi_endpoint(e->domain, e->info, &e->ep, NULL));
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(e->ep, &e->av->fid, 0));
}

static void enable(struct end *e)
{
	CHECK(fi_enable(e->ep));
	e->namelen = sizeof(e->name);
	CHECK(fi_getname(&e->ep->fid, e->name, &e->namelen));
}

int main(void)
{
	/* Not returned unless asked for. */
	struct fi_info *i = info_with(FI_RMA);
	EXPECT(!(i->caps & FI_RMA_EVENT));
	fi_freeinfo(i);
	i = info_with(FI_RMA | FI_RMA_EVENT);
	EXPECT(i->caps & FI_RMA_EVENT && i->rx_attr->caps & FI_RMA_EVENT);
	fi_freeinfo(i);

	struct fi_cntr_attr ca = { .events = FI_CNTR_EVENTS_COMP, .wait_obj = FI_WAIT_UNSPEC };
	struct fid_cntr *wr_c, *rd_c, *plain;

	/* Without FI_RMA_EVENT a remote counter cannot be bound. */
	struct end n;
	open_with(&n, FI_RMA);
	CHECK(fi_cntr_open(n.domain, &ca, &plain, NULL));
	EXPECT(fi_ep_bind(n.ep, &plain->fid, FI_REMOTE_WRITE) == -FI_EBADFLAGS);
	CHECK(fi_close(&n.ep->fid));
	CHECK(fi_close(&plain->fid));
	CHECK(fi_close(&n.av->fid));
	CHECK(fi_close(&n.cq->fid));
	CHECK(fi_close(&n.domain->fid));
	CHECK(fi_close(&n.fabric->fid));
	fi_freeinfo(n.info);

	struct end a, b;
	uint64_t caps = FI_MSG | FI_RMA | FI_ATOMIC | FI_RMA_EVENT;
	open_with(&a, caps);
	open_with(&b, caps);
	CHECK(fi_cntr_open(b.domain, &ca, &wr_c, NULL));
	CHECK(fi_cntr_open(b.domain, &ca, &rd_c, NULL));
	CHECK(fi_ep_bind(b.ep, &wr_c->fid, FI_REMOTE_WRITE));
	CHECK(fi_ep_bind(b.ep, &rd_c->fid, FI_REMOTE_READ));
	enable(&a);
	enable(&b);
	fi_addr_t to = end_insert(&a, &b);
	end_insert(&b, &a);

	static char target[8192];
	char back[64];
	struct fid_mr *mr;
	CHECK(fi_mr_reg(b.domain, target, sizeof(target), FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0,
			0, &mr, NULL));
	uint64_t key = fi_mr_key(mr);
	/* Per-region counters are not implemented: said, not silently accepted. */
	EXPECT(fi_mr_bind(mr, &wr_c->fid, FI_REMOTE_WRITE) == -FI_ENOSYS);

	for (int k = 0; k < 3; k++) {
		CHECK(fi_write(a.ep, "event", 6, NULL, to, 100 * k, key, NULL));
		wait_ok(a.cq, NULL);
	}
	uint64_t one = 1;
	CHECK(fi_atomic(a.ep, &one, 1, NULL, to, 4096, key, FI_UINT64, FI_SUM, NULL));
	wait_ok(a.cq, NULL);
	for (int k = 0; k < 2; k++) {
		CHECK(fi_read(a.ep, back, 6, NULL, to, 100, key, NULL));
		wait_ok(a.cq, NULL);
		EXPECT(memcmp(back, "event", 6) == 0);
	}
	CHECK(fi_cntr_wait(wr_c, 4, 30000));
	CHECK(fi_cntr_wait(rd_c, 2, 30000));
	EXPECT(fi_cntr_read(wr_c) == 4 && fi_cntr_read(rd_c) == 2);

	/* A write that fails (bad key) is not an event; the next good one is. */
	struct fi_cq_tagged_entry ce;
	struct fi_cq_err_entry err;
	CHECK(fi_write(a.ep, "bad", 4, NULL, to, 0, key ^ 0x77, NULL));
	EXPECT(wait_comp(a.cq, &ce, &err, 30) == 0);
	int ok = 0;
	for (int tries = 0; tries < 3 && !ok; tries++) {
		CHECK(fi_write(a.ep, "good", 5, NULL, to, 0, key, NULL));
		ok = wait_comp(a.cq, &ce, &err, 30); /* a flush of the failed connection retries */
	}
	EXPECT(ok);
	CHECK(fi_cntr_wait(wr_c, 5, 30000));
	/* Let any stray event arrive before the exact check. */
	double t0 = now_s();
	while (now_s() - t0 < 0.2)
		fi_cntr_read(wr_c);
	EXPECT(fi_cntr_read(wr_c) == 5 && fi_cntr_read(rd_c) == 2);
	EXPECT(fi_cntr_readerr(wr_c) == 0);

	CHECK(fi_close(&mr->fid));
	CHECK(fi_close(&b.ep->fid));
	CHECK(fi_close(&wr_c->fid));
	CHECK(fi_close(&rd_c->fid));
	CHECK(fi_close(&b.av->fid));
	CHECK(fi_close(&b.cq->fid));
	CHECK(fi_close(&b.domain->fid));
	CHECK(fi_close(&b.fabric->fid));
	fi_freeinfo(b.info);
	end_close(&a);
	printf("PASS rmaevent\n");
	return 0;
}
