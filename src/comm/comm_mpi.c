/* comm_mpi.c: the communication layer over MPI (see include/pt/comm.h), and the distributed
 * runtime (MPI_Init, MPI_COMM_WORLD). The one file that includes <mpi.h>.
 *
 * Every operation is posted nonblocking on a request of the communicator's pool (comm.c);
 * pt_comm_wait polls it with mpi_test until it completes or the group's timeout passes. Counting
 * follows the bus-bandwidth convention so that tests can hold the counts against the formulas
 * (include/pt/comm.h).
 *
 * Start-up cannot hang either: MPI_Init runs under a watchdog (SIGALRM after PT_STARTUP_TIMEOUT
 * seconds, default 300: the config is not read yet), and the world's first exchange is a
 * handshake with the group's timeout (parallel.timeout_s) before any blocking collective: rank 0
 * waits for every rank's word and names those that never come. */
#include <malloc.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_backend.h"
#include "comm/comm_mpi.h"
#include "pt/flight.h"

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

/* The progress thread (PT_MPI_PROGRESS=thread; pt_progress_start): MPI moves the data of a
 * nonblocking collective only inside MPI calls, on the calling thread. By default our own calls
 * do it: pt_comm_wait, and the model's polls between its big operations (pt_model_hooks.poll,
 * the data-parallel and the other parallel modules' hooks, which test their pending requests).
 * The thread instead calls MPI_Iprobe (which runs MPI's progress engine without side effects)
 * every PT_MPI_PROGRESS_US µs (default 100) while any request of this process is pending, under
 * MPI_THREAD_MULTIPLE; it sleeps 1 ms at a time while none is. Measured on 2 cores with one
 * compute thread per rank (bench/progress_bench.sh, docs/benchmarks.md), it did not beat the
 * polls, so it is an option, not the default. */
static struct {
    int on;
    long interval_ns;
    pthread_t thread;
    int stop;    /* atomic */
    int pending; /* atomic: requests posted and not yet seen complete */
} pt_progress;

static void *pt_progress_main(void *arg) {
    (void)arg;
    long ns = pt_progress.interval_ns;
    struct timespec busy = {ns / 1000000000L, ns % 1000000000L};
    const struct timespec idle = {0, 1000000};
    while (!__atomic_load_n(&pt_progress.stop, __ATOMIC_ACQUIRE)) {
        int flag;
        if (__atomic_load_n(&pt_progress.pending, __ATOMIC_RELAXED) > 0) {
            MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
            nanosleep(&busy, NULL);
        } else {
            nanosleep(&idle, NULL);
        }
    }
    return NULL;
}

/* PT_MPI_PROGRESS = poll (the default) or thread, read before MPI_Init (the configuration is
 * not read yet: the thread level is fixed there). */
static pt_status pt_progress_mode(int *thread) {
    const char *v = getenv("PT_MPI_PROGRESS"), *us = getenv("PT_MPI_PROGRESS_US");
    *thread = v && !strcmp(v, "thread");
    if (v && !*thread && strcmp(v, "poll") != 0)
        return pt_errorf(PT_ERR_CONFIG, "PT_MPI_PROGRESS = \"%s\": the choices are poll and thread", v);
    double t = us ? atof(us) : 100.0;
    if (!(t >= 1 && t <= 1e6))
        return pt_errorf(PT_ERR_CONFIG, "PT_MPI_PROGRESS_US = \"%s\": microseconds between the "
                         "progress thread's calls, 1 to 1000000", us);
    pt_progress.interval_ns = (long)(t * 1000.0);
    return PT_OK;
}

static void pt_progress_start(void) {
    pt_progress.stop = 0;
    pt_progress.on = pthread_create(&pt_progress.thread, NULL, pt_progress_main, NULL) == 0;
    if (!pt_progress.on) pt_log_warn("PT_MPI_PROGRESS = thread: no thread could be started; "
                                     "communication progresses from the polls");
}

static void pt_progress_stop(void) {
    if (!pt_progress.on) return;
    __atomic_store_n(&pt_progress.stop, 1, __ATOMIC_RELEASE);
    pthread_join(pt_progress.thread, NULL);
    pt_progress.on = 0;
}

/* A request of c's pool for op (counted now; see pt_comm_req_take). */
static pt_mpi_req *pt_req_new(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *a,
                              const void *b) {
    if (pt_progress.on) __atomic_add_fetch(&pt_progress.pending, 1, __ATOMIC_RELAXED);
    return (pt_mpi_req *)pt_comm_req_take(c, op, bytes, a, b);
}

/* The same for a send or receive with group rank peer. */
static pt_mpi_req *pt_req_new_p2p(pt_comm *c, pt_comm_op op, uint64_t bytes, const void *buf,
                                  int peer) {
    if (pt_progress.on) __atomic_add_fetch(&pt_progress.pending, 1, __ATOMIC_RELAXED);
    return (pt_mpi_req *)pt_comm_req_take_p2p(c, op, bytes, buf, peer);
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
    pt_mpi_req *r = pt_req_new_p2p(c, PT_COMM_SEND, count * pt_dtype_size(dt), buf, peer);
    PT_MPI_CHECK(MPI_Isend(buf, pt_icount(count), pt_mpi_type(dt), peer, tag, pt_mpi(c), &r->req));
    return &r->head;
}

static pt_comm_req *mpi_irecv(pt_comm *c, void *buf, size_t count, pt_dtype dt, int peer, int tag) {
    (void)count; /* bytes count what a rank sends: the receiver's are its peer's */
    pt_mpi_req *r = pt_req_new_p2p(c, PT_COMM_RECV, 0, buf, peer);
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
    if (done && pt_progress.on) __atomic_sub_fetch(&pt_progress.pending, 1, __ATOMIC_RELAXED);
    if (done) pt_comm_req_done(c, r);
    return done;
}

static void mpi_progress(pt_comm *c) {
    (void)c;
    int flag;
    /* any MPI call drives the progress engine; MPI_Iprobe does so without side effects */
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
}

void pt_comm_mpi_allreduce_blocking(pt_comm *c, const void *send, void *buf, size_t count,
                                    pt_dtype dt) {
    c->stats.calls[PT_COMM_ALLREDUCE]++;
    c->stats.bytes[PT_COMM_ALLREDUCE] +=
        c->size > 1 ? 2 * (uint64_t)(c->size - 1) * count * pt_dtype_size(dt) / c->size : 0;
    PT_MPI_CHECK(MPI_Allreduce(send ? send : MPI_IN_PLACE, buf, pt_icount(count), pt_mpi_type(dt),
                               pt_mpi_sum(dt), pt_mpi(c)));
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
    pt_flight_group_remove(c->flight - 1);
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
    /* the flight recorder's group: its members' world ranks */
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(pt_mpi(c), MPI_COMM_WORLD, &cmp);
    if (cmp == MPI_IDENT || cmp == MPI_CONGRUENT) {
        c->flight = pt_flight_group_add(name, c->rank, c->size, NULL) + 1;
    } else {
        MPI_Group mine, world;
        int *in = pt_malloc((size_t)c->size * sizeof *in), *out = pt_malloc((size_t)c->size * sizeof *out);
        for (int i = 0; i < c->size; i++) in[i] = i;
        MPI_Comm_group(pt_mpi(c), &mine);
        MPI_Comm_group(MPI_COMM_WORLD, &world);
        MPI_Group_translate_ranks(mine, c->size, in, world, out);
        MPI_Group_free(&mine);
        MPI_Group_free(&world);
        c->flight = pt_flight_group_add(name, c->rank, c->size, out) + 1;
        free(in);
        free(out);
    }
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

/* The start-up watchdog's message, written before it is armed (a signal handler may only
 * write(2) and _exit). */
static char pt_watchdog_msg[256];
static size_t pt_watchdog_len;

static void pt_watchdog_fire(int sig) {
    (void)sig;
    ssize_t n = write(STDERR_FILENO, pt_watchdog_msg, pt_watchdog_len);
    (void)n;
    _exit(1);
}

/* Test hooks (tests/test_startup.sh): PT_INJECT_STARTUP_HANG=init:R or mesh:R makes world rank R
 * (from the launcher's environment before MPI_Init) sleep before MPI_Init or before the world's
 * handshake, as a rank that never arrives. */
static void pt_inject_hang(const char *where, int rank) {
    const char *v = getenv("PT_INJECT_STARTUP_HANG");
    size_t n = strlen(where);
    if (!v || strncmp(v, where, n) != 0 || v[n] != ':' || atoi(v + n + 1) != rank) return;
    for (;;) sleep(1000);
}

/* MPI allocates temporary buffers inside its collectives, per call (libnbc's and the tuned
 * component's reduction scratch, the shared-memory transport's fragments). glibc serves one over
 * 128 KiB by a fresh mmap and returns it by munmap, so every call touches new pages, and in a
 * virtual machine a page fault can cost ~18 µs: a 34 MB reduce-scatter over 2 ranks took 230 ms
 * instead of 15 (docs/benchmarks.md, "MPI's temporary buffers"). Keeping every allocation on the
 * heap and never trimming it lets MPI reuse the same pages from the second step on, as our own
 * buffers do (allocated at set-up). A user's MALLOC_MMAP_MAX_ / MALLOC_TRIM_THRESHOLD_ wins. */
static void pt_mpi_heap_policy(void) {
    if (!getenv("MALLOC_MMAP_MAX_")) mallopt(M_MMAP_MAX, 0);
    if (!getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 0x7fffffff);
}

static int pt_mpi_local_size = 1, pt_mpi_local_rank = 0, pt_mpi_host = 0;

pt_status pt_comm_runtime_init(int *rank, int *world) {
    *rank = 0, *world = 1;
    int thread = 0;
    PT_TRY(pt_progress_mode(&thread));
    pt_mpi_heap_policy();
    const char *env = getenv("PT_STARTUP_TIMEOUT"), *er = getenv("OMPI_COMM_WORLD_RANK");
    double timeout = env ? atof(env) : 300.0;
    int launcher_rank = er ? atoi(er) : 0;
    pt_inject_hang("init", launcher_rank);
    if (timeout > 0) { /* MPI_Init waits for every process of the job: it must not wait forever */
        int n = snprintf(pt_watchdog_msg, sizeof pt_watchdog_msg,
                         "[rank %d] error: the distributed runtime did not start within %g s "
                         "(MPI_Init: a process of the job did not start or hangs; "
                         "PT_STARTUP_TIMEOUT sets the limit)\n", launcher_rank, timeout);
        pt_watchdog_len = n > 0 && (size_t)n < sizeof pt_watchdog_msg ? (size_t)n : 0;
        signal(SIGALRM, pt_watchdog_fire);
        alarm((unsigned)(timeout < 1 ? 1 : timeout));
    }
    int provided = MPI_THREAD_SINGLE;
    int rc = thread ? MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided)
                    : MPI_Init(NULL, NULL);
    alarm(0);
    signal(SIGALRM, SIG_DFL);
    if (rc != MPI_SUCCESS)
        return pt_errorf(PT_ERR_RUNTIME, "MPI_Init failed: cannot start the distributed runtime");
    pt_set_abort(pt_mpi_abort);
    if (thread && provided < MPI_THREAD_MULTIPLE)
        pt_log_warn("PT_MPI_PROGRESS = thread: this MPI does not support MPI_THREAD_MULTIPLE; "
                    "communication progresses from the polls");
    else if (thread)
        pt_progress_start();
    MPI_Op_create(pt_mpi_bf16_sum, 1, &pt_mpi_bf16_op);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    pt_flight_start(*rank, *world);
    MPI_Comm host; /* the processes that share this host's memory */
    PT_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &host));
    MPI_Comm_size(host, &pt_mpi_local_size);
    MPI_Comm_rank(host, &pt_mpi_local_rank);
    PT_MPI_CHECK(MPI_Allreduce(rank, &pt_mpi_host, 1, MPI_INT, MPI_MIN, host));
    MPI_Comm_free(&host);
    return PT_OK;
}

int pt_comm_local_size(void) { return pt_mpi_local_size; }

void pt_comm_host(int *host, int *local_rank) {
    *host = pt_mpi_host;
    *local_rank = pt_mpi_local_rank;
}

void pt_comm_runtime_finalize(void) {
    pt_flight_finish();
    pt_progress_stop();
    if (pt_mpi_bf16_op != MPI_OP_NULL) MPI_Op_free(&pt_mpi_bf16_op);
    MPI_Finalize();
}

void pt_comm_runtime_abort(int code) { MPI_Abort(MPI_COMM_WORLD, code); }

int pt_comm_distributed(void) {
    int on = 0;
    MPI_Initialized(&on);
    return on;
}

/* The world's first exchange, before any blocking collective: every rank sends rank 0 a word,
 * rank 0 answers each once all have come. A rank that never comes is named (by rank 0) after
 * timeout_s (0: wait forever), and the job aborted. */
static void pt_world_handshake(double timeout_s) {
    enum { TAG = 0x5054 };
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    pt_inject_hang("mesh", rank);
    if (size == 1) return;
    int n = rank == 0 ? size - 1 : 2, word = rank;
    int *words = pt_calloc((size_t)size, sizeof *words);
    MPI_Request *req = pt_calloc((size_t)n, sizeof *req);
    if (rank == 0)
        for (int r = 1; r < size; r++)
            MPI_Irecv(&words[r], 1, MPI_INT, r, TAG, MPI_COMM_WORLD, &req[r - 1]);
    else {
        MPI_Isend(&word, 1, MPI_INT, 0, TAG, MPI_COMM_WORLD, &req[0]);
        MPI_Irecv(&words[0], 1, MPI_INT, 0, TAG, MPI_COMM_WORLD, &req[1]);
    }
    double t0 = pt_now();
    int done = 0;
    const struct timespec nap = {0, 1000000};
    while (!done) {
        MPI_Testall(n, req, &done, MPI_STATUSES_IGNORE);
        /* the others wait twice as long: rank 0, which knows who is missing, speaks first */
        double limit = rank == 0 ? timeout_s : 2 * timeout_s;
        if (done || timeout_s <= 0 || pt_now() - t0 < limit) {
            if (!done) nanosleep(&nap, NULL);
            continue;
        }
        if (rank == 0) { /* who never came */
            char list[256] = "";
            int missing = 0;
            for (int r = 1; r < size; r++) {
                int flag = 0;
                MPI_Test(&req[r - 1], &flag, MPI_STATUS_IGNORE);
                if (flag) continue;
                if (missing++ < 8)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d",
                             missing > 1 ? ", " : "", r);
            }
            pt_log_error("group world, start-up: waited %g s for rank%s %s%s (%d of %d ranks "
                         "never arrived; parallel.timeout_s)", timeout_s, missing > 1 ? "s" : "",
                         list, missing > 8 ? ", ..." : "", missing, size);
        } else {
            pt_log_error("group world, start-up: no answer from rank 0 within %g s (it waits for "
                         "every rank to arrive; parallel.timeout_s)", limit);
        }
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0) { /* everyone came: the answers */
        for (int r = 1; r < size; r++)
            MPI_Isend(&word, 1, MPI_INT, r, TAG, MPI_COMM_WORLD, &req[r - 1]);
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
    }
    free(req);
    free(words);
}

/* The diagnosis channel: a world communicator of its own, whose errors return to the caller
 * (ignored) instead of ending the job, so that the ranks left can talk about a dead one. Sends
 * are never waited for: their requests are dropped at once (MPI completes them on its own). */
static MPI_Comm pt_diag = MPI_COMM_NULL;

static void pt_diag_send(int to, int tag, const void *buf, size_t bytes) {
    MPI_Request req;
    static char none;
    if (MPI_Isend(buf ? buf : &none, pt_icount(bytes), MPI_BYTE, to, tag, pt_diag, &req) == MPI_SUCCESS)
        MPI_Request_free(&req);
}

static int pt_diag_pending(void) {
    int flag = 0;
    if (pt_diag != MPI_COMM_NULL) MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, pt_diag, &flag, MPI_STATUS_IGNORE);
    return flag;
}

static int pt_diag_recv(void *buf, size_t cap, int *from, int *tag, size_t *len) {
    int flag = 0, count = 0;
    MPI_Status st;
    if (pt_diag == MPI_COMM_NULL ||
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, pt_diag, &flag, &st) != MPI_SUCCESS || !flag)
        return 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    *from = st.MPI_SOURCE, *tag = st.MPI_TAG, *len = (size_t)count;
    if ((size_t)count > cap) { /* not ours to read: taken and dropped */
        char *tmp = pt_malloc((size_t)count);
        MPI_Recv(tmp, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, pt_diag, MPI_STATUS_IGNORE);
        free(tmp);
        *len = 0;
        return 1;
    }
    MPI_Recv(buf, count, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, pt_diag, MPI_STATUS_IGNORE);
    return 1;
}

pt_comm *pt_comm_world(double timeout_s) {
    pt_world_handshake(timeout_s);
    if (pt_diag == MPI_COMM_NULL) { /* after the handshake: every rank is here */
        static const pt_flight_channel ch = {pt_diag_send, pt_diag_pending, pt_diag_recv, pt_mpi_abort};
        PT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &pt_diag));
        MPI_Comm_set_errhandler(pt_diag, MPI_ERRORS_RETURN);
        pt_flight_set_channel(&ch);
    }
    MPI_Comm world;
    PT_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &world));
    return pt_comm_mpi_wrap(&world, "world", timeout_s);
}
