/* config.h: the training configuration, its keys, defaults and parsing.
 *
 * Every key is declared once, in the table in src/train/config.c (section, name, type, default,
 * help). Parsing a file, parsing `--section.key=value` overrides and `pentatron train
 * --help-config` all read that table, so the reference cannot drift from the code.
 */
#ifndef PT_CONFIG_H
#define PT_CONFIG_H

#include "pt/core.h"
#include "pt/layout.h"
#include "pt/model.h"

#define PT_PATH_MAX 1024

typedef struct {
    pt_model_config model;
    char init_from[PT_PATH_MAX]; /* model.init_from: a Hugging Face Llama directory */
    char aux_loss_scope[16];     /* model.aux_loss_scope: sequence | micro_batch | global */

    struct {
        char train[PT_PATH_MAX]; /* glob of token shards */
        char sources[4 * PT_PATH_MAX]; /* NAME=GLOB, ...: sources mixed instead of train */
        char weights[512];       /* one weight per source of sources */
        int shuffle;
        char val[PT_PATH_MAX];   /* glob of held-out shards, "" = no evaluation */
        int document_mask;       /* attention within documents (block-causal) */
        int separator;           /* the token that starts each document (-1: unset) */
        int position_restart;    /* with document_mask: rope positions restart per document */
    } data;

    struct {
        int64_t every;  /* evaluate every n steps (0: at the end only) */
        int64_t tokens; /* validation tokens per evaluation (0: all whole global batches) */
    } eval;

    struct {
        int64_t steps;
        int global_batch; /* sequences per optimizer step */
        int micro_batch;  /* sequences per forward/backward */
        int seq_len;
        uint64_t seed;
        char on_nonfinite[8]; /* stop | skip: a step whose loss or gradient norm is not finite */
        int max_skips;        /* skip: stop after this many such steps in a row */
        int threads;      /* 0 = all cores */
        char device[8];   /* cpu | cuda (docs/gpu.md) */
        char gemm[16];    /* onednn | openblas */
        char precision[8];    /* fp32 | bf16 (docs/precision.md) */
        char recompute[16];   /* none | selective | full (pt_recompute) */
        int recompute_layers; /* full: the first n layers of each chunk (0: all) */
        int64_t memory_limit; /* bytes per rank; 0: this host's available memory ÷ its ranks */
    } training;

    struct {
        char backend[8]; /* auto | mpi | nccl: how device memory reaches the network */
    } comm;

    struct {
        float lr, beta1, beta2, eps, weight_decay, grad_clip;
        char schedule[16]; /* constant | cosine | linear | wsd */
        int64_t warmup_steps;
        float min_lr; /* floor of the decay, as a fraction of lr */
        float decay_fraction; /* wsd: the share of the steps that cools down */
        char cooldown[8];     /* wsd: linear | sqrt */
    } optimizer;

    struct {
        int dp, tp, pp, cp, ep; /* degrees; dp = -1: the rest of the world */
        int sp;                 /* sequence parallelism (with tp > 1) */
        char pp_schedule[16];   /* afab | 1f1b | interleaved | zb */
        int pp_virtual;         /* chunks per pipeline rank */
        char cp_layout[16];     /* zigzag | contiguous */
        char pp_layers[256];    /* layers per stage, "" = balanced */
        char pp_head[8];        /* last | split: the head and loss on the last stage, or split
                                   over the pipeline ranks by vocabulary rows */
        char pp_head_rows[256]; /* split: vocabulary rows per stage, "" = balanced */
        int zero;               /* ZeRO stage over the data-parallel group */
        char zero_scope[16];    /* all | node | N: ZeRO's shard group (HSDP: node, N) */
        float bucket_mb;        /* gradient bucket size */
        char grad_reduce[8];    /* fp32 | bf16: the data-parallel reduction's element type */
        int overlap;            /* start buckets during backward (false: all after it) */
        float timeout_s;        /* a collective not done by then aborts the job */
    } parallel;

    struct {
        char dir[PT_PATH_MAX];
        int64_t every; /* 0 = only at the end */
        int keep;      /* last K checkpoints kept */
        int async;     /* written by a thread of their own while training goes on */
        int share_dir; /* dir may hold another run's checkpoints (kept, never pruned) */
        char resume[PT_PATH_MAX]; /* "", "latest" or a checkpoint directory */
        char allow_change[256];   /* what a resumed run may change: "data,seed,..." */
        float lock_timeout_s;     /* another host's lock whose heartbeat is older is stale */
    } checkpoint;

    struct {
        char metrics[PT_PATH_MAX]; /* JSON lines file, "" = none */
        char tensorboard[PT_PATH_MAX]; /* a directory for TensorBoard event files, "" = none */
        int64_t comm_every;        /* communication counts in the metrics every n steps */
        int64_t report_every;      /* the run report every n steps (0: at the end only) */
        char trace[256];           /* a directory for per-rank Chrome traces ("" = none) */
        char trace_steps[32];      /* the steps traced, "A-B" */
        int64_t trace_events;      /* the trace buffer's events per rank */
        int progress;              /* progress bar on a terminal */
        int64_t every;             /* print every n steps */
        char dump_grads[PT_PATH_MAX]; /* write step 1's reduced gradients here (tests) */
    } logging;

    struct {
        int max_new_tokens;
        float temperature;
        int top_k;
        char prompt[PT_PATH_MAX];
        char vocab[PT_PATH_MAX];
    } sample;

    struct { /* read by `pentatron plan` only (docs/plan.md): the system it describes */
        char block[8];       /* llama | gpt: the transformer block planned */
        char attention[16];  /* flash | materialized: scores never stored, or s×s stored */
        char tp_overlap[12]; /* all | backward | none: the tp transfers hidden behind GEMMs */
        char kernels[8];     /* fused | eager: the memory-bound work in fused kernels or op by op */
        char selective[12];  /* attention | op: what training.recompute = selective recomputes */
        int dp_overlap;      /* the gradient reduction overlaps the last backward */
        int pp_overlap;      /* the pipeline's sends move while the ranks compute */
        int pp_scatter_gather; /* without sp: each tp rank sends 1/tp, the receivers gather */
        float headroom;      /* --search: the share of device memory kept free */
        int top;             /* --search: layouts printed */
        int tp_across_nodes; /* --search: tp groups may span nodes */
    } plan;
} pt_config;

void pt_config_defaults(pt_config *c);
/* Reads an INI file over c. Errors name the file, line and key. */
pt_status pt_config_load_file(pt_config *c, const char *path);
/* Applies one "section.key=value" (or key and value separately). */
pt_status pt_config_set(pt_config *c, const char *key, const char *value);
/* Parses argv: --config FILE (first, whatever its position) then --section.key=value or
 * --section.key value overrides in order. Other arguments are errors. */
pt_status pt_config_from_args(pt_config *c, int argc, char **argv);
/* Cross-key checks (batch divisibility, ranges). */
pt_status pt_config_validate(const pt_config *c);
/* The layout the config asks for (its strings point into c), as the trainer builds it and the
 * planner checks it. */
pt_layout_spec pt_config_layout_spec(const pt_config *c);
/* parallel.zero_scope as pt_degrees.zs: 0 all, -1 node, N; 0 for what is none of these (which
 * pt_config_validate refuses). */
int pt_config_zero_scope(const pt_config *c);
/* The steps logging.trace_steps names ("A-B", 1 <= A <= B); PT_ERR_CONFIG otherwise. */
pt_status pt_config_trace_steps(const pt_config *c, int64_t *first, int64_t *last);
/* 1 if the key was set by a file or the command line (not defaulted). */
int pt_config_was_set(const pt_config *c, const char *key);
/* The model of model.init_from: ckpt (read from source, its config.json) into c->model. A key
 * set explicitly (file or command line) that is training-time (max_seq_len, aux_loss_coef,
 * z_loss_coef, capacity_factor, bias_rate, init_std) keeps its value, logged when it differs
 * from the checkpoint's; an explicit architecture key (any other model.* key) must equal the
 * checkpoint's, else PT_ERR_CONFIG naming both values. Keys not set take the checkpoint's. */
pt_status pt_config_merge_model(pt_config *c, const pt_model_config *ckpt, const char *source);
/* The architecture keys (the model.* keys other than the training-time ones above) one by one:
 * the i-th's name, with its value in c as the INI writes it in value; NULL past the last. What a
 * checkpoint records of the model (checkpoint.allow_change = model). */
const char *pt_config_arch_key(const pt_config *c, int i, char *value, size_t cap);
/* Prints every key with its type, default and meaning. */
void pt_config_print_help(FILE *f);
/* Writes the effective configuration as INI (for checkpoints and the log). */
void pt_config_write(const pt_config *c, FILE *f);

#endif
