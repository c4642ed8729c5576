/* comm_mpi.h: wrapping an MPI communicator of one's own (private to src/comm and the tests; the
 * rest of the code gets its communicators from pt_comm_world and split, include/pt/comm.h). */
#ifndef PT_COMM_MPI_H
#define PT_COMM_MPI_H

#include "pt/comm.h"

/* Takes ownership of *(MPI_Comm *)mpi_comm (freed by c->free). */
pt_comm *pt_comm_mpi_wrap(void *mpi_comm, const char *name, double timeout_s);

/* MPI's own blocking all-reduce (sum) over c of send into buf (send = NULL: in place), through
 * whichever collective component MPI selects for it (tuned, han, ...: the MCA parameters choose),
 * where pentatron's all-reduce is MPI's nonblocking one (libnbc) or the hierarchical one
 * (comm_hier.c). For benchmarks (bench/hier_bench.c); counted as c->iallreduce counts. (Open MPI
 * 4.1.4's han crashes in place: MPI_IN_PLACE taken for a buffer, fixed upstream in 2023.) */
void pt_comm_mpi_allreduce_blocking(pt_comm *c, const void *send, void *buf, size_t count,
                                    pt_dtype dt);

#endif
