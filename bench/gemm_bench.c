/* gemm_bench.c: sgemm GFLOP/s of the CPU backend's GEMM libraries on the shapes a training step
 * uses (forward X·Wᵀ, input gradient dY·W, weight gradient dYᵀ·X), for docs/gemm.md.
 *
 *   bench_gemm onednn|openblas [threads]
 * OpenBLAS's kernel is chosen by pentatron from the CPU flags unless OPENBLAS_CORETYPE is set
 * (set it to Prescott to see what Debian's OpenBLAS 0.3.21 does on a CPU it does not know). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"

static double bench(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K) {
    float *A = be->alloc(be, (size_t)M * K * sizeof(float));
    float *B = be->alloc(be, (size_t)K * N * sizeof(float));
    float *C = be->alloc(be, (size_t)M * N * sizeof(float));
    for (size_t i = 0; i < (size_t)M * K; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++) B[i] = (float)(i % 5) * 0.1f;
    int lda = ta ? M : K, ldb = tb ? K : N;
    double best = 1e30;
    for (int r = 0; r < 6; r++) {
        double t0 = pt_now();
        be->gemm(be, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        double dt = pt_now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    be->free(be, A);
    be->free(be, B);
    be->free(be, C);
    return 2.0 * M * N * (double)K / best / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_gemm onednn|openblas [threads]\n");
        return 2;
    }
    pt_gemm_lib lib = strcmp(argv[1], "openblas") == 0 ? PT_GEMM_OPENBLAS : PT_GEMM_ONEDNN;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    pt_backend *be = pt_backend_cpu_create(threads, lib);
    if (!be) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    printf("# %s\n", be->describe(be));
    /* rows = 4 sequences x 256 tokens; GPT-2-small-size widths */
    int shapes[][3] = {{1024, 2304, 768}, {1024, 4096, 768}, {1024, 768, 2048}, {1024, 50257, 768}};
    double sum = 0;
    int n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        double f = bench(be, PT_NO_TRANS, PT_TRANS, M, N, K);
        double b = bench(be, PT_NO_TRANS, PT_NO_TRANS, M, K, N);
        double w = bench(be, PT_TRANS, PT_NO_TRANS, N, K, M);
        printf("%5d x %5d x %5d   fwd %6.1f   dX %6.1f   dW %6.1f GFLOP/s\n", M, N, K, f, b, w);
        sum += f + b + w;
        n += 3;
    }
    printf("mean %.1f GFLOP/s\n", sum / n);
    be->destroy(be);
    return 0;
}
