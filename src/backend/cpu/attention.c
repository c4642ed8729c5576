/* attention.c: causal (by position) grouped-query attention on the CPU, FlashAttention-2 style.
 *
 * Queries are cut into tiles of QT rows and keys into tiles of KT rows. The forward pass keeps,
 * per query row, a running maximum m, a running sum l and an unnormalised output, and folds in one
 * key tile at a time (online softmax), so no Tq×Tk matrix ever exists: memory beyond the inputs is
 * a few tiles of scratch per thread, on the stack. A key tile whose smallest position is beyond
 * the largest query position of the query tile is skipped, which halves causal work and lets
 * context parallelism skip the blocks it cannot see; a key tile entirely at or before the query
 * tile needs no mask. With documents (q_lo) a key tile entirely before the start of every query's
 * document is skipped too, and one reaching before some query's start is masked.
 *
 * The backward pass recomputes P = exp(S − lse) tile by tile and, with D = rowsum(dout∘out),
 * dS = P∘(dP − D). It runs as two passes so that every output element is written by one task in a
 * fixed order (race-free, and bitwise the same whatever the thread count): the first owns a key
 * tile of one kv head and accumulates dK and dV over the query tiles of every query head sharing
 * it; the second owns a query tile of one head and accumulates dQ over the key tiles. The price is
 * computing S and dP twice (7 tile products instead of 5), for parallelism that does not depend
 * on B·n_kv_heads being large.
 *
 * Where a task owns a query tile (forward, dQ), scores are kept transposed, Sᵀ (KT × QT) =
 * K·(Q·scale)ᵀ: the query tile is transposed once per task, keys are read in place, and the
 * per-query softmax statistics become vector operations across QT. Where a task owns a key tile
 * (dK, dV), S (QT × KT) = Q·Kᵀ with Kᵀ transposed once per task.
 *
 * With p_bf16 (include/pt/backend.h) the probabilities multiplying v are bf16(exp(S − lse)), the
 * normalised ones, which the online softmax never holds: the forward makes a first pass over the
 * key tiles for m and l, then a second computing S again, P rounded and P·V. The backward's dV
 * takes the same rounded P (its scores computed with the forward's products in the forward's
 * order, so bit for bit the forward's), dS the unrounded one. Ring attention runs the two passes
 * as separate calls over its key blocks (lse_only, then lse_in with the merged lse); the second
 * starts its accumulator from out, so that the blocks' sums chain as one call's would.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/ops.h"

#define QT 32 /* query rows per tile */
#define KT 64 /* key rows per tile */
/* head_dim bound, only to keep the per-thread scratch on the stack small (about 200 KB at 256) */
#define MAX_HD PT_ATTN_MAX_HEAD_DIM

/* ---------------------------------------------------------------------------------------------
 * Tile products. All have the form C (M × N) += A (M × K) · B (K × N) with B's rows contiguous
 * (stride ldb) and A read through strides (ars, acs), so a transposed A costs nothing. The kernel
 * keeps an R × (NV·VL) block of C in vectors of VL floats (GCC vector extensions: plain C, with VL
 * set by the widest registers the build targets) and loads each B vector once per R rows;
 * columns left over past the last multiple of VL go through a scalar loop. */

#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX__)
#define VL 8
#else
#define VL 4
#endif
typedef float vf __attribute__((vector_size(VL * sizeof(float))));

static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void vstore(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* C[0..R)[0..NV·VL) += A[0..R)[0..K) · B[0..K)[0..NV·VL); R ≤ 8 and NV ≤ 4 are constants at the
 * (inlined) call, so the accumulators can live in registers. */
static inline __attribute__((always_inline)) void mm_block(float *C, int ldc, const float *A,
                                                           int ars, int acs, const float *B,
                                                           int ldb, int K, int R, int NV) {
    vf acc[8][4];
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = vload(C + (size_t)r * ldc + v * VL);
    for (int kk = 0; kk < K; kk++) {
        vf b[4];
        for (int v = 0; v < NV; v++) b[v] = vload(B + (size_t)kk * ldb + v * VL);
        for (int r = 0; r < R; r++) {
            const float a = A[(size_t)r * ars + (size_t)kk * acs];
            for (int v = 0; v < NV; v++) acc[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < R; r++)
        for (int v = 0; v < NV; v++) vstore(C + (size_t)r * ldc + v * VL, acc[r][v]);
}

/* One column strip of width NV·VL over all M rows: blocks of R rows, then single rows. */
#define MM_STRIP(R, NV)                                                                          \
    do {                                                                                         \
        int r = 0;                                                                               \
        for (; r + (R) <= M; r += (R))                                                           \
            mm_block(C + (size_t)r * ldc + n0, ldc, A + (size_t)r * ars, ars, acs, B + n0, ldb, \
                     K, R, NV);                                                                  \
        for (; r < M; r++)                                                                       \
            mm_block(C + (size_t)r * ldc + n0, ldc, A + (size_t)r * ars, ars, acs, B + n0, ldb, \
                     K, 1, NV);                                                                  \
    } while (0)

static void mm_acc(float *C, int ldc, const float *A, int ars, int acs, const float *B, int ldb,
                   int M, int K, int N) {
    int n0 = 0;
    for (; n0 + 4 * VL <= N; n0 += 4 * VL) MM_STRIP(4, 4);
    for (; n0 + 2 * VL <= N; n0 += 2 * VL) MM_STRIP(8, 2);
    for (; n0 + VL <= N; n0 += VL) MM_STRIP(8, 1);
    if (n0 < N)
        for (int r = 0; r < M; r++)
            for (int kk = 0; kk < K; kk++) {
                const float a = A[(size_t)r * ars + (size_t)kk * acs];
                const float *b = B + (size_t)kk * ldb;
                float *c = C + (size_t)r * ldc;
                for (int n = n0; n < N; n++) c[n] += a * b[n];
            }
}

/* ---------------------------------------------------------------------------------------------
 * Helpers */

/* dst (hd × W) = scale · src (n rows of hd at stride ld)ᵀ, columns n..W zero. */
static void load_transposed(float *restrict dst, int W, const float *src, int n, int ld, int hd,
                            float scale) {
    if (n < W)
        for (int d = 0; d < hd; d++) memset(dst + d * W + n, 0, (size_t)(W - n) * sizeof(float));
    for (int c = 0; c < n; c++)
        for (int d = 0; d < hd; d++) dst[d * W + c] = src[(size_t)c * ld + d] * scale;
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

/* Whether key position k is hidden from query r: after it, or (documents, lo not NULL) before
 * the start of its document. */
static inline int hidden(int32_t k, const int32_t *qp, const int32_t *lo, int r) {
    return k > qp[r] || (lo && k < lo[r]);
}

/* St (KT × QT): −∞ where key c cannot be seen by query r, or is padding (c >= nk). */
static void mask_t(float *St, const int32_t *qp, const int32_t *lo, int nq, const int32_t *kp,
                   int nk) {
    for (int c = 0; c < nk; c++)
        for (int r = 0; r < nq; r++)
            if (hidden(kp[c], qp, lo, r)) St[c * QT + r] = -INFINITY;
    for (int c = nk; c < KT; c++)
        for (int r = 0; r < QT; r++) St[c * QT + r] = -INFINITY;
}

/* S (QT × KT): the same in the untransposed layout (rows r >= nq are not used). */
static void mask_n(float *S, const int32_t *qp, const int32_t *lo, int nq, const int32_t *kp,
                   int nk) {
    for (int r = 0; r < nq; r++) {
        for (int c = 0; c < nk; c++)
            if (hidden(kp[c], qp, lo, r)) S[r * KT + c] = -INFINITY;
        for (int c = nk; c < KT; c++) S[r * KT + c] = -INFINITY;
    }
}

/* D (nq) = rowsum(dout∘out) for one query tile of one head, accumulated in double. */
static void rows_dot(float *D, const float *dout, const float *out, int ldo, int nq, int hd) {
    for (int r = 0; r < nq; r++) {
        const float *a = dout + (size_t)r * ldo, *b = out + (size_t)r * ldo;
        double acc = 0.0;
#pragma omp simd reduction(+ : acc)
        for (int d = 0; d < hd; d++) acc += (double)a[d] * b[d];
        D[r] = (float)acc;
    }
}

static void check_shape(const pt_attn_shape *s) {
    PT_ASSERT(s->B > 0 && s->Tq > 0 && s->Tk > 0);
    PT_ASSERT(s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0);
    PT_ASSERT(s->head_dim > 0 && s->head_dim <= MAX_HD);
    PT_ASSERT(s->q_pos && s->k_pos);
}

/* ---------------------------------------------------------------------------------------------
 * Tiles of a task that owns a query tile (forward, dQ) */

typedef struct {
    int b, h, g, i0, nq; /* sequence, query head, its kv head, first row, rows */
    const int32_t *qp;
    int32_t qmin, qmax;
    const int32_t *lo;   /* documents: the rows' first visible positions (NULL: none) */
    int32_t lomin, lomax;
} q_tile;

typedef struct {
    int nk;
    const int32_t *kp;
    int32_t kmin, kmax;
    const float *k, *v; /* the tile's first row, at kv head g */
} k_tile;

/* Documents: the first visible positions of rows [i0, i0 + nq) of sequence b and their range;
 * NULL (range INT32_MIN) without documents. */
static const int32_t *doc_lo(const pt_attn_shape *s, int b, int i0, int nq, int32_t *lomin,
                             int32_t *lomax) {
    *lomin = *lomax = INT32_MIN;
    if (!s->q_lo) return NULL;
    const int32_t *lo = s->q_lo + (size_t)b * s->Tq + i0;
    pos_range(lo, nq, lomin, lomax);
    return lo;
}

static q_tile q_tile_of(const pt_attn_shape *s, int64_t task, int nqt) {
    q_tile t;
    t.b = (int)(task / nqt / s->n_heads), t.h = (int)(task / nqt % s->n_heads);
    t.g = t.h / (s->n_heads / s->n_kv_heads), t.i0 = (int)(task % nqt) * QT;
    t.nq = s->Tq - t.i0 < QT ? s->Tq - t.i0 : QT;
    t.qp = s->q_pos + t.i0;
    pos_range(t.qp, t.nq, &t.qmin, &t.qmax);
    t.lo = doc_lo(s, t.b, t.i0, t.nq, &t.lomin, &t.lomax);
    return t;
}

/* Key tile kt for query tile t; 0 when no query of t sees any of its keys (the tile is skipped). */
static int k_tile_of(const pt_attn_shape *s, const q_tile *t, int kt, const float *k,
                     const float *v, k_tile *u) {
    const int j0 = kt * KT;
    u->nk = s->Tk - j0 < KT ? s->Tk - j0 : KT;
    u->kp = s->k_pos + j0;
    pos_range(u->kp, u->nk, &u->kmin, &u->kmax);
    if (u->kmin > t->qmax || u->kmax < t->lomin) return 0;
    u->k = k + ((size_t)t->b * s->Tk + j0) * s->ldk + (size_t)t->g * s->head_dim;
    u->v = v + ((size_t)t->b * s->Tk + j0) * s->ldv + (size_t)t->g * s->head_dim;
    return 1;
}

/* St (KT × QT) = k·Qt: the scores (Qt is (q·scale)ᵀ), −∞ where masked or padding. */
static void scores_t(float *St, const pt_attn_shape *s, const q_tile *t, const k_tile *u,
                     const float *Qt) {
    memset(St, 0, sizeof(float) * KT * QT);
    mm_acc(St, QT, u->k, s->ldk, 1, Qt, QT, u->nk, s->head_dim, QT);
    if (u->kmax > t->qmin || u->kmin < t->lomax || u->nk < KT)
        mask_t(St, t->qp, t->lo, t->nq, u->kp, u->nk);
}

/* x rounded to bf16 (nearest even), as a float */
static inline float bf16_value(float x) { return pt_bf16_to_float(pt_bf16_round(x)); }

/* Pᵀ = bf16(exp(Sᵀ − L)) in place, L per query (+∞ for a row that sees nothing: P = 0). */
static void probs_bf16_t(float *St, const float *L) {
    for (int c = 0; c < KT; c++)
        for (int r = 0; r < QT; r++)
            St[c * QT + r] = bf16_value(pt_cpu_expf(St[c * QT + r] - L[r]));
}

/* ---------------------------------------------------------------------------------------------
 * Forward */

/* One key tile folded into the online softmax of the query tile, vectorised across the QT
 * queries: m (running max) and l (running sum, rows < nq) updated, alpha = e^(m_old − m_new) the
 * factor for what was accumulated before, and Sᵀ replaced by Pᵀ = exp(Sᵀ − m_new). */
static void online_softmax(float *St, float *m, float *l, float *alpha, int nq) {
    float mx[QT], sum[QT], msub[QT];
    for (int r = 0; r < QT; r++) mx[r] = -INFINITY, sum[r] = 0.0f;
    for (int c = 0; c < KT; c++)
        for (int r = 0; r < QT; r++) {
            const float x = St[c * QT + r];
            mx[r] = x > mx[r] ? x : mx[r];
        }
    for (int r = 0; r < QT; r++) {
        const float mnew = mx[r] > m[r] ? mx[r] : m[r];
        /* a row that has seen nothing yet keeps m = −∞; subtracting 0 then keeps
         * exp(−∞) = 0 instead of exp(−∞ + ∞) = NaN */
        msub[r] = mnew == -INFINITY ? 0.0f : mnew;
        alpha[r] = pt_cpu_expf(m[r] - msub[r]);
        m[r] = mnew;
    }
    for (int c = 0; c < KT; c++)
        for (int r = 0; r < QT; r++) {
            const float p = pt_cpu_expf(St[c * QT + r] - msub[r]);
            St[c * QT + r] = p;
            sum[r] += p;
        }
    for (int r = 0; r < nq; r++) l[r] = l[r] * alpha[r] + sum[r];
}

/* fp32: acc (nq × hd) = Σ over key tiles of P·v with the online rescaling; m and l as above.
 * acc NULL: m and l only (p_bf16's first pass: the lse, no P·V). */
static void forward_fp32(const pt_attn_shape *s, const q_tile *t, const float *Qt, const float *k,
                         const float *v, float *acc, float *m, float *l) {
    const int hd = s->head_dim, nkt = (s->Tk + KT - 1) / KT;
    float St[KT * QT] __attribute__((aligned(64))); /* scores, then probabilities, ᵀ */
    float alpha[QT];
    k_tile u;
    for (int kt = 0; kt < nkt; kt++) {
        if (!k_tile_of(s, t, kt, k, v, &u)) continue;
        scores_t(St, s, t, &u, Qt);
        online_softmax(St, m, l, alpha, t->nq);
        if (!acc) continue;
        for (int r = 0; r < t->nq; r++)
            if (alpha[r] != 1.0f)
                for (int d = 0; d < hd; d++) acc[r * hd + d] *= alpha[r];
        /* acc (nq × hd) += P (nq × nk) · v, P read from Pᵀ */
        mm_acc(acc, hd, St, 1, QT, u.v, s->ldv, t->nq, u.nk, hd);
    }
}

/* p_bf16, the first pass: m and l over the visible keys (so lse), no P·V. */
static void softmax_stats(const pt_attn_shape *s, const q_tile *t, const float *Qt,
                          const float *k, const float *v, float *m, float *l) {
    forward_fp32(s, t, Qt, k, v, NULL, m, l);
}

/* p_bf16, the second pass: acc (nq × hd) += Σ bf16(exp(s − L))·v over the visible keys, one key
 * after another, L per query (+∞ for a row that sees nothing: P = 0). */
static void probs_bf16_v(const pt_attn_shape *s, const q_tile *t, const float *Qt, const float *k,
                         const float *v, const float *L, float *acc) {
    const int hd = s->head_dim, nkt = (s->Tk + KT - 1) / KT;
    float St[KT * QT] __attribute__((aligned(64)));
    k_tile u;
    for (int kt = 0; kt < nkt; kt++) {
        if (!k_tile_of(s, t, kt, k, v, &u)) continue;
        scores_t(St, s, t, &u, Qt);
        probs_bf16_t(St, L);
        mm_acc(acc, hd, St, 1, QT, u.v, s->ldv, t->nq, u.nk, hd);
    }
}

/* p_bf16: the first pass for m and l (so lse), then (unless lse_only) acc = Σ bf16(exp(s −
 * lse))·v: the rounded probabilities are the normalised ones, which no running maximum could
 * give. */
static void forward_bf16(const pt_attn_shape *s, const q_tile *t, const float *Qt, const float *k,
                         const float *v, float *acc, float *m, float *l) {
    float L[QT];
    softmax_stats(s, t, Qt, k, v, m, l);
    if (s->lse_only) return;
    for (int r = 0; r < QT; r++) /* the lse written out below; +∞ for rows without a key */
        L[r] = r < t->nq && l[r] != 0.0f ? m[r] + logf(l[r]) : INFINITY;
    probs_bf16_v(s, t, Qt, k, v, L, acc);
}

/* lse_in: out += Σ bf16(exp(s − lse_in))·v, the accumulator starting from out's rows; rows with
 * lse_in = −∞ are not written. */
static void forward_lse_in(const pt_attn_shape *s, const q_tile *t, const float *Qt,
                           const float *k, const float *v, float *acc, float *out) {
    const int hd = s->head_dim;
    const float *li = s->lse_in + ((size_t)t->b * s->n_heads + t->h) * s->Tq + t->i0;
    float L[QT];
    for (int r = 0; r < QT; r++)
        L[r] = r < t->nq && li[r] != -INFINITY ? li[r] : INFINITY;
    float *o = out + ((size_t)t->b * s->Tq + t->i0) * s->ldo + (size_t)t->h * hd;
    for (int r = 0; r < t->nq; r++)
        memcpy(acc + r * hd, o + (size_t)r * s->ldo, sizeof(float) * hd);
    probs_bf16_v(s, t, Qt, k, v, L, acc);
    for (int r = 0; r < t->nq; r++)
        if (L[r] != INFINITY) memcpy(o + (size_t)r * s->ldo, acc + r * hd, sizeof(float) * hd);
}

/* q (B,Tq,H·hd at ldq), k, v (B,Tk,Hkv·hd at ldk, ldv) -> out (B,Tq,H·hd at ldo), lse (B,H,Tq) */
void pt_cpu_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                              const float *k, const float *v, float *out, float *lse) {
    (void)be;
    check_shape(s);
    PT_ASSERTF(s->p_bf16 || (!s->lse_only && !s->lse_in), "lse_only and lse_in need p_bf16");
    PT_ASSERTF(!(s->lse_only && s->lse_in), "lse_only and lse_in are two separate passes");
    const int Tq = s->Tq, H = s->n_heads, hd = s->head_dim, nqt = (Tq + QT - 1) / QT;
    const int64_t ntask = (int64_t)s->B * H * nqt;

    /* dynamic: causal tiles late in the sequence have more keys; the result does not depend on
     * which thread runs a task */
#pragma omp parallel for schedule(dynamic, 1) if (ntask > 1)
    for (int64_t task = 0; task < ntask; task++) {
        const q_tile t = q_tile_of(s, task, nqt);
        float Qt[hd * QT] __attribute__((aligned(64)));  /* (q·scale)ᵀ (hd × QT) */
        float acc[QT * hd] __attribute__((aligned(64))); /* output (nq × hd), unnormalised */
        float m[QT], l[QT];
        load_transposed(Qt, QT, q + ((size_t)t.b * Tq + t.i0) * s->ldq + (size_t)t.h * hd, t.nq,
                        s->ldq, hd, s->scale);
        if (s->lse_in) { /* the second pass alone: neither m, l nor lse */
            forward_lse_in(s, &t, Qt, k, v, acc, out);
            continue;
        }
        memset(acc, 0, sizeof(float) * (size_t)t.nq * hd);
        for (int r = 0; r < QT; r++) m[r] = -INFINITY, l[r] = 0.0f;
        if (s->p_bf16)
            forward_bf16(s, &t, Qt, k, v, acc, m, l);
        else
            forward_fp32(s, &t, Qt, k, v, acc, m, l);

        for (int r = 0; r < t.nq; r++) {
            float *ls = lse + ((size_t)t.b * H + t.h) * Tq + t.i0 + r;
            *ls = l[r] == 0.0f ? -INFINITY : m[r] + logf(l[r]); /* −∞: no visible key */
            if (s->lse_only) continue;
            float *o = out + ((size_t)t.b * Tq + t.i0 + r) * s->ldo + (size_t)t.h * hd;
            if (l[r] == 0.0f) {
                memset(o, 0, sizeof(float) * hd);
                continue;
            }
            const float inv = s->p_bf16 ? 1.0f : 1.0f / l[r]; /* p_bf16: normalised already */
            for (int d = 0; d < hd; d++) o[d] = acc[r * hd + d] * inv;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Backward */

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
    const float scale = s->scale;

    /* Pass 1: one task per (b, kv head, key tile) owns those rows of dk and dv.
     * S (QT × KT) = q·kᵀ, P = exp(S·scale − lse), dP = dout·vᵀ, dS = P∘(dP − D);
     * dV += Pᵀ·dout, dK += dSᵀ·q (times scale at the end). With p_bf16, S = (q·scale)·kᵀ, the
     * forward's products in the forward's order, so that P is bitwise the forward's, and dV takes
     * P rounded to bf16 (dS the unrounded P). */
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
        float P[QT * KT] __attribute__((aligned(64))), dS[QT * KT] __attribute__((aligned(64)));
        float Qs[s->p_bf16 ? QT * hd : 1] __attribute__((aligned(64))); /* q·scale (nq × hd) */
        float D[QT];
        const float *kb = k + ((size_t)b * Tk + j0) * s->ldk + (size_t)g * hd;
        const float *vb = v + ((size_t)b * Tk + j0) * s->ldv + (size_t)g * hd;
        load_transposed(Kt, KT, kb, nk, s->ldk, hd, 1.0f);
        load_transposed(Vt, KT, vb, nk, s->ldv, hd, 1.0f);
        memset(dK, 0, sizeof(float) * (size_t)nk * hd);
        memset(dV, 0, sizeof(float) * (size_t)nk * hd);

        for (int h = g * rep; h < (g + 1) * rep; h++) {
            for (int qt = 0; qt < nqt; qt++) {
                const int i0 = qt * QT, nq = Tq - i0 < QT ? Tq - i0 : QT;
                const int32_t *qp = s->q_pos + i0;
                int32_t qmin, qmax, lomin, lomax;
                pos_range(qp, nq, &qmin, &qmax);
                const int32_t *lo = doc_lo(s, b, i0, nq, &lomin, &lomax);
                if (kmin > qmax || kmax < lomin) continue;
                const size_t row = (size_t)b * Tq + i0, col = (size_t)h * hd;
                const float *qb = q + row * s->ldq + col, *ob = out + row * s->ldo + col;
                const float *dob = dout + row * s->ldo + col;
                const float *L = lse + ((size_t)b * H + h) * Tq + i0;
                rows_dot(D, dob, ob, s->ldo, nq, hd);

                const float *qs = qb;
                int ldqs = s->ldq;
                float sc = scale;
                if (s->p_bf16) {
                    for (int r = 0; r < nq; r++)
                        for (int d = 0; d < hd; d++)
                            Qs[r * hd + d] = qb[(size_t)r * s->ldq + d] * scale;
                    qs = Qs, ldqs = hd, sc = 1.0f;
                }
                memset(P, 0, sizeof(float) * (size_t)nq * KT);
                memset(dS, 0, sizeof(float) * (size_t)nq * KT);
                mm_acc(P, KT, qs, ldqs, 1, Kt, KT, nq, hd, KT);
                if (kmax > qmin || kmin < lomax || nk < KT) mask_n(P, qp, lo, nq, kp, nk);
                mm_acc(dS, KT, dob, s->ldo, 1, Vt, KT, nq, hd, KT);
                for (int r = 0; r < nq; r++) {
                    float *p = P + r * KT, *ds = dS + r * KT;
                    /* a row that saw no key anywhere has no gradient; exp(x + ∞) would be ∞ */
                    const float lr = L[r] == -INFINITY ? INFINITY : L[r], dr = D[r];
                    for (int c = 0; c < KT; c++) {
                        p[c] = pt_cpu_expf(p[c] * sc - lr);
                        ds[c] = p[c] * (ds[c] - dr);
                    }
                }
                if (s->p_bf16)
                    for (int i = 0; i < nq * KT; i++) P[i] = bf16_value(P[i]);
                mm_acc(dV, hd, P, 1, KT, dob, s->ldo, nk, nq, hd);
                mm_acc(dK, hd, dS, 1, KT, qb, s->ldq, nk, nq, hd);
            }
        }
        for (int c = 0; c < nk; c++) {
            float *dkr = dk + ((size_t)b * Tk + j0 + c) * s->ldk + (size_t)g * hd;
            float *dvr = dv + ((size_t)b * Tk + j0 + c) * s->ldv + (size_t)g * hd;
            for (int d = 0; d < hd; d++) {
                dkr[d] += dK[c * hd + d] * scale;
                dvr[d] += dV[c * hd + d];
            }
        }
    }

    /* Pass 2: one task per (b, head, query tile) owns those rows of dq.
     * Sᵀ (KT × QT) = k·(q·scale)ᵀ, dPᵀ = v·doutᵀ, Pᵀ and dSᵀ as above; dQ += dS·k. */
    const int64_t ntask_q = (int64_t)B * H * nqt;
#pragma omp parallel for schedule(dynamic, 1) if (ntask_q > 1)
    for (int64_t task = 0; task < ntask_q; task++) {
        const q_tile t = q_tile_of(s, task, nqt);
        const int nq = t.nq;
        const size_t row = (size_t)t.b * Tq + t.i0, col = (size_t)t.h * hd;

        float Qt[hd * QT] __attribute__((aligned(64))), dOt[hd * QT] __attribute__((aligned(64)));
        float dQ[QT * hd] __attribute__((aligned(64)));
        float St[KT * QT] __attribute__((aligned(64))), dSt[KT * QT] __attribute__((aligned(64)));
        float D[QT], L[QT];
        load_transposed(Qt, QT, q + row * s->ldq + col, nq, s->ldq, hd, scale);
        load_transposed(dOt, QT, dout + row * s->ldo + col, nq, s->ldo, hd, 1.0f);
        rows_dot(D, dout + row * s->ldo + col, out + row * s->ldo + col, s->ldo, nq, hd);
        for (int r = 0; r < QT; r++) {
            /* padding rows and rows that saw no key: P = exp(x − ∞) = 0 */
            const float lr = r < nq ? lse[((size_t)t.b * H + t.h) * Tq + t.i0 + r] : -INFINITY;
            L[r] = lr == -INFINITY ? INFINITY : lr;
            if (r >= nq) D[r] = 0.0f;
        }
        memset(dQ, 0, sizeof(float) * (size_t)nq * hd);

        k_tile u;
        for (int kt = 0; kt < nkt; kt++) {
            if (!k_tile_of(s, &t, kt, k, v, &u)) continue;
            scores_t(St, s, &t, &u, Qt);
            memset(dSt, 0, sizeof dSt);
            mm_acc(dSt, QT, u.v, s->ldv, 1, dOt, QT, u.nk, hd, QT);
            for (int c = 0; c < u.nk; c++)
                for (int r = 0; r < QT; r++) {
                    const float p = pt_cpu_expf(St[c * QT + r] - L[r]);
                    dSt[c * QT + r] = p * (dSt[c * QT + r] - D[r]);
                }
            /* dQ (nq × hd) += dS (nq × nk) · k, dS read from dSᵀ */
            mm_acc(dQ, hd, dSt, 1, QT, u.k, s->ldk, nq, u.nk, hd);
        }
        for (int r = 0; r < nq; r++) {
            float *dqr = dq + (row + r) * s->ldq + col;
            for (int d = 0; d < hd; d++) dqr[d] += dQ[r * hd + d] * scale;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Ring attention: merging the blocks' results */

void pt_cpu_attention_merge(pt_backend *be, float *out, float *lse, const float *ob,
                            const float *lb, int B, int T, int H, int hd, int ldo) {
    (void)be;
#pragma omp parallel for schedule(static) if ((int64_t)B * T * H * hd >= 1 << 16)
    for (int64_t bt = 0; bt < (int64_t)B * T; bt++) {
        int b = (int)(bt / T), t = (int)(bt % T);
        for (int h = 0; h < H; h++) {
            float *la = &lse[((size_t)b * H + h) * T + t];
            float l2 = lb[((size_t)b * H + h) * T + t];
            if (l2 == -INFINITY) continue;
            float *o = out + (size_t)bt * ldo + (size_t)h * hd;
            const float *o2 = ob + (size_t)bt * ldo + (size_t)h * hd;
            float l1 = *la, mx = l1 > l2 ? l1 : l2;
            /* in double: the weights of two close log-sum-exps */
            double e1 = l1 == -INFINITY ? 0.0 : exp((double)l1 - mx), e2 = exp((double)l2 - mx);
            double l = mx + log(e1 + e2);
            float w1 = (float)(e1 / (e1 + e2)), w2 = (float)(e2 / (e1 + e2));
            for (int d = 0; d < hd; d++) o[d] = w1 * o[d] + w2 * o2[d];
            *la = (float)l;
        }
    }
}
