/* trainer.c: the training loop (see include/pt/trainer.h). */
#include "pt/trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <mpi.h>

#include "pt/checkpoint.h"
#include "pt/context_parallel.h"
#include "pt/expert_parallel.h"
#include "pt/tensor_parallel.h"
#include "pt/hf_config.h"
#include "pt/safetensors.h"

double pt_measure_gemm_peak(pt_backend *be) {
    /* square sgemm large enough to reach the library's steady state */
    const int n = 1024;
    float *a = be->alloc(be, (size_t)n * n * sizeof(float));
    float *b = be->alloc(be, (size_t)n * n * sizeof(float));
    float *c = be->alloc(be, (size_t)n * n * sizeof(float));
    float *h = pt_malloc((size_t)n * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * n; i++) h[i] = (float)(i % 17) * 0.01f;
    be->upload(be, a, h, (size_t)n * n * sizeof(float));
    be->upload(be, b, h, (size_t)n * n * sizeof(float));
    free(h);
    double best = 1e30;
    /* best of 12: robust to a brief disturbance from other processes */
    for (int r = 0; r < 12; r++) {
        double t0 = pt_now();
        be->gemm(be, PT_NO_TRANS, PT_TRANS, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        be->synchronize(be);
        double dt = pt_now() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    be->free(be, a);
    be->free(be, b);
    be->free(be, c);
    return 2.0 * n * n * (double)n / best;
}

static int pt_schedule_id(const char *s) {
    if (!strcmp(s, "cosine")) return PT_LR_COSINE;
    if (!strcmp(s, "linear")) return PT_LR_LINEAR;
    return PT_LR_CONSTANT;
}

pt_status pt_trainer_init(pt_trainer *t, const pt_config *cfg_in) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg_in;
    pt_config *cfg = &t->cfg;
    PT_TRY(pt_config_validate(cfg));

    /* the architecture comes from model.init_from's config.json when given */
    if (cfg->init_from[0]) {
        char path[PT_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/config.json", cfg->init_from);
        pt_model_config hf;
        PT_TRY(pt_hf_config_read(path, &hf));
        cfg->model = hf;
    }
    if (cfg->model.n_experts > 0 && cfg->model.moe_ffn_dim == 0)
        cfg->model.moe_ffn_dim = cfg->model.ffn_dim;
    if (cfg->training.seq_len > cfg->model.max_seq_len)
        return pt_errorf(PT_ERR_CONFIG, "training.seq_len (%d) exceeds model.max_seq_len (%d)",
                         cfg->training.seq_len, cfg->model.max_seq_len);
    PT_TRY(pt_model_config_check(&cfg->model));

    int mpi_on = 0;
    MPI_Initialized(&mpi_on);
    t->dp_size = 1;
    if (mpi_on) {
        pt_degrees deg = {cfg->parallel.dp, cfg->parallel.tp, cfg->parallel.pp, cfg->parallel.cp,
                          cfg->parallel.ep};
        t->mesh = pt_calloc(1, sizeof *t->mesh);
        pt_status st = pt_mesh_init(t->mesh, &deg, cfg->parallel.timeout_s);
        if (st != PT_OK) {
            free(t->mesh);
            t->mesh = NULL;
            return st;
        }
        pt_log_set_rank(t->mesh->world_rank, t->mesh->world_size);
        /* the gradients of the data ranks and of the context ranks are summed together */
        t->dpc = t->mesh->deg.cp > 1 ? t->mesh->dpcp : t->mesh->dp;
        t->dp_rank = t->mesh->dp_i;
        t->dp_size = t->mesh->deg.dp;
        cfg->parallel.dp = t->dp_size;
    } else if (cfg->parallel.dp > 1) {
        return pt_errorf(PT_ERR_CONFIG, "parallel.dp = %d needs MPI: run under mpirun -np N",
                         cfg->parallel.dp);
    }
    if (cfg->training.global_batch % (t->dp_size * cfg->training.micro_batch) != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "training.global_batch (%d) must be divisible by dp × micro_batch = %d × %d",
                         cfg->training.global_batch, t->dp_size, cfg->training.micro_batch);

    pt_gemm_lib lib = !strcmp(cfg->training.gemm, "openblas") ? PT_GEMM_OPENBLAS : PT_GEMM_ONEDNN;
    t->be = pt_backend_cpu_create(cfg->training.threads, lib);
    if (!t->be) return PT_ERR_RUNTIME;
    pt_log_info("backend: %s", t->be->describe(t->be));

    PT_TRY(pt_data_open(&t->data, cfg->data.train, cfg->training.seq_len, cfg->data.shuffle,
                        cfg->training.seed, cfg->model.vocab_size));
    pt_log_info("data: %d shard(s), %lld rows of %d tokens", t->data.n_shards,
                (long long)t->data.n_rows, cfg->training.seq_len);

    int red = t->dpc ? t->dpc->size : 1; /* ranks that share the gradient reduction */
    int zero = red > 1 ? cfg->parallel.zero : 0;
    if (cfg->parallel.zero > 0 && red == 1)
        pt_log_info("parallel.zero = %d with dp = 1: one rank holds every shard (same as ZeRO-0)",
                    cfg->parallel.zero);
    /* tensor parallelism: this rank's blocks of every tensor */
    pt_model_parallel par = {.tp = 1};
    if (t->mesh && t->mesh->deg.tp > 1) {
        PT_TRY(pt_model_check_tp(&cfg->model, t->mesh->deg.tp));
        par.tp = t->mesh->deg.tp;
        par.tp_rank = t->mesh->tp_i;
        par.sp = cfg->parallel.sp;
        /* the rows of a micro-batch this rank's tp group holds (its share of each sequence) */
        int mbt = cfg->training.micro_batch * (cfg->training.seq_len / t->mesh->deg.cp);
        if (par.sp && mbt % par.tp != 0)
            return pt_errorf(PT_ERR_CONFIG, "parallel.sp: micro_batch × seq_len / cp = %d rows must "
                             "be divisible by tp = %d", mbt, par.tp);
        pt_local_dims ld = pt_model_local_dims(&cfg->model, par.tp, par.tp_rank);
        if (ld.kv_shared > 1) pt_mesh_make_kv(t->mesh, ld.kv_shared);
        par.tp_ops = pt_tp_create(t->be, t->mesh->tp, ld.kv_shared > 1 ? t->mesh->kv : NULL, par.sp,
                                  ld.V, ld.v0, ld.v_valid, mbt);
    }
    /* expert parallelism: this rank's experts of every MoE layer */
    int ep = t->mesh ? t->mesh->deg.ep : 1;
    if (ep > 1) {
        if (cfg->model.n_experts == 0 || cfg->model.n_experts % ep != 0)
            return pt_errorf(PT_ERR_CONFIG, "parallel.ep = %d must divide model.n_experts = %d", ep,
                             cfg->model.n_experts);
        par.ep = ep;
        par.ep_rank = t->mesh->ep_i;
        par.ep_ops = pt_ep_create(t->be, t->mesh->ep, cfg->model.n_experts, cfg->model.top_k,
                                  cfg->model.capacity_factor, cfg->model.dim);
        /* ZeRO-1 shards the regions in flat buckets (the dense one padded to the group); 2 and
         * 3 in whole units, padded per bucket */
        par.ep_zero_group = zero == 1 ? red : zero > 1 ? 1 : 0;
    }
    /* context parallelism: this rank's share of every sequence */
    int cp = t->mesh ? t->mesh->deg.cp : 1;
    if (cp > 1) {
        par.cp = cp;
        int zigzag = !strcmp(cfg->parallel.cp_layout, "zigzag");
        int unit = zigzag ? 2 * cp : cp;
        if (cfg->training.seq_len % unit != 0)
            return pt_errorf(PT_ERR_CONFIG, "parallel.cp = %d (%s): training.seq_len = %d must be a "
                             "multiple of %d", cp, cfg->parallel.cp_layout, cfg->training.seq_len, unit);
        int Tl = cfg->training.seq_len / cp, tp = t->mesh->deg.tp;
        pt_local_dims ld = pt_model_local_dims(&cfg->model, tp, t->mesh->tp_i);
        par.cp_ops = pt_cp_create(t->be, t->mesh->cp, zigzag, cfg->parallel.overlap,
                                  cfg->training.micro_batch * Tl, ld.H, ld.KV,
                                  cfg->model.dim / cfg->model.n_heads, Tl);
    }
    /* pipeline parallelism: this rank's stages, as model chunks */
    int pp = t->mesh ? t->mesh->deg.pp : 1;
    pt_sched_kind sched = PT_SCHED_1F1B;
    if (pp > 1) {
        PT_TRY(pt_schedule_parse_kind(cfg->parallel.pp_schedule, &sched));
        int v = cfg->parallel.pp_virtual;
        if (v > 1 && sched != PT_SCHED_INTERLEAVED)
            return pt_errorf(PT_ERR_CONFIG, "parallel.pp_virtual = %d needs parallel.pp_schedule = "
                             "interleaved", v);
        if (sched == PT_SCHED_INTERLEAVED && v < 2)
            return pt_errorf(PT_ERR_CONFIG, "the interleaved schedule needs parallel.pp_virtual >= 2");
        if (zero >= 2)
            return pt_errorf(PT_ERR_CONFIG, "parallel.pp > 1 with parallel.zero = %d: ZeRO-2/3 "
                             "reduce (and gather) every micro-batch, m times the traffic under a "
                             "pipeline; use ZeRO-0 or 1 (docs/parallelism.md)", zero);
        if (sched == PT_SCHED_INTERLEAVED && !cfg->parallel.pp_layers[0] &&
            cfg->model.n_layers % (pp * v) != 0)
            return pt_errorf(PT_ERR_CONFIG, "interleaved: pp × pp_virtual = %d must divide "
                             "model.n_layers = %d (or give parallel.pp_layers)", pp * v,
                             cfg->model.n_layers);
        pt_chunk stages[PT_MAX_CHUNKS * 16];
        if (pp * v > (int)(sizeof stages / sizeof *stages))
            return pt_errorf(PT_ERR_CONFIG, "pipeline: too many stages (%d)", pp * v);
        if (v > PT_MAX_CHUNKS)
            return pt_errorf(PT_ERR_CONFIG, "parallel.pp_virtual = %d exceeds %d", v, PT_MAX_CHUNKS);
        PT_TRY(pt_pipe_split(&cfg->model, pp * v,
                             sched == PT_SCHED_INTERLEAVED && !cfg->parallel.pp_layers[0] ? "" :
                             cfg->parallel.pp_layers, stages));
        if (sched == PT_SCHED_INTERLEAVED && !cfg->parallel.pp_layers[0]) {
            int k = cfg->model.n_layers / (pp * v); /* chunks of equal layers */
            for (int i = 0; i < pp * v; i++) stages[i] = (pt_chunk){i * k, (i + 1) * k};
        }
        par.n_chunks = v;
        for (int c = 0; c < v; c++) par.chunk[c] = stages[c * pp + t->mesh->pp_i];
    }
    pt_param_table local;
    pt_param_table_build_local(&local, &cfg->model, &par);
    size_t total = local.total, dense = total; /* dense: where the experts start */
    for (int i = 0; i < local.n; i++)
        if (local.p[i].expert >= 0 && local.p[i].offset < dense) dense = local.p[i].offset;
    pt_param_table_free(&local);
    int edp = ep > 1 ? t->mesh->edp->size : 1;
    size_t alloc = ep > 1 ? dense + pt_dp_padded_total(total - dense, edp, zero)
                          : pt_dp_padded_total(total, red, zero);
    PT_TRY(pt_model_init_ex(&t->model, &cfg->model, t->be, alloc, pt_dp_model_flags(zero), &par));
    if (t->dpc && ep > 1) {
        /* the dense tensors reduced over the data ranks, the experts (last in the table) over the
         * ranks that hold the same experts, each region by its own instance */
        PT_TRY(pt_dp_init_region(&t->dp, t->dpc, &t->model, zero, 0, dense, cfg->parallel.bucket_mb,
                                 cfg->parallel.overlap));
        if (edp > 1 || zero >= 2) /* (ZeRO-2/3 keep the experts' state in its shards, even alone) */
            PT_TRY(pt_dp_init_region(&t->dpe, t->mesh->edp, &t->model, zero, dense, alloc,
                                     cfg->parallel.bucket_mb, cfg->parallel.overlap));
    } else if (t->dpc) {
        PT_TRY(pt_dp_init(&t->dp, t->dpc, &t->model, zero, cfg->parallel.bucket_mb,
                          cfg->parallel.overlap));
    }
    float *host = pt_malloc(t->model.gtable.total * sizeof(float));
    pt_status st = PT_OK;
    if (cfg->init_from[0]) {
        st = pt_ckpt_load_weights_host(cfg->init_from, &t->model, host);
        if (st == PT_OK) pt_log_info("weights: loaded from %s", cfg->init_from);
    } else {
        pt_model_init_weights_host(&t->model, cfg->training.seed, host);
    }
    if (st == PT_OK) pt_trainer_set_params(t, host);
    free(host);
    PT_TRY(st);
    pt_optim_config oc = {
        .lr = cfg->optimizer.lr,
        .beta1 = cfg->optimizer.beta1,
        .beta2 = cfg->optimizer.beta2,
        .eps = cfg->optimizer.eps,
        .weight_decay = cfg->optimizer.weight_decay,
        .grad_clip = cfg->optimizer.grad_clip,
        .schedule = pt_schedule_id(cfg->optimizer.schedule),
        .warmup_steps = cfg->optimizer.warmup_steps,
        .total_steps = cfg->training.steps,
        .min_lr = cfg->optimizer.min_lr,
    };
    int n_ranges = 1;
    pt_optim_range *ranges = t->dpc ? pt_dp_owned_ranges(&t->dp, &n_ranges) : NULL;
    if (ranges && ep > 1 && zero > 0) {
        /* and the experts' region: its slices over the expert-data ranks, or all of it */
        int n_e = 1;
        pt_optim_range *re = t->dpe.model ? pt_dp_owned_ranges(&t->dpe, &n_e) : NULL;
        ranges = realloc(ranges, (size_t)(n_ranges + n_e) * sizeof *ranges);
        PT_ASSERT(ranges != NULL);
        if (re)
            memcpy(ranges + n_ranges, re, (size_t)n_e * sizeof *re);
        else
            ranges[n_ranges] = (pt_optim_range){.lo = dense, .hi = alloc};
        n_ranges += n_e;
        free(re);
    }
    pt_optim_init(&t->opt, &oc, &t->model, ranges, n_ranges);
    free(ranges);

    if (cfg->checkpoint.resume[0]) {
        char dir[PT_PATH_MAX + 32];
        if (!strcmp(cfg->checkpoint.resume, "latest")) {
            if (pt_ckpt_find_latest(cfg->checkpoint.dir, dir, sizeof dir) != PT_OK) dir[0] = 0;
        } else {
            snprintf(dir, sizeof dir, "%s", cfg->checkpoint.resume);
        }
        if (dir[0]) {
            PT_TRY(pt_trainer_load(t, dir));
            pt_log_info("resumed from %s at step %lld", dir, (long long)t->step);
        } else {
            pt_log_info("no checkpoint in %s: starting from scratch", cfg->checkpoint.dir);
        }
    }

    int G = cfg->training.global_batch, mb = cfg->training.micro_batch, T = cfg->training.seq_len;
    int per_rank = G / t->dp_size, Tl = T / cp; /* Tl: this rank's tokens of a sequence */
    if (pp > 1) {
        PT_TRY(pt_pipe_init(&t->pipe, &t->model, t->mesh->pp, sched, cfg->parallel.pp_virtual,
                            per_rank / mb, mb, Tl));
        pt_log_info("pipeline: %d stages, schedule %s, %d micro-batches; this rank's layers %d-%d%s",
                    pp * cfg->parallel.pp_virtual, pt_schedule_kind_name(sched), per_rank / mb,
                    par.chunk[0].l0, par.chunk[0].l1 - 1, par.n_chunks > 1 ? " (first chunk)" : "");
    } else {
        t->acts = pt_acts_create(&t->model, mb, Tl);
    }
    t->h_inputs = pt_malloc((size_t)G * T * sizeof(int32_t));
    t->h_targets = pt_malloc((size_t)G * T * sizeof(int32_t));
    /* this rank's rows of the global batch: every micro-batch, since a pipeline has several in
     * flight */
    t->d_inputs = t->be->alloc(t->be, (size_t)per_rank * Tl * sizeof(int32_t));
    t->d_targets = t->be->alloc(t->be, (size_t)per_rank * Tl * sizeof(int32_t));
    t->l_inputs = pt_malloc((size_t)per_rank * Tl * sizeof(int32_t));
    t->l_targets = pt_malloc((size_t)per_rank * Tl * sizeof(int32_t));
    /* the global positions of this rank's tokens (all of them without context parallelism) */
    t->d_pos = t->be->alloc(t->be, (size_t)Tl * sizeof(int32_t));
    t->pos = pt_malloc((size_t)Tl * sizeof(int32_t));
    pt_cp_positions(cp, !strcmp(cfg->parallel.cp_layout, "zigzag"), t->mesh ? t->mesh->cp_i : 0,
                    Tl, t->pos);
    t->be->upload(t->be, t->d_pos, t->pos, (size_t)Tl * sizeof(int32_t));

    if (cfg->logging.metrics[0] && (!t->mesh || t->mesh->world_rank == 0)) {
        char dir[PT_PATH_MAX];
        snprintf(dir, sizeof dir, "%s", cfg->logging.metrics);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir) { /* its directory, made if missing */
            *slash = 0;
            if (pt_mkdirs(dir) != PT_OK)
                return pt_errorf(PT_ERR_IO, "logging.metrics: cannot create the directory %s", dir);
        }
        t->metrics = fopen(cfg->logging.metrics, "a");
        if (!t->metrics)
            return pt_errorf(PT_ERR_IO, "logging.metrics: cannot open %s for appending",
                             cfg->logging.metrics);
    }
    t->peak_flops = pt_measure_gemm_peak(t->be);
    t->flops_per_token = pt_model_flops_per_token(&cfg->model, T);
    size_t mine = 0;
    for (int i = 0; i < t->model.table.n; i++) mine += t->model.table.p[i].numel;
    pt_log_info("model: %.2fM parameters (%.2fM on this rank), %d layers, dim %d, heads %d/%d, "
                "ffn %d, vocab %d%s", (double)t->model.gtable.total / 1e6, (double)mine / 1e6,
                cfg->model.n_layers, cfg->model.dim, cfg->model.n_heads,
                cfg->model.n_kv_heads, cfg->model.ffn_dim, cfg->model.vocab_size,
                cfg->model.tied_embeddings ? ", tied" : "");
    if (t->mesh)
        pt_log_info("layout: %d ranks = dp %d × pp %d × cp %d × tp %d%s, ep %d; ZeRO-%d, %d "
                    "gradient buckets", t->mesh->world_size, t->dp_size, pp, cp, t->mesh->deg.tp,
                    par.sp ? " (sp)" : "", ep, zero, t->dpc ? t->dp.n_buckets + t->dpe.n_buckets : 0);
    pt_dp_memory mem = pt_trainer_memory(t);
    char acts[64]; /* a pipeline's (and expert parallelism's) are known once a step ran */
    if (t->pipe.model || ep > 1)
        snprintf(acts, sizeof acts, "activations in the run report");
    else
        snprintf(acts, sizeof acts, "activations %.3f MiB", pt_trainer_act_bytes(t) / 1048576.0);
    pt_log_info("memory per rank: parameters %.3f MiB, gradients %.3f MiB, optimizer %.3f MiB, "
                "%s; sgemm peak %.0f GFLOP/s", mem.params / 1048576.0, mem.grads / 1048576.0,
                mem.optim / 1048576.0, acts, t->peak_flops / 1e9);
    return PT_OK;
}

void pt_trainer_set_params(pt_trainer *t, const float *host) {
    float *local = pt_calloc(t->model.table.total, sizeof(float)); /* padding: zeros */
    pt_param_table_to_local(&t->model.table, host, local);
    if (t->dpc) {
        pt_dp_set_params(&t->dp, local);
        if (t->dpe.model && t->dpe.zero == 3) pt_dp_set_params(&t->dpe, local);
    } else
        t->be->upload(t->be, t->model.params, local, t->model.table.total * sizeof(float));
    free(local);
}

/* A host array of the local table assembled into the global one on every rank: each block's
 * owner contributes it, the tp ranks sum (x + 0 is exact). */
static void pt_trainer_to_global(pt_trainer *t, const float *local, float *host) {
    memset(host, 0, t->model.gtable.total * sizeof(float));
    pt_param_table_to_global(&t->model.table, local, host);
    if (t->model.par.ep_zero_group && t->model.par.ep_rank > 0)
        for (int i = 0; i < t->model.table.n; i++) { /* owned by all with ZeRO: the first's */
            const pt_param *gp = &t->model.gtable.p[t->model.table.p[i].gindex];
            if (t->model.table.p[i].expert < 0)
                memset(host + gp->offset, 0, gp->numel * sizeof(float));
        }
    if (t->model.par.tp > 1)
        pt_allreduce_sum(t->mesh->tp, host, t->model.gtable.total, PT_DTYPE_F32);
    if (t->mesh && t->mesh->deg.pp > 1) /* the stages hold disjoint tensors */
        pt_allreduce_sum(t->mesh->pp, host, t->model.gtable.total, PT_DTYPE_F32);
    if (t->model.par.ep > 1) /* so do the expert ranks (their experts; the rest from the first) */
        pt_allreduce_sum(t->mesh->ep, host, t->model.gtable.total, PT_DTYPE_F32);
}

void pt_trainer_get_params(pt_trainer *t, float *host) {
    float *local = pt_malloc(t->model.table.total * sizeof(float));
    if (t->dpc) {
        pt_dp_get_params(&t->dp, local);
        if (t->dpe.model && t->dpe.zero == 3) pt_dp_get_params(&t->dpe, local);
    } else
        t->be->download(t->be, local, t->model.params, t->model.table.total * sizeof(float));
    pt_trainer_to_global(t, local, host);
    free(local);
}

size_t pt_trainer_act_bytes(const pt_trainer *t) {
    /* plus ring attention's buffers (context parallelism) */
    return (t->pipe.model ? pt_pipe_peak_bytes(&t->pipe) : pt_acts_bytes(t->acts)) +
           pt_cp_bytes(t->model.par.cp_ops);
}

pt_dp_memory pt_trainer_memory(const pt_trainer *t) {
    if (t->dpc) {
        pt_dp_memory m = pt_dp_memory_bytes(&t->dp, t->opt.n);
        if (t->dpe.model && t->dpe.zero >= 2) { /* the experts' shards and pooled buffers */
            pt_dp_memory e = pt_dp_memory_bytes(&t->dpe, 0);
            m.grads += e.grads;
            if (t->dpe.zero == 3) m.params += e.params;
            m.params_transient += e.params_transient;
            m.grads_transient += e.grads_transient;
        }
        return m;
    }
    size_t full = t->model.alloc_total * sizeof(float);
    return (pt_dp_memory){full, full, 2 * t->opt.n * sizeof(float), 0, 0};
}

/* The owned ranges clipped to the table, in the optimizer's order. */
static size_t pt_range_len(const pt_trainer *t, const pt_optim_range *rg) {
    size_t hi = rg->hi < t->model.table.total ? rg->hi : t->model.table.total;
    return hi > rg->lo ? hi - rg->lo : 0;
}

pt_status pt_trainer_load(pt_trainer *t, const char *dir) {
    pt_ckpt *c;
    const pt_param_table *gt = &t->model.gtable;
    PT_TRY(pt_ckpt_open(&c, dir, gt));
    float *host = pt_malloc(gt->total * sizeof(float));
    pt_status st = PT_OK;
    for (int i = 0; i < gt->n && st == PT_OK; i++) {
        const pt_param *p = &gt->p[i];
        st = pt_ckpt_read_block(c, PT_CKPT_PARAMS, i, 0, p->shape[0], 0,
                                p->ndim == 2 ? p->shape[1] : 1, host + p->offset);
    }
    if (st == PT_OK) pt_trainer_set_params(t, host);
    /* the moments of the ranges this rank's optimizer owns, block by block */
    pt_block *blocks = pt_malloc(3 * (size_t)t->model.table.n * sizeof *blocks);
    for (int r = 0; r < t->opt.n_ranges && st == PT_OK; r++) {
        const pt_optim_range *rg = &t->opt.ranges[r];
        size_t len = pt_range_len(t, rg);
        if (!len) continue;
        float *m1 = pt_calloc(len, sizeof(float)), *m2 = pt_calloc(len, sizeof(float));
        int nb = pt_param_table_blocks(&t->model.table, rg->lo, rg->lo + len, 0, blocks);
        for (int k = 0; k < nb && st == PT_OK; k++) {
            const pt_block *bk = &blocks[k];
            size_t at = bk->lo - rg->lo;
            st = pt_ckpt_read_block(c, PT_CKPT_EXP_AVG, bk->tensor, bk->r0, bk->r1, bk->c0, bk->c1,
                                    m1 + at);
            if (st == PT_OK)
                st = pt_ckpt_read_block(c, PT_CKPT_EXP_AVG_SQ, bk->tensor, bk->r0, bk->r1, bk->c0,
                                        bk->c1, m2 + at);
        }
        t->be->upload(t->be, t->opt.m + rg->off, m1, len * sizeof(float));
        t->be->upload(t->be, t->opt.v + rg->off, m2, len * sizeof(float));
        free(m1);
        free(m2);
    }
    free(blocks);
    t->step = pt_ckpt_step(c);
    t->opt.step = pt_ckpt_optimizer_step(c);
    free(host);
    pt_ckpt_close(c);
    return st;
}

pt_status pt_trainer_unsplit(pt_trainer *t, pt_model *out, int on_this_rank) {
    float *host = pt_malloc(t->model.gtable.total * sizeof(float));
    pt_trainer_get_params(t, host);
    pt_status st = PT_OK;
    if (on_this_rank) {
        st = pt_model_init(out, &t->model.cfg, t->be);
        if (st == PT_OK)
            t->be->upload(t->be, out->params, host, t->model.gtable.total * sizeof(float));
    }
    free(host);
    return st;
}

void pt_trainer_free(pt_trainer *t) {
    if (t->mesh) {
        if (t->dpe.model) pt_dp_free(&t->dpe);
        if (t->dpc && t->dp.model) pt_dp_free(&t->dp);
        pt_mesh_free(t->mesh);
        free(t->mesh);
        t->mesh = NULL;
    }
    if (!t->be) return;
    if (t->metrics) fclose(t->metrics);
    if (t->acts) pt_acts_free(&t->model, t->acts);
    pt_pipe_free(&t->pipe);
    pt_tp_free((pt_tp_ops *)t->model.par.tp_ops);
    pt_cp_free((pt_cp_ops *)t->model.par.cp_ops);
    pt_ep_free((pt_ep_ops *)t->model.par.ep_ops);
    t->be->free(t->be, t->d_inputs);
    t->be->free(t->be, t->d_targets);
    t->be->free(t->be, t->d_pos);
    free(t->pos);
    free(t->l_inputs);
    free(t->l_targets);
    free(t->h_inputs);
    free(t->h_targets);
    if (t->opt.m) pt_optim_free(&t->opt, &t->model);
    pt_model_free(&t->model);
    pt_data_close(&t->data);
    t->be->destroy(t->be);
    memset(t, 0, sizeof *t);
}

static pt_status pt_dump_grads(pt_trainer *t, const char *path);

/* Auxiliary-loss-free balancing (DeepSeek-V3): each MoE layer's selection bias moves by the rate
 * toward balance, up for the experts that got fewer token-slots than the mean in this step, down
 * for those that got more (the load is the whole step's, the same on every rank). Each rank moves
 * the part its optimizer owns (with ZeRO, a slice), before the parameters are gathered. */
static void pt_trainer_bias_update(pt_trainer *t) {
    const pt_model_config *mc = &t->cfg.model;
    float *b = pt_malloc((size_t)mc->n_experts * sizeof *b);
    for (int r = 0; r < t->opt.n_ranges; r++) {
        const pt_optim_range *rg = &t->opt.ranges[r];
        for (int i = 0; i < t->model.table.n; i++) {
            const pt_param *p = &t->model.table.p[i];
            size_t lo = p->offset > rg->lo ? p->offset : rg->lo;
            size_t hi = p->offset + p->numel < rg->hi ? p->offset + p->numel : rg->hi;
            if (p->kind != PT_KIND_ROUTER_BIAS || hi <= lo) continue;
            const double *ld = t->model.expert_load + (size_t)p->layer * mc->n_experts;
            double mean = 0;
            for (int e = 0; e < mc->n_experts; e++) mean += ld[e] / mc->n_experts;
            float *at = rg->param + (lo - rg->lo);
            t->be->download(t->be, b, at, (hi - lo) * sizeof *b);
            for (size_t k = 0; k < hi - lo; k++) {
                size_t e = lo - p->offset + k;
                b[k] += mc->bias_rate * (ld[e] < mean ? 1.0f : ld[e] > mean ? -1.0f : 0.0f);
            }
            t->be->upload(t->be, at, b, (hi - lo) * sizeof *b);
        }
    }
    free(b);
}

pt_status pt_trainer_step(pt_trainer *t, pt_step_stats *s) {
    const pt_config *cfg = &t->cfg;
    pt_backend *be = t->be;
    int G = cfg->training.global_batch, mb = cfg->training.micro_batch, T = cfg->training.seq_len;
    int per_rank = G / t->dp_size, n_micro = per_rank / mb;
    int cp = t->model.par.cp > 1 ? t->model.par.cp : 1, Tl = T / cp;
    double t0 = pt_now();
    double pp_wait0 = t->pipe.model ? t->mesh->pp->stats.wait_seconds : 0;
    int64_t pairs0 = pt_cp_attn_pairs(t->model.par.cp_ops);

    /* the whole global batch is read first: its count of valid targets scales every micro-batch
     * on every rank, so any split over ranks and micro-batches gives the same step */
    pt_data_batch(&t->data, t->step, G, 0, G, t->h_inputs, t->h_targets);
    int64_t n_valid = 0;
    for (size_t i = 0; i < (size_t)G * T; i++) n_valid += t->h_targets[i] >= 0;
    float loss_scale = n_valid > 0 ? 1.0f / (float)n_valid : 0.0f;

    if (t->dpc) {
        pt_dp_begin_step(&t->dp);
        if (t->dpe.model && t->dpe.zero >= 2) pt_dp_begin_step(&t->dpe); /* its shards */
    } else
        pt_model_zero_grads(&t->model);
    double loss_sum = 0;
    t->model.aux_scale = 1.0 / G; /* the balancing losses: a mean over the batch's sequences */
    t->model.aux_loss = t->model.z_loss = 0;
    t->model.a2a_sent = t->model.a2a_recv = 0;
    size_t n_load = t->model.expert_load ? (size_t)cfg->model.n_layers * cfg->model.n_experts : 0;
    if (n_load) memset(t->model.expert_load, 0, n_load * sizeof(double));
    /* this rank's rows of the global batch, [dp_rank·per_rank, (dp_rank+1)·per_rank), and of
     * each row its tokens (context parallelism: those at its positions) */
    for (int b = 0; b < per_rank; b++) {
        size_t row = ((size_t)t->dp_rank * per_rank + b) * T;
        for (int i = 0; i < Tl; i++) {
            t->l_inputs[(size_t)b * Tl + i] = t->h_inputs[row + t->pos[i]];
            t->l_targets[(size_t)b * Tl + i] = t->h_targets[row + t->pos[i]];
        }
    }
    size_t bytes = (size_t)per_rank * Tl * sizeof(int32_t);
    be->upload(be, t->d_inputs, t->l_inputs, bytes);
    be->upload(be, t->d_targets, t->l_targets, bytes);
    if (t->pipe.model) {
        /* the schedule runs every micro-batch; the data-parallel reduction follows it */
        if (t->dpc) pt_dp_begin_micro(&t->dp, 0);
        if (t->dpe.model) pt_dp_begin_micro(&t->dpe, 0);
        loss_sum = pt_pipe_step(&t->pipe, t->d_inputs, t->d_targets, t->d_pos, loss_scale);
        if (cfg->model.tied_embeddings && t->mesh->emb->size > 1) /* its copy's gradient too */
            for (int i = 0; i < t->model.table.n; i++) {
                const pt_param *p = &t->model.table.p[i];
                if (p->kind == PT_KIND_EMBED)
                    pt_allreduce_sum(t->mesh->emb, t->model.grads + p->offset, p->numel, PT_DTYPE_F32);
            }
        if (t->dpc) {
            pt_dp_begin_micro(&t->dp, 1);
            pt_dp_end_micro(&t->dp, 1);
        }
        if (t->dpe.model) {
            pt_dp_begin_micro(&t->dpe, 1);
            pt_dp_end_micro(&t->dpe, 1);
        }
        pt_allreduce_sum(t->mesh->pp, &loss_sum, 1, PT_DTYPE_F64); /* the last stage's */
    }
    for (int k = 0; k < n_micro && !t->pipe.model; k++) {
        size_t at = (size_t)k * mb * Tl;
        int last = k == n_micro - 1;
        if (t->dpc) pt_dp_begin_micro(&t->dp, last);
        if (t->dpe.model) pt_dp_begin_micro(&t->dpe, last);
        loss_sum += pt_model_forward(&t->model, t->acts, t->d_inputs + at, t->d_targets + at,
                                     t->d_pos, loss_scale, NULL);
        pt_model_backward(&t->model, t->acts, t->d_inputs + at);
        if (t->dpc) pt_dp_end_micro(&t->dp, last);
        if (t->dpe.model) pt_dp_end_micro(&t->dpe, last);
    }
    /* Σ g² over what this rank owns (replicas counted once); with ZeRO the data ranks own
     * disjoint parts, the tp ranks always do: each sums over its group */
    double sumsq = pt_grad_sumsq_owned(&t->opt, &t->model);
    double aux[2] = {t->model.aux_loss, t->model.z_loss};
    if (t->dpc) {
        double red[4] = {loss_sum, t->dp.zero ? sumsq : 0.0, aux[0], aux[1]};
        pt_allreduce_sum(t->dpc, red, 4, PT_DTYPE_F64);
        loss_sum = red[0];
        if (t->dp.zero) sumsq = red[1];
        aux[0] = red[2], aux[1] = red[3];
    }
    if (t->pipe.model) pt_allreduce_sum(t->mesh->pp, aux, 2, PT_DTYPE_F64); /* per stage */
    /* expert load over the whole step: every data rank's tokens, every stage's layers */
    if (n_load && t->dpc) pt_allreduce_sum(t->dpc, t->model.expert_load, n_load, PT_DTYPE_F64);
    if (n_load && t->pipe.model) pt_allreduce_sum(t->mesh->pp, t->model.expert_load, n_load, PT_DTYPE_F64);
    if (t->model.par.tp > 1) pt_allreduce_sum(t->mesh->tp, &sumsq, 1, PT_DTYPE_F64);
    if (t->pipe.model) pt_allreduce_sum(t->mesh->pp, &sumsq, 1, PT_DTYPE_F64);
    /* without ZeRO the experts' ranks hold disjoint experts (the dense tensors counted by the
     * first); with it the data group (which holds the ep group) has summed everything */
    if (t->model.par.ep > 1 && !t->dp.zero)
        pt_allreduce_sum(t->mesh->ep, &sumsq, 1, PT_DTYPE_F64);
    double norm = sqrt(sumsq);
    if (!isfinite(norm))
        return pt_errorf(PT_ERR_RUNTIME, "step %lld: gradient norm is %f (diverged)",
                         (long long)t->step + 1, norm);
    if (cfg->logging.dump_grads[0] && !t->grads_dumped) {
        PT_TRY(pt_dump_grads(t, cfg->logging.dump_grads));
        t->grads_dumped = 1;
    }
    float lr = pt_lr_at(&t->opt.cfg, t->step);
    pt_optim_step(&t->opt, &t->model, lr, pt_clip_coef(norm, cfg->optimizer.grad_clip));
    if (cfg->model.bias_rate > 0) pt_trainer_bias_update(t);
    if (t->dpc) pt_dp_gather_params(&t->dp);
    if (t->dpe.model) pt_dp_gather_params(&t->dpe);
    be->synchronize(be);
    t->step++;

    s->step = t->step;
    s->loss = n_valid > 0 ? loss_sum / (double)n_valid : 0.0;
    s->grad_norm = norm;
    s->aux_loss = aux[0];
    s->z_loss = aux[1];
    s->lr = lr;
    s->tokens = (int64_t)G * T;
    s->seconds = pt_now() - t0;
    s->n_stages = 0;
    s->n_cp = 0;
    if (t->model.par.cp > 1 && t->model.par.cp <= 64) {
        /* each context rank's attention work, to see the balance of the layouts */
        double mine = (double)(pt_cp_attn_pairs(t->model.par.cp_ops) - pairs0);
        s->n_cp = t->model.par.cp;
        pt_allgather(t->mesh->cp, &mine, s->attn_pairs, 1, PT_DTYPE_F64);
    }
    if (t->pipe.model && t->mesh->deg.pp <= 64) {
        /* each stage's idle share: its time blocked on pipeline transfers, gathered */
        double mine = (t->mesh->pp->stats.wait_seconds - pp_wait0) / s->seconds;
        s->n_stages = t->mesh->deg.pp;
        pt_allgather(t->mesh->pp, &mine, s->idle, 1, PT_DTYPE_F64);
    }
    s->tokens_per_s = (double)s->tokens / s->seconds;
    /* MFU per rank: the model FLOPs of the tokens over every rank's peak (each rank does its
     * share of them: its data rows, its tensor blocks, its pipeline stages) */
    int ranks = t->mesh ? t->mesh->world_size : 1;
    s->mfu = t->flops_per_token * s->tokens_per_s / ranks / t->peak_flops;
    return PT_OK;
}

/* The gradients as the optimizer sees them (reduced over the group), gathered on every rank from
 * the ranges each owns, and written by rank 0. */
static pt_status pt_dump_grads(pt_trainer *t, const char *path) {
    size_t n = t->model.table.total;
    float *h = pt_calloc(n, sizeof(float));
    for (int r = 0; r < t->opt.n_ranges; r++) {
        const pt_optim_range *rg = &t->opt.ranges[r];
        size_t len = pt_range_len(t, rg);
        if (len) t->be->download(t->be, h + rg->lo, rg->grad, len * sizeof(float));
    }
    if (t->dpc && t->dp.zero && t->model.par.ep > 1) {
        /* the dense slices over the data ranks, the experts' over the ranks holding them */
        pt_allreduce_sum(t->dpc, h, t->dp.region_hi, PT_DTYPE_F32);
        if (t->dpe.model)
            pt_allreduce_sum(t->mesh->edp, h + t->dpe.region_lo, n - t->dpe.region_lo, PT_DTYPE_F32);
    } else if (t->dpc && t->dp.zero) {
        pt_allreduce_sum(t->dpc, h, n, PT_DTYPE_F32);
    }
    float *g = pt_malloc(t->model.gtable.total * sizeof(float));
    pt_trainer_to_global(t, h, g);
    pt_status st = PT_OK;
    if (!t->mesh || t->mesh->world_rank == 0) {
        pt_st_writer *w = pt_st_writer_create();
        for (int i = 0; i < t->model.gtable.n && st == PT_OK; i++) {
            const pt_param *p = &t->model.gtable.p[i];
            st = pt_st_writer_add_f32(w, p->name, p->shape, p->ndim, g + p->offset, PT_ST_DTYPE_F32);
        }
        if (st == PT_OK) st = pt_st_writer_write(w, path);
        pt_st_writer_free(w);
    }
    free(h);
    free(g);
    return st;
}

pt_status pt_trainer_save(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    /* the blocks this rank writes: those of the ranges its optimizer owns, of the tensors it owns
     * (tensor-parallel replicas are written once); replicated over the data ranks (ZeRO-0), by
     * the first data rank only */
    int writer = !t->dpc || t->dp.zero > 0 ||
                 (t->model.par.ep > 1 ? t->mesh->edp_i == 0 : t->dp_rank == 0);
    size_t n_host = 0;
    for (int r = 0; r < t->opt.n_ranges; r++) n_host += pt_range_len(t, &t->opt.ranges[r]);
    float *host = pt_malloc((3 * n_host + 1) * sizeof(float)), *at = host;
    pt_block *blocks = pt_malloc(3 * (size_t)t->model.table.n * sizeof *blocks);
    pt_ckpt_piece *pieces = NULL;
    int n_pieces = 0, cap = 0;
    for (int r = 0; r < t->opt.n_ranges && writer; r++) {
        const pt_optim_range *rg = &t->opt.ranges[r];
        size_t len = pt_range_len(t, rg);
        if (!len) continue;
        float *p = at, *m1 = at + len, *m2 = at + 2 * len;
        at += 3 * len;
        t->be->download(t->be, p, rg->param, len * sizeof(float));
        t->be->download(t->be, m1, t->opt.m + rg->off, len * sizeof(float));
        t->be->download(t->be, m2, t->opt.v + rg->off, len * sizeof(float));
        int nb = pt_param_table_blocks(&t->model.table, rg->lo, rg->lo + len, 1, blocks);
        for (int k = 0; k < nb; k++) {
            if (n_pieces == cap) {
                cap = cap ? 2 * cap : 64;
                pieces = realloc(pieces, (size_t)cap * sizeof *pieces);
                PT_ASSERT(pieces != NULL);
            }
            const pt_block *bk = &blocks[k];
            size_t o = bk->lo - rg->lo;
            pieces[n_pieces++] = (pt_ckpt_piece){bk->tensor, bk->r0, bk->r1, bk->c0, bk->c1,
                                                 p + o, m1 + o, m2 + o};
        }
    }
    pt_status st = pt_ckpt_save(cfg->checkpoint.dir, t->step, &t->model, pieces, n_pieces,
                                t->opt.step, cfg, cfg->checkpoint.keep, t->mesh ? t->mesh->world : NULL);
    free(pieces);
    free(blocks);
    free(host);
    if (st == PT_OK)
        pt_log_info("checkpoint: %s/step_%08lld", cfg->checkpoint.dir, (long long)t->step);
    return st;
}

static void pt_fmt_duration(double sec, char *out, size_t cap) {
    long s = (long)(sec + 0.5);
    if (s >= 3600)
        snprintf(out, cap, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else
        snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
}

/* The bar and ETA of a step: "[#####.....] ETA 1m23s". */
static void pt_progress(const pt_trainer *t, int64_t step, double elapsed, int64_t first_step,
                        char *out, size_t cap) {
    int64_t total = t->cfg.training.steps, done = step - first_step;
    double eta = done > 0 ? elapsed / (double)done * (double)(total - step) : 0;
    char eta_s[32], bar[24];
    pt_fmt_duration(eta, eta_s, sizeof eta_s);
    int width = 20, filled = total > 0 ? (int)(width * step / total) : width;
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    snprintf(out, cap, "[%s] ETA %s", bar, eta_s);
}

static void pt_print_step(const pt_trainer *t, const pt_step_stats *s, const char *progress) {
    int64_t total = t->cfg.training.steps;
    pt_log_info("step %*lld/%lld | loss %.4f | gnorm %.3f | lr %.2e | %.0f tok/s | MFU %.1f%% | "
                "mem %.0f MiB | %s",
                (int)snprintf(NULL, 0, "%lld", (long long)total), (long long)s->step,
                (long long)total, s->loss, s->grad_norm, (double)s->lr, s->tokens_per_s,
                100.0 * s->mfu, pt_peak_rss_bytes() / 1048576.0, progress);
}

/* One JSON line per step; every logging.comm_every steps (and at the last) it adds this rank's
 * communication since the previous report, by operation (calls, bus-bandwidth bytes), and its
 * model-state memory. */
/* Bytes of every group so far (bus-bandwidth convention), and microseconds blocked waiting on it,
 * in pt_mesh_groups order (out[i], out[PT_MESH_MAX_GROUPS + i]). */
static void pt_group_bytes(const pt_trainer *t, uint64_t *out) {
    const pt_comm *g[PT_MESH_MAX_GROUPS];
    int n = pt_mesh_groups(t->mesh, g);
    for (int i = 0; i < n; i++) {
        out[i] = 0;
        for (int op = 0; op < PT_COMM_OP_COUNT; op++) out[i] += g[i]->stats.bytes[op];
        out[PT_MESH_MAX_GROUPS + i] = (uint64_t)(g[i]->stats.wait_seconds * 1e6);
    }
}

static void pt_write_metrics(pt_trainer *t, const pt_step_stats *s, pt_comm_stats *since,
                             uint64_t *group_since) {
    fprintf(t->metrics,
            "{\"step\": %lld, \"loss\": %.17g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %lld, "
            "\"seconds\": %.6f, \"tokens_per_s\": %.3f, \"mfu\": %.5f, \"peak_rss_bytes\": %lld",
            (long long)s->step, s->loss, (double)s->lr, s->grad_norm, (long long)s->tokens,
            s->seconds, s->tokens_per_s, s->mfu, (long long)pt_peak_rss_bytes());
    if (t->cfg.model.n_experts > 0) {
        /* per MoE layer: token-slots per expert min, max, mean, max/mean */
        const pt_model_config *mc = &t->cfg.model;
        fprintf(t->metrics, ", \"aux_loss\": %.9g, \"z_loss\": %.9g, \"expert_load\": {", s->aux_loss,
                s->z_loss);
        int first = 1;
        for (int l = 0; l < mc->n_layers; l++) {
            if (!pt_layer_is_moe(mc, l)) continue;
            const double *ld = t->model.expert_load + (size_t)l * mc->n_experts;
            double mn = ld[0], mx = ld[0], sum = 0;
            for (int e = 0; e < mc->n_experts; e++) {
                mn = ld[e] < mn ? ld[e] : mn, mx = ld[e] > mx ? ld[e] : mx;
                sum += ld[e];
            }
            double mean = sum / mc->n_experts;
            fprintf(t->metrics, "%s\"%d\": [%.0f, %.0f, %.2f, %.4f]", first ? "" : ", ", l, mn, mx,
                    mean, mean > 0 ? mx / mean : 0.0);
            first = 0;
        }
        fprintf(t->metrics, "}");
        if (t->model.par.ep > 1)
            fprintf(t->metrics, ", \"ep_rows\": [%lld, %lld]", (long long)t->model.a2a_sent,
                    (long long)t->model.a2a_recv);
    }
    if (s->n_stages) {
        fprintf(t->metrics, ", \"pp_idle\": [");
        for (int i = 0; i < s->n_stages; i++) fprintf(t->metrics, "%s%.4f", i ? ", " : "", s->idle[i]);
        fprintf(t->metrics, "]");
    }
    if (s->n_cp) {
        fprintf(t->metrics, ", \"cp_attn_pairs\": [");
        for (int i = 0; i < s->n_cp; i++) fprintf(t->metrics, "%s%.0f", i ? ", " : "", s->attn_pairs[i]);
        fprintf(t->metrics, "]");
    }
    int64_t every = t->cfg.logging.comm_every;
    if (t->mesh && (s->step % every == 0 || s->step == t->cfg.training.steps)) {
        pt_comm_stats now;
        pt_mesh_stats(t->mesh, &now);
        uint64_t sent = 0;
        char ops[512] = "";
        size_t used = 0;
        for (int op = 0; op < PT_COMM_OP_COUNT; op++) {
            uint64_t b = now.bytes[op] - since->bytes[op], c = now.calls[op] - since->calls[op];
            sent += b;
            if (c && used < sizeof ops)
                used += (size_t)snprintf(ops + used, sizeof ops - used, "%s\"%s\": [%llu, %llu]",
                                         used ? ", " : "", pt_comm_op_name((pt_comm_op)op),
                                         (unsigned long long)c, (unsigned long long)b);
        }
        int64_t steps = s->step % every == 0 ? every : s->step % every;
        pt_dp_memory m = pt_trainer_memory(t);
        /* per group: {"tp": bytes, ...} */
        const pt_comm *g[PT_MESH_MAX_GROUPS];
        uint64_t gnow[2 * PT_MESH_MAX_GROUPS];
        int ng = pt_mesh_groups(t->mesh, g);
        pt_group_bytes(t, gnow);
        char groups[512] = "", waits[512] = "";
        size_t gu = 0, wu = 0;
        for (int i = 0; i < ng && gu < sizeof groups && wu < sizeof waits; i++) {
            if (gnow[i] != group_since[i])
                gu += (size_t)snprintf(groups + gu, sizeof groups - gu, "%s\"%s\": %llu", gu ? ", " : "",
                                       g[i]->name, (unsigned long long)(gnow[i] - group_since[i]));
            uint64_t w = gnow[PT_MESH_MAX_GROUPS + i] - group_since[PT_MESH_MAX_GROUPS + i];
            if (w)
                wu += (size_t)snprintf(waits + wu, sizeof waits - wu, "%s\"%s\": %.6f", wu ? ", " : "",
                                       g[i]->name, (double)w / 1e6);
        }
        memcpy(group_since, gnow, sizeof gnow);
        fprintf(t->metrics,
                ", \"comm_steps\": %lld, \"comm_bytes\": %llu, \"comm_wait_s\": %.6f, \"comm\": {%s}, "
                "\"comm_groups\": {%s}, \"comm_wait_groups\": {%s}, "
                "\"mem\": {\"params\": %zu, \"grads\": %zu, \"optim\": %zu, \"params_transient\": %zu, "
                "\"grads_transient\": %zu, \"activations\": %zu}",
                (long long)steps, (unsigned long long)sent, now.wait_seconds - since->wait_seconds,
                ops, groups, waits, m.params, m.grads, m.optim, m.params_transient, m.grads_transient,
                pt_trainer_act_bytes(t));
        *since = now;
    }
    fprintf(t->metrics, "}\n");
    fflush(t->metrics);
}

pt_status pt_trainer_run(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int64_t first = t->step;
    double start = pt_now();
    /* the line updated in place between logged steps: on a terminal only */
    /* (under mpirun, ranks' stdout is a forwarded pseudo-terminal: no live line there) */
    int live = cfg->logging.progress && isatty(STDOUT_FILENO) && cfg->logging.every > 1 &&
               (!t->mesh || t->mesh->world_size == 1);
    pt_comm_stats since = {0}; /* communication counters at the last metrics report */
    uint64_t group_since[2 * PT_MESH_MAX_GROUPS] = {0};
    if (t->mesh) {
        pt_mesh_stats(t->mesh, &since);
        pt_group_bytes(t, group_since);
    }
    pt_report_mark mark = pt_report_mark_now(t);
    while (t->step < cfg->training.steps) {
        pt_step_stats s;
        PT_TRY(pt_trainer_step(t, &s));
        if (t->metrics) pt_write_metrics(t, &s, &since, group_since);
        char progress[64];
        pt_progress(t, s.step, pt_now() - start, first, progress, sizeof progress);
        if (s.step % cfg->logging.every == 0 || s.step == cfg->training.steps || s.step == first + 1) {
            if (live) printf("\r\033[K");
            pt_print_step(t, &s, progress);
        } else if (live) {
            /* between logged steps, a terminal shows one line that updates in place */
            printf("\r\033[Kstep %lld/%lld | loss %.4f | %s", (long long)s.step,
                   (long long)cfg->training.steps, s.loss, progress);
            fflush(stdout);
        }
        int64_t every = cfg->checkpoint.every;
        if (cfg->checkpoint.dir[0] &&
            ((every > 0 && t->step % every == 0) || t->step == cfg->training.steps)) {
            PT_TRY(pt_trainer_save(t));
        }
        int64_t report = cfg->logging.report_every;
        if ((report > 0 && t->step % report == 0) || t->step == cfg->training.steps) {
            pt_report_print(t, &mark);
            mark = pt_report_mark_now(t);
        }
    }
    return PT_OK;
}

int pt_generate(pt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n_new,
                float temperature, int top_k, uint64_t seed) {
    pt_backend *be = m->be;
    int Tmax = m->cfg.max_seq_len, V = m->cfg.vocab_size;
    pt_acts *a = pt_acts_create(m, 1, Tmax);
    int32_t *ctx = pt_malloc((size_t)(n_prompt + n_new) * sizeof *ctx);
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    int32_t *d_tok = be->alloc(be, (size_t)Tmax * sizeof(int32_t));
    int32_t *d_pos = be->alloc(be, (size_t)Tmax * sizeof(int32_t));
    int32_t *pos = pt_malloc((size_t)Tmax * sizeof *pos);
    for (int i = 0; i < Tmax; i++) pos[i] = i;
    be->upload(be, d_pos, pos, (size_t)Tmax * sizeof(int32_t));
    float *logits = pt_malloc((size_t)Tmax * V * sizeof(float));
    float *prob = pt_malloc((size_t)V * sizeof(float));
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    int n = n_prompt;
    for (int k = 0; k < n_new; k++) {
        /* the last Tmax tokens are the context (no KV cache: this is for samples, not serving) */
        int start = n > Tmax ? n - Tmax : 0, T = n - start;
        pt_acts_set_shape(a, 1, T);
        be->upload(be, d_tok, ctx + start, (size_t)T * sizeof(int32_t));
        pt_model_logits(m, a, d_tok, d_pos, logits);
        const float *row = logits + (size_t)(T - 1) * V;
        int next = 0;
        if (temperature <= 0) {
            for (int v = 1; v < V; v++)
                if (row[v] > row[next]) next = v;
        } else {
            /* softmax of logits/temperature over the top_k most likely (all when top_k = 0) */
            float kth = -INFINITY;
            if (top_k > 0 && top_k < V) {
                memcpy(prob, row, (size_t)V * sizeof(float));
                /* partial selection of the k-th largest by repeated max extraction */
                for (int i = 0; i < top_k; i++) {
                    int best = 0;
                    for (int v = 1; v < V; v++)
                        if (prob[v] > prob[best]) best = v;
                    kth = prob[best];
                    prob[best] = -INFINITY;
                }
            }
            float mx = -INFINITY;
            for (int v = 0; v < V; v++)
                if (row[v] > mx) mx = row[v];
            double sum = 0;
            for (int v = 0; v < V; v++) {
                prob[v] = row[v] >= kth ? expf((row[v] - mx) / temperature) : 0.0f;
                sum += prob[v];
            }
            double r = pt_rng_uniform(&rng) * sum, acc = 0;
            next = V - 1;
            for (int v = 0; v < V; v++) {
                acc += prob[v];
                if (acc > r && prob[v] > 0) {
                    next = v;
                    break;
                }
            }
        }
        ctx[n++] = next;
        out[k] = next;
    }
    be->free(be, d_tok);
    be->free(be, d_pos);
    free(pos);
    free(logits);
    free(prob);
    free(ctx);
    pt_acts_free(m, a);
    return n_new;
}
