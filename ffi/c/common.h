/*
 * Helpers shared by the C example programs: checks that exit with a message, device setup,
 * and the out-of-band exchange of connection information over a socket.
 */
#ifndef BRAID_EXAMPLE_COMMON_H
#define BRAID_EXAMPLE_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "braid.h"

/* Calls a braid function and exits with its error message if it fails. */
#define CHECK(call)                                                                     \
    do {                                                                                \
        int rc_ = (call);                                                               \
        if (rc_ < 0) {                                                                  \
            fprintf(stderr, "%s:%d: %s failed: %d (%s): %s\n", __FILE__, __LINE__, #call, \
                    rc_, braid_strerror(rc_), braid_last_error());                      \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* Exits with a message unless `cond` holds. */
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

/* How long a test waits for one completion before it calls the run failed. */
#define WAIT_MS 20000

/* Options of the two-process examples: `--datapath udp|uring|xdp|auto`, `--encrypted`. */
static uint32_t opt_datapath = BRAID_DATAPATH_UDP;
static uint32_t opt_qp_flags = 0;

static inline void parse_options(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--encrypted") == 0) {
            opt_qp_flags |= BRAID_QP_ENCRYPTED;
        } else if (strcmp(argv[i], "--datapath") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            opt_datapath = strcmp(d, "uring") == 0  ? BRAID_DATAPATH_URING
                           : strcmp(d, "xdp") == 0  ? BRAID_DATAPATH_XDP
                           : strcmp(d, "auto") == 0 ? BRAID_DATAPATH_AUTO
                                                    : BRAID_DATAPATH_UDP;
        } else {
            fprintf(stderr, "usage: %s [--datapath udp|uring|xdp|auto] [--encrypted]\n", argv[0]);
            exit(2);
        }
    }
}

/* Opens a device on the loopback address with 4 paths, over the chosen datapath. */
static inline braid_device *open_device(void) {
    braid_device_config cfg;
    CHECK(braid_device_config_init(&cfg));
    cfg.bind = "127.0.0.1:0";
    cfg.paths = 4;
    cfg.datapath = opt_datapath;
    braid_device *dev = NULL;
    CHECK(braid_device_open(&cfg, &dev));
    braid_device_attr attr = {.struct_size = sizeof attr};
    CHECK(braid_device_query(dev, &attr));
    EXPECT(opt_datapath == BRAID_DATAPATH_AUTO || attr.datapath == opt_datapath,
           "the datapath asked for (%u, not %u)", attr.datapath, opt_datapath);
    return dev;
}

/* Waits for one completion and checks that it succeeded. */
static inline braid_wc wait_ok(braid_cq *cq, const char *what) {
    braid_wc wc;
    memset(&wc, 0, sizeof wc);
    int n = braid_cq_wait(cq, &wc, 1, WAIT_MS);
    EXPECT(n == 1, "a completion for %s (got %d: %s)", what, n, braid_last_error());
    EXPECT(wc.status == BRAID_WC_SUCCESS, "%s succeeds (status %u, wr_id %llu)", what,
           wc.status, (unsigned long long)wc.wr_id);
    return wc;
}

/* The byte at `i` of message `seed`: every byte of every message differs from its
 * neighbours and from the same byte of other messages. */
static inline uint8_t pattern(uint64_t seed, size_t i) {
    uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull + (uint64_t)i * 0xbf58476d1ce4e5b9ull;
    return (uint8_t)(x >> 56 ^ x >> 29 ^ i);
}

static inline void fill(uint8_t *p, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = pattern(seed, i);
}

/* Checks every byte; returns on success, exits naming the first wrong byte otherwise. */
static inline void verify(const uint8_t *p, size_t n, uint64_t seed, const char *what) {
    for (size_t i = 0; i < n; i++) {
        EXPECT(p[i] == pattern(seed, i), "%s byte %zu of %zu is %u, not %u", what, i, n, p[i],
               pattern(seed, i));
    }
}

static inline void write_all(int fd, const void *buf, size_t n) {
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        EXPECT(w > 0, "write to the peer (%s)", strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

static inline void read_all(int fd, void *buf, size_t n) {
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        EXPECT(r > 0, "read from the peer (%s)", r == 0 ? "closed" : strerror(errno));
        p += r;
        n -= (size_t)r;
    }
}

/* What the two sides tell each other out of band. */
struct peer_msg {
    uint8_t info[BRAID_QP_INFO_SIZE];
    uint32_t rkey;
    uint32_t pad;
    uint64_t length;
};

/* Sends ours and receives theirs over `sock`. */
static inline struct peer_msg exchange(int sock, const struct peer_msg *mine) {
    struct peer_msg theirs;
    write_all(sock, mine, sizeof *mine);
    read_all(sock, &theirs, sizeof theirs);
    return theirs;
}

static inline double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

#endif
