/* core.c: errors, logging, allocation, timing, RNG and file helpers (see include/pt/core.h). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "pt/core.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char pt_err_buf[1024];
static int pt_log_rank = 0;
static int pt_log_world = 1;
static pt_abort_fn pt_abort_hook = NULL;

const char *pt_last_error(void) { return pt_err_buf; }

pt_status pt_errorf(pt_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pt_err_buf, sizeof pt_err_buf, fmt, ap);
    va_end(ap);
    return code;
}

void pt_log_set_rank(int rank, int world) {
    pt_log_rank = rank;
    pt_log_world = world;
}

static void pt_vlog(FILE *f, const char *level, const char *fmt, va_list ap) {
    char line[2048];
    vsnprintf(line, sizeof line, fmt, ap);
    if (pt_log_world > 1)
        fprintf(f, "[rank %d] %s%s\n", pt_log_rank, level, line);
    else
        fprintf(f, "%s%s\n", level, line);
    fflush(f);
}

void pt_log_info(const char *fmt, ...) {
    if (pt_log_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    pt_vlog(stdout, "", fmt, ap);
    va_end(ap);
}

void pt_log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pt_vlog(stderr, "warning: ", fmt, ap);
    va_end(ap);
}

void pt_log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pt_vlog(stderr, "error: ", fmt, ap);
    va_end(ap);
}

void pt_set_abort(pt_abort_fn fn) { pt_abort_hook = fn; }

const pt_guard_hooks *pt_guard_hooks_ = NULL;

void pt_guard_install(const pt_guard_hooks *hooks) { pt_guard_hooks_ = hooks; }

_Noreturn void pt_fatal(const char *file, int line, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "[rank %d] fatal: %s:%d: %s\n", pt_log_rank, file, line, msg);
    fflush(stderr);
    if (pt_abort_hook) pt_abort_hook(1);
    abort();
}

/* Allocations made by pentatron's code (every allocator below, and backends' own): a test holds
 * a training step's count to zero. */
static int64_t pt_allocs;

static _Thread_local int pt_allocs_paused;

void pt_count_alloc(void) {
    if (!pt_allocs_paused) __atomic_fetch_add(&pt_allocs, 1, __ATOMIC_RELAXED);
}

void pt_alloc_count_pause(int paused) { pt_allocs_paused = paused; }

int64_t pt_alloc_count(void) { return __atomic_load_n(&pt_allocs, __ATOMIC_RELAXED); }

void *pt_malloc(size_t bytes) {
    pt_count_alloc();
    void *p = malloc(bytes ? bytes : 1);
    PT_ASSERTF(p != NULL, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *pt_calloc(size_t n, size_t size) {
    pt_count_alloc();
    void *p = calloc(n ? n : 1, size ? size : 1);
    PT_ASSERTF(p != NULL, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

/* Large blocks are mapped: zero pages the kernel provides on first touch, so that memory is
 * committed only as it is used and a set-up can be measured against training.memory_limit before
 * its buffers are written. A 64-byte header before every block says how it was made. */
enum { PT_MAP_MIN = 1 << 20, PT_HDR = 64 };
typedef struct {
    size_t mapped; /* bytes of the mapping, 0: from aligned_alloc */
} pt_block_hdr;

void *pt_alloc_aligned(size_t bytes) {
    size_t rounded = (bytes + 63) & ~(size_t)63;
    pt_count_alloc();
    char *p;
    if (rounded >= PT_MAP_MIN) {
        size_t len = rounded + PT_HDR;
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        PT_ASSERTF(p != MAP_FAILED, "out of memory mapping %zu bytes: %s", bytes, strerror(errno));
        ((pt_block_hdr *)p)->mapped = len;
    } else {
        p = aligned_alloc(64, rounded + PT_HDR);
        PT_ASSERTF(p != NULL, "out of memory allocating %zu bytes", bytes);
        memset(p, 0, rounded + PT_HDR);
    }
    return p + PT_HDR;
}

void pt_free_aligned(void *ptr) {
    if (!ptr) return;
    char *p = (char *)ptr - PT_HDR;
    size_t mapped = ((pt_block_hdr *)p)->mapped;
    if (mapped)
        munmap(p, mapped);
    else
        free(p);
}

void *pt_realloc(void *p, size_t bytes) {
    pt_count_alloc();
    void *q = realloc(p, bytes ? bytes : 1);
    PT_ASSERTF(q != NULL, "out of memory reallocating %zu bytes", bytes);
    return q;
}

char *pt_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = pt_malloc(n);
    memcpy(d, s, n);
    return d;
}

int pt_all_finite(const float *x, size_t n) {
    /* x − x is 0 for a finite x and NaN for inf or NaN: one branch-free pass */
    float acc = 0.0f;
    for (size_t i = 0; i < n; i++) acc += x[i] - x[i];
    return acc == 0.0f;
}

double pt_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int64_t pt_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    int64_t kb = -1;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            kb = strtoll(line + klen, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb;
}

int64_t pt_peak_rss_bytes(void) { return pt_status_kb("VmHWM:") * 1024; }
int64_t pt_rss_bytes(void) { return pt_status_kb("VmRSS:") * 1024; }

static uint64_t pt_splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void pt_rng_seed(pt_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = pt_splitmix64(&seed);
}

static inline uint64_t pt_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

uint64_t pt_rng_next(pt_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = pt_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = pt_rotl(s[3], 45);
    return result;
}

float pt_rng_uniform(pt_rng *r) { return (float)((pt_rng_next(r) >> 40) * (1.0 / 16777216.0)); }

float pt_rng_normal(pt_rng *r) {
    /* Box-Muller in double from two 53-bit uniforms; u1 in (0,1]. */
    double u1 = ((pt_rng_next(r) >> 11) + 1) * (1.0 / 9007199254740992.0);
    double u2 = (pt_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

pt_status pt_read_file(const char *path, char **data, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return pt_errorf(PT_ERR_IO, "%s: cannot seek", path);
    }
    long n = ftell(f);
    if (n < 0) {
        fclose(f);
        return pt_errorf(PT_ERR_IO, "%s: cannot tell size", path);
    }
    rewind(f);
    char *buf = pt_malloc((size_t)n + 1);
    if (n > 0 && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        return pt_errorf(PT_ERR_IO, "%s: short read", path);
    }
    fclose(f);
    buf[n] = 0;
    *data = buf;
    *len = (size_t)n;
    return PT_OK;
}

pt_status pt_fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return pt_errorf(PT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    if (rc != 0) return pt_errorf(PT_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
    return PT_OK;
}

static void pt_dirname(const char *path, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(out, cap, ".");
    else if (slash == out)
        out[1] = 0;
    else
        *slash = 0;
}

pt_status pt_refuse_link(const char *path) {
    struct stat sb;
    if (lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
        return pt_errorf(PT_ERR_IO, "%s: a symbolic link: outputs are never written through a "
                         "link (remove it, or write elsewhere)", path);
    return PT_OK;
}

pt_status pt_create_file(const char *path, int *fd) {
    struct stat sb;
    *fd = -1;
    PT_TRY(pt_refuse_link(path));
    if (lstat(path, &sb) == 0) {
        if (!S_ISREG(sb.st_mode))
            return pt_errorf(PT_ERR_IO, "%s: exists and is not a regular file: not replaced", path);
        /* (unlink removes the entry itself; a link swapped in meanwhile fails O_EXCL below) */
        if (unlink(path) != 0 && errno != ENOENT)
            return pt_errorf(PT_ERR_IO, "%s: cannot remove the stale file: %s", path, strerror(errno));
    }
    *fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644); /* (RDWR: mappable) */
    if (*fd < 0)
        return pt_errorf(PT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    return PT_OK;
}

pt_status pt_write_file_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096], dir[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    PT_TRY(pt_refuse_link(path)); /* rename would replace the link: refused rather than hidden */
    int fd;
    PT_TRY(pt_create_file(tmp, &fd));
    const char *p = data;
    size_t left = len;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0) {
            if (errno == EINTR) continue;
            close(fd);
            unlink(tmp);
            return pt_errorf(PT_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        }
        p += w;
        left -= (size_t)w;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        unlink(tmp);
        return pt_errorf(PT_ERR_IO, "%s: fsync/close failed: %s", tmp, strerror(errno));
    }
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return pt_errorf(PT_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    }
    pt_dirname(path, dir, sizeof dir);
    return pt_fsync_dir(dir);
}

pt_status pt_mkdirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return pt_errorf(PT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return pt_errorf(PT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
    return PT_OK;
}

/* What a file of this mode is, for messages ("a FIFO"); NULL for a regular file. */
static const char *pt_file_kind(mode_t mode) {
    if (S_ISREG(mode)) return NULL;
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

pt_status pt_open_regular(const char *path, const char *what, int *fd) {
    *fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (*fd < 0) return pt_errorf(PT_ERR_IO, "%s: cannot open %s: %s", path, what, strerror(errno));
    struct stat sb;
    const char *kind = fstat(*fd, &sb) != 0 ? "a file that cannot be examined" : pt_file_kind(sb.st_mode);
    if (kind) {
        close(*fd);
        *fd = -1;
        return pt_errorf(PT_ERR_IO, "%s: the %s is %s, not a regular file", path, what, kind);
    }
    /* reads of a regular file never block; the flag only kept a FIFO's open from waiting */
    fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK);
    return PT_OK;
}

pt_status pt_check_output(const char *path, int dir, const char *what) {
    struct stat sb;
    if (stat(path, &sb) != 0) return PT_OK; /* absent (or beyond reach: its writer says why) */
    if (dir ? S_ISDIR(sb.st_mode) : S_ISREG(sb.st_mode)) return PT_OK;
    const char *kind = S_ISREG(sb.st_mode) ? "a regular file" : pt_file_kind(sb.st_mode);
    return pt_errorf(PT_ERR_IO, "%s: %s is %s, not a %s", what, path, kind,
                     dir ? "directory" : "regular file");
}

pt_status pt_open_append(const char *path, const char *what, int *fd) {
    *fd = -1;
    PT_TRY(pt_check_output(path, 0, what));
    /* without blocking: a FIFO put there since fails (ENXIO) or is refused below, never waited on */
    *fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (*fd < 0)
        return pt_errorf(PT_ERR_IO, "%s: cannot open %s for appending: %s", what, path, strerror(errno));
    struct stat sb;
    const char *kind = fstat(*fd, &sb) != 0 ? "a file that cannot be examined" : pt_file_kind(sb.st_mode);
    if (kind) {
        close(*fd);
        *fd = -1;
        return pt_errorf(PT_ERR_IO, "%s: %s is %s, not a regular file", what, path, kind);
    }
    fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) & ~O_NONBLOCK); /* a regular file's writes: as usual */
    return PT_OK;
}

pt_status pt_check_writable_dir(const char *dir, const char *what) {
    PT_TRY(pt_check_output(dir, 1, what)); /* a FIFO or a file there: named, not "not writable" */
    if (pt_mkdirs(dir) != PT_OK) {
        char why[1024]; /* pt_mkdirs's message, copied out of the buffer pt_errorf writes */
        snprintf(why, sizeof why, "%s", pt_last_error());
        return pt_errorf(PT_ERR_IO, "%s: %s", what, why);
    }
    char host[64] = "", path[4096];
    gethostname(host, sizeof host - 1);
    int n = snprintf(path, sizeof path, "%s/.pentatron-probe-%s-%ld", dir, host, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof path)
        return pt_errorf(PT_ERR_IO, "%s: the path is too long (%zu characters)", what, strlen(dir));
    int fd;
    if (pt_create_file(path, &fd) != PT_OK) { /* (a link at the probe's name is refused) */
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_last_error());
        return pt_errorf(PT_ERR_IO, "%s = %s is not writable: %s", what, dir, why);
    }
    char byte = 0;
    int err = write(fd, &byte, 1) != 1 ? errno : 0;
    if (close(fd) != 0 && !err) err = errno;
    unlink(path);
    if (err) return pt_errorf(PT_ERR_IO, "%s = %s: a test write failed: %s", what, dir, strerror(err));
    return PT_OK;
}

int pt_max_threads(void) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (cores <= 0) cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return 4 * (cores > 0 ? cores : 1);
}
