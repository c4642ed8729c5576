/* backend.h: the compute interface. A backend is a table of functions plus a context pointer.
 *
 * The model, the optimizer and (later) the parallel code call kernels only through this table and
 * never assume that device memory is host memory: tokens, parameters and activations passed to a
 * kernel live in memory from be->alloc; host data crosses with be->upload / be->download.
 * Two backends implement the table: the CPU's (src/backend/cpu) and CUDA's (src/backend/cuda).
 *
 * Conventions: all matrices are row-major fp32 (bf16 where a slot says so: pt_bf16 in core.h);
 * "N" is a count of token rows, "C" a row width;
 * a `ld*` argument is a row stride in elements. Kernels documented "+=" accumulate into their
 * output (parameter gradients, and the attention input gradients so that ring attention can sum
 * over key/value blocks); the others overwrite.
 */
#ifndef PT_BACKEND_H
#define PT_BACKEND_H

#include "pt/core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pt_backend pt_backend;

/* The shapes of one attention call: B sequences, Tq query rows against Tk key/value rows each.
 * Rows of q are (B, Tq) with n_heads·head_dim values at stride ldq; rows of k and v are (B, Tk)
 * with n_kv_heads·head_dim values at strides ldk and ldv; query head h reads kv head
 * h / (n_heads / n_kv_heads). The causal mask is by position: key j is visible to query i iff
 * k_pos[j] <= q_pos[i] (positions are shared by the B sequences; context parallelism passes the
 * global positions of its chunks), and with q_lo also k_pos[j] >= q_lo of the query's row. */
enum { PT_ATTN_MAX_HEAD_DIM = 256 }; /* the largest head_dim every backend's attention takes */
typedef struct {
    int B, Tq, Tk;
    int n_heads, n_kv_heads, head_dim;
    int ldq, ldk, ldv, ldo;
    const int32_t *q_pos; /* (Tq) */
    const int32_t *k_pos; /* (Tk) */
    /* Documents (block-causal attention) or NULL: (B, Tq), the position where the document of
     * query i of sequence b starts; key j is then visible to it iff
     * q_lo[b·Tq + i] ≤ k_pos[j] ≤ q_pos[i]. */
    const int32_t *q_lo;
    float scale;          /* 1/sqrt(head_dim) */
    /* 1: the probabilities that multiply v are rounded to bf16, as a bf16 P·V product would
     * have them. With s = q·kᵀ·scale and lse the row's log-sum-exp over this call's visible
     * keys (the lse output), each visible (query i, key j) has
     *   P[i][j] = exp(s[i][j] − lse[i])  (fp32, unrounded: the row sums to 1)
     *   P16[i][j] = bf16(P[i][j])        (round to nearest even, pt_bf16_round)
     * and out[i] = Σ_j P16[i][j]·v[j] in fp32, not renormalised. This is PyTorch's
     * `(torch.softmax(s, -1).bfloat16().float()) @ v` up to the fp32 rounding of s and lse, which
     * can move a probability lying within a few fp32 ulps of a bf16 rounding boundary to the
     * neighbouring bf16 value. Backward recomputes P from lse and uses P16 where the forward did:
     * dv += P16ᵀ·dout; dS = P∘(dP − D) with the unrounded P, dP = dout·vᵀ and D =
     * rowsum(dout∘out) as for 0 (the rounding passes the gradient straight through); dq, dk from
     * dS. lse is bitwise that of p_bf16 = 0. The forward computes the scores twice (lse first,
     * then P16·v): about 1.5× the work of p_bf16 = 0. The rounding is relative to the lse the
     * call is given or computes: key blocks run as separate calls and merged by attention_merge
     * would round exp(s − lse_block), not exp(s − lse) of all keys; ring attention therefore
     * makes two passes over the blocks with lse_only and lse_in below.
     * 0: fp32 throughout. */
    int p_bf16;
    /* Attention over key/value blocks that are separate calls (ring attention) in two passes;
     * p_bf16 = 1 only, one of them at a time (0 and NULL, the default: a call as above).
     * lse_only = 1, the first pass: the call writes lse, this call's row log-sum-exp over its
     *   visible keys, bitwise what the call would write without lse_only, and nothing else:
     *   out is neither read nor written (may be NULL), v is not read. The row's lse over all
     *   the blocks is log Σ_blocks e^lse_block (attention_merge with head_dim 0 merges the lse
     *   alone).
     * lse_in != NULL, the second pass: lse_in ((B, n_heads, Tq), like lse) is the row's lse over
     *   every block, used instead of computing one, and the call adds its block's share:
     *     out[i] += Σ_j bf16(exp(s[i][j] − lse_in[i]))·v[j]   over its visible keys j,
     *   not normalised; lse is not written (may be NULL). A row with lse_in = −∞ (no visible key
     *   in any block) is left as it is. The sum continues from out's value one key at a time in
     *   key order (fp32, as the one-call forward accumulates), so that the calls over
     *   consecutive key blocks in key order, out zeroed first and lse_in the one call's lse,
     *   give bitwise the one call's out. */
    int lse_only;
    const float *lse_in;
} pt_attn_shape;

typedef enum { PT_NO_TRANS = 0, PT_TRANS = 1 } pt_trans;

/* What the communication layer needs from a backend whose memory is not the host's (the CUDA
 * backend's; the CPU backend has none, and its guarded test form offers one on request: see
 * pt_backend_guard). The comm layer hands such memory to the network in one of two ways
 * (include/pt/comm.h, pt_comm_set_device): staged through host memory for MPI, or directly to
 * NCCL on streams of its own ordered against the backend's by events. Nothing else outside the
 * backend uses this table. Streams and events are opaque (cudaStream_t, cudaEvent_t). */
typedef struct pt_device_link {
    void *ctx;
    int device;   /* the device's ordinal (NCCL's communicators are made on it) */
    void *stream; /* the backend's compute stream: every kernel and copy of the backend */
    /* 1 when p lies in memory this backend allocated */
    int (*owns)(void *ctx, const void *p);
    /* page-locked host memory for staging (set-up and the first steps only), and back */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* device → host after everything queued on the compute stream so far: returns once the
     * bytes are on the host */
    void (*to_host)(void *ctx, void *host, const void *dev, size_t bytes);
    /* host → device, ordered before everything queued on the compute stream after it: returns
     * once the host buffer may be reused */
    void (*to_device)(void *ctx, void *dev, const void *host, size_t bytes);
    /* streams and events (the NCCL backend's): a new stream (non-blocking with respect to the
     * default stream), a new event (no timing), record ev on stream, 1 once everything before
     * ev's record has run (0 while not), make stream wait for ev, and free them */
    void *(*stream_new)(void *ctx);
    void (*stream_free)(void *ctx, void *stream);
    void *(*event_new)(void *ctx);
    void (*event_free)(void *ctx, void *ev);
    void (*event_record)(void *ctx, void *ev, void *stream);
    int (*event_query)(void *ctx, void *ev);
    void (*stream_wait)(void *ctx, void *stream, void *ev);
    /* device → device on stream (queued) */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes, void *stream);
} pt_device_link;

struct pt_backend {
    const char *name;
    void *ctx;
    int n_threads;
    /* 1 when gemm_bf16's dot products run on bf16 instructions (CPU: oneDNN's effective ISA is
     * avx512_core_bf16 or above); 0 when they are emulated in fp32 (same results up to summation
     * order, slower), e.g. without AVX512-BF16 or under DNNL_MAX_CPU_ISA=AVX512_CORE. */
    int bf16_native;
    /* NULL when the backend's memory is host memory (the comm layer hands it to the network as
     * it is); else how the comm layer reaches it (pt_device_link above) */
    const pt_device_link *link;

    /* memory */
    void *(*alloc)(pt_backend *be, size_t bytes);   /* zeroed, aligned */
    void (*free)(pt_backend *be, void *p);
    void (*zero)(pt_backend *be, void *p, size_t bytes);
    void (*upload)(pt_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*download)(pt_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy)(pt_backend *be, void *dst, const void *src, size_t bytes);
    void (*synchronize)(pt_backend *be);

    /* C (M,N) = alpha · op(A) · op(B) + beta · C, where op(A) is (M,K) and op(B) is (K,N). */
    void (*gemm)(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C, int ldc);
    /* The same product with bf16 inputs: C (M,N, fp32) = op(A)·op(B) + beta·C, beta 0 or 1
     * (anything else is a bug: assertion), products and sums in fp32, same transposes and
     * leading dimensions (in elements) as gemm. Any shape: the first call of a shape builds its
     * kernel (milliseconds) while its family (the shape less M and K) has few, later calls of it
     * allocate nothing; shapes beyond that (row counts that change every step, as a mixture of
     * experts' have) share one kernel with runtime dimensions per (ta, tb, beta). A shape's kernel
     * is chosen at its first call and kept. Call from one thread at a time. */
    void (*gemm_bf16)(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                      const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta, float *C,
                      int ldc);
    /* dst (n) = bf16(src), rounded as pt_bf16_round (nearest even; NaN stays NaN, inf stays
     * inf, no flush of denormals); and back, exactly. */
    void (*to_bf16)(pt_backend *be, pt_bf16 *dst, const float *src, size_t n);
    void (*from_bf16)(pt_backend *be, float *dst, const pt_bf16 *src, size_t n);

    /* tokens (N) -> out (N,C) = wte[tokens]. Tokens index rows [0, vocab): a token outside
     * [row0, row0+rows) gives a zero row (vocabulary-parallel embedding). */
    void (*embedding_forward)(pt_backend *be, float *out, const int32_t *tokens, const float *wte,
                              int N, int C, int row0, int rows);
    /* The same with bf16 rows (a bf16 model's embedding: its rows are copied, not rounded). */
    void (*embedding_forward_bf16)(pt_backend *be, pt_bf16 *out, const int32_t *tokens,
                                   const pt_bf16 *wte, int N, int C, int row0, int rows);
    /* dwte[tokens - row0] += dout, deterministic whatever the thread count. */
    void (*embedding_backward)(pt_backend *be, float *dwte, const int32_t *tokens,
                               const float *dout, int N, int C, int row0, int rows);

    /* inp (N,C), w (C) -> out (N,C) = inp · rsqrt(mean(inp²) + eps) · w; rstd (N) saved. */
    void (*rmsnorm_forward)(pt_backend *be, float *out, float *rstd, const float *inp,
                            const float *w, int N, int C, float eps);
    /* dinp += ..., dw += ... (N,C) */
    void (*rmsnorm_backward)(pt_backend *be, float *dinp, float *dw, const float *dout,
                             const float *inp, const float *w, const float *rstd, int N, int C);

    /* In place on x (N rows at stride ld, n_heads heads of head_dim each starting at column 0),
     * row n at position pos[n] (N positions),
     * Hugging Face "rotate half" convention: for i < head_dim/2, with a = pos·inv_freq[i],
     *   x'[i] = x[i]·cos a − x[i+hd/2]·sin a,  x'[i+hd/2] = x[i+hd/2]·cos a + x[i]·sin a.
     * cos/sin tables are (max_pos, head_dim/2). inverse = 1 applies the transpose (backward). */
    void (*rope)(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                 int ld, const float *cos_tab, const float *sin_tab, int inverse);

    /* Attention that never holds a Tq×Tk score matrix (tiles with online softmax).
     * out (B,Tq,n_heads·head_dim at ldo) = softmax(q·kᵀ·scale + mask)·v;
     * lse (B, n_heads, Tq) = log Σ exp(scores) over visible keys (-INFINITY and out = 0 if none). */
    void (*attention_forward)(pt_backend *be, const pt_attn_shape *s, const float *q,
                              const float *k, const float *v, float *out, float *lse);
    /* Recomputes the probabilities from q, k and lse; out and dout give D = rowsum(dout∘out).
     * dq +=, dk +=, dv += (same strides as q, k, v). lse and out may be the merged results of
     * several key/value blocks (ring attention); the gradient is then this block's share. */
    void (*attention_backward)(pt_backend *be, const pt_attn_shape *s, const float *q,
                               const float *k, const float *v, const float *out,
                               const float *dout, const float *lse, float *dq, float *dk,
                               float *dv);

    /* Ring attention: the result of one key/value block (out (B,T,H·hd at ldo), lse (B,H,T))
     * merged into the running one: lse = log(e^lse_acc + e^lse_blk), out = e^(lse_acc − lse)·out_acc
     * + e^(lse_blk − lse)·out_blk (a block no query saw, lse = −inf, leaves it unchanged). */
    void (*attention_merge)(pt_backend *be, float *out_acc, float *lse_acc, const float *out_blk,
                            const float *lse_blk, int B, int T, int H, int head_dim, int ldo);

    /* gu (N, 2F) = [gate | up] -> h (N,F) = silu(gate) · up */
    void (*swiglu_forward)(pt_backend *be, float *h, const float *gu, int N, int F);
    /* dh (N,F), gu (N,2F) -> dgu (N,2F) (overwrites; dgu may be gu: in place) */
    void (*swiglu_backward)(pt_backend *be, float *dgu, const float *dh, const float *gu, int N,
                            int F);

    /* Fused softmax cross-entropy over rows of logits (n, V at ld), in place:
     * losses[i] = logsumexp(row) − row[target] (0 when target = -1), and the row is replaced by
     * dscale · (softmax(row) − onehot(target)) (a zero row when target = -1). */
    void (*softmax_xent)(pt_backend *be, float *logits, float *losses, const int32_t *targets,
                         int n, int V, int ld, float dscale);

    /* Vocabulary-parallel cross-entropy, the columns of each row (n rows at ld) being the
     * vocabulary entries [v0, v0 + V) of a larger vocabulary (the rest of ld is padding).
     * xent_stats: per row, stats (n,3) = {max of the row, Σ exp(x − that max), x[target − v0]
     * (0 when the target is not in this block, or −1)}. The caller combines the blocks' stats
     * into the global max M and sum S (per row, host arrays of n each), then
     * xent_grad: the row becomes dscale · (exp(x − M) / S − onehot(target)) over its V columns,
     * padding and rows with target −1 become 0. */
    void (*xent_stats)(pt_backend *be, const float *logits, const int32_t *targets, int n, int V,
                       int ld, int v0, float *stats);
    void (*xent_grad)(pt_backend *be, float *logits, const int32_t *targets, int n, int V, int ld,
                      int v0, const float *M, const float *S, float dscale);

    /* Mixture of experts, rows of C floats: dst[i] = scale[i] · src[idx[i]] (gather), and
     * dst[idx[i]] += scale[i] · src[i] (scatter-add; rows with the same idx added in order);
     * scale = NULL means 1. idx and scale are device arrays of n. */
    void (*rows_gather)(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                        const float *scale, int n, int C);
    void (*rows_scatter_add)(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                             const float *scale, int n, int C);
    /* dst[i] = src[idx[i]], rows of row_bytes bytes (any element type: a bf16 gather) */
    void (*rows_copy)(pt_backend *be, void *dst, const void *src, const int32_t *idx, int n,
                      size_t row_bytes);
    /* out[i] = Σ_c x[idx[i]][c] · y[i][c] (n rows of C), each a double sum in the order of c;
     * out is (n) doubles of device memory (the router's gradient: each slot's dout · y) */
    void (*rows_dot)(pt_backend *be, double *out, const float *x, const int32_t *idx,
                     const float *y, int n, int C);

    /* y += x (n) */
    void (*add)(pt_backend *be, float *y, const float *x, size_t n);
    /* Σ x² in double (n) */
    double (*sumsq)(pt_backend *be, const float *x, size_t n);

    /* AdamW with PyTorch's semantics on n elements (step counts from 1), on the gradient
     * g·grad_scale (rounded to float first, as clip_grad_norm_ then AdamW would do):
     *   p -= lr·wd·p;  m = b1·m + (1−b1)·g;  v = b2·v + (1−b2)·g²;
     *   p -= (lr / (1 − b1^step)) · m / (sqrt(v) / sqrt(1 − b2^step) + eps). */
    void (*adamw)(pt_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                  float grad_scale);

    /* Human-readable description of the kernels in use (GEMM library, its kernel, threads, the
     * ISA, the bf16 GEMM's kernel and whether bf16 is native). */
    const char *(*describe)(pt_backend *be);
    void (*destroy)(pt_backend *be);
};

typedef enum { PT_GEMM_ONEDNN = 0, PT_GEMM_OPENBLAS = 1 } pt_gemm_lib;

/* Creates the CPU backend with n_threads OpenMP threads (0 = all cores) and the chosen GEMM
 * library. For OpenBLAS it selects the fastest kernel the CPU supports even where OpenBLAS does
 * not know the CPU model (see src/backend/cpu/gemm.c). Returns NULL with pt_last_error() set. */
pt_backend *pt_backend_cpu_create(int n_threads, pt_gemm_lib lib);

/* The CUDA backend (src/backend/cuda): one GPU per process, the device `local_rank mod the device
 * count`. At set-up it takes one arena of device memory (all the device's free memory less a
 * reserve for CUDA and cuBLASLt; PT_CUDA_ARENA_MB=N takes N MiB instead), two pinned staging
 * buffers, a stream, cuBLASLt's workspace, and measures the bf16 and fp32 GEMM peaks; nothing is
 * allocated on the device after that. Returns NULL with pt_last_error() set when pentatron was
 * built without CUDA, no device can be used, or the arena cannot be had. */
pt_backend *pt_backend_cuda_create(int local_rank);
/* The same for a process that shares its GPU with others: `sharers` processes use the device
 * (ranks on one host beyond the device count, as tests run many ranks on one GPU), and the arena
 * takes 1/sharers of the device's memory less the reserve of each. */
pt_backend *pt_backend_cuda_create_shared(int local_rank, int sharers);
/* The devices this process can use: 0 when built without CUDA, without a driver, or none. */
int pt_cuda_device_count(void);
/* PT_OK when a CUDA backend can be made here; else PT_ERR_CONFIG with the reason (built without
 * CUDA, no device or driver) in pt_last_error(). */
pt_status pt_cuda_check_usable(void);
/* The measured GEMM peaks (TFLOP/s) and the device's datasheet bf16 dense peak (0 when unknown)
 * of a CUDA backend; 0 for others. */
double pt_cuda_peak_tflops(pt_backend *be, int bf16);
double pt_cuda_datasheet_tflops(pt_backend *be);
/* The most device memory a CUDA backend has held at once (its arena's high-water mark: what the
 * run needed, where the GPU's own figure shows the whole arena); 0 for others. */
int64_t pt_cuda_memory_peak(pt_backend *be);
/* The device's memory in bytes (cudaDeviceProp.totalGlobalMem) of a CUDA backend; 0 for others. */
int64_t pt_cuda_device_memory(pt_backend *be);
/* cudaMalloc calls of this process's CUDA backends so far: one arena each, then none (the tests
 * hold steps to that). */
int64_t pt_cuda_malloc_count(void);

/* A test facility (src/backend/cpu/guard.c): a backend whose every slot calls `inner`'s, whose
 * alloc hands out page-aligned zeroed blocks of one reserved region (16 GiB of address space,
 * committed as used) that is inaccessible (PROT_NONE) except while a hold is taken
 * (pt_guard_hold in core.h): during every call of this backend and while a comm operation on
 * such memory is pending. Host code that reads or writes backend memory directly dies of
 * SIGSEGV at the access. Takes ownership of inner (destroyed with the wrapper, or on failure:
 * NULL with pt_last_error() set). pt_backend_cpu_create returns a guarded CPU backend when the
 * environment has PT_BACKEND_GUARD=1, and one in report mode with PT_BACKEND_GUARD=report. */
pt_backend *pt_backend_guard(pt_backend *inner);
/* Report mode, to find every offender in one run: a stray access to guarded memory prints the
 * faulting instruction's backtrace (once per instruction, frames as binary+0xOFFSET for
 * addr2line) on stderr, or appended to log_path when not NULL, and proceeds instead of killing
 * the process (PT_BACKEND_GUARD=report, PT_BACKEND_GUARD_LOG=path). Installs a SIGSEGV handler
 * (chaining to the one it replaces for other faults) unless it is already the current one:
 * pt_backend_cpu_create calls it for every backend it makes, since cmocka resets the handler
 * around each test. */
void pt_backend_guard_report(const char *log_path);
/* With PT_BACKEND_GUARD_LINK=1 (a test facility) a guarded backend also offers a device link
 * (be->link): its guarded memory is then "device memory" to the comm layer, copied to and from the
 * host under a hold, and the link's streams and events complete at once (the CPU backend runs
 * every call to its end). The comm layer's staging (comm.backend = mpi over device memory) is
 * tested on CPUs that way: any path that gives guarded memory to MPI, or reads it, dies. */

#ifdef __cplusplus
}
#endif

#endif
