/* bpe.c: the GPT-2 byte-level BPE tokenizer (see include/pt/tokenizer.h for the contract), and the
 * merging of pieces for the tokenizers of tokenizer_json.c (byte-level, and SentencePiece-style
 * whose pieces start as characters: sp_symbols).
 *
 * Encoding is two stages, both written to give exactly the output of the reference Encoder.js:
 *
 *  1. The pre-tokenizer cuts the text into pieces with a hand-written matcher for the GPT-2
 *     pattern (next_piece). Its alternatives are tried in order at each position, as a
 *     backtracking regex engine does; the only backtracking that matters is \s+(?!\S), which
 *     leaves the last white-space character of a run for the piece that follows it.
 *
 *  2. Each piece's bytes become single-byte tokens, which are merged by rank. Encoder.js merges,
 *     in each round, every occurrence (left to right) of the adjacent pair with the lowest rank.
 *     For pieces without a comma this equals merging the lowest (rank, position) pair one at a time
 *     (a heap, O(n log n)), because in vocab.bpe a merge's parts are always made by lower-ranked
 *     merges, so a merge never creates a pair that outranks the one being merged (checked at load;
 *     if it failed, every piece would take the exact path). Pieces with a comma take the exact
 *     round-by-round path (each round O(n), at most one round per rank), because Encoder.js looks
 *     ranks up by the string "a,b": the pair ('",', '"') ranks as the merge ('"', ',"'), and when
 *     both occur in a word, the one occurring last is merged first. (All 11 such aliases in GPT-2's
 *     vocab.bpe join two adjacent commas and make the same token as the merge they alias; no
 *     string we tried, 300k random punctuation strings among them, reaches one with a different
 *     result from plain BPE. The exact path keeps us right should one exist.)
 *
 * Merged pieces are cached by their bytes (cleared when it grows past a bound), so repeated words
 * cost one hash lookup.
 */
#include "pt/tokenizer.h"

#include "data/bpe_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum {
    PT_BPE_CACHE_MAX_ENTRIES = 1 << 20,
    PT_BPE_CACHE_MAX_BYTES = 64 << 20,
};

static void *bpe_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    PT_ASSERTF(q, "out of memory reallocating %zu bytes", bytes);
    return q;
}

/* Grows *buf (elements of `size` bytes, *cap allocated) to hold at least `need`. */
void pt_bpe_reserve(void **buf, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    *buf = bpe_realloc(*buf, c * size);
    *cap = c;
}

uint64_t pt_bpe_hash(const uint8_t *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

void pt_bmap_free(bmap *m) {
    free(m->slots);
    free(m->ents);
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

void pt_bmap_clear(bmap *m) {
    if (m->slots) memset(m->slots, 0, m->nslots * sizeof *m->slots);
    m->n = m->keys_len = m->vals_len = 0;
}

const bmap_entry *pt_bmap_get(const bmap *m, const uint8_t *key, size_t len, uint64_t h) {
    if (!m->nslots) return NULL;
    size_t mask = m->nslots - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        uint32_t s = m->slots[i];
        if (!s) return NULL;
        const bmap_entry *e = &m->ents[s - 1];
        if (e->hash == h && e->key_len == len && memcmp(m->keys + e->key_off, key, len) == 0)
            return e;
    }
}

static void bmap_place(bmap *m, uint32_t idx) {
    size_t mask = m->nslots - 1;
    size_t i = m->ents[idx].hash & mask;
    while (m->slots[i]) i = (i + 1) & mask;
    m->slots[i] = idx + 1;
}

/* Adds key -> vals; the key must not be present. */
void pt_bmap_put(bmap *m, const uint8_t *key, size_t len, uint64_t h, const int32_t *vals,
                     size_t nvals) {
    if (2 * (m->n + 1) > m->nslots) { /* keep the load factor <= 1/2 */
        size_t ns = m->nslots ? 2 * m->nslots : 1024;
        free(m->slots);
        m->slots = pt_calloc(ns, sizeof *m->slots);
        m->nslots = ns;
        for (size_t i = 0; i < m->n; i++) bmap_place(m, (uint32_t)i);
    }
    pt_bpe_reserve((void **)&m->ents, &m->ents_cap, m->n + 1, sizeof *m->ents);
    pt_bpe_reserve((void **)&m->keys, &m->keys_cap, m->keys_len + len, 1);
    pt_bpe_reserve((void **)&m->vals, &m->vals_cap, m->vals_len + nvals, sizeof *m->vals);
    bmap_entry *e = &m->ents[m->n];
    e->hash = h;
    e->key_off = (uint32_t)m->keys_len;
    e->key_len = (uint32_t)len;
    e->val_off = (uint32_t)m->vals_len;
    e->val_len = (uint32_t)nvals;
    memcpy(m->keys + m->keys_len, key, len);
    memcpy(m->vals + m->vals_len, vals, nvals * sizeof *vals);
    m->keys_len += len;
    m->vals_len += nvals;
    bmap_place(m, (uint32_t)m->n);
    m->n++;
}

/* ---- merge table: (left id, right id) -> (rank, merged id) ---- */

static inline uint64_t merge_key(int32_t a, int32_t b) {
    return (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
}

static inline size_t merge_hash(uint64_t k) {
    return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20);
}

static inline const merge_slot *merge_find(const pt_tokenizer *t, int32_t a, int32_t b) {
    uint64_t k = merge_key(a, b);
    for (size_t i = merge_hash(k) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_slot *s = &t->merges[i];
        if (s->key == k) return s;
        if (s->key == MERGE_EMPTY) return NULL;
    }
}

/* Sets (a, b) -> (rank, id), replacing an earlier value as the later assignment does in Encoder.js. */
void pt_bpe_merge_set(pt_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t k = merge_key(a, b);
    size_t i = merge_hash(k) & t->merge_mask;
    while (t->merges[i].key != MERGE_EMPTY && t->merges[i].key != k) i = (i + 1) & t->merge_mask;
    t->merges[i].key = k;
    t->merges[i].rank = rank;
    t->merges[i].id = id;
}

void pt_bpe_merges_init(pt_tokenizer *t, size_t n) {
    size_t cap = 1024;
    while (cap < 4 * (n + 16)) cap *= 2; /* GPT-2's aliases add a few entries */
    t->merges = pt_malloc(cap * sizeof *t->merges);
    for (size_t i = 0; i < cap; i++) t->merges[i].key = MERGE_EMPTY;
    t->merge_mask = cap - 1;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the others for
 * U+0100 + k in byte order. Fills the inverse (code point -> byte, -1 if none). */
void pt_bpe_byte_decoder(int16_t dec[324]) {
    for (int i = 0; i < 324; i++) dec[i] = -1;
    int k = 0;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        dec[printable ? b : 256 + k++] = (int16_t)b;
    }
}

/* Class of the character at s[i] and its length in bytes; invalid bytes are PT_CHAR_OTHER. */
static inline int char_at(const pt_tokenizer *t, const uint8_t *s, size_t len, size_t i, size_t *n) {
    if (s[i] < 0x80) {
        *n = 1;
        return t->ascii_class[s[i]];
    }
    uint32_t cp = pt_utf8_decode(s, len, i, n);
    return cp == UINT32_MAX ? PT_CHAR_OTHER : (int)pt_tokenizer_char_class(cp);
}

/* End of the piece that starts at `pos` (< len): the first alternative of
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * that matches there. */
static size_t next_piece(const pt_tokenizer *t, const uint8_t *s, size_t len, size_t pos) {
    if (s[pos] == '\'' && pos + 1 < len) {
        uint8_t c1 = s[pos + 1];
        if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return pos + 2;
        if (pos + 2 < len) {
            uint8_t c2 = s[pos + 2];
            if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l'))
                return pos + 3;
        }
    }
    size_t n, p = pos;
    int cls = char_at(t, s, len, pos, &n);
    if (s[pos] == ' ' && pos + 1 < len) { /* " ?" then a letter, number or other run */
        size_t n1;
        int c1 = char_at(t, s, len, pos + 1, &n1);
        if (c1 != PT_CHAR_SPACE) {
            cls = c1;
            n = n1;
            p = pos + 1;
        }
    }
    if (cls != PT_CHAR_SPACE) {
        p += n;
        while (p < len) {
            if (char_at(t, s, len, p, &n) != cls) break;
            p += n;
        }
        return p;
    }
    /* A white-space run: \s+(?!\S) takes all of it at the end of the text, or all but its last
     * character when two or more are followed by a non-space; else \s+ takes the one character. */
    size_t last = pos, count = 0;
    p = pos;
    while (p < len && char_at(t, s, len, p, &n) == PT_CHAR_SPACE) {
        last = p;
        p += n;
        count++;
    }
    if (p == len || count == 1) return p;
    return last;
}

/* ---- merging one piece ---- */

static inline bool heap_less(heap_item a, heap_item b) {
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(pt_tokenizer *t, size_t *hn, int32_t rank, int32_t pos) {
    pt_bpe_reserve((void **)&t->heap, &t->heap_cap, *hn + 1, sizeof *t->heap);
    heap_item *h = t->heap, it = {rank, pos};
    size_t i = (*hn)++;
    while (i > 0 && heap_less(it, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = it;
}

static heap_item heap_pop(pt_tokenizer *t, size_t *hn) {
    heap_item *h = t->heap, top = h[0], last = h[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && heap_less(h[c + 1], h[c])) c++;
        if (!heap_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = last;
    return top;
}

static void heap_push_pair(pt_tokenizer *t, size_t *hn, int32_t p) {
    if (p < 0 || t->next[p] < 0) return;
    const merge_slot *m = merge_find(t, t->sym[p], t->sym[t->next[p]]);
    if (m) heap_push(t, hn, m->rank, p);
}

/* Lowest (rank, position) first over a linked list of symbols; leaves the result in t->sym[0..). */
static size_t merge_heap(pt_tokenizer *t, size_t n) {
    pt_bpe_reserve((void **)&t->prev, &t->prev_cap, n, sizeof *t->prev);
    pt_bpe_reserve((void **)&t->next, &t->next_cap, n, sizeof *t->next);
    int32_t *sym = t->sym, *prev = t->prev, *next = t->next;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) heap_push_pair(t, &hn, (int32_t)i);
    while (hn) {
        heap_item it = heap_pop(t, &hn);
        int32_t p = it.pos, q;
        if (sym[p] < 0 || (q = next[p]) < 0) continue;
        const merge_slot *m = merge_find(t, sym[p], sym[q]);
        if (!m || m->rank != it.rank) continue; /* stale: the pair has changed since the push */
        sym[p] = m->id;
        sym[q] = -1;
        next[p] = next[q];
        if (next[q] >= 0) prev[next[q]] = p;
        heap_push_pair(t, &hn, prev[p]);
        heap_push_pair(t, &hn, p);
    }
    size_t k = 0;
    for (int32_t p = 0; p >= 0; p = next[p]) sym[k++] = sym[p];
    return k;
}

/* Encoder.js's loop: each round, find the lowest-ranked pair (the last one on ties), then merge
 * every occurrence of that exact pair from left to right. */
static size_t merge_exact(pt_tokenizer *t, size_t n) {
    pt_bpe_reserve((void **)&t->sym2, &t->sym2_cap, n, sizeof *t->sym2);
    while (n > 1) {
        int32_t *sym = t->sym;
        const merge_slot *best = NULL;
        size_t bi = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            const merge_slot *m = merge_find(t, sym[i], sym[i + 1]);
            if (m && (!best || m->rank <= best->rank)) {
                best = m;
                bi = i;
            }
        }
        if (!best) break;
        int32_t a = sym[bi], b = sym[bi + 1];
        size_t k = 0;
        for (size_t i = 0; i < n;) {
            if (i + 1 < n && sym[i] == a && sym[i + 1] == b) {
                t->sym2[k++] = best->id;
                i += 2;
            } else {
                t->sym2[k++] = sym[i++];
            }
        }
        int32_t *tmp = t->sym;
        t->sym = t->sym2;
        t->sym2 = tmp;
        size_t c = t->sym_cap;
        t->sym_cap = t->sym2_cap;
        t->sym2_cap = c;
        n = k;
    }
    return n;
}

void pt_bpe_append(int32_t **tokens, size_t *n, size_t *cap, const int32_t *ids, size_t k) {
    pt_bpe_reserve((void **)tokens, cap, *n + k, sizeof **tokens);
    memcpy(*tokens + *n, ids, k * sizeof *ids);
    *n += k;
}

/* SentencePiece-style symbols of a piece (UTF-8, ' ' for U+2581): each character's token, else its
 * bytes' <0xNN> tokens (byte_fallback, when all of them exist), else the unknown token, with
 * consecutive unknowns fused into one under fuse_unk. As in the Rust crate, an unknown is held
 * back until the next character that is a token (or the end), so byte tokens met in between go
 * before it. Fills t->sym; returns the count. */
static size_t sp_symbols(pt_tokenizer *t, const uint8_t *s, size_t len) {
    pt_bpe_reserve((void **)&t->sym, &t->sym_cap, len + 1, sizeof *t->sym);
    int32_t *sym = t->sym;
    size_t k = 0;
    bool unk = false;
    for (size_t i = 0, c; i < len; i += c) {
        pt_utf8_decode(s, len, i, &c);
        const bmap_entry *e = pt_bmap_get(&t->vocab, s + i, c, pt_bpe_hash(s + i, c));
        if (e) {
            if (unk) sym[k++] = t->unk;
            unk = false;
            sym[k++] = t->vocab.vals[e->val_off];
            continue;
        }
        bool bytes = t->byte_fallback;
        for (size_t j = 0; j < c; j++) bytes &= t->byte_fb[s[i + j]] >= 0;
        if (bytes) {
            for (size_t j = 0; j < c; j++) sym[k++] = t->byte_fb[s[i + j]];
        } else if (t->unk >= 0) {
            if (unk && !t->fuse_unk) sym[k++] = t->unk;
            unk = true;
        } /* no unknown token: the character is dropped */
    }
    if (unk) sym[k++] = t->unk;
    return k;
}

void pt_bpe_encode_piece(pt_tokenizer *t, const uint8_t *s, size_t len, int32_t **tokens,
                         size_t *n, size_t *cap) {
    if (len == 1 && !t->sp) {
        pt_bpe_append(tokens, n, cap, &t->byte_id[s[0]], 1);
        return;
    }
    uint64_t h = pt_bpe_hash(s, len);
    const bmap_entry *e = pt_bmap_get(&t->cache, s, len, h);
    if (e) {
        pt_bpe_append(tokens, n, cap, t->cache.vals + e->val_off, e->val_len);
        return;
    }
    if (t->ignore_merges) {
        const bmap_entry *v = pt_bmap_get(&t->vocab, s, len, h);
        if (v) {
            pt_bpe_append(tokens, n, cap, t->vocab.vals + v->val_off, 1);
            return;
        }
    }
    size_t k;
    if (t->sp) {
        k = sp_symbols(t, s, len);
        if (k > 1) k = merge_heap(t, k);
    } else {
        pt_bpe_reserve((void **)&t->sym, &t->sym_cap, len, sizeof *t->sym);
        bool comma = false;
        for (size_t i = 0; i < len; i++) {
            t->sym[i] = t->byte_id[s[i]];
            comma |= s[i] == ',';
        }
        k = (t->heap_ok && !(comma && t->comma_quirk)) ? merge_heap(t, len) : merge_exact(t, len);
    }
    pt_bpe_append(tokens, n, cap, t->sym, k);
    if (t->cache.n >= PT_BPE_CACHE_MAX_ENTRIES || t->cache.keys_len + len > PT_BPE_CACHE_MAX_BYTES ||
        t->cache.vals_len + k > PT_BPE_CACHE_MAX_BYTES / sizeof(int32_t))
        pt_bmap_clear(&t->cache);
    if (len <= PT_BPE_CACHE_MAX_BYTES) pt_bmap_put(&t->cache, s, len, h, t->sym, k);
}

pt_status pt_tokenizer_encode(pt_tokenizer *t, const char *text, size_t len, int32_t **tokens,
                              size_t *n, size_t *cap) {
    if (t->encode_text) return t->encode_text(t, text, len, tokens, n, cap);
    const uint8_t *s = (const uint8_t *)text;
    for (size_t pos = 0; pos < len;) {
        size_t end = next_piece(t, s, len, pos);
        pt_bpe_encode_piece(t, s + pos, end - pos, tokens, n, cap);
        pos = end;
    }
    return PT_OK;
}

char *pt_tokenizer_decode(const pt_tokenizer *t, const int32_t *tokens, size_t n, size_t *len) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= t->nvocab) {
            pt_errorf(PT_ERR_FORMAT, "token %zu: id %d is outside the vocabulary [0, %d)", i,
                      (int)tokens[i], (int)t->nvocab);
            return NULL;
        }
        total += t->tok_off[tokens[i] + 1] - t->tok_off[tokens[i]];
    }
    char *out = pt_malloc(total + 1), *p = out;
    for (size_t i = 0; i < n; i++) {
        uint32_t a = t->tok_off[tokens[i]], b = t->tok_off[tokens[i] + 1];
        memcpy(p, t->tok_bytes + a, b - a);
        p += b - a;
    }
    *p = 0;
    if (len) *len = total;
    return out;
}

int pt_tokenizer_eot(const pt_tokenizer *t) { return t->eot; }
int pt_tokenizer_vocab_size(const pt_tokenizer *t) { return t->nvocab; }

/* ---- loading ---- */

/* Byte-encoded token text (UTF-8 of bytes_to_unicode characters) -> raw bytes in out (capacity
 * >= strlen(s)). Returns the byte count, or -1 if a character is not one of the 256. */
long pt_bpe_unicode_to_bytes(const int16_t dec[324], const char *s, size_t slen, uint8_t *out) {
    size_t i = 0, k = 0;
    while (i < slen) {
        size_t n;
        uint32_t cp = pt_utf8_decode((const uint8_t *)s, slen, i, &n);
        if (cp >= 324 || dec[cp] < 0) return -1;
        out[k++] = (uint8_t)dec[cp];
        i += n;
    }
    return (long)k;
}

long pt_bpe_token_bytes(const int16_t dec[324], const char *s, uint8_t **buf, size_t *cap) {
    size_t n = strlen(s);
    pt_bpe_reserve((void **)buf, cap, n + 1, 1);
    return pt_bpe_unicode_to_bytes(dec, s, n, *buf);
}

static const bmap_entry *vocab_get(const bmap *v, const uint8_t *s, size_t n) {
    return pt_bmap_get(v, s, n, pt_bpe_hash(s, n));
}

static pt_status load_encoder(pt_tokenizer *t, const char *path, const int16_t dec[324], bmap *vocab) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s:%d: not valid JSON: %s", path, jerr.line, jerr.text);
    pt_status st = PT_OK;
    if (!json_is_object(root) || json_object_size(root) == 0 || json_object_size(root) > INT32_MAX) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: expected a non-empty object of token -> id", path);
        goto done;
    }
    size_t nv = json_object_size(root);
    t->nvocab = (int32_t)nv;
    /* Lay out the tokens' bytes by id: first the lengths, then the bytes. */
    uint32_t *lens = pt_calloc(nv, sizeof *lens);
    uint8_t *buf = NULL;
    size_t buf_cap = 0, total = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || (size_t)id >= nv || lens[id]) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: token \"%s\": id must be a unique integer in [0, %zu)",
                           path, key, nv);
            break;
        }
        long bl = pt_bpe_token_bytes(dec, key, &buf, &buf_cap);
        if (bl <= 0) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: token \"%s\" is not byte-level BPE text", path, key);
            break;
        }
        lens[id] = (uint32_t)bl;
        total += (size_t)bl;
    }
    if (st == PT_OK && total > UINT32_MAX)
        st = pt_errorf(PT_ERR_FORMAT, "%s: tokens too long in total", path);
    if (st == PT_OK) {
        t->tok_off = pt_malloc((nv + 1) * sizeof *t->tok_off);
        t->tok_bytes = pt_malloc(total ? total : 1);
        t->tok_off[0] = 0;
        for (size_t i = 0; i < nv; i++) t->tok_off[i + 1] = t->tok_off[i] + lens[i];
        json_object_foreach(root, key, val) {
            int32_t id = (int32_t)json_integer_value(val);
            pt_bpe_unicode_to_bytes(dec, key, strlen(key), t->tok_bytes + t->tok_off[id]);
        }
        for (int32_t id = 0; id < (int32_t)nv && st == PT_OK; id++) {
            const uint8_t *b = t->tok_bytes + t->tok_off[id];
            uint32_t bl = t->tok_off[id + 1] - t->tok_off[id];
            uint64_t h = pt_bpe_hash(b, bl);
            if (pt_bmap_get(vocab, b, bl, h)) {
                st = pt_errorf(PT_ERR_FORMAT, "%s: id %d repeats the bytes of another token", path, id);
                break;
            }
            pt_bmap_put(vocab, b, bl, h, &id, 1);
        }
    }
    free(lens);
    free(buf);
done:
    json_decref(root);
    return st;
}

/* One merge line "A B" of vocab.bpe, at rank `rank`. Registers every pair whose Encoder.js lookup
 * key "a,b" equals "A,B": the pair itself, and the splits at its other commas whose parts are
 * tokens (the aliases described at the top). */
static pt_status load_merge(pt_tokenizer *t, const bmap *vocab, const int16_t dec[324],
                            const char *path, size_t line, int32_t rank, const char *a, size_t al,
                            const char *b, size_t bl, uint8_t *scratch, int32_t pair[3]) {
    /* scratch (>= al + bl + 1 bytes) := bytes(A) ',' bytes(B) */
    long na = pt_bpe_unicode_to_bytes(dec, a, al, scratch);
    long nb = na > 0 ? pt_bpe_unicode_to_bytes(dec, b, bl, scratch + na + 1) : -1;
    if (na <= 0 || nb <= 0)
        return pt_errorf(PT_ERR_FORMAT, "%s:%zu: merge is not two byte-level BPE tokens", path, line);
    scratch[na] = ',';
    size_t klen = (size_t)(na + 1 + nb);
    const bmap_entry *ea = vocab_get(vocab, scratch, (size_t)na);
    const bmap_entry *eb = vocab_get(vocab, scratch + na + 1, (size_t)nb);
    if (!ea || !eb)
        return pt_errorf(PT_ERR_FORMAT, "%s:%zu: merge part is not in encoder.json", path, line);
    pair[0] = vocab->vals[ea->val_off];
    pair[1] = vocab->vals[eb->val_off];
    uint8_t *joined = scratch + klen + 1; /* scratch holds 2 * klen + 2 bytes */
    for (size_t c = 0; c < klen; c++) {
        if (scratch[c] != ',' || c == 0 || c + 1 == klen) continue;
        const bmap_entry *x = vocab_get(vocab, scratch, c);
        const bmap_entry *y = vocab_get(vocab, scratch + c + 1, klen - c - 1);
        memcpy(joined, scratch, c);
        memcpy(joined + c, scratch + c + 1, klen - c - 1);
        const bmap_entry *z = vocab_get(vocab, joined, klen - 1);
        bool genuine = c == (size_t)na;
        if (genuine && !z)
            return pt_errorf(PT_ERR_FORMAT, "%s:%zu: merged token is not in encoder.json", path, line);
        if (!x || !y || !z) continue;
        int32_t id = vocab->vals[z->val_off];
        pt_bpe_merge_set(t, vocab->vals[x->val_off], vocab->vals[y->val_off], rank, id);
        if (genuine) pair[2] = id;
    }
    return PT_OK;
}

static pt_status load_merges(pt_tokenizer *t, const char *path, const bmap *vocab,
                             const int16_t dec[324]) {
    char *data;
    size_t len;
    PT_TRY(pt_read_file(path, &data, &len));
    /* Encoder.js takes the '\n'-separated fields between the first (the "#version" line) and the
     * last (empty when the file ends with a newline). */
    size_t nlines = 0;
    for (size_t i = 0; i < len; i++) nlines += data[i] == '\n';
    size_t nmerges = nlines ? nlines - 1 : 0;
    if (nmerges > INT32_MAX) {
        free(data);
        return pt_errorf(PT_ERR_FORMAT, "%s: too many merges", path);
    }
    pt_bpe_merges_init(t, nmerges);
    int32_t (*pairs)[3] = pt_malloc((nmerges ? nmerges : 1) * sizeof *pairs); /* left, right, made */
    uint8_t *scratch = NULL;
    size_t scratch_cap = 0;

    pt_status st = PT_OK;
    char *p = memchr(data, '\n', len);
    for (size_t m = 0; m < nmerges && st == PT_OK; m++) {
        char *line = p + 1;
        char *end = memchr(line, '\n', len - (size_t)(line - data));
        p = end;
        /* two fields separated by white space (JS split(/\s+/); tokens never hold ASCII space) */
        const char *f[3];
        size_t fl[3], nf = 0;
        for (char *c = line; c < end;) {
            while (c < end && (*c == ' ' || *c == '\t' || *c == '\r' || *c == '\v' || *c == '\f')) c++;
            if (c == end) break;
            char *s = c;
            while (c < end && !(*c == ' ' || *c == '\t' || *c == '\r' || *c == '\v' || *c == '\f')) c++;
            if (nf < 3) {
                f[nf] = s;
                fl[nf] = (size_t)(c - s);
            }
            nf++;
        }
        if (nf != 2) {
            st = pt_errorf(PT_ERR_FORMAT, "%s:%zu: expected two tokens separated by a space", path, m + 2);
            break;
        }
        pt_bpe_reserve((void **)&scratch, &scratch_cap, 2 * (fl[0] + fl[1] + 2), 1);
        st = load_merge(t, vocab, dec, path, m + 2, (int32_t)m, f[0], fl[0], f[1], fl[1], scratch,
                        pairs[m]);
    }
    /* Monotone ranks (see the top): each merge's parts are single bytes, or made by an earlier
     * merge, or never made at all (then the pair never occurs). */
    t->heap_ok = true;
    if (st == PT_OK) {
        int32_t *made_by = pt_malloc((size_t)t->nvocab * sizeof *made_by);
        for (int32_t i = 0; i < t->nvocab; i++) made_by[i] = INT32_MAX;
        for (size_t m = nmerges; m-- > 0;) made_by[pairs[m][2]] = (int32_t)m;
        for (size_t m = 0; m < nmerges; m++) {
            int32_t a = made_by[pairs[m][0]], b = made_by[pairs[m][1]];
            if ((a != INT32_MAX && a >= (int32_t)m) || (b != INT32_MAX && b >= (int32_t)m))
                t->heap_ok = false;
        }
        free(made_by);
    }
    free(pairs);
    free(scratch);
    free(data);
    return st;
}

pt_status pt_tokenizer_load(pt_tokenizer **out, const char *dir) {
    *out = NULL;
    char path[4096];
    pt_tokenizer *t = pt_calloc(1, sizeof *t);
    t->comma_quirk = true;
    bmap vocab = {0};
    int16_t dec[324];
    pt_bpe_byte_decoder(dec);
    for (int c = 0; c < 128; c++) t->ascii_class[c] = (uint8_t)pt_tokenizer_char_class((uint32_t)c);

    snprintf(path, sizeof path, "%s/encoder.json", dir);
    pt_status st = load_encoder(t, path, dec, &vocab);
    for (int b = 0; b < 256 && st == PT_OK; b++) {
        uint8_t c = (uint8_t)b;
        const bmap_entry *e = vocab_get(&vocab, &c, 1);
        if (!e)
            st = pt_errorf(PT_ERR_FORMAT, "%s: byte 0x%02x has no token", path, b);
        else
            t->byte_id[b] = vocab.vals[e->val_off];
    }
    if (st == PT_OK) {
        const char *eot = "<|endoftext|>";
        const bmap_entry *e = vocab_get(&vocab, (const uint8_t *)eot, strlen(eot));
        if (!e)
            st = pt_errorf(PT_ERR_FORMAT, "%s: no \"<|endoftext|>\" token", path);
        else
            t->eot = vocab.vals[e->val_off];
    }
    if (st == PT_OK) {
        snprintf(path, sizeof path, "%s/vocab.bpe", dir);
        st = load_merges(t, path, &vocab, dec);
    }
    pt_bmap_free(&vocab);
    if (st != PT_OK) {
        pt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return PT_OK;
}

void pt_tokenizer_free(pt_tokenizer *t) {
    if (!t) return;
    if (t->free_parts) t->free_parts(t);
    free(t->tok_off);
    free(t->tok_bytes);
    free(t->merges);
    pt_bmap_free(&t->cache);
    free(t->sym);
    free(t->sym2);
    free(t->prev);
    free(t->next);
    free(t->heap);
    free(t);
}
