/* trace.c: the timeline of Chrome trace events (see include/pt/trace.h). */
#include "pt/trace.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { PT_EV_SPAN, PT_EV_WAIT, PT_EV_COMM };

typedef struct {
    double t0, t1;
    const char *name, *la, *lb; /* static strings */
    char group[16];
    uint64_t bytes;
    int32_t a, b;
    uint8_t kind;
} pt_trace_ev;

static struct {
    pt_trace_ev *ev;
    size_t n, cap, dropped;
    int rank, on;
    double origin;
} pt_tr;

void pt_trace_open(int rank, size_t capacity) {
    pt_trace_close();
    pt_tr.ev = pt_malloc(capacity * sizeof *pt_tr.ev);
    pt_tr.cap = capacity;
    pt_tr.rank = rank;
}

size_t pt_trace_bytes(size_t capacity) { return capacity * sizeof(pt_trace_ev); }

void pt_trace_record(int on) {
    if (!pt_tr.ev) return;
    if (on && !pt_tr.on) pt_tr.origin = pt_now();
    pt_tr.on = on;
}

int pt_trace_on(void) { return pt_tr.on; }

static pt_trace_ev *pt_trace_add(int kind, const char *name, double t0, double t1) {
    if (pt_tr.n == pt_tr.cap) {
        pt_tr.dropped++;
        return NULL;
    }
    pt_trace_ev *e = &pt_tr.ev[pt_tr.n++];
    memset(e, 0, sizeof *e);
    e->kind = (uint8_t)kind, e->name = name, e->t0 = t0, e->t1 = t1, e->a = e->b = -1;
    return e;
}

void pt_trace_span(const char *name, double t0, double t1, const char *la, int a, const char *lb,
                   int b) {
    if (!pt_tr.on) return;
    pt_trace_ev *e = pt_trace_add(PT_EV_SPAN, name, t0, t1);
    if (e) e->la = la, e->a = a, e->lb = lb, e->b = b;
}

static void pt_trace_group(pt_trace_ev *e, const char *group) {
    snprintf(e->group, sizeof e->group, "%s", group ? group : "");
}

void pt_trace_wait(const char *op, const char *group, double t0, double t1) {
    if (!pt_tr.on) return;
    pt_trace_ev *e = pt_trace_add(PT_EV_WAIT, op, t0, t1);
    if (e) pt_trace_group(e, group);
}

void pt_trace_comm(const char *op, const char *group, uint64_t bytes, double t0, double t1) {
    if (!pt_tr.on) return;
    if (t0 < pt_tr.origin) t0 = pt_tr.origin; /* posted before recording started */
    pt_trace_ev *e = pt_trace_add(PT_EV_COMM, op, t0, t1);
    if (e) pt_trace_group(e, group), e->bytes = bytes;
}

/* path created for writing, never through a link (pt_create_file): NULL with the message set. */
static FILE *pt_trace_create(const char *path) {
    int fd;
    if (pt_create_file(path, &fd) != PT_OK) return NULL;
    FILE *f = fdopen(fd, "w");
    if (!f) {
        pt_errorf(PT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

/* Microseconds since the origin, to the nanosecond (spans recorded in turn then nest exactly). */
static double pt_us(double t) { return (t - pt_tr.origin) * 1e6; }

pt_status pt_trace_write(const char *path, const char *label) {
    FILE *f = pt_trace_create(path);
    if (!f) {
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_last_error());
        return pt_errorf(PT_ERR_IO, "logging.trace: %s", why);
    }
    int R = pt_tr.rank;
    fprintf(f, "{\"traceEvents\": [\n");
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"%s\"}},\n", R,
            label);
    fprintf(f, "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}},\n",
            R, R);
    fprintf(f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": "
               "\"compute and waits\"}}",
            R);
    for (size_t i = 0; i < pt_tr.n; i++) {
        const pt_trace_ev *e = &pt_tr.ev[i];
        double ts = pt_us(e->t0), dur = pt_us(e->t1) - ts;
        if (e->kind == PT_EV_SPAN) {
            fprintf(f, ",\n{\"name\": \"%s", e->name);
            if (e->la) fprintf(f, " %s %d", e->la, e->a);
            if (e->lb) fprintf(f, " %s %d", e->lb, e->b);
            fprintf(f, "\", \"cat\": \"compute\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, "
                       "\"tid\": 0, \"args\": {",
                    ts, dur, R);
            if (e->la) fprintf(f, "\"%s\": %d", e->la, e->a);
            if (e->lb) fprintf(f, "%s\"%s\": %d", e->la ? ", " : "", e->lb, e->b);
            fprintf(f, "}}");
        } else if (e->kind == PT_EV_WAIT) {
            fprintf(f, ",\n{\"name\": \"wait %s %s\", \"cat\": \"wait\", \"ph\": \"X\", \"ts\": %.3f, "
                       "\"dur\": %.3f, \"pid\": %d, \"tid\": 0, \"args\": {\"group\": \"%s\", \"op\": \"%s\"}}",
                    e->group, e->name, ts, dur, R, e->group, e->name);
        } else {
            for (int end = 0; end < 2; end++)
                fprintf(f, ",\n{\"name\": \"%s %s\", \"cat\": \"comm %s\", \"ph\": \"%c\", \"id\": %zu, "
                           "\"ts\": %.3f, \"pid\": %d, \"tid\": 0, \"args\": {\"group\": \"%s\", \"bytes\": %llu}}",
                        e->group, e->name, e->group, end ? 'e' : 'b', i, end ? pt_us(e->t1) : ts, R, e->group,
                        (unsigned long long)e->bytes);
        }
    }
    fprintf(f, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"rank\": %d, \"events\": %zu, "
               "\"dropped\": %zu}}\n",
            R, pt_tr.n, pt_tr.dropped);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) return pt_errorf(PT_ERR_IO, "logging.trace: writing %s failed", path);
    if (pt_tr.dropped)
        pt_log_warn("logging.trace: %zu events past the buffer's %zu were dropped (fewer steps, or "
                    "logging.trace_events)", pt_tr.dropped, pt_tr.cap);
    return PT_OK;
}

void pt_trace_close(void) {
    free(pt_tr.ev);
    memset(&pt_tr, 0, sizeof pt_tr);
}

/* ---- merging ------------------------------------------------------------------------------ */

static int pt_trace_name_rank(const char *name) {
    int r;
    char tail[8];
    return sscanf(name, "trace-rank%d.json%7s", &r, tail) == 1 && r >= 0 ? r : -1;
}

static int pt_cmp_int(const void *a, const void *b) {
    return (*(const int *)a > *(const int *)b) - (*(const int *)a < *(const int *)b);
}

pt_status pt_trace_merge(const char *dir, const char *out) {
    DIR *d = opendir(dir);
    if (!d) return pt_errorf(PT_ERR_IO, "trace merge: cannot read the directory %s", dir);
    int *ranks = NULL, n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        int r = pt_trace_name_rank(de->d_name);
        if (r < 0) continue;
        ranks = pt_realloc(ranks, (size_t)(n + 1) * sizeof *ranks);
        ranks[n++] = r;
    }
    closedir(d);
    if (!n) return pt_errorf(PT_ERR_IO, "trace merge: no trace-rank*.json in %s (logging.trace writes them)", dir);
    qsort(ranks, (size_t)n, sizeof *ranks, pt_cmp_int);
    FILE *f = pt_trace_create(out);
    if (!f) {
        char why[1024];
        snprintf(why, sizeof why, "%s", pt_last_error());
        free(ranks);
        return pt_errorf(PT_ERR_IO, "trace merge: %s", why);
    }
    fprintf(f, "{\"traceEvents\": [\n");
    pt_status st = PT_OK;
    for (int i = 0; i < n && st == PT_OK; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/trace-rank%d.json", dir, ranks[i]);
        char *text = NULL;
        size_t len = 0;
        st = pt_read_file(path, &text, &len);
        if (st != PT_OK) break;
        /* the events: between the first '[' and the "]" that ends them (ours write it on a line
         * of its own, followed by the file's other fields) */
        const char *lo = strstr(text, "{\"traceEvents\": [\n"), *hi = strstr(text, "\n], \"displayTimeUnit\"");
        if (!lo || !hi || hi < lo) {
            st = pt_errorf(PT_ERR_FORMAT, "trace merge: %s is not a trace that logging.trace wrote", path);
        } else {
            lo += strlen("{\"traceEvents\": [\n");
            fprintf(f, "%s%.*s", i ? ",\n" : "", (int)(hi - lo), lo);
        }
        free(text);
    }
    fprintf(f, "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {\"ranks\": %d}}\n", n);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) st = st != PT_OK ? st : pt_errorf(PT_ERR_IO, "trace merge: writing %s failed", out);
    free(ranks);
    if (st != PT_OK) remove(out);
    return st;
}
