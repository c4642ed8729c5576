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
 *
 * Overlapped (sp): a gather is tp − 1 point-to-point sends of this rank's block to every other
 * rank, and the consumer's GEMM runs on the rank's own block while the others travel, then on
 * each block as it lands; a reduce-scatter is the producer's GEMM run block by block, the other
 * ranks' blocks first, each sent to its owner as soon as it is made, the rank's own last; the
 * partial sums that arrived are then added to it in rank order (whatever the arrival order, so
 * the result does not depend on timing). The bytes are the collectives' bytes. Backward's input
 * gradients are reduced nonblocking (reduce_start) while the weight-gradient GEMM runs; a
 * column-parallel linear's input, kept sharded (sp), is gathered again nonblocking
 * (gather_start) while the input-gradient GEMM runs, for the weight-gradient GEMM.
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
    float *part;     /* (tp − 1, max_rows / tp, dim): the other ranks' partial sums of our block */
    pt_comm_req **req; /* 2 (tp − 1) pending sends and receives of one overlapped operation */
    pt_comm_req *pending; /* reduce_start's or gather_start's */
} pt_tp;

enum { PT_TP_TAG_GATHER = 1, PT_TP_TAG_REDUCE = 2 };

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

static void tp_gather_rows(void *ctx, void *full, int N, int C, int esize, pt_rows_fn rows,
                           void *user) {
    pt_tp *t = ctx;
    pt_comm *c = t->tp;
    int n = c->size, r = c->rank, R = N / n;
    if (!t->sp) {
        rows(user, 0, N);
        return;
    }
    size_t blk = (size_t)R * C, bytes = blk * (size_t)esize;
    pt_dtype dt = esize == 2 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
    char *f = full;
    for (int k = 1; k < n; k++) { /* from rank r + k, to rank r − k */
        int from = (r + k) % n, to = (r + n - k) % n;
        t->req[k - 1] = c->irecv(c, f + from * bytes, blk, dt, from, PT_TP_TAG_GATHER);
        t->req[n - 2 + k] = c->isend(c, f + r * bytes, blk, dt, to, PT_TP_TAG_GATHER);
    }
    rows(user, r * R, (r + 1) * R);
    for (int k = 1; k < n; k++) {
        int from = (r + k) % n;
        pt_comm_wait(c, t->req[k - 1]);
        rows(user, from * R, (from + 1) * R);
    }
    for (int k = 1; k < n; k++) pt_comm_wait(c, t->req[n - 2 + k]);
}

static void tp_reduce_rows(void *ctx, float *y, int N, int C, pt_rows_fn rows, void *user) {
    pt_tp *t = ctx;
    pt_comm *c = t->tp;
    int n = c->size, r = c->rank, R = N / n;
    if (!t->sp) {
        rows(user, 0, N);
        tp_reduce(ctx, y, N, C);
        return;
    }
    size_t blk = (size_t)R * C;
    PT_ASSERT(R <= t->max_rows / n);
    for (int k = 1; k < n; k++) { /* rank r − k's partial of our block arrives into part[k − 1] */
        int from = (r + n - k) % n;
        t->req[k - 1] = c->irecv(c, t->part + (k - 1) * blk, blk, PT_DTYPE_F32, from, PT_TP_TAG_REDUCE);
    }
    for (int k = 1; k < n; k++) { /* blocks of ranks r + 1, r + 2, ...: made, then sent */
        int to = (r + k) % n;
        rows(user, to * R, (to + 1) * R);
        t->req[n - 2 + k] = c->isend(c, y + to * blk, blk, PT_DTYPE_F32, to, PT_TP_TAG_REDUCE);
    }
    rows(user, r * R, (r + 1) * R);
    for (int k = 1; k < 2 * n - 1; k++) pt_comm_wait(c, t->req[k - 1]);
    /* Σ over ranks 0, 1, ..., n − 1 of their partial sums, into y's first block */
    pt_backend *be = t->be;
    const float *own = y + r * blk;
    for (int q = 0; q < n; q++) {
        const float *p = q == r ? own : t->part + (size_t)((r - q + n) % n - 1) * blk;
        if (q == 0) {
            if (p != y) be->copy(be, y, p, blk * sizeof(float));
        } else {
            be->add(be, y, p, blk);
        }
    }
}

static void tp_reduce_start(void *ctx, float *y, int N, int C) {
    pt_tp *t = ctx;
    PT_ASSERT(!t->pending);
    if (t->sp)
        t->pending = t->tp->ireduce_scatter(t->tp, NULL, y, (size_t)N / t->tp->size * C, PT_DTYPE_F32);
    else
        t->pending = t->tp->iallreduce(t->tp, y, (size_t)N * C, PT_DTYPE_F32);
}

/* reduce_start's or gather_start's operation, waited for */
static void tp_finish(void *ctx) {
    pt_tp *t = ctx;
    pt_comm_wait(t->tp, t->pending);
    t->pending = NULL;
}

static void tp_gather_start(void *ctx, void *full, int N, int C, int esize) {
    pt_tp *t = ctx;
    PT_ASSERT(!t->pending);
    t->pending = t->tp->iallgather(t->tp, NULL, full, (size_t)N / t->tp->size * C,
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
                        int v_valid, int max_rows, int dim) {
    pt_tp *t = pt_calloc(1, sizeof *t);
    t->be = be, t->tp = tp, t->kv = kv, t->sp = sp;
    t->V = V, t->v0 = v0, t->v_valid = v_valid, t->max_rows = max_rows;
    t->st = pt_malloc((size_t)3 * max_rows * tp->size * sizeof *t->st);
    t->M = pt_malloc((size_t)2 * max_rows * sizeof *t->M);
    t->tg = pt_malloc((size_t)max_rows * sizeof *t->tg);
    int n = tp->size;
    t->part = sp && n > 1 ? be->alloc(be, (size_t)(n - 1) * (max_rows / n) * dim * sizeof(float)) : NULL;
    t->req = pt_calloc((size_t)2 * n, sizeof *t->req);
    pt_comm_reserve(tp, 2 * n + 2);
    t->ops = (pt_tp_ops){.ctx = t,
                         .reduce = tp_reduce,
                         .gather = sp ? tp_gather : NULL,
                         .gather_rows = tp_gather_rows,
                         .reduce_rows = tp_reduce_rows,
                         .reduce_start = tp_reduce_start,
                         .reduce_finish = tp_finish,
                         .gather_start = sp ? tp_gather_start : NULL,
                         .gather_finish = sp ? tp_finish : NULL,
                         .sum = tp_sum,
                         .sum_host_f64 = tp_sum_host_f64,
                         .kv_sum = kv ? tp_kv_sum : NULL,
                         .xent = tp_xent};
    return &t->ops;
}

void pt_tp_free(pt_tp_ops *ops) {
    if (!ops) return;
    pt_tp *t = ops->ctx;
    free(t->st), free(t->M), free(t->tg), free(t->req);
    if (t->part) t->be->free(t->be, t->part);
    free(t);
}
