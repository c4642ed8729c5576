/* memory.cu: the CUDA backend's device memory: one arena taken at set-up (its bookkeeping is
 * arena.c, host logic over offsets), from which every buffer of the backend and the model comes,
 * so that no step calls cudaMalloc or cudaFree; or, for compute-sanitizer, a cudaMalloc per
 * buffer (PT_CUDA_DIRECT_ALLOC=1). Used by the other .cu files; uses none of them.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"

enum { ARENA_SPANS = 1 << 16 }; /* pieces the arena can hand out at once */
/* device memory left outside the arena for CUDA's own needs (context, kernels' local memory,
 * cuBLASLt's internals) */
static const size_t RESERVE_BYTES = (size_t)1536 << 20;

static int64_t counted_mallocs; /* cudaMalloc calls of every CUDA backend of this process */

extern "C" void *pt_cuda_arena_alloc(pt_backend *be, size_t bytes) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    if (ctx->direct) { /* PT_CUDA_DIRECT_ALLOC: a cudaMalloc of its own, for compute-sanitizer */
        void *p = NULL;
        PT_CUDA_CHECK(cudaMalloc(&p, bytes ? bytes : (size_t)PT_ARENA_ALIGN));
        counted_mallocs++;
        pt_count_alloc();
        return p;
    }
    size_t off = pt_arena_alloc(&ctx->arena, bytes);
    if (off == SIZE_MAX)
        pt_fatal(__FILE__, __LINE__,
                 "CUDA backend: out of device memory: %zu bytes asked, the arena of %.2f GiB "
                 "holds %.2f GiB in %d pieces, its largest free piece is %.2f GiB (a smaller "
                 "micro_batch, recompute, or more ranks would help; PT_CUDA_ARENA_MB sets the "
                 "arena)",
                 bytes, ctx->arena.size / 1073741824.0, ctx->arena.in_use / 1073741824.0,
                 ctx->arena.n_used, pt_arena_largest_free(&ctx->arena) / 1073741824.0);
    pt_count_alloc();
    return ctx->arena_base + off;
}

extern "C" void pt_cuda_arena_free(pt_backend *be, void *p) {
    if (!p) return;
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    if (ctx->direct) {
        PT_CUDA_CHECK(cudaFree(p));
        return;
    }
    size_t off = (size_t)((char *)p - ctx->arena_base);
    PT_ASSERTF((char *)p >= ctx->arena_base && pt_arena_free(&ctx->arena, off),
               "CUDA backend: free of %p, not a piece of the arena", p);
}

extern "C" pt_status pt_cuda_memory_init(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    cudaError_t e;
    /* the arena: all the free memory less the reserve, or PT_CUDA_ARENA_MB; none with
     * PT_CUDA_DIRECT_ALLOC=1, where every piece is a cudaMalloc of its own so that
     * compute-sanitizer's memcheck sees each buffer's bounds (a test facility: it allocates and
     * synchronises in steps) */
    size_t free_b = 0, total_b = 0;
    if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess)
        return pt_errorf(PT_ERR_RUNTIME, "CUDA backend: cudaMemGetInfo: %s",
                         cudaGetErrorString(e));
    size_t want = free_b > 2 * RESERVE_BYTES ? free_b - RESERVE_BYTES : free_b / 2;
    /* several processes on one device (more ranks on a host than GPUs): each its share of the
     * whole device less a reserve each, whoever starts first */
    if (ctx->sharers > 1) {
        size_t reserves = (size_t)ctx->sharers * RESERVE_BYTES;
        size_t share = total_b > 2 * reserves ? (total_b - reserves) / ctx->sharers
                                              : total_b / (2 * (size_t)ctx->sharers);
        if (share < want) want = share;
    }
    const char *mb = getenv("PT_CUDA_ARENA_MB"), *direct = getenv("PT_CUDA_DIRECT_ALLOC");
    if (mb && atoll(mb) > 0) want = (size_t)atoll(mb) << 20;
    ctx->direct = direct && atoi(direct) > 0;
    if (ctx->direct) {
        pt_log_warn("PT_CUDA_DIRECT_ALLOC=1: every device buffer is a cudaMalloc of its own (for "
                    "compute-sanitizer; slow, and steps allocate)");
        want = 0;
    } else if ((e = cudaMalloc((void **)&ctx->arena_base, want)) != cudaSuccess) {
        pt_errorf(PT_ERR_MEMORY, "CUDA backend: cannot take an arena of %.2f GiB on GPU %d (%s, "
                  "%.2f GiB free of %.2f): %s", want / 1073741824.0, ctx->device, ctx->prop.name,
                  free_b / 1073741824.0, total_b / 1073741824.0, cudaGetErrorString(e));
        (void)cudaGetLastError();
        return PT_ERR_MEMORY;
    }
    if (!ctx->direct) ctx->cuda_mallocs = ++counted_mallocs;
    pt_arena_init(&ctx->arena, want, ARENA_SPANS);
    return PT_OK;
}

extern "C" void pt_cuda_memory_destroy(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    if (ctx->arena_base) cudaFree(ctx->arena_base);
    ctx->arena_base = NULL;
    pt_arena_destroy(&ctx->arena);
}

extern "C" int64_t pt_cuda_memory_peak(pt_backend *be) {
    if (!be || strcmp(be->name, "cuda") != 0) return 0;
    return (int64_t)pt_cuda_ctx_of(be)->arena.peak;
}

extern "C" int64_t pt_cuda_device_memory(pt_backend *be) {
    if (!be || strcmp(be->name, "cuda") != 0) return 0;
    return (int64_t)pt_cuda_ctx_of(be)->prop.totalGlobalMem;
}

/* For the tests: cudaMalloc calls so far (the arena's, one per backend). */
extern "C" int64_t pt_cuda_malloc_count(void) { return counted_mallocs; }
