/* test_gpu_nccl.c: the NCCL comm backend (src/comm/comm_nccl.c) on a real GPU with NCCL's own
 * library, one process (a communicator of one rank: every operation runs, sends and receives to
 * itself), device buffers from the CUDA backend:
 *   - every operation on device memory against its formula: all-reduce fp32 and bf16,
 *     reduce-scatter in place (ours: the result at the start) and from a separate input,
 *     all-gather in place and not, broadcast, all-to-all-v, a send and a receive to itself;
 *     host memory over MPI on the same group; a split and a dup with their own NCCL
 *     communicators; the counters as MPI's;
 *   - with PT_GPU_NCCL_HANG=1 (scripts/gpu_check.sh runs it apart): a receive that no send
 *     matches, whose wait times out (1 s) and aborts the communicator (ncclCommAbort) before the
 *     job ends naming the group and the operation (exit non-zero).
 * A GPU test: exits 77 (skipped) without a usable CUDA device or without NCCL (a build without
 * its header, or libnccl.so.2 not found: the reason is printed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"
#include "pt/comm.h"

static int failed;

#define CHECK(cond, what)                                                                          \
    do {                                                                                           \
        int ok_ = (cond);                                                                          \
        printf("%-6s %s\n", ok_ ? "ok" : "FAIL", what);                                           \
        failed += !ok_;                                                                            \
    } while (0)

static void *up(pt_backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(be, bytes);
    be->upload(be, d, h, bytes);
    return d;
}

static int all(const float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++)
        if (x[i] != v) return 0;
    return 1;
}

int main(void) {
    if (pt_cuda_check_usable() != PT_OK) {
        printf("skipped: no CUDA device (%s)\n", pt_last_error());
        return 77;
    }
    int rank = 0, world = 1;
    if (pt_comm_runtime_init(&rank, &world) != PT_OK) return 1;
    pt_backend *be = pt_backend_cuda_create(0);
    if (!be) {
        printf("skipped: the CUDA backend cannot be made (%s)\n", pt_last_error());
        return 77;
    }
    if (pt_comm_set_device(be->link, PT_COMM_NCCL) != PT_OK) {
        printf("skipped: %s\n", pt_last_error());
        return 77;
    }
    int hang = getenv("PT_GPU_NCCL_HANG") && atoi(getenv("PT_GPU_NCCL_HANG")) > 0;
    pt_comm *w = pt_comm_world(hang ? 1.0 : 60.0);
    if (pt_comm_device_attach(w) != PT_OK) {
        printf("FAIL: the NCCL world: %s\n", pt_last_error());
        return 1;
    }
    enum { N = 4096 };
    float *h = malloc(N * sizeof *h), *back = malloc(N * sizeof *back);
    if (hang) {
        float *x = be->alloc(be, N * sizeof(float));
        pt_comm_wait(w, w->irecv(w, x, N, PT_DTYPE_F32, 0, 1)); /* no send: times out */
        printf("FAIL: the unmatched receive completed\n");
        return 1;
    }
    for (int i = 0; i < N; i++) h[i] = (float)(i % 11);
    float *x = up(be, h, N * sizeof *h);
    pt_comm_wait(w, w->iallreduce(w, x, N, PT_DTYPE_F32));
    be->download(be, back, x, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "all-reduce fp32 over one rank leaves the buffer");
    pt_bf16 *hb = malloc(N * sizeof *hb), *bb = malloc(N * sizeof *bb);
    for (int i = 0; i < N; i++) hb[i] = pt_bf16_round((float)(i % 5) * 0.25f);
    pt_bf16 *xb = up(be, hb, N * sizeof *hb);
    pt_comm_wait(w, w->iallreduce(w, xb, N, PT_DTYPE_BF16));
    be->download(be, bb, xb, N * sizeof *bb);
    CHECK(!memcmp(bb, hb, N * sizeof *hb), "all-reduce bf16");
    /* reduce-scatter: one rank, its block is the whole buffer; from a separate input too */
    float *y = be->alloc(be, N * sizeof(float));
    pt_comm_wait(w, w->ireduce_scatter(w, x, y, N, PT_DTYPE_F32));
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "reduce-scatter from a separate input");
    pt_comm_wait(w, w->ireduce_scatter(w, NULL, y, N, PT_DTYPE_F32));
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "reduce-scatter in place");
    be->zero(be, y, N * sizeof(float));
    pt_comm_wait(w, w->iallgather(w, x, y, N, PT_DTYPE_F32));
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "all-gather from a separate input");
    pt_comm_wait(w, w->iallgather(w, NULL, y, N, PT_DTYPE_F32));
    pt_comm_wait(w, w->ibcast(w, y, N, PT_DTYPE_F32, 0));
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "all-gather in place, broadcast");
    /* all-to-all-v and a send/receive, each to itself */
    int64_t sc[1] = {N / 2}, rc[1] = {N / 2};
    be->zero(be, y, N * sizeof(float));
    pt_comm_wait(w, w->ialltoallv(w, x, sc, y, rc, PT_DTYPE_F32));
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N / 2 * sizeof *h) && all(back + N / 2, N / 2, 0.0f), "all-to-all-v");
    be->zero(be, y, N * sizeof(float));
    pt_comm_req *s = w->isend(w, x, N, PT_DTYPE_F32, 0, 3), *r = w->irecv(w, y, N, PT_DTYPE_F32, 0, 3);
    pt_comm_wait(w, s);
    pt_comm_wait(w, r);
    be->download(be, back, y, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h), "send and receive to itself");
    int32_t hv[2] = {3, 4};
    pt_allreduce_sum(w, hv, 2, PT_DTYPE_I32);
    CHECK(hv[0] == 3 && hv[1] == 4, "host memory over MPI on the same group");
    CHECK(w->stats.calls[PT_COMM_ALLREDUCE] == 3 && w->stats.calls[PT_COMM_SEND] == 1 &&
              w->stats.bytes[PT_COMM_SEND] == N * sizeof(float),
          "counted as MPI's");
    pt_comm *g = w->split(w, 0, 0, "split"), *d = g->dup(g, "dup");
    be->upload(be, x, h, N * sizeof *h);
    pt_comm_wait(d, d->iallreduce(d, x, N, PT_DTYPE_F32));
    be->download(be, back, x, N * sizeof *back);
    CHECK(!memcmp(back, h, N * sizeof *h) && d->stats.calls[PT_COMM_ALLREDUCE] == 1,
          "a split and a dup with their own NCCL communicators");
    d->free(d);
    g->free(g);
    w->free(w);
    be->destroy(be);
    printf("test_gpu_nccl: %d failed\n", failed);
    pt_comm_runtime_finalize();
    return failed ? 1 : 0;
}
