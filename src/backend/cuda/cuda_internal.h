/* cuda_internal.h: what the CUDA backend's .cu files share (C++ only, never included by C).
 *
 * The backend (backend.cu) owns one stream, one device-memory arena taken at set-up (arena.h) and
 * two pinned host buffers for uploads and downloads; every kernel of attention.cu, gemm.cu and
 * ops.cu runs on that stream, so kernels are ordered as the model calls them and the host waits
 * only in download, sumsq and synchronize. Each slot is an extern "C" function with exactly the
 * signature of its pt_backend slot (include/pt/backend.h), named pt_cuda_<slot>.
 *
 * Errors: a CUDA call that fails is a bug or a device fault, never bad input (input is checked
 * before the backend sees it): PT_CUDA_CHECK ends the job naming the call, the file and line, and
 * CUDA's message, as PT_ASSERT does.
 */
#ifndef PT_CUDA_INTERNAL_H
#define PT_CUDA_INTERNAL_H

#include <cuda_runtime.h>

#include "backend/cuda/arena.h"
#include "pt/backend.h"

/* cuBLASLt state: struct pt_cuda_gemm_state is defined in gemm.cu (the name pt_cuda_gemm is the
 * fp32 GEMM slot) */
typedef struct pt_cuda_gemm_state pt_cuda_gemm_state;

typedef struct {
    int device;                /* the CUDA ordinal this process uses */
    cudaStream_t stream;       /* every kernel and copy of the backend */
    cudaDeviceProp prop;
    pt_cuda_arena arena;       /* offsets into arena_base (arena.c) */
    char *arena_base;          /* the one cudaMalloc of the backend */
    int direct;                /* PT_CUDA_DIRECT_ALLOC=1: a cudaMalloc per piece, no arena */
    int64_t cuda_mallocs;      /* cudaMalloc calls so far (1 after set-up, then unchanged) */
    /* staging for upload/download: two pinned buffers used in turn, each with the event of its
     * last copy so that it is reused only once that copy is done */
    char *pinned[2];
    size_t pinned_bytes;
    cudaEvent_t pinned_done[2];
    int pinned_next;
    double *red_scratch;       /* device scratch for reductions read by the host (sumsq) */
    double *red_host;          /* its pinned host side */
    void *xent_buf;            /* xent_stats / xent_grad staging, grown to the largest call */
    size_t xent_bytes;
    void *sort_buf;            /* keys, positions and CUB's radix-sort scratch (ops.cu) */
    size_t sort_bytes;
    void *dw_buf;              /* RMSNorm weight gradient's per-chunk sums (ops.cu) */
    size_t dw_bytes;
    pt_cuda_gemm_state *gemm;  /* cuBLASLt handle, workspace and plan cache (gemm.cu) */
    double peak_tflops_bf16, peak_tflops_fp32; /* measured at start (gemm.cu) */
    int sharers;               /* processes using this device (the arena takes 1/sharers) */
    pt_device_link link;       /* be->link: how the comm layer reaches the arena */
    char desc[1024];
} pt_cuda_ctx;

static inline pt_cuda_ctx *pt_cuda_ctx_of(pt_backend *be) { return (pt_cuda_ctx *)be->ctx; }
static inline cudaStream_t pt_cuda_stream(pt_backend *be) { return pt_cuda_ctx_of(be)->stream; }

#define PT_CUDA_CHECK(call)                                                                    \
    do {                                                                                       \
        cudaError_t pt_cuda_err_ = (call);                                                     \
        if (pt_cuda_err_ != cudaSuccess)                                                       \
            pt_fatal(__FILE__, __LINE__, "CUDA: %s: %s", #call,                                \
                     cudaGetErrorString(pt_cuda_err_));                                        \
    } while (0)
/* after a kernel launch: a bad launch configuration is reported here, at its launch */
#define PT_CUDA_LAUNCHED() PT_CUDA_CHECK(cudaGetLastError())

#ifdef __cplusplus
extern "C" {
#endif
/* memory.cu: the arena taken (PT_CUDA_ARENA_MB, PT_CUDA_DIRECT_ALLOC read here) and given back */
pt_status pt_cuda_memory_init(pt_backend *be);
void pt_cuda_memory_destroy(pt_backend *be);
/* memory.cu: device memory from the backend's arena (set-up, or the few allocations the model
 * makes as it grows buffers): never cudaMalloc. Running out ends the job naming the request and
 * what the arena holds. */
void *pt_cuda_arena_alloc(pt_backend *be, size_t bytes);
void pt_cuda_arena_free(pt_backend *be, void *p);

/* ops.cu */
void pt_cuda_to_bf16(pt_backend *be, pt_bf16 *dst, const float *src, size_t n);
void pt_cuda_from_bf16(pt_backend *be, float *dst, const pt_bf16 *src, size_t n);
void pt_cuda_embedding_forward(pt_backend *be, float *out, const int32_t *tokens, const float *wte,
                               int N, int C, int row0, int rows);
void pt_cuda_embedding_forward_bf16(pt_backend *be, pt_bf16 *out, const int32_t *tokens,
                                    const pt_bf16 *wte, int N, int C, int row0, int rows);
void pt_cuda_embedding_backward(pt_backend *be, float *dwte, const int32_t *tokens,
                                const float *dout, int N, int C, int row0, int rows);
void pt_cuda_rmsnorm_forward(pt_backend *be, float *out, float *rstd, const float *inp,
                             const float *w, int N, int C, float eps);
void pt_cuda_rmsnorm_backward(pt_backend *be, float *dinp, float *dw, const float *dout,
                              const float *inp, const float *w, const float *rstd, int N, int C);
void pt_cuda_rope(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                  int ld, const float *cos_tab, const float *sin_tab, int inverse);
void pt_cuda_swiglu_forward(pt_backend *be, float *h, const float *gu, int N, int F);
void pt_cuda_swiglu_backward(pt_backend *be, float *dgu, const float *dh, const float *gu, int N,
                             int F);
void pt_cuda_softmax_xent(pt_backend *be, float *logits, float *losses, const int32_t *targets,
                          int n, int V, int ld, float dscale);
void pt_cuda_xent_stats(pt_backend *be, const float *logits, const int32_t *targets, int n, int V,
                        int ld, int v0, float *stats);
void pt_cuda_xent_grad(pt_backend *be, float *logits, const int32_t *targets, int n, int V, int ld,
                       int v0, const float *M, const float *S, float dscale);
void pt_cuda_rows_gather(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                         const float *scale, int n, int C);
void pt_cuda_rows_scatter_add(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                              const float *scale, int n, int C);
void pt_cuda_rows_copy(pt_backend *be, void *dst, const void *src, const int32_t *idx, int n,
                       size_t row_bytes);
void pt_cuda_rows_dot(pt_backend *be, double *out, const float *x, const int32_t *idx,
                      const float *y, int n, int C);
void pt_cuda_add(pt_backend *be, float *y, const float *x, size_t n);
double pt_cuda_sumsq(pt_backend *be, const float *x, size_t n);
void pt_cuda_adamw(pt_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                   float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                   float grad_scale);
/* gemm.cu */
pt_status pt_cuda_gemm_create(pt_backend *be);
void pt_cuda_gemm_destroy(pt_backend *be);
/* measures the bf16 and fp32 GEMM peaks (TFLOP/s) into the context, in well under a second */
void pt_cuda_gemm_measure_peaks(pt_backend *be);
const char *pt_cuda_gemm_describe(pt_backend *be);
void pt_cuda_gemm(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                  const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
void pt_cuda_gemm_bf16(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                       const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta, float *C,
                       int ldc);
/* attention.cu */
void pt_cuda_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                               const float *k, const float *v, float *out, float *lse);
void pt_cuda_attention_backward(pt_backend *be, const pt_attn_shape *s, const float *q,
                                const float *k, const float *v, const float *out,
                                const float *dout, const float *lse, float *dq, float *dk,
                                float *dv);
void pt_cuda_attention_merge(pt_backend *be, float *out_acc, float *lse_acc, const float *out_blk,
                             const float *lse_blk, int B, int T, int H, int head_dim, int ldo);
#ifdef __cplusplus
}
#endif

#endif
