/* arena.h: the CUDA backend's device-memory allocator, as host logic over offsets.
 *
 * The backend takes one region of device memory at set-up (one cudaMalloc) and hands out pieces
 * of it: alloc and free never call CUDA, so no step allocates or synchronises, however the model
 * grows its buffers. The arena itself is plain C over offsets into [0, size): first fit over a
 * free list kept sorted by offset, neighbours merged on free, every piece aligned to
 * PT_ARENA_ALIGN. It runs (and is tested) on any host, GPU or not.
 */
#ifndef PT_CUDA_ARENA_H
#define PT_CUDA_ARENA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { PT_ARENA_ALIGN = 256 }; /* cuBLASLt and vector loads want 16; 256 keeps rows apart */

typedef struct {
    size_t off, len;
} pt_arena_span;

typedef struct {
    size_t size;            /* bytes in the region */
    pt_arena_span *free;    /* free spans sorted by offset, none adjacent */
    int n_free, cap_free;
    pt_arena_span *used;    /* spans handed out, sorted by offset */
    int n_used, cap_used;
    size_t in_use, peak;    /* bytes handed out now, and the most ever */
} pt_cuda_arena;

/* The arena over [0, size); its bookkeeping arrays hold `max_spans` spans each (allocated here,
 * at set-up). */
void pt_arena_init(pt_cuda_arena *a, size_t size, int max_spans);
void pt_arena_destroy(pt_cuda_arena *a);
/* The offset of a piece of `bytes` (rounded up to PT_ARENA_ALIGN; 0 bytes takes one unit), or
 * SIZE_MAX when no free span is large enough or the bookkeeping is full. */
size_t pt_arena_alloc(pt_cuda_arena *a, size_t bytes);
/* Returns the piece at `off` (from pt_arena_alloc); 0 when off is not a piece handed out (a bug
 * the caller reports). */
int pt_arena_free(pt_cuda_arena *a, size_t off);
/* The length of the piece at `off`, 0 when none. */
size_t pt_arena_len(const pt_cuda_arena *a, size_t off);
/* The largest piece that could be handed out now. */
size_t pt_arena_largest_free(const pt_cuda_arena *a);

#ifdef __cplusplus
}
#endif

#endif
