/* llama.c: the Llama decoder's forward and backward (fp32), written as explicit op pairs.
 *
 * One micro-batch of B sequences of T tokens is N = B·T rows. Per layer:
 *   x (N,C) -> xn1 = rmsnorm(x) -> qkv = xn1·Wqkvᵀ (N, q+2kv) -> rope(q,k) -> att = attention
 *   -> x += att·Woᵀ -> xn2 = rmsnorm(x) -> gu = xn2·Wguᵀ (N,2F) -> h = silu(g)·u -> x += h·Wdownᵀ
 * then xf = rmsnorm(x) and the head. The head and the loss are fused: the logits are computed in
 * chunks of rows, turned into their gradient in place (softmax − onehot) and immediately pushed
 * through the head's backward, so that the (N, V) logits are never held whole.
 *
 * Saved for backward per layer: the layer input x, rstd of both norms, xn1, qkv (after rope),
 * att, lse, the residual after attention, xn2, gu and h. The attention never stores T×T scores.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pt/model.h"

/* Rows of logits processed at a time by the fused head + loss: enough rows that the head's
 * weight-gradient GEMM (K = rows) runs near peak (128 rows: ~200 GFLOP/s, 512: ~245 on 2 cores),
 * few enough that the chunk's logits stay small (512 × 50257 floats = 98 MiB). */
#define PT_HEAD_CHUNK_ELEMS ((size_t)32 << 20)
static int pt_head_chunk_rows(int V, int N) {
    size_t rows = PT_HEAD_CHUNK_ELEMS / (size_t)V;
    if (rows > 512) rows = 512;
    if (rows < 16) rows = 16;
    return (int)(rows < (size_t)N ? rows : (size_t)N);
}

typedef struct {
    float *x;      /* (N,C) layer input (the residual stream) */
    float *rstd1;  /* (N) */
    float *xn1;    /* (N,C) */
    float *qkv;    /* (N, q+2kv), q and k after rope */
    float *att;    /* (N, q) attention output */
    float *lse;    /* (B, H, T) */
    float *xmid;   /* (N,C) residual after attention */
    float *rstd2;  /* (N) */
    float *xn2;    /* (N,C) */
    float *gu;     /* (N,2F) */
    float *h;      /* (N,F) */
} pt_layer_acts;

struct pt_acts {
    int B, T;
    int cap_B, cap_T; /* the shape it was sized for */
    size_t bytes;
    pt_layer_acts *layers;
    float *xout;      /* (N,C) output of the last layer */
    float *rstdf;     /* (N) */
    float *xf;        /* (N,C) final-norm output */
    float *dxf;       /* (N,C) gradient of xf, from the fused head + loss */
    float *logits;    /* (CHUNK, V) scratch for the fused head */
    float *losses;    /* (CHUNK) */
    /* backward scratch */
    float *dx;        /* (N,C) gradient of the residual stream */
    float *dxn;       /* (N,C) */
    float *dqkv;      /* (N, q+2kv) */
    float *datt;      /* (N, q) */
    float *dgu;       /* (N, 2F) */
    float *dh;        /* (N, F) */
    int head_rows;    /* rows per chunk of the fused head + loss */
    int32_t *pos;     /* (T) positions of the last forward (host copy; device copy below) */
    int32_t *d_pos;   /* (T) device */
    int32_t *d_rows;  /* (B·T) position of every row, for rope (device) */
    int has_targets;
    float *block;     /* the one allocation everything above points into */
};

static int pt_head_dim(const pt_model_config *c) { return c->dim / c->n_heads; }

pt_status pt_model_config_check(const pt_model_config *c) {
#define PT_CHECK_POS(field)                                                                       \
    if (c->field <= 0) return pt_errorf(PT_ERR_CONFIG, "model." #field " must be > 0 (got %d)", c->field)
    PT_CHECK_POS(vocab_size);
    PT_CHECK_POS(dim);
    PT_CHECK_POS(n_layers);
    PT_CHECK_POS(n_heads);
    PT_CHECK_POS(n_kv_heads);
    PT_CHECK_POS(ffn_dim);
    PT_CHECK_POS(max_seq_len);
#undef PT_CHECK_POS
    if (c->dim % c->n_heads != 0)
        return pt_errorf(PT_ERR_CONFIG, "model.dim (%d) must be divisible by model.n_heads (%d)",
                         c->dim, c->n_heads);
    if ((c->dim / c->n_heads) % 2 != 0)
        return pt_errorf(PT_ERR_CONFIG, "head dim model.dim/model.n_heads = %d must be even (rotary)",
                         c->dim / c->n_heads);
    if (c->n_heads % c->n_kv_heads != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "model.n_heads (%d) must be divisible by model.n_kv_heads (%d)", c->n_heads,
                         c->n_kv_heads);
    if (!(c->rope_theta > 0)) return pt_errorf(PT_ERR_CONFIG, "model.rope_theta must be > 0");
    if (!(c->norm_eps > 0)) return pt_errorf(PT_ERR_CONFIG, "model.norm_eps must be > 0");
    if (c->vocab_size > 65536)
        return pt_errorf(PT_ERR_CONFIG, "model.vocab_size %d exceeds 65536 (tokens are stored as uint16)",
                         c->vocab_size);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* parameter table */

static void pt_table_add(pt_param_table *t, int *cap, pt_param_kind kind, const char *name,
                         int layer, int64_t d0, int64_t d1, pt_tp_split tp, pt_pp_place pp) {
    if (t->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        t->p = realloc(t->p, (size_t)*cap * sizeof *t->p);
        PT_ASSERT(t->p != NULL);
    }
    pt_param *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = kind;
    p->layer = layer;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
    p->decay = p->ndim == 2;
    p->tp = tp;
    p->pp = pp;
    p->expert = -1;
    p->unit = layer >= 0 ? layer + 1 : (kind == PT_KIND_EMBED ? 0 : -1); /* others: set below */
    p->offset = t->total;
    t->total += p->numel;
}

void pt_param_table_build(pt_param_table *t, const pt_model_config *c) {
    memset(t, 0, sizeof *t);
    int cap = 0;
    int hd = pt_head_dim(c), q = c->n_heads * hd, kv = c->n_kv_heads * hd;
    char name[96];
    pt_table_add(t, &cap, PT_KIND_EMBED, "model.embed_tokens.weight", -1, c->vocab_size, c->dim,
                 PT_TP_VOCAB, PT_PP_FIRST);
    for (int l = 0; l < c->n_layers; l++) {
#define PT_ADD(kind, suffix, d0, d1, tp)                                                          \
    snprintf(name, sizeof name, "model.layers.%d.%s", l, suffix);                                 \
    pt_table_add(t, &cap, kind, name, l, d0, d1, tp, PT_PP_LAYER)
        PT_ADD(PT_KIND_ATTN_NORM, "input_layernorm.weight", c->dim, 0, PT_TP_REPLICATED);
        PT_ADD(PT_KIND_WQ, "self_attn.q_proj.weight", q, c->dim, PT_TP_COLUMN);
        PT_ADD(PT_KIND_WK, "self_attn.k_proj.weight", kv, c->dim, PT_TP_COLUMN);
        PT_ADD(PT_KIND_WV, "self_attn.v_proj.weight", kv, c->dim, PT_TP_COLUMN);
        PT_ADD(PT_KIND_WO, "self_attn.o_proj.weight", c->dim, q, PT_TP_ROW);
        PT_ADD(PT_KIND_MLP_NORM, "post_attention_layernorm.weight", c->dim, 0, PT_TP_REPLICATED);
        PT_ADD(PT_KIND_WGATE, "mlp.gate_proj.weight", c->ffn_dim, c->dim, PT_TP_COLUMN);
        PT_ADD(PT_KIND_WUP, "mlp.up_proj.weight", c->ffn_dim, c->dim, PT_TP_COLUMN);
        PT_ADD(PT_KIND_WDOWN, "mlp.down_proj.weight", c->dim, c->ffn_dim, PT_TP_ROW);
#undef PT_ADD
    }
    pt_table_add(t, &cap, PT_KIND_FINAL_NORM, "model.norm.weight", -1, c->dim, 0,
                 PT_TP_REPLICATED, PT_PP_LAST);
    if (!c->tied_embeddings)
        pt_table_add(t, &cap, PT_KIND_HEAD, "lm_head.weight", -1, c->vocab_size, c->dim,
                     PT_TP_VOCAB, PT_PP_LAST);
    for (int i = 0; i < t->n; i++)
        if (t->p[i].unit < 0) t->p[i].unit = t->p[i].kind == PT_KIND_HEAD ? c->n_layers + 2 : c->n_layers + 1;
}

size_t pt_model_param_count(const pt_model_config *c) {
    pt_param_table t;
    pt_param_table_build(&t, c);
    size_t n = t.total;
    pt_param_table_free(&t);
    return n;
}

void pt_param_table_free(pt_param_table *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

const pt_param *pt_param_find(const pt_param_table *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0) return &t->p[i];
    return NULL;
}

/* Points one tensor's entry of a view at ptr. */
static void pt_view_set(pt_model_view *v, const pt_param *p, float *ptr, int tied) {
    pt_layer_view *lv = p->layer >= 0 ? &v->layers[p->layer] : NULL;
    switch (p->kind) {
    case PT_KIND_EMBED:
        v->embed = ptr;
        if (tied) v->head = ptr;
        break;
    case PT_KIND_FINAL_NORM: v->final_norm = ptr; break;
    case PT_KIND_HEAD: v->head = ptr; break;
    case PT_KIND_ATTN_NORM: lv->attn_norm = ptr; break;
    case PT_KIND_WQ: lv->wqkv = ptr; break;
    case PT_KIND_WK:
    case PT_KIND_WV: break; /* the fused projection: q, k, v are adjacent (the table builds them so) */
    case PT_KIND_WO: lv->wo = ptr; break;
    case PT_KIND_MLP_NORM: lv->mlp_norm = ptr; break;
    case PT_KIND_WGATE: lv->wgu = ptr; break;
    case PT_KIND_WUP: break; /* adjacent to gate */
    case PT_KIND_WDOWN: lv->wdown = ptr; break;
    default: PT_ASSERT(0);
    }
}

void pt_model_point(pt_model *m, int unit, int use, float *buf, size_t buf_lo) {
    pt_model_view *v = use == PT_USE_PARAMS ? &m->w : &m->g;
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
        if (p->unit != unit) continue;
        pt_view_set(v, p, buf ? buf + (p->offset - buf_lo) : NULL, m->cfg.tied_embeddings);
    }
}

pt_status pt_model_init(pt_model *m, const pt_model_config *cfg, pt_backend *be) {
    return pt_model_init_ex(m, cfg, be, 0, 0);
}

pt_status pt_model_init_ex(pt_model *m, const pt_model_config *cfg, pt_backend *be,
                           size_t alloc_total, int flags) {
    PT_TRY(pt_model_config_check(cfg));
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    pt_param_table_build(&m->table, cfg);
    m->alloc_total = alloc_total > m->table.total ? alloc_total : m->table.total;
    m->w.layers = pt_calloc((size_t)cfg->n_layers, sizeof *m->w.layers);
    m->g.layers = pt_calloc((size_t)cfg->n_layers, sizeof *m->g.layers);
    if (!(flags & PT_MODEL_NO_PARAMS)) m->params = be->alloc(be, m->alloc_total * sizeof(float));
    if (!(flags & PT_MODEL_NO_GRADS)) m->grads = be->alloc(be, m->alloc_total * sizeof(float));
    for (int u = 0; u < pt_model_n_units(m); u++) {
        if (m->params) pt_model_point(m, u, PT_USE_PARAMS, m->params, 0);
        if (m->grads) pt_model_point(m, u, PT_USE_GRADS, m->grads, 0);
    }

    /* rotary tables in double, rounded once: angle = pos · theta^(−2i/hd) */
    int hd = pt_head_dim(cfg), half = hd / 2;
    size_t n = (size_t)cfg->max_seq_len * half;
    float *c = pt_malloc(n * sizeof *c), *s = pt_malloc(n * sizeof *s);
    for (int p = 0; p < cfg->max_seq_len; p++)
        for (int i = 0; i < half; i++) {
            /* Hugging Face computes inv_freq in fp32, then pos·inv_freq in fp32 */
            float inv = (float)(1.0 / pow((double)cfg->rope_theta, (double)(2 * i) / hd));
            float a = (float)p * inv;
            c[(size_t)p * half + i] = (float)cos((double)a);
            s[(size_t)p * half + i] = (float)sin((double)a);
        }
    m->rope_cos = be->alloc(be, n * sizeof(float));
    m->rope_sin = be->alloc(be, n * sizeof(float));
    be->upload(be, m->rope_cos, c, n * sizeof(float));
    be->upload(be, m->rope_sin, s, n * sizeof(float));
    free(c);
    free(s);
    return PT_OK;
}

void pt_model_free(pt_model *m) {
    if (!m->be) return;
    if (m->params) m->be->free(m->be, m->params);
    if (m->grads) m->be->free(m->be, m->grads);
    m->be->free(m->be, m->rope_cos);
    m->be->free(m->be, m->rope_sin);
    free(m->w.layers);
    free(m->g.layers);
    pt_param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

void pt_model_init_weights(pt_model *m, uint64_t seed) {
    PT_ASSERT(m->params != NULL);
    float *host = pt_malloc(m->table.total * sizeof(float));
    pt_model_init_weights_host(m, seed, host);
    m->be->upload(m->be, m->params, host, m->table.total * sizeof(float));
    free(host);
}

void pt_model_init_weights_host(const pt_model *m, uint64_t seed, float *host) {
    /* RNG streams per tensor (seeded by seed and tensor index) so that a tensor's values do not
     * depend on which other tensors exist or which rank initialises it. */
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
        float *dst = host + p->offset;
        if (p->ndim == 1) {
            for (size_t j = 0; j < p->numel; j++) dst[j] = 1.0f;
            continue;
        }
        /* blocks of 2^20 values, each its own stream: parallel, and the same on any thread count */
        size_t nblk = (p->numel + ((size_t)1 << 20) - 1) >> 20;
#pragma omp parallel for schedule(dynamic)
        for (size_t blk = 0; blk < nblk; blk++) {
            pt_rng r;
            pt_rng_seed(&r, (seed * 1000003ull + (uint64_t)i) * 1000033ull + blk);
            size_t end = (blk + 1) << 20 < p->numel ? (blk + 1) << 20 : p->numel;
            for (size_t j = blk << 20; j < end; j++) dst[j] = m->cfg.init_std * pt_rng_normal(&r);
        }
    }
}

void pt_model_zero_grads(pt_model *m) {
    if (m->grads) m->be->zero(m->be, m->grads, m->alloc_total * sizeof(float));
}

static void pt_acquire(pt_model *m, int unit, int use, int backward) {
    if (m->hooks.acquire) m->hooks.acquire(m->hooks.user, unit, use, backward);
}

static void pt_release(pt_model *m, int unit, int use, int backward) {
    if (m->hooks.release) m->hooks.release(m->hooks.user, unit, use, backward);
}

static void pt_poll(pt_model *m) {
    if (m->hooks.poll) m->hooks.poll(m->hooks.user);
}

/* ------------------------------------------------------------------------------------------ */
/* activations */

pt_acts *pt_acts_create(const pt_model *m, int B, int T) {
    const pt_model_config *c = &m->cfg;
    PT_ASSERTF(T <= c->max_seq_len, "sequence length %d exceeds model.max_seq_len %d", T,
               c->max_seq_len);
    size_t N = (size_t)B * T, C = c->dim, F = c->ffn_dim, V = c->vocab_size;
    int hd = pt_head_dim(c);
    size_t q = (size_t)c->n_heads * hd, qkv = q + 2 * (size_t)c->n_kv_heads * hd;
    size_t H = c->n_heads;
    size_t per_layer = N * C + N + N * C + N * qkv + N * q + (size_t)B * H * T + N * C + N +
                       N * C + N * 2 * F + N * F;
    size_t HR = (size_t)pt_head_chunk_rows(c->vocab_size, (int)N);
    size_t rest = N * C + N + N * C + N * C + HR * V + HR +
                  N * C + N * C + N * qkv + N * q + N * 2 * F + N * F;
    /* each array is rounded up to 16 floats (64 bytes) */
    size_t n_arrays = 11 * (size_t)c->n_layers + 12;
    size_t total = per_layer * c->n_layers + rest + 16 * n_arrays;

    pt_acts *a = pt_calloc(1, sizeof *a);
    a->B = a->cap_B = B;
    a->T = a->cap_T = T;
    a->block = m->be->alloc(m->be, total * sizeof(float));
    a->bytes = total * sizeof(float);
    float *p = a->block;
#define PT_TAKE(n) (p += (((n) + 15) & ~(size_t)15), p - (((n) + 15) & ~(size_t)15))
    a->layers = pt_calloc((size_t)c->n_layers, sizeof *a->layers);
    for (int l = 0; l < c->n_layers; l++) {
        pt_layer_acts *la = &a->layers[l];
        la->x = PT_TAKE(N * C);
        la->rstd1 = PT_TAKE(N);
        la->xn1 = PT_TAKE(N * C);
        la->qkv = PT_TAKE(N * qkv);
        la->att = PT_TAKE(N * q);
        la->lse = PT_TAKE((size_t)B * H * T);
        la->xmid = PT_TAKE(N * C);
        la->rstd2 = PT_TAKE(N);
        la->xn2 = PT_TAKE(N * C);
        la->gu = PT_TAKE(N * 2 * F);
        la->h = PT_TAKE(N * F);
    }
    a->xout = PT_TAKE(N * C);
    a->rstdf = PT_TAKE(N);
    a->xf = PT_TAKE(N * C);
    a->dxf = PT_TAKE(N * C);
    a->head_rows = (int)HR;
    a->logits = PT_TAKE(HR * V);
    a->losses = PT_TAKE(HR);
    a->dx = PT_TAKE(N * C);
    a->dxn = PT_TAKE(N * C);
    a->dqkv = PT_TAKE(N * qkv);
    a->datt = PT_TAKE(N * q);
    a->dgu = PT_TAKE(N * 2 * F);
    a->dh = PT_TAKE(N * F);
#undef PT_TAKE
    PT_ASSERT((size_t)(p - a->block) <= total);
    a->pos = pt_calloc((size_t)T, sizeof *a->pos);
    a->d_pos = m->be->alloc(m->be, (size_t)T * sizeof(int32_t));
    a->d_rows = m->be->alloc(m->be, N * sizeof(int32_t));
    return a;
}

void pt_acts_free(const pt_model *m, pt_acts *a) {
    if (!a) return;
    m->be->free(m->be, a->block);
    free(a->layers);
    free(a->pos);
    m->be->free(m->be, a->d_pos);
    m->be->free(m->be, a->d_rows);
    free(a);
}

size_t pt_acts_bytes(const pt_acts *a) { return a->bytes; }

void pt_acts_set_shape(pt_acts *a, int B, int T) {
    PT_ASSERTF(B >= 1 && T >= 1 && (int64_t)B * T <= (int64_t)a->cap_B * a->cap_T && T <= a->cap_T,
               "activations sized for (%d,%d) cannot hold (%d,%d)", a->cap_B, a->cap_T, B, T);
    a->B = B;
    a->T = T;
}

/* ------------------------------------------------------------------------------------------ */
/* forward and backward */

static pt_attn_shape pt_attn_shape_for(const pt_model *m, const pt_acts *a) {
    const pt_model_config *c = &m->cfg;
    int hd = pt_head_dim(c), q = c->n_heads * hd, qkv = q + 2 * c->n_kv_heads * hd;
    return (pt_attn_shape){.B = a->B,
                           .Tq = a->T,
                           .Tk = a->T,
                           .n_heads = c->n_heads,
                           .n_kv_heads = c->n_kv_heads,
                           .head_dim = hd,
                           .ldq = qkv,
                           .ldk = qkv,
                           .ldv = qkv,
                           .ldo = q,
                           .q_pos = a->d_pos,
                           .k_pos = a->d_pos,
                           .scale = 1.0f / sqrtf((float)hd)};
}

/* Runs the layers and the final norm; leaves xf in a->xf. */
static void pt_forward_trunk(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *pos) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim, F = c->ffn_dim, hd = pt_head_dim(c);
    int q = c->n_heads * hd, kv = c->n_kv_heads * hd, qkv = q + 2 * kv;
    /* positions (T) are shared by the B sequences; rope wants one per row */
    be->download(be, a->pos, pos, (size_t)a->T * sizeof *pos);
    be->copy(be, a->d_pos, pos, (size_t)a->T * sizeof *pos);
    int32_t *rows = pt_malloc((size_t)N * sizeof *rows);
    for (int i = 0; i < N; i++) rows[i] = a->pos[i % a->T];
    be->upload(be, a->d_rows, rows, (size_t)N * sizeof *rows);
    free(rows);
    pt_attn_shape as = pt_attn_shape_for(m, a);

    /* tokens (N) -> x (N,C) */
    pt_acquire(m, 0, PT_USE_PARAMS, 0);
    be->embedding_forward(be, c->n_layers ? a->layers[0].x : a->xout, tokens, m->w.embed, N, C, 0,
                          c->vocab_size);
    if (!c->tied_embeddings) pt_release(m, 0, PT_USE_PARAMS, 0); /* tied: the head needs it */
    for (int l = 0; l < c->n_layers; l++) {
        pt_acquire(m, l + 1, PT_USE_PARAMS, 0);
        pt_layer_acts *la = &a->layers[l];
        const pt_layer_view *w = &m->w.layers[l];
        float *xnext = l + 1 < c->n_layers ? a->layers[l + 1].x : a->xout;
        be->rmsnorm_forward(be, la->xn1, la->rstd1, la->x, w->attn_norm, N, C, c->norm_eps);
        /* xn1 (N,C) · Wqkvᵀ (C, q+2kv) -> qkv (N, q+2kv) */
        be->gemm(be, PT_NO_TRANS, PT_TRANS, N, qkv, C, 1.0f, la->xn1, C, w->wqkv, C, 0.0f, la->qkv,
                 qkv);
        pt_poll(m);
        /* rope on q (n_heads heads) and k (n_kv_heads heads, starting at column q) */
        be->rope(be, la->qkv, a->d_rows, N, c->n_heads, hd, qkv, m->rope_cos, m->rope_sin, 0);
        be->rope(be, la->qkv + q, a->d_rows, N, c->n_kv_heads, hd, qkv, m->rope_cos, m->rope_sin, 0);
        be->attention_forward(be, &as, la->qkv, la->qkv + q, la->qkv + q + kv, la->att, la->lse);
        pt_poll(m);
        /* xmid = x + att (N,q) · Woᵀ (q,C) */
        be->copy(be, la->xmid, la->x, (size_t)N * C * sizeof(float));
        be->gemm(be, PT_NO_TRANS, PT_TRANS, N, C, q, 1.0f, la->att, q, w->wo, q, 1.0f, la->xmid, C);
        be->rmsnorm_forward(be, la->xn2, la->rstd2, la->xmid, w->mlp_norm, N, C, c->norm_eps);
        /* xn2 (N,C) · Wguᵀ (C,2F) -> gu (N,2F) -> h (N,F) */
        be->gemm(be, PT_NO_TRANS, PT_TRANS, N, 2 * F, C, 1.0f, la->xn2, C, w->wgu, C, 0.0f, la->gu,
                 2 * F);
        be->swiglu_forward(be, la->h, la->gu, N, F);
        pt_poll(m);
        /* xnext = xmid + h (N,F) · Wdownᵀ (F,C) */
        be->copy(be, xnext, la->xmid, (size_t)N * C * sizeof(float));
        be->gemm(be, PT_NO_TRANS, PT_TRANS, N, C, F, 1.0f, la->h, F, w->wdown, F, 1.0f, xnext, C);
        pt_release(m, l + 1, PT_USE_PARAMS, 0);
    }
    pt_acquire(m, c->n_layers + 1, PT_USE_PARAMS, 0);
    be->rmsnorm_forward(be, a->xf, a->rstdf, a->xout, m->w.final_norm, N, C, c->norm_eps);
}

double pt_model_forward(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *targets,
                        const int32_t *pos, float loss_scale, int64_t *n_valid) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim, V = c->vocab_size;
    pt_forward_trunk(m, a, tokens, pos);
    a->has_targets = targets != NULL;
    if (!targets) return 0.0;

    /* Fused head + loss + head backward, a chunk of rows at a time:
     * logits (n,V) = xf (n,C) · Headᵀ; logits -> dlogits in place;
     * dxf (n,C) = dlogits · Head; dHead (V,C) += dlogitsᵀ · xf. */
    double loss = 0.0;
    int64_t valid = 0;
    int HR = a->head_rows, head = pt_model_head_unit(m);
    pt_acquire(m, head, PT_USE_PARAMS | PT_USE_GRADS, 0);
    int32_t *tg = pt_malloc((size_t)HR * sizeof *tg);
    float *host_losses = pt_malloc((size_t)HR * sizeof *host_losses);
    for (int r0 = 0; r0 < N; r0 += HR) {
        int n = N - r0 < HR ? N - r0 : HR;
        const float *xf = a->xf + (size_t)r0 * C;
        be->gemm(be, PT_NO_TRANS, PT_TRANS, n, V, C, 1.0f, xf, C, m->w.head, C, 0.0f, a->logits, V);
        be->softmax_xent(be, a->logits, a->losses, targets + r0, n, V, V, loss_scale);
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, n, C, V, 1.0f, a->logits, V, m->w.head, C, 0.0f,
                 a->dxf + (size_t)r0 * C, C);
        be->gemm(be, PT_TRANS, PT_NO_TRANS, V, C, n, 1.0f, a->logits, V, xf, C, 1.0f, m->g.head, C);
        be->download(be, host_losses, a->losses, (size_t)n * sizeof(float));
        be->download(be, tg, targets + r0, (size_t)n * sizeof *tg);
        for (int i = 0; i < n; i++) {
            loss += host_losses[i];
            valid += tg[i] >= 0;
        }
    }
    free(tg);
    free(host_losses);
    /* the head's gradient is final here, unless it is the embedding's (tied) */
    pt_release(m, head, c->tied_embeddings ? PT_USE_PARAMS : PT_USE_PARAMS | PT_USE_GRADS, 0);
    /* the final norm's parameters stay for its backward */
    if (n_valid) *n_valid = valid;
    return loss;
}

void pt_model_backward(pt_model *m, pt_acts *a, const int32_t *tokens) {
    PT_ASSERTF(a->has_targets, "pt_model_backward needs a forward with targets");
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim, F = c->ffn_dim, hd = pt_head_dim(c);
    int q = c->n_heads * hd, kv = c->n_kv_heads * hd, qkv = q + 2 * kv;
    size_t NC = (size_t)N * C * sizeof(float);
    pt_attn_shape as = pt_attn_shape_for(m, a);

    /* final norm: dx = rmsnorm_backward(dxf) */
    be->zero(be, a->dx, NC);
    pt_acquire(m, c->n_layers + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
    be->rmsnorm_backward(be, a->dx, m->g.final_norm, a->dxf, a->xout, m->w.final_norm, a->rstdf, N,
                         C);
    pt_release(m, c->n_layers + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        pt_acquire(m, l + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
        pt_layer_acts *la = &a->layers[l];
        const pt_layer_view *w = &m->w.layers[l];
        const pt_layer_view *g = &m->g.layers[l];
        /* MLP: dh (N,F) = dx · Wdown; dWdown (C,F) += dxᵀ · h */
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, N, F, C, 1.0f, a->dx, C, w->wdown, F, 0.0f, a->dh, F);
        be->gemm(be, PT_TRANS, PT_NO_TRANS, C, F, N, 1.0f, a->dx, C, la->h, F, 1.0f, g->wdown, F);
        pt_poll(m);
        be->swiglu_backward(be, a->dgu, a->dh, la->gu, N, F);
        /* dxn2 (N,C) = dgu · Wgu; dWgu (2F,C) += dguᵀ · xn2 */
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, N, C, 2 * F, 1.0f, a->dgu, 2 * F, w->wgu, C, 0.0f,
                 a->dxn, C);
        be->gemm(be, PT_TRANS, PT_NO_TRANS, 2 * F, C, N, 1.0f, a->dgu, 2 * F, la->xn2, C, 1.0f,
                 g->wgu, C);
        pt_poll(m);
        be->rmsnorm_backward(be, a->dx, g->mlp_norm, a->dxn, la->xmid, w->mlp_norm, la->rstd2, N, C);
        /* attention output: datt (N,q) = dx · Wo; dWo (C,q) += dxᵀ · att */
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, N, q, C, 1.0f, a->dx, C, w->wo, q, 0.0f, a->datt, q);
        be->gemm(be, PT_TRANS, PT_NO_TRANS, C, q, N, 1.0f, a->dx, C, la->att, q, 1.0f, g->wo, q);
        pt_poll(m);
        be->zero(be, a->dqkv, (size_t)N * qkv * sizeof(float));
        be->attention_backward(be, &as, la->qkv, la->qkv + q, la->qkv + q + kv, la->att, a->datt,
                               la->lse, a->dqkv, a->dqkv + q, a->dqkv + q + kv);
        pt_poll(m);
        be->rope(be, a->dqkv, a->d_rows, N, c->n_heads, hd, qkv, m->rope_cos, m->rope_sin, 1);
        be->rope(be, a->dqkv + q, a->d_rows, N, c->n_kv_heads, hd, qkv, m->rope_cos, m->rope_sin, 1);
        /* dxn1 (N,C) = dqkv · Wqkv; dWqkv (q+2kv, C) += dqkvᵀ · xn1 */
        be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, N, C, qkv, 1.0f, a->dqkv, qkv, w->wqkv, C, 0.0f,
                 a->dxn, C);
        be->gemm(be, PT_TRANS, PT_NO_TRANS, qkv, C, N, 1.0f, a->dqkv, qkv, la->xn1, C, 1.0f, g->wqkv,
                 C);
        be->rmsnorm_backward(be, a->dx, g->attn_norm, a->dxn, la->x, w->attn_norm, la->rstd1, N, C);
        pt_release(m, l + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
    }
    pt_acquire(m, 0, PT_USE_GRADS, 1);
    be->embedding_backward(be, m->g.embed, tokens, a->dx, N, C, 0, c->vocab_size);
    pt_release(m, 0, PT_USE_GRADS, 1);
}

void pt_model_logits(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *pos,
                     float *host_logits) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim, V = c->vocab_size;
    pt_forward_trunk(m, a, tokens, pos);
    a->has_targets = 0;
    pt_release(m, c->n_layers + 1, PT_USE_PARAMS, 0);
    pt_acquire(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
    for (int r0 = 0; r0 < N; r0 += a->head_rows) {
        int n = N - r0 < a->head_rows ? N - r0 : a->head_rows;
        be->gemm(be, PT_NO_TRANS, PT_TRANS, n, V, C, 1.0f, a->xf + (size_t)r0 * C, C, m->w.head, C,
                 0.0f, a->logits, V);
        be->download(be, host_logits + (size_t)r0 * V, a->logits, (size_t)n * V * sizeof(float));
    }
    pt_release(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
}

double pt_model_flops_per_token(const pt_model_config *c, int T) {
    /* 6 FLOPs per parameter per token for the matrices (2 forward, 4 backward), plus attention as
     * the kernel executes it: causal, so half of the T×T scores; QKᵀ and PV are 2·T·hd each
     * forward per head, the backward 2x the forward. Embedding lookups are not FLOPs. */
    int hd = c->dim / c->n_heads;
    double q = (double)c->n_heads * hd, kv = (double)c->n_kv_heads * hd;
    double per_layer = (double)c->dim * (q + 2 * kv) + q * c->dim + 3.0 * c->dim * c->ffn_dim;
    double matrices = per_layer * c->n_layers + (double)c->vocab_size * c->dim;
    double attn = c->n_layers * c->n_heads * (2.0 * 2.0 * hd * (T / 2.0));
    return 6.0 * matrices + 3.0 * attn;
}
