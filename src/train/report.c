/* report.c: the run report rank 0 prints at the end of a run (and every logging.report_every
 * steps): per parallel dimension, the bytes each rank sent and the time it was blocked; per rank,
 * its memory split into parameters, gradients, optimizer state and activations. */
#include "pt/metrics.h"

#include <stdlib.h>
#include <string.h>

/* What one parallel dimension's group carries, for the table. */
static const char *pt_group_role(const char *name) {
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
enum { PT_MEM_FIELDS = 6 };

void pt_report_print(const pt_mesh *mesh, const pt_report_mark *since, int64_t step,
                     const pt_rank_memory *rm) {
    pt_report_mark now = pt_report_mark_now(mesh, step);
    int64_t steps = now.step - since->step;
    if (steps <= 0) return;
    double wall = now.time - since->time;
    int ng = now.n_groups, R = mesh ? mesh->world_size : 1;
    int width = 2 * PT_MESH_MAX_GROUPS + PT_MEM_FIELDS;
    double mine[2 * PT_MESH_MAX_GROUPS + PT_MEM_FIELDS] = {0};
    for (int i = 0; i < ng; i++) {
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
    double *all = pt_malloc((size_t)R * width * sizeof(double));
    if (mesh)
        pt_allgather(mesh->world, mine, all, (size_t)width, PT_DTYPE_F64);
    else
        memcpy(all, mine, sizeof mine);
    if (mesh && mesh->world_rank != 0) {
        free(all);
        return;
    }

    const pt_degrees *d = mesh ? &mesh->deg : &(pt_degrees){1, 1, 1, 1, 1, 0};
    pt_log_info("run report, steps %lld-%lld (%.2f s/step): %d rank%s = dp %d × pp %d × cp %d × "
                "tp %d, ep %d", (long long)since->step + 1, (long long)now.step, wall / steps, R,
                R > 1 ? "s" : "", d->dp, d->pp, d->cp, d->tp, d->ep);
    if (ng > 0) {
        const pt_comm *g[PT_MESH_MAX_GROUPS];
        pt_mesh_groups(mesh, g);
        pt_log_info("  %-5s %-28s %14s %14s %12s %12s %7s", "group", "carries", "bytes/step",
                    "max rank", "blocked s", "max rank", "% step");
        for (int i = 0; i < ng; i++) {
            double b = 0, bmax = 0, w = 0, wmax = 0;
            for (int r = 0; r < R; r++) {
                const double *row = all + (size_t)r * width;
                b += row[i] / R, w += row[PT_MESH_MAX_GROUPS + i] / R;
                if (row[i] > bmax) bmax = row[i];
                if (row[PT_MESH_MAX_GROUPS + i] > wmax) wmax = row[PT_MESH_MAX_GROUPS + i];
            }
            if (bmax == 0 && wmax == 0) continue; /* a dimension of degree 1, or unused */
            pt_log_info("  %-5s %-28s %14.0f %14.0f %12.4f %12.4f %6.1f%%", g[i]->name,
                        pt_group_role(g[i]->name), b, bmax, w, wmax, 100.0 * w * steps / wall);
        }
    }
    pt_log_info("  %-24s %10s %10s %10s %11s %10s %10s %10s", "memory per rank (MiB)", "params",
                "grads", "optimizer", "activations", "transient", "total", "peak RSS");
    for (int r = 0; r < R; r++) {
        const double *x = all + (size_t)r * width + 2 * PT_MESH_MAX_GROUPS;
        char who[96];
        if (mesh) {
            /* the rank's coordinates, from the mesh's rank order */
            int tp = r % d->tp, cp = (r / d->tp) % d->cp, dp = (r / (d->tp * d->cp)) % d->dp;
            int pp = r / (d->tp * d->cp * d->dp);
            snprintf(who, sizeof who, "rank %d (dp%d pp%d cp%d tp%d)", r, dp, pp, cp, tp);
        } else {
            snprintf(who, sizeof who, "rank 0");
        }
        double M = 1048576.0, total = x[0] + x[1] + x[2] + x[3] + x[4];
        pt_log_info("  %-24s %10.2f %10.2f %10.2f %11.2f %10.2f %10.2f %10.1f", who, x[0] / M,
                    x[1] / M, x[2] / M, x[3] / M, x[4] / M, total / M, x[5] / M);
    }
    free(all);
}
