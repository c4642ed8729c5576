/* report.c: the run report rank 0 prints at the end of a run (and every logging.report_every
 * steps): per parallel dimension, the bytes each rank sent and the time it was blocked; per rank,
 * its memory split into parameters, gradients, optimizer state and activations. The same figures,
 * with the layout and the pipeline schedule, go to report.json beside the metrics for
 * `pentatron report` (src/cli/report_cmd.c). */
#include "pt/metrics.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* What one parallel dimension's group carries, for the table. */
static const char *pt_report_group_role(const char *name) {
    static const struct { const char *name, *role; } roles[] = {
        {"world", "checkpoints, this report, the signal check"},
        {"dp", "data: gradients, ZeRO gathers"},
        {"tp", "tensor: activations"},
        {"pp", "pipeline: stage boundaries"},
        {"cp", "context: ring K/V"},
        {"dpcp", "data × context: gradients"},
        {"ep", "experts: dispatch/combine"},
        {"edp", "expert data: gradients"},
        {"emb", "tied embedding: gradients"},
        {"kv", "shared kv heads: gradients"},
        {"head", "head split over pp: loss statistics"},
        {"dps", "HSDP shard: ZeRO collectives"},
        {"dpr", "HSDP replicas: all-reduce"},
        {"eds", "HSDP expert shard: ZeRO"},
        {"edr", "HSDP expert replicas"},
    };
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (!strcmp(name, roles[i].name)) return roles[i].role;
    return "";
}

pt_report_mark pt_report_mark_now(const pt_mesh *mesh, int64_t step) {
    pt_report_mark m = {.step = step, .time = pt_now()};
    if (!mesh) return m;
    const pt_comm *g[PT_MESH_MAX_GROUPS];
    m.n_groups = pt_mesh_groups(mesh, g);
    for (int i = 0; i < m.n_groups; i++) {
        for (int op = 0; op < PT_COMM_OP_COUNT; op++) m.bytes[i] += (double)g[i]->stats.bytes[op];
        m.wait[i] = g[i]->stats.wait_seconds;
    }
    return m;
}

/* Per rank, one row of the gathered table: bytes and seconds blocked per group, then memory. */
enum { PT_MEM_FIELDS = 6, PT_ROW = 2 * PT_MESH_MAX_GROUPS + PT_MEM_FIELDS };

/* Every rank's figures since a mark, on rank 0 (collective over the world). */
typedef struct {
    int64_t first, last; /* the steps covered */
    double wall;         /* their seconds */
    int R, ng;
    const pt_comm *g[PT_MESH_MAX_GROUPS];
    pt_degrees deg;
    double *all; /* (R, PT_ROW) */
} pt_report_table;

/* 1 on rank 0 with t filled (pt_report_table_free after), 0 elsewhere or when no step passed. */
static int pt_report_gather(const pt_mesh *mesh, const pt_report_mark *since, int64_t step,
                            const pt_rank_memory *rm, pt_report_table *t) {
    pt_report_mark now = pt_report_mark_now(mesh, step);
    int64_t steps = now.step - since->step;
    if (steps <= 0) return 0;
    memset(t, 0, sizeof *t);
    t->first = since->step + 1, t->last = now.step, t->wall = now.time - since->time;
    t->ng = now.n_groups, t->R = mesh ? mesh->world_size : 1;
    t->deg = mesh ? mesh->deg : (pt_degrees){1, 1, 1, 1, 1, 0};
    if (mesh) pt_mesh_groups(mesh, t->g);
    double mine[PT_ROW] = {0};
    for (int i = 0; i < t->ng; i++) {
        mine[i] = (now.bytes[i] - since->bytes[i]) / (double)steps;
        mine[PT_MESH_MAX_GROUPS + i] = (now.wait[i] - since->wait[i]) / (double)steps;
    }
    double *mem = mine + 2 * PT_MESH_MAX_GROUPS;
    mem[0] = (double)rm->params;
    mem[1] = (double)rm->grads;
    mem[2] = (double)rm->optim;
    mem[3] = (double)rm->activations;
    mem[4] = (double)(rm->params_transient + rm->grads_transient);
    mem[5] = (double)pt_peak_rss_bytes();
    t->all = pt_malloc((size_t)t->R * PT_ROW * sizeof(double));
    if (mesh)
        pt_allgather(mesh->world, mine, t->all, (size_t)PT_ROW, PT_DTYPE_F64);
    else
        memcpy(t->all, mine, sizeof mine);
    if (mesh && mesh->world_rank != 0) {
        free(t->all);
        return 0;
    }
    return 1;
}

/* Group i over the ranks: mean and largest bytes per step, mean and largest seconds blocked. */
static void pt_report_group(const pt_report_table *t, int i, double out[4]) {
    out[0] = out[1] = out[2] = out[3] = 0;
    for (int r = 0; r < t->R; r++) {
        const double *row = t->all + (size_t)r * PT_ROW;
        double b = row[i], w = row[PT_MESH_MAX_GROUPS + i];
        out[0] += b / t->R, out[2] += w / t->R;
        if (b > out[1]) out[1] = b;
        if (w > out[3]) out[3] = w;
    }
}

/* Rank r's coordinates, from the mesh's rank order (tp fastest, then cp, dp, pp). */
static void pt_report_coords(const pt_degrees *d, int r, int c[4]) {
    c[3] = r % d->tp, c[2] = (r / d->tp) % d->cp, c[0] = (r / (d->tp * d->cp)) % d->dp;
    c[1] = r / (d->tp * d->cp * d->dp);
}

/* Characters s takes on a terminal: its UTF-8 code points ("×" is one). */
static int pt_text_width(const char *s) {
    int n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* s padded with spaces to `width` characters, on the right (left = 1) or the left, into out. */
static const char *pt_pad(char *out, size_t cap, const char *s, int width, int left) {
    int pad = width - pt_text_width(s);
    if (pad < 0) pad = 0;
    if (left)
        snprintf(out, cap, "%s%*s", s, pad, "");
    else
        snprintf(out, cap, "%*s%s", pad, "", s);
    return out;
}

enum { PT_GROUP_COLS = 7, PT_MEM_COLS = 8, PT_CELL = 96 };

/* Prints the rows of a table whose columns fit their widest cell (the first two left-aligned when
 * `left` is 2, the first alone when 1; the rest right-aligned). cells: (rows, cols). */
static void pt_print_table(char (*cells)[PT_CELL], int rows, int cols, int left) {
    int w[PT_MEM_COLS] = {0};
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            if (pt_text_width(cells[r * cols + c]) > w[c]) w[c] = pt_text_width(cells[r * cols + c]);
    for (int r = 0; r < rows; r++) {
        char line[1024], cell[4 * PT_CELL];
        size_t n = 0;
        for (int c = 0; c < cols && n < sizeof line; c++)
            n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", c == 0 ? "" : c < left ? " " : "  ",
                                  pt_pad(cell, sizeof cell, cells[r * cols + c], w[c], c < left));
        pt_log_info("  %s", line);
    }
}

static void pt_report_text(const pt_report_table *t) {
    const pt_degrees *d = &t->deg;
    int64_t steps = t->last - t->first + 1;
    pt_log_info("run report, steps %lld-%lld (%.2f s/step): %d rank%s = dp %d × pp %d × cp %d × "
                "tp %d, ep %d", (long long)t->first, (long long)t->last, t->wall / steps, t->R,
                t->R > 1 ? "s" : "", d->dp, d->pp, d->cp, d->tp, d->ep);
    char (*cells)[PT_CELL] = pt_calloc((size_t)(t->ng + t->R + 2) * PT_MEM_COLS, PT_CELL);
    static const char *ghead[PT_GROUP_COLS] = {"group", "carries", "bytes/step", "max rank",
                                               "blocked s", "max rank", "% step"};
    int rows = 1, alone = 0;
    for (int c = 0; c < PT_GROUP_COLS; c++) snprintf(cells[c], PT_CELL, "%s", ghead[c]);
    for (int i = 0; i < t->ng; i++) {
        double x[4];
        pt_report_group(t, i, x);
        if (t->g[i]->size < 2 || (x[1] == 0 && x[3] == 0)) { /* one rank, or unused */
            alone++;
            continue;
        }
        char (*row)[PT_CELL] = cells + rows++ * PT_GROUP_COLS;
        snprintf(row[0], PT_CELL, "%s", t->g[i]->name);
        snprintf(row[1], PT_CELL, "%s", pt_report_group_role(t->g[i]->name));
        snprintf(row[2], PT_CELL, "%.0f", x[0]);
        snprintf(row[3], PT_CELL, "%.0f", x[1]);
        snprintf(row[4], PT_CELL, "%.4f", x[2]);
        snprintf(row[5], PT_CELL, "%.4f", x[3]);
        snprintf(row[6], PT_CELL, "%.1f%%", 100.0 * x[2] * steps / t->wall);
    }
    if (rows > 1) pt_print_table(cells, rows, PT_GROUP_COLS, 2);
    static const char *mhead[PT_MEM_COLS] = {"memory per rank (MiB)", "params", "grads", "optimizer",
                                             "activations", "transient", "total", "peak RSS"};
    for (int c = 0; c < PT_MEM_COLS; c++) snprintf(cells[c], PT_CELL, "%s", mhead[c]);
    for (int r = 0; r < t->R; r++) {
        const double *x = t->all + (size_t)r * PT_ROW + 2 * PT_MESH_MAX_GROUPS;
        char (*row)[PT_CELL] = cells + (r + 1) * PT_MEM_COLS;
        int c[4];
        pt_report_coords(d, r, c);
        if (t->R > 1)
            snprintf(row[0], PT_CELL, "rank %d (dp%d pp%d cp%d tp%d)", r, c[0], c[1], c[2], c[3]);
        else
            snprintf(row[0], PT_CELL, "rank 0");
        double M = 1048576.0, total = x[0] + x[1] + x[2] + x[3] + x[4];
        for (int k = 0; k < 5; k++) snprintf(row[1 + k], PT_CELL, "%.2f", x[k] / M);
        snprintf(row[6], PT_CELL, "%.2f", total / M);
        snprintf(row[7], PT_CELL, "%.1f", x[5] / M);
    }
    pt_print_table(cells, t->R + 1, PT_MEM_COLS, 1);
    free(cells);
    if (rows > 1) {
        pt_log_info("  bytes/step: sent by a rank on the group per step, mean over the ranks (max "
                    "rank: the largest);");
        pt_log_info("  blocked s: seconds per step a rank waited on it (mean, max rank); %% step: the "
                    "mean's share;");
    }
    pt_log_info("  memory: as allocated; transient: pooled ZeRO buffers' peaks; total: the five; "
                "peak RSS: the process's.");
    if (alone && t->R > 1) /* one process has no groups to leave out */
        pt_log_info("  left out: %d group%s of one rank or that carried nothing.", alone,
                    alone > 1 ? "s" : "");
}

/* The schedule as report.json holds it: enough to build it again (pt_schedule_build_head) and
 * simulate it as `pentatron schedule` does. */
static json_t *pt_report_schedule_json(const pt_schedule *s, double head_cost) {
    json_t *o = json_pack("{s:s, s:i, s:i, s:i, s:f}", "kind", pt_schedule_kind_name(s->kind), "pp",
                          s->pp, "microbatches", s->m, "virtual", s->v, "head", s->head ? head_cost : 0.0);
    if (s->weight) {
        json_t *w = json_array();
        for (int i = 0; i < s->pp * s->v; i++) json_array_append_new(w, json_real(s->weight[i]));
        json_object_set_new(o, "weights", w);
    }
    return o;
}

static void pt_report_json(const pt_report_table *tb, const pt_report_run *run) {
    const pt_degrees *d = &tb->deg;
    json_t *groups = json_array(), *ranks = json_array();
    for (int i = 0; i < tb->ng; i++) {
        double x[4];
        pt_report_group(tb, i, x);
        if (tb->g[i]->size < 2 || (x[1] == 0 && x[3] == 0)) continue; /* as the text report */
        json_array_append_new(groups, json_pack("{s:s, s:i, s:s, s:f, s:f, s:f, s:f}", "name",
                                                tb->g[i]->name, "size", tb->g[i]->size, "carries",
                                                pt_report_group_role(tb->g[i]->name), "bytes_per_step",
                                                x[0], "bytes_per_step_max", x[1], "blocked_s", x[2],
                                                "blocked_s_max", x[3]));
    }
    for (int r = 0; r < tb->R; r++) {
        const double *x = tb->all + (size_t)r * PT_ROW + 2 * PT_MESH_MAX_GROUPS;
        int c[4];
        pt_report_coords(d, r, c);
        json_array_append_new(ranks, json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:f}",
                                               "rank", r, "dp", c[0], "pp", c[1], "cp", c[2], "tp", c[3],
                                               "params", x[0], "grads", x[1], "optim", x[2],
                                               "activations", x[3], "transient", x[4], "peak_rss", x[5]));
    }
    json_t *o = json_pack("{s:I, s:I, s:I, s:f, s:{s:i, s:i, s:i, s:i, s:i, s:i}, s:o, s:o}", "first_step",
                          (json_int_t)tb->first, "last_step", (json_int_t)tb->last, "total_steps",
                          (json_int_t)run->total_steps, "seconds", tb->wall, "layout", "ranks", tb->R, "dp",
                          d->dp, "pp", d->pp, "cp", d->cp, "tp", d->tp, "ep", d->ep, "groups", groups,
                          "ranks", ranks);
    json_object_set_new(o, "schedule", run->sched ? pt_report_schedule_json(run->sched, run->head_cost)
                                                  : json_null());
    char *text = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text || pt_write_file_atomic(run->path, text, strlen(text)) != PT_OK)
        pt_log_warn("the HTML report's data: %s (training goes on)",
                    text ? pt_last_error() : "out of memory");
    free(text);
}

void pt_report_print(const pt_mesh *mesh, const pt_report_mark *since, int64_t step,
                     const pt_rank_memory *rm, const pt_report_run *run) {
    pt_report_table t;
    if (!pt_report_gather(mesh, since, step, rm, &t)) return;
    pt_report_text(&t);
    if (run && run->path && run->path[0]) pt_report_json(&t, run);
    free(t.all);
}
