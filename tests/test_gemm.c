/* test_gemm.c: the CPU backend's GEMM (both libraries, every transpose, alpha/beta, strides)
 * against a naive double-precision product, and the OpenBLAS kernel choice on this CPU. */
#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    pt_acts *a1 = pt_acts_create(&m, 1, 1024), *a2 = pt_acts_create(&m, 1, 2048);
    double ratio = (double)pt_acts_bytes(a2) / (double)pt_acts_bytes(a1);
    if (ratio > 2.01 || ratio < 1.9) fail_msg("activation bytes ratio T 2048/1024 = %.3f", ratio);
    pt_acts_free(&m, a1);
    pt_acts_free(&m, a2);
    pt_model_free(&m);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_onednn_gemm_matches_double),
        cmocka_unit_test(test_openblas_gemm_matches_double),
        cmocka_unit_test(test_openblas_gets_the_fast_kernel_unasked),
        cmocka_unit_test(test_activation_memory_is_linear_in_seq_len),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
