/* preempt.h: stopping a run cleanly on the signals schedulers send before they preempt a job.
 *
 * SIGTERM, SIGINT and SIGUSR1 set a flag (the handler does nothing else but write one line); at
 * each step boundary the ranks agree, with one small all-reduce over the world, whether any rank
 * got one, and if so every rank saves a checkpoint and exits with PT_EXIT_PREEMPTED. A second
 * signal to a rank that already got one ends that process at once, with 128 + the signal's
 * number, as a shell reports a death by that signal (nothing is saved then).
 */
#ifndef PT_PREEMPT_H
#define PT_PREEMPT_H

#include "pt/comm.h"

/* The exit status of a run stopped by a signal after saving (sysexits.h's EX_TEMPFAIL: "try
 * again later"); `pentatron launch` restarts a job that ends with it. */
enum { PT_EXIT_PREEMPTED = 75 };

/* Installs the handlers of SIGTERM, SIGINT and SIGUSR1 (after the distributed runtime has
 * started, so that it cannot replace them). rank names the process in the handler's line. */
void pt_preempt_install(int rank);
/* Collective over world (NULL: this process alone): the signals received by any rank since
 * the handlers were installed, agreed by every rank. Returns the number of one of them (the
 * first in the order SIGTERM, SIGINT, SIGUSR1 that some rank received), 0 when none was, and
 * describes them in why ("SIGTERM on 2 of 4 ranks"). */
int pt_preempt_agree(pt_comm *world, char *why, size_t cap);
/* The signal this process received first (0: none), for tests. */
int pt_preempt_received(void);

#endif
