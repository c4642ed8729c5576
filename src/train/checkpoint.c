/* checkpoint.c: checkpoints and Hugging Face export (see include/pt/checkpoint.h). */
#include "pt/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include <jansson.h>

#include "pt/data.h"

#include "pt/hf_config.h"
#include "pt/safetensors.h"
#include "train/resume.h"

#define PT_CKPT_FORMAT "pentatron-checkpoint-2"

static pt_status pt_file_crc32(const char *path, uint32_t *crc) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    unsigned char buf[1 << 16];
    uLong c = crc32(0L, Z_NULL, 0);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) c = crc32(c, buf, (uInt)n);
    int err = ferror(f);
    fclose(f);
    if (err) return pt_errorf(PT_ERR_IO, "%s: read error", path);
    *crc = (uint32_t)c;
    return PT_OK;
}

/* Host copy of a device buffer. */
static float *pt_host_copy(pt_backend *be, const float *dev, size_t n) {
    float *h = pt_malloc(n * sizeof(float));
    be->download(be, h, dev, n * sizeof(float));
    return h;
}

static pt_status pt_write_weights(const char *path, const pt_model *m, const float *host,
                                  pt_st_dtype dtype) {
    pt_st_writer *w = pt_st_writer_create();
    pt_status st = pt_st_writer_set_meta(w, "format", "pt");
    for (int i = 0; i < m->gtable.n && st == PT_OK; i++) {
        const pt_param *p = &m->gtable.p[i];
        st = pt_st_writer_add_f32(w, p->name, p->shape, p->ndim, host + p->offset, dtype);
    }
    if (st == PT_OK) st = pt_st_writer_write(w, path);
    pt_st_writer_free(w);
    return st;
}

pt_status pt_ckpt_export_hf_host(const char *dir, const pt_model *m, const float *host,
                                 pt_st_dtype dtype) {
    char path[PT_PATH_MAX + 64];
    PT_TRY(pt_mkdirs(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    PT_TRY(pt_hf_config_write(path, &m->cfg));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return pt_write_weights(path, m, host, dtype);
}

pt_status pt_ckpt_export_hf(const char *dir, const pt_model *m) {
    float *host = pt_host_copy(m->be, m->params, m->table.total);
    pt_status st = pt_ckpt_export_hf_host(dir, m, host, PT_ST_DTYPE_F32);
    free(host);
    return st;
}

static int pt_is_step_dir(const char *name, int64_t *step) {
    if (strncmp(name, "step_", 5) != 0) return 0;
    char *end;
    long long s = strtoll(name + 5, &end, 10);
    if (*end != 0 || end == name + 5) return 0;
    *step = s;
    return 1;
}

static int pt_rm_at(int dfd, const char *name, int depth);

/* Removes the entries of the directory open as dfd (closed here), depth first, never following a
 * symbolic link: a link is removed as itself, its target untouched. index.json goes last, so
 * that a checkpoint whose removal was cut short still names its run (and is pruned again). 0, or
 * -1 with errno. */
static int pt_rm_entries(int dfd, int depth) {
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return -1;
    }
    int err = 0, index = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (!strcmp(e->d_name, "index.json")) index = 1;
        else if (pt_rm_at(dirfd(d), e->d_name, depth) != 0 && !err) err = errno;
    }
    if (index && unlinkat(dirfd(d), "index.json", 0) != 0 && errno != ENOENT && !err) err = errno;
    closedir(d);
    errno = err;
    return err ? -1 : 0;
}

/* Removes dfd's entry name: a file or a link unlinked, a directory emptied (opened O_NOFOLLOW:
 * never a link's target) and removed. At most 64 levels deep. */
static int pt_rm_at(int dfd, const char *name, int depth) {
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return 0;
    if (errno != EISDIR && errno != EPERM) return -1; /* (EPERM: unlink of a directory, POSIX) */
    if (depth >= 64) {
        errno = ELOOP;
        return -1;
    }
    int sub = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub < 0 || pt_rm_entries(sub, depth + 1) != 0) return -1;
    return unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno == ENOENT ? 0 : -1;
}

/* Removes dir and everything under it without following a symbolic link: dir itself a link (or
 * a file) is unlinked as itself, never emptied through. Absent: PT_OK. */
static pt_status pt_rmtree(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return PT_OK;
        if ((errno == ELOOP || errno == ENOTDIR) && (unlink(dir) == 0 || errno == ENOENT))
            return PT_OK;
        return pt_errorf(PT_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    }
    if (pt_rm_entries(fd, 0) != 0 || (rmdir(dir) != 0 && errno != ENOENT))
        return pt_errorf(PT_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* run identity */

void pt_ckpt_new_run_id(char *id) {
    uint64_t x;
    if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x) { /* no entropy yet */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        x = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 40);
        x ^= x >> 31, x *= 0x9E3779B97F4A7C15ull, x ^= x >> 29; /* spread the bits */
    }
    snprintf(id, PT_RUN_ID_LEN + 1, "%016llx", (unsigned long long)x);
}

/* A run id as a checkpoint records it: 16 lower-case hex digits. */
static int pt_is_run_id(const char *s) {
    if (!s || strlen(s) != PT_RUN_ID_LEN) return 0;
    for (const char *c = s; *c; c++)
        if (!((*c >= '0' && *c <= '9') || (*c >= 'a' && *c <= 'f'))) return 0;
    return 1;
}

void pt_ckpt_identity(const char *dir, char *id, int64_t *step) {
    json_t *root = NULL;
    id[0] = 0;
    if (step) *step = -1;
    char saved[1024]; /* reading it leaves the last error as it was */
    snprintf(saved, sizeof saved, "%s", pt_last_error());
    if (pt_resume_load_index(dir, &root) == PT_OK) {
        const char *r = json_string_value(json_object_get(root, "run_id"));
        if (pt_is_run_id(r)) snprintf(id, PT_RUN_ID_LEN + 1, "%s", r);
        json_t *js = json_object_get(root, "step");
        if (step && json_is_integer(js)) *step = json_integer_value(js);
        json_decref(root);
    }
    pt_errorf(PT_OK, "%s", saved);
}

/* What checkpoint.dir holds: each step_N entry, a link or not, and its run. */
typedef struct {
    int64_t step;
    int link;                    /* a symbolic link: never pruned, never replaced */
    char run[PT_RUN_ID_LEN + 1]; /* "": its index names no run (saved before run ids, or none) */
} pt_ckpt_entry;

static int pt_cmp_entry(const void *a, const void *b) {
    int64_t x = ((const pt_ckpt_entry *)a)->step, y = ((const pt_ckpt_entry *)b)->step;
    return (x > y) - (x < y);
}

/* root's step_N entries, ascending (caller frees); with their run ids when identity is set (each
 * index.json read). */
static int pt_scan(const char *root, pt_ckpt_entry **out, int identity) {
    DIR *d = opendir(root);
    *out = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    char path[PT_PATH_MAX + 300];
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        if (!pt_is_step_dir(e->d_name, &s)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *out = pt_realloc(*out, (size_t)cap * sizeof **out);
        }
        pt_ckpt_entry *c = &(*out)[n++];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", root, e->d_name);
        c->step = s;
        c->link = lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode);
        c->run[0] = 0;
        if (identity) pt_ckpt_identity(path, c->run, NULL);
    }
    closedir(d);
    if (n) qsort(*out, (size_t)n, sizeof **out, pt_cmp_entry);
    return n;
}

/* Appends to out (cap bytes, used so far): cut at cap. */
static void pt_append(char *out, size_t cap, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= cap) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *used, cap - *used, fmt, ap);
    va_end(ap);
    if (n > 0) *used = *used + (size_t)n < cap ? *used + (size_t)n : cap - 1;
}

/* The entries not this run's, grouped by run, into out: "run X: step_A, step_B (a link); no run
 * id: step_C" (four a run at most); their count. */
static int pt_describe_others(const pt_ckpt_entry *e, int n, const char *run_id, char *out,
                              size_t cap) {
    int others = 0;
    size_t used = 0;
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(e[i].run, run_id)) continue;
        others++;
        int first = 1;
        for (int j = 0; j < i && first; j++) first = strcmp(e[j].run, e[i].run) != 0;
        if (!first) continue; /* listed with its run's first */
        pt_append(out, cap, &used, "%s%s%s: ", used ? "; " : "", e[i].run[0] ? "run " : "no run id",
                  e[i].run);
        int shown = 0, more = 0;
        for (int j = i; j < n; j++) {
            if (strcmp(e[j].run, e[i].run)) continue;
            if (shown == 4) {
                more++;
                continue;
            }
            pt_append(out, cap, &used, "%sstep_%08lld%s", shown++ ? ", " : "",
                      (long long)e[j].step, e[j].link ? " (a link)" : "");
        }
        if (more) pt_append(out, cap, &used, " and %d more", more);
    }
    return others;
}

pt_status pt_ckpt_check_dir(const char *root, const char *run_id, pt_run_start start, int share,
                            int64_t from, int64_t total, int64_t every) {
    pt_ckpt_entry *e;
    int n = pt_scan(root, &e, 1);
    char others[640];
    int n_others = pt_describe_others(e, n, run_id, others, sizeof others);
    pt_status st = PT_OK;
    if (n_others && !share && start == PT_RUN_NEW)
        st = pt_errorf(PT_ERR_CONFIG, "checkpoint.dir = %s holds checkpoints of another run (%s): a "
                       "new run would mix with them. Continue that run (checkpoint.resume = latest), "
                       "give this run another checkpoint.dir, or set checkpoint.share_dir = true to "
                       "start it beside them (they are kept: never pruned or replaced)", root, others);
    else if (n_others && !share && start == PT_RUN_RESUMED_ELSEWHERE)
        st = pt_errorf(PT_ERR_CONFIG, "checkpoint.dir = %s holds checkpoints of another run (%s): "
                       "this run, resumed from a checkpoint elsewhere, would mix with them. Give it "
                       "another checkpoint.dir, or set checkpoint.share_dir = true to save beside "
                       "them (they are kept: never pruned or replaced)", root, others);
    /* a save never replaces another run's checkpoint or a link: a run that would is refused now,
     * not when it reaches that step */
    for (int i = 0; i < n && st == PT_OK; i++) {
        int64_t s = e[i].step;
        int saves = s > from && s <= total && (s == total || (every > 0 && s % every == 0));
        if (!saves || (!e[i].link && !strcmp(e[i].run, run_id))) continue;
        char whose[64] = " (no run id)";
        if (e[i].run[0]) snprintf(whose, sizeof whose, " (run %s)", e[i].run);
        st = pt_errorf(PT_ERR_CONFIG, "this run would save step %lld, where checkpoint.dir = %s holds "
                       "%s step_%08lld%s, which is never replaced: give this run another "
                       "checkpoint.dir, or other checkpoint.every or training.steps", (long long)s,
                       root, e[i].link ? "the symbolic link" : "another run's checkpoint",
                       (long long)s, e[i].link ? "" : whose);
    }
    if (st == PT_OK && n_others)
        pt_log_warn("checkpoint.dir = %s also holds checkpoints of another run (%s): they are kept, "
                    "never pruned or replaced", root, others);
    free(e);
    return st;
}

/* Steps of the checkpoints under root, sorted ascending (caller frees). */
static int pt_list_steps(const char *root, int64_t **steps) {
    pt_ckpt_entry *e;
    int n = pt_scan(root, &e, 0);
    *steps = pt_malloc((size_t)(n ? n : 1) * sizeof **steps);
    for (int i = 0; i < n; i++) (*steps)[i] = e[i].step;
    free(e);
    return n;
}

pt_status pt_ckpt_find_latest(const char *root, char *out, size_t cap) {
    int64_t *steps;
    int n = pt_list_steps(root, &steps);
    if (n == 0) {
        free(steps);
        return pt_errorf(PT_ERR_IO, "%s: no checkpoint (step_NNNNNNNN directory) found", root);
    }
    snprintf(out, cap, "%s/step_%08lld", root, (long long)steps[n - 1]);
    free(steps);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* verifying (checkpoint.resume = latest) */

pt_status pt_ckpt_verify(const char *dir, int part, int nparts) {
    json_t *root;
    PT_TRY(pt_resume_load_index(dir, &root));
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *shards = json_object_get(root, "shards");
    pt_status st = PT_OK;
    if (!fmt || strcmp(fmt, PT_CKPT_FORMAT) != 0 || !json_is_array(shards) ||
        !json_is_integer(json_object_get(root, "step")))
        st = pt_errorf(PT_ERR_FORMAT, "%s/index.json: not a checkpoint index of format %s "
                       "(format, step or shards missing)", dir, PT_CKPT_FORMAT);
    for (size_t s = (size_t)part; st == PT_OK && s < json_array_size(shards); s += (size_t)nparts) {
        json_t *e = json_array_get(shards, s);
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *want = json_string_value(json_object_get(e, "crc32"));
        if (!file || strchr(file, '/') || !want) {
            st = pt_errorf(PT_ERR_FORMAT, "%s/index.json: shard %zu is malformed", dir, s);
            break;
        }
        char shard[PT_PATH_MAX + 96];
        uint32_t crc;
        snprintf(shard, sizeof shard, "%s/%s", dir, file);
        st = pt_file_crc32(shard, &crc);
        if (st == PT_OK && crc != (uint32_t)strtoul(want, NULL, 16))
            st = pt_errorf(PT_ERR_FORMAT, "%s: checksum %08x does not match %s recorded in "
                           "index.json", shard, crc, want);
    }
    json_decref(root);
    return st;
}

#define PT_VERIFY_MSG 512 /* bytes of each rank's verdict gathered by rank 0 */

pt_status pt_ckpt_find_verified(const char *root, pt_comm *world, char *out, size_t cap) {
    int rank = world ? world->rank : 0, size = world ? world->size : 1;
    int64_t *steps = NULL, n = 0;
    /* rank 0's listing for every rank (hosts may see a shared directory at different moments) */
    if (rank == 0) n = pt_list_steps(root, &steps);
    if (world) pt_allreduce_sum(world, &n, 1, PT_DTYPE_I64);
    if (rank != 0) steps = pt_calloc((size_t)(n ? n : 1), sizeof *steps);
    if (world && n) pt_allreduce_sum(world, steps, (size_t)n, PT_DTYPE_I64);
    char *mine = pt_calloc(PT_VERIFY_MSG, 1), *all = pt_calloc((size_t)size, PT_VERIFY_MSG);
    char skipped[2048] = "";
    out[0] = 0;
    for (int64_t i = n - 1; i >= 0 && !out[0]; i--) {
        char dir[PT_PATH_MAX + 32];
        snprintf(dir, sizeof dir, "%s/step_%08lld", root, (long long)steps[i]);
        /* each rank checks every size-th shard; rank 0 learns every rank's verdict */
        pt_status st = pt_ckpt_verify(dir, rank, size);
        snprintf(mine, PT_VERIFY_MSG, "%s", st == PT_OK ? "" : pt_last_error());
        if (world) pt_allgather(world, mine, all, PT_VERIFY_MSG / 4, PT_DTYPE_I32);
        else memcpy(all, mine, PT_VERIFY_MSG);
        int bad = -1;
        for (int r = 0; r < size && bad < 0; r++)
            if (all[(size_t)r * PT_VERIFY_MSG]) bad = r;
        if (bad < 0) {
            snprintf(out, cap, "%s", dir);
            break;
        }
        const char *why = all + (size_t)bad * PT_VERIFY_MSG;
        if (rank == 0) pt_log_warn("checkpoint.resume = latest: skipping %s: %s", dir, why);
        size_t used = strlen(skipped);
        snprintf(skipped + used, sizeof skipped - used, "%s%s", used ? "; " : "", why);
    }
    free(steps);
    free(mine);
    free(all);
    if (n > 0 && !out[0])
        return pt_errorf(PT_ERR_CONFIG, "checkpoint.resume = latest: none of the %lld "
                         "checkpoint%s in %s verifies (%s); nothing to resume from", (long long)n,
                         n == 1 ? "" : "s", root, skipped);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* saving */

static const char *const pt_kind_name[3] = {"params", "exp_avg", "exp_avg_sq"};

static void pt_block_key(char *out, size_t cap, int kind, int tensor, int64_t r0, int64_t c0) {
    snprintf(out, cap, "%s@%d@%lld@%lld", pt_kind_name[kind], tensor, (long long)r0, (long long)c0);
}

static int64_t pt_gcols(const pt_param *p) { return p->ndim == 2 ? p->shape[1] : 1; }

/* This rank's shard file: its pieces, three tensors each. */
static pt_status pt_write_shard(const char *path, const pt_ckpt_piece *pieces, int n) {
    pt_st_writer *w = pt_st_writer_create();
    pt_status st = pt_st_writer_set_meta(w, "format", PT_CKPT_FORMAT);
    char name[96];
    for (int i = 0; i < n && st == PT_OK; i++) {
        const pt_ckpt_piece *q = &pieces[i];
        const float *src[3] = {q->param, q->exp_avg, q->exp_avg_sq};
        int64_t shape[2] = {q->r1 - q->r0, q->c1 - q->c0};
        for (int k = 0; k < 3 && st == PT_OK; k++) {
            pt_block_key(name, sizeof name, k, q->tensor, q->r0, q->c0);
            st = pt_st_writer_add_f32(w, name, shape, 2, src[k], PT_ST_DTYPE_F32);
        }
    }
    if (st == PT_OK) st = pt_st_writer_write(w, path);
    pt_st_writer_free(w);
    return st;
}

/* Everyone learns whether every rank succeeded. */
static int pt_all_ok(pt_comm *world, int ok) {
    if (!world) return ok;
    int32_t v = ok ? 0 : 1;
    pt_allreduce_sum(world, &v, 1, PT_DTYPE_I32);
    return v == 0;
}

#define PT_BLOCK_INTS 5 /* tensor, r0, r1, c0, c1 */

static pt_status pt_write_index(const char *path, int64_t step, const pt_model *m,
                                int64_t optimizer_step, const pt_config *cfg, const char *run_id,
                                int world_size, const int64_t *info, const int64_t *blocks,
                                int max_pieces) {
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(PT_CKPT_FORMAT));
    json_object_set_new(root, "run_id", json_string(run_id)); /* whose: pruning removes its own */
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "optimizer_step", json_integer(optimizer_step));
    json_object_set_new(root, "seed", json_integer((json_int_t)cfg->training.seed));
    json_object_set_new(root, "global_batch", json_integer(cfg->training.global_batch));
    json_object_set_new(root, "seq_len", json_integer(cfg->training.seq_len));
    json_object_set_new(root, "shuffle", json_boolean(cfg->data.shuffle));
    json_object_set_new(root, "steps", json_integer(cfg->training.steps)); /* the schedule's length */
    char cwd[PT_PATH_MAX];
    if (getcwd(cwd, sizeof cwd)) /* what train.ini's relative paths are relative to */
        json_object_set_new(root, "run_dir", json_string(cwd));
    if (cfg->data.sources[0]) { /* the mixture read: each source's name, glob and weight */
        pt_mix_spec spec;
        if (pt_mix_parse(cfg->data.sources, cfg->data.weights, &spec) == PT_OK) {
            json_t *src = json_array();
            for (int i = 0; i < spec.n; i++)
                json_array_append_new(src, json_pack("{s:s, s:s, s:f, s:i}", "name", spec.name[i],
                                                     "glob", spec.glob[i], "weight", spec.weight[i],
                                                     "per_block", (int)spec.per_block[i]));
            json_object_set_new(root, "data_sources", src);
            json_object_set_new(root, "data_block", json_integer(PT_MIX_BLOCK));
        }
        pt_mix_spec_free(&spec);
    }
    pt_resume_record(cfg, root); /* the data's fingerprints and the model: checked on resume */
    json_object_set_new(root, "total", json_integer((json_int_t)m->gtable.total));
    if (m->aux_f && m->cfg.aux_scope == PT_AUX_GLOBAL) { /* the next step's balancing f */
        json_t *f = json_array();
        for (size_t i = 0; i < (size_t)m->cfg.n_layers * m->cfg.n_experts; i++)
            json_array_append_new(f, json_real(m->aux_f[i]));
        json_object_set_new(root, "aux_f", f);
    }
    json_t *tensors = json_array();
    for (int i = 0; i < m->gtable.n; i++) {
        const pt_param *p = &m->gtable.p[i];
        json_t *shape = json_array();
        for (int d = 0; d < p->ndim; d++) json_array_append_new(shape, json_integer(p->shape[d]));
        json_array_append_new(tensors, json_pack("{s:s, s:o, s:I}", "name", p->name, "shape", shape,
                                                 "offset", (json_int_t)p->offset));
    }
    json_object_set_new(root, "tensors", tensors);
    json_t *shards = json_array();
    char file[64], crc[16];
    for (int r = 0; r < world_size; r++) {
        int n = (int)info[3 * r + 1];
        if (n == 0) continue;
        snprintf(file, sizeof file, "shard-%05d-of-%05d.safetensors", r, world_size);
        snprintf(crc, sizeof crc, "%08llx", (unsigned long long)info[3 * r + 2]);
        json_t *bs = json_array();
        for (int i = 0; i < n; i++) {
            const int64_t *b = blocks + PT_BLOCK_INTS * ((size_t)r * max_pieces + i);
            json_array_append_new(bs, json_pack("[I, I, I, I, I]", (json_int_t)b[0], (json_int_t)b[1],
                                                (json_int_t)b[2], (json_int_t)b[3], (json_int_t)b[4]));
        }
        json_array_append_new(shards, json_pack("{s:s, s:s, s:o}", "file", file, "crc32", crc,
                                                "blocks", bs));
    }
    json_object_set_new(root, "shards", shards);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_COMPACT);
    json_decref(root);
    pt_status st = pt_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}

/* Per tensor, the area of the blocks must be the tensor's size (a block is checked to lie inside
 * its tensor): NULL when it is, else the first tensor that is not. */
static const pt_param *pt_uncovered(const pt_param_table *t, const int64_t *blocks, size_t n) {
    int64_t *area = pt_calloc((size_t)t->n, sizeof *area);
    const pt_param *bad = NULL;
    for (size_t k = 0; k < n && !bad; k++) {
        const int64_t *b = blocks + PT_BLOCK_INTS * k;
        if (b[0] < 0 || b[0] >= t->n) {
            bad = &t->p[0];
            break;
        }
        const pt_param *p = &t->p[b[0]];
        if (b[1] < 0 || b[2] > p->shape[0] || b[1] >= b[2] || b[3] < 0 || b[4] > pt_gcols(p) ||
            b[3] >= b[4]) {
            bad = p; /* before its area: a hostile index's bounds overflow the product */
            break;
        }
        /* inside its tensor, a block's area is at most numel: the sum stops once past it */
        area[b[0]] += (b[2] - b[1]) * (b[4] - b[3]);
        if (area[b[0]] > (int64_t)p->numel) bad = p;
    }
    for (int i = 0; i < t->n && !bad; i++)
        if (area[i] != (int64_t)t->p[i].numel) bad = &t->p[i];
    free(area);
    return bad;
}

/* Rank 0: config.json, index.json and train.ini into tmp_dir, then publish it as final_dir. */
static pt_status pt_publish(const char *root, const char *tmp_dir, const char *final_dir,
                            int64_t step, const pt_model *m, int64_t optimizer_step,
                            const pt_config *cfg, int keep, const char *run_id, int world_size,
                            const int64_t *info, const int64_t *blocks, int max_pieces) {
    char path[PT_PATH_MAX + 96], old_dir[PT_PATH_MAX + 40];
    size_t n_blocks = 0;
    for (int r = 0; r < world_size; r++) n_blocks += (size_t)info[3 * r + 1];
    int64_t *all = pt_malloc((n_blocks ? n_blocks : 1) * PT_BLOCK_INTS * sizeof *all);
    size_t k = 0;
    for (int r = 0; r < world_size; r++)
        for (int i = 0; i < info[3 * r + 1]; i++, k++)
            memcpy(all + PT_BLOCK_INTS * k, blocks + PT_BLOCK_INTS * ((size_t)r * max_pieces + i),
                   PT_BLOCK_INTS * sizeof *all);
    const pt_param *bad = pt_uncovered(&m->gtable, all, n_blocks);
    free(all);
    if (bad)
        return pt_errorf(PT_ERR_RUNTIME, "checkpoint: the ranks' blocks do not cover %s exactly "
                         "once (a layout bug)", bad->name);

    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    PT_TRY(pt_hf_config_write(path, &m->cfg));
    snprintf(path, sizeof path, "%s/index.json", tmp_dir);
    PT_TRY(pt_write_index(path, step, m, optimizer_step, cfg, run_id, world_size, info, blocks,
                          max_pieces));
    snprintf(path, sizeof path, "%s/train.ini", tmp_dir);
    char *ini = NULL;
    size_t ini_len = 0;
    FILE *mf = open_memstream(&ini, &ini_len);
    char cwd[PT_PATH_MAX];
    if (getcwd(cwd, sizeof cwd))
        fprintf(mf, "# relative paths below are relative to %s, the directory training ran in\n",
                cwd);
    pt_config_write(cfg, mf);
    fclose(mf);
    pt_status st = pt_write_file_atomic(path, ini, ini_len);
    free(ini);
    PT_TRY(st);
    PT_TRY(pt_fsync_dir(tmp_dir));

    /* an existing checkpoint of the same step is replaced only once the new one is whole, and
     * only if this run saved it: never another run's, never a link (pt_ckpt_check_dir refuses at
     * set-up a run that would) */
    snprintf(old_dir, sizeof old_dir, "%s.old", final_dir);
    struct stat sb;
    int had_old = lstat(final_dir, &sb) == 0;
    if (had_old) {
        char other[PT_RUN_ID_LEN + 1];
        pt_ckpt_identity(final_dir, other, NULL);
        if (S_ISLNK(sb.st_mode) || strcmp(other, run_id))
            return pt_errorf(PT_ERR_IO, "%s is %s: it is never replaced", final_dir,
                             S_ISLNK(sb.st_mode) ? "a symbolic link" : "another run's checkpoint");
        PT_TRY(pt_rmtree(old_dir));
        if (rename(final_dir, old_dir) != 0)
            return pt_errorf(PT_ERR_IO, "%s: rename failed: %s", final_dir, strerror(errno));
    }
    if (rename(tmp_dir, final_dir) != 0)
        return pt_errorf(PT_ERR_IO, "%s: rename failed: %s", tmp_dir, strerror(errno));
    PT_TRY(pt_fsync_dir(root));
    if (had_old) PT_TRY(pt_rmtree(old_dir));

    /* keep the newest `keep` of this run's own: another run's checkpoints and links are never
     * pruned */
    pt_ckpt_entry *e;
    int n = pt_scan(root, &e, 1), own = 0;
    for (int i = 0; i < n; i++) own += !e[i].link && !strcmp(e[i].run, run_id);
    for (int i = 0; i < n && own > keep; i++) {
        if (e[i].link || strcmp(e[i].run, run_id)) continue;
        char victim[PT_PATH_MAX + 32];
        snprintf(victim, sizeof victim, "%s/step_%08lld", root, (long long)e[i].step);
        if (pt_rmtree(victim) != PT_OK) pt_log_warn("%s", pt_last_error());
        own--;
    }
    free(e);
    return PT_OK;
}

/* A save that failed (a full disk, say): rank 0 removes the partial tmp_dir, so that neither it
 * nor its space outlives the run; the published checkpoints were never touched. Keeps st's
 * message, naming the path that failed. */
static pt_status pt_save_failed(int rank, const char *tmp_dir, pt_status st) {
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", pt_last_error());
    if (rank == 0 && pt_rmtree(tmp_dir) != PT_OK) pt_log_warn("%s", pt_last_error());
    return pt_errorf(st, "checkpoint not saved: %s (the previous checkpoints are intact)", msg);
}

pt_status pt_ckpt_save_begin(pt_ckpt_save_state *s, const char *root, int64_t step,
                             int64_t optimizer_step, const pt_ckpt_piece *pieces, int n_pieces,
                             const char *run_id, pt_comm *world) {
    int rank = world ? world->rank : 0;
    memset(s, 0, sizeof *s);
    snprintf(s->root, sizeof s->root, "%s", root);
    snprintf(s->run_id, sizeof s->run_id, "%s", run_id);
    snprintf(s->final_dir, sizeof s->final_dir, "%s/step_%08lld", root, (long long)step);
    snprintf(s->tmp_dir, sizeof s->tmp_dir, "%s.tmp", s->final_dir);
    s->step = step, s->optimizer_step = optimizer_step;
    s->pieces = pieces, s->n_pieces = n_pieces;
    s->rank = rank, s->size = world ? world->size : 1;
    /* rank 0 prepares the directory; then every rank writes its file */
    pt_status st = PT_OK;
    if (rank == 0) {
        st = pt_mkdirs(root);
        if (st == PT_OK) st = pt_rmtree(s->tmp_dir);
        if (st == PT_OK) st = pt_mkdirs(s->tmp_dir);
    }
    if (!pt_all_ok(world, st == PT_OK))
        return pt_save_failed(rank, s->tmp_dir, st != PT_OK ? st : pt_errorf(PT_ERR_IO, "rank 0 could "
                                                                 "not create %s", s->tmp_dir));
    return PT_OK;
}

void pt_ckpt_save_write(pt_ckpt_save_state *s) {
    char path[PT_PATH_MAX + 96];
    s->write_status = PT_OK;
    if (s->n_pieces > 0) {
        snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", s->tmp_dir, s->rank,
                 s->size);
        s->write_status = pt_write_shard(path, s->pieces, s->n_pieces);
        if (s->write_status == PT_OK) s->write_status = pt_file_crc32(path, &s->crc);
    }
    /* the message of this thread's error, for pt_ckpt_save_finish on the saving thread */
    if (s->write_status != PT_OK) snprintf(s->write_error, sizeof s->write_error, "%s", pt_last_error());
}

pt_status pt_ckpt_save_finish(pt_ckpt_save_state *s, const pt_model *m, const pt_config *cfg,
                              int keep, pt_comm *world) {
    int rank = s->rank, size = s->size, n_pieces = s->n_pieces;
    const pt_ckpt_piece *pieces = s->pieces;
    pt_status st = s->write_status;
    if (st != PT_OK) pt_errorf(st, "%s", s->write_error);
    if (!pt_all_ok(world, st == PT_OK))
        return pt_save_failed(rank, s->tmp_dir, st != PT_OK ? st : pt_errorf(PT_ERR_IO, "another rank "
                                                              "failed to write its shard of %s", s->tmp_dir));

    /* rank 0 learns every rank's blocks and checksum: (rank, count, crc) then the blocks */
    int64_t mine[3] = {rank, n_pieces, s->crc};
    int64_t *info = pt_malloc((size_t)size * 3 * sizeof *info);
    if (world) pt_allgather(world, mine, info, 3, PT_DTYPE_I64);
    else memcpy(info, mine, sizeof mine);
    int max_pieces = 1;
    for (int r = 0; r < size; r++)
        if (info[3 * r + 1] > max_pieces) max_pieces = (int)info[3 * r + 1];
    size_t row = (size_t)max_pieces * PT_BLOCK_INTS;
    int64_t *my_blocks = pt_calloc(row, sizeof *my_blocks);
    for (int i = 0; i < n_pieces; i++) {
        int64_t *b = my_blocks + PT_BLOCK_INTS * i;
        b[0] = pieces[i].tensor;
        b[1] = pieces[i].r0;
        b[2] = pieces[i].r1;
        b[3] = pieces[i].c0;
        b[4] = pieces[i].c1;
    }
    int64_t *blocks = pt_malloc((size_t)size * row * sizeof *blocks);
    if (world) pt_allgather(world, my_blocks, blocks, row, PT_DTYPE_I64);
    else memcpy(blocks, my_blocks, row * sizeof *blocks);
    free(my_blocks);
    if (rank == 0)
        st = pt_publish(s->root, s->tmp_dir, s->final_dir, s->step, m, s->optimizer_step, cfg, keep,
                        s->run_id, size, info, blocks, max_pieces);
    free(info);
    free(blocks);
    if (!pt_all_ok(world, st == PT_OK))
        return pt_save_failed(rank, s->tmp_dir, st != PT_OK ? st : pt_errorf(PT_ERR_IO, "rank 0 failed "
                                                              "to publish %s", s->final_dir));
    return PT_OK;
}

pt_status pt_ckpt_save(const char *root, int64_t step, const pt_model *m, const pt_ckpt_piece *pieces,
                       int n_pieces, int64_t optimizer_step, const pt_config *cfg, int keep,
                       const char *run_id, pt_comm *world) {
    pt_ckpt_save_state s;
    PT_TRY(pt_ckpt_save_begin(&s, root, step, optimizer_step, pieces, n_pieces, run_id, world));
    pt_ckpt_save_write(&s);
    return pt_ckpt_save_finish(&s, m, cfg, keep, world);
}

/* ------------------------------------------------------------------------------------------ */
/* loading */

typedef struct {
    char file[PT_PATH_MAX + 96];
    uint32_t crc;
    pt_st_file *f; /* opened (and checked) on first use */
} pt_ckpt_shard;

typedef struct {
    int64_t b[PT_BLOCK_INTS];
    int shard;
} pt_ckpt_block;

struct pt_ckpt {
    char dir[PT_PATH_MAX];
    int64_t step, optimizer_step;
    double *aux_f; /* the global balancing scope's f, or NULL */
    size_t n_aux_f;
    pt_ckpt_shard *shards;
    int n_shards;
    pt_ckpt_block *blocks; /* sorted by tensor */
    int n_blocks;
    int *first;            /* first block of each tensor (n_tensors + 1 entries) */
    const pt_param_table *table; /* the single-process table it was opened against */
};

static int pt_cmp_block(const void *a, const void *b) {
    int64_t x = ((const pt_ckpt_block *)a)->b[0], y = ((const pt_ckpt_block *)b)->b[0];
    return (x > y) - (x < y);
}

static pt_status pt_index_fail(pt_ckpt *c, json_t *root, pt_status st) {
    json_decref(root);
    pt_ckpt_close(c);
    return st;
}

pt_status pt_ckpt_open(pt_ckpt **out, const char *dir, const pt_param_table *t) {
    *out = NULL;
    char path[PT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/index.json", dir);
    json_error_t err;
    int fd;
    PT_TRY(pt_open_regular(path, "checkpoint index", &fd));
    json_t *root = json_loadfd(fd, 0, &err);
    close(fd);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s: %s (line %d)", path, err.text, err.line);
    pt_ckpt *c = pt_calloc(1, sizeof *c);
    c->table = t;
    snprintf(c->dir, sizeof c->dir, "%s", dir);
    const char *fmt = json_string_value(json_object_get(root, "format"));
    json_t *tensors = json_object_get(root, "tensors"), *shards = json_object_get(root, "shards");
    json_t *js = json_object_get(root, "step"), *jo = json_object_get(root, "optimizer_step");
    if (!fmt || strcmp(fmt, PT_CKPT_FORMAT) != 0)
        return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: \"format\" is not %s", path,
                                                PT_CKPT_FORMAT));
    if (!json_is_array(tensors) || !json_is_array(shards) || !json_is_integer(js) ||
        !json_is_integer(jo))
        return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: missing or malformed step, "
                                                "optimizer_step, tensors or shards", path));
    c->step = json_integer_value(js);
    c->optimizer_step = json_integer_value(jo);
    if (c->step < 0 || c->optimizer_step < 0 || c->optimizer_step > c->step)
        return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: step %lld and optimizer_step "
                                                "%lld: expected 0 <= optimizer_step <= step", path,
                                                (long long)c->step, (long long)c->optimizer_step));
    json_t *jf = json_object_get(root, "aux_f"), *x;
    size_t xi;
    if (json_is_array(jf) && json_array_size(jf) > 0) {
        c->n_aux_f = json_array_size(jf);
        c->aux_f = pt_calloc(c->n_aux_f, sizeof *c->aux_f);
        json_array_foreach(jf, xi, x) c->aux_f[xi] = json_number_value(x);
    }

    /* the global tensors must be this model's */
    if ((int)json_array_size(tensors) != t->n)
        return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: %zu tensors, the model has %d "
                                                "(a different architecture?)", path,
                                                json_array_size(tensors), t->n));
    for (int i = 0; i < t->n; i++) {
        const pt_param *p = &t->p[i];
        json_t *e = json_array_get(tensors, (size_t)i), *shape = json_object_get(e, "shape");
        const char *name = json_string_value(json_object_get(e, "name"));
        json_t *off = json_object_get(e, "offset");
        int same = name && !strcmp(name, p->name) && json_is_integer(off) &&
                   (size_t)json_integer_value(off) == p->offset && json_is_array(shape) &&
                   (int)json_array_size(shape) == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = json_integer_value(json_array_get(shape, (size_t)d)) == p->shape[d];
        if (!same)
            return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: tensor %d is not %s with "
                                                    "this model's shape and offset", path, i,
                                                    p->name));
    }

    c->n_shards = (int)json_array_size(shards);
    c->shards = pt_calloc((size_t)(c->n_shards ? c->n_shards : 1), sizeof *c->shards);
    size_t cap = 0;
    for (int s = 0; s < c->n_shards; s++) {
        json_t *e = json_array_get(shards, (size_t)s), *bs = json_object_get(e, "blocks");
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *crc = json_string_value(json_object_get(e, "crc32"));
        if (!file || strchr(file, '/') || !crc || !json_is_array(bs))
            return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: shard %d is malformed",
                                                    path, s));
        snprintf(c->shards[s].file, sizeof c->shards[s].file, "%s/%s", dir, file);
        c->shards[s].crc = (uint32_t)strtoul(crc, NULL, 16);
        for (size_t i = 0; i < json_array_size(bs); i++) {
            json_t *b = json_array_get(bs, i);
            if (!json_is_array(b) || json_array_size(b) != PT_BLOCK_INTS)
                return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: shard %d: block %zu "
                                                        "is not [tensor, r0, r1, c0, c1]", path, s, i));
            if ((size_t)c->n_blocks == cap) {
                cap = cap ? 2 * cap : 64;
                c->blocks = pt_realloc(c->blocks, cap * sizeof *c->blocks);
            }
            pt_ckpt_block *k = &c->blocks[c->n_blocks++];
            for (int j = 0; j < PT_BLOCK_INTS; j++)
                k->b[j] = json_integer_value(json_array_get(b, (size_t)j));
            k->shard = s;
        }
    }
    json_decref(root);
    int64_t *flat = pt_malloc(((size_t)c->n_blocks + 1) * PT_BLOCK_INTS * sizeof *flat);
    for (int i = 0; i < c->n_blocks; i++)
        memcpy(flat + PT_BLOCK_INTS * i, c->blocks[i].b, sizeof c->blocks[i].b);
    const pt_param *bad = pt_uncovered(t, flat, (size_t)c->n_blocks);
    free(flat);
    if (bad) {
        pt_ckpt_close(c);
        return pt_errorf(PT_ERR_FORMAT, "%s: the shards do not cover the model exactly once "
                         "(%s)", path, bad->name);
    }
    if (c->n_blocks) qsort(c->blocks, (size_t)c->n_blocks, sizeof *c->blocks, pt_cmp_block);
    c->first = pt_calloc((size_t)t->n + 1, sizeof *c->first);
    for (int i = 0, k = 0; i <= t->n; i++) {
        while (k < c->n_blocks && c->blocks[k].b[0] < i) k++;
        c->first[i] = k;
    }
    *out = c;
    return PT_OK;
}

static pt_status pt_shard_file(pt_ckpt *c, int s, pt_st_file **f) {
    pt_ckpt_shard *sh = &c->shards[s];
    if (!sh->f) {
        uint32_t crc;
        PT_TRY(pt_file_crc32(sh->file, &crc));
        if (crc != sh->crc)
            return pt_errorf(PT_ERR_FORMAT, "%s: checksum %08x does not match %08x recorded in "
                             "index.json (the checkpoint is corrupt)", sh->file, crc, sh->crc);
        PT_TRY(pt_st_open(&sh->f, sh->file));
    }
    *f = sh->f;
    return PT_OK;
}

pt_status pt_ckpt_read_block(pt_ckpt *c, int kind, int tensor, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1, float *out) {
    char name[96];
    int64_t w = c1 - c0;
    for (int i = c->first[tensor]; i < c->first[tensor + 1]; i++) {
        const int64_t *b = c->blocks[i].b;
        int64_t ra = b[1] > r0 ? b[1] : r0, rb = b[2] < r1 ? b[2] : r1;
        int64_t ca = b[3] > c0 ? b[3] : c0, cb = b[4] < c1 ? b[4] : c1;
        if (ra >= rb || ca >= cb) continue;
        pt_st_file *f = NULL;
        PT_TRY(pt_shard_file(c, c->blocks[i].shard, &f));
        pt_block_key(name, sizeof name, kind, tensor, b[1], b[3]);
        const pt_st_tensor *t = pt_st_find(f, name);
        int64_t bw = b[4] - b[3];
        if (!t || t->dtype != PT_ST_DTYPE_F32 || t->ndim != 2 || t->shape[0] != b[2] - b[1] ||
            t->shape[1] != bw)
            return pt_errorf(PT_ERR_FORMAT, "%s: no F32 tensor %s of %lld × %lld", pt_st_path(f),
                             name, (long long)(b[2] - b[1]), (long long)bw);
        const float *src = pt_st_tensor_data(f, t);
        for (int64_t r = ra; r < rb; r++) {
            float *dst = out + (r - r0) * w + (ca - c0);
            memcpy(dst, src + (r - b[1]) * bw + (ca - b[3]), (size_t)(cb - ca) * sizeof(float));
            if (!pt_all_finite(dst, (size_t)(cb - ca)))
                return pt_errorf(PT_ERR_FORMAT, "%s: %s (tensor %s, %s) holds values that are not "
                                 "finite: the checkpoint is refused", pt_st_path(f), name,
                                 c->table->p[tensor].name, pt_kind_name[kind]);
        }
    }
    return PT_OK;
}

int64_t pt_ckpt_step(const pt_ckpt *c) { return c->step; }
int64_t pt_ckpt_optimizer_step(const pt_ckpt *c) { return c->optimizer_step; }

int pt_ckpt_aux_f(const pt_ckpt *c, double *f, size_t n) {
    if (!c->aux_f || c->n_aux_f != n) return 0;
    memcpy(f, c->aux_f, n * sizeof *f);
    return 1;
}

void pt_ckpt_close(pt_ckpt *c) {
    if (!c) return;
    for (int s = 0; s < c->n_shards; s++)
        if (c->shards[s].f) pt_st_close(c->shards[s].f);
    free(c->shards);
    free(c->blocks);
    free(c->first);
    free(c->aux_f);
    free(c);
}

pt_status pt_ckpt_load_weights_host(const char *dir, const pt_model *m, float *host) {
    char path[PT_PATH_MAX + 64];
    const pt_param_table *t = &m->gtable;
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (access(path, F_OK) == 0) {
        pt_ckpt *c;
        PT_TRY(pt_ckpt_open(&c, dir, t));
        pt_status st = PT_OK;
        for (int i = 0; i < t->n && st == PT_OK; i++)
            st = pt_ckpt_read_block(c, PT_CKPT_PARAMS, i, 0, t->p[i].shape[0], 0,
                                    pt_gcols(&t->p[i]), host + t->p[i].offset);
        pt_ckpt_close(c);
        return st;
    }
    pt_st_dir *d;
    PT_TRY(pt_st_dir_open(&d, dir));
    pt_status st = PT_OK;
    for (int i = 0; i < t->n && st == PT_OK; i++) {
        const pt_param *p = &t->p[i];
        st = pt_st_dir_read_f32(d, p->name, p->shape, p->ndim, host + p->offset);
        if (st == PT_OK && !pt_all_finite(host + p->offset, p->numel))
            st = pt_errorf(PT_ERR_FORMAT, "%s: tensor %s holds values that are not finite: the "
                           "weights are refused", dir, p->name);
    }
    /* a tied model must not silently drop a separate head */
    if (st == PT_OK && m->cfg.tied_embeddings && pt_st_dir_find(d, "lm_head.weight", NULL))
        pt_log_warn("%s: lm_head.weight present but the config ties embeddings; it is ignored", dir);
    pt_st_dir_close(d);
    return st;
}

pt_status pt_ckpt_load_weights(const char *dir, pt_model *m) {
    PT_ASSERTF(m->par.tp <= 1, "pt_ckpt_load_weights: an unsplit model");
    float *host = pt_malloc(m->gtable.total * sizeof(float));
    pt_status st = pt_ckpt_load_weights_host(dir, m, host);
    if (st == PT_OK) m->be->upload(m->be, m->params, host, m->gtable.total * sizeof(float));
    free(host);
    return st;
}
