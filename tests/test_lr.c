/* test_lr.c: the learning-rate schedules (pt_lr_at) against their formulas, written here
 * independently (docs/guide.md, "Learning-rate schedules"), at every step of several runs and at
 * the boundaries: the end of warmup, the start of the cooldown, the last step; and the schedule
 * keys' bad values. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pt/config.h"
#include "pt/optim.h"
#include "testutil.h"

/* The reference, in double, piece by piece. */
static double ref_lr(const char *kind, const char *cooldown, double lr, double min_frac, int64_t W,
                     int64_t N, double frac, int64_t s) {
    double floor_lr = min_frac * lr;
    if (s < W) return lr * (double)(s + 1) / (double)W;
    if (!strcmp(kind, "constant")) return lr;
    if (!strcmp(kind, "cosine") || !strcmp(kind, "linear")) {
        if (N <= W) return lr;
        double p = fmin(1.0, (double)(s - W) / (double)(N - W));
        double shape = !strcmp(kind, "cosine") ? (1.0 + cos(M_PI * p)) / 2.0 : 1.0 - p;
        return floor_lr + (lr - floor_lr) * shape;
    }
    /* wsd: the cooldown is the last D = round(frac·N) steps, never inside warmup */
    int64_t D = (int64_t)floor(frac * (double)N + 0.5);
    int64_t start = N - D;
    if (start < W) start = W;
    if (s < start || start >= N) return lr;
    double q = fmin(1.0, (double)(s - start) / (double)(N - start));
    double shape = !strcmp(cooldown, "sqrt") ? 1.0 - sqrt(q) : 1.0 - q;
    return floor_lr + (lr - floor_lr) * shape;
}

static int kind_id(const char *kind) {
    if (!strcmp(kind, "cosine")) return PT_LR_COSINE;
    if (!strcmp(kind, "linear")) return PT_LR_LINEAR;
    if (!strcmp(kind, "wsd")) return PT_LR_WSD;
    return PT_LR_CONSTANT;
}

static void check_at(const pt_optim_config *c, const char *kind, const char *cooldown, float frac,
                     int64_t s, double want) {
    double got = pt_lr_at(c, s);
    double tol = 2e-7 * fabs(want) + 1e-12; /* the float result of a double computation */
    if (fabs(got - want) > tol)
        fail_msg("%s (cooldown %s, fraction %g, W %lld, N %lld, min_lr %g) at step %lld: %.9g, "
                 "formula %.9g", kind, cooldown, (double)frac, (long long)c->warmup_steps,
                 (long long)c->total_steps, (double)c->min_lr, (long long)s, got, want);
}

static void test_every_step_against_the_formula(void **state) {
    (void)state;
    const char *kinds[] = {"constant", "cosine", "linear", "wsd"};
    const char *cooldowns[] = {"linear", "sqrt"};
    const int64_t runs[][2] = {{0, 10}, {4, 14}, {3, 100}, {10, 1000}, {0, 1}, {5, 5}, {7, 9}};
    const float fracs[] = {0.0f, 0.1f, 0.2f, 0.5f, 1.0f};
    const float mins[] = {0.0f, 0.1f};
    int checked = 0;
    for (size_t k = 0; k < 4; k++)
        for (size_t cd = 0; cd < 2; cd++)
            for (size_t r = 0; r < sizeof runs / sizeof *runs; r++)
                for (size_t f = 0; f < sizeof fracs / sizeof *fracs; f++)
                    for (size_t mn = 0; mn < 2; mn++) {
                        pt_optim_config c = {.lr = 3e-3f, .warmup_steps = runs[r][0],
                                             .total_steps = runs[r][1], .min_lr = mins[mn],
                                             .schedule = kind_id(kinds[k]),
                                             .decay_fraction = fracs[f],
                                             .cooldown = cd ? PT_COOLDOWN_SQRT : PT_COOLDOWN_LINEAR};
                        for (int64_t s = 0; s <= runs[r][1] + 3; s++) {
                            check_at(&c, kinds[k], cooldowns[cd], fracs[f], s,
                                     ref_lr(kinds[k], cooldowns[cd], (double)c.lr, (double)c.min_lr,
                                            c.warmup_steps, c.total_steps, (double)c.decay_fraction,
                                            s));
                            checked++;
                        }
                    }
    printf("%d steps equal to the formulas\n", checked);
}

/* The boundaries by hand (lr 1, floor 0.1): warmup 4, 100 steps, a cooldown of the last 20. */
static void test_wsd_boundaries(void **state) {
    (void)state;
    pt_optim_config c = {.lr = 1.0f, .warmup_steps = 4, .total_steps = 100, .min_lr = 0.1f,
                         .schedule = PT_LR_WSD, .decay_fraction = 0.2f,
                         .cooldown = PT_COOLDOWN_LINEAR};
    assert_float_equal(pt_lr_at(&c, 0), 0.25f, 0);
    assert_float_equal(pt_lr_at(&c, 3), 1.0f, 0);  /* the last warmup step reaches the peak */
    assert_float_equal(pt_lr_at(&c, 4), 1.0f, 0);  /* the stable phase */
    assert_float_equal(pt_lr_at(&c, 79), 1.0f, 0); /* its last step */
    assert_float_equal(pt_lr_at(&c, 80), 1.0f, 0); /* the cooldown's first step: q = 0 */
    assert_float_equal(pt_lr_at(&c, 81), 0.1f + 0.9f * (1.0f - 1.0f / 20), 1e-7);
    assert_float_equal(pt_lr_at(&c, 90), 0.1f + 0.9f * 0.5f, 1e-7);
    assert_float_equal(pt_lr_at(&c, 99), 0.1f + 0.9f / 20, 1e-7); /* the last step */
    assert_float_equal(pt_lr_at(&c, 100), 0.1f, 1e-7);               /* where it would end */
    assert_float_equal(pt_lr_at(&c, 500), 0.1f, 1e-7);               /* past it: the floor */
    c.cooldown = PT_COOLDOWN_SQRT;
    assert_float_equal(pt_lr_at(&c, 80), 1.0f, 0);
    assert_float_equal(pt_lr_at(&c, 85), 0.1f + 0.9f * 0.5f, 1e-7); /* √(5/20) = 1/2 */
    assert_float_equal(pt_lr_at(&c, 99), 0.1 + 0.9 * (1 - sqrt(19.0 / 20)), 1e-7);
    /* a cooldown longer than what follows warmup starts when warmup ends */
    c.decay_fraction = 1.0f;
    c.cooldown = PT_COOLDOWN_LINEAR;
    assert_float_equal(pt_lr_at(&c, 3), 1.0f, 0);
    assert_float_equal(pt_lr_at(&c, 4), 1.0f, 0);
    assert_float_equal(pt_lr_at(&c, 52), 0.1f + 0.9f * 0.5f, 1e-7);
    /* no cooldown: constant after warmup */
    c.decay_fraction = 0.0f;
    assert_float_equal(pt_lr_at(&c, 99), 1.0f, 0);
}

static void expect_invalid(const char *const *args, int n, const char *needle) {
    pt_config c;
    pt_config_defaults(&c);
    pt_status st = pt_config_from_args(&c, n, (char **)args);
    if (st == PT_OK) st = pt_config_validate(&c);
    if (st == PT_OK) fail_msg("%s ... accepted", args[0]);
    if (!strstr(pt_last_error(), needle))
        fail_msg("%s: the message \"%s\" does not name %s", args[0], pt_last_error(), needle);
}

static void test_bad_values_are_refused(void **state) {
    (void)state;
    const char *a1[] = {"--optimizer.schedule=wsd", "--optimizer.decay_fraction=1.5"};
    expect_invalid(a1, 2, "optimizer.decay_fraction = 1.5: must be in [0, 1]");
    const char *a2[] = {"--optimizer.schedule=wsd", "--optimizer.decay_fraction=-0.1"};
    expect_invalid(a2, 2, "optimizer.decay_fraction = -0.1: must be in [0, 1]");
    const char *a3[] = {"--optimizer.schedule=warmup_stable_decay"};
    expect_invalid(a3, 1, "optimizer.schedule: expected one of constant|cosine|linear|wsd");
    const char *a4[] = {"--optimizer.schedule=wsd", "--optimizer.cooldown=cosine"};
    expect_invalid(a4, 2, "optimizer.cooldown: expected one of linear|sqrt");
    const char *a5[] = {"--optimizer.schedule=cosine", "--optimizer.cooldown=sqrt"};
    expect_invalid(a5, 2, "apply to optimizer.schedule = wsd");
    pt_config c;
    pt_config_defaults(&c);
    const char *ok[] = {"--optimizer.schedule=wsd", "--optimizer.decay_fraction=1",
                        "--optimizer.cooldown=sqrt"};
    assert_int_equal(pt_config_from_args(&c, 3, (char **)ok), PT_OK);
    assert_int_equal(pt_config_validate(&c), PT_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_step_against_the_formula),
        cmocka_unit_test(test_wsd_boundaries),
        cmocka_unit_test(test_bad_values_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
