/* tensorboard.h: logging.tensorboard: every scalar of a step's log line and JSON line
 * (pt/metrics.h) as a TensorBoard event file, written by rank 0 (src/train/tensorboard.c).
 *
 * The file is DIR/events.out.tfevents.<unix seconds>.<host>.<pid>, a new one per run (a resumed
 * run adds its own beside the earlier ones; its steps continue theirs). It is a sequence of
 * TFRecords (length, masked CRC-32C of the length, an Event protobuf, masked CRC-32C of it): first
 * an Event holding file_version "brain.Event:2", then one Event per step whose Summary holds one
 * simple_value per scalar (tags in docs/guide.md). Each step's record is flushed to the OS before
 * the next step starts, so a run killed at any moment leaves every completed step readable. */
#ifndef PT_TENSORBOARD_H
#define PT_TENSORBOARD_H

#include <stdint.h>
#include <stdio.h>

#include "pt/metrics.h"

typedef struct {
    FILE *f; /* NULL: not written */
    char path[4200]; /* for messages */
    uint8_t *buf; /* one step's record, sized at open */
    size_t cap;
} pt_tb;

/* Creates dir if missing and a new event file in it (never an existing one), with its
 * file_version event; the buffer for a step of mc's model is made here. PT_ERR_IO naming
 * logging.tensorboard, the path and what failed. */
pt_status pt_tb_open(pt_tb *tb, const char *dir, const pt_model_config *mc);
/* The step's scalars (w: its communication window, or NULL), as one Event at the wall-clock time
 * now, flushed. PT_ERR_IO naming the file when it could not be written. */
pt_status pt_tb_write(pt_tb *tb, const pt_step_stats *s, const pt_comm_window *w,
                      const pt_model_config *mc, const pt_rank_memory *mem);
void pt_tb_close(pt_tb *tb);

/* CRC-32C (Castagnoli, reflected 0x82F63B78, as RFC 3720 defines it) of n bytes, continuing crc
 * (0 to start). */
uint32_t pt_crc32c(uint32_t crc, const void *data, size_t n);

#endif
