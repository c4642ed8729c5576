/* prepare.c: `pentatron prepare`, text files -> token shards in llm.c's format.
 *
 * The tokenizer is GPT-2's files (--vocab DIR) or any pt_tokenizer_open reads (--tokenizer PATH:
 * a tokenizer.json, a .tiktoken file). Each input file is one document: the separator token
 * (<|endoftext|> for GPT-2, see pt_tokenizer_open for the others, or --separator TOKEN) followed
 * by the file's tokens. The token stream
 * is cut into shards of exactly --shard-tokens tokens (the last one holds the rest; documents may
 * span two shards, as in llm.c's fineweb.py), written as OUT/train_000000.bin, train_000001.bin, ...
 * A shard is a header of 256 int32 (magic, version, token count, zeros) followed by the tokens,
 * little-endian as the machine writes them: uint16 (magic 20240520, version 1) when every id fits,
 * else uint32 (magic 20240801, version 7: llm.c's Llama 3 layout). Each is written atomically.
 */
#include <errno.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/core.h"
#include "pt/data.h"
#include "pt/tokenizer.h"

static void prepare_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron prepare (--vocab DIR | --tokenizer PATH) --out DIR [--separator TOKEN]\n"
            "                         [--shard-tokens N] FILE...\n"
            "\n"
            "Tokenizes each FILE (one document, UTF-8 text) and writes token shards in llm.c's\n"
            "format: OUT/train_000000.bin, train_000001.bin, ... (uint16 tokens, or uint32 when the\n"
            "vocabulary has more than 65536 ids). Every document is preceded by the separator.\n"
            "\n"
            "  --vocab DIR         GPT-2's BPE: directory holding encoder.json and vocab.bpe\n"
            "  --tokenizer PATH    a Hugging Face tokenizer.json with a byte-level BPE model (Llama 3,\n"
            "                      Qwen) or a SentencePiece-style one (Llama 2, Mistral), or its\n"
            "                      directory, or a cl100k_base .tiktoken file\n"
            "  --separator TOKEN   the token put before every document (default: the first of\n"
            "                      <|begin_of_text|>, <|endoftext|>, <s>, <|end_of_text|>, </s>;\n"
            "                      <s> is Llama 2's and Mistral's BOS)\n"
            "  --threads N         encode N files at a time (default 1; the shards are the same)\n"
            "  --out DIR           output directory (created if missing)\n"
            "  --shard-tokens N    tokens per shard (default 100000000)\n"
            "  --help              print this help\n");
}

typedef struct {
    uint8_t *buf; /* header (256 int32) then uint16 or uint32 tokens */
    size_t n, cap, max;
    size_t width; /* bytes per token: 2 or 4 */
    int index;
    const char *dir;
} prepare_shard;

static uint8_t *shard_tokens(prepare_shard *s) { return s->buf + PT_SHARD_HEADER_INTS * sizeof(int32_t); }

static pt_status shard_flush(prepare_shard *s) {
    int32_t header[PT_SHARD_HEADER_INTS] = {s->width == 4 ? PT_SHARD32_MAGIC : PT_SHARD_MAGIC,
                                            s->width == 4 ? PT_SHARD32_VERSION : PT_SHARD_VERSION,
                                            (int32_t)s->n};
    memcpy(s->buf, header, sizeof header);
    char path[4096];
    snprintf(path, sizeof path, "%s/train_%06d.bin", s->dir, s->index);
    PT_TRY(pt_check_output(path, 0, "prepare --out")); /* a FIFO there: not replaced */
    PT_TRY(pt_write_file_atomic(path, s->buf, sizeof header + s->n * s->width));
    pt_log_info("prepare: wrote %s (%zu tokens)", path, s->n);
    s->index++;
    s->n = 0;
    return PT_OK;
}

/* One document of a block: its text, then its ids (the separator first). */
typedef struct {
    char *text;
    size_t len;
    int32_t *ids;
    size_t n, cap;
    pt_status st;
    char err[512]; /* the encoding thread's message (pt_last_error is per thread) */
} prepare_doc;

static void doc_push(prepare_doc *d, const int32_t *ids, size_t k) {
    if (d->n + k > d->cap) {
        size_t c = d->cap ? d->cap : 1 << 12;
        while (c < d->n + k) c *= 2;
        d->ids = realloc(d->ids, c * sizeof *d->ids);
        PT_ASSERTF(d->ids, "out of memory for %zu tokens", c);
        d->cap = c;
    }
    memcpy(d->ids + d->n, ids, k * sizeof *ids);
    d->n += k;
}

/* Appends tokens, writing every shard that fills up. */
static pt_status shard_add(prepare_shard *s, const int32_t *tok, size_t n) {
    while (n > 0) {
        if (s->n == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 1 << 16;
            if (cap > s->max) cap = s->max;
            uint8_t *b = realloc(s->buf, PT_SHARD_HEADER_INTS * sizeof(int32_t) + cap * s->width);
            if (!b) return pt_errorf(PT_ERR_MEMORY, "out of memory for a shard of %zu tokens", cap);
            s->buf = b;
            s->cap = cap;
        }
        size_t k = s->cap - s->n < n ? s->cap - s->n : n;
        if (s->width == 4) {
            memcpy(shard_tokens(s) + s->n * 4, tok, k * 4);
        } else {
            uint16_t *dst = (uint16_t *)shard_tokens(s) + s->n;
            for (size_t i = 0; i < k; i++) dst[i] = (uint16_t)tok[i];
        }
        s->n += k;
        tok += k;
        n -= k;
        if (s->n == s->max) PT_TRY(shard_flush(s));
    }
    return PT_OK;
}

/* Options and files; returns 0 to go on, else the exit code (after printing the problem). */
typedef struct {
    const char *vocab, *tokenizer, *separator, *out;
    long long shard_max;
    int threads;
} prepare_opts;

static int prepare_args(int argc, char **argv, prepare_opts *o, const char ***files, int *nfiles) {
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
        const char *names[] = {"--vocab", "--out", "--shard-tokens", "--tokenizer", "--separator", "--threads"};
        const char *val = NULL;
        int which = -1;
        for (int k = 0; k < 6; k++) {
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
        if (which == 0) o->vocab = val;
        if (which == 1) o->out = val;
        if (which == 3) o->tokenizer = val;
        if (which == 4) o->separator = val;
        if (which == 2 || which == 5) {
            char *end;
            errno = 0;
            long long v = strtoll(val, &end, 10), hi = which == 2 ? INT32_MAX : 256;
            if (errno || *end || v < 1 || v > hi) {
                pt_log_error("prepare: %s '%s': expected an integer in [1, %lld]", names[which], val, hi);
                return 2;
            }
            if (which == 2) o->shard_max = v;
            else o->threads = (int)v;
        }
    }
    if (!o->vocab == !o->tokenizer) {
        pt_log_error("prepare: give one of --vocab DIR (GPT-2's encoder.json and vocab.bpe) and "
                     "--tokenizer PATH (tokenizer.json or .tiktoken)");
        return 2;
    }
    if (!o->out) {
        pt_log_error("prepare: --out DIR is required");
        return 2;
    }
    if (*nfiles == 0) {
        pt_log_error("prepare: no input files (usage: pentatron prepare --tokenizer PATH --out DIR FILE...)");
        return 2;
    }
    return 0;
}

/* argv holds what follows `pentatron prepare`: options and files. */
int pt_cmd_prepare(int argc, char **argv) {
    prepare_opts o = {.shard_max = 100000000, .threads = 1};
    const char **files = NULL;
    int nfiles = 0;
    int rc = prepare_args(argc, argv, &o, &files, &nfiles);
    if (rc != 0) {
        free(files);
        return rc < 0 ? 0 : rc;
    }

    /* Check every input and the output before writing anything: refused, exit 2 */
    if (pt_check_output(o.out, 1, "prepare --out") != PT_OK) {
        pt_log_error("%s", pt_last_error());
        free(files);
        return PT_EXIT_REFUSED;
    }
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (stat(files[i], &st) != 0 || access(files[i], R_OK) != 0) {
            pt_log_error("prepare: %s: cannot read input file: %s", files[i], strerror(errno));
            free(files);
            return PT_EXIT_REFUSED;
        }
        if (!S_ISREG(st.st_mode)) {
            pt_log_error("prepare: %s: input is not a regular file", files[i]);
            free(files);
            return PT_EXIT_REFUSED;
        }
    }

    /* one tokenizer per thread: encoding mutates a tokenizer (its cache and scratch) */
    int nt = o.threads;
    pt_tokenizer **toks = pt_calloc((size_t)nt, sizeof *toks);
    const char *opt = o.vocab ? "--vocab" : "--tokenizer", *path = o.vocab ? o.vocab : o.tokenizer;
    pt_status status = PT_OK;
    for (int k = 0; k < nt && status == PT_OK; k++) {
        status = o.vocab ? pt_tokenizer_load(&toks[k], o.vocab) : pt_tokenizer_open(&toks[k], o.tokenizer);
        if (status == PT_OK && o.separator) status = pt_tokenizer_set_eot(toks[k], o.separator);
    }
    pt_tokenizer *tok = toks[0];
    if (status == PT_OK && pt_tokenizer_eot(tok) < 0)
        status = pt_errorf(PT_ERR_CONFIG, "none of <|begin_of_text|>, <|endoftext|>, <s>, <|end_of_text|>, "
                           "</s> is a token: name the document separator with --separator TOKEN");
    if (status != PT_OK) {
        pt_log_error("prepare: %s %s: %s", opt, path, pt_last_error());
        for (int k = 0; k < nt; k++) pt_tokenizer_free(toks[k]);
        free(toks);
        free(files);
        return pt_cli_exit(status, 0);
    }
    const char *out = o.out;
    status = pt_mkdirs(out);
    int started = status == PT_OK; /* an --out that cannot be made: refused (2) */

    size_t width = pt_tokenizer_vocab_size(tok) > 65536 ? 4 : 2;
    prepare_shard shard = {.max = (size_t)o.shard_max, .dir = out, .width = width};
    size_t total_tokens = 0, total_bytes = 0;
    double t0 = pt_now(), t_encode = 0;
    /* Blocks of files: read in order, encoded in parallel (thread k with toks[k]), appended in
     * order, so the shards do not depend on the thread count. t_encode is the encoding's wall time. */
    int block = 8 * nt;
    prepare_doc *docs = pt_calloc((size_t)block, sizeof *docs);
    for (int b0 = 0; b0 < nfiles && status == PT_OK; b0 += block) {
        int nb = nfiles - b0 < block ? nfiles - b0 : block;
        for (int i = 0; i < nb && status == PT_OK; i++) {
            docs[i].n = 0;
            status = pt_read_file(files[b0 + i], &docs[i].text, &docs[i].len);
        }
        if (status != PT_OK) break;
        double t1 = pt_now();
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
        for (int i = 0; i < nb; i++) {
            prepare_doc *d = &docs[i];
            pt_tokenizer *tk = toks[omp_get_thread_num()];
            int32_t sep = pt_tokenizer_eot(tk);
            doc_push(d, &sep, 1);
            d->st = pt_tokenizer_encode(tk, d->text, d->len, &d->ids, &d->n, &d->cap);
            if (d->st != PT_OK) snprintf(d->err, sizeof d->err, "%s", pt_last_error());
        }
        t_encode += pt_now() - t1;
        for (int i = 0; i < nb; i++) {
            free(docs[i].text);
            docs[i].text = NULL;
            if (status == PT_OK && docs[i].st != PT_OK)
                status = pt_errorf(docs[i].st, "%s: %s", files[b0 + i], docs[i].err);
            if (status == PT_OK) status = shard_add(&shard, docs[i].ids, docs[i].n);
            total_tokens += docs[i].n;
            total_bytes += docs[i].len;
        }
    }
    for (int i = 0; i < block; i++) {
        free(docs[i].ids);
        free(docs[i].text);
    }
    free(docs);
    if (status == PT_OK && shard.n > 0) status = shard_flush(&shard);
    if (status == PT_OK) {
        char next[4096];
        snprintf(next, sizeof next, "%s/train_%06d.bin", out, shard.index);
        if (access(next, F_OK) == 0)
            pt_log_warn("prepare: %s is left from an earlier run; remove the stale shards", next);
        double dt = pt_now() - t0;
        pt_log_info("prepare: %d files, %zu bytes -> %zu tokens in %d shards of uint%d, %.1f s "
                    "(encoding %.2f MB/s, %.0f tokens/s)",
                    nfiles, total_bytes, total_tokens, shard.index, (int)(8 * width), dt,
                    t_encode > 0 ? total_bytes / t_encode / 1e6 : 0.0,
                    t_encode > 0 ? total_tokens / t_encode : 0.0);
    } else {
        pt_log_error("prepare: %s", pt_last_error());
    }
    free(shard.buf);
    free(files);
    for (int k = 0; k < nt; k++) pt_tokenizer_free(toks[k]);
    free(toks);
    return pt_cli_exit(status, started); /* encoding and writing: failures while working (1) */
}
