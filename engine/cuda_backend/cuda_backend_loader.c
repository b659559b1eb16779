/* engine/cuda_backend/cuda_backend_loader.c — loads libmpengine_cuda.so on first use and defines
 * every function of the backend's headers as a forwarder into it; see cuda_backend.h. */
#include "engine/cuda_backend/cuda_backend.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/cuda_backend/cuda_backend_table.h"

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
/* Written once inside load_once; read without it by the QUERY and VOID forwarders, which must not
 * load (hence the atomics). */
static const mp_cuda_backend_table *loaded_table;
static mp_error load_error = MP_ERROR_INITIALIZER;

void mp_cuda_backend_path(char *path, size_t path_bytes) {
  const char *override = getenv("MPENGINE_CUDA_BACKEND");
  if (override != NULL && override[0] != '\0') {
    snprintf(path, path_bytes, "%s", override);
    return;
  }
  char executable[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", executable, sizeof executable - 1);
  if (length <= 0) {
    snprintf(path, path_bytes, "libmpengine_cuda.so"); /* the loader's search path then */
    return;
  }
  executable[length] = '\0';
  char *slash = strrchr(executable, '/');
  if (slash != NULL) *slash = '\0';
  snprintf(path, path_bytes, "%s/libmpengine_cuda.so", executable);
}

static bool same_build(const mp_cuda_backend_table *table) {
  static const size_t expected_sizes[MP_CUDA_BACKEND_NUM_STRUCT_SIZES] =
      MP_CUDA_BACKEND_STRUCT_SIZES;
  if (table->signature == NULL || strcmp(table->signature, MP_CUDA_BACKEND_SIGNATURE) != 0) {
    return false;
  }
  return memcmp(table->struct_sizes, expected_sizes, sizeof expected_sizes) == 0;
}

static void load(void) {
  char path[PATH_MAX + 32];
  mp_cuda_backend_path(path, sizeof path);
  if (strchr(path, '/') != NULL && access(path, F_OK) != 0) {
    mp_fail(&load_error, MP_ERR_INPUT,
            "the CUDA backend %s is missing. It is built with the binary (bazel build "
            "//tools:mpengine puts libmpengine_cuda.so beside bazel-bin/tools/mpengine): copy it "
            "beside the mpengine you run or set MPENGINE_CUDA_BACKEND to its path; without it "
            "mpengine runs on CPUs only (--backend cpu)",
            path);
    return;
  }
  void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == NULL) {
    const char *reason = dlerror();
    mp_fail(&load_error, MP_ERR_INPUT,
            "cannot load the CUDA backend %s: %s. It needs the CUDA runtime, cuBLAS and NCCL of "
            "the CUDA it was built with: put the folder that holds them (/usr/local/cuda/lib64) in "
            "LD_LIBRARY_PATH, or run on CPUs (--backend cpu)",
            path, reason != NULL ? reason : "unknown error");
    return;
  }
  const mp_cuda_backend_table *table =
      (const mp_cuda_backend_table *)dlsym(library, MP_CUDA_BACKEND_TABLE_SYMBOL);
  if (table == NULL) {
    mp_fail(&load_error, MP_ERR_INPUT, "%s is not an mpengine CUDA backend (it has no %s)", path,
            MP_CUDA_BACKEND_TABLE_SYMBOL);
    dlclose(library);
    return;
  }
  if (!same_build(table)) {
    mp_fail(&load_error, MP_ERR_INPUT,
            "the CUDA backend %s comes from another build of mpengine (its functions or structs "
            "differ from this binary's): use the libmpengine_cuda.so built with this mpengine",
            path);
    dlclose(library);
    return;
  }
  /* Never closed: the library's kernels, threads and communicators live until the process ends. */
  __atomic_store_n(&loaded_table, table, __ATOMIC_RELEASE);
}

mp_status mp_cuda_backend_load(mp_error *err) {
  pthread_once(&load_once, load);
  if (__atomic_load_n(&loaded_table, __ATOMIC_ACQUIRE) != NULL) return MP_OK;
  return mp_fail(err, load_error.status, "%s", load_error.message);
}

static const mp_cuda_backend_table *table_if_loaded(void) {
  return __atomic_load_n(&loaded_table, __ATOMIC_ACQUIRE);
}

bool mp_cuda_backend_loaded(void) { return table_if_loaded() != NULL; }

const char *mp_cuda_backend_kind(void) {
  const mp_cuda_backend_table *table = table_if_loaded();
  return table != NULL ? table->kind : NULL;
}

bool mp_cuda_backend_gpu_possible(void) {
#ifdef MP_CUDA_BACKEND_EMULATED
  return true;
#else
  /* /dev/nvidiactl: the Linux driver (containers get it with their GPUs); /dev/dxg: WSL's. */
  return access("/dev/nvidiactl", F_OK) == 0 || access("/proc/driver/nvidia/version", F_OK) == 0 ||
         access("/dev/dxg", F_OK) == 0;
#endif
}

/* The forwarders, one per function of the list (cuda_backend_table.h says what each kind does
 * before the library is loaded). */
#define FORWARD_STATUS(name, params, args)                               \
  mp_status name params {                                                \
    const mp_status load_status = mp_cuda_backend_load(err);             \
    if (load_status != MP_OK) return load_status;                        \
    return loaded_table->name args;                                      \
  }
#define FORWARD_LOADING(ret, name, params, args, fallback)               \
  ret name params {                                                      \
    mp_error ignored = MP_ERROR_INITIALIZER;                             \
    if (mp_cuda_backend_load(&ignored) != MP_OK) return fallback;        \
    return loaded_table->name args;                                      \
  }
#define FORWARD_QUERY(ret, name, params, args, fallback)                 \
  ret name params {                                                      \
    const mp_cuda_backend_table *table = table_if_loaded();              \
    return table != NULL ? table->name args : fallback;                  \
  }
#define FORWARD_VOID(name, params, args)                                 \
  void name params {                                                     \
    const mp_cuda_backend_table *table = table_if_loaded();              \
    if (table != NULL) table->name args;                                 \
  }

MP_CUDA_BACKEND_FUNCTIONS(FORWARD_STATUS, FORWARD_LOADING, FORWARD_QUERY, FORWARD_VOID)
