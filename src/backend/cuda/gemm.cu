/* gemm.cu: the CUDA backend's gemm and gemm_bf16 slots through cuBLASLt.
 *
 * The host logic (row-major → column-major mapping, shape keys, the plan cache, the workspace
 * policy, validation) is plain C in gemm_plan.c, tested without a GPU; this file holds what is
 * cuBLASLt's: the handle, the eight matmul descriptors ([dtype][op A][op B], initialised in
 * place, never reallocated), the algorithm of each memoised plan (an array parallel to the plan
 * cache), and the calls.
 *
 * Numerics: gemm is fp32 with CUBLAS_COMPUTE_32F, never TF32 (fp32 is the tight reference);
 * gemm_bf16 is bf16 × bf16 → fp32 output with CUBLAS_COMPUTE_32F accumulation. Determinism: the
 * algorithm of a key is the heuristic's first choice for it (a pure function of the key, the
 * device and the library), the heuristic restricted to reductions that are reproducible by
 * construction: none, or split-K partials written to the workspace and summed in a separate
 * fixed-order pass (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE / OUTPUT_TYPE), never the in-place
 * scheme that adds partial results into the output; one stream and our own workspace, as
 * cuBLAS's reproducibility guarantee asks. No slot allocates device memory or synchronises: the
 * workspace is taken from the arena at create, the descriptors and layouts live in this
 * struct or on the stack.
 */
#include <cublasLt.h>
#include <cuda_bf16.h>

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/gemm_plan.h"

/* cuBLASLt is opened when the first CUDA backend is made (dlopen), not linked: its library maps
 * half a gigabyte, which every pentatron process, CPU runs and runs under an address-space
 * limit (RLIMIT_AS) included, would otherwise carry. The functions we call, by name: */
#define PT_LT_FUNCS(X)                                                                         \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusName) X(cublasLtGetStatusString)   \
    X(cublasLtGetVersion) X(cublasLtMatmul) X(cublasLtMatmulAlgoGetHeuristic)                  \
    X(cublasLtMatmulDescInit_internal) X(cublasLtMatmulDescSetAttribute)                       \
    X(cublasLtMatmulPreferenceInit_internal) X(cublasLtMatmulPreferenceSetAttribute)           \
    X(cublasLtMatrixLayoutInit_internal)
static struct {
#define PT_LT_FIELD(f) decltype(&::f) f;
    PT_LT_FUNCS(PT_LT_FIELD)
#undef PT_LT_FIELD
} lt;

#define PT_STR_(x) #x
#define PT_STR(x) PT_STR_(x)
/* libcublasLt.so.MAJOR of the toolkit we were built with: from its library folder (known at
 * build time), else wherever the dynamic loader finds it */
static pt_status pt_lt_open(void) {
    static void *handle;
    if (handle) return PT_OK;
    const char *soname = "libcublasLt.so." PT_STR(CUBLAS_VER_MAJOR);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", PT_CUDA_LIBDIR, soname);
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return pt_errorf(PT_ERR_RUNTIME, "CUDA backend: cannot load cuBLASLt (%s, looked in %s "
                         "and the loader's path): %s", soname, PT_CUDA_LIBDIR, dlerror());
#define PT_LT_LOAD(f)                                                                          \
    if (!(lt.f = (decltype(&::f))dlsym(h, #f))) {                                              \
        dlclose(h);                                                                            \
        return pt_errorf(PT_ERR_RUNTIME, "CUDA backend: %s has no %s", soname, #f);          \
    }
    PT_LT_FUNCS(PT_LT_LOAD)
#undef PT_LT_LOAD
    handle = h;
    return PT_OK;
}

struct pt_cuda_gemm_state {
    cublasLtHandle_t lt;
    void *ws;                         /* workspace, from the arena */
    size_t ws_bytes;
    pt_gemm_plan_cache cache;
    cublasLtMatmulAlgo_t *algos;      /* cache.cap: the algorithm of plan i */
    size_t *algo_ws;                  /* the workspace each needs (≤ ws_bytes) */
    cublasLtMatmulDescOpaque_t desc[2][2][2]; /* [dtype][cuBLAS op A][cuBLAS op B] */
    int64_t runtime_calls;            /* calls whose key was not memoised (heuristic per call) */
    size_t max_algo_ws;               /* the most workspace a chosen algorithm needed */
    char text[640];
};

#define PT_CUBLAS_CHECK(call)                                                                  \
    do {                                                                                       \
        cublasStatus_t pt_cublas_st_ = (call);                                                 \
        if (pt_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                            \
            pt_fatal(__FILE__, __LINE__, "cuBLASLt: %s: %s (%s)", #call,                       \
                     lt.cublasLtGetStatusName(pt_cublas_st_),                                     \
                     lt.cublasLtGetStatusString(pt_cublas_st_));                                  \
    } while (0)

/* the reductions allowed: split-K partials in the workspace, summed in a fixed order (the
 * in-place scheme, CUBLASLT_REDUCTION_SCHEME_INPLACE, is left out); "none" is always allowed */
static const uint32_t pt_gemm_reduction_mask =
    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;

static void pt_gemm_layouts(const pt_gemm_cm *p, cudaDataType_t in,
                            cublasLtMatrixLayoutOpaque_t *la, cublasLtMatrixLayoutOpaque_t *lb,
                            cublasLtMatrixLayoutOpaque_t *lc) {
    PT_CUBLAS_CHECK(lt.cublasLtMatrixLayoutInit_internal(la, sizeof *la, in, (uint64_t)p->a.rows, (uint64_t)p->a.cols,
                                             p->a.ld));
    PT_CUBLAS_CHECK(lt.cublasLtMatrixLayoutInit_internal(lb, sizeof *lb, in, (uint64_t)p->b.rows, (uint64_t)p->b.cols,
                                             p->b.ld));
    PT_CUBLAS_CHECK(lt.cublasLtMatrixLayoutInit_internal(lc, sizeof *lc, CUDA_R_32F, (uint64_t)p->c.rows,
                                             (uint64_t)p->c.cols, p->c.ld));
}

/* The heuristic's first algorithm for key (layouts la, lb, lc; the key's alignments told). */
static cublasLtMatmulHeuristicResult_t pt_gemm_choose(pt_cuda_gemm_state *g,
                                                      cublasLtMatmulDesc_t desc,
                                                      const pt_gemm_key *k,
                                                      cublasLtMatrixLayout_t la,
                                                      cublasLtMatrixLayout_t lb,
                                                      cublasLtMatrixLayout_t lc) {
    cublasLtMatmulPreferenceOpaque_t pref;
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceInit_internal(&pref, sizeof pref));
    const uint64_t ws = g->ws_bytes;
    const uint32_t mask = pt_gemm_reduction_mask;
    /* cuBLAS's A is the caller's B and cuBLAS's B the caller's A (gemm_plan.h) */
    const uint32_t al_a = 1u << k->align_b, al_b = 1u << k->align_a, al_c = 1u << k->align_c;
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask));
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    PT_CUBLAS_CHECK(lt.cublasLtMatmulPreferenceSetAttribute(
        &pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int count = 0;
    const cublasStatus_t st = lt.cublasLtMatmulAlgoGetHeuristic(g->lt, desc, la, lb, lc, lc, &pref,
                                                             1, &res, &count);
    if (st != CUBLAS_STATUS_SUCCESS || count < 1 || res.state != CUBLAS_STATUS_SUCCESS)
        pt_fatal(__FILE__, __LINE__,
                 "cuBLASLt has no algorithm for the %s GEMM ta=%d tb=%d M=%d N=%d K=%d lda=%d "
                 "ldb=%d ldc=%d beta%s0, alignments A %u B %u C %u bytes (%s)",
                 k->dtype == PT_GEMM_BF16 ? "bf16" : "fp32", k->ta, k->tb, k->M, k->N, k->K,
                 k->lda, k->ldb, k->ldc, k->beta_nz ? "!=" : "=", 1u << k->align_a,
                 1u << k->align_b, 1u << k->align_c, lt.cublasLtGetStatusName(st));
    return res;
}

/* C[i·ldc + j] = beta·C[i·ldc + j] (0 when beta = 0, whatever C held): a product with K = 0.
 * Rows stride over gridDim.y, which is capped at 65535 (M may exceed it). */
__global__ void pt_gemm_scale_kernel(float *C, int M, int N, int ldc, float beta) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= N) return;
    for (int i = blockIdx.y; i < M; i += gridDim.y) {
        float *c = C + (size_t)i * (size_t)ldc + j;
        *c = beta == 0.0f ? 0.0f : beta * *c;
    }
}

static void pt_gemm_run(pt_backend *be, pt_gemm_dtype dt, pt_trans ta, pt_trans tb, int M, int N,
                        int K, float alpha, const void *A, int lda, const void *B, int ldb,
                        float beta, float *C, int ldc) {
    pt_cuda_gemm_state *g = pt_cuda_ctx_of(be)->gemm;
    const pt_gemm_key key = pt_gemm_key_make(dt, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    const char *bad = pt_gemm_check(&key, beta);
    PT_ASSERTF(!bad, "CUDA %s ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d beta=%g: %s",
               dt == PT_GEMM_BF16 ? "gemm_bf16" : "gemm", (int)ta, (int)tb, M, N, K, lda, ldb,
               ldc, (double)beta, bad);
    if (M == 0 || N == 0) return;
    cudaStream_t s = pt_cuda_stream(be);
    if (K == 0) { /* C = beta·C: cuBLASLt is not asked for an empty inner dimension */
        if (beta != 1.0f) {
            dim3 grid((unsigned)((N + 255) / 256), (unsigned)(M < 65535 ? M : 65535));
            pt_gemm_scale_kernel<<<grid, 256, 0, s>>>(C, M, N, ldc, beta);
            PT_CUDA_LAUNCHED();
        }
        return;
    }
    const pt_gemm_cm p = pt_gemm_colmajor(ta, tb, M, N, K, lda, ldb, ldc);
    cublasLtMatmulDesc_t desc = &g->desc[dt][p.a.op][p.b.op];
    cublasLtMatrixLayoutOpaque_t la, lb, lc;
    pt_gemm_layouts(&p, dt == PT_GEMM_BF16 ? CUDA_R_16BF : CUDA_R_32F, &la, &lb, &lc);
    int idx = pt_gemm_plan_lookup(&g->cache, &key);
    cublasLtMatmulAlgo_t runtime_algo;
    const cublasLtMatmulAlgo_t *algo;
    if (idx >= 0) {
        algo = &g->algos[idx];
    } else {
        const cublasLtMatmulHeuristicResult_t r = pt_gemm_choose(g, desc, &key, &la, &lb, &lc);
        if (r.workspaceSize > g->max_algo_ws) g->max_algo_ws = r.workspaceSize;
        idx = pt_gemm_plan_insert(&g->cache, &key);
        if (idx >= 0) {
            g->algos[idx] = r.algo;
            g->algo_ws[idx] = r.workspaceSize;
            algo = &g->algos[idx];
        } else {
            runtime_algo = r.algo;
            algo = &runtime_algo;
            g->runtime_calls++;
        }
    }
    /* cuBLAS's A is the caller's B, its B the caller's A; C is read only when beta != 0 */
    PT_CUBLAS_CHECK(lt.cublasLtMatmul(g->lt, desc, &alpha, B, &la, A, &lb, &beta, C, &lc, C, &lc,
                                   algo, g->ws, g->ws_bytes, s));
}

extern "C" void pt_cuda_gemm(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                             float alpha, const float *A, int lda, const float *B, int ldb,
                             float beta, float *C, int ldc) {
    pt_gemm_run(be, PT_GEMM_F32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

extern "C" void pt_cuda_gemm_bf16(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                                  const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta,
                                  float *C, int ldc) {
    PT_ASSERTF(beta == 0.0f || beta == 1.0f, "gemm_bf16: beta %g is neither 0 nor 1",
               (double)beta);
    pt_gemm_run(be, PT_GEMM_BF16, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

extern "C" pt_status pt_cuda_gemm_create(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    PT_TRY(pt_lt_open());
    pt_cuda_gemm_state *g = (pt_cuda_gemm_state *)pt_calloc(1, sizeof *g);
    g->ws_bytes = pt_gemm_workspace_bytes(ctx->prop.major, ctx->prop.totalGlobalMem);
    g->ws = pt_cuda_arena_alloc(be, g->ws_bytes); /* (ends the job naming the arena if full) */
    const cublasStatus_t st = lt.cublasLtCreate(&g->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        pt_cuda_arena_free(be, g->ws);
        free(g);
        return pt_errorf(PT_ERR_RUNTIME, "cuBLASLt: cublasLtCreate: %s",
                         lt.cublasLtGetStatusString(st));
    }
    pt_gemm_plan_cache_init(&g->cache, PT_CUDA_GEMM_CACHE_CAP, PT_CUDA_GEMM_PER_FAMILY);
    g->algos = (cublasLtMatmulAlgo_t *)pt_calloc((size_t)g->cache.cap, sizeof *g->algos);
    g->algo_ws = (size_t *)pt_calloc((size_t)g->cache.cap, sizeof *g->algo_ws);
    for (int dt = 0; dt < 2; dt++)
        for (int oa = 0; oa < 2; oa++)
            for (int ob = 0; ob < 2; ob++) {
                cublasLtMatmulDescOpaque_t *d = &g->desc[dt][oa][ob];
                /* fp32 and bf16 alike accumulate in fp32 without TF32; alpha, beta fp32 on the
                 * host (read when the call is enqueued) */
                PT_CUBLAS_CHECK(lt.cublasLtMatmulDescInit_internal(d, sizeof *d, CUBLAS_COMPUTE_32F, CUDA_R_32F));
                const int32_t op_a = oa ? CUBLAS_OP_T : CUBLAS_OP_N;
                const int32_t op_b = ob ? CUBLAS_OP_T : CUBLAS_OP_N;
                PT_CUBLAS_CHECK(lt.cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSA,
                                                               &op_a, sizeof op_a));
                PT_CUBLAS_CHECK(lt.cublasLtMatmulDescSetAttribute(d, CUBLASLT_MATMUL_DESC_TRANSB,
                                                               &op_b, sizeof op_b));
            }
    ctx->gemm = g;
    return PT_OK;
}

extern "C" void pt_cuda_gemm_destroy(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    pt_cuda_gemm_state *g = ctx->gemm;
    if (!g) return;
    lt.cublasLtDestroy(g->lt);
    pt_cuda_arena_free(be, g->ws);
    pt_gemm_plan_cache_free(&g->cache);
    free(g->algos);
    free(g->algo_ws);
    free(g);
    ctx->gemm = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * peaks */

/* Deterministic values in [-1, 1) (a hash of the index), fp32 or rounded to bf16: operands that
 * are not all zero, so that the tensor cores draw their real power. */
__global__ void pt_gemm_fill_kernel(void *p, size_t n, int bf16, uint32_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        const float v = (float)(h >> 8) * (1.0f / 8388608.0f) - 1.0f;
        if (bf16)
            ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
        else
            ((float *)p)[i] = v;
    }
}

/* TFLOP/s of `reps` timed n×n×n products (after two untimed ones that choose the algorithm and
 * warm the clocks); 0 when the arena has no room for the operands. */
static double pt_gemm_time_square(pt_backend *be, pt_gemm_dtype dt, int want, int reps) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    const size_t elt = dt == PT_GEMM_BF16 ? 2 : 4;
    /* at most half of what is free: set-up has not taken the model's memory yet */
    const int n = pt_gemm_peak_dim(want, elt, 4, pt_arena_largest_free(&ctx->arena) / 2);
    if (n == 0) return 0.0;
    const size_t nn = (size_t)n * (size_t)n;
    void *A = pt_cuda_arena_alloc(be, nn * elt), *B = pt_cuda_arena_alloc(be, nn * elt);
    float *C = (float *)pt_cuda_arena_alloc(be, nn * 4);
    cudaStream_t s = pt_cuda_stream(be);
    pt_gemm_fill_kernel<<<1024, 256, 0, s>>>(A, nn, dt == PT_GEMM_BF16, 0x1234u);
    PT_CUDA_LAUNCHED();
    pt_gemm_fill_kernel<<<1024, 256, 0, s>>>(B, nn, dt == PT_GEMM_BF16, 0x9876u);
    PT_CUDA_LAUNCHED();
    cudaEvent_t t0, t1;
    PT_CUDA_CHECK(cudaEventCreate(&t0));
    PT_CUDA_CHECK(cudaEventCreate(&t1));
    for (int r = -2; r < reps; r++) {
        if (r == 0) PT_CUDA_CHECK(cudaEventRecord(t0, s));
        /* C = A·Bᵀ, the model's forward layout (X·Wᵀ) */
        if (dt == PT_GEMM_BF16)
            pt_cuda_gemm_bf16(be, PT_NO_TRANS, PT_TRANS, n, n, n, (const pt_bf16 *)A, n,
                              (const pt_bf16 *)B, n, 0.0f, C, n);
        else
            pt_cuda_gemm(be, PT_NO_TRANS, PT_TRANS, n, n, n, 1.0f, (const float *)A, n,
                         (const float *)B, n, 0.0f, C, n);
    }
    PT_CUDA_CHECK(cudaEventRecord(t1, s));
    PT_CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0;
    PT_CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    PT_CUDA_CHECK(cudaEventDestroy(t0));
    PT_CUDA_CHECK(cudaEventDestroy(t1));
    pt_cuda_arena_free(be, A);
    pt_cuda_arena_free(be, B);
    pt_cuda_arena_free(be, C);
    return ms > 0 ? 2.0 * (double)n * (double)n * (double)n * reps / ((double)ms * 1e-3) / 1e12
                  : 0.0;
}

extern "C" void pt_cuda_gemm_measure_peaks(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    /* bf16: 10 products of 8192³ (1.1 TFLOP each: ~15 ms on an H100, ~40 ms on an A100);
     * fp32: 4 of 4096³ (0.14 TFLOP each: ~10 ms on an H100, ~30 ms on an A100) */
    ctx->peak_tflops_bf16 = pt_gemm_time_square(be, PT_GEMM_BF16, 8192, 10);
    ctx->peak_tflops_fp32 = pt_gemm_time_square(be, PT_GEMM_F32, 4096, 4);
}

extern "C" const char *pt_cuda_gemm_describe(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    pt_cuda_gemm_state *g = ctx->gemm;
    if (!g) return "cuBLASLt (not created)";
    const size_t v = lt.cublasLtGetVersion();
    snprintf(g->text, sizeof g->text,
             "cuBLASLt %zu.%zu.%zu: fp32 GEMM CUBLAS_COMPUTE_32F (no TF32), bf16 GEMM bf16 x bf16 "
             "-> fp32 (CUBLAS_COMPUTE_32F); workspace %zu MiB (most used %zu KiB); split-K only "
             "through the workspace (deterministic); %d plans in %d families (cap %d, %d per "
             "family), %lld calls on per-call heuristics",
             v / 10000, v / 100 % 100, v % 100, g->ws_bytes >> 20, g->max_algo_ws >> 10,
             g->cache.n, g->cache.n_fam, g->cache.cap, g->cache.per_family,
             (long long)g->runtime_calls);
    return g->text;
}
