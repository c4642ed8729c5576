/* llama.c: the Llama decoder's forward and backward (fp32 or bf16), written as explicit op
 * pairs; its four linears are linear.c's calls, its activations laid out here (acts.h).
 *
 * One micro-batch of B sequences of T tokens is N = B·T rows. Per layer:
 *   x (N,C) -> xn1 = rmsnorm(x) -> qkv = xn1·Wqkvᵀ (N, q+2kv) -> rope(q,k) -> att = attention
 *   -> x += att·Woᵀ -> xn2 = rmsnorm(x) -> gu = xn2·Wguᵀ (N,2F) -> h = silu(g)·u -> x += h·Wdownᵀ
 * then xf = rmsnorm(x) and the head. The head and the loss are fused: the logits are computed in
 * chunks of rows, turned into their gradient in place (softmax − onehot) and immediately pushed
 * through the head's backward, so that the (N, V) logits are never held whole.
 *
 * Saved for backward per layer: the layer input x, rstd of both norms, xn1, qkv (after rope),
 * att, lse, the residual after attention, xn2, gu and h (sequence parallelism: x, xn1, the
 * residual and xn2 only this rank's rows); what a recompute mode drops lives in one workspace, and
 * what no micro-batch keeps from its forward to its backward in one scratch, both once per rank
 * (docs/memory.md). The attention never stores T×T scores.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pt/model.h"

#include "model/linear.h"
#include "model/moe.h"
#include "pt/trace.h"

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

static int pt_head_dim(const pt_model_config *c) { return pt_model_head_dim(c); }

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
    if (c->n_layers > PT_MODEL_MAX_LAYERS)
        return pt_errorf(PT_ERR_CONFIG, "model.n_layers = %d: at most %d (the deepest trained "
                         "models have a few hundred)", c->n_layers, PT_MODEL_MAX_LAYERS);
    if (c->head_dim < 0) return pt_errorf(PT_ERR_CONFIG, "model.head_dim must be >= 0 (0: dim / n_heads)");
    if (c->head_dim == 0 && c->dim % c->n_heads != 0)
        return pt_errorf(PT_ERR_CONFIG, "model.dim (%d) must be divisible by model.n_heads (%d) "
                         "(or set model.head_dim)", c->dim, c->n_heads);
    if (pt_head_dim(c) % 2 != 0)
        return pt_errorf(PT_ERR_CONFIG, "the head dimension (model.head_dim, or model.dim / "
                         "model.n_heads) = %d must be even (rotary)", pt_head_dim(c));
    if (pt_head_dim(c) > PT_ATTN_MAX_HEAD_DIM)
        return pt_errorf(PT_ERR_CONFIG, "the head dimension (model.head_dim, or model.dim / "
                         "model.n_heads) = %d is more than the attention kernels take (%d)",
                         pt_head_dim(c), PT_ATTN_MAX_HEAD_DIM);
    if (c->rope_factor < 0) return pt_errorf(PT_ERR_CONFIG, "model.rope_factor must be >= 0 (0: no scaling)");
    if (c->rope_factor > 0 && !(c->rope_high_freq_factor > c->rope_low_freq_factor &&
                                c->rope_low_freq_factor > 0 && c->rope_original_max_seq_len > 0))
        return pt_errorf(PT_ERR_CONFIG, "model.rope_factor = %g (Llama 3 rope scaling) needs "
                         "rope_high_freq_factor (%g) > rope_low_freq_factor (%g) > 0 and "
                         "rope_original_max_seq_len (%d) > 0", c->rope_factor,
                         c->rope_high_freq_factor, c->rope_low_freq_factor,
                         c->rope_original_max_seq_len);
    if (c->n_heads % c->n_kv_heads != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "model.n_heads (%d) must be divisible by model.n_kv_heads (%d)", c->n_heads,
                         c->n_kv_heads);
    if (!(c->rope_theta > 0)) return pt_errorf(PT_ERR_CONFIG, "model.rope_theta must be > 0");
    if (c->n_experts < 0) return pt_errorf(PT_ERR_CONFIG, "model.n_experts must be >= 0");
    if (c->n_experts > 0) {
        if (c->top_k < 1 || c->top_k > c->n_experts)
            return pt_errorf(PT_ERR_CONFIG, "model.top_k = %d must be in [1, model.n_experts = %d]",
                             c->top_k, c->n_experts);
        if (c->moe_ffn_dim < 1) return pt_errorf(PT_ERR_CONFIG, "model.moe_ffn_dim must be > 0");
        if (c->moe_every < 1) return pt_errorf(PT_ERR_CONFIG, "model.moe_every must be >= 1");
        if (c->bias_rate > 0 && !c->router_sigmoid)
            return pt_errorf(PT_ERR_CONFIG, "model.bias_rate needs model.router_sigmoid = true (the "
                             "bias is the sigmoid router's)");
        if (!(c->bias_rate >= 0)) return pt_errorf(PT_ERR_CONFIG, "model.bias_rate must be >= 0");
        if (c->moe_first_dense < 0 || c->n_shared_experts < 0)
            return pt_errorf(PT_ERR_CONFIG, "model.moe_first_dense and n_shared_experts must be >= 0");
        if (!(c->capacity_factor >= 0))
            return pt_errorf(PT_ERR_CONFIG, "model.capacity_factor must be >= 0 (0 = dropless)");
        if (!(c->aux_loss_coef >= 0) || !(c->z_loss_coef >= 0))
            return pt_errorf(PT_ERR_CONFIG, "model.aux_loss_coef and z_loss_coef must be >= 0");
    }
    if (!(c->norm_eps > 0)) return pt_errorf(PT_ERR_CONFIG, "model.norm_eps must be > 0");
    return PT_OK;
}

pt_status pt_model_config_settle(pt_model_config *c, int seq_len) {
    if (c->n_experts > 0 && c->moe_ffn_dim == 0) c->moe_ffn_dim = c->ffn_dim;
    PT_TRY(pt_model_config_check(c));
    if (seq_len > c->max_seq_len)
        return pt_errorf(PT_ERR_CONFIG, "training.seq_len (%d) exceeds model.max_seq_len (%d)",
                         seq_len, c->max_seq_len);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* parameter table */

pt_status pt_model_check_tp(const pt_model_config *c, int tp) {
    if (tp <= 1) return PT_OK;
    if (c->n_heads % tp != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.tp = %d must divide model.n_heads = %d", tp,
                         c->n_heads);
    if (c->n_kv_heads % tp != 0 && tp % c->n_kv_heads != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "parallel.tp = %d and model.n_kv_heads = %d: one must divide the other "
                         "(key/value heads are split, or each replicated on tp/n_kv_heads ranks)",
                         tp, c->n_kv_heads);
    if (c->ffn_dim % tp != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.tp = %d must divide model.ffn_dim = %d", tp,
                         c->ffn_dim);
    if (c->n_experts > 0 && c->moe_ffn_dim % tp != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.tp = %d must divide model.moe_ffn_dim = %d (each "
                         "expert is split over the tp ranks)", tp, c->moe_ffn_dim);
    return PT_OK;
}

pt_local_dims pt_model_local_dims(const pt_model_config *c, int tp, int r) {
    pt_local_dims d;
    d.H = c->n_heads / tp;
    d.F = c->ffn_dim / tp;
    d.Fe = c->moe_ffn_dim / tp;
    if (c->n_kv_heads % tp == 0) {
        d.KV = c->n_kv_heads / tp;
        d.kv_head0 = r * d.KV;
        d.kv_shared = 1;
    } else {
        d.KV = 1;
        d.kv_shared = tp / c->n_kv_heads;
        d.kv_head0 = r / d.kv_shared;
    }
    d.V = (c->vocab_size + tp - 1) / tp;
    d.v0 = r * d.V;
    d.v_valid = c->vocab_size - d.v0 < d.V ? c->vocab_size - d.v0 : d.V;
    if (d.v_valid < 0) d.v_valid = 0;
    return d;
}

/* One tensor: its local shape (d0, d1) and where it sits in the global (g0, g1) tensor. */
typedef struct {
    pt_param_kind kind;
    const char *suffix;
    int64_t d0, d1, g0, g1, row0, col0, rows;
    int owner;
    pt_tp_split tp;
} pt_tensor_spec;

static void pt_table_add(pt_param_table *t, int *cap, const pt_tensor_spec *sp, const char *name,
                         int layer, pt_pp_place pp) {
    if (t->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        t->p = pt_realloc(t->p, (size_t)*cap * sizeof *t->p);
    }
    pt_param *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->kind = sp->kind;
    p->layer = layer;
    p->ndim = sp->d1 > 0 ? 2 : 1;
    p->shape[0] = sp->d0;
    p->shape[1] = sp->d1 > 0 ? sp->d1 : 0;
    p->numel = (size_t)sp->d0 * (size_t)(sp->d1 > 0 ? sp->d1 : 1);
    p->decay = p->ndim == 2;
    p->tp = sp->tp;
    p->pp = pp;
    p->expert = -1;
    p->unit = layer >= 0 ? layer + 1 : (sp->kind == PT_KIND_EMBED ? 0 : -1); /* others: set below */
    p->offset = t->total;
    p->gshape[0] = sp->g0;
    p->gshape[1] = sp->g1 > 0 ? sp->g1 : 0;
    p->grow0 = sp->row0;
    p->gcol0 = sp->col0;
    p->grows = sp->rows;
    p->owner = sp->owner;
    t->total += p->numel;
}

static void pt_param_table_build_tp_all(pt_param_table *t, const pt_model_config *c, int tp, int r);

static int pt_in_chunks(const pt_chunk *ch, int n, int layer, int L) {
    if (n == 0) return 1;
    for (int i = 0; i < n; i++) {
        if (layer == -1 && ch[i].l0 == 0) return 1;                 /* the embedding */
        if (layer == L && ch[i].l1 == L) return 1;                  /* final norm and head */
        if (layer >= ch[i].l0 && layer < ch[i].l1) return 1;
    }
    return 0;
}

void pt_param_table_build_local(pt_param_table *t, const pt_model_config *c,
                                const pt_model_parallel *par) {
    int tp = par && par->tp > 1 ? par->tp : 1, r = par ? par->tp_rank : 0;
    int n_chunks = par && par->n_chunks ? par->n_chunks : 0;
    int ep = par && par->ep > 1 ? par->ep : 1, er = par ? par->ep_rank : 0;
    int el = c->n_experts / ep; /* experts per rank */
    pt_param_table all;
    pt_param_table_build_tp_all(&all, c, tp, r);
    /* keep the tensors of the chunks (and this rank's experts), renumbering the local offsets;
     * with expert parallelism the experts go last, so that they form one region of their own */
    memset(t, 0, sizeof *t);
    t->p = pt_calloc((size_t)all.n, sizeof *t->p);
    int L = c->n_layers;
    for (int pass = 0; pass < (ep > 1 ? 2 : 1); pass++) {
        for (int i = 0; i < all.n; i++) {
            const pt_param *p = &all.p[i];
            int where = p->layer >= 0 ? p->layer : p->kind == PT_KIND_EMBED ? -1 : L;
            /* tied embeddings under a pipeline: the last stage keeps a copy of the embedding
             * for its head (a replica: the first stage's is the one saved and counted), whose
             * gradient the two stages sum (pt_trainer: the tied group) */
            int copy = c->tied_embeddings && p->kind == PT_KIND_EMBED && n_chunks &&
                       !pt_in_chunks(par->chunk, n_chunks, -1, L) &&
                       pt_in_chunks(par->chunk, n_chunks, L, L);
            /* the head split over the pipeline ranks: every stage's block of its rows */
            int split = par && par->head_split && p->kind == PT_KIND_HEAD;
            if (!copy && !split && !pt_in_chunks(n_chunks ? par->chunk : NULL, n_chunks, where, L))
                continue;
            if (ep > 1 && (p->expert >= 0) != pass) continue;
            if (ep > 1 && p->expert >= 0 && p->expert / el != er) continue;
            t->p[t->n] = *p;
            t->p[t->n].offset = t->total;
            if (ep > 1 && p->expert < 0 && !par->ep_zero_group)
                t->p[t->n].owner &= er == 0; /* replicated over ep */
            if (copy) t->p[t->n].owner = 0;
            if (split) {
                pt_param *h = &t->p[t->n];
                h->shape[0] = par->head_V;
                h->numel = (size_t)par->head_V * (size_t)h->shape[1];
                h->grow0 = par->head_v0;
                h->grows = par->head_valid;
            }
            t->total += t->p[t->n].numel;
            t->n++;
        }
        if (pass == 0 && ep > 1 && par->ep_zero_group > 1) { /* the dense region, padded */
            size_t g = (size_t)par->ep_zero_group;
            t->total = (t->total + g - 1) / g * g;
        }
    }
    pt_param_table_free(&all);
}

static void pt_param_table_build_tp_all(pt_param_table *t, const pt_model_config *c, int tp, int r) {
    memset(t, 0, sizeof *t);
    int cap = 0;
    int hd = pt_head_dim(c), C = c->dim;
    pt_local_dims d = pt_model_local_dims(c, tp, r);
    int first = r == 0, kv_owner = r % d.kv_shared == 0;
    /* local (d0, d1), global (g0, g1), block origin (row0, col0), real rows, owner, split */
    const pt_tensor_spec embed = {PT_KIND_EMBED, NULL, d.V, C, c->vocab_size, C, d.v0, 0,
                                  d.v_valid, 1, PT_TP_VOCAB};
    /* the attention, then (dense layers) the MLP; the biases only when the model has them */
    const pt_tensor_spec layer[] = {
        {PT_KIND_ATTN_NORM, "input_layernorm.weight", C, 0, C, 0, 0, 0, C, first, PT_TP_REPLICATED},
        {PT_KIND_WQ, "self_attn.q_proj.weight", d.H * hd, C, c->n_heads * hd, C, r * d.H * hd, 0,
         d.H * hd, 1, PT_TP_COLUMN},
        {PT_KIND_WK, "self_attn.k_proj.weight", d.KV * hd, C, c->n_kv_heads * hd, C,
         d.kv_head0 * hd, 0, d.KV * hd, kv_owner, PT_TP_COLUMN},
        {PT_KIND_WV, "self_attn.v_proj.weight", d.KV * hd, C, c->n_kv_heads * hd, C,
         d.kv_head0 * hd, 0, d.KV * hd, kv_owner, PT_TP_COLUMN},
        {PT_KIND_BQ, "self_attn.q_proj.bias", d.H * hd, 0, c->n_heads * hd, 0, r * d.H * hd, 0,
         d.H * hd, 1, PT_TP_COLUMN},
        {PT_KIND_BK, "self_attn.k_proj.bias", d.KV * hd, 0, c->n_kv_heads * hd, 0, d.kv_head0 * hd,
         0, d.KV * hd, kv_owner, PT_TP_COLUMN},
        {PT_KIND_BV, "self_attn.v_proj.bias", d.KV * hd, 0, c->n_kv_heads * hd, 0, d.kv_head0 * hd,
         0, d.KV * hd, kv_owner, PT_TP_COLUMN},
        {PT_KIND_WO, "self_attn.o_proj.weight", C, d.H * hd, C, c->n_heads * hd, 0, r * d.H * hd,
         C, 1, PT_TP_ROW},
        {PT_KIND_BO, "self_attn.o_proj.bias", C, 0, C, 0, 0, 0, C, first, PT_TP_REPLICATED},
        {PT_KIND_MLP_NORM, "post_attention_layernorm.weight", C, 0, C, 0, 0, 0, C, first,
         PT_TP_REPLICATED},
        {PT_KIND_WGATE, "mlp.gate_proj.weight", d.F, C, c->ffn_dim, C, r * d.F, 0, d.F, 1,
         PT_TP_COLUMN},
        {PT_KIND_WUP, "mlp.up_proj.weight", d.F, C, c->ffn_dim, C, r * d.F, 0, d.F, 1,
         PT_TP_COLUMN},
        {PT_KIND_WDOWN, "mlp.down_proj.weight", C, d.F, C, c->ffn_dim, 0, r * d.F, C, 1,
         PT_TP_ROW},
    };
    const pt_tensor_spec norm = {PT_KIND_FINAL_NORM, NULL, C, 0, C, 0, 0, 0, C, first,
                                 PT_TP_REPLICATED};
    pt_tensor_spec head = embed;
    head.kind = PT_KIND_HEAD;
    char name[96];
    pt_table_add(t, &cap, &embed, "model.embed_tokens.weight", -1, PT_PP_FIRST);
    /* each expert and the shared experts split over the tp ranks as the dense MLP is: gate and
     * up by rows, down by columns */
    int Fe = c->moe_ffn_dim, Fs = c->n_shared_experts * c->moe_ffn_dim, fe = d.Fe, fs = Fs / tp;
    const pt_tensor_spec bias = {PT_KIND_ROUTER_BIAS, "block_sparse_moe.gate.e_score_correction_bias",
                                 c->n_experts, 0, c->n_experts, 0, 0, 0, c->n_experts, first,
                                 PT_TP_REPLICATED};
    const pt_tensor_spec moe[] = {
        {PT_KIND_ROUTER, "block_sparse_moe.gate.weight", c->n_experts, C, c->n_experts, C, 0, 0,
         c->n_experts, first, PT_TP_REPLICATED},
        {PT_KIND_WGATE, "block_sparse_moe.shared_experts.gate_proj.weight", fs, C, Fs, C, r * fs,
         0, fs, 1, PT_TP_COLUMN},
        {PT_KIND_WUP, "block_sparse_moe.shared_experts.up_proj.weight", fs, C, Fs, C, r * fs, 0, fs,
         1, PT_TP_COLUMN},
        {PT_KIND_WDOWN, "block_sparse_moe.shared_experts.down_proj.weight", C, fs, C, Fs, 0, r * fs,
         C, 1, PT_TP_ROW},
    };
    const pt_tensor_spec expert[] = {
        {PT_KIND_EXPERT_W1, "w1", fe, C, Fe, C, r * fe, 0, fe, 1, PT_TP_COLUMN},
        {PT_KIND_EXPERT_W3, "w3", fe, C, Fe, C, r * fe, 0, fe, 1, PT_TP_COLUMN},
        {PT_KIND_EXPERT_W2, "w2", C, fe, C, Fe, 0, r * fe, C, 1, PT_TP_ROW},
    };
    for (int l = 0; l < c->n_layers; l++) {
        int is_moe = pt_layer_is_moe(c, l);
        /* a MoE layer: attention and its norm as usual (all but the last 3), then router, shared
         * experts (when there are any) and the experts */
        size_t n_dense = sizeof layer / sizeof *layer - (is_moe ? 3 : 0);
        for (size_t k = 0; k < n_dense; k++) {
            pt_param_kind kind = layer[k].kind;
            if (((kind == PT_KIND_BQ || kind == PT_KIND_BK || kind == PT_KIND_BV) &&
                 !pt_model_qkv_bias(c)) ||
                (kind == PT_KIND_BO && !pt_model_o_bias(c)))
                continue;
            snprintf(name, sizeof name, "model.layers.%d.%s", l, layer[k].suffix);
            pt_table_add(t, &cap, &layer[k], name, l, PT_PP_LAYER);
        }
        if (!is_moe) continue;
        for (size_t k = 0; k < 4; k++) {
            if (k > 0 && Fs == 0) break;
            snprintf(name, sizeof name, "model.layers.%d.%s", l, moe[k].suffix);
            pt_table_add(t, &cap, &moe[k], name, l, PT_PP_LAYER);
            if (k == 0 && c->router_sigmoid) {
                snprintf(name, sizeof name, "model.layers.%d.%s", l, bias.suffix);
                pt_table_add(t, &cap, &bias, name, l, PT_PP_LAYER);
            }
        }
        for (int e = 0; e < c->n_experts; e++)
            for (size_t k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l,
                         e, expert[k].suffix);
                pt_table_add(t, &cap, &expert[k], name, l, PT_PP_LAYER);
                t->p[t->n - 1].expert = e;
            }
    }
    pt_table_add(t, &cap, &norm, "model.norm.weight", -1, PT_PP_LAST);
    if (!c->tied_embeddings) pt_table_add(t, &cap, &head, "lm_head.weight", -1, PT_PP_LAST);
    for (int i = 0; i < t->n; i++)
        if (t->p[i].unit < 0) t->p[i].unit = t->p[i].kind == PT_KIND_HEAD ? c->n_layers + 2 : c->n_layers + 1;
    /* the global tensors' offsets: the single-process table is the same list at tp = 1 */
    size_t goff = 0;
    for (int i = 0; i < t->n; i++) {
        t->p[i].goffset = goff;
        t->p[i].gindex = i;
        goff += (size_t)t->p[i].gshape[0] * (size_t)(t->p[i].gshape[1] ? t->p[i].gshape[1] : 1);
    }
}

void pt_param_table_build(pt_param_table *t, const pt_model_config *c) {
    pt_param_table_build_local(t, c, NULL);
}

/* Row i of a local block <-> its place in the global array: cols elements each. */
static void pt_block_rows(const pt_param *p, size_t *cols, size_t *gcols) {
    *cols = p->ndim == 2 ? (size_t)p->shape[1] : 1;
    *gcols = p->ndim == 2 ? (size_t)p->gshape[1] : 1;
}

void pt_param_table_to_local(const pt_param_table *t, const float *global, float *local) {
    for (int i = 0; i < t->n; i++) {
        const pt_param *p = &t->p[i];
        size_t cols, gcols;
        pt_block_rows(p, &cols, &gcols);
        if (p->ndim == 1 && p->tp == PT_TP_REPLICATED) { /* replicated vectors */
            memcpy(local + p->offset, global + p->goffset, p->numel * sizeof(float));
            continue;
        }
        memset(local + p->offset, 0, p->numel * sizeof(float));
        for (int64_t r = 0; r < p->grows; r++)
            memcpy(local + p->offset + (size_t)r * cols,
                   global + p->goffset + (size_t)(p->grow0 + r) * gcols + (size_t)p->gcol0,
                   cols * sizeof(float));
    }
}

void pt_param_table_to_global(const pt_param_table *t, const float *local, float *global) {
    for (int i = 0; i < t->n; i++) {
        const pt_param *p = &t->p[i];
        if (!p->owner) continue;
        size_t cols, gcols;
        pt_block_rows(p, &cols, &gcols);
        if (p->ndim == 1 && p->tp == PT_TP_REPLICATED) {
            memcpy(global + p->goffset, local + p->offset, p->numel * sizeof(float));
            continue;
        }
        for (int64_t r = 0; r < p->grows; r++)
            memcpy(global + p->goffset + (size_t)(p->grow0 + r) * gcols + (size_t)p->gcol0,
                   local + p->offset + (size_t)r * cols, cols * sizeof(float));
    }
}

/* One local rectangle [ra, rb) × [ca, cb) of p as a global block, rows clipped to the real ones. */
static int pt_add_block(const pt_param *p, int64_t ra, int64_t rb, int64_t ca,
                        int64_t cb, pt_block *out) {
    int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
    if (rb > p->grows) rb = p->grows;
    if (rb <= ra || cb <= ca) return 0;
    *out = (pt_block){p->gindex, p->grow0 + ra, p->grow0 + rb, p->gcol0 + ca, p->gcol0 + cb,
                      p->offset + (size_t)(ra * cols + ca)};
    return 1;
}

int pt_param_table_blocks(const pt_param_table *t, size_t lo, size_t hi, int owned_only,
                          pt_block *out) {
    int n = 0;
    for (int i = 0; i < t->n; i++) {
        const pt_param *p = &t->p[i];
        if (owned_only && !p->owner) continue;
        size_t a = lo > p->offset ? lo - p->offset : 0;
        size_t b = hi < p->offset + p->numel ? hi - p->offset : p->numel;
        if (hi <= p->offset || lo >= p->offset + p->numel || b <= a) continue;
        int64_t cols = p->ndim == 2 ? p->shape[1] : 1;
        int64_t ra = (int64_t)a / cols, ca = (int64_t)a % cols;
        int64_t rb = (int64_t)b / cols, cb = (int64_t)b % cols;
        if (ra == rb) {
            n += pt_add_block(p, ra, ra + 1, ca, cb, out + n);
            continue;
        }
        if (ca > 0) n += pt_add_block(p, ra, ra + 1, ca, cols, out + n), ra++;
        n += pt_add_block(p, ra, rb, 0, cols, out + n);
        if (cb > 0) n += pt_add_block(p, rb, rb + 1, 0, cb, out + n);
    }
    return n;
}

void pt_param_table_free(pt_param_table *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

/* Points one tensor's entry of a view at ptr. */
static void pt_view_set(pt_model_view *v, const pt_param *p, float *ptr, int tied,
                        int first_expert) {
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
    case PT_KIND_BQ: lv->bqkv = ptr; break;
    case PT_KIND_BK:
    case PT_KIND_BV: break; /* adjacent to q's bias */
    case PT_KIND_BO: lv->bo = ptr; break;
    case PT_KIND_MLP_NORM: lv->mlp_norm = ptr; break;
    case PT_KIND_WGATE: lv->wgu = ptr; break;
    case PT_KIND_WUP: break; /* adjacent to gate */
    case PT_KIND_WDOWN: lv->wdown = ptr; break;
    case PT_KIND_ROUTER: lv->router = ptr; break;
    case PT_KIND_ROUTER_BIAS: lv->router_bias = ptr; break;
    case PT_KIND_EXPERT_W1:
        if (p->expert == first_expert) lv->experts = ptr;
        break;
    case PT_KIND_EXPERT_W3:
    case PT_KIND_EXPERT_W2: break; /* adjacent to expert 0's w1, in order */
    default: PT_ASSERT(0);
    }
}

void pt_model_point(pt_model *m, int unit, int use, float *buf, size_t buf_lo, size_t buf_hi) {
    pt_model_view *v = use == PT_USE_PARAMS ? &m->w : &m->g;
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
        if (p->unit != unit || p->offset < buf_lo || p->offset >= buf_hi) continue;
        int ep = m->par.ep > 1 ? m->par.ep : 1;
        pt_view_set(v, p, buf ? buf + (p->offset - buf_lo) : NULL, m->cfg.tied_embeddings,
                    m->par.ep_rank * (m->cfg.n_experts / ep));
    }
}

void pt_model_point16(pt_model *m, int unit, pt_bf16 *buf, size_t buf_lo, size_t buf_hi) {
    int ep = m->par.ep > 1 ? m->par.ep : 1;
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
        if (p->unit != unit || p->offset < buf_lo || p->offset >= buf_hi) continue;
        pt_view_set(&m->w16, p, buf ? (float *)(void *)(buf + (p->offset - buf_lo)) : NULL,
                    m->cfg.tied_embeddings, m->par.ep_rank * (m->cfg.n_experts / ep));
    }
}

pt_status pt_model_init(pt_model *m, const pt_model_config *cfg, pt_backend *be) {
    return pt_model_init_ex(m, cfg, be, 0, 0, NULL);
}

pt_status pt_model_init_ex(pt_model *m, const pt_model_config *cfg, pt_backend *be,
                           size_t alloc_total, int flags, const pt_model_parallel *par) {
    PT_TRY(pt_model_config_check(cfg));
    int tp = par ? par->tp : 1;
    PT_TRY(pt_model_check_tp(cfg, tp));
    memset(m, 0, sizeof *m);
    m->cfg = *cfg;
    m->be = be;
    m->par = par ? *par : (pt_model_parallel){.tp = 1};
    m->act_size = sizeof(float);
    m->loc = pt_model_local_dims(cfg, tp, m->par.tp_rank);
    if (m->par.n_chunks == 0) m->par.chunk[0] = (pt_chunk){0, cfg->n_layers};
    pt_param_table_build_local(&m->table, cfg, &m->par);
    pt_param_table_build(&m->gtable, cfg);
    if (cfg->n_experts > 0) {
        pt_moe_model_init(m);
    }
    m->alloc_total = alloc_total > m->table.total ? alloc_total : m->table.total;
    m->flags = flags;
    m->w.layers = pt_calloc((size_t)cfg->n_layers, sizeof *m->w.layers);
    m->g.layers = pt_calloc((size_t)cfg->n_layers, sizeof *m->g.layers);
    if (!(flags & PT_MODEL_NO_PARAMS)) m->params = be->alloc(be, m->alloc_total * sizeof(float));
    if (!(flags & PT_MODEL_NO_GRADS)) m->grads = be->alloc(be, m->alloc_total * sizeof(float));
    for (int u = 0; u < pt_model_n_units(m); u++) {
        if (m->params) pt_model_point(m, u, PT_USE_PARAMS, m->params, 0, m->alloc_total);
        if (m->grads) pt_model_point(m, u, PT_USE_GRADS, m->grads, 0, m->alloc_total);
    }

    /* rotary tables in double, rounded once: angle = pos · theta^(−2i/hd) */
    int hd = pt_head_dim(cfg), half = hd / 2;
    size_t n = (size_t)cfg->max_seq_len * half;
    float *c = pt_malloc(n * sizeof *c), *s = pt_malloc(n * sizeof *s);
    for (int p = 0; p < cfg->max_seq_len; p++)
        for (int i = 0; i < half; i++) {
            /* Hugging Face computes inv_freq in fp32, then pos·inv_freq in fp32 */
            float inv = pt_rope_inv_freq(cfg, i);
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

/* The rotary frequency of pair i: theta^(−2i/hd) as Hugging Face computes it in fp32; with
 * Llama 3's rope scaling (cfg->rope_factor > 0; transformers' _compute_llama3_parameters) a
 * wavelength 2π/f beyond original_max / low_freq_factor gets f / factor, one below
 * original_max / high_freq_factor keeps f, and those between blend the two by
 * s = (original_max / wavelength − low) / (high − low): (1 − s)·f / factor + s·f. */
float pt_rope_inv_freq(const pt_model_config *cfg, int i) {
    int hd = pt_head_dim(cfg);
    float f = (float)(1.0 / pow((double)cfg->rope_theta, (double)(2 * i) / hd));
    if (!(cfg->rope_factor > 0)) return f;
    float factor = cfg->rope_factor, lo = cfg->rope_low_freq_factor, hi = cfg->rope_high_freq_factor;
    float orig = (float)cfg->rope_original_max_seq_len, wavelen = 2.0f * (float)M_PI / f;
    if (wavelen > orig / lo) return f / factor;
    if (wavelen < orig / hi) return f;
    float sm = (orig / wavelen - lo) / (hi - lo);
    return (1.0f - sm) * f / factor + sm * f;
}

void pt_model_free(pt_model *m) {
    if (!m->be) return;
    if (m->params) m->be->free(m->be, m->params);
    if (m->grads) m->be->free(m->be, m->grads);
    m->be->free(m->be, m->rope_cos);
    m->be->free(m->be, m->rope_sin);
    free(m->w.layers);
    free(m->g.layers);
    free(m->w16.layers);
    if (m->params16) m->be->free(m->be, m->params16);
    pt_param_table_free(&m->table);
    pt_param_table_free(&m->gtable);
    pt_moe_model_free(m);
    PT_ASSERTF(!m->ws, "activations outlive their model");
    memset(m, 0, sizeof *m);
}

pt_status pt_model_set_precision(pt_model *m, pt_precision prec) {
    PT_ASSERTF(!m->ws && !m->params16, "the precision is set once, before any activations");
    if (prec == PT_PREC_FP32) return PT_OK;
    /* what bf16 does not cover yet, refused by name: each rank rounds its part of a shared
     * key/value head's input gradient, where one process rounds their sum: measured 0.23× bf16's
     * own distance from fp32, too far */
    if (m->loc.kv_shared > 1)
        return pt_errorf(PT_ERR_CONFIG, "training.precision = bf16 does not support key/value "
                         "heads replicated over tensor ranks yet (parallel.tp = %d > "
                         "model.n_kv_heads = %d)", m->par.tp, m->cfg.n_kv_heads);
    m->prec = prec;
    m->act_size = sizeof(pt_bf16);
    m->w16.layers = pt_calloc((size_t)m->cfg.n_layers, sizeof *m->w16.layers);
    if (m->flags & PT_MODEL_NO_PARAMS16) return PT_OK; /* ZeRO-3: its gathers point w16
                                                        * (pt_model_point16) */
    m->params16 = m->be->alloc(m->be, m->alloc_total * sizeof(pt_bf16));
    for (int u = 0; u < pt_model_n_units(m); u++) pt_model_point16(m, u, m->params16, 0, m->alloc_total);
    pt_model_sync_weights(m);
    return PT_OK;
}

void pt_model_sync_weights(pt_model *m) {
    if (m->params16 && m->params) m->be->to_bf16(m->be, m->params16, m->params, m->alloc_total);
}

void pt_model_init_weights_host(const pt_model *m, uint64_t seed, float *host) {
    /* RNG streams per tensor (seeded by seed and tensor index) so that a tensor's values do not
     * depend on which other tensors exist or which rank initialises it. */
    for (int i = 0; i < m->gtable.n; i++) {
        const pt_param *p = &m->gtable.p[i];
        float *dst = host + p->offset;
        if (p->ndim == 1) { /* norm weights 1, biases (a router's selection bias too) 0 */
            int norm = p->kind == PT_KIND_ATTN_NORM || p->kind == PT_KIND_MLP_NORM ||
                       p->kind == PT_KIND_FINAL_NORM;
            for (size_t j = 0; j < p->numel; j++) dst[j] = norm ? 1.0f : 0.0f;
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

/* ------------------------------------------------------------------------------------------ */
/* activations */

/* The head's vocabulary rows on this rank: its block of the split over the pipeline ranks, or
 * (unsplit) its tensor-parallel block. */
static int pt_head_V(const pt_model *m) { return m->par.head_split ? m->par.head_V : m->loc.V; }
static const pt_tp_ops *pt_head_ops(const pt_model *m) {
    return m->par.head_split ? m->par.head_ops : m->par.tp_ops;
}

pt_acts *pt_acts_create(const pt_model *m, int B, int T) {
    return pt_acts_create_chunk(m, B, T, 0, 0);
}

/* A layer's arrays, in the order they are laid out. */
enum { PT_A_X, PT_A_RSTD1, PT_A_XN1, PT_A_QKV, PT_A_ATT, PT_A_LSE, PT_A_XMID, PT_A_RSTD2, PT_A_XN2,
       PT_A_GU, PT_A_H, PT_A_COUNT };

static void **pt_layer_array(pt_layer_acts *la, int i) {
    void **f[PT_A_COUNT] = {&la->x,    &la->rstd1, &la->xn1, &la->qkv, &la->att, &la->lse,
                            &la->xmid, &la->rstd2, &la->xn2, &la->gu,  &la->h};
    return f[i];
}

/* Bytes of an element of array i: fp32 statistics, the model's activation elements otherwise. */
static size_t pt_layer_esize(const pt_model *m, int i) {
    return i == PT_A_RSTD1 || i == PT_A_RSTD2 || i == PT_A_LSE ? sizeof(float) : (size_t)m->act_size;
}

/* Elements of each of a layer's arrays for B sequences of T tokens (a MoE layer's gate/up and h
 * live in its pt_moe_acts). */
static void pt_layer_sizes(const pt_model *m, int B, int T, int moe, size_t *n) {
    const pt_local_dims *d = &m->loc;
    size_t N = (size_t)B * T, R = (size_t)pt_res_rows(m, (int)N), C = (size_t)m->cfg.dim;
    size_t hd = (size_t)pt_head_dim(&m->cfg), q = (size_t)d->H * hd, kv = (size_t)d->KV * hd;
    size_t F = moe ? 0 : (size_t)d->F;
    size_t sz[PT_A_COUNT] = {R * C, R,         R * C, N * (q + 2 * kv), N * q, (size_t)B * d->H * T,
                             R * C, R,         R * C, N * 2 * F,        N * F};
    memcpy(n, sz, sizeof sz);
}

/* Whether a layer recomputing in mode re keeps array i for its backward (model.h). The
 * log-sum-exp goes with the attention's output. */
static int pt_layer_keeps(int re, int i, int zb, int cp) {
    if (re == PT_RECOMPUTE_NONE || i == PT_A_X) return 1;
    if (zb && (i == PT_A_XN1 || i == PT_A_ATT || i == PT_A_LSE || i == PT_A_XN2 || i == PT_A_H))
        return 1; /* the weight gradients' operands, from the input pass to the weight pass */
    if (re == PT_RECOMPUTE_FULL) return 0;
    if (i == PT_A_ATT || i == PT_A_LSE) return cp; /* selective: the attention core */
    return i != PT_A_H;                            /* ... and the SwiGLU activation */
}


void pt_model_set_recompute(pt_model *m, pt_recompute mode, int layers) {
    PT_ASSERTF(!m->ws, "the recompute mode is set before the first activations are made");
    m->recompute = mode;
    m->recompute_layers = layers > 0 ? layers : 0;
}

size_t pt_model_workspace_bytes(const pt_model *m) {
    return (m->ws ? m->ws->bytes : 0) + (m->scr ? m->scr->bytes : 0);
}

/* The mode of the i-th layer of a chunk. */
static int pt_layer_mode(const pt_model *m, int i) {
    if (m->recompute == PT_RECOMPUTE_FULL && m->recompute_layers && i >= m->recompute_layers)
        return PT_RECOMPUTE_NONE;
    return m->recompute;
}

/* Every array is rounded up to 64 bytes. */
static size_t pt_round64(size_t bytes) { return (bytes + 63) & ~(size_t)63; }

/* Hands out n bytes of a block (rounded up to 64), or counts them (*p NULL). */
static void *pt_take(char **p, size_t *used, size_t n) {
    void *r = *p ? *p + *used : NULL;
    *used += pt_round64(n);
    return r;
}

/* The recomputation workspace's arrays handed out from p (NULL: only counted); returns their
 * bytes. */
static size_t pt_ws_layout(const pt_model *m, struct pt_model_ws *ws, int B, int T, int zb,
                           char *p) {
    size_t n[PT_A_COUNT], N = (size_t)B * T, R = (size_t)pt_res_rows(m, (int)N), used = 0;
    pt_layer_sizes(m, B, T, 0, n);
    for (int i = 0; i < PT_A_COUNT; i++)
        if (!pt_layer_keeps(m->recompute, i, zb, m->par.cp > 1))
            *pt_layer_array(&ws->la, i) = pt_take(&p, &used, n[i] * pt_layer_esize(m, i));
    if (m->recompute == PT_RECOMPUTE_FULL)
        ws->xnext = pt_take(&p, &used, R * m->cfg.dim * (size_t)m->act_size);
    return used;
}

static void pt_ws_create(pt_model *m, int B, int T, int zb) {
    struct pt_model_ws *ws = m->ws = pt_calloc(1, sizeof *ws);
    size_t used = pt_ws_layout(m, ws, B, T, zb, NULL);
    ws->block = m->be->alloc(m->be, used ? used : 1);
    ws->bytes = pt_ws_layout(m, ws, B, T, zb, ws->block);
    ws->B = B, ws->T = T, ws->zb = zb;
}

/* Whether this rank's chunks include the model's last with its head (not split over the
 * pipeline): its scratch then holds a chunk of the head's logits. */
static int pt_holds_head(const pt_model *m) {
    for (int k = 0; k < (m->par.n_chunks ? m->par.n_chunks : 1); k++)
        if (m->par.chunk[k].l1 == m->cfg.n_layers && !m->par.head_split) return 1;
    return 0;
}

/* The backward's scratch for micro-batches of B sequences of T tokens (struct
 * pt_model_scratch) handed out from p (NULL: only counted); returns its bytes. */
static size_t pt_scratch_layout(const pt_model *m, struct pt_model_scratch *s, int B, int T,
                                char *p) {
    const pt_model_config *c = &m->cfg;
    const pt_local_dims *d = &m->loc;
    size_t N = (size_t)B * T, C = c->dim, F = (size_t)d->F, V = (size_t)pt_head_V(m);
    size_t q = (size_t)d->H * pt_head_dim(c), qkv = q + 2 * (size_t)d->KV * pt_head_dim(c);
    size_t HR = pt_holds_head(m) ? (size_t)pt_head_chunk_rows((int)V, (int)N) : 0;
    size_t f = sizeof(float), E = (size_t)m->act_size, used = 0;
    int sp = pt_sharded(m), bf = pt_is_bf16(m);
    size_t wA = C > qkv ? C : qkv, wB = C > q ? C : q;
    wA = wA > 2 * F ? wA : 2 * F, wB = wB > F ? wB : F;
    size_t g16 = N * wA > HR * V ? N * wA : HR * V;
    s->logits = pt_take(&p, &used, HR * V * f);
    s->losses = pt_take(&p, &used, HR * f);
    s->dxn = pt_take(&p, &used, N * C * f);
    s->dqkv = pt_take(&p, &used, N * qkv * f);
    s->datt = pt_take(&p, &used, N * q * f);
    s->dgu = pt_take(&p, &used, N * 2 * F * f);
    s->dh = pt_take(&p, &used, N * F * f);
    s->dfull = pt_take(&p, &used, sp ? N * C * f : 0);
    s->dnorm = pt_take(&p, &used, 2 * C * f);
    s->dkv = pt_take(&p, &used, 2 * (size_t)d->KV * pt_head_dim(c) * C * f);
    s->sA = pt_take(&p, &used, bf ? N * wA * f : 0);
    s->sB = pt_take(&p, &used, bf ? N * wB * f : 0);
    s->g16 = pt_take(&p, &used, bf ? g16 * sizeof(pt_bf16) : 0);
    s->wn = pt_take(&p, &used, bf ? (C > qkv ? C : qkv) * f : 0);
    s->ones = pt_take(&p, &used, pt_model_qkv_bias(c) ? N * f : 0);
    s->xg = pt_take(&p, &used, sp ? N * C * E : 0);
    s->xf = pt_take(&p, &used, HR ? N * C * E : 0);
    s->dxf = pt_take(&p, &used, HR ? N * C * f : 0);
    if (!HR) s->logits = s->losses = NULL, s->xf = NULL, s->dxf = NULL;
    if (!sp) s->dfull = NULL, s->xg = NULL;
    if (!bf) s->sA = s->sB = s->wn = NULL, s->g16 = NULL;
    if (!pt_model_qkv_bias(c)) s->ones = NULL;
    s->N = (int)N, s->HR = (int)HR;
    return used;
}

static void pt_scratch_create(pt_model *m, int B, int T) {
    struct pt_model_scratch *s = m->scr = pt_calloc(1, sizeof *s);
    s->block = m->be->alloc(m->be, pt_scratch_layout(m, s, B, T, NULL));
    s->bytes = pt_scratch_layout(m, s, B, T, s->block);
    if (s->ones) {
        size_t N = (size_t)s->N;
        float *one = pt_malloc(N * sizeof(float));
        for (size_t i = 0; i < N; i++) one[i] = 1.0f;
        m->be->upload(m->be, s->ones, one, N * sizeof(float));
        free(one);
    }
}

/* The MoE activations a layer of mode re uses: its own, or the workspace's (full). */
static struct pt_moe_acts *pt_moe_acts_for(pt_model *m, int re, int N) {
    if (re != PT_RECOMPUTE_FULL) return pt_moe_acts_create(m, N);
    struct pt_model_ws *ws = m->ws;
    if (!ws->moe) {
        ws->moe = pt_moe_acts_create(m, N);
        ws->bytes += pt_moe_acts_bytes(ws->moe);
    }
    return ws->moe;
}

/* A set's arrays (chunk k, B sequences of T tokens) handed out from p (NULL: only counted): what
 * its layers keep (an array a layer does not keep is the workspace's, or NULL when counting),
 * zero bubble's operands, the set's own output and its gradient, and the last chunk's final norm,
 * xf and xf's gradient; returns their bytes. a->layers has room for the chunk's layers. */
static size_t pt_set_layout(const pt_model *m, pt_acts *a, int B, int T, int k, int zb, char *p) {
    const pt_model_config *c = &m->cfg;
    const pt_local_dims *d = &m->loc;
    pt_chunk ch = m->par.chunk[k];
    int nl = ch.l1 - ch.l0, last = ch.l1 == c->n_layers, hd = pt_head_dim(c);
    size_t N = (size_t)B * T, C = c->dim, F = (size_t)d->F, R = (size_t)pt_res_rows(m, (int)N);
    size_t qkv = ((size_t)d->H + 2 * (size_t)d->KV) * hd;
    size_t E = (size_t)m->act_size, f = sizeof(float), n[PT_A_COUNT], used = 0;
    for (int l = 0; l < nl; l++) {
        pt_layer_acts *la = &a->layers[l];
        int moe = pt_layer_is_moe(c, ch.l0 + l);
        la->re = pt_layer_mode(m, l);
        la->keep = 0;
        pt_layer_sizes(m, B, T, moe, n);
        for (int i = 0; i < PT_A_COUNT; i++) {
            int keep = pt_layer_keeps(la->re, i, zb, m->par.cp > 1);
            void *arr = keep ? pt_take(&p, &used, n[i] * pt_layer_esize(m, i)) : NULL;
            *pt_layer_array(la, i) = keep || !m->ws ? arr : *pt_layer_array(&m->ws->la, i);
            la->keep |= (unsigned)keep << i;
        }
        if (!zb) continue;
        la->z_dmlp = pt_take(&p, &used, N * C * f);
        la->z_dgu = pt_take(&p, &used, N * 2 * F * f);
        la->z_datt = pt_take(&p, &used, N * C * f);
        la->z_dqkv = pt_take(&p, &used, N * qkv * f);
    }
    a->xout = pt_take(&p, &used, R * C * E);
    a->dx = pt_take(&p, &used, R * C * f);
    int split = last && m->par.head_split; /* the set keeps xf and its gradient for its HEAD */
    a->rstdf = pt_take(&p, &used, last ? R * f : 0);
    a->xf = pt_take(&p, &used, split ? N * C * E : 0);
    a->dxf = pt_take(&p, &used, split ? N * C * f : 0);
    a->dxr = split ? a->dxf : pt_take(&p, &used, last ? R * C * f : 0);
    if (!last) a->rstdf = NULL, a->dxr = NULL;
    if (!split) a->xf = NULL, a->dxf = NULL;
    return used;
}

size_t pt_acts_count(const pt_model *m, int B, int T, int k, int zb, size_t ep_bytes, size_t *ws,
                     size_t *scratch) {
    const pt_model_config *c = &m->cfg;
    pt_chunk ch = m->par.chunk[k];
    int nl = ch.l1 - ch.l0, N = B * T;
    pt_acts a = {.layers = pt_calloc((size_t)(nl ? nl : 1), sizeof *a.layers)};
    size_t set = pt_set_layout(m, &a, B, T, k, zb, NULL), moe = 0;
    for (int l = 0; l < nl; l++)
        if (pt_layer_is_moe(c, ch.l0 + l)) {
            size_t b = pt_moe_acts_count(m, N) + ep_bytes;
            if (a.layers[l].re != PT_RECOMPUTE_FULL) set += b;
            else moe = b; /* one in the workspace, shared */
        }
    free(a.layers);
    struct pt_model_ws w = {0};
    struct pt_model_scratch sc = {0};
    *ws = m->recompute != PT_RECOMPUTE_NONE ? pt_ws_layout(m, &w, B, T, zb, NULL) + moe : 0;
    *scratch = pt_scratch_layout(m, &sc, B, T, NULL);
    return set;
}

pt_acts *pt_acts_create_chunk(const pt_model *mc, int B, int T, int k, int zb) {
    pt_model *m = (pt_model *)mc; /* the workspace is made with the first activations */
    const pt_model_config *c = &m->cfg;
    PT_ASSERTF(T <= c->max_seq_len, "sequence length %d exceeds model.max_seq_len %d", T,
               c->max_seq_len);
    pt_chunk ch = m->par.chunk[k];
    int nl = ch.l1 - ch.l0, last = ch.l1 == c->n_layers;
    size_t N = (size_t)B * T, V = (size_t)pt_head_V(m);
    PT_ASSERTF(!pt_sharded(m) || N % (size_t)m->par.tp == 0,
               "sequence parallelism: micro_batch × seq_len = %zu rows must be divisible by tp = %d",
               N, m->par.tp);
    if (m->recompute != PT_RECOMPUTE_NONE && !m->ws) pt_ws_create(m, B, T, zb);
    if (m->ws) m->ws->users++;
    PT_ASSERTF(!m->ws || ((size_t)m->ws->B * m->ws->T >= N && m->ws->T >= T && m->ws->zb == zb),
               "the recomputation workspace was made for (%d,%d%s)", m->ws->B, m->ws->T,
               m->ws->zb ? ", zero bubble" : "");
    if (!m->scr) pt_scratch_create(m, B, T);
    struct pt_model_scratch *scr = m->scr;
    scr->users++;
    PT_ASSERTF((size_t)scr->N >= N, "the backward's scratch was made for %d rows", scr->N);
    size_t HR = last && !m->par.head_split ? (size_t)pt_head_chunk_rows((int)V, (int)N) : 0;
    PT_ASSERTF(HR <= (size_t)scr->HR, "the backward's scratch has no head");

    pt_acts *a = pt_calloc(1, sizeof *a);
    a->B = a->cap_B = B;
    a->T = a->cap_T = T;
    a->l0 = ch.l0;
    a->l1 = ch.l1;
    a->first = ch.l0 == 0;
    a->last = last;
    a->zb = zb;
    a->head_rows = (int)HR;
    a->layers = pt_calloc((size_t)(nl ? nl : 1), sizeof *a->layers);
    a->block = m->be->alloc(m->be, pt_set_layout(m, a, B, T, k, zb, NULL));
    a->bytes = pt_set_layout(m, a, B, T, k, zb, a->block); /* what the arrays use */
    for (int l = 0; l < nl; l++) {
        pt_layer_acts *la = &a->layers[l];
        if (pt_layer_is_moe(c, ch.l0 + l)) la->moe = pt_moe_acts_for(m, la->re, (int)N);
        if (la->re != PT_RECOMPUTE_FULL) a->bytes += pt_moe_acts_bytes(la->moe);
    }
    a->logits = HR ? scr->logits : NULL, a->losses = HR ? scr->losses : NULL;
    a->dxn = scr->dxn, a->dqkv = scr->dqkv, a->datt = scr->datt, a->dgu = scr->dgu;
    a->dh = scr->dh, a->dfull = scr->dfull, a->dnorm = scr->dnorm, a->dkv = scr->dkv;
    a->sA = scr->sA, a->sB = scr->sB, a->g16 = scr->g16, a->wn = scr->wn, a->ones = scr->ones;
    a->xg = scr->xg;
    if (HR) a->xf = scr->xf, a->dxf = scr->dxf;
    a->pos = pt_calloc((size_t)T, sizeof *a->pos);
    a->d_pos = m->be->alloc(m->be, (size_t)T * sizeof(int32_t));
    a->d_rows = m->be->alloc(m->be, N * sizeof(int32_t));
    a->h_rows = pt_calloc(N, sizeof *a->h_rows);
    a->d_lo = m->be->alloc(m->be, N * sizeof(int32_t));
    a->h_lo = pt_calloc(N, sizeof *a->h_lo);
    a->h_tg = pt_calloc(HR ? HR : 1, sizeof *a->h_tg);
    a->h_losses = pt_calloc(HR ? HR : 1, sizeof *a->h_losses);
    return a;
}

void *pt_acts_input(pt_acts *a) { return a->l1 > a->l0 ? a->layers[0].x : a->xout; }
void *pt_acts_output(pt_acts *a) { return a->xout; }
float *pt_acts_grad(pt_acts *a) { return a->dx; }

void pt_acts_free(const pt_model *m, pt_acts *a) {
    if (!a) return;
    m->be->free(m->be, a->block);
    for (int l = 0; l < a->l1 - a->l0; l++)
        if (a->layers[l].re != PT_RECOMPUTE_FULL) pt_moe_acts_free(m, a->layers[l].moe);
    struct pt_model_ws *ws = m->ws;
    if (ws && --ws->users == 0) {
        m->be->free(m->be, ws->block);
        pt_moe_acts_free(m, ws->moe);
        free(ws);
        ((pt_model *)m)->ws = NULL;
    }
    struct pt_model_scratch *scr = m->scr;
    if (--scr->users == 0) {
        m->be->free(m->be, scr->block);
        free(scr);
        ((pt_model *)m)->scr = NULL;
    }
    free(a->layers);
    free(a->pos);
    m->be->free(m->be, a->d_pos);
    m->be->free(m->be, a->d_rows);
    m->be->free(m->be, a->d_lo);
    free(a->h_rows), free(a->h_lo), free(a->h_tg), free(a->h_losses);
    free(a);
}

size_t pt_acts_bytes(const pt_acts *a) { return a->bytes; }

void pt_acts_set_documents(pt_acts *a, const int32_t *doc_start, int restart) {
    a->docs = doc_start;
    a->docs_restart = restart;
}

void pt_acts_set_stats(pt_acts *a, pt_moe_stats *stats) { a->stats = stats; }

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
    int hd = pt_head_dim(c), q = m->loc.H * hd, qkv = q + 2 * m->loc.KV * hd;
    return (pt_attn_shape){.B = a->B,
                           .Tq = a->T,
                           .Tk = a->T,
                           .n_heads = m->loc.H,
                           .n_kv_heads = m->loc.KV,
                           .head_dim = hd,
                           .ldq = qkv,
                           .ldk = qkv,
                           .ldv = qkv,
                           .ldo = q,
                           .q_pos = a->d_pos,
                           .k_pos = a->d_pos,
                           .q_lo = a->has_lo ? a->d_lo : NULL,
                           .scale = 1.0f / sqrtf((float)hd),
                           .p_bf16 = pt_is_bf16(m)};
}

/* The RMSNorm of this rank's residual rows x (R,C) into out (R,C, activation elements); w the
 * norm's weight as the model computes with it. */
static void pt_norm(pt_model *m, pt_acts *a, void *out, float *rstd, const void *x, const float *w,
                    int N) {
    int C = m->cfg.dim, R = pt_res_rows(m, N);
    size_t RC = (size_t)R * C;
    const float *in = pt_f32(m, a->sA, x, RC);
    float *o = pt_out(m, out, a->sB);
    m->be->rmsnorm_forward(m->be, o, rstd, in, pt_wvec(m, a, w), R, C, m->cfg.norm_eps);
    pt_store(m, out, o, RC);
}

/* Layer l's four linears (linear.h): q/k/v and gate/up column-parallel, o and down
 * row-parallel; their gradients from g (NULL in forward). */
enum { PT_LIN_QKV, PT_LIN_O, PT_LIN_GU, PT_LIN_DOWN };
static pt_linear pt_layer_linear(const pt_model *m, int l, int which, const pt_layer_view *g) {
    const pt_layer_view *w = &pt_wc(m)->layers[l];
    int C = m->cfg.dim, F = m->loc.F, hd = pt_head_dim(&m->cfg);
    int q = m->loc.H * hd, qkv = q + 2 * m->loc.KV * hd;
    switch (which) {
    case PT_LIN_QKV:
        return (pt_linear){w->wqkv, w->bqkv, g ? g->wqkv : NULL, g ? g->bqkv : NULL, C, qkv,
                           m->loc.kv_shared > 1 ? q : qkv};
    case PT_LIN_O:
        return (pt_linear){w->wo, w->bo, g ? g->wo : NULL, g ? g->bo : NULL, q, C, C};
    case PT_LIN_GU:
        return (pt_linear){w->wgu, NULL, g ? g->wgu : NULL, NULL, C, 2 * F, 2 * F};
    default:
        return (pt_linear){w->wdown, NULL, g ? g->wdown : NULL, NULL, F, C, C};
    }
}

/* The attention core of layer l: att, lse from qkv (ring attention under context parallelism). */
static void pt_attention(pt_model *m, pt_acts *a, int l, int recompute) {
    pt_layer_acts *la = &a->layers[l - a->l0];
    int N = a->B * a->T, hd = pt_head_dim(&m->cfg), q = m->loc.H * hd, kv = m->loc.KV * hd;
    pt_attn_shape as = pt_attn_shape_for(m, a);
    const float *qkv = pt_f32(m, a->sA, la->qkv, (size_t)N * (q + 2 * kv));
    float *att = pt_out(m, la->att, a->sB);
    const pt_cp_ops *cp = m->par.cp_ops;
    if (a->kv) {
        /* decoding: the new rows' keys and values (after rope) appended to layer l's cache at
         * their positions, then the queries against every cached position (B = 1) */
        pt_kv_cache *c = a->kv;
        float *ck = c->kv + (size_t)l * c->max_len * c->width;
        for (int i = 0; i < a->T; i++)
            m->be->copy(m->be, ck + (size_t)(c->len + i) * c->width, qkv + (size_t)i * as.ldq + q,
                        (size_t)2 * kv * sizeof(float));
        as.Tk = c->len + a->T;
        as.ldk = as.ldv = c->width;
        as.k_pos = c->d_pos;
        m->be->attention_forward(m->be, &as, qkv, ck, ck + kv, att, la->lse);
    } else if (cp)
        cp->attn_forward(cp->ctx, &as, qkv, att, la->lse, l, recompute, pt_poll_cb, m);
    else
        m->be->attention_forward(m->be, &as, qkv, qkv + q, qkv + q + kv, att, la->lse);
    pt_store(m, la->att, att, (size_t)N * q);
}

/* h = silu(gate)·up of layer la (N rows). */
static void pt_swiglu(pt_model *m, pt_acts *a, pt_layer_acts *la, int N) {
    int F = m->loc.F;
    const float *gu = pt_f32(m, a->sA, la->gu, (size_t)N * 2 * F);
    float *h = pt_out(m, la->h, a->sB);
    m->be->swiglu_forward(m->be, h, gu, N, F);
    pt_store(m, la->h, h, (size_t)N * F);
}

/* Layer l's forward from its input la->x to xnext. recompute: a second forward in backward (full
 * recomputation), whose routing counts and balancing losses are not counted again. */
static void pt_layer_forward(pt_model *m, pt_acts *a, int l, void *xnext, int recompute) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_local_dims *d = &m->loc;
    int N = a->B * a->T, C = c->dim, F = d->F, hd = pt_head_dim(c), R = pt_res_rows(m, N);
    int q = d->H * hd, kv = d->KV * hd, qkv = q + 2 * kv;
    pt_layer_acts *la = &a->layers[l - a->l0];
    const pt_layer_view *w = &pt_wc(m)->layers[l];
    /* xn1 = rmsnorm(x) (R,C); xn1 · Wqkvᵀ (C, q+2kv) -> qkv (N, q+2kv): this rank's heads, block
     * by block as xn1's rows are gathered; rope on q (H heads) and k (KV heads, at column q) */
    float *t = pt_out(m, la->qkv, a->sA);
    pt_linear L = pt_layer_linear(m, l, PT_LIN_QKV, NULL);
    pt_norm(m, a, la->xn1, la->rstd1, la->x, w->attn_norm, N);
    pt_linear_col_forward(m, a, &L, la->xn1, t, N);
    pt_poll(m);
    be->rope(be, t, a->d_rows, N, d->H, hd, qkv, m->rope_cos, m->rope_sin, 0);
    be->rope(be, t + q, a->d_rows, N, d->KV, hd, qkv, m->rope_cos, m->rope_sin, 0);
    pt_store(m, la->qkv, t, (size_t)N * qkv);
    pt_attention(m, a, l, recompute);
    pt_poll(m);
    /* xmid = x + att (N,q) · Woᵀ (q,C), the product summed over the tp ranks */
    L = pt_layer_linear(m, l, PT_LIN_O, NULL);
    pt_linear_row_forward(m, a, &L, la->xmid, la->x, la->att, N);
    /* xn2 = rmsnorm(xmid) (R,C); xn2 · Wguᵀ (C,2F) -> gu (N,2F), as xn2's rows are gathered
     * (the experts take xn2 whole) */
    t = pt_out(m, la->gu, a->sA);
    L = pt_layer_linear(m, l, PT_LIN_GU, NULL);
    pt_norm(m, a, la->xn2, la->rstd2, la->xmid, w->mlp_norm, N);
    const void *xn2 = pt_linear_col_forward(m, a, la->moe ? NULL : &L, la->xn2, t, N);
    if (la->moe) { /* xnext = xmid + the experts' output: each tp rank's slices of every expert
                    * give a part, summed like the dense MLP's. fp32 on one rank adds straight
                    * into the residual; otherwise through y (N,C, fp32), the tp sum, then the
                    * add in fp32 (rounded once into a bf16 xnext) */
        float *y = a->dxn;
        int direct = !m->par.tp_ops && !pt_is_bf16(m);
        size_t RC = (size_t)R * C;
        if (direct) be->copy(be, xnext, la->xmid, RC * sizeof(float));
        if (!direct) be->zero(be, y, (size_t)N * C * sizeof(float));
        pt_moe_forward(m, la->moe, w, xn2, direct ? xnext : y, a->B, a->T,
                       recompute ? NULL : a->counting, l,
                       recompute);
        if (!direct) {
            pt_tp_reduce(m, y, N, C);
            const float *xm = pt_f32(m, a->sA, la->xmid, RC);
            float *xo = pt_out(m, xnext, a->sA);
            if (xo != xm) be->copy(be, xo, xm, RC * sizeof(float));
            be->add(be, xo, y, RC);
            pt_store(m, xnext, xo, RC);
        }
        if (!recompute && a->counting)
            pt_moe_a2a_rows(m, la->moe, &a->counting->a2a_sent, &a->counting->a2a_recv);
        return;
    }
    /* gu -> h (N,F) */
    pt_store(m, la->gu, t, (size_t)N * 2 * F);
    pt_swiglu(m, a, la, N);
    pt_poll(m);
    /* xnext = xmid + h (N,F) · Wdownᵀ (F,C) */
    L = pt_layer_linear(m, l, PT_LIN_DOWN, NULL);
    pt_linear_row_forward(m, a, &L, xnext, la->xmid, la->h, N);
}

/* What layer l did not keep of its forward, computed again before its backward (model.h:
 * pt_recompute): the whole layer, or the attention core and the SwiGLU activation. */
static void pt_layer_recompute(pt_model *m, pt_acts *a, int l) {
    pt_layer_acts *la = &a->layers[l - a->l0];
    if (la->re == PT_RECOMPUTE_FULL) {
        pt_layer_forward(m, a, l, m->ws->xnext, 1);
        return;
    }
    if (!(la->keep >> PT_A_ATT & 1)) pt_attention(m, a, l, 1); /* never under cp (it keeps them) */
    if (!la->moe && !(la->keep >> PT_A_H & 1)) pt_swiglu(m, a, la, a->B * a->T);
}

/* Runs the layers and the final norm; leaves the full xf (N,C) in a->xf. */
static void pt_forward_trunk(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *pos) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_local_dims *d = &m->loc;
    int N = a->B * a->T, C = c->dim, R = pt_res_rows(m, N);
    size_t RC = (size_t)R * C;
    /* positions (T) are shared by the B sequences; rope wants one per row: with documents
     * restarting them, the distance from the row's document start */
    be->download(be, a->pos, pos, (size_t)a->T * sizeof *pos);
    be->copy(be, a->d_pos, pos, (size_t)a->T * sizeof *pos);
    a->has_lo = a->docs != NULL;
    if (a->has_lo) {
        be->download(be, a->h_lo, a->docs, (size_t)N * sizeof *a->h_lo);
        be->copy(be, a->d_lo, a->docs, (size_t)N * sizeof *a->h_lo);
    }
    for (int i = 0; i < N; i++)
        a->h_rows[i] = a->pos[i % a->T] - (a->has_lo && a->docs_restart ? a->h_lo[i] : 0);
    be->upload(be, a->d_rows, a->h_rows, (size_t)N * sizeof *a->h_rows);
    float *y = a->dxn; /* (N,C) scratch for the partial embedding rows (backward's, unused here) */

    /* tokens (N) -> x (R,C): this rank's vocabulary rows, summed over the tp ranks (in fp32: the
     * other ranks' rows are zeros); a chunk that does not start the model has its input in
     * pt_acts_input already. bf16: the rows of the bf16 copy. */
    void *x0 = pt_acts_input(a);
    int bf = pt_is_bf16(m);
    if (a->first) pt_acquire(m, 0, PT_USE_PARAMS, 0);
    const void *wte = pt_wc(m)->embed; /* (ZeRO-3: gathered by the acquire) */
    if (!a->first) {
    } else if (m->par.tp_ops) {
        if (bf) { /* partial rows */
            be->embedding_forward_bf16(be, a->g16, tokens, wte, N, C, d->v0, d->V);
            be->from_bf16(be, y, a->g16, (size_t)N * C);
        } else {
            be->embedding_forward(be, y, tokens, wte, N, C, d->v0, d->V);
        }
        pt_tp_reduce(m, y, N, C);
        if (bf)
            be->to_bf16(be, x0, y, RC);
        else
            be->copy(be, x0, y, RC * sizeof(float));
    } else if (bf) {
        be->embedding_forward_bf16(be, x0, tokens, wte, N, C, 0, c->vocab_size);
    } else {
        be->embedding_forward(be, x0, tokens, wte, N, C, 0, c->vocab_size);
    }
    /* tied: the head needs it */
    if (a->first && !c->tied_embeddings) pt_release(m, 0, PT_USE_PARAMS, 0);
    for (int l = a->l0; l < a->l1; l++) {
        double t0 = pt_now();
        pt_acquire(m, l + 1, PT_USE_PARAMS, 0);
        pt_layer_forward(m, a, l, l + 1 < a->l1 ? a->layers[l + 1 - a->l0].x : a->xout, 0);
        pt_release(m, l + 1, PT_USE_PARAMS, 0);
        pt_trace_span("forward", t0, pt_now(), "layer", l, NULL, 0);
    }
    if (!a->last) return;
    pt_acquire(m, c->n_layers + 1, PT_USE_PARAMS, 0);
    pt_norm(m, a, pt_at(m, a->xf, pt_own_row0(m, N) * C), a->rstdf, a->xout, pt_wc(m)->final_norm,
            N);
    pt_tp_gather(m, a->xf, N, C, m->act_size); /* xf whole: the head takes every row */
}

/* What the head and loss use: xf (N,C) and dxf, the scratch of a chunk of rows (logits, their
 * losses, the bf16 copy of their gradient, host targets and losses): the last chunk's activations
 * (pt_acts_head_io), or a pt_head_ws when the head is split over the pipeline ranks. */
typedef struct {
    const void *xf;
    float *dxf, *logits, *losses;
    void *g16;
    int32_t *h_tg;
    float *h_losses;
    int rows; /* rows per chunk */
} pt_head_io;

struct pt_head_ws {
    pt_head_io io;
    void *xf;     /* (N,C) activation elements: the last stage's xf received (io = 1) */
    float *dxf;   /* (N,C) this rank's part of its gradient, (R,C) at the start once summed over tp (io = 1) */
    void *block;
    size_t bytes;
    int N;
};

static pt_head_io pt_acts_head_io(pt_acts *a) {
    return (pt_head_io){a->xf, a->dxf, a->logits, a->losses, a->g16, a->h_tg, a->h_losses, a->head_rows};
}

/* The head and loss of rows [r0, r0 + n): logits (n,V) = xf (n,C) · Headᵀ, each row's loss added
 * to *loss (and the valid targets to *valid), and in place of the logits the gradient of
 * loss_scale · Σ losses. Under tensor parallelism (or the head split over the pipeline) V is this
 * rank's vocabulary block: the loss combines the blocks' statistics. */
/* The head as a linear (V rows of this rank's vocabulary, C columns). */
static pt_linear pt_head_linear(const pt_model *m) {
    int C = m->cfg.dim, V = pt_head_V(m);
    return (pt_linear){pt_wc(m)->head, NULL, m->g.head, NULL, C, V, V};
}

static void pt_head_loss(pt_model *m, const pt_head_io *io, const int32_t *targets, int r0, int n,
                         float loss_scale, double *loss, int64_t *valid) {
    pt_backend *be = m->be;
    int C = m->cfg.dim, V = pt_head_V(m);
    const pt_tp_ops *tp = pt_head_ops(m);
    pt_linear L = pt_head_linear(m);
    pt_linear_fwd(m, &L, pt_at(m, io->xf, (size_t)r0 * C), io->logits, n, 0.0f);
    if (tp) {
        tp->xent(tp->ctx, io->logits, targets + r0, n, loss_scale, io->h_losses);
    } else {
        be->softmax_xent(be, io->logits, io->losses, targets + r0, n, V, V, loss_scale);
        be->download(be, io->h_losses, io->losses, (size_t)n * sizeof(float));
    }
    be->download(be, io->h_tg, targets + r0, (size_t)n * sizeof *io->h_tg);
    for (int i = 0; i < n; i++) {
        *loss += io->h_losses[i];
        *valid += io->h_tg[i] >= 0;
    }
}

/* Fused head + loss + head backward of N rows, a chunk of rows at a time:
 * logits (n,V) = xf (n,C) · Headᵀ; logits -> dlogits in place;
 * dxf (n,C) = dlogits · Head; dHead (V,C) += dlogitsᵀ · xf.
 * Under tensor parallelism dxf is summed over the ranks. */
static double pt_head_train(pt_model *m, const pt_head_io *io, const int32_t *targets, int N,
                            float loss_scale, int64_t *n_valid) {
    double t0 = pt_now();
    int C = m->cfg.dim, V = pt_head_V(m), HR = io->rows, head = pt_model_head_unit(m);
    double loss = 0.0;
    int64_t valid = 0;
    pt_acquire(m, head, PT_USE_PARAMS | PT_USE_GRADS, 0);
    pt_linear L = pt_head_linear(m); /* after the acquire: ZeRO-3 points the views there */
    for (int r0 = 0; r0 < N; r0 += HR) {
        int n = N - r0 < HR ? N - r0 : HR;
        pt_head_loss(m, io, targets, r0, n, loss_scale, &loss, &valid);
        const void *dl = io->logits;
        if (pt_is_bf16(m)) m->be->to_bf16(m->be, io->g16, io->logits, (size_t)n * V), dl = io->g16;
        pt_linear_dgrad(m, &L, dl, io->dxf + (size_t)r0 * C, n, 0.0f);
        /* dxf whole: summed over the tp ranks (with sequence parallelism, this rank's rows, at
         * the start) while the last block's head gradient computes */
        if (r0 + n == N) pt_tp_reduce_begin(m, io->dxf, N, C);
        pt_linear_dw(m, &L, dl, pt_at(m, io->xf, (size_t)r0 * C), n);
        pt_poll(m);
    }
    pt_tp_reduce_end(m);
    /* the head's gradient is final here, unless it is the embedding's (tied) */
    pt_release(m, head, m->cfg.tied_embeddings ? PT_USE_PARAMS : PT_USE_PARAMS | PT_USE_GRADS, 0);
    if (n_valid) *n_valid = valid;
    pt_trace_span("head and loss", t0, pt_now(), "rows", N, NULL, 0);
    return loss;
}

/* The head and loss as training computes them (the gradient left in the logits unused). */
static double pt_head_eval(pt_model *m, const pt_head_io *io, const int32_t *targets, int N,
                           int64_t *n_valid) {
    double loss = 0.0;
    int64_t valid = 0;
    int HR = io->rows, head = pt_model_head_unit(m);
    pt_acquire(m, head, PT_USE_PARAMS, PT_PASS_EVAL);
    for (int r0 = 0; r0 < N; r0 += HR)
        pt_head_loss(m, io, targets, r0, N - r0 < HR ? N - r0 : HR, 0.0f, &loss, &valid);
    pt_release(m, head, PT_USE_PARAMS, PT_PASS_EVAL);
    if (n_valid) *n_valid = valid;
    return loss;
}

double pt_model_forward(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *targets,
                        const int32_t *pos, float loss_scale, int64_t *n_valid) {
    a->counting = a->stats;
    pt_forward_trunk(m, a, tokens, pos);
    a->counting = NULL;
    a->has_targets = targets != NULL;
    if (n_valid) *n_valid = 0;
    /* not the last chunk: the output is in a->xout; the head split: xf goes to the pipeline */
    if (!targets || !a->last || m->par.head_split) return 0.0;
    pt_head_io io = pt_acts_head_io(a);
    double loss = pt_head_train(m, &io, targets, a->B * a->T, loss_scale, n_valid);
    /* xf's gradient (this rank's rows) out of the scratch, kept for the backward; the final
     * norm's parameters stay for it too */
    m->be->copy(m->be, a->dxr, a->dxf,
                (size_t)pt_res_rows(m, a->B * a->T) * m->cfg.dim * sizeof(float));
    return loss;
}

double pt_model_eval_loss(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *targets,
                          const int32_t *pos, int64_t *n_valid) {
    pt_forward_trunk(m, a, tokens, pos);
    a->has_targets = 0; /* no backward may follow */
    if (n_valid) *n_valid = 0;
    if (!a->last) return 0.0;
    pt_head_io io = pt_acts_head_io(a);
    double loss = m->par.head_split ? 0.0 : pt_head_eval(m, &io, targets, a->B * a->T, n_valid);
    pt_release(m, m->cfg.n_layers + 1, PT_USE_PARAMS, PT_PASS_EVAL); /* the trunk kept it */
    return loss;
}

pt_head_ws *pt_head_ws_create(const pt_model *m, int N, int with_io) {
    size_t C = (size_t)m->cfg.dim, V = (size_t)pt_head_V(m), f = sizeof(float);
    size_t HR = (size_t)pt_head_chunk_rows((int)V, N);
    int bf = m->prec == PT_PREC_BF16;
    pt_head_ws *w = pt_calloc(1, sizeof *w);
    char *p = NULL;
    for (int pass = 0; pass < 2; pass++) {
        size_t used = 0;
        w->io.logits = pt_take(&p, &used, HR * V * f);
        w->io.losses = pt_take(&p, &used, HR * f);
        w->io.g16 = pt_take(&p, &used, bf ? HR * V * sizeof(pt_bf16) : 0);
        w->xf = pt_take(&p, &used, with_io ? (size_t)N * C * (size_t)m->act_size : 0);
        w->dxf = pt_take(&p, &used, with_io ? (size_t)N * C * f : 0); /* (R,C) after the tp sum */
        if (!pass) p = w->block = m->be->alloc(m->be, used);
        w->bytes = used;
    }
    if (!bf) w->io.g16 = NULL;
    if (!with_io) w->xf = NULL, w->dxf = NULL;
    w->io.rows = (int)HR;
    w->N = N;
    w->io.h_tg = pt_calloc(HR, sizeof *w->io.h_tg);
    w->io.h_losses = pt_calloc(HR, sizeof *w->io.h_losses);
    return w;
}

void pt_head_ws_free(const pt_model *m, pt_head_ws *w) {
    if (!w) return;
    m->be->free(m->be, w->block);
    free(w->io.h_tg), free(w->io.h_losses);
    free(w);
}

void *pt_head_ws_xf(pt_head_ws *w) { return w->xf; }
float *pt_head_ws_dxf(pt_head_ws *w) { return w->dxf; }
size_t pt_head_ws_bytes(const pt_head_ws *w) { return w ? w->bytes : 0; }
void *pt_acts_xf(pt_acts *a) { return a->xf; }
float *pt_acts_dxf(pt_acts *a) { return a->dxf; }

double pt_model_head(pt_model *m, pt_head_ws *w, const void *xf, float *dxf, const int32_t *targets,
                     int N, float loss_scale, int eval) {
    PT_ASSERTF(m->par.head_split && N <= w->N, "the head's workspace was made for %d rows", w->N);
    pt_head_io io = w->io;
    io.xf = xf;
    io.dxf = dxf;
    return eval ? pt_head_eval(m, &io, targets, N, NULL)
                : pt_head_train(m, &io, targets, N, loss_scale, NULL);
}

/* A norm's weight gradient with sequence parallelism: each rank's rows give a part; summed over
 * the tp ranks, this micro-batch's contribution only (the gradient buffer accumulates). */
static float *pt_norm_dw(pt_model *m, pt_acts *a, float *dw, int k) {
    if (!(m->par.sp && m->par.tp > 1)) return dw;
    float *t = a->dnorm + (size_t)k * m->cfg.dim;
    m->be->zero(m->be, t, (size_t)m->cfg.dim * sizeof(float));
    return t;
}

static void pt_norm_dw_reduce(pt_model *m, pt_acts *a, float *const *dw, int n) {
    if (!(m->par.sp && m->par.tp > 1)) return;
    int C = m->cfg.dim;
    m->par.tp_ops->sum(m->par.tp_ops->ctx, a->dnorm, (size_t)n * C);
    for (int k = 0; k < n; k++) m->be->add(m->be, dw[k], a->dnorm + (size_t)k * C, (size_t)C);
}

/* A norm's backward: dx (R,C) += the input gradient of dxn through the norm of x (R,C), its
 * weight gradient into dw. */
static void pt_norm_backward(pt_model *m, pt_acts *a, float *dw, const float *dxn, const void *x,
                             const float *w, const float *rstd, int R) {
    size_t RC = (size_t)R * m->cfg.dim;
    m->be->rmsnorm_backward(m->be, a->dx, dw, dxn, pt_f32(m, a->sA, x, RC), pt_wvec(m, a, w),
                            rstd, R, m->cfg.dim);
}

/* Whether a split backward leaves a MoE layer's routed experts' weight gradients to its weight
 * part: when their operands stay in the layer's own activations (not under full recomputation,
 * whose are the workspace's) and were not computed where they arrived (expert parallelism). */
static int pt_moe_defers(const pt_model *m, const pt_layer_acts *la) {
    return !m->par.ep_ops && la->re != PT_RECOMPUTE_FULL;
}

/* The backward of a layer's MLP (dense, or the experts) and its norm: a->dx becomes the gradient
 * of the residual after attention. now = 0 keeps the dense weight-gradient operands for later. */
static void pt_mlp_backward(pt_model *m, pt_acts *a, int l, int now) {
    pt_backend *be = m->be;
    int N = a->B * a->T, C = m->cfg.dim, F = m->loc.F, R = pt_res_rows(m, N);
    pt_layer_acts *la = &a->layers[l - a->l0];
    const pt_layer_view *w = &pt_wc(m)->layers[l];
    const pt_layer_view *g = &m->g.layers[l];
    if (la->moe) {
        /* each tp rank's expert slices give a part of the input gradient (the router's, the same
         * on every rank, comes from the first): summed like the dense MLP's */
        const float *dfull = pt_linear_out_grad(m, a, N);
        be->zero(be, a->dxn, (size_t)N * C * sizeof(float));
        pt_moe_backward(m, la->moe, w, g, pt_linear_input(m, a, la->xn2, N), dfull,
                        pt_gop(m, a, dfull, (size_t)N * C), a->dxn, a->B, a->T,
                        !now && pt_moe_defers(m, la));
        pt_tp_reduce(m, a->dxn, N, C);
    } else {
        /* down (row-parallel): dh (N,F) = dx · Wdown as dx's rows are gathered, dWdown (C,F) +=
         * dxᵀ · h; gate/up (column-parallel): dxn2 (N,C) = dgu · Wgu summed over the tp ranks
         * while dWgu (2F,C) += dguᵀ · xn2 */
        pt_linear L = pt_layer_linear(m, l, PT_LIN_DOWN, g);
        pt_linear_row_backward(m, a, &L, la->h, a->dh, N, now ? NULL : la->z_dmlp);
        pt_poll(m);
        be->swiglu_backward(be, a->dgu, a->dh, pt_f32(m, a->sA, la->gu, (size_t)N * 2 * F), N, F);
        L = pt_layer_linear(m, l, PT_LIN_GU, g);
        pt_linear_col_backward(m, a, &L, a->dgu, la->xn2, a->dxn, N, now ? NULL : la->z_dgu);
        pt_poll(m);
        pt_tp_reduce_end(m);
    }
    pt_norm_backward(m, a, pt_norm_dw(m, a, g->mlp_norm, 0), a->dxn, la->xmid, w->mlp_norm,
                     la->rstd2, R);
}

/* The weight pass of a split backward (PT_BWD_WEIGHT): the weight gradients from the operands
 * the input pass kept (a MoE layer's routed experts' unless they ran with its input part:
 * pt_moe_defers). */
static void pt_layer_backward_weight(pt_model *m, pt_acts *a, int l) {
    int N = a->B * a->T;
    pt_layer_acts *la = &a->layers[l - a->l0];
    const pt_layer_view *g = &m->g.layers[l];
    pt_linear L;
    if (la->moe && pt_moe_defers(m, la)) pt_moe_backward_weight(m, la->moe, g);
    if (!la->moe) {
        L = pt_layer_linear(m, l, PT_LIN_DOWN, g);
        pt_linear_weight(m, a, &L, la->z_dmlp, la->h, 0, N);
        L = pt_layer_linear(m, l, PT_LIN_GU, g);
        pt_linear_weight(m, a, &L, la->z_dgu, la->xn2, 1, N);
    }
    L = pt_layer_linear(m, l, PT_LIN_O, g);
    pt_linear_weight(m, a, &L, la->z_datt, la->att, 0, N);
    L = pt_layer_linear(m, l, PT_LIN_QKV, g);
    pt_linear_weight(m, a, &L, la->z_dqkv, la->xn1, 1, N);
}

/* One layer's backward: with part = PT_BWD_INPUT the weight-gradient GEMMs are left for
 * PT_BWD_WEIGHT, their operands kept in the layer's z_* arrays; PT_BWD_ALL does both at once. */
static void pt_layer_backward(pt_model *m, pt_acts *a, int l, int part) {
    if (part == PT_BWD_WEIGHT) {
        pt_layer_backward_weight(m, a, l);
        return;
    }
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    const pt_local_dims *d = &m->loc;
    int N = a->B * a->T, hd = pt_head_dim(c), R = pt_res_rows(m, N);
    int q = d->H * hd, kv = d->KV * hd, qkv = q + 2 * kv;
    pt_layer_acts *la = &a->layers[l - a->l0];
    const pt_layer_view *w = &pt_wc(m)->layers[l];
    const pt_layer_view *g = &m->g.layers[l];
    int now = part == PT_BWD_ALL;
    pt_attn_shape as = pt_attn_shape_for(m, a);
    pt_mlp_backward(m, a, l, now);
    /* o (row-parallel): datt (N,q) = dx · Wo as dx's rows are gathered; dWo (C,q) += dxᵀ · att */
    pt_linear L = pt_layer_linear(m, l, PT_LIN_O, g);
    pt_linear_row_backward(m, a, &L, la->att, a->datt, N, now ? NULL : la->z_datt);
    pt_poll(m);
    be->zero(be, a->dqkv, (size_t)N * qkv * sizeof(float));
    const float *x = pt_f32(m, a->sA, la->qkv, (size_t)N * qkv);
    const float *att = pt_f32(m, a->sB, la->att, (size_t)N * q);
    if (m->par.cp_ops)
        m->par.cp_ops->attn_backward(m->par.cp_ops->ctx, &as, x, att, a->datt, la->lse, a->dqkv, l,
                                     pt_poll_cb, m);
    else
        be->attention_backward(be, &as, x, x + q, x + q + kv, att, a->datt, la->lse, a->dqkv,
                               a->dqkv + q, a->dqkv + q + kv);
    pt_poll(m);
    be->rope(be, a->dqkv, a->d_rows, N, d->H, hd, qkv, m->rope_cos, m->rope_sin, 1);
    be->rope(be, a->dqkv + q, a->d_rows, N, d->KV, hd, qkv, m->rope_cos, m->rope_sin, 1);
    /* q/k/v (column-parallel): dxn1 (N,C) = dqkv · Wqkv, summed over the tp ranks while dWqkv
     * (q+2kv, C) += dqkvᵀ · xn1 (a key/value head held by several ranks gets the sum) */
    L = pt_layer_linear(m, l, PT_LIN_QKV, g);
    pt_linear_col_backward(m, a, &L, a->dqkv, la->xn1, a->dxn, N, now ? NULL : la->z_dqkv);
    pt_tp_reduce_end(m);
    pt_norm_backward(m, a, pt_norm_dw(m, a, g->attn_norm, 1), a->dxn, la->x, w->attn_norm,
                     la->rstd1, R);
    float *norms[2] = {g->mlp_norm, g->attn_norm};
    pt_norm_dw_reduce(m, a, norms, 2);
}

void pt_model_backward(pt_model *m, pt_acts *a, const int32_t *tokens) {
    pt_model_backward_part(m, a, tokens, PT_BWD_ALL);
}

void pt_model_backward_part(pt_model *m, pt_acts *a, const int32_t *tokens, int part) {
    PT_ASSERTF(a->has_targets, "pt_model_backward needs a forward with targets");
    PT_ASSERTF(part == PT_BWD_ALL || a->zb, "a split backward needs activations made with zb");
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    int N = a->B * a->T, C = c->dim, R = pt_res_rows(m, N);
    if (part == PT_BWD_WEIGHT) {
        for (int l = a->l1 - 1; l >= a->l0; l--) {
            double t0 = pt_now();
            pt_layer_backward(m, a, l, part);
            pt_release(m, l + 1, PT_USE_GRADS, 1);
            pt_trace_span("weight gradients", t0, pt_now(), "layer", l, NULL, 0);
        }
        return;
    }
    if (a->last) {
        /* final norm: dx (R,C) = rmsnorm_backward(dxf) on this rank's rows */
        be->zero(be, a->dx, (size_t)R * C * sizeof(float));
        pt_acquire(m, c->n_layers + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
        float *dwf = pt_norm_dw(m, a, m->g.final_norm, 0);
        pt_norm_backward(m, a, dwf, a->dxr, a->xout, pt_wc(m)->final_norm, a->rstdf, R);
        pt_norm_dw_reduce(m, a, &m->g.final_norm, 1);
        pt_release(m, c->n_layers + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
    } /* else: the gradient of the chunk's output is in a->dx already */
    for (int l = a->l1 - 1; l >= a->l0; l--) {
        double t0 = pt_now();
        pt_acquire(m, l + 1, PT_USE_PARAMS | PT_USE_GRADS, 1);
        pt_layer_recompute(m, a, l);
        pt_layer_backward(m, a, l, part);
        pt_release(m, l + 1, part == PT_BWD_ALL ? PT_USE_PARAMS | PT_USE_GRADS : PT_USE_PARAMS, 1);
        pt_trace_span(part == PT_BWD_ALL ? "backward" : "input gradients", t0, pt_now(), "layer", l,
                      NULL, 0);
    }
    if (!a->first) return; /* a->dx: the gradient of the chunk's input */
    pt_acquire(m, 0, PT_USE_GRADS, 1);
    const float *dfull = pt_linear_out_grad(m, a, N);
    be->embedding_backward(be, m->g.embed, tokens, dfull, N, C, m->loc.v0, m->loc.V);
    pt_release(m, 0, PT_USE_GRADS, 1);
}

void pt_model_logits(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *pos,
                     float *host_logits) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    PT_ASSERTF(m->par.tp == 1, "pt_model_logits runs on an unsplit model (tp = 1)");
    int N = a->B * a->T, C = c->dim, V = c->vocab_size;
    pt_forward_trunk(m, a, tokens, pos);
    a->has_targets = 0;
    pt_release(m, c->n_layers + 1, PT_USE_PARAMS, 0);
    pt_acquire(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
    for (int r0 = 0; r0 < N; r0 += a->head_rows) {
        int n = N - r0 < a->head_rows ? N - r0 : a->head_rows;
        pt_linear L = pt_head_linear(m);
        pt_linear_fwd(m, &L, pt_at(m, a->xf, (size_t)r0 * C), a->logits, n, 0.0f);
        be->download(be, host_logits + (size_t)r0 * V, a->logits, (size_t)n * V * sizeof(float));
    }
    pt_release(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
}

pt_status pt_model_decode(pt_model *m, pt_acts *a, pt_kv_cache *kv, const int32_t *tokens, int T,
                          float *host_logits) {
    pt_backend *be = m->be;
    const pt_model_config *c = &m->cfg;
    PT_ASSERTF(m->par.tp == 1 && !m->par.cp_ops && !m->par.ep_ops && a->first && a->last,
               "pt_model_decode runs on an unsplit model");
    PT_ASSERTF(T >= 1 && T <= a->cap_T && a->cap_B == 1, "activations for (1,%d) cannot decode %d rows",
               a->cap_T, T);
    if (kv->len + T > kv->max_len)
        return pt_errorf(PT_ERR_CONFIG, "the context would hold %d tokens, more than the %d of the "
                         "key/value cache (model.max_seq_len)", kv->len + T, kv->max_len);
    int C = c->dim, V = c->vocab_size;
    pt_acts_set_shape(a, 1, T);
    a->kv = kv;
    pt_forward_trunk(m, a, tokens, kv->d_pos + kv->len);
    a->kv = NULL;
    a->has_targets = 0;
    kv->len += T;
    /* the head on the last row only: logits (1,V) = xf[T-1] (1,C) · Headᵀ */
    pt_release(m, c->n_layers + 1, PT_USE_PARAMS, 0);
    pt_acquire(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
    pt_linear L = pt_head_linear(m);
    pt_linear_fwd(m, &L, pt_at(m, a->xf, (size_t)(T - 1) * C), a->logits, 1, 0.0f);
    be->download(be, host_logits, a->logits, (size_t)V * sizeof(float));
    pt_release(m, pt_model_head_unit(m), PT_USE_PARAMS, 0);
    return PT_OK;
}

double pt_model_flops_per_token(const pt_model_config *c, int T) {
    /* 6 FLOPs per parameter per token for the matrices (2 forward, 4 backward), plus attention as
     * the kernel executes it: causal, so half of the T×T scores; QKᵀ and PV are 2·T·hd each
     * forward per head, the backward 2x the forward. Embedding lookups are not FLOPs. */
    int hd = pt_head_dim(c);
    double q = (double)c->n_heads * hd, kv = (double)c->n_kv_heads * hd;
    double attn_mats = (double)c->dim * (q + 2 * kv) + q * c->dim, matrices = 0;
    for (int l = 0; l < c->n_layers; l++)
        matrices += attn_mats + (pt_layer_is_moe(c, l)
                                     ? (double)c->dim * c->n_experts + 3.0 * c->dim * c->moe_ffn_dim *
                                                                         (c->top_k + c->n_shared_experts)
                                     : 3.0 * c->dim * c->ffn_dim); /* active parameters */
    matrices += (double)c->vocab_size * c->dim;
    double attn = c->n_layers * c->n_heads * (2.0 * 2.0 * hd * (T / 2.0));
    return 6.0 * matrices + 3.0 * attn;
}
