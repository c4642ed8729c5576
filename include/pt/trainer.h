/* trainer.h: one training run: set-up from a config, optimizer steps, logging, checkpoints.
 *
 * A step reads its global batch (training.global_batch sequences) in micro-batches of
 * training.micro_batch, accumulates gradients, then clips and applies AdamW. The loss of a step
 * is the mean over all non-ignored targets of the whole global batch, whatever the split: each
 * micro-batch's gradient is scaled by 1 / (valid targets of the global batch).
 */
#ifndef PT_TRAINER_H
#define PT_TRAINER_H

#include "pt/backend.h"
#include "pt/config.h"
#include "pt/data.h"
#include "pt/data_parallel.h"
#include "pt/layout.h"
#include "pt/metrics.h"
#include "pt/tensorboard.h"
#include "pt/mesh.h"
#include "pt/model.h"
#include "pt/optim.h"
#include "pt/pipeline.h"


typedef struct {
    pt_config cfg;
    pt_backend *be;
    pt_model model;
    pt_optim opt;
    pt_mix data;                   /* data.train, or the sources of data.sources */
    pt_data val;                   /* data.val, the held-out shards (n_shards 0: none) */
    int64_t eval_batches;          /* global batches of data.val per evaluation */
    pt_moe_stats stats;            /* the step's MoE statistics (its training forwards') */
    pt_layout lay;                 /* the layout: groups, data parallelism, parallel tables */
    pt_mesh *mesh;                 /* = lay.mesh: NULL when MPI is not initialised (one process) */
    pt_pipe pipe;                  /* pipeline parallelism (pipe.model NULL without) */
    pt_acts *acts;                 /* the activations without a pipeline */
    struct pt_run_lock *lock;      /* checkpoint.dir's run lock (rank 0; pt/run_lock.h) */
    char run_id[17];               /* this run's identity, recorded in its checkpoints
                                    * (PT_RUN_ID_LEN hex digits; pt/checkpoint.h) */
    int32_t *h_inputs, *h_targets; /* (global_batch, T) host */
    int32_t *d_inputs, *d_targets, *d_pos;
    int32_t *l_inputs, *l_targets; /* (rows of this rank, its tokens) host */
    /* data.document_mask: where each of this rank's tokens' document starts (device, host), and
     * scratch for one whole sequence's (T, host); NULL without */
    int32_t *d_docs, *l_docs, *h_docs;
    int64_t step;                  /* steps done */
    pt_metrics metrics;            /* logging.metrics (metrics.f NULL: none) */
    pt_tb tb;                      /* logging.tensorboard (tb.f NULL: none) */
    int grads_dumped;
    int preempted;                 /* pt_trainer_run stopped on a signal (pt/preempt.h) */
    int64_t skips_in_row, skips; /* training.on_nonfinite = skip: steps skipped (in a row, in all) */
    double loop_t0; /* pt_trainer_run: when this step's turn of the loop began (before the preemption
                     * agreement, a world all-reduce that waits for every rank and for transfers
                     * still on the links); the step's seconds count from it. 0: from the step */
    const char *inject_nonfinite; /* PT_INJECT_NONFINITE (tests): steps whose gradient is made NaN */
    /* checkpoint.async: the state's host copy, its pieces (allocated at set-up), the save being
     * written by save_thread (save_pending) and whether the thread is done */
    struct pt_trainer_async *async;
    float *bias_host;              /* (n_experts) host scratch of the balancing bias update */
    double peak_flops;             /* measured sgemm FLOP/s of this process */
    double datasheet_flops;        /* a GPU's datasheet bf16 peak, 0 when unknown or on CPUs */
    double flops_per_token;
    /* the head split over the pipeline stages: each stage's layer and head seconds summed over
     * the steps after the first two, for the measured balance logged at the end of a run */
    double pp_layers_s[64], pp_head_s[64];
    int64_t pp_timed;
} pt_trainer;

pt_status pt_trainer_init(pt_trainer *t, const pt_config *cfg);
void pt_trainer_free(pt_trainer *t);
/* The parameters from / into a host array of the whole table, wherever the layout keeps them
 * (collective with ZeRO-3). */
void pt_trainer_set_params(pt_trainer *t, const float *host);
void pt_trainer_get_params(pt_trainer *t, float *host);
/* Saves a checkpoint of the current step: every rank writes what it owns (collective). */
pt_status pt_trainer_save(pt_trainer *t);
/* Loads weights, optimizer state and counters of a checkpoint saved under any layout. */
pt_status pt_trainer_load(pt_trainer *t, const char *dir);
/* The whole model, gathered from every rank's blocks and shards (collective), as an unsplit model
 * on the ranks that ask (on_this_rank), e.g. for generation; free it with pt_model_free. */
pt_status pt_trainer_unsplit(pt_trainer *t, pt_model *out, int on_this_rank);
/* Bytes of activations per rank (with a pipeline: the peak its schedule held). */
size_t pt_trainer_act_bytes(const pt_trainer *t);
/* Bytes of model state per rank (parameters, gradients, optimizer; pooled buffers' peaks). */
pt_dp_memory pt_trainer_memory(const pt_trainer *t);
/* This rank's memory by kind, as the metrics and the run report give it. */
pt_rank_memory pt_trainer_rank_memory(const pt_trainer *t);
/* One optimizer step. */
pt_status pt_trainer_step(pt_trainer *t, pt_step_stats *s);
/* The validation loss: the mean token loss over the first eval_batches global batches of
 * data.val (the same rows every time), a forward pass of the current model in the training
 * layout, its activations reused; the training state (weights, gradients, optimizer, data order,
 * counters) is left as it was (collective). */
pt_status pt_trainer_eval(pt_trainer *t, double *val_loss);
/* checkpoint.async: starts a save of the current step whose shard this rank writes on a thread
 * of its own (collective; a save still pending is finished first) ... */
pt_status pt_trainer_save_start(pt_trainer *t);
/* ...publishes it once every rank has written (collective; call at each step boundary: a no-op
 * until then) ... */
pt_status pt_trainer_save_poll(pt_trainer *t);
/* ...or waits for it and publishes it (collective; nothing pending: nothing to do).
 * pt_trainer_save finishes a pending save first, then saves at once. */
pt_status pt_trainer_save_wait(pt_trainer *t);
/* Steps until training.steps, logging, evaluating and checkpointing as configured. Collective
 * over the world: before each step the ranks agree whether a preemption signal reached any of
 * them (pt/preempt.h); if one did, every rank saves a checkpoint (when checkpoint.dir is set),
 * sets t->preempted and returns PT_OK. */
pt_status pt_trainer_run(pt_trainer *t);

#endif
