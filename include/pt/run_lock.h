/* run_lock.h: one run per checkpoint directory.
 *
 * A run holds DIR/pentatron.lock for its whole life: an exclusive flock(2) on the file, whose
 * text names the holder (host, pid, start time), and whose modification time is its heartbeat,
 * refreshed by a background thread every timeout/10 seconds. A second run on the same directory
 * refuses to start, naming the holder. A lock is stale, and taken over with a warning, when
 *   - the holder is on this host and holds no flock (the kernel drops it when a process dies,
 *     however it dies), or flock is not supported and kill(pid, 0) says the process is gone;
 *   - the holder is on another host, flock did not stop us (a directory shared over NFS may not
 *     carry flock between hosts), and its heartbeat is older than the timeout.
 * Limits: two hosts whose filesystem carries no locks between them, starting within the same
 * moment on a stale lock, can both take it (the text is written after the flock, not atomically
 * with it); a holder whose heartbeat thread stalls for the whole timeout (a host frozen longer
 * than that) is taken over from another host; the heartbeat compares the server's clock (the
 * file's mtime) with the reader's, so the hosts' clocks must agree to well within the timeout.
 * On release the text is emptied (the file stays: removing it would let a run that opened the
 * old file and one that creates a new one both hold "the" lock). A process may take the lock of
 * a directory it already holds (two trainers of one process): the holds are counted.
 */
#ifndef PT_RUN_LOCK_H
#define PT_RUN_LOCK_H

#include "pt/core.h"

#define PT_RUN_LOCK_FILE "pentatron.lock"

typedef struct pt_run_lock pt_run_lock;

/* Takes dir's lock (dir must exist) for this process: PT_OK, or PT_ERR_CONFIG naming the holder
 * ("checkpoint.dir = DIR is in use by another run: pid P on host H, started T ..."), or PT_ERR_IO
 * when the lock file cannot be made. timeout_s: how old another host's heartbeat may be. */
pt_status pt_run_lock_acquire(pt_run_lock **out, const char *dir, double timeout_s);
/* Releases a hold (NULL is fine); the last one empties the file and drops the flock. */
void pt_run_lock_release(pt_run_lock *l);

#endif
