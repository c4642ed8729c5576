/* comm_mpi.c: the communication layer over MPI (see include/pt/comm.h).
 *
 * Every operation is posted nonblocking; pt_comm_wait polls it with MPI_Test until it completes or
 * the group's timeout passes, then aborts the job naming the group and operation. Counting follows
 * the bus-bandwidth convention so that tests can hold the counts against ../shared/FORMULAS.md. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm_mpi.h"

struct pt_comm_req {
    MPI_Request req;
    pt_comm_op op;
    void *scratch; /* per-request arrays (alltoallv counts) freed at completion */
};

static MPI_Comm pt_mpi(pt_comm *c) { return *(MPI_Comm *)c->handle; }

static MPI_Datatype pt_mpi_type(pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32: return MPI_FLOAT;
    case PT_DTYPE_F64: return MPI_DOUBLE;
    case PT_DTYPE_I32: return MPI_INT32_T;
    case PT_DTYPE_I64: return MPI_INT64_T;
    }
    return MPI_DATATYPE_NULL;
}

#define PT_MPI_CHECK(call)                                                                         \
    do {                                                                                           \
        int pt_rc_ = (call);                                                                       \
        if (pt_rc_ != MPI_SUCCESS) {                                                               \
            char pt_msg_[MPI_MAX_ERROR_STRING];                                                    \
            int pt_len_ = 0;                                                                       \
            MPI_Error_string(pt_rc_, pt_msg_, &pt_len_);                                           \
            pt_fatal(__FILE__, __LINE__, "%s failed: %s", #call, pt_msg_);                         \
        }                                                                                          \
    } while (0)

static pt_comm_req *pt_req_new(pt_comm *c, pt_comm_op op, uint64_t bytes) {
    pt_comm_req *r = pt_calloc(1, sizeof *r);
    r->op = op;
    c->stats.calls[op]++;
    c->stats.bytes[op] += bytes;
    return r;
}

/* Counts MPI limits to int: split larger messages before they reach here. */
static int pt_icount(size_t n) {
    PT_ASSERTF(n <= (size_t)2147483647, "message of %zu elements exceeds MPI's int count", n);
    return (int)n;
}

static pt_comm_req *mpi_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    uint64_t bytes = c->size > 1 ? 2 * (uint64_t)(c->size - 1) * count * pt_dtype_size(dt) / c->size : 0;
    pt_comm_req *r = pt_req_new(c, PT_COMM_ALLREDUCE, bytes);
    PT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, pt_icount(count), pt_mpi_type(dt), MPI_SUM,
                                pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_ireduce_scatter(pt_comm *c, const void *send, void *recv,
                                        size_t recv_count, pt_dtype dt) {
    uint64_t bytes = (uint64_t)(c->size - 1) * recv_count * pt_dtype_size(dt);
    pt_comm_req *r = pt_req_new(c, PT_COMM_REDUCE_SCATTER, bytes);
    PT_MPI_CHECK(MPI_Ireduce_scatter_block(send ? send : MPI_IN_PLACE, recv, pt_icount(recv_count), pt_mpi_type(dt),
                                           MPI_SUM, pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_iallgather(pt_comm *c, const void *send, void *recv, size_t send_count,
                                   pt_dtype dt) {
    uint64_t bytes = (uint64_t)(c->size - 1) * send_count * pt_dtype_size(dt);
    pt_comm_req *r = pt_req_new(c, PT_COMM_ALLGATHER, bytes);
    PT_MPI_CHECK(MPI_Iallgather(send ? send : MPI_IN_PLACE, pt_icount(send_count), pt_mpi_type(dt),
                                recv, pt_icount(send_count), pt_mpi_type(dt), pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_ialltoallv(pt_comm *c, const void *send, const int64_t *send_counts,
                                   void *recv, const int64_t *recv_counts, pt_dtype dt) {
    int n = c->size;
    int *arr = pt_malloc(4 * (size_t)n * sizeof *arr); /* scounts, sdispls, rcounts, rdispls */
    uint64_t bytes = 0;
    int64_t so = 0, ro = 0;
    for (int i = 0; i < n; i++) {
        arr[i] = pt_icount((size_t)send_counts[i]);
        arr[n + i] = pt_icount((size_t)so);
        arr[2 * n + i] = pt_icount((size_t)recv_counts[i]);
        arr[3 * n + i] = pt_icount((size_t)ro);
        so += send_counts[i];
        ro += recv_counts[i];
        if (i != c->rank) bytes += (uint64_t)send_counts[i] * pt_dtype_size(dt);
    }
    pt_comm_req *r = pt_req_new(c, PT_COMM_ALLTOALLV, bytes);
    r->scratch = arr;
    PT_MPI_CHECK(MPI_Ialltoallv(send, arr, arr + n, pt_mpi_type(dt), recv, arr + 2 * n, arr + 3 * n,
                                pt_mpi_type(dt), pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_isend(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer,
                              int tag) {
    pt_comm_req *r = pt_req_new(c, PT_COMM_SEND, count * pt_dtype_size(dt));
    PT_MPI_CHECK(MPI_Isend(buf, pt_icount(count), pt_mpi_type(dt), peer, tag, pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_irecv(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag) {
    (void)count; /* bytes count what a rank sends: the receiver's are its peer's */
    pt_comm_req *r = pt_req_new(c, PT_COMM_RECV, 0);
    PT_MPI_CHECK(MPI_Irecv(buf, pt_icount(count), pt_mpi_type(dt), peer, tag, pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_ibcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    uint64_t bytes = c->rank == root ? count * pt_dtype_size(dt) : 0;
    pt_comm_req *r = pt_req_new(c, PT_COMM_BCAST, bytes);
    PT_MPI_CHECK(MPI_Ibcast(buf, pt_icount(count), pt_mpi_type(dt), root, pt_mpi(c), &r->req));
    return r;
}

static pt_comm_req *mpi_ibarrier(pt_comm *c) {
    pt_comm_req *r = pt_req_new(c, PT_COMM_BARRIER, 0);
    PT_MPI_CHECK(MPI_Ibarrier(pt_mpi(c), &r->req));
    return r;
}

static int mpi_test(pt_comm *c, pt_comm_req *r) {
    (void)c;
    int done = 0;
    PT_MPI_CHECK(MPI_Test(&r->req, &done, MPI_STATUS_IGNORE));
    if (done) {
        free(r->scratch);
        free(r);
    }
    return done;
}

static void mpi_free(pt_comm *c) {
    MPI_Comm_free((MPI_Comm *)c->handle);
    free(c->handle);
    free(c);
}

pt_comm *pt_comm_mpi_wrap(void *mpi_comm, const char *name, double timeout_s) {
    pt_comm *c = pt_calloc(1, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->handle = pt_malloc(sizeof(MPI_Comm));
    *(MPI_Comm *)c->handle = *(MPI_Comm *)mpi_comm;
    MPI_Comm_rank(pt_mpi(c), &c->rank);
    MPI_Comm_size(pt_mpi(c), &c->size);
    c->timeout_s = timeout_s;
    c->iallreduce = mpi_iallreduce;
    c->ireduce_scatter = mpi_ireduce_scatter;
    c->iallgather = mpi_iallgather;
    c->ialltoallv = mpi_ialltoallv;
    c->isend = mpi_isend;
    c->irecv = mpi_irecv;
    c->ibcast = mpi_ibcast;
    c->ibarrier = mpi_ibarrier;
    c->test = mpi_test;
    c->free = mpi_free;
    return c;
}

static void pt_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

void pt_comm_mpi_install_abort(void) { pt_set_abort(pt_mpi_abort); }

void pt_comm_wait(pt_comm *c, pt_comm_req *r) {
    if (!r) return;
    pt_comm_op op = r->op;
    double t0 = pt_now();
    struct timespec nap = {0, 20000};
    for (long spins = 0;; spins++) {
        if (c->test(c, r)) break;
        /* spin briefly, then yield the core: oversubscribed ranks must let their peers run */
        if (spins > 1000) nanosleep(&nap, NULL);
        if ((spins & 1023) == 0 && c->timeout_s > 0 && pt_now() - t0 > c->timeout_s)
            pt_fatal(__FILE__, __LINE__,
                     "%s over group \"%s\" (rank %d of %d) did not complete within %.0f s "
                     "(parallel.timeout_s): a peer died or skipped the collective",
                     pt_comm_op_name(op), c->name, c->rank, c->size, c->timeout_s);
    }
    c->stats.wait_seconds += pt_now() - t0;
}

void pt_comm_poll(pt_comm *c, pt_comm_req *r) {
    (void)c;
    (void)r;
    int flag;
    /* any MPI call drives the progress engine; MPI_Iprobe does so without side effects */
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}
