/* gemm_bf16.c: the CPU backend's bf16 matrix multiply (bf16 inputs, fp32 accumulation and
 * output), through oneDNN's matmul primitive whichever library runs the fp32 GEMM.
 *
 * A oneDNN primitive is compiled for one shape (JIT code, blocking), which costs milliseconds, so
 * each shape's primitive is made on its first call and kept: a fixed-capacity table allocated
 * with the backend, searched linearly (a dense model has a few dozen GEMM shapes). Transposes and
 * leading dimensions are expressed as strides of the memory descriptors, never as copies; beta = 1
 * is a sum post-op. The memory objects of an entry have no buffer of their own: each call points
 * them at its arguments (dnnl_memory_set_data_handle), and the scratchpad is ours (user mode),
 * one buffer shared by the entries and grown only when a new primitive needs more, so a call
 * allocates nothing of ours after its shape's first call.
 *
 * Shapes that keep changing (a mixture-of-experts layer's GEMMs: the tokens routed to an expert,
 * M of the forward and input-gradient products, K of the weight gradient, differ every step)
 * would fill any table. So a shape gets an exact primitive only while its family — the shape
 * without M and K: (ta, tb, N, lda, ldb, ldc, beta) — has fewer than PT_BF16_EXACT_PER_FAMILY
 * exact ones and the table has room; any other shape runs on one of at most 8 runtime-shape
 * primitives, one per (ta, tb, beta), made once with every dimension and leading dimension
 * DNNL_RUNTIME_DIM_VAL (the strides too, so a transposed A whose lda follows M is served as
 * well). oneDNN 2.6 implements that with its gemm:jit kernel, measured within 6% of the exact
 * primitives (brg:avx512_core_bf16) at M = 37, 300 and 2048 with N = K = 768 (and K = 37, 300,
 * 2048 of a weight gradient), 1 thread; an exact shape costs 0.4-23 ms of JIT on its first call,
 * the runtime primitive that once (docs/gemm.md). So exact shapes only for a family's first few,
 * the dense model's steady shapes, which keep their kernel. oneDNN 2.6 reads a runtime shape from
 * the memory objects passed at execution and cannot change a memory object's descriptor, so the
 * runtime entry remakes its three memory objects (dnnl_memory_create, 0.3-1 us each, allocated
 * inside oneDNN, not by us) when the shape differs from its previous call's; its scratchpad is
 * booked when the primitive is made, before any shape is known, so it never grows with M (the
 * gemm:jit kernel mallocs its own packing buffers, as it does for exact shapes).
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

#define PT_BF16_RT DNNL_RUNTIME_DIM_VAL

typedef struct {
    /* exact entry: its shape, the key (acc = (beta != 0)); runtime entry: ta, tb, acc, and the
     * shape its memory objects a, b, c describe (M = 0: none made yet) */
    int ta, tb, M, N, K, lda, ldb, ldc, acc;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, scratch;
} pt_bf16_entry;

struct pt_cpu_bf16_matmul {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    pt_bf16_entry *cache; /* PT_BF16_CACHE_CAP exact-shape entries, n used */
    int n;
    pt_bf16_entry rt[8]; /* the runtime-shape entries, [4·ta + 2·tb + acc]; prim NULL: not made */
    int n_rt;
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
 * rows) at stride ld): only the strides differ. Any of rows, cols, ld may be PT_BF16_RT. */
static dnnl_memory_desc_t pt_bf16_md(dnnl_dim_t rows, dnnl_dim_t cols, dnnl_dim_t ld, int trans,
                                     dnnl_data_type_t dt) {
    dnnl_memory_desc_t md;
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    PT_DNNL_CHECK(dnnl_memory_desc_init_by_strides(&md, 2, dims, dt, strides));
    return md;
}

/* The descriptors of A, B and C of a shape (e->M ... e->ldc), or with every dimension and leading
 * dimension at runtime (rt). */
static void pt_bf16_mds(const pt_bf16_entry *e, int rt, dnnl_memory_desc_t *a,
                        dnnl_memory_desc_t *b, dnnl_memory_desc_t *c) {
    const dnnl_dim_t M = rt ? PT_BF16_RT : e->M, N = rt ? PT_BF16_RT : e->N,
                     K = rt ? PT_BF16_RT : e->K, lda = rt ? PT_BF16_RT : e->lda,
                     ldb = rt ? PT_BF16_RT : e->ldb, ldc = rt ? PT_BF16_RT : e->ldc;
    *a = pt_bf16_md(M, K, lda, e->ta, dnnl_bf16);
    *b = pt_bf16_md(K, N, ldb, e->tb, dnnl_bf16);
    *c = pt_bf16_md(M, N, ldc, 0, dnnl_f32);
}

/* The matmul primitive descriptor of an entry's shape, or of its (ta, tb, beta) at runtime
 * shapes (rt). */
static dnnl_primitive_desc_t pt_bf16_pd(dnnl_engine_t engine, const pt_bf16_entry *e, int rt) {
    dnnl_memory_desc_t a, b, c;
    pt_bf16_mds(e, rt, &a, &b, &c);
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
    if (rt)
        PT_ASSERTF(st == dnnl_success,
                   "oneDNN has no bf16 matmul with runtime shapes for ta=%d tb=%d beta=%d "
                   "(status %d)", e->ta, e->tb, e->acc, (int)st);
    else
        PT_ASSERTF(st == dnnl_success,
                   "oneDNN has no bf16 matmul for ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d "
                   "ldc=%d (status %d)", e->ta, e->tb, e->M, e->N, e->K, e->lda, e->ldb, e->ldc,
                   (int)st);
    PT_DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    return pd;
}

/* The implementation oneDNN chose, e.g. "brg:avx512_core_bf16" or "gemm:jit". */
static const char *pt_bf16_impl(dnnl_primitive_desc_t pd) {
    const char *impl = "?";
    PT_DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl));
    return impl;
}

static dnnl_memory_t pt_bf16_mem_md(const dnnl_memory_desc_t *md, dnnl_engine_t engine) {
    dnnl_memory_t m;
    PT_DNNL_CHECK(dnnl_memory_create(&m, md, engine, DNNL_MEMORY_NONE));
    return m;
}

static dnnl_memory_t pt_bf16_mem(dnnl_primitive_desc_t pd, dnnl_query_t what,
                                 dnnl_engine_t engine) {
    return pt_bf16_mem_md(dnnl_primitive_desc_query_md(pd, what, 0), engine);
}

/* Makes the primitive of a new entry (exact shape, or runtime shapes: rt), the memory objects of
 * an exact one; grows the shared scratchpad. */
static void pt_bf16_entry_build(pt_cpu_bf16_matmul *g, pt_bf16_entry *e, int rt) {
    dnnl_primitive_desc_t pd = pt_bf16_pd(g->engine, e, rt);
    const char *impl = pt_bf16_impl(pd);
    if (strncmp(impl, "ref", 3) == 0) { /* oneDNN's reference loops: correct, 100x slower */
        if (rt)
            pt_log_warn("bf16 GEMM ta=%d tb=%d beta=%d at runtime shapes runs oneDNN's "
                        "reference implementation (%s)", e->ta, e->tb, e->acc, impl);
        else
            pt_log_warn("bf16 GEMM ta=%d tb=%d M=%d N=%d K=%d lda=%d ldb=%d ldc=%d runs "
                        "oneDNN's reference implementation (%s)", e->ta, e->tb, e->M, e->N,
                        e->K, e->lda, e->ldb, e->ldc, impl);
    }
    PT_DNNL_CHECK(dnnl_primitive_create(&e->prim, pd));
    if (!rt) {
        e->a = pt_bf16_mem(pd, dnnl_query_src_md, g->engine);
        e->b = pt_bf16_mem(pd, dnnl_query_weights_md, g->engine);
        e->c = pt_bf16_mem(pd, dnnl_query_dst_md, g->engine);
    }
    /* booked now, for any shape when rt: it does not grow with M */
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

static int pt_bf16_same_family(const pt_bf16_entry *e, const pt_bf16_entry *key) {
    return e->ta == key->ta && e->tb == key->tb && e->N == key->N && e->lda == key->lda &&
           e->ldb == key->ldb && e->ldc == key->ldc && e->acc == key->acc;
}

/* The runtime-shape entry of key's (ta, tb, beta), made on first use, its memory objects
 * describing key's shape. */
static pt_bf16_entry *pt_bf16_runtime(pt_cpu_bf16_matmul *g, const pt_bf16_entry *key) {
    pt_bf16_entry *e = &g->rt[4 * key->ta + 2 * key->tb + key->acc];
    if (!e->prim) {
        *e = (pt_bf16_entry){.ta = key->ta, .tb = key->tb, .acc = key->acc};
        pt_bf16_entry_build(g, e, 1);
        g->n_rt++;
    }
    if (e->M != key->M || e->N != key->N || e->K != key->K || e->lda != key->lda ||
        e->ldb != key->ldb || e->ldc != key->ldc) {
        /* oneDNN 2.6 has no call to change a memory object's descriptor: new ones (allocated
         * inside oneDNN, about a microsecond for the three) */
        if (e->M) {
            PT_DNNL_CHECK(dnnl_memory_destroy(e->a));
            PT_DNNL_CHECK(dnnl_memory_destroy(e->b));
            PT_DNNL_CHECK(dnnl_memory_destroy(e->c));
        }
        e->M = key->M, e->N = key->N, e->K = key->K;
        e->lda = key->lda, e->ldb = key->ldb, e->ldc = key->ldc;
        dnnl_memory_desc_t a, b, c;
        pt_bf16_mds(e, 0, &a, &b, &c);
        e->a = pt_bf16_mem_md(&a, g->engine);
        e->b = pt_bf16_mem_md(&b, g->engine);
        e->c = pt_bf16_mem_md(&c, g->engine);
    }
    return e;
}

/* The entry that runs key: its exact-shape one if cached; else a new exact one while key's family
 * has fewer than PT_BF16_EXACT_PER_FAMILY and the table has room; else the runtime one. */
static pt_bf16_entry *pt_bf16_lookup(pt_cpu_bf16_matmul *g, const pt_bf16_entry *key) {
    int family = 0;
    for (int i = 0; i < g->n; i++) {
        const pt_bf16_entry *e = &g->cache[i];
        if (!pt_bf16_same_family(e, key)) continue;
        if (e->M == key->M && e->K == key->K) return &g->cache[i];
        family++;
    }
    if (family >= PT_BF16_EXACT_PER_FAMILY || g->n >= PT_BF16_CACHE_CAP)
        return pt_bf16_runtime(g, key);
    pt_bf16_entry *e = &g->cache[g->n++];
    *e = *key;
    pt_bf16_entry_build(g, e, 0);
    return e;
}

void pt_cpu_bf16_matmul_counts(const pt_cpu_bf16_matmul *g, int *exact, int *runtime) {
    *exact = g->n;
    *runtime = g->n_rt;
}

/* The implementation oneDNN picks for a plain product names its kernel and ISA (made once, at
 * creation: a primitive descriptor only, nothing compiled). */
static void pt_bf16_describe(pt_cpu_bf16_matmul *g) {
    pt_bf16_entry probe = {.M = 256, .N = 256, .K = 256, .lda = 256, .ldb = 256, .ldc = 256};
    dnnl_primitive_desc_t pd = pt_bf16_pd(g->engine, &probe, 0);
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

static void pt_bf16_entry_free(pt_bf16_entry *e) {
    if (e->a) dnnl_memory_destroy(e->a);
    if (e->b) dnnl_memory_destroy(e->b);
    if (e->c) dnnl_memory_destroy(e->c);
    if (e->scratch) dnnl_memory_destroy(e->scratch);
    if (e->prim) dnnl_primitive_destroy(e->prim);
}

void pt_cpu_bf16_matmul_free(pt_cpu_bf16_matmul *g) {
    if (!g) return;
    for (int i = 0; i < g->n; i++) pt_bf16_entry_free(&g->cache[i]);
    for (int i = 0; i < 8; i++) pt_bf16_entry_free(&g->rt[i]);
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
