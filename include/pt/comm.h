/* comm.h: the communication layer. A communicator is one process group (dp, tp, pp, cp, ep, ...)
 * with a table of functions behind it, its backend: MPI now (src/comm/comm_mpi.c, the one file
 * that sees MPI), NCCL later as one more file of the same shape. Nothing outside a backend touches
 * its handles: groups are made by splitting the world communicator with the backend's split.
 *
 * Every call is collective over its group (send/recv: between two members) and counted per
 * operation: calls, and bytes as the bus-bandwidth convention (nccl-tests') counts them
 * (all-reduce moves 2(N−1)/N of the buffer, reduce-scatter and all-gather (N−1)/N of the full
 * buffer, all-to-all the bytes leaving this rank, send the bytes sent). Blocking calls are the
 * nonblocking ones followed by pt_comm_wait, which gives up after the configured timeout and
 * aborts the whole job with a message naming the group and operation: a dead rank never leaves
 * the others hanging.
 *
 * Requests come from a pool per communicator (src/comm/comm.c), kept at twice the most ever
 * pending at once (16 at least) and grown only when more are pending than half of it: once the
 * first step has run, communicating allocates nothing unless a later step keeps more than twice
 * as many pending, which pt_comm_reserve at set-up rules out.
 */
#ifndef PT_COMM_H
#define PT_COMM_H

#include "pt/core.h"

typedef enum {
    PT_COMM_ALLREDUCE = 0,
    PT_COMM_REDUCE_SCATTER,
    PT_COMM_ALLGATHER,
    PT_COMM_ALLTOALLV,
    PT_COMM_SEND,
    PT_COMM_RECV,
    PT_COMM_BCAST,
    PT_COMM_BARRIER,
    PT_COMM_OP_COUNT
} pt_comm_op;

typedef struct {
    uint64_t calls[PT_COMM_OP_COUNT];
    uint64_t bytes[PT_COMM_OP_COUNT];
    double wait_seconds; /* time spent blocked in pt_comm_wait */
    double wait_op[PT_COMM_OP_COUNT]; /* the same, by the operation waited for */
} pt_comm_stats;

/* Element types. PT_DTYPE_BF16 (pt_bf16 in core.h): sums add in fp32 and round each partial sum
 * to nearest even (a user-defined reduction over MPI). */
typedef enum { PT_DTYPE_F32 = 0, PT_DTYPE_F64, PT_DTYPE_I32, PT_DTYPE_I64, PT_DTYPE_BF16 } pt_dtype;

typedef struct pt_comm pt_comm;
typedef struct pt_comm_req pt_comm_req; /* a pending nonblocking operation */

struct pt_comm {
    char name[16]; /* the group: "world", "dp", "tp", "pp", "cp", "dpcp", "ep", "edp" */
    int rank, size;
    void *handle;  /* the backend's communicator, opaque outside the backend */
    void *hier;    /* hierarchical collectives' state (src/comm/comm_hier.c); NULL: flat */
    /* device memory's path (src/comm/comm_stage.c, comm_nccl.c; pt_comm_device_attach); NULL:
     * every buffer is host memory */
    void *dev;
    /* 1 when sends and receives between two members are matched in the order they are posted,
     * tags aside (NCCL's point to point); 0: by tag, as MPI matches them */
    int ordered_p2p;
    pt_comm_stats stats;
    double timeout_s;
    int flight; /* its index in the flight recorder's groups + 1 (pt/flight.h); 0: not recorded */
    /* the request pool (comm.c): idle requests, the blocks they were made in (freed by c->free),
     * the size of one (the backend's request type, set by the backend), how many were made and
     * how many are pending now */
    pt_comm_req *req_idle;
    void *req_blocks;
    size_t req_size;
    int req_made, req_pending;
    /* backend table */
    pt_comm_req *(*iallreduce)(pt_comm *c, void *buf, size_t count, pt_dtype dt);
    /* send = NULL: in place, the input is recv (size·recv_count), the result its first slice */
    pt_comm_req *(*ireduce_scatter)(pt_comm *c, const void *send, void *recv, size_t recv_count,
                                    pt_dtype dt);
    /* send = NULL: in place, this rank's part already sits at recv + rank·send_count */
    pt_comm_req *(*iallgather)(pt_comm *c, const void *send, void *recv, size_t send_count,
                               pt_dtype dt);
    pt_comm_req *(*ialltoallv)(pt_comm *c, const void *send, const int64_t *send_counts,
                               void *recv, const int64_t *recv_counts, pt_dtype dt);
    pt_comm_req *(*isend)(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer, int tag);
    pt_comm_req *(*irecv)(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag);
    pt_comm_req *(*ibcast)(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root);
    pt_comm_req *(*ibarrier)(pt_comm *c);
    /* 1 when done (the request goes back to the pool); 0 while pending. Drives progress. */
    int (*test)(pt_comm *c, pt_comm_req *r);
    /* Lets pending operations progress without completing any (MPI progresses nonblocking
     * collectives only inside calls). */
    void (*progress)(pt_comm *c);
    /* A new group of the members with equal color, ranked by key then by rank in c (the
     * semantics of MPI_Comm_split); it inherits c's timeout. Collective over c. */
    pt_comm *(*split)(pt_comm *c, int color, int key, const char *name);
    /* A new group of the same members, with its own counters and traffic. Collective over c. */
    pt_comm *(*dup)(pt_comm *c, const char *name);
    /* Frees c, its backend communicator and every request of its pool. */
    void (*free)(pt_comm *c);
    /* Optional (NULL: none): ends c's pending operations at once, for a wait that timed out
     * (NCCL's ncclCommAbort), before the job is ended naming the group and the operation. */
    void (*abort)(pt_comm *c);
};

size_t pt_dtype_size(pt_dtype dt);

/* Makes c's pool hold at least n requests (allocating now, if it does not), for a caller that
 * knows how many it keeps pending at once at most (buckets, pipeline slots): then no later call
 * allocates, whatever the timing. */
void pt_comm_reserve(pt_comm *c, int n);
/* Waits for r (c->test until done), aborting the job after c->timeout_s seconds. After 1000
 * polls a wait either keeps polling, yielding the core between polls (busy: the ranks and their
 * threads fit the host's cores, so the core is the rank's own), or naps 20 µs between polls so
 * that oversubscribed peers run (the default). A nap lasts far longer than asked on a virtual
 * machine (timer slack, the hypervisor's timer): docs/benchmarks.md, "How a rank waits". */
void pt_comm_set_busy_wait(int busy);
void pt_comm_wait(pt_comm *c, pt_comm_req *r);
/* Lets pending operations progress (c->progress). */
void pt_comm_poll(pt_comm *c, pt_comm_req *r);

/* Blocking conveniences (sum reductions, in place where it reads so). */
void pt_allreduce_sum(pt_comm *c, void *buf, size_t count, pt_dtype dt);
void pt_reduce_scatter_sum(pt_comm *c, const void *send, void *recv, size_t recv_count, pt_dtype dt);
void pt_allgather(pt_comm *c, const void *send, void *recv, size_t send_count, pt_dtype dt);
void pt_bcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root);
void pt_barrier(pt_comm *c);

/* Hierarchical collectives over a group that spans hosts (src/comm/comm_hier.c): where the group
 * has members on more than one host and the same number L > 1 on each, its all-reduces run as a
 * reduce-scatter within each host (shared memory), an all-reduce across hosts of each local
 * rank's 1/L slice among the members with that local rank (all of a host's ranks cross at once,
 * the slices' trees pointing different ways), and an all-gather within the host; its in-place
 * reduce-scatters and its all-gathers likewise in two stages (within the host and across, the
 * blocks reordered in place so that each stage's are contiguous). PT_COMM_HIER chooses: auto
 * (the default: buffers of 64 KiB and more; smaller ones stay flat), on (every size), off
 * (flat); another value is an error. The sub-groups are made here, collectively over c, once
 * (call at set-up, with nothing pending on c); c's entries iallreduce, ireduce_scatter,
 * iallgather, test, progress and free are replaced. c's counters count each collective as the
 * flat one (its bus-bandwidth bytes); what the stages move is counted in the sub-groups:
 * pt_comm_hier_stats gives those within the host and those that cross (0 if c is flat). */
pt_status pt_comm_hier_setup(pt_comm *c);
int pt_comm_hierarchical(const pt_comm *c);
int pt_comm_hier_stats(const pt_comm *c, pt_comm_stats *host, pt_comm_stats *hosts);

/* Adds every counter of `from` into `to`. */
void pt_comm_stats_add(pt_comm_stats *to, const pt_comm_stats *from);
const char *pt_comm_op_name(pt_comm_op op);

/* Device memory. A backend whose memory is not the host's (include/pt/backend.h,
 * pt_device_link) has its buffers reach the network in one of two ways, chosen once per process
 * before the groups are made (comm.backend):
 *   PT_COMM_STAGED: MPI over host copies (src/comm/comm_stage.c): an operation on device memory
 *     copies its input to page-locked host buffers of the group's own (grown to the largest
 *     operation in the first steps, then reused), runs on MPI there, and copies its result back
 *     when a test finds it done. This is how several ranks share one GPU (NCCL refuses two
 *     ranks of a communicator on one device), and how MPI reaches GPUs where it is not
 *     CUDA-aware.
 *   PT_COMM_NCCL: NCCL (src/comm/comm_nccl.c): one NCCL communicator per group (the world's
 *     made from a unique id broadcast over MPI, every other split from its parent's as the group
 *     is), each with a stream of its own that waits for the compute stream's work by an event,
 *     and an event per request that the backend's test queries. Host memory (counts, scalars)
 *     still goes over MPI.
 * pt_comm_set_device records the choice (PT_COMM_HOST: none, the default); pt_comm_device_attach
 * applies it to a group (the world, at set-up: every group split or duplicated from it then has
 * it too). */
struct pt_device_link;
typedef enum { PT_COMM_HOST = 0, PT_COMM_STAGED, PT_COMM_NCCL } pt_comm_device_mode;
pt_status pt_comm_set_device(const struct pt_device_link *link, pt_comm_device_mode mode);
pt_comm_device_mode pt_comm_device_mode_get(void);
pt_status pt_comm_device_attach(pt_comm *c);
/* The staging's and NCCL's set-ups on one group (from pt_comm_device_attach, and on each split
 * and dup of a group that has them). */
pt_status pt_comm_stage_setup(pt_comm *c, const struct pt_device_link *link);
pt_status pt_comm_nccl_setup(pt_comm *c, const struct pt_device_link *link);
/* 1 when NCCL can be used by this build (compiled with the CUDA toolkit's nccl.h) and process
 * (libnccl.so.2 loads); else 0 with the reason in pt_last_error(). */
int pt_comm_nccl_available(void);

/* The distributed runtime: the processes of the job and their world (MPI's launcher and
 * MPI_COMM_WORLD, src/comm/comm_mpi.c). */
/* Starts it; after this PT_ASSERT and pt_fatal end the whole job, so no rank is left waiting. */
pt_status pt_comm_runtime_init(int *rank, int *world);
void pt_comm_runtime_finalize(void);
/* Ends every process of the job with exit code `code`. */
void pt_comm_runtime_abort(int code);
/* The processes of the job on this host (1 before the runtime starts). */
int pt_comm_local_size(void);
/* This process's host (the lowest world rank on it) and its rank among the host's processes. */
void pt_comm_host(int *host, int *local_rank);
/* 1 once the runtime is started (by pt_comm_runtime_init or a test), else 0. */
int pt_comm_distributed(void);
/* A new communicator "world" over every process of the job (collective). */
pt_comm *pt_comm_world(double timeout_s);

#endif
