/* Remote addresses with and without FI_MR_VIRT_ADDR through the braid provider: in each of
 * three modes (FI_MR_VIRT_ADDR asked, FI_MR_BASIC, neither) fi_getinfo says which one it
 * gives, an fi_write and fi_read at an address inside the target region land where they
 * should (byte for byte), and addresses below the region and past its end give error
 * completions. In offset mode the target's virtual address is out of bounds; in virtual
 * mode a small offset is. */
#include "common.h"
#include <rdma/fi_rma.h>

#define LEN (64 * 1024)

enum mode { VIRT, BASIC, OFFSET };

static struct fi_info *mode_info(enum mode m)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	hints->caps = FI_MSG | FI_RMA;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->domain_attr->name = strdup("lo");
	if (m == VIRT)
		hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_VIRT_ADDR | FI_MR_LOCAL;
	else if (m == BASIC)
		hints->domain_attr->mr_mode = FI_MR_BASIC;
	else
		hints->domain_attr->mr_mode = FI_MR_PROV_KEY | FI_MR_LOCAL;
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	EXPECT(info->caps & FI_RMA);
	if (m == VIRT) {
		EXPECT(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR);
		EXPECT(info->domain_attr->mr_mode & FI_MR_PROV_KEY);
		EXPECT(info->domain_attr->mr_key_size == 8);
	} else if (m == BASIC) {
		EXPECT(info->domain_attr->mr_mode == FI_MR_BASIC);
		EXPECT(info->domain_attr->mr_key_size == 8);
	} else {
		EXPECT(!(info->domain_attr->mr_mode & FI_MR_VIRT_ADDR));
		EXPECT(info->domain_attr->mr_key_size == 4);
	}
	fi_freeinfo(hints);
	return info;
}

static void open_mode(struct end *e, enum mode m)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_DATA };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(e, 0, sizeof(*e));
	e->info = mode_info(m);
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

/* The next completion of cq: 0 for success, else the error entry's code (fi_cq_readerr). */
static int next(struct fid_cq *cq, void *ctx)
{
	struct fi_cq_data_entry d;
	struct fi_cq_err_entry err = { 0 };
	double t0 = now_s();
	ssize_t r;
	while ((r = fi_cq_read(cq, &d, 1)) == -FI_EAGAIN)
		EXPECT(now_s() - t0 < 30);
	if (r == 1) {
		EXPECT(d.op_context == ctx);
		return 0;
	}
	EXPECT(r == -FI_EAVAIL);
	EXPECT(fi_cq_readerr(cq, &err, 0) == 1);
	EXPECT(err.err != 0 && err.op_context == ctx);
	return err.err;
}

/* A write that must succeed; a remote error earlier fails the Braid connection and flushes
 * what follows it, so a flushed attempt is retried on the new connection. */
static void write_ok(struct end *a, fi_addr_t to, const void *buf, size_t len, uint64_t addr,
		     uint64_t key)
{
	for (int tries = 0; tries < 3; tries++) {
		CHECK(fi_write(a->ep, buf, len, NULL, to, addr, key, (void *)buf));
		if (next(a->cq, (void *)buf) == 0)
			return;
	}
	EXPECT(!"write kept failing");
}

static void read_ok(struct end *a, fi_addr_t to, void *buf, size_t len, uint64_t addr,
		    uint64_t key)
{
	for (int tries = 0; tries < 3; tries++) {
		CHECK(fi_read(a->ep, buf, len, NULL, to, addr, key, buf));
		if (next(a->cq, buf) == 0)
			return;
	}
	EXPECT(!"read kept failing");
}

/* A remote access error fails the Braid connection (verbs semantics), so each failing
 * operation follows a successful one at `ok_addr`: its error is its own (FI_EACCES), not a
 * flush and not the remote operation error of a QP already in error. */
static int fails(int e, const char *what, uint64_t addr)
{
	if (e != FI_EACCES)
		fprintf(stderr, "%s at 0x%llx: error %d (%s)\n", what, (unsigned long long)addr, e,
			fi_strerror(e));
	return e;
}

static void write_fails(struct end *a, fi_addr_t to, const void *buf, size_t len,
			uint64_t addr, uint64_t key, uint64_t ok_addr)
{
	char probe[4] = "ok!";
	write_ok(a, to, probe, 4, ok_addr, key);
	CHECK(fi_write(a->ep, buf, len, NULL, to, addr, key, (void *)buf));
	EXPECT(fails(next(a->cq, (void *)buf), "write", addr) == FI_EACCES);
}

static void read_fails(struct end *a, fi_addr_t to, void *buf, size_t len, uint64_t addr,
		       uint64_t key, uint64_t ok_addr)
{
	char probe[4] = "ok!";
	write_ok(a, to, probe, 4, ok_addr, key);
	CHECK(fi_read(a->ep, buf, len, NULL, to, addr, key, buf));
	EXPECT(fails(next(a->cq, buf), "read", addr) == FI_EACCES);
}

static void run(enum mode m)
{
	struct end a, b;
	open_mode(&a, m);
	open_mode(&b, m);
	fi_addr_t to = end_insert(&a, &b);
	end_insert(&b, &a);

	/* The region starts 8 bytes into an allocation, so neither its base nor its length is
	 * page aligned; the bytes around it must stay untouched. */
	char *alloc = calloc(1, LEN + 16), *target = alloc + 8;
	char src[64], back[64];
	EXPECT(alloc);
	struct fid_mr *mr;
	CHECK(fi_mr_reg(b.domain, target, LEN, FI_REMOTE_READ | FI_REMOTE_WRITE, 0, 0, 0, &mr,
			NULL));
	uint64_t key = fi_mr_key(mr);
	EXPECT(key != FI_KEY_NOTAVAIL);
	int virt = m != OFFSET;
	uint64_t base = virt ? (uint64_t)(uintptr_t)target : 0;

	for (int i = 0; i < 64; i++)
		src[i] = (char)(i * 3 + m);
	write_ok(&a, to, src, 64, base + 1000, key);
	EXPECT(memcmp(target + 1000, src, 64) == 0);
	write_ok(&a, to, "first", 5, base, key);
	EXPECT(memcmp(target, "first", 5) == 0);
	write_ok(&a, to, "last", 4, base + LEN - 4, key);
	EXPECT(memcmp(target + LEN - 4, "last", 4) == 0);
	memset(back, 0, sizeof(back));
	read_ok(&a, to, back, 64, base + 1000, key);
	EXPECT(memcmp(back, src, 64) == 0);

	/* Bounds, both ways: just below the region and across its end. */
	uint64_t ok = base + 2000;
	write_fails(&a, to, "under", 8, base - 8, key, ok);
	write_fails(&a, to, "overrun", 8, base + LEN - 4, key, ok);
	read_fails(&a, to, back, 8, base + LEN, key, ok);
	if (virt)
		/* An offset is not an address here: 1000 is far below the region. */
		read_fails(&a, to, back, 8, 1000, key, ok);
	else
		/* And an address is not an offset. */
		write_fails(&a, to, "virtual", 8, (uint64_t)(uintptr_t)target + 64, key, ok);
	EXPECT(memcmp(target + 2000, "ok!", 4) == 0);
	for (int i = 0; i < 8; i++)
		EXPECT(alloc[i] == 0 && alloc[LEN + 8 + i] == 0);
	EXPECT(memcmp(target + LEN - 4, "last", 4) == 0);

	/* Still usable after the errors. */
	write_ok(&a, to, "again", 6, base + 200, key);
	EXPECT(memcmp(target + 200, "again", 6) == 0);

	CHECK(fi_close(&mr->fid));
	end_close(&b);
	end_close(&a);
	free(alloc);
}

int main(void)
{
	run(VIRT);
	run(BASIC);
	run(OFFSET);
	printf("PASS virtaddr\n");
	return 0;
}
