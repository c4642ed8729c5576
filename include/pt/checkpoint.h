/* checkpoint.h: sharded training checkpoints, and weights in Hugging Face layout.
 *
 * A checkpoint is a directory ROOT/step_NNNNNNNN holding
 *   config.json        Hugging Face LlamaConfig of the model
 *   index.json         the global tensors (name, shape, offset in the single-process table), the
 *                      step counters and data order, and per shard file its CRC-32 and the blocks
 *                      [tensor, r0, r1, c0, c1] of global tensors it holds; under
 *                      model.aux_loss_scope = global also the next step's balancing f ("aux_f")
 *   shard-RRRRR-of-WWWWW.safetensors   written by rank RRRRR of WWWWW, in parallel: for each block
 *                      it holds, "params@T@R0@C0", "exp_avg@T@R0@C0", "exp_avg_sq@T@R0@C0" (F32,
 *                      (r1 − r0) × (c1 − c0); a vector is one column)
 *   train.ini          the effective configuration, for people
 * The blocks are the writer's layout (a tensor-parallel slice, a ZeRO shard cut into rows, a
 * whole tensor) but their coordinates are the global tensors', so any layout reads any other's
 * checkpoint: each rank reads the blocks it needs from whichever files hold them. It is written as step_NNNNNNNN.tmp and renamed
 * into place by rank 0 once every rank's file is on disk, so a crash while saving leaves the
 * previous checkpoints intact.
 *
 * Every checkpoint names the run that saved it (index.json "run_id"): a run made at a fresh start
 * makes a new id, a resumed run continues its checkpoint's. Only the newest `keep` of the run's
 * own are kept: another run's checkpoints (one without a run id, saved before they were recorded,
 * counts as another's) and symbolic links are never pruned nor replaced, and nothing is ever
 * removed through a link (a link is removed as itself, its target untouched).
 */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include "pt/comm.h"
#include "pt/config.h"
#include "pt/model.h"
#include "pt/safetensors.h"

/* A block of a global tensor one rank writes: host arrays of (r1 − r0)·(c1 − c0) elements. */
typedef struct {
    int tensor; /* index in the single-process table */
    int64_t r0, r1, c0, c1;
    const float *param, *exp_avg, *exp_avg_sq;
} pt_ckpt_piece;

/* A run's identity: PT_RUN_ID_LEN lower-case hex digits, random. */
#define PT_RUN_ID_LEN 16
void pt_ckpt_new_run_id(char *id /* PT_RUN_ID_LEN + 1 bytes */);
/* The run id a checkpoint directory records into id ("" when none: saved before run ids, or no
 * readable index) and, when step is not NULL, its step (-1 if unreadable). The last error is
 * left as it was. */
void pt_ckpt_identity(const char *dir, char *id /* PT_RUN_ID_LEN + 1 bytes */, int64_t *step);
/* How a run starts: new, resumed from a checkpoint outside checkpoint.dir, or continuing one in
 * it (checkpoint.resume = latest, or a checkpoint of checkpoint.dir). */
typedef enum { PT_RUN_NEW, PT_RUN_RESUMED_ELSEWHERE, PT_RUN_CONTINUED } pt_run_start;
/* Rank 0 at set-up, before step 1: checkpoint.dir = root against the run run_id. PT_ERR_CONFIG,
 * naming the other run(s) and the ways out, when root holds another run's checkpoints and this
 * run does not continue one of root's (unless share: checkpoint.share_dir); or when a step it
 * will save (from < step <= total: every `every`-th, and total) is another run's checkpoint or a
 * link in root, which a save never replaces. Otherwise, with other runs' checkpoints in root, a
 * warning naming them. */
pt_status pt_ckpt_check_dir(const char *root, const char *run_id, pt_run_start start, int share,
                            int64_t from, int64_t total, int64_t every);

/* Collective over `world` (NULL: a single process). Each rank passes the pieces it writes (none
 * is fine); together they must cover every global tensor (m->gtable) once. The checkpoint records
 * run_id (rank 0's); the newest `keep` of that run's own checkpoints in root are kept. */
pt_status pt_ckpt_save(const char *root, int64_t step, const pt_model *m, const pt_ckpt_piece *pieces,
                       int n_pieces, int64_t optimizer_step, const pt_config *cfg, int keep,
                       const char *run_id, pt_comm *world);

/* The same save in three parts, so that the writing of this rank's shard can run on a thread of
 * its own while training goes on (checkpoint.async): begin (collective: rank 0 makes
 * step_N.tmp), write (this rank's shard file and its CRC-32: no communication, no logging; its
 * status and message are kept in the state), finish (collective: the ranks agree, rank 0 learns
 * every rank's blocks and publishes step_N). The pieces' host arrays must stay untouched until
 * write returns. pt_ckpt_save is the three in a row. */
typedef struct {
    char root[PT_PATH_MAX], final_dir[PT_PATH_MAX + 32], tmp_dir[PT_PATH_MAX + 40];
    char run_id[PT_RUN_ID_LEN + 1];
    int64_t step, optimizer_step;
    const pt_ckpt_piece *pieces;
    int n_pieces, rank, size;
    uint32_t crc;
    pt_status write_status;
    char write_error[1024];
} pt_ckpt_save_state;
pt_status pt_ckpt_save_begin(pt_ckpt_save_state *s, const char *root, int64_t step,
                             int64_t optimizer_step, const pt_ckpt_piece *pieces, int n_pieces,
                             const char *run_id, pt_comm *world);
void pt_ckpt_save_write(pt_ckpt_save_state *s);
pt_status pt_ckpt_save_finish(pt_ckpt_save_state *s, const pt_model *m, const pt_config *cfg,
                              int keep, pt_comm *world);

/* An opened checkpoint, checked against the single-process table (names, shapes, offsets, every
 * tensor covered exactly). */
typedef struct pt_ckpt pt_ckpt;
enum { PT_CKPT_PARAMS = 0, PT_CKPT_EXP_AVG, PT_CKPT_EXP_AVG_SQ };
pt_status pt_ckpt_open(pt_ckpt **c, const char *dir, const pt_param_table *global);
/* Rows [r0, r1) × columns [c0, c1) of a global tensor of one kind (PT_CKPT_*) into out (row
 * major); shard files are checked against their CRC-32 when first read. */
pt_status pt_ckpt_read_block(pt_ckpt *c, int kind, int tensor, int64_t r0, int64_t r1, int64_t c0,
                             int64_t c1, float *out);
int64_t pt_ckpt_step(const pt_ckpt *c);
int64_t pt_ckpt_optimizer_step(const pt_ckpt *c);
/* The global balancing scope's f for the step after the checkpoint (index.json "aux_f", written
 * under model.aux_loss_scope = global): 1 and n values into f when it holds n, else 0. */
int pt_ckpt_aux_f(const pt_ckpt *c, double *f, size_t n);
void pt_ckpt_close(pt_ckpt *c);

/* Weights of a Hugging Face Llama directory (model.safetensors, F32 or BF16; every tensor of the
 * table with its exact shape) or of a checkpoint, into a host array of the single-process table
 * (gtable.total elements). */
pt_status pt_ckpt_load_weights_host(const char *dir, const pt_model *m, float *host);
/* The same into the model's parameter buffer (an unsplit model). */
pt_status pt_ckpt_load_weights(const char *dir, pt_model *m);
/* The newest complete checkpoint under root; PT_ERR_IO if none. */
pt_status pt_ckpt_find_latest(const char *root, char *out, size_t cap);
/* Checks a checkpoint without a model: index.json parses as a checkpoint index, and every shard
 * s with s % nparts == part exists and matches its CRC-32 (ranks split the reading; 0, 1: all).
 * The message names the file and what is wrong. */
pt_status pt_ckpt_verify(const char *dir, int part, int nparts);
/* Collective over world (NULL: one process): the newest checkpoint under root that verifies
 * (pt_ckpt_verify, the shards split over the ranks) into out, each newer one skipped with a
 * warning (rank 0) saying why; out = "" when root holds no checkpoint; PT_ERR_CONFIG, the same on
 * every rank, when none verifies. Every shard is read once, over the ranks, before any is loaded. */
pt_status pt_ckpt_find_verified(const char *root, pt_comm *world, char *out, size_t cap);
/* Writes config.json and model.safetensors (the Hugging Face export) into dir, from the model's
 * parameter buffer (an unsplit model; F32) or from a host array of the single-process table,
 * stored as dtype (PT_ST_DTYPE_F32, or PT_ST_DTYPE_BF16: rounded to nearest even). */
pt_status pt_ckpt_export_hf(const char *dir, const pt_model *m);
pt_status pt_ckpt_export_hf_host(const char *dir, const pt_model *m, const float *host,
                                 pt_st_dtype dtype);

#endif
