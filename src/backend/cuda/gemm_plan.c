/* gemm_plan.c: the CUDA backend's GEMM host logic (gemm_plan.h): the row-major → column-major
 * mapping, shape keys, the plan cache, the workspace policy. Plain C, built and tested on every
 * machine, GPU or not. */
#include "backend/cuda/gemm_plan.h"

#include <stdlib.h>
#include <string.h>

pt_gemm_cm pt_gemm_colmajor(pt_trans ta, pt_trans tb, int M, int N, int K, int lda, int ldb,
                            int ldc) {
    pt_gemm_cm p;
    p.m = N, p.n = M, p.k = K;
    /* cuBLAS's A = the caller's B. Stored row-major (K, N) when tb = 0: column-major (N, K), which
     * is op(B)ᵀ itself (op N). Stored (N, K) when tb = 1: column-major (K, N) = op(B), whose
     * transpose is wanted (op T). */
    p.a.op = tb ? 1 : 0;
    p.a.rows = tb ? K : N;
    p.a.cols = tb ? N : K;
    p.a.ld = ldb;
    /* cuBLAS's B = the caller's A: stored (M, K) when ta = 0, column-major (K, M) = op(A)ᵀ (op N);
     * stored (K, M) when ta = 1, column-major (M, K) = op(A) (op T). */
    p.b.op = ta ? 1 : 0;
    p.b.rows = ta ? M : K;
    p.b.cols = ta ? K : M;
    p.b.ld = lda;
    /* C: row-major (M, N) = column-major (N, M) */
    p.c.op = 0;
    p.c.rows = N;
    p.c.cols = M;
    p.c.ld = ldc;
    return p;
}

int pt_gemm_align_log2(const void *p) {
    const uintptr_t u = (uintptr_t)p;
    int l = 0;
    while (l < 4 && !(u & ((uintptr_t)1 << l))) l++;
    return l;
}

pt_gemm_key pt_gemm_key_make(pt_gemm_dtype dtype, pt_trans ta, pt_trans tb, int M, int N, int K,
                             const void *A, int lda, const void *B, int ldb, float beta,
                             const void *C, int ldc) {
    pt_gemm_key k;
    memset(&k, 0, sizeof k);
    k.dtype = (uint8_t)dtype;
    k.ta = ta ? 1 : 0;
    k.tb = tb ? 1 : 0;
    k.beta_nz = beta != 0.0f;
    k.align_a = (uint8_t)pt_gemm_align_log2(A);
    k.align_b = (uint8_t)pt_gemm_align_log2(B);
    k.align_c = (uint8_t)pt_gemm_align_log2(C);
    k.M = M, k.N = N, k.K = K, k.lda = lda, k.ldb = ldb, k.ldc = ldc;
    return k;
}

pt_gemm_key pt_gemm_family(const pt_gemm_key *k) {
    pt_gemm_key f = *k;
    f.M = 0;
    f.K = 0;
    return f;
}

const char *pt_gemm_check(const pt_gemm_key *k, float beta) {
    if (k->M < 0 || k->N < 0 || k->K < 0) return "a negative dimension";
    if (k->dtype == PT_GEMM_BF16 && beta != 0.0f && beta != 1.0f)
        return "gemm_bf16's beta must be 0 or 1";
    const pt_gemm_cm p = pt_gemm_colmajor(k->ta, k->tb, k->M, k->N, k->K, k->lda, k->ldb, k->ldc);
    const int64_t need_a = p.b.rows > 1 ? p.b.rows : 1, need_b = p.a.rows > 1 ? p.a.rows : 1,
                  need_c = p.c.rows > 1 ? p.c.rows : 1;
    if (k->lda < need_a) return "lda is less than op(A)'s stored row length";
    if (k->ldb < need_b) return "ldb is less than op(B)'s stored row length";
    if (k->ldc < need_c) return "ldc is less than N";
    const int elt = k->dtype == PT_GEMM_BF16 ? 1 : 2; /* log2 of the input element's bytes */
    if (k->align_a < elt || k->align_b < elt) return "an input pointer is not element-aligned";
    if (k->align_c < 2) return "C is not 4-byte aligned";
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * the cache: two open-addressing tables (linear probing) over dense arrays */

static uint64_t pt_gemm_key_hash(const pt_gemm_key *k) {
    const unsigned char *b = (const unsigned char *)k;
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the key's bytes (its padding is zero) */
    for (size_t i = 0; i < sizeof *k; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int pt_gemm_key_eq(const pt_gemm_key *a, const pt_gemm_key *b) {
    return memcmp(a, b, sizeof *a) == 0;
}

void pt_gemm_plan_cache_init(pt_gemm_plan_cache *c, int cap, int per_family) {
    PT_ASSERT(cap >= 1 && per_family >= 1 && cap <= (1 << 24));
    memset(c, 0, sizeof *c);
    c->cap = cap;
    c->per_family = per_family;
    c->nslots = 1;
    while (c->nslots < 2 * cap) c->nslots *= 2;
    c->plans = pt_calloc((size_t)cap, sizeof *c->plans);
    c->fams = pt_calloc((size_t)cap, sizeof *c->fams);
    c->plan_slots = pt_calloc((size_t)c->nslots, sizeof *c->plan_slots);
    c->fam_slots = pt_calloc((size_t)c->nslots, sizeof *c->fam_slots);
}

void pt_gemm_plan_cache_free(pt_gemm_plan_cache *c) {
    free(c->plans);
    free(c->fams);
    free(c->plan_slots);
    free(c->fam_slots);
    memset(c, 0, sizeof *c);
}

/* The slot of the plan with this key, or the empty slot where it would go. */
static int32_t *pt_gemm_plan_slot(const pt_gemm_plan_cache *c, const pt_gemm_key *key) {
    const uint64_t mask = (uint64_t)c->nslots - 1;
    for (uint64_t s = pt_gemm_key_hash(key) & mask;; s = (s + 1) & mask) {
        int32_t *slot = &c->plan_slots[s];
        if (*slot == 0 || pt_gemm_key_eq(&c->plans[*slot - 1].key, key)) return slot;
    }
}

static int32_t *pt_gemm_fam_slot(const pt_gemm_plan_cache *c, const pt_gemm_key *fam) {
    const uint64_t mask = (uint64_t)c->nslots - 1;
    for (uint64_t s = pt_gemm_key_hash(fam) & mask;; s = (s + 1) & mask) {
        int32_t *slot = &c->fam_slots[s];
        if (*slot == 0 || pt_gemm_key_eq(&c->fams[*slot - 1].key, fam)) return slot;
    }
}

int pt_gemm_plan_lookup(pt_gemm_plan_cache *c, const pt_gemm_key *key) {
    const int32_t *slot = pt_gemm_plan_slot(c, key);
    if (*slot) {
        c->hits++;
        return *slot - 1;
    }
    c->misses++;
    return -1;
}

int pt_gemm_plan_family_count(const pt_gemm_plan_cache *c, const pt_gemm_key *key) {
    const pt_gemm_key fam = pt_gemm_family(key);
    const int32_t *slot = pt_gemm_fam_slot(c, &fam);
    return *slot ? c->fams[*slot - 1].n_plans : 0;
}

int pt_gemm_plan_insert(pt_gemm_plan_cache *c, const pt_gemm_key *key) {
    int32_t *pslot = pt_gemm_plan_slot(c, key);
    PT_ASSERTF(*pslot == 0, "GEMM plan inserted twice");
    const pt_gemm_key fam = pt_gemm_family(key);
    int32_t *fslot = pt_gemm_fam_slot(c, &fam);
    if (*fslot && c->fams[*fslot - 1].n_plans >= c->per_family) {
        c->refused_family++;
        return -1;
    }
    /* a new family needs a family entry; families never outnumber plans, so room for the plan
     * is room for its family */
    if (c->n >= c->cap) {
        c->refused_full++;
        return -1;
    }
    if (!*fslot) {
        c->fams[c->n_fam].key = fam;
        c->fams[c->n_fam].n_plans = 0;
        *fslot = ++c->n_fam;
    }
    const int32_t f = *fslot - 1;
    c->fams[f].n_plans++;
    c->plans[c->n].key = *key;
    c->plans[c->n].family = f;
    *pslot = ++c->n;
    return c->n - 1;
}

/* ---------------------------------------------------------------------------------------------
 * sizes */

size_t pt_gemm_workspace_bytes(int cc_major, size_t device_mem_bytes) {
    size_t ws = (size_t)(cc_major >= 9 ? 32 : 4) << 20;
    const size_t cap = device_mem_bytes / 64;
    if (ws > cap) ws = cap;
    return ws / 256 * 256;
}

static size_t pt_gemm_round256(size_t b) { return (b + 255) / 256 * 256; }

int pt_gemm_peak_dim(int want, size_t elt_in, size_t elt_out, size_t free_bytes) {
    for (int n = want; n >= 256; n /= 2) {
        const size_t nn = (size_t)n * (size_t)n;
        const size_t need = 2 * pt_gemm_round256(nn * elt_in) + pt_gemm_round256(nn * elt_out);
        if (need <= free_bytes) return n;
    }
    return 0;
}
