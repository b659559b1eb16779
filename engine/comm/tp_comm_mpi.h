/*
 * engine/comm/tp_comm_mpi.h — a tensor_parallel/tp_comm.h table over an engine/comm/comm.h group.
 *
 * tensor_parallel/ cannot include engine/ (dependencies point downward, DESIGN.md), so the owner
 * of the communicator fills the table the layers call: the engine here, for `mpengine run`.
 * (tests/tensor_parallel keeps its own copy of these few lines for its test-only target.)
 */
#ifndef MPENGINE_ENGINE_TP_COMM_MPI_H
#define MPENGINE_ENGINE_TP_COMM_MPI_H

#include "engine/comm/comm.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table for group comm: context = comm, its rank and size. comm must outlive the table.
 * Every operation returns engine/comm/comm.h's status and message (timeouts name the rank, the group
 * and the peer). */
mp_tp_comm mp_tp_comm_over_group(mp_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TP_COMM_MPI_H */
