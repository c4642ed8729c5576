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
 */
#ifndef PT_PLAN_H
#define PT_PLAN_H

#include "pt/config.h"
#include "pt/core.h"
#include "pt/schedule.h"

#define PT_HW_MAX_SHAPES 64
#define PT_HW_N_KEYS 12 /* the keys of the file, in its order: name ... gemm_shapes */

typedef struct {
    double m, n, k, flops; /* a GEMM of (m × k)·(k × n) measured at flops FLOP/s */
} pt_gemm_shape;

typedef struct {
    char name[96];
    int devices_per_node, nodes;
    double peak_flops, gemm_efficiency;
    double memory_bytes, memory_bw;
    double intra_bw, intra_latency, inter_bw, inter_latency;
    int n_shapes;
    pt_gemm_shape shapes[PT_HW_MAX_SHAPES];
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
 * two ranks of one host / of two hosts. how (PT_HW_N_KEYS pointers, filled; may be NULL) says
 * per key how its figure was found (static strings, valid until the next call). Every rank gets
 * the same figures. */
pt_status pt_hardware_measure(pt_hardware *hw, int bf16, int threads, const char **how);
/* `pentatron plan --measure --out FILE [--threads N] [--precision fp32|bf16]` (argv from
 * "--measure" on): starts the comm runtime, measures, rank 0 writes FILE and prints a summary.
 * Exit status: 0 done, 1 failed, 2 bad arguments. */
int pt_plan_measure_cmd(int argc, char **argv);
#endif
