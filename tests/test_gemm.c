/* test_gemm.c: the CPU backend's GEMM (both libraries, every transpose, alpha/beta, strides)
 * against a naive double-precision product, the OpenBLAS kernel choice on this CPU, and the bf16
 * GEMM under either library (every transpose, strides, beta 0 and 1, odd and model sizes, empty
 * products, its shape cache, row counts that change every call as mixture-of-experts layers make,
 * native or emulated: CTest runs this file again as test_gemm_isa_avx512_core with
 * DNNL_MAX_CPU_ISA=AVX512_CORE, where oneDNN emulates bf16). */
#include <cpuid.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "backend/cpu/gemm.h"
#include "pt/backend.h"
#include "pt/model.h"
#include "testutil.h"

static void naive(int ta, int tb, int M, int N, int K, float alpha, const float *A, int lda,
                  const float *B, int ldb, float beta, const float *C0, int ldc, double *out) {
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) {
                double a = ta ? A[(size_t)k * lda + i] : A[(size_t)i * lda + k];
                double b = tb ? B[(size_t)j * ldb + k] : B[(size_t)k * ldb + j];
                s += a * b;
            }
            out[(size_t)i * N + j] = alpha * s + (double)beta * C0[(size_t)i * ldc + j];
        }
}

static void check_bf16(pt_backend *be, int ta, int tb, int M, int N, int K, int pad, float beta);

/* Both GEMMs of a backend made with `lib`: gemm through lib, gemm_bf16 (oneDNN whatever lib). */
static void check_lib(pt_gemm_lib lib) {
    pt_backend *be = pt_backend_cpu_create(2, lib);
    if (!be) fail_msg("backend: %s", pt_last_error());
    int M = 37, N = 29, K = 53, pad = 3;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
            size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb;
            float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc((size_t)M * ldc * 4);
            float *C0 = malloc((size_t)M * ldc * 4), *got = malloc((size_t)M * N * 4);
            double *want = malloc((size_t)M * N * 8);
            tu_fill(A, na, 1 + ta, 1.0f);
            tu_fill(B, nb, 3 + tb, 1.0f);
            tu_fill(C0, (size_t)M * ldc, 5, 1.0f);
            memcpy(C, C0, (size_t)M * ldc * 4);
            be->gemm(be, ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C, ldc);
            naive(ta, tb, M, N, K, 0.75f, A, lda, B, ldb, 0.5f, C0, ldc, want);
            for (int i = 0; i < M; i++) {
                memcpy(got + (size_t)i * N, C + (size_t)i * ldc, (size_t)N * 4);
                for (int j = N; j < ldc; j++)
                    assert_true(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]); /* padding untouched */
            }
            char what[64];
            snprintf(what, sizeof what, "%s gemm ta=%d tb=%d", be->describe(be), ta, tb);
            tu_check_rel(what, tu_rel_err_d(got, want, (size_t)M * N), 1e-6);
            free(A), free(B), free(C), free(C0), free(got), free(want);
            for (int beta = 0; beta < 2; beta++) {
                check_bf16(be, ta, tb, M, N, K, pad, (float)beta);
                check_bf16(be, ta, tb, M, N, K, 0, (float)beta);
            }
        }
    be->destroy(be);
}

static void test_onednn_gemm_matches_double(void **state) {
    (void)state;
    check_lib(PT_GEMM_ONEDNN);
}

static void test_openblas_gemm_matches_double(void **state) {
    (void)state;
    check_lib(PT_GEMM_OPENBLAS);
}

static void test_openblas_gets_the_fast_kernel_unasked(void **state) {
    (void)state;
    /* Debian's OpenBLAS 0.3.21 picks Prescott on CPUs it does not know; with AVX-512 the backend
     * must choose an AVX-512 kernel without OPENBLAS_CORETYPE being set. */
    unsigned a, b, c, d;
    int avx512 = __get_cpuid_count(7, 0, &a, &b, &c, &d) && ((b >> 16) & 1) && ((b >> 30) & 1);
    const char *user = getenv("OPENBLAS_CORETYPE");
    pt_backend *be = pt_backend_cpu_create(1, PT_GEMM_OPENBLAS);
    assert_non_null(be);
    const char *desc = be->describe(be);
    print_message("%s\n", desc);
    if (avx512 && !(user && *user)) {
        if (!strstr(desc, "Cooperlake") && !strstr(desc, "SkylakeX"))
            fail_msg("OpenBLAS kernel is not an AVX-512 one: %s", desc);
    }
    if (!strstr(desc, "OpenBLAS sgemm, kernel ")) fail_msg("no kernel named in \"%s\"", desc);
    assert_null(strstr(desc, "Prescott"));
    be->destroy(be);
}

static void test_activation_memory_is_linear_in_seq_len(void **state) {
    (void)state;
    /* attention keeps no T×T matrix: the activations of T = 2048 are twice those of T = 1024 */
    pt_backend *be = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    pt_model_config c = {.vocab_size = 64, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                         .ffn_dim = 96, .max_seq_len = 4096, .rope_theta = 10000, .norm_eps = 1e-6f,
                         .init_std = 0.02f};
    pt_model m;
    assert_int_equal(pt_model_init(&m, &c, be), PT_OK);
    /* one at a time: the backward's scratch, once per rank, is sized by the first set made */
    double bytes[2];
    for (int i = 0; i < 2; i++) {
        pt_acts *a = pt_acts_create(&m, 1, 1024 << i);
        bytes[i] = (double)(pt_acts_bytes(a) + pt_model_workspace_bytes(&m));
        pt_acts_free(&m, a);
    }
    double ratio = bytes[1] / bytes[0];
    if (ratio > 2.01 || ratio < 1.9) fail_msg("activation bytes ratio T 2048/1024 = %.3f", ratio);
    pt_model_free(&m);
    be->destroy(be);
}

/* ---------------------------------------------------------------------------------------------
 * bf16 GEMM */

/* op(X) of a stored bf16 matrix as a dense double (rows, cols) array: element (i, k) is
 * X[i·ld + k], or X[k·ld + i] when transposed. */
static double *bf16_op_d(const pt_bf16 *X, int ld, int trans, int rows, int cols) {
    double *d = malloc((size_t)rows * cols * sizeof(double));
    for (int i = 0; i < rows; i++)
        for (int k = 0; k < cols; k++)
            d[(size_t)i * cols + k] =
                pt_bf16_to_float(trans ? X[(size_t)k * ld + i] : X[(size_t)i * ld + k]);
    return d;
}

/* A random bf16 matrix stored as (rows, cols) at stride ld, the padding columns NaN so that a
 * kernel reading them poisons its result. */
static pt_bf16 *bf16_matrix(pt_backend *be, int rows, int cols, int ld, uint64_t seed) {
    float *f = malloc((size_t)rows * ld * sizeof(float));
    pt_bf16 *h = malloc((size_t)rows * ld * sizeof(pt_bf16));
    tu_fill(f, (size_t)rows * ld, seed, 1.0f);
    for (int i = 0; i < rows; i++)
        for (int k = cols; k < ld; k++) f[(size_t)i * ld + k] = NAN;
    be->to_bf16(be, h, f, (size_t)rows * ld);
    free(f);
    return h;
}

/* C (M,N at ldc) = op(A)·op(B) + beta·C through gemm_bf16 (the backend's, or g's when g is not
 * NULL), on A, B and C0 as given (their padding NaN or untouched), against the double product of
 * the same bf16 values. Tolerance: the inputs are exact in bf16 (8 significant bits), so each
 * product a·b (16 bits) is exact in fp32 and the only error is the fp32 accumulation: K − 1
 * additions and the one of beta·C, in any order, each adding at most 2^-24 of a partial sum, so
 * |err| ≤ (K + 1)·2^-24·(Σ_k |a_k·b_k| + |beta·C|) element by element (a worst case; a wrong
 * transpose, stride or beta is off by the size of the entries). */
static void check_bf16_on(pt_backend *be, pt_cpu_bf16_matmul *g, int ta, int tb, int M, int N,
                          int K, const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb,
                          const float *C0, int ldc, float beta) {
    float *C = malloc((size_t)(M + 1) * ldc * sizeof(float)); /* and a row past the end */
    memcpy(C, C0, (size_t)M * ldc * sizeof(float));
    for (int j = 0; j < ldc; j++) C[(size_t)M * ldc + j] = -12345.0f;
    if (g)
        pt_cpu_gemm_bf16(g, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    else
        be->gemm_bf16(be, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    double *a = bf16_op_d(A, lda, ta, M, K), *bt = bf16_op_d(B, ldb, !tb, N, K);
    for (int i = 0; i < M; i++) {
        for (int j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                double p = a[(size_t)i * K + k] * bt[(size_t)j * K + k];
                s += p;
                mag += fabs(p);
            }
            const double c0 = beta * (double)C0[(size_t)i * ldc + j], want = s + c0;
            const double tol = (K + 1) * 0x1p-24 * (mag + fabs(c0));
            const double got = C[(size_t)i * ldc + j];
            if (!(fabs(got - want) <= tol))
                fail_msg("gemm_bf16 ta=%d tb=%d %dx%dx%d lda %d ldb %d ldc %d beta %g: C[%d][%d] "
                         "= %.9g, expected %.9g (tolerance %.3g)", ta, tb, M, N, K, lda, ldb, ldc,
                         (double)beta, i, j, got, want, tol);
        }
        for (int j = N; j < ldc; j++) /* padding untouched */
            assert_true(C[(size_t)i * ldc + j] == C0[(size_t)i * ldc + j]);
    }
    for (int j = 0; j < ldc; j++) /* nothing written past row M */
        assert_true(C[(size_t)M * ldc + j] == -12345.0f);
    free(C), free(a), free(bt);
}

/* check_bf16_on with fresh random operands, each leading dimension the dense one + pad. */
static void check_bf16(pt_backend *be, int ta, int tb, int M, int N, int K, int pad, float beta) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    pt_bf16 *A = bf16_matrix(be, ta ? K : M, ta ? M : K, lda, 11 + ta);
    pt_bf16 *B = bf16_matrix(be, tb ? N : K, tb ? K : N, ldb, 13 + tb);
    float *C0 = malloc((size_t)M * ldc * sizeof(float));
    tu_fill(C0, (size_t)M * ldc, 17, 1.0f);
    check_bf16_on(be, NULL, ta, tb, M, N, K, A, lda, B, ldb, C0, ldc, beta);
    free(A), free(B), free(C0);
}

static void test_gemm_bf16_model_sized(void **state) {
    (void)state;
    /* a GPT-2-small projection over 512 rows: forward X·Wᵀ, input gradient dY·W, weight
     * gradient dYᵀ·X accumulated (beta 1), and both operands transposed */
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    check_bf16(be, 0, 1, 512, 768, 768, 0, 0.0f);
    check_bf16(be, 0, 0, 512, 768, 768, 0, 0.0f);
    check_bf16(be, 1, 0, 768, 768, 512, 0, 1.0f);
    check_bf16(be, 1, 1, 512, 768, 768, 64, 1.0f);
    be->destroy(be);
}

static void test_gemm_bf16_empty_products(void **state) {
    (void)state;
    pt_backend *be = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    pt_bf16 A[4] = {0}, B[4] = {0};
    float C[6] = {1, 2, 3, 4, 5, 6};
    be->gemm_bf16(be, PT_NO_TRANS, PT_NO_TRANS, 2, 2, 0, A, 1, B, 3, 1.0f, C, 3); /* C += 0 */
    for (int i = 0; i < 6; i++) assert_true(C[i] == (float)(i + 1));
    be->gemm_bf16(be, PT_NO_TRANS, PT_NO_TRANS, 0, 2, 2, A, 2, B, 2, 0.0f, C, 3); /* M = 0 */
    be->gemm_bf16(be, PT_NO_TRANS, PT_NO_TRANS, 2, 0, 2, A, 2, B, 2, 0.0f, C, 3); /* N = 0 */
    for (int i = 0; i < 6; i++) assert_true(C[i] == (float)(i + 1));
    be->gemm_bf16(be, PT_NO_TRANS, PT_NO_TRANS, 2, 2, 0, A, 1, B, 3, 0.0f, C, 3); /* C = 0 */
    const float want[6] = {0, 0, 3, 0, 0, 6};
    for (int i = 0; i < 6; i++) assert_true(C[i] == want[i]);
    be->destroy(be);
}

static void test_gemm_bf16_repeated_shape_allocates_nothing(void **state) {
    (void)state;
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    enum { M = 64, N = 96, K = 128 };
    pt_bf16 *A = bf16_matrix(be, M, K, K, 1), *B = bf16_matrix(be, N, K, K, 2);
    float *C1 = calloc(M * N, sizeof(float)), *C2 = calloc(M * N, sizeof(float));
    be->gemm_bf16(be, PT_NO_TRANS, PT_TRANS, M, N, K, A, K, B, K, 0.0f, C1, N); /* builds */
    int64_t before = pt_alloc_count();
    for (int r = 0; r < 3; r++)
        be->gemm_bf16(be, PT_NO_TRANS, PT_TRANS, M, N, K, A, K, B, K, 0.0f, C2, N);
    assert_int_equal(pt_alloc_count(), before);
    assert_memory_equal(C1, C2, sizeof(float) * M * N); /* the cached primitive, same result */
    free(A), free(B), free(C1), free(C2);
    be->destroy(be);
}

/* The operands of products whose M or K varies up to mmax / kmax over fixed leading dimensions
 * (the buffers of a mixture-of-experts layer: rows routed to an expert, at most a capacity):
 * op(A) (M,K), op(B) (K,N), C (M,N) are the leading blocks of matrices stored for mmax, kmax. */
typedef struct {
    int ta, tb, lda, ldb, ldc;
    pt_bf16 *A, *B;
    float *C0;
} bf16_operands;

static bf16_operands bf16_operands_make(pt_backend *be, int ta, int tb, int mmax, int N, int kmax,
                                        int pad) {
    bf16_operands o = {.ta = ta, .tb = tb, .lda = (ta ? mmax : kmax) + pad,
                       .ldb = (tb ? kmax : N) + pad, .ldc = N + pad};
    o.A = bf16_matrix(be, ta ? kmax : mmax, ta ? mmax : kmax, o.lda, 21 + ta);
    o.B = bf16_matrix(be, tb ? N : kmax, tb ? kmax : N, o.ldb, 23 + tb);
    o.C0 = malloc((size_t)mmax * o.ldc * sizeof(float));
    tu_fill(o.C0, (size_t)mmax * o.ldc, 27, 1.0f);
    return o;
}

static void bf16_operands_free(bf16_operands *o) { free(o->A), free(o->B), free(o->C0); }

static uint64_t lcg_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

static void test_gemm_bf16_any_row_count(void **state) {
    (void)state;
    /* 300 row counts M (1..292 and 8 up to 4099) for every transpose pair and beta 0 and 1, then
     * 70 inner sizes K (a mixture-of-experts weight gradient dYᵀ·X sums over the routed rows):
     * never "cache full", every result within the accumulation bound; the first
     * PT_BF16_EXACT_PER_FAMILY shapes of each (ta, tb, N, lda, ldb, ldc, beta) get exact
     * primitives, the others share the runtime-shape primitive of their (ta, tb, beta). */
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    pt_cpu_bf16_matmul *g;
    assert_int_equal(pt_cpu_bf16_matmul_create(&g), PT_OK);
    enum { N = 24, K = 40, MMAX = 4099, KN = 32, KM = 20, KMAX = 1000, PAD = 3 };
    int Ms[300], Ks[70];
    for (int i = 0; i < 292; i++) Ms[i] = i + 1;
    const int big[8] = {333, 511, 512, 1000, 1024, 2048, 3001, MMAX};
    memcpy(Ms + 292, big, sizeof big);
    for (int i = 0; i < 64; i++) Ks[i] = i + 1;
    const int bigk[6] = {100, 255, 256, 300, 777, KMAX};
    memcpy(Ks + 64, bigk, sizeof bigk);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            bf16_operands o = bf16_operands_make(be, ta, tb, MMAX, N, K, PAD);
            for (int beta = 0; beta < 2; beta++)
                for (int i = 0; i < 300; i++)
                    check_bf16_on(be, g, ta, tb, Ms[i], N, K, o.A, o.lda, o.B, o.ldb, o.C0,
                                  o.ldc, (float)beta);
            bf16_operands_free(&o);
            o = bf16_operands_make(be, ta, tb, KM, KN, KMAX, PAD);
            for (int beta = 0; beta < 2; beta++)
                for (int i = 0; i < 70; i++)
                    check_bf16_on(be, g, ta, tb, KM, KN, Ks[i], o.A, o.lda, o.B, o.ldb, o.C0,
                                  o.ldc, (float)beta);
            bf16_operands_free(&o);
        }
    int exact, runtime;
    pt_cpu_bf16_matmul_counts(g, &exact, &runtime);
    print_message("%d exact-shape primitives, %d runtime-shape\n", exact, runtime);
    assert_int_equal(exact, 16 * PT_BF16_EXACT_PER_FAMILY); /* 2 families per (ta, tb, beta) */
    assert_int_equal(runtime, 8);
    /* a cached shape keeps its exact primitive */
    bf16_operands o = bf16_operands_make(be, 0, 1, 8, N, K, PAD);
    check_bf16_on(be, g, 0, 1, 1, N, K, o.A, o.lda, o.B, o.ldb, o.C0, o.ldc, 0.0f);
    bf16_operands_free(&o);
    pt_cpu_bf16_matmul_counts(g, &exact, &runtime);
    assert_int_equal(exact, 16 * PT_BF16_EXACT_PER_FAMILY);
    pt_cpu_bf16_matmul_free(g);
    be->destroy(be);
}

static void test_gemm_bf16_table_full_falls_back(void **state) {
    (void)state;
    /* a transposed A stored dense, (K, M) at lda = M: every M is a new family, so exact
     * primitives fill the table and the shapes after it run at runtime shapes, with the stride
     * given per call */
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    pt_cpu_bf16_matmul *g;
    assert_int_equal(pt_cpu_bf16_matmul_create(&g), PT_OK);
    enum { N = 8, K = 12, COUNT = PT_BF16_CACHE_CAP + 20 };
    pt_bf16 *A = bf16_matrix(be, K, COUNT, COUNT, 31), *B = bf16_matrix(be, K, N, N, 32);
    float *C0 = calloc((size_t)COUNT * N, sizeof(float));
    for (int M = 1; M <= COUNT; M++)
        check_bf16_on(be, g, 1, 0, M, N, K, A, M, B, N, C0, N, (float)(M & 1));
    int exact, runtime;
    pt_cpu_bf16_matmul_counts(g, &exact, &runtime);
    assert_int_equal(exact, PT_BF16_CACHE_CAP);
    assert_int_equal(runtime, 2); /* (1, 0, beta 0) and (1, 0, beta 1) */
    free(A), free(B), free(C0);
    pt_cpu_bf16_matmul_free(g);
    be->destroy(be);
}

static void test_gemm_bf16_random_rows_allocate_nothing(void **state) {
    (void)state;
    /* 10,000 products through the backend, each with a random row count (1..1024), transpose
     * pair and beta, allocate nothing after a warm-up that makes each (ta, tb, beta)'s exact
     * primitives and its runtime one. pt_alloc_count counts pentatron's allocations only: those
     * inside oneDNN (the runtime entry's memory objects when the shape changes, gemm:jit's
     * packing buffers) are not seen. */
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    enum { MMAX = 1024, N = 64, K = 96, CALLS = 10000 };
    bf16_operands ops[2][2];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) ops[ta][tb] = bf16_operands_make(be, ta, tb, MMAX, N, K, 0);
    float *C = malloc((size_t)MMAX * N * sizeof(float));
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int beta = 0; beta < 2; beta++)
                for (int m = 1; m <= PT_BF16_EXACT_PER_FAMILY + 1; m++) {
                    const bf16_operands *o = &ops[ta][tb];
                    be->gemm_bf16(be, ta, tb, m, N, K, o->A, o->lda, o->B, o->ldb, (float)beta,
                                  C, o->ldc);
                }
    const int64_t before = pt_alloc_count();
    uint64_t rng = 12345;
    for (int c = 0; c < CALLS; c++) {
        const int M = 1 + (int)(lcg_next(&rng) % MMAX), r = (int)(lcg_next(&rng) % 8);
        const int ta = r & 1, tb = (r >> 1) & 1, beta = r >> 2;
        const bf16_operands *o = &ops[ta][tb];
        be->gemm_bf16(be, ta, tb, M, N, K, o->A, o->lda, o->B, o->ldb, (float)beta, C, o->ldc);
    }
    assert_int_equal(pt_alloc_count(), before);
    /* and the runtime primitive after them all still computes the product */
    check_bf16_on(be, NULL, 1, 1, 777, N, K, ops[1][1].A, ops[1][1].lda, ops[1][1].B,
                  ops[1][1].ldb, ops[1][1].C0, ops[1][1].ldc, 1.0f);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) bf16_operands_free(&ops[ta][tb]);
    free(C);
    be->destroy(be);
}

static void test_bf16_native_follows_the_isa(void **state) {
    (void)state;
    /* DNNL_MAX_CPU_ISA=AVX512_CORE (the test_gemm_isa_avx512_core entry) caps oneDNN below its
     * bf16 instructions: bf16 is emulated; otherwise it is native exactly when the CPU has
     * AVX512-BF16 */
    const char *cap = getenv("DNNL_MAX_CPU_ISA");
    pt_backend *be = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    const char *desc = be->describe(be);
    print_message("DNNL_MAX_CPU_ISA=%s: %s\n", cap ? cap : "(unset)", desc);
    if (cap && strcasecmp(cap, "AVX512_CORE") == 0) {
        assert_int_equal(be->bf16_native, 0);
        assert_non_null(strstr(desc, "ISA avx512_core,"));
        assert_non_null(strstr(desc, "bf16 emulated"));
    } else if (!cap) {
        __builtin_cpu_init();
        assert_int_equal(be->bf16_native, __builtin_cpu_supports("avx512bf16") ? 1 : 0);
        assert_non_null(strstr(desc, be->bf16_native ? "bf16 native" : "bf16 emulated"));
    }
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_onednn_gemm_matches_double),
        cmocka_unit_test(test_openblas_gemm_matches_double),
        cmocka_unit_test(test_openblas_gets_the_fast_kernel_unasked),
        cmocka_unit_test(test_activation_memory_is_linear_in_seq_len),
        cmocka_unit_test(test_gemm_bf16_model_sized),
        cmocka_unit_test(test_gemm_bf16_empty_products),
        cmocka_unit_test(test_gemm_bf16_repeated_shape_allocates_nothing),
        cmocka_unit_test(test_gemm_bf16_any_row_count),
        cmocka_unit_test(test_gemm_bf16_table_full_falls_back),
        cmocka_unit_test(test_gemm_bf16_random_rows_allocate_nothing),
        cmocka_unit_test(test_bf16_native_follows_the_isa),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
