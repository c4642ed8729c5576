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
 * The ring's buffers (two key/value blocks and their gradients, one block's output and lse) and
 * every rank's positions belong to this module, allocated once.
 */
#include "pt/context_parallel.h"

#include <stdlib.h>

typedef struct {
    pt_cp_ops ops;
    pt_backend *be;
    pt_comm *cc;
    int zigzag, overlap, N, H, KV, hd, T;
    float *kvb[2], *dkvb[2], *outb, *lseb; /* device */
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

/* The (N) rows of the key and value columns of qkv packed into kv_rows (rows of 2·kv), or the
 * reverse added: (un)packing the block that travels. */
static void kv_pack(pt_backend *be, float *kv_rows, const float *qkv, int N, int q, int kv, int ld) {
    for (int i = 0; i < N; i++)
        be->copy(be, kv_rows + (size_t)i * 2 * kv, qkv + (size_t)i * ld + q,
                 (size_t)2 * kv * sizeof(float));
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
            be->attention_forward(be, &s, q + p.q, k + p.k, v + p.v, out + p.o, lse + p.l);
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
            be->attention_backward(be, &s, q + p.q, k + p.k, v + p.v, out + p.o, dout + p.o,
                                   lse + p.l, dq + p.q, dk + p.k, dv + p.v);
            pt_comm_poll(c->cc, NULL);
        }
}

/* Ring attention forward of one layer: this rank's queries against every rank's keys and values,
 * which travel round the ring (to rank + 1, from rank − 1) while the current block is computed;
 * the blocks' results merged by their log-sum-exp into att, lse. */
static void cp_attn_forward(void *ctx, const pt_attn_shape *s, const float *qkv, float *att,
                            float *lse, int layer, int recompute, void (*poll)(void *),
                            void *user) {
    pt_cp *c = ctx;
    pt_backend *be = c->be;
    pt_comm *cc = c->cc;
    int cp = cc->size, r = cc->rank, hd = s->head_dim, T = s->Tq, N = s->B * T;
    int q = s->n_heads * hd, kv = s->n_kv_heads * hd, ld = s->ldq;
    PT_ASSERT(N <= c->N);
    cp_positions(c, T);
    pt_attn_shape as = *s;
    as.ldk = as.ldv = 2 * kv;
    kv_pack(be, c->kvb[0], qkv, N, q, kv, ld);
    for (int j = 0; j < cp; j++) {
        int cur = j & 1, src = ((r - j) % cp + cp) % cp;
        pt_comm_req *sr[2] = {NULL, NULL};
        if (j + 1 < cp) {
            int tag = (layer * cp + j) * 4;
            sr[0] = cc->isend(cc, c->kvb[cur], (size_t)N * 2 * kv, PT_DTYPE_F32, (r + 1) % cp, tag);
            sr[1] = cc->irecv(cc, c->kvb[!cur], (size_t)N * 2 * kv, PT_DTYPE_F32, (r + cp - 1) % cp, tag);
            if (!c->overlap) /* the transfer before the compute: to measure the overlap */
                for (int k = 0; k < 2; k++) pt_comm_wait(cc, sr[k]), sr[k] = NULL;
        }
        as.k_pos = c->d_kpos + (size_t)src * T;
        if (!recompute)
            c->attn_pairs += s->B * s->n_heads *
                             pt_attn_visible_pairs(c->kpos + (size_t)r * T, T,
                                                   c->kpos + (size_t)src * T, T);
        if (j == 0) {
            block_forward(c, &as, qkv, c->kvb[cur], c->kvb[cur] + kv, att, lse);
        } else {
            block_forward(c, &as, qkv, c->kvb[cur], c->kvb[cur] + kv, c->outb, c->lseb);
            be->attention_merge(be, att, lse, c->outb, c->lseb, s->B, T, s->n_heads, hd, q);
        }
        if (poll) poll(user);
        for (int k = 0; k < 2; k++)
            if (sr[k]) pt_comm_wait(cc, sr[k]);
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
    kv_pack(be, c->kvb[0], qkv, N, q, kv, ld);
    be->zero(be, c->dkvb[0], n * sizeof(float));
    for (int j = 0; j < cp; j++) {
        int cur = j & 1, src = ((r - j) % cp + cp) % cp;
        int tag = (layer * cp + j) * 4 + 2, to = (r + 1) % cp, from = (r + cp - 1) % cp;
        pt_comm_req *sr[4] = {NULL, NULL, NULL, NULL};
        /* the keys and values go on at once (they do not change); their gradient after */
        if (j + 1 < cp) {
            sr[2] = cc->isend(cc, c->kvb[cur], n, PT_DTYPE_F32, to, tag + 1);
            sr[3] = cc->irecv(cc, c->kvb[!cur], n, PT_DTYPE_F32, from, tag + 1);
            if (!c->overlap)
                for (int k = 2; k < 4; k++) pt_comm_wait(cc, sr[k]), sr[k] = NULL;
        }
        as.k_pos = c->d_kpos + (size_t)src * T;
        block_backward(c, &as, qkv, c->kvb[cur], c->kvb[cur] + kv, att, datt, lse, dqkv,
                       c->dkvb[cur], c->dkvb[cur] + kv);
        if (poll) poll(user);
        /* the block's accumulated gradient on (the last hop takes it to its owner) */
        sr[0] = cc->isend(cc, c->dkvb[cur], n, PT_DTYPE_F32, to, tag);
        sr[1] = cc->irecv(cc, c->dkvb[!cur], n, PT_DTYPE_F32, from, tag);
        for (int k = 0; k < 4; k++)
            if (sr[k]) pt_comm_wait(cc, sr[k]);
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
