/* hf_config.h: Hugging Face config.json for LlamaForCausalLM <-> pt_model_config.
 *
 * Reading accepts what transformers' LlamaConfig writes, and refuses (PT_ERR_CONFIG, naming the
 * file and the key) anything this trainer would silently compute differently: rope_scaling,
 * a head_dim other than hidden_size / num_attention_heads, an activation other than silu,
 * attention or MLP biases, attention dropout. Unknown keys are ignored.
 *
 * Key                      field            default
 * vocab_size               vocab_size       required
 * hidden_size              dim              required
 * num_hidden_layers        n_layers         required
 * num_attention_heads      n_heads          required
 * num_key_value_heads      n_kv_heads       num_attention_heads
 * intermediate_size        ffn_dim          required
 * max_position_embeddings  max_seq_len      required
 * rope_theta               rope_theta       10000
 * rms_norm_eps             norm_eps         1e-6
 * tie_word_embeddings      tied_embeddings  false
 * initializer_range        init_std         0.02
 */
#ifndef PT_HF_CONFIG_H
#define PT_HF_CONFIG_H

#include "pt/core.h"
#include "pt/model.h"

/* PT_ERR_IO if unreadable, PT_ERR_FORMAT if not JSON, PT_ERR_CONFIG for a missing, mistyped,
 * out-of-range or unsupported key. */
pt_status pt_hf_config_read(const char *path, pt_model_config *c);

/* Writes a config.json that transformers' LlamaConfig loads (atomically: PATH.tmp, fsync,
 * rename). Floats are written with the fewest digits that read back to the same float32.
 * bos/eos_token_id are 50256 when the vocabulary holds that id, null otherwise. */
pt_status pt_hf_config_write(const char *path, const pt_model_config *c);

/* Which Hugging Face architecture a model is written as (docs/guide.md, "export"): a dense model
 * as LlamaForCausalLM; a mixture of experts shaped like Mixtral (every layer MoE, softmax router,
 * no shared experts) as MixtralForCausalLM, which computes the same function (capacity drops are
 * a training device: Mixtral's inference is dropless); any other MoE as PentatronMoeForCausalLM,
 * Mixtral's keys plus what Mixtral lacks, which model.init_from reads and transformers does not.
 * Returns NULL when transformers has an architecture computing c exactly, else why not. */
const char *pt_hf_unmapped_reason(const pt_model_config *c);

#endif
