/* mesh.c: the 5D process mesh (see include/pt/mesh.h).
 *
 * Resolves the degrees (dp × pp × cp × tp = world, ep within dp × cp), this rank's coordinates, and
 * one communicator per group (world, dp, tp, pp, cp, dpcp, ep, edp, emb, and kv when key/value
 * heads are shared), split from the comm backend's world communicator. It knows no MPI. */
#include "pt/mesh.h"

#include <stdlib.h>
#include <string.h>

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
    return PT_OK;
}

pt_status pt_mesh_init(pt_mesh *m, const pt_degrees *deg, double timeout_s) {
    memset(m, 0, sizeof *m);
    pt_comm *world = pt_comm_world(timeout_s);
    m->world_rank = world->rank;
    m->world_size = world->size;
    m->deg = *deg;
    pt_status st = pt_degrees_resolve(&m->deg, m->world_size);
    if (st != PT_OK) {
        world->free(world);
        return st;
    }
    const pt_degrees *d = &m->deg;
    int r = m->world_rank;
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
    return PT_OK;
}

void pt_mesh_make_kv(pt_mesh *m, int shared) {
    m->kv = m->tp->split(m->tp, m->tp_i / shared, m->tp_i, "kv");
}

void pt_mesh_make_head(pt_mesh *m) {
    const pt_degrees *d = &m->deg;
    m->head = m->world->split(m->world, m->dp_i * d->cp + m->cp_i, m->pp_i * d->tp + m->tp_i, "head");
}

void pt_mesh_free(pt_mesh *m) {
    pt_comm *groups[] = {m->head, m->kv, m->emb, m->edp, m->ep, m->dpcp, m->pp, m->dp, m->cp, m->tp, m->world};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (groups[i]) groups[i]->free(groups[i]);
    memset(m, 0, sizeof *m);
}

int pt_mesh_groups(const pt_mesh *m, const pt_comm **out) {
    const pt_comm *all[] = {m->world, m->dp, m->tp, m->pp, m->cp, m->dpcp, m->ep, m->edp, m->emb, m->kv, m->head};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) out[n++] = all[i];
    return n;
}

void pt_mesh_stats(const pt_mesh *m, pt_comm_stats *total) {
    memset(total, 0, sizeof *total);
    const pt_comm *groups[] = {m->world, m->dp, m->tp, m->pp, m->cp, m->dpcp, m->ep, m->edp, m->emb, m->kv, m->head};
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (groups[i]) pt_comm_stats_add(total, &groups[i]->stats);
}
