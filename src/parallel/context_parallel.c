/* context_parallel.c: context parallelism, the model's pt_cp_ops: ring attention.
 *
 * Each of the cp ranks holds T/cp tokens of every sequence: contiguous chunks, or zigzag (2·cp
 * chunks, rank r holding r and 2·cp − 1 − r, which balances the causal work). Everything but
 * attention is per token and needs nothing from the other ranks. Attention runs as a ring: the
 * rank's keys and values travel to rank + 1 while it computes its queries against the block it
 * holds, cp blocks in all, each block's result merged into the running one by its log-sum-exp
 * (the positions mask what is not causal; tiles with no visible pair are skipped). Backward sends
 * the blocks round again, each with the gradient of its keys and values accumulated by every rank
 * it visits; one more hop takes each gradient home. With overlap, a block's attention runs as
 * one call per (sequence, query head) with the ring polled between them: MPI moves a message
 * only inside its calls. (The key/value gradients then add up head by head: deterministic, not
 * bitwise the single call's.)
 *
 * With bf16 probabilities (pt_attn_shape.p_bf16, the bf16 model) the probabilities multiplying
 * v are bf16(exp(s − lse)) with lse the row's over all keys, which no one block knows: the
 * forward goes round twice. Pass 1 sends the keys alone round the ring and merges the blocks'
 * lse (lse_only; attention_merge at head_dim 0, in double); pass 2 sends keys and values round
 * and adds each block's P16·v into att (lse_in = the merged lse, att zeroed first). The
 * backward, given that lse, rounds the same P16 for dv. The blocks travel in bf16 (the values
 * are bf16 already: exact both ways), their gradients in fp32.
 *
 * Bytes each rank sends per layer and micro-batch (N = B·T_local rows, kv = n_kv_heads·head_dim,
 * both this rank's; full recomputation runs the forward again in backward):
 *   fp32  forward  (cp − 1)·N·2kv·4
 *         backward (cp − 1)·N·2kv·4 (keys, values) + cp·N·2kv·4 (their gradients)
 *   bf16  forward  (cp − 1)·N·kv·2 (pass 1, keys) + (cp − 1)·N·2kv·2 (pass 2) = (cp − 1)·N·kv·6
 *         backward (cp − 1)·N·2kv·2 (keys, values) + cp·N·2kv·4 (their gradients)
 *
 * Documents (pt_attn_shape.q_lo, block-causal attention) need nothing of the ring: a query's
 * bound is the global position where its document starts, which masks the keys of any rank's
 * block by their positions; with overlap each (sequence, head) call takes its sequence's bounds.
 *
 * The ring's buffers (two key/value blocks and their gradients, one block's output and lse) and
 * every rank's positions belong to this module, allocated once. In bf16 the block computed with
 * is the fp32 kvb[0] and the two bf16 blocks on the wire are the halves of kvb[1]: no more
 * memory than fp32.
 */
#include "pt/context_parallel.h"

#include <stdlib.h>

typedef struct {
    pt_cp_ops ops;
    pt_backend *be;
    pt_comm *cc;
    int zigzag, overlap, N, H, KV, hd, T;
    float *kvb[2], *dkvb[2], *outb, *lseb; /* device */
    pt_bf16 *kv16[2];                       /* bf16 blocks on the wire: the halves of kvb[1] */
    int32_t *kpos, *d_kpos;                 /* (cp, T) every rank's positions: host, device */
    int kpos_T;                             /* the T they were made for */
    int64_t attn_pairs;
    size_t bytes;
} pt_cp;

void pt_cp_positions(int cp, int zigzag, int r, int Tl, int32_t *out) {
    int c = cp > 1 ? cp : 1;
    if (!zigzag || c == 1) {
        for (int i = 0; i < Tl; i++) out[i] = r * Tl + i;
        return;
    }
    int s = Tl / 2; /* chunk r and chunk 2c − 1 − r of 2c */
    for (int i = 0; i < s; i++) {
        out[i] = r * s + i;
        out[s + i] = (2 * c - 1 - r) * s + i;
    }
}

int64_t pt_attn_visible_pairs(const int32_t *qp, int Tq, const int32_t *kp, int Tk) {
    int64_t n = 0;
    for (int i = 0; i < Tq; i++)
        for (int j = 0; j < Tk; j++) n += kp[j] <= qp[i];
    return n;
}

/* Every rank's positions for sequences of T local tokens (host and device). */
static void cp_positions(pt_cp *c, int T) {
    if (c->kpos_T == T) return;
    PT_ASSERTF(T <= c->T, "context parallelism: %d tokens per rank, sized for %d", T, c->T);
    int cp = c->cc->size;
    for (int r = 0; r < cp; r++) pt_cp_positions(cp, c->zigzag, r, T, c->kpos + (size_t)r * T);
    c->be->upload(c->be, c->d_kpos, c->kpos, (size_t)cp * T * sizeof(int32_t));
    c->kpos_T = T;
}

/* The block this rank holds first: columns [col, col + w) of qkv's N rows (stride ld) packed into
 * kvb[0] (rows of w), and with bf16 converted into kv16[0], the copy that travels. */
static void ring_start(pt_cp *c, const float *qkv, int N, int col, int w, int ld, int bf16) {
    pt_backend *be = c->be;
    for (int i = 0; i < N; i++)
        be->copy(be, c->kvb[0] + (size_t)i * w, qkv + (size_t)i * ld + col,
                 (size_t)w * sizeof(float));
    if (bf16) be->to_bf16(be, c->kv16[0], c->kvb[0], (size_t)N * w);
}

/* Step j of a ring over blocks of n values: the block held goes on to rank + 1 and the next one
 * comes from rank − 1 (sr[0], sr[1], both tagged tag) while the held one is computed with; returns
 * that block, fp32. fp32: the blocks are kvb[j & 1]. bf16: they travel as kv16[j & 1], the held one
 * converted into kvb[0] (ring_start's for j = 0). */
static float *ring_step(pt_cp *c, int j, size_t n, int bf16, int tag, pt_comm_req **sr) {
    pt_comm *cc = c->cc;
    int cp = cc->size, r = cc->rank, cur = j & 1;
    if (j + 1 < cp) {
        pt_dtype dt = bf16 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
        void *held = bf16 ? (void *)c->kv16[cur] : (void *)c->kvb[cur];
        void *next = bf16 ? (void *)c->kv16[!cur] : (void *)c->kvb[!cur];
        sr[0] = cc->isend(cc, held, n, dt, (r + 1) % cp, tag);
        sr[1] = cc->irecv(cc, next, n, dt, (r + cp - 1) % cp, tag);
        if (!c->overlap) /* the transfer before the compute: to measure the overlap */
            for (int k = 0; k < 2; k++) pt_comm_wait(cc, sr[k]), sr[k] = NULL;
    }
    if (!bf16) return c->kvb[cur];
    if (j > 0) c->be->from_bf16(c->be, c->kvb[0], c->kv16[cur], n);
    return c->kvb[0];
}

/* Waits for the n requests of a step that were started (not NULL). */
static void ring_wait(pt_comm *cc, pt_comm_req **sr, int n) {
    for (int k = 0; k < n; k++)
        if (sr[k]) pt_comm_wait(cc, sr[k]);
}

static void kv_unpack_add(pt_backend *be, float *dqkv, const float *dkv_rows, int N, int q, int kv,
                          int ld) {
    for (int i = 0; i < N; i++)
        be->add(be, dqkv + (size_t)i * ld + q, dkv_rows + (size_t)i * 2 * kv, (size_t)2 * kv);
}

/* Offsets of the piece (sequence b, query head h) of a block's attention into q, out, k, v, lse. */
typedef struct {
    size_t q, o, k, v, l;
} piece;

static piece ring_piece(const pt_attn_shape *as, int b, int h) {
    int rep = as->n_heads / as->n_kv_heads, hd = as->head_dim;
    return (piece){(size_t)b * as->Tq * as->ldq + (size_t)h * hd,
                   (size_t)b * as->Tq * as->ldo + (size_t)h * hd,
                   (size_t)b * as->Tk * as->ldk + (size_t)(h / rep) * hd,
                   (size_t)b * as->Tk * as->ldv + (size_t)(h / rep) * hd,
                   ((size_t)b * as->n_heads + h) * as->Tq};
}

static pt_attn_shape piece_shape(const pt_attn_shape *as) {
    pt_attn_shape s = *as;
    s.B = 1, s.n_heads = 1, s.n_kv_heads = 1;
    return s;
}

/* p + off, NULL staying NULL (the outputs a pass of p_bf16 does not write) */
static float *at(float *p, size_t off) { return p ? p + off : NULL; }

static void block_forward(pt_cp *c, const pt_attn_shape *as, const float *q, const float *k,
                          const float *v, float *out, float *lse) {
    pt_backend *be = c->be;
    if (!c->overlap) {
        be->attention_forward(be, as, q, k, v, out, lse);
        return;
    }
    pt_attn_shape s = piece_shape(as);
    for (int b = 0; b < as->B; b++)
        for (int h = 0; h < as->n_heads; h++) {
            piece p = ring_piece(as, b, h);
            if (as->lse_in) s.lse_in = as->lse_in + p.l;
            if (as->q_lo) s.q_lo = as->q_lo + (size_t)b * as->Tq;
            be->attention_forward(be, &s, q + p.q, k + p.k, v + p.v, at(out, p.o), at(lse, p.l));
            pt_comm_poll(c->cc, NULL);
        }
}

static void block_backward(pt_cp *c, const pt_attn_shape *as, const float *q, const float *k,
                           const float *v, const float *out, const float *dout, const float *lse,
                           float *dq, float *dk, float *dv) {
    pt_backend *be = c->be;
    if (!c->overlap) {
        be->attention_backward(be, as, q, k, v, out, dout, lse, dq, dk, dv);
        return;
    }
    pt_attn_shape s = piece_shape(as);
    for (int b = 0; b < as->B; b++)
        for (int h = 0; h < as->n_heads; h++) {
            piece p = ring_piece(as, b, h);
            if (as->q_lo) s.q_lo = as->q_lo + (size_t)b * as->Tq;
            be->attention_backward(be, &s, q + p.q, k + p.k, v + p.v, out + p.o, dout + p.o,
                                   lse + p.l, dq + p.q, dk + p.k, dv + p.v);
            pt_comm_poll(c->cc, NULL);
        }
}

/* p_bf16, pass 1: the keys alone round the ring, each block's lse (lse_only) merged into lse, the
 * first block's written there (attention_merge at head_dim 0: the lse alone, in double). */
static void cp_lse_pass(pt_cp *c, const pt_attn_shape *s, const float *qkv, float *att,
                        float *lse, int layer, void (*poll)(void *), void *user) {
    pt_comm *cc = c->cc;
    int cp = cc->size, r = cc->rank, T = s->Tq, N = s->B * T;
    int q = s->n_heads * s->head_dim, kv = s->n_kv_heads * s->head_dim;
    pt_attn_shape as = *s;
    as.ldk = as.ldv = kv, as.lse_only = 1;
    ring_start(c, qkv, N, q, kv, s->ldq, 1);
    for (int j = 0; j < cp; j++) {
        pt_comm_req *sr[2] = {NULL, NULL};
        float *k = ring_step(c, j, (size_t)N * kv, 1, (layer * cp + j) * 4 + 1, sr);
        as.k_pos = c->d_kpos + (size_t)(((r - j) % cp + cp) % cp) * T;
        block_forward(c, &as, qkv, k, k, NULL, j ? c->lseb : lse);
        if (j) c->be->attention_merge(c->be, att, lse, att, c->lseb, s->B, T, s->n_heads, 0, 0);
        if (poll) poll(user);
        ring_wait(cc, sr, 2);
    }
}

/* Ring attention forward of one layer: this rank's queries against every rank's keys and values,
 * which travel round the ring (to rank + 1, from rank − 1) while the current block is computed;
 * the blocks' results merged by their log-sum-exp into att, lse. p_bf16: the lse first
 * (cp_lse_pass), then each block's P16·v added into att. */
static void cp_attn_forward(void *ctx, const pt_attn_shape *s, const float *qkv, float *att,
                            float *lse, int layer, int recompute, void (*poll)(void *),
                            void *user) {
    pt_cp *c = ctx;
    pt_backend *be = c->be;
    pt_comm *cc = c->cc;
    int cp = cc->size, r = cc->rank, hd = s->head_dim, T = s->Tq, N = s->B * T;
    int q = s->n_heads * hd, kv = s->n_kv_heads * hd, ld = s->ldq, bf16 = s->p_bf16;
    PT_ASSERT(N <= c->N);
    cp_positions(c, T);
    pt_attn_shape as = *s;
    if (bf16) {
        cp_lse_pass(c, s, qkv, att, lse, layer, poll, user);
        as.lse_in = lse;
        be->zero(be, att, (size_t)N * q * sizeof(float));
    }
    as.ldk = as.ldv = 2 * kv;
    ring_start(c, qkv, N, q, 2 * kv, ld, bf16);
    for (int j = 0; j < cp; j++) {
        pt_comm_req *sr[2] = {NULL, NULL};
        int src = ((r - j) % cp + cp) % cp;
        float *kvj = ring_step(c, j, (size_t)N * 2 * kv, bf16, (layer * cp + j) * 4, sr);
        as.k_pos = c->d_kpos + (size_t)src * T;
        if (!recompute)
            c->attn_pairs += s->B * s->n_heads *
                             pt_attn_visible_pairs(c->kpos + (size_t)r * T, T,
                                                   c->kpos + (size_t)src * T, T);
        if (bf16) {
            block_forward(c, &as, qkv, kvj, kvj + kv, att, NULL);
        } else if (j == 0) {
            block_forward(c, &as, qkv, kvj, kvj + kv, att, lse);
        } else {
            block_forward(c, &as, qkv, kvj, kvj + kv, c->outb, c->lseb);
            be->attention_merge(be, att, lse, c->outb, c->lseb, s->B, T, s->n_heads, hd, q);
        }
        if (poll) poll(user);
        ring_wait(cc, sr, 2);
    }
}

/* Ring attention backward: the blocks go round again in the same order, each with the gradient
 * of its keys and values accumulated by every rank it visits; one more hop takes each
 * accumulated gradient home, where it joins dqkv. */
static void cp_attn_backward(void *ctx, const pt_attn_shape *s, const float *qkv, const float *att,
                             const float *datt, const float *lse, float *dqkv, int layer,
                             void (*poll)(void *), void *user) {
    pt_cp *c = ctx;
    pt_backend *be = c->be;
    pt_comm *cc = c->cc;
    int cp = cc->size, r = cc->rank, hd = s->head_dim, T = s->Tq, N = s->B * T;
    int q = s->n_heads * hd, kv = s->n_kv_heads * hd, ld = s->ldq;
    size_t n = (size_t)N * 2 * kv;
    PT_ASSERT(N <= c->N);
    cp_positions(c, T);
    pt_attn_shape as = *s;
    as.ldk = as.ldv = 2 * kv;
    ring_start(c, qkv, N, q, 2 * kv, ld, s->p_bf16);
    be->zero(be, c->dkvb[0], n * sizeof(float));
    for (int j = 0; j < cp; j++) {
        int cur = j & 1, src = ((r - j) % cp + cp) % cp;
        int tag = (layer * cp + j) * 4 + 2, to = (r + 1) % cp, from = (r + cp - 1) % cp;
        pt_comm_req *sr[4] = {NULL, NULL, NULL, NULL};
        /* the keys and values go on at once (they do not change); their gradient after */
        float *kvj = ring_step(c, j, n, s->p_bf16, tag + 1, sr + 2);
        as.k_pos = c->d_kpos + (size_t)src * T;
        block_backward(c, &as, qkv, kvj, kvj + kv, att, datt, lse, dqkv, c->dkvb[cur],
                       c->dkvb[cur] + kv);
        if (poll) poll(user);
        /* the block's accumulated gradient on (the last hop takes it to its owner) */
        sr[0] = cc->isend(cc, c->dkvb[cur], n, PT_DTYPE_F32, to, tag);
        sr[1] = cc->irecv(cc, c->dkvb[!cur], n, PT_DTYPE_F32, from, tag);
        ring_wait(cc, sr, 4);
    }
    /* after cp hops this rank holds its own block's gradient */
    kv_unpack_add(be, dqkv, c->dkvb[cp & 1], N, q, kv, ld);
}

static void cp_sum_host_f64(void *ctx, double *x, size_t n) {
    pt_allreduce_sum(((pt_cp *)ctx)->cc, x, n, PT_DTYPE_F64);
}

static float *cp_buf(pt_cp *c, size_t n) {
    c->bytes += n * sizeof(float);
    return c->be->alloc(c->be, n * sizeof(float));
}

pt_cp_ops *pt_cp_create(pt_backend *be, pt_comm *cc, int zigzag, int overlap, int N, int H, int KV,
                        int head_dim, int T_local) {
    pt_cp *c = pt_calloc(1, sizeof *c);
    c->be = be, c->cc = cc, c->zigzag = zigzag, c->overlap = overlap;
    c->N = N, c->H = H, c->KV = KV, c->hd = head_dim, c->T = T_local;
    size_t kvn = (size_t)N * 2 * KV * head_dim, B = (size_t)(N / T_local);
    for (int k = 0; k < 2; k++) c->kvb[k] = cp_buf(c, kvn), c->dkvb[k] = cp_buf(c, kvn);
    c->kv16[0] = (pt_bf16 *)(void *)c->kvb[1], c->kv16[1] = c->kv16[0] + kvn;
    c->outb = cp_buf(c, (size_t)N * H * head_dim);
    c->lseb = cp_buf(c, B * H * T_local);
    c->kpos = pt_calloc((size_t)cc->size * T_local, sizeof *c->kpos);
    c->d_kpos = be->alloc(be, (size_t)cc->size * T_local * sizeof(int32_t));
    c->ops = (pt_cp_ops){.ctx = c,
                         .attn_forward = cp_attn_forward,
                         .attn_backward = cp_attn_backward,
                         .sum_host_f64 = cp_sum_host_f64};
    return &c->ops;
}

void pt_cp_free(pt_cp_ops *ops) {
    if (!ops) return;
    pt_cp *c = ops->ctx;
    float *bufs[] = {c->kvb[0], c->kvb[1], c->dkvb[0], c->dkvb[1], c->outb, c->lseb};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) c->be->free(c->be, bufs[i]);
    c->be->free(c->be, c->d_kpos);
    free(c->kpos);
    free(c);
}

int64_t pt_cp_attn_pairs(const pt_cp_ops *ops) { return ops ? ((const pt_cp *)ops->ctx)->attn_pairs : 0; }

size_t pt_cp_bytes(const pt_cp_ops *ops) { return ops ? ((const pt_cp *)ops->ctx)->bytes : 0; }
