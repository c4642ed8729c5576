/* config.c: the table of configuration keys, and INI / command-line parsing through libinih. */
#include "pt/config.h"

#include <errno.h>
#include <glob.h>
#include <ini.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pt/data.h" /* pt_mix_parse: data.sources and data.weights */

typedef enum { PT_CFG_INT, PT_CFG_INT64, PT_CFG_U64, PT_CFG_FLOAT, PT_CFG_BOOL, PT_CFG_STR } pt_cfg_type;

typedef struct {
    const char *key;   /* "section.name" */
    pt_cfg_type type;
    size_t offset;     /* into pt_config */
    size_t size;       /* for strings: capacity */
    const char *def;
    const char *choices; /* for strings: "a|b|c", or NULL for free text */
    const char *help;
} pt_cfg_key;

#define PT_K(key, type, field, def, choices, help)                                                \
    { key, type, offsetof(pt_config, field), sizeof(((pt_config *)0)->field), def, choices, help }

static const pt_cfg_key pt_cfg_keys[] = {
    PT_K("model.init_from", PT_CFG_STR, init_from, "", NULL,
         "Hugging Face Llama directory (config.json + safetensors, F32 or BF16) to start from; "
         "its config.json sets the model.* keys not given explicitly (an explicit training-time "
         "key wins, an explicit architecture key must agree: docs/guide.md section 10)"),
    PT_K("model.vocab_size", PT_CFG_INT, model.vocab_size, "50257", NULL, "vocabulary size"),
    PT_K("model.dim", PT_CFG_INT, model.dim, "256", NULL, "hidden size"),
    PT_K("model.n_layers", PT_CFG_INT, model.n_layers, "4", NULL, "number of decoder layers"),
    PT_K("model.n_heads", PT_CFG_INT, model.n_heads, "4", NULL, "attention (query) heads"),
    PT_K("model.n_kv_heads", PT_CFG_INT, model.n_kv_heads, "4", NULL,
         "key/value heads (grouped-query attention); divides n_heads"),
    PT_K("model.ffn_dim", PT_CFG_INT, model.ffn_dim, "688", NULL, "SwiGLU hidden size"),
    PT_K("model.max_seq_len", PT_CFG_INT, model.max_seq_len, "1024", NULL,
         "largest sequence length (rotary table size)"),
    PT_K("model.rope_theta", PT_CFG_FLOAT, model.rope_theta, "10000", NULL, "rotary base"),
    PT_K("model.head_dim", PT_CFG_INT, model.head_dim, "0", NULL,
         "width of an attention head (0 = dim / n_heads; Hugging Face's head_dim)"),
    PT_K("model.rope_factor", PT_CFG_FLOAT, model.rope_factor, "0", NULL,
         "Llama 3 rope scaling (Hugging Face rope_scaling of rope_type llama3): its factor "
         "(0 = no scaling)"),
    PT_K("model.rope_low_freq_factor", PT_CFG_FLOAT, model.rope_low_freq_factor, "1", NULL,
         "Llama 3 rope scaling: wavelengths beyond rope_original_max_seq_len / this are divided "
         "by rope_factor"),
    PT_K("model.rope_high_freq_factor", PT_CFG_FLOAT, model.rope_high_freq_factor, "4", NULL,
         "Llama 3 rope scaling: wavelengths below rope_original_max_seq_len / this are kept"),
    PT_K("model.rope_original_max_seq_len", PT_CFG_INT, model.rope_original_max_seq_len, "8192",
         NULL, "Llama 3 rope scaling: the context length the frequencies were trained for"),
    PT_K("model.norm_eps", PT_CFG_FLOAT, model.norm_eps, "1e-6", NULL, "RMSNorm epsilon"),
    PT_K("model.n_experts", PT_CFG_INT, model.n_experts, "0", NULL,
         "mixture of experts: experts per MoE layer (0 = dense model)"),
    PT_K("model.top_k", PT_CFG_INT, model.top_k, "2", NULL, "experts each token is routed to"),
    PT_K("model.moe_ffn_dim", PT_CFG_INT, model.moe_ffn_dim, "0", NULL,
         "SwiGLU hidden size of an expert (0 = model.ffn_dim)"),
    PT_K("model.moe_every", PT_CFG_INT, model.moe_every, "1", NULL,
         "every n-th layer (from moe_first_dense on) is MoE"),
    PT_K("model.moe_first_dense", PT_CFG_INT, model.moe_first_dense, "0", NULL,
         "the first n layers stay dense"),
    PT_K("model.n_shared_experts", PT_CFG_INT, model.n_shared_experts, "0", NULL,
         "shared experts every token also passes through (one SwiGLU of n × moe_ffn_dim)"),
    PT_K("model.aux_loss_coef", PT_CFG_FLOAT, model.aux_loss_coef, "0.01", NULL,
         "load-balancing loss E·Σ f·P per MoE layer, over model.aux_loss_scope (0 = off)"),
    PT_K("model.aux_loss_scope", PT_CFG_STR, aux_loss_scope, "sequence",
         "sequence|micro_batch|global",
         "the tokens of the balancing loss's f and P: each sequence; each micro-batch (Switch); "
         "global: P over the step's tokens, f the previous step's token-slot shares over every "
         "data rank (uniform at the first step; docs/parallelism.md)"),
    PT_K("model.z_loss_coef", PT_CFG_FLOAT, model.z_loss_coef, "0", NULL,
         "router z-loss: mean logsumexp(logits)² (0 = off)"),
    PT_K("model.capacity_factor", PT_CFG_FLOAT, model.capacity_factor, "0", NULL,
         "MoE: an expert takes at most factor·tokens·top_k/experts token-slots per micro-batch, "
         "the rest dropped (0 = dropless)"),
    PT_K("model.router_sigmoid", PT_CFG_BOOL, model.router_sigmoid, "false", NULL,
         "MoE router: sigmoid scores chosen by score + a per-expert bias (DeepSeek-V3); false: softmax"),
    PT_K("model.bias_rate", PT_CFG_FLOAT, model.bias_rate, "0", NULL,
         "auxiliary-loss-free balancing: after each step each expert's bias moves by this toward "
         "balance (0 = off; with router_sigmoid)"),
    PT_K("model.tied_embeddings", PT_CFG_BOOL, model.tied_embeddings, "false", NULL,
         "output head shares the embedding matrix"),
    PT_K("model.attention_bias", PT_CFG_BOOL, model.attention_bias, "false", NULL,
         "biases on the q, k, v and o projections (Llama's attention_bias)"),
    PT_K("model.qkv_bias", PT_CFG_BOOL, model.qkv_bias, "false", NULL,
         "biases on the q, k and v projections only (Qwen 2; implied by model.attention_bias)"),
    PT_K("model.init_std", PT_CFG_FLOAT, model.init_std, "0.02", NULL,
         "standard deviation of the initial weight matrices"),
    PT_K("data.train", PT_CFG_STR, data.train, "", NULL,
         "glob of token shards (llm.c format), read in sorted name order"),
    PT_K("data.sources", PT_CFG_STR, data.sources, "", NULL,
         "instead of data.train, several sources mixed by data.weights: \"NAME=GLOB, NAME=GLOB, "
         "...\" (names of A-Z a-z 0-9 _ - .; a source that runs out starts its next epoch; "
         "docs/guide.md \"Data mixing\")"),
    PT_K("data.weights", PT_CFG_STR, data.weights, "", NULL,
         "with data.sources: one positive weight per source, in its order, e.g. \"0.7, 0.3\" "
         "(normalised: each source's share of the sequences read)"),
    PT_K("data.shuffle", PT_CFG_BOOL, data.shuffle, "false", NULL,
         "shuffle rows (a deterministic function of training.seed; with data.sources each source "
         "its own order)"),
    PT_K("data.val", PT_CFG_STR, data.val, "", NULL,
         "glob of held-out token shards for evaluation (\"\" = none), read in order, unshuffled"),
    PT_K("data.document_mask", PT_CFG_BOOL, data.document_mask, "false", NULL,
         "attention stays within documents: a token sees only the tokens of its own document, "
         "which starts at a data.separator token (block-causal; docs/guide.md \"Document masking\")"),
    PT_K("data.separator", PT_CFG_INT, data.separator, "-1", NULL,
         "with data.document_mask: the id of the token that starts every document (what prepare "
         "put before each one, e.g. 50256 for GPT-2's <|endoftext|>)"),
    PT_K("data.position_restart", PT_CFG_BOOL, data.position_restart, "false", NULL,
         "with data.document_mask: rope positions count from each document's start, not the "
         "sequence's"),
    PT_K("eval.every", PT_CFG_INT64, eval.every, "0", NULL,
         "with data.val: evaluate every n steps and at the end (0 = only at the end)"),
    PT_K("eval.tokens", PT_CFG_INT64, eval.tokens, "0", NULL,
         "validation tokens per evaluation, rounded up to whole global batches, the same each "
         "time (0 = all of data.val's whole global batches)"),
    PT_K("training.steps", PT_CFG_INT64, training.steps, "100", NULL, "optimizer steps"),
    PT_K("training.global_batch", PT_CFG_INT, training.global_batch, "8", NULL,
         "sequences per optimizer step"),
    PT_K("training.micro_batch", PT_CFG_INT, training.micro_batch, "8", NULL,
         "sequences per forward/backward; global_batch / micro_batch accumulation steps"),
    PT_K("training.seq_len", PT_CFG_INT, training.seq_len, "256", NULL, "tokens per sequence"),
    PT_K("training.seed", PT_CFG_U64, training.seed, "1234", NULL,
         "seed for initialisation and shuffling"),
    PT_K("training.on_nonfinite", PT_CFG_STR, training.on_nonfinite, "stop", "stop|skip",
         "a step whose loss or gradient norm is not finite (NaN or inf, on any rank): stop with a "
         "message; or skip its update (data and learning rate move on, AdamW's step count does "
         "not) and go on (docs/guide.md \"Divergence\")"),
    PT_K("training.max_skips", PT_CFG_INT, training.max_skips, "5", NULL,
         "with on_nonfinite = skip: stop when this many steps in a row were skipped"),
    PT_K("training.threads", PT_CFG_INT, training.threads, "0", NULL,
         "compute threads per process (0 = all cores)"),
    PT_K("training.device", PT_CFG_STR, training.device, "cpu", "cpu|cuda",
         "where the model computes: cpu (the CPU backend, training.threads threads), or cuda (one "
         "GPU per process, the GPU local rank mod the device count; needs a build with the CUDA "
         "toolkit; docs/gpu.md)"),
    PT_K("training.gemm", PT_CFG_STR, training.gemm, "onednn", "onednn|openblas",
         "GEMM library of the CPU backend"),
    PT_K("training.precision", PT_CFG_STR, training.precision, "fp32", "fp32|bf16",
         "fp32; or bf16: fp32 master weights, gradients and AdamW moments, a bf16 copy of the "
         "weights to compute with, bf16 activations, GEMMs in bf16 with fp32 accumulation "
         "(docs/precision.md)"),
    PT_K("training.recompute", PT_CFG_STR, training.recompute, "none", "none|selective|full",
         "activation recomputation: none; selective (the attention core and the SwiGLU activation "
         "are recomputed in backward); full (only each layer's input is kept, the layer is run "
         "again in backward)"),
    PT_K("training.recompute_layers", PT_CFG_INT, training.recompute_layers, "0", NULL,
         "with recompute = full: only the first n layers of each pipeline chunk are recomputed "
         "(0 = all; Megatron's recompute_num_layers)"),
    PT_K("training.memory_limit", PT_CFG_INT64, training.memory_limit, "0", NULL,
         "bytes a rank may use; the trainer refuses to start, printing its need by category, "
         "when it needs more (0 = this host's available memory, cgroup limit included, divided "
         "by the ranks on it; either lowered to the address space left under ulimit -v)"),
    PT_K("comm.backend", PT_CFG_STR, comm.backend, "auto", "auto|mpi|nccl",
         "how the ranks communicate device memory (training.device = cuda): nccl (NCCL, one GPU "
         "per rank), or mpi (MPI over host copies: several ranks may share a GPU); auto = nccl "
         "when training.device = cuda and every rank of a host has a GPU of its own, else mpi. "
         "Host memory always goes over MPI (docs/gpu.md)"),
    PT_K("optimizer.lr", PT_CFG_FLOAT, optimizer.lr, "3e-4", NULL, "peak learning rate"),
    PT_K("optimizer.beta1", PT_CFG_FLOAT, optimizer.beta1, "0.9", NULL, "AdamW beta1"),
    PT_K("optimizer.beta2", PT_CFG_FLOAT, optimizer.beta2, "0.95", NULL, "AdamW beta2"),
    PT_K("optimizer.eps", PT_CFG_FLOAT, optimizer.eps, "1e-8", NULL, "AdamW epsilon"),
    PT_K("optimizer.weight_decay", PT_CFG_FLOAT, optimizer.weight_decay, "0.1", NULL,
         "decoupled weight decay, applied to every matrix (not to norm weights)"),
    PT_K("optimizer.grad_clip", PT_CFG_FLOAT, optimizer.grad_clip, "1.0", NULL,
         "clip the global gradient L2 norm to this (0 = off)"),
    PT_K("optimizer.schedule", PT_CFG_STR, optimizer.schedule, "cosine",
         "constant|cosine|linear|wsd",
         "learning-rate schedule after warmup (wsd: warmup-stable-decay, the peak until the "
         "cooldown of the last decay_fraction of the steps; formulas in docs/guide.md)"),
    PT_K("optimizer.warmup_steps", PT_CFG_INT64, optimizer.warmup_steps, "0", NULL,
         "linear warmup steps"),
    PT_K("optimizer.min_lr", PT_CFG_FLOAT, optimizer.min_lr, "0.1", NULL,
         "floor of the decay, as a fraction of optimizer.lr"),
    PT_K("optimizer.decay_fraction", PT_CFG_FLOAT, optimizer.decay_fraction, "0.2", NULL,
         "wsd: the share of training.steps the cooldown takes, in [0, 1] (the last "
         "round(fraction·steps) steps, after warmup)"),
    PT_K("optimizer.cooldown", PT_CFG_STR, optimizer.cooldown, "linear", "linear|sqrt",
         "wsd: the cooldown's shape, 1 − p (linear) or 1 − √p (sqrt) of its progress p"),
    PT_K("parallel.dp", PT_CFG_INT, parallel.dp, "1", NULL,
         "data-parallel degree (-1 = world size / (tp·pp·cp))"),
    PT_K("parallel.tp", PT_CFG_INT, parallel.tp, "1", NULL,
         "tensor-parallel degree (splits heads, ffn and vocabulary; divides n_heads and ffn_dim)"),
    PT_K("parallel.sp", PT_CFG_BOOL, parallel.sp, "false", NULL,
         "sequence parallelism: norms and residual stream split over the tp ranks along the "
         "sequence (all-gather / reduce-scatter instead of all-reduce)"),
    PT_K("parallel.pp", PT_CFG_INT, parallel.pp, "1", NULL,
         "pipeline-parallel degree (stages of layers; the micro-batches of a step flow through them)"),
    PT_K("parallel.pp_schedule", PT_CFG_STR, parallel.pp_schedule, "1f1b",
         "afab|1f1b|interleaved|zb|dualpipev",
         "pipeline schedule (zb: zero bubble ZB-H1; dualpipev: DeepSeek's DualPipeV, 2 chunks per rank "
         "in a V, micro-batches >= 2 pp)"),
    PT_K("parallel.pp_virtual", PT_CFG_INT, parallel.pp_virtual, "1", NULL,
         "model chunks per pipeline rank (the interleaved schedule: >= 2, any number of micro-batches; "
         "dualpipev always holds 2)"),
    PT_K("parallel.pp_layers", PT_CFG_STR, parallel.pp_layers, "", NULL,
         "layers per stage, pp × chunks counts in stage order, e.g. \"3,4,4,3\" (\"\" = balanced, the "
         "head counting as layers; interleaved: as even as possible, the rest on the middle stages)"),
    PT_K("parallel.pp_head", PT_CFG_STR, parallel.pp_head, "last", "last|split",
         "the head and loss: on the last stage, or split over the pipeline ranks by vocabulary rows "
         "(each stage a share that balances the stages; afab, 1f1b or zb; untied embeddings)"),
    PT_K("parallel.pp_head_rows", PT_CFG_STR, parallel.pp_head_rows, "", NULL,
         "pp_head = split: the head's vocabulary rows per stage, e.g. \"5000,3192\" summing to "
         "vocab_size (\"\" = balanced by cost)"),
    PT_K("parallel.cp", PT_CFG_INT, parallel.cp, "1", NULL,
         "context-parallel degree: each sequence split over cp ranks, attention by ring"),
    PT_K("parallel.cp_layout", PT_CFG_STR, parallel.cp_layout, "zigzag", "zigzag|contiguous",
         "zigzag: 2·cp chunks, rank i holding i and 2·cp−1−i (balanced causal work)"),
    PT_K("parallel.ep", PT_CFG_INT, parallel.ep, "1", NULL,
         "expert-parallel degree (divides dp·cp; reuses those ranks)"),
    PT_K("parallel.zero", PT_CFG_INT, parallel.zero, "0", NULL,
         "ZeRO stage over the data-parallel group: 0 replicated, 1 optimizer state sharded, 2 "
         "gradients too, 3 parameters too (gathered layer by layer)"),
    PT_K("parallel.zero_scope", PT_CFG_STR, parallel.zero_scope, "all", NULL,
         "the ranks ZeRO shards over (HSDP: sharded within the group, replicated across "
         "groups): all (the data-parallel group), node (the data ranks on each host) or N (groups "
         "of N data ranks, N dividing dp; our addition); ignored with zero = 0 "
         "(docs/parallelism.md, HSDP)"),
    PT_K("parallel.bucket_mb", PT_CFG_FLOAT, parallel.bucket_mb, "0", NULL,
         "gradient bucket size in MiB; each bucket is reduced as soon as backward finishes it (0 = "
         "auto: an eighth of the gradients, 1 to 25 MiB)"),
    PT_K("parallel.grad_reduce", PT_CFG_STR, parallel.grad_reduce, "fp32", "fp32|bf16",
         "element type of the data-parallel gradient reduction: fp32, or bf16 (each bucket's fp32 "
         "gradients rounded, summed in bf16, converted back; half the bytes; ZeRO-0 to 2)"),
    PT_K("parallel.overlap", PT_CFG_BOOL, parallel.overlap, "true", NULL,
         "start each gradient bucket's reduction during backward, and each ring-attention "
         "transfer before the block it follows is computed (false: after, to measure how much "
         "communication the overlap hides)"),
    PT_K("parallel.timeout_s", PT_CFG_FLOAT, parallel.timeout_s, "300", NULL,
         "a collective not complete after this many seconds aborts the job (0 = never)"),
    PT_K("checkpoint.dir", PT_CFG_STR, checkpoint.dir, "", NULL,
         "directory for checkpoints (\"\" = none)"),
    PT_K("checkpoint.every", PT_CFG_INT64, checkpoint.every, "0", NULL,
         "save every n steps (0 = only at the end)"),
    PT_K("checkpoint.keep", PT_CFG_INT, checkpoint.keep, "2", NULL,
         "keep the last K checkpoints of this run (another run's and symbolic links are never "
         "pruned)"),
    PT_K("checkpoint.async", PT_CFG_BOOL, checkpoint.async, "false", NULL,
         "copy the state to host memory at the step and write it on a thread of its own while "
         "training goes on; published once every rank has written (docs/guide.md \"Asynchronous "
         "checkpoints\"); the last step's is written at once"),
    PT_K("checkpoint.resume", PT_CFG_STR, checkpoint.resume, "", NULL,
         "resume from \"latest\" (the newest checkpoint in checkpoint.dir whose checksums "
         "verify) or a checkpoint directory"),
    PT_K("checkpoint.share_dir", PT_CFG_BOOL, checkpoint.share_dir, "false", NULL,
         "let this run save into a checkpoint.dir that holds another run's checkpoints (without "
         "it a run that does not continue one of them is refused at set-up); theirs are kept, "
         "never pruned or replaced (docs/guide.md \"Whose checkpoints\")"),
    PT_K("checkpoint.allow_change", PT_CFG_STR, checkpoint.allow_change, "", NULL,
         "what a resumed run may change from the run that saved the checkpoint (else an error "
         "naming the difference; listed: a warning): data, seed, shuffle, global_batch, seq_len, "
         "model, comma-separated (docs/guide.md \"What is checked on resume\")"),
    PT_K("checkpoint.lock_timeout_s", PT_CFG_FLOAT, checkpoint.lock_timeout_s, "600", NULL,
         "checkpoint.dir is locked by the run using it; a lock held from another host whose "
         "heartbeat (the lock file's mtime, refreshed every timeout/10 s) is older than this is "
         "stale and taken over"),
    PT_K("logging.metrics", PT_CFG_STR, logging.metrics, "", NULL,
         "append one JSON object per step to this file (a regular file: a FIFO or a device "
         "such as /dev/null is refused; \"\" = none)"),
    PT_K("logging.tensorboard", PT_CFG_STR, logging.tensorboard, "", NULL,
         "a directory (made if missing) where rank 0 writes a TensorBoard event file "
         "(events.out.tfevents.<time>.<host>.<pid>, a new one per run and per resume): every "
         "scalar of the step's log line and metrics, flushed each step (tags in docs/guide.md, "
         "\"TensorBoard\"; \"\" = none)"),
    PT_K("logging.comm_every", PT_CFG_INT64, logging.comm_every, "1", NULL,
         "every n steps, the metrics and the TensorBoard events add this rank's communication and "
         "memory over those steps"),
    PT_K("logging.report_every", PT_CFG_INT64, logging.report_every, "0", NULL,
         "the run report (communication per parallel dimension, memory per rank) every n steps; "
         "it is always printed at the end"),
    PT_K("logging.trace", PT_CFG_STR, logging.trace, "", NULL,
         "a directory where each rank writes a Chrome/Perfetto trace of logging.trace_steps "
         "(trace-rankR.json: computation spans, waits, every communication; pentatron trace merge "
         "joins them; \"\" = none)"),
    PT_K("logging.trace_steps", PT_CFG_STR, logging.trace_steps, "2-3", NULL,
         "the steps traced, \"A-B\" (1-based, inclusive)"),
    PT_K("logging.trace_events", PT_CFG_INT64, logging.trace_events, "1000000", NULL,
         "the trace buffer per rank, in events (~80 bytes each, made at start); beyond it events "
         "are dropped and counted"),
    PT_K("logging.progress", PT_CFG_BOOL, logging.progress, "true", NULL,
         "between logged steps, a progress line updated in place (terminal only)"),
    PT_K("logging.every", PT_CFG_INT64, logging.every, "1", NULL, "print every n steps"),
    PT_K("logging.dump_grads", PT_CFG_STR, logging.dump_grads, "", NULL,
         "write the first step's reduced gradients (before clipping) to this safetensors file"),
    PT_K("sample.max_new_tokens", PT_CFG_INT, sample.max_new_tokens, "64", NULL,
         "tokens generated for the sample after training"),
    PT_K("sample.temperature", PT_CFG_FLOAT, sample.temperature, "0", NULL,
         "sampling temperature (0 = greedy)"),
    PT_K("sample.top_k", PT_CFG_INT, sample.top_k, "0", NULL, "sample from the k most likely (0 = all)"),
    PT_K("sample.prompt", PT_CFG_STR, sample.prompt, "", NULL,
         "prompt of the sample printed at the end of training (\"\" = none)"),
    PT_K("sample.vocab", PT_CFG_STR, sample.vocab, "", NULL,
         "directory with encoder.json and vocab.bpe for the sample"),
    PT_K("plan.block", PT_CFG_STR, plan.block, "llama", "llama|gpt",
         "pentatron plan: the block planned: llama (what pentatron trains) or gpt (LayerNorm, "
         "multi-head attention, a 4h GeLU MLP with biases, learned positions: the published runs' "
         "models; train refuses gpt)"),
    PT_K("plan.attention", PT_CFG_STR, plan.attention, "flash", "flash|materialized",
         "pentatron plan: flash (pentatron's: scores never stored, causal half computed) or "
         "materialized (the s x s scores computed whole, stored and soft-maxed in memory, as "
         "Megatron-LM in 2022; train refuses it)"),
    PT_K("plan.tp_overlap", PT_CFG_STR, plan.tp_overlap, "all", "all|backward|none",
         "pentatron plan: the tensor-parallel transfers that hide behind a GEMM: all (pentatron "
         "with sp), backward only (Megatron-LM 2022: the backward's behind the weight-gradient "
         "GEMMs) or none"),
    PT_K("plan.kernels", PT_CFG_STR, plan.kernels, "fused", "fused|eager",
         "pentatron plan: the memory-bound work (norms, rope, activations, the loss, the "
         "optimizer) in fused kernels (pentatron's, Megatron-LM's) or op by op as PyTorch runs "
         "it without torch.compile (torchtitan's RMSNorm in fp32 steps, rope through complex "
         "numbers, foreach AdamW)"),
    PT_K("plan.selective", PT_CFG_STR, plan.selective, "attention", "attention|op",
         "pentatron plan: what training.recompute = selective recomputes: attention (pentatron's "
         "and Megatron-LM's: the attention core, and pentatron's SwiGLU product) or op "
         "(torchtitan's per-op policy: every second matmul of a block and all the memory-bound "
         "work, the attention's output kept); the memory planned is pentatron's selective"),
    PT_K("plan.dp_overlap", PT_CFG_BOOL, plan.dp_overlap, "true", NULL,
         "pentatron plan: the gradient reduction overlaps the last micro-batch's backward "
         "(parallel.overlap; Megatron-LM 2022: false)"),
    PT_K("plan.pp_overlap", PT_CFG_BOOL, plan.pp_overlap, "true", NULL,
         "pentatron plan: the pipeline's transfers move while the ranks compute (pentatron, "
         "NCCL); false: each send blocks until its data is in (Megatron-LM until 2022: "
         "batch_isend_irecv, wait, then torch.cuda.synchronize)"),
    PT_K("plan.pp_scatter_gather", PT_CFG_BOOL, plan.pp_scatter_gather, "false", NULL,
         "pentatron plan: without sequence parallelism each tensor-parallel rank sends its 1/tp "
         "of a stage's activations and the receiving group all-gathers them (Megatron-LM's "
         "scatter_gather_tensors_in_pipeline); pentatron sends them whole"),
    PT_K("plan.headroom", PT_CFG_FLOAT, plan.headroom, "0.1", NULL,
         "pentatron plan --search: the share of each device's memory kept free (allocator "
         "fragmentation, runtime, libraries)"),
    PT_K("plan.top", PT_CFG_INT, plan.top, "5", NULL, "pentatron plan --search: layouts printed"),
    PT_K("plan.tp_across_nodes", PT_CFG_BOOL, plan.tp_across_nodes, "false", NULL,
         "pentatron plan --search: let a tensor-parallel group span nodes"),
};
#undef PT_K

#define PT_N_KEYS (sizeof pt_cfg_keys / sizeof pt_cfg_keys[0])

/* Which keys were set explicitly; one bit per key, kept outside pt_config (a process has one). */
static unsigned char pt_cfg_set_flags[PT_N_KEYS];

static const pt_cfg_key *pt_cfg_find(const char *key) {
    for (size_t i = 0; i < PT_N_KEYS; i++)
        if (strcmp(pt_cfg_keys[i].key, key) == 0) return &pt_cfg_keys[i];
    return NULL;
}

static pt_status pt_cfg_apply(pt_config *c, const pt_cfg_key *k, const char *raw) {
    char val[4 * PT_PATH_MAX]; /* the longest key (data.sources) */
    size_t len = strlen(raw);
    /* strings may be quoted */
    int quoted = len >= 2 && (raw[0] == '"' || raw[0] == '\'') && raw[len - 1] == raw[0];
    if (quoted) raw++, len -= 2;
    /* never truncated: a cut path would send a checkpoint elsewhere (hostile: length checked) */
    size_t cap = k->type == PT_CFG_STR ? k->size : sizeof val;
    if (len >= cap && k->choices) /* too long for any of its choices */
        return pt_errorf(PT_ERR_CONFIG, "%s: expected one of %s, got \"%.*s%s\"", k->key,
                         k->choices, len > 64 ? 64 : (int)len, raw, len > 64 ? "..." : "");
    if (len >= cap)
        return pt_errorf(PT_ERR_CONFIG, "%s: value of %zu characters, longer than the %zu allowed",
                         k->key, len, cap - 1);
    memcpy(val, raw, len);
    val[len] = 0;
    void *dst = (char *)c + k->offset;
    char *end = NULL;
    errno = 0;
    switch (k->type) {
    case PT_CFG_INT: {
        long v = strtol(val, &end, 10);
        if (!*val || *end || errno || v < -2147483647L || v > 2147483647L)
            return pt_errorf(PT_ERR_CONFIG, "%s: expected an integer, got \"%s\"", k->key, val);
        *(int *)dst = (int)v;
        break;
    }
    case PT_CFG_INT64: {
        long long v = strtoll(val, &end, 10);
        if (!*val || *end || errno)
            return pt_errorf(PT_ERR_CONFIG, "%s: expected an integer, got \"%s\"", k->key, val);
        *(int64_t *)dst = v;
        break;
    }
    case PT_CFG_U64: {
        unsigned long long v = strtoull(val, &end, 10);
        if (!*val || *end || errno || val[0] == '-')
            return pt_errorf(PT_ERR_CONFIG, "%s: expected a non-negative integer, got \"%s\"",
                             k->key, val);
        *(uint64_t *)dst = v;
        break;
    }
    case PT_CFG_FLOAT: {
        double v = strtod(val, &end);
        if (!*val || *end || errno || !isfinite(v))
            return pt_errorf(PT_ERR_CONFIG, "%s: expected a number, got \"%s\"", k->key, val);
        if (!isfinite((float)v)) /* finite in double, infinite as the float it is kept in */
            return pt_errorf(PT_ERR_CONFIG, "%s: %s is beyond a float's range (±3.4e38)", k->key,
                             val);
        *(float *)dst = (float)v;
        break;
    }
    case PT_CFG_BOOL:
        if (!strcmp(val, "true") || !strcmp(val, "1") || !strcmp(val, "yes") || !strcmp(val, "on"))
            *(int *)dst = 1;
        else if (!strcmp(val, "false") || !strcmp(val, "0") || !strcmp(val, "no") ||
                 !strcmp(val, "off"))
            *(int *)dst = 0;
        else
            return pt_errorf(PT_ERR_CONFIG, "%s: expected true or false, got \"%s\"", k->key, val);
        break;
    case PT_CFG_STR:
        if (k->choices) {
            /* the value must be one of "a|b|c" */
            int ok = 0;
            const char *p = k->choices;
            size_t vl = strlen(val);
            while (*p) {
                const char *bar = strchr(p, '|');
                size_t n = bar ? (size_t)(bar - p) : strlen(p);
                if (n == vl && !strncmp(p, val, n)) ok = 1;
                p += n + (bar ? 1 : 0);
            }
            if (!ok)
                return pt_errorf(PT_ERR_CONFIG, "%s: expected one of %s, got \"%s\"", k->key,
                                 k->choices, val);
        }
        memcpy(dst, val, len + 1);
        break;
    }
    return PT_OK;
}

void pt_config_defaults(pt_config *c) {
    memset(c, 0, sizeof *c);
    memset(pt_cfg_set_flags, 0, sizeof pt_cfg_set_flags);
    for (size_t i = 0; i < PT_N_KEYS; i++) {
        pt_status st = pt_cfg_apply(c, &pt_cfg_keys[i], pt_cfg_keys[i].def);
        PT_ASSERTF(st == PT_OK, "bad default for %s", pt_cfg_keys[i].key);
    }
}

pt_status pt_config_set(pt_config *c, const char *key, const char *value) {
    const pt_cfg_key *k = pt_cfg_find(key);
    if (!k) return pt_errorf(PT_ERR_CONFIG, "unknown config key \"%s\" (see --help-config)", key);
    PT_TRY(pt_cfg_apply(c, k, value));
    pt_cfg_set_flags[k - pt_cfg_keys] = 1;
    return PT_OK;
}

int pt_config_was_set(const pt_config *c, const char *key) {
    (void)c;
    const pt_cfg_key *k = pt_cfg_find(key);
    return k ? pt_cfg_set_flags[k - pt_cfg_keys] : 0;
}

/* The model.* keys a checkpoint's config.json does not decide: how the model is trained, not
 * what it computes. Given explicitly they win over model.init_from; every other model.* key is
 * architecture, which an explicit value may repeat but not contradict. */
static const char *const pt_cfg_training_keys[] = {
    "model.max_seq_len", "model.aux_loss_coef", "model.z_loss_coef", "model.capacity_factor",
    "model.bias_rate",   "model.init_std",     "model.aux_loss_scope",
};

static int pt_cfg_is_training_key(const char *key) {
    for (size_t i = 0; i < sizeof pt_cfg_training_keys / sizeof *pt_cfg_training_keys; i++)
        if (!strcmp(pt_cfg_training_keys[i], key)) return 1;
    return 0;
}

/* A key's value at v (int, float or bool) as the INI would write it. */
static void pt_cfg_format(const pt_cfg_key *k, const void *v, char *buf, size_t cap) {
    switch (k->type) {
    case PT_CFG_INT: snprintf(buf, cap, "%d", *(const int *)v); break;
    case PT_CFG_FLOAT: snprintf(buf, cap, "%g", (double)*(const float *)v); break;
    case PT_CFG_BOOL: snprintf(buf, cap, "%s", *(const int *)v ? "true" : "false"); break;
    default: PT_ASSERTF(0, "%s: not a model key type", k->key);
    }
}

const char *pt_config_arch_key(const pt_config *c, int i, char *value, size_t cap) {
    size_t lo = offsetof(pt_config, model), hi = lo + sizeof(pt_model_config);
    for (size_t k = 0; k < PT_N_KEYS; k++) {
        const pt_cfg_key *key = &pt_cfg_keys[k];
        if (key->offset < lo || key->offset >= hi || pt_cfg_is_training_key(key->key) || i-- > 0)
            continue;
        const void *v = (const char *)c + key->offset;
        if (key->type == PT_CFG_FLOAT) /* every digit a float has: a change is a change */
            snprintf(value, cap, "%.9g", (double)*(const float *)v);
        else
            pt_cfg_format(key, v, value, cap);
        return key->key;
    }
    return NULL;
}

pt_status pt_config_merge_model(pt_config *c, const pt_model_config *ckpt, const char *source) {
    /* the checkpoint's model (fields without a key too), then the explicit keys over it */
    pt_model_config merged = *ckpt;
    size_t lo = offsetof(pt_config, model), hi = lo + sizeof(pt_model_config);
    for (size_t i = 0; i < PT_N_KEYS; i++) {
        const pt_cfg_key *k = &pt_cfg_keys[i];
        if (k->offset < lo || k->offset >= hi || !pt_cfg_set_flags[i]) continue;
        const void *mine = (const char *)c + k->offset;
        void *theirs = (char *)&merged + (k->offset - lo);
        if (!memcmp(mine, theirs, k->size)) continue;
        char a[64], b[64];
        pt_cfg_format(k, mine, a, sizeof a);
        pt_cfg_format(k, theirs, b, sizeof b);
        if (!pt_cfg_is_training_key(k->key))
            return pt_errorf(PT_ERR_CONFIG,
                             "%s = %s (explicit) contradicts the checkpoint's %s (%s): an "
                             "architecture key must match model.init_from's",
                             k->key, a, b, source);
        pt_log_info("%s = %s (explicit) overrides the checkpoint's %s", k->key, a, b);
        memcpy(theirs, mine, k->size);
    }
    c->model = merged;
    return PT_OK;
}

typedef struct {
    pt_config *c;
    const char *path;
    pt_status status;
    char msg[1024];
} pt_ini_state;

static int pt_ini_handler(void *user, const char *section, const char *name, const char *value) {
    pt_ini_state *s = user;
    if (s->status != PT_OK) return 0;
    char key[256];
    snprintf(key, sizeof key, "%s.%s", section, name);
    pt_status st = pt_config_set(s->c, key, value);
    if (st != PT_OK) {
        s->status = st;
        snprintf(s->msg, sizeof s->msg, "%s", pt_last_error());
        return 0;
    }
    return 1;
}

pt_status pt_config_load_file(pt_config *c, const char *path) {
    pt_ini_state s = {.c = c, .path = path, .status = PT_OK};
    /* a directory would read as empty, /dev/zero or a FIFO would never end */
    int fd;
    PT_TRY(pt_open_regular(path, "config file", &fd));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "%s: cannot open config file: %s", path, strerror(errno));
    }
    int rc = ini_parse_file(f, pt_ini_handler, &s);
    fclose(f);
    if (rc == -2) return pt_errorf(PT_ERR_MEMORY, "%s: out of memory parsing", path);
    if (rc > 0) {
        if (s.status != PT_OK) return pt_errorf(s.status, "%s:%d: %s", path, rc, s.msg);
        return pt_errorf(PT_ERR_CONFIG, "%s:%d: syntax error (expected [section] or key = value)",
                         path, rc);
    }
    return PT_OK;
}

static int pt_path_matches(const char *pattern) {
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g), n = rc == 0 ? (int)g.gl_pathc : 0;
    if (rc == 0) globfree(&g);
    return n > 0;
}

/* A checkpoint's train.ini names on its first line the directory training ran in (checkpoint.c).
 * Started from elsewhere (`train --config CKPT/train.ini`), its relative inputs that match nothing
 * here but match there are taken from there, and the log says so: the data globs, sample.vocab
 * and model.init_from. Outputs (checkpoint.dir, logging.*) stay where the command is run. */
static void pt_config_inputs_from_run_dir(pt_config *c, const char *path) {
    static const char pre[] = "# relative paths below are relative to ",
                      post[] = ", the directory training ran in";
    char line[PT_PATH_MAX + 128];
    FILE *f = fopen(path, "r");
    if (!f) return;
    int got = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    char *dir = line + sizeof pre - 1, *end = got ? strstr(line, post) : NULL;
    if (!end || strncmp(line, pre, sizeof pre - 1)) return;
    *end = 0;
    static const char *keys[] = {"data.train", "data.val", "sample.vocab", "model.init_from"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const pt_cfg_key *k = pt_cfg_find(keys[i]);
        char *v = (char *)c + k->offset, there[2 * PT_PATH_MAX];
        if (!v[0] || v[0] == '/' || pt_path_matches(v)) continue;
        int n = snprintf(there, sizeof there, "%s/%s", dir, v);
        if (n < 0 || (size_t)n >= k->size || !pt_path_matches(there)) continue;
        pt_log_info("config: %s = \"%s\" matches nothing here; taken from %s, where the run of %s "
                    "ran", keys[i], v, dir, path);
        memcpy(v, there, (size_t)n + 1);
    }
}

pt_status pt_config_from_args(pt_config *c, int argc, char **argv) {
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--config")) {
            if (i + 1 >= argc) return pt_errorf(PT_ERR_CONFIG, "--config needs a file");
            PT_TRY(pt_config_load_file(c, argv[i + 1]));
            pt_config_inputs_from_run_dir(c, argv[i + 1]);
        }
    }
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || !strchr(a, '.'))
            return pt_errorf(PT_ERR_CONFIG, "unexpected argument \"%s\" (expected --section.key=value)", a);
        const char *eq = strchr(a, '=');
        char key[256];
        if (eq) {
            snprintf(key, sizeof key, "%.*s", (int)(eq - a - 2), a + 2);
            PT_TRY(pt_config_set(c, key, eq + 1));
        } else {
            if (i + 1 >= argc) return pt_errorf(PT_ERR_CONFIG, "%s needs a value", a);
            snprintf(key, sizeof key, "%s", a + 2);
            PT_TRY(pt_config_set(c, key, argv[++i]));
        }
    }
    return PT_OK;
}

pt_status pt_config_trace_steps(const pt_config *c, int64_t *first, int64_t *last) {
    long long a, b;
    char tail;
    if (sscanf(c->logging.trace_steps, "%lld-%lld%c", &a, &b, &tail) != 2 || a < 1 || b < a)
        return pt_errorf(PT_ERR_CONFIG, "logging.trace_steps = \"%s\": expected \"A-B\" with 1 <= A <= B "
                         "(the steps traced, e.g. \"2-3\")", c->logging.trace_steps);
    *first = a, *last = b;
    return PT_OK;
}

pt_status pt_config_validate(const pt_config *c) {
    const typeof(c->training) *t = &c->training;
    if (t->steps < 0) return pt_errorf(PT_ERR_CONFIG, "training.steps must be >= 0");
    if (t->global_batch <= 0) return pt_errorf(PT_ERR_CONFIG, "training.global_batch must be > 0");
    if (t->micro_batch <= 0) return pt_errorf(PT_ERR_CONFIG, "training.micro_batch must be > 0");
    if (t->seq_len <= 0) return pt_errorf(PT_ERR_CONFIG, "training.seq_len must be > 0");
    if (t->threads < 0) return pt_errorf(PT_ERR_CONFIG, "training.threads must be >= 0");
    if (t->threads > pt_max_threads())
        return pt_errorf(PT_ERR_CONFIG, "training.threads = %d: at most %d here (4 × the cores "
                         "this process may run on; 0 = one per core)", t->threads, pt_max_threads());
    if (t->recompute_layers < 0)
        return pt_errorf(PT_ERR_CONFIG, "training.recompute_layers must be >= 0");
    if (t->memory_limit < 0) return pt_errorf(PT_ERR_CONFIG, "training.memory_limit must be >= 0");
    if (t->global_batch % t->micro_batch != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "training.global_batch (%d) must be divisible by training.micro_batch (%d)",
                         t->global_batch, t->micro_batch);
    const typeof(c->optimizer) *o = &c->optimizer;
    if (!(o->lr >= 0)) return pt_errorf(PT_ERR_CONFIG, "optimizer.lr must be >= 0");
    if (!(o->beta1 >= 0 && o->beta1 < 1))
        return pt_errorf(PT_ERR_CONFIG, "optimizer.beta1 must be in [0, 1)");
    if (!(o->beta2 >= 0 && o->beta2 < 1))
        return pt_errorf(PT_ERR_CONFIG, "optimizer.beta2 must be in [0, 1)");
    if (!(o->eps > 0)) return pt_errorf(PT_ERR_CONFIG, "optimizer.eps must be > 0");
    if (!(o->weight_decay >= 0)) return pt_errorf(PT_ERR_CONFIG, "optimizer.weight_decay must be >= 0");
    if (!(o->grad_clip >= 0)) return pt_errorf(PT_ERR_CONFIG, "optimizer.grad_clip must be >= 0");
    if (o->warmup_steps < 0) return pt_errorf(PT_ERR_CONFIG, "optimizer.warmup_steps must be >= 0");
    if (!(o->min_lr >= 0 && o->min_lr <= 1))
        return pt_errorf(PT_ERR_CONFIG, "optimizer.min_lr must be in [0, 1] (a fraction of lr)");
    if (!(o->decay_fraction >= 0 && o->decay_fraction <= 1))
        return pt_errorf(PT_ERR_CONFIG, "optimizer.decay_fraction = %g: must be in [0, 1] (the "
                         "share of training.steps the wsd cooldown takes)", (double)o->decay_fraction);
    if (strcmp(o->schedule, "wsd") != 0 && (pt_config_was_set(c, "optimizer.decay_fraction") ||
                                            pt_config_was_set(c, "optimizer.cooldown")))
        return pt_errorf(PT_ERR_CONFIG, "optimizer.decay_fraction and optimizer.cooldown apply to "
                         "optimizer.schedule = wsd (the schedule is %s)", o->schedule);
    const typeof(c->parallel) *p = &c->parallel;
    if (p->dp == 0 || p->dp < -1)
        return pt_errorf(PT_ERR_CONFIG, "parallel.dp must be >= 1 or -1 (got %d)", p->dp);
    if (p->tp < 1 || p->pp < 1 || p->cp < 1 || p->ep < 1)
        return pt_errorf(PT_ERR_CONFIG, "parallel.tp, pp, cp and ep must be >= 1");
    if (p->pp_virtual < 1) return pt_errorf(PT_ERR_CONFIG, "parallel.pp_virtual must be >= 1");
    if (p->zero < 0 || p->zero > 3)
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero = %d: the stages are 0, 1, 2 and 3", p->zero);
    if (!(p->bucket_mb >= 0)) return pt_errorf(PT_ERR_CONFIG, "parallel.bucket_mb must be >= 0 (0: auto)");
    if (pt_config_zero_scope(c) == 0 && strcmp(p->zero_scope, "all"))
        return pt_errorf(PT_ERR_CONFIG, "parallel.zero_scope = \"%s\": expected all, node or a "
                         "number of data ranks N >= 1 that divides parallel.dp", p->zero_scope);
    if (!(p->timeout_s >= 0)) return pt_errorf(PT_ERR_CONFIG, "parallel.timeout_s must be >= 0");
    if (c->data.train[0] && c->data.sources[0])
        return pt_errorf(PT_ERR_CONFIG, "data.train and data.sources are mutually exclusive: give "
                         "one glob as data.train, or several sources as data.sources (an empty "
                         "--data.train= clears one set in the INI file)");
    if (c->data.weights[0] && !c->data.sources[0])
        return pt_errorf(PT_ERR_CONFIG, "data.weights needs data.sources (the sources it weighs)");
    if (c->data.sources[0]) {
        pt_mix_spec spec;
        pt_status st = pt_mix_parse(c->data.sources, c->data.weights, &spec);
        pt_mix_spec_free(&spec);
        PT_TRY(st);
    }
    if (c->eval.every < 0) return pt_errorf(PT_ERR_CONFIG, "eval.every must be >= 0");
    if (c->training.max_skips < 1)
        return pt_errorf(PT_ERR_CONFIG, "training.max_skips must be >= 1 (got %d)", c->training.max_skips);
    if (c->eval.tokens < 0) return pt_errorf(PT_ERR_CONFIG, "eval.tokens must be >= 0");
    if (!c->data.val[0] && (pt_config_was_set(c, "eval.every") || pt_config_was_set(c, "eval.tokens")))
        return pt_errorf(PT_ERR_CONFIG, "eval.every and eval.tokens need data.val (the held-out "
                         "shards to evaluate on)");
    if (c->data.document_mask && c->data.separator < 0) /* < vocab_size: pt_trainer_init */
        return pt_errorf(PT_ERR_CONFIG, "data.document_mask needs data.separator, the id of the token "
                         "that starts each document (got %d)", c->data.separator);
    if (!c->data.document_mask && (pt_config_was_set(c, "data.separator") ||
                                   pt_config_was_set(c, "data.position_restart")))
        return pt_errorf(PT_ERR_CONFIG, "data.separator and data.position_restart need "
                         "data.document_mask = true");
    if (c->checkpoint.every < 0) return pt_errorf(PT_ERR_CONFIG, "checkpoint.every must be >= 0");
    if (c->checkpoint.keep < 1) return pt_errorf(PT_ERR_CONFIG, "checkpoint.keep must be >= 1");
    if (!(c->checkpoint.lock_timeout_s > 0))
        return pt_errorf(PT_ERR_CONFIG, "checkpoint.lock_timeout_s must be > 0");
    if (c->checkpoint.resume[0] && !c->checkpoint.dir[0] && !strcmp(c->checkpoint.resume, "latest"))
        return pt_errorf(PT_ERR_CONFIG, "checkpoint.resume = latest needs checkpoint.dir");
    if (c->checkpoint.share_dir && !strcmp(c->checkpoint.resume, "latest")) /* whose latest? */
        return pt_errorf(PT_ERR_CONFIG, "checkpoint.share_dir = true and checkpoint.resume = latest: "
                         "latest is the newest checkpoint in checkpoint.dir, whichever run saved "
                         "it; name the checkpoint to resume (checkpoint.resume = DIR), or start a "
                         "new run without checkpoint.resume");
    if (c->logging.every < 1) return pt_errorf(PT_ERR_CONFIG, "logging.every must be >= 1");
    if (c->logging.comm_every < 1) return pt_errorf(PT_ERR_CONFIG, "logging.comm_every must be >= 1");
    if (c->logging.report_every < 0)
        return pt_errorf(PT_ERR_CONFIG, "logging.report_every must be >= 0");
    int64_t ta, tb;
    PT_TRY(pt_config_trace_steps(c, &ta, &tb));
    if (c->logging.trace_events < 1000 || c->logging.trace_events > ((int64_t)1 << 30))
        return pt_errorf(PT_ERR_CONFIG, "logging.trace_events = %lld: expected 1000 to 2^30",
                         (long long)c->logging.trace_events);
    if (c->sample.max_new_tokens < 0)
        return pt_errorf(PT_ERR_CONFIG, "sample.max_new_tokens must be >= 0");
    if (!(c->sample.temperature >= 0))
        return pt_errorf(PT_ERR_CONFIG, "sample.temperature must be >= 0");
    if (c->sample.top_k < 0) return pt_errorf(PT_ERR_CONFIG, "sample.top_k must be >= 0");
    if (c->sample.prompt[0] && c->sample.max_new_tokens > 0 && !c->sample.vocab[0]) /* not after training */
        return pt_errorf(PT_ERR_CONFIG, "sample.prompt needs sample.vocab (the tokenizer: a BPE "
                         "directory or a tokenizer.json)");
    return PT_OK;
}

static const char *pt_cfg_type_name(pt_cfg_type t) {
    switch (t) {
    case PT_CFG_INT:
    case PT_CFG_INT64: return "int";
    case PT_CFG_U64: return "uint";
    case PT_CFG_FLOAT: return "float";
    case PT_CFG_BOOL: return "bool";
    case PT_CFG_STR: return "string";
    }
    return "?";
}

void pt_config_print_help(FILE *f) {
    const char *section = "";
    for (size_t i = 0; i < PT_N_KEYS; i++) {
        const pt_cfg_key *k = &pt_cfg_keys[i];
        const char *dot = strchr(k->key, '.');
        if (strncmp(section, k->key, (size_t)(dot - k->key)) || section[dot - k->key] != 0) {
            static char sec[64];
            snprintf(sec, sizeof sec, "%.*s", (int)(dot - k->key), k->key);
            section = sec;
            fprintf(f, "\n[%s]\n", section);
        }
        fprintf(f, "  %-24s %-6s default %-10s %s%s%s\n", k->key, pt_cfg_type_name(k->type),
                k->def[0] ? k->def : "\"\"", k->help, k->choices ? "; one of " : "",
                k->choices ? k->choices : "");
    }
}

/* Every key, in the table's order: those set or not at their default as `key = value`, the others
 * as a comment `# key = value` with their default. The file is a config a run can be started
 * from (`train --config CKPT/train.ini`): a key written out counts as set, and the checks that
 * refuse a key given where it does not apply (optimizer.cooldown without wsd, ...) would refuse
 * a file that gave every key. */
void pt_config_write(const pt_config *c, FILE *f) {
    char section[64] = "";
    pt_config *def = pt_malloc(sizeof *def);
    memset(def, 0, sizeof *def);
    for (size_t i = 0; i < PT_N_KEYS; i++) {
        const pt_cfg_key *k = &pt_cfg_keys[i];
        const char *dot = strchr(k->key, '.');
        if (strncmp(section, k->key, (size_t)(dot - k->key)) || section[dot - k->key] != 0) {
            snprintf(section, sizeof section, "%.*s", (int)(dot - k->key), k->key);
            fprintf(f, "[%s]\n", section);
        }
        const void *src = (const char *)c + k->offset, *dsrc = (const char *)def + k->offset;
        pt_status st = pt_cfg_apply(def, k, k->def);
        PT_ASSERTF(st == PT_OK, "bad default for %s", k->key);
        size_t width = k->type == PT_CFG_INT64 || k->type == PT_CFG_U64 ? 8 : 4;
        int is_default = k->type == PT_CFG_STR ? !strcmp(src, dsrc) : !memcmp(src, dsrc, width);
        fprintf(f, "%s%s = ", is_default && !pt_cfg_set_flags[i] ? "# " : "", dot + 1);
        switch (k->type) {
        case PT_CFG_INT: fprintf(f, "%d\n", *(const int *)src); break;
        case PT_CFG_INT64: fprintf(f, "%lld\n", (long long)*(const int64_t *)src); break;
        case PT_CFG_U64: fprintf(f, "%llu\n", (unsigned long long)*(const uint64_t *)src); break;
        case PT_CFG_FLOAT: fprintf(f, "%.9g\n", (double)*(const float *)src); break;
        case PT_CFG_BOOL: fprintf(f, "%s\n", *(const int *)src ? "true" : "false"); break;
        case PT_CFG_STR: fprintf(f, "\"%s\"\n", (const char *)src); break;
        }
    }
    free(def);
}

int pt_config_zero_scope(const pt_config *c) {
    const char *s = c->parallel.zero_scope;
    if (!strcmp(s, "node")) return -1;
    char *end;
    long n = strtol(s, &end, 10);
    return s[0] >= '0' && s[0] <= '9' && !*end && n >= 1 && n <= (1 << 20) ? (int)n : 0;
}

pt_layout_spec pt_config_layout_spec(const pt_config *c) {
    return (pt_layout_spec){
        .deg = {c->parallel.dp, c->parallel.tp, c->parallel.pp, c->parallel.cp, c->parallel.ep},
        .sp = c->parallel.sp,
        .cp_zigzag = !strcmp(c->parallel.cp_layout, "zigzag"),
        .overlap = c->parallel.overlap,
        .zero = c->parallel.zero,
        .zero_scope = pt_config_zero_scope(c),
        .bucket_mb = c->parallel.bucket_mb,
        .timeout_s = c->parallel.timeout_s,
        .micro_batch = c->training.micro_batch,
        .seq_len = c->training.seq_len,
        .global_batch = c->training.global_batch,
        .pp_schedule = c->parallel.pp_schedule,
        .pp_virtual = c->parallel.pp_virtual,
        .pp_layers = c->parallel.pp_layers,
        .pp_head = c->parallel.pp_head,
        .pp_head_rows = c->parallel.pp_head_rows,
    };
}
