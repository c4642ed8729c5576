/* moe.c: the mixture-of-experts MLP of a layer (Mixtral convention), forward and backward.
 *
 * Router: logits = xn · Gᵀ (N, E), p = softmax(logits), each token's top_k experts (ties to the
 * lower index), weights p / Σ p over the chosen (renormalised). The token-slots are sorted by
 * expert, their rows gathered, and each expert runs one grouped SwiGLU over its rows; the results
 * are added back, weighted, into the residual stream. Shared experts (a dense SwiGLU every token
 * passes through) are added too.
 *
 * Load-balancing losses, by default computed per sequence so that any split of a batch over
 * micro-batches and ranks gives the same step (a batch's statistics would not split), each
 * averaged over the sequences of the global batch (m->aux_scale = 1/sequences):
 *   aux = aux_loss_coef · E · Σₑ fₑ·Pₑ, fₑ the sequence's share of token-slots routed to e, Pₑ
 *         its mean router probability of e (gradient through P only);
 *   z   = z_loss_coef · mean over the sequence's tokens of logsumexp(logits)².
 * model.aux_loss_scope = micro_batch takes f and P over each micro-batch's tokens (averaged over
 * the micro-batches); global takes P over the step's tokens and f from the previous step's
 * token-slots over the whole global batch (m->aux_f; the trainer sums the counts over the ranks
 * and makes them the next step's f: the counts of a step are known only after its backward).
 * Routing decisions are made on the host (the router's probabilities are downloaded).
 *
 * Expert parallelism (m->par.ep_ops) moves the sorted slots' rows to the ranks holding their
 * experts and the outputs back (src/parallel/expert_parallel.c); this rank's experts run over
 * what arrived, block by block, as each block lands (the exchange calls them), and the shared
 * experts compute while the last outputs travel back. Context parallelism sums a sequence's routing statistics over
 * the context ranks that hold its parts (m->par.cp_ops).
 *
 * Tensor parallelism splits every expert (and the shared experts) as the dense MLP: each tp rank
 * holds rows [r·Fe/tp, (r+1)·Fe/tp) of w1 and w3 and those columns of w2, runs its slice on the
 * (gathered) input and returns a part of the output, which the caller sums over the tp ranks.
 * The router is replicated: the routing is the same on every rank.
 *
 * Mixed precision (bf16, docs/precision.md): the router runs in fp32 (the normed input's and the
 * router weight's bf16 values, fp32 logits and gradients); the gathered rows, gate/up and h are
 * stored in bf16 (as the dense MLP's); each expert's output y stays fp32 until it is added,
 * weighted, to the layer's output, which the caller rounds once with the residual. Backward
 * rounds each slot's weighted output gradient to bf16 (the GEMMs' operand) and dgu likewise.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/linear.h"
#include "model/moe.h"

struct pt_moe_acts {
    int N, k, E, Fe;
    float *probs;          /* (N, E) host: router probabilities (softmax, or sigmoid scores normalised) */
    float *score;          /* (N, E) host: sigmoid router: the scores */
    float *hlog;           /* (N, E) host: the logits */
    float *zlse;           /* (N) host: logsumexp of each token's logits */
    int32_t *sel;          /* (N, k) host: chosen experts */
    float *w;              /* (N, k) host: their renormalised weights */
    int32_t *off;          /* (E + 1) host: first sorted slot of each expert */
    int32_t *slot_tok;     /* (N·k) host: token of each sorted slot; slot_j: its place in the top-k */
    int32_t *slot_j;
    int32_t *d_tok;        /* (N·k) device copies */
    float *d_w;
    float *logits;         /* (N, E) device */
    /* sorted slots: gathered inputs (C), [gate|up] (2Fe), hidden (Fe) in the model's precision;
     * the experts' outputs y (C) in fp32 */
    void *xg, *gu, *h;
    float *y;
    void *gu_s, *h_s;      /* shared experts (N, 2Fs), (N, Fs), the model's precision */
    /* backward scratch: the slots' weighted output gradients (the model's precision), then fp32
     * dh, dgu and the slots' input gradients; in bf16, forward uses dh and dgu as the fp32 h and
     * gate/up before rounding, and dxg as the normed input in fp32 for the router */
    void *dy;
    float *dh, *dgu, *dxg;
    float *router32;       /* bf16: (E, C) the router weight's values in fp32 */
    size_t bytes;
    /* expert parallelism: the exchange's state (what arrived, kept for backward), and this
     * rank's experts' activations over the received rows, (rows, 2Fe), (rows, Fe) of the model's
     * precision and their fp32 gradients (sized for the most rows that can arrive) */
    pt_ep_state *ep;
    const pt_ep_recv *recv;
    int ep_busy;           /* an exchange is in flight: poll it between GEMMs */
    void *gur, *hr;
    float *dhr, *dgur;
    /* host scratch, sized once */
    double *fseq;     /* (2·N·E): each sequence's fₑ (B, E), then its probability sums (B, E) */
    float *choose;    /* (E) */
    int32_t *fill;    /* (E) */
    float *sw, *bias; /* (N·k) the sorted slots' weights; (E) the router's selection bias */
    pt_bf16 *bias16;  /* (E) bf16: the selection bias as the model computes with it */
    double *dw, *dp;  /* (N·k) each slot's dout · y; (E) */
    float *dl;        /* (N·E) the router logits' gradient */
    double *h_dot, *d_dot; /* (N·k) each sorted slot's dout · y: host, device */
};

/* n elements of esize bytes of device memory, counted into *bytes (be NULL: only counted). */
static void *pt_dev_e(pt_backend *be, size_t n, size_t esize, size_t *bytes) {
    *bytes += (n ? n : 1) * esize;
    return be ? be->alloc(be, (n ? n : 1) * esize) : NULL;
}

static float *pt_dev(pt_backend *be, size_t n, size_t *bytes) {
    return pt_dev_e(be, n, sizeof(float), bytes);
}

/* A layer's device buffers for N tokens, allocated from be (NULL: only counted) and counted into
 * a->bytes; an expert-parallel exchange's only when allocated (its module sizes it). */
static void pt_moe_dev_layout(const pt_model *m, pt_backend *be, pt_moe_acts *a, int N) {
    const pt_model_config *c = &m->cfg;
    int k = c->top_k, E = c->n_experts, Fe = m->loc.Fe, C = c->dim; /* this rank's slice */
    size_t Fs = (size_t)c->n_shared_experts * Fe, S = (size_t)N * k, es = (size_t)m->act_size;
    a->d_tok = be ? be->alloc(be, S * sizeof(int32_t)) : NULL;
    a->d_w = pt_dev(be, S, &a->bytes);
    a->logits = pt_dev(be, (size_t)N * E, &a->bytes);
    a->xg = pt_dev_e(be, S * C, es, &a->bytes);
    a->gu = pt_dev_e(be, S * 2 * Fe, es, &a->bytes);
    a->h = pt_dev_e(be, S * Fe, es, &a->bytes);
    a->y = pt_dev(be, S * C, &a->bytes);
    a->gu_s = pt_dev_e(be, (size_t)N * 2 * Fs, es, &a->bytes);
    a->h_s = pt_dev_e(be, (size_t)N * Fs, es, &a->bytes);
    a->dy = pt_dev_e(be, S * C, es, &a->bytes);
    a->dh = pt_dev(be, S * Fe + (size_t)N * Fs, &a->bytes);
    a->dgu = pt_dev(be, S * 2 * Fe + (size_t)N * 2 * Fs, &a->bytes);
    a->dxg = pt_dev(be, S * C, &a->bytes); /* S ≥ N: it holds the router's fp32 input too */
    if (pt_is_bf16(m)) a->router32 = pt_dev(be, (size_t)E * C, &a->bytes);
    a->d_dot = pt_dev_e(be, S, sizeof(double), &a->bytes);
    const pt_ep_ops *ep = m->par.ep_ops;
    if (ep && be) {
        a->ep = ep->state_create(ep->ctx, N, m->act_size);
        a->bytes += ep->state_bytes(a->ep);
        size_t R = ep->max_rows(ep->ctx, N);
        a->gur = pt_dev_e(be, R * 2 * Fe, es, &a->bytes), a->dgur = pt_dev(be, R * 2 * Fe, &a->bytes);
        a->hr = pt_dev_e(be, R * Fe, es, &a->bytes), a->dhr = pt_dev(be, R * Fe, &a->bytes);
    }
}

size_t pt_moe_acts_count(const pt_model *m, int N) {
    pt_moe_acts a = {0};
    pt_moe_dev_layout(m, NULL, &a, N);
    return a.bytes;
}

pt_moe_acts *pt_moe_acts_create(const pt_model *m, int N) {
    const pt_model_config *c = &m->cfg;
    pt_moe_acts *a = pt_calloc(1, sizeof *a);
    int k = c->top_k, E = c->n_experts, Fe = m->loc.Fe;
    size_t S = (size_t)N * k;
    a->N = N, a->k = k, a->E = E, a->Fe = Fe;
    a->probs = pt_calloc((size_t)N * E, sizeof(float));
    a->score = pt_calloc((size_t)N * E, sizeof(float));
    a->hlog = pt_calloc((size_t)N * E, sizeof(float));
    a->zlse = pt_calloc((size_t)N, sizeof(float));
    a->sel = pt_calloc(S, sizeof(int32_t));
    a->w = pt_calloc(S, sizeof(float));
    a->off = pt_calloc((size_t)E + 1, sizeof(int32_t));
    a->slot_tok = pt_calloc(S, sizeof(int32_t));
    a->slot_j = pt_calloc(S, sizeof(int32_t));
    pt_moe_dev_layout(m, m->be, a, N);
    a->fseq = pt_calloc((size_t)2 * N * E, sizeof(double));
    a->choose = pt_calloc((size_t)E, sizeof(float));
    a->fill = pt_calloc((size_t)E, sizeof(int32_t));
    a->sw = pt_calloc(S, sizeof(float));
    a->bias = pt_calloc((size_t)E, sizeof(float));
    a->bias16 = pt_calloc((size_t)E, sizeof(pt_bf16));
    a->dw = pt_calloc(S, sizeof(double));
    a->dp = pt_calloc((size_t)E, sizeof(double));
    a->dl = pt_calloc((size_t)N * E, sizeof(float));
    a->h_dot = pt_calloc(S, sizeof(double));
    return a;
}

void pt_moe_acts_free(const pt_model *m, pt_moe_acts *a) {
    if (!a) return;
    pt_backend *be = m->be;
    void *dev[] = {a->d_w, a->logits, a->xg, a->gu, a->h, a->y, a->gu_s, a->h_s, a->dy, a->dh,
                   a->dgu, a->dxg};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) be->free(be, dev[i]);
    if (a->router32) be->free(be, a->router32);
    be->free(be, a->d_tok);
    be->free(be, a->d_dot);
    if (a->ep) {
        m->par.ep_ops->state_free(m->par.ep_ops->ctx, a->ep);
        void *rows[] = {a->gur, a->hr, a->dhr, a->dgur};
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) be->free(be, rows[i]);
    }
    free(a->fseq), free(a->choose), free(a->fill), free(a->sw), free(a->bias), free(a->bias16);
    free(a->dw);
    free(a->dp), free(a->dl), free(a->h_dot);
    free(a->probs), free(a->score), free(a->hlog), free(a->zlse), free(a->sel), free(a->w), free(a->off), free(a->slot_tok);
    free(a->slot_j);
    free(a);
}

size_t pt_moe_acts_bytes(const pt_moe_acts *a) { return a ? a->bytes : 0; }

/* The router's probabilities, logsumexp and the top-k of each token, on the host. Softmax:
 * chosen by probability, weights the chosen probabilities renormalised. Sigmoid (bias non-NULL):
 * scores s = sigmoid(x), chosen by s + bias, weights the chosen scores renormalised; the balancing
 * loss's probabilities are s / Σ s. With a capacity, each expert keeps its first cap token-slots
 * (in token order) and the others are dropped. */
static void pt_route(pt_moe_acts *a, const float *logits, int cap, const float *bias) {
    int N = a->N, E = a->E, k = a->k;
    float *choose = a->choose;
    for (int t = 0; t < N; t++) {
        const float *x = logits + (size_t)t * E;
        float *p = a->probs + (size_t)t * E, *sc = a->score + (size_t)t * E, mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = x[e] > mx ? x[e] : mx;
        double sum = 0;
        for (int e = 0; e < E; e++) sum += p[e] = expf(x[e] - mx);
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        a->zlse[t] = (float)(mx + log(sum));
        if (bias) {
            double ss = 0;
            for (int e = 0; e < E; e++) ss += sc[e] = 1.0f / (1.0f + expf(-x[e]));
            for (int e = 0; e < E; e++) p[e] = (float)(sc[e] / ss), choose[e] = sc[e] + bias[e];
        } else {
            for (int e = 0; e < E; e++) choose[e] = p[e];
        }
        const float *val = bias ? sc : p; /* what the weights renormalise */
        /* top-k by repeated selection: the largest not yet chosen, the lower index on ties */
        double s = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= a->sel[(size_t)t * k + i] == e;
                if (!taken && (best < 0 || choose[e] > choose[best])) best = e;
            }
            a->sel[(size_t)t * k + j] = best;
            s += val[best];
        }
        for (int j = 0; j < k; j++)
            a->w[(size_t)t * k + j] = (float)(val[a->sel[(size_t)t * k + j]] / s);
    }
    /* the slots sorted by expert (stable: by token within an expert) */
    memset(a->off, 0, (size_t)(E + 1) * sizeof *a->off);
    for (int i = 0; i < N * k; i++) a->off[a->sel[i] + 1]++;
    for (int e = 0; e < E; e++) a->off[e + 1] += a->off[e];
    int32_t *fill = a->fill;
    memcpy(fill, a->off, (size_t)E * sizeof *fill);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int at = fill[a->sel[(size_t)t * k + j]]++;
            a->slot_tok[at] = t;
            a->slot_j[at] = j;
        }
    if (cap <= 0) return;
    int kept = 0;
    for (int e = 0; e < E; e++) {
        int o = a->off[e], n = a->off[e + 1] - o, keep = n < cap ? n : cap;
        memmove(a->slot_tok + kept, a->slot_tok + o, (size_t)keep * sizeof *a->slot_tok);
        memmove(a->slot_j + kept, a->slot_j + o, (size_t)keep * sizeof *a->slot_j);
        a->off[e] = kept;
        kept += keep;
    }
    a->off[E] = kept;
}

/* Between the GEMMs of the experts while an exchange is in flight: lets its transfers (and the
 * owner's pending communication) progress. */
static void pt_moe_poll(pt_model *m, const pt_moe_acts *a) {
    if (!a->ep_busy) return;
    m->par.ep_ops->progress(m->par.ep_ops->ctx, a->ep);
    if (m->hooks.poll) m->hooks.poll(m->hooks.user);
}

/* A SwiGLU MLP over n rows x (n,C): gu = x·W13ᵀ (n,2F), h = silu(gate)·up (n,F), y = h·W2ᵀ
 * (n,C, fp32) + beta·y; one expert (F = Fe) or the shared experts. gu and h are kept in the
 * model's precision: in bf16 gu32 and h32 (fp32 scratch) take them before they are rounded, and
 * the SwiGLU reads gu's rounded values. a: whose exchange to poll between the GEMMs. */
static void pt_swiglu_mlp_forward(pt_model *m, const pt_moe_acts *a, const void *w13,
                                  const void *w2, int F, const void *x, void *gu, void *h,
                                  float *y, float beta, int n, float *gu32, float *h32) {
    pt_backend *be = m->be;
    int C = m->cfg.dim, bf16 = pt_is_bf16(m);
    float *g = bf16 ? gu32 : gu, *hh = bf16 ? h32 : h;
    pt_linear L13 = {w13, NULL, NULL, NULL, C, 2 * F, 2 * F}, L2 = {w2, NULL, NULL, NULL, F, C, C};
    pt_linear_fwd(m, &L13, x, g, n, 0.0f);
    if (bf16) {
        be->to_bf16(be, gu, g, (size_t)n * 2 * F);
        be->from_bf16(be, g, gu, (size_t)n * 2 * F);
    }
    pt_moe_poll(m, a);
    be->swiglu_forward(be, hh, g, n, F);
    if (bf16) be->to_bf16(be, h, hh, (size_t)n * F);
    pt_linear_fwd(m, &L2, h, y, n, beta);
}

/* Its backward from dy (n,C, the model's precision): weight gradients into g13 and g2 (NULL: left
 * for later), dx (n,C, fp32) = the rows' input gradient + beta·dx; dh (n,F) and dgu (n,2F) fp32
 * scratch. In bf16 the
 * SwiGLU's backward reads gu's values from dgu (in place), and gu's storage, which nothing reads
 * after that, takes dgu rounded to bf16 as the GEMMs' operand. */
static void pt_swiglu_mlp_backward(pt_model *m, const pt_moe_acts *a, const void *w13,
                                   const void *w2, float *g13, float *g2, int F, const void *x,
                                   void *gu, const void *h, const void *dy, float *dx, float beta,
                                   int n, float *dh, float *dgu) {
    pt_backend *be = m->be;
    int C = m->cfg.dim, bf16 = pt_is_bf16(m);
    pt_linear L13 = {w13, NULL, g13, NULL, C, 2 * F, 2 * F}, L2 = {w2, NULL, g2, NULL, F, C, C};
    if (g2) pt_linear_dw(m, &L2, dy, h, n);
    pt_moe_poll(m, a);
    pt_linear_dgrad(m, &L2, dy, dh, n, 0.0f);
    pt_moe_poll(m, a);
    if (bf16) be->from_bf16(be, dgu, gu, (size_t)n * 2 * F);
    be->swiglu_backward(be, dgu, dh, bf16 ? dgu : gu, n, F);
    const void *op = dgu;
    if (bf16) {
        be->to_bf16(be, gu, dgu, (size_t)n * 2 * F);
        op = gu;
    }
    if (g13) pt_linear_dw(m, &L13, op, x, n);
    pt_moe_poll(m, a);
    pt_linear_dgrad(m, &L13, op, dx, n, beta);
}

/* Expert j of this rank's: its w13 (2Fe,C) and the w2 (C,Fe) after it, in the view's precision
 * (weights: the model's; gradients: fp32). */
static const void *pt_expert_w(const pt_model *m, const pt_layer_view *w, int j) {
    return pt_at(m, w->experts, (size_t)j * 3 * m->loc.Fe * m->cfg.dim);
}

/* One block of what arrived, for the exchange's compute: this rank's expert b % el over rows
 * [at, at + n), forward (y), or with g backward (dx, the weight gradients into g). */
typedef struct {
    pt_model *m;
    pt_moe_acts *a;
    const pt_layer_view *w, *g;
} pt_ep_work;

static void pt_ep_block(void *user, int b, size_t at, int n) {
    const pt_ep_work *k = user;
    pt_model *m = k->m;
    pt_moe_acts *a = k->a;
    const pt_ep_recv *r = a->recv;
    size_t Fe = (size_t)a->Fe, C = (size_t)m->cfg.dim;
    int j = b % r->el;
    const void *w13 = pt_expert_w(m, k->w, j), *w2 = pt_at(m, w13, 2 * Fe * C);
    const void *x = pt_at(m, r->x, at * C);
    void *gu = pt_at(m, a->gur, at * 2 * Fe), *h = pt_at(m, a->hr, at * Fe);
    float *dgu = a->dgur + at * 2 * Fe, *dh = a->dhr + at * Fe;
    if (!k->g) {
        pt_swiglu_mlp_forward(m, a, w13, w2, (int)Fe, x, gu, h, r->y + at * C, 0.0f, n, dgu, dh);
        return;
    }
    float *g13 = k->g->experts + (size_t)j * 3 * Fe * C;
    pt_swiglu_mlp_backward(m, a, w13, w2, g13, g13 + 2 * Fe * C, (int)Fe, x, gu, h,
                           pt_at(m, r->dy, at * C), r->dx + at * C, 0.0f, n, dh, dgu);
}

/* The experts under expert parallelism, forward: a->xg (the sorted slots) dispatched, this
 * rank's experts run over each block as it arrives, each block's outputs sent back as soon as
 * computed, into a->y; pt_ep_finish waits for the last (the caller computes in between).
 * Backward: a->dy dispatched like the inputs were, the input gradients back into a->dxg. */
static void pt_ep_forward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w) {
    const pt_ep_ops *ep = m->par.ep_ops;
    pt_ep_work k = {m, a, w, NULL};
    a->recv = ep->dispatch_start(ep->ctx, a->ep, a->xg, a->off, a->y);
    a->ep_busy = 1;
    ep->compute(ep->ctx, a->ep, pt_ep_block, &k);
}

static void pt_ep_backward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w,
                           const pt_layer_view *g) {
    const pt_ep_ops *ep = m->par.ep_ops;
    pt_ep_work k = {m, a, w, g};
    ep->dispatch_grad_start(ep->ctx, a->ep, a->dy, a->dxg);
    a->ep_busy = 1;
    ep->compute(ep->ctx, a->ep, pt_ep_block, &k);
}

static void pt_ep_finish(pt_model *m, pt_moe_acts *a) {
    m->par.ep_ops->finish(m->par.ep_ops->ctx, a->ep);
    a->ep_busy = 0;
}

void pt_moe_a2a_rows(const pt_model *m, const pt_moe_acts *a, int64_t *sent, int64_t *recv) {
    if (a->ep) m->par.ep_ops->rows_moved(a->ep, sent, recv);
}

/* The router's operands in fp32: the normed input xn (N,C) and the router weight, as they are
 * (fp32), or their bf16 values converted (into a->dxg, free outside backward, and a->router32). */
static void pt_router_operands(pt_model *m, pt_moe_acts *a, const pt_layer_view *w, const void *xn,
                               const float **x32, const float **r32) {
    *x32 = xn, *r32 = w->router;
    if (!pt_is_bf16(m)) return;
    size_t C = (size_t)m->cfg.dim;
    m->be->from_bf16(m->be, a->dxg, xn, (size_t)a->N * C);
    m->be->from_bf16(m->be, a->router32, (const pt_bf16 *)(const void *)w->router, a->E * C);
    *x32 = a->dxg, *r32 = a->router32;
}

void pt_moe_model_init(pt_model *m) {
    size_t n = (size_t)m->cfg.n_layers * m->cfg.n_experts;
    m->aux_count = pt_calloc(n, sizeof *m->aux_count);
    m->aux_f = pt_malloc(n * sizeof *m->aux_f);
    for (size_t i = 0; i < n; i++) m->aux_f[i] = 1.0 / m->cfg.n_experts; /* the first step's */
}

void pt_moe_model_free(pt_model *m) {
    free(m->aux_f);
    free(m->aux_count);
}

void pt_model_aux_counts_clear(pt_model *m) {
    if (m->aux_count)
        memset(m->aux_count, 0, (size_t)m->cfg.n_layers * m->cfg.n_experts * sizeof *m->aux_count);
}

void pt_model_aux_f_update(pt_model *m) {
    int E = m->cfg.n_experts;
    for (int l = 0; l < m->cfg.n_layers && m->aux_count; l++) {
        const double *cnt = m->aux_count + (size_t)l * E;
        double slots = 0;
        for (int e = 0; e < E; e++) slots += cnt[e];
        /* a dense layer has no token-slots: its f is never read */
        for (int e = 0; e < E && slots > 0; e++) m->aux_f[(size_t)l * E + e] = cnt[e] / slots;
    }
}

double pt_moe_forward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w, const void *xn,
                      float *out, int B, int T, pt_moe_stats *st, int layer, int recompute) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->N, E = a->E, k = a->k, Fe = a->Fe, C = c->dim;
    int Fs = c->n_shared_experts * Fe;
    int cap = c->capacity_factor > 0 ? (int)ceil(c->capacity_factor * N * k / E) : 0;
    /* router (fp32) */
    const float *x32, *r32;
    pt_router_operands(m, a, w, xn, &x32, &r32);
    be->gemm(be, PT_NO_TRANS, PT_TRANS, N, E, C, 1.0f, x32, C, r32, C, 0.0f, a->logits, E);
    be->download(be, a->hlog, a->logits, (size_t)N * E * sizeof(float));
    float *bias = NULL;
    if (c->router_sigmoid) {
        bias = a->bias;
        if (pt_is_bf16(m)) {
            be->download(be, a->bias16, w->router_bias, (size_t)E * sizeof(pt_bf16));
            for (int e = 0; e < E; e++) bias[e] = pt_bf16_to_float(a->bias16[e]);
        } else {
            be->download(be, bias, w->router_bias, (size_t)E * sizeof *bias);
        }
    }
    pt_route(a, a->hlog, cap, bias);
    int S = a->off[E]; /* the token-slots kept */
    for (int e = 0; e < E && st; e++) st->expert_load[(size_t)layer * E + e] += a->off[e + 1] - a->off[e];
    float *sw = a->sw;
    for (int i = 0; i < S; i++) sw[i] = a->w[(size_t)a->slot_tok[i] * k + a->slot_j[i]];
    be->upload(be, a->d_tok, a->slot_tok, (size_t)S * sizeof(int32_t));
    be->upload(be, a->d_w, sw, (size_t)S * sizeof(float));
    /* each expert's rows: one grouped SwiGLU */
    be->rows_copy(be, a->xg, xn, a->d_tok, S, (size_t)C * m->act_size);
    if (m->par.ep_ops) pt_ep_forward(m, a, w);
    for (int e = 0; e < E && !m->par.ep_ops; e++) {
        int o = a->off[e], n = a->off[e + 1] - o;
        if (n == 0) continue; /* an expert no token chose */
        const void *w13 = pt_expert_w(m, w, e);
        pt_swiglu_mlp_forward(m, a, w13, pt_at(m, w13, (size_t)2 * Fe * C), Fe,
                              pt_at(m, a->xg, (size_t)o * C), pt_at(m, a->gu, (size_t)o * 2 * Fe),
                              pt_at(m, a->h, (size_t)o * Fe), a->y + (size_t)o * C, 0.0f, n,
                              a->dgu + (size_t)o * 2 * Fe, a->dh + (size_t)o * Fe);
    }
    /* under expert parallelism the shared experts compute while the last outputs travel back:
     * they are added first */
    if (!m->par.ep_ops) be->rows_scatter_add(be, out, a->y, a->d_tok, a->d_w, S, C);
    if (Fs > 0)
        pt_swiglu_mlp_forward(m, a, w->wgu, w->wdown, Fs, xn, a->gu_s, a->h_s, out, 1.0f, N,
                              a->dgu + (size_t)S * 2 * Fe, a->dh + (size_t)S * Fe);
    if (m->par.ep_ops) {
        pt_ep_finish(m, a);
        be->rows_scatter_add(be, out, a->y, a->d_tok, a->d_w, S, C);
    }
    /* the balancing losses of this micro-batch's sequences, in units of the objective. A
     * sequence's token-slot counts and probability sums are summed over the context ranks that
     * hold its parts (each of Tt = T·cp tokens) */
    int cp = m->par.cp > 1 ? m->par.cp : 1;
    double Tt = (double)T * cp, aux = 0, z = 0;
    memset(a->fseq, 0, (size_t)2 * B * E * sizeof(double)); /* counts, then probability sums */
    double *cnt = a->fseq, *psum = a->fseq + (size_t)B * E;
    for (int b = 0; b < B; b++)
        for (int t = b * T; t < (b + 1) * T; t++)
            for (int e = 0; e < E; e++) {
                psum[(size_t)b * E + e] += a->probs[(size_t)t * E + e];
                for (int j = 0; j < k; j++) cnt[(size_t)b * E + e] += a->sel[(size_t)t * k + j] == e;
            }
    if (c->aux_scope == PT_AUX_GLOBAL && !recompute) /* this rank's token-slots of the step */
        for (int i = 0; i < B * E; i++) m->aux_count[(size_t)layer * E + i % E] += cnt[i];
    if (m->par.cp_ops) m->par.cp_ops->sum_host_f64(m->par.cp_ops->ctx, a->fseq, (size_t)2 * B * E);
    /* each sequence's row of cnt becomes the fₑ its tokens' P is weighted by (model.aux_loss_scope):
     * the sequence's own share of token-slots; the micro-batch's (Switch: the slots of all its B
     * sequences); or the previous step's shares over the whole global batch. The same sum then
     * gives each scope's loss, P its tokens' mean over the sequence, micro-batch or step */
    if (c->aux_scope == PT_AUX_MICRO_BATCH) {
        double *fmb = a->dp; /* (E): backward's scratch */
        memset(fmb, 0, (size_t)E * sizeof *fmb);
        for (int i = 0; i < B * E; i++) fmb[i % E] += cnt[i];
        for (int i = 0; i < B * E; i++) cnt[i] = fmb[i % E] / (B * Tt * k);
    } else if (c->aux_scope == PT_AUX_GLOBAL) {
        for (int i = 0; i < B * E; i++) cnt[i] = m->aux_f[(size_t)layer * E + i % E];
    } else {
        for (int i = 0; i < B * E; i++) cnt[i] /= Tt * k; /* fₑ of the sequence */
    }
    for (int i = 0; i < B * E; i++) aux += cnt[i] * psum[i] / Tt;
    for (int t = 0; t < B * T; t++) z += (double)a->zlse[t] * a->zlse[t] / Tt;
    /* every context rank has the sequence's aux: each reports its share of it */
    if (st) {
        st->aux_loss += c->aux_loss_coef * E * aux * m->aux_scale / cp;
        st->z_loss += c->z_loss_coef * z * m->aux_scale;
    }
    return 0;
}

void pt_moe_backward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w, const pt_layer_view *g,
                     const void *xn, const float *dout, const void *dout_op, float *dxn, int B,
                     int T, int defer) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->N, E = a->E, k = a->k, Fe = a->Fe, C = c->dim, S = a->off[E];
    int Fs = c->n_shared_experts * Fe;
    /* experts: dY = w · dout of each slot's token (dropped slots have none), rounded to bf16
     * (through a->dxg) under mixed precision */
    if (pt_is_bf16(m)) {
        be->rows_gather(be, a->dxg, dout, a->d_tok, a->d_w, S, C);
        be->to_bf16(be, a->dy, a->dxg, (size_t)S * C);
    } else {
        be->rows_gather(be, a->dy, dout, a->d_tok, a->d_w, S, C);
    }
    be->zero(be, a->dxg, (size_t)S * C * sizeof(float));
    if (m->par.ep_ops) pt_ep_backward(m, a, w, g);
    size_t e3 = (size_t)3 * Fe * C;
    for (int e = 0; e < E && !m->par.ep_ops; e++) {
        int o = a->off[e], n = a->off[e + 1] - o;
        if (n == 0) continue;
        const void *w13 = pt_expert_w(m, w, e);
        float *g13 = defer ? NULL : g->experts + (size_t)e * e3;
        pt_swiglu_mlp_backward(m, a, w13, pt_at(m, w13, (size_t)2 * Fe * C), g13,
                               g13 ? g13 + (size_t)2 * Fe * C : NULL, Fe, pt_at(m, a->xg, (size_t)o * C),
                               pt_at(m, a->gu, (size_t)o * 2 * Fe), pt_at(m, a->h, (size_t)o * Fe),
                               pt_at(m, a->dy, (size_t)o * C), a->dxg + (size_t)o * C, 0.0f, n,
                               a->dh + (size_t)o * Fe, a->dgu + (size_t)o * 2 * Fe);
    }
    if (!m->par.ep_ops) be->rows_scatter_add(be, dxn, a->dxg, a->d_tok, NULL, S, C);
    if (Fs > 0) /* under ep while the last input gradients travel back, as forward */
        pt_swiglu_mlp_backward(m, a, w->wgu, w->wdown, g->wgu, g->wdown, Fs, xn, a->gu_s, a->h_s,
                               dout_op, dxn, 1.0f, N, a->dh + (size_t)S * Fe,
                               a->dgu + (size_t)S * 2 * Fe);
    if (m->par.ep_ops) {
        pt_ep_finish(m, a);
        be->rows_scatter_add(be, dxn, a->dxg, a->d_tok, NULL, S, C);
    }
    /* the router: the weights' gradient (dout · y of each slot), through the renormalisation, the
     * balancing losses and the softmax */
    be->rows_dot(be, a->d_dot, dout, a->d_tok, a->y, S, C);
    be->download(be, a->h_dot, a->d_dot, (size_t)S * sizeof(double));
    double *dw = a->dw;
    memset(dw, 0, (size_t)N * k * sizeof(double)); /* a dropped slot's is 0 */
    for (int i = 0; i < S; i++) dw[(size_t)a->slot_tok[i] * k + a->slot_j[i]] = a->h_dot[i];
    /* with tp each rank's y is its slices' part of the experts' outputs: the dot products add up */
    if (m->par.tp_ops) m->par.tp_ops->sum_host_f64(m->par.tp_ops->ctx, dw, (size_t)N * k);
    float *dl = a->dl;
    double *dp = a->dp;
    double aux_c = c->aux_loss_coef * E * m->aux_scale, z_c = c->z_loss_coef * m->aux_scale;
    for (int b = 0; b < B; b++) {
        /* fₑ of this sequence */
        const double *f = a->fseq + (size_t)b * E; /* the sequence's fₑ (all its context ranks) */
        double Tt = (double)T * (m->par.cp > 1 ? m->par.cp : 1);
        for (int t = b * T; t < (b + 1) * T; t++) {
            const float *p = a->probs + (size_t)t * E, *sc = a->score + (size_t)t * E;
            const int32_t *sel = a->sel + (size_t)t * k;
            const float *wt = a->w + (size_t)t * k;
            const float *val = c->router_sigmoid ? sc : p; /* what the weights renormalise */
            double ssel = 0, wdw = 0, pdp = 0;
            for (int j = 0; j < k; j++) ssel += val[sel[j]], wdw += wt[j] * dw[(size_t)t * k + j];
            /* the balancing loss through P (probabilities p) */
            for (int e = 0; e < E; e++) dp[e] = aux_c * f[e] / Tt, pdp += p[e] * dp[e];
            double sden = 0;
            if (c->router_sigmoid) {
                /* p = s / Σ s: back to the scores, then the weights' renormalisation */
                for (int e = 0; e < E; e++) sden += sc[e];
                for (int e = 0; e < E; e++) dp[e] = (dp[e] - pdp) / sden;
            }
            for (int j = 0; j < k; j++) dp[sel[j]] += (dw[(size_t)t * k + j] - wdw) / ssel;
            /* to the logits: the softmax's Jacobian, or the sigmoid's; plus the z-loss */
            double q = 0;
            if (!c->router_sigmoid)
                for (int e = 0; e < E; e++) q += p[e] * dp[e];
            for (int e = 0; e < E; e++) {
                double soft = exp((double)a->hlog[(size_t)t * E + e] - a->zlse[t]);
                double d = c->router_sigmoid ? dp[e] * sc[e] * (1.0 - sc[e]) : p[e] * (dp[e] - q);
                dl[(size_t)t * E + e] = (float)(d + z_c * 2.0 * a->zlse[t] * soft / Tt);
            }
        }
    }
    be->upload(be, a->logits, dl, (size_t)N * E * sizeof(float)); /* the logits' gradient */
    const float *x32, *r32;
    pt_router_operands(m, a, w, xn, &x32, &r32); /* a->dxg is free again */
    be->gemm(be, PT_TRANS, PT_NO_TRANS, E, C, N, 1.0f, a->logits, E, x32, C, 1.0f, g->router, C);
    /* the router is whole on every tp rank: its part of the input gradient comes from the first
     * (the caller sums the ranks' parts) */
    if (m->par.tp_rank == 0)
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, N, C, E, 1.0f, a->logits, E, r32, C, 1.0f, dxn, C);
}

void pt_moe_backward_weight(pt_model *m, pt_moe_acts *a, const pt_layer_view *g) {
    int E = a->E, Fe = a->Fe, C = m->cfg.dim;
    size_t e3 = (size_t)3 * Fe * C;
    for (int e = 0; e < E; e++) {
        int o = a->off[e], n = a->off[e + 1] - o;
        if (n == 0) continue;
        float *g13 = g->experts + (size_t)e * e3;
        /* dW2 += dYᵀ·h, dW13 += dGUᵀ·x: in bf16 gu's storage holds dGU rounded (the backward's
         * operand), in fp32 dgu does */
        const void *op = pt_is_bf16(m) ? pt_at(m, a->gu, (size_t)o * 2 * Fe)
                                       : (const void *)(a->dgu + (size_t)o * 2 * Fe);
        pt_linear L13 = {NULL, NULL, g13, NULL, C, 2 * Fe, 2 * Fe};
        pt_linear L2 = {NULL, NULL, g13 + (size_t)2 * Fe * C, NULL, Fe, C, C};
        pt_linear_dw(m, &L2, pt_at(m, a->dy, (size_t)o * C), pt_at(m, a->h, (size_t)o * Fe), n);
        pt_linear_dw(m, &L13, op, pt_at(m, a->xg, (size_t)o * C), n);
    }
}
