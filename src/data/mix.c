/* mix.c: several token sources read by weight on a fixed periodic schedule (see pt_mix in
 * include/pt/data.h): parsing data.sources / data.weights, the block's order, and where a global
 * sequence comes from. */
#include "pt/data.h"

#include <ctype.h>
#include <glob.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Leading and trailing blanks of s dropped in place. */
static char *pt_mix_trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

static int pt_mix_name_ok(const char *s) {
    if (!*s || strlen(s) >= PT_MIX_NAME_MAX) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return 0;
    return 1;
}

/* Places per block by largest remainder: floor(B·w_i), the rest one each to the largest
 * remainders (the first source on a tie). */
static void pt_mix_round(const double *w, int n, int B, int32_t *per_block) {
    double rem[PT_MIX_MAX_SOURCES];
    int left = B;
    for (int i = 0; i < n; i++) {
        double exact = w[i] * B;
        per_block[i] = (int32_t)floor(exact);
        rem[i] = exact - per_block[i];
        left -= per_block[i];
    }
    for (; left > 0; left--) {
        int best = 0;
        for (int i = 1; i < n; i++)
            if (rem[i] > rem[best]) best = i;
        per_block[best]++;
        rem[best] = -1;
    }
}

void pt_mix_spec_free(pt_mix_spec *spec) {
    free(spec->text);
    memset(spec, 0, sizeof *spec);
}

pt_status pt_mix_parse(const char *sources, const char *weights, pt_mix_spec *spec) {
    memset(spec, 0, sizeof *spec);
    spec->text = pt_strdup(sources);
    int item = 0;
    for (char *p = spec->text; p; item++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        char *it = pt_mix_trim(p), *eq = strchr(it, '=');
        p = comma ? comma + 1 : NULL;
        if (!*it)
            return pt_errorf(PT_ERR_CONFIG, "data.sources: item %d is empty (expected NAME=GLOB, "
                             "NAME=GLOB, ...)", item + 1);
        if (!eq)
            return pt_errorf(PT_ERR_CONFIG, "data.sources: \"%s\" is not NAME=GLOB", it);
        *eq = 0;
        char *name = pt_mix_trim(it), *glob = pt_mix_trim(eq + 1);
        if (!pt_mix_name_ok(name))
            return pt_errorf(PT_ERR_CONFIG, "data.sources: source name \"%s\" must be 1 to %d of "
                             "the characters A-Z a-z 0-9 _ - .", name, PT_MIX_NAME_MAX - 1);
        if (!*glob)
            return pt_errorf(PT_ERR_CONFIG, "data.sources: source %s has an empty glob", name);
        for (int i = 0; i < spec->n; i++)
            if (!strcmp(spec->name[i], name))
                return pt_errorf(PT_ERR_CONFIG, "data.sources: source name %s appears twice", name);
        if (spec->n == PT_MIX_MAX_SOURCES)
            return pt_errorf(PT_ERR_CONFIG, "data.sources: more than %d sources", PT_MIX_MAX_SOURCES);
        spec->name[spec->n] = name;
        spec->glob[spec->n] = glob;
        spec->n++;
    }
    char buf[1024];
    if (strlen(weights) >= sizeof buf)
        return pt_errorf(PT_ERR_CONFIG, "data.weights: longer than %zu characters", sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", weights);
    int nw = 0;
    double sum = 0;
    for (char *p = *pt_mix_trim(buf) ? buf : NULL; p; nw++) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        char *it = pt_mix_trim(p), *end;
        p = comma ? comma + 1 : NULL;
        double v = strtod(it, &end);
        if (!*it || *end || !isfinite(v) || v <= 0)
            return pt_errorf(PT_ERR_CONFIG, "data.weights: \"%s\" (weight %d) is not a positive "
                             "number", it, nw + 1);
        if (nw < spec->n) spec->weight[nw] = v;
        sum += v;
    }
    if (nw != spec->n)
        return pt_errorf(PT_ERR_CONFIG, "data.weights has %d value%s for the %d source%s of "
                         "data.sources (one weight per source, in the same order)", nw,
                         nw == 1 ? "" : "s", spec->n, spec->n == 1 ? "" : "s");
    for (int i = 0; i < spec->n; i++) spec->weight[i] /= sum;
    pt_mix_round(spec->weight, spec->n, PT_MIX_BLOCK, spec->per_block);
    for (int i = 0; i < spec->n; i++)
        if (spec->per_block[i] == 0)
            return pt_errorf(PT_ERR_CONFIG, "data.weights: source %s's share %.3g is below the "
                             "schedule's resolution of 1/%d", spec->name[i], spec->weight[i],
                             PT_MIX_BLOCK);
    return PT_OK;
}

/* The block's order by smooth weighted round robin, and the prefix counts. */
static void pt_mix_schedule(pt_mix *m) {
    int n = m->n, B = m->block;
    int64_t credit[PT_MIX_MAX_SOURCES] = {0};
    m->slot = pt_malloc((size_t)B * sizeof *m->slot);
    m->prefix = pt_calloc((size_t)n * (B + 1), sizeof *m->prefix);
    for (int p = 0; p < B; p++) {
        int best = 0;
        for (int i = 0; i < n; i++) {
            credit[i] += m->per_block[i];
            if (credit[i] > credit[best]) best = i;
        }
        credit[best] -= B;
        m->slot[p] = best;
        for (int i = 0; i < n; i++)
            m->prefix[(size_t)i * (B + 1) + p + 1] = m->prefix[(size_t)i * (B + 1) + p] + (i == best);
    }
    for (int i = 0; i < n; i++) /* periodic: every source had its places, the credits are back */
        PT_ASSERTF(credit[i] == 0 && m->prefix[(size_t)i * (B + 1) + B] == m->per_block[i],
                   "source %d: credit %lld after a block", i, (long long)credit[i]);
}

/* A source's shuffling seed: training.seed and its name (FNV-1a), so that its order does not
 * depend on the other sources or their order in data.sources. */
static uint64_t pt_mix_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *name; name++) h = (h ^ (unsigned char)*name) * 0x100000001b3ull;
    return seed ^ h;
}

static void pt_mix_alloc(pt_mix *m, int n, int B) {
    m->n = n;
    m->block = B;
    m->src = pt_calloc((size_t)n, sizeof *m->src);
    m->name = pt_calloc((size_t)n, sizeof *m->name);
    m->glob = pt_calloc((size_t)n, sizeof *m->glob);
    m->weight = pt_calloc((size_t)n, sizeof *m->weight);
    m->per_block = pt_calloc((size_t)n, sizeof *m->per_block);
    m->share = pt_calloc((size_t)n, sizeof *m->share);
}

pt_status pt_mix_open(pt_mix *m, const char *train, const char *sources, const char *weights,
                      int T, int shuffle, uint64_t seed, int vocab_size) {
    memset(m, 0, sizeof *m);
    if (!sources || !*sources) { /* data.train: one source, B = 1, q = k */
        pt_mix_alloc(m, 1, 1);
        m->name[0] = pt_strdup("train");
        m->glob[0] = pt_strdup(train ? train : "");
        m->weight[0] = 1;
        m->per_block[0] = 1;
        pt_mix_schedule(m);
        pt_status st = pt_data_open(&m->src[0], train, T, shuffle, seed, vocab_size);
        if (st != PT_OK) pt_mix_close(m);
        return st;
    }
    pt_mix_spec spec;
    pt_status st = pt_mix_parse(sources, weights ? weights : "", &spec);
    if (st != PT_OK) {
        pt_mix_spec_free(&spec);
        return st;
    }
    pt_mix_alloc(m, spec.n, PT_MIX_BLOCK);
    m->mixed = 1;
    for (int i = 0; i < spec.n; i++) {
        m->name[i] = pt_strdup(spec.name[i]);
        m->glob[i] = pt_strdup(spec.glob[i]);
        m->weight[i] = spec.weight[i];
        m->per_block[i] = spec.per_block[i];
    }
    pt_mix_spec_free(&spec);
    pt_mix_schedule(m);
    for (int i = 0; i < m->n && st == PT_OK; i++) {
        /* the same verdict on every rank: a configuration error, not one rank's */
        glob_t g;
        int rc = glob(m->glob[i], 0, NULL, &g);
        if (rc == 0) globfree(&g);
        if (rc != 0) {
            st = pt_errorf(PT_ERR_CONFIG, "data.sources: source %s: no file matches \"%s\"",
                           m->name[i], m->glob[i]);
            break;
        }
        char key[64];
        snprintf(key, sizeof key, "data.sources %s", m->name[i]);
        st = pt_data_open_key(&m->src[i], key, m->glob[i], T, shuffle,
                              pt_mix_seed(seed, m->name[i]), vocab_size);
    }
    if (st != PT_OK) pt_mix_close(m);
    return st;
}

void pt_mix_close(pt_mix *m) {
    for (int i = 0; i < m->n; i++) {
        if (m->src) pt_data_close(&m->src[i]);
        if (m->name) free(m->name[i]);
        if (m->glob) free(m->glob[i]);
    }
    free(m->src);
    free(m->name);
    free(m->glob);
    free(m->weight);
    free(m->per_block);
    free(m->slot);
    free(m->prefix);
    free(m->share);
    memset(m, 0, sizeof *m);
}

void pt_mix_log(const pt_mix *m) {
    const pt_data *d = &m->src[0];
    if (!m->mixed) {
        pt_log_info("data: %d shard(s), %lld rows of %d tokens", d->n_shards, (long long)d->n_rows,
                    d->T);
        return;
    }
    pt_log_info("data: %d sources mixed in blocks of %d sequences (smooth weighted round robin)",
                m->n, m->block);
    for (int i = 0; i < m->n; i++)
        pt_log_info("data: source %s: weight %.4f (%d of every %d sequences), %d shard(s), %lld "
                    "rows of %d tokens", m->name[i], m->weight[i], m->per_block[i], m->block,
                    m->src[i].n_shards, (long long)m->src[i].n_rows, m->src[i].T);
}

int64_t pt_mix_count(const pt_mix *m, int i, int64_t K) {
    int B = m->block;
    return K / B * m->per_block[i] + m->prefix[(size_t)i * (B + 1) + K % B];
}

int pt_mix_source(const pt_mix *m, int64_t k, int64_t *q) {
    int B = m->block, i = m->slot[k % B];
    *q = k / B * m->per_block[i] + m->prefix[(size_t)i * (B + 1) + k % B];
    return i;
}

int64_t pt_mix_row(pt_mix *m, int64_t step, int64_t j, int64_t G, int *source) {
    int64_t q;
    int i = pt_mix_source(m, step * G + j, &q);
    *source = i;
    return pt_data_row(&m->src[i], q, 0, 1); /* the source's own order at q */
}

void pt_mix_batch(pt_mix *m, int64_t step, int64_t G, int64_t j0, int count, int32_t *inputs,
                  int32_t *targets) {
    for (int b = 0; b < count; b++) {
        int i;
        int64_t row = pt_mix_row(m, step, j0 + b, G, &i);
        const pt_data *d = &m->src[i];
        pt_data_read_row(d, row, inputs + (size_t)b * d->T, targets + (size_t)b * d->T);
    }
}

void pt_mix_log_epochs(const pt_mix *m, int64_t step, int64_t G) {
    if (!m->mixed) return;
    for (int i = 0; i < m->n; i++) {
        /* epoch e (from 0) starts at q = e·rows; the step reads q in [a, b) */
        int64_t a = pt_mix_count(m, i, step * G), b = pt_mix_count(m, i, (step + 1) * G);
        int64_t rows = m->src[i].n_rows, e = (a + rows - 1) / rows;
        for (e = e < 1 ? 1 : e; e * rows < b; e++)
            pt_log_info("data: source %s starts epoch %lld at step %lld", m->name[i],
                        (long long)e + 1, (long long)step + 1);
    }
}

const double *pt_mix_shares(pt_mix *m, int64_t K) {
    for (int i = 0; i < m->n; i++) m->share[i] = K > 0 ? (double)pt_mix_count(m, i, K) / K : 0;
    return m->share;
}
