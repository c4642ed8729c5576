/* testutil.h: helpers shared by the cmocka tests (reference comparisons print both values). */
#ifndef PT_TESTUTIL_H
#define PT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "pt/backend.h"

/* ‖a − b‖ / ‖b‖ (‖b‖ = 0 gives ‖a‖). */
double tu_rel_err(const float *a, const float *b, size_t n);
double tu_rel_err_d(const float *a, const double *b, size_t n);
/* Fails the test with a message naming `what` when err > tol. */
void tu_check_rel(const char *what, double err, double tol);
/* A float's IEEE bits, and back. */
uint32_t tu_f32_bits(float x);
float tu_f32_from_bits(uint32_t u);
/* Uniform values in [-scale, scale) from a fixed seed. */
void tu_fill(float *x, size_t n, uint64_t seed, float scale);
/* Environment path set by tests/CMakeLists.txt (PT_SOURCE_DIR, PT_DEPS_DIR, ...), or NULL. */
const char *tu_env(const char *name);
/* A malloc'd host copy of n floats of backend memory: tests read device memory only so, which
 * the guarded backend (PT_BACKEND_GUARD=1) enforces. */
float *tu_download(pt_backend *be, const float *dev, size_t n);
/* A fresh temporary directory for this test (removed at exit). */
const char *tu_tmpdir(void);

#endif
