/* arena.c: first-fit allocation over offsets (see arena.h). Both span lists are sorted arrays:
 * a run holds a few hundred pieces, so a linear scan costs less than the kernels it feeds, and
 * nothing here allocates after pt_arena_init. */
#include "backend/cuda/arena.h"

#include <stdlib.h>
#include <string.h>

#include "pt/core.h"

void pt_arena_init(pt_cuda_arena *a, size_t size, int max_spans) {
    memset(a, 0, sizeof *a);
    a->size = size / PT_ARENA_ALIGN * PT_ARENA_ALIGN;
    /* n pieces out leave at most n + 1 free spans between them */
    a->cap_used = max_spans;
    a->cap_free = max_spans + 1;
    a->free = pt_calloc((size_t)a->cap_free, sizeof *a->free);
    a->used = pt_calloc((size_t)max_spans, sizeof *a->used);
    if (a->size) a->free[a->n_free++] = (pt_arena_span){0, a->size};
}

void pt_arena_destroy(pt_cuda_arena *a) {
    free(a->free);
    free(a->used);
    memset(a, 0, sizeof *a);
}

static void span_insert(pt_arena_span *v, int *n, int at, pt_arena_span s) {
    memmove(v + at + 1, v + at, (size_t)(*n - at) * sizeof *v);
    v[at] = s;
    (*n)++;
}
static void span_remove(pt_arena_span *v, int *n, int at) {
    memmove(v + at, v + at + 1, (size_t)(*n - at - 1) * sizeof *v);
    (*n)--;
}
/* the index of the first span with offset >= off */
static int span_lower(const pt_arena_span *v, int n, size_t off) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (v[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

size_t pt_arena_alloc(pt_cuda_arena *a, size_t bytes) {
    if (bytes > a->size) return SIZE_MAX;
    size_t len = bytes ? (bytes + PT_ARENA_ALIGN - 1) / PT_ARENA_ALIGN * PT_ARENA_ALIGN
                       : PT_ARENA_ALIGN;
    if (a->n_used == a->cap_used) return SIZE_MAX;
    for (int i = 0; i < a->n_free; i++) {
        pt_arena_span *f = &a->free[i];
        if (f->len < len) continue;
        size_t off = f->off;
        if (f->len == len)
            span_remove(a->free, &a->n_free, i);
        else
            *f = (pt_arena_span){f->off + len, f->len - len};
        span_insert(a->used, &a->n_used, span_lower(a->used, a->n_used, off),
                    (pt_arena_span){off, len});
        a->in_use += len;
        if (a->in_use > a->peak) a->peak = a->in_use;
        return off;
    }
    return SIZE_MAX;
}

int pt_arena_free(pt_cuda_arena *a, size_t off) {
    int u = span_lower(a->used, a->n_used, off);
    if (u == a->n_used || a->used[u].off != off) return 0;
    size_t len = a->used[u].len;
    span_remove(a->used, &a->n_used, u);
    a->in_use -= len;
    /* merge with the free neighbours; a free list of n pieces never needs more than n + 1 spans */
    int i = span_lower(a->free, a->n_free, off);
    int left = i > 0 && a->free[i - 1].off + a->free[i - 1].len == off;
    int right = i < a->n_free && off + len == a->free[i].off;
    if (left && right) {
        a->free[i - 1].len += len + a->free[i].len;
        span_remove(a->free, &a->n_free, i);
    } else if (left) {
        a->free[i - 1].len += len;
    } else if (right) {
        a->free[i].off = off;
        a->free[i].len += len;
    } else {
        PT_ASSERT(a->n_free < a->cap_free);
        span_insert(a->free, &a->n_free, i, (pt_arena_span){off, len});
    }
    return 1;
}

size_t pt_arena_len(const pt_cuda_arena *a, size_t off) {
    int u = span_lower(a->used, a->n_used, off);
    return u < a->n_used && a->used[u].off == off ? a->used[u].len : 0;
}

size_t pt_arena_largest_free(const pt_cuda_arena *a) {
    size_t best = 0;
    for (int i = 0; i < a->n_free; i++)
        if (a->free[i].len > best) best = a->free[i].len;
    return best;
}
