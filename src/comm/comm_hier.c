/* comm_hier.c: hierarchical collectives over a group whose members sit on several hosts (see
 * include/pt/comm.h, pt_comm_hier_setup). Backend-neutral: it builds on the group's own table
 * (split, dup, the collectives, test) and replaces six of its entries (iallreduce,
 * ireduce_scatter, iallgather, test, progress, free). With L members on each of H hosts, N = H·L:
 *
 * all-reduce, in three stages:
 *   1. reduce-scatter within the host (shared memory): local rank l holds the host's sum of
 *      slice l of the buffer (the first L·n elements cut in L slices of n; the count mod L
 *      elements left over are all-reduced within the host whole, beside it);
 *   2. all-reduce across hosts of that slice, among the group's members with the same local
 *      rank, one on each host (and of the left-over elements, by every one of them): all of the
 *      host's ranks cross at once, each with 1/L of the data;
 *   3. all-gather within the host: every member has every slice.
 * reduce-scatter (in place; N blocks of n, block g for group rank g): the blocks reordered in
 *   place so that local rank l's H blocks (those of the members with local rank l, one per
 *   host) lie together; reduce-scatter within the host (local rank l gets the host's sums of its
 *   H blocks), then across hosts among local rank l's members (each gets its own block's sum, at
 *   the start of the buffer, as the flat one leaves it; on 2 hosts by an exchange, each rank
 *   sending the other its block of the pair and adding what it receives, which crosses n each
 *   way where MPI's reduce to one rank and scatter would cross 3n);
 * all-gather: the reverse: this rank's block to its place among its local rank's H, all-gather
 *   across hosts of those, all-gather within the host of the H·n runs, the blocks back to their
 *   order.
 *
 * The cross-host groups are ordered so that local rank l's starts on host l mod H: MPI's
 * in-place collectives over few ranks reduce to (and broadcast from) their first rank, so on 2
 * hosts half of the local ranks' traffic flows 0 → 1 first and the other half 1 → 0, and both
 * directions of the link carry data at once.
 *
 * Nonblocking collectives on a communicator must be posted in the same order on every member, and
 * a stage is posted when the one before completes, which happens at different times on different
 * members: every stage a request will post on a sub-group (a lane) takes a ticket there when the
 * request is made (the callers make them in the same order everywhere), and is posted when its
 * turn comes; tests and progress move every pending request on, oldest first, so a younger one
 * never waits on an older one that nobody moves.
 *
 * A hierarchical request is one request of the group's pool (counted on the group as the
 * collective it is, with the bus-bandwidth bytes of the flat one), whose stages are requests of
 * the sub-groups (counted there: "<group>/host" and "<group>/gather" within the host,
 * "<group>/hosts" what crosses). A test (or the group's progress, which the model's polls call)
 * posts the next stage when the current one is done, so the collective overlaps with compute as
 * a flat one does, and pt_comm_wait's timeout names the group and the collective. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"

/* auto: hierarchical from this size of buffer on; below it the extra stages' latency outweighs
 * what a small message gains on the links */
#define PT_HIER_MIN_BYTES (64u * 1024u)

/* A sub-group and the order its collectives are posted in: every stage a request will post on
 * it takes a ticket when the request is made, and is posted when the lane's turn comes. */
typedef struct {
    pt_comm *c;
    uint64_t next, turn;
} pt_lane;

typedef struct pt_hier_req pt_hier_req;

typedef struct {
    /* this host's members of the group (the first stages: reduce-scatters, the all-reduce of the
     * left-over elements); a dup of it (the all-gathers); the group's members with the same
     * local rank, one on each host (what crosses) */
    pt_lane host, gather, hosts;
    int L, H, l, g;   /* members per host, hosts, this rank's place on its host, in the group */
    int xr;           /* this rank's place in its cross-host group */
    size_t min_bytes; /* smallest buffer reduced hierarchically */
    /* block order for the reduce-scatter and the all-gather: the group's rank g's block moves to
     * place to[g] (its local rank's H blocks together, in the order of the cross-host group) and
     * back from there (from[place] = g); seen: scratch of the permutation */
    int *to, *from;
    unsigned char *seen;
    /* requests posted and not yet seen complete by a test, oldest first */
    pt_hier_req *pending, *pending_last;
    /* the backend's own entries */
    pt_comm_req *(*flat_iallreduce)(pt_comm *c, void *buf, size_t count, pt_dtype dt);
    pt_comm_req *(*flat_ireduce_scatter)(pt_comm *c, const void *send, void *recv,
                                         size_t recv_count, pt_dtype dt);
    pt_comm_req *(*flat_iallgather)(pt_comm *c, const void *send, void *recv, size_t send_count,
                                    pt_dtype dt);
    int (*flat_test)(pt_comm *c, pt_comm_req *r);
    void (*flat_progress)(pt_comm *c);
    void (*flat_free)(pt_comm *c);
} pt_hier;

struct pt_hier_req {
    pt_comm_req head; /* head.layered = 1; head.op: which collective */
    pt_hier_req *next_pending;
    int nst, stage, posted; /* stages, the current one, whether it is posted */
    pt_lane *lane[3];
    uint64_t ticket[3];
    pt_comm_req *sub[2]; /* the stage's pending requests */
    char *buf;
    size_t n, tail; /* all-reduce: elements of a slice, left over; else: elements of a block */
    pt_dtype dt;
};

static pt_hier *pt_hier_of(const pt_comm *c) { return (pt_hier *)c->hier; }

/* Swaps blocks a and b of n bytes each. */
static void pt_swap_blocks(char *a, char *b, size_t n) {
    unsigned char t[4096];
    for (size_t o = 0; o < n; o += sizeof t) {
        size_t k = n - o < sizeof t ? n - o : sizeof t;
        memcpy(t, a + o, k);
        memcpy(a + o, b + o, k);
        memcpy(b + o, t, k);
    }
}

/* Moves the block at every place i (of N, `size` bytes each) to place map[i], in place: along
 * each cycle, the first place swaps with each next one. */
static void pt_permute(pt_hier *h, char *buf, size_t size, const int *map) {
    int N = h->L * h->H;
    memset(h->seen, 0, (size_t)N);
    for (int i = 0; i < N; i++) {
        if (h->seen[i]) continue;
        h->seen[i] = 1;
        for (int j = map[i]; j != i; j = map[j]) {
            pt_swap_blocks(buf + (size_t)i * size, buf + (size_t)j * size, size);
            h->seen[j] = 1;
        }
    }
}

/* dst[i] += src[i], i < n (bf16: the sum in fp32, rounded to nearest even, as the flat one's). */
static void pt_hier_add(void *dst, const void *src, size_t n, pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32:
        for (size_t i = 0; i < n; i++) ((float *)dst)[i] += ((const float *)src)[i];
        break;
    case PT_DTYPE_F64:
        for (size_t i = 0; i < n; i++) ((double *)dst)[i] += ((const double *)src)[i];
        break;
    case PT_DTYPE_I32:
        for (size_t i = 0; i < n; i++) ((int32_t *)dst)[i] += ((const int32_t *)src)[i];
        break;
    case PT_DTYPE_I64:
        for (size_t i = 0; i < n; i++) ((int64_t *)dst)[i] += ((const int64_t *)src)[i];
        break;
    case PT_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            pt_bf16 *d = (pt_bf16 *)dst + i;
            *d = pt_bf16_round(pt_bf16_to_float(*d) + pt_bf16_to_float(((const pt_bf16 *)src)[i]));
        }
        break;
    }
}

/* Posts r's current stage. */
static void pt_hier_post(pt_hier *h, pt_hier_req *r) {
    size_t es = pt_dtype_size(r->dt), n = r->n, HB = (size_t)h->H * n * es;
    pt_comm *c = r->lane[r->stage]->c;
    pt_comm_req **sub = r->sub;
    sub[0] = sub[1] = NULL;
    if (r->head.op == PT_COMM_ALLREDUCE) {
        char *tail = r->buf + (size_t)h->L * n * es, *mine = r->buf + (size_t)h->l * n * es;
        if (r->stage == 0) { /* within the host: slice l's sum to local rank l */
            if (n) sub[0] = c->ireduce_scatter(c, NULL, r->buf, n, r->dt);
            if (r->tail) sub[1] = c->iallreduce(c, tail, r->tail, r->dt);
        } else if (r->stage == 1) { /* across: the slice, from the start (the in-place
                                     * reduce-scatter's place) to its own (the all-gather's) */
            if (n && h->l) memmove(mine, r->buf, n * es);
            if (n) sub[0] = c->iallreduce(c, mine, n, r->dt);
            if (r->tail) sub[1] = c->iallreduce(c, tail, r->tail, r->dt);
        } else if (n) { /* within the host: every slice */
            sub[0] = c->iallgather(c, NULL, r->buf, n, r->dt);
        }
    } else if (r->head.op == PT_COMM_REDUCE_SCATTER) {
        if (r->stage == 0) { /* local rank l's H blocks together, summed within the host */
            pt_permute(h, r->buf, n * es, h->to);
            sub[0] = c->ireduce_scatter(c, NULL, r->buf, (size_t)h->H * n, r->dt);
        } else if (h->H == 2) { /* across two hosts: each sends the other its block of the pair
                                 * and receives the other's partial sum of its own, into the
                                 * space after the pair (the other local ranks' part, free now
                                 * that the host's reduce-scatter is done: L ≥ 2) */
            enum { TAG = 0x4852 };
            int peer = 1 - h->xr;
            sub[0] = c->irecv(c, r->buf + 2 * n * es, n, r->dt, peer, TAG);
            sub[1] = c->isend(c, r->buf + (size_t)peer * n * es, n, r->dt, peer, TAG);
        } else { /* across: this rank's block of them (at the start, as the caller wants it) */
            sub[0] = c->ireduce_scatter(c, NULL, r->buf, n, r->dt);
        }
    } else {
        if (r->stage == 0) { /* across: the blocks of local rank l's peers, at their places */
            char *at = r->buf + (size_t)h->to[h->g] * n * es;
            if (h->to[h->g] != h->g) memmove(at, r->buf + (size_t)h->g * n * es, n * es);
            sub[0] = c->iallgather(c, NULL, r->buf + (size_t)h->l * HB, n, r->dt);
        } else { /* within the host: every local rank's H blocks */
            sub[0] = c->iallgather(c, NULL, r->buf, (size_t)h->H * n, r->dt);
        }
    }
}

/* Moves r on as far as its stages have completed and their lanes' turns allow; 1 once done. */
static int pt_hier_advance(pt_hier *h, pt_hier_req *r) {
    while (r->stage < r->nst) {
        if (r->posted) {
            pt_comm *c = r->lane[r->stage]->c;
            for (int k = 0; k < 2; k++)
                if (r->sub[k] && c->test(c, r->sub[k])) r->sub[k] = NULL;
            if (r->sub[0] || r->sub[1]) return 0;
            r->posted = 0;
            size_t bs = r->n * pt_dtype_size(r->dt);
            if (++r->stage == r->nst && r->head.op == PT_COMM_ALLGATHER) /* the blocks home */
                pt_permute(h, r->buf, bs, h->from);
            if (r->stage == r->nst && r->head.op == PT_COMM_REDUCE_SCATTER && h->H == 2) {
                /* the other host's partial sum added; the block to the start */
                char *mine = r->buf + (size_t)h->xr * bs;
                pt_hier_add(mine, r->buf + 2 * bs, r->n, r->dt);
                if (h->xr) memmove(r->buf, mine, bs);
            }
            continue;
        }
        pt_lane *ln = r->lane[r->stage];
        if (ln->turn != r->ticket[r->stage]) return 0; /* an older request's stage first */
        pt_hier_post(h, r);
        ln->turn++;
        r->posted = 1;
    }
    return 1;
}

/* A hierarchical request for op over c on buf, stages on the lanes given, counted on c as the
 * flat collective (`bytes`); posts what it can. send: an all-gather's separate input, copied to
 * this rank's place in buf (under the request's guard hold). */
static pt_comm_req *pt_hier_start(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *send,
                                  void *buf, size_t n, size_t tail, pt_dtype dt, int nst,
                                  pt_lane *l0, pt_lane *l1, pt_lane *l2) {
    pt_hier *h = pt_hier_of(c);
    pt_hier_req *r = (pt_hier_req *)pt_comm_req_take(c, op, bytes, buf, send);
    size_t es = pt_dtype_size(dt);
    if (send) memcpy((char *)buf + (size_t)h->g * n * es, send, n * es);
    r->head.layered = 1;
    r->buf = buf;
    r->dt = dt;
    r->n = n;
    r->tail = tail;
    r->nst = nst;
    r->stage = r->posted = 0;
    pt_lane *lanes[3] = {l0, l1, l2};
    for (int s = 0; s < nst; s++) {
        r->lane[s] = lanes[s];
        r->ticket[s] = lanes[s]->next++;
    }
    r->next_pending = NULL;
    if (h->pending_last)
        h->pending_last->next_pending = r;
    else
        h->pending = r;
    h->pending_last = r;
    pt_hier_advance(h, r);
    return &r->head;
}

static pt_comm_req *pt_hier_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_hier *h = pt_hier_of(c);
    if (count * pt_dtype_size(dt) < h->min_bytes || count < (size_t)h->L)
        return h->flat_iallreduce(c, buf, count, dt);
    /* counted as the flat all-reduce is (bus bandwidth: 2(N−1)/N of the buffer) */
    uint64_t bytes = 2 * (uint64_t)(c->size - 1) * count * pt_dtype_size(dt) / c->size;
    size_t n = count / (size_t)h->L;
    return pt_hier_start(c, PT_COMM_ALLREDUCE, bytes, NULL, buf, n, count - n * (size_t)h->L, dt,
                         3, &h->host, &h->hosts, &h->gather);
}

/* In place only (send = NULL: the caller's buffer is the input); otherwise flat. */
static pt_comm_req *pt_hier_ireduce_scatter(pt_comm *c, const void *send, void *recv,
                                            size_t recv_count, pt_dtype dt) {
    pt_hier *h = pt_hier_of(c);
    if (send || recv_count * c->size * pt_dtype_size(dt) < h->min_bytes || !recv_count)
        return h->flat_ireduce_scatter(c, send, recv, recv_count, dt);
    uint64_t bytes = (uint64_t)(c->size - 1) * recv_count * pt_dtype_size(dt);
    return pt_hier_start(c, PT_COMM_REDUCE_SCATTER, bytes, NULL, recv, recv_count, 0, dt, 2,
                         &h->host, &h->hosts, NULL);
}

static pt_comm_req *pt_hier_iallgather(pt_comm *c, const void *send, void *recv,
                                       size_t send_count, pt_dtype dt) {
    pt_hier *h = pt_hier_of(c);
    size_t es = pt_dtype_size(dt);
    if (send_count * c->size * es < h->min_bytes || !send_count)
        return h->flat_iallgather(c, send, recv, send_count, dt);
    uint64_t bytes = (uint64_t)(c->size - 1) * send_count * es;
    return pt_hier_start(c, PT_COMM_ALLGATHER, bytes, send, recv, send_count, 0, dt, 2, &h->hosts,
                         &h->gather, NULL);
}

static int pt_hier_test(pt_comm *c, pt_comm_req *req) {
    pt_hier *h = pt_hier_of(c);
    if (!req->layered) return h->flat_test(c, req);
    pt_hier_req *r = (pt_hier_req *)req;
    c->progress(c);
    if (r->stage < r->nst) return 0;
    pt_hier_req *prev = NULL;
    for (pt_hier_req *p = h->pending; p != r; p = p->next_pending) prev = p;
    if (prev)
        prev->next_pending = r->next_pending;
    else
        h->pending = r->next_pending;
    if (h->pending_last == r) h->pending_last = prev;
    pt_comm_req_done(c, req);
    return 1;
}

/* Moves every pending request on, oldest first. */
static void pt_hier_progress(pt_comm *c) {
    pt_hier *h = pt_hier_of(c);
    h->flat_progress(c);
    for (pt_hier_req *r = h->pending; r; r = r->next_pending) pt_hier_advance(h, r);
}

static void pt_hier_free(pt_comm *c) {
    pt_hier *h = pt_hier_of(c);
    h->host.c->free(h->host.c);
    h->gather.c->free(h->gather.c);
    h->hosts.c->free(h->hosts.c);
    free(h->to);
    free(h->from);
    free(h->seen);
    c->hier = NULL;
    void (*flat_free)(pt_comm *) = h->flat_free;
    free(h);
    flat_free(c);
}

/* PT_COMM_HIER: auto (the default), on, off. */
static pt_status pt_hier_mode(int *mode) {
    const char *v = getenv("PT_COMM_HIER");
    *mode = !v || !*v || !strcmp(v, "auto") ? 1 : !strcmp(v, "on") ? 2 : !strcmp(v, "off") ? 0 : -1;
    if (*mode < 0)
        return pt_errorf(PT_ERR_CONFIG, "PT_COMM_HIER = \"%s\": the choices are auto (hierarchical "
                         "collectives of 64 KiB and more over groups spanning hosts), on (every "
                         "size) and off (flat)", v);
    return PT_OK;
}

pt_status pt_comm_hier_setup(pt_comm *c) {
    int mode;
    PT_TRY(pt_hier_mode(&mode));
    /* a group over device memory stays flat: the stages rearrange the buffer's blocks in host
     * memory (and NCCL has its own topology) */
    if (c->hier || c->dev || c->size < 2) return PT_OK;
    /* every member's host, by group rank (the same on every member: the decision is common) */
    int me, local, N = c->size;
    pt_comm_host(&me, &local);
    int32_t *host = pt_calloc((size_t)N, sizeof *host);
    int *hidx = pt_calloc((size_t)N, sizeof *hidx), *lidx = pt_calloc((size_t)N, sizeof *lidx);
    host[c->rank] = me;
    pt_allgather(c, NULL, host, 1, PT_DTYPE_I32);
    /* each member's host's index among the group's hosts (ordered by host id) and its place on
     * the host (by group rank); the hosts, the members per host */
    int H = 0, L = 0, even = 1;
    for (int i = 0; i < N; i++) {
        int count = 0;
        for (int j = 0; j < N; j++) {
            if (host[j] == host[i]) count++;
            if (j < i && host[j] == host[i]) lidx[i]++;
        }
        if (lidx[i] == 0) H++;
        if (i == 0) L = count;
        if (count != L) even = 0;
    }
    for (int i = 0; i < N; i++) /* the hosts with lower ids, each counted at its first member */
        for (int j = 0; j < N; j++)
            if (lidx[j] == 0 && host[j] < host[i]) hidx[i]++;
    free(host);
    /* hierarchical where it can help: more than one host, several members on each, as many on
     * each (a slice per local rank) */
    if (mode == 0 || H < 2 || L < 2 || !even) {
        free(hidx);
        free(lidx);
        return PT_OK;
    }
    pt_hier *h = pt_calloc(1, sizeof *h);
    int hi = hidx[c->rank], l = lidx[c->rank];
    char name[32];
    snprintf(name, sizeof name, "%.8s/host", c->name);
    h->host.c = c->split(c, hi, c->rank, name);
    snprintf(name, sizeof name, "%.8s/gather", c->name);
    h->gather.c = h->host.c->dup(h->host.c, name);
    snprintf(name, sizeof name, "%.8s/hosts", c->name);
    /* local rank l's group starts on host l mod H: the slices' trees point different ways */
    h->hosts.c = c->split(c, l, (hi - l % H + H) % H, name);
    PT_ASSERT(h->host.c->size == L && h->hosts.c->size == H);
    h->L = L, h->H = H, h->l = l, h->g = c->rank, h->xr = h->hosts.c->rank;
    /* member i's block: among its local rank's (lidx), at its rank in that local rank's
     * cross-host group */
    h->to = pt_calloc((size_t)N, sizeof *h->to);
    h->from = pt_calloc((size_t)N, sizeof *h->from);
    h->seen = pt_calloc((size_t)N, 1);
    for (int i = 0; i < N; i++) {
        h->to[i] = lidx[i] * H + (hidx[i] - lidx[i] % H + H) % H;
        h->from[h->to[i]] = i;
    }
    free(hidx);
    free(lidx);
    h->min_bytes = mode == 2 ? 0 : PT_HIER_MIN_BYTES;
    h->flat_iallreduce = c->iallreduce;
    h->flat_ireduce_scatter = c->ireduce_scatter;
    h->flat_iallgather = c->iallgather;
    h->flat_test = c->test;
    h->flat_progress = c->progress;
    h->flat_free = c->free;
    /* the pool's requests must hold a hierarchical one */
    if (c->req_size < sizeof(pt_hier_req)) {
        PT_ASSERTF(c->req_pending == 0, "group %s: hierarchical set-up with requests pending",
                   c->name);
        pt_comm_req_free_all(c);
        c->req_size = sizeof(pt_hier_req);
    }
    c->hier = h;
    c->iallreduce = pt_hier_iallreduce;
    c->ireduce_scatter = pt_hier_ireduce_scatter;
    c->iallgather = pt_hier_iallgather;
    c->test = pt_hier_test;
    c->progress = pt_hier_progress;
    c->free = pt_hier_free;
    return PT_OK;
}

int pt_comm_hierarchical(const pt_comm *c) { return c->hier != NULL; }

int pt_comm_hier_stats(const pt_comm *c, pt_comm_stats *host, pt_comm_stats *hosts) {
    memset(host, 0, sizeof *host);
    memset(hosts, 0, sizeof *hosts);
    if (!c->hier) return 0;
    *host = pt_hier_of(c)->host.c->stats;
    pt_comm_stats_add(host, &pt_hier_of(c)->gather.c->stats);
    *hosts = pt_hier_of(c)->hosts.c->stats;
    return 1;
}
