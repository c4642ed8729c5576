/* comm.c: backend-independent parts of the communication layer: blocking wrappers, waiting,
 * counters and the request pool. Calls backends only through the table of pt_comm. */
#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <time.h>

#include "comm/comm_backend.h"
#include "pt/flight.h"
#include "pt/trace.h"

enum { PT_COMM_POOL_MIN = 16 };

/* One allocation of requests for c's pool. */
typedef struct pt_comm_block {
    struct pt_comm_block *next;
    _Alignas(max_align_t) unsigned char reqs[];
} pt_comm_block;

/* Makes c's pool hold `total` requests. */
static void pt_comm_pool_grow(pt_comm *c, int total) {
    if (total <= c->req_made) return;
    size_t al = _Alignof(max_align_t), size = (c->req_size + al - 1) / al * al;
    PT_ASSERT(c->req_size >= sizeof(pt_comm_req));
    int n = total - c->req_made;
    pt_comm_block *b = pt_calloc(1, sizeof *b + (size_t)n * size);
    b->next = c->req_blocks;
    c->req_blocks = b;
    for (int i = n - 1; i >= 0; i--) {
        pt_comm_req *r = (pt_comm_req *)(b->reqs + (size_t)i * size);
        r->next_idle = c->req_idle;
        c->req_idle = r;
    }
    c->req_made = total;
}

void pt_comm_reserve(pt_comm *c, int n) { pt_comm_pool_grow(c, n); }

/* peer: a send's or receive's group rank, else -1 */
static pt_comm_req *pt_comm_req_make(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *a,
                                     const void *b, int peer) {
    /* twice the most ever pending: a later step whose timing leaves a few more requests pending
     * at once than the first one did (fewer tests happening to find them done) finds them made */
    if (2 * (c->req_pending + 1) > c->req_made) {
        int want = 2 * (c->req_pending + 1);
        pt_comm_pool_grow(c, want > PT_COMM_POOL_MIN ? want : PT_COMM_POOL_MIN);
    }
    pt_comm_req *r = c->req_idle;
    c->req_idle = r->next_idle;
    c->req_pending++;
    r->next_idle = NULL;
    r->op = op;
    r->layered = 0;
    r->stage = NULL;
    r->on_device = 0;
    /* a group over device memory (c->dev) never hands it to the network itself: its staging
     * does, or NCCL; so no hold, and a path that would is caught by the guard */
    r->held = !c->dev && (pt_guard_covers(a) || pt_guard_covers(b));
    if (r->held) pt_guard_hold();
    c->stats.calls[op]++;
    c->stats.bytes[op] += bytes;
    r->t_post = pt_trace_on() ? pt_now() : 0.0;
    r->bytes = bytes;
    r->flight_peer = peer >= 0 ? pt_flight_world_rank(c->flight - 1, peer) : -1;
    r->flight_id = pt_flight_enter(c->flight - 1, op, r->flight_peer, bytes, &r->flight_seq);
    return r;
}

pt_comm_req *pt_comm_req_take(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *a,
                              const void *b) {
    return pt_comm_req_make(c, op, bytes, a, b, -1);
}

pt_comm_req *pt_comm_req_take_p2p(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *buf,
                                  int peer) {
    return pt_comm_req_make(c, op, bytes, buf, NULL, peer);
}

void pt_comm_req_done(pt_comm *c, pt_comm_req *r) {
    if (r->t_post > 0 && pt_trace_on()) pt_trace_comm(pt_comm_op_name(r->op), c->name, r->bytes, r->t_post, pt_now());
    pt_flight_done(r->flight_id, c->flight - 1, r->op, r->flight_seq);
    if (r->held) pt_guard_release();
    r->held = 0;
    r->next_idle = c->req_idle;
    c->req_idle = r;
    c->req_pending--;
}

void pt_comm_req_free_all(pt_comm *c) {
    for (pt_comm_block *b = c->req_blocks, *next; b; b = next) {
        next = b->next;
        free(b);
    }
    c->req_blocks = NULL;
    c->req_idle = NULL;
    c->req_made = c->req_pending = 0;
}

static int pt_busy_wait;

void pt_comm_set_busy_wait(int busy) { pt_busy_wait = busy; }

void pt_comm_wait(pt_comm *c, pt_comm_req *r) {
    if (!r) return;
    pt_comm_op op = r->op; /* r returns to the pool once done */
    double t0 = pt_now();
    struct timespec nap = {0, 20000};
    pt_flight_wait_begin(c->flight - 1, op, r->flight_seq, r->flight_peer);
    for (long spins = 0;; spins++) {
        if (c->test(c, r)) break;
        /* spin briefly, then yield the core: oversubscribed ranks must let their peers run */
        if (spins > 1000) {
            if (pt_busy_wait)
                sched_yield();
            else
                nanosleep(&nap, NULL);
        }
        if ((spins & 63) == 0) pt_flight_alive();
        if ((spins & 1023) != 0 || spins == 0) continue;
        if (c->timeout_s > 0 && pt_now() - t0 > c->timeout_s) {
            pt_log_error("%s over group \"%s\" (rank %d of %d) did not complete within %.0f s "
                         "(parallel.timeout_s): a peer died, hangs or skipped the collective; "
                         "asking the ranks which", pt_comm_op_name(op), c->name, c->rank, c->size,
                         c->timeout_s);
            if (c->abort) c->abort(c);
            pt_flight_hang(c, 1);
        }
        if (pt_flight_asked()) pt_flight_hang(c, 0); /* another rank's wait timed out */
    }
    pt_flight_wait_end();
    double dt = pt_now() - t0;
    c->stats.wait_seconds += dt;
    c->stats.wait_op[op] += dt;
    pt_trace_wait(pt_comm_op_name(op), c->name, t0, t0 + dt);
}

void pt_comm_poll(pt_comm *c, pt_comm_req *r) {
    (void)r;
    c->progress(c);
}

void pt_allreduce_sum(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_comm_wait(c, c->iallreduce(c, buf, count, dt));
}

void pt_reduce_scatter_sum(pt_comm *c, const void *send, void *recv, size_t recv_count, pt_dtype dt) {
    pt_comm_wait(c, c->ireduce_scatter(c, send, recv, recv_count, dt));
}

void pt_allgather(pt_comm *c, const void *send, void *recv, size_t send_count, pt_dtype dt) {
    pt_comm_wait(c, c->iallgather(c, send, recv, send_count, dt));
}

void pt_bcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    pt_comm_wait(c, c->ibcast(c, buf, count, dt, root));
}

void pt_barrier(pt_comm *c) { pt_comm_wait(c, c->ibarrier(c)); }

void pt_comm_stats_add(pt_comm_stats *to, const pt_comm_stats *from) {
    for (int i = 0; i < PT_COMM_OP_COUNT; i++) {
        to->calls[i] += from->calls[i];
        to->bytes[i] += from->bytes[i];
        to->wait_op[i] += from->wait_op[i];
    }
    to->wait_seconds += from->wait_seconds;
}
