/* parallel_ops.h: the parallel operations the model calls, one small table per parallelism.
 *
 * The model computes; the parallel modules communicate. Where a layer's computation meets a
 * parallel dimension (a row-parallel output to sum, a sequence-parallel gather, the attention
 * over keys held by other context ranks, the tokens sent to experts on other ranks), the model
 * calls an entry of the table of that parallelism. The tables are made by the modules under
 * src/parallel/ (tensor_parallel.c, context_parallel.c, expert_parallel.c), installed into the
 * model by src/parallel/layout.c, and NULL at degree 1: a NULL table is the single-process path,
 * the same kernels and fused GEMMs. This is Megatron's conjugate mappings (f / g) and torchtitan's
 * plan applied to an unmodified model, in C: the model includes no communicator, and a module
 * never calls the model (it may call backend kernels: ring attention's blocks, the
 * vocabulary-parallel cross-entropy).
 *
 * Every buffer passed is backend (device) memory unless it says host. `ctx` is the module's.
 */
#ifndef PT_PARALLEL_OPS_H
#define PT_PARALLEL_OPS_H

#include "pt/backend.h"
#include "pt/core.h"

/* A consumer or producer of a block of rows that an overlapped operation calls: rows [r0, r1) of
 * its operand are ready (a gather's consumer) or are to be written (a reduction's producer). */
typedef void (*pt_rows_fn)(void *user, int r0, int r1);

/* Tensor parallelism, with sequence parallelism (sp): this rank holds a block of the heads, the
 * ffn and the vocabulary; with sp the residual stream is split by rows over the tp ranks. */
typedef struct {
    void *ctx;
    /* g of a row-parallel linear: y (N,C) holds this rank's partial sums; afterwards y holds
     * their sum over the tp ranks, all N rows (all-reduce), or with sp this rank's N/tp rows at
     * the start of y (reduce-scatter) */
    void (*reduce)(void *ctx, float *y, int N, int C);
    /* sp's gather: full (N,C) holds this rank's rows at their place; afterwards every rank's.
     * Elements of esize bytes: 4 (fp32: gradients, fp32 activations) or 2 (bf16 activations) */
    void (*gather)(void *ctx, void *full, int N, int C, int esize);
    /* The overlapped forms (docs/parallelism.md, "Tensor parallelism overlapped"): the same
     * bytes and results, the transfers hidden behind the GEMM that makes or uses the rows.
     * gather_rows: gather, then rows(user, ·) for every rank's block of N/tp rows as it lands,
     * this rank's own first (while the others travel). reduce_rows: rows(user, ·) writes each
     * block's partial sums into y, the other ranks' blocks first, each sent as soon as made,
     * this rank's own last; then as reduce. Without sp: rows(user, 0, N), then as before. */
    void (*gather_rows)(void *ctx, void *full, int N, int C, int esize, pt_rows_fn rows,
                        void *user);
    void (*reduce_rows)(void *ctx, float *y, int N, int C, pt_rows_fn rows, void *user);
    /* reduce, started now and finished by reduce_finish: the caller computes in between (the
     * weight-gradient GEMM hides the input gradient's reduction); one pending at a time */
    void (*reduce_start)(void *ctx, float *y, int N, int C);
    void (*reduce_finish)(void *ctx);
    /* gather (sp), started now and finished by gather_finish: the caller computes in between
     * (backward's input-gradient GEMM hides the re-gather of a linear's sharded input, which the
     * weight-gradient GEMM then reads); one pending at a time, not while a reduce is */
    void (*gather_start)(void *ctx, void *full, int N, int C, int esize);
    void (*gather_finish)(void *ctx);
    /* n floats summed over the tp ranks (sp: the norms' weight gradients of a micro-batch) */
    void (*sum)(void *ctx, float *x, size_t n);
    /* n host doubles summed over the tp ranks (the router's per-slot dot products) */
    void (*sum_host_f64)(void *ctx, double *x, size_t n);
    /* the weight gradient of a key/value head held by several tp ranks, summed over them (NULL
     * when every rank holds its own heads) */
    void (*kv_sum)(void *ctx, float *x, size_t n);
    /* Vocabulary-parallel cross-entropy of n rows of logits (n, V_local: this rank's block of
     * the vocabulary): the blocks' row statistics combined over the tp ranks; host losses (n),
     * and the logits replaced by dscale · (softmax − onehot). */
    void (*xent)(void *ctx, float *logits, const int32_t *targets, int n, float dscale,
                 float *losses);
} pt_tp_ops;

/* Context parallelism: each rank holds T/cp tokens of every sequence (contiguous or zigzag). */
typedef struct {
    void *ctx;
    /* Attention of this rank's queries against the keys and values of every context rank (ring
     * attention). s is the local call (q, k, v in qkv at strides s->ldq; s->q_pos this rank's
     * positions); att and lse as attention_forward. poll(user) lets other pending communication
     * progress between blocks. recompute: a second forward of the layer (full activation
     * recomputation in backward), whose attention pairs are not counted again. */
    void (*attn_forward)(void *ctx, const pt_attn_shape *s, const float *qkv, float *att,
                         float *lse, int layer, int recompute, void (*poll)(void *), void *user);
    /* Its backward: dqkv (zeroed by the caller) gets the gradient of this rank's q, k and v. */
    void (*attn_backward)(void *ctx, const pt_attn_shape *s, const float *qkv, const float *att,
                          const float *datt, const float *lse, float *dqkv, int layer,
                          void (*poll)(void *), void *user);
    /* n host doubles summed over the context ranks (a sequence's routing statistics) */
    void (*sum_host_f64)(void *ctx, double *x, size_t n);
} pt_cp_ops;

/* Expert parallelism: each rank holds E/ep experts of every MoE layer; token-slots travel to the
 * rank holding their expert (dispatch) and their outputs back (combine). */
typedef struct pt_ep_state pt_ep_state; /* one MoE layer's exchange of one micro-batch */

/* What this rank's experts receive: rows in blocks, block b from rank b / el for local expert
 * b % el, rows[b] of them, one after another (block b's first row: at[b]). x is kept from
 * forward to backward. The dispatched rows (x, dy) have the state's element size (bf16 under
 * mixed precision); the combined ones (y, dx) are fp32: under tensor parallelism they are partial
 * sums over the tp ranks' slices of the experts, summed after the combine. */
typedef struct {
    void *x;        /* (rows, C): the received inputs */
    float *y;       /* (rows, C): the experts' outputs to send back */
    void *dy;       /* backward: the received output gradients */
    float *dx;      /* the input gradients to send back */
    const int64_t *rows; /* (ep · el) */
    const int64_t *at;   /* (ep · el) */
    int n_blocks, el;
} pt_ep_recv;

/* The model's work on one block of what arrived: block b (this rank's expert b % el), n ≥ 1 rows
 * from row at of recv's buffers: forward writes recv->y's rows, backward recv->dx's. */
typedef void (*pt_ep_block_fn)(void *user, int b, size_t at, int n);

typedef struct {
    void *ctx;
    /* a layer's state for micro-batches of up to N tokens whose dispatched rows have elements of
     * esize bytes (4: fp32, 2: bf16); buffers sized at set-up for the most rows that can arrive */
    pt_ep_state *(*state_create)(void *ctx, int N, int esize);
    /* the most rows a state for N tokens can receive */
    size_t (*max_rows)(void *ctx, int N);
    void (*state_free)(void *ctx, pt_ep_state *s);
    size_t (*state_bytes)(const pt_ep_state *s);
    /* An exchange in three calls, the model computing in between: start, compute, finish.
     * Forward: the slots' rows (S,C), sorted by expert (off: E + 1 offsets), start for the ranks
     * holding their experts; out (S,C) is to get each slot's output, in the order dispatched.
     * Returns what this rank receives (its rows valid once compute has called their block; x
     * until the state's next dispatch_start). */
    const pt_ep_recv *(*dispatch_start)(void *ctx, pt_ep_state *s, const void *rows,
                                        const int32_t *off, float *out);
    /* Backward: the slots' output gradients dy (S,C) start for where their inputs went (to
     * recv->dy); dx (S,C) is to get recv->dx back. */
    void (*dispatch_grad_start)(void *ctx, pt_ep_state *s, const void *dy, float *dx);
    /* block(user, ·) over every block with rows: this rank's own first (while the others'
     * travel), then rank me+1's, me+2's, ..., each once its rows have arrived (the same order
     * every step: gradients accumulate alike); each block's result leaves for its sender as soon
     * as block returns. Pending transfers progress between blocks. */
    void (*compute)(void *ctx, pt_ep_state *s, pt_ep_block_fn block, void *user);
    /* Waits for the results started (out, dx complete), and for the sends. */
    void (*finish)(void *ctx, pt_ep_state *s);
    /* Lets the transfers of an exchange in flight progress (MPI moves them only inside its
     * calls): the model calls it between the GEMMs of a block and of its other work */
    void (*progress)(void *ctx, pt_ep_state *s);
    /* rows this rank sent to and received from other ranks in the state's last dispatch */
    void (*rows_moved)(const pt_ep_state *s, int64_t *sent, int64_t *recv);
} pt_ep_ops;

#endif
