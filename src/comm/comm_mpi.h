/* comm_mpi.h: wrapping an MPI communicator of one's own (private to src/comm and the tests; the
 * rest of the code gets its communicators from pt_comm_world and split, include/pt/comm.h). */
#ifndef PT_COMM_MPI_H
#define PT_COMM_MPI_H

#include "pt/comm.h"

/* Takes ownership of *(MPI_Comm *)mpi_comm (freed by c->free). */
pt_comm *pt_comm_mpi_wrap(void *mpi_comm, const char *name, double timeout_s);

#endif
