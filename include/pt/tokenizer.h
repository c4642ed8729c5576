/* tokenizer.h: BPE tokenizers: GPT-2's byte-level BPE (below), and through pt_tokenizer_open the
 * Hugging Face tokenizer.json kinds and tiktoken files of src/data/tokenizer_json.c.
 *
 * Token-for-token the same as the reference JS encoder (npm gpt-3-encoder, Encoder.js) on valid
 * UTF-8, including its quirks: text is split by the GPT-2 pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * with JS semantics (JS \s, node's Unicode tables, see src/data/unicode_tables.c), and each piece is
 * merged by the ranks in vocab.bpe. Encoder.js looks merge pairs up by the string "a,b", so a pair
 * whose pieces contain a comma can take the rank of another merge with the same joined string
 * (11 such aliases in the GPT-2 vocabulary, e.g. ('",', '"') ranks as ('"', ',"')); we reproduce
 * that, though no text we tried reaches an alias that changes the result.
 *
 * Bytes that are not valid UTF-8 (RFC 3629: no overlongs, surrogates or code points above
 * U+10FFFF) are kept as they are, one byte at a time, and classed like the U+FFFD that the
 * reference's UTF-8 decoding would put in their place (neither letter, number nor space). The
 * pieces therefore split at the same places as the reference's, and decode(encode(x)) == x for
 * every byte string; only the bytes inside such pieces differ from the reference (raw vs EF BF BD).
 *
 * "<|endoftext|>" in the text is encoded as ordinary text, as the reference does; the end-of-text
 * token is added by the caller (pt_tokenizer_eot).
 *
 * A tokenizer caches the merges of the pieces it has seen, so encoding mutates it: use one per
 * thread.
 */
#ifndef PT_TOKENIZER_H
#define PT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "pt/core.h"

typedef struct pt_tokenizer pt_tokenizer;

/* Reads DIR/encoder.json (token -> id) and DIR/vocab.bpe (merges, best first). */
pt_status pt_tokenizer_load(pt_tokenizer **out, const char *dir);

/* Opens any supported tokenizer (src/data/tokenizer_json.c):
 *  - a Hugging Face tokenizer.json (or a directory holding one) with a byte-level BPE model:
 *    normalizer null or NFC (utf8proc); pre-tokenizer ByteLevel, or a Sequence of Split(Regex,
 *    behavior Isolated) steps and ByteLevel (Llama 3, Qwen 2/3, GPT-2); merges as "a b" or
 *    ["a", "b"]; model.ignore_merges; added tokens, matched in the text before anything else
 *    (leftmost, then longest); decoder ByteLevel. Anything else is refused with a message
 *    naming it. The regexes run on PCRE2 with Oniguruma's meanings (see tokenizer_json.c).
 *  - a tokenizer.json with a SentencePiece-style BPE model (Llama 2, Mistral): model.byte_fallback
 *    (<0xNN> tokens), unk_token, fuse_unk, ignore_merges; the normalizer a Sequence of Prepend
 *    "\u2581" and Replace " " -> "\u2581" (NFC allowed beside them) with no pre-tokenizer, or the
 *    pre-tokenizer Metaspace (replacement "\u2581", prepend_scheme always/first/never or the older
 *    add_prefix_space, split true/false); decoders Metaspace, Replace, ByteFallback, Fuse, Strip and
 *    Sequence (ignored: they do not change encoding); added tokens with normalized = false. Any other
 *    normalizer or pre-tokenizer is refused with a message naming it. Decoding gives ' ' for
 *    "\u2581" (the prepended one included) and each <0xNN> as its byte.
 *  - a tiktoken ranks file (NAME.tiktoken: base64 token and rank per line) of cl100k_base, with
 *    cl100k_base's pattern and special tokens (the file holds neither);
 *  - a directory holding GPT-2's encoder.json and vocab.bpe (pt_tokenizer_load).
 * Text given to the first two is first decoded as the WHATWG decoder (Node's TextDecoder) does,
 * each maximal invalid UTF-8 subsequence becoming U+FFFD: references take strings, and this is the
 * string they get. The separator (pt_tokenizer_eot) defaults to the first token among
 * <|begin_of_text|> (Llama 3), <|endoftext|> (GPT-2, Qwen, tiktoken), <s>, <|end_of_text|>, </s>;
 * -1 if none is a token. */
pt_status pt_tokenizer_open(pt_tokenizer **out, const char *path);
/* The id of the token whose text is `text` (an added token or a vocabulary entry), or -1. */
int32_t pt_tokenizer_token_id(const pt_tokenizer *t, const char *text);
/* Makes the token `text` the document separator that pt_tokenizer_eot returns. */
pt_status pt_tokenizer_set_eot(pt_tokenizer *t, const char *text);
void pt_tokenizer_free(pt_tokenizer *t);

/* Encodes `len` bytes of UTF-8 text and appends the ids to *tokens (n used, cap allocated;
 * grown with realloc, *tokens may start NULL with *n = *cap = 0; the caller frees it). */
pt_status pt_tokenizer_encode(pt_tokenizer *t, const char *text, size_t len, int32_t **tokens,
                              size_t *n, size_t *cap);

/* The bytes of `n` tokens, NUL-terminated (not counted in *len); caller frees. NULL, with a
 * message in pt_last_error(), if an id is out of range. */
char *pt_tokenizer_decode(const pt_tokenizer *t, const int32_t *tokens, size_t n, size_t *len);

/* The document separator: "<|endoftext|>" (50256) for GPT-2's files, see pt_tokenizer_open for the
 * others. */
int pt_tokenizer_eot(const pt_tokenizer *t);
/* Number of ids (50257 for GPT-2). */
int pt_tokenizer_vocab_size(const pt_tokenizer *t);

/* Code point classes of the pre-tokenizer pattern, from the generated src/data/unicode_tables.c. */
typedef enum {
    PT_CHAR_OTHER = 0,  /* [^\s\p{L}\p{N}] */
    PT_CHAR_LETTER = 1, /* \p{L} */
    PT_CHAR_NUMBER = 2, /* \p{N} */
    PT_CHAR_SPACE = 3,  /* JS \s */
} pt_char_class;

pt_char_class pt_tokenizer_char_class(uint32_t cp);
/* The Unicode version the class table was generated from (node's), e.g. "17.0". */
extern const char *const pt_unicode_version;

#endif
