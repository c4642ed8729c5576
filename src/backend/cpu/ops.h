/* ops.h: the CPU backend's compute kernels (all of the backend table but memory and GEMM).
 *
 * Each function has exactly the signature of its slot in pt_backend (include/pt/backend.h), where
 * the shapes and the "+=" conventions are documented; cpu_backend.c puts them in the table.
 * The kernels use OpenMP with however many threads the caller configured (omp_get_max_threads())
 * and never read be->ctx, so a test can call them with a zeroed pt_backend.
 *
 * Determinism: every kernel gives bitwise the same result whatever the thread count. Reductions
 * that cross rows (embedding and rmsnorm weight gradients, sum, sumsq, the attention key/value
 * gradients) are split by output element or into blocks fixed by the problem size, never by thread.
 */
#ifndef PT_CPU_OPS_H
#define PT_CPU_OPS_H

#include <stdint.h>
#include <string.h>

#include "pt/backend.h"

void pt_cpu_embedding_forward(pt_backend *be, float *out, const int32_t *tokens, const float *wte,
                              int N, int C, int row0, int rows);
void pt_cpu_embedding_forward_bf16(pt_backend *be, pt_bf16 *out, const int32_t *tokens,
                                   const pt_bf16 *wte, int N, int C, int row0, int rows);
void pt_cpu_embedding_backward(pt_backend *be, float *dwte, const int32_t *tokens,
                               const float *dout, int N, int C, int row0, int rows);

void pt_cpu_rmsnorm_forward(pt_backend *be, float *out, float *rstd, const float *inp,
                            const float *w, int N, int C, float eps);
void pt_cpu_rmsnorm_backward(pt_backend *be, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C);

void pt_cpu_rope(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                 int ld, const float *cos_tab, const float *sin_tab, int inverse);

void pt_cpu_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                              const float *k, const float *v, float *out, float *lse);
void pt_cpu_attention_backward(pt_backend *be, const pt_attn_shape *s, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *dout, const float *lse, float *dq, float *dk,
                               float *dv);

void pt_cpu_swiglu_forward(pt_backend *be, float *h, const float *gu, int N, int F);
void pt_cpu_swiglu_backward(pt_backend *be, float *dgu, const float *dh, const float *gu, int N,
                            int F);

void pt_cpu_attention_merge(pt_backend *be, float *out, float *lse, const float *ob,
                            const float *lb, int B, int T, int H, int hd, int ldo);
void pt_cpu_rows_copy(pt_backend *be, void *dst, const void *src, const int32_t *idx, int n,
                      size_t row_bytes);
void pt_cpu_rows_gather(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                        const float *scale, int n, int C);
void pt_cpu_rows_scatter_add(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                             const float *scale, int n, int C);
void pt_cpu_rows_dot(pt_backend *be, double *out, const float *x, const int32_t *idx,
                     const float *y, int n, int C);
void pt_cpu_xent_stats(pt_backend *be, const float *logits, const int32_t *targets, int n, int V,
                       int ld, int v0, float *stats);
void pt_cpu_xent_grad(pt_backend *be, float *logits, const int32_t *targets, int n, int V, int ld,
                      int v0, const float *M, const float *S, float dscale);
void pt_cpu_softmax_xent(pt_backend *be, float *logits, float *losses, const int32_t *targets,
                         int n, int V, int ld, float dscale);

/* convert.c */
void pt_cpu_to_bf16(pt_backend *be, pt_bf16 *dst, const float *src, size_t n);
void pt_cpu_from_bf16(pt_backend *be, float *dst, const pt_bf16 *src, size_t n);
/* The two paths behind pt_cpu_to_bf16 (one thread each), bitwise equal, for the tests: the
 * scalar pt_bf16_round, and AVX512-BF16, which returns 0 without doing anything on a CPU that
 * lacks it. */
void pt_cpu_to_bf16_portable(pt_bf16 *dst, const float *src, size_t n);
int pt_cpu_to_bf16_native(pt_bf16 *dst, const float *src, size_t n);

void pt_cpu_add(pt_backend *be, float *y, const float *x, size_t n);
double pt_cpu_sumsq(pt_backend *be, const float *x, size_t n);

void pt_cpu_adamw(pt_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale);

/* e^x in float without libm, so that loops calling it vectorise (glibc offers vector expf only
 * under -ffast-math). x = n·ln2 + r with |r| <= ln2/2; e^r is its Taylor series to degree 7
 * (truncation below 6e-9 relative, so the result is within about 2 ulp of expf); 2^n is applied
 * as two halves so that results down to the denormals and up to overflow come out right.
 * -INFINITY gives 0 and NaN stays NaN. */
static inline float pt_cpu_expf(float x) {
    const float magic = 12582912.0f; /* 1.5·2^23: adding it rounds to an integer in the low bits */
    float xc = x < -110.0f ? -110.0f : x; /* e^-110 rounds to 0 */
    xc = xc > 89.0f ? 89.0f : xc;         /* e^89 overflows */
    float t = xc * 1.44269504088896341f + magic;
    float nf = t - magic;
    int32_t tb, mb;
    memcpy(&tb, &t, 4);
    memcpy(&mb, &magic, 4);
    int32_t n = tb - mb;
    /* ln2 split so that nf·ln2_hi is exact for |n| < 2^12 */
    float r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t n1 = n / 2, n2 = n - n1;
    uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
    float s1, s2;
    memcpy(&s1, &b1, 4);
    memcpy(&s2, &b2, 4);
    return p * s1 * s2;
}

#endif
