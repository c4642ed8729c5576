/* measure.c: `pentatron plan --measure`: a hardware file (include/pt/plan.h) for the machine it
 * runs on, measured by the job's ranks together: the backend's GEMM peak and a grid of GEMM
 * shapes, a STREAM triad, the memory per rank, the hosts and ranks per host, ping-pongs
 * between two ranks of one host and of two hosts over the comm layer, the comm layer's
 * collectives within a host and across, and the ranks' skew (docs/plan.md, "The hardware
 * file"). */
#include "pt/plan.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pt/backend.h"
#include "pt/comm.h"
#include "pt/metrics.h"

enum { K_NAME, K_DPN, K_NODES, K_PEAK, K_EFF, K_MEM, K_MEMBW, K_INTRA_BW, K_INTRA_LAT, K_INTER_BW,
       K_INTER_LAT, K_SHAPES, K_UNITS, K_TILE_M, K_TILE_N, K_ATTN, K_XENT, K_INTRA_OV, K_INTER_OV,
       K_INTRA_RV, K_INTER_RV, K_COLLS, K_SKEW };

static char pt_how[PT_HW_N_KEYS][200];

static int pt_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pt_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, pt_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The shortest of n times: what the hardware can do (other work on a shared machine only ever
 * adds time; the median follows the load). */
static double pt_best(const double *v, int n) {
    double b = v[0];
    for (int i = 1; i < n; i++) b = v[i] < b ? v[i] : b;
    return b;
}

/* The mean over the world of each of v's n values, in place. */
static void pt_world_mean(pt_comm *w, double *v, int n) {
    pt_allreduce_sum(w, v, (size_t)n, PT_DTYPE_F64);
    for (int i = 0; i < n; i++) v[i] /= w->size;
}

/* ---- GEMM ---------------------------------------------------------------------------------- */

typedef struct {
    pt_backend *be;
    int bf16;
    float *a, *b, *c;
    pt_bf16 *a16, *b16;
} pt_gemm_bufs;

/* One C (m×n) = A (m×k) · B (n×k)ᵀ, the layout of the model's forward (x · Wᵀ). */
static void pt_gemm_once(pt_gemm_bufs *g, int m, int n, int k) {
    if (g->bf16)
        g->be->gemm_bf16(g->be, PT_NO_TRANS, PT_TRANS, m, n, k, g->a16, k, g->b16, k, 0.0f, g->c, n);
    else
        g->be->gemm(g->be, PT_NO_TRANS, PT_TRANS, m, n, k, 1.0f, g->a, k, g->b, k, 0.0f, g->c, n);
}

/* FLOP/s of the shape: one untimed call (bf16: builds its kernel), one timed to size the
 * samples, then `samples` timed samples of enough calls to last ~2 ms each; the best. */
static double pt_gemm_rate(pt_gemm_bufs *g, int m, int n, int k, int samples) {
    pt_gemm_once(g, m, n, k);
    g->be->synchronize(g->be);
    double t0 = pt_now();
    pt_gemm_once(g, m, n, k);
    g->be->synchronize(g->be);
    double first = pt_now() - t0;
    int calls = first > 2e-3 ? 1 : (int)(2e-3 / (first > 1e-7 ? first : 1e-7)) + 1;
    double t[9];
    for (int s = 0; s < samples; s++) {
        t0 = pt_now();
        for (int r = 0; r < calls; r++) pt_gemm_once(g, m, n, k);
        g->be->synchronize(g->be);
        t[s] = (pt_now() - t0) / calls;
    }
    return 2.0 * m * n * (double)k / pt_best(t, samples);
}

/* ---- attention and cross-entropy ----------------------------------------------------------- */

/* Seconds of fn(arg): the best of 5 samples after an untimed call. */
static double pt_time_kernel(pt_backend *be, void (*fn)(void *), void *arg) {
    fn(arg);
    be->synchronize(be);
    double t[5];
    for (int s = 0; s < 5; s++) {
        double t0 = pt_now();
        fn(arg);
        be->synchronize(be);
        t[s] = pt_now() - t0;
    }
    return pt_best(t, 5);
}

typedef struct {
    pt_backend *be;
    pt_attn_shape s;
    float *q, *k, *v, *o, *lse, *d, *dq, *dk, *dv, *logits, *losses;
    int32_t *tg;
    int n, V;
} pt_kernel_bufs;

static void pt_attn_once(void *arg) {
    pt_kernel_bufs *b = arg;
    b->be->attention_forward(b->be, &b->s, b->q, b->k, b->v, b->o, b->lse);
    b->be->attention_backward(b->be, &b->s, b->q, b->k, b->v, b->o, b->d, b->lse, b->dq, b->dk, b->dv);
}

static void pt_xent_once(void *arg) {
    pt_kernel_bufs *b = arg;
    b->be->softmax_xent(b->be, b->logits, b->losses, b->tg, b->n, b->V, b->V, 1.0f);
}

/* The backend's causal attention, forward and backward, at B = 2, T = 512, 8 heads of 64, in the
 * planner's FLOPs (2·T²·hd per head forward over the causal half, 2.5× backward); its fused
 * softmax cross-entropy over 512 rows of 8192 logits, in logits per second. */
static void pt_measure_kernels(pt_backend *be, double *attn_flops, double *xent_rate) {
    enum { B = 2, T = 512, H = 8, HD = 64, N = 512, V = 8192 };
    pt_kernel_bufs b = {.be = be, .n = N, .V = V};
    size_t qn = (size_t)B * T * H * HD;
    float *host = pt_malloc(((size_t)N * V > qn ? (size_t)N * V : qn) * sizeof(float));
    for (size_t i = 0; i < ((size_t)N * V > qn ? (size_t)N * V : qn); i++)
        host[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    float **arr[] = {&b.q, &b.k, &b.v, &b.o, &b.d, &b.dq, &b.dk, &b.dv};
    for (size_t i = 0; i < sizeof arr / sizeof *arr; i++) {
        *arr[i] = be->alloc(be, qn * sizeof(float));
        be->upload(be, *arr[i], host, qn * sizeof(float));
    }
    b.lse = be->alloc(be, (size_t)B * H * T * sizeof(float));
    int32_t *pos = pt_malloc(T * sizeof *pos);
    for (int i = 0; i < T; i++) pos[i] = i;
    int32_t *dpos = be->alloc(be, T * sizeof *dpos);
    be->upload(be, dpos, pos, T * sizeof *dpos);
    b.s = (pt_attn_shape){.B = B, .Tq = T, .Tk = T, .n_heads = H, .n_kv_heads = H, .head_dim = HD,
                          .ldq = H * HD, .ldk = H * HD, .ldv = H * HD, .ldo = H * HD,
                          .q_pos = dpos, .k_pos = dpos, .scale = 0.125f};
    double t = pt_time_kernel(be, pt_attn_once, &b);
    *attn_flops = 3.5 * B * H * 2.0 * T * T * HD / t;
    b.logits = be->alloc(be, (size_t)N * V * sizeof(float));
    b.losses = be->alloc(be, N * sizeof(float));
    for (int i = 0; i < N; i++) pos[i % T] = (int32_t)((i * 7) % V);
    b.tg = be->alloc(be, N * sizeof(int32_t));
    be->upload(be, b.tg, pos, N * sizeof(int32_t));
    /* each call overwrites the logits with their gradient: fresh logits every sample would time
     * the upload; the kernel's work does not depend on the values */
    be->upload(be, b.logits, host, (size_t)N * V * sizeof(float));
    t = pt_time_kernel(be, pt_xent_once, &b);
    *xent_rate = (double)N * V / t;
    for (size_t i = 0; i < sizeof arr / sizeof *arr; i++) be->free(be, *arr[i]);
    be->free(be, b.lse), be->free(be, dpos), be->free(be, b.logits), be->free(be, b.losses);
    be->free(be, b.tg);
    free(pos), free(host);
}

/* The grid {64, 256, 1024, 4096}³ of (m, n, k), smallest product first, as many as the time
 * budget allows at the measured peak (the same list on every rank: the peak is the world's
 * slowest). Fills hw->shapes with the world's mean FLOP/s per shape. */
static void pt_measure_shapes(pt_comm *w, pt_hardware *hw, pt_gemm_bufs *g, double slowest_peak,
                              int threads) {
    static const int sizes[4] = {64, 256, 1024, 4096};
    const int samples = 3;
    const double budget = 8.0; /* seconds, estimated */
    pt_gemm_shape grid[64];
    int n = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 4; l++) grid[n++] = (pt_gemm_shape){sizes[i], sizes[j], sizes[l], 0};
    /* insertion sort by m·n·k (stable: ties keep the grid's order) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && grid[j].m * grid[j].n * grid[j].k <
                                     grid[j - 1].m * grid[j - 1].n * grid[j - 1].k; j--) {
            pt_gemm_shape tmp = grid[j];
            grid[j] = grid[j - 1], grid[j - 1] = tmp;
        }
    double spent = 0;
    int kept = 0;
    for (; kept < n; kept++) {
        /* two calls and the samples at half the peak, or ~2 ms a sample for small ones */
        double call = 2.0 * grid[kept].m * grid[kept].n * grid[kept].k / (0.5 * slowest_peak);
        double est = 2 * call + samples * (call > 2e-3 ? call : 2e-3);
        if (spent + est > budget) break;
        spent += est;
    }
    double rate[64];
    for (int i = 0; i < kept; i++)
        rate[i] = pt_gemm_rate(g, (int)grid[i].m, (int)grid[i].n, (int)grid[i].k, samples);
    pt_world_mean(w, rate, kept);
    hw->n_shapes = kept;
    for (int i = 0; i < kept; i++) hw->shapes[i] = grid[i], hw->shapes[i].flops = rate[i];
    snprintf(pt_how[K_SHAPES], sizeof pt_how[K_SHAPES],
             "%s C(m,n) = A(m,k)·B(n,k)ᵀ, best of %d, %d thread%s, mean of %d rank%s at once; "
             "%d of the %d shapes of {64,256,1024,4096}³ fit the %.0f s budget",
             g->bf16 ? "bf16 GEMM" : "sgemm", samples, threads, threads == 1 ? "" : "s", w->size,
             w->size == 1 ? "" : "s", kept, n, budget);
}

/* ---- memory -------------------------------------------------------------------------------- */

/* STREAM's triad a = b + s·c over three arrays of 128 MiB (doubles, each thread touching its own
 * part first): bytes moved (24 a element: two read, one written) per second, best of 9. */
static double pt_measure_triad(int threads) {
    const size_t n = (size_t)16 << 20;
    double *a = pt_malloc(n * sizeof *a), *b = pt_malloc(n * sizeof *b), *c = pt_malloc(n * sizeof *c);
    const double s = 3.0;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = 1.0, c[i] = 2.0;
    double t[9];
    for (int r = 0; r < 10; r++) {
        double t0 = pt_now();
#pragma omp parallel for num_threads(threads) schedule(static)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        double dt = pt_now() - t0;
        if (r > 0) t[r - 1] = dt; /* the first: page faults, frequency ramp */
    }
    volatile double sink = a[n / 2];
    (void)sink;
    free(a), free(b), free(c);
    return 24.0 * (double)n / pt_best(t, 9);
}

/* ---- communication ------------------------------------------------------------------------- */

/* Ping-pong between world ranks a and b (a = b: a rank to itself, through MPI's own path):
 * `rounds` samples of `trips` round trips of `bytes` each after one untimed round trip; on a and
 * b the median round trip in seconds, broadcast from a to every rank (the others wait). */
static double pt_pingpong(pt_comm *w, int a, int b, float *buf, size_t bytes, int rounds, int trips) {
    enum { TAG = 0x706c };
    const size_t count = bytes / sizeof(float);
    float *out = buf, *in = buf + count; /* sent from, received into (a copy to itself copies) */
    double rt = 0;
    if (w->rank == a || w->rank == b) {
        const int peer = w->rank == a ? b : a;
        double t[16];
        for (int r = 0; r <= rounds; r++) {
            double t0 = pt_now();
            for (int i = 0; i < (r ? trips : 1); i++) {
                if (w->rank == a) { /* a sends first; b answers; a = b: both at once */
                    pt_comm_req *rr = w->irecv(w, in, count, PT_DTYPE_F32, peer, TAG);
                    pt_comm_wait(w, w->isend(w, out, count, PT_DTYPE_F32, peer, TAG));
                    pt_comm_wait(w, rr);
                    if (a == b) { /* the answer, to itself again */
                        rr = w->irecv(w, out, count, PT_DTYPE_F32, peer, TAG);
                        pt_comm_wait(w, w->isend(w, in, count, PT_DTYPE_F32, peer, TAG));
                        pt_comm_wait(w, rr);
                    }
                } else {
                    pt_comm_wait(w, w->irecv(w, in, count, PT_DTYPE_F32, peer, TAG));
                    pt_comm_wait(w, w->isend(w, in, count, PT_DTYPE_F32, peer, TAG));
                }
            }
            if (r) t[r - 1] = (pt_now() - t0) / trips;
        }
        rt = pt_median(t, rounds);
    }
    pt_bcast(w, &rt, 1, PT_DTYPE_F64, a);
    return rt;
}

/* Seconds for a and b to exchange `bytes` each way at once (each sends while it receives, as a
 * ring's step does): the best of `rounds`, broadcast from a. */
static double pt_exchange(pt_comm *w, int a, int b, float *buf, size_t bytes, int rounds) {
    enum { TAG = 0x706d };
    size_t count = bytes / sizeof(float);
    double best = 0;
    if ((w->rank == a || w->rank == b) && a != b) {
        const int peer = w->rank == a ? b : a;
        for (int r = 0; r <= rounds; r++) { /* round 0 untimed */
            double t0 = pt_now();
            pt_comm_req *rr = w->irecv(w, buf + count, count, PT_DTYPE_F32, peer, TAG);
            pt_comm_wait(w, w->isend(w, buf, count, PT_DTYPE_F32, peer, TAG));
            pt_comm_wait(w, rr);
            double t = pt_now() - t0;
            if (r && (r == 1 || t < best)) best = t;
        }
    }
    pt_bcast(w, &best, 1, PT_DTYPE_F64, a);
    return best;
}

/* The share of an exchange of `bytes` each way between a and b that moves while both compute
 * (spin, no call into the comm layer) for twice its time alone: 1 − (the wait after the compute)
 * / (its time alone), in [0, 1], the best of 3; broadcast from a. */
static double pt_exchange_overlap(pt_comm *w, int a, int b, float *buf, size_t bytes, double alone) {
    enum { TAG = 0x706e };
    const size_t count = bytes / sizeof(float);
    double share = 1;
    if ((w->rank == a || w->rank == b) && a != b) {
        const int peer = w->rank == a ? b : a;
        double spin = 2 * alone < 2.0 ? 2 * alone : 2.0, best = -1;
        for (int r = 0; r < 3; r++) {
            pt_comm_req *rr = w->irecv(w, buf + count, count, PT_DTYPE_F32, peer, TAG);
            pt_comm_req *sr = w->isend(w, buf, count, PT_DTYPE_F32, peer, TAG);
            double t0 = pt_now();
            while (pt_now() - t0 < spin) {
            }
            t0 = pt_now();
            pt_comm_wait(w, sr);
            pt_comm_wait(w, rr);
            double left = 1 - (pt_now() - t0) / alone;
            best = left > best ? left : best;
        }
        share = best < 0 ? 0 : best > 1 ? 1 : best;
    }
    pt_bcast(w, &share, 1, PT_DTYPE_F64, a);
    return share;
}

/* Whether a message of `bytes` waits for its sender to call into the comm layer (a rendezvous:
 * docs/plan.md, "Pipeline"): b posts the receive, tells a and waits; a sends and then spins
 * without calling in for D (4 × the message's time alone, at least 20 ms); it waited if b's wait
 * lasted over 3/4 of D. 1 or 0, broadcast from a. */
static double pt_waits_for_sender(pt_comm *w, int a, int b, float *buf, size_t bytes, double alone) {
    enum { TAG = 0x7070 };
    double verdict = 0;
    if (a != b && (w->rank == a || w->rank == b)) {
        const int peer = w->rank == a ? b : a;
        const size_t count = bytes / sizeof(float);
        float *flag = buf + count;
        double spin = fmax(0.02, 4 * alone);
        if (w->rank == b) {
            pt_comm_req *rr = w->irecv(w, buf, count, PT_DTYPE_F32, peer, TAG);
            pt_comm_wait(w, w->isend(w, flag, 1, PT_DTYPE_F32, peer, TAG + 1));
            double t0 = pt_now();
            pt_comm_wait(w, rr);
            verdict = pt_now() - t0 > 0.75 * spin;
            pt_comm_wait(w, w->isend(w, &verdict, 1, PT_DTYPE_F64, peer, TAG + 2));
        } else {
            pt_comm_wait(w, w->irecv(w, flag, 1, PT_DTYPE_F32, peer, TAG + 1));
            pt_comm_req *sr = w->isend(w, buf, count, PT_DTYPE_F32, peer, TAG);
            double t0 = pt_now();
            while (pt_now() - t0 < spin) {
            }
            pt_comm_wait(w, sr);
            pt_comm_wait(w, w->irecv(w, &verdict, 1, PT_DTYPE_F64, peer, TAG + 2));
        }
    }
    pt_bcast(w, &verdict, 1, PT_DTYPE_F64, a);
    return verdict;
}

/* Latency (half the median round trip of 8 bytes) and bandwidth between a and b, into *lat and
 * *bw: 16 MiB sent both ways at once, per direction (what a ring's steps see: a link carrying one
 * direction at a time, as a ping-pong measures, can be faster: across the shaped test links by
 * half as much again, the acknowledgements of one direction's TCP queueing behind the other's
 * data). One process (a = b): half the round trip of 16 MiB to itself. */
static void pt_measure_link(pt_comm *w, int a, int b, float *buf, double *lat, double *bw,
                            pt_hw_sizes *overlap, pt_hw_sizes *rendezvous, double *one_way_out,
                            pt_hardware *hw, int inter) {
    const size_t big = (size_t)16 << 20;
    pt_barrier(w);
    /* the two ranks poll without napping (a nap lasts far longer than a small message) */
    if (w->rank == a || w->rank == b) pt_comm_set_busy_wait(1);
    *lat = 0.5 * pt_pingpong(w, a, b, buf, 8, 7, 100);
    double one_way = (double)big / (0.5 * pt_pingpong(w, a, b, buf, big, 5, 1));
    *bw = a == b ? one_way : (double)big / pt_exchange(w, a, b, buf, big, 5);
    if (one_way_out) *one_way_out = one_way;
    /* one message at a time, by size (p2p entries of `collectives`): half a ping-pong's round
     * trip at 64 KiB ... 16 MiB, the median of 5, until one takes over 0.25 s */
    for (size_t n = 65536; a != b && n <= big && hw->n_colls < PT_HW_MAX_COLLS; n *= 4) {
        double t = 0.5 * pt_pingpong(w, a, b, buf, n, 5, 1);
        hw->colls[hw->n_colls++] = (pt_coll_time){PT_HW_P2P, inter, 2, (double)n, t};
        if (t > 0.25) break;
    }
    /* what moves while the ranks compute, and which messages wait for the sender, by size (one
     * process: everything moves, nothing waits) */
    *overlap = (pt_hw_sizes){0};
    *rendezvous = (pt_hw_sizes){0};
    if (a == b) *overlap = (pt_hw_sizes){.n = 1, .value = {1}};
    for (size_t n = 65536; a != b && n <= big; n *= 4) {
        overlap->bytes[overlap->n] = (double)n;
        overlap->value[overlap->n++] = pt_exchange_overlap(w, a, b, buf, n, *lat + (double)n / *bw);
    }
    for (size_t n = 4096; a != b && n <= ((size_t)1 << 20); n *= 4) {
        rendezvous->bytes[rendezvous->n] = (double)n;
        rendezvous->value[rendezvous->n++] = pt_waits_for_sender(w, a, b, buf, n, *lat + (double)n / *bw);
    }
    pt_comm_set_busy_wait(0);
}

/* ---- the comm layer's collectives and the ranks' skew --------------------------------------- */

/* The comm layer's all-reduce, reduce-scatter and all-gather over group c (inter: its ranks on
 * different hosts) at 64 KiB, 256 KiB, ... 16 MiB (the whole buffer), each the median of 5 after
 * one untimed of the slowest rank's time (the best would take a shaped link's burst allowance
 * for its rate, which training's steady traffic does not get); a kind stops growing once a call
 * takes over 0.25 s. buf: 32 MiB. Appended to hw->colls on c's ranks. */
static void pt_measure_colls(pt_comm *c, int inter, float *buf, pt_hardware *hw) {
    if (c->size < 2) return;
    for (int kind = PT_HW_AR; kind <= PT_HW_AG; kind++)
        for (size_t bytes = 65536; bytes <= ((size_t)16 << 20); bytes *= 4) {
            const size_t count = bytes / sizeof(float), part = count / (size_t)c->size;
            double s[5], *t = pt_calloc((size_t)c->size, sizeof *t);
            for (int r = 0; r <= 5; r++) {
                pt_barrier(c);
                double t0 = pt_now();
                if (kind == PT_HW_AR) pt_allreduce_sum(c, buf, count, PT_DTYPE_F32);
                else if (kind == PT_HW_RS) pt_reduce_scatter_sum(c, buf, buf + count, part, PT_DTYPE_F32);
                else pt_allgather(c, buf + count, buf, part, PT_DTYPE_F32);
                double mine = pt_now() - t0, slowest = 0;
                pt_allgather(c, &mine, t, 1, PT_DTYPE_F64);
                for (int q = 0; q < c->size; q++) slowest = t[q] > slowest ? t[q] : slowest;
                if (r > 0) s[r - 1] = slowest;
            }
            free(t);
            double best = pt_median(s, 5);
            if (hw->n_colls < PT_HW_MAX_COLLS)
                hw->colls[hw->n_colls++] = (pt_coll_time){(pt_hw_coll)kind, inter, c->size, (double)bytes, best};
            if (best > 0.25) break;
        }
}

/* The ranks' skew: every rank runs the same GEMMs for ~20 ms, then an 8-byte all-reduce (the
 * ranks start each round together), 25 times. At a synchronization every rank leaves when the
 * slowest arrives: the mean wait is the slowest's compute less the mean. Skew = the sum over the
 * rounds of (the slowest rank's GEMM time − the ranks' mean) / the sum of the mean: from the
 * ranks' own clocks, so the all-reduce's latency and its jitter (a shaped link's) do not count. */
static double pt_measure_skew(pt_comm *w, pt_gemm_bufs *g) {
    enum { ROUNDS = 25 };
    double one = pt_now();
    pt_gemm_once(g, 256, 256, 256);
    g->be->synchronize(g->be);
    one = pt_now() - one;
    double calls = ceil(20e-3 / (one > 1e-6 ? one : 1e-6)), x = 1, mine[ROUNDS];
    pt_bcast(w, &calls, 1, PT_DTYPE_F64, 0);
    pt_barrier(w);
    for (int r = 0; r < ROUNDS; r++) {
        double t0 = pt_now();
        for (int i = 0; i < (int)calls; i++) pt_gemm_once(g, 256, 256, 256);
        g->be->synchronize(g->be);
        mine[r] = pt_now() - t0;
        pt_allreduce_sum(w, &x, 1, PT_DTYPE_F64);
    }
    double *all = pt_calloc((size_t)w->size * ROUNDS, sizeof *all), wait = 0, busy = 0;
    pt_allgather(w, mine, all, ROUNDS, PT_DTYPE_F64);
    for (int r = 0; r < ROUNDS; r++) {
        double most = 0, sum = 0;
        for (int q = 0; q < w->size; q++) {
            double t = all[(size_t)q * ROUNDS + r];
            most = t > most ? t : most, sum += t;
        }
        wait += most - sum / w->size, busy += sum / w->size;
    }
    free(all);
    return wait / busy;
}

/* ---- the machine --------------------------------------------------------------------------- */

static void pt_cpu_model(char *out, size_t cap) {
    snprintf(out, cap, "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
            const char *v = strchr(line, ':') + 1;
            while (*v == ' ') v++;
            snprintf(out, cap, "%.*s", (int)strcspn(v, "\n"), v);
            break;
        }
    fclose(f);
}

/* A device's memory bandwidth: copies of 1 GiB within device memory (each byte read and written),
 * bytes moved per second, best of 9 after one untimed copy. */
static double pt_measure_device_copy(pt_backend *be) {
    const size_t n = (size_t)1 << 30;
    char *a = be->alloc(be, n), *b = be->alloc(be, n);
    double t[9];
    for (int r = 0; r < 10; r++) {
        be->synchronize(be);
        double t0 = pt_now();
        be->copy(be, r % 2 ? a : b, r % 2 ? b : a, n);
        be->synchronize(be);
        if (r > 0) t[r - 1] = pt_now() - t0;
    }
    be->free(be, a), be->free(be, b);
    return 2.0 * (double)n / pt_best(t, 9);
}

pt_status pt_hardware_measure(pt_hardware *hw, int bf16, int threads, int cuda, const char **how) {
    memset(hw, 0, sizeof *hw);
    memset(pt_how, 0, sizeof pt_how);
    pt_comm *w = pt_comm_world(300.0);
    const int world = w->size;
    const char *tn = threads == 1 ? "" : "s";

    /* where the ranks are: (host, rank on the host) of each */
    int me[2], *where = pt_calloc(2 * (size_t)world, sizeof *where);
    pt_comm_host(&me[0], &me[1]);
    pt_allgather(w, me, where, 2, PT_DTYPE_I32);
    int nodes = 0, dpn = 0, intra_a = -1, intra_b = -1, inter_b = -1;
    for (int r = 0; r < world; r++) {
        int host = where[2 * r], local = where[2 * r + 1], on_host = 0;
        if (local == 0) nodes++;
        for (int q = 0; q < world; q++) on_host += where[2 * q] == host;
        if (on_host > dpn) dpn = on_host;
        if (local == 1 && intra_b < 0) intra_b = r, intra_a = host; /* a host's first two */
        if (local == 0 && host != where[0] && inter_b < 0) inter_b = r;
    }
    free(where);
    hw->nodes = nodes, hw->devices_per_node = dpn;
    snprintf(pt_how[K_NODES], sizeof pt_how[K_NODES], "the hosts of this job (%d rank%s)", world,
             world == 1 ? "" : "s");
    snprintf(pt_how[K_DPN], sizeof pt_how[K_DPN],
             "ranks per host of this job (MPI's shared-memory split), the most on any host");

    /* memory per rank, before this allocates anything */
    int64_t avail = pt_memory_available();
    double mem = avail == INT64_MAX ? 0 : (double)avail;
    pt_world_mean(w, &mem, 1);
    hw->memory_bytes = mem;
    snprintf(pt_how[K_MEM], sizeof pt_how[K_MEM], "the host's available memory (MemAvailable, or "
             "the cgroup's limit less its use) / the ranks on the host; mean of %d rank%s", world,
             world == 1 ? "" : "s");

    /* the GEMM peak and shapes, every rank at once: on the CPU, or on each rank's GPU (local
     * rank mod the device count, shared where the host has more ranks than GPUs) */
    pt_backend *be = NULL;
    if (cuda) {
        int count = pt_cuda_device_count();
        int sharers = count > 0 ? (pt_comm_local_size() + count - 1) / count : 1;
        be = pt_backend_cuda_create_shared(me[1], sharers);
    } else {
        be = pt_backend_cpu_create(threads, PT_GEMM_ONEDNN);
    }
    if (!be) {
        pt_comm_runtime_abort(1); /* a rank's own failure: end the job, leave no rank waiting */
        return PT_ERR_RUNTIME;
    }
    const size_t max = (size_t)4096 * 4096;
    pt_gemm_bufs g = {.be = be, .bf16 = bf16};
    g.a = be->alloc(be, max * sizeof(float)), g.b = be->alloc(be, max * sizeof(float));
    g.c = be->alloc(be, max * sizeof(float));
    g.a16 = be->alloc(be, max * sizeof(pt_bf16)), g.b16 = be->alloc(be, max * sizeof(pt_bf16));
    float *h = pt_malloc(max * sizeof(float));
    for (size_t i = 0; i < max; i++) h[i] = (float)(i % 13) * 0.01f - 0.06f;
    be->upload(be, g.a, h, max * sizeof(float));
    be->upload(be, g.b, h, max * sizeof(float));
    free(h);
    be->to_bf16(be, g.a16, g.a, max);
    be->to_bf16(be, g.b16, g.b, max);
    pt_barrier(w);
    double peak[2]; /* the mean, and the slowest rank's (for the shapes' time budget) */
    peak[0] = bf16 ? pt_measure_gemm_bf16_peak(be) : pt_measure_gemm_peak(be);
    double *all = pt_calloc((size_t)world, sizeof *all);
    pt_allgather(w, &peak[0], all, 1, PT_DTYPE_F64);
    peak[1] = all[0];
    for (int r = 0; r < world; r++) peak[1] = all[r] < peak[1] ? all[r] : peak[1];
    free(all);
    pt_world_mean(w, &peak[0], 1);
    hw->peak_flops = peak[0];
    hw->gemm_efficiency = 1.0;
    snprintf(pt_how[K_PEAK], sizeof pt_how[K_PEAK],
             "%s 1024³ NT, best of 11 (pt_measure_gemm%s_peak), %d thread%s a rank, mean of %d "
             "rank%s measuring at once; %s", bf16 ? "bf16 GEMM" : "sgemm", bf16 ? "_bf16" : "",
             threads, tn, world, world == 1 ? "" : "s", be->describe(be));
    snprintf(pt_how[K_EFF], sizeof pt_how[K_EFF], "1: peak_flops is the measured GEMM rate");
    pt_measure_shapes(w, hw, &g, peak[1], threads);
    pt_barrier(w);
    if (world > 1) {
        hw->skew = pt_measure_skew(w, &g);
        snprintf(pt_how[K_SKEW], sizeof pt_how[K_SKEW], "%d ranks each %d ms of sgemm 256³ then "
                 "an 8-byte all-reduce, 25 times: the slowest rank's GEMM time less the mean, per "
                 "second of the mean (each rank's own clock)", world, 20);
    }
    double kr[2];
    pt_measure_kernels(be, &kr[0], &kr[1]);
    pt_world_mean(w, kr, 2);
    hw->attention_flops = kr[0], hw->xent_rate = kr[1];
    snprintf(pt_how[K_ATTN], sizeof pt_how[K_ATTN], "the backend's causal attention forward + "
             "backward, B 2, T 512, 8 heads of 64: 3.5 x 2 T^2 hd per head over the time, best "
             "of 5; mean of %d rank%s at once", world, world == 1 ? "" : "s");
    snprintf(pt_how[K_XENT], sizeof pt_how[K_XENT], "the backend's fused softmax cross-entropy "
             "over 512 rows of 8192 logits, best of 5; mean of %d rank%s at once", world,
             world == 1 ? "" : "s");
    be->free(be, g.a), be->free(be, g.b), be->free(be, g.c), be->free(be, g.a16), be->free(be, g.b16);

    /* memory bandwidth, every rank at once (a device's share of its host's); on a GPU its own
     * memory, its size for the memory per rank */
    pt_barrier(w);
    double bw = cuda ? pt_measure_device_copy(be) : pt_measure_triad(threads);
    pt_world_mean(w, &bw, 1);
    hw->memory_bw = bw;
    if (cuda) {
        double dm = (double)pt_cuda_device_memory(be);
        pt_world_mean(w, &dm, 1);
        hw->memory_bytes = dm;
        snprintf(pt_how[K_MEM], sizeof pt_how[K_MEM], "the GPU's memory (cudaDeviceProp), mean "
                 "of %d rank%s", world, world == 1 ? "" : "s");
        snprintf(pt_how[K_MEMBW], sizeof pt_how[K_MEMBW], "device-to-device copies of 1 GiB "
                 "(2 bytes moved a byte), best of 9; mean of %d rank%s at once", world,
                 world == 1 ? "" : "s");
    } else {
        snprintf(pt_how[K_MEMBW], sizeof pt_how[K_MEMBW],
                 "STREAM triad a = b + s·c, 3 × 128 MiB of doubles, 24 bytes an element, best "
                 "of 9, %d thread%s a rank; mean of %d rank%s at once", threads, tn, world,
                 world == 1 ? "" : "s");
    }
    char device[160] = "";
    if (cuda) snprintf(device, sizeof device, "%s", be->describe(be));
    be->destroy(be);

    /* the links: one pair at a time, the other ranks waiting */
    float *buf = pt_calloc((size_t)32 << 20, 1); /* two messages of 16 MiB */
    int intra_ok = intra_b >= 0, inter_ok = inter_b >= 0;
    if (intra_ok) {
        double one_way;
        pt_measure_link(w, intra_a, intra_b, buf, &hw->intra_latency, &hw->intra_bw,
                        &hw->overlap[0], &hw->rendezvous[0], &one_way, hw, 0);
        snprintf(pt_how[K_INTRA_RV], sizeof pt_how[K_INTRA_RV], "ranks %d and %d (one host): bytes,1 "
                 "if a message of 4 KiB, 16 KiB, ... 1 MiB waited for its sender to call in, else "
                 "0", intra_a, intra_b);
        snprintf(pt_how[K_INTRA_OV], sizeof pt_how[K_INTRA_OV], "ranks %d and %d exchanging 64 KiB "
                 "... 16 MiB while both spin for twice its time: bytes,1 - the wait after / its "
                 "time alone, best of 3", intra_a, intra_b);
        snprintf(pt_how[K_INTRA_BW], sizeof pt_how[K_INTRA_BW], "ranks %d and %d (one host) "
                 "exchanging 16 MiB each way at once, per direction, best of 5 (one way at a "
                 "time, a ping-pong: %.4g B/s)", intra_a, intra_b, one_way);
        snprintf(pt_how[K_INTRA_LAT], sizeof pt_how[K_INTRA_LAT], "ping-pong of ranks %d and %d "
                 "(one host), 8 bytes, half the median round trip (7 × 100)", intra_a, intra_b);
    }
    if (inter_ok) {
        double one_way;
        pt_measure_link(w, 0, inter_b, buf, &hw->inter_latency, &hw->inter_bw, &hw->overlap[1],
                        &hw->rendezvous[1], &one_way, hw, 1);
        snprintf(pt_how[K_INTER_RV], sizeof pt_how[K_INTER_RV], "ranks 0 and %d (two hosts): bytes,1 "
                 "if a message of 4 KiB, 16 KiB, ... 1 MiB waited for its sender to call in, else "
                 "0", inter_b);
        snprintf(pt_how[K_INTER_OV], sizeof pt_how[K_INTER_OV], "ranks 0 and %d (two hosts) "
                 "exchanging 16 MiB while both spin for twice its time: 1 - the wait after / its "
                 "time alone, best of 3", inter_b);
        snprintf(pt_how[K_INTER_BW], sizeof pt_how[K_INTER_BW], "ranks 0 and %d (two hosts) "
                 "exchanging 16 MiB each way at once, per direction, best of 5 (one way at a "
                 "time, a ping-pong: %.4g B/s)", inter_b, one_way);
        snprintf(pt_how[K_INTER_LAT], sizeof pt_how[K_INTER_LAT], "ping-pong of ranks 0 and %d "
                 "(two hosts), 8 bytes, half the median round trip (7 × 100)", inter_b);
    }
    if (!intra_ok && inter_ok) {
        hw->intra_bw = hw->inter_bw, hw->intra_latency = hw->inter_latency;
        hw->overlap[0] = hw->overlap[1], hw->rendezvous[0] = hw->rendezvous[1];
        snprintf(pt_how[K_INTRA_OV], sizeof pt_how[K_INTRA_OV],
                 "not measured (one rank a host): inter_overlap copied");
        snprintf(pt_how[K_INTRA_RV], sizeof pt_how[K_INTRA_RV],
                 "not measured (one rank a host): inter_rendezvous copied");
        snprintf(pt_how[K_INTRA_BW], sizeof pt_how[K_INTRA_BW],
                 "not measured (one rank a host): inter_bw copied");
        snprintf(pt_how[K_INTRA_LAT], sizeof pt_how[K_INTRA_LAT],
                 "not measured (one rank a host): inter_latency copied");
    } else if (!intra_ok) { /* one process: MPI's path to itself stands in for a host's */
        pt_measure_link(w, 0, 0, buf, &hw->intra_latency, &hw->intra_bw, &hw->overlap[0],
                        &hw->rendezvous[0], NULL, hw, 0);
        snprintf(pt_how[K_INTRA_OV], sizeof pt_how[K_INTRA_OV], "not measured (one process): 1");
        snprintf(pt_how[K_INTRA_BW], sizeof pt_how[K_INTRA_BW], "not measured (one process): "
                 "a ping-pong of rank 0 with itself (MPI's self path), 16 MiB");
        snprintf(pt_how[K_INTRA_LAT], sizeof pt_how[K_INTRA_LAT], "not measured (one process): "
                 "a ping-pong of rank 0 with itself (MPI's self path), 8 bytes");
    }
    if (!inter_ok) {
        hw->inter_bw = hw->intra_bw, hw->inter_latency = hw->intra_latency;
        hw->overlap[1] = hw->overlap[0], hw->rendezvous[1] = hw->rendezvous[0];
        snprintf(pt_how[K_INTER_OV], sizeof pt_how[K_INTER_OV],
                 "not measured (one host): intra_overlap copied");
        snprintf(pt_how[K_INTER_RV], sizeof pt_how[K_INTER_RV],
                 "not measured (one host): intra_rendezvous copied");
        snprintf(pt_how[K_INTER_BW], sizeof pt_how[K_INTER_BW],
                 "not measured (one host): intra_bw copied");
        snprintf(pt_how[K_INTER_LAT], sizeof pt_how[K_INTER_LAT],
                 "not measured (one host): intra_latency copied");
    }
    /* the comm layer's collectives: the ranks of each host together (host 0's kept), then one
     * rank of each host together (ranks with the same rank on their host) */
    int host_id, local_id;
    pt_comm_host(&host_id, &local_id);
    pt_comm *on_host = w->split(w, host_id, w->rank, "measure-host");
    pt_comm *across = w->split(w, local_id, w->rank, "measure-across");
    if (dpn > 1) pt_measure_colls(on_host, 0, buf, hw); /* after the links' p2p entries */
    pt_barrier(w);
    if (nodes > 1) pt_measure_colls(across, 1, buf, hw);
    on_host->free(on_host), across->free(across);
    pt_bcast(w, &hw->n_colls, 1, PT_DTYPE_I32, 0);
    pt_bcast(w, hw->colls, sizeof hw->colls / 4, PT_DTYPE_I32, 0);
    if (hw->n_colls > 0)
        snprintf(pt_how[K_COLLS], sizeof pt_how[K_COLLS], "the comm layer's all-reduce (ar), "
                 "reduce-scatter (rs), all-gather (ag) within a host (intra) and across (inter): "
                 "the slowest rank's seconds, median of 5; p2p: a message, half a ping-pong");
    free(buf);

    char host[64] = "?", cpu[160];
    gethostname(host, sizeof host - 1);
    pt_cpu_model(cpu, sizeof cpu);
    if (cuda) { /* the GPU names the machine: "cuda backend, GPU 0: NAME (sm_..." */
        const char *at = strstr(device, ": "), *end = at ? strstr(at, " (") : NULL;
        if (at && end) snprintf(cpu, sizeof cpu, "%.*s", (int)(end - at - 2), at + 2);
    }
    /* rank 0's host and CPU name the machine */
    char name[512];
    snprintf(name, sizeof name, "%s, %s, %d×%d ranks, %d thread%s, %s", host, cpu, nodes, dpn,
             threads, tn, bf16 ? "bf16" : "fp32");
    size_t nl = strlen(name) < sizeof hw->name ? strlen(name) : sizeof hw->name - 1;
    memcpy(hw->name, name, nl); /* cut at 95 bytes (may split a UTF-8 character: none here) */
    hw->name[nl] = 0;
    pt_bcast(w, hw->name, sizeof hw->name / 4, PT_DTYPE_I32, 0);
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    char date[32];
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    snprintf(pt_how[K_NAME], sizeof pt_how[K_NAME], "measured by pentatron plan --measure, %s, "
             "%d rank%s (host, CPU, hosts × ranks, threads a rank, precision)", date, world,
             world == 1 ? "" : "s");
    if (hw->memory_bytes <= 0) { /* no MemAvailable: not a figure to plan with */
        w->free(w);
        return pt_errorf(PT_ERR_RUNTIME, "plan --measure: cannot tell the memory available "
                         "(no MemAvailable in /proc/meminfo)");
    }
    w->free(w);
    if (how)
        for (int i = 0; i < PT_HW_N_KEYS; i++) how[i] = pt_how[i];
    return PT_OK;
}

/* ---- the command --------------------------------------------------------------------------- */

static void pt_measure_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron plan --measure --out FILE [--threads N] [--precision fp32|bf16]\n"
            "                                [--device cpu|cuda]\n"
            "\n"
            "Measures this machine and writes a hardware file for `pentatron plan` (docs/plan.md,\n"
            "\"The hardware file\"): the GEMM peak and a grid of GEMM shapes, memory bandwidth\n"
            "(STREAM triad), memory per rank, hosts and ranks per host, latency and bandwidth\n"
            "between two ranks of a host and of two hosts. Run it under mpirun with the ranks per\n"
            "host the training will use (one process works too; what needs two ranks is then\n"
            "copied or stood in for, and the file says so).\n"
            "  --out FILE         the hardware file to write (rank 0)\n"
            "  --threads N        threads per rank (default: the host's cores / its ranks)\n"
            "  --precision P      fp32 (sgemm, the default) or bf16 (bf16 GEMM, fp32 sums)\n"
            "  --device D         cpu (the default) or cuda: the GEMMs, attention, cross-entropy,\n"
            "                     memory size and bandwidth of each rank's GPU\n"
            "Takes ~20 s. Exit status: 0 done, 1 failed, 2 bad arguments.\n");
}

/* "--opt VALUE" or "--opt=VALUE" at argv[*i]: the value, or NULL (not this option) */
static const char *pt_opt(int argc, char **argv, int *i, const char *opt, int *missing) {
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n)) return NULL;
    if (argv[*i][n] == '=') return argv[*i] + n + 1;
    if (argv[*i][n]) return NULL;
    if (*i + 1 >= argc) {
        *missing = 1;
        return NULL;
    }
    return argv[++*i];
}

int pt_plan_measure_cmd(int argc, char **argv) {
    const char *out = NULL, *precision = "fp32", *device = "cpu";
    int threads = 0, missing = 0;
    const char *bad = NULL;
    for (int i = 0; i < argc && !bad && !missing; i++) {
        const char *v;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            pt_measure_usage(stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--measure")) continue;
        if ((v = pt_opt(argc, argv, &i, "--out", &missing))) out = v;
        else if ((v = pt_opt(argc, argv, &i, "--precision", &missing))) precision = v;
        else if ((v = pt_opt(argc, argv, &i, "--device", &missing))) device = v;
        else if ((v = pt_opt(argc, argv, &i, "--threads", &missing))) {
            char *end;
            long t = strtol(v, &end, 10);
            if (!*v || *end || t < 1 || t > 4096) bad = "--threads: expected a positive integer";
            threads = (int)t;
        } else if (!missing)
            bad = argv[i];
        if (missing) bad = argv[i];
    }
    char msg[512] = "";
    if (missing) snprintf(msg, sizeof msg, "%s needs a value", bad);
    else if (bad && bad[0] == '-' && bad[1] == '-' && strncmp(bad, "--threads:", 10))
        snprintf(msg, sizeof msg, "unknown option \"%s\" (see pentatron plan --measure --help)", bad);
    else if (bad) snprintf(msg, sizeof msg, "%s", bad);
    else if (!out) snprintf(msg, sizeof msg, "--out FILE is required (the hardware file to write)");
    else if (strcmp(precision, "fp32") && strcmp(precision, "bf16"))
        snprintf(msg, sizeof msg, "--precision: expected fp32 or bf16, got \"%s\"", precision);
    else if (strcmp(device, "cpu") && strcmp(device, "cuda"))
        snprintf(msg, sizeof msg, "--device: expected cpu or cuda, got \"%s\"", device);
    /* every rank parses the same arguments: rank 0 says what is wrong, all exit 2 */
    int rank = 0, world = 1;
    if (pt_comm_runtime_init(&rank, &world) != PT_OK) {
        pt_log_error("%s", pt_last_error());
        return 1;
    }
    pt_log_set_rank(rank, world);
    if (msg[0]) { /* the same on every rank: rank 0 says it, all exit 2 */
        if (rank == 0) pt_log_error("plan --measure: %s", msg);
        pt_comm_runtime_finalize();
        return 2;
    }
    /* before ~20 s of measuring: can rank 0 write the file? (every rank learns the answer) */
    pt_comm *w = pt_comm_world(300.0);
    int writable = 1;
    if (rank == 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s", out);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        writable = pt_check_writable_dir(slash ? (dir[0] ? dir : "/") : ".", "--out's directory")
                   == PT_OK &&
                   pt_check_output(out, 0, "--out") == PT_OK; /* a FIFO: replaced */
        if (!writable) pt_log_error("plan --measure: %s", pt_last_error());
    }
    pt_bcast(w, &writable, 1, PT_DTYPE_I32, 0);
    w->free(w);
    if (!writable) {
        pt_comm_runtime_finalize();
        return 2;
    }
    if (threads == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int local = pt_comm_local_size();
        threads = cores / local > 0 ? (int)(cores / local) : 1;
    }
    pt_hardware hw;
    const char *how[PT_HW_N_KEYS];
    int bf16 = !strcmp(precision, "bf16");
    double t0 = pt_now();
    int cuda = !strcmp(device, "cuda");
    if (cuda && pt_cuda_check_usable() != PT_OK) { /* the same on every rank of a host */
        pt_log_error("plan --measure: %s", pt_last_error());
        pt_comm_runtime_finalize();
        return 2;
    }
    pt_status st = pt_hardware_measure(&hw, bf16, threads, cuda, how);
    if (st == PT_OK && rank == 0) {
        st = pt_hardware_write(&hw, out, how);
        pt_hardware back; /* what was written reads back */
        if (st == PT_OK) st = pt_hardware_load(&back, out, NULL, 0);
        if (st == PT_OK && (back.nodes != hw.nodes || back.n_shapes != hw.n_shapes ||
                            fabs(back.peak_flops / hw.peak_flops - 1) > 1e-3))
            st = pt_errorf(PT_ERR_RUNTIME, "%s: the written file reads back different figures", out);
    }
    if (st != PT_OK) {
        pt_log_error("%s", pt_last_error());
        if (world > 1) pt_comm_runtime_abort(1);
        pt_comm_runtime_finalize();
        return 1;
    }
    if (rank == 0) {
        printf("measured in %.1f s: %s\n"
               "  %d host%s × %d rank%s, %.3g GB a rank\n"
               "  GEMM peak %.1f GFLOP/s (%d shapes from %.1f to %.1f GFLOP/s)\n"
               "  memory bandwidth %.2f GB/s (triad)\n"
               "  attention %.2f GFLOP/s, cross-entropy %.3g logits/s\n"
               "  within a host %.3g GB/s, %.2f us, overlap %.2f at 16 MiB; across hosts %.3g GB/s, "
               "%.2f us, overlap %.2f at 16 MiB\n"
               "wrote %s\n",
               pt_now() - t0, hw.name, hw.nodes, hw.nodes == 1 ? "" : "s", hw.devices_per_node,
               hw.devices_per_node == 1 ? "" : "s", hw.memory_bytes / 1e9, hw.peak_flops / 1e9,
               hw.n_shapes, hw.n_shapes ? hw.shapes[0].flops / 1e9 : 0,
               hw.n_shapes ? hw.shapes[hw.n_shapes - 1].flops / 1e9 : 0, hw.memory_bw / 1e9,
               hw.attention_flops / 1e9, hw.xent_rate, hw.intra_bw / 1e9, hw.intra_latency * 1e6,
               pt_hw_sizes_at(&hw.overlap[0], 16 << 20, 1), hw.inter_bw / 1e9, hw.inter_latency * 1e6,
               pt_hw_sizes_at(&hw.overlap[1], 16 << 20, 1), out);
        fflush(stdout);
    }
    pt_comm_runtime_finalize();
    return 0;
}
