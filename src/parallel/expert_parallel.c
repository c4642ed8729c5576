/* expert_parallel.c: expert parallelism, the model's pt_ep_ops.
 *
 * Each of the ep ranks holds E/ep experts of every MoE layer (rank r: experts [r·el, (r+1)·el),
 * el = E/ep). The model routes its tokens and sorts the token-slots by expert; `dispatch` sends
 * each slot's row to the rank holding its expert with an all-to-all(v), after one of the counts
 * per (rank, expert); the rank's experts run over what arrived, block by block (from each rank,
 * per local expert); `combine` sends the outputs back in the same layout. Backward mirrors it:
 * the output gradients go where the inputs went, the input gradients come back.
 *
 * A layer's state (counts, the received rows kept for backward, the rows to send back) belongs to
 * this module and is sized at set-up for the most rows that can arrive: every rank's tokens, each
 * sending min(top_k, el) slots to this rank's experts (with a capacity, at most cap per expert
 * and sender): no allocation while training.
 *
 * Mixed precision: the dispatched rows (the experts' inputs, the outputs' gradients) travel in
 * the model's activation type (bf16: half the bytes); the combined rows (outputs, input
 * gradients) in fp32, since under tensor parallelism each is a partial sum over the tp ranks'
 * slices of the experts, and partial sums are rounded only once summed (docs/precision.md).
 */
#include "pt/expert_parallel.h"

#include <math.h>
#include <stdlib.h>

typedef struct {
    pt_ep_ops ops;
    pt_backend *be;
    pt_comm *cc;
    int E, k, el, C;
    float capacity_factor;
} pt_ep;

struct pt_ep_state {
    pt_ep_recv recv;
    int64_t *cnt_send, *cnt_recv; /* (ep, el): slots to each rank's experts, from each rank */
    int64_t *rows_to, *rows_from; /* (ep) rows to and from each rank */
    int64_t *counts;              /* (4·ep) scratch: the all-to-alls' element counts */
    size_t cap, n_recv;           /* rows the buffers hold; received by the last dispatch */
    int esize;                    /* bytes of a dispatched element (4 or 2) */
    int64_t rows_sent, rows_recv; /* to and from other ranks, the last dispatch */
    size_t bytes;
};

static size_t ep_max_rows(void *ctx, int N) {
    const pt_ep *p = ctx;
    size_t ep = (size_t)p->cc->size, per = (size_t)(p->k < p->el ? p->k : p->el);
    size_t rows = ep * (size_t)N * per;
    if (p->capacity_factor > 0) {
        size_t cap = (size_t)ceil(p->capacity_factor * N * p->k / p->E);
        if (ep * p->el * cap < rows) rows = ep * p->el * cap;
    }
    return rows;
}

static pt_ep_state *ep_state_create(void *ctx, int N, int esize) {
    pt_ep *p = ctx;
    pt_backend *be = p->be;
    int ep = p->cc->size;
    pt_ep_state *s = pt_calloc(1, sizeof *s);
    s->cnt_send = pt_calloc((size_t)ep * p->el, sizeof(int64_t));
    s->cnt_recv = pt_calloc((size_t)ep * p->el, sizeof(int64_t));
    s->rows_to = pt_calloc((size_t)2 * ep, sizeof(int64_t));
    s->rows_from = s->rows_to + ep;
    s->counts = pt_calloc((size_t)4 * ep, sizeof(int64_t));
    s->cap = ep_max_rows(p, N);
    s->esize = esize;
    size_t rows = (s->cap ? s->cap : 1) * (size_t)p->C, n = rows * sizeof(float);
    s->recv.x = be->alloc(be, rows * esize), s->recv.y = be->alloc(be, n);
    s->recv.dy = be->alloc(be, rows * esize), s->recv.dx = be->alloc(be, n);
    s->bytes = 2 * n + 2 * rows * esize;
    s->recv.rows = s->cnt_recv;
    s->recv.n_blocks = ep * p->el;
    s->recv.el = p->el;
    return s;
}

static void ep_state_free(void *ctx, pt_ep_state *s) {
    if (!s) return;
    pt_backend *be = ((pt_ep *)ctx)->be;
    be->free(be, s->recv.x), be->free(be, s->recv.y);
    be->free(be, s->recv.dy), be->free(be, s->recv.dx);
    free(s->cnt_send), free(s->cnt_recv), free(s->rows_to), free(s->counts);
    free(s);
}

static size_t ep_state_bytes(const pt_ep_state *s) { return s ? s->bytes : 0; }

/* Rows (× C elements of type dt) to each rank, rows from each rank: an all-to-all(v). */
static void ep_exchange(pt_ep *p, pt_ep_state *s, const void *send, const int64_t *rows_to,
                        void *recv, const int64_t *rows_from, pt_dtype dt) {
    pt_comm *cc = p->cc;
    int ep = cc->size;
    int64_t *sc = s->counts, *rc = sc + ep;
    for (int r = 0; r < ep; r++) sc[r] = rows_to[r] * p->C, rc[r] = rows_from[r] * p->C;
    pt_comm_wait(cc, cc->ialltoallv(cc, send, sc, recv, rc, dt));
}

/* The type of the dispatched rows. */
static pt_dtype ep_dtype(const pt_ep_state *s) {
    return s->esize == 2 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
}

static void ep_rows(const int64_t *cnt, int ep, int el, int64_t *rows) {
    for (int r = 0; r < ep; r++) {
        rows[r] = 0;
        for (int j = 0; j < el; j++) rows[r] += cnt[(size_t)r * el + j];
    }
}

static const pt_ep_recv *ep_dispatch(void *ctx, pt_ep_state *s, const void *rows,
                                     const int32_t *off) {
    pt_ep *p = ctx;
    pt_comm *cc = p->cc;
    int ep = cc->size, me = cc->rank, el = p->el;
    for (int e = 0; e < p->E; e++) s->cnt_send[e] = off[e + 1] - off[e]; /* expert e's rank: e/el */
    int64_t *one = s->counts;
    for (int r = 0; r < ep; r++) one[r] = one[ep + r] = el;
    pt_comm_wait(cc, cc->ialltoallv(cc, s->cnt_send, one, s->cnt_recv, one + ep, PT_DTYPE_I64));
    ep_rows(s->cnt_send, ep, el, s->rows_to);
    ep_rows(s->cnt_recv, ep, el, s->rows_from);
    s->n_recv = 0;
    s->rows_sent = s->rows_recv = 0;
    for (int r = 0; r < ep; r++) {
        s->n_recv += (size_t)s->rows_from[r];
        if (r != me) s->rows_sent += s->rows_to[r], s->rows_recv += s->rows_from[r];
    }
    PT_ASSERTF(s->n_recv <= s->cap, "expert parallelism: %zu rows arrived, sized for %zu",
               s->n_recv, s->cap);
    ep_exchange(p, s, rows, s->rows_to, s->recv.x, s->rows_from, ep_dtype(s));
    return &s->recv;
}

static void ep_combine(void *ctx, pt_ep_state *s, float *out) {
    ep_exchange(ctx, s, s->recv.y, s->rows_from, out, s->rows_to, PT_DTYPE_F32);
}

static void ep_dispatch_grad(void *ctx, pt_ep_state *s, const void *dy) {
    ep_exchange(ctx, s, dy, s->rows_to, s->recv.dy, s->rows_from, ep_dtype(s));
}

static void ep_combine_grad(void *ctx, pt_ep_state *s, float *dx) {
    ep_exchange(ctx, s, s->recv.dx, s->rows_from, dx, s->rows_to, PT_DTYPE_F32);
}

static void ep_rows_moved(const pt_ep_state *s, int64_t *sent, int64_t *recv) {
    *sent += s->rows_sent;
    *recv += s->rows_recv;
}

pt_ep_ops *pt_ep_create(pt_backend *be, pt_comm *cc, int E, int top_k, float capacity_factor,
                        int C) {
    pt_ep *p = pt_calloc(1, sizeof *p);
    p->be = be, p->cc = cc, p->E = E, p->k = top_k, p->el = E / cc->size, p->C = C;
    p->capacity_factor = capacity_factor;
    p->ops = (pt_ep_ops){.ctx = p,
                         .state_create = ep_state_create,
                         .max_rows = ep_max_rows,
                         .state_free = ep_state_free,
                         .state_bytes = ep_state_bytes,
                         .dispatch = ep_dispatch,
                         .combine = ep_combine,
                         .dispatch_grad = ep_dispatch_grad,
                         .combine_grad = ep_combine_grad,
                         .rows_moved = ep_rows_moved};
    return &p->ops;
}

void pt_ep_free(pt_ep_ops *ops) {
    if (ops) free(ops->ctx);
}
