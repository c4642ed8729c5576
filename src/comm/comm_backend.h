/* comm_backend.h: what a comm backend (src/comm/comm_<name>.c) builds on, from comm.c: the head of
 * every request and the per-communicator request pool. Private to src/comm. */
#ifndef PT_COMM_BACKEND_H
#define PT_COMM_BACKEND_H

#include "pt/comm.h"

/* The backend-neutral head of a request; a backend's request type starts with it and sets
 * c->req_size to its size. */
struct pt_comm_req {
    pt_comm_req *next_idle; /* in c->req_idle while idle */
    pt_comm_op op;
    int held; /* a guard hold (core.h) taken on its buffers until it completes */
    int layered; /* a hierarchical all-reduce's (comm_hier.c), not the backend's own */
    double t_post;  /* when it was posted, while a trace records (trace.h); else 0 */
    uint64_t bytes; /* what it moves (for the trace) */
    uint64_t flight_id, flight_seq; /* its flight record (pt/flight.h) and number in the group */
    int flight_peer; /* send/recv: the peer's world rank */
    void *stage;     /* staged through host memory: its staging (comm_stage.c); else NULL */
    int on_device;   /* posted on NCCL (comm_nccl.c): done when dev_event has happened */
    void *dev_event; /* the request's device event, made once and kept with the request */
};

/* An idle request of c's pool, for an operation op moving `bytes` (counted in c->stats now). The
 * pool grows (zeroed requests of c->req_size bytes, in one block) to twice the requests pending,
 * 16 at least, whenever more than half of it is pending. a and b: the operation's buffers; on
 * guarded backend memory they stay accessible (a hold) from here until pt_comm_req_done, since
 * the backend reads and writes them in between. */
pt_comm_req *pt_comm_req_take(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *a,
                              const void *b);
/* The same for a send or receive with group rank `peer` (recorded as its world rank). */
pt_comm_req *pt_comm_req_take_p2p(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *buf,
                                  int peer);
/* r completed: releases its hold and returns it to c's pool. */
void pt_comm_req_done(pt_comm *c, pt_comm_req *r);
/* Frees every request of c's pool, idle or not (from c->free). */
void pt_comm_req_free_all(pt_comm *c);

/* The entries of a group's table that a layer over it (comm_stage.c, comm_nccl.c) replaces, as
 * it found them: the layer calls them for what it passes on. */
typedef struct {
    pt_comm_req *(*iallreduce)(pt_comm *c, void *buf, size_t count, pt_dtype dt);
    pt_comm_req *(*ireduce_scatter)(pt_comm *c, const void *send, void *recv, size_t recv_count,
                                    pt_dtype dt);
    pt_comm_req *(*iallgather)(pt_comm *c, const void *send, void *recv, size_t send_count,
                               pt_dtype dt);
    pt_comm_req *(*ialltoallv)(pt_comm *c, const void *send, const int64_t *send_counts,
                               void *recv, const int64_t *recv_counts, pt_dtype dt);
    pt_comm_req *(*isend)(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer, int tag);
    pt_comm_req *(*irecv)(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag);
    pt_comm_req *(*ibcast)(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root);
    int (*test)(pt_comm *c, pt_comm_req *r);
    void (*progress)(pt_comm *c);
    pt_comm *(*split)(pt_comm *c, int color, int key, const char *name);
    pt_comm *(*dup)(pt_comm *c, const char *name);
    void (*free)(pt_comm *c);
} pt_comm_entries;

static inline pt_comm_entries pt_comm_entries_of(const pt_comm *c) {
    return (pt_comm_entries){c->iallreduce, c->ireduce_scatter, c->iallgather, c->ialltoallv,
                             c->isend, c->irecv, c->ibcast, c->test, c->progress, c->split,
                             c->dup, c->free};
}

#endif
