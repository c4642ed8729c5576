/* context_parallel.h: context parallelism (ring attention) as the model's pt_cp_ops. */
#ifndef PT_CONTEXT_PARALLEL_H
#define PT_CONTEXT_PARALLEL_H

#include "pt/comm.h"
#include "pt/parallel_ops.h"

/* The global positions of rank r's T_local tokens of a sequence of T_local · cp tokens: zigzag
 * (2·cp chunks, rank r holding chunks r and 2·cp − 1 − r) or contiguous. */
void pt_cp_positions(int cp, int zigzag, int r, int T_local, int32_t *out);
/* Visible (query, key) pairs of one attention call with these positions (causal): what the
 * kernel computes, whose tiles with no visible pair it skips. */
int64_t pt_attn_visible_pairs(const int32_t *q_pos, int Tq, const int32_t *k_pos, int Tk);

/* The table over the cp group for micro-batches of up to N rows (B·T_local) of H query and KV
 * key/value heads of head_dim (this rank's, under tensor parallelism) and T_local tokens per
 * sequence. overlap: the next block's transfer runs while this block's attention computes. The
 * ring's buffers are allocated here, once. */
pt_cp_ops *pt_cp_create(pt_backend *be, pt_comm *cp, int zigzag, int overlap, int N, int H,
                        int KV, int head_dim, int T_local);
void pt_cp_free(pt_cp_ops *ops);
/* Visible (query, key) pairs this rank's attention computed so far (a counter). */
int64_t pt_cp_attn_pairs(const pt_cp_ops *ops);
/* Bytes of its buffers. */
size_t pt_cp_bytes(const pt_cp_ops *ops);

#endif
