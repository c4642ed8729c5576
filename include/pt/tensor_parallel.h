/* tensor_parallel.h: tensor parallelism (with sequence parallelism) as the model's pt_tp_ops. */
#ifndef PT_TENSOR_PARALLEL_H
#define PT_TENSOR_PARALLEL_H

#include "pt/comm.h"
#include "pt/parallel_ops.h"

/* The table over the tp group (and the kv group, NULL when no key/value head is shared), for a
 * model whose vocabulary block is [v0, v0 + V) with v_valid real rows, for up to max_rows rows of
 * logits (and of the residual stream, of width dim) at a time. Scratch is allocated here, once. */
pt_tp_ops *pt_tp_create(pt_backend *be, pt_comm *tp, pt_comm *kv, int sp, int V, int v0,
                        int v_valid, int max_rows, int dim);
void pt_tp_free(pt_tp_ops *ops);

#endif
