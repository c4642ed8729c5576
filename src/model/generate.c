/* generate.c: continuing a prompt with an unsplit model (samples and tests; no KV cache). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pt/model.h"

int pt_generate(pt_model *m, const int32_t *prompt, int n_prompt, int32_t *out, int n_new,
                float temperature, int top_k, uint64_t seed) {
    pt_backend *be = m->be;
    int Tmax = m->cfg.max_seq_len, V = m->cfg.vocab_size;
    pt_acts *a = pt_acts_create(m, 1, Tmax);
    int32_t *ctx = pt_malloc((size_t)(n_prompt + n_new) * sizeof *ctx);
    memcpy(ctx, prompt, (size_t)n_prompt * sizeof *ctx);
    int32_t *d_tok = be->alloc(be, (size_t)Tmax * sizeof(int32_t));
    int32_t *d_pos = be->alloc(be, (size_t)Tmax * sizeof(int32_t));
    int32_t *pos = pt_malloc((size_t)Tmax * sizeof *pos);
    for (int i = 0; i < Tmax; i++) pos[i] = i;
    be->upload(be, d_pos, pos, (size_t)Tmax * sizeof(int32_t));
    float *logits = pt_malloc((size_t)Tmax * V * sizeof(float));
    float *prob = pt_malloc((size_t)V * sizeof(float));
    pt_rng rng;
    pt_rng_seed(&rng, seed);
    int n = n_prompt;
    for (int k = 0; k < n_new; k++) {
        /* the last Tmax tokens are the context (no KV cache: this is for samples, not serving) */
        int start = n > Tmax ? n - Tmax : 0, T = n - start;
        pt_acts_set_shape(a, 1, T);
        be->upload(be, d_tok, ctx + start, (size_t)T * sizeof(int32_t));
        pt_model_logits(m, a, d_tok, d_pos, logits);
        const float *row = logits + (size_t)(T - 1) * V;
        int next = 0;
        if (temperature <= 0) {
            for (int v = 1; v < V; v++)
                if (row[v] > row[next]) next = v;
        } else {
            /* softmax of logits/temperature over the top_k most likely (all when top_k = 0) */
            float kth = -INFINITY;
            if (top_k > 0 && top_k < V) {
                memcpy(prob, row, (size_t)V * sizeof(float));
                /* partial selection of the k-th largest by repeated max extraction */
                for (int i = 0; i < top_k; i++) {
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
                prob[v] = row[v] >= kth ? expf((row[v] - mx) / temperature) : 0.0f;
                sum += prob[v];
            }
            double r = pt_rng_uniform(&rng) * sum, acc = 0;
            next = V - 1;
            for (int v = 0; v < V; v++) {
                acc += prob[v];
                if (acc > r && prob[v] > 0) {
                    next = v;
                    break;
                }
            }
        }
        ctx[n++] = next;
        out[k] = next;
    }
    be->free(be, d_tok);
    be->free(be, d_pos);
    free(pos);
    free(logits);
    free(prob);
    free(ctx);
    pt_acts_free(m, a);
    return n_new;
}
