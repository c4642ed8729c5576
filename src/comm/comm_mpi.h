/* comm_mpi.h: building communicators over MPI (private to src/comm and src/parallel). */
#ifndef PT_COMM_MPI_H
#define PT_COMM_MPI_H

#include "pt/comm.h"

/* Takes ownership of *(MPI_Comm *)mpi_comm (freed by c->free). */
pt_comm *pt_comm_mpi_wrap(void *mpi_comm, const char *name, double timeout_s);
/* PT_ASSERT and pt_fatal end the whole job with MPI_Abort, so no rank is left waiting. */
void pt_comm_mpi_install_abort(void);

#endif
