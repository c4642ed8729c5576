/* comm_hier.c: hierarchical all-reduce over a group whose members sit on several hosts (see
 * include/pt/comm.h, pt_comm_hier_setup). Backend-neutral: it builds on the group's own table
 * (split, iallreduce, ireduce_scatter, iallgather, test) and replaces four of its entries
 * (iallreduce, test, progress, free) with ones that run the collective in three stages:
 *
 *   1. reduce-scatter within the host (shared memory): local rank l holds the host's sum of
 *      slice l of the buffer (the first L·n elements cut in L slices of n; the count mod L
 *      elements left over are all-reduced within the host whole, beside it);
 *   2. all-reduce across hosts of that slice, among the group's members with the same local
 *      rank, one on each host (and of the left-over elements, by every one of them): all of the
 *      host's ranks cross at once, each with 1/L of the data;
 *   3. all-gather within the host: every member has every slice.
 *
 * The cross-host groups are ordered so that slice l's group starts on host l mod H: MPI's
 * in-place all-reduce over few ranks is a binomial reduce to its first rank and a broadcast back,
 * so on 2 hosts half the slices flow host 0 → 1 and back while the other half flow 1 → 0 and
 * back, and both directions of the link carry data at once (a flat all-reduce over ranks ordered
 * by host sends the whole buffer one way, then back).
 *
 * Nonblocking collectives on a communicator must be posted in the same order on every member, and
 * a stage is posted when the one before completes, which happens at different times on different
 * members: each kind of stage has a sub-group of its own (the reduce-scatters, the all-gathers,
 * the crossings never share one), and a request posts its stage 2 or 3 only after every older
 * request has (their order of creation, the callers' order, is the same everywhere); tests and
 * progress move every pending request on, oldest first, so a younger one never waits on an older
 * one that nobody moves.
 *
 * A hierarchical request is one request of the group's pool (counted on the group as the
 * all-reduce it is, with the bus-bandwidth bytes of the flat collective), whose stages are
 * requests of the two sub-groups (counted there: "<group>/host" the stages within the host,
 * "<group>/hosts" what crosses). A test (or the group's progress, which the model's polls call)
 * posts the next stage when the current one is done, so the all-reduce overlaps with compute as
 * a flat one does, and pt_comm_wait's timeout names the group and the all-reduce. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"

/* auto: hierarchical from this size of buffer on; below it the two extra stages' latency
 * outweighs what a small message gains on the links */
#define PT_HIER_MIN_BYTES (64u * 1024u)

typedef struct pt_hier_req pt_hier_req;

typedef struct {
    /* this host's members of the group (reduce-scatters; a dup of it, gather, the all-gathers);
     * the group's members with the same local rank, one on each host */
    pt_comm *host, *gather, *hosts;
    int L, H, l;      /* members per host, hosts, this rank's place on its host */
    size_t min_bytes; /* smallest buffer reduced hierarchically */
    /* requests posted and not yet seen complete by a test, oldest first */
    pt_hier_req *pending, *pending_last;
    uint64_t made, turn[4]; /* requests made; turn[s]: the one whose stage s is to be posted next */
    /* the backend's own entries */
    pt_comm_req *(*flat_iallreduce)(pt_comm *c, void *buf, size_t count, pt_dtype dt);
    int (*flat_test)(pt_comm *c, pt_comm_req *r);
    void (*flat_progress)(pt_comm *c);
    void (*flat_free)(pt_comm *c);
} pt_hier;

struct pt_hier_req {
    pt_comm_req head; /* head.layered = 1 */
    pt_hier_req *next_pending;
    pt_comm_req *sub[2]; /* the stage's pending requests: the slices', the left-over elements' */
    pt_comm *sub_comm;   /* the sub-group they belong to */
    int stage;           /* 1, 2, 3 as above; 4 done */
    uint64_t seq;        /* its place among the group's hierarchical requests */
    char *buf;
    size_t n, tail; /* elements of a slice, elements left over (after the L slices) */
    pt_dtype dt;
};

static pt_hier *pt_hier_of(const pt_comm *c) { return (pt_hier *)c->hier; }

/* Posts stage s of r (s = 4: nothing, r is done). */
static void pt_hier_post(pt_hier *h, pt_hier_req *r, int s) {
    size_t es = pt_dtype_size(r->dt);
    char *tail = r->buf + (size_t)h->L * r->n * es, *mine = r->buf + (size_t)h->l * r->n * es;
    r->stage = s;
    r->sub[0] = r->sub[1] = NULL;
    if (s == 1) {
        r->sub_comm = h->host;
        if (r->n) r->sub[0] = h->host->ireduce_scatter(h->host, NULL, r->buf, r->n, r->dt);
        if (r->tail) r->sub[1] = h->host->iallreduce(h->host, tail, r->tail, r->dt);
    } else if (s == 2) {
        /* the in-place reduce-scatter left this rank's slice at the start: to its own place,
         * where the all-gather expects it */
        if (r->n && h->l) memmove(mine, r->buf, r->n * es);
        r->sub_comm = h->hosts;
        if (r->n) r->sub[0] = h->hosts->iallreduce(h->hosts, mine, r->n, r->dt);
        if (r->tail) r->sub[1] = h->hosts->iallreduce(h->hosts, tail, r->tail, r->dt);
    } else if (s == 3) {
        r->sub_comm = h->gather;
        if (r->n) r->sub[0] = h->gather->iallgather(h->gather, NULL, r->buf, r->n, r->dt);
    }
    if (s <= 3) h->turn[s]++;
}

/* Moves r on as far as its stages have completed; 1 once the last one has. */
static int pt_hier_advance(pt_hier *h, pt_hier_req *r) {
    while (r->stage < 4) {
        for (int k = 0; k < 2; k++)
            if (r->sub[k] && r->sub_comm->test(r->sub_comm, r->sub[k])) r->sub[k] = NULL;
        if (r->sub[0] || r->sub[1]) return 0;
        if (r->stage < 3 && h->turn[r->stage + 1] != r->seq) return 0; /* an older one first */
        pt_hier_post(h, r, r->stage + 1);
    }
    return 1;
}

static pt_comm_req *pt_hier_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_hier *h = pt_hier_of(c);
    if (count * pt_dtype_size(dt) < h->min_bytes || count < (size_t)h->L)
        return h->flat_iallreduce(c, buf, count, dt);
    /* counted on the group as the flat all-reduce is (bus bandwidth: 2(N−1)/N of the buffer) */
    uint64_t bytes = 2 * (uint64_t)(c->size - 1) * count * pt_dtype_size(dt) / c->size;
    pt_hier_req *r = (pt_hier_req *)pt_comm_req_take(c, PT_COMM_ALLREDUCE, bytes, buf, NULL);
    r->head.layered = 1;
    r->buf = buf;
    r->dt = dt;
    r->n = count / (size_t)h->L;
    r->tail = count - r->n * (size_t)h->L;
    r->seq = h->made++;
    r->next_pending = NULL;
    if (h->pending_last)
        h->pending_last->next_pending = r;
    else
        h->pending = r;
    h->pending_last = r;
    pt_hier_post(h, r, 1);
    return &r->head;
}

static int pt_hier_test(pt_comm *c, pt_comm_req *req) {
    pt_hier *h = pt_hier_of(c);
    if (!req->layered) return h->flat_test(c, req);
    pt_hier_req *r = (pt_hier_req *)req;
    c->progress(c);
    if (r->stage < 4) return 0;
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
    h->host->free(h->host);
    h->gather->free(h->gather);
    h->hosts->free(h->hosts);
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
                         "all-reduces of 64 KiB and more over groups spanning hosts), on (every "
                         "size) and off (flat)", v);
    return PT_OK;
}

pt_status pt_comm_hier_setup(pt_comm *c) {
    int mode;
    PT_TRY(pt_hier_mode(&mode));
    if (c->hier || c->size < 2) return PT_OK;
    /* every member's host, by group rank (the same on every member: the decision is common) */
    int me, local;
    pt_comm_host(&me, &local);
    int32_t *host = pt_calloc((size_t)c->size, sizeof *host);
    host[c->rank] = me;
    pt_allgather(c, NULL, host, 1, PT_DTYPE_I32);
    /* this rank's host's index among the group's hosts (ordered by host id), its place on the
     * host (by group rank), the members per host */
    int H = 0, hi = 0, l = 0, L = 0, even = 1;
    for (int i = 0; i < c->size; i++) {
        int first = 1, count = 0;
        for (int j = 0; j < c->size; j++) {
            if (host[j] == host[i]) count++;
            if (j < i && host[j] == host[i]) first = 0;
        }
        if (first) {
            H++;
            if (host[i] < me) hi++;
        }
        if (i == 0) L = count;
        if (count != L) even = 0;
        if (i < c->rank && host[i] == me) l++;
    }
    free(host);
    /* hierarchical where it can help: more than one host, several members on each, as many on
     * each (a slice per local rank) */
    if (mode == 0 || H < 2 || L < 2 || !even) return PT_OK;
    pt_hier *h = pt_calloc(1, sizeof *h);
    char name[32];
    snprintf(name, sizeof name, "%.8s/host", c->name);
    h->host = c->split(c, hi, c->rank, name);
    snprintf(name, sizeof name, "%.8s/gather", c->name);
    h->gather = h->host->dup(h->host, name);
    snprintf(name, sizeof name, "%.8s/hosts", c->name);
    /* slice l's group starts on host l mod H: the trees of the slices point different ways */
    h->hosts = c->split(c, l, (hi - l % H + H) % H, name);
    PT_ASSERT(h->host->size == L && h->hosts->size == H);
    h->L = L, h->H = H, h->l = l;
    h->min_bytes = mode == 2 ? 0 : PT_HIER_MIN_BYTES;
    h->flat_iallreduce = c->iallreduce;
    h->flat_test = c->test;
    h->flat_progress = c->progress;
    h->flat_free = c->free;
    /* the pool's requests must hold a hierarchical one */
    if (c->req_size < sizeof(pt_hier_req)) {
        PT_ASSERTF(c->req_pending == 0, "group %s: hierarchical set-up with requests pending", c->name);
        pt_comm_req_free_all(c);
        c->req_size = sizeof(pt_hier_req);
    }
    c->hier = h;
    c->iallreduce = pt_hier_iallreduce;
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
    *host = pt_hier_of(c)->host->stats;
    pt_comm_stats_add(host, &pt_hier_of(c)->gather->stats);
    *hosts = pt_hier_of(c)->hosts->stats;
    return 1;
}
