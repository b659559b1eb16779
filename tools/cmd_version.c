/*
 * tools/cmd_version.c — `mpengine version`: the version, whether this build has CUDA, and the GPUs
 * and library versions it finds. `--smoke-test` also runs a kernel on GPU 0 and checks it against
 * the CPU (tools/device_check.sh uses it on the lent GPU machine).
 */
#include <stdio.h>

#include "engine/cuda_backend/cuda_backend.h"
#include "engine/device/gpu_probe.h"
#include "tools/build_id.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/version.h"

int cmd_version(int argc, char **argv) {
  cli_option options[] = {
      {"smoke-test", NULL, "also run a CUDA kernel on GPU 0 and check it against the CPU", NULL},
      {0},
  };
  cli_command command = {.command = "version", .usage = "mpengine version [--smoke-test]",
                         .summary = "Print the version, the build and the devices found.",
                         .max_positionals = 0, .options = options};
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  mp_gpu_report report;
  printf("mpengine %s\n", MPENGINE_VERSION);
  /* Which build exactly (tools/build_id.h): doctor compares it across hosts. */
  char build[MP_BUILD_ID_BYTES];
  if (mp_build_id(build, &err) == MP_OK) printf("build: %s\n", build);
  /* A backend that cannot load is a finding here, not a failure: CPU runs still work. */
  mp_error load_err = MP_ERROR_INITIALIZER;
  if (mp_cuda_backend_load(&load_err) != MP_OK) {
    printf("cuda: %s\n", load_err.message);
    if (!cli_flag(&command, "smoke-test")) return CLI_EXIT_OK;
    return cli_report(&command, &load_err);
  }
  if (mp_gpu_probe(&report, &err) != MP_OK) return cli_report(&command, &err);
  if (!report.built_with_cuda) {
    printf("cuda: %s\n", report.no_device_reason);
  } else {
    printf("cuda: runtime %d.%d, driver %d.%d, cuBLAS %d, NCCL %d\n",
           report.cuda_runtime_version / 1000, report.cuda_runtime_version % 1000 / 10,
           report.cuda_driver_version / 1000, report.cuda_driver_version % 1000 / 10,
           report.cublas_version, report.nccl_version);
    if (report.num_devices == 0) printf("gpus: none (%s)\n", report.no_device_reason);
    for (int d = 0; d < report.num_devices; ++d) {
      const mp_gpu_device_info *info = &report.devices[d];
      printf("gpu %d: %s, compute capability %d.%d, %.1f GiB, %d SMs\n", d, info->name,
             info->compute_major, info->compute_minor,
             (double)info->memory_bytes / (1024.0 * 1024.0 * 1024.0), info->multiprocessors);
    }
  }
  if (cli_flag(&command, "smoke-test")) {
    double max_abs_error = 0.0;
    const size_t n = 1 << 24;
    if (mp_gpu_smoke_test(n, &max_abs_error, &err) != MP_OK) return cli_report(&command, &err);
    printf("smoke test: saxpy on %zu floats, max abs error vs CPU %.3g: %s\n", n, max_abs_error,
           max_abs_error <= 1e-6 ? "ok" : "WRONG");
    if (max_abs_error > 1e-6) return CLI_EXIT_FAILURE;
  }
  return CLI_EXIT_OK;
}
