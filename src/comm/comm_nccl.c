/* comm_nccl.c: the communication layer over NCCL (include/pt/comm.h, PT_COMM_NCCL), for a backend
 * whose memory is a GPU's (pt_device_link, include/pt/backend.h). It builds on an MPI group of
 * the same members: MPI starts the processes, carries the world's unique id, and still moves what
 * lies in host memory (counts, scalars, the flight recorder's diagnosis); everything in device
 * memory goes over NCCL. NCCL's calls go through a table (comm_nccl.h): libnccl.so.2's (from the
 * loader's path, else the CUDA toolkit's library folder), loaded at the first group, or a test's
 * stand-in.
 *
 * Groups: the world's NCCL communicator is made from a unique id that world rank 0 draws and
 * broadcasts over MPI (ncclCommInitRank); every other group's is split from its parent's
 * (ncclCommSplit, collective over the parent like the MPI split it goes with), so a group's
 * NCCL ranks are its MPI ranks.
 *
 * Streams and events: each group has a communication stream of its own. An operation records an
 * event on the compute stream (everything the model queued before it), makes the group's stream
 * wait for it, queues NCCL's call there and records the request's event after it. The request's
 * test is a query of that event: the host learns of completion without stopping either stream,
 * and the compute stream keeps running what was queued between the post and the wait, which is
 * where each parallelism puts its overlap. pt_comm_wait's timeout aborts the communicator
 * (ncclCommAbort) before ending the job with the group and operation named; every 256 tests the
 * communicator's asynchronous error is polled and reported the same way.
 *
 * Collectives map one to one, in place as NCCL defines it, except the in-place reduce-scatter:
 * ours leaves the result at the start of the buffer, NCCL's at the rank's block, which a copy on
 * the group's stream moves. All-to-all-v is one NCCL group of a send and a receive per peer
 * with rows to exchange. Sends and receives: NCCL matches them in the order they are posted
 * between two ranks (tags are not NCCL's); those posted on a group between two of its tests are
 * queued together as one NCCL group at the next test, progress or other operation of the group,
 * so that a send and a receive between the same pair progress together. bf16 sums are NCCL's
 * bf16 (each partial sum rounded to bf16, as the MPI path's reduction does; the order of the sums
 * is NCCL's). */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"
#include "comm/comm_nccl.h"
#include "pt/backend.h"

enum { PT_NCCL_P2P_MAX = 64, PT_NCCL_ERROR_POLL = 256 };

static const pt_nccl_api *pt_nccl_table; /* the table in use (NULL: not chosen yet) */

/* NCCL's own table, from libnccl.so.2 (loaded once). */
static pt_nccl_api pt_nccl_lib;
static int pt_nccl_loaded; /* 1: loaded; -1: failed */
static char pt_nccl_why[256];

#define PT_NCCL_SYM(field, name)                                                                  \
    do {                                                                                           \
        *(void **)&pt_nccl_lib.field = dlsym(h, name);                                             \
        if (!pt_nccl_lib.field) {                                                                  \
            snprintf(pt_nccl_why, sizeof pt_nccl_why, "libnccl.so.2 has no %s", name);             \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int pt_nccl_load(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
#ifdef PT_CUDA_LIBDIR
    if (!h) h = dlopen(PT_CUDA_LIBDIR "/libnccl.so.2", RTLD_NOW | RTLD_LOCAL); /* the toolkit's */
#endif
    if (!h) {
        snprintf(pt_nccl_why, sizeof pt_nccl_why, "libnccl.so.2 cannot be loaded (%s): install "
                 "NCCL or put it on LD_LIBRARY_PATH", dlerror());
        return -1;
    }
    PT_NCCL_SYM(get_unique_id, "ncclGetUniqueId");
    PT_NCCL_SYM(comm_init_rank, "ncclCommInitRank");
    PT_NCCL_SYM(comm_split, "ncclCommSplit");
    PT_NCCL_SYM(comm_abort, "ncclCommAbort");
    PT_NCCL_SYM(comm_destroy, "ncclCommDestroy");
    PT_NCCL_SYM(comm_get_async_error, "ncclCommGetAsyncError");
    PT_NCCL_SYM(get_error_string, "ncclGetErrorString");
    PT_NCCL_SYM(all_reduce, "ncclAllReduce");
    PT_NCCL_SYM(reduce_scatter, "ncclReduceScatter");
    PT_NCCL_SYM(all_gather, "ncclAllGather");
    PT_NCCL_SYM(broadcast, "ncclBroadcast");
    PT_NCCL_SYM(send, "ncclSend");
    PT_NCCL_SYM(recv, "ncclRecv");
    PT_NCCL_SYM(group_start, "ncclGroupStart");
    PT_NCCL_SYM(group_end, "ncclGroupEnd");
    return 1;
}

void pt_comm_nccl_use(const pt_nccl_api *api) { pt_nccl_table = api; }

int pt_comm_nccl_available(void) {
    if (pt_nccl_table) return 1;
    if (!pt_nccl_loaded) pt_nccl_loaded = pt_nccl_load();
    if (pt_nccl_loaded < 0) {
        pt_errorf(PT_ERR_CONFIG, "comm.backend = nccl: %s", pt_nccl_why);
        return 0;
    }
    pt_nccl_table = &pt_nccl_lib;
    return 1;
}

/* A send or receive posted and not yet queued on NCCL. */
typedef struct {
    pt_comm_req *r;
    int send;
    void *buf;
    size_t count;
    pt_dtype dt;
    int peer;
} pt_nccl_p2p;

typedef struct {
    const pt_nccl_api *api;
    const pt_device_link *link;
    ncclComm_t nc;
    void *stream; /* the group's communication stream */
    void *ready;  /* recorded on the compute stream before each operation */
    int polls;    /* tests since the last poll of NCCL's asynchronous error */
    const char *last_op; /* the latest operation queued, for an error's message */
    pt_nccl_p2p p2p[PT_NCCL_P2P_MAX];
    int n_p2p;
    void **events; /* every request event made, freed with the group */
    int n_events, cap_events;
    pt_comm_entries own; /* the group's MPI entries */
} pt_nccl;

static pt_nccl *pt_nccl_of(const pt_comm *c) { return (pt_nccl *)c->dev; }

static ncclDataType_t pt_nccl_type(pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32: return ncclFloat32;
    case PT_DTYPE_F64: return ncclFloat64;
    case PT_DTYPE_I32: return ncclInt32;
    case PT_DTYPE_I64: return ncclInt64;
    case PT_DTYPE_BF16: return ncclBfloat16;
    }
    return ncclFloat32;
}

/* A failed NCCL call is a fault of the device or the network, never bad input: the job ends
 * naming the group, the operation and NCCL's reason. */
static void pt_nccl_check(pt_comm *c, ncclResult_t rc, const char *what) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    pt_nccl *n = pt_nccl_of(c);
    pt_fatal(__FILE__, __LINE__, "NCCL: %s over group \"%s\" (rank %d of %d) failed: %s", what,
             c->name, c->rank, c->size, n->api->get_error_string(rc));
}

/* 1 when the buffers are device memory, 0 when host memory (MPI's); a mix is a caller's bug. */
static int pt_nccl_on_device(pt_comm *c, const void *a, const void *b, const char *op) {
    pt_nccl *n = pt_nccl_of(c);
    int da = a && n->link->owns(n->link->ctx, a), db = b && n->link->owns(n->link->ctx, b);
    PT_ASSERTF(!(a && b) || da == db, "%s over group %s: one buffer in device memory, the other "
               "in host memory", op, c->name);
    return da || db;
}

static void pt_nccl_flush(pt_comm *c);

/* Before an operation on host memory (MPI's): the sends and receives waiting are queued first, so
 * that no peer waits on them while this rank waits on MPI. */
static pt_nccl *pt_nccl_host(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    return n;
}

/* Before an NCCL call: what is pending is queued first, and the group's stream waits for the
 * compute stream's work so far. */
static void pt_nccl_begin(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    n->link->event_record(n->link->ctx, n->ready, n->link->stream);
    n->link->stream_wait(n->link->ctx, n->stream, n->ready);
}

/* After it: r is done when its event, recorded now on the group's stream, has happened. */
static pt_comm_req *pt_nccl_end(pt_comm *c, pt_comm_req *r, const char *op) {
    pt_nccl *n = pt_nccl_of(c);
    if (!r->dev_event) {
        r->dev_event = n->link->event_new(n->link->ctx);
        if (n->n_events == n->cap_events) {
            n->cap_events = n->cap_events ? 2 * n->cap_events : 16;
            n->events = pt_realloc(n->events, (size_t)n->cap_events * sizeof *n->events);
        }
        n->events[n->n_events++] = r->dev_event;
    }
    r->on_device = 1;
    n->last_op = op;
    n->link->event_record(n->link->ctx, r->dev_event, n->stream);
    return r;
}

static uint64_t pt_allreduce_bytes(int size, size_t count, pt_dtype dt) {
    return size > 1 ? 2 * (uint64_t)(size - 1) * count * pt_dtype_size(dt) / size : 0;
}

static pt_comm_req *nc_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_nccl *n = pt_nccl_of(c);
    if (!pt_nccl_on_device(c, buf, NULL, "all-reduce"))
        return pt_nccl_host(c)->own.iallreduce(c, buf, count, dt);
    pt_comm_req *r = pt_comm_req_take(c, PT_COMM_ALLREDUCE, pt_allreduce_bytes(c->size, count, dt),
                                      buf, NULL);
    pt_nccl_begin(c);
    pt_nccl_check(c, n->api->all_reduce(buf, buf, count, pt_nccl_type(dt), ncclSum, n->nc,
                                        n->stream), "ncclAllReduce");
    return pt_nccl_end(c, r, "all-reduce");
}

static pt_comm_req *nc_ireduce_scatter(pt_comm *c, const void *send, void *recv, size_t recv_count,
                                       pt_dtype dt) {
    pt_nccl *n = pt_nccl_of(c);
    if (!pt_nccl_on_device(c, send, recv, "reduce-scatter"))
        return pt_nccl_host(c)->own.ireduce_scatter(c, send, recv, recv_count, dt);
    size_t blk = recv_count * pt_dtype_size(dt);
    pt_comm_req *r = pt_comm_req_take(c, PT_COMM_REDUCE_SCATTER,
                                      (uint64_t)(c->size - 1) * blk, send, recv);
    pt_nccl_begin(c);
    if (send) {
        pt_nccl_check(c, n->api->reduce_scatter(send, recv, recv_count, pt_nccl_type(dt), ncclSum,
                                                n->nc, n->stream), "ncclReduceScatter");
    } else { /* NCCL's in place leaves the result at the rank's block: moved to the start */
        char *mine = (char *)recv + (size_t)c->rank * blk;
        pt_nccl_check(c, n->api->reduce_scatter(recv, mine, recv_count, pt_nccl_type(dt), ncclSum,
                                                n->nc, n->stream), "ncclReduceScatter");
        if (c->rank > 0) n->link->copy(n->link->ctx, recv, mine, blk, n->stream);
    }
    return pt_nccl_end(c, r, "reduce-scatter");
}

static pt_comm_req *nc_iallgather(pt_comm *c, const void *send, void *recv, size_t send_count,
                                  pt_dtype dt) {
    pt_nccl *n = pt_nccl_of(c);
    if (!pt_nccl_on_device(c, send, recv, "all-gather"))
        return pt_nccl_host(c)->own.iallgather(c, send, recv, send_count, dt);
    size_t blk = send_count * pt_dtype_size(dt);
    pt_comm_req *r = pt_comm_req_take(c, PT_COMM_ALLGATHER, (uint64_t)(c->size - 1) * blk, send,
                                      recv);
    pt_nccl_begin(c);
    /* in place, ours and NCCL's: this rank's part already at recv + rank·send_count */
    const void *from = send ? send : (const char *)recv + (size_t)c->rank * blk;
    pt_nccl_check(c, n->api->all_gather(from, recv, send_count, pt_nccl_type(dt), n->nc, n->stream),
                  "ncclAllGather");
    return pt_nccl_end(c, r, "all-gather");
}

static pt_comm_req *nc_ialltoallv(pt_comm *c, const void *send, const int64_t *send_counts,
                                  void *recv, const int64_t *recv_counts, pt_dtype dt) {
    pt_nccl *n = pt_nccl_of(c);
    if (!pt_nccl_on_device(c, send, recv, "all-to-all"))
        return pt_nccl_host(c)->own.ialltoallv(c, send, send_counts, recv, recv_counts, dt);
    size_t es = pt_dtype_size(dt);
    uint64_t bytes = 0;
    for (int i = 0; i < c->size; i++)
        if (i != c->rank) bytes += (uint64_t)send_counts[i] * es;
    pt_comm_req *r = pt_comm_req_take(c, PT_COMM_ALLTOALLV, bytes, send, recv);
    pt_nccl_begin(c);
    ncclDataType_t t = pt_nccl_type(dt);
    pt_nccl_check(c, n->api->group_start(), "ncclGroupStart");
    size_t so = 0, ro = 0;
    for (int i = 0; i < c->size; i++) {
        if (send_counts[i] > 0)
            pt_nccl_check(c, n->api->send((const char *)send + so * es, (size_t)send_counts[i], t,
                                          i, n->nc, n->stream), "ncclSend (all-to-all)");
        if (recv_counts[i] > 0)
            pt_nccl_check(c, n->api->recv((char *)recv + ro * es, (size_t)recv_counts[i], t, i,
                                          n->nc, n->stream), "ncclRecv (all-to-all)");
        so += (size_t)send_counts[i];
        ro += (size_t)recv_counts[i];
    }
    pt_nccl_check(c, n->api->group_end(), "ncclGroupEnd (all-to-all)");
    return pt_nccl_end(c, r, "all-to-all");
}

static pt_comm_req *nc_ibcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    pt_nccl *n = pt_nccl_of(c);
    if (!pt_nccl_on_device(c, buf, NULL, "broadcast"))
        return pt_nccl_host(c)->own.ibcast(c, buf, count, dt, root);
    pt_comm_req *r = pt_comm_req_take(c, PT_COMM_BCAST,
                                      c->rank == root ? count * pt_dtype_size(dt) : 0, buf, NULL);
    pt_nccl_begin(c);
    pt_nccl_check(c, n->api->broadcast(buf, buf, count, pt_nccl_type(dt), root, n->nc, n->stream),
                  "ncclBroadcast");
    return pt_nccl_end(c, r, "broadcast");
}

/* Sends and receives wait in n->p2p until the group's next test, progress or operation. */
static pt_comm_req *pt_nccl_p2p_post(pt_comm *c, int send, void *buf, size_t count, pt_dtype dt,
                                     int peer) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p == PT_NCCL_P2P_MAX) pt_nccl_flush(c);
    pt_comm_req *r = pt_comm_req_take_p2p(c, send ? PT_COMM_SEND : PT_COMM_RECV,
                                          send ? count * pt_dtype_size(dt) : 0, buf, peer);
    r->on_device = 1; /* its event is recorded when it is queued */
    n->p2p[n->n_p2p++] = (pt_nccl_p2p){r, send, buf, count, dt, peer};
    return r;
}

static pt_comm_req *nc_isend(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer,
                             int tag) {
    if (!pt_nccl_on_device(c, buf, NULL, "send"))
        return pt_nccl_host(c)->own.isend(c, buf, count, dt, peer, tag);
    return pt_nccl_p2p_post(c, 1, (void *)buf, count, dt, peer);
}

static pt_comm_req *nc_irecv(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag) {
    if (!pt_nccl_on_device(c, buf, NULL, "receive"))
        return pt_nccl_host(c)->own.irecv(c, buf, count, dt, peer, tag);
    return pt_nccl_p2p_post(c, 0, buf, count, dt, peer);
}

/* The waiting sends and receives queued as one NCCL group, each request's event after it. */
static void pt_nccl_flush(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    int k = n->n_p2p;
    n->n_p2p = 0; /* pt_nccl_begin flushes what is waiting: nothing now */
    pt_nccl_begin(c);
    pt_nccl_check(c, n->api->group_start(), "ncclGroupStart");
    for (int i = 0; i < k; i++) {
        pt_nccl_p2p *p = &n->p2p[i];
        ncclDataType_t t = pt_nccl_type(p->dt);
        if (p->send)
            pt_nccl_check(c, n->api->send(p->buf, p->count, t, p->peer, n->nc, n->stream),
                          "ncclSend");
        else
            pt_nccl_check(c, n->api->recv(p->buf, p->count, t, p->peer, n->nc, n->stream),
                          "ncclRecv");
    }
    pt_nccl_check(c, n->api->group_end(), "ncclGroupEnd");
    for (int i = 0; i < k; i++) pt_nccl_end(c, n->p2p[i].r, n->p2p[i].send ? "send" : "receive");
}

/* NCCL's asynchronous error, every PT_NCCL_ERROR_POLL tests: reported as a failed call. */
static void pt_nccl_poll_error(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    if (++n->polls < PT_NCCL_ERROR_POLL) return;
    n->polls = 0;
    ncclResult_t e = ncclSuccess;
    pt_nccl_check(c, n->api->comm_get_async_error(n->nc, &e), "ncclCommGetAsyncError");
    if (e != ncclSuccess && e != ncclInProgress)
        pt_fatal(__FILE__, __LINE__, "NCCL: asynchronous error on group \"%s\" (rank %d of %d), "
                 "the latest operation queued %s: %s", c->name, c->rank, c->size,
                 n->last_op ? n->last_op : "none", n->api->get_error_string(e));
}

static int nc_test(pt_comm *c, pt_comm_req *r) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    if (!r->on_device) return n->own.test(c, r);
    pt_nccl_poll_error(c);
    if (!n->link->event_query(n->link->ctx, r->dev_event)) return 0;
    pt_comm_req_done(c, r);
    return 1;
}

static void nc_progress(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    n->own.progress(c);
}

static void nc_abort(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    pt_log_error("group \"%s\": aborting its NCCL communicator (ncclCommAbort)", c->name);
    n->api->comm_abort(n->nc);
}

static pt_status pt_nccl_attach(pt_comm *c, const pt_device_link *link, ncclComm_t nc);

static pt_comm *nc_split(pt_comm *c, int color, int key, const char *name) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    pt_comm *s = n->own.split(c, color, key, name);
    ncclComm_t nc = NULL;
    pt_nccl_check(c, n->api->comm_split(n->nc, color, key, &nc, NULL), "ncclCommSplit");
    PT_ASSERT(pt_nccl_attach(s, n->link, nc) == PT_OK);
    return s;
}

static pt_comm *nc_dup(pt_comm *c, const char *name) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    pt_comm *d = n->own.dup(c, name);
    ncclComm_t nc = NULL;
    pt_nccl_check(c, n->api->comm_split(n->nc, 0, c->rank, &nc, NULL), "ncclCommSplit (dup)");
    PT_ASSERT(pt_nccl_attach(d, n->link, nc) == PT_OK);
    return d;
}

static void nc_free(pt_comm *c) {
    pt_nccl *n = pt_nccl_of(c);
    if (n->n_p2p) pt_nccl_flush(c);
    n->api->comm_destroy(n->nc);
    for (int i = 0; i < n->n_events; i++) n->link->event_free(n->link->ctx, n->events[i]);
    n->link->event_free(n->link->ctx, n->ready);
    n->link->stream_free(n->link->ctx, n->stream);
    free(n->events);
    void (*own_free)(pt_comm *) = n->own.free;
    free(n);
    c->dev = NULL;
    own_free(c);
}

static pt_status pt_nccl_attach(pt_comm *c, const pt_device_link *link, ncclComm_t nc) {
    pt_nccl *n = pt_calloc(1, sizeof *n);
    n->api = pt_nccl_table;
    n->link = link;
    n->nc = nc;
    n->stream = link->stream_new(link->ctx);
    n->ready = link->event_new(link->ctx);
    n->own = pt_comm_entries_of(c);
    c->dev = n;
    c->iallreduce = nc_iallreduce;
    c->ireduce_scatter = nc_ireduce_scatter;
    c->iallgather = nc_iallgather;
    c->ialltoallv = nc_ialltoallv;
    c->isend = nc_isend;
    c->irecv = nc_irecv;
    c->ibcast = nc_ibcast;
    c->test = nc_test;
    c->progress = nc_progress;
    c->split = nc_split;
    c->dup = nc_dup;
    c->free = nc_free;
    c->abort = nc_abort;
    c->ordered_p2p = 1;
    return PT_OK;
}

/* The root of a tree of NCCL groups (the world): its communicator from a unique id that rank 0
 * draws and broadcasts over c's MPI. */
pt_status pt_comm_nccl_setup(pt_comm *c, const pt_device_link *link) {
    PT_ASSERT(!c->dev && !c->hier && link);
    if (!pt_comm_nccl_available()) return PT_ERR_CONFIG;
    const pt_nccl_api *api = pt_nccl_table;
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    ncclResult_t rc = c->rank == 0 ? api->get_unique_id(&id) : ncclSuccess;
    if (rc != ncclSuccess)
        pt_fatal(__FILE__, __LINE__, "NCCL: ncclGetUniqueId for group \"%s\" failed: %s", c->name,
                 api->get_error_string(rc));
    pt_comm_wait(c, c->ibcast(c, &id, sizeof id / sizeof(int32_t), PT_DTYPE_I32, 0));
    ncclComm_t nc = NULL;
    rc = api->comm_init_rank(&nc, c->size, id, c->rank);
    if (rc != ncclSuccess)
        pt_fatal(__FILE__, __LINE__, "NCCL: ncclCommInitRank for group \"%s\" (rank %d of %d) "
                 "failed: %s", c->name, c->rank, c->size, api->get_error_string(rc));
    return pt_nccl_attach(c, link, nc);
}
