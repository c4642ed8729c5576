/* data_parallel.h: gradient reduction over the data-parallel group, in buckets overlapped with the
 * backward pass, and ZeRO-1 (optimizer state sharded over the group).
 *
 * The gradient buffer is cut into buckets: contiguous ranges of the flat buffer taken from its end
 * (the backward pass finishes the buffer from the end: head and final norm, layer L−1, ..., layer
 * 0, embedding), each about parallel.bucket_mb and, with ZeRO, a multiple of the group size so
 * that every rank owns an equal slice of every bucket. The model's on_grads_ready hook reports
 * after each layer that everything from that layer's first tensor up is final; every bucket
 * inside that frontier is started at once with a nonblocking collective, so reduction overlaps the
 * rest of the backward. Only the last micro-batch of an accumulation arms the hook: nothing is
 * reduced on the others.
 *   zero = 0: all-reduce each bucket; every rank updates all parameters.
 *   zero = 1: reduce-scatter each bucket; each rank updates its slice of every bucket (its
 *             optimizer state covers only those slices) and the parameters are all-gathered.
 */
#ifndef PT_DATA_PARALLEL_H
#define PT_DATA_PARALLEL_H

#include "pt/comm.h"
#include "pt/model.h"
#include "pt/optim.h"

typedef struct {
    size_t lo, hi;       /* [lo, hi) of the (padded) gradient buffer */
    size_t shard;        /* (hi − lo) / group size with ZeRO */
    pt_comm_req *req;    /* pending reduction, NULL when not started or done */
    int started;
} pt_dp_bucket;

typedef struct {
    pt_comm *comm;
    pt_model *model;
    int zero;
    int n_buckets;
    pt_dp_bucket *b;       /* b[0] is the bucket at the end of the buffer (ready first) */
    size_t *layer_start;   /* offset of each layer's first tensor */
    size_t padded_total;
    double comm_seconds;   /* time spent waiting on the reductions after backward */
} pt_dp;

/* Builds the buckets for the model's table; pad_total is the model's padded buffer length (a
 * multiple of the group size when zero ≥ 1). */
pt_status pt_dp_init(pt_dp *d, pt_comm *comm, pt_model *model, int zero, double bucket_mb);
void pt_dp_free(pt_dp *d);
/* The ranges this rank's optimizer owns (all of it without ZeRO); caller frees. */
pt_optim_range *pt_dp_owned_ranges(const pt_dp *d, int *n);
/* Call before the last micro-batch's forward: arms the hook that starts the buckets. */
void pt_dp_arm(pt_dp *d);
/* After backward: starts what is left, waits for every bucket; the owned ranges then hold the
 * sum over the group of the gradients. */
void pt_dp_finish_grads(pt_dp *d);
/* After the optimizer step with ZeRO-1: all-gathers the updated parameters. */
void pt_dp_gather_params(pt_dp *d);
/* Elements of the model buffers to allocate: the table rounded up for even shards. */
size_t pt_dp_padded_total(size_t total, int group_size, int zero);

#endif
