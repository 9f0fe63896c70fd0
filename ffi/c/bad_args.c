/*
 * Bad arguments to every call: NULL handles and pointers, forged, destroyed and wrong-kind
 * handles, bad keys, wrong sizes, unknown opcodes and flags, destroying in the wrong order.
 * Each must return the documented error code (or, for what only the engine can judge, an
 * error completion), never crash. One process, two devices on the loopback address.
 */
#include <stddef.h>

#include "common.h"

static int checks = 0;

/* `call` must return exactly `code`, and leave a message naming the function. */
#define EXPECT_RC(call, code)                                                            \
    do {                                                                                 \
        int rc_ = (call);                                                                \
        checks++;                                                                        \
        if (rc_ != (code)) {                                                             \
            fprintf(stderr, "%s:%d: %s returned %d (%s), expected %s (%d); last error: %s\n", \
                    __FILE__, __LINE__, #call, rc_, braid_strerror(rc_), #code, (code),  \
                    braid_last_error());                                                 \
            exit(1);                                                                     \
        }                                                                                \
        if ((code) < 0) {                                                                \
            EXPECT(strncmp(braid_last_error(), "braid_", 6) == 0,                        \
                   "a message naming the call, not \"%s\"", braid_last_error());         \
        }                                                                                \
    } while (0)

struct end {
    braid_device *dev;
    braid_pd *pd;
    braid_cq *cq;
    braid_qp *qp;
    braid_mr *mr;
    braid_mr_attr mr_attr;
};

static void make_end(struct end *e) {
    e->dev = open_device();
    CHECK(braid_pd_alloc(e->dev, &e->pd));
    CHECK(braid_cq_create(e->dev, &e->cq));
    CHECK(braid_qp_create(e->pd, e->cq, e->cq, 0, &e->qp));
    CHECK(braid_mr_alloc(e->pd, 4096, BRAID_ACCESS_LOCAL_WRITE | BRAID_ACCESS_REMOTE_WRITE, &e->mr));
    CHECK(braid_mr_query(e->mr, &e->mr_attr));
}

static void join(struct end *a, struct end *b) {
    uint8_t ia[BRAID_QP_INFO_SIZE], ib[BRAID_QP_INFO_SIZE];
    CHECK(braid_qp_info(a->qp, ia, sizeof ia));
    CHECK(braid_qp_info(b->qp, ib, sizeof ib));
    CHECK(braid_qp_connect(a->qp, ib, sizeof ib));
    CHECK(braid_qp_connect(b->qp, ia, sizeof ia));
}

/* A fresh connected QP pair on the two ends' devices (replacing the old QPs). */
static void fresh_qps(struct end *a, struct end *b) {
    CHECK(braid_qp_destroy(a->qp));
    CHECK(braid_qp_destroy(b->qp));
    CHECK(braid_qp_create(a->pd, a->cq, a->cq, 0, &a->qp));
    CHECK(braid_qp_create(b->pd, b->cq, b->cq, 0, &b->qp));
    join(a, b);
}

static void free_end(struct end *e) {
    CHECK(braid_qp_destroy(e->qp));
    CHECK(braid_mr_destroy(e->mr));
    CHECK(braid_cq_destroy(e->cq));
    CHECK(braid_pd_free(e->pd));
    CHECK(braid_device_close(e->dev));
}

static braid_send_wr write_wr(const struct end *src, const struct end *dst, braid_sge *sge) {
    *sge = (braid_sge){.offset = 0, .length = 64, .lkey = src->mr_attr.lkey};
    return (braid_send_wr){.wr_id = 1,
                           .opcode = BRAID_WR_RDMA_WRITE,
                           .send_flags = BRAID_SEND_SIGNALED,
                           .sg_list = sge,
                           .num_sge = 1,
                           .rkey = dst->mr_attr.rkey,
                           .remote_offset = 0};
}

/* A request only the engine can judge: refused at once (one of the codes `a`, `b`), or,
 * when another thread held the engine, accepted and then completed with an error. */
static void expect_refused(struct end *e, braid_send_wr *wr, int a, int b) {
    checks++;
    int rc = braid_post_send(e->qp, wr, 1, NULL);
    if (rc < 0) {
        EXPECT(rc == a || rc == b, "code %d (%s): %s", rc, braid_strerror(rc), braid_last_error());
        return;
    }
    EXPECT(rc == 0, "rc %d", rc);
    braid_wc wc;
    EXPECT(braid_cq_wait(e->cq, &wc, 1, WAIT_MS) == 1, "an error completion");
    EXPECT(wc.status != BRAID_WC_SUCCESS, "not a success");
}

static void device_args(void) {
    braid_device_config cfg;
    braid_device *dev = (braid_device *)0x1;
    EXPECT_RC(braid_device_config_init(NULL), BRAID_EFAULT);
    CHECK(braid_device_config_init(&cfg));
    EXPECT(cfg.struct_size == sizeof cfg, "struct_size set");
    EXPECT_RC(braid_device_open(NULL, &dev), BRAID_EFAULT);
    EXPECT(dev == NULL, "a failed open leaves NULL");
    EXPECT_RC(braid_device_open(&cfg, NULL), BRAID_EFAULT);
    EXPECT_RC(braid_device_open(&cfg, &dev), BRAID_EFAULT); /* bind is NULL */
    cfg.bind = "not an address";
    EXPECT_RC(braid_device_open(&cfg, &dev), BRAID_EINVAL);
    cfg.bind = "0.0.0.0:0";
    EXPECT_RC(braid_device_open(&cfg, &dev), BRAID_EINVAL);
    cfg.bind = "127.0.0.1:0";
    braid_device_config c = cfg;
    c.struct_size = sizeof c - 8;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.datapath = 42;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.backend = 42;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    EXPECT(cfg.backend == BRAID_BACKEND_SOFTWARE, "software is the default backend");
    /* No RDMA device on this host (or no verbs support in the library): a clean error. */
    if (getenv("BRAID_TEST_VERBS") == NULL) {
        c = cfg;
        c.backend = BRAID_BACKEND_VERBS;
        EXPECT_RC(braid_device_open(&c, &dev), BRAID_ENODEV);
        EXPECT(dev == NULL, "a failed verbs open leaves NULL");
        c.verbs_device = "no-such-rdma-device";
        EXPECT_RC(braid_device_open(&c, &dev), BRAID_ENODEV);
    }
    c = cfg;
    c.flags = 0x100;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.paths = 1000;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.paths = 8;
    c.ports = 4;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.max_datagram = 10;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.max_send_wr = 1u << 30;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    c = cfg;
    c.rto_min_ns = ~0ull;
    EXPECT_RC(braid_device_open(&c, &dev), BRAID_EINVAL);
    EXPECT(dev == NULL, "still NULL");
    /* Handles that are not devices. */
    braid_pd *pd = NULL;
    EXPECT_RC(braid_pd_alloc(NULL, &pd), BRAID_EFAULT);
    EXPECT_RC(braid_pd_alloc((braid_device *)0x1234, &pd), BRAID_EBADF);
    EXPECT_RC(braid_pd_alloc((braid_device *)(uintptr_t)0x1239, &pd), BRAID_EBADF);
    EXPECT_RC(braid_device_close(NULL), BRAID_EFAULT);
    EXPECT_RC(braid_device_close((braid_device *)0x77), BRAID_EBADF);
}

int main(void) {
    device_args();
    struct end a, b;
    make_end(&a);
    make_end(&b);

    /* Queries with NULL or wrong-sized outputs. */
    braid_device_attr attr = {.struct_size = sizeof attr};
    EXPECT_RC(braid_device_query(a.dev, NULL), BRAID_EFAULT);
    attr.struct_size = 3;
    EXPECT_RC(braid_device_query(a.dev, &attr), BRAID_EINVAL);
    attr.struct_size = sizeof attr;
    EXPECT_RC(braid_device_query(a.dev, &attr), BRAID_OK);
    EXPECT(strncmp(attr.local_addr, "127.0.0.1:", 10) == 0, "local address %s", attr.local_addr);
    EXPECT(attr.datapath == BRAID_DATAPATH_UDP && attr.paths == 4 && attr.max_sge == BRAID_MAX_SGE,
           "attributes");
    EXPECT(attr.backend == BRAID_BACKEND_SOFTWARE, "backend %u", attr.backend);
    /* A program built against a header without `backend` gets the fields it has, and
     * nothing is written past its struct. */
    braid_device_attr older = {.struct_size = offsetof(braid_device_attr, backend), .backend = 77};
    EXPECT_RC(braid_device_query(a.dev, &older), BRAID_OK);
    EXPECT(older.backend == 77 && older.max_sge == BRAID_MAX_SGE && older.paths == 4,
           "attributes of the older size");
    braid_device_stats ds = {.struct_size = sizeof ds + 1};
    EXPECT_RC(braid_device_query_stats(a.dev, &ds), BRAID_EINVAL);
    EXPECT_RC(braid_device_query_stats(NULL, &ds), BRAID_EFAULT);
    char small[4];
    int full = braid_device_report(a.dev, NULL, 0);
    EXPECT(full > 3, "a report length (%d)", full);
    EXPECT_RC(braid_device_report(a.dev, NULL, 10), BRAID_EFAULT);
    EXPECT_RC(braid_device_report(a.dev, small, sizeof small), full);
    EXPECT(small[3] == 0 && strlen(small) == 3, "truncated and terminated");
    EXPECT_RC(braid_device_report((braid_device *)a.pd, small, sizeof small), BRAID_EBADF);

    /* Memory regions. */
    braid_mr *mr = (braid_mr *)0x1;
    uint8_t local[64];
    EXPECT_RC(braid_mr_alloc(a.pd, 0, 0, &mr), BRAID_EINVAL);
    EXPECT(mr == NULL, "a failed alloc leaves NULL");
    EXPECT_RC(braid_mr_alloc(a.pd, (size_t)BRAID_MR_ALLOC_MAX + 1, 0, &mr), BRAID_EINVAL);
    EXPECT_RC(braid_mr_alloc(a.pd, 64, 0x10, &mr), BRAID_EINVAL);
    EXPECT_RC(braid_mr_alloc(a.pd, 64, 0, NULL), BRAID_EFAULT);
    EXPECT_RC(braid_mr_alloc(NULL, 64, 0, &mr), BRAID_EFAULT);
    EXPECT_RC(braid_mr_alloc((braid_pd *)a.dev, 64, 0, &mr), BRAID_EBADF);
    EXPECT_RC(braid_mr_register(a.pd, NULL, 64, 0, &mr), BRAID_EFAULT);
    EXPECT_RC(braid_mr_register(a.pd, local, 0, 0, &mr), BRAID_EINVAL);
    EXPECT_RC(braid_mr_register(a.pd, (void *)(uintptr_t)-16, 64, 0, &mr), BRAID_EINVAL);
    EXPECT_RC(braid_mr_read(a.mr, 4090, local, 8), BRAID_ERANGE);
    EXPECT_RC(braid_mr_read(a.mr, ~0ull, local, 8), BRAID_ERANGE);
    EXPECT_RC(braid_mr_read(a.mr, 0, NULL, 8), BRAID_EFAULT);
    EXPECT_RC(braid_mr_read(a.mr, 0, NULL, 0), BRAID_OK);
    EXPECT_RC(braid_mr_write(a.mr, 4096, local, 1), BRAID_ERANGE);
    EXPECT_RC(braid_mr_write(a.mr, 0, NULL, 1), BRAID_EFAULT);
    EXPECT_RC(braid_mr_query(a.mr, NULL), BRAID_EFAULT);
    EXPECT_RC(braid_mr_query((braid_mr *)a.cq, &a.mr_attr), BRAID_EBADF);

    /* Completion queues. */
    braid_wc wc[4];
    EXPECT_RC(braid_cq_poll(a.cq, NULL, 4), BRAID_EFAULT);
    EXPECT_RC(braid_cq_poll(a.cq, wc, 0), BRAID_EINVAL);
    EXPECT_RC(braid_cq_poll(a.cq, wc, 0x80000000u), BRAID_EINVAL);
    EXPECT_RC(braid_cq_poll(a.cq, wc, 4), 0);
    EXPECT_RC(braid_cq_wait(a.cq, wc, 4, 0), 0); /* nothing: times out at once */
    EXPECT_RC(braid_cq_poll((braid_cq *)a.qp, wc, 4), BRAID_EBADF);
    EXPECT_RC(braid_cq_fd(NULL), BRAID_EFAULT);
    EXPECT_RC(braid_cq_clear_fd((braid_cq *)0x5), BRAID_EBADF);
    braid_cq *cq = NULL;
    EXPECT_RC(braid_cq_create(a.dev, NULL), BRAID_EFAULT);
    EXPECT_RC(braid_cq_create((braid_device *)a.cq, &cq), BRAID_EBADF);

    /* Queue pairs: creation, information, connection. */
    braid_qp *qp = NULL;
    EXPECT_RC(braid_qp_create(a.pd, b.cq, a.cq, 0, &qp), BRAID_EACCES); /* another device */
    EXPECT_RC(braid_qp_create(a.pd, a.cq, a.cq, 0x8, &qp), BRAID_EINVAL);
    EXPECT_RC(braid_qp_create(a.pd, NULL, a.cq, 0, &qp), BRAID_EFAULT);
    EXPECT_RC(braid_qp_create(a.pd, a.cq, (braid_cq *)a.pd, 0, &qp), BRAID_EBADF);
    EXPECT(qp == NULL, "no QP");
    uint8_t info[BRAID_QP_INFO_SIZE + 8];
    EXPECT_RC(braid_qp_info(a.qp, info, BRAID_QP_INFO_SIZE - 1), BRAID_ENOSPC);
    EXPECT_RC(braid_qp_info(a.qp, NULL, sizeof info), BRAID_EFAULT);
    EXPECT_RC(braid_qp_info(b.qp, info, sizeof info), BRAID_QP_INFO_SIZE);
    EXPECT_RC(braid_qp_connect(a.qp, info, BRAID_QP_INFO_SIZE - 1), BRAID_EINVAL);
    EXPECT_RC(braid_qp_connect(a.qp, info, BRAID_QP_INFO_SIZE + 1), BRAID_EINVAL);
    EXPECT_RC(braid_qp_connect(a.qp, NULL, BRAID_QP_INFO_SIZE), BRAID_EFAULT);
    uint8_t bad[BRAID_QP_INFO_SIZE];
    memcpy(bad, info, sizeof bad);
    bad[0] ^= 1; /* magic */
    EXPECT_RC(braid_qp_connect(a.qp, bad, sizeof bad), BRAID_EPROTO);
    memcpy(bad, info, sizeof bad);
    bad[4] = 99; /* version */
    EXPECT_RC(braid_qp_connect(a.qp, bad, sizeof bad), BRAID_EPROTO);
    memset(bad, 0xa5, sizeof bad); /* garbage */
    EXPECT_RC(braid_qp_connect(a.qp, bad, sizeof bad), BRAID_EPROTO);

    /* Posting before connect. */
    braid_sge sge;
    braid_send_wr w = write_wr(&a, &b, &sge);
    EXPECT_RC(braid_post_send(a.qp, &w, 1, NULL), BRAID_ENOTCONN);
    join(&a, &b);
    EXPECT_RC(braid_qp_connect(a.qp, info, BRAID_QP_INFO_SIZE), BRAID_EBADFD); /* twice */
    uint32_t qpn = 0;
    EXPECT_RC(braid_qp_num(a.qp, &qpn), BRAID_OK);
    EXPECT_RC(braid_qp_num(a.qp, NULL), BRAID_EFAULT);
    braid_qp_stats qs = {.struct_size = 8};
    EXPECT_RC(braid_qp_query_stats(a.qp, &qs), BRAID_EINVAL);

    /* What the library checks itself: refused at once, the QP unharmed. */
    size_t bad_index = 99;
    EXPECT_RC(braid_post_send(a.qp, NULL, 1, &bad_index), BRAID_EFAULT);
    EXPECT_RC(braid_post_send(a.qp, NULL, 0, NULL), BRAID_OK); /* nothing to post */
    braid_send_wr x = w;
    x.opcode = 99;
    EXPECT_RC(braid_post_send(a.qp, &x, 1, &bad_index), BRAID_EINVAL);
    EXPECT(bad_index == 0, "bad_index %zu", bad_index);
    x = w;
    x.num_sge = BRAID_MAX_SGE + 1;
    EXPECT_RC(braid_post_send(a.qp, &x, 1, NULL), BRAID_EINVAL);
    x = w;
    x.sg_list = NULL;
    EXPECT_RC(braid_post_send(a.qp, &x, 1, NULL), BRAID_EFAULT);
    x = w;
    x.send_flags = 0x40;
    EXPECT_RC(braid_post_send(a.qp, &x, 1, NULL), BRAID_EINVAL);
    x = w;
    x.reserved = 1;
    EXPECT_RC(braid_post_send(a.qp, &x, 1, NULL), BRAID_EINVAL);
    braid_recv_wr r = {.wr_id = 5, .sg_list = NULL, .num_sge = 2};
    EXPECT_RC(braid_post_recv(a.qp, &r, 1, NULL), BRAID_EFAULT);
    r.num_sge = 0;
    r.reserved = 3;
    EXPECT_RC(braid_post_recv(a.qp, &r, 1, NULL), BRAID_EINVAL);
    EXPECT_RC(braid_post_recv(NULL, &r, 1, NULL), BRAID_EFAULT);

    /* A list whose second request is bad: the first is posted and completes. */
    braid_send_wr list[3] = {w, w, w};
    list[0].wr_id = 10;
    list[1].opcode = 1234;
    bad_index = 99;
    EXPECT_RC(braid_post_send(a.qp, list, 3, &bad_index), BRAID_EINVAL);
    EXPECT(bad_index == 1, "bad_index %zu", bad_index);
    EXPECT(braid_cq_wait(a.cq, wc, 4, WAIT_MS) == 1, "one completion");
    EXPECT(wc[0].wr_id == 10 && wc[0].status == BRAID_WC_SUCCESS, "the first one succeeded");
    EXPECT_RC(braid_cq_poll(a.cq, wc, 4), 0);

    /* What the engine judges: a fresh QP pair for each, as a refusal may fail the QP. */
    x = w;
    sge.lkey = 0xdeadbeef; /* no such local key */
    expect_refused(&a, &x, BRAID_ENOENT, BRAID_ENOENT);
    sge.lkey = a.mr_attr.lkey;
    fresh_qps(&a, &b);
    sge.offset = 4090; /* past the end of the local region */
    expect_refused(&a, &x, BRAID_ERANGE, BRAID_ERANGE);
    sge.offset = 0;
    fresh_qps(&a, &b);
    braid_sge eight = {.offset = 0, .length = 8, .lkey = a.mr_attr.lkey};
    braid_send_wr fa = {.wr_id = 3,
                        .opcode = BRAID_WR_ATOMIC_FETCH_AND_ADD,
                        .send_flags = BRAID_SEND_SIGNALED,
                        .sg_list = &eight,
                        .num_sge = 1,
                        .rkey = b.mr_attr.rkey,
                        .remote_offset = 4}; /* misaligned */
    expect_refused(&a, &fa, BRAID_EINVAL, BRAID_EINVAL);
    fresh_qps(&a, &b);
    eight.length = 4; /* atomics need 8 bytes */
    fa.remote_offset = 0;
    expect_refused(&a, &fa, BRAID_EINVAL, BRAID_EINVAL);
    fresh_qps(&a, &b);

    /* A bad remote key and a remote range past the end: error completions, in order, and
     * the request after them is flushed. */
    x = w;
    x.wr_id = 20;
    x.rkey = b.mr_attr.rkey ^ 0x5a5a5a5a;
    braid_send_wr after = w;
    after.wr_id = 21;
    CHECK(braid_post_send(a.qp, &x, 1, NULL));
    CHECK(braid_post_send(a.qp, &after, 1, NULL));
    EXPECT(braid_cq_wait(a.cq, wc, 1, WAIT_MS) == 1, "a completion for the bad rkey");
    EXPECT(wc[0].wr_id == 20 && wc[0].status == BRAID_WC_REM_ACCESS_ERR, "status %u",
           wc[0].status);
    EXPECT(braid_cq_wait(a.cq, wc, 1, WAIT_MS) == 1, "a completion after it");
    EXPECT(wc[0].wr_id == 21 && wc[0].status == BRAID_WC_WR_FLUSH_ERR, "status %u",
           wc[0].status);
    checks += 2;
    fresh_qps(&a, &b);
    x = w;
    x.wr_id = 30;
    x.remote_offset = 4090;
    CHECK(braid_post_send(a.qp, &x, 1, NULL));
    EXPECT(braid_cq_wait(a.cq, wc, 1, WAIT_MS) == 1, "a completion for the bad range");
    EXPECT(wc[0].wr_id == 30 && wc[0].status == BRAID_WC_REM_ACCESS_ERR, "status %u",
           wc[0].status);
    checks++;

    /* Destroying in the wrong order, double destroy, use after destroy. */
    EXPECT_RC(braid_device_close(a.dev), BRAID_EBUSY);
    EXPECT_RC(braid_pd_free(a.pd), BRAID_EBUSY);
    EXPECT_RC(braid_cq_destroy(a.cq), BRAID_EBUSY);
    EXPECT_RC(braid_qp_destroy(a.qp), BRAID_OK);
    EXPECT_RC(braid_qp_destroy(a.qp), BRAID_EBADF);
    EXPECT_RC(braid_qp_num(a.qp, &qpn), BRAID_EBADF);
    EXPECT_RC(braid_post_send(a.qp, &w, 1, NULL), BRAID_EBADF);
    EXPECT_RC(braid_pd_free(a.pd), BRAID_EBUSY); /* the region is still there */
    EXPECT_RC(braid_mr_destroy(a.mr), BRAID_OK);
    EXPECT_RC(braid_mr_destroy(a.mr), BRAID_EBADF);
    EXPECT_RC(braid_mr_read(a.mr, 0, local, 1), BRAID_EBADF);
    EXPECT_RC(braid_device_close(a.dev), BRAID_EBUSY);
    EXPECT_RC(braid_cq_destroy(a.cq), BRAID_OK);
    EXPECT_RC(braid_cq_destroy(a.cq), BRAID_EBADF);
    EXPECT_RC(braid_pd_free(a.pd), BRAID_OK);
    EXPECT_RC(braid_pd_free(a.pd), BRAID_EBADF);
    EXPECT_RC(braid_device_close(a.dev), BRAID_OK);
    EXPECT_RC(braid_device_close(a.dev), BRAID_EBADF);
    EXPECT_RC(braid_pd_alloc(a.dev, &a.pd), BRAID_EBADF);
    free_end(&b);

    EXPECT(strcmp(braid_strerror(12345), "unknown error code") == 0, "unknown code");
    EXPECT(strcmp(braid_strerror(BRAID_EBUSY), "unknown error code") != 0, "a known code");
    EXPECT(braid_version()[0] != 0, "a version");
    printf("bad_args: OK (%d checks)\n", checks);
    return 0;
}
