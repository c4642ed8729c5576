/* moe.h: the mixture-of-experts MLP of a layer (see moe.c), used by llama.c. */
#ifndef PT_MODEL_MOE_H
#define PT_MODEL_MOE_H

#include "pt/model.h"

typedef struct pt_moe_acts pt_moe_acts;

/* What one MoE layer keeps of a micro-batch of N tokens from its forward to its backward. */
pt_moe_acts *pt_moe_acts_create(const pt_model *m, int N);
void pt_moe_acts_free(const pt_model *m, pt_moe_acts *a);
size_t pt_moe_acts_bytes(const pt_moe_acts *a);
/* The bytes pt_moe_acts_create(m, N) counts, but an expert-parallel exchange's, without
 * allocating. */
size_t pt_moe_acts_count(const pt_model *m, int N);
/* The model's balancing-scope state (m->aux_f uniform, m->aux_count zero), made and freed with
 * a model that has experts. */
void pt_moe_model_init(pt_model *m);
void pt_moe_model_free(pt_model *m);
/* out (N,C, fp32) += the experts' (and shared experts') output for the normed input xn (N,C, the
 * model's precision) of B sequences of T tokens of layer `layer`; adds the layer's balancing
 * losses (over m->cfg.aux_scope) and each expert's token-slots to st (NULL: not counted:
 * evaluation, recomputation); the global scope's counts to m->aux_count unless this is a
 * recomputation. */
double pt_moe_forward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w, const void *xn,
                      float *out, int B, int T, pt_moe_stats *st, int layer, int recompute);
/* dxn (N,C, fp32) += the input gradient for dout (N,C, fp32; dout_op: the same as a GEMM operand
 * of the model's precision, dout itself in fp32); the router's, experts' and shared experts'
 * weight gradients accumulate into g, the balancing losses' included. */
void pt_moe_backward(pt_model *m, pt_moe_acts *a, const pt_layer_view *w, const pt_layer_view *g,
                     const void *xn, const float *dout, const void *dout_op, float *dxn, int B,
                     int T, int defer);
/* defer (zero bubble's input part, without expert parallelism): the routed experts' weight
 * gradients are left to pt_moe_backward_weight, from the operands the activations keep (the
 * slots' inputs, h, dY and dGU): the same GEMMs on the same operands, later. */
void pt_moe_backward_weight(pt_model *m, pt_moe_acts *a, const pt_layer_view *g);
/* Rows this rank sent to and received from other ranks in the last forward's dispatch (expert
 * parallelism), added to *sent and *recv. */
void pt_moe_a2a_rows(const pt_model *m, const pt_moe_acts *a, int64_t *sent, int64_t *recv);

#endif
