/* gemm_plan.h: the host-side logic of the CUDA backend's GEMMs (gemm.cu), plain C compiled into
 * every build and tested without a GPU (tests/test_cuda_host_gemm.c).
 *
 * 1. The operand mapping. pentatron's matrices are row-major, cuBLASLt's column-major. A row-major
 *    (R, C) matrix at stride ld is the column-major (C, R) matrix at the same ld, its transpose;
 *    so C = op(A)·op(B) (row-major, (M, N)) is computed as Cᵀ = op(B)ᵀ·op(A)ᵀ (column-major,
 *    (N, M)): cuBLAS's A is the caller's B, cuBLAS's B the caller's A, m = N, n = M, k = K, and
 *    each operand's cuBLAS op is the caller's flag (a row-major stored (K, N) B is already
 *    op(B)ᵀ = (N, K) column-major; a transposed one, stored (N, K), is (K, N) column-major and
 *    needs op T). pt_gemm_colmajor gives the layouts as a pure function.
 *
 * 2. The shape key and the plan cache. A key is everything the choice of a cuBLASLt algorithm
 *    depends on: dtype, ta, tb, M, N, K, lda, ldb, ldc, beta class (0 or not), and each pointer's
 *    alignment class (its largest power-of-two divisor up to 16 bytes: cuBLASLt's vectorised
 *    kernels need 16-byte aligned operands, and the heuristic is told the real alignment so it
 *    never picks a kernel that the operands cannot run). A shape's algorithm is the heuristic's
 *    first choice for its exact key, a pure function of the key (and of the device and cuBLASLt
 *    version): the cache is a memo of that function and never changes a result, only how fast
 *    the choice is made. That is deliberate. A plan shared by a family with runtime dimensions
 *    (the CPU's answer to a mixture of experts' changing row counts) would make a shape's kernel,
 *    hence its rounding, depend on how many shapes of its family came before: a run resumed
 *    from a checkpoint, which has seen fewer, would diverge bitwise from the run it continues.
 *    Here the same key gives bitwise the same result in any run on the same GPU model.
 *
 *    The cache holds `cap` plans (fixed at create, nothing allocated after). A family is a key
 *    less M and K (the dimensions a mixture of experts changes every step: M in the forward and
 *    input-gradient products, K in the weight gradient's). A new key is memoised only while its
 *    family has fewer than `per_family` plans and the table has room; so a family whose row
 *    counts keep changing cannot take the table from the dense model's few dozen steady shapes.
 *    A key that is not memoised runs through the same family descriptor with its dimensions set
 *    per call and a heuristic query per call (the "runtime" path: what PyTorch does on every
 *    call; host work only, no device allocation, no synchronisation), giving the algorithm the
 *    memo would have held.
 *
 * 3. The workspace policy (pt_gemm_workspace_bytes) and the size of the peak-measuring GEMMs
 *    (pt_gemm_peak_dim).
 *
 * 4. Validation (pt_gemm_check): what cuBLASLt requires and pentatron's callers guarantee
 *    (dimensions ≥ 0, each ld at least its layout's rows, element-aligned pointers, bf16's beta
 *    0 or 1); a violation is a bug, reported by the slot with PT_ASSERTF.
 */
#ifndef PT_CUDA_GEMM_PLAN_H
#define PT_CUDA_GEMM_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "pt/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PT_GEMM_F32 = 0, PT_GEMM_BF16 = 1 } pt_gemm_dtype;

/* ---------------------------------------------------------------------------------------------
 * operand mapping */

typedef struct {
    int op;                  /* 0: CUBLAS_OP_N, 1: CUBLAS_OP_T */
    int64_t rows, cols, ld;  /* the stored matrix as cuBLASLt's column-major layout */
} pt_gemm_cm_operand;

typedef struct {
    int64_t m, n, k;         /* cuBLAS's problem: D (m, n) = op(A) (m, k) · op(B) (k, n) */
    pt_gemm_cm_operand a;    /* cuBLAS's A: the caller's B */
    pt_gemm_cm_operand b;    /* cuBLAS's B: the caller's A */
    pt_gemm_cm_operand c;    /* C and D: the caller's C, op 0 */
} pt_gemm_cm;

/* The column-major problem computing the row-major C (M,N) = op(A)·op(B); cuBLAS's A pointer is
 * the caller's B and cuBLAS's B pointer the caller's A. */
pt_gemm_cm pt_gemm_colmajor(pt_trans ta, pt_trans tb, int M, int N, int K, int lda, int ldb,
                            int ldc);

/* ---------------------------------------------------------------------------------------------
 * keys */

typedef struct {
    uint8_t dtype, ta, tb, beta_nz;      /* beta_nz: beta != 0 */
    uint8_t align_a, align_b, align_c;   /* log2 of each pointer's alignment class, ≤ 4 (16 B) */
    uint8_t pad_;                        /* zero: keys are compared as bytes */
    int32_t M, N, K, lda, ldb, ldc;
} pt_gemm_key;

/* log2 of the largest power of two dividing the address, capped at 4 (16 bytes; NULL gives 4) */
int pt_gemm_align_log2(const void *p);
/* The key of a call (every byte set, padding included). */
pt_gemm_key pt_gemm_key_make(pt_gemm_dtype dtype, pt_trans ta, pt_trans tb, int M, int N, int K,
                             const void *A, int lda, const void *B, int ldb, float beta,
                             const void *C, int ldc);
/* The key's family: the key with M and K zeroed. */
pt_gemm_key pt_gemm_family(const pt_gemm_key *k);
/* NULL when a call of this key may run; otherwise what is wrong (a static string). */
const char *pt_gemm_check(const pt_gemm_key *k, float beta);

/* ---------------------------------------------------------------------------------------------
 * plan cache */

#ifndef PT_CUDA_GEMM_CACHE_CAP
#define PT_CUDA_GEMM_CACHE_CAP 1024 /* plans; a dense Llama step has about 20 shapes */
#endif
#ifndef PT_CUDA_GEMM_PER_FAMILY
#define PT_CUDA_GEMM_PER_FAMILY 64  /* plans of one family (shape less M and K) */
#endif

typedef struct {
    pt_gemm_key key;
    int32_t family;          /* index into fam */
} pt_gemm_plan_entry;

typedef struct {
    pt_gemm_key key;         /* M = K = 0 */
    int32_t n_plans;
} pt_gemm_family_entry;

typedef struct {
    int cap, per_family;
    int n, n_fam;                   /* plans and families in use */
    pt_gemm_plan_entry *plans;      /* cap, dense in insertion order: a plan's index is stable */
    pt_gemm_family_entry *fams;     /* cap */
    int32_t *plan_slots, *fam_slots; /* open addressing: index + 1, 0 empty; nslots each */
    int nslots;                     /* a power of two ≥ 2·cap */
    /* counters: lookups that found a plan, lookups that did not, inserts refused because the
     * family had per_family plans, inserts refused because the table was full */
    int64_t hits, misses, refused_family, refused_full;
} pt_gemm_plan_cache;

/* Allocates the table for `cap` plans, at most `per_family` per family (≥ 1 each). */
void pt_gemm_plan_cache_init(pt_gemm_plan_cache *c, int cap, int per_family);
void pt_gemm_plan_cache_free(pt_gemm_plan_cache *c);
/* The index in [0, cap) of key's plan, or -1 (counts a hit or a miss). */
int pt_gemm_plan_lookup(pt_gemm_plan_cache *c, const pt_gemm_key *key);
/* Memoises key (not in the cache: after a lookup missed) and returns its index, or -1 when its
 * family already has per_family plans or the table is full: the call then takes the runtime
 * path. Allocates nothing. */
int pt_gemm_plan_insert(pt_gemm_plan_cache *c, const pt_gemm_key *key);
/* The number of plans of key's family (0 when the family is unknown). */
int pt_gemm_plan_family_count(const pt_gemm_plan_cache *c, const pt_gemm_key *key);

/* ---------------------------------------------------------------------------------------------
 * sizes */

/* cuBLASLt's workspace: 32 MiB on Hopper and later (compute capability ≥ 9: its TMA kernels and
 * split-K reductions want it; NVIDIA's recommendation), 4 MiB before; never more than 1/64 of
 * the device's memory; a multiple of 256 bytes. */
size_t pt_gemm_workspace_bytes(int cc_major, size_t device_mem_bytes);

/* The side n of the square GEMMs that measure a peak: the largest of `want`, want/2, ... ≥ 256
 * whose operands (two n×n of elt_in bytes, one of elt_out, each rounded up to 256 bytes) fit in
 * `free_bytes`; 0 when none does. */
int pt_gemm_peak_dim(int want, size_t elt_in, size_t elt_out, size_t free_bytes);

#ifdef __cplusplus
}
#endif

#endif
