/* bpe_internal.h: the BPE tokenizers' insides, shared by bpe.c (GPT-2's encoder.json + vocab.bpe,
 * the merging) and tokenizer_json.c (Hugging Face tokenizer.json and tiktoken files: added tokens,
 * normalisation, the regex pre-tokenizer, and SentencePiece-style BPE). Not a public header.
 */
#ifndef PT_BPE_INTERNAL_H
#define PT_BPE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "pt/tokenizer.h"

/* ---- byte string -> int32 list map (open addressing; used for the vocabulary and the cache) ---- */

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len, val_off, val_len;
} bmap_entry;

typedef struct {
    uint32_t *slots; /* entry index + 1; 0 = empty */
    size_t nslots;   /* power of two */
    bmap_entry *ents;
    size_t n, ents_cap;
    uint8_t *keys;
    size_t keys_len, keys_cap;
    int32_t *vals;
    size_t vals_len, vals_cap;
} bmap;

uint64_t pt_bpe_hash(const uint8_t *s, size_t n);
void pt_bmap_free(bmap *m);
void pt_bmap_clear(bmap *m);
const bmap_entry *pt_bmap_get(const bmap *m, const uint8_t *key, size_t len, uint64_t h);
/* Adds key -> vals; the key must not be present. */
void pt_bmap_put(bmap *m, const uint8_t *key, size_t len, uint64_t h, const int32_t *vals,
                 size_t nvals);

/* ---- merge table: (left id, right id) -> (rank, merged id) ---- */

typedef struct {
    uint64_t key; /* left << 32 | right; MERGE_EMPTY = free slot */
    int32_t rank, id;
} merge_slot;

#define MERGE_EMPTY UINT64_MAX

typedef struct {
    int32_t rank, pos;
} heap_item;

typedef enum {
    PT_TOK_SOURCE_GPT2 = 0, /* encoder.json + vocab.bpe */
    PT_TOK_SOURCE_JSON,     /* tokenizer.json */
    PT_TOK_SOURCE_TIKTOKEN, /* a .tiktoken ranks file */
} pt_tok_source;

enum { PT_TOK_MAX_STAGES = 4 };

typedef struct {
    pcre2_code *code;
    pcre2_match_data *match;
    pcre2_match_context *context;
    pcre2_jit_stack *stack;
} pt_tok_regex;

typedef struct {
    char *bytes;
    size_t len;
    int32_t id;
} pt_tok_added;

struct pt_tokenizer {
    int32_t nvocab;
    uint32_t *tok_off; /* bytes of id i: tok_bytes[tok_off[i] .. tok_off[i + 1]) */
    uint8_t *tok_bytes;
    int32_t byte_id[256]; /* id of each single byte */
    int32_t eot;
    uint8_t ascii_class[128];

    merge_slot *merges;
    size_t merge_mask;
    bool heap_ok; /* vocab.bpe ranks are monotone: comma-free pieces may use the heap */
    bool comma_quirk; /* Encoder.js ranks pairs by the string "a,b" (GPT-2 files only) */

    bmap cache;

    /* tokenizer.json and tiktoken files (src/data/tokenizer_json.c); zero for GPT-2's files. Their
     * encoder and destructor are reached through these pointers, so that bpe.c (the merging, which
     * tokenizer_json.c calls) does not call back into tokenizer_json.c by name. */
    pt_tok_source source;
    pt_status (*encode_text)(pt_tokenizer *t, const char *text, size_t len, int32_t **tokens,
                             size_t *n, size_t *cap);
    void (*free_parts)(pt_tokenizer *t);
    bool ignore_merges;   /* a piece that is itself a token is that token (Llama 3, tiktoken) */
    bool nfc;             /* the normalizer is NFC */
    bmap vocab;           /* token bytes -> id, kept for ignore_merges */
    int n_stages;         /* pre-tokenizer regexes, applied in order, each splitting every piece */
    pt_tok_regex stages[PT_TOK_MAX_STAGES];
    /* SentencePiece-style BPE (Llama 2, Mistral): symbols are characters, not bytes. Text is kept
     * with ' ' standing for "\u2581" (input spaces and U+2581 alike: the normalizer makes them one
     * character), and t->vocab's keys are the tokens written so; a character that is no token
     * becomes its bytes' <0xNN> tokens (byte_fallback) or the unknown token. */
    bool sp;
    bool sp_prepend_always;    /* normalizer Prepend: "\u2581" before every non-empty section */
    int sp_meta;               /* Metaspace prepend_scheme: -1 no Metaspace, 0 never, 1 first, 2 always */
    bool sp_split;             /* Metaspace split: every "\u2581" starts a piece */
    bool sp_words;             /* no token joins a non-space to a following space: words merge alone */
    bool sp_ignore_section;    /* ignore_merges on a whole section (no splitting pre-tokenizer) */
    bool byte_fallback, fuse_unk;
    int32_t unk;               /* the unknown token, -1 if none (such characters are dropped) */
    int32_t byte_fb[256];      /* <0xNN> tokens, -1 where missing */
    uint8_t *norm;             /* scratch: a section in the ' ' form */
    size_t norm_cap;
    pt_tok_added *added;  /* added tokens, longest first within each first byte */
    int n_added;
    int32_t added_first[257]; /* added[added_first[b] .. added_first[b + 1]) start with byte b */
    uint8_t *text;        /* scratch: the text with invalid UTF-8 replaced, normalised */
    size_t text_cap;

    /* scratch of one piece: symbols, links and the heap */
    int32_t *sym, *sym2, *prev, *next;
    size_t sym_cap, sym2_cap, prev_cap, next_cap;
    heap_item *heap;
    size_t heap_cap;
};

/* Grows *buf (elements of `size` bytes, *cap allocated) to hold at least `need`. */
void pt_bpe_reserve(void **buf, size_t *cap, size_t need, size_t size);
/* Sets (a, b) -> (rank, id), replacing an earlier value for the same pair. */
void pt_bpe_merge_set(pt_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id);
/* Allocates an empty merge table for about n merges. */
void pt_bpe_merges_init(pt_tokenizer *t, size_t n);
/* GPT-2's bytes_to_unicode, inverted: code point -> byte, -1 if none. */
void pt_bpe_byte_decoder(int16_t dec[324]);
/* Byte-level token text -> raw bytes in out (capacity >= slen); the byte count, or -1. */
long pt_bpe_unicode_to_bytes(const int16_t dec[324], const char *s, size_t slen, uint8_t *out);
/* The same for a NUL-terminated token, into *buf (grown to fit). */
long pt_bpe_token_bytes(const int16_t dec[324], const char *s, uint8_t **buf, size_t *cap);
void pt_bpe_append(int32_t **tokens, size_t *n, size_t *cap, const int32_t *ids, size_t k);
/* Merges one pre-tokenized piece and appends its ids. */
void pt_bpe_encode_piece(pt_tokenizer *t, const uint8_t *s, size_t len, int32_t **tokens, size_t *n,
                         size_t *cap);

/* Strict UTF-8 (RFC 3629). Returns the code point and its length in *n, or UINT32_MAX with *n = 1
 * for a byte that does not start a valid sequence. */
static inline uint32_t pt_utf8_decode(const uint8_t *s, size_t len, size_t i, size_t *n) {
    uint8_t b0 = s[i];
    if (b0 < 0x80) {
        *n = 1;
        return b0;
    }
    *n = 1;
    size_t left = len - i;
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        if (left < 2 || (s[i + 1] & 0xC0) != 0x80) return UINT32_MAX;
        *n = 2;
        return (uint32_t)(b0 & 0x1F) << 6 | (s[i + 1] & 0x3F);
    }
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (left < 3) return UINT32_MAX;
        uint8_t b1 = s[i + 1], b2 = s[i + 2];
        uint8_t lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
        if (b1 < lo || b1 > hi || (b2 & 0xC0) != 0x80) return UINT32_MAX;
        *n = 3;
        return (uint32_t)(b0 & 0x0F) << 12 | (uint32_t)(b1 & 0x3F) << 6 | (b2 & 0x3F);
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (left < 4) return UINT32_MAX;
        uint8_t b1 = s[i + 1], b2 = s[i + 2], b3 = s[i + 3];
        uint8_t lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
        if (b1 < lo || b1 > hi || (b2 & 0xC0) != 0x80 || (b3 & 0xC0) != 0x80) return UINT32_MAX;
        *n = 4;
        return (uint32_t)(b0 & 0x07) << 18 | (uint32_t)(b1 & 0x3F) << 12 |
               (uint32_t)(b2 & 0x3F) << 6 | (b3 & 0x3F);
    }
    return UINT32_MAX;
}

#endif
