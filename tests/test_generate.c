/* test_generate.c: generation with the key/value cache against the computation without it.
 *
 * On small random models (dense and mixture of experts with softmax and sigmoid routers, tied and
 * untied heads, multi-, grouped- and multi-query attention, prompts within one key tile of the
 * attention and across several):
 *   - greedy decoding with the cache gives the same tokens as without it (every token from a
 *     forward over the whole context), 48 new tokens;
 *   - the logits each cached step chose from are within 1e-5 (‖Δ‖/‖ref‖) of the rows of one
 *     forward over the whole generated sequence (pt_model_logits);
 *   - the check can fail: one cached key changed by 1 moves the next step's logits far past it;
 *   - a context beyond model.max_seq_len is refused (nothing slides);
 *   - bf16: the same tokens, the logits within a bf16 rounding's reach.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pt/backend.h"
#include "pt/model.h"
#include "testutil.h"

enum { N_NEW = 48 };

typedef struct {
    const char *name;
    int tied, moe, n_kv_heads, n_prompt; /* moe: 1 softmax router, 2 sigmoid router with a bias */
} gen_case;

static pt_model_config small_config(const gen_case *g) {
    pt_model_config c = {
        .vocab_size = 97,
        .dim = 64,
        .n_layers = 3,
        .n_heads = 4,
        .n_kv_heads = g->n_kv_heads,
        .ffn_dim = 96,
        .max_seq_len = 128,
        .rope_theta = 10000.0f,
        .norm_eps = 1e-5f,
        .tied_embeddings = g->tied,
        .init_std = 0.2f, /* logits far enough apart that greedy choices are not near ties */
    };
    if (g->moe) {
        c.n_experts = 4, c.top_k = 2, c.moe_ffn_dim = 32, c.moe_every = 1, c.moe_first_dense = 1;
        c.n_shared_experts = 1;
        c.capacity_factor = 1.0f; /* set aside by generation (dropless) */
        c.router_sigmoid = g->moe == 2;
    }
    return c;
}

static void model_make(pt_model *m, pt_backend *be, const pt_model_config *c, uint64_t seed) {
    assert_int_equal(pt_model_init_ex(m, c, be, 0, PT_MODEL_NO_GRADS, NULL), PT_OK);
    float *host = malloc(m->gtable.total * sizeof(float));
    pt_model_init_weights_host(m, seed, host);
    be->upload(be, m->params, host, m->gtable.total * sizeof(float));
    free(host);
}

static void random_prompt(int32_t *p, int n, int V, uint64_t seed) {
    pt_rng r;
    pt_rng_seed(&r, seed);
    for (int i = 0; i < n; i++) p[i] = (int32_t)(pt_rng_uniform(&r) * V) % V;
}

/* Logits (T, V) on the host of one forward over tokens (host, T). */
static float *full_logits(pt_model *m, const int32_t *tokens, int T) {
    pt_backend *be = m->be;
    int V = m->cfg.vocab_size;
    int32_t *d_tok = be->alloc(be, (size_t)T * sizeof(int32_t));
    int32_t *d_pos = be->alloc(be, (size_t)T * sizeof(int32_t));
    int32_t *pos = malloc((size_t)T * sizeof *pos);
    for (int i = 0; i < T; i++) pos[i] = i;
    be->upload(be, d_tok, tokens, (size_t)T * sizeof(int32_t));
    be->upload(be, d_pos, pos, (size_t)T * sizeof(int32_t));
    float *logits = malloc((size_t)T * V * sizeof(float));
    pt_acts *a = pt_acts_create(m, 1, T);
    pt_model_logits(m, a, d_tok, d_pos, logits);
    pt_acts_free(m, a);
    be->free(be, d_tok);
    be->free(be, d_pos);
    free(pos);
    return logits;
}

/* The largest ‖Δ‖/‖ref‖ over the n_new rows of got against the rows of ref from row r0. */
static double max_row_err(const float *got, const float *ref, int r0, int n_new, int V) {
    double worst = 0;
    for (int k = 0; k < n_new; k++) {
        double e = tu_rel_err(got + (size_t)k * V, ref + (size_t)(r0 + k) * V, (size_t)V);
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* Cache against no cache: the same tokens; the cached logits against one forward over the
 * sequence. Returns the worst logit error. */
static double check_case(const gen_case *g, int bf16, float temperature, int top_k) {
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    assert_non_null(be);
    pt_model_config c = small_config(g);
    pt_model m;
    model_make(&m, be, &c, 7);
    if (bf16) assert_int_equal(pt_model_set_precision(&m, PT_PREC_BF16), PT_OK);
    int V = c.vocab_size, n = g->n_prompt;
    int32_t *seq = malloc((size_t)(n + N_NEW) * sizeof *seq), ref_out[N_NEW];
    random_prompt(seq, n, V, 11);
    float *lc = malloc((size_t)N_NEW * V * sizeof(float)), *ln = malloc((size_t)N_NEW * V * sizeof(float));
    pt_gen_options o = {.temperature = temperature, .top_k = top_k, .seed = 5, .logits = lc};
    pt_gen_stats st;
    assert_int_equal(pt_generate(&m, seq, n, seq + n, N_NEW, &o, &st), PT_OK);
    assert_int_equal(st.n_new, N_NEW);
    assert_int_equal(st.n_steps, N_NEW - 1);
    assert_true(m.cfg.capacity_factor == c.capacity_factor); /* restored */
    o.no_cache = 1, o.logits = ln;
    assert_int_equal(pt_generate(&m, seq, n, ref_out, N_NEW, &o, NULL), PT_OK);
    int same = 0;
    while (same < N_NEW && ref_out[same] == seq[n + same]) same++;
    double e_nocache = max_row_err(lc, ln, 0, same, V);
    /* one forward over the prompt and every generated token but the last, dropless as
     * generation is */
    m.cfg.capacity_factor = 0;
    float *full = full_logits(&m, seq, n + N_NEW - 1);
    m.cfg.capacity_factor = c.capacity_factor;
    double e_full = max_row_err(lc, full, n - 1, N_NEW, V);
    double e_fp32 = 0; /* bf16: how far the model is from its fp32 self (that it runs in bf16) */
    if (bf16) {
        pt_model m32;
        model_make(&m32, be, &c, 7);
        m32.cfg.capacity_factor = 0;
        float *f32 = full_logits(&m32, seq, n + N_NEW - 1);
        e_fp32 = max_row_err(lc, f32, n - 1, N_NEW, V);
        free(f32);
        pt_model_free(&m32);
        if (!(e_fp32 > 1e-4)) fail_msg("%s: the bf16 model computes like the fp32 one", g->name);
    }
    printf("  %-26s %s T=%.1f: %d/%d tokens the same; logits vs no cache %.2e, vs one forward "
           "%.2e", g->name, bf16 ? "bf16" : "fp32", temperature, same, N_NEW, e_nocache, e_full);
    if (bf16) printf(" (vs fp32 %.2e)", e_fp32);
    printf("\n");
    if (same < N_NEW)
        fail_msg("%s: token %d differs with the cache (%d) and without (%d)", g->name, same,
                 seq[n + same], ref_out[same]);
    free(full);
    free(lc);
    free(ln);
    free(seq);
    pt_model_free(&m);
    be->destroy(be);
    return e_full > e_nocache ? e_full : e_nocache;
}

static const gen_case cases[] = {
    {"dense tied GQA", 1, 0, 2, 7},
    {"dense untied MHA", 0, 0, 4, 7},
    {"dense untied MQA, prompt 70", 0, 0, 1, 70},
    {"MoE tied GQA", 1, 1, 2, 7},
    {"MoE untied GQA, prompt 70", 0, 1, 2, 70},
    {"MoE sigmoid untied MQA", 0, 2, 1, 7},
};

static void test_greedy(void **state) {
    (void)state;
    /* guarded (PT_BACKEND_GUARD, several times slower): a dense and a MoE case, every path */
    int guarded = getenv("PT_BACKEND_GUARD") != NULL;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        if (!guarded || i == 0 || i == 4)
            tu_check_rel(cases[i].name, check_case(&cases[i], 0, 0.0f, 0), 1e-5);
}

static void test_sampling(void **state) {
    (void)state;
    if (getenv("PT_BACKEND_GUARD")) skip();
    tu_check_rel("dense sampling", check_case(&cases[0], 0, 0.8f, 10), 1e-5);
    tu_check_rel("MoE sampling", check_case(&cases[4], 0, 1.0f, 0), 1e-5);
}

/* bf16: the model rounds its activations; a value within an fp32 rounding of a bf16 boundary can
 * round either way between the one-row and the whole-sequence products (test_model_torch.c), so
 * the logits agree to a bf16 step (2^-8), not 1e-5; the tokens still agree here. */
static void test_bf16(void **state) {
    (void)state;
    if (getenv("PT_BACKEND_GUARD")) skip();
    tu_check_rel("dense bf16", check_case(&cases[0], 1, 0.0f, 0), 0x1p-8);
    tu_check_rel("MoE bf16", check_case(&cases[4], 1, 0.0f, 0), 0x1p-8);
}

/* The check of the check: the cache's logits against one forward, then the same after one
 * cached key (layer 0, position 1, its first element) is moved by 1. */
static void test_corrupt_key(void **state) {
    (void)state;
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    const gen_case *g = &cases[0];
    pt_model_config c = small_config(g);
    pt_model m;
    model_make(&m, be, &c, 7);
    int V = c.vocab_size, n = 9;
    int32_t seq[10];
    random_prompt(seq, n + 1, V, 3);
    float *ref = full_logits(&m, seq, n + 1);
    float *got = malloc((size_t)V * sizeof(float));
    int32_t *d_tok = be->alloc(be, (size_t)(n + 1) * sizeof(int32_t));
    be->upload(be, d_tok, seq, (size_t)(n + 1) * sizeof(int32_t));
    double err[2];
    for (int corrupt = 0; corrupt < 2; corrupt++) {
        pt_kv_cache kv;
        assert_int_equal(pt_kv_cache_init(&kv, &m, 0), PT_OK);
        assert_int_equal(kv.max_len, c.max_seq_len);
        pt_acts *pre = pt_acts_create(&m, 1, n), *one = pt_acts_create(&m, 1, 1);
        assert_int_equal(pt_model_decode(&m, pre, &kv, d_tok, n, got), PT_OK);
        tu_check_rel("prefill's last row", tu_rel_err(got, ref + (size_t)(n - 1) * V, (size_t)V), 1e-5);
        if (corrupt) {
            float *k = kv.kv + (size_t)1 * kv.width, x;
            be->download(be, &x, k, sizeof x);
            x += 1.0f;
            be->upload(be, k, &x, sizeof x);
        }
        assert_int_equal(pt_model_decode(&m, one, &kv, d_tok + n, 1, got), PT_OK);
        assert_int_equal(kv.len, n + 1);
        err[corrupt] = tu_rel_err(got, ref + (size_t)n * V, (size_t)V);
        pt_acts_free(&m, pre);
        pt_acts_free(&m, one);
        pt_kv_cache_free(&kv, &m);
    }
    printf("  step after the prefill: %.2e from one forward; with a cached key moved by 1: %.2e\n",
           err[0], err[1]);
    tu_check_rel("cached step", err[0], 1e-5);
    if (!(err[1] > 1e-3)) fail_msg("a corrupted cached key went unseen (%.2e)", err[1]);
    be->free(be, d_tok);
    free(ref);
    free(got);
    pt_model_free(&m);
    be->destroy(be);
}

/* The context never passes model.max_seq_len: refused, not slid. */
static void test_context_limit(void **state) {
    (void)state;
    pt_backend *be = pt_backend_cpu_create(2, PT_GEMM_ONEDNN);
    gen_case g = cases[0];
    pt_model_config c = small_config(&g);
    c.max_seq_len = 16;
    pt_model m;
    model_make(&m, be, &c, 7);
    int32_t p[16], out[16];
    random_prompt(p, 16, c.vocab_size, 1);
    pt_gen_options o = {0};
    pt_gen_stats st;
    assert_int_equal(pt_generate(&m, p, 10, out, 7, &o, &st), PT_ERR_CONFIG);
    printf("  %s\n", pt_last_error());
    assert_int_equal(st.n_new, 0);
    assert_int_equal(pt_generate(&m, p, 10, out, 6, &o, &st), PT_OK); /* exactly the context */
    assert_int_equal(st.n_new, 6);
    assert_int_equal(pt_generate(&m, p, 0, out, 1, &o, &st), PT_ERR_CONFIG);
    p[3] = c.vocab_size;
    assert_int_equal(pt_generate(&m, p, 10, out, 1, &o, &st), PT_ERR_CONFIG);
    /* the cache itself: a decode past its end leaves it as it was */
    pt_kv_cache kv;
    assert_int_equal(pt_kv_cache_init(&kv, &m, 17), PT_ERR_CONFIG);
    assert_int_equal(pt_kv_cache_init(&kv, &m, 4), PT_OK);
    int32_t *d_tok = be->alloc(be, 8 * sizeof(int32_t));
    float *logits = malloc((size_t)c.vocab_size * sizeof(float));
    pt_acts *a = pt_acts_create(&m, 1, 5);
    assert_int_equal(pt_model_decode(&m, a, &kv, d_tok, 3, logits), PT_OK);
    assert_int_equal(pt_model_decode(&m, a, &kv, d_tok, 2, logits), PT_ERR_CONFIG);
    assert_int_equal(kv.len, 3);
    assert_int_equal(pt_model_decode(&m, a, &kv, d_tok, 1, logits), PT_OK);
    assert_int_equal(kv.len, 4);
    pt_acts_free(&m, a);
    pt_kv_cache_free(&kv, &m);
    be->free(be, d_tok);
    free(logits);
    pt_model_free(&m);
    be->destroy(be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_sampling),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_corrupt_key),
        cmocka_unit_test(test_context_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
