/*
 * engine/comm/comm_staging_cuda.cu — comm_staging.h over CUDA: device pointers recognised through the
 * driver without starting CUDA, pinned host memory, synchronous copies.
 *
 * Why the driver and not cudaPointerGetAttributes: the runtime call creates the device's primary
 * context when the process has none, which costs hundreds of MiB of GPU memory and a fraction of a
 * second per rank, and a CPU run over MPI on a GPU machine must not pay it for every rank. So the
 * check first looks whether libcuda.so is loaded at all (no driver, no device pointers), then asks
 * the driver's cuPointerGetAttribute (looked up with dlsym; this file does not link libcuda), which
 * answers for any pointer under unified addressing and creates nothing.
 */
#include <cuda.h>  // types and enums only: the driver is reached through dlsym
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "engine/comm/comm_staging.h"
#include "layers/cuda_check.cuh"

typedef CUresult (*pointer_get_attribute_fn)(void *data, CUpointer_attribute attribute,
                                             CUdeviceptr pointer);

namespace {

// The loaded libcuda's path, found by walking the loaded objects (no file system access).
int find_libcuda(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  const char *name = info->dlpi_name;
  if (name == NULL || name[0] == '\0') return 0;
  const char *base = strrchr(name, '/');
  base = base != NULL ? base + 1 : name;
  if (strncmp(base, "libcuda.so", strlen("libcuda.so")) != 0) return 0;
  *(const char **)data = name;
  return 1;
}

// cuPointerGetAttribute of the loaded driver, or NULL while no driver is loaded. Once found it
// stays: the driver is never unloaded while the process runs.
pointer_get_attribute_fn driver_pointer_get_attribute(void) {
  static pointer_get_attribute_fn cached = NULL;
  if (cached != NULL) return cached;
  const char *path = NULL;
  if (dl_iterate_phdr(find_libcuda, &path) == 0 || path == NULL) return NULL;
  void *handle = dlopen(path, RTLD_NOLOAD | RTLD_LAZY);
  if (handle == NULL) return NULL;
  cached = (pointer_get_attribute_fn)dlsym(handle, "cuPointerGetAttribute");
  return cached;  // the handle stays open with the library, as cached refers into it
}

}  // namespace

extern "C" bool mp_staging_is_device(const void *pointer) {
  if (pointer == NULL) return false;
  pointer_get_attribute_fn get = driver_pointer_get_attribute();
  if (get == NULL) return false;  // no CUDA driver in this process: no device memory either
  unsigned int memory_type = 0;
  CUresult status = get(&memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)pointer);
  if (status == CUDA_ERROR_INVALID_VALUE || status == CUDA_ERROR_NOT_INITIALIZED ||
      status == CUDA_ERROR_DEINITIALIZED) {
    return false;  // not memory CUDA knows: ordinary host memory
  }
  if (status != CUDA_SUCCESS) {
    // Unexpected (no current context on this thread, say): the runtime knows too, and a process
    // that reached here has already used CUDA.
    cudaPointerAttributes attributes;
    if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attributes.type == cudaMemoryTypeDevice;
  }
  if (memory_type != CU_MEMORYTYPE_DEVICE) return false;
  unsigned int managed = 0;
  if (get(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, (CUdeviceptr)pointer) == CUDA_SUCCESS &&
      managed) {
    return false;  // managed memory: the host reads it directly
  }
  return true;
}

extern "C" const char *mp_staging_backend(void) { return "cuda"; }

extern "C" mp_status mp_staging_host_alloc(void **out, size_t bytes, mp_error *err) {
  *out = NULL;
  MP_CUDA_CHECK(cudaMallocHost(out, bytes > 0 ? bytes : 1));
  return MP_OK;
}

extern "C" void mp_staging_host_free(void *pointer) {
  if (pointer != NULL) cudaFreeHost(pointer);
}

extern "C" mp_status mp_staging_copy(void *dst, const void *src, size_t bytes, mp_error *err) {
  if (bytes == 0) return MP_OK;
  MP_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  return MP_OK;
}
