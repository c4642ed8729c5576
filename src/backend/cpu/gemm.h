/* gemm.h: the CPU backend's GEMM (oneDNN or OpenBLAS, gemm.c) and bf16 GEMM (oneDNN matmul,
 * gemm_bf16.c), private to src/backend/cpu. */
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

/* oneDNN's effective ISA (its kernels' instruction set; DNNL_MAX_CPU_ISA caps it), e.g.
 * "avx512_core_bf16". */
const char *pt_cpu_dnnl_isa_name(void);

/* bf16 GEMM: a oneDNN engine and stream, a table of exact-shape primitives and at most 8
 * runtime-shape ones, one per (ta, tb, beta != 0), which serve every shape not in the table.
 * A new shape gets an exact primitive while its family, (ta, tb, N, lda, ldb, ldc, beta != 0),
 * has fewer than PT_BF16_EXACT_PER_FAMILY exact ones and the table has fewer than
 * PT_BF16_CACHE_CAP; so row counts that change every call (mixture-of-experts) never fill it
 * (gemm_bf16.c, docs/gemm.md). Overridable at build time for tests. */
#ifndef PT_BF16_CACHE_CAP
#define PT_BF16_CACHE_CAP 128 /* shapes; a Llama step has about 20 (forward, dX, dW per linear) */
#endif
#ifndef PT_BF16_EXACT_PER_FAMILY
#define PT_BF16_EXACT_PER_FAMILY 4
#endif
typedef struct pt_cpu_bf16_matmul pt_cpu_bf16_matmul;
pt_status pt_cpu_bf16_matmul_create(pt_cpu_bf16_matmul **g);
void pt_cpu_bf16_matmul_free(pt_cpu_bf16_matmul *g);
/* The primitives made so far: exact-shape (at most PT_BF16_CACHE_CAP) and runtime-shape (at
 * most 8). */
void pt_cpu_bf16_matmul_counts(const pt_cpu_bf16_matmul *g, int *exact, int *runtime);
/* The gemm_bf16 slot of pt_backend (include/pt/backend.h). */
void pt_cpu_gemm_bf16(pt_cpu_bf16_matmul *g, pt_trans ta, pt_trans tb, int M, int N, int K,
                      const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta, float *C,
                      int ldc);
/* "bf16 GEMM oneDNN matmul IMPL, ISA ISA, bf16 native|emulated in fp32", for describe() */
const char *pt_cpu_bf16_matmul_desc(const pt_cpu_bf16_matmul *g);
/* 1 when oneDNN's effective ISA runs bf16 dot products natively (avx512_core_bf16 or above). */
int pt_cpu_bf16_native(void);

#endif
