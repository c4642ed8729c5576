/* safetensors.h: reading and writing Hugging Face .safetensors files, and sharded checkpoint
 * directories (model.safetensors.index.json + shards).
 *
 * File layout: an 8-byte little-endian header size N, N bytes of JSON header (an object mapping
 * tensor names to {"dtype", "shape", "data_offsets": [begin, end]}, plus an optional
 * "__metadata__" object of string -> string), then the data region; offsets are relative to the
 * data region's start.
 *
 * Files are treated as hostile: pt_st_open validates the whole header before anything is used
 * (header size, JSON syntax and types, dtypes, shapes without overflow, offsets inside the data
 * region and equal to numel × dtype size, and tensors covering the data region exactly, without
 * overlaps or holes, as the reference implementation requires). Any violation is PT_ERR_FORMAT
 * with a message naming the file, the tensor and what was expected; after a successful open every
 * tensor's bytes are known to lie inside the file.
 *
 * Files are memory-mapped read-only; pt_st_read_f32 / pt_st_read_i32 convert into caller memory.
 */
#ifndef PT_SAFETENSORS_H
#define PT_SAFETENSORS_H

#include "pt/core.h"

#define PT_ST_MAX_DIMS 8
/* Headers larger than this are rejected as absurd (real ones are well under 1 MB). */
#define PT_ST_MAX_HEADER_BYTES ((uint64_t)100 * 1000 * 1000)

typedef enum {
    PT_ST_DTYPE_BOOL = 0,
    PT_ST_DTYPE_U8,
    PT_ST_DTYPE_I8,
    PT_ST_DTYPE_F8_E4M3,
    PT_ST_DTYPE_F8_E5M2,
    PT_ST_DTYPE_U16,
    PT_ST_DTYPE_I16,
    PT_ST_DTYPE_F16,
    PT_ST_DTYPE_BF16,
    PT_ST_DTYPE_U32,
    PT_ST_DTYPE_I32,
    PT_ST_DTYPE_F32,
    PT_ST_DTYPE_U64,
    PT_ST_DTYPE_I64,
    PT_ST_DTYPE_F64,
    PT_ST_DTYPE_COUNT
} pt_st_dtype;

/* "F32", "BF16", ... as written in headers. */
const char *pt_st_dtype_name(pt_st_dtype dt);
/* Bytes per element. */
size_t pt_st_dtype_size(pt_st_dtype dt);

typedef struct {
    const char *name;
    pt_st_dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[PT_ST_MAX_DIMS];
    int64_t numel;   /* product of shape (1 for a scalar) */
    uint64_t offset; /* byte offset in the data region */
    uint64_t nbytes; /* numel × dtype size */
} pt_st_tensor;

/* ---- reading one file ---- */

typedef struct pt_st_file pt_st_file;

/* Maps and validates `path`. PT_ERR_IO if it cannot be opened, PT_ERR_FORMAT if malformed. */
pt_status pt_st_open(pt_st_file **f, const char *path);
void pt_st_close(pt_st_file *f);
const char *pt_st_path(const pt_st_file *f);

/* Tensors in name order. */
int pt_st_count(const pt_st_file *f);
const pt_st_tensor *pt_st_tensor_at(const pt_st_file *f, int i);
/* NULL when there is no tensor of that name. */
const pt_st_tensor *pt_st_find(const pt_st_file *f, const char *name);
/* The tensor's raw little-endian bytes (t->nbytes of them, no alignment guaranteed). */
const void *pt_st_tensor_data(const pt_st_file *f, const pt_st_tensor *t);

/* Reads tensor `name` (F32, BF16, F16 or F64) into out (numel floats), converting to float32.
 * expect_shape (ndim entries) must equal the stored shape; pass NULL to skip the check (out must
 * then hold pt_st_find(f, name)->numel floats). PT_ERR_FORMAT naming file, tensor, expected and
 * found shape or dtype; also when the tensor does not exist. */
pt_status pt_st_read_f32(pt_st_file *f, const char *name, const int64_t *expect_shape, int ndim,
                         float *out);
/* Same for integer tensors (I32, I64, U16, U8) into int32; I64 values must fit in int32. */
pt_status pt_st_read_i32(pt_st_file *f, const char *name, const int64_t *expect_shape, int ndim,
                         int32_t *out);

/* "__metadata__" entries: NULL when the key is absent. */
const char *pt_st_meta_get(const pt_st_file *f, const char *key);
int pt_st_meta_count(const pt_st_file *f);
/* i-th entry in key order. */
void pt_st_meta_at(const pt_st_file *f, int i, const char **key, const char **value);

/* ---- reading a Hugging Face checkpoint directory ---- */

typedef struct pt_st_dir pt_st_dir;

/* Opens DIR/model.safetensors or, if absent, DIR/model.safetensors.index.json and every shard
 * it names. The index is validated: "weight_map" maps names to plain file names in DIR, every
 * mapped tensor exists in its shard and every tensor of a shard is mapped to that shard. */
pt_status pt_st_dir_open(pt_st_dir **d, const char *dir);
void pt_st_dir_close(pt_st_dir *d);
/* Tensors across all shards, in name order. */
int pt_st_dir_count(const pt_st_dir *d);
const pt_st_tensor *pt_st_dir_tensor_at(const pt_st_dir *d, int i);
/* NULL when absent; *file (if file is not NULL) receives the shard that holds it. */
const pt_st_tensor *pt_st_dir_find(const pt_st_dir *d, const char *name, pt_st_file **file);
pt_status pt_st_dir_read_f32(pt_st_dir *d, const char *name, const int64_t *expect_shape, int ndim,
                             float *out);
pt_status pt_st_dir_read_i32(pt_st_dir *d, const char *name, const int64_t *expect_shape, int ndim,
                             int32_t *out);

/* ---- writing ---- */

/* Collects tensors (borrowed pointers: they must stay valid until pt_st_writer_write) and
 * metadata, then streams one file. Tensors are laid out by decreasing dtype size, then name, so
 * that each is aligned to its element size (the header is padded with spaces to a multiple of 8).
 */
typedef struct pt_st_writer pt_st_writer;

pt_st_writer *pt_st_writer_create(void);
void pt_st_writer_free(pt_st_writer *w);
/* float32 data stored as `stored` = PT_ST_DTYPE_F32 or PT_ST_DTYPE_BF16 (round to nearest even). */
pt_status pt_st_writer_add_f32(pt_st_writer *w, const char *name, const int64_t *shape, int ndim,
                               const float *data, pt_st_dtype stored);
/* Data already in `dtype`'s little-endian layout, e.g. int32_t for I32, int64_t for I64. */
pt_status pt_st_writer_add_raw(pt_st_writer *w, const char *name, pt_st_dtype dtype,
                               const int64_t *shape, int ndim, const void *data);
/* PT_ERR_CONFIG for an invalid name/shape (empty, "__metadata__", duplicate, negative, too many
 * dims, overflow) or a string that is not UTF-8. */
pt_status pt_st_writer_set_meta(pt_st_writer *w, const char *key, const char *value);
/* Streams to PATH.tmp, fsyncs it, renames it to PATH and fsyncs the directory. */
pt_status pt_st_writer_write(pt_st_writer *w, const char *path);

/* pt_bf16_round and pt_bf16_to_float of core.h (round to nearest even, NaN kept NaN, quiet). */
uint16_t pt_f32_to_bf16(float x);
float pt_bf16_to_f32(uint16_t h);
float pt_f16_to_f32(uint16_t h);

#endif
