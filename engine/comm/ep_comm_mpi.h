/*
 * engine/comm/ep_comm_mpi.h — an expert_parallel/ep_comm.h table over an engine/comm/comm.h group.
 *
 * expert_parallel/ cannot include engine/ (dependencies point downward, DESIGN.md), so the owner
 * of the communicator fills the table the layer calls, as tp_comm_mpi.h does for tensor
 * parallelism.
 */
#ifndef MPENGINE_ENGINE_EP_COMM_MPI_H
#define MPENGINE_ENGINE_EP_COMM_MPI_H

#include "engine/comm/comm.h"
#include "expert_parallel/ep_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table for group comm (the ep group, group rank = ep rank): context = comm, its rank and
 * size. comm must outlive the table. Every operation returns engine/comm/comm.h's status and
 * message (timeouts name the rank, the group and its members). */
mp_ep_comm mp_ep_comm_over_group(mp_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_EP_COMM_MPI_H */
