/* test_plan_gemm.c: the planner's GEMM time (pt_plan_gemm_time) against NVIDIA's "Matrix
 * Multiplication Background User's Guide" (tile and wave quantization) and the roofline. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "pt/plan.h"

static pt_hardware a100(void) {
    pt_hardware hw;
    memset(&hw, 0, sizeof hw);
    hw.peak_flops = 312e12, hw.gemm_efficiency = 0.87, hw.memory_bw = 2.039e12;
    hw.gemm_units = 108, hw.gemm_tile_m = 256, hw.gemm_tile_n = 128;
    return hw;
}

/* The guide's example: on A100's 108 SMs a 1792 × 1792 output in 256 × 128 tiles is 7 × 14 = 98
 * tiles, one partial wave: 98/108 of the processors busy. */
static void test_one_partial_wave(void **state) {
    (void)state;
    pt_hardware hw = a100();
    double k = 8192, t = pt_plan_gemm_time(&hw, 2, 1792, 1792, k);
    double want = 2 * 1792.0 * 1792 * k / (312e12 * 0.87 * 98.0 / 108);
    assert_true(fabs(t / want - 1) < 1e-12);
}

/* One tile row past a whole number of waves takes one more wave (108 × 10 tiles: 10 waves;
 * 109 × 10: 11 waves, the last with 10 of its 108 processors busy). */
static void test_wave_boundary(void **state) {
    (void)state;
    pt_hardware hw = a100();
    double k = 8192, m = 256.0 * 108, n = 1280, t108 = pt_plan_gemm_time(&hw, 2, m, n, k);
    double t109 = pt_plan_gemm_time(&hw, 2, m + 256, n, k);
    assert_true(fabs(t108 / (2 * m * n * k / (312e12 * 0.87)) - 1) < 1e-12); /* whole waves */
    assert_true(fabs(t109 / t108 - (m + 256) / m * (11.0 * 108 / 1090)) < 1e-12);
    /* a ragged edge: 1 row past a tile pays for the whole tile row */
    double t_edge = pt_plan_gemm_time(&hw, 2, 257, n, k);
    assert_true(fabs(t_edge / pt_plan_gemm_time(&hw, 2, 512, n, k) - 1) < 1e-12);
}

/* A skinny GEMM is memory-bound: its time is its bytes over the bandwidth. */
static void test_roofline(void **state) {
    (void)state;
    pt_hardware hw = a100();
    hw.gemm_units = 0;
    double m = 8192, n = 8192, k = 16, t = pt_plan_gemm_time(&hw, 2, m, n, k);
    assert_true(fabs(t / (2 * (m * k + k * n + m * n) / 2.039e12) - 1) < 1e-12);
}

/* Measured shapes, when given, decide: a GEMM at a measured shape runs at its rate. */
static void test_measured_shapes(void **state) {
    (void)state;
    pt_hardware hw = a100();
    hw.n_shapes = 2;
    hw.shapes[0] = (pt_gemm_shape){256, 256, 256, 1e11};
    hw.shapes[1] = (pt_gemm_shape){4096, 4096, 4096, 3e11};
    assert_true(fabs(pt_plan_gemm_time(&hw, 4, 4096, 4096, 4096) / (2 * 4096.0 * 4096 * 4096 / 3e11) - 1) < 1e-6);
    assert_true(fabs(pt_plan_gemm_time(&hw, 4, 256, 256, 256) / (2 * 256.0 * 256 * 256 / 1e11) - 1) < 1e-6);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_partial_wave),
        cmocka_unit_test(test_wave_boundary),
        cmocka_unit_test(test_roofline),
        cmocka_unit_test(test_measured_shapes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
