/* schedule_cmd.c: `pentatron schedule`: builds a pipeline schedule, checks it, simulates it with
 * unit costs and draws it (a text timeline, and an SVG on request). No model, no MPI. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/commands.h"
#include "pt/schedule.h"

static void pt_schedule_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron schedule [--pp N] [--microbatches M] [--schedule KIND] [--virtual V]\n"
            "                          [--layers L0,L1,...] [--head-split [--head-cost H]] [--svg FILE]\n"
            "\n"
            "Builds the per-rank action lists (forward, backward, send, receive) of a pipeline-parallel\n"
            "step, checks them (every send received, every stage computed once per micro-batch in a\n"
            "valid order, no deadlock under blocking receives), simulates them with unit costs and\n"
            "prints the timeline, the bubble and the peak number of micro-batches in flight per rank.\n"
            "\n"
            "  --pp N             pipeline ranks (default 4)\n"
            "  --microbatches M   micro-batches per step (default 8)\n"
            "  --schedule KIND    afab (GPipe), 1f1b (PipeDream-flush), interleaved (Megatron's\n"
            "                     interleaved 1F1B), zb (ZB-H1 zero bubble) or dualpipev (DeepSeek's\n"
            "                     DualPipeV: 2 chunks per rank in a V, M >= 2N); default 1f1b\n"
            "  --virtual V        model chunks per rank, interleaved only (default 2; any M)\n"
            "  --layers L0,...    uneven stages: each of the N·V stages' layers (parallel.pp_layers'\n"
            "                     format, stage order), its actions' costs scaled by them\n"
            "  --head-split       the head and loss split over the N ranks (afab, 1f1b or zb): every\n"
            "                     rank runs HEAD(i), a collective over all of them, before its\n"
            "                     backward of micro-batch i; drawn as H\n"
            "  --head-cost H      the time of one HEAD on each rank (default 1, a forward's cost)\n"
            "  --svg FILE         also draw the timeline as an SVG file\n"
            "  --help             print this help\n"
            "\n"
            "Costs per chunk: forward 1, backward 2; zb and dualpipev split the backward into B = 1\n"
            "(input gradient) and W = 1 (weight gradient). Communication is free. The bubble is idle\n"
            "time divided by compute time over all ranks, (pp·makespan − busy)/busy, which the\n"
            "literature gives as (pp − 1)/m for afab and 1f1b and (pp − 1)/(v·m) for interleaved\n"
            "(any M >= N; M < N: (pp − 1 + (v − 1)(N − M))/(v·m)); with --layers, afab's flow-shop\n"
            "(pp(Σw + (m − 1)max w) − mΣw)/(mΣw), and for the others the busiest rank's bound\n"
            "pp·max_r Σ_c w / Σw − 1 (the imbalance alone; the order's own bubble comes on top);\n"
            "DualPipeV's is published as idle time per rank, (PP/2 − 1)(F&B + B − 3W) with PP = 2N\n"
            "stages, F&B = F + B here (one after the other), B the full backward: it is printed\n"
            "both ways. With --head-split the HEADs count as compute (H on every rank) and these\n"
            "formulas, which have no head collective, are not printed (n/a).\n");
}

typedef struct {
    int pp, m, v, head;
    double head_cost;
    int head_cost_set;
    pt_sched_kind kind;
    const char *svg;
    const char *layers;
} pt_sched_args;

static pt_status pt_parse_int(const char *opt, const char *s, int *out) {
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < INT_MIN || x > INT_MAX)
        return pt_errorf(PT_ERR_CONFIG, "schedule: %s needs an integer, got \"%s\"", opt, s);
    *out = (int)x;
    return PT_OK;
}

static pt_status pt_parse_cost(const char *opt, const char *s, double *out) {
    char *end;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !(x > 0) || x > 1e12)
        return pt_errorf(PT_ERR_CONFIG, "schedule: %s needs a time > 0, got \"%s\"", opt, s);
    *out = x;
    return PT_OK;
}

/* Fills a (or sets *help for --help); PT_ERR_CONFIG naming the bad argument. */
static pt_status pt_sched_parse(int argc, char **argv, pt_sched_args *a, int *help) {
    *a = (pt_sched_args){.pp = 4, .m = 8, .v = 0, .head_cost = 1, .kind = PT_SCHED_1F1B};
    *help = 0;
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i];
        if (!strcmp(opt, "--help") || !strcmp(opt, "-h")) {
            *help = 1;
            return PT_OK;
        }
        if (!strcmp(opt, "--head-split")) {
            a->head = 1;
            continue;
        }
        int known = !strcmp(opt, "--pp") || !strcmp(opt, "--microbatches") || !strcmp(opt, "--schedule") ||
                    !strcmp(opt, "--virtual") || !strcmp(opt, "--svg") || !strcmp(opt, "--head-cost") ||
                    !strcmp(opt, "--layers");
        if (!known) return pt_errorf(PT_ERR_CONFIG, "schedule: %s is not an option (see --help)", opt);
        if (i + 1 >= argc) return pt_errorf(PT_ERR_CONFIG, "schedule: %s needs a value", opt);
        const char *val = argv[++i];
        if (!strcmp(opt, "--pp")) PT_TRY(pt_parse_int(opt, val, &a->pp));
        else if (!strcmp(opt, "--microbatches")) PT_TRY(pt_parse_int(opt, val, &a->m));
        else if (!strcmp(opt, "--virtual")) PT_TRY(pt_parse_int(opt, val, &a->v));
        else if (!strcmp(opt, "--schedule")) PT_TRY(pt_schedule_parse_kind(val, &a->kind));
        else if (!strcmp(opt, "--head-cost")) {
            PT_TRY(pt_parse_cost(opt, val, &a->head_cost));
            a->head_cost_set = 1;
        } else if (!strcmp(opt, "--layers")) a->layers = val;
        else a->svg = val;
    }
    if (a->svg) PT_TRY(pt_check_output(a->svg, 0, "schedule --svg")); /* a FIFO: replaced */
    if (a->head_cost_set && !a->head)
        return pt_errorf(PT_ERR_CONFIG, "schedule: --head-cost needs --head-split (without it the head is "
                                        "part of the last stage's forward and backward)");
    if (a->v == 0) a->v = a->kind == PT_SCHED_INTERLEAVED ? 2 : pt_schedule_chunks(a->kind, 1);
    return PT_OK;
}

/* DualPipeV's published bubble is idle time per rank: next to ours, and ours as idle per rank. */
static void pt_print_idle(const pt_schedule *s, const pt_sched_sim *sim) {
    double idle = sim->makespan - sim->busy / s->pp, want = pt_schedule_idle_formula(s, sim->f, sim->b, sim->w);
    printf("   idle per rank %g; formula (PP/2-1)(F&B+B-3W), PP = %d stages, F&B = F+B = %g: %g "
           "(as idle/busy: %.4f)\n",
           idle, 2 * s->pp, sim->f + sim->b + sim->w, want, want * s->pp / sim->busy);
}

/* The bubble next to what to compare it with: the formula, or for zb 1F1B under the same costs. */
static pt_status pt_print_bubble(const pt_schedule *s, const pt_sched_sim *sim) {
    printf("bubble (idle / busy over all ranks): %.4f", sim->bubble);
    if (s->head) {
        printf("   formula n/a (head split: %d HEADs of %g on every rank, busy included)\n", s->m, sim->h);
        return PT_OK;
    }
    if (s->weight) { /* the published figures assume even stages */
        if (s->kind == PT_SCHED_AFAB)
            printf("   formula (flow shop) (pp(Σw+(m-1)max w)-mΣw)/(mΣw) = %.4f\n", pt_schedule_bubble_formula(s));
        else
            printf("   the busiest rank's bound pp·max_r Σ_c w/Σw - 1 = %.4f (uneven stages)\n",
                   pt_schedule_bubble_bound(s));
        return PT_OK;
    }
    if (s->kind == PT_SCHED_DUALPIPEV) {
        pt_print_idle(s, sim);
        return PT_OK;
    }
    if (s->kind != PT_SCHED_ZB) {
        int short_by = s->m < s->pp ? s->pp - s->m : 0;
        printf("   formula (pp-1+(v-1)max(0,pp-m))/(v*m) = %d/%d = %.4f\n", s->pp - 1 + (s->v - 1) * short_by,
               s->v * s->m, pt_schedule_bubble_formula(s));
        return PT_OK;
    }
    pt_schedule ref;
    pt_sched_sim rs;
    PT_TRY(pt_schedule_build(&ref, PT_SCHED_1F1B, s->pp, s->m, 1));
    pt_status st = pt_schedule_simulate(&ref, sim->f, sim->b + sim->w, 0, &rs);
    if (st == PT_OK) printf("   1f1b with F=%g B=%g: %.4f", sim->f, sim->b + sim->w, rs.bubble);
    /* ZB-H1 leaves (pp − 1)(F + B − W) idle per rank once the pipeline is full (m ≥ pp) */
    if (st == PT_OK && s->m >= s->pp)
        printf("; ZB-H1 (pp-1)(F+B-W)/(m(F+B+W)) = %.4f",
               (s->pp - 1) * (sim->f + sim->b - sim->w) / (s->m * (sim->f + sim->b + sim->w)));
    printf("\n");
    pt_sched_sim_free(&rs);
    pt_schedule_free(&ref);
    return st;
}

static void pt_print_peaks(const pt_schedule *s, const pt_sched_sim *sim) {
    printf("peak in-flight %s per rank:", s->v > 1 ? "(micro-batch, chunk) pairs" : "micro-batches");
    for (int r = 0; r < s->pp; r++) printf("%s rank %d: %d", r ? "," : "", r, sim->peak_inflight[r]);
    if (pt_schedule_peak_formula(s) > 0) printf("; published PP + 1 = %d", pt_schedule_peak_formula(s));
    printf("\n");
}

/* --layers: the stages' layers as the simulation's weights. */
static pt_status pt_sched_weights(pt_schedule *s, const char *spec) {
    int S = s->pp * s->v, n = 0;
    double *w = pt_malloc((size_t)S * sizeof *w);
    pt_status st = PT_OK;
    for (const char *p = spec; st == PT_OK && *p;) {
        char *end;
        long k = strtol(p, &end, 10);
        if (end == p || k < 1 || k > INT_MAX || (*end && *end != ',') || n == S)
            st = pt_errorf(PT_ERR_CONFIG, "schedule: --layers \"%s\": expected %d positive counts separated by commas "
                           "(one per stage, pp × chunks = %d × %d)", spec, S, s->pp, s->v);
        else
            w[n++] = (double)k, p = *end ? end + 1 : end;
    }
    if (st == PT_OK && n != S)
        st = pt_errorf(PT_ERR_CONFIG, "schedule: --layers \"%s\": %d counts, expected %d (one per stage, pp × chunks = "
                       "%d × %d)", spec, n, S, s->pp, s->v);
    if (st == PT_OK) st = pt_schedule_set_weights(s, w);
    free(w);
    return st;
}

static pt_status pt_sched_report(const pt_schedule *s, double h, const char *svg) {
    double f = 1, b = 2, w = 0;
    if (pt_schedule_splits_backward(s->kind)) b = w = 1;
    pt_sched_sim sim;
    PT_TRY(pt_schedule_simulate_head(s, f, b, w, h, &sim)); /* checks the schedule first */
    int actions = 0;
    for (int r = 0; r < s->pp; r++) actions += s->n[r];
    pt_schedule_print(s, &sim, stdout);
    printf("checked: %d actions on %d ranks, every send received%s, no deadlock; makespan %g\n", actions, s->pp,
           s->head ? ", every HEAD met by all ranks in order" : "", sim.makespan);
    pt_status st = pt_print_bubble(s, &sim);
    pt_print_peaks(s, &sim);
    if (st == PT_OK && svg) {
        st = pt_schedule_svg(s, &sim, svg);
        if (st == PT_OK) printf("wrote %s\n", svg);
    }
    pt_sched_sim_free(&sim);
    return st;
}

int pt_cmd_schedule(int argc, char **argv) {
    pt_sched_args a;
    int help;
    pt_schedule s;
    pt_status st = pt_sched_parse(argc, argv, &a, &help);
    if (st == PT_OK && help) {
        pt_schedule_usage(stdout);
        return 0;
    }
    if (st == PT_OK) st = pt_schedule_build_head(&s, a.kind, a.pp, a.m, a.v, a.head ? a.head_cost : 0);
    if (st == PT_OK && a.layers) {
        st = pt_sched_weights(&s, a.layers);
        if (st != PT_OK) pt_schedule_free(&s);
    }
    if (st != PT_OK) {
        pt_log_error("%s", pt_last_error());
        return pt_cli_exit(st, 0);
    }
    st = pt_sched_report(&s, a.head ? a.head_cost : 0, a.svg);
    pt_schedule_free(&s);
    if (st != PT_OK) pt_log_error("%s", pt_last_error());
    return pt_cli_exit(st, 1); /* (the SVG's write) */
}
