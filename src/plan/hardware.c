/* hardware.c: the hardware file of `pentatron plan` (include/pt/plan.h, docs/plan.md): read
 * (INI through libinih, every key known and checked, "hardware.key=value" overrides after the
 * file) and written (the same format, each key with a comment saying where its figure came
 * from). */
#include "pt/plan.h"

#include <errno.h>
#include <fcntl.h>
#include <ini.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { PT_HW_STR, PT_HW_INT, PT_HW_NUM, PT_HW_SHAPES, PT_HW_COLLS, PT_HW_SIZES, PT_HW_COMM } pt_hw_type;

/* The keys, in the file's order (the order of pt_hardware_write's `how`). */
static const struct {
    const char *key;
    pt_hw_type type;
    size_t offset;
    int required;
    const char *unit; /* for messages and the written comments */
} pt_hw_keys[PT_HW_N_KEYS] = {
    {"name", PT_HW_STR, offsetof(pt_hardware, name), 1, "text"},
    {"devices_per_node", PT_HW_INT, offsetof(pt_hardware, devices_per_node), 1, "ranks per host"},
    {"nodes", PT_HW_INT, offsetof(pt_hardware, nodes), 1, "hosts"},
    {"peak_flops", PT_HW_NUM, offsetof(pt_hardware, peak_flops), 1, "FLOP/s per device"},
    {"gemm_efficiency", PT_HW_NUM, offsetof(pt_hardware, gemm_efficiency), 0, "in (0, 1]"},
    {"memory_bytes", PT_HW_NUM, offsetof(pt_hardware, memory_bytes), 1, "bytes per device"},
    {"memory_bw", PT_HW_NUM, offsetof(pt_hardware, memory_bw), 1, "bytes/s"},
    {"intra_bw", PT_HW_NUM, offsetof(pt_hardware, intra_bw), 1, "bytes/s per direction"},
    {"intra_latency", PT_HW_NUM, offsetof(pt_hardware, intra_latency), 1, "seconds"},
    {"inter_bw", PT_HW_NUM, offsetof(pt_hardware, inter_bw), 1, "bytes/s per direction"},
    {"inter_latency", PT_HW_NUM, offsetof(pt_hardware, inter_latency), 1, "seconds"},
    {"gemm_shapes", PT_HW_SHAPES, 0, 0, "m,n,k,flops; ..."},
    {"gemm_units", PT_HW_INT, offsetof(pt_hardware, gemm_units), 0, "processors (SMs) per device"},
    {"gemm_tile_m", PT_HW_INT, offsetof(pt_hardware, gemm_tile_m), 0, "rows of a GEMM's output tile"},
    {"gemm_tile_n", PT_HW_INT, offsetof(pt_hardware, gemm_tile_n), 0, "columns of a GEMM's output tile"},
    {"attention_flops", PT_HW_NUM, offsetof(pt_hardware, attention_flops), 0, "attention FLOP/s"},
    {"xent_rate", PT_HW_NUM, offsetof(pt_hardware, xent_rate), 0, "cross-entropy logits/s"},
    {"intra_overlap", PT_HW_SIZES, offsetof(pt_hardware, overlap[0]), 0, "a share in [0, 1], or bytes,share; ..."},
    {"inter_overlap", PT_HW_SIZES, offsetof(pt_hardware, overlap[1]), 0, "a share in [0, 1], or bytes,share; ..."},
    {"intra_rendezvous", PT_HW_SIZES, offsetof(pt_hardware, rendezvous[0]), 0, "0 or 1, or bytes,0|1; ..."},
    {"inter_rendezvous", PT_HW_SIZES, offsetof(pt_hardware, rendezvous[1]), 0, "0 or 1, or bytes,0|1; ..."},
    {"collectives", PT_HW_COLLS, 0, 0, "kind,where,ranks,bytes,seconds; ..."},
    {"skew", PT_HW_NUM, offsetof(pt_hardware, skew), 0, "in [0, 1)"},
    {"overlap_slowdown", PT_HW_NUM, offsetof(pt_hardware, overlap_slowdown), 0, "in [0, 1]"},
    {"comm", PT_HW_COMM, offsetof(pt_hardware, nccl), 0, "mpi or nccl"},
};

static const char *const pt_hw_coll_names[] = {"ar", "rs", "ag", "p2p"};

static int pt_hw_find(const char *key) {
    for (int i = 0; i < PT_HW_N_KEYS; i++)
        if (!strcmp(pt_hw_keys[i].key, key)) return i;
    return -1;
}

static const char *pt_hw_skip_space(const char *s) {
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

/* Reads n numbers separated by commas from q into v; the count read (n: all, and nothing after). */
static int pt_hw_numbers(const char *q, double *v, int n) {
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        v[i] = strtod(q, &end);
        if (end == q || errno || !isfinite(v[i])) return i;
        q = pt_hw_skip_space(end);
        if (i < n - 1 && *q++ != ',') return i;
    }
    return *q ? n - 1 : n;
}

/* The next entry of a list "a; b; ..." from *p into entry (advancing *p); 0 at the end, -1 when
 * it is longer than cap. Empty entries are skipped. */
static int pt_hw_entry(const char **p, char *entry, size_t cap) {
    while (**p) {
        const char *semi = strchr(*p, ';');
        size_t len = semi ? (size_t)(semi - *p) : strlen(*p);
        if (len >= cap) return -1;
        memcpy(entry, *p, len);
        entry[len] = 0;
        *p += len + (semi ? 1 : 0);
        if (*pt_hw_skip_space(entry)) return 1;
    }
    return 0;
}

/* Appends the shapes of "m,n,k,flops; m,n,k,flops; ..." to hw. */
static pt_status pt_hw_parse_shapes(pt_hardware *hw, const char *val) {
    char entry[256];
    int got;
    while ((got = pt_hw_entry(&val, entry, sizeof entry)) != 0) {
        if (got < 0)
            return pt_errorf(PT_ERR_CONFIG, "gemm_shapes: an entry of more than %zu characters "
                             "(expected \"m,n,k,flops\")", sizeof entry - 1);
        double v[4];
        if (pt_hw_numbers(entry, v, 4) < 4)
            return pt_errorf(PT_ERR_CONFIG, "gemm_shapes: entry %d \"%s\": expected "
                             "\"m,n,k,flops\" (four numbers separated by commas, entries by ';')",
                             hw->n_shapes + 1, pt_hw_skip_space(entry));
        for (int i = 0; i < 3; i++)
            if (!(v[i] >= 1) || v[i] != floor(v[i]))
                return pt_errorf(PT_ERR_CONFIG, "gemm_shapes: entry %d \"%s\": m, n and k must "
                                 "be positive integers", hw->n_shapes + 1, pt_hw_skip_space(entry));
        if (!(v[3] > 0))
            return pt_errorf(PT_ERR_CONFIG, "gemm_shapes: entry %d \"%s\": flops must be > 0",
                             hw->n_shapes + 1, pt_hw_skip_space(entry));
        if (hw->n_shapes >= PT_HW_MAX_SHAPES)
            return pt_errorf(PT_ERR_CONFIG, "gemm_shapes: more than the %d shapes allowed",
                             PT_HW_MAX_SHAPES);
        hw->shapes[hw->n_shapes++] = (pt_gemm_shape){v[0], v[1], v[2], v[3]};
    }
    return PT_OK;
}

/* Appends the collectives of "kind,where,ranks,bytes,seconds; ..." to hw. */
static pt_status pt_hw_parse_colls(pt_hardware *hw, const char *val) {
    char entry[256];
    int got;
    while ((got = pt_hw_entry(&val, entry, sizeof entry)) != 0) {
        const int e = hw->n_colls + 1;
        if (got < 0)
            return pt_errorf(PT_ERR_CONFIG, "collectives: an entry of more than %zu characters "
                             "(expected \"kind,where,ranks,bytes,seconds\")", sizeof entry - 1);
        const char *q = pt_hw_skip_space(entry);
        int kind = -1, inter = -1;
        for (int i = 0; i < 4 && kind < 0; i++) {
            size_t len = strlen(pt_hw_coll_names[i]);
            if (!strncmp(q, pt_hw_coll_names[i], len) && q[len] == ',') kind = i, q = pt_hw_skip_space(q + len + 1);
        }
        if (!strncmp(q, "intra,", 6)) inter = 0, q += 6;
        else if (!strncmp(q, "inter,", 6)) inter = 1, q += 6;
        double v[3];
        if (kind < 0 || inter < 0 || pt_hw_numbers(q, v, 3) < 3)
            return pt_errorf(PT_ERR_CONFIG, "collectives: entry %d \"%s\": expected "
                             "\"kind,where,ranks,bytes,seconds\" (kind ar, rs, ag or p2p; where intra "
                             "or inter; entries separated by ';')", e, pt_hw_skip_space(entry));
        if (!(v[0] >= 2) || v[0] != floor(v[0]) || v[0] > 1e9 || !(v[1] > 0) || !(v[2] > 0))
            return pt_errorf(PT_ERR_CONFIG, "collectives: entry %d \"%s\": ranks must be an "
                             "integer >= 2, bytes and seconds > 0", e, pt_hw_skip_space(entry));
        if (kind == PT_HW_P2P && v[0] != 2)
            return pt_errorf(PT_ERR_CONFIG, "collectives: entry %d \"%s\": a p2p entry is one "
                             "message between 2 ranks", e, pt_hw_skip_space(entry));
        if (hw->n_colls >= PT_HW_MAX_COLLS)
            return pt_errorf(PT_ERR_CONFIG, "collectives: more than the %d entries allowed",
                             PT_HW_MAX_COLLS);
        hw->colls[hw->n_colls++] = (pt_coll_time){(pt_hw_coll)kind, inter, (int)v[0], v[1], v[2]};
    }
    return PT_OK;
}

/* Appends the entries of "bytes,value; ..." (or the one value of "value") to l, key i's. */
static pt_status pt_hw_parse_sizes(pt_hw_sizes *l, int i, const char *val) {
    const char *key = pt_hw_keys[i].key;
    int binary = strstr(key, "_rendezvous") != NULL;
    char entry[256];
    int got;
    while ((got = pt_hw_entry(&val, entry, sizeof entry)) != 0) {
        const char *q = pt_hw_skip_space(entry);
        double v[2];
        int one = got > 0 && !strchr(q, ','); /* one value for every size */
        int n = got < 0 ? 0 : pt_hw_numbers(q, v, one ? 1 : 2);
        if (one && n == 1) v[1] = v[0], v[0] = 0;
        else if (n < 2)
            return pt_errorf(PT_ERR_CONFIG, "%s: entry %d \"%.60s\": expected a value or \"bytes,value\" "
                             "entries separated by ';' (%s)", key, l->n + 1, q, pt_hw_keys[i].unit);
        if ((l->n > 0 && (v[0] == 0 || l->bytes[0] == 0)) || (v[0] != 0 && !(v[0] >= 1)) ||
            (l->n > 0 && !(v[0] > l->bytes[l->n - 1])))
            return pt_errorf(PT_ERR_CONFIG, "%s: entry %d \"%.60s\": sizes must be >= 1 byte and "
                             "ascending, or one value alone", key, l->n + 1, q);
        if (!(v[1] >= 0 && v[1] <= 1) || (binary && v[1] != 0 && v[1] != 1))
            return pt_errorf(PT_ERR_CONFIG, "%s: entry %d \"%.60s\": the value must be %s", key, l->n + 1, q,
                             binary ? "0 or 1 (1: the message waits for both peers to call in)"
                                    : "in [0, 1] (the share of a transfer that moves while the ranks compute)");
        if (l->n >= PT_HW_MAX_SIZES)
            return pt_errorf(PT_ERR_CONFIG, "%s: more than the %d entries allowed", key, PT_HW_MAX_SIZES);
        l->bytes[l->n] = v[0], l->value[l->n++] = v[1];
    }
    return PT_OK;
}

double pt_hw_sizes_at(const pt_hw_sizes *l, double bytes, double dflt) {
    if (l->n == 0) return dflt;
    if (bytes <= l->bytes[0] || l->n == 1) return l->value[0];
    for (int j = 1; j < l->n; j++)
        if (bytes <= l->bytes[j]) {
            double x = log(bytes / l->bytes[j - 1]) / log(l->bytes[j] / l->bytes[j - 1]);
            return l->value[j - 1] + x * (l->value[j] - l->value[j - 1]);
        }
    return l->value[l->n - 1];
}

/* Sets key i from the text raw (quotes around it taken off). */
static pt_status pt_hw_set(pt_hardware *hw, int i, const char *raw) {
    const char *key = pt_hw_keys[i].key;
    char val[4096];
    size_t len = strlen(raw);
    if (len >= sizeof val)
        return pt_errorf(PT_ERR_CONFIG, "%s: value of %zu characters, longer than the %zu allowed",
                         key, len, sizeof val - 1);
    memcpy(val, raw, len + 1);
    char *s = val;
    if (pt_hw_keys[i].type >= PT_HW_SHAPES) {
        /* it may run over several lines (continuation lines, each passed here), the quotes
         * opening on the first and closing on the last */
        if (*s == '"') s++, len--;
        if (len > 0 && s[len - 1] == '"') s[--len] = 0;
    } else if ((len >= 1 && val[0] == '"') != (len >= 2 && val[len - 1] == '"')) {
        return pt_errorf(PT_ERR_CONFIG, "%s: unmatched quote in %s (in INI a ';' after a space "
                         "starts a comment)", key, raw);
    } else if (val[0] == '"') {
        s++, len -= 2;
        s[len] = 0;
    }
    char *end = NULL;
    errno = 0;
    switch (pt_hw_keys[i].type) {
    case PT_HW_COMM:
        if (strcmp(s, "mpi") && strcmp(s, "nccl"))
            return pt_errorf(PT_ERR_CONFIG, "comm = %s: expected mpi (pentatron's comm layer over MPI: "
                             "hierarchical across nodes) or nccl (NCCL's flat rings)", s);
        hw->nccl = !strcmp(s, "nccl");
        break;
    case PT_HW_STR:
        if (len >= sizeof hw->name)
            return pt_errorf(PT_ERR_CONFIG, "name: %zu characters, longer than the %zu allowed",
                             len, sizeof hw->name - 1);
        memcpy(hw->name, s, len + 1);
        break;
    case PT_HW_INT: {
        long v = strtol(s, &end, 10);
        if (!*s || *end || errno || v < 1 || v > 1000000000L)
            return pt_errorf(PT_ERR_CONFIG, "%s: expected a positive integer (%s), got \"%s\"",
                             key, pt_hw_keys[i].unit, s);
        *(int *)((char *)hw + pt_hw_keys[i].offset) = (int)v;
        break;
    }
    case PT_HW_NUM: {
        double v = strtod(s, &end);
        if (!*s || *end || errno || !isfinite(v))
            return pt_errorf(PT_ERR_CONFIG, "%s: expected a number (%s), got \"%s\"", key,
                             pt_hw_keys[i].unit, s);
        int share = !strcmp(key, "skew") || !strcmp(key, "overlap_slowdown"); /* 0 is a value */
        if (share && !(v >= 0 && v <= 1))
            return pt_errorf(PT_ERR_CONFIG, "%s = %s: must be in [0, 1] (%s)", key, s,
                             !strcmp(key, "skew") ? "the mean wait at a synchronization per second "
                                                    "of computation"
                                                  : "the computation's slowdown while a transfer "
                                                    "overlaps it");
        if (!share && !(v > 0))
            return pt_errorf(PT_ERR_CONFIG, "%s = %s: must be > 0 (%s)", key, s, pt_hw_keys[i].unit);
        if (!strcmp(key, "gemm_efficiency") && v > 1)
            return pt_errorf(PT_ERR_CONFIG, "gemm_efficiency = %s: must be in (0, 1] (the fraction "
                             "of peak_flops that large GEMMs reach)", s);
        *(double *)((char *)hw + pt_hw_keys[i].offset) = v;
        break;
    }
    case PT_HW_SHAPES:
        return pt_hw_parse_shapes(hw, s);
    case PT_HW_COLLS:
        return pt_hw_parse_colls(hw, s);
    case PT_HW_SIZES:
        return pt_hw_parse_sizes((pt_hw_sizes *)((char *)hw + pt_hw_keys[i].offset), i, s);
    }
    return PT_OK;
}

typedef struct {
    pt_hardware *hw;
    int seen[PT_HW_N_KEYS];
    char last[64]; /* the key of the previous line: a continuation line repeats it */
    pt_status status;
    char msg[1024];
} pt_hw_state;

static int pt_hw_handler(void *user, const char *section, const char *name, const char *value) {
    pt_hw_state *s = user;
    if (s->status != PT_OK) return 0;
    int i = strcmp(section, "hardware") ? -1 : pt_hw_find(name);
    pt_status st = PT_OK;
    if (strcmp(section, "hardware"))
        st = pt_errorf(PT_ERR_CONFIG, "unknown section [%s] (a hardware file has [hardware] only)",
                       section);
    else if (i < 0)
        st = pt_errorf(PT_ERR_CONFIG, "unknown key \"%s\" (the keys: name, devices_per_node, "
                       "nodes, peak_flops, gemm_efficiency, memory_bytes, memory_bw, intra_bw, "
                       "intra_latency, inter_bw, inter_latency, gemm_shapes, gemm_units, gemm_tile_m, "
                       "gemm_tile_n, attention_flops, xent_rate, intra_overlap, inter_overlap, intra_rendezvous, inter_rendezvous, collectives, skew, overlap_slowdown, comm)",
                       name);
    else if (s->seen[i] && !(pt_hw_keys[i].type >= PT_HW_SHAPES && !strcmp(s->last, name)))
        st = pt_errorf(PT_ERR_CONFIG, "%s given twice", name);
    else
        st = pt_hw_set(s->hw, i, value);
    if (st != PT_OK) {
        s->status = st;
        snprintf(s->msg, sizeof s->msg, "%s", pt_last_error());
        return 0;
    }
    s->seen[i] = 1;
    snprintf(s->last, sizeof s->last, "%s", name);
    return 1;
}

pt_status pt_hardware_load(pt_hardware *hw, const char *path, const char *const *overrides, int n) {
    memset(hw, 0, sizeof *hw);
    hw->gemm_efficiency = 1.0;
    pt_hw_state s = {.hw = hw, .status = PT_OK};
    int fd;
    PT_TRY(pt_open_regular(path, "hardware file", &fd));
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "%s: cannot open hardware file: %s", path, strerror(errno));
    }
    int rc = ini_parse_file(f, pt_hw_handler, &s);
    fclose(f);
    if (rc == -2) return pt_errorf(PT_ERR_MEMORY, "%s: out of memory parsing", path);
    if (rc > 0) {
        if (s.status != PT_OK) return pt_errorf(s.status, "%s:%d: %s", path, rc, s.msg);
        return pt_errorf(PT_ERR_CONFIG, "%s:%d: syntax error (expected [hardware] or key = value; "
                         "lines of at most 199 characters)", path, rc);
    }
    for (int j = 0; j < n; j++) {
        const char *o = overrides[j];
        while (*o == '-') o++;
        const char *eq = strchr(o, '=');
        char key[64];
        size_t kl = eq ? (size_t)(eq - o) : 0;
        if (!eq || strncmp(o, "hardware.", 9) || kl - 9 >= sizeof key)
            return pt_errorf(PT_ERR_CONFIG, "override \"%s\": expected hardware.KEY=VALUE",
                             overrides[j]);
        memcpy(key, o + 9, kl - 9);
        key[kl - 9] = 0;
        int i = pt_hw_find(key);
        if (i < 0)
            return pt_errorf(PT_ERR_CONFIG, "override \"%s\": unknown key \"%s\" of %s",
                             overrides[j], key, path);
        if (pt_hw_keys[i].type == PT_HW_SHAPES) hw->n_shapes = 0; /* replaces the file's */
        if (pt_hw_keys[i].type == PT_HW_COLLS) hw->n_colls = 0;
        if (pt_hw_keys[i].type == PT_HW_SIZES) ((pt_hw_sizes *)((char *)hw + pt_hw_keys[i].offset))->n = 0;
        pt_status st = pt_hw_set(hw, i, eq + 1);
        if (st != PT_OK) {
            char why[1024]; /* copied out of the buffer pt_errorf writes */
            snprintf(why, sizeof why, "%s", pt_last_error());
            return pt_errorf(st, "override \"%s\": %s", overrides[j], why);
        }
        s.seen[i] = 1;
    }
    char missing[512] = "";
    size_t used = 0;
    for (int i = 0; i < PT_HW_N_KEYS; i++)
        if (pt_hw_keys[i].required && !s.seen[i] && used < sizeof missing)
            used += (size_t)snprintf(missing + used, sizeof missing - used, "%s%s",
                                     used ? ", " : "", pt_hw_keys[i].key);
    if (used)
        return pt_errorf(PT_ERR_CONFIG, "%s: missing key%s %s in [hardware]", path,
                         strchr(missing, ',') ? "s" : "", missing);
    int quant = (hw->gemm_units > 0) + (hw->gemm_tile_m > 0) + (hw->gemm_tile_n > 0);
    if (quant != 0 && quant != 3)
        return pt_errorf(PT_ERR_CONFIG, "%s: gemm_units, gemm_tile_m and gemm_tile_n go together "
                         "(the wave and tile quantization needs all three)", path);
    return PT_OK;
}

/* Appends to the text (grown as needed). */
typedef struct {
    char *p;
    size_t len, cap;
} pt_hw_text;

static void pt_hw_printf(pt_hw_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pt_hw_printf(pt_hw_text *t, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        PT_ASSERT(n >= 0);
        if (t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        t->cap = 2 * (t->cap + (size_t)n);
        t->p = realloc(t->p, t->cap);
        PT_ASSERT(t->p);
    }
}

pt_status pt_hardware_write(const pt_hardware *hw, const char *path, const char *const *how) {
    pt_hw_text t = {.cap = 4096};
    t.p = pt_malloc(t.cap);
    t.p[0] = 0;
    pt_hw_printf(&t, "; hardware for `pentatron plan` (docs/plan.md, \"The hardware file\")\n"
                     "[hardware]\n");
    for (int i = 0; i < PT_HW_N_KEYS; i++) {
        const char *key = pt_hw_keys[i].key, *note = how && how[i] && how[i][0] ? how[i] : NULL;
        const void *v = (const char *)hw + pt_hw_keys[i].offset;
        char val[128];
        switch (pt_hw_keys[i].type) {
        case PT_HW_STR: snprintf(val, sizeof val, "\"%s\"", hw->name); break;
        case PT_HW_COMM:
            if (!hw->nccl) continue;
            snprintf(val, sizeof val, "nccl");
            break;
        case PT_HW_INT:
            if (!pt_hw_keys[i].required && *(const int *)v == 0) continue; /* not given */
            snprintf(val, sizeof val, "%d", *(const int *)v);
            break;
        case PT_HW_NUM:
            if (!pt_hw_keys[i].required && *(const double *)v == 0 && strcmp(key, "gemm_efficiency") &&
                !(note && !strcmp(key, "skew")))
                continue; /* not given */
            snprintf(val, sizeof val, "%.6g", *(const double *)v);
            break;
        case PT_HW_SHAPES:
            /* one line per shape after the first (continuation lines: inih reads lines of at
             * most 199 characters) */
            if (hw->n_shapes == 0) continue;
            if (note) pt_hw_printf(&t, "; gemm_shapes: %.176s\n", note);
            for (int j = 0; j < hw->n_shapes; j++) {
                const pt_gemm_shape *g = &hw->shapes[j];
                pt_hw_printf(&t, "%s%.0f,%.0f,%.0f,%.4g%s\n", j ? "    " : "gemm_shapes = \"", g->m,
                             g->n, g->k, g->flops, j + 1 < hw->n_shapes ? ";" : "\"");
            }
            continue;
        case PT_HW_COLLS:
            if (hw->n_colls == 0) continue;
            if (note) pt_hw_printf(&t, "; collectives: %.176s\n", note);
            for (int j = 0; j < hw->n_colls; j++) {
                const pt_coll_time *c = &hw->colls[j];
                pt_hw_printf(&t, "%s%s,%s,%d,%.0f,%.4g%s\n", j ? "    " : "collectives = \"",
                             pt_hw_coll_names[c->kind], c->inter ? "inter" : "intra", c->ranks,
                             c->bytes, c->seconds, j + 1 < hw->n_colls ? ";" : "\"");
            }
            continue;
        case PT_HW_SIZES: {
            const pt_hw_sizes *l = v;
            if (l->n == 0) continue;
            if (note) pt_hw_printf(&t, "; %.190s\n", note);
            if (l->bytes[0] == 0) {
                pt_hw_printf(&t, "%s = %.6g\n", key, l->value[0]);
                continue;
            }
            for (int j = 0; j < l->n; j++)
                pt_hw_printf(&t, "%s%s%.0f,%.4g%s\n", j ? "    " : key, j ? "" : " = \"", l->bytes[j],
                             l->value[j], j + 1 < l->n ? ";" : "\"");
            continue;
        }
        }
        /* a value's comment on the lines above it: inih takes a ';' after a space as the start
         * of a comment, and lines are at most 199 characters */
        if (note) pt_hw_printf(&t, "; %.190s\n", note);
        pt_hw_printf(&t, "%s = %s\n", key, val);
    }
    pt_status st = pt_write_file_atomic(path, t.p, t.len);
    free(t.p);
    return st;
}
