/* preempt.c: the preemption signals (pt/preempt.h). The handler is async-signal-safe: it stores
 * into sig_atomic_t flags and calls fcntl(2), write(2) and _exit(2), nothing else. */
#include "pt/preempt.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int pt_preempt_signals[3] = {SIGTERM, SIGINT, SIGUSR1};
static const char *const pt_preempt_names[3] = {"SIGTERM", "SIGINT", "SIGUSR1"};
static volatile sig_atomic_t pt_preempt_got[3];
static volatile sig_atomic_t pt_preempt_first;
/* the handler's lines, formatted at installation (snprintf is not async-signal-safe) */
static char pt_preempt_line[3][160];
static size_t pt_preempt_len[3];
/* stdout and stderr may be made non-blocking (pt_preempt_install) */
static int pt_preempt_unblock[2];

static void pt_preempt_handler(int sig) {
    for (int k = 0; k < 3; k++) {
        if (pt_preempt_signals[k] != sig) continue;
        if (pt_preempt_first) _exit(128 + sig); /* the second signal: at once */
        pt_preempt_first = sig;
        pt_preempt_got[k] = 1;
        /* a launcher that forwards SIGTERM or SIGINT may stop reading the output (Open MPI's
         * mpirun does, once it aborts the job): a write to a full pipe must not stop the save */
        for (int fd = 1; fd <= 2 && sig != SIGUSR1; fd++)
            if (pt_preempt_unblock[fd - 1]) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        ssize_t n = write(STDERR_FILENO, pt_preempt_line[k], pt_preempt_len[k]);
        (void)n;
    }
}

/* The handler's stack. On the interrupted one, the signal frame corrupted the heap in a third of
 * the tries (a SIGUSR1 mid-step, release build): some code of the step (oneDNN's JIT kernels,
 * presumably) keeps data below the stack pointer, past the red zone the kernel skips. Signals
 * sent to the process go to the main thread, which installs it, unless it blocks them. */
static char pt_preempt_stack[1 << 16];

void pt_preempt_install(int rank) {
    stack_t ss = {.ss_sp = pt_preempt_stack, .ss_size = sizeof pt_preempt_stack};
    sigaltstack(&ss, NULL);
    /* not a terminal of the user's own (its flags are shared with the shell): a pipe, a file, or
     * the pseudo-terminal a launcher made for this process */
    int launched = getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMIX_RANK") || getenv("SLURM_PROCID");
    for (int fd = 1; fd <= 2; fd++) pt_preempt_unblock[fd - 1] = launched || !isatty(fd);
    for (int k = 0; k < 3; k++) {
        snprintf(pt_preempt_line[k], sizeof pt_preempt_line[k],
                 "[rank %d] %s received: the run stops after this step and saves a checkpoint "
                 "(another signal ends it at once)\n",
                 rank, pt_preempt_names[k]);
        pt_preempt_len[k] = strlen(pt_preempt_line[k]);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = pt_preempt_handler;
        sigemptyset(&sa.sa_mask);
        /* reads and writes in progress carry on; the handler runs on its own stack */
        sa.sa_flags = SA_RESTART | SA_ONSTACK;
        sigaction(pt_preempt_signals[k], &sa, NULL);
    }
}

int pt_preempt_received(void) { return pt_preempt_first; }

int pt_preempt_agree(pt_comm *world, char *why, size_t cap) {
    int32_t n[4] = {pt_preempt_got[0], pt_preempt_got[1], pt_preempt_got[2], 1};
    if (world) pt_allreduce_sum(world, n, 4, PT_DTYPE_I32);
    int sig = 0;
    size_t at = 0;
    if (cap) why[0] = '\0';
    for (int k = 0; k < 3; k++) {
        if (!n[k]) continue;
        if (!sig) sig = pt_preempt_signals[k];
        if (at < cap)
            at += (size_t)snprintf(why + at, cap - at, "%s%s on %d of %d rank%s", at ? ", " : "",
                                   pt_preempt_names[k], n[k], n[3], n[3] > 1 ? "s" : "");
    }
    return sig;
}
