/* prec.h: the model's precision as its GEMMs and arrays see it (docs/precision.md), shared by
 * llama.c and moe.c. Activations are fp32 or bf16 (m->act_size bytes each); a GEMM takes
 * operands of the model's precision and accumulates in fp32. In fp32 each helper is the plain
 * fp32 operation. */
#ifndef PT_MODEL_PREC_H
#define PT_MODEL_PREC_H

#include "pt/model.h"

static inline int pt_is_bf16(const pt_model *m) { return m->prec == PT_PREC_BF16; }

/* Element i of an activation (or weight) array of the model's precision. */
static inline void *pt_at(const pt_model *m, const void *act, size_t i) {
    return (char *)act + i * (size_t)m->act_size;
}

/* C (fp32) = op(A)·op(B) + beta·C with A and B activations or weights of the model's precision. */
static inline void pt_mm(pt_model *m, pt_trans ta, pt_trans tb, int M, int N, int K, const void *A,
                         int lda, const void *B, int ldb, float beta, float *C, int ldc) {
    pt_backend *be = m->be;
    if (pt_is_bf16(m))
        be->gemm_bf16(be, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    else
        be->gemm(be, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

#endif
