/*
 * engine/comm/tp_comm_nccl.h — a tensor_parallel/tp_comm.h table over an NCCL communicator
 * (engine/comm/comm_nccl.h), for the GPU pipeline stage's collectives on device buffers
 * (engine/model/stage_gpu.h) when every rank of the group has a GPU of its own.
 *
 * Each operation is ordered after the compute already enqueued on the default stream, runs on the
 * communicator's stream, and returns once complete (mp_nccl_comm_synchronize): every wait is
 * under NCCL's watchdog, and the caller's next kernels may read the result. NCCL's all-reduce
 * gives bitwise the same sums on every rank, as tp_comm.h's contract asks. Buffers must be device
 * memory; the host-side sums of a stage (mp_tp_sum_double and gathering for export) keep the MPI
 * table (engine/comm/tp_comm_mpi.h).
 */
#ifndef MPENGINE_ENGINE_TP_COMM_NCCL_H
#define MPENGINE_ENGINE_TP_COMM_NCCL_H

#include "engine/comm/comm_nccl.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table for communicator comm: context = comm, its rank and size. comm must outlive it. */
mp_tp_comm mp_tp_comm_over_nccl(mp_nccl_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TP_COMM_NCCL_H */
