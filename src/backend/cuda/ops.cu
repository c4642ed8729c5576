/* ops.cu: the CUDA backend's kernels other than GEMM and attention: bf16 conversion, embedding,
 * RMSNorm, RoPE, SwiGLU, cross-entropy, the mixture of experts' row operations, the vector
 * helpers and AdamW.
 *
 * Every kernel is a loop around the arithmetic of kmath.h, which the host tests run against the
 * CPU backend. The shapes of the work:
 *   - per element (conversions, RoPE, SwiGLU, add, AdamW, gathers): a 1-D grid-stride loop;
 *   - per row (RMSNorm, cross-entropy): one block of PT_K_ROW_THREADS threads per row, each lane
 *     summing the elements lane, lane + 256, ..., the lanes added by a fixed tree in shared
 *     memory (pt_k_tree_sum's order);
 *   - sums across rows into one output: the RMSNorm weight gradient in fixed chunks of rows then
 *     the chunks in order (double); the embedding gradient and scatter-add by a stable sort of
 *     the contributions by destination row (CUB), a block per run of equal rows summing in the
 *     contributions' order, bitwise the CPU's loop.
 * No floating-point atomics anywhere: a result depends on the inputs alone, so runs repeat bit
 * for bit. All work is on the backend's stream; only sumsq and xent_stats (whose results the
 * host reads) wait for it.
 */
#include <math.h>

#include <cub/device/device_radix_sort.cuh>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kmath.h"

#define ELEM_THREADS 256

/* ---------------------------------------------------------------------------------------------
 * block reductions in the tree order of kmath.h (blockDim.x a power of two) */
__device__ static double block_sum(double v, double *sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) sh[t] = __dadd_rn(sh[t], sh[t + s]);
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}
__device__ static float block_max(float v, float *sh) {
    int t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s /= 2) {
        if (t < s) sh[t] = sh[t] > sh[t + s] ? sh[t] : sh[t + s];
        __syncthreads();
    }
    float r = sh[0];
    __syncthreads();
    return r;
}

#define GRID_STRIDE(i, n)                                                                      \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (size_t)gridDim.x * blockDim.x)

/* scratch that grows to the largest call and stays (first steps only) */
static void *scratch(pt_backend *be, void **buf, size_t *have, size_t bytes) {
    if (bytes > *have) {
        if (*buf) pt_cuda_arena_free(be, *buf);
        *buf = pt_cuda_arena_alloc(be, bytes);
        *have = bytes;
    }
    return *buf;
}

/* ---------------------------------------------------------------------------------------------
 * Sums into indexed rows (embedding backward, rows_scatter_add): a stable sort of the
 * contributions by destination, then one block per run of equal destinations (kmath.h) */
__global__ static void k_row_keys(uint32_t *keys, int32_t *vals, const int32_t *idx, int n,
                                  int row0, int rows) {
    GRID_STRIDE(i, (size_t)n) {
        keys[i] = pt_k_row_key((int64_t)idx[i] - row0, rows);
        vals[i] = (int32_t)i;
    }
}
/* block x = a sorted position (only run starts work), block y = 256 columns */
__global__ static void k_run_sums(float *dst, const float *src, const float *scale,
                                  const uint32_t *keys, const int32_t *vals, int n, int C,
                                  int rows) {
    int p = blockIdx.x, c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C || !pt_k_run_start(keys, p, rows)) return;
    uint32_t key = keys[p];
    float *d = dst + (size_t)key * C + c, acc = *d;
    for (int q = p; q < n && keys[q] == key; q++) {
        int32_t i = vals[q];
        acc = pt_k_scatter_term(acc, scale ? scale[i] : 1.0f, src[(size_t)i * C + c]);
    }
    *d = acc;
}
static void sorted_scatter(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                           const float *scale, int n, int C, int row0, int rows) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    cudaStream_t st = ctx->stream;
    /* the keys need the bits of `rows` (the sentinel) only: fewer radix passes */
    int bits = 1;
    while (bits < 32 && ((uint32_t)rows >> bits) != 0) bits++;
    size_t temp = 0;
    PT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, temp, (const uint32_t *)NULL,
                                                  (uint32_t *)NULL, (const int32_t *)NULL,
                                                  (int32_t *)NULL, n, 0, bits, st));
    size_t arr = ((size_t)n * 4 + 255) / 256 * 256;
    char *buf = (char *)scratch(be, &ctx->sort_buf, &ctx->sort_bytes, 4 * arr + temp);
    uint32_t *kin = (uint32_t *)buf, *kout = (uint32_t *)(buf + arr);
    int32_t *vin = (int32_t *)(buf + 2 * arr), *vout = (int32_t *)(buf + 3 * arr);
    k_row_keys<<<pt_k_grid_1d((size_t)n, ELEM_THREADS), ELEM_THREADS, 0, st>>>(kin, vin, idx, n,
                                                                             row0, rows);
    PT_CUDA_LAUNCHED();
    PT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(buf + 4 * arr, temp, kin, kout, vin, vout, n, 0,
                                                  bits, st));
    dim3 grid((unsigned)n, (unsigned)((C + 255) / 256));
    k_run_sums<<<grid, 256, 0, st>>>(dst, src, scale, kout, vout, n, C, rows);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * bf16 conversions */
__global__ static void k_to_bf16(uint16_t *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = pt_k_bf16_round(src[i]);
}
__global__ static void k_from_bf16(float *dst, const uint16_t *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = pt_k_bf16_to_float(src[i]);
}
extern "C" void pt_cuda_to_bf16(pt_backend *be, pt_bf16 *dst, const float *src, size_t n) {
    if (!n) return;
    k_to_bf16<<<pt_k_grid_1d(n, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(dst, src, n);
    PT_CUDA_LAUNCHED();
}
extern "C" void pt_cuda_from_bf16(pt_backend *be, float *dst, const pt_bf16 *src, size_t n) {
    if (!n) return;
    k_from_bf16<<<pt_k_grid_1d(n, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(dst, src,
                                                                                         n);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * Row copies: embedding forward (fp32 and bf16) and rows_copy. Row i of dst is row idx[i] − row0
 * of src, or zeros when that is outside [0, rows). Rows move as 4-byte words when their size
 * allows, else as bytes. */
template <typename W>
__global__ static void k_rows_copy(W *dst, const int32_t *idx, const W *src, int n, size_t words,
                                   int row0, int rows) {
    size_t total = (size_t)n * words;
    GRID_STRIDE(e, total) {
        size_t i = e / words, w = e % words;
        int64_t t = (int64_t)idx[i] - row0;
        dst[e] = t >= 0 && t < rows ? src[(size_t)t * words + w] : W(0);
    }
}
static void rows_copy(pt_backend *be, void *dst, const int32_t *idx, const void *src, int n,
                      size_t row_bytes, int row0, int rows) {
    if (n <= 0 || !row_bytes) return;
    cudaStream_t st = pt_cuda_stream(be);
    /* words only when every word is aligned: a row size that is a multiple of 4 at a 2-byte
     * aligned base (bf16 rows at an odd element offset) would fault as misaligned */
    if (row_bytes % 4 == 0 && ((uintptr_t)dst | (uintptr_t)src) % 4 == 0) {
        size_t words = row_bytes / 4;
        k_rows_copy<uint32_t><<<pt_k_grid_1d((size_t)n * words, ELEM_THREADS), ELEM_THREADS, 0,
                                st>>>((uint32_t *)dst, idx, (const uint32_t *)src, n, words, row0,
                                      rows);
    } else {
        k_rows_copy<uint8_t><<<pt_k_grid_1d((size_t)n * row_bytes, ELEM_THREADS), ELEM_THREADS, 0,
                               st>>>((uint8_t *)dst, idx, (const uint8_t *)src, n, row_bytes, row0,
                                     rows);
    }
    PT_CUDA_LAUNCHED();
}
extern "C" void pt_cuda_embedding_forward(pt_backend *be, float *out, const int32_t *tokens,
                                          const float *wte, int N, int C, int row0, int rows) {
    rows_copy(be, out, tokens, wte, N, (size_t)C * sizeof(float), row0, rows);
}
extern "C" void pt_cuda_embedding_forward_bf16(pt_backend *be, pt_bf16 *out,
                                               const int32_t *tokens, const pt_bf16 *wte, int N,
                                               int C, int row0, int rows) {
    rows_copy(be, out, tokens, wte, N, (size_t)C * sizeof(pt_bf16), row0, rows);
}
extern "C" void pt_cuda_rows_copy(pt_backend *be, void *dst, const void *src, const int32_t *idx,
                                  int n, size_t row_bytes) {
    rows_copy(be, dst, idx, src, n, row_bytes, 0, 0x7fffffff);
}

/* dwte[tokens[i] − row0] += dout[i] by sorted runs (kmath.h): bitwise the CPU's token order */
extern "C" void pt_cuda_embedding_backward(pt_backend *be, float *dwte, const int32_t *tokens,
                                           const float *dout, int N, int C, int row0, int rows) {
    if (N <= 0 || C <= 0) return;
    sorted_scatter(be, dwte, dout, tokens, NULL, N, C, row0, rows);
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm: a block per row */
__global__ static void __launch_bounds__(PT_K_ROW_THREADS)
    k_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int C,
                      float eps) {
    __shared__ double sh[PT_K_ROW_THREADS];
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    double ss = block_sum(pt_k_sumsq_lane(x, C, threadIdx.x, blockDim.x), sh);
    float r = pt_k_rmsnorm_rstd(ss, C, eps);
    if (threadIdx.x == 0) rstd[blockIdx.x] = r;
    for (int c = threadIdx.x; c < C; c += blockDim.x) y[c] = pt_k_rmsnorm_out(x[c], w[c], r);
}
extern "C" void pt_cuda_rmsnorm_forward(pt_backend *be, float *out, float *rstd, const float *inp,
                                        const float *w, int N, int C, float eps) {
    if (N <= 0) return;
    k_rmsnorm_forward<<<N, PT_K_ROW_THREADS, 0, pt_cuda_stream(be)>>>(out, rstd, inp, w, C, eps);
    PT_CUDA_LAUNCHED();
}

__global__ static void __launch_bounds__(PT_K_ROW_THREADS)
    k_rmsnorm_backward_dx(float *dinp, const float *dout, const float *inp, const float *w,
                          const float *rstd, int C) {
    __shared__ double sh[PT_K_ROW_THREADS];
    size_t row = (size_t)blockIdx.x * C;
    const float *x = inp + row, *dy = dout + row;
    float *dx = dinp + row;
    double dot = block_sum(pt_k_rmsnorm_dot_lane(dy, w, x, C, threadIdx.x, blockDim.x), sh);
    float r = rstd[blockIdx.x], coef = pt_k_rmsnorm_coef(r, dot, C);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dx[c] = pt_k_rmsnorm_dx(dx[c], r, w[c], dy[c], coef, x[c]);
}
/* dw in two stages (kmath.h): a thread per (chunk of PT_K_DW_ROWS rows, column) sums its chunk
 * in double, then a thread per column adds the chunks in order */
__global__ static void k_rmsnorm_dw_part(double *part, const float *dout, const float *inp,
                                         const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    int i0 = blockIdx.y * PT_K_DW_ROWS, i1 = i0 + PT_K_DW_ROWS < N ? i0 + PT_K_DW_ROWS : N;
    double acc = 0.0;
    for (int i = i0; i < i1; i++)
        acc = pt_k_rmsnorm_dw_term(acc, dout[(size_t)i * C + c], inp[(size_t)i * C + c], rstd[i]);
    part[(size_t)blockIdx.y * C + c] = acc;
}
__global__ static void k_rmsnorm_dw_total(float *dw, const double *part, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double acc = 0.0;
    for (int k = 0; k < chunks; k++) acc = __dadd_rn(acc, part[(size_t)k * C + c]);
    dw[c] = __fadd_rn(dw[c], (float)acc);
}
extern "C" void pt_cuda_rmsnorm_backward(pt_backend *be, float *dinp, float *dw, const float *dout,
                                         const float *inp, const float *w, const float *rstd,
                                         int N, int C) {
    if (N <= 0) return;
    cudaStream_t st = pt_cuda_stream(be);
    k_rmsnorm_backward_dx<<<N, PT_K_ROW_THREADS, 0, st>>>(dinp, dout, inp, w, rstd, C);
    PT_CUDA_LAUNCHED();
    int chunks = pt_k_dw_chunks(N);
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    double *part = (double *)scratch(be, &ctx->dw_buf, &ctx->dw_bytes,
                                     (size_t)chunks * C * sizeof(double));
    k_rmsnorm_dw_part<<<dim3((C + 127) / 128, chunks), 128, 0, st>>>(part, dout, inp, rstd, N, C);
    PT_CUDA_LAUNCHED();
    k_rmsnorm_dw_total<<<(C + 127) / 128, 128, 0, st>>>(dw, part, chunks, C);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * RoPE: a thread per (row, head, pair) */
__global__ static void k_rope(float *x, const int32_t *pos, int N, int n_heads, int half, int ld,
                              const float *cos_tab, const float *sin_tab, float sgn) {
    size_t total = (size_t)N * n_heads * half;
    GRID_STRIDE(e, total) {
        int i = (int)(e % half);
        size_t nh = e / half;
        int h = (int)(nh % n_heads), n = (int)(nh / n_heads);
        size_t tab = (size_t)pos[n] * half + i;
        float *a = x + (size_t)n * ld + (size_t)h * 2 * half;
        pt_k_rope_pair(a + i, a + i + half, cos_tab[tab], sgn * sin_tab[tab]);
    }
}
extern "C" void pt_cuda_rope(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads,
                             int head_dim, int ld, const float *cos_tab, const float *sin_tab,
                             int inverse) {
    PT_ASSERT(head_dim % 2 == 0);
    int half = head_dim / 2;
    size_t total = (size_t)N * n_heads * half;
    if (!total) return;
    k_rope<<<pt_k_grid_1d(total, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(
        x, pos, N, n_heads, half, ld, cos_tab, sin_tab, inverse ? -1.0f : 1.0f);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU: a thread per (row, j) */
__global__ static void k_swiglu_forward(float *h, const float *gu, int N, int F) {
    size_t total = (size_t)N * F;
    GRID_STRIDE(e, total) {
        size_t i = e / F, j = e % F;
        const float *g = gu + i * 2 * F;
        h[e] = pt_k_swiglu(g[j], g[F + j]);
    }
}
__global__ static void k_swiglu_backward(float *dgu, const float *dh, const float *gu, int N,
                                         int F) {
    size_t total = (size_t)N * F;
    GRID_STRIDE(e, total) {
        size_t i = e / F, j = e % F;
        const float *g = gu + i * 2 * F;
        float gj = g[j], uj = g[F + j], dg, du; /* both read before either is written */
        pt_k_swiglu_backward(gj, uj, dh[e], &dg, &du);
        dgu[i * 2 * F + j] = dg;
        dgu[i * 2 * F + F + j] = du;
    }
}
extern "C" void pt_cuda_swiglu_forward(pt_backend *be, float *h, const float *gu, int N, int F) {
    size_t total = (size_t)N * F;
    if (!total) return;
    k_swiglu_forward<<<pt_k_grid_1d(total, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(
        h, gu, N, F);
    PT_CUDA_LAUNCHED();
}
extern "C" void pt_cuda_swiglu_backward(pt_backend *be, float *dgu, const float *dh,
                                        const float *gu, int N, int F) {
    size_t total = (size_t)N * F;
    if (!total) return;
    k_swiglu_backward<<<pt_k_grid_1d(total, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(
        dgu, dh, gu, N, F);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * Cross-entropy: a block per row. */
__global__ static void __launch_bounds__(PT_K_ROW_THREADS)
    k_softmax_xent(float *logits, float *losses, const int32_t *targets, int V, int ld,
                   float dscale) {
    __shared__ double shd[PT_K_ROW_THREADS];
    __shared__ float shf[PT_K_ROW_THREADS];
    float *row = logits + (size_t)blockIdx.x * ld;
    int32_t t = targets[blockIdx.x];
    if (t == -1) {
        if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
        for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = 0.0f;
        return;
    }
    if (t < 0 || t >= V) __trap(); /* checked by the data layer: a bug if reached */
    float mx = block_max(pt_k_max_lane(row, V, threadIdx.x, blockDim.x), shf);
    double sum = block_sum(pt_k_expsum_lane(row, V, mx, threadIdx.x, blockDim.x), shd);
    float xt = row[t];
    __syncthreads(); /* every lane has read row[t] before it is overwritten */
    float sc = pt_k_xent_scale(dscale, sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float g = pt_k_xent_grad(row[j], mx, sc);
        row[j] = j == t ? __fsub_rn(g, dscale) : g;
    }
    if (threadIdx.x == 0) losses[blockIdx.x] = pt_k_xent_loss(mx, sum, xt);
}
extern "C" void pt_cuda_softmax_xent(pt_backend *be, float *logits, float *losses,
                                     const int32_t *targets, int n, int V, int ld, float dscale) {
    if (n <= 0) return;
    k_softmax_xent<<<n, PT_K_ROW_THREADS, 0, pt_cuda_stream(be)>>>(logits, losses, targets, V, ld,
                                                                  dscale);
    PT_CUDA_LAUNCHED();
}

/* Vocabulary-parallel statistics: (max, Σ e^(x − max), x[target − v0]) per row into device
 * scratch, then to the caller's host array (backend.h: stats is host memory, combined over the
 * tensor-parallel ranks by the caller). */
__global__ static void __launch_bounds__(PT_K_ROW_THREADS)
    k_xent_stats(const float *logits, const int32_t *targets, int V, int ld, int v0,
                 float *stats) {
    __shared__ double shd[PT_K_ROW_THREADS];
    __shared__ float shf[PT_K_ROW_THREADS];
    const float *row = logits + (size_t)blockIdx.x * ld;
    float mx = block_max(pt_k_max_lane(row, V, threadIdx.x, blockDim.x), shf);
    double sum = block_sum(pt_k_expsum_lane(row, V, mx, threadIdx.x, blockDim.x), shd);
    if (threadIdx.x == 0) {
        int32_t tg = targets[blockIdx.x], t = tg - v0;
        float *s = stats + 3 * (size_t)blockIdx.x;
        s[0] = mx;
        s[1] = (float)sum;
        s[2] = tg >= 0 && t >= 0 && t < V ? row[t] : 0.0f;
    }
}
__global__ static void k_xent_grad(float *logits, const int32_t *targets, int n, int V, int ld,
                                   int v0, const float *M, const float *S, float dscale) {
    size_t total = (size_t)n * ld;
    GRID_STRIDE(e, total) {
        size_t i = e / ld;
        int j = (int)(e % ld);
        float *x = logits + e;
        int32_t tg = targets[i];
        if (tg < 0 || j >= V) {
            *x = 0.0f;
            continue;
        }
        float g = pt_k_xent_grad(*x, M[i], pt_k_xent_scale(dscale, (double)S[i]));
        *x = tg - v0 == j ? __fsub_rn(g, dscale) : g;
    }
}

extern "C" void pt_cuda_xent_stats(pt_backend *be, const float *logits, const int32_t *targets,
                                   int n, int V, int ld, int v0, float *stats) {
    if (n <= 0) return;
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    size_t bytes = (size_t)3 * n * sizeof(float);
    float *d = (float *)scratch(be, &ctx->xent_buf, &ctx->xent_bytes, bytes);
    k_xent_stats<<<n, PT_K_ROW_THREADS, 0, ctx->stream>>>(logits, targets, V, ld, v0, d);
    PT_CUDA_LAUNCHED();
    be->download(be, stats, d, bytes);
}
extern "C" void pt_cuda_xent_grad(pt_backend *be, float *logits, const int32_t *targets, int n,
                                  int V, int ld, int v0, const float *M, const float *S,
                                  float dscale) {
    if (n <= 0) return;
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    size_t bytes = (size_t)2 * n * sizeof(float);
    float *d = (float *)scratch(be, &ctx->xent_buf, &ctx->xent_bytes, bytes);
    be->upload(be, d, M, (size_t)n * sizeof(float));
    be->upload(be, d + n, S, (size_t)n * sizeof(float));
    k_xent_grad<<<pt_k_grid_1d((size_t)n * ld, ELEM_THREADS), ELEM_THREADS, 0, ctx->stream>>>(
        logits, targets, n, V, ld, v0, d, d + n, dscale);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * Mixture of experts: rows */
__global__ static void k_rows_gather(float *dst, const float *src, const int32_t *idx,
                                     const float *scale, int n, int C) {
    size_t total = (size_t)n * C;
    GRID_STRIDE(e, total) {
        size_t i = e / C, c = e % C;
        float sc = scale ? scale[i] : 1.0f;
        dst[e] = __fmul_rn(sc, src[(size_t)idx[i] * C + c]);
    }
}
extern "C" void pt_cuda_rows_gather(pt_backend *be, float *dst, const float *src,
                                    const int32_t *idx, const float *scale, int n, int C) {
    size_t total = (size_t)n * C;
    if (!total) return;
    k_rows_gather<<<pt_k_grid_1d(total, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(
        dst, src, idx, scale, n, C);
    PT_CUDA_LAUNCHED();
}
/* dst[idx[i]] += scale[i]·src[i] by sorted runs (kmath.h): rows with one idx added in row order,
 * as on the CPU */
extern "C" void pt_cuda_rows_scatter_add(pt_backend *be, float *dst, const float *src,
                                         const int32_t *idx, const float *scale, int n, int C) {
    if (n <= 0 || C <= 0) return;
    sorted_scatter(be, dst, src, idx, scale, n, C, 0, INT32_MAX);
}
/* out[i] = Σ_c x[idx[i]][c]·y[i][c], a thread per row summing in the order of c (double: each
 * product of two floats is exact, so the result is bitwise the CPU's) */
__global__ static void k_rows_dot(double *out, const float *x, const int32_t *idx, const float *y,
                                  int n, int C) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float *a = x + (size_t)idx[i] * C, *b = y + (size_t)i * C;
    double s = 0.0;
    for (int c = 0; c < C; c++) s = __dadd_rn(s, __dmul_rn((double)a[c], (double)b[c]));
    out[i] = s;
}
extern "C" void pt_cuda_rows_dot(pt_backend *be, double *out, const float *x, const int32_t *idx,
                                 const float *y, int n, int C) {
    if (n <= 0) return;
    k_rows_dot<<<(n + 127) / 128, 128, 0, pt_cuda_stream(be)>>>(out, x, idx, y, n, C);
    PT_CUDA_LAUNCHED();
}

/* ---------------------------------------------------------------------------------------------
 * Vector helpers */
__global__ static void k_add(float *y, const float *x, size_t n) {
    GRID_STRIDE(i, n) y[i] = __fadd_rn(y[i], x[i]);
}
extern "C" void pt_cuda_add(pt_backend *be, float *y, const float *x, size_t n) {
    if (!n) return;
    k_add<<<pt_k_grid_1d(n, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(y, x, n);
    PT_CUDA_LAUNCHED();
}

/* Σ x²: PT_K_SUMSQ_BLOCKS partials (kmath.h's chunks), then one block adds them by the tree */
__global__ static void __launch_bounds__(PT_K_SUMSQ_THREADS)
    k_sumsq_part(double *part, const float *x, size_t n) {
    __shared__ double sh[PT_K_SUMSQ_THREADS];
    double s = block_sum(pt_k_sumsq_part(x, n, blockIdx.x, threadIdx.x), sh);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}
__global__ static void __launch_bounds__(PT_K_SUMSQ_BLOCKS) k_sumsq_total(double *part) {
    __shared__ double sh[PT_K_SUMSQ_BLOCKS];
    double s = block_sum(part[threadIdx.x], sh);
    if (threadIdx.x == 0) part[PT_K_SUMSQ_BLOCKS] = s;
}
extern "C" double pt_cuda_sumsq(pt_backend *be, const float *x, size_t n) {
    if (!n) return 0.0;
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    k_sumsq_part<<<PT_K_SUMSQ_BLOCKS, PT_K_SUMSQ_THREADS, 0, ctx->stream>>>(ctx->red_scratch, x, n);
    PT_CUDA_LAUNCHED();
    k_sumsq_total<<<1, PT_K_SUMSQ_BLOCKS, 0, ctx->stream>>>(ctx->red_scratch);
    PT_CUDA_LAUNCHED();
    PT_CUDA_CHECK(cudaMemcpyAsync(ctx->red_host, ctx->red_scratch + PT_K_SUMSQ_BLOCKS,
                                  sizeof(double), cudaMemcpyDeviceToHost, ctx->stream));
    PT_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
    return *ctx->red_host;
}

/* ---------------------------------------------------------------------------------------------
 * AdamW over the flat buffers: the constants as the CPU backend computes them (double, then
 * rounded to float where PyTorch applies them to a float tensor), each element by pt_k_adamw */
__global__ static void k_adamw(float *p, const float *g, float *m, float *v, size_t n,
                               pt_k_adamw_consts k) {
    GRID_STRIDE(i, n) pt_k_adamw(p + i, g[i], m + i, v + i, &k);
}
extern "C" void pt_cuda_adamw(pt_backend *be, float *p, const float *g, float *m, float *v,
                              size_t n, float lr, float beta1, float beta2, float eps,
                              float weight_decay, int64_t step, float grad_scale) {
    PT_ASSERT(step >= 1);
    PT_ASSERT(1.0 - (double)beta1 < 0.5);
    if (!n) return;
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    pt_k_adamw_consts k;
    k.decay = (float)(1.0 - (double)lr * (double)weight_decay);
    k.w1 = (float)(1.0 - (double)beta1);
    k.b2 = beta2;
    k.w2 = (float)(1.0 - (double)beta2);
    k.bc2_sqrt = (float)sqrt(bc2);
    k.eps = eps;
    k.neg_step = (float)(-((double)lr / bc1));
    k.gscale = grad_scale;
    k_adamw<<<pt_k_grid_1d(n, ELEM_THREADS), ELEM_THREADS, 0, pt_cuda_stream(be)>>>(p, g, m, v, n,
                                                                                    k);
    PT_CUDA_LAUNCHED();
}
