/* run_lock.c: one run per checkpoint directory (see include/pt/run_lock.h). */
#include "pt/run_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct pt_run_lock {
    pt_run_lock *next; /* the other locks this process holds */
    dev_t dev;
    ino_t ino;
    int fd, refs;
    double interval; /* seconds between heartbeats */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

/* The locks this process holds (one process, one list: trainers of one process share a hold). */
static pt_run_lock *pt_run_locks;

typedef struct {
    char host[256], started[64];
    long pid;
} pt_lock_holder;

/* The holder the lock file names; 0 when it names none (empty: released, or being written). */
static int pt_lock_read(int fd, pt_lock_holder *h) {
    char buf[1024];
    memset(h, 0, sizeof *h);
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0) return 0;
    buf[n] = 0;
    char *save = NULL;
    for (char *line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (!strncmp(line, "host = ", 7)) snprintf(h->host, sizeof h->host, "%s", line + 7);
        else if (!strncmp(line, "pid = ", 6)) h->pid = strtol(line + 6, NULL, 10);
        else if (!strncmp(line, "started = ", 10)) snprintf(h->started, sizeof h->started, "%s", line + 10);
    }
    return h->host[0] && h->pid > 0;
}

static void *pt_run_lock_beat(void *arg) {
    pt_run_lock *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double at = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + l->interval;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) == ETIMEDOUT && !l->stop)
            futimens(l->fd, NULL); /* the heartbeat: mtime = now (the server's clock on NFS) */
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Writes this process as the holder and starts the heartbeat. */
static pt_status pt_lock_take(pt_run_lock *l, const char *path, const char *host) {
    char text[1024], when[64];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(text, sizeof text,
                     "pentatron run lock: another run on this directory refuses to start while "
                     "it is held\nhost = %s\npid = %ld\nstarted = %s\nheartbeat = this file's "
                     "modification time, refreshed every %.3g s\n", host, (long)getpid(), when,
                     l->interval);
    if (ftruncate(l->fd, 0) != 0 || pwrite(l->fd, text, (size_t)n, 0) != n || fsync(l->fd) != 0)
        return pt_errorf(PT_ERR_IO, "%s: cannot write the run lock: %s", path, strerror(errno));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&l->mu, NULL);
    /* signals stay with the threads that act on them (pt/preempt.h) */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&l->thread, NULL, pt_run_lock_beat, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) return pt_errorf(PT_ERR_RUNTIME, "%s: cannot start the heartbeat: %s", path, strerror(rc));
    return PT_OK;
}

static pt_status pt_lock_held(const char *dir, const char *path, const pt_lock_holder *h, int named,
                              double age) {
    if (!named)
        return pt_errorf(PT_ERR_CONFIG, "checkpoint.dir = %s is in use by another run (%s is "
                         "locked; it does not name its holder yet): stop that run, or give this "
                         "one another checkpoint.dir", dir, path);
    return pt_errorf(PT_ERR_CONFIG, "checkpoint.dir = %s is in use by another run: pid %ld on "
                     "host %s, started %s (%s, heartbeat %.0f s ago): stop that run, or give this "
                     "one another checkpoint.dir", dir, h->pid, h->host, h->started, path,
                     age < 0 ? 0 : age);
}

pt_status pt_run_lock_acquire(pt_run_lock **out, const char *dir, double timeout_s) {
    *out = NULL;
    char path[4096], host[256] = "";
    snprintf(path, sizeof path, "%s/%s", dir, PT_RUN_LOCK_FILE);
    gethostname(host, sizeof host - 1);
    /* 0600: another user who could open it could flock it and keep every run from starting */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return pt_errorf(PT_ERR_IO, "%s: cannot open the run lock: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "%s: the run lock is not a regular file", path);
    }
    if (sb.st_nlink > 1) { /* a hard link: its other name's content would be replaced, emptied */
        close(fd);
        return pt_errorf(PT_ERR_IO, "%s: the run lock has %lu links (a hard link to another "
                         "file?): not used, since a run replaces its content; remove it", path,
                         (unsigned long)sb.st_nlink);
    }
    if ((sb.st_mode & 077) && sb.st_uid == geteuid() && fchmod(fd, 0600) != 0) /* an older 0644 */
        pt_log_warn("%s: cannot make the run lock 0600: %s", path, strerror(errno));
    for (pt_run_lock *l = pt_run_locks; l; l = l->next)
        if (l->dev == sb.st_dev && l->ino == sb.st_ino) { /* this process holds it already */
            close(fd);
            l->refs++;
            *out = l;
            return PT_OK;
        }
    int locked = flock(fd, LOCK_EX | LOCK_NB) == 0, err = locked ? 0 : errno;
    pt_lock_holder h;
    int named = pt_lock_read(fd, &h);
    for (int i = 0; i < 20 && !named && err == EWOULDBLOCK; i++) { /* the holder is writing it */
        usleep(50000);
        named = pt_lock_read(fd, &h);
    }
    fstat(fd, &sb);
    double age = difftime(time(NULL), sb.st_mtime);
    int here = named && !strcmp(h.host, host);
    const char *stale = NULL;
    char why[256];
    if (err == EWOULDBLOCK) {
        close(fd);
        return pt_lock_held(dir, path, &h, named, age);
    }
    if (!locked)
        pt_log_warn("%s: flock failed (%s): the run lock relies on the holder it names and its "
                    "heartbeat alone", path, strerror(err));
    if (named && here) {
        int alive = kill((pid_t)h.pid, 0) == 0 || errno == EPERM;
        if (!locked && alive) {
            close(fd);
            return pt_lock_held(dir, path, &h, named, age);
        }
        stale = alive ? "it holds no lock (its process is gone; the pid is another's now)"
                      : "that process no longer exists";
    } else if (named) { /* another host: flock may not reach across hosts; the heartbeat decides */
        if (age < timeout_s) {
            close(fd);
            return pt_lock_held(dir, path, &h, named, age);
        }
        snprintf(why, sizeof why, "its heartbeat is %.0f s old, over checkpoint.lock_timeout_s = "
                 "%.0f", age, timeout_s);
        stale = why;
    }
    if (stale)
        pt_log_warn("checkpoint.dir = %s: taking over the stale lock of pid %ld on host %s, "
                    "started %s: %s", dir, h.pid, h.host, h.started, stale);
    pt_run_lock *l = pt_calloc(1, sizeof *l);
    l->dev = sb.st_dev;
    l->ino = sb.st_ino;
    l->fd = fd;
    l->refs = 1;
    l->interval = timeout_s / 10;
    pt_status st = pt_lock_take(l, path, host);
    if (st != PT_OK) {
        close(fd);
        free(l);
        return st;
    }
    l->next = pt_run_locks;
    pt_run_locks = l;
    *out = l;
    return PT_OK;
}

void pt_run_lock_release(pt_run_lock *l) {
    if (!l || --l->refs > 0) return;
    for (pt_run_lock **p = &pt_run_locks; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    pthread_mutex_lock(&l->mu);
    l->stop = 1;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->cv);
    pthread_mutex_destroy(&l->mu);
    if (ftruncate(l->fd, 0) != 0) pt_log_warn("run lock: cannot empty it: %s", strerror(errno));
    close(l->fd); /* drops the flock */
    free(l);
}
