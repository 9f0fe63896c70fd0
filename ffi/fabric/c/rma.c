/* RMA and atomics through the braid provider, verified byte for byte: fi_write (small and
 * 1 MiB), fi_read, fi_writedata (the target sees FI_REMOTE_CQ_DATA with the 4 data bytes on
 * its receive CQ), fi_inject_write; 64-bit FI_SUM, FI_ATOMIC_READ and FI_CSWAP, with the
 * atomic valid queries; a bad key and an out-of-bounds offset give error completions
 * (fi_cq_readerr) and leave the endpoint usable. Addresses are offsets into the target
 * region (no FI_MR_VIRT_ADDR); keys are provider keys. */
#include "common.h"
#include <rdma/fi_atomic.h>
#include <rdma/fi_rma.h>

#define LEN (1 << 20)

static struct fi_info *rma_info(void)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->caps = FI_MSG | FI_RMA | FI_ATOMIC;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->domain_attr->name = strdup("lo");
	hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_LOCAL | FI_MR_ALLOCATED;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	EXPECT(info->caps & FI_RMA && info->caps & FI_ATOMIC);
	EXPECT(info->domain_attr->mr_mode & FI_MR_PROV_KEY);
	EXPECT(!(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR));
	fi_freeinfo(hints);
	return info;
}

static void open_end(struct end *e)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(e, 0, sizeof(*e));
	e->info = rma_info();
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

static void wait_data(struct fid_cq *cq, struct fi_cq_data_entry *out)
{
	double t0 = now_s();
	ssize_t r;
	while ((r = fi_cq_read(cq, out, 1)) == -FI_EAGAIN)
		EXPECT(now_s() - t0 < 30);
	if (r != 1) {
		struct fi_cq_err_entry e = { 0 };
		fi_cq_readerr(cq, &e, 0);
		fprintf(stderr, "error completion: %s\n", fi_strerror(e.err));
		exit(1);
	}
}

static int wait_err(struct fid_cq *cq, struct fi_cq_err_entry *err)
{
	struct fi_cq_data_entry d;
	double t0 = now_s();
	ssize_t r;
	while ((r = fi_cq_read(cq, &d, 1)) == -FI_EAGAIN)
		EXPECT(now_s() - t0 < 30);
	if (r != -FI_EAVAIL)
		return 0;
	EXPECT(fi_cq_readerr(cq, err, 0) == 1);
	return 1;
}

int main(void)
{
	struct end a, b;
	struct fi_cq_data_entry ce;
	struct fi_cq_err_entry err;
	open_end(&a);
	open_end(&b);
	fi_addr_t to = end_insert(&a, &b);
	end_insert(&b, &a);

	char *target = calloc(1, LEN), *src = malloc(LEN), *back = calloc(1, LEN);
	EXPECT(target && src && back);
	struct fid_mr *mr;
	CHECK(fi_mr_reg(b.domain, target, LEN, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr, NULL));
	uint64_t key = fi_mr_key(mr);
	EXPECT(key != FI_KEY_NOTAVAIL);

	/* WRITE 1 MiB, READ it back. */
	fill(src, LEN, 11);
	CHECK(fi_write(a.ep, src, LEN, NULL, to, 0, key, src));
	wait_data(a.cq, &ce);
	EXPECT(ce.op_context == src && ce.flags & FI_RMA && ce.flags & FI_WRITE);
	EXPECT(check_fill(target, LEN, 11));
	CHECK(fi_read(a.ep, back, LEN, NULL, to, 0, key, back));
	wait_data(a.cq, &ce);
	EXPECT(ce.op_context == back && ce.flags & FI_READ);
	EXPECT(memcmp(back, target, LEN) == 0);

	/* A small write at an offset, and an inject. */
	CHECK(fi_write(a.ep, "offset!", 8, NULL, to, 4096, key, NULL));
	wait_data(a.cq, &ce);
	EXPECT(memcmp(target + 4096, "offset!", 8) == 0);
	char inj[16] = "injected";
	CHECK(fi_inject_write(a.ep, inj, 9, to, 8192, key));
	memset(inj, 0, sizeof(inj)); /* the buffer is free at once */
	/* Read back until the inject has landed (it has no completion). */
	double t0 = now_s();
	while (memcmp(target + 8192, "injected", 9) != 0)
		EXPECT(now_s() - t0 < 30);

	/* writedata: the target gets the 4 bytes of data on its receive CQ. */
	CHECK(fi_writedata(a.ep, "with data", 10, NULL, 0xfeedbeef, to, 100, key, NULL));
	wait_data(a.cq, &ce);
	wait_data(b.cq, &ce);
	EXPECT(ce.flags & FI_REMOTE_CQ_DATA && ce.flags & FI_REMOTE_WRITE);
	EXPECT(ce.data == 0xfeedbeef && ce.len == 10);
	EXPECT(memcmp(target + 100, "with data", 10) == 0);

	/* Atomics on the u64 at offset 64. */
	size_t count = 0;
	CHECK(fi_atomicvalid(a.ep, FI_UINT64, FI_SUM, &count));
	EXPECT(count == 1);
	CHECK(fi_fetch_atomicvalid(a.ep, FI_UINT64, FI_ATOMIC_READ, &count));
	CHECK(fi_compare_atomicvalid(a.ep, FI_INT64, FI_CSWAP, &count));
	EXPECT(fi_atomicvalid(a.ep, FI_UINT32, FI_SUM, &count) == -FI_EOPNOTSUPP);
	EXPECT(fi_atomicvalid(a.ep, FI_UINT64, FI_PROD, &count) == -FI_EOPNOTSUPP);
	EXPECT(fi_compare_atomicvalid(a.ep, FI_UINT64, FI_MSWAP, &count) == -FI_EOPNOTSUPP);
	uint64_t *cell = (uint64_t *)(target + 64);
	*cell = 40;
	uint64_t two = 2, old = 0, cmp = 42, swap = 1000;
	CHECK(fi_atomic(a.ep, &two, 1, NULL, to, 64, key, FI_UINT64, FI_SUM, NULL));
	wait_data(a.cq, &ce);
	EXPECT(ce.flags & FI_ATOMIC);
	EXPECT(__atomic_load_n(cell, __ATOMIC_SEQ_CST) == 42);
	CHECK(fi_fetch_atomic(a.ep, NULL, 1, NULL, &old, NULL, to, 64, key, FI_UINT64, FI_ATOMIC_READ, NULL));
	wait_data(a.cq, &ce);
	EXPECT(old == 42);
	CHECK(fi_fetch_atomic(a.ep, &two, 1, NULL, &old, NULL, to, 64, key, FI_UINT64, FI_SUM, NULL));
	wait_data(a.cq, &ce);
	EXPECT(old == 42 && __atomic_load_n(cell, __ATOMIC_SEQ_CST) == 44);
	cmp = 44;
	CHECK(fi_compare_atomic(a.ep, &swap, 1, NULL, &cmp, NULL, &old, NULL, to, 64, key, FI_UINT64, FI_CSWAP, NULL));
	wait_data(a.cq, &ce);
	EXPECT(old == 44 && __atomic_load_n(cell, __ATOMIC_SEQ_CST) == 1000);
	cmp = 7; /* does not match: no swap, old value returned */
	CHECK(fi_compare_atomic(a.ep, &two, 1, NULL, &cmp, NULL, &old, NULL, to, 64, key, FI_UINT64, FI_CSWAP, NULL));
	wait_data(a.cq, &ce);
	EXPECT(old == 1000 && __atomic_load_n(cell, __ATOMIC_SEQ_CST) == 1000);
	EXPECT(fi_atomic(a.ep, &two, 1, NULL, to, 64, key, FI_UINT64, FI_MIN, NULL) == -FI_EOPNOTSUPP);
	EXPECT(fi_atomic(a.ep, &two, 1, NULL, to, 65, key, FI_UINT64, FI_SUM, NULL) == -FI_EINVAL);

	/* Errors: a bad key, then bounds. Error entries, then the endpoint works again? A remote
	 * access error fails the Braid QP (verbs semantics), so the next operation reconnects. */
	CHECK(fi_write(a.ep, src, 64, NULL, to, 0, key ^ 0x5555, src));
	EXPECT(wait_err(a.cq, &err));
	EXPECT(err.op_context == src && err.err == FI_EACCES);
	CHECK(fi_read(a.ep, back, 64, NULL, to, LEN - 8, key, back));
	EXPECT(wait_err(a.cq, &err));
	EXPECT(err.op_context == back && err.err != 0);
	/* Still usable. */
	int ok = 0;
	for (int tries = 0; tries < 3 && !ok; tries++) {
		CHECK(fi_write(a.ep, "again", 6, NULL, to, 200, key, NULL));
		if (wait_err(a.cq, &err))
			continue; /* flushed by the failed connection: try again on a new one */
		ok = 1;
	}
	EXPECT(ok);
	EXPECT(memcmp(target + 200, "again", 6) == 0);

	CHECK(fi_close(&mr->fid));
	end_close(&b);
	end_close(&a);
	free(target);
	free(src);
	free(back);
	printf("PASS rma\n");
	return 0;
}
