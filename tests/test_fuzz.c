/* test_fuzz.c: seeded mutation fuzzing of every parser of a file or argument a user gives
 * pentatron: the INI config file and the command-line keys (with data.sources/data.weights),
 * Hugging Face config.json, a checkpoint's index.json (and its shards' blocks), token shards'
 * headers and tokens (plain and mixed), tokenizer.json (byte-level and SentencePiece-style),
 * .tiktoken files and GPT-2's encoder.json + vocab.bpe, safetensors headers, and the flight
 * records `pentatron trace why` reads.
 *
 * Each parser starts from a small valid seed written here; every iteration applies 1 to 4 seeded
 * mutations (bit flips, bytes set, inserted or deleted, truncation, a range repeated, a number
 * replaced by a hostile one such as 1e999, -1, NaN or 2^63, a string lengthened past any buffer,
 * a value nested thousands deep, a JSON token swapped for another) and feeds the result to the
 * parser. Required: no crash, no sanitizer report (tests/test_fuzz_asan.sh runs this file under
 * AddressSanitizer and UndefinedBehaviorSanitizer, leaks included), no hang (each call under an
 * alarm), a known status, and a message in pt_last_error() for every failure. What opens is then
 * used (rows read, blocks read, text encoded and decoded) into buffers of exactly its size.
 *
 * PT_FUZZ_ITERS (default 600) inputs per parser and PT_FUZZ_SEED (default 1) choose the run; a
 * failure names the parser, iteration and seed, which reproduce it. The regression cases at the
 * end are inputs fuzzing found. */
#define _GNU_SOURCE

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "pt/checkpoint.h"
#include "pt/config.h"
#include "pt/data.h"
#include "pt/flight.h"
#include "pt/hf_config.h"
#include "pt/safetensors.h"
#include "pt/tokenizer.h"
#include "testutil.h"

/* ---- the mutator ---- */

typedef struct {
    uint8_t *b;
    size_t n, cap;
} fz_buf;

static uint64_t fz_state;

static uint64_t fz_next(void) {
    fz_state ^= fz_state << 13;
    fz_state ^= fz_state >> 7;
    fz_state ^= fz_state << 17;
    return fz_state;
}

static size_t fz_below(size_t n) { return n ? (size_t)(fz_next() % n) : 0; }

static void fz_reserve(fz_buf *m, size_t n) {
    if (n <= m->cap) return;
    m->cap = n * 2;
    m->b = realloc(m->b, m->cap);
    if (!m->b) fail_msg("out of memory");
}

/* Replaces bytes [pos, pos + del) with ins[0..k). */
static void fz_splice(fz_buf *m, size_t pos, size_t del, const void *ins, size_t k) {
    if (pos > m->n) pos = m->n;
    if (del > m->n - pos) del = m->n - pos;
    fz_reserve(m, m->n - del + k + 1);
    memmove(m->b + pos + k, m->b + pos + del, m->n - pos - del);
    if (k) memcpy(m->b + pos, ins, k);
    m->n = m->n - del + k;
}

static const char *const fz_numbers[] = {
    "0", "-0", "-1", "1", "2", "3", "0.5", "-0.5", "1e999", "-1e999", "NaN", "nan", "inf", "-inf",
    "1e-400", "1e39", "3e38", "65535", "65536", "100000", "2147483647", "2147483648",
    "-2147483648", "4294967295", "4294967299", "9223372036854775807", "9223372036854775808",
    "-9223372036854775808", "18446744073709551616", "99999999999999999999999999", "1e18",
    "0x10", "1.", ".5", "--1", "1e", "00012"};
static const char *const fz_tokens[] = {
    "null", "true", "false", "{}", "[]", "\"\"", "[0]", "{\"\": 0}", "\"\\u0000\"", "\"\\ud800\"",
    "\"\xff\xfe\"", "[[]]", "[0, 0, 0, 0, 0]", "\"a\"", "1e999", "-1"};
static const char fz_chars[] = "{}[],:\"\\-.0123456789eE \n\t=#;/\x00\xff\x80\xc3";

static int fz_is_num(uint8_t c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

/* A number token at or after a random place: [*a, *b); 0 if none. */
static int fz_find_number(const fz_buf *m, size_t *a, size_t *b) {
    if (!m->n) return 0;
    size_t start = fz_below(m->n);
    for (size_t k = 0; k < m->n; k++) {
        size_t i = (start + k) % m->n;
        if (m->b[i] < '0' || m->b[i] > '9') continue;
        size_t lo = i, hi = i;
        while (lo > 0 && fz_is_num(m->b[lo - 1])) lo--;
        while (hi < m->n && fz_is_num(m->b[hi])) hi++;
        *a = lo, *b = hi;
        return 1;
    }
    return 0;
}

/* A JSON-ish token (string, number, word or bracketed value start) at or after a random place. */
static int fz_find_token(const fz_buf *m, size_t *a, size_t *b) {
    if (!m->n) return 0;
    size_t i = fz_below(m->n);
    while (i < m->n && m->b[i] != '"' && !fz_is_num(m->b[i]) && !(m->b[i] >= 'a' && m->b[i] <= 'z'))
        i++;
    if (i >= m->n) return 0;
    size_t j = i + 1;
    if (m->b[i] == '"') {
        while (j < m->n && m->b[j] != '"') j += m->b[j] == '\\' ? 2 : 1;
        if (j < m->n) j++;
    } else {
        while (j < m->n && (fz_is_num(m->b[j]) || (m->b[j] >= 'a' && m->b[j] <= 'z'))) j++;
    }
    if (j > m->n) j = m->n;
    *a = i, *b = j;
    return 1;
}

static void fz_mutate_once(fz_buf *m, size_t hot) {
    size_t a, b;
    /* half the byte-level edits land in the first `hot` bytes (a binary header) when given */
    size_t span = hot && (fz_next() & 1) ? (hot < m->n ? hot : m->n) : m->n;
    size_t pos = fz_below(span);
    switch (fz_next() % 12) {
    case 0: /* a bit flipped */
        if (m->n) m->b[pos] ^= (uint8_t)(1u << (fz_next() % 8));
        break;
    case 1: /* a byte set to one that matters to parsers */
        if (m->n) m->b[pos] = (uint8_t)fz_chars[fz_below(sizeof fz_chars - 1)];
        break;
    case 2: { /* a few random bytes inserted */
        uint8_t ins[8];
        size_t k = 1 + fz_below(sizeof ins);
        for (size_t i = 0; i < k; i++) ins[i] = (uint8_t)fz_next();
        fz_splice(m, pos, 0, ins, k);
        break;
    }
    case 3: /* a range deleted */
        fz_splice(m, pos, 1 + fz_below(16), NULL, 0);
        break;
    case 4: /* truncated */
        m->n = fz_below(m->n + 1);
        break;
    case 5: { /* a range repeated elsewhere */
        if (!m->n) break;
        size_t from = fz_below(m->n), k = 1 + fz_below(64);
        if (k > m->n - from) k = m->n - from;
        uint8_t *tmp = malloc(k);
        memcpy(tmp, m->b + from, k);
        fz_splice(m, fz_below(m->n + 1), 0, tmp, k);
        free(tmp);
        break;
    }
    case 6: /* a number replaced by a hostile one */
    case 7:
        if (fz_find_number(m, &a, &b)) {
            const char *s = fz_numbers[fz_below(sizeof fz_numbers / sizeof fz_numbers[0])];
            fz_splice(m, a, b - a, s, strlen(s));
        }
        break;
    case 8: { /* a string (or, in a file without them, a value) lengthened past any buffer */
        if (!fz_find_token(m, &a, &b)) break;
        size_t k = 200 + fz_below(5000);
        char *s = malloc(k);
        memset(s, "a\xc3\xa9/%"[fz_below(5)], k);
        fz_splice(m, m->b[a] == '"' ? a + 1 : b, 0, s, k);
        free(s);
        break;
    }
    case 9: { /* a value nested deep */
        if (!fz_find_token(m, &a, &b)) break;
        size_t depth = 1 + fz_below(fz_next() & 1 ? 8 : 5000);
        char *open = malloc(depth), *close = malloc(depth);
        memset(open, '[', depth);
        memset(close, ']', depth);
        fz_splice(m, b, 0, close, depth);
        fz_splice(m, a, 0, open, depth);
        free(open);
        free(close);
        break;
    }
    case 10: /* a token replaced by another value */
        if (fz_find_token(m, &a, &b)) {
            const char *s = fz_tokens[fz_below(sizeof fz_tokens / sizeof fz_tokens[0])];
            fz_splice(m, a, b - a, s, strlen(s));
        }
        break;
    default: { /* a token replaced by another token of the file */
        size_t c, d;
        if (!fz_find_token(m, &a, &b) || !fz_find_token(m, &c, &d)) break;
        char *tmp = malloc(d - c + 1);
        memcpy(tmp, m->b + c, d - c);
        fz_splice(m, a, b - a, tmp, d - c);
        free(tmp);
        break;
    }
    }
}

/* m := seed with 1 to 4 mutations; the seed itself at iteration 0 (which fz_report requires to be
 * accepted). */
static int fz_iter;

static void fz_mutate(fz_buf *m, const void *seed, size_t n, size_t hot) {
    m->n = 0;
    fz_splice(m, 0, 0, seed, n);
    int edits = fz_iter == 0 ? 0 : 1 + (int)fz_below(4);
    for (int e = 0; e < edits; e++) fz_mutate_once(m, hot);
}

/* ---- the harness ---- */

static int fz_iters(void) {
    const char *s = getenv("PT_FUZZ_ITERS");
    int n = s ? atoi(s) : 600;
    return n > 0 ? n : 600;
}

static uint64_t fz_seed(const char *parser) {
    const char *s = getenv("PT_FUZZ_SEED");
    uint64_t x = s ? strtoull(s, NULL, 0) : 1;
    for (const char *p = parser; *p; p++) x = (x ^ (uint8_t)*p) * 0x100000001B3ull; /* FNV */
    return x ? x : 1;
}

/* Where a hang is reported from: the alarm's handler names what was running. */
static const char *fz_parser = "";
static int fz_seed_ok; /* the unmutated seed (iteration 0) was accepted */

static void fz_put(const char *s) {
    ssize_t unused = write(STDERR_FILENO, s, strlen(s));
    (void)unused;
}

static void fz_on_alarm(int sig) {
    (void)sig;
    char num[16], *q = num + sizeof num;
    *--q = 0;
    unsigned v = (unsigned)fz_iter;
    do *--q = (char)('0' + v % 10); while ((v /= 10) > 0);
    fz_put("fuzz: HANG: parser ");
    fz_put(fz_parser);
    fz_put(", iteration ");
    fz_put(q);
    fz_put(" took over 10 s (rerun with the same PT_FUZZ_SEED and PT_FUZZ_ITERS)\n");
    _exit(3);
}

static void fz_begin(const char *parser) {
    fz_parser = parser;
    fz_seed_ok = 0;
    fz_state = fz_seed(parser);
    signal(SIGALRM, fz_on_alarm);
}

/* Before a parser call: no message left from before, and the alarm armed. */
static void fz_arm(int it) {
    fz_iter = it;
    pt_errorf(PT_OK, "%s", "");
    alarm(10);
}

/* After it: a known status, and a message with every failure. */
static void fz_check(pt_status st, pt_status lo, pt_status hi) {
    alarm(0);
    if (st == PT_OK) return;
    if (st < lo || st > hi)
        fail_msg("%s, iteration %d: status %d outside [%d, %d]: %s", fz_parser, fz_iter, (int)st,
                 (int)lo, (int)hi, pt_last_error());
    if (!pt_last_error()[0])
        fail_msg("%s, iteration %d: status %d with an empty message", fz_parser, fz_iter, (int)st);
}

static void fz_report(int opened, int iters) {
    print_message("fuzz %s: %d inputs, %d accepted\n", fz_parser, iters, opened);
    if (!fz_seed_ok) fail_msg("%s: the unmutated seed was refused: %s", fz_parser, pt_last_error());
    /* both paths ran: mutations that keep the input valid, and ones that break it */
    if (iters >= 100 && opened == iters)
        fail_msg("%s: %d of %d inputs accepted: the seed or the mutator is wrong", fz_parser,
                 opened, iters);
}

static const char *fz_path(const char *name) {
    static char bufs[4][600];
    static int k;
    char *b = bufs[k++ % 4];
    snprintf(b, sizeof bufs[0], "%s/%s", tu_tmpdir(), name);
    return b;
}

/* A fresh file each time (a file truncated and rewritten is flushed on close by ext4). */
static void fz_write(const char *path, const void *data, size_t n) {
    remove(path);
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    if (n && fwrite(data, 1, n, f) != n) fail_msg("cannot write %s", path);
    fclose(f);
}

static char *fz_read(const char *path, size_t *n) {
    char *text;
    if (pt_read_file(path, &text, n) != PT_OK) fail_msg("%s", pt_last_error());
    return text;
}

/* ---- the INI config file and the command line ---- */

static const char fz_ini_seed[] =
    "# a training run\n"
    "[model]\n"
    "vocab_size = 97\n"
    "dim = 32\n"
    "n_layers = 2\n"
    "n_heads = 4\n"
    "n_kv_heads = 2\n"
    "ffn_dim = 64\n"
    "max_seq_len = 16\n"
    "rope_theta = 10000.0\n"
    "tied_embeddings = true\n"
    "[training]\n"
    "steps = 10\n"
    "global_batch = 4\n"
    "micro_batch = 2\n"
    "seq_len = 16\n"
    "seed = 1337\n"
    "precision = fp32\n"
    "[optimizer]\n"
    "lr = 1e-3   ; inline comment\n"
    "schedule = wsd\n"
    "warmup_steps = 2\n"
    "weight_decay = 0.1\n"
    "[data]\n"
    "sources = \"web=data/web_*.bin, code=data/code_*.bin\"\n"
    "weights = 0.7, 0.3\n"
    "[checkpoint]\n"
    "dir = out/run\n"
    "every = 5\n"
    "[parallel]\n"
    "dp = 1\n";

/* Loads, validates, and parses the data mixture the way the trainer does. */
static pt_status fz_config_use(pt_config *c, pt_status st) {
    if (st != PT_OK) return st;
    pt_status v = pt_config_validate(c);
    if (v != PT_OK && !pt_last_error()[0]) fail_msg("%s: validate failed silently", fz_parser);
    if (c->data.sources[0]) {
        pt_mix_spec spec;
        pt_status m = pt_mix_parse(c->data.sources, c->data.weights, &spec);
        if (m != PT_OK && !pt_last_error()[0]) fail_msg("%s: pt_mix_parse failed silently", fz_parser);
        pt_mix_spec_free(&spec);
    }
    FILE *devnull = fopen("/dev/null", "w");
    pt_config_write(c, devnull);
    fclose(devnull);
    return PT_OK;
}

static void test_fuzz_config_ini(void **state) {
    (void)state;
    fz_begin("config.ini");
    const char *path = fz_path("fuzz.ini");
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    static pt_config c;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, fz_ini_seed, sizeof fz_ini_seed - 1, 0);
        fz_write(path, m.b, m.n);
        pt_config_defaults(&c);
        fz_arm(it);
        pt_status st = pt_config_load_file(&c, path);
        fz_check(st, PT_ERR_IO, PT_ERR_CONFIG);
        if (st == PT_OK) opened++, fz_seed_ok |= it == 0;
        fz_config_use(&c, st);
    }
    fz_report(opened, iters);
    free(m.b);
}

/* Arguments one per line; the mutations may join, split or empty them. */
static void test_fuzz_command_line(void **state) {
    (void)state;
    fz_begin("command line");
    const char *ini = fz_path("fuzz_args.ini");
    fz_write(ini, fz_ini_seed, sizeof fz_ini_seed - 1);
    char seed[2048];
    int len = snprintf(seed, sizeof seed,
                       "--training.steps=20\n--optimizer.lr\n3e-4\n--config\n%s\n"
                       "--data.sources=a=x_*.bin, b=y_*.bin\n--data.weights\n1, 3\n"
                       "--model.dim=64\n--training.threads=2\n--checkpoint.resume=latest\n", ini);
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    static pt_config c;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, seed, (size_t)len, 0);
        fz_reserve(&m, m.n + 1);
        m.b[m.n] = 0;
        char *argv[64];
        int argc = 0;
        for (char *p = (char *)m.b, *e; argc < 64; p = e + 1) {
            e = strchr(p, '\n');
            if (!e) { /* the last one, also when a NUL byte ended it early */
                if (*p) argv[argc++] = p;
                break;
            }
            *e = 0;
            argv[argc++] = p;
        }
        pt_config_defaults(&c);
        fz_arm(it);
        pt_status st = pt_config_from_args(&c, argc, argv);
        fz_check(st, PT_ERR_IO, PT_ERR_CONFIG);
        if (st == PT_OK) opened++, fz_seed_ok |= it == 0;
        fz_config_use(&c, st);
    }
    fz_report(opened, iters);
    free(m.b);
}

/* ---- Hugging Face config.json ---- */

static const char fz_hf_seed[] =
    "{\n"
    "  \"architectures\": [\"MixtralForCausalLM\"],\n"
    "  \"model_type\": \"mixtral\",\n"
    "  \"vocab_size\": 97,\n"
    "  \"hidden_size\": 64,\n"
    "  \"num_hidden_layers\": 2,\n"
    "  \"num_attention_heads\": 4,\n"
    "  \"num_key_value_heads\": 2,\n"
    "  \"intermediate_size\": 128,\n"
    "  \"max_position_embeddings\": 256,\n"
    "  \"rope_theta\": 500000.0,\n"
    "  \"rms_norm_eps\": 1e-05,\n"
    "  \"tie_word_embeddings\": false,\n"
    "  \"initializer_range\": 0.02,\n"
    "  \"hidden_act\": \"silu\",\n"
    "  \"attention_bias\": false,\n"
    "  \"attention_dropout\": 0.0,\n"
    "  \"num_local_experts\": 4,\n"
    "  \"num_experts_per_tok\": 2,\n"
    "  \"router_aux_loss_coef\": 0.01,\n"
    "  \"rope_scaling\": null,\n"
    "  \"head_dim\": 16,\n"
    "  \"bos_token_id\": null,\n"
    "  \"torch_dtype\": \"float32\"\n"
    "}\n";

static void test_fuzz_hf_config(void **state) {
    (void)state;
    fz_begin("config.json");
    const char *path = fz_path("config.json");
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, fz_hf_seed, sizeof fz_hf_seed - 1, 0);
        fz_write(path, m.b, m.n);
        pt_model_config c;
        fz_arm(it);
        pt_status st = pt_hf_config_read(path, &c);
        fz_check(st, PT_ERR_IO, PT_ERR_CONFIG);
        if (st == PT_OK) {
            opened++, fz_seed_ok |= it == 0;
            (void)pt_hf_unmapped_reason(&c);
        }
    }
    fz_report(opened, iters);
    free(m.b);
}

/* ---- checkpoint index.json ---- */

/* A 4 × 3 matrix and a vector of 5, each split over two shards. */
static pt_param_table fz_table(void) {
    pt_param_table t = {0};
    t.n = 2;
    t.p = calloc(2, sizeof *t.p);
    snprintf(t.p[0].name, sizeof t.p[0].name, "w");
    t.p[0].ndim = 2, t.p[0].shape[0] = 4, t.p[0].shape[1] = 3, t.p[0].numel = 12;
    snprintf(t.p[1].name, sizeof t.p[1].name, "b");
    t.p[1].ndim = 1, t.p[1].shape[0] = 5, t.p[1].numel = 5, t.p[1].offset = 12;
    t.total = 17;
    return t;
}

/* One shard: for each block [tensor, r0, r1, c0, c1], the three kinds' tensors as the
 * checkpoint writer names them; returns its CRC-32. */
static uint32_t fz_write_ckpt_shard(const char *path, const int64_t (*blocks)[5], int n) {
    static const char *const kinds[3] = {"params", "exp_avg", "exp_avg_sq"};
    pt_st_writer *w = pt_st_writer_create();
    float v[16];
    for (int i = 0; i < 16; i++) v[i] = 0.25f * (float)i;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            char name[96];
            snprintf(name, sizeof name, "%s@%d@%lld@%lld", kinds[k], (int)blocks[i][0],
                     (long long)blocks[i][1], (long long)blocks[i][3]);
            int64_t shape[2] = {blocks[i][2] - blocks[i][1], blocks[i][4] - blocks[i][3]};
            assert_int_equal(pt_st_writer_add_f32(w, name, shape, 2, v, PT_ST_DTYPE_F32), PT_OK);
        }
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    size_t len;
    char *data = fz_read(path, &len);
    uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), (const Bytef *)data, (uInt)len);
    free(data);
    return crc;
}

static void test_fuzz_checkpoint_index(void **state) {
    (void)state;
    fz_begin("index.json");
    const char *dir = fz_path("ckpt");
    pt_mkdirs(dir);
    char s0[700], s1[700], path[700], seed[2048];
    snprintf(s0, sizeof s0, "%s/shard_0.safetensors", dir);
    snprintf(s1, sizeof s1, "%s/shard_1.safetensors", dir);
    snprintf(path, sizeof path, "%s/index.json", dir);
    static const int64_t b0[2][5] = {{0, 0, 2, 0, 3}, {1, 0, 3, 0, 1}};
    static const int64_t b1[2][5] = {{0, 2, 4, 0, 3}, {1, 3, 5, 0, 1}};
    uint32_t c0 = fz_write_ckpt_shard(s0, b0, 2), c1 = fz_write_ckpt_shard(s1, b1, 2);
    int len = snprintf(seed, sizeof seed,
                       "{\"format\": \"pentatron-checkpoint-2\", \"step\": 7, \"optimizer_step\": 6,\n"
                       " \"aux_f\": [0.25, 0.75],\n"
                       " \"tensors\": [{\"name\": \"w\", \"shape\": [4, 3], \"offset\": 0},\n"
                       "             {\"name\": \"b\", \"shape\": [5], \"offset\": 12}],\n"
                       " \"shards\": [{\"file\": \"shard_0.safetensors\", \"crc32\": \"%08x\",\n"
                       "              \"blocks\": [[0, 0, 2, 0, 3], [1, 0, 3, 0, 1]]},\n"
                       "             {\"file\": \"shard_1.safetensors\", \"crc32\": \"%08x\",\n"
                       "              \"blocks\": [[0, 2, 4, 0, 3], [1, 3, 5, 0, 1]]}]}\n",
                       c0, c1);
    pt_param_table t = fz_table();
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, seed, (size_t)len, 0);
        fz_write(path, m.b, m.n);
        pt_ckpt *c = NULL;
        fz_arm(it);
        pt_status st = pt_ckpt_open(&c, dir, &t);
        fz_check(st, PT_ERR_IO, PT_ERR_FORMAT);
        if (st != PT_OK) {
            assert_null(c);
            continue;
        }
        opened++, fz_seed_ok |= it == 0;
        /* every kind of every tensor, whole and one row, into buffers of exactly that size */
        for (int k = PT_CKPT_PARAMS; k <= PT_CKPT_EXP_AVG_SQ; k++)
            for (int i = 0; i < t.n; i++) {
                int64_t rows = t.p[i].shape[0], cols = t.p[i].ndim == 2 ? t.p[i].shape[1] : 1;
                float *out = malloc((size_t)(rows * cols) * sizeof *out);
                fz_arm(it);
                fz_check(pt_ckpt_read_block(c, k, i, 0, rows, 0, cols, out), PT_ERR_IO, PT_ERR_FORMAT);
                fz_arm(it);
                fz_check(pt_ckpt_read_block(c, k, i, rows - 1, rows, 0, cols, out), PT_ERR_IO,
                         PT_ERR_FORMAT);
                free(out);
            }
        double f[2];
        (void)pt_ckpt_aux_f(c, f, 2);
        pt_ckpt_close(c);
    }
    fz_report(opened, iters);
    free(m.b);
    free(t.p);
}

/* ---- token shards ---- */

static void test_fuzz_token_shards(void **state) {
    (void)state;
    fz_begin("token shards");
    const char *dir = fz_path("shards");
    pt_mkdirs(dir);
    char p16[700], p32[700], glob[700], seed16[700], seed32[700];
    snprintf(p16, sizeof p16, "%s/train_000000.bin", dir);
    snprintf(p32, sizeof p32, "%s/train_000001.bin", dir);
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    snprintf(seed16, sizeof seed16, "%s/seed16", fz_path(""));
    snprintf(seed32, sizeof seed32, "%s/seed32", fz_path(""));
    uint16_t t16[120];
    uint32_t t32[90];
    for (int i = 0; i < 120; i++) t16[i] = (uint16_t)(i * 7 % 97);
    for (int i = 0; i < 90; i++) t32[i] = (uint32_t)(i * 5 % 97);
    assert_int_equal(pt_shard_write(seed16, t16, 120), PT_OK);
    assert_int_equal(pt_shard_write32(seed32, t32, 90), PT_OK);
    size_t n16, n32;
    char *s16 = fz_read(seed16, &n16), *s32 = fz_read(seed32, &n32);
    char sources[1500];
    snprintf(sources, sizeof sources, "one=%s/train_000000.bin, two=%s/train_000001.bin", dir, dir);
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    const int T = 8;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        /* one shard mutated (its header in half the byte edits), the other intact */
        int which = (int)(fz_next() & 1);
        fz_mutate(&m, which ? s32 : s16, which ? n32 : n16, 12);
        fz_write(which ? p32 : p16, m.b, m.n);
        fz_write(which ? p16 : p32, which ? s16 : s32, which ? n16 : n32);
        int vocab = fz_next() & 1 ? 97 : 0, shuffle = (int)(fz_next() & 1);
        int32_t in[8], tg[8];
        pt_status st;
        if (fz_next() & 1) {
            pt_data d;
            fz_arm(it);
            st = pt_data_open(&d, glob, T, shuffle, 5, vocab);
            fz_check(st, PT_ERR_IO, PT_ERR_FORMAT);
            if (st == PT_OK) {
                for (int64_t r = 0; r < d.n_rows; r++) pt_data_read_row(&d, r, in, tg);
                for (int64_t s = 0; s < 3; s++) {
                    int32_t bin[4 * 8], btg[4 * 8];
                    pt_data_batch(&d, s, 4, 0, 4, bin, btg);
                }
                pt_data_close(&d);
            }
        } else {
            pt_mix m2;
            fz_arm(it);
            st = pt_mix_open(&m2, NULL, sources, "0.25, 0.75", T, shuffle, 5, vocab);
            fz_check(st, PT_ERR_IO, PT_ERR_CONFIG);
            if (st == PT_OK) {
                for (int64_t s = 0; s < 3; s++) {
                    int32_t bin[4 * 8], btg[4 * 8];
                    pt_mix_batch(&m2, s, 4, 0, 4, bin, btg);
                }
                pt_mix_close(&m2);
            }
        }
        if (st == PT_OK) opened++, fz_seed_ok |= it == 0;
    }
    fz_report(opened, iters);
    free(m.b);
    free(s16);
    free(s32);
}

/* ---- flight records (pentatron trace why) ---- */

/* The seed: this process's own record, made by the recorder (two groups, communications entered
 * and completed, the ring wrapped, one pending and waited in) and mapped into a file; each
 * mutation is read as rank 0's record of a world of 2. */
static void test_fuzz_flight_records(void **state) {
    (void)state;
    fz_begin("flight records");
    const char *dir = fz_path("flight");
    pt_mkdirs(dir);
    pt_flight_start(0, 2);
    int members[] = {0, 1};
    int dp = pt_flight_group_add("dp", 0, 2, members), world = pt_flight_group_add("world", 0, 2, NULL);
    uint64_t seq;
    for (int i = 0; i < 300; i++) { /* the ring wraps */
        int g = i % 3 ? dp : world;
        uint64_t id = pt_flight_enter(g, i % 5 ? PT_COMM_ALLREDUCE : PT_COMM_SEND, i % 5 ? -1 : 1, 64, &seq);
        if (i < 299) pt_flight_done(id, g, i % 5 ? PT_COMM_ALLREDUCE : PT_COMM_SEND, seq);
    }
    pt_flight_wait_begin(dp, PT_COMM_ALLREDUCE, seq, -1);
    pt_flight_set_label("dp0 pp0 cp0 tp0");
    pt_mkdirs(fz_path("flight-seed"));
    assert_int_equal(pt_flight_file(fz_path("flight-seed")), PT_OK);
    const pt_flight_state *self = pt_flight_self();
    size_t n = self->bytes;
    char *seed = malloc(n);
    memcpy(seed, self, n);
    char p0[700];
    snprintf(p0, sizeof p0, "%s/flight-rank0.bin", dir);
    FILE *null = fopen("/dev/null", "w");
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        /* half the byte edits in the header and group table, where counts and indices are */
        fz_mutate(&m, seed, n, sizeof(pt_flight_state) - sizeof self->ring);
        fz_write(p0, m.b, m.n);
        fz_arm(it);
        pt_status st = pt_flight_why(dir, null);
        fz_check(st, PT_ERR_IO, PT_ERR_FORMAT);
        if (st == PT_OK) opened++, fz_seed_ok |= it == 0;
    }
    fclose(null);
    fz_report(opened, iters);
    free(m.b);
    free(seed);
}

/* ---- tokenizer.json and .tiktoken ---- */

/* GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 upwards in order. */
static void fz_byte_char(int byte, char out[3]) {
    static int map[256], made;
    if (!made) {
        for (int b = 0, k = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            map[b] = printable ? b : 256 + k++;
        }
        made = 1;
    }
    int cp = map[byte];
    memset(out, 0, 3);
    if (cp < 0x80) {
        out[0] = (char)cp;
    } else {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
    }
}

/* A byte-level BPE tokenizer.json: the 256 bytes, "Ġt" "he" "Ġthe" from three merges, an added
 * <|endoftext|>, NFC, a Split regex then ByteLevel. */
static char *fz_bytelevel_seed(void) {
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char u[3];
        fz_byte_char(b, u);
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0t", json_integer(256));
    json_object_set_new(vocab, "he", json_integer(257));
    json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
    json_t *j = json_pack(
        "{s:[{s:i, s:s, s:b, s:b}], s:{s:s}, "
        "s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b}]}, s:{s:s}, "
        "s:{s:s, s:o, s:[s, [ss], s], s:b}}",
        "added_tokens", "id", 259, "content", "<|endoftext|>", "special", 1, "normalized", 0,
        "normalizer", "type", "NFC",
        "pre_tokenizer", "type", "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t)| ?\\p{L}+| ?\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "use_regex", 0,
        "decoder", "type", "ByteLevel",
        "model", "type", "BPE", "vocab", vocab, "merges", "\xc4\xa0 t", "h", "e", "\xc4\xa0t he",
        "ignore_merges", 0);
    char *s = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    return s;
}

/* A SentencePiece-style tokenizer.json: <unk> <s> </s>, the <0xNN> tokens, then ▁ a b ▁a ab;
 * Prepend and Replace normalizers, byte_fallback. */
#define FZ_SP "\xe2\x96\x81"
static char *fz_sentencepiece_seed(void) {
    json_t *vocab = json_object(), *added = json_array();
    static const char *const special[3] = {"<unk>", "<s>", "</s>"};
    for (int i = 0; i < 3; i++) {
        json_object_set_new(vocab, special[i], json_integer(i));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b}", "id", i, "content",
                                               special[i], "special", 1, "normalized", 0));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(3 + b));
    }
    static const char *const pieces[] = {FZ_SP, "a", "b", FZ_SP "a", "ab"};
    for (int i = 0; i < 5; i++) json_object_set_new(vocab, pieces[i], json_integer(259 + i));
    json_t *j = json_pack(
        "{s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n, s:{s:s}, "
        "s:{s:s, s:o, s:[ss], s:s, s:b, s:b}}",
        "added_tokens", added,
        "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend", FZ_SP,
        "type", "Replace", "pattern", "String", " ", "content", FZ_SP,
        "pre_tokenizer",
        "decoder", "type", "ByteFallback",
        "model", "type", "BPE", "vocab", vocab, "merges", FZ_SP " a", "a b", "unk_token", "<unk>",
        "byte_fallback", 1, "fuse_unk", 1);
    char *s = json_dumps(j, JSON_INDENT(1));
    json_decref(j);
    return s;
}

/* A tiktoken ranks file of the 256 bytes and a few merges (valid lines; refused as a whole since
 * only cl100k_base's ranks are read, so the mutations exercise the line parser). */
static char *fz_tiktoken_seed(size_t *n) {
    static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    static const char *const merges[] = {"IHQ=", "aGU=", "IHRoZQ==", "aW4=", "ZXI="};
    size_t cap = 8192, len = 0;
    char *s = malloc(cap);
    for (int b = 0; b < 256; b++)
        len += (size_t)snprintf(s + len, cap - len, "%c%c== %d\n", b64[b >> 2], b64[(b & 3) << 4], b);
    for (int i = 0; i < 5; i++) len += (size_t)snprintf(s + len, cap - len, "%s %d\n", merges[i], 256 + i);
    *n = len;
    return s;
}

/* What an opened tokenizer must do with any text: encode it into ids below its vocabulary size,
 * and decode them. */
static void fz_tokenizer_use(pt_tokenizer *t, int it) {
    static const char text[] = "The cat's 123 h\xc3\xa9llo  <|endoftext|>\n\xff\xfe ab <s>ba\xe2\x96\x81";
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    fz_arm(it);
    pt_status st = pt_tokenizer_encode(t, text, sizeof text - 1, &ids, &n, &cap);
    fz_check(st, PT_ERR_FORMAT, PT_ERR_RUNTIME);
    if (st == PT_OK) {
        int vs = pt_tokenizer_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vs)
                fail_msg("%s, iteration %d: id %d outside the vocabulary of %d", fz_parser, it,
                         (int)ids[i], vs);
        size_t len;
        fz_arm(it);
        char *d = pt_tokenizer_decode(t, ids, n, &len);
        alarm(0);
        if (!d && !pt_last_error()[0]) fail_msg("%s: decode failed silently", fz_parser);
        free(d);
    }
    free(ids);
    (void)pt_tokenizer_eot(t);
}

/* Opens the tokenizer at path and, when it opens, uses it; 1 if it opened. */
static int fz_tokenizer_try(const char *path, int it) {
    pt_tokenizer *t = NULL;
    fz_arm(it);
    pt_status st = pt_tokenizer_open(&t, path);
    fz_check(st, PT_ERR_IO, PT_ERR_RUNTIME);
    if (st != PT_OK) {
        assert_null(t);
        return 0;
    }
    fz_seed_ok |= it == 0;
    fz_tokenizer_use(t, it);
    pt_tokenizer_free(t);
    return 1;
}

static void fz_tokenizer_run(const char *parser, const char *file, const char *seed, size_t n) {
    fz_begin(parser);
    const char *path = fz_path(file);
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, seed, n, 0);
        fz_write(path, m.b, m.n);
        opened += fz_tokenizer_try(path, it);
    }
    if (strcmp(file, "fuzz.tiktoken") != 0) {
        fz_report(opened, iters);
    } else { /* nothing but cl100k_base opens */
        print_message("fuzz %s: %d inputs, %d accepted\n", fz_parser, iters, opened);
        assert_int_equal(opened, 0);
    }
    free(m.b);
}

/* GPT-2's two files (--vocab DIR): encoder.json of the 256 bytes, "Ġt" "he" "Ġthe" and
 * <|endoftext|>, and vocab.bpe's three merges; one of the two mutated. */
static void test_fuzz_gpt2_vocab_dir(void **state) {
    (void)state;
    fz_begin("encoder.json + vocab.bpe");
    json_t *enc = json_object();
    for (int b = 0; b < 256; b++) {
        char u[3];
        fz_byte_char(b, u);
        json_object_set_new(enc, u, json_integer(b));
    }
    json_object_set_new(enc, "\xc4\xa0t", json_integer(256));
    json_object_set_new(enc, "he", json_integer(257));
    json_object_set_new(enc, "\xc4\xa0the", json_integer(258));
    json_object_set_new(enc, "<|endoftext|>", json_integer(259));
    char *enc_seed = json_dumps(enc, JSON_INDENT(1));
    json_decref(enc);
    static const char bpe_seed[] = "#version: 0.2\n\xc4\xa0 t\nh e\n\xc4\xa0t he\n";
    const char *dir = fz_path("gpt2");
    pt_mkdirs(dir);
    char enc_path[700], bpe_path[700];
    snprintf(enc_path, sizeof enc_path, "%s/encoder.json", dir);
    snprintf(bpe_path, sizeof bpe_path, "%s/vocab.bpe", dir);
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        int which = (int)(fz_next() & 1);
        fz_mutate(&m, which ? bpe_seed : enc_seed, which ? sizeof bpe_seed - 1 : strlen(enc_seed), 0);
        fz_write(which ? bpe_path : enc_path, m.b, m.n);
        fz_write(which ? enc_path : bpe_path, which ? enc_seed : bpe_seed,
                 which ? strlen(enc_seed) : sizeof bpe_seed - 1);
        opened += fz_tokenizer_try(dir, it);
    }
    fz_report(opened, iters);
    free(m.b);
    free(enc_seed);
}

static void test_fuzz_tokenizer_json_bytelevel(void **state) {
    (void)state;
    char *seed = fz_bytelevel_seed();
    fz_tokenizer_run("tokenizer.json (byte-level)", "tokenizer.json", seed, strlen(seed));
    free(seed);
}

static void test_fuzz_tokenizer_json_sentencepiece(void **state) {
    (void)state;
    char *seed = fz_sentencepiece_seed();
    fz_tokenizer_run("tokenizer.json (SentencePiece)", "sp.json", seed, strlen(seed));
    free(seed);
}

static void test_fuzz_tiktoken(void **state) {
    (void)state;
    size_t n;
    char *seed = fz_tiktoken_seed(&n);
    fz_tokenizer_run("tiktoken", "fuzz.tiktoken", seed, n);
    free(seed);
}

/* ---- safetensors (its header as JSON; tests/test_safetensors.c fuzzes its bytes) ---- */

static void test_fuzz_safetensors_header(void **state) {
    (void)state;
    fz_begin("safetensors");
    const char *seed_path = fz_path("seed.safetensors"), *path = fz_path("fuzz.safetensors");
    float a[6] = {1, 2, 3, 4, 5, 6};
    int64_t ids[2] = {3, 4}, sa[2] = {2, 3}, sb[1] = {3}, si[1] = {2};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "a", sa, 2, a, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "b", sb, 1, a, PT_ST_DTYPE_BF16), PT_OK);
    assert_int_equal(pt_st_writer_add_raw(w, "ids", PT_ST_DTYPE_I64, si, 1, ids), PT_OK);
    assert_int_equal(pt_st_writer_set_meta(w, "format", "pt"), PT_OK);
    assert_int_equal(pt_st_writer_write(w, seed_path), PT_OK);
    pt_st_writer_free(w);
    size_t n;
    char *seed = fz_read(seed_path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | (uint8_t)seed[i];
    /* the header's JSON is mutated and its 8-byte length rewritten to match (else nearly every
     * mutation is refused at the length) */
    fz_buf m = {0};
    int iters = fz_iters(), opened = 0;
    for (int it = 0; it < iters; it++) {
        fz_iter = it;
        fz_mutate(&m, seed + 8, (size_t)hlen, 0);
        uint64_t h = m.n;
        fz_splice(&m, m.n, 0, seed + 8 + hlen, n - 8 - (size_t)hlen);
        uint8_t le[8];
        for (int i = 0; i < 8; i++) le[i] = (uint8_t)(h >> (8 * i));
        fz_splice(&m, 0, 0, le, 8);
        fz_write(path, m.b, m.n);
        pt_st_file *f = NULL;
        fz_arm(it);
        pt_status st = pt_st_open(&f, path);
        fz_check(st, PT_ERR_IO, PT_ERR_FORMAT);
        if (st != PT_OK) continue;
        opened++, fz_seed_ok |= it == 0;
        for (int i = 0; i < pt_st_count(f); i++) {
            const pt_st_tensor *t = pt_st_tensor_at(f, i);
            const uint8_t *p = pt_st_tensor_data(f, t);
            unsigned sum = 0;
            for (uint64_t k = 0; k < t->nbytes; k++) sum += p[k];
            (void)sum;
            float *buf = malloc((size_t)t->numel * 4 + 1);
            fz_arm(it);
            fz_check(pt_st_read_f32(f, t->name, t->shape, t->ndim, buf), PT_ERR_IO, PT_ERR_FORMAT);
            free(buf);
        }
        pt_st_close(f);
    }
    fz_report(opened, iters);
    free(m.b);
    free(seed);
}

/* ---- inputs fuzzing found ---- */

/* A byte-level tokenizer.json whose added_tokens is empty: the added tokens were sorted with
 * qsort(NULL, 0, ...) (UBSan: null pointer passed as argument 1). It opens, with no separator
 * token, and encodes. */
static void test_fuzz_found_tokenizer_no_added_tokens(void **state) {
    (void)state;
    fz_begin("regression");
    char *seed = fz_bytelevel_seed();
    json_error_t e;
    json_t *j = json_loads(seed, 0, &e);
    free(seed);
    assert_non_null(j);
    json_object_set_new(j, "added_tokens", json_array());
    const char *path = fz_path("no_added.json");
    assert_int_equal(json_dump_file(j, path, 0), 0);
    json_decref(j);
    pt_tokenizer *t = NULL;
    if (pt_tokenizer_open(&t, path) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(pt_tokenizer_eot(t), -1);
    fz_tokenizer_use(t, 0);
    pt_tokenizer_free(t);
}

/* A SentencePiece-style tokenizer.json whose first vocabulary entry is the empty token: its
 * zero bytes were copied into the still unallocated table (UBSan: memcpy to a null pointer). */
static void test_fuzz_found_sentencepiece_empty_first_token(void **state) {
    (void)state;
    fz_begin("regression");
    char *seed = fz_sentencepiece_seed();
    json_error_t e;
    json_t *j = json_loads(seed, 0, &e);
    free(seed);
    assert_non_null(j);
    json_t *model = json_object_get(j, "model"), *old = json_object_get(model, "vocab");
    json_t *vocab = json_object(), *v;
    const char *k;
    json_object_set_new(vocab, "", json_integer(264));
    json_object_foreach(old, k, v) json_object_set(vocab, k, v);
    json_object_set_new(model, "vocab", vocab);
    const char *path = fz_path("empty_first.json");
    assert_int_equal(json_dump_file(j, path, 0), 0);
    json_decref(j);
    assert_int_equal(fz_tokenizer_try(path, 0), 1);
}

int main(void) {
    const char *filter = getenv("PT_TEST_FILTER");
    if (filter) cmocka_set_test_filter(filter);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fuzz_config_ini),
        cmocka_unit_test(test_fuzz_command_line),
        cmocka_unit_test(test_fuzz_hf_config),
        cmocka_unit_test(test_fuzz_checkpoint_index),
        cmocka_unit_test(test_fuzz_token_shards),
        cmocka_unit_test(test_fuzz_flight_records),
        cmocka_unit_test(test_fuzz_tokenizer_json_bytelevel),
        cmocka_unit_test(test_fuzz_tokenizer_json_sentencepiece),
        cmocka_unit_test(test_fuzz_tiktoken),
        cmocka_unit_test(test_fuzz_gpt2_vocab_dir),
        cmocka_unit_test(test_fuzz_safetensors_header),
        cmocka_unit_test(test_fuzz_found_tokenizer_no_added_tokens),
        cmocka_unit_test(test_fuzz_found_sentencepiece_empty_first_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
