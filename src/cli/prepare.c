/* prepare.c: `pentatron prepare`, documents -> token shards in llm.c's format.
 *
 * The tokenizer is GPT-2's files (--vocab DIR) or any pt_tokenizer_open reads (--tokenizer PATH:
 * a tokenizer.json, a .tiktoken file). The documents come from the inputs in order
 * (prepare_input.h: a text file is one document, a JSON Lines file one a line; gzip or zstd;
 * standard input), streamed in blocks. Each document is the separator token (<|endoftext|> for
 * GPT-2, see pt_tokenizer_open for the others, or --separator TOKEN) followed by its tokens.
 * Held-out documents (--val-fraction, --val-documents; val_document says which) go to a stream of
 * their own. Each stream is cut into shards of exactly --shard-tokens tokens (the last one holds
 * the rest; documents may span two shards, as in llm.c's fineweb.py), written as
 * OUT/train_000000.bin, train_000001.bin, ... and OUT/val_000000.bin, ...
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
#include "cli/prepare_input.h"
#include "pt/core.h"
#include "pt/data.h"
#include "pt/tokenizer.h"

static void prepare_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron prepare (--vocab DIR | --tokenizer PATH) --out DIR [--separator TOKEN]\n"
            "                         [--format text|jsonl] [--field NAME] [--val-fraction F |\n"
            "                         --val-documents N] [--shard-tokens N] [--threads N] FILE...\n"
            "\n"
            "Tokenizes the documents of each FILE, in order, and writes token shards in llm.c's\n"
            "format: OUT/train_000000.bin, train_000001.bin, ... (uint16 tokens, or uint32 when the\n"
            "vocabulary has more than 65536 ids). Every document is preceded by the separator.\n"
            "A FILE is one document of UTF-8 text, or JSON Lines (one object a line, the document\n"
            "the string in its \"text\" field) when its name ends .jsonl, .ndjson or .json; either\n"
            "may be compressed with gzip or zstd (known by their first bytes; .gz, .zst after the\n"
            "name keep it JSON Lines). FILE - is standard input, read as JSON Lines.\n"
            "\n"
            "  --vocab DIR         GPT-2's BPE: directory holding encoder.json and vocab.bpe\n"
            "  --tokenizer PATH    a Hugging Face tokenizer.json with a byte-level BPE model (Llama 3,\n"
            "                      Qwen) or a SentencePiece-style one (Llama 2, Mistral), or its\n"
            "                      directory, or a cl100k_base .tiktoken file\n"
            "  --separator TOKEN   the token put before every document (default: the first of\n"
            "                      <|begin_of_text|>, <|endoftext|>, <s>, <|end_of_text|>, </s>;\n"
            "                      <s> is Llama 2's and Mistral's BOS)\n"
            "  --format F          text (each FILE one document) or jsonl, for every FILE\n"
            "                      (default: by the name, as above)\n"
            "  --field NAME        the JSON Lines field holding the text (default text)\n"
            "  --val-fraction F    hold out each document with probability F (0 < F < 1), chosen by\n"
            "                      a hash of its index: written as OUT/val_000000.bin, ... for data.val\n"
            "  --val-documents N   hold out N documents spread evenly over the input (counted first:\n"
            "                      not with standard input); the rules: docs/guide.md section 11\n"
            "  --threads N         encode N documents at a time (default 1; the shards are the same)\n"
            "  --out DIR           output directory (created if missing)\n"
            "  --shard-tokens N    tokens per shard (default 100000000)\n"
            "  --help              print this help\n");
}

/* A line on the terminal (standard error) at most once a second, and in the log every minute
 * when it is not one: how much of the input is read, documents and tokens so far. */
typedef struct {
    double t0, last_tty, last_log;
    uint64_t total_bytes; /* of the inputs that are files; 0 when one is standard input */
    int tty, shown;       /* shown: the terminal's line holds the progress */
} prepare_progress;

/* Clears the progress from the terminal's line before a log line. */
static void progress_clear(prepare_progress *p) {
    if (p && p->shown) fprintf(stderr, "\r\033[K");
    if (p) p->shown = 0;
}

/* read: bytes of the input files so far; text: bytes of the documents. */
static void progress_show(prepare_progress *p, uint64_t read, uint64_t docs, size_t tokens, size_t text,
                          int final) {
    double now = pt_now(), dt = now - p->t0;
    if (!final && !(p->tty && now - p->last_tty >= 1) && !(!p->tty && now - p->last_log >= 60)) return;
    char where[96];
    if (p->total_bytes > 0)
        snprintf(where, sizeof where, "%.0f%% of %.1f MB", 100.0 * (double)read / (double)p->total_bytes,
                 p->total_bytes / 1e6);
    else
        snprintf(where, sizeof where, "%.1f MB", read / 1e6);
    if (p->tty) {
        progress_clear(p);
        if (!final) {
            fprintf(stderr, "prepare: %s read, %llu documents, %zu tokens, %.1f MB of text/s", where,
                    (unsigned long long)docs, tokens, dt > 0 ? text / dt / 1e6 : 0.0);
            p->shown = 1;
        }
        fflush(stderr);
        p->last_tty = now;
    } else if (!final) {
        pt_log_info("prepare: %s read, %llu documents, %zu tokens", where, (unsigned long long)docs, tokens);
        p->last_log = now;
    }
}

typedef struct {
    uint8_t *buf; /* header (256 int32) then uint16 or uint32 tokens */
    size_t n, cap, max;
    size_t width; /* bytes per token: 2 or 4 */
    int index;
    const char *dir, *prefix; /* OUT/PREFIX_000000.bin: "train" or "val" */
    prepare_progress *progress;
} prepare_shard;

static uint8_t *shard_tokens(prepare_shard *s) { return s->buf + PT_SHARD_HEADER_INTS * sizeof(int32_t); }

static pt_status shard_flush(prepare_shard *s) {
    int32_t header[PT_SHARD_HEADER_INTS] = {s->width == 4 ? PT_SHARD32_MAGIC : PT_SHARD_MAGIC,
                                            s->width == 4 ? PT_SHARD32_VERSION : PT_SHARD_VERSION,
                                            (int32_t)s->n};
    memcpy(s->buf, header, sizeof header);
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", s->dir, s->prefix, s->index);
    PT_TRY(pt_check_output(path, 0, "prepare --out")); /* a FIFO there: not replaced */
    PT_TRY(pt_write_file_atomic(path, s->buf, sizeof header + s->n * s->width));
    progress_clear(s->progress);
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
    const char *src; /* the input it came from, and its line there (JSON Lines; else 0) */
    long long line;
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
    const char *vocab, *tokenizer, *separator, *out, *field;
    long long shard_max, val_documents;
    double val_fraction;
    int threads;
    pt_input_format format;
} prepare_opts;

static int prepare_args(int argc, char **argv, prepare_opts *o, const char ***files, int *nfiles) {
    *files = pt_calloc((size_t)argc + 1, sizeof **files);
    int only_files = 0, stdin_named = 0;
    enum { O_VOCAB, O_OUT, O_SHARD, O_TOKENIZER, O_SEPARATOR, O_THREADS, O_FORMAT, O_FIELD, O_VAL_FRACTION,
           O_VAL_DOCUMENTS, O_COUNT };
    static const char *names[O_COUNT] = {"--vocab", "--out", "--shard-tokens", "--tokenizer", "--separator",
                                         "--threads", "--format", "--field", "--val-fraction",
                                         "--val-documents"};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (only_files || a[0] != '-' || a[1] == 0) {
            if (strcmp(a, "-") == 0 && stdin_named++) {
                pt_log_error("prepare: standard input (-) named twice");
                return 2;
            }
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
        const char *val = NULL;
        int which = -1;
        for (int k = 0; k < O_COUNT; k++) {
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
        if (which == O_VOCAB) o->vocab = val;
        if (which == O_OUT) o->out = val;
        if (which == O_TOKENIZER) o->tokenizer = val;
        if (which == O_SEPARATOR) o->separator = val;
        if (which == O_FIELD) o->field = val;
        if (which == O_FORMAT) {
            if (strcmp(val, "text") && strcmp(val, "jsonl")) {
                pt_log_error("prepare: --format '%s': expected text or jsonl", val);
                return 2;
            }
            o->format = strcmp(val, "text") == 0 ? PT_INPUT_TEXT : PT_INPUT_JSONL;
        }
        if (which == O_VAL_FRACTION) {
            char *end;
            errno = 0;
            double v = strtod(val, &end);
            if (errno || *end || !(v > 0 && v < 1)) {
                pt_log_error("prepare: --val-fraction '%s': expected a number between 0 and 1 (exclusive)", val);
                return 2;
            }
            o->val_fraction = v;
        }
        if (which == O_SHARD || which == O_THREADS || which == O_VAL_DOCUMENTS) {
            char *end;
            errno = 0;
            long long v = strtoll(val, &end, 10), hi = which == O_THREADS ? 256 : INT32_MAX;
            if (which == O_VAL_DOCUMENTS) hi = INT64_MAX / 2;
            if (errno || *end || v < 1 || v > hi) {
                pt_log_error("prepare: %s '%s': expected an integer in [1, %lld]", names[which], val, hi);
                return 2;
            }
            if (which == O_SHARD) o->shard_max = v;
            else if (which == O_THREADS) o->threads = (int)v;
            else o->val_documents = v;
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
    if (o->val_fraction > 0 && o->val_documents > 0) {
        pt_log_error("prepare: give one of --val-fraction and --val-documents");
        return 2;
    }
    if (*nfiles == 0) {
        pt_log_error("prepare: no input files (usage: pentatron prepare --tokenizer PATH --out DIR FILE...; "
                     "- reads standard input)");
        return 2;
    }
    if (stdin_named && o->val_documents > 0) {
        pt_log_error("prepare: --val-documents counts the documents before writing, which standard input "
                     "(-) cannot be read twice for: use --val-fraction");
        return 2;
    }
    return 0;
}

/* splitmix64 (Steele, Lea and Flood 2014): a well-mixed 64-bit hash of the document index. */
static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Whether document i (counted from 0 over all inputs, in order) is held out: with a fraction F,
 * when splitmix64(i) / 2^64 < F; with N of D documents, the i where floor((i+1)N/D) steps up
 * (N documents spread evenly, the first at about D/N - 1). */
static int val_document(const prepare_opts *o, uint64_t i, uint64_t ndocs) {
    if (o->val_fraction > 0) return (double)(splitmix64(i) >> 11) * 0x1p-53 < o->val_fraction;
    if (o->val_documents > 0) {
        unsigned __int128 n = (unsigned __int128)o->val_documents;
        return (i + 1) * n / ndocs > i * n / ndocs;
    }
    return 0;
}

/* The number of documents in the inputs (for --val-documents): a pass that reads and checks them
 * all before anything is written. */
static pt_status count_documents(const prepare_opts *o, const char **files, int nfiles, uint64_t *ndocs) {
    *ndocs = 0;
    for (int f = 0; f < nfiles; f++) {
        pt_input *in;
        PT_TRY(pt_input_open(&in, files[f], o->format, o->field));
        pt_status st = PT_OK;
        for (;;) {
            char *text;
            size_t len;
            st = pt_input_next(in, &text, &len);
            if (st != PT_OK || !text) break;
            free(text);
            ++*ndocs;
        }
        pt_input_close(in);
        PT_TRY(st);
    }
    return PT_OK;
}

/* Which input is being read, and its documents, streamed a block at a time. */
typedef struct {
    const prepare_opts *o;
    const char **files;
    int nfiles, next;
    pt_input *in;
    uint64_t read_done; /* bytes of the inputs already closed */
} prepare_reader;

/* The next document into d->text, or d->text = NULL after the last input. */
static pt_status reader_next(prepare_reader *r, prepare_doc *d) {
    d->text = NULL;
    for (;;) {
        if (!r->in) {
            if (r->next == r->nfiles) return PT_OK;
            PT_TRY(pt_input_open(&r->in, r->files[r->next++], r->o->format, r->o->field));
        }
        PT_TRY(pt_input_next(r->in, &d->text, &d->len));
        d->src = r->files[r->next - 1];
        d->line = pt_input_line(r->in);
        if (d->text) return PT_OK;
        r->read_done += pt_input_bytes_read(r->in);
        pt_input_close(r->in);
        r->in = NULL;
    }
}

static uint64_t reader_bytes(const prepare_reader *r) {
    return r->read_done + (r->in ? pt_input_bytes_read(r->in) : 0);
}

/* Warns about a shard of an earlier run that the shards written now leave behind. */
static void warn_stale(const prepare_shard *s) {
    char next[4096];
    snprintf(next, sizeof next, "%s/%s_%06d.bin", s->dir, s->prefix, s->index);
    if (access(next, F_OK) == 0)
        pt_log_warn("prepare: %s is left from an earlier run; remove the stale shards", next);
}

/* argv holds what follows `pentatron prepare`: options and files. */
int pt_cmd_prepare(int argc, char **argv) {
    prepare_opts o = {.shard_max = 100000000, .threads = 1, .field = "text"};
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
    prepare_progress progress = {.tty = isatty(STDERR_FILENO)};
    for (int i = 0; i < nfiles; i++) {
        struct stat st;
        if (strcmp(files[i], "-") == 0) continue;
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
        progress.total_bytes += (uint64_t)st.st_size;
    }
    for (int i = 0; i < nfiles; i++) /* standard input's size is not known: no percentage */
        if (strcmp(files[i], "-") == 0) progress.total_bytes = 0;

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
    /* --val-documents: the documents counted (and checked) first; a bad input refused (2) */
    uint64_t ndocs = 0;
    if (o.val_documents > 0) {
        status = count_documents(&o, files, nfiles, &ndocs);
        if (status == PT_OK && (uint64_t)o.val_documents >= ndocs)
            status = pt_errorf(PT_ERR_CONFIG, "--val-documents %lld: the inputs hold %llu documents, and "
                               "training needs at least one", o.val_documents, (unsigned long long)ndocs);
    }
    const char *out = o.out;
    if (status == PT_OK) status = pt_mkdirs(out);
    int started = status == PT_OK; /* an --out that cannot be made: refused (2) */

    size_t width = pt_tokenizer_vocab_size(tok) > 65536 ? 4 : 2;
    prepare_shard train = {.max = (size_t)o.shard_max, .dir = out, .prefix = "train", .width = width,
                           .progress = &progress};
    prepare_shard val = {.max = (size_t)o.shard_max, .dir = out, .prefix = "val", .width = width,
                         .progress = &progress};
    size_t total_tokens = 0, total_bytes = 0, val_tokens = 0;
    uint64_t doc_index = 0, val_docs = 0;
    double t0 = pt_now(), t_encode = 0;
    progress.t0 = progress.last_tty = progress.last_log = t0; /* the first line after a second (a minute) */
    prepare_reader reader = {.o = &o, .files = files, .nfiles = nfiles};
    /* Blocks of documents: read in order, encoded in parallel (thread k with toks[k]), appended in
     * order, so the shards do not depend on the thread count. A block ends at 64 documents a
     * thread or 16 MB of text. t_encode is the encoding's wall time. */
    int block = 64 * nt, ended = 0;
    prepare_doc *docs = pt_calloc((size_t)block, sizeof *docs);
    while (status == PT_OK && !ended) {
        int nb = 0;
        size_t bytes = 0;
        while (status == PT_OK && nb < block && bytes < (16u << 20)) {
            docs[nb].n = 0;
            status = reader_next(&reader, &docs[nb]);
            if (status != PT_OK || !docs[nb].text) {
                ended = 1;
                break;
            }
            bytes += docs[nb++].len;
        }
        if (status != PT_OK) {
            for (int i = 0; i < nb; i++) {
                free(docs[i].text);
                docs[i].text = NULL;
            }
            break;
        }
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
        for (int i = 0; i < nb; i++, doc_index++) {
            free(docs[i].text);
            docs[i].text = NULL;
            if (status == PT_OK && docs[i].st != PT_OK && docs[i].line > 0)
                status = pt_errorf(docs[i].st, "%s:%lld: %s", docs[i].src, docs[i].line, docs[i].err);
            else if (status == PT_OK && docs[i].st != PT_OK)
                status = pt_errorf(docs[i].st, "%s: %s", docs[i].src, docs[i].err);
            int held = val_document(&o, doc_index, ndocs);
            if (status == PT_OK) status = shard_add(held ? &val : &train, docs[i].ids, docs[i].n);
            total_tokens += docs[i].n;
            total_bytes += docs[i].len;
            val_tokens += held ? docs[i].n : 0;
            val_docs += held;
        }
        progress_show(&progress, reader_bytes(&reader), doc_index, total_tokens, total_bytes, 0);
    }
    progress_show(&progress, reader_bytes(&reader), doc_index, total_tokens, total_bytes, 1);
    pt_input_close(reader.in); /* the one a failure left open */
    for (int i = 0; i < block; i++) {
        free(docs[i].ids);
        free(docs[i].text);
    }
    free(docs);
    if (status == PT_OK && train.n > 0) status = shard_flush(&train);
    if (status == PT_OK && val.n > 0) status = shard_flush(&val);
    if (status == PT_OK) {
        warn_stale(&train);
        warn_stale(&val);
        if (o.val_fraction > 0 && val_docs == 0)
            pt_log_warn("prepare: no document was held out (%llu documents, --val-fraction %g): no val shard",
                        (unsigned long long)doc_index, o.val_fraction);
        double dt = pt_now() - t0;
        pt_log_info("prepare: %d inputs, %llu documents, %zu bytes -> %zu tokens in %d shards of uint%d, "
                    "%.1f s (encoding %.2f MB/s, %.0f tokens/s)",
                    nfiles, (unsigned long long)doc_index, total_bytes, total_tokens, train.index + val.index,
                    (int)(8 * width), dt, t_encode > 0 ? total_bytes / t_encode / 1e6 : 0.0,
                    t_encode > 0 ? total_tokens / t_encode : 0.0);
        if (val_docs > 0)
            pt_log_info("prepare: held out %llu documents, %zu tokens, in %d val shards (data.val = "
                        "\"%s/val_*.bin\")", (unsigned long long)val_docs, val_tokens, val.index, out);
    } else {
        pt_log_error("prepare: %s", pt_last_error());
    }
    free(train.buf);
    free(val.buf);
    free(files);
    for (int k = 0; k < nt; k++) pt_tokenizer_free(toks[k]);
    free(toks);
    return pt_cli_exit(status, started); /* encoding and writing: failures while working (1) */
}
