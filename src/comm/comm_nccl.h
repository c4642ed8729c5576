/* comm_nccl.h: NCCL's entry points as comm_nccl.c calls them, in a table: NCCL's own (loaded
 * from libnccl.so.2 at the first NCCL group, so that a build with the toolkit runs where NCCL is
 * not installed), or a test's stand-in (tests/test_nccl_host.c: the backend's host logic on
 * CPUs, with the device calls behind this table and the backend's pt_device_link). Types are
 * NCCL's (nccl.h). Private to src/comm and its tests. */
#ifndef PT_COMM_NCCL_H
#define PT_COMM_NCCL_H

#include <nccl.h>

typedef struct pt_nccl_api {
    ncclResult_t (*get_unique_id)(ncclUniqueId *id);
    ncclResult_t (*comm_init_rank)(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank);
    ncclResult_t (*comm_split)(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                               ncclConfig_t *config);
    ncclResult_t (*comm_abort)(ncclComm_t comm);
    ncclResult_t (*comm_destroy)(ncclComm_t comm);
    ncclResult_t (*comm_get_async_error)(ncclComm_t comm, ncclResult_t *error);
    const char *(*get_error_string)(ncclResult_t result);
    ncclResult_t (*all_reduce)(const void *send, void *recv, size_t count, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*reduce_scatter)(const void *send, void *recv, size_t recv_count,
                                   ncclDataType_t dt, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream);
    ncclResult_t (*all_gather)(const void *send, void *recv, size_t send_count, ncclDataType_t dt,
                               ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*broadcast)(const void *send, void *recv, size_t count, ncclDataType_t dt,
                              int root, ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*send)(const void *buf, size_t count, ncclDataType_t dt, int peer,
                         ncclComm_t comm, cudaStream_t stream);
    ncclResult_t (*recv)(void *buf, size_t count, ncclDataType_t dt, int peer, ncclComm_t comm,
                         cudaStream_t stream);
    ncclResult_t (*group_start)(void);
    ncclResult_t (*group_end)(void);
} pt_nccl_api;

/* Makes `api` the table of every NCCL group made from now on (a test's stand-in; NULL: NCCL's
 * own, loaded at the first group). */
void pt_comm_nccl_use(const pt_nccl_api *api);

#endif
