/*
 * SEND/RECV exchange between two processes, with scatter/gather lists on both sides.
 *
 * The program forks: the parent is the client, the child the server; they exchange their
 * QP information blobs over a socketpair. The client SENDs messages of several sizes,
 * every other one with immediate data, each gathered from three separate pieces of its
 * region; the server receives each into three separate pieces of its own (posted before
 * connecting), checks the length, the immediate and every byte, and SENDs an answer of
 * another size back, which the client checks the same way.
 *
 *   gcc -std=gnu11 -I ffi/include -I ffi/c ffi/c/send_recv.c -L target/debug -lbraid \
 *       -Wl,-rpath,$PWD/target/debug -o send_recv && ./send_recv
 */
#include <sys/socket.h>
#include <sys/wait.h>

#include "common.h"

static const uint32_t sizes[] = {0, 1, 3, 100, 1471, 1472, 4096, 10000, 65536, 300000};
#define NSIZES (sizeof sizes / sizeof sizes[0])
#define ROUNDS 3
#define NMSG (NSIZES * ROUNDS)
/* Each receive gets a slot of SLOT bytes, scattered over three pieces; each send gathers
 * from a slot of its own after those. */
#define SLOT (320u * 1024)
#define REGION ((size_t)SLOT * NMSG * 2)

/* The answer to a message of `n` bytes. */
static uint32_t answer_len(uint32_t n) { return n / 2 + 5; }

/* The three pieces of a slot a message is scattered into (or gathered from): a short one,
 * one in the middle, the rest at the end, in that order. */
static void pieces(braid_sge out[3], uint32_t lkey, size_t slot, uint32_t len) {
    uint64_t base = (uint64_t)slot * SLOT;
    uint32_t a = len < 10 ? len : 10, b = (len - a) / 2, c = len - a - b;
    out[0] = (braid_sge){.offset = base + SLOT - 16, .length = a, .lkey = lkey};
    out[1] = (braid_sge){.offset = base + 4096, .length = b, .lkey = lkey};
    out[2] = (braid_sge){.offset = base + 4096 + b + 8, .length = c, .lkey = lkey};
}

/* A receive's pieces: the same layout, with room for the largest message (SLOT - 4200). */
static void recv_pieces(braid_sge out[3], uint32_t lkey, size_t slot) {
    uint64_t base = (uint64_t)slot * SLOT;
    out[0] = (braid_sge){.offset = base + SLOT - 16, .length = 10, .lkey = lkey};
    out[1] = (braid_sge){.offset = base + 4096, .length = 150000, .lkey = lkey};
    out[2] = (braid_sge){.offset = base + 4096 + 150000 + 8, .length = 160000, .lkey = lkey};
}

/* Reads a message scattered into slot `slot` as `pieces` lays out one of `len` bytes,
 * given that the receive's pieces fill in order. */
static void gather_received(braid_mr *mr, size_t slot, uint32_t len, uint8_t *out) {
    braid_sge r[3];
    recv_pieces(r, 0, slot);
    uint32_t done = 0;
    for (int i = 0; i < 3 && done < len; i++) {
        uint32_t n = len - done < r[i].length ? len - done : r[i].length;
        CHECK(braid_mr_read(mr, r[i].offset, out + done, n));
        done += n;
    }
}

struct side {
    braid_device *dev;
    braid_pd *pd;
    braid_cq *scq, *rcq;
    braid_qp *qp;
    braid_mr *mr;
    uint32_t lkey;
};

static void setup(struct side *s, int sock) {
    memset(s, 0, sizeof *s);
    s->dev = open_device();
    CHECK(braid_pd_alloc(s->dev, &s->pd));
    CHECK(braid_cq_create(s->dev, &s->scq));
    CHECK(braid_cq_create(s->dev, &s->rcq));
    CHECK(braid_qp_create(s->pd, s->scq, s->rcq, opt_qp_flags, &s->qp));
    CHECK(braid_mr_alloc(s->pd, REGION, BRAID_ACCESS_LOCAL_WRITE, &s->mr));
    braid_mr_attr a;
    CHECK(braid_mr_query(s->mr, &a));
    s->lkey = a.lkey;
    /* Every receive this side will need, before the peer can send. */
    braid_recv_wr wrs[NMSG];
    braid_sge sg[NMSG][3];
    for (size_t m = 0; m < NMSG; m++) {
        recv_pieces(sg[m], s->lkey, m);
        wrs[m] = (braid_recv_wr){.wr_id = 1000 + m, .sg_list = sg[m], .num_sge = 3};
    }
    size_t bad = 99;
    CHECK(braid_post_recv(s->qp, wrs, NMSG, &bad));
    struct peer_msg mine = {.length = REGION};
    EXPECT(braid_qp_info(s->qp, mine.info, sizeof mine.info) == BRAID_QP_INFO_SIZE, "info");
    struct peer_msg peer = exchange(sock, &mine);
    CHECK(braid_qp_connect(s->qp, peer.info, sizeof peer.info));
}

static void teardown(struct side *s) {
    CHECK(braid_qp_destroy(s->qp));
    CHECK(braid_mr_destroy(s->mr));
    CHECK(braid_cq_destroy(s->scq));
    CHECK(braid_cq_destroy(s->rcq));
    CHECK(braid_pd_free(s->pd));
    CHECK(braid_device_close(s->dev));
}

/* SENDs message `m` of `len` bytes with content `seed`, gathered from three pieces of send
 * slot `m` (written there first), with an immediate when `m` is odd. */
static void send_msg(struct side *s, size_t m, uint32_t len, uint64_t seed, uint8_t *tmp) {
    braid_sge g[3];
    pieces(g, s->lkey, NMSG + m, len);
    fill(tmp, len, seed);
    uint32_t done = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(braid_mr_write(s->mr, g[i].offset, tmp + done, g[i].length));
        done += g[i].length;
    }
    braid_send_wr wr = {.wr_id = m,
                        .opcode = m % 2 ? BRAID_WR_SEND_WITH_IMM : BRAID_WR_SEND,
                        .send_flags = BRAID_SEND_SIGNALED,
                        .sg_list = g,
                        .num_sge = 3,
                        .imm_data = (uint32_t)m * 7 + 1};
    CHECK(braid_post_send(s->qp, &wr, 1, NULL));
    braid_wc wc = wait_ok(s->scq, "a SEND");
    EXPECT(wc.opcode == BRAID_WC_SEND && wc.wr_id == m, "the SEND's completion");
}

/* Waits for receive `m` and checks its length, immediate and every byte. */
static void recv_msg(struct side *s, size_t m, uint32_t len, uint64_t seed, uint8_t *tmp) {
    braid_wc wc = wait_ok(s->rcq, "a receive");
    EXPECT(wc.opcode == BRAID_WC_RECV, "opcode %u", wc.opcode);
    EXPECT(wc.wr_id == 1000 + m, "receives complete in order (wr_id %llu, not %zu)",
           (unsigned long long)wc.wr_id, 1000 + m);
    EXPECT(wc.byte_len == len, "byte_len %u, not %u", wc.byte_len, len);
    if (m % 2) {
        EXPECT(wc.wc_flags & BRAID_WC_WITH_IMM, "an immediate");
        EXPECT(wc.imm_data == (uint32_t)m * 7 + 1, "immediate %u", wc.imm_data);
    } else {
        EXPECT(!(wc.wc_flags & BRAID_WC_WITH_IMM), "no immediate");
    }
    gather_received(s->mr, m, len, tmp);
    verify(tmp, len, seed, "received message");
}

static int server(int sock) {
    struct side s;
    setup(&s, sock);
    uint8_t *tmp = malloc(SLOT);
    EXPECT(tmp, "memory");
    for (size_t m = 0; m < NMSG; m++) {
        uint32_t len = sizes[m % NSIZES];
        recv_msg(&s, m, len, 2 * m, tmp);
        send_msg(&s, m, answer_len(len), 2 * m + 1, tmp);
    }
    free(tmp);
    teardown(&s);
    printf("send_recv: server OK\n");
    return 0;
}

static int client(int sock) {
    struct side s;
    setup(&s, sock);
    uint8_t *tmp = malloc(SLOT);
    EXPECT(tmp, "memory");
    uint64_t bytes = 0;
    for (size_t m = 0; m < NMSG; m++) {
        uint32_t len = sizes[m % NSIZES];
        send_msg(&s, m, len, 2 * m, tmp);
        recv_msg(&s, m, answer_len(len), 2 * m + 1, tmp);
        bytes += len + answer_len(len);
    }
    free(tmp);
    teardown(&s);
    printf("send_recv: client OK (%zu exchanges, %llu bytes checked)\n", (size_t)NMSG,
           (unsigned long long)bytes);
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
    printf("send_recv: OK\n");
    return rc;
}
