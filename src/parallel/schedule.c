/* schedule.c: pipeline schedules as per-rank action lists: building them, executing them
 * symbolically (which both checks and times them), and drawing them (see include/pt/schedule.h).
 */
#include "pt/schedule.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const char *const pt_sched_names[] = {"afab", "1f1b", "interleaved", "zb", "dualpipev"};
enum { PT_SCHED_KINDS = PT_SCHED_DUALPIPEV + 1 };
static const char *const pt_act_names[] = {"FWD",      "BWD",      "BWD_INPUT", "BWD_WEIGHT", "SEND_FWD",
                                           "RECV_FWD", "SEND_BWD", "RECV_BWD",  "HEAD"};
enum { PT_ACT_KINDS = PT_ACT_HEAD + 1 };

/* Generous bound on one schedule's size: the checker keeps a few bytes per (rank, micro, chunk).
 * A (micro, chunk) has at most 8 actions on a rank: RECV_FWD FWD SEND_FWD HEAD RECV_BWD BWD_INPUT
 * SEND_BWD BWD_WEIGHT. */
enum { PT_SCHED_MAX_CELLS = 1 << 24, PT_SCHED_ACTS_PER_CELL = 8 };

pt_status pt_schedule_parse_kind(const char *s, pt_sched_kind *out) {
    for (int k = 0; k < PT_SCHED_KINDS; k++) {
        if (s && !strcmp(s, pt_sched_names[k])) {
            *out = (pt_sched_kind)k;
            return PT_OK;
        }
    }
    return pt_errorf(PT_ERR_CONFIG,
                     "unknown pipeline schedule \"%s\" (expected afab, 1f1b, interleaved, zb or dualpipev)",
                     s ? s : "");
}

const char *pt_schedule_kind_name(pt_sched_kind k) {
    return (unsigned)k < PT_SCHED_KINDS ? pt_sched_names[k] : "?";
}

const char *pt_schedule_action_name(pt_act_kind k) {
    return (unsigned)k < PT_ACT_KINDS ? pt_act_names[k] : "?";
}

/* ---- stages ---------------------------------------------------------------------------- */

int pt_schedule_chunks(pt_sched_kind kind, int v) { return kind == PT_SCHED_DUALPIPEV ? 2 : v; }

/* Layers go round-robin (chunk c of rank r is global stage c·pp + r), or for dualpipev in a V:
 * down the ranks with chunk 0 and back up with chunk 1. */
int pt_schedule_stage(pt_sched_kind kind, int pp, int v, int r, int c) {
    (void)v;
    if (kind == PT_SCHED_DUALPIPEV) return c == 0 ? r : 2 * pp - 1 - r;
    return c * pp + r;
}

void pt_schedule_locate(pt_sched_kind kind, int pp, int v, int st, int *rank, int *chunk) {
    (void)v;
    if (kind == PT_SCHED_DUALPIPEV) {
        *chunk = st >= pp;
        *rank = st < pp ? st : 2 * pp - 1 - st;
        return;
    }
    *rank = st % pp;
    *chunk = st / pp;
}

int pt_schedule_splits_backward(pt_sched_kind kind) {
    return kind == PT_SCHED_ZB || kind == PT_SCHED_DUALPIPEV;
}

static int pt_stage(const pt_schedule *s, int r, int c) { return pt_schedule_stage(s->kind, s->pp, s->v, r, c); }
static int pt_stage_rank(const pt_schedule *s, int st) {
    int r, c;
    pt_schedule_locate(s->kind, s->pp, s->v, st, &r, &c);
    return r;
}
static int pt_stage_chunk(const pt_schedule *s, int st) {
    int r, c;
    pt_schedule_locate(s->kind, s->pp, s->v, st, &r, &c);
    return c;
}
static int pt_last_stage(const pt_schedule *s) { return s->pp * s->v - 1; }

static int pt_is_compute(pt_act_kind k) { return k <= PT_ACT_BWD_WEIGHT; }
/* BWD and BWD_INPUT both produce the input gradient that the previous stage waits for. */
static int pt_is_bwd_input(pt_act_kind k) { return k == PT_ACT_BWD || k == PT_ACT_BWD_INPUT; }
/* The factor on the cost of rank r's action x: its stage's weight (1 for even stages and HEADs). */
static double pt_weight(const pt_schedule *s, int r, const pt_action *x) {
    return s->weight && pt_is_compute(x->kind) ? s->weight[pt_stage(s, r, x->chunk)] : 1.0;
}

/* ---- building -------------------------------------------------------------------------- */

static void pt_push(pt_schedule *s, int r, pt_act_kind k, int micro, int chunk, int peer) {
    PT_ASSERT(s->n[r] < PT_SCHED_ACTS_PER_CELL * s->m * s->v);
    s->a[r][s->n[r]++] = (pt_action){k, micro, chunk, peer};
}

/* The messages of one compute action: its input (recv) or its output (!recv), where the
 * neighbouring stage is on another rank (on the same rank the hand-off is local). */
static void pt_emit_msg(pt_schedule *s, int r, pt_act_kind k, int micro, int chunk, int recv) {
    int st = pt_stage(s, r, chunk);
    int prev = st > 0 ? pt_stage_rank(s, st - 1) : r;
    int next = st < pt_last_stage(s) ? pt_stage_rank(s, st + 1) : r;
    int peer = (k == PT_ACT_FWD) == recv ? prev : next;
    if (peer == r || !(k == PT_ACT_FWD || pt_is_bwd_input(k))) return;
    pt_act_kind msg = k == PT_ACT_FWD ? (recv ? PT_ACT_RECV_FWD : PT_ACT_SEND_FWD)
                                      : (recv ? PT_ACT_RECV_BWD : PT_ACT_SEND_BWD);
    pt_push(s, r, msg, micro, chunk, peer);
}

/* One compute action with its messages: the input is received just before it (so a rank waits
 * only when it needs the data) and the output sent just after. With the head split, a backward's
 * HEAD comes first on every rank (where pt_place_heads starts from: the latest place it may be). */
static void pt_emit(pt_schedule *s, int r, pt_act_kind k, int micro, int chunk) {
    if (s->head && pt_is_bwd_input(k)) pt_push(s, r, PT_ACT_HEAD, micro, 0, -1);
    pt_emit_msg(s, r, k, micro, chunk, 1);
    pt_push(s, r, k, micro, chunk, -1);
    pt_emit_msg(s, r, k, micro, chunk, 0);
}

static void pt_build_afab(pt_schedule *s, int r) {
    for (int i = 0; i < s->m; i++) pt_emit(s, r, PT_ACT_FWD, i, 0);
    for (int i = 0; i < s->m; i++) pt_emit(s, r, PT_ACT_BWD, i, 0);
}

/* ZB-H1's backward: B now, W once more than `lag` B's are waiting for theirs. Rank r lags by r:
 * the last ranks, whose gradients everyone upstream waits for, postpone the most work. */
typedef struct {
    int next_w, lag;
} pt_wqueue;

static void pt_backward(pt_schedule *s, int r, int micro, pt_wqueue *wq) {
    if (!wq) {
        pt_emit(s, r, PT_ACT_BWD, micro, 0);
        return;
    }
    pt_emit(s, r, PT_ACT_BWD_INPUT, micro, 0);
    while (micro + 1 - wq->next_w > wq->lag) pt_emit(s, r, PT_ACT_BWD_WEIGHT, wq->next_w++, 0);
}

/* 1F1B, and ZB-H1 when split: the same forward/backward order, so the same peak in-flight. */
static void pt_build_1f1b(pt_schedule *s, int r, int split) {
    int warm = s->pp - r - 1 < s->m ? s->pp - r - 1 : s->m;
    pt_wqueue wq = {0, r};
    pt_wqueue *w = split ? &wq : NULL;
    for (int i = 0; i < warm; i++) pt_emit(s, r, PT_ACT_FWD, i, 0);
    for (int j = 0; j < s->m - warm; j++) {
        pt_emit(s, r, PT_ACT_FWD, warm + j, 0);
        pt_backward(s, r, j, w);
    }
    for (int j = s->m - warm; j < s->m; j++) pt_backward(s, r, j, w);
    while (split && wq.next_w < s->m) pt_emit(s, r, PT_ACT_BWD_WEIGHT, wq.next_w++, 0);
}

/* The interleaved schedule's groups (Megatron's, generalised to any m as Megatron's and Llama 3's
 * flexible schedule do): G = max(1, ⌊m/pp⌋) groups of consecutive micro-batches, as even as
 * possible: the first m mod G hold ⌈m/G⌉, the others ⌊m/G⌋ (at least pp each when m ≥ pp; m a
 * multiple of pp: G groups of pp, Megatron's). *size: the largest. */
static int pt_groups(const pt_schedule *s, int *size) {
    int G = s->m / s->pp > 1 ? s->m / s->pp : 1;
    *size = (s->m + G - 1) / G;
    return G;
}

/* Virtual micro-batch k of the interleaved order: each group goes through chunk 0, then the same
 * group through chunk 1, ..., then the next group; backwards visit a group's chunks in reverse. */
static void pt_virtual(const pt_schedule *s, int k, int backward, int *micro, int *chunk) {
    int big, G = pt_groups(s, &big), a = s->m / G, R = s->m % G; /* R groups of a + 1, then a */
    int j = k < R * (a + 1) * s->v ? k / ((a + 1) * s->v) : R + (k - R * (a + 1) * s->v) / (a * s->v);
    int g = j < R ? a + 1 : a, start = j * a + (j < R ? j : R), in = k - start * s->v;
    *chunk = backward ? s->v - 1 - in / g : in / g;
    *micro = start + in % g;
}

static void pt_emit_virtual(pt_schedule *s, int r, int k, int backward) {
    int micro, chunk;
    pt_virtual(s, k, backward, &micro, &chunk);
    pt_emit(s, r, backward ? PT_ACT_BWD : PT_ACT_FWD, micro, chunk);
}

/* Interleaved 1F1B (Narayanan et al. 2021): rank r warms up with 2(pp − r − 1) + (v − 1)·g
 * forwards, g the largest group (pp when pp divides m; all of them when m ≤ pp), then alternates,
 * then drains the backwards. A backward of the first chunk visited in a group is then never ahead
 * of its own forward ((v − 1)·g forwards separate them in the tables), and the simulation finds
 * no deadlock for any pp ≤ 16, v ≤ 4, m ≤ 4pp + 3 (tests/test_schedule.c). */
static void pt_build_interleaved(pt_schedule *s, int r) {
    int total = s->m * s->v;
    int big;
    pt_groups(s, &big);
    int warm = (s->pp - r - 1) * 2 + (s->v - 1) * big;
    if (s->m <= s->pp || warm > total) warm = total;
    for (int k = 0; k < warm; k++) pt_emit_virtual(s, r, k, 0);
    for (int j = 0; j < total - warm; j++) {
        pt_emit_virtual(s, r, warm + j, 0);
        pt_emit_virtual(s, r, j, 1);
    }
    for (int j = total - warm; j < total; j++) pt_emit_virtual(s, r, j, 1);
}

/* DualPipeV's state on one rank: the next micro-batch each chunk forwards and backwards, and the
 * weight gradients deferred (in the order of their B's: a FIFO of micro·2 + chunk). */
typedef struct {
    pt_schedule *s;
    int r, f[2], b[2];
    int *wq, wq_head, wq_tail;
} pt_dpv;

static void pt_dpv_f(pt_dpv *d, int c) { pt_emit(d->s, d->r, PT_ACT_FWD, d->f[c]++, c); }

/* The next backward of chunk c: whole, or split (B now, its W deferred to the queue). */
static void pt_dpv_b(pt_dpv *d, int c, int split) {
    int i = d->b[c]++;
    if (!split) {
        pt_emit(d->s, d->r, PT_ACT_BWD, i, c);
        return;
    }
    pt_emit(d->s, d->r, PT_ACT_BWD_INPUT, i, c);
    d->wq[d->wq_tail++] = i * 2 + c;
}

/* F&B: the forward of chunk cf and the (whole) backward of the other chunk as one unit, as
 * DualPipe overlaps them: both inputs received before it, both outputs sent after it. Here the
 * two run one after the other, so the unit takes F + B. */
static void pt_dpv_fb(pt_dpv *d, int cf) {
    int cb = 1 - cf, fi = d->f[cf]++, bi = d->b[cb]++;
    pt_emit_msg(d->s, d->r, PT_ACT_FWD, fi, cf, 1);
    pt_emit_msg(d->s, d->r, PT_ACT_BWD, bi, cb, 1);
    pt_push(d->s, d->r, PT_ACT_FWD, fi, cf, -1);
    pt_push(d->s, d->r, PT_ACT_BWD, bi, cb, -1);
    pt_emit_msg(d->s, d->r, PT_ACT_FWD, fi, cf, 0);
    pt_emit_msg(d->s, d->r, PT_ACT_BWD, bi, cb, 0);
}

static void pt_dpv_w(pt_dpv *d) {
    int k = d->wq[d->wq_head++];
    pt_emit(d->s, d->r, PT_ACT_BWD_WEIGHT, k / 2, k % 2);
}

/* DualPipeV (the phases of DeepSeek's DualPipeV, in our own words), rank r of P, m ≥ 2P:
 *   1. 2(P − r − 1) forwards of chunk 0 (the farther down the V, the fewer);
 *   2. r + 1 pairs F0 F1 (the bottom rank's F1 follows its F0 locally);
 *   3. P − r − 1 triples B1 W1 F1: zero bubble, the W right after its B, whose gradient has
 *      already left for the rank above;
 *   4. m − 2P + r + 1 steady rounds of two F&B: F0 with B1, then F1 with B0;
 *   5. P − r − 1 rounds B1, then F1 with B0 (chunk 1's last forwards);
 *   6. r + 1 pairs B1 B0, the later half split (their W's deferred; on odd ranks the split
 *      starts at the pair's B1, on even ranks at its B0);
 *   7. P − r − 1 pairs W, B0 (split);
 *   8. the r + 1 W's left. */
static void pt_build_dualpipev(pt_schedule *s, int r) {
    int P = s->pp;
    pt_dpv d = {.s = s, .r = r, .wq = pt_malloc((size_t)2 * s->m * sizeof(int))};
    for (int i = 0; i < 2 * (P - r - 1); i++) pt_dpv_f(&d, 0);
    for (int i = 0; i < r + 1; i++) pt_dpv_f(&d, 0), pt_dpv_f(&d, 1);
    for (int i = 0; i < P - r - 1; i++) {
        pt_dpv_b(&d, 1, 1);
        pt_dpv_w(&d);
        pt_dpv_f(&d, 1);
    }
    for (int i = 0; i < s->m - 2 * P + r + 1; i++) pt_dpv_fb(&d, 0), pt_dpv_fb(&d, 1);
    for (int i = 0; i < P - r - 1; i++) {
        pt_dpv_b(&d, 1, 0);
        pt_dpv_fb(&d, 1);
    }
    int half = (r + 1) / 2;
    for (int i = 0; i < r + 1; i++) {
        pt_dpv_b(&d, 1, i > half || (i == half && r % 2 == 1));
        pt_dpv_b(&d, 0, i >= half);
    }
    for (int i = 0; i < P - r - 1; i++) {
        pt_dpv_w(&d);
        pt_dpv_b(&d, 0, 1);
    }
    while (d.wq_head < d.wq_tail) pt_dpv_w(&d);
    free(d.wq);
}

static pt_status pt_schedule_validate(pt_sched_kind kind, int pp, int m, int v) {
    if ((unsigned)kind >= PT_SCHED_KINDS)
        return pt_errorf(PT_ERR_CONFIG, "unknown pipeline schedule %d", (int)kind);
    const char *name = pt_sched_names[kind];
    if (pp < 1) return pt_errorf(PT_ERR_CONFIG, "%s schedule: pp = %d, needs at least 1 pipeline rank", name, pp);
    if (m < 1) return pt_errorf(PT_ERR_CONFIG, "%s schedule: %d micro-batches, needs at least 1", name, m);
    if (kind == PT_SCHED_DUALPIPEV && v != 2)
        return pt_errorf(PT_ERR_CONFIG, "dualpipev schedule: v = %d, needs v = 2 model chunks per rank (the V)",
                         v);
    if (kind == PT_SCHED_DUALPIPEV && m < 2 * pp)
        return pt_errorf(PT_ERR_CONFIG,
                         "dualpipev schedule: %d micro-batches, needs at least 2·pp = %d (every rank's steady "
                         "phase needs micro-batches in flight on both chunks)",
                         m, 2 * pp);
    if (kind != PT_SCHED_INTERLEAVED && kind != PT_SCHED_DUALPIPEV && v != 1)
        return pt_errorf(PT_ERR_CONFIG,
                         "%s schedule: v = %d, needs v = 1 model chunk per rank (only interleaved and "
                         "dualpipev take more)",
                         name, v);
    if (kind == PT_SCHED_INTERLEAVED && v < 2)
        return pt_errorf(PT_ERR_CONFIG, "interleaved schedule: v = %d, needs v >= 2 model chunks per rank", v);
    if ((double)pp * m * v > PT_SCHED_MAX_CELLS)
        return pt_errorf(PT_ERR_CONFIG, "%s schedule: pp·m·v = %d·%d·%d is too large (at most %d)", name, pp, m,
                         v, PT_SCHED_MAX_CELLS);
    return PT_OK;
}

/* Every rank's list, from scratch. */
static void pt_build_lists(pt_schedule *s) {
    for (int r = 0; r < s->pp; r++) {
        s->n[r] = 0;
        switch (s->kind) {
        case PT_SCHED_AFAB: pt_build_afab(s, r); break;
        case PT_SCHED_1F1B: pt_build_1f1b(s, r, 0); break;
        case PT_SCHED_ZB: pt_build_1f1b(s, r, 1); break;
        case PT_SCHED_INTERLEAVED: pt_build_interleaved(s, r); break;
        case PT_SCHED_DUALPIPEV: pt_build_dualpipev(s, r); break;
        }
    }
}

static double pt_duration(const pt_schedule *s, const pt_sched_sim *sim, int r, const pt_action *x);

static int pt_find_act(const pt_schedule *s, int r, pt_act_kind kind, int micro) {
    for (int k = 0; k < s->n[r]; k++)
        if (s->a[r][k].kind == kind && s->a[r][k].micro == micro) return k;
    return -1;
}

static void pt_insert_act(pt_schedule *s, int r, int k, pt_action x) {
    memmove(&s->a[r][k + 1], &s->a[r][k], (size_t)(s->n[r] - k) * sizeof x);
    s->a[r][k] = x;
    s->n[r]++;
}

/* Where a rank joins the HEADs: HEAD(i) right before its action `kind` of micro-batch i + d (with
 * that action's receive), kept within the places HEAD(i) may take (pt_head_insert). */
typedef struct {
    pt_act_kind kind;
    int d;
} pt_head_rule;

/* Inserts every HEAD into lists that have none, rank r's by rule[r]. HEAD(i) may go anywhere after
 * the rank's forward of i (and that forward's send) and its HEAD(i − 1), up to its backward of i
 * (with that backward's receive): the last stage's backward needs the head's gradient and every
 * other rank's waits for it, and the head needs every rank's forward. */
static void pt_head_insert(pt_schedule *s, const pt_head_rule *rule) {
    for (int r = 0; r < s->pp; r++)
        for (int i = 0; i < s->m; i++) {
            int n = s->n[r], lo = pt_find_act(s, r, PT_ACT_FWD, i) + 1, at = n, hi;
            if (i > 0 && pt_find_act(s, r, PT_ACT_HEAD, i - 1) + 1 > lo) lo = pt_find_act(s, r, PT_ACT_HEAD, i - 1) + 1;
            while (lo < n && s->a[r][lo].kind == PT_ACT_SEND_FWD) lo++;
            for (hi = lo; hi < n; hi++) {
                const pt_action *y = &s->a[r][hi];
                if (y->micro == i && (pt_is_bwd_input(y->kind) || y->kind == PT_ACT_RECV_BWD)) break;
            }
            int j = i + rule[r].d, k = j >= 0 && j < s->m ? pt_find_act(s, r, rule[r].kind, j) : -1;
            if (k >= 0) { /* before the action's receive, when it has one just before it */
                pt_act_kind recv = rule[r].kind == PT_ACT_FWD ? PT_ACT_RECV_FWD : PT_ACT_RECV_BWD;
                at = k > 0 && s->a[r][k - 1].kind == recv && s->a[r][k - 1].micro == j ? k - 1 : k;
            }
            at = at < lo ? lo : at > hi ? hi : at;
            pt_insert_act(s, r, at, (pt_action){PT_ACT_HEAD, i, 0, -1});
        }
}

/* The makespan of lists `base` (no HEADs) with the HEADs placed by rule, at unit costs (f = 1,
 * b = 2, or B = W = 1 for zb) and HEAD's cost h; HUGE_VAL when they do not check. */
static double pt_head_makespan(pt_schedule *s, const pt_schedule *base, const pt_head_rule *rule, double h) {
    for (int r = 0; r < s->pp; r++) {
        memcpy(s->a[r], base->a[r], (size_t)base->n[r] * sizeof **s->a);
        s->n[r] = base->n[r];
    }
    pt_head_insert(s, rule);
    int zb = s->kind == PT_SCHED_ZB;
    pt_sched_sim sim;
    if (pt_schedule_simulate_head(s, 1, zb ? 1 : 2, zb ? 1 : 0, h, &sim) != PT_OK) return HUGE_VAL;
    double t = sim.makespan;
    pt_sched_sim_free(&sim);
    return t;
}

/* The most simulation work (actions × simulations) a placement may take; above it the HEADs stay at
 * their latest places. */
enum { PT_HEAD_PLACE_WORK = 1 << 24 };

/* Another placement, one HEAD at a time: HEAD(i) of every rank but the last goes where the
 * simulation of the lists so far (the later HEADs at their latest places) says the rank is when the
 * last rank arrives at it: the place of its range that costs least, a rank early idling alone, a
 * late one making the pp − 1 others idle. */
static void pt_head_align(pt_schedule *s, double h) {
    int last = s->pp - 1, zb = s->kind == PT_SCHED_ZB;
    size_t acts = 0;
    for (int r = 0; r < s->pp; r++) acts += (size_t)s->n[r];
    if (acts * (size_t)s->m > PT_HEAD_PLACE_WORK) return;
    for (int i = 0; i < s->m; i++) {
        pt_sched_sim sim;
        if (pt_schedule_simulate_head(s, 1, zb ? 1 : 2, zb ? 1 : 0, h, &sim) != PT_OK) return;
        int kl = pt_find_act(s, last, PT_ACT_HEAD, i);
        double T = kl > 0 ? sim.start[last][kl - 1] + pt_duration(s, &sim, last, &s->a[last][kl - 1]) : 0;
        for (int r = 0; r < last; r++) {
            int kh = pt_find_act(s, r, PT_ACT_HEAD, i), lo = pt_find_act(s, r, PT_ACT_FWD, i) + 1;
            int prev = i > 0 ? pt_find_act(s, r, PT_ACT_HEAD, i - 1) + 1 : 0, best = kh;
            lo = lo > prev ? lo : prev;
            double best_cost = HUGE_VAL;
            for (int k = kh; k >= lo; k--) { /* ties: the later place */
                pt_act_kind kind = s->a[r][k].kind;
                if (k < kh && (kind == PT_ACT_SEND_FWD || kind == PT_ACT_SEND_BWD)) continue;
                double at = k > 0 ? sim.start[r][k - 1] + pt_duration(s, &sim, r, &s->a[r][k - 1]) : 0;
                double c = at < T ? T - at : (double)last * (at - T);
                if (c < best_cost - 1e-9) best_cost = c, best = k;
            }
            pt_action x = s->a[r][kh]; /* to `best`, the actions between one place later */
            memmove(&s->a[r][best + 1], &s->a[r][best], (size_t)(kh - best) * sizeof x);
            s->a[r][best] = x;
        }
        pt_sched_sim_free(&sim);
    }
}

/* Where each rank joins HEAD(i), the head split's collective. The last rank: right before its
 * backward of i (after its forward of i). Every other rank: its latest place, right before its
 * backward of i too, would keep it from HEAD(i + 1) until the gradient of i has come back up the
 * pipeline, one micro-batch at a time. Two placements are simulated (unit costs, HEAD h) and the
 * shorter step kept: (1) per rank a rule, HEAD(i) before its forward, backward or weight pass of
 * micro-batch i + d (−pp ≤ d ≤ pp), each rank in turn taking the rule that shortens the step most,
 * the others' as chosen so far, over two passes (ties keep the rule it has): what small pipelines
 * need (afab at pp 2); (2) pt_head_align's, one HEAD at a time where the rank is when the last
 * arrives: what deep ones need. Simulated makespans, m = 8, h = 0.5 (f = b = w = 1 for zb, b = 2
 * for 1f1b), latest places -> these: zb pp 2 36 -> 29, pp 4 52 -> 31, pp 8 -> 35 (m = 64: 231,
 * the step without a head 199 and the heads 32 per rank: no idle added); 1f1b pp 2 44 -> 37,
 * pp 4 76 -> 48. */
static void pt_place_heads(pt_schedule *s, double h) {
    static const pt_act_kind kinds[] = {PT_ACT_FWD, PT_ACT_BWD_INPUT, PT_ACT_BWD_WEIGHT};
    int zb = s->kind == PT_SCHED_ZB, nk = zb ? 3 : 2, pp = s->pp;
    size_t acts = 0;
    for (int r = 0; r < pp; r++) acts += (size_t)s->n[r];
    pt_head_rule *rule = pt_malloc((size_t)pp * sizeof *rule);
    for (int r = 0; r < pp; r++) rule[r] = (pt_head_rule){zb ? PT_ACT_BWD_INPUT : PT_ACT_BWD, 0};
    /* the lists without their HEADs */
    pt_schedule base = *s;
    base.n = pt_calloc((size_t)pp, sizeof *base.n);
    base.a = pt_calloc((size_t)pp, sizeof *base.a);
    for (int r = 0; r < pp; r++) {
        base.a[r] = pt_malloc((size_t)s->n[r] * sizeof **base.a);
        for (int k = 0; k < s->n[r]; k++)
            if (s->a[r][k].kind != PT_ACT_HEAD) base.a[r][base.n[r]++] = s->a[r][k];
    }
    if (acts * (size_t)(2 * (pp - 1) * nk * (2 * pp + 1)) <= PT_HEAD_PLACE_WORK) {
        double best = pt_head_makespan(s, &base, rule, h);
        for (int pass = 0; pass < 2; pass++)
            for (int r = 0; r < pp - 1; r++) {
                pt_head_rule keep = rule[r];
                for (int k = 0; k < nk; k++)
                    for (int d = -pp; d <= pp; d++) {
                        rule[r] = (pt_head_rule){k == 1 && !zb ? PT_ACT_BWD : kinds[k], d};
                        double t = pt_head_makespan(s, &base, rule, h);
                        if (t < best - 1e-9) best = t, keep = rule[r];
                    }
                rule[r] = keep;
            }
    }
    double by_rule = pt_head_makespan(s, &base, rule, h); /* the lists as chosen */
    /* or aligned one HEAD at a time from their latest places, when that is shorter */
    pt_schedule aligned = *s;
    aligned.n = pt_malloc((size_t)pp * sizeof *aligned.n);
    aligned.a = pt_malloc((size_t)pp * sizeof *aligned.a);
    for (int r = 0; r < pp; r++) rule[r] = (pt_head_rule){zb ? PT_ACT_BWD_INPUT : PT_ACT_BWD, 0};
    for (int r = 0; r < pp; r++) {
        aligned.a[r] = pt_malloc((size_t)(base.n[r] + s->m) * sizeof **aligned.a);
        memcpy(aligned.a[r], base.a[r], (size_t)base.n[r] * sizeof **aligned.a);
        aligned.n[r] = base.n[r];
    }
    pt_head_insert(&aligned, rule);
    pt_head_align(&aligned, h);
    pt_sched_sim sim;
    if (pt_schedule_simulate_head(&aligned, 1, zb ? 1 : 2, zb ? 1 : 0, h, &sim) == PT_OK) {
        if (sim.makespan < by_rule - 1e-9)
            for (int r = 0; r < pp; r++) {
                memcpy(s->a[r], aligned.a[r], (size_t)aligned.n[r] * sizeof **s->a);
                s->n[r] = aligned.n[r];
            }
        pt_sched_sim_free(&sim);
    }
    for (int r = 0; r < pp; r++) free(aligned.a[r]);
    free(aligned.a);
    free(aligned.n);
    free(rule);
    for (int r = 0; r < pp; r++) free(base.a[r]);
    free(base.a);
    free(base.n);
}

pt_status pt_schedule_build_head(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v, double head) {
    memset(s, 0, sizeof *s);
    if (head > 0 && kind != PT_SCHED_AFAB && kind != PT_SCHED_1F1B && kind != PT_SCHED_ZB)
        return pt_errorf(PT_ERR_CONFIG,
                         "%s schedule: the head split over the pipeline ranks needs the afab, 1f1b or zb "
                         "schedule (one model chunk per rank, every backward of a micro-batch after its head)",
                         pt_schedule_kind_name(kind));
    PT_TRY(pt_schedule_validate(kind, pp, m, v));
    *s = (pt_schedule){.kind = kind, .pp = pp, .m = m, .v = v, .head = head > 0};
    s->n = pt_calloc((size_t)pp, sizeof *s->n);
    s->a = pt_calloc((size_t)pp, sizeof *s->a);
    for (int r = 0; r < pp; r++) s->a[r] = pt_calloc((size_t)PT_SCHED_ACTS_PER_CELL * m * v, sizeof **s->a);
    pt_build_lists(s);
    if (s->head && pp > 1) {
        pt_place_heads(s, head);
        if (pt_schedule_check(s) != PT_OK) pt_build_lists(s); /* (not seen): the latest places */
    }
    return PT_OK;
}

pt_status pt_schedule_build(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v) {
    return pt_schedule_build_head(s, kind, pp, m, v, 0);
}

pt_status pt_schedule_set_weights(pt_schedule *s, const double *w) {
    int S = s->pp * s->v;
    for (int st = 0; w && st < S; st++)
        if (!(w[st] > 0))
            return pt_errorf(PT_ERR_CONFIG, "schedule: stage %d's weight %g, needs > 0 (its relative cost)", st,
                             w[st]);
    free(s->weight);
    s->weight = NULL;
    if (w) {
        s->weight = pt_malloc((size_t)S * sizeof *s->weight);
        memcpy(s->weight, w, (size_t)S * sizeof *s->weight);
    }
    return PT_OK;
}

void pt_schedule_free(pt_schedule *s) {
    free(s->weight);
    for (int r = 0; s->a && r < s->pp; r++) free(s->a[r]);
    free(s->a);
    free(s->n);
    memset(s, 0, sizeof *s);
}

double pt_schedule_bubble_formula(const pt_schedule *s) {
    if (s->kind == PT_SCHED_ZB || s->kind == PT_SCHED_DUALPIPEV) return -1;
    int S = s->pp * s->v;
    if (s->weight) { /* afab: a flow shop, Σw + (m − 1)·max w stage-times long */
        if (s->kind != PT_SCHED_AFAB) return -1;
        double sum = 0, most = 0;
        for (int st = 0; st < S; st++) sum += s->weight[st], most = fmax(most, s->weight[st]);
        return (s->pp * (sum + (s->m - 1) * most) - s->m * sum) / (s->m * sum);
    }
    int short_by = s->m < s->pp ? s->pp - s->m : 0;
    return (double)(s->pp - 1 + (s->v - 1) * short_by) / ((double)s->v * s->m);
}

double pt_schedule_bubble_bound(const pt_schedule *s) {
    double sum = 0, most = 0;
    for (int r = 0; r < s->pp; r++) {
        double mine = 0;
        for (int c = 0; c < s->v; c++) mine += s->weight ? s->weight[pt_stage(s, r, c)] : 1.0;
        sum += mine, most = fmax(most, mine);
    }
    return s->pp * most / sum - 1;
}

double pt_schedule_idle_formula(const pt_schedule *s, double f, double b, double w) {
    if (s->kind != PT_SCHED_DUALPIPEV) return -1;
    double stages = 2.0 * s->pp, fb = f + b + w, full_b = b + w;
    return (stages / 2 - 1) * (fb + full_b - 3 * w);
}

int pt_schedule_peak_formula(const pt_schedule *s) {
    return s->kind == PT_SCHED_DUALPIPEV ? 2 * s->pp + 1 : -1;
}

/* ---- symbolic execution: the checker and the simulator --------------------------------- */

/* What has happened to one (rank, micro-batch, chunk). */
enum {
    PT_DID_RECV_FWD = 1 << 0,
    PT_DID_FWD = 1 << 1,
    PT_DID_SEND_FWD = 1 << 2,
    PT_DID_RECV_BWD = 1 << 3,
    PT_DID_BIN = 1 << 4,   /* input gradient: BWD or BWD_INPUT */
    PT_DID_FULL = 1 << 5,  /* ... and it was a full BWD */
    PT_DID_W = 1 << 6,
    PT_DID_SEND_BWD = 1 << 7,
};

typedef struct {
    const pt_schedule *s;
    const double *cost;     /* per action kind; NULL when only checking */
    unsigned char *did;     /* [r][micro][chunk] PT_DID_* */
    int *sent[2];           /* [dst r][micro][dst chunk]: 1 + the sender's action index (0: unsent); fwd, bwd */
    double *sent_t[2];      /* the timed run: when it arrived (valid once it has) */
    int *pc, *inflight, *peak;
    unsigned char *headed;  /* [micro]: HEAD ran (on every rank at once) */
    double *t;              /* each rank's clock */
    double **start;         /* optional: start[r][k] */
} pt_exec;

static size_t pt_cell(const pt_schedule *s, int r, int micro, int chunk) {
    return ((size_t)r * s->m + micro) * s->v + chunk;
}

/* The cell of a SEND's or RECV's message on its receiver: [dst r][micro][dst chunk]. */
static size_t pt_msg_cell(const pt_schedule *s, int r, const pt_action *x);

/* "RECV_FWD micro 3 chunk 0 from rank 1", "HEAD micro 3" */
static const char *pt_desc(const pt_action *x, char *buf, size_t len) {
    const char *dir = x->kind == PT_ACT_SEND_FWD || x->kind == PT_ACT_SEND_BWD ? " to" : " from";
    if (x->kind == PT_ACT_HEAD)
        snprintf(buf, len, "HEAD micro %d", x->micro);
    else if (pt_is_compute(x->kind))
        snprintf(buf, len, "%s micro %d chunk %d", pt_schedule_action_name(x->kind), x->micro, x->chunk);
    else
        snprintf(buf, len, "%s micro %d chunk %d%s rank %d", pt_schedule_action_name(x->kind), x->micro,
                 x->chunk, dir, x->peer);
    return buf;
}

/* "schedule: rank R action K (DESC): WHAT", as a PT_ERR_CONFIG. */
__attribute__((format(printf, 4, 5))) static pt_status pt_act_err(const pt_schedule *s, int r, int k,
                                                                  const char *fmt, ...) {
    char what[600], d[96];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return pt_errorf(PT_ERR_CONFIG, "schedule: rank %d action %d (%s): %s", r, k,
                     pt_desc(&s->a[r][k], d, sizeof d), what);
}

/* The stage a message of `x` (on rank r) goes to or comes from, or -1 past either end. */
static int pt_msg_stage(const pt_schedule *s, int r, const pt_action *x) {
    int st = pt_stage(s, r, x->chunk);
    int to = x->kind == PT_ACT_SEND_FWD || x->kind == PT_ACT_RECV_BWD ? st + 1 : st - 1;
    return to < 0 || to > pt_last_stage(s) ? -1 : to;
}

static size_t pt_msg_cell(const pt_schedule *s, int r, const pt_action *x) {
    if (x->kind == PT_ACT_RECV_FWD || x->kind == PT_ACT_RECV_BWD) return pt_cell(s, r, x->micro, x->chunk);
    return pt_cell(s, x->peer, x->micro, pt_stage_chunk(s, pt_msg_stage(s, r, x)));
}

/* Fields in range, and a message's peer the rank of the neighbouring stage. */
static pt_status pt_check_fields(const pt_schedule *s, int r, int k) {
    const pt_action *x = &s->a[r][k];
    if ((unsigned)x->kind >= PT_ACT_KINDS)
        return pt_errorf(PT_ERR_CONFIG, "schedule: rank %d action %d: unknown action kind %d", r, k, (int)x->kind);
    if (x->micro < 0 || x->micro >= s->m || x->chunk < 0 || x->chunk >= s->v)
        return pt_act_err(s, r, k, "micro-batch must be in [0, %d) and chunk in [0, %d)", s->m, s->v);
    if (x->kind == PT_ACT_HEAD) {
        if (!s->head) return pt_act_err(s, r, k, "a HEAD in a schedule without the head split (head = 0)");
        if (x->chunk != 0 || x->peer != -1)
            return pt_act_err(s, r, k, "chunk %d, peer %d: a HEAD has chunk 0 and peer -1", x->chunk, x->peer);
        return PT_OK;
    }
    if (pt_is_compute(x->kind))
        return x->peer == -1 ? PT_OK : pt_act_err(s, r, k, "peer %d, but computation has none (-1)", x->peer);
    int to = pt_msg_stage(s, r, x), st = pt_stage(s, r, x->chunk);
    if (to < 0)
        return pt_act_err(s, r, k, "stage %d is the %s stage, there is no neighbour in that direction", st,
                          st == 0 ? "first" : "last");
    if (pt_stage_rank(s, to) == r)
        return pt_act_err(s, r, k, "stage %d is on this rank too: the hand-off is local, without a message",
                          to);
    if (x->peer != pt_stage_rank(s, to))
        return pt_act_err(s, r, k, "the neighbouring stage %d is on rank %d, not rank %d", to,
                          pt_stage_rank(s, to), x->peer);
    return PT_OK;
}

static pt_status pt_exec_recv(pt_exec *e, int r, int k, int *advanced) {
    const pt_schedule *s = e->s;
    const pt_action *x = &s->a[r][k];
    int bwd = x->kind == PT_ACT_RECV_BWD, flag = bwd ? PT_DID_RECV_BWD : PT_DID_RECV_FWD;
    size_t c = pt_cell(s, r, x->micro, x->chunk);
    if (e->did[c] & flag) return pt_act_err(s, r, k, "received a second time");
    if (!e->sent[bwd][c]) return PT_OK; /* blocks until the peer sends */
    e->did[c] |= flag;
    if (e->t[r] < e->sent_t[bwd][c]) e->t[r] = e->sent_t[bwd][c];
    *advanced = 1;
    return PT_OK;
}

static pt_status pt_exec_send(pt_exec *e, int r, int k) {
    const pt_schedule *s = e->s;
    const pt_action *x = &s->a[r][k];
    int bwd = x->kind == PT_ACT_SEND_BWD;
    size_t c = pt_cell(s, r, x->micro, x->chunk);
    int need = bwd ? PT_DID_BIN : PT_DID_FWD, flag = bwd ? PT_DID_SEND_BWD : PT_DID_SEND_FWD;
    if (!(e->did[c] & need))
        return pt_act_err(s, r, k, "sent before the %s that computes it", bwd ? "backward" : "forward");
    if (e->did[c] & flag) return pt_act_err(s, r, k, "sent a second time");
    e->did[c] |= flag;
    e->sent[bwd][pt_msg_cell(s, r, x)] = k + 1;
    return PT_OK;
}

/* What rank q's next action, a HEAD, needs of the rank itself: on the last stage's rank, the
 * forward of that micro-batch (its output is the head's input). */
static pt_status pt_head_arrive(const pt_exec *e, int q) {
    const pt_schedule *s = e->s;
    int k = e->pc[q], last = pt_last_stage(s);
    PT_TRY(pt_check_fields(s, q, k));
    const pt_action *x = &s->a[q][k];
    if (q == pt_stage_rank(s, last) && !(e->did[pt_cell(s, q, x->micro, pt_stage_chunk(s, last))] & PT_DID_FWD))
        return pt_act_err(s, q, k, "runs before this rank's FWD of micro %d (the last stage's output is the head's input)",
                          x->micro);
    if (e->headed[x->micro]) return pt_act_err(s, q, k, "runs a second time (HEAD micro %d ran already)", x->micro);
    return PT_OK;
}

/* HEAD(i), a collective over all ranks: waits until every rank's next action is HEAD(i), then
 * runs on all of them at once, from the latest of their clocks. Another rank waiting at another
 * HEAD can never meet this one: the order of the collectives differs. Rank r's own clock, start
 * and pc are advanced by the caller. */
static pt_status pt_exec_head(pt_exec *e, int r, int k, int *advanced) {
    const pt_schedule *s = e->s;
    int micro = s->a[r][k].micro, all = 1;
    PT_TRY(pt_head_arrive(e, r));
    for (int q = 0; q < s->pp; q++) {
        const pt_action *y = e->pc[q] < s->n[q] ? &s->a[q][e->pc[q]] : NULL;
        if (!y || y->kind != PT_ACT_HEAD) {
            all = 0;
            continue;
        }
        if (y->micro != micro)
            return pt_act_err(s, r, k,
                              "collective order: rank %d waits at HEAD micro %d (action %d); every rank must "
                              "run the HEADs in the same order",
                              q, y->micro, e->pc[q]);
    }
    if (!all) return PT_OK; /* blocks until every rank is here */
    double t0 = 0;
    for (int q = 0; q < s->pp; q++) {
        PT_TRY(pt_head_arrive(e, q));
        if (e->t[q] > t0) t0 = e->t[q];
    }
    for (int q = 0; q < s->pp; q++) {
        e->t[q] = t0;
        if (q == r) continue;
        if (e->start) e->start[q][e->pc[q]] = t0;
        if (e->cost) e->t[q] += e->cost[PT_ACT_HEAD];
        e->pc[q]++;
    }
    e->headed[micro] = 1;
    *advanced = 1;
    return PT_OK;
}

/* A forward needs the previous stage's activations: received, or computed here (local hand-off). */
static pt_status pt_exec_fwd(pt_exec *e, int r, int k) {
    const pt_schedule *s = e->s;
    const pt_action *x = &s->a[r][k];
    size_t c = pt_cell(s, r, x->micro, x->chunk);
    int st = pt_stage(s, r, x->chunk);
    if (e->did[c] & PT_DID_FWD) return pt_act_err(s, r, k, "runs a second time");
    if (st > 0) {
        int pr = pt_stage_rank(s, st - 1), pc = pt_stage_chunk(s, st - 1);
        if (pr != r && !(e->did[c] & PT_DID_RECV_FWD))
            return pt_act_err(s, r, k, "runs before its input arrived (no RECV_FWD from rank %d before it)", pr);
        if (pr == r && !(e->did[pt_cell(s, r, x->micro, pc)] & PT_DID_FWD))
            return pt_act_err(s, r, k, "runs before the forward of chunk %d (stage %d) on this rank", pc, st - 1);
    }
    e->did[c] |= PT_DID_FWD;
    if (++e->inflight[r] > e->peak[r]) e->peak[r] = e->inflight[r];
    return PT_OK;
}

/* An input-gradient backward needs its own forward and the next stage's gradient. */
static pt_status pt_exec_bwd(pt_exec *e, int r, int k) {
    const pt_schedule *s = e->s;
    const pt_action *x = &s->a[r][k];
    size_t c = pt_cell(s, r, x->micro, x->chunk);
    int st = pt_stage(s, r, x->chunk);
    if (e->did[c] & PT_DID_BIN) return pt_act_err(s, r, k, "the backward of this micro-batch ran already");
    if (!(e->did[c] & PT_DID_FWD)) return pt_act_err(s, r, k, "runs before its forward");
    if (s->head && st == pt_last_stage(s) && !e->headed[x->micro])
        return pt_act_err(s, r, k, "runs before HEAD micro %d (with the head split its gradient comes from the head)",
                          x->micro);
    if (st < pt_last_stage(s)) {
        int nr = pt_stage_rank(s, st + 1), nc = pt_stage_chunk(s, st + 1);
        if (nr != r && !(e->did[c] & PT_DID_RECV_BWD))
            return pt_act_err(s, r, k, "runs before its gradient arrived (no RECV_BWD from rank %d before it)", nr);
        if (nr == r && !(e->did[pt_cell(s, r, x->micro, nc)] & PT_DID_BIN))
            return pt_act_err(s, r, k, "runs before the backward of chunk %d (stage %d) on this rank", nc, st + 1);
    }
    e->did[c] |= PT_DID_BIN | (x->kind == PT_ACT_BWD ? PT_DID_FULL : 0);
    e->inflight[r]--;
    return PT_OK;
}

static pt_status pt_exec_weight(pt_exec *e, int r, int k) {
    const pt_schedule *s = e->s;
    const pt_action *x = &s->a[r][k];
    size_t c = pt_cell(s, r, x->micro, x->chunk);
    if (e->did[c] & PT_DID_W) return pt_act_err(s, r, k, "runs a second time");
    if (e->did[c] & PT_DID_FULL)
        return pt_act_err(s, r, k, "a full BWD already computed this weight gradient");
    if (!(e->did[c] & PT_DID_BIN)) return pt_act_err(s, r, k, "runs before its BWD_INPUT");
    e->did[c] |= PT_DID_W;
    return PT_OK;
}

/* Runs rank r's next action if it can; *advanced says whether it did. */
static pt_status pt_exec_step(pt_exec *e, int r, int *advanced) {
    int k = e->pc[r];
    const pt_action *x = &e->s->a[r][k];
    *advanced = 0;
    PT_TRY(pt_check_fields(e->s, r, k));
    switch (x->kind) {
    case PT_ACT_RECV_FWD:
    case PT_ACT_RECV_BWD: PT_TRY(pt_exec_recv(e, r, k, advanced)); break;
    case PT_ACT_SEND_FWD:
    case PT_ACT_SEND_BWD: PT_TRY(pt_exec_send(e, r, k)); break;
    case PT_ACT_FWD: PT_TRY(pt_exec_fwd(e, r, k)); break;
    case PT_ACT_BWD:
    case PT_ACT_BWD_INPUT: PT_TRY(pt_exec_bwd(e, r, k)); break;
    case PT_ACT_BWD_WEIGHT: PT_TRY(pt_exec_weight(e, r, k)); break;
    case PT_ACT_HEAD: PT_TRY(pt_exec_head(e, r, k, advanced)); break;
    }
    if (pt_is_compute(x->kind) || x->kind == PT_ACT_SEND_FWD || x->kind == PT_ACT_SEND_BWD) *advanced = 1;
    if (!*advanced) return PT_OK;
    if (e->start) e->start[r][k] = e->t[r];
    if (e->cost) e->t[r] += e->cost[x->kind] * pt_weight(e->s, r, x);
    e->pc[r]++;
    return PT_OK;
}

/* Index of the SEND on the peer that rank r's blocked RECV `x` waits for, or -1. */
static int pt_find_send(const pt_schedule *s, int r, const pt_action *x) {
    pt_act_kind want = x->kind == PT_ACT_RECV_FWD ? PT_ACT_SEND_FWD : PT_ACT_SEND_BWD;
    int chunk = pt_stage_chunk(s, pt_msg_stage(s, r, x));
    for (int j = 0; j < s->n[x->peer]; j++) {
        const pt_action *y = &s->a[x->peer][j];
        if (y->kind == want && y->micro == x->micro && y->chunk == chunk && y->peer == r) return j;
    }
    return -1;
}

/* A rank that a HEAD of this micro-batch waits for: one without such a HEAD left in its list
 * (finished, or the HEAD missing) if there is one (*missing = 1), else one not at it (-1: none). */
static int pt_head_waits_for(const pt_exec *e, int micro, int *missing) {
    const pt_schedule *s = e->s;
    int late = -1;
    for (int q = 0; q < s->pp; q++) {
        int j = e->pc[q];
        while (j < s->n[q] && !(s->a[q][j].kind == PT_ACT_HEAD && s->a[q][j].micro == micro)) j++;
        if (j == s->n[q]) {
            *missing = 1;
            return q;
        }
        if (j > e->pc[q] && late < 0) late = q;
    }
    *missing = 0;
    return late;
}

/* Every rank that did not finish waits at a RECV or a HEAD. A RECV whose SEND exists nowhere, or a
 * HEAD that some rank will never reach, is the cause; otherwise the ranks wait on each other in a
 * cycle: name the first and list them all. */
static pt_status pt_report_deadlock(const pt_exec *e) {
    const pt_schedule *s = e->s;
    char blocked[600] = "", d[96];
    int first = -1;
    size_t len = 0;
    for (int r = 0; r < s->pp; r++) {
        if (e->pc[r] >= s->n[r]) continue;
        const pt_action *x = &s->a[r][e->pc[r]];
        int missing, q = x->kind == PT_ACT_HEAD ? pt_head_waits_for(e, x->micro, &missing) : -1;
        if (x->kind == PT_ACT_HEAD && missing)
            return pt_act_err(s, r, e->pc[r],
                              "rank %d has no HEAD of micro %d left to run (from its action %d on; the head is "
                              "a collective over all %d pipeline ranks)",
                              q, x->micro, e->pc[q], s->pp);
        if (x->kind != PT_ACT_HEAD && pt_find_send(s, r, x) < 0)
            return pt_act_err(s, r, e->pc[r], "rank %d has no matching %s (micro %d chunk %d to rank %d)", x->peer,
                              x->kind == PT_ACT_RECV_FWD ? "SEND_FWD" : "SEND_BWD", x->micro,
                              pt_stage_chunk(s, pt_msg_stage(s, r, x)), r);
        if (first < 0) first = r;
        if (len < sizeof blocked)
            len += (size_t)snprintf(blocked + len, sizeof blocked - len, "%srank %d at action %d (%s)",
                                    len ? ", " : "", r, e->pc[r], pt_desc(x, d, sizeof d));
    }
    const pt_action *x = &s->a[first][e->pc[first]];
    if (x->kind == PT_ACT_HEAD) {
        int missing, q = pt_head_waits_for(e, x->micro, &missing);
        PT_ASSERT(q >= 0 && !missing);
        return pt_act_err(s, first, e->pc[first],
                          "deadlock: the collective HEAD micro %d waits for rank %d, blocked at its action %d "
                          "(%s); blocked: %s",
                          x->micro, q, e->pc[q], pt_desc(&s->a[q][e->pc[q]], d, sizeof d), blocked);
    }
    return pt_act_err(s, first, e->pc[first],
                      "deadlock: waits for rank %d action %d (%s), which rank %d never reaches; blocked: %s",
                      x->peer, pt_find_send(s, first, x), x->kind == PT_ACT_RECV_FWD ? "SEND_FWD" : "SEND_BWD",
                      x->peer, blocked);
}

/* After a complete run: every message received, every (rank, micro, chunk) fully computed. */
static pt_status pt_check_complete(const pt_exec *e) {
    const pt_schedule *s = e->s;
    static const char *const dir[2] = {"FWD", "BWD"};
    for (int r = 0; r < s->pp; r++) {
        for (int i = 0; i < s->m; i++) {
            for (int c = 0; c < s->v; c++) {
                size_t cell = pt_cell(s, r, i, c);
                unsigned did = e->did[cell];
                for (int b = 0; b < 2; b++) {
                    if (!e->sent[b][cell] || (did & (b ? PT_DID_RECV_BWD : PT_DID_RECV_FWD))) continue;
                    int from = pt_stage(s, r, c) + (b ? 1 : -1);
                    return pt_errorf(PT_ERR_CONFIG,
                                     "schedule: rank %d action %d (SEND_%s micro %d chunk %d to rank %d): "
                                     "never received (rank %d has no RECV_%s for micro %d chunk %d)",
                                     pt_stage_rank(s, from), e->sent[b][cell] - 1, dir[b], i,
                                     pt_stage_chunk(s, from), r, r, dir[b], i, c);
                }
                const char *missing = !(did & PT_DID_FWD)   ? "FWD"
                                      : !(did & PT_DID_BIN) ? "BWD (or BWD_INPUT)"
                                      : !(did & (PT_DID_FULL | PT_DID_W)) ? "BWD_WEIGHT"
                                                                         : NULL;
                if (missing)
                    return pt_errorf(PT_ERR_CONFIG, "schedule: rank %d never runs %s of micro %d chunk %d (stage %d)",
                                     r, missing, i, c, pt_stage(s, r, c));
            }
        }
    }
    for (int i = 0; s->head && i < s->m; i++)
        if (!e->headed[i])
            return pt_errorf(PT_ERR_CONFIG,
                             "schedule: HEAD of micro %d never runs (the head split needs one per micro-batch on "
                             "every rank)",
                             i);
    return PT_OK;
}

static void pt_exec_free(pt_exec *e) {
    free(e->did);
    for (int b = 0; b < 2; b++) {
        free(e->sent[b]);
        free(e->sent_t[b]);
    }
    free(e->pc);
    free(e->inflight);
    free(e->peak);
    free(e->headed);
    free(e->t);
}

/* The executor's state for schedule s (checked: not empty). */
static void pt_exec_alloc(pt_exec *e) {
    const pt_schedule *s = e->s;
    size_t cells = (size_t)s->pp * s->m * s->v;
    e->did = pt_calloc(cells, 1);
    for (int b = 0; b < 2; b++) {
        e->sent[b] = pt_calloc(cells, sizeof(int));
        e->sent_t[b] = pt_calloc(cells, sizeof(double));
    }
    e->pc = pt_calloc((size_t)s->pp, sizeof(int));
    e->inflight = pt_calloc((size_t)s->pp, sizeof(int));
    e->peak = pt_calloc((size_t)s->pp, sizeof(int));
    e->headed = pt_calloc((size_t)s->m, 1);
    e->t = pt_calloc((size_t)s->pp, sizeof(double));
}

static pt_status pt_exec_shape(const pt_schedule *s) {
    if (!s || s->pp < 1 || s->m < 1 || s->v < 1 || !s->n || !s->a)
        return pt_errorf(PT_ERR_CONFIG, "schedule: empty or malformed (pp, m and v must be >= 1)");
    return PT_OK;
}

/* Executes all ranks with blocking receives, in rounds, until nobody can move. The partial order
 * the messages impose does not depend on the interleaving, so one run decides termination. */
static pt_status pt_exec_run(pt_exec *e) {
    const pt_schedule *s = e->s;
    PT_TRY(pt_exec_shape(s));
    pt_exec_alloc(e);
    for (int progress = 1; progress;) {
        progress = 0;
        for (int r = 0; r < s->pp; r++) {
            for (int advanced = 1; advanced && e->pc[r] < s->n[r];) {
                PT_TRY(pt_exec_step(e, r, &advanced));
                progress |= advanced;
            }
        }
    }
    for (int r = 0; r < s->pp; r++)
        if (e->pc[r] < s->n[r]) return pt_report_deadlock(e);
    return pt_check_complete(e);
}

pt_status pt_schedule_check(const pt_schedule *s) {
    pt_exec e = {.s = s};
    pt_status st = pt_exec_run(&e);
    pt_exec_free(&e);
    return st;
}

/* ---- the timed run: events in time order ------------------------------------------------
 * Each rank is at an action boundary (where it calls into the comm layer: it polls), computing
 * until its next one, or blocked at a RECV or a HEAD (polling all the while). A message without
 * the rendezvous leaves when sent, after the previous one on its link and direction, and arrives
 * `delay` later. With it, the sender's request reaches the receiver `latency` after the SEND;
 * the receiver answers at its first poll from then on; the answer takes `latency`; the data
 * leaves at the sender's first poll after the answer arrived (then as without). That is Open
 * MPI's rendezvous over TCP for a message past the eager limit, with no progress thread. */

enum { PT_EV_READY, PT_EV_RTS, PT_EV_ACK, PT_EV_DATA };
typedef struct {
    double t;
    long seq; /* ties: first pushed, first out */
    int kind, id;
} pt_event;

typedef struct {
    pt_exec *e;
    pt_sched_link link;
    pt_event *heap;          /* at most one event a rank and one a message: sized at set-up */
    size_t n;
    long seq;
    size_t cells;
    int *from, *next;        /* [message]: its sender; the next in the list it is in */
    unsigned char *arrived;  /* [message] */
    int *acks, *pushes;      /* [r]: messages waiting for r's poll: to answer; to send (-1 ends) */
    unsigned char *blocked;  /* [r]: polling: 1 at a RECV, 2 at a HEAD, 3 done; 0 computing */
    double *free_at[2];      /* [sender r]: when its link in that direction (fwd, bwd) is free */
} pt_timed;

static int pt_ev_before(const pt_event *a, const pt_event *b) {
    return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static void pt_ev_push(pt_timed *T, double t, int kind, int id) {
    size_t i = T->n++;
    pt_event ev = {.t = t, .seq = T->seq++, .kind = kind, .id = id};
    for (; i > 0 && pt_ev_before(&ev, &T->heap[(i - 1) / 2]); i = (i - 1) / 2) T->heap[i] = T->heap[(i - 1) / 2];
    T->heap[i] = ev;
}

static pt_event pt_ev_pop(pt_timed *T) {
    pt_event top = T->heap[0], last = T->heap[--T->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= T->n) break;
        if (c + 1 < T->n && pt_ev_before(&T->heap[c + 1], &T->heap[c])) c++;
        if (!pt_ev_before(&T->heap[c], &last)) break;
        T->heap[i] = T->heap[c];
        i = c;
    }
    if (T->n) T->heap[i] = last;
    return top;
}

/* Message id: [bwd][dst cell]. */
static int pt_msg_receiver(const pt_timed *T, int id) {
    return (int)((size_t)id % T->cells / ((size_t)T->e->s->m * T->e->s->v));
}

/* The data of message id leaves its sender at t (or once the link is free) */
static void pt_timed_data(pt_timed *T, int id, double t) {
    double *free_at = &T->free_at[(size_t)id >= T->cells][T->from[id]];
    double at = (t > *free_at ? t : *free_at) + T->link.delay;
    *free_at = at;
    pt_ev_push(T, at, PT_EV_DATA, id);
}

/* Rank r polls at t: answers the requests that reached it, sends the data it was answered for. */
static void pt_timed_poll(pt_timed *T, int r, double t) {
    for (int id = T->acks[r]; id >= 0; id = T->next[id]) pt_ev_push(T, t + T->link.latency, PT_EV_ACK, id);
    int id = T->pushes[r];
    T->acks[r] = T->pushes[r] = -1;
    while (id >= 0) { /* in the order the answers came */
        int nx = T->next[id];
        pt_timed_data(T, id, t);
        id = nx;
    }
}

static void pt_timed_list(pt_timed *T, int *head, int id) {
    int *p = head;
    while (*p >= 0) p = &T->next[*p];
    *p = id, T->next[id] = -1;
}

/* Rank r at an action boundary at time t: it polls, then runs its actions until it computes (the
 * next boundary an event) or blocks. */
static pt_status pt_timed_rank(pt_timed *T, int r, double t) {
    pt_exec *e = T->e;
    const pt_schedule *s = e->s;
    e->t[r] = t;
    T->blocked[r] = 0;
    pt_timed_poll(T, r, t);
    while (e->pc[r] < s->n[r]) {
        const pt_action *x = &s->a[r][e->pc[r]];
        int recv = x->kind == PT_ACT_RECV_FWD || x->kind == PT_ACT_RECV_BWD, adv;
        int send = x->kind == PT_ACT_SEND_FWD || x->kind == PT_ACT_SEND_BWD;
        int id = recv || send ? (int)((x->kind == PT_ACT_RECV_BWD || x->kind == PT_ACT_SEND_BWD) * T->cells +
                                      pt_msg_cell(s, r, x))
                              : -1;
        if (recv && !T->arrived[id]) {
            T->blocked[r] = 1;
            return PT_OK;
        }
        if (x->kind == PT_ACT_HEAD) { /* a collective: the last rank to arrive starts it */
            T->blocked[r] = 2;
            for (int q = 0; q < s->pp; q++)
                if (T->blocked[q] != 2) return PT_OK;
        }
        PT_TRY(pt_exec_step(e, r, &adv));
        PT_ASSERT(adv);
        if (send) {
            T->from[id] = r;
            if (T->link.rendezvous) pt_ev_push(T, t + T->link.latency, PT_EV_RTS, id);
            else pt_timed_data(T, id, t);
        } else if (x->kind == PT_ACT_HEAD) {
            for (int q = 0; q < s->pp; q++) {
                T->blocked[q] = 0;
                pt_ev_push(T, e->t[q], PT_EV_READY, q);
            }
            return PT_OK;
        } else if (!recv) {
            pt_ev_push(T, e->t[r], PT_EV_READY, r);
            return PT_OK;
        }
    }
    T->blocked[r] = 3; /* done: it waits for its sends to complete, polling */
    return PT_OK;
}

/* Runs the (checked) schedule in time order; e has its costs. */
static pt_status pt_timed_run(pt_exec *e, const pt_sched_link *link) {
    const pt_schedule *s = e->s;
    pt_timed T = {.e = e, .link = *link, .cells = (size_t)s->pp * s->m * s->v};
    pt_exec_alloc(e);
    T.heap = pt_malloc(((size_t)s->pp + 2 * T.cells) * sizeof *T.heap);
    T.from = pt_calloc(2 * T.cells, sizeof(int));
    T.next = pt_calloc(2 * T.cells, sizeof(int));
    T.arrived = pt_calloc(2 * T.cells, 1);
    T.acks = pt_malloc((size_t)s->pp * sizeof(int));
    T.pushes = pt_malloc((size_t)s->pp * sizeof(int));
    T.blocked = pt_calloc((size_t)s->pp, 1);
    for (int b = 0; b < 2; b++) T.free_at[b] = pt_calloc((size_t)s->pp, sizeof(double));
    for (int r = 0; r < s->pp; r++) {
        T.acks[r] = T.pushes[r] = -1;
        pt_ev_push(&T, 0, PT_EV_READY, r);
    }
    pt_status st = PT_OK;
    while (T.n && st == PT_OK) {
        pt_event ev = pt_ev_pop(&T);
        int q = ev.kind == PT_EV_READY ? ev.id : pt_msg_receiver(&T, ev.id);
        switch (ev.kind) {
        case PT_EV_READY: st = pt_timed_rank(&T, q, ev.t); break;
        case PT_EV_RTS: /* answered now if the receiver polls, else at its next boundary */
            if (T.blocked[q]) pt_ev_push(&T, ev.t + T.link.latency, PT_EV_ACK, ev.id);
            else pt_timed_list(&T, &T.acks[q], ev.id);
            break;
        case PT_EV_ACK:
            if (T.blocked[T.from[ev.id]]) pt_timed_data(&T, ev.id, ev.t);
            else pt_timed_list(&T, &T.pushes[T.from[ev.id]], ev.id);
            break;
        case PT_EV_DATA:
            T.arrived[ev.id] = 1;
            e->sent_t[(size_t)ev.id >= T.cells][(size_t)ev.id % T.cells] = ev.t;
            if (T.blocked[q] == 1) st = pt_timed_rank(&T, q, ev.t); /* it waits for this one, or polls on */
            break;
        }
    }
    for (int r = 0; r < s->pp && st == PT_OK; r++)
        if (e->pc[r] < s->n[r]) st = pt_report_deadlock(e);
    if (st == PT_OK) st = pt_check_complete(e);
    free(T.heap), free(T.from), free(T.next), free(T.arrived), free(T.acks), free(T.pushes), free(T.blocked);
    free(T.free_at[0]), free(T.free_at[1]);
    return st;
}

pt_status pt_schedule_simulate(const pt_schedule *s, double f, double b, double w, pt_sched_sim *out) {
    return pt_schedule_simulate_head(s, f, b, w, 0, out);
}

pt_status pt_schedule_simulate_head(const pt_schedule *s, double f, double b, double w, double h,
                                    pt_sched_sim *out) {
    return pt_schedule_simulate_transfers(s, f, b, w, h, 0, out);
}

pt_status pt_schedule_simulate_transfers(const pt_schedule *s, double f, double b, double w, double h,
                                         double delay, pt_sched_sim *out) {
    return pt_schedule_simulate_link(s, f, b, w, h, &(pt_sched_link){.delay = delay}, out);
}

pt_status pt_schedule_simulate_link(const pt_schedule *s, double f, double b, double w, double h,
                                    const pt_sched_link *link, pt_sched_sim *out) {
    memset(out, 0, sizeof *out);
    if (!(f >= 0 && b >= 0 && w >= 0 && h >= 0 && link->delay >= 0 && link->latency >= 0))
        return pt_errorf(PT_ERR_CONFIG, "schedule: costs f = %g, b = %g, w = %g, h = %g and the "
                         "transfer's %g (latency %g) must be >= 0", f, b, w, h, link->delay, link->latency);
    PT_TRY(pt_schedule_check(s));
    const double cost[PT_ACT_KINDS] = {[PT_ACT_FWD] = f, [PT_ACT_BWD] = b + w, [PT_ACT_BWD_INPUT] = b,
                                       [PT_ACT_BWD_WEIGHT] = w, [PT_ACT_HEAD] = h};
    pt_exec e = {.s = s, .cost = cost};
    e.start = pt_calloc((size_t)s->pp, sizeof *e.start);
    for (int r = 0; r < s->pp; r++) e.start[r] = pt_calloc((size_t)s->n[r] + 1, sizeof(double));
    pt_status st = pt_timed_run(&e, link);
    if (st == PT_OK) {
        *out = (pt_sched_sim){
            .pp = s->pp, .peak_inflight = e.peak, .start = e.start, .f = f, .b = b, .w = w, .h = h};
        e.peak = NULL;
        for (int r = 0; r < s->pp; r++) {
            if (e.t[r] > out->makespan) out->makespan = e.t[r];
            for (int k = 0; k < s->n[r]; k++) out->busy += cost[s->a[r][k].kind] * pt_weight(s, r, &s->a[r][k]);
        }
        out->bubble = out->busy > 0 ? (s->pp * out->makespan - out->busy) / out->busy : 0;
    } else {
        for (int r = 0; r < s->pp; r++) free(e.start[r]);
        free(e.start);
    }
    pt_exec_free(&e);
    return st;
}

void pt_sched_sim_free(pt_sched_sim *r) {
    free(r->peak_inflight);
    for (int i = 0; r->start && i < r->pp; i++) free(r->start[i]);
    free(r->start);
    memset(r, 0, sizeof *r);
}

/* ---- drawing --------------------------------------------------------------------------- */

/* How long rank r's action x took in the simulation sim (its stage's weight included). */
static double pt_duration(const pt_schedule *s, const pt_sched_sim *sim, int r, const pt_action *x) {
    double w = pt_weight(s, r, x);
    switch (x->kind) {
    case PT_ACT_FWD: return sim->f * w;
    case PT_ACT_BWD: return (sim->b + sim->w) * w;
    case PT_ACT_BWD_INPUT: return sim->b * w;
    case PT_ACT_BWD_WEIGHT: return sim->w * w;
    case PT_ACT_HEAD: return sim->h;
    default: return 0;
    }
}

/* The time one column stands for: the shortest computation that occurs. */
static double pt_quantum(const pt_schedule *s, const pt_sched_sim *sim) {
    double q = 0;
    for (int r = 0; r < s->pp; r++) {
        for (int k = 0; k < s->n[r]; k++) {
            double d = pt_duration(s, sim, r, &s->a[r][k]);
            if (d > 0 && (q == 0 || d < q)) q = d;
        }
    }
    return q > 0 ? q : 1;
}

static char pt_kind_char(const pt_action *x) {
    char c = x->kind == PT_ACT_FWD ? 'F' : x->kind == PT_ACT_BWD_WEIGHT ? 'W' : x->kind == PT_ACT_HEAD ? 'H' : 'B';
    return x->chunk % 2 ? (char)tolower(c) : c;
}

static char pt_micro_char(int micro) {
    static const char digits[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    return digits[micro % 36];
}

void pt_schedule_print(const pt_schedule *s, const pt_sched_sim *sim, FILE *f) {
    double q = pt_quantum(s, sim);
    int cols = (int)ceil(sim->makespan / q - 1e-9);
    char *kinds = pt_malloc((size_t)cols + 1), *micros = pt_malloc((size_t)cols + 1);
    char head[96] = "";
    if (s->head) snprintf(head, sizeof head, " H=%g (the head split over the %d ranks)", sim->h, s->pp);
    fprintf(f, "%s, pp=%d, m=%d, v=%d; costs F=%g B=%g W=%g%s; one column = %g time unit%s\n",
            pt_schedule_kind_name(s->kind), s->pp, s->m, s->v, sim->f, sim->b, sim->w, head, q, q == 1 ? "" : "s");
    for (int r = 0; r < s->pp; r++) {
        memset(kinds, '.', (size_t)cols);
        memset(micros, ' ', (size_t)cols);
        kinds[cols] = micros[cols] = 0;
        for (int k = 0; k < s->n[r]; k++) {
            const pt_action *x = &s->a[r][k];
            double t0 = sim->start[r][k], t1 = t0 + pt_duration(s, sim, r, x);
            for (long c = lround(t0 / q); c < lround(t1 / q) && c < cols; c++) {
                kinds[c] = pt_kind_char(x);
                micros[c] = pt_micro_char(x->micro);
            }
        }
        fprintf(f, "rank %-3d |%s|\n", r, kinds);
        fprintf(f, "   micro |%s|\n", micros);
    }
    free(kinds);
    free(micros);
}

static const char *pt_svg_colour(pt_act_kind k) {
    switch (k) {
    case PT_ACT_FWD: return "#4e79a7";
    case PT_ACT_BWD: return "#e15759";
    case PT_ACT_BWD_INPUT: return "#f28e2b";
    case PT_ACT_HEAD: return "#b07aa1";
    default: return "#59a14f";
    }
}

enum { PT_SVG_LEFT = 70, PT_SVG_TOP = 34, PT_SVG_ROW = 28, PT_SVG_COL = 22, PT_SVG_LEGEND = 130 };

/* One entry per kind of computation, HEAD where the schedule has it. */
static void pt_svg_legend(FILE *f, int y, int head) {
    static const pt_act_kind kinds[] = {PT_ACT_FWD, PT_ACT_BWD, PT_ACT_BWD_INPUT, PT_ACT_BWD_WEIGHT, PT_ACT_HEAD};
    for (int i = 0; i < 4 + (head != 0); i++) {
        int x = PT_SVG_LEFT + i * PT_SVG_LEGEND;
        fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", x, y,
                pt_svg_colour(kinds[i]));
        fprintf(f, "<text x=\"%d\" y=\"%d\">%s</text>\n", x + 20, y + 12, pt_schedule_action_name(kinds[i]));
    }
}

void pt_schedule_svg_write(const pt_schedule *s, const pt_sched_sim *sim, FILE *f) {
    double q = pt_quantum(s, sim), sx = PT_SVG_COL / q;
    int width = PT_SVG_LEFT + (int)ceil(sim->makespan * sx) + 20, height = PT_SVG_TOP + s->pp * PT_SVG_ROW + 40;
    int legend = PT_SVG_LEFT + PT_SVG_LEGEND * (4 + (s->head != 0));
    if (width < legend) width = legend;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "font-family=\"sans-serif\" font-size=\"12\">\n",
            width, height);
    char head[64] = "";
    if (s->head) snprintf(head, sizeof head, " H=%g (head split)", sim->h);
    fprintf(f, "<text x=\"10\" y=\"20\">%s: pp=%d, m=%d, v=%d; F=%g B=%g W=%g%s; bubble (idle/busy) %.4f</text>\n",
            pt_schedule_kind_name(s->kind), s->pp, s->m, s->v, sim->f, sim->b, sim->w, head, sim->bubble);
    for (int r = 0; r < s->pp; r++) {
        double y = PT_SVG_TOP + r * PT_SVG_ROW;
        fprintf(f, "<text x=\"10\" y=\"%.1f\">rank %d</text>\n", y + 18, r);
        for (int k = 0; k < s->n[r]; k++) {
            const pt_action *x = &s->a[r][k];
            double t0 = sim->start[r][k], d = pt_duration(s, sim, r, x);
            if (d <= 0) continue;
            double x0 = PT_SVG_LEFT + t0 * sx;
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%d\" fill=\"%s\"%s stroke=\"#fff\">"
                       "<title>%s micro %d chunk %d: %g to %g</title></rect>\n",
                    x0, y, d * sx, PT_SVG_ROW - 4, pt_svg_colour(x->kind), x->chunk % 2 ? " fill-opacity=\"0.55\"" : "",
                    pt_schedule_action_name(x->kind), x->micro, x->chunk, t0, t0 + d);
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" fill=\"#fff\">%d</text>\n",
                    x0 + d * sx / 2, y + 17, x->micro);
        }
    }
    pt_svg_legend(f, PT_SVG_TOP + s->pp * PT_SVG_ROW + 10, s->head);
    fprintf(f, "</svg>\n");
}

pt_status pt_schedule_svg(const pt_schedule *s, const pt_sched_sim *sim, const char *path) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return pt_errorf(PT_ERR_MEMORY, "%s: cannot buffer the SVG", path);
    pt_schedule_svg_write(s, sim, f);
    fclose(f);
    pt_status st = pt_write_file_atomic(path, buf, len);
    free(buf);
    return st;
}
