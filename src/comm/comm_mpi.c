/* comm_mpi.c: the communication layer over MPI (see include/pt/comm.h), and the distributed
 * runtime (MPI_Init, MPI_COMM_WORLD). The one file that includes <mpi.h>.
 *
 * Every operation is posted nonblocking on a request of the communicator's pool (comm.c);
 * pt_comm_wait polls it with mpi_test until it completes or the group's timeout passes. Counting
 * follows the bus-bandwidth convention so that tests can hold the counts against
 * ../shared/FORMULAS.md. */
#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_backend.h"
#include "comm/comm_mpi.h"

typedef struct {
    pt_comm_req head;
    MPI_Request req;
    int counts[]; /* 4 × the group's size: alltoallv's scounts, sdispls, rcounts, rdispls */
} pt_mpi_req;

static MPI_Comm pt_mpi(pt_comm *c) { return *(MPI_Comm *)c->handle; }

static MPI_Datatype pt_mpi_type(pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32: return MPI_FLOAT;
    case PT_DTYPE_F64: return MPI_DOUBLE;
    case PT_DTYPE_I32: return MPI_INT32_T;
    case PT_DTYPE_I64: return MPI_INT64_T;
    case PT_DTYPE_BF16: return MPI_UINT16_T; /* bits; its sums go through pt_mpi_bf16_sum */
    }
    return MPI_DATATYPE_NULL;
}

/* bf16 sums: inout[i] = bf16(float(in[i]) + float(inout[i])), the user-defined reduction MPI
 * applies pairwise (created at start, commutative) */
static MPI_Op pt_mpi_bf16_op = MPI_OP_NULL;

static void pt_mpi_bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const pt_bf16 *a = in;
    pt_bf16 *b = inout;
    for (int i = 0; i < *len; i++) b[i] = pt_bf16_round(pt_bf16_to_float(a[i]) + pt_bf16_to_float(b[i]));
}

static MPI_Op pt_mpi_sum(pt_dtype dt) {
    PT_ASSERTF(dt != PT_DTYPE_BF16 || pt_mpi_bf16_op != MPI_OP_NULL,
               "bf16 sums need the runtime (pt_comm_runtime_init)");
    return dt == PT_DTYPE_BF16 ? pt_mpi_bf16_op : MPI_SUM;
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

/* A request of c's pool for op (counted now; see pt_comm_req_take). */
static pt_mpi_req *pt_req_new(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *a,
                              const void *b) {
    return (pt_mpi_req *)pt_comm_req_take(c, op, bytes, a, b);
}

/* Counts MPI limits to int: split larger messages before they reach here. */
static int pt_icount(size_t n) {
    PT_ASSERTF(n <= (size_t)2147483647, "message of %zu elements exceeds MPI's int count", n);
    return (int)n;
}

static pt_comm_req *mpi_iallreduce(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    uint64_t bytes = c->size > 1 ? 2 * (uint64_t)(c->size - 1) * count * pt_dtype_size(dt) / c->size : 0;
    pt_mpi_req *r = pt_req_new(c, PT_COMM_ALLREDUCE, bytes, buf, NULL);
    PT_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, pt_icount(count), pt_mpi_type(dt),
                                pt_mpi_sum(dt), pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_ireduce_scatter(pt_comm *c, const void *send, void *recv,
                                        size_t recv_count, pt_dtype dt) {
    uint64_t bytes = (uint64_t)(c->size - 1) * recv_count * pt_dtype_size(dt);
    pt_mpi_req *r = pt_req_new(c, PT_COMM_REDUCE_SCATTER, bytes, send, recv);
    PT_MPI_CHECK(MPI_Ireduce_scatter_block(send ? send : MPI_IN_PLACE, recv, pt_icount(recv_count),
                                           pt_mpi_type(dt), pt_mpi_sum(dt), pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_iallgather(pt_comm *c, const void *send, void *recv, size_t send_count,
                                   pt_dtype dt) {
    uint64_t bytes = (uint64_t)(c->size - 1) * send_count * pt_dtype_size(dt);
    pt_mpi_req *r = pt_req_new(c, PT_COMM_ALLGATHER, bytes, send, recv);
    PT_MPI_CHECK(MPI_Iallgather(send ? send : MPI_IN_PLACE, pt_icount(send_count), pt_mpi_type(dt),
                                recv, pt_icount(send_count), pt_mpi_type(dt), pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_ialltoallv(pt_comm *c, const void *send, const int64_t *send_counts,
                                   void *recv, const int64_t *recv_counts, pt_dtype dt) {
    int n = c->size;
    uint64_t bytes = 0;
    for (int i = 0; i < n; i++)
        if (i != c->rank) bytes += (uint64_t)send_counts[i] * pt_dtype_size(dt);
    pt_mpi_req *r = pt_req_new(c, PT_COMM_ALLTOALLV, bytes, send, recv);
    int *arr = r->counts; /* scounts, sdispls, rcounts, rdispls */
    int64_t so = 0, ro = 0;
    for (int i = 0; i < n; i++) {
        arr[i] = pt_icount((size_t)send_counts[i]);
        arr[n + i] = pt_icount((size_t)so);
        arr[2 * n + i] = pt_icount((size_t)recv_counts[i]);
        arr[3 * n + i] = pt_icount((size_t)ro);
        so += send_counts[i];
        ro += recv_counts[i];
    }
    PT_MPI_CHECK(MPI_Ialltoallv(send, arr, arr + n, pt_mpi_type(dt), recv, arr + 2 * n, arr + 3 * n,
                                pt_mpi_type(dt), pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_isend(pt_comm *c, const void *buf, size_t count, pt_dtype dt, int peer,
                              int tag) {
    pt_mpi_req *r = pt_req_new(c, PT_COMM_SEND, count * pt_dtype_size(dt), buf, NULL);
    PT_MPI_CHECK(MPI_Isend(buf, pt_icount(count), pt_mpi_type(dt), peer, tag, pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_irecv(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag) {
    (void)count; /* bytes count what a rank sends: the receiver's are its peer's */
    pt_mpi_req *r = pt_req_new(c, PT_COMM_RECV, 0, buf, NULL);
    PT_MPI_CHECK(MPI_Irecv(buf, pt_icount(count), pt_mpi_type(dt), peer, tag, pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_ibcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    uint64_t bytes = c->rank == root ? count * pt_dtype_size(dt) : 0;
    pt_mpi_req *r = pt_req_new(c, PT_COMM_BCAST, bytes, buf, NULL);
    PT_MPI_CHECK(MPI_Ibcast(buf, pt_icount(count), pt_mpi_type(dt), root, pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_ibarrier(pt_comm *c) {
    pt_mpi_req *r = pt_req_new(c, PT_COMM_BARRIER, 0, NULL, NULL);
    PT_MPI_CHECK(MPI_Ibarrier(pt_mpi(c), &r->req));
    return &r->head;
}

static int mpi_test(pt_comm *c, pt_comm_req *r) {
    int done = 0;
    PT_MPI_CHECK(MPI_Test(&((pt_mpi_req *)r)->req, &done, MPI_STATUS_IGNORE));
    if (done) pt_comm_req_done(c, r);
    return done;
}

static void mpi_progress(pt_comm *c) {
    (void)c;
    int flag;
    /* any MPI call drives the progress engine; MPI_Iprobe does so without side effects */
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

static pt_comm *mpi_split(pt_comm *c, int color, int key, const char *name) {
    MPI_Comm s;
    int rc = MPI_Comm_split(pt_mpi(c), color, key, &s);
    PT_ASSERTF(rc == MPI_SUCCESS, "MPI_Comm_split for group %s failed", name);
    return pt_comm_mpi_wrap(&s, name, c->timeout_s);
}

static pt_comm *mpi_dup(pt_comm *c, const char *name) {
    MPI_Comm d;
    PT_MPI_CHECK(MPI_Comm_dup(pt_mpi(c), &d));
    return pt_comm_mpi_wrap(&d, name, c->timeout_s);
}

static void mpi_free(pt_comm *c) {
    MPI_Comm_free((MPI_Comm *)c->handle);
    pt_comm_req_free_all(c);
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
    c->req_size = sizeof(pt_mpi_req) + 4 * (size_t)c->size * sizeof(int);
    c->iallreduce = mpi_iallreduce;
    c->ireduce_scatter = mpi_ireduce_scatter;
    c->iallgather = mpi_iallgather;
    c->ialltoallv = mpi_ialltoallv;
    c->isend = mpi_isend;
    c->irecv = mpi_irecv;
    c->ibcast = mpi_ibcast;
    c->ibarrier = mpi_ibarrier;
    c->test = mpi_test;
    c->progress = mpi_progress;
    c->split = mpi_split;
    c->dup = mpi_dup;
    c->free = mpi_free;
    return c;
}

/* The runtime. */

static void pt_mpi_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

pt_status pt_comm_runtime_init(int *rank, int *world) {
    *rank = 0, *world = 1;
    if (MPI_Init(NULL, NULL) != MPI_SUCCESS)
        return pt_errorf(PT_ERR_RUNTIME, "MPI_Init failed: cannot start the distributed runtime");
    pt_set_abort(pt_mpi_abort);
    MPI_Op_create(pt_mpi_bf16_sum, 1, &pt_mpi_bf16_op);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    return PT_OK;
}

void pt_comm_runtime_finalize(void) {
    if (pt_mpi_bf16_op != MPI_OP_NULL) MPI_Op_free(&pt_mpi_bf16_op);
    MPI_Finalize();
}

void pt_comm_runtime_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

int pt_comm_distributed(void) {
    int on = 0;
    MPI_Initialized(&on);
    return on;
}

pt_comm *pt_comm_world(double timeout_s) {
    MPI_Comm world;
    PT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    return pt_comm_mpi_wrap(&world, "world", timeout_s);
}
