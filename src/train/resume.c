/* resume.c: a checkpoint's record of its run, and the check of a resumed run against it (see
 * resume.h). */
#include "train/resume.h"

#include <ctype.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "pt/data.h"

#define PT_FP_HEADER 1024 /* bytes of a shard hashed whole: its header */
#define PT_FP_BLOCKS 8    /* blocks sampled from the rest */
#define PT_FP_BLOCK 4096

static const char *const pt_change_names[] = {"data", "seed", "shuffle", "global_batch", "seq_len",
                                              "model"};
#define PT_N_CHANGES (int)(sizeof pt_change_names / sizeof *pt_change_names)

pt_status pt_resume_parse_allow(const char *list, unsigned *allow) {
    char buf[1024];
    *allow = 0;
    snprintf(buf, sizeof buf, "%s", list);
    char *save = NULL;
    for (char *it = strtok_r(buf, ",", &save); it; it = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*it)) it++;
        size_t n = strlen(it);
        while (n > 0 && isspace((unsigned char)it[n - 1])) it[--n] = 0;
        if (!*it) continue;
        int k = 0;
        while (k < PT_N_CHANGES && strcmp(pt_change_names[k], it)) k++;
        if (k == PT_N_CHANGES && (!strcmp(it, "lr") || !strncmp(it, "optimizer", 9)))
            return pt_errorf(PT_ERR_CONFIG, "checkpoint.allow_change: \"%s\": the learning rate "
                             "and the optimizer may change on resume without being listed (the "
                             "names: data, seed, shuffle, global_batch, seq_len, model)", it);
        if (k == PT_N_CHANGES)
            return pt_errorf(PT_ERR_CONFIG, "checkpoint.allow_change: unknown name \"%s\" (the "
                             "names: data, seed, shuffle, global_batch, seq_len, model)", it);
        *allow |= 1u << k;
    }
    return PT_OK;
}

static uint64_t pt_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* A shard's size and fingerprint (resume.h); the size -1 when it cannot be read. */
static void pt_shard_fingerprint(const char *path, int64_t *bytes, uint64_t *fp) {
    *bytes = -1;
    *fp = 0;
    int fd;
    if (pt_open_regular(path, "shard", &fd) != PT_OK) return;
    struct stat sb;
    unsigned char buf[PT_FP_BLOCK];
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return;
    }
    int64_t size = sb.st_size, rest = size > PT_FP_HEADER ? size - PT_FP_HEADER : 0;
    uint64_t h = pt_fnv(0xcbf29ce484222325ull, &size, sizeof size);
    int whole = rest <= (int64_t)PT_FP_BLOCKS * PT_FP_BLOCK;
    int n_reads = whole ? (int)((size + PT_FP_BLOCK - 1) / PT_FP_BLOCK) : 1 + PT_FP_BLOCKS;
    for (int i = 0; i < n_reads; i++) {
        int64_t at = whole ? (int64_t)i * PT_FP_BLOCK
                   : i == 0 ? 0
                            : PT_FP_HEADER + (rest - PT_FP_BLOCK) * (i - 1) / (PT_FP_BLOCKS - 1);
        size_t want = !whole && i == 0 ? PT_FP_HEADER : PT_FP_BLOCK;
        ssize_t got = pread(fd, buf, want, at);
        if (got < 0) {
            close(fd);
            return;
        }
        h = pt_fnv(h, buf, (size_t)got);
    }
    close(fd);
    *bytes = size;
    *fp = h;
}

static json_t *pt_record_source(const char *name, const char *pattern, double weight) {
    json_t *shards = json_array();
    glob_t g;
    if (glob(pattern, 0, NULL, &g) == 0) { /* sorted, as pt_data_open reads them */
        for (size_t i = 0; i < g.gl_pathc; i++) {
            int64_t bytes;
            uint64_t fp;
            char hex[24];
            pt_shard_fingerprint(g.gl_pathv[i], &bytes, &fp);
            snprintf(hex, sizeof hex, "%016" PRIx64, fp);
            json_array_append_new(shards, json_pack("{s:s, s:I, s:s}", "file", g.gl_pathv[i],
                                                    "bytes", (json_int_t)bytes,
                                                    "fingerprint", hex));
        }
        globfree(&g);
    }
    return json_pack("{s:s, s:s, s:f, s:o}", "name", name, "glob", pattern, "weight", weight,
                     "shards", shards);
}

void pt_resume_record(const pt_config *cfg, json_t *index) {
    json_t *data = json_array();
    if (cfg->data.sources[0]) {
        pt_mix_spec spec;
        if (pt_mix_parse(cfg->data.sources, cfg->data.weights, &spec) == PT_OK)
            for (int i = 0; i < spec.n; i++)
                json_array_append_new(data, pt_record_source(spec.name[i], spec.glob[i],
                                                             spec.weight[i]));
        pt_mix_spec_free(&spec);
    } else {
        json_array_append_new(data, pt_record_source("train", cfg->data.train, 1.0));
    }
    json_object_set_new(index, "data", data);
    json_t *model = json_object();
    char value[64];
    const char *key;
    for (int i = 0; (key = pt_config_arch_key(cfg, i, value, sizeof value)) != NULL; i++)
        json_object_set_new(model, key, json_string(value));
    json_object_set_new(index, "model", model);
}

pt_optim_config pt_run_optim_config(const pt_config *cfg) {
    const char *s = cfg->optimizer.schedule;
    return (pt_optim_config){
        .lr = cfg->optimizer.lr,
        .beta1 = cfg->optimizer.beta1,
        .beta2 = cfg->optimizer.beta2,
        .eps = cfg->optimizer.eps,
        .weight_decay = cfg->optimizer.weight_decay,
        .grad_clip = cfg->optimizer.grad_clip,
        .schedule = !strcmp(s, "cosine") ? PT_LR_COSINE
                    : !strcmp(s, "linear") ? PT_LR_LINEAR
                    : !strcmp(s, "wsd")    ? PT_LR_WSD
                                           : PT_LR_CONSTANT,
        .warmup_steps = cfg->optimizer.warmup_steps,
        .total_steps = cfg->training.steps,
        .min_lr = cfg->optimizer.min_lr,
        .decay_fraction = cfg->optimizer.decay_fraction,
        .cooldown = !strcmp(cfg->optimizer.cooldown, "sqrt") ? PT_COOLDOWN_SQRT : PT_COOLDOWN_LINEAR,
    };
}

/* ------------------------------------------------------------------------------------------ */
/* the check */

typedef struct {
    char refused[4096], allowed[4096], unrecorded[256];
    unsigned refused_names; /* PT_CHANGE_* of the refused differences */
    unsigned allow;
} pt_diffs;

static void pt_append(char *buf, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pt_append(char *buf, size_t cap, const char *fmt, ...) {
    size_t n = strlen(buf);
    if (n + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* One difference of the field named by `change` (PT_CHANGE_*), "WHAT OLD → NEW". */
static void pt_diff(pt_diffs *d, unsigned change, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pt_diff(pt_diffs *d, unsigned change, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    char *buf = change & d->allow ? d->allowed : d->refused;
    if (!(change & d->allow)) d->refused_names |= change;
    pt_append(buf, sizeof d->refused, "%s%s", buf[0] ? "; " : "", line);
}

static void pt_unrecorded(pt_diffs *d, const char *what) {
    pt_append(d->unrecorded, sizeof d->unrecorded, "%s%s", d->unrecorded[0] ? ", " : "", what);
}

static const char *pt_jstr(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* One source's shards, old against new: the first that differs, named, and how many others do. */
static void pt_check_shards(pt_diffs *d, const char *src, json_t *old, json_t *now, int *moved) {
    size_t n_old = json_array_size(old), n_now = json_array_size(now);
    if (n_old != n_now) {
        pt_diff(d, PT_CHANGE_DATA, "data (source %s): %zu shard%s → %zu", src, n_old,
                n_old == 1 ? "" : "s", n_now);
        return;
    }
    int first = -1, others = 0;
    for (size_t i = 0; i < n_now; i++) {
        json_t *a = json_array_get(old, i), *b = json_array_get(now, i);
        int same = json_integer_value(json_object_get(a, "bytes")) ==
                       json_integer_value(json_object_get(b, "bytes")) &&
                   !strcmp(pt_jstr(a, "fingerprint"), pt_jstr(b, "fingerprint"));
        if (same && strcmp(pt_jstr(a, "file"), pt_jstr(b, "file"))) *moved = 1;
        if (same) continue;
        if (first < 0) first = (int)i;
        else others++;
    }
    if (first < 0) return;
    json_t *a = json_array_get(old, (size_t)first), *b = json_array_get(now, (size_t)first);
    char file[2 * PT_PATH_MAX + 8];
    if (strcmp(pt_jstr(a, "file"), pt_jstr(b, "file")))
        snprintf(file, sizeof file, "%s (was %s)", pt_jstr(b, "file"), pt_jstr(a, "file"));
    else
        snprintf(file, sizeof file, "%s", pt_jstr(b, "file"));
    long long ba = json_integer_value(json_object_get(a, "bytes")),
              bb = json_integer_value(json_object_get(b, "bytes"));
    char more[64] = "";
    if (others) snprintf(more, sizeof more, " (and %d more shard%s)", others, others == 1 ? "" : "s");
    if (ba != bb)
        pt_diff(d, PT_CHANGE_DATA, "data (source %s): %s: %lld bytes → %lld%s", src, file, ba, bb,
                more);
    else
        pt_diff(d, PT_CHANGE_DATA, "data (source %s): %s: content fingerprint %s → %s (same "
                "size)%s", src, file, pt_jstr(a, "fingerprint"), pt_jstr(b, "fingerprint"), more);
}

static void pt_check_data(pt_diffs *d, json_t *old, json_t *now) {
    if (!json_is_array(old)) {
        pt_unrecorded(d, "data fingerprints");
        return;
    }
    char names_old[1024] = "", names_now[1024] = "";
    size_t i;
    json_t *e;
    json_array_foreach(old, i, e) pt_append(names_old, sizeof names_old, "%s%s", i ? ", " : "", pt_jstr(e, "name"));
    json_array_foreach(now, i, e) pt_append(names_now, sizeof names_now, "%s%s", i ? ", " : "", pt_jstr(e, "name"));
    if (strcmp(names_old, names_now)) {
        pt_diff(d, PT_CHANGE_DATA, "data sources %s → %s", names_old, names_now);
        return;
    }
    int moved = 0;
    json_array_foreach(now, i, e) {
        json_t *o = json_array_get(old, i);
        const char *name = pt_jstr(e, "name");
        double wa = json_number_value(json_object_get(o, "weight")),
               wb = json_number_value(json_object_get(e, "weight"));
        if (fabs(wa - wb) > 1e-9)
            pt_diff(d, PT_CHANGE_DATA, "data (source %s): weight %.6g → %.6g", name, wa, wb);
        pt_check_shards(d, name, json_object_get(o, "shards"), json_object_get(e, "shards"), &moved);
    }
    if (moved)
        pt_log_info("data: the shards are at other paths than when saved; their sizes and "
                    "fingerprints match");
}

static void pt_check_model(pt_diffs *d, json_t *old, json_t *now) {
    if (!json_is_object(old)) {
        pt_unrecorded(d, "model config");
        return;
    }
    const char *key;
    json_t *v;
    json_object_foreach(now, key, v) {
        const char *a = json_string_value(json_object_get(old, key));
        if (a && strcmp(a, json_string_value(v))) /* a key it lacks: added since; unchecked */
            pt_diff(d, PT_CHANGE_MODEL, "%s %s → %s", key, a, json_string_value(v));
    }
}

static void pt_check_int(pt_diffs *d, json_t *index, const char *field, unsigned change,
                         const char *key, long long now) {
    json_t *v = json_object_get(index, field);
    if (!json_is_integer(v)) {
        pt_unrecorded(d, key);
        return;
    }
    long long old = json_integer_value(v);
    if (change == PT_CHANGE_SEED) { /* a uint64 kept as json_int_t */
        if ((uint64_t)old != (uint64_t)now)
            pt_diff(d, change, "%s %llu → %llu", key, (unsigned long long)old, (unsigned long long)now);
    } else if (old != now) {
        pt_diff(d, change, "%s %lld → %lld", key, old, now);
    }
}

pt_status pt_resume_load_index(const char *dir, json_t **index) {
    char path[PT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/index.json", dir);
    int fd;
    PT_TRY(pt_open_regular(path, "checkpoint index", &fd));
    json_error_t err;
    *index = json_loadfd(fd, 0, &err);
    close(fd);
    if (!*index) return pt_errorf(PT_ERR_FORMAT, "%s: %s (line %d)", path, err.text, err.line);
    return PT_OK;
}

/* training.steps against the saved run's (index.json's "steps", else its train.ini's): the
 * schedule's length, so the learning rate from here on is not the one the saved run would have
 * had, except under a constant schedule past its warmup. Said, with the next step's rate both
 * ways (this run's optimizer settings, the saved length). */
static void pt_check_steps(const char *dir, json_t *index, const pt_config *cfg) {
    json_t *v = json_object_get(index, "steps");
    long long was = json_is_integer(v) ? json_integer_value(v) : 0;
    if (!json_is_integer(v)) { /* saved before index.json recorded it */
        char ini[PT_PATH_MAX + 32];
        pt_config *saved = pt_malloc(sizeof *saved);
        pt_config_defaults(saved);
        snprintf(ini, sizeof ini, "%s/train.ini", dir);
        if (access(ini, R_OK) == 0 && pt_config_load_file(saved, ini) == PT_OK)
            was = saved->training.steps;
        free(saved);
    }
    long long now = cfg->training.steps, step = json_integer_value(json_object_get(index, "step"));
    if (was <= 0 || was == now) return;
    pt_optim_config oc = pt_run_optim_config(cfg), old = oc;
    old.total_steps = was;
    float lr_now = pt_lr_at(&oc, step), lr_was = pt_lr_at(&old, step);
    int follows = 0; /* does any step from here on differ? */
    for (long long s = step; s < (now > was ? now : was) && !follows; s++)
        follows = pt_lr_at(&oc, s) != pt_lr_at(&old, s);
    if (!follows)
        pt_log_info("resuming from %s with training.steps %lld → %lld: the learning rate is the "
                    "same as the saved run's (optimizer.schedule = %s)", dir, was, now,
                    cfg->optimizer.schedule);
    else
        pt_log_warn("resuming from %s with training.steps %lld → %lld: the learning-rate schedule "
                    "(optimizer.schedule = %s) changes with it, spread over %lld steps instead of "
                    "%lld: step %lld's learning rate is %.4g, where it would have been %.4g with "
                    "the saved training.steps", dir, was, now, cfg->optimizer.schedule, now, was,
                    step + 1, (double)lr_now, (double)lr_was);
}

pt_status pt_resume_check(const char *dir, const pt_config *cfg, unsigned allow) {
    json_t *index;
    PT_TRY(pt_resume_load_index(dir, &index));
    pt_diffs *d = pt_calloc(1, sizeof *d);
    d->allow = allow;
    pt_check_int(d, index, "seed", PT_CHANGE_SEED, "training.seed", (long long)cfg->training.seed);
    json_t *sh = json_object_get(index, "shuffle");
    if (!json_is_boolean(sh)) pt_unrecorded(d, "data.shuffle");
    else if (json_is_true(sh) != (cfg->data.shuffle != 0))
        pt_diff(d, PT_CHANGE_SHUFFLE, "data.shuffle %s → %s", json_is_true(sh) ? "true" : "false",
                cfg->data.shuffle ? "true" : "false");
    pt_check_int(d, index, "global_batch", PT_CHANGE_GLOBAL_BATCH, "training.global_batch",
                 cfg->training.global_batch);
    pt_check_int(d, index, "seq_len", PT_CHANGE_SEQ_LEN, "training.seq_len", cfg->training.seq_len);
    json_t *now = json_object();
    pt_resume_record(cfg, now);
    pt_check_data(d, json_object_get(index, "data"), json_object_get(now, "data"));
    pt_check_model(d, json_object_get(index, "model"), json_object_get(now, "model"));
    json_decref(now);
    pt_check_steps(dir, index, cfg);
    json_decref(index);

    if (d->unrecorded[0])
        pt_log_warn("%s records no %s (saved by an earlier pentatron): not checked", dir,
                    d->unrecorded);
    if (d->allowed[0])
        pt_log_warn("resuming from %s with changes that checkpoint.allow_change allows (old → "
                    "new): %s", dir, d->allowed);
    pt_status st = PT_OK;
    if (d->refused[0]) {
        char names[128] = "";
        for (int k = 0; k < PT_N_CHANGES; k++)
            if (d->refused_names & (1u << k))
                pt_append(names, sizeof names, "%s%s", names[0] ? "," : "", pt_change_names[k]);
        st = pt_errorf(PT_ERR_CONFIG, "resuming from %s with what it was saved with changed (old "
                       "→ new): %s. A resumed run continues the run that saved it; to change "
                       "this anyway, set checkpoint.allow_change = %s", dir, d->refused, names);
    }
    free(d);
    return st;
}
