/* test_gpu_backend.c: every slot of the CUDA backend against the CPU backend on the same inputs
 * (in the manner of ggml's test-backend-ops), and each CUDA slot run twice, bitwise equal.
 *
 * A GPU test: without a usable CUDA device (a build without the CUDA backend, no driver,
 * cudaGetDeviceCount failing or finding none) it exits 77, which CTest reports as skipped.
 * PT_GPU_TEST_SMALL=1 shrinks every shape (for compute-sanitizer, scripts/gpu_check.sh).
 *
 * Each check runs a slot through a function run_X(be, inputs) -> host outputs, once on the CPU
 * backend and twice on the CUDA backend from fresh uploads. Tolerances: fp32 results 1e-6
 * relative (‖Δ‖/‖ref‖; only summation order differs; fp32 GEMMs 4·2^-24·sqrt(K)), results whose
 * arithmetic is the same on both sides bitwise (copies, conversions, embedding, AdamW), bf16
 * GEMMs 1e-5 (fp32 accumulation of exact bf16 products, in another order).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static pt_backend *cpu, *gpu;
static int small;

static void *up(pt_backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(be, bytes ? bytes : 4);
    if (bytes) be->upload(be, d, h, bytes);
    return d;
}
static void *down(pt_backend *be, const void *d, size_t bytes) {
    void *h = malloc(bytes ? bytes : 4);
    if (bytes) be->download(be, h, d, bytes);
    return h;
}
static float *fvec(size_t n, uint64_t seed, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    tu_fill(x, n, seed, scale);
    return x;
}

/* The three runs of one slot: CPU, CUDA, CUDA again. */
typedef void *(*run_fn)(pt_backend *be, const void *arg, size_t *bytes);
static void check3(const char *what, run_fn run, const void *arg, double tol) {
    size_t nb0, nb1, nb2;
    float *c = run(cpu, arg, &nb0), *g1 = run(gpu, arg, &nb1), *g2 = run(gpu, arg, &nb2);
    assert_int_equal(nb0, nb1);
    assert_int_equal(nb1, nb2);
    if (memcmp(g1, g2, nb1) != 0) fail_msg("%s: two CUDA runs differ (not deterministic)", what);
    if (tol == 0) {
        if (memcmp(g1, c, nb0) != 0) fail_msg("%s: CUDA and CPU differ (expected bitwise)", what);
    } else {
        double err = tu_rel_err(g1, c, nb0 / sizeof(float));
        print_message("%-40s rel err %.3g\n", what, err);
        tu_check_rel(what, err, tol);
    }
    free(c), free(g1), free(g2);
}

/* ---------------------------------------------------------------------------------------------
 * GEMM */
typedef struct {
    pt_trans ta, tb;
    int M, N, K, lda, ldb, ldc, bf16;
    float alpha, beta;
} gemm_arg;
static void *run_gemm(pt_backend *be, const void *p, size_t *bytes) {
    const gemm_arg *g = p;
    int ar = g->ta ? g->K : g->M, br = g->tb ? g->N : g->K;
    size_t na = (size_t)ar * g->lda, nb = (size_t)br * g->ldb, nc = (size_t)g->M * g->ldc;
    float *ha = fvec(na, 1, 1.0f), *hb = fvec(nb, 2, 1.0f), *hc = fvec(nc, 3, 1.0f);
    float *a = up(be, ha, na * 4), *b = up(be, hb, nb * 4), *c = up(be, hc, nc * 4);
    if (g->bf16) {
        pt_bf16 *a16 = be->alloc(be, na * 2), *b16 = be->alloc(be, nb * 2);
        be->to_bf16(be, a16, a, na);
        be->to_bf16(be, b16, b, nb);
        be->gemm_bf16(be, g->ta, g->tb, g->M, g->N, g->K, a16, g->lda, b16, g->ldb, g->beta, c,
                      g->ldc);
        be->free(be, a16), be->free(be, b16);
    } else {
        be->gemm(be, g->ta, g->tb, g->M, g->N, g->K, g->alpha, a, g->lda, b, g->ldb, g->beta, c,
                 g->ldc);
    }
    void *out = down(be, c, nc * 4);
    *bytes = nc * 4;
    be->free(be, a), be->free(be, b), be->free(be, c);
    free(ha), free(hb), free(hc);
    return out;
}
static void test_gemm(void **state) {
    (void)state;
    int s = small ? 1 : 4;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bf16 = 0; bf16 < 2; bf16++)
                for (int beta = 0; beta < 2; beta++) {
                    gemm_arg g = {ta, tb, 37 * s, 29 * s, 64 * s + 3, 0, 0, 0, bf16, 1.0f, (float)beta};
                    if (!bf16) g.alpha = 0.75f;
                    g.lda = (ta ? g.M : g.K) + 5, g.ldb = (tb ? g.K : g.N) + 3, g.ldc = g.N + 7;
                    if (bf16) g.lda += g.lda % 2, g.ldb += g.ldb % 2; /* even: 4-byte rows */
                    char what[96];
                    snprintf(what, sizeof what, "gemm%s ta=%d tb=%d beta=%d", bf16 ? "_bf16" : "",
                             ta, tb, beta);
                    /* fp32: each side's sum of K terms drifts ~2^-24·sqrt(K/6) relative, so
                     * 1e-6 would leave under 2x margin at K = 259: test_gpu_gemm.c's bound */
                    check3(what, run_gemm, &g,
                           bf16 ? 1e-5 : fmax(1e-6, 4.0 * 0x1p-24 * sqrt((double)g.K)));
                }
    /* a mixture of experts' changing row counts, one shape family */
    for (int m = 1; m < 40 * s; m += 7) {
        gemm_arg g = {PT_NO_TRANS, PT_TRANS, m, 48 * s, 32 * s, 32 * s, 32 * s, 48 * s, 1, 1.0f, 1.0f};
        check3("gemm_bf16 changing M", run_gemm, &g, 1e-5);
    }
}

/* ---------------------------------------------------------------------------------------------
 * element and row kernels */
typedef struct {
    int N, C, F, V, ld, n_heads, head_dim, row0, rows, inverse;
    uint64_t seed;
} op_arg;

static void *run_convert(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    size_t n = (size_t)o->N * o->C;
    float *h = fvec(n, o->seed, 100.0f);
    h[0] = NAN, h[1] = INFINITY, h[2] = 1e-40f, h[3] = -0.0f;
    float *x = up(be, h, n * 4), *y = be->alloc(be, n * 4);
    pt_bf16 *b = be->alloc(be, n * 2);
    be->to_bf16(be, b, x, n);
    be->from_bf16(be, y, b, n);
    float *out = down(be, y, n * 4);
    *bytes = n * 4;
    be->free(be, x), be->free(be, y), be->free(be, b), free(h);
    return out;
}

static void *run_embedding(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    int32_t *tok = malloc(o->N * 4);
    for (int i = 0; i < o->N; i++) tok[i] = (int32_t)((i * 7919u + 3) % (unsigned)(o->rows * 2)); /* repeats, out-of-shard */
    size_t nw = (size_t)o->rows * o->C, no = (size_t)o->N * o->C;
    float *hw = fvec(nw, o->seed, 1.0f), *hd = fvec(no, o->seed + 1, 1.0f);
    int32_t *t = up(be, tok, o->N * 4);
    float *w = up(be, hw, nw * 4), *out = be->alloc(be, no * 4), *d = up(be, hd, no * 4);
    float *dw = up(be, hw, nw * 4); /* "+=" onto a non-zero gradient */
    pt_bf16 *w16 = be->alloc(be, nw * 2), *o16 = be->alloc(be, no * 2);
    be->to_bf16(be, w16, w, nw);
    be->embedding_forward(be, out, t, w, o->N, o->C, o->row0, o->rows);
    be->embedding_forward_bf16(be, o16, t, w16, o->N, o->C, o->row0, o->rows);
    be->embedding_backward(be, dw, t, d, o->N, o->C, o->row0, o->rows);
    /* all three results as one float buffer */
    float *r = malloc((no + nw) * 4 + no * 2);
    be->download(be, r, out, no * 4);
    be->download(be, r + no, dw, nw * 4);
    be->download(be, (char *)(r + no + nw), o16, no * 2);
    *bytes = (no + nw) * 4 + no * 2;
    be->free(be, t), be->free(be, w), be->free(be, out), be->free(be, d), be->free(be, dw);
    be->free(be, w16), be->free(be, o16);
    free(tok), free(hw), free(hd);
    return r;
}

static void *run_rmsnorm(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    size_t n = (size_t)o->N * o->C;
    float *hx = fvec(n, o->seed, 2.0f), *hw = fvec(o->C, o->seed + 1, 1.0f);
    float *hdy = fvec(n, o->seed + 2, 1.0f);
    float *x = up(be, hx, n * 4), *w = up(be, hw, o->C * 4), *dy = up(be, hdy, n * 4);
    float *y = be->alloc(be, n * 4), *rstd = be->alloc(be, o->N * 4);
    float *dx = up(be, hdy, n * 4), *dw = up(be, hw, o->C * 4);
    be->rmsnorm_forward(be, y, rstd, x, w, o->N, o->C, 1e-5f);
    be->rmsnorm_backward(be, dx, dw, dy, x, w, rstd, o->N, o->C);
    float *r = malloc((2 * n + o->N + o->C) * 4);
    be->download(be, r, y, n * 4);
    be->download(be, r + n, dx, n * 4);
    be->download(be, r + 2 * n, rstd, o->N * 4);
    be->download(be, r + 2 * n + o->N, dw, o->C * 4);
    *bytes = (2 * n + o->N + o->C) * 4;
    be->free(be, x), be->free(be, w), be->free(be, dy), be->free(be, y), be->free(be, rstd);
    be->free(be, dx), be->free(be, dw), free(hx), free(hw), free(hdy);
    return r;
}

static void *run_rope(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    int half = o->head_dim / 2, maxp = 64;
    float *ct = malloc(maxp * half * 4), *st = malloc(maxp * half * 4);
    for (int q = 0; q < maxp; q++)
        for (int i = 0; i < half; i++) {
            double a = q * pow(500000.0, -2.0 * i / o->head_dim);
            ct[q * half + i] = (float)cos(a), st[q * half + i] = (float)sin(a);
        }
    int32_t *pos = malloc(o->N * 4);
    for (int i = 0; i < o->N; i++) pos[i] = (i * 13) % maxp;
    size_t n = (size_t)o->N * o->ld;
    float *hx = fvec(n, o->seed, 1.0f);
    float *x = up(be, hx, n * 4), *c = up(be, ct, maxp * half * 4), *s = up(be, st, maxp * half * 4);
    int32_t *dp = up(be, pos, o->N * 4);
    be->rope(be, x, dp, o->N, o->n_heads, o->head_dim, o->ld, c, s, o->inverse);
    float *r = down(be, x, n * 4);
    *bytes = n * 4;
    be->free(be, x), be->free(be, c), be->free(be, s), be->free(be, dp);
    free(ct), free(st), free(pos), free(hx);
    return r;
}

static void *run_swiglu(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    size_t nf = (size_t)o->N * o->F;
    float *hgu = fvec(2 * nf, o->seed, 5.0f), *hdh = fvec(nf, o->seed + 1, 1.0f);
    float *gu = up(be, hgu, nf * 8), *dh = up(be, hdh, nf * 4), *h = be->alloc(be, nf * 4);
    be->swiglu_forward(be, h, gu, o->N, o->F);
    be->swiglu_backward(be, gu, dh, gu, o->N, o->F); /* in place, as the model calls it */
    float *r = malloc(nf * 12);
    be->download(be, r, h, nf * 4);
    be->download(be, r + nf, gu, nf * 8);
    *bytes = nf * 12;
    be->free(be, gu), be->free(be, dh), be->free(be, h), free(hgu), free(hdh);
    return r;
}

static void *run_xent(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    size_t nl = (size_t)o->N * o->ld;
    float *hl = fvec(nl, o->seed, 10.0f);
    int32_t *tg = malloc(o->N * 4);
    for (int i = 0; i < o->N; i++) tg[i] = i % 5 == 3 ? -1 : (int32_t)((i * 104729u) % (unsigned)o->V);
    float *l = up(be, hl, nl * 4), *loss = be->alloc(be, o->N * 4);
    int32_t *t = up(be, tg, o->N * 4);
    be->softmax_xent(be, l, loss, t, o->N, o->V, o->ld, 1.0f / o->N);
    /* the vocabulary-parallel pair on a fresh copy, block [V/3, V/3 + V/2) */
    float *l2 = up(be, hl, nl * 4), *stats = malloc(o->N * 12), *M = malloc(o->N * 4),
          *S = malloc(o->N * 4);
    int v0 = o->V / 3, Vb = o->V / 2;
    be->xent_stats(be, l2, t, o->N, Vb, o->ld, v0, stats);
    for (int i = 0; i < o->N; i++) M[i] = stats[3 * i], S[i] = stats[3 * i + 1];
    be->xent_grad(be, l2, t, o->N, Vb, o->ld, v0, M, S, 0.5f);
    size_t total = nl * 2 + o->N + (size_t)o->N * 3;
    float *r = malloc(total * 4);
    be->download(be, r, l, nl * 4);
    be->download(be, r + nl, l2, nl * 4);
    be->download(be, r + 2 * nl, loss, o->N * 4);
    memcpy(r + 2 * nl + o->N, stats, o->N * 12);
    *bytes = total * 4;
    be->free(be, l), be->free(be, loss), be->free(be, t), be->free(be, l2);
    free(hl), free(tg), free(stats), free(M), free(S);
    return r;
}

static void *run_rows(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    int n = o->N, C = o->C, src_rows = o->rows;
    int32_t *idx = malloc(n * 4);
    for (int i = 0; i < n; i++) idx[i] = (int32_t)((i * 31u + 7) % (unsigned)src_rows); /* repeats */
    float *hs = fvec((size_t)src_rows * C, o->seed, 1.0f), *hsc = fvec(n, o->seed + 1, 2.0f);
    float *hy = fvec((size_t)n * C, o->seed + 2, 1.0f);
    float *s = up(be, hs, (size_t)src_rows * C * 4), *sc = up(be, hsc, n * 4);
    int32_t *di = up(be, idx, n * 4);
    float *g1 = be->alloc(be, (size_t)n * C * 4), *g2 = be->alloc(be, (size_t)n * C * 4);
    float *y = up(be, hy, (size_t)n * C * 4), *acc = up(be, hs, (size_t)src_rows * C * 4);
    double *dot = be->alloc(be, n * 8);
    be->rows_gather(be, g1, s, di, sc, n, C);
    be->rows_copy(be, g2, s, di, n, (size_t)C * 4);
    be->rows_scatter_add(be, acc, y, di, sc, n, C);
    be->rows_scatter_add(be, acc, y, di, NULL, n, C);
    be->rows_dot(be, dot, s, di, y, n, C);
    size_t nf = (size_t)n * C * 2 + (size_t)src_rows * C;
    float *r = malloc((nf + n) * 4);
    double *hdot = malloc(n * 8);
    be->download(be, r, g1, (size_t)n * C * 4);
    be->download(be, r + (size_t)n * C, g2, (size_t)n * C * 4);
    be->download(be, r + 2 * (size_t)n * C, acc, (size_t)src_rows * C * 4);
    be->download(be, hdot, dot, n * 8);
    /* the dots as floats: check3 reads the buffer as floats, and a double's low word read as a
     * float can be NaN or inf (NaN − NaN fails any tolerance) */
    for (int i = 0; i < n; i++) r[nf + i] = (float)hdot[i];
    free(hdot);
    *bytes = (nf + n) * 4;
    be->free(be, s), be->free(be, sc), be->free(be, di), be->free(be, g1), be->free(be, g2);
    be->free(be, y), be->free(be, acc), be->free(be, dot);
    free(idx), free(hs), free(hsc), free(hy);
    return r;
}

static void *run_add_adamw(pt_backend *be, const void *p, size_t *bytes) {
    const op_arg *o = p;
    size_t n = (size_t)o->N * o->C;
    float *hp = fvec(n, o->seed, 1.0f), *hg = fvec(n, o->seed + 1, 0.01f);
    float *pp = up(be, hp, n * 4), *g = up(be, hg, n * 4), *m = be->alloc(be, n * 4),
          *v = be->alloc(be, n * 4);
    be->add(be, g, g, n); /* g += g */
    for (int step = 1; step <= 3; step++)
        be->adamw(be, pp, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step, 0.5f);
    float *r = malloc(n * 12 + 8);
    be->download(be, r, pp, n * 4);
    be->download(be, r + n, m, n * 4);
    be->download(be, r + 2 * n, v, n * 4);
    double ss = be->sumsq(be, g, n);
    memcpy(r + 3 * n, &ss, 8);
    *bytes = n * 12; /* the sum of squares is checked on its own below */
    be->free(be, pp), be->free(be, g), be->free(be, m), be->free(be, v), free(hp), free(hg);
    return r;
}

static void test_ops(void **state) {
    (void)state;
    int s = small ? 1 : 8;
    op_arg a = {.N = 33 * s, .C = 96 * s + 5, .F = 88 * s + 3, .V = 1000 * s + 17,
                .n_heads = 4, .head_dim = 64, .row0 = 10, .rows = 50 * s, .seed = 5};
    a.ld = a.V + 3;
    check3("to_bf16 / from_bf16", run_convert, &a, 0);
    check3("embedding fwd, fwd bf16, bwd", run_embedding, &a, 0);
    check3("rmsnorm fwd, bwd", run_rmsnorm, &a, 1e-6);
    op_arg r = a;
    r.ld = r.n_heads * r.head_dim + 64; /* rope on q within a fused qkv row */
    for (r.inverse = 0; r.inverse < 2; r.inverse++) check3("rope", run_rope, &r, 1e-6);
    check3("swiglu fwd, bwd (in place)", run_swiglu, &a, 1e-6);
    check3("softmax_xent, xent_stats, xent_grad", run_xent, &a, 1e-6);
    op_arg w = a;
    w.rows = 17; /* many rows on one index: the scatter-add's order */
    check3("rows gather, copy, scatter-add, dot", run_rows, &w, 1e-6);
    check3("add, adamw ×3", run_add_adamw, &a, 0);
    /* sumsq: the blocks' sums in double, orders differ */
    size_t n = (size_t)a.N * a.C * 37 + 11;
    float *h = fvec(n, 9, 3.0f);
    float *dc = up(cpu, h, n * 4), *dg = up(gpu, h, n * 4);
    double sc = cpu->sumsq(cpu, dc, n), sg = gpu->sumsq(gpu, dg, n), sg2 = gpu->sumsq(gpu, dg, n);
    assert_true(sg == sg2);
    assert_true(fabs(sg - sc) <= 1e-12 * sc);
    cpu->free(cpu, dc), gpu->free(gpu, dg), free(h);
}

/* ---------------------------------------------------------------------------------------------
 * attention */
typedef struct {
    int B, Tq, Tk, H, KV, hd, p_bf16, docs, shift, two_pass;
} attn_arg;

static void *run_attention(pt_backend *be, const void *p, size_t *bytes) {
    const attn_arg *a = p;
    int ldq = a->H * a->hd + 8, ldk = a->KV * a->hd + 4, ldo = a->H * a->hd;
    size_t nq = (size_t)a->B * a->Tq * ldq, nk = (size_t)a->B * a->Tk * ldk;
    size_t no = (size_t)a->B * a->Tq * ldo, nl = (size_t)a->B * a->H * a->Tq;
    float *hq = fvec(nq, 61, 1.0f), *hk = fvec(nk, 62, 1.0f), *hv = fvec(nk, 63, 1.0f);
    float *hdo = fvec(no, 64, 1.0f);
    int32_t *qp = malloc(a->Tq * 4), *kp = malloc(a->Tk * 4), *lo = malloc((size_t)a->B * a->Tq * 4);
    for (int i = 0; i < a->Tq; i++) qp[i] = i + a->shift; /* a context-parallel chunk */
    for (int j = 0; j < a->Tk; j++) kp[j] = j;
    for (int b = 0; b < a->B; b++)
        for (int i = 0; i < a->Tq; i++) lo[b * a->Tq + i] = a->docs ? (qp[i] / 37) * 37 - b * 5 : 0;
    float *q = up(be, hq, nq * 4), *k = up(be, hk, nk * 4), *v = up(be, hv, nk * 4);
    float *dout = up(be, hdo, no * 4), *out = be->alloc(be, no * 4), *lse = be->alloc(be, nl * 4);
    float *dq = up(be, hq, nq * 4), *dk = up(be, hk, nk * 4), *dv = up(be, hv, nk * 4); /* += */
    int32_t *dqp = up(be, qp, a->Tq * 4), *dkp = up(be, kp, a->Tk * 4);
    int32_t *dlo = a->docs ? up(be, lo, (size_t)a->B * a->Tq * 4) : NULL;
    pt_attn_shape s = {a->B, a->Tq, a->Tk, a->H, a->KV, a->hd, ldq, ldk, ldk, ldo,
                       dqp, dkp, dlo, 1.0f / sqrtf((float)a->hd), a->p_bf16, 0, NULL};
    if (a->two_pass) {
        /* ring attention's passes over two key blocks, merged lse, then the shares added */
        int half = a->Tk / 2;
        pt_attn_shape s1 = s, s2 = s;
        s1.Tk = half, s2.Tk = a->Tk - half;
        s2.k_pos = dkp + half;
        float *lse2 = be->alloc(be, nl * 4), *zero = be->alloc(be, no * 4);
        s1.lse_only = s2.lse_only = 1;
        be->attention_forward(be, &s1, q, k, NULL, NULL, lse);
        be->attention_forward(be, &s2, q, k + (size_t)half * ldk, NULL, NULL, lse2);
        be->attention_merge(be, zero, lse, zero, lse2, a->B, a->Tq, a->H, 0, ldo);
        s1.lse_only = s2.lse_only = 0;
        s1.lse_in = s2.lse_in = lse;
        be->zero(be, out, no * 4);
        be->attention_forward(be, &s1, q, k, v, out, NULL);
        be->attention_forward(be, &s2, q, k + (size_t)half * ldk, v + (size_t)half * ldk, out, NULL);
        be->free(be, lse2), be->free(be, zero);
    } else {
        be->attention_forward(be, &s, q, k, v, out, lse);
    }
    be->attention_backward(be, &s, q, k, v, out, dout, lse, dq, dk, dv);
    size_t total = no + nl + nq + 2 * nk;
    float *r = malloc(total * 4);
    be->download(be, r, out, no * 4);
    be->download(be, r + no, lse, nl * 4);
    be->download(be, r + no + nl, dq, nq * 4);
    be->download(be, r + no + nl + nq, dk, nk * 4);
    be->download(be, r + no + nl + nq + nk, dv, nk * 4);
    /* a row with no visible key has lse −inf on both sides: compare it as 0 */
    for (size_t i = no; i < no + nl; i++)
        if (isinf(r[i])) r[i] = 0.0f;
    *bytes = total * 4;
    be->free(be, q), be->free(be, k), be->free(be, v), be->free(be, dout), be->free(be, out);
    be->free(be, lse), be->free(be, dq), be->free(be, dk), be->free(be, dv);
    be->free(be, dqp), be->free(be, dkp);
    if (dlo) be->free(be, dlo);
    free(hq), free(hk), free(hv), free(hdo), free(qp), free(kp), free(lo);
    return r;
}

static void test_attention(void **state) {
    (void)state;
    int T = small ? 40 : 300;
    const attn_arg cases[] = {
        {2, T, T, 4, 4, 64, 0, 0, 0, 0},      {2, T, T, 8, 2, 128, 0, 0, 0, 0},
        {1, T, T, 4, 1, 64, 1, 0, 0, 0},      {2, T, T, 4, 2, 64, 0, 1, 0, 0},
        {1, T / 2, T, 4, 2, 64, 0, 0, T / 2, 0}, {1, T, T, 2, 1, 256, 1, 1, 0, 0},
        {2, T, T, 4, 2, 64, 1, 0, 0, 1},      {1, T, T, 3, 3, 16, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const attn_arg *c = &cases[i];
        char what[128];
        snprintf(what, sizeof what, "attention B%d Tq%d Tk%d H%d/%d hd%d%s%s%s", c->B, c->Tq, c->Tk,
                 c->H, c->KV, c->hd, c->p_bf16 ? " p_bf16" : "", c->docs ? " docs" : "",
                 c->two_pass ? " two-pass" : "");
        check3(what, run_attention, c, 1e-5);
    }
}

/* ---------------------------------------------------------------------------------------------
 * memory: copies and zeroing, and nothing allocated on the device after set-up */
static void test_memory(void **state) {
    (void)state;
    size_t n = ((size_t)70 << 20) / 4 + 3; /* larger than a pinned staging buffer */
    float *h = fvec(n, 71, 1.0f), *d = up(gpu, h, n * 4), *d2 = gpu->alloc(gpu, n * 4);
    gpu->copy(gpu, d2, d, n * 4);
    float *back = down(gpu, d2, n * 4);
    assert_memory_equal(back, h, n * 4);
    gpu->zero(gpu, d2, n * 4 / 2);
    gpu->download(gpu, back, d2, n * 4);
    for (size_t i = 0; i < n / 2; i++) assert_true(back[i] == 0.0f);
    assert_memory_equal(back + n / 2 + 1, h + n / 2 + 1, (n - n / 2 - 1) * 4);
    /* the arena is the one cudaMalloc, and allocations come from it (not under
     * PT_CUDA_DIRECT_ALLOC, compute-sanitizer's mode, where each buffer is a cudaMalloc) */
    const char *direct = getenv("PT_CUDA_DIRECT_ALLOC");
    if (!direct || atoi(direct) <= 0) {
        int64_t mallocs = pt_cuda_malloc_count();
        assert_int_equal(mallocs, 1);
        int64_t allocs = pt_alloc_count();
        for (int i = 0; i < 100; i++) gpu->free(gpu, gpu->alloc(gpu, (size_t)i << 16));
        assert_int_equal(pt_cuda_malloc_count(), mallocs);
        assert_int_equal(pt_alloc_count(), allocs + 100); /* each counted, as the steps' count */
    }
    gpu->free(gpu, d), gpu->free(gpu, d2), free(h), free(back);
    print_message("%s\n", gpu->describe(gpu));
}

int main(void) {
    if (pt_cuda_device_count() <= 0) {
        printf("skipped: no CUDA device (%s)\n",
               pt_cuda_check_usable() == PT_OK ? "?" : pt_last_error());
        return 77;
    }
    small = getenv("PT_GPU_TEST_SMALL") && atoi(getenv("PT_GPU_TEST_SMALL")) > 0;
    /* small is the compute-sanitizer run (scripts/gpu_check.sh): a 1 GiB arena (the small shapes
     * need ~200 MiB) leaves the GPU's memory to the sanitizer instead of taking all but 1.5 GiB,
     * and shrinks the set-up's bf16 peak GEMMs (8192³ → 4096³), slow under instrumentation */
    if (small) setenv("PT_CUDA_ARENA_MB", "1024", 0);
    cpu = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    gpu = pt_backend_cuda_create(0);
    if (!cpu || !gpu) {
        fprintf(stderr, "backend: %s\n", pt_last_error());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),
        cmocka_unit_test(test_gemm),
        cmocka_unit_test(test_ops),
        cmocka_unit_test(test_attention),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    gpu->destroy(gpu);
    cpu->destroy(cpu);
    return rc;
}
