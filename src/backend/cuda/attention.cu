/* attention.cu: the attention slots of the CUDA backend (forward, backward, ring merge).
 *
 * fp32 SIMT kernels for sm_80 and sm_90, exact against the CPU backend by construction: each
 * kernel is a thread block running the block program of backend/cuda/attn_math.h (phases between
 * barriers; tests/test_cuda_host_attn.c runs the same phases on the host against
 * src/backend/cpu/attention.c), here only launched. Three kernels for the two slots:
 *   forward: a block per (sequence, query head, tile of queries), key tiles staged in shared
 *     memory, online softmax per row (p_bf16: a statistics pass for lse, then P16·V);
 *   backward: dq by a query-owner kernel, dk and dv by a key-owner kernel that loops over the
 *     query heads of its kv group and their queries in order, so that every output element has
 *     one writer (no atomics) and sums in a fixed order: the results repeat bit for bit.
 * Both backward kernels recompute D = rowsum(dout∘out) for their rows (a small share of their
 * work), so the backward needs no scratch memory. All kernels run on the backend's stream; none
 * allocates or synchronises.
 */
#include "backend/cuda/attn_math.h"
#include "backend/cuda/cuda_internal.h"

namespace {

/* the block program of one kernel: phases until PT_ATTN_END, a barrier after each */
template <int HDC>
__global__ void __launch_bounds__(PT_ATTN_NT) attn_forward_kernel(pt_attn_shape s, pt_attn_io io) {
    extern __shared__ float smem[];
    const pt_attn_geom G = pt_attn_geom_of(HDC);
    const pt_attn_fwd_smem sm = pt_attn_fwd_carve(smem, G, s.head_dim);
    const pt_attn_qblock qb = pt_attn_qblock_of(&s, G, (int64_t)blockIdx.x);
    pt_attn_fwd_thread ts;
    for (int ph = PT_ATTN_F_INIT; ph != PT_ATTN_END;) {
        ph = pt_attn_fwd_step(&s, &io, G, &qb, &sm, ph, (int)threadIdx.x, &ts);
        __syncthreads();
    }
}

template <int HDC>
__global__ void __launch_bounds__(PT_ATTN_NT) attn_dq_kernel(pt_attn_shape s, pt_attn_io io) {
    extern __shared__ float smem[];
    const pt_attn_geom G = pt_attn_geom_of(HDC);
    const pt_attn_dq_smem sm = pt_attn_dq_carve(smem, G, s.head_dim);
    const pt_attn_qblock qb = pt_attn_qblock_of(&s, G, (int64_t)blockIdx.x);
    pt_attn_dq_thread ts;
    for (int ph = PT_ATTN_Q_INIT; ph != PT_ATTN_END;) {
        ph = pt_attn_dq_step(&s, &io, G, &qb, &sm, ph, (int)threadIdx.x, &ts);
        __syncthreads();
    }
}

template <int HDC>
__global__ void __launch_bounds__(PT_ATTN_NT) attn_dkv_kernel(pt_attn_shape s, pt_attn_io io) {
    extern __shared__ float smem[];
    const pt_attn_geom G = pt_attn_geom_of(HDC);
    const pt_attn_dkv_smem sm = pt_attn_dkv_carve(smem, G, s.head_dim);
    const pt_attn_kblock kb = pt_attn_kblock_of(&s, G, (int64_t)blockIdx.x);
    pt_attn_dkv_thread ts;
    for (int ph = PT_ATTN_K_INIT; ph != PT_ATTN_END;) {
        ph = pt_attn_dkv_step(&s, &io, G, &kb, &sm, ph, (int)threadIdx.x, &ts);
        __syncthreads();
    }
}

/* A warp per (sequence, row, head): the merged weights and lse (every lane computes them), the
 * lanes over the row's columns. */
__global__ void __launch_bounds__(PT_ATTN_NT) attn_merge_kernel(float *out, float *lse,
                                                                const float *ob, const float *lb,
                                                                int B, int T, int H, int hd,
                                                                int ldo) {
    const int64_t row = (int64_t)blockIdx.x * PT_ATTN_NW + threadIdx.x / 32;
    const int lane = (int)threadIdx.x % 32;
    if (row >= (int64_t)B * T * H) return; /* the whole warp */
    const int64_t bt = row / H;
    const int h = (int)(row % H), b = (int)(bt / T), t = (int)(bt % T);
    float *la = &lse[((size_t)b * H + h) * T + t];
    float w1, w2, lnew;
    if (!pt_attn_merge_weights(*la, lb[((size_t)b * H + h) * T + t], &w1, &w2, &lnew)) return;
    float *o = out + (size_t)bt * ldo + (size_t)h * hd;
    const float *o2 = ob + (size_t)bt * ldo + (size_t)h * hd;
    for (int d = lane; d < hd; d += 32) o[d] = pt_attn_merge_elem(w1, o[d], w2, o2[d]);
    __syncwarp(); /* every lane has read *la */
    if (lane == 0) *la = lnew;
}

/* Dynamic shared memory beyond the default 48 KiB is an opt-in per kernel and per device; granted
 * once at the largest size a kernel instance can take (head_dim = its class), so that later
 * launches of any size need no call. The attribute is set on the current device (the backend's,
 * set at create); `done` has a bit per device, so that a backend made on another device of the
 * same process opts in there too. */
template <typename K>
void opt_in_smem(pt_backend *be, K kernel, size_t most, unsigned long long *done) {
    const unsigned long long bit = 1ull << (pt_cuda_ctx_of(be)->device & 63);
    if ((*done & bit) || most <= (size_t)PT_ATTN_SMEM_DEFAULT) return;
    PT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)most));
    *done |= bit;
}

void check_shape(const pt_attn_shape *s) {
    PT_ASSERT(s->B > 0 && s->Tq > 0 && s->Tk > 0);
    PT_ASSERT(s->n_kv_heads > 0 && s->n_heads % s->n_kv_heads == 0);
    PT_ASSERT(s->head_dim > 0 && s->head_dim <= PT_ATTN_MAX_HEAD_DIM);
    PT_ASSERT(s->q_pos && s->k_pos);
}

unsigned grid_of(int64_t blocks) {
    PT_ASSERTF(blocks > 0 && blocks <= INT32_MAX, "attention grid of %lld blocks",
               (long long)blocks);
    return (unsigned)blocks;
}

template <int HDC>
void forward(pt_backend *be, const pt_attn_shape *s, const pt_attn_io *io) {
    static unsigned long long done;
    const pt_attn_geom G = pt_attn_geom_of(HDC);
    const size_t smem = pt_attn_fwd_smem_bytes(G, s->head_dim);
    opt_in_smem(be, attn_forward_kernel<HDC>, pt_attn_fwd_smem_bytes(G, HDC), &done);
    attn_forward_kernel<HDC><<<grid_of(pt_attn_fwd_blocks(s, G)), PT_ATTN_NT, smem,
                               pt_cuda_stream(be)>>>(*s, *io);
    PT_CUDA_LAUNCHED();
}

template <int HDC>
void backward(pt_backend *be, const pt_attn_shape *s, const pt_attn_io *io) {
    static unsigned long long done_dkv, done_dq;
    const pt_attn_geom G = pt_attn_geom_of(HDC);
    const size_t smem_dkv = pt_attn_dkv_smem_bytes(G, s->head_dim);
    const size_t smem_dq = pt_attn_dq_smem_bytes(G, s->head_dim);
    opt_in_smem(be, attn_dkv_kernel<HDC>, pt_attn_dkv_smem_bytes(G, HDC), &done_dkv);
    opt_in_smem(be, attn_dq_kernel<HDC>, pt_attn_dq_smem_bytes(G, HDC), &done_dq);
    attn_dkv_kernel<HDC><<<grid_of(pt_attn_dkv_blocks(s, G)), PT_ATTN_NT, smem_dkv,
                           pt_cuda_stream(be)>>>(*s, *io);
    PT_CUDA_LAUNCHED();
    attn_dq_kernel<HDC><<<grid_of(pt_attn_fwd_blocks(s, G)), PT_ATTN_NT, smem_dq,
                          pt_cuda_stream(be)>>>(*s, *io);
    PT_CUDA_LAUNCHED();
}

} // namespace

extern "C" void pt_cuda_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                                          const float *k, const float *v, float *out,
                                          float *lse) {
    check_shape(s);
    PT_ASSERTF(s->p_bf16 || (!s->lse_only && !s->lse_in), "lse_only and lse_in need p_bf16");
    PT_ASSERTF(!(s->lse_only && s->lse_in), "lse_only and lse_in are two separate passes");
    pt_attn_io io = {};
    io.q = q, io.k = k, io.v = v, io.o = out, io.lse_out = lse;
    switch (pt_attn_hdc(s->head_dim)) {
    case 32: forward<32>(be, s, &io); break;
    case 64: forward<64>(be, s, &io); break;
    case 128: forward<128>(be, s, &io); break;
    default: forward<256>(be, s, &io); break;
    }
}

extern "C" void pt_cuda_attention_backward(pt_backend *be, const pt_attn_shape *s,
                                           const float *q, const float *k, const float *v,
                                           const float *out, const float *dout, const float *lse,
                                           float *dq, float *dk, float *dv) {
    check_shape(s);
    pt_attn_io io = {};
    io.q = q, io.k = k, io.v = v, io.out = out, io.dout = dout, io.lse = lse;
    io.dq = dq, io.dk = dk, io.dv = dv;
    switch (pt_attn_hdc(s->head_dim)) {
    case 32: backward<32>(be, s, &io); break;
    case 64: backward<64>(be, s, &io); break;
    case 128: backward<128>(be, s, &io); break;
    default: backward<256>(be, s, &io); break;
    }
}

extern "C" void pt_cuda_attention_merge(pt_backend *be, float *out_acc, float *lse_acc,
                                        const float *out_blk, const float *lse_blk, int B, int T,
                                        int H, int head_dim, int ldo) {
    const int64_t rows = (int64_t)B * T * H;
    if (rows <= 0) return;
    attn_merge_kernel<<<grid_of(pt_attn_merge_blocks(rows)), PT_ATTN_NT, 0,
                        pt_cuda_stream(be)>>>(out_acc, lse_acc, out_blk, lse_blk, B, T, H,
                                              head_dim, ldo);
    PT_CUDA_LAUNCHED();
}
