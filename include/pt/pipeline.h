/* pipeline.h: pipeline parallelism: the stage split, and the engine that runs a schedule.
 *
 * The layers are cut into S = pp·v stages (contiguous layer ranges); rank r of the pipeline
 * group holds stages r, r + pp, ..., as its chunks 0..v−1 (round-robin, as the interleaved
 * schedule wants; v = 1 otherwise), or under dualpipev stages r and 2pp − 1 − r (the V;
 * pt_schedule_stage). Stage 0 also holds the embedding, stage S − 1 the final norm, head and
 * loss. Two neighbouring stages on one rank (the V's bottom) hand off by a copy, no message.
 *
 * One engine runs every schedule (include/pt/schedule.h): it walks this rank's action list,
 * posting receives and sends nonblocking (a forward waits for its input to arrive, a backward
 * for its gradient), so transfers overlap the compute in between. Each (micro-batch, chunk) in
 * flight holds one set of activations from a per-chunk pool: a set is taken when its forward's
 * input is received or its forward starts, and returned when its last action is done, so the
 * pool's peak is the schedule's peak in-flight count.
 */
#ifndef PT_PIPELINE_H
#define PT_PIPELINE_H

#include "pt/comm.h"
#include "pt/model.h"
#include "pt/schedule.h"

/* The stages of a model: explicit (spec "3,4,4,3": S layer counts) or balanced: contiguous runs
 * of layers that minimise the largest stage's cost, a layer costing the matrix parameters a token
 * passes through (a MoE layer: router, top_k experts, shared experts), the last stage also the
 * head's V·C (the embedding lookup costs nothing), so the last stage gets fewer layers; with
 * head_split the head is left out (its rows are spread by pt_pipe_head_rows).
 * PT_ERR_CONFIG when S exceeds the layers or the spec does not have S positive counts summing to
 * n_layers. */
pt_status pt_pipe_split(const pt_model_config *c, int S, const char *spec, int head_split,
                        pt_chunk *stages);
/* The stages of a pipeline of pp ranks holding v chunks each under schedule kind: S = pp·v
 * stages in stage order (pt_schedule_stage says which rank and chunk holds each), the one rule
 * the layout and the planner share. spec (parallel.pp_layers) given: its S counts, stage by stage
 * (for v = 1 one per rank; interleaved: stage s = chunk s / pp of rank s mod pp; dualpipev: down
 * the V, then back up). Otherwise interleaved: as even as possible (pt_pipe_even_split); the other
 * kinds: balanced by cost (pt_pipe_split). PT_ERR_CONFIG as pt_pipe_split. */
pt_status pt_pipe_stages(const pt_model_config *c, pt_sched_kind kind, int pp, int v, const char *spec,
                         int head_split, pt_chunk *stages);
/* L layers over S ≤ L stages as even as possible: ⌊L/S⌋ each, and the L mod S left over one each
 * to stages 1, 2, ..., S − 2, then 0: the first and the last stage, which also hold the embedding
 * and the head, are the last to get one (the last never does). 126 layers over 32 stages: 3 on the
 * first and the last, 4 on the others (Llama 3 405B's pipeline). */
void pt_pipe_even_split(int L, int S, pt_chunk *stages);
/* The head split over the S stages (parallel.pp_head = split): the vocabulary rows of each stage,
 * as given in spec (parallel.pp_head_rows) or balancing the stages' costs with the layers of
 * `stages` (the cost model of pt_pipe_split), each at least one row, summing to vocab_size;
 * PT_ERR_CONFIG when a stage has fewer rows than its tp ranks. */
pt_status pt_pipe_head_rows(const pt_model_config *c, int S, int tp, const pt_chunk *stages,
                            const char *spec, int *rows);
/* The rows that would balance S stages measured to spend layers_s[s] seconds on their layers and
 * head_s[s] on their rows[s] rows of the head (a row's time taken as the stages' mean). */
void pt_pipe_head_balance(int S, const double *layers_s, const double *head_s, const int *rows,
                          int *out);

/* The uses of each (micro-batch, chunk)'s activation set in rank r's list: its own actions, and
 * those that take its result by a local hand-off (the bottom of dualpipev's V); uses: (m·v). */
void pt_pipe_count_uses(const pt_schedule *s, int r, int *uses);
/* The most sets of each chunk rank r holds at once (most: v), a set taken at its (micro-batch,
 * chunk)'s first action and given back after its last use (uses: pt_pipe_count_uses): what the
 * engine makes at set-up, and what the planner counts. */
void pt_pipe_held_sets(const pt_schedule *s, int r, const int *uses, int *most);

typedef struct {
    pt_acts *a;
    int left;           /* actions of this (micro-batch, chunk) still to run on this rank */
    pt_comm_req *req[4]; /* receive of the input, of the gradient; send of the output, of the gradient */
} pt_pipe_slot;

typedef struct {
    pt_model *model;
    pt_comm *pp;
    pt_schedule sched;
    int rank, v, m, S, B, T;
    double head_cost;     /* the split head's HEAD against a stage's forward (its placement) */
    int zb;
    pt_pipe_slot *slot;   /* [micro · v + chunk] */
    int *uses;            /* [micro · v + chunk]: its set's uses in a step (actions, local hand-offs) */
    pt_pipe_slot *draining; /* done sets whose sends are in flight (left: their chunk) */
    int n_draining;
    pt_acts **pool;       /* free activation sets, per chunk: pool[c · m + i] */
    int *pool_n, *live, *peak;
    size_t *set_bytes;    /* one set's bytes, per chunk (recorded when the first is made) */
    size_t setup_bytes;   /* the sets made at set-up: those the schedule holds at once */
    const int32_t *docs;  /* documents (pt_pipe_set_documents) or NULL */
    pt_moe_stats *stats;  /* where the forwards' MoE statistics go (the owner's; NULL: none) */
    int docs_restart;
    /* the head split over the pipeline ranks (model->par.head_split): its workspace, and on the
     * last rank the other ranks' parts of xf's gradient as received (pp − 1 of (R, C)) */
    pt_head_ws *head;
    float *head_parts;
    pt_comm_req **head_req; /* (pp) */
    /* seconds (counters) of this rank's training compute: forwards and backwards (with the
     * communication inside them: tp, cp, ep), and the split head's (with its statistics' exchange) */
    double busy_s, head_s;
} pt_pipe;

pt_status pt_pipe_init(pt_pipe *p, pt_model *m, pt_comm *pp, pt_sched_kind kind, int v, int n_micro,
                       int B, int T);
void pt_pipe_free(pt_pipe *p);
/* Runs one step's schedule: micro-batch i's tokens and targets are tokens + i·B·T (device). The
 * gradients accumulate into the model; returns the loss sum over the micro-batches (nonzero on
 * the rank holding the last stage). */
double pt_pipe_step(pt_pipe *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos,
                    float loss_scale);
/* Evaluation: every micro-batch forward through the stages, one after another (a stage receives
 * its input, runs pt_model_eval_loss and sends its output on, blocking), with one activation set
 * per chunk from the pools (idle between steps); no schedule, no gradient. Returns the loss sum
 * (nonzero on the rank holding the last stage). Collective over the pp group. */
double pt_pipe_eval(pt_pipe *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos);
/* Documents for the steps and evaluations from now on: micro-batch i's rows start their
 * documents at docs + i·B·T (device; NULL: none), as pt_acts_set_documents. */
void pt_pipe_set_documents(pt_pipe *p, const int32_t *docs, int restart);
/* Peak bytes of activations held at once on this rank (its chunks' pools). */
size_t pt_pipe_peak_bytes(const pt_pipe *p);

#endif
