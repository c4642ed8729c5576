/* prepare_input.h: the documents of one input of `pentatron prepare`, streamed.
 *
 * An input is a file or standard input ("-"), plain or compressed with gzip or zstd (known by
 * its first bytes, 1f 8b or 28 b5 2f fd, whatever its name), holding either one document (text)
 * or JSON Lines: one JSON object a line, the document the string in one of its fields. Memory is
 * one block of input, one of decompressed text and the longest line (or the one document).
 */
#ifndef PT_PREPARE_INPUT_H
#define PT_PREPARE_INPUT_H

#include <stdint.h>

#include "pt/core.h"

typedef enum {
    PT_INPUT_AUTO,  /* JSON Lines for standard input and for names ending .jsonl, .ndjson or
                       .json (with .gz, .zst or .zstd after them), else text */
    PT_INPUT_TEXT,  /* the whole input is one document */
    PT_INPUT_JSONL, /* one JSON object a line, the document in a string field */
} pt_input_format;

typedef struct pt_input pt_input;

/* Opens path ("-": standard input); field is the JSON Lines field holding the text. PT_ERR_IO
 * naming the path when it cannot be read. */
pt_status pt_input_open(pt_input **in, const char *path, pt_input_format format, const char *field);
/* The next document into *text (malloc'd, the caller frees it; NUL-terminated, *len bytes
 * without it), or *text = NULL at the end. A malformed line, a line without the field or with
 * another type there, a corrupt or truncated compressed stream: PT_ERR_FORMAT naming the input
 * and the line. */
pt_status pt_input_next(pt_input *in, char **text, size_t *len);
/* Bytes read so far from the file (compressed bytes for a compressed one): the progress. */
uint64_t pt_input_bytes_read(const pt_input *in);
/* The line of the last document (JSON Lines, counted from 1), 0 for text. */
long long pt_input_line(const pt_input *in);
void pt_input_close(pt_input *in);

#endif
