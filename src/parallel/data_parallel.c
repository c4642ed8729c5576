/* data_parallel.c: data parallelism, ZeRO 0–3 (the stages are described in data_parallel.h).
 *
 * Each data rank runs the whole model (its tensor, pipeline and expert share of it) on its rows of
 * the batch; the gradients are summed over the data group (dp × cp: context ranks hold other
 * tokens of the same sequences). The module follows the model through pt_model_hooks: a unit's
 * release of its gradients starts the reductions of the buckets it completes, overlapped with the
 * rest of backward; with ZeRO the optimizer state (1), the gradients (2) and the parameters (3)
 * are sharded over the group, parameters gathered after the step (1, 2) or unit by unit before
 * use (3). With experts, layout.c makes one instance per region (dense, experts). It owns its
 * buckets, shard buffers and a small pool of bucket-sized buffers; the group is dp (or dpcp, edp). */
#include "pt/data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t pt_dp_padded_total(size_t total, int group_size, int zero) {
    if (zero >= 2 || group_size <= 1) return total;
    size_t g = (size_t)group_size;
    return (total + g - 1) / g * g;
}

int pt_dp_model_flags(int zero, int bf16) {
    if (zero >= 3) return PT_MODEL_NO_PARAMS | PT_MODEL_NO_GRADS | PT_MODEL_NO_PARAMS16;
    int flags = zero == 2 ? PT_MODEL_NO_GRADS : 0;
    /* a bf16 model under ZeRO-1/2: the fp32 masters are sharded here, the model keeps its bf16
     * copy whole */
    if (bf16 && zero >= 1) flags |= PT_MODEL_NO_PARAMS;
    return flags;
}

/* ------------------------------------------------------------------------------------------ */
/* the pool of bucket-sized buffers (zero ≥ 2) */

static float *pt_pool_get(pt_dp *d, int *live, int *peak) {
    float *buf = d->pool_n ? d->pool[--d->pool_n]
                           : d->model->be->alloc(d->model->be, d->buf_elems * sizeof(float));
    if (++*live > *peak) *peak = *live;
    return buf;
}

static void pt_pool_put(pt_dp *d, float *buf, int *live) {
    if (d->pool_n == d->pool_cap) {
        d->pool_cap = d->pool_cap ? 2 * d->pool_cap : 8;
        d->pool = pt_realloc(d->pool, (size_t)d->pool_cap * sizeof *d->pool);
    }
    d->pool[d->pool_n++] = buf;
    --*live;
}

/* This rank's slice of a bucket: [own_lo, own_hi) of the table, possibly empty. */
static size_t pt_own_lo(const pt_dp *d, const pt_dp_bucket *b) {
    return b->lo + (size_t)d->comm->rank * b->shard;
}
static size_t pt_own_len(const pt_dp *d, const pt_dp_bucket *b) {
    size_t lo = pt_own_lo(d, b);
    if (lo >= b->hi) return 0;
    return b->hi - lo < b->shard ? b->hi - lo : b->shard;
}

/* The part of the rank's slice that holds the table's elements (a ZeRO-1 slice may run into the
 * padding past the table's end, which holds zeros). */
static size_t pt_own_held(const pt_dp *d, const pt_dp_bucket *b) {
    size_t lo = pt_own_lo(d, b), len = pt_own_len(d, b), total = d->model->table.total;
    if (lo >= total) return 0;
    return total - lo < len ? total - lo : len;
}

/* The model's views of the bucket's units at buf (NULL: cleared); a bf16 model computes with the
 * bf16 parameters that zero = 3 gathers (pt_gather_start). */
static void pt_point_bucket(pt_dp *d, const pt_dp_bucket *b, int use, float *buf) {
    for (int u = b->u0; u <= b->u1; u++) {
        if (use == PT_USE_PARAMS && d->pshard16)
            pt_model_point16(d->model, u, (pt_bf16 *)(void *)buf, b->lo, b->hi);
        else
            pt_model_point(d->model, u, use, buf, b->lo, b->hi);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* gradient reduction */

/* ZeRO-0's buckets whose reduce-scatter is in flight or done: wait for it and start the
 * all-gather. Called only at points every rank reaches in the same order (a bucket start, the end
 * of backward), since collectives must be started in the same order on every rank. */
/* ZeRO-0 starts a bucket's all-gather once units holding this share of its elements have been
 * released after its reduce-scatter started (measured: 0.4 hides the most on both bench models) */
#define PT_DP_GATHER_AFTER 0.4

/* ZeRO-0/1: the rank's reduced slice, left at the start of the bucket by the in-place
 * reduce-scatter, moved to its place (rank r's at lo + r·shard: past the first, no overlap). */
/* The bucket's gradients as they travel: the model's buffer (zero ≤ 1) or the pooled gbuf (zero
 * ≥ 2) in fp32, or their bf16 copy (parallel.grad_reduce = bf16: rounded when the bucket starts,
 * reduced with bf16 sums, its result converted back when the bucket is done). */
static void *pt_wire(pt_dp *d, const pt_dp_bucket *b) {
    if (d->g16) return d->g16 + b->w_off;
    return d->zero >= 2 ? b->gbuf : d->model->grads + b->lo;
}

static size_t pt_wire_size(const pt_dp *d) { return d->g16 ? sizeof(pt_bf16) : sizeof(float); }

static pt_dtype pt_wire_type(const pt_dp *d) { return d->g16 ? PT_DTYPE_BF16 : PT_DTYPE_F32; }

/* zero ≤ 1: the reduced slice, left at the start of the bucket by the in-place reduce-scatter,
 * to its place */
static void pt_dp_move_slice(pt_dp *d, const pt_dp_bucket *b) {
    size_t own = pt_own_lo(d, b), es = pt_wire_size(d);
    pt_backend *be = d->model->be;
    char *w = pt_wire(d, b);
    if (own != b->lo) be->copy(be, w + (own - b->lo) * es, w, b->shard * es);
}

static void pt_dp_second_phase(pt_dp *d, int all) {
    if (d->plain) return;
    for (int i = 0; i < d->n_buckets; i++) {
        pt_dp_bucket *b = &d->b[i];
        if (!b->started || b->gathering || b->gathered) continue;
        /* not yet: the units released since its reduce-scatter started hold fewer than
         * PT_DP_GATHER_AFTER of its elements (their backward is the time it has had) */
        if (!all && (double)(d->released - b->start_released) < PT_DP_GATHER_AFTER * (b->hi - b->lo))
            continue;
        if (b->req) pt_comm_wait(d->comm, b->req);
        b->req = NULL;
        pt_dp_move_slice(d, b);
        b->gathering = 1;
        b->req = d->comm->iallgather(d->comm, NULL, pt_wire(d, b), b->shard, pt_wire_type(d));
    }
}

static void pt_dp_start(pt_dp *d, pt_dp_bucket *b) {
    pt_dtype dt = pt_wire_type(d);
    void *w = pt_wire(d, b);
    if (d->g16) /* bf16 on the wire: the bucket's fp32 gradients rounded */
        d->model->be->to_bf16(d->model->be, w, d->zero >= 2 ? b->gbuf : d->model->grads + b->lo,
                              d->zero >= 2 ? b->shard * (size_t)d->comm->size : b->hi - b->lo);
    if (d->plain) {
        b->req = d->comm->iallreduce(d->comm, w, b->hi - b->lo, dt);
        b->gathering = 1; /* nothing follows it */
    } else {
        /* zero ≤ 1 in place: the rank's reduced slice lands at the start of the bucket; moved
         * afterwards. ZeRO-0 then all-gathers the slices: the ring all-reduce as its two halves,
         * the second started when the next bucket starts (MPI's nonblocking all-reduce,
         * progressed from our polls, overlapped far worse) */
        if (d->zero == 0) pt_dp_second_phase(d, 1);
        b->req = d->comm->ireduce_scatter(d->comm, NULL, w, b->shard, dt);
        if (d->rep) {
            d->rep_q[(d->rep_head + d->rep_n++) % d->n_buckets] = (int)(b - d->b);
            b->queued = 1;
        }
    }
    b->started = 1;
    b->start_released = d->released;
}

/* A collective of the bucket completed. ZeRO-1: its reduced slice moves to its place in the
 * bucket. ZeRO-0: the same when the all-gather is not yet started (else the bucket is whole).
 * zero ≥ 2: the slice joins the shard and the buffer goes back to the pool. */
static void pt_dp_done(pt_dp *d, pt_dp_bucket *b) {
    b->req = NULL;
    int moved = b->rep_phase; /* (HSDP: before its all-reduce over the replicas) */
    b->rep_phase = 0;
    pt_backend *be = d->model->be;
    if (d->zero <= 1) {
        if (b->gathering) {
            b->gathering = 0;
            b->gathered = 1;
            if (d->g16) be->from_bf16(be, d->model->grads + b->lo, pt_wire(d, b), b->hi - b->lo);
        } else if (d->zero == 1) {
            if (!moved) pt_dp_move_slice(d, b);
            if (d->g16) /* the owned slice back in fp32 (the rest of the bucket is not used) */
                be->from_bf16(be, d->model->grads + pt_own_lo(d, b),
                              d->g16 + b->w_off + (pt_own_lo(d, b) - b->lo), pt_own_len(d, b));
        }
        return;
    }
    if (d->g16) be->from_bf16(be, b->gbuf, pt_wire(d, b), b->shard);
    be->add(be, d->gshard + b->sh_off, b->gbuf, b->shard);
    pt_point_bucket(d, b, PT_USE_GRADS, NULL);
    pt_pool_put(d, b->gbuf, &d->live_g);
    b->gbuf = NULL;
}

/* HSDP: the reduced slices' all-reduces over the replicas, started in the order the buckets'
 * reduce-scatters started (collectives over a group start in the same order on every member),
 * each as soon as its reduce-scatter and those before it are done. ZeRO-1's slice first to its
 * place in the bucket; ZeRO-2/3's is at the start of the buffer. */
static void pt_dp_rep_flush(pt_dp *d) {
    while (d->rep_n && !d->b[d->rep_q[d->rep_head]].req) {
        pt_dp_bucket *b = &d->b[d->rep_q[d->rep_head]];
        d->rep_head = (d->rep_head + 1) % d->n_buckets;
        d->rep_n--;
        b->queued = 0;
        char *w = pt_wire(d, b);
        if (d->zero == 1) {
            pt_dp_move_slice(d, b);
            w += (pt_own_lo(d, b) - b->lo) * pt_wire_size(d);
        }
        b->rep_phase = 1;
        b->req = d->rep->iallreduce(d->rep, w, b->shard, pt_wire_type(d));
    }
}

/* The bucket's pending collective done (waited for, or tested: 0 while pending): the next phase
 * started, or the reduction finished. */
static int pt_dp_progress(pt_dp *d, pt_dp_bucket *b, int wait) {
    if (!b->req) return 0;
    pt_comm *c = b->rep_phase ? d->rep : d->comm;
    if (wait)
        pt_comm_wait(c, b->req);
    else if (!c->test(c, b->req))
        return 0;
    if (b->queued) { /* HSDP: the reduce-scatter; its replicas' all-reduce next, in order */
        b->req = NULL;
        pt_dp_rep_flush(d);
    } else {
        pt_dp_done(d, b);
    }
    return 1;
}

/* Waits until the bucket's reduction is finished (HSDP: the reduce-scatters queued before it
 * first, so that the all-reduces start in order). */
static void pt_dp_complete(pt_dp *d, pt_dp_bucket *b) {
    while (b->req || b->queued)
        pt_dp_progress(d, b->queued ? &d->b[d->rep_q[d->rep_head]] : b, 1);
}

/* A parameter gather of the bucket completed. ZeRO-2: the bucket's parameters, gathered through a
 * pooled buffer, to their place (its buffer back to the pool); ZeRO-1 gathers in place; ZeRO-3's
 * buffer stays while the unit is in use. */
static void pt_dp_gather_done(pt_dp *d, pt_dp_bucket *b) {
    b->preq = NULL;
    if (d->zero == 3) return;
    d->gathers_pending--;
    if (d->zero == 2) {
        pt_backend *be = d->model->be;
        if (d->masters) /* the bf16 weights */
            be->copy(be, d->model->params16 + b->lo, b->pbuf, (b->hi - b->lo) * sizeof(pt_bf16));
        else
            be->copy(be, d->model->params + b->lo, b->pbuf, (b->hi - b->lo) * sizeof(float));
        pt_pool_put(d, b->pbuf, &d->live_p);
        b->pbuf = NULL;
    }
}

static void pt_dp_gather_wait(pt_dp *d, pt_dp_bucket *b) {
    if (!b->preq) return;
    double t0 = pt_now();
    pt_comm_wait(d->comm, b->preq);
    d->gather_seconds += pt_now() - t0;
    pt_dp_gather_done(d, b);
}

/* MPI progresses nonblocking collectives only inside MPI calls: poke them between layers. */
static void pt_dp_poll(pt_dp *d) {
    for (int i = 0; i < d->n_buckets; i++) {
        pt_dp_bucket *b = &d->b[i];
        pt_dp_progress(d, b, 0);
        if (b->preq && d->comm->test(d->comm, b->preq)) pt_dp_gather_done(d, b);
    }
}

static void pt_dp_poll_hook(void *user) {
    pt_dp *d = user;
    if (d->next.poll) d->next.poll(d->next.user);
    pt_dp_poll(d);
}

static int pt_bucket_final(const pt_dp *d, const pt_dp_bucket *b) {
    for (int u = b->u0; u <= b->u1; u++)
        if (!d->unit_final[u] || d->unit_open[u]) return 0;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* parameter gathers (zero = 3) */

/* The bucket's parameters gathered from every rank's shard: fp32, or for a bf16 model the bf16
 * copies of the shards (half the bytes, into a pooled buffer's first half). */
static void pt_gather_start(pt_dp *d, pt_dp_bucket *b) {
    if (b->pbuf) return;
    b->pbuf = pt_pool_get(d, &d->live_p, &d->peak_p);
    if (d->pshard16)
        b->preq = d->comm->iallgather(d->comm, d->pshard16 + b->sh_off, b->pbuf, b->shard,
                                      PT_DTYPE_BF16);
    else
        b->preq = d->comm->iallgather(d->comm, d->pshard + b->sh_off, b->pbuf, b->shard,
                                      PT_DTYPE_F32);
}

/* zero = 3, bf16 model: the bf16 copy of the owned parameters, after they changed */
static void pt_dp_sync_shard16(pt_dp *d) {
    if (d->pshard16) d->model->be->to_bf16(d->model->be, d->pshard16, d->pshard, d->n_shard);
}

/* The unit whose parameters the model asks for after `unit` (see pt_model_hooks): forward goes
 * up to the final norm and the head, then backward comes down from the last layer to the first
 * (the final norm is still there, the embedding's backward does not read it); an evaluation ends
 * at the head. */
static int pt_next_unit(const pt_dp *d, int unit, int backward) {
    int L = d->model->cfg.n_layers, head = pt_model_head_unit(d->model);
    if (backward == PT_PASS_EVAL) return -1; /* an evaluation's head: no backward follows */
    if (!backward) {
        if (unit <= L) return unit + 1;
        if (unit == L + 1) return head;
        return L; /* after the head */
    }
    return unit == L + 1 ? L : unit > 1 && unit <= L ? unit - 1 : -1;
}

/* ------------------------------------------------------------------------------------------ */
/* the model's hooks */

/* Gradient buffers in use at once with ZeRO-2/3: the tied embedding's (held through the pass),
 * the one being written, and reductions in flight. Past this, a new buffer waits for the oldest
 * reduction, so the gradients never approach the full buffer however slow the network. */
#define PT_DP_MAX_GBUFS 4

static void pt_dp_acquire(void *user, int unit, int use, int backward) {
    pt_dp *d = user;
    if (d->next.acquire) d->next.acquire(d->next.user, unit, use, backward);
    int ub = d->unit_bucket ? d->unit_bucket[unit] : -1; /* zero ≥ 2: -1 for nothing here */
    if (d->zero >= 2 && ub >= 0 && (use & PT_USE_GRADS)) {
        pt_dp_bucket *b = &d->b[ub];
        if (b->started) { /* a later micro-batch's (a pipeline's, within the step): the earlier
                           * gradients' reduction completes, these go to a new buffer */
            pt_dp_complete(d, b);
            b->started = 0;
            for (int u = b->u0; u <= b->u1; u++) d->unit_final[u] = 0;
        }
        if (backward == 1) d->unit_open[unit]++;
        for (int i = 0; !b->gbuf && d->live_g >= PT_DP_MAX_GBUFS && i < d->n_buckets; i++)
            if (d->b[i].req || d->b[i].queued) pt_dp_complete(d, &d->b[i]);
        if (!b->gbuf) {
            b->gbuf = pt_pool_get(d, &d->live_g, &d->peak_g);
            d->model->be->zero(d->model->be, b->gbuf, b->shard * (size_t)d->comm->size * sizeof(float));
            pt_point_bucket(d, b, PT_USE_GRADS, b->gbuf);
        }
    }
    if (d->zero == 3 && ub >= 0 && (use & PT_USE_PARAMS)) {
        pt_dp_bucket *b = &d->b[ub];
        pt_gather_start(d, b);
        if (b->preq) {
            pt_comm_wait(d->comm, b->preq);
            b->preq = NULL;
        }
        pt_point_bucket(d, b, PT_USE_PARAMS, b->pbuf);
        int next = pt_next_unit(d, unit, backward);
        if (next >= 0 && d->unit_bucket[next] >= 0) pt_gather_start(d, &d->b[d->unit_bucket[next]]);
    }
    if (d->gathers_pending && (use & PT_USE_PARAMS)) /* ZeRO-1: the last step's gathers of the
                                                       * buckets this unit's parameters lie in */
        for (int i = 0; i < d->n_buckets; i++)
            if (d->b[i].preq && d->b[i].u0 <= unit && unit <= d->b[i].u1) pt_dp_gather_wait(d, &d->b[i]);
    pt_dp_poll(d);
}

static void pt_dp_release(void *user, int unit, int use, int backward) {
    pt_dp *d = user;
    if (d->next.release) d->next.release(d->next.user, unit, use, backward);
    int ub = d->unit_bucket ? d->unit_bucket[unit] : -1;
    if (d->zero == 3 && ub >= 0 && (use & PT_USE_PARAMS)) {
        pt_dp_bucket *b = &d->b[ub];
        if (b->pbuf) {
            /* freed on every rank alike, whatever this rank's progress (a later gather of it
             * is a collective) */
            if (b->preq) pt_comm_wait(d->comm, b->preq);
            b->preq = NULL;
            pt_point_bucket(d, b, PT_USE_PARAMS, NULL);
            pt_pool_put(d, b->pbuf, &d->live_p);
            b->pbuf = NULL;
        }
    }
    if ((use & PT_USE_GRADS) && backward == 1 && d->unit_open[unit] > 0) d->unit_open[unit]--;
    if ((use & PT_USE_GRADS) && d->armed) {
        d->unit_final[unit] = 1;
        d->released += d->unit_hi[unit] - d->unit_lo[unit];
        if (d->overlap) {
            for (int i = 0; i < d->n_buckets; i++) {
                pt_dp_bucket *b = &d->b[i];
                if (!b->started && pt_bucket_final(d, b)) pt_dp_start(d, b);
            }
            /* ZeRO-0: the all-gather of a bucket whose reduce-scatter has had time to finish
             * (every rank releases the same units in the same order, so every rank starts it at
             * the same point) */
            if (d->zero == 0) pt_dp_second_phase(d, 0);
        }
    }
    pt_dp_poll(d);
}

/* ------------------------------------------------------------------------------------------ */

static void pt_dp_add_bucket(pt_dp *d, size_t lo, size_t hi) {
    int N = d->comm->size;
    pt_dp_bucket *b = &d->b[d->n_buckets++];
    memset(b, 0, sizeof *b);
    b->lo = lo;
    b->hi = hi;
    b->shard = (hi - lo + (size_t)N - 1) / (size_t)N;
    int n_units = pt_model_n_units(d->model);
    b->u0 = n_units;
    b->u1 = -1;
    for (int u = 0; u < n_units; u++)
        if (d->unit_lo[u] < hi && d->unit_hi[u] > lo) {
            if (u < b->u0) b->u0 = u;
            b->u1 = u;
        }
}

/* Each unit's range of the buffer, counting only the tensors that start in [lo, hi). */
static void pt_dp_units(pt_dp *d, size_t lo, size_t hi) {
    const pt_model *model = d->model;
    int n_units = pt_model_n_units(model);
    d->unit_lo = pt_calloc((size_t)n_units, sizeof *d->unit_lo);
    d->unit_hi = pt_calloc((size_t)n_units, sizeof *d->unit_hi);
    d->unit_final = pt_calloc((size_t)n_units, 1);
    d->unit_open = pt_calloc((size_t)n_units, sizeof *d->unit_open);
    d->unit_bucket = pt_calloc((size_t)n_units, sizeof *d->unit_bucket);
    for (int u = 0; u < n_units; u++) d->unit_lo[u] = (size_t)-1;
    for (int i = 0; i < model->table.n; i++) {
        const pt_param *p = &model->table.p[i];
        if (p->offset < lo || p->offset >= hi) continue;
        if (p->offset < d->unit_lo[p->unit]) d->unit_lo[p->unit] = p->offset;
        if (p->offset + p->numel > d->unit_hi[p->unit]) d->unit_hi[p->unit] = p->offset + p->numel;
    }
    for (int u = 0; u < n_units; u++)
        if (d->unit_hi[u] == 0) d->unit_lo[u] = 0; /* empty: overlaps nothing */
}

double pt_dp_bucket_mb(double bucket_mb, size_t elems) {
    if (bucket_mb > 0) return bucket_mb;
    double mb = (double)elems * sizeof(float) / 1048576.0 / 8.0;
    return mb < 1.0 ? 1.0 : mb > 25.0 ? 25.0 : mb;
}

/* The elements [lo, hi) of the model's buffers over the group (plain: ZeRO-0 by all-reduces). */
static pt_status pt_dp_setup(pt_dp *d, pt_comm *comm, pt_model *model, int zero, size_t lo,
                             size_t hi, double bucket_mb, int overlap, int plain) {
    memset(d, 0, sizeof *d);
    if (zero < 0 || zero > 3)
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero = %d: the stages are 0, 1, 2 and 3", zero);
    if (!(bucket_mb >= 0)) return pt_errorf(PT_ERR_CONFIG, "parallel.bucket_mb must be >= 0 (0: auto)");
    d->comm = comm;
    d->model = model;
    d->zero = zero;
    d->overlap = overlap;
    d->plain = plain;
    d->region_lo = lo;
    d->region_hi = hi;
    int N = comm->size, n_units = pt_model_n_units(model);
    pt_dp_units(d, lo, hi);
    size_t want = (size_t)(pt_dp_bucket_mb(bucket_mb, hi - lo) * 1048576.0 / sizeof(float));
    if (zero <= 1) {
        /* flat buckets from the end, multiples of N (the range is padded to one) but for plain
         * all-reduces */
        size_t unit = plain ? 1 : (size_t)N;
        PT_ASSERT((hi - lo) % unit == 0);
        if (want < unit) want = unit;
        want = want / unit * unit;
        if (N == 1 && hi > lo) /* a group of one reduces and gathers nothing: its slice is the
                                * region, one range as without the instance */
            want = hi - lo;
        d->b = pt_calloc((hi - lo + want - 1) / want + 1, sizeof *d->b);
        for (size_t h = hi; h > lo;) {
            size_t l = h - lo > want ? h - want : lo;
            pt_dp_add_bucket(d, l, h);
            h = l;
        }
        /* ZeRO-1: where each bucket's slice sits among the rank's masters (bf16: pshard) */
        for (int i = d->n_buckets - 1; i >= 0 && !plain; i--) {
            d->b[i].sh_off = d->n_shard;
            d->n_shard += d->b[i].shard;
            if (d->b[i].shard * (size_t)N > d->gather_elems) d->gather_elems = d->b[i].shard * (size_t)N;
        }
    } else {
        d->b = pt_calloc((size_t)n_units, sizeof *d->b);
        /* a tied embedding under a pipeline: its bucket holds it alone, as the last stage's
         * copy's does, so that the two reduced slices can be summed (pt_dp_sum_unit) */
        int solo0 = model->cfg.tied_embeddings && model->par.n_chunks > 0;
        /* whole units from the end: merged up to the bucket size with ZeRO-2, one each with 3;
         * units with nothing in the range (the head of a tied model; in a region, the units of
         * the other region) have no bucket */
        for (int u = 0; u < n_units; u++) d->unit_bucket[u] = -1;
        for (int u = n_units - 1; u >= 0;) {
            if (d->unit_hi[u] == 0) {
                u--;
                continue;
            }
            int u_first = u;
            for (int v = u - 1; zero == 2 && v >= 0; v--) {
                if (d->unit_hi[v] == 0) continue;
                if (v == 0 && solo0) break;
                if (d->unit_hi[u] - d->unit_lo[v] > want) break;
                u_first = v;
            }
            for (int k = u_first; k <= u; k++)
                if (d->unit_hi[k]) d->unit_bucket[k] = d->n_buckets;
            pt_dp_add_bucket(d, d->unit_lo[u_first], d->unit_hi[u]);
            u = u_first - 1;
        }
        for (int i = d->n_buckets - 1; i >= 0; i--) {
            pt_dp_bucket *b = &d->b[i];
            b->sh_off = d->n_shard;
            d->n_shard += b->shard;
            if (b->shard * (size_t)N > d->buf_elems) d->buf_elems = b->shard * (size_t)N;
        }
        d->gather_elems = d->buf_elems;
        pt_backend *be = model->be;
        d->gshard = be->alloc(be, (d->n_shard ? d->n_shard : 1) * sizeof(float));
        if (zero == 3 && model->prec == PT_PREC_BF16) /* the model computes with gathered bf16
                                                        * copies */
            d->pshard16 = be->alloc(be, (d->n_shard ? d->n_shard : 1) * sizeof(pt_bf16));
    }
    /* the parameters this rank owns: ZeRO-3's, and a bf16 model's fp32 masters under ZeRO-1/2
     * (Megatron's distributed optimizer: the owner updates them and rounds them to bf16, and the
     * bf16 weights are what the group gathers); zeros past the table */
    d->masters = (zero == 1 || zero == 2) && !plain && model->prec == PT_PREC_BF16;
    if (zero == 3 || d->masters) {
        pt_backend *be = model->be;
        d->pshard = be->alloc(be, (d->n_shard ? d->n_shard : 1) * sizeof(float));
        be->zero(be, d->pshard, (d->n_shard ? d->n_shard : 1) * sizeof(float));
    }
    /* every bucket's reduction and (ZeRO-3) gather may be pending at once: twice their requests made
     * now, so that no step allocates */
    pt_comm_reserve(comm, comm->req_made + 4 * d->n_buckets + 8);
    d->gather_next = d->n_buckets - 1;
    d->next = model->hooks;
    model->hooks.acquire = pt_dp_acquire;
    model->hooks.release = pt_dp_release;
    model->hooks.poll = pt_dp_poll_hook;
    model->hooks.user = d;
    return PT_OK;
}

pt_status pt_dp_init(pt_dp *d, pt_comm *comm, pt_model *model, int zero, double bucket_mb,
                     int overlap) {
    /* ZeRO-0's reduce-scatter and all-gather are the flat all-reduce cut in two; over a group
     * whose collectives are hierarchical (spanning hosts, include/pt/comm.h) the all-reduce
     * itself: one request a bucket, crossing what the pair would (docs/parallelism.md,
     * "Hierarchical collectives across hosts") */
    return pt_dp_setup(d, comm, model, zero, 0, model->alloc_total, bucket_mb, overlap,
                       zero == 0 && pt_comm_hierarchical(comm));
}

pt_status pt_dp_init_region(pt_dp *d, pt_comm *comm, pt_model *model, int zero, size_t lo,
                            size_t hi, double bucket_mb, int overlap) {
    return pt_dp_setup(d, comm, model, zero, lo, hi, bucket_mb, overlap, zero == 0);
}

void pt_dp_free(pt_dp *d) {
    pt_backend *be = d->model ? d->model->be : NULL;
    if (d->model) memset(&d->model->hooks, 0, sizeof d->model->hooks);
    for (int i = 0; i < d->n_buckets; i++) {
        if (d->b[i].gbuf) be->free(be, d->b[i].gbuf);
        if (d->b[i].pbuf) be->free(be, d->b[i].pbuf);
    }
    for (int i = 0; i < d->pool_n; i++) be->free(be, d->pool[i]);
    if (d->gshard) be->free(be, d->gshard);
    if (d->pshard) be->free(be, d->pshard);
    if (d->g16) be->free(be, d->g16);
    if (d->pshard16) be->free(be, d->pshard16);
    free(d->pool);
    free(d->b);
    free(d->unit_lo);
    free(d->unit_hi);
    free(d->unit_final);
    free(d->unit_open);
    free(d->unit_bucket);
    free(d->rep_q);
    memset(d, 0, sizeof *d);
}

pt_owned_range *pt_dp_owned_ranges(const pt_dp *d, int *n) {
    if (d->zero == 0 || (d->zero == 1 && d->comm->size == 1 && !d->masters)) {
        pt_owned_range *r = pt_calloc(1, sizeof *r);
        int region = d->zero > 0 && d->region_hi; /* ZeRO-0 regions: the optimizer has it all */
        r->lo = region ? d->region_lo : 0;
        r->hi = region ? d->region_hi : d->model->table.total;
        *n = 1;
        return r;
    }
    pt_owned_range *r = pt_calloc((size_t)d->n_buckets, sizeof *r);
    int k = 0;
    /* ascending offsets so that the optimizer's moments follow the table's order */
    for (int i = d->n_buckets - 1; i >= 0; i--) {
        const pt_dp_bucket *b = &d->b[i];
        r[k].lo = pt_own_lo(d, b);
        if (d->zero == 1) {
            r[k].hi = r[k].lo + b->shard; /* model buffers, padded: may run past the table */
            if (d->masters) {
                r[k].param = d->pshard + b->sh_off;
                r[k].grad = d->model->grads + r[k].lo;
            }
        } else {
            size_t len = pt_own_len(d, b);
            if (len == 0) continue;
            r[k].hi = r[k].lo + len;
            r[k].grad = d->gshard + b->sh_off;
            r[k].param = d->pshard ? d->pshard + b->sh_off : d->model->params + r[k].lo;
        }
        k++;
    }
    *n = k;
    return r;
}

/* Sharded masters: the model's bf16 copy of the region from the host's fp32 values (rounded as
 * the backend's to_bf16 rounds), each rank all of it, so that setting needs no collective. */
static void pt_dp_set_copy16(pt_dp *d, const float *host) {
    size_t lo = d->region_lo, n = d->region_hi - lo, total = d->model->table.total;
    pt_bf16 *h16 = pt_calloc(n ? n : 1, sizeof *h16); /* padding: zeros */
    for (size_t i = 0; i < n && lo + i < total; i++) h16[i] = pt_bf16_round(host[lo + i]);
    d->model->be->upload(d->model->be, d->model->params16 + lo, h16, n * sizeof *h16);
    free(h16);
}

void pt_dp_set_params(pt_dp *d, const float *host) {
    pt_backend *be = d->model->be;
    pt_dp_params_ready(d); /* (a gather still writing them) */
    if (!d->pshard) {
        be->upload(be, d->model->params, host, d->model->table.total * sizeof(float));
        return;
    }
    for (int i = 0; i < d->n_buckets; i++) {
        const pt_dp_bucket *b = &d->b[i];
        size_t len = pt_own_held(d, b);
        if (len) be->upload(be, d->pshard + b->sh_off, host + pt_own_lo(d, b), len * sizeof(float));
    }
    if (d->masters) pt_dp_set_copy16(d, host);
    pt_dp_sync_shard16(d);
}

void pt_dp_get_params(pt_dp *d, float *host) {
    pt_backend *be = d->model->be;
    pt_dp_params_ready(d);
    if (!d->pshard) {
        be->download(be, host, d->model->params, d->model->table.total * sizeof(float));
        return;
    }
    if (d->masters) { /* the fp32 masters, each bucket's slices gathered in host memory */
        float *buf = pt_malloc((d->gather_elems ? d->gather_elems : 1) * sizeof(float));
        size_t total = d->model->table.total;
        for (int i = 0; i < d->n_buckets; i++) {
            const pt_dp_bucket *b = &d->b[i];
            be->download(be, buf + (size_t)d->comm->rank * b->shard, d->pshard + b->sh_off,
                         b->shard * sizeof(float));
            pt_allgather(d->comm, NULL, buf, b->shard, PT_DTYPE_F32);
            if (b->lo < total)
                memcpy(host + b->lo, buf, ((b->hi < total ? b->hi : total) - b->lo) * sizeof(float));
        }
        free(buf);
        return;
    }
    float *buf = pt_pool_get(d, &d->live_p, &d->peak_p);
    for (int i = 0; i < d->n_buckets; i++) {
        const pt_dp_bucket *b = &d->b[i];
        pt_allgather(d->comm, d->pshard + b->sh_off, buf, b->shard, PT_DTYPE_F32);
        be->download(be, host + b->lo, buf, (b->hi - b->lo) * sizeof(float));
    }
    pt_pool_put(d, buf, &d->live_p);
}

void pt_dp_begin_step(pt_dp *d) {
    pt_backend *be = d->model->be;
    if (d->zero >= 2)
        be->zero(be, d->gshard, (d->n_shard ? d->n_shard : 1) * sizeof(float));
    else
        pt_model_zero_grads(d->model);
}

void pt_dp_begin_micro(pt_dp *d, int last) {
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].started = 0;
        d->b[i].gathered = 0;
        d->b[i].req = NULL;
    }
    memset(d->unit_final, 0, (size_t)pt_model_n_units(d->model));
    d->released = 0;
    /* stages 0 and 1 accumulate the full gradient locally and reduce it once */
    d->armed = d->zero >= 2 || ((d->comm->size > 1 || d->rep) && last);
}

void pt_dp_end_backward(pt_dp *d) {
    d->fin = 0;
    pt_dp_params_ready(d); /* (none left: the passes acquired every unit) */
    if (!d->armed) return;
    for (int i = 0; i < d->n_buckets; i++) /* (zero ≥ 2: those with gradients since their last
                                            * reduction) */
        if (!d->b[i].started && (d->zero < 2 || d->b[i].gbuf)) pt_dp_start(d, &d->b[i]);
    if (d->zero == 0) pt_dp_second_phase(d, 1);
}

int pt_dp_next_final(pt_dp *d, size_t *lo, size_t *hi) {
    if (!d->armed) return 0;
    /* in the order they were started (b[0] first: the end of the buffer, which backward
     * finishes first) */
    while (d->fin < d->n_buckets) {
        pt_dp_bucket *b = &d->b[d->fin++];
        if (b->req || b->queued) {
            double t0 = pt_now();
            pt_dp_complete(d, b);
            d->comm_seconds += pt_now() - t0;
        }
        b->started = 0;
        b->gathered = 0;
        /* what is final here: the whole bucket (ZeRO-0), else this rank's slice */
        *lo = d->zero == 0 ? b->lo : pt_own_lo(d, b);
        *hi = d->zero == 0 ? b->hi : *lo + pt_own_len(d, b);
        if (*hi > *lo) return 1;
    }
    d->armed = 0;
    return 0;
}

void pt_dp_end_micro(pt_dp *d, int last) {
    size_t lo, hi;
    (void)last;
    pt_dp_end_backward(d);
    while (pt_dp_next_final(d, &lo, &hi)) {
    }
}

/* The same for sharded masters (a bf16 model): the rank's updated masters rounded to bf16, and
 * the bf16 weights gathered (half the bytes of fp32 values). ZeRO-1 in place in the model's bf16
 * copy; ZeRO-2 through a pooled buffer's first half. Over a group of one, only the rounding. */
static void pt_dp_gather_bucket16(pt_dp *d, pt_dp_bucket *b) {
    pt_backend *be = d->model->be;
    pt_bf16 *p16 = d->model->params16;
    const float *own = d->pshard + b->sh_off;
    if (d->comm->size == 1) {
        be->to_bf16(be, p16 + b->lo, own, pt_own_len(d, b));
        return;
    }
    if (d->zero == 1) {
        be->to_bf16(be, p16 + pt_own_lo(d, b), own, b->shard);
        b->preq = d->comm->iallgather(d->comm, NULL, p16 + b->lo, b->shard, PT_DTYPE_BF16);
    } else {
        for (int i = d->n_buckets - 1; i >= 0 && d->gathers_pending >= 2; i--)
            pt_dp_gather_wait(d, &d->b[i]); /* (started in this order) */
        b->pbuf = pt_pool_get(d, &d->live_p, &d->peak_p);
        pt_bf16 *g = (pt_bf16 *)(void *)b->pbuf;
        be->to_bf16(be, g + (size_t)d->comm->rank * b->shard, own, b->shard);
        b->preq = d->comm->iallgather(d->comm, NULL, g, b->shard, PT_DTYPE_BF16);
    }
    d->gathers_pending++;
}

/* The gather of bucket b (ZeRO-1/2), once this rank's slice of it is updated. ZeRO-1 in place:
 * each rank's slice already sits at its place in the bucket. ZeRO-2: buckets are not padded in
 * the model's buffer, so through a pooled buffer, two in flight (the older one completed first). */
static void pt_dp_gather_bucket(pt_dp *d, pt_dp_bucket *b) {
    float *p = d->model->params;
    PT_ASSERT(!b->preq);
    if (d->masters) {
        pt_dp_gather_bucket16(d, b);
        return;
    }
    if (d->zero == 1) {
        b->preq = d->comm->iallgather(d->comm, NULL, p + b->lo, b->shard, PT_DTYPE_F32);
    } else {
        pt_backend *be = d->model->be;
        for (int i = d->n_buckets - 1; i >= 0 && d->gathers_pending >= 2; i--)
            pt_dp_gather_wait(d, &d->b[i]); /* (started in this order) */
        b->pbuf = pt_pool_get(d, &d->live_p, &d->peak_p);
        size_t len = pt_own_len(d, b);
        if (len)
            be->copy(be, b->pbuf + (size_t)d->comm->rank * b->shard, p + pt_own_lo(d, b),
                     len * sizeof(float));
        b->preq = d->comm->iallgather(d->comm, NULL, b->pbuf, b->shard, PT_DTYPE_F32);
    }
    d->gathers_pending++;
}

void pt_dp_params_updated(pt_dp *d, size_t upto) {
    if ((d->zero != 1 && d->zero != 2) || (d->comm->size == 1 && !d->masters)) return;
    /* the buckets in ascending offsets, as the optimizer's ranges; a bucket where this rank owns
     * nothing goes with the next */
    for (; d->gather_next >= 0; d->gather_next--) {
        pt_dp_bucket *b = &d->b[d->gather_next];
        size_t len = pt_own_len(d, b), end = len ? pt_own_lo(d, b) + len : b->lo;
        if (end > upto) break;
        pt_dp_gather_bucket(d, b);
    }
}

void pt_dp_gather_params(pt_dp *d, int wait) {
    pt_dp_sync_shard16(d);
    pt_dp_params_updated(d, (size_t)-1); /* what pt_dp_params_updated has not started */
    d->gather_next = d->n_buckets - 1;   /* (the next step's) */
    if (wait || d->zero == 2) pt_dp_params_ready(d);
}

void pt_dp_params_ready(pt_dp *d) {
    for (int i = d->n_buckets - 1; i >= 0 && d->gathers_pending; i--) pt_dp_gather_wait(d, &d->b[i]);
}

void pt_dp_sum_unit(const pt_dp *d, int unit, pt_comm *group) {
    int ub = d->unit_bucket ? d->unit_bucket[unit] : -1;
    if (d->zero < 2 || ub < 0) return;
    const pt_dp_bucket *b = &d->b[ub];
    pt_allreduce_sum(group, d->gshard + b->sh_off, b->shard, PT_DTYPE_F32);
}

void pt_dp_set_replicas(pt_dp *d, pt_comm *rep) {
    if (!rep || rep->size < 2 || d->zero == 0 || d->plain) return;
    d->rep = rep;
    d->rep_q = pt_calloc((size_t)(d->n_buckets ? d->n_buckets : 1), sizeof *d->rep_q);
    pt_comm_reserve(rep, rep->req_made + 2 * d->n_buckets + 8);
}

pt_status pt_dp_reduce_bf16(pt_dp *d) {
    if (d->zero == 3)
        return pt_errorf(PT_ERR_CONFIG, "parallel.grad_reduce = bf16 does not support ZeRO-3 yet");
    size_t n = 0;
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].w_off = n;
        n += d->zero >= 2 ? d->b[i].shard * (size_t)d->comm->size : d->b[i].hi - d->b[i].lo;
    }
    d->g16_elems = n;
    d->g16 = d->model->be->alloc(d->model->be, (n ? n : 1) * sizeof(pt_bf16));
    return PT_OK;
}

pt_dp_memory pt_dp_memory_bytes(const pt_dp *d, size_t optim_elems) {
    pt_dp_memory m = {0};
    size_t full = d->model->alloc_total * sizeof(float), shard = d->n_shard * sizeof(float);
    size_t buf = d->buf_elems * sizeof(float);
    m.params = d->zero == 3 ? shard : full;
    m.grads = d->zero >= 2 ? shard : full;
    m.optim = 2 * optim_elems * sizeof(float);
    if (d->model->prec == PT_PREC_BF16) { /* the bf16 copy the model computes with (ZeRO-3's
                                           * shard of it), the fp32 masters (sharded with ZeRO
                                           * 1–3) with the optimizer's state */
        m.params /= 2;
        m.optim += d->pshard ? shard : full;
    }
    m.params_transient = (size_t)d->peak_p * buf;
    m.grads_transient = (size_t)d->peak_g * buf + d->g16_elems * sizeof(pt_bf16);
    return m;
}
