/* kmath.h: the arithmetic of the CUDA backend's kernels (ops.cu), written once for the device and
 * the host (hd.h).
 *
 * A kernel of ops.cu is a loop around these functions: per element (SwiGLU, RoPE, AdamW, the bf16
 * conversions), per lane of a row (the partial sums a thread makes over the elements it owns,
 * lane, lane + lanes, ...), the fixed tree that adds the lanes' partials, and the per-row finish.
 * tests/test_cuda_host_kmath.c runs the same loops on the host and compares them with the CPU
 * backend's kernels, so the GPU's arithmetic is checked on every CI run, GPU or not.
 *
 * Reductions are deterministic by construction: a row's partials are added by pt_k_tree_sum over
 * a fixed number of lanes (a power of two, the block size), never by atomics, so a result
 * depends on the data and the block size alone.
 */
#ifndef PT_CUDA_KMATH_H
#define PT_CUDA_KMATH_H

#include "backend/cuda/hd.h"

/* Threads per block of the row kernels (one block per row) and of the reductions. */
#define PT_K_ROW_THREADS 256
/* The blocks sumsq uses: a function of n alone, so its result does not depend on the device. */
#define PT_K_SUMSQ_BLOCKS 512
#define PT_K_SUMSQ_THREADS 256

/* e^x as the CPU backend's pt_cpu_expf (src/backend/cpu/ops.h): x = n·ln2 + r, a degree-7
 * Taylor polynomial for e^r, 2^n applied in two halves; with its multiply-adds fused as its build
 * (gnu17, -march=native on an FMA machine) fuses them, bit casts instead of memcpy. -INFINITY
 * gives 0, NaN stays NaN. */
PT_HD float pt_k_expf(float x) {
    const float magic = 12582912.0f; /* 1.5·2^23: adding it rounds to an integer in the low bits */
    float xc = x < -110.0f ? -110.0f : x;
    xc = xc > 89.0f ? 89.0f : xc;
    const float t = PT_FMA(xc, 1.44269504088896341f, magic);
    const float nf = PT_FSUB(t, magic);
    const int32_t n = (int32_t)pt_hd_f2u(t) - (int32_t)pt_hd_f2u(magic);
    float r = PT_FMA(-nf, 0.693359375f, xc);
    r = PT_FMA(-nf, -2.12194440e-4f, r);
    float p = 1.0f / 5040.0f;
    p = PT_FMA(p, r, 1.0f / 720.0f);
    p = PT_FMA(p, r, 1.0f / 120.0f);
    p = PT_FMA(p, r, 1.0f / 24.0f);
    p = PT_FMA(p, r, 1.0f / 6.0f);
    p = PT_FMA(p, r, 0.5f);
    p = PT_FMA(p, r, 1.0f);
    p = PT_FMA(p, r, 1.0f);
    const int32_t n1 = n / 2, n2 = n - n1;
    const float s1 = pt_hd_u2f((uint32_t)(n1 + 127) << 23);
    const float s2 = pt_hd_u2f((uint32_t)(n2 + 127) << 23);
    return PT_FMUL(PT_FMUL(p, s1), s2);
}

/* fp32 -> bf16, round to nearest even, NaN kept (quiet), as pt_bf16_round in core.h */
PT_HD uint16_t pt_k_bf16_round(float x) {
    uint32_t u = pt_hd_f2u(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
PT_HD float pt_k_bf16_to_float(uint16_t h) { return pt_hd_u2f((uint32_t)h << 16); }

/* Adds v[0..n) (n a power of two) as the kernels do in shared memory: halves folded onto the
 * lower half until one value is left, v[i] += v[i + s] for s = n/2, n/4, ..., 1. */
PT_HD double pt_k_tree_sum(double *v, int n) {
    for (int s = n / 2; s > 0; s /= 2)
        for (int i = 0; i < s; i++) v[i] = PT_DADD(v[i], v[i + s]);
    return v[0];
}
PT_HD float pt_k_tree_max(float *v, int n) {
    for (int s = n / 2; s > 0; s /= 2)
        for (int i = 0; i < s; i++) v[i] = v[i] > v[i + s] ? v[i] : v[i + s];
    return v[0];
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm (one block per row, PT_K_ROW_THREADS lanes) */

/* lane's Σ x² over c = lane, lane + lanes, ... in double */
PT_HD double pt_k_sumsq_lane(const float *x, int C, int lane, int lanes) {
    double s = 0.0;
    for (int c = lane; c < C; c += lanes) s = PT_DADD(s, PT_DMUL((double)x[c], (double)x[c]));
    return s;
}
/* rstd = 1 / sqrt(mean(x²) + eps), the mean rounded to float as the CPU backend does */
PT_HD float pt_k_rmsnorm_rstd(double ss, int C, float eps) {
    return PT_FDIV(1.0f, PT_FSQRT(PT_FADD((float)(ss / C), eps)));
}
PT_HD float pt_k_rmsnorm_out(float x, float w, float r) { return PT_FMUL(w, PT_FMUL(x, r)); }

/* backward: lane's Σ dy·w·x in double */
PT_HD double pt_k_rmsnorm_dot_lane(const float *dy, const float *w, const float *x, int C,
                                   int lane, int lanes) {
    double s = 0.0;
    for (int c = lane; c < C; c += lanes)
        s = PT_DADD(s, PT_DMUL(PT_DMUL((double)dy[c], (double)w[c]), (double)x[c]));
    return s;
}
PT_HD float pt_k_rmsnorm_coef(float rstd, double dot, int C) {
    double r = rstd;
    return (float)(PT_DMUL(PT_DMUL(PT_DMUL(r, r), r), dot) / C);
}
/* dx += r·w·dy − coef·x */
PT_HD float pt_k_rmsnorm_dx(float dx, float r, float w, float dy, float coef, float x) {
    return PT_FADD(dx, PT_FSUB(PT_FMUL(PT_FMUL(r, w), dy), PT_FMUL(coef, x)));
}
/* dw[c] += Σ_rows dy·x·r in double: the rows in chunks of PT_K_DW_ROWS (a thread per (chunk,
 * column) sums its chunk's rows in order), then the chunks' sums in order (a thread per column),
 * rounded to float once. Chunks fixed by N alone keep it deterministic, and the double sums round
 * to the float the CPU backend's single pass gives but for a double rounding at a float
 * boundary. */
#define PT_K_DW_ROWS 256
PT_HD int pt_k_dw_chunks(int N) { return (N + PT_K_DW_ROWS - 1) / PT_K_DW_ROWS; }
PT_HD double pt_k_rmsnorm_dw_term(double acc, float dy, float x, float r) {
    return PT_DADD(acc, PT_DMUL(PT_DMUL((double)dy, (double)x), (double)r));
}

/* ---------------------------------------------------------------------------------------------
 * Sums into rows chosen by an index (embedding backward, rows_scatter_add), deterministic and
 * wide: the contributions are sorted by destination row with a stable sort (CUB's radix sort:
 * equal keys keep their order), then each run of equal keys is summed by its first position's
 * block, a thread per column, in the order of the contributions, starting from the destination's
 * value: bitwise the CPU backend's sequential loop. A key outside [0, rows) (the sentinel
 * `rows`: a token of another shard) is skipped. */
PT_HD uint32_t pt_k_row_key(int64_t t, int rows) {
    return t >= 0 && t < rows ? (uint32_t)t : (uint32_t)rows;
}
/* whether sorted position p starts a run that is summed */
PT_HD int pt_k_run_start(const uint32_t *keys, int p, int rows) {
    return keys[p] != (uint32_t)rows && (p == 0 || keys[p - 1] != keys[p]);
}
/* one contribution: embedding's dst + src; scatter-add's dst + sc·src, one fused multiply-add
 * as the CPU backend's build computes `y[c] += sc * x[c]` */
PT_HD float pt_k_scatter_term(float acc, float sc, float x) { return PT_FMA(sc, x, acc); }

/* ---------------------------------------------------------------------------------------------
 * RoPE: one pair (x0 = x[i], x1 = x[i + hd/2]) rotated by (c, s); s already negated for the
 * inverse */
PT_HD void pt_k_rope_pair(float *x0, float *x1, float c, float s) {
    float a = *x0, b = *x1;
    *x0 = PT_FSUB(PT_FMUL(a, c), PT_FMUL(b, s));
    *x1 = PT_FADD(PT_FMUL(b, c), PT_FMUL(a, s));
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU: h = silu(g)·u, silu(g) = g / (1 + e^−g) */
PT_HD float pt_k_swiglu(float g, float u) {
    return PT_FMUL(PT_FDIV(g, PT_FADD(1.0f, pt_k_expf(-g))), u);
}
/* with s = sigmoid(g): du = dy·g·s, dg = dy·u·s·(1 + g·(1 − s)) */
PT_HD void pt_k_swiglu_backward(float g, float u, float dy, float *dg, float *du) {
    float s = PT_FDIV(1.0f, PT_FADD(1.0f, pt_k_expf(-g)));
    *du = PT_FMUL(PT_FMUL(dy, g), s);
    *dg = PT_FMUL(PT_FMUL(PT_FMUL(dy, u), s), PT_FADD(1.0f, PT_FMUL(g, PT_FSUB(1.0f, s))));
}

/* ---------------------------------------------------------------------------------------------
 * Cross-entropy (one block per row): the row's max (exact, any order), the lanes' Σ e^(x − max)
 * in float, the lanes' sums added in double by the tree. */
PT_HD float pt_k_max_lane(const float *row, int V, int lane, int lanes) {
    float m = -INFINITY;
    for (int j = lane; j < V; j += lanes) m = row[j] > m ? row[j] : m;
    return m;
}
PT_HD float pt_k_expsum_lane(const float *row, int V, float mx, int lane, int lanes) {
    float s = 0.0f;
    for (int j = lane; j < V; j += lanes) s = PT_FADD(s, pt_k_expf(PT_FSUB(row[j], mx)));
    return s;
}
/* loss = logsumexp − x_t in double */
PT_HD float pt_k_xent_loss(float mx, double sum, float xt) {
    return (float)(PT_DADD((double)mx, log(sum)) - (double)xt);
}
PT_HD float pt_k_xent_scale(float dscale, double sum) { return (float)((double)dscale / sum); }
/* the gradient element: e^(x − max)·sc (minus dscale at the target, added by the caller) */
PT_HD float pt_k_xent_grad(float x, float mx, float sc) {
    return PT_FMUL(pt_k_expf(PT_FSUB(x, mx)), sc);
}

/* ---------------------------------------------------------------------------------------------
 * AdamW, element by element as the CPU backend's scalar loop (pt_cpu_adamw): the constants are
 * computed on the host in double (pt_k_adamw_consts in ops.cu), each operation rounded once,
 * m's lerp one fused multiply-add as PyTorch's. */
typedef struct {
    float decay, w1, b2, w2, bc2_sqrt, eps, neg_step, gscale;
} pt_k_adamw_consts;

PT_HD void pt_k_adamw(float *p, float g, float *m, float *v, const pt_k_adamw_consts *k) {
    float pi = PT_FMUL(*p, k->decay), gi = PT_FMUL(g, k->gscale);
    float mi = PT_FMA(k->w1, PT_FSUB(gi, *m), *m);
    float vi = PT_FADD(PT_FMUL(*v, k->b2), PT_FMUL(PT_FMUL(k->w2, gi), gi));
    float denom = PT_FADD(PT_FDIV(PT_FSQRT(vi), k->bc2_sqrt), k->eps);
    *p = PT_FADD(pi, PT_FDIV(PT_FMUL(k->neg_step, mi), denom));
    *m = mi;
    *v = vi;
}

/* ---------------------------------------------------------------------------------------------
 * Σ x² for the gradient norm: PT_K_SUMSQ_BLOCKS blocks of PT_K_SUMSQ_THREADS lanes; the blocks
 * take contiguous chunks of ceil(n / blocks) elements, a lane every lanes-th element of its
 * block's chunk; lanes then blocks are added by the tree. */
PT_HD size_t pt_k_sumsq_chunk(size_t n) {
    return (n + PT_K_SUMSQ_BLOCKS - 1) / PT_K_SUMSQ_BLOCKS;
}
PT_HD double pt_k_sumsq_part(const float *x, size_t n, int block, int lane) {
    size_t chunk = pt_k_sumsq_chunk(n), lo = (size_t)block * chunk;
    size_t hi = lo + chunk < n ? lo + chunk : n;
    double s = 0.0;
    for (size_t i = lo + (size_t)lane; i < hi; i += PT_K_SUMSQ_THREADS)
        s = PT_DADD(s, PT_DMUL((double)x[i], (double)x[i]));
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Launch geometry: a 1-D grid of `threads`-thread blocks covering n elements with a grid-stride
 * loop, capped so that the grid stays within CUDA's limit and every block has work. */
PT_HD unsigned pt_k_grid_1d(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    const size_t cap = 65535u * 16u; /* a grid-stride loop does the rest */
    if (b > cap) b = cap;
    return (unsigned)(b ? b : 1);
}

#endif
