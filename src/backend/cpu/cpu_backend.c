/* cpu_backend.c: the CPU backend's function table: host memory, GEMM (gemm.c, gemm_bf16.c) and
 * the kernels of ops.c, convert.c and attention.c. Threads are OpenMP threads shared by our
 * kernels and the GEMM library. */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "pt/backend.h"

typedef struct {
    pt_cpu_gemm_lib gemm;
    pt_cpu_bf16_matmul *gemm_bf16;
    char desc[512];
} pt_cpu_ctx;

static void *cpu_alloc(pt_backend *be, size_t bytes) {
    (void)be;
    return pt_alloc_aligned(bytes);
}
static void cpu_free(pt_backend *be, void *p) {
    (void)be;
    pt_free_aligned(p);
}
static void cpu_zero(pt_backend *be, void *p, size_t bytes) {
    (void)be;
    memset(p, 0, bytes);
}
static void cpu_copy(pt_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (dst != src) memmove(dst, src, bytes);
}
static void cpu_synchronize(pt_backend *be) { (void)be; }

static void cpu_gemm(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                     const float *A, int lda, const float *B, int ldb, float beta, float *C,
                     int ldc) {
    pt_cpu_ctx *ctx = be->ctx;
    pt_cpu_gemm(&ctx->gemm, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void cpu_gemm_bf16(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                          const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta,
                          float *C, int ldc) {
    pt_cpu_ctx *ctx = be->ctx;
    pt_cpu_gemm_bf16(ctx->gemm_bf16, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
}

static const char *cpu_describe(pt_backend *be) {
    pt_cpu_ctx *ctx = be->ctx;
    snprintf(ctx->desc, sizeof ctx->desc, "cpu backend, %d threads, %s; %s", be->n_threads,
             ctx->gemm.desc, pt_cpu_bf16_matmul_desc(ctx->gemm_bf16));
    return ctx->desc;
}

static void cpu_destroy(pt_backend *be) {
    pt_cpu_ctx *ctx = be->ctx;
    pt_cpu_bf16_matmul_free(ctx->gemm_bf16);
    free(ctx);
    free(be);
}

pt_backend *pt_backend_cpu_create(int n_threads, pt_gemm_lib lib) {
    if (n_threads <= 0) n_threads = omp_get_num_procs();
    if (n_threads > pt_max_threads()) { /* thousands of OpenMP stacks: a crash, not a run */
        pt_errorf(PT_ERR_CONFIG, "%d compute threads: at most %d here (4 × the cores this "
                  "process may run on)", n_threads, pt_max_threads());
        return NULL;
    }
    omp_set_num_threads(n_threads);
    pt_cpu_ctx *ctx = pt_calloc(1, sizeof *ctx);
    if (pt_cpu_gemm_init(&ctx->gemm, lib, n_threads) != PT_OK ||
        pt_cpu_bf16_matmul_create(&ctx->gemm_bf16) != PT_OK) {
        free(ctx);
        return NULL;
    }
    pt_backend *be = pt_calloc(1, sizeof *be);
    *be = (pt_backend){
        .name = "cpu",
        .ctx = ctx,
        .n_threads = n_threads,
        .bf16_native = pt_cpu_bf16_native(),
        .alloc = cpu_alloc,
        .free = cpu_free,
        .zero = cpu_zero,
        .upload = cpu_copy,
        .download = cpu_copy,
        .copy = cpu_copy,
        .synchronize = cpu_synchronize,
        .gemm = cpu_gemm,
        .gemm_bf16 = cpu_gemm_bf16,
        .to_bf16 = pt_cpu_to_bf16,
        .from_bf16 = pt_cpu_from_bf16,
        .embedding_forward = pt_cpu_embedding_forward,
        .embedding_forward_bf16 = pt_cpu_embedding_forward_bf16,
        .embedding_backward = pt_cpu_embedding_backward,
        .rmsnorm_forward = pt_cpu_rmsnorm_forward,
        .rmsnorm_backward = pt_cpu_rmsnorm_backward,
        .rope = pt_cpu_rope,
        .attention_forward = pt_cpu_attention_forward,
        .attention_backward = pt_cpu_attention_backward,
        .attention_merge = pt_cpu_attention_merge,
        .swiglu_forward = pt_cpu_swiglu_forward,
        .swiglu_backward = pt_cpu_swiglu_backward,
        .softmax_xent = pt_cpu_softmax_xent,
        .xent_stats = pt_cpu_xent_stats,
        .rows_gather = pt_cpu_rows_gather,
        .rows_copy = pt_cpu_rows_copy,
        .rows_scatter_add = pt_cpu_rows_scatter_add,
        .rows_dot = pt_cpu_rows_dot,
        .xent_grad = pt_cpu_xent_grad,
        .add = pt_cpu_add,
        .sumsq = pt_cpu_sumsq,
        .adamw = pt_cpu_adamw,
        .describe = cpu_describe,
        .destroy = cpu_destroy,
    };
    /* the guard (src/backend/cpu/guard.c), a test facility */
    const char *guard = getenv("PT_BACKEND_GUARD");
    int report = guard && strcmp(guard, "report") == 0;
    if (guard && (strcmp(guard, "1") == 0 || report)) {
        static int logged;
        if (!logged)
            pt_log_info("PT_BACKEND_GUARD=%s: backend memory is inaccessible outside backend calls "
                        "and communication%s", guard, report ? " (stray accesses reported)" : "");
        logged = 1;
        if (report) pt_backend_guard_report(getenv("PT_BACKEND_GUARD_LOG"));
        return pt_backend_guard(be);
    }
    return be;
}
