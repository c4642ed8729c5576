/* prepare_input.c: documents from text or JSON Lines, plain, gzip (zlib) or zstd (libzstd),
 * from a file or standard input; see prepare_input.h. */
#include "cli/prepare_input.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

enum { INPUT_BLOCK = 1 << 20 };
typedef enum { INPUT_PLAIN, INPUT_GZIP, INPUT_ZSTD } input_codec;

struct pt_input {
    FILE *f;
    char *name; /* for messages: the path, or "<stdin>" */
    int jsonl;
    const char *field;
    input_codec codec;
    uint8_t *in; /* raw bytes read from the file */
    size_t in_len, in_pos;
    int in_eof;
    uint64_t raw; /* bytes read from the file so far */
    uint8_t *dec; /* decompressed bytes (plain: `in` itself) */
    size_t dec_len, dec_pos;
    int full;     /* the last decompression filled `dec`: output may be pending */
    int done;     /* the decompressed stream has ended */
    z_stream z;
    int z_open, z_end; /* z_end: at the end of a gzip member (another may follow) */
    ZSTD_DStream *zs;
    size_t zs_left; /* ZSTD_decompressStream's last hint: 0 at the end of a frame */
    long long line; /* lines begun (JSON Lines) */
    char *buf;      /* the line, or the document, being gathered */
    size_t len, cap;
    int text_given; /* text: the one document was returned */
};

static pt_status input_fill(pt_input *r) {
    r->in_pos = r->in_len = 0;
    size_t n = fread(r->in, 1, INPUT_BLOCK, r->f);
    if (n == 0) {
        if (ferror(r->f)) return pt_errorf(PT_ERR_IO, "%s: read failed: %s", r->name, strerror(errno));
        r->in_eof = 1;
    }
    r->in_len = n;
    r->raw += n;
    return PT_OK;
}

static pt_status input_start(pt_input *r);

static int ends_with(const char *s, size_t n, const char *suffix) {
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* JSON Lines by name: .jsonl, .ndjson, .json, optionally followed by .gz, .zst or .zstd. */
static int name_is_jsonl(const char *path) {
    size_t n = strlen(path);
    if (ends_with(path, n, ".gz")) n -= 3;
    else if (ends_with(path, n, ".zst")) n -= 4;
    else if (ends_with(path, n, ".zstd")) n -= 5;
    return ends_with(path, n, ".jsonl") || ends_with(path, n, ".ndjson") || ends_with(path, n, ".json");
}

pt_status pt_input_open(pt_input **out, const char *path, pt_input_format format, const char *field) {
    *out = NULL;
    int std_in = strcmp(path, "-") == 0;
    FILE *f = std_in ? stdin : fopen(path, "rb");
    if (!f) return pt_errorf(PT_ERR_IO, "%s: cannot read input file: %s", path, strerror(errno));
    pt_input *r = pt_calloc(1, sizeof *r);
    r->f = f;
    r->name = strdup(std_in ? "<stdin>" : path);
    r->field = field;
    r->jsonl = format == PT_INPUT_JSONL || (format == PT_INPUT_AUTO && (std_in || name_is_jsonl(path)));
    r->in = pt_malloc(INPUT_BLOCK);
    pt_status st = input_start(r);
    if (st != PT_OK) {
        pt_input_close(r);
        return st;
    }
    *out = r;
    return PT_OK;
}

/* Reads the first block and starts the decoder its first bytes name. */
static pt_status input_start(pt_input *r) {
    PT_TRY(input_fill(r));
    /* the codec by the first bytes (a compressed file shorter than its magic is no stream) */
    static const uint8_t gz[2] = {0x1f, 0x8b}, zst[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (r->in_len >= 2 && memcmp(r->in, gz, 2) == 0) r->codec = INPUT_GZIP;
    if (r->in_len >= 4 && memcmp(r->in, zst, 4) == 0) r->codec = INPUT_ZSTD;
    if (r->codec == INPUT_GZIP) {
        /* 16 + MAX_WBITS: gzip framing (with its CRC-32 and length checked) */
        if (inflateInit2(&r->z, 16 + MAX_WBITS) != Z_OK)
            return pt_errorf(PT_ERR_MEMORY, "%s: zlib could not start: %s", r->name, r->z.msg ? r->z.msg : "");
        r->z_open = 1;
    } else if (r->codec == INPUT_ZSTD) {
        r->zs = ZSTD_createDStream();
        if (!r->zs) return pt_errorf(PT_ERR_MEMORY, "%s: libzstd could not start", r->name);
        ZSTD_initDStream(r->zs);
    }
    if (r->codec != INPUT_PLAIN) r->dec = pt_malloc(INPUT_BLOCK);
    return PT_OK;
}

/* Where a corrupt stream was found: for JSON Lines the line that the failing call's output
 * (dec[0, dec_len), decoded ahead of the lines) reached, for text the bytes before it. */
static pt_status corrupt(pt_input *r, const char *codec, const char *why) {
    if (r->jsonl) {
        long long line = r->line ? r->line : 1;
        for (size_t i = 0; i < r->dec_len; i++) line += r->dec[i] == '\n';
        return pt_errorf(PT_ERR_FORMAT, "%s:%lld: corrupt %s stream: %s", r->name, line, codec, why);
    }
    return pt_errorf(PT_ERR_FORMAT, "%s: corrupt %s stream after %zu bytes of text: %s", r->name, codec,
                     r->len + r->dec_len, why);
}

/* Fills dec with the next decompressed bytes; r->done at the end of the stream. */
static pt_status input_decode(pt_input *r) {
    r->dec_pos = r->dec_len = 0;
    if (r->codec == INPUT_PLAIN) {
        if (r->in_pos == r->in_len && !r->in_eof) PT_TRY(input_fill(r));
        r->dec = r->in + r->in_pos;
        r->dec_len = r->in_len - r->in_pos;
        r->in_pos = r->in_len;
        if (r->dec_len == 0) r->done = 1;
        return PT_OK;
    }
    for (;;) {
        if (r->in_pos == r->in_len && !r->in_eof) PT_TRY(input_fill(r));
        int no_input = r->in_pos == r->in_len;
        if (no_input && !r->full) { /* the file has ended and nothing is pending */
            int complete = r->codec == INPUT_GZIP ? r->z_end : r->zs_left == 0;
            if (!complete) return corrupt(r, r->codec == INPUT_GZIP ? "gzip" : "zstd", "truncated");
            r->done = 1;
            return PT_OK;
        }
        if (r->codec == INPUT_GZIP) {
            if (r->z_end && no_input) { /* a member ended with all its output: nothing follows */
                r->full = 0;
                continue;
            }
            if (r->z_end) { /* another member follows (gzip files may be concatenated) */
                inflateReset(&r->z);
                r->z_end = 0;
            }
            r->z.next_in = r->in + r->in_pos;
            r->z.avail_in = (uInt)(r->in_len - r->in_pos);
            r->z.next_out = r->dec;
            r->z.avail_out = INPUT_BLOCK;
            int ret = inflate(&r->z, Z_NO_FLUSH);
            r->in_pos = r->in_len - r->z.avail_in;
            r->dec_len = INPUT_BLOCK - r->z.avail_out;
            if (ret == Z_STREAM_END) r->z_end = 1;
            else if (ret != Z_OK && ret != Z_BUF_ERROR)
                return corrupt(r, "gzip", r->z.msg ? r->z.msg : "inflate failed");
        } else {
            ZSTD_inBuffer ib = {r->in, r->in_len, r->in_pos};
            ZSTD_outBuffer ob = {r->dec, INPUT_BLOCK, 0};
            size_t ret = ZSTD_decompressStream(r->zs, &ob, &ib);
            r->in_pos = ib.pos;
            r->dec_len = ob.pos;
            if (ZSTD_isError(ret)) return corrupt(r, "zstd", ZSTD_getErrorName(ret));
            r->zs_left = ret;
        }
        r->full = r->dec_len == INPUT_BLOCK;
        if (r->dec_len > 0) return PT_OK;
        if (no_input) r->full = 0; /* nothing came out of nothing: the decoder is drained */
    }
}

static void buf_append(pt_input *r, const uint8_t *p, size_t n) {
    if (r->len + n + 1 > r->cap) {
        size_t c = r->cap ? r->cap : 1 << 16;
        while (c < r->len + n + 1) c *= 2;
        r->buf = realloc(r->buf, c);
        PT_ASSERTF(r->buf, "out of memory for a line of %zu bytes", c);
        r->cap = c;
    }
    memcpy(r->buf + r->len, p, n);
    r->len += n;
    r->buf[r->len] = 0;
}

static char *take_copy(const char *s, size_t n) {
    char *t = pt_malloc(n + 1);
    memcpy(t, s, n);
    t[n] = 0;
    return t;
}

/* Gathers the next line (without its '\n') into buf; 0 at the end of the input. */
static pt_status next_line(pt_input *r, int *got) {
    r->len = 0;
    *got = 0;
    for (;;) {
        if (r->dec_pos == r->dec_len) {
            if (r->done) break;
            PT_TRY(input_decode(r));
            continue;
        }
        const uint8_t *p = r->dec + r->dec_pos, *nl = memchr(p, '\n', r->dec_len - r->dec_pos);
        size_t n = nl ? (size_t)(nl - p) : r->dec_len - r->dec_pos;
        buf_append(r, p, n);
        r->dec_pos += n + (nl != NULL);
        if (nl) {
            *got = 1;
            return PT_OK;
        }
    }
    *got = r->len > 0; /* a last line without its newline */
    return PT_OK;
}

static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* The document of one JSON line: the string in the field. */
static pt_status jsonl_document(pt_input *r, char **text, size_t *len) {
    json_error_t err;
    /* JSON_ALLOW_NUL: "\u0000" is text like any other character */
    json_t *o = json_loadb(r->buf, r->len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
    if (!o)
        return pt_errorf(PT_ERR_FORMAT, "%s:%lld: not valid JSON: %s (column %d)", r->name, r->line, err.text,
                         err.column);
    pt_status st = PT_OK;
    json_t *v = json_is_object(o) ? json_object_get(o, r->field) : NULL;
    if (!json_is_object(o))
        st = pt_errorf(PT_ERR_FORMAT, "%s:%lld: %s, not an object (JSON Lines: one object a line, the "
                       "text in its \"%s\" field)", r->name, r->line, json_kind(o), r->field);
    else if (!v)
        st = pt_errorf(PT_ERR_FORMAT, "%s:%lld: no \"%s\" field (--field names the one holding the text)",
                       r->name, r->line, r->field);
    else if (!json_is_string(v))
        st = pt_errorf(PT_ERR_FORMAT, "%s:%lld: the \"%s\" field is %s, not a string", r->name, r->line,
                       r->field, json_kind(v));
    else {
        *len = json_string_length(v);
        *text = take_copy(json_string_value(v), *len);
    }
    json_decref(o);
    return st;
}

pt_status pt_input_next(pt_input *r, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    if (!r->jsonl) { /* the whole input */
        if (r->text_given) return PT_OK;
        r->len = 0;
        buf_append(r, (const uint8_t *)"", 0);
        while (!r->done) {
            PT_TRY(input_decode(r));
            buf_append(r, r->dec, r->dec_len);
        }
        r->text_given = 1;
        *len = r->len;
        *text = r->buf; /* handed over: the document is the input's size */
        r->buf = NULL;
        r->len = r->cap = 0;
        return PT_OK;
    }
    for (;;) {
        int got;
        r->line++;
        PT_TRY(next_line(r, &got));
        if (!got) {
            r->line--;
            return PT_OK;
        }
        size_t k = 0; /* a blank line (spaces, tabs, a '\r') is no document */
        while (k < r->len && (r->buf[k] == ' ' || r->buf[k] == '\t' || r->buf[k] == '\r')) k++;
        if (k < r->len) return jsonl_document(r, text, len);
    }
}

uint64_t pt_input_bytes_read(const pt_input *r) { return r->raw; }

long long pt_input_line(const pt_input *r) { return r->line; }

void pt_input_close(pt_input *r) {
    if (!r) return;
    if (r->f && r->f != stdin) fclose(r->f);
    if (r->z_open) inflateEnd(&r->z);
    ZSTD_freeDStream(r->zs);
    if (r->codec != INPUT_PLAIN) free(r->dec);
    free(r->in);
    free(r->buf);
    free(r->name);
    free(r);
}
