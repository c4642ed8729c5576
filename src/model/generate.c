/* generate.c: continuing a prompt with an unsplit model.
 *
 * With a key/value cache (the default): one forward over the prompt (prefill) fills the cache
 * with every layer's rotated keys and values, then each new token is one forward of one row
 * whose query attends to the cache (pt_model_decode in llama.c): O(context) work per token.
 * Without (no_cache): every token comes from a forward over the whole context so far, O(context²)
 * per token, the reference the cache is checked against (tests/test_generate.c). The context never
 * slides: a prompt and continuation longer than model.max_seq_len are refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pt/model.h"

pt_status pt_kv_cache_init(pt_kv_cache *kv, const pt_model *m, int max_len) {
    memset(kv, 0, sizeof *kv);
    PT_ASSERTF(m->par.tp == 1 && m->par.n_chunks <= 1, "a key/value cache is for an unsplit model");
    const pt_model_config *c = &m->cfg;
    if (max_len == 0) max_len = c->max_seq_len;
    if (max_len < 1 || max_len > c->max_seq_len)
        return pt_errorf(PT_ERR_CONFIG, "a key/value cache of %d positions: the model's are 1 to "
                         "%d (model.max_seq_len)", max_len, c->max_seq_len);
    pt_backend *be = m->be;
    kv->n_layers = c->n_layers;
    kv->max_len = max_len;
    kv->width = 2 * m->loc.KV * pt_model_head_dim(c);
    kv->kv = be->alloc(be, (size_t)c->n_layers * max_len * kv->width * sizeof(float));
    kv->d_pos = be->alloc(be, (size_t)max_len * sizeof(int32_t));
    int32_t *pos = pt_malloc((size_t)max_len * sizeof *pos);
    for (int i = 0; i < max_len; i++) pos[i] = i;
    be->upload(be, kv->d_pos, pos, (size_t)max_len * sizeof *pos);
    free(pos);
    return PT_OK;
}

void pt_kv_cache_free(pt_kv_cache *kv, const pt_model *m) {
    if (kv->kv) m->be->free(m->be, kv->kv);
    if (kv->d_pos) m->be->free(m->be, kv->d_pos);
    memset(kv, 0, sizeof *kv);
}

/* The next token from one row of logits (V): the most likely (temperature 0; the lowest id on a
 * tie), or drawn from softmax(row / temperature) over the top_k most likely (all when 0). prob:
 * (V) scratch. */
static int pt_pick(const float *row, int V, const pt_gen_options *o, pt_rng *rng, float *prob) {
    int next = 0;
    if (o->temperature <= 0) {
        for (int v = 1; v < V; v++)
            if (row[v] > row[next]) next = v;
        return next;
    }
    float kth = -INFINITY;
    if (o->top_k > 0 && o->top_k < V) {
        memcpy(prob, row, (size_t)V * sizeof(float));
        /* the k-th largest by repeated extraction of the maximum */
        for (int i = 0; i < o->top_k; i++) {
            int best = 0;
            for (int v = 1; v < V; v++)
                if (prob[v] > prob[best]) best = v;
            kth = prob[best];
            prob[best] = -INFINITY;
        }
    }
    float mx = -INFINITY;
    for (int v = 0; v < V; v++)
        if (row[v] > mx) mx = row[v];
    double sum = 0;
    for (int v = 0; v < V; v++) {
        prob[v] = row[v] >= kth ? expf((row[v] - mx) / o->temperature) : 0.0f;
        sum += prob[v];
    }
    double r = pt_rng_uniform(rng) * sum, acc = 0;
    next = V - 1;
    for (int v = 0; v < V; v++) {
        acc += prob[v];
        if (acc > r && prob[v] > 0) return v;
    }
    return next;
}

/* The logits of each new token from pt_model_decode: the prompt in one call, then one row per
 * token. row (V) holds the logits the next token is chosen from. */
static pt_status pt_generate_cached(pt_model *m, int32_t *d_tok, int n_prompt, int32_t *out,
                                    int n_new, const pt_gen_options *o, pt_gen_stats *st,
                                    pt_rng *rng, float *row, float *prob) {
    pt_backend *be = m->be;
    int V = m->cfg.vocab_size;
    pt_kv_cache kv;
    /* positions up to the one the last new token would be fed at: it is not */
    PT_TRY(pt_kv_cache_init(&kv, m, n_prompt + n_new - 1));
    pt_acts *a = pt_acts_create(m, 1, n_prompt);
    double t0 = pt_now();
    pt_status s = pt_model_decode(m, a, &kv, d_tok, n_prompt, row);
    st->prefill_s = pt_now() - t0;
    pt_acts_free(m, a);
    a = pt_acts_create(m, 1, 1); /* one row: a mixture of experts routes only it */
    t0 = pt_now();
    for (int k = 0; k < n_new && s == PT_OK; k++) {
        out[k] = pt_pick(row, V, o, rng, prob);
        if (o->logits) memcpy(o->logits + (size_t)k * V, row, (size_t)V * sizeof(float));
        st->n_new = k + 1;
        if (k + 1 == n_new) break;
        be->upload(be, d_tok + n_prompt + k, &out[k], sizeof(int32_t));
        s = pt_model_decode(m, a, &kv, d_tok + n_prompt + k, 1, row);
        st->n_steps++;
    }
    st->decode_s = pt_now() - t0;
    pt_acts_free(m, a);
    pt_kv_cache_free(&kv, m);
    return s;
}

/* The same from a forward over the whole context for each token (no cache). */
static void pt_generate_full(pt_model *m, int32_t *d_tok, int n_prompt, int32_t *out, int n_new,
                             const pt_gen_options *o, pt_gen_stats *st, pt_rng *rng, float *prob) {
    pt_backend *be = m->be;
    int V = m->cfg.vocab_size, Tmax = n_prompt + n_new - 1;
    pt_acts *a = pt_acts_create(m, 1, Tmax);
    int32_t *d_pos = be->alloc(be, (size_t)Tmax * sizeof(int32_t));
    int32_t *pos = pt_malloc((size_t)Tmax * sizeof *pos);
    for (int i = 0; i < Tmax; i++) pos[i] = i;
    be->upload(be, d_pos, pos, (size_t)Tmax * sizeof(int32_t));
    float *logits = pt_malloc((size_t)Tmax * V * sizeof(float));
    double t0 = pt_now();
    for (int k = 0; k < n_new; k++) {
        int T = n_prompt + k;
        pt_acts_set_shape(a, 1, T);
        pt_model_logits(m, a, d_tok, d_pos, logits);
        const float *row = logits + (size_t)(T - 1) * V;
        out[k] = pt_pick(row, V, o, rng, prob);
        if (o->logits) memcpy(o->logits + (size_t)k * V, row, (size_t)V * sizeof(float));
        if (k + 1 < n_new) be->upload(be, d_tok + T, &out[k], sizeof(int32_t));
        double t = pt_now();
        if (k == 0)
            st->prefill_s = t - t0;
        else
            st->decode_s += t - t0, st->n_steps++;
        st->n_new = k + 1;
        t0 = t;
    }
    be->free(be, d_pos);
    free(pos);
    free(logits);
    pt_acts_free(m, a);
}

pt_status pt_generate(pt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n_new,
                      const pt_gen_options *o, pt_gen_stats *stats) {
    pt_gen_stats st = {0};
    if (stats) *stats = st;
    pt_backend *be = m->be;
    int V = m->cfg.vocab_size, Tmax = m->cfg.max_seq_len;
    if (n_prompt < 1) return pt_errorf(PT_ERR_CONFIG, "the prompt is empty");
    if (n_new < 0) return pt_errorf(PT_ERR_CONFIG, "a negative number of new tokens (%d)", n_new);
    if (n_prompt + n_new > Tmax)
        return pt_errorf(PT_ERR_CONFIG, "the prompt (%d tokens) and %d new tokens exceed the "
                         "model's context, model.max_seq_len = %d (it does not slide)", n_prompt,
                         n_new, Tmax);
    for (int i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return pt_errorf(PT_ERR_CONFIG, "prompt token %d is outside the model's vocabulary "
                             "(%d)", prompt[i], V);
    if (n_new == 0) return PT_OK;
    /* dropless: with a capacity a token's experts would depend on the other tokens of the
     * forward, which differ between the two paths (and from one step to the next) */
    float capacity = m->cfg.capacity_factor;
    m->cfg.capacity_factor = 0;
    int32_t *d_tok = be->alloc(be, (size_t)(n_prompt + n_new) * sizeof(int32_t));
    be->upload(be, d_tok, prompt, (size_t)n_prompt * sizeof(int32_t));
    float *row = pt_malloc((size_t)V * sizeof(float)), *prob = pt_malloc((size_t)V * sizeof(float));
    pt_rng rng;
    pt_rng_seed(&rng, o->seed);
    pt_status s = PT_OK;
    if (o->no_cache)
        pt_generate_full(m, d_tok, n_prompt, out, n_new, o, &st, &rng, prob);
    else
        s = pt_generate_cached(m, d_tok, n_prompt, out, n_new, o, &st, &rng, row, prob);
    m->cfg.capacity_factor = capacity;
    be->free(be, d_tok);
    free(row);
    free(prob);
    if (stats) *stats = st;
    return s;
}
