/* gemm_bf16.c: the CPU backend's bf16 matrix multiply (bf16 inputs, fp32 accumulation and
 * output), through oneDNN's matmul primitive whichever library runs the fp32 GEMM.
 *
 * A oneDNN primitive is compiled for one shape (JIT code, blocking), which costs milliseconds, so
 * each shape's primitive is made on its first call and kept: a fixed-capacity cache allocated
 * with the backend, searched linearly (a model has a few dozen GEMM shapes). Transposes and
 * leading dimensions are expressed as strides of the memory descriptors, never as copies; beta = 1
 * is a sum post-op. The memory objects of an entry have no buffer of their own: each call points
 * them at its arguments (dnnl_memory_set_data_handle), and the scratchpad is ours (user mode),
 * one buffer shared by the entries and grown only when a new shape needs more, so a call
 * allocates nothing after its shape's first call.
 *
 * On CPUs with AVX512-BF16 (oneDNN's ISA avx512_core_bf16 or above) the dot products run on the
 * bf16 instructions; below that oneDNN converts to fp32 and the result is the same up to fp32
 * summation order, only slower (docs/gemm.md). Calls come from one thread (the cache is not
 * locked).
 */
#include "backend/cpu/gemm.h"

#include <dnnl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT_BF16_CACHE_CAP 128 /* shapes; a Llama step has about 20 (forward, dX, dW per linear) */

typedef struct {
    int ta, tb, M, N, K, lda, ldb, ldc, acc; /* the key; acc = (beta != 0) */
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
} pt_bf16_entry;

struct pt_cpu_bf16_matmul {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    pt_bf16_entry *cache; /* PT_BF16_CACHE_CAP entries, n used */
    int n;
    void *scratch; /* shared scratchpad, scratch_bytes */
    size_t scratch_bytes;
    char desc[160];
};

#define PT_DNNL_CHECK(call)                                                                    \
    do {                                                                                       \
        dnnl_status_t pt_dnnl_st_ = (call);                                                    \
        PT_ASSERTF(pt_dnnl_st_ == dnnl_success, "%s failed (oneDNN status %d)", #call,         \
                   (int)pt_dnnl_st_);                                                          \
    } while (0)

int pt_cpu_bf16_native(void) {
    /* oneDNN's ISA values are nested bit sets: containing avx512_core_bf16's bits is "at least" */
    dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    return ((unsigned)isa & (unsigned)dnnl_cpu_isa_avx512_core_bf16) ==
           (unsigned)dnnl_cpu_isa_avx512_core_bf16;
}

/* A (rows, cols) matrix of `dt` stored row-major at stride ld, or transposed (stored as (cols,
 * rows) at stride ld): only the strides differ. */
static dnnl_memory_desc_t pt_bf16_md(int rows, int cols, int ld, int trans, dnnl_data_type_t dt) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    PT_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md, 2, dims, dt, strides));
    return md;
}

/* The matmul primitive descriptor of an entry's key. */
static dnnl_primitive_desc_t pt_bf16_pd(dnnl_engine_t engine, const pt_bf16_entry *e) {
    dnnl_memory_desc_t a = pt_bf16_md(e->M, e->K, e->lda, e->ta, dnnl_bf16);
    dnnl_memory_desc_t b = pt_bf16_md(e->K, e->N, e->ldb, e->tb, dnnl_bf16);
    dnnl_memory_desc_t c = pt_bf16_md(e->M, e->N, e->ldc, 0, dnnl_f32);
    dnnl_matmul_desc_t desc;
    PT_DNNL_CHECK(dnnl_matmul_desc_init(&desc, &a, &b, NULL, &c));
    dnnl_primitive_attr_t attr;
    PT_DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    PT_DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (e->acc) { /* C = A·B + 1·C */
        dnnl_post_ops_t ops;
        PT_DNNL_CHECK(dnnl_post_ops_create(&ops));
        PT_DNNL_CHECK(dnnl_post_ops_append_sum(ops, 1.0f));
        PT_DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, ops));
        PT_DNNL_CHECK(dnnl_post_ops_destroy(ops));
    }
    dnnl_primitive_desc_t pd;
    dnnl_status_t st = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
    PT_ASSERTF(st == dnnl_success,
               "oneDNN has no bf16 matmul for ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d "
               "(status %d)", e->ta, e->tb, e->M, e->N, e->K, e->lda, e->ldb, e->ldc, (int)st);
    PT_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    return pd;
}

/* The implementation oneDNN chose, e.g. "brg:avx512_core_bf16" or "gemm:jit". */
static const char *pt_bf16_impl(dnnl_primitive_desc_t pd) {
    const char *impl = "?";
    PT_DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    return impl;
}

static dnnl_memory_t pt_bf16_mem(dnnl_primitive_desc_t pd, dnnl_query_t what,
                                 dnnl_engine_t engine) {
    dnnl_memory_t m;
    PT_DNNL_CHECK(dnnl_memory_create(&m, dnnl_primitive_desc_query_md(pd, what, 0), engine,
                                     DNNL_MEMORY_NONE));
    return m;
}

/* Makes the primitive and memory objects of a new entry; grows the shared scratchpad. */
static void pt_bf16_entry_build(pt_cpu_bf16_matmul *g, pt_bf16_entry *e) {
    dnnl_primitive_desc_t pd = pt_bf16_pd(g->engine, e);
    const char *impl = pt_bf16_impl(pd);
    if (strncmp(impl, "ref", 3) == 0) /* oneDNN's reference loops: correct, 100x slower */
        pt_log_warn("bf16 GEMM ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d runs oneDNN's "
                    "reference implementation (%s)", e->ta, e->tb, e->M, e->N, e->K, e->lda,
                    e->ldb, e->ldc, impl);
    PT_DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    e->a = pt_bf16_mem(pd, dnnl_query_src_md, g->engine);
    e->b = pt_bf16_mem(pd, dnnl_query_weights_md, g->engine);
    e->c = pt_bf16_mem(pd, dnnl_query_dst_md, g->engine);
    const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    const size_t need = dnnl_memory_desc_get_size(smd);
    if (need > 0) e->scratch = pt_bf16_mem(pd, dnnl_query_scratchpad_md, g->engine);
    if (need > g->scratch_bytes) {
        pt_free_aligned(g->scratch);
        g->scratch = pt_alloc_aligned(need);
        g->scratch_bytes = need;
    }
    PT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

static pt_bf16_entry *pt_bf16_lookup(pt_cpu_bf16_matmul *g, const pt_bf16_entry *key) {
    for (int i = 0; i < g->n; i++) {
        const pt_bf16_entry *e = &g->cache[i];
        if (e->ta == key->ta && e->tb == key->tb && e->M == key->M && e->N == key->N &&
            e->K == key->K && e->lda == key->lda && e->ldb == key->ldb && e->ldc == key->ldc &&
            e->acc == key->acc)
            return &g->cache[i];
    }
    PT_ASSERTF(g->n < PT_BF16_CACHE_CAP,
               "bf16 GEMM cache full: %d shapes already (raise PT_BF16_CACHE_CAP in "
               "src/backend/cpu/gemm_bf16.c); new shape ta=%d tb=%d M=%d N=%d K=%d lda=%d "
               "ldb=%d ldc=%d beta=%d", g->n, key->ta, key->tb, key->M, key->N, key->K, key->lda,
               key->ldb, key->ldc, key->acc);
    pt_bf16_entry *e = &g->cache[g->n++];
    *e = *key;
    pt_bf16_entry_build(g, e);
    return e;
}

/* The implementation oneDNN picks for a plain product names its kernel and ISA (made once, at
 * creation: a primitive descriptor only, nothing compiled). */
static void pt_bf16_describe(pt_cpu_bf16_matmul *g) {
    pt_bf16_entry probe = {.M = 256, .N = 256, .K = 256, .lda = 256, .ldb = 256, .ldc = 256};
    dnnl_primitive_desc_t pd = pt_bf16_pd(g->engine, &probe);
    snprintf(g->desc, sizeof g->desc, "bf16 GEMM oneDNN matmul %s, ISA %s, bf16 %s",
             pt_bf16_impl(pd), pt_cpu_dnnl_isa_name(),
             pt_cpu_bf16_native() ? "native" : "emulated in fp32");
    PT_DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
}

const char *pt_cpu_bf16_matmul_desc(const pt_cpu_bf16_matmul *g) { return g->desc; }

pt_status pt_cpu_bf16_matmul_create(pt_cpu_bf16_matmul **out) {
    pt_cpu_bf16_matmul *g = pt_calloc(1, sizeof *g);
    if (dnnl_engine_create(&g->engine, dnnl_cpu, 0) != dnnl_success) {
        free(g);
        return pt_errorf(PT_ERR_RUNTIME, "oneDNN: cannot create the CPU engine for bf16 GEMM");
    }
    if (dnnl_stream_create(&g->stream, g->engine, dnnl_stream_default_flags) != dnnl_success) {
        dnnl_engine_destroy(g->engine);
        free(g);
        return pt_errorf(PT_ERR_RUNTIME, "oneDNN: cannot create a stream for bf16 GEMM");
    }
    g->cache = pt_calloc(PT_BF16_CACHE_CAP, sizeof *g->cache);
    pt_bf16_describe(g);
    *out = g;
    return PT_OK;
}

void pt_cpu_bf16_matmul_free(pt_cpu_bf16_matmul *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) {
        pt_bf16_entry *e = &g->cache[i];
        dnnl_memory_destroy(e->a);
        dnnl_memory_destroy(e->b);
        dnnl_memory_destroy(e->c);
        if (e->scratch) dnnl_memory_destroy(e->scratch);
        dnnl_primitive_destroy(e->prim);
    }
    free(g->cache);
    pt_free_aligned(g->scratch);
    dnnl_stream_destroy(g->stream);
    dnnl_engine_destroy(g->engine);
    free(g);
}

void pt_cpu_gemm_bf16(pt_cpu_bf16_matmul *g, pt_trans ta, pt_trans tb, int M, int N, int K,
                      const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta, float *C,
                      int ldc) {
    PT_ASSERTF(beta == 0.0f || beta == 1.0f, "gemm_bf16: beta must be 0 or 1, not %g",
               (double)beta);
    if (M == 0 || N == 0) return;
    if (K == 0) { /* an empty sum: oneDNN rejects zero-sized inputs */
        if (beta == 0.0f)
            for (int i = 0; i < M; i++) memset(C + (size_t)i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    pt_bf16_entry key = {.ta = ta != PT_NO_TRANS, .tb = tb != PT_NO_TRANS, .M = M, .N = N,
                         .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .acc = beta != 0.0f};
    pt_bf16_entry *e = pt_bf16_lookup(g, &key);
    /* oneDNN takes non-const handles; it only reads A and B */
    PT_DNNL_CHECK(dnnl_memory_set_data_handle(e->a, (void *)A));
    PT_DNNL_CHECK(dnnl_memory_set_data_handle(e->b, (void *)B));
    PT_DNNL_CHECK(dnnl_memory_set_data_handle(e->c, C));
    if (e->scratch) PT_DNNL_CHECK(dnnl_memory_set_data_handle(e->scratch, g->scratch));
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e->a},
                              {DNNL_ARG_WEIGHTS, e->b},
                              {DNNL_ARG_DST, e->c},
                              {DNNL_ARG_SCRATCHPAD, e->scratch}};
    PT_DNNL_CHECK(dnnl_primitive_execute(e->prim, g->stream, e->scratch ? 4 : 3, args));
    PT_DNNL_CHECK(dnnl_stream_wait(g->stream));
}
