/*
 * tests/tensor_parallel/tp_comm_mpi.h — a tensor_parallel/tp_comm.h table over an engine/comm.h
 * group.
 *
 * tensor_parallel/ cannot include engine/ (dependencies point downward), so whoever owns the
 * communicator fills the table: the tests here, and the engine the same way (this file is the
 * whole adapter; engine/ can take it over as is).
 */
#ifndef MPENGINE_TESTS_TENSOR_PARALLEL_TP_COMM_MPI_H
#define MPENGINE_TESTS_TENSOR_PARALLEL_TP_COMM_MPI_H

#include "engine/comm.h"
#include "tensor_parallel/tp_comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The table for group comm: context = comm, its rank and size. comm must outlive the table. */
mp_tp_comm mp_tp_comm_from_group(mp_comm *comm);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TESTS_TENSOR_PARALLEL_TP_COMM_MPI_H */
