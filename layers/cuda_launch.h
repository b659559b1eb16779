/*
 * layers/cuda_launch.h — every kernel launch of the CUDA twins is checked where it is made, so a
 * failure (a bad grid, too much shared memory, a kernel image missing for this GPU) names the
 * kernel, its file and line, not the next synchronisation that happens to see it.
 *
 * A launch returns nothing, and the twins' launchers return nothing either, so the check records
 * the first failed launch of the thread (MP_CUDA_CHECK_LAUNCH right after each <<<...>>>, as
 * llm.c's cudaCheck(cudaGetLastError()) does) and the engine takes it at its next status return:
 * the end of a stage's forward, backward or update, and every device synchronisation.
 */
#ifndef MPENGINE_LAYERS_CUDA_LAUNCH_H
#define MPENGINE_LAYERS_CUDA_LAUNCH_H

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Records a failed launch of `kernel` at file:line with CUDA's error text, unless an earlier
 * failure of this thread is still untaken (the first one is the cause). */
void mp_cuda_record_launch_failure(const char *kernel, const char *file, int line,
                                   const char *error_text);

/* MP_ERR_RUNTIME naming the first failed launch since the last call ("kernel K launched at
 * FILE:LINE failed: TEXT"), and forgets it; MP_OK when every launch went through. */
mp_status mp_cuda_take_launch_failure(mp_error *err);

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime.h>
/* After each kernel launch: cudaGetLastError reports (and clears) a launch that failed. */
#define MP_CUDA_CHECK_LAUNCH(kernel)                                                     \
  do {                                                                                   \
    const cudaError_t mp_launch_status_ = cudaGetLastError();                            \
    if (mp_launch_status_ != cudaSuccess) {                                              \
      mp_cuda_record_launch_failure(kernel, __FILE__, __LINE__,                          \
                                    cudaGetErrorString(mp_launch_status_));              \
    }                                                                                    \
  } while (0)
#endif

#endif /* MPENGINE_LAYERS_CUDA_LAUNCH_H */
