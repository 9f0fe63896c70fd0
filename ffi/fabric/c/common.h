/* Shared helpers of the braid provider's C tests: each test opens endpoints on the loopback
 * domain of the `braid` provider (FI_PROVIDER_PATH must point at libbraid_fi.so), checks
 * every call and exits non-zero with a message on the first failure. */
#ifndef BRAID_FI_TEST_COMMON_H
#define BRAID_FI_TEST_COMMON_H

#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>

#define CHECK(call)                                                                     \
	do {                                                                            \
		long _r = (long)(call);                                                 \
		if (_r < 0) {                                                           \
			fprintf(stderr, "%s:%d: %s = %ld (%s)\n", __FILE__, __LINE__,  \
				#call, _r, fi_strerror((int)-_r));                      \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

#define EXPECT(cond)                                                                    \
	do {                                                                            \
		if (!(cond)) {                                                          \
			fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__,     \
				#cond);                                                 \
			exit(1);                                                        \
		}                                                                       \
	} while (0)

/* One endpoint with its own fabric, domain, CQ (tagged format) and AV. */
struct end {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_cq *cq;
	struct fid_av *av;
	struct fid_ep *ep;
	char name[64];
	size_t namelen;
};

/* Set before end_open to ask for FI_PROGRESS_MANUAL (no provider thread). */
static int want_manual_progress;

static inline struct fi_info *braid_info(uint64_t caps, enum fi_wait_obj wait)
{
	struct fi_info *hints = fi_allocinfo(), *info = NULL;
	(void)wait;
	EXPECT(hints);
	hints->caps = caps;
	if (want_manual_progress)
		hints->domain_attr->data_progress = FI_PROGRESS_MANUAL;
	hints->ep_attr->type = FI_EP_RDM;
	hints->fabric_attr->prov_name = strdup("braid");
	hints->domain_attr->name = strdup("lo");
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	fi_freeinfo(hints);
	return info;
}

static inline void end_open_cq(struct end *e, uint64_t caps, enum fi_wait_obj wait)
{
	struct fi_cq_attr cq_attr = { .format = FI_CQ_FORMAT_TAGGED, .wait_obj = wait };
	struct fi_av_attr av_attr = { .type = FI_AV_TABLE };
	memset(e, 0, sizeof(*e));
	e->info = braid_info(caps, wait);
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

static inline void end_open(struct end *e, uint64_t caps)
{
	end_open_cq(e, caps, FI_WAIT_NONE);
}

static inline fi_addr_t end_insert(struct end *e, const struct end *peer)
{
	fi_addr_t a = FI_ADDR_NOTAVAIL;
	EXPECT(fi_av_insert(e->av, peer->name, 1, &a, 0, NULL) == 1);
	return a;
}

static inline void end_close(struct end *e)
{
	CHECK(fi_close(&e->ep->fid));
	CHECK(fi_close(&e->av->fid));
	CHECK(fi_close(&e->cq->fid));
	CHECK(fi_close(&e->domain->fid));
	CHECK(fi_close(&e->fabric->fid));
	fi_freeinfo(e->info);
}

static inline double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* Reads one completion (success or error) within `secs` seconds; returns 1 for success,
 * 0 for an error entry (in *err), and exits on timeout. Progress is made by reading. */
static inline int wait_comp(struct fid_cq *cq, struct fi_cq_tagged_entry *out,
		     struct fi_cq_err_entry *err, double secs)
{
	double deadline = now_s() + secs;
	for (;;) {
		ssize_t r = fi_cq_read(cq, out, 1);
		if (r == 1)
			return 1;
		if (r == -FI_EAVAIL) {
			struct fi_cq_err_entry e = { 0 };
			EXPECT(fi_cq_readerr(cq, &e, 0) == 1);
			if (err)
				*err = e;
			return 0;
		}
		EXPECT(r == -FI_EAGAIN);
		if (now_s() > deadline) {
			fprintf(stderr, "no completion within %.0f s\n", secs);
			exit(1);
		}
	}
}

/* Like wait_comp, but a success is required. */
static inline void wait_ok(struct fid_cq *cq, struct fi_cq_tagged_entry *out)
{
	struct fi_cq_err_entry e = { 0 };
	struct fi_cq_tagged_entry tmp;
	if (!wait_comp(cq, out ? out : &tmp, &e, 30)) {
		fprintf(stderr, "unexpected error completion: %s (%d)\n", fi_strerror(e.err), e.err);
		exit(1);
	}
}

static inline void fill(char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		b[i] = (char)(seed * 131 + i * 7 + (i >> 9));
}

static inline int check_fill(const char *b, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != (char)(seed * 131 + i * 7 + (i >> 9)))
			return 0;
	return 1;
}

#endif
