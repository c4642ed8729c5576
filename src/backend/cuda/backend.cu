/* backend.cu: the CUDA backend's function table and its memory.
 *
 * One process, one GPU (local rank mod the device count), one stream. Device memory is one arena
 * taken at set-up (arena.c does the bookkeeping over offsets), so be->alloc and be->free never
 * call CUDA and a step never allocates or synchronises on allocation (memory.cu). Host data crosses through
 * two pinned buffers used in turn: an upload copies into one and queues the transfer on the
 * stream (the caller may reuse its memory at once), a download queues the transfer and waits for
 * it. The kernels are in ops.cu, attention.cu and gemm.cu.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/kmath.h"

enum { PINNED_BYTES = 32 << 20 }; /* each of the two staging buffers */


extern "C" int pt_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not an error for the caller */
        return 0;
    }
    return n;
}

extern "C" pt_status pt_cuda_check_usable(void) {
    if (pt_cuda_device_count() > 0) return PT_OK;
    return pt_errorf(PT_ERR_CONFIG, "training.device = cuda: no CUDA device can be used here "
                     "(cudaGetDeviceCount found none, or there is no driver)");
}

/* be->alloc hands out zeroed memory, as the table says */
static void *cuda_alloc(pt_backend *be, size_t bytes) {
    void *p = pt_cuda_arena_alloc(be, bytes);
    PT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, pt_cuda_stream(be)));
    return p;
}

static void cuda_zero(pt_backend *be, void *p, size_t bytes) {
    if (bytes) PT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, pt_cuda_stream(be)));
}

static void cuda_copy(pt_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src)
        PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, pt_cuda_stream(be)));
}

static void cuda_upload(pt_backend *be, void *dst, const void *host_src, size_t bytes) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    const char *src = (const char *)host_src;
    for (size_t done = 0; done < bytes;) {
        size_t len = bytes - done < ctx->pinned_bytes ? bytes - done : ctx->pinned_bytes;
        int b = ctx->pinned_next;
        ctx->pinned_next ^= 1;
        /* the buffer's previous transfer must have left it before it is refilled */
        PT_CUDA_CHECK(cudaEventSynchronize(ctx->pinned_done[b]));
        memcpy(ctx->pinned[b], src + done, len);
        PT_CUDA_CHECK(cudaMemcpyAsync((char *)dst + done, ctx->pinned[b], len,
                                      cudaMemcpyHostToDevice, ctx->stream));
        PT_CUDA_CHECK(cudaEventRecord(ctx->pinned_done[b], ctx->stream));
        done += len;
    }
}

static void cuda_download(pt_backend *be, void *host_dst, const void *src, size_t bytes) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    char *dst = (char *)host_dst;
    for (size_t done = 0; done < bytes;) {
        size_t len = bytes - done < ctx->pinned_bytes ? bytes - done : ctx->pinned_bytes;
        int b = ctx->pinned_next;
        ctx->pinned_next ^= 1;
        PT_CUDA_CHECK(cudaMemcpyAsync(ctx->pinned[b], (const char *)src + done, len,
                                      cudaMemcpyDeviceToHost, ctx->stream));
        PT_CUDA_CHECK(cudaEventRecord(ctx->pinned_done[b], ctx->stream));
        PT_CUDA_CHECK(cudaEventSynchronize(ctx->pinned_done[b]));
        memcpy(dst + done, ctx->pinned[b], len);
        done += len;
    }
}

static void cuda_synchronize(pt_backend *be) {
    PT_CUDA_CHECK(cudaStreamSynchronize(pt_cuda_stream(be)));
}

/* The device link (include/pt/backend.h): how the comm layer reaches the arena's memory. */
static int link_owns(void *c, const void *p) {
    pt_cuda_ctx *ctx = (pt_cuda_ctx *)c;
    const char *q = (const char *)p;
    if (!ctx->direct) return q >= ctx->arena_base && q < ctx->arena_base + ctx->arena.size;
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice;
}
static void *link_host_alloc(void *c, size_t bytes) {
    (void)c;
    void *p = NULL;
    PT_CUDA_CHECK(cudaMallocHost(&p, bytes ? bytes : 1));
    return p;
}
static void link_host_free(void *c, void *p) {
    (void)c;
    if (p) PT_CUDA_CHECK(cudaFreeHost(p));
}
static void link_to_host(void *c, void *host, const void *dev, size_t bytes) {
    pt_cuda_ctx *ctx = (pt_cuda_ctx *)c;
    PT_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    PT_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}
static void link_to_device(void *c, void *dev, const void *host, size_t bytes) {
    pt_cuda_ctx *ctx = (pt_cuda_ctx *)c;
    PT_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    /* the staging buffer is reused once this returns */
    PT_CUDA_CHECK(cudaStreamSynchronize(ctx->stream));
}
static void *link_stream_new(void *c) {
    (void)c;
    cudaStream_t s;
    PT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return (void *)s;
}
static void link_stream_free(void *c, void *s) {
    (void)c;
    PT_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)s));
}
static void *link_event_new(void *c) {
    (void)c;
    cudaEvent_t e;
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return (void *)e;
}
static void link_event_free(void *c, void *e) {
    (void)c;
    PT_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)e));
}
static void link_event_record(void *c, void *e, void *s) {
    (void)c;
    PT_CUDA_CHECK(cudaEventRecord((cudaEvent_t)e, (cudaStream_t)s));
}
static int link_event_query(void *c, void *e) {
    (void)c;
    cudaError_t r = cudaEventQuery((cudaEvent_t)e);
    if (r == cudaErrorNotReady) return 0;
    PT_CUDA_CHECK(r);
    return 1;
}
static void link_stream_wait(void *c, void *s, void *e) {
    (void)c;
    PT_CUDA_CHECK(cudaStreamWaitEvent((cudaStream_t)s, (cudaEvent_t)e, 0));
}
static void link_copy(void *c, void *dst, const void *src, size_t bytes, void *s) {
    (void)c;
    if (bytes && dst != src)
        PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)s));
}

/* The datasheet's dense bf16 peak of the cards we know, for MFU against the vendor's figure. */
static double datasheet_bf16_tflops(const cudaDeviceProp *p) {
    if (strstr(p->name, "H100") || strstr(p->name, "H200") || strstr(p->name, "H800") ||
        strstr(p->name, "GH200"))
        return strstr(p->name, "PCIe") ? 756.0 : 989.0;
    if (strstr(p->name, "A100") || strstr(p->name, "A800")) return 312.0;
    return 0.0;
}

extern "C" double pt_cuda_peak_tflops(pt_backend *be, int bf16) {
    if (!be || strcmp(be->name, "cuda") != 0) return 0.0;
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    return bf16 ? ctx->peak_tflops_bf16 : ctx->peak_tflops_fp32;
}
extern "C" double pt_cuda_datasheet_tflops(pt_backend *be) {
    if (!be || strcmp(be->name, "cuda") != 0) return 0.0;
    return datasheet_bf16_tflops(&pt_cuda_ctx_of(be)->prop);
}

static const char *cuda_describe(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    const cudaDeviceProp *p = &ctx->prop;
    snprintf(ctx->desc, sizeof ctx->desc,
             "cuda backend, GPU %d: %s (sm_%d%d, %d SMs, %.1f GiB), arena %.1f GiB; %s; "
             "measured GEMM peak %.0f TFLOP/s bf16, %.1f TFLOP/s fp32 (datasheet bf16 %.0f)",
             ctx->device, p->name, p->major, p->minor, p->multiProcessorCount,
             p->totalGlobalMem / 1073741824.0, ctx->arena.size / 1073741824.0,
             pt_cuda_gemm_describe(be), ctx->peak_tflops_bf16, ctx->peak_tflops_fp32,
             datasheet_bf16_tflops(p));
    return ctx->desc;
}

static void cuda_destroy(pt_backend *be) {
    pt_cuda_ctx *ctx = pt_cuda_ctx_of(be);
    cudaStreamSynchronize(ctx->stream);
    if (ctx->gemm) pt_cuda_gemm_destroy(be);
    for (int b = 0; b < 2; b++) {
        if (ctx->pinned[b]) cudaFreeHost(ctx->pinned[b]);
        if (ctx->pinned_done[b]) cudaEventDestroy(ctx->pinned_done[b]);
    }
    if (ctx->red_host) cudaFreeHost(ctx->red_host);
    pt_cuda_memory_destroy(be);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
    free(be);
}

static pt_backend *fail(pt_backend *be, const char *what, cudaError_t e) {
    pt_errorf(PT_ERR_RUNTIME, "CUDA backend: %s: %s", what, cudaGetErrorString(e));
    (void)cudaGetLastError();
    if (be) cuda_destroy(be);
    return NULL;
}

extern "C" pt_backend *pt_backend_cuda_create(int local_rank) {
    return pt_backend_cuda_create_shared(local_rank, 1);
}

extern "C" pt_backend *pt_backend_cuda_create_shared(int local_rank, int sharers) {
    int count = pt_cuda_device_count();
    if (count <= 0) {
        pt_errorf(PT_ERR_RUNTIME, "training.device = cuda: no CUDA device can be used here "
                  "(cudaGetDeviceCount found none, or no driver)");
        return NULL;
    }
    pt_cuda_ctx *ctx = (pt_cuda_ctx *)pt_calloc(1, sizeof *ctx);
    pt_backend *be = (pt_backend *)pt_calloc(1, sizeof *be);
    be->name = "cuda";
    be->ctx = ctx;
    be->n_threads = 1;
    be->bf16_native = 1;
    be->destroy = cuda_destroy;
    ctx->device = (local_rank < 0 ? 0 : local_rank) % count;
    cudaError_t e;
    if ((e = cudaSetDevice(ctx->device)) != cudaSuccess) return fail(be, "cudaSetDevice", e);
    if ((e = cudaGetDeviceProperties(&ctx->prop, ctx->device)) != cudaSuccess)
        return fail(be, "cudaGetDeviceProperties", e);
    if (ctx->prop.major < 8) {
        pt_errorf(PT_ERR_CONFIG, "training.device = cuda: GPU %d (%s) is sm_%d%d; the CUDA "
                  "backend is built for sm_80 (Ampere) and sm_90 (Hopper) and newer",
                  ctx->device, ctx->prop.name, ctx->prop.major, ctx->prop.minor);
        cuda_destroy(be);
        return NULL;
    }
    if ((e = cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking)) != cudaSuccess)
        return fail(be, "cudaStreamCreate", e);

    ctx->sharers = sharers < 1 ? 1 : sharers;
    if (pt_cuda_memory_init(be) != PT_OK) {
        cuda_destroy(be);
        return NULL;
    }

    ctx->pinned_bytes = PINNED_BYTES;
    for (int b = 0; b < 2; b++) {
        if ((e = cudaMallocHost((void **)&ctx->pinned[b], ctx->pinned_bytes)) != cudaSuccess)
            return fail(be, "cudaMallocHost", e);
        if ((e = cudaEventCreateWithFlags(&ctx->pinned_done[b], cudaEventDisableTiming)) !=
            cudaSuccess)
            return fail(be, "cudaEventCreate", e);
    }
    if ((e = cudaMallocHost((void **)&ctx->red_host, sizeof(double))) != cudaSuccess)
        return fail(be, "cudaMallocHost", e);
    ctx->red_scratch = (double *)pt_cuda_arena_alloc(be, (PT_K_SUMSQ_BLOCKS + 1) * sizeof(double));

    be->alloc = cuda_alloc;
    be->free = pt_cuda_arena_free;
    be->zero = cuda_zero;
    be->upload = cuda_upload;
    be->download = cuda_download;
    be->copy = cuda_copy;
    be->synchronize = cuda_synchronize;
    be->gemm = pt_cuda_gemm;
    be->gemm_bf16 = pt_cuda_gemm_bf16;
    be->to_bf16 = pt_cuda_to_bf16;
    be->from_bf16 = pt_cuda_from_bf16;
    be->embedding_forward = pt_cuda_embedding_forward;
    be->embedding_forward_bf16 = pt_cuda_embedding_forward_bf16;
    be->embedding_backward = pt_cuda_embedding_backward;
    be->rmsnorm_forward = pt_cuda_rmsnorm_forward;
    be->rmsnorm_backward = pt_cuda_rmsnorm_backward;
    be->rope = pt_cuda_rope;
    be->attention_forward = pt_cuda_attention_forward;
    be->attention_backward = pt_cuda_attention_backward;
    be->attention_merge = pt_cuda_attention_merge;
    be->swiglu_forward = pt_cuda_swiglu_forward;
    be->swiglu_backward = pt_cuda_swiglu_backward;
    be->softmax_xent = pt_cuda_softmax_xent;
    be->xent_stats = pt_cuda_xent_stats;
    be->xent_grad = pt_cuda_xent_grad;
    be->rows_gather = pt_cuda_rows_gather;
    be->rows_scatter_add = pt_cuda_rows_scatter_add;
    be->rows_copy = pt_cuda_rows_copy;
    be->rows_dot = pt_cuda_rows_dot;
    be->add = pt_cuda_add;
    be->sumsq = pt_cuda_sumsq;
    be->adamw = pt_cuda_adamw;
    be->describe = cuda_describe;
    const pt_device_link link = {ctx, ctx->device, (void *)ctx->stream, link_owns,
                                 link_host_alloc, link_host_free, link_to_host, link_to_device,
                                 link_stream_new, link_stream_free, link_event_new,
                                 link_event_free, link_event_record, link_event_query,
                                 link_stream_wait, link_copy};
    ctx->link = link;
    be->link = &ctx->link;
    if (pt_cuda_gemm_create(be) != PT_OK) {
        cuda_destroy(be);
        return NULL;
    }
    pt_cuda_gemm_measure_peaks(be);
    if ((e = cudaStreamSynchronize(ctx->stream)) != cudaSuccess)
        return fail(be, "set-up", e);
    return be;
}
