/* test_ops.c: the CPU kernels of src/backend/cpu against naive double-precision references.
 *
 * For every differentiable op there are three checks: the float kernel's forward against a naive
 * double forward, the float kernel's backward against a naive double backward written from the
 * formulas, and that naive backward against double central differences of L = Σ w∘out with random
 * w (so the formulas themselves are checked, not only the kernel's agreement with them). Kernels
 * that reduce across rows are also run with 1, 2 and 3 threads and must agree bitwise, and "+="
 * outputs are checked on prefilled buffers. Sizes are odd on purpose (N = 7, C = 13, T = 37,
 * head_dim = 6) so that vector remainders and partial attention tiles are exercised. The kernels
 * ignore be->ctx, so a zeroed pt_backend serves.
 */
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/ops.h"
#include "pt/context_parallel.h"
#include "pt/model.h"
#include "testutil.h"

#define TOL_FWD 1e-5  /* float kernel vs double reference */
#define TOL_BWD 1e-5  /* float kernel backward vs double backward formulas */
#define TOL_FD 1e-6   /* double backward formulas vs double central differences */
#define FD_STEP 1e-5

static pt_backend be; /* zeroed: the kernels need no context */

/* ---------------------------------------------------------------------------------------------
 * helpers */

static float *fvec(size_t n, uint64_t seed, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    tu_fill(x, n, seed, scale);
    return x;
}

static double *dvec(size_t n) { return calloc(n ? n : 1, sizeof(double)); }

static double *to_d(const float *x, size_t n) {
    double *y = dvec(n);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static float *fcopy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double rel_dd(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (a[i] - b[i]) * (a[i] - b[i]);
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void check_bitwise(const char *what, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s: element %zu differs: %.9g vs %.9g", what, i, (double)a[i], (double)b[i]);
}

/* A differentiable function of packed double inputs x (nx) to outputs y (ny). */
typedef void (*fwd_fn)(const void *ctx, const double *x, double *y);

/* Compares grad (nx) with central differences of L(x) = Σ w∘f(x), at every input or, for large
 * inputs, at about FD_MAX_POINTS of them spread evenly (odd stride, so every part is sampled). */
#define FD_MAX_POINTS 600
static void check_fd(const char *what, fwd_fn f, const void *ctx, const double *x, size_t nx,
                     const double *w, size_t ny, const double *grad) {
    double *xp = dvec(nx), *y = dvec(ny), *fd = dvec(nx), *gs = dvec(nx);
    memcpy(xp, x, nx * sizeof(double));
    size_t stride = nx / FD_MAX_POINTS + 1, npts = 0;
    stride += stride > 1 && stride % 2 == 0;
    for (size_t i = 0; i < nx; i += stride, npts++) {
        double L[2];
        for (int s = 0; s < 2; s++) {
            xp[i] = x[i] + (s ? -FD_STEP : FD_STEP);
            f(ctx, xp, y);
            L[s] = 0;
            for (size_t o = 0; o < ny; o++) L[s] += w[o] * y[o];
        }
        xp[i] = x[i];
        fd[npts] = (L[0] - L[1]) / (2 * FD_STEP);
        gs[npts] = grad[i];
    }
    tu_check_rel(what, rel_dd(gs, fd, npts), TOL_FD);
    free(xp), free(y), free(fd), free(gs);
}

/* Thread-count tests run a kernel with 1, 2 and 3 threads and compare bitwise; 0 restores the
 * count the test started with. */
static int default_threads;
static void set_threads(int n) { omp_set_num_threads(n > 0 ? n : default_threads); }

/* ---------------------------------------------------------------------------------------------
 * embedding */

typedef struct {
    const int32_t *tok;
    int N, C, row0, rows;
} emb_ctx;

/* x = wte (rows, C) -> y (N, C) */
static void emb_fwd_d(const void *vc, const double *x, double *y) {
    const emb_ctx *c = vc;
    for (int i = 0; i < c->N; i++) {
        int t = c->tok[i] - c->row0;
        for (int j = 0; j < c->C; j++)
            y[i * c->C + j] = (t >= 0 && t < c->rows) ? x[t * c->C + j] : 0.0;
    }
}

static void emb_bwd_d(const emb_ctx *c, const double *dy, double *dx) {
    for (int i = 0; i < c->N; i++) {
        int t = c->tok[i] - c->row0;
        if (t < 0 || t >= c->rows) continue;
        for (int j = 0; j < c->C; j++) dx[t * c->C + j] += dy[i * c->C + j];
    }
}

static void test_embedding_matches_reference_with_vocab_shard(void **state) {
    (void)state;
    /* a shard owning rows [3, 8) of a vocabulary of 10: tokens hit its first row twice, its last
     * row, and fall just below (2) and just above (8) it */
    enum { N = 7, C = 13, ROW0 = 3, ROWS = 5 };
    const int32_t tok[N] = {3, 9, 5, 3, 2, 8, 7};
    emb_ctx c = {tok, N, C, ROW0, ROWS};
    float *wte = fvec(ROWS * C, 1, 1.0f), out[N * C];
    pt_cpu_embedding_forward(&be, out, tok, wte, N, C, ROW0, ROWS);
    double *x = to_d(wte, ROWS * C), *y = dvec(N * C);
    emb_fwd_d(&c, x, y);
    tu_check_rel("embedding forward", tu_rel_err_d(out, y, N * C), 0.0);

    float *dout = fvec(N * C, 2, 1.0f), *dwte = fvec(ROWS * C, 3, 1.0f);
    double *ref = to_d(dwte, ROWS * C), *dd = to_d(dout, N * C), *g = dvec(ROWS * C);
    pt_cpu_embedding_backward(&be, dwte, tok, dout, N, C, ROW0, ROWS);
    emb_bwd_d(&c, dd, ref); /* onto the prefilled values: += */
    tu_check_rel("embedding backward +=", tu_rel_err_d(dwte, ref, ROWS * C), TOL_BWD);
    emb_bwd_d(&c, dd, g);
    check_fd("embedding backward formula", emb_fwd_d, &c, x, ROWS * C, dd, N * C, g);
    free(wte), free(x), free(y), free(dout), free(dwte), free(ref), free(dd), free(g);
}

static void test_embedding_backward_is_thread_count_independent(void **state) {
    (void)state;
    /* many repeats of few tokens: the case where a careless split would race or reorder */
    enum { N = 4099, C = 200, ROWS = 11 };
    int32_t *tok = malloc(N * sizeof(int32_t));
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % ROWS;
    float *dout = fvec((size_t)N * C, 4, 1.0f), *r[3];
    for (int t = 0; t < 3; t++) {
        r[t] = fvec(ROWS * C, 5, 1.0f);
        set_threads(t + 1);
        pt_cpu_embedding_backward(&be, r[t], tok, dout, N, C, 0, ROWS);
    }
    set_threads(0);
    check_bitwise("embedding backward 1 vs 2 threads", r[0], r[1], ROWS * C);
    check_bitwise("embedding backward 1 vs 3 threads", r[0], r[2], ROWS * C);
    free(tok), free(dout), free(r[0]), free(r[1]), free(r[2]);
}

/* ---------------------------------------------------------------------------------------------
 * RMSNorm */

typedef struct {
    int N, C;
    double eps;
} rms_ctx;

/* x = [inp (N,C) | w (C)] -> y (N,C) */
static void rms_fwd_d(const void *vc, const double *x, double *y) {
    const rms_ctx *c = vc;
    const double *w = x + c->N * c->C;
    for (int i = 0; i < c->N; i++) {
        const double *a = x + i * c->C;
        double ss = 0;
        for (int j = 0; j < c->C; j++) ss += a[j] * a[j];
        double r = 1.0 / sqrt(ss / c->C + c->eps);
        for (int j = 0; j < c->C; j++) y[i * c->C + j] = w[j] * a[j] * r;
    }
}

/* dy (N,C) -> dx = [dinp | dw] (+=) */
static void rms_bwd_d(const rms_ctx *c, const double *x, const double *dy, double *dx) {
    const int N = c->N, C = c->C;
    const double *w = x + N * C;
    for (int i = 0; i < N; i++) {
        const double *a = x + i * C, *g = dy + i * C;
        double ss = 0, dot = 0;
        for (int j = 0; j < C; j++) ss += a[j] * a[j], dot += g[j] * w[j] * a[j];
        double r = 1.0 / sqrt(ss / C + c->eps);
        for (int j = 0; j < C; j++) {
            dx[i * C + j] += r * w[j] * g[j] - r * r * r / C * a[j] * dot;
            dx[N * C + j] += g[j] * a[j] * r;
        }
    }
}

static void test_rmsnorm_matches_reference(void **state) {
    (void)state;
    enum { N = 7, C = 13 };
    const float eps = 1e-5f;
    rms_ctx c = {N, C, eps};
    float *inp = fvec(N * C, 10, 2.0f), *w = fvec(C, 11, 1.0f), out[N * C], rstd[N];
    pt_cpu_rmsnorm_forward(&be, out, rstd, inp, w, N, C, eps);
    double *x = dvec(N * C + C), *y = dvec(N * C), rref[N];
    for (int i = 0; i < N * C; i++) x[i] = inp[i];
    for (int j = 0; j < C; j++) x[N * C + j] = w[j];
    rms_fwd_d(&c, x, y);
    for (int i = 0; i < N; i++) {
        double ss = 0;
        for (int j = 0; j < C; j++) ss += x[i * C + j] * x[i * C + j];
        rref[i] = 1.0 / sqrt(ss / C + eps);
    }
    tu_check_rel("rmsnorm forward", tu_rel_err_d(out, y, N * C), TOL_FWD);
    tu_check_rel("rmsnorm rstd", tu_rel_err_d(rstd, rref, N), TOL_FWD);

    /* backward onto prefilled gradients (+=) */
    float *dout = fvec(N * C, 12, 1.0f), *dinp = fvec(N * C, 13, 1.0f), *dw = fvec(C, 14, 1.0f);
    double *dd = to_d(dout, N * C), *ref = dvec(N * C + C), *g = dvec(N * C + C);
    for (int i = 0; i < N * C; i++) ref[i] = dinp[i];
    for (int j = 0; j < C; j++) ref[N * C + j] = dw[j];
    pt_cpu_rmsnorm_backward(&be, dinp, dw, dout, inp, w, rstd, N, C);
    rms_bwd_d(&c, x, dd, ref);
    tu_check_rel("rmsnorm dinp", tu_rel_err_d(dinp, ref, N * C), TOL_BWD);
    tu_check_rel("rmsnorm dw", tu_rel_err_d(dw, ref + N * C, C), TOL_BWD);
    rms_bwd_d(&c, x, dd, g);
    check_fd("rmsnorm backward formula", rms_fwd_d, &c, x, N * C + C, dd, N * C, g);
    free(inp), free(w), free(x), free(y), free(dout), free(dinp), free(dw), free(dd), free(ref),
        free(g);
}

static void test_rmsnorm_backward_is_thread_count_independent(void **state) {
    (void)state;
    enum { N = 517, C = 259 };
    float *inp = fvec(N * C, 15, 1.0f), *w = fvec(C, 16, 1.0f), *dout = fvec(N * C, 17, 1.0f);
    float *out = fvec(N * C, 0, 0.0f), rstd[N], *dinp[3], *dw[3];
    pt_cpu_rmsnorm_forward(&be, out, rstd, inp, w, N, C, 1e-6f);
    for (int t = 0; t < 3; t++) {
        dinp[t] = fvec(N * C, 0, 0.0f), dw[t] = fvec(C, 0, 0.0f);
        set_threads(t + 1);
        pt_cpu_rmsnorm_backward(&be, dinp[t], dw[t], dout, inp, w, rstd, N, C);
    }
    set_threads(0);
    for (int t = 1; t < 3; t++) {
        check_bitwise("rmsnorm dinp vs 1 thread", dinp[0], dinp[t], N * C);
        check_bitwise("rmsnorm dw vs 1 thread", dw[0], dw[t], C);
    }
    free(inp), free(w), free(dout), free(out);
    for (int t = 0; t < 3; t++) free(dinp[t]), free(dw[t]);
}

/* ---------------------------------------------------------------------------------------------
 * RoPE */

typedef struct {
    const int32_t *pos;
    int N, H, hd, ld;
    const float *cs, *sn;
} rope_ctx;

/* Hugging Face tables: inv_freq[i] = theta^(−2i/hd), angle = pos·inv_freq. */
static void rope_tables(float *cs, float *sn, int max_pos, int hd) {
    for (int p = 0; p < max_pos; p++)
        for (int i = 0; i < hd / 2; i++) {
            double a = p * pow(10000.0, -2.0 * i / hd);
            cs[p * hd / 2 + i] = (float)cos(a);
            sn[p * hd / 2 + i] = (float)sin(a);
        }
}

/* x (N, ld) -> y (N, ld); sgn = −1 applies the transpose */
static void rope_apply_d(const rope_ctx *c, const double *x, double *y, double sgn) {
    const int half = c->hd / 2;
    memcpy(y, x, sizeof(double) * c->N * c->ld);
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < half; i++) {
                double co = c->cs[c->pos[n] * half + i], s = sgn * c->sn[c->pos[n] * half + i];
                const double *a = x + n * c->ld + h * c->hd;
                double *b = y + n * c->ld + h * c->hd;
                b[i] = a[i] * co - a[i + half] * s;
                b[i + half] = a[i + half] * co + a[i] * s;
            }
}

static void rope_fwd_d(const void *vc, const double *x, double *y) { rope_apply_d(vc, x, y, 1.0); }

static void test_rope_matches_reference_and_inverse_is_transpose(void **state) {
    (void)state;
    /* 3 heads of 6 in rows of 23 (the last 5 columns belong to someone else) */
    enum { N = 7, H = 3, HD = 6, LD = 23, MAXP = 50 };
    const int32_t pos[N] = {0, 1, 2, 17, 49, 3, 33};
    float cs[MAXP * HD / 2], sn[MAXP * HD / 2];
    rope_tables(cs, sn, MAXP, HD);
    rope_ctx c = {pos, N, H, HD, LD, cs, sn};
    float *x = fvec(N * LD, 20, 1.0f), *y = fcopy(x, N * LD);
    pt_cpu_rope(&be, y, pos, N, H, HD, LD, cs, sn, 0);
    double *xd = to_d(x, N * LD), *yd = dvec(N * LD);
    rope_fwd_d(&c, xd, yd);
    tu_check_rel("rope forward", tu_rel_err_d(y, yd, N * LD), TOL_FWD);
    for (int n = 0; n < N; n++)
        for (int j = H * HD; j < LD; j++)
            assert_float_equal(y[n * LD + j], x[n * LD + j], 0.0f); /* untouched */

    /* inverse = backward: the kernel against the transpose, and the transpose against FD */
    float *dy = fvec(N * LD, 21, 1.0f), *dx = fcopy(dy, N * LD);
    pt_cpu_rope(&be, dx, pos, N, H, HD, LD, cs, sn, 1);
    double *dyd = to_d(dy, N * LD), *g = dvec(N * LD);
    rope_apply_d(&c, dyd, g, -1.0);
    tu_check_rel("rope inverse", tu_rel_err_d(dx, g, N * LD), TOL_BWD);
    check_fd("rope inverse is the backward", rope_fwd_d, &c, xd, N * LD, dyd, N * LD, g);

    /* and undoes the forward */
    pt_cpu_rope(&be, y, pos, N, H, HD, LD, cs, sn, 1);
    tu_check_rel("rope inverse(forward(x)) = x", tu_rel_err(y, x, N * LD), TOL_FWD);
    free(x), free(y), free(xd), free(yd), free(dy), free(dx), free(dyd), free(g);
}

/* ---------------------------------------------------------------------------------------------
 * SwiGLU */

typedef struct {
    int N, F;
} swiglu_ctx;

/* x = gu (N, 2F) -> y (N, F) */
static void swiglu_fwd_d(const void *vc, const double *x, double *y) {
    const swiglu_ctx *c = vc;
    for (int i = 0; i < c->N; i++)
        for (int j = 0; j < c->F; j++) {
            double g = x[i * 2 * c->F + j], u = x[i * 2 * c->F + c->F + j];
            y[i * c->F + j] = g / (1 + exp(-g)) * u;
        }
}

static void swiglu_bwd_d(const swiglu_ctx *c, const double *x, const double *dy, double *dx) {
    for (int i = 0; i < c->N; i++)
        for (int j = 0; j < c->F; j++) {
            double g = x[i * 2 * c->F + j], u = x[i * 2 * c->F + c->F + j];
            double s = 1 / (1 + exp(-g)), d = dy[i * c->F + j];
            dx[i * 2 * c->F + j] = d * u * (s + g * s * (1 - s));
            dx[i * 2 * c->F + c->F + j] = d * g * s;
        }
}

static void test_swiglu_matches_reference(void **state) {
    (void)state;
    enum { N = 7, F = 13 };
    swiglu_ctx c = {N, F};
    float *gu = fvec(N * 2 * F, 30, 4.0f), h[N * F];
    gu[0] = -30.0f, gu[1] = 30.0f; /* saturated gates */
    pt_cpu_swiglu_forward(&be, h, gu, N, F);
    double *x = to_d(gu, N * 2 * F), *y = dvec(N * F);
    swiglu_fwd_d(&c, x, y);
    tu_check_rel("swiglu forward", tu_rel_err_d(h, y, N * F), TOL_FWD);

    float *dh = fvec(N * F, 31, 1.0f), *dgu = fvec(N * 2 * F, 32, 1.0f); /* overwritten */
    pt_cpu_swiglu_backward(&be, dgu, dh, gu, N, F);
    double *dd = to_d(dh, N * F), *g = dvec(N * 2 * F);
    swiglu_bwd_d(&c, x, dd, g);
    tu_check_rel("swiglu backward", tu_rel_err_d(dgu, g, N * 2 * F), TOL_BWD);
    check_fd("swiglu backward formula", swiglu_fwd_d, &c, x, N * 2 * F, dd, N * F, g);
    /* in place (dgu = gu: the MoE layer's bf16 path), bit for bit the same */
    float *inplace = fvec(N * 2 * F, 30, 4.0f);
    inplace[0] = -30.0f, inplace[1] = 30.0f;
    pt_cpu_swiglu_backward(&be, inplace, dh, inplace, N, F);
    assert_memory_equal(inplace, dgu, sizeof(float) * N * 2 * F);
    free(gu), free(x), free(y), free(dh), free(dgu), free(dd), free(g), free(inplace);
}

/* rows_copy gathers rows of any element type: bf16 rows byte for byte, and fp32 rows as
 * rows_gather without scales does (indices repeated, out of order) */
static void test_rows_copy_gathers_rows_of_any_type(void **state) {
    (void)state;
    enum { R = 5, n = 9, C = 13 };
    const int32_t idx[n] = {4, 0, 0, 3, 1, 4, 2, 2, 0};
    float *src = fvec(R * C, 40, 2.0f), got[n * C], want[n * C];
    pt_bf16 src16[R * C], got16[n * C];
    for (int i = 0; i < R * C; i++) src16[i] = pt_bf16_round(src[i]);
    pt_cpu_rows_copy(&be, got16, src16, idx, n, C * sizeof(pt_bf16));
    for (int i = 0; i < n; i++)
        assert_memory_equal(got16 + i * C, src16 + idx[i] * C, C * sizeof(pt_bf16));
    pt_cpu_rows_copy(&be, got, src, idx, n, C * sizeof(float));
    pt_cpu_rows_gather(&be, want, src, idx, NULL, n, C);
    assert_memory_equal(got, want, sizeof got);
    free(src);
}

static void test_expf_is_accurate_over_the_float_range(void **state) {
    (void)state;
    double worst = 0;
    for (float x = -87.0f; x < 88.5f; x += 0.001953125f * 1.37f) {
        double ref = exp((double)x), got = pt_cpu_expf(x);
        double e = fabs(got - ref) / ref;
        worst = e > worst ? e : worst;
    }
    /* 2 ulp of float is 2.4e-7 */
    tu_check_rel("expf relative error", worst, 2.5e-7);
    assert_true(pt_cpu_expf(-INFINITY) == 0.0f);
    assert_true(pt_cpu_expf(-104.0f) == 0.0f);
    assert_true(isinf(pt_cpu_expf(89.0f)));
    assert_true(isnan(pt_cpu_expf(NAN)));
    assert_true(pt_cpu_expf(0.0f) == 1.0f);
}

/* ---------------------------------------------------------------------------------------------
 * softmax cross-entropy */

typedef struct {
    const int32_t *tgt;
    int n, V;
} xent_ctx;

/* x = logits (n, V) -> y = losses (n) */
static void xent_fwd_d(const void *vc, const double *x, double *y) {
    const xent_ctx *c = vc;
    for (int i = 0; i < c->n; i++) {
        const double *r = x + i * c->V;
        double mx = r[0], s = 0;
        for (int j = 1; j < c->V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < c->V; j++) s += exp(r[j] - mx);
        y[i] = c->tgt[i] < 0 ? 0.0 : mx + log(s) - r[c->tgt[i]];
    }
}

/* dlogits (n, V) = dscale·(softmax − onehot), 0 rows for ignored targets */
static void xent_bwd_d(const xent_ctx *c, const double *x, double dscale, double *dx) {
    for (int i = 0; i < c->n; i++) {
        const double *r = x + i * c->V;
        double mx = r[0], s = 0;
        for (int j = 1; j < c->V; j++) mx = r[j] > mx ? r[j] : mx;
        for (int j = 0; j < c->V; j++) s += exp(r[j] - mx);
        for (int j = 0; j < c->V; j++)
            dx[i * c->V + j] =
                c->tgt[i] < 0 ? 0.0 : dscale * (exp(r[j] - mx) / s - (j == c->tgt[i]));
    }
}

static void test_softmax_xent_matches_reference_with_ignored_rows(void **state) {
    (void)state;
    enum { n = 7, V = 37, LD = 40 };
    const int32_t tgt[n] = {3, -1, 36, 0, 17, -1, 5};
    const float dscale = 0.37f;
    xent_ctx c = {tgt, n, V};
    float *logits = fvec(n * LD, 40, 5.0f), losses[n];
    for (int j = 0; j < V; j++) logits[2 * LD + j] += 1000.0f; /* stability: a shifted row */
    double *x = dvec(n * V), *y = dvec(n), *g = dvec(n * V), w[n];
    for (int i = 0; i < n; i++) {
        w[i] = dscale;
        for (int j = 0; j < V; j++) x[i * V + j] = logits[i * LD + j];
    }
    float pad[n * (LD - V)]; /* the columns past V must be left alone */
    for (int i = 0; i < n; i++)
        memcpy(pad + i * (LD - V), logits + i * LD + V, sizeof(float) * (LD - V));
    pt_cpu_softmax_xent(&be, logits, losses, tgt, n, V, LD, dscale);
    xent_fwd_d(&c, x, y);
    tu_check_rel("softmax_xent losses", tu_rel_err_d(losses, y, n), TOL_FWD);
    assert_float_equal(losses[1], 0.0f, 0.0f);
    xent_bwd_d(&c, x, dscale, g);
    float got[n * V];
    for (int i = 0; i < n; i++) {
        memcpy(got + i * V, logits + i * LD, sizeof(float) * V);
        for (int j = 0; j < LD - V; j++)
            assert_float_equal(logits[i * LD + V + j], pad[i * (LD - V) + j], 0.0f);
    }
    tu_check_rel("softmax_xent gradient", tu_rel_err_d(got, g, n * V), TOL_BWD);
    for (int j = 0; j < V; j++) assert_float_equal(got[5 * V + j], 0.0f, 0.0f);
    check_fd("softmax_xent gradient formula", xent_fwd_d, &c, x, n * V, w, n, g);
    free(logits), free(x), free(y), free(g);
}

/* ---------------------------------------------------------------------------------------------
 * vector helpers */

static void test_add_scale_sum_sumsq_match_reference(void **state) {
    (void)state;
    const size_t n = 100003; /* several parallel chunks and a vector remainder */
    float *x = fvec(n, 50, 1.0f), *y = fvec(n, 51, 1.0f);
    double *ref = dvec(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)y[i] + x[i];
    pt_cpu_add(&be, y, x, n);
    tu_check_rel("add", tu_rel_err_d(y, ref, n), TOL_FWD);

    double ss = 0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double got_ss = pt_cpu_sumsq(&be, x, n);
    /* double accumulation: agreement to far better than float */
    tu_check_rel("sumsq", fabs(got_ss - ss) / ss, 1e-12);
    assert_true(pt_cpu_sumsq(&be, x, 0) == 0.0);
    double s5 = 0;
    for (int i = 0; i < 5; i++) s5 += (double)x[i] * x[i];
    assert_true(fabs(pt_cpu_sumsq(&be, x, 5) - s5) <= 1e-15 * s5);
    free(x), free(y), free(ref);
}

static void test_sumsq_is_thread_count_independent(void **state) {
    (void)state;
    const size_t n = 3000017;
    float *x = fvec(n, 52, 1.0f);
    double ss[3];
    for (int t = 0; t < 3; t++) {
        set_threads(t + 1);
        ss[t] = pt_cpu_sumsq(&be, x, n);
    }
    set_threads(0);
    for (int t = 1; t < 3; t++) {
        if (memcmp(&ss[0], &ss[t], sizeof(double)) != 0)
            fail_msg("sumsq with %d threads %.17g vs 1 thread %.17g", t + 1, ss[t], ss[0]);
    }
    free(x);
}

/* ---------------------------------------------------------------------------------------------
 * AdamW */

static void test_adamw_matches_double_reference_over_steps(void **state) {
    (void)state;
    enum { n = 37, STEPS = 5 };
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = fvec(n, 60, 1.0f), m[n] = {0}, v[n] = {0};
    double pd[n], md[n] = {0}, vd[n] = {0};
    for (int i = 0; i < n; i++) pd[i] = p[i];
    for (int step = 1; step <= STEPS; step++) {
        float *g = fvec(n, 61 + step, 0.5f);
        g[step] = 0.0f; /* a zero gradient: v and m must still decay */
        /* a clipping factor folded into the update: the gradient is g·0.7 rounded to float */
        pt_cpu_adamw(&be, p, g, m, v, n, lr, b1, b2, eps, wd, step, 0.7f);
        for (int i = 0; i < n; i++) g[i] = g[i] * 0.7f;
        double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
        for (int i = 0; i < n; i++) {
            pd[i] *= 1 - (double)lr * wd;
            md[i] = b1 * md[i] + (1 - (double)b1) * g[i];
            vd[i] = b2 * vd[i] + (1 - (double)b2) * g[i] * g[i];
            pd[i] -= lr / bc1 * md[i] / (sqrt(vd[i]) / sqrt(bc2) + eps);
        }
        free(g);
    }
    tu_check_rel("adamw p", tu_rel_err_d(p, pd, n), TOL_FWD);
    tu_check_rel("adamw m", tu_rel_err_d(m, md, n), TOL_FWD);
    tu_check_rel("adamw v", tu_rel_err_d(v, vd, n), TOL_FWD);
    free(p);
}

static void test_adamw_vector_body_and_scalar_tail_agree_bitwise(void **state) {
    (void)state;
    /* n = 37: the AVX-512 body takes 32 elements and the scalar loop 5; one element at a time
     * everything goes through the scalar loop, which spells out PyTorch's order of operations */
    enum { n = 37 };
    float *p = fvec(n, 70, 1.0f), *g = fvec(n, 71, 0.1f), *m = fvec(n, 72, 0.01f);
    float *v = fvec(n, 73, 0.001f);
    for (int i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *p1 = fcopy(p, n), *m1 = fcopy(m, n), *v1 = fcopy(v, n);
    pt_cpu_adamw(&be, p, g, m, v, n, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7, 0.9f);
    for (int i = 0; i < n; i++)
        pt_cpu_adamw(&be, p1 + i, g + i, m1 + i, v1 + i, 1, 1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 7, 0.9f);
    check_bitwise("adamw p", p, p1, n);
    check_bitwise("adamw m", m, m1, n);
    check_bitwise("adamw v", v, v1, n);
    free(p), free(g), free(m), free(v), free(p1), free(m1), free(v1);
}

/* ---------------------------------------------------------------------------------------------
 * fp32 <-> bf16 */

/* bf16 round to nearest even of a non-NaN float, from its value rather than its bits: scale to
 * 8 significant bits (bf16's denormals keep fp32's exponent floor, −126), nearbyint (ties to
 * even), scale back; 2^128 becomes inf when cast to float. */
static pt_bf16 bf16_oracle(float x) {
    if (x == 0.0f || isinf(x)) return (pt_bf16)(tu_f32_bits(x) >> 16);
    int e = ilogb(x) < -126 ? -126 : ilogb(x);
    double y = ldexp(nearbyint(ldexp((double)x, 7 - e)), e - 7);
    return (pt_bf16)(tu_f32_bits((float)y) >> 16);
}

/* Every sign, exponent (denormals, inf and NaN included) and upper 7 mantissa bits, each with
 * the lower 16 bits at and around the rounding tie; then bit patterns spread over the whole
 * space and random ones. Returns the count written into u. */
static size_t bf16_test_patterns(uint32_t *u) {
    static const uint32_t low[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff};
    size_t n = 0;
    for (uint32_t hi = 0; hi < 0x10000; hi++)
        for (size_t j = 0; j < sizeof low / sizeof low[0]; j++) u[n++] = hi << 16 | low[j];
    for (uint32_t i = 0; i < 1u << 20; i++) u[n++] = i * 4099u;
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < 1 << 20; i++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        u[n++] = (uint32_t)(r >> 16);
    }
    return n;
}

static void test_bf16_conversion_rounds_to_nearest_even_on_both_paths(void **state) {
    (void)state;
    uint32_t *u = malloc(sizeof(uint32_t) * (7 * 65536 + (2 << 20)));
    const size_t n = bf16_test_patterns(u);
    float *x = malloc(sizeof(float) * n);
    pt_bf16 *ref = malloc(2 * n), *fast = malloc(2 * n), *slot = malloc(2 * n);
    for (size_t i = 0; i < n; i++) x[i] = tu_f32_from_bits(u[i]);
    pt_cpu_to_bf16_portable(ref, x, n);
    for (size_t i = 0; i < n; i++) {
        const pt_bf16 want = isnan(x[i]) ? (pt_bf16)(u[i] >> 16 | 0x40) : bf16_oracle(x[i]);
        if (ref[i] != want)
            fail_msg("portable bf16(0x%08X) = 0x%04X, expected 0x%04X", u[i], ref[i], want);
    }
    /* worked by hand: ties to even (1 + 2^-8 down, 1 + 3·2^-8 up, the denormal tie 0x00018000
     * up to 0x0002, 0x00008000 down to 0), the largest float up to inf, −denormal max up to
     * −2^-126, a signalling NaN made quiet */
    const uint32_t in[] = {0x3F808000u, 0x3F818000u, 0x00018000u, 0x00008000u,
                           0x7F7FFFFFu, 0x807FFFFFu, 0x7F800001u, 0xFF800000u};
    const pt_bf16 want[] = {0x3F80, 0x3F82, 0x0002, 0x0000, 0x7F80, 0x8080, 0x7FC0, 0xFF80};
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++)
        assert_int_equal(pt_bf16_round(tu_f32_from_bits(in[i])), want[i]);

    if (pt_cpu_to_bf16_native(fast, x, n)) {
        for (size_t i = 0; i < n; i++)
            if (fast[i] != ref[i])
                fail_msg("AVX512-BF16 bf16(0x%08X) = 0x%04X, portable 0x%04X", u[i], fast[i],
                         ref[i]);
        for (size_t m = 0; m <= 17; m++) { /* short tails: masked loads and stores */
            memset(fast, 0xAB, 40);
            assert_true(pt_cpu_to_bf16_native(fast, x + 3, m));
            assert_memory_equal(fast, ref + 3, 2 * m);
            assert_int_equal(fast[m], 0xABAB);
        }
    } else {
        print_message("no AVX512-BF16 on this CPU: only the portable path tested\n");
    }
    for (int t = 1; t <= 2; t++) { /* the slot: blocks over threads, a ragged end */
        set_threads(t);
        memset(slot, 0, 2 * n);
        pt_cpu_to_bf16(&be, slot, x, n);
        assert_memory_equal(slot, ref, 2 * n);
    }
    set_threads(0);
    free(u), free(x), free(ref), free(fast), free(slot);
}

static void test_bf16_to_float_is_exact(void **state) {
    (void)state;
    enum { N = 65536 };
    pt_bf16 *h = malloc(2 * N), *back = malloc(2 * N);
    float *f = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++) h[i] = (pt_bf16)i;
    pt_cpu_from_bf16(&be, f, h, N);
    pt_cpu_to_bf16(&be, back, f, N);
    for (int i = 0; i < N; i++) {
        assert_int_equal(tu_f32_bits(f[i]), (uint32_t)i << 16);
        assert_int_equal(back[i], isnan(f[i]) ? (pt_bf16)(i | 0x40) : (pt_bf16)i);
    }
    free(h), free(back), free(f);
}

/* ---------------------------------------------------------------------------------------------
 * attention */

typedef struct {
    int B, Tq, Tk, H, Hkv, hd;
    const int32_t *qp, *kp;
    const int32_t *lo; /* documents: (B, Tq) first visible key position of each query, or NULL */
} attn_ctx;

/* Sizes of the packed double layout [q (B,Tq,H,hd) | k (B,Tk,Hkv,hd) | v (same)]. */
static size_t nq_of(const attn_ctx *c) { return (size_t)c->B * c->Tq * c->H * c->hd; }
static size_t nk_of(const attn_ctx *c) { return (size_t)c->B * c->Tk * c->Hkv * c->hd; }

#define QI(b, i, h, d) ((((size_t)(b) * c->Tq + (i)) * c->H + (h)) * c->hd + (d))
#define KI(b, j, g, d) ((((size_t)(b) * c->Tk + (j)) * c->Hkv + (g)) * c->hd + (d))

/* Probabilities of query (b, i, h) over all keys into p (Tk); returns lse (−∞ if none). */
static double attn_probs_d(const attn_ctx *c, const double *q, const double *k, int b, int i,
                           int h, double *p) {
    const int g = h / (c->H / c->Hkv);
    const double scale = 1.0 / sqrt((double)c->hd);
    double mx = -INFINITY;
    for (int j = 0; j < c->Tk; j++) {
        if (c->kp[j] > c->qp[i] || (c->lo && c->kp[j] < c->lo[(size_t)b * c->Tq + i])) {
            p[j] = -INFINITY;
            continue;
        }
        double s = 0;
        for (int d = 0; d < c->hd; d++) s += q[QI(b, i, h, d)] * k[KI(b, j, g, d)];
        p[j] = s * scale;
        mx = p[j] > mx ? p[j] : mx;
    }
    if (mx == -INFINITY) {
        for (int j = 0; j < c->Tk; j++) p[j] = 0;
        return -INFINITY;
    }
    double sum = 0;
    for (int j = 0; j < c->Tk; j++) sum += p[j] = exp(p[j] - mx);
    for (int j = 0; j < c->Tk; j++) p[j] /= sum;
    return mx + log(sum);
}

/* x = [q | k | v] -> y = out (B,Tq,H,hd); lse (B,H,Tq) if not NULL */
static void attn_fwd_full_d(const attn_ctx *c, const double *x, double *y, double *lse) {
    const double *q = x, *k = x + nq_of(c), *v = k + nk_of(c);
    double *p = dvec(c->Tk);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                const int g = h / (c->H / c->Hkv);
                double l = attn_probs_d(c, q, k, b, i, h, p);
                if (lse) lse[((size_t)b * c->H + h) * c->Tq + i] = l;
                for (int d = 0; d < c->hd; d++) {
                    double o = 0;
                    for (int j = 0; j < c->Tk; j++) o += p[j] * v[KI(b, j, g, d)];
                    y[QI(b, i, h, d)] = o;
                }
            }
    free(p);
}

static void attn_fwd_d(const void *vc, const double *x, double *y) {
    attn_fwd_full_d(vc, x, y, NULL);
}

/* dout (B,Tq,H,hd) -> dx = [dq | dk | dv] (+=), by the formulas
 * dv_j = Σ_i p_ij·do_i, dp_ij = do_i·v_j, ds_ij = p_ij·(dp_ij − Σ_j' p_ij'·dp_ij'),
 * dq_i = scale·Σ_j ds_ij·k_j, dk_j = scale·Σ_i ds_ij·q_i. */
static void attn_bwd_d(const attn_ctx *c, const double *x, const double *dout, double *dx) {
    const double *q = x, *k = x + nq_of(c), *v = k + nk_of(c);
    double *dq = dx, *dk = dx + nq_of(c), *dv = dk + nk_of(c);
    const double scale = 1.0 / sqrt((double)c->hd);
    double *p = dvec(c->Tk), *dp = dvec(c->Tk);
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                const int g = h / (c->H / c->Hkv);
                attn_probs_d(c, q, k, b, i, h, p);
                double D = 0;
                for (int j = 0; j < c->Tk; j++) {
                    dp[j] = 0;
                    for (int d = 0; d < c->hd; d++)
                        dp[j] += dout[QI(b, i, h, d)] * v[KI(b, j, g, d)];
                    D += p[j] * dp[j];
                }
                for (int j = 0; j < c->Tk; j++) {
                    double ds = p[j] * (dp[j] - D);
                    for (int d = 0; d < c->hd; d++) {
                        dv[KI(b, j, g, d)] += p[j] * dout[QI(b, i, h, d)];
                        dq[QI(b, i, h, d)] += scale * ds * k[KI(b, j, g, d)];
                        dk[KI(b, j, g, d)] += scale * ds * q[QI(b, i, h, d)];
                    }
                }
            }
    free(p), free(dp);
}

/* Float tensors in the kernel's layout: q, out, dout (B,Tq) rows at ldq; k, v (B,Tk) rows at ldk.
 * With fused = 1, q, k and v are column views of one (B·T, (H + 2·Hkv)·hd) buffer, the way a
 * fused QKV projection lays them out (requires Tq = Tk). */
typedef struct {
    pt_attn_shape s;
    float *q, *k, *v, *buf, *out, *lse, *dout;
} attn_data;

static void attn_data_init(attn_data *a, const attn_ctx *c, int fused, uint64_t seed) {
    memset(a, 0, sizeof *a);
    const int qw = c->H * c->hd, kw = c->Hkv * c->hd;
    a->s = (pt_attn_shape){.B = c->B, .Tq = c->Tq, .Tk = c->Tk, .n_heads = c->H,
                           .n_kv_heads = c->Hkv, .head_dim = c->hd, .q_pos = c->qp,
                           .k_pos = c->kp, .q_lo = c->lo, .scale = 1.0f / sqrtf((float)c->hd)};
    if (fused) {
        const int ld = qw + 2 * kw;
        a->buf = fvec((size_t)c->B * c->Tq * ld, seed, 1.0f);
        a->q = a->buf, a->k = a->buf + qw, a->v = a->buf + qw + kw;
        a->s.ldq = a->s.ldk = a->s.ldv = ld;
    } else {
        a->q = fvec(nq_of(c), seed, 1.0f);
        a->k = fvec(nk_of(c), seed + 1, 1.0f);
        a->v = fvec(nk_of(c), seed + 2, 1.0f);
        a->s.ldq = qw, a->s.ldk = a->s.ldv = kw;
    }
    a->s.ldo = qw;
    a->out = fvec(nq_of(c), 0, 0.0f);
    a->lse = fvec((size_t)c->B * c->H * c->Tq, 0, 0.0f);
    a->dout = fvec(nq_of(c), seed + 3, 1.0f);
}

static void attn_data_free(attn_data *a) {
    if (a->buf) free(a->buf);
    else free(a->q), free(a->k), free(a->v);
    free(a->out), free(a->lse), free(a->dout);
}

/* Packs strided float tensors (rows of width w at stride ld) into the dense double layout. */
static void pack_d(double *dst, const float *src, size_t rows, int w, int ld) {
    for (size_t r = 0; r < rows; r++)
        for (int j = 0; j < w; j++) dst[r * w + j] = src[r * ld + j];
}
static void unpack_f(float *dst, const float *src, size_t rows, int w, int ld) {
    for (size_t r = 0; r < rows; r++) memcpy(dst + r * w, src + r * ld, sizeof(float) * w);
}

static double *attn_pack_inputs(const attn_data *a, const attn_ctx *c) {
    double *x = dvec(nq_of(c) + 2 * nk_of(c));
    const int qw = c->H * c->hd, kw = c->Hkv * c->hd;
    pack_d(x, a->q, (size_t)c->B * c->Tq, qw, a->s.ldq);
    pack_d(x + nq_of(c), a->k, (size_t)c->B * c->Tk, kw, a->s.ldk);
    pack_d(x + nq_of(c) + nk_of(c), a->v, (size_t)c->B * c->Tk, kw, a->s.ldv);
    return x;
}

/* Runs forward and backward and checks them against the references (and, with fd, checks the
 * reference backward against finite differences). */
static void check_attention(const attn_ctx *c, int fused, int fd, const char *name) {
    attn_data a;
    attn_data_init(&a, c, fused, 100);
    const size_t nq = nq_of(c), nk = nk_of(c), nl = (size_t)c->B * c->H * c->Tq;
    const int qw = c->H * c->hd, kw = c->Hkv * c->hd;
    char what[160];

    pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, a.out, a.lse);
    double *x = attn_pack_inputs(&a, c), *y = dvec(nq), *lse = dvec(nl);
    attn_fwd_full_d(c, x, y, lse);
    snprintf(what, sizeof what, "%s: attention out", name);
    tu_check_rel(what, tu_rel_err_d(a.out, y, nq), TOL_FWD);
    /* rows without a visible key: exactly −∞ and a zero output; the others compared finite */
    double *lse_f = dvec(nl), *lse_r = dvec(nl);
    for (size_t i = 0; i < nl; i++) {
        if (isinf(lse[i]) || isinf(a.lse[i])) {
            if (!(isinf(a.lse[i]) && a.lse[i] < 0 && isinf(lse[i])))
                fail_msg("%s: lse[%zu] = %g, expected %g", name, i, (double)a.lse[i], lse[i]);
            continue;
        }
        lse_f[i] = a.lse[i], lse_r[i] = lse[i];
    }
    snprintf(what, sizeof what, "%s: attention lse", name);
    tu_check_rel(what, rel_dd(lse_f, lse_r, nl), TOL_FWD);

    /* backward into zeroed gradient buffers strided like the inputs, then a second time into
     * the same buffers: "+=" must give twice the gradient */
    float *dq = fvec(nq, 0, 0.0f), *dk = fvec(nk, 0, 0.0f), *dv = fvec(nk, 0, 0.0f);
    float *dqs = fvec((size_t)c->B * c->Tq * a.s.ldq, 0, 0.0f);
    float *dks = fvec((size_t)c->B * c->Tk * a.s.ldk, 0, 0.0f);
    float *dvs = fvec((size_t)c->B * c->Tk * a.s.ldv, 0, 0.0f);
    double *g = dvec(nq + 2 * nk), *dd = to_d(a.dout, nq);
    attn_bwd_d(c, x, dd, g);
    for (int pass = 1; pass <= 2; pass++) {
        pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, a.out, a.dout, a.lse, dqs, dks, dvs);
        unpack_f(dq, dqs, (size_t)c->B * c->Tq, qw, a.s.ldq);
        unpack_f(dk, dks, (size_t)c->B * c->Tk, kw, a.s.ldk);
        unpack_f(dv, dvs, (size_t)c->B * c->Tk, kw, a.s.ldv);
        for (size_t i = 0; i < nq; i++) dq[i] /= pass;
        for (size_t i = 0; i < nk; i++) dk[i] /= pass, dv[i] /= pass;
        snprintf(what, sizeof what, "%s: attention dq (call %d)", name, pass);
        tu_check_rel(what, tu_rel_err_d(dq, g, nq), TOL_BWD);
        snprintf(what, sizeof what, "%s: attention dk (call %d)", name, pass);
        tu_check_rel(what, tu_rel_err_d(dk, g + nq, nk), TOL_BWD);
        snprintf(what, sizeof what, "%s: attention dv (call %d)", name, pass);
        tu_check_rel(what, tu_rel_err_d(dv, g + nq + nk, nk), TOL_BWD);
    }
    /* the columns of the strided buffers outside this call's heads stay untouched */
    for (size_t r = 0; r < (size_t)c->B * c->Tq; r++)
        for (int j = qw; j < a.s.ldq; j++) assert_true(dqs[r * a.s.ldq + j] == 0.0f);

    if (fd) {
        snprintf(what, sizeof what, "%s: attention backward formula", name);
        check_fd(what, attn_fwd_d, c, x, nq + 2 * nk, dd, nq, g);
    }
    free(x), free(y), free(lse), free(lse_f), free(lse_r), free(dq), free(dk), free(dv);
    free(dqs), free(dks), free(dvs), free(g), free(dd);
    attn_data_free(&a);
}

static int32_t *positions(int n, int first) {
    int32_t *p = malloc(sizeof(int32_t) * n);
    for (int i = 0; i < n; i++) p[i] = first + i;
    return p;
}

static void test_attention_causal_gqa_matches_reference(void **state) {
    (void)state;
    int32_t *pos = positions(150, 0);
    /* T = 37: partial query tiles and one partial key tile; T = 150: several key tiles, some
     * skipped, some fully visible, some masked */
    attn_ctx c1 = {2, 37, 37, 6, 2, 6, pos, pos, NULL};
    check_attention(&c1, 0, 1, "T=37 hd=6 GQA 6/2");
    attn_ctx c2 = {2, 150, 150, 6, 3, 6, pos, pos, NULL};
    check_attention(&c2, 0, 0, "T=150 hd=6 GQA 6/3");
    attn_ctx c3 = {1, 37, 37, 3, 3, 10, pos, pos, NULL};
    check_attention(&c3, 0, 1, "T=37 hd=10 MHA");
    free(pos);
}

static void test_attention_on_fused_qkv_views_matches_reference(void **state) {
    (void)state;
    int32_t *pos = positions(131, 0);
    attn_ctx c = {2, 131, 131, 4, 2, 64, pos, pos, NULL};
    check_attention(&c, 1, 0, "fused qkv T=131 hd=64");
    free(pos);
}

static void test_attention_queries_after_keys_with_positions(void **state) {
    (void)state;
    /* a context-parallel chunk: queries at positions 40..59 against keys 0..79 */
    int32_t *qp = positions(20, 40), *kp = positions(80, 0);
    attn_ctx c = {2, 20, 80, 4, 2, 6, qp, kp, NULL};
    check_attention(&c, 0, 1, "Tq=20@40 Tk=80@0");
    attn_ctx c2 = {1, 20, 80, 2, 1, 66, qp, kp, NULL};
    check_attention(&c2, 0, 0, "Tq=20@40 Tk=80@0 hd=66");
    /* queries at 45..64: the last one sees exactly one key of the second key tile (64..79), so
     * that tile must not be skipped */
    int32_t *qp2 = positions(20, 45);
    attn_ctx c3 = {1, 20, 80, 2, 1, 6, qp2, kp, NULL};
    check_attention(&c3, 0, 0, "Tq=20@45 Tk=80@0");
    free(qp), free(kp), free(qp2);
}

static void test_attention_rows_without_visible_keys(void **state) {
    (void)state;
    /* queries at 0..39 against keys at 10..109: the first 10 rows see nothing (lse −∞, out 0,
     * no gradient), and the last key tiles are skipped */
    int32_t *qp = positions(40, 0), *kp = positions(100, 10);
    attn_ctx c = {2, 40, 100, 4, 2, 6, qp, kp, NULL};
    check_attention(&c, 0, 1, "rows without keys");
    /* every row blind: everything zero, lse −∞ */
    int32_t *late = positions(100, 1000);
    attn_ctx c2 = {1, 40, 100, 2, 2, 6, qp, late, NULL};
    check_attention(&c2, 0, 0, "no visible key at all");
    free(qp), free(kp), free(late);
}

/* Block-causal attention over documents (q_lo): each sequence cut into documents at its own
 * places, some longer than a key tile, one of length 1, so that key tiles are skipped as wholly
 * before a query tile's documents, masked where a document starts inside them, and left unmasked;
 * also a context-parallel chunk (queries later than the keys) whose documents start in the keys'
 * range. The reference masks every (query, key) pair by the formula. */
static void test_attention_documents_match_reference(void **state) {
    (void)state;
    enum { T = 150 };
    int32_t *pos = positions(T, 0);
    /* document starts per sequence: b = 0 at 0, 70, 71, 140; b = 1 at 0, 5, 100 */
    const int starts[2][5] = {{0, 70, 71, 140, -1}, {0, 5, 100, -1, -1}};
    int32_t lo[2 * T];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < T; i++) {
            int s0 = 0;
            for (int k = 0; k < 5 && starts[b][k] >= 0; k++)
                if (starts[b][k] <= i) s0 = starts[b][k];
            lo[b * T + i] = s0;
        }
    attn_ctx c = {2, T, T, 4, 2, 6, pos, pos, lo};
    check_attention(&c, 0, 0, "documents T=150");
    attn_ctx c1 = {2, 37, 37, 2, 1, 6, pos, pos, NULL};
    int32_t lo37[2 * 37];
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < 37; i++) lo37[b * 37 + i] = i < 10 + b ? 0 : i < 30 ? 10 + b : 30;
    c1.lo = lo37;
    check_attention(&c1, 1, 1, "documents T=37 fused, formula");
    /* queries 80..119 against keys 0..79: b = 0's documents start at 60 (keys 60..79 visible),
     * b = 1's rows before 100 see every key and those from 100 on see none (lse −∞) */
    int32_t *qp = positions(40, 80), *kp = positions(80, 0), lo2[80];
    for (int i = 0; i < 40; i++) lo2[i] = 60, lo2[40 + i] = 80 + i < 100 ? 0 : 100;
    attn_ctx c2 = {2, 40, 80, 4, 2, 6, qp, kp, lo2};
    check_attention(&c2, 0, 1, "documents, a later chunk");
    free(pos), free(qp), free(kp);
}

static void test_attention_is_thread_count_independent(void **state) {
    (void)state;
    int32_t *pos = positions(200, 0);
    attn_ctx c = {2, 200, 200, 4, 2, 32, pos, pos, NULL};
    float *res[3][5];
    const size_t nq = nq_of(&c), nk = nk_of(&c), nl = (size_t)c.B * c.H * c.Tq;
    for (int t = 0; t < 3; t++) {
        attn_data a;
        attn_data_init(&a, &c, 0, 300);
        float *dq = fvec(nq, 0, 0.0f), *dk = fvec(nk, 0, 0.0f), *dv = fvec(nk, 0, 0.0f);
        set_threads(t + 1);
        pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, a.out, a.lse);
        pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, a.out, a.dout, a.lse, dq, dk, dv);
        res[t][0] = fcopy(a.out, nq), res[t][1] = fcopy(a.lse, nl);
        res[t][2] = dq, res[t][3] = dk, res[t][4] = dv;
        attn_data_free(&a);
    }
    set_threads(0);
    const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
    const size_t sizes[5] = {nq, nl, nq, nk, nk};
    for (int t = 1; t < 3; t++)
        for (int i = 0; i < 5; i++) {
            char what[64];
            snprintf(what, sizeof what, "attention %s, %d threads vs 1", names[i], t + 1);
            check_bitwise(what, res[0][i], res[t][i], sizes[i]);
        }
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 5; i++) free(res[t][i]);
    free(pos);
}

/* ---------------------------------------------------------------------------------------------
 * attention with bf16 probabilities (pt_attn_shape.p_bf16) */

/* The p_bf16 reference of one (b, h) row i: p (Tk) normalised probabilities in double, p16 their
 * bf16 values, and amb (Tk) the size of the step a probability could take to the neighbouring
 * bf16 value when it lies within 1e-4 (relative) of a rounding boundary, 0 otherwise: there the
 * kernel's fp32 probability (a few fp32 ulps from p: the fp32 scores, l and lse) may round the
 * other way, and the tolerance allows it. */
static void bf16_probs_d(const double *p, int n, double *p16, double *amb) {
    for (int j = 0; j < n; j++) {
        const float lo = (float)(p[j] * (1 - 1e-4)), hi = (float)(p[j] * (1 + 1e-4));
        const double a = pt_bf16_to_float(pt_bf16_round(lo));
        const double b = pt_bf16_to_float(pt_bf16_round(hi));
        p16[j] = pt_bf16_to_float(pt_bf16_round((float)p[j]));
        amb[j] = b - a;
    }
}

/* Checks got (n) against want within tol element by element. So that the check is seen to
 * tell rounding from no rounding, got must also be much closer to want than to `other` (the
 * reference without rounding) in norm. */
static void check_within(const char *what, const float *got, const double *want,
                         const double *other, const double *tol, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(fabs(got[i] - want[i]) <= tol[i]))
            fail_msg("%s[%zu] = %.9g, expected %.9g (tolerance %.3g)", what, i, (double)got[i],
                     want[i], tol[i]);
    const double e = tu_rel_err_d(got, want, n), e32 = tu_rel_err_d(got, other, n);
    print_message("%s: relative error %.2e, %.2e against the unrounded reference\n", what, e,
                  e32);
    assert_true(e32 > 100 * e);
}

/* out, dv with P16 (and with P, for the discrimination count), their per-element tolerances:
 * fp32 accumulation of the terms, (terms + 2)·2^-24·Σ|term|, plus the ambiguous probabilities'
 * possible steps; and dq, dk with dS = P∘(dP − D), D = rowsum(dout∘out) from the kernel's out. */
typedef struct {
    double *out, *out32, *tol_out, *dv, *dv32, *tol_dv, *dq, *dk;
} attn_bf16_ref;

static void attn_bf16_reference(const attn_ctx *c, const double *x, const float *dout,
                                const float *out, attn_bf16_ref *r) {
    const double *q = x, *k = x + nq_of(c), *v = k + nk_of(c);
    const size_t nq = nq_of(c), nk = nk_of(c);
    const double scale = 1.0 / sqrt((double)c->hd);
    double *p = dvec(c->Tk), *p16 = dvec(c->Tk), *amb = dvec(c->Tk), *dp = dvec(c->Tk);
    double *mag_dv = dvec(nk);
    *r = (attn_bf16_ref){dvec(nq), dvec(nq), dvec(nq), dvec(nk), dvec(nk), dvec(nk), dvec(nq),
                         dvec(nk)};
    for (int b = 0; b < c->B; b++)
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->Tq; i++) {
                const int g = h / (c->H / c->Hkv);
                attn_probs_d(c, q, k, b, i, h, p);
                bf16_probs_d(p, c->Tk, p16, amb);
                double D = 0;
                for (int d = 0; d < c->hd; d++)
                    D += (double)dout[QI(b, i, h, d)] * out[QI(b, i, h, d)];
                for (int j = 0; j < c->Tk; j++) {
                    dp[j] = 0;
                    for (int d = 0; d < c->hd; d++)
                        dp[j] += dout[QI(b, i, h, d)] * v[KI(b, j, g, d)];
                }
                for (int d = 0; d < c->hd; d++) {
                    double o = 0, o32 = 0, mag = 0, step = 0;
                    for (int j = 0; j < c->Tk; j++) {
                        const double vj = v[KI(b, j, g, d)], dod = dout[QI(b, i, h, d)];
                        o += p16[j] * vj, o32 += p[j] * vj, mag += fabs(p16[j] * vj);
                        step += amb[j] * fabs(vj);
                        r->dv[KI(b, j, g, d)] += p16[j] * dod;
                        r->dv32[KI(b, j, g, d)] += p[j] * dod;
                        mag_dv[KI(b, j, g, d)] += fabs(p16[j] * dod);
                        r->tol_dv[KI(b, j, g, d)] += amb[j] * fabs(dod);
                    }
                    r->out[QI(b, i, h, d)] = o, r->out32[QI(b, i, h, d)] = o32;
                    r->tol_out[QI(b, i, h, d)] = (c->Tk + 2) * 0x1p-24 * mag + step;
                }
                for (int j = 0; j < c->Tk; j++) {
                    const double ds = p[j] * (dp[j] - D);
                    for (int d = 0; d < c->hd; d++) {
                        r->dq[QI(b, i, h, d)] += scale * ds * k[KI(b, j, g, d)];
                        r->dk[KI(b, j, g, d)] += scale * ds * q[QI(b, i, h, d)];
                    }
                }
            }
    const int terms = c->Tq * (c->H / c->Hkv);
    for (size_t e = 0; e < nk; e++) r->tol_dv[e] += (terms + 2) * 0x1p-24 * mag_dv[e];
    free(p), free(p16), free(amb), free(dp), free(mag_dv);
}

static void attn_bf16_ref_free(attn_bf16_ref *r) {
    free(r->out), free(r->out32), free(r->tol_out), free(r->dv), free(r->dv32), free(r->tol_dv);
    free(r->dq), free(r->dk);
}

/* Forward and backward with p_bf16 against the reference that rounds where backend.h says: out
 * and dv with bf16(exp(s − lse)), dq and dk with the unrounded P; lse bitwise that of p_bf16 = 0;
 * the same bits with 1 and 2 threads. */
static void check_attention_bf16(const attn_ctx *c, const char *name) {
    attn_data a;
    attn_data_init(&a, c, 0, 700);
    const size_t nq = nq_of(c), nk = nk_of(c), nl = (size_t)c->B * c->H * c->Tq;
    float *lse32 = fvec(nl, 0, 0.0f), *out32 = fvec(nq, 0, 0.0f);
    pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, out32, lse32);
    a.s.p_bf16 = 1;
    float *res[2][5];
    for (int t = 0; t < 2; t++) {
        set_threads(t + 1);
        res[t][0] = fvec(nq, 0, 0.0f), res[t][1] = fvec(nl, 0, 0.0f);
        res[t][2] = fvec(nq, 0, 0.0f), res[t][3] = fvec(nk, 0, 0.0f), res[t][4] = fvec(nk, 0, 0.0f);
        pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, res[t][0], res[t][1]);
        pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, res[t][0], a.dout, res[t][1],
                                  res[t][2], res[t][3], res[t][4]);
    }
    set_threads(0);
    char what[160];
    const size_t sizes[5] = {nq, nl, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        snprintf(what, sizeof what, "%s: p_bf16 result %d, 2 threads vs 1", name, i);
        check_bitwise(what, res[0][i], res[1][i], sizes[i]);
    }
    snprintf(what, sizeof what, "%s: p_bf16 lse vs fp32 lse", name);
    check_bitwise(what, res[0][1], lse32, nl);

    double *x = attn_pack_inputs(&a, c);
    attn_bf16_ref r;
    attn_bf16_reference(c, x, a.dout, res[0][0], &r);
    snprintf(what, sizeof what, "%s: p_bf16 out", name);
    check_within(what, res[0][0], r.out, r.out32, r.tol_out, nq);
    snprintf(what, sizeof what, "%s: p_bf16 dv", name);
    check_within(what, res[0][4], r.dv, r.dv32, r.tol_dv, nk);
    snprintf(what, sizeof what, "%s: p_bf16 dq", name);
    tu_check_rel(what, tu_rel_err_d(res[0][2], r.dq, nq), TOL_BWD);
    snprintf(what, sizeof what, "%s: p_bf16 dk", name);
    tu_check_rel(what, tu_rel_err_d(res[0][3], r.dk, nk), TOL_BWD);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 5; i++) free(res[t][i]);
    attn_bf16_ref_free(&r);
    free(x), free(lse32), free(out32);
    attn_data_free(&a);
}

static void test_attention_bf16_probabilities_match_reference(void **state) {
    (void)state;
    int32_t *pos = positions(150, 0), *late = positions(100, 10);
    attn_ctx c1 = {2, 37, 37, 6, 2, 6, pos, pos, NULL};
    check_attention_bf16(&c1, "T=37 hd=6 GQA 6/2");
    attn_ctx c2 = {1, 150, 150, 4, 2, 16, pos, pos, NULL};
    check_attention_bf16(&c2, "T=150 hd=16 GQA 4/2");
    /* keys at 10..109: the first 10 queries see nothing (out 0, no gradient) */
    attn_ctx c3 = {2, 40, 100, 4, 2, 6, pos, late, NULL};
    check_attention_bf16(&c3, "rows without keys");
    /* documents (block-causal): starts at 0, 20, 90 (b = 0) and 0, 64 (b = 1) */
    int32_t lo[2 * 150];
    for (int i = 0; i < 150; i++) lo[i] = i < 20 ? 0 : i < 90 ? 20 : 90, lo[150 + i] = i < 64 ? 0 : 64;
    attn_ctx c4 = {2, 150, 150, 4, 2, 16, pos, pos, lo};
    check_attention_bf16(&c4, "documents");
    free(pos), free(late);
}

static void test_attention_bf16_forward_and_backward_round_the_same_probabilities(void **state) {
    (void)state;
    /* With v[j] = e_j (head_dim ≥ Tk) the forward's out[i][j] is P16[i][j] exactly, and with
     * dout[i] = e_i (one query head per kv head) the backward's dv[j][i] is P16[i][j] exactly:
     * the two must be the same bf16 values, bit for bit. A one-ulp difference in the fp32 P
     * changes its bf16 value only near a tie (about 2^-16 of them), hence half a million
     * probabilities. */
    enum { B = 4, T = 200, H = 8, HD = 200 }; /* scale 1/sqrt(200), not a power of 2 */
    int32_t *pos = positions(T, 0);
    const attn_ctx ctx = {B, T, T, H, H, HD, pos, pos, NULL}, *c = &ctx;
    attn_data a;
    attn_data_init(&a, c, 0, 800);
    a.s.p_bf16 = 1;
    const size_t nq = nq_of(c), nk = nk_of(c);
    memset(a.v, 0, sizeof(float) * nk);
    memset(a.dout, 0, sizeof(float) * nq);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int j = 0; j < T; j++) a.v[KI(b, j, h, j)] = 1.0f, a.dout[QI(b, j, h, j)] = 1.0f;
    float *dq = fvec(nq, 0, 0.0f), *dk = fvec(nk, 0, 0.0f), *dv = fvec(nk, 0, 0.0f);
    pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, a.out, a.lse);
    pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, a.out, a.dout, a.lse, dq, dk, dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++) {
                    const float fwd = a.out[QI(b, i, h, j)];
                    const float bwd = dv[KI(b, j, h, i)];
                    if ((tu_f32_bits(fwd) & 0xffff) != 0 || tu_f32_bits(fwd) != tu_f32_bits(bwd) ||
                        (j > i) != (fwd == 0.0f))
                        fail_msg("P16[b %d, h %d][%d][%d]: forward %.9g, backward %.9g", b, h, i,
                                 j, (double)fwd, (double)bwd);
                }
    free(dq), free(dk), free(dv), free(pos);
    attn_data_free(&a);
}

/* Copies keys j0..j0+n of each of the B sequences from a (B, T, w) tensor into a (B, n, w) block
 * (to_blk = 1) or back. */
static void key_block(float *blk, float *full, int B, int T, int j0, int n, int w, int to_blk) {
    for (int b = 0; b < B; b++) {
        float *x = blk + (size_t)b * n * w, *y = full + ((size_t)b * T + j0) * w;
        if (to_blk)
            memcpy(x, y, sizeof(float) * n * w);
        else
            memcpy(y, x, sizeof(float) * n * w);
    }
}

/* Ring attention: the keys in two blocks, forward per block merged by lse, backward per block
 * with the merged out and lse; the summed gradients must equal those of one call over all keys. */
static void test_attention_blocks_merge_like_ring_attention(void **state) {
    (void)state;
    enum { B = 2, T = 90, H = 4, HKV = 2, HD = 8, SPLIT = 50 };
    int32_t *pos = positions(T, 0);
    attn_ctx c = {B, T, T, H, HKV, HD, pos, pos, NULL};
    attn_data a;
    attn_data_init(&a, &c, 0, 400);
    const size_t nq = nq_of(&c), nk = nk_of(&c), nl = (size_t)B * H * T;
    const int kw = HKV * HD, qw = H * HD;
    float *dq = fvec(nq, 0, 0.0f), *dk = fvec(nk, 0, 0.0f), *dv = fvec(nk, 0, 0.0f);
    pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, a.out, a.lse);
    pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, a.out, a.dout, a.lse, dq, dk, dv);

    /* each block's keys copied out as (B, Tk_block) rows */
    float *out2 = fvec(nq, 0, 0.0f), *lse2 = fvec(nl, 0, 0.0f);
    float *ob[2], *lb[2], *kb[2], *vb[2], *dkb[2], *dvb[2];
    float *dq2 = fvec(nq, 0, 0.0f);
    int j0[2] = {0, SPLIT}, tk[2] = {SPLIT, T - SPLIT};
    pt_attn_shape sb[2];
    for (int blk = 0; blk < 2; blk++) {
        kb[blk] = fvec((size_t)B * tk[blk] * kw, 0, 0.0f);
        vb[blk] = fvec((size_t)B * tk[blk] * kw, 0, 0.0f);
        key_block(kb[blk], a.k, B, T, j0[blk], tk[blk], kw, 1);
        key_block(vb[blk], a.v, B, T, j0[blk], tk[blk], kw, 1);
        sb[blk] = a.s;
        sb[blk].Tk = tk[blk];
        sb[blk].k_pos = pos + j0[blk];
        ob[blk] = fvec(nq, 0, 0.0f), lb[blk] = fvec(nl, 0, 0.0f);
        pt_cpu_attention_forward(&be, &sb[blk], a.q, kb[blk], vb[blk], ob[blk], lb[blk]);
    }
    /* merge: lse = log(e^l0 + e^l1), out = Σ e^(l_b − lse)·out_b */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < T; i++) {
                size_t li = ((size_t)b * H + h) * T + i;
                double l0 = lb[0][li], l1 = lb[1][li], mx = l0 > l1 ? l0 : l1;
                double l = mx + log(exp(l0 - mx) + exp(l1 - mx));
                lse2[li] = (float)l;
                for (int d = 0; d < HD; d++) {
                    size_t oi = ((size_t)b * T + i) * qw + h * HD + d;
                    out2[oi] = (float)(exp(l0 - l) * ob[0][oi] + exp(l1 - l) * ob[1][oi]);
                }
            }
    tu_check_rel("merged out", tu_rel_err(out2, a.out, nq), TOL_FWD);
    float *dk2 = fvec(nk, 0, 0.0f), *dv2 = fvec(nk, 0, 0.0f);
    for (int blk = 0; blk < 2; blk++) {
        dkb[blk] = fvec((size_t)B * tk[blk] * kw, 0, 0.0f);
        dvb[blk] = fvec((size_t)B * tk[blk] * kw, 0, 0.0f);
        pt_cpu_attention_backward(&be, &sb[blk], a.q, kb[blk], vb[blk], out2, a.dout, lse2, dq2,
                                  dkb[blk], dvb[blk]);
        key_block(dkb[blk], dk2, B, T, j0[blk], tk[blk], kw, 0);
        key_block(dvb[blk], dv2, B, T, j0[blk], tk[blk], kw, 0);
    }
    tu_check_rel("ring dq (accumulated over blocks)", tu_rel_err(dq2, dq, nq), TOL_BWD);
    tu_check_rel("ring dk", tu_rel_err(dk2, dk, nk), TOL_BWD);
    tu_check_rel("ring dv", tu_rel_err(dv2, dv, nk), TOL_BWD);
    for (int blk = 0; blk < 2; blk++)
        free(kb[blk]), free(vb[blk]), free(ob[blk]), free(lb[blk]), free(dkb[blk]), free(dvb[blk]);
    free(out2), free(lse2), free(dq2), free(dk2), free(dv2), free(dq), free(dk), free(dv);
    free(pos);
    attn_data_free(&a);
}

/* The keys and values of a cut into nb ≤ 3 blocks at cut[0] = 0 < cut[1] < … < cut[nb] = Tk:
 * each block's (B, n) rows copied out, and its shape (a's, with the block's Tk and k_pos). */
typedef struct {
    int nb;
    pt_attn_shape s[3];
    float *k[3], *v[3];
} key_blocks;

static void key_blocks_init(key_blocks *kb, const attn_data *a, const attn_ctx *c, const int *cut,
                            int nb) {
    const int kw = c->Hkv * c->hd;
    kb->nb = nb;
    for (int i = 0; i < nb; i++) {
        const int n = cut[i + 1] - cut[i];
        kb->k[i] = fvec((size_t)c->B * n * kw, 0, 0.0f);
        kb->v[i] = fvec((size_t)c->B * n * kw, 0, 0.0f);
        key_block(kb->k[i], a->k, c->B, c->Tk, cut[i], n, kw, 1);
        key_block(kb->v[i], a->v, c->B, c->Tk, cut[i], n, kw, 1);
        kb->s[i] = a->s;
        kb->s[i].Tk = n, kb->s[i].k_pos = c->kp + cut[i];
    }
}

static void key_blocks_free(key_blocks *kb) {
    for (int i = 0; i < kb->nb; i++) free(kb->k[i]), free(kb->v[i]);
}

/* The data of c with p_bf16, its one call over all keys (a->out, a->lse), and its key blocks. */
static void bf16_blocks_init(attn_data *a, key_blocks *kb, const attn_ctx *c, const int *cut,
                             int nb, uint64_t seed) {
    attn_data_init(a, c, 0, seed);
    a->s.p_bf16 = 1;
    pt_cpu_attention_forward(&be, &a->s, a->q, a->k, a->v, a->out, a->lse);
    key_blocks_init(kb, a, c, cut, nb);
}

/* lse_only (ring attention's first pass with p_bf16): per key block the lse bitwise that of a
 * normal p_bf16 call on the block, out not written; the blocks' lse merged by log-add-exp (in
 * double) equal to the one call's lse over all keys to fp32 rounding: the one call sums
 * exp(s − m) over every key in fp32, the blocks each over theirs, so the two differ by the
 * rounding of those sums, (keys + 2)·2^-24 at most, plus logf's and the final rounding (2 ulps
 * of |lse|). Rows that see no key anywhere must merge to −∞. */
static void check_lse_only_blocks(const attn_ctx *c, const int *cut, int nb, const char *name) {
    attn_data a;
    key_blocks kb;
    bf16_blocks_init(&a, &kb, c, cut, nb, 900);
    const size_t nq = nq_of(c), nl = (size_t)c->B * c->H * c->Tq;
    float *lb = fvec(nl, 0, 0.0f), *lref = fvec(nl, 0, 0.0f), *oref = fvec(nq, 0, 0.0f);
    float *fill = fvec(nq, 901, 1.0f), *ob = fcopy(fill, nq);
    double *merged = dvec(nl);
    for (size_t i = 0; i < nl; i++) merged[i] = -INFINITY;
    char what[160];
    for (int i = 0; i < nb; i++) {
        pt_attn_shape s = kb.s[i];
        pt_cpu_attention_forward(&be, &s, a.q, kb.k[i], kb.v[i], oref, lref);
        s.lse_only = 1;
        pt_cpu_attention_forward(&be, &s, a.q, kb.k[i], kb.v[i], ob, lb);
        snprintf(what, sizeof what, "%s: block %d lse_only lse vs a normal call's", name, i);
        check_bitwise(what, lb, lref, nl);
        snprintf(what, sizeof what, "%s: block %d lse_only leaves out alone", name, i);
        check_bitwise(what, ob, fill, nq);
        for (size_t e = 0; e < nl; e++) {
            const double x = lb[e], y = merged[e], mx = x > y ? x : y;
            if (x != -INFINITY) merged[e] = mx + log(exp(x - mx) + exp(y - mx));
        }
    }
    double worst = 0;
    for (size_t e = 0; e < nl; e++) {
        const double want = a.lse[e], got = (float)merged[e];
        if (want == -INFINITY || got == -INFINITY) {
            if (want != got) fail_msg("%s: merged lse[%zu] = %g, one call %g", name, e, got, want);
            continue;
        }
        const double tol = (c->Tk + 2) * 0x1p-24 + 2 * 0x1p-23 * fabs(want);
        if (!(fabs(got - want) <= tol))
            fail_msg("%s: merged lse[%zu] = %.9g, one call %.9g (tolerance %.3g)", name, e, got,
                     want, tol);
        worst = fmax(worst, fabs(got - want) / tol);
    }
    print_message("%s: merged lse within %.2f of its tolerance\n", name, worst);
    key_blocks_free(&kb);
    free(lb), free(lref), free(oref), free(fill), free(ob), free(merged);
    attn_data_free(&a);
}

/* lse_in (the second pass): over the key blocks in key order with the one call's lse, out zeroed
 * first, the sum is bitwise the one call's p_bf16 out: each call's accumulator starts from out,
 * so every output element is the same fp32 chain of P16·v terms, key after key, as the one
 * call's, with the same P16 (same scores, same lse); lse is not written. And it adds: from random
 * out, rows with lse −∞ (no visible key) are left bitwise as they were and the others grow by the
 * one call's out, to the rounding of sums that start from the prefill: 1e-6 in norm relative
 * to |prefill| + |out|. */
static void check_lse_in_blocks(const attn_ctx *c, const int *cut, int nb, const char *name) {
    attn_data a;
    key_blocks kb;
    bf16_blocks_init(&a, &kb, c, cut, nb, 950);
    const size_t nq = nq_of(c), nl = (size_t)c->B * c->H * c->Tq;
    float *sum = fvec(nq, 0, 0.0f), *lfill = fvec(nl, 951, 1.0f), *lb = fcopy(lfill, nl);
    float *pre = fvec(nq, 952, 1.0f), *acc = fcopy(pre, nq);
    memset(sum, 0, sizeof(float) * nq); /* +0 (fvec's zeros keep the random signs) */
    char what[160];
    for (int i = 0; i < nb; i++) {
        pt_attn_shape s = kb.s[i];
        s.lse_in = a.lse;
        pt_cpu_attention_forward(&be, &s, a.q, kb.k[i], kb.v[i], sum, i ? lb : NULL);
        pt_cpu_attention_forward(&be, &s, a.q, kb.k[i], kb.v[i], acc, lb);
    }
    snprintf(what, sizeof what, "%s: lse_in leaves lse alone", name);
    check_bitwise(what, lb, lfill, nl);
    snprintf(what, sizeof what, "%s: lse_in blocks summed vs one call", name);
    check_bitwise(what, sum, a.out, nq);
    double num = 0, den = 0;
    for (int b = 0; b < c->B; b++)
        for (int i = 0; i < c->Tq; i++)
            for (int h = 0; h < c->H; h++)
                for (int d = 0; d < c->hd; d++) {
                    const size_t e = QI(b, i, h, d);
                    if (a.lse[((size_t)b * c->H + h) * c->Tq + i] == -INFINITY) {
                        snprintf(what, sizeof what, "%s: lse_in −∞ row (b %d, i %d, h %d)", name,
                                 b, i, h);
                        check_bitwise(what, &acc[e], &pre[e], 1);
                        continue;
                    }
                    const double diff = (double)acc[e] - pre[e] - a.out[e];
                    const double mag = fabs((double)pre[e]) + fabs((double)a.out[e]);
                    num += diff * diff, den += mag * mag;
                }
    snprintf(what, sizeof what, "%s: lse_in adds to out", name);
    tu_check_rel(what, sqrt(num / den), 1e-6);
    key_blocks_free(&kb);
    free(sum), free(lfill), free(lb), free(pre), free(acc);
    attn_data_free(&a);
}

/* Ring attention's two passes with p_bf16 (pt_attn_shape.lse_only, lse_in) over 2 and 3 key
 * blocks cut off tile boundaries: GQA, queries that see no key anywhere, a block no query sees. */
static void test_attention_bf16_two_passes_over_key_blocks(void **state) {
    (void)state;
    int32_t *pos = positions(150, 0), *late = positions(100, 10);
    const attn_ctx c1 = {2, 150, 150, 4, 2, 16, pos, pos, NULL};
    const int cut1[] = {0, 37, 100, 150};
    const attn_ctx c2 = {2, 37, 37, 6, 2, 6, pos, pos, NULL};
    const int cut2[] = {0, 20, 37};
    /* queries at 0..39, keys at 10..109: the first 10 queries see nothing, the second block
     * (keys at 74..109) is seen by none */
    const attn_ctx c3 = {2, 40, 100, 4, 2, 6, pos, late, NULL};
    const int cut3[] = {0, 64, 100};
    check_lse_only_blocks(&c1, cut1, 3, "T=150 hd=16 GQA 4/2, 3 blocks");
    check_lse_only_blocks(&c2, cut2, 2, "T=37 hd=6 GQA 6/2, 2 blocks");
    check_lse_only_blocks(&c3, cut3, 2, "rows without keys, 2 blocks");
    check_lse_in_blocks(&c1, cut1, 3, "T=150 hd=16 GQA 4/2, 3 blocks");
    check_lse_in_blocks(&c2, cut2, 2, "T=37 hd=6 GQA 6/2, 2 blocks");
    check_lse_in_blocks(&c3, cut3, 2, "rows without keys, 2 blocks");
    free(pos), free(late);
}


/* Rows of a (B, T, w) array picked by positions: out (B, n, w) = in[b, pos[i]] (gather), or the
 * reverse added (scatter). */
static void pick_rows(float *sub, float *full, int B, int T, const int32_t *pos, int n, int w, int gather) {
    for (int b = 0; b < B; b++)
        for (int i = 0; i < n; i++) {
            float *x = sub + ((size_t)b * n + i) * w, *y = full + ((size_t)b * T + pos[i]) * w;
            if (gather)
                memcpy(x, y, sizeof(float) * w);
            else
                for (int d = 0; d < w; d++) y[d] += x[d];
        }
}

/* Context parallelism on one process: c "ranks" hold the zigzag chunks of the sequence; each runs
 * its queries against every rank's keys and values block by block, merged by the backend's
 * attention_merge, and the backward per block with the merged output; the assembled output and
 * the summed input gradients must be those of full attention, for c = 2 and 4 with GQA. */
static void test_ring_attention_zigzag_equals_full_attention(void **state) {
    (void)state;
    enum { B = 2, T = 96, H = 4, HKV = 2, HD = 8 };
    int32_t *pos = positions(T, 0);
    attn_ctx c = {B, T, T, H, HKV, HD, pos, pos, NULL};
    attn_data a;
    attn_data_init(&a, &c, 0, 500);
    const size_t nq = nq_of(&c), nk = nk_of(&c);
    const int kw = HKV * HD, qw = H * HD;
    float *dq = fvec(nq, 0, 0.0f), *dk = fvec(nk, 0, 0.0f), *dv = fvec(nk, 0, 0.0f);
    pt_cpu_attention_forward(&be, &a.s, a.q, a.k, a.v, a.out, a.lse);
    pt_cpu_attention_backward(&be, &a.s, a.q, a.k, a.v, a.out, a.dout, a.lse, dq, dk, dv);
    for (int cp = 2; cp <= 4; cp += 2) {
        const int Tl = T / cp;
        int32_t *rp[4];
        float *q[4], *k[4], *v[4], *o[4], *l[4], *dout[4], *dqr[4], *dkr[4], *dvr[4];
        for (int r = 0; r < cp; r++) {
            rp[r] = malloc(sizeof(int32_t) * Tl);
            pt_cp_positions(cp, 1, r, Tl, rp[r]);
            q[r] = fvec((size_t)B * Tl * qw, 0, 0.0f), dout[r] = fvec((size_t)B * Tl * qw, 0, 0.0f);
            k[r] = fvec((size_t)B * Tl * kw, 0, 0.0f), v[r] = fvec((size_t)B * Tl * kw, 0, 0.0f);
            pick_rows(q[r], a.q, B, T, rp[r], Tl, qw, 1);
            pick_rows(dout[r], a.dout, B, T, rp[r], Tl, qw, 1);
            pick_rows(k[r], a.k, B, T, rp[r], Tl, kw, 1);
            pick_rows(v[r], a.v, B, T, rp[r], Tl, kw, 1);
            o[r] = fvec((size_t)B * Tl * qw, 0, 0.0f), l[r] = fvec((size_t)B * H * Tl, 0, 0.0f);
            dqr[r] = fvec((size_t)B * Tl * qw, 0, 0.0f);
            dkr[r] = fvec((size_t)B * Tl * kw, 0, 0.0f), dvr[r] = fvec((size_t)B * Tl * kw, 0, 0.0f);
        }
        float *ob = fvec((size_t)B * Tl * qw, 0, 0.0f), *lb = fvec((size_t)B * H * Tl, 0, 0.0f);
        for (int r = 0; r < cp; r++)
            for (int j = 0; j < cp; j++) { /* the ring's order: rank r − j's block at step j */
                int src = (r - j + cp) % cp;
                pt_attn_shape s = a.s;
                s.Tq = s.Tk = Tl, s.q_pos = rp[r], s.k_pos = rp[src];
                pt_cpu_attention_forward(&be, &s, q[r], k[src], v[src], j ? ob : o[r], j ? lb : l[r]);
                if (j) pt_cpu_attention_merge(&be, o[r], l[r], ob, lb, B, Tl, H, HD, qw);
            }
        float *out = fvec(nq, 0, 0.0f), *dq2 = fvec(nq, 0, 0.0f), *dk2 = fvec(nk, 0, 0.0f), *dv2 = fvec(nk, 0, 0.0f);
        for (int r = 0; r < cp; r++) {
            pick_rows(o[r], out, B, T, rp[r], Tl, qw, 0);
            for (int j = 0; j < cp; j++) {
                int src = (r - j + cp) % cp;
                pt_attn_shape s = a.s;
                s.Tq = s.Tk = Tl, s.q_pos = rp[r], s.k_pos = rp[src];
                pt_cpu_attention_backward(&be, &s, q[r], k[src], v[src], o[r], dout[r], l[r], dqr[r],
                                          dkr[src], dvr[src]);
            }
        }
        for (int r = 0; r < cp; r++) {
            pick_rows(dqr[r], dq2, B, T, rp[r], Tl, qw, 0);
            pick_rows(dkr[r], dk2, B, T, rp[r], Tl, kw, 0);
            pick_rows(dvr[r], dv2, B, T, rp[r], Tl, kw, 0);
        }
        char name[64];
        snprintf(name, sizeof name, "cp %d zigzag ring: out", cp);
        tu_check_rel(name, tu_rel_err(out, a.out, nq), 1e-5);
        snprintf(name, sizeof name, "cp %d zigzag ring: dq", cp);
        tu_check_rel(name, tu_rel_err(dq2, dq, nq), 1e-5);
        snprintf(name, sizeof name, "cp %d zigzag ring: dk", cp);
        tu_check_rel(name, tu_rel_err(dk2, dk, nk), 1e-5);
        snprintf(name, sizeof name, "cp %d zigzag ring: dv", cp);
        tu_check_rel(name, tu_rel_err(dv2, dv, nk), 1e-5);
        for (int r = 0; r < cp; r++)
            free(rp[r]), free(q[r]), free(k[r]), free(v[r]), free(o[r]), free(l[r]), free(dout[r]),
                free(dqr[r]), free(dkr[r]), free(dvr[r]);
        free(ob), free(lb), free(out), free(dq2), free(dk2), free(dv2);
    }
    free(dq), free(dk), free(dv), free(pos);
    attn_data_free(&a);
}

/* Vocabulary-parallel cross-entropy: the rows' vocabulary cut into blocks (the last padded), each
 * block's statistics combined as the model does, then each block's gradient: equal to the fused
 * softmax cross-entropy over the whole row. */
static void test_vocab_parallel_xent_equals_fused(void **state) {
    (void)state;
    enum { n = 5, V = 37, TP = 4, VL = (V + TP - 1) / TP };
    const int32_t tgt[n] = {3, -1, 36, 10, 27};
    const float dscale = 0.5f;
    float *full = fvec(n * V, 60, 4.0f), *ref = malloc(sizeof(float) * n * V), losses[n];
    memcpy(ref, full, sizeof(float) * n * V);
    pt_cpu_softmax_xent(&be, ref, losses, tgt, n, V, V, dscale);
    float *blk[TP], st[TP][3 * n], M[n], S[n];
    for (int r = 0; r < TP; r++) {
        int v0 = r * VL, valid = V - v0 < VL ? V - v0 : VL;
        blk[r] = fvec(n * VL, 0, 0.0f);
        for (int i = 0; i < n; i++) memcpy(blk[r] + i * VL, full + i * V + v0, sizeof(float) * valid);
        pt_cpu_xent_stats(&be, blk[r], tgt, n, valid, VL, v0, st[r]);
    }
    for (int i = 0; i < n; i++) {
        float mx = -INFINITY;
        double sum = 0, xt = 0;
        for (int r = 0; r < TP; r++) mx = st[r][3 * i] > mx ? st[r][3 * i] : mx;
        for (int r = 0; r < TP; r++) sum += st[r][3 * i + 1] * exp((double)st[r][3 * i] - mx), xt += st[r][3 * i + 2];
        M[i] = mx, S[i] = (float)sum;
        if (tgt[i] >= 0) assert_float_equal((float)(mx + log(sum) - xt), losses[i], 1e-5f * (1 + fabsf(losses[i])));
    }
    float *got = fvec(n * V, 0, 0.0f);
    for (int r = 0; r < TP; r++) {
        int v0 = r * VL, valid = V - v0 < VL ? V - v0 : VL;
        pt_cpu_xent_grad(&be, blk[r], tgt, n, valid, VL, v0, M, S, dscale);
        for (int i = 0; i < n; i++) {
            memcpy(got + i * V + v0, blk[r] + i * VL, sizeof(float) * valid);
            for (int j = valid; j < VL; j++) assert_float_equal(blk[r][i * VL + j], 0.0f, 0.0f);
        }
        free(blk[r]);
    }
    tu_check_rel("vocabulary-parallel xent gradient", tu_rel_err(got, ref, n * V), 1e-6);
    free(full), free(ref), free(got);
}

int main(void) {
    default_threads = omp_get_max_threads();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_embedding_matches_reference_with_vocab_shard),
        cmocka_unit_test(test_embedding_backward_is_thread_count_independent),
        cmocka_unit_test(test_rmsnorm_matches_reference),
        cmocka_unit_test(test_rmsnorm_backward_is_thread_count_independent),
        cmocka_unit_test(test_rope_matches_reference_and_inverse_is_transpose),
        cmocka_unit_test(test_swiglu_matches_reference),
        cmocka_unit_test(test_rows_copy_gathers_rows_of_any_type),
        cmocka_unit_test(test_expf_is_accurate_over_the_float_range),
        cmocka_unit_test(test_softmax_xent_matches_reference_with_ignored_rows),
        cmocka_unit_test(test_add_scale_sum_sumsq_match_reference),
        cmocka_unit_test(test_sumsq_is_thread_count_independent),
        cmocka_unit_test(test_adamw_matches_double_reference_over_steps),
        cmocka_unit_test(test_adamw_vector_body_and_scalar_tail_agree_bitwise),
        cmocka_unit_test(test_bf16_conversion_rounds_to_nearest_even_on_both_paths),
        cmocka_unit_test(test_bf16_to_float_is_exact),
        cmocka_unit_test(test_attention_causal_gqa_matches_reference),
        cmocka_unit_test(test_attention_on_fused_qkv_views_matches_reference),
        cmocka_unit_test(test_attention_queries_after_keys_with_positions),
        cmocka_unit_test(test_attention_rows_without_visible_keys),
        cmocka_unit_test(test_attention_documents_match_reference),
        cmocka_unit_test(test_attention_is_thread_count_independent),
        cmocka_unit_test(test_attention_bf16_probabilities_match_reference),
        cmocka_unit_test(test_attention_bf16_forward_and_backward_round_the_same_probabilities),
        cmocka_unit_test(test_attention_blocks_merge_like_ring_attention),
        cmocka_unit_test(test_attention_bf16_two_passes_over_key_blocks),
        cmocka_unit_test(test_ring_attention_zigzag_equals_full_attention),
        cmocka_unit_test(test_vocab_parallel_xent_equals_fused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
