/* launch_cmd.c: `pentatron launch`: runs a training job (an `mpirun ... pentatron train ...`
 * command line, or any command) and reruns it after a failure, up to --restarts times, each time
 * after a back-off; the job resumes from its newest checkpoint because its configuration says
 * checkpoint.resume = latest (checked here when the command shows `pentatron train`). A job that
 * exits PT_EXIT_REFUSED (2: refused before training, cli/commands.h) is not rerun.
 *
 * The job runs in its own process group with stdin from /dev/null, so that a terminal's Ctrl-C
 * reaches the supervisor alone, which forwards it: SIGTERM, SIGINT, SIGUSR1 and SIGHUP sent to the
 * supervisor are passed to the job's process (mpirun forwards them to the ranks) and end the
 * supervision: the supervisor waits for the job and exits with its status. If the supervisor itself
 * dies, the job gets SIGTERM (PR_SET_PDEATHSIG).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli/commands.h"
#include "pt/checkpoint.h"
#include "pt/config.h"
#include "pt/preempt.h"

/* --restarts at most: more says a job that never succeeds, restarted for days */
enum { PT_LAUNCH_MAX_RESTARTS = 1000 };

static volatile sig_atomic_t pt_launch_signal; /* the first signal to the supervisor */
static volatile sig_atomic_t pt_launch_child;  /* the job's pid while it runs, else 0 */

static void pt_launch_handler(int sig) {
    if (!pt_launch_signal) pt_launch_signal = sig;
    if (pt_launch_child > 0) kill((pid_t)pt_launch_child, sig);
}

static void pt_launch_usage(FILE *f) {
    fprintf(f,
            "usage: pentatron launch [--restarts N] [--backoff S] [--max-backoff S] -- COMMAND...\n"
            "\n"
            "Runs COMMAND (e.g. mpirun -np 8 pentatron train --config run.ini) and, when it fails,\n"
            "runs it again, up to N times (default 3, at most %d), waiting S seconds before the\n"
            "first restart (default 10), twice as long before each next one, at most --max-backoff\n"
            "(default 600). The job must save checkpoints and resume from the newest: checkpoint.dir\n"
            "set and checkpoint.resume = latest (checked when COMMAND runs `pentatron train`).\n"
            "SIGTERM, SIGINT, SIGUSR1 and SIGHUP to the launcher are forwarded to COMMAND and end\n"
            "the supervision.\n"
            "\n"
            "The job's exit status decides (pentatron train's; docs/guide.md, \"Running unattended\"):\n"
            "  0          done: the launcher exits 0\n"
            "  %d, 128+N   failed while running (a rank died, a collective timed out), killed by\n"
            "             signal N: restarted\n"
            "  %d          refused before training (configuration, layout, input files): the same\n"
            "             again would be refused, so it is not restarted; the launcher exits %d\n"
            "  %d         preempted after saving a checkpoint: restarted\n"
            "When no restart is left the launcher exits with the job's last status; with %d for its\n"
            "own bad arguments or a job it refuses to run.\n",
            PT_LAUNCH_MAX_RESTARTS, PT_EXIT_FAILED, PT_EXIT_REFUSED, PT_EXIT_REFUSED,
            PT_EXIT_PREEMPTED, PT_EXIT_REFUSED);
}

static int pt_launch_number(const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || *end || errno || !(v >= lo && v <= hi)) {
        fprintf(stderr, "pentatron launch: %s needs a number in [%g, %g], got \"%s\"\n", opt, lo,
                hi, s ? s : "");
        return 0;
    }
    *out = v;
    return 1;
}

/* The job's `pentatron train` arguments parsed as train would (INI file, then overrides): 1 and
 * cfg filled when the command shows them, 0 when it does not (a script, another program), -1 on
 * a configuration error (reported). */
static int pt_launch_job_config(int argc, char **argv, pt_config *cfg) {
    for (int i = 1; i < argc; i++) {
        const char *prog = strrchr(argv[i - 1], '/');
        prog = prog ? prog + 1 : argv[i - 1];
        if (strcmp(argv[i], "train") != 0 || strcmp(prog, "pentatron") != 0) continue;
        int n = 0; /* up to mpirun's next program (MPMD: `:`) */
        while (i + 1 + n < argc && strcmp(argv[i + 1 + n], ":") != 0) n++;
        pt_config_defaults(cfg);
        if (pt_config_from_args(cfg, n, argv + i + 1) != PT_OK) {
            fprintf(stderr, "pentatron launch: the job's configuration: %s\n", pt_last_error());
            return -1;
        }
        return 1;
    }
    return 0;
}

/* Runs the job once; its exit status (128 + the signal's number when a signal ended it). */
static int pt_launch_run(char **cmd) {
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "pentatron launch: fork: %s\n", strerror(errno));
        return 1;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        int fd = open("/dev/null", O_RDONLY);
        if (fd >= 0) dup2(fd, STDIN_FILENO);
        signal(SIGTERM, SIG_DFL), signal(SIGINT, SIG_DFL), signal(SIGUSR1, SIG_DFL),
            signal(SIGHUP, SIG_DFL);
        execvp(cmd[0], cmd);
        fprintf(stderr, "pentatron launch: cannot run %s: %s\n", cmd[0], strerror(errno));
        _exit(127);
    }
    pt_launch_child = pid;
    if (pt_launch_signal) kill(pid, pt_launch_signal); /* arrived while it was being started */
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    pt_launch_child = 0;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static const char *pt_launch_why(int code) {
    if (code == PT_EXIT_PREEMPTED) return " (preempted: its checkpoint saved)";
    if (code == PT_EXIT_REFUSED) return " (refused before training: its configuration, layout or input files)";
    if (code == 127) return " (the command was not found)";
    if (code > 128) return " (ended by a signal)";
    return "";
}

/* Sleeps s seconds unless a signal to the supervisor ends it sooner. */
static void pt_launch_sleep(double s) {
    for (double t = 0; t < s && !pt_launch_signal; t += 0.1) {
        struct timespec ts = {0, 100000000L};
        nanosleep(&ts, NULL);
    }
}

int pt_cmd_launch(int argc, char **argv) {
    double restarts = 3, backoff = 10, max_backoff = 600;
    int i = 0;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            pt_launch_usage(stdout);
            return 0;
        }
        int ok = !strcmp(a, "--restarts")      ? pt_launch_number(a, v, 0, PT_LAUNCH_MAX_RESTARTS, &restarts)
                 : !strcmp(a, "--backoff")     ? pt_launch_number(a, v, 0, 86400, &backoff)
                 : !strcmp(a, "--max-backoff") ? pt_launch_number(a, v, 0, 86400, &max_backoff)
                                               : -1;
        if (ok == -1) fprintf(stderr, "pentatron launch: unknown option \"%s\"\n\n", a);
        if (ok != 1) {
            if (ok == -1) pt_launch_usage(stderr);
            return PT_EXIT_REFUSED;
        }
        i++;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "pentatron launch: no command after --\n\n");
        pt_launch_usage(stderr);
        return PT_EXIT_REFUSED;
    }
    char **cmd = argv + i + 1;
    int ncmd = argc - i - 1;

    /* a restart is only worth it when the job continues from its newest checkpoint */
    pt_config cfg;
    int known = pt_launch_job_config(ncmd, cmd, &cfg);
    if (known < 0) return PT_EXIT_REFUSED;
    if (known && (!cfg.checkpoint.dir[0] || strcmp(cfg.checkpoint.resume, "latest") != 0)) {
        fprintf(stderr, "pentatron launch: a restarted job would start again from step 0: its "
                        "configuration needs checkpoint.dir and checkpoint.resume = latest (add "
                        "--checkpoint.dir=DIR --checkpoint.resume=latest)\n");
        return PT_EXIT_REFUSED;
    }
    if (!known)
        pt_log_warn("launch: no `pentatron train` in the command: cannot check that the job "
                    "saves checkpoints and resumes from the newest (checkpoint.resume = latest)");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = pt_launch_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    const int sigs[] = {SIGTERM, SIGINT, SIGUSR1, SIGHUP};
    for (size_t k = 0; k < sizeof sigs / sizeof *sigs; k++) sigaction(sigs[k], &sa, NULL);

    double wait_s = backoff;
    for (int run = 0;; run++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        int code = pt_launch_run(cmd);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double took = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (code == 0) {
            if (run > 0) pt_log_info("launch: the job completed after %d restart%s", run,
                                     run > 1 ? "s" : "");
            return 0;
        }
        if (pt_launch_signal) {
            pt_log_warn("launch: %s to the launcher, forwarded to the job, which exited with %d%s: "
                        "supervision ends", strsignal(pt_launch_signal), code, pt_launch_why(code));
            return code;
        }
        if (code == PT_EXIT_REFUSED) { /* the same command would be refused again */
            pt_log_error("launch: the job exited with %d%s after %.1f s: not restarted (fix the "
                         "job; its message is above)", code, pt_launch_why(code), took);
            return code;
        }
        if (run >= (int)restarts) {
            pt_log_error("launch: the job exited with %d%s after %.1f s; no restart left (%d "
                         "made): giving up", code, pt_launch_why(code), took, run);
            return code;
        }
        char from[PT_PATH_MAX + 32] = "step 0 (no checkpoint yet)";
        if (known && pt_ckpt_find_latest(cfg.checkpoint.dir, from, sizeof from) != PT_OK)
            snprintf(from, sizeof from, "step 0 (no checkpoint yet)");
        pt_log_warn("launch: the job exited with %d%s after %.1f s; restart %d of %d in %.0f s, "
                    "from %s", code, pt_launch_why(code), took, run + 1, (int)restarts, wait_s,
                    known ? from : "its newest checkpoint");
        pt_launch_sleep(wait_s);
        if (pt_launch_signal) {
            pt_log_warn("launch: %s to the launcher while waiting to restart: supervision ends",
                        strsignal(pt_launch_signal));
            return code;
        }
        wait_s = wait_s * 2 < max_backoff ? wait_s * 2 : max_backoff;
    }
}
