/* acts.h: a micro-batch's activations as the model's files share them (llama.c lays them out and
 * composes the layer; linear.c runs its linears; moe.c keeps its own), and the small helpers they
 * all use: the hooks, the residual rows, the parallel operations' degree-1 forms, precision. */
#ifndef PT_MODEL_ACTS_H
#define PT_MODEL_ACTS_H

#include "pt/model.h"

#include "model/prec.h"

/* A layer's activations: arrays of the model's activation elements (fp32 or bf16, m->act_size
 * bytes), except rstd and lse, always fp32. */
typedef struct {
    void *x;       /* (N,C) layer input (the residual stream) */
    void *rstd1;   /* (N) fp32 */
    void *xn1;     /* (R,C) this rank's rows (sp: gathered into xg where a GEMM reads them) */
    void *qkv;     /* (N, q+2kv), q and k after rope */
    void *att;     /* (N, q) attention output */
    void *lse;     /* (B, H, T) fp32 */
    void *xmid;    /* (N,C) residual after attention */
    void *rstd2;   /* (N) fp32 */
    void *xn2;     /* (R,C) likewise */
    void *gu;      /* (N,2F) */
    void *h;       /* (N,F) */
    struct pt_moe_acts *moe; /* a mixture-of-experts layer's routing and experts' activations */
    int re;        /* pt_recompute: what this layer computes again in backward */
    unsigned keep; /* bit PT_A_*: the array is this layer's own (else the workspace's) */
    /* zero bubble: what the deferred weight gradients need */
    float *z_dmlp, *z_dgu, *z_datt, *z_dqkv; /* (N,C), (N,2F), (N,C), (N, q+2kv) */
} pt_layer_acts;

struct pt_acts {
    int B, T;
    int l0, l1, first, last; /* the chunk: layers [l0, l1), with the embedding, with the head */
    int zb;
    int cap_B, cap_T; /* the shape it was sized for */
    size_t bytes;
    pt_layer_acts *layers;
    void *xout;       /* (N,C) output of the last layer (activation elements) */
    float *rstdf;     /* (N) */
    void *xf;         /* (N,C) final-norm output (activation elements): the scratch's, or with
                       * the head split over the pipeline the set's own (its HEAD comes later) */
    float *dxf;       /* (N,C) gradient of xf from the fused head + loss: likewise */
    float *dxr;       /* (R,C) this rank's rows of it summed over tp, kept for the backward (the
                       * set's own; dxf itself when the head is split) */
    float *logits;    /* (CHUNK, V) scratch for the fused head */
    float *losses;    /* (CHUNK) */
    float *dx;        /* (R,C) gradient of the residual stream (a chunk's boundary: its own) */
    /* the backward's scratch: pointers into the model's one pt_model_scratch */
    float *dxn;       /* (N,C) */
    float *dqkv;      /* (N, q+2kv) */
    float *datt;      /* (N, q) */
    float *dgu;       /* (N, 2F) */
    float *dh;        /* (N, F) */
    int head_rows;    /* rows per chunk of the fused head + loss */
    int32_t *pos;     /* (T) positions of the last forward (host copy; device copy below) */
    int32_t *d_pos;   /* (T) device */
    int32_t *d_rows;  /* (B·T) position of every row, for rope (device) */
    float *dfull;     /* (N,C) sequence parallelism: the gathered gradient of the residual */
    float *dnorm;     /* (2C) sequence parallelism: this micro-batch's norm weight gradients */
    float *dkv;       /* (2·kv, C) a replicated key/value head's weight gradient */
    int32_t *h_rows;  /* (B·T) host: the position of every row */
    /* documents (pt_acts_set_documents): the caller's (B·T) device array of where each row's
     * document starts, or NULL; its copy for the last forward (device, host); restart: rope
     * positions count from each document's start */
    const int32_t *docs;
    int docs_restart;
    int32_t *d_lo, *h_lo;
    int has_lo;
    int32_t *h_tg;    /* (head_rows) host: a chunk's targets */
    float *h_losses;  /* (head_rows) host: a chunk's losses */
    /* bf16 only: fp32 scratch where kernels read converted and write unrounded values, (N,
     * max(C, q+2kv, 2F)) and (N, max(C, q, F)); a rounded gradient as a GEMM operand; a norm's
     * weight in fp32 (C) */
    float *sA, *sB;
    void *g16;
    float *wn;        /* (max(C, q+2kv)) */
    float *ones;      /* (B·T) ones: a bias is added and its gradient summed by GEMMs with them */
    void *xg;         /* (N,C) sp: a linear's sharded input gathered (activation elements) */
    int has_targets;
    pt_moe_stats *stats; /* pt_acts_set_stats: where a training forward's MoE statistics go */
    pt_moe_stats *counting; /* during a forward: stats, or NULL (evaluation, decoding) */
    pt_kv_cache *kv;  /* decoding (pt_model_decode): the cache attention reads and appends to */
    void *block;      /* the one allocation everything above points into */
};

/* The backward's scratch: what a micro-batch does not keep between its forward and its backward
 * (the input gradients of the layer's arrays, bf16's fp32 scratch, a gathered input, the head's
 * chunk of logits), one per rank, made with the first activations (sized for them and for the
 * head when one of the rank's chunks ends the model) and shared by every set: one set computes
 * at a time. */
struct pt_model_scratch {
    float *dxn, *dqkv, *datt, *dgu, *dh, *dfull, *dnorm, *dkv, *sA, *sB, *wn, *ones, *logits,
        *losses;
    void *g16, *xg;
    void *xf;     /* (N,C) the final norm's output and its gradient (fp32), on the rank holding */
    float *dxf;   /* the head (not split): the fused head and loss use them in the forward */
    void *block;
    int N, HR;
    int users;
    size_t bytes;
};

/* The recomputation workspace: one layer's arrays that layers do not keep (sized for the first
 * activations made), the output of a recomputed layer, and a recomputed MoE layer's buffers. */
struct pt_model_ws {
    pt_layer_acts la;
    struct pt_moe_acts *moe;
    void *xnext;  /* (R,C) activation elements */
    void *block;
    int B, T, zb;
    int users; /* the activations that point into it: the last one freed frees it */
    size_t bytes;
};

static inline void pt_acquire(pt_model *m, int unit, int use, int backward) {
    if (m->hooks.acquire) m->hooks.acquire(m->hooks.user, unit, use, backward);
}

static inline void pt_release(pt_model *m, int unit, int use, int backward) {
    if (m->hooks.release) m->hooks.release(m->hooks.user, unit, use, backward);
}

static inline void pt_poll(pt_model *m) {
    if (m->hooks.poll) m->hooks.poll(m->hooks.user);
}


/* Rows of the residual stream this rank holds: all N, or its N/tp with sequence parallelism. */
static inline int pt_res_rows(const pt_model *m, int N) {
    return m->par.sp && m->par.tp > 1 ? N / m->par.tp : N;
}


/* Whether sequence parallelism splits the residual stream (and the norms' outputs) by rows. */
static inline int pt_sharded(const pt_model *m) { return m->par.sp && m->par.tp > 1; }

/* the parallel operations (parallel_ops.h): NULL tables at degree 1 */

/* A row-parallel block's partial output y (N,C) summed over the tp ranks: in full, or with
 * sequence parallelism only this rank's rows, left at the start of y. */
static inline void pt_tp_reduce(const pt_model *m, float *y, int N, int C) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp) tp->reduce(tp->ctx, y, N, C);
}

/* Sequence parallelism: every rank's rows of full (N,C) gathered, this rank's rows already at
 * their place in full. */
static inline void pt_tp_gather(const pt_model *m, void *full, int N, int C, int esize) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp && tp->gather) tp->gather(tp->ctx, full, N, C, esize);
}

/* The overlapped forms (parallel_ops.h): rows(user, ·) on every block of rows, the transfers
 * hidden behind it; at degree 1 simply rows(user, 0, N). */
static inline void pt_tp_gather_rows(const pt_model *m, void *full, int N, int C, int esize,
                              pt_rows_fn rows, void *user) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp && tp->gather)
        tp->gather_rows(tp->ctx, full, N, C, esize, rows, user);
    else
        rows(user, 0, N);
}

static inline void pt_tp_reduce_rows(const pt_model *m, float *y, int N, int C, pt_rows_fn rows,
                              void *user) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp)
        tp->reduce_rows(tp->ctx, y, N, C, rows, user);
    else
        rows(user, 0, N);
}

/* A reduce started now and finished by pt_tp_reduce_end, the caller computing in between. */
static inline void pt_tp_reduce_begin(const pt_model *m, float *y, int N, int C) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp) tp->reduce_start(tp->ctx, y, N, C);
}

static inline void pt_tp_reduce_end(const pt_model *m) {
    const pt_tp_ops *tp = m->par.tp_ops;
    if (tp) tp->reduce_finish(tp->ctx);
}

static inline void pt_poll_cb(void *user) { pt_poll(user); }

/* This rank's first row of a full (N, ·) array: its rows of the residual stream. */
static inline size_t pt_own_row0(const pt_model *m, int N) {
    return m->par.sp && m->par.tp > 1 ? (size_t)m->par.tp_rank * (N / m->par.tp) : 0;
}

/* precision (docs/precision.md): activations are fp32 or bf16; kernels other than the GEMM
 * compute in fp32, so a bf16 activation is converted into fp32 scratch to be read and a result
 * computed in fp32 scratch is rounded into it. In fp32 each helper below is the identity (the
 * kernels read and write the activations themselves), so fp32 runs the same operations as
 * always. */

/* An activation (n elements) as fp32: itself, or its values converted into scratch. */
static inline const float *pt_f32(pt_model *m, float *scratch, const void *act, size_t n) {
    if (!pt_is_bf16(m)) return act;
    m->be->from_bf16(m->be, scratch, act, n);
    return scratch;
}

/* Where a kernel writes what becomes the activation act: act itself, or fp32 scratch... */
static inline float *pt_out(pt_model *m, void *act, float *scratch) {
    return pt_is_bf16(m) ? scratch : act;
}

/* ...and the result stored as act (rounded to bf16); nothing to do in fp32. */
static inline void pt_store(pt_model *m, void *act, const float *res, size_t n) {
    if (pt_is_bf16(m)) m->be->to_bf16(m->be, act, res, n);
}

/* A gradient (fp32, n) as a GEMM operand: itself, or rounded into the bf16 scratch. */
static inline const void *pt_gop(pt_model *m, pt_acts *a, const float *g, size_t n) {
    if (!pt_is_bf16(m)) return g;
    m->be->to_bf16(m->be, a->g16, g, n);
    return a->g16;
}

/* A norm's weight (C) as fp32: the master's (fp32) or its bf16 copy's values. */
static inline const float *pt_wvec(pt_model *m, pt_acts *a, const float *w) {
    return pt_f32(m, a->wn, w, (size_t)m->cfg.dim);
}

/* y (N rows of n at stride ld, fp32) += the bias b (n, as the model computes with it: the
 * master's or the bf16 copy's values): a GEMM of the ones column by the bias row, each element
 * y + b rounded once. */
static inline void pt_add_bias(pt_model *m, pt_acts *a, float *y, const float *b, int N, int n, int ld) {
    const float *b32 = pt_f32(m, a->wn, b, (size_t)n);
    m->be->gemm(m->be, PT_NO_TRANS, PT_NO_TRANS, N, n, 1, 1.0f, a->ones, 1, b32, n, 1.0f, y, ld);
}

/* db (n) += Σ over the N rows of dy (n at stride ld, fp32): the bias's gradient (beta 0: =). */
static inline void pt_bias_grad(pt_model *m, pt_acts *a, float *db, const float *dy, int N, int n, int ld,
                         float beta) {
    m->be->gemm(m->be, PT_TRANS, PT_NO_TRANS, 1, n, N, 1.0f, a->ones, 1, dy, ld, beta, db, n);
}

/* The weights the model computes with: the masters, or their bf16 copy. */
static inline const pt_model_view *pt_wc(const pt_model *m) { return pt_is_bf16(m) ? &m->w16 : &m->w; }

#endif
