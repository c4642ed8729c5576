/* checkpoint.h: saving and loading model weights (Hugging Face layout) and training state.
 *
 * A checkpoint is a directory ROOT/step_NNNNNNNN holding
 *   config.json        Hugging Face LlamaConfig (transformers loads the directory as is)
 *   model.safetensors  weights under Hugging Face names, F32
 *   state.safetensors  AdamW moments per tensor ("optimizer.m.<name>", "optimizer.v.<name>"), and
 *                      metadata: step, seed, data order, the effective config, and CRC-32s of
 *                      the weights and of itself, checked on load
 *   train.ini          the effective configuration, for people
 * It is written as step_NNNNNNNN.tmp, every file fsynced, then renamed into place, so a crash
 * while saving leaves the previous checkpoints intact. Only the newest `keep` are kept.
 */
#ifndef PT_CHECKPOINT_H
#define PT_CHECKPOINT_H

#include "pt/config.h"
#include "pt/model.h"
#include "pt/optim.h"

/* The optimizer moments come as host arrays laid out like the table (the trainer gathers them
 * from the ranks that own them), so a checkpoint does not depend on the layout that wrote it. */
pt_status pt_ckpt_save(const char *root, int64_t step, const pt_model *m, const float *moment1,
                       const float *moment2, int64_t optimizer_step, const pt_config *cfg, int keep);
/* Loads weights from a Hugging Face Llama directory or a checkpoint (F32 or BF16). Every tensor
 * of the table must be present with its exact shape. */
pt_status pt_ckpt_load_weights(const char *dir, pt_model *m);
/* Loads weights and optimizer state of a pentatron checkpoint into the model and host arrays
 * (table.total each); *step = steps done. */
pt_status pt_ckpt_load_state(const char *dir, pt_model *m, float *moment1, float *moment2,
                             int64_t *optimizer_step, int64_t *step);
/* The newest complete checkpoint under root; PT_ERR_IO if none. */
pt_status pt_ckpt_find_latest(const char *root, char *out, size_t cap);
/* Writes config.json and model.safetensors (the Hugging Face export) into dir. */
pt_status pt_ckpt_export_hf(const char *dir, const pt_model *m);

#endif
