/*
 * Threads sharing objects: four threads post WRITEs on one QP at once while another waits on
 * the CQ, and every work request completes exactly once; a region destroyed while other
 * threads keep using its handle gives them BRAID_EBADF from then on, never a crash.
 * One process, two devices on the loopback address.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "common.h"

#define POSTERS 4
#define PER_THREAD 500
#define MSG 8

struct shared {
    braid_qp *qp;
    braid_cq *cq;
    uint32_t lkey, rkey;
    braid_mr *victim;
    atomic_int stop;
};

struct poster {
    struct shared *s;
    uint32_t id;
};

static void *post_writes(void *arg) {
    struct poster *p = arg;
    for (uint32_t i = 0; i < PER_THREAD; i++) {
        braid_sge sge = {.offset = (uint64_t)p->id * MSG, .length = MSG, .lkey = p->s->lkey};
        braid_send_wr wr = {.wr_id = (uint64_t)p->id * PER_THREAD + i,
                            .opcode = BRAID_WR_RDMA_WRITE,
                            .send_flags = BRAID_SEND_SIGNALED,
                            .sg_list = &sge,
                            .num_sge = 1,
                            .rkey = p->s->rkey,
                            .remote_offset = (uint64_t)p->id * MSG};
        int rc;
        /* A full send queue is not an error here: wait for the poller to drain it. */
        while ((rc = braid_post_send(p->s->qp, &wr, 1, NULL)) == BRAID_EAGAIN) usleep(100);
        CHECK(rc);
    }
    return NULL;
}

/* Reads the victim region until told to stop: each call succeeds, or fails with EBADF once
 * the region is destroyed. Returns how many failed. */
static void *read_victim(void *arg) {
    struct shared *s = arg;
    uintptr_t bad = 0;
    uint8_t b[16];
    while (!atomic_load(&s->stop)) {
        int rc = braid_mr_read(s->victim, 0, b, sizeof b);
        braid_mr_attr a;
        int rq = braid_mr_query(s->victim, &a);
        EXPECT(rc == 0 || rc == BRAID_EBADF, "read: %d", rc);
        EXPECT(rq == 0 || rq == BRAID_EBADF, "query: %d", rq);
        if (rc == BRAID_EBADF) bad++;
    }
    return (void *)bad;
}

int main(void) {
    braid_device *da = open_device(), *db = open_device();
    braid_pd *pa, *pb;
    braid_cq *ca, *cb;
    braid_qp *qa, *qb;
    braid_mr *src, *dst;
    CHECK(braid_pd_alloc(da, &pa));
    CHECK(braid_pd_alloc(db, &pb));
    CHECK(braid_cq_create(da, &ca));
    CHECK(braid_cq_create(db, &cb));
    CHECK(braid_qp_create(pa, ca, ca, 0, &qa));
    CHECK(braid_qp_create(pb, cb, cb, 0, &qb));
    CHECK(braid_mr_alloc(pa, 4096, 0, &src));
    CHECK(braid_mr_alloc(pb, 4096, BRAID_ACCESS_REMOTE_WRITE, &dst));
    braid_mr_attr sa, dattr;
    CHECK(braid_mr_query(src, &sa));
    CHECK(braid_mr_query(dst, &dattr));
    uint8_t ia[BRAID_QP_INFO_SIZE], ib[BRAID_QP_INFO_SIZE];
    CHECK(braid_qp_info(qa, ia, sizeof ia));
    CHECK(braid_qp_info(qb, ib, sizeof ib));
    CHECK(braid_qp_connect(qa, ib, sizeof ib));
    CHECK(braid_qp_connect(qb, ia, sizeof ia));
    uint8_t msg[POSTERS * MSG];
    fill(msg, sizeof msg, 99);
    CHECK(braid_mr_write(src, 0, msg, sizeof msg));

    struct shared s = {.qp = qa, .cq = ca, .lkey = sa.lkey, .rkey = dattr.rkey};
    CHECK(braid_mr_alloc(pa, 64, 0, &s.victim));
    pthread_t readers[2], posters[POSTERS];
    struct poster ps[POSTERS];
    for (int i = 0; i < 2; i++) EXPECT(pthread_create(&readers[i], NULL, read_victim, &s) == 0, "thread");
    for (uint32_t i = 0; i < POSTERS; i++) {
        ps[i] = (struct poster){.s = &s, .id = i};
        EXPECT(pthread_create(&posters[i], NULL, post_writes, &ps[i]) == 0, "thread");
    }
    /* Destroy the victim while the readers hammer it. */
    usleep(2000);
    CHECK(braid_mr_destroy(s.victim));
    EXPECT(braid_mr_destroy(s.victim) == BRAID_EBADF, "a second destroy fails");
    uint8_t one;
    EXPECT(braid_mr_read(s.victim, 0, &one, 1) == BRAID_EBADF, "a read after the destroy fails");

    static uint8_t seen[POSTERS * PER_THREAD];
    for (int got = 0; got < POSTERS * PER_THREAD;) {
        braid_wc wc[16];
        int n = braid_cq_wait(ca, wc, 16, WAIT_MS);
        EXPECT(n > 0, "completions keep coming (%d of %d)", got, POSTERS * PER_THREAD);
        for (int j = 0; j < n; j++) {
            EXPECT(wc[j].status == BRAID_WC_SUCCESS, "status %u", wc[j].status);
            EXPECT(wc[j].wr_id < POSTERS * PER_THREAD && !seen[wc[j].wr_id], "wr_id %llu once",
                   (unsigned long long)wc[j].wr_id);
            seen[wc[j].wr_id] = 1;
        }
        got += n;
    }
    for (int i = 0; i < POSTERS; i++) pthread_join(posters[i], NULL);
    atomic_store(&s.stop, 1);
    uintptr_t bad = 0;
    for (int i = 0; i < 2; i++) {
        void *r;
        pthread_join(readers[i], &r);
        bad += (uintptr_t)r;
    }
    braid_wc extra;
    EXPECT(braid_cq_poll(ca, &extra, 1) == 0, "no completion beyond the posted ones");
    uint8_t got[POSTERS * MSG];
    CHECK(braid_mr_read(dst, 0, got, sizeof got));
    verify(got, sizeof got, 99, "written bytes");

    CHECK(braid_qp_destroy(qa));
    CHECK(braid_qp_destroy(qb));
    CHECK(braid_mr_destroy(src));
    CHECK(braid_mr_destroy(dst));
    CHECK(braid_cq_destroy(ca));
    CHECK(braid_cq_destroy(cb));
    CHECK(braid_pd_free(pa));
    CHECK(braid_pd_free(pb));
    CHECK(braid_device_close(da));
    CHECK(braid_device_close(db));
    printf("threads: OK (%d completions, %lu failed reads after the destroy)\n",
           POSTERS * PER_THREAD, (unsigned long)bad);
    return 0;
}
