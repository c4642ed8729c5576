/* plan.h: `pentatron plan`: memory and step time of a model × cluster × layout, from first
 * principles (docs/plan.md), and the hardware it is planned for.
 *
 * The hardware is an INI file (hardware/ ships H100 SXM, H200, A100 80 GB and a Selene-like A100
 * cluster; `pentatron plan --measure` writes one for the machine it runs on):
 *
 *   [hardware]
 *   name = "..."
 *   devices_per_node = 8          ; ranks per host
 *   nodes = 64                    ; hosts
 *   peak_flops = 989e12           ; dense FLOP/s per device in the precision trained in
 *   gemm_efficiency = 0.8         ; the fraction of peak_flops large GEMMs reach (cited/measured)
 *   memory_bytes = 80e9           ; per device
 *   memory_bw = 3.35e12           ; bytes/s
 *   intra_bw = 450e9              ; within a node, per device, per direction, bytes/s
 *   intra_latency = 3e-6          ; seconds
 *   inter_bw = 50e9               ; across nodes, per device, per direction, bytes/s
 *   inter_latency = 5e-6          ; seconds
 *   gemm_shapes = "m,n,k,flops; ..." ; optional: measured FLOP/s of GEMM shapes (the planner
 *                                 ; interpolates; without it, the efficiency model of docs/plan.md)
 *   gemm_units = 132              ; optional: SMs, for the tile and wave quantization
 *   gemm_tile_m = 256             ; optional: the GEMM's output tile (with gemm_units)
 *   gemm_tile_n = 128
 *   attention_flops = 2e10        ; optional: measured attention kernel FLOP/s (--measure writes it)
 *   xent_rate = 3e8               ; optional: measured softmax cross-entropy logits/s
 *   intra_overlap = 1             ; optional, default 1: the share of a transfer that moves while
 *   inter_overlap = "65536,0.8; 16777216,0.05" ; the ranks compute, within / across nodes: one
 *                                 ; share, or bytes,share entries by size (--measure: measured)
 *   intra_rendezvous = 0          ; optional, default 0: 1 if a message moves only when both
 *   inter_rendezvous = "4096,0; 16384,1" ; peers call in (a rendezvous), or bytes,0|1 by size
 *   collectives = "kind,where,ranks,bytes,seconds; ..." ; optional: measured times of the comm
 *                                 ; layer's collectives (kind ar|rs|ag|p2p, where intra|inter); the
 *                                 ; planner scales its ring times by them (docs/plan.md)
 *   skew = 0.02                   ; optional, default 0: the ranks' skew, the mean wait at a
 *                                 ; synchronization per second of computation before it (measured)
 *   overlap_slowdown = 0.189      ; optional, default 0: the computation's slowdown while a
 *                                 ; transfer runs beside it (a GPU's communication kernels take
 *                                 ; processors and memory bandwidth; a published measurement)
 *   comm = nccl                   ; optional, default mpi: the collectives as pentatron's comm
 *                                 ; layer runs them over MPI (hierarchical across nodes) or as
 *                                 ; NCCL does (flat rings, the inter-node link each ring's limit)
 */
#ifndef PT_PLAN_H
#define PT_PLAN_H

/* The planner's known error against published runs (docs/plan.md, "Validation against published
 * runs"; tests/test_plan.sh checks it against the cases it plans), printed next to its MFU. */
#define PT_PLAN_PUBLISHED_BAND                                                                   \
    "against 11 published runs the planned step is within 15% in 8, from 29% short to 5% "     \
    "long, mean |error| 13.7%: docs/plan.md"

#include "pt/config.h"
#include "pt/core.h"
#include "pt/schedule.h"

#define PT_HW_MAX_SHAPES 64
#define PT_HW_MAX_COLLS 64
#define PT_HW_MAX_SIZES 12
#define PT_HW_N_KEYS 25 /* the keys of the file, in its order: name ... gemm_shapes, gemm_units, gemm_tile_m, gemm_tile_n, attention_flops, xent_rate, intra_overlap, inter_overlap, intra_rendezvous, inter_rendezvous, collectives, skew, overlap_slowdown, comm */

typedef struct {
    double m, n, k, flops; /* a GEMM of (m × k)·(k × n) measured at flops FLOP/s */
} pt_gemm_shape;

typedef enum { PT_HW_AR = 0, PT_HW_RS, PT_HW_AG, PT_HW_P2P } pt_hw_coll; /* p2p: one message, one way */

typedef struct {
    pt_hw_coll kind;
    int inter;             /* 0: the ranks of one node (intra), 1: one rank on each of `ranks` nodes */
    int ranks;
    double bytes, seconds; /* the whole buffer (all-reduce's input, all-gather's output); the time */
} pt_coll_time;

/* A figure that depends on a message's size: entries of (bytes, value), bytes ascending; one entry
 * of bytes 0 is the same value at every size; none: not given. */
typedef struct {
    int n;
    double bytes[PT_HW_MAX_SIZES], value[PT_HW_MAX_SIZES];
} pt_hw_sizes;

/* l's value for a message of `bytes`: linear in log bytes between entries, the nearest entry's
 * beyond them; dflt when l has none. */
double pt_hw_sizes_at(const pt_hw_sizes *l, double bytes, double dflt);

typedef struct {
    char name[96];
    int devices_per_node, nodes;
    double peak_flops, gemm_efficiency;
    double memory_bytes, memory_bw;
    double intra_bw, intra_latency, inter_bw, inter_latency;
    int n_shapes;
    pt_gemm_shape shapes[PT_HW_MAX_SHAPES];
    /* optional (0: not modelled): the processors a GEMM's output tiles are spread over (a GPU's
     * SMs) and the tile (e.g. 256 × 128): the tile and wave quantization of NVIDIA's "Matrix
     * Multiplication Background" guide scale gemm_efficiency for each shape */
    int gemm_units, gemm_tile_m, gemm_tile_n;
    /* optional (0: modelled from the GEMMs and memory_bw): the rate of the attention kernel, in
     * the planner's FLOPs (forward 2 products over the causal half, backward 2.5× that), and of
     * the fused softmax cross-entropy, in logits per second (forward and gradient) */
    double attention_flops, xent_rate;
    /* optional, default 1: the share of a transfer within a node [0] / across nodes [1] that
     * moves while the ranks compute, by its size (1: the network progresses on its own, as NCCL's
     * kernels and RDMA do; an MPI without a progress thread moves what its buffers hold) */
    pt_hw_sizes overlap[2];
    /* optional, default 0: whether a message within a node [0] / across nodes [1] moves only when
     * both peers call into the comm layer, by its size (1: the receiver answers the sender's
     * request at its next call, the data leaves at the sender's next call after that: an MPI's
     * rendezvous past its eager limit, without a progress thread; pt_sched_link) */
    pt_hw_sizes rendezvous[2];
    /* optional (none: the α–β ring of the bandwidths and latencies): the comm layer's measured
     * collectives, each the slowest rank's time of one call; and the ranks' skew (default 0) */
    int n_colls;
    pt_coll_time colls[PT_HW_MAX_COLLS];
    double skew;
    /* optional, default 0: how much slower the computation runs while a transfer overlaps it,
     * per second of the transfer hidden (a GPU's NCCL kernels occupy SMs and memory bandwidth;
     * a host's MPI progresses in the ranks' own calls, so its files leave it out) */
    double overlap_slowdown;
    /* comm = nccl (1) or mpi (0, the default): a group spanning nodes runs its collectives as
     * NCCL's flat rings (pentatron's NCCL layer leaves such groups flat) or, over MPI, as the
     * comm layer's hierarchical form where that pays */
    int nccl;
} pt_hardware;

/* Reads a hardware file; PT_ERR_CONFIG / PT_ERR_IO naming the file and the key that is missing,
 * unknown or out of range. `overrides` (may be NULL, n of them) are "hardware.key=value" strings
 * applied after the file (e.g. --hardware.nodes=64). */
pt_status pt_hardware_load(pt_hardware *hw, const char *path, const char *const *overrides, int n);
/* Writes hw as an INI file (the format above, with comments saying how each figure was found
 * when `how` is not NULL: one line per key, same order as the keys). */
pt_status pt_hardware_write(const pt_hardware *hw, const char *path, const char *const *how);

/* Measures this machine (src/plan/measure.c; collective over the job's world, the comm runtime
 * started; one process works too): peak_flops the backend's GEMM peak in fp32 (bf16 = 0) or bf16
 * with `threads` threads per rank (gemm_efficiency 1: the peak is the GEMM rate) and gemm_shapes
 * a grid of measured shapes, memory_bw a STREAM triad, memory_bytes the host's memory per rank,
 * devices_per_node the ranks per host, nodes the hosts, intra_* / inter_* ping-pongs between
 * two ranks of one host / of two hosts (with the overlap and the rendezvous by message size),
 * collectives the comm layer's all-reduce, reduce-scatter and all-gather within a host and
 * across and one message (p2p) by size, skew the ranks' skew over equal GEMMs. how (PT_HW_N_KEYS pointers, filled; may be NULL) says
 * per key how its figure was found (static strings, valid until the next call). Every rank gets
 * the same figures. */
pt_status pt_hardware_measure(pt_hardware *hw, int bf16, int threads, int cuda, const char **how);
/* `pentatron plan --measure --out FILE [--threads N] [--precision fp32|bf16]` (argv from
 * "--measure" on): starts the comm runtime, measures, rank 0 writes FILE and prints a summary.
 * Exit status: 0 done, 1 failed, 2 bad arguments. */
int pt_plan_measure_cmd(int argc, char **argv);

/* ---------------------------------------------------------------------------------------------
 * The planner (src/plan/plan.c; docs/plan.md writes out every formula). */

#define PT_PLAN_MAX_PP 256

/* The communicating dimensions, in the order the JSON and the text list them. */
enum { PT_PLAN_DP = 0, PT_PLAN_TP, PT_PLAN_PP, PT_PLAN_CP, PT_PLAN_EP, PT_PLAN_DIMS };

/* One rank's memory by kind (bytes), as the run report counts it. */
typedef struct {
    double params, grads, optim, transient, activations, total;
    double masters; /* of optim: a bf16 model's fp32 masters (0 in fp32) */
} pt_plan_memory;

typedef struct {
    /* the layout: degrees, ZeRO, schedule, micro-batches */
    int dp, tp, pp, cp, ep, sp, zero, chunks, micro_batch, m;
    int zero_shard; /* HSDP: ZeRO's shard group in dp ranks (dp without HSDP) */
    pt_sched_kind sched;
    int recompute; /* pt_recompute */
    /* memory: per pipeline rank the largest rank of its stage, and the largest of all */
    pt_plan_memory stage[PT_PLAN_MAX_PP];
    double memory_max;
    int memory_max_stage;
    /* time per step (seconds) on the pipeline's slowest rank */
    double compute;                   /* forward, backward, recomputation, optimizer */
    double recompute_s;               /* of which recomputation */
    double optimizer;                 /* of which the optimizer */
    double exposed[PT_PLAN_DIMS];     /* communication not hidden, per dimension */
    double comm[PT_PLAN_DIMS];        /* all the communication's time, hidden or not */
    double bubble;                    /* pipeline idle */
    double skew;                      /* the ranks' waits for each other: hw skew × busy */
    double step, tokens_per_second, mfu;
    double model_flops;               /* per step, all ranks (6Ψ-style model FLOPs: no recompute) */
    double flops_per_token;
    char spans[64];                   /* the groups that span nodes, e.g. "dp pp" */
    int simulated;                    /* the bubble from the schedule's simulation (else formula) */
} pt_plan;

/* The plan of the layout the configuration gives on hw: PT_ERR_CONFIG naming the problem when the
 * layout is not valid for the model or the cluster (degrees, divisibility, the world). */
pt_status pt_plan_eval(const pt_config *c, const pt_hardware *hw, pt_plan *out);
/* Every valid layout of the model on hw's devices (the batch and the model fixed; the degrees,
 * ZeRO stage, schedule, micro-batch size, recomputation searched; sp with every tp > 1; tp
 * within a node unless plan.tp_across_nodes), screened with the bubble formulas, the best
 * 4·plan.top + 8 evaluated again with the schedule's simulation; those whose largest rank fits in
 * memory_bytes·(1 − plan.headroom) kept. *out (malloc'ed, *n entries) sorted by tokens/s, best
 * first; *n_fit counts the layouts that fit, *n_tried those evaluated; *least (if not NULL) the
 * layout, fitting or not, whose largest rank needs the least memory (screened with the formulas). */
pt_status pt_plan_search(const pt_config *c, const pt_hardware *hw, pt_plan **out, int *n,
                         int *n_fit, int *n_tried, pt_plan *least);
/* Seconds of a GEMM (m × k)·(k × n) of E-byte elements on one device of hw: at the measured rate
 * of the nearest shapes (gemm_shapes), else at gemm_efficiency × peak_flops scaled by the tile and
 * wave quantization (gemm_units), under the roofline of its bytes E(mk + kn + mn)/memory_bw. */
double pt_plan_gemm_time(const pt_hardware *hw, double E, double m, double n, double k);
/* One line of JSON (no newline) for p. */
void pt_plan_json(const pt_plan *p, FILE *f);
/* The text report of p (memory by kind per stage, the step's time by part). */
void pt_plan_print(const pt_plan *p, const pt_config *c, const pt_hardware *hw, FILE *f);

#endif
