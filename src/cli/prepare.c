/* prepare.c: `pentatron prepare`, text files -> GPT-2 token shards in llm.c's format.
 *
 * Each input file is one document: <|endoftext|> followed by the file's tokens. The token stream
 * is cut into shards of exactly --shard-tokens tokens (the last one holds the rest; documents may
 * span two shards, as in llm.c's fineweb.py), written as OUT/train_000000.bin, train_000001.bin, ...
 * A shard is a header of 256 int32 (magic 20240520, version 1, token count, zeros) followed by the
 * tokens as uint16, little-endian as the machine writes them; each is written atomically.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/core.h"
#include "pt/tokenizer.h"

enum {
    PT_SHARD_MAGIC = 20240520,
    PT_SHARD_VERSION = 1,
    PT_SHARD_HEADER_INTS = 256,
};

static void prepare_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron prepare --vocab DIR --out DIR [--shard-tokens N] FILE...\n"
            "\n"
            "Tokenizes each FILE (one document, UTF-8 text) with the GPT-2 BPE and writes token\n"
            "shards in llm.c's format: OUT/train_000000.bin, train_000001.bin, ...\n"
            "Every document is preceded by <|endoftext|>.\n"
            "\n"
            "  --vocab DIR         directory holding encoder.json and vocab.bpe\n"
            "  --out DIR           output directory (created if missing)\n"
            "  --shard-tokens N    tokens per shard (default 100000000)\n"
            "  --help              print this help\n");
}

typedef struct {
    uint8_t *buf; /* header (256 int32) then uint16 tokens */
    size_t n, cap, max;
    int index;
    const char *dir;
} prepare_shard;

static uint16_t *shard_tokens(prepare_shard *s) {
    return (uint16_t *)(s->buf + PT_SHARD_HEADER_INTS * sizeof(int32_t));
}

static pt_status shard_flush(prepare_shard *s) {
    int32_t header[PT_SHARD_HEADER_INTS] = {PT_SHARD_MAGIC, PT_SHARD_VERSION, (int32_t)s->n};
    memcpy(s->buf, header, sizeof header);
    char path[4096];
    snprintf(path, sizeof path, "%s/train_%06d.bin", s->dir, s->index);
    PT_TRY(pt_write_file_atomic(path, s->buf, sizeof header + s->n * sizeof(uint16_t)));
    pt_log_info("prepare: wrote %s (%zu tokens)", path, s->n);
    s->index++;
    s->n = 0;
    return PT_OK;
}

/* Appends tokens, writing every shard that fills up. */
static pt_status shard_add(prepare_shard *s, const int32_t *tok, size_t n) {
    while (n > 0) {
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 1 << 16;
            if (cap > s->max) cap = s->max;
            uint8_t *b = realloc(s->buf, PT_SHARD_HEADER_INTS * sizeof(int32_t) + cap * sizeof(uint16_t));
            if (!b) return pt_errorf(PT_ERR_MEMORY, "out of memory for a shard of %zu tokens", cap);
            s->buf = b;
            s->cap = cap;
        }
        size_t k = s->cap - s->n < n ? s->cap - s->n : n;
        uint16_t *dst = shard_tokens(s) + s->n;
        for (size_t i = 0; i < k; i++) dst[i] = (uint16_t)tok[i];
        s->n += k;
        tok += k;
        n -= k;
        if (s->n == s->max) PT_TRY(shard_flush(s));
    }
    return PT_OK;
}

/* Options and files; returns 0 to go on, else the exit code (after printing the problem). */
static int prepare_args(int argc, char **argv, const char **vocab, const char **out,
                        long long *shard_max, const char ***files, int *nfiles) {
    *files = pt_calloc((size_t)argc + 1, sizeof **files);
    int only_files = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == 0) {
            (*files)[(*nfiles)++] = a;
            continue;
        }
        if (strcmp(a, "--") == 0) {
            only_files = 1;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            prepare_usage(stdout);
            return -1;
        }
        const char *names[] = {"--vocab", "--out", "--shard-tokens"};
        const char *val = NULL;
        int which = -1;
        for (int k = 0; k < 3; k++) {
            size_t l = strlen(names[k]);
            if (strncmp(a, names[k], l) == 0 && (a[l] == 0 || a[l] == '=')) {
                which = k;
                if (a[l] == '=')
                    val = a + l + 1;
                else if (i + 1 < argc)
                    val = argv[++i];
            }
        }
        if (which < 0) {
            pt_log_error("prepare: unknown option '%s' (see pentatron prepare --help)", a);
            return 2;
        }
        if (!val || !*val) {
            pt_log_error("prepare: option %s needs a value", names[which]);
            return 2;
        }
        if (which == 0) *vocab = val;
        if (which == 1) *out = val;
        if (which == 2) {
            char *end;
            errno = 0;
            long long v = strtoll(val, &end, 10);
            if (errno || *end || v < 1 || v > INT32_MAX) {
                pt_log_error("prepare: --shard-tokens '%s': expected an integer in [1, %d]", val,
                             INT32_MAX);
                return 2;
            }
            *shard_max = v;
        }
    }
    if (!*vocab) {
        pt_log_error("prepare: --vocab DIR is required (the directory of encoder.json and vocab.bpe)");
        return 2;
    }
    if (!*out) {
        pt_log_error("prepare: --out DIR is required");
        return 2;
    }
    if (*nfiles == 0) {
        pt_log_error("prepare: no input files (usage: pentatron prepare --vocab DIR --out DIR FILE...)");
        return 2;
    }
    return 0;
}

/* argv holds what follows `pentatron prepare`: options and files. */
int pt_cmd_prepare(int argc, char **argv) {
    const char *vocab = NULL, *out = NULL;
    long long shard_max = 100000000;
    const char **files = NULL;
    int nfiles = 0;
    int rc = prepare_args(argc, argv, &vocab, &out, &shard_max, &files, &nfiles);
    if (rc != 0) {
        free(files);
        return rc < 0 ? 0 : rc;
    }

    /* Check every input before writing anything. */
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0 || access(files[i], R_OK) != 0) {
            pt_log_error("prepare: %s: cannot read input file: %s", files[i], strerror(errno));
            free(files);
            return 1;
        }
        if (!S_ISREG(st.st_mode)) {
            pt_log_error("prepare: %s: input is not a regular file", files[i]);
            free(files);
            return 1;
        }
    }

    pt_tokenizer *tok = NULL;
    pt_status status = pt_tokenizer_load(&tok, vocab);
    if (status != PT_OK) {
        pt_log_error("prepare: --vocab %s: %s", vocab, pt_last_error());
        free(files);
        return 1;
    }
    if (pt_tokenizer_vocab_size(tok) > 65536) {
        pt_log_error("prepare: --vocab %s: %d tokens do not fit the shards' uint16", vocab,
                     pt_tokenizer_vocab_size(tok));
        pt_tokenizer_free(tok);
        free(files);
        return 1;
    }
    status = pt_mkdirs(out);

    prepare_shard shard = {.max = (size_t)shard_max, .dir = out};
    int32_t *ids = NULL;
    size_t nids = 0, cap = 0, total_tokens = 0, total_bytes = 0;
    double t0 = pt_now(), t_encode = 0;
    for (int i = 0; i < nfiles && status == PT_OK; i++) {
        char *text;
        size_t len;
        status = pt_read_file(files[i], &text, &len);
        if (status != PT_OK) break;
        if (cap == 0) {
            cap = 1 << 16;
            ids = pt_malloc(cap * sizeof *ids);
        }
        ids[0] = pt_tokenizer_eot(tok);
        nids = 1;
        double t1 = pt_now();
        status = pt_tokenizer_encode(tok, text, len, &ids, &nids, &cap);
        t_encode += pt_now() - t1;
        free(text);
        if (status == PT_OK) status = shard_add(&shard, ids, nids);
        total_tokens += nids;
        total_bytes += len;
    }
    if (status == PT_OK && shard.n > 0) status = shard_flush(&shard);
    if (status == PT_OK) {
        char next[4096];
        snprintf(next, sizeof next, "%s/train_%06d.bin", out, shard.index);
        if (access(next, F_OK) == 0)
            pt_log_warn("prepare: %s is left from an earlier run; remove the stale shards", next);
        double dt = pt_now() - t0;
        pt_log_info("prepare: %d files, %zu bytes -> %zu tokens in %d shards, %.1f s "
                    "(encoding %.2f MB/s)",
                    nfiles, total_bytes, total_tokens, shard.index, dt,
                    t_encode > 0 ? total_bytes / t_encode / 1e6 : 0.0);
    } else {
        pt_log_error("prepare: %s", pt_last_error());
    }
    free(ids);
    free(shard.buf);
    free(files);
    pt_tokenizer_free(tok);
    return status == PT_OK ? 0 : 1;
}
