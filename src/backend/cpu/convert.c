/* convert.c: fp32 <-> bf16 on the CPU (the to_bf16 and from_bf16 slots of pt_backend).
 *
 * The rounding is pt_bf16_round's (core.h): nearest even, NaN quiet, no flush. CPUs with
 * AVX512-BF16 convert 16 floats per instruction (vcvtneps2bf16), chosen at run time from CPUID,
 * so a build for any x86-64 uses it where it exists. That instruction rounds to nearest even and
 * quiets NaN exactly as pt_bf16_round does, but it flushes denormal inputs to zero: lanes with a
 * zero exponent are redone with the integer rounding, so both paths give the same bits (tested
 * on every class of input in tests/test_ops.c). Work is split into fixed blocks over OpenMP
 * threads; each element is independent, so the thread count cannot change a result.
 */
#include <immintrin.h>

#include "backend/cpu/ops.h"

#define PT_CVT_BLOCK 16384 /* elements per OpenMP work item (64 KiB of fp32) */

void pt_cpu_to_bf16_portable(pt_bf16 *dst, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = pt_bf16_round(src[i]);
}

#if defined(__x86_64__)
#define PT_BF16_TARGET __attribute__((target("avx512bf16,avx512f,avx512bw,avx512vl")))

/* 16 (or the `live` lanes of) floats: the instruction's result, denormal lanes redone. */
PT_BF16_TARGET static inline __m256i pt_cvt16(__m512 x) {
    __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
    __m512i u = _mm512_castps_si512(x);
    __mmask16 tiny = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000));
    if (tiny) { /* rare: u + 0x7fff + lsb, the upper halves (pt_bf16_round) */
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
        __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb);
        h = _mm256_mask_mov_epi16(h, tiny, _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
    }
    return h;
}

PT_BF16_TARGET static void pt_cpu_to_bf16_avx512(pt_bf16 *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(dst + i), pt_cvt16(_mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 live = (__mmask16)((1u << (n - i)) - 1);
        _mm256_mask_storeu_epi16(dst + i, live, pt_cvt16(_mm512_maskz_loadu_ps(live, src + i)));
    }
}

int pt_cpu_to_bf16_native(pt_bf16 *dst, const float *src, size_t n) {
    /* checks the OS's AVX-512 state too, not only the CPUID bit */
    if (!__builtin_cpu_supports("avx512bf16")) return 0;
    pt_cpu_to_bf16_avx512(dst, src, n);
    return 1;
}
#else
int pt_cpu_to_bf16_native(pt_bf16 *dst, const float *src, size_t n) {
    (void)dst, (void)src, (void)n;
    return 0;
}
#endif

/* n elements of `size` bytes from src to dst through block(dst, src, count), in blocks of
 * PT_CVT_BLOCK over the OpenMP threads. */
static void pt_cvt_blocks(void *dst, size_t dst_size, const void *src, size_t src_size, size_t n,
                          void (*block)(void *dst, const void *src, size_t n)) {
    const size_t nb = (n + PT_CVT_BLOCK - 1) / PT_CVT_BLOCK;
#pragma omp parallel for schedule(static) if (nb > 1)
    for (size_t b = 0; b < nb; b++) {
        const size_t i0 = b * PT_CVT_BLOCK, m = n - i0 < PT_CVT_BLOCK ? n - i0 : PT_CVT_BLOCK;
        block((char *)dst + i0 * dst_size, (const char *)src + i0 * src_size, m);
    }
}

static void pt_to_bf16_block(void *dst, const void *src, size_t n) {
    if (!pt_cpu_to_bf16_native(dst, src, n)) pt_cpu_to_bf16_portable(dst, src, n);
}

static void pt_from_bf16_block(void *dst, const void *src, size_t n) {
    float *d = dst;
    const pt_bf16 *s = src;
    for (size_t i = 0; i < n; i++) d[i] = pt_bf16_to_float(s[i]); /* a shift */
}

void pt_cpu_to_bf16(pt_backend *be, pt_bf16 *dst, const float *src, size_t n) {
    (void)be;
    pt_cvt_blocks(dst, sizeof *dst, src, sizeof *src, n, pt_to_bf16_block);
}

void pt_cpu_from_bf16(pt_backend *be, float *dst, const pt_bf16 *src, size_t n) {
    (void)be;
    pt_cvt_blocks(dst, sizeof *dst, src, sizeof *src, n, pt_from_bf16_block);
}
