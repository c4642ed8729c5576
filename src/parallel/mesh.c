/* mesh.c: the 5D process mesh (see include/pt/mesh.h).
 *
 * Resolves the degrees (dp × pp × cp × tp = world, ep within dp × cp), this rank's coordinates, and
 * one communicator per group (world, dp, tp, pp, cp, dpcp, ep, edp, emb, and kv when key/value
 * heads are shared; with HSDP dps, dpr, eds, edr), split from the comm backend's world
 * communicator. It knows no MPI. */
#include "pt/mesh.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pt/flight.h"

pt_status pt_degrees_resolve(pt_degrees *d, int world) {
    const char *names[] = {"dp", "tp", "pp", "cp", "ep"};
    int *vals[] = {&d->dp, &d->tp, &d->pp, &d->cp, &d->ep};
    for (int i = 0; i < 5; i++) {
        if (*vals[i] == 0 || *vals[i] < -1 || (*vals[i] == -1 && i != 0))
            return pt_errorf(PT_ERR_CONFIG, "parallel.%s = %d: degrees must be >= 1%s", names[i],
                             *vals[i], i == 0 ? " (or -1 for the rest of the world)" : "");
    }
    int rest = d->tp * d->pp * d->cp;
    if (d->dp == -1) {
        if (world % rest != 0)
            return pt_errorf(PT_ERR_CONFIG,
                             "parallel.dp = -1: world size %d is not divisible by tp·pp·cp = %d",
                             world, rest);
        d->dp = world / rest;
    }
    if ((int64_t)d->dp * rest != world)
        return pt_errorf(PT_ERR_CONFIG,
                         "layout dp·pp·cp·tp = %d·%d·%d·%d = %lld does not match the world size %d",
                         d->dp, d->pp, d->cp, d->tp, (long long)d->dp * rest, world);
    if ((d->dp * d->cp) % d->ep != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.ep = %d must divide dp·cp = %d", d->ep,
                         d->dp * d->cp);
    return d->zs > 0 ? pt_degrees_check_scope(d) : PT_OK;
}

pt_status pt_degrees_check_scope(const pt_degrees *d) {
    if (d->dp % d->zs != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero_scope = %d must divide parallel.dp = %d "
                         "(ZeRO shards over groups of that many data ranks, replicated over "
                         "dp / zero_scope of them)", d->zs, d->dp);
    int block = d->zs * d->cp; /* a shard group's ranks of the data group dp × cp */
    if (d->ep > 1 && block % d->ep != 0)
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero_scope = %d with parallel.ep = %d: ep must "
                         "divide the shard group's zero_scope·cp = %d data ranks (each shard group "
                         "holds every expert, sharded over its ranks holding the same experts)",
                         d->zs, d->ep, block);
    return PT_OK;
}

static void pt_mesh_say_placement(const pt_mesh *m);

/* This rank's place in the mesh's order: its world rank, or by default its place among the
 * processes ordered by host (then by rank on the host), so that the groups that exchange the most,
 * consecutive in the order (tp, then cp, dp, pp), fill a host before crossing to the next whatever
 * order the launcher gave the ranks (e.g. round-robin over hosts). PT_MESH_ORDER = rank keeps the
 * world's order (the placement the launcher made). Collective over the world. */
/* zero_scope = node: the dp ranks on this rank's host, as many on every host and consecutive in
 * the dp group (they are: the mesh orders the ranks by host); the count, or PT_ERR_CONFIG on
 * every rank alike. Collective over the world. */
static pt_status pt_mesh_node_scope(pt_mesh *m, int *zs) {
    int n = m->dp->size, me, local;
    pt_comm_host(&me, &local);
    int32_t *h = pt_malloc((size_t)n * sizeof *h);
    h[m->dp->rank] = me;
    pt_allgather(m->dp, NULL, h, 1, PT_DTYPE_I32);
    int s = 0;
    for (int i = 0; i < n; i++) s += h[i] == me;
    double agree[3] = {s, (double)s * s, 0}; /* equal counts: W·Σs² = (Σs)² */
    for (int i = 0; i < n; i++) agree[2] += h[i] != h[i / s * s];
    free(h);
    double first = s;
    pt_bcast(m->world, &first, 1, PT_DTYPE_F64, 0);
    pt_allreduce_sum(m->world, agree, 3, PT_DTYPE_F64);
    *zs = s;
    if (agree[2] == 0 && agree[1] * m->world_size == agree[0] * agree[0]) return PT_OK;
    return pt_errorf(PT_ERR_CONFIG, "parallel.zero_scope = node: the hosts hold different numbers "
                     "of a data-parallel group's ranks (%d on rank 0's host, %.1f on average); "
                     "give every host as many ranks, or a shard size parallel.zero_scope = N",
                     (int)first, agree[0] / m->world_size);
}

/* HSDP's groups: the data group dp × cp (dpcp_i) in consecutive shard groups of zs dp ranks,
 * "dps" (key: the place in it), and across them the replicate groups "dpr" (key: the shard
 * group); the experts' data group (edp) the same way, "eds" its members in one shard group, "edr"
 * those at the same place of eds in every shard group. Collective over the world. */
static void pt_mesh_make_hsdp(pt_mesh *m) {
    const pt_degrees *d = &m->deg;
    int block = d->zs * d->cp, blocks = d->dp / d->zs, at = m->dpcp_i % block;
    int rest = m->pp_i * d->tp + m->tp_i; /* the coordinates outside the data group */
    m->rep_i = m->dpcp_i / block;
    m->dps = m->world->split(m->world, rest * blocks + m->rep_i, at, "dps");
    m->dpr = m->world->split(m->world, rest * block + at, m->rep_i, "dpr");
    if (d->ep == 1) return; /* (no experts' region) */
    int ecolor = rest * d->ep + m->ep_i;
    m->eds = m->world->split(m->world, ecolor * blocks + m->rep_i, m->edp_i, "eds");
    m->edr = m->world->split(m->world, ecolor * block + m->eds->rank, m->rep_i, "edr");
}

static pt_status pt_mesh_position(pt_comm *world, int *pos, int *hosts) {
    const char *order = getenv("PT_MESH_ORDER");
    if (order && strcmp(order, "host") && strcmp(order, "rank"))
        return pt_errorf(PT_ERR_CONFIG, "PT_MESH_ORDER = \"%s\": expected host (the default) or rank",
                         order);
    int n = world->size, *all = pt_malloc((size_t)2 * n * sizeof *all), mine[2];
    pt_comm_host(&mine[0], &mine[1]);
    pt_allgather(world, mine, all, 2, PT_DTYPE_I32);
    int before = 0;
    *hosts = 0;
    for (int q = 0; q < n; q++) {
        const int *h = all + 2 * q;
        *hosts += h[0] == q; /* a host's id is its lowest world rank */
        before += h[0] < mine[0] || (h[0] == mine[0] && (h[1] < mine[1] || (h[1] == mine[1] && q < world->rank)));
    }
    free(all);
    *pos = order && !strcmp(order, "rank") ? world->rank : before;
    return PT_OK;
}

static void pt_mesh_roster(const pt_mesh *m);

pt_status pt_mesh_init(pt_mesh *m, const pt_degrees *deg, double timeout_s) {
    memset(m, 0, sizeof *m);
    pt_comm *world = pt_comm_world(timeout_s);
    /* device memory's path (comm.backend), inherited by every group split from the world */
    pt_status st = pt_comm_device_attach(world);
    if (st != PT_OK) {
        world->free(world);
        return st;
    }
    m->world_rank = world->rank;
    m->world_size = world->size;
    m->deg = *deg;
    st = pt_degrees_resolve(&m->deg, m->world_size);
    if (st != PT_OK) {
        world->free(world);
        return st;
    }
    const pt_degrees *d = &m->deg;
    int r = m->world_rank, hosts = 1;
    st = pt_mesh_position(world, &r, &hosts);
    if (st != PT_OK) {
        world->free(world);
        return st;
    }
    m->hosts = hosts;
    m->tp_i = r % d->tp;
    m->cp_i = (r / d->tp) % d->cp;
    m->dp_i = (r / (d->tp * d->cp)) % d->dp;
    m->pp_i = r / (d->tp * d->cp * d->dp);
    m->dpcp_i = m->dp_i * d->cp + m->cp_i;
    m->ep_i = m->dpcp_i % d->ep;
    m->edp_i = m->dpcp_i / d->ep;
    int ndpcp = d->dp * d->cp;

    /* one group each: ranks with equal color (a number unique to the other coordinates), ordered
     * by key (the own coordinate) */
    m->tp = world->split(world, ((m->pp_i * d->dp + m->dp_i) * d->cp + m->cp_i), m->tp_i, "tp");
    m->cp = world->split(world, ((m->pp_i * d->dp + m->dp_i) * d->tp + m->tp_i), m->cp_i, "cp");
    m->dp = world->split(world, ((m->pp_i * d->cp + m->cp_i) * d->tp + m->tp_i), m->dp_i, "dp");
    m->pp = world->split(world, ((m->dp_i * d->cp + m->cp_i) * d->tp + m->tp_i), m->pp_i, "pp");
    m->dpcp = world->split(world, m->pp_i * d->tp + m->tp_i, m->dpcp_i, "dpcp");
    m->ep = world->split(world, (m->pp_i * d->tp + m->tp_i) * ndpcp + m->edp_i, m->ep_i, "ep");
    m->edp = world->split(world, (m->pp_i * d->tp + m->tp_i) * ndpcp + m->ep_i, m->edp_i, "edp");
    int ends = m->pp_i == 0 || m->pp_i == d->pp - 1, coords = (m->dp_i * d->cp + m->cp_i) * d->tp + m->tp_i;
    m->emb = world->split(world, ends ? coords : m->world_size + r, 0, "emb");
    m->world = world;
    if (d->zs == -1 && (st = pt_mesh_node_scope(m, &m->deg.zs)) == PT_OK)
        st = pt_degrees_check_scope(d);
    if (st != PT_OK) {
        pt_mesh_free(m);
        return st;
    }
    if (d->zs == d->dp) { /* one shard group: plain ZeRO */
        if (m->world_rank == 0 && d->dp > 1)
            pt_log_info("parallel.zero_scope: the shard group is the whole data group (%d ranks): "
                        "plain ZeRO", d->dp);
        m->deg.zs = 0;
    }
    if (d->zs > 0) pt_mesh_make_hsdp(m);
    /* the groups whose all-reduces are big (gradients, the MoE's dense region): hierarchical
     * where they span hosts (include/pt/comm.h, PT_COMM_HIER) */
    pt_comm *hier[] = {m->dp, m->dpcp, m->edp, m->world, m->dps, m->dpr};
    char said[64] = "";
    for (size_t i = 0; i < sizeof hier / sizeof hier[0]; i++) {
        if (!hier[i]) continue;
        if ((st = pt_comm_hier_setup(hier[i])) != PT_OK) {
            pt_mesh_free(m);
            return st;
        }
        if (pt_comm_hierarchical(hier[i]))
            snprintf(said + strlen(said), sizeof said - strlen(said), "%s%s", said[0] ? ", " : "",
                     hier[i]->name);
    }
    if (said[0] && m->world_rank == 0)
        pt_log_info("mesh: hierarchical collectives over %s (within a host, across hosts; "
                    "PT_COMM_HIER = %s)", said, getenv("PT_COMM_HIER") ? getenv("PT_COMM_HIER") : "auto");
    pt_mesh_say_placement(m);
    pt_mesh_roster(m);
    return PT_OK;
}

/* Every rank's coordinates and host, for the flight recorder to name a rank that does not answer
 * (pt/flight.h): gathered over the world once. */
static void pt_mesh_roster(const pt_mesh *m) {
    enum { E = PT_FLIGHT_LABEL + PT_FLIGHT_HOST };
    char mine[E] = {0};
    snprintf(mine, PT_FLIGHT_LABEL, "dp%d pp%d cp%d tp%d", m->dp_i, m->pp_i, m->cp_i, m->tp_i);
    gethostname(mine + PT_FLIGHT_LABEL, PT_FLIGHT_HOST - 1);
    pt_flight_set_label(mine);
    char *all = pt_malloc((size_t)m->world_size * E);
    pt_allgather(m->world, mine, all, E / 4, PT_DTYPE_I32);
    pt_flight_set_roster(all, m->world_size);
    free(all);
}

/* With several hosts, rank 0 says which groups stay within a host and which cross (each group's
 * lowest and highest host id compared: collective over every group). */
static void pt_mesh_say_placement(const pt_mesh *m) {
    if (m->hosts < 2) return;
    pt_comm *groups[] = {m->tp, m->cp, m->ep, m->dp, m->pp, m->dps, m->dpr};
    char within[64] = "", across[64] = "";
    int me, local;
    pt_comm_host(&me, &local);
    int32_t *h = pt_malloc((size_t)m->world_size * sizeof *h);
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
        if (!groups[g] || groups[g]->size < 2) continue;
        h[groups[g]->rank] = me;
        pt_allgather(groups[g], NULL, h, 1, PT_DTYPE_I32);
        int32_t crosses = 0; /* any group of the kind, anywhere: summed so that every rank agrees */
        for (int i = 1; i < groups[g]->size; i++) crosses |= h[i] != h[0];
        pt_allreduce_sum(m->world, &crosses, 1, PT_DTYPE_I32);
        char *to = crosses ? across : within;
        size_t len = strlen(to);
        snprintf(to + len, 64 - len, "%s%s", len ? ", " : "", groups[g]->name);
    }
    free(h);
    if (m->world_rank == 0)
        pt_log_info("mesh: %d hosts; within a host: %s; across hosts: %s (%s)", m->hosts,
                    within[0] ? within : "none", across[0] ? across : "none",
                    getenv("PT_MESH_ORDER") && !strcmp(getenv("PT_MESH_ORDER"), "rank")
                        ? "PT_MESH_ORDER = rank: the launcher's order"
                        : "the ranks ordered by host");
}

void pt_mesh_make_kv(pt_mesh *m, int shared) {
    m->kv = m->tp->split(m->tp, m->tp_i / shared, m->tp_i, "kv");
}

void pt_mesh_make_head(pt_mesh *m) {
    const pt_degrees *d = &m->deg;
    m->head = m->world->split(m->world, m->dp_i * d->cp + m->cp_i, m->pp_i * d->tp + m->tp_i, "head");
}

void pt_mesh_free(pt_mesh *m) {
    pt_comm *groups[] = {m->edr, m->eds, m->dpr, m->dps, m->head, m->kv, m->emb, m->edp,
                         m->ep, m->dpcp, m->pp, m->dp, m->cp, m->tp, m->world};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (groups[i]) groups[i]->free(groups[i]);
    memset(m, 0, sizeof *m);
}

int pt_mesh_groups(const pt_mesh *m, const pt_comm **out) {
    const pt_comm *all[] = {m->world, m->dp, m->tp, m->pp, m->cp, m->dpcp, m->ep, m->edp,
                            m->emb, m->kv, m->head, m->dps, m->dpr, m->eds, m->edr};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) out[n++] = all[i];
    return n;
}

void pt_mesh_stats(const pt_mesh *m, pt_comm_stats *total) {
    memset(total, 0, sizeof *total);
    const pt_comm *groups[PT_MESH_MAX_GROUPS];
    for (int i = 0, n = pt_mesh_groups(m, groups); i < n; i++)
        pt_comm_stats_add(total, &groups[i]->stats);
}
