/* data.h: token shards (llm.c's format) and the order in which their rows are read.
 *
 * A shard is a header of 256 int32 (magic, version, token count) and then the tokens: uint16 with
 * magic 20240520 and version 1, or uint32 with magic 20240801 and version 7 (llm.c's Llama 3
 * layout, for vocabularies over 65,536); one data set may mix both. A shard of n tokens holds
 * rows of T+1 tokens overlapping by one: row i is tokens
 * [i·T, i·T+T], inputs its first T, targets its last T; (n−1)/T rows. The rows of all shards (in
 * sorted file-name order) are numbered globally; optimizer step s reads rows s·G … s·G+G−1 of the
 * order (G = global batch in sequences), wrapping at the end. Without shuffling the order is
 * 0,1,2,…; with shuffling each pass over the data is a permutation that depends only on the seed
 * and the pass number. A sequence's place in the global batch decides its micro-batch (and later
 * its data-parallel rank), never which row it is.
 *
 * Several sources (data.sources, data.weights) are mixed by a fixed schedule, pt_mix below.
 */
#ifndef PT_DATA_H
#define PT_DATA_H

#include <string.h>

#include "pt/core.h"

#define PT_SHARD_MAGIC 20240520
#define PT_SHARD_VERSION 1
#define PT_SHARD_HEADER_INTS 256
/* Shards of uint32 tokens, for vocabularies over 65,536 (llm.c's Llama 3 layout). */
#define PT_SHARD32_MAGIC 20240801
#define PT_SHARD32_VERSION 7

typedef struct {
    int n_shards;
    char **paths;
    const uint8_t **tokens; /* mapped token arrays (after the header) */
    int *token_bytes;    /* bytes per token of each shard: 2 or 4 */
    size_t *n_tokens;
    size_t *map_bytes;
    int64_t *row_start;  /* first global row of each shard, plus the total at [n_shards] */
    int64_t n_rows;
    int T;
    int shuffle;
    uint64_t seed;
    int64_t *perm;       /* the current pass's permutation (shuffle only) */
    int64_t perm_pass;   /* which pass perm belongs to, -1 = none */
} pt_data;

/* Opens every shard matching `glob` and checks headers and sizes against the files.
 * vocab_size > 0 also checks that every token is below it. */
pt_status pt_data_open(pt_data *d, const char *glob_pattern, int T, int shuffle, uint64_t seed,
                       int vocab_size);
/* The same, for the shards of another key (data.val): errors name it. */
pt_status pt_data_open_key(pt_data *d, const char *key, const char *glob_pattern, int T,
                           int shuffle, uint64_t seed, int vocab_size);
void pt_data_close(pt_data *d);
/* Global row index of sequence j (0 ≤ j < G) of optimizer step s. */
int64_t pt_data_row(pt_data *d, int64_t step, int64_t j, int64_t G);
/* Writes inputs (T) and targets (T) of one global row. */
void pt_data_read_row(const pt_data *d, int64_t row, int32_t *inputs, int32_t *targets);
/* Reads sequences [j0, j0+count) of step s's global batch of G: inputs, targets (count, T). */
void pt_data_batch(pt_data *d, int64_t step, int64_t G, int64_t j0, int count, int32_t *inputs,
                   int32_t *targets);

/* A mixture of sources read by weight (data.sources = NAME=GLOB, ...; data.weights = w, ...).
 *
 * Global sequence k = s·G + j (step s, place j of the global batch) goes to a source by a fixed
 * periodic schedule: a block of B = PT_MIX_BLOCK places, of which source i gets n_i (B·w_i rounded
 * by largest remainder, the weights normalised), in the order of smooth weighted round robin over
 * the n_i (each pick adds n_i to every source's credit and takes B from the largest, the first on
 * a tie; after B picks every credit is back at 0, so the block repeats). Its index within source i
 * is q = (k / B)·n_i + (places of source i before place k mod B), O(1) from a table made at open,
 * and its row is the source's own order at q (pt_data_row: the source's rows in order, or a
 * permutation per pass seeded by training.seed and the source's name), wrapping into the source's
 * next epoch. Nothing depends on what was read before, so a resumed run reads exactly what the
 * uninterrupted one did. data.train alone is a mixture of one source with B = 1: q = k, the order
 * described above. */
#define PT_MIX_BLOCK 4096
#define PT_MIX_MAX_SOURCES 64
#define PT_MIX_NAME_MAX 32

/* data.sources and data.weights, parsed and checked (no file touched). */
typedef struct {
    int n;
    char *text;                          /* a copy of data.sources the names and globs point into */
    const char *name[PT_MIX_MAX_SOURCES];
    const char *glob[PT_MIX_MAX_SOURCES];
    double weight[PT_MIX_MAX_SOURCES];   /* normalised: they sum to 1 */
    int32_t per_block[PT_MIX_MAX_SOURCES]; /* n_i: places of a block of PT_MIX_BLOCK */
} pt_mix_spec;

/* PT_ERR_CONFIG naming the key and the problem: an item that is not NAME=GLOB, a name that is not
 * [A-Za-z0-9_.-] or is repeated, a weight count that differs from the sources', a weight that is
 * not a positive number or is too small to get one place of a block. Free with pt_mix_spec_free
 * (also after an error). */
pt_status pt_mix_parse(const char *sources, const char *weights, pt_mix_spec *spec);
void pt_mix_spec_free(pt_mix_spec *spec);

typedef struct {
    int n;             /* sources */
    int mixed;         /* 1: from data.sources (epochs logged, shares reported); 0: data.train */
    pt_data *src;      /* (n) each source's shards and its own order */
    char **name;       /* (n) */
    char **glob;       /* (n) */
    double *weight;    /* (n) normalised */
    int block;         /* B: places per block of the schedule */
    int32_t *per_block; /* (n) n_i */
    int32_t *slot;     /* (B) the source of each place of a block */
    int32_t *prefix;   /* (n, B + 1) places of source i before place p of a block */
    double *share;     /* (n) what pt_mix_shares wrote last */
} pt_mix;

/* data.sources (with data.weights) when set, else data.train: opens every source's shards (each
 * with its own order: shuffled by a seed from `seed` and its name). A source's glob that matches
 * nothing is PT_ERR_CONFIG naming it. */
pt_status pt_mix_open(pt_mix *m, const char *train, const char *sources, const char *weights,
                      int T, int shuffle, uint64_t seed, int vocab_size);
void pt_mix_close(pt_mix *m);
/* Logs (rank 0) what was opened: shards, rows, and per source its weight and places per block. */
void pt_mix_log(const pt_mix *m);
/* The source of global sequence k, and its index q within that source (its place in the source's
 * own order, counting across epochs). */
int pt_mix_source(const pt_mix *m, int64_t k, int64_t *q);
/* Sequences of source i among global sequences 0 … K−1. */
int64_t pt_mix_count(const pt_mix *m, int i, int64_t K);
/* The source and the row within that source of sequence j of step s's global batch of G. */
int64_t pt_mix_row(pt_mix *m, int64_t step, int64_t j, int64_t G, int *source);
/* Reads sequences [j0, j0+count) of step s's global batch of G: inputs, targets (count, T). */
void pt_mix_batch(pt_mix *m, int64_t step, int64_t G, int64_t j0, int count, int32_t *inputs,
                  int32_t *targets);
/* Logs (rank 0) every source of a mixture whose next epoch starts during step s (0-based; the log
 * names step s + 1, as the step lines do): "data: source web starts epoch 2 at step 123". */
void pt_mix_log_epochs(const pt_mix *m, int64_t step, int64_t G);
/* Each source's share of global sequences 0 … K−1 (of their tokens: every sequence has T), in
 * m->share, which it returns. */
const double *pt_mix_shares(pt_mix *m, int64_t K);

/* Writes a shard of uint16 (magic 20240520) or uint32 (magic 20240801) tokens atomically. */
pt_status pt_shard_write(const char *path, const uint16_t *tokens, size_t n);
pt_status pt_shard_write32(const char *path, const uint32_t *tokens, size_t n);

/* Token k of a mapped token array of `width` (2 or 4) bytes per token. */
static inline uint32_t pt_shard_token(const uint8_t *tokens, size_t width, size_t k) {
    if (width == 4) {
        uint32_t v;
        memcpy(&v, tokens + 4 * k, 4);
        return v;
    }
    uint16_t v;
    memcpy(&v, tokens + 2 * k, 2);
    return v;
}

#endif
