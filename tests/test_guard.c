/* test_guard.c: the guarded backend (src/backend/cpu/guard.c, PT_BACKEND_GUARD=1), the facility
 * that proves nothing outside the backend touches backend memory:
 *   - its memory works through backend calls (upload, kernels, download; zeroed, page-aligned,
 *     reused zeroed after free);
 *   - a stray read or write outside any backend call dies of SIGSEGV (in a forked child), and the
 *     same access under a hold does not (so the test could fail);
 *   - holds nest, a backend call inside a hold leaves the memory open;
 *   - PT_BACKEND_GUARD=1 makes pt_backend_cpu_create guarded, and only then;
 *   - a comm operation on guarded memory keeps it accessible until its request completes, one on
 *     host memory does not open it.
 * Accessibility is probed without faulting by write(2) to a pipe, which fails with EFAULT on an
 * inaccessible page. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pt/backend.h"
#include "pt/comm.h"
#include "testutil.h"

static pt_backend *guarded(void) {
    pt_backend *be = pt_backend_guard(pt_backend_cpu_create(2, PT_GEMM_ONEDNN));
    if (!be) fail_msg("guarded backend: %s", pt_last_error());
    return be;
}

/* 1 when this process can read the byte at p, 0 when the page is inaccessible (EFAULT). */
static int readable(const void *p) {
    int fd[2];
    if (pipe(fd) != 0) fail_msg("pipe: %s", strerror(errno));
    ssize_t n = write(fd[1], p, 1);
    int err = errno;
    close(fd[0]);
    close(fd[1]);
    if (n < 0 && err != EFAULT) fail_msg("write to a pipe: %s", strerror(err));
    return n == 1;
}

static void test_memory_works_through_backend_calls(void **state) {
    (void)state;
    pt_backend *be = guarded();
    assert_non_null(strstr(be->describe(be), "guarded"));
    long page = sysconf(_SC_PAGESIZE);
    int M = 37, N = 29, K = 53;
    float *A = be->alloc(be, (size_t)M * K * 4), *B = be->alloc(be, (size_t)K * N * 4);
    float *C = be->alloc(be, (size_t)M * N * 4);
    assert_true((uintptr_t)A % page == 0 && (uintptr_t)B % page == 0 && (uintptr_t)C % page == 0);
    float *hA = malloc((size_t)M * K * 4), *hB = malloc((size_t)K * N * 4);
    float *hC = malloc((size_t)M * N * 4), *want = malloc((size_t)M * N * 4);
    be->download(be, hC, C, (size_t)M * N * 4);
    for (int i = 0; i < M * N; i++) assert_true(hC[i] == 0.0f); /* zeroed */
    tu_fill(hA, (size_t)M * K, 1, 1.0f);
    tu_fill(hB, (size_t)K * N, 2, 1.0f);
    be->upload(be, A, hA, (size_t)M * K * 4);
    be->upload(be, B, hB, (size_t)K * N * 4);
    be->gemm(be, PT_NO_TRANS, PT_NO_TRANS, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    be->add(be, C, C, (size_t)M * N);
    be->add(be, C, C, (size_t)M * N); /* 4·A·B */
    be->download(be, hC, C, (size_t)M * N * 4);
    double ss = 0, s = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double acc = 0;
            for (int k = 0; k < K; k++) acc += (double)hA[i * K + k] * hB[k * N + j];
            want[i * N + j] = (float)(4 * acc);
            ss += (double)hC[i * N + j] * hC[i * N + j];
            s += hC[i * N + j];
        }
    tu_check_rel("guarded gemm", tu_rel_err(hC, want, (size_t)M * N), 1e-5);
    assert_true(fabs(be->sumsq(be, C, (size_t)M * N) - ss) <= 1e-9 * ss);
    be->copy(be, A, C, (size_t)M * N * 4);
    be->zero(be, C, (size_t)M * N * 4);
    be->download(be, hA, A, (size_t)M * N * 4);
    be->download(be, hC, C, (size_t)M * N * 4);
    for (int i = 0; i < M * N; i++) assert_true(hA[i] == want[i] || fabsf(hA[i] - want[i]) < 1e-4f);
    for (int i = 0; i < M * N; i++) assert_true(hC[i] == 0.0f);
    /* outside the calls nothing is accessible */
    assert_false(readable(A));
    assert_false(readable(B));
    assert_false(readable(C));
    /* a freed block comes back zeroed */
    be->upload(be, B, hB, (size_t)K * N * 4);
    be->free(be, B);
    float *B2 = be->alloc(be, (size_t)K * N * 4);
    be->download(be, hB, B2, (size_t)K * N * 4);
    for (int i = 0; i < K * N; i++) assert_true(hB[i] == 0.0f);
    /* many allocations and frees (the expert-parallel buffers grow so) stay within the region */
    for (int i = 0; i < 200; i++) {
        void *p = be->alloc(be, (size_t)(i + 1) * 100000), *q = be->alloc(be, 100);
        be->free(be, p);
        be->free(be, q);
    }
    be->free(be, A), be->free(be, B2), be->free(be, C);
    be->destroy(be);
    free(hA), free(hB), free(hC), free(want);
}

/* Runs fn(p) in a forked child with the default SIGSEGV action (cmocka catches it otherwise);
 * returns the wait status. */
static int in_child(void (*fn)(pt_backend *, float *), pt_backend *be, float *p) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) fail_msg("fork: %s", strerror(errno));
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL);
        signal(SIGBUS, SIG_DFL);
        fn(be, p);
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) fail_msg("waitpid: %s", strerror(errno));
    return status;
}

static void stray_read(pt_backend *be, float *p) {
    (void)be;
    volatile float *v = p;
    float x = v[0];
    _exit(x == 42.0f ? 10 : 11); /* reached only when the read did not fault */
}

static void stray_write(pt_backend *be, float *p) {
    (void)be;
    volatile float *v = p;
    v[1] = 1.0f;
    _exit(12);
}

static void stray_read_after_a_call(pt_backend *be, float *p) {
    float one = 1.0f;
    be->upload(be, p + 2, &one, sizeof one); /* opens and closes the memory */
    stray_read(be, p);
}

static void read_and_write_under_a_hold(pt_backend *be, float *p) {
    (void)be;
    volatile float *v = p;
    pt_guard_hold();
    float x = v[0];
    v[1] = 7.0f;
    pt_guard_release();
    _exit(x == 42.0f ? 0 : 13);
}

static void expect_segv(const char *what, int status) {
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGSEGV)
        fail_msg("%s: the child should die of SIGSEGV; it %s %d", what,
                 WIFSIGNALED(status) ? "died of signal" : "exited with",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
}

static void test_stray_access_faults(void **state) {
    (void)state;
    pt_backend *be = guarded();
    float *p = be->alloc(be, 1000 * sizeof(float));
    float v = 42.0f;
    be->upload(be, p, &v, sizeof v);
    expect_segv("stray read", in_child(stray_read, be, p));
    expect_segv("stray write", in_child(stray_write, be, p));
    expect_segv("stray read after a backend call", in_child(stray_read_after_a_call, be, p));
    expect_segv("stray read of the block's last float", in_child(stray_read, be, p + 999));
    /* the control: the same accesses under a hold do not fault */
    int status = in_child(read_and_write_under_a_hold, be, p);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("access under a hold: the child %s %d, expected exit 0",
                 WIFSIGNALED(status) ? "died of signal" : "exited with",
                 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
    be->free(be, p);
    be->destroy(be);
}

static void test_holds_nest(void **state) {
    (void)state;
    pt_backend *be = guarded();
    float *p = be->alloc(be, 64);
    assert_false(readable(p));
    pt_guard_hold();
    assert_true(readable(p));
    pt_guard_hold();
    assert_true(readable(p));
    be->zero(be, p, 64); /* a backend call inside a hold leaves it open */
    assert_true(readable(p));
    float *q = be->alloc(be, 1 << 20); /* allocated while open: open too */
    assert_true(readable(q) && readable(q + (1 << 18) - 1));
    pt_guard_release();
    assert_true(readable(p) && readable(q));
    pt_guard_release();
    assert_false(readable(p));
    assert_false(readable(q));
    /* a second guarded backend opens and closes with the first */
    pt_backend *be2 = guarded();
    float *r = be2->alloc(be2, 64);
    assert_false(readable(r));
    pt_guard_hold();
    assert_true(readable(p) && readable(r));
    pt_guard_release();
    assert_false(readable(p) || readable(r));
    assert_true(pt_guard_covers(p) && pt_guard_covers(r) && pt_guard_covers(q));
    int local = 0;
    assert_false(pt_guard_covers(&local));
    be2->destroy(be2);
    be->destroy(be);
}

static void test_environment_enables_the_guard(void **state) {
    (void)state;
    const char *old = getenv("PT_BACKEND_GUARD");
    char *saved = old ? strdup(old) : NULL;
    setenv("PT_BACKEND_GUARD", "1", 1);
    pt_backend *be = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    assert_non_null(be);
    assert_non_null(strstr(be->describe(be), "guarded"));
    float *p = be->alloc(be, 64);
    assert_false(readable(p));
    be->destroy(be);
    unsetenv("PT_BACKEND_GUARD");
    be = pt_backend_cpu_create(1, PT_GEMM_ONEDNN);
    assert_null(strstr(be->describe(be), "guarded"));
    p = be->alloc(be, 64);
    assert_true(readable(p)); /* the plain backend is unaffected */
    p[0] = 1.0f;
    be->free(be, p);
    be->destroy(be);
    if (saved) setenv("PT_BACKEND_GUARD", saved, 1);
    free(saved);
}

static void test_comm_holds_until_completion(void **state) {
    (void)state;
    int rank, world;
    if (!pt_comm_distributed() && pt_comm_runtime_init(&rank, &world) != PT_OK) skip();
    pt_comm *c = pt_comm_world(60); /* this process alone */
    assert_int_equal(c->size, 1);
    pt_backend *be = guarded();
    float *d = be->alloc(be, 16 * sizeof(float)), *e = be->alloc(be, 16 * sizeof(float));
    float h[16], got[16];
    for (int i = 0; i < 16; i++) h[i] = (float)i;
    be->upload(be, d, h, sizeof h);
    assert_false(readable(d));
    /* a request on guarded memory holds it open until it completes */
    pt_comm_req *r = c->iallreduce(c, d, 16, PT_DTYPE_F32);
    assert_true(readable(d) && readable(e));
    pt_comm_wait(c, r);
    assert_false(readable(d));
    /* point to point: the receive into guarded memory, the send from it */
    pt_comm_req *rr = c->irecv(c, e, 16, PT_DTYPE_F32, 0, 5);
    pt_comm_req *rs = c->isend(c, d, 16, PT_DTYPE_F32, 0, 5);
    assert_true(readable(e));
    pt_comm_wait(c, rs);
    assert_true(readable(e)); /* the receive still holds */
    pt_comm_wait(c, rr);
    assert_false(readable(e));
    be->download(be, got, e, sizeof got);
    for (int i = 0; i < 16; i++) assert_true(got[i] == (float)i);
    /* an operation on host memory does not open backend memory */
    r = c->iallreduce(c, h, 16, PT_DTYPE_F32);
    assert_false(readable(d));
    pt_comm_wait(c, r);
    pt_allreduce_sum(c, d, 16, PT_DTYPE_F32); /* the blocking convenience */
    assert_false(readable(d));
    be->destroy(be);
    c->free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory_works_through_backend_calls),
        cmocka_unit_test(test_stray_access_faults),
        cmocka_unit_test(test_holds_nest),
        cmocka_unit_test(test_environment_enables_the_guard),
        cmocka_unit_test(test_comm_holds_until_completion), /* last: it starts the runtime */
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (pt_comm_distributed()) pt_comm_runtime_finalize();
    return rc;
}
