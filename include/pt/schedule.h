/* schedule.h: pipeline-parallel schedules as explicit per-rank action lists: built, checked,
 * simulated and drawn. Pure data: no MPI, no model code.
 *
 * A pipeline of pp ranks holds v model chunks per rank (v = 1 except for the interleaved
 * schedule); chunk c on rank r is the global stage c·pp + r (layers go round-robin), so a
 * micro-batch's forward runs stages 0, 1, ..., v·pp − 1 and its backward runs them in reverse.
 * Each rank executes its list a[r][0..n[r]) in order. Point-to-point messages follow the
 * blocking-receive model that an MPI runtime would use: a SEND is buffered (never waits), a RECV
 * waits until the matching SEND has been issued. Where two neighbouring stages share a rank
 * (pp = 1 with interleaving) the hand-off is local and carries no message.
 *
 * The four schedules (m micro-batches):
 *   afab         GPipe: all m forwards, then all m backwards.
 *   1f1b         PipeDream-flush: rank r runs min(pp − r − 1, m) warm-up forwards, then
 *                alternates one forward and one backward, then the remaining backwards.
 *   interleaved  Megatron's interleaved 1F1B (Narayanan et al. 2021), v ≥ 2 chunks per rank,
 *                micro-batches in groups of pp (m must be a multiple of pp).
 *   zb           ZB-H1 (Qi et al. 2023): the 1F1B order with each backward split into B (input
 *                gradient, on the critical path) and W (weight gradient); rank r delays its W's
 *                by r backwards, so the last stages pass gradients upstream sooner and the
 *                delayed W's fill the cool-down. Peak in-flight is 1F1B's.
 */
#ifndef PT_SCHEDULE_H
#define PT_SCHEDULE_H

#include <stdio.h>

#include "pt/core.h"

typedef enum { PT_SCHED_AFAB = 0, PT_SCHED_1F1B, PT_SCHED_INTERLEAVED, PT_SCHED_ZB } pt_sched_kind;

typedef enum {
    PT_ACT_FWD = 0,
    PT_ACT_BWD,        /* full backward: input and weight gradients */
    PT_ACT_BWD_INPUT,  /* ZB: the input-gradient half of BWD */
    PT_ACT_BWD_WEIGHT, /* ZB: the weight-gradient half of BWD */
    PT_ACT_SEND_FWD,   /* activations to the next stage */
    PT_ACT_RECV_FWD,   /* activations from the previous stage */
    PT_ACT_SEND_BWD,   /* input gradients to the previous stage */
    PT_ACT_RECV_BWD,   /* input gradients from the next stage */
} pt_act_kind;

/* chunk: the model chunk on this rank, 0..v-1, that the action computes or serves (for a SEND,
 * the chunk whose result leaves; for a RECV, the chunk whose input arrives). A message from
 * rank r's chunk c therefore arrives at the rank and chunk of the neighbouring stage: with
 * interleaving the last rank's chunk c sends forward to rank 0's chunk c + 1.
 * peer: for SEND/RECV the rank of the neighbouring stage; -1 for compute actions. */
typedef struct {
    pt_act_kind kind;
    int micro;
    int chunk;
    int peer;
} pt_action;

typedef struct {
    pt_sched_kind kind;
    int pp, m, v;
    int *n;          /* n[r]: actions of rank r */
    pt_action **a;   /* a[r][0..n[r]) in execution order */
} pt_schedule;

/* "afab", "1f1b", "interleaved", "zb"; PT_ERR_CONFIG naming the choices otherwise. */
pt_status pt_schedule_parse_kind(const char *s, pt_sched_kind *out);
const char *pt_schedule_kind_name(pt_sched_kind k);
/* The short name of an action kind ("FWD", "RECV_BWD", ...). */
const char *pt_schedule_action_name(pt_act_kind k);

/* Builds the action lists. v must be 1 unless the schedule is interleaved (then v ≥ 2 and m a
 * multiple of pp). PT_ERR_CONFIG with one message naming the violated constraint. */
pt_status pt_schedule_build(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v);
void pt_schedule_free(pt_schedule *s);

/* Checks that the lists are a correct pipeline step: every field in range and every peer the
 * neighbouring stage's rank; every stage runs FWD and (BWD, or BWD_INPUT then BWD_WEIGHT)
 * exactly once per micro-batch and chunk, each after its inputs (a forward after the previous
 * stage's activations arrived, a backward after its own forward and the next stage's
 * gradients); every SEND received exactly once by its peer and every RECV sent; and executing
 * all ranks with blocking receives terminates. The message names the rank, the action index
 * and what is wrong (for a deadlock, every blocked rank). */
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
    double f, b, w;      /* the costs simulated */
} pt_sched_sim;

/* Runs the schedule with costs FWD = f, BWD = b + w, BWD_INPUT = b, BWD_WEIGHT = w per chunk;
 * communication is free and instantaneous, each rank runs its list in order and waits at a RECV
 * for the matching SEND. Checks the schedule first (same errors as pt_schedule_check). */
pt_status pt_schedule_simulate(const pt_schedule *s, double f, double b, double w, pt_sched_sim *out);
void pt_sched_sim_free(pt_sched_sim *r);

/* The literature's bubble for this schedule's kind and shape: (pp − 1)/(v·m) for afab, 1f1b and
 * interleaved (v = 1 for the first two), whatever the costs; -1 for zb, whose bubble depends on
 * the ratio of the costs. */
double pt_schedule_bubble_formula(const pt_schedule *s);

/* Text timeline to f: per rank one row with one character per time unit (the shortest action's
 * duration): F forward, B backward (full or input gradient), W weight gradient, '.' idle;
 * lowercase for odd chunks. Beneath each row, aligned, the micro-batch number of each column
 * (base 36: 0-9 then a-z). */
void pt_schedule_print(const pt_schedule *s, const pt_sched_sim *sim, FILE *f);
/* An SVG drawing of the timeline: one rectangle per compute action, coloured by kind (lighter for
 * odd chunks), with its micro-batch number; written atomically to path. */
pt_status pt_schedule_svg(const pt_schedule *s, const pt_sched_sim *sim, const char *path);

#endif
