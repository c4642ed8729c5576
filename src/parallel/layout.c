/* layout.c: a 5D layout resolved in one place (see include/pt/layout.h).
 *
 * The mesh is world = dp × pp × cp × tp (mesh.h), with ep reusing the ranks of dp × cp. From it:
 *   - tensor parallelism: this rank's blocks of every tensor (pt_model_local_dims) and the tp
 *     table (tensor_parallel.c), with the kv group when key/value heads are shared;
 *   - expert parallelism: this rank's experts, the ep table (expert_parallel.c);
 *   - context parallelism: this rank's tokens of every sequence, the cp table
 *     (context_parallel.c);
 *   - pipeline parallelism: this rank's chunks of layers (pipeline.c splits, schedule.c orders);
 *   - data parallelism: the gradients of dp × cp are summed together; with experts the table has
 *     two regions, the dense tensors (reduced over dp × cp) and the experts, last (reduced over
 *     the ranks holding the same experts, edp), each its own pt_dp instance, padded so that each
 *     shards evenly. HSDP (zero_scope) shards each region over its shard group instead (dps,
 *     eds) and sums the reduced shards over the replicate group (dpr, edr).
 * And the rule for sums: a quantity each rank holds a part of is summed over exactly the groups
 * across which the parts differ (pt_layout_sum_step says which).
 */
#include "pt/layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/context_parallel.h"
#include "pt/expert_parallel.h"
#include "pt/pipeline.h"
#include "pt/tensor_parallel.h"

/* Tensor parallelism: this rank's blocks and the table. */
static pt_status layout_tp(pt_layout *l, const pt_layout_spec *s, const pt_model_config *mc,
                           pt_backend *be) {
    pt_mesh *mesh = l->mesh;
    pt_model_parallel *par = &l->par;
    par->tp = mesh->deg.tp;
    par->tp_rank = mesh->tp_i;
    par->sp = s->sp;
    /* the rows of a micro-batch this rank's tp group holds (its share of each sequence) */
    int mbt = s->micro_batch * (s->seq_len / mesh->deg.cp);
    pt_local_dims ld = pt_model_local_dims(mc, par->tp, par->tp_rank);
    if (ld.kv_shared > 1) pt_mesh_make_kv(mesh, ld.kv_shared);
    par->tp_ops = pt_tp_create(be, mesh->tp, ld.kv_shared > 1 ? mesh->kv : NULL, par->sp, ld.V,
                               ld.v0, ld.v_valid, mbt, mc->dim);
    return PT_OK;
}

/* The head split over the pipeline ranks: each stage's vocabulary rows (pipeline.c balances
 * them), within a stage split over its tp ranks like the unsplit head; the loss's statistics
 * combined over the pp × tp ranks (the head group) by a vocabulary-parallel cross-entropy of
 * tensor_parallel.c's over that group. */
static pt_status layout_pp_head(pt_layout *l, const pt_layout_spec *s, const pt_model_config *mc,
                                pt_backend *be, const pt_chunk *stages) {
    pt_mesh *mesh = l->mesh;
    pt_model_parallel *par = &l->par;
    int pp = l->pp, tp = mesh->deg.tp, *rows = pt_malloc((size_t)pp * sizeof *rows);
    pt_status st = pt_pipe_head_rows(mc, pp, tp, stages, s->pp_head_rows, rows);
    if (st != PT_OK) { /* every rank sees it, and stops */
        free(rows);
        return st;
    }
    l->head_rows = pt_malloc((size_t)pp * sizeof *l->head_rows);
    memcpy(l->head_rows, rows, (size_t)pp * sizeof *rows);
    int start = 0;
    for (int i = 0; i < mesh->pp_i; i++) start += rows[i];
    int mine = rows[mesh->pp_i];
    char shares[256];
    size_t len = 0;
    for (int i = 0; i < pp && len < sizeof shares; i++)
        len += (size_t)snprintf(shares + len, sizeof shares - len, "%s%d", i ? "," : "", rows[i]);
    free(rows);
    par->head_split = 1;
    par->head_V = (mine + tp - 1) / tp;
    par->head_v0 = start + mesh->tp_i * par->head_V;
    par->head_valid = start + mine - par->head_v0;
    if (par->head_valid > par->head_V) par->head_valid = par->head_V;
    if (par->head_valid < 0) par->head_valid = 0;
    pt_mesh_make_head(mesh);
    par->head_ops = pt_tp_create(be, mesh->head, NULL, 0, par->head_V, par->head_v0,
                                 par->head_valid, s->micro_batch * (s->seq_len / mesh->deg.cp),
                                 mc->dim);
    pt_log_info("pipeline: the head split over the stages, vocabulary rows %s", shares);
    return PT_OK;
}

/* Pipeline parallelism: the stages, this rank's chunks. */
static pt_status layout_pp(pt_layout *l, const pt_layout_spec *s, const pt_model_config *mc,
                           pt_backend *be) {
    pt_model_parallel *par = &l->par;
    int pp = l->pp;
    PT_TRY(pt_schedule_parse_kind(s->pp_schedule, &l->sched));
    int v = pt_schedule_chunks(l->sched, s->pp_virtual);
    pt_chunk stages[PT_LAYOUT_MAX_STAGES]; /* pt_layout_check bounds pp × v */
    int split = s->pp_head && !strcmp(s->pp_head, "split");
    PT_TRY(pt_pipe_stages(mc, l->sched, pp, v, s->pp_layers, split, stages));
    char counts[PT_LAYOUT_MAX_STAGES * 8];
    size_t len = 0;
    for (int i = 0; i < pp * v && len < sizeof counts; i++)
        len += (size_t)snprintf(counts + len, sizeof counts - len, "%s%d", i ? "," : "", stages[i].l1 - stages[i].l0);
    pt_log_info("pipeline: %d stages, stage layers %s (stage order%s)", pp * v, counts,
                s->pp_layers[0] ? ", parallel.pp_layers" : "");
    par->n_chunks = v;
    for (int c = 0; c < v; c++) par->chunk[c] = stages[pt_schedule_stage(l->sched, pp, v, l->mesh->pp_i, c)];
    return split ? layout_pp_head(l, s, mc, be, stages) : PT_OK;
}

/* The pipeline's part of pt_layout_check (pp > 1); zero: the stage in force. */
static pt_status layout_check_pp(const pt_layout_spec *s, const pt_degrees *d, int zero,
                                 const pt_model_config *mc) {
    int pp = d->pp, v = s->pp_virtual;
    pt_sched_kind kind;
    PT_TRY(pt_schedule_parse_kind(s->pp_schedule, &kind));
    int interleaved = kind == PT_SCHED_INTERLEAVED;
    if (kind == PT_SCHED_DUALPIPEV && v > 2)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_schedule = dualpipev holds 2 model chunks per "
                         "rank (the V): parallel.pp_virtual = %d, leave it at 1 (or 2)", v);
    v = pt_schedule_chunks(kind, v);
    if (v > 1 && !interleaved && kind != PT_SCHED_DUALPIPEV)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_virtual = %d needs parallel.pp_schedule = "
                         "interleaved", v);
    if (interleaved && v < 2)
        return pt_errorf(PT_ERR_CONFIG, "the interleaved schedule needs parallel.pp_virtual >= 2");
    if (zero >= 3)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp > 1 with parallel.zero = %d: ZeRO-3 gathers "
                         "every unit's parameters for each micro-batch's forward and backward, 2m "
                         "times its parameter traffic under a pipeline of m micro-batches; use "
                         "ZeRO-0, 1 or 2 (docs/parallelism.md)", zero);
    if ((int64_t)pp * v > PT_LAYOUT_MAX_STAGES)
        return pt_errorf(PT_ERR_CONFIG, "pipeline: too many stages (%lld)", (long long)pp * v);
    if (v > PT_MAX_CHUNKS)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_virtual = %d exceeds %d", v, PT_MAX_CHUNKS);
    int split = s->pp_head && !strcmp(s->pp_head, "split");
    if (split && (v > 1 || kind == PT_SCHED_DUALPIPEV))
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_head = split needs the afab, 1f1b or zb "
                         "schedule (parallel.pp_schedule = %s)", s->pp_schedule);
    if (split && mc->tied_embeddings)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_head = split needs untied embeddings "
                         "(model.tied_embeddings = true: the head is the embedding, on the first "
                         "stage)");
    return PT_OK;
}

pt_status pt_layout_check(const pt_layout_spec *s, const pt_degrees *d, const pt_model_config *mc) {
    if (s->global_batch % (d->dp * s->micro_batch) != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "training.global_batch (%d) must be divisible by dp × micro_batch = %d × %d",
                         s->global_batch, d->dp, s->micro_batch);
    if (d->tp > 1) {
        PT_TRY(pt_model_check_tp(mc, d->tp));
        int mbt = s->micro_batch * (s->seq_len / d->cp); /* a micro-batch's rows in a tp group */
        if (s->sp && mbt % d->tp != 0)
            return pt_errorf(PT_ERR_CONFIG, "parallel.sp: micro_batch × seq_len / cp = %d rows must "
                             "be divisible by tp = %d", mbt, d->tp);
    }
    if (d->ep > 1 && (mc->n_experts == 0 || mc->n_experts % d->ep != 0))
        return pt_errorf(PT_ERR_CONFIG, "parallel.ep = %d must divide model.n_experts = %d", d->ep,
                         mc->n_experts);
    if (s->zero > 0 && s->zero_scope > 0) { /* (node: checked by pt_mesh_init, by host) */
        pt_degrees scoped = *d;
        scoped.zs = s->zero_scope;
        PT_TRY(pt_degrees_check_scope(&scoped));
    }
    int unit = s->cp_zigzag ? 2 * d->cp : d->cp;
    if (d->cp > 1 && s->seq_len % unit != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.cp = %d (%s): training.seq_len = %d must be a "
                         "multiple of %d", d->cp, s->cp_zigzag ? "zigzag" : "contiguous",
                         s->seq_len, unit);
    if (d->pp > 1) return layout_check_pp(s, d, d->dp * d->cp > 1 ? s->zero : 0, mc);
    if (s->pp_head && !strcmp(s->pp_head, "split"))
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_head = split needs parallel.pp > 1");
    return PT_OK;
}

pt_status pt_layout_init(pt_layout *l, const pt_layout_spec *s, const pt_model_config *mc,
                         pt_backend *be, int distributed) {
    memset(l, 0, sizeof *l);
    l->par.tp = 1;
    l->dp_size = 1;
    l->cp = l->pp = 1;
    l->sched = PT_SCHED_1F1B;
    if (distributed) {
        l->mesh = pt_calloc(1, sizeof *l->mesh);
        pt_degrees deg = s->deg;
        deg.zs = s->zero > 0 ? s->zero_scope : 0; /* (ZeRO-0 replicates: nothing to scope) */
        pt_status st = pt_mesh_init(l->mesh, &deg, s->timeout_s);
        if (st != PT_OK) {
            free(l->mesh);
            l->mesh = NULL;
            return st;
        }
        pt_log_set_rank(l->mesh->world_rank, l->mesh->world_size);
        l->dpc = l->mesh->deg.cp > 1 ? l->mesh->dpcp : l->mesh->dp;
        l->dp_rank = l->mesh->dp_i;
        l->dp_size = l->mesh->deg.dp;
    } else if (s->deg.dp > 1) {
        return pt_errorf(PT_ERR_CONFIG, "parallel.dp = %d needs MPI: run under mpirun -np N",
                         s->deg.dp);
    }
    pt_degrees one = {1, 1, 1, 1, 1, 0};
    PT_TRY(pt_layout_check(s, l->mesh ? &l->mesh->deg : &one, mc));
    l->red = l->dpc ? l->dpc->size : 1;
    l->zero = l->red > 1 ? s->zero : 0;
    l->shard = l->mesh && l->mesh->dps ? l->mesh->dps->size : l->red;
    l->rep_i = l->mesh ? l->mesh->rep_i : 0;
    if (l->mesh && l->mesh->dps && l->mesh->world_rank == 0)
        pt_log_info("HSDP: ZeRO-%d over shard groups of %d data ranks (dps), replicated over %d "
                    "(dpr)", l->zero, l->shard, l->mesh->dpr->size);
    if (s->zero == 0 && s->zero_scope != 0 && (!l->mesh || l->mesh->world_rank == 0))
        pt_log_info("parallel.zero_scope is ignored with parallel.zero = 0 (nothing is sharded)");
    if (s->zero > 0 && l->red == 1)
        pt_log_info("parallel.zero = %d with dp = 1: one rank holds every shard (same as ZeRO-0)",
                    s->zero);
    pt_mesh *mesh = l->mesh;
    pt_model_parallel *par = &l->par;
    if (mesh && mesh->deg.tp > 1) PT_TRY(layout_tp(l, s, mc, be));
    /* expert parallelism: this rank's experts of every MoE layer */
    int ep = mesh ? mesh->deg.ep : 1;
    if (ep > 1) {
        par->ep = ep;
        par->ep_rank = mesh->ep_i;
        par->ep_ops = pt_ep_create(be, mesh->ep, mc->n_experts, mc->top_k, mc->capacity_factor,
                                   mc->dim);
        /* ZeRO-1 shards the regions in flat buckets (the dense one padded to the group); 2 and
         * 3 in whole units, padded per bucket */
        par->ep_zero_group = l->zero == 1 ? l->shard : l->zero > 1 ? 1 : 0;
    }
    /* context parallelism: this rank's share of every sequence */
    l->cp = mesh ? mesh->deg.cp : 1;
    l->cp_rank = mesh ? mesh->cp_i : 0;
    if (l->cp > 1) {
        int cp = l->cp;
        par->cp = cp;
        int Tl = s->seq_len / cp;
        pt_local_dims ld = pt_model_local_dims(mc, mesh->deg.tp, mesh->tp_i);
        par->cp_ops = pt_cp_create(be, mesh->cp, s->cp_zigzag, s->overlap, s->micro_batch * Tl,
                                   ld.H, ld.KV, pt_model_head_dim(mc), Tl);
    }
    l->T_local = s->seq_len / l->cp;
    l->pos = pt_malloc((size_t)l->T_local * sizeof *l->pos);
    pt_cp_positions(l->cp, s->cp_zigzag, l->cp_rank, l->T_local, l->pos);
    /* pipeline parallelism: this rank's stages, as model chunks */
    l->pp = mesh ? mesh->deg.pp : 1;
    if (l->pp > 1) PT_TRY(layout_pp(l, s, mc, be));
    /* the data-parallel regions: the dense tensors, then (expert parallelism) the experts */
    pt_param_table local;
    pt_param_table_build_local(&local, mc, par);
    size_t total = local.total;
    l->dense = total;
    for (int i = 0; i < local.n; i++)
        if (local.p[i].expert >= 0 && local.p[i].offset < l->dense) l->dense = local.p[i].offset;
    pt_param_table_free(&local);
    int edp = ep > 1 ? (mesh->eds ? mesh->eds : mesh->edp)->size : 1;
    l->alloc = ep > 1 ? l->dense + pt_dp_padded_total(total - l->dense, edp, l->zero)
                      : pt_dp_padded_total(total, l->shard, l->zero);
    return PT_OK;
}

pt_status pt_layout_init_data(pt_layout *l, pt_model *m, double bucket_mb, int overlap,
                              int reduce_bf16) {
    if (!l->dpc) return PT_OK;
    pt_mesh *mesh = l->mesh;
    pt_comm *dps = mesh->dps ? mesh->dps : l->dpc, *eds = mesh->eds ? mesh->eds : mesh->edp;
    if (l->par.ep > 1) {
        /* the dense tensors reduced over the data ranks, the experts (last in the table) over the
         * ranks that hold the same experts, each region by its own instance */
        PT_TRY(pt_dp_init_region(&l->dp, dps, m, l->zero, 0, l->dense, bucket_mb, overlap));
        /* (ZeRO-2/3, and ZeRO-1 with a bf16 model's sharded masters, keep the experts' state in
         * its shards, even alone) */
        if (mesh->edp->size > 1 || l->zero >= 2 || (l->zero == 1 && m->prec == PT_PREC_BF16))
            PT_TRY(pt_dp_init_region(&l->dpe, eds, m, l->zero, l->dense, l->alloc, bucket_mb,
                                     overlap));
    } else {
        PT_TRY(pt_dp_init(&l->dp, dps, m, l->zero, bucket_mb, overlap));
    }
    pt_dp_set_replicas(&l->dp, mesh->dpr);
    if (l->dpe.model) pt_dp_set_replicas(&l->dpe, mesh->edr);
    if (reduce_bf16) PT_TRY(pt_dp_reduce_bf16(&l->dp));
    if (reduce_bf16 && l->dpe.model) PT_TRY(pt_dp_reduce_bf16(&l->dpe));
    return PT_OK;
}

pt_owned_range *pt_layout_owned_ranges(pt_layout *l, int *n) {
    *n = 1;
    pt_owned_range *ranges = l->dpc ? pt_dp_owned_ranges(&l->dp, n) : NULL;
    if (ranges && l->par.ep > 1 && l->zero > 0) {
        /* and the experts' region: its slices over the expert-data ranks, or all of it */
        int n_e = 1;
        pt_owned_range *re = l->dpe.model ? pt_dp_owned_ranges(&l->dpe, &n_e) : NULL;
        ranges = pt_realloc(ranges, (size_t)(*n + n_e) * sizeof *ranges);
        if (re)
            memcpy(ranges + *n, re, (size_t)n_e * sizeof *re);
        else
            ranges[*n] = (pt_owned_range){.lo = l->dense, .hi = l->alloc};
        *n += n_e;
        free(re);
    }
    return ranges;
}

void pt_layout_free(pt_layout *l) {
    if (l->dpe.model) pt_dp_free(&l->dpe);
    if (l->dp.model) pt_dp_free(&l->dp);
    if (l->mesh) {
        pt_mesh_free(l->mesh);
        free(l->mesh);
    }
    free(l->pos);
    free(l->head_rows);
    l->mesh = NULL, l->pos = NULL, l->head_rows = NULL;
}

/* The tables outlive the activations that hold their states: freed after them. */
void pt_layout_free_tables(pt_layout *l) {
    pt_tp_free((pt_tp_ops *)l->par.tp_ops);
    pt_tp_free((pt_tp_ops *)l->par.head_ops);
    pt_cp_free((pt_cp_ops *)l->par.cp_ops);
    pt_ep_free((pt_ep_ops *)l->par.ep_ops);
    l->par.tp_ops = NULL, l->par.head_ops = NULL, l->par.cp_ops = NULL, l->par.ep_ops = NULL;
}

void pt_layout_sum_step(const pt_layout *l, double *loss, double *sumsq, double aux[2],
                        double *load, size_t n_load) {
    const pt_mesh *mesh = l->mesh;
    int zero = l->dp.model ? l->dp.zero : 0;
    if (mesh && l->pp > 1) pt_allreduce_sum(mesh->pp, loss, 1, PT_DTYPE_F64); /* the last stage's */
    /* the data ranks' losses; with ZeRO they own disjoint parts of the gradients (HSDP: each part
     * counted once, by the first replica) */
    if (l->dpc) {
        double red[4] = {*loss, zero && l->rep_i == 0 ? *sumsq : 0.0, aux[0], aux[1]};
        pt_allreduce_sum(l->dpc, red, 4, PT_DTYPE_F64);
        *loss = red[0];
        if (zero) *sumsq = red[1];
        aux[0] = red[2], aux[1] = red[3];
    }
    if (mesh && l->pp > 1) pt_allreduce_sum(mesh->pp, aux, 2, PT_DTYPE_F64); /* per stage */
    /* expert load over the whole step: every data rank's tokens, every stage's layers */
    if (n_load && l->dpc) pt_allreduce_sum(l->dpc, load, n_load, PT_DTYPE_F64);
    if (n_load && mesh && l->pp > 1) pt_allreduce_sum(mesh->pp, load, n_load, PT_DTYPE_F64);
    /* the tp ranks and the stages always hold disjoint parts */
    if (l->par.tp > 1) pt_allreduce_sum(mesh->tp, sumsq, 1, PT_DTYPE_F64);
    if (mesh && l->pp > 1) pt_allreduce_sum(mesh->pp, sumsq, 1, PT_DTYPE_F64);
    /* without ZeRO the experts' ranks hold disjoint experts (the dense tensors counted by the
     * first); with it the data group (which holds the ep group) has summed everything */
    if (l->par.ep > 1 && !zero) pt_allreduce_sum(mesh->ep, sumsq, 1, PT_DTYPE_F64);
}

void pt_layout_sum_counts(const pt_layout *l, double *x, size_t n) {
    if (l->dpc) pt_allreduce_sum(l->dpc, x, n, PT_DTYPE_F64);
    if (l->mesh && l->pp > 1) pt_allreduce_sum(l->mesh->pp, x, n, PT_DTYPE_F64);
}

void pt_layout_sum_loss(const pt_layout *l, double *loss) {
    if (l->mesh && l->pp > 1) pt_allreduce_sum(l->mesh->pp, loss, 1, PT_DTYPE_F64);
    if (l->dpc) pt_allreduce_sum(l->dpc, loss, 1, PT_DTYPE_F64);
}

void pt_layout_sum_tied(const pt_layout *l, pt_model *m) {
    if (!m->cfg.tied_embeddings || !l->mesh || l->mesh->emb->size <= 1) return;
    if (l->sched == PT_SCHED_DUALPIPEV) return; /* the V's first rank holds both ends: no copy */
    if (l->dpc && l->dp.zero >= 2) { /* ZeRO-2: the reduced shards of the two copies */
        pt_dp_sum_unit(&l->dp, 0, l->mesh->emb);
        return;
    }
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
        if (p->kind == PT_KIND_EMBED)
            pt_allreduce_sum(l->mesh->emb, m->grads + p->offset, p->numel, PT_DTYPE_F32);
    }
}

void pt_layout_to_global(const pt_layout *l, const pt_model *m, const float *local, float *host) {
    memset(host, 0, m->gtable.total * sizeof(float));
    pt_param_table_to_global(&m->table, local, host);
    if (l->par.ep_zero_group && l->par.ep_rank > 0)
        for (int i = 0; i < m->table.n; i++) { /* owned by all with ZeRO: the first's */
            const pt_param *gp = &m->gtable.p[m->table.p[i].gindex];
            if (m->table.p[i].expert < 0) memset(host + gp->offset, 0, gp->numel * sizeof(float));
        }
    if (l->par.tp > 1) pt_allreduce_sum(l->mesh->tp, host, m->gtable.total, PT_DTYPE_F32);
    if (l->mesh && l->pp > 1) /* the stages hold disjoint tensors */
        pt_allreduce_sum(l->mesh->pp, host, m->gtable.total, PT_DTYPE_F32);
    if (l->par.ep > 1) /* so do the expert ranks (their experts; the rest from the first) */
        pt_allreduce_sum(l->mesh->ep, host, m->gtable.total, PT_DTYPE_F32);
}

void pt_layout_gather_owned(const pt_layout *l, float *h, size_t n) {
    if (!l->dpc || !l->dp.zero) return;
    /* over the shard groups, which hold every slice once (without HSDP: the data ranks, the
     * experts' over the ranks holding them) */
    if (l->par.ep > 1) {
        pt_allreduce_sum(l->dp.comm, h, l->dp.region_hi, PT_DTYPE_F32);
        if (l->dpe.model)
            pt_allreduce_sum(l->dpe.comm, h + l->dpe.region_lo, n - l->dpe.region_lo, PT_DTYPE_F32);
    } else {
        pt_allreduce_sum(l->dp.comm, h, n, PT_DTYPE_F32);
    }
}

int pt_layout_writes(const pt_layout *l) {
    /* replicated over the data ranks (ZeRO-0): the first data rank (of the experts' group); HSDP:
     * the first replica of each shard */
    if (!l->dpc) return 1;
    if (l->dp.zero > 0) return l->rep_i == 0;
    return l->par.ep > 1 ? l->mesh->edp_i == 0 : l->dp_rank == 0;
}

void pt_layout_set_params(pt_layout *l, pt_model *m, const float *local) {
    if (l->dpc) {
        pt_dp_set_params(&l->dp, local);
        if (l->dpe.model && l->dpe.pshard) pt_dp_set_params(&l->dpe, local);
    } else {
        m->be->upload(m->be, m->params, local, m->table.total * sizeof(float));
    }
}

void pt_layout_get_params(pt_layout *l, pt_model *m, float *local) {
    if (l->dpc) {
        pt_dp_get_params(&l->dp, local);
        if (l->dpe.model && l->dpe.pshard) pt_dp_get_params(&l->dpe, local);
    } else {
        m->be->download(m->be, local, m->params, m->table.total * sizeof(float));
    }
}

pt_dp_memory pt_layout_memory(const pt_layout *l, const pt_model *m, size_t optim_elems) {
    if (l->dpc) {
        pt_dp_memory r = pt_dp_memory_bytes(&l->dp, optim_elems);
        if (l->dpe.model && (l->dpe.zero >= 2 || l->dpe.pshard)) { /* the experts' shards and
                                                                     * pooled buffers */
            pt_dp_memory e = pt_dp_memory_bytes(&l->dpe, 0);
            if (l->dpe.zero >= 2) r.grads += e.grads;
            if (l->dpe.zero == 3) r.params += e.params;
            if (l->dpe.pshard && m->prec == PT_PREC_BF16) r.optim += e.optim; /* its masters */
            r.params_transient += e.params_transient;
            r.grads_transient += e.grads_transient;
        }
        return r;
    }
    size_t full = m->alloc_total * sizeof(float);
    if (m->prec == PT_PREC_BF16) /* the bf16 copy; the fp32 masters with the moments */
        return (pt_dp_memory){full / 2, full, 2 * optim_elems * sizeof(float) + full, 0, 0};
    return (pt_dp_memory){full, full, 2 * optim_elems * sizeof(float), 0, 0};
}

void pt_layout_head_rows(const pt_layout *l, int *rows) {
    memcpy(rows, l->head_rows, (size_t)l->pp * sizeof *rows);
}
