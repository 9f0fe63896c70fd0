/* Bad arguments to the braid provider's calls: every one returns an error code (and none
 * crashes): null handles and pointers, handles of the wrong kind, bad flags, unknown
 * addresses, oversized messages and iov counts, calls in the wrong state, closing objects
 * still in use, and the operations the provider does not offer. */
#include "common.h"
#include <rdma/fi_atomic.h>
#include <rdma/fi_collective.h>
#include <rdma/fi_rma.h>

#define ERR(call, code)                                                                 \
	do {                                                                            \
		long _r = (long)(call);                                                 \
		if (_r != -(code)) {                                                    \
			fprintf(stderr, "%s:%d: %s = %ld, expected -%s\n", __FILE__,   \
				__LINE__, #call, _r, #code);                            \
			exit(1);                                                        \
		}                                                                       \
	} while (0)
#define FAILS(call) EXPECT((long)(call) < 0)

int main(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->ep_attr->type = FI_EP_MSG;
	ERR(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), FI_ENODATA);
	hints->ep_attr->type = FI_EP_RDM;
	/* RMA needs provider keys, which an mr_mode of 0 does not allow. */
	hints->caps = FI_RMA;
	ERR(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), FI_ENODATA);
	hints->caps = FI_COLLECTIVE;
	ERR(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), FI_ENODATA);
	hints->caps = FI_MSG;
	hints->tx_attr->inject_size = 1 << 20;
	ERR(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), FI_ENODATA);
	hints->tx_attr->inject_size = 0;
	hints->ep_attr->max_msg_size = (size_t)1 << 40;
	ERR(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info), FI_ENODATA);
	fi_freeinfo(hints);

	struct fi_info *good = braid_info(FI_MSG | FI_TAGGED, FI_WAIT_NONE);
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	CHECK(fi_fabric(good->fabric_attr, &fabric, NULL));
	ERR(fi_domain(fabric, NULL, &domain, NULL), FI_EINVAL);
	ERR(fi_domain(fabric, good, NULL, NULL), FI_EINVAL);
	CHECK(fi_domain(fabric, good, &domain, NULL));

	/* CQ, AV, MR arguments. */
	ERR(fi_cq_open(domain, NULL, &cq, NULL), FI_EINVAL);
	struct fi_cq_attr bad_cq = { .format = 99 };
	ERR(fi_cq_open(domain, &bad_cq, &cq, NULL), FI_ENOSYS);
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA };
	CHECK(fi_cq_open(domain, &cq_attr, &cq, NULL));
	ERR(fi_cq_read(cq, NULL, 1), FI_EINVAL);
	struct fi_cq_data_entry de;
	ERR(fi_cq_read(cq, &de, 1), FI_EAGAIN);
	struct fi_cq_err_entry ee;
	ERR(fi_cq_readerr(cq, &ee, 0), FI_EAGAIN);
	ERR(fi_cq_readerr(cq, NULL, 0), FI_EINVAL);
	int fd;
	ERR(fi_control(&cq->fid, FI_GETWAIT, &fd), FI_ENODATA);
	struct fi_av_attr bad_av = { .type = FI_AV_TABLE, .flags = FI_EVENT };
	ERR(fi_av_open(domain, &bad_av, &av, NULL), FI_ENOSYS);
	struct fi_av_attr av_attr = { .type = FI_AV_MAP };
	CHECK(fi_av_open(domain, &av_attr, &av, NULL));
	fi_addr_t a;
	ERR(fi_av_insert(av, NULL, 1, &a, 0, NULL), FI_EINVAL);
	struct sockaddr_in junk = { .sin_family = 77 };
	EXPECT(fi_av_insert(av, &junk, 1, &a, 0, NULL) == 0 && a == FI_ADDR_NOTAVAIL);
	char addrbuf[64];
	size_t alen = sizeof(addrbuf);
	ERR(fi_av_lookup(av, 12345, addrbuf, &alen), FI_EINVAL);
	ERR(fi_av_lookup(av, 0, addrbuf, NULL), FI_EINVAL);
	fi_addr_t gone = 4242;
	ERR(fi_av_remove(av, &gone, 1, 0), FI_EINVAL);
	struct fid_mr *mr;
	char mem[64];
	ERR(fi_mr_reg(domain, NULL, 10, FI_SEND, 0, 0, 0, &mr, NULL), FI_EINVAL);
	ERR(fi_mr_reg(domain, mem, sizeof(mem), FI_SEND, 0, 0, 0, NULL, NULL), FI_EINVAL);
	struct iovec two[2] = { { mem, 8 }, { mem + 8, 8 } };
	ERR(fi_mr_regv(domain, two, 2, FI_SEND, 0, 0, 0, &mr, NULL), FI_EINVAL);
	CHECK(fi_mr_reg(domain, mem, sizeof(mem), FI_SEND | FI_RECV, 0, 0, 0, &mr, NULL));
	EXPECT(fi_mr_desc(mr) != NULL);

	/* Endpoint: state and binding errors. */
	ERR(fi_endpoint(domain, good, NULL, NULL), FI_EINVAL);
	CHECK(fi_endpoint(domain, good, &ep, NULL));
	/* A second endpoint on the domain is allowed (it gets a device of its own). */
	struct fid_ep *second;
	CHECK(fi_endpoint(domain, good, &second, NULL));
	CHECK(fi_close(&second->fid));
	ERR(fi_ep_bind(ep, NULL, 0), FI_EINVAL);
	ERR(fi_ep_bind(ep, &domain->fid, 0), FI_EINVAL);
	ERR(fi_ep_bind(ep, &cq->fid, 0), FI_EBADFLAGS);
	ERR(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | (1ULL << 40)), FI_EBADFLAGS);
	ERR(fi_send(ep, mem, 8, NULL, 0, NULL), FI_EOPBADSTATE);
	ERR(fi_recv(ep, mem, 8, NULL, FI_ADDR_UNSPEC, NULL), FI_EOPBADSTATE);
	ERR(fi_enable(ep), FI_ENOAV);
	CHECK(fi_ep_bind(ep, &av->fid, 0));
	ERR(fi_enable(ep), FI_ENOCQ);
	CHECK(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_enable(ep));
	ERR(fi_ep_bind(ep, &cq->fid, FI_TRANSMIT), FI_EOPBADSTATE);

	/* Operations: bad addresses, sizes, pointers and flags. */
	ERR(fi_send(ep, mem, 8, NULL, 777, NULL), FI_EINVAL);
	ERR(fi_send(ep, NULL, 8, NULL, 0, NULL), FI_EINVAL);
	ERR(fi_tsend(ep, mem, 8, NULL, 777, 1, NULL), FI_EINVAL);
	struct iovec many[8];
	for (int i = 0; i < 8; i++) {
		many[i].iov_base = mem;
		many[i].iov_len = 1;
	}
	ERR(fi_sendv(ep, many, NULL, 8, 0, NULL), FI_EINVAL);
	ERR(fi_recvv(ep, many, NULL, 8, FI_ADDR_UNSPEC, NULL), FI_EINVAL);
	ERR(fi_sendmsg(ep, NULL, 0), FI_EINVAL);
	ERR(fi_recvmsg(ep, NULL, 0), FI_EINVAL);
	struct fi_msg bad = { .msg_iov = NULL, .iov_count = 3 };
	ERR(fi_sendmsg(ep, &bad, 0), FI_EINVAL);
	ERR(fi_recvmsg(ep, &bad, 1ULL << 62), FI_EINVAL);
	/* An address of our own AV, so the size check is what refuses. */
	struct sockaddr_in self;
	size_t slen = sizeof(self);
	CHECK(fi_getname(&ep->fid, &self, &slen));
	EXPECT(fi_av_insert(av, &self, 1, &a, 0, NULL) == 1);
	static char huge[1 << 20];
	ERR(fi_inject(ep, huge, sizeof(huge), a), FI_EMSGSIZE);
	ERR(fi_tinject(ep, huge, sizeof(huge), a, 1), FI_EMSGSIZE);
	size_t tiny = 2;
	ERR(fi_getname(&ep->fid, addrbuf, &tiny), FI_ETOOSMALL);
	EXPECT(tiny == sizeof(struct sockaddr_in));
	ERR(fi_getname(&ep->fid, addrbuf, NULL), FI_EINVAL);
	ERR(fi_cancel(&ep->fid, (void *)0x1234), FI_ENOENT);
	ERR(fi_setopt(&ep->fid, 999, FI_OPT_MIN_MULTI_RECV, &tiny, sizeof(tiny)), FI_ENOPROTOOPT);
	ERR(fi_setopt(&ep->fid, FI_OPT_ENDPOINT, 999, &tiny, sizeof(tiny)), FI_ENOPROTOOPT);
	ERR(fi_control(&ep->fid, 999, NULL), FI_ENOSYS);

	/* Capabilities this endpoint was not opened with, and what the provider does not offer:
	 * explicit refusals, never a NULL op. */
	ERR(fi_write(ep, mem, 8, NULL, a, 0, 1, NULL), FI_EOPNOTSUPP);
	ERR(fi_read(ep, mem, 8, NULL, a, 0, 1, NULL), FI_EOPNOTSUPP);
	ERR(fi_writedata(ep, mem, 8, NULL, 5, a, 0, 1, NULL), FI_EOPNOTSUPP);
	uint64_t one64 = 1;
	ERR(fi_atomic(ep, &one64, 1, NULL, a, 0, 1, FI_UINT64, FI_SUM, NULL), FI_EOPNOTSUPP);
	size_t count;
	ERR(fi_atomicvalid(ep, FI_UINT64, FI_MIN, &count), FI_EOPNOTSUPP);
	ERR(fi_atomicvalid(ep, FI_DOUBLE, FI_SUM, &count), FI_EOPNOTSUPP);
	ERR(fi_fetch_atomicvalid(ep, FI_UINT8, FI_SUM, &count), FI_EOPNOTSUPP);
	ERR(fi_compare_atomicvalid(ep, FI_UINT64, FI_CSWAP_NE, &count), FI_EOPNOTSUPP);
	struct fi_atomic_attr aattr;
	ERR(fi_query_atomic(domain, FI_FLOAT, FI_SUM, &aattr, 0), FI_EOPNOTSUPP);
	CHECK(fi_query_atomic(domain, FI_UINT64, FI_SUM, &aattr, 0));
	EXPECT(aattr.size == 8 && aattr.count == 1);
	ERR(fi_barrier(ep, a, NULL), FI_ENOSYS);
	ERR(fi_connect(ep, &self, NULL, 0), FI_ENOSYS);
	ERR(fi_accept(ep, NULL, 0), FI_ENOSYS);
	ERR(fi_shutdown(ep, 0), FI_ENOSYS);
	struct fid_ep *sep;
	ERR(fi_scalable_ep(domain, good, &sep, NULL), FI_ENOSYS);
	struct fid_pep *pep;
	ERR(fi_passive_ep(fabric, good, &pep, NULL), FI_ENOSYS);

	/* Closing in the wrong order is refused; the right order works. */
	ERR(fi_close(&domain->fid), FI_EBUSY);
	ERR(fi_close(&cq->fid), FI_EBUSY);
	CHECK(fi_close(&ep->fid));
	CHECK(fi_close(&mr->fid));
	CHECK(fi_close(&av->fid));
	CHECK(fi_close(&cq->fid));
	CHECK(fi_close(&domain->fid));
	CHECK(fi_close(&fabric->fid));
	fi_freeinfo(good);
	printf("PASS badargs\n");
	return 0;
}
