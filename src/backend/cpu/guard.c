/* guard.c: the guarded backend, a test facility (PT_BACKEND_GUARD=1, see pt_backend_guard in
 * include/pt/backend.h) that proves the architecture rule "nothing outside the backend reads or
 * writes backend memory, except the comm layer handing it to the network".
 *
 * Every guarded backend owns one reserved region of address space (PROT_NONE, no swap reserved)
 * from which alloc hands out page-aligned, zeroed blocks. The used prefix of every region is
 * PROT_READ|PROT_WRITE while at least one hold is taken (pt_guard_hold in core.h) and PROT_NONE
 * otherwise, one mprotect per region each way: a stray access from host code faults (SIGSEGV) at
 * the offending instruction. Each slot of the wrapper takes a hold around the inner backend's
 * call; the comm layer takes one from the start of an operation on guarded memory until its
 * request completes. The count is process-wide (mprotect is), so OpenMP threads inside a kernel
 * run while the region is open.
 *
 * Freed blocks return their pages to the system (MADV_DONTNEED, so they read zero when reused)
 * and go on a free list (first fit, coalesced); a freed block at the end of the used prefix
 * shrinks it.
 *
 * Report mode (pt_backend_guard_report, PT_BACKEND_GUARD=report) is for finding every offender in
 * one run: a SIGSEGV handler prints each faulting instruction (with its three callers) once, with
 * a backtrace whose frames read `binary+0xOFFSET` (for addr2line -f -i -e binary 0xOFFSET), opens
 * the faulting page and lets the access proceed; the next release closes it again. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "pt/backend.h"

/* Every function slot of pt_backend is wrapped below: a slot added to backend.h must be too.
 * (name, ctx, then n_threads and bf16_native sharing a word, link) */
_Static_assert(sizeof(pt_backend) == 4 * sizeof(void *) + 34 * sizeof(void (*)(void)),
               "pt_backend gained or lost a slot: wrap it in src/backend/cpu/guard.c");

#define PT_GUARD_RESERVE ((size_t)16 << 30) /* address space per guarded backend */

typedef struct {
    size_t off, size;
} pt_guard_span;

typedef struct {
    pt_guard_span *v;
    size_t n, cap;
} pt_guard_spans;

typedef struct pt_guard_region {
    char *base;
    size_t reserved;
    size_t used;          /* the prefix handed out (a page multiple) */
    pt_guard_spans live;  /* blocks handed out */
    pt_guard_spans avail; /* freed blocks inside the prefix, sorted by offset, coalesced */
    struct pt_guard_region *next;
} pt_guard_region;

typedef struct {
    pt_backend *inner;
    pt_guard_region *region;
    pt_device_link link; /* offered with PT_BACKEND_GUARD_LINK=1 */
    char desc[512];
} pt_guard_ctx;

/* Process-wide state: every guarded region opens and closes together. */
static pthread_mutex_t pt_guard_mu = PTHREAD_MUTEX_INITIALIZER;
static long pt_guard_holds;
static pt_guard_region *pt_guard_regions;
static size_t pt_guard_page;

static void pt_guard_protect(char *p, size_t n, int prot) {
    if (n == 0) return;
    if (mprotect(p, n, prot) != 0)
        pt_fatal(__FILE__, __LINE__, "guard: mprotect(%p, %zu, %d) failed: %s", (void *)p, n, prot,
                 strerror(errno));
}

static void pt_guard_hold_impl(void) {
    pthread_mutex_lock(&pt_guard_mu);
    if (pt_guard_holds++ == 0)
        for (pt_guard_region *r = pt_guard_regions; r; r = r->next)
            pt_guard_protect(r->base, r->used, PROT_READ | PROT_WRITE);
    pthread_mutex_unlock(&pt_guard_mu);
}

static void pt_guard_release_impl(void) {
    pthread_mutex_lock(&pt_guard_mu);
    PT_ASSERTF(pt_guard_holds > 0, "guard: pt_guard_release without a hold");
    if (--pt_guard_holds == 0)
        for (pt_guard_region *r = pt_guard_regions; r; r = r->next)
            pt_guard_protect(r->base, r->used, PROT_NONE);
    pthread_mutex_unlock(&pt_guard_mu);
}

static int pt_guard_covers_impl(const void *p) {
    int in = 0;
    pthread_mutex_lock(&pt_guard_mu);
    for (pt_guard_region *r = pt_guard_regions; r && !in; r = r->next)
        in = (const char *)p >= r->base && (const char *)p < r->base + r->reserved;
    pthread_mutex_unlock(&pt_guard_mu);
    return in;
}

static const pt_guard_hooks pt_guard_hooks_impl = {
    .hold = pt_guard_hold_impl,
    .release = pt_guard_release_impl,
    .covers = pt_guard_covers_impl,
};

/* Report mode: the SIGSEGV handler. Not strictly async-signal-safe (snprintf, dladdr,
 * backtrace): a diagnostic that runs on the faulting thread of a process that was about to die. */
static struct sigaction pt_guard_prev_segv;
static int pt_guard_fd = 2;
static uintptr_t pt_guard_seen[512];
static int pt_guard_n_seen;

typedef struct {
    char text[4096];
    int n;
} pt_guard_msg;

static void pt_guard_say(pt_guard_msg *m, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void pt_guard_say(pt_guard_msg *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(m->text + m->n, sizeof m->text - (size_t)m->n, fmt, ap);
    va_end(ap);
    if (n > 0) m->n = m->n + n < (int)sizeof m->text ? m->n + n : (int)sizeof m->text - 1;
}

static void pt_guard_segv(int sig, siginfo_t *si, void *ucv) {
    char *a = si->si_addr;
    pt_guard_region *r = pt_guard_regions;
    while (r && !(a >= r->base && a < r->base + r->used)) r = r->next;
    if (!r) { /* not ours: the previous handler, or the default action on return */
        if (pt_guard_prev_segv.sa_flags & SA_SIGINFO && pt_guard_prev_segv.sa_sigaction) {
            pt_guard_prev_segv.sa_sigaction(sig, si, ucv);
        } else if (pt_guard_prev_segv.sa_handler != SIG_DFL &&
                   pt_guard_prev_segv.sa_handler != SIG_IGN) {
            pt_guard_prev_segv.sa_handler(sig);
        } else {
            signal(SIGSEGV, SIG_DFL);
        }
        return;
    }
    void *pc = NULL;
#if defined(__x86_64__)
    pc = (void *)((ucontext_t *)ucv)->uc_mcontext.gregs[REG_RIP];
#elif defined(__aarch64__)
    pc = (void *)((ucontext_t *)ucv)->uc_mcontext.pc;
#endif
    /* once per faulting instruction and its three callers */
    void *frames[32];
    int n = backtrace(frames, 32), at = 0;
    while (at < n && frames[at] != pc) at++; /* skip the handler's frames */
    if (at == n) at = 1;
    uintptr_t key = 0;
    for (int i = at; i < n && i < at + 4; i++) key = key * 1000003u + (uintptr_t)frames[i];
    int seen = 0;
    for (int i = 0; i < pt_guard_n_seen && !seen; i++) seen = pt_guard_seen[i] == key;
    if (!seen && pt_guard_n_seen < (int)(sizeof pt_guard_seen / sizeof *pt_guard_seen)) {
        pt_guard_seen[pt_guard_n_seen++] = key;
        size_t off = (size_t)(a - r->base), blk = 0, blk_size = 0;
        for (size_t i = 0; i < r->live.n; i++)
            if (off >= r->live.v[i].off && off < r->live.v[i].off + r->live.v[i].size)
                blk = r->live.v[i].off, blk_size = r->live.v[i].size;
        pt_guard_msg msg = {.n = 0};
        pt_guard_say(&msg,
                     "guard: stray access to backend memory %p (byte %zu of a block of %zu bytes) "
                     "outside any backend call, holds %ld, pid %d:\n",
                     (void *)a, off - blk, blk_size, pt_guard_holds, (int)getpid());
        for (int i = at; i < n; i++) {
            Dl_info info;
            if (dladdr(frames[i], &info) && info.dli_fname) {
                /* a return address points after its call: -1 names the calling line */
                uintptr_t o = (uintptr_t)frames[i] - (uintptr_t)info.dli_fbase - (frames[i] != pc);
                pt_guard_say(&msg, "  #%d %s+0x%lx (%s)\n", i - at, info.dli_fname,
                             (unsigned long)o, info.dli_sname ? info.dli_sname : "?");
            } else {
                pt_guard_say(&msg, "  #%d %p\n", i - at, frames[i]);
            }
        }
        if (write(pt_guard_fd, msg.text, (size_t)msg.n) < 0) { /* one write: reports stay whole */
        }
    }
    /* open the page and retry the access; the next release closes it again */
    char *page = (char *)((uintptr_t)a & ~(uintptr_t)(pt_guard_page - 1));
    if (mprotect(page, pt_guard_page, PROT_READ | PROT_WRITE) != 0) signal(SIGSEGV, SIG_DFL);
}

void pt_backend_guard_report(const char *log_path) {
    if (log_path && *log_path && pt_guard_fd == 2) {
        int fd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0)
            pt_guard_fd = fd;
        else
            pt_log_warn("guard: cannot open %s: %s (reporting on stderr)", log_path,
                        strerror(errno));
    }
    struct sigaction sa;
    sigaction(SIGSEGV, NULL, &sa);
    if ((sa.sa_flags & SA_SIGINFO) && sa.sa_sigaction == pt_guard_segv) return;
    void *warm[2];
    backtrace(warm, 2); /* loads libgcc now rather than in the handler */
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = pt_guard_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &pt_guard_prev_segv);
}

static void pt_spans_insert(pt_guard_spans *s, size_t at, pt_guard_span x) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->v = realloc(s->v, s->cap * sizeof *s->v);
        PT_ASSERTF(s->v != NULL, "guard: out of memory");
    }
    memmove(s->v + at + 1, s->v + at, (s->n - at) * sizeof *s->v);
    s->v[at] = x;
    s->n++;
}

static void pt_spans_remove(pt_guard_spans *s, size_t at) {
    memmove(s->v + at, s->v + at + 1, (s->n - at - 1) * sizeof *s->v);
    s->n--;
}

/* Called with the mutex held. */
static void *pt_region_alloc(pt_guard_region *r, size_t bytes) {
    size_t size = ((bytes ? bytes : 1) + pt_guard_page - 1) & ~(pt_guard_page - 1);
    size_t off = (size_t)-1;
    for (size_t i = 0; i < r->avail.n; i++) /* first fit among freed blocks (already zero) */
        if (r->avail.v[i].size >= size) {
            off = r->avail.v[i].off;
            r->avail.v[i].off += size;
            r->avail.v[i].size -= size;
            if (r->avail.v[i].size == 0) pt_spans_remove(&r->avail, i);
            break;
        }
    if (off == (size_t)-1) { /* fresh pages at the end of the prefix (never touched: zero) */
        PT_ASSERTF(size <= r->reserved - r->used,
                   "guard: allocating %zu bytes exceeds the %zu GiB reserved (%zu in use)", bytes,
                   r->reserved >> 30, r->used);
        off = r->used;
        r->used += size;
        if (pt_guard_holds > 0) pt_guard_protect(r->base + off, size, PROT_READ | PROT_WRITE);
    }
    pt_spans_insert(&r->live, r->live.n, (pt_guard_span){off, size});
    return r->base + off;
}

/* Called with the mutex held. */
static void pt_region_free(pt_guard_region *r, void *p) {
    size_t off = (size_t)((char *)p - r->base), i = r->live.n;
    while (i > 0 && r->live.v[i - 1].off != off) i--;
    PT_ASSERTF(i > 0 && (char *)p >= r->base, "guard: freeing %p, not a live block of this backend",
               p);
    pt_guard_span b = r->live.v[i - 1];
    pt_spans_remove(&r->live, i - 1);
    /* the pages go back to the system and read zero when handed out again */
    if (madvise(r->base + b.off, b.size, MADV_DONTNEED) != 0)
        pt_fatal(__FILE__, __LINE__, "guard: madvise failed: %s", strerror(errno));
    size_t at = 0;
    while (at < r->avail.n && r->avail.v[at].off < b.off) at++;
    if (at > 0 && r->avail.v[at - 1].off + r->avail.v[at - 1].size == b.off) { /* merge left */
        at--;
        b.off = r->avail.v[at].off;
        b.size += r->avail.v[at].size;
        pt_spans_remove(&r->avail, at);
    }
    if (at < r->avail.n && b.off + b.size == r->avail.v[at].off) { /* merge right */
        b.size += r->avail.v[at].size;
        pt_spans_remove(&r->avail, at);
    }
    if (b.off + b.size == r->used) { /* the end of the prefix: shrink it */
        if (pt_guard_holds > 0) pt_guard_protect(r->base + b.off, b.size, PROT_NONE);
        r->used = b.off;
    } else {
        pt_spans_insert(&r->avail, at, b);
    }
}

static pt_backend *pt_guard_inner(pt_backend *be) { return ((pt_guard_ctx *)be->ctx)->inner; }

static void *g_alloc(pt_backend *be, size_t bytes) {
    pt_guard_ctx *g = be->ctx;
    pt_count_alloc(); /* an allocator of its own (core.h) */
    pthread_mutex_lock(&pt_guard_mu);
    void *p = pt_region_alloc(g->region, bytes);
    pthread_mutex_unlock(&pt_guard_mu);
    return p;
}

static void g_free(pt_backend *be, void *p) {
    if (!p) return;
    pt_guard_ctx *g = be->ctx;
    pthread_mutex_lock(&pt_guard_mu);
    pt_region_free(g->region, p);
    pthread_mutex_unlock(&pt_guard_mu);
}

/* A slot: hold, the inner backend's call (through `in`), release. */
#define PT_GUARDED(call)                                                                           \
    do {                                                                                           \
        pt_backend *in = pt_guard_inner(be);                                                       \
        pt_guard_hold();                                                                           \
        call;                                                                                      \
        pt_guard_release();                                                                        \
    } while (0)

static void g_zero(pt_backend *be, void *p, size_t bytes) { PT_GUARDED(in->zero(in, p, bytes)); }
static void g_upload(pt_backend *be, void *dst, const void *src, size_t bytes) {
    PT_GUARDED(in->upload(in, dst, src, bytes));
}
static void g_download(pt_backend *be, void *dst, const void *src, size_t bytes) {
    PT_GUARDED(in->download(in, dst, src, bytes));
}
static void g_copy(pt_backend *be, void *dst, const void *src, size_t bytes) {
    PT_GUARDED(in->copy(in, dst, src, bytes));
}
static void g_synchronize(pt_backend *be) { PT_GUARDED(in->synchronize(in)); }

static void g_gemm(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K, float alpha,
                   const float *A, int lda, const float *B, int ldb, float beta, float *C,
                   int ldc) {
    PT_GUARDED(in->gemm(in, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc));
}
static void g_gemm_bf16(pt_backend *be, pt_trans ta, pt_trans tb, int M, int N, int K,
                        const pt_bf16 *A, int lda, const pt_bf16 *B, int ldb, float beta, float *C,
                        int ldc) {
    PT_GUARDED(in->gemm_bf16(in, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc));
}
static void g_to_bf16(pt_backend *be, pt_bf16 *dst, const float *src, size_t n) {
    PT_GUARDED(in->to_bf16(in, dst, src, n));
}
static void g_from_bf16(pt_backend *be, float *dst, const pt_bf16 *src, size_t n) {
    PT_GUARDED(in->from_bf16(in, dst, src, n));
}

static void g_embedding_forward(pt_backend *be, float *out, const int32_t *tokens,
                                const float *wte, int N, int C, int row0, int rows) {
    PT_GUARDED(in->embedding_forward(in, out, tokens, wte, N, C, row0, rows));
}

static void g_embedding_forward_bf16(pt_backend *be, pt_bf16 *out, const int32_t *tokens,
                                     const pt_bf16 *wte, int N, int C, int row0, int rows) {
    PT_GUARDED(in->embedding_forward_bf16(in, out, tokens, wte, N, C, row0, rows));
}
static void g_embedding_backward(pt_backend *be, float *dwte, const int32_t *tokens,
                                 const float *dout, int N, int C, int row0, int rows) {
    PT_GUARDED(in->embedding_backward(in, dwte, tokens, dout, N, C, row0, rows));
}

static void g_rmsnorm_forward(pt_backend *be, float *out, float *rstd, const float *inp,
                              const float *w, int N, int C, float eps) {
    PT_GUARDED(in->rmsnorm_forward(in, out, rstd, inp, w, N, C, eps));
}
static void g_rmsnorm_backward(pt_backend *be, float *dinp, float *dw, const float *dout,
                               const float *inp, const float *w, const float *rstd, int N, int C) {
    PT_GUARDED(in->rmsnorm_backward(in, dinp, dw, dout, inp, w, rstd, N, C));
}

static void g_rope(pt_backend *be, float *x, const int32_t *pos, int N, int n_heads, int head_dim,
                   int ld, const float *cos_tab, const float *sin_tab, int inverse) {
    PT_GUARDED(in->rope(in, x, pos, N, n_heads, head_dim, ld, cos_tab, sin_tab, inverse));
}

static void g_attention_forward(pt_backend *be, const pt_attn_shape *s, const float *q,
                                const float *k, const float *v, float *out, float *lse) {
    PT_GUARDED(in->attention_forward(in, s, q, k, v, out, lse));
}
static void g_attention_backward(pt_backend *be, const pt_attn_shape *s, const float *q,
                                 const float *k, const float *v, const float *out,
                                 const float *dout, const float *lse, float *dq, float *dk,
                                 float *dv) {
    PT_GUARDED(in->attention_backward(in, s, q, k, v, out, dout, lse, dq, dk, dv));
}
static void g_attention_merge(pt_backend *be, float *out_acc, float *lse_acc, const float *out_blk,
                              const float *lse_blk, int B, int T, int H, int head_dim, int ldo) {
    PT_GUARDED(in->attention_merge(in, out_acc, lse_acc, out_blk, lse_blk, B, T, H, head_dim, ldo));
}

static void g_swiglu_forward(pt_backend *be, float *h, const float *gu, int N, int F) {
    PT_GUARDED(in->swiglu_forward(in, h, gu, N, F));
}
static void g_swiglu_backward(pt_backend *be, float *dgu, const float *dh, const float *gu, int N,
                              int F) {
    PT_GUARDED(in->swiglu_backward(in, dgu, dh, gu, N, F));
}

static void g_softmax_xent(pt_backend *be, float *logits, float *losses, const int32_t *targets,
                           int n, int V, int ld, float dscale) {
    PT_GUARDED(in->softmax_xent(in, logits, losses, targets, n, V, ld, dscale));
}
static void g_xent_stats(pt_backend *be, const float *logits, const int32_t *targets, int n, int V,
                         int ld, int v0, float *stats) {
    PT_GUARDED(in->xent_stats(in, logits, targets, n, V, ld, v0, stats));
}
static void g_xent_grad(pt_backend *be, float *logits, const int32_t *targets, int n, int V, int ld,
                        int v0, const float *M, const float *S, float dscale) {
    PT_GUARDED(in->xent_grad(in, logits, targets, n, V, ld, v0, M, S, dscale));
}

static void g_rows_gather(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                          const float *scale, int n, int C) {
    PT_GUARDED(in->rows_gather(in, dst, src, idx, scale, n, C));
}
static void g_rows_copy(pt_backend *be, void *dst, const void *src, const int32_t *idx, int n,
                        size_t row_bytes) {
    PT_GUARDED(in->rows_copy(in, dst, src, idx, n, row_bytes));
}
static void g_rows_scatter_add(pt_backend *be, float *dst, const float *src, const int32_t *idx,
                               const float *scale, int n, int C) {
    PT_GUARDED(in->rows_scatter_add(in, dst, src, idx, scale, n, C));
}

static void g_rows_dot(pt_backend *be, double *out, const float *x, const int32_t *idx,
                       const float *y, int n, int C) {
    PT_GUARDED(in->rows_dot(in, out, x, idx, y, n, C));
}

static void g_add(pt_backend *be, float *y, const float *x, size_t n) {
    PT_GUARDED(in->add(in, y, x, n));
}
static double g_sumsq(pt_backend *be, const float *x, size_t n) {
    double r;
    PT_GUARDED(r = in->sumsq(in, x, n));
    return r;
}

static void g_adamw(pt_backend *be, float *p, const float *g, float *m, float *v, size_t n,
                    float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step,
                    float grad_scale) {
    PT_GUARDED(in->adamw(in, p, g, m, v, n, lr, beta1, beta2, eps, weight_decay, step, grad_scale));
}

static const char *g_describe(pt_backend *be) {
    pt_guard_ctx *g = be->ctx;
    snprintf(g->desc, sizeof g->desc, "%s, guarded (backend memory inaccessible outside backend "
             "calls and communication)", g->inner->describe(g->inner));
    return g->desc;
}

static void g_destroy(pt_backend *be) {
    pt_guard_ctx *g = be->ctx;
    pt_guard_region *r = g->region;
    pthread_mutex_lock(&pt_guard_mu);
    if (pt_guard_holds > 0) /* the guard was off since: a comm request never completed? */
        pt_log_warn("guard: backend destroyed with %ld hold(s) outstanding", pt_guard_holds);
    for (pt_guard_region **pp = &pt_guard_regions; *pp; pp = &(*pp)->next)
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    pthread_mutex_unlock(&pt_guard_mu);
    munmap(r->base, r->reserved);
    free(r->live.v);
    free(r->avail.v);
    free(r);
    g->inner->destroy(g->inner);
    free(g);
    free(be);
}

/* The device link of a guarded backend (PT_BACKEND_GUARD_LINK=1, include/pt/backend.h): its
 * memory is "device memory" to the comm layer, copied under a hold; the CPU backend runs every
 * call to its end, so there is nothing to order: a stream and an event are tokens, an event has
 * always happened. */
static int gl_owns(void *ctx, const void *p) {
    (void)ctx;
    return pt_guard_covers(p);
}
static void *gl_host_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return pt_malloc(bytes ? bytes : 1);
}
static void gl_host_free(void *ctx, void *p) {
    (void)ctx;
    free(p);
}
static void gl_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    pt_guard_hold();
    memcpy(dst, src, bytes);
    pt_guard_release();
}
static void gl_copy_on(void *ctx, void *dst, const void *src, size_t bytes, void *stream) {
    (void)stream;
    gl_copy(ctx, dst, src, bytes);
}
static void *gl_token(void *ctx) { return ctx; }
static void gl_token_free(void *ctx, void *t) { (void)ctx, (void)t; }
static void gl_record(void *ctx, void *ev, void *stream) { (void)ctx, (void)ev, (void)stream; }
static int gl_query(void *ctx, void *ev) {
    (void)ctx, (void)ev;
    return 1;
}

pt_backend *pt_backend_guard(pt_backend *inner) {
    if (!inner) return NULL;
    void *base = mmap(NULL, PT_GUARD_RESERVE, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED) {
        pt_errorf(PT_ERR_MEMORY, "guard: cannot reserve %zu GiB of address space: %s",
                  PT_GUARD_RESERVE >> 30, strerror(errno));
        inner->destroy(inner);
        return NULL;
    }
    pt_guard_region *r = pt_calloc(1, sizeof *r);
    r->base = base;
    r->reserved = PT_GUARD_RESERVE;
    pthread_mutex_lock(&pt_guard_mu);
    if (!pt_guard_page) pt_guard_page = (size_t)sysconf(_SC_PAGESIZE);
    r->next = pt_guard_regions;
    pt_guard_regions = r;
    pthread_mutex_unlock(&pt_guard_mu);
    pt_guard_install(&pt_guard_hooks_impl);

    pt_guard_ctx *g = pt_calloc(1, sizeof *g);
    g->inner = inner;
    g->region = r;
    g->link = (pt_device_link){.ctx = g, .stream = g, .owns = gl_owns,
                               .host_alloc = gl_host_alloc, .host_free = gl_host_free,
                               .to_host = gl_copy, .to_device = gl_copy, .stream_new = gl_token,
                               .stream_free = gl_token_free, .event_new = gl_token,
                               .event_free = gl_token_free, .event_record = gl_record,
                               .event_query = gl_query, .stream_wait = gl_record,
                               .copy = gl_copy_on};
    const char *want_link = getenv("PT_BACKEND_GUARD_LINK");
    pt_backend *be = pt_calloc(1, sizeof *be);
    *be = (pt_backend){
        .name = inner->name,
        .ctx = g,
        .n_threads = inner->n_threads,
        .bf16_native = inner->bf16_native,
        .alloc = g_alloc,
        .free = g_free,
        .zero = g_zero,
        .upload = g_upload,
        .download = g_download,
        .copy = g_copy,
        .synchronize = g_synchronize,
        .gemm = g_gemm,
        .gemm_bf16 = g_gemm_bf16,
        .to_bf16 = g_to_bf16,
        .from_bf16 = g_from_bf16,
        .embedding_forward = g_embedding_forward,
        .embedding_forward_bf16 = g_embedding_forward_bf16,
        .embedding_backward = g_embedding_backward,
        .rmsnorm_forward = g_rmsnorm_forward,
        .rmsnorm_backward = g_rmsnorm_backward,
        .rope = g_rope,
        .attention_forward = g_attention_forward,
        .attention_backward = g_attention_backward,
        .attention_merge = g_attention_merge,
        .swiglu_forward = g_swiglu_forward,
        .swiglu_backward = g_swiglu_backward,
        .softmax_xent = g_softmax_xent,
        .xent_stats = g_xent_stats,
        .xent_grad = g_xent_grad,
        .rows_gather = g_rows_gather,
        .rows_copy = g_rows_copy,
        .rows_scatter_add = g_rows_scatter_add,
        .rows_dot = g_rows_dot,
        .add = g_add,
        .sumsq = g_sumsq,
        .adamw = g_adamw,
        .describe = g_describe,
        .destroy = g_destroy,
    };
    if (want_link && atoi(want_link) > 0) be->link = &g->link;
    return be;
}
