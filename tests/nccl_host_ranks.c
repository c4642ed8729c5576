/* nccl_host_ranks.c: the NCCL comm backend's host logic (src/comm/comm_nccl.c) on CPUs, run by
 * tests/test_nccl_host.sh under mpiexec. The device calls sit behind the backend's two tables,
 * and here both are stand-ins over host memory and MPI:
 *   - the device link (pt_device_link): "device memory" is one block of this file's; a stream is a
 *     queue of operations completed in order; an event marks a place in a stream's queue and has
 *     happened once everything before it has completed, found only when queried (and then only
 *     after a few queries, so that completion is seen late, as on a GPU);
 *   - NCCL (pt_nccl_api): a communicator is an MPI group (plain MPI, no staging: pt_comm_world and
 *     its splits); ncclCommInitRank checks that every rank was given the same unique id and its
 *     own rank; a collective is posted as the MPI collective it is, onto the stream's queue; NCCL's
 *     in-place conventions are kept (the reduce-scatter's result at the rank's block); sends and
 *     receives are matched in posting order between each pair (an MPI tag counting the pair's
 *     messages), as NCCL matches them, and must be posted inside ncclGroupStart/End.
 * Modes (argv[1]):
 *   ops    every operation on device memory against its formula, host memory through MPI, the
 *          counters against the bus-bandwidth convention; split groups, dup; exit 0 when every
 *          check passed, printing "nccl_host: N checks passed";
 *   hang   world rank 1 skips an all-reduce: rank 0's wait times out (parallel timeout 2 s) and
 *          aborts its communicator (ncclCommAbort) before the job ends naming the group;
 *   async  NCCL reports an asynchronous error: the job ends naming the group and the operation;
 *   train ARGS...  `pentatron train ARGS` with every group over the NCCL backend and these
 *          stand-ins, the guarded CPU backend's memory (PT_BACKEND_GUARD=1) being the "device
 *          memory" (its accesses under a hold): the model's own posting order of sends and
 *          receives, matched in order as NCCL matches them, and its waits on in-order streams. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "comm/comm_nccl.h"
#include "pt/backend.h"
#include "pt/comm.h"

/* ---- the device link's stand-in ---- */
enum { DEV_BYTES = 1 << 22, QUEUE = 1024, LATE = 3 };

static char *dev_mem;
static size_t dev_used;

static void *dev_alloc(size_t bytes) {
    void *p = dev_mem + dev_used;
    dev_used += (bytes + 63) / 64 * 64;
    if (dev_used > DEV_BYTES) abort();
    return p;
}

typedef struct {
    pt_comm *mc;      /* an MPI operation's group, or NULL: a copy */
    pt_comm_req *r;
    void *dst;        /* a copy's */
    const void *src;
    size_t bytes;
} fop;

typedef struct {
    fop ops[QUEUE];
    long posted, done;
} fstream;

typedef struct {
    fstream *s;
    long upto;
    int queries;
} fevent;

static fstream compute; /* the "compute stream": the model's work is done when called */
static int streams_made, events_made, streams_freed, events_freed;

static void stream_push(fstream *s, fop op) {
    if (s->posted - s->done >= QUEUE) abort();
    s->ops[s->posted++ % QUEUE] = op;
}

/* completes what it can, in order */
static void stream_advance(fstream *s) {
    while (s->done < s->posted) {
        fop *op = &s->ops[s->done % QUEUE];
        if (op->mc) {
            if (!op->mc->test(op->mc, op->r)) return;
        } else {
            pt_guard_hold(); /* train mode: the guarded backend's memory */
            if (op->src)
                memmove(op->dst, op->src, op->bytes);
            else
                memset(op->dst, 0xff, op->bytes); /* what NCCL leaves undefined: NaNs */
            pt_guard_release();
        }
        s->done++;
    }
}

static int train_mode;

static int l_owns(void *ctx, const void *p) {
    (void)ctx;
    if (train_mode) return pt_guard_covers(p);
    return (const char *)p >= dev_mem && (const char *)p < dev_mem + DEV_BYTES;
}
static void *l_host_alloc(void *ctx, size_t b) { (void)ctx; return malloc(b); }
static void l_host_free(void *ctx, void *p) { (void)ctx; free(p); }
static void l_copy_now(void *ctx, void *d, const void *s, size_t b) {
    (void)ctx;
    pt_guard_hold();
    memcpy(d, s, b);
    pt_guard_release();
}
static void *l_stream_new(void *ctx) {
    (void)ctx;
    streams_made++;
    return calloc(1, sizeof(fstream));
}
static void l_stream_free(void *ctx, void *s) { (void)ctx; streams_freed++; free(s); }
static void *l_event_new(void *ctx) {
    (void)ctx;
    events_made++;
    return calloc(1, sizeof(fevent));
}
static void l_event_free(void *ctx, void *e) { (void)ctx; events_freed++; free(e); }
static void l_event_record(void *ctx, void *e, void *s) {
    (void)ctx;
    fevent *ev = e;
    ev->s = s;
    ev->upto = ((fstream *)s)->posted;
    ev->queries = 0;
}
static int l_event_query(void *ctx, void *e) {
    (void)ctx;
    fevent *ev = e;
    if (!ev->s) return 1;
    stream_advance(ev->s);
    return ev->s->done >= ev->upto && ++ev->queries >= LATE;
}
static void l_stream_wait(void *ctx, void *s, void *e) { (void)ctx, (void)s, (void)e; }
static void l_copy(void *ctx, void *d, const void *src, size_t b, void *s) {
    (void)ctx;
    stream_push(s, (fop){NULL, NULL, d, src, b});
}

static const pt_device_link link = {
    NULL, 0, &compute, l_owns, l_host_alloc, l_host_free, l_copy_now, l_copy_now,
    l_stream_new, l_stream_free, l_event_new, l_event_free, l_event_record, l_event_query,
    l_stream_wait, l_copy};

/* ---- NCCL's stand-in ---- */
struct ncclComm {
    pt_comm *mc;
    unsigned *sent, *got; /* messages so far to / from each rank */
    int aborted;
};

static int in_group, inits_checked, splits, aborts, async_error_after = -1, async_polls;

static pt_dtype f_type(ncclDataType_t t) {
    switch (t) {
    case ncclFloat32: return PT_DTYPE_F32;
    case ncclFloat64: return PT_DTYPE_F64;
    case ncclInt32: return PT_DTYPE_I32;
    case ncclInt64: return PT_DTYPE_I64;
    case ncclBfloat16: return PT_DTYPE_BF16;
    default: abort();
    }
}

static ncclComm_t f_wrap(pt_comm *mc) {
    ncclComm_t c = calloc(1, sizeof *c);
    c->mc = mc;
    c->sent = calloc((size_t)mc->size, sizeof *c->sent);
    c->got = calloc((size_t)mc->size, sizeof *c->got);
    return c;
}

static ncclResult_t f_get_unique_id(ncclUniqueId *id) {
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) id->internal[i] = (char)(rand() & 0xff);
    return ncclSuccess;
}

static ncclResult_t f_comm_init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    pt_comm *mc = pt_comm_world(30.0);
    if (nranks != mc->size || rank != mc->rank) return ncclInvalidArgument;
    char *all = malloc((size_t)nranks * NCCL_UNIQUE_ID_BYTES);
    pt_allgather(mc, id.internal, all, NCCL_UNIQUE_ID_BYTES / 4, PT_DTYPE_I32);
    for (int r = 0; r < nranks; r++)
        if (memcmp(all + (size_t)r * NCCL_UNIQUE_ID_BYTES, id.internal, NCCL_UNIQUE_ID_BYTES)) {
            free(all);
            return ncclInvalidArgument;
        }
    free(all);
    inits_checked++;
    *comm = f_wrap(mc);
    return ncclSuccess;
}

static ncclResult_t f_comm_split(ncclComm_t comm, int color, int key, ncclComm_t *out,
                                 ncclConfig_t *cfg) {
    (void)cfg;
    splits++;
    *out = f_wrap(comm->mc->split(comm->mc, color, key, "nccl"));
    return ncclSuccess;
}

static ncclResult_t f_comm_abort(ncclComm_t comm) {
    aborts++;
    comm->aborted = 1;
    fprintf(stderr, "fake NCCL: ncclCommAbort on a communicator of %d ranks\n", comm->mc->size);
    return ncclSuccess;
}

static ncclResult_t f_comm_destroy(ncclComm_t comm) {
    comm->mc->free(comm->mc);
    free(comm->sent);
    free(comm->got);
    free(comm);
    return ncclSuccess;
}

static ncclResult_t f_async_error(ncclComm_t comm, ncclResult_t *e) {
    (void)comm;
    *e = async_error_after >= 0 && ++async_polls > async_error_after ? ncclRemoteError : ncclSuccess;
    return ncclSuccess;
}

static const char *f_error_string(ncclResult_t r) {
    return r == ncclRemoteError ? "remote process exited or there was a network error (fake)"
                                : "fake NCCL error";
}

static void f_push(cudaStream_t s, pt_comm *mc, pt_comm_req *r) {
    stream_push((fstream *)s, (fop){mc, r, NULL, NULL, 0});
}

static ncclResult_t f_all_reduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                 ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    if (op != ncclSum || in_group) return ncclInvalidUsage;
    if (send != recv) l_copy_now(NULL, recv, send, count * pt_dtype_size(f_type(dt)));
    f_push(s, comm->mc, comm->mc->iallreduce(comm->mc, recv, count, f_type(dt)));
    return ncclSuccess;
}

static ncclResult_t f_reduce_scatter(const void *send, void *recv, size_t rc, ncclDataType_t dt,
                                     ncclRedOp_t op, ncclComm_t comm, cudaStream_t s) {
    if (op != ncclSum || in_group) return ncclInvalidUsage;
    size_t blk = rc * pt_dtype_size(f_type(dt));
    if ((const char *)recv == (const char *)send + (size_t)comm->mc->rank * blk) {
        /* NCCL's in place: the result at the rank's block (MPI's: at the first) */
        f_push(s, comm->mc, comm->mc->ireduce_scatter(comm->mc, NULL, (void *)send, rc, f_type(dt)));
        if (comm->mc->rank) {
            stream_push((fstream *)s, (fop){NULL, NULL, recv, send, blk});
            /* the rest of the buffer is NCCL's scratch: the first block no longer the result */
            stream_push((fstream *)s, (fop){NULL, NULL, (void *)send, NULL, blk});
        }
    } else {
        f_push(s, comm->mc, comm->mc->ireduce_scatter(comm->mc, send, recv, rc, f_type(dt)));
    }
    return ncclSuccess;
}

static ncclResult_t f_all_gather(const void *send, void *recv, size_t sc, ncclDataType_t dt,
                                 ncclComm_t comm, cudaStream_t s) {
    if (in_group) return ncclInvalidUsage;
    size_t blk = sc * pt_dtype_size(f_type(dt));
    int inplace = (const char *)send == (const char *)recv + (size_t)comm->mc->rank * blk;
    f_push(s, comm->mc, comm->mc->iallgather(comm->mc, inplace ? NULL : send, recv, sc, f_type(dt)));
    return ncclSuccess;
}

static ncclResult_t f_broadcast(const void *send, void *recv, size_t count, ncclDataType_t dt,
                                int root, ncclComm_t comm, cudaStream_t s) {
    if (in_group) return ncclInvalidUsage;
    if (send != recv && comm->mc->rank == root)
        l_copy_now(NULL, recv, send, count * pt_dtype_size(f_type(dt)));
    f_push(s, comm->mc, comm->mc->ibcast(comm->mc, recv, count, f_type(dt), root));
    return ncclSuccess;
}

/* matched in posting order between a pair: the tag is the pair's message count */
static ncclResult_t f_send(const void *buf, size_t count, ncclDataType_t dt, int peer,
                           ncclComm_t comm, cudaStream_t s) {
    if (!in_group) return ncclInvalidUsage;
    int tag = (int)(comm->sent[peer]++ % 30000);
    f_push(s, comm->mc, comm->mc->isend(comm->mc, buf, count, f_type(dt), peer, tag));
    return ncclSuccess;
}

static ncclResult_t f_recv(void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                           cudaStream_t s) {
    if (!in_group) return ncclInvalidUsage;
    int tag = (int)(comm->got[peer]++ % 30000);
    f_push(s, comm->mc, comm->mc->irecv(comm->mc, buf, count, f_type(dt), peer, tag));
    return ncclSuccess;
}

static ncclResult_t f_group_start(void) {
    in_group++;
    return ncclSuccess;
}
static ncclResult_t f_group_end(void) {
    if (in_group <= 0) return ncclInvalidUsage;
    in_group--;
    return ncclSuccess;
}

static const pt_nccl_api fake = {
    f_get_unique_id, f_comm_init_rank, f_comm_split, f_comm_abort, f_comm_destroy, f_async_error,
    f_error_string, f_all_reduce, f_reduce_scatter, f_all_gather, f_broadcast, f_send, f_recv,
    f_group_start, f_group_end};

/* ---- the checks ---- */
static int passed, failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            fprintf(stderr, "FAIL (rank %d): ", me);                                               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

static int me;

static float val(int rank, size_t i) { return (float)(rank + 1) * 0.5f + (float)(i % 7); }

/* every element of x (n) equal to want(i) */
static int all_eq(const float *x, size_t n, float (*want)(size_t, void *), void *arg) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != want(i, arg)) return 0;
    return 1;
}

static float sum_over(size_t i, void *arg) {
    int size = *(int *)arg;
    float s = 0;
    for (int r = 0; r < size; r++) s += val(r, i);
    return s;
}

static void ops(pt_comm *w) {
    int N = w->size, R = w->rank;
    const size_t n = 1000;
    /* all-reduce, in place */
    float *a = dev_alloc(n * sizeof *a);
    for (size_t i = 0; i < n; i++) a[i] = val(R, i);
    pt_comm_wait(w, w->iallreduce(w, a, n, PT_DTYPE_F32));
    CHECK(all_eq(a, n, sum_over, &N), "all-reduce f32");
    /* bf16 all-reduce: values exact in bf16, so any order gives the formula */
    pt_bf16 *h = dev_alloc(n * sizeof *h);
    for (size_t i = 0; i < n; i++) h[i] = pt_bf16_round((float)(R + 1) * (float)(i % 5));
    pt_comm_wait(w, w->iallreduce(w, h, n, PT_DTYPE_BF16));
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= pt_bf16_to_float(h[i]) == (float)(N * (N + 1) / 2) * (float)(i % 5);
    CHECK(ok, "all-reduce bf16");
    /* reduce-scatter in place (ours: the result at the start) and from a separate input */
    const size_t rc = 250;
    float *rs = dev_alloc((size_t)N * rc * sizeof *rs), *rsin = dev_alloc((size_t)N * rc * sizeof *rsin);
    float *rsout = dev_alloc(rc * sizeof *rsout);
    for (size_t i = 0; i < (size_t)N * rc; i++) rs[i] = rsin[i] = val(R, i);
    pt_comm_wait(w, w->ireduce_scatter(w, NULL, rs, rc, PT_DTYPE_F32));
    pt_comm_wait(w, w->ireduce_scatter(w, rsin, rsout, rc, PT_DTYPE_F32));
    ok = 1;
    for (size_t i = 0; i < rc; i++)
        ok &= rs[i] == sum_over((size_t)R * rc + i, &N) && rsout[i] == rs[i];
    CHECK(ok, "reduce-scatter in place and out of place");
    /* all-gather in place and from a separate input */
    float *ag = dev_alloc((size_t)N * rc * sizeof *ag), *ag2 = dev_alloc((size_t)N * rc * sizeof *ag2);
    float *mine = dev_alloc(rc * sizeof *mine);
    for (size_t i = 0; i < rc; i++) ag[(size_t)R * rc + i] = mine[i] = val(R, i) * 3;
    pt_comm_wait(w, w->iallgather(w, NULL, ag, rc, PT_DTYPE_F32));
    pt_comm_wait(w, w->iallgather(w, mine, ag2, rc, PT_DTYPE_F32));
    ok = 1;
    for (int r = 0; r < N; r++)
        for (size_t i = 0; i < rc; i++)
            ok &= ag[(size_t)r * rc + i] == val(r, i) * 3 && ag2[(size_t)r * rc + i] == val(r, i) * 3;
    CHECK(ok, "all-gather in place and out of place");
    /* broadcast from the last rank */
    float *b = dev_alloc(n * sizeof *b);
    for (size_t i = 0; i < n; i++) b[i] = val(R, i);
    pt_comm_wait(w, w->ibcast(w, b, n, PT_DTYPE_F32, N - 1));
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= b[i] == val(N - 1, i);
    CHECK(ok, "broadcast");
    /* all-to-all-v: rank r sends (r + q) % 3 rows of 4 to q (some none), row values r·100 + q */
    int64_t sc[64], rcn[64], ns = 0, nr = 0;
    for (int q = 0; q < N; q++) {
        sc[q] = 4 * ((R + q) % 3);
        rcn[q] = 4 * ((q + R) % 3);
        ns += sc[q];
        nr += rcn[q];
    }
    float *s2 = dev_alloc((size_t)ns * sizeof *s2), *r2 = dev_alloc((size_t)nr * sizeof *r2);
    for (int q = 0, o = 0; q < N; q++)
        for (int64_t i = 0; i < sc[q]; i++) s2[o++] = (float)(R * 100 + q);
    uint64_t a2a_before = w->stats.bytes[PT_COMM_ALLTOALLV];
    pt_comm_wait(w, w->ialltoallv(w, s2, sc, r2, rcn, PT_DTYPE_F32));
    ok = 1;
    for (int q = 0, o = 0; q < N; q++)
        for (int64_t i = 0; i < rcn[q]; i++) ok &= r2[o++] == (float)(q * 100 + R);
    CHECK(ok, "all-to-all-v");
    uint64_t want_a2a = 0;
    for (int q = 0; q < N; q++) want_a2a += q == R ? 0 : (uint64_t)sc[q] * 4;
    CHECK(w->stats.bytes[PT_COMM_ALLTOALLV] - a2a_before == want_a2a, "all-to-all-v bytes");
    /* sends and receives around the ring, twice each way per pair, posted sends first on even
     * ranks and receives first on odd ones: NCCL's order of matching between a pair is the
     * posting order, whatever the order of sends against receives */
    float *out1 = dev_alloc(64 * sizeof(float)), *out2 = dev_alloc(64 * sizeof(float));
    float *in1 = dev_alloc(64 * sizeof(float)), *in2 = dev_alloc(64 * sizeof(float));
    for (int i = 0; i < 64; i++) out1[i] = (float)(R * 1000 + i), out2[i] = (float)(R * 1000 + 500 + i);
    int next = (R + 1) % N, prev = (R + N - 1) % N;
    pt_comm_req *q[4];
    if (R % 2 == 0) {
        q[0] = w->isend(w, out1, 64, PT_DTYPE_F32, next, 7);
        q[1] = w->isend(w, out2, 64, PT_DTYPE_F32, next, 7);
        q[2] = w->irecv(w, in1, 64, PT_DTYPE_F32, prev, 7);
        q[3] = w->irecv(w, in2, 64, PT_DTYPE_F32, prev, 7);
    } else {
        q[2] = w->irecv(w, in1, 64, PT_DTYPE_F32, prev, 7);
        q[3] = w->irecv(w, in2, 64, PT_DTYPE_F32, prev, 7);
        q[0] = w->isend(w, out1, 64, PT_DTYPE_F32, next, 7);
        q[1] = w->isend(w, out2, 64, PT_DTYPE_F32, next, 7);
    }
    for (int i = 0; i < 4; i++) pt_comm_wait(w, q[i]);
    ok = 1;
    for (int i = 0; i < 64; i++)
        ok &= in1[i] == (float)(prev * 1000 + i) && in2[i] == (float)(prev * 1000 + 500 + i);
    CHECK(ok, "sends and receives in posting order");
    /* host memory goes over MPI on the same group */
    int32_t host[3] = {R, 1, 2 * R};
    pt_allreduce_sum(w, host, 3, PT_DTYPE_I32);
    CHECK(host[0] == N * (N - 1) / 2 && host[1] == N && host[2] == N * (N - 1), "host all-reduce");
    /* the counters: calls and bus-bandwidth bytes as MPI's */
    CHECK(w->stats.calls[PT_COMM_ALLREDUCE] == 3 && w->stats.calls[PT_COMM_REDUCE_SCATTER] == 2 &&
              w->stats.calls[PT_COMM_ALLGATHER] == 2 && w->stats.calls[PT_COMM_SEND] == 2 &&
              w->stats.calls[PT_COMM_RECV] == 2,
          "calls counted");
    uint64_t ar = 2 * (uint64_t)(N - 1) * n * 4 / N + 2 * (uint64_t)(N - 1) * n * 2 / N +
                  2 * (uint64_t)(N - 1) * 12 / N;
    CHECK(w->stats.bytes[PT_COMM_ALLREDUCE] == ar, "all-reduce bytes %llu, want %llu",
          (unsigned long long)w->stats.bytes[PT_COMM_ALLREDUCE], (unsigned long long)ar);
    CHECK(w->stats.bytes[PT_COMM_SEND] == 2 * 64 * 4 && w->stats.bytes[PT_COMM_RECV] == 0, "p2p bytes");
}

/* a split (ranks reversed within each parity) and a dup: their NCCL communicators split from the
 * parent's; an all-reduce on each against its members' formula */
static void groups(pt_comm *w) {
    int R = w->rank, N = w->size;
    pt_comm *g = w->split(w, R % 2, -R, "parity");
    int members = (N - R % 2 + 1) / 2, want_rank = 0;
    for (int r = R + 2; r < N; r += 2) want_rank++;
    CHECK(g->size == members && g->rank == want_rank, "split: rank %d of %d", g->rank, g->size);
    float *x = dev_alloc(16 * sizeof *x);
    for (int i = 0; i < 16; i++) x[i] = (float)R;
    pt_comm_wait(g, g->iallreduce(g, x, 16, PT_DTYPE_F32));
    float want = 0;
    for (int r = R % 2; r < N; r += 2) want += (float)r;
    CHECK(x[0] == want && x[15] == want, "split all-reduce %g, want %g", x[0], want);
    pt_comm *d = g->dup(g, "parity2");
    for (int i = 0; i < 16; i++) x[i] = 1;
    pt_comm_wait(d, d->iallreduce(d, x, 16, PT_DTYPE_F32));
    CHECK(x[3] == (float)members && d->stats.calls[PT_COMM_ALLREDUCE] == 1 &&
              g->stats.calls[PT_COMM_ALLREDUCE] == 1,
          "dup: its own counters and traffic");
    d->free(d);
    g->free(g);
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "ops";
    if (!strcmp(mode, "train")) { /* the trainer starts the runtime; its groups get NCCL's mode */
        train_mode = 1;
        pt_comm_nccl_use(&fake);
        if (pt_comm_set_device(&link, PT_COMM_NCCL) != PT_OK) return 2;
        return pt_cmd_train(argc - 2, argv + 2);
    }
    int world = 1;
    if (pt_comm_runtime_init(&me, &world) != PT_OK) return 2;
    dev_mem = calloc(1, DEV_BYTES);
    srand((unsigned)(12345 + 7 * me)); /* a different id drawn on each rank: only rank 0's counts */
    pt_comm_nccl_use(&fake);
    if (pt_comm_set_device(&link, PT_COMM_NCCL) != PT_OK) return 2;
    pt_comm *w = pt_comm_world(!strcmp(mode, "ops") ? 60.0 : 2.0);
    if (pt_comm_device_attach(w) != PT_OK) return 2;
    CHECK(inits_checked == 1, "ncclCommInitRank: one world communicator from rank 0's id");
    if (!strcmp(mode, "hang")) {
        float *x = dev_alloc(64);
        if (me != 1) pt_comm_wait(w, w->iallreduce(w, x, 16, PT_DTYPE_F32));
        pt_barrier(w); /* rank 1 waits here, never reached by the others */
        return 3;      /* not reached: the job ends in the wait */
    }
    if (!strcmp(mode, "async")) {
        async_error_after = 0;
        float *x = dev_alloc(64);
        for (int i = 0; i < 300; i++) pt_comm_wait(w, w->iallreduce(w, x, 16, PT_DTYPE_F32));
        return 3; /* not reached */
    }
    ops(w);
    groups(w);
    CHECK(splits == 2, "ncclCommSplit once per split and dup (%d)", splits);
    CHECK(aborts == 0, "no abort");
    w->free(w);
    CHECK(streams_made == 3 && streams_freed == 3 && events_made == events_freed,
          "streams %d made, %d freed; events %d made, %d freed", streams_made, streams_freed,
          events_made, events_freed);
    int32_t bad = failed;
    pt_comm *plain = pt_comm_world(30.0);
    pt_allreduce_sum(plain, &bad, 1, PT_DTYPE_I32);
    plain->free(plain);
    if (me == 0) printf("nccl_host: %d checks passed on each rank, %d failed in all\n", passed, bad);
    pt_comm_runtime_finalize();
    return bad ? 1 : 0;
}
