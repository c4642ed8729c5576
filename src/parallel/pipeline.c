/* pipeline.c: pipeline parallelism: the stage split and the schedule engine (see
 * include/pt/pipeline.h).
 *
 * The layers are cut into stages (contiguous, minimising the largest stage's cost, or as given),
 * each rank holding one chunk (v with the interleaved schedule, 2 with dualpipev); the model runs
 * a chunk (pt_acts_input / output / grad carry its boundary). The engine walks this rank's action
 * list of the schedule (schedule.c: AFAB, 1F1B, interleaved, zero bubble, DualPipeV): forward,
 * backward (whole or input then weight), and the sends and receives of activations and their
 * gradients over the pp group, nonblocking (or a copy between two stages on this rank), each
 * micro-batch's activations in a set from a pool (their peak measured). */
#include "pt/pipeline.h"

#include "pt/trace.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The cost model of the balanced split: a layer costs its matrices' parameters that a token
 * passes through (a MoE layer: its router, top_k experts and the shared ones), the head V·C per
 * token (its share of the vocabulary when split), the embedding lookup nothing. */
static double pt_pipe_layer_cost(const pt_model_config *c, int l) {
    int hd = pt_model_head_dim(c);
    double attn = (double)c->dim * (c->n_heads * hd + 2.0 * c->n_kv_heads * hd) +
                  (double)c->n_heads * hd * c->dim;
    double mlp = pt_layer_is_moe(c, l)
                     ? (double)c->dim * c->n_experts +
                           3.0 * c->dim * c->moe_ffn_dim * (c->top_k + c->n_shared_experts)
                     : 3.0 * c->dim * c->ffn_dim;
    return attn + mlp;
}

/* A list of S positive integers separated by commas into out, summing to `sum`. */
static pt_status pt_pipe_parse_counts(const char *key, const char *spec, int S, const char *what,
                                      int sum, int *out) {
    const char *s = spec;
    int n = 0, total = 0;
    while (*s) {
        char *end;
        long k = strtol(s, &end, 10);
        if (end == s || k < 1 || k > sum || n == S)
            return pt_errorf(PT_ERR_CONFIG, "%s = \"%s\": expected %d positive counts separated by "
                             "commas", key, spec, S);
        if (*end && *end != ',')
            return pt_errorf(PT_ERR_CONFIG, "%s = \"%s\": not a list of numbers", key, spec);
        out[n++] = (int)k;
        total += (int)k;
        s = *end == ',' ? end + 1 : end;
    }
    if (n != S || total != sum)
        return pt_errorf(PT_ERR_CONFIG, "%s = \"%s\": %d counts summing to %d; the layout needs %d "
                         "summing to %s = %d", key, spec, n, total, S, what, sum);
    return PT_OK;
}

pt_status pt_pipe_split(const pt_model_config *c, int S, const char *spec, int head_split,
                        pt_chunk *stages) {
    int L = c->n_layers;
    if (S > L)
        return pt_errorf(PT_ERR_CONFIG, "pipeline: pp × chunks per rank = %d stages exceed "
                         "model.n_layers = %d (every stage needs a layer)", S, L);
    if (spec && spec[0]) {
        int *k = pt_malloc((size_t)S * sizeof *k);
        pt_status st = pt_pipe_parse_counts("parallel.pp_layers", spec, S, "model.n_layers", L, k);
        for (int i = 0, sum = 0; st == PT_OK && i < S; sum += k[i], i++) stages[i] = (pt_chunk){sum, sum + k[i]};
        free(k);
        return st;
    }
    /* balanced: contiguous runs of layers minimising the largest stage's cost, the last stage
     * also the head's (unless it is split over the stages, pt_pipe_head_rows). best[s][i]: the
     * least largest cost of stages 0..s over layers [0, i). */
    double *cum = pt_calloc((size_t)L + 1, sizeof *cum);
    for (int l = 0; l < L; l++) cum[l + 1] = cum[l] + pt_pipe_layer_cost(c, l);
    double head = head_split ? 0.0 : (double)c->vocab_size * c->dim;
    double *best = pt_malloc((size_t)S * (L + 1) * sizeof *best);
    int *cut = pt_malloc((size_t)S * (L + 1) * sizeof *cut);
    for (int s = 0; s < S; s++)
        for (int i = 0; i <= L; i++) {
            double *b = &best[(size_t)s * (L + 1) + i];
            *b = HUGE_VAL;
            cut[(size_t)s * (L + 1) + i] = 0;
            if (i < s + 1) continue; /* every stage needs a layer */
            for (int j = s; j < i; j++) { /* stage s holds layers [j, i) */
                double mine = cum[i] - cum[j] + (s == S - 1 && i == L ? head : 0.0);
                double worst = s == 0 ? (j == 0 ? mine : HUGE_VAL)
                                      : fmax(best[(size_t)(s - 1) * (L + 1) + j], mine);
                if (worst < *b) *b = worst, cut[(size_t)s * (L + 1) + i] = j;
            }
        }
    for (int s = S - 1, i = L; s >= 0; s--) {
        int j = cut[(size_t)s * (L + 1) + i];
        stages[s] = (pt_chunk){j, i};
        i = j;
    }
    free(cum);
    free(best);
    free(cut);
    return PT_OK;
}

void pt_pipe_even_split(int L, int S, pt_chunk *stages) {
    int base = L / S, extra = L % S, at = 0;
    for (int st = 0; st < S; st++) {
        /* stage st's place in the order 1, 2, ..., S − 2, 0 (the last stage: never) */
        int rank = st == 0 ? S - 2 : st == S - 1 ? S : st - 1;
        int k = base + (rank < extra);
        stages[st] = (pt_chunk){at, at + k};
        at += k;
    }
}

pt_status pt_pipe_stages(const pt_model_config *c, pt_sched_kind kind, int pp, int v, const char *spec,
                         int head_split, pt_chunk *stages) {
    int S = pp * v;
    if (kind != PT_SCHED_INTERLEAVED || (spec && spec[0]) || S > c->n_layers)
        return pt_pipe_split(c, S, spec, head_split, stages);
    pt_pipe_even_split(c->n_layers, S, stages);
    return PT_OK;
}

/* Spreads V rows over S stages whose other work costs cost[s], a row costing unit: each stage
 * gets rows up to a common level λ (water-filling: Σ max(0, λ − cost[s]) = V·unit), at least one,
 * what rounding leaves (or takes) going to (or from) the last stages first. */
static void pt_water_fill(const double *cost, int S, double unit, int V, int *rows) {
    double lo = 0, hi = 0, total = (double)V * unit;
    for (int s = 0; s < S; s++) hi = fmax(hi, cost[s]);
    hi += total;
    for (int it = 0; it < 200; it++) {
        double lam = 0.5 * (lo + hi), got = 0;
        for (int s = 0; s < S; s++) got += fmax(0.0, lam - cost[s]);
        if (got < total) lo = lam;
        else hi = lam;
    }
    int given = 0;
    for (int s = 0; s < S; s++) {
        double r = unit > 0 ? floor(fmax(0.0, hi - cost[s]) / unit) : (double)V / S;
        rows[s] = r < 1 ? 1 : r > V ? V : (int)r;
        given += rows[s];
    }
    for (int s = S - 1; given != V; s = s > 0 ? s - 1 : S - 1) {
        if (given < V) rows[s]++, given++;
        else if (rows[s] > 1) rows[s]--, given--;
    }
}

pt_status pt_pipe_head_rows(const pt_model_config *c, int S, int tp, const pt_chunk *stages,
                            const char *spec, int *rows) {
    int V = c->vocab_size;
    if (S > V)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_head = split: %d stages exceed "
                         "model.vocab_size = %d rows of the head", S, V);
    if (spec && spec[0]) {
        PT_TRY(pt_pipe_parse_counts("parallel.pp_head_rows", spec, S, "model.vocab_size", V, rows));
    } else { /* the cost model's: each stage's layers, a row of the head C */
        double *cost = pt_calloc((size_t)S, sizeof *cost);
        for (int s = 0; s < S; s++)
            for (int l = stages[s].l0; l < stages[s].l1; l++) cost[s] += pt_pipe_layer_cost(c, l);
        pt_water_fill(cost, S, c->dim, V, rows);
        free(cost);
    }
    int least = 0; /* every tp rank of a stage holds some of its rows */
    for (int s = 1; s < S; s++) least = rows[s] < rows[least] ? s : least;
    if (rows[least] < tp)
        return pt_errorf(PT_ERR_CONFIG, "parallel.pp_head = split: stage %d's %d vocabulary rows "
                         "are fewer than parallel.tp = %d", least, rows[least], tp);
    return PT_OK;
}

void pt_pipe_head_balance(int S, const double *layers_s, const double *head_s, const int *rows,
                          int *out) {
    double hs = 0;
    int V = 0;
    for (int s = 0; s < S; s++) hs += head_s[s], V += rows[s];
    pt_water_fill(layers_s, S, V > 0 ? hs / V : 0, V, out);
}

/* ------------------------------------------------------------------------------------------ */

/* Sets whose last action is done but whose sends may still be in flight: they rejoin the pool
 * once the sends complete (waiting for a send could deadlock: its receiver may be waiting for
 * us), and they no longer count as held. */
static void pt_pipe_drain(pt_pipe *p, int all) {
    for (int i = 0; i < p->n_draining;) {
        pt_pipe_slot *d = &p->draining[i];
        int done = 1;
        for (int k = 2; k < 4; k++) {
            if (d->req[k] && all) pt_comm_wait(p->pp, d->req[k]), d->req[k] = NULL;
            if (d->req[k] && p->pp->test(p->pp, d->req[k])) d->req[k] = NULL;
            done &= d->req[k] == NULL;
        }
        if (!done) {
            i++;
            continue;
        }
        p->pool[(size_t)d->left * p->m * 2 + p->pool_n[d->left]++] = d->a; /* left: the chunk */
        p->draining[i] = p->draining[--p->n_draining];
    }
}

static pt_acts *pt_pipe_take(pt_pipe *p, int c) {
    if (!p->pool_n[c]) pt_pipe_drain(p, 0);
    pt_acts *a = p->pool_n[c] ? p->pool[(size_t)c * p->m * 2 + --p->pool_n[c]]
                              : pt_acts_create_chunk(p->model, p->B, p->T, c, p->zb);
    p->set_bytes[c] = pt_acts_bytes(a);
    if (++p->live[c] > p->peak[c]) p->peak[c] = p->live[c];
    return a;
}

/* The slot's set leaves it: receives are complete (its actions waited for them); its sends go
 * to the draining list with the set. */
static void pt_pipe_give(pt_pipe *p, int c, pt_pipe_slot *s) {
    pt_pipe_slot *d = &p->draining[p->n_draining++];
    *d = *s;
    d->left = c;
    p->live[c]--;
    memset(s, 0, sizeof *s);
}

/* The chunk on rank r whose result the compute action x takes without a message (the bottom of
 * dualpipev's V: chunk 1's forward takes chunk 0's output, chunk 0's backward takes chunk 1's
 * input gradient), or -1. */
static int pt_local_source(const pt_schedule *s, int r, const pt_action *x) {
    int st = pt_schedule_stage(s->kind, s->pp, s->v, r, x->chunk), from, rank, chunk;
    if (x->kind == PT_ACT_FWD) from = st - 1;
    else if (x->kind == PT_ACT_BWD || x->kind == PT_ACT_BWD_INPUT) from = st + 1;
    else return -1;
    if (from < 0 || from >= s->pp * s->v) return -1;
    pt_schedule_locate(s->kind, s->pp, s->v, from, &rank, &chunk);
    return rank == r ? chunk : -1;
}

static int pt_pipe_local_source(const pt_pipe *p, const pt_action *x) {
    return pt_local_source(&p->sched, p->rank, x);
}

void pt_pipe_count_uses(const pt_schedule *s, int r, int *uses) {
    const pt_action *acts = s->a[r];
    memset(uses, 0, (size_t)s->m * s->v * sizeof *uses);
    for (int i = 0; i < s->n[r]; i++) {
        int src = pt_local_source(s, r, &acts[i]);
        uses[acts[i].micro * s->v + acts[i].chunk]++;
        if (src >= 0) uses[acts[i].micro * s->v + src]++;
    }
}

void pt_pipe_held_sets(const pt_schedule *s, int r, const int *uses, int *most) {
    int n = s->n[r], *left = pt_calloc((size_t)s->m * s->v, sizeof *left);
    int *held = pt_calloc((size_t)s->v, sizeof *held), *seen = pt_calloc((size_t)s->m * s->v, sizeof *seen);
    const pt_action *acts = s->a[r];
    memcpy(left, uses, (size_t)s->m * s->v * sizeof *left);
    for (int c = 0; c < s->v; c++) most[c] = 0;
    for (int i = 0; i < n; i++) {
        int c = acts[i].chunk, k = acts[i].micro * s->v + c, src = pt_local_source(s, r, &acts[i]);
        if (!seen[k]++ && ++held[c] > most[c]) most[c] = held[c];
        if (--left[k] == 0) held[c]--;
        if (src >= 0 && --left[acts[i].micro * s->v + src] == 0) held[src]--;
    }
    free(left), free(held), free(seen);
}

/* Makes, per chunk, the activation sets that this rank's action list holds at once
 * (pt_pipe_held_sets): the set-up's memory. A step makes more only while sends still pending hold
 * sets back. */
static void pt_pipe_prefill(pt_pipe *p) {
    int *most = pt_calloc((size_t)p->v, sizeof *most);
    pt_pipe_held_sets(&p->sched, p->rank, p->uses, most);
    p->setup_bytes = 0;
    for (int c = 0; c < p->v; c++)
        for (int i = 0; i < most[c]; i++) {
            pt_acts *a = pt_acts_create_chunk(p->model, p->B, p->T, c, p->zb);
            p->set_bytes[c] = pt_acts_bytes(a);
            p->setup_bytes += p->set_bytes[c];
            p->pool[(size_t)c * p->m * 2 + p->pool_n[c]++] = a;
        }
    free(most);
}

static size_t pt_pipe_count(const pt_pipe *p);
pt_status pt_pipe_init(pt_pipe *p, pt_model *m, pt_comm *pp, pt_sched_kind kind, int v, int n_micro,
                       int B, int T) {
    memset(p, 0, sizeof *p);
    v = pt_schedule_chunks(kind, v);
    /* the head split: a HEAD's cost against a stage's forward, in the cost model's terms (its
     * forward and backward, 3·V·C/pp, against the layers' forwards, Σ/pp), to place the HEADs */
    double layers = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) layers += pt_pipe_layer_cost(&m->cfg, l);
    double head = m->par.head_split ? 3.0 * m->cfg.vocab_size * m->cfg.dim / layers : 0;
    PT_TRY(pt_schedule_build_head(&p->sched, kind, pp->size, n_micro, v, head));
    pt_status st = pt_schedule_check(&p->sched);
    if (st != PT_OK) {
        pt_schedule_free(&p->sched);
        return st;
    }
    p->model = m;
    p->pp = pp;
    p->rank = pp->rank;
    p->v = v;
    p->m = n_micro;
    p->head_cost = head;
    p->S = pp->size * v;
    p->B = B;
    p->T = T;
    p->zb = pt_schedule_splits_backward(kind);
    p->slot = pt_calloc((size_t)n_micro * v, sizeof *p->slot);
    p->uses = pt_calloc((size_t)n_micro * v, sizeof *p->uses);
    pt_pipe_count_uses(&p->sched, p->rank, p->uses);
    p->pool = pt_calloc((size_t)n_micro * v * 2, sizeof *p->pool);
    p->draining = pt_calloc((size_t)n_micro * v * 2, sizeof *p->draining);
    p->pool_n = pt_calloc((size_t)v, sizeof *p->pool_n);
    p->live = pt_calloc((size_t)v, sizeof *p->live);
    p->peak = pt_calloc((size_t)v, sizeof *p->peak);
    p->set_bytes = pt_calloc((size_t)v, sizeof *p->set_bytes);
    /* up to four transfers per activation set in flight: twice their requests made now (the pool
     * grows when half of it is pending) */
    pt_comm_reserve(pp, 2 * (4 * n_micro * v * 2) + 4 + 2 * pp->size);
    pt_pipe_prefill(p);
    if (m->par.head_split) {
        int last = p->rank == pp->size - 1;
        p->head = pt_head_ws_create(m, B * T, !last);
        p->head_req = pt_calloc((size_t)pp->size, sizeof *p->head_req);
        if (last)
            p->head_parts = m->be->alloc(m->be, (size_t)(pp->size - 1) * pt_pipe_count(p) * sizeof(float));
        p->setup_bytes += pt_head_ws_bytes(p->head) +
                          (last ? (size_t)(pp->size - 1) * pt_pipe_count(p) * sizeof(float) : 0);
    }
    return PT_OK;
}

void pt_pipe_free(pt_pipe *p) {
    if (!p->model) return;
    pt_pipe_drain(p, 1);
    for (int c = 0; c < p->v; c++)
        for (int i = 0; i < p->pool_n[c]; i++) pt_acts_free(p->model, p->pool[(size_t)c * p->m * 2 + i]);
    for (int i = 0; i < p->m * p->v; i++)
        if (p->slot[i].a) pt_acts_free(p->model, p->slot[i].a);
    pt_schedule_free(&p->sched);
    pt_head_ws_free(p->model, p->head);
    if (p->head_parts) p->model->be->free(p->model->be, p->head_parts);
    free(p->head_req);
    free(p->slot);
    free(p->uses);
    free(p->pool);
    free(p->draining);
    free(p->pool_n);
    free(p->live);
    free(p->peak);
    free(p->set_bytes);
    memset(p, 0, sizeof *p);
}

size_t pt_pipe_peak_bytes(const pt_pipe *p) {
    size_t n = 0;
    for (int c = 0; c < p->v; c++) n += (size_t)p->peak[c] * p->set_bytes[c];
    return n;
}

/* A message's tag: the micro-batch, the sending stage and the direction, so that the two ends
 * agree whatever the chunks' numbers on each side. */
static int pt_pipe_tag(const pt_pipe *p, int micro, int sender_stage, int bwd) {
    return (micro * p->S + sender_stage) * 2 + bwd;
}

static void pt_pipe_wait(pt_pipe *p, pt_comm_req **r) {
    if (*r) pt_comm_wait(p->pp, *r);
    *r = NULL;
}

/* Lets pending transfers progress (MPI moves data only inside its calls). */
static void pt_pipe_poll(pt_pipe *p) {
    for (int i = 0; i < p->m * p->v; i++)
        for (int k = 0; k < 4; k++)
            if (p->slot[i].req[k] && p->pp->test(p->pp, p->slot[i].req[k])) p->slot[i].req[k] = NULL;
    pt_pipe_drain(p, 0);
}

/* Elements of the residual stream a stage sends and receives per micro-batch (sequence
 * parallel: this rank's share of the rows). */
static size_t pt_pipe_count(const pt_pipe *p) {
    const pt_model *m = p->model;
    size_t rows = (size_t)p->B * p->T;
    return (m->par.sp && m->par.tp > 1 ? rows / (size_t)m->par.tp : rows) * m->cfg.dim;
}

/* The residual stream's type on the wire: the model's activation elements (bf16 or fp32). */
static pt_dtype pt_pipe_act_dtype(const pt_pipe *p) {
    return p->model->act_size == 2 ? PT_DTYPE_BF16 : PT_DTYPE_F32;
}

/* A hand-off between two stages on this rank (dualpipev's bottom): x's forward takes the other
 * chunk's output as its input, or x's backward the other chunk's input gradient as its output's;
 * the source's set has then served this use (counted in its slot's `left`). */
static void pt_pipe_hand_off(pt_pipe *p, const pt_action *x, int src) {
    pt_pipe_slot *from = &p->slot[x->micro * p->v + src], *to = &p->slot[x->micro * p->v + x->chunk];
    pt_backend *be = p->model->be;
    size_t n = pt_pipe_count(p);
    if (x->kind == PT_ACT_FWD)
        be->copy(be, pt_acts_input(to->a), pt_acts_output(from->a), n * (size_t)p->model->act_size);
    else
        be->copy(be, pt_acts_grad(to->a), pt_acts_grad(from->a), n * sizeof(float));
    if (--from->left == 0) pt_pipe_give(p, src, from);
}

/* The tags of the head's messages: past every stage-to-stage tag (pt_pipe_tag). */
static int pt_pipe_head_tag(const pt_pipe *p, int micro, int grad) {
    return (p->m * p->S + micro) * 2 + grad;
}

/* HEAD of a micro-batch, the head split over the pipeline ranks (every rank at once): the last
 * rank's final-norm output xf (in `a` there) sent to every rank, each rank's head and loss over
 * its vocabulary rows (the row statistics combined inside pt_model_head), and without eval each
 * rank's part of xf's gradient summed onto the last rank, in rank order after its own, into a's
 * dxf, which the last stage's backward takes. Returns the loss on the last rank (0 elsewhere: the
 * other ranks compute the same). */
static double pt_pipe_head(pt_pipe *p, pt_acts *a, int micro, const int32_t *targets,
                           float loss_scale, int eval) {
    pt_model *m = p->model;
    int np = p->pp->size, last = np - 1, N = p->B * p->T;
    size_t nxf = (size_t)N * m->cfg.dim, ng = pt_pipe_count(p);
    pt_dtype act = pt_pipe_act_dtype(p);
    void *xf;
    float *dxf;
    if (p->rank == last) {
        xf = pt_acts_xf(a), dxf = pt_acts_dxf(a);
        for (int r = 0; r < last; r++)
            p->head_req[r] = p->pp->isend(p->pp, xf, nxf, act, r, pt_pipe_head_tag(p, micro, 0));
        for (int r = 0; r < last; r++) pt_comm_wait(p->pp, p->head_req[r]);
    } else {
        xf = pt_head_ws_xf(p->head), dxf = pt_head_ws_dxf(p->head);
        pt_comm_wait(p->pp, p->pp->irecv(p->pp, xf, nxf, act, last, pt_pipe_head_tag(p, micro, 0)));
    }
    double t0 = pt_now();
    double loss = pt_model_head(m, p->head, xf, dxf, targets, N, loss_scale, eval);
    if (!eval) p->head_s += pt_now() - t0;
    if (eval) return p->rank == last ? loss : 0.0;
    if (p->rank != last) {
        pt_comm_wait(p->pp, p->pp->isend(p->pp, dxf, ng, PT_DTYPE_F32, last, pt_pipe_head_tag(p, micro, 1)));
        return 0.0;
    }
    for (int r = 0; r < last; r++)
        p->head_req[r] = p->pp->irecv(p->pp, p->head_parts + (size_t)r * ng, ng, PT_DTYPE_F32, r,
                                      pt_pipe_head_tag(p, micro, 1));
    for (int r = 0; r < last; r++) {
        pt_comm_wait(p->pp, p->head_req[r]);
        m->be->add(m->be, dxf, p->head_parts + (size_t)r * ng, ng);
    }
    return loss;
}

double pt_pipe_step(pt_pipe *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos,
                    float loss_scale) {
    pt_model *m = p->model;
    int r = p->rank, n = p->sched.n[r];
    const pt_action *acts = p->sched.a[r];
    size_t rows = (size_t)p->B * p->T, count = pt_pipe_count(p);
    pt_dtype act = pt_pipe_act_dtype(p); /* the gradient is fp32 */
    /* how many uses each (micro-batch, chunk) has here: its slot is returned after the last */
    for (int i = 0; i < p->m * p->v; i++) p->slot[i].left = p->uses[i];
    double loss = 0.0, t0;
    for (int i = 0; i < n; i++) {
        const pt_action *x = &acts[i];
        double t_act = pt_now();
        pt_pipe_slot *s = &p->slot[x->micro * p->v + x->chunk];
        int stage = pt_schedule_stage(p->sched.kind, p->pp->size, p->v, r, x->chunk);
        int src = pt_pipe_local_source(p, x);
        const int32_t *tok = tokens + (size_t)x->micro * rows, *tgt = targets + (size_t)x->micro * rows;
        if (!s->a) s->a = pt_pipe_take(p, x->chunk);
        if (src >= 0) pt_pipe_hand_off(p, x, src);
        switch (x->kind) {
        case PT_ACT_RECV_FWD:
            s->req[0] = p->pp->irecv(p->pp, pt_acts_input(s->a), count, act, x->peer,
                                     pt_pipe_tag(p, x->micro, stage - 1, 0));
            break;
        case PT_ACT_RECV_BWD:
            s->req[1] = p->pp->irecv(p->pp, pt_acts_grad(s->a), count, PT_DTYPE_F32, x->peer,
                                     pt_pipe_tag(p, x->micro, stage + 1, 1));
            break;
        case PT_ACT_SEND_FWD:
            s->req[2] = p->pp->isend(p->pp, pt_acts_output(s->a), count, act, x->peer,
                                     pt_pipe_tag(p, x->micro, stage, 0));
            break;
        case PT_ACT_SEND_BWD:
            s->req[3] = p->pp->isend(p->pp, pt_acts_grad(s->a), count, PT_DTYPE_F32, x->peer,
                                     pt_pipe_tag(p, x->micro, stage, 1));
            break;
        case PT_ACT_FWD:
            pt_pipe_wait(p, &s->req[0]);
            pt_acts_set_documents(s->a, p->docs ? p->docs + (size_t)x->micro * rows : NULL,
                                  p->docs_restart);
            pt_acts_set_stats(s->a, p->stats);
            t0 = pt_now();
            loss += pt_model_forward(m, s->a, tok, tgt, pos, loss_scale, NULL);
            p->busy_s += pt_now() - t0;
            break;
        case PT_ACT_BWD:
        case PT_ACT_BWD_INPUT:
            pt_pipe_wait(p, &s->req[1]);
            /* the output's send must be done before backward may reuse nothing of it: it is
             * not written by backward, but the set must not return to the pool with it pending */
            t0 = pt_now();
            pt_model_backward_part(m, s->a, tok, x->kind == PT_ACT_BWD ? PT_BWD_ALL : PT_BWD_INPUT);
            p->busy_s += pt_now() - t0;
            break;
        case PT_ACT_BWD_WEIGHT:
            t0 = pt_now();
            pt_model_backward_part(m, s->a, tok, PT_BWD_WEIGHT);
            p->busy_s += pt_now() - t0;
            break;
        case PT_ACT_HEAD:
            loss += pt_pipe_head(p, s->a, x->micro, tgt, loss_scale, 0);
            break;
        }
        if (x->kind <= PT_ACT_BWD_WEIGHT || x->kind == PT_ACT_HEAD) /* with the waits before it */
            pt_trace_span(pt_schedule_action_name(x->kind), t_act, pt_now(), "micro", x->micro, "chunk",
                          x->chunk);
        if (--s->left == 0) pt_pipe_give(p, x->chunk, s);
        pt_pipe_poll(p);
    }
    pt_pipe_drain(p, 1); /* every send of the step complete */
    return loss;
}

void pt_pipe_set_documents(pt_pipe *p, const int32_t *docs, int restart) {
    p->docs = docs;
    p->docs_restart = restart;
}

double pt_pipe_eval(pt_pipe *p, const int32_t *tokens, const int32_t *targets, const int32_t *pos) {
    int r = p->rank, np = p->pp->size;
    size_t rows = (size_t)p->B * p->T, count = pt_pipe_count(p);
    pt_dtype act = pt_pipe_act_dtype(p);
    double loss = 0.0;
    /* (micro-batch, stage) in one order on every rank: a stage waits only for the one before it,
     * which its rank reaches first, so the blocking transfers cannot deadlock, and the messages
     * between two ranks match in order (the tag names the sending stage) */
    pt_sched_kind kind = p->sched.kind;
    for (int i = 0; i < p->m; i++) {
        for (int s = 0; s < p->S; s++) {
            int owner, c, prev = -1, pc = 0, next = -1, nc = 0;
            pt_schedule_locate(kind, np, p->v, s, &owner, &c);
            if (owner != r) continue;
            if (s > 0) pt_schedule_locate(kind, np, p->v, s - 1, &prev, &pc);
            if (s < p->S - 1) pt_schedule_locate(kind, np, p->v, s + 1, &next, &nc);
            PT_ASSERTF(p->pool_n[c] > 0, "pipeline evaluation: chunk %d has no idle activations", c);
            pt_acts *a = p->pool[(size_t)c * p->m * 2];
            const int32_t *tok = tokens + (size_t)i * rows, *tgt = targets + (size_t)i * rows;
            if (prev >= 0 && prev != r)
                pt_comm_wait(p->pp, p->pp->irecv(p->pp, pt_acts_input(a), count, act, prev,
                                                 pt_pipe_tag(p, 0, s - 1, 0)));
            else if (prev == r) /* the V's bottom: this rank's other chunk has just made the input */
                p->model->be->copy(p->model->be, pt_acts_input(a), pt_acts_output(p->pool[(size_t)pc * p->m * 2]),
                                   count * (size_t)p->model->act_size);
            pt_acts_set_documents(a, p->docs ? p->docs + (size_t)i * rows : NULL, p->docs_restart);
            loss += pt_model_eval_loss(p->model, a, tok, tgt, pos, NULL);
            if (next >= 0 && next != r)
                pt_comm_wait(p->pp, p->pp->isend(p->pp, pt_acts_output(a), count, act, next,
                                                 pt_pipe_tag(p, 0, s, 0)));
        }
        if (p->head) { /* the head split: every rank's part, after the last stage's forward */
            int owner, c;
            pt_schedule_locate(kind, np, p->v, p->S - 1, &owner, &c);
            loss += pt_pipe_head(p, owner == r ? p->pool[(size_t)c * p->m * 2] : NULL, i,
                                 targets + (size_t)i * rows, 0.0f, 1);
        }
    }
    return loss;
}
