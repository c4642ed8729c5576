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
