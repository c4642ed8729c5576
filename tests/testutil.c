#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

double tu_rel_err(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

double tu_rel_err_d(const float *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

float *tu_download(pt_backend *be, const float *dev, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) fail_msg("out of memory");
    be->download(be, h, dev, n * sizeof(float));
    return h;
}

void tu_check_rel(const char *what, double err, double tol) {
    if (!(err <= tol)) fail_msg("%s: relative error %.3e exceeds %.1e", what, err, tol);
}

uint32_t tu_f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

float tu_f32_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

void tu_fill(float *x, size_t n, uint64_t seed, float scale) {
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        x[i] = scale * (2.0f * (float)((s >> 40) * (1.0 / 16777216.0)) - 1.0f);
    }
}

const char *tu_env(const char *name) {
    const char *v = getenv(name);
    return (v && *v) ? v : NULL;
}

static char tu_dir[256];
static void tu_rm(void) {
    if (tu_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", tu_dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tu_dir);
    }
}

const char *tu_tmpdir(void) {
    if (!tu_dir[0]) {
        snprintf(tu_dir, sizeof tu_dir, "/tmp/pt_test_XXXXXX");
        if (!mkdtemp(tu_dir)) fail_msg("mkdtemp failed");
        atexit(tu_rm);
    }
    return tu_dir;
}
