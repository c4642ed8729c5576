/* test_data.c: shard reading and row order against the format's definition (include/pt/data.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/data.h"
#include "testutil.h"

/* Two shards with tokens equal to a global counter, so a row's tokens name its position. */
static void make_shards(const char *dir, int n0, int n1) {
    char path[1100];
    uint16_t *t = malloc((size_t)(n0 + n1) * 2);
    for (int i = 0; i < n0 + n1; i++) t[i] = (uint16_t)i;
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    assert_int_equal(pt_shard_write(path, t, (size_t)n0), PT_OK);
    snprintf(path, sizeof path, "%s/train_000001.bin", dir);
    assert_int_equal(pt_shard_write(path, t + n0, (size_t)n1), PT_OK);
    free(t);
}

static void test_rows_overlap_by_one_and_follow_shards(void **state) {
    (void)state;
    char dir[512], glob[600];
    snprintf(dir, sizeof dir, "%s/rows", tu_tmpdir());
    pt_mkdirs(dir);
    make_shards(dir, 33, 21); /* T=8: (33-1)/8 = 4 rows, (21-1)/8 = 2 rows */
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    pt_data d;
    assert_int_equal(pt_data_open(&d, glob, 8, 0, 1, 0), PT_OK);
    assert_int_equal(d.n_rows, 6);
    int32_t in[8], tg[8];
    for (int64_t r = 0; r < 6; r++) {
        pt_data_read_row(&d, r, in, tg);
        int base = r < 4 ? (int)r * 8 : 33 + (int)(r - 4) * 8;
        for (int i = 0; i < 8; i++) {
            assert_int_equal(in[i], base + i);
            assert_int_equal(tg[i], base + i + 1);
        }
    }
    /* step s uses rows s*G .. s*G+G-1, wrapping at the end: G = 4, step 1 -> rows 4,5,0,1 */
    assert_int_equal(pt_data_row(&d, 1, 0, 4), 4);
    assert_int_equal(pt_data_row(&d, 1, 1, 4), 5);
    assert_int_equal(pt_data_row(&d, 1, 2, 4), 0);
    assert_int_equal(pt_data_row(&d, 1, 3, 4), 1);
    pt_data_close(&d);
}

static void test_shuffle_is_a_seeded_permutation(void **state) {
    (void)state;
    char dir[512], glob[600];
    snprintf(dir, sizeof dir, "%s/shuf", tu_tmpdir());
    pt_mkdirs(dir);
    make_shards(dir, 801, 401); /* T=4: 200 + 100 rows */
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    pt_data a, b, c;
    assert_int_equal(pt_data_open(&a, glob, 4, 1, 42, 0), PT_OK);
    assert_int_equal(pt_data_open(&b, glob, 4, 1, 42, 0), PT_OK);
    assert_int_equal(pt_data_open(&c, glob, 4, 1, 43, 0), PT_OK);
    int64_t n = a.n_rows;
    assert_int_equal(n, 300);
    char *seen = calloc((size_t)n, 1);
    int same_as_identity = 1, differs_from_other_seed = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t r = pt_data_row(&a, 0, j, n);
        assert_true(r >= 0 && r < n);
        assert_false(seen[r]);
        seen[r] = 1;
        assert_int_equal(r, pt_data_row(&b, 0, j, n));
        if (r != j) same_as_identity = 0;
        if (r != pt_data_row(&c, 0, j, n)) differs_from_other_seed = 1;
    }
    assert_false(same_as_identity);
    assert_true(differs_from_other_seed);
    /* the second pass is another permutation, and reading steps out of order changes nothing */
    int64_t r_pass1 = pt_data_row(&a, 1, 5, n), r_pass0 = pt_data_row(&a, 0, 5, n);
    assert_int_equal(pt_data_row(&b, 1, 5, n), r_pass1);
    assert_int_equal(pt_data_row(&b, 0, 5, n), r_pass0);
    free(seen);
    pt_data_close(&a);
    pt_data_close(&b);
    pt_data_close(&c);
}

static void test_micro_batch_split_keeps_rows(void **state) {
    (void)state;
    char dir[512], glob[600];
    snprintf(dir, sizeof dir, "%s/split", tu_tmpdir());
    pt_mkdirs(dir);
    make_shards(dir, 401, 201);
    snprintf(glob, sizeof glob, "%s/train_*.bin", dir);
    pt_data d;
    assert_int_equal(pt_data_open(&d, glob, 4, 1, 7, 0), PT_OK);
    int G = 8, T = 4;
    int32_t whole_in[32], whole_tg[32], part_in[32], part_tg[32];
    pt_data_batch(&d, 3, G, 0, G, whole_in, whole_tg);
    for (int k = 0; k < 4; k++) pt_data_batch(&d, 3, G, k * 2, 2, part_in + k * 2 * T, part_tg + k * 2 * T);
    assert_memory_equal(whole_in, part_in, sizeof whole_in);
    assert_memory_equal(whole_tg, part_tg, sizeof whole_tg);
    pt_data_close(&d);
}

static void expect_open_error(const char *glob, int T, int vocab, const char *needle) {
    pt_data d;
    pt_status st = pt_data_open(&d, glob, T, 0, 1, vocab);
    assert_int_not_equal(st, PT_OK);
    if (!strstr(pt_last_error(), needle))
        fail_msg("error \"%s\" does not mention \"%s\"", pt_last_error(), needle);
}

static void test_bad_shards_are_named(void **state) {
    (void)state;
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/bad", tu_tmpdir());
    pt_mkdirs(dir);
    /* no match */
    snprintf(path, sizeof path, "%s/none_*.bin", dir);
    expect_open_error(path, 4, 0, "no file matches");
    /* bad magic */
    int32_t hdr[256] = {0};
    hdr[0] = 1234;
    snprintf(path, sizeof path, "%s/magic.bin", dir);
    assert_int_equal(pt_write_file_atomic(path, hdr, sizeof hdr), PT_OK);
    expect_open_error(path, 4, 0, "bad magic");
    /* token count that lies */
    char buf[1024 + 20] = {0};
    int32_t *h = (int32_t *)buf;
    h[0] = PT_SHARD_MAGIC;
    h[1] = 1;
    h[2] = 100;
    snprintf(path, sizeof path, "%s/short.bin", dir);
    assert_int_equal(pt_write_file_atomic(path, buf, sizeof buf), PT_OK);
    expect_open_error(path, 4, 0, "short.bin");
    /* truncated header */
    snprintf(path, sizeof path, "%s/tiny.bin", dir);
    assert_int_equal(pt_write_file_atomic(path, buf, 10), PT_OK);
    expect_open_error(path, 4, 0, "shorter than");
    /* token outside the vocabulary */
    uint16_t toks[9] = {1, 2, 3, 4, 5, 6, 7, 999, 8};
    snprintf(path, sizeof path, "%s/vocab.bin", dir);
    assert_int_equal(pt_shard_write(path, toks, 9), PT_OK);
    expect_open_error(path, 4, 100, ">= vocab_size");
    /* fewer tokens than one row */
    snprintf(path, sizeof path, "%s/fewrows.bin", dir);
    assert_int_equal(pt_shard_write(path, toks, 3), PT_OK);
    expect_open_error(path, 4, 0, "fewer than one row");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_overlap_by_one_and_follow_shards),
        cmocka_unit_test(test_shuffle_is_a_seeded_permutation),
        cmocka_unit_test(test_micro_batch_split_keeps_rows),
        cmocka_unit_test(test_bad_shards_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
