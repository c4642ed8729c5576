/* test_cuda_host_kmath.c: the CUDA backend's arithmetic (src/backend/cuda/kmath.h) and its memory
 * arena (arena.c), run on the host against the CPU backend's kernels and against a model of the
 * arena. Runs on every build, GPU or not: each kernel of ops.cu is a loop around these functions,
 * so this is where its arithmetic is checked.
 *
 * Each check simulates its kernel's structure: a row kernel's PT_K_ROW_THREADS lanes each summing
 * the elements lane, lane + 256, ..., their partials added by pt_k_tree_sum; an element kernel's
 * function per element. Compiled with -ffp-contract=off (tests/CMakeLists.txt), so every operation
 * rounds as the device's _rn intrinsics do.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "backend/cuda/arena.h"
#include "backend/cuda/kmath.h"
#include "testutil.h"

static pt_backend cpu; /* zeroed: the CPU kernels need no context */

/* the ulps between two finite floats of the same sign */
static int64_t ulps(float a, float b) {
    int64_t x = (int32_t)tu_f32_bits(a), y = (int32_t)tu_f32_bits(b);
    return x > y ? x - y : y - x;
}

/* e^x: the CPU backend's polynomial. pt_cpu_expf is inlined here, in a file compiled without
 * contraction, while pt_k_expf fuses its multiply-adds as the library's build of pt_cpu_expf does
 * (test_cuda_host_attn checks that bitwise): within 1 ulp of each other; exact at the edges. */
static void test_expf(void **state) {
    (void)state;
    int64_t worst = 0;
    for (int i = 0; i <= 400000; i++) {
        float x = -120.0f + 210.0f * (float)i / 400000.0f;
        float a = pt_k_expf(x), b = pt_cpu_expf(x);
        int64_t u = ulps(a, b);
        if (u > worst) worst = u;
        /* and within 3 ulp of libm's (2 for the polynomial, 1 for the rounding) */
        if (x > -87.0f && x < 88.0f) assert_true(ulps(a, expf(x)) <= 3);
    }
    print_message("pt_k_expf vs pt_cpu_expf: at most %lld ulp apart\n", (long long)worst);
    assert_true(worst <= 1);
    assert_true(pt_k_expf(-INFINITY) == 0.0f);
    assert_true(isnan(pt_k_expf(NAN)));
    assert_true(pt_k_expf(0.0f) == 1.0f);
    assert_true(pt_k_expf(100.0f) == pt_cpu_expf(100.0f));
}

/* bf16: bitwise pt_bf16_round on every class of value, ties included */
static void test_bf16(void **state) {
    (void)state;
    pt_rng r;
    pt_rng_seed(&r, 7);
    const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                0x7f800001u, 0xffbfffffu, 0x00000001u, 0x007fffffu, 0x3f808000u,
                                0x3f818000u, 0x7f7fffffu, 0x7f7f8000u, 0x00008000u, 0x00018000u};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++) {
        float x = tu_f32_from_bits(special[i]);
        assert_int_equal(pt_k_bf16_round(x), pt_bf16_round(x));
    }
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = (uint32_t)pt_rng_next(&r);
        if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u; /* an exact tie */
        float x = tu_f32_from_bits(u);
        uint16_t h = pt_k_bf16_round(x);
        assert_int_equal(h, pt_bf16_round(x));
        if (!isnan(x)) assert_true(pt_k_bf16_to_float(h) == pt_bf16_to_float(h));
    }
}

/* the fixed tree: pairs (i, i + s), halving s */
static void test_tree(void **state) {
    (void)state;
    double v[8] = {1e16, 1, -1e16, 1, 2, 3, 4, 5};
    /* s = 4: {1e16+2, 4, -1e16+4, 6}; s = 2: {2+1e16-1e16+4... } computed by hand: */
    double w[8];
    memcpy(w, v, sizeof w);
    for (int i = 0; i < 4; i++) w[i] += w[i + 4];
    for (int i = 0; i < 2; i++) w[i] += w[i + 2];
    w[0] += w[1];
    assert_true(pt_k_tree_sum(v, 8) == w[0]);
    float m[4] = {1, -INFINITY, 7, 3};
    assert_true(pt_k_tree_max(m, 4) == 7.0f);
}

/* a row kernel's sum: lanes, then the tree */
static double row_sum_sumsq(const float *x, int C) {
    double part[PT_K_ROW_THREADS];
    for (int l = 0; l < PT_K_ROW_THREADS; l++) part[l] = pt_k_sumsq_lane(x, C, l, PT_K_ROW_THREADS);
    return pt_k_tree_sum(part, PT_K_ROW_THREADS);
}

static void test_rmsnorm(void **state) {
    (void)state;
    const int shapes[][2] = {{7, 64}, {5, 300}, {3, 2048}, {2, 5}, {700, 96}};
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int N = shapes[si][0], C = shapes[si][1];
        size_t nc = (size_t)N * C;
        float *x = malloc(nc * 4), *w = malloc(C * 4), *dy = malloc(nc * 4);
        float *y0 = malloc(nc * 4), *y1 = malloc(nc * 4), *r0 = malloc(N * 4), *r1 = malloc(N * 4);
        float *dx0 = calloc(nc, 4), *dx1 = calloc(nc, 4), *dw0 = calloc(C, 4), *dw1 = calloc(C, 4);
        tu_fill(x, nc, 1 + si, 2.0f);
        tu_fill(w, C, 2 + si, 1.0f);
        tu_fill(dy, nc, 3 + si, 1.0f);
        for (size_t i = 0; i < nc; i++) dx0[i] = dx1[i] = 0.25f * x[i]; /* "+=" */
        for (int c = 0; c < C; c++) dw0[c] = dw1[c] = 0.5f;
        pt_cpu_rmsnorm_forward(&cpu, y0, r0, x, w, N, C, 1e-5f);
        pt_cpu_rmsnorm_backward(&cpu, dx0, dw0, dy, x, w, r0, N, C);
        /* the kernels of ops.cu, on the host */
        for (int i = 0; i < N; i++) {
            const float *xr = x + (size_t)i * C, *dyr = dy + (size_t)i * C;
            r1[i] = pt_k_rmsnorm_rstd(row_sum_sumsq(xr, C), C, 1e-5f);
            for (int c = 0; c < C; c++) y1[(size_t)i * C + c] = pt_k_rmsnorm_out(xr[c], w[c], r1[i]);
            double part[PT_K_ROW_THREADS];
            for (int l = 0; l < PT_K_ROW_THREADS; l++)
                part[l] = pt_k_rmsnorm_dot_lane(dyr, w, xr, C, l, PT_K_ROW_THREADS);
            float coef = pt_k_rmsnorm_coef(r1[i], pt_k_tree_sum(part, PT_K_ROW_THREADS), C);
            for (int c = 0; c < C; c++) {
                float *d = dx1 + (size_t)i * C + c;
                *d = pt_k_rmsnorm_dx(*d, r1[i], w[c], dyr[c], coef, xr[c]);
            }
        }
        for (int c = 0; c < C; c++) { /* k_rmsnorm_dw_part, then k_rmsnorm_dw_total */
            double total = 0.0;
            for (int k = 0; k < pt_k_dw_chunks(N); k++) {
                double acc = 0.0;
                for (int i = k * PT_K_DW_ROWS; i < N && i < (k + 1) * PT_K_DW_ROWS; i++)
                    acc = pt_k_rmsnorm_dw_term(acc, dy[(size_t)i * C + c], x[(size_t)i * C + c],
                                               r1[i]);
                total += acc;
            }
            dw1[c] += (float)total;
        }
        tu_check_rel("rmsnorm rstd", tu_rel_err(r1, r0, N), 1e-7);
        tu_check_rel("rmsnorm out", tu_rel_err(y1, y0, nc), 1e-7);
        tu_check_rel("rmsnorm dx", tu_rel_err(dx1, dx0, nc), 1e-6);
        /* the weight gradient: double sums regrouped by chunks, rounded to float once: the
         * CPU's floats but where a double rounding meets a float boundary */
        tu_check_rel("rmsnorm dw", tu_rel_err(dw1, dw0, C), 1e-7);
        free(x), free(w), free(dy), free(y0), free(y1), free(r0), free(r1);
        free(dx0), free(dx1), free(dw0), free(dw1);
    }
}

static void test_rope(void **state) {
    (void)state;
    const int N = 9, H = 3, hd = 16, half = hd / 2, ld = H * hd + 5, maxp = 40;
    float *ct = malloc(maxp * half * 4), *st = malloc(maxp * half * 4);
    for (int p = 0; p < maxp; p++)
        for (int i = 0; i < half; i++) {
            double a = p * pow(10000.0, -2.0 * i / hd);
            ct[p * half + i] = (float)cos(a), st[p * half + i] = (float)sin(a);
        }
    int32_t pos[9] = {0, 3, 39, 7, 7, 12, 1, 30, 22};
    size_t n = (size_t)N * ld;
    float *x0 = malloc(n * 4), *x1 = malloc(n * 4);
    for (int inverse = 0; inverse < 2; inverse++) {
        tu_fill(x0, n, 11, 1.0f);
        memcpy(x1, x0, n * 4);
        pt_cpu_rope(&cpu, x0, pos, N, H, hd, ld, ct, st, inverse);
        for (int r = 0; r < N; r++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < half; i++) {
                    float *a = x1 + (size_t)r * ld + h * hd;
                    size_t t = (size_t)pos[r] * half + i;
                    pt_k_rope_pair(a + i, a + i + half, ct[t], (inverse ? -1.0f : 1.0f) * st[t]);
                }
        tu_check_rel("rope", tu_rel_err(x1, x0, n), 1e-7);
        /* the padding columns untouched */
        for (int r = 0; r < N; r++)
            for (int c = H * hd; c < ld; c++) assert_true(x1[(size_t)r * ld + c] == x0[(size_t)r * ld + c]);
    }
    free(ct), free(st), free(x0), free(x1);
}

static void test_swiglu(void **state) {
    (void)state;
    const int N = 6, F = 333;
    size_t nf = (size_t)N * F;
    float *gu = malloc(2 * nf * 4), *dh = malloc(nf * 4), *h0 = malloc(nf * 4), *h1 = malloc(nf * 4);
    float *dgu0 = malloc(2 * nf * 4), *dgu1 = malloc(2 * nf * 4);
    tu_fill(gu, 2 * nf, 21, 6.0f);
    tu_fill(dh, nf, 22, 1.0f);
    pt_cpu_swiglu_forward(&cpu, h0, gu, N, F);
    pt_cpu_swiglu_backward(&cpu, dgu0, dh, gu, N, F);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            const float *g = gu + (size_t)i * 2 * F;
            h1[(size_t)i * F + j] = pt_k_swiglu(g[j], g[F + j]);
            pt_k_swiglu_backward(g[j], g[F + j], dh[(size_t)i * F + j], &dgu1[(size_t)i * 2 * F + j],
                                 &dgu1[(size_t)i * 2 * F + F + j]);
        }
    tu_check_rel("swiglu forward", tu_rel_err(h1, h0, nf), 1e-6);
    tu_check_rel("swiglu backward", tu_rel_err(dgu1, dgu0, 2 * nf), 1e-6);
    free(gu), free(dh), free(h0), free(h1), free(dgu0), free(dgu1);
}

/* softmax_xent, xent_stats and xent_grad as k_softmax_xent / k_xent_stats / k_xent_grad do them */
static void host_row_stats(const float *row, int V, float *mx, double *sum) {
    float pm[PT_K_ROW_THREADS];
    double ps[PT_K_ROW_THREADS];
    for (int l = 0; l < PT_K_ROW_THREADS; l++) pm[l] = pt_k_max_lane(row, V, l, PT_K_ROW_THREADS);
    *mx = pt_k_tree_max(pm, PT_K_ROW_THREADS);
    for (int l = 0; l < PT_K_ROW_THREADS; l++)
        ps[l] = pt_k_expsum_lane(row, V, *mx, l, PT_K_ROW_THREADS);
    *sum = pt_k_tree_sum(ps, PT_K_ROW_THREADS);
}

static void test_xent(void **state) {
    (void)state;
    const int n = 5, V = 5003, ld = 5008;
    int32_t tg[5] = {0, 5002, -1, 17, 2500};
    size_t nl = (size_t)n * ld;
    float *l0 = malloc(nl * 4), *l1 = malloc(nl * 4), *loss0 = malloc(n * 4), *loss1 = malloc(n * 4);
    tu_fill(l0, nl, 31, 8.0f);
    memcpy(l1, l0, nl * 4);
    const float dscale = 0.125f;
    pt_cpu_softmax_xent(&cpu, l0, loss0, tg, n, V, ld, dscale);
    for (int i = 0; i < n; i++) {
        float *row = l1 + (size_t)i * ld;
        if (tg[i] == -1) {
            loss1[i] = 0.0f;
            for (int j = 0; j < V; j++) row[j] = 0.0f;
            continue;
        }
        float mx;
        double sum;
        host_row_stats(row, V, &mx, &sum);
        float xt = row[tg[i]], sc = pt_k_xent_scale(dscale, sum);
        for (int j = 0; j < V; j++) {
            float g = pt_k_xent_grad(row[j], mx, sc);
            row[j] = j == tg[i] ? g - dscale : g;
        }
        loss1[i] = pt_k_xent_loss(mx, sum, xt);
    }
    tu_check_rel("softmax_xent losses", tu_rel_err(loss1, loss0, n), 1e-6);
    for (int i = 0; i < n; i++)
        tu_check_rel("softmax_xent gradient row", tu_rel_err(l1 + (size_t)i * ld, l0 + (size_t)i * ld, V),
                     1e-6);

    /* the vocabulary-parallel pair over a block [v0, v0 + V2) */
    const int V2 = 3001, v0 = 1000;
    float *s0 = malloc(3 * n * 4), *s1 = malloc(3 * n * 4);
    tu_fill(l0, nl, 32, 8.0f);
    memcpy(l1, l0, nl * 4);
    pt_cpu_xent_stats(&cpu, l0, tg, n, V2, ld, v0, s0);
    for (int i = 0; i < n; i++) {
        float mx;
        double sum;
        host_row_stats(l1 + (size_t)i * ld, V2, &mx, &sum);
        int32_t t = tg[i] - v0;
        s1[3 * i] = mx, s1[3 * i + 1] = (float)sum;
        s1[3 * i + 2] = tg[i] >= 0 && t >= 0 && t < V2 ? l1[(size_t)i * ld + t] : 0.0f;
    }
    assert_true(s0[0] == s1[0] && s0[3] == s1[3]); /* the max: exact */
    tu_check_rel("xent_stats", tu_rel_err(s1, s0, 3 * n), 1e-6);
    float M[5], S[5];
    for (int i = 0; i < n; i++) M[i] = s0[3 * i] + 0.5f, S[i] = s0[3 * i + 1] * 1.7f;
    pt_cpu_xent_grad(&cpu, l0, tg, n, V2, ld, v0, M, S, dscale);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < ld; j++) {
            float *x = l1 + (size_t)i * ld + j;
            if (tg[i] < 0 || j >= V2) {
                *x = 0.0f;
                continue;
            }
            float g = pt_k_xent_grad(*x, M[i], pt_k_xent_scale(dscale, (double)S[i]));
            *x = tg[i] - v0 == j ? g - dscale : g;
        }
    tu_check_rel("xent_grad", tu_rel_err(l1, l0, nl), 1e-6);
    free(l0), free(l1), free(loss0), free(loss1), free(s0), free(s1);
}

/* Sums into indexed rows as k_row_keys, CUB's stable radix sort and k_run_sums do them (the sort
 * here a stable sort on the host): bitwise the CPU backend's embedding backward (adds) and
 * scatter-add (its build fuses the multiply-add, as pt_k_scatter_term does; without FMA in its
 * build the two would differ by roundings, and this test says so) */
typedef struct {
    uint32_t key;
    int32_t val;
} kv_pair;
static int kv_cmp(const void *a, const void *b) { /* stable: the positions break ties */
    const kv_pair *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return (x->val > y->val) - (x->val < y->val);
}
static void host_sorted_scatter(float *dst, const float *src, const int32_t *idx, const float *scale,
                                int n, int C, int row0, int rows) {
    kv_pair *kv = malloc((size_t)n * sizeof *kv);
    uint32_t *keys = malloc((size_t)n * 4);
    for (int i = 0; i < n; i++) kv[i] = (kv_pair){pt_k_row_key((int64_t)idx[i] - row0, rows), i};
    qsort(kv, (size_t)n, sizeof *kv, kv_cmp);
    for (int p = 0; p < n; p++) keys[p] = kv[p].key;
    for (int p = 0; p < n; p++) {
        if (!pt_k_run_start(keys, p, rows)) continue;
        for (int c = 0; c < C; c++) {
            float *d = dst + (size_t)keys[p] * C + c, acc = *d;
            for (int q = p; q < n && keys[q] == keys[p]; q++)
                acc = pt_k_scatter_term(acc, scale ? scale[kv[q].val] : 1.0f,
                                        src[(size_t)kv[q].val * C + c]);
            *d = acc;
        }
    }
    free(kv), free(keys);
}

static void test_sorted_rows(void **state) {
    (void)state;
    const int n = 3000, C = 37, rows = 120, row0 = 40;
    int32_t *idx = malloc(n * 4);
    for (int i = 0; i < n; i++) idx[i] = (int32_t)((i * 7919u + (unsigned)(i / 100)) % 250u); /* repeats; some outside */
    float *src = malloc((size_t)n * C * 4), *sc = malloc(n * 4);
    float *d0 = malloc((size_t)250 * C * 4), *d1 = malloc((size_t)250 * C * 4);
    tu_fill(src, (size_t)n * C, 81, 1.0f);
    tu_fill(sc, n, 82, 2.0f);
    /* embedding: rows [row0, row0 + rows) of a shard */
    tu_fill(d0, (size_t)rows * C, 83, 1.0f);
    memcpy(d1, d0, (size_t)rows * C * 4);
    pt_cpu_embedding_backward(&cpu, d0, idx, src, n, C, row0, rows);
    host_sorted_scatter(d1, src, idx, NULL, n, C, row0, rows);
    assert_memory_equal(d1, d0, (size_t)rows * C * 4);
    /* scatter-add, with and without scales, over 250 destination rows */
    for (int with = 0; with < 2; with++) {
        tu_fill(d0, (size_t)250 * C, 84, 1.0f);
        memcpy(d1, d0, (size_t)250 * C * 4);
        pt_cpu_rows_scatter_add(&cpu, d0, src, idx, with ? sc : NULL, n, C);
        host_sorted_scatter(d1, src, idx, with ? sc : NULL, n, C, 0, INT32_MAX);
        if (memcmp(d1, d0, (size_t)250 * C * 4) != 0) {
            print_message("scatter-add: not bitwise the CPU's (its build does not fuse?)\n");
            tu_check_rel("scatter-add", tu_rel_err(d1, d0, (size_t)250 * C), 1e-6);
        }
    }
    free(idx), free(src), free(sc), free(d0), free(d1);
}

/* AdamW: the CPU's scalar loop rounds every operation and fuses the lerp, as kmath does, and its
 * AVX-512 body is bitwise that loop: bitwise equal */
static void test_adamw(void **state) {
    (void)state;
    const size_t n = 40037;
    float *p0 = malloc(n * 4), *p1 = malloc(n * 4), *g = malloc(n * 4);
    float *m0 = calloc(n, 4), *m1 = calloc(n, 4), *v0 = calloc(n, 4), *v1 = calloc(n, 4);
    tu_fill(p0, n, 41, 1.0f);
    memcpy(p1, p0, n * 4);
    for (int64_t step = 1; step <= 3; step++) {
        tu_fill(g, n, 42 + (uint64_t)step, 0.01f);
        const float lr = 3e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.7f;
        pt_cpu_adamw(&cpu, p0, g, m0, v0, n, lr, b1, b2, eps, wd, step, gs);
        /* the constants as pt_cuda_adamw computes them */
        double bc1 = 1.0 - pow((double)b1, (double)step), bc2 = 1.0 - pow((double)b2, (double)step);
        pt_k_adamw_consts k = {
            .decay = (float)(1.0 - (double)lr * (double)wd),
            .w1 = (float)(1.0 - (double)b1),
            .b2 = b2,
            .w2 = (float)(1.0 - (double)b2),
            .bc2_sqrt = (float)sqrt(bc2),
            .eps = eps,
            .neg_step = (float)(-((double)lr / bc1)),
            .gscale = gs,
        };
        for (size_t i = 0; i < n; i++) pt_k_adamw(p1 + i, g[i], m1 + i, v1 + i, &k);
    }
    assert_memory_equal(p1, p0, n * 4);
    assert_memory_equal(m1, m0, n * 4);
    assert_memory_equal(v1, v0, n * 4);
    free(p0), free(p1), free(g), free(m0), free(m1), free(v0), free(v1);
}

/* Σ x²: the blocks and lanes of k_sumsq_part, the tree of k_sumsq_total */
static double host_sumsq(const float *x, size_t n) {
    double blocks[PT_K_SUMSQ_BLOCKS], lanes[PT_K_SUMSQ_THREADS];
    for (int b = 0; b < PT_K_SUMSQ_BLOCKS; b++) {
        for (int l = 0; l < PT_K_SUMSQ_THREADS; l++) lanes[l] = pt_k_sumsq_part(x, n, b, l);
        blocks[b] = pt_k_tree_sum(lanes, PT_K_SUMSQ_THREADS);
    }
    return pt_k_tree_sum(blocks, PT_K_SUMSQ_BLOCKS);
}

static void test_sumsq(void **state) {
    (void)state;
    const size_t sizes[] = {1, 7, 511, 512, 513, 100003, 3000017};
    for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
        size_t n = sizes[si];
        float *x = malloc(n * 4);
        tu_fill(x, n, 51 + si, 3.0f);
        double a = host_sumsq(x, n), b = pt_cpu_sumsq(&cpu, x, n), exact = 0;
        for (size_t i = 0; i < n; i++) exact += (double)x[i] * x[i];
        assert_true(fabs(a - b) <= 1e-12 * b);
        assert_true(fabs(a - exact) <= 1e-12 * exact);
        /* every element counted once: the chunks cover [0, n) */
        size_t covered = 0;
        for (int bl = 0; bl < PT_K_SUMSQ_BLOCKS; bl++) {
            size_t lo = (size_t)bl * pt_k_sumsq_chunk(n), hi = lo + pt_k_sumsq_chunk(n);
            if (lo < n) covered += (hi < n ? hi : n) - lo;
        }
        assert_int_equal(covered, n);
        free(x);
    }
}

static void test_grid(void **state) {
    (void)state;
    assert_int_equal(pt_k_grid_1d(0, 256), 1);
    assert_int_equal(pt_k_grid_1d(1, 256), 1);
    assert_int_equal(pt_k_grid_1d(256, 256), 1);
    assert_int_equal(pt_k_grid_1d(257, 256), 2);
    /* a 405B model's flat parameter buffer per rank: capped, the grid-stride loop does the rest */
    size_t big = (size_t)3 << 33;
    unsigned g = pt_k_grid_1d(big, 256);
    assert_true(g <= 65535u * 16u && g >= 1);
    assert_true((size_t)g * 256 * ((big + (size_t)g * 256 - 1) / ((size_t)g * 256)) >= big);
}

/* The arena against a model: random allocations and frees, every piece aligned, inside the region,
 * disjoint from every other, bytes in use and free adding up, neighbours merged (after freeing
 * everything one span is left) */
static void test_arena(void **state) {
    (void)state;
    pt_cuda_arena a;
    const size_t size = (size_t)64 << 20;
    pt_arena_init(&a, size, 512);
    assert_int_equal(pt_arena_largest_free(&a), size);
    assert_true(pt_arena_alloc(&a, size + 1) == SIZE_MAX);
    size_t off[400], len[400];
    int n = 0;
    pt_rng r;
    pt_rng_seed(&r, 99);
    int64_t allocs0 = pt_alloc_count();
    for (int it = 0; it < 20000; it++) {
        if (n < 400 && (n == 0 || pt_rng_next(&r) % 3 != 0)) {
            size_t bytes = pt_rng_next(&r) % 4 == 0 ? 0 : pt_rng_next(&r) % (300 << 10);
            size_t o = pt_arena_alloc(&a, bytes);
            if (o == SIZE_MAX) { /* full: then no free span is large enough */
                assert_true(pt_arena_largest_free(&a) < (bytes ? bytes : 1));
                continue;
            }
            assert_int_equal(o % PT_ARENA_ALIGN, 0);
            size_t l = pt_arena_len(&a, o);
            assert_true(l >= bytes && l % PT_ARENA_ALIGN == 0 && l > 0 && o + l <= size);
            for (int j = 0; j < n; j++) assert_true(o + l <= off[j] || off[j] + len[j] <= o);
            off[n] = o, len[n] = l, n++;
        } else {
            int j = (int)(pt_rng_next(&r) % (uint64_t)n);
            assert_int_equal(pt_arena_free(&a, off[j]), 1);
            assert_int_equal(pt_arena_free(&a, off[j]), 0); /* twice: refused */
            off[j] = off[n - 1], len[j] = len[n - 1], n--;
        }
        size_t used = 0;
        for (int j = 0; j < n; j++) used += len[j];
        assert_int_equal(a.in_use, used);
        size_t fr = 0;
        for (int j = 0; j < a.n_free; j++) {
            fr += a.free[j].len;
            if (j) assert_true(a.free[j - 1].off + a.free[j - 1].len < a.free[j].off); /* merged */
        }
        assert_int_equal(fr + used, a.size);
    }
    assert_int_equal(pt_alloc_count(), allocs0); /* the bookkeeping allocates at init only */
    while (n) assert_int_equal(pt_arena_free(&a, off[--n]), 1);
    assert_int_equal(a.n_free, 1);
    assert_int_equal(pt_arena_largest_free(&a), size);
    assert_true(a.peak > 0 && a.peak <= size);
    assert_int_equal(pt_arena_free(&a, 12345), 0);
    /* the bookkeeping's limit: a full table refuses instead of overflowing */
    pt_cuda_arena small;
    pt_arena_init(&small, (size_t)1 << 20, 3);
    for (int i = 0; i < 3; i++) assert_true(pt_arena_alloc(&small, 1) != SIZE_MAX);
    assert_true(pt_arena_alloc(&small, 1) == SIZE_MAX);
    pt_arena_destroy(&small);
    pt_arena_destroy(&a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf),    cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_tree),    cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),    cmocka_unit_test(test_swiglu),
        cmocka_unit_test(test_xent),    cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_sorted_rows),
        cmocka_unit_test(test_sumsq),   cmocka_unit_test(test_grid),
        cmocka_unit_test(test_arena),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
