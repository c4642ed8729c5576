/* flight.h: the flight recorder, and the explanation of a hang.
 *
 * Every rank keeps a ring of its last PT_FLIGHT_RING communications (group, operation, the
 * group's sequence number, bytes, when it was entered and completed) and, per group, how many
 * collectives it has entered and completed: the comm layer records each one as it is posted and
 * as it completes (a few stores), and marks the wait it is blocked in. Collectives of a group are
 * numbered 1, 2, ... in the order every member posts them, so that "all-reduce #57 of dp" is the
 * same operation on each member; sends and receives are numbered apart, per group.
 *
 * When a wait times out (parallel.timeout_s), the ranks that can still talk agree on who is
 * behind: the rank that timed out sends its state to the collectors (world ranks 0..3) over a
 * world channel of their own (the backend's diagnosis channel, pt_flight_channel, whose errors
 * return instead of ending the job); a collector asks every rank for its state, and each rank answers from its next
 * wait; once every rank has answered, or none has for a few seconds, the lowest collector that
 * answered names the cause (pt_flight_verdict) and ends the job. A rank that never answers
 * (stopped, hung in computation, dead) is named with its mesh coordinates and host (the roster,
 * gathered at set-up), the collective it holds up and the last one its peers completed with it:
 *   rank 3 (dp1 pp0 cp0 tp1) on host h1 does not answer (stopped, hung or dead) and holds up
 *   reduce-scatter #57 of group "dp" (ranks 1 wait in it); its last: all-gather #56 of "tp"
 * A rank that answers but never entered the collective its peers wait in is named with the one
 * it waits in instead, and a cycle of such ranks as a deadlock.
 *
 * With logging.trace = DIR the state lives in DIR/flight-rankN.bin, a shared mapping of the file
 * (pt_flight_file): what a rank recorded is in the file even when the rank is killed, and
 * `pentatron trace why DIR` gives the verdict from every rank's own record after the job is gone.
 * The state is the file's format: fixed-width fields, native byte order, versioned.
 */
#ifndef PT_FLIGHT_H
#define PT_FLIGHT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "pt/comm.h"

enum {
    PT_FLIGHT_RING = 256,  /* communications remembered per rank */
    PT_FLIGHT_GROUPS = 64, /* groups remembered per rank (a mesh has 8 to 11, 3 more each
                            * hierarchical one) */
    PT_FLIGHT_LABEL = 64,  /* "dp1 pp0 cp0 tp1" */
    PT_FLIGHT_HOST = 64,
    PT_FLIGHT_COLLECTORS = 4,
};
#define PT_FLIGHT_MAGIC "PTFLIGHT"
#define PT_FLIGHT_VERSION 1

typedef struct {
    uint64_t id;            /* the rank's count of communications when it was entered */
    uint64_t seq;           /* the group's number for it: collectives and send/recv apart */
    uint64_t bytes;
    double t_enter, t_done; /* wall clock, seconds since the epoch; t_done 0 while pending */
    int32_t group;          /* index in the rank's group table */
    int32_t op;             /* pt_comm_op */
    int32_t peer;           /* send/recv: the peer's world rank; else -1 */
    int32_t pad;
} pt_flight_rec;

typedef struct {
    char name[16];
    uint64_t key;       /* name and members hashed: equal on every member of the group */
    int32_t size, rank; /* members, and this rank's place among them */
    int32_t live;       /* 0 once freed */
    int32_t members;    /* offset of the members' world ranks in pt_flight_state.member; -1:
                         * every rank of the world in order; -2: not kept (no room) */
    uint64_t coll_entered, coll_done; /* the highest collective number entered / completed */
    uint64_t p2p_entered, p2p_done;
    uint64_t last_seq; /* the collective that completed last: number, operation, when */
    double last_t;
    int32_t last_op, pad;
} pt_flight_group;

typedef struct {
    char magic[8];
    uint32_t version, bytes; /* bytes: the whole state, member table included */
    int32_t rank, world, pid;
    int32_t finished;  /* 1: the process ended its communication normally */
    int32_t timed_out; /* 1: a wait of this rank timed out */
    int32_t waiting;   /* 1 while blocked in a wait: */
    int32_t wait_group, wait_op, wait_peer;
    int32_t answered;  /* 1: it took part in explaining a hang (its own timeout or asked) */
    uint64_t wait_seq;
    double wait_since;
    char label[PT_FLIGHT_LABEL]; /* mesh coordinates, "" before the mesh */
    char host[PT_FLIGHT_HOST];
    int32_t ngroups, members_used, members_cap, pad2;
    uint64_t nrec; /* communications recorded; the newest is ring[(nrec − 1) % PT_FLIGHT_RING] */
    double seen;   /* the last sign of life: a communication entered or completed, or a poll of
                    * a wait (every 64th) */
    pt_flight_group groups[PT_FLIGHT_GROUPS];
    pt_flight_rec ring[PT_FLIGHT_RING];
    int32_t member[]; /* members_cap world ranks */
} pt_flight_state;

/* The diagnosis channel: messages between world ranks that never end the job on an error (a dead
 * peer), installed by the comm backend once the world is made (comm_mpi.c). A send does not
 * block and its buffer must stay as it is until the process ends; recv takes one message if one
 * is there (1), with its sender, tag and length; abort ends every process it can reach. */
typedef struct {
    void (*send)(int to, int tag, const void *buf, size_t bytes);
    int (*pending)(void);
    int (*recv)(void *buf, size_t cap, int *from, int *tag, size_t *len);
    void (*abort)(int code);
} pt_flight_channel;
void pt_flight_set_channel(const pt_flight_channel *ch);

/* --- recording (the comm layer) --- */
/* Starts the recorder of this process (once the runtime knows the world). */
void pt_flight_start(int world_rank, int world_size);
/* A new group: its name, this rank's place, its size and members' world ranks (NULL: the whole
 * world, in order). Returns its index, or -1 when not recording. */
int pt_flight_group_add(const char *name, int rank, int size, const int *world_ranks);
void pt_flight_group_remove(int group);
/* The world rank of member `rank` of a group (-1 if unknown). */
int pt_flight_world_rank(int group, int rank);
/* A communication entered over group (peer: a world rank or -1): its record's id, and its
 * number in the group (*seq). */
uint64_t pt_flight_enter(int group, pt_comm_op op, int peer, uint64_t bytes, uint64_t *seq);
void pt_flight_done(uint64_t id, int group, pt_comm_op op, uint64_t seq);
/* This rank blocks in / leaves a wait for a communication (as entered). */
void pt_flight_wait_begin(int group, pt_comm_op op, uint64_t seq, int peer);
void pt_flight_wait_end(void);
/* A sign of life from inside a wait. */
void pt_flight_alive(void);
/* 1 when a peer asks for this rank's state (a hang is being explained): answer with
 * pt_flight_hang. Polls the diagnosis channel; cheap enough for every thousandth poll of a wait. */
int pt_flight_asked(void);
/* The hang protocol (see above) from inside a wait over c (timed_out: this rank's own wait ran
 * out; else a peer asked). Ends the job. */
_Noreturn void pt_flight_hang(const pt_comm *c, int timed_out);
/* The process ends its communication normally (pt_comm_runtime_finalize). */
void pt_flight_finish(void);

/* --- set-up --- */
/* This rank's mesh coordinates, and every rank's "label on host" (world_size × PT_FLIGHT_LABEL +
 * PT_FLIGHT_HOST bytes, gathered by the mesh; copied). */
void pt_flight_set_label(const char *label);
void pt_flight_set_roster(const char *roster, int world_size);
/* The state moves to DIR/flight-rankN.bin (a shared mapping; the file is made anew). */
pt_status pt_flight_file(const char *dir);
/* This process's state (NULL before pt_flight_start). */
const pt_flight_state *pt_flight_self(void);

/* --- analysis --- */
/* The cause of a hang from the states of the world's n ranks, written to out (lines; "" when no
 * rank was waiting). A rank is silent (stopped, hung or dead) when its state is NULL (it did not
 * answer) or silent[r] is set (its file says it neither timed out nor answered while others
 * did); a silent rank's state, when there, gives its own last communication. roster: as
 * pt_flight_set_roster's, or NULL. Returns the number of causes named. */
int pt_flight_verdict(const pt_flight_state *const *states, const unsigned char *silent, int n,
                      const char *roster, char *out, size_t cap);
/* `pentatron trace why DIR`: every rank's state and the verdict from DIR/flight-rank*.bin. */
pt_status pt_flight_why(const char *dir, FILE *out);

#endif
