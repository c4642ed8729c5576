/* expert_parallel.c: expert parallelism, the model's pt_ep_ops.
 *
 * Each of the ep ranks holds E/ep experts of every MoE layer (rank r: experts [r·el, (r+1)·el),
 * el = E/ep). The model routes its tokens and sorts the token-slots by expert; the exchange sends
 * each slot's row to the rank holding its expert (dispatch), after one all-to-all of the counts
 * per (rank, expert); the rank's experts run over what arrived, block by block (from each rank,
 * per local expert); the outputs go back in the same layout (combine). Backward mirrors it: the
 * output gradients go where the inputs went, the input gradients come back.
 *
 * Overlapped (the default): every block travels by itself, point to point: block (r, j), the rows
 * of rank r for this rank's expert j, is one message, and so is its output back. The model calls
 * dispatch_start (the counts, then every receive and send posted; this rank's own rows, which need
 * no transfer, copied), compute (this rank's own blocks first while the others travel, then each
 * peer's as it lands, me+1, me+2, ...; each block's output sent back the moment it is computed,
 * while the next block computes) and finish (the outputs waited for), computing its shared experts
 * between compute and finish while the last outputs travel. MPI moves data only inside its calls:
 * compute polls between blocks and the model calls progress between its GEMMs. The blocks are
 * computed in the same order every step (not as they happen to arrive), so that the experts'
 * weight gradients, summed over the blocks, are the same bits every run. PT_EP_OVERLAP=0 keeps the
 * plain exchange: one all-to-all(v) at the start and one at finish, the blocks in the same order,
 * bit for bit the same results (what the overlap is measured against). A group whose sends and
 * receives are matched in the order they are posted between two ranks, not by tag
 * (pt_comm.ordered_p2p: NCCL), takes the plain exchange too: the overlapped path posts each peer's
 * result receives before the rows that peer will send first, and their order would pair them
 * wrongly (and a receive waiting on a stream blocks what follows it).
 *
 * The bytes are the same either way: a rank sends its rows for other ranks' experts (dispatch)
 * and the outputs of the rows it received (combine), all counted under the ep group (as sends,
 * or all-to-all).
 *
 * A layer's state (counts, the received rows kept for backward, the rows to send back, the
 * requests) belongs to this module and is sized at set-up for the most rows that can arrive: every
 * rank's tokens, each sending min(top_k, el) slots to this rank's experts (with a capacity, at
 * most cap per expert and sender): no allocation while training.
 *
 * Mixed precision: the dispatched rows (the experts' inputs, the outputs' gradients) travel in
 * the model's activation type (bf16: half the bytes); the combined rows (outputs, input
 * gradients) in fp32, since under tensor parallelism each is a partial sum over the tp ranks'
 * slices of the experts, and partial sums are rounded only once summed (docs/precision.md).
 */
#include "pt/expert_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    pt_ep_ops ops;
    pt_backend *be;
    pt_comm *cc;
    int E, k, el, C;
    float capacity_factor;
    int overlap; /* point to point per block (1), or one all-to-all each way (0) */
} pt_ep;

struct pt_ep_state {
    pt_ep_recv recv;
    int64_t *cnt_send, *cnt_recv; /* (ep, el): slots to each rank's experts, from each rank */
    int64_t *rows_to, *rows_from; /* (ep) rows to and from each rank */
    int64_t *at;                  /* (ep·el) the first received row of each block */
    int64_t *soff;                /* (ep·el) the first sent row (in the slots' order) of each */
    int64_t *counts;              /* (4·ep) scratch: the all-to-alls' element counts */
    size_t cap, n_recv;           /* rows the buffers hold; received by the last dispatch */
    int esize;                    /* bytes of a dispatched element (4 or 2) */
    int64_t rows_sent, rows_recv; /* to and from other ranks, the last dispatch */
    size_t bytes;
    /* the exchange in flight: what is sent (rows or dy), where it lands (x or dy), the results
     * (y or dx) and where they go (out or dx); tags of the direction (forward 0, backward 1) */
    const void *send;
    void *land;
    float *res, *out;
    int dir;
    /* (ep·el) each block's requests: its rows in, this rank's rows out to the block's expert,
     * the results back in, the block's results out; NULL when none pending */
    pt_comm_req **req_in, **req_out, **req_back, **req_ret;
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
    size_t nb = (size_t)ep * p->el;
    pt_ep_state *s = pt_calloc(1, sizeof *s);
    s->cnt_send = pt_calloc(nb, sizeof(int64_t));
    s->cnt_recv = pt_calloc(nb, sizeof(int64_t));
    s->at = pt_calloc(nb, sizeof(int64_t));
    s->soff = pt_calloc(nb, sizeof(int64_t));
    s->rows_to = pt_calloc((size_t)2 * ep, sizeof(int64_t));
    s->rows_from = s->rows_to + ep;
    s->counts = pt_calloc((size_t)4 * ep, sizeof(int64_t));
    s->req_in = pt_calloc(4 * nb, sizeof(pt_comm_req *));
    s->req_out = s->req_in + nb, s->req_back = s->req_out + nb, s->req_ret = s->req_back + nb;
    s->cap = ep_max_rows(p, N);
    s->esize = esize;
    size_t rows = (s->cap ? s->cap : 1) * (size_t)p->C, n = rows * sizeof(float);
    s->recv.x = be->alloc(be, rows * esize), s->recv.y = be->alloc(be, n);
    s->recv.dy = be->alloc(be, rows * esize), s->recv.dx = be->alloc(be, n);
    s->bytes = 2 * n + 2 * rows * esize;
    s->recv.rows = s->cnt_recv;
    s->recv.at = s->at;
    s->recv.n_blocks = (int)nb;
    s->recv.el = p->el;
    return s;
}

static void ep_state_free(void *ctx, pt_ep_state *s) {
    if (!s) return;
    pt_backend *be = ((pt_ep *)ctx)->be;
    be->free(be, s->recv.x), be->free(be, s->recv.y);
    be->free(be, s->recv.dy), be->free(be, s->recv.dx);
    free(s->cnt_send), free(s->cnt_recv), free(s->at), free(s->soff), free(s->rows_to);
    free(s->counts), free(s->req_in);
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

/* Element (row, 0) of a buffer of rows of C elements of esize bytes. */
static void *ep_row(const pt_ep *p, const void *buf, int64_t row, size_t esize) {
    return (char *)buf + (size_t)row * p->C * esize;
}

/* Starts moving s->send's rows (block by block, in the slots' order) to s->land (in the blocks'
 * order) and posts the receives of the results into s->out: point to point, or (plain) the
 * all-to-all at once. This rank's own blocks are copied. */
static void ep_start(pt_ep *p, pt_ep_state *s) {
    pt_comm *cc = p->cc;
    int ep = cc->size, me = cc->rank, el = p->el, tag = 2 * el * s->dir;
    pt_dtype dt = ep_dtype(s);
    size_t es = (size_t)s->esize;
    if (!p->overlap) {
        ep_exchange(p, s, s->send, s->rows_to, s->land, s->rows_from, dt);
        return;
    }
    for (int r = 0; r < ep; r++)
        for (int j = 0; j < el && r != me; j++) { /* receives first: the rows, the results */
            int b = r * el + j, e = b; /* block (r, j) coming; this rank's slots of expert e */
            if (s->cnt_recv[b])
                s->req_in[b] = cc->irecv(cc, ep_row(p, s->land, s->at[b], es),
                                         (size_t)(s->cnt_recv[b] * p->C), dt, r, tag + j);
            if (s->cnt_send[e])
                s->req_back[e] = cc->irecv(cc, ep_row(p, s->out, s->soff[e], sizeof(float)),
                                           (size_t)(s->cnt_send[e] * p->C), PT_DTYPE_F32, r,
                                           tag + el + j);
        }
    /* the sends: first to rank me-1, which computes rank me's blocks first of its peers', then
     * to me-2, ... */
    for (int i = 1; i < ep; i++) {
        int r = (me - i + ep) % ep;
        for (int j = 0; j < el; j++) {
            int e = r * el + j;
            if (s->cnt_send[e])
                s->req_out[e] = cc->isend(cc, ep_row(p, s->send, s->soff[e], es),
                                          (size_t)(s->cnt_send[e] * p->C), dt, r, tag + j);
        }
    }
    for (int j = 0; j < el; j++) { /* this rank's own rows stay */
        int b = me * el + j;
        p->be->copy(p->be, ep_row(p, s->land, s->at[b], es), ep_row(p, s->send, s->soff[b], es),
                    (size_t)s->cnt_send[b] * p->C * es);
    }
}

static const pt_ep_recv *ep_dispatch_start(void *ctx, pt_ep_state *s, const void *rows,
                                           const int32_t *off, float *out) {
    pt_ep *p = ctx;
    pt_comm *cc = p->cc;
    int ep = cc->size, me = cc->rank, el = p->el, nb = ep * el;
    for (int e = 0; e < p->E; e++) s->cnt_send[e] = off[e + 1] - off[e]; /* expert e's rank: e/el */
    int64_t *one = s->counts;
    for (int r = 0; r < ep; r++) one[r] = one[ep + r] = el;
    pt_comm_wait(cc, cc->ialltoallv(cc, s->cnt_send, one, s->cnt_recv, one + ep, PT_DTYPE_I64));
    ep_rows(s->cnt_send, ep, el, s->rows_to);
    ep_rows(s->cnt_recv, ep, el, s->rows_from);
    int64_t at = 0;
    for (int b = 0; b < nb; b++) s->at[b] = at, at += s->cnt_recv[b], s->soff[b] = off[b];
    s->n_recv = (size_t)at;
    s->rows_sent = s->rows_recv = 0;
    for (int r = 0; r < ep; r++)
        if (r != me) s->rows_sent += s->rows_to[r], s->rows_recv += s->rows_from[r];
    PT_ASSERTF(s->n_recv <= s->cap, "expert parallelism: %zu rows arrived, sized for %zu",
               s->n_recv, s->cap);
    s->send = rows, s->land = s->recv.x, s->res = s->recv.y, s->out = out, s->dir = 0;
    ep_start(p, s);
    return &s->recv;
}

static void ep_dispatch_grad_start(void *ctx, pt_ep_state *s, const void *dy, float *dx) {
    s->send = dy, s->land = s->recv.dy, s->res = s->recv.dx, s->out = dx, s->dir = 1;
    ep_start(ctx, s);
}

static void ep_progress(void *ctx, pt_ep_state *s) {
    pt_ep *p = ctx;
    if (p->overlap && s) pt_comm_poll(p->cc, NULL);
}

static void ep_compute(void *ctx, pt_ep_state *s, pt_ep_block_fn block, void *user) {
    pt_ep *p = ctx;
    pt_comm *cc = p->cc;
    int ep = cc->size, me = cc->rank, el = p->el, tag = 2 * el * s->dir + el;
    for (int i = 0; i < ep; i++) {
        int r = (me + i) % ep;
        for (int j = 0; j < el; j++) {
            int b = r * el + j;
            int64_t n = s->cnt_recv[b];
            if (!n) continue;
            pt_comm_wait(cc, s->req_in[b]); /* NULL (nothing to wait for) unless in flight */
            s->req_in[b] = NULL;
            block(user, b, (size_t)s->at[b], (int)n);
            float *res = ep_row(p, s->res, s->at[b], sizeof(float));
            if (!p->overlap) continue;
            if (r == me)
                p->be->copy(p->be, ep_row(p, s->out, s->soff[b], sizeof(float)), res,
                            (size_t)n * p->C * sizeof(float));
            else
                s->req_ret[b] = cc->isend(cc, res, (size_t)(n * p->C), PT_DTYPE_F32, r, tag + j);
            ep_progress(p, s);
        }
    }
}

static void ep_finish(void *ctx, pt_ep_state *s) {
    pt_ep *p = ctx;
    if (!p->overlap) {
        ep_exchange(p, s, s->res, s->rows_from, s->out, s->rows_to, PT_DTYPE_F32);
        return;
    }
    pt_comm_req **reqs[] = {s->req_back, s->req_ret, s->req_out};
    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++)
        for (int b = 0; b < s->recv.n_blocks; b++) {
            pt_comm_wait(p->cc, reqs[i][b]);
            reqs[i][b] = NULL;
        }
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
    const char *ov = getenv("PT_EP_OVERLAP");
    PT_ASSERTF(!ov || !strcmp(ov, "0") || !strcmp(ov, "1"),
               "PT_EP_OVERLAP = \"%s\": expected 0 (one all-to-all each way) or 1 (overlapped)",
               ov);
    p->overlap = (!ov || !strcmp(ov, "1")) && !cc->ordered_p2p;
    /* the most pending at once: each block's four messages; the pool keeps twice that */
    if (p->overlap) pt_comm_reserve(cc, 8 * (cc->size - 1) * p->el + 2);
    p->ops = (pt_ep_ops){.ctx = p,
                         .state_create = ep_state_create,
                         .max_rows = ep_max_rows,
                         .state_free = ep_state_free,
                         .state_bytes = ep_state_bytes,
                         .dispatch_start = ep_dispatch_start,
                         .dispatch_grad_start = ep_dispatch_grad_start,
                         .compute = ep_compute,
                         .finish = ep_finish,
                         .progress = ep_progress,
                         .rows_moved = ep_rows_moved};
    return &p->ops;
}

void pt_ep_free(pt_ep_ops *ops) {
    if (ops) free(ops->ctx);
}
