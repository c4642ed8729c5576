/* schedule.h: pipeline-parallel schedules as explicit per-rank action lists: built, checked,
 * simulated and drawn. Pure data: no MPI, no model code.
 *
 * A pipeline of pp ranks holds v model chunks per rank (v = 1 except for interleaved and
 * dualpipev); a micro-batch's forward runs the global stages 0, 1, ..., v·pp − 1 and its backward
 * runs them in reverse. Which rank and chunk hold a stage (pt_schedule_stage) depends on the kind:
 * round-robin (chunk c of rank r is stage c·pp + r) for all but dualpipev, whose V gives rank r
 * stage r as chunk 0 and stage 2pp − 1 − r as chunk 1: the forward goes down ranks 0..pp − 1 and
 * comes back up, rank 0 holding both the first stage and the last (the loss).
 * Each rank executes its list a[r][0..n[r]) in order. Point-to-point messages follow the
 * blocking-receive model that an MPI runtime would use: a SEND is buffered (never waits), a RECV
 * waits until the matching SEND has been issued. Where two neighbouring stages share a rank
 * (pp = 1 with interleaving, and the bottom of dualpipev's V on rank pp − 1) the hand-off is local
 * and carries no message.
 *
 * The five schedules (m micro-batches):
 *   afab         GPipe: all m forwards, then all m backwards.
 *   1f1b         PipeDream-flush: rank r runs min(pp − r − 1, m) warm-up forwards, then
 *                alternates one forward and one backward, then the remaining backwards.
 *   interleaved  Megatron's interleaved 1F1B (Narayanan et al. 2021), v ≥ 2 chunks per rank,
 *                micro-batches in groups of at least pp, any m ≥ 1 (Megatron's and Llama 3's
 *                flexible schedule): ⌊m/pp⌋ groups as even as possible (pp each when pp divides
 *                m), each through chunk 0, then chunk 1, ...; rank r warms up with
 *                2(pp − r − 1) + (v − 1)·g forwards, g the largest group; m ≤ pp: all forwards,
 *                then all backwards.
 *   zb           ZB-H1 (Qi et al. 2023): the 1F1B order with each backward split into B (input
 *                gradient, on the critical path) and W (weight gradient); rank r delays its W's
 *                by r backwards, so the last stages pass gradients upstream sooner and the
 *                delayed W's fill the cool-down. Peak in-flight is 1F1B's.
 *   dualpipev    DualPipeV (DeepSeek's DualPipe cut in half, Sea AI Lab's "cut-in-half"): the V
 *                mapping, 2 chunks per rank, m ≥ 2pp. Rank r warms up with 2(pp − r − 1)
 *                forwards of chunk 0, then r + 1 pairs (F0, F1), then pp − r − 1 of (B1 split
 *                into B and W at once, F1); the steady phase runs "F&B" pairs: the forward of one
 *                chunk next to the backward of the other (F0 with B1, F1 with B0); the cool-down
 *                drains B1 and B0, splitting the later half of them and deferring their W's to
 *                fill the end. DualPipe overlaps the F and the B of an F&B (two micro-batches, so
 *                one's communication hides behind the other's compute); our ranks run them one
 *                after the other, so here F&B costs F + B (f + b + w in the simulator's costs).
 *                Published bubble (the DualPipe README, PP = 2pp stages of the V):
 *                (PP/2 − 1)(F&B + B − 3W) = (pp − 1)(F&B + B − 3W) idle time per rank with F, B
 *                (full backward), W the costs of one chunk; peak activations PP + 1 = 2pp + 1
 *                (micro-batch, chunk) pairs, each 1/(2pp) of the layers; parameters 1× (2 chunks
 *                of 1/(2pp) of the layers per rank).
 */
#ifndef PT_SCHEDULE_H
#define PT_SCHEDULE_H

#include <stdio.h>

#include "pt/core.h"

typedef enum {
    PT_SCHED_AFAB = 0,
    PT_SCHED_1F1B,
    PT_SCHED_INTERLEAVED,
    PT_SCHED_ZB,
    PT_SCHED_DUALPIPEV,
} pt_sched_kind;

typedef enum {
    PT_ACT_FWD = 0,
    PT_ACT_BWD,        /* full backward: input and weight gradients */
    PT_ACT_BWD_INPUT,  /* ZB: the input-gradient half of BWD */
    PT_ACT_BWD_WEIGHT, /* ZB: the weight-gradient half of BWD */
    PT_ACT_SEND_FWD,   /* activations to the next stage */
    PT_ACT_RECV_FWD,   /* activations from the previous stage */
    PT_ACT_SEND_BWD,   /* input gradients to the previous stage */
    PT_ACT_RECV_BWD,   /* input gradients from the next stage */
    PT_ACT_HEAD,       /* the head split over the pp ranks: a collective over all of them */
} pt_act_kind;

/* chunk: the model chunk on this rank, 0..v-1, that the action computes or serves (for a SEND,
 * the chunk whose result leaves; for a RECV, the chunk whose input arrives). A message from
 * rank r's chunk c therefore arrives at the rank and chunk of the neighbouring stage: with
 * interleaving the last rank's chunk c sends forward to rank 0's chunk c + 1.
 * peer: for SEND/RECV the rank of the neighbouring stage; -1 for compute actions.
 *
 * HEAD (only in a schedule built with head = 1): the final norm's output of micro-batch `micro`
 * on the last stage goes to every pipeline rank, each computes the logits of its slice of the
 * vocabulary and its part of the loss, its head gradient and a partial input gradient, and the
 * partials are summed onto the last stage. It is a collective over all pp ranks: every rank runs
 * HEAD(i) once per micro-batch i, all in the same order (0, 1, ..., m − 1), and a rank at HEAD(i)
 * waits until every rank is at it. chunk 0, peer -1. The builder puts HEAD(i) on every rank just
 * before that rank's backward of micro-batch i (before its RECV_BWD, where it has one). */
typedef struct {
    pt_act_kind kind;
    int micro;
    int chunk;
    int peer;
} pt_action;

typedef struct {
    pt_sched_kind kind;
    int pp, m, v;
    int head;        /* 1: the head is split over the pp ranks (the lists hold HEAD actions) */
    int *n;          /* n[r]: actions of rank r */
    pt_action **a;   /* a[r][0..n[r]) in execution order */
    double *weight;  /* NULL: every stage costs alike; else (pp·v) each global stage's relative
                        cost (e.g. its layers, pt_schedule_set_weights): the simulator charges a
                        compute action of stage st its kind's cost times weight[st] */
} pt_schedule;

/* "afab", "1f1b", "interleaved", "zb", "dualpipev"; PT_ERR_CONFIG naming the choices otherwise. */
pt_status pt_schedule_parse_kind(const char *s, pt_sched_kind *out);
const char *pt_schedule_kind_name(pt_sched_kind k);
/* The short name of an action kind ("FWD", "RECV_BWD", ...). */
const char *pt_schedule_action_name(pt_act_kind k);

/* Where the layers go: the one place that maps (rank, chunk) to global stages and back, for the
 * builder, the checker, the engine (pipeline.c) and the layout (layout.c). */
/* Model chunks per rank under a kind: 2 for dualpipev, v (parallel.pp_virtual) otherwise. */
int pt_schedule_chunks(pt_sched_kind kind, int v);
/* The global stage of chunk c on rank r of pp ranks holding v chunks each: c·pp + r, or for
 * dualpipev r (c = 0) and 2pp − 1 − r (c = 1). */
int pt_schedule_stage(pt_sched_kind kind, int pp, int v, int r, int c);
/* The rank and the chunk holding global stage st (the inverse of pt_schedule_stage). */
void pt_schedule_locate(pt_sched_kind kind, int pp, int v, int st, int *rank, int *chunk);
/* Whether the kind splits backwards into BWD_INPUT and BWD_WEIGHT (zb, dualpipev): the engine
 * then keeps what a deferred weight gradient needs. */
int pt_schedule_splits_backward(pt_sched_kind kind);

/* Builds the action lists. v must be 1 unless the schedule is interleaved (then v ≥ 2, any m) or
 * dualpipev (then v = 2 and m ≥ 2pp). PT_ERR_CONFIG with one message naming
 * the violated constraint. */
pt_status pt_schedule_build(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v);
/* The same with the head split over the ranks (head > 0: HEAD's cost, a forward costing 1): a
 * HEAD(i) on every rank, the last one's right after its forward of micro-batch i, every other's
 * between its forward and its backward of i where a simulation at unit costs says it is when the
 * last rank arrives (schedule.c, pt_place_heads); afab, 1f1b and zb only (PT_ERR_CONFIG naming the
 * kind otherwise). head = 0 is pt_schedule_build. */
pt_status pt_schedule_build_head(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v, double head);
void pt_schedule_free(pt_schedule *s);
/* Uneven stages for the simulation: w[st] > 0 the relative cost of global stage st (pp·v of them;
 * e.g. the layers of parallel.pp_layers), copied; NULL: back to even stages. The lists do not
 * change (the order is the schedule's, whatever the stages hold); PT_ERR_CONFIG naming a weight
 * that is not positive. */
pt_status pt_schedule_set_weights(pt_schedule *s, const double *w);

/* Checks that the lists are a correct pipeline step: every field in range and every peer the
 * neighbouring stage's rank; every stage runs FWD and (BWD, or BWD_INPUT then BWD_WEIGHT)
 * exactly once per micro-batch and chunk, each after its inputs (a forward after the previous
 * stage's activations arrived, a backward after its own forward and the next stage's
 * gradients); every SEND received exactly once by its peer and every RECV sent; and executing
 * all ranks with blocking receives terminates. With s->head: every rank runs HEAD(i) once per
 * micro-batch, in the same order on every rank (a rank at HEAD(i) waits for all the others to be
 * at HEAD(i)), the last stage's HEAD(i) after its FWD of micro-batch i and before its backward of
 * it. The message names the rank, the action index and what is wrong (for a deadlock, every
 * blocked rank and what it waits for). */
pt_status pt_schedule_check(const pt_schedule *s);

/* Result of a simulation. bubble is the idle time divided by the compute time, over all ranks:
 *   bubble = (pp · makespan − busy) / busy,
 * which the literature gives as (pp − 1)/m for afab and 1f1b and (pp − 1)/(v·m) for interleaved
 * (pt_schedule_bubble_formula); it is not the idle share of the makespan. */
typedef struct {
    int pp;              /* rows of peak_inflight and start */
    double bubble;
    double makespan;     /* end of the last action on any rank */
    double busy;         /* compute time summed over ranks */
    int *peak_inflight;  /* per rank: most (micro-batch, chunk) pairs with the forward done and the
                            input-gradient backward (BWD or BWD_INPUT) not yet done */
    double **start;      /* start[r][k]: when rank r began action k (a RECV: when it completed) */
    double f, b, w, h;   /* the costs simulated */
} pt_sched_sim;

/* Runs the schedule with costs FWD = f, BWD = b + w, BWD_INPUT = b, BWD_WEIGHT = w per chunk;
 * communication is free and instantaneous, each rank runs its list in order and waits at a RECV
 * for the matching SEND. Checks the schedule first (same errors as pt_schedule_check). */
pt_status pt_schedule_simulate(const pt_schedule *s, double f, double b, double w, pt_sched_sim *out);
/* The same with HEAD = h on every rank: a HEAD(i) starts when the last rank arrives at it (the
 * latest clock) and ends h later on every rank; busy counts h on every rank. pt_schedule_simulate
 * is this with h = 0. */
pt_status pt_schedule_simulate_head(const pt_schedule *s, double f, double b, double w, double h,
                                    pt_sched_sim *out);
/* The same with each message taking `delay` (seconds, like the costs): a SEND leaves the sender at
 * once (it computes on) and arrives `delay` after it, or after the previous message the sender
 * put on the same link (that direction, fwd or bwd) arrived, whichever is later: one message at
 * a time on a link; the RECV completes when the message has arrived. pt_schedule_simulate_head
 * is this with delay = 0. */
pt_status pt_schedule_simulate_transfers(const pt_schedule *s, double f, double b, double w, double h,
                                         double delay, pt_sched_sim *out);
/* How a message between stages moves, in the costs' time units. */
typedef struct {
    double delay;   /* from leaving the sender to arriving (α + S/B); one at a time on a link */
    double latency; /* α: each of the rendezvous's request and answer */
    int rendezvous; /* 0: it leaves when sent. 1: the sender's request reaches the receiver
                       `latency` after the SEND, the receiver answers at its first poll from then
                       on (an action boundary, or at once while it waits at a RECV or a HEAD), the
                       answer takes `latency`, and the data leaves at the sender's first poll after
                       that: an MPI without a progress thread moving a message past its eager
                       limit (Open MPI over TCP) */
} pt_sched_link;
/* The same with messages moving as `link` says; pt_schedule_simulate_transfers is this with
 * {delay, 0, 0}. Runs in time order (events); the schedule is checked first. */
pt_status pt_schedule_simulate_link(const pt_schedule *s, double f, double b, double w, double h,
                                    const pt_sched_link *link, pt_sched_sim *out);
void pt_sched_sim_free(pt_sched_sim *r);

/* The bubble for this schedule's kind and shape, whatever the costs (f, b, w, as long as the
 * stages' costs are proportional to their weights):
 *   even stages, afab, 1f1b and interleaved (v = 1 for the first two):
 *     (pp − 1 + (v − 1)·max(0, pp − m)) / (v·m),
 *   i.e. the literature's (pp − 1)/(v·m) for every m ≥ pp (any m, not only multiples of pp, with
 *   the flexible interleaved order), and for m < pp (interleaved: all forwards, then all
 *   backwards, a GPipe over v·pp stages) (v·pp + m − 1)/(v·m) − 1;
 *   uneven stages (pt_schedule_set_weights), afab: a flow shop whose makespan is
 *     Σw + (m − 1)·max w stage-times, so (pp·(Σw + (m − 1)·max w) − m·Σw) / (m·Σw);
 * -1 otherwise: zb and dualpipev, whose bubbles depend on the ratio of the costs
 * (pt_schedule_idle_formula), and 1f1b and interleaved over uneven stages (bounded below by
 * pt_schedule_bubble_bound). */
double pt_schedule_bubble_formula(const pt_schedule *s);
/* The bubble that uneven ranks alone make, whatever the order: the busiest rank computes
 * max_r Σ_c w(r, c) stage-times per micro-batch, so the bubble is at least
 * pp·max_r Σ_c w(r, c) / Σ w − 1 (0 for even stages); the order's own bubble comes on top. */
double pt_schedule_bubble_bound(const pt_schedule *s);

/* The published idle time per rank, in the time units of the costs f, b, w (per chunk, as
 * pt_schedule_simulate takes them), where one is published: dualpipev's (PP/2 − 1)(F&B + B − 3W)
 * with PP = 2pp stages, F&B = f + b + w (run one after the other here), B = b + w and W = w;
 * -1 for the other kinds. Every rank of dualpipev computes the same 2m chunks' worth, so our bubble
 * is pp·idle/busy = idle/(2m(f + b + w)). */
double pt_schedule_idle_formula(const pt_schedule *s, double f, double b, double w);
/* The published peak of (micro-batch, chunk) pairs in flight per rank, where one is published:
 * dualpipev's PP + 1 = 2pp + 1; -1 for the other kinds. */
int pt_schedule_peak_formula(const pt_schedule *s);

/* Text timeline to f: per rank one row with one character per time unit (the shortest action's
 * duration): F forward, B backward (full or input gradient), W weight gradient, H head (the
 * collective of the head split), '.' idle; lowercase for odd chunks. Beneath each row, aligned, the micro-batch number of each column
 * (base 36: 0-9 then a-z). */
void pt_schedule_print(const pt_schedule *s, const pt_sched_sim *sim, FILE *f);
/* An SVG drawing of the timeline: one rectangle per compute action (HEAD included), coloured by
 * kind (lighter for odd chunks), with its micro-batch number; written atomically to path. */
pt_status pt_schedule_svg(const pt_schedule *s, const pt_sched_sim *sim, const char *path);
/* The same drawing written to f (an <svg> element, e.g. inside an HTML page). */
void pt_schedule_svg_write(const pt_schedule *s, const pt_sched_sim *sim, FILE *f);

#endif
