/* attention.c: causal (by position) grouped-query attention on the CPU, FlashAttention-2 style.
 *
 * Queries are cut into tiles of QT rows and keys into tiles of KT rows. The forward pass keeps,
 * per query row, a running maximum m, a running sum l and an unnormalised output, and folds in one
 * key tile at a time (online softmax), so no Tq×Tk matrix ever exists: memory beyond the inputs is
 * a few tiles of scratch per thread, on the stack. A key tile whose smallest position is beyond
 * the largest query position of the tile is skipped, which halves causal work and lets context
 * parallelism skip the blocks it cannot see; a tile entirely at or before the query tile needs no
 * mask at all.
 *
 * The backward pass recomputes P = exp(S − lse) tile by tile and, with D = rowsum(dout∘out),
 * dS = P∘(dP − D). It runs as two passes so that every output element is written by one task in a
 * fixed order (race-free, and bitwise the same whatever the thread count): the first pass owns a
 * key tile of one kv head and accumulates dK and dV over all query tiles of the query heads that
 * share it; the second owns a query tile of one head and accumulates dQ over the key tiles. The
 * price is computing S and dP twice (7 tile products instead of 5).
 *
 * Tile products are written as C[r][0..n) += a·B[0..n) loops over contiguous rows, with the key
 * dimension padded to KT, so that gcc vectorises them.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/ops.h"

#define QT 32 /* query rows per tile */
#define KT 64 /* key rows per tile */
/* head_dim bound, only to keep the per-thread scratch on the stack small (about 330 KB at 256) */
#define MAX_HD 256

/* Loads n rows of hd values at stride ld into dst (n × hd), times scale. */
static void load_rows(float *restrict dst, const float *src, int n, int ld, int hd, float scale) {
    for (int r = 0; r < n; r++)
        for (int d = 0; d < hd; d++) dst[r * hd + d] = src[(size_t)r * ld + d] * scale;
}

/* Loads n ≤ KT rows of hd values at stride ld transposed into dst (hd × KT), zero-padded. */
static void load_transposed(float *restrict dst, const float *src, int n, int ld, int hd) {
    if (n < KT)
        for (int d = 0; d < hd; d++) memset(dst + d * KT + n, 0, (size_t)(KT - n) * sizeof(float));
    for (int c = 0; c < n; c++)
        for (int d = 0; d < hd; d++) dst[d * KT + c] = src[(size_t)c * ld + d];
}

/* S (nq × KT) = A (nq × hd) · Bt (hd × KT) */
static void tile_abt(float *restrict S, const float *restrict A, const float *restrict Bt, int nq,
                     int hd) {
    for (int r = 0; r < nq; r++) {
        float acc[KT] = {0};
        const float *a = A + r * hd;
        for (int d = 0; d < hd; d++) {
            const float ad = a[d], *b = Bt + d * KT;
            for (int c = 0; c < KT; c++) acc[c] += ad * b[c];
        }
        memcpy(S + r * KT, acc, sizeof acc);
    }
}

/* C (m × hd) += P (m × n, row stride ps) · B (n rows of hd at stride ldb); zero weights skipped
 * (masked entries of diagonal tiles). */
static void tile_pb(float *restrict C, const float *restrict P, int ps, const float *B, int ldb,
                    int m, int n, int hd) {
    for (int r = 0; r < m; r++) {
        float *c = C + r * hd;
        for (int j = 0; j < n; j++) {
            const float p = P[r * ps + j];
            if (p == 0.0f) continue;
            const float *b = B + (size_t)j * ldb;
            for (int d = 0; d < hd; d++) c[d] += p * b[d];
        }
    }
}

/* C (n × hd) += Pᵀ · B where P is (m × KT) and B (m × hd): C[j] += Σ_r P[r][j]·B[r]. */
static void tile_ptb(float *restrict C, const float *restrict P, const float *restrict B, int m,
                     int n, int hd) {
    for (int j = 0; j < n; j++) {
        float *c = C + j * hd;
        for (int r = 0; r < m; r++) {
            const float p = P[r * KT + j];
            if (p == 0.0f) continue;
            const float *b = B + r * hd;
            for (int d = 0; d < hd; d++) c[d] += p * b[d];
        }
    }
}

static void pos_range(const int32_t *pos, int n, int32_t *lo, int32_t *hi) {
    int32_t a = pos[0], b = pos[0];
    for (int i = 1; i < n; i++) {
        a = pos[i] < a ? pos[i] : a;
        b = pos[i] > b ? pos[i] : b;
    }
    *lo = a;
    *hi = b;
}

/* Sets S[r][c] = -INFINITY where key c is not visible to query r or is padding (c >= nk). */
static void apply_mask(float *S, const int32_t *qp, int nq, const int32_t *kp, int nk) {
    for (int r = 0; r < nq; r++) {
        float *s = S + r * KT;
        for (int c = 0; c < nk; c++)
            if (kp[c] > qp[r]) s[c] = -INFINITY;
        for (int c = nk; c < KT; c++) s[c] = -INFINITY;
    }
}

static void check_shape(const pt_attn_shape *s) {
    PT_ASSERT(s->B > 0 && s->Tq > 0 && s->Tk > 0);
    PT_ASSERT(s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0);
    PT_ASSERT(s->head_dim > 0 && s->head_dim <= MAX_HD);
    PT_ASSERT(s->q_pos && s->k_pos);
}

/* q (B,Tq,H·hd at ldq), k, v (B,Tk,Hkv·hd at ldk, ldv) -> out (B,Tq,H·hd at ldo), lse (B,H,Tq) */
void pt_cpu_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                              const float *k, const float *v, float *out, float *lse) {
    (void)be;
    check_shape(s);
    const int B = s->B, Tq = s->Tq, Tk = s->Tk, H = s->n_heads, hd = s->head_dim;
    const int rep = H / s->n_kv_heads, nqt = (Tq + QT - 1) / QT, nkt = (Tk + KT - 1) / KT;
    const int64_t ntask = (int64_t)B * H * nqt;

#pragma omp parallel for schedule(dynamic, 1) if (ntask > 1)
    for (int64_t task = 0; task < ntask; task++) {
        const int qt = (int)(task % nqt), h = (int)(task / nqt % H), b = (int)(task / nqt / H);
        const int g = h / rep, i0 = qt * QT, nq = Tq - i0 < QT ? Tq - i0 : QT;
        const int32_t *qp = s->q_pos + i0;
        int32_t qmin, qmax;
        pos_range(qp, nq, &qmin, &qmax);

        float Qs[QT * hd] __attribute__((aligned(64)));  /* q·scale (nq × hd) */
        float Kt[hd * KT] __attribute__((aligned(64)));  /* kᵀ (hd × KT) */
        float acc[QT * hd] __attribute__((aligned(64))); /* unnormalised output (nq × hd) */
        float S[QT * KT] __attribute__((aligned(64)));   /* scores, then probabilities */
        float m[QT], l[QT];
        load_rows(Qs, q + ((size_t)b * Tq + i0) * s->ldq + (size_t)h * hd, nq, s->ldq, hd,
                  s->scale);
        memset(acc, 0, sizeof(float) * (size_t)nq * hd);
        for (int r = 0; r < nq; r++) m[r] = -INFINITY, l[r] = 0.0f;

        for (int kt = 0; kt < nkt; kt++) {
            const int j0 = kt * KT, nk = Tk - j0 < KT ? Tk - j0 : KT;
            const int32_t *kp = s->k_pos + j0;
            int32_t kmin, kmax;
            pos_range(kp, nk, &kmin, &kmax);
            if (kmin > qmax) continue; /* no query of the tile sees any key of it */
            const float *kb = k + ((size_t)b * Tk + j0) * s->ldk + (size_t)g * hd;
            const float *vb = v + ((size_t)b * Tk + j0) * s->ldv + (size_t)g * hd;
            load_transposed(Kt, kb, nk, s->ldk, hd);
            tile_abt(S, Qs, Kt, nq, hd);
            if (kmax > qmin || nk < KT) apply_mask(S, qp, nq, kp, nk);

            for (int r = 0; r < nq; r++) {
                float *sr = S + r * KT, mx = -INFINITY;
                for (int c = 0; c < KT; c++) mx = sr[c] > mx ? sr[c] : mx;
                if (mx == -INFINITY) { /* nothing visible in this tile: P row is 0 */
                    memset(sr, 0, sizeof(float) * KT);
                    continue;
                }
                const float mnew = mx > m[r] ? mx : m[r];
                const float alpha = pt_cpu_expf(m[r] - mnew); /* 0 while m was −∞ */
                float sum = 0.0f;
                for (int c = 0; c < KT; c++) {
                    sr[c] = pt_cpu_expf(sr[c] - mnew);
                    sum += sr[c];
                }
                l[r] = l[r] * alpha + sum;
                m[r] = mnew;
                if (alpha != 1.0f)
                    for (int d = 0; d < hd; d++) acc[r * hd + d] *= alpha;
            }
            tile_pb(acc, S, KT, vb, s->ldv, nq, nk, hd);
        }

        for (int r = 0; r < nq; r++) {
            float *o = out + ((size_t)b * Tq + i0 + r) * s->ldo + (size_t)h * hd;
            float *ls = lse + ((size_t)b * H + h) * Tq + i0 + r;
            if (l[r] == 0.0f) { /* no visible key */
                memset(o, 0, sizeof(float) * hd);
                *ls = -INFINITY;
                continue;
            }
            const float inv = 1.0f / l[r];
            for (int d = 0; d < hd; d++) o[d] = acc[r * hd + d] * inv;
            *ls = m[r] + logf(l[r]);
        }
    }
}

/* The per-(query tile, key tile) part of the backward pass, shared by both passes.
 * In: Qs (nq × hd) = q·scale, dO (nq × hd), D (nq), L (nq) = lse, Kt, Vt (hd × KT).
 * Out: P (nq × KT) = exp(S − lse) on visible keys, else 0; dS (nq × KT) = P∘(dO·vᵀ − D). */
static void tile_backward(float *restrict P, float *restrict dS, const float *Qs, const float *dO,
                          const float *D, const float *L, const float *Kt, const float *Vt,
                          const int32_t *qp, int nq, const int32_t *kp, int nk, int masked,
                          int hd) {
    tile_abt(P, Qs, Kt, nq, hd);
    if (masked) apply_mask(P, qp, nq, kp, nk);
    tile_abt(dS, dO, Vt, nq, hd);
    for (int r = 0; r < nq; r++) {
        float *p = P + r * KT, *ds = dS + r * KT;
        const float lr = L[r], dr = D[r];
        if (lr == -INFINITY) { /* the row saw no key in any block: no gradient */
            memset(p, 0, sizeof(float) * KT);
            memset(ds, 0, sizeof(float) * KT);
            continue;
        }
        for (int c = 0; c < KT; c++) {
            p[c] = pt_cpu_expf(p[c] - lr);
            ds[c] = p[c] * (ds[c] - dr);
        }
    }
}

/* Loads the query-side inputs of one query tile of head h: Qs = q·scale, dO, D, L. */
static void load_query_side(const pt_attn_shape *s, const float *q, const float *out,
                            const float *dout, const float *lse, int b, int h, int i0, int nq,
                            float *Qs, float *dO, float *D, float *L) {
    const int hd = s->head_dim;
    const size_t row = (size_t)b * s->Tq + i0, col = (size_t)h * hd;
    load_rows(Qs, q + row * s->ldq + col, nq, s->ldq, hd, s->scale);
    load_rows(dO, dout + row * s->ldo + col, nq, s->ldo, hd, 1.0f);
    for (int r = 0; r < nq; r++) {
        const float *o = out + (row + r) * s->ldo + col;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (int d = 0; d < hd; d++) acc += (double)dO[r * hd + d] * o[d];
        D[r] = (float)acc;
        L[r] = lse[((size_t)b * s->n_heads + h) * s->Tq + i0 + r];
    }
}

/* dq, dk, dv += gradients of this key/value block (same layouts as q, k, v). */
void pt_cpu_attention_backward(pt_backend *be, const pt_attn_shape *s, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *dout, const float *lse, float *dq, float *dk,
                               float *dv) {
    (void)be;
    check_shape(s);
    const int B = s->B, Tq = s->Tq, Tk = s->Tk, H = s->n_heads, Hkv = s->n_kv_heads;
    const int hd = s->head_dim, rep = H / Hkv;
    const int nqt = (Tq + QT - 1) / QT, nkt = (Tk + KT - 1) / KT;

    /* Pass 1: one task per (b, kv head, key tile) owns those rows of dk and dv. */
    const int64_t ntask_kv = (int64_t)B * Hkv * nkt;
#pragma omp parallel for schedule(dynamic, 1) if (ntask_kv > 1)
    for (int64_t task = 0; task < ntask_kv; task++) {
        const int kt = (int)(task % nkt), g = (int)(task / nkt % Hkv), b = (int)(task / nkt / Hkv);
        const int j0 = kt * KT, nk = Tk - j0 < KT ? Tk - j0 : KT;
        const int32_t *kp = s->k_pos + j0;
        int32_t kmin, kmax;
        pos_range(kp, nk, &kmin, &kmax);

        float Kt[hd * KT] __attribute__((aligned(64))), Vt[hd * KT] __attribute__((aligned(64)));
        float dK[KT * hd] __attribute__((aligned(64))), dV[KT * hd] __attribute__((aligned(64)));
        float Qs[QT * hd] __attribute__((aligned(64))), dO[QT * hd] __attribute__((aligned(64)));
        float P[QT * KT] __attribute__((aligned(64))), dS[QT * KT] __attribute__((aligned(64)));
        float D[QT], L[QT];
        const float *kb = k + ((size_t)b * Tk + j0) * s->ldk + (size_t)g * hd;
        const float *vb = v + ((size_t)b * Tk + j0) * s->ldv + (size_t)g * hd;
        load_transposed(Kt, kb, nk, s->ldk, hd);
        load_transposed(Vt, vb, nk, s->ldv, hd);
        memset(dK, 0, sizeof(float) * (size_t)nk * hd);
        memset(dV, 0, sizeof(float) * (size_t)nk * hd);

        for (int h = g * rep; h < (g + 1) * rep; h++) {
            for (int qt = 0; qt < nqt; qt++) {
                const int i0 = qt * QT, nq = Tq - i0 < QT ? Tq - i0 : QT;
                const int32_t *qp = s->q_pos + i0;
                int32_t qmin, qmax;
                pos_range(qp, nq, &qmin, &qmax);
                if (kmin > qmax) continue;
                load_query_side(s, q, out, dout, lse, b, h, i0, nq, Qs, dO, D, L);
                tile_backward(P, dS, Qs, dO, D, L, Kt, Vt, qp, nq, kp, nk,
                              kmax > qmin || nk < KT, hd);
                tile_ptb(dV, P, dO, nq, nk, hd);
                tile_ptb(dK, dS, Qs, nq, nk, hd); /* dS·(q·scale): the scale of dk */
            }
        }
        for (int c = 0; c < nk; c++) {
            float *dkr = dk + ((size_t)b * Tk + j0 + c) * s->ldk + (size_t)g * hd;
            float *dvr = dv + ((size_t)b * Tk + j0 + c) * s->ldv + (size_t)g * hd;
            for (int d = 0; d < hd; d++) {
                dkr[d] += dK[c * hd + d];
                dvr[d] += dV[c * hd + d];
            }
        }
    }

    /* Pass 2: one task per (b, head, query tile) owns those rows of dq. */
    const int64_t ntask_q = (int64_t)B * H * nqt;
#pragma omp parallel for schedule(dynamic, 1) if (ntask_q > 1)
    for (int64_t task = 0; task < ntask_q; task++) {
        const int qt = (int)(task % nqt), h = (int)(task / nqt % H), b = (int)(task / nqt / H);
        const int g = h / rep, i0 = qt * QT, nq = Tq - i0 < QT ? Tq - i0 : QT;
        const int32_t *qp = s->q_pos + i0;
        int32_t qmin, qmax;
        pos_range(qp, nq, &qmin, &qmax);

        float Kt[hd * KT] __attribute__((aligned(64))), Vt[hd * KT] __attribute__((aligned(64)));
        float Qs[QT * hd] __attribute__((aligned(64))), dO[QT * hd] __attribute__((aligned(64)));
        float dQ[QT * hd] __attribute__((aligned(64)));
        float P[QT * KT] __attribute__((aligned(64))), dS[QT * KT] __attribute__((aligned(64)));
        float D[QT], L[QT];
        load_query_side(s, q, out, dout, lse, b, h, i0, nq, Qs, dO, D, L);
        memset(dQ, 0, sizeof(float) * (size_t)nq * hd);

        for (int kt = 0; kt < nkt; kt++) {
            const int j0 = kt * KT, nk = Tk - j0 < KT ? Tk - j0 : KT;
            const int32_t *kp = s->k_pos + j0;
            int32_t kmin, kmax;
            pos_range(kp, nk, &kmin, &kmax);
            if (kmin > qmax) continue;
            const float *kb = k + ((size_t)b * Tk + j0) * s->ldk + (size_t)g * hd;
            const float *vb = v + ((size_t)b * Tk + j0) * s->ldv + (size_t)g * hd;
            load_transposed(Kt, kb, nk, s->ldk, hd);
            load_transposed(Vt, vb, nk, s->ldv, hd);
            tile_backward(P, dS, Qs, dO, D, L, Kt, Vt, qp, nq, kp, nk, kmax > qmin || nk < KT, hd);
            tile_pb(dQ, dS, KT, kb, s->ldk, nq, nk, hd);
        }
        for (int r = 0; r < nq; r++) {
            float *dqr = dq + ((size_t)b * Tq + i0 + r) * s->ldq + (size_t)h * hd;
            for (int d = 0; d < hd; d++) dqr[d] += dQ[r * hd + d] * s->scale;
        }
    }
}
