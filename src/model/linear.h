/* linear.h: the linear layer, written once (see linear.c): the C form of Megatron-LM's
 * ColumnParallelLinear and RowParallelLinear. Attention, the MLP, the experts' MLPs and the head
 * are sequences of these calls; the tensor-parallel mappings (sequence parallelism's gathers and
 * reduce-scatters, or the all-reduces) and their overlap with the GEMMs live inside them. */
#ifndef PT_MODEL_LINEAR_H
#define PT_MODEL_LINEAR_H

#include "model/acts.h"

/* y = x·Wᵀ (+ b) on this rank's block: W (n, K) as the model computes with it (fp32 master or
 * its bf16 copy), b (n) likewise or NULL; dw (n, K) and db (n) the fp32 gradients, accumulated
 * (db NULL without a bias). shared: a column-parallel linear's first output row whose weight
 * several tp ranks hold (a key/value head replicated, tp > n_kv_heads): the gradients of rows
 * [shared, n) are summed over those ranks; n when none. */
typedef struct {
    const void *w;
    const float *b;
    float *dw, *db;
    int K, n, shared;
} pt_linear;

/* The three GEMMs of a linear over rows it holds whole, without a tensor-parallel mapping (an
 * expert's linears, the head's, a decoding step's), everything packed:
 *   y (n, L->n, fp32) = x (n, L->K) · Wᵀ + beta·y;
 *   dx (n, L->K, fp32) = dy (n, L->n) · W + beta·dx, dy a GEMM operand of the model's precision;
 *   dW (L->n, L->K) += dyᵀ · x. */
void pt_linear_fwd(pt_model *m, const pt_linear *L, const void *x, float *y, int n, float beta);
void pt_linear_dgrad(pt_model *m, const pt_linear *L, const void *dy, float *dx, int n, float beta);
void pt_linear_dw(pt_model *m, const pt_linear *L, const void *dy, const void *x, int n);

/* Column-parallel forward. x (R,K): this rank's rows of the input, kept for backward; with
 * sequence parallelism gathered into the scratch a->xg while y (N,n, fp32) = x·Wᵀ + b is
 * computed on each block of rows as it lands. Returns the gathered input (N,K). With L NULL only
 * the gather (the experts take the input whole). */
const void *pt_linear_col_forward(pt_model *m, pt_acts *a, const pt_linear *L, const void *x,
                                  float *y, int N);

/* Row-parallel forward with the residual: xout (R,C) = xin + Σ over the tp ranks of x (N,K) · Wᵀ
 * (+ b), with sequence parallelism this rank's rows (a reduce-scatter, each block sent as the
 * GEMM makes it). */
void pt_linear_row_forward(pt_model *m, pt_acts *a, const pt_linear *L, void *xout,
                           const void *xin, const void *x, int N);

/* The gradient of the residual rows a->dx (R,C), gathered in full (N,C) with sequence
 * parallelism, or a->dx itself. */
const float *pt_linear_out_grad(pt_model *m, pt_acts *a, int N);

/* A column-parallel linear's kept rows x (R,C) gathered again (sequence parallelism) into the
 * scratch a->xg, for a consumer that is not one of these linears (the experts' backward);
 * returns the gathered (N,C), or x itself. */
const void *pt_linear_input(pt_model *m, pt_acts *a, const void *x, int N);

/* Column-parallel backward from dy (N,n, fp32): dx (N,K, fp32) = dy·W, its sum over the tp ranks
 * started (pt_tp_reduce_end waits for it: the caller computes in between); with keep NULL the
 * weight gradients now, dW += dyᵀ·x (x: this rank's kept rows, gathered again while dx's GEMM
 * runs), else dy copied to keep for pt_linear_weight. */
void pt_linear_col_backward(pt_model *m, pt_acts *a, const pt_linear *L, const float *dy,
                            const void *x, float *dx, int N, float *keep);

/* Row-parallel backward: the output gradient (a->dx's rows, gathered with sequence parallelism)
 * dy, while dx (N,K, fp32) = dy·W is computed block by block as its rows land; with keep NULL
 * dW += dyᵀ·x (x (N,K)) now, else dy copied to keep for pt_linear_weight. */
void pt_linear_row_backward(pt_model *m, pt_acts *a, const pt_linear *L, const void *x, float *dx,
                            int N, float *keep);

/* The weight pass of a split backward (zero bubble): dW (+ db) += dyᵀ·x from the dy a backward
 * kept; x the kept input (column: this rank's rows, gathered again). */
void pt_linear_weight(pt_model *m, pt_acts *a, const pt_linear *L, const float *dy, const void *x,
                      int column, int N);

#endif
