/* linear.c: the linear layer, written once: the C form of Megatron-LM's ColumnParallelLinear and
 * RowParallelLinear (megatron/core/tensor_parallel/layers.py), for the model's precision.
 *
 * Forward, input gradient and weight gradient of y = x·Wᵀ (+ b) on this rank's block of W:
 *   column-parallel (q/k/v, gate/up): W's output rows split over the tp ranks. Its input is a
 *     norm's output; with sequence parallelism each rank keeps only its rows of it and the
 *     forward gathers them (the GEMM runs on each block of rows as it lands). Backward: dx = dy·W
 *     is a partial sum over the ranks, summed (reduce-scatter with sp) while the weight gradient
 *     dW += dyᵀ·x computes; x, kept sharded, is gathered again while dx's GEMM runs (Korthikanti
 *     et al. 2022, §4.2.2).
 *   row-parallel (o, down): W's input columns split; the forward's partial sums are summed over
 *     the ranks (with sp a reduce-scatter, each block sent as the GEMM makes it) and added to the
 *     residual. Backward: the output gradient's rows are gathered (sp) while dx = dy·W computes
 *     on each block as it lands; dW += dyᵀ·x needs no communication.
 * A zero-bubble backward keeps dy for a later weight pass (pt_linear_weight) instead of the
 * weight-gradient GEMM. A bias's gradient is the column sums of dy (a GEMM with ones). In bf16
 * the GEMMs take bf16 operands (dy rounded into a->g16) and accumulate in fp32. */
#include "model/linear.h"

/* A linear block by block, the consumer or producer of an overlapped tp operation: rows [r0, r1)
 * of out (·, n, fp32) = in (·, K) · Wᵀ (+ bias), or for an input gradient (grad = 1) = in · W
 * with in fp32, rounded row by row into the bf16 scratch a->g16 first when the model is bf16
 * (the operand pt_gop would make of the whole). */
typedef struct {
    pt_model *m;
    pt_acts *a;
    const void *in, *w;
    const float *bias;
    float *out;
    int K, n, grad;
} pt_linear_rows;

static void pt_linear_rows_fn(void *user, int r0, int r1) {
    pt_linear_rows *g = user;
    pt_model *m = g->m;
    size_t i = (size_t)r0 * g->K;
    const void *in = pt_at(m, g->in, i);
    if (g->grad && pt_is_bf16(m)) {
        m->be->to_bf16(m->be, (pt_bf16 *)g->a->g16 + i, (const float *)g->in + i,
                       (size_t)(r1 - r0) * g->K);
        in = (pt_bf16 *)g->a->g16 + i;
    }
    float *out = g->out + (size_t)r0 * g->n;
    pt_mm(m, PT_NO_TRANS, g->grad ? PT_NO_TRANS : PT_TRANS, r1 - r0, g->n, g->K, in, g->K, g->w,
          g->grad ? g->n : g->K, 0.0f, out, g->n);
    if (g->bias) pt_add_bias(m, g->a, out, g->bias, r1 - r0, g->n, g->n);
}

void pt_linear_fwd(pt_model *m, const pt_linear *L, const void *x, float *y, int n, float beta) {
    pt_mm(m, PT_NO_TRANS, PT_TRANS, n, L->n, L->K, x, L->K, L->w, L->K, beta, y, L->n);
}

void pt_linear_dgrad(pt_model *m, const pt_linear *L, const void *dy, float *dx, int n, float beta) {
    pt_mm(m, PT_NO_TRANS, PT_NO_TRANS, n, L->K, L->n, dy, L->n, L->w, L->K, beta, dx, L->K);
}

void pt_linear_dw(pt_model *m, const pt_linear *L, const void *dy, const void *x, int n) {
    pt_mm(m, PT_TRANS, PT_NO_TRANS, L->n, L->K, n, dy, L->n, x, L->K, 1.0f, L->dw, L->K);
}

const void *pt_linear_col_forward(pt_model *m, pt_acts *a, const pt_linear *L, const void *x,
                                  float *y, int N) {
    int C = m->cfg.dim;
    PT_ASSERT(!L || L->K == C);
    void *full = pt_sharded(m) ? a->xg : (void *)x;
    if (full != x)
        m->be->copy(m->be, pt_at(m, full, pt_own_row0(m, N) * C), x,
                    (size_t)pt_res_rows(m, N) * C * (size_t)m->act_size);
    if (!L) {
        pt_tp_gather(m, full, N, C, m->act_size);
        return full;
    }
    pt_linear_rows g = {m, a, full, L->w, L->b, y, C, L->n, 0};
    pt_tp_gather_rows(m, full, N, C, m->act_size, pt_linear_rows_fn, &g);
    return full;
}

void pt_linear_row_forward(pt_model *m, pt_acts *a, const pt_linear *L, void *xout,
                           const void *xin, const void *x, int N) {
    pt_backend *be = m->be;
    int C = L->n, K = L->K, R = pt_res_rows(m, N);
    size_t RC = (size_t)R * C;
    float *y = a->dxn; /* (N,C) scratch: free in forward, and in backward between layers */
    pt_linear_rows g = {m, a, x, L->w, NULL, y, K, C, 0};
    if (!pt_is_bf16(m)) { /* fp32: on one rank the GEMM accumulates straight into the residual */
        be->copy(be, xout, xin, RC * sizeof(float));
        if (!m->par.tp_ops) {
            pt_linear_fwd(m, L, x, xout, N, 1.0f);
            if (L->b) pt_add_bias(m, a, xout, L->b, R, C, C);
            return;
        }
        pt_tp_reduce_rows(m, y, N, C, pt_linear_rows_fn, &g);
        if (L->b) pt_add_bias(m, a, y, L->b, R, C, C);
        be->add(be, xout, y, RC);
        return;
    }
    /* bf16: the sum, the bias and the residual add in fp32, rounded once into xout */
    pt_tp_reduce_rows(m, y, N, C, pt_linear_rows_fn, &g);
    if (L->b) pt_add_bias(m, a, y, L->b, R, C, C);
    float *xs = a->sA;
    be->from_bf16(be, xs, xin, RC);
    be->add(be, xs, y, RC);
    be->to_bf16(be, xout, xs, RC);
}

/* The gradient of the residual rows, gathered in full (N,C) with sequence parallelism; rows
 * (when not NULL) consumes it block by block as it lands: its in is set here. */
static const float *pt_out_grad_rows(pt_model *m, pt_acts *a, int N, pt_linear_rows *rows) {
    int C = m->cfg.dim, R = pt_res_rows(m, N);
    const float *full = a->dx;
    if (pt_sharded(m)) {
        m->be->copy(m->be, a->dfull + pt_own_row0(m, N) * C, a->dx, (size_t)R * C * sizeof(float));
        full = a->dfull;
    }
    if (!rows) {
        if (full != a->dx) pt_tp_gather(m, a->dfull, N, C, sizeof(float));
        return full;
    }
    rows->in = full;
    pt_tp_gather_rows(m, a->dfull, N, C, sizeof(float), pt_linear_rows_fn, rows);
    return full;
}

const float *pt_linear_out_grad(pt_model *m, pt_acts *a, int N) {
    return pt_out_grad_rows(m, a, N, NULL);
}

/* A column-parallel linear's kept rows x (R,C) gathered again into the scratch a->xg; returns
 * the gathered (N,C), or x itself without sp. overlap: only started, pt_regather_end waits. */
static const void *pt_regather(pt_model *m, pt_acts *a, const void *x, int N, int overlap) {
    if (!pt_sharded(m)) return x;
    int C = m->cfg.dim;
    size_t RC = (size_t)pt_res_rows(m, N) * C;
    m->be->copy(m->be, pt_at(m, a->xg, pt_own_row0(m, N) * C), x, RC * (size_t)m->act_size);
    const pt_tp_ops *tp = m->par.tp_ops;
    if (overlap)
        tp->gather_start(tp->ctx, a->xg, N, C, m->act_size);
    else
        tp->gather(tp->ctx, a->xg, N, C, m->act_size);
    return a->xg;
}

static void pt_regather_end(pt_model *m) {
    if (pt_sharded(m)) m->par.tp_ops->gather_finish(m->par.tp_ops->ctx);
}

const void *pt_linear_input(pt_model *m, pt_acts *a, const void *x, int N) {
    return pt_regather(m, a, x, N, 0);
}

/* dW (+ db) += dyᵀ·x: op is dy as a GEMM operand (the model's precision), dy32 its fp32 values
 * (the bias's gradient sums them), x (N,K). Rows [shared, n) of a shared head: this rank's part
 * in the scratch a->dkv, summed over the ranks holding it, then added. */
static void pt_linear_wgrad(pt_model *m, pt_acts *a, const pt_linear *L, const void *op,
                            const float *dy32, const void *x, int N) {
    pt_backend *be = m->be;
    const pt_tp_ops *tp = m->par.tp_ops;
    int K = L->K, n = L->n, s = L->shared;
    if (s < n) {
        pt_mm(m, PT_TRANS, PT_NO_TRANS, s, K, N, op, n, x, K, 1.0f, L->dw, K);
        pt_mm(m, PT_TRANS, PT_NO_TRANS, n - s, K, N, pt_at(m, op, (size_t)s), n, x, K, 0.0f, a->dkv, K);
        tp->kv_sum(tp->ctx, a->dkv, (size_t)(n - s) * K);
        be->add(be, L->dw + (size_t)s * K, a->dkv, (size_t)(n - s) * K);
    } else {
        pt_linear_dw(m, L, op, x, N);
    }
    if (L->db && s < n) {
        pt_bias_grad(m, a, L->db, dy32, N, s, n, 1.0f);
        pt_bias_grad(m, a, a->dkv, dy32 + s, N, n - s, n, 0.0f);
        tp->kv_sum(tp->ctx, a->dkv, (size_t)(n - s));
        be->add(be, L->db + s, a->dkv, (size_t)(n - s));
    } else if (L->db) {
        pt_bias_grad(m, a, L->db, dy32, N, n, n, 1.0f);
    }
}

void pt_linear_col_backward(pt_model *m, pt_acts *a, const pt_linear *L, const float *dy,
                            const void *x, float *dx, int N, float *keep) {
    int K = L->K, n = L->n;
    const void *op = pt_gop(m, a, dy, (size_t)N * n);
    const void *xg = keep ? NULL : pt_regather(m, a, x, N, 1);
    pt_linear_dgrad(m, L, op, dx, N, 0.0f);
    if (!keep) pt_regather_end(m);
    pt_tp_reduce_begin(m, dx, N, K); /* while the weight gradients compute */
    if (keep) {
        m->be->copy(m->be, keep, dy, (size_t)N * n * sizeof(float));
        return;
    }
    pt_linear_wgrad(m, a, L, op, dy, xg, N);
}

void pt_linear_row_backward(pt_model *m, pt_acts *a, const pt_linear *L, const void *x, float *dx,
                            int N, float *keep) {
    pt_linear_rows gr = {m, a, NULL, L->w, NULL, dx, L->n, L->K, 1};
    const float *dy = pt_out_grad_rows(m, a, N, &gr);
    if (keep) {
        m->be->copy(m->be, keep, dy, (size_t)N * L->n * sizeof(float));
        return;
    }
    const void *op = pt_is_bf16(m) ? a->g16 : (const void *)dy; /* (rounded by the rows) */
    pt_linear_wgrad(m, a, L, op, dy, x, N);
}

void pt_linear_weight(pt_model *m, pt_acts *a, const pt_linear *L, const float *dy, const void *x,
                      int column, int N) {
    const void *op = pt_gop(m, a, dy, (size_t)N * L->n);
    pt_linear_wgrad(m, a, L, op, dy, column ? pt_regather(m, a, x, N, 0) : x, N);
}
