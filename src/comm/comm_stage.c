/* comm_stage.c: MPI over device memory through host copies (include/pt/comm.h, PT_COMM_STAGED).
 * Backend-neutral: it builds on the group's own table and replaces the entries that take buffers
 * (and test, split, dup, free). An operation whose buffers are all host memory goes to the group's
 * own entry unchanged; one with a device buffer (pt_device_link.owns):
 *   1. takes a staging buffer of the group's (page-locked host memory), the smallest free one
 *      large enough, or grows one, or makes one: buffers are made in the first steps, while the
 *      operations' sizes and how many are in flight at once are first seen, and reused after;
 *   2. copies its input there (link->to_host waits for the compute stream's work before it);
 *   3. runs the group's own operation on the staging buffer, in place where that is equivalent
 *      (a reduce-scatter's or all-gather's separate input is copied to where the in-place form
 *      reads it), so the request is the group's own and is counted once, as the operation it is;
 *   4. when a test finds it done, copies the result to the device (link->to_device, ordered
 *      before the compute stream's later work) and frees the staging buffer.
 * The group's own operations never see device memory, so nothing of the network path reads or
 * writes it: the guarded CPU backend's link (PT_BACKEND_GUARD_LINK=1) checks that on CPUs.
 * Hierarchical collectives (comm_hier.c) are not set up over a staged group: they rearrange
 * blocks of the buffer in place on the host. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"
#include "pt/backend.h"

/* A staging buffer and, while an operation uses it, where its result goes. */
typedef struct pt_stage_buf {
    char *host;
    size_t cap;
    int busy;
    void *dev;          /* the result's device address (NULL: nothing goes back) */
    size_t back_off;    /* its offset in the staging buffer and its bytes */
    size_t back_bytes;
    struct pt_stage_buf *also; /* an all-to-all's second buffer (its receive side) */
} pt_stage_buf;

typedef struct {
    const pt_device_link *link;
    pt_stage_buf **bufs; /* each made once, so that a request's pointer to it stays valid */
    int n, cap;
    pt_comm_entries own; /* the group's own entries */
} pt_stage;

static pt_stage *pt_stage_of(const pt_comm *c) { return (pt_stage *)c->dev; }

static int pt_dev(const pt_stage *s, const void *p) { return p && s->link->owns(s->link->ctx, p); }

/* A free staging buffer of at least `bytes`: the smallest that fits, else the largest free one
 * grown, else a new one. Buffers are made (and grown) only while operations are larger, or more
 * of them in flight, than ever before: in the first steps. */
static pt_stage_buf *pt_stage_take(pt_stage *s, size_t bytes) {
    pt_stage_buf *fit = NULL, *big = NULL;
    for (int i = 0; i < s->n; i++) {
        pt_stage_buf *b = s->bufs[i];
        if (b->busy) continue;
        if (b->cap >= bytes && (!fit || b->cap < fit->cap)) fit = b;
        if (!big || b->cap > big->cap) big = b;
    }
    if (!fit) {
        if (big) {
            s->link->host_free(s->link->ctx, big->host);
            fit = big;
        } else {
            if (s->n == s->cap) {
                s->cap = s->cap ? 2 * s->cap : 16;
                s->bufs = pt_realloc(s->bufs, (size_t)s->cap * sizeof *s->bufs);
            }
            fit = s->bufs[s->n++] = pt_calloc(1, sizeof *fit);
        }
        fit->cap = bytes < 4096 ? 4096 : bytes;
        fit->host = s->link->host_alloc(s->link->ctx, fit->cap);
    }
    fit->busy = 1;
    fit->dev = NULL;
    fit->also = NULL;
    return fit;
}

/* bytes from src (device or host memory) to the host at dst */
static void pt_stage_in(pt_stage *s, void *dst, const void *src, size_t bytes) {
    if (!bytes) return;
    if (pt_dev(s, src))
        s->link->to_host(s->link->ctx, dst, src, bytes);
    else
        memcpy(dst, src, bytes);
}

/* What goes back when the operation is done: `bytes` at offset `off` of b to dst. */
static void pt_stage_back(pt_stage_buf *b, void *dst, size_t off, size_t bytes) {
    b->dev = dst;
    b->back_off = off;
    b->back_bytes = bytes;
}

static pt_comm_req *pt_stage_tag(pt_comm_req *r, pt_stage_buf *b) {
    r->stage = b;
    return r;
}

static pt_comm_req *st_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, buf)) return s->own.iallreduce(c, buf, count, dt);
    size_t n = count * pt_dtype_size(dt);
    pt_stage_buf *b = pt_stage_take(s, n);
    pt_stage_in(s, b->host, buf, n);
    pt_stage_back(b, buf, 0, n);
    return pt_stage_tag(s->own.iallreduce(c, b->host, count, dt), b);
}

/* in place: the input is size·recv_count at recv (or send, copied there), the result its first
 * recv_count */
static pt_comm_req *st_ireduce_scatter(pt_comm *c, const void *send, void *recv, size_t recv_count,
                                       pt_dtype dt) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, send) && !pt_dev(s, recv))
        return s->own.ireduce_scatter(c, send, recv, recv_count, dt);
    size_t blk = recv_count * pt_dtype_size(dt), n = blk * (size_t)c->size;
    pt_stage_buf *b = pt_stage_take(s, n);
    pt_stage_in(s, b->host, send ? send : recv, n);
    pt_stage_back(b, recv, 0, blk);
    return pt_stage_tag(s->own.ireduce_scatter(c, NULL, b->host, recv_count, dt), b);
}

/* in place: this rank's part at recv + rank·send_count (or send, copied there) */
static pt_comm_req *st_iallgather(pt_comm *c, const void *send, void *recv, size_t send_count,
                                  pt_dtype dt) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, send) && !pt_dev(s, recv))
        return s->own.iallgather(c, send, recv, send_count, dt);
    size_t blk = send_count * pt_dtype_size(dt), n = blk * (size_t)c->size;
    pt_stage_buf *b = pt_stage_take(s, n);
    char *mine = b->host + (size_t)c->rank * blk;
    pt_stage_in(s, mine, send ? send : (const char *)recv + (size_t)c->rank * blk, blk);
    pt_stage_back(b, recv, 0, n);
    return pt_stage_tag(s->own.iallgather(c, NULL, b->host, send_count, dt), b);
}

static pt_comm_req *st_ialltoallv(pt_comm *c, const void *send, const int64_t *send_counts,
                                  void *recv, const int64_t *recv_counts, pt_dtype dt) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, send) && !pt_dev(s, recv))
        return s->own.ialltoallv(c, send, send_counts, recv, recv_counts, dt);
    size_t es = pt_dtype_size(dt), ns = 0, nr = 0;
    for (int i = 0; i < c->size; i++) {
        ns += (size_t)send_counts[i] * es;
        nr += (size_t)recv_counts[i] * es;
    }
    pt_stage_buf *a = pt_stage_take(s, ns), *b = pt_stage_take(s, nr);
    pt_stage_in(s, a->host, send, ns);
    pt_stage_back(b, recv, 0, nr);
    a->also = b;
    return pt_stage_tag(s->own.ialltoallv(c, a->host, send_counts, b->host, recv_counts, dt), a);
}

static pt_comm_req *st_isend(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer,
                             int tag) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, buf)) return s->own.isend(c, buf, count, dt, peer, tag);
    size_t n = count * pt_dtype_size(dt);
    pt_stage_buf *b = pt_stage_take(s, n);
    pt_stage_in(s, b->host, buf, n);
    return pt_stage_tag(s->own.isend(c, b->host, count, dt, peer, tag), b);
}

static pt_comm_req *st_irecv(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, buf)) return s->own.irecv(c, buf, count, dt, peer, tag);
    size_t n = count * pt_dtype_size(dt);
    pt_stage_buf *b = pt_stage_take(s, n);
    pt_stage_back(b, buf, 0, n);
    return pt_stage_tag(s->own.irecv(c, b->host, count, dt, peer, tag), b);
}

static pt_comm_req *st_ibcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    pt_stage *s = pt_stage_of(c);
    if (!pt_dev(s, buf)) return s->own.ibcast(c, buf, count, dt, root);
    size_t n = count * pt_dtype_size(dt);
    pt_stage_buf *b = pt_stage_take(s, n);
    if (c->rank == root)
        pt_stage_in(s, b->host, buf, n);
    else
        pt_stage_back(b, buf, 0, n);
    return pt_stage_tag(s->own.ibcast(c, b->host, count, dt, root), b);
}

/* The result back to the device, and the staging buffers free. */
static void pt_stage_finish(pt_stage *s, pt_stage_buf *b) {
    for (; b; b = b->also) {
        if (b->dev && b->back_bytes)
            s->link->to_device(s->link->ctx, b->dev, b->host + b->back_off, b->back_bytes);
        b->busy = 0;
    }
}

static int st_test(pt_comm *c, pt_comm_req *r) {
    pt_stage *s = pt_stage_of(c);
    pt_stage_buf *b = r->stage; /* read first: a request found done goes back to the pool */
    if (!s->own.test(c, r)) return 0;
    if (b) pt_stage_finish(s, b);
    return 1;
}

static pt_comm *st_split(pt_comm *c, int color, int key, const char *name) {
    pt_stage *s = pt_stage_of(c);
    pt_comm *n = s->own.split(c, color, key, name);
    PT_ASSERT(pt_comm_stage_setup(n, s->link) == PT_OK);
    return n;
}

static pt_comm *st_dup(pt_comm *c, const char *name) {
    pt_stage *s = pt_stage_of(c);
    pt_comm *n = s->own.dup(c, name);
    PT_ASSERT(pt_comm_stage_setup(n, s->link) == PT_OK);
    return n;
}

static void st_free(pt_comm *c) {
    pt_stage *s = pt_stage_of(c);
    for (int i = 0; i < s->n; i++) {
        if (s->bufs[i]->host) s->link->host_free(s->link->ctx, s->bufs[i]->host);
        free(s->bufs[i]);
    }
    free(s->bufs);
    void (*own_free)(pt_comm *) = s->own.free;
    free(s);
    c->dev = NULL;
    own_free(c);
}

pt_status pt_comm_stage_setup(pt_comm *c, const pt_device_link *link) {
    PT_ASSERT(!c->dev && !c->hier && link);
    pt_stage *s = pt_calloc(1, sizeof *s);
    s->link = link;
    s->own = pt_comm_entries_of(c);
    c->dev = s;
    c->iallreduce = st_iallreduce;
    c->ireduce_scatter = st_ireduce_scatter;
    c->iallgather = st_iallgather;
    c->ialltoallv = st_ialltoallv;
    c->isend = st_isend;
    c->irecv = st_irecv;
    c->ibcast = st_ibcast;
    c->test = st_test;
    c->split = st_split;
    c->dup = st_dup;
    c->free = st_free;
    return PT_OK;
}
