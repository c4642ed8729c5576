/* resume.h: what a checkpoint records of the run that saved it, and the check that a run resuming
 * from it is that run.
 *
 * index.json holds, besides the step counters, the run's training.seed ("seed"), data.shuffle
 * ("shuffle"), training.global_batch ("global_batch") and training.seq_len ("seq_len"), and from
 * this module:
 *   "data":  per source (data.train is one source, "train"): its name, glob, normalised weight,
 *            and per shard (sorted, as read) its path, size and content fingerprint: 64-bit
 *            FNV-1a over the size, the first 1,024 bytes (the header) and 8 blocks of 4 KiB
 *            spread evenly over the rest (the whole file when shorter). About 33 KiB read per
 *            shard, cheap at every start; a change that leaves the size, the header and those
 *            blocks alone goes unseen.
 *   "model": every architecture key (pt_config_arch_key) and its value as the INI writes it.
 * Resuming with any of them changed is PT_ERR_CONFIG naming each difference (old → new), unless
 * checkpoint.allow_change lists its name (then a warning): data, seed, shuffle, global_batch,
 * seq_len, model. Shards that moved (other paths, the same sizes and fingerprints) are the same
 * data. A checkpoint without a field (saved before it was recorded) is accepted with a warning
 * that names what could not be checked. Everything else may change freely: the layout
 * (parallel.*, micro_batch), the optimizer, the schedule and training.steps, precision,
 * recomputation, evaluation, logging, and the training-time model keys; a changed
 * training.steps (index.json's "steps") is said, with the learning rate of the next step both
 * ways where the schedule stretches with it. index.json's "run_dir" is the directory training
 * ran in: what train.ini's relative paths are relative to.
 */
#ifndef PT_TRAIN_RESUME_H
#define PT_TRAIN_RESUME_H

#include <jansson.h>

#include "pt/config.h"
#include "pt/optim.h"

enum {
    PT_CHANGE_DATA = 1 << 0,
    PT_CHANGE_SEED = 1 << 1,
    PT_CHANGE_SHUFFLE = 1 << 2,
    PT_CHANGE_GLOBAL_BATCH = 1 << 3,
    PT_CHANGE_SEQ_LEN = 1 << 4,
    PT_CHANGE_MODEL = 1 << 5,
};

/* checkpoint.allow_change ("data, seed, ...", "" = none) as PT_CHANGE_* bits; PT_ERR_CONFIG
 * naming an unknown name and the known ones. */
pt_status pt_resume_parse_allow(const char *list, unsigned *allow);
/* dir/index.json parsed (a regular file, valid JSON; nothing more is checked). */
pt_status pt_resume_load_index(const char *dir, json_t **index);
/* Sets "data" and "model" of a checkpoint index from cfg (reads the shards' fingerprints). */
void pt_resume_record(const pt_config *cfg, json_t *index);
/* The optimizer's settings and learning-rate schedule a run's configuration gives. */
pt_optim_config pt_run_optim_config(const pt_config *cfg);
/* The checkpoint dir's record against cfg (one process reads it: rank 0). PT_ERR_CONFIG with
 * every difference not allowed; allowed ones and unrecorded fields are logged as warnings. */
pt_status pt_resume_check(const char *dir, const pt_config *cfg, unsigned allow);

#endif
