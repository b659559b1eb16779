/*
 * engine/cuda_backend/cuda_backend.h — the CUDA backend, a shared library the mpengine binary
 * loads at run time only when a GPU is asked for.
 *
 * Everything that calls CUDA, cuBLAS or NCCL (engine/device, engine/comm's NCCL communicators and
 * staging, the GPU stage and layers/' kernels) is built into libmpengine_cuda.so, which links
 * those libraries; the binary links none of them. So `describe`, `plan` and every CPU rank map no
 * CUDA library (about 150 MiB of resident memory and 80 ms of start-up per process otherwise),
 * the way NCCL loads its network plugins and Open MPI its components.
 *
 * The binary calls the headers of engine/device, engine/comm and engine/model/stage_gpu.h as if
 * they were linked in: their functions are forwarders (cuda_backend_loader.c) that load the library
 * on first use. A failure to load names the file and what is missing, once per process.
 *
 * Where the library is: $MPENGINE_CUDA_BACKEND if set, else libmpengine_cuda.so beside the
 * running executable (bazel-bin/tools/, where `bazel build //tools:mpengine` puts both).
 */
#ifndef MPENGINE_ENGINE_CUDA_BACKEND_H
#define MPENGINE_ENGINE_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Loads the library (once per process; later calls return the first call's result). MP_ERR_INPUT
 * naming the library's path and what is missing (the file itself, a library it needs such as
 * libnccl.so.2, or a library from another build of mpengine). */
mp_status mp_cuda_backend_load(mp_error *err);

/* True once mp_cuda_backend_load has succeeded in this process. */
bool mp_cuda_backend_loaded(void);

/* Where the library is looked for: the path that mp_cuda_backend_load opens. */
void mp_cuda_backend_path(char *path, size_t path_bytes);

/* "cuda", "emulated" or "none", the kind of the loaded library; NULL before it is loaded. */
const char *mp_cuda_backend_kind(void);

/* Whether this machine could have an NVIDIA GPU, without loading anything: the NVIDIA driver's
 * device nodes or /proc entry exist (always true in the emulated build, whose "GPU" is the CPU).
 * `run --backend auto` asks this before it loads the library to count the GPUs. */
bool mp_cuda_backend_gpu_possible(void);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_CUDA_BACKEND_H */
