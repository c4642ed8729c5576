/* safetensors.c: validating reader, streaming writer and sharded-directory reader for the
 * safetensors format (see include/pt/safetensors.h for the layout and the guarantees).
 *
 * Reading validates the whole header into a table of pt_st_tensor before any tensor byte is
 * touched; after pt_st_open succeeds, [offset, offset + nbytes) of every tensor lies inside the
 * mapped data region, so the accessors below never check bounds again.
 */
#define _POSIX_C_SOURCE 200809L

#include "pt/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c reads and writes little-endian data in place"
#endif

/* Names in messages are truncated: a hostile file can carry megabyte-long ones. */
#define NAME_FMT "\"%.200s\""

static const struct {
    const char *name;
    size_t size;
} dtype_info[PT_ST_DTYPE_COUNT] = {
    [PT_ST_DTYPE_BOOL] = {"BOOL", 1},       [PT_ST_DTYPE_U8] = {"U8", 1},
    [PT_ST_DTYPE_I8] = {"I8", 1},           [PT_ST_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [PT_ST_DTYPE_F8_E5M2] = {"F8_E5M2", 1}, [PT_ST_DTYPE_U16] = {"U16", 2},
    [PT_ST_DTYPE_I16] = {"I16", 2},         [PT_ST_DTYPE_F16] = {"F16", 2},
    [PT_ST_DTYPE_BF16] = {"BF16", 2},       [PT_ST_DTYPE_U32] = {"U32", 4},
    [PT_ST_DTYPE_I32] = {"I32", 4},         [PT_ST_DTYPE_F32] = {"F32", 4},
    [PT_ST_DTYPE_U64] = {"U64", 8},         [PT_ST_DTYPE_I64] = {"I64", 8},
    [PT_ST_DTYPE_F64] = {"F64", 8},
};

const char *pt_st_dtype_name(pt_st_dtype dt) {
    PT_ASSERT((unsigned)dt < PT_ST_DTYPE_COUNT);
    return dtype_info[dt].name;
}

size_t pt_st_dtype_size(pt_st_dtype dt) {
    PT_ASSERT((unsigned)dt < PT_ST_DTYPE_COUNT);
    return dtype_info[dt].size;
}

static int dtype_from_name(const char *s, pt_st_dtype *dt) {
    for (int i = 0; i < PT_ST_DTYPE_COUNT; i++) {
        if (strcmp(s, dtype_info[i].name) == 0) {
            *dt = (pt_st_dtype)i;
            return 1;
        }
    }
    return 0;
}

/* ---- element conversions ---- */

/* The rounding itself is core.h's, shared with the backend's conversions. */
uint16_t pt_f32_to_bf16(float x) { return pt_bf16_round(x); }

float pt_bf16_to_f32(uint16_t h) { return pt_bf16_to_float(h); }

float pt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        /* zero or subnormal: man · 2^-24, exact in float32 */
        float v = (float)man * 0x1p-24f;
        memcpy(&u, &v, 4);
        u |= sign;
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13); /* inf or NaN (payload kept) */
    } else {
        u = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    }
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* Multiplies the shape out: numel (0 if any dimension is 0) and nbytes. Fails (returns 0) when
 * the product of the non-zero dimensions, or that times the element size, exceeds INT64_MAX, so
 * that callers can multiply any subset of dimensions safely. */
static int shape_numel(const int64_t *shape, int ndim, size_t esize, int64_t *numel,
                       uint64_t *nbytes) {
    int64_t nz = 1;
    int zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) return 0;
        if (shape[i] == 0) {
            zero = 1;
            continue;
        }
        if (__builtin_mul_overflow(nz, shape[i], &nz)) return 0;
    }
    int64_t bytes;
    if (__builtin_mul_overflow(nz, (int64_t)esize, &bytes)) return 0;
    *numel = zero ? 0 : nz;
    *nbytes = zero ? 0 : (uint64_t)bytes;
    return 1;
}

static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t at = 0;
    at += (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* ---- reading one file ---- */

struct pt_st_file {
    char *path;
    uint8_t *base; /* the whole file: mmap'd, or read into memory where mmap is unavailable */
    size_t size;
    int mapped;
    const uint8_t *data; /* data region: base + 8 + header size */
    uint64_t data_len;
    pt_st_tensor *t; /* sorted by name; names owned */
    int n;
    char **meta; /* key, value pairs sorted by key; owned */
    int n_meta;
};

const char *pt_st_path(const pt_st_file *f) { return f->path; }
int pt_st_count(const pt_st_file *f) { return f->n; }

const pt_st_tensor *pt_st_tensor_at(const pt_st_file *f, int i) {
    PT_ASSERT(i >= 0 && i < f->n);
    return &f->t[i];
}

static int cmp_tensor_name(const void *a, const void *b) {
    return strcmp(((const pt_st_tensor *)a)->name, ((const pt_st_tensor *)b)->name);
}

const pt_st_tensor *pt_st_find(const pt_st_file *f, const char *name) {
    pt_st_tensor key = {.name = name};
    return bsearch(&key, f->t, (size_t)f->n, sizeof *f->t, cmp_tensor_name);
}

const void *pt_st_tensor_data(const pt_st_file *f, const pt_st_tensor *t) {
    PT_ASSERT(t >= f->t && t < f->t + f->n);
    return f->data + t->offset;
}

const char *pt_st_meta_get(const pt_st_file *f, const char *key) {
    for (int i = 0; i < f->n_meta; i++)
        if (strcmp(f->meta[2 * i], key) == 0) return f->meta[2 * i + 1];
    return NULL;
}

int pt_st_meta_count(const pt_st_file *f) { return f->n_meta; }

void pt_st_meta_at(const pt_st_file *f, int i, const char **key, const char **value) {
    PT_ASSERT(i >= 0 && i < f->n_meta);
    *key = f->meta[2 * i];
    *value = f->meta[2 * i + 1];
}

void pt_st_close(pt_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->t[i].name);
    free(f->t);
    for (int i = 0; i < 2 * f->n_meta; i++) free(f->meta[i]);
    free(f->meta);
    if (f->mapped)
        munmap(f->base, f->size);
    else
        free(f->base);
    free(f->path);
    free(f);
}

static pt_status parse_int_array_entry(const pt_st_file *f, const char *name, const char *field,
                                       json_t *v, size_t i, int64_t *out) {
    json_t *x = json_array_get(v, i);
    if (!json_is_integer(x))
        return pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT ": %s[%zu] is not an integer",
                         f->path, name, field, i);
    if (json_integer_value(x) < 0)
        return pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT ": %s[%zu] = %lld is negative",
                         f->path, name, field, i, (long long)json_integer_value(x));
    *out = (int64_t)json_integer_value(x);
    return PT_OK;
}

/* Validates one header entry into t (t->name is set by the caller). */
static pt_status parse_tensor(const pt_st_file *f, const char *name, json_t *v, pt_st_tensor *t) {
    if (!json_is_object(v))
        return pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT ": entry is not a JSON object",
                         f->path, name);
    const char *k;
    json_t *x;
    json_object_foreach(v, k, x) {
        if (strcmp(k, "dtype") != 0 && strcmp(k, "shape") != 0 && strcmp(k, "data_offsets") != 0)
            return pt_errorf(PT_ERR_FORMAT,
                             "%s: tensor " NAME_FMT ": unexpected key " NAME_FMT
                             " (expected dtype, shape, data_offsets)",
                             f->path, name, k);
    }

    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": \"dtype\" missing or not a string", f->path,
                         name);
    if (!dtype_from_name(json_string_value(dt), &t->dtype))
        return pt_errorf(
            PT_ERR_FORMAT,
            "%s: tensor " NAME_FMT ": unknown dtype \"%.32s\" (expected one of BOOL, "
            "U8, I8, F8_E4M3, F8_E5M2, U16, I16, F16, BF16, U32, I32, F32, U64, I64, F64)",
            f->path, name, json_string_value(dt));

    json_t *sh = json_object_get(v, "shape");
    if (!json_is_array(sh))
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": \"shape\" missing or not an array", f->path,
                         name);
    if (json_array_size(sh) > PT_ST_MAX_DIMS)
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": %zu dimensions (at most %d supported)", f->path,
                         name, json_array_size(sh), PT_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    for (int i = 0; i < t->ndim; i++)
        PT_TRY(parse_int_array_entry(f, name, "shape", sh, (size_t)i, &t->shape[i]));
    char sbuf[256];
    if (!shape_numel(t->shape, t->ndim, pt_st_dtype_size(t->dtype), &t->numel, &t->nbytes)) {
        format_shape(sbuf, sizeof sbuf, t->shape, t->ndim);
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": shape %s * %zu bytes overflows 64 bits", f->path,
                         name, sbuf, pt_st_dtype_size(t->dtype));
    }

    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2)
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT
                         ": \"data_offsets\" missing or not an array [begin, end]",
                         f->path, name);
    int64_t begin, end;
    PT_TRY(parse_int_array_entry(f, name, "data_offsets", off, 0, &begin));
    PT_TRY(parse_int_array_entry(f, name, "data_offsets", off, 1, &end));
    if (begin > end)
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": data_offsets [%lld, %lld] has begin > end",
                         f->path, name, (long long)begin, (long long)end);
    if ((uint64_t)end > f->data_len)
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT
                         ": data_offsets end %lld is past the end of the data "
                         "region (%llu bytes; truncated file?)",
                         f->path, name, (long long)end, (unsigned long long)f->data_len);
    if ((uint64_t)(end - begin) != t->nbytes) {
        format_shape(sbuf, sizeof sbuf, t->shape, t->ndim);
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT ": data_offsets [%lld, %lld] span %lld bytes, but "
                         "shape %s of %s needs %llu",
                         f->path, name, (long long)begin, (long long)end, (long long)(end - begin),
                         sbuf, pt_st_dtype_name(t->dtype), (unsigned long long)t->nbytes);
    }
    t->offset = (uint64_t)begin;
    return PT_OK;
}

/* Metadata is stored as (key, value) pointer pairs; compares the keys. */
static int cmp_meta_key(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static pt_status parse_metadata(pt_st_file *f, json_t *m) {
    if (json_is_null(m)) return PT_OK;
    if (!json_is_object(m))
        return pt_errorf(PT_ERR_FORMAT, "%s: \"__metadata__\" is not an object of strings",
                         f->path);
    f->meta = pt_calloc(2 * json_object_size(m) + 1, sizeof *f->meta);
    const char *k;
    json_t *v;
    json_object_foreach(m, k, v) {
        if (!json_is_string(v))
            return pt_errorf(PT_ERR_FORMAT,
                             "%s: \"__metadata__\" entry " NAME_FMT " is not a string", f->path, k);
        f->meta[2 * f->n_meta] = pt_strdup(k);
        f->meta[2 * f->n_meta + 1] = pt_strdup(json_string_value(v));
        f->n_meta++;
    }
    qsort(f->meta, (size_t)f->n_meta, 2 * sizeof *f->meta, cmp_meta_key);
    return PT_OK;
}

static int cmp_tensor_ptr_offset(const void *a, const void *b) {
    const pt_st_tensor *x = *(const pt_st_tensor *const *)a, *y = *(const pt_st_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* The reference implementation requires the tensors to tile the data region exactly: no overlap
 * (two names for the same bytes) and no holes or trailing bytes (room for a polyglot payload). */
static pt_status check_coverage(const pt_st_file *f) {
    const pt_st_tensor **by_off = pt_malloc(((size_t)f->n + 1) * sizeof *by_off);
    for (int i = 0; i < f->n; i++) by_off[i] = &f->t[i];
    qsort(by_off, (size_t)f->n, sizeof *by_off, cmp_tensor_ptr_offset);
    uint64_t pos = 0;
    const pt_st_tensor *prev = NULL;
    pt_status st = PT_OK;
    for (int i = 0; i < f->n && st == PT_OK; i++) {
        const pt_st_tensor *t = by_off[i];
        if (t->offset < pos)
            st = pt_errorf(PT_ERR_FORMAT,
                           "%s: tensor " NAME_FMT " bytes [%llu, %llu) overlap tensor " NAME_FMT
                           " bytes [%llu, %llu)",
                           f->path, t->name, (unsigned long long)t->offset,
                           (unsigned long long)(t->offset + t->nbytes), prev->name,
                           (unsigned long long)prev->offset,
                           (unsigned long long)(prev->offset + prev->nbytes));
        else if (t->offset > pos)
            st =
                pt_errorf(PT_ERR_FORMAT,
                          "%s: data bytes [%llu, %llu) before tensor " NAME_FMT
                          " belong to no tensor (holes are not allowed)",
                          f->path, (unsigned long long)pos, (unsigned long long)t->offset, t->name);
        pos = t->offset + t->nbytes;
        prev = t;
    }
    if (st == PT_OK && pos != f->data_len)
        st = pt_errorf(PT_ERR_FORMAT,
                       "%s: data bytes [%llu, %llu) at the end of the file belong to no tensor",
                       f->path, (unsigned long long)pos, (unsigned long long)f->data_len);
    free(by_off);
    return st;
}

static pt_status parse_header(pt_st_file *f, const char *hdr, size_t len) {
    json_error_t err;
    json_t *root = json_loadb(hdr, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s: header is not valid JSON (byte %d: %s)", f->path,
                         err.position, err.text);
    pt_status st = PT_OK;
    if (!json_is_object(root)) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: header is not a JSON object", f->path);
        goto done;
    }
    json_t *meta = json_object_get(root, "__metadata__");
    size_t n = json_object_size(root) - (meta ? 1 : 0);
    if (n > INT32_MAX) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: %zu tensors", f->path, n);
        goto done;
    }
    if (meta && (st = parse_metadata(f, meta)) != PT_OK) goto done;
    f->t = pt_calloc(n + 1, sizeof *f->t);
    const char *k;
    size_t klen;
    json_t *v;
    json_object_keylen_foreach(root, k, klen, v) {
        if (k[0] != '\0' && strlen(k) == klen && strcmp(k, "__metadata__") == 0) continue;
        if (k[0] == '\0' || strlen(k) != klen) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: a tensor name is empty or contains a NUL byte",
                           f->path);
            goto done;
        }
        pt_st_tensor *t = &f->t[f->n];
        if ((st = parse_tensor(f, k, v, t)) != PT_OK) goto done;
        t->name = pt_strdup(k);
        f->n++;
    }
    if ((st = check_coverage(f)) != PT_OK) goto done;
    qsort(f->t, (size_t)f->n, sizeof *f->t, cmp_tensor_name);
    for (int i = 1; i < f->n; i++) {
        if (strcmp(f->t[i - 1].name, f->t[i].name) == 0) {
            st = pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT " appears twice", f->path,
                           f->t[i].name);
            goto done;
        }
    }
done:
    json_decref(root);
    return st;
}

/* Reads the whole open file into an exact-size heap buffer. */
static pt_status read_all(pt_st_file *f, int fd) {
    f->base = pt_malloc(f->size);
    size_t got = 0;
    while (got < f->size) {
        ssize_t r = read(fd, f->base + got, f->size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return pt_errorf(PT_ERR_IO, "%s: read failed after %zu of %zu bytes: %s", f->path, got,
                             f->size, r < 0 ? strerror(errno) : "file shrank");
        got += (size_t)r;
    }
    return PT_OK;
}

/* Maps the file, or reads it where mmap is not possible. Under AddressSanitizer the file is always
 * read into the heap, so that a read past any tensor or past the file is reported. */
static pt_status load_bytes(pt_st_file *f) {
    int fd = open(f->path, O_RDONLY);
    if (fd < 0) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat sb;
    pt_status st = PT_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = pt_errorf(PT_ERR_IO, "%s: not a regular file", f->path);
    } else if ((uint64_t)sb.st_size > SIZE_MAX) {
        st = pt_errorf(PT_ERR_IO, "%s: too large to map", f->path);
    } else if ((f->size = (size_t)sb.st_size) < 8) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: file is %zu bytes, shorter than the 8-byte header size",
                       f->path, f->size);
    } else {
#ifdef __SANITIZE_ADDRESS__
        void *p = MAP_FAILED;
#else
        void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
#endif
        if (p != MAP_FAILED) {
            f->base = p;
            f->mapped = 1;
        } else {
            st = read_all(f, fd);
        }
    }
    close(fd);
    return st;
}

pt_status pt_st_open(pt_st_file **out, const char *path) {
    *out = NULL;
    pt_st_file *f = pt_calloc(1, sizeof *f);
    f->path = pt_strdup(path);
    pt_status st = load_bytes(f);
    if (st != PT_OK) goto fail;

    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | f->base[i];
    if (hlen == 0) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: header size is 0 (expected a JSON object)", path);
        goto fail;
    }
    if (hlen > f->size - 8) {
        st = pt_errorf(
            PT_ERR_FORMAT,
            "%s: header size %llu is larger than the file allows (%zu bytes after the size)", path,
            (unsigned long long)hlen, f->size - 8);
        goto fail;
    }
    if (hlen > PT_ST_MAX_HEADER_BYTES) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: header size %llu exceeds the %llu-byte limit", path,
                       (unsigned long long)hlen, (unsigned long long)PT_ST_MAX_HEADER_BYTES);
        goto fail;
    }
    f->data = f->base + 8 + hlen;
    f->data_len = f->size - 8 - hlen;
    st = parse_header(f, (const char *)f->base + 8, (size_t)hlen);
    if (st != PT_OK) goto fail;
    *out = f;
    return PT_OK;
fail:
    pt_st_close(f);
    return st;
}

static pt_status check_shape(const pt_st_file *f, const pt_st_tensor *t, const int64_t *expect,
                             int ndim) {
    if (!expect) return PT_OK;
    PT_ASSERT(ndim >= 0 && ndim <= PT_ST_MAX_DIMS);
    int same = ndim == t->ndim;
    for (int i = 0; same && i < ndim; i++) same = expect[i] == t->shape[i];
    if (same) return PT_OK;
    char want[256], got[256];
    format_shape(want, sizeof want, expect, ndim);
    format_shape(got, sizeof got, t->shape, t->ndim);
    return pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT " has shape %s, expected %s", f->path,
                     t->name, got, want);
}

static pt_status find_tensor(const pt_st_file *f, const char *name, const pt_st_tensor **t) {
    *t = pt_st_find(f, name);
    if (!*t) return pt_errorf(PT_ERR_FORMAT, "%s: no tensor " NAME_FMT, f->path, name);
    return PT_OK;
}

/* Conversions of more than this many elements are split across OpenMP threads. */
#define PAR_MIN (1 << 18)

pt_status pt_st_read_f32(pt_st_file *f, const char *name, const int64_t *expect_shape, int ndim,
                         float *out) {
    const pt_st_tensor *t;
    PT_TRY(find_tensor(f, name, &t));
    PT_TRY(check_shape(f, t, expect_shape, ndim));
    const uint8_t *src = f->data + t->offset;
    int64_t n = t->numel;
    if (n == 0) return PT_OK; /* out may be NULL */
    switch (t->dtype) {
    case PT_ST_DTYPE_F32: memcpy(out, src, (size_t)t->nbytes); break;
    case PT_ST_DTYPE_BF16:
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = pt_bf16_to_f32(h);
        }
        break;
    case PT_ST_DTYPE_F16:
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            out[i] = pt_f16_to_f32(h);
        }
        break;
    case PT_ST_DTYPE_F64:
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
        for (int64_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            out[i] = (float)d;
        }
        break;
    default:
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT " has dtype %s, expected F32, BF16, F16 or F64",
                         f->path, t->name, pt_st_dtype_name(t->dtype));
    }
    return PT_OK;
}

pt_status pt_st_read_i32(pt_st_file *f, const char *name, const int64_t *expect_shape, int ndim,
                         int32_t *out) {
    const pt_st_tensor *t;
    PT_TRY(find_tensor(f, name, &t));
    PT_TRY(check_shape(f, t, expect_shape, ndim));
    const uint8_t *src = f->data + t->offset;
    int64_t n = t->numel;
    if (n == 0) return PT_OK; /* out may be NULL */
    switch (t->dtype) {
    case PT_ST_DTYPE_I32: memcpy(out, src, (size_t)t->nbytes); break;
    case PT_ST_DTYPE_I64:
        for (int64_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, src + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return pt_errorf(PT_ERR_FORMAT,
                                 "%s: tensor " NAME_FMT
                                 ": element %lld = %lld does not fit in int32",
                                 f->path, t->name, (long long)i, (long long)v);
            out[i] = (int32_t)v;
        }
        break;
    case PT_ST_DTYPE_U16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, src + 2 * i, 2);
            out[i] = v;
        }
        break;
    case PT_ST_DTYPE_U8:
        for (int64_t i = 0; i < n; i++) out[i] = src[i];
        break;
    default:
        return pt_errorf(PT_ERR_FORMAT,
                         "%s: tensor " NAME_FMT " has dtype %s, expected I32, I64, U16 or U8",
                         f->path, t->name, pt_st_dtype_name(t->dtype));
    }
    return PT_OK;
}

/* ---- reading a checkpoint directory ---- */

typedef struct {
    const pt_st_tensor *t; /* owned by file */
    pt_st_file *file;
} dir_entry;

struct pt_st_dir {
    char *path;
    pt_st_file **files;
    int n_files;
    dir_entry *e; /* sorted by name */
    int n;
};

static int cmp_dir_entry(const void *a, const void *b) {
    return strcmp(((const dir_entry *)a)->t->name, ((const dir_entry *)b)->t->name);
}

int pt_st_dir_count(const pt_st_dir *d) { return d->n; }

const pt_st_tensor *pt_st_dir_tensor_at(const pt_st_dir *d, int i) {
    PT_ASSERT(i >= 0 && i < d->n);
    return d->e[i].t;
}

static const dir_entry *dir_lookup(const pt_st_dir *d, const char *name) {
    pt_st_tensor kt = {.name = name};
    dir_entry key = {.t = &kt};
    return bsearch(&key, d->e, (size_t)d->n, sizeof *d->e, cmp_dir_entry);
}

const pt_st_tensor *pt_st_dir_find(const pt_st_dir *d, const char *name, pt_st_file **file) {
    const dir_entry *e = dir_lookup(d, name);
    if (file) *file = e ? e->file : NULL;
    return e ? e->t : NULL;
}

pt_status pt_st_dir_read_f32(pt_st_dir *d, const char *name, const int64_t *expect_shape, int ndim,
                             float *out) {
    const dir_entry *e = dir_lookup(d, name);
    if (!e)
        return pt_errorf(PT_ERR_FORMAT, "%s: no tensor " NAME_FMT " in the checkpoint", d->path,
                         name);
    return pt_st_read_f32(e->file, name, expect_shape, ndim, out);
}

pt_status pt_st_dir_read_i32(pt_st_dir *d, const char *name, const int64_t *expect_shape, int ndim,
                             int32_t *out) {
    const dir_entry *e = dir_lookup(d, name);
    if (!e)
        return pt_errorf(PT_ERR_FORMAT, "%s: no tensor " NAME_FMT " in the checkpoint", d->path,
                         name);
    return pt_st_read_i32(e->file, name, expect_shape, ndim, out);
}

void pt_st_dir_close(pt_st_dir *d) {
    if (!d) return;
    for (int i = 0; i < d->n_files; i++) pt_st_close(d->files[i]);
    free(d->files);
    free(d->e);
    free(d->path);
    free(d);
}

static char *join_path(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = pt_malloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int is_regular_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* One weight_map entry while the index is validated. */
typedef struct {
    const char *name;  /* owned by the index JSON */
    const char *shard; /* owned by the index JSON */
    int file;          /* index into d->files */
} index_entry;

static int cmp_index_shard(const void *a, const void *b) {
    const index_entry *x = a, *y = b;
    int c = strcmp(x->shard, y->shard);
    return c ? c : strcmp(x->name, y->name);
}

static int cmp_index_name(const void *a, const void *b) {
    return strcmp(((const index_entry *)a)->name, ((const index_entry *)b)->name);
}

static pt_status dir_open_index(pt_st_dir *d, const char *index_path) {
    char *text;
    size_t len;
    PT_TRY(pt_read_file(index_path, &text, &len));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root)
        return pt_errorf(PT_ERR_FORMAT, "%s: not valid JSON (line %d: %s)", index_path, err.line,
                         err.text);
    pt_status st = PT_OK;
    index_entry *ie = NULL;
    char *shard_path = NULL;
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: expected an object with a \"weight_map\" object",
                       index_path);
        goto done;
    }
    size_t n = json_object_size(wm);
    if (n > INT32_MAX) {
        st = pt_errorf(PT_ERR_FORMAT, "%s: %zu weight_map entries", index_path, n);
        goto done;
    }
    ie = pt_calloc(n + 1, sizeof *ie);
    size_t m = 0;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        /* Shards are plain file names next to the index: never a path out of the directory. */
        if (!s || !s[0] || strchr(s, '/') || strcmp(s, ".") == 0 || strcmp(s, "..") == 0) {
            st = pt_errorf(PT_ERR_FORMAT,
                           "%s: weight_map entry " NAME_FMT " must be a file name in the directory",
                           index_path, k);
            goto done;
        }
        ie[m].name = k;
        ie[m].shard = s;
        m++;
    }
    /* Open each distinct shard once. */
    qsort(ie, n, sizeof *ie, cmp_index_shard);
    d->files = pt_calloc(n + 1, sizeof *d->files);
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || strcmp(ie[i].shard, ie[i - 1].shard) != 0) {
            shard_path = join_path(d->path, ie[i].shard);
            if ((st = pt_st_open(&d->files[d->n_files], shard_path)) != PT_OK) goto done;
            free(shard_path);
            shard_path = NULL;
            d->n_files++;
        }
        ie[i].file = d->n_files - 1;
    }
    /* Every mapped tensor exists in its shard ... */
    d->e = pt_calloc(n + 1, sizeof *d->e);
    for (size_t i = 0; i < n; i++) {
        pt_st_file *f = d->files[ie[i].file];
        const pt_st_tensor *t = pt_st_find(f, ie[i].name);
        if (!t) {
            st =
                pt_errorf(PT_ERR_FORMAT,
                          "%s: weight_map puts tensor " NAME_FMT " in %s, which has no such tensor",
                          index_path, ie[i].name, pt_st_path(f));
            goto done;
        }
        d->e[d->n].t = t;
        d->e[d->n].file = f;
        d->n++;
    }
    /* ... and every shard tensor is mapped to that shard, so that lookups are unambiguous. */
    qsort(ie, n, sizeof *ie, cmp_index_name);
    for (int s = 0; s < d->n_files; s++) {
        pt_st_file *f = d->files[s];
        for (int i = 0; i < pt_st_count(f); i++) {
            const pt_st_tensor *t = pt_st_tensor_at(f, i);
            index_entry key = {.name = t->name};
            const index_entry *hit = bsearch(&key, ie, n, sizeof *ie, cmp_index_name);
            if (!hit || d->files[hit->file] != f) {
                st = pt_errorf(PT_ERR_FORMAT, "%s: tensor " NAME_FMT " of %s is %s", index_path,
                               t->name, pt_st_path(f),
                               hit ? "mapped to another shard in weight_map"
                                   : "missing from weight_map");
                goto done;
            }
        }
    }
    qsort(d->e, (size_t)d->n, sizeof *d->e, cmp_dir_entry);
done:
    free(shard_path);
    free(ie);
    json_decref(root);
    return st;
}

pt_status pt_st_dir_open(pt_st_dir **out, const char *dir) {
    *out = NULL;
    pt_st_dir *d = pt_calloc(1, sizeof *d);
    d->path = pt_strdup(dir);
    char *single = join_path(dir, "model.safetensors");
    char *index = join_path(dir, "model.safetensors.index.json");
    pt_status st = PT_OK;
    if (is_regular_file(single)) {
        d->files = pt_calloc(1, sizeof *d->files);
        st = pt_st_open(&d->files[0], single);
        if (st == PT_OK) {
            d->n_files = 1;
            pt_st_file *f = d->files[0];
            d->e = pt_calloc((size_t)pt_st_count(f) + 1, sizeof *d->e);
            for (int i = 0; i < pt_st_count(f); i++)
                d->e[d->n++] = (dir_entry){pt_st_tensor_at(f, i), f};
        }
    } else if (is_regular_file(index)) {
        st = dir_open_index(d, index);
    } else {
        st = pt_errorf(PT_ERR_IO,
                       "%s: neither model.safetensors nor model.safetensors.index.json found", dir);
    }
    free(single);
    free(index);
    if (st != PT_OK) {
        pt_st_dir_close(d);
        return st;
    }
    *out = d;
    return PT_OK;
}

/* ---- writing ---- */

typedef struct {
    char *name;
    pt_st_dtype dtype; /* as stored */
    int ndim;
    int64_t shape[PT_ST_MAX_DIMS];
    int64_t numel;
    uint64_t nbytes;
    const void *data;
    int from_f32; /* data is float32 to be converted to dtype */
    uint64_t offset;
} writer_entry;

struct pt_st_writer {
    writer_entry *e;
    int n, cap;
    json_t *meta;
};

pt_st_writer *pt_st_writer_create(void) {
    pt_st_writer *w = pt_calloc(1, sizeof *w);
    w->meta = json_object();
    PT_ASSERT(w->meta);
    return w;
}

void pt_st_writer_free(pt_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) free(w->e[i].name);
    free(w->e);
    json_decref(w->meta);
    free(w);
}

static pt_status writer_add(pt_st_writer *w, const char *name, pt_st_dtype dtype,
                            const int64_t *shape, int ndim, const void *data, int from_f32) {
    if (!name || !name[0] || strcmp(name, "__metadata__") == 0)
        return pt_errorf(PT_ERR_CONFIG, "safetensors writer: invalid tensor name " NAME_FMT,
                         name ? name : "(null)");
    json_t *probe = json_string(name); /* NULL unless valid UTF-8 */
    if (!probe)
        return pt_errorf(PT_ERR_CONFIG, "safetensors writer: tensor name " NAME_FMT " is not UTF-8",
                         name);
    json_decref(probe);
    if ((unsigned)dtype >= PT_ST_DTYPE_COUNT)
        return pt_errorf(PT_ERR_CONFIG, "safetensors writer: tensor " NAME_FMT ": invalid dtype %d",
                         name, (int)dtype);
    if (ndim < 0 || ndim > PT_ST_MAX_DIMS || (ndim > 0 && !shape))
        return pt_errorf(PT_ERR_CONFIG,
                         "safetensors writer: tensor " NAME_FMT ": %d dimensions (0 to %d allowed)",
                         name, ndim, PT_ST_MAX_DIMS);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->e[i].name, name) == 0)
            return pt_errorf(PT_ERR_CONFIG, "safetensors writer: tensor " NAME_FMT " added twice",
                             name);
    writer_entry e = {.dtype = dtype, .ndim = ndim, .data = data, .from_f32 = from_f32};
    for (int i = 0; i < ndim; i++) e.shape[i] = shape[i];
    if (!shape_numel(e.shape, ndim, pt_st_dtype_size(dtype), &e.numel, &e.nbytes))
        return pt_errorf(PT_ERR_CONFIG,
                         "safetensors writer: tensor " NAME_FMT ": negative or overflowing shape",
                         name);
    if (e.nbytes > 0 && !data)
        return pt_errorf(PT_ERR_CONFIG, "safetensors writer: tensor " NAME_FMT ": no data", name);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        writer_entry *grown = realloc(w->e, (size_t)w->cap * sizeof *w->e);
        PT_ASSERT(grown);
        w->e = grown;
    }
    e.name = pt_strdup(name);
    w->e[w->n++] = e;
    return PT_OK;
}

pt_status pt_st_writer_add_f32(pt_st_writer *w, const char *name, const int64_t *shape, int ndim,
                               const float *data, pt_st_dtype stored) {
    if (stored != PT_ST_DTYPE_F32 && stored != PT_ST_DTYPE_BF16)
        return pt_errorf(PT_ERR_CONFIG,
                         "safetensors writer: tensor " NAME_FMT
                         ": float32 data can be stored as F32 or BF16, not %s",
                         name ? name : "(null)",
                         (unsigned)stored < PT_ST_DTYPE_COUNT ? pt_st_dtype_name(stored) : "?");
    return writer_add(w, name, stored, shape, ndim, data, stored != PT_ST_DTYPE_F32);
}

pt_status pt_st_writer_add_raw(pt_st_writer *w, const char *name, pt_st_dtype dtype,
                               const int64_t *shape, int ndim, const void *data) {
    return writer_add(w, name, dtype, shape, ndim, data, 0);
}

pt_status pt_st_writer_set_meta(pt_st_writer *w, const char *key, const char *value) {
    json_t *v = json_string(value);
    if (!v)
        return pt_errorf(PT_ERR_CONFIG,
                         "safetensors writer: metadata " NAME_FMT " value is not UTF-8", key);
    if (json_object_set_new(w->meta, key, v) != 0)
        return pt_errorf(PT_ERR_CONFIG,
                         "safetensors writer: metadata key " NAME_FMT " is not UTF-8", key);
    return PT_OK;
}

/* Larger dtypes first so that every tensor starts aligned to its element size. */
static int cmp_writer_layout(const void *a, const void *b) {
    const writer_entry *x = *(const writer_entry *const *)a, *y = *(const writer_entry *const *)b;
    size_t sx = pt_st_dtype_size(x->dtype), sy = pt_st_dtype_size(y->dtype);
    if (sx != sy) return sx > sy ? -1 : 1;
    return strcmp(x->name, y->name);
}

static char *build_header(pt_st_writer *w, writer_entry **order) {
    json_t *root = json_object();
    PT_ASSERT(root);
    if (json_object_size(w->meta) > 0) json_object_set(root, "__metadata__", w->meta);
    for (int i = 0; i < w->n; i++) {
        const writer_entry *e = order[i];
        json_t *shape = json_array();
        for (int d = 0; d < e->ndim; d++) json_array_append_new(shape, json_integer(e->shape[d]));
        json_t *off = json_array();
        json_array_append_new(off, json_integer((json_int_t)e->offset));
        json_array_append_new(off, json_integer((json_int_t)(e->offset + e->nbytes)));
        json_t *t = json_object();
        json_object_set_new(t, "dtype", json_string(pt_st_dtype_name(e->dtype)));
        json_object_set_new(t, "shape", shape);
        json_object_set_new(t, "data_offsets", off);
        PT_ASSERT(json_object_set_new(root, e->name, t) == 0);
    }
    char *s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    PT_ASSERT(s);
    return s;
}

/* float32 -> BF16 goes through buf (CONVERT_CHUNK elements): never a second copy of a tensor. */
enum { CONVERT_CHUNK = 1 << 16 };

static int write_entry(FILE *fp, const writer_entry *e, uint16_t *buf) {
    if (e->nbytes == 0) return 1;
    if (!e->from_f32) return fwrite(e->data, 1, (size_t)e->nbytes, fp) == e->nbytes;
    enum { CHUNK = CONVERT_CHUNK };
    const float *src = e->data;
    for (int64_t i = 0; i < e->numel; i += CHUNK) {
        size_t m = (size_t)(e->numel - i < CHUNK ? e->numel - i : CHUNK);
        for (size_t j = 0; j < m; j++) buf[j] = pt_f32_to_bf16(src[i + (int64_t)j]);
        if (fwrite(buf, 2, m, fp) != m) return 0;
    }
    return 1;
}

pt_status pt_st_writer_write(pt_st_writer *w, const char *path) {
    writer_entry **order = pt_malloc(((size_t)w->n + 1) * sizeof *order);
    for (int i = 0; i < w->n; i++) order[i] = &w->e[i];
    qsort(order, (size_t)w->n, sizeof *order, cmp_writer_layout);
    uint64_t off = 0;
    for (int i = 0; i < w->n; i++) {
        order[i]->offset = off;
        off += order[i]->nbytes;
    }
    char *hdr = build_header(w, order);
    size_t hlen = strlen(hdr);
    size_t padded = (hlen + 7) / 8 * 8; /* spaces, as the reference writer does */

    size_t plen = strlen(path);
    char *tmp = pt_malloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    pt_status st = PT_OK;
    FILE *fp = NULL;
    int fd = -1;
    if (padded > PT_ST_MAX_HEADER_BYTES) {
        st = pt_errorf(PT_ERR_CONFIG, "%s: header of %zu bytes exceeds the %llu-byte limit", path,
                       padded, (unsigned long long)PT_ST_MAX_HEADER_BYTES);
        goto done;
    }
    /* never through a link: neither the temporary nor the final name */
    if ((st = pt_refuse_link(path)) != PT_OK || (st = pt_create_file(tmp, &fd)) != PT_OK) goto done;
    fp = fdopen(fd, "wb");
    if (!fp) {
        st = pt_errorf(PT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        close(fd);
        remove(tmp);
        goto done;
    }
    uint8_t size_le[8];
    for (int i = 0; i < 8; i++) size_le[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(size_le, 1, 8, fp) == 8 && fwrite(hdr, 1, hlen, fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', fp) != EOF;
    uint16_t *buf = pt_malloc(CONVERT_CHUNK * sizeof *buf);
    for (int i = 0; ok && i < w->n; i++) ok = write_entry(fp, order[i], buf);
    free(buf);
    ok = ok && fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int saved = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    fp = NULL;
    if (!ok) {
        st = pt_errorf(PT_ERR_IO, "%s: write failed: %s", tmp, strerror(saved));
        remove(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = pt_errorf(PT_ERR_IO, "%s: cannot rename to %s: %s", tmp, path, strerror(errno));
        remove(tmp);
        goto done;
    }
    {
        char *dir = pt_strdup(path);
        char *slash = strrchr(dir, '/');
        if (!slash)
            strcpy(dir, ".");
        else if (slash == dir)
            dir[1] = '\0';
        else
            *slash = '\0';
        st = pt_fsync_dir(dir);
        free(dir);
    }
done:
    free(tmp);
    free(hdr);
    free(order);
    return st;
}
