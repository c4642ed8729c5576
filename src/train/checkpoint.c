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

#include "pt/hf_config.h"
#include "pt/safetensors.h"

#define PT_STATE_FORMAT "pentatron-state-1"

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

pt_status pt_ckpt_export_hf(const char *dir, const pt_model *m) {
    char path[PT_PATH_MAX + 64];
    PT_TRY(pt_mkdirs(dir));
    snprintf(path, sizeof path, "%s/config.json", dir);
    PT_TRY(pt_hf_config_write(path, &m->cfg));
    float *host = pt_host_copy(m->be, m->params, m->table.total);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    pt_status st = pt_write_weights(path, m, host);
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

pt_status pt_ckpt_save(const char *root, int64_t step, const pt_model *m, const float *hm,
                       const float *hv, int64_t optimizer_step, const pt_config *cfg, int keep) {
    size_t n = m->table.total;
    char final_dir[PT_PATH_MAX + 32], tmp_dir[PT_PATH_MAX + 40], old_dir[PT_PATH_MAX + 40];
    char path[PT_PATH_MAX + 96], buf[64];
    snprintf(final_dir, sizeof final_dir, "%s/step_%08lld", root, (long long)step);
    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp", final_dir);
    snprintf(old_dir, sizeof old_dir, "%s.old", final_dir);
    PT_TRY(pt_mkdirs(root));
    PT_TRY(pt_rmtree(tmp_dir));
    PT_TRY(pt_mkdirs(tmp_dir));

    /* weights and config: the Hugging Face export */
    PT_TRY(pt_ckpt_export_hf(tmp_dir, m));
    uint32_t model_crc;
    snprintf(path, sizeof path, "%s/model.safetensors", tmp_dir);
    PT_TRY(pt_file_crc32(path, &model_crc));

    /* optimizer moments, per tensor, and the metadata to resume */
    pt_st_writer *w = pt_st_writer_create();
    pt_status st = PT_OK;
    char name[160];
    uLong state_crc = crc32(0L, Z_NULL, 0);
    for (int i = 0; i < m->table.n && st == PT_OK; i++) {
        const pt_param *p = &m->table.p[i];
        snprintf(name, sizeof name, "optimizer.m.%s", p->name);
        st = pt_st_writer_add_f32(w, name, p->shape, p->ndim, hm + p->offset, PT_ST_DTYPE_F32);
        snprintf(name, sizeof name, "optimizer.v.%s", p->name);
        if (st == PT_OK)
            st = pt_st_writer_add_f32(w, name, p->shape, p->ndim, hv + p->offset, PT_ST_DTYPE_F32);
    }
    state_crc = crc32_z(state_crc, (const Bytef *)hm, n * sizeof(float));
    state_crc = crc32_z(state_crc, (const Bytef *)hv, n * sizeof(float));
#define PT_META(key, fmt, val)                                                                     \
    if (st == PT_OK) {                                                                             \
        snprintf(buf, sizeof buf, fmt, val);                                                       \
        st = pt_st_writer_set_meta(w, key, buf);                                                   \
    }
    PT_META("format", "%s", PT_STATE_FORMAT);
    PT_META("step", "%lld", (long long)step);
    PT_META("optimizer_step", "%lld", (long long)optimizer_step);
    PT_META("seed", "%llu", (unsigned long long)cfg->training.seed);
    PT_META("global_batch", "%d", cfg->training.global_batch);
    PT_META("seq_len", "%d", cfg->training.seq_len);
    PT_META("shuffle", "%d", cfg->data.shuffle);
    PT_META("model_crc32", "%08x", model_crc);
    PT_META("state_crc32", "%08x", (unsigned)state_crc);
#undef PT_META
    if (st == PT_OK) {
        snprintf(path, sizeof path, "%s/state.safetensors", tmp_dir);
        st = pt_st_writer_write(w, path);
    }
    pt_st_writer_free(w);
    PT_TRY(st);

    /* the effective configuration, for people */
    snprintf(path, sizeof path, "%s/train.ini", tmp_dir);
    char *ini = NULL;
    size_t ini_len = 0;
    FILE *mf = open_memstream(&ini, &ini_len);
    pt_config_write(cfg, mf);
    fclose(mf);
    st = pt_write_file_atomic(path, ini, ini_len);
    free(ini);
    PT_TRY(st);
    PT_TRY(pt_fsync_dir(tmp_dir));

    /* publish: an existing checkpoint of the same step is replaced only once the new one is whole */
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

pt_status pt_ckpt_load_weights(const char *dir, pt_model *m) {
    pt_st_dir *d;
    PT_TRY(pt_st_dir_open(&d, dir));
    float *host = pt_malloc(m->table.total * sizeof(float));
    pt_status st = PT_OK;
    for (int i = 0; i < m->table.n && st == PT_OK; i++) {
        const pt_param *p = &m->table.p[i];
        st = pt_st_dir_read_f32(d, p->name, p->shape, p->ndim, host + p->offset);
    }
    /* a tied model must not silently drop a separate head */
    if (st == PT_OK && m->cfg.tied_embeddings && pt_st_dir_find(d, "lm_head.weight", NULL))
        pt_log_warn("%s: lm_head.weight present but the config ties embeddings; it is ignored", dir);
    if (st == PT_OK) m->be->upload(m->be, m->params, host, m->table.total * sizeof(float));
    free(host);
    pt_st_dir_close(d);
    return st;
}

pt_status pt_ckpt_load_state(const char *dir, pt_model *m, float *hm, float *hv,
                             int64_t *optimizer_step, int64_t *step) {
    size_t n = m->table.total;
    char path[PT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    uint32_t model_crc;
    PT_TRY(pt_file_crc32(path, &model_crc));
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    pt_st_file *f;
    PT_TRY(pt_st_open(&f, path));
    const char *fmt = pt_st_meta_get(f, "format");
    const char *s_step = pt_st_meta_get(f, "step"), *s_ostep = pt_st_meta_get(f, "optimizer_step");
    const char *s_mcrc = pt_st_meta_get(f, "model_crc32"), *s_scrc = pt_st_meta_get(f, "state_crc32");
    pt_status st = PT_OK;
    if (!fmt || strcmp(fmt, PT_STATE_FORMAT) != 0)
        st = pt_errorf(PT_ERR_FORMAT, "%s: metadata \"format\" is not %s", path, PT_STATE_FORMAT);
    else if (!s_step || !s_ostep || !s_mcrc || !s_scrc)
        st = pt_errorf(PT_ERR_FORMAT, "%s: metadata lacks step, optimizer_step or checksums", path);
    else if (strtoul(s_mcrc, NULL, 16) != model_crc)
        st = pt_errorf(PT_ERR_FORMAT,
                       "%s/model.safetensors: checksum %08x does not match %s recorded in %s "
                       "(the checkpoint is corrupt)",
                       dir, model_crc, s_mcrc, path);
    char name[160];
    for (int i = 0; i < m->table.n && st == PT_OK; i++) {
        const pt_param *p = &m->table.p[i];
        snprintf(name, sizeof name, "optimizer.m.%s", p->name);
        st = pt_st_read_f32(f, name, p->shape, p->ndim, hm + p->offset);
        snprintf(name, sizeof name, "optimizer.v.%s", p->name);
        if (st == PT_OK) st = pt_st_read_f32(f, name, p->shape, p->ndim, hv + p->offset);
    }
    if (st == PT_OK) {
        uLong c = crc32(0L, Z_NULL, 0);
        c = crc32_z(c, (const Bytef *)hm, n * sizeof(float));
        c = crc32_z(c, (const Bytef *)hv, n * sizeof(float));
        if ((uint32_t)c != strtoul(s_scrc, NULL, 16))
            st = pt_errorf(PT_ERR_FORMAT, "%s: optimizer state checksum mismatch (corrupt)", path);
    }
    if (st == PT_OK) st = pt_ckpt_load_weights(dir, m);
    if (st == PT_OK) {
        *step = strtoll(s_step, NULL, 10);
        *optimizer_step = strtoll(s_ostep, NULL, 10);
    }
    pt_st_close(f);
    return st;
}
