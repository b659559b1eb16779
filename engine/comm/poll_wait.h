/*
 * engine/comm/poll_wait.h — the communicators' one bounded wait: poll an operation until it
 * completes, fails, or its deadline passes, yielding the core between polls for a first stretch
 * and then sleeping with a doubling backoff (10 us up to 1 ms), so that waiting out a long timeout
 * on a stuck peer costs little CPU. The MPI communicators (comm_mpi.c: MPI_Test) and the NCCL ones
 * (comm_nccl_cuda.cu: cudaEventQuery and the communicator's state) wait through it.
 *
 * Why a spin first: Open MPI moves a non-blocking operation forward only inside MPI calls, so a
 * sleep between polls stalls the transfer; a wait that has lasted the spin is almost surely on a
 * stuck or far-behind peer. Each caller picks its spin.
 */
#ifndef MPENGINE_ENGINE_COMM_POLL_WAIT_H
#define MPENGINE_ENGINE_COMM_POLL_WAIT_H

#include <stdbool.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One poll of the operation behind context: MP_OK with *done set (true: complete), or a failure
 * status with *err filled. */
typedef mp_status (*mp_poll_fn)(void *context, bool *done, mp_error *err);

/* Seconds on the monotonic clock: deadlines are in it. */
double mp_poll_now_s(void);

/* Calls poll(context, &done, err) until it reports the operation done or fails, or until
 * mp_poll_now_s() reaches deadline_s after a poll that found it pending (so it polls at least
 * once). Between polls it yields the core (sched_yield) for the first spin_s seconds, then sleeps
 * 10 us, doubling up to 1 ms. Returns MP_OK with *timed_out false when done, MP_OK with
 * *timed_out true when the deadline passed first (the caller says what timed out), or the poll's
 * failure. */
mp_status mp_poll_wait(mp_poll_fn poll, void *context, double deadline_s, double spin_s,
                       bool *timed_out, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_POLL_WAIT_H */
