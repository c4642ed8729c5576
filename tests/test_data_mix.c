/* test_data_mix.c: several sources mixed by weight (pt_mix, include/pt/data.h) against the
 * schedule's definition: each source's tokens lie in their own range (source i: 1000·i + the
 * token's position in its shard), so a row read names its source and its row within it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/data.h"
#include "testutil.h"

#define T 4

/* Source NAME as one shard of `rows` rows of T + 1 tokens: token p = 1000·id + p. */
static void make_source(const char *dir, const char *name, int id, int rows) {
    char path[1200];
    size_t n = (size_t)rows * T + 1;
    uint16_t *t = malloc(n * sizeof *t);
    for (size_t p = 0; p < n; p++) t[p] = (uint16_t)(1000 * id + (int)p);
    snprintf(path, sizeof path, "%s/%s_000000.bin", dir, name);
    assert_int_equal(pt_shard_write(path, t, n), PT_OK);
    free(t);
}

/* "a=DIR/a_*.bin, b=DIR/b_*.bin, ..." for the first n of names */
static void sources_of(const char *dir, const char *const *names, int n, char *out, size_t cap) {
    size_t used = 0;
    for (int i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, cap - used, "%s%s=%s/%s_*.bin", i ? ", " : "",
                                 names[i], dir, names[i]);
}

static const char *const names[] = {"web", "code", "math", "books"};

/* Sources of 200, 37, 5 and 60 rows in a fresh directory. */
static const char *make_sources(const char *sub) {
    static char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", tu_tmpdir(), sub);
    pt_mkdirs(dir);
    int rows[] = {200, 37, 5, 60};
    for (int i = 0; i < 4; i++) make_source(dir, names[i], i, rows[i]);
    return dir;
}

static void open_mix(pt_mix *m, const char *dir, int n, const char *weights, int shuffle) {
    char src[4096];
    sources_of(dir, names, n, src, sizeof src);
    if (pt_mix_open(m, "", src, weights, T, shuffle, 1234, 0) != PT_OK)
        fail_msg("pt_mix_open(%s | %s): %s", src, weights, pt_last_error());
}

/* The source and row a read sequence came from (its first input token names them). */
static void decode(const int32_t *in, const int32_t *tg, int *source, int64_t *row) {
    *source = in[0] / 1000;
    *row = (in[0] % 1000) / T;
    for (int i = 0; i < T; i++) {
        assert_int_equal(in[i], in[0] + i);
        assert_int_equal(tg[i], in[0] + i + 1);
    }
}

static void test_sequences_come_from_the_scheduled_source(void **state) {
    (void)state;
    const char *dir = make_sources("sched");
    pt_mix m;
    open_mix(&m, dir, 3, "0.5, 0.3, 0.2", 0);
    int G = 8;
    int32_t in[8 * T], tg[8 * T];
    int64_t seen[3] = {0};
    for (int64_t s = 0; s < 300; s++) {
        pt_mix_batch(&m, s, G, 0, G, in, tg);
        for (int j = 0; j < G; j++) {
            int src;
            int64_t row, q;
            decode(in + j * T, tg + j * T, &src, &row);
            int want = pt_mix_source(&m, s * G + j, &q);
            if (src != want)
                fail_msg("step %lld sequence %d: read from source %d, the schedule says %d",
                         (long long)s, j, src, want);
            /* the q-th sequence of a source is its q-th: unshuffled, row q mod rows */
            assert_int_equal(q, seen[src]);
            assert_int_equal(row, q % m.src[src].n_rows);
            seen[src]++;
        }
    }
    for (int i = 0; i < 3; i++) assert_int_equal(seen[i], pt_mix_count(&m, i, 300 * G));
    pt_mix_close(&m);
}

/* The largest |share − weight| over every K in [1000, Kmax], from the counts; the counts against
 * the schedule read sequence by sequence up to 3·B. */
static double worst_share(const char *dir, int n, const char *weights, const double *w) {
    pt_mix m;
    open_mix(&m, dir, n, weights, 0);
    int64_t count[4] = {0}, Kmax = 100000;
    double worst = 0;
    for (int64_t K = 0; K < Kmax; K++) {
        if (K < 3 * PT_MIX_BLOCK) {
            for (int i = 0; i < n; i++) assert_int_equal(pt_mix_count(&m, i, K), count[i]);
            int64_t q;
            count[pt_mix_source(&m, K, &q)]++;
        }
        if (K < 1000) continue;
        const double *share = pt_mix_shares(&m, K);
        double sum = 0;
        for (int i = 0; i < n; i++) {
            double d = fabs(share[i] - w[i]);
            worst = d > worst ? d : worst;
            sum += share[i];
        }
        assert_true(fabs(sum - 1) < 1e-12);
    }
    /* a block gives each source exactly its places */
    for (int i = 0; i < n; i++)
        assert_int_equal(pt_mix_count(&m, i, PT_MIX_BLOCK), m.per_block[i]);
    pt_mix_close(&m);
    return worst;
}

static void test_shares_within_one_point_after_1000_sequences(void **state) {
    (void)state;
    const char *dir = make_sources("shares");
    struct {
        int n;
        const char *weights;
        double w[4];
    } sets[] = {
        {2, "0.7, 0.3", {0.7, 0.3}},
        {3, "0.5,0.3,0.2", {0.5, 0.3, 0.2}},
        {3, "0.9, 0.05, 0.05", {0.9, 0.05, 0.05}},
        {3, "1, 1, 1", {1 / 3.0, 1 / 3.0, 1 / 3.0}},
        {4, "7, 2, 0.5, 0.5", {0.7, 0.2, 0.05, 0.05}},
    };
    for (size_t k = 0; k < sizeof sets / sizeof *sets; k++) {
        double worst = worst_share(dir, sets[k].n, sets[k].weights, sets[k].w);
        printf("weights %-16s: largest |share - weight| over 1000..100000 sequences %.3f pp\n",
               sets[k].weights, 100 * worst);
        if (worst > 0.01)
            fail_msg("weights %s: a share is %.3f pp from its weight", sets[k].weights, 100 * worst);
    }
}

static void test_a_small_source_wraps_into_its_next_epoch(void **state) {
    (void)state;
    const char *dir = make_sources("wrap");
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        pt_mix m;
        open_mix(&m, dir, 3, "0.5, 0.25, 0.25", shuffle); /* math: 5 rows */
        int64_t rows = m.src[2].n_rows, q_seen = 0;
        assert_int_equal(rows, 5);
        int32_t in[T], tg[T];
        char epoch_rows[8] = {0};
        int differs = 0;
        int64_t first[5];
        for (int64_t k = 0; k < 400; k++) {
            int64_t q;
            if (pt_mix_source(&m, k, &q) != 2) continue;
            assert_int_equal(q, q_seen++);
            pt_mix_batch(&m, 0, 1, k, 1, in, tg);
            int src;
            int64_t row;
            decode(in, tg, &src, &row);
            assert_int_equal(src, 2);
            if (!shuffle) assert_int_equal(row, q % rows); /* epoch e reads rows 0..4 again */
            assert_false(epoch_rows[row]);                 /* each epoch: every row once */
            epoch_rows[row] = 1;
            if (q < rows) first[q] = row;
            else if (first[q % rows] != row) differs = 1;
            if (q % rows == rows - 1) memset(epoch_rows, 0, sizeof epoch_rows);
        }
        assert_true(q_seen >= 19 * rows); /* about 100 of 400 sequences: 20 epochs */
        assert_int_equal(differs, shuffle); /* shuffled: another permutation per epoch */
        pt_mix_close(&m);
    }
}

static void test_reading_is_deterministic_and_stateless(void **state) {
    (void)state;
    const char *dir = make_sources("determ");
    pt_mix a, b;
    open_mix(&a, dir, 3, "0.5, 0.3, 0.2", 1);
    open_mix(&b, dir, 3, "0.5, 0.3, 0.2", 1);
    int G = 8;
    int32_t ia[8 * T], ta[8 * T], ib[8 * T], tb[8 * T];
    /* b reads the steps backwards and each batch in pieces: the same rows */
    for (int64_t s = 0; s < 120; s++) {
        pt_mix_batch(&a, s, G, 0, G, ia, ta);
        int64_t sb = 119 - s;
        pt_mix_batch(&b, sb, G, 0, G, ib, tb);
        pt_mix_batch(&b, s, G, 0, 3, ib, tb);
        pt_mix_batch(&b, s, G, 3, 5, ib + 3 * T, tb + 3 * T);
        assert_memory_equal(ia, ib, sizeof ia);
        assert_memory_equal(ta, tb, sizeof ta);
    }
    pt_mix_close(&a);
    pt_mix_close(&b);
}

/* The rows source `name` gives, in the order it gives them, over the first K sequences. */
static int64_t *rows_of(pt_mix *m, int src, int64_t K, int64_t *n) {
    int64_t *r = malloc((size_t)K * sizeof *r);
    *n = 0;
    for (int64_t k = 0; k < K; k++) {
        int i;
        int64_t row = pt_mix_row(m, 0, k, 1, &i);
        if (i == src) r[(*n)++] = row;
    }
    return r;
}

static void test_each_source_reads_its_own_order(void **state) {
    (void)state;
    const char *dir = make_sources("own");
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        /* web's rows in the order read are the same whatever the weights and the other sources */
        pt_mix m1, m2, m3;
        open_mix(&m1, dir, 2, "0.7, 0.3", shuffle);
        open_mix(&m2, dir, 4, "0.2, 0.3, 0.25, 0.25", shuffle);
        open_mix(&m3, dir, 3, "1, 1, 1", shuffle);
        int64_t n1, n2, n3;
        int64_t *r1 = rows_of(&m1, 0, 3000, &n1), *r2 = rows_of(&m2, 0, 3000, &n2);
        int64_t *r3 = rows_of(&m3, 0, 3000, &n3);
        int64_t n = n1 < n2 ? n1 : n2;
        n = n < n3 ? n : n3;
        assert_true(n >= 590); /* about 600 of 3000 at 0.2: 3 epochs of 200 rows */
        for (int64_t q = 0; q < n; q++) {
            assert_int_equal(r1[q], r2[q]);
            assert_int_equal(r1[q], r3[q]);
        }
        /* and it is web's own order: unshuffled 0, 1, 2, …; shuffled each epoch a permutation of
         * its 200 rows, not the identity, another one per epoch */
        int64_t rows = m1.src[0].n_rows, ident = 0, same_as_epoch0 = 0;
        char *seen = calloc((size_t)rows, 1);
        for (int64_t q = 0; q < 3 * rows; q++) {
            if (q % rows == 0) memset(seen, 0, (size_t)rows);
            assert_false(seen[r1[q]]);
            seen[r1[q]] = 1;
            ident += r1[q] == q % rows;
            if (q >= rows) same_as_epoch0 += r1[q] == r1[q % rows];
        }
        if (shuffle) {
            assert_true(ident < rows / 4);
            assert_true(same_as_epoch0 < rows / 4);
        } else {
            assert_int_equal(ident, 3 * rows);
        }
        /* a source's order is its own: code and web differ, shuffled, in the same mix */
        if (shuffle) {
            int64_t nc, diff = 0;
            int64_t *rc = rows_of(&m3, 1, 3000, &nc);
            for (int64_t q = 0; q < 30; q++) diff += rc[q] != r3[q];
            assert_true(diff > 20);
            free(rc);
        }
        free(seen);
        free(r1);
        free(r2);
        free(r3);
        pt_mix_close(&m1);
        pt_mix_close(&m2);
        pt_mix_close(&m3);
    }
}

static void test_data_train_alone_reads_the_single_order(void **state) {
    (void)state;
    const char *dir = make_sources("single");
    char glob[700];
    snprintf(glob, sizeof glob, "%s/web_*.bin", dir);
    for (int shuffle = 0; shuffle <= 1; shuffle++) {
        pt_mix m;
        pt_data d;
        assert_int_equal(pt_mix_open(&m, glob, "", "", T, shuffle, 99, 0), PT_OK);
        assert_int_equal(pt_data_open(&d, glob, T, shuffle, 99, 0), PT_OK);
        assert_false(m.mixed);
        for (int64_t s = 0; s < 80; s++)
            for (int j = 0; j < 8; j++) {
                int i;
                assert_int_equal(pt_mix_row(&m, s, j, 8, &i), pt_data_row(&d, s, j, 8));
                assert_int_equal(i, 0);
            }
        pt_mix_close(&m);
        pt_data_close(&d);
    }
}

static void expect_parse_error(const char *sources, const char *weights, const char *needle) {
    pt_mix_spec spec;
    pt_status st = pt_mix_parse(sources, weights, &spec);
    pt_mix_spec_free(&spec);
    assert_int_equal(st, PT_ERR_CONFIG);
    if (!strstr(pt_last_error(), needle))
        fail_msg("[%s | %s]: error \"%s\" does not mention \"%s\"", sources, weights,
                 pt_last_error(), needle);
}

static void test_bad_sources_and_weights_are_named(void **state) {
    (void)state;
    pt_mix_spec spec;
    assert_int_equal(pt_mix_parse(" a = x/*.bin ,b=y/*.bin", " 3 , 1", &spec), PT_OK);
    assert_int_equal(spec.n, 2);
    assert_string_equal(spec.name[0], "a");
    assert_string_equal(spec.glob[0], "x/*.bin");
    assert_true(fabs(spec.weight[0] - 0.75) < 1e-15);
    assert_int_equal(spec.per_block[0] + spec.per_block[1], PT_MIX_BLOCK);
    assert_int_equal(spec.per_block[0], 3072);
    pt_mix_spec_free(&spec);
    expect_parse_error("a=x, b", "1, 1", "\"b\" is not NAME=GLOB");
    expect_parse_error("a=x,,b=y", "1, 1", "item 2 is empty");
    expect_parse_error("a b=x", "1", "source name \"a b\"");
    expect_parse_error("=x", "1", "source name \"\"");
    expect_parse_error("a=", "1", "source a has an empty glob");
    expect_parse_error("a=x, a=y", "1, 1", "source name a appears twice");
    expect_parse_error("a=x, b=y", "1", "data.weights has 1 value for the 2 sources");
    expect_parse_error("a=x, b=y", "", "data.weights has 0 values for the 2 sources");
    expect_parse_error("a=x, b=y", "1, 2, 3", "data.weights has 3 values");
    expect_parse_error("a=x, b=y", "1, 0", "\"0\" (weight 2) is not a positive number");
    expect_parse_error("a=x, b=y", "1, -2", "\"-2\" (weight 2) is not a positive number");
    expect_parse_error("a=x, b=y", "1, abc", "\"abc\" (weight 2) is not a positive number");
    expect_parse_error("a=x, b=y", "1, inf", "\"inf\" (weight 2)");
    expect_parse_error("a=x, b=y", "1, 1e-6", "source b's share 1e-06 is below");
    /* a glob matching nothing: at open, naming the source */
    pt_mix m;
    assert_int_equal(pt_mix_open(&m, "", "a=/nonexistent/none_*.bin", "1", T, 0, 1, 0),
                     PT_ERR_CONFIG);
    assert_non_null(strstr(pt_last_error(), "data.sources: source a: no file matches"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequences_come_from_the_scheduled_source),
        cmocka_unit_test(test_shares_within_one_point_after_1000_sequences),
        cmocka_unit_test(test_a_small_source_wraps_into_its_next_epoch),
        cmocka_unit_test(test_reading_is_deterministic_and_stateless),
        cmocka_unit_test(test_each_source_reads_its_own_order),
        cmocka_unit_test(test_data_train_alone_reads_the_single_order),
        cmocka_unit_test(test_bad_sources_and_weights_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
