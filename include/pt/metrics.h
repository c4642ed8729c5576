/* metrics.h: what a training step measured, and how it is told: the step's log line, its JSON
 * line (logging.metrics), MFU against the measured GEMM peak, and the run report
 * (src/train/metrics.c, src/train/report.c). These take numbers, not the trainer. */
#ifndef PT_METRICS_H
#define PT_METRICS_H

#include <stdio.h>

#include "pt/backend.h"
#include "pt/mesh.h"
#include "pt/model.h"
#include "pt/schedule.h"

typedef struct {
    int64_t step;      /* from 1 */
    double loss;       /* mean loss of this step's batch before its update */
    double grad_norm;  /* before clipping */
    double aux_loss, z_loss; /* mixture of experts: the balancing losses (in the objective) */
    float lr;
    int64_t tokens;    /* tokens in the batch */
    double seconds;    /* wall time of the step */
    double tokens_per_s;
    double mfu;        /* model FLOPs / (seconds · ranks · the GEMM peak per rank) */
    double mfu_datasheet; /* the same against a GPU's datasheet peak (0: not on a known GPU) */
    int64_t device_peak_bytes; /* a GPU's most device memory held so far (0 on CPUs) */
    int64_t peak_rss_bytes; /* this process's peak resident memory, taken once for every report */
    int n_stages;      /* pipeline: ranks of the pipeline group (0 without) */
    double idle[64];   /* pipeline: each stage's time blocked on its transfers / step time */
    double busy[64];   /* pipeline: each stage's seconds in its forwards and backwards */
    int head_split;    /* the head split over the stages: each stage's seconds computing its rows */
    double head_busy[64];
    int n_cp;          /* context parallelism: ranks of the cp group (0 without) */
    double attn_pairs[64]; /* each cp rank's visible attention (query, key) pairs computed */
    int64_t allocs;    /* allocations this rank's code made during the step (0 after the first) */
    const double *expert_load; /* mixture of experts: (n_layers, n_experts) token-slots, or NULL */
    int ep;            /* expert parallelism: rows this rank dispatched and received (ep_rows) */
    int64_t ep_rows[2];
    int n_sources;     /* data.sources: sources mixed (0: data.train alone), their names and */
    const char *const *source_names; /* shares of the tokens read up to this step */
    const double *source_share;
    int skipped;       /* the update was skipped: the loss or gradient norm was not finite */
    int evaluated;     /* held-out evaluation after this step: its loss, tokens and seconds */
    double val_loss, val_seconds;
    int64_t val_tokens;
} pt_step_stats;

/* A mixture-of-experts layer's load, from its n experts' token-slots: {min, max, mean, max/mean}
 * (max/mean 0 when no token was routed). */
void pt_expert_load_summary(const double *load, int n, double out[4]);

/* Bytes of one rank's memory by kind. */
typedef struct {
    size_t params, grads, optim, params_transient, grads_transient, activations;
} pt_rank_memory;

/* The JSON lines of logging.metrics: one per step; every comm_every steps (and at the last) with
 * this rank's communication since the previous such line, by operation and by group, and its
 * memory. */
typedef struct {
    FILE *f;
    char path[1024]; /* for messages */
    int64_t total_steps, comm_every;
    const pt_mesh *mesh; /* NULL: one process */
    pt_comm_stats since;
    uint64_t group_since[2 * PT_MESH_MAX_GROUPS];
} pt_metrics;

/* This rank's communication over the steps of one window (every comm_every steps and the last),
 * as the JSON lines and the TensorBoard events (pt/tensorboard.h) give it: in all, by operation
 * and by group (pt_mesh_groups order; bytes in the bus-bandwidth convention). */
typedef struct {
    int64_t steps; /* the steps it covers; 0: no window closes at this step */
    uint64_t bytes;
    double wait_s; /* seconds blocked waiting on communication */
    uint64_t op_calls[PT_COMM_OP_COUNT], op_bytes[PT_COMM_OP_COUNT];
    double op_wait_s[PT_COMM_OP_COUNT];
    int n_groups;
    const char *group[PT_MESH_MAX_GROUPS];
    int group_size[PT_MESH_MAX_GROUPS]; /* its ranks (1: never communicates) */
    uint64_t group_bytes[PT_MESH_MAX_GROUPS];
    double group_wait_s[PT_MESH_MAX_GROUPS];
} pt_comm_window;

/* Opens (appends to) path, making its directory if missing; PT_ERR_IO naming what failed. path ""
 * opens no file: the communication is counted for pt_metrics_window alone. */
pt_status pt_metrics_open(pt_metrics *mx, const char *path, const pt_mesh *mesh,
                          int64_t total_steps, int64_t comm_every);
/* The window that closes at this step (w->steps 0: none; always so without a mesh); the next
 * one counts from here. */
void pt_metrics_window(pt_metrics *mx, int64_t step, pt_comm_window *w);
/* The step's line, with w's communication when it closes a window (w NULL: none). PT_ERR_IO naming
 * the file when the line could not be written (a full disk, say). */
pt_status pt_metrics_write(pt_metrics *mx, const pt_step_stats *s, const pt_comm_window *w,
                           const pt_model_config *mc, const pt_rank_memory *mem);
/* Communication counted from now on (the start of the training loop). */
void pt_metrics_begin(pt_metrics *mx);
void pt_metrics_close(pt_metrics *mx);

/* The step's log line (rank 0), with a progress bar and ETA: "[#####.....] ETA 1m23s". */
void pt_step_print(const pt_step_stats *s, int64_t total_steps, const char *progress);
void pt_progress_bar(int64_t step, int64_t total_steps, double elapsed, int64_t first_step,
                     char *out, size_t cap);

/* Bytes this process may use when training.memory_limit is 0: the host's available memory
 * (MemAvailable, and the cgroup's limit less its usage when lower) divided by the ranks on this
 * host (OMPI_COMM_WORLD_LOCAL_SIZE, else 1). */
int64_t pt_memory_available(void);
/* The most this process may use: training.memory_limit when set (configured > 0), else
 * pt_memory_available(), either lowered to the address space left under RLIMIT_AS (ulimit -v:
 * its limit less what is mapped now) when that is less. `what` (cap bytes) names the bound that
 * applies, for messages ("the memory available to it"). */
int64_t pt_memory_limit(int64_t configured, char *what, size_t cap);
/* bytes in the unit that reads best, one decimal: "512 B", "339.5 KiB", "74.5 GiB" (up to TiB). */
const char *pt_fmt_bytes(double bytes, char *out, size_t cap);
/* PT_ERR_CONFIG when the set-up's need (the sum of mem's kinds, plus `other` bytes of buffers
 * outside them: the batch, the trace, ...) exceeds limit bytes, the message listing the need by
 * kind; `what` names where the limit came from. */
pt_status pt_memory_check(const pt_rank_memory *mem, double other, int64_t limit, const char *what);

/* The parameters of c's tensors, without biases (a lower bound), in double: the embedding and
 * head, per layer the attention and its norms, the dense or mixture-of-experts SwiGLU. */
double pt_param_estimate(const pt_model_config *c);
/* Before anything is allocated: a lower bound of one rank's need from the configuration alone,
 * in double (so sizes that would overflow 64 bits are seen, not wrapped): the parameters (the
 * model's tensors, without biases) × bytes_per_param (4 to infer; 16 to train: weights,
 * gradients, two AdamW moments) plus, when tokens > 0 (a micro-batch's tokens), the logits and
 * each layer's input, all divided evenly over `ranks`. PT_ERR_CONFIG when it passes 2^62 bytes
 * or limit, with the need, its parts and the limit (`what` names the limit's source). */
pt_status pt_memory_precheck(const pt_model_config *c, double bytes_per_param, double tokens,
                             int ranks, int64_t limit, const char *what);
/* A buffer a key sizes (the trace's, the batch's, ...): the key and its value ("logging.trace_events
 * = 1000000"), what it is ("the trace buffer"), its bytes on this rank, and whether it is held
 * only for a moment (transient: a step's, the end's), when the largest of those counts. */
typedef struct {
    char key[96];
    const char *what;
    double bytes;
    int transient;
} pt_mem_buffer;
/* The bytes those buffers add to a rank's need: the held ones' sum and the largest transient. */
double pt_mem_buffers_bytes(const pt_mem_buffer *buf, int n_buf);
/* pt_memory_precheck with these buffers added to the need; when one of them is at least half of
 * it, the message leads with its key ("logging.trace_events = 1000000000 needs 74.5 GiB for the
 * trace buffer, but ..."), else it lists them with the model's parts. */
pt_status pt_memory_precheck_ex(const pt_model_config *c, double bytes_per_param, double tokens,
                                int ranks, const pt_mem_buffer *buf, int n_buf, int64_t limit,
                                const char *what);

/* sgemm FLOP/s of the backend, measured now (a few hundred milliseconds). */
double pt_measure_gemm_peak(pt_backend *be);
/* The same for gemm_bf16 (bf16 inputs, fp32 accumulation): the peak MFU of a mixed-precision run
 * is measured against. Adds the 1024³ NT shape to the backend's bf16 kernel cache. */
double pt_measure_gemm_bf16_peak(pt_backend *be);
/* The GEMM FLOP/s (fp32, or gemm_bf16 where bf16) of 1024³ products this rank sustains back to
 * back with each of its threads on a core: the best of 3 windows of at least `seconds` each,
 * per second of the processor time they got, times its threads (0: the best single product in
 * wall-clock time, as pt_measure_gemm_peak). Called by ranks of a host at once, each on cores
 * of its own, the sum is what the cores reach together. */
double pt_measure_gemm_rate(pt_backend *be, int bf16, double seconds);
/* Model FLOPs utilisation per rank: the FLOPs of the tokens processed over every rank's peak
 * (each rank does its share: its data rows, its tensor blocks, its pipeline stages). */
double pt_mfu(double flops_per_token, double tokens_per_s, int ranks, double peak_flops);

/* The run report: per parallel dimension the bytes sent and the time blocked, per rank the
 * memory by kind (src/train/report.c). A mark is the counters at a point; print reports the
 * steps since one (collective over the world; rank 0 prints), leaving out the groups of one rank
 * and those that carried nothing. */
typedef struct {
    int64_t step;
    double time;
    int n_groups;
    double bytes[PT_MESH_MAX_GROUPS], wait[PT_MESH_MAX_GROUPS];
} pt_report_mark;
pt_report_mark pt_report_mark_now(const pt_mesh *mesh, int64_t step);
/* What `pentatron report` needs beyond the metrics lines, written by pt_report_print to path
 * (report.json beside them; rank 0, atomically; a failed write is a warning and training goes
 * on): the same figures as the printed report (the steps covered and the total, the layout, per
 * group its bytes and seconds blocked per step, mean and largest over the ranks, per rank its
 * memory by kind) and the pipeline schedule (null without one). */
typedef struct {
    const char *path;
    int64_t total_steps;
    const pt_schedule *sched; /* NULL: no pipeline */
    double head_cost;         /* the split head's cost its HEADs were placed with */
} pt_report_run;
/* run NULL (or its path ""): no report.json. */
void pt_report_print(const pt_mesh *mesh, const pt_report_mark *since, int64_t step,
                     const pt_rank_memory *mem, const pt_report_run *run);

#endif
