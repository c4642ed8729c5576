/* expert_parallel.h: expert parallelism (dispatch and combine by all-to-all) as pt_ep_ops. */
#ifndef PT_EXPERT_PARALLEL_H
#define PT_EXPERT_PARALLEL_H

#include "pt/comm.h"
#include "pt/parallel_ops.h"

/* The table over the ep group for MoE layers of E experts (rank r holds [r·E/ep, (r+1)·E/ep)),
 * top_k per token, rows of C elements; capacity_factor > 0 caps each expert's slots per sender
 * (what bounds the rows that can arrive, and so the buffers). */
pt_ep_ops *pt_ep_create(pt_backend *be, pt_comm *ep, int E, int top_k, float capacity_factor,
                        int C);
void pt_ep_free(pt_ep_ops *ops);

#endif
