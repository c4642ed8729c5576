/* data_parallel.c: bucketed, overlapped gradient reduction and ZeRO-1 (see data_parallel.h). */
#include "pt/data_parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t pt_dp_padded_total(size_t total, int group_size, int zero) {
    if (zero == 0 || group_size <= 1) return total;
    size_t g = (size_t)group_size;
    return (total + g - 1) / g * g;
}

static void pt_dp_start(pt_dp *d, pt_dp_bucket *b) {
    float *g = d->model->grads;
    if (d->zero == 0) {
        b->req = d->comm->iallreduce(d->comm, g + b->lo, b->hi - b->lo, PT_DTYPE_F32);
    } else {
        /* in place: the rank's reduced slice lands at the start of the bucket; moved afterwards */
        b->req = d->comm->ireduce_scatter(d->comm, NULL, g + b->lo, b->shard, PT_DTYPE_F32);
    }
    b->started = 1;
}

/* The model's hook: everything at offsets >= frontier is final. */
static void pt_dp_on_ready(void *user, int layer) {
    pt_dp *d = user;
    size_t frontier = layer >= 0 ? d->layer_start[layer] : 0;
    for (int i = 0; i < d->n_buckets; i++) {
        pt_dp_bucket *b = &d->b[i];
        if (!b->started && b->lo >= frontier) pt_dp_start(d, b);
    }
    /* MPI progresses nonblocking collectives only inside MPI calls: poke it between layers */
    for (int i = 0; i < d->n_buckets; i++)
        if (d->b[i].req && d->comm->test(d->comm, d->b[i].req)) d->b[i].req = NULL;
}

pt_status pt_dp_init(pt_dp *d, pt_comm *comm, pt_model *model, int zero, double bucket_mb) {
    memset(d, 0, sizeof *d);
    if (zero < 0 || zero > 1)
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero = %d: stages 0 and 1 are available", zero);
    if (!(bucket_mb > 0)) return pt_errorf(PT_ERR_CONFIG, "parallel.bucket_mb must be > 0");
    d->comm = comm;
    d->model = model;
    d->zero = zero;
    int N = comm->size;
    size_t total = pt_dp_padded_total(model->table.total, N, zero);
    d->padded_total = total;
    size_t want = (size_t)(bucket_mb * 1048576.0 / sizeof(float));
    size_t unit = zero ? (size_t)N : 1;
    if (want < unit) want = unit;
    want = want / unit * unit;
    d->n_buckets = (int)((total + want - 1) / want);
    d->b = pt_calloc((size_t)d->n_buckets, sizeof *d->b);
    size_t hi = total;
    for (int i = 0; i < d->n_buckets; i++) {
        size_t lo = hi > want ? hi - want : 0;
        d->b[i].lo = lo;
        d->b[i].hi = hi;
        d->b[i].shard = (hi - lo) / unit;
        hi = lo;
    }
    d->layer_start = pt_calloc((size_t)(model->cfg.n_layers ? model->cfg.n_layers : 1), sizeof(size_t));
    for (int i = model->table.n - 1; i >= 0; i--) {
        const pt_param *p = &model->table.p[i];
        if (p->layer >= 0) d->layer_start[p->layer] = p->offset;
    }
    return PT_OK;
}

void pt_dp_free(pt_dp *d) {
    free(d->b);
    free(d->layer_start);
    memset(d, 0, sizeof *d);
}

pt_optim_range *pt_dp_owned_ranges(const pt_dp *d, int *n) {
    if (d->zero == 0 || d->comm->size == 1) {
        pt_optim_range *r = pt_malloc(sizeof *r);
        r->lo = 0;
        r->hi = d->model->table.total;
        r->off = 0;
        *n = 1;
        return r;
    }
    pt_optim_range *r = pt_malloc((size_t)d->n_buckets * sizeof *r);
    int k = 0;
    /* ascending offsets so that the optimizer's moments follow the buffer's order */
    for (int i = d->n_buckets - 1; i >= 0; i--) {
        const pt_dp_bucket *b = &d->b[i];
        r[k].lo = b->lo + (size_t)d->comm->rank * b->shard;
        r[k].hi = r[k].lo + b->shard;
        r[k].off = 0;
        k++;
    }
    *n = k;
    return r;
}

void pt_dp_arm(pt_dp *d) {
    for (int i = 0; i < d->n_buckets; i++) {
        d->b[i].started = 0;
        d->b[i].req = NULL;
    }
    if (d->comm->size > 1) {
        d->model->on_grads_ready = pt_dp_on_ready;
        d->model->hook_user = d;
    }
}

void pt_dp_finish_grads(pt_dp *d) {
    d->model->on_grads_ready = NULL;
    if (d->comm->size == 1) return;
    double t0 = pt_now();
    for (int i = 0; i < d->n_buckets; i++)
        if (!d->b[i].started) pt_dp_start(d, &d->b[i]);
    for (int i = 0; i < d->n_buckets; i++) {
        pt_comm_wait(d->comm, d->b[i].req);
        d->b[i].req = NULL;
        d->b[i].started = 0;
    }
    if (d->zero >= 1) {
        float *g = d->model->grads;
        for (int i = 0; i < d->n_buckets; i++) {
            const pt_dp_bucket *b = &d->b[i];
            size_t own = b->lo + (size_t)d->comm->rank * b->shard;
            if (own != b->lo) memmove(g + own, g + b->lo, b->shard * sizeof(float));
        }
    }
    d->comm_seconds += pt_now() - t0;
}

void pt_dp_gather_params(pt_dp *d) {
    if (d->zero == 0 || d->comm->size == 1) return;
    float *p = d->model->params;
    for (int i = 0; i < d->n_buckets; i++) {
        pt_dp_bucket *b = &d->b[i];
        /* in place: each rank's slice already sits at its place in the bucket */
        b->req = d->comm->iallgather(d->comm, NULL, p + b->lo, b->shard, PT_DTYPE_F32);
    }
    for (int i = 0; i < d->n_buckets; i++) {
        pt_comm_wait(d->comm, d->b[i].req);
        d->b[i].req = NULL;
    }
}
