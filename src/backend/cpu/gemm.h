/* gemm.h: the CPU backend's GEMM (oneDNN or OpenBLAS), private to src/backend/cpu. */
#ifndef PT_CPU_GEMM_H
#define PT_CPU_GEMM_H

#include "pt/backend.h"

typedef struct {
    pt_gemm_lib lib;
    char desc[256]; /* which library and kernel, for the log */
} pt_cpu_gemm_lib;

pt_status pt_cpu_gemm_init(pt_cpu_gemm_lib *g, pt_gemm_lib lib, int n_threads);
void pt_cpu_gemm(const pt_cpu_gemm_lib *g, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);

#endif
