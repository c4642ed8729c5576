/* gemm.c: the CPU backend's matrix multiply, through oneDNN (default) or OpenBLAS.
 *
 * oneDNN picks its kernels from the CPU's feature flags (AVX-512, AVX512-BF16, AMX), so it runs its
 * fast path on any CPU; docs/gemm.md has the measurements that made it the default.
 *
 * OpenBLAS picks kernels by CPU model number, and Debian's 0.3.21 does not know recent Xeons
 * (family 6 model 207): it falls back to its Prescott kernels, 5x slower. The core type is read
 * from OPENBLAS_CORETYPE once, when the library is loaded, so we load it ourselves with dlopen
 * after choosing the core type from the CPU's feature flags (unless the user set it).
 */
#include "backend/cpu/gemm.h"

#include <cpuid.h>
#include <dlfcn.h>
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*pt_cblas_sgemm_fn)(int order, int ta, int tb, int M, int N, int K, float alpha,
                                  const float *A, int lda, const float *B, int ldb, float beta,
                                  float *C, int ldc);

static struct {
    void *handle;
    pt_cblas_sgemm_fn sgemm;
    char *(*corename)(void);
    void (*set_threads)(int);
    char desc[200]; /* which kernel, and why: the same for every backend of this process */
} pt_openblas;

/* The OpenBLAS core type matching this CPU's features, or NULL if nothing better than its default. */
static const char *pt_openblas_coretype_for_cpu(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return NULL;
    int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
    int avx512vl = (b >> 31) & 1;
    int bf16 = 0;
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) bf16 = (a >> 5) & 1;
    if (avx512f && avx512bw && avx512vl && bf16) return "Cooperlake";
    if (avx512f && avx512bw && avx512vl) return "SkylakeX";
    if (avx2) return "Haswell";
    return NULL;
}

static pt_status pt_openblas_load(void) {
    if (pt_openblas.handle) return PT_OK;
    const char *forced = getenv("OPENBLAS_CORETYPE");
    const char *chosen = forced && *forced ? forced : pt_openblas_coretype_for_cpu();
    if (!(forced && *forced) && chosen) setenv("OPENBLAS_CORETYPE", chosen, 1);
    /* The OpenMP build shares our thread pool; the default (pthreads) build would fight it. */
    static const char *paths[] = {"/usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0",
                                  "libopenblas.so.0", "libopenblas.so"};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0] && !pt_openblas.handle; i++)
        pt_openblas.handle = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!pt_openblas.handle)
        return pt_errorf(PT_ERR_RUNTIME, "cannot load OpenBLAS (libopenblas.so.0): %s", dlerror());
    pt_openblas.sgemm = (pt_cblas_sgemm_fn)dlsym(pt_openblas.handle, "cblas_sgemm");
    *(void **)&pt_openblas.corename = dlsym(pt_openblas.handle, "openblas_get_corename");
    *(void **)&pt_openblas.set_threads = dlsym(pt_openblas.handle, "openblas_set_num_threads");
    if (!pt_openblas.sgemm) return pt_errorf(PT_ERR_RUNTIME, "OpenBLAS has no cblas_sgemm");
    snprintf(pt_openblas.desc, sizeof pt_openblas.desc, "OpenBLAS sgemm, kernel %s (%s)",
             pt_openblas.corename ? pt_openblas.corename() : "?",
             forced && *forced ? "OPENBLAS_CORETYPE set by user"
                               : (chosen ? "core type chosen from CPU flags" : "OpenBLAS default"));
    return PT_OK;
}

const char *pt_cpu_dnnl_isa_name(void) {
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

pt_status pt_cpu_gemm_init(pt_cpu_gemm_lib *g, pt_gemm_lib lib, int n_threads) {
    g->lib = lib;
    if (lib == PT_GEMM_OPENBLAS) {
        PT_TRY(pt_openblas_load());
        snprintf(g->desc, sizeof g->desc, "%s", pt_openblas.desc);
        if (pt_openblas.set_threads) pt_openblas.set_threads(n_threads);
    } else {
        const dnnl_version_t *v = dnnl_version();
        snprintf(g->desc, sizeof g->desc, "oneDNN %d.%d.%d sgemm, ISA %s", v->major, v->minor,
                 v->patch, pt_cpu_dnnl_isa_name());
    }
    return PT_OK;
}

void pt_cpu_gemm(const pt_cpu_gemm_lib *g, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M == 0 || N == 0) return;
    if (g->lib == PT_GEMM_OPENBLAS) {
        /* CblasRowMajor = 101, CblasNoTrans = 111, CblasTrans = 112 */
        pt_openblas.sgemm(101, ta ? 112 : 111, tb ? 112 : 111, M, N, K, alpha, A, lda, B, ldb,
                          beta, C, ldc);
        return;
    }
    dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb,
                                  beta, C, ldc);
    PT_ASSERTF(st == dnnl_success, "dnnl_sgemm failed (status %d) for M=%d N=%d K=%d", (int)st, M,
               N, K);
}
