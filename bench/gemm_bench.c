/* gemm_bench.c: GFLOP/s of the CPU backend's GEMM on the shapes a training step uses (forward
 * X·Wᵀ, input gradient dY·W, weight gradient dYᵀ·X), fp32 (gemm, through the chosen library) and
 * bf16 (gemm_bf16, oneDNN matmul), with the ratio bf16/fp32, for docs/gemm.md.
 *
 *   bench_gemm onednn|openblas [threads]
 *   bench_gemm cuda           the CUDA backend (cuBLASLt) on Llama 3.2 1B's shapes, 8192 tokens
 * OpenBLAS's kernel is chosen by pentatron from the CPU flags unless OPENBLAS_CORETYPE is set
 * (set it to Prescott to see what Debian's OpenBLAS 0.3.21 does on a CPU it does not know). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"

/* Best of 5 timed calls after one untimed (which, for bf16, builds the shape's primitive). */
static double bench(pt_backend *be, int bf16, pt_trans ta, pt_trans tb, int M, int N, int K) {
    const size_t na = (size_t)M * K, nb = (size_t)K * N;
    float *A = be->alloc(be, na * sizeof(float)), *B = be->alloc(be, nb * sizeof(float));
    float *C = be->alloc(be, (size_t)M * N * sizeof(float));
    pt_bf16 *A16 = be->alloc(be, na * sizeof(pt_bf16)), *B16 = be->alloc(be, nb * sizeof(pt_bf16));
    for (size_t i = 0; i < na; i++) A[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)(i % 5) * 0.1f;
    be->to_bf16(be, A16, A, na);
    be->to_bf16(be, B16, B, nb);
    const int lda = ta ? M : K, ldb = tb ? K : N;
    double best = 1e30;
    int reps = strcmp(be->name, "cuda") == 0 ? 21 : 6; /* a GPU's product takes microseconds */
    be->synchronize(be);
    for (int r = 0; r < reps; r++) {
        double t0 = pt_now();
        if (bf16)
            be->gemm_bf16(be, ta, tb, M, N, K, A16, lda, B16, ldb, 0.0f, C, N);
        else
            be->gemm(be, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        be->synchronize(be); /* a device backend's calls return before the work is done */
        double dt = pt_now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    be->free(be, A), be->free(be, B), be->free(be, C), be->free(be, A16), be->free(be, B16);
    return 2.0 * M * N * (double)K / best / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_gemm onednn|openblas [threads] | bench_gemm cuda\n");
        return 2;
    }
    pt_gemm_lib lib = strcmp(argv[1], "openblas") == 0 ? PT_GEMM_OPENBLAS : PT_GEMM_ONEDNN;
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    int cuda = strcmp(argv[1], "cuda") == 0;
    pt_backend *be = cuda ? pt_backend_cuda_create(0) : pt_backend_cpu_create(threads, lib);
    if (!be) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    printf("# %s\n", be->describe(be));
    /* square; 2048 rows (8 × 256 tokens) at GPT-2-small width; 1024 rows (4 × 256) through the
     * GPT-2-small projections (qkv, MLP up, MLP down, head) */
    int cpu_shapes[][3] = {{1024, 1024, 1024}, {2048, 768, 768},   {1024, 2304, 768},
                           {1024, 4096, 768},  {1024, 768, 2048}, {1024, 50257, 768}};
    /* Llama 3.2 1B, 4 × 2048 tokens: qkv (32 + 2·8 heads of 64), attention out, gate|up, down,
     * the head over 128256 entries */
    int gpu_shapes[][3] = {{8192, 3072, 2048}, {8192, 2048, 2048}, {8192, 16384, 2048},
                           {8192, 2048, 8192}, {8192, 128256, 2048}, {4096, 4096, 4096}};
    int (*shapes)[3] = cuda ? gpu_shapes : cpu_shapes;
    size_t n_shapes = cuda ? sizeof gpu_shapes / sizeof *gpu_shapes
                           : sizeof cpu_shapes / sizeof *cpu_shapes;
    /* untimed: the first products of a process run slower (threads starting, clocks rising);
     * without this the first row's fp32 forward read 40% low */
    bench(be, 0, PT_NO_TRANS, PT_TRANS, 1024, 1024, 1024);
    printf("%-19s %23s   %23s   %s\n", "M x N x K", "fp32 fwd / dX / dW", "bf16 fwd / dX / dW",
           "bf16/fp32");
    double sum[2] = {0, 0};
    int n = 0;
    for (size_t s = 0; s < n_shapes; s++) {
        const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        double g[2][3];
        for (int b = 0; b < 2; b++) {
            g[b][0] = bench(be, b, PT_NO_TRANS, PT_TRANS, M, N, K); /* X (M,K) · W (N,K)ᵀ */
            g[b][1] = bench(be, b, PT_NO_TRANS, PT_NO_TRANS, M, K, N); /* dY (M,N) · W (N,K) */
            g[b][2] = bench(be, b, PT_TRANS, PT_NO_TRANS, N, K, M); /* dY (M,N)ᵀ · X (M,K) */
            sum[b] += g[b][0] + g[b][1] + g[b][2];
        }
        n += 3;
        printf("%5d x %5d x %5d   %6.1f %6.1f %6.1f GFLOP/s   %6.1f %6.1f %6.1f GFLOP/s   "
               "%.2f %.2f %.2f\n", M, N, K, g[0][0], g[0][1], g[0][2], g[1][0], g[1][1], g[1][2],
               g[1][0] / g[0][0], g[1][1] / g[0][1], g[1][2] / g[0][2]);
    }
    printf("mean fp32 %.1f GFLOP/s, bf16 %.1f GFLOP/s, ratio %.2f\n", sum[0] / n, sum[1] / n,
           sum[1] / sum[0]);
    be->destroy(be);
    return 0;
}
