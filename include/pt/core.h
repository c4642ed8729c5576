/* core.h: errors, logging, assertions, timing and small helpers used by every module.
 *
 * Two tiers of errors (see docs/architecture.md):
 *   - bugs and broken invariants: PT_ASSERT aborts the whole job with file:line (and, once the
 *     runtime is distributed, the rank) so that no rank is left waiting in a collective;
 *   - recoverable conditions (bad config, missing file, corrupt checkpoint): functions return
 *     pt_status and leave a message in pt_err_buf naming the file, the field and what was expected.
 */
#ifndef PT_CORE_H
#define PT_CORE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus /* the CUDA backend's .cu files include this header */
extern "C" {
#endif

typedef enum {
    PT_OK = 0,
    PT_ERR_IO,       /* a file could not be opened, read or written */
    PT_ERR_FORMAT,   /* a file's contents are malformed or lie about themselves */
    PT_ERR_CONFIG,   /* a config key, value or layout is invalid */
    PT_ERR_MEMORY,   /* an allocation failed */
    PT_ERR_RUNTIME,  /* a library call failed at run time */
    PT_ERR_DIVERGED, /* training diverged: a step's loss or gradient norm is not finite */
} pt_status;

/* Errors every rank of a job reaches alike (the same config; the same loss and gradient norm,
 * sums over the ranks): reported once, by rank 0, and no rank needs to abort the others. */
static inline int pt_status_agreed(pt_status st) {
    return st == PT_ERR_CONFIG || st == PT_ERR_DIVERGED;
}

/* The last error message of this thread (set by pt_errorf, read by callers that print it). */
const char *pt_last_error(void);
/* Formats the message into the error buffer and returns `code`, so that `return pt_errorf(...)` reads well. */
pt_status pt_errorf(pt_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Logging: rank 0 prints info; everyone prints warnings and errors with a rank prefix. */
void pt_log_set_rank(int rank, int world);
void pt_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pt_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pt_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Aborts the job. Replaced by the distributed runtime with one that calls MPI_Abort. */
typedef void (*pt_abort_fn)(int code);
void pt_set_abort(pt_abort_fn fn);
void pt_fatal(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));

#define PT_ASSERT(cond)                                                                        \
    do {                                                                                       \
        if (!(cond)) pt_fatal(__FILE__, __LINE__, "assertion failed: %s", #cond);              \
    } while (0)
#define PT_ASSERTF(cond, ...)                                                                  \
    do {                                                                                       \
        if (!(cond)) pt_fatal(__FILE__, __LINE__, __VA_ARGS__);                                \
    } while (0)
/* Propagates a non-OK pt_status to the caller. */
#define PT_TRY(expr)                                                                           \
    do {                                                                                       \
        pt_status pt_try_status_ = (expr);                                                     \
        if (pt_try_status_ != PT_OK) return pt_try_status_;                                    \
    } while (0)

/* Checked allocation: aborts on failure (allocations happen at set-up, never per step). */
void *pt_malloc(size_t bytes);
void *pt_calloc(size_t n, size_t size);
/* 64-byte aligned, zeroed; free with pt_free_aligned. */
void *pt_alloc_aligned(size_t bytes);
void pt_free_aligned(void *p);
void *pt_realloc(void *p, size_t bytes);
/* Allocations made so far by pentatron's code (the allocators above and the backends'); an
 * allocator of its own calls pt_count_alloc. Steps allocate nothing: tests hold them to zero. */
int64_t pt_alloc_count(void);
/* On the calling thread, allocations stop (1) or resume (0) being counted: a background
 * checkpoint writer's belong to the save, not to the training step they overlap. */
void pt_alloc_count_pause(int paused);
void pt_count_alloc(void);
char *pt_strdup(const char *s);

/* The backend-memory guard (src/backend/cpu/guard.c, a test facility): memory from a guarded
 * backend's alloc is inaccessible except while a hold is taken. Every guarded backend call holds
 * around itself; the comm layer holds from the start of an operation on guarded memory until its
 * request completes. Holds nest and are process-wide. Without a guard installed these are one
 * branch each and do nothing. */
typedef struct {
    void (*hold)(void);
    void (*release)(void);
    int (*covers)(const void *p); /* 1 when p lies in guarded memory */
} pt_guard_hooks;
void pt_guard_install(const pt_guard_hooks *hooks); /* NULL uninstalls */
extern const pt_guard_hooks *pt_guard_hooks_;
static inline void pt_guard_hold(void) {
    if (pt_guard_hooks_) pt_guard_hooks_->hold();
}
static inline void pt_guard_release(void) {
    if (pt_guard_hooks_) pt_guard_hooks_->release();
}
static inline int pt_guard_covers(const void *p) {
    return pt_guard_hooks_ && p && pt_guard_hooks_->covers(p);
}

/* bf16 = the upper 16 bits of an IEEE fp32, rounded to nearest even: fp32's sign and 8-bit
 * exponent (so the same range), 8 significant bits (relative precision 2^-8). */
typedef uint16_t pt_bf16;

/* fp32 -> bf16, round to nearest, ties to even, denormals rounded like any other value (no
 * flush); a finite value beyond the largest bf16 becomes ±inf, ±inf stays, NaN stays NaN (made
 * quiet, sign and the upper payload kept). The one scalar definition: the CPU backend's vector
 * conversion and the safetensors writer give bitwise these results. */
static inline pt_bf16 pt_bf16_round(float x) {
    union {
        float f;
        uint32_t u;
    } v = {x};
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return (pt_bf16)((v.u >> 16) | 0x0040u);
    /* Adding 0x7fff plus the lowest kept bit rounds to nearest, ties to even; a carry out of the
     * mantissa bumps the exponent, which is the correct rounding (up to infinity at the top). */
    v.u += 0x7fffu + ((v.u >> 16) & 1u);
    return (pt_bf16)(v.u >> 16);
}
/* bf16 -> fp32, exact. */
static inline float pt_bf16_to_float(pt_bf16 h) {
    union {
        uint32_t u;
        float f;
    } v = {(uint32_t)h << 16};
    return v.f;
}

double pt_now(void);                    /* monotonic seconds */
/* Whether every one of x[0..n) is finite (host memory): checkpoints are checked with it. */
int pt_all_finite(const float *x, size_t n);
int64_t pt_peak_rss_bytes(void);        /* peak resident set size of this process */
int64_t pt_rss_bytes(void);             /* current resident set size */

/* Deterministic RNG (splitmix64 seeding xoshiro256**): the same on every platform. */
typedef struct {
    uint64_t s[4];
} pt_rng;
void pt_rng_seed(pt_rng *r, uint64_t seed);
uint64_t pt_rng_next(pt_rng *r);
float pt_rng_uniform(pt_rng *r);        /* [0, 1) */
float pt_rng_normal(pt_rng *r);         /* standard normal, Box-Muller */

/* Whole-file helpers. pt_read_file returns PT_ERR_IO with the path in the message. */
pt_status pt_read_file(const char *path, char **data, size_t *len);
/* Writes atomically: PATH.tmp (pt_create_file), fsync, rename, fsync of the directory. PATH a
 * symbolic link is refused (pt_refuse_link). */
pt_status pt_write_file_atomic(const char *path, const void *data, size_t len);
/* Creates path for reading and writing (O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW, mode 0644) into *fd: a regular file
 * already there (a temporary a crashed write left) is unlinked first; a symbolic link or anything
 * else there is refused, PT_ERR_IO naming it. An output is never written through a link. */
pt_status pt_create_file(const char *path, int *fd);
/* PT_ERR_IO naming path when it is a symbolic link (where an output is to be written: neither
 * written through nor silently replaced); PT_OK otherwise, absent included. */
pt_status pt_refuse_link(const char *path);
pt_status pt_fsync_dir(const char *dir);
pt_status pt_mkdirs(const char *path);
/* Opens path read-only without blocking on a FIFO and refuses anything but a regular file (a
 * directory, a FIFO, a device such as /dev/zero): PT_ERR_IO naming path, `what` and its kind. */
pt_status pt_open_regular(const char *path, const char *what, int *fd);
/* Where an output will be written: PT_OK when path is absent or of the kind written there (a
 * regular file; a directory when dir = 1), else PT_ERR_IO "WHAT: PATH is a FIFO, not a regular
 * file" (an open would wait on a FIFO, a device such as /dev/null or /dev/full would take or
 * refuse the bytes, a rename would replace either). `what` names the key or option. */
pt_status pt_check_output(const char *path, int dir, const char *what);
/* Opens path for appending (made if missing, 0644) without ever blocking and never through a
 * symbolic link (O_NOFOLLOW), after pt_check_output; anything but a regular file there is refused
 * with its message. */
pt_status pt_open_append(const char *path, const char *what, int *fd);
/* PT_ERR_IO unless a file can be created in dir (made if missing; pt_check_output first): a probe
 * file is written, flushed and removed. `what` names the setting in the message (e.g.
 * "checkpoint.dir"). */
pt_status pt_check_writable_dir(const char *dir, const char *what);
/* The most compute threads a process may ask for: 4 × the cores it may run on. */
int pt_max_threads(void);

#ifdef __cplusplus
}
#endif

#endif
