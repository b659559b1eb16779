/*
 * engine/comm/comm_staging.h — what the MPI communicators (comm_mpi.c) need to accept GPU buffers:
 * telling a device pointer from a host one, pinned host memory, and copies between the two.
 *
 * An internal interface: comm_mpi.c stays plain C and builds without CUDA. The CUDA implementation
 * (comm_staging_cuda.cu) never starts CUDA itself: a process that has not loaded the CUDA driver
 * cannot hold a device pointer, so every pointer of it is "host" at the cost of a look at the list
 * of loaded libraries, and a CPU run on a GPU machine creates no CUDA context. Once the driver is
 * loaded, the pointer is classified by the driver (cuPointerGetAttribute, which creates no context
 * either). The build without CUDA (comm_staging_none.c) says "host" for every pointer.
 *
 * Copies are synchronous (cudaMemcpy on the legacy default stream) and see the whole of the
 * caller's buffer: as with CUDA-aware MPI, the caller finishes the kernels that write a buffer
 * (synchronises their stream) before handing it to a communicator.
 */
#ifndef MPENGINE_ENGINE_COMM_STAGING_H
#define MPENGINE_ENGINE_COMM_STAGING_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when pointer is CUDA device memory (cudaMalloc; not managed memory, which the host can
 * read itself). False for host memory, NULL, and every pointer of a build without CUDA. */
bool mp_staging_is_device(const void *pointer);

/* "cuda" where device pointers can be recognised and staged, "host" in a build without CUDA. */
const char *mp_staging_backend(void);

/* Pinned (page-locked) host memory of `bytes` (at least 1), for fast copies to and from the GPU.
 * MP_ERR_RUNTIME naming the call, file and line when CUDA fails; *out is NULL then. */
mp_status mp_staging_host_alloc(void **out, size_t bytes, mp_error *err);
void mp_staging_host_free(void *pointer); /* NULL is a no-op */

/* A synchronous copy of `bytes` between any two of device and host memory (pinned or not);
 * bytes 0 is a no-op. MP_ERR_RUNTIME naming the call, file and line on a CUDA error; MP_ERR_INPUT in
 * a build without CUDA, which has no device memory to copy. */
mp_status mp_staging_copy(void *dst, const void *src, size_t bytes, mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_COMM_STAGING_H */
