/* trainer.c: the training loop (see include/pt/trainer.h). */
#include "pt/trainer.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pt/comm.h"

#include "pt/checkpoint.h"
#include "pt/context_parallel.h"
#include "pt/hf_config.h"
#include "pt/preempt.h"
#include "pt/run_lock.h"
#include "pt/safetensors.h"
#include "pt/flight.h"
#include "pt/trace.h"
#include "train/resume.h"

/* data.val and the evaluation's size: eval.tokens rounded up to whole global batches (0: every
 * whole global batch of data.val), which data.val must hold. */
static void pt_trainer_async_init(pt_trainer *t);
static void pt_trainer_async_free(pt_trainer *t);

static pt_status pt_trainer_open_val(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int G = cfg->training.global_batch, T = cfg->training.seq_len;
    PT_TRY(pt_data_open_key(&t->val, "data.val", cfg->data.val, T, 0, 0, cfg->model.vocab_size));
    int64_t per_batch = (int64_t)G * T, rows = t->val.n_rows;
    t->eval_batches = cfg->eval.tokens > 0 ? (cfg->eval.tokens + per_batch - 1) / per_batch
                                           : rows / G;
    if (cfg->eval.tokens > 0 && t->eval_batches * G > rows)
        return pt_errorf(PT_ERR_CONFIG, "eval.tokens = %lld needs %lld sequences of seq_len + 1 "
                         "tokens (%lld global batches of %d) but data.val holds %lld",
                         (long long)cfg->eval.tokens, (long long)(t->eval_batches * G),
                         (long long)t->eval_batches, G, (long long)rows);
    if (t->eval_batches == 0)
        return pt_errorf(PT_ERR_CONFIG, "data.val holds %lld sequences of seq_len + 1 tokens, "
                         "fewer than one global batch (training.global_batch = %d)",
                         (long long)rows, G);
    char when[64] = "at the end";
    if (cfg->eval.every > 0)
        snprintf(when, sizeof when, "every %lld steps and at the end", (long long)cfg->eval.every);
    pt_log_info("eval: %lld tokens (%lld global batches) of data.val's %lld rows, %s",
                (long long)(t->eval_batches * per_batch), (long long)t->eval_batches,
                (long long)rows, when);
    return PT_OK;
}

/* Collective over the world: st, agreed. A failure on any rank (a shard that cannot be read, a
 * directory that cannot be written, the same on every rank more often than not) becomes
 * PT_ERR_CONFIG on every rank, reported once, by rank 0: its own message, else the count. */
static pt_status pt_trainer_agree(pt_trainer *t, pt_status st, const char *what) {
    int32_t failed = st != PT_OK;
    if (t->mesh) pt_allreduce_sum(t->mesh->world, &failed, 1, PT_DTYPE_I32);
    if (!failed) return PT_OK;
    if (st == PT_OK)
        pt_errorf(PT_ERR_CONFIG, "%s failed on %d of the %d ranks (not this one, rank 0)", what,
                  (int)failed, t->mesh ? t->mesh->world_size : 1);
    return PT_ERR_CONFIG;
}

/* Fail early: every rank can create files in checkpoint.dir (each writes its shard there) and in
 * logging.trace (each its trace), and rank 0 opens logging.metrics and logging.tensorboard's
 * event file, before anything is allocated, so that a run never trains for hours to find it
 * cannot save; where a file will be written (metrics, trace, gradients) there is
 * a regular file or nothing (pt_check_output: a FIFO hung the run, a device took or refused the
 * lines). Rank 0 takes checkpoint.dir's run lock (pt/run_lock.h) before
 * it writes anything: a second run on the directory stops here, naming the holder. Collective
 * over the world: every rank learns whether all succeeded and fails alike, with one message
 * (rank 0's: its own failure, else the count). */
static pt_status pt_trainer_check_outputs(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int rank = t->mesh ? t->mesh->world_rank : 0;
    pt_status st = PT_OK;
    if (cfg->checkpoint.dir[0]) st = pt_check_writable_dir(cfg->checkpoint.dir, "checkpoint.dir");
    if (st == PT_OK && cfg->logging.trace[0]) st = pt_check_writable_dir(cfg->logging.trace, "logging.trace");
    if (st == PT_OK && cfg->logging.trace[0]) { /* written at the end, never through a link */
        char path[sizeof cfg->logging.trace + 32], why[1024];
        snprintf(path, sizeof path, "%s/trace-rank%d.json", cfg->logging.trace, rank);
        if ((st = pt_refuse_link(path)) != PT_OK) {
            snprintf(why, sizeof why, "%s", pt_last_error());
            pt_errorf(st, "logging.trace: %s", why);
        } else {
            st = pt_check_output(path, 0, "logging.trace"); /* a FIFO there hung the write */
        }
    }
    /* the flight recorder's state moves beside the trace: it survives a killed rank (pt/flight.h) */
    if (st == PT_OK && cfg->logging.trace[0]) st = pt_flight_file(cfg->logging.trace);
    if (st == PT_OK && rank == 0 && cfg->checkpoint.dir[0])
        st = pt_run_lock_acquire(&t->lock, cfg->checkpoint.dir, cfg->checkpoint.lock_timeout_s);
    if (st == PT_OK && rank == 0) /* ("": the communication counted for the TensorBoard events) */
        st = pt_metrics_open(&t->metrics, cfg->logging.metrics, t->mesh, cfg->training.steps,
                             cfg->logging.comm_every);
    if (st == PT_OK && rank == 0 && cfg->logging.tensorboard[0])
        st = pt_tb_open(&t->tb, cfg->logging.tensorboard, &cfg->model);
    if (st == PT_OK && rank == 0 && cfg->logging.dump_grads[0]) /* written by rename at step 1 */
        st = pt_check_output(cfg->logging.dump_grads, 0, "logging.dump_grads");
    return pt_trainer_agree(t, st, "the check that checkpoint.dir, logging.trace, logging.metrics and "
                                   "logging.tensorboard are writable");
}

/* checkpoint.resume, before the model is allocated: the checkpoint to continue (latest: the
 * newest in checkpoint.dir that verifies; "" when it holds none) and its record of the run that
 * saved it checked against this run (rank 0 reads it; agreed). Collective over the world. */
static pt_status pt_trainer_resume_from(pt_trainer *t, char *dir, size_t cap) {
    const pt_config *cfg = &t->cfg;
    dir[0] = 0;
    if (!cfg->checkpoint.resume[0]) return PT_OK;
    if (!strcmp(cfg->checkpoint.resume, "latest")) {
        PT_TRY(pt_ckpt_find_verified(cfg->checkpoint.dir, t->mesh ? t->mesh->world : NULL, dir, cap));
        if (!dir[0]) { /* (a supervisor's first run resumes "latest" too: not an error) */
            pt_log_warn("checkpoint.resume = latest: %s holds no checkpoint (no step_NNNNNNNN "
                        "directory): training starts from step 0", cfg->checkpoint.dir);
            return PT_OK;
        }
    } else {
        snprintf(dir, cap, "%s", cfg->checkpoint.resume);
    }
    unsigned allow = 0;
    pt_status st = pt_resume_parse_allow(cfg->checkpoint.allow_change, &allow);
    if (st == PT_OK && (!t->mesh || t->mesh->world_rank == 0)) st = pt_resume_check(dir, cfg, allow);
    return pt_trainer_agree(t, st, "the check of what the checkpoint was saved with");
}

/* 1 if the checkpoint directory ckpt lies in root (the same directory, by any path). */
static int pt_in_dir(const char *ckpt, const char *root) {
    char parent[PT_PATH_MAX + 32];
    snprintf(parent, sizeof parent, "%s", ckpt);
    size_t n = strlen(parent);
    while (n > 1 && parent[n - 1] == '/') parent[--n] = 0;
    char *slash = strrchr(parent, '/');
    if (!slash) snprintf(parent, sizeof parent, ".");
    else if (slash == parent) parent[1] = 0;
    else *slash = 0;
    struct stat a, b;
    return root[0] && stat(parent, &a) == 0 && stat(root, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
}

/* This run's identity (pt/checkpoint.h): a resumed run continues its checkpoint's run id; a new
 * one, or one resumed from a checkpoint that records none, makes its own. Rank 0 checks
 * checkpoint.dir for other runs' checkpoints this run would mix with or replace
 * (pt_ckpt_check_dir), before step 1. Collective over the world: every rank learns the id. */
static pt_status pt_trainer_identity(pt_trainer *t, const char *resume) {
    const pt_config *cfg = &t->cfg;
    pt_status st = PT_OK;
    int64_t id = 0;
    if (!t->mesh || t->mesh->world_rank == 0) {
        int64_t from = -1;
        if (resume[0]) pt_ckpt_identity(resume, t->run_id, &from);
        int continued = t->run_id[0] != 0;
        if (!continued) pt_ckpt_new_run_id(t->run_id);
        pt_run_start start = !resume[0]                              ? PT_RUN_NEW
                             : pt_in_dir(resume, cfg->checkpoint.dir) ? PT_RUN_CONTINUED
                                                                      : PT_RUN_RESUMED_ELSEWHERE;
        if (cfg->checkpoint.dir[0]) {
            st = pt_ckpt_check_dir(cfg->checkpoint.dir, t->run_id, start, cfg->checkpoint.share_dir,
                                   from > 0 ? from : 0, cfg->training.steps, cfg->checkpoint.every);
            if (st == PT_OK)
                pt_log_info("checkpoint: run %s (%s)", t->run_id,
                            continued ? "continued" : resume[0] ? "new: its checkpoint records no "
                            "run id" : "new");
        }
        id = (int64_t)strtoull(t->run_id, NULL, 16);
    }
    PT_TRY(pt_trainer_agree(t, st, "the check of checkpoint.dir's other runs"));
    if (t->mesh) {
        pt_allreduce_sum(t->mesh->world, &id, 1, PT_DTYPE_I64); /* rank 0's, the others' 0 */
        snprintf(t->run_id, sizeof t->run_id, "%016llx", (unsigned long long)id);
    }
    return PT_OK;
}

/* The CPU's GEMM peak MFU is measured against: the most a host can do with the run's threads.
 * After a barrier over the world, as many of each host's ranks as its cores hold (cores ÷
 * training.threads, at most all of them) run 1024³ products at once with the backend the run
 * uses, each timing them in the processor time its threads got (pt_measure_gemm_rate: other
 * processes taking turns on the cores do not lower it); their rates summed are the host's peak.
 * The host's ranks cannot run more threads at once than it has cores, nor a thread do more in a
 * second than one with a core of its own while all cores are busy: an oversubscribed run's MFU
 * cannot pass 100%, where the old measurement (each rank alone, time-sliced with the others
 * setting up) could. t->peak_flops: per rank, the hosts' peaks summed over the job's ranks, as
 * pt_mfu divides by them. Collective over the world. */
static void pt_trainer_measure_peak(pt_trainer *t) {
    int bf16 = t->model.prec == PT_PREC_BF16, host = 0, local = 0;
    int ranks = t->mesh ? t->mesh->world_size : 1, hosts = t->mesh ? t->mesh->hosts : 1;
    int local_size = pt_comm_local_size(), cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per = t->be->n_threads; /* training.threads, 0 resolved by the backend */
    int measuring = cores / per < 1 ? 1 : cores / per < local_size ? cores / per : local_size;
    pt_comm_host(&host, &local);
    if (t->mesh) pt_barrier(t->mesh->world);
    double rate = local < measuring ? pt_measure_gemm_rate(t->be, bf16, 0.2) : 0;
    if (t->mesh) pt_allreduce_sum(t->mesh->world, &rate, 1, PT_DTYPE_F64);
    t->peak_flops = rate / ranks;
    const char *prec = bf16 ? "bf16" : "fp32";
    char who[160];
    if (local_size == 1)
        snprintf(who, sizeof who, "its one rank (%d thread%s)", per, per == 1 ? "" : "s");
    else if (measuring == local_size)
        snprintf(who, sizeof who, "its %d ranks at once", local_size);
    else
        snprintf(who, sizeof who, "%d of its %d ranks at once, as many as its %d cores hold with "
                 "%d thread%s each", measuring, local_size, cores, per, per == 1 ? "" : "s");
    if (hosts > 1)
        pt_log_info("MFU against the hosts' %s GEMM peaks, each measured with %s: %.1f GFLOP/s "
                    "per rank (%d ranks on %d hosts)", prec, who, t->peak_flops / 1e9, ranks, hosts);
    else
        pt_log_info("MFU against the host's %s GEMM peak measured with %s: %.1f GFLOP/s per rank "
                    "(%.1f GFLOP/s the host, in the processor time the products got)", prec, who,
                    t->peak_flops / 1e9, rate / 1e9);
}

/* How a rank waits for communication (pt_comm_set_busy_wait): polling without napping when the
 * host's ranks and their threads fit its cores, napping between polls when oversubscribed;
 * PT_COMM_WAIT = spin or nap forces either (measured in docs/benchmarks.md, "How a rank waits"). */
static pt_status pt_trainer_wait_policy(int threads) {
    const char *env = getenv("PT_COMM_WAIT");
    if (env && *env && strcmp(env, "spin") && strcmp(env, "nap"))
        return pt_errorf(PT_ERR_CONFIG, "PT_COMM_WAIT = \"%s\": expected spin or nap", env);
    if (!pt_comm_distributed()) return PT_OK;
    int ranks = pt_comm_local_size(), cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    int per = threads > 0 ? threads : cores; /* training.threads = 0: one a core (the backend's) */
    int busy = env && *env ? !strcmp(env, "spin") : (int64_t)ranks * per <= cores;
    pt_comm_set_busy_wait(busy);
    pt_log_info("communication: a waiting rank %s (%d rank%s of %d thread%s on this host's %d "
                "core%s%s)", busy ? "keeps polling" : "sleeps 20 µs between polls", ranks,
                ranks == 1 ? "" : "s", per, per == 1 ? "" : "s", cores, cores == 1 ? "" : "s",
                env && *env ? ": PT_COMM_WAIT" : busy ? ": they fit" : ": more than its cores");
    return PT_OK;
}

/* The buffers keys size beyond the model and its activations, for the memory checks at set-up
 * (lower bounds, on this rank): the global batch's inputs and targets (every rank reads the whole
 * batch), logging.trace's buffer, checkpoint.async's copy of the state, and for a moment the whole
 * model's gradients (logging.dump_grads, at step 1) or weights (the sample, at the end). */
static int pt_trainer_key_buffers(const pt_config *cfg, int ranks, pt_mem_buffer *b) {
    double params = pt_param_estimate(&cfg->model);
    int n = 0;
    b[n] = (pt_mem_buffer){.what = "the batch's tokens (its inputs and targets, on every rank)",
                           .bytes = 8.0 * cfg->training.global_batch * cfg->training.seq_len};
    snprintf(b[n++].key, sizeof b->key, "training.global_batch = %d", cfg->training.global_batch);
    if (cfg->logging.trace[0]) {
        b[n] = (pt_mem_buffer){.what = "the trace buffer",
                               .bytes = (double)pt_trace_bytes((size_t)cfg->logging.trace_events)};
        snprintf(b[n++].key, sizeof b->key, "logging.trace_events = %lld",
                 (long long)cfg->logging.trace_events);
    }
    if (cfg->checkpoint.async && cfg->checkpoint.dir[0]) {
        b[n] = (pt_mem_buffer){.what = "the state's copy in host memory (weights, two moments)",
                               .bytes = 12 * params / ranks};
        snprintf(b[n++].key, sizeof b->key, "checkpoint.async = true");
    }
    if (cfg->logging.dump_grads[0]) {
        b[n] = (pt_mem_buffer){.what = "the whole model's gradients (on every rank, at step 1)",
                               .bytes = 4 * params, .transient = 1};
        snprintf(b[n++].key, sizeof b->key, "logging.dump_grads");
    }
    if (cfg->sample.prompt[0] && cfg->sample.max_new_tokens > 0) {
        b[n] = (pt_mem_buffer){.what = "the whole model's weights (on every rank, for the sample)",
                               .bytes = 4 * params, .transient = 1};
        snprintf(b[n++].key, sizeof b->key, "sample.prompt");
    }
    return n;
}

/* comm.backend: how the backend's device memory reaches the network (include/pt/comm.h,
 * pt_comm_set_device), the same choice on every rank. nccl needs every rank's GPU its own (NCCL
 * refuses two ranks of a communicator on one device); auto takes nccl where that holds on every
 * host and NCCL loads, else MPI over host copies. A backend of host memory has nothing to choose. */
static pt_status pt_trainer_comm_device(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    if (!t->be->link) return PT_OK;
    int shared = 0, host, local;
    pt_comm_host(&host, &local);
    if (!strcmp(cfg->training.device, "cuda"))
        shared = pt_comm_local_size() > pt_cuda_device_count();
    /* NCCL is loaded only where it may be chosen */
    int nccl_here = !strcmp(cfg->training.device, "cuda") && strcmp(cfg->comm.backend, "mpi") &&
                    pt_comm_nccl_available();
    /* what every rank sees: any shared GPU, any rank without NCCL */
    int32_t mine[2] = {shared, !nccl_here}, all[2] = {shared, !nccl_here};
    if (pt_comm_distributed()) {
        pt_comm *w = pt_comm_world(cfg->parallel.timeout_s);
        pt_allreduce_sum(w, mine, 2, PT_DTYPE_I32);
        all[0] = mine[0], all[1] = mine[1];
        w->free(w);
    }
    pt_comm_device_mode mode = PT_COMM_STAGED;
    if (!strcmp(cfg->comm.backend, "nccl")) {
        if (all[0])
            return pt_errorf(PT_ERR_CONFIG, "comm.backend = nccl: %d rank%s share a GPU with "
                             "another rank (this host: %d ranks, %d GPUs); NCCL refuses two ranks "
                             "of a communicator on one device: one rank per GPU, or comm.backend "
                             "= mpi", all[0], all[0] > 1 ? "s" : "", pt_comm_local_size(),
                             pt_cuda_device_count());
        if (all[1]) {
            if (nccl_here) pt_errorf(PT_ERR_CONFIG, "comm.backend = nccl: NCCL cannot be loaded "
                                     "on %d of the ranks", all[1]);
            return PT_ERR_CONFIG;
        }
        mode = PT_COMM_NCCL;
    } else if (!strcmp(cfg->comm.backend, "auto") && !all[0] && !all[1]) {
        mode = PT_COMM_NCCL;
    }
    if (local == 0 && host == 0)
        pt_log_info("comm: device memory over %s", mode == PT_COMM_NCCL
                        ? "NCCL (a stream per group, ordered by events)"
                        : "MPI through page-locked host copies (comm.backend = mpi, or ranks "
                          "sharing a GPU)");
    return pt_comm_set_device(t->be->link, mode);
}

pt_status pt_trainer_init(pt_trainer *t, const pt_config *cfg_in) {
    memset(t, 0, sizeof *t);
    t->cfg = *cfg_in;
    pt_config *cfg = &t->cfg;
    PT_TRY(pt_config_validate(cfg));
    if (strcmp(cfg->plan.block, "llama") || strcmp(cfg->plan.attention, "flash"))
        return pt_errorf(PT_ERR_CONFIG, "plan.block = %s, plan.attention = %s describe a model for "
                         "`pentatron plan` only: pentatron trains llama blocks with flash attention",
                         cfg->plan.block, cfg->plan.attention);
    if (strcmp(cfg->plan.kernels, "fused") || strcmp(cfg->plan.selective, "attention"))
        return pt_errorf(PT_ERR_CONFIG, "plan.kernels = %s, plan.selective = %s describe another "
                         "framework's run for `pentatron plan` only: pentatron runs fused kernels "
                         "and recomputes the attention core under selective recomputation",
                         cfg->plan.kernels, cfg->plan.selective);
    unsigned allow;
    PT_TRY(pt_resume_parse_allow(cfg->checkpoint.allow_change, &allow));

    /* the architecture comes from model.init_from's config.json when given (explicit
     * training-time keys win; explicit architecture keys must agree) */
    if (cfg->init_from[0]) {
        char path[PT_PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/config.json", cfg->init_from);
        pt_model_config hf;
        PT_TRY(pt_hf_config_read(path, &hf));
        PT_TRY(pt_config_merge_model(cfg, &hf, path));
    }
    cfg->model.aux_scope = !strcmp(cfg->aux_loss_scope, "global")        ? PT_AUX_GLOBAL
                           : !strcmp(cfg->aux_loss_scope, "micro_batch") ? PT_AUX_MICRO_BATCH
                                                                         : PT_AUX_SEQUENCE;
    /* the check `pentatron plan` makes too */
    PT_TRY(pt_model_config_settle(&cfg->model, cfg->training.seq_len));
    /* before allocating: overcommit would let a too-large model start and die at first touch */
    t->inject_nonfinite = getenv("PT_INJECT_NONFINITE");
    const char *ranks_env = getenv("OMPI_COMM_WORLD_SIZE");
    int ranks = ranks_env && atoi(ranks_env) > 0 ? atoi(ranks_env) : 1;
    char limit_what[160];
    int64_t limit = pt_memory_limit(cfg->training.memory_limit, limit_what, sizeof limit_what);
    pt_mem_buffer bufs[8];
    int n_bufs = pt_trainer_key_buffers(cfg, ranks, bufs);
    PT_TRY(pt_memory_precheck_ex(&cfg->model, 16, (double)cfg->training.micro_batch *
                                 cfg->training.seq_len, ranks, bufs, n_bufs, limit, limit_what));

    if (!strcmp(cfg->training.device, "cuda")) {
        PT_TRY(pt_cuda_check_usable());
        /* the GPU: this rank's place among its host's ranks, as MPI finds them (the launcher's
         * variables differ: srun --mpi=pmix sets no OMPI_COMM_WORLD_LOCAL_RANK), mod the device
         * count; the ranks of this host on that device share its memory */
        int host, local, local_size = pt_comm_local_size(), count = pt_cuda_device_count();
        pt_comm_host(&host, &local);
        int sharers = local_size / count + (local % count < local_size % count);
        t->be = pt_backend_cuda_create_shared(local, sharers);
    } else {
        if (!strcmp(cfg->comm.backend, "nccl"))
            return pt_errorf(PT_ERR_CONFIG, "comm.backend = nccl needs training.device = cuda "
                             "(NCCL moves GPU memory; on CPUs the ranks communicate over MPI)");
        pt_gemm_lib lib = !strcmp(cfg->training.gemm, "openblas") ? PT_GEMM_OPENBLAS
                                                                  : PT_GEMM_ONEDNN;
        t->be = pt_backend_cpu_create(cfg->training.threads, lib);
    }
    if (!t->be) return PT_ERR_RUNTIME;
    PT_TRY(pt_trainer_comm_device(t));

    /* the layout: groups, this rank's share of the model and of the batch, parallel tables */
    pt_layout_spec spec = pt_config_layout_spec(cfg);
    pt_layout *lay = &t->lay;
    PT_TRY(pt_layout_init(lay, &spec, &cfg->model, t->be, pt_comm_distributed()));
    t->mesh = lay->mesh;
    cfg->parallel.dp = lay->dp_size;
    PT_TRY(pt_trainer_check_outputs(t));
    pt_log_info("backend: %s", t->be->describe(t->be));
    PT_TRY(pt_trainer_wait_policy(cfg->training.threads));

    PT_TRY(pt_trainer_agree(t, pt_mix_open(&t->data, cfg->data.train, cfg->data.sources,
                                           cfg->data.weights, cfg->training.seq_len,
                                           cfg->data.shuffle, cfg->training.seed,
                                           cfg->model.vocab_size), "opening the data"));
    pt_mix_log(&t->data);
    if (cfg->data.val[0]) PT_TRY(pt_trainer_agree(t, pt_trainer_open_val(t), "opening data.val"));
    char resume[PT_PATH_MAX + 32];
    PT_TRY(pt_trainer_resume_from(t, resume, sizeof resume));
    PT_TRY(pt_trainer_identity(t, resume));

    const pt_model_parallel *par = &lay->par;
    int zero = lay->zero, ep = par->ep > 1 ? par->ep : 1, pp = lay->pp, cp = lay->cp;
    pt_sched_kind sched = lay->sched;
    int bf16 = !strcmp(cfg->training.precision, "bf16");
    PT_TRY(pt_model_init_ex(&t->model, &cfg->model, t->be, lay->alloc, pt_dp_model_flags(zero, bf16),
                            par));
    PT_TRY(pt_model_set_precision(&t->model, bf16 ? PT_PREC_BF16 : PT_PREC_FP32));
    if (bf16 && !t->be->bf16_native)
        pt_log_warn("training.precision = bf16 on a CPU without native bf16 dot products (oneDNN "
                    "ISA below avx512_core_bf16): bf16 GEMMs are emulated, slower than fp32");
    PT_TRY(pt_layout_init_data(lay, &t->model, cfg->parallel.bucket_mb, cfg->parallel.overlap,
                               !strcmp(cfg->parallel.grad_reduce, "bf16")));
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
    pt_optim_config oc = pt_run_optim_config(cfg);
    int n_ranges = 1;
    pt_optim_range *ranges = pt_layout_owned_ranges(lay, &n_ranges);
    pt_optim_init(&t->opt, &oc, &t->model, ranges, n_ranges);
    free(ranges);
    if (cfg->checkpoint.async && cfg->checkpoint.dir[0]) pt_trainer_async_init(t);

    if (resume[0]) {
        PT_TRY(pt_trainer_load(t, resume));
        pt_log_info("resumed from %s at step %lld", resume, (long long)t->step);
    }

    int G = cfg->training.global_batch, mb = cfg->training.micro_batch, T = cfg->training.seq_len;
    int per_rank = G / lay->dp_size, Tl = lay->T_local; /* Tl: this rank's tokens of a sequence */
    const char *re = cfg->training.recompute;
    pt_model_set_recompute(&t->model,
                           !strcmp(re, "full")        ? PT_RECOMPUTE_FULL
                           : !strcmp(re, "selective") ? PT_RECOMPUTE_SELECTIVE
                                                      : PT_RECOMPUTE_NONE,
                           cfg->training.recompute_layers);
    if (pp > 1) {
        PT_TRY(pt_pipe_init(&t->pipe, &t->model, t->mesh->pp, sched, cfg->parallel.pp_virtual,
                            per_rank / mb, mb, Tl));
        pt_log_info("pipeline: %d stages, schedule %s, %d micro-batches; this rank's layers %d-%d%s",
                    t->pipe.S, pt_schedule_kind_name(sched), per_rank / mb,
                    par->chunk[0].l0, par->chunk[0].l1 - 1, par->n_chunks > 1 ? " (first chunk)" : "");
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
    t->be->upload(t->be, t->d_pos, lay->pos, (size_t)Tl * sizeof(int32_t));
    if (cfg->data.document_mask) {
        if (cfg->data.separator >= cfg->model.vocab_size)
            return pt_errorf(PT_ERR_CONFIG, "data.separator = %d is not a token of the model's "
                             "vocabulary (model.vocab_size = %d)", cfg->data.separator,
                             cfg->model.vocab_size);
        t->d_docs = t->be->alloc(t->be, (size_t)per_rank * Tl * sizeof(int32_t));
        t->l_docs = pt_malloc((size_t)per_rank * Tl * sizeof(int32_t));
        t->h_docs = pt_malloc((size_t)T * sizeof(int32_t));
        if (t->pipe.model) pt_pipe_set_documents(&t->pipe, t->d_docs, cfg->data.position_restart);
        pt_log_info("documents: attention within documents, each starting at token %d; rope "
                    "positions %s", cfg->data.separator,
                    cfg->data.position_restart ? "restart per document" : "per sequence");
    }

    t->bias_host = pt_calloc((size_t)(cfg->model.n_experts > 0 ? cfg->model.n_experts : 1),
                             sizeof *t->bias_host);
    if (cfg->model.n_experts > 0)
        t->stats.expert_load = pt_calloc((size_t)cfg->model.n_layers * cfg->model.n_experts,
                                         sizeof *t->stats.expert_load);
    if (t->acts) pt_acts_set_stats(t->acts, &t->stats);
    if (t->pipe.model) t->pipe.stats = &t->stats;
    /* a GPU's peak needs products far larger than the CPU's measurement: its backend measured
     * its own at set-up */
    double gpu_peak = pt_cuda_peak_tflops(t->be, t->model.prec == PT_PREC_BF16) * 1e12;
    /* the CPU's is measured unless PT_GEMM_PEAK gives it in FLOP/s, as CTest does
     * (tests/CMakeLists.txt): every rank of every test's runs would otherwise measure, on two
     * cores, a number that only MFU uses */
    const char *given = getenv("PT_GEMM_PEAK");
    char *end = NULL;
    double given_peak = given && *given ? strtod(given, &end) : 0;
    if (given && *given && (*end || !(given_peak > 0)))
        return pt_errorf(PT_ERR_CONFIG, "PT_GEMM_PEAK = \"%s\": expected a peak in FLOP/s, e.g. 1e11",
                         given);
    t->peak_flops = gpu_peak > 0 ? gpu_peak : given_peak;
    if (t->peak_flops <= 0) pt_trainer_measure_peak(t);
    t->datasheet_flops = pt_cuda_datasheet_tflops(t->be) * 1e12;
    if (t->datasheet_flops > 0)
        pt_log_info("GPU peaks: measured %.0f TFLOP/s (%s GEMM), datasheet %.0f TFLOP/s (bf16 "
                    "dense): MFU is reported against the measured peak, mfu_datasheet against "
                    "the datasheet's", t->peak_flops / 1e12, cfg->training.precision,
                    t->datasheet_flops / 1e12);
    t->flops_per_token = pt_model_flops_per_token(&cfg->model, T);
    size_t mine = 0;
    for (int i = 0; i < t->model.table.n; i++) mine += t->model.table.p[i].numel;
    pt_log_info("model: %.2fM parameters (%.2fM on this rank), %d layers, dim %d, heads %d/%d, "
                "ffn %d, vocab %d%s", (double)t->model.gtable.total / 1e6, (double)mine / 1e6,
                cfg->model.n_layers, cfg->model.dim, cfg->model.n_heads,
                cfg->model.n_kv_heads, cfg->model.ffn_dim, cfg->model.vocab_size,
                cfg->model.tied_embeddings ? ", tied" : "");
    if (t->mesh)
        pt_log_info("layout: %d rank%s = dp %d × pp %d × cp %d × tp %d%s, ep %d; ZeRO-%d, %d "
                    "gradient buckets", t->mesh->world_size, t->mesh->world_size == 1 ? "" : "s",
                    lay->dp_size, pp, cp, t->mesh->deg.tp,
                    par->sp ? " (sp)" : "", ep, zero,
                    lay->dpc ? lay->dp.n_buckets + lay->dpe.n_buckets : 0);
    pt_rank_memory mem = pt_trainer_rank_memory(t);
    pt_log_info("memory per rank: parameters %.3f MiB, gradients %.3f MiB, optimizer %.3f MiB, "
                "activations %.3f MiB (recompute %s); %s GEMM peak %.0f GFLOP/s%s",
                mem.params / 1048576.0, mem.grads / 1048576.0, mem.optim / 1048576.0,
                mem.activations / 1048576.0, cfg->training.recompute, cfg->training.precision,
                t->peak_flops / 1e9, gpu_peak <= 0 && given_peak > 0 ? " (PT_GEMM_PEAK)" : "");
    return pt_memory_check(&mem, pt_mem_buffers_bytes(bufs, n_bufs), limit, limit_what);
}

void pt_trainer_set_params(pt_trainer *t, const float *host) {
    float *local = pt_calloc(t->model.table.total, sizeof(float)); /* padding: zeros */
    pt_param_table_to_local(&t->model.table, host, local);
    pt_layout_set_params(&t->lay, &t->model, local);
    pt_model_sync_weights(&t->model);
    free(local);
}

void pt_trainer_get_params(pt_trainer *t, float *host) {
    float *local = pt_malloc(t->model.table.total * sizeof(float));
    pt_layout_get_params(&t->lay, &t->model, local);
    pt_layout_to_global(&t->lay, &t->model, local, host);
    free(local);
}

size_t pt_trainer_act_bytes(const pt_trainer *t) {
    /* plus ring attention's buffers (context parallelism) */
    size_t acts = t->acts ? pt_acts_bytes(t->acts) : 0;
    if (t->pipe.model) { /* the sets made at set-up, or the most a step held */
        acts = pt_pipe_peak_bytes(&t->pipe);
        if (acts < t->pipe.setup_bytes) acts = t->pipe.setup_bytes;
    }
    return acts + pt_model_workspace_bytes(&t->model) + pt_cp_bytes(t->model.par.cp_ops);
}

pt_dp_memory pt_trainer_memory(const pt_trainer *t) {
    /* (a bf16 model: its bf16 copy as the parameters, the fp32 masters, whole or sharded by
     * ZeRO, with the optimizer's state) */
    return pt_layout_memory(&t->lay, &t->model, t->opt.n);
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
    const pt_model_config *mc = &t->model.cfg;
    if (mc->aux_scope == PT_AUX_GLOBAL && t->model.aux_f && t->step > 0 &&
        !pt_ckpt_aux_f(c, t->model.aux_f, (size_t)mc->n_layers * mc->n_experts))
        pt_log_warn("%s has no balancing f of the global scope (saved under another "
                    "model.aux_loss_scope): the next step's f is uniform", dir);
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

static void pt_trainer_params_ready(pt_trainer *t);

void pt_trainer_free(pt_trainer *t) {
    pt_trace_close(); /* (a run stopped before its trace's last step) */
    pt_run_lock_release(t->lock);
    t->lock = NULL;
    pt_trainer_async_free(t); /* a save still being written is waited for, not published */
    pt_trainer_params_ready(t); /* (no request left in flight) */
    pt_layout_free(&t->lay);
    t->mesh = NULL;
    if (!t->be) return;
    pt_metrics_close(&t->metrics);
    pt_tb_close(&t->tb);
    if (t->acts) pt_acts_free(&t->model, t->acts);
    pt_pipe_free(&t->pipe);
    pt_layout_free_tables(&t->lay);
    t->be->free(t->be, t->d_inputs);
    t->be->free(t->be, t->d_targets);
    t->be->free(t->be, t->d_pos);
    if (t->d_docs) t->be->free(t->be, t->d_docs);
    free(t->l_docs), free(t->h_docs);
    free(t->l_inputs);
    free(t->bias_host);
    free(t->stats.expert_load);
    free(t->l_targets);
    free(t->h_inputs);
    free(t->h_targets);
    if (t->opt.m) pt_optim_free(&t->opt, &t->model);
    pt_model_free(&t->model);
    pt_mix_close(&t->data);
    pt_data_close(&t->val);
    t->be->destroy(t->be);
    memset(t, 0, sizeof *t);
}

static pt_status pt_dump_grads(pt_trainer *t, const char *path);

/* Auxiliary-loss-free balancing (DeepSeek-V3): each MoE layer's selection bias moves by the rate
 * toward balance, up for the experts that got fewer token-slots than the mean in this step, down
 * for those that got more (the load is the whole step's, the same on every rank). Each rank moves
 * the part its optimizer owns (with ZeRO, a slice), before the parameters are gathered. */
static void pt_trainer_bias_update(pt_trainer *t, int r) {
    const pt_model_config *mc = &t->cfg.model;
    float *b = t->bias_host;
    const pt_optim_range *rg = &t->opt.ranges[r];
    for (int i = 0; i < t->model.table.n; i++) {
        const pt_param *p = &t->model.table.p[i];
        size_t lo = p->offset > rg->lo ? p->offset : rg->lo;
        size_t hi = p->offset + p->numel < rg->hi ? p->offset + p->numel : rg->hi;
        if (p->kind != PT_KIND_ROUTER_BIAS || hi <= lo) continue;
        const double *ld = t->stats.expert_load + (size_t)p->layer * mc->n_experts;
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

/* The data-parallel instances of the layout (the dense and the experts' region), 0 to 2. */
static int pt_trainer_dps(pt_trainer *t, pt_dp **ds) {
    int n = 0;
    if (t->lay.dpc) ds[n++] = &t->lay.dp;
    if (t->lay.dpe.model) ds[n++] = &t->lay.dpe;
    return n;
}

/* ZeRO-1's gathers of the last update still in flight (pt_dp_gather_params), completed: before
 * anything reads the parameters outside the model's passes. */
static void pt_trainer_params_ready(pt_trainer *t) {
    pt_dp *ds[2];
    for (int i = 0, n = pt_trainer_dps(t, ds); i < n; i++) pt_dp_params_ready(ds[i]);
}

/* After the last micro-batch's backward: Σ g² of what this rank owns. The reductions still in
 * flight complete bucket after bucket, and each bucket's pieces of the norm are summed as soon as
 * its gradients are final, while the later buckets are still on the wire (the embedding's, whose
 * gradient backward finishes last); the pieces add in pt_grad_sumsq_owned's order, bit for bit. */
static double pt_trainer_reduce(pt_trainer *t) {
    pt_dp *ds[2];
    int n = pt_trainer_dps(t, ds);
    size_t lo, hi;
    pt_optim_norm_begin(&t->opt);
    for (int i = 0; i < n; i++) pt_dp_end_backward(ds[i]);
    for (int i = 0; i < n; i++)
        while (pt_dp_next_final(ds[i], &lo, &hi)) pt_optim_norm_final(&t->opt, &t->model, lo, hi);
    return pt_optim_norm_sumsq(&t->opt, &t->model);
}

/* The update, range by range in ascending offsets: once a bucket's slice is updated its
 * all-gather starts (ZeRO-1/2), overlapping the next ranges' updates; ZeRO-1's gathers complete
 * in the next forward, as each unit is acquired (a bf16 model's sharded masters: the gathers move
 * its bf16 copy; whole masters, ZeRO-0: the copy is made from all of them now). */
static void pt_trainer_update(pt_trainer *t, float lr, float clip) {
    pt_dp *ds[2];
    int n = pt_trainer_dps(t, ds);
    pt_optim_begin_step(&t->opt);
    for (int r = 0; r < t->opt.n_ranges; r++) {
        pt_optim_update_range(&t->opt, &t->model, r, lr, clip);
        if (t->cfg.model.bias_rate > 0) pt_trainer_bias_update(t, r);
        for (int i = 0; i < n; i++) pt_dp_params_updated(ds[i], t->opt.ranges[r].hi);
    }
    for (int i = 0; i < n; i++) pt_dp_gather_params(ds[i], t->model.params16 && t->model.params);
    pt_model_sync_weights(&t->model); /* bf16: the copy the next step computes with */
}

/* This rank's rows of the global batch in h_inputs / h_targets, [dp_rank·per_rank,
 * (dp_rank+1)·per_rank), and of each row its tokens (context parallelism: those at its
 * positions), to d_inputs / d_targets. */
static void pt_trainer_upload_rows(pt_trainer *t) {
    const pt_layout *lay = &t->lay;
    int T = t->cfg.training.seq_len, per_rank = t->cfg.training.global_batch / lay->dp_size;
    int Tl = lay->T_local;
    for (int b = 0; b < per_rank; b++) {
        size_t row = ((size_t)lay->dp_rank * per_rank + b) * T;
        if (t->h_docs) /* the whole sequence's document starts: the separator opens one */
            for (int i = 0, start = 0; i < T; i++) {
                if (t->h_inputs[row + i] == t->cfg.data.separator) start = i;
                t->h_docs[i] = start;
            }
        for (int i = 0; i < Tl; i++) {
            t->l_inputs[(size_t)b * Tl + i] = t->h_inputs[row + lay->pos[i]];
            t->l_targets[(size_t)b * Tl + i] = t->h_targets[row + lay->pos[i]];
            if (t->h_docs) t->l_docs[(size_t)b * Tl + i] = t->h_docs[lay->pos[i]];
        }
    }
    size_t bytes = (size_t)per_rank * Tl * sizeof(int32_t);
    t->be->upload(t->be, t->d_inputs, t->l_inputs, bytes);
    t->be->upload(t->be, t->d_targets, t->l_targets, bytes);
    if (t->d_docs) t->be->upload(t->be, t->d_docs, t->l_docs, bytes);
}

/* The documents of the micro-batch whose rows start at `at` for the activations (none without). */
static void pt_trainer_docs(pt_trainer *t, size_t at) {
    if (t->acts) pt_acts_set_documents(t->acts, t->d_docs ? t->d_docs + at : NULL,
                                       t->cfg.data.position_restart);
}

/* Whether PT_INJECT_NONFINITE (a comma-separated list of 1-based steps; tests only) names the step
 * about to run: its gradient is then made NaN on world rank 0. */
static int pt_trainer_injected(const pt_trainer *t) {
    if (!t->inject_nonfinite || (t->mesh && t->mesh->world_rank != 0)) return 0;
    for (const char *p = t->inject_nonfinite; *p;) {
        char *end;
        long long s = strtoll(p, &end, 10);
        if (end == p) break;
        if (s == t->step + 1) return 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* training.on_nonfinite for a step whose loss or gradient norm is (not) finite: stop, or count a
 * skip and stop only after training.max_skips in a row. */
static pt_status pt_trainer_nonfinite(pt_trainer *t, int finite, double loss, double norm) {
    const pt_config *cfg = &t->cfg;
    long long step = (long long)t->step + 1;
    if (finite) {
        t->skips_in_row = 0;
        return PT_OK;
    }
    if (strcmp(cfg->training.on_nonfinite, "skip") != 0)
        return pt_errorf(PT_ERR_DIVERGED, "step %lld: loss %g, gradient norm %g: not finite "
                         "(diverged; training.on_nonfinite = stop). The newest checkpoint holds "
                         "the last good state; lower optimizer.lr, or set on_nonfinite = skip",
                         step, loss, norm);
    t->skips++;
    if (++t->skips_in_row >= cfg->training.max_skips)
        return pt_errorf(PT_ERR_DIVERGED, "step %lld: loss %g, gradient norm %g: %lld steps in a row "
                         "not finite, training.max_skips = %d (diverged)", step, loss, norm,
                         (long long)t->skips_in_row, cfg->training.max_skips);
    pt_log_warn("step %lld: loss %g, gradient norm %g: not finite, update skipped (%lld in a "
                "row, %lld in all; training.on_nonfinite = skip)", step, loss, norm,
                (long long)t->skips_in_row, (long long)t->skips);
    return PT_OK;
}

pt_status pt_trainer_step(pt_trainer *t, pt_step_stats *s) {
    const pt_config *cfg = &t->cfg;
    pt_backend *be = t->be;
    int G = cfg->training.global_batch, mb = cfg->training.micro_batch, T = cfg->training.seq_len;
    pt_layout *lay = &t->lay;
    int per_rank = G / lay->dp_size, n_micro = per_rank / mb, Tl = lay->T_local;
    double t0 = t->loop_t0 > 0 ? t->loop_t0 : pt_now();
    t->loop_t0 = 0;
    int64_t allocs0 = pt_alloc_count();
    double pp_wait0 = t->pipe.model ? t->mesh->pp->stats.wait_seconds : 0;
    double busy0 = t->pipe.busy_s, head0 = t->pipe.head_s;
    double head_wait0 = t->mesh && t->mesh->head ? t->mesh->head->stats.wait_seconds : 0;
    int64_t pairs0 = pt_cp_attn_pairs(t->model.par.cp_ops);

    /* the whole global batch is read first: its count of valid targets scales every micro-batch
     * on every rank, so any split over ranks and micro-batches gives the same step */
    pt_mix_batch(&t->data, t->step, G, 0, G, t->h_inputs, t->h_targets);
    pt_mix_log_epochs(&t->data, t->step, G);
    int64_t n_valid = 0;
    for (size_t i = 0; i < (size_t)G * T; i++) n_valid += t->h_targets[i] >= 0;
    float loss_scale = n_valid > 0 ? 1.0f / (float)n_valid : 0.0f;

    if (t->lay.dpc) {
        pt_dp_begin_step(&t->lay.dp);
        if (t->lay.dpe.model && t->lay.dpe.zero >= 2) pt_dp_begin_step(&t->lay.dpe); /* its shards */
    } else
        pt_model_zero_grads(&t->model);
    double loss_sum = 0;
    t->model.aux_scale = 1.0 / G; /* the balancing losses: a mean over the batch's sequences */
    pt_model_aux_counts_clear(&t->model); /* the global scope's token-slots of this step */
    t->stats.aux_loss = t->stats.z_loss = 0;
    t->stats.a2a_sent = t->stats.a2a_recv = 0;
    size_t n_load = t->stats.expert_load ? (size_t)cfg->model.n_layers * cfg->model.n_experts : 0;
    if (n_load) memset(t->stats.expert_load, 0, n_load * sizeof(double));
    pt_trainer_upload_rows(t);
    if (t->pipe.model) {
        /* the schedule runs every micro-batch; the data-parallel reduction follows it */
        if (t->lay.dpc) pt_dp_begin_micro(&t->lay.dp, 0);
        if (t->lay.dpe.model) pt_dp_begin_micro(&t->lay.dpe, 0);
        loss_sum = pt_pipe_step(&t->pipe, t->d_inputs, t->d_targets, t->d_pos, loss_scale);
        if (lay->zero >= 2) { /* the reductions the micro-batches' backward passes started (and
                               * what they left), completed: the shards hold the step's sums */
            if (t->lay.dpc) pt_dp_end_micro(&t->lay.dp, 1);
            if (t->lay.dpe.model) pt_dp_end_micro(&t->lay.dpe, 1);
        }
        pt_layout_sum_tied(lay, &t->model); /* a tied embedding's copy's gradient too */
        if (t->lay.dpc && lay->zero < 2) pt_dp_begin_micro(&t->lay.dp, 1);
        if (t->lay.dpe.model && lay->zero < 2) pt_dp_begin_micro(&t->lay.dpe, 1);
    }
    for (int k = 0; k < n_micro && !t->pipe.model; k++) {
        size_t at = (size_t)k * mb * Tl;
        int last = k == n_micro - 1;
        if (t->lay.dpc) pt_dp_begin_micro(&t->lay.dp, last);
        if (t->lay.dpe.model) pt_dp_begin_micro(&t->lay.dpe, last);
        pt_trainer_docs(t, at);
        double tm = pt_now();
        loss_sum += pt_model_forward(&t->model, t->acts, t->d_inputs + at, t->d_targets + at,
                                     t->d_pos, loss_scale, NULL);
        pt_model_backward(&t->model, t->acts, t->d_inputs + at);
        pt_trace_span("micro-batch", tm, pt_now(), "micro", k, NULL, 0);
        if (last) break; /* its reductions: pt_trainer_reduce */
        if (t->lay.dpc) pt_dp_end_micro(&t->lay.dp, last);
        if (t->lay.dpe.model) pt_dp_end_micro(&t->lay.dpe, last);
    }
    /* Σ g² over what this rank owns (replicas counted once); with ZeRO the data ranks own
     * disjoint parts, the tp ranks always do: each sums over its group */
    double t_red = pt_now();
    double sumsq = pt_trainer_reduce(t);
    pt_trace_span("gradient reduction", t_red, pt_now(), NULL, 0, NULL, 0);
    if (pt_trainer_injected(t)) sumsq = NAN; /* a test's divergence: every rank's norm is NaN */
    double aux[2] = {t->stats.aux_loss, t->stats.z_loss};
    pt_layout_sum_step(lay, &loss_sum, &sumsq, aux, t->stats.expert_load, n_load);
    if (cfg->model.aux_scope == PT_AUX_GLOBAL && n_load) { /* the next step's f */
        pt_layout_sum_counts(lay, t->model.aux_count, n_load);
        pt_model_aux_f_update(&t->model);
    }
    double norm = sqrt(sumsq);
    /* the loss and the norm are sums over every rank: every rank sees the same and decides alike */
    int finite = isfinite(norm) && isfinite(loss_sum);
    PT_TRY(pt_trainer_nonfinite(t, finite, n_valid > 0 ? loss_sum / (double)n_valid : 0.0, norm));
    if (cfg->logging.dump_grads[0] && !t->grads_dumped) {
        PT_TRY(pt_dump_grads(t, cfg->logging.dump_grads));
        t->grads_dumped = 1;
    }
    float lr = pt_lr_at(&t->opt.cfg, t->step);
    double t_opt = pt_now();
    if (finite) /* a skipped step leaves weights, moments and AdamW's count as they were */
        pt_trainer_update(t, lr, pt_clip_coef(norm, cfg->optimizer.grad_clip));
    be->synchronize(be);
    pt_trace_span("optimizer", t_opt, pt_now(), NULL, 0, NULL, 0);
    t->step++; /* the data and the learning-rate schedule move on either way */
    s->skipped = !finite;

    s->step = t->step;
    s->loss = n_valid > 0 ? loss_sum / (double)n_valid : 0.0;
    s->grad_norm = norm;
    s->aux_loss = aux[0];
    s->z_loss = aux[1];
    s->lr = lr;
    s->tokens = (int64_t)G * T;
    s->n_sources = t->data.mixed ? t->data.n : 0; /* their shares of the tokens read so far */
    s->source_names = (const char *const *)t->data.name;
    s->source_share = pt_mix_shares(&t->data, t->step * G);
    s->seconds = pt_now() - t0;
    pt_trace_span("step", t0, t0 + s->seconds, "step", (int)t->step, NULL, 0);
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
        /* and its compute: the layers', and the split head's without its waits for the others */
        double times[2 * 64], *my = times + 2 * t->mesh->pp_i;
        my[0] = t->pipe.busy_s - busy0;
        my[1] = t->pipe.head_s - head0 -
                (t->mesh->head ? t->mesh->head->stats.wait_seconds - head_wait0 : 0);
        pt_allgather(t->mesh->pp, NULL, times, 2, PT_DTYPE_F64); /* in place */
        s->head_split = t->model.par.head_split;
        for (int i = 0; i < s->n_stages; i++) {
            s->busy[i] = times[2 * i], s->head_busy[i] = times[2 * i + 1];
            if (t->step > 2) t->pp_layers_s[i] += times[2 * i], t->pp_head_s[i] += times[2 * i + 1];
        }
        t->pp_timed += t->step > 2;
    }
    s->tokens_per_s = (double)s->tokens / s->seconds;
    s->expert_load = t->stats.expert_load;
    s->ep = t->model.par.ep > 1;
    s->ep_rows[0] = t->stats.a2a_sent, s->ep_rows[1] = t->stats.a2a_recv;
    s->evaluated = 0; /* pt_trainer_run evaluates after the step */
    s->allocs = pt_alloc_count() - allocs0;
    if (s->allocs > 0 && s->step > 1) /* set-up allocates; a step never should (core.h) */
        pt_log_warn("step %lld: %lld allocations during the step", (long long)s->step,
                    (long long)s->allocs);
    s->mfu = pt_mfu(t->flops_per_token, s->tokens_per_s, t->mesh ? t->mesh->world_size : 1,
                    t->peak_flops);
    s->device_peak_bytes = pt_cuda_memory_peak(t->be);
    s->mfu_datasheet = t->datasheet_flops > 0
                           ? pt_mfu(t->flops_per_token, s->tokens_per_s,
                                    t->mesh ? t->mesh->world_size : 1, t->datasheet_flops)
                           : 0.0;
    return PT_OK;
}

pt_status pt_trainer_eval(pt_trainer *t, double *val_loss) {
    const pt_config *cfg = &t->cfg;
    pt_model *m = &t->model;
    if (!t->val.n_shards) return pt_errorf(PT_ERR_CONFIG, "evaluation needs data.val");
    pt_trainer_params_ready(t);
    int G = cfg->training.global_batch, mb = cfg->training.micro_batch, T = cfg->training.seq_len;
    int n_micro = G / t->lay.dp_size / mb, Tl = t->lay.T_local;
    int64_t allocs0 = pt_alloc_count();
    double loss = 0;
    int64_t n_valid = 0;
    for (int64_t b = 0; b < t->eval_batches; b++) {
        pt_data_batch(&t->val, b, G, 0, G, t->h_inputs, t->h_targets);
        for (size_t i = 0; i < (size_t)G * T; i++) n_valid += t->h_targets[i] >= 0;
        pt_trainer_upload_rows(t);
        if (t->pipe.model) loss += pt_pipe_eval(&t->pipe, t->d_inputs, t->d_targets, t->d_pos);
        for (int k = 0; k < n_micro && !t->pipe.model; k++) {
            size_t at = (size_t)k * mb * Tl;
            pt_trainer_docs(t, at);
            loss += pt_model_eval_loss(m, t->acts, t->d_inputs + at, t->d_targets + at, t->d_pos,
                                       NULL);
        }
    }
    pt_layout_sum_loss(&t->lay, &loss);
    t->be->synchronize(t->be);
    *val_loss = n_valid > 0 ? loss / (double)n_valid : 0.0;
    int64_t allocs = pt_alloc_count() - allocs0;
    if (allocs > 0) /* everything it uses was made at set-up */
        pt_log_warn("evaluation after step %lld: %lld allocations", (long long)t->step,
                    (long long)allocs);
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
    pt_layout_gather_owned(&t->lay, h, n);
    float *g = pt_malloc(t->model.gtable.total * sizeof(float));
    pt_layout_to_global(&t->lay, &t->model, h, g);
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

/* Where a save's host copy of the state lives: the host arrays, the blocks scratch and the
 * pieces (cap of them). */
typedef struct {
    float *host;
    pt_block *blocks;
    pt_ckpt_piece *pieces;
    int cap;
} pt_save_buf;

struct pt_trainer_async {
    pt_save_buf buf;          /* allocated once, at set-up */
    int n_pieces;
    pt_ckpt_save_state state; /* the save being written */
    pthread_t thread;
    int pending, done;        /* done: set by the thread (atomic) */
    double t0;                /* when it started */
};

/* This rank's elements of the optimizer's ranges, the size of a save's host copy / 3. */
static size_t pt_save_elems(const pt_trainer *t) {
    size_t n = 0;
    for (int r = 0; r < t->opt.n_ranges; r++) n += pt_range_len(t, &t->opt.ranges[r]);
    return n;
}

static void pt_save_buf_init(pt_trainer *t, pt_save_buf *b) {
    b->host = pt_malloc((3 * pt_save_elems(t) + 1) * sizeof(float));
    b->blocks = pt_malloc(3 * (size_t)t->model.table.n * sizeof *b->blocks);
    b->cap = 3 * t->model.table.n * (t->opt.n_ranges > 0 ? t->opt.n_ranges : 1);
    b->pieces = pt_malloc((size_t)b->cap * sizeof *b->pieces);
}

static void pt_save_buf_free(pt_save_buf *b) {
    free(b->host), free(b->blocks), free(b->pieces);
    memset(b, 0, sizeof *b);
}

/* The current state's pieces this rank writes, copied to host memory in b; the count. */
static int pt_save_collect(pt_trainer *t, pt_save_buf *b) {
    /* the blocks this rank writes: those of the ranges its optimizer owns, of the tensors it owns
     * (tensor-parallel replicas are written once); replicated over the data ranks (ZeRO-0), by
     * the first data rank only */
    int writer = pt_layout_writes(&t->lay);
    float *at = b->host;
    pt_block *blocks = b->blocks;
    pt_ckpt_piece *pieces = b->pieces;
    int n_pieces = 0;
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
            PT_ASSERTF(n_pieces < b->cap, "checkpoint: more than %d pieces", b->cap);
            const pt_block *bk = &blocks[k];
            size_t o = bk->lo - rg->lo;
            pieces[n_pieces++] = (pt_ckpt_piece){bk->tensor, bk->r0, bk->r1, bk->c0, bk->c1,
                                                 p + o, m1 + o, m2 + o};
        }
    }
    return n_pieces;
}

/* Never publish weights or moments that are not finite: agreed over the world, named by the rank
 * that holds them. Collective. */
static pt_status pt_save_check_finite(pt_trainer *t, const pt_ckpt_piece *pieces, int n_pieces) {
    const char *bad = NULL, *bad_kind = NULL;
    for (int k = 0; k < n_pieces && !bad; k++) {
        const pt_ckpt_piece *pc = &pieces[k];
        size_t n = (size_t)((pc->r1 - pc->r0) * (pc->c1 - pc->c0));
        const float *arr[3] = {pc->param, pc->exp_avg, pc->exp_avg_sq};
        const char *kinds[3] = {"weights", "first moment", "second moment"};
        for (int a = 0; a < 3 && !bad; a++)
            if (!pt_all_finite(arr[a], n)) bad = t->model.gtable.p[pc->tensor].name, bad_kind = kinds[a];
    }
    int32_t n_bad = bad != NULL;
    if (t->mesh) pt_allreduce_sum(t->mesh->world, &n_bad, 1, PT_DTYPE_I32);
    if (n_bad) {
        if (bad)
            return pt_errorf(PT_ERR_RUNTIME, "step %lld: not saving a checkpoint: the %s of %s are "
                             "not finite (the newest checkpoint is kept)", (long long)t->step,
                             bad_kind, bad);
        return pt_errorf(PT_ERR_RUNTIME, "step %lld: not saving a checkpoint: another rank's "
                         "weights or moments are not finite", (long long)t->step);
    }
    return PT_OK;
}

pt_status pt_trainer_save(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    PT_TRY(pt_trainer_save_wait(t)); /* a background save first: checkpoints publish in order */
    pt_trainer_params_ready(t);
    pt_save_buf b;
    pt_save_buf_init(t, &b);
    int n_pieces = pt_save_collect(t, &b);
    pt_status st = pt_save_check_finite(t, b.pieces, n_pieces);
    if (st == PT_OK)
        st = pt_ckpt_save(cfg->checkpoint.dir, t->step, &t->model, b.pieces, n_pieces, t->opt.step,
                          cfg, cfg->checkpoint.keep, t->run_id, t->mesh ? t->mesh->world : NULL);
    pt_save_buf_free(&b);
    if (st == PT_OK)
        pt_log_info("checkpoint: %s/step_%08lld", cfg->checkpoint.dir, (long long)t->step);
    return st;
}

static void pt_trainer_async_init(pt_trainer *t) {
    t->async = pt_calloc(1, sizeof *t->async);
    pt_save_buf_init(t, &t->async->buf);
}

static void pt_trainer_async_free(pt_trainer *t) {
    struct pt_trainer_async *a = t->async;
    if (!a) return;
    if (a->pending && a->t0 >= 0) pthread_join(a->thread, NULL);
    pt_save_buf_free(&a->buf);
    free(a);
    t->async = NULL;
}

/* The background writer: this rank's shard of the pending save. */
static void *pt_save_thread(void *arg) {
    struct pt_trainer_async *a = arg;
    pt_alloc_count_pause(1); /* its allocations are the save's, not the step's */
    pt_ckpt_save_write(&a->state);
    __atomic_store_n(&a->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

pt_status pt_trainer_save_start(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    struct pt_trainer_async *a = t->async;
    PT_ASSERTF(a, "pt_trainer_save_start without checkpoint.async");
    PT_TRY(pt_trainer_save_wait(t));
    pt_trainer_params_ready(t);
    double t0 = pt_now();
    a->n_pieces = pt_save_collect(t, &a->buf);
    PT_TRY(pt_save_check_finite(t, a->buf.pieces, a->n_pieces));
    PT_TRY(pt_ckpt_save_begin(&a->state, cfg->checkpoint.dir, t->step, t->opt.step, a->buf.pieces,
                              a->n_pieces, t->run_id, t->mesh ? t->mesh->world : NULL));
    a->done = 0;
    a->t0 = t0;
    if (pthread_create(&a->thread, NULL, pt_save_thread, a) != 0) {
        pt_save_thread(a); /* no thread: write it here */
        a->t0 = -1;
    }
    a->pending = 1;
    return PT_OK;
}

/* Joins the writer and publishes its save (collective). */
static pt_status pt_save_publish(pt_trainer *t) {
    struct pt_trainer_async *a = t->async;
    const pt_config *cfg = &t->cfg;
    if (a->t0 >= 0) pthread_join(a->thread, NULL);
    a->pending = 0;
    pt_status st = pt_ckpt_save_finish(&a->state, &t->model, cfg, cfg->checkpoint.keep,
                                       t->mesh ? t->mesh->world : NULL);
    if (st == PT_OK)
        pt_log_info("checkpoint: %s (written in the background, published at step %lld)",
                    a->state.final_dir, (long long)t->step);
    return st;
}

pt_status pt_trainer_save_poll(pt_trainer *t) {
    if (!t->async || !t->async->pending) return PT_OK;
    /* every rank's writer done? (agreed, so that all publish at the same step) */
    int32_t busy = !__atomic_load_n(&t->async->done, __ATOMIC_ACQUIRE);
    if (t->mesh) pt_allreduce_sum(t->mesh->world, &busy, 1, PT_DTYPE_I32);
    return busy ? PT_OK : pt_save_publish(t);
}

pt_status pt_trainer_save_wait(pt_trainer *t) {
    if (!t->async || !t->async->pending) return PT_OK;
    return pt_save_publish(t);
}

/* The run loop's periodic checkpoint: in the background (checkpoint.async) but for the last
 * step's, which the run waits for anyway. */
static pt_status pt_trainer_checkpoint(pt_trainer *t) {
    if (t->async && t->step < t->cfg.training.steps) return pt_trainer_save_start(t);
    return pt_trainer_save(t);
}

pt_rank_memory pt_trainer_rank_memory(const pt_trainer *t) {
    pt_dp_memory m = pt_trainer_memory(t);
    return (pt_rank_memory){m.params, m.grads, m.optim, m.params_transient, m.grads_transient,
                            pt_trainer_act_bytes(t)};
}

/* A signal reached a rank (pt/preempt.h; every rank has agreed, at the same step boundary):
 * save unless the newest checkpoint is of this step (then finish it, if it is being written in
 * the background), and stop with t->preempted set. */
static pt_status pt_trainer_preempt(pt_trainer *t, const char *why, int64_t saved) {
    const char *dir = t->cfg.checkpoint.dir;
    t->preempted = 1;
    if (!dir[0]) {
        pt_log_warn("preempted after step %lld (%s): no checkpoint saved (checkpoint.dir is not "
                    "set); exiting with %d", (long long)t->step, why, PT_EXIT_PREEMPTED);
        return PT_OK;
    }
    pt_log_info("preempted after step %lld (%s): saving a checkpoint, then exiting with %d",
                (long long)t->step, why, PT_EXIT_PREEMPTED);
    if (t->step == saved) {
        pt_log_info("checkpoint of step %lld already %s", (long long)t->step,
                    t->step ? "saved" : "unneeded (no step taken)");
        return pt_trainer_save_wait(t);
    }
    return pt_trainer_save(t); /* (after a background save still pending) */
}

/* logging.trace: this rank's events of steps a..b to DIR/trace-rankR.json; recording stops. */
static pt_status pt_trainer_trace_write(pt_trainer *t, int64_t a, int64_t b) {
    pt_trace_record(0);
    const pt_mesh *m = t->mesh;
    int rank = m ? m->world_rank : 0;
    char path[sizeof t->cfg.logging.trace + 32], label[128];
    snprintf(path, sizeof path, "%s/trace-rank%d.json", t->cfg.logging.trace, rank);
    if (m)
        snprintf(label, sizeof label, "rank %d: dp %d, pp %d, cp %d, tp %d, ep %d", rank, m->dp_i,
                 m->pp_i, m->cp_i, m->tp_i, m->ep_i);
    else
        snprintf(label, sizeof label, "rank 0");
    PT_TRY(pt_trace_write(path, label));
    if (rank == 0)
        pt_log_info("logging.trace: steps %lld-%lld written to %s/trace-rank*.json (pentatron trace "
                    "merge %s joins them)", (long long)a, (long long)b, t->cfg.logging.trace,
                    t->cfg.logging.trace);
    pt_trace_close();
    return PT_OK;
}

/* The head split over the stages: what the run measured (each stage's seconds per step in its
 * layers and in its rows of the head) and the rows that would balance those times, logged for
 * parallel.pp_head_rows (the split itself is fixed for a run: its rows are the parameters'). */
static void pt_trainer_head_balance(const pt_trainer *t) {
    if (!t->model.par.head_split || !t->pp_timed || t->mesh->deg.pp > 64) return;
    int S = t->mesh->deg.pp, rows[64], now[64];
    pt_layout_head_rows(&t->lay, now);
    pt_pipe_head_balance(S, t->pp_layers_s, t->pp_head_s, now, rows);
    char line[1024];
    size_t n = 0;
    for (int i = 0; i < S && n < sizeof line; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d: %.4f + %.4f s", i ? ", " : "", now[i],
                              t->pp_layers_s[i] / t->pp_timed, t->pp_head_s[i] / t->pp_timed);
    pt_log_info("pipeline: per step, each stage's head rows: its layers' + its head's seconds: %s",
                line);
    n = 0;
    for (int i = 0; i < S && n < sizeof line; i++)
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%d", i ? "," : "", rows[i]);
    pt_log_info("pipeline: these times are balanced by parallel.pp_head_rows = %s", line);
}

pt_status pt_trainer_run(pt_trainer *t) {
    const pt_config *cfg = &t->cfg;
    int64_t first = t->step, total = cfg->training.steps;
    double start = pt_now();
    /* the line updated in place between logged steps: on a terminal only */
    /* (under mpirun, ranks' stdout is a forwarded pseudo-terminal: no live line there) */
    int live = cfg->logging.progress && isatty(STDOUT_FILENO) && cfg->logging.every > 1 &&
               (!t->mesh || t->mesh->world_size == 1);
    pt_metrics_begin(&t->metrics); /* communication counted from here */
    pt_report_mark mark = pt_report_mark_now(t->mesh, t->step);
    char report_json[PT_PATH_MAX + 16] = ""; /* beside the metrics: `pentatron report` reads it */
    if (cfg->logging.metrics[0]) {
        const char *slash = strrchr(cfg->logging.metrics, '/');
        int dir = slash ? (int)(slash - cfg->logging.metrics) + 1 : 0;
        snprintf(report_json, sizeof report_json, "%.*sreport.json", dir, cfg->logging.metrics);
        if (!strcmp(report_json, cfg->logging.metrics)) report_json[0] = 0; /* never the metrics */
    }
    pt_report_run run = {report_json, total, t->pipe.model ? &t->pipe.sched : NULL, t->pipe.head_cost};
    int64_t trace_a = 0, trace_b = -1;
    if (cfg->logging.trace[0]) {
        PT_TRY(pt_config_trace_steps(cfg, &trace_a, &trace_b));
        pt_trace_open(t->mesh ? t->mesh->world_rank : 0, (size_t)cfg->logging.trace_events);
        if (trace_a <= first + 1 && trace_b > first) pt_trace_record(1);
    }
    int64_t saved = first; /* the step of the newest checkpoint (preempt) */
    while (t->step < total) {
        char why[160];
        t->loop_t0 = pt_now();
        if (pt_preempt_agree(t->mesh ? t->mesh->world : NULL, why, sizeof why))
            return pt_trainer_preempt(t, why, saved);
        pt_step_stats s;
        PT_TRY(pt_trainer_step(t, &s));
        /* a loss that does not depend on the weights (outputs saturated or vanished: init_std or
         * norm_eps far off) trains "fine" at ln(V) for ever: said once, at this run's first step
         * (a sane model's first gradient norm is ~1e-2 or more, one of init_std 1e-8 ~1e-5) */
        if (s.step == first + 1 && isfinite(s.grad_norm) && s.grad_norm < 1e-10 &&
            (!t->mesh || t->mesh->world_rank == 0))
            pt_log_warn("step %lld: gradient norm %.3g: the model cannot learn (its loss does not "
                        "depend on its weights); check model.init_std (%g) and model.norm_eps (%g)",
                        (long long)s.step, s.grad_norm, (double)cfg->model.init_std,
                        (double)cfg->model.norm_eps);
        int64_t ev = cfg->eval.every;
        s.evaluated = t->val.n_shards > 0 && ((ev > 0 && t->step % ev == 0) || t->step == total);
        if (s.evaluated) {
            double t0 = pt_now();
            PT_TRY(pt_trainer_eval(t, &s.val_loss));
            s.val_seconds = pt_now() - t0;
            s.val_tokens = t->eval_batches * cfg->training.global_batch * cfg->training.seq_len;
        }
        pt_rank_memory mem = pt_trainer_rank_memory(t);
        s.peak_rss_bytes = pt_peak_rss_bytes(); /* one value for the line, the JSON and the events */
        pt_comm_window w;
        pt_metrics_window(&t->metrics, s.step, &w);
        PT_TRY(pt_metrics_write(&t->metrics, &s, &w, &cfg->model, &mem));
        PT_TRY(pt_tb_write(&t->tb, &s, &w, &cfg->model, &mem));
        /* the trace covers what the metrics of steps A..B count: from A − 1's line to B's */
        if (cfg->logging.trace[0] && s.step == trace_a - 1) pt_trace_record(1);
        if (cfg->logging.trace[0] && s.step == trace_b) PT_TRY(pt_trainer_trace_write(t, trace_a, trace_b));
        char progress[64];
        pt_progress_bar(s.step, total, pt_now() - start, first, progress, sizeof progress);
        if (s.step % cfg->logging.every == 0 || s.step == total || s.step == first + 1) {
            if (live) printf("\r\033[K");
            pt_step_print(&s, total, progress);
        } else if (live) {
            /* between logged steps, a terminal shows one line that updates in place */
            printf("\r\033[Kstep %lld/%lld | loss %.4f | %s", (long long)s.step, (long long)total,
                   s.loss, progress);
            fflush(stdout);
        }
        if (s.evaluated) {
            if (live) printf("\r\033[K");
            pt_log_info("eval at step %lld: val loss %.4f | %lld tokens in %.2f s", (long long)s.step,
                        s.val_loss, (long long)s.val_tokens, s.val_seconds);
        }
        PT_TRY(pt_trainer_save_poll(t)); /* a background save done everywhere: published */
        int64_t every = cfg->checkpoint.every;
        if (cfg->checkpoint.dir[0] && ((every > 0 && t->step % every == 0) || t->step == total)) {
            PT_TRY(pt_trainer_checkpoint(t));
            saved = t->step;
        }
        int64_t report = cfg->logging.report_every;
        if ((report > 0 && t->step % report == 0) || t->step == total) {
            pt_report_print(t->mesh, &mark, t->step, &mem, &run);
            mark = pt_report_mark_now(t->mesh, t->step);
        }
    }
    pt_trainer_params_ready(t); /* the last update's gathers */
    pt_trainer_head_balance(t);
    if (pt_trace_on()) PT_TRY(pt_trainer_trace_write(t, trace_a, t->step)); /* ended before B */
    return PT_OK;
}
