/* What fabtests' unit suites (fi_getinfo_test, fi_av_test) found the braid provider getting
 * wrong, checked here in our own words:
 * - tx_attr->caps holds only primary and transmit-side bits, rx_attr->caps only primary and
 *   receive-side bits and nothing info->caps lacks (both with and without hints), and the
 *   primary capabilities asked for appear on both sides;
 * - domain capabilities asked for (FI_LOCAL_COMM, FI_REMOTE_COMM) are returned;
 * - fi_av_insert with FI_SYNC_ERR reports one result per address (0 for the good one, an
 *   error for the bad one), needs the result array, and unknown flags are -FI_EBADFLAGS;
 * - the FI_INJECT flag on fi_sendmsg / fi_tsendmsg / fi_writemsg only frees the buffer at
 *   once: the operation still completes with its context (fi_msg_inject), while fi_inject
 *   calls give no completion. */
#include <rdma/fi_rma.h>
#include "common.h"

#define TX_OK (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_SEND | FI_READ | FI_WRITE)
#define RX_OK (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC | FI_RECV | FI_REMOTE_READ | \
	       FI_REMOTE_WRITE | FI_DIRECTED_RECV | FI_SOURCE | FI_MULTI_RECV | FI_RMA_EVENT)

static void check_caps(struct fi_info *list, uint64_t asked)
{
	int n = 0;
	for (struct fi_info *i = list; i; i = i->next, n++) {
		if (strcmp(i->fabric_attr->prov_name, "braid") != 0)
			continue;
		EXPECT((i->tx_attr->caps & ~TX_OK) == 0);
		EXPECT((i->rx_attr->caps & ~RX_OK) == 0);
		EXPECT((i->rx_attr->caps & ~i->caps) == 0);
		EXPECT((i->tx_attr->caps & ~i->caps) == 0);
		uint64_t prim = asked & (FI_MSG | FI_RMA | FI_TAGGED | FI_ATOMIC);
		EXPECT((i->caps & prim) == prim);
		EXPECT((i->tx_attr->caps & prim) == prim);
		EXPECT((i->rx_attr->caps & prim) == prim);
	}
	EXPECT(n > 0);
}

int main(void)
{
	struct fi_info *hints, *info = NULL;

	/* No hints at all. */
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, NULL, &info));
	check_caps(info, 0);
	fi_freeinfo(info);

	/* Each primary capability alone and all together, with provider keys offered. */
	uint64_t sets[] = { FI_MSG, FI_TAGGED, FI_RMA, FI_ATOMIC,
			    FI_MSG | FI_TAGGED | FI_RMA | FI_ATOMIC };
	for (size_t k = 0; k < sizeof(sets) / sizeof(sets[0]); k++) {
		hints = fi_allocinfo();
		hints->caps = sets[k];
		hints->ep_attr->type = FI_EP_RDM;
		hints->fabric_attr->prov_name = strdup("braid");
		hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_LOCAL;
		CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
		check_caps(info, sets[k]);
		fi_freeinfo(info);
		fi_freeinfo(hints);
	}

	/* Domain capabilities. */
	uint64_t dcaps[] = { FI_LOCAL_COMM, FI_REMOTE_COMM, FI_LOCAL_COMM | FI_REMOTE_COMM };
	for (size_t k = 0; k < 3; k++) {
		hints = fi_allocinfo();
		hints->fabric_attr->prov_name = strdup("braid");
		hints->domain_attr->caps = dcaps[k];
		CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
		for (struct fi_info *i = info; i; i = i->next)
			EXPECT((i->domain_attr->caps & dcaps[k]) == dcaps[k]);
		fi_freeinfo(info);
		fi_freeinfo(hints);
	}

	/* FI_SYNC_ERR: one good address, one bad (port 0). */
	struct end a;
	end_open(&a, FI_MSG);
	struct sockaddr_in two[2];
	EXPECT(a.namelen == sizeof(two[0]));
	memcpy(&two[0], a.name, sizeof(two[0]));
	memcpy(&two[1], a.name, sizeof(two[1]));
	two[1].sin_port = 0;
	int errs[2] = { -1, 0 };
	fi_addr_t out[2];
	EXPECT(fi_av_insert(a.av, two, 2, out, FI_SYNC_ERR, errs) == 1);
	EXPECT(errs[0] == 0 && errs[1] != 0);
	EXPECT(out[0] != FI_ADDR_NOTAVAIL && out[1] == FI_ADDR_NOTAVAIL);
	EXPECT(fi_av_insert(a.av, two, 2, out, FI_SYNC_ERR, NULL) == -FI_EINVAL);
	EXPECT(fi_av_insert(a.av, two, 1, out, 1ULL << 50, NULL) == -FI_EBADFLAGS);
	end_close(&a);

	/* FI_INJECT as a flag completes; fi_inject does not. */
	struct end s, r;
	end_open(&s, FI_MSG | FI_TAGGED);
	end_open(&r, FI_MSG | FI_TAGGED);
	fi_addr_t to = end_insert(&s, &r);
	char buf[64] = "flagged", in[64];
	int ctx_msg, ctx_tag, ctx_last;
	struct iovec iov = { buf, 8 };
	struct fi_msg m = { .msg_iov = &iov, .iov_count = 1, .addr = to, .context = &ctx_msg };
	struct fi_msg_tagged t = { .msg_iov = &iov, .iov_count = 1, .addr = to, .tag = 9,
				   .context = &ctx_tag };
	struct fi_cq_tagged_entry ce;
	CHECK(fi_sendmsg(s.ep, &m, FI_INJECT));
	memset(buf, 0, sizeof(buf)); /* free at once */
	wait_ok(s.cq, &ce);
	EXPECT(ce.op_context == &ctx_msg && ce.flags & FI_SEND);
	strcpy(buf, "tagged");
	CHECK(fi_tsendmsg(s.ep, &t, FI_INJECT));
	wait_ok(s.cq, &ce);
	EXPECT(ce.op_context == &ctx_tag && ce.flags & FI_TAGGED);
	CHECK(fi_inject(s.ep, "quiet", 6, to));
	CHECK(fi_send(s.ep, "last", 5, NULL, to, &ctx_last));
	wait_ok(s.cq, &ce);
	EXPECT(ce.op_context == &ctx_last); /* nothing from the fi_inject before it */
	for (int k = 0; k < 3; k++) {
		CHECK(fi_recv(r.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, NULL));
		wait_ok(r.cq, &ce);
	}
	CHECK(fi_trecv(r.ep, in, sizeof(in), NULL, FI_ADDR_UNSPEC, 9, 0, NULL));
	wait_ok(r.cq, &ce);
	EXPECT(strcmp(in, "tagged") == 0);
	end_close(&r);
	end_close(&s);
	printf("PASS conform\n");
	return 0;
}
