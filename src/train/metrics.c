/* metrics.c: a step's log line and JSON line, MFU and the measured GEMM peak (see
 * include/pt/metrics.h). */
#include "pt/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

/* A square n³ product large enough to reach the library's steady state (gemm in fp32, or gemm_bf16
 * on the same values rounded to bf16), one untimed first (gemm_bf16's first call builds the
 * shape's kernel), then either (seconds = 0) the best of 11 single products in wall-clock time,
 * or (seconds > 0) the best of 3 windows, each of products until at least that long has passed
 * and at least 2 are done, timed in the processor time of the process (all its threads) and
 * multiplied by its threads: the rate of its threads each on a core of its own, which other
 * processes taking turns on the cores do not lower (a second of processor time is a second
 * of a core, whoever else runs). */
/* Processor time of this process (all its threads), in seconds. */
static double pt_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double pt_measure_gemm_rate(pt_backend *be, int bf16, double seconds) {
    const int n = 1024;
    const size_t nn = (size_t)n * n;
    float *a = be->alloc(be, nn * sizeof(float));
    float *b = be->alloc(be, nn * sizeof(float));
    float *c = be->alloc(be, nn * sizeof(float));
    pt_bf16 *a16 = be->alloc(be, nn * sizeof(pt_bf16)), *b16 = be->alloc(be, nn * sizeof(pt_bf16));
    float *h = pt_malloc(nn * sizeof(float));
    for (size_t i = 0; i < nn; i++) h[i] = (float)(i % 17) * 0.01f;
    be->upload(be, a, h, nn * sizeof(float));
    be->upload(be, b, h, nn * sizeof(float));
    free(h);
    be->to_bf16(be, a16, a, nn);
    be->to_bf16(be, b16, b, nn);
    const double flops = 2.0 * n * n * (double)n;
    double best = 0;
    for (int w = -1; w < (seconds > 0 ? 3 : 11); w++) { /* w = -1: the untimed first */
        double t0 = pt_now(), c0 = pt_cpu_seconds(), dt;
        int done = 0;
        do {
            if (bf16)
                be->gemm_bf16(be, PT_NO_TRANS, PT_TRANS, n, n, n, a16, n, b16, n, 0.0f, c, n);
            else
                be->gemm(be, PT_NO_TRANS, PT_TRANS, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
            be->synchronize(be);
            done++;
            dt = pt_now() - t0;
        } while (w >= 0 && seconds > 0 && (done < 2 || dt < seconds));
        double rate = seconds > 0 ? flops * done * be->n_threads / (pt_cpu_seconds() - c0)
                                  : flops * done / dt;
        if (w >= 0 && rate > best) best = rate;
    }
    be->free(be, a);
    be->free(be, b);
    be->free(be, c);
    be->free(be, a16);
    be->free(be, b16);
    return best;
}

double pt_measure_gemm_peak(pt_backend *be) { return pt_measure_gemm_rate(be, 0, 0); }
double pt_measure_gemm_bf16_peak(pt_backend *be) { return pt_measure_gemm_rate(be, 1, 0); }

double pt_mfu(double flops_per_token, double tokens_per_s, int ranks, double peak_flops) {
    return flops_per_token * tokens_per_s / ranks / peak_flops;
}

static void pt_fmt_duration(double sec, char *out, size_t cap) {
    long s = (long)(sec + 0.5);
    if (s >= 3600)
        snprintf(out, cap, "%ldh%02ldm", s / 3600, (s / 60) % 60);
    else
        snprintf(out, cap, "%ldm%02lds", s / 60, s % 60);
}

void pt_progress_bar(int64_t step, int64_t total, double elapsed, int64_t first_step, char *out,
                     size_t cap) {
    int64_t done = step - first_step;
    double eta = done > 0 ? elapsed / (double)done * (double)(total - step) : 0;
    char eta_s[32], bar[24];
    pt_fmt_duration(eta, eta_s, sizeof eta_s);
    int width = 20, filled = total > 0 ? (int)(width * step / total) : width;
    for (int i = 0; i < width; i++) bar[i] = i < filled ? '#' : '.';
    bar[width] = 0;
    snprintf(out, cap, "[%s] ETA %s", bar, eta_s);
}

void pt_step_print(const pt_step_stats *s, int64_t total, const char *progress) {
    char mix[512] = ""; /* data.sources: " | data web 70.0% code 30.0%" */
    size_t used = 0;
    for (int i = 0; i < s->n_sources && used < sizeof mix; i++)
        used += (size_t)snprintf(mix + used, sizeof mix - used, "%s %s %.1f%%",
                                 i ? "" : " | data", s->source_names[i], 100.0 * s->source_share[i]);
    pt_log_info("step %*lld/%lld | loss %.4f | gnorm %.3f | lr %.2e | %.0f tok/s | MFU %.1f%% | "
                "mem %.0f MiB%s | %s",
                (int)snprintf(NULL, 0, "%lld", (long long)total), (long long)s->step,
                (long long)total, s->loss, s->grad_norm, (double)s->lr, s->tokens_per_s,
                100.0 * s->mfu, (double)s->peak_rss_bytes / 1048576.0, mix, progress);
}

/* A "key value kB" line of a /proc file, in bytes (-1: none). */
static int64_t pt_proc_kb(const char *path, const char *key) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    int64_t v = -1;
    size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && line[n] == ':') {
            v = atoll(line + n + 1) * 1024;
            break;
        }
    fclose(f);
    return v;
}

/* One number in a file (-1: none or "max"). */
static int64_t pt_file_int(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = {0};
    int64_t v = fgets(buf, sizeof buf, f) && buf[0] >= '0' && buf[0] <= '9' ? atoll(buf) : -1;
    fclose(f);
    return v;
}

int64_t pt_memory_available(void) {
    int64_t avail = pt_proc_kb("/proc/meminfo", "MemAvailable");
    int64_t max = pt_file_int("/sys/fs/cgroup/memory.max");
    int64_t cur = pt_file_int("/sys/fs/cgroup/memory.current");
    if (max > 0 && cur >= 0 && (avail < 0 || max - cur < avail)) avail = max - cur;
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    int ranks = local && atoi(local) > 0 ? atoi(local) : 1;
    return avail < 0 ? INT64_MAX : avail / ranks;
}

const char *pt_fmt_bytes(double bytes, char *out, size_t cap) {
    static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (u < 4 && fabs(bytes) >= 1024) bytes /= 1024, u++;
    snprintf(out, cap, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
    return out;
}

int64_t pt_memory_limit(int64_t configured, char *what, size_t cap) {
    int64_t limit = configured > 0 ? configured : pt_memory_available();
    snprintf(what, cap, "%s", configured > 0 ? "training.memory_limit" : "the memory available to it");
    /* RLIMIT_AS (ulimit -v) bounds what may be mapped at all: what is left of it, when lower */
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return limit;
    int64_t as = rl.rlim_cur > INT64_MAX ? INT64_MAX : (int64_t)rl.rlim_cur;
    int64_t mapped = pt_proc_kb("/proc/self/status", "VmSize");
    int64_t left = as - (mapped > 0 ? mapped : 0);
    if (left >= limit) return limit;
    char b[32];
    snprintf(what, cap, "the address space left under its limit (ulimit -v: %s)",
             pt_fmt_bytes((double)as, b, sizeof b));
    return left > 0 ? left : 0;
}

pt_status pt_memory_check(const pt_rank_memory *mem, double other, int64_t limit, const char *what) {
    double need = (double)(mem->params + mem->grads + mem->optim + mem->params_transient +
                           mem->grads_transient + mem->activations) + other;
    if (need <= (double)limit) return PT_OK;
    char b[9][32];
    return pt_errorf(PT_ERR_CONFIG,
                     "this rank needs %s but %s is %s: parameters %s, gradients %s, optimizer %s, "
                     "gathered parameters %s, gradient buffers %s, activations %s, the batch and "
                     "other buffers %s (training.recompute = selective or full keeps fewer "
                     "activations)", pt_fmt_bytes(need, b[0], 32), what,
                     pt_fmt_bytes((double)limit, b[1], 32), pt_fmt_bytes((double)mem->params, b[2], 32),
                     pt_fmt_bytes((double)mem->grads, b[3], 32), pt_fmt_bytes((double)mem->optim, b[4], 32),
                     pt_fmt_bytes((double)mem->params_transient, b[5], 32),
                     pt_fmt_bytes((double)mem->grads_transient, b[6], 32),
                     pt_fmt_bytes((double)mem->activations, b[7], 32), pt_fmt_bytes(other, b[8], 32));
}

double pt_param_estimate(const pt_model_config *c) {
    double D = c->dim, L = c->n_layers, hd = c->head_dim > 0 ? c->head_dim : c->dim / c->n_heads;
    double embed = (double)c->vocab_size * D * (c->tied_embeddings ? 1 : 2) + D;
    double attn = hd * D * (2.0 * c->n_heads + 2.0 * c->n_kv_heads) + 2 * D;
    double dense = 3 * D * c->ffn_dim, moe_layers = 0, moe = 0;
    if (c->n_experts > 0 && c->n_layers > c->moe_first_dense && c->moe_every > 0) {
        moe_layers = (double)((c->n_layers - c->moe_first_dense - 1) / c->moe_every + 1);
        double F = c->moe_ffn_dim > 0 ? c->moe_ffn_dim : c->ffn_dim;
        moe = 3 * D * F * ((double)c->n_experts + c->n_shared_experts) + D * c->n_experts;
    }
    return embed + L * attn + (L - moe_layers) * dense + moe_layers * moe;
}

double pt_mem_buffers_bytes(const pt_mem_buffer *buf, int n_buf) {
    /* the buffers held throughout add up; of those held for a moment, the largest counts */
    double kept = 0, moment = 0;
    for (int i = 0; i < n_buf; i++) {
        if (buf[i].transient) moment = buf[i].bytes > moment ? buf[i].bytes : moment;
        else kept += buf[i].bytes;
    }
    return kept + moment;
}

pt_status pt_memory_precheck(const pt_model_config *c, double bytes_per_param, double tokens,
                             int ranks, int64_t limit, const char *what) {
    return pt_memory_precheck_ex(c, bytes_per_param, tokens, ranks, NULL, 0, limit, what);
}

pt_status pt_memory_precheck_ex(const pt_model_config *c, double bytes_per_param, double tokens,
                                int ranks, const pt_mem_buffer *buf, int n_buf, int64_t limit,
                                const char *what) {
    double n = pt_param_estimate(c), r = ranks > 0 ? ranks : 1;
    double state = n * bytes_per_param / r;
    double acts = tokens * ((double)c->vocab_size + (double)c->n_layers * c->dim) * 4 / r;
    if (state + acts >= 0x1p62)
        return pt_errorf(PT_ERR_CONFIG, "the model's sizes overflow: %.3g parameters, %.3g bytes "
                         "per rank (model.dim %d, n_layers %d, ffn_dim %d, vocab_size %d, "
                         "n_experts %d)", n, state + acts, c->dim, c->n_layers, c->ffn_dim,
                         c->vocab_size, c->n_experts);
    int top = -1;
    for (int i = 0; i < n_buf; i++)
        if (top < 0 || buf[i].bytes > buf[top].bytes) top = i;
    double need = state + acts + pt_mem_buffers_bytes(buf, n_buf);
    if (need <= (double)limit) return PT_OK;
    char b[5][32];
    if (top >= 0 && 2 * buf[top].bytes >= need) /* most of it one key's: that key named */
        return pt_errorf(PT_ERR_CONFIG, "%s needs %s for %s, but %s is %s (this rank needs at "
                         "least %s in all; checked before allocating)", buf[top].key,
                         pt_fmt_bytes(buf[top].bytes, b[0], 32), buf[top].what, what,
                         pt_fmt_bytes((double)limit, b[1], 32), pt_fmt_bytes(need, b[2], 32));
    char list[1024] = "";
    size_t used = 0;
    for (int i = 0; i < n_buf && used < sizeof list; i++)
        if (buf[i].bytes > 0)
            used += (size_t)snprintf(list + used, sizeof list - used, "; %s: %s for %s", buf[i].key,
                                     pt_fmt_bytes(buf[i].bytes, b[0], 32), buf[i].what);
    return pt_errorf(PT_ERR_CONFIG, "this rank needs at least %s but %s is %s (checked before "
                     "allocating): %.4g parameters × %.0f bytes over %d rank(s) = %s, activations "
                     "(logits and layer inputs of %.0f tokens) %s%s", pt_fmt_bytes(need, b[1], 32),
                     what, pt_fmt_bytes((double)limit, b[2], 32), n, bytes_per_param, ranks,
                     pt_fmt_bytes(state, b[3], 32), tokens, pt_fmt_bytes(acts, b[4], 32), list);
}

/* Bytes of every group so far (bus-bandwidth convention), and microseconds blocked waiting on it,
 * in pt_mesh_groups order (out[i], out[PT_MESH_MAX_GROUPS + i]). */
static void pt_group_bytes(const pt_mesh *mesh, uint64_t *out) {
    const pt_comm *g[PT_MESH_MAX_GROUPS];
    int n = pt_mesh_groups(mesh, g);
    for (int i = 0; i < n; i++) {
        out[i] = 0;
        for (int op = 0; op < PT_COMM_OP_COUNT; op++) out[i] += g[i]->stats.bytes[op];
        out[PT_MESH_MAX_GROUPS + i] = (uint64_t)(g[i]->stats.wait_seconds * 1e6);
    }
}

pt_status pt_metrics_open(pt_metrics *mx, const char *path, const pt_mesh *mesh,
                          int64_t total_steps, int64_t comm_every) {
    memset(mx, 0, sizeof *mx);
    mx->mesh = mesh;
    mx->total_steps = total_steps;
    mx->comm_every = comm_every;
    pt_metrics_begin(mx);
    if (!path[0]) return PT_OK;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) { /* its directory, made if missing */
        *slash = 0;
        if (pt_mkdirs(dir) != PT_OK)
            return pt_errorf(PT_ERR_IO, "logging.metrics: cannot create the directory %s", dir);
    }
    snprintf(mx->path, sizeof mx->path, "%s", path);
    if (pt_refuse_link(path) != PT_OK) { /* appended by design: never through a link */
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_last_error());
        return pt_errorf(PT_ERR_IO, "logging.metrics: %s", why);
    }
    int fd; /* a FIFO or a device (/dev/null, /dev/full) refused: one would hang the open */
    PT_TRY(pt_open_append(path, "logging.metrics", &fd));
    mx->f = fdopen(fd, "a");
    if (!mx->f) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "logging.metrics: cannot open %s for appending", path);
    }
    return PT_OK;
}

void pt_metrics_begin(pt_metrics *mx) {
    if (!mx->mesh) return;
    pt_mesh_stats(mx->mesh, &mx->since);
    pt_group_bytes(mx->mesh, mx->group_since);
}

void pt_metrics_close(pt_metrics *mx) {
    if (mx->f) fclose(mx->f);
    mx->f = NULL;
}

void pt_metrics_window(pt_metrics *mx, int64_t step, pt_comm_window *w) {
    memset(w, 0, sizeof *w);
    int64_t every = mx->comm_every;
    if (!mx->mesh || (step % every != 0 && step != mx->total_steps)) return;
    pt_comm_stats now, *since = &mx->since;
    pt_mesh_stats(mx->mesh, &now);
    for (int op = 0; op < PT_COMM_OP_COUNT; op++) {
        w->op_calls[op] = now.calls[op] - since->calls[op];
        w->op_bytes[op] = now.bytes[op] - since->bytes[op];
        w->op_wait_s[op] = now.wait_op[op] - since->wait_op[op];
        w->bytes += w->op_bytes[op];
    }
    w->wait_s = now.wait_seconds - since->wait_seconds;
    w->steps = step % every == 0 ? every : step % every;
    const pt_comm *g[PT_MESH_MAX_GROUPS];
    uint64_t gnow[2 * PT_MESH_MAX_GROUPS], *group_since = mx->group_since;
    w->n_groups = pt_mesh_groups(mx->mesh, g);
    pt_group_bytes(mx->mesh, gnow);
    for (int i = 0; i < w->n_groups; i++) {
        w->group[i] = g[i]->name;
        w->group_size[i] = g[i]->size;
        w->group_bytes[i] = gnow[i] - group_since[i];
        /* whole microseconds, as pt_group_bytes counts them */
        w->group_wait_s[i] =
            (double)(gnow[PT_MESH_MAX_GROUPS + i] - group_since[PT_MESH_MAX_GROUPS + i]) / 1e6;
    }
    memcpy(group_since, gnow, sizeof gnow);
    *since = now;
}

void pt_expert_load_summary(const double *load, int n, double out[4]) {
    double mn = load[0], mx = load[0], sum = 0;
    for (int e = 0; e < n; e++) {
        mn = load[e] < mn ? load[e] : mn, mx = load[e] > mx ? load[e] : mx;
        sum += load[e];
    }
    double mean = sum / n;
    out[0] = mn, out[1] = mx, out[2] = mean, out[3] = mean > 0 ? mx / mean : 0.0;
}

/* x as JSON, which has no NaN or infinity: %.*g, or null when x is not finite (a skipped step's
 * loss or gradient norm). */
static const char *pt_json_num(char *buf, size_t cap, double x, int digits) {
    if (!isfinite(x)) return "null";
    snprintf(buf, cap, "%.*g", digits, x);
    return buf;
}

pt_status pt_metrics_write(pt_metrics *mx, const pt_step_stats *s, const pt_comm_window *w,
                           const pt_model_config *mc, const pt_rank_memory *mem) {
    FILE *f = mx->f;
    if (!f) return PT_OK;
    char lb[40], gb[40];
    fprintf(f,
            "{\"step\": %lld, \"loss\": %s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens\": %lld, "
            "\"seconds\": %.6f, \"tokens_per_s\": %.3f, \"mfu\": %.5f, \"peak_rss_bytes\": %lld, "
            "\"allocs\": %lld",
            (long long)s->step, pt_json_num(lb, sizeof lb, s->loss, 17), (double)s->lr,
            pt_json_num(gb, sizeof gb, s->grad_norm, 9), (long long)s->tokens,
            s->seconds, s->tokens_per_s, s->mfu, (long long)s->peak_rss_bytes,
            (long long)s->allocs);
    if (s->n_sources) {
        fprintf(f, ", \"data_share\": {");
        for (int i = 0; i < s->n_sources; i++)
            fprintf(f, "%s\"%s\": %.9g", i ? ", " : "", s->source_names[i], s->source_share[i]);
        fprintf(f, "}");
    }
    if (s->mfu_datasheet > 0) fprintf(f, ", \"mfu_datasheet\": %.5f", s->mfu_datasheet);
    if (s->device_peak_bytes > 0)
        fprintf(f, ", \"device_peak_bytes\": %lld", (long long)s->device_peak_bytes);
    if (s->skipped) fprintf(f, ", \"skipped\": 1");
    if (s->evaluated) fprintf(f, ", \"val_loss\": %.17g, \"val_tokens\": %lld", s->val_loss,
                              (long long)s->val_tokens);
    if (mc->n_experts > 0 && s->expert_load) {
        /* per MoE layer: token-slots per expert min, max, mean, max/mean */
        fprintf(f, ", \"aux_loss\": %.9g, \"z_loss\": %.9g, \"expert_load\": {", s->aux_loss,
                s->z_loss);
        int first = 1;
        for (int l = 0; l < mc->n_layers; l++) {
            if (!pt_layer_is_moe(mc, l)) continue;
            double ls[4];
            pt_expert_load_summary(s->expert_load + (size_t)l * mc->n_experts, mc->n_experts, ls);
            fprintf(f, "%s\"%d\": [%.0f, %.0f, %.2f, %.4f]", first ? "" : ", ", l, ls[0], ls[1],
                    ls[2], ls[3]);
            first = 0;
        }
        fprintf(f, "}");
        if (s->ep)
            fprintf(f, ", \"ep_rows\": [%lld, %lld]", (long long)s->ep_rows[0],
                    (long long)s->ep_rows[1]);
    }
    if (s->n_stages) {
        fprintf(f, ", \"pp_idle\": [");
        for (int i = 0; i < s->n_stages; i++) fprintf(f, "%s%.4f", i ? ", " : "", s->idle[i]);
        fprintf(f, "], \"pp_busy\": [");
        for (int i = 0; i < s->n_stages; i++) fprintf(f, "%s%.4f", i ? ", " : "", s->busy[i]);
        fprintf(f, "]");
        if (s->head_split) {
            fprintf(f, ", \"pp_head\": [");
            for (int i = 0; i < s->n_stages; i++) fprintf(f, "%s%.4f", i ? ", " : "", s->head_busy[i]);
            fprintf(f, "]");
        }
    }
    if (s->n_cp) {
        fprintf(f, ", \"cp_attn_pairs\": [");
        for (int i = 0; i < s->n_cp; i++) fprintf(f, "%s%.0f", i ? ", " : "", s->attn_pairs[i]);
        fprintf(f, "]");
    }
    if (w && w->steps) {
        char ops[512] = "", groups[512] = "", waits[512] = "";
        size_t used = 0, gu = 0, wu = 0;
        for (int op = 0; op < PT_COMM_OP_COUNT && used < sizeof ops; op++)
            if (w->op_calls[op])
                used += (size_t)snprintf(ops + used, sizeof ops - used, "%s\"%s\": [%llu, %llu, %.6f]",
                                         used ? ", " : "", pt_comm_op_name((pt_comm_op)op),
                                         (unsigned long long)w->op_calls[op],
                                         (unsigned long long)w->op_bytes[op], w->op_wait_s[op]);
        /* per group: {"tp": bytes, ...} */
        for (int i = 0; i < w->n_groups && gu < sizeof groups && wu < sizeof waits; i++) {
            if (w->group_bytes[i])
                gu += (size_t)snprintf(groups + gu, sizeof groups - gu, "%s\"%s\": %llu", gu ? ", " : "",
                                       w->group[i], (unsigned long long)w->group_bytes[i]);
            if (w->group_wait_s[i] > 0)
                wu += (size_t)snprintf(waits + wu, sizeof waits - wu, "%s\"%s\": %.6f", wu ? ", " : "",
                                       w->group[i], w->group_wait_s[i]);
        }
        fprintf(f,
                ", \"comm_steps\": %lld, \"comm_bytes\": %llu, \"comm_wait_s\": %.6f, \"comm\": {%s}, "
                "\"comm_groups\": {%s}, \"comm_wait_groups\": {%s}, "
                "\"mem\": {\"params\": %zu, \"grads\": %zu, \"optim\": %zu, \"params_transient\": %zu, "
                "\"grads_transient\": %zu, \"activations\": %zu}",
                (long long)w->steps, (unsigned long long)w->bytes, w->wait_s, ops, groups, waits,
                mem->params, mem->grads, mem->optim, mem->params_transient, mem->grads_transient,
                mem->activations);
    }
    fprintf(f, "}\n");
    errno = 0;
    if (fflush(f) != 0 || ferror(f)) /* any of the line's writes, or the flush, failed */
        return pt_errorf(PT_ERR_IO, "logging.metrics: writing %s failed at step %lld: %s",
                         mx->path, (long long)s->step, errno ? strerror(errno) : "write error");
    return PT_OK;
}
