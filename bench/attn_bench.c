/* attn_bench.c: TFLOP/s of a backend's attention, forward and backward, causal, for the peers'
 * comparison (scripts/gpu_check.sh against PyTorch's SDPA; docs/benchmarks.md).
 *
 *   bench_attention cpu|cuda [B T H KV HD [P_BF16]]   (default 4 2048 32 8 64 1: Llama 3.2 1B)
 *
 * FLOPs are counted as FlashAttention's benchmarks count them: the forward 4·B·H·T²·hd halved
 * for the causal mask, the backward 2.5 times the forward. Median of 7 timed calls after 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 2 || (strcmp(argv[1], "cpu") && strcmp(argv[1], "cuda"))) {
        fprintf(stderr, "usage: bench_attention cpu|cuda [B T H KV HD [P_BF16]]\n");
        return 2;
    }
    int B = argc > 2 ? atoi(argv[2]) : 4, T = argc > 3 ? atoi(argv[3]) : 2048;
    int H = argc > 4 ? atoi(argv[4]) : 32, KV = argc > 5 ? atoi(argv[5]) : 8;
    int hd = argc > 6 ? atoi(argv[6]) : 64, p_bf16 = argc > 7 ? atoi(argv[7]) : 1;
    if (B < 1 || T < 1 || H < 1 || KV < 1 || H % KV || hd < 2 || hd > PT_ATTN_MAX_HEAD_DIM) {
        fprintf(stderr, "bench_attention: bad shape\n");
        return 2;
    }
    pt_backend *be = strcmp(argv[1], "cuda") == 0 ? pt_backend_cuda_create(0)
                                                  : pt_backend_cpu_create(0, PT_GEMM_ONEDNN);
    if (!be) {
        fprintf(stderr, "%s\n", pt_last_error());
        return 1;
    }
    printf("# %s\n", be->describe(be));
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *h = malloc(nq * sizeof(float));
    for (size_t i = 0; i < nq; i++) h[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    int32_t *pos = malloc(T * sizeof(int32_t));
    for (int i = 0; i < T; i++) pos[i] = i;
    float *q = be->alloc(be, nq * 4), *k = be->alloc(be, nk * 4), *v = be->alloc(be, nk * 4);
    float *out = be->alloc(be, nq * 4), *dout = be->alloc(be, nq * 4), *lse = be->alloc(be, nl * 4);
    float *dq = be->alloc(be, nq * 4), *dk = be->alloc(be, nk * 4), *dv = be->alloc(be, nk * 4);
    int32_t *dpos = be->alloc(be, T * sizeof(int32_t));
    be->upload(be, q, h, nq * 4);
    be->upload(be, dout, h, nq * 4);
    be->upload(be, k, h, nk * 4);
    be->upload(be, v, h + 7, (nk - 7) * 4);
    be->upload(be, dpos, pos, T * sizeof(int32_t));
    pt_attn_shape s = {B, T, T, H, KV, hd, H * hd, KV * hd, KV * hd, H * hd, dpos, dpos, NULL,
                       1.0f / sqrtf((float)hd), p_bf16, 0, NULL};
    double tf[7], tb[7];
    for (int r = 0; r < 9; r++) {
        be->synchronize(be);
        double t0 = pt_now();
        be->attention_forward(be, &s, q, k, v, out, lse);
        be->synchronize(be);
        double t1 = pt_now();
        be->attention_backward(be, &s, q, k, v, out, dout, lse, dq, dk, dv);
        be->synchronize(be);
        double t2 = pt_now();
        if (r >= 2) tf[r - 2] = t1 - t0, tb[r - 2] = t2 - t1;
    }
    qsort(tf, 7, sizeof *tf, cmp_d);
    qsort(tb, 7, sizeof *tb, cmp_d);
    double fwd = 4.0 * B * H * (double)T * T * hd / 2.0;
    printf("attention B %d T %d heads %d/%d hd %d p_bf16 %d: forward %.3f ms %.2f TFLOP/s, "
           "backward %.3f ms %.2f TFLOP/s, both %.2f TFLOP/s\n", B, T, H, KV, hd, p_bf16,
           tf[3] * 1e3, fwd / tf[3] / 1e12, tb[3] * 1e3, 2.5 * fwd / tb[3] / 1e12,
           3.5 * fwd / (tf[3] + tb[3]) / 1e12);
    be->free(be, q), be->free(be, k), be->free(be, v), be->free(be, out), be->free(be, dout);
    be->free(be, lse), be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dpos);
    free(h), free(pos);
    be->destroy(be);
    return 0;
}
