/* checkpoint.c: checkpoints and Hugging Face export (see include/pt/checkpoint.h). */
#include "pt/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <jansson.h>

#include "pt/hf_config.h"
#include "pt/safetensors.h"

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

static pt_status pt_write_weights(const char *path, const pt_model *m, const float *host) {
    pt_st_writer *w = pt_st_writer_create();
    pt_status st = pt_st_writer_set_meta(w, "format", "pt");
    for (int i = 0; i < m->table.n && st == PT_OK; i++) {
        const pt_param *p = &m->table.p[i];
        st = pt_st_writer_add_f32(w, p->name, p->shape, p->ndim, host + p->offset, PT_ST_DTYPE_F32);
    }
    if (st == PT_OK) st = pt_st_writer_write(w, path);
    pt_st_writer_free(w);
    return st;
}

pt_status pt_ckpt_export_hf_host(const char *dir, const pt_model *m, const float *host) {
    char path[PT_PATH_MAX + 64];
    PT_TRY(pt_mkdirs(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    PT_TRY(pt_hf_config_write(path, &m->cfg));
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    return pt_write_weights(path, m, host);
}

pt_status pt_ckpt_export_hf(const char *dir, const pt_model *m) {
    float *host = pt_host_copy(m->be, m->params, m->table.total);
    pt_status st = pt_ckpt_export_hf_host(dir, m, host);
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

static pt_status pt_rmtree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? PT_OK : pt_errorf(PT_ERR_IO, "%s: cannot open", dir);
    struct dirent *e;
    char path[PT_PATH_MAX + 300];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    if (rmdir(dir) != 0) return pt_errorf(PT_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return PT_OK;
}

static int pt_cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Steps of the complete checkpoints under root, sorted ascending (caller frees). */
static int pt_list_steps(const char *root, int64_t **steps) {
    DIR *d = opendir(root);
    *steps = NULL;
    if (!d) return 0;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t s;
        if (!pt_is_step_dir(e->d_name, &s)) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            *steps = realloc(*steps, (size_t)cap * sizeof **steps);
            PT_ASSERT(*steps != NULL);
        }
        (*steps)[n++] = s;
    }
    closedir(d);
    if (n) qsort(*steps, (size_t)n, sizeof **steps, pt_cmp_i64);
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
/* saving */

static const char *const pt_kind_name[3] = {"params", "exp_avg", "exp_avg_sq"};

/* This rank's shard file: its pieces, three tensors each. */
static pt_status pt_write_shard(const char *path, const pt_ckpt_piece *pieces, int n) {
    pt_st_writer *w = pt_st_writer_create();
    pt_status st = pt_st_writer_set_meta(w, "format", PT_CKPT_FORMAT);
    char name[64];
    for (int i = 0; i < n && st == PT_OK; i++) {
        const float *src[3] = {pieces[i].param, pieces[i].exp_avg, pieces[i].exp_avg_sq};
        int64_t len = (int64_t)(pieces[i].hi - pieces[i].lo);
        for (int k = 0; k < 3 && st == PT_OK; k++) {
            snprintf(name, sizeof name, "%s@%zu", pt_kind_name[k], pieces[i].lo);
            st = pt_st_writer_add_f32(w, name, &len, 1, src[k], PT_ST_DTYPE_F32);
        }
    }
    if (st == PT_OK) st = pt_st_writer_write(w, path);
    pt_st_writer_free(w);
    return st;
}

/* Everyone learns whether every rank succeeded (a min over the world). */
static int pt_all_ok(pt_comm *world, int ok) {
    if (!world) return ok;
    int32_t v = ok ? 0 : 1;
    pt_allreduce_sum(world, &v, 1, PT_DTYPE_I32);
    return v == 0;
}

static pt_status pt_write_index(const char *path, int64_t step, const pt_model *m,
                                int64_t optimizer_step, const pt_config *cfg, int world_size,
                                const int64_t *info, const int64_t *ranges, int max_pieces) {
    json_t *root = json_object();
    json_object_set_new(root, "format", json_string(PT_CKPT_FORMAT));
    json_object_set_new(root, "step", json_integer(step));
    json_object_set_new(root, "optimizer_step", json_integer(optimizer_step));
    json_object_set_new(root, "seed", json_integer((json_int_t)cfg->training.seed));
    json_object_set_new(root, "global_batch", json_integer(cfg->training.global_batch));
    json_object_set_new(root, "seq_len", json_integer(cfg->training.seq_len));
    json_object_set_new(root, "shuffle", json_boolean(cfg->data.shuffle));
    json_object_set_new(root, "total", json_integer((json_int_t)m->table.total));
    json_t *tensors = json_array();
    for (int i = 0; i < m->table.n; i++) {
        const pt_param *p = &m->table.p[i];
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
        json_t *rs = json_array();
        for (int i = 0; i < n; i++) {
            const int64_t *rg = ranges + 2 * ((size_t)r * max_pieces + i);
            json_array_append_new(rs, json_pack("[I, I]", (json_int_t)rg[0], (json_int_t)rg[1]));
        }
        json_array_append_new(shards, json_pack("{s:s, s:s, s:o}", "file", file, "crc32", crc,
                                                "ranges", rs));
    }
    json_object_set_new(root, "shards", shards);
    char *text = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    pt_status st = pt_write_file_atomic(path, text, strlen(text));
    free(text);
    return st;
}

/* Rank 0: config.json, index.json and train.ini into tmp_dir, then publish it as final_dir. */
static pt_status pt_publish(const char *root, const char *tmp_dir, const char *final_dir,
                            int64_t step, const pt_model *m, int64_t optimizer_step,
                            const pt_config *cfg, int keep, int world_size, const int64_t *info,
                            const int64_t *ranges, int max_pieces) {
    char path[PT_PATH_MAX + 96], old_dir[PT_PATH_MAX + 40];
    /* the pieces must cover the table exactly once */
    size_t covered = 0, n_ranges = 0;
    for (int r = 0; r < world_size; r++) n_ranges += (size_t)info[3 * r + 1];
    int64_t *all = pt_malloc((n_ranges ? n_ranges : 1) * 2 * sizeof *all);
    size_t k = 0;
    for (int r = 0; r < world_size; r++)
        for (int i = 0; i < info[3 * r + 1]; i++, k++)
            memcpy(all + 2 * k, ranges + 2 * ((size_t)r * max_pieces + i), 2 * sizeof *all);
    qsort(all, n_ranges, 2 * sizeof *all, pt_cmp_i64);
    for (k = 0; k < n_ranges; k++) {
        if ((size_t)all[2 * k] != covered) break;
        covered = (size_t)all[2 * k + 1];
    }
    free(all);
    if (covered != m->table.total)
        return pt_errorf(PT_ERR_RUNTIME, "checkpoint: the ranks' pieces cover %zu of %zu elements "
                         "without gaps or overlaps (a layout bug)", covered, m->table.total);

    snprintf(path, sizeof path, "%s/config.json", tmp_dir);
    PT_TRY(pt_hf_config_write(path, &m->cfg));
    snprintf(path, sizeof path, "%s/index.json", tmp_dir);
    PT_TRY(pt_write_index(path, step, m, optimizer_step, cfg, world_size, info, ranges, max_pieces));
    snprintf(path, sizeof path, "%s/train.ini", tmp_dir);
    char *ini = NULL;
    size_t ini_len = 0;
    FILE *mf = open_memstream(&ini, &ini_len);
    pt_config_write(cfg, mf);
    fclose(mf);
    pt_status st = pt_write_file_atomic(path, ini, ini_len);
    free(ini);
    PT_TRY(st);
    PT_TRY(pt_fsync_dir(tmp_dir));

    /* an existing checkpoint of the same step is replaced only once the new one is whole */
    snprintf(old_dir, sizeof old_dir, "%s.old", final_dir);
    struct stat sb;
    int had_old = stat(final_dir, &sb) == 0;
    if (had_old) {
        PT_TRY(pt_rmtree(old_dir));
        if (rename(final_dir, old_dir) != 0)
            return pt_errorf(PT_ERR_IO, "%s: rename failed: %s", final_dir, strerror(errno));
    }
    if (rename(tmp_dir, final_dir) != 0)
        return pt_errorf(PT_ERR_IO, "%s: rename failed: %s", tmp_dir, strerror(errno));
    PT_TRY(pt_fsync_dir(root));
    if (had_old) PT_TRY(pt_rmtree(old_dir));

    /* keep the newest `keep` */
    int64_t *steps;
    int n_steps = pt_list_steps(root, &steps);
    for (int i = 0; i < n_steps - keep; i++) {
        char victim[PT_PATH_MAX + 32];
        snprintf(victim, sizeof victim, "%s/step_%08lld", root, (long long)steps[i]);
        st = pt_rmtree(victim);
        if (st != PT_OK) pt_log_warn("%s", pt_last_error());
    }
    free(steps);
    return PT_OK;
}

pt_status pt_ckpt_save(const char *root, int64_t step, const pt_model *m, const pt_ckpt_piece *pieces,
                       int n_pieces, int64_t optimizer_step, const pt_config *cfg, int keep,
                       pt_comm *world) {
    int rank = world ? world->rank : 0, size = world ? world->size : 1;
    char final_dir[PT_PATH_MAX + 32], tmp_dir[PT_PATH_MAX + 40], path[PT_PATH_MAX + 96];
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", root, (long long)step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp", final_dir);

    /* rank 0 prepares the directory; then every rank writes its file */
    pt_status st = PT_OK;
    if (rank == 0) {
        st = pt_mkdirs(root);
        if (st == PT_OK) st = pt_rmtree(tmp_dir);
        if (st == PT_OK) st = pt_mkdirs(tmp_dir);
    }
    if (!pt_all_ok(world, st == PT_OK))
        return st != PT_OK ? st : pt_errorf(PT_ERR_IO, "rank 0 could not create %s", tmp_dir);
    uint32_t crc = 0;
    if (n_pieces > 0) {
        snprintf(path, sizeof path, "%s/shard-%05d-of-%05d.safetensors", tmp_dir, rank, size);
        st = pt_write_shard(path, pieces, n_pieces);
        if (st == PT_OK) st = pt_file_crc32(path, &crc);
    }
    if (!pt_all_ok(world, st == PT_OK))
        return st != PT_OK ? st : pt_errorf(PT_ERR_IO, "another rank failed to write its shard of %s",
                                            tmp_dir);

    /* rank 0 learns every rank's ranges and checksum: (rank, count, crc) then the ranges */
    int64_t mine[3] = {rank, n_pieces, crc};
    int64_t *info = pt_malloc((size_t)size * 3 * sizeof *info);
    if (world) pt_allgather(world, mine, info, 3, PT_DTYPE_I64);
    else memcpy(info, mine, sizeof mine);
    int max_pieces = 1;
    for (int r = 0; r < size; r++)
        if (info[3 * r + 1] > max_pieces) max_pieces = (int)info[3 * r + 1];
    int64_t *my_ranges = pt_calloc((size_t)max_pieces * 2, sizeof *my_ranges);
    for (int i = 0; i < n_pieces; i++) {
        my_ranges[2 * i] = (int64_t)pieces[i].lo;
        my_ranges[2 * i + 1] = (int64_t)pieces[i].hi;
    }
    int64_t *ranges = pt_malloc((size_t)size * max_pieces * 2 * sizeof *ranges);
    if (world) pt_allgather(world, my_ranges, ranges, (size_t)max_pieces * 2, PT_DTYPE_I64);
    else memcpy(ranges, my_ranges, (size_t)max_pieces * 2 * sizeof *ranges);
    free(my_ranges);
    if (rank == 0)
        st = pt_publish(root, tmp_dir, final_dir, step, m, optimizer_step, cfg, keep, size, info,
                        ranges, max_pieces);
    free(info);
    free(ranges);
    if (!pt_all_ok(world, st == PT_OK))
        return st != PT_OK ? st : pt_errorf(PT_ERR_IO, "rank 0 failed to publish %s", final_dir);
    return PT_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* loading */

typedef struct {
    char file[PT_PATH_MAX + 96];
    uint32_t crc;
    pt_st_file *f; /* opened (and checked) on first use */
} pt_ckpt_shard;

typedef struct {
    size_t lo, hi;
    int shard;
} pt_ckpt_range;

struct pt_ckpt {
    char dir[PT_PATH_MAX];
    int64_t step, optimizer_step;
    pt_ckpt_shard *shards;
    int n_shards;
    pt_ckpt_range *ranges; /* sorted by lo */
    int n_ranges;
};

static int pt_cmp_range(const void *a, const void *b) {
    size_t x = ((const pt_ckpt_range *)a)->lo, y = ((const pt_ckpt_range *)b)->lo;
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
    json_t *root = json_load_file(path, 0, &err);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s: %s (line %d)", path, err.text, err.line);
    pt_ckpt *c = pt_calloc(1, sizeof *c);
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
        json_t *e = json_array_get(shards, (size_t)s), *rs = json_object_get(e, "ranges");
        const char *file = json_string_value(json_object_get(e, "file"));
        const char *crc = json_string_value(json_object_get(e, "crc32"));
        if (!file || strchr(file, '/') || !crc || !json_is_array(rs))
            return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: shard %d is malformed",
                                                    path, s));
        snprintf(c->shards[s].file, sizeof c->shards[s].file, "%s/%s", dir, file);
        c->shards[s].crc = (uint32_t)strtoul(crc, NULL, 16);
        for (size_t i = 0; i < json_array_size(rs); i++) {
            json_t *r = json_array_get(rs, i);
            json_int_t lo = json_integer_value(json_array_get(r, 0));
            json_int_t hi = json_integer_value(json_array_get(r, 1));
            if (lo < 0 || hi <= lo || (size_t)hi > t->total)
                return pt_index_fail(c, root, pt_errorf(PT_ERR_FORMAT, "%s: shard %d has a bad "
                                                        "range [%lld, %lld)", path, s,
                                                        (long long)lo, (long long)hi));
            if ((size_t)c->n_ranges == cap) {
                cap = cap ? 2 * cap : 64;
                c->ranges = realloc(c->ranges, cap * sizeof *c->ranges);
                PT_ASSERT(c->ranges != NULL);
            }
            c->ranges[c->n_ranges++] = (pt_ckpt_range){(size_t)lo, (size_t)hi, s};
        }
    }
    json_decref(root);
    if (c->n_ranges) qsort(c->ranges, (size_t)c->n_ranges, sizeof *c->ranges, pt_cmp_range);
    size_t covered = 0;
    for (int i = 0; i < c->n_ranges && c->ranges[i].lo == covered; i++) covered = c->ranges[i].hi;
    if (covered != t->total) {
        pt_ckpt_close(c);
        return pt_errorf(PT_ERR_FORMAT, "%s: the shards do not cover the model exactly once "
                         "(first gap or overlap at element %zu of %zu)", path, covered, t->total);
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

pt_status pt_ckpt_read(pt_ckpt *c, int kind, size_t lo, size_t hi, float *out) {
    char name[64];
    for (int i = 0; i < c->n_ranges && lo < hi; i++) {
        const pt_ckpt_range *r = &c->ranges[i];
        if (r->hi <= lo || r->lo >= hi) continue;
        pt_st_file *f = NULL;
        PT_TRY(pt_shard_file(c, r->shard, &f));
        snprintf(name, sizeof name, "%s@%zu", pt_kind_name[kind], r->lo);
        const pt_st_tensor *t = pt_st_find(f, name);
        if (!t || t->dtype != PT_ST_DTYPE_F32 || t->ndim != 1 ||
            t->shape[0] != (int64_t)(r->hi - r->lo))
            return pt_errorf(PT_ERR_FORMAT, "%s: no F32 tensor %s of %zu elements", pt_st_path(f),
                             name, r->hi - r->lo);
        size_t a = r->lo > lo ? r->lo : lo, b = r->hi < hi ? r->hi : hi;
        const float *src = pt_st_tensor_data(f, t);
        memcpy(out + (a - lo), src + (a - r->lo), (b - a) * sizeof(float));
    }
    return PT_OK;
}

int64_t pt_ckpt_step(const pt_ckpt *c) { return c->step; }
int64_t pt_ckpt_optimizer_step(const pt_ckpt *c) { return c->optimizer_step; }

void pt_ckpt_close(pt_ckpt *c) {
    if (!c) return;
    for (int s = 0; s < c->n_shards; s++)
        if (c->shards[s].f) pt_st_close(c->shards[s].f);
    free(c->shards);
    free(c->ranges);
    free(c);
}

pt_status pt_ckpt_load_weights_host(const char *dir, const pt_model *m, float *host) {
    char path[PT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/index.json", dir);
    if (access(path, F_OK) == 0) {
        pt_ckpt *c;
        PT_TRY(pt_ckpt_open(&c, dir, &m->table));
        pt_status st = pt_ckpt_read(c, PT_CKPT_PARAMS, 0, m->table.total, host);
        pt_ckpt_close(c);
        return st;
    }
    pt_st_dir *d;
    PT_TRY(pt_st_dir_open(&d, dir));
    pt_status st = PT_OK;
    for (int i = 0; i < m->table.n && st == PT_OK; i++) {
        const pt_param *p = &m->table.p[i];
        st = pt_st_dir_read_f32(d, p->name, p->shape, p->ndim, host + p->offset);
    }
    /* a tied model must not silently drop a separate head */
    if (st == PT_OK && m->cfg.tied_embeddings && pt_st_dir_find(d, "lm_head.weight", NULL))
        pt_log_warn("%s: lm_head.weight present but the config ties embeddings; it is ignored", dir);
    pt_st_dir_close(d);
    return st;
}

pt_status pt_ckpt_load_weights(const char *dir, pt_model *m) {
    float *host = pt_malloc(m->table.total * sizeof(float));
    pt_status st = pt_ckpt_load_weights_host(dir, m, host);
    if (st == PT_OK) m->be->upload(m->be, m->params, host, m->table.total * sizeof(float));
    free(host);
    return st;
}
