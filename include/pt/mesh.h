/* mesh.h: the 5D process mesh: degrees, this rank's coordinates, one communicator per group.
 *
 * world = dp × pp × cp × tp. Rank order puts tp fastest (tensor-parallel ranks exchange the most
 * and should share a node), then cp, then dp, then pp (docs/parallelism.md says why):
 *   rank = ((pp_i · dp + dp_i) · cp + cp_i) · tp + tp_i
 * Expert parallelism reuses ranks: ep divides dp × cp, and the experts of a layer are spread over
 * consecutive blocks of ep ranks of the dp × cp group ("ep"); the ranks holding the same experts
 * form the expert-data group ("edp") over which expert gradients are reduced.
 *
 * The rank in that formula is the process's place among the job's processes ordered by host (then
 * by rank on the host; PT_MESH_ORDER = rank: the world rank), so that tp, then cp, fill a host
 * before anything crosses to the next, whatever order the launcher gave; with several hosts rank 0
 * logs which groups stay within a host and which cross.
 * HSDP (parallel.zero_scope): the data group (dp × cp) cut into shard groups of zs consecutive dp
 * ranks (with all their cp ranks), "dps", over which ZeRO shards, and the replicate groups
 * "dpr" of the members at the same place in every shard group (dp × cp = dps × dpr); the
 * experts' data group likewise into "eds" (its members within one shard group) and "edr".
 * Each group's communicator is made with the comm backend's split (color = the other coordinates,
 * key = the own coordinate) of the world communicator (pt_comm_world); freed in reverse order.
 */
#ifndef PT_MESH_H
#define PT_MESH_H

#include "pt/comm.h"

typedef struct {
    int dp, tp, pp, cp, ep;
    int zs; /* HSDP: ZeRO's shard group in dp ranks (0: all of dp, no HSDP; -1: the dp ranks of a
             * host, resolved to their count by pt_mesh_init) */
} pt_degrees;

typedef struct {
    pt_degrees deg;
    int world_rank, world_size;
    int dp_i, tp_i, pp_i, cp_i;
    int dpcp_i;        /* index in the dp × cp group: dp_i · cp + cp_i */
    int hosts;         /* hosts of the job (processes sharing memory) */
    int ep_i, edp_i;   /* index in the expert group, and in the expert-data group */
    pt_comm *world, *dp, *tp, *pp, *cp, *dpcp, *ep, *edp;
    pt_comm *kv; /* tp ranks holding the same key/value head (tp > n_kv_heads), else NULL */
    pt_comm *emb; /* the first and last pipeline stage of the same (dp, cp, tp) coordinates: the
                   * tied embedding's two copies (one rank alone on the other stages) */
    pt_comm *head; /* the pp × tp ranks of the same (dp, cp) coordinates, pp-major: the head split
                    * over the pipeline ranks (parallel.pp_head = split), else NULL */
    /* HSDP (deg.zs > 0 after pt_mesh_init), else NULL: the shard and replicate groups of the
     * data group and of the experts' data group; rep_i: this rank's shard group (replica) */
    pt_comm *dps, *dpr, *eds, *edr;
    int rep_i;
} pt_mesh;

/* Fills in -1 degrees ("the rest of the world") and checks the layout; PT_ERR_CONFIG with one
 * message naming the violated constraint. Does not communicate. */
pt_status pt_degrees_resolve(pt_degrees *d, int world_size);
/* HSDP's shard size d->zs (> 0) against the other degrees: it divides dp, and ep divides zs·cp
 * (every shard group holds all the experts); PT_ERR_CONFIG naming the keys. */
pt_status pt_degrees_check_scope(const pt_degrees *d);
/* Builds the mesh over every process of the job (collective over the world). */
pt_status pt_mesh_init(pt_mesh *m, const pt_degrees *d, double timeout_s);
void pt_mesh_free(pt_mesh *m);
/* The kv group: consecutive blocks of `shared` tp ranks (collective over the world). */
void pt_mesh_make_kv(pt_mesh *m, int shared);
/* The head group (collective over the world). */
void pt_mesh_make_head(pt_mesh *m);
/* Sums every group's counters. */
void pt_mesh_stats(const pt_mesh *m, pt_comm_stats *total);
/* The groups one after another (NULL-free), for per-group reports: returns the count. */
enum { PT_MESH_MAX_GROUPS = 15 };
int pt_mesh_groups(const pt_mesh *m, const pt_comm **out);

#endif
