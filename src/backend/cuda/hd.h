/* hd.h: writing arithmetic once for the GPU and the host.
 *
 * The CUDA backend's per-element and per-row arithmetic lives in C headers of PT_HD functions
 * (kmath.h, attn_math.h): nvcc compiles them as __host__ __device__ for the kernels, gcc compiles
 * them as plain C for the host tests (tests/test_cuda_host_*), which run them against the CPU
 * backend's kernels on every CI run, GPU or not.
 *
 * Rounding: each PT_F* operation rounds once. On the device they are the _rn intrinsics, which
 * nvcc never contracts into a fused multiply-add; on the host they are plain operators, and the
 * host tests are compiled with -ffp-contract=off, so both sides round the same operations the
 * same way. PT_FMA is a fused multiply-add on both (fmaf).
 */
#ifndef PT_CUDA_HD_H
#define PT_CUDA_HD_H

#include <stdint.h>

#ifdef __CUDACC__
#define PT_HD static inline __host__ __device__
#else
#include <math.h>
#define PT_HD static inline
#endif

#if defined(__CUDA_ARCH__)
#define PT_FADD(a, b) __fadd_rn((a), (b))
#define PT_FSUB(a, b) __fsub_rn((a), (b))
#define PT_FMUL(a, b) __fmul_rn((a), (b))
#define PT_FDIV(a, b) __fdiv_rn((a), (b))
#define PT_FSQRT(a) __fsqrt_rn(a)
#define PT_DADD(a, b) __dadd_rn((a), (b))
#define PT_DMUL(a, b) __dmul_rn((a), (b))
#else
#define PT_FADD(a, b) ((float)(a) + (float)(b))
#define PT_FSUB(a, b) ((float)(a) - (float)(b))
#define PT_FMUL(a, b) ((float)(a) * (float)(b))
#define PT_FDIV(a, b) ((float)(a) / (float)(b))
#define PT_FSQRT(a) sqrtf(a)
#define PT_DADD(a, b) ((double)(a) + (double)(b))
#define PT_DMUL(a, b) ((double)(a) * (double)(b))
#endif
#define PT_FMA(a, b, c) fmaf((a), (b), (c))

/* bit casts that compile on both sides */
PT_HD uint32_t pt_hd_f2u(float x) {
    union {
        float f;
        uint32_t u;
    } v;
    v.f = x;
    return v.u;
}
PT_HD float pt_hd_u2f(uint32_t u) {
    union {
        uint32_t u;
        float f;
    } v;
    v.u = u;
    return v.f;
}

#endif
