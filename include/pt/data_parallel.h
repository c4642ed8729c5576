/* data_parallel.h: gradient reduction over the data-parallel group, in buckets overlapped with the
 * backward pass, and ZeRO stages 1–3.
 *
 * The model tells its owner, unit by unit (embedding, each layer, the tail: see pt_model_hooks in
 * model.h), when it needs a unit's parameters or gradients and when it is done with them. This
 * module hangs everything on those calls:
 *
 *   zero = 0  Buckets are ranges of the flat gradient buffer, about parallel.bucket_mb each and a
 *             multiple of the group size, cut from its end (the backward pass finishes the buffer
 *             from the end). When every unit a bucket overlaps has released its gradients, the
 *             bucket's all-reduce starts, as its two halves: a reduce-scatter, then an
 *             all-gather of the reduced slices, started once units holding 40% of the bucket's
 *             elements have been released after it (a point every rank shares).
 *   zero = 1  The same buckets, each a multiple of the group size, reduce-scattered instead: each
 *             rank keeps the sum of its slice of every bucket, updates just that (its optimizer
 *             state covers only its slices) and the parameters are all-gathered after the step.
 *             Both 0 and 1 reduce only on the last micro-batch of an accumulation.
 *   zero = 2  Buckets are whole units (consecutive units merged up to bucket_mb). There is no full
 *             gradient buffer: when the model acquires a unit's gradients, its bucket gets a
 *             buffer from a small pool; when all the bucket's units are released, the buffer is
 *             reduce-scattered, the rank's slice added into its gradient shard, and the buffer
 *             returned. This happens on every micro-batch. Under a pipeline, whose stages run
 *             the micro-batches' backward passes interleaved with other passes, a bucket is
 *             reduced once every unit of it has released its gradients and no backward pass
 *             holds them any longer (a split backward's weight pass releases them after its
 *             input pass, possibly after another micro-batch's input pass: their gradients are
 *             then reduced together); the next micro-batch's gradients go to a new buffer.
 *   zero = 3  As 2, one unit per bucket, and parameters are sharded too: acquiring a unit's
 *             parameters all-gathers them into a pooled buffer (the next unit's gather is started
 *             at once, so it overlaps this unit's compute), releasing returns the buffer.
 *
 * A bf16 model (training.precision = bf16) under ZeRO-1/2 keeps its fp32 masters sharded as the
 * moments are (Megatron's distributed optimizer): each rank holds the masters of its slices only,
 * the optimizer updates them there, and the gather after the step rounds them to bf16 and moves
 * the bf16 weights straight into the model's bf16 copy (half the bytes of fp32 values). ZeRO-3
 * keeps them sharded too and gathers bf16 unit by unit.
 *
 * HSDP (parallel.zero_scope): the group is a shard group, and each ZeRO stage as above within it;
 * a replicate group (the ranks holding the same shards in the other shard groups) sums each
 * bucket's reduced slice by an all-reduce once its reduce-scatter is done, the slices' all-reduces
 * started in the order the buckets started (the same on every rank).
 *
 * With ZeRO a bucket [lo, hi) is split into N shards of shard = ⌈(hi − lo)/N⌉ elements; rank r
 * owns [lo + r·shard, min(lo + (r+1)·shard, hi)). Stages 2 and 3 keep the owned slices of every
 * bucket one after another in shard buffers (gradients; with 3 also parameters).
 */
#ifndef PT_DATA_PARALLEL_H
#define PT_DATA_PARALLEL_H

#include "pt/comm.h"
#include "pt/model.h"

/* A range one rank's optimizer owns: elements [lo, hi) of the table, whose parameters are at
 * param, gradients at grad (device pointers to element lo: into the model's buffers, or into
 * ZeRO's shards), moments at off in the optimizer's buffers. param = grad = NULL means the
 * model's own buffers. */
typedef struct {
    size_t lo, hi, off;
    float *param, *grad;
} pt_owned_range;

typedef struct {
    size_t lo, hi;       /* [lo, hi) of the table (zero ≤ 1: of the padded buffer) */
    size_t shard;        /* elements per rank with ZeRO (padded) */
    size_t sh_off;       /* zero ≥ 2: offset of this rank's slice in the shard buffers */
    int u0, u1;          /* the units the bucket overlaps */
    pt_comm_req *req;    /* pending gradient reduction */
    int started;
    int gathering;       /* zero = 0: req is the second phase (all-gather of the reduced slices) */
    int gathered;        /* zero = 0: both phases done */
    size_t start_released; /* zero = 0: elements released when its reduce-scatter started */
    float *gbuf;         /* zero ≥ 2: the bucket's gradients (shard·N), while in use */
    float *pbuf;         /* zero = 3: its gathered parameters (shard·N), while resident */
    pt_comm_req *preq;   /* zero = 3: pending gather into pbuf */
    size_t w_off;        /* grad_reduce = bf16: the bucket's offset in g16 */
    int rep_phase;       /* HSDP: req is the slice's all-reduce over the replicas */
    int queued;          /* HSDP: waiting in rep_q for its replicas' all-reduce to start */
} pt_dp_bucket;

/* Bytes per rank of model state: what persists, and the peak of the pooled buffers. */
typedef struct {
    size_t params, grads, optim;
    size_t params_transient, grads_transient;
} pt_dp_memory;

typedef struct {
    pt_comm *comm;
    pt_model *model;
    int zero;
    int overlap;           /* start reductions from the hooks (else after backward) */
    int n_buckets;
    pt_dp_bucket *b;       /* b[0] is the bucket at the end of the buffer (ready first) */
    int *unit_bucket;      /* zero ≥ 2: the bucket of each unit */
    size_t *unit_lo, *unit_hi;
    unsigned char *unit_final; /* gradients released in the current micro-batch */
    int *unit_open;        /* zero ≥ 2: backward passes that acquired the unit's gradients and
                            * have not released them yet (a split backward's input pass leaves
                            * them to its weight pass, which may come after other passes) */
    int armed;
    size_t released;       /* elements whose gradients were released in this micro-batch (the
                            * same sequence of points on every rank) */
    float *gshard, *pshard; /* zero ≥ 2: owned gradient slices; zero = 3 (and masters): owned
                             * parameters */
    size_t n_shard;
    /* zero = 1 or 2 with a bf16 model: the fp32 masters are sharded (pshard, the owned slices of
     * every bucket), the model holds only its bf16 copy, and the step's gathers move bf16 */
    int masters;
    size_t gather_elems;   /* the largest bucket's elements over the group (shard·N) */
    /* the pool of bucket-sized buffers */
    float **pool;
    int pool_n, pool_cap;
    size_t buf_elems;
    int live_g, live_p, peak_g, peak_p;
    double comm_seconds;   /* time spent waiting on the reductions after backward */
    double gather_seconds; /* time spent waiting on ZeRO-1/2's parameter gathers */
    int fin;               /* pt_dp_next_final: the next bucket to report */
    int gather_next;       /* ZeRO-1/2: the next bucket whose gather to start (descending) */
    int gathers_pending;   /* ZeRO-1/2: gathers started and not yet completed */
    /* a region of the buffer with its own group (expert parallelism: the dense tensors over the
     * data ranks, the experts over the expert-data ranks); plain: ZeRO-0 by all-reduces */
    int plain;
    size_t region_lo, region_hi;
    pt_bf16 *pshard16;     /* zero = 3, bf16 model: the bf16 copy of pshard, what gathers move */
    pt_bf16 *g16;          /* parallel.grad_reduce = bf16: every bucket's gradients on the wire */
    size_t g16_elems;
    pt_model_hooks next;   /* the hooks installed before this instance's, called after it */
    pt_comm *rep;          /* HSDP: the replicate group (NULL: none) */
    int *rep_q, rep_head, rep_n; /* HSDP: the buckets whose reduce-scatter started, in order */
} pt_dp;

/* Elements the model's own buffers need (the table rounded up for even shards), and
 * the PT_MODEL_NO_* flags for pt_model_init_ex: what ZeRO-2/3 keep sharded instead. */
size_t pt_dp_padded_total(size_t total, int group_size, int zero);
int pt_dp_model_flags(int zero, int bf16);

/* The bucket size in MiB: bucket_mb, or for 0 (auto) an eighth of the region's gradients between
 * 1 and 25 MiB (PyTorch DDP's 25 MiB suits large models; a small model's gradients then fit in
 * one or two buckets, the first of which waits for the embedding at the very end of backward:
 * docs/benchmarks.md measures the difference). */
double pt_dp_bucket_mb(double bucket_mb, size_t elems);
pt_status pt_dp_init(pt_dp *d, pt_comm *comm, pt_model *model, int zero, double bucket_mb,
                     int overlap);
void pt_dp_free(pt_dp *d);
/* Elements [lo, hi) of the model's buffers only, over the group comm: ZeRO-0 with plain
 * all-reduces, or ZeRO-1 (hi − lo a multiple of the group size). Several instances chain their
 * hooks, each reducing its region over its own group (expert parallelism: the dense tensors over
 * the data ranks, the experts over the ranks holding the same experts). */
pt_status pt_dp_init_region(pt_dp *d, pt_comm *comm, pt_model *model, int zero, size_t lo,
                            size_t hi, double bucket_mb, int overlap);
/* HSDP, after pt_dp_init(_region) over a shard group: each reduced slice is then summed over rep
 * (ZeRO-1 to 3). */
void pt_dp_set_replicas(pt_dp *d, pt_comm *rep);
/* parallel.grad_reduce = bf16: each bucket's gradients (accumulated in fp32) are rounded to bf16,
 * reduced with bf16 sums (every partial sum rounded) and converted back to fp32 (ZeRO-0, 1, 2;
 * PT_ERR_CONFIG for ZeRO-3). A staging buffer of the region in bf16, allocated now. */
pt_status pt_dp_reduce_bf16(pt_dp *d);
/* The ranges this rank's optimizer owns, with where their parameters and gradients live (the
 * whole table without ZeRO); caller frees. */
pt_owned_range *pt_dp_owned_ranges(const pt_dp *d, int *n);
/* Sets the parameters from a host array of the whole table (each rank keeps what it holds). */
void pt_dp_set_params(pt_dp *d, const float *host);
/* The whole table's parameters into a host array, on every rank (collective with ZeRO-3). */
void pt_dp_get_params(pt_dp *d, float *host);
/* Before the first micro-batch of a step: zeroes the gradients. */
void pt_dp_begin_step(pt_dp *d);
/* Before each micro-batch's forward; last = 1 on the last one of the step. */
void pt_dp_begin_micro(pt_dp *d, int last);
/* After each micro-batch's backward: with zero ≥ 2, or on the last micro-batch, starts what is
 * left and waits for every bucket; after the last, the owned ranges hold the sum over the group.
 * It is pt_dp_end_backward, then pt_dp_next_final until it returns 0. */
void pt_dp_end_micro(pt_dp *d, int last);
/* The same in parts, so that the caller can use each bucket's gradients while the later ones are
 * still on the wire: pt_dp_end_backward starts the reductions not yet started; then each
 * pt_dp_next_final waits for the next bucket (in the order they started) and returns 1 with the
 * range [lo, hi) of the table whose reduced gradients it made final on this rank (the bucket with
 * ZeRO-0, this rank's slice of it with ZeRO ≥ 1), or 0 once every bucket is done. Nothing is
 * reported after a micro-batch that reduces nothing (ZeRO-0/1 before the last). */
void pt_dp_end_backward(pt_dp *d);
int pt_dp_next_final(pt_dp *d, size_t *lo, size_t *hi);
/* After the optimizer updated every owned element below upto (its ranges in ascending order):
 * ZeRO-1/2 start the all-gathers of the buckets whose owned slices lie below it, so that a
 * bucket's parameters travel while the next bucket is updated. */
void pt_dp_params_updated(pt_dp *d, size_t upto);
/* After the optimizer step: starts the gathers pt_dp_params_updated has not (all of them when it
 * was not called) and, with ZeRO-2 or wait = 1, completes them. ZeRO-1 with wait = 0 leaves them
 * in flight: the model's acquire of a unit's parameters (the next forward) completes the gathers
 * of the buckets it lies in, so that they hide behind the compute before it; pt_dp_params_ready
 * completes them all (before anything reads the parameters outside the model's passes:
 * checkpoints, an evaluation, an export; pt_dp_get_params and pt_dp_set_params do it). With
 * ZeRO-3 and a bf16 model refreshes the bf16 copy of the owned shard. */
void pt_dp_gather_params(pt_dp *d, int wait);
void pt_dp_params_ready(pt_dp *d);
/* zero ≥ 2: sums this rank's reduced gradient slice of the unit's bucket over group (a tied
 * embedding's two copies on the first and last pipeline stage, each a bucket of its own). */
void pt_dp_sum_unit(const pt_dp *d, int unit, pt_comm *group);
pt_dp_memory pt_dp_memory_bytes(const pt_dp *d, size_t optim_elems);

#endif
