/*
 * engine/comm/ep_comm_nccl.h — an expert_parallel/ep_comm.h table over an NCCL communicator, whose
 * two all-to-alls move DEVICE buffers: each is one batch of ncclSend / ncclRecv (mp_nccl_p2p: a
 * send to and a receive from every rank with something to move, posted together so none waits
 * for another), ordered after the default stream's work and waited for by the host.
 *
 * Why: the GPU dispatch's rows could then go GPU to GPU (NVLink, InfiniBand) instead of through
 * the host (engine/model/stage_kernels_gpu.c stages them over the MPI table today); Megatron-Core's
 * all-to-all token dispatcher over NCCL does the same. Not used by a run yet: `mpengine run` would
 * create the ep group's NCCL communicator beside the others (tools/cmd_run.c) and hand the table
 * to the GPU stage. tests/expert_parallel/ep_comm_nccl_test holds it to the MPI table under
 * emulated NCCL.
 */
#ifndef MPENGINE_ENGINE_EP_COMM_NCCL_H
#define MPENGINE_ENGINE_EP_COMM_NCCL_H

#include "engine/comm/comm_nccl.h"
#include "expert_parallel/ep_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table for comm (the ep group's, group rank = ep rank): context = comm, its rank and size.
 * Its operations take device buffers (the counts too) and return comm_nccl.h's statuses and
 * messages (timeouts name the group, the peer and the bytes). comm must outlive the table. For
 * groups of 2 ranks or more: ep_comm.h's wrappers copy a one-rank group's buffers on the host. */
mp_ep_comm mp_ep_comm_over_nccl(mp_nccl_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_EP_COMM_NCCL_H */
