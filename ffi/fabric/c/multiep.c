/* Several endpoints in one domain through the braid provider: two endpoints opened on one
 * domain have distinct names, each talks to a peer of its own (tagged send/recv both ways,
 * small and rendezvous sizes, verified), both talk to the same third peer, which tells them
 * apart (distinct AV entries) and answers each with the same tag; closing
 * one endpoint leaves the other working; RMA aimed at the domain's first endpoint reaches
 * the domain's memory region. */
#include "common.h"
#include <rdma/fi_rma.h>

#define BIG (256 * 1024)

/* An endpoint with its own CQ and AV on an existing domain. */
struct sub {
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	char name[64];
	size_t namelen;
};

/* end_open with FI_TAGGED | FI_RMA and provider keys (which RMA needs). */
static void rma_end_open(struct end *e)
{
	struct fi_info *hints = fi_allocinfo();
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(e, 0, sizeof(*e));
	hints->caps = FI_TAGGED | FI_RMA;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->domain_attr->name = strdup("lo");
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_LOCAL;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &e->info));
	fi_freeinfo(hints);
	EXPECT(e->info->domain_attr->ep_cnt >= 2);
	CHECK(fi_fabric(e->info->fabric_attr, &e->fabric, NULL));
	CHECK(fi_domain(e->fabric, e->info, &e->domain, NULL));
	CHECK(fi_cq_open(e->domain, &cq_attr, &e->cq, NULL));
	CHECK(fi_av_open(e->domain, &av_attr, &e->av, NULL));
	CHECK(fi_endpoint(e->domain, e->info, &e->ep, NULL));
	CHECK(fi_ep_bind(e->ep, &e->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(e->ep, &e->av->fid, 0));
	CHECK(fi_enable(e->ep));
	e->namelen = sizeof(e->name);
	CHECK(fi_getname(&e->ep->fid, e->name, &e->namelen));
}

static void sub_open(struct sub *s, struct end *owner)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(s, 0, sizeof(*s));
	CHECK(fi_cq_open(owner->domain, &cq_attr, &s->cq, NULL));
	CHECK(fi_av_open(owner->domain, &av_attr, &s->av, NULL));
	CHECK(fi_endpoint(owner->domain, owner->info, &s->ep, NULL));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHECK(fi_enable(s->ep));
	s->namelen = sizeof(s->name);
	CHECK(fi_getname(&s->ep->fid, s->name, &s->namelen));
}

static void sub_close(struct sub *s)
{
	CHECK(fi_close(&s->ep->fid));
	CHECK(fi_close(&s->av->fid));
	CHECK(fi_close(&s->cq->fid));
}

static fi_addr_t insert(struct fid_av *av, const char *name)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	EXPECT(fi_av_insert(av, name, 1, &a, 0, NULL) == 1);
	return a;
}

/* x sends `len` bytes tagged `tag` to y, which receives and checks them. */
static void tagged_once(struct fid_ep *x, struct fid_cq *xcq, fi_addr_t to, struct fid_ep *y,
			struct fid_cq *ycq, size_t len, uint64_t tag, unsigned seed)
{
	char *out = malloc(len), *in = calloc(1, len);
	struct fi_cq_tagged_entry ce;
	EXPECT(out && in);
	fill(out, len, seed);
	CHECK(fi_trecv(y, in, len, NULL, FI_ADDR_UNSPEC, tag, 0, in));
	CHECK(fi_tsend(x, out, len, NULL, to, tag, out));
	wait_ok(xcq, &ce);
	EXPECT(ce.op_context == out);
	wait_ok(ycq, &ce);
	EXPECT(ce.op_context == in && ce.len == len && ce.tag == tag);
	EXPECT(check_fill(in, len, seed));
	free(out);
	free(in);
}

int main(void)
{
	struct end d, p1, p2, p3;
	struct sub e2;
	rma_end_open(&d);
	sub_open(&e2, &d);
	rma_end_open(&p1);
	end_open(&p2, FI_TAGGED);
	end_open(&p3, FI_TAGGED);
	EXPECT(d.namelen == e2.namelen && memcmp(d.name, e2.name, d.namelen) != 0);

	/* Each endpoint of the domain with a peer of its own, both ways, eager and rendezvous. */
	fi_addr_t d_p1 = end_insert(&d, &p1), p1_d = insert(p1.av, d.name);
	fi_addr_t e2_p2 = insert(e2.av, p2.name), p2_e2 = insert(p2.av, e2.name);
	for (int i = 0; i < 3; i++) {
		size_t len = i == 2 ? BIG : (size_t)(64 << (4 * i));
		tagged_once(d.ep, d.cq, d_p1, p1.ep, p1.cq, len, 10 + i, 1 + i);
		tagged_once(e2.ep, e2.cq, e2_p2, p2.ep, p2.cq, len, 20 + i, 4 + i);
		tagged_once(p1.ep, p1.cq, p1_d, d.ep, d.cq, len, 30 + i, 7 + i);
		tagged_once(p2.ep, p2.cq, p2_e2, e2.ep, e2.cq, len, 40 + i, 9 + i);
	}

	/* Both talk to p3, which receives from each by its AV address and replies to each. */
	fi_addr_t d_p3 = end_insert(&d, &p3), e2_p3 = insert(e2.av, p3.name);
	fi_addr_t p3_d = insert(p3.av, d.name), p3_e2 = insert(p3.av, e2.name);
	EXPECT(p3_d != p3_e2);
	tagged_once(d.ep, d.cq, d_p3, p3.ep, p3.cq, 100, 50, 11);
	tagged_once(e2.ep, e2.cq, e2_p3, p3.ep, p3.cq, 100, 51, 12);
	/* A reply to each, with the same tag: each lands at its own endpoint only. */
	char rd[16] = { 0 }, re[16] = { 0 };
	struct fi_cq_tagged_entry ce;
	CHECK(fi_trecv(d.ep, rd, sizeof(rd), NULL, FI_ADDR_UNSPEC, 60, 0, rd));
	CHECK(fi_trecv(e2.ep, re, sizeof(re), NULL, FI_ADDR_UNSPEC, 60, 0, re));
	CHECK(fi_tsend(p3.ep, "to the first", 13, NULL, p3_d, 60, NULL));
	wait_ok(p3.cq, NULL);
	CHECK(fi_tsend(p3.ep, "to the second", 14, NULL, p3_e2, 60, NULL));
	wait_ok(p3.cq, NULL);
	wait_ok(d.cq, &ce);
	EXPECT(ce.op_context == rd && strcmp(rd, "to the first") == 0);
	wait_ok(e2.cq, &ce);
	EXPECT(ce.op_context == re && strcmp(re, "to the second") == 0);

	/* RMA from p1 into the domain's region, aimed at the domain's first endpoint. */
	static char target[4096];
	struct fid_mr *mr;
	CHECK(fi_mr_reg(d.domain, target, sizeof(target), FI_REMOTE_WRITE | FI_REMOTE_READ, 0, 0,
			0, &mr, NULL));
	CHECK(fi_write(p1.ep, "rma into the domain", 20, NULL, p1_d, 128, fi_mr_key(mr), NULL));
	wait_ok(p1.cq, NULL);
	EXPECT(strcmp(target + 128, "rma into the domain") == 0);
	CHECK(fi_close(&mr->fid));

	/* Closing the second endpoint leaves the first working; the domain is still busy. */
	sub_close(&e2);
	tagged_once(p1.ep, p1.cq, p1_d, d.ep, d.cq, 4096, 70, 13);
	tagged_once(d.ep, d.cq, d_p3, p3.ep, p3.cq, BIG, 71, 14);
	/* A new endpoint can be opened again and talks at once. */
	sub_open(&e2, &d);
	fi_addr_t e2_p2b = insert(e2.av, p2.name);
	tagged_once(e2.ep, e2.cq, e2_p2b, p2.ep, p2.cq, 1000, 72, 15);
	sub_close(&e2);

	end_close(&p3);
	end_close(&p2);
	end_close(&p1);
	end_close(&d);
	printf("PASS multiep\n");
	return 0;
}
