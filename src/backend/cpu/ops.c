/* ops.c: the CPU backend's elementwise and row-wise kernels: embedding, RMSNorm, RoPE, SwiGLU,
 * fused softmax cross-entropy, vector helpers and AdamW (attention lives in attention.c).
 *
 * Shapes and "+=" conventions are those of include/pt/backend.h. Work is split over rows with
 * OpenMP when there is enough of it (the `if` clauses keep small calls on one thread, where a
 * parallel region would cost more than it saves). Reductions that cross rows are split by output
 * column, or into blocks fixed by the size of the problem, so that results are bitwise the same
 * for any thread count; inner loops are written so that -O3 -march=native vectorises them.
 */
#include "backend/cpu/ops.h"

#include <math.h>
#include <omp.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif
#include <limits.h>
#include <string.h>

/* Below this many floats of work a kernel stays on the calling thread. */
#define PAR_MIN 32768
/* Column block for reductions over rows (embedding and RMSNorm weight gradients). */
#define COL_BLOCK 64

/* ---------------------------------------------------------------------------------------------
 * Embedding */

/* tokens (N) -> out (N,C) = wte[tokens - row0], zero rows for tokens owned by another shard */
/* out row i = wte row tokens[i] − row0 (rows of `bytes`), or zeros outside [0, rows) */
static void embedding_rows(char *out, const int32_t *tokens, const char *wte, int N, size_t bytes,
                           int row0, int rows) {
#pragma omp parallel for schedule(static) if ((int64_t)N * (int64_t)bytes >= 4 * PAR_MIN)
    for (int i = 0; i < N; i++) {
        int64_t t = (int64_t)tokens[i] - row0;
        char *dst = out + (size_t)i * bytes;
        if (t >= 0 && t < rows)
            memcpy(dst, wte + (size_t)t * bytes, bytes);
        else
            memset(dst, 0, bytes);
    }
}

void pt_cpu_embedding_forward(pt_backend *be, float *out, const int32_t *tokens, const float *wte,
                              int N, int C, int row0, int rows) {
    (void)be;
    embedding_rows((char *)out, tokens, (const char *)wte, N, (size_t)C * sizeof(float), row0, rows);
}

void pt_cpu_embedding_forward_bf16(pt_backend *be, pt_bf16 *out, const int32_t *tokens,
                                   const pt_bf16 *wte, int N, int C, int row0, int rows) {
    (void)be;
    embedding_rows((char *)out, tokens, (const char *)wte, N, (size_t)C * sizeof(pt_bf16), row0,
                   rows);
}

/* dwte (rows,C) += scatter of dout (N,C) by token. Threads own column blocks and walk the tokens
 * in order, so every element sums its contributions in token order whatever the thread count
 * (a repeated token would race if threads owned token ranges instead). */
void pt_cpu_embedding_backward(pt_backend *be, float *dwte, const int32_t *tokens,
                               const float *dout, int N, int C, int row0, int rows) {
    (void)be;
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= PAR_MIN && nblk > 1)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, c1 = c0 + COL_BLOCK < C ? c0 + COL_BLOCK : C;
        for (int i = 0; i < N; i++) {
            int64_t t = (int64_t)tokens[i] - row0;
            if (t < 0 || t >= rows) continue;
            float *dst = dwte + (size_t)t * C;
            const float *src = dout + (size_t)i * C;
            for (int c = c0; c < c1; c++) dst[c] += src[c];
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm. Like Hugging Face's LlamaRMSNorm in float32: rstd = 1/sqrt(mean(x²) + eps) in float,
 * out = w · (x · rstd). The mean of squares is accumulated in double and rounded once, which is
 * at least as accurate as PyTorch's float reduction. */

/* inp (N,C), w (C) -> out (N,C), rstd (N) */
void pt_cpu_rmsnorm_forward(pt_backend *be, float *out, float *rstd, const float *inp,
                            const float *w, int N, int C, float eps) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0.0;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = 1.0f / sqrtf((float)(ss / C) + eps);
        rstd[i] = r;
        for (int c = 0; c < C; c++) y[c] = w[c] * (x[c] * r);
    }
}

/* dout (N,C) -> dinp (N,C) +=, dw (C) +=.
 * With y_c = w_c·x_c·r and r = (mean(x²) + eps)^-1/2:
 *   dx_c = r·w_c·dy_c − (r³/C)·x_c·Σ_k dy_k·w_k·x_k,   dw_c = Σ_rows dy_c·x_c·r. */
void pt_cpu_rmsnorm_backward(pt_backend *be, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        double dot = 0.0;
#pragma omp simd reduction(+ : dot)
        for (int c = 0; c < C; c++) dot += (double)dy[c] * w[c] * x[c];
        double r = rstd[i];
        float rf = rstd[i], coef = (float)(r * r * r * dot / C);
        for (int c = 0; c < C; c++) dx[c] += rf * w[c] * dy[c] - coef * x[c];
    }
    /* dw: threads own column blocks and sum the rows in order (double accumulators) */
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static) if ((int64_t)N * C >= PAR_MIN && nblk > 1)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, nc = C - c0 < COL_BLOCK ? C - c0 : COL_BLOCK;
        double acc[COL_BLOCK] = {0};
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C + c0, *dy = dout + (size_t)i * C + c0;
            double r = rstd[i];
            for (int c = 0; c < nc; c++) acc[c] += (double)dy[c] * x[c] * r;
        }
        for (int c = 0; c < nc; c++) dw[c0 + c] += (float)acc[c];
    }
}

/* ---------------------------------------------------------------------------------------------
 * RoPE, Hugging Face "rotate half": within each head the pairs are (i, i + hd/2). */

/* x (N rows at ld; n_heads·head_dim used) rotated in place by pos (N) */
void pt_cpu_rope(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                 int ld, const float *cos_tab, const float *sin_tab, int inverse) {
    (void)be;
    PT_ASSERT(head_dim % 2 == 0);
    int half = head_dim / 2;
    /* the transpose of a rotation by a is the rotation by −a */
    float sgn = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) if ((int64_t)N * n_heads * head_dim >= PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *cs = cos_tab + (size_t)pos[n] * half;
        const float *sn = sin_tab + (size_t)pos[n] * half;
        for (int h = 0; h < n_heads; h++) {
            float *a = x + (size_t)n * ld + (size_t)h * head_dim, *b = a + half;
            for (int i = 0; i < half; i++) {
                float c = cs[i], s = sgn * sn[i], x0 = a[i], x1 = b[i];
                a[i] = x0 * c - x1 * s;
                b[i] = x1 * c + x0 * s;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU: h = silu(gate) · up with silu(g) = g / (1 + e^−g), as PyTorch computes it. */

/* gu (N,2F) = [gate | up] -> h (N,F) */
void pt_cpu_swiglu_forward(pt_backend *be, float *h, const float *gu, int N, int F) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        float *y = h + (size_t)i * F;
        for (int j = 0; j < F; j++) y[j] = g[j] / (1.0f + pt_cpu_expf(-g[j])) * u[j];
    }
}

/* dh (N,F), gu (N,2F) -> dgu (N,2F) = [dgate | dup] (overwrites).
 * With s = sigmoid(g): d silu/dg = s·(1 + g·(1 − s)). */
void pt_cpu_swiglu_backward(pt_backend *be, float *dgu, const float *dh, const float *gu, int N,
                            int F) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)N * F >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F, *dy = dh + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
        for (int j = 0; j < F; j++) { /* both read before either is written: dgu may be gu */
            float gj = g[j], uj = u[j], s = 1.0f / (1.0f + pt_cpu_expf(-gj));
            du[j] = dy[j] * gj * s;
            dg[j] = dy[j] * uj * s * (1.0f + gj * (1.0f - s));
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Fused softmax cross-entropy, in place on the logits. */

/* logits (n, V at ld), targets (n) -> losses (n); logits replaced by dscale·(softmax − onehot) */
void pt_cpu_softmax_xent(pt_backend *be, float *logits, float *losses, const int32_t *targets,
                         int n, int V, int ld, float dscale) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)n * V >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *row = logits + (size_t)i * ld;
        int32_t t = targets[i];
        if (t == -1) {
            losses[i] = 0.0f;
            memset(row, 0, (size_t)V * sizeof(float));
            continue;
        }
        PT_ASSERTF(t >= 0 && t < V, "softmax_xent: target %d of row %d outside [0, %d)", (int)t, i,
                   V);
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        float xt = row[t];
        /* float sums over blocks of 1024 (so the loop vectorises at full width: a double
         * accumulator halves it and costs 5x), the blocks added in double */
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += 1024) {
            int j1 = j0 + 1024 < V ? j0 + 1024 : V;
            float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
            for (int j = j0; j < j1; j++) {
                float e = pt_cpu_expf(row[j] - mx);
                row[j] = e;
                bs += e;
            }
            sum += bs;
        }
        /* loss = logsumexp − x_t, in double: the difference of two close numbers */
        losses[i] = (float)((double)mx + log(sum) - (double)xt);
        float sc = (float)(dscale / sum);
#pragma omp simd
        for (int j = 0; j < V; j++) row[j] *= sc;
        row[t] -= dscale;
    }
}

void pt_cpu_xent_stats(pt_backend *be, const float *logits, const int32_t *targets, int n, int V,
                       int ld, int v0, float *stats) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)n * V >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *row = logits + (size_t)i * ld;
        float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
        for (int j = 0; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        double sum = 0.0;
        for (int j0 = 0; j0 < V; j0 += 1024) {
            int j1 = j0 + 1024 < V ? j0 + 1024 : V;
            float bs = 0.0f;
#pragma omp simd reduction(+ : bs)
            for (int j = j0; j < j1; j++) bs += pt_cpu_expf(row[j] - mx);
            sum += bs;
        }
        int32_t t = targets[i] - v0;
        stats[3 * i] = mx;
        stats[3 * i + 1] = (float)sum;
        stats[3 * i + 2] = targets[i] >= 0 && t >= 0 && t < V ? row[t] : 0.0f;
    }
}

void pt_cpu_xent_grad(pt_backend *be, float *logits, const int32_t *targets, int n, int V, int ld,
                      int v0, const float *M, const float *S, float dscale) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)n * V >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        float *row = logits + (size_t)i * ld;
        if (targets[i] < 0) {
            memset(row, 0, (size_t)ld * sizeof(float));
            continue;
        }
        float mx = M[i], sc = (float)(dscale / S[i]);
#pragma omp simd
        for (int j = 0; j < V; j++) row[j] = pt_cpu_expf(row[j] - mx) * sc;
        for (int j = V; j < ld; j++) row[j] = 0.0f;
        int32_t t = targets[i] - v0;
        if (t >= 0 && t < V) row[t] -= dscale;
    }
}

void pt_cpu_rows_gather(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                        const float *scale, int n, int C) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)n * C >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *x = src + (size_t)idx[i] * C;
        float *y = dst + (size_t)i * C, sc = scale ? scale[i] : 1.0f;
        for (int c = 0; c < C; c++) y[c] = sc * x[c];
    }
}

void pt_cpu_rows_copy(pt_backend *be, void *dst, const void *src, const int32_t *idx, int n,
                      size_t row_bytes) {
    (void)be;
    embedding_rows(dst, idx, src, n, row_bytes, 0, INT_MAX); /* every index in range */
}

void pt_cpu_rows_scatter_add(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                             const float *scale, int n, int C) {
    (void)be;
    /* sequential over rows: several rows may add into one (deterministic order) */
    for (int i = 0; i < n; i++) {
        float *y = dst + (size_t)idx[i] * C, sc = scale ? scale[i] : 1.0f;
        const float *x = src + (size_t)i * C;
        for (int c = 0; c < C; c++) y[c] += sc * x[c];
    }
}

void pt_cpu_rows_dot(pt_backend *be, double *out, const float *x, const int32_t *idx,
                     const float *y, int n, int C) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)n * C >= PAR_MIN)
    for (int i = 0; i < n; i++) {
        const float *a = x + (size_t)idx[i] * C, *b = y + (size_t)i * C;
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)a[c] * b[c];
        out[i] = s;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Vector helpers */

/* y (n) += x (n) */
void pt_cpu_add(pt_backend *be, float *y, const float *x, size_t n) {
    (void)be;
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) y[i] += x[i];
}

/* Σ x² in double. The blocks depend only on n (at most MAX_BLOCKS, at least BLOCK_MIN elements
 * each) and are added in order, so the result does not depend on the thread count. */
#define MAX_BLOCKS 256
#define BLOCK_MIN 8192
static double reduce_blocks(const float *x, size_t n) {
    size_t bs = (n + MAX_BLOCKS - 1) / MAX_BLOCKS;
    if (bs < BLOCK_MIN) bs = BLOCK_MIN;
    int nblk = (int)((n + bs - 1) / bs);
    double part[MAX_BLOCKS];
#pragma omp parallel for schedule(static) if (nblk > 1)
    for (int b = 0; b < nblk; b++) {
        size_t lo = (size_t)b * bs, hi = lo + bs < n ? lo + bs : n;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (size_t i = lo; i < hi; i++) acc += (double)x[i] * x[i];
        part[b] = acc;
    }
    double total = 0.0;
    for (int b = 0; b < nblk; b++) total += part[b];
    return total;
}

double pt_cpu_sumsq(pt_backend *be, const float *x, size_t n) {
    (void)be;
    return reduce_blocks(x, n);
}

/* ---------------------------------------------------------------------------------------------
 * AdamW, step for step what torch.optim.AdamW (single-tensor path) does in float32:
 *   p.mul_(1 − lr·wd); m.lerp_(g, 1 − b1); v.mul_(b2).addcmul_(g, g, value = 1 − b2);
 *   denom = (v.sqrt() / sqrt(1 − b2^step)).add_(eps);
 *   p.addcdiv_(m, denom, value = −lr / (1 − b1^step)).
 * The scalars are computed in double, as Python does, and rounded to float where PyTorch applies
 * them to a float tensor. PyTorch's vectorised lerp is one fused multiply-add, m + w·(g − m), which
 * equals b1·m + (1 − b1)·g up to rounding; elsewhere PyTorch rounds every operation, so this
 * function must not let the compiler fuse (the build's gnu17 mode contracts a·b + c by default). */
typedef struct {
    float decay, w1, b2, w2, bc2_sqrt, eps, neg_step, gscale;
} adamw_consts;

/* Plain C would not vectorise here: sqrtf may set errno, and the build does not pass
 * -fno-math-errno, so the AVX-512 body is written with intrinsics; the scalar loop is the
 * reference and does the tail. */
__attribute__((optimize("fp-contract=off"))) static void
adamw_range(float *restrict p, const float *restrict g, float *restrict m, float *restrict v,
            size_t lo, size_t hi, const adamw_consts *k) {
    const float decay = k->decay, w1 = k->w1, b2 = k->b2, w2 = k->w2, bc2s = k->bc2_sqrt,
                eps = k->eps, neg_step = k->neg_step, gscale = k->gscale;
    size_t i = lo;
#ifdef __AVX512F__
    const __m512 vdecay = _mm512_set1_ps(decay), vw1 = _mm512_set1_ps(w1), vb2 = _mm512_set1_ps(b2),
                 vw2 = _mm512_set1_ps(w2), vbc2s = _mm512_set1_ps(bc2s), veps = _mm512_set1_ps(eps),
                 vneg = _mm512_set1_ps(neg_step), vgs = _mm512_set1_ps(gscale);
    for (; i + 16 <= hi; i += 16) {
        __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), vdecay);
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), vgs);
        __m512 mi = _mm512_loadu_ps(m + i), vi = _mm512_loadu_ps(v + i);
        mi = _mm512_fmadd_ps(vw1, _mm512_sub_ps(gi, mi), mi);
        vi = _mm512_add_ps(_mm512_mul_ps(vi, vb2), _mm512_mul_ps(_mm512_mul_ps(vw2, gi), gi));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), vbc2s), veps);
        pi = _mm512_add_ps(pi, _mm512_div_ps(_mm512_mul_ps(vneg, mi), denom));
        _mm512_storeu_ps(p + i, pi);
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
    }
#endif
    for (; i < hi; i++) {
        float pi = p[i] * decay, gi = g[i] * gscale;
        /* lerp with a small weight: m + w·(g − m) in one rounding */
        float mi = fmaf(w1, gi - m[i], m[i]);
        float vi = v[i] * b2;
        vi = vi + w2 * gi * gi;
        float denom = sqrtf(vi) / bc2s + eps;
        p[i] = pi + neg_step * mi / denom;
        m[i] = mi;
        v[i] = vi;
    }
}

/* p, g, m, v (n); m and v updated in place; step counts from 1 */
void pt_cpu_adamw(pt_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale) {
    (void)be;
    PT_ASSERT(step >= 1);
    /* lerp switches formula for weights >= 0.5; AdamW's 1 − b1 is always below that */
    PT_ASSERT(1.0 - (double)beta1 < 0.5);
    double bc1 = 1.0 - pow((double)beta1, (double)step);
    double bc2 = 1.0 - pow((double)beta2, (double)step);
    adamw_consts k = {
        .decay = (float)(1.0 - (double)lr * (double)weight_decay),
        .w1 = (float)(1.0 - (double)beta1),
        .b2 = beta2,
        .w2 = (float)(1.0 - (double)beta2),
        .bc2_sqrt = (float)sqrt(bc2),
        .eps = eps,
        .neg_step = (float)(-((double)lr / bc1)),
        .gscale = grad_scale,
    };
    const size_t chunk = 16384;
    size_t nchunk = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (nchunk > 1)
    for (size_t c = 0; c < nchunk; c++) {
        size_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        adamw_range(p, g, m, v, lo, hi, &k);
    }
}
