/* test_cuda_host_gemm.c: the CUDA backend's GEMM host logic (src/backend/cuda/gemm_plan.c) on any
 * machine, GPU or not: the row-major → column-major operand mapping, run through a naive
 * column-major GEMM and compared with the CPU backend's gemm for every transpose pair and odd
 * leading dimensions; the shape keys and their validation; the plan cache (hits, misses,
 * families, capacity, nothing allocated after init); the workspace and peak-size policies. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/gemm_plan.h"
#include "pt/backend.h"
#include "testutil.h"

/* cuBLAS's column-major D (m, n) = alpha · op(A)·op(B) + beta · C, the way cublasLtMatmul reads
 * its layouts: an op-N operand (r, c) is element (i, j) at i + j·ld, an op-T one is read
 * transposed. Every access is checked against the layout's rows and cols, so a mapping that
 * describes the stored matrices wrongly fails even where the product would come out right. */
static float cm_at(const float *X, const pt_gemm_cm_operand *o, int64_t i, int64_t p) {
    const int64_t r = o->op ? p : i, c = o->op ? i : p;
    if (!(r >= 0 && r < o->rows && c >= 0 && c < o->cols && o->rows <= o->ld))
        fail_msg("access (%lld, %lld) outside the layout (%lld x %lld, ld %lld)", (long long)r,
                 (long long)c, (long long)o->rows, (long long)o->cols, (long long)o->ld);
    return X[r + c * o->ld];
}

static void cm_gemm(const pt_gemm_cm *p, float alpha, const float *a, const float *b, float beta,
                    float *c) {
    if (p->c.rows != p->m || p->c.cols != p->n) fail_msg("C's layout is not m x n");
    if ((p->a.op ? p->a.cols : p->a.rows) != p->m || (p->a.op ? p->a.rows : p->a.cols) != p->k)
        fail_msg("op(A) is not m x k");
    if ((p->b.op ? p->b.cols : p->b.rows) != p->k || (p->b.op ? p->b.rows : p->b.cols) != p->n)
        fail_msg("op(B) is not k x n");
    for (int64_t j = 0; j < p->n; j++)
        for (int64_t i = 0; i < p->m; i++) {
            double s = 0;
            for (int64_t q = 0; q < p->k; q++)
                s += (double)cm_at(a, &p->a, i, q) * (double)cm_at(b, &p->b, q, j);
            float *d = &c[i + j * p->c.ld];
            *d = (float)(alpha * s + (beta != 0.0f ? (double)beta * *d : 0.0));
        }
}

static void check_mapping(pt_backend *cpu, int ta, int tb, int M, int N, int K, int pad,
                          float alpha, float beta) {
    const int lda = (ta ? M : K) + pad, ldb = (tb ? K : N) + pad, ldc = N + pad;
    const size_t na = (size_t)(ta ? K : M) * lda, nb = (size_t)(tb ? N : K) * ldb,
                 nc = (size_t)M * ldc;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C0 = malloc(nc * 4), *Ccpu = malloc(nc * 4),
          *Ccm = malloc(nc * 4);
    tu_fill(A, na, 101 + ta, 1.0f);
    tu_fill(B, nb, 103 + tb, 1.0f);
    tu_fill(C0, nc, 107, 1.0f);
    memcpy(Ccpu, C0, nc * 4);
    memcpy(Ccm, C0, nc * 4);
    cpu->gemm(cpu, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, Ccpu, ldc);
    const pt_gemm_cm p = pt_gemm_colmajor(ta, tb, M, N, K, lda, ldb, ldc);
    cm_gemm(&p, alpha, B, A, beta, Ccm); /* cuBLAS's A is our B, its B our A */
    char what[128];
    snprintf(what, sizeof what, "column-major mapping ta=%d tb=%d %dx%dx%d pad %d beta %g", ta, tb,
             M, N, K, pad, (double)beta);
    tu_check_rel(what, tu_rel_err(Ccm, Ccpu, nc), 1e-6);
    for (size_t i = 0; i < nc; i++) /* the padding columns untouched by either */
        if ((int)(i % (size_t)ldc) >= N && Ccm[i] != C0[i]) fail_msg("%s: padding written", what);
    free(A), free(B), free(C0), free(Ccpu), free(Ccm);
}

static void test_mapping_matches_the_cpu_gemm(void **state) {
    (void)state;
    pt_backend *cpu = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    if (!cpu) fail_msg("CPU backend: %s", pt_last_error());
    const int shapes[][3] = {{7, 5, 9}, {1, 13, 3}, {11, 1, 17}, {6, 8, 1}, {33, 19, 41}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int pad = 0; pad <= 3; pad += 3) {
                    check_mapping(cpu, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                                  1.0f, 0.0f);
                    check_mapping(cpu, ta, tb, shapes[s][0], shapes[s][1], shapes[s][2], pad,
                                  0.75f, 0.5f);
                }
    cpu->destroy(cpu);
}

static void test_mapping_fields(void **state) {
    (void)state;
    /* C (M,N) = A (M,K) · Bᵀ with B stored (N,K) (the model's X·Wᵀ): cuBLAS's A is B with op T,
     * its B is A with op N; m = N, n = M */
    pt_gemm_cm p = pt_gemm_colmajor(PT_NO_TRANS, PT_TRANS, 4, 6, 8, 10, 12, 14);
    assert_int_equal(p.m, 6);
    assert_int_equal(p.n, 4);
    assert_int_equal(p.k, 8);
    assert_int_equal(p.a.op, 1);
    assert_int_equal(p.a.rows, 8);
    assert_int_equal(p.a.cols, 6);
    assert_int_equal(p.a.ld, 12);
    assert_int_equal(p.b.op, 0);
    assert_int_equal(p.b.rows, 8);
    assert_int_equal(p.b.cols, 4);
    assert_int_equal(p.b.ld, 10);
    assert_int_equal(p.c.rows, 6);
    assert_int_equal(p.c.cols, 4);
    assert_int_equal(p.c.ld, 14);
    /* the weight gradient dYᵀ·X: A stored (K, M) transposed, B (K, N) */
    p = pt_gemm_colmajor(PT_TRANS, PT_NO_TRANS, 4, 6, 8, 5, 7, 9);
    assert_int_equal(p.a.op, 0);
    assert_int_equal(p.a.rows, 6);
    assert_int_equal(p.a.cols, 8);
    assert_int_equal(p.b.op, 1);
    assert_int_equal(p.b.rows, 4);
    assert_int_equal(p.b.cols, 8);
}

/* ---------------------------------------------------------------------------------------------
 * keys and validation */

static void test_alignment_classes(void **state) {
    (void)state;
    assert_int_equal(pt_gemm_align_log2((void *)0x1000), 4);
    assert_int_equal(pt_gemm_align_log2((void *)0x1010), 4);
    assert_int_equal(pt_gemm_align_log2((void *)0x1008), 3);
    assert_int_equal(pt_gemm_align_log2((void *)0x1004), 2);
    assert_int_equal(pt_gemm_align_log2((void *)0x1002), 1);
    assert_int_equal(pt_gemm_align_log2((void *)0x1001), 0);
    assert_int_equal(pt_gemm_align_log2(NULL), 4);
}

static pt_gemm_key key_of(pt_gemm_dtype dt, int ta, int tb, int M, int N, int K, int lda, int ldb,
                          int ldc, float beta) {
    return pt_gemm_key_make(dt, ta, tb, M, N, K, (void *)0x10000, lda, (void *)0x20000, ldb, beta,
                            (void *)0x30000, ldc);
}

static void test_key_fields_and_family(void **state) {
    (void)state;
    pt_gemm_key k = pt_gemm_key_make(PT_GEMM_BF16, PT_TRANS, PT_NO_TRANS, 3, 5, 7, (void *)0x1002,
                                     11, (void *)0x1008, 13, 0.5f, (void *)0x1004, 17);
    assert_int_equal(k.dtype, PT_GEMM_BF16);
    assert_int_equal(k.ta, 1);
    assert_int_equal(k.tb, 0);
    assert_int_equal(k.beta_nz, 1);
    assert_int_equal(k.align_a, 1);
    assert_int_equal(k.align_b, 3);
    assert_int_equal(k.align_c, 2);
    assert_int_equal(k.M, 3);
    assert_int_equal(k.N, 5);
    assert_int_equal(k.K, 7);
    assert_int_equal(k.lda, 11);
    assert_int_equal(k.ldb, 13);
    assert_int_equal(k.ldc, 17);
    assert_int_equal(key_of(PT_GEMM_F32, 0, 0, 1, 1, 1, 1, 1, 1, 0.0f).beta_nz, 0);
    const pt_gemm_key f = pt_gemm_family(&k);
    assert_int_equal(f.M, 0);
    assert_int_equal(f.K, 0);
    assert_int_equal(f.N, 5);
    assert_int_equal(f.lda, 11);
    assert_int_equal(f.ldb, 13);
    assert_int_equal(f.ldc, 17);
    assert_int_equal(f.beta_nz, 1);
}

static void expect_bad(pt_gemm_key k, float beta, const char *what) {
    const char *why = pt_gemm_check(&k, beta);
    if (!why) fail_msg("%s: accepted", what);
    print_message("%s: %s\n", what, why ? why : "(accepted)");
}

static void test_validation(void **state) {
    (void)state;
    /* every ld at exactly its minimum is accepted, one less is refused */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const int M = 5, N = 7, K = 9, lda = ta ? M : K, ldb = tb ? K : N, ldc = N;
            pt_gemm_key k = key_of(PT_GEMM_F32, ta, tb, M, N, K, lda, ldb, ldc, 1.0f);
            const char *why = pt_gemm_check(&k, 1.0f);
            if (why) fail_msg("ta=%d tb=%d dense: refused: %s", ta, tb, why);
            expect_bad(key_of(PT_GEMM_F32, ta, tb, M, N, K, lda - 1, ldb, ldc, 1.0f), 1.0f,
                       "lda short");
            expect_bad(key_of(PT_GEMM_F32, ta, tb, M, N, K, lda, ldb - 1, ldc, 1.0f), 1.0f,
                       "ldb short");
            expect_bad(key_of(PT_GEMM_F32, ta, tb, M, N, K, lda, ldb, ldc - 1, 1.0f), 1.0f,
                       "ldc short");
        }
    expect_bad(key_of(PT_GEMM_F32, 0, 0, -1, 2, 2, 2, 2, 2, 0.0f), 0.0f, "negative M");
    expect_bad(key_of(PT_GEMM_BF16, 0, 0, 2, 2, 2, 2, 2, 2, 0.5f), 0.5f, "bf16 beta 0.5");
    pt_gemm_key ok = key_of(PT_GEMM_BF16, 0, 0, 2, 2, 2, 2, 2, 2, 1.0f);
    assert_null(pt_gemm_check(&ok, 1.0f));
    ok = key_of(PT_GEMM_F32, 0, 0, 2, 2, 2, 2, 2, 2, 0.5f); /* fp32 takes any beta */
    assert_null(pt_gemm_check(&ok, 0.5f));
    /* a bf16 operand at an odd address, an fp32 one at 2 bytes, C at 2 bytes */
    expect_bad(pt_gemm_key_make(PT_GEMM_BF16, 0, 0, 2, 2, 2, (void *)0x1001, 2, (void *)0x2000,
                                2, 0.0f, (void *)0x3000, 2), 0.0f, "bf16 A misaligned");
    ok = pt_gemm_key_make(PT_GEMM_BF16, 0, 0, 2, 2, 2, (void *)0x1002, 2, (void *)0x2002, 2, 0.0f,
                          (void *)0x3004, 2);
    assert_null(pt_gemm_check(&ok, 0.0f));
    expect_bad(pt_gemm_key_make(PT_GEMM_F32, 0, 0, 2, 2, 2, (void *)0x1000, 2, (void *)0x2002, 2,
                                0.0f, (void *)0x3000, 2), 0.0f, "fp32 B misaligned");
    expect_bad(pt_gemm_key_make(PT_GEMM_F32, 0, 0, 2, 2, 2, (void *)0x1000, 2, (void *)0x2000, 2,
                                0.0f, (void *)0x3002, 2), 0.0f, "C misaligned");
}

/* ---------------------------------------------------------------------------------------------
 * the plan cache */

static void test_cache_hits_and_misses(void **state) {
    (void)state;
    pt_gemm_plan_cache c;
    pt_gemm_plan_cache_init(&c, 64, 8);
    const pt_gemm_key base = key_of(PT_GEMM_BF16, 0, 1, 64, 96, 128, 128, 128, 96, 0.0f);
    assert_int_equal(pt_gemm_plan_lookup(&c, &base), -1);
    assert_int_equal(pt_gemm_plan_insert(&c, &base), 0);
    for (int r = 0; r < 3; r++) assert_int_equal(pt_gemm_plan_lookup(&c, &base), 0);
    assert_int_equal(c.hits, 3);
    assert_int_equal(c.misses, 1);
    /* a key differing in any one field is another plan */
    pt_gemm_key v[12];
    for (int i = 0; i < 12; i++) v[i] = base;
    v[0].dtype = PT_GEMM_F32;
    v[1].ta = 1;
    v[2].tb = 0;
    v[3].beta_nz = 1;
    v[4].align_a = 3;
    v[5].align_b = 2;
    v[6].align_c = 2;
    v[7].M = 65;
    v[8].N = 97;
    v[9].K = 129;
    v[10].lda = 129;
    v[11].ldb = 129;
    for (int i = 0; i < 12; i++) {
        if (pt_gemm_plan_lookup(&c, &v[i]) != -1) fail_msg("variant %d found as the base key", i);
        assert_int_equal(pt_gemm_plan_insert(&c, &v[i]), i + 1);
    }
    pt_gemm_key w = base;
    w.ldc = 97;
    assert_int_equal(pt_gemm_plan_lookup(&c, &w), -1);
    assert_int_equal(pt_gemm_plan_insert(&c, &w), 13);
    /* each is found again at its index, the base too */
    for (int i = 0; i < 12; i++) assert_int_equal(pt_gemm_plan_lookup(&c, &v[i]), i + 1);
    assert_int_equal(pt_gemm_plan_lookup(&c, &w), 13);
    assert_int_equal(pt_gemm_plan_lookup(&c, &base), 0);
    assert_int_equal(c.n, 14);
    pt_gemm_plan_cache_free(&c);
}

static void test_cache_colliding_keys(void **state) {
    (void)state;
    /* a full table (probes run into each other's slots) of keys that differ in one field only,
     * each field in turn: every key is its own plan */
    enum { CAP = 16 };
    for (int field = 0; field < 6; field++) {
        pt_gemm_plan_cache c;
        pt_gemm_plan_cache_init(&c, CAP, CAP);
        for (int round = 0; round < 2; round++)
            for (int i = 0; i < CAP; i++) {
                pt_gemm_key k = key_of(PT_GEMM_F32, 0, 0, 64, 64, 64, 64, 64, 64, 0.0f);
                int32_t *f[6] = {&k.M, &k.N, &k.K, &k.lda, &k.ldb, &k.ldc};
                *f[field] += i;
                if (round == 0) {
                    assert_int_equal(pt_gemm_plan_lookup(&c, &k), -1);
                    assert_int_equal(pt_gemm_plan_insert(&c, &k), i);
                } else if (pt_gemm_plan_lookup(&c, &k) != i) {
                    fail_msg("field %d + %d: not found at its index %d", field, i, i);
                }
            }
        pt_gemm_plan_cache_free(&c);
    }
}

static void test_cache_families(void **state) {
    (void)state;
    /* a mixture of experts' row counts: the family (shape less M and K) takes per_family plans,
     * the rest are refused (the runtime path) and never become hits; other families are still
     * memoised; the weight gradient's changing K counts against the same family */
    enum { PER = 4 };
    pt_gemm_plan_cache c;
    pt_gemm_plan_cache_init(&c, 64, PER);
    for (int m = 1; m <= PER; m++) {
        pt_gemm_key k = key_of(PT_GEMM_BF16, 0, 1, m, 96, 128, 128, 128, 96, 0.0f);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), -1);
        assert_int_equal(pt_gemm_plan_insert(&c, &k), m - 1);
        assert_int_equal(pt_gemm_plan_family_count(&c, &k), m);
    }
    for (int m = PER + 1; m <= 50; m++) {
        pt_gemm_key k = key_of(PT_GEMM_BF16, 0, 1, m, 96, 128, 128, 128, 96, 0.0f);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), -1);
        assert_int_equal(pt_gemm_plan_insert(&c, &k), -1);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), -1); /* still not memoised */
    }
    assert_int_equal(c.refused_family, 50 - PER);
    assert_int_equal(c.refused_full, 0);
    pt_gemm_key kk = key_of(PT_GEMM_BF16, 0, 1, 3, 96, 999, 128, 128, 96, 0.0f); /* other K */
    assert_int_equal(pt_gemm_plan_insert(&c, &kk), -1);
    /* the memoised ones stay hits */
    for (int m = 1; m <= PER; m++) {
        pt_gemm_key k = key_of(PT_GEMM_BF16, 0, 1, m, 96, 128, 128, 128, 96, 0.0f);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), m - 1);
    }
    /* another family (beta 1, or another N) has room of its own */
    pt_gemm_key b1 = key_of(PT_GEMM_BF16, 0, 1, 77, 96, 128, 128, 128, 96, 1.0f);
    assert_int_equal(pt_gemm_plan_family_count(&c, &b1), 0);
    assert_int_equal(pt_gemm_plan_insert(&c, &b1), PER);
    pt_gemm_key n2 = key_of(PT_GEMM_BF16, 0, 1, 77, 95, 128, 128, 128, 96, 0.0f);
    assert_int_equal(pt_gemm_plan_insert(&c, &n2), PER + 1);
    assert_int_equal(c.n_fam, 3);
    pt_gemm_plan_cache_free(&c);
}

static void test_cache_capacity(void **state) {
    (void)state;
    /* every key its own family: the table takes cap plans, refuses the next, keeps the old */
    enum { CAP = 37 };
    pt_gemm_plan_cache c;
    pt_gemm_plan_cache_init(&c, CAP, 1000);
    for (int i = 0; i < CAP + 10; i++) {
        pt_gemm_key k = key_of(PT_GEMM_F32, 1, 0, 8, 8 + i, 8, 8, 8 + i, 8 + i, 0.0f);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), -1);
        assert_int_equal(pt_gemm_plan_insert(&c, &k), i < CAP ? i : -1);
    }
    assert_int_equal(c.n, CAP);
    assert_int_equal(c.n_fam, CAP);
    assert_int_equal(c.refused_full, 10);
    for (int i = 0; i < CAP + 10; i++) {
        pt_gemm_key k = key_of(PT_GEMM_F32, 1, 0, 8, 8 + i, 8, 8, 8 + i, 8 + i, 0.0f);
        assert_int_equal(pt_gemm_plan_lookup(&c, &k), i < CAP ? i : -1);
    }
    /* a full table refuses a new key of a known family too */
    pt_gemm_key k = key_of(PT_GEMM_F32, 1, 0, 9, 8, 8, 8, 8, 8, 0.0f);
    assert_int_equal(pt_gemm_plan_insert(&c, &k), -1);
    assert_int_equal(c.refused_full, 11);
    pt_gemm_plan_cache_free(&c);
}

static void test_cache_allocates_nothing_after_init(void **state) {
    (void)state;
    pt_gemm_plan_cache c;
    const int64_t before_init = pt_alloc_count();
    pt_gemm_plan_cache_init(&c, PT_CUDA_GEMM_CACHE_CAP, PT_CUDA_GEMM_PER_FAMILY);
    assert_true(pt_alloc_count() > before_init); /* the table is counted, at init */
    const int64_t before = pt_alloc_count();
    uint64_t s = 99;
    int memo = 0, runtime = 0;
    for (int i = 0; i < 100000; i++) { /* random row counts over a few families, some repeated */
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int M = 1 + (int)((s >> 33) % 4096), fam = (int)((s >> 20) % 8);
        pt_gemm_key k = key_of(fam & 1 ? PT_GEMM_BF16 : PT_GEMM_F32, fam >> 1 & 1, fam >> 2, M,
                               512, 256, 4096, 512, 512, 0.0f);
        int idx = pt_gemm_plan_lookup(&c, &k);
        if (idx < 0) idx = pt_gemm_plan_insert(&c, &k);
        if (idx >= 0)
            memo++;
        else
            runtime++;
    }
    assert_int_equal(pt_alloc_count(), before);
    assert_int_equal(c.n, 8 * PT_CUDA_GEMM_PER_FAMILY);
    print_message("%d calls memoised, %d on the runtime path, %lld hits\n", memo, runtime,
                  (long long)c.hits);
    pt_gemm_plan_cache_free(&c);
}

/* ---------------------------------------------------------------------------------------------
 * sizes */

static void test_workspace_policy(void **state) {
    (void)state;
    const size_t GiB = (size_t)1 << 30, MiB = (size_t)1 << 20;
    assert_int_equal(pt_gemm_workspace_bytes(9, 80 * GiB), 32 * MiB);  /* H100 */
    assert_int_equal(pt_gemm_workspace_bytes(10, 180 * GiB), 32 * MiB); /* later */
    assert_int_equal(pt_gemm_workspace_bytes(8, 80 * GiB), 4 * MiB);   /* A100 */
    assert_int_equal(pt_gemm_workspace_bytes(9, 1 * GiB), 16 * MiB);   /* 1/64 of a small one */
    const size_t odd = pt_gemm_workspace_bytes(8, 100 * MiB + 12345);
    assert_true(odd <= (100 * MiB + 12345) / 64 && odd % 256 == 0 && odd > 0);
}

static void test_peak_dim(void **state) {
    (void)state;
    const size_t MiB = (size_t)1 << 20;
    /* bf16 8192²: two operands of 128 MiB and an fp32 C of 256 MiB */
    assert_int_equal(pt_gemm_peak_dim(8192, 2, 4, 512 * MiB), 8192);
    assert_int_equal(pt_gemm_peak_dim(8192, 2, 4, 512 * MiB - 1), 4096);
    assert_int_equal(pt_gemm_peak_dim(4096, 4, 4, 192 * MiB), 4096);
    assert_int_equal(pt_gemm_peak_dim(4096, 4, 4, 100 * MiB), 2048);
    assert_int_equal(pt_gemm_peak_dim(4096, 4, 4, 1024), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mapping_matches_the_cpu_gemm),
        cmocka_unit_test(test_mapping_fields),
        cmocka_unit_test(test_alignment_classes),
        cmocka_unit_test(test_key_fields_and_family),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_cache_hits_and_misses),
        cmocka_unit_test(test_cache_colliding_keys),
        cmocka_unit_test(test_cache_families),
        cmocka_unit_test(test_cache_capacity),
        cmocka_unit_test(test_cache_allocates_nothing_after_init),
        cmocka_unit_test(test_workspace_policy),
        cmocka_unit_test(test_peak_dim),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
