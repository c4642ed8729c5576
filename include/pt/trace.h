/* trace.h: a per-rank timeline of a run's steps as Chrome trace events (JSON; chrome://tracing and
 * Perfetto read it), logging.trace = DIR, logging.trace_steps = "A-B".
 *
 * What records: spans of computation on the rank's thread ("X" events that nest: the step, a
 * pipeline action or a micro-batch, a layer's forward or backward, the head, the optimizer), every
 * wait of the communication layer as a span named after the operation with its group (the blocked
 * time: per group they add up to the run's comm_wait_groups), and every communication from its post
 * to its completion as an async pair ("b"/"e", one id each) with its group and bytes. The buffer
 * is made once (pt_trace_open); events past its capacity are dropped and counted. A span's name
 * is a static string and its numbers (layer, micro-batch, chunk) are formatted when written, so
 * recording costs a clock read and a few stores. Off (the default), every call returns at once.
 */
#ifndef PT_TRACE_H
#define PT_TRACE_H

#include <stdint.h>

#include "pt/core.h"

/* Makes the buffer (capacity events) for a rank; nothing records until pt_trace_record(1). */
void pt_trace_open(int rank, size_t capacity);
/* The bytes of that buffer (logging.trace_events: counted by the memory check at set-up). */
size_t pt_trace_bytes(size_t capacity);
/* Starts (on = 1, the clock's origin then) or stops recording. */
void pt_trace_record(int on);
/* Whether events are being recorded now. */
int pt_trace_on(void);
/* A span of computation [t0, t1] (pt_now seconds): name (static), and up to two numbers with
 * their labels (static; NULL: none), e.g. ("forward", t0, t1, "layer", 3, NULL, 0). */
void pt_trace_span(const char *name, double t0, double t1, const char *la, int a, const char *lb,
                   int b);
/* A wait of the communication layer: blocked [t0, t1] for operation `op` over group `group`. */
void pt_trace_wait(const char *op, const char *group, double t0, double t1);
/* A communication from post (t0) to completion (t1), bytes moved by this rank. */
void pt_trace_comm(const char *op, const char *group, uint64_t bytes, double t0, double t1);
/* Writes the events to path ({"traceEvents": [...]}: one per line), process = rank with its
 * label (e.g. "rank 3: dp 1 pp 1 tp 1"); says how many were dropped. Frees nothing. */
pt_status pt_trace_write(const char *path, const char *label);
void pt_trace_close(void);
/* Merges the per-rank files DIR/trace-rank*.json into out, one process per rank. */
pt_status pt_trace_merge(const char *dir, const char *out);

#endif
