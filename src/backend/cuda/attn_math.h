/* attn_math.h: the CUDA attention kernels' block programs, written once for the GPU and the host.
 *
 * Each attention kernel (attention.cu) is a thread block running a small program: a sequence of
 * phases separated by __syncthreads(). A phase is the function pt_attn_<kernel>_step(…, phase, t,
 * …) of one thread t: it does its share of the phase (tile loads, scores, softmax statistics,
 * products) and returns the next phase, the same for every thread of the block (it depends only on
 * the shape and on shared memory all threads read after the barrier). The kernel runs
 *     for (ph = first; ph != PT_ATTN_END;) { ph = step(ph, threadIdx.x); __syncthreads(); }
 * and tests/test_cuda_host_attn.c runs the very same steps on the host, thread after thread between
 * the barriers, for every block of the grid, against the CPU backend (src/backend/cpu/attention.c).
 * So the host test executes the kernels' arithmetic, indexing, masking and tiling, not a copy.
 *
 * Exactness. The kernels compute what the CPU backend computes, in its order: every score, dP, P·V,
 * dQ, dK and dV element is one thread's sequential fused multiply-add chain over head_dim or over
 * keys/queries in increasing order (the CPU's tile products accumulate per element in that order,
 * and its gnu17 build with FMA contracts a·b + c, so the chains are fmaf chains); the forward
 * folds keys into the online softmax in the CPU's tiles of PT_ATTN_KT = 64 keys; e^x is the CPU's
 * polynomial (pt_k_expf, contracted as the CPU build contracts it). Deviations: lse uses
 * pt_attn_logf (double arithmetic, correctly rounded but for ~1e-8 of inputs) where the CPU calls
 * glibc's logf (within 1 ulp: ~0.15% of values differ by one ulp); D = rowsum(dout∘out) is a
 * sequential double sum where the CPU's is an OpenMP SIMD reduction (the float result differs only
 * when the double sums straddle a float rounding boundary); the merge calls the platform's double
 * exp and log. Every output element has one owner thread (rows of out and dq by query blocks, rows
 * of dk and dv by key blocks looping over the kv group's query heads and the queries in order):
 * no atomics, so results are the same bit for bit on every run.
 *
 * This header compiles as C17 (host tests) and as CUDA C++ (attention.cu).
 */
#ifndef PT_CUDA_ATTN_MATH_H
#define PT_CUDA_ATTN_MATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cuda/hd.h"
#include "backend/cuda/kmath.h"
#include "pt/backend.h"

/* forced inline on the device, so that the per-thread arrays of the step functions live in
 * registers (constant indices once the loops over geometry constants are unrolled) */
#ifdef __CUDACC__
#define PT_AHD static __forceinline__ __host__ __device__
#else
#define PT_AHD static inline
#endif
#if defined(__CUDA_ARCH__) /* the device pass only: the host compiler knows no such pragma */
#define PT_ATTN_UNROLL _Pragma("unroll")
#else
#define PT_ATTN_UNROLL
#endif

#if defined(__CUDA_ARCH__)
#define PT_ATTN_DDIV(a, b) __ddiv_rn((a), (b))
#else
#define PT_ATTN_DDIV(a, b) ((double)(a) / (double)(b))
#endif
#define PT_ATTN_DSUB(a, b) PT_DADD((a), -(double)(b))

#define PT_ATTN_INF (pt_hd_u2f(0x7f800000u))

enum {
    PT_ATTN_NT = 128,  /* threads per block, every kernel */
    PT_ATTN_NW = 4,    /* warps per block */
    PT_ATTN_KT = 64,   /* forward key tile: the CPU backend's, on which the online softmax steps */
    PT_ATTN_RPW_MAX = 8, /* bounds of the per-thread arrays (geometry below stays within) */
    PT_ATTN_KPW_MAX = 16,
    PT_ATTN_NJ_MAX = 8,
    PT_ATTN_SE_MAX = 16,
    /* dynamic shared memory every kernel stays within: sm_86/sm_89's 99 KiB per block, so that
     * the sm_80 code also runs there (sm_80 allows 163 KiB, sm_90 227 KiB) */
    PT_ATTN_SMEM_MAX = 99 * 1024,
    PT_ATTN_SMEM_DEFAULT = 48 * 1024 /* beyond it a kernel opts in (cudaFuncSetAttribute) */
};

/* ---------------------------------------------------------------------------------------------
 * Per-element arithmetic */

/* log x rounded to float, computed in double so that both sides give the same bits by
 * construction: x = 2^e·m, m in [√½, √2), log m = 2·atanh(f/(2+f)) with f = m − 1 (series to
 * s^19: relative error below 1e-15, so the float is the correctly rounded logf but for inputs
 * within 1e-15 of a rounding boundary). */
PT_AHD float pt_attn_logf(float x) {
    if (x != x) return x;
    if (x < 0.0f) return pt_hd_u2f(0x7fc00000u);
    if (x == 0.0f) return -PT_ATTN_INF;
    if (x == PT_ATTN_INF) return x;
    uint32_t u = pt_hd_f2u(x);
    int e = 0;
    if (u < 0x00800000u) { /* denormal: scale into the normals */
        u = pt_hd_f2u(PT_FMUL(x, 16777216.0f));
        e = -24;
    }
    e += (int)(u >> 23) - 127;
    float m = pt_hd_u2f((u & 0x007fffffu) | 0x3f800000u); /* [1, 2) */
    if (m > 1.41421356f) {
        m = PT_FMUL(m, 0.5f);
        e += 1;
    }
    const double f = PT_DADD((double)m, -1.0); /* exact */
    const double s = PT_ATTN_DDIV(f, PT_DADD(2.0, f)), s2 = PT_DMUL(s, s);
    double p = 1.0 / 19.0;
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 17.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 15.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 13.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 11.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 9.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 7.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 5.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0 / 3.0);
    p = PT_DADD(PT_DMUL(p, s2), 1.0);
    const double lm = PT_DMUL(PT_DMUL(2.0, s), p);
    return (float)PT_DADD(PT_DMUL((double)e, 0.69314718055994530942), lm);
}

/* x rounded to bf16 (nearest even, NaN kept quiet), as a float */
PT_AHD float pt_attn_bf16_value(float x) { return pt_k_bf16_to_float(pt_k_bf16_round(x)); }

/* One thread's share of a tile product: acc[e] = Σ_d a[c·lda + d]·b[(r0 + e·rstep)·hd + d] for
 * e < ne, over d in order, one fused multiply-add chain each (the CPU backend's order) */
PT_AHD void pt_attn_tile_dots(float *acc, int ne, const float *a, int lda, int c, const float *b,
                              int r0, int rstep, int hd) {
    PT_ATTN_UNROLL
    for (int e = 0; e < ne; e++) acc[e] = 0.0f;
    for (int d = 0; d < hd; d++) {
        const float x = a[c * lda + d];
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) acc[e] = PT_FMA(x, b[(r0 + e * rstep) * hd + d], acc[e]);
    }
}

/* whether key position k is hidden from a query at position qp whose document starts at lo
 * (INT32_MIN without documents) */
PT_AHD int pt_attn_hidden(int32_t k, int32_t qp, int32_t lo) { return k > qp || k < lo; }

/* whether some query of a block (positions up to qmax, documents from lomin) can see some key
 * of a tile (positions kmin..kmax): the CPU backend's tile skip */
PT_AHD int pt_attn_tile_visible(int32_t kmin, int32_t kmax, int32_t qmax, int32_t lomin) {
    return !(kmin > qmax || kmax < lomin);
}

/* the row's log-sum-exp from the online softmax's max m and sum l (−∞: no visible key) */
PT_AHD float pt_attn_row_lse(float m, float l) {
    return l == 0.0f ? -PT_ATTN_INF : PT_FADD(m, pt_attn_logf(l));
}

/* the lse a probability is taken against, e^(s − L): +∞ for a row without keys, so P = 0 */
PT_AHD float pt_attn_lse_for_p(float lse) { return lse == -PT_ATTN_INF ? PT_ATTN_INF : lse; }

/* Ring attention's merge of one row: the weights of the running and the block's output and the
 * merged lse; 0 when the block saw nothing (lse_blk = −∞: the row is left as it is). */
PT_AHD int pt_attn_merge_weights(float l1, float l2, float *w1, float *w2, float *lnew) {
    if (l2 == -PT_ATTN_INF) return 0;
    const float mx = l1 > l2 ? l1 : l2;
    /* in double: the weights of two close log-sum-exps */
    const double e1 = l1 == -PT_ATTN_INF ? 0.0 : exp(PT_ATTN_DSUB((double)l1, (double)mx));
    const double e2 = exp(PT_ATTN_DSUB((double)l2, (double)mx));
    const double sum = PT_DADD(e1, e2);
    *lnew = (float)PT_DADD((double)mx, log(sum));
    *w1 = (float)PT_ATTN_DDIV(e1, sum);
    *w2 = (float)PT_ATTN_DDIV(e2, sum);
    return 1;
}
PT_AHD float pt_attn_merge_elem(float w1, float o1, float w2, float o2) {
    return PT_FMA(w1, o1, PT_FMUL(w2, o2));
}

/* ---------------------------------------------------------------------------------------------
 * Launch geometry. Blocks of PT_ATTN_NT threads (4 warps). A head_dim class hdc (head_dim
 * rounded up to 32, 64, 128 or 256) fixes the tiles, so that the per-thread arrays have
 * compile-time sizes (one kernel instance per class):
 *   forward and dq: bq query rows per block (a warp owns rpw of them, its lanes the columns
 *     lane + 32j, j < nj); the forward steps over keys in tiles of PT_ATTN_KT, dq in kq;
 *   dk/dv: bk keys per block (a warp owns kpw keys, lanes over columns as above), stepping over
 *     the queries in qs rows.
 * Score tiles (rows × cols) are spread over the threads as element e of thread t at row
 * t / cols + e·(NT / cols), column t % cols. */
typedef struct {
    int hdc, nj;
    int bq, rpw, kq;
    int bk, kpw, qs;
} pt_attn_geom;

PT_AHD int pt_attn_hdc(int hd) { return hd <= 32 ? 32 : hd <= 64 ? 64 : hd <= 128 ? 128 : 256; }

PT_AHD pt_attn_geom pt_attn_geom_of(int hdc) {
    pt_attn_geom G;
    G.hdc = hdc;
    G.nj = hdc / 32;
    G.bq = hdc <= 128 ? 32 : 16; /* 32: the CPU backend's query tile */
    G.rpw = G.bq / PT_ATTN_NW;
    G.kq = hdc <= 128 ? 64 : 32;
    G.bk = hdc <= 64 ? 64 : 4096 / hdc; /* dK and dV: 2·bk·hdc/NT ≤ 64 registers a thread */
    G.kpw = G.bk / PT_ATTN_NW;
    G.qs = G.bq;
    return G;
}

/* row stride of key/value tiles in shared memory: odd, so that lanes reading one column of
 * consecutive rows hit distinct banks */
PT_AHD int pt_attn_kvld(int hd) { return hd | 1; }

PT_AHD int64_t pt_attn_cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* blocks of each kernel (one-dimensional grids: gridDim.x ≤ 2^31 − 1) */
PT_AHD int64_t pt_attn_fwd_blocks(const pt_attn_shape *s, pt_attn_geom G) {
    return (int64_t)s->B * s->n_heads * pt_attn_cdiv(s->Tq, G.bq);
}
PT_AHD int64_t pt_attn_dkv_blocks(const pt_attn_shape *s, pt_attn_geom G) {
    return (int64_t)s->B * s->n_kv_heads * pt_attn_cdiv(s->Tk, G.bk);
}
PT_AHD int64_t pt_attn_merge_blocks(int64_t rows) { return pt_attn_cdiv(rows, PT_ATTN_NW); }

/* ---------------------------------------------------------------------------------------------
 * Shared memory: float arrays, then int32 arrays, carved from one dynamic buffer. */

typedef struct {
    float *q;       /* (bq × hd) q·scale */
    float *kv;      /* (KT × kvld) the key tile, then the value tile */
    float *s;       /* (bq × KT) scores, then probabilities */
    float *m, *l, *msub, *alpha, *L; /* (bq) per row */
    int32_t *qp, *lo; /* (bq) positions, document starts (INT32_MIN: none / padding row) */
    int32_t *kp;      /* (KT) key positions */
} pt_attn_fwd_smem;

PT_AHD size_t pt_attn_fwd_smem_bytes(pt_attn_geom G, int hd) {
    return sizeof(float) * ((size_t)G.bq * hd + (size_t)PT_ATTN_KT * pt_attn_kvld(hd) +
                            (size_t)G.bq * PT_ATTN_KT + 5 * (size_t)G.bq) +
           sizeof(int32_t) * (2 * (size_t)G.bq + PT_ATTN_KT);
}
PT_AHD pt_attn_fwd_smem pt_attn_fwd_carve(void *base, pt_attn_geom G, int hd) {
    pt_attn_fwd_smem m;
    float *f = (float *)base;
    m.q = f, f += (size_t)G.bq * hd;
    m.kv = f, f += (size_t)PT_ATTN_KT * pt_attn_kvld(hd);
    m.s = f, f += (size_t)G.bq * PT_ATTN_KT;
    m.m = f, f += G.bq;
    m.l = f, f += G.bq;
    m.msub = f, f += G.bq;
    m.alpha = f, f += G.bq;
    m.L = f, f += G.bq;
    int32_t *i = (int32_t *)f;
    m.qp = i, i += G.bq;
    m.lo = i, i += G.bq;
    m.kp = i;
    return m;
}

typedef struct {
    float *q;      /* (bq × hd) q·scale */
    float *dout;   /* (bq × hd) */
    float *kv;     /* (kq × kvld) the value tile, then the key tile */
    float *ds;     /* (bq × kq) dP, then dS */
    float *L, *D;  /* (bq) */
    int32_t *qp, *lo, *kp;
} pt_attn_dq_smem;

PT_AHD size_t pt_attn_dq_smem_bytes(pt_attn_geom G, int hd) {
    return sizeof(float) * (2 * (size_t)G.bq * hd + (size_t)G.kq * pt_attn_kvld(hd) +
                            (size_t)G.bq * G.kq + 2 * (size_t)G.bq) +
           sizeof(int32_t) * (2 * (size_t)G.bq + G.kq);
}
PT_AHD pt_attn_dq_smem pt_attn_dq_carve(void *base, pt_attn_geom G, int hd) {
    pt_attn_dq_smem m;
    float *f = (float *)base;
    m.q = f, f += (size_t)G.bq * hd;
    m.dout = f, f += (size_t)G.bq * hd;
    m.kv = f, f += (size_t)G.kq * pt_attn_kvld(hd);
    m.ds = f, f += (size_t)G.bq * G.kq;
    m.L = f, f += G.bq;
    m.D = f, f += G.bq;
    int32_t *i = (int32_t *)f;
    m.qp = i, i += G.bq;
    m.lo = i, i += G.bq;
    m.kp = i;
    return m;
}

typedef struct {
    float *k, *v;     /* (bk × kvld) the block's keys and values */
    float *q, *dout;  /* (qs × hd) the query step's rows (q unscaled) */
    float *p, *ds;    /* (qs × bk) P (bf16-rounded with p_bf16) and dS */
    float *L, *D;     /* (qs) */
    int32_t *qp, *lo; /* (qs) */
    int32_t *kp;      /* (bk) */
} pt_attn_dkv_smem;

PT_AHD size_t pt_attn_dkv_smem_bytes(pt_attn_geom G, int hd) {
    return sizeof(float) * (2 * (size_t)G.bk * pt_attn_kvld(hd) + 2 * (size_t)G.qs * hd +
                            2 * (size_t)G.qs * G.bk + 2 * (size_t)G.qs) +
           sizeof(int32_t) * (2 * (size_t)G.qs + G.bk);
}
PT_AHD pt_attn_dkv_smem pt_attn_dkv_carve(void *base, pt_attn_geom G, int hd) {
    pt_attn_dkv_smem m;
    float *f = (float *)base;
    m.k = f, f += (size_t)G.bk * pt_attn_kvld(hd);
    m.v = f, f += (size_t)G.bk * pt_attn_kvld(hd);
    m.q = f, f += (size_t)G.qs * hd;
    m.dout = f, f += (size_t)G.qs * hd;
    m.p = f, f += (size_t)G.qs * G.bk;
    m.ds = f, f += (size_t)G.qs * G.bk;
    m.L = f, f += G.qs;
    m.D = f, f += G.qs;
    int32_t *i = (int32_t *)f;
    m.qp = i, i += G.qs;
    m.lo = i, i += G.qs;
    m.kp = i;
    return m;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers of the block programs */

/* the tensors of one call (device pointers on the GPU) */
typedef struct {
    const float *q, *k, *v, *out, *dout, *lse;
    float *o, *lse_out, *dq, *dk, *dv;
} pt_attn_io;

/* A query block: sequence b, head h (kv head g), rows [i0, i0 + nq). Blocks run in reverse
 * order of their query tile, so that the long causal rows start first. */
typedef struct {
    int b, h, g, i0, nq;
} pt_attn_qblock;

PT_AHD pt_attn_qblock pt_attn_qblock_of(const pt_attn_shape *s, pt_attn_geom G, int64_t bid) {
    const int64_t nqt = pt_attn_cdiv(s->Tq, G.bq);
    pt_attn_qblock q;
    const int qt = (int)(nqt - 1 - bid % nqt);
    q.h = (int)(bid / nqt % s->n_heads);
    q.b = (int)(bid / nqt / s->n_heads);
    q.g = q.h / (s->n_heads / s->n_kv_heads);
    q.i0 = qt * G.bq;
    q.nq = s->Tq - q.i0 < G.bq ? s->Tq - q.i0 : G.bq;
    return q;
}

/* the largest position and the smallest document start of rows [0, n) */
PT_AHD void pt_attn_rows_range(const int32_t *qp, const int32_t *lo, int n, int32_t *qmax,
                               int32_t *lomin) {
    int32_t a = INT32_MIN, b = INT32_MAX;
    for (int r = 0; r < n; r++) {
        a = qp[r] > a ? qp[r] : a;
        b = lo[r] < b ? lo[r] : b;
    }
    *qmax = a;
    *lomin = b;
}
PT_AHD void pt_attn_keys_range(const int32_t *kp, int n, int32_t *kmin, int32_t *kmax) {
    int32_t a = INT32_MAX, b = INT32_MIN;
    for (int c = 0; c < n; c++) {
        a = kp[c] < a ? kp[c] : a;
        b = kp[c] > b ? kp[c] : b;
    }
    *kmin = a;
    *kmax = b;
}

/* rows [r0, r0 + n) of a (B·T × …) tensor at stride ld, columns [col, col + hd), into dst (rows ×
 * ld_dst), times mul when mul_on; rows past n (up to rows) and columns past hd are zero. */
PT_AHD void pt_attn_load_rows(float *dst, int ld_dst, int rows, const float *src, size_t ld,
                              int64_t r0, int n, size_t col, int hd, int mul_on, float mul,
                              int t) {
    for (int idx = t; idx < rows * hd; idx += PT_ATTN_NT) {
        const int r = idx / hd, d = idx % hd;
        float x = 0.0f;
        if (r < n) {
            x = src[(size_t)(r0 + r) * ld + col + d];
            if (mul_on) x = PT_FMUL(x, mul);
        }
        dst[r * ld_dst + d] = x;
    }
}

/* D = rowsum(dout∘out) of one row, in double, in the order of the columns */
PT_AHD float pt_attn_row_dot(const float *dout, const float *out, int hd) {
    double acc = 0.0;
    for (int d = 0; d < hd; d++) acc = PT_DADD(acc, PT_DMUL((double)dout[d], (double)out[d]));
    return (float)acc;
}

/* the per-row data of query rows [i0, i0 + n) into qp, lo (rows past n: INT32_MIN, which hides
 * every key) */
PT_AHD void pt_attn_load_qpos(const pt_attn_shape *s, int b, int i0, int n, int rows,
                              int32_t *qp, int32_t *lo, int t) {
    if (t >= rows) return;
    qp[t] = t < n ? s->q_pos[i0 + t] : INT32_MIN;
    lo[t] = t < n && s->q_lo ? s->q_lo[(size_t)b * s->Tq + i0 + t] : INT32_MIN;
}

/* ---------------------------------------------------------------------------------------------
 * Forward. One block per (b, h, tile of bq queries). Per key tile of KT keys: positions, the
 * skip test, the key tile, scores; then
 *   fp32 (p_bf16 = 0): row maxima and the online update (m, msub, alpha) while the value tile
 *     loads, P = e^(S − msub), row sums into l and acc = acc·alpha + P·V;
 *   p_bf16, first pass (stats): the same without values;
 *   p_bf16, second pass (after L = lse, or lse_in): P16 = bf16(e^(S − L)) with the scores, the
 *     value tile, acc += P16·V.
 * Then lse and out. */

enum {
    PT_ATTN_END = 0,
    PT_ATTN_F_INIT,
    PT_ATTN_F_KPOS,
    PT_ATTN_F_CHECK,
    PT_ATTN_F_SCORES,
    PT_ATTN_F_ROWMAX,
    PT_ATTN_F_EXP,
    PT_ATTN_F_SUMPV,
    PT_ATTN_F_LOADV,
    PT_ATTN_F_PV,
    PT_ATTN_F_OUT
};

typedef struct {
    int kt;   /* key tile */
    int pass; /* p_bf16: 0 the statistics, 1 P16·V */
    float acc[PT_ATTN_RPW_MAX][PT_ATTN_NJ_MAX]; /* rows w·rpw + i, columns lane + 32j */
} pt_attn_fwd_thread;

/* acc (the warp's rows) += P·V over the tile's nk keys in order */
PT_AHD void pt_attn_fwd_pv(pt_attn_geom G, const pt_attn_fwd_smem *sm, int hd, int nk, int t,
                           pt_attn_fwd_thread *ts) {
    const int kvld = pt_attn_kvld(hd), w = t / 32, lane = t % 32;
    for (int c = 0; c < nk; c++) {
        float vv[PT_ATTN_NJ_MAX];
        PT_ATTN_UNROLL
        for (int j = 0; j < G.nj; j++)
            vv[j] = lane + 32 * j < hd ? sm->kv[c * kvld + lane + 32 * j] : 0.0f;
        PT_ATTN_UNROLL
        for (int i = 0; i < G.rpw; i++) {
            const float p = sm->s[(w * G.rpw + i) * PT_ATTN_KT + c];
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) ts->acc[i][j] = PT_FMA(p, vv[j], ts->acc[i][j]);
        }
    }
}

PT_AHD int pt_attn_fwd_step(const pt_attn_shape *s, const pt_attn_io *io, pt_attn_geom G,
                            const pt_attn_qblock *qb, const pt_attn_fwd_smem *sm, int ph, int t,
                            pt_attn_fwd_thread *ts) {
    const int hd = s->head_dim, kvld = pt_attn_kvld(hd), KT = PT_ATTN_KT;
    const int nkt = (int)pt_attn_cdiv(s->Tk, KT);
    const int w = t / 32, lane = t % 32;
    const size_t qcol = (size_t)qb->h * hd, kcol = (size_t)qb->g * hd;
    const int64_t qrow0 = (int64_t)qb->b * s->Tq + qb->i0;
    const int j0 = ts->kt * KT, nk = s->Tk - j0 < KT ? s->Tk - j0 : KT;
    switch (ph) {
    case PT_ATTN_F_INIT:
        pt_attn_load_rows(sm->q, hd, G.bq, io->q, (size_t)s->ldq, qrow0, qb->nq, qcol, hd, 1,
                          s->scale, t);
        pt_attn_load_qpos(s, qb->b, qb->i0, qb->nq, G.bq, sm->qp, sm->lo, t);
        if (t < G.bq) {
            sm->m[t] = -PT_ATTN_INF;
            sm->l[t] = 0.0f;
            float L = PT_ATTN_INF;
            if (s->lse_in && t < qb->nq) {
                const float li = s->lse_in[((size_t)qb->b * s->n_heads + qb->h) * s->Tq + qb->i0 + t];
                L = li == -PT_ATTN_INF ? PT_ATTN_INF : li;
            }
            sm->L[t] = L;
        }
        PT_ATTN_UNROLL
        for (int i = 0; i < G.rpw; i++) {
            const int r = w * G.rpw + i;
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) {
                const int d = lane + 32 * j;
                ts->acc[i][j] = s->lse_in && r < qb->nq && d < hd
                                    ? io->o[(size_t)(qrow0 + r) * s->ldo + qcol + d]
                                    : 0.0f;
            }
        }
        ts->kt = 0;
        ts->pass = s->lse_in ? 1 : 0;
        return PT_ATTN_F_KPOS;

    case PT_ATTN_F_KPOS:
        if (ts->kt == nkt) {
            if (s->p_bf16 && ts->pass == 0 && !s->lse_only) {
                /* the statistics are done: L = lse (+∞ for rows without keys), second pass */
                if (t < G.bq)
                    sm->L[t] = t < qb->nq && sm->l[t] != 0.0f
                                   ? PT_FADD(sm->m[t], pt_attn_logf(sm->l[t]))
                                   : PT_ATTN_INF;
                ts->pass = 1;
                ts->kt = 0;
                return PT_ATTN_F_KPOS;
            }
            return PT_ATTN_F_OUT;
        }
        if (t < KT) sm->kp[t] = t < nk ? s->k_pos[j0 + t] : INT32_MAX;
        return PT_ATTN_F_CHECK;

    case PT_ATTN_F_CHECK: {
        int32_t qmax, lomin, kmin, kmax;
        pt_attn_rows_range(sm->qp, sm->lo, qb->nq, &qmax, &lomin);
        pt_attn_keys_range(sm->kp, nk, &kmin, &kmax);
        if (!pt_attn_tile_visible(kmin, kmax, qmax, lomin)) {
            ts->kt++;
            return PT_ATTN_F_KPOS;
        }
        pt_attn_load_rows(sm->kv, kvld, KT, io->k, (size_t)s->ldk, (int64_t)qb->b * s->Tk + j0,
                          nk, kcol, hd, 0, 1.0f, t);
        return PT_ATTN_F_SCORES;
    }

    case PT_ATTN_F_SCORES: {
        /* S (bq × KT) = (q·scale)·kᵀ, −∞ where hidden or padding */
        const int p16 = s->p_bf16 && ts->pass == 1, c = t % KT, rstep = PT_ATTN_NT / KT;
        const int ne = G.bq * KT / PT_ATTN_NT;
        float acc[PT_ATTN_SE_MAX];
        pt_attn_tile_dots(acc, ne, sm->kv, kvld, c, sm->q, t / KT, rstep, hd);
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) {
            const int r = t / KT + e * rstep;
            float x = acc[e];
            if (c >= nk || pt_attn_hidden(sm->kp[c], sm->qp[r], sm->lo[r])) x = -PT_ATTN_INF;
            if (p16) x = pt_attn_bf16_value(pt_k_expf(PT_FSUB(x, sm->L[r])));
            sm->s[r * KT + c] = x;
        }
        return p16 ? PT_ATTN_F_LOADV : PT_ATTN_F_ROWMAX;
    }

    case PT_ATTN_F_ROWMAX:
        /* the online softmax's new maximum of each row (all KT columns, padding included) */
        if (t < G.bq) {
            float mx = -PT_ATTN_INF;
            for (int c = 0; c < KT; c++) {
                const float x = sm->s[t * KT + c];
                mx = x > mx ? x : mx;
            }
            const float mold = sm->m[t], mnew = mx > mold ? mx : mold;
            /* a row that has seen nothing keeps m = −∞ and subtracts 0: e^(−∞) = 0, not NaN */
            const float msub = mnew == -PT_ATTN_INF ? 0.0f : mnew;
            sm->alpha[t] = pt_k_expf(PT_FSUB(mold, msub));
            sm->msub[t] = msub;
            sm->m[t] = mnew;
        }
        if (!s->p_bf16)
            pt_attn_load_rows(sm->kv, kvld, KT, io->v, (size_t)s->ldv,
                              (int64_t)qb->b * s->Tk + j0, nk, kcol, hd, 0, 1.0f, t);
        return PT_ATTN_F_EXP;

    case PT_ATTN_F_EXP:
        for (int idx = t; idx < G.bq * KT; idx += PT_ATTN_NT)
            sm->s[idx] = pt_k_expf(PT_FSUB(sm->s[idx], sm->msub[idx / KT]));
        return PT_ATTN_F_SUMPV;

    case PT_ATTN_F_SUMPV:
        if (t < qb->nq) { /* l = l·alpha + Σ P, the sum over the tile in key order */
            float sum = 0.0f;
            for (int c = 0; c < KT; c++) sum = PT_FADD(sum, sm->s[t * KT + c]);
            sm->l[t] = PT_FMA(sm->l[t], sm->alpha[t], sum);
        }
        if (s->p_bf16) { /* the statistics pass: no values */
            ts->kt++;
            return PT_ATTN_F_KPOS;
        }
        PT_ATTN_UNROLL
        for (int i = 0; i < G.rpw; i++) {
            const float a = sm->alpha[w * G.rpw + i];
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) ts->acc[i][j] = PT_FMUL(ts->acc[i][j], a);
        }
        pt_attn_fwd_pv(G, sm, hd, nk, t, ts);
        ts->kt++;
        return PT_ATTN_F_KPOS;

    case PT_ATTN_F_PV:
        pt_attn_fwd_pv(G, sm, hd, nk, t, ts);
        ts->kt++;
        return PT_ATTN_F_KPOS;

    case PT_ATTN_F_LOADV:
        pt_attn_load_rows(sm->kv, kvld, KT, io->v, (size_t)s->ldv, (int64_t)qb->b * s->Tk + j0,
                          nk, kcol, hd, 0, 1.0f, t);
        return PT_ATTN_F_PV;

    case PT_ATTN_F_OUT:
        if (t < qb->nq && !s->lse_in)
            io->lse_out[((size_t)qb->b * s->n_heads + qb->h) * s->Tq + qb->i0 + t] =
                pt_attn_row_lse(sm->m[t], sm->l[t]);
        if (s->lse_only) return PT_ATTN_END;
        PT_ATTN_UNROLL
        for (int i = 0; i < G.rpw; i++) {
            const int r = w * G.rpw + i;
            if (r >= qb->nq) continue;
            const float l = sm->l[r];
            /* lse_in: rows without keys anywhere are left as they are; p_bf16: normalised */
            if (s->lse_in && sm->L[r] == PT_ATTN_INF) continue;
            const float inv = s->lse_in || s->p_bf16 || l == 0.0f ? 1.0f : PT_FDIV(1.0f, l);
            float *o = io->o + (size_t)(qrow0 + r) * s->ldo + qcol;
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) {
                const int d = lane + 32 * j;
                if (d >= hd) continue;
                o[d] = !s->lse_in && l == 0.0f ? 0.0f : PT_FMUL(ts->acc[i][j], inv);
            }
        }
        return PT_ATTN_END;
    }
    return PT_ATTN_END;
}

/* ---------------------------------------------------------------------------------------------
 * Backward, dq. One block per (b, h, tile of bq queries): D and L of its rows, then per key step
 * of kq keys: positions, the skip test, the value tile and dP = dout·vᵀ, the key tile and
 * S = (q·scale)·kᵀ, P = e^(S − L), dS = P∘(dP − D), dQ += dS·k; at the end dq += dQ·scale. */

enum {
    PT_ATTN_Q_INIT = 1,
    PT_ATTN_Q_D,
    PT_ATTN_Q_KPOS,
    PT_ATTN_Q_CHECK,
    PT_ATTN_Q_DP,
    PT_ATTN_Q_LOADK,
    PT_ATTN_Q_DS,
    PT_ATTN_Q_DQ
};

typedef struct {
    int kt;
    float acc[PT_ATTN_RPW_MAX][PT_ATTN_NJ_MAX]; /* dQ, rows w·rpw + i, columns lane + 32j */
} pt_attn_dq_thread;

PT_AHD int pt_attn_dq_step(const pt_attn_shape *s, const pt_attn_io *io, pt_attn_geom G,
                           const pt_attn_qblock *qb, const pt_attn_dq_smem *sm, int ph, int t,
                           pt_attn_dq_thread *ts) {
    const int hd = s->head_dim, kvld = pt_attn_kvld(hd), KQ = G.kq;
    const int nkt = (int)pt_attn_cdiv(s->Tk, KQ);
    const int w = t / 32, lane = t % 32;
    const size_t qcol = (size_t)qb->h * hd, kcol = (size_t)qb->g * hd;
    const int64_t qrow0 = (int64_t)qb->b * s->Tq + qb->i0, krow0 = (int64_t)qb->b * s->Tk;
    const int j0 = ts->kt * KQ, nk = s->Tk - j0 < KQ ? s->Tk - j0 : KQ;
    const int c = t % KQ, rstep = PT_ATTN_NT / KQ, ne = G.bq * KQ / PT_ATTN_NT;
    switch (ph) {
    case PT_ATTN_Q_INIT:
        pt_attn_load_rows(sm->q, hd, G.bq, io->q, (size_t)s->ldq, qrow0, qb->nq, qcol, hd, 1,
                          s->scale, t);
        pt_attn_load_rows(sm->dout, hd, G.bq, io->dout, (size_t)s->ldo, qrow0, qb->nq, qcol, hd,
                          0, 1.0f, t);
        pt_attn_load_qpos(s, qb->b, qb->i0, qb->nq, G.bq, sm->qp, sm->lo, t);
        if (t < G.bq)
            sm->L[t] = t < qb->nq ? pt_attn_lse_for_p(io->lse[((size_t)qb->b * s->n_heads + qb->h) *
                                                                  s->Tq + qb->i0 + t])
                                  : PT_ATTN_INF;
        PT_ATTN_UNROLL
        for (int i = 0; i < G.rpw; i++)
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) ts->acc[i][j] = 0.0f;
        ts->kt = 0;
        return PT_ATTN_Q_D;

    case PT_ATTN_Q_D:
        if (t < G.bq)
            sm->D[t] = t < qb->nq ? pt_attn_row_dot(sm->dout + t * hd,
                                                    io->out + (size_t)(qrow0 + t) * s->ldo + qcol, hd)
                                  : 0.0f;
        return PT_ATTN_Q_KPOS;

    case PT_ATTN_Q_KPOS:
        if (ts->kt == nkt) { /* dq += dQ·scale */
            PT_ATTN_UNROLL
            for (int i = 0; i < G.rpw; i++) {
                const int r = w * G.rpw + i;
                if (r >= qb->nq) continue;
                float *dq = io->dq + (size_t)(qrow0 + r) * s->ldq + qcol;
                PT_ATTN_UNROLL
                for (int j = 0; j < G.nj; j++) {
                    const int d = lane + 32 * j;
                    if (d < hd) dq[d] = PT_FMA(ts->acc[i][j], s->scale, dq[d]);
                }
            }
            return PT_ATTN_END;
        }
        if (t < KQ) sm->kp[t] = t < nk ? s->k_pos[j0 + t] : INT32_MAX;
        return PT_ATTN_Q_CHECK;

    case PT_ATTN_Q_CHECK: {
        int32_t qmax, lomin, kmin, kmax;
        pt_attn_rows_range(sm->qp, sm->lo, qb->nq, &qmax, &lomin);
        pt_attn_keys_range(sm->kp, nk, &kmin, &kmax);
        if (!pt_attn_tile_visible(kmin, kmax, qmax, lomin)) {
            ts->kt++;
            return PT_ATTN_Q_KPOS;
        }
        pt_attn_load_rows(sm->kv, kvld, KQ, io->v, (size_t)s->ldv, krow0 + j0, nk, kcol, hd, 0,
                          1.0f, t);
        return PT_ATTN_Q_DP;
    }

    case PT_ATTN_Q_DP: { /* dP (bq × kq) = dout·vᵀ */
        float acc[PT_ATTN_SE_MAX];
        pt_attn_tile_dots(acc, ne, sm->kv, kvld, c, sm->dout, t / KQ, rstep, hd);
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) sm->ds[(t / KQ + e * rstep) * KQ + c] = acc[e];
        return PT_ATTN_Q_LOADK;
    }

    case PT_ATTN_Q_LOADK:
        pt_attn_load_rows(sm->kv, kvld, KQ, io->k, (size_t)s->ldk, krow0 + j0, nk, kcol, hd, 0,
                          1.0f, t);
        return PT_ATTN_Q_DS;

    case PT_ATTN_Q_DS: { /* S = (q·scale)·kᵀ, P = e^(S − L), dS = P∘(dP − D) in place */
        float acc[PT_ATTN_SE_MAX];
        pt_attn_tile_dots(acc, ne, sm->kv, kvld, c, sm->q, t / KQ, rstep, hd);
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) {
            const int r = t / KQ + e * rstep;
            float x = acc[e];
            if (c >= nk || pt_attn_hidden(sm->kp[c], sm->qp[r], sm->lo[r])) x = -PT_ATTN_INF;
            const float p = pt_k_expf(PT_FSUB(x, sm->L[r]));
            float *ds = &sm->ds[r * KQ + c];
            *ds = c < nk ? PT_FMUL(p, PT_FSUB(*ds, sm->D[r])) : 0.0f;
        }
        return PT_ATTN_Q_DQ;
    }

    case PT_ATTN_Q_DQ: /* dQ += dS·k over the step's keys in order */
        for (int cc = 0; cc < nk; cc++) {
            float kk[PT_ATTN_NJ_MAX];
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++)
                kk[j] = lane + 32 * j < hd ? sm->kv[cc * kvld + lane + 32 * j] : 0.0f;
            PT_ATTN_UNROLL
            for (int i = 0; i < G.rpw; i++) {
                const float ds = sm->ds[(w * G.rpw + i) * KQ + cc];
                PT_ATTN_UNROLL
                for (int j = 0; j < G.nj; j++) ts->acc[i][j] = PT_FMA(ds, kk[j], ts->acc[i][j]);
            }
        }
        ts->kt++;
        return PT_ATTN_Q_KPOS;
    }
    return PT_ATTN_END;
}

/* ---------------------------------------------------------------------------------------------
 * Backward, dk and dv. One block per (b, kv head g, bk keys), owning those rows of dk and dv: for
 * each query head h of the group and each step of qs queries, in order: positions, the skip test,
 * the rows of q, dout, L and D; S = q·kᵀ (with p_bf16 (q·scale)·kᵀ, the forward's products),
 * dP = dout·vᵀ, P = e^(S·sc − L) (sc = scale, or 1 with p_bf16), dS = P∘(dP − D); then
 * dV += P·dout (P rounded to bf16 with p_bf16) and dK += dSᵀ·q over the step's rows in order. At
 * the end dk += dK·scale and dv += dV. */

enum {
    PT_ATTN_K_INIT = 1,
    PT_ATTN_K_QPOS,
    PT_ATTN_K_CHECK,
    PT_ATTN_K_SDP,
    PT_ATTN_K_ACC
};

typedef struct {
    int h, i0;          /* the query head and the first row of the current step */
    int32_t kmin, kmax; /* the block's key positions */
    float dk[PT_ATTN_KPW_MAX][PT_ATTN_NJ_MAX], dv[PT_ATTN_KPW_MAX][PT_ATTN_NJ_MAX];
} pt_attn_dkv_thread;

typedef struct {
    int b, g, j0, nk;
} pt_attn_kblock;

PT_AHD pt_attn_kblock pt_attn_kblock_of(const pt_attn_shape *s, pt_attn_geom G, int64_t bid) {
    const int64_t nkb = pt_attn_cdiv(s->Tk, G.bk);
    pt_attn_kblock k;
    k.j0 = (int)(bid % nkb) * G.bk;
    k.g = (int)(bid / nkb % s->n_kv_heads);
    k.b = (int)(bid / nkb / s->n_kv_heads);
    k.nk = s->Tk - k.j0 < G.bk ? s->Tk - k.j0 : G.bk;
    return k;
}

/* the next query step: the rows, then the heads of the group */
PT_AHD void pt_attn_dkv_advance(const pt_attn_shape *s, pt_attn_geom G, pt_attn_dkv_thread *ts) {
    ts->i0 += G.qs;
    if (ts->i0 >= s->Tq) {
        ts->i0 = 0;
        ts->h++;
    }
}

PT_AHD int pt_attn_dkv_step(const pt_attn_shape *s, const pt_attn_io *io, pt_attn_geom G,
                            const pt_attn_kblock *kb, const pt_attn_dkv_smem *sm, int ph, int t,
                            pt_attn_dkv_thread *ts) {
    const int hd = s->head_dim, kvld = pt_attn_kvld(hd), BK = G.bk, rep = s->n_heads / s->n_kv_heads;
    const int w = t / 32, lane = t % 32;
    const size_t kcol = (size_t)kb->g * hd, qcol = (size_t)ts->h * hd;
    const int64_t krow0 = (int64_t)kb->b * s->Tk + kb->j0;
    const int64_t qrow0 = (int64_t)kb->b * s->Tq + ts->i0;
    const int nq = s->Tq - ts->i0 < G.qs ? s->Tq - ts->i0 : G.qs;
    switch (ph) {
    case PT_ATTN_K_INIT:
        pt_attn_load_rows(sm->k, kvld, BK, io->k, (size_t)s->ldk, krow0, kb->nk, kcol, hd, 0,
                          1.0f, t);
        pt_attn_load_rows(sm->v, kvld, BK, io->v, (size_t)s->ldv, krow0, kb->nk, kcol, hd, 0,
                          1.0f, t);
        if (t < BK) sm->kp[t] = t < kb->nk ? s->k_pos[kb->j0 + t] : INT32_MAX;
        PT_ATTN_UNROLL
        for (int i = 0; i < G.kpw; i++)
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) ts->dk[i][j] = ts->dv[i][j] = 0.0f;
        ts->h = kb->g * rep;
        ts->i0 = 0;
        ts->kmin = INT32_MAX; /* K_QPOS sets the range once kp is visible to all threads */
        ts->kmax = INT32_MIN;
        return PT_ATTN_K_QPOS;

    case PT_ATTN_K_QPOS:
        if (ts->h == (kb->g + 1) * rep) { /* dk += dK·scale, dv += dV */
            PT_ATTN_UNROLL
            for (int i = 0; i < G.kpw; i++) {
                const int cc = w * G.kpw + i;
                if (cc >= kb->nk) continue;
                float *dk = io->dk + (size_t)(krow0 + cc) * s->ldk + kcol;
                float *dv = io->dv + (size_t)(krow0 + cc) * s->ldv + kcol;
                PT_ATTN_UNROLL
                for (int j = 0; j < G.nj; j++) {
                    const int d = lane + 32 * j;
                    if (d >= hd) continue;
                    dk[d] = PT_FMA(ts->dk[i][j], s->scale, dk[d]);
                    dv[d] = PT_FADD(dv[d], ts->dv[i][j]);
                }
            }
            return PT_ATTN_END;
        }
        pt_attn_keys_range(sm->kp, kb->nk, &ts->kmin, &ts->kmax);
        pt_attn_load_qpos(s, kb->b, ts->i0, nq, G.qs, sm->qp, sm->lo, t);
        return PT_ATTN_K_CHECK;

    case PT_ATTN_K_CHECK: {
        int32_t qmax, lomin;
        pt_attn_rows_range(sm->qp, sm->lo, nq, &qmax, &lomin);
        if (!pt_attn_tile_visible(ts->kmin, ts->kmax, qmax, lomin)) {
            pt_attn_dkv_advance(s, G, ts);
            return PT_ATTN_K_QPOS;
        }
        pt_attn_load_rows(sm->q, hd, G.qs, io->q, (size_t)s->ldq, qrow0, nq, qcol, hd, 0, 1.0f,
                          t);
        pt_attn_load_rows(sm->dout, hd, G.qs, io->dout, (size_t)s->ldo, qrow0, nq, qcol, hd, 0,
                          1.0f, t);
        if (t < G.qs) {
            const size_t row = (size_t)(qrow0 + t);
            sm->L[t] = t < nq ? pt_attn_lse_for_p(
                                    io->lse[((size_t)kb->b * s->n_heads + ts->h) * s->Tq + ts->i0 + t])
                              : PT_ATTN_INF;
            sm->D[t] = t < nq ? pt_attn_row_dot(io->dout + row * s->ldo + qcol,
                                                io->out + row * s->ldo + qcol, hd)
                              : 0.0f;
        }
        return PT_ATTN_K_SDP;
    }

    case PT_ATTN_K_SDP: {
        const int c = t % BK, rstep = PT_ATTN_NT / BK, ne = G.qs * BK / PT_ATTN_NT;
        /* p_bf16: S from q·scale, the forward's products; else from q, scaled in the exponent */
        const float qmul = s->p_bf16 ? s->scale : 1.0f, sc = s->p_bf16 ? 1.0f : s->scale;
        float sacc[PT_ATTN_SE_MAX], pacc[PT_ATTN_SE_MAX];
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) sacc[e] = pacc[e] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float kk = sm->k[c * kvld + d], vv = sm->v[c * kvld + d];
            PT_ATTN_UNROLL
            for (int e = 0; e < ne; e++) {
                const int r = t / BK + e * rstep;
                sacc[e] = PT_FMA(PT_FMUL(sm->q[r * hd + d], qmul), kk, sacc[e]);
                pacc[e] = PT_FMA(sm->dout[r * hd + d], vv, pacc[e]);
            }
        }
        PT_ATTN_UNROLL
        for (int e = 0; e < ne; e++) {
            const int r = t / BK + e * rstep;
            float x = sacc[e];
            if (c >= kb->nk || pt_attn_hidden(sm->kp[c], sm->qp[r], sm->lo[r])) x = -PT_ATTN_INF;
            const float p = pt_k_expf(PT_FMA(x, sc, -sm->L[r]));
            sm->ds[r * BK + c] = PT_FMUL(p, PT_FSUB(pacc[e], sm->D[r]));
            sm->p[r * BK + c] = s->p_bf16 ? pt_attn_bf16_value(p) : p;
        }
        return PT_ATTN_K_ACC;
    }

    case PT_ATTN_K_ACC: /* dV += Pᵀ·dout, dK += dSᵀ·q over the step's rows in order */
        for (int r = 0; r < nq; r++) {
            float dd[PT_ATTN_NJ_MAX], qq[PT_ATTN_NJ_MAX];
            PT_ATTN_UNROLL
            for (int j = 0; j < G.nj; j++) {
                const int d = lane + 32 * j;
                dd[j] = d < hd ? sm->dout[r * hd + d] : 0.0f;
                qq[j] = d < hd ? sm->q[r * hd + d] : 0.0f;
            }
            PT_ATTN_UNROLL
            for (int i = 0; i < G.kpw; i++) {
                const int cc = w * G.kpw + i;
                const float p = sm->p[r * BK + cc], ds = sm->ds[r * BK + cc];
                PT_ATTN_UNROLL
                for (int j = 0; j < G.nj; j++) {
                    ts->dv[i][j] = PT_FMA(p, dd[j], ts->dv[i][j]);
                    ts->dk[i][j] = PT_FMA(ds, qq[j], ts->dk[i][j]);
                }
            }
        }
        pt_attn_dkv_advance(s, G, ts);
        return PT_ATTN_K_QPOS;
    }
    return PT_ATTN_END;
}

#endif
