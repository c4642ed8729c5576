/* plan.c: `pentatron plan`'s model: per-rank memory and step time of a model × cluster × layout,
 * from first principles. docs/plan.md writes out every formula below with its source; the
 * comments here name the quantities.
 *
 * Notation (per rank, one micro-batch): b sequences of s tokens, N = b·s/cp tokens on the rank,
 * R = N/tp rows of the residual stream with sequence parallelism (N without), C the width, q and
 * kv the rank's query and key/value widths, F its MLP width, V its vocabulary rows, E the bytes of
 * an activation element (4 in fp32, 2 in bf16).
 *
 * Memory is pentatron's own allocation, written as formulas of the configuration (not read from
 * the trainer): parameters, gradients and AdamW moments by ZeRO stage; ZeRO's bucket buffers; the
 * activation sets the schedule holds at once (counted from the schedule's action lists) times a
 * set's bytes, plus the recomputation workspace and the ring's buffers. The GPT block's
 * activations are Korthikanti et al.'s Table 2 (what Megatron-LM keeps).
 *
 * Time: each GEMM at the hardware's measured rate for its shape (hardware.gemm_shapes,
 * interpolated) or at gemm_efficiency × peak capped by the roofline of its bytes; memory-bound
 * work (norms, activations, softmax, the optimizer) as bytes / memory_bw; each collective by the
 * α–β model with the bus factors of nccl-tests, over the links its group uses (hierarchical when
 * a group spans nodes with more than one of its ranks per node); what the implementation hides
 * behind compute subtracted per dimension; the pipeline's bubble from schedule.c's simulation of
 * the step with these costs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/layout.h"
#include "pt/model.h"
#include "pt/pipeline.h"
#include "pt/plan.h"

/* ------------------------------------------------------------------------------------------ */
/* the model's shape */

typedef struct {
    int gpt, flash, tp_overlap; /* tp_overlap: 2 all, 1 backward, 0 none */
    int eager, sac_op;          /* plan.kernels = eager, plan.selective = op */
    int dp_overlap, pp_overlap, pp_scatter;
    int bf16;
    double E;                   /* bytes of an activation element */
    /* global dimensions */
    double C, H, KV, hd, F, Vg, L, Ex, k, Fe, Fs, s, b;
    int moe_every, moe_first, n_layers, n_experts, tied, qkv_bias, attn_bias;
    pt_model_config cfg; /* the model (a GPT block: multi-head, n_kv_heads = n_heads) */
} pt_plan_model;

/* Whether layer l is a mixture-of-experts layer: the model's own rule. */
static int pt_plan_is_moe(const pt_config *c, int l) { return pt_layer_is_moe(&c->model, l); }

/* ------------------------------------------------------------------------------------------ */
/* the local dimensions of a rank (tp) */

typedef struct {
    double H, KV, q, kv, F, Fe, V; /* heads, kv heads, widths, MLP, expert MLP, vocabulary rows */
} pt_plan_local;

/* The model's own local dimensions (pt_model_local_dims), as doubles. */
static pt_plan_local pt_plan_local_dims(const pt_plan_model *M, int tp) {
    pt_local_dims l = pt_model_local_dims(&M->cfg, tp, 0);
    pt_plan_local d = {l.H, l.KV, (double)l.H * M->hd, (double)l.KV * M->hd, l.F, l.Fe, l.V};
    return d;
}

/* A Llama layer's parameters on a rank as the trainer's own parameter table has them (tp split;
 * experts: this rank's n_experts/ep), per layer: dense and experts'; remembered for the search,
 * which meets the same model and split again and again. */
typedef struct {
    pt_model_config m;
    int tp, ep;
    double *dense, *expert; /* (n_layers) */
} pt_plan_params_entry;
static pt_plan_params_entry pt_params_cache[8];
static int pt_params_next;

static const pt_plan_params_entry *pt_plan_table_params(const pt_model_config *m, int tp, int ep) {
    for (int i = 0; i < 8; i++) {
        pt_plan_params_entry *e = &pt_params_cache[i];
        if (e->dense && e->tp == tp && e->ep == ep && !memcmp(&e->m, m, sizeof *m)) return e;
    }
    pt_plan_params_entry *e = &pt_params_cache[pt_params_next++ % 8];
    free(e->dense), free(e->expert);
    *e = (pt_plan_params_entry){*m, tp, ep, calloc((size_t)m->n_layers, sizeof(double)),
                                calloc((size_t)m->n_layers, sizeof(double))};
    pt_model_parallel par = {.tp = tp, .ep = ep};
    pt_param_table t;
    pt_param_table_build_local(&t, m, &par);
    for (int i = 0; i < t.n; i++) {
        const pt_param *p = &t.p[i];
        if (p->layer < 0) continue;
        int ex = p->kind == PT_KIND_EXPERT_W1 || p->kind == PT_KIND_EXPERT_W3 || p->kind == PT_KIND_EXPERT_W2;
        (ex ? e->expert : e->dense)[p->layer] += (double)p->numel;
    }
    pt_param_table_free(&t);
    return e;
}

/* Parameters of layer l on a rank, and of which experts' (they reduce over the
 * expert-data-parallel group): the parameter table's (a GPT block, which pentatron does not
 * train, by its formula). */
static void pt_plan_layer_params(const pt_plan_model *M, const pt_config *c, int l, int tp, int ep,
                                 double *dense, double *expert) {
    if (!M->gpt) {
        const pt_plan_params_entry *e = pt_plan_table_params(&c->model, tp, ep);
        *dense = e->dense[l], *expert = e->expert[l];
        return;
    }
    pt_plan_local d = pt_plan_local_dims(M, tp);
    double C = M->C;
    /* qkv (with biases), o (bias), two LayerNorms (weight, bias), the 4h MLP (biases) */
    *dense = C * 3 * d.q + 3 * d.q + d.q * C + C + 4 * C + C * d.F + d.F + d.F * C + C;
    *expert = 0;
}

/* Model FLOPs of one token's forward through layer l (whole model, no split): the GEMMs and the
 * attention's score and value products (causal: the half that a flash kernel computes; the
 * materialized scores compute all of them). */
static double pt_plan_layer_flops(const pt_plan_model *M, const pt_config *c, int l) {
    double C = M->C, q = M->H * M->hd, kv = M->KV * M->hd, f;
    if (M->gpt)
        f = 2 * (C * 3 * C + C * C + 2 * C * M->F);
    else if (pt_plan_is_moe(c, l))
        f = 2 * (C * (q + 2 * kv) + q * C + M->Ex * C + (M->k + M->Fs / M->Fe) * 3 * C * M->Fe);
    else
        f = 2 * (C * (q + 2 * kv) + q * C + 3 * C * M->F);
    double keys = M->flash ? M->s / 2 : M->s; /* keys a query meets on average */
    return f + 4 * keys * q;
}

/* ------------------------------------------------------------------------------------------ */
/* hardware: GEMMs, memory-bound work, collectives */

double pt_plan_gemm_time(const pt_hardware *hw, double E, double m, double n, double k) {
    if (m < 1 || n < 1 || k < 1) return 0;
    double flops = 2 * m * n * k;
    if (hw->n_shapes > 0) {
        /* the measured shapes: inverse-distance weighting in log space of the 3 nearest (a GEMM
         * at least as large as the largest measured runs at that one's rate) */
        double best[3] = {1e300, 1e300, 1e300}, rate[3] = {0, 0, 0};
        for (int i = 0; i < hw->n_shapes; i++) {
            const pt_gemm_shape *g = &hw->shapes[i];
            double dm = log(fmin(m, 1e9) / g->m), dn = log(n / g->n), dk = log(k / g->k);
            double dist = dm * dm + dn * dn + dk * dk;
            for (int j = 0; j < 3; j++)
                if (dist < best[j]) {
                    for (int t = 2; t > j; t--) best[t] = best[t - 1], rate[t] = rate[t - 1];
                    best[j] = dist, rate[j] = g->flops;
                    break;
                }
        }
        double wsum = 0, r = 0;
        for (int j = 0; j < 3 && rate[j] > 0; j++) {
            double w = 1.0 / (best[j] + 1e-6);
            wsum += w, r += w * rate[j];
        }
        return flops / (r / wsum);
    }
    double bytes = E * (m * k + k * n + m * n), eff = hw->gemm_efficiency;
    if (hw->gemm_units > 0) {
        /* tile quantization (the output in whole tiles) and wave quantization (the tiles in
         * whole waves over the processors): the share of the tiles' work that is useful */
        double tm = hw->gemm_tile_m, tn = hw->gemm_tile_n;
        double tiles = ceil(m / tm) * ceil(n / tn), waves = ceil(tiles / hw->gemm_units);
        eff *= (m * n) / (tiles * tm * tn) * tiles / (waves * hw->gemm_units);
    }
    double t_flops = flops / (hw->peak_flops * eff), t_bytes = bytes / hw->memory_bw;
    return t_flops > t_bytes ? t_flops : t_bytes;
}

static double pt_plan_gemm(const pt_hardware *hw, const pt_plan_model *M, double m, double n,
                           double k) {
    return pt_plan_gemm_time(hw, M->E, m, n, k);
}

static double pt_plan_membound(const pt_hardware *hw, double bytes) { return bytes / hw->memory_bw; }

/* A group's links: size n, of whom `local` on each node (1 when every member is on another
 * node); whether it spans nodes. */
typedef struct {
    int n, local, spans;
} pt_plan_group;

/* The mesh orders ranks tp fastest, then cp, dp, pp (mesh.c; hosts filled in that order). A
 * group of n ranks at stride st (the product of the faster degrees) within nodes of D devices. */
static pt_plan_group pt_plan_group_of(int n, int st, int D) {
    pt_plan_group g = {n, n, 0};
    if ((long)n * st <= D || n == 1) return g;
    g.spans = 1;
    g.local = st >= D ? 1 : D / st;
    if (g.local > n) g.local = n;
    return g;
}

/* The share of a transfer over group g, in messages of `bytes`, that moves while the ranks
 * compute. */
static double pt_plan_overlap(const pt_hardware *hw, pt_plan_group g, double bytes) {
    return pt_hw_sizes_at(&hw->overlap[g.spans != 0], bytes, 1);
}

/* P2P: one message one way (the pipeline's; measured as half a ping-pong where the hardware file
 * has p2p entries); EXCHANGE: a ring's step, each rank sending S while it receives S (cp's hops),
 * at the bandwidth measured both ways at once */
typedef enum { PT_COLL_AR, PT_COLL_AG, PT_COLL_RS, PT_COLL_A2A, PT_COLL_P2P, PT_COLL_EXCHANGE } pt_coll;

/* The ring's α–β time of a collective of S bytes (the whole buffer: the all-reduce's input, the
 * all-gather's output) over n ranks at bandwidth B per direction and latency a. */
static double pt_plan_ring(pt_coll kind, double S, int n, double B, double a) {
    if (n <= 1 || S <= 0) return 0;
    if (kind == PT_COLL_P2P) return a + S / B; /* one message of S */
    double steps = kind == PT_COLL_AR ? 2.0 * (n - 1) : (double)(n - 1);
    return steps * (a + S / n / B);
}

/* The comm layer's measured efficiency for a collective of this kind within (inter = 0) or
 * across nodes at S bytes: the ring's α–β time over the measured ranks / the measured time,
 * linear in log S between the sizes measured (beyond them, the nearest); 1 when none was. */
static double pt_plan_coll_eff(const pt_hardware *hw, pt_coll kind, int inter, double S) {
    int hk = kind == PT_COLL_AR ? PT_HW_AR : kind == PT_COLL_RS ? PT_HW_RS : kind == PT_COLL_AG ? PT_HW_AG
             : kind == PT_COLL_P2P                                                    ? PT_HW_P2P : -1;
    double B = inter ? hw->inter_bw : hw->intra_bw, a = inter ? hw->inter_latency : hw->intra_latency;
    double lo = 0, lo_e = 1, hi = 0, hi_e = 1;
    for (int i = 0; i < hw->n_colls; i++) {
        const pt_coll_time *e = &hw->colls[i];
        if ((int)e->kind != hk || e->inter != inter) continue;
        double eff = pt_plan_ring(kind, e->bytes, e->ranks, B, a) / e->seconds;
        if (e->bytes <= S && e->bytes > lo) lo = e->bytes, lo_e = eff;
        if (e->bytes >= S && (hi == 0 || e->bytes < hi)) hi = e->bytes, hi_e = eff;
    }
    if (lo == 0 || hi == 0 || hi == lo) return lo > 0 ? lo_e : hi_e;
    return lo_e + log(S / lo) / log(hi / lo) * (hi_e - lo_e);
}

/* The ring's time within (inter = 0) or across nodes, scaled by the measured efficiency. */
static double pt_plan_ring_at(const pt_hardware *hw, pt_coll kind, double S, int n, int inter) {
    if (n <= 1 || S <= 0) return 0;
    double B = inter ? hw->inter_bw : hw->intra_bw, a = inter ? hw->inter_latency : hw->intra_latency;
    return pt_plan_ring(kind, S, n, B, a) / pt_plan_coll_eff(hw, kind, inter, S);
}

/* A collective over group g: flat within a node; across nodes, as the comm layer does
 * (PT_COMM_HIER = auto, src/comm/comm_hier.c), hierarchical when the group has more than one
 * rank on each node and the buffer is 64 KiB or more (within each node over `local` ranks, then
 * across the nodes by slices: each local rank moves its 1/local of the buffer with its peers on
 * the other nodes, then back within the node), else the flat ring at the inter-node bandwidth;
 * with hardware comm = nccl, always the flat ring (NCCL's). Each ring at the comm layer's
 * measured efficiency where the hardware file has one. */
static double pt_plan_coll(const pt_hardware *hw, pt_coll kind, double S, pt_plan_group g) {
    if (g.n <= 1 || S <= 0) return 0;
    if (kind == PT_COLL_P2P) return pt_plan_ring_at(hw, kind, S, 2, g.spans != 0);
    if (kind == PT_COLL_EXCHANGE)
        return g.spans ? hw->inter_latency + S / hw->inter_bw : hw->intra_latency + S / hw->intra_bw;
    if (!g.spans) return pt_plan_ring_at(hw, kind, S, g.n, 0);
    if (kind == PT_COLL_A2A) {
        /* (n − local)/n of the buffer leaves the node, at the inter-node bandwidth */
        double out = S * (g.n - g.local) / g.n, in = S * (g.local - 1) / g.n;
        return (g.n - 1) * hw->inter_latency + out / hw->inter_bw + in / hw->intra_bw;
    }
    /* NCCL (and pentatron's NCCL layer, which keeps groups flat): one ring through every rank,
     * each crossing node boundaries at the inter-node bandwidth */
    if (hw->nccl || g.local <= 1 || S < 65536) return pt_plan_ring_at(hw, kind, S, g.n, 1);
    int nodes = g.n / g.local;
    double in = pt_plan_ring_at(hw, kind == PT_COLL_AR ? PT_COLL_RS : kind, S, g.local, 0);
    double across = pt_plan_ring_at(hw, kind, S / g.local, nodes, 1);
    return across + (kind == PT_COLL_AR ? 2 * in : in);
}

/* ------------------------------------------------------------------------------------------ */
/* pentatron's memory (docs/plan.md, "Memory") */

static double pt_round64(double b) { return ceil(b / 64) * 64; }

/* What an expert-parallel exchange adds to a MoE layer's activation buffers (the ep module's,
 * sized for the worst routing): its receive buffers x, y, dy, dx, and this rank's experts'
 * gate/up and h over the received rows with their fp32 gradients. */
static double pt_plan_ep_bytes(const pt_plan_model *M, double N, double Fe, int ep) {
    if (ep <= 1) return 0;
    double k = M->k, E = M->E, C = M->C, el = M->Ex / ep, per = k < el ? k : el, rows = ep * N * per;
    return (4 + E) * 2 * rows * C + (E + 4) * rows * 2 * Fe + (E + 4) * rows * Fe;
}

/* The held sets of every rank of a schedule, remembered for the search (which meets the same
 * schedule shape again and again): (kind, pp, m, chunks) -> most[r·chunks + c]. */
typedef struct {
    int kind, pp, m, v;
    int *most;
} pt_plan_held_entry;
static pt_plan_held_entry pt_held_cache[64];
static int pt_held_next;

static const int *pt_plan_held_all(pt_sched_kind kind, int pp, int m, int v) {
    for (int i = 0; i < 64; i++) {
        pt_plan_held_entry *e = &pt_held_cache[i];
        if (e->most && e->kind == (int)kind && e->pp == pp && e->m == m && e->v == v) return e->most;
    }
    pt_schedule s;
    if (pt_schedule_build(&s, kind, pp, m, v) != PT_OK) return NULL;
    pt_plan_held_entry *e = &pt_held_cache[pt_held_next++ % 64];
    free(e->most);
    *e = (pt_plan_held_entry){(int)kind, pp, m, v, calloc((size_t)pp * v, sizeof(int))};
    int *uses = malloc((size_t)m * v * sizeof *uses);
    for (int r = 0; r < pp; r++) { /* the engine's count (pipeline.h) */
        pt_pipe_count_uses(&s, r, uses);
        pt_pipe_held_sets(&s, r, uses, e->most + r * v);
    }
    free(uses);
    pt_schedule_free(&s);
    return e->most;
}

/* The stages of pt_pipe_stages (the layout's rule), its balanced splits remembered for the search
 * (which meets the same model and stage count again and again; the split is quadratic in the
 * layers). */
typedef struct {
    pt_model_config m;
    int S, head_split;
    pt_chunk *stages;
} pt_plan_split_entry;
static pt_plan_split_entry pt_split_cache[16];
static int pt_split_next;

static pt_status pt_plan_split(const pt_model_config *m, pt_sched_kind kind, int pp, int v, const char *spec,
                               int head_split, pt_chunk *stages) {
    int S = pp * v;
    if ((spec && spec[0]) || kind == PT_SCHED_INTERLEAVED) return pt_pipe_stages(m, kind, pp, v, spec, head_split, stages);
    for (int i = 0; i < 16; i++) {
        pt_plan_split_entry *e = &pt_split_cache[i];
        if (e->stages && e->S == S && e->head_split == head_split && !memcmp(&e->m, m, sizeof *m)) {
            memcpy(stages, e->stages, (size_t)S * sizeof *stages);
            return PT_OK;
        }
    }
    PT_TRY(pt_pipe_stages(m, kind, pp, v, spec, head_split, stages));
    pt_plan_split_entry *e = &pt_split_cache[pt_split_next++ % 16];
    free(e->stages);
    *e = (pt_plan_split_entry){*m, S, head_split, malloc((size_t)S * sizeof *stages)};
    memcpy(e->stages, stages, (size_t)S * sizeof *stages);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */

typedef struct {
    const pt_config *c;
    const pt_hardware *hw;
    pt_plan_model M;
    int simulate; /* the bubble by simulation (else the literature's formula) */
} pt_plan_ctx;

static pt_status pt_plan_model_of(const pt_config *c, pt_plan_model *M) {
    const pt_model_config *m = &c->model;
    memset(M, 0, sizeof *M);
    M->gpt = !strcmp(c->plan.block, "gpt");
    M->flash = strcmp(c->plan.attention, "materialized") != 0;
    M->tp_overlap = !strcmp(c->plan.tp_overlap, "all") ? 2 : !strcmp(c->plan.tp_overlap, "backward");
    M->dp_overlap = c->plan.dp_overlap;
    M->pp_overlap = c->plan.pp_overlap;
    M->pp_scatter = c->plan.pp_scatter_gather;
    M->eager = !strcmp(c->plan.kernels, "eager");
    M->sac_op = !strcmp(c->plan.selective, "op");
    M->bf16 = !strcmp(c->training.precision, "bf16");
    M->E = M->bf16 ? 2 : 4;
    M->C = m->dim;
    M->H = m->n_heads;
    M->KV = M->gpt ? m->n_heads : m->n_kv_heads;
    M->cfg = *m;
    M->cfg.n_kv_heads = (int)M->KV;
    M->hd = m->head_dim > 0 ? m->head_dim : (double)m->dim / m->n_heads;
    M->F = m->ffn_dim;
    M->Vg = m->vocab_size;
    M->L = m->n_layers;
    M->n_layers = m->n_layers;
    M->n_experts = m->n_experts;
    M->Ex = m->n_experts;
    M->k = m->top_k;
    M->Fe = m->moe_ffn_dim > 0 ? m->moe_ffn_dim : 1;
    M->Fs = (double)m->n_shared_experts * M->Fe;
    M->s = c->training.seq_len;
    M->b = c->training.micro_batch;
    M->tied = m->tied_embeddings;
    M->qkv_bias = m->qkv_bias;
    M->attn_bias = m->attention_bias;
    if (M->gpt && m->n_experts)
        return pt_errorf(PT_ERR_CONFIG, "plan.block = gpt describes dense GPT blocks: "
                         "model.n_experts must be 0");
    return PT_OK;
}

/* Seconds of one layer's forward, input-gradient and weight-gradient work on a rank, per
 * micro-batch, and its tensor-parallel, context-parallel and expert-parallel communication
 * (total and exposed). */
typedef struct {
    double f, b, w;           /* compute (the recomputation inside b) */
    double re;                /* of which recomputation */
    double tp, tp_exp, cp, cp_exp, ep, ep_exp;
    double hid_f, hid_b;      /* transfers hidden behind the forward's / backward's compute */
} pt_plan_cost;

static void pt_plan_add(pt_plan_cost *a, const pt_plan_cost *x, double times) {
    a->f += times * x->f, a->b += times * x->b, a->w += times * x->w, a->re += times * x->re;
    a->tp += times * x->tp, a->tp_exp += times * x->tp_exp;
    a->cp += times * x->cp, a->cp_exp += times * x->cp_exp;
    a->ep += times * x->ep, a->ep_exp += times * x->ep_exp;
    a->hid_f += times * x->hid_f, a->hid_b += times * x->hid_b;
}

typedef struct {
    int dp, tp, pp, cp, ep, sp, zero, re, zb;
    int zs; /* ZeRO's shard group in dp ranks (dp, or HSDP's parallel.zero_scope) */
    pt_plan_group g_tp, g_cp, g_dp, g_pp, g_ep, g_edp;
    pt_plan_group g_dps, g_dpr, g_eds; /* ZeRO's shard and replicate groups (HSDP) */
} pt_plan_lay;

static pt_plan_cost pt_plan_layer_cost(const pt_plan_ctx *x, const pt_plan_lay *y, int l) {
    const pt_plan_model *M = &x->M;
    const pt_hardware *hw = x->hw;
    pt_plan_local d = pt_plan_local_dims(M, y->tp);
    int moe = pt_plan_is_moe(x->c, l), sp = y->sp && y->tp > 1;
    double N = M->b * M->s / y->cp, C = M->C, E = M->E, R = sp ? N / y->tp : N;
    pt_plan_cost k = {0};
    /* the GEMMs: forward (m × k)·(k × n); backward's input gradient (m × n)·(n × k); weight
     * gradient (n × m)·(m × k) */
    double g[8][4]; /* m, n, k, times */
    int ng = 0;
#define PT_G(M_, N_, K_, T_) (g[ng][0] = (M_), g[ng][1] = (N_), g[ng][2] = (K_), g[ng++][3] = (T_))
    double qkv = M->gpt ? 3 * d.q : d.q + 2 * d.kv;
    PT_G(N, qkv, C, 1);
    PT_G(N, C, d.q, 1);
    if (M->gpt || !moe) {
        double up = M->gpt ? d.F : 2 * d.F;
        PT_G(N, up, C, 1);
        PT_G(N, C, d.F, 1);
    } else {
        /* each of the rank's n_experts/ep experts gets N·k/n_experts rows from each of the ep
         * ranks (balanced routing) */
        double el = M->Ex / y->ep, rows = N * M->k * y->ep / M->Ex, Fs = M->Fs / M->Fe * d.Fe;
        PT_G(N, M->Ex, C, 1);
        PT_G(rows, 2 * d.Fe, C, el);
        PT_G(rows, C, d.Fe, el);
        if (Fs > 0) {
            PT_G(N, 2 * Fs, C, 1);
            PT_G(N, C, Fs, 1);
        }
    }
#undef PT_G
    /* each GEMM's linear: 0 q/k/v and 1 o (attention), 2 the MLP's column-parallel GEMMs (gate
     * and up; a MoE layer's router, experts' and shared experts' gate/up), 3 its row-parallel
     * ones (down) */
    static const int lin_dense[8] = {0, 1, 2, 3}, lin_moe[8] = {0, 1, 2, 2, 3, 2, 3};
    const int *lin = M->gpt || !moe ? lin_dense : lin_moe;
    double gf[8] = {0}, Gf[4] = {0}, Gd[4] = {0}, Gw[4] = {0};
    /* pentatron with sp overlaps a linear's transfer block by block (linear.c): the forward GEMMs
     * of q/k/v and o (and of a dense MLP's gate/up and down) and the row-parallel linears'
     * input-gradient GEMMs run as tp GEMMs of the R rows each block brings */
    int blocks = !M->gpt && M->tp_overlap == 2 && sp ? y->tp : 1;
    for (int i = 0; i < ng; i++) {
        double m = g[i][0], n = g[i][1], kk = g[i][2], t = g[i][3];
        int li = lin[i], bl = li < 2 || !moe ? blocks : 1, row = li == 1 || li == 3;
        gf[i] = t * bl * pt_plan_gemm(hw, M, m / bl, n, kk);
        Gf[li] += gf[i];
        Gd[li] += t * (row ? bl * pt_plan_gemm(hw, M, m / bl, kk, n) : pt_plan_gemm(hw, M, m, kk, n));
        Gw[li] += t * pt_plan_gemm(hw, M, n, kk, m);
    }
    for (int i = 0; i < 4; i++) k.f += Gf[i], k.b += Gd[i], k.w += Gw[i];
    /* the attention core: flash (causal half; backward 2.5×: the scores again and four
     * products) or materialized (QKᵀ and AV whole as batched GEMMs; the s×s scores through
     * memory: scale, mask, softmax and dropout, 9 bytes an element forward, 11 backward) */
    double heads = M->b * d.H, Tq = M->s / y->cp, keys = M->s;
    double att_f, att_b;
    if (M->flash && hw->attention_flops > 0) { /* the kernel's measured rate */
        double pair = heads * 2 * Tq * keys * M->hd / hw->attention_flops;
        att_f = pair;
        att_b = 2.5 * pair;
    } else if (M->flash) {
        double pair = heads * pt_plan_gemm(hw, M, Tq, keys, M->hd); /* one product, all keys */
        att_f = pair;           /* 2 products × the causal half */
        att_b = 2.5 * pair;
    } else {
        double pair = heads * pt_plan_gemm(hw, M, Tq, keys, M->hd);
        double scores = heads * Tq * keys;
        att_f = 2 * pair + pt_plan_membound(hw, 9 * scores);
        att_b = 4 * pair + pt_plan_membound(hw, 11 * scores);
    }
    k.f += att_f;
    k.b += att_b;
    /* memory-bound: norms, rope, residual adds, the MLP's activation (bytes per token, docs) */
    double fwd_bytes, Fl = moe ? M->k * d.Fe + M->Fs / M->Fe * d.Fe : d.F, Cr = R / N * C;
    if (M->gpt)
        fwd_bytes = E * (2 * 2 * (sp ? C / y->tp : C) + 2 * Fl + 2 * 3.5 * (sp ? C / y->tp : C));
    else if (M->eager)
        /* op by op (torchtitan's model.py without torch.compile), bytes per element: RMSNorm
         * x.float(), pow, mean, × rsqrt, type_as, × weight (4E + 28, twice); rope's float(),
         * complex product, type_as (20, on q and k); repeat_kv's copies of k and v to the query
         * heads (2E(q + kv) when grouped); the residual adds (3E, twice); silu, then the product
         * (5E on F) */
        fwd_bytes = 2 * (4 * E + 28) * Cr + 20 * (d.q + d.kv) + (d.q > d.kv ? 2 * E * (d.q + d.kv) : 0) +
                    2 * 3 * E * Cr + 5 * E * Fl;
    else
        fwd_bytes = E * (2 * 2 * Cr + 2 * (d.q + d.kv) + 2 * 3 * Cr + 3 * Fl);
    if (moe && !M->gpt) fwd_bytes += E * (4 * M->k * C) + 4 * 3 * M->Ex; /* gather, scatter, router */
    k.f += pt_plan_membound(hw, N * fwd_bytes);
    k.b += pt_plan_membound(hw, 2 * N * fwd_bytes);
    /* recomputation: selective redoes the attention core (flash: unless the ring keeps it) and
     * the activation function; full the whole forward */
    if (y->re == PT_RECOMPUTE_FULL) k.re = k.f;
    else if (y->re == PT_RECOMPUTE_SELECTIVE && M->sac_op)
        /* torchtitan's per-op policy (parallelize_llama.py, _save_list): every memory-bound op
         * again, and the block's 2nd, 4th and 6th matmul (k, o, and up of gate/up): the
         * attention's output and the other matmuls' are kept */
        k.re = pt_plan_membound(hw, N * fwd_bytes) + pt_plan_gemm(hw, M, N, d.kv, C) + Gf[1] +
               pt_plan_gemm(hw, M, N, Fl, C);
    else if (y->re == PT_RECOMPUTE_SELECTIVE)
        k.re = (M->flash && y->cp > 1 ? 0 : att_f) + pt_plan_membound(hw, N * E * 3 * Fl);
    /* tensor parallelism: the (N, C) activations' transfers of each linear (below); full
     * recomputation repeats the forward's */
    if (y->tp > 1) {
        /* Per linear, as Megatron-LM's ColumnParallelLinear / RowParallelLinear (and
         * src/model/linear.c) move them. With sp: forward, the input gathered before each
         * column-parallel linear, the output reduce-scattered after each row-parallel one;
         * backward, the row-parallel linear's output gradient gathered, and for each
         * column-parallel one its kept input gathered again (while dx = dy·W computes) and dx
         * reduce-scattered (while dW computes). Without sp: an all-reduce after each row-parallel
         * forward and of each column-parallel dx. Gradients move in the model's precision in a
         * GPT block (Megatron-LM), in fp32 in pentatron's. What may hide behind which GEMM:
         * tp_overlap = all (pentatron with sp: every transfer behind the GEMM that makes or uses
         * its rows), backward (Megatron-LM 2022: the re-gather behind dx's GEMM, dx's sum behind
         * dW's; the output gradient's gather blocks), none. */
        double S = N * C * E, Sg = N * C * (M->gpt ? E : 4);
        double ov = pt_plan_overlap(hw, y->g_tp, S / y->tp), ovg = pt_plan_overlap(hw, y->g_tp, Sg / y->tp);
        int all = M->tp_overlap == 2 && sp, bwd = M->tp_overlap >= 1;
        double fw = 0, fw_exp = 0, bw = 0, bw_exp = 0;
#define PT_T(tot_, exp_, T_, G_)  ((tot_) += (T_), (exp_) += fmax(0, (T_) - (G_)))
        if (sp) {
            double ag = pt_plan_coll(hw, PT_COLL_AG, S, y->g_tp), rs = pt_plan_coll(hw, PT_COLL_RS, S, y->g_tp);
            double agg = pt_plan_coll(hw, PT_COLL_AG, Sg, y->g_tp), rsg = pt_plan_coll(hw, PT_COLL_RS, Sg, y->g_tp);
            for (int c = 0; c < 2; c++) { /* c = 0 attention (q/k/v, o), 1 the MLP */
                int col = 2 * c, row = 2 * c + 1;
                PT_T(fw, fw_exp, ag, all ? ov * Gf[col] : 0);
                PT_T(fw, fw_exp, rs, all ? ov * Gf[row] : 0);
                PT_T(bw, bw_exp, agg, all ? ovg * Gd[row] : 0);
                /* zero bubble's weight pass gathers the input again without overlap */
                PT_T(bw, bw_exp, ag, bwd && !y->zb ? ov * Gd[col] : 0);
                PT_T(bw, bw_exp, rsg, bwd ? ovg * Gw[col] : 0);
            }
        } else {
            double ar = pt_plan_coll(hw, PT_COLL_AR, S, y->g_tp), arg = pt_plan_coll(hw, PT_COLL_AR, Sg, y->g_tp);
            for (int c = 0; c < 2; c++) {
                PT_T(fw, fw_exp, ar, 0);
                PT_T(bw, bw_exp, arg, bwd ? ovg * Gw[2 * c] : 0);
            }
        }
#undef PT_T
        int full = y->re == PT_RECOMPUTE_FULL; /* full recomputation repeats the forward's */
        k.tp = fw + bw + (full ? fw : 0);
        k.tp_exp = fw_exp + bw_exp + (full ? fw_exp : 0);
        k.hid_f = fw - fw_exp, k.hid_b = bw - bw_exp + (full ? fw - fw_exp : 0);
        if (!M->gpt) {
            /* pentatron's small blocking sums in the backward (latency-bound): with sp the two
             * norms' weight gradients (each rank's rows give a part: 2C floats), and a MoE
             * layer's router-weight gradient (N·k doubles: each rank's expert slices' part) */
            double small = (sp ? pt_plan_coll(hw, PT_COLL_AR, 2 * C * 4, y->g_tp) : 0) +
                           (moe ? pt_plan_coll(hw, PT_COLL_AR, N * M->k * 8, y->g_tp) : 0);
            k.tp += small, k.tp_exp += small;
        }
    }
    /* context parallelism: cp − 1 hops of the keys and values forward (hidden behind the block's
     * attention), twice as much backward (the gradients' hops exposed) */
    if (y->cp > 1) {
        double kv = M->b * Tq * 2 * d.kv * E, hop = pt_plan_coll(hw, PT_COLL_EXCHANGE, kv, y->g_cp);
        double block = att_f / y->cp * pt_plan_overlap(hw, y->g_cp, kv);
        k.cp = (y->cp - 1) * 3 * hop;
        k.cp_exp = (y->cp - 1) * (fmax(0, hop - block) + hop + fmax(0, hop - block));
        k.hid_f += (y->cp - 1) * (hop - fmax(0, hop - block));
        k.hid_b += (y->cp - 1) * (hop - fmax(0, hop - block));
    }
    /* expert parallelism: dispatch and combine of N·k rows of C, each way, hidden behind the
     * experts' GEMMs on the blocks already there */
    if (moe && y->ep > 1) {
        double S = N * M->k * C * E;
        double a2a = 2 * pt_plan_coll(hw, PT_COLL_A2A, S, y->g_ep);
        /* behind the routed experts' GEMMs (until 2026-12-06 gf[1] + gf[2]: the o projection
         * and the router) */
        double experts = gf[3] + gf[4];
        k.ep = 2 * a2a;
        k.ep_exp = fmax(0, a2a - pt_plan_overlap(hw, y->g_ep, S / y->ep) * experts * (y->ep - 1) / y->ep) * 2;
        k.hid_f += (k.ep - k.ep_exp) / 2, k.hid_b += (k.ep - k.ep_exp) / 2;
    }
    k.b += k.re;
    /* the computation beside a hidden transfer runs slower (the transfer's kernels take
     * processors and memory bandwidth): hardware overlap_slowdown per second hidden */
    k.f += hw->overlap_slowdown * k.hid_f, k.b += hw->overlap_slowdown * k.hid_b;
    return k;
}

/* ------------------------------------------------------------------------------------------ */
/* a layout */

/* The layout on the cluster: the trainer's checks (pt_degrees_resolve, pt_layout_check: its
 * messages), then the planner's own (the hardware's devices, its table of stages). */
static pt_status pt_plan_check(const pt_plan_ctx *x, const pt_plan_lay *y, int world) {
    const pt_config *c = x->c;
    int devices = x->hw->devices_per_node * x->hw->nodes;
    if (world > devices)
        return pt_errorf(PT_ERR_CONFIG, "the layout needs dp × pp × cp × tp = %d devices; the "
                         "hardware has %d (%d nodes × %d)", world, devices, x->hw->nodes,
                         x->hw->devices_per_node);
    pt_degrees d = {y->dp, y->tp, y->pp, y->cp, y->ep, y->zs < y->dp ? y->zs : 0};
    PT_TRY(pt_degrees_resolve(&d, world));
    pt_layout_spec s = pt_config_layout_spec(c);
    s.deg = d;
    PT_TRY(pt_layout_check(&s, &d, &c->model));
    if (y->pp > PT_PLAN_MAX_PP)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp = %d: the planner takes at most %d", y->pp, PT_PLAN_MAX_PP);
    return PT_OK;
}

/* The bytes of ZeRO-2/3's bucket buffers (data_parallel.c): buckets are whole units (the
 * embedding, each layer, the final norm, the head: units[0..n)), merged from the end up to the
 * bucket size under ZeRO-2, one each under ZeRO-3; a buffer holds the largest bucket, padded to a
 * multiple of the group. In use at once: the pool's cap of 4 gradient buffers (fewer buckets,
 * fewer), and under ZeRO-3 the unit computing and the next one's gather (2). */
static double pt_plan_zero_buffers(const pt_config *c, int zero, const double *units, int n,
                                   int group) {
    if (zero < 2 || group <= 1 || n == 0) return 0;
    double total = 0;
    for (int u = 0; u < n; u++) total += units[u];
    double mb = c->parallel.bucket_mb > 0 ? c->parallel.bucket_mb
                                          : fmin(25.0, fmax(1.0, total * 4 / 1048576.0 / 8));
    double want = floor(mb * 1048576.0 / 4), largest = 0;
    int buckets = 0;
    for (int u = n - 1; u >= 0;) {
        if (units[u] == 0) {
            u--;
            continue;
        }
        double size = units[u];
        int v = u - 1;
        for (; zero == 2 && v >= 0; v--) {
            if (units[v] == 0) continue;
            if (size + units[v] > want) break;
            size += units[v];
        }
        buckets++;
        double padded = ceil(size / group) * group;
        largest = padded > largest ? padded : largest;
        u = zero == 2 ? v : u - 1;
    }
    double gbufs = buckets < 4 ? buckets : 4;
    return 4 * largest * (gbufs + (zero == 3 ? 2 : 0));
}

/* The model state of one rank: parameters, gradients, AdamW moments (fp32; bf16: the model's
 * copy in bf16, the fp32 masters with the optimizer, sharded with the moments under ZeRO-1/2/3),
 * ZeRO by stage over the shard group (dense: its zs × cp ranks, the data group's dp × cp without
 * HSDP; experts: that / ep). */
static void pt_plan_state(const pt_plan_ctx *x, const pt_plan_lay *y, double dense, double expert,
                          const double *units, const double *eunits, int n_units,
                          pt_plan_memory *mem) {
    int red = y->zs * y->cp, edp = red / y->ep, z = y->dp * y->cp > 1 ? y->zero : 0;
    double pad_d = z == 1 || z == 0 ? ceil(dense / red) * red : dense;
    double pad_e = z <= 1 ? ceil(expert / edp) * edp : expert;
    if (z == 0) pad_d = dense, pad_e = expert;
    double full = 4 * (pad_d + pad_e), shard = 4 * (pad_d / red + pad_e / edp);
    mem->params = z == 3 ? shard : full;
    mem->grads = z >= 2 ? shard : full;
    mem->optim = 2 * (z >= 1 ? shard : full);
    mem->transient = pt_plan_zero_buffers(x->c, z, units, n_units, red) +
                     (y->ep > 1 ? pt_plan_zero_buffers(x->c, z, eunits, n_units, edp) : 0);
    mem->masters = x->M.bf16 ? (z >= 1 ? shard : full) : 0;
    if (x->M.bf16) {
        mem->optim += mem->masters;
        mem->params /= 2;
    }
}

/* Korthikanti et al. 2022, Table 2: a GPT layer's activations per micro-batch, 16-bit (bytes). */
static double pt_plan_gpt_layer_acts(const pt_plan_model *M, const pt_plan_lay *y) {
    double s = M->s / y->cp, b = M->b, h = M->C, a = M->H, t = y->tp;
    double att = M->flash ? 0 : 5 * a * s / h; /* the stored s×s scores, softmax and dropout */
    if (y->re == PT_RECOMPUTE_FULL) return 2 * s * b * h;
    if (y->re == PT_RECOMPUTE_SELECTIVE) att = 0;
    double per = y->sp && t > 1 ? 34 / t + att / t : 10 + 24 / t + att / t;
    return s * b * h * per * (M->E / 2);
}

static pt_status pt_plan_layout_of(const pt_config *c, const pt_hardware *hw, pt_plan_lay *y,
                                   int *world) {
    int devices = hw->devices_per_node * hw->nodes;
    memset(y, 0, sizeof *y);
    y->tp = c->parallel.tp, y->pp = c->parallel.pp, y->cp = c->parallel.cp, y->ep = c->parallel.ep;
    if (y->tp < 1 || y->pp < 1 || y->cp < 1 || y->ep < 1)
        return pt_errorf(PT_ERR_CONFIG, "parallel.tp, pp, cp and ep must be >= 1");
    int rest = y->tp * y->pp * y->cp;
    y->dp = c->parallel.dp;
    if (y->dp == -1) {
        if (devices % rest)
            return pt_errorf(PT_ERR_CONFIG, "parallel.dp = -1: tp × pp × cp = %d does not divide the "
                             "hardware's %d devices", rest, devices);
        y->dp = devices / rest;
    }
    if (y->dp < 1) return pt_errorf(PT_ERR_CONFIG, "parallel.dp must be >= 1 (or -1: the rest)");
    y->sp = c->parallel.sp && y->tp > 1;
    y->zero = y->dp * y->cp > 1 ? c->parallel.zero : 0;
    *world = rest * y->dp;
    int D = hw->devices_per_node;
    /* HSDP: node is a node's dp ranks (the mesh fills a node with tp, cp, then dp) */
    int scope = pt_config_zero_scope(c);
    y->zs = scope == -1 ? (y->tp * y->cp < D ? D / (y->tp * y->cp) : 1) : scope;
    if (y->zero == 0 || y->zs <= 0 || y->zs > y->dp) y->zs = y->dp;
    y->g_dps = pt_plan_group_of(y->zs * y->cp, y->tp, D);
    y->g_dpr = pt_plan_group_of(y->dp / y->zs, y->tp * y->cp * y->zs, D);
    y->g_eds = pt_plan_group_of(y->zs * y->cp / y->ep, y->tp * y->ep, D);
    y->g_tp = pt_plan_group_of(y->tp, 1, D);
    y->g_cp = pt_plan_group_of(y->cp, y->tp, D);
    y->g_dp = pt_plan_group_of(y->dp * y->cp, y->tp, D); /* the gradients go over dp × cp */
    y->g_pp = pt_plan_group_of(y->pp, y->tp * y->cp * y->dp, D);
    y->g_ep = pt_plan_group_of(y->ep, y->tp, D);
    y->g_edp = pt_plan_group_of(y->dp * y->cp / y->ep, y->tp * y->ep, D);
    return PT_OK;
}

/* A model that holds nothing but what pt_acts_count reads: c's configuration, the layout's split
 * and precision, rank r's chunks (stages of the schedule kind), the head's rows when split. */
static void pt_plan_shell(pt_model *m, const pt_config *c, const pt_plan_model *M,
                          const pt_plan_lay *y, pt_sched_kind kind, int chunks, int r,
                          const pt_chunk *stages, int head_split, int head_rows) {
    memset(m, 0, sizeof *m);
    m->cfg = c->model;
    m->loc = pt_model_local_dims(&c->model, y->tp, 0);
    m->par.tp = y->tp, m->par.sp = y->sp, m->par.cp = y->cp, m->par.ep = y->ep;
    m->par.n_chunks = chunks;
    for (int ch = 0; ch < chunks; ch++)
        m->par.chunk[ch] = y->pp > 1 ? stages[pt_schedule_stage(kind, y->pp, chunks, r, ch)]
                                     : (pt_chunk){0, c->model.n_layers};
    m->par.head_split = head_split;
    m->par.head_V = head_rows;
    m->prec = M->bf16 ? PT_PREC_BF16 : PT_PREC_FP32;
    m->act_size = M->bf16 ? 2 : 4;
    m->recompute = y->re;
    m->recompute_layers = c->training.recompute_layers;
}

/* The plan of c's layout, its model already checked (pt_model_config_settle). */
static pt_status pt_plan_eval_sim(const pt_config *c, const pt_hardware *hw, int simulate, pt_plan *out) {
    pt_plan_ctx x = {c, hw, {0}, simulate};
    PT_TRY(pt_plan_model_of(c, &x.M));
    const pt_plan_model *M = &x.M;
    pt_plan_lay y;
    int world;
    PT_TRY(pt_plan_layout_of(c, hw, &y, &world));
    pt_sched_kind kind;
    PT_TRY(pt_schedule_parse_kind(c->parallel.pp_schedule, &kind));
    if (y.pp == 1) kind = PT_SCHED_1F1B;
    int chunks = y.pp > 1 ? pt_schedule_chunks(kind, c->parallel.pp_virtual) : 1;
    if (!strcmp(c->training.recompute, "selective")) y.re = PT_RECOMPUTE_SELECTIVE;
    else if (!strcmp(c->training.recompute, "full")) y.re = PT_RECOMPUTE_FULL;
    int m = c->training.global_batch / (y.dp * c->training.micro_batch);
    PT_TRY(pt_plan_check(&x, &y, world));
    y.zb = y.pp > 1 && pt_schedule_splits_backward(kind);
    int head_split = y.pp > 1 && !strcmp(c->parallel.pp_head, "split");

    memset(out, 0, sizeof *out);
    out->dp = y.dp, out->tp = y.tp, out->pp = y.pp, out->cp = y.cp, out->ep = y.ep;
    out->sp = y.sp, out->zero = y.zero, out->chunks = chunks, out->sched = kind;
    out->zero_shard = y.zs;
    out->micro_batch = c->training.micro_batch, out->m = m, out->recompute = y.re;

    /* the stages' layers (the layout's rule, pipeline.h), the schedule */
    int S = y.pp * chunks;
    pt_chunk *stages = calloc((size_t)S, sizeof *stages);
    pt_status st = PT_OK;
    st = pt_plan_split(&c->model, kind, y.pp, chunks, c->parallel.pp_layers, head_split, stages);
    int *rows = calloc((size_t)y.pp, sizeof *rows);
    if (st == PT_OK && head_split) st = pt_pipe_head_rows(&c->model, y.pp, y.tp, stages, c->parallel.pp_head_rows, rows);
    pt_schedule sched = {0};
    const int *held = NULL;
    if (st == PT_OK && y.pp > 1) {
        if (simulate) st = pt_schedule_build(&sched, kind, y.pp, m, chunks);
        if (st == PT_OK && !(held = pt_plan_held_all(kind, y.pp, m, chunks)))
            st = pt_errorf(PT_ERR_CONFIG, "the %s schedule cannot run %d micro-batches on %d stages",
                           pt_schedule_kind_name(kind), m, y.pp);
    }
    if (st != PT_OK) {
        free(stages), free(rows);
        return st;
    }

    pt_plan_local d = pt_plan_local_dims(M, y.tp);
    double N = M->b * M->s / y.cp, C = M->C;
    double R = y.sp ? N / y.tp : N;
    double worst = -1;
    pt_plan_cost worst_cost = {0};
    double flops_token = 0;
    for (int l = 0; l < M->n_layers; l++) flops_token += pt_plan_layer_flops(M, c, l);
    flops_token = 3 * (flops_token + 2 * C * M->Vg);
    out->flops_per_token = flops_token;

    for (int r = 0; r < y.pp; r++) {
        double dense = 0, expert = 0, acts = 0, ws = 0, scratch = 0;
        pt_model shell;
        if (!M->gpt)
            pt_plan_shell(&shell, c, M, &y, kind, chunks, r, stages, head_split,
                          head_split ? (int)ceil((double)rows[r] / y.tp) : 0);
        /* the units the ZeRO-2/3 buckets are made of (pp = 1): embedding, layers, norm, head */
        int nu = 0;
        double *units = calloc((size_t)M->n_layers + 3, sizeof *units);
        double *eunits = calloc((size_t)M->n_layers + 3, sizeof *eunits);
        pt_plan_cost cost = {0};
        int most[16] = {1};
        if (held) memcpy(most, held + r * chunks, (size_t)chunks * sizeof *most);
        for (int ch = 0; ch < chunks; ch++) {
            int sg = pt_schedule_stage(kind, y.pp, chunks, r, ch);
            pt_chunk k = stages[sg];
            int first = sg == 0, last = sg == S - 1;
            for (int l = k.l0; l < k.l1; l++) {
                double pd, pe;
                pt_plan_layer_params(M, c, l, y.tp, y.ep, &pd, &pe);
                dense += pd, expert += pe;
                if (y.ep > 1) units[1 + l] = pd, eunits[1 + l] = pe;
                else units[1 + l] = pd + pe;
                pt_plan_cost lc = pt_plan_layer_cost(&x, &y, l);
                pt_plan_add(&cost, &lc, 1);
            }
            if (first) dense += units[0] = d.V * C + (M->gpt ? c->model.max_seq_len * C : 0);
            double head_rows = head_split ? ceil((double)rows[r] / y.tp) : last ? d.V : 0;
            if (last) dense += units[M->n_layers + 1] = M->gpt ? 2 * C : C; /* the final norm */
            if (head_rows > 0 && (!M->tied || y.pp > 1 || !first)) dense += units[M->n_layers + 2] = head_rows * C;
            nu = M->n_layers + 3;
            if (head_rows > 0) { /* the head's GEMMs and the loss's pass over the logits */
                pt_plan_cost hc = {0};
                /* the loss: the fused softmax cross-entropy at its measured rate, or two passes
                 * over the fp32 logits each way */
                double xent = hw->xent_rate > 0 ? N * head_rows / hw->xent_rate / 2
                                                : pt_plan_membound(hw, N * head_rows * 4 * 2);
                double xent_b = xent;
                if (M->eager && !(hw->xent_rate > 0)) {
                    /* torch's cross-entropy over logits made fp32 (torchtitan's loss): float()
                     * and log_softmax forward (E + 4 + 8 bytes a logit); backward the nll's
                     * gradient, log_softmax's (4 + 12) and back to the logits' type (4 + E) */
                    xent = pt_plan_membound(hw, N * head_rows * (M->E + 12));
                    xent_b = pt_plan_membound(hw, N * head_rows * (M->E + 20));
                }
                hc.f = pt_plan_gemm(hw, M, N, head_rows, C) + xent;
                hc.b = pt_plan_gemm(hw, M, N, C, head_rows) + xent_b;
                hc.w = pt_plan_gemm(hw, M, head_rows, C, N);
                if (y.tp > 1 || head_split) { /* the head's input: gathered, its gradient reduced */
                    pt_plan_group g = head_split ? pt_plan_group_of(y.pp * y.tp, 1, hw->devices_per_node) : y.g_tp;
                    double S2 = N * C * M->E;
                    hc.tp = (y.sp ? 2 : 1) * pt_plan_coll(hw, y.sp ? PT_COLL_AG : PT_COLL_AR, S2, g);
                    if (!M->gpt && y.tp > 1) /* the vocabulary-parallel loss: each row's max, sum
                                              * and target logit gathered (3 floats a row); sp:
                                              * the final norm's weight gradient summed */
                        hc.tp += pt_plan_coll(hw, PT_COLL_AG, 3.0 * N * 4 * y.tp, g) +
                                 (y.sp ? pt_plan_coll(hw, PT_COLL_AR, C * 4, g) : 0);
                    hc.tp_exp = hc.tp;
                }
                pt_plan_add(&cost, &hc, 1);
            }
            if (M->gpt) {
                acts += most[ch] * (k.l1 - k.l0) * pt_plan_gpt_layer_acts(M, &y);
                if (last) acts += most[ch] * N * d.V * 4; /* fp32 logits */
            } else { /* the allocator's own count (llama.c) */
                size_t w, sc;
                acts += most[ch] * (double)pt_acts_count(&shell, (int)M->b, (int)(M->s / y.cp), ch,
                                                         y.zb, (size_t)pt_plan_ep_bytes(M, N, d.Fe, y.ep),
                                                         &w, &sc);
                ws = fmax(ws, (double)w);
                scratch = (double)sc;
            }
        }
        pt_plan_memory *mem = &out->stage[r];
        pt_plan_state(&x, &y, dense, expert, units, eunits, nu, mem);
        free(units), free(eunits);
        if (!M->gpt && y.cp > 1) /* the ring's buffers: keys/values two in flight, their
                                  * gradients, one block's output and log-sum-exp */
            ws += 4 * (4 * N * 2 * d.kv + N * d.q + M->b * d.H * (M->s / y.cp));
        if (!M->gpt && head_split) { /* the head's workspace (rows of the logits in chunks) */
            double HR = fmin(fmin(512, fmax(16, floor(32.0 * 1048576 / rows[r]))), N);
            double rl = ceil((double)rows[r] / y.tp);
            ws += pt_round64(HR * rl * 4) + pt_round64(HR * 4) + (M->bf16 ? pt_round64(HR * rl * 2) : 0);
            if (r < y.pp - 1) ws += pt_round64(N * C * M->E) + pt_round64(N * C * 4);
            else ws += 4 * (y.pp - 1) * R * C;
        }
        ws += scratch;
        mem->activations = acts + ws;
        mem->total = mem->params + mem->grads + mem->optim + mem->transient + mem->activations;
        if (mem->total > out->memory_max) out->memory_max = mem->total, out->memory_max_stage = r;
        double tot = cost.f + cost.b + cost.w + cost.tp_exp + cost.cp_exp + cost.ep_exp;
        if (tot > worst) {
            worst = tot, worst_cost = cost;
        }
        if (r == 0) { /* the optimizer: each owned parameter's AdamW update, memory-bound */
            double owned = (mem->optim - mem->masters) / 8;
            /* fused AdamW: 28 bytes an owned parameter (30 in bf16: the model's copy), with the
             * gradient norm's read and the gradients' zeroing (8); torch's foreach AdamW op by op
             * (torch/optim/adamw.py, _multi_tensor_adamw: decay, lerp, mul, addcmul, sqrt, div,
             * add, addcdiv: 80) after clip_grad_norm_'s norm and scaling (12), the gradients
             * set to None */
            out->optimizer = pt_plan_membound(hw, owned * (M->eager ? 92 : (M->bf16 ? 30 : 28) + 8));
        }
    }

    /* the pipeline: the slowest rank's per-chunk costs, its exposed tp/cp/ep transfers inside
     * them; each stage boundary's transfer a message in the schedule's simulation (one at a time
     * on a link; from the hardware's rendezvous size on, it leaves only once the receiver and
     * then the sender have polled: pt_sched_link), or, screening by the formulas, added to each
     * forward and backward */
    const pt_plan_cost *k = &worst_cost;
    double p2p_bytes = R * C * M->E, p2p = 0;
    if (y.pp > 1) {
        /* plan.pp_scatter_gather: without sp each tp rank sends its 1/tp of the activations,
         * the receiving tp group gathers them (Megatron-LM's scatter_gather_tensors_in_pipeline) */
        int scatter = M->pp_scatter && !y.sp && y.tp > 1;
        if (scatter) p2p_bytes = N * C * M->E / y.tp;
        p2p = pt_plan_coll(hw, PT_COLL_P2P, p2p_bytes, y.g_pp) +
              (scatter ? pt_plan_coll(hw, PT_COLL_AG, N * C * M->E, y.g_tp) : 0);
    }
    pt_sched_link link = {.delay = p2p, .latency = y.g_pp.spans ? hw->inter_latency : hw->intra_latency,
                          .rendezvous = pt_hw_sizes_at(&hw->rendezvous[y.g_pp.spans != 0], p2p_bytes, 0) >= 0.5};
    double f = (k->f + k->tp_exp / 2 + k->cp_exp / 2 + k->ep_exp / 2) / chunks;
    double b = (k->b + k->tp_exp / 2 + k->cp_exp / 2 + k->ep_exp / 2) / chunks;
    double w = k->w / chunks;
    double busy = m * chunks * (f + b + w), makespan = busy, pp_exp = 0;
    if (y.pp > 1) {
        if (simulate) {
            pt_sched_sim sim;
            double span[2] = {busy, busy}; /* without the transfers' time, with it */
            for (int i = 0; i < 2 && st == PT_OK; i++) {
                /* plan.pp_overlap = false: each send blocks its sender until the data is in
                 * (Megatron-LM's p2p_communication.py until 2022: batch_isend_irecv, wait,
                 * torch.cuda.synchronize): an action's time includes its transfer */
                double tx = i && !M->pp_overlap ? p2p : 0;
                st = pt_schedule_simulate_link(&sched, f + tx, b + tx, w, 0,
                                               i && M->pp_overlap ? &link : &(pt_sched_link){0}, &sim);
                if (st == PT_OK) span[i] = sim.makespan, pt_sched_sim_free(&sim);
            }
            makespan = span[0], pp_exp = span[1] - span[0];
            out->simulated = 1;
            pt_schedule_free(&sched);
        } else {
            double fp = f + p2p, bp = b + p2p, per = fp + bp + w;
            pp_exp = m * chunks * 2 * p2p;
            makespan = busy + (y.pp - 1) * (kind == PT_SCHED_ZB ? fmax(0, fp + bp - 2 * w) : per / chunks);
        }
    }
    free(stages), free(rows);
    PT_TRY(st);
    out->compute = m * (k->f + k->b + k->w);
    out->recompute_s = m * k->re;
    out->comm[PT_PLAN_TP] = m * k->tp, out->exposed[PT_PLAN_TP] = m * k->tp_exp;
    out->comm[PT_PLAN_CP] = m * k->cp, out->exposed[PT_PLAN_CP] = m * k->cp_exp;
    out->comm[PT_PLAN_EP] = m * k->ep, out->exposed[PT_PLAN_EP] = m * k->ep_exp;
    out->comm[PT_PLAN_PP] = m * chunks * 2 * p2p, out->exposed[PT_PLAN_PP] = pp_exp;
    out->bubble = makespan - busy;
    makespan += pp_exp;

    /* data parallelism: the gradients' reduction (all-reduce; ZeRO-1/2 reduce-scatter, then the
     * parameters' all-gather after the update; ZeRO-3 every micro-batch's gathers too) */
    double gbytes = (!strcmp(c->parallel.grad_reduce, "bf16") ? 2 : 4);
    double dense_el = 0, exp_el = 0;
    { /* the gradients a rank reduces: its share of the layers and the embedding and head */
        double pd, pe;
        for (int l = 0; l < M->n_layers; l++) {
            pt_plan_layer_params(M, c, l, y.tp, y.ep, &pd, &pe);
            dense_el += pd, exp_el += pe;
        }
        dense_el = dense_el / y.pp + 2 * d.V * C / y.pp;
        exp_el /= y.pp;
    }
    double dp = 0, dp_exp = 0;
    if (y.dp * y.cp > 1) {
        /* ZeRO over the shard group (the data group without HSDP); HSDP's replicas then
         * all-reduce each rank's reduced shard, 1/(zs·cp) of the gradients */
        int edp = y.dp * y.cp / y.ep, eds = y.zs * y.cp / y.ep, R = y.dp / y.zs;
        double red = y.zero == 0 ? pt_plan_coll(hw, PT_COLL_AR, gbytes * dense_el, y.g_dp)
                                 : pt_plan_coll(hw, PT_COLL_RS, gbytes * dense_el, y.g_dps);
        if (exp_el > 0 && edp > 1)
            red += y.zero == 0 ? pt_plan_coll(hw, PT_COLL_AR, gbytes * exp_el, y.g_edp)
                   : eds > 1   ? pt_plan_coll(hw, PT_COLL_RS, gbytes * exp_el, y.g_eds)
                               : 0;
        if (R > 1)
            red += pt_plan_coll(hw, PT_COLL_AR, gbytes * (dense_el / y.g_dps.n + exp_el / eds),
                                y.g_dpr);
        double gather = 0;
        if (y.zero >= 1) {
            double pb = M->bf16 ? 2 : 4;
            gather = pt_plan_coll(hw, PT_COLL_AG, pb * dense_el, y.g_dps) +
                     (exp_el > 0 && eds > 1 ? pt_plan_coll(hw, PT_COLL_AG, pb * exp_el, y.g_eds) : 0);
        }
        double nb = fmax(1, ceil(4 * dense_el / 1048576.0 /
                                 (c->parallel.bucket_mb > 0 ? c->parallel.bucket_mb
                                                            : fmin(25, fmax(1, 4 * dense_el / 1048576.0 / 8)))));
        /* a ring step of a bucket's reduction moves bucket / n */
        double ovd = pt_plan_overlap(hw, y.g_dp, gbytes * dense_el / nb / y.g_dp.n);
        double hide = M->dp_overlap ? ovd * (k->b + k->w) / chunks : 0;
        if (y.zero == 3) {
            /* every micro-batch: gather forward and backward, reduce-scatter; behind the compute */
            double per = 2 * gather + red;
            dp = m * per;
            dp_exp = m * fmax(0, per - ovd * (k->f + k->b + k->w)) + red / nb;
        } else {
            dp = red + gather;
            dp_exp = fmax(red / nb, red - hide) + gather;
        }
    }
    out->comm[PT_PLAN_DP] = dp, out->exposed[PT_PLAN_DP] = dp_exp;
    /* the computation beside the hidden reduction runs slower (hardware overlap_slowdown) */
    double dp_busy = hw->overlap_slowdown * (dp - dp_exp); /* computation it adds */
    /* plan.kernels = eager with ZeRO-3 (PyTorch's FSDP2, _fsdp_collectives.py under
     * torch/distributed/_composable/fsdp in 2024, fsdp/_fully_shard since): each gather's output
     * copied out into the parameters (split_with_sizes_copy: 2 + 2 bytes a parameter, forward and
     * backward) and the gradients into the reduce-scatter's fp32 input (_chunk_cat: 2 + 4), on
     * the compute stream, every micro-batch */
    if (M->eager && y.zero == 3 && y.dp * y.cp > 1)
        dp_busy += m * pt_plan_membound(hw, 14 * (dense_el + exp_el));
    /* the ranks' skew: at every synchronization the others wait for the slowest; the measured
     * mean wait per second of the computation before it (docs/plan.md, "Skew") */
    out->skew = world > 1 ? hw->skew * busy : 0;
    out->step = makespan + dp_exp + dp_busy + out->optimizer + out->skew;
    out->compute += out->optimizer + dp_busy;
    double tokens = (double)c->training.global_batch * c->training.seq_len;
    out->tokens_per_second = tokens / out->step;
    out->model_flops = flops_token * tokens;
    out->mfu = out->model_flops / (out->step * world * hw->peak_flops);
    /* which groups span nodes */
    const char *nm[] = {"tp", "cp", "dp", "pp", "ep"};
    const pt_plan_group *gs[] = {&y.g_tp, &y.g_cp, &y.g_dp, &y.g_pp, &y.g_ep};
    for (int i = 0; i < 5; i++)
        if (gs[i]->spans) {
            strcat(out->spans, out->spans[0] ? " " : "");
            strcat(out->spans, nm[i]);
        }
    return PT_OK;
}

/* *out: a copy of c (malloc'ed) with its model as the trainer takes it, checked with the
 * trainer's messages and completed (pt_model_config_settle), before anything is sized. */
static pt_status pt_plan_model_checked(const pt_config *c, pt_config **out) {
    pt_config *m = malloc(sizeof *m);
    *m = *c;
    if (!strcmp(m->plan.block, "gpt")) m->model.n_kv_heads = m->model.n_heads; /* its attention's */
    pt_status st = pt_model_config_settle(&m->model, m->training.seq_len);
    if (st != PT_OK) free(m), m = NULL;
    *out = m;
    return st;
}

pt_status pt_plan_eval(const pt_config *c, const pt_hardware *hw, pt_plan *out) {
    pt_config *m;
    PT_TRY(pt_plan_model_checked(c, &m));
    pt_status st = pt_plan_eval_sim(m, hw, 1, out);
    free(m);
    return st;
}

/* ------------------------------------------------------------------------------------------ */
/* output */

static const char *pt_plan_re_name(int re) {
    return re == PT_RECOMPUTE_FULL ? "full" : re == PT_RECOMPUTE_SELECTIVE ? "selective" : "none";
}

void pt_plan_json(const pt_plan *p, FILE *f) {
    static const char *dims[] = {"dp", "tp", "pp", "cp", "ep"};
    fprintf(f, "{\"dp\": %d, \"tp\": %d, \"pp\": %d, \"cp\": %d, \"ep\": %d, \"sp\": %s, "
            "\"zero\": %d, \"schedule\": \"%s\", \"chunks\": %d, \"micro_batch\": %d, "
            "\"micro_batches\": %d, \"recompute\": \"%s\", ", p->dp, p->tp, p->pp, p->cp, p->ep,
            p->sp ? "true" : "false", p->zero, pt_schedule_kind_name(p->sched), p->chunks,
            p->micro_batch, p->m, pt_plan_re_name(p->recompute));
    fprintf(f, "\"memory_bytes_max\": %.0f, \"memory_max_stage\": %d, \"memory_per_stage\": [",
            p->memory_max, p->memory_max_stage);
    for (int r = 0; r < p->pp; r++) {
        const pt_plan_memory *m = &p->stage[r];
        fprintf(f, "%s{\"params\": %.0f, \"grads\": %.0f, \"optim\": %.0f, \"transient\": %.0f, "
                "\"activations\": %.0f, \"total\": %.0f}", r ? ", " : "", m->params, m->grads,
                m->optim, m->transient, m->activations, m->total);
    }
    fprintf(f, "], \"step_seconds\": %.6g, \"compute_seconds\": %.6g, \"recompute_seconds\": %.6g, "
            "\"optimizer_seconds\": %.6g, \"bubble_seconds\": %.6g, \"skew_seconds\": %.6g, "
            "\"exposed_seconds\": {", p->step, p->compute, p->recompute_s, p->optimizer, p->bubble,
            p->skew);
    for (int i = 0; i < PT_PLAN_DIMS; i++)
        fprintf(f, "%s\"%s\": %.6g", i ? ", " : "", dims[i], p->exposed[i]);
    fprintf(f, "}, \"comm_seconds\": {");
    for (int i = 0; i < PT_PLAN_DIMS; i++)
        fprintf(f, "%s\"%s\": %.6g", i ? ", " : "", dims[i], p->comm[i]);
    fprintf(f, "}, \"tokens_per_second\": %.6g, \"mfu\": %.4f, \"flops_per_token\": %.6g, "
            "\"spans_nodes\": \"%s\", \"bubble_from\": \"%s\"}", p->tokens_per_second, p->mfu,
            p->flops_per_token, p->spans, p->simulated ? "simulation" : "formula");
}

static void pt_plan_fmt_bytes(double b, char *out, size_t cap) {
    if (b >= 1e9) snprintf(out, cap, "%.2f GB", b / 1e9);
    else if (b >= 1e6) snprintf(out, cap, "%.2f MB", b / 1e6);
    else snprintf(out, cap, "%.1f kB", b / 1e3);
}

void pt_plan_print(const pt_plan *p, const pt_config *c, const pt_hardware *hw, FILE *f) {
    static const char *dims[] = {"dp", "tp", "pp", "cp", "ep"};
    char hsdp[96] = "";
    if (p->zero_shard > 0 && p->zero_shard < p->dp)
        snprintf(hsdp, sizeof hsdp, " (HSDP: shard groups of %d dp ranks, %d replicas)",
                 p->zero_shard, p->dp / p->zero_shard);
    fprintf(f, "layout: dp %d × pp %d × cp %d × tp %d%s, ep %d, ZeRO-%d%s, %s", p->dp, p->pp, p->cp,
            p->tp, p->sp ? " (sp)" : "", p->ep, p->zero, hsdp, pt_schedule_kind_name(p->sched));
    if (p->chunks > 1) fprintf(f, " × %d chunks", p->chunks);
    fprintf(f, ", %d micro-batches of %d, recompute %s, on %s (%d × %d)%s%s\n", p->m, p->micro_batch,
            pt_plan_re_name(p->recompute), hw->name, hw->nodes, hw->devices_per_node,
            p->spans[0] ? "; spanning nodes: " : "", p->spans);
    fprintf(f, "memory per rank (the largest of each pipeline stage):\n");
    fprintf(f, "  %-6s %11s %11s %11s %11s %11s %11s\n", "stage", "params", "grads", "optimizer",
            "transient", "activations", "total");
    for (int r = 0; r < p->pp; r++) {
        if (p->pp > 8 && r > 2 && r < p->pp - 2 && r != p->memory_max_stage) {
            if (r == 3) fprintf(f, "  ...\n");
            continue;
        }
        const pt_plan_memory *m = &p->stage[r];
        char b[6][24];
        double v[6] = {m->params, m->grads, m->optim, m->transient, m->activations, m->total};
        for (int i = 0; i < 6; i++) pt_plan_fmt_bytes(v[i], b[i], sizeof b[i]);
        fprintf(f, "  %-6d %11s %11s %11s %11s %11s %11s%s\n", r, b[0], b[1], b[2], b[3], b[4], b[5],
                r == p->memory_max_stage ? "  <- largest" : "");
    }
    char mx[24], dev[24];
    pt_plan_fmt_bytes(p->memory_max, mx, sizeof mx);
    pt_plan_fmt_bytes(hw->memory_bytes, dev, sizeof dev);
    fprintf(f, "  largest rank %s of %s (%.0f%%)%s\n", mx, dev, 100 * p->memory_max / hw->memory_bytes,
            p->memory_max > hw->memory_bytes ? ": does not fit" : "");
    fprintf(f, "step %.4g s: compute %.4g s (recompute %.3g, optimizer %.3g), bubble %.4g s",
            p->step, p->compute, p->recompute_s, p->optimizer, p->bubble);
    if (p->skew > 0) fprintf(f, ", skew %.3g s", p->skew);
    for (int i = 0; i < PT_PLAN_DIMS; i++)
        if (p->comm[i] > 0)
            fprintf(f, ", %s %.3g s exposed of %.3g", dims[i], p->exposed[i], p->comm[i]);
    fprintf(f, "\n%.6g tokens/s, MFU %.1f%% (%.4g model FLOPs per token, peak %.4g FLOP/s per device)\n",
            p->tokens_per_second, 100 * p->mfu, p->flops_per_token, hw->peak_flops);
    fprintf(f, "(%s)\n", PT_PLAN_PUBLISHED_BAND);
    (void)c;
}

/* ------------------------------------------------------------------------------------------ */
/* the search */

static int pt_plan_cmp(const void *a, const void *b) {
    double x = ((const pt_plan *)a)->tokens_per_second, y = ((const pt_plan *)b)->tokens_per_second;
    return x < y ? 1 : x > y ? -1 : 0;
}

pt_status pt_plan_search(const pt_config *c_in, const pt_hardware *hw, pt_plan **out, int *n,
                         int *n_fit, int *n_tried, pt_plan *least) {
    pt_config *c0; /* the model first: the layouts vary the rest */
    PT_TRY(pt_plan_model_checked(c_in, &c0));
    int devices = hw->devices_per_node * hw->nodes, cnt = 0, kept = 0, tried = 0, least_set = 0;
    int cap = 4 * (c0->plan.top > 0 ? c0->plan.top : 1) + 8;
    pt_plan *res = malloc((size_t)cap * sizeof *res);
    pt_config *c = malloc(sizeof *c);
    pt_plan *p = malloc(sizeof *p);
    double limit = hw->memory_bytes * (1 - c0->plan.headroom);
    static const char *scheds[] = {"1f1b", "interleaved", "zb"};
    static const char *recs[] = {"none", "selective", "full"};
    const pt_model_config *mc = &c0->model;
    int gb = c0->training.global_batch;
    for (int tp = 1; tp <= devices && tp <= 64; tp *= 2)
        for (int cp = 1; cp <= 16 && tp * cp <= devices; cp *= 2)
            for (int pp = 1; pp <= mc->n_layers && tp * cp * pp <= devices; pp++) {
                if (devices % (tp * cp * pp)) continue;
                int dp = devices / (tp * cp * pp);
                if (tp > hw->devices_per_node && !c0->plan.tp_across_nodes) continue;
                for (int ep = 1; ep <= (mc->n_experts ? dp * cp : 1); ep *= 2)
                    for (int mb = 1; mb <= 16; mb *= 2) {
                        if (gb % (dp * mb)) continue;
                        for (int z = 0; z <= (pp > 1 ? 1 : 3); z++) {
                            if (dp * cp == 1 && z > 0) continue;
                            for (int si = 0; si < (pp > 1 ? 3 : 1); si++)
                                for (int ri = 0; ri < 3; ri++) {
                                    *c = *c0;
                                    c->parallel.dp = dp, c->parallel.tp = tp, c->parallel.pp = pp;
                                    c->parallel.cp = cp, c->parallel.ep = ep, c->parallel.zero = z;
                                    c->parallel.sp = tp > 1;
                                    c->training.micro_batch = mb;
                                    snprintf(c->parallel.pp_schedule, sizeof c->parallel.pp_schedule, "%s", scheds[si]);
                                    c->parallel.pp_virtual = si == 1 ? 2 : 1;
                                    c->parallel.pp_layers[0] = 0;
                                    snprintf(c->parallel.pp_head, sizeof c->parallel.pp_head, "last");
                                    snprintf(c->training.recompute, sizeof c->training.recompute, "%s", recs[ri]);
                                    tried++;
                                    if (pt_plan_eval_sim(c, hw, 0, p) != PT_OK) continue;
                                    if (least && (!least_set || p->memory_max < least->memory_max))
                                        *least = *p, least_set = 1;
                                    if (p->memory_max > limit) continue;
                                    cnt++;
                                    /* keep the best `cap` (sorted, best first) */
                                    if (kept == cap && p->tokens_per_second <= res[kept - 1].tokens_per_second)
                                        continue;
                                    int at = kept < cap ? kept++ : cap - 1;
                                    while (at > 0 && res[at - 1].tokens_per_second < p->tokens_per_second) {
                                        res[at] = res[at - 1];
                                        at--;
                                    }
                                    res[at] = *p;
                                }
                        }
                    }
            }
    /* the leaders again with the schedule's simulation (the formula screened them) */
    int top = kept;
    for (int i = 0; i < top; i++) {
        *c = *c0;
        pt_plan *r = &res[i];
        c->parallel.dp = r->dp, c->parallel.tp = r->tp, c->parallel.pp = r->pp, c->parallel.cp = r->cp;
        c->parallel.ep = r->ep, c->parallel.zero = r->zero, c->parallel.sp = r->sp;
        c->training.micro_batch = r->micro_batch;
        snprintf(c->parallel.pp_schedule, sizeof c->parallel.pp_schedule, "%s", pt_schedule_kind_name(r->sched));
        c->parallel.pp_virtual = r->sched == PT_SCHED_INTERLEAVED ? r->chunks : 1;
        c->parallel.pp_layers[0] = 0;
        snprintf(c->parallel.pp_head, sizeof c->parallel.pp_head, "last");
        snprintf(c->training.recompute, sizeof c->training.recompute, "%s", pt_plan_re_name(r->recompute));
        if (pt_plan_eval_sim(c, hw, 1, p) == PT_OK) *r = *p;
    }
    qsort(res, (size_t)top, sizeof *res, pt_plan_cmp);
    free(c), free(p), free(c0);
    *out = res;
    *n = kept;
    *n_fit = cnt;
    *n_tried = tried;
    return PT_OK;
}
