/* flight.c: the flight recorder and the explanation of a hang (see include/pt/flight.h).
 * Backend-neutral: the states travel over the backend's diagnosis channel (comm_backend.h). */
#define _GNU_SOURCE
#include "pt/flight.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>


enum { PT_FLIGHT_TAG_STATE = 1, PT_FLIGHT_TAG_ASK = 2, PT_FLIGHT_TAG_DONE = 3 };
enum { PT_FLIGHT_ROSTER = PT_FLIGHT_LABEL + PT_FLIGHT_HOST }; /* bytes of one roster entry */

static pt_flight_state *pt_fs;      /* this process's state (heap, or the file's mapping) */
static int pt_fs_mapped;            /* 1: a shared mapping of the file pt_fs_dir/flight-rankN.bin */
static char pt_fs_dir[4096];
static char *pt_fs_roster;          /* world × PT_FLIGHT_ROSTER bytes, or NULL */
static const pt_flight_channel *pt_fs_ch; /* the backend's diagnosis channel, or NULL */

void pt_flight_set_channel(const pt_flight_channel *ch) { pt_fs_ch = ch; }

static double pt_wall(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int pt_is_p2p(int op) { return op == PT_COMM_SEND || op == PT_COMM_RECV; }

/* ------------------------------------------------------------------------------------------ */
/* recording */

void pt_flight_start(int world_rank, int world_size) {
    if (pt_fs) return;
    /* members of every group: a mesh's groups hold at most ~11 × the world between them */
    int cap = 16 * world_size + 256;
    size_t bytes = sizeof(pt_flight_state) + (size_t)cap * sizeof(int32_t);
    pt_fs = pt_calloc(1, bytes);
    memcpy(pt_fs->magic, PT_FLIGHT_MAGIC, 8);
    pt_fs->version = PT_FLIGHT_VERSION;
    pt_fs->bytes = (uint32_t)bytes;
    pt_fs->rank = world_rank;
    pt_fs->world = world_size;
    pt_fs->pid = (int32_t)getpid();
    pt_fs->members_cap = cap;
    pt_fs->wait_group = -1;
    gethostname(pt_fs->host, sizeof pt_fs->host - 1);
}

const pt_flight_state *pt_flight_self(void) { return pt_fs; }

static uint64_t pt_flight_key(const char *name, int size, const int *world_ranks) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = name; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)size) * 1099511628211ull;
    for (int i = 0; world_ranks && i < size; i++) h = (h ^ (uint64_t)world_ranks[i]) * 1099511628211ull;
    return h;
}

int pt_flight_group_add(const char *name, int rank, int size, const int *world_ranks) {
    pt_flight_state *s = pt_fs;
    if (!s) return -1;
    int live = 0;
    for (int i = 0; i < s->ngroups; i++) live += s->groups[i].live;
    if (!live) s->ngroups = s->members_used = 0; /* every earlier group freed: start over */
    if (s->ngroups == PT_FLIGHT_GROUPS) return -1;
    int g = s->ngroups++;
    pt_flight_group *G = &s->groups[g];
    memset(G, 0, sizeof *G);
    snprintf(G->name, sizeof G->name, "%s", name);
    G->key = pt_flight_key(name, size, world_ranks);
    G->size = size, G->rank = rank, G->live = 1;
    if (!world_ranks) {
        G->members = -1;
    } else if (s->members_used + size <= s->members_cap) {
        G->members = s->members_used;
        memcpy(s->member + s->members_used, world_ranks, (size_t)size * sizeof(int32_t));
        s->members_used += size;
    } else {
        G->members = -2;
    }
    return g;
}

void pt_flight_group_remove(int g) {
    if (pt_fs && g >= 0 && g < pt_fs->ngroups) pt_fs->groups[g].live = 0;
}

static int pt_group_member(const pt_flight_state *s, const pt_flight_group *G, int i) {
    if (i < 0 || i >= G->size) return -1;
    if (G->members == -1) return i;
    if (G->members < 0) return -1;
    return s->member[G->members + i];
}

int pt_flight_world_rank(int g, int rank) {
    if (!pt_fs || g < 0 || g >= pt_fs->ngroups) return -1;
    return pt_group_member(pt_fs, &pt_fs->groups[g], rank);
}

uint64_t pt_flight_enter(int g, pt_comm_op op, int peer, uint64_t bytes, uint64_t *seq) {
    pt_flight_state *s = pt_fs;
    *seq = 0;
    if (!s || g < 0 || g >= s->ngroups) return 0;
    pt_flight_group *G = &s->groups[g];
    *seq = pt_is_p2p(op) ? ++G->p2p_entered : ++G->coll_entered;
    uint64_t id = ++s->nrec;
    pt_flight_rec *r = &s->ring[(id - 1) % PT_FLIGHT_RING];
    r->id = id;
    r->seq = *seq;
    r->bytes = bytes;
    r->t_enter = s->seen = pt_wall();
    r->t_done = 0;
    r->group = g;
    r->op = op;
    r->peer = peer;
    return id;
}

void pt_flight_done(uint64_t id, int g, pt_comm_op op, uint64_t seq) {
    pt_flight_state *s = pt_fs;
    if (!s || !id || g < 0 || g >= s->ngroups) return;
    double t = s->seen = pt_wall();
    pt_flight_rec *r = &s->ring[(id - 1) % PT_FLIGHT_RING];
    if (r->id == id) r->t_done = t; /* (else overwritten by newer ones) */
    pt_flight_group *G = &s->groups[g];
    if (pt_is_p2p(op)) {
        if (seq > G->p2p_done) G->p2p_done = seq;
    } else if (seq > G->coll_done) {
        G->coll_done = seq;
        G->last_seq = seq, G->last_op = op, G->last_t = t;
    }
}

void pt_flight_wait_begin(int g, pt_comm_op op, uint64_t seq, int peer) {
    pt_flight_state *s = pt_fs;
    if (!s) return;
    s->wait_group = g, s->wait_op = op, s->wait_seq = seq, s->wait_peer = peer;
    s->wait_since = s->seen = pt_wall();
    s->waiting = 1;
}

void pt_flight_alive(void) {
    if (pt_fs) pt_fs->seen = pt_wall();
}

void pt_flight_wait_end(void) {
    if (pt_fs) pt_fs->waiting = 0;
}

void pt_flight_finish(void) {
    if (!pt_fs) return;
    pt_fs->finished = 1;
    if (pt_fs_mapped) msync(pt_fs, pt_fs->bytes, MS_ASYNC);
}

void pt_flight_set_label(const char *label) {
    if (pt_fs) snprintf(pt_fs->label, sizeof pt_fs->label, "%s", label);
}

void pt_flight_set_roster(const char *roster, int world_size) {
    if (!pt_fs || world_size != pt_fs->world) return;
    free(pt_fs_roster);
    pt_fs_roster = pt_malloc((size_t)world_size * PT_FLIGHT_ROSTER);
    memcpy(pt_fs_roster, roster, (size_t)world_size * PT_FLIGHT_ROSTER);
}

pt_status pt_flight_file(const char *dir) {
    if (!pt_fs || pt_fs_mapped) return PT_OK;
    char path[4200];
    snprintf(path, sizeof path, "%s/flight-rank%d.bin", dir, pt_fs->rank);
    int fd; /* an earlier run's file replaced, a link refused (never written through) */
    PT_TRY(pt_create_file(path, &fd));
    size_t bytes = pt_fs->bytes;
    void *m = MAP_FAILED;
    if (ftruncate(fd, (off_t)bytes) == 0) m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (m == MAP_FAILED) {
        unlink(path);
        return pt_errorf(PT_ERR_IO, "%s: cannot map the flight record: %s", path, strerror(err));
    }
    memcpy(m, pt_fs, bytes);
    free(pt_fs);
    pt_fs = m;
    pt_fs_mapped = 1;
    snprintf(pt_fs_dir, sizeof pt_fs_dir, "%s", dir);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* the verdict */

typedef struct {
    const pt_flight_state *const *st;   /* the ranks that answered (NULL: silent) */
    const pt_flight_state *const *full; /* every state there is (a silent rank's file) */
    int n;
    const char *roster;
    char *out;
    size_t cap, used;
} pt_fv;

static void pt_fv_put(pt_fv *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pt_fv_put(pt_fv *v, const char *fmt, ...) {
    if (v->used >= v->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(v->out + v->used, v->cap - v->used, fmt, ap);
    va_end(ap);
    if (k > 0) v->used += (size_t)k < v->cap - v->used ? (size_t)k : v->cap - v->used - 1;
}

/* The group of s with this key: the live one, else the newest that had it. */
static const pt_flight_group *pt_fv_group(const pt_flight_state *s, uint64_t key) {
    const pt_flight_group *found = NULL;
    for (int i = 0; s && i < s->ngroups && i < PT_FLIGHT_GROUPS; i++)
        if (s->groups[i].key == key && (!found || s->groups[i].live)) found = &s->groups[i];
    return found;
}

static const pt_flight_group *pt_fv_own(const pt_flight_state *s, int g) {
    return s && g >= 0 && g < s->ngroups && g < PT_FLIGHT_GROUPS ? &s->groups[g] : NULL;
}

static int pt_fv_has(const pt_flight_state *s, const pt_flight_group *G, int r) {
    for (int i = 0; i < G->size; i++)
        if (pt_group_member(s, G, i) == r) return 1;
    return 0;
}

/* "rank 3 (dp1 pp0 cp0 tp1) on host h1" */
static void pt_fv_who(const pt_fv *v, int r, char *out, size_t cap) {
    const pt_flight_state *s = r >= 0 && r < v->n ? v->full[r] : NULL;
    const char *label = s ? s->label : "", *host = s ? s->host : "";
    char lb[PT_FLIGHT_LABEL + 1] = "", hb[PT_FLIGHT_HOST + 1] = "";
    if (!s && v->roster && r >= 0 && r < v->n) {
        memcpy(lb, v->roster + (size_t)r * PT_FLIGHT_ROSTER, PT_FLIGHT_LABEL);
        memcpy(hb, v->roster + (size_t)r * PT_FLIGHT_ROSTER + PT_FLIGHT_LABEL, PT_FLIGHT_HOST);
        label = lb, host = hb;
    }
    int k = snprintf(out, cap, "rank %d", r);
    if (label[0] && k > 0 && (size_t)k < cap) k += snprintf(out + k, cap - (size_t)k, " (%s)", label);
    if (host[0] && k > 0 && (size_t)k < cap) snprintf(out + k, cap - (size_t)k, " on host %s", host);
}

/* "all-reduce #57 of group "dp"", "recv #4 from rank 5 in group "pp"" */
static void pt_fv_op(const pt_flight_group *G, int op, uint64_t seq, int peer, char *out, size_t cap) {
    const char *name = G ? G->name : "?";
    if (pt_is_p2p(op))
        snprintf(out, cap, "%s #%llu %s rank %d in group \"%s\"", pt_comm_op_name(op),
                 (unsigned long long)seq, op == PT_COMM_SEND ? "to" : "from", peer, name);
    else
        snprintf(out, cap, "%s #%llu of group \"%s\"", pt_comm_op_name(op), (unsigned long long)seq, name);
}

/* The ranks that hold up r's wait: silent ones, and members that never entered it. */
static int pt_fv_blockers(const pt_fv *v, int r, int *out) {
    const pt_flight_state *s = v->st[r];
    const pt_flight_group *G = pt_fv_own(s, s->wait_group);
    int n = 0;
    if (!G) return 0;
    if (pt_is_p2p(s->wait_op)) {
        if (s->wait_peer >= 0 && s->wait_peer < v->n) out[n++] = s->wait_peer;
        return n;
    }
    for (int i = 0; i < G->size; i++) {
        int m = pt_group_member(s, G, i);
        if (m < 0 || m == r || m >= v->n) continue;
        const pt_flight_state *sm = v->st[m];
        const pt_flight_group *Gm = sm ? pt_fv_group(sm, G->key) : NULL;
        if (!sm || (Gm && Gm->coll_entered < s->wait_seq)) out[n++] = m;
    }
    return n;
}

/* r's last communication: its own newest record, or (r silent) the collective that completed
 * last, as its peers saw, among the groups it belongs to. */
static void pt_fv_last(const pt_fv *v, int r, char *out, size_t cap) {
    const pt_flight_state *s = r >= 0 && r < v->n ? v->full[r] : NULL;
    out[0] = 0;
    if (s) {
        if (!s->nrec) return;
        const pt_flight_rec *q = &s->ring[(s->nrec - 1) % PT_FLIGHT_RING];
        char op[160];
        pt_fv_op(pt_fv_own(s, q->group), q->op, q->seq, q->peer, op, sizeof op);
        snprintf(out, cap, "%s (%s)", op, q->t_done > 0 ? "completed" : "not completed");
        return;
    }
    double best = -1;
    for (int p = 0; p < v->n; p++) {
        const pt_flight_state *sp = v->st[p];
        for (int g = 0; sp && g < sp->ngroups && g < PT_FLIGHT_GROUPS; g++) {
            const pt_flight_group *G = &sp->groups[g];
            if (!G->last_seq || G->last_t <= best || !pt_fv_has(sp, G, r)) continue;
            best = G->last_t;
            snprintf(out, cap, "%s #%llu of \"%s\"", pt_comm_op_name(G->last_op),
                     (unsigned long long)G->last_seq, G->name);
        }
    }
}

/* "0, 1, 2" (at most 8, then "...") */
static void pt_fv_list(const int *r, int n, char *out, size_t cap) {
    out[0] = 0;
    for (int i = 0; i < n && i < 8; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%d", i ? ", " : "", r[i]);
    if (n > 8) snprintf(out + strlen(out), cap - strlen(out), ", ... (%d in all)", n);
}

enum { PT_FV_SILENT = 1, PT_FV_IDLE, PT_FV_FROZEN, PT_FV_STUCK, PT_FV_DUP };

/* Whether a member of the group r waits in has completed that collective: r itself stopped
 * polling (a rank stopped or killed inside its wait, as its file shows). */
static int pt_fv_completed_by_peer(const pt_fv *v, int r) {
    const pt_flight_state *s = v->st[r];
    const pt_flight_group *G = pt_fv_own(s, s->wait_group);
    for (int i = 0; G && i < G->size; i++) {
        int m = pt_group_member(s, G, i);
        const pt_flight_group *Gm = m >= 0 && m < v->n && m != r && v->st[m] ? pt_fv_group(v->st[m], G->key) : NULL;
        if (Gm && Gm->coll_done >= s->wait_seq) return 1;
    }
    return 0;
}

static double pt_fv_activity(const pt_fv *v, int r) {
    const pt_flight_state *s = r >= 0 && r < v->n ? v->full[r] : NULL;
    return s ? s->seen : 0;
}

int pt_flight_verdict(const pt_flight_state *const *full, const unsigned char *silent, int n,
                      const char *roster, char *out, size_t cap) {
    const pt_flight_state **states = pt_calloc((size_t)n, sizeof *states);
    for (int r = 0; r < n; r++) states[r] = silent && silent[r] ? NULL : full[r];
    pt_fv v = {states, full, n, roster, out, cap, 0};
    if (cap) out[0] = 0;
    int *kind = pt_calloc((size_t)n, sizeof *kind);
    int *bl = pt_calloc((size_t)n, sizeof *bl), *waiters = pt_calloc((size_t)n, sizeof *waiters);
    int *next = pt_calloc((size_t)n, sizeof *next);
    int nwaiting = 0, causes = 0;
    for (int r = 0; r < n; r++) next[r] = -1;
    /* every waiting rank's blockers: a silent one or one in no communication is a cause; a wait
     * nobody holds up (every member entered it) is one too */
    for (int r = 0; r < n; r++) {
        const pt_flight_state *s = states[r];
        if (!s || !s->waiting) continue;
        nwaiting++;
        int nb = pt_fv_blockers(&v, r, bl);
        if (nb == 0 && !pt_is_p2p(s->wait_op) && !kind[r]) {
            kind[r] = pt_fv_completed_by_peer(&v, r) ? PT_FV_FROZEN : PT_FV_STUCK;
            for (int q = 0; q < r && kind[r] == PT_FV_STUCK; q++) /* one line a stuck collective */
                if (kind[q] == PT_FV_STUCK && states[q]->wait_seq == s->wait_seq &&
                    pt_fv_own(states[q], states[q]->wait_group)->key == pt_fv_own(s, s->wait_group)->key)
                    kind[r] = PT_FV_DUP;
        }
        for (int i = 0; i < nb; i++) {
            int b = bl[i];
            if (next[r] < 0) next[r] = b;
            int k = !states[b] ? PT_FV_SILENT : !states[b]->waiting ? PT_FV_IDLE : 0;
            if (k && !kind[b]) kind[b] = k;
        }
    }
    /* the causes: silent ranks, then ranks in no communication (the first to stop first), then
     * stuck collectives */
    int *order = pt_calloc((size_t)n, sizeof *order), norder = 0;
    for (int k = PT_FV_SILENT; k <= PT_FV_STUCK; k++) {
        int from = norder;
        for (int r = 0; r < n; r++)
            if (kind[r] == k) order[norder++] = r;
        if (k == PT_FV_IDLE) /* by their last activity, earliest first */
            for (int i = from + 1; i < norder; i++)
                for (int j = i; j > from && pt_fv_activity(&v, order[j]) < pt_fv_activity(&v, order[j - 1]); j--) {
                    int t = order[j];
                    order[j] = order[j - 1], order[j - 1] = t;
                }
    }
    for (int i = 0; i < norder && causes < 8; i++) {
        int b = order[i];
        char who[256], ops[640] = "", last[200];
        pt_fv_who(&v, b, who, sizeof who);
        pt_fv_last(&v, b, last, sizeof last);
        /* what b holds up: each operation some rank waits in because of b (at most 3), with the
         * ranks that wait in it */
        int nops = 0, nw;
        char *seen = pt_calloc((size_t)n, 1);
        for (int r = kind[b] >= PT_FV_FROZEN ? b : 0; r < n && nops < 3; r++) {
            const pt_flight_state *s = states[r];
            if (seen[r] || !s || !s->waiting) continue;
            int held = r == b; /* a frozen or stuck rank holds up its own wait; a silent or idle
                                * one those it blocks */
            if (kind[b] < PT_FV_FROZEN)
                for (int k = 0, nb = pt_fv_blockers(&v, r, bl); k < nb; k++) held |= bl[k] == b;
            if (!held) continue;
            const pt_flight_group *G = pt_fv_own(s, s->wait_group);
            nw = 0;
            for (int q = r; q < n; q++) { /* the ranks waiting in that same operation */
                const pt_flight_state *sq = states[q];
                const pt_flight_group *Gq = sq && sq->waiting ? pt_fv_own(sq, sq->wait_group) : NULL;
                if (!Gq || !G || Gq->key != G->key || sq->wait_op != s->wait_op) continue;
                if (q == b && kind[b] != PT_FV_STUCK) continue;
                if (!pt_is_p2p(s->wait_op) && sq->wait_seq != s->wait_seq) continue;
                if (pt_is_p2p(s->wait_op) && sq->wait_peer != b) continue;
                seen[q] = 1;
                waiters[nw++] = q;
            }
            if (kind[b] == PT_FV_FROZEN && nw == 0) waiters[nw++] = b;
            char op[160], list[128];
            pt_fv_op(G, s->wait_op, s->wait_seq, s->wait_peer, op, sizeof op);
            pt_fv_list(waiters, nw, list, sizeof list);
            snprintf(ops + strlen(ops), sizeof ops - strlen(ops), "%s%s (rank%s %s wait%s in it)",
                     nops ? " and " : "", op, nw == 1 ? "" : "s", list, nw == 1 ? "s" : "");
            nops++;
        }
        free(seen);
        if (kind[b] == PT_FV_SILENT)
            pt_fv_put(&v, "%s does not answer (stopped, hung or dead) and holds up %s; its last: %s\n",
                      who, ops, last[0] ? last : "none recorded");
        else if (kind[b] == PT_FV_IDLE)
            pt_fv_put(&v, "%s never entered %s and was in no communication (computing, killed or "
                      "crashed); its last: %s\n", who, ops, last[0] ? last : "none recorded");
        else if (kind[b] == PT_FV_FROZEN)
            pt_fv_put(&v, "%s stopped inside its wait in %s, which its peers completed (stopped, "
                      "killed or hung); its last: %s\n", who, ops, last[0] ? last : "none recorded");
        else
            pt_fv_put(&v, "every member entered %s and it did not complete: the network or the "
                      "communication library holds it up\n", ops);
        causes++;
    }
    if (norder > causes) pt_fv_put(&v, "(and %d more)\n", norder - causes);
    /* no cause outside the waiting ranks: they wait on each other */
    if (!norder && nwaiting) {
        int r = 0;
        while (r < n && (!states[r] || !states[r]->waiting || next[r] < 0)) r++;
        if (r < n) {
            char *seen = pt_calloc((size_t)n, 1);
            while (r >= 0 && !seen[r] && states[r] && states[r]->waiting) seen[r] = 1, r = next[r];
            int start = r;
            pt_fv_put(&v, "deadlock: ");
            for (int k = 0; k < n && r >= 0; k++) {
                const pt_flight_state *s = states[r];
                char who[256], op[160];
                pt_fv_who(&v, r, who, sizeof who);
                pt_fv_op(pt_fv_own(s, s->wait_group), s->wait_op, s->wait_seq, s->wait_peer, op, sizeof op);
                pt_fv_put(&v, "%s%s waits in %s", k ? "; " : "", who, op);
                if (!pt_is_p2p(s->wait_op)) pt_fv_put(&v, ", which rank %d never entered", next[r]);
                r = next[r];
                if (r == start) break;
            }
            pt_fv_put(&v, ": each waits for the next\n");
            free(seen);
            causes++;
        }
    }
    free(kind), free(bl), free(waiters), free(next), free(order), free(states);
    return causes;
}

/* ------------------------------------------------------------------------------------------ */
/* the hang protocol */

int pt_flight_asked(void) { return pt_fs && pt_fs_ch && pt_fs->world > 1 && pt_fs_ch->pending(); }

/* The verdict printed (one error line a cause), kept beside the trace, and the job ended. */
_Noreturn static void pt_flight_conclude(char *const *got, int n, int answered, int waited_s) {
    char *text = pt_malloc(16384);
    int causes = pt_flight_verdict((const pt_flight_state *const *)got, NULL, n, pt_fs_roster, text, 16384);
    pt_log_error("hang: %d of %d ranks answered within %d s of the first timeout; %s", answered, n,
                 waited_s, causes ? "the cause:" : "no rank holds the others up (a wait ran out "
                 "while the ranks still made progress: raise parallel.timeout_s?)");
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        if (!end) break;
        *end = 0;
        pt_log_error("hang: %s", line);
        *end = '\n';
    }
    if (pt_fs_mapped) {
        char path[4200];
        snprintf(path, sizeof path, "%s/why.txt", pt_fs_dir);
        if (pt_write_file_atomic(path, text, strlen(text)) != PT_OK) pt_log_warn("%s", pt_last_error());
        msync(pt_fs, pt_fs->bytes, MS_SYNC);
    }
    free(text);
    /* the others end at once (where the launcher does not end the whole job on an abort: mpirun
     * --enable-recovery) */
    for (int r = 0; r < n; r++)
        if (r != pt_fs->rank) pt_fs_ch->send(r, PT_FLIGHT_TAG_DONE, NULL, 0);
    pt_fatal(__FILE__, __LINE__, "the job ends: a communication hung (the cause above)");
}

_Noreturn void pt_flight_hang(const pt_comm *c, int timed_out) {
    pt_flight_state *s = pt_fs;
    if (!s || s->world < 2 || !pt_fs_ch)
        pt_fatal(__FILE__, __LINE__, "a wait over group \"%s\" timed out", c->name);
    s->timed_out |= timed_out;
    s->answered = 1;
    if (pt_fs_mapped) msync(s, s->bytes, MS_ASYNC);
    int n = s->world, me = s->rank, ncol = n < PT_FLIGHT_COLLECTORS ? n : PT_FLIGHT_COLLECTORS;
    int collector = me < ncol;
    /* how long a collector waits after the last new answer, and how long any rank waits for a
     * collector's verdict before it ends the job on its own */
    double quiet = c->timeout_s > 0 ? c->timeout_s * 0.1 : 5;
    quiet = quiet < 2 ? 2 : quiet > 10 ? 10 : quiet;
    double give_up = 3 * quiet + 10, t0 = pt_now(), last_new = t0;
    size_t bytes = s->bytes;
    /* the snapshot sent (the state goes on changing only by this wait's end, which never comes) */
    char *mine = pt_malloc(bytes), *buf = pt_malloc(bytes);
    memcpy(mine, s, bytes);
    for (int k = 0; k < ncol; k++)
        if (k != me) pt_fs_ch->send(k, PT_FLIGHT_TAG_STATE, mine, bytes);
    char **got = NULL;
    int answered = 0;
    if (collector) {
        got = pt_calloc((size_t)n, sizeof *got);
        got[me] = mine;
        answered = 1;
        for (int r = 0; r < n; r++)
            if (r != me) pt_fs_ch->send(r, PT_FLIGHT_TAG_ASK, NULL, 0);
    }
    const struct timespec nap = {0, 1000000};
    for (;;) {
        int from, tag;
        size_t len;
        while (pt_fs_ch->recv(buf, bytes, &from, &tag, &len)) {
            const pt_flight_state *q = (const pt_flight_state *)buf;
            if (tag == PT_FLIGHT_TAG_DONE) { /* a collector named the cause */
                if (pt_fs_mapped) msync(s, s->bytes, MS_SYNC);
                pt_fs_ch->abort(1);
            }
            if (tag != PT_FLIGHT_TAG_STATE || !collector || from < 0 || from >= n || got[from] ||
                len != bytes || memcmp(q->magic, PT_FLIGHT_MAGIC, 8) || q->rank != from)
                continue;
            got[from] = pt_malloc(bytes);
            memcpy(got[from], buf, bytes);
            answered++;
            last_new = pt_now();
        }
        double now = pt_now();
        if (collector && (answered == n || now - last_new > quiet)) {
            int printer = 0;
            while (printer < ncol && !got[printer]) printer++;
            /* the lowest collector that answered speaks; the others wait for it to end the job */
            if (printer == me || now - t0 > give_up)
                pt_flight_conclude(got, n, answered, (int)(now - t0 + 0.5));
        } else if (now - t0 > give_up) {
            pt_fatal(__FILE__, __LINE__, "waited %.0f s for a collector (world ranks 0-%d) to "
                     "explain the hang: none did", give_up, ncol - 1);
        }
        nanosleep(&nap, NULL);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* pentatron trace why */

static const char *pt_fmt_time(double t, char *out, size_t cap) {
    time_t sec = (time_t)t;
    struct tm tm;
    localtime_r(&sec, &tm);
    size_t k = strftime(out, cap, "%H:%M:%S", &tm);
    snprintf(out + k, cap - k, ".%03d", (int)((t - (double)sec) * 1000));
    return out;
}

/* A state read from a file, made safe to read: strings ended, sizes and indices within range. */
static void pt_flight_sanitize(pt_flight_state *s) {
    s->label[sizeof s->label - 1] = s->host[sizeof s->host - 1] = 0;
    if (s->members_used < 0) s->members_used = 0;
    for (int g = 0; g < s->ngroups; g++) {
        pt_flight_group *G = &s->groups[g];
        G->name[sizeof G->name - 1] = 0;
        if (G->size < 0 || G->size > s->world) G->size = 0;
        if (G->members < -2 || (G->members >= 0 && (int64_t)G->members + G->size > s->members_used))
            G->members = -2;
        if (G->last_op < 0 || G->last_op >= PT_COMM_OP_COUNT) G->last_op = PT_COMM_BARRIER, G->last_seq = 0;
    }
    if (s->wait_op < 0 || s->wait_op >= PT_COMM_OP_COUNT) s->waiting = 0;
    if (s->wait_peer < -1 || s->wait_peer >= s->world) s->wait_peer = -1;
    for (int i = 0; i < PT_FLIGHT_RING; i++) {
        pt_flight_rec *q = &s->ring[i];
        if (q->op < 0 || q->op >= PT_COMM_OP_COUNT) q->op = PT_COMM_BARRIER;
        if (q->peer < -1 || q->peer >= s->world) q->peer = -1;
    }
}

pt_status pt_flight_why(const char *dir, FILE *out) {
    DIR *d = opendir(dir);
    if (!d) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", dir, strerror(errno));
    /* every rank's file; the world is the newest file's (an earlier, larger run may have left more) */
    pt_flight_state **st = NULL;
    int cap = 0, newest = -1;
    double newest_t = -1;
    struct dirent *e;
    pt_status bad = PT_OK;
    while ((e = readdir(d)) != NULL) {
        int r;
        char tail;
        if (sscanf(e->d_name, "flight-rank%d.bi%c", &r, &tail) != 2 || tail != 'n' || r < 0 || r > 1 << 24)
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *data;
        size_t len;
        if (pt_read_file(path, &data, &len) != PT_OK) continue;
        pt_flight_state *s = (pt_flight_state *)data;
        if (len < sizeof *s || memcmp(s->magic, PT_FLIGHT_MAGIC, 8) || s->version != PT_FLIGHT_VERSION ||
            s->bytes != len || s->rank != r || s->world <= r || s->world > 1 << 20 || s->ngroups < 0 ||
            s->ngroups > PT_FLIGHT_GROUPS || s->members_cap < 0 ||
            sizeof *s + (size_t)s->members_cap * 4 != len || s->members_used > s->members_cap) {
            bad = pt_errorf(PT_ERR_FORMAT, "%s: not a flight record of this version", path);
            free(data);
            continue;
        }
        pt_flight_sanitize(s);
        if (r >= cap) {
            int nc = r + 1 > 2 * cap ? r + 1 : 2 * cap;
            st = pt_realloc(st, (size_t)nc * sizeof *st);
            memset(st + cap, 0, (size_t)(nc - cap) * sizeof *st);
            cap = nc;
        }
        free(st[r]);
        st[r] = s;
        struct stat sb;
        double t = stat(path, &sb) == 0 ? (double)sb.st_mtim.tv_sec + 1e-9 * (double)sb.st_mtim.tv_nsec : 0;
        if (t > newest_t) newest_t = t, newest = r;
    }
    closedir(d);
    if (newest < 0) {
        free(st);
        if (bad != PT_OK) return bad;
        return pt_errorf(PT_ERR_IO, "%s: no flight record (flight-rankN.bin: a run with "
                         "logging.trace = %s writes them)", dir, dir);
    }
    int n = st[newest]->world;
    if (n > cap) {
        st = pt_realloc(st, (size_t)n * sizeof *st);
        memset(st + cap, 0, (size_t)(n - cap) * sizeof *st);
        cap = n;
    }
    for (int r = 0; r < n; r++)
        if (st[r] && st[r]->world != n) free(st[r]), st[r] = NULL;
    pt_fv v = {(const pt_flight_state *const *)st, (const pt_flight_state *const *)st, n, NULL, NULL, 0, 0};
    fprintf(out, "%s: flight records of %d ranks\n", dir, n);
    int finished = 0, missing = 0;
    for (int r = 0; r < n; r++) {
        const pt_flight_state *s = st[r];
        char who[256], op[200], last[256], when[32];
        pt_fv_who(&v, r, who, sizeof who);
        if (!s) {
            if (missing++ < 16) fprintf(out, "  %s: no file\n", who);
            else if (missing == 17) fprintf(out, "  (more ranks without a file: see the count below)\n");
            continue;
        }
        finished += s->finished;
        pt_fv_last(&v, r, last, sizeof last);
        if (s->waiting) {
            pt_fv_op(pt_fv_own(s, s->wait_group), s->wait_op, s->wait_seq, s->wait_peer, op, sizeof op);
            char seen[32];
            fprintf(out, "  %s: waits in %s since %s%s, last seen %s\n", who, op,
                    pt_fmt_time(s->wait_since, when, sizeof when), s->timed_out ? " (timed out)" : "",
                    pt_fmt_time(s->seen, seen, sizeof seen));
        } else {
            fprintf(out, "  %s: %s; its last: %s\n", who, s->finished ? "finished" : "in no communication",
                    last[0] ? last : "none recorded");
        }
    }
    /* when some rank explained a hang, those that took no part were silent: stopped or dead */
    unsigned char *silent = pt_calloc((size_t)n, 1);
    int explained = 0;
    for (int r = 0; r < n; r++) explained |= st[r] && st[r]->answered;
    if (!explained && finished < n) {
        /* no wait timed out: the job was ended from outside (a rank killed or crashed and the
         * launcher ended the others, or the launcher itself); the rank that stopped first */
        int first = -1, second = -1;
        for (int r = 0; r < n; r++) {
            if (!st[r] || st[r]->finished) continue;
            if (first < 0 || pt_fv_activity(&v, r) < pt_fv_activity(&v, first)) second = first, first = r;
            else if (second < 0 || pt_fv_activity(&v, r) < pt_fv_activity(&v, second)) second = r;
        }
        char who[256], when[32], last[256];
        pt_fv_who(&v, first, who, sizeof who);
        pt_fv_last(&v, first, last, sizeof last);
        fprintf(out, "no rank's wait timed out: the job was ended from outside (a rank killed or "
                "crashed and the launcher ended the others, or the launcher was stopped)\n");
        fprintf(out, "the rank that stopped first: %s, at %s", who,
                pt_fmt_time(pt_fv_activity(&v, first), when, sizeof when));
        if (second >= 0)
            fprintf(out, ", %.3f s before the next (rank %d)",
                    pt_fv_activity(&v, second) - pt_fv_activity(&v, first), second);
        fprintf(out, "; its last: %s\n", last[0] ? last : "none recorded");
        free(silent);
        for (int r = 0; r < cap; r++) free(st[r]);
        free(st);
        return PT_OK;
    }
    for (int r = 0; r < n; r++) silent[r] = explained && (!st[r] || (!st[r]->answered && !st[r]->finished));
    if (missing) fprintf(out, "%d of %d ranks left no file\n", missing, n);
    char *text = pt_malloc(16384);
    int causes = pt_flight_verdict((const pt_flight_state *const *)st, silent, n, NULL, text, 16384);
    free(silent);
    if (causes) fprintf(out, "the cause:\n");
    for (char *line = text, *end; (end = strchr(line, '\n')) != NULL; line = end + 1)
        fprintf(out, "  %.*s\n", (int)(end - line), line);
    if (!causes)
        fprintf(out, finished == n ? "every rank finished: nothing hung\n"
                                   : "no rank was waiting in a communication: nothing hung there\n");
    free(text);
    for (int r = 0; r < cap; r++) free(st[r]);
    free(st);
    return PT_OK;
}
