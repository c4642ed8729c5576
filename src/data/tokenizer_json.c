/* tokenizer_json.c: byte-level and SentencePiece-style BPE tokenizers from Hugging Face
 * tokenizer.json files, and byte-level ones from tiktoken ranks files (see include/pt/tokenizer.h
 * for what is supported and how equality with the references is defined).
 *
 * Encoding a text runs the stages of the Hugging Face pipeline, in its order:
 *
 *  1. Bytes that are not UTF-8 become U+FFFD as the WHATWG decoder (Node's TextDecoder) makes them:
 *     the references take strings, and this is the string they are given.
 *  2. Added tokens written in the text are cut out, leftmost first and then longest, and become
 *     their ids; the sections between them go through the rest.
 *  3. The normalizer (NFC, with utf8proc) runs on each section.
 *  4. The pre-tokenizer's regexes (PCRE2, JIT-compiled) split each section into pieces; with
 *     behaviour "Isolated" both the matches and the text between them are pieces. Each further
 *     regex splits every piece of the previous one.
 *  5. Each piece's bytes are merged by bpe.c (lowest rank first, leftmost on ties: the priority
 *     queue of the Rust `tokenizers` crate and of tokenizers.js).
 *
 * SentencePiece-style BPE (Llama 2, Mistral) replaces steps 4 and 5 (sp_encode_section): spaces
 * become "\u2581" and one is prepended (by the normalizer, or by Metaspace), the pieces start as
 * characters (bpe.c's sp_symbols: byte fallback and the unknown token for those that are no
 * token), and are merged by the same priority queue. The references merge a whole section as one
 * word; we merge word by word, with a piece cache, where the vocabulary shows that this gives the
 * same result.
 *
 * The patterns are written for Oniguruma (the Rust crate's engine). Two of its meanings are
 * spelled out before compiling rather than left to PCRE2's definitions: \s is Unicode White_Space
 * (with U+0085, without U+FEFF, unlike JS's \s), and (?i:...) folds ASCII letters only, as
 * tokenizers.js and the other JS references do (PCRE2's caseless mode folds by Unicode rules; the
 * letters become [sS]-style classes instead).
 *
 * Unicode versions: \p{L} and \p{N} come from PCRE2's tables and NFC from utf8proc's (Debian 12:
 * Unicode 14 and 13), the JS references use node's ICU; code points assigned since can be classed
 * or composed differently (none occurs in the tested text).
 */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <utf8proc.h>

#include "data/bpe_internal.h"

/* Unicode White_Space: Oniguruma's \s on Unicode text. */
#define PT_TOK_WHITE_SPACE "\\x{9}-\\x{d}\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* GPT-2's pattern: the ByteLevel pre-tokenizer's own split when use_regex is true. */
static const char PT_TOK_GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* cl100k_base's pattern and special tokens, for .tiktoken files (which hold neither). */
static const char PT_TOK_CL100K_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const struct {
    const char *text;
    int32_t id;
} PT_TOK_CL100K_SPECIAL[] = {{"<|endoftext|>", 100257},
                             {"<|fim_prefix|>", 100258},
                             {"<|fim_middle|>", 100259},
                             {"<|fim_suffix|>", 100260},
                             {"<|endofprompt|>", 100276}};

/* ---- the pattern: Oniguruma -> PCRE2 ---- */

typedef struct {
    char *s;
    size_t n, cap;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
    pt_bpe_reserve((void **)&b->s, &b->cap, b->n + n + 1, 1);
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(strbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

/* Rewrites \s, \S and (?i:...) as the top of the file says; NULL (message set) for what it cannot
 * rewrite faithfully. */
static char *translate_pattern(const char *src, const char *where) {
    strbuf b = {0};
    sb_str(&b, "");
    int depth = 0, ci_depth = -1; /* ci_depth: the paren depth that closes the (?i: group */
    bool in_class = false;
    for (size_t i = 0; src[i]; i++) {
        char c = src[i];
        if (c == '\\') {
            char e = src[i + 1];
            if (!e) {
                free(b.s);
                pt_errorf(PT_ERR_FORMAT, "%s: the regex ends with a backslash", where);
                return NULL;
            }
            if (e == 's')
                sb_str(&b, in_class ? PT_TOK_WHITE_SPACE : "[" PT_TOK_WHITE_SPACE "]");
            else if (e == 'S' && !in_class)
                sb_str(&b, "[^" PT_TOK_WHITE_SPACE "]");
            else
                sb_add(&b, src + i, 2);
            i++;
            continue;
        }
        if (in_class) {
            if (c == ']') in_class = false;
            if (ci_depth >= 0 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
                if (src[i + 1] == '-' || (i > 0 && src[i - 1] == '-')) {
                    free(b.s);
                    pt_errorf(PT_ERR_FORMAT, "%s: a letter range in a class inside (?i:...) is not supported", where);
                    return NULL;
                }
                char o = (char)(c ^ 0x20);
                sb_add(&b, &c, 1);
                sb_add(&b, &o, 1);
                continue;
            }
            sb_add(&b, &c, 1);
            continue;
        }
        if (c == '[') {
            in_class = true;
            sb_add(&b, &c, 1);
            if (src[i + 1] == '^') sb_add(&b, src + ++i, 1);
            if (src[i + 1] == ']') sb_add(&b, src + ++i, 1); /* a leading ']' is literal */
            continue;
        }
        if (c == '(') {
            if (strncmp(src + i, "(?i:", 4) == 0) {
                if (ci_depth >= 0) {
                    free(b.s);
                    pt_errorf(PT_ERR_FORMAT, "%s: nested (?i:...) groups are not supported", where);
                    return NULL;
                }
                ci_depth = depth;
                sb_str(&b, "(?:");
                i += 3;
                depth++;
                continue;
            }
            if (src[i + 1] == '?' && (src[i + 2] == 'i' || src[i + 2] == '-')) {
                free(b.s);
                pt_errorf(PT_ERR_FORMAT, "%s: inline flags other than (?i:...) are not supported", where);
                return NULL;
            }
            depth++;
        } else if (c == ')') {
            depth--;
            if (depth == ci_depth) ci_depth = -1;
        } else if (ci_depth >= 0 && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
            char cls[4] = {'[', c, (char)(c ^ 0x20), ']'};
            sb_add(&b, cls, 4);
            continue;
        }
        sb_add(&b, &c, 1);
    }
    return b.s;
}

static pt_status regex_compile(pt_tok_regex *r, const char *pattern, const char *where) {
    char *p = translate_pattern(pattern, where);
    if (!p) return PT_ERR_FORMAT;
    int err;
    PCRE2_SIZE off;
    r->code = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    free(p);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return pt_errorf(PT_ERR_FORMAT, "%s: bad regex \"%s\": %s at offset %zu", where, pattern,
                         (const char *)msg, (size_t)off);
    }
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE); /* interpreted if the JIT is unavailable */
    r->match = pcre2_match_data_create_from_pattern(r->code, NULL);
    /* the JIT's default 32 KiB stack is enough for these patterns; 8 MiB leaves room for others */
    r->stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
    r->context = pcre2_match_context_create(NULL);
    PT_ASSERTF(r->match && r->stack && r->context, "out of memory for regex match data");
    pcre2_jit_stack_assign(r->context, NULL, r->stack);
    return PT_OK;
}

static pt_status add_stage(pt_tokenizer *t, const char *pattern, const char *where) {
    if (t->n_stages == PT_TOK_MAX_STAGES)
        return pt_errorf(PT_ERR_FORMAT, "%s: more than %d regex splits", where, PT_TOK_MAX_STAGES);
    PT_TRY(regex_compile(&t->stages[t->n_stages], pattern, where));
    t->n_stages++;
    return PT_OK;
}

/* ---- encoding ---- */

/* PCRE2's match limit for a search over `left` bytes. Its default (10^7) stops Llama 3's and
 * cl100k's \s*[\r\n]+, which backtracks over a run of spaces (about a step a byte) before
 * \s+(?!\S) takes the run whole as the references do, on runs of 10^7 spaces; 2 steps a byte left
 * more keeps such searches linear in the text and still stops a pattern that backtracks
 * exponentially. */
static uint32_t match_limit(size_t left) {
    uint64_t limit = 10000000 + 2 * (uint64_t)left;
    return limit < UINT32_MAX ? (uint32_t)limit : UINT32_MAX;
}

/* Stage k of the pre-tokenizer on one piece: its matches and the text between them go on to stage
 * k + 1; after the last stage each piece is merged. Returns 0, or PCRE2's error code (a match or
 * stack limit: the text cannot be split as the references split it) with *at where the failed
 * search began. */
static int split_piece(pt_tokenizer *t, int k, const uint8_t *s, size_t len, int32_t **tokens,
                       size_t *n, size_t *cap, const uint8_t **at) {
    if (len == 0) return 0;
    if (k == t->n_stages) {
        pt_bpe_encode_piece(t, s, len, tokens, n, cap);
        return 0;
    }
    pt_tok_regex *r = &t->stages[k];
    size_t pos = 0, done = 0;
    int err = 0;
    while (pos < len && !err) {
        pcre2_set_match_limit(r->context, match_limit(len - pos));
        int rc = pcre2_match(r->code, s, len, pos, PCRE2_NO_UTF_CHECK, r->match, r->context);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            *at = s + pos;
            return rc;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(r->match);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* an empty match splits nothing: step over one character */
            pos = a + 1;
            while (pos < len && (s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (a > done) err = split_piece(t, k + 1, s + done, a - done, tokens, n, cap, at);
        if (!err) err = split_piece(t, k + 1, s + a, b - a, tokens, n, cap, at);
        done = pos = b;
    }
    if (!err && done < len) err = split_piece(t, k + 1, s + done, len - done, tokens, n, cap, at);
    return err;
}

/* A SentencePiece-style section (normalised, not empty): written in the ' ' form (see
 * bpe_internal.h) with the prepended "\u2581" of the normalizer or of Metaspace (which adds none to
 * a section already starting with one; "first": only to the section at the start of the text),
 * then cut into pieces and merged. Without a splitting pre-tokenizer the whole section is one word
 * to the references; when no token joins a non-space to a following space (sp_words), no merge
 * crosses the start of a space run that follows a non-space, so each such word merges alone, with
 * the same result, and is cached. */
static void sp_encode_section(pt_tokenizer *t, const uint8_t *s, size_t len, bool first, int32_t **tokens,
                              size_t *n, size_t *cap) {
    static const uint8_t meta[3] = {0xE2, 0x96, 0x81}; /* U+2581 */
    bool starts_meta = s[0] == ' ' || (len >= 3 && memcmp(s, meta, 3) == 0);
    bool pre = t->sp_prepend_always || (!starts_meta && (t->sp_meta == 2 || (t->sp_meta == 1 && first)));
    pt_bpe_reserve((void **)&t->norm, &t->norm_cap, len + 1, 1);
    uint8_t *o = t->norm;
    size_t k = 0;
    if (pre) o[k++] = ' ';
    for (size_t i = 0; i < len;) {
        if (s[i] == meta[0] && i + 2 < len && s[i + 1] == meta[1] && s[i + 2] == meta[2]) {
            o[k++] = ' ';
            i += 3;
        } else {
            o[k++] = s[i++];
        }
    }
    if (t->sp_ignore_section) {
        const bmap_entry *e = pt_bmap_get(&t->vocab, o, k, pt_bpe_hash(o, k));
        if (e) {
            pt_bpe_append(tokens, n, cap, t->vocab.vals + e->val_off, 1);
            return;
        }
    }
    if (!t->sp_split && !t->sp_words) {
        pt_bpe_encode_piece(t, o, k, tokens, n, cap);
        return;
    }
    size_t start = 0;
    for (size_t i = 1; i < k; i++) {
        if (o[i] == ' ' && (t->sp_split || o[i - 1] != ' ')) {
            pt_bpe_encode_piece(t, o + start, i - start, tokens, n, cap);
            start = i;
        }
    }
    pt_bpe_encode_piece(t, o + start, k - start, tokens, n, cap);
}

/* One section of text between added tokens, at byte `off` of the text; `first`: it starts the
 * text; `exact`: the text's offsets are the input's (it was valid UTF-8). */
static pt_status encode_section(pt_tokenizer *t, const uint8_t *s, size_t len, bool first, size_t off,
                                bool exact, int32_t **tokens, size_t *n, size_t *cap) {
    if (len == 0) return PT_OK;
    bool ascii = true;
    for (size_t i = 0; i < len && ascii; i++) ascii = s[i] < 0x80;
    int err = 0;
    const uint8_t *at = NULL;
    utf8proc_uint8_t *norm = NULL;
    if (t->nfc && !ascii) {
        utf8proc_ssize_t nl = utf8proc_map(s, (utf8proc_ssize_t)len, &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        PT_ASSERTF(nl >= 0, "utf8proc_map on valid UTF-8 failed: %s", utf8proc_errmsg(nl));
        s = norm;
        len = (size_t)nl;
    }
    if (t->sp)
        sp_encode_section(t, s, len, first, tokens, n, cap);
    else
        err = split_piece(t, 0, s, len, tokens, n, cap, &at);
    size_t where = err ? off + (size_t)(at - s) : 0; /* (NFC or replaced UTF-8 moves it a little) */
    exact = exact && !norm;
    free(norm);
    if (!err) return PT_OK;
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return pt_errorf(PT_ERR_RUNTIME, "the pre-tokenizer regex failed on a search from %sbyte %zu: %s",
                     exact ? "" : "about ", where, (const char *)msg);
}

/* The WHATWG UTF-8 decoder's output, re-encoded: every maximal invalid subsequence becomes
 * EF BF BD. Returns s itself when it is valid, else t->text. */
static const uint8_t *replace_invalid(pt_tokenizer *t, const uint8_t *s, size_t len, size_t *out_len) {
    size_t i = 0;
    while (i < len) {
        size_t k;
        if (pt_utf8_decode(s, len, i, &k) == UINT32_MAX) break;
        i += k;
    }
    *out_len = len;
    if (i == len) return s;
    pt_bpe_reserve((void **)&t->text, &t->text_cap, 3 * len, 1); /* at most one U+FFFD per byte */
    uint8_t *o = t->text;
    memcpy(o, s, i);
    size_t k = i;
    while (i < len) {
        uint8_t b = s[i];
        size_t need = 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (b < 0x80) {
            o[k++] = b;
            i++;
            continue;
        }
        if (b >= 0xC2 && b <= 0xDF) need = 1;
        else if (b >= 0xE0 && b <= 0xEF) {
            need = 2;
            if (b == 0xE0) lo = 0xA0;
            if (b == 0xED) hi = 0x9F;
        } else if (b >= 0xF0 && b <= 0xF4) {
            need = 3;
            if (b == 0xF0) lo = 0x90;
            if (b == 0xF4) hi = 0x8F;
        }
        size_t seen = 0;
        if (need) { /* the first continuation byte has its own bounds, the others 80..BF */
            while (seen < need && i + 1 + seen < len) {
                uint8_t c = s[i + 1 + seen];
                if (c < (seen ? 0x80 : lo) || c > (seen ? 0xBF : hi)) break;
                seen++;
            }
        }
        if (need && seen == need) {
            memcpy(o + k, s + i, need + 1);
            k += need + 1;
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3);
            k += 3;
        }
        i += need && seen == need ? need + 1 : 1 + seen; /* a bad byte is read again as a start */
    }
    *out_len = k;
    return t->text;
}

static pt_status json_encode(pt_tokenizer *t, const char *text, size_t len, int32_t **tokens,
                             size_t *n, size_t *cap) {
    size_t sl;
    const uint8_t *s = replace_invalid(t, (const uint8_t *)text, len, &sl);
    bool exact = s == (const uint8_t *)text;
    size_t start = 0;
    for (size_t i = 0; i < sl;) {
        int32_t lo = t->added_first[s[i]], hi = t->added_first[s[i] + 1];
        const pt_tok_added *hit = NULL;
        for (int32_t j = lo; j < hi && !hit; j++) {
            const pt_tok_added *a = &t->added[j];
            if (a->len <= sl - i && memcmp(s + i, a->bytes, a->len) == 0) hit = a;
        }
        if (!hit) {
            i++;
            continue;
        }
        PT_TRY(encode_section(t, s + start, i - start, start == 0, start, exact, tokens, n, cap));
        pt_bpe_append(tokens, n, cap, &hit->id, 1);
        i += hit->len;
        start = i;
    }
    return encode_section(t, s + start, sl - start, start == 0, start, exact, tokens, n, cap);
}

static void json_free(pt_tokenizer *t) {
    for (int k = 0; k < t->n_stages; k++) {
        pcre2_match_data_free(t->stages[k].match);
        pcre2_match_context_free(t->stages[k].context);
        pcre2_jit_stack_free(t->stages[k].stack);
        pcre2_code_free(t->stages[k].code);
    }
    for (int i = 0; i < t->n_added; i++) free(t->added[i].bytes);
    free(t->added);
    free(t->text);
    free(t->norm);
    pt_bmap_free(&t->vocab);
}

/* ---- loading: the shared part ---- */

typedef struct {
    uint8_t *bytes; /* every token's bytes, by id */
    uint32_t *off;  /* bytes of id i: bytes[off[i] .. off[i] + len[i]) */
    uint32_t *len;
    bool *set;
    size_t n, cap_ids, used, cap_bytes;
    size_t count; /* the tokens the file gives (ids are below count + PT_TOK_ID_GAP) */
} tok_table;

/* The tables are indexed by id: an id may exceed the count of tokens the file gives by this much
 * (gaps), not more, so that one sparse id cannot size them by gigabytes. */
enum { PT_TOK_ID_GAP = 1 << 20 };

static pt_status table_set(tok_table *tt, const char *where, int64_t id, const uint8_t *b, size_t len) {
    if (id < 0 || id >= INT32_MAX - 1)
        return pt_errorf(PT_ERR_FORMAT, "%s: id %lld is out of range", where, (long long)id);
    if ((uint64_t)id >= (uint64_t)tt->count + PT_TOK_ID_GAP)
        return pt_errorf(PT_ERR_FORMAT, "%s: id %lld is far beyond the %zu tokens the file gives (ids "
                         "must be below %zu: the tables are indexed by id)", where, (long long)id,
                         tt->count, tt->count + PT_TOK_ID_GAP);
    if ((size_t)id >= tt->cap_ids) {
        size_t c = tt->cap_ids ? tt->cap_ids : 1024;
        while (c <= (size_t)id) c *= 2;
        tt->off = realloc(tt->off, c * sizeof *tt->off);
        tt->len = realloc(tt->len, c * sizeof *tt->len);
        tt->set = realloc(tt->set, c * sizeof *tt->set);
        PT_ASSERTF(tt->off && tt->len && tt->set, "out of memory for %zu tokens", c);
        memset(tt->set + tt->cap_ids, 0, (c - tt->cap_ids) * sizeof *tt->set);
        tt->cap_ids = c;
    }
    if (tt->set[id]) return pt_errorf(PT_ERR_FORMAT, "%s: id %lld is given twice", where, (long long)id);
    if (tt->used + len > UINT32_MAX) return pt_errorf(PT_ERR_FORMAT, "%s: tokens too long in total", where);
    pt_bpe_reserve((void **)&tt->bytes, &tt->cap_bytes, tt->used + len, 1);
    if (len) memcpy(tt->bytes + tt->used, b, len); /* an empty first token: tt->bytes is NULL */
    tt->off[id] = (uint32_t)tt->used;
    tt->len[id] = (uint32_t)len;
    tt->set[id] = true;
    tt->used += len;
    if ((size_t)id + 1 > tt->n) tt->n = (size_t)id + 1;
    return PT_OK;
}

static void table_free(tok_table *tt) {
    free(tt->bytes);
    free(tt->off);
    free(tt->len);
    free(tt->set);
}

/* Lays the table out as the tokenizer's id -> bytes (ids never given decode to nothing). */
static void table_install(pt_tokenizer *t, const tok_table *tt) {
    t->nvocab = (int32_t)tt->n;
    t->tok_off = pt_malloc((tt->n + 1) * sizeof *t->tok_off);
    t->tok_bytes = pt_malloc(tt->used ? tt->used : 1);
    uint32_t o = 0;
    for (size_t i = 0; i < tt->n; i++) {
        t->tok_off[i] = o;
        if (tt->set[i]) {
            memcpy(t->tok_bytes + o, tt->bytes + tt->off[i], tt->len[i]);
            o += tt->len[i];
        }
    }
    t->tok_off[tt->n] = o;
}

static int cmp_added(const void *x, const void *y) {
    const pt_tok_added *a = x, *b = y;
    uint8_t fa = a->len ? (uint8_t)a->bytes[0] : 0, fb = b->len ? (uint8_t)b->bytes[0] : 0;
    if (fa != fb) return fa < fb ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1; /* longest first */
    return a->id < b->id ? -1 : a->id > b->id;
}

static void added_push(pt_tokenizer *t, size_t *cap, const char *text, size_t len, int32_t id) {
    pt_bpe_reserve((void **)&t->added, cap, (size_t)t->n_added + 1, sizeof *t->added);
    pt_tok_added *a = &t->added[t->n_added++];
    a->bytes = pt_malloc(len + 1);
    memcpy(a->bytes, text, len);
    a->bytes[len] = 0;
    a->len = len;
    a->id = id;
}

static void added_index(pt_tokenizer *t) {
    /* no added tokens: t->added is NULL, which qsort must not be given even with 0 elements */
    if (t->n_added) qsort(t->added, (size_t)t->n_added, sizeof *t->added, cmp_added);
    int32_t j = 0;
    for (int b = 0; b < 256; b++) {
        t->added_first[b] = j;
        while (j < t->n_added && (uint8_t)t->added[j].bytes[0] == b) j++;
    }
    t->added_first[256] = j;
}

/* Single bytes and the vocabulary map from the id table (every byte must have a token). */
static pt_status vocab_index(pt_tokenizer *t, const char *path) {
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->nvocab; id++) {
        const uint8_t *s = t->tok_bytes + t->tok_off[id];
        uint32_t len = t->tok_off[id + 1] - t->tok_off[id];
        if (len == 0) continue;
        uint64_t h = pt_bpe_hash(s, len);
        if (!pt_bmap_get(&t->vocab, s, len, h)) pt_bmap_put(&t->vocab, s, len, h, &id, 1);
        if (len == 1 && t->byte_id[s[0]] < 0) t->byte_id[s[0]] = id;
    }
    for (int b = 0; b < 256; b++)
        if (t->byte_id[b] < 0)
            return pt_errorf(PT_ERR_FORMAT, "%s: byte 0x%02x has no token (not a byte-level BPE)", path, b);
    return PT_OK;
}

static int32_t vocab_id(const pt_tokenizer *t, const uint8_t *s, size_t len) {
    const bmap_entry *e = pt_bmap_get(&t->vocab, s, len, pt_bpe_hash(s, len));
    return e ? t->vocab.vals[e->val_off] : -1;
}

/* SentencePiece-style: the <0xNN> tokens, the unknown token, and whether words can merge alone
 * (sp_encode_section): no key has a space right after a non-space. */
static pt_status sp_index(pt_tokenizer *t, const char *path, const json_t *model) {
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_fb[b] = vocab_id(t, (const uint8_t *)name, 6);
    }
    t->unk = -1;
    const json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) {
        const char *u = json_string_value(unk);
        t->unk = strchr(u, ' ') ? -1 : vocab_id(t, (const uint8_t *)u, strlen(u));
        if (t->unk < 0) return pt_errorf(PT_ERR_FORMAT, "%s: model.unk_token \"%s\" is not in model.vocab", path, u);
    } else if (unk && !json_is_null(unk)) {
        return pt_errorf(PT_ERR_FORMAT, "%s: model.unk_token is not a string", path);
    }
    t->sp_words = true;
    for (size_t i = 0; i < t->vocab.n && t->sp_words; i++) {
        const uint8_t *k = t->vocab.keys + t->vocab.ents[i].key_off;
        for (uint32_t j = 1; j < t->vocab.ents[i].key_len; j++)
            if (k[j] == ' ' && k[j - 1] != ' ') t->sp_words = false;
    }
    return PT_OK;
}

/* The default document separator: the first of these that is a token. */
static void default_separator(pt_tokenizer *t) {
    static const char *const names[] = {"<|begin_of_text|>", "<|endoftext|>", "<s>", "<|end_of_text|>", "</s>"};
    t->eot = -1;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && t->eot < 0; i++)
        t->eot = pt_tokenizer_token_id(t, names[i]);
}

/* ---- tokenizer.json ---- */

static const char *jtype(const json_t *o) {
    const char *s = json_string_value(json_object_get(o, "type"));
    return s ? s : "(no type)";
}

static bool jtrue(const json_t *o, const char *key) { return json_is_true(json_object_get(o, key)); }

#define PT_TOK_META "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* ' ' or "\u2581" ... for a message: the JSON string, or a stand-in when it is not one. */
static const char *jstr(const json_t *o, const char *key) {
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "(not a string)";
}

static pt_status load_normalizer(pt_tokenizer *t, const char *path, const json_t *n, bool *replace) {
    if (!n || json_is_null(n)) return PT_OK;
    const char *type = jtype(n);
    if (strcmp(type, "NFC") == 0) {
        t->nfc = true;
        return PT_OK;
    }
    if (t->sp && strcmp(type, "Prepend") == 0) {
        if (strcmp(jstr(n, "prepend"), PT_TOK_META) != 0)
            return pt_errorf(PT_ERR_FORMAT, "%s: normalizer Prepend of \"%s\" is not supported (only \"" PT_TOK_META "\")",
                             path, jstr(n, "prepend"));
        t->sp_prepend_always = true;
        return PT_OK;
    }
    if (t->sp && strcmp(type, "Replace") == 0) {
        const char *from = jstr(json_object_get(n, "pattern"), "String"), *to = jstr(n, "content");
        if (strcmp(from, " ") != 0 || strcmp(to, PT_TOK_META) != 0)
            return pt_errorf(PT_ERR_FORMAT, "%s: normalizer Replace of \"%s\" by \"%s\" is not supported (only the "
                             "String \" \" by \"" PT_TOK_META "\")", path, from, to);
        *replace = true;
        return PT_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(n, "normalizers");
        size_t i;
        const json_t *m;
        json_array_foreach(list, i, m) PT_TRY(load_normalizer(t, path, m, replace));
        return PT_OK;
    }
    return pt_errorf(PT_ERR_FORMAT, "%s: normalizer \"%s\" is not supported (supported: null, NFC%s, Sequence)",
                     path, type, t->sp ? ", Prepend, Replace" : "");
}

static pt_status load_byte_level(pt_tokenizer *t, const char *path, const json_t *p, bool *seen) {
    if (jtrue(p, "add_prefix_space"))
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer ByteLevel with add_prefix_space = true is not supported", path);
    *seen = true;
    const json_t *ur = json_object_get(p, "use_regex");
    if (!ur || json_is_true(ur)) return add_stage(t, PT_TOK_GPT2_PATTERN, path);
    return PT_OK;
}

static pt_status load_split(pt_tokenizer *t, const char *path, const json_t *p) {
    const char *beh = json_string_value(json_object_get(p, "behavior"));
    if (!beh || strcmp(beh, "Isolated") != 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Split with behavior \"%s\" is not supported (only Isolated)",
                         path, beh ? beh : "(none)");
    if (jtrue(p, "invert"))
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Split with invert = true is not supported", path);
    const json_t *pat = json_object_get(p, "pattern");
    const char *re = json_string_value(json_object_get(pat, "Regex"));
    if (!re) {
        if (json_string_value(json_object_get(pat, "String")))
            return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Split on a plain String is not supported (only Regex)", path);
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Split has no pattern.Regex", path);
    }
    return add_stage(t, re, path);
}

/* Metaspace: spaces become "\u2581" (done with the normalizer's, see sp_encode_section), one is
 * prepended by prepend_scheme (older files: add_prefix_space, true meaning always), and with split
 * every "\u2581" starts a piece (the Rust crate's default; tokenizers.js ignores split). */
static pt_status load_metaspace(pt_tokenizer *t, const char *path, const json_t *p) {
    if (strcmp(jstr(p, "replacement"), PT_TOK_META) != 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Metaspace with replacement \"%s\" is not supported (only \""
                         PT_TOK_META "\")", path, jstr(p, "replacement"));
    const json_t *scheme = json_object_get(p, "prepend_scheme");
    if (scheme) {
        static const char *const names[3] = {"never", "first", "always"};
        t->sp_meta = -1;
        for (int i = 0; i < 3; i++)
            if (strcmp(jstr(p, "prepend_scheme"), names[i]) == 0) t->sp_meta = i;
        if (t->sp_meta < 0)
            return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer Metaspace with prepend_scheme \"%s\" is not supported "
                             "(supported: always, first, never)", path, jstr(p, "prepend_scheme"));
    } else {
        const json_t *aps = json_object_get(p, "add_prefix_space");
        t->sp_meta = !aps || json_is_true(aps) ? 2 : 0;
    }
    const json_t *split = json_object_get(p, "split");
    t->sp_split = !split || json_is_true(split);
    return PT_OK;
}

static pt_status load_pre_tokenizer(pt_tokenizer *t, const char *path, const json_t *p) {
    bool byte_level = false;
    const char *type = jtype(p);
    if (t->sp) {
        if (!p || json_is_null(p)) return PT_OK;
        if (strcmp(type, "Metaspace") == 0) return load_metaspace(t, path, p);
        if (strcmp(type, "ByteLevel") == 0)
            return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer ByteLevel with model.byte_fallback = true is not supported "
                             "(byte fallback goes with SentencePiece-style BPE: no pre-tokenizer, or Metaspace)", path);
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer \"%s\" is not supported with SentencePiece-style BPE "
                         "(model.byte_fallback = true, or a normalizer or pre-tokenizer writing \"" PT_TOK_META "\"; "
                         "supported there: null, Metaspace)", path, type);
    }
    if (!p || json_is_null(p))
        return pt_errorf(PT_ERR_FORMAT, "%s: no pre_tokenizer (a byte-level BPE needs ByteLevel)", path);
    if (strcmp(type, "ByteLevel") == 0) {
        PT_TRY(load_byte_level(t, path, p, &byte_level));
    } else if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(p, "pretokenizers");
        if (!json_is_array(list)) return pt_errorf(PT_ERR_FORMAT, "%s: pre_tokenizer Sequence without pretokenizers", path);
        size_t i;
        const json_t *q;
        json_array_foreach(list, i, q) {
            const char *qt = jtype(q);
            if (byte_level)
                return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer %s after ByteLevel is not supported", path, qt);
            if (strcmp(qt, "Split") == 0)
                PT_TRY(load_split(t, path, q));
            else if (strcmp(qt, "ByteLevel") == 0)
                PT_TRY(load_byte_level(t, path, q, &byte_level));
            else
                return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer \"%s\" is not supported (supported: ByteLevel, Split)",
                                 path, qt);
        }
    } else {
        return pt_errorf(PT_ERR_FORMAT, "%s: pre-tokenizer \"%s\" is not supported (supported: ByteLevel, "
                         "Sequence of Split and ByteLevel)", path, type);
    }
    if (!byte_level)
        return pt_errorf(PT_ERR_FORMAT, "%s: the pre-tokenizer has no ByteLevel step (only byte-level BPE is supported)", path);
    return PT_OK;
}

/* The decoder does not change encoding; only the known ones are accepted, so that a file meant for
 * something else is not taken silently. (pt_tokenizer_decode gives each token's bytes, with ' ' for
 * "\u2581" and <0xNN> as its byte for SentencePiece-style files.) */
static pt_status load_decoder(const pt_tokenizer *t, const char *path, const json_t *d) {
    if (!d || json_is_null(d)) return PT_OK;
    const char *type = jtype(d);
    if (!t->sp) {
        if (strcmp(type, "ByteLevel") == 0) return PT_OK;
        return pt_errorf(PT_ERR_FORMAT, "%s: decoder \"%s\" is not supported (supported: ByteLevel)", path, type);
    }
    static const char *const known[] = {"Metaspace", "Replace", "ByteFallback", "Fuse", "Strip"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (strcmp(type, known[i]) == 0) return PT_OK;
    if (strcmp(type, "Sequence") == 0) {
        size_t i;
        const json_t *q;
        json_array_foreach(json_object_get(d, "decoders"), i, q) PT_TRY(load_decoder(t, path, q));
        return PT_OK;
    }
    return pt_errorf(PT_ERR_FORMAT, "%s: decoder \"%s\" is not supported with SentencePiece-style BPE (supported: "
                     "Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)", path, type);
}

/* A token's text as t->vocab keys it: byte-level text -> its bytes; SentencePiece-style text -> the
 * same with ' ' for "\u2581". Into out (capacity >= len); the length, or -1. */
static long token_key(const pt_tokenizer *t, const int16_t dec[324], const char *s, size_t len, uint8_t *out) {
    if (!t->sp) return pt_bpe_unicode_to_bytes(dec, s, len, out);
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        if (i + 2 < len && memcmp(s + i, PT_TOK_META, 3) == 0) {
            out[k++] = ' ';
            i += 3;
        } else {
            out[k++] = (uint8_t)s[i++];
        }
    }
    return (long)k;
}

/* "<0xNN>" (two upper-case hex digits, as the Rust crate writes them): the byte, or -1. */
static int byte_token(const char *s, size_t len) {
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
        else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
        else return -1;
    }
    return v;
}

/* One merge's part, byte-level text -> its id. */
static int32_t merge_part(pt_tokenizer *t, const int16_t dec[324], const char *s, size_t len, uint8_t *scratch) {
    long bl = token_key(t, dec, s, len, scratch);
    return bl > 0 ? vocab_id(t, scratch, (size_t)bl) : -1;
}

static pt_status load_merges_json(pt_tokenizer *t, const char *path, const json_t *merges, const int16_t dec[324]) {
    if (!json_is_array(merges)) return pt_errorf(PT_ERR_FORMAT, "%s: model.merges is missing or not a list", path);
    size_t nm = json_array_size(merges);
    if (nm > INT32_MAX) return pt_errorf(PT_ERR_FORMAT, "%s: too many merges", path);
    pt_bpe_merges_init(t, nm);
    uint8_t *scratch = NULL;
    size_t scap = 0;
    pt_status st = PT_OK;
    for (size_t m = 0; m < nm && st == PT_OK; m++) {
        const json_t *e = json_array_get(merges, m);
        const char *a = NULL, *b = NULL;
        size_t al = 0, bl = 0;
        if (json_is_string(e)) { /* "a b" */
            const char *s = json_string_value(e);
            const char *sp = strchr(s, ' ');
            if (sp && !strchr(sp + 1, ' ')) {
                a = s;
                al = (size_t)(sp - s);
                b = sp + 1;
                bl = strlen(b);
            }
        } else if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
                   json_is_string(json_array_get(e, 1))) { /* ["a", "b"] */
            a = json_string_value(json_array_get(e, 0));
            al = json_string_length(json_array_get(e, 0));
            b = json_string_value(json_array_get(e, 1));
            bl = json_string_length(json_array_get(e, 1));
        }
        if (!a || !al || !bl) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]", path, m);
            break;
        }
        pt_bpe_reserve((void **)&scratch, &scap, al + bl + 1, 1);
        int32_t ia = merge_part(t, dec, a, al, scratch), ib = merge_part(t, dec, b, bl, scratch);
        long na = token_key(t, dec, a, al, scratch);
        long nb = na > 0 ? token_key(t, dec, b, bl, scratch + na) : -1;
        int32_t iab = nb > 0 ? vocab_id(t, scratch, (size_t)(na + nb)) : -1;
        if (ia < 0 || ib < 0 || iab < 0) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: model.merges[%zu] (\"%.*s\" + \"%.*s\"): %s is not in model.vocab",
                           path, m, (int)al, a, (int)bl, b, ia < 0 ? "the first part" : ib < 0 ? "the second part" : "the merged token");
            break;
        }
        pt_bpe_merge_set(t, ia, ib, (int32_t)m, iab);
    }
    free(scratch);
    return st;
}

/* One SentencePiece-style vocabulary entry: its bytes for decoding (' ' for "\u2581", <0xNN> as its
 * byte) and its key in t->vocab. A token holding a real space is kept for decoding only: the
 * normalised text has no spaces, so the references never produce it either. */
static pt_status sp_vocab_entry(pt_tokenizer *t, const char *path, const char *text, const json_t *val,
                                tok_table *tt, uint8_t **buf, size_t *cap) {
    if (!json_is_integer(val))
        return pt_errorf(PT_ERR_FORMAT, "%s: model.vocab token \"%s\": the id is not an integer", path, text);
    size_t len = strlen(text);
    pt_bpe_reserve((void **)buf, cap, len + 1, 1);
    long kl = token_key(t, NULL, text, len, *buf);
    int b = byte_token(text, len);
    uint8_t byte = (uint8_t)b;
    PT_TRY(table_set(tt, path, json_integer_value(val), b >= 0 ? &byte : *buf, b >= 0 ? 1 : (size_t)kl));
    if (kl == 0 || memchr(text, ' ', len)) return PT_OK;
    int32_t id = (int32_t)json_integer_value(val);
    uint64_t h = pt_bpe_hash(*buf, (size_t)kl);
    if (!pt_bmap_get(&t->vocab, *buf, (size_t)kl, h)) pt_bmap_put(&t->vocab, *buf, (size_t)kl, h, &id, 1);
    return PT_OK;
}

static pt_status load_model(pt_tokenizer *t, const char *path, const json_t *model, tok_table *tt,
                            const int16_t dec[324]) {
    if (!json_is_object(model)) return pt_errorf(PT_ERR_FORMAT, "%s: no \"model\" object", path);
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: model type \"%s\" is not supported (supported: BPE)", path, type);
    t->byte_fallback = jtrue(model, "byte_fallback");
    t->fuse_unk = jtrue(model, "fuse_unk");
    const json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: model.dropout > 0 is not supported", path);
    const char *keys[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const char *v = json_string_value(json_object_get(model, keys[i]));
        if (v && *v) return pt_errorf(PT_ERR_FORMAT, "%s: model.%s \"%s\" is not supported", path, keys[i], v);
    }
    t->ignore_merges = jtrue(model, "ignore_merges");
    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab) || json_object_size(vocab) == 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: model.vocab is missing or empty", path);
    uint8_t *buf = NULL;
    size_t cap = 0;
    const char *key;
    const json_t *val;
    pt_status st = PT_OK;
    json_object_foreach((json_t *)vocab, key, val) {
        if (t->sp) {
            st = sp_vocab_entry(t, path, key, val, tt, &buf, &cap);
            if (st != PT_OK) break;
            continue;
        }
        long bl = pt_bpe_token_bytes(dec, key, &buf, &cap);
        if (bl <= 0) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: model.vocab token \"%s\" is not byte-level BPE text", path, key);
            break;
        }
        if (!json_is_integer(val)) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: model.vocab token \"%s\": the id is not an integer", path, key);
            break;
        }
        st = table_set(tt, path, json_integer_value(val), buf, (size_t)bl);
        if (st != PT_OK) break;
    }
    free(buf);
    return st;
}

/* normalized: the SentencePiece-style normalizer is not null; an added token with normalized = true
 * is then matched in the normalised text, which is not supported. */
static pt_status load_added(pt_tokenizer *t, const char *path, const json_t *added, tok_table *tt, bool normalized) {
    if (!added || json_is_null(added)) return PT_OK;
    if (!json_is_array(added)) return pt_errorf(PT_ERR_FORMAT, "%s: added_tokens is not a list", path);
    size_t i, cap = 0;
    const json_t *a;
    json_array_foreach(added, i, a) {
        const json_t *c = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(c) || json_string_length(c) == 0 || !json_is_integer(id))
            return pt_errorf(PT_ERR_FORMAT, "%s: added_tokens[%zu] needs a non-empty content and an integer id", path, i);
        const char *opts[] = {"lstrip", "rstrip", "single_word"};
        for (int k = 0; k < 3; k++)
            if (jtrue(a, opts[k]))
                return pt_errorf(PT_ERR_FORMAT, "%s: added token \"%s\": %s = true is not supported", path,
                                 json_string_value(c), opts[k]);
        if (normalized && jtrue(a, "normalized"))
            return pt_errorf(PT_ERR_FORMAT, "%s: added token \"%s\": normalized = true with a SentencePiece-style "
                             "normalizer is not supported", path, json_string_value(c));
        json_int_t v = json_integer_value(id);
        size_t len = json_string_length(c);
        /* an added token may repeat a vocabulary entry (GPT-2's <|endoftext|>): same id, same text */
        bool in_vocab = v >= 0 && (size_t)v < tt->n && tt->set[v];
        if (in_vocab && !(tt->len[v] == len && memcmp(tt->bytes + tt->off[v], json_string_value(c), len) == 0))
            return pt_errorf(PT_ERR_FORMAT, "%s: added token \"%s\" has id %lld, which model.vocab gives to another token",
                             path, json_string_value(c), (long long)v);
        if (!in_vocab) PT_TRY(table_set(tt, path, v, (const uint8_t *)json_string_value(c), len));
        added_push(t, &cap, json_string_value(c), len, (int32_t)v);
    }
    return PT_OK;
}

static bool writes_meta(const json_t *n) {
    const char *type = jtype(n);
    if (strcmp(type, "Prepend") == 0 || strcmp(type, "Replace") == 0) return true;
    size_t i;
    const json_t *m;
    if (strcmp(type, "Sequence") == 0) json_array_foreach(json_object_get(n, "normalizers"), i, m) if (writes_meta(m)) return true;
    return false;
}

/* SentencePiece-style BPE (Llama 2, Mistral): byte fallback, a Metaspace pre-tokenizer, or a
 * normalizer that writes "\u2581" (Prepend, Replace). */
static bool is_sentencepiece(const json_t *root) {
    const json_t *p = json_object_get(root, "pre_tokenizer"), *n = json_object_get(root, "normalizer");
    return jtrue(json_object_get(root, "model"), "byte_fallback") || strcmp(jtype(p), "Metaspace") == 0 ||
           (json_is_object(n) && writes_meta(n));
}

static pt_status load_tokenizer_json(pt_tokenizer *t, const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    json_error_t jerr;
    json_t *root = json_loadf(f, 0, &jerr);
    fclose(f);
    if (!root) return pt_errorf(PT_ERR_FORMAT, "%s:%d: not valid JSON: %s", path, jerr.line, jerr.text);
    int16_t dec[324];
    pt_bpe_byte_decoder(dec);
    tok_table tt = {0};
    t->source = PT_TOK_SOURCE_JSON;
    pt_status st = json_is_object(root) ? PT_OK : pt_errorf(PT_ERR_FORMAT, "%s: not a JSON object", path);
    bool replace = false;
    t->sp_meta = -1;
    if (st == PT_OK) {
        t->sp = is_sentencepiece(root);
        st = load_normalizer(t, path, json_object_get(root, "normalizer"), &replace);
    }
    if (st == PT_OK) st = load_pre_tokenizer(t, path, json_object_get(root, "pre_tokenizer"));
    if (st == PT_OK && t->sp && !replace && t->sp_meta < 0)
        st = pt_errorf(PT_ERR_FORMAT, "%s: SentencePiece-style BPE without the normalizer Replace \" \" by \"" PT_TOK_META
                       "\" or the pre-tokenizer Metaspace (spaces would stay spaces) is not supported", path);
    if (st == PT_OK) st = load_decoder(t, path, json_object_get(root, "decoder"));
    if (st == PT_OK) {
        const json_t *added = json_object_get(root, "added_tokens");
        tt.count = json_object_size(json_object_get(json_object_get(root, "model"), "vocab")) +
                   (json_is_array(added) ? json_array_size(added) : 0);
        st = load_model(t, path, json_object_get(root, "model"), &tt, dec);
    }
    if (st == PT_OK) {
        /* the vocabulary alone first: merges name only its tokens */
        table_install(t, &tt);
        st = t->sp ? sp_index(t, path, json_object_get(root, "model")) : vocab_index(t, path);
    }
    if (t->sp && !t->sp_split) { /* without a splitting pre-tokenizer the section is the word */
        t->sp_ignore_section = t->ignore_merges;
        t->ignore_merges = false;
    }
    if (st == PT_OK) st = load_merges_json(t, path, json_object_get(json_object_get(root, "model"), "merges"), dec);
    if (st == PT_OK) {
        const json_t *norm = json_object_get(root, "normalizer");
        st = load_added(t, path, json_object_get(root, "added_tokens"), &tt, t->sp && norm && !json_is_null(norm));
    }
    if (st == PT_OK) {
        free(t->tok_off);
        free(t->tok_bytes);
        table_install(t, &tt);
        added_index(t);
    }
    table_free(&tt);
    json_decref(root);
    t->heap_ok = true;
    return st;
}

/* ---- tiktoken ---- */

static int b64_value(uint8_t c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

/* Decodes standard base64 (with '=' padding) into out; the byte count, or -1. */
static long b64_decode(const char *s, size_t n, uint8_t *out) {
    if (n == 0 || n % 4) return -1;
    size_t k = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = s[i + j] == '=' ? -2 : b64_value((uint8_t)s[i + j]);
            if (v[j] == -1 || (v[j] == -2 && (i + 4 < n || j < 2))) return -1;
        }
        if (v[2] == -2 && v[3] != -2) return -1;
        out[k++] = (uint8_t)(v[0] << 2 | v[1] >> 4);
        if (v[2] >= 0) out[k++] = (uint8_t)((v[1] & 15) << 4 | v[2] >> 2);
        if (v[3] >= 0) out[k++] = (uint8_t)((v[2] & 3) << 6 | v[3]);
    }
    return (long)k;
}

static pt_status load_tiktoken(pt_tokenizer *t, const char *path) {
    char *data;
    size_t len;
    PT_TRY(pt_read_file(path, &data, &len));
    t->source = PT_TOK_SOURCE_TIKTOKEN;
    tok_table tt = {0};
    for (size_t i = 0; i < len; i++) tt.count += data[i] == '\n'; /* the ranks, and the specials */
    tt.count += 1 + sizeof PT_TOK_CL100K_SPECIAL / sizeof PT_TOK_CL100K_SPECIAL[0];
    pt_status st = PT_OK;
    size_t line = 0;
    uint8_t buf[1024];
    for (size_t i = 0; i < len && st == PT_OK; line++) {
        char *end = memchr(data + i, '\n', len - i);
        size_t e = end ? (size_t)(end - data) : len;
        char *sp = memchr(data + i, ' ', e - i);
        long bl = -1;
        char *rend = NULL;
        long long rank = -1;
        if (sp && (size_t)(sp - data - i) <= 4 * sizeof buf / 3) {
            bl = b64_decode(data + i, (size_t)(sp - data - i), buf);
            errno = 0;
            rank = strtoll(sp + 1, &rend, 10);
        }
        if (bl <= 0 || rend != data + e || errno || rank < 0 || sp + 1 == rend)
            st = pt_errorf(PT_ERR_FORMAT, "%s:%zu: expected \"BASE64 RANK\"", path, line + 1);
        else
            st = table_set(&tt, path, rank, buf, (size_t)bl);
        i = e + 1;
    }
    free(data);
    if (st == PT_OK && tt.n != 100256)
        st = pt_errorf(PT_ERR_FORMAT, "%s: %zu ranks; only cl100k_base (100256 ranks) is supported, as the file "
                       "holds neither the pattern nor the special tokens", path, tt.n);
    for (size_t i = 0; i < tt.n && st == PT_OK; i++)
        if (!tt.set[i]) st = pt_errorf(PT_ERR_FORMAT, "%s: rank %zu is missing", path, i);
    if (st == PT_OK) {
        size_t cap = 0;
        for (size_t i = 0; i < sizeof PT_TOK_CL100K_SPECIAL / sizeof PT_TOK_CL100K_SPECIAL[0] && st == PT_OK; i++) {
            const char *s = PT_TOK_CL100K_SPECIAL[i].text;
            st = table_set(&tt, path, PT_TOK_CL100K_SPECIAL[i].id, (const uint8_t *)s, strlen(s));
            added_push(t, &cap, s, strlen(s), PT_TOK_CL100K_SPECIAL[i].id);
        }
    }
    if (st == PT_OK) {
        table_install(t, &tt);
        added_index(t);
        st = vocab_index(t, path);
    }
    if (st == PT_OK) {
        /* tiktoken merges the adjacent pair whose joined bytes have the lowest rank: every split of
         * a token into two tokens is a merge of that token's rank */
        pt_bpe_merges_init(t, 4 * tt.n);
        for (int32_t id = 0; id < (int32_t)tt.n; id++) {
            const uint8_t *s = t->tok_bytes + t->tok_off[id];
            uint32_t l = t->tok_off[id + 1] - t->tok_off[id];
            if (id >= 100256) break;
            for (uint32_t c = 1; c < l; c++) {
                int32_t a = vocab_id(t, s, c), b = vocab_id(t, s + c, l - c);
                if (a >= 0 && b >= 0) pt_bpe_merge_set(t, a, b, id, id);
            }
        }
        t->ignore_merges = true;
        t->heap_ok = true;
        st = add_stage(t, PT_TOK_CL100K_PATTERN, path);
    }
    table_free(&tt);
    return st;
}

/* ---- the public entry points ---- */

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

pt_status pt_tokenizer_open(pt_tokenizer **out, const char *path) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char file[4096];
    if (S_ISDIR(sb.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (access(file, F_OK) != 0) return pt_tokenizer_load(out, path); /* GPT-2's two files */
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    pt_tokenizer *t = pt_calloc(1, sizeof *t);
    t->encode_text = json_encode;
    t->free_parts = json_free;
    pt_status st = ends_with(file, ".tiktoken") ? load_tiktoken(t, file) : load_tokenizer_json(t, file);
    if (st == PT_OK) default_separator(t);
    if (st != PT_OK) {
        pt_tokenizer_free(t);
        return st;
    }
    *out = t;
    return PT_OK;
}

int32_t pt_tokenizer_token_id(const pt_tokenizer *t, const char *text) {
    size_t len = strlen(text);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].len == len && memcmp(t->added[i].bytes, text, len) == 0) return t->added[i].id;
    if (t->source == PT_TOK_SOURCE_GPT2) {
        for (int32_t id = 0; id < t->nvocab; id++)
            if (t->tok_off[id + 1] - t->tok_off[id] == len && memcmp(t->tok_bytes + t->tok_off[id], text, len) == 0)
                return id;
        return -1;
    }
    return len ? vocab_id(t, (const uint8_t *)text, len) : -1;
}

pt_status pt_tokenizer_set_eot(pt_tokenizer *t, const char *text) {
    int32_t id = pt_tokenizer_token_id(t, text);
    if (id < 0) return pt_errorf(PT_ERR_CONFIG, "separator \"%s\" is not a token of this tokenizer", text);
    t->eot = id;
    return PT_OK;
}
