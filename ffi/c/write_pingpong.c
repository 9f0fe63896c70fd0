/*
 * RDMA WRITE ping-pong between two processes, then READ and atomics on the peer's memory.
 *
 * The program forks: the parent is the client, the child the server; they exchange their
 * QP information blobs and rkeys over a socketpair. For each size the client WRITEs a
 * message with immediate into the server's region, the server checks every byte and WRITEs
 * a different message back. The client registers its own memory (braid_mr_register); the
 * server lets the library allocate its regions (braid_mr_alloc) and uses braid_mr_read and
 * braid_mr_write. Afterwards the client READs the server's region back with a two-entry
 * scatter list and runs fetch-and-add and compare-and-swap on a word the server checks.
 *
 *   gcc -std=gnu11 -I ffi/include -I ffi/c ffi/c/write_pingpong.c -L target/debug -lbraid \
 *       -Wl,-rpath,$PWD/target/debug -o write_pingpong && ./write_pingpong
 */
#include <sys/socket.h>
#include <sys/wait.h>

#include "common.h"

#define MAX_MSG (1u << 20)
/* The atomic word lives after the message area. */
#define ATOMIC_OFF ((uint64_t)MAX_MSG)
#define REGION (MAX_MSG + 64)
#define ATOMIC_START 1000ull

static const size_t sizes[] = {1, 7, 8, 63, 64, 1000, 4096, 65536, 1u << 20};
#define NSIZES (sizeof sizes / sizeof sizes[0])

static int iters(size_t size) { return size >= 65536 ? 3 : 10; }

struct side {
    braid_device *dev;
    braid_pd *pd;
    braid_cq *scq, *rcq;
    braid_qp *qp;
    braid_mr *buf, *src; /* buf: peers write here; src: what this side sends */
    braid_mr_attr buf_attr, src_attr;
    uint8_t *buf_mem, *src_mem; /* the client's own memory; NULL on the server */
};

static void post_notify_recv(braid_qp *qp, uint64_t wr_id) {
    /* A WRITE with immediate consumes a receive; it places no bytes there. */
    braid_recv_wr r = {.wr_id = wr_id, .sg_list = NULL, .num_sge = 0};
    CHECK(braid_post_recv(qp, &r, 1, NULL));
}

static void write_imm(struct side *s, const struct peer_msg *peer, size_t len, uint32_t imm) {
    braid_sge sge = {.offset = 0, .length = (uint32_t)len, .lkey = s->src_attr.lkey};
    braid_send_wr wr = {.wr_id = imm,
                        .opcode = BRAID_WR_RDMA_WRITE_WITH_IMM,
                        .send_flags = BRAID_SEND_SIGNALED,
                        .sg_list = &sge,
                        .num_sge = 1,
                        .imm_data = imm,
                        .rkey = peer->rkey,
                        .remote_offset = 0};
    CHECK(braid_post_send(s->qp, &wr, 1, NULL));
}

static void wait_notify(struct side *s, size_t len, uint32_t imm) {
    braid_wc wc = wait_ok(s->rcq, "the peer's WRITE with immediate");
    EXPECT(wc.opcode == BRAID_WC_RECV_RDMA_WITH_IMM, "opcode %u", wc.opcode);
    EXPECT(wc.wc_flags & BRAID_WC_WITH_IMM, "the immediate flag");
    EXPECT(wc.imm_data == imm, "immediate %u, not %u", wc.imm_data, imm);
    EXPECT(wc.byte_len == len, "byte_len %u, not %zu", wc.byte_len, len);
}

static void wait_sent(struct side *s, uint32_t imm) {
    braid_wc wc = wait_ok(s->scq, "our WRITE with immediate");
    EXPECT(wc.opcode == BRAID_WC_RDMA_WRITE, "opcode %u", wc.opcode);
    EXPECT(wc.wr_id == imm, "wr_id %llu, not %u", (unsigned long long)wc.wr_id, imm);
}

static void setup(struct side *s, int client) {
    memset(s, 0, sizeof *s);
    s->dev = open_device();
    CHECK(braid_pd_alloc(s->dev, &s->pd));
    CHECK(braid_cq_create(s->dev, &s->scq));
    CHECK(braid_cq_create(s->dev, &s->rcq));
    CHECK(braid_qp_create(s->pd, s->scq, s->rcq, opt_qp_flags, &s->qp));
    uint32_t remote = BRAID_ACCESS_LOCAL_WRITE | BRAID_ACCESS_REMOTE_WRITE |
                      BRAID_ACCESS_REMOTE_READ | BRAID_ACCESS_REMOTE_ATOMIC;
    if (client) {
        /* aligned_alloc wants a size that is a multiple of the alignment. */
        size_t alloc = (REGION + 4095) & ~(size_t)4095;
        s->buf_mem = aligned_alloc(4096, alloc);
        s->src_mem = aligned_alloc(4096, alloc);
        EXPECT(s->buf_mem && s->src_mem, "memory");
        memset(s->buf_mem, 0, REGION);
        memset(s->src_mem, 0, REGION);
        CHECK(braid_mr_register(s->pd, s->buf_mem, REGION, remote, &s->buf));
        CHECK(braid_mr_register(s->pd, s->src_mem, REGION, BRAID_ACCESS_LOCAL_WRITE, &s->src));
    } else {
        CHECK(braid_mr_alloc(s->pd, REGION, remote, &s->buf));
        CHECK(braid_mr_alloc(s->pd, REGION, BRAID_ACCESS_LOCAL_WRITE, &s->src));
        uint64_t start = ATOMIC_START;
        CHECK(braid_mr_write(s->buf, ATOMIC_OFF, &start, sizeof start));
    }
    CHECK(braid_mr_query(s->buf, &s->buf_attr));
    CHECK(braid_mr_query(s->src, &s->src_attr));
    EXPECT(s->buf_attr.length == REGION, "region length %llu",
           (unsigned long long)s->buf_attr.length);
    EXPECT(s->buf_attr.library_owned == (client ? 0u : 1u), "ownership");
}

static struct peer_msg connect_peer(struct side *s, int sock) {
    struct peer_msg mine = {.rkey = s->buf_attr.rkey, .length = REGION};
    int n = braid_qp_info(s->qp, mine.info, sizeof mine.info);
    EXPECT(n == BRAID_QP_INFO_SIZE, "braid_qp_info returns %d", n);
    struct peer_msg peer = exchange(sock, &mine);
    EXPECT(peer.length == REGION, "the peer's region length");
    CHECK(braid_qp_connect(s->qp, peer.info, sizeof peer.info));
    return peer;
}

static void teardown(struct side *s) {
    braid_qp_stats qs = {.struct_size = sizeof qs};
    CHECK(braid_qp_query_stats(s->qp, &qs));
    EXPECT(qs.state == BRAID_QPS_CONNECTED, "a connected QP (state %u)", qs.state);
    EXPECT(qs.packets_sent > 0, "packets sent");
    braid_device_stats ds = {.struct_size = sizeof ds};
    CHECK(braid_device_query_stats(s->dev, &ds));
    EXPECT(ds.tx_datagrams > 0 && ds.rx_datagrams > 0, "traffic counted");
    CHECK(braid_qp_destroy(s->qp));
    CHECK(braid_mr_destroy(s->buf));
    CHECK(braid_mr_destroy(s->src));
    CHECK(braid_cq_destroy(s->scq));
    CHECK(braid_cq_destroy(s->rcq));
    CHECK(braid_pd_free(s->pd));
    CHECK(braid_device_close(s->dev));
    free(s->buf_mem); /* after every work request on it completed and it was deregistered */
    free(s->src_mem);
}

static int server(int sock) {
    struct side s;
    setup(&s, 0);
    post_notify_recv(s.qp, 0);
    struct peer_msg peer = connect_peer(&s, sock);
    uint8_t *tmp = malloc(MAX_MSG);
    EXPECT(tmp, "memory");
    for (uint32_t k = 0; k < NSIZES; k++) {
        for (int i = 0; i < iters(sizes[k]); i++) {
            uint32_t tag = k << 16 | (uint32_t)i;
            wait_notify(&s, sizes[k], tag);
            post_notify_recv(s.qp, tag + 1);
            CHECK(braid_mr_read(s.buf, 0, tmp, sizes[k]));
            verify(tmp, sizes[k], 2ull * tag, "ping");
            fill(tmp, sizes[k], 2ull * tag + 1);
            CHECK(braid_mr_write(s.src, 0, tmp, sizes[k]));
            write_imm(&s, &peer, sizes[k], tag);
            wait_sent(&s, tag);
        }
    }
    /* The client READs and runs atomics now; it reports the value it expects. */
    uint64_t expected = 0, word = 0;
    read_all(sock, &expected, sizeof expected);
    CHECK(braid_mr_read(s.buf, ATOMIC_OFF, &word, sizeof word));
    EXPECT(word == expected, "the atomic word is %llu, not %llu", (unsigned long long)word,
           (unsigned long long)expected);
    write_all(sock, &word, sizeof word);
    free(tmp);
    teardown(&s);
    printf("write_pingpong: server OK\n");
    return 0;
}

static void atomic(struct side *s, const struct peer_msg *peer, uint32_t opcode, uint64_t a,
                   uint64_t b, uint64_t expect_old) {
    braid_sge sge = {.offset = 0, .length = 8, .lkey = s->src_attr.lkey};
    braid_send_wr wr = {.wr_id = 900 + opcode,
                        .opcode = opcode,
                        .send_flags = BRAID_SEND_SIGNALED,
                        .sg_list = &sge,
                        .num_sge = 1,
                        .rkey = peer->rkey,
                        .remote_offset = ATOMIC_OFF,
                        .compare_add = a,
                        .swap = b};
    CHECK(braid_post_send(s->qp, &wr, 1, NULL));
    braid_wc wc = wait_ok(s->scq, "an atomic");
    EXPECT(wc.opcode == (opcode == BRAID_WR_ATOMIC_FETCH_AND_ADD ? BRAID_WC_FETCH_ADD
                                                                  : BRAID_WC_COMP_SWAP),
           "opcode %u", wc.opcode);
    EXPECT(wc.byte_len == 8, "byte_len %u", wc.byte_len);
    uint64_t old;
    memcpy(&old, s->src_mem, sizeof old); /* placed before the completion was polled */
    EXPECT(old == expect_old, "old value %llu, not %llu", (unsigned long long)old,
           (unsigned long long)expect_old);
}

static int client(int sock) {
    struct side s;
    setup(&s, 1);
    post_notify_recv(s.qp, 0);
    struct peer_msg peer = connect_peer(&s, sock);
    for (uint32_t k = 0; k < NSIZES; k++) {
        double t0 = now_us();
        for (int i = 0; i < iters(sizes[k]); i++) {
            uint32_t tag = k << 16 | (uint32_t)i;
            fill(s.src_mem, sizes[k], 2ull * tag); /* no WRITE is gathering it now */
            write_imm(&s, &peer, sizes[k], tag);
            wait_sent(&s, tag);
            wait_notify(&s, sizes[k], tag);
            post_notify_recv(s.qp, tag + 1);
            verify(s.buf_mem, sizes[k], 2ull * tag + 1, "pong");
        }
        printf("write_pingpong: %7zu B  %9.1f us per round trip\n", sizes[k],
               (now_us() - t0) / iters(sizes[k]));
    }
    /* READ the server's region back (it holds the last ping) into two scatter entries. */
    size_t last = sizes[NSIZES - 1];
    uint32_t last_tag = (uint32_t)(NSIZES - 1) << 16 | (uint32_t)(iters(last) - 1);
    memset(s.buf_mem, 0, last);
    braid_sge two[2] = {{.offset = 0, .length = 1000, .lkey = s.buf_attr.lkey},
                        {.offset = 1000, .length = (uint32_t)last - 1000, .lkey = s.buf_attr.lkey}};
    braid_send_wr rd = {.wr_id = 77,
                        .opcode = BRAID_WR_RDMA_READ,
                        .send_flags = BRAID_SEND_SIGNALED,
                        .sg_list = two,
                        .num_sge = 2,
                        .rkey = peer.rkey,
                        .remote_offset = 0};
    CHECK(braid_post_send(s.qp, &rd, 1, NULL));
    braid_wc wc = wait_ok(s.scq, "the READ");
    EXPECT(wc.opcode == BRAID_WC_RDMA_READ && wc.wr_id == 77, "the READ's completion");
    EXPECT(wc.byte_len == last, "byte_len %u", wc.byte_len);
    verify(s.buf_mem, last, 2ull * last_tag, "READ");
    /* Atomics on the server's word, which starts at ATOMIC_START. */
    atomic(&s, &peer, BRAID_WR_ATOMIC_FETCH_AND_ADD, 5, 0, ATOMIC_START);
    atomic(&s, &peer, BRAID_WR_ATOMIC_CMP_AND_SWP, ATOMIC_START + 5, 77, ATOMIC_START + 5);
    atomic(&s, &peer, BRAID_WR_ATOMIC_CMP_AND_SWP, 1, 2, 77); /* fails: stays 77 */
    uint64_t expected = 77, seen = 0;
    write_all(sock, &expected, sizeof expected);
    read_all(sock, &seen, sizeof seen);
    EXPECT(seen == expected, "the server saw %llu", (unsigned long long)seen);
    teardown(&s);
    printf("write_pingpong: client OK\n");
    return 0;
}

int main(int argc, char **argv) {
    parse_options(argc, argv);
    int sv[2];
    EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair (%s)", strerror(errno));
    fflush(stdout);
    pid_t pid = fork();
    EXPECT(pid >= 0, "fork (%s)", strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        exit(server(sv[1]));
    }
    close(sv[1]);
    int rc = client(sv[0]);
    int status = 0;
    EXPECT(waitpid(pid, &status, 0) == pid, "waitpid");
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the server exits cleanly (%d)", status);
    printf("write_pingpong: OK\n");
    return rc;
}
