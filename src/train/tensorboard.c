/* tensorboard.c: TensorBoard event files (see include/pt/tensorboard.h): a step's scalars encoded
 * as one Event protobuf (the few fields of TensorBoard's event.proto and summary.proto it needs,
 * written by hand) in TFRecord framing. */
#include "pt/tensorboard.h"

#include "pt/data.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* A tag's most bytes (a longer data source name is cut); with its field keys and lengths, and the
 * value's, one Summary.Value takes at most PT_TB_VALUE_MAX bytes. */
#define PT_TB_TAG_MAX 160
#define PT_TB_VALUE_MAX (PT_TB_TAG_MAX + 16)
/* Room before the summary's values for the Event's fields and the summary's length:
 * wall_time (1 + 8), step (1 + 10), summary key and length (1 + 5). */
#define PT_TB_HEAD 32

static uint32_t pt_crc32c_table[256];

static void pt_crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        pt_crc32c_table[i] = c;
    }
}

uint32_t pt_crc32c(uint32_t crc, const void *data, size_t n) {
    if (!pt_crc32c_table[1]) pt_crc32c_init();
    const uint8_t *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = pt_crc32c_table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* TFRecord's masked CRC: a CRC of data that itself holds CRCs is not a CRC of a CRC. */
static uint32_t pt_tb_masked_crc(const void *data, size_t n) {
    uint32_t c = pt_crc32c(0, data, n);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static uint8_t *pt_pb_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static uint8_t *pt_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) *p++ = (uint8_t)(v >> (8 * i));
    return p;
}

/* The summary's values being encoded: at p, up to end. */
typedef struct {
    uint8_t *p, *end;
} pt_tb_enc;

/* Summary.value (field 1) = Value{tag (field 1), simple_value (field 2, float)}. */
static void pt_tb_value(pt_tb_enc *e, const char *tag, double x) {
    PT_ASSERT(e->end - e->p >= PT_TB_VALUE_MAX);
    size_t n = strlen(tag);
    n = n > PT_TB_TAG_MAX ? PT_TB_TAG_MAX : n;
    float v = (float)x;
    uint32_t bits;
    memcpy(&bits, &v, 4);
    uint8_t *p = e->p;
    *p++ = 0x0a; /* field 1, length-delimited */
    p = pt_pb_varint(p, 1 + (n >= 0x80 ? 2 : 1) + n + 1 + 4);
    *p++ = 0x0a;
    p = pt_pb_varint(p, n);
    memcpy(p, tag, n);
    p += n;
    *p++ = 0x15; /* field 2, 32-bit */
    e->p = pt_le(p, bits, 4);
}

static void pt_tb_valuef(pt_tb_enc *e, double x, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void pt_tb_valuef(pt_tb_enc *e, double x, const char *fmt, ...) {
    char tag[PT_TB_TAG_MAX + 1];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tag, sizeof tag, fmt, ap);
    va_end(ap);
    pt_tb_value(e, tag, x);
}

static double pt_tb_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The Event (wall_time, step, then either file_version or the summary of len bytes at body) framed
 * as a TFRecord and flushed. The event's fields are written into the PT_TB_HEAD bytes before
 * body. */
static pt_status pt_tb_record(pt_tb *tb, int64_t step, const char *file_version, uint8_t *body,
                              size_t len) {
    uint8_t head[PT_TB_HEAD], *h = head;
    double wall = pt_tb_wall_time();
    uint64_t bits;
    memcpy(&bits, &wall, 8);
    *h++ = 0x09; /* wall_time: field 1, 64-bit */
    h = pt_le(h, bits, 8);
    *h++ = 0x10; /* step: field 2, varint */
    h = pt_pb_varint(h, (uint64_t)step);
    uint8_t fv[PT_TB_HEAD + 64];
    if (file_version) {
        *h++ = 0x1a; /* file_version: field 3, length-delimited */
        len = strlen(file_version);
        PT_ASSERT(len <= 64);
        body = memcpy(fv + PT_TB_HEAD, file_version, len);
    } else {
        *h++ = 0x2a; /* summary: field 5, length-delimited */
    }
    h = pt_pb_varint(h, len);
    size_t hn = (size_t)(h - head);
    uint8_t *payload = body - hn; /* the PT_TB_HEAD bytes before body have the room */
    memcpy(payload, head, hn);
    size_t n = hn + len;
    uint8_t frame[12], tail[4];
    pt_le(frame, n, 8);
    pt_le(frame + 8, pt_tb_masked_crc(frame, 8), 4);
    pt_le(tail, pt_tb_masked_crc(payload, n), 4);
    errno = 0;
    if (fwrite(frame, 1, 12, tb->f) != 12 || fwrite(payload, 1, n, tb->f) != n ||
        fwrite(tail, 1, 4, tb->f) != 4 || fflush(tb->f) != 0)
        return pt_errorf(PT_ERR_IO, "logging.tensorboard: writing %s failed at step %lld: %s",
                         tb->path, (long long)step, errno ? strerror(errno) : "write error");
    return PT_OK;
}

pt_status pt_tb_open(pt_tb *tb, const char *dir, const pt_model_config *mc) {
    memset(tb, 0, sizeof *tb);
    PT_TRY(pt_check_writable_dir(dir, "logging.tensorboard"));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    int n = snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%lld.%s.%ld", dir,
                     (long long)time(NULL), host, (long)getpid());
    if (n < 0 || (size_t)n >= sizeof tb->path)
        return pt_errorf(PT_ERR_IO, "logging.tensorboard: the path is too long (%zu characters)",
                         strlen(dir));
    /* a new file: an earlier run's is never written over, nor anything through a link */
    int fd = open(tb->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return pt_errorf(PT_ERR_IO, "logging.tensorboard: cannot create %s: %s", tb->path,
                         strerror(errno));
    tb->f = fdopen(fd, "w");
    if (!tb->f) {
        close(fd);
        return pt_errorf(PT_ERR_IO, "logging.tensorboard: cannot open %s", tb->path);
    }
    /* the most values a step gives (pt_tb_write): its own ~30, 4 per layer (mixture of experts),
     * 3 per pipeline stage, 1 per cp rank and data source, 3 per operation, 2 per group */
    size_t values = 32 + 4 * (size_t)(mc->n_layers > 0 ? mc->n_layers : 0) + 3 * 64 + 64 +
                    PT_MIX_MAX_SOURCES + 3 * PT_COMM_OP_COUNT + 2 * PT_MESH_MAX_GROUPS;
    tb->cap = PT_TB_HEAD + values * PT_TB_VALUE_MAX;
    tb->buf = pt_malloc(tb->cap);
    pt_status st = pt_tb_record(tb, 0, "brain.Event:2", NULL, 0);
    if (st != PT_OK) pt_tb_close(tb);
    return st;
}

void pt_tb_close(pt_tb *tb) {
    /* each step was flushed to the OS (0.77 ms per step more would put it on disk: fsync on a
     * cloud VM's ext4); the end puts the file on disk */
    if (tb->f && fflush(tb->f) == 0) fsync(fileno(tb->f));
    if (tb->f) fclose(tb->f);
    free(tb->buf);
    tb->f = NULL;
    tb->buf = NULL;
}

static const char *const pt_tb_load[] = {"load_min", "load_max", "load_mean", "load_max_over_mean"};
static const char *const pt_tb_mem_kind[] = {"params", "grads", "optim", "params_transient",
                                               "grads_transient", "activations"};

pt_status pt_tb_write(pt_tb *tb, const pt_step_stats *s, const pt_comm_window *w,
                      const pt_model_config *mc, const pt_rank_memory *mem) {
    if (!tb->f) return PT_OK;
    pt_tb_enc e = {tb->buf + PT_TB_HEAD, tb->buf + tb->cap};
    pt_tb_value(&e, "loss", s->loss);
    pt_tb_value(&e, "lr", s->lr);
    pt_tb_value(&e, "grad_norm", s->grad_norm);
    pt_tb_value(&e, "tokens", (double)s->tokens);
    pt_tb_value(&e, "step_seconds", s->seconds);
    pt_tb_value(&e, "tokens_per_s", s->tokens_per_s);
    pt_tb_value(&e, "mfu", s->mfu);
    pt_tb_value(&e, "memory/peak_rss_bytes", (double)s->peak_rss_bytes);
    pt_tb_value(&e, "allocs", (double)s->allocs);
    pt_tb_value(&e, "skipped", s->skipped);
    if (s->mfu_datasheet > 0) pt_tb_value(&e, "mfu_datasheet", s->mfu_datasheet);
    if (s->device_peak_bytes > 0)
        pt_tb_value(&e, "memory/device_peak_bytes", (double)s->device_peak_bytes);
    for (int i = 0; i < s->n_sources; i++)
        pt_tb_valuef(&e, s->source_share[i], "data_share/%s", s->source_names[i]);
    if (s->evaluated) {
        pt_tb_value(&e, "val_loss", s->val_loss);
        pt_tb_value(&e, "val_tokens", (double)s->val_tokens);
        pt_tb_value(&e, "val_seconds", s->val_seconds);
    }
    if (mc->n_experts > 0 && s->expert_load) {
        pt_tb_value(&e, "moe/aux_loss", s->aux_loss);
        pt_tb_value(&e, "moe/z_loss", s->z_loss);
        for (int l = 0; l < mc->n_layers; l++) { /* token-slots per expert */
            if (!pt_layer_is_moe(mc, l)) continue;
            double ls[4];
            pt_expert_load_summary(s->expert_load + (size_t)l * mc->n_experts, mc->n_experts, ls);
            for (int k = 0; k < 4; k++) pt_tb_valuef(&e, ls[k], "moe/layer%d/%s", l, pt_tb_load[k]);
        }
        if (s->ep) {
            pt_tb_value(&e, "moe/ep_rows_sent", (double)s->ep_rows[0]);
            pt_tb_value(&e, "moe/ep_rows_received", (double)s->ep_rows[1]);
        }
    }
    for (int i = 0; i < s->n_stages && i < 64; i++) {
        pt_tb_valuef(&e, s->idle[i], "pp/stage%d/idle", i);
        pt_tb_valuef(&e, s->busy[i], "pp/stage%d/busy_s", i);
        if (s->head_split) pt_tb_valuef(&e, s->head_busy[i], "pp/stage%d/head_s", i);
    }
    for (int i = 0; i < s->n_cp && i < 64; i++)
        pt_tb_valuef(&e, s->attn_pairs[i], "cp/rank%d/attn_pairs", i);
    if (w && w->steps) {
        pt_tb_value(&e, "comm/steps", (double)w->steps);
        pt_tb_value(&e, "comm/bytes", (double)w->bytes);
        pt_tb_value(&e, "comm/blocked_s", w->wait_s);
        for (int op = 0; op < PT_COMM_OP_COUNT; op++) {
            if (!w->op_calls[op]) continue;
            const char *name = pt_comm_op_name((pt_comm_op)op);
            pt_tb_valuef(&e, (double)w->op_calls[op], "comm_op/%s/calls", name);
            pt_tb_valuef(&e, (double)w->op_bytes[op], "comm_op/%s/bytes", name);
            pt_tb_valuef(&e, w->op_wait_s[op], "comm_op/%s/blocked_s", name);
        }
        for (int i = 0; i < w->n_groups; i++) {
            /* (a group of one rank, there at degree 1, has nothing to show) */
            if (w->group_size[i] < 2 && !w->group_bytes[i] && !(w->group_wait_s[i] > 0)) continue;
            pt_tb_valuef(&e, (double)w->group_bytes[i], "comm/%s/bytes", w->group[i]);
            pt_tb_valuef(&e, w->group_wait_s[i], "comm/%s/blocked_s", w->group[i]);
        }
        const size_t kind[] = {mem->params, mem->grads, mem->optim, mem->params_transient,
                               mem->grads_transient, mem->activations};
        for (int k = 0; k < 6; k++)
            pt_tb_valuef(&e, (double)kind[k], "memory/%s_bytes", pt_tb_mem_kind[k]);
    }
    uint8_t *body = tb->buf + PT_TB_HEAD;
    return pt_tb_record(tb, s->step, NULL, body, (size_t)(e.p - body));
}
