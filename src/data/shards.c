/* shards.c: reading token shards (uint16 or uint32 tokens) and ordering their rows (see
 * include/pt/data.h). */
#include "pt/data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int pt_cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A shard truncated under a running job. Shards are mapped, and a read of a page past the file's
 * new end raises SIGBUS, not an error a read could return. Every mapping is listed here (at
 * set-up; the steps only read); the handler, installed with the first mapping, finds the one the
 * faulting address lies in, writes one line naming the shard and exits with status 1 (nothing
 * else is safe in a signal handler; the job's last checkpoint is already whole). A SIGBUS
 * elsewhere gets the default action, as if no handler were there. */
#define PT_SHARD_MAPS_MAX 4096
static struct {
    const uint8_t *lo, *hi;
    const char *path;
} pt_shard_maps[PT_SHARD_MAPS_MAX];
static volatile sig_atomic_t pt_shard_n_maps;

static void pt_shard_write_err(const char *s) {
    ssize_t unused = write(STDERR_FILENO, s, strlen(s));
    (void)unused;
}

static void pt_shard_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    const uint8_t *at = si->si_addr;
    for (int i = 0; i < pt_shard_n_maps; i++) {
        if (!pt_shard_maps[i].lo || at < pt_shard_maps[i].lo || at >= pt_shard_maps[i].hi) continue;
        char off[24], *q = off + sizeof off;
        *--q = 0;
        size_t v = (size_t)(at - pt_shard_maps[i].lo);
        do *--q = (char)('0' + v % 10); while ((v /= 10) > 0);
        pt_shard_write_err("error: data: ");
        pt_shard_write_err(pt_shard_maps[i].path);
        pt_shard_write_err(": the shard was truncated while the run reads it (SIGBUS reading byte ");
        pt_shard_write_err(q);
        pt_shard_write_err("); a shard must not change under a running job\n");
        _exit(1);
    }
    signal(sig, SIG_DFL); /* not a shard: what SIGBUS does without us */
    raise(sig);
}

static void pt_shard_register(const uint8_t *base, size_t size, const char *path) {
    static int installed;
    if (!installed) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = pt_shard_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGBUS, &sa, NULL);
        installed = 1;
    }
    for (int i = 0; i < pt_shard_n_maps; i++)
        if (!pt_shard_maps[i].lo) { /* a slot freed by pt_data_close */
            pt_shard_maps[i].path = path, pt_shard_maps[i].hi = base + size;
            pt_shard_maps[i].lo = base;
            return;
        }
    if (pt_shard_n_maps == PT_SHARD_MAPS_MAX) return; /* beyond: the default SIGBUS */
    pt_shard_maps[pt_shard_n_maps].path = path, pt_shard_maps[pt_shard_n_maps].hi = base + size;
    pt_shard_maps[pt_shard_n_maps].lo = base;
    pt_shard_n_maps++;
}

static void pt_shard_unregister(const uint8_t *base) {
    for (int i = 0; i < pt_shard_n_maps; i++)
        if (pt_shard_maps[i].lo == base) pt_shard_maps[i].lo = NULL;
}

static pt_status pt_shard_map(pt_data *d, int i, int vocab_size) {
    const char *path = d->paths[i];
    int fd; /* a FIFO would block the open, a directory or device map nothing sensible */
    PT_TRY(pt_open_regular(path, "shard", &fd));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "%s: cannot stat shard", path);
    }
    size_t size = (size_t)st.st_size, hdr = PT_SHARD_HEADER_INTS * sizeof(int32_t);
    if (size < hdr) {
        close(fd);
        return pt_errorf(PT_ERR_FORMAT, "%s: %zu bytes, shorter than the %zu-byte shard header",
                         path, size, hdr);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return pt_errorf(PT_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    const int32_t *h = map;
    pt_status err = PT_OK;
    size_t width = h[0] == PT_SHARD32_MAGIC ? 4 : 2;
    int version = width == 4 ? PT_SHARD32_VERSION : PT_SHARD_VERSION;
    if (h[0] != PT_SHARD_MAGIC && h[0] != PT_SHARD32_MAGIC)
        err = pt_errorf(PT_ERR_FORMAT, "%s: bad magic %d (expected %d for uint16 or %d for uint32 "
                        "tokens: not a token shard)", path, h[0], PT_SHARD_MAGIC, PT_SHARD32_MAGIC);
    else if (h[1] != version)
        err = pt_errorf(PT_ERR_FORMAT, "%s: unsupported shard version %d (expected %d with magic %d)",
                        path, h[1], version, h[0]);
    else if (h[2] < 0 || (size_t)h[2] * width != size - hdr)
        err = pt_errorf(PT_ERR_FORMAT,
                        "%s: header says %d tokens of %zu bytes but the file holds %zu bytes of tokens",
                        path, h[2], width, size - hdr);
    else if (h[2] < d->T + 1)
        err = pt_errorf(PT_ERR_FORMAT, "%s: %d tokens, fewer than one row of seq_len+1 = %d", path,
                        h[2], d->T + 1);
    if (err == PT_OK && vocab_size > 0) {
        const uint8_t *tok = (const uint8_t *)map + hdr;
        for (int32_t k = 0; k < h[2]; k++) {
            uint32_t v = pt_shard_token(tok, width, (size_t)k);
            if (v >= (uint32_t)vocab_size) {
                err = pt_errorf(PT_ERR_FORMAT, "%s: token %u at position %d (byte offset %zu) is >= "
                                "vocab_size %d", path, v, k, hdr + (size_t)k * width, vocab_size);
                break;
            }
        }
    }
    if (err != PT_OK) {
        munmap(map, size);
        return err;
    }
    pt_shard_register(map, size, path);
    d->map_bytes[i] = size;
    d->n_tokens[i] = (size_t)h[2];
    d->tokens[i] = (const uint8_t *)map + hdr;
    d->token_bytes[i] = (int)width;
    return PT_OK;
}

pt_status pt_data_open(pt_data *d, const char *pattern, int T, int shuffle, uint64_t seed,
                       int vocab_size) {
    return pt_data_open_key(d, "data.train", pattern, T, shuffle, seed, vocab_size);
}

pt_status pt_data_open_key(pt_data *d, const char *key, const char *pattern, int T, int shuffle,
                           uint64_t seed, int vocab_size) {
    memset(d, 0, sizeof *d);
    d->T = T;
    d->shuffle = shuffle;
    d->seed = seed;
    d->perm_pass = -1;
    if (!pattern || !*pattern) return pt_errorf(PT_ERR_CONFIG, "%s is not set", key);
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc != 0 || g.gl_pathc == 0) {
        if (rc == 0) globfree(&g);
        char cwd[1024] = "";
        if (pattern[0] != '/' && !getcwd(cwd, sizeof cwd)) cwd[0] = 0;
        return pt_errorf(PT_ERR_IO, "%s: no file matches \"%s\"%s%s%s; give where the shards are "
                         "with --%s=GLOB", key, pattern, cwd[0] ? " from " : "", cwd,
                         cwd[0] ? ", the current directory" : "", key);
    }
    d->n_shards = (int)g.gl_pathc;
    d->paths = pt_calloc((size_t)d->n_shards, sizeof *d->paths);
    for (int i = 0; i < d->n_shards; i++) d->paths[i] = pt_strdup(g.gl_pathv[i]);
    globfree(&g);
    qsort(d->paths, (size_t)d->n_shards, sizeof *d->paths, pt_cmp_str);
    d->tokens = pt_calloc((size_t)d->n_shards, sizeof *d->tokens);
    d->n_tokens = pt_calloc((size_t)d->n_shards, sizeof *d->n_tokens);
    d->map_bytes = pt_calloc((size_t)d->n_shards, sizeof *d->map_bytes);
    d->token_bytes = pt_calloc((size_t)d->n_shards, sizeof *d->token_bytes);
    d->row_start = pt_calloc((size_t)d->n_shards + 1, sizeof *d->row_start);
    for (int i = 0; i < d->n_shards; i++) {
        pt_status st = pt_shard_map(d, i, vocab_size);
        if (st != PT_OK) {
            pt_data_close(d);
            return st;
        }
        d->row_start[i + 1] = d->row_start[i] + (int64_t)((d->n_tokens[i] - 1) / (size_t)T);
    }
    d->n_rows = d->row_start[d->n_shards];
    if (shuffle) d->perm = pt_malloc((size_t)d->n_rows * sizeof *d->perm);
    return PT_OK;
}

void pt_data_close(pt_data *d) {
    for (int i = 0; i < d->n_shards; i++) {
        if (d->tokens && d->tokens[i]) {
            const uint8_t *base = d->tokens[i] - PT_SHARD_HEADER_INTS * sizeof(int32_t);
            pt_shard_unregister(base);
            munmap((void *)base, d->map_bytes[i]);
        }
        if (d->paths) free(d->paths[i]);
    }
    free(d->paths);
    free(d->tokens);
    free(d->n_tokens);
    free(d->map_bytes);
    free(d->token_bytes);
    free(d->row_start);
    free(d->perm);
    memset(d, 0, sizeof *d);
}

/* Fisher-Yates with an RNG seeded by (seed, pass): the same permutation on every rank. */
static void pt_data_make_perm(pt_data *d, int64_t pass) {
    pt_rng r;
    pt_rng_seed(&r, d->seed ^ (0xD1B54A32D192ED03ull * (uint64_t)(pass + 1)));
    for (int64_t i = 0; i < d->n_rows; i++) d->perm[i] = i;
    for (int64_t i = d->n_rows - 1; i > 0; i--) {
        int64_t k = (int64_t)(pt_rng_next(&r) % (uint64_t)(i + 1));
        int64_t t = d->perm[i];
        d->perm[i] = d->perm[k];
        d->perm[k] = t;
    }
    d->perm_pass = pass;
}

int64_t pt_data_row(pt_data *d, int64_t step, int64_t j, int64_t G) {
    int64_t idx = step * G + j;
    int64_t pass = idx / d->n_rows, within = idx % d->n_rows;
    if (!d->shuffle) return within;
    if (d->perm_pass != pass) pt_data_make_perm(d, pass);
    return d->perm[within];
}

void pt_data_read_row(const pt_data *d, int64_t row, int32_t *inputs, int32_t *targets) {
    PT_ASSERT(row >= 0 && row < d->n_rows);
    int s = 0;
    while (row >= d->row_start[s + 1]) s++;
    size_t first = (size_t)(row - d->row_start[s]) * (size_t)d->T;
    const uint8_t *t = d->tokens[s];
    int w = d->token_bytes[s];
    for (int i = 0; i < d->T; i++) {
        inputs[i] = (int32_t)pt_shard_token(t, (size_t)w, first + (size_t)i);
        targets[i] = (int32_t)pt_shard_token(t, (size_t)w, first + (size_t)i + 1);
    }
}

void pt_data_batch(pt_data *d, int64_t step, int64_t G, int64_t j0, int count, int32_t *inputs,
                   int32_t *targets) {
    for (int b = 0; b < count; b++) {
        int64_t row = pt_data_row(d, step, j0 + b, G);
        pt_data_read_row(d, row, inputs + (size_t)b * d->T, targets + (size_t)b * d->T);
    }
}

static pt_status shard_write(const char *path, const void *tokens, size_t n, size_t width) {
    if (n > 0x7fffffff) return pt_errorf(PT_ERR_CONFIG, "%s: %zu tokens exceed a shard's limit", path, n);
    size_t hdr = PT_SHARD_HEADER_INTS * sizeof(int32_t);
    char *buf = pt_calloc(1, hdr + n * width);
    int32_t *h = (int32_t *)buf;
    h[0] = width == 4 ? PT_SHARD32_MAGIC : PT_SHARD_MAGIC;
    h[1] = width == 4 ? PT_SHARD32_VERSION : PT_SHARD_VERSION;
    h[2] = (int32_t)n;
    memcpy(buf + hdr, tokens, n * width);
    pt_status st = pt_write_file_atomic(path, buf, hdr + n * width);
    free(buf);
    return st;
}

pt_status pt_shard_write(const char *path, const uint16_t *tokens, size_t n) {
    return shard_write(path, tokens, n, 2);
}

pt_status pt_shard_write32(const char *path, const uint32_t *tokens, size_t n) {
    return shard_write(path, tokens, n, 4);
}
