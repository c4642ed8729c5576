/* test_safetensors.c: safetensors round trips, a hand-written file, hostile files (each must be
 * PT_ERR_FORMAT naming the file and the tensor), truncation and corruption fuzzing, sharded
 * checkpoint directories, and Hugging Face config.json reading and writing. */
#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"

#include "pt/hf_config.h"
#include "pt/safetensors.h"

/* ---- helpers ---- */

/* Paths of files in the test's temporary directory; a few live at once. */
static const char *tpath(const char *name) {
    static char bufs[8][512];
    static int k;
    char *b = bufs[k++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", tu_tmpdir(), name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    /* a fresh file, not a truncated one: ext4 flushes a file truncated and rewritten on close,
     * which makes the fuzz loops wait on the disk */
    remove(path);
    FILE *fp = fopen(path, "wb");
    if (!fp) fail_msg("cannot create %s", path);
    if (n && fwrite(data, 1, n, fp) != n) fail_msg("cannot write %s", path);
    fclose(fp);
}

static uint8_t *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (!fp) fail_msg("cannot open %s", path);
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)len + 1);
    if (len && fread(b, 1, (size_t)len, fp) != (size_t)len) fail_msg("cannot read %s", path);
    fclose(fp);
    *n = (size_t)len;
    return b;
}

/* An independent writer: 8-byte little-endian `hlen`, the header text, then `data`. */
static void write_st_raw(const char *path, uint64_t hlen, const char *header, const void *data,
                         size_t n) {
    size_t h = strlen(header);
    uint8_t *b = calloc(8 + h + n + 1, 1);
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, header, h);
    if (n) memcpy(b + 8 + h, data, n);
    write_bytes(path, b, 8 + h + n);
    free(b);
}

static void write_st(const char *path, const char *header, const void *data, size_t n) {
    write_st_raw(path, strlen(header), header, data, n);
}

static void expect_msg_contains(const char *needle) {
    if (needle && !strstr(pt_last_error(), needle))
        fail_msg("error message \"%s\" does not contain \"%s\"", pt_last_error(), needle);
}

/* Opening `path` must fail with PT_ERR_FORMAT, and the message name the file, the tensor (when
 * given) and contain `phrase` (which says which check fired). */
static void expect_open_format_error(const char *path, const char *tensor, const char *phrase) {
    pt_st_file *f = (pt_st_file *)1;
    pt_status st = pt_st_open(&f, path);
    if (st != PT_ERR_FORMAT)
        fail_msg("opening %s: status %d, expected PT_ERR_FORMAT (%d); message: %s", path, (int)st,
                 (int)PT_ERR_FORMAT, st == PT_OK ? "(none)" : pt_last_error());
    assert_null(f);
    expect_msg_contains(path);
    expect_msg_contains(tensor);
    expect_msg_contains(phrase);
}

static pt_st_file *open_ok(const char *path) {
    pt_st_file *f = NULL;
    pt_status st = pt_st_open(&f, path);
    if (st != PT_OK) fail_msg("opening %s: %s", path, pt_last_error());
    return f;
}


/* ---- writing and reading back ---- */

static void test_roundtrip_f32_i32_i64_metadata(void **state) {
    (void)state;
    const char *path = tpath("rt_f32.safetensors");
    float a[12], b[5], s = 3.25f;
    tu_fill(a, 12, 1, 2.0f);
    tu_fill(b, 5, 2, 1e-3f);
    int32_t ids[4] = {0, -7, 2147483647, -2147483647 - 1};
    int64_t big[3] = {1, -2, 3};
    int64_t sa[2] = {3, 4}, sb[1] = {5}, si[1] = {4}, sl[1] = {3}, sz[2] = {0, 7};

    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(
        pt_st_writer_add_f32(w, "model.embed_tokens.weight", sa, 2, a, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "model.norm.weight", sb, 1, b, PT_ST_DTYPE_F32),
                     PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "scalar", NULL, 0, &s, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_raw(w, "ids", PT_ST_DTYPE_I32, si, 1, ids), PT_OK);
    assert_int_equal(pt_st_writer_add_raw(w, "big", PT_ST_DTYPE_I64, sl, 1, big), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "empty", sz, 2, NULL, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_set_meta(w, "format", "pt"), PT_OK);
    assert_int_equal(pt_st_writer_set_meta(w, "step", "12"), PT_OK);
    assert_int_equal(pt_st_writer_set_meta(w, "step", "13"), PT_OK); /* overrides */
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);

    /* The reference layout: header size a multiple of 8, padded with spaces, no PATH.tmp left. */
    size_t n;
    uint8_t *raw = read_bytes(path, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | raw[i];
    assert_int_equal(hlen % 8, 0);
    assert_true(hlen + 8 <= n);
    assert_int_equal(raw[8], '{');
    size_t last = 8 + hlen - 1;
    while (raw[last] == ' ') last--;
    assert_int_equal(raw[last], '}');
    assert_int_equal(n, 8 + hlen + 12 * 4 + 5 * 4 + 4 + 4 * 4 + 3 * 8);
    free(raw);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_not_equal(access(tmp, F_OK), 0);

    pt_st_file *f = open_ok(path);
    assert_int_equal(pt_st_count(f), 6);
    const pt_st_tensor *t = pt_st_find(f, "model.embed_tokens.weight");
    assert_non_null(t);
    assert_int_equal(t->dtype, PT_ST_DTYPE_F32);
    assert_int_equal(t->ndim, 2);
    assert_int_equal(t->shape[0], 3);
    assert_int_equal(t->shape[1], 4);
    assert_int_equal(t->numel, 12);
    /* every tensor is aligned to its element size within the data region */
    for (int i = 0; i < pt_st_count(f); i++) {
        const pt_st_tensor *u = pt_st_tensor_at(f, i);
        assert_int_equal(u->offset % pt_st_dtype_size(u->dtype), 0);
        if (i) assert_true(strcmp(pt_st_tensor_at(f, i - 1)->name, u->name) < 0);
    }
    float ga[12], gb[5], gs = 0;
    assert_int_equal(pt_st_read_f32(f, "model.embed_tokens.weight", sa, 2, ga), PT_OK);
    assert_memory_equal(ga, a, sizeof a);
    assert_int_equal(pt_st_read_f32(f, "model.norm.weight", sb, 1, gb), PT_OK);
    assert_memory_equal(gb, b, sizeof b);
    assert_int_equal(pt_st_read_f32(f, "scalar", NULL, 0, &gs), PT_OK);
    assert_int_equal(pt_st_find(f, "scalar")->ndim, 0);
    assert_int_equal(pt_st_find(f, "scalar")->numel, 1);
    assert_true(gs == s);
    int32_t gi[4], gl[3];
    assert_int_equal(pt_st_read_i32(f, "ids", si, 1, gi), PT_OK);
    assert_memory_equal(gi, ids, sizeof ids);
    assert_int_equal(pt_st_read_i32(f, "big", sl, 1, gl), PT_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(gl[i], big[i]);
    assert_int_equal(pt_st_find(f, "empty")->numel, 0);
    assert_int_equal(pt_st_read_f32(f, "empty", sz, 2, NULL), PT_OK);
    assert_string_equal(pt_st_meta_get(f, "format"), "pt");
    assert_string_equal(pt_st_meta_get(f, "step"), "13");
    assert_null(pt_st_meta_get(f, "absent"));
    assert_int_equal(pt_st_meta_count(f), 2);
    const char *k, *v;
    pt_st_meta_at(f, 1, &k, &v);
    assert_string_equal(k, "step");
    assert_string_equal(v, "13");
    pt_st_close(f);
}

static void test_bf16_rounding_hand_computed(void **state) {
    (void)state;
    /* value -> expected bf16 bits, worked out by hand from the float32 bits:
     *   1 + 2^-8      = 0x3F808000: exact tie, the kept lsb is 0 -> stays 0x3F80 (1.0)
     *   1 + 3·2^-8    = 0x3F818000: exact tie, the kept lsb is 1 -> up to 0x3F82 (1.015625)
     *   1 + 2^-8 + 2^-20 = 0x3F808008: above the tie -> 0x3F81 (1.0078125)
     *   pi            = 0x40490FDB: low half 0x0FDB < 0x8000 -> 0x4049 (3.140625)
     *   -e            = 0xC02DF854: low half 0xF854 > 0x8000 -> 0xC02E (-2.71875)
     *   FLT_MAX       = 0x7F7FFFFF: rounds up out of range -> 0x7F80 (+inf)
     *   -0.0          = 0x80000000 -> 0x8000 */
    const uint32_t in[] = {0x3F808000u, 0x3F818000u, 0x3F808008u, 0x40490FDBu,
                           0xC02DF854u, 0x7F7FFFFFu, 0x80000000u};
    const uint16_t want[] = {0x3F80, 0x3F82, 0x3F81, 0x4049, 0xC02E, 0x7F80, 0x8000};
    const float want_f[] = {1.0f, 1.015625f, 1.0078125f, 3.140625f, -2.71875f, INFINITY, -0.0f};
    enum { N = sizeof in / sizeof in[0] };
    float x[N];
    for (int i = 0; i < N; i++) {
        x[i] = tu_f32_from_bits(in[i]);
        if (pt_f32_to_bf16(x[i]) != want[i])
            fail_msg("bf16(0x%08X) = 0x%04X, expected 0x%04X", in[i], pt_f32_to_bf16(x[i]),
                     want[i]);
    }
    assert_true(isnan(pt_bf16_to_f32(pt_f32_to_bf16(NAN))));

    const char *path = tpath("rt_bf16.safetensors");
    int64_t shape[1] = {N};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "w", shape, 1, x, PT_ST_DTYPE_BF16), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);

    pt_st_file *f = open_ok(path);
    const pt_st_tensor *t = pt_st_find(f, "w");
    assert_non_null(t);
    assert_int_equal(t->dtype, PT_ST_DTYPE_BF16);
    assert_int_equal(t->nbytes, 2 * N);
    const uint8_t *raw = pt_st_tensor_data(f, t);
    float back[N];
    assert_int_equal(pt_st_read_f32(f, "w", shape, 1, back), PT_OK);
    for (int i = 0; i < N; i++) {
        uint16_t h = (uint16_t)(raw[2 * i] | raw[2 * i + 1] << 8);
        assert_int_equal(h, want[i]);
        if (tu_f32_bits(back[i]) != tu_f32_bits(want_f[i]))
            fail_msg("element %d read back as %g, expected %g", i, (double)back[i],
                     (double)want_f[i]);
    }
    pt_st_close(f);

    /* a larger tensor: every element within bf16's half-ulp of the original (8 significant bits:
     * relative 2^-8) */
    enum { M = 1 << 19 };
    float *big = malloc(M * sizeof *big), *got = malloc(M * sizeof *got);
    tu_fill(big, M, 7, 3.0f);
    int64_t bshape[2] = {512, M / 512};
    w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "big", bshape, 2, big, PT_ST_DTYPE_BF16), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    f = open_ok(path);
    assert_int_equal(pt_st_read_f32(f, "big", bshape, 2, got), PT_OK);
    for (int i = 0; i < M; i++) {
        if (got[i] != pt_bf16_to_f32(pt_f32_to_bf16(big[i])) ||
            fabsf(got[i] - big[i]) > fabsf(big[i]) * 0x1p-8f)
            fail_msg("element %d: %.9g -> %.9g", i, (double)big[i], (double)got[i]);
    }
    pt_st_close(f);
    free(big);
    free(got);
}

static void test_f16_decoding(void **state) {
    (void)state;
    const uint16_t in[] = {0x3C00, 0xC000, 0x0001, 0x03FF, 0x0400,
                           0x7BFF, 0x7C00, 0xFC00, 0x8000, 0x3555};
    const float want[] = {1.0f,     -2.0f,    0x1p-24f,  1023 * 0x1p-24f, 0x1p-14f,
                          65504.0f, INFINITY, -INFINITY, -0.0f,           0.333251953125f};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        float got = pt_f16_to_f32(in[i]);
        if (tu_f32_bits(got) != tu_f32_bits(want[i]))
            fail_msg("f16 0x%04X -> %.9g, expected %.9g", in[i], (double)got, (double)want[i]);
    }
    assert_true(isnan(pt_f16_to_f32(0x7E00)));
}

/* A file built by hand (an unpadded header, keys in no particular order, unaligned tensors),
 * as an independent writer could produce it. */
static void test_reads_hand_written_file(void **state) {
    (void)state;
    const char *path = tpath("hand.safetensors");
    const char *header = "{\"b\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[16,20]},"
                         " \"__metadata__\": {\"note\": \"h\\u00e9\", \"format\": \"pt\"},"
                         "\"a\":{\"shape\":[2,2],\"dtype\":\"F32\",\"data_offsets\":[0,16]},"
                         "\"h\":{\"dtype\":\"F16\",\"shape\":[3],\"data_offsets\":[20,26]},"
                         "\"i\":{\"dtype\":\"I64\",\"shape\":[1,1],\"data_offsets\":[26,34]},"
                         "\"d\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[34,42]}}";
    const uint8_t data[] = {
        0x00, 0x00, 0x80, 0x3F, 0x00, 0x00, 0x00, 0x40, /* a: 1.0f, 2.0f */
        0x00, 0x00, 0x40, 0x40, 0x00, 0x00, 0x80, 0xC0, /*    3.0f, -4.0f */
        0xC0, 0x3F, 0x20, 0xC0,                         /* b: bf16 1.5, -2.5 */
        0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00,             /* h: f16 1.0, -2.0, 2^-24 */
        0x07, 0,    0,    0,    0,    0,    0,    0,    /* i: 7 */
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xF8, 0x3F, /* d: 1.5 */
    };
    write_st(path, header, data, sizeof data);
    pt_st_file *f = open_ok(path);
    assert_int_equal(pt_st_count(f), 5);
    assert_string_equal(pt_st_meta_get(f, "note"), "h\xc3\xa9");
    const char *k, *v;
    pt_st_meta_at(f, 0, &k, &v); /* in key order, whatever the file's order */
    assert_string_equal(k, "format");
    assert_string_equal(v, "pt");
    float a[4], b[2], h[3], d;
    int64_t sa[2] = {2, 2}, sb[1] = {2}, sh[1] = {3}, si[2] = {1, 1};
    assert_int_equal(pt_st_read_f32(f, "a", sa, 2, a), PT_OK);
    assert_true(a[0] == 1.0f && a[1] == 2.0f && a[2] == 3.0f && a[3] == -4.0f);
    assert_int_equal(pt_st_read_f32(f, "b", sb, 1, b), PT_OK);
    assert_true(b[0] == 1.5f && b[1] == -2.5f);
    assert_int_equal(pt_st_read_f32(f, "h", sh, 1, h), PT_OK);
    assert_true(h[0] == 1.0f && h[1] == -2.0f && h[2] == 0x1p-24f);
    assert_int_equal(pt_st_read_f32(f, "d", NULL, 0, &d), PT_OK);
    assert_true(d == 1.5f);
    int32_t i;
    assert_int_equal(pt_st_read_i32(f, "i", si, 2, &i), PT_OK);
    assert_int_equal(i, 7);
    pt_st_close(f);

    /* an empty file is valid: "{}" and no data */
    write_st(tpath("empty.safetensors"), "{}      ", NULL, 0);
    f = open_ok(tpath("empty.safetensors"));
    assert_int_equal(pt_st_count(f), 0);
    pt_st_close(f);
}

/* ---- hostile files ---- */

static const uint8_t zeros[64];

static void test_rejects_file_shorter_than_size_field(void **state) {
    (void)state;
    const char *path = tpath("short.safetensors");
    write_bytes(path, "\x10\x00\x00", 3);
    expect_open_format_error(path, NULL, "shorter than the 8-byte");
    write_bytes(path, "", 0);
    expect_open_format_error(path, NULL, "shorter than the 8-byte");
}

static void test_rejects_header_size_larger_than_file(void **state) {
    (void)state;
    const char *path = tpath("hsize.safetensors");
    write_st_raw(path, 1000, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                 zeros, 4);
    expect_open_format_error(path, NULL, "larger than the file");
    write_st_raw(path, UINT64_MAX, "{}", NULL, 0);
    expect_open_format_error(path, NULL, "larger than the file");
}

static void test_rejects_absurd_header_size(void **state) {
    (void)state;
    /* A sparse file large enough that the header size fits in it. */
    const char *path = tpath("absurd.safetensors");
    uint64_t hlen = PT_ST_MAX_HEADER_BYTES + 8;
    write_st_raw(path, hlen, "{", NULL, 0);
    if (truncate(path, (off_t)(hlen + 8)) != 0) fail_msg("truncate %s failed", path);
    expect_open_format_error(path, NULL, "exceeds the");
    remove(path);
}

static void test_rejects_header_size_zero(void **state) {
    (void)state;
    const char *path = tpath("hzero.safetensors");
    write_st_raw(path, 0, "{}", NULL, 0);
    expect_open_format_error(path, NULL, "header size is 0");
}

static void test_rejects_header_not_json(void **state) {
    (void)state;
    const char *path = tpath("notjson.safetensors");
    write_st(path, "{\"a\": {\"dtype\": \"F32\", ", zeros, 4);
    expect_open_format_error(path, NULL, "not valid JSON");
    write_st(path, "\x01\x02garbage", NULL, 0);
    expect_open_format_error(path, NULL, "not valid JSON");
    write_st(path, "{\"a\":1}xyz", NULL, 0); /* trailing garbage */
    expect_open_format_error(path, NULL, "not valid JSON");
}

static void test_rejects_header_not_object(void **state) {
    (void)state;
    const char *path = tpath("notobj.safetensors");
    write_st(path, "[1, 2, 3]", NULL, 0);
    expect_open_format_error(path, NULL, "not a JSON object");
}

static void test_rejects_truncated_data(void **state) {
    (void)state;
    const char *path = tpath("trunc.safetensors");
    float x[16];
    tu_fill(x, 16, 3, 1.0f);
    int64_t shape[1] = {16};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "layer.weight", shape, 1, x, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    size_t n;
    uint8_t *b = read_bytes(path, &n);
    write_bytes(path, b, n - 4);
    free(b);
    expect_open_format_error(path, "layer.weight", "past the end");
}

static void test_rejects_offsets_past_end(void **state) {
    (void)state;
    const char *path = tpath("past.safetensors");
    write_st(path, "{\"w.past\":{\"dtype\":\"F32\",\"shape\":[100],\"data_offsets\":[0,400]}}",
             zeros, 16);
    expect_open_format_error(path, "w.past", "past the end");
}

static void test_rejects_begin_after_end(void **state) {
    (void)state;
    const char *path = tpath("beginend.safetensors");
    write_st(path, "{\"w.rev\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}}", zeros,
             8);
    expect_open_format_error(path, "w.rev", "begin > end");
}

static void test_rejects_size_mismatch(void **state) {
    (void)state;
    const char *path = tpath("mismatch.safetensors");
    write_st(path, "{\"w.size\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}",
             zeros, 12);
    expect_open_format_error(path, "w.size", "needs 16");
    write_st(path, "{\"w.size\":{\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
             zeros, 16);
    expect_open_format_error(path, "w.size", "needs 8");
}

static void test_rejects_overlapping_tensors(void **state) {
    (void)state;
    const char *path = tpath("overlap.safetensors");
    write_st(path,
             "{\"w.first\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"w.second\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
             zeros, 24);
    expect_open_format_error(path, "w.second", "overlap");
    expect_msg_contains("w.first");
    /* the same bytes under two names */
    write_st(path,
             "{\"w.first\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"w.alias\":{\"dtype\":\"I32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
             zeros, 16);
    expect_open_format_error(path, "w.alias", "overlap");
}

static void test_rejects_holes_and_trailing_bytes(void **state) {
    (void)state;
    const char *path = tpath("hole.safetensors");
    write_st(path,
             "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"w.b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
             zeros, 20);
    expect_open_format_error(path, "w.b", "belong to no tensor");
    write_st(path, "{\"w.a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", zeros, 12);
    expect_open_format_error(path, NULL, "belong to no tensor");
}

static void test_rejects_negative_shape(void **state) {
    (void)state;
    const char *path = tpath("negshape.safetensors");
    write_st(path, "{\"w.neg\":{\"dtype\":\"F32\",\"shape\":[-1,4],\"data_offsets\":[0,16]}}",
             zeros, 16);
    expect_open_format_error(path, "w.neg", "negative");
}

static void test_rejects_shape_overflow(void **state) {
    (void)state;
    const char *path = tpath("overflow.safetensors");
    write_st(path,
             "{\"w.huge\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_"
             "offsets\":[0,0]}}",
             NULL, 0);
    expect_open_format_error(path, "w.huge", "overflows");
    /* fits in int64 elements, but not once multiplied by the element size */
    write_st(
        path,
        "{\"w.huge\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,0]}}",
        NULL, 0);
    expect_open_format_error(path, "w.huge", "overflows");
    /* a zero dimension does not excuse the others from overflowing */
    write_st(path,
             "{\"w.huge\":{\"dtype\":\"F32\",\"shape\":[0,4611686018427387904,4],\"data_offsets\":["
             "0,0]}}",
             NULL, 0);
    expect_open_format_error(path, "w.huge", "overflows");
}

static void test_rejects_unknown_dtype(void **state) {
    (void)state;
    const char *path = tpath("dtype.safetensors");
    write_st(path, "{\"w.dt\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4);
    expect_open_format_error(path, "w.dt", "unknown dtype \"F33\"");
    write_st(path, "{\"w.dt\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros, 4);
    expect_open_format_error(path, "w.dt", "unknown dtype");
}

/* Other malformed entries: each row is a header (data: 16 zero bytes), the tensor the message
 * must name (or NULL) and the phrase that shows which check fired. */
static void test_rejects_malformed_entries(void **state) {
    (void)state;
    const struct {
        const char *header, *tensor, *phrase;
    } cases[] = {
        {"{\"w.x\":[1,2]}", "w.x", "not a JSON object"},
        {"{\"w.x\":{\"dtype\":4,\"shape\":[4],\"data_offsets\":[0,16]}}", "w.x",
         "\"dtype\" missing"},
        {"{\"w.x\":{\"shape\":[4],\"data_offsets\":[0,16]}}", "w.x", "\"dtype\" missing"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", "w.x",
         "\"shape\" missing"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4.0],\"data_offsets\":[0,16]}}", "w.x",
         "shape[0] is not an integer"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[\"4\"],\"data_offsets\":[0,16]}}", "w.x",
         "shape[0] is not an integer"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,4],\"data_offsets\":[0,16]}}",
         "w.x", "9 dimensions"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4]}}", "w.x", "\"data_offsets\" missing"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16,32]}}", "w.x",
         "\"data_offsets\" missing"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[-16,0]}}", "w.x", "negative"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,1e2]}}", "w.x",
         "data_offsets[1] is not an integer"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16],\"extra\":1}}", "w.x",
         "unexpected key"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
         "\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
         NULL, "duplicate"},
        {"{\"\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL, "empty"},
        {"{\"w\\u0000x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL, "NUL"},
        {"{\"__metadata__\":[\"a\"],\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,"
         "16]}}",
         NULL, "\"__metadata__\" is not an object"},
        {"{\"__metadata__\":{\"k.meta\":1},\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_"
         "offsets\":[0,16]}}",
         "k.meta", "is not a string"},
        {"{\"w.x\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,99999999999999999999]}}",
         NULL, "not valid JSON"},
        {"{\"w.\xff\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", NULL,
         "not valid JSON"},
    };
    const char *path = tpath("malformed.safetensors");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_st(path, cases[i].header, zeros, 16);
        pt_st_file *f = NULL;
        pt_status st = pt_st_open(&f, path);
        if (st != PT_ERR_FORMAT)
            fail_msg("case %zu (%s): status %d, expected PT_ERR_FORMAT", i, cases[i].header,
                     (int)st);
        const char *need[3] = {path, cases[i].tensor, cases[i].phrase};
        for (int k = 0; k < 3; k++)
            if (need[k] && !strstr(pt_last_error(), need[k]))
                fail_msg("case %zu (%s): message \"%s\" lacks \"%s\"", i, cases[i].header,
                         pt_last_error(), need[k]);
    }
}

static void test_read_rejects_wrong_shape(void **state) {
    (void)state;
    const char *path = tpath("shape.safetensors");
    float x[6] = {0};
    int64_t shape[2] = {2, 3}, wrong[2] = {3, 2}, wrong_rank[3] = {2, 3, 1};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(
        pt_st_writer_add_f32(w, "model.layers.0.mlp.up_proj.weight", shape, 2, x, PT_ST_DTYPE_F32),
        PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    pt_st_file *f = open_ok(path);
    float out[6];
    assert_int_equal(pt_st_read_f32(f, "model.layers.0.mlp.up_proj.weight", wrong, 2, out),
                     PT_ERR_FORMAT);
    expect_msg_contains(path);
    expect_msg_contains("model.layers.0.mlp.up_proj.weight");
    expect_msg_contains("has shape [2, 3], expected [3, 2]");
    assert_int_equal(pt_st_read_f32(f, "model.layers.0.mlp.up_proj.weight", wrong_rank, 3, out),
                     PT_ERR_FORMAT);
    expect_msg_contains("expected [2, 3, 1]");
    int32_t iout[6];
    assert_int_equal(pt_st_read_i32(f, "model.layers.0.mlp.up_proj.weight", shape, 2, iout),
                     PT_ERR_FORMAT);
    expect_msg_contains("has dtype F32");
    pt_st_close(f);
}

static void test_read_rejects_missing_name(void **state) {
    (void)state;
    const char *path = tpath("missing.safetensors");
    write_st(path, "{\"present\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", zeros,
             4);
    pt_st_file *f = open_ok(path);
    float x;
    int64_t shape[1] = {1};
    assert_null(pt_st_find(f, "lm_head.weight"));
    assert_int_equal(pt_st_read_f32(f, "lm_head.weight", shape, 1, &x), PT_ERR_FORMAT);
    expect_msg_contains(path);
    expect_msg_contains("no tensor \"lm_head.weight\"");
    pt_st_close(f);
}

static void test_read_rejects_i64_out_of_int32_range(void **state) {
    (void)state;
    const char *path = tpath("i64.safetensors");
    const int64_t big[3] = {5, (int64_t)INT32_MAX + 1, 0}, ok[3] = {5, INT32_MIN, 0};
    int64_t shape[1] = {3};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_raw(w, "tokens.big", PT_ST_DTYPE_I64, shape, 1, big), PT_OK);
    assert_int_equal(pt_st_writer_add_raw(w, "tokens.ok", PT_ST_DTYPE_I64, shape, 1, ok), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
    pt_st_file *f = open_ok(path);
    int32_t out[3];
    assert_int_equal(pt_st_read_i32(f, "tokens.big", shape, 1, out), PT_ERR_FORMAT);
    expect_msg_contains(path);
    expect_msg_contains("tokens.big");
    expect_msg_contains("element 1 = 2147483648 does not fit in int32");
    assert_int_equal(pt_st_read_i32(f, "tokens.ok", shape, 1, out), PT_OK);
    assert_int_equal(out[1], INT32_MIN);
    float fo[3];
    assert_int_equal(pt_st_read_f32(f, "tokens.ok", shape, 1, fo), PT_ERR_FORMAT);
    expect_msg_contains("has dtype I64");
    pt_st_close(f);
}

static void test_writer_rejects_bad_requests(void **state) {
    (void)state;
    float x[4] = {0};
    int64_t shape[1] = {4}, neg[1] = {-4};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "a", shape, 1, x, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "a", shape, 1, x, PT_ST_DTYPE_F32), PT_ERR_CONFIG);
    expect_msg_contains("added twice");
    assert_int_equal(pt_st_writer_add_f32(w, "", shape, 1, x, PT_ST_DTYPE_F32), PT_ERR_CONFIG);
    assert_int_equal(pt_st_writer_add_f32(w, "__metadata__", shape, 1, x, PT_ST_DTYPE_F32),
                     PT_ERR_CONFIG);
    assert_int_equal(pt_st_writer_add_f32(w, "b", neg, 1, x, PT_ST_DTYPE_F32), PT_ERR_CONFIG);
    assert_int_equal(pt_st_writer_add_f32(w, "c", shape, 1, x, PT_ST_DTYPE_I32), PT_ERR_CONFIG);
    assert_int_equal(pt_st_writer_add_f32(w, "d\xff", shape, 1, x, PT_ST_DTYPE_F32), PT_ERR_CONFIG);
    assert_int_equal(pt_st_writer_set_meta(w, "k", "\xff"), PT_ERR_CONFIG);
    /* an unwritable destination is an I/O error naming the file */
    assert_int_equal(pt_st_writer_write(w, "/nonexistent-dir/x.safetensors"), PT_ERR_IO);
    expect_msg_contains("/nonexistent-dir/x.safetensors");
    pt_st_writer_free(w);
}

/* ---- fuzzing ---- */

static uint64_t fuzz_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Opens `path`; it must fail with PT_ERR_FORMAT or open, in which case every tensor is read in
 * full into a buffer of exactly its size (AddressSanitizer catches any read out of bounds). */
static int open_and_read_all(const char *path) {
    pt_st_file *f = NULL;
    pt_status st = pt_st_open(&f, path);
    if (st != PT_OK) {
        if (st != PT_ERR_FORMAT) fail_msg("%s: status %d: %s", path, (int)st, pt_last_error());
        if (!strstr(pt_last_error(), path))
            fail_msg("message \"%s\" does not name the file", pt_last_error());
        assert_null(f);
        return 0;
    }
    for (int i = 0; i < pt_st_count(f); i++) {
        const pt_st_tensor *t = pt_st_tensor_at(f, i);
        assert_true(t->offset + t->nbytes >= t->offset);
        const uint8_t *p = pt_st_tensor_data(f, t);
        unsigned sum = 0;
        for (uint64_t k = 0; k < t->nbytes; k++) sum += p[k];
        (void)sum;
        void *buf = malloc((size_t)t->numel * 4 + 1);
        pt_status r1 = pt_st_read_f32(f, t->name, t->shape, t->ndim, buf);
        pt_status r2 = pt_st_read_i32(f, t->name, t->shape, t->ndim, buf);
        assert_true(r1 == PT_OK || r1 == PT_ERR_FORMAT);
        assert_true(r2 == PT_OK || r2 == PT_ERR_FORMAT);
        free(buf);
    }
    pt_st_close(f);
    return 1;
}

static void write_fuzz_seed(const char *path) {
    float a[6], b[3];
    tu_fill(a, 6, 11, 1.0f);
    tu_fill(b, 3, 12, 1.0f);
    int64_t ids[2] = {3, 4};
    int64_t sa[2] = {2, 3}, sb[1] = {3}, si[1] = {2};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "a", sa, 2, a, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "b", sb, 1, b, PT_ST_DTYPE_BF16), PT_OK);
    assert_int_equal(pt_st_writer_add_raw(w, "ids", PT_ST_DTYPE_I64, si, 1, ids), PT_OK);
    assert_int_equal(pt_st_writer_set_meta(w, "format", "pt"), PT_OK);
    assert_int_equal(pt_st_writer_write(w, path), PT_OK);
    pt_st_writer_free(w);
}

static void test_fuzz_truncation_at_every_length(void **state) {
    (void)state;
    const char *seed = tpath("fuzz_seed.safetensors"), *path = tpath("fuzz_trunc.safetensors");
    write_fuzz_seed(seed);
    size_t n;
    uint8_t *b = read_bytes(seed, &n);
    for (size_t len = 0; len < n; len++) {
        write_bytes(path, b, len);
        if (open_and_read_all(path)) fail_msg("a file cut to %zu of %zu bytes opened", len, n);
    }
    write_bytes(path, b, n);
    assert_true(open_and_read_all(path));
    free(b);
}

static void test_fuzz_corrupted_header(void **state) {
    (void)state;
    const char *seed = tpath("fuzz_seed2.safetensors"), *path = tpath("fuzz_corrupt.safetensors");
    write_fuzz_seed(seed);
    size_t n;
    uint8_t *b = read_bytes(seed, &n);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    uint8_t *m = malloc(n);
    static const char interesting[] = "0123456789{}[],:\"-. e";
    uint64_t s = 0x9E3779B97F4A7C15ull;
    int opened = 0;
    enum { ITERS = 4000 };
    for (int it = 0; it < ITERS; it++) {
        memcpy(m, b, n);
        int edits = 1 + (int)(fuzz_next(&s) % 3);
        for (int e = 0; e < edits; e++) {
            uint64_t r = fuzz_next(&s);
            size_t pos = (size_t)(r % (8 + hlen));
            switch ((r >> 32) % 4) {
            case 0: m[pos] = (uint8_t)(r >> 40); break;
            case 1: m[pos] = (uint8_t)interesting[(r >> 40) % (sizeof interesting - 1)]; break;
            case 2: /* digits keep the JSON valid and move offsets and shapes around */
                if (m[pos] >= '0' && m[pos] <= '9') m[pos] = (uint8_t)('0' + (r >> 40) % 10);
                break;
            default: m[pos % 8] = (uint8_t)(r >> 40); break; /* the header size */
            }
        }
        write_bytes(path, m, n);
        opened += open_and_read_all(path);
    }
    /* some mutations (e.g. a digit swapped for itself) leave a valid file: both paths ran */
    print_message("corrupted-header fuzz: %d of %d variants opened\n", opened, ITERS);
    assert_true(opened > 0 && opened < ITERS);
    free(m);
    free(b);
}

/* ---- checkpoint directories ---- */

static void make_dir(const char *path) {
    if (mkdir(path, 0700) != 0) fail_msg("mkdir %s failed", path);
}

static void write_two_shards(const char *dir, float *x, float *y, float *z) {
    char p[600];
    int64_t s4[1] = {4}, s23[2] = {2, 3};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(
        pt_st_writer_add_f32(w, "model.embed_tokens.weight", s23, 2, x, PT_ST_DTYPE_F32), PT_OK);
    assert_int_equal(pt_st_writer_add_f32(w, "model.norm.weight", s4, 1, y, PT_ST_DTYPE_F32),
                     PT_OK);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    assert_int_equal(pt_st_writer_write(w, p), PT_OK);
    pt_st_writer_free(w);
    w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_f32(w, "lm_head.weight", s23, 2, z, PT_ST_DTYPE_BF16), PT_OK);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    assert_int_equal(pt_st_writer_write(w, p), PT_OK);
    pt_st_writer_free(w);
}

static void write_index(const char *dir, const char *json) {
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_bytes(p, json, strlen(json));
}

static const char good_index[] =
    "{\"metadata\": {\"total_size\": 52}, \"weight_map\": {"
    "\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
    "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
    "\"model.norm.weight\": \"model-00001-of-00002.safetensors\"}}";

static void test_dir_reads_sharded_checkpoint(void **state) {
    (void)state;
    const char *dir = tpath("sharded");
    make_dir(dir);
    float x[6], y[4], z[6];
    tu_fill(x, 6, 21, 1.0f);
    tu_fill(y, 4, 22, 1.0f);
    tu_fill(z, 6, 23, 1.0f);
    write_two_shards(dir, x, y, z);
    write_index(dir, good_index);

    pt_st_dir *d = NULL;
    if (pt_st_dir_open(&d, dir) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(pt_st_dir_count(d), 3);
    assert_string_equal(pt_st_dir_tensor_at(d, 0)->name, "lm_head.weight");
    pt_st_file *file = NULL;
    const pt_st_tensor *t = pt_st_dir_find(d, "lm_head.weight", &file);
    assert_non_null(t);
    assert_non_null(strstr(pt_st_path(file), "model-00002-of-00002.safetensors"));
    assert_null(pt_st_dir_find(d, "nope", NULL));
    int64_t s23[2] = {2, 3}, s4[1] = {4};
    float gx[6], gy[4], gz[6];
    assert_int_equal(pt_st_dir_read_f32(d, "model.embed_tokens.weight", s23, 2, gx), PT_OK);
    assert_memory_equal(gx, x, sizeof x);
    assert_int_equal(pt_st_dir_read_f32(d, "model.norm.weight", s4, 1, gy), PT_OK);
    assert_memory_equal(gy, y, sizeof y);
    assert_int_equal(pt_st_dir_read_f32(d, "lm_head.weight", s23, 2, gz), PT_OK);
    for (int i = 0; i < 6; i++) assert_true(gz[i] == pt_bf16_to_f32(pt_f32_to_bf16(z[i])));
    assert_int_equal(pt_st_dir_read_f32(d, "nope", s4, 1, gy), PT_ERR_FORMAT);
    expect_msg_contains("no tensor \"nope\"");
    assert_int_equal(pt_st_dir_read_f32(d, "model.norm.weight", s23, 2, gx), PT_ERR_FORMAT);
    expect_msg_contains("model-00001-of-00002.safetensors");
    pt_st_dir_close(d);
}

static void test_dir_reads_single_file(void **state) {
    (void)state;
    const char *dir = tpath("single");
    make_dir(dir);
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int32_t v[2] = {1, 2};
    int64_t s2[1] = {2};
    pt_st_writer *w = pt_st_writer_create();
    assert_int_equal(pt_st_writer_add_raw(w, "v", PT_ST_DTYPE_I32, s2, 1, v), PT_OK);
    assert_int_equal(pt_st_writer_write(w, p), PT_OK);
    pt_st_writer_free(w);
    pt_st_dir *d = NULL;
    assert_int_equal(pt_st_dir_open(&d, dir), PT_OK);
    assert_int_equal(pt_st_dir_count(d), 1);
    int32_t g[2];
    assert_int_equal(pt_st_dir_read_i32(d, "v", s2, 1, g), PT_OK);
    assert_int_equal(g[1], 2);
    pt_st_dir_close(d);

    assert_int_equal(pt_st_dir_open(&d, tpath("no-such-dir")), PT_ERR_IO);
    assert_null(d);
    expect_msg_contains("no-such-dir");
}

static void test_dir_rejects_bad_index(void **state) {
    (void)state;
    const char *dir = tpath("badindex");
    make_dir(dir);
    float x[6] = {0}, y[4] = {0}, z[6] = {0};
    write_two_shards(dir, x, y, z);
    const struct {
        const char *json, *phrase;
        pt_status st;
    } cases[] = {
        {"{\"weight_map\": [1]}", "\"weight_map\"", PT_ERR_FORMAT},
        {"{\"metadata\": {}}", "\"weight_map\"", PT_ERR_FORMAT},
        {"not json", "not valid JSON", PT_ERR_FORMAT},
        /* a tensor the shard does not hold */
        {"{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
         "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\","
         "\"model.norm.weight\": \"model-00001-of-00002.safetensors\","
         "\"model.ghost.weight\": \"model-00002-of-00002.safetensors\"}}",
         "model.ghost.weight", PT_ERR_FORMAT},
        /* a shard tensor missing from the map */
        {"{\"weight_map\": {\"lm_head.weight\": \"model-00002-of-00002.safetensors\","
         "\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}",
         "model.norm.weight", PT_ERR_FORMAT},
        /* a path out of the directory */
        {"{\"weight_map\": {\"lm_head.weight\": \"../model-00002-of-00002.safetensors\"}}",
         "lm_head.weight", PT_ERR_FORMAT},
        {"{\"weight_map\": {\"lm_head.weight\": 3}}", "lm_head.weight", PT_ERR_FORMAT},
        /* a shard that does not exist */
        {"{\"weight_map\": {\"lm_head.weight\": \"model-00003-of-00002.safetensors\"}}",
         "model-00003-of-00002.safetensors", PT_ERR_IO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_index(dir, cases[i].json);
        pt_st_dir *d = (pt_st_dir *)1;
        pt_status st = pt_st_dir_open(&d, dir);
        if (st != cases[i].st)
            fail_msg("index case %zu: status %d, expected %d", i, (int)st, (int)cases[i].st);
        assert_null(d);
        if (!strstr(pt_last_error(), cases[i].phrase) || !strstr(pt_last_error(), dir))
            fail_msg("index case %zu: message \"%s\" lacks \"%s\" or the directory", i,
                     pt_last_error(), cases[i].phrase);
    }
    /* a corrupt shard is reported with the shard's path */
    write_index(dir, good_index);
    char p[600];
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_bytes(p, "\x09\0\0\0\0\0\0\0{}", 10);
    pt_st_dir *d = NULL;
    assert_int_equal(pt_st_dir_open(&d, dir), PT_ERR_FORMAT);
    expect_msg_contains(p);
}

/* ---- Hugging Face config.json ---- */

/* The keys TinyLlama-1.1B's config.json has. */
static const char tinyllama_config[] = "{\n"
                                       "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                       "  \"attention_bias\": false,\n"
                                       "  \"bos_token_id\": 1,\n"
                                       "  \"eos_token_id\": 2,\n"
                                       "  \"hidden_act\": \"silu\",\n"
                                       "  \"hidden_size\": 2048,\n"
                                       "  \"initializer_range\": 0.02,\n"
                                       "  \"intermediate_size\": 5632,\n"
                                       "  \"max_position_embeddings\": 2048,\n"
                                       "  \"model_type\": \"llama\",\n"
                                       "  \"num_attention_heads\": 32,\n"
                                       "  \"num_hidden_layers\": 22,\n"
                                       "  \"num_key_value_heads\": 4,\n"
                                       "  \"pretraining_tp\": 1,\n"
                                       "  \"rms_norm_eps\": 1e-05,\n"
                                       "  \"rope_scaling\": null,\n"
                                       "  \"rope_theta\": 10000.0,\n"
                                       "  \"tie_word_embeddings\": false,\n"
                                       "  \"torch_dtype\": \"bfloat16\",\n"
                                       "  \"transformers_version\": \"4.35.0\",\n"
                                       "  \"use_cache\": true,\n"
                                       "  \"vocab_size\": 32000\n"
                                       "}\n";

/* tinyllama_config with `from` (which must occur) replaced by `to`. */
static char *config_with(const char *from, const char *to) {
    const char *at = strstr(tinyllama_config, from);
    if (!at) fail_msg("\"%s\" not in the template", from);
    size_t pre = (size_t)(at - tinyllama_config), nf = strlen(from), nt = strlen(to);
    char *s = malloc(sizeof tinyllama_config + nt);
    memcpy(s, tinyllama_config, pre);
    memcpy(s + pre, to, nt);
    strcpy(s + pre + nt, at + nf);
    return s;
}

static void test_hf_config_reads_tinyllama(void **state) {
    (void)state;
    const char *path = tpath("tinyllama_config.json");
    write_bytes(path, tinyllama_config, strlen(tinyllama_config));
    pt_model_config c;
    if (pt_hf_config_read(path, &c) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(c.vocab_size, 32000);
    assert_int_equal(c.dim, 2048);
    assert_int_equal(c.n_layers, 22);
    assert_int_equal(c.n_heads, 32);
    assert_int_equal(c.n_kv_heads, 4);
    assert_int_equal(c.ffn_dim, 5632);
    assert_int_equal(c.max_seq_len, 2048);
    assert_true(c.rope_theta == 10000.0f);
    assert_true(c.norm_eps == 1e-5f);
    assert_int_equal(c.tied_embeddings, 0);
    assert_true(c.init_std == 0.02f);
}

static void test_hf_config_defaults(void **state) {
    (void)state;
    const char *path = tpath("minimal_config.json");
    const char *json =
        "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64, "
        "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 128, "
        "\"max_position_embeddings\": 256, \"num_key_value_heads\": null}";
    write_bytes(path, json, strlen(json));
    pt_model_config c;
    if (pt_hf_config_read(path, &c) != PT_OK) fail_msg("%s", pt_last_error());
    assert_int_equal(c.n_kv_heads, 4);
    assert_true(c.rope_theta == 10000.0f);
    assert_true(c.norm_eps == 1e-6f);
    assert_int_equal(c.tied_embeddings, 0);
    assert_true(c.init_std == 0.02f);
}

static void test_hf_config_write_read_round_trip(void **state) {
    (void)state;
    const pt_model_config cfgs[2] = {
        {.vocab_size = 50304,
         .dim = 768,
         .n_layers = 12,
         .n_heads = 12,
         .n_kv_heads = 4,
         .ffn_dim = 2048,
         .max_seq_len = 1024,
         .rope_theta = 500000.0f,
         .norm_eps = 1e-5f,
         .tied_embeddings = 1,
         .init_std = 0.0123456789f},
        {.vocab_size = 256,
         .dim = 32,
         .n_layers = 1,
         .n_heads = 2,
         .n_kv_heads = 2,
         .ffn_dim = 96,
         .max_seq_len = 64,
         .rope_theta = 1234.5677f,
         .norm_eps = 3.3e-7f,
         .tied_embeddings = 0,
         .init_std = 0.02f},
    };
    const char *path = tpath("written_config.json");
    for (int k = 0; k < 2; k++) {
        assert_int_equal(pt_hf_config_write(path, &cfgs[k]), PT_OK);
        pt_model_config c;
        memset(&c, 0xAB, sizeof c);
        if (pt_hf_config_read(path, &c) != PT_OK) fail_msg("%s", pt_last_error());
        const pt_model_config *w = &cfgs[k];
        assert_int_equal(c.vocab_size, w->vocab_size);
        assert_int_equal(c.dim, w->dim);
        assert_int_equal(c.n_layers, w->n_layers);
        assert_int_equal(c.n_heads, w->n_heads);
        assert_int_equal(c.n_kv_heads, w->n_kv_heads);
        assert_int_equal(c.ffn_dim, w->ffn_dim);
        assert_int_equal(c.max_seq_len, w->max_seq_len);
        assert_int_equal(tu_f32_bits(c.rope_theta), tu_f32_bits(w->rope_theta));
        assert_int_equal(tu_f32_bits(c.norm_eps), tu_f32_bits(w->norm_eps));
        assert_int_equal(tu_f32_bits(c.init_std), tu_f32_bits(w->init_std));
        assert_int_equal(c.tied_embeddings, w->tied_embeddings);
    }
    /* what transformers' LlamaConfig expects to find, with short floats */
    assert_int_equal(pt_hf_config_write(path, &cfgs[0]), PT_OK);
    size_t n;
    char *text = (char *)read_bytes(path, &n);
    text[n] = '\0';
    const char *need[] = {"\"architectures\": [\n    \"LlamaForCausalLM\"\n  ]",
                          "\"model_type\": \"llama\"",
                          "\"torch_dtype\": \"float32\"",
                          "\"hidden_act\": \"silu\"",
                          "\"rms_norm_eps\": 1e-5",
                          "\"rope_theta\": 500000.0",
                          "\"initializer_range\": 0.012345679",
                          "\"bos_token_id\": 50256",
                          "\"eos_token_id\": 50256",
                          "\"head_dim\": 64",
                          "\"rope_scaling\": null",
                          "\"tie_word_embeddings\": true"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++)
        if (!strstr(text, need[i])) fail_msg("written config lacks %s:\n%s", need[i], text);
    free(text);

    pt_model_config bad = cfgs[0];
    bad.n_kv_heads = 5;
    assert_int_equal(pt_hf_config_write(path, &bad), PT_ERR_CONFIG);
    bad = cfgs[0];
    bad.norm_eps = NAN;
    assert_int_equal(pt_hf_config_write(path, &bad), PT_ERR_CONFIG);
    expect_msg_contains("rms_norm_eps");
}

/* Today's Llama 3.1 / Qwen 3 shapes: rope_scaling of rope_type llama3 and a head_dim other than
 * hidden_size / heads, read, then written and read back the same */
static void test_hf_config_reads_llama3_rope_and_head_dim(void **state) {
    (void)state;
    char *json = config_with("\"rope_scaling\": null",
                             "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, "
                             "\"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, "
                             "\"original_max_position_embeddings\": 8192}, \"head_dim\": 128");
    const char *path = tpath("llama31_config.json"), *path2 = tpath("llama31_written.json");
    write_bytes(path, json, strlen(json));
    free(json);
    pt_model_config c = {0}, back = {0};
    assert_int_equal(pt_hf_config_read(path, &c), PT_OK);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.rope_factor == 8.0f && c.rope_low_freq_factor == 1.0f &&
                c.rope_high_freq_factor == 4.0f && c.rope_original_max_seq_len == 8192);
    assert_int_equal(pt_hf_config_write(path2, &c), PT_OK);
    assert_int_equal(pt_hf_config_read(path2, &back), PT_OK);
    assert_true(back.head_dim == c.head_dim && back.rope_factor == c.rope_factor &&
                back.rope_low_freq_factor == c.rope_low_freq_factor &&
                back.rope_high_freq_factor == c.rope_high_freq_factor &&
                back.rope_original_max_seq_len == c.rope_original_max_seq_len &&
                back.dim == c.dim && back.n_heads == c.n_heads);
    /* without rope_scaling: no scaling (factor 0) */
    json = config_with("\"pretraining_tp\": 1", "\"pretraining_tp\": 1");
    write_bytes(path, json, strlen(json));
    free(json);
    assert_int_equal(pt_hf_config_read(path, &c), PT_OK);
    assert_true(c.rope_factor == 0.0f && c.head_dim == 0);
}

static void test_hf_config_errors_name_file_and_key(void **state) {
    (void)state;
    const struct {
        const char *from, *to, *phrase;
        pt_status st;
    } cases[] = {
        {"  \"num_hidden_layers\": 22,\n", "", "missing key \"num_hidden_layers\"", PT_ERR_CONFIG},
        {"  \"vocab_size\": 32000\n", "  \"vocab_size\": null\n", "missing key \"vocab_size\"",
         PT_ERR_CONFIG},
        {"\"hidden_size\": 2048", "\"hidden_size\": \"2048\"", "\"hidden_size\" must be an integer",
         PT_ERR_CONFIG},
        {"\"hidden_size\": 2048", "\"hidden_size\": 2048.0", "\"hidden_size\" must be an integer",
         PT_ERR_CONFIG},
        {"\"num_hidden_layers\": 22", "\"num_hidden_layers\": 0", "\"num_hidden_layers\" = 0",
         PT_ERR_CONFIG},
        {"\"intermediate_size\": 5632", "\"intermediate_size\": 4294967296",
         "\"intermediate_size\"", PT_ERR_CONFIG},
        {"\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"1e-5\"",
         "\"rms_norm_eps\" must be a number", PT_ERR_CONFIG},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": -1", "\"rope_theta\"", PT_ERR_CONFIG},
        {"\"rope_theta\": 10000.0", "\"rope_theta\": 1e39", "\"rope_theta\"", PT_ERR_CONFIG},
        {"\"tie_word_embeddings\": false", "\"tie_word_embeddings\": 0", "\"tie_word_embeddings\"",
         PT_ERR_CONFIG},
        {"\"rope_scaling\": null", "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}",
         "rope_scaling of type \"linear\" not supported", PT_ERR_CONFIG},
        {"\"rope_scaling\": null",
         "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
         "\"original_max_position_embeddings\": 8192}",
         "rope_scaling \"high_freq_factor\" must be a positive number", PT_ERR_CONFIG},
        {"\"rope_scaling\": null",
         "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, "
         "\"high_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192}",
         "\"high_freq_factor\" (1) must exceed", PT_ERR_CONFIG},
        {"\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "\"hidden_act\" must be \"silu\"",
         PT_ERR_CONFIG},
        {"\"attention_bias\": false", "\"attention_bias\": \"yes\"",
         "\"attention_bias\" must be true or false", PT_ERR_CONFIG},
        {"\"pretraining_tp\": 1", "\"use_sliding_window\": true",
         "\"use_sliding_window\" must be false", PT_ERR_CONFIG},
        {"\"pretraining_tp\": 1", "\"mlp_bias\": true", "\"mlp_bias\" must be false",
         PT_ERR_CONFIG},
        {"\"pretraining_tp\": 1", "\"head_dim\": 7", "\"head_dim\" must be an even integer",
         PT_ERR_CONFIG},
        {"\"pretraining_tp\": 1", "\"attention_dropout\": 0.1", "\"attention_dropout\"",
         PT_ERR_CONFIG},
        {"\"model_type\": \"llama\"", "\"model_type\": \"mistral\"",
         "\"model_type\" must be \"llama\"", PT_ERR_CONFIG},
        {"[\"LlamaForCausalLM\"]", "[\"MistralForCausalLM\"]", "\"architectures\"", PT_ERR_CONFIG},
        {"\"num_key_value_heads\": 4", "\"num_key_value_heads\": 5", "\"num_key_value_heads\"",
         PT_ERR_CONFIG},
        {"\"num_attention_heads\": 32", "\"num_attention_heads\": 30", "\"hidden_size\"",
         PT_ERR_CONFIG},
        {"\"use_cache\": true,", "\"use_cache\": true,,", "not valid JSON", PT_ERR_FORMAT},
        {"\"vocab_size\": 32000", "\"vocab_size\": 32000, \"vocab_size\": 1", "not valid JSON",
         PT_ERR_FORMAT},
    };
    const char *path = tpath("bad_config.json");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *json = config_with(cases[i].from, cases[i].to);
        write_bytes(path, json, strlen(json));
        free(json);
        pt_model_config c = {0};
        pt_status st = pt_hf_config_read(path, &c);
        if (st != cases[i].st)
            fail_msg("config case %zu (%s): status %d, expected %d", i, cases[i].to, (int)st,
                     (int)cases[i].st);
        if (!strstr(pt_last_error(), path) || !strstr(pt_last_error(), cases[i].phrase))
            fail_msg("config case %zu: message \"%s\" lacks the path or \"%s\"", i, pt_last_error(),
                     cases[i].phrase);
        assert_int_equal(c.vocab_size, 0); /* the output is untouched on error */
    }
    const char *path2 = tpath("array_config.json");
    write_bytes(path2, "[]", 2);
    pt_model_config c;
    assert_int_equal(pt_hf_config_read(path2, &c), PT_ERR_FORMAT);
    expect_msg_contains(path2);
    assert_int_equal(pt_hf_config_read(tpath("absent.json"), &c), PT_ERR_IO);
    expect_msg_contains("absent.json");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_f32_i32_i64_metadata),
        cmocka_unit_test(test_bf16_rounding_hand_computed),
        cmocka_unit_test(test_f16_decoding),
        cmocka_unit_test(test_reads_hand_written_file),
        cmocka_unit_test(test_rejects_file_shorter_than_size_field),
        cmocka_unit_test(test_rejects_header_size_larger_than_file),
        cmocka_unit_test(test_rejects_absurd_header_size),
        cmocka_unit_test(test_rejects_header_size_zero),
        cmocka_unit_test(test_rejects_header_not_json),
        cmocka_unit_test(test_rejects_header_not_object),
        cmocka_unit_test(test_rejects_truncated_data),
        cmocka_unit_test(test_rejects_offsets_past_end),
        cmocka_unit_test(test_rejects_begin_after_end),
        cmocka_unit_test(test_rejects_size_mismatch),
        cmocka_unit_test(test_rejects_overlapping_tensors),
        cmocka_unit_test(test_rejects_holes_and_trailing_bytes),
        cmocka_unit_test(test_rejects_negative_shape),
        cmocka_unit_test(test_rejects_shape_overflow),
        cmocka_unit_test(test_rejects_unknown_dtype),
        cmocka_unit_test(test_rejects_malformed_entries),
        cmocka_unit_test(test_read_rejects_wrong_shape),
        cmocka_unit_test(test_read_rejects_missing_name),
        cmocka_unit_test(test_read_rejects_i64_out_of_int32_range),
        cmocka_unit_test(test_writer_rejects_bad_requests),
        cmocka_unit_test(test_fuzz_truncation_at_every_length),
        cmocka_unit_test(test_fuzz_corrupted_header),
        cmocka_unit_test(test_dir_reads_sharded_checkpoint),
        cmocka_unit_test(test_dir_reads_single_file),
        cmocka_unit_test(test_dir_rejects_bad_index),
        cmocka_unit_test(test_hf_config_reads_tinyllama),
        cmocka_unit_test(test_hf_config_defaults),
        cmocka_unit_test(test_hf_config_write_read_round_trip),
        cmocka_unit_test(test_hf_config_reads_llama3_rope_and_head_dim),
        cmocka_unit_test(test_hf_config_errors_name_file_and_key),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
