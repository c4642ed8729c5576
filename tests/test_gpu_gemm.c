/* test_gpu_gemm.c: the CUDA backend's gemm and gemm_bf16 (cuBLASLt, src/backend/cuda/gemm.cu)
 * against the CPU backend's on the same inputs: every transpose pair, odd shapes and leading
 * dimensions, beta 0 (C poisoned with NaN: never read) and 1 (and 0.5 for fp32), empty products,
 * each call run twice and compared bitwise, padding and the row past C untouched, a
 * mixture-of-experts-like sequence of changing row counts (nothing allocated, the same shape
 * bitwise the same whatever came before it, in this backend or a fresh one), and the measured
 * peaks. Without a usable CUDA device it exits 77 before doing anything else: CTest reports it as
 * skipped (tests/CMakeLists.txt). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"
#include "testutil.h"

static pt_backend *g_cpu;

static pt_backend *cuda_backend(void) {
    pt_backend *be = pt_backend_cuda_create(0);
    if (!be) fail_msg("CUDA backend: %s", pt_last_error());
    return be;
}

static void *dev_copy(pt_backend *be, const void *host, size_t bytes) {
    void *d = be->alloc(be, bytes);
    be->upload(be, d, host, bytes);
    return d;
}

/* Row-major operands of C (M,N) = op(A)·op(B) with each ld the dense one + pad; the padding of A
 * and B NaN, so that a kernel reading it poisons its result. */
typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc;
    size_t na, nb, nc;
    float *A, *B, *C0; /* host fp32 */
    pt_bf16 *A16, *B16; /* host bf16 of the same values */
} operands;

static operands make_ops(int ta, int tb, int M, int N, int K, int pad, uint64_t seed) {
    operands o = {.ta = ta, .tb = tb, .M = M, .N = N, .K = K};
    o.lda = (ta ? M : K) + pad, o.ldb = (tb ? K : N) + pad, o.ldc = N + pad;
    const int ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
    o.na = (size_t)(ra > 0 ? ra : 1) * o.lda, o.nb = (size_t)(rb > 0 ? rb : 1) * o.ldb;
    o.nc = (size_t)(M > 0 ? M : 1) * o.ldc;
    o.A = malloc(o.na * 4), o.B = malloc(o.nb * 4), o.C0 = malloc(o.nc * 4);
    tu_fill(o.A, o.na, seed, 1.0f);
    tu_fill(o.B, o.nb, seed + 1, 1.0f);
    tu_fill(o.C0, o.nc, seed + 2, 1.0f);
    for (size_t i = 0; i < o.na; i++)
        if ((int)(i % (size_t)o.lda) >= ca) o.A[i] = NAN;
    for (size_t i = 0; i < o.nb; i++)
        if ((int)(i % (size_t)o.ldb) >= cb) o.B[i] = NAN;
    o.A16 = malloc(o.na * 2), o.B16 = malloc(o.nb * 2);
    for (size_t i = 0; i < o.na; i++) o.A16[i] = pt_bf16_round(o.A[i]);
    for (size_t i = 0; i < o.nb; i++) o.B16[i] = pt_bf16_round(o.B[i]);
    return o;
}

static void free_ops(operands *o) {
    free(o->A), free(o->B), free(o->C0), free(o->A16), free(o->B16);
}

/* C after the product on the CUDA backend (C starting as C0, or NaN where beta = 0 so that a read
 * of C shows), run twice from the same start and compared bitwise; one more row past C is checked
 * untouched. */
static float *cuda_product(pt_backend *be, const operands *o, int bf16, float alpha, float beta) {
    const size_t nc1 = o->nc + (size_t)o->ldc; /* a row past the end */
    float *start = malloc(nc1 * 4);
    for (size_t i = 0; i < nc1; i++) start[i] = i < o->nc ? o->C0[i] : -12345.0f;
    if (beta == 0.0f)
        for (int i = 0; i < o->M; i++)
            for (int j = 0; j < o->N; j++) start[(size_t)i * o->ldc + j] = NAN;
    void *A = dev_copy(be, bf16 ? (const void *)o->A16 : o->A, o->na * (bf16 ? 2 : 4));
    void *B = dev_copy(be, bf16 ? (const void *)o->B16 : o->B, o->nb * (bf16 ? 2 : 4));
    float *C = dev_copy(be, start, nc1 * 4);
    float *got[2];
    for (int r = 0; r < 2; r++) {
        be->upload(be, C, start, nc1 * 4);
        if (bf16)
            be->gemm_bf16(be, o->ta, o->tb, o->M, o->N, o->K, A, o->lda, B, o->ldb, beta, C,
                          o->ldc);
        else
            be->gemm(be, o->ta, o->tb, o->M, o->N, o->K, alpha, A, o->lda, B, o->ldb, beta, C,
                     o->ldc);
        got[r] = tu_download(be, C, nc1);
    }
    if (memcmp(got[0], got[1], nc1 * 4) != 0)
        fail_msg("%s ta=%d tb=%d %dx%dx%d: two runs differ", bf16 ? "gemm_bf16" : "gemm", o->ta,
                 o->tb, o->M, o->N, o->K);
    for (size_t i = 0; i < nc1; i++) {
        const int row = (int)(i / (size_t)o->ldc), col = (int)(i % (size_t)o->ldc);
        if ((row >= o->M || col >= o->N) && tu_f32_bits(got[0][i]) != tu_f32_bits(start[i]))
            fail_msg("%s ta=%d tb=%d %dx%dx%d: C[%d][%d] outside the product was written",
                     bf16 ? "gemm_bf16" : "gemm", o->ta, o->tb, o->M, o->N, o->K, row, col);
    }
    be->free(be, A), be->free(be, B), be->free(be, C);
    free(start), free(got[1]);
    return got[0];
}

/* the CPU backend's C (dense, M×N) for the same inputs */
static float *cpu_product(const operands *o, int bf16, float alpha, float beta) {
    float *C = malloc(o->nc * 4), *d = malloc((size_t)(o->M > 0 ? o->M : 1) * o->N * 4 + 4);
    memcpy(C, o->C0, o->nc * 4);
    if (bf16)
        g_cpu->gemm_bf16(g_cpu, o->ta, o->tb, o->M, o->N, o->K, o->A16, o->lda, o->B16, o->ldb,
                         beta, C, o->ldc);
    else
        g_cpu->gemm(g_cpu, o->ta, o->tb, o->M, o->N, o->K, alpha, o->A, o->lda, o->B, o->ldb,
                    beta, C, o->ldc);
    for (int i = 0; i < o->M; i++) memcpy(d + (size_t)i * o->N, C + (size_t)i * o->ldc, o->N * 4);
    free(C);
    return d;
}

static float *dense(const float *C, const operands *o) {
    float *d = malloc((size_t)(o->M > 0 ? o->M : 1) * o->N * 4 + 4);
    for (int i = 0; i < o->M; i++) memcpy(d + (size_t)i * o->N, C + (size_t)i * o->ldc, o->N * 4);
    return d;
}

/* fp32: the same products summed in another order: ‖gpu − cpu‖/‖cpu‖ ≤ 1e-6, more for long sums
 * (a sum of K random-sign terms drifts by about 2^-24·sqrt(K) relative, on each side) */
static void check_fp32(pt_backend *be, int ta, int tb, int M, int N, int K, int pad, float alpha,
                       float beta) {
    operands o = make_ops(ta, tb, M, N, K, pad, 1000 + 7 * ta + 3 * tb);
    float *g = cuda_product(be, &o, 0, alpha, beta), *gd = dense(g, &o);
    float *c = cpu_product(&o, 0, alpha, beta);
    const double tol = fmax(1e-6, 4.0 * 0x1p-24 * sqrt((double)K));
    char what[160];
    snprintf(what, sizeof what, "gemm ta=%d tb=%d %dx%dx%d lds %d,%d,%d alpha %g beta %g", ta, tb,
             M, N, K, o.lda, o.ldb, o.ldc, (double)alpha, (double)beta);
    tu_check_rel(what, tu_rel_err(gd, c, (size_t)M * N), tol);
    free(g), free(gd), free(c);
    free_ops(&o);
}

/* bf16: the inputs are exact in bf16, each product exact in fp32, so either side is within
 * (K + 1)·2^-24·(Σ|a·b| + |beta·c|) of the exact sum (test_gemm.c), and the two within twice
 * that, element by element. */
static void check_bf16(pt_backend *be, int ta, int tb, int M, int N, int K, int pad, float beta) {
    operands o = make_ops(ta, tb, M, N, K, pad, 2000 + 7 * ta + 3 * tb);
    float *g = cuda_product(be, &o, 1, 1.0f, beta);
    float *c = cpu_product(&o, 1, 1.0f, beta);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double mag = 0;
            for (int k = 0; k < K; k++) {
                const float a = pt_bf16_to_float(ta ? o.A16[(size_t)k * o.lda + i]
                                                    : o.A16[(size_t)i * o.lda + k]);
                const float b = pt_bf16_to_float(tb ? o.B16[(size_t)j * o.ldb + k]
                                                    : o.B16[(size_t)k * o.ldb + j]);
                mag += fabs((double)a * b);
            }
            const double c0 = beta * (double)o.C0[(size_t)i * o.ldc + j];
            const double tol = 2.0 * (K + 1) * 0x1p-24 * (mag + fabs(c0));
            const double got = g[(size_t)i * o.ldc + j], want = c[(size_t)i * N + j];
            if (!(fabs(got - want) <= tol))
                fail_msg("gemm_bf16 ta=%d tb=%d %dx%dx%d lds %d,%d,%d beta %g: C[%d][%d] = %.9g, "
                         "CPU %.9g (tolerance %.3g)", ta, tb, M, N, K, o.lda, o.ldb, o.ldc,
                         (double)beta, i, j, got, want, tol);
        }
    free(g), free(c);
    free_ops(&o);
}

static pt_backend *g_be;

static void test_fp32_every_transpose(void **state) {
    (void)state;
    const int shapes[][3] = {{37, 29, 53}, {1, 1, 1}, {1, 77, 64}, {65, 1, 33},
                             {129, 257, 65}, {256, 384, 512}, {300, 17, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3) {
                    check_fp32(g_be, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, 1.0f,
                               0.0f);
                    check_fp32(g_be, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, 1.0f,
                               1.0f);
                    check_fp32(g_be, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad, 0.75f,
                               0.5f);
                }
}

static void test_bf16_every_transpose(void **state) {
    (void)state;
    const int shapes[][3] = {{37, 29, 53}, {1, 1, 1}, {1, 77, 64}, {65, 1, 33},
                             {129, 257, 65}, {512, 768, 768}, {20, 32, 1000}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3)
                    for (int beta = 0; beta < 2; beta++)
                        check_bf16(g_be, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                                   (float)beta);
}

static void test_empty_products(void **state) {
    (void)state;
    /* K = 0: C = beta·C (0 where beta = 0, even over NaN); M or N = 0: nothing */
    for (int beta = 0; beta < 2; beta++) check_bf16(g_be, 0, 0, 3, 4, 0, 2, (float)beta);
    for (int b = 0; b < 3; b++) {
        const float beta = b == 0 ? 0.0f : b == 1 ? 1.0f : 0.5f;
        operands o = make_ops(1, 1, 3, 4, 0, 2, 77);
        float *g = cuda_product(g_be, &o, 0, 0.75f, beta);
        for (int i = 0; i < o.M; i++)
            for (int j = 0; j < o.N; j++) {
                const float want = beta == 0.0f ? 0.0f : beta * o.C0[(size_t)i * o.ldc + j];
                if (g[(size_t)i * o.ldc + j] != want)
                    fail_msg("gemm K=0 beta %g: C[%d][%d] = %g, expected %g", (double)beta, i, j,
                             (double)g[(size_t)i * o.ldc + j], (double)want);
            }
        free(g);
        free_ops(&o);
    }
    float host[6] = {1, 2, 3, 4, 5, 6}, back[6];
    float *C = dev_copy(g_be, host, sizeof host);
    float *A = g_be->alloc(g_be, 64), *B = g_be->alloc(g_be, 64);
    g_be->gemm(g_be, PT_NO_TRANS, PT_NO_TRANS, 0, 3, 2, 1.0f, A, 2, B, 3, 0.0f, C, 3);
    g_be->gemm(g_be, PT_NO_TRANS, PT_NO_TRANS, 2, 0, 2, 1.0f, A, 2, B, 1, 0.0f, C, 3);
    g_be->gemm_bf16(g_be, PT_NO_TRANS, PT_NO_TRANS, 0, 3, 2, (pt_bf16 *)A, 2, (pt_bf16 *)B, 3,
                    0.0f, C, 3);
    g_be->download(g_be, back, C, sizeof back);
    assert_memory_equal(back, host, sizeof host);
    g_be->free(g_be, A), g_be->free(g_be, B), g_be->free(g_be, C);
}

/* Mixture-of-experts buffers: op(A) (M, K) for M up to MMAX rows of fixed leading dimensions. */
enum { MOE_MMAX = 1024, MOE_N = 256, MOE_K = 384 };

typedef struct {
    operands o[2][2];
    void *A[2][2], *B[2][2];
    float *C;
} moe_bufs;

static void moe_make(pt_backend *be, moe_bufs *m) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            m->o[ta][tb] = make_ops(ta, tb, MOE_MMAX, MOE_N, MOE_K, 0, 3000 + 2 * ta + tb);
            m->A[ta][tb] = dev_copy(be, m->o[ta][tb].A16, m->o[ta][tb].na * 2);
            m->B[ta][tb] = dev_copy(be, m->o[ta][tb].B16, m->o[ta][tb].nb * 2);
        }
    m->C = be->alloc(be, (size_t)MOE_MMAX * MOE_N * 4);
}

static void moe_free(pt_backend *be, moe_bufs *m) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            be->free(be, m->A[ta][tb]), be->free(be, m->B[ta][tb]);
            free_ops(&m->o[ta][tb]);
        }
    be->free(be, m->C);
}

static void moe_call(pt_backend *be, moe_bufs *m, int ta, int tb, int M, int beta) {
    const operands *o = &m->o[ta][tb];
    be->gemm_bf16(be, ta, tb, M, MOE_N, MOE_K, m->A[ta][tb], o->lda, m->B[ta][tb], o->ldb,
                  (float)beta, m->C, o->ldc);
}

/* C of M = probe (ta = 0, tb = 1, beta 0: the forward X·Wᵀ) on the backend as it is now */
static float *moe_probe(pt_backend *be, moe_bufs *m, int probe) {
    be->zero(be, m->C, (size_t)MOE_MMAX * MOE_N * 4);
    moe_call(be, m, 0, 1, probe, 0);
    return tu_download(be, m->C, (size_t)probe * MOE_N);
}

static uint64_t lcg(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void test_moe_changing_rows(void **state) {
    (void)state;
    moe_bufs m;
    moe_make(g_be, &m);
    /* warm-up: the first calls of each (ta, tb, beta) */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++) moe_call(g_be, &m, ta, tb, 5, beta);
    float *first = moe_probe(g_be, &m, 777); /* memoised in its family */
    const int64_t allocs = pt_alloc_count(), mallocs = pt_cuda_malloc_count();
    uint64_t s = 4242;
    for (int c = 0; c < 3000; c++) { /* far more row counts than a family memoises */
        const int M = 1 + (int)(lcg(&s) % MOE_MMAX), r = (int)(lcg(&s) % 8);
        moe_call(g_be, &m, r & 1, (r >> 1) & 1, M, r >> 2);
    }
    g_be->synchronize(g_be);
    assert_int_equal(pt_alloc_count(), allocs);
    assert_int_equal(pt_cuda_malloc_count(), mallocs);
    /* the same shape, bitwise the same result, memoised or not */
    float *again = moe_probe(g_be, &m, 777);
    assert_memory_equal(first, again, (size_t)777 * MOE_N * 4);
    float *late = moe_probe(g_be, &m, 901); /* first seen with its family full here */
    print_message("%s\n", g_be->describe(g_be));
    /* and the results check against the CPU at a few row counts of every transpose */
    const int Ms[] = {1, 3, 17, 250, 901};
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
                operands o = m.o[ta][tb];
                o.M = Ms[i];
                float *g = cuda_product(g_be, &o, 1, 1.0f, 1.0f);
                float *c = cpu_product(&o, 1, 1.0f, 1.0f), *gd = dense(g, &o);
                tu_check_rel("MoE gemm_bf16 against the CPU",
                             tu_rel_err(gd, c, (size_t)o.M * MOE_N), 1e-5);
                free(g), free(gd), free(c);
            }
    moe_free(g_be, &m);
    /* a fresh backend that sees M = 901 first (memoised there) gives it bitwise too */
    g_be->destroy(g_be);
    g_be = cuda_backend();
    moe_make(g_be, &m);
    float *fresh = moe_probe(g_be, &m, 901);
    assert_memory_equal(late, fresh, (size_t)901 * MOE_N * 4);
    moe_free(g_be, &m);
    free(first), free(again), free(late), free(fresh);
}

static void test_peaks_measured(void **state) {
    (void)state;
    const double bf16 = pt_cuda_peak_tflops(g_be, 1), fp32 = pt_cuda_peak_tflops(g_be, 0);
    print_message("measured peaks: bf16 %.1f TFLOP/s, fp32 %.1f TFLOP/s\n", bf16, fp32);
    assert_true(bf16 > 10.0 && bf16 < 5000.0);
    assert_true(fp32 > 1.0 && fp32 < bf16);
    assert_non_null(strstr(g_be->describe(g_be), "cuBLASLt"));
}

static int setup(void **state) {
    (void)state;
    g_cpu = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    g_be = pt_backend_cuda_create(0);
    if (!g_cpu || !g_be) {
        fprintf(stderr, "backend: %s\n", pt_last_error());
        return -1;
    }
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (g_be) g_be->destroy(g_be);
    if (g_cpu) g_cpu->destroy(g_cpu);
    return 0;
}

int main(void) {
    if (pt_cuda_device_count() == 0) {
        fprintf(stderr, "test_gpu_gemm: no CUDA device: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peaks_measured),
        cmocka_unit_test(test_fp32_every_transpose),
        cmocka_unit_test(test_bf16_every_transpose),
        cmocka_unit_test(test_empty_products),
        cmocka_unit_test(test_moe_changing_rows),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
