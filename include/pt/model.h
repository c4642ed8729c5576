/* model.h: the Llama-style decoder, its parameter table, and its explicit forward and backward.
 *
 * Parameters, gradients (and, in optim.h, the optimizer moments) each live in one contiguous buffer
 * described by one table (pt_param_table). Every other module (checkpoints, the optimizer, ZeRO
 * sharding, tensor/pipeline/expert splitting) reads the table; none keys behaviour off tensor
 * indices. The table's names are Hugging Face LlamaForCausalLM names.
 *
 * Within a layer the tensors are laid out so that q, k and v are adjacent (one fused (q+2kv, C)
 * projection GEMM), their biases too (one (q+2kv) vector, after v), and gate and up are adjacent
 * (one fused (2F, C) GEMM).
 */
#ifndef PT_MODEL_H
#define PT_MODEL_H

#include "pt/backend.h"
#include "pt/core.h"
#include "pt/parallel_ops.h"

typedef struct {
    int vocab_size;
    int dim;
    int n_layers;
    int n_heads;
    int n_kv_heads;
    int ffn_dim;
    int max_seq_len;
    float rope_theta;
    int head_dim;                   /* per attention head (0: dim / n_heads) */
    /* Llama 3.1's rope scaling (Hugging Face rope_scaling of rope_type "llama3"): factor > 0
     * divides the frequencies whose wavelength exceeds original_max / low_freq_factor by factor,
     * keeps those below original_max / high_freq_factor, and blends in between (0: none) */
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_seq_len;
    float norm_eps;
    int tied_embeddings;
    /* attention biases: q, k, v and o (Llama's attention_bias), or q, k and v only (Qwen 2) */
    int attention_bias, qkv_bias;
    float init_std;
    /* Mixture of experts (n_experts = 0: every layer dense). Layer l is MoE when l ≥
     * moe_first_dense and (l − moe_first_dense) is a multiple of moe_every. */
    int n_experts, top_k, moe_ffn_dim, moe_every, moe_first_dense, n_shared_experts;
    float aux_loss_coef, z_loss_coef;
    float capacity_factor; /* > 0: an expert takes at most ⌈factor·N·top_k/E⌉ token-slots of a
                            * micro-batch of N tokens, in token order; the rest are dropped */
    int router_sigmoid;    /* DeepSeek-V3: sigmoid scores, chosen by score + bias, weights the
                            * chosen scores renormalised (else Mixtral's softmax) */
    float bias_rate;       /* auxiliary-loss-free balancing: after each step every expert's bias
                            * moves by rate toward balance (0 = off; sigmoid router) */
    int aux_scope;         /* pt_aux_scope: the tokens the balancing loss's f and P are over */
} pt_model_config;

/* The balancing loss's scope (model.aux_loss_scope; docs/parallelism.md): f and P per sequence;
 * per micro-batch (Switch); or global: P over the step's tokens, f the previous step's
 * token-slot shares over the whole global batch (pt_model_aux_f_update; uniform at the first). */
typedef enum { PT_AUX_SEQUENCE = 0, PT_AUX_MICRO_BATCH, PT_AUX_GLOBAL } pt_aux_scope;

/* The width of an attention head: model.head_dim, or dim / n_heads when it is 0. */
static inline int pt_model_head_dim(const pt_model_config *c) {
    return c->head_dim > 0 ? c->head_dim : c->dim / c->n_heads;
}

/* Whether the attention has q/k/v biases; an o bias. */
static inline int pt_model_qkv_bias(const pt_model_config *c) {
    return c->attention_bias || c->qkv_bias;
}
static inline int pt_model_o_bias(const pt_model_config *c) { return c->attention_bias; }

/* Whether layer l of c is a mixture-of-experts layer. */
static inline int pt_layer_is_moe(const pt_model_config *c, int l) {
    return c->n_experts > 0 && l >= c->moe_first_dense &&
           (l - c->moe_first_dense) % (c->moe_every > 0 ? c->moe_every : 1) == 0;
}

/* How tensor parallelism splits a tensor (used from the tensor-parallel issue on). */
typedef enum {
    PT_TP_REPLICATED = 0, /* every tp rank holds all of it (norm weights) */
    PT_TP_COLUMN,         /* split along dim 0, the output features (q, k, v, gate, up) */
    PT_TP_ROW,            /* split along dim 1, the input features (o, down) */
    PT_TP_VOCAB,          /* split along dim 0 = vocabulary (embedding, head) */
} pt_tp_split;

/* Where pipeline parallelism puts a tensor. */
typedef enum {
    PT_PP_LAYER = 0, /* on the stage that owns `layer` */
    PT_PP_FIRST,     /* on the first stage (embedding) */
    PT_PP_LAST,      /* on the last stage (final norm, head) */
} pt_pp_place;

typedef enum {
    PT_KIND_EMBED = 0,
    PT_KIND_ATTN_NORM,
    PT_KIND_WQ,
    PT_KIND_WK,
    PT_KIND_WV,
    PT_KIND_WO,
    PT_KIND_MLP_NORM,
    PT_KIND_WGATE,
    PT_KIND_WUP,
    PT_KIND_WDOWN,
    PT_KIND_FINAL_NORM,
    PT_KIND_HEAD,
    PT_KIND_ROUTER,    /* MoE: the gate (E, C) */
    PT_KIND_ROUTER_BIAS, /* MoE, sigmoid router: the selection bias (E), not trained by gradient */
    PT_KIND_EXPERT_W1, /* MoE: expert gate projection (F_e, C); w1, w3, w2 adjacent per expert */
    PT_KIND_EXPERT_W3, /* MoE: expert up projection (F_e, C) */
    PT_KIND_EXPERT_W2, /* MoE: expert down projection (C, F_e) */
    PT_KIND_BQ,        /* attention biases: q, k, v adjacent (one fused (q+2kv) vector)... */
    PT_KIND_BK,
    PT_KIND_BV,
    PT_KIND_BO,        /* ...and o's (C), added once after the tp sum */
    PT_KIND_COUNT
} pt_param_kind;

typedef struct {
    char name[96];       /* Hugging Face name, e.g. "model.layers.3.self_attn.q_proj.weight" */
    pt_param_kind kind;
    int ndim;
    int64_t shape[2];
    int layer;           /* -1 for tensors outside the layers */
    int decay;           /* 1 if weight decay applies (matrices), 0 for norm weights */
    pt_tp_split tp;
    pt_pp_place pp;
    int expert;          /* -1 (dense); the MoE issue adds expert tensors */
    int unit;            /* 0 embedding, 1 + layer, L + 1 final norm, L + 2 head (pt_model_hooks) */
    size_t offset;       /* in elements, into the parameter buffer */
    size_t numel;
    /* Where this (tensor-parallel: local) block sits in the global tensor: rows [grow0, grow0 +
     * grows) and columns [gcol0, gcol0 + shape[1]) of a (gshape) tensor at goffset in the
     * single-process table. grows < shape[0] when the block's last rows are vocabulary padding.
     * owner: this rank writes the block (replicas: only the first). All trivial at tp = 1. */
    int64_t gshape[2], grow0, gcol0, grows;
    size_t goffset;
    int gindex; /* the tensor's index in the single-process table */
    int owner;
} pt_param;

typedef struct {
    pt_param *p;
    int n;
    size_t total; /* elements */
} pt_param_table;

/* Pipeline parallelism: a chunk is a run of layers [l0, l1) one rank computes; the chunk with
 * l0 = 0 also holds the embedding, the one with l1 = n_layers the final norm, head and loss. */
typedef struct {
    int l0, l1;
} pt_chunk;
enum { PT_MAX_CHUNKS = 16 };

/* The layout as the model sees it: numbers (what this rank holds) and the parallel operations it
 * calls (parallel_ops.h), each table NULL at degree 1. Made by src/parallel/layout.c. */
typedef struct {
    int n_chunks;     /* 0: the whole model */
    pt_chunk chunk[PT_MAX_CHUNKS];
    int tp, tp_rank;  /* degree and this rank's index (1, 0: none) */
    int sp;           /* sequence parallelism: the residual stream is split over the tp ranks */
    int cp;           /* context parallelism: each sequence split over cp ranks (1: none) */
    int ep, ep_rank;  /* expert parallelism: each MoE layer's experts spread over ep ranks */
    /* ZeRO over a data group that contains the ep group (its size; 0: none): the experts start
     * at a multiple of it, so that each region shards evenly, and the dense tensors are no ep
     * replicas (each data rank owns a slice of them) */
    int ep_zero_group;
    const pt_tp_ops *tp_ops; /* tensor (and sequence) parallelism */
    const pt_cp_ops *cp_ops; /* context parallelism */
    const pt_ep_ops *ep_ops; /* expert parallelism */
    /* The head and loss split over the pipeline ranks (parallel.pp_head = split): this rank holds
     * the head's global vocabulary rows [head_v0, head_v0 + head_valid) in head_V rows (padding
     * zero) on every stage, and computes their part of each micro-batch's loss from the last
     * stage's final-norm output (pt_model_head); head_ops combines the loss's row statistics
     * over the pp × tp ranks. 0 / NULL: the last stage's head, split over tp like the embedding. */
    int head_split, head_V, head_v0, head_valid;
    const pt_tp_ops *head_ops;
} pt_model_parallel;

/* The per-rank sizes under tensor parallelism: query heads, key/value heads (a replicated one
 * when tp > n_kv_heads), ffn, vocabulary rows (padded to tp·V) and the first global vocabulary
 * row and number of real ones. */
typedef struct {
    int H, KV, F, V, v0, v_valid;
    int Fe;        /* each expert's SwiGLU width on this rank (moe_ffn_dim / tp) */
    int kv_head0;  /* first global key/value head of this rank */
    int kv_shared; /* > 1: that many ranks hold the same key/value head */
} pt_local_dims;

/* Checks that tp can split the config (heads, key/value heads, ffn). */
pt_status pt_model_check_tp(const pt_model_config *c, int tp);
pt_local_dims pt_model_local_dims(const pt_model_config *c, int tp, int tp_rank);
/* Builds the table for a config (caller frees with pt_param_table_free). */
void pt_param_table_build(pt_param_table *t, const pt_model_config *c);
/* The table of one rank of a layout (par NULL: the same as above): its tensor-parallel blocks,
 * the tensors of its pipeline chunks only, its experts only (expert parallelism; they then come
 * after all the other tensors, which the first rank of the expert group owns). */
void pt_param_table_build_local(pt_param_table *t, const pt_model_config *c,
                                const pt_model_parallel *par);
/* Copies each local block from a host array of the global table (single-process layout) into a
 * host array of the local table (padding rows zero); and back, each owned block into its place
 * in the global array (others untouched). */
void pt_param_table_to_local(const pt_param_table *t, const float *global, float *local);
void pt_param_table_to_global(const pt_param_table *t, const float *local, float *global);
/* A block of a global tensor: rows [r0, r1), columns [c0, c1) (a vector is one column), whose
 * elements sit contiguously in the local table from offset lo. */
typedef struct {
    int tensor;
    int64_t r0, r1, c0, c1;
    size_t lo;
} pt_block;
/* The blocks that elements [lo, hi) of the local table hold (at most 3 per tensor: a partial
 * row, whole rows, a partial row), padding rows left out; only owned tensors with owned_only.
 * Returns the count written to out (room for 3 · t->n). */
int pt_param_table_blocks(const pt_param_table *t, size_t lo, size_t hi, int owned_only,
                          pt_block *out);
void pt_param_table_free(pt_param_table *t);
/* The most layers a model may have: far beyond the deepest trained models (a few hundred), and a
 * bound on what sizing a model costs before anything runs (the pipeline's balanced split is
 * quadratic in the layers). */
enum { PT_MODEL_MAX_LAYERS = 4096 };
/* Checks a config's values; PT_ERR_CONFIG naming the key otherwise. */
pt_status pt_model_config_check(const pt_model_config *c);
/* The model as `pentatron train` builds it and `pentatron plan` sizes it, for sequences of seq_len
 * tokens: model.moe_ffn_dim 0 made ffn_dim, pt_model_config_check, seq_len within max_seq_len.
 * Both call it before sizing anything, so that they take the same models with the same messages. */
pt_status pt_model_config_settle(pt_model_config *c, int seq_len);

/* Pointers into one of the buffers (params or grads) for one layer. */
typedef struct {
    float *attn_norm; /* (C) */
    float *wqkv;      /* (q_dim + 2·kv_dim, C): q_proj, k_proj, v_proj stacked */
    float *wo;        /* (C, q_dim) */
    float *bqkv;      /* (q_dim + 2·kv_dim) the biases of q, k, v (NULL: none) */
    float *bo;        /* (C) o's bias (NULL: none) */
    float *mlp_norm;  /* (C) */
    float *wgu;       /* (2F, C): gate_proj, up_proj stacked; MoE: the shared experts' (or NULL) */
    float *wdown;     /* (C, F); MoE: the shared experts' */
    float *router;    /* MoE: (E, C) */
    float *router_bias; /* MoE, sigmoid router: (E) */
    float *experts;   /* MoE: expert e's w1, w3 (2F_e, C) then w2 (C, F_e) at e · 3·F_e·C */
} pt_layer_view;

typedef struct {
    float *embed;      /* (V, C) */
    float *final_norm; /* (C) */
    float *head;       /* (V, C); == embed when tied */
    pt_layer_view *layers;
} pt_model_view;

/* Activations of one micro-batch (B, T), held from its forward to its backward. Sized once. */
typedef struct pt_acts pt_acts;

/* Activation recomputation (training.recompute): what a layer keeps from its forward for its
 * backward, the rest being computed again in backward from what it kept.
 *   NONE       everything (the layer input, both norms' outputs and statistics, q/k/v, the
 *              attention's output and log-sum-exp, the residual after attention, gate/up, h);
 *   SELECTIVE  all but the attention core (its output and log-sum-exp, recomputed from q/k/v)
 *              and the SwiGLU activation h (recomputed from gate/up); under context parallelism
 *              the attention's output is kept (recomputing it would run the ring again);
 *   FULL       the layer input only; backward first runs the layer's forward again (its
 *              communication too: tp's gathers and reductions, cp's ring, ep's dispatch and
 *              combine).
 * Under a split backward (zero bubble) the weight gradients' operands (xn1, att, xn2, h) stay
 * from the input pass to the weight pass. What a layer does not keep lives in one workspace of
 * the model, shared by every layer and micro-batch (one layer is recomputed at a time).
 * Recomputation is exact: the same kernels on the same inputs, bit for bit. */
typedef enum { PT_RECOMPUTE_NONE = 0, PT_RECOMPUTE_SELECTIVE, PT_RECOMPUTE_FULL } pt_recompute;

/* Units are what the model tells its owner about as it runs: unit 0 is the embedding, unit l + 1
 * layer l, unit L + 1 the final norm, unit L + 2 the head (empty when tied: the head is then
 * unit 0). A unit's tensors are contiguous in the table. Before the model reads a unit's
 * parameters or writes its gradients in a pass it calls acquire; after their last use in the
 * pass, release. Released gradients are final for this micro-batch. Data parallelism hangs its
 * gradient buckets (release of gradients), ZeRO-2 its per-bucket gradient buffers (acquire of
 * gradients) and ZeRO-3 its parameter gathers (acquire and release of parameters) on these calls.
 * The order with targets:
 *   forward   P of 0, 1, ..., L (each layer released after it), L + 1 (kept for its backward),
 *             then P and G of the head, released at once (the fused loss is the head's backward;
 *             tied, the embedding's gradient stays acquired until the end of backward);
 *   backward  G of L + 1, released with its P; P and G of L, ..., 1; G of 0.
 * An evaluation forward (pt_model_eval_loss) is the forward without gradients: P of 0, ..., L + 1
 * as above, then P of the head with backward = PT_PASS_EVAL (no backward follows: nothing is to
 * be fetched ahead), and every unit still held (the head, the final norm) released after it. */
enum { PT_USE_PARAMS = 1, PT_USE_GRADS = 2 };
enum { PT_PASS_EVAL = 2 }; /* the `backward` argument of the hooks for an evaluation's head */
typedef struct {
    void (*acquire)(void *user, int unit, int use, int backward);
    void (*release)(void *user, int unit, int use, int backward);
    /* between the big operations of a layer: lets pending communication progress (MPI moves
     * data of nonblocking collectives only inside its calls) */
    void (*poll)(void *user);
    void *user;
} pt_model_hooks;

/* What pt_model_init_ex does not allocate, because the owner of the model provides it (ZeRO):
 * the fp32 parameters (a bf16 model's masters, sharded by ZeRO-1/2/3), the gradients (ZeRO-2/3),
 * a bf16 model's bf16 copy (ZeRO-3 gathers it unit by unit). */
enum { PT_MODEL_NO_PARAMS = 1, PT_MODEL_NO_GRADS = 2, PT_MODEL_NO_PARAMS16 = 4 };

typedef struct {
    pt_model_config cfg;
    pt_backend *be;
    pt_param_table table;  /* this rank's tensors (tensor parallelism: its blocks) */
    pt_param_table gtable; /* the single-process table: what checkpoints and exports describe */
    pt_model_parallel par;
    pt_local_dims loc;
    float *params; /* (alloc_total) device memory; the table's tensors, then zero padding */
    float *grads;  /* (alloc_total) device memory, accumulated by backward */
    size_t alloc_total; /* >= table.total: data parallelism pads for even shards */
    int flags;          /* the PT_MODEL_NO_* of pt_model_init_ex */
    pt_model_view w, g;
    float *rope_cos, *rope_sin; /* (max_seq_len, head_dim/2) device memory */
    pt_model_hooks hooks;
    /* mixture of experts: the balancing losses' weight (1 / sequences of the global batch, set by
     * the trainer) */
    double aux_scale;
    /* the global balancing scope: the f this step's loss uses, and this rank's token-slots
     * chosen (before any capacity drop) per layer and expert since pt_model_aux_counts_clear,
     * both (n_layers, n_experts) */
    double *aux_f, *aux_count;
    int recompute, recompute_layers; /* pt_recompute, pt_model_set_recompute */
    /* mixed precision (pt_model_set_precision, docs/precision.md): with PT_PREC_BF16 the model
     * computes with w16, a bf16 copy of params (its pointers address pt_bf16 elements), and stores
     * its activations in bf16; act_size is an activation element's bytes (4 or 2) */
    int prec, act_size;
    pt_bf16 *params16; /* (alloc_total) device memory, bf16 */
    pt_model_view w16;
    struct pt_model_ws *ws;          /* the recomputation workspace (llama.c), NULL when none */
    struct pt_model_scratch *scr;    /* the backward's scratch, one per rank (llama.c) */
} pt_model;

pt_status pt_model_init(pt_model *m, const pt_model_config *cfg, pt_backend *be);
/* The same, with the buffers padded with zeros to at least alloc_total elements, leaving out the
 * buffers named in flags (their views are then set with pt_model_point). */
pt_status pt_model_init_ex(pt_model *m, const pt_model_config *cfg, pt_backend *be,
                           size_t alloc_total, int flags, const pt_model_parallel *par);
void pt_model_free(pt_model *m);
/* Sets the mode for activations created from now on; with FULL, layers > 0 recomputes only the
 * first `layers` layers of each chunk (Megatron's recompute_num_layers; 0: all). */
void pt_model_set_recompute(pt_model *m, pt_recompute mode, int layers);
/* Mixed precision: PT_PREC_FP32 computes and stores in fp32; PT_PREC_BF16 keeps params (and
 * grads) fp32 and computes with a bf16 copy of params, storing activations in bf16 (the rules:
 * docs/precision.md). Set before the first activations are made; PT_ERR_CONFIG for what bf16
 * does not support yet. pt_model_sync_weights refreshes the bf16 copy from params: call it after
 * anything writes params (initialisation, loading, an optimizer step); without params (the fp32
 * masters sharded by the data-parallel module, which writes the bf16 copy itself) it does
 * nothing. */
typedef enum { PT_PREC_FP32 = 0, PT_PREC_BF16 } pt_precision;
pt_status pt_model_set_precision(pt_model *m, pt_precision prec);
void pt_model_sync_weights(pt_model *m);
/* The activation bytes pt_acts_create_chunk(m, B, T, k, zb) allocates, counted by the same
 * layout without allocating (m's configuration, split, chunks, precision and recompute mode are
 * read; its buffers, backend and parallel tables are not, so a planner may pass a model that
 * holds nothing): returns one set's (its layers' kept arrays, their MoE buffers, its own arrays);
 * *ws the recomputation workspace's, *scratch the backward's scratch (both once per rank).
 * ep_bytes: what an expert-parallel exchange adds to each MoE layer's buffers (its module sizes
 * those; 0 without expert parallelism). */
size_t pt_acts_count(const pt_model *m, int B, int T, int k, int zb, size_t ep_bytes, size_t *ws,
                     size_t *scratch);
/* Bytes of the model's recomputation workspace (0 when nothing is recomputed) and of its
 * backward's scratch (what no micro-batch keeps from its forward to its backward: one per rank,
 * shared by every activation set, made with the first). */
size_t pt_model_workspace_bytes(const pt_model *m);
/* Points the view of one unit's parameters (use = PT_USE_PARAMS) or gradients at buf, which holds
 * the table's elements [buf_lo, buf_hi): the unit's tensors that start there (buf = NULL clears
 * them). */
void pt_model_point(pt_model *m, int unit, int use, float *buf, size_t buf_lo, size_t buf_hi);
/* The same for the bf16 parameters a bf16 model computes with (ZeRO-3 gathers them). */
void pt_model_point16(pt_model *m, int unit, pt_bf16 *buf, size_t buf_lo, size_t buf_hi);
static inline int pt_model_n_units(const pt_model *m) { return m->cfg.n_layers + 3; }
static inline int pt_model_head_unit(const pt_model *m) {
    return m->cfg.tied_embeddings ? 0 : m->cfg.n_layers + 2;
}
/* The global balancing scope (PT_AUX_GLOBAL) between steps: clear the counts before a step's
 * first forward; after its last backward, with aux_count summed over every rank's tokens of the
 * step (pt_layout_sum_counts), make them the next step's f (each MoE layer's shares). */
void pt_model_aux_counts_clear(pt_model *m);
void pt_model_aux_f_update(pt_model *m);
/* Hugging Face's initialisation into a host array of the global table (gtable.total elements):
 * matrices ~ N(0, init_std), norm weights 1, a router's bias 0. Deterministic. */
void pt_model_init_weights_host(const pt_model *m, uint64_t seed, float *host);
void pt_model_zero_grads(pt_model *m);

/* Activations of the model's first chunk (the whole model without pipeline parallelism). */
pt_acts *pt_acts_create(const pt_model *m, int B, int T);
/* Activations of chunk k of m->par; zb: also room to defer the weight gradients (zero bubble). */
pt_acts *pt_acts_create_chunk(const pt_model *m, int B, int T, int k, int zb);
/* A chunk that does not start the model takes its input (R, C) here (R: the residual rows; the
 * model's activation elements, m->act_size bytes each); one that does not end it leaves its output
 * here after forward... */
void *pt_acts_input(pt_acts *a);
void *pt_acts_output(pt_acts *a);
/* ...and takes the gradient of its output here before backward, leaving the gradient of its
 * input here after it. */
float *pt_acts_grad(pt_acts *a);
void pt_acts_free(const pt_model *m, pt_acts *a);
size_t pt_acts_bytes(const pt_acts *a);
/* Documents (block-causal attention, data.document_mask): doc_start (B·T, device memory, the
 * caller's, read at each forward until set again; NULL: none) holds for every row the position
 * where its document starts, and the forwards on `a` from now on let a query see only the keys
 * of its document (doc_start ≤ key position ≤ its position; its backward and any recomputation
 * use the same). restart: rope positions count from the document's start (position −
 * doc_start) rather than the sequence's. */
void pt_acts_set_documents(pt_acts *a, const int32_t *doc_start, int restart);
/* What training forwards measure of their mixture-of-experts layers, summed into the caller's
 * struct: the balancing losses (objective units), each layer's token-slots per expert
 * (expert_load: (n_layers, n_experts), the caller's array), the rows expert parallelism sent to
 * and received from other ranks. */
typedef struct {
    double aux_loss, z_loss;
    double *expert_load;
    int64_t a2a_sent, a2a_recv;
} pt_moe_stats;
/* The training forwards (pt_model_forward) on `a` from now on add their MoE statistics to stats
 * (NULL: nowhere); evaluation forwards and recomputation in backward never count. */
void pt_acts_set_stats(pt_acts *a, pt_moe_stats *stats);
/* Reuses activations for a smaller (B, T) (B·T and T within what they were sized for). */
void pt_acts_set_shape(pt_acts *a, int B, int T);

/* Forward over B×T tokens (device memory, positions pos (T)). With targets (device memory, -1 =
 * ignored) it also computes the loss and, fused with it, the head's backward: the gradient of
 * loss_scale · Σ token losses. Returns Σ token losses (double) and the count of valid targets. */
double pt_model_forward(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *targets,
                        const int32_t *pos, float loss_scale, int64_t *n_valid);
/* Forward with the loss only (evaluation): Σ token losses of the chunk that ends the model (0
 * on another: its output is in pt_acts_output), n_valid the count of valid targets; no gradient
 * is written and the hooks see no gradient use. The same numbers as pt_model_forward's loss. */
double pt_model_eval_loss(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *targets,
                          const int32_t *pos, int64_t *n_valid);
/* Backward of the last forward with targets on `a` (which must follow it): accumulates into
 * the gradients. */
void pt_model_backward(pt_model *m, pt_acts *a, const int32_t *tokens);
/* The backward in two halves (zero-bubble schedules): PT_BWD_INPUT computes the gradient of the
 * chunk's input and keeps what the weight gradients need; PT_BWD_WEIGHT then computes those. */
enum { PT_BWD_ALL = 0, PT_BWD_INPUT, PT_BWD_WEIGHT };
void pt_model_backward_part(pt_model *m, pt_acts *a, const int32_t *tokens, int part);
/* The head split over the pipeline ranks (par.head_split): a rank's head of one micro-batch of N
 * rows, in a workspace made once (its logits chunk; on a rank without the last stage also room
 * for xf and this rank's part of its gradient, pt_head_ws_xf / _dxf). xf (N, C): the final
 * norm's output (activation elements; pt_acts_xf of the last chunk's activations there); dxf
 * (R, C): this rank's part of xf's gradient (R: the residual rows, summed over the tp ranks like
 * the unsplit head's), which the pipeline sums over the pp ranks into the last chunk's
 * pt_acts_dxf before its backward. Returns Σ token losses (every rank computes all N rows' losses
 * from the combined statistics); eval: no gradient, the hooks see an evaluation. */
typedef struct pt_head_ws pt_head_ws;
pt_head_ws *pt_head_ws_create(const pt_model *m, int N, int io);
void pt_head_ws_free(const pt_model *m, pt_head_ws *w);
void *pt_head_ws_xf(pt_head_ws *w);
float *pt_head_ws_dxf(pt_head_ws *w);
size_t pt_head_ws_bytes(const pt_head_ws *w);
void *pt_acts_xf(pt_acts *a);
float *pt_acts_dxf(pt_acts *a);
double pt_model_head(pt_model *m, pt_head_ws *w, const void *xf, float *dxf, const int32_t *targets,
                     int N, float loss_scale, int eval);

/* Logits (B, T, V) on the host, for generation and tests. */
void pt_model_logits(pt_model *m, pt_acts *a, const int32_t *tokens, const int32_t *pos,
                     float *host_logits);

/* Decoding with a key/value cache (src/model/generate.c): per layer, the rotated keys and the
 * values of every position so far, in fp32 (a bf16 model's values are bf16 numbers, as its
 * attention reads them), in one block of device memory sized once for max_len positions. */
typedef struct {
    int n_layers, max_len;
    int width;      /* floats per position and layer: n_kv_heads·head_dim keys, then the values */
    int len;        /* positions held: 0, ..., len − 1 */
    float *kv;      /* (n_layers, max_len, width) device memory */
    int32_t *d_pos; /* (max_len) device memory: 0, 1, ..., max_len − 1 */
} pt_kv_cache;
/* A cache for an unsplit model, max_len ≤ model.max_seq_len (0: max_seq_len). */
pt_status pt_kv_cache_init(pt_kv_cache *kv, const pt_model *m, int max_len);
void pt_kv_cache_free(pt_kv_cache *kv, const pt_model *m);
/* Forward of T new tokens (device memory) at positions kv->len, ..., kv->len + T − 1 of one
 * sequence: their keys and values appended to the cache (kv->len += T), their queries attending
 * to every cached position, and the logits (V) of the last one to host_logits; the prompt is one
 * call (prefill), each generated token one more. a: activations made for (1, ≥ T) (a mixture of
 * experts computes all the rows they were made for: make them for T). The same function as the
 * forward over the whole sequence, to rounding (the attention of one query reads the keys in a
 * different grouping). PT_ERR_CONFIG, the cache unchanged, when kv->len + T > kv->max_len: the
 * context never slides. */
pt_status pt_model_decode(pt_model *m, pt_acts *a, pt_kv_cache *kv, const int32_t *tokens, int T,
                          float *host_logits);

/* Continuing a prompt (host tokens) by an unsplit model: greedy (temperature 0) or sampling
 * from softmax(logits / temperature) over the top_k most likely (0: all). */
typedef struct {
    float temperature;
    int top_k;
    uint64_t seed;
    int no_cache;  /* 1: every token from a forward over the whole context (the check of the cache) */
    float *logits; /* NULL, or host (n_new, V): the logits each new token was chosen from */
} pt_gen_options;
typedef struct {
    int n_new;                  /* tokens generated */
    int n_steps;                /* forwards after the first (one per token after the first) */
    double prefill_s, decode_s; /* the first forward (the prompt), and the others */
} pt_gen_stats;
/* Appends n_new tokens to out. The context (prompt and generated tokens) never exceeds
 * model.max_seq_len: PT_ERR_CONFIG when n_prompt + n_new does (the caller trims n_new; nothing
 * slides). A mixture of experts generates dropless (model.capacity_factor is set aside: it makes
 * a token's experts depend on the other tokens of its forward). stats may be NULL. */
pt_status pt_generate(pt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n_new,
                      const pt_gen_options *o, pt_gen_stats *stats);

/* Model FLOPs per token (forward + backward = 6Ψ + attention as executed, causal halved). */
double pt_model_flops_per_token(const pt_model_config *c, int T);
/* The rotary frequency of the head dimensions' pair i (fp32, as Hugging Face computes it; Llama
 * 3's rope scaling applied when c->rope_factor > 0). */
float pt_rope_inv_freq(const pt_model_config *c, int i);

#endif
