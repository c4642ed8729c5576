/* test_cuda_host_attn.c: the CUDA attention kernels' block programs run on the host against the
 * CPU backend's attention (src/backend/cpu/attention.c). No GPU needed: runs on every CI run.
 *
 * The kernels of src/backend/cuda/attention.cu only launch the phase functions of
 * backend/cuda/attn_math.h (PT_HD: plain C here). This test runs those phases for every block of
 * each kernel's grid, thread after thread between the barriers (checking that all threads agree
 * on the next phase, and with shared memory and per-thread state filled with NaN first so that a
 * read of something never written shows), and compares with the CPU backend on random inputs:
 * causal, documents (q_lo), grouped kv heads (1, 2, 4 query heads per kv head), Tq ≠ Tk with the
 * shifted positions of context-parallel chunks (rows that see no key included), p_bf16 0 and 1,
 * the two-pass lse_only / lse_in semantics, head_dim 8, 64, 128, 256, padded row strides, and
 * "+=" gradients on prefilled buffers. Where the CPU build fuses multiply-adds (GCC, FMA: the
 * default -march=native build), the kernels follow its arithmetic exactly and results must be
 * bitwise equal but for the documented deviations (lse: logf within 1 ulp; with p_bf16 the rows
 * whose lse differs); everywhere the norm-wise relative error must be within 1e-6. Also checked:
 * e^x, log, bf16 rounding element by element, and the launch geometry (shared memory, registers'
 * array bounds, grid sizes) over every head_dim and extreme shapes.
 *
 * Compiled without contraction (the pragma below): the host must round each PT_F* operation as
 * the device does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "testutil.h"

/* the CPU backend's e^x as its build compiles it (gnu17: multiply-adds contracted), whatever
 * this file's -ffp-contract */
__attribute__((noinline, optimize("fp-contract=fast"))) static float cpu_expf(float x) {
    return pt_cpu_expf(x);
}

#pragma GCC optimize("fp-contract=off")

#include "backend/cuda/attn_math.h"

/* whether the CPU backend's build contracts a·b + c into fused multiply-adds, which the kernels
 * mirror: then results are compared bit for bit */
#if defined(__GNUC__) && !defined(__clang__) && (defined(__FMA__) || defined(__aarch64__))
#define BITWISE 1
#else
#define BITWISE 0
#endif
#define TOL 1e-6

static pt_backend be; /* zeroed: the CPU kernels need no context */

/* worst errors over the whole run, printed at the end */
static double worst_rel[8];
static const char *worst_name[8] = {"out fp32", "out p_bf16", "lse", "dq", "dk", "dv", "merge",
                                    "two-pass out"};
static long lse_ulp_rows, lse_rows, p16_rows_differing;

/* ---------------------------------------------------------------------------------------------
 * helpers */

static float *fvec(size_t n, uint64_t seed, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    tu_fill(x, n, seed, scale);
    return x;
}
static float *fdup(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}
static void fill_nan(void *p, size_t bytes) {
    uint32_t nan = 0x7fc0dead;
    for (size_t i = 0; i + 4 <= bytes; i += 4) memcpy((char *)p + i, &nan, 4);
}
/* distance in ulps (same sign assumed; ∞ if not) */
static long ulps(float a, float b) {
    if (a == b) return 0;
    if (isnan(a) || isnan(b) || (a < 0) != (b < 0)) return 1L << 40;
    long ia = (long)(tu_f32_bits(a) & 0x7fffffffu), ib = (long)(tu_f32_bits(b) & 0x7fffffffu);
    return ia > ib ? ia - ib : ib - ia;
}
/* elements that differ (+0 = −0, NaN = NaN) */
static size_t n_diff(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && !(isnan(a[i]) && isnan(b[i]))) k++;
    return k;
}
/* ‖a − b‖ / ‖b‖ over the elements that differ (equal infinities count as equal) */
static double rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(b[i])) den += (double)b[i] * b[i];
        if (a[i] == b[i] || (isnan(a[i]) && isnan(b[i]))) continue;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static void check(int which, const char *what, const float *got, const float *ref, size_t n,
                  int bitwise) {
    const double e = rel_err(got, ref, n);
    if (e > worst_rel[which]) worst_rel[which] = e;
    tu_check_rel(what, e, TOL);
    if (bitwise) {
        const size_t d = n_diff(got, ref, n);
        if (d) fprintf(stderr, "%s: %zu of %zu elements differ\n", what, d, n);
        assert_int_equal(d, 0);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The kernels, run on the host: every block of the grid, its threads one after another between
 * barriers. */

static void emu_forward(const pt_attn_shape *s, const float *q, const float *k, const float *v,
                        float *out, float *lse) {
    const pt_attn_geom G = pt_attn_geom_of(pt_attn_hdc(s->head_dim));
    const size_t bytes = pt_attn_fwd_smem_bytes(G, s->head_dim);
    void *smem = malloc(bytes);
    pt_attn_fwd_thread *ts = malloc(sizeof *ts * PT_ATTN_NT);
    pt_attn_io io = {.q = q, .k = k, .v = v, .o = out, .lse_out = lse};
    const int64_t nb = pt_attn_fwd_blocks(s, G);
    for (int64_t bid = 0; bid < nb; bid++) {
        fill_nan(smem, bytes);
        fill_nan(ts, sizeof *ts * PT_ATTN_NT);
        const pt_attn_fwd_smem sm = pt_attn_fwd_carve(smem, G, s->head_dim);
        const pt_attn_qblock qb = pt_attn_qblock_of(s, G, bid);
        for (int ph = PT_ATTN_F_INIT; ph != PT_ATTN_END;) {
            int next = -1;
            for (int t = 0; t < PT_ATTN_NT; t++) {
                const int n = pt_attn_fwd_step(s, &io, G, &qb, &sm, ph, t, &ts[t]);
                if (t) assert_int_equal(n, next);
                next = n;
            }
            ph = next;
        }
    }
    free(ts);
    free(smem);
}

static void emu_backward(const pt_attn_shape *s, const float *q, const float *k, const float *v,
                         const float *out, const float *dout, const float *lse, float *dq,
                         float *dk, float *dv) {
    const pt_attn_geom G = pt_attn_geom_of(pt_attn_hdc(s->head_dim));
    pt_attn_io io = {.q = q, .k = k, .v = v, .out = out, .dout = dout, .lse = lse,
                     .dq = dq, .dk = dk, .dv = dv};
    /* the launch order of attention.cu: dk/dv, then dq */
    {
        const size_t bytes = pt_attn_dkv_smem_bytes(G, s->head_dim);
        void *smem = malloc(bytes);
        pt_attn_dkv_thread *ts = malloc(sizeof *ts * PT_ATTN_NT);
        const int64_t nb = pt_attn_dkv_blocks(s, G);
        for (int64_t bid = 0; bid < nb; bid++) {
            fill_nan(smem, bytes);
            fill_nan(ts, sizeof *ts * PT_ATTN_NT);
            const pt_attn_dkv_smem sm = pt_attn_dkv_carve(smem, G, s->head_dim);
            const pt_attn_kblock kb = pt_attn_kblock_of(s, G, bid);
            for (int ph = PT_ATTN_K_INIT; ph != PT_ATTN_END;) {
                int next = -1;
                for (int t = 0; t < PT_ATTN_NT; t++) {
                    const int n = pt_attn_dkv_step(s, &io, G, &kb, &sm, ph, t, &ts[t]);
                    if (t) assert_int_equal(n, next);
                    next = n;
                }
                ph = next;
            }
        }
        free(ts);
        free(smem);
    }
    {
        const size_t bytes = pt_attn_dq_smem_bytes(G, s->head_dim);
        void *smem = malloc(bytes);
        pt_attn_dq_thread *ts = malloc(sizeof *ts * PT_ATTN_NT);
        const int64_t nb = pt_attn_fwd_blocks(s, G);
        for (int64_t bid = 0; bid < nb; bid++) {
            fill_nan(smem, bytes);
            fill_nan(ts, sizeof *ts * PT_ATTN_NT);
            const pt_attn_dq_smem sm = pt_attn_dq_carve(smem, G, s->head_dim);
            const pt_attn_qblock qb = pt_attn_qblock_of(s, G, bid);
            for (int ph = PT_ATTN_Q_INIT; ph != PT_ATTN_END;) {
                int next = -1;
                for (int t = 0; t < PT_ATTN_NT; t++) {
                    const int n = pt_attn_dq_step(s, &io, G, &qb, &sm, ph, t, &ts[t]);
                    if (t) assert_int_equal(n, next);
                    next = n;
                }
                ph = next;
            }
        }
        free(ts);
        free(smem);
    }
}

/* the merge kernel: a warp per row, lanes over the columns (all lanes read lse before lane 0
 * writes it) */
static void emu_merge(float *out, float *lse, const float *ob, const float *lb, int B, int T,
                      int H, int hd, int ldo) {
    const int64_t rows = (int64_t)B * T * H;
    for (int64_t row = 0; row < pt_attn_merge_blocks(rows) * PT_ATTN_NW; row++) {
        if (row >= rows) continue;
        const int64_t bt = row / H;
        const int h = (int)(row % H), b = (int)(bt / T), t = (int)(bt % T);
        float *la = &lse[((size_t)b * H + h) * T + t];
        float w1, w2, lnew;
        if (!pt_attn_merge_weights(*la, lb[((size_t)b * H + h) * T + t], &w1, &w2, &lnew))
            continue;
        float *o = out + (size_t)bt * ldo + (size_t)h * hd;
        const float *o2 = ob + (size_t)bt * ldo + (size_t)h * hd;
        for (int lane = 0; lane < 32; lane++)
            for (int d = lane; d < hd; d += 32) o[d] = pt_attn_merge_elem(w1, o[d], w2, o2[d]);
        *la = lnew;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Cases */

enum { POS_CAUSAL, POS_CP };

typedef struct {
    const char *name;
    int B, Tq, Tk, H, Hkv, hd;
    int pos;  /* POS_CAUSAL (Tq = Tk, positions 0..T−1) or POS_CP (chunks, below) */
    int docs; /* documents through q_lo */
} acase;

typedef struct {
    pt_attn_shape s;
    int32_t *qp, *kp, *lo;
    float *q, *k, *v, *dout;
    size_t nq, nk, nlse; /* elements of q-like, k-like, lse-like tensors */
} adata;

static void make_data(const acase *c, adata *a, uint64_t seed) {
    pt_attn_shape *s = &a->s;
    memset(a, 0, sizeof *a);
    s->B = c->B, s->Tq = c->Tq, s->Tk = c->Tk, s->n_heads = c->H, s->n_kv_heads = c->Hkv;
    s->head_dim = c->hd;
    /* padded strides: rows wider than the heads they hold */
    s->ldq = s->ldo = c->H * c->hd + 3;
    s->ldk = c->Hkv * c->hd + 5;
    s->ldv = c->Hkv * c->hd + 1;
    s->scale = 1.0f / sqrtf((float)c->hd);
    a->qp = malloc(sizeof(int32_t) * c->Tq);
    a->kp = malloc(sizeof(int32_t) * c->Tk);
    if (c->pos == POS_CAUSAL) {
        for (int i = 0; i < c->Tq; i++) a->qp[i] = i;
        for (int j = 0; j < c->Tk; j++) a->kp[j] = j;
    } else {
        /* context parallelism with load balancing: this rank's queries are two chunks, [40, 40 +
         * Tq/2) and [300, ...); the keys one other rank's block [100, 100 + Tk): the first chunk
         * sees keys only from its row 60 on (earlier rows see none: lse = −∞), the second all */
        const int h1 = c->Tq / 2;
        for (int i = 0; i < c->Tq; i++) a->qp[i] = i < h1 ? 40 + i * 3 : 300 + (i - h1);
        for (int j = 0; j < c->Tk; j++) a->kp[j] = 100 + j;
    }
    if (c->docs) { /* documents: starts every 13..60 positions, differing by sequence */
        a->lo = malloc(sizeof(int32_t) * c->B * c->Tq);
        int32_t maxp = 0;
        for (int i = 0; i < c->Tq; i++) maxp = a->qp[i] > maxp ? a->qp[i] : maxp;
        int32_t *start = malloc(sizeof(int32_t) * (maxp + 1));
        uint64_t r = seed * 2654435761u + 1;
        for (int b = 0; b < c->B; b++) {
            int32_t cur = 0;
            for (int32_t p = 0; p <= maxp; p++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                if (p > 0 && (r >> 33) % 37 == 0) cur = p;
                if (p - cur > 60) cur = p;
                start[p] = cur;
            }
            for (int i = 0; i < c->Tq; i++) a->lo[(size_t)b * c->Tq + i] = start[a->qp[i]];
        }
        free(start);
    }
    s->q_pos = a->qp, s->k_pos = a->kp, s->q_lo = a->lo;
    a->nq = (size_t)c->B * c->Tq * s->ldq;
    a->nk = (size_t)c->B * c->Tk * (s->ldk > s->ldv ? s->ldk : s->ldv);
    a->nlse = (size_t)c->B * c->H * c->Tq;
    a->q = fvec(a->nq, seed + 1, 2.0f);
    a->k = fvec(a->nk, seed + 2, 2.0f);
    a->v = fvec(a->nk, seed + 3, 1.0f);
    a->dout = fvec(a->nq, seed + 4, 1.0f);
}

static void free_data(adata *a) {
    free(a->qp), free(a->kp), free(a->lo);
    free(a->q), free(a->k), free(a->v), free(a->dout);
}

/* lse = m + log l of the kernels against the CPU's: pt_attn_logf and glibc's logf may differ by
 * one ulp of log l (< 16 here), then the sum rounds: |Δ| ≤ 2^-23·16 + one ulp of lse.
 * *same[i] = whether row i agrees bit for bit */
static void check_lse(const char *what, const float *got, const float *ref, size_t n,
                      unsigned char *same) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const long u = ulps(got[i], ref[i]);
        const double bound = 16.0 / 8388608.0 + fabs(ref[i]) / 8388608.0;
        if (u && !(fabs((double)got[i] - ref[i]) <= bound)) {
            if (bad++ < 3) fprintf(stderr, "%s: row %zu: %a, CPU %a\n", what, i, got[i], ref[i]);
        }
        if (same) same[i] = u == 0;
        lse_rows++;
        if (u) lse_ulp_rows++;
    }
    assert_int_equal(bad, 0);
    const double e = rel_err(got, ref, n);
    if (e > worst_rel[2]) worst_rel[2] = e;
}

/* One case: forward and backward with p_bf16 0 and 1, and with p_bf16 the two passes over key
 * blocks. */
static void run_case(const acase *c, uint64_t seed) {
    adata a;
    make_data(c, &a, seed);
    pt_attn_shape s = a.s;
    const int hd = c->hd, H = c->H;
    for (int p16 = 0; p16 <= 1; p16++) {
        char what[160];
        s.p_bf16 = p16;
        /* forward: out prefilled alike (padding columns must stay) */
        float *out_c = fvec(a.nq, seed + 10, 1.0f), *out_e = fdup(out_c, a.nq);
        float *lse_c = fvec(a.nlse, seed + 11, 1.0f), *lse_e = fdup(lse_c, a.nlse);
        pt_cpu_attention_forward(&be, &s, a.q, a.k, a.v, out_c, lse_c);
        emu_forward(&s, a.q, a.k, a.v, out_e, lse_e);
        unsigned char *same = malloc(a.nlse);
        snprintf(what, sizeof what, "%s p_bf16=%d lse", c->name, p16);
        check_lse(what, lse_e, lse_c, a.nlse, same);
        snprintf(what, sizeof what, "%s p_bf16=%d out", c->name, p16);
        if (!p16) {
            check(0, what, out_e, out_c, a.nq, BITWISE);
        } else {
            /* bitwise in every row whose lse agrees (P16 rounds against lse) */
            check(1, what, out_e, out_c, a.nq, 0);
            for (int b = 0; b < c->B; b++)
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < c->Tq; i++) {
                        const size_t o = ((size_t)b * c->Tq + i) * s.ldo + (size_t)h * hd;
                        const int d = (int)n_diff(out_e + o, out_c + o, hd);
                        if (!same[((size_t)b * H + h) * c->Tq + i]) {
                            p16_rows_differing += d != 0;
                            continue;
                        }
                        if (BITWISE && d)
                            fprintf(stderr, "%s: row b=%d h=%d i=%d differs\n", what, b, h, i);
                        if (BITWISE) assert_int_equal(d, 0);
                    }
        }

        /* backward from the CPU's out and lse, into prefilled gradients */
        float *dq_c = fvec(a.nq, seed + 20, 1.0f), *dq_e = fdup(dq_c, a.nq);
        float *dk_c = fvec(a.nk, seed + 21, 1.0f), *dk_e = fdup(dk_c, a.nk);
        float *dv_c = fvec(a.nk, seed + 22, 1.0f), *dv_e = fdup(dv_c, a.nk);
        /* the increments alone for the relative error: subtract the prefill afterwards */
        float *dq0 = fdup(dq_c, a.nq), *dk0 = fdup(dk_c, a.nk), *dv0 = fdup(dv_c, a.nk);
        pt_cpu_attention_backward(&be, &s, a.q, a.k, a.v, out_c, a.dout, lse_c, dq_c, dk_c,
                                  dv_c);
        emu_backward(&s, a.q, a.k, a.v, out_c, a.dout, lse_c, dq_e, dk_e, dv_e);
        snprintf(what, sizeof what, "%s p_bf16=%d d(q,k,v) bitwise", c->name, p16);
        if (BITWISE) {
            assert_int_equal(n_diff(dq_e, dq_c, a.nq), 0);
            assert_int_equal(n_diff(dk_e, dk_c, a.nk), 0);
            assert_int_equal(n_diff(dv_e, dv_c, a.nk), 0);
        }
        float *g[3][2] = {{dq_e, dq_c}, {dk_e, dk_c}, {dv_e, dv_c}};
        const float *g0[3] = {dq0, dk0, dv0};
        const size_t gn[3] = {a.nq, a.nk, a.nk};
        for (int x = 0; x < 3; x++) {
            for (size_t i = 0; i < gn[x]; i++) g[x][0][i] -= g0[x][i], g[x][1][i] -= g0[x][i];
            snprintf(what, sizeof what, "%s p_bf16=%d d%c", c->name, p16, "qkv"[x]);
            check(3 + x, what, g[x][0], g[x][1], gn[x], 0);
        }
        free(dq_c), free(dq_e), free(dk_c), free(dk_e), free(dv_c), free(dv_e);
        free(dq0), free(dk0), free(dv0);

        if (p16) { /* the two passes of ring attention over three key blocks */
            const int cut[4] = {0, c->Tk / 3, c->Tk / 3 + (c->Tk - c->Tk / 3) / 2, c->Tk};
            float *lacc_c = malloc(sizeof(float) * a.nlse), *lacc_e = malloc(sizeof(float) * a.nlse);
            float *lblk_c = malloc(sizeof(float) * a.nlse), *lblk_e = malloc(sizeof(float) * a.nlse);
            float *lfull = malloc(sizeof(float) * a.nlse);
            for (size_t i = 0; i < a.nlse; i++) lacc_c[i] = lacc_e[i] = -INFINITY;
            float *o2c = calloc(a.nq, sizeof(float)), *o2e = calloc(a.nq, sizeof(float));
            for (int pass = 0; pass < 2; pass++)
                for (int blk = 0; blk < 3; blk++) {
                    pt_attn_shape sb = s;
                    sb.Tk = cut[blk + 1] - cut[blk];
                    sb.k_pos = a.kp + cut[blk];
                    /* the block's rows of k and v: B sequences of Tk rows, so a copy */
                    float *kb = malloc(sizeof(float) * c->B * sb.Tk * s.ldk);
                    float *vb = malloc(sizeof(float) * c->B * sb.Tk * s.ldv);
                    for (int b = 0; b < c->B; b++) {
                        memcpy(kb + (size_t)b * sb.Tk * s.ldk,
                               a.k + ((size_t)b * c->Tk + cut[blk]) * s.ldk,
                               sizeof(float) * sb.Tk * s.ldk);
                        memcpy(vb + (size_t)b * sb.Tk * s.ldv,
                               a.v + ((size_t)b * c->Tk + cut[blk]) * s.ldv,
                               sizeof(float) * sb.Tk * s.ldv);
                    }
                    if (pass == 0) {
                        sb.lse_only = 1;
                        pt_cpu_attention_forward(&be, &sb, a.q, kb, NULL, NULL, lblk_c);
                        emu_forward(&sb, a.q, kb, NULL, NULL, lblk_e);
                        snprintf(what, sizeof what, "%s lse_only block %d", c->name, blk);
                        check_lse(what, lblk_e, lblk_c, a.nlse, NULL);
                        /* bitwise the lse of the same call without lse_only */
                        sb.lse_only = 0;
                        float *ofull = malloc(sizeof(float) * a.nq);
                        emu_forward(&sb, a.q, kb, vb, ofull, lfull);
                        assert_int_equal(n_diff(lfull, lblk_e, a.nlse), 0);
                        free(ofull);
                        pt_cpu_attention_merge(&be, lacc_c, lacc_c, NULL, lblk_c, c->B, c->Tq, H,
                                               0, 0);
                        emu_merge(lacc_e, lacc_e, NULL, lblk_e, c->B, c->Tq, H, 0, 0);
                    } else {
                        /* lse_in: the one call's lse (the CPU's, for both): the blocks' sums
                         * chain into the one call's out */
                        sb.lse_in = lse_c;
                        pt_cpu_attention_forward(&be, &sb, a.q, kb, vb, o2c, NULL);
                        emu_forward(&sb, a.q, kb, vb, o2e, NULL);
                    }
                    free(kb), free(vb);
                }
            /* merged lse against the one call's: the same sums in another order, so close */
            snprintf(what, sizeof what, "%s merged lse", c->name);
            tu_check_rel(what, rel_err(lacc_e, lse_c, a.nlse), TOL);
            tu_check_rel(what, rel_err(lacc_c, lse_c, a.nlse), TOL);
            /* rows without any key keep out = 0 (zeroed): the one call writes 0 too */
            snprintf(what, sizeof what, "%s two-pass out vs CPU two-pass", c->name);
            check(7, what, o2e, o2c, a.nq, BITWISE);
            /* out of the kernels' one call, against their two passes: bitwise wherever the
             * rows' lse agree (the lse_in given was the CPU's) */
            snprintf(what, sizeof what, "%s two-pass out vs one call", c->name);
            for (int b = 0; b < c->B; b++)
                for (int h = 0; h < H; h++)
                    for (int i = 0; i < c->Tq; i++) {
                        const size_t o = ((size_t)b * c->Tq + i) * s.ldo + (size_t)h * hd;
                        if (!same[((size_t)b * H + h) * c->Tq + i]) continue;
                        assert_int_equal(n_diff(o2e + o, out_e + o, hd), 0);
                        assert_int_equal(n_diff(o2c + o, out_c + o, hd), 0);
                    }
            free(lacc_c), free(lacc_e), free(lblk_c), free(lblk_e), free(lfull);
            free(o2c), free(o2e);
        }
        free(same);
        free(out_c), free(out_e), free(lse_c), free(lse_e);
    }
    free_data(&a);
}

static void test_causal_mha_hd64(void **st) {
    (void)st;
    const acase c = {"causal mha hd64", 2, 150, 150, 3, 3, 64, POS_CAUSAL, 0};
    run_case(&c, 100);
}
static void test_documents_gqa2_hd128(void **st) {
    (void)st;
    const acase c = {"documents gqa2 hd128", 2, 137, 137, 4, 2, 128, POS_CAUSAL, 1};
    run_case(&c, 200);
}
static void test_cp_chunks_gqa4_hd8(void **st) {
    (void)st;
    const acase c = {"cp chunks gqa4 hd8", 2, 90, 170, 8, 2, 8, POS_CP, 0};
    run_case(&c, 300);
}
static void test_cp_documents_gqa2_hd64(void **st) {
    (void)st;
    const acase c = {"cp documents gqa2 hd64", 1, 100, 200, 4, 2, 64, POS_CP, 1};
    run_case(&c, 400);
}
static void test_causal_gqa2_hd256(void **st) {
    (void)st;
    const acase c = {"causal gqa2 hd256", 1, 90, 90, 2, 1, 256, POS_CAUSAL, 0};
    run_case(&c, 500);
}
static void test_odd_hd_gqa4(void **st) {
    (void)st;
    const acase c = {"causal gqa4 hd40 docs", 1, 70, 70, 4, 1, 40, POS_CAUSAL, 1};
    run_case(&c, 600);
}

/* ring attention's merge: rows with lse −∞ on either side, and the lse-only merge (head_dim 0) */
static void test_merge(void **st) {
    (void)st;
    const int B = 2, T = 37, H = 3, hd = 24, ldo = H * hd + 4;
    const size_t no = (size_t)B * T * ldo, nl = (size_t)B * H * T;
    float *oa = fvec(no, 1, 1.0f), *ob = fvec(no, 2, 1.0f);
    float *la = fvec(nl, 3, 4.0f), *lb = fvec(nl, 4, 4.0f);
    for (size_t i = 0; i < nl; i += 7) la[i] = -INFINITY;
    for (size_t i = 3; i < nl; i += 11) lb[i] = -INFINITY;
    float *oa2 = fdup(oa, no), *la2 = fdup(la, nl);
    pt_cpu_attention_merge(&be, oa, la, ob, lb, B, T, H, hd, ldo);
    emu_merge(oa2, la2, ob, lb, B, T, H, hd, ldo);
    check(6, "merge out", oa2, oa, no, 1);
    check(6, "merge lse", la2, la, nl, 1);
    free(oa), free(ob), free(la), free(lb), free(oa2), free(la2);
}

/* ---------------------------------------------------------------------------------------------
 * Element functions */

static void test_expf_is_the_cpu_backends(void **st) {
    (void)st;
    long worst = 0, differ = 0, n = 0;
    for (float x = -120.0f; x < 95.0f; x += 0.000173f, n++) {
        const long u = ulps(pt_k_expf(x), cpu_expf(x));
        worst = u > worst ? u : worst;
        differ += u != 0;
    }
    const float special[] = {-INFINITY, INFINITY, 0.0f, -0.0f, -110.0f, 89.0f, 88.7f, -87.5f,
                             -103.9f, 1e-30f};
    for (size_t i = 0; i < sizeof special / sizeof *special; i++)
        assert_int_equal(ulps(pt_k_expf(special[i]), cpu_expf(special[i])), 0);
    assert_true(isnan(pt_k_expf(NAN)));
    fprintf(stderr, "expf: %ld of %ld differ from pt_cpu_expf, worst %ld ulps\n", differ, n,
            worst);
    if (BITWISE) assert_int_equal(differ, 0);
    assert_true(worst <= 2);
}

static void test_logf(void **st) {
    (void)st;
    /* against the correctly rounded log (double, rounded once) everywhere, and within an ulp of
     * glibc's logf */
    long vs_glibc = 0, n = 0;
    for (uint32_t u = 0x00000001u; u < 0x7f800000u; u += 997u, n++) {
        const float x = tu_f32_from_bits(u), got = pt_attn_logf(x);
        const float cr = (float)log((double)x);
        if (got != cr) fprintf(stderr, "logf(%a) = %a, correctly rounded %a\n", x, got, cr);
        assert_true(got == cr);
        const long ul = ulps(got, logf(x));
        assert_true(ul <= 1);
        vs_glibc += ul != 0;
    }
    fprintf(stderr, "logf: %ld of %ld differ by an ulp from glibc's logf\n", vs_glibc, n);
    assert_true(pt_attn_logf(0.0f) == -INFINITY);
    assert_true(pt_attn_logf(INFINITY) == INFINITY);
    assert_true(pt_attn_logf(1.0f) == 0.0f);
    assert_true(isnan(pt_attn_logf(-1.0f)) && isnan(pt_attn_logf(NAN)));
}

static void test_bf16_rounding(void **st) {
    (void)st;
    uint64_t r = 12345;
    for (long i = 0; i < 4000000; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t u = (uint32_t)(r >> 32);
        if (i < 65536) u = ((uint32_t)i << 16) | 0x8000u; /* every tie */
        const float x = tu_f32_from_bits(u);
        const uint32_t want = (uint32_t)pt_bf16_round(x) << 16;
        assert_int_equal(tu_f32_bits(pt_attn_bf16_value(x)), want);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Launch geometry */

static void test_geometry(void **st) {
    (void)st;
    size_t most[3] = {0, 0, 0};
    for (int hd = 1; hd <= PT_ATTN_MAX_HEAD_DIM; hd++) {
        const pt_attn_geom G = pt_attn_geom_of(pt_attn_hdc(hd));
        assert_true(hd <= G.hdc && G.nj * 32 == G.hdc && G.nj <= PT_ATTN_NJ_MAX);
        /* warps own whole rows / keys; score tiles spread evenly over the threads */
        assert_int_equal(G.bq % PT_ATTN_NW, 0);
        assert_int_equal(G.rpw * PT_ATTN_NW, G.bq);
        assert_int_equal(G.kpw * PT_ATTN_NW, G.bk);
        assert_true(G.rpw <= PT_ATTN_RPW_MAX && G.kpw <= PT_ATTN_KPW_MAX);
        assert_int_equal(PT_ATTN_NT % PT_ATTN_KT, 0);
        assert_int_equal(PT_ATTN_NT % G.kq, 0);
        assert_int_equal(PT_ATTN_NT % G.bk, 0);
        assert_true(G.bq * PT_ATTN_KT % PT_ATTN_NT == 0 &&
                    G.bq * PT_ATTN_KT / PT_ATTN_NT <= PT_ATTN_SE_MAX);
        assert_true(G.bq * G.kq % PT_ATTN_NT == 0 && G.bq * G.kq / PT_ATTN_NT <= PT_ATTN_SE_MAX);
        assert_true(G.qs * G.bk % PT_ATTN_NT == 0 && G.qs * G.bk / PT_ATTN_NT <= PT_ATTN_SE_MAX);
        assert_true(G.qs >= PT_ATTN_NT / G.bk); /* the rows a step's score tile spans */
        /* the forward's query tile is the CPU's (32) or a subset of it */
        assert_true(G.bq == 32 || 32 % G.bq == 0);
        /* per-thread accumulators: 32 floats for out/dq, 64 for dk + dv */
        assert_true(G.rpw * G.nj <= 32 && 2 * G.kpw * G.nj <= 64);
        /* the row stride of key tiles is odd (no bank conflicts down a column) */
        assert_int_equal(pt_attn_kvld(hd) % 2, 1);
        const size_t b[3] = {pt_attn_fwd_smem_bytes(G, hd), pt_attn_dq_smem_bytes(G, hd),
                             pt_attn_dkv_smem_bytes(G, hd)};
        for (int i = 0; i < 3; i++) {
            assert_true(b[i] <= PT_ATTN_SMEM_MAX);
            /* the opt-in attention.cu makes (at head_dim = the class) covers this size */
            const size_t at_class = i == 0   ? pt_attn_fwd_smem_bytes(G, G.hdc)
                                    : i == 1 ? pt_attn_dq_smem_bytes(G, G.hdc)
                                             : pt_attn_dkv_smem_bytes(G, G.hdc);
            assert_true(b[i] <= at_class);
            most[i] = b[i] > most[i] ? b[i] : most[i];
        }
    }
    fprintf(stderr, "shared memory at most: forward %zu, dq %zu, dk/dv %zu bytes\n", most[0],
            most[1], most[2]);
    /* grids: one dimension of at most 2^31 − 1 blocks for large shapes */
    pt_attn_shape s = {0};
    s.B = 64, s.Tq = s.Tk = 131072, s.n_heads = 128, s.n_kv_heads = 8;
    for (int hd = 32; hd <= 256; hd *= 2) {
        s.head_dim = hd;
        const pt_attn_geom G = pt_attn_geom_of(hd);
        assert_true(pt_attn_fwd_blocks(&s, G) <= INT32_MAX);
        assert_true(pt_attn_dkv_blocks(&s, G) <= INT32_MAX);
    }
    assert_true(pt_attn_merge_blocks((int64_t)64 * 131072 * 128) <= INT32_MAX);
    /* block decomposition covers every (b, h, tile) once, reverse tile order */
    s.B = 3, s.Tq = 100, s.Tk = 77, s.n_heads = 6, s.n_kv_heads = 2;
    s.head_dim = 64;
    const pt_attn_geom G = pt_attn_geom_of(64);
    int seen[3][6][4] = {{{0}}};
    for (int64_t bid = 0; bid < pt_attn_fwd_blocks(&s, G); bid++) {
        const pt_attn_qblock q = pt_attn_qblock_of(&s, G, bid);
        assert_int_equal(q.g, q.h / 3);
        assert_true(q.nq > 0 && q.nq <= G.bq && q.i0 + q.nq <= s.Tq);
        seen[q.b][q.h][q.i0 / G.bq]++;
    }
    for (int b = 0; b < 3; b++)
        for (int h = 0; h < 6; h++)
            for (int t = 0; t < 4; t++) assert_int_equal(seen[b][h][t], 1);
    int kseen[3][2][2] = {{{0}}};
    for (int64_t bid = 0; bid < pt_attn_dkv_blocks(&s, G); bid++) {
        const pt_attn_kblock k = pt_attn_kblock_of(&s, G, bid);
        assert_true(k.nk > 0 && k.j0 + k.nk <= s.Tk);
        kseen[k.b][k.g][k.j0 / G.bk]++;
    }
    for (int b = 0; b < 3; b++)
        for (int g = 0; g < 2; g++)
            for (int t = 0; t < 2; t++) assert_int_equal(kseen[b][g][t], 1);
}

static int report(void **st) {
    (void)st;
    fprintf(stderr, "worst relative errors (kernels on the host vs CPU backend), bitwise=%d:\n",
            BITWISE);
    for (int i = 0; i < 8; i++) fprintf(stderr, "  %-13s %.3g\n", worst_name[i], worst_rel[i]);
    fprintf(stderr, "  lse rows not bitwise equal: %ld of %ld; p_bf16 out rows differing there: %ld\n",
            lse_ulp_rows, lse_rows, p16_rows_differing);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_expf_is_the_cpu_backends),
        cmocka_unit_test(test_logf),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_causal_mha_hd64),
        cmocka_unit_test(test_documents_gqa2_hd128),
        cmocka_unit_test(test_cp_chunks_gqa4_hd8),
        cmocka_unit_test(test_cp_documents_gqa2_hd64),
        cmocka_unit_test(test_causal_gqa2_hd256),
        cmocka_unit_test(test_odd_hd_gqa4),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
