/*
 * engine/cuda_backend/cuda_backend_table.h — private to engine/cuda_backend: every function the
 * CUDA backend provides, once, as an X-macro, and the table of pointers the backend's shared
 * library exports (cuda_backend_exports.c) and the loader reads (cuda_backend_loader.c).
 *
 * A function of device.h, gpu_probe.h, comm_staging.h, comm_nccl.h or stage_gpu.h belongs in the
 * list; the loader then defines it in every process as a forwarder into the loaded library. (The
 * one exception is mp_stage_gpu_state_ops: stage_gpu_state.c builds that table over the other
 * functions, so it lives beside the header, on this side of the forwarders.) How a forwarder
 * behaves before the library is loaded is its kind:
 *   STATUS(name, params, args)                   loads the library first; returns its error
 *   LOADING(ret, name, params, args, fallback)   loads the library first; fallback if it cannot
 *   QUERY(ret, name, params, args, fallback)     never loads: fallback until something else has
 *   VOID(name, params, args)                     never loads: nothing to do until something has
 * A process that holds a GPU object has loaded the library (only STATUS functions create one), so
 * QUERY and VOID functions take the fallback only where there is no GPU: no device pointer
 * (mp_staging_is_device is false), nothing to free.
 */
#ifndef MPENGINE_ENGINE_CUDA_BACKEND_TABLE_H
#define MPENGINE_ENGINE_CUDA_BACKEND_TABLE_H

#include <stdbool.h>
#include <stddef.h>

#include "common/error.h"
#include "engine/comm/comm_nccl.h"
#include "engine/comm/comm_staging.h"
#include "engine/device/device.h"
#include "engine/device/gpu_probe.h"
#include "engine/model/stage_gpu.h"

#define MP_CUDA_BACKEND_FUNCTIONS(STATUS, LOADING, QUERY, VOID)                                    \
  /* engine/device/device.h */                                                                     \
  LOADING(int, mp_device_count, (void), (), 0)                                                     \
  STATUS(mp_device_select, (int device, mp_error *err), (device, err))                             \
  STATUS(mp_device_alloc, (void **out, size_t bytes, mp_error *err), (out, bytes, err))            \
  VOID(mp_device_free, (void *pointer), (pointer))                                                 \
  STATUS(mp_device_copy_to_device, (void *device_dst, const void *host_src, size_t bytes,          \
      mp_error *err), (device_dst, host_src, bytes, err))                                          \
  STATUS(mp_device_copy_to_host, (void *host_dst, const void *device_src, size_t bytes,            \
      mp_error *err), (host_dst, device_src, bytes, err))                                          \
  STATUS(mp_device_copy_on_device, (void *dst, const void *src, size_t bytes, mp_error *err),      \
      (dst, src, bytes, err))                                                                      \
  STATUS(mp_device_memset, (void *device_dst, int value, size_t bytes, mp_error *err),             \
      (device_dst, value, bytes, err))                                                             \
  STATUS(mp_device_synchronize, (mp_error *err), (err))                                            \
  STATUS(mp_device_stream_create, (mp_cuda_stream *out, mp_error *err), (out, err))                \
  VOID(mp_device_stream_destroy, (mp_cuda_stream stream), (stream))                                \
  STATUS(mp_device_timer_create, (mp_device_timer **out, mp_error *err), (out, err))               \
  VOID(mp_device_timer_free, (mp_device_timer *timer), (timer))                                    \
  STATUS(mp_device_timer_start, (mp_device_timer *timer, mp_cuda_stream stream, mp_error *err),    \
      (timer, stream, err))                                                                        \
  STATUS(mp_device_timer_stop, (mp_device_timer *timer, mp_cuda_stream stream, double *seconds,    \
      mp_error *err), (timer, stream, seconds, err))                                               \
  STATUS(mp_device_memory, (size_t *free_bytes, size_t *total_bytes, mp_error *err), (free_bytes,  \
      total_bytes, err))                                                                           \
  QUERY(bool, mp_device_allocator_usage, (size_t *live_bytes, size_t *peak_bytes),                 \
      (live_bytes, peak_bytes), false)                                                             \
  /* engine/device/gpu_probe.h */                                                                  \
  STATUS(mp_gpu_probe, (mp_gpu_report *report, mp_error *err), (report, err))                      \
  STATUS(mp_gpu_smoke_test, (size_t n, double *max_abs_error, mp_error *err), (n, max_abs_error,   \
      err))                                                                                        \
  /* engine/comm/comm_staging.h */                                                                 \
  QUERY(bool, mp_staging_is_device, (const void *pointer), (pointer), false)                       \
  QUERY(const char *, mp_staging_backend, (void), (), "host")                                      \
  STATUS(mp_staging_host_alloc, (void **out, size_t bytes, mp_error *err), (out, bytes, err))      \
  VOID(mp_staging_host_free, (void *pointer), (pointer))                                           \
  STATUS(mp_staging_copy, (void *dst, const void *src, size_t bytes, mp_error *err), (dst, src,    \
      bytes, err))                                                                                 \
  /* engine/comm/comm_nccl.h */                                                                    \
  LOADING(bool, mp_nccl_available, (void), (), false)                                              \
  LOADING(int, mp_nccl_version, (void), (), 0)                                                     \
  STATUS(mp_nccl_world_create, (mp_comm_world *mpi, int device, mp_nccl_world **out,               \
      mp_error *err), (mpi, device, out, err))                                                     \
  VOID(mp_nccl_world_free, (mp_nccl_world *world), (world))                                        \
  VOID(mp_nccl_world_set_timeout, (mp_nccl_world *world, double timeout_s), (world, timeout_s))    \
  QUERY(double, mp_nccl_world_timeout, (const mp_nccl_world *world), (world), 0.0)                 \
  QUERY(int, mp_nccl_world_device, (const mp_nccl_world *world), (world), 0)                       \
  QUERY(bool, mp_nccl_world_aborted, (const mp_nccl_world *world), (world), false)                 \
  STATUS(mp_nccl_comm_create, (mp_nccl_world *world, mp_comm *group, mp_nccl_comm **out,           \
      mp_error *err), (world, group, out, err))                                                    \
  VOID(mp_nccl_comm_free, (mp_nccl_comm *comm), (comm))                                            \
  QUERY(int, mp_nccl_comm_rank, (const mp_nccl_comm *comm), (comm), 0)                             \
  QUERY(int, mp_nccl_comm_size, (const mp_nccl_comm *comm), (comm), 0)                             \
  QUERY(const char *, mp_nccl_comm_name, (const mp_nccl_comm *comm), (comm), NULL)                 \
  QUERY(mp_cuda_stream, mp_nccl_comm_stream, (const mp_nccl_comm *comm), (comm), NULL)             \
  STATUS(mp_nccl_comm_wait_stream, (mp_nccl_comm *comm, mp_cuda_stream stream, mp_error *err),     \
      (comm, stream, err))                                                                         \
  STATUS(mp_nccl_stream_wait_comm, (mp_cuda_stream stream, mp_nccl_comm *comm, mp_error *err),     \
      (stream, comm, err))                                                                         \
  STATUS(mp_nccl_comm_mark, (mp_nccl_comm *comm, int slot, mp_error *err), (comm, slot, err))      \
  STATUS(mp_nccl_stream_wait_mark, (mp_cuda_stream stream, mp_nccl_comm *comm, int slot,           \
      mp_error *err), (stream, comm, slot, err))                                                   \
  STATUS(mp_nccl_comm_synchronize, (mp_nccl_comm *comm, mp_error *err), (comm, err))               \
  STATUS(mp_nccl_p2p, (mp_nccl_comm *comm, const mp_nccl_p2p_op *ops, int count, mp_error *err),   \
      (comm, ops, count, err))                                                                     \
  STATUS(mp_nccl_all_reduce_sum, (mp_nccl_comm *comm, void *buffer, size_t count,                  \
      mp_nccl_dtype dtype, mp_error *err), (comm, buffer, count, dtype, err))                      \
  STATUS(mp_nccl_reduce_scatter_sum, (mp_nccl_comm *comm, const void *input, void *output,         \
      size_t count, mp_nccl_dtype dtype, mp_error *err), (comm, input, output, count, dtype,       \
      err))                                                                                        \
  STATUS(mp_nccl_reduce_scatter_v_sum_f32, (mp_nccl_comm *comm, const float *input,                \
      float *output, const size_t *counts, mp_error *err), (comm, input, output, counts, err))     \
  STATUS(mp_nccl_all_gather, (mp_nccl_comm *comm, const void *input, void *output, size_t count,   \
      mp_nccl_dtype dtype, mp_error *err), (comm, input, output, count, dtype, err))               \
  STATUS(mp_nccl_all_gather_v, (mp_nccl_comm *comm, const void *input, void *output,               \
      const size_t *counts, mp_nccl_dtype dtype, mp_error *err), (comm, input, output, counts,     \
      dtype, err))                                                                                 \
  STATUS(mp_nccl_broadcast, (mp_nccl_comm *comm, void *buffer, size_t bytes, int root,             \
      mp_error *err), (comm, buffer, bytes, root, err))                                            \
  /* engine/model/stage_gpu.h */                                                                   \
  STATUS(mp_stage_gpu_create, (const mp_model *model, const mp_stage_gpu_config *config,           \
      mp_stage_gpu **out, mp_error *err), (model, config, out, err))                               \
  VOID(mp_stage_gpu_free, (mp_stage_gpu *gpu), (gpu))                                              \
  QUERY(const mp_stage_layout *, mp_stage_gpu_layout, (const mp_stage_gpu *gpu), (gpu), NULL)      \
  STATUS(mp_stage_gpu_read_params, (mp_stage_gpu *gpu, size_t first, size_t count, float *dest,    \
      mp_error *err), (gpu, first, count, dest, err))                                              \
  STATUS(mp_stage_gpu_write_params, (mp_stage_gpu *gpu, size_t first, size_t count,                \
      const float *src, mp_error *err), (gpu, first, count, src, err))                             \
  STATUS(mp_stage_gpu_fill_params, (mp_stage_gpu *gpu, mp_stage_fill_fn fill, void *context,       \
      mp_error *err), (gpu, fill, context, err))                                                   \
  STATUS(mp_stage_gpu_init_params, (mp_stage_gpu *gpu, uint64_t seed, mp_error *err), (gpu, seed,  \
      err))                                                                                        \
  QUERY(mp_stage_chain *, mp_stage_gpu_chain, (mp_stage_gpu *gpu), (gpu), NULL)                    \
  QUERY(size_t, mp_stage_gpu_device_bytes, (const mp_stage_gpu *gpu), (gpu), 0)                    \
  STATUS(mp_stage_gpu_download_grads, (mp_stage_gpu *gpu, float *dest, mp_error *err), (gpu,       \
      dest, err))                                                                                  \
  QUERY(float *, mp_stage_gpu_device_grads, (mp_stage_gpu *gpu), (gpu), NULL)                      \
  QUERY(float *, mp_stage_gpu_tensor_grad, (mp_stage_gpu *gpu, int index), (gpu, index), NULL)     \
  QUERY(size_t, mp_stage_gpu_grads_floats, (const mp_stage_gpu *gpu), (gpu), 0)                    \
  STATUS(mp_stage_gpu_add_to_part, (mp_stage_gpu *gpu, const float *sums, size_t first,            \
      size_t count, mp_cuda_stream stream, mp_error *err), (gpu, sums, first, count, stream,       \
      err))                                                                                        \
  STATUS(mp_stage_gpu_part_squares, (mp_stage_gpu *gpu, double *squares, mp_error *err), (gpu,     \
      squares, err))                                                                               \
  QUERY(float *, mp_stage_gpu_grad_part, (mp_stage_gpu *gpu), (gpu), NULL)                         \
  STATUS(mp_stage_gpu_zero_grads, (mp_stage_gpu *gpu, mp_error *err), (gpu, err))                  \
  VOID(mp_stage_gpu_scale_grads, (mp_stage_gpu *gpu, float scale), (gpu, scale))                   \
  STATUS(mp_stage_gpu_finish_grads, (mp_stage_gpu *gpu, mp_error *err), (gpu, err))                \
  STATUS(mp_stage_gpu_forward, (mp_stage_gpu *gpu, int slot, const int32_t *inputs,                \
      const int32_t *targets, const float *input, float *output, float dloss, double *loss,        \
      mp_error *err), (gpu, slot, inputs, targets, input, output, dloss, loss, err))               \
  STATUS(mp_stage_gpu_keep_moments, (mp_stage_gpu *gpu, size_t first, size_t count,                \
      mp_error *err), (gpu, first, count, err))                                                    \
  QUERY(float *, mp_stage_gpu_device_params, (mp_stage_gpu *gpu), (gpu), NULL)                     \
  QUERY(float *, mp_stage_gpu_params_at, (mp_stage_gpu *gpu, size_t first, size_t count), (gpu,    \
      first, count), NULL)                                                                         \
  QUERY(void *, mp_stage_gpu_weights_at, (mp_stage_gpu *gpu, size_t first, size_t count), (gpu,    \
      first, count), NULL)                                                                         \
  VOID(mp_stage_gpu_refresh_weights, (mp_stage_gpu *gpu), (gpu))                                   \
  STATUS(mp_stage_gpu_moments_at, (mp_stage_gpu *gpu, size_t first, size_t count, float **adam_m,  \
      float **adam_v, mp_error *err), (gpu, first, count, adam_m, adam_v, err))                    \
  VOID(mp_stage_gpu_discard, (mp_stage_gpu *gpu, int slot), (gpu, slot))                           \
  STATUS(mp_stage_gpu_backward, (mp_stage_gpu *gpu, int slot, const float *doutput,                \
      float *dinput, bool defer_weights, mp_error *err), (gpu, slot, doutput, dinput,              \
      defer_weights, err))                                                                         \
  STATUS(mp_stage_gpu_backward_weights, (mp_stage_gpu *gpu, int slot, mp_error *err), (gpu, slot,  \
      err))                                                                                        \
  STATUS(mp_stage_gpu_grad_norm_squared, (mp_stage_gpu *gpu, double *out, mp_error *err), (gpu,    \
      out, err))                                                                                   \
  STATUS(mp_stage_gpu_adamw, (mp_stage_gpu *gpu, const mp_gpu_adamw *adamw, mp_error *err), (gpu,  \
      adamw, err))

/* The library's one exported symbol: a table whose identity says which build made it. */
#define MP_CUDA_BACKEND_TABLE_SYMBOL "mp_cuda_backend_table_v1"

/* Every function's declaration, as one string: a library built from other headers differs. */
#define MP_CUDA_SIGNATURE_STATUS(name, params, args) "mp_status " #name #params ";"
#define MP_CUDA_SIGNATURE_VALUE(ret, name, params, args, fallback) #ret " " #name #params ";"
#define MP_CUDA_SIGNATURE_VOID(name, params, args) "void " #name #params ";"
#define MP_CUDA_BACKEND_SIGNATURE                                                                  \
  MP_CUDA_BACKEND_FUNCTIONS(MP_CUDA_SIGNATURE_STATUS, MP_CUDA_SIGNATURE_VALUE,                     \
                            MP_CUDA_SIGNATURE_VALUE, MP_CUDA_SIGNATURE_VOID)

/* The sizes of the structs passed by pointer across (in bytes): a struct that gained a field
 * changes no declaration. */
#define MP_CUDA_BACKEND_STRUCT_SIZES                                                               \
  {sizeof(mp_error),       sizeof(mp_gpu_report),          sizeof(mp_nccl_p2p_op),                 \
   sizeof(mp_gpu_adamw),   sizeof(mp_stage_gpu_config),    sizeof(mp_stage_layout_config),         \
   sizeof(mp_stage_span),  sizeof(mp_stage_zero),          sizeof(mp_tp_comm)}
enum { MP_CUDA_BACKEND_NUM_STRUCT_SIZES = 9 };

#define MP_CUDA_TABLE_STATUS(name, params, args) mp_status(*name) params;
#define MP_CUDA_TABLE_VALUE(ret, name, params, args, fallback) ret(*name) params;
#define MP_CUDA_TABLE_VOID(name, params, args) void(*name) params;

typedef struct {
  const char *signature; /* MP_CUDA_BACKEND_SIGNATURE of the library's build */
  size_t struct_sizes[MP_CUDA_BACKEND_NUM_STRUCT_SIZES];
  const char *kind; /* "cuda", "emulated" (CUDA's C API on the CPU) or "none" (built without) */
  MP_CUDA_BACKEND_FUNCTIONS(MP_CUDA_TABLE_STATUS, MP_CUDA_TABLE_VALUE, MP_CUDA_TABLE_VALUE,
                            MP_CUDA_TABLE_VOID)
} mp_cuda_backend_table;

#endif /* MPENGINE_ENGINE_CUDA_BACKEND_TABLE_H */
