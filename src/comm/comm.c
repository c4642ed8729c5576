/* comm.c: backend-independent parts of the communication layer: blocking wrappers and counters. */
#include "pt/comm.h"

size_t pt_dtype_size(pt_dtype dt) {
    switch (dt) {
    case PT_DTYPE_F32:
    case PT_DTYPE_I32: return 4;
    case PT_DTYPE_F64:
    case PT_DTYPE_I64: return 8;
    }
    return 0;
}

const char *pt_comm_op_name(pt_comm_op op) {
    static const char *names[PT_COMM_OP_COUNT] = {"all-reduce", "reduce-scatter", "all-gather",
                                                  "all-to-all", "send", "recv", "broadcast",
                                                  "barrier"};
    return op < PT_COMM_OP_COUNT ? names[op] : "?";
}

void pt_allreduce_sum(pt_comm *c, void *buf, size_t count, pt_dtype dt) {
    pt_comm_wait(c, c->iallreduce(c, buf, count, dt));
}

void pt_reduce_scatter_sum(pt_comm *c, const void *send, void *recv, size_t recv_count, pt_dtype dt) {
    pt_comm_wait(c, c->ireduce_scatter(c, send, recv, recv_count, dt));
}

void pt_allgather(pt_comm *c, const void *send, void *recv, size_t send_count, pt_dtype dt) {
    pt_comm_wait(c, c->iallgather(c, send, recv, send_count, dt));
}

void pt_bcast(pt_comm *c, void *buf, size_t count, pt_dtype dt, int root) {
    pt_comm_wait(c, c->ibcast(c, buf, count, dt, root));
}

void pt_barrier(pt_comm *c) { pt_comm_wait(c, c->ibarrier(c)); }

void pt_comm_stats_add(pt_comm_stats *to, const pt_comm_stats *from) {
    for (int i = 0; i < PT_COMM_OP_COUNT; i++) {
        to->calls[i] += from->calls[i];
        to->bytes[i] += from->bytes[i];
    }
    to->wait_seconds += from->wait_seconds;
}
