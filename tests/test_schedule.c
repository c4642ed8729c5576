/* test_schedule.c: pipeline schedules: every built schedule passes the checker and has the
 * bubble and peak in-flight that the literature gives (dualpipev: the DualPipe README's); the
 * stage maps (round-robin, the V); broken schedules are rejected by name; the head split's HEAD
 * collectives (placement, checker rules, simulated time, drawing, `pentatron schedule`). */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/pipeline.h"
#include "pt/schedule.h"
#include "testutil.h"

static const int pps[] = {2, 4};
static const int ms[] = {1, 2, 3, 4, 8};
enum { N_PP = 2, N_M = 5 };

static void build_ok(pt_schedule *s, pt_sched_kind kind, int pp, int m, int v) {
    if (pt_schedule_build(s, kind, pp, m, v) != PT_OK)
        fail_msg("build %s pp=%d m=%d v=%d: %s", pt_schedule_kind_name(kind), pp, m, v, pt_last_error());
}

static void check_ok(const pt_schedule *s) {
    if (pt_schedule_check(s) != PT_OK)
        fail_msg("check %s pp=%d m=%d v=%d: %s", pt_schedule_kind_name(s->kind), s->pp, s->m, s->v,
                 pt_last_error());
}

static void simulate_ok(const pt_schedule *s, double f, double b, double w, pt_sched_sim *sim) {
    if (pt_schedule_simulate(s, f, b, w, sim) != PT_OK)
        fail_msg("simulate %s pp=%d m=%d: %s", pt_schedule_kind_name(s->kind), s->pp, s->m, pt_last_error());
}

static void expect_near(const char *what, double got, double want) {
    if (fabs(got - want) > 1e-12) fail_msg("%s: got %.15g, expected %.15g", what, got, want);
}

/* Fails unless st is an error whose message contains every needle. */
static void expect_message(pt_status st, const char *const *needles, int n) {
    if (st == PT_OK) fail_msg("a broken schedule was accepted");
    for (int i = 0; i < n; i++)
        if (!strstr(pt_last_error(), needles[i]))
            fail_msg("error \"%s\" does not mention \"%s\"", pt_last_error(), needles[i]);
}
#define EXPECT_MESSAGE(st, ...)                                                                \
    expect_message((st), (const char *const[]){__VA_ARGS__},                                   \
                   (int)(sizeof((const char *const[]){__VA_ARGS__}) / sizeof(const char *)))

static int count_kind(const pt_schedule *s, int r, pt_act_kind k) {
    int n = 0;
    for (int i = 0; i < s->n[r]; i++) n += s->a[r][i].kind == k;
    return n;
}

static void test_kind_names_round_trip(void **state) {
    (void)state;
    const char *names[] = {"afab", "1f1b", "interleaved", "zb", "dualpipev"};
    for (int k = 0; k < 5; k++) {
        pt_sched_kind got;
        assert_int_equal(pt_schedule_parse_kind(names[k], &got), PT_OK);
        assert_int_equal(got, k);
        assert_string_equal(pt_schedule_kind_name(got), names[k]);
    }
    pt_sched_kind got;
    EXPECT_MESSAGE(pt_schedule_parse_kind("gpipe", &got), "gpipe", "afab, 1f1b, interleaved, zb or dualpipev");
}

/* Every built schedule passes the checker, and each rank computes each (micro, chunk) once:
 * counted here independently of the checker. zb splits every backward; dualpipev splits those of
 * its phases 3, 6 (half) and 7: (pp − r − 1) + (r + 1) + (pp − r − 1) = 2pp − r − 1 on rank r. */
static void check_counts(const pt_schedule *s) {
    int mv = s->m * s->v;
    for (int r = 0; r < s->pp; r++) {
        int split = s->kind == PT_SCHED_ZB ? mv : s->kind == PT_SCHED_DUALPIPEV ? 2 * s->pp - r - 1 : 0;
        assert_int_equal(count_kind(s, r, PT_ACT_FWD), mv);
        assert_int_equal(count_kind(s, r, PT_ACT_BWD), mv - split);
        assert_int_equal(count_kind(s, r, PT_ACT_BWD_INPUT), split);
        assert_int_equal(count_kind(s, r, PT_ACT_BWD_WEIGHT), split);
    }
}

static void test_built_schedules_pass_the_check(void **state) {
    (void)state;
    const pt_sched_kind flat[] = {PT_SCHED_AFAB, PT_SCHED_1F1B, PT_SCHED_ZB};
    pt_schedule s;
    for (int p = 0; p < N_PP; p++) {
        for (int i = 0; i < N_M; i++) {
            for (int k = 0; k < 3; k++) {
                build_ok(&s, flat[k], pps[p], ms[i], 1);
                check_ok(&s);
                check_counts(&s);
                pt_schedule_free(&s);
            }
        }
    }
    /* interleaved where m is a multiple of pp, where it is not (fewer or more micro-batches than
     * stages: test_flexible_interleaved has them all), and one rank holding every chunk */
    const int shapes[][3] = {{2, 4, 2}, {2, 8, 2}, {4, 4, 2}, {4, 8, 2}, {4, 8, 3}, {1, 3, 2},
                             {2, 2, 2}, {2, 3, 2}, {2, 5, 2}, {4, 6, 2}, {4, 3, 2}, {4, 11, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        build_ok(&s, PT_SCHED_INTERLEAVED, shapes[i][0], shapes[i][1], shapes[i][2]);
        check_ok(&s);
        check_counts(&s);
        pt_schedule_free(&s);
    }
    /* dualpipev from its least m = 2pp up, odd pp too, and one rank holding the whole V */
    for (int pp = 1; pp <= 6; pp++) {
        const int mm[] = {2 * pp, 2 * pp + 1, 3 * pp, 4 * pp + 3};
        for (int i = 0; i < 4; i++) {
            build_ok(&s, PT_SCHED_DUALPIPEV, pp, mm[i], 2);
            check_ok(&s);
            check_counts(&s);
            pt_schedule_free(&s);
        }
    }
}

/* The stage map: round-robin for every kind but dualpipev, whose V gives rank r stages r and
 * 2pp − 1 − r; pt_schedule_locate inverts pt_schedule_stage. */
static void test_stage_map(void **state) {
    (void)state;
    for (int k = 0; k <= PT_SCHED_DUALPIPEV; k++) {
        int pp = 4, v = pt_schedule_chunks((pt_sched_kind)k, 2);
        assert_int_equal(v, 2);
        for (int r = 0; r < pp; r++)
            for (int c = 0; c < v; c++) {
                int st = pt_schedule_stage((pt_sched_kind)k, pp, v, r, c), rr, cc;
                int want = k == PT_SCHED_DUALPIPEV ? (c == 0 ? r : 2 * pp - 1 - r) : c * pp + r;
                assert_int_equal(st, want);
                pt_schedule_locate((pt_sched_kind)k, pp, v, st, &rr, &cc);
                assert_int_equal(rr, r);
                assert_int_equal(cc, c);
            }
    }
    assert_int_equal(pt_schedule_chunks(PT_SCHED_DUALPIPEV, 1), 2);
    assert_int_equal(pt_schedule_chunks(PT_SCHED_1F1B, 1), 1);
}

/* The V's messages: chunk 0 forwards down the ranks, chunk 1 back up; the bottom rank hands
 * chunk 0's output to its chunk 1 locally (no message), and rank 0's chunk 1 ends the model
 * (sends nothing forward; its input comes from rank 1). */
static void test_dualpipev_messages(void **state) {
    (void)state;
    pt_schedule s;
    int pp = 4, m = 8;
    build_ok(&s, PT_SCHED_DUALPIPEV, pp, m, 2);
    for (int r = 0; r < pp; r++) {
        int fwd_down = 0, fwd_up = 0, in0 = 0, in1 = 0;
        for (int k = 0; k < s.n[r]; k++) {
            const pt_action *x = &s.a[r][k];
            if (x->kind == PT_ACT_SEND_FWD) {
                if (x->chunk == 0) assert_int_equal(x->peer, r + 1);
                if (x->chunk == 1) assert_int_equal(x->peer, r - 1);
                fwd_down += x->chunk == 0, fwd_up += x->chunk == 1;
            }
            if (x->kind == PT_ACT_RECV_FWD) in0 += x->chunk == 0, in1 += x->chunk == 1;
        }
        assert_int_equal(fwd_down, r < pp - 1 ? m : 0); /* the bottom: local */
        assert_int_equal(fwd_up, r > 0 ? m : 0);         /* rank 0's chunk 1 is the last stage */
        assert_int_equal(in0, r > 0 ? m : 0);
        assert_int_equal(in1, r < pp - 1 ? m : 0);
    }
    pt_schedule_free(&s);
}

/* Messages carry the neighbouring stage's rank; with interleaving the last rank's chunk c sends
 * forward to rank 0 (chunk c + 1), and rank 0 receives its chunk 1 input from the last rank. */
static void test_interleaved_wraps_to_rank_zero(void **state) {
    (void)state;
    pt_schedule s;
    build_ok(&s, PT_SCHED_INTERLEAVED, 4, 4, 2);
    int wrap_send = 0, wrap_recv = 0;
    for (int k = 0; k < s.n[3]; k++)
        wrap_send += s.a[3][k].kind == PT_ACT_SEND_FWD && s.a[3][k].chunk == 0 && s.a[3][k].peer == 0;
    for (int k = 0; k < s.n[0]; k++)
        wrap_recv += s.a[0][k].kind == PT_ACT_RECV_FWD && s.a[0][k].chunk == 1 && s.a[0][k].peer == 3;
    assert_int_equal(wrap_send, 4);
    assert_int_equal(wrap_recv, 4);
    pt_schedule_free(&s);
}

/* idle / busy = (pp − 1)/m for afab and 1f1b, whatever f and b are. */
static void test_bubble_of_afab_and_1f1b(void **state) {
    (void)state;
    const double costs[][2] = {{1, 1}, {1, 2}};
    const pt_sched_kind kinds[] = {PT_SCHED_AFAB, PT_SCHED_1F1B};
    for (int p = 0; p < N_PP; p++) {
        for (int i = 0; i < N_M; i++) {
            for (int k = 0; k < 2; k++) {
                for (int c = 0; c < 2; c++) {
                    pt_schedule s;
                    pt_sched_sim sim;
                    build_ok(&s, kinds[k], pps[p], ms[i], 1);
                    simulate_ok(&s, costs[c][0], costs[c][1], 0, &sim);
                    char what[96];
                    snprintf(what, sizeof what, "%s pp=%d m=%d f=%g b=%g bubble", pt_schedule_kind_name(kinds[k]),
                             pps[p], ms[i], costs[c][0], costs[c][1]);
                    double want = (double)(pps[p] - 1) / ms[i];
                    expect_near(what, sim.bubble, want);
                    expect_near(what, pt_schedule_bubble_formula(&s), want);
                    expect_near("makespan", sim.makespan, (ms[i] + pps[p] - 1) * (costs[c][0] + costs[c][1]));
                    pt_sched_sim_free(&sim);
                    pt_schedule_free(&s);
                }
            }
        }
    }
}

/* (pp − 1)/(v·m) for interleaved with per-chunk costs f/v, b/v. */
static void test_bubble_of_interleaved(void **state) {
    (void)state;
    const int shapes[][3] = {{2, 4, 2}, {2, 8, 2}, {4, 4, 2}, {4, 8, 2}, {4, 8, 4}, {2, 6, 3}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int pp = shapes[i][0], m = shapes[i][1], v = shapes[i][2];
        pt_schedule s;
        pt_sched_sim sim;
        build_ok(&s, PT_SCHED_INTERLEAVED, pp, m, v);
        simulate_ok(&s, 1.0 / v, 1.0 / v, 0, &sim);
        char what[96];
        snprintf(what, sizeof what, "interleaved pp=%d m=%d v=%d bubble", pp, m, v);
        expect_near(what, sim.bubble, (double)(pp - 1) / (v * m));
        expect_near(what, pt_schedule_bubble_formula(&s), (double)(pp - 1) / (v * m));
        pt_sched_sim_free(&sim);
        pt_schedule_free(&s);
    }
}

/* The flexible interleaved order (any m, not only multiples of pp): every shape passes the checker
 * (each forward before its backward, every message matched, no deadlock) and its bubble at per-chunk
 * costs f/v, b/v is (pp − 1 + (v − 1)·max(0, pp − m))/(v·m): the literature's (pp − 1)/(v·m) for
 * every m ≥ pp, and for m < pp that of all forwards then all backwards over v·pp stages. */
static void test_flexible_interleaved(void **state) {
    (void)state;
    const int pipes[] = {1, 2, 3, 4, 5, 8, 16};
    for (size_t p = 0; p < sizeof pipes / sizeof *pipes; p++)
        for (int v = 2; v <= 4; v++)
            for (int m = 1; m <= 4 * pipes[p] + 3; m++) {
                int pp = pipes[p];
                if (pp == 16 && m % 5 != 0 && m != 17 && m != 67) continue; /* (time) */
                pt_schedule s;
                pt_sched_sim sim;
                build_ok(&s, PT_SCHED_INTERLEAVED, pp, m, v);
                check_counts(&s);
                simulate_ok(&s, 1.0 / v, 2.0 / v, 0, &sim);
                char what[96];
                snprintf(what, sizeof what, "interleaved pp=%d m=%d v=%d bubble", pp, m, v);
                double want = (pp - 1 + (v - 1) * (m < pp ? pp - m : 0)) / (double)(v * m);
                expect_near(what, sim.bubble, want);
                expect_near(what, pt_schedule_bubble_formula(&s), want);
                if (m >= pp) expect_near(what, sim.bubble, (double)(pp - 1) / (v * m));
                pt_sched_sim_free(&sim);
                pt_schedule_free(&s);
            }
}

/* The busiest rank's work per micro-batch, in stage-times: max_r Σ_c w(r, c). */
static double busiest_rank(const pt_schedule *s, const double *w) {
    double most = 0;
    for (int r = 0; r < s->pp; r++) {
        double mine = 0;
        for (int c = 0; c < s->v; c++) mine += w[pt_schedule_stage(s->kind, s->pp, s->v, r, c)];
        most = fmax(most, mine);
    }
    return most;
}

/* Uneven stages (parallel.pp_layers; the simulator's weights): the lists do not change, the
 * actions of stage st cost w[st] times as much. afab is a flow shop: makespan (f + b)(Σw + (m − 1)
 * max w), the bubble pt_schedule_bubble_formula gives; every schedule's bubble is at least the
 * busiest rank's bound pp·max_r Σ_c w / Σw − 1; interleaved's steady state runs at the busiest
 * rank's pace: m → m + pp adds exactly pp·(f + b)·max_r Σ_c w(r, c) to the makespan (m ≥ 2pp);
 * and Llama 3 405B's pipeline (126 layers, pp 16, v 2 here: 3 layers on the first and the last of
 * the 32 stages, 4 on the others) checks and simulates at any m. */
static void test_uneven_stages(void **state) {
    (void)state;
    const double w4[][4] = {{3, 4, 4, 3}, {1, 2, 3, 4}, {1, 1, 4, 1}, {4, 1, 1, 1}, {1, 2, 1, 1}, {2, 2, 2, 1}};
    for (size_t i = 0; i < sizeof w4 / sizeof *w4; i++)
        for (int m = 1; m <= 9; m++) {
            const double *w = w4[i];
            double sum = w[0] + w[1] + w[2] + w[3], most = fmax(fmax(w[0], w[1]), fmax(w[2], w[3]));
            pt_schedule s;
            pt_sched_sim sim;
            char what[128];
            build_ok(&s, PT_SCHED_AFAB, 4, m, 1);
            assert_int_equal(pt_schedule_set_weights(&s, w), PT_OK);
            simulate_ok(&s, 1, 2, 0, &sim);
            snprintf(what, sizeof what, "afab pp=4 m=%d w=%g,%g,%g,%g", m, w[0], w[1], w[2], w[3]);
            expect_near(what, sim.makespan, 3 * (sum + (m - 1) * most));
            expect_near(what, sim.busy, 3 * m * sum);
            expect_near(what, sim.bubble, pt_schedule_bubble_formula(&s));
            pt_sched_sim_free(&sim);
            pt_schedule_free(&s);
            const pt_sched_kind kinds[] = {PT_SCHED_1F1B, PT_SCHED_ZB, PT_SCHED_INTERLEAVED, PT_SCHED_DUALPIPEV};
            for (int k = 0; k < 4; k++) {
                int pp = kinds[k] >= PT_SCHED_INTERLEAVED && kinds[k] != PT_SCHED_ZB ? 2 : 4;
                int v = pp == 2 ? 2 : 1, mm = kinds[k] == PT_SCHED_DUALPIPEV ? m + 3 : m;
                build_ok(&s, kinds[k], pp, mm, v);
                assert_int_equal(pt_schedule_set_weights(&s, w), PT_OK);
                simulate_ok(&s, 1, 1, 1, &sim);
                snprintf(what, sizeof what, "%s pp=%d m=%d w=%g,%g,%g,%g", pt_schedule_kind_name(kinds[k]), pp, mm, w[0],
                         w[1], w[2], w[3]);
                expect_near(what, sim.busy, 3 * mm * sum);
                expect_near(what, pt_schedule_bubble_bound(&s), pp * busiest_rank(&s, w) / sum - 1);
                if (sim.bubble < pt_schedule_bubble_bound(&s) - 1e-12)
                    fail_msg("%s: bubble %g below the busiest rank's bound %g", what, sim.bubble,
                             pt_schedule_bubble_bound(&s));
                if (kinds[k] != PT_SCHED_AFAB) expect_near(what, pt_schedule_bubble_formula(&s), -1);
                pt_sched_sim_free(&sim);
                pt_schedule_free(&s);
            }
        }
    /* interleaved: the steady state's pace is the busiest rank's */
    const double w8[] = {3, 4, 4, 4, 4, 4, 4, 3}, w4b[] = {4, 1, 1, 1};
    const struct {
        int pp;
        const double *w;
    } cases[] = {{4, w8}, {2, w4[4]}, {2, w4[5]}, {2, w4b}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int pp = cases[i].pp;
        double span[2];
        for (int j = 0; j < 2; j++) {
            pt_schedule s;
            pt_sched_sim sim;
            build_ok(&s, PT_SCHED_INTERLEAVED, pp, (2 + j) * pp, 2);
            assert_int_equal(pt_schedule_set_weights(&s, cases[i].w), PT_OK);
            simulate_ok(&s, 1, 2, 0, &sim);
            span[j] = sim.makespan;
            if (j == 0) {
                char what[64];
                snprintf(what, sizeof what, "interleaved pp=%d uneven: steady pace", pp);
                pt_sched_sim_free(&sim);
                pt_schedule_free(&s);
                continue;
            }
            char what[64];
            snprintf(what, sizeof what, "interleaved pp=%d uneven: m 2pp -> 3pp", pp);
            expect_near(what, span[1] - span[0], pp * 3 * busiest_rank(&s, cases[i].w));
            pt_sched_sim_free(&sim);
            pt_schedule_free(&s);
        }
    }
    /* Llama 3 405B: 126 layers over 16 ranks × 2 chunks, the default split */
    pt_chunk st[32];
    double w[32];
    pt_pipe_even_split(126, 32, st);
    for (int i = 0; i < 32; i++) w[i] = st[i].l1 - st[i].l0;
    const int mm[] = {16, 17, 24, 31};
    for (int i = 0; i < 4; i++) {
        pt_schedule s;
        pt_sched_sim sim;
        build_ok(&s, PT_SCHED_INTERLEAVED, 16, mm[i], 2);
        assert_int_equal(pt_schedule_set_weights(&s, w), PT_OK);
        simulate_ok(&s, 1, 2, 0, &sim);
        expect_near("llama3 busy", sim.busy, 3.0 * mm[i] * 126);
        if (!(sim.bubble >= pt_schedule_bubble_bound(&s) - 1e-12 && sim.bubble <= 15.0 / (2 * mm[i]) + 0.05))
            fail_msg("llama3 m=%d: bubble %g, expected between the bound %g and about the even one %g", mm[i], sim.bubble,
                     pt_schedule_bubble_bound(&s), 15.0 / (2 * mm[i]));
        pt_sched_sim_free(&sim);
        pt_schedule_free(&s);
    }
    pt_schedule s;
    build_ok(&s, PT_SCHED_1F1B, 2, 4, 1);
    EXPECT_MESSAGE(pt_schedule_set_weights(&s, (const double[]){1, 0}), "stage 1", "needs > 0");
    assert_int_equal(pt_schedule_set_weights(&s, NULL), PT_OK);
    pt_schedule_free(&s);
}

/* The default split where pp × v does not divide the layers (interleaved): as even as possible, the
 * layers left over going to the middle stages first (pt_pipe_even_split), and pt_pipe_stages: the
 * given counts when parallel.pp_layers has them, in stage order. */
static void test_even_split(void **state) {
    (void)state;
    const struct {
        int L, S;
        const char *want;
    } cases[] = {{126, 32, "3,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,4,3"},
                 {5, 4, "1,2,1,1"}, {7, 4, "2,2,2,1"}, {8, 4, "2,2,2,2"}, {4, 4, "1,1,1,1"}, {3, 2, "2,1"},
                 {13, 6, "2,3,2,2,2,2"}, {11, 3, "4,4,3"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pt_chunk st[64];
        char got[256] = "";
        size_t len = 0;
        pt_pipe_even_split(cases[i].L, cases[i].S, st);
        for (int k = 0; k < cases[i].S; k++) {
            if (k > 0 && st[k].l0 != st[k - 1].l1) fail_msg("even split %d/%d: stage %d not contiguous", cases[i].L, cases[i].S, k);
            len += (size_t)snprintf(got + len, sizeof got - len, "%s%d", k ? "," : "", st[k].l1 - st[k].l0);
        }
        if (strcmp(got, cases[i].want) || st[0].l0 != 0 || st[cases[i].S - 1].l1 != cases[i].L)
            fail_msg("even split of %d layers over %d stages: %s, expected %s", cases[i].L, cases[i].S, got, cases[i].want);
    }
    pt_model_config c = {.vocab_size = 97, .dim = 32, .n_layers = 7, .n_heads = 4, .n_kv_heads = 2, .ffn_dim = 48};
    pt_chunk st[8];
    assert_int_equal(pt_pipe_stages(&c, PT_SCHED_INTERLEAVED, 2, 2, "", 0, st), PT_OK);
    assert_int_equal(st[3].l1 - st[3].l0, 1);
    assert_int_equal(st[1].l1 - st[1].l0, 2);
    assert_int_equal(pt_pipe_stages(&c, PT_SCHED_INTERLEAVED, 2, 2, "1,3,2,1", 0, st), PT_OK);
    assert_int_equal(st[1].l0, 1);
    assert_int_equal(st[1].l1, 4);
    assert_int_equal(pt_pipe_stages(&c, PT_SCHED_DUALPIPEV, 2, 2, "3,1,1,2", 0, st), PT_OK);
    assert_int_equal(st[3].l1 - st[3].l0, 2);
    EXPECT_MESSAGE(pt_pipe_stages(&c, PT_SCHED_INTERLEAVED, 2, 2, "3,4", 0, st), "parallel.pp_layers", "needs 4");
    EXPECT_MESSAGE(pt_pipe_stages(&c, PT_SCHED_INTERLEAVED, 4, 2, "", 0, st), "8 stages exceed model.n_layers = 7");
}

/* DualPipeV against its published figures (the DualPipe README, whose PP counts the 2pp stages of
 * the V): idle time per rank (PP/2 − 1)(F&B + B − 3W), in the time units of the per-chunk costs,
 * with F&B = f + b + w (our F&B unit runs its forward and its whole backward one after the other),
 * B = b + w the whole backward and W = w; every rank computes 2m chunks' worth, so our bubble
 * (pp·makespan − busy)/busy is that idle over 2m(f + b + w). And PP + 1 = 2pp + 1 (micro-batch,
 * chunk) pairs in flight at the peak on every rank. The formula assumes a backward no cheaper than
 * the forward or the weight gradient (b ≥ f, b ≥ w), as these costs are; with f > b the schedule
 * idles more than it says. */
static void test_bubble_of_dualpipev(void **state) {
    (void)state;
    const double costs[][3] = {{1, 1, 1}, {1, 2, 1}, {0.5, 1, 0.25}, {1, 1, 0}, {2, 3, 1}};
    const int pipes[] = {1, 2, 3, 4, 6, 8};
    for (size_t p = 0; p < sizeof pipes / sizeof *pipes; p++) {
        int pp = pipes[p];
        const int mm[] = {2 * pp, 2 * pp + 1, 4 * pp};
        for (int i = 0; i < 3; i++) {
            for (size_t c = 0; c < sizeof costs / sizeof *costs; c++) {
                double f = costs[c][0], b = costs[c][1], w = costs[c][2];
                pt_schedule s;
                pt_sched_sim sim;
                build_ok(&s, PT_SCHED_DUALPIPEV, pp, mm[i], 2);
                simulate_ok(&s, f, b, w, &sim);
                char what[128];
                snprintf(what, sizeof what, "dualpipev pp=%d m=%d f=%g b=%g w=%g", pp, mm[i], f, b, w);
                double stages = 2 * pp, fb = f + (b + w), whole_b = b + w;
                double want_idle = (stages / 2 - 1) * (fb + whole_b - 3 * w), per_rank = 2 * mm[i] * (f + b + w);
                expect_near(what, sim.busy, pp * per_rank);
                expect_near(what, sim.makespan - per_rank, want_idle);
                expect_near(what, pt_schedule_idle_formula(&s, f, b, w), want_idle);
                expect_near(what, sim.bubble, want_idle / per_rank);
                expect_near(what, pt_schedule_bubble_formula(&s), -1);
                assert_int_equal(pt_schedule_peak_formula(&s), 2 * pp + 1);
                for (int r = 0; r < pp; r++)
                    if (sim.peak_inflight[r] != 2 * pp + 1)
                        fail_msg("%s rank %d: peak in-flight %d, published 2pp + 1 = %d", what, r,
                                 sim.peak_inflight[r], 2 * pp + 1);
                pt_sched_sim_free(&sim);
                if (pp > 1) { /* the forward dearer than the backward: more idle than published */
                    simulate_ok(&s, 2, 1, 1, &sim);
                    if (!(sim.makespan - 2 * mm[i] * 4.0 > (pp - 1) * (4 + 2 - 3) + 1e-9))
                        fail_msg("%s: with f = 2 > b = 1 the idle %g is not above the formula's %d", what,
                                 sim.makespan - 2 * mm[i] * 4.0, (pp - 1) * 3);
                    pt_sched_sim_free(&sim);
                }
                pt_schedule_free(&s);
            }
        }
    }
}

/* Megatron's order: forwards in groups of pp micro-batches through chunk 0, then the same group
 * through chunk 1, ...; rank r warms up with 2(pp − r − 1) + (v − 1)·g forwards, g the largest
 * group (pp when pp divides m; ⌊m/pp⌋ groups as even as possible otherwise; all of them when
 * m ≤ pp), so it holds one more than that before its first backward. */
static void test_interleaved_order_and_peak(void **state) {
    (void)state;
    const int shapes[][3] = {{4, 8, 2}, {4, 4, 2}, {2, 8, 2}, {4, 12, 3}, {4, 6, 2}, {4, 11, 2}, {2, 3, 2}, {4, 3, 2}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int pp = shapes[i][0], m = shapes[i][1], v = shapes[i][2], total = m * v;
        int G = m / pp > 1 ? m / pp : 1, g = (m + G - 1) / G;
        pt_schedule s;
        pt_sched_sim sim;
        build_ok(&s, PT_SCHED_INTERLEAVED, pp, m, v);
        simulate_ok(&s, 1, 2, 0, &sim);
        for (int r = 0; r < pp; r++) {
            int warm = m <= pp ? total : 2 * (pp - r - 1) + (v - 1) * g;
            int want = warm + 1 < total ? warm + 1 : total;
            if (sim.peak_inflight[r] != want)
                fail_msg("interleaved pp=%d m=%d v=%d rank %d: peak in-flight %d, expected %d", pp, m, v, r,
                         sim.peak_inflight[r], want);
        }
        for (int k = 0, j = 0; k < s.n[0] && j < g * v; k++) { /* the first group, of g */
            const pt_action *x = &s.a[0][k];
            if (x->kind != PT_ACT_FWD) continue;
            if (x->micro != j % g || x->chunk != j / g)
                fail_msg("interleaved pp=%d m=%d: rank 0's forward %d is micro %d chunk %d, expected micro %d chunk %d",
                         pp, m, j, x->micro, x->chunk, j % g, j / g);
            j++;
        }
        pt_sched_sim_free(&sim);
        pt_schedule_free(&s);
    }
}

/* ZB-H1 with F = B = W = 1 against 1F1B whose full backward costs B + W = 2: strictly smaller
 * everywhere, and for m ≥ pp exactly ZB-H1's (pp − 1)(F + B − W) idle per rank. */
static void test_zb_bubble_below_1f1b(void **state) {
    (void)state;
    for (int p = 0; p < N_PP; p++) {
        for (int i = 0; i < N_M; i++) {
            int pp = pps[p], m = ms[i];
            pt_schedule zb, fb;
            pt_sched_sim zs, fs;
            build_ok(&zb, PT_SCHED_ZB, pp, m, 1);
            build_ok(&fb, PT_SCHED_1F1B, pp, m, 1);
            simulate_ok(&zb, 1, 1, 1, &zs);
            simulate_ok(&fb, 1, 2, 0, &fs);
            if (!(zs.bubble < fs.bubble))
                fail_msg("pp=%d m=%d: zb bubble %g is not below 1f1b's %g", pp, m, zs.bubble, fs.bubble);
            if (m >= pp) expect_near("zb bubble, m >= pp", zs.bubble, (double)(pp - 1) / (3.0 * m));
            pt_sched_sim_free(&zs);
            pt_sched_sim_free(&fs);
            pt_schedule_free(&zb);
            pt_schedule_free(&fb);
        }
    }
}

/* afab keeps all m micro-batches alive on every rank; 1f1b rank r at most min(pp − r, m), so
 * never more than pp; zb the same as 1f1b. */
static void test_peak_inflight(void **state) {
    (void)state;
    const pt_sched_kind kinds[] = {PT_SCHED_AFAB, PT_SCHED_1F1B, PT_SCHED_ZB};
    for (int p = 0; p < N_PP; p++) {
        for (int i = 0; i < N_M; i++) {
            for (int k = 0; k < 3; k++) {
                int pp = pps[p], m = ms[i];
                pt_schedule s;
                pt_sched_sim sim;
                build_ok(&s, kinds[k], pp, m, 1);
                simulate_ok(&s, 1, 1, kinds[k] == PT_SCHED_ZB ? 1 : 0, &sim);
                for (int r = 0; r < pp; r++) {
                    int want = kinds[k] == PT_SCHED_AFAB ? m : (pp - r < m ? pp - r : m);
                    if (sim.peak_inflight[r] != want)
                        fail_msg("%s pp=%d m=%d rank %d: peak in-flight %d, expected %d",
                                 pt_schedule_kind_name(kinds[k]), pp, m, r, sim.peak_inflight[r], want);
                }
                pt_sched_sim_free(&sim);
                pt_schedule_free(&s);
            }
        }
    }
}

/* Index of the first action of rank r with this kind and micro-batch. */
static int find(const pt_schedule *s, int r, pt_act_kind k, int micro) {
    for (int i = 0; i < s->n[r]; i++)
        if (s->a[r][i].kind == k && s->a[r][i].micro == micro) return i;
    fail_msg("rank %d has no %s of micro-batch %d", r, pt_schedule_action_name(k), micro);
    return -1;
}

static void drop(pt_schedule *s, int r, int i) {
    memmove(&s->a[r][i], &s->a[r][i + 1], (size_t)(s->n[r] - i - 1) * sizeof(pt_action));
    s->n[r]--;
}

static void swap(pt_schedule *s, int r, int i, int j) {
    pt_action t = s->a[r][i];
    s->a[r][i] = s->a[r][j];
    s->a[r][j] = t;
}

static void test_dropped_recv_is_rejected(void **state) {
    (void)state;
    pt_schedule s;
    build_ok(&s, PT_SCHED_1F1B, 4, 8, 1);
    drop(&s, 2, find(&s, 2, PT_ACT_RECV_FWD, 3));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 2", "FWD micro 3", "no RECV_FWD from rank 1");
    pt_schedule_free(&s);
}

static void test_dropped_send_is_rejected(void **state) {
    (void)state;
    pt_schedule s;
    build_ok(&s, PT_SCHED_1F1B, 4, 8, 1);
    drop(&s, 3, find(&s, 3, PT_ACT_SEND_BWD, 5));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 2", "RECV_BWD micro 5", "rank 3 has no matching SEND_BWD");
    pt_schedule_free(&s);
}

/* Rank 0 waits for micro 0's gradient before sending micro 0's activations: a cycle. */
static void test_swap_that_deadlocks_is_rejected(void **state) {
    (void)state;
    pt_schedule s;
    build_ok(&s, PT_SCHED_1F1B, 2, 4, 1);
    swap(&s, 0, find(&s, 0, PT_ACT_SEND_FWD, 0), find(&s, 0, PT_ACT_RECV_BWD, 0));
    EXPECT_MESSAGE(pt_schedule_check(&s), "deadlock", "rank 0 action 1", "RECV_BWD micro 0", "rank 1 at action");
    pt_sched_sim sim;
    EXPECT_MESSAGE(pt_schedule_simulate(&s, 1, 1, 0, &sim), "deadlock");
    pt_schedule_free(&s);
}

static void test_order_and_field_errors_are_named(void **state) {
    (void)state;
    pt_schedule s;
    build_ok(&s, PT_SCHED_AFAB, 2, 2, 1); /* the last rank: F0 F1 B0 S0 B1 S1 after its RECVs */
    swap(&s, 1, find(&s, 1, PT_ACT_FWD, 1), find(&s, 1, PT_ACT_BWD, 1));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 1", "BWD micro 1", "before its forward");
    pt_schedule_free(&s);

    build_ok(&s, PT_SCHED_AFAB, 4, 2, 1);
    s.a[1][find(&s, 1, PT_ACT_SEND_FWD, 0)].peer = 3;
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 1", "SEND_FWD micro 0", "stage 2 is on rank 2, not rank 3");
    pt_schedule_free(&s);

    build_ok(&s, PT_SCHED_ZB, 2, 4, 1);
    drop(&s, 0, find(&s, 0, PT_ACT_BWD_WEIGHT, 2));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 0 never runs BWD_WEIGHT of micro 2");
    pt_schedule_free(&s);

    build_ok(&s, PT_SCHED_1F1B, 2, 2, 1);
    s.a[0][find(&s, 0, PT_ACT_FWD, 1)].micro = 0;
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 0", "FWD micro 0", "second time");
    pt_schedule_free(&s);
}

static void test_bad_shapes_are_named(void **state) {
    (void)state;
    pt_schedule s;
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_DUALPIPEV, 4, 7, 2), "dualpipev", "7 micro-batches",
                   "at least 2·pp = 8");
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_DUALPIPEV, 2, 8, 1), "dualpipev", "v = 2");
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_INTERLEAVED, 2, 4, 1), "v >= 2");
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_1F1B, 2, 4, 2), "v = 1");
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_1F1B, 0, 4, 1), "pp = 0");
    EXPECT_MESSAGE(pt_schedule_build(&s, PT_SCHED_ZB, 2, 0, 1), "0 micro-batches");
}

/* The text timeline of a built schedule simulated with costs f, b, w holds the 4 rows given
 * (two ranks: kinds, micro-batches). */
static void expect_timeline(pt_sched_kind kind, int pp, int m, int v, double f, double b, double w,
                            const char *const rows[4]) {
    pt_schedule s;
    pt_sched_sim sim;
    build_ok(&s, kind, pp, m, v);
    simulate_ok(&s, f, b, w, &sim);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    pt_schedule_print(&s, &sim, out);
    fclose(out);
    for (int i = 0; i < 4; i++)
        if (!strstr(text, rows[i])) fail_msg("timeline lacks %s:\n%s", rows[i], text);
    free(text);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
}

/* 1f1b, pp = 2, m = 2, f = b = 1: rank 1 answers each forward at once; rank 0 waits. */
static void test_text_timeline(void **state) {
    (void)state;
    const char *const rows[] = {"|FF.B.B|", "|01 0 1|", "|.FBFB.|", "| 0011 |"};
    expect_timeline(PT_SCHED_1F1B, 2, 2, 1, 1, 1, 0, rows);
}

/* dualpipev, pp = 2, m = 4, unit costs: the eight phases of each rank (rank 0: F0 F0 | F0 F1 |
 * B1 W1 F1 | F0&B1 F1&B0 | B1 F1&B0 | B1 B0 | W B0 | W; rank 1: F0 F1 F0 F1 | four F&B | B1 B0,
 * then split: B1 B0 | W W), chunk 1 lowercase, a whole backward two columns. */
static void test_dualpipev_timeline(void **state) {
    (void)state;
    const char *const rows[] = {"|FFFfbwfFbb.fBBbb.fBBbbBWBW|", "|0120001311 20022 311332233|",
                                "|.FfFfFbbfBBFbbfBBbbBB.bBwW|", "| 00112002003113112222 3333|"};
    expect_timeline(PT_SCHED_DUALPIPEV, 2, 4, 2, 1, 1, 1, rows);
}

/* The SVG of a simulated schedule, written to the test's directory under name and read back. */
static char *draw_svg(const pt_schedule *s, const pt_sched_sim *sim, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", tu_tmpdir(), name);
    assert_int_equal(pt_schedule_svg(s, sim, path), PT_OK);
    char *svg = NULL;
    size_t len = 0;
    assert_int_equal(pt_read_file(path, &svg, &len), PT_OK);
    assert_non_null(strstr(svg, "</svg>"));
    return svg;
}

static int occurrences(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

static void test_svg_has_a_rect_per_computation(void **state) {
    (void)state;
    pt_schedule s;
    pt_sched_sim sim;
    build_ok(&s, PT_SCHED_ZB, 4, 8, 1);
    simulate_ok(&s, 1, 1, 1, &sim);
    char *svg = draw_svg(&s, &sim, "zb.svg");
    /* F, B, W per micro-batch and rank, and the legend */
    assert_int_equal(occurrences(svg, "<rect"), 4 * 8 * 3 + 4);
    free(svg);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
}

/* The balanced stage split against every split of the layers: its largest stage cost (a layer:
 * the matrix parameters a token passes through; the last stage adds the head's V·C) is the least
 * there is, for dense models and MoE models whose MoE layers weigh more or less than dense ones. */
static double layer_cost(const pt_model_config *c, int l) {
    int hd = pt_model_head_dim(c);
    double attn = (double)c->dim * (c->n_heads * hd + 2.0 * c->n_kv_heads * hd) +
                  (double)c->n_heads * hd * c->dim;
    if (pt_layer_is_moe(c, l))
        return attn + (double)c->dim * c->n_experts +
               3.0 * c->dim * c->moe_ffn_dim * (c->top_k + c->n_shared_experts);
    return attn + 3.0 * c->dim * c->ffn_dim;
}

static double split_max(const pt_model_config *c, const int *bounds, int S) {
    double worst = 0;
    for (int s = 0; s < S; s++) {
        double x = s == S - 1 ? (double)c->vocab_size * c->dim : 0.0;
        for (int l = bounds[s]; l < bounds[s + 1]; l++) x += layer_cost(c, l);
        worst = x > worst ? x : worst;
    }
    return worst;
}

/* The least largest stage cost over all splits of [lo, L) into S − s more stages. */
static double brute(const pt_model_config *c, int *bounds, int s, int S) {
    int L = c->n_layers;
    if (s == S - 1) {
        bounds[S] = L;
        return split_max(c, bounds, S);
    }
    double best = HUGE_VAL;
    for (int next = bounds[s] + 1; next <= L - (S - 1 - s); next++) {
        bounds[s + 1] = next;
        double x = brute(c, bounds, s + 1, S);
        best = x < best ? x : best;
    }
    return best;
}

static void test_balanced_split_is_optimal(void **state) {
    (void)state;
    struct { int L, V, F, E, k, Fe, first, every, shared; } cases[] = {
        {8, 8192, 1376, 0, 0, 0, 0, 1, 0},     /* dense, a heavy head */
        {9, 97, 48, 0, 0, 0, 0, 1, 0},         /* dense, a light head */
        {8, 8192, 688, 8, 2, 688, 1, 1, 0},    /* Mixtral-like: MoE layers twice a dense one */
        {7, 4096, 688, 4, 1, 172, 2, 2, 1},    /* alternating, light experts, a shared one */
        {6, 50257, 688, 4, 2, 344, 1, 1, 1},   /* a head worth several layers */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        for (int S = 1; S <= 4 && S <= cases[i].L; S++) {
            pt_model_config c = {.dim = 256, .n_heads = 8, .n_kv_heads = 2, .n_layers = cases[i].L,
                                 .vocab_size = cases[i].V, .ffn_dim = cases[i].F,
                                 .n_experts = cases[i].E, .top_k = cases[i].k,
                                 .moe_ffn_dim = cases[i].Fe, .moe_first_dense = cases[i].first,
                                 .moe_every = cases[i].every, .n_shared_experts = cases[i].shared};
            pt_chunk st[4];
            assert_int_equal(pt_pipe_split(&c, S, "", 0, st), PT_OK);
            int got[5], all[5] = {0};
            for (int s = 0; s < S; s++) {
                assert_true(st[s].l1 > st[s].l0);
                assert_int_equal(st[s].l0, s ? st[s - 1].l1 : 0);
                got[s] = st[s].l0;
            }
            assert_int_equal(st[S - 1].l1, c.n_layers);
            got[S] = c.n_layers;
            double want = brute(&c, all, 0, S), have = split_max(&c, got, S);
            if (have > want * (1 + 1e-12))
                fail_msg("case %zu, %d stages: largest stage cost %.0f, the best split has %.0f", i, S,
                         have, want);
        }
}

/* ---- the head split over the pipeline ranks: HEAD actions ------------------------------- */

static void build_head_ok(pt_schedule *s, pt_sched_kind kind, int pp, int m) {
    if (pt_schedule_build_head(s, kind, pp, m, 1, 1) != PT_OK)
        fail_msg("build %s pp=%d m=%d with the head split: %s", pt_schedule_kind_name(kind), pp, m, pt_last_error());
}

/* Moves rank r's action at index `from` so that it ends at index `to` (indices of the list as it
 * is after the action's removal). */
static void move(pt_schedule *s, int r, int from, int to) {
    pt_action x = s->a[r][from];
    drop(s, r, from);
    memmove(&s->a[r][to + 1], &s->a[r][to], (size_t)(s->n[r] - to) * sizeof x);
    s->a[r][to] = x;
    s->n[r]++;
}

/* head = 0 through pt_schedule_build_head is pt_schedule_build, action for action, for every kind,
 * with no HEAD anywhere (the other tests hold those lists to the formulas as before). */
static void test_head_zero_builds_the_same_lists(void **state) {
    (void)state;
    const int shapes[][4] = {{PT_SCHED_AFAB, 4, 3, 1},        {PT_SCHED_1F1B, 4, 8, 1},
                             {PT_SCHED_ZB, 2, 5, 1},          {PT_SCHED_INTERLEAVED, 4, 8, 2},
                             {PT_SCHED_DUALPIPEV, 3, 7, 2},   {PT_SCHED_1F1B, 1, 2, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        pt_schedule a, b;
        build_ok(&a, (pt_sched_kind)shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3]);
        assert_int_equal(pt_schedule_build_head(&b, (pt_sched_kind)shapes[i][0], shapes[i][1], shapes[i][2],
                                                shapes[i][3], 0),
                         PT_OK);
        assert_int_equal(a.head, 0);
        assert_int_equal(b.head, 0);
        for (int r = 0; r < a.pp; r++) {
            assert_int_equal(a.n[r], b.n[r]);
            assert_memory_equal(a.a[r], b.a[r], (size_t)a.n[r] * sizeof(pt_action));
            assert_int_equal(count_kind(&a, r, PT_ACT_HEAD), 0);
        }
        pt_schedule_free(&a);
        pt_schedule_free(&b);
    }
    assert_string_equal(pt_schedule_action_name(PT_ACT_HEAD), "HEAD");
    assert_int_equal(PT_ACT_HEAD, 8);
}

/* Every rank has exactly m HEADs, in micro-batch order, each within the places it may take: on
 * the last rank right before its backward of that micro-batch; on another, after its forward of
 * it (and that forward's send) and before its backward of it (and that backward's receive), never
 * between a computation and its send; with the HEADs taken out the lists are the unsplit ones. */
static void check_head_placement(const pt_schedule *s) {
    pt_schedule plain;
    build_ok(&plain, s->kind, s->pp, s->m, 1);
    pt_act_kind bwd = s->kind == PT_SCHED_ZB ? PT_ACT_BWD_INPUT : PT_ACT_BWD;
    for (int r = 0; r < s->pp; r++) {
        int heads = 0, j = 0;
        for (int k = 0; k < s->n[r]; k++) {
            const pt_action *x = &s->a[r][k];
            if (x->kind != PT_ACT_HEAD) {
                if (j >= plain.n[r] || memcmp(x, &plain.a[r][j], sizeof *x))
                    fail_msg("%s pp=%d m=%d rank %d action %d: not the unsplit list's action %d",
                             pt_schedule_kind_name(s->kind), s->pp, s->m, r, k, j);
                j++;
                continue;
            }
            const char *kind = pt_schedule_kind_name(s->kind);
            if (x->micro != heads || x->chunk != 0 || x->peer != -1)
                fail_msg("%s pp=%d m=%d rank %d action %d: HEAD micro %d chunk %d peer %d, expected micro %d "
                         "chunk 0 peer -1", kind, s->pp, s->m, r, k, x->micro, x->chunk, x->peer, heads);
            int f = find(s, r, PT_ACT_FWD, heads), b = find(s, r, bwd, heads);
            if (r == s->pp - 1 && b != k + 1)
                fail_msg("%s pp=%d m=%d: the last rank's HEAD micro %d is not right before its %s", kind, s->pp,
                         s->m, heads, pt_schedule_action_name(bwd));
            if (k < f || k > b || (k > 0 && k == f + 1 && s->a[r][k + 1].kind == PT_ACT_SEND_FWD))
                fail_msg("%s pp=%d m=%d rank %d: HEAD micro %d at %d, outside its forward (%d) .. backward (%d)",
                         kind, s->pp, s->m, r, heads, k, f, b);
            if (s->a[r][k + 1].kind == PT_ACT_SEND_FWD || s->a[r][k + 1].kind == PT_ACT_SEND_BWD)
                fail_msg("%s pp=%d m=%d rank %d: HEAD micro %d between a computation and its send", kind, s->pp,
                         s->m, r, heads);
            heads++;
        }
        assert_int_equal(heads, s->m);
        assert_int_equal(j, plain.n[r]);
    }
    pt_schedule_free(&plain);
}

/* The lists with every HEAD moved to its latest place: right before the rank's backward of its
 * micro-batch (and that backward's receive). */
static void latest_heads(pt_schedule *s) {
    pt_act_kind bwd = s->kind == PT_SCHED_ZB ? PT_ACT_BWD_INPUT : PT_ACT_BWD;
    for (int r = 0; r < s->pp; r++) {
        for (int i = 0; i < s->m; i++) drop(s, r, find(s, r, PT_ACT_HEAD, i));
        for (int i = 0; i < s->m; i++) {
            int b = find(s, r, bwd, i);
            if (b > 0 && s->a[r][b - 1].kind == PT_ACT_RECV_BWD) b--;
            memmove(&s->a[r][b + 1], &s->a[r][b], (size_t)(s->n[r] - b) * sizeof **s->a);
            s->a[r][b] = (pt_action){PT_ACT_HEAD, i, 0, -1};
            s->n[r]++;
        }
    }
}

static double makespan_of(const pt_schedule *s, double h) {
    int zb = s->kind == PT_SCHED_ZB;
    pt_sched_sim sim;
    if (pt_schedule_simulate_head(s, 1, zb ? 1 : 2, zb ? 1 : 0, h, &sim) != PT_OK)
        fail_msg("simulate: %s", pt_last_error());
    double t = sim.makespan;
    pt_sched_sim_free(&sim);
    return t;
}

/* Where the HEADs go matters: at their latest places an upstream rank joins HEAD(i + 1) only after
 * the gradient of i has come back up the pipeline, one micro-batch at a time. The builder's
 * placement (unit costs f = 1, b = 2, or B = W = 1 for zb; h = 0.5; m = 8) is never longer and at
 * these shapes as short as worked out: zb pp 2: 36 -> 29 (the step without a head 25, plus m·h =
 * 4); zb pp 4: 52 -> 31 (27 + 4); zb pp 8 m 64: 199 + 32 = 231, every HEAD hidden in no idle;
 * 1f1b pp 2: 44 -> 37; pp 4: 76 -> 48. */
static void test_head_placement_shortens_the_step(void **state) {
    (void)state;
    const struct { pt_sched_kind kind; int pp, m; double latest, placed; } cases[] = {
        {PT_SCHED_ZB, 2, 8, 36, 29}, {PT_SCHED_ZB, 4, 8, 52, 31},  {PT_SCHED_ZB, 8, 64, -1, 231},
        {PT_SCHED_1F1B, 2, 8, 44, 37}, {PT_SCHED_1F1B, 4, 8, 76, 48},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        pt_schedule s, plain;
        if (pt_schedule_build_head(&s, cases[i].kind, cases[i].pp, cases[i].m, 1, 0.5) != PT_OK)
            fail_msg("build: %s", pt_last_error());
        check_head_placement(&s);
        double placed = makespan_of(&s, 0.5);
        latest_heads(&s);
        check_ok(&s);
        double latest = makespan_of(&s, 0.5);
        build_ok(&plain, cases[i].kind, cases[i].pp, cases[i].m, 1);
        double none = makespan_of(&plain, 0);
        print_message("%s pp %d m %d: HEADs at their latest places %g, placed %g; no head %g (+ m·h = %g)\n",
                      pt_schedule_kind_name(cases[i].kind), cases[i].pp, cases[i].m, latest, placed, none,
                      none + cases[i].m * 0.5);
        expect_near("placed", placed, cases[i].placed);
        if (cases[i].latest > 0) expect_near("latest", latest, cases[i].latest);
        if (placed > latest + 1e-9) fail_msg("the placement is longer than the latest places");
        if (placed < none + cases[i].m * 0.5 - 1e-9) fail_msg("shorter than its compute");
        pt_schedule_free(&s);
        pt_schedule_free(&plain);
    }
}

/* afab, 1f1b and zb with the head split at pp 1..8 and m below, at and above pp: built, placed as
 * above, checked, and simulated to a finite end in which every rank spent m·h in HEADs. */
static void test_head_split_schedules(void **state) {
    (void)state;
    const pt_sched_kind kinds[] = {PT_SCHED_AFAB, PT_SCHED_1F1B, PT_SCHED_ZB};
    for (int pp = 1; pp <= 8; pp++) {
        const int mm[] = {1, 2, pp > 1 ? pp - 1 : 3, pp, pp + 1, 2 * pp, 3 * pp + 1};
        for (int k = 0; k < 3; k++) {
            for (size_t i = 0; i < sizeof mm / sizeof *mm; i++) {
                pt_schedule s;
                pt_sched_sim sim;
                build_head_ok(&s, kinds[k], pp, mm[i]);
                assert_int_equal(s.head, 1);
                check_head_placement(&s);
                check_ok(&s);
                check_counts(&s);
                double w = kinds[k] == PT_SCHED_ZB ? 1 : 0, h = 0.5;
                if (pt_schedule_simulate_head(&s, 1, 1, w, h, &sim) != PT_OK)
                    fail_msg("simulate %s pp=%d m=%d: %s", pt_schedule_kind_name(kinds[k]), pp, mm[i],
                             pt_last_error());
                if (!isfinite(sim.makespan) || sim.makespan < mm[i] * (2 + w + h))
                    fail_msg("%s pp=%d m=%d: makespan %g", pt_schedule_kind_name(kinds[k]), pp, mm[i], sim.makespan);
                expect_near("busy", sim.busy, pp * mm[i] * (2 + w + h));
                expect_near("h", sim.h, h);
                pt_sched_sim_free(&sim);
                pt_schedule_free(&s);
            }
        }
    }
}

static void test_head_split_refused_kinds(void **state) {
    (void)state;
    pt_schedule s;
    EXPECT_MESSAGE(pt_schedule_build_head(&s, PT_SCHED_INTERLEAVED, 4, 8, 2, 1), "interleaved",
                   "head split over the pipeline ranks", "afab, 1f1b or zb");
    EXPECT_MESSAGE(pt_schedule_build_head(&s, PT_SCHED_DUALPIPEV, 2, 4, 2, 1), "dualpipev",
                   "head split over the pipeline ranks", "afab, 1f1b or zb");
}

/* The simulated time of the split head, by hand: 1f1b, pp = 2, m = 2, f = b = 1, h = 1, the HEADs
 * as placed (rank 0 joins HEAD1 right after HEAD0, before its backward of micro 0):
 *   rank 0: F0 [0,1], F1 [1,2]; rank 1: F0 [1,2] (its input sent at 1).
 *   HEAD0: both ranks there at 2, [2,3]. rank 0 waits at HEAD1; rank 1: B0 [3,4] (its gradient
 *   from HEAD0), sends it; F1 [4,5] (its input sent at 2); at HEAD1 at 5: [5,6].
 *   rank 0: B0 [6,7], B1 [7,8] (rank 1's B1 [6,7]). Makespan 8, where the unsplit 1f1b takes
 *   (m + pp − 1)(f + b) = 6: the HEADs stop both ranks for h = 1 each.
 * With h = 0 the HEADs take no time and the makespan is the unsplit 6. */
static void test_head_split_simulated_by_hand(void **state) {
    (void)state;
    pt_schedule s;
    pt_sched_sim sim;
    build_head_ok(&s, PT_SCHED_1F1B, 2, 2);
    assert_int_equal(pt_schedule_simulate_head(&s, 1, 1, 0, 1, &sim), PT_OK);
    expect_near("makespan, h = 1", sim.makespan, 8);
    expect_near("busy", sim.busy, 2 * 2 * 3);
    expect_near("HEAD0 on rank 0", sim.start[0][find(&s, 0, PT_ACT_HEAD, 0)], 2);
    expect_near("HEAD1 on rank 0", sim.start[0][find(&s, 0, PT_ACT_HEAD, 1)], 5);
    expect_near("HEAD1 on rank 1", sim.start[1][find(&s, 1, PT_ACT_HEAD, 1)], 5);
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    pt_schedule_print(&s, &sim, out);
    fclose(out);
    const char *const rows[] = {"|FFH..HBB|", "|010  101|", "|.FHBFHB.|", "| 000111 |", "H=1"};
    for (int i = 0; i < 5; i++)
        if (!strstr(text, rows[i])) fail_msg("timeline lacks %s:\n%s", rows[i], text);
    free(text);
    pt_sched_sim_free(&sim);
    assert_int_equal(pt_schedule_simulate(&s, 1, 1, 0, &sim), PT_OK);
    expect_near("makespan, h = 0", sim.makespan, 6);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
}

/* Transfers as messages (pt_schedule_simulate_transfers), by hand. 1f1b, pp 2, m 1, f 1, b 2,
 * each message 0.5: F on rank 0 (1), its activations (0.5), F and B on rank 1 (3), the gradient
 * (0.5), B on rank 0 (2): 7. afab, pp 2, m 2, f = b = 0.1, messages of 1: rank 0 sends F0's at
 * 0.1 and F1's at 0.2, but one at a time on the link: F1's arrives at 2.1 (1.2 if they could
 * share it), when rank 1's F1 starts. Delay 0 is pt_schedule_simulate_head. */
static void test_transfers_simulated_by_hand(void **state) {
    (void)state;
    pt_schedule s;
    pt_sched_sim sim;
    build_ok(&s, PT_SCHED_1F1B, 2, 1, 1);
    assert_int_equal(pt_schedule_simulate_transfers(&s, 1, 2, 0, 0, 0.5, &sim), PT_OK);
    expect_near("1f1b m 1 makespan with transfers", sim.makespan, 7);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
    build_ok(&s, PT_SCHED_AFAB, 2, 2, 1);
    assert_int_equal(pt_schedule_simulate_transfers(&s, 0.1, 0.1, 0, 0, 1, &sim), PT_OK);
    expect_near("afab F1 on rank 1 after the link's first message", sim.start[1][find(&s, 1, PT_ACT_FWD, 1)], 2.1);
    pt_sched_sim_free(&sim);
    pt_sched_sim a, b;
    assert_int_equal(pt_schedule_simulate_transfers(&s, 1, 2, 0.5, 0, 0, &a), PT_OK);
    assert_int_equal(pt_schedule_simulate_head(&s, 1, 2, 0.5, 0, &b), PT_OK);
    expect_near("delay 0 = simulate_head", a.makespan, b.makespan);
    pt_sched_sim_free(&a), pt_sched_sim_free(&b);
    EXPECT_MESSAGE(pt_schedule_simulate_transfers(&s, 1, 1, 0, 0, -1, &sim), "must be >= 0");
    pt_schedule_free(&s);
}

/* The rendezvous (pt_sched_link), by hand: 1f1b, pp 2, m 2, f = b = 1, messages of 0.5, latency
 * 0. Rank 0 sends F0's activations at 1 and computes F1: rank 1 answers at once (it waits at its
 * RECV), but the data leaves only at rank 0's next poll, 2 (arrives 2.5); F1's, sent at 2 while
 * rank 0 waits, leaves when the link is free (2.5, arrives 3). Rank 1: F0 2.5-3.5, B0 3.5-4.5,
 * sends B0's gradient at 4.5 and computes F1 4.5-5.5: the gradient leaves at 5.5, arrives 6;
 * rank 0 B0 6-7. Rank 1: B1 5.5-6.5, its gradient's request answered at rank 0's poll at 7
 * (rank 1, done, polls): arrives 7.5, B1 7.5-8.5. Without the rendezvous: 7. With latency 0.1
 * the flights hide behind the computation but the last: its answer leaves rank 0 at 7 and reaches
 * rank 1 at 7.1, B1 7.6-8.6. */
static void test_rendezvous_simulated_by_hand(void **state) {
    (void)state;
    pt_schedule s;
    pt_sched_sim sim;
    build_ok(&s, PT_SCHED_1F1B, 2, 2, 1);
    pt_sched_link eager = {.delay = 0.5}, rv = {.delay = 0.5, .rendezvous = 1};
    assert_int_equal(pt_schedule_simulate_link(&s, 1, 1, 0, 0, &eager, &sim), PT_OK);
    expect_near("1f1b m 2 makespan, messages leave when sent", sim.makespan, 7);
    pt_sched_sim_free(&sim);
    assert_int_equal(pt_schedule_simulate_link(&s, 1, 1, 0, 0, &rv, &sim), PT_OK);
    expect_near("rendezvous: rank 1's F0 after rank 0's poll at 2", sim.start[1][find(&s, 1, PT_ACT_FWD, 0)], 2.5);
    expect_near("rendezvous: rank 0's B0 after rank 1's poll at 5.5", sim.start[0][find(&s, 0, PT_ACT_BWD, 0)], 6);
    expect_near("1f1b m 2 makespan with the rendezvous", sim.makespan, 8.5);
    pt_sched_sim_free(&sim);
    rv.latency = 0.1;
    assert_int_equal(pt_schedule_simulate_link(&s, 1, 1, 0, 0, &rv, &sim), PT_OK);
    expect_near("rendezvous, latency 0.1: makespan", sim.makespan, 8.6);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
}

/* Broken HEAD placements, each rejected by name (1f1b, pp = 4, m = 8 unless said). */
static void test_head_split_errors_are_named(void **state) {
    (void)state;
    pt_schedule s;
    /* two HEADs swapped on one rank: the ranks meet different collectives */
    build_head_ok(&s, PT_SCHED_1F1B, 4, 8);
    swap(&s, 1, find(&s, 1, PT_ACT_HEAD, 2), find(&s, 1, PT_ACT_HEAD, 3));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 1", "HEAD micro 3", "collective order", "HEAD micro 2");
    pt_schedule_free(&s);

    /* the last rank's HEAD before its forward of that micro-batch */
    build_head_ok(&s, PT_SCHED_1F1B, 4, 8);
    move(&s, 3, find(&s, 3, PT_ACT_HEAD, 4), find(&s, 3, PT_ACT_RECV_FWD, 4));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 3", "HEAD micro 4", "before this rank's FWD of micro 4");
    pt_schedule_free(&s);

    /* the last rank's backward before its HEAD */
    build_head_ok(&s, PT_SCHED_ZB, 4, 8);
    swap(&s, 3, find(&s, 3, PT_ACT_HEAD, 5), find(&s, 3, PT_ACT_BWD_INPUT, 5));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 3", "BWD_INPUT micro 5", "before HEAD micro 5");
    pt_schedule_free(&s);

    /* a HEAD deleted on a rank upstream: the others wait at it for a rank that has none left */
    build_head_ok(&s, PT_SCHED_1F1B, 4, 8);
    drop(&s, 0, find(&s, 0, PT_ACT_HEAD, 6));
    EXPECT_MESSAGE(pt_schedule_check(&s), "HEAD micro 6", "rank 0 has no HEAD of micro 6 left to run");
    pt_schedule_free(&s);

    /* the last HEAD deleted on the last rank: its backward has no gradient */
    build_head_ok(&s, PT_SCHED_AFAB, 2, 3);
    drop(&s, 1, find(&s, 1, PT_ACT_HEAD, 2));
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 1", "BWD micro 2", "before HEAD micro 2");
    pt_schedule_free(&s);

    /* HEAD 1 run twice on every rank (and HEAD 2 never) */
    build_head_ok(&s, PT_SCHED_1F1B, 2, 4);
    for (int r = 0; r < 2; r++) s.a[r][find(&s, r, PT_ACT_HEAD, 2)].micro = 1;
    EXPECT_MESSAGE(pt_schedule_check(&s), "HEAD micro 1", "runs a second time");
    pt_schedule_free(&s);

    /* a rank upstream joins HEAD 2 only after its backward of micro 2, whose gradient comes from
     * the last rank's backward, which waits for HEAD 2: a deadlock, named at the HEAD */
    build_head_ok(&s, PT_SCHED_1F1B, 4, 8);
    latest_heads(&s); /* (the builder's places would meet HEAD 3 first: a collective order error) */
    move(&s, 1, find(&s, 1, PT_ACT_HEAD, 2), find(&s, 1, PT_ACT_BWD, 2));
    EXPECT_MESSAGE(pt_schedule_check(&s), "deadlock", "the collective HEAD micro 2 waits for rank 1",
                   "RECV_BWD micro 2 chunk 0 from rank 2", "rank 3 at action");
    pt_sched_sim sim;
    EXPECT_MESSAGE(pt_schedule_simulate_head(&s, 1, 1, 0, 1, &sim), "deadlock");
    pt_schedule_free(&s);

    /* HEADs in a schedule that says it has no head split, or with a peer */
    build_head_ok(&s, PT_SCHED_1F1B, 2, 2);
    s.head = 0;
    EXPECT_MESSAGE(pt_schedule_check(&s), "HEAD micro 0", "without the head split");
    s.head = 1;
    s.a[0][find(&s, 0, PT_ACT_HEAD, 1)].peer = 1;
    EXPECT_MESSAGE(pt_schedule_check(&s), "rank 0", "a HEAD has chunk 0 and peer -1");
    pt_schedule_free(&s);
}

/* The SVG draws every HEAD as a rectangle of its own colour, with a legend entry. */
static void test_svg_draws_the_heads(void **state) {
    (void)state;
    pt_schedule s;
    pt_sched_sim sim;
    build_head_ok(&s, PT_SCHED_ZB, 4, 8);
    assert_int_equal(pt_schedule_simulate_head(&s, 1, 1, 1, 0.5, &sim), PT_OK);
    char *svg = draw_svg(&s, &sim, "zb_head.svg");
    /* F, B, W, H per micro-batch and rank; 5 legend entries */
    assert_int_equal(occurrences(svg, "<rect"), 4 * 8 * 4 + 5);
    assert_int_equal(occurrences(svg, "<title>HEAD micro"), 4 * 8);
    assert_non_null(strstr(svg, ">HEAD</text>"));
    free(svg);
    pt_sched_sim_free(&sim);
    pt_schedule_free(&s);
}

/* Runs `pentatron schedule` with argv, its stdout into *text; returns the exit code. */
static int run_schedule_cmd(int argc, char **argv, char **text) {
    char path[600];
    snprintf(path, sizeof path, "%s/schedule_cmd.txt", tu_tmpdir());
    fflush(stdout);
    int saved = dup(1), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    assert_true(saved >= 0 && fd >= 0);
    dup2(fd, 1);
    close(fd);
    int rc = pt_cmd_schedule(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    size_t len;
    assert_int_equal(pt_read_file(path, text, &len), PT_OK);
    return rc;
}

/* --head-split draws the HEADs and says the formulas do not apply; --head-cost sets their time;
 * --head-cost alone and a refused kind are errors. */
static void test_schedule_command_head_split(void **state) {
    (void)state;
    char *text;
    char *split[] = {"--pp", "2", "--microbatches", "2", "--head-split"};
    assert_int_equal(run_schedule_cmd(5, split, &text), 0);
    /* f = 1, b = 2 (the command's costs), h = 1: the run above with b = 2 (rank 0's backwards at
     * 7 and 9 after HEAD1 at [6, 7]) */
    const char *const want[] = {"H=1", "|FFH...HBBBB|", "|.FHBBFHBB..|", "makespan 11", "n/a (head split"};
    for (int i = 0; i < 5; i++)
        if (!strstr(text, want[i])) fail_msg("schedule --head-split lacks %s:\n%s", want[i], text);
    free(text);
    char *cost[] = {"--pp", "2", "--microbatches", "2", "--head-split", "--head-cost", "2"};
    assert_int_equal(run_schedule_cmd(7, cost, &text), 0);
    if (!strstr(text, "makespan 13")) fail_msg("--head-cost 2 should add 2 to the makespan:\n%s", text);
    free(text);
    char *alone[] = {"--head-cost", "2"};
    assert_int_equal(run_schedule_cmd(2, alone, &text), 2);
    assert_non_null(strstr(pt_last_error(), "--head-cost needs --head-split"));
    free(text);
    char *refused[] = {"--schedule", "dualpipev", "--head-split"};
    assert_int_equal(run_schedule_cmd(3, refused, &text), 2);
    assert_non_null(strstr(pt_last_error(), "afab, 1f1b or zb"));
    free(text);
}

/* `pentatron schedule` over the flexible shapes: a micro-batch count pp does not divide, and
 * uneven stages (--layers: afab's flow-shop formula, the others' busiest-rank bound); a --layers
 * that is not one positive count per stage is refused by name. */
static void test_schedule_command_flexible(void **state) {
    (void)state;
    char *text;
    char *odd[] = {"--pp", "2", "--schedule", "interleaved", "--microbatches", "3"};
    assert_int_equal(run_schedule_cmd(6, odd, &text), 0);
    const char *const want[] = {"m=3, v=2", "over all ranks): 0.1667", "= 1/6 = 0.1667", "no deadlock"};
    for (int i = 0; i < 4; i++)
        if (!strstr(text, want[i])) fail_msg("schedule interleaved m = 3 lacks %s:\n%s", want[i], text);
    free(text);
    char *afab[] = {"--pp", "4", "--schedule", "afab", "--microbatches", "4", "--layers", "3,4,4,3"};
    assert_int_equal(run_schedule_cmd(8, afab, &text), 0);
    if (!strstr(text, "over all ranks): 0.8571") || !strstr(text, "(flow shop)") || !strstr(text, "= 0.8571"))
        fail_msg("schedule afab --layers 3,4,4,3: bubble 6/7 and its formula expected:\n%s", text);
    free(text);
    char *il[] = {"--pp", "2", "--schedule", "interleaved", "--microbatches", "4", "--layers", "1,2,1,1"};
    assert_int_equal(run_schedule_cmd(8, il, &text), 0);
    if (!strstr(text, "over all ranks): 0.3000") || !strstr(text, "busiest rank's bound") || !strstr(text, "= 0.2000"))
        fail_msg("schedule interleaved --layers 1,2,1,1: bubble 0.3 above the bound 0.2 expected:\n%s", text);
    free(text);
    char *few[] = {"--pp", "2", "--schedule", "interleaved", "--layers", "1,2"};
    assert_int_equal(run_schedule_cmd(6, few, &text), 2);
    assert_non_null(strstr(pt_last_error(), "2 counts, expected 4"));
    free(text);
    char *junk[] = {"--pp", "2", "--layers", "1,x"};
    assert_int_equal(run_schedule_cmd(4, junk, &text), 2);
    assert_non_null(strstr(pt_last_error(), "expected 2 positive counts"));
    free(text);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kind_names_round_trip),
        cmocka_unit_test(test_built_schedules_pass_the_check),
        cmocka_unit_test(test_interleaved_wraps_to_rank_zero),
        cmocka_unit_test(test_stage_map),
        cmocka_unit_test(test_dualpipev_messages),
        cmocka_unit_test(test_bubble_of_afab_and_1f1b),
        cmocka_unit_test(test_bubble_of_interleaved),
        cmocka_unit_test(test_interleaved_order_and_peak),
        cmocka_unit_test(test_flexible_interleaved),
        cmocka_unit_test(test_uneven_stages),
        cmocka_unit_test(test_even_split),
        cmocka_unit_test(test_bubble_of_dualpipev),
        cmocka_unit_test(test_zb_bubble_below_1f1b),
        cmocka_unit_test(test_peak_inflight),
        cmocka_unit_test(test_dropped_recv_is_rejected),
        cmocka_unit_test(test_dropped_send_is_rejected),
        cmocka_unit_test(test_swap_that_deadlocks_is_rejected),
        cmocka_unit_test(test_order_and_field_errors_are_named),
        cmocka_unit_test(test_bad_shapes_are_named),
        cmocka_unit_test(test_text_timeline),
        cmocka_unit_test(test_dualpipev_timeline),
        cmocka_unit_test(test_svg_has_a_rect_per_computation),
        cmocka_unit_test(test_balanced_split_is_optimal),
        cmocka_unit_test(test_head_zero_builds_the_same_lists),
        cmocka_unit_test(test_head_split_schedules),
        cmocka_unit_test(test_head_split_refused_kinds),
        cmocka_unit_test(test_head_split_simulated_by_hand),
        cmocka_unit_test(test_transfers_simulated_by_hand),
        cmocka_unit_test(test_rendezvous_simulated_by_hand),
        cmocka_unit_test(test_head_placement_shortens_the_step),
        cmocka_unit_test(test_head_split_errors_are_named),
        cmocka_unit_test(test_svg_draws_the_heads),
        cmocka_unit_test(test_schedule_command_head_split),
        cmocka_unit_test(test_schedule_command_flexible),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
