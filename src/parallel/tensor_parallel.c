/* tensor_parallel.c: tensor parallelism (Megatron-style), the model's pt_tp_ops.
 *
 * A column-parallel linear (q, k, v, gate, up; each expert's w1, w3) needs no communication in
 * forward; a row-parallel one (o, down; each expert's w2) leaves partial sums that `reduce` adds
 * over the tp group: an all-reduce, or with sequence parallelism a reduce-scatter that leaves
 * each rank its N/tp rows of the residual stream, which `gather` collects again before the next
 * column-parallel input (the norms run on the rank's rows only). Backward mirrors it: the input
 * gradient of a column-parallel linear is reduced, the gradient reaching a row-parallel one
 * gathered (sp). With sp the norms' weight gradients are partial per rank and summed by `sum`.
 * A key/value head replicated on several ranks (tp > n_kv_heads) has its gradient summed over
 * the kv group. The vocabulary is split too: the embedding gives partial rows (a token outside
 * the rank's block gives zeros) summed by `reduce`, and the cross-entropy combines the blocks'
 * row statistics (max, Σ exp, the target's logit) gathered over the group.
 */
#include "pt/tensor_parallel.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    pt_tp_ops ops;
    pt_backend *be;
    pt_comm *tp, *kv;
    int sp, V, v0, v_valid, max_rows;
    float *st, *M;   /* host: (tp, max_rows, 3) statistics; (2, max_rows) max and sum */
    int32_t *tg;     /* host: (max_rows) targets */
} pt_tp;

static void tp_reduce(void *ctx, float *y, int N, int C) {
    pt_tp *t = ctx;
    if (t->sp)
        pt_reduce_scatter_sum(t->tp, NULL, y, (size_t)N / t->tp->size * C, PT_DTYPE_F32);
    else
        pt_allreduce_sum(t->tp, y, (size_t)N * C, PT_DTYPE_F32);
}

static void tp_gather(void *ctx, void *full, int N, int C, int esize) {
    pt_tp *t = ctx;
    pt_allgather(t->tp, NULL, full, (size_t)N / t->tp->size * C,
                 esize == 2 ? PT_DTYPE_BF16 : PT_DTYPE_F32);
}

static void tp_sum(void *ctx, float *x, size_t n) {
    pt_allreduce_sum(((pt_tp *)ctx)->tp, x, n, PT_DTYPE_F32);
}

static void tp_sum_host_f64(void *ctx, double *x, size_t n) {
    pt_allreduce_sum(((pt_tp *)ctx)->tp, x, n, PT_DTYPE_F64);
}

static void tp_kv_sum(void *ctx, float *x, size_t n) {
    pt_allreduce_sum(((pt_tp *)ctx)->kv, x, n, PT_DTYPE_F32);
}

/* Losses (host, n) of rows whose logits (n, V) hold this rank's vocabulary block, and the logits
 * turned into dscale · (softmax − onehot): the blocks' row statistics gathered over the tp ranks
 * and combined (max M, Σ exp(x − M), the target's logit). */
static void tp_xent(void *ctx, float *logits, const int32_t *targets, int n, float dscale,
                    float *losses) {
    pt_tp *t = ctx;
    pt_backend *be = t->be;
    int tp = t->tp->size;
    PT_ASSERT(n <= t->max_rows);
    float *st = t->st, *M = t->M, *S = M + n;
    be->xent_stats(be, logits, targets, n, t->v_valid, t->V, t->v0, st + (size_t)3 * n * t->tp->rank);
    pt_allgather(t->tp, NULL, st, (size_t)3 * n, PT_DTYPE_F32);
    be->download(be, t->tg, targets, (size_t)n * sizeof *t->tg);
    for (int i = 0; i < n; i++) {
        float mx = -INFINITY;
        for (int r = 0; r < tp; r++) {
            float v = st[(size_t)3 * n * r + 3 * i];
            mx = v > mx ? v : mx;
        }
        double sum = 0, xt = 0;
        for (int r = 0; r < tp; r++) {
            const float *s = st + (size_t)3 * n * r + 3 * i;
            if (s[0] > -INFINITY) sum += (double)s[1] * exp((double)s[0] - mx);
            xt += s[2];
        }
        M[i] = mx;
        S[i] = (float)sum;
        losses[i] = t->tg[i] < 0 ? 0.0f : (float)((double)mx + log(sum) - xt);
    }
    be->xent_grad(be, logits, targets, n, t->v_valid, t->V, t->v0, M, S, dscale);
}

pt_tp_ops *pt_tp_create(pt_backend *be, pt_comm *tp, pt_comm *kv, int sp, int V, int v0,
                        int v_valid, int max_rows) {
    pt_tp *t = pt_calloc(1, sizeof *t);
    t->be = be, t->tp = tp, t->kv = kv, t->sp = sp;
    t->V = V, t->v0 = v0, t->v_valid = v_valid, t->max_rows = max_rows;
    t->st = pt_malloc((size_t)3 * max_rows * tp->size * sizeof *t->st);
    t->M = pt_malloc((size_t)2 * max_rows * sizeof *t->M);
    t->tg = pt_malloc((size_t)max_rows * sizeof *t->tg);
    t->ops = (pt_tp_ops){.ctx = t,
                         .reduce = tp_reduce,
                         .gather = sp ? tp_gather : NULL,
                         .sum = tp_sum,
                         .sum_host_f64 = tp_sum_host_f64,
                         .kv_sum = kv ? tp_kv_sum : NULL,
                         .xent = tp_xent};
    return &t->ops;
}

void pt_tp_free(pt_tp_ops *ops) {
    if (!ops) return;
    pt_tp *t = ops->ctx;
    free(t->st), free(t->M), free(t->tg);
    free(t);
}
