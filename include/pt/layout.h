/* layout.h: a 5D layout resolved, in one place: degrees → groups, the parallel tables installed
 * into the model, pipeline chunks, data-parallel regions and the ranges each rank owns, and the
 * rule for which groups a sum (losses, gradient norm, expert load) runs over.
 *
 * It takes numbers (pt_layout_spec), not the trainer's config, and gives the trainer what it
 * needs to run a step: the model's pt_model_parallel, the data-parallel instances (dp for the
 * dense region, dpe for the experts'), the schedule. The trainer keeps the training loop.
 */
#ifndef PT_LAYOUT_H
#define PT_LAYOUT_H

#include "pt/data_parallel.h"
#include "pt/mesh.h"
#include "pt/model.h"
#include "pt/schedule.h"

/* What a layout is made of. */
typedef struct {
    pt_degrees deg;        /* -1: the rest of the world */
    int sp;                /* sequence parallelism */
    int cp_zigzag;         /* the zigzag split of each sequence over the cp ranks */
    int overlap;           /* communication overlapped with computation (dp buckets, cp ring) */
    int zero;              /* ZeRO stage */
    int zero_scope;        /* ZeRO's shard group: 0 the data group, -1 a host's dp ranks, N dp
                            * ranks (HSDP: replicated over the others; pt_degrees.zs) */
    double bucket_mb;      /* data-parallel bucket size */
    double timeout_s;      /* every wait's limit */
    int micro_batch, seq_len, global_batch;
    const char *pp_schedule; /* afab, 1f1b, interleaved, zb */
    int pp_virtual;
    const char *pp_layers; /* layers per stage, "" for balanced */
    const char *pp_head;   /* "last" (or NULL) | "split": the head over the pipeline ranks */
    const char *pp_head_rows; /* split: vocabulary rows per stage, "" for balanced */
} pt_layout_spec;

typedef struct {
    pt_mesh *mesh;           /* NULL: one process */
    pt_model_parallel par;   /* what the model is given: its blocks, chunks and tables */
    pt_comm *dpc;            /* the data group (dp × cp: their gradients are summed together) */
    int dp_rank, dp_size;    /* this rank's rows of the global batch */
    int zero;                /* the ZeRO stage in force (0 when one rank reduces alone) */
    int red;                 /* ranks of the data group */
    int shard;               /* ranks of ZeRO's shard group (red, or HSDP's dps) */
    int rep_i;               /* HSDP: this rank's replica (shard group), else 0 */
    int cp, cp_rank, T_local; /* this rank's tokens of each sequence */
    int32_t *pos;            /* (T_local) their global positions (host) */
    int pp;                  /* pipeline stages (ranks) */
    pt_sched_kind sched;
    int *head_rows;          /* the head split over the stages: each stage's vocabulary rows */
    size_t dense;            /* where the experts' region starts in the table */
    size_t alloc;            /* elements of the model's buffers (padded for even shards) */
    pt_dp dp, dpe;           /* the data-parallel instances: dense region, experts' region */
} pt_layout;

/* The most pipeline stages (pp × model chunks per rank). */
enum { PT_LAYOUT_MAX_STAGES = PT_MAX_CHUNKS * 16 };
/* Whether the layout s with the degrees d (resolved: no -1) can run the model mc: every check of
 * pt_layout_init that needs no ranks (divisibility of the batch, heads, ffn, experts and sequence
 * by the degrees, the schedule's chunks, ZeRO under a pipeline, the head split), the first failure
 * as PT_ERR_CONFIG naming the keys. `pentatron plan` calls it too, for the trainer's messages. */
pt_status pt_layout_check(const pt_layout_spec *s, const pt_degrees *d, const pt_model_config *mc);
/* Resolves the layout for a model over MPI's world (distributed) or one process, builds the
 * groups and the parallel tables; PT_ERR_CONFIG with one message naming what does not fit. */
pt_status pt_layout_init(pt_layout *l, const pt_layout_spec *s, const pt_model_config *mc,
                         pt_backend *be, int distributed);
/* The data-parallel instances over a model made with l->par, l->alloc and
 * pt_dp_model_flags(l->zero); reduce_bf16: gradients reduced in bf16 (pt_dp_reduce_bf16). */
pt_status pt_layout_init_data(pt_layout *l, pt_model *m, double bucket_mb, int overlap,
                              int reduce_bf16);
/* The ranges this rank's optimizer owns (NULL, n = 1: the whole table); free() the result. */
pt_owned_range *pt_layout_owned_ranges(pt_layout *l, int *n);
/* Frees the groups and data-parallel instances; the tables after the activations that use
 * them (pt_layout_free_tables). */
void pt_layout_free(pt_layout *l);
void pt_layout_free_tables(pt_layout *l);

/* The step's sums, each over the groups where the parts live: the loss (pipeline: the last
 * stage's), Σ g² of the owned gradients (tp blocks, pipeline stages, ZeRO shards, expert ranks:
 * replicas counted once), the balancing losses and the expert load. */
void pt_layout_sum_step(const pt_layout *l, double *loss, double *sumsq, double aux[2],
                        double *load, size_t n_load);
/* Per-layer counts of a step (the global balancing scope's token-slots, m->aux_count) summed
 * over every data and context rank's tokens and every pipeline stage's layers. */
void pt_layout_sum_counts(const pt_layout *l, double *x, size_t n);
/* An evaluation's sum of token losses over the ranks that hold parts of it: the last pipeline
 * stage's, every data and context rank's rows (the tp ranks each hold the whole). */
void pt_layout_sum_loss(const pt_layout *l, double *loss);
/* The tied embedding's two copies' gradients summed (first and last pipeline stage). */
void pt_layout_sum_tied(const pt_layout *l, pt_model *m);
/* A host array of the local table assembled into the global one (gtable.total) on every rank:
 * each block's owner contributes it, the other groups' parts summed in (x + 0 is exact). */
void pt_layout_to_global(const pt_layout *l, const pt_model *m, const float *local, float *global);
/* The owned slices of a host array of the local table (a ZeRO rank's gradients) summed over the
 * data groups, so that every rank holds the whole (reduced) local table. */
void pt_layout_gather_owned(const pt_layout *l, float *local, size_t n);
/* Whether this rank writes its owned blocks to a checkpoint (replicas write once). */
int pt_layout_writes(const pt_layout *l);
/* The parameters from / into a host array of the local table, wherever ZeRO keeps them. */
void pt_layout_set_params(pt_layout *l, pt_model *m, const float *local);
void pt_layout_get_params(pt_layout *l, pt_model *m, float *local);
/* The head split over the pipeline stages: each stage's vocabulary rows (pp of them). */
void pt_layout_head_rows(const pt_layout *l, int *rows);
/* Model-state bytes per rank (parameters, gradients, optimizer of optim_elems). */
pt_dp_memory pt_layout_memory(const pt_layout *l, const pt_model *m, size_t optim_elems);

#endif
