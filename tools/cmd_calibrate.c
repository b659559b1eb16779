/*
 * tools/cmd_calibrate.c — `mpengine calibrate [--out CLUSTER.json|-]`: measure this machine for
 * the cost model and write a cluster description: by default the calibration file that
 * mp_cluster_load("cpu-local") returns from then on (topology/cluster.h), else --out's file, which
 * `plan --cluster FILE` accepts.
 *
 * It measures one rank's fp32 GEMM throughput on the CPU (OpenBLAS sgemm on one thread, linear
 * layers of 32 to 4096 features over n/8 tokens (at least 32) in the three layouts of their forward
 * and backward, each timed for at least 0.1 s after a warm-up) and writes the cpu-local
 * description with the measured peak (the fastest shape) and the efficiency curve (each shape's
 * throughput over that peak, by its FLOPs); one thread's memory bandwidth (an in-place update
 * over 64 MiB arrays, the pattern of the optimizer); the cores this process may run on
 * (cores_per_node: the ranks of `run` share them, topology/cluster.h "Shared cores"); the
 * machine's memory, which the ranks of a job share (node_memory_gib, and device_memory_gib: one
 * rank alone may use all of it; "Shared memory"); and the resident memory of this
 * process after loading its libraries and OpenBLAS, before any big allocation, as the workspace
 * every rank holds (workspace_gib); and one thread's rate on the elementwise kernels' arithmetic
 * (vector_tflops from the runtime's vectorised GELU, scalar_tflops from a softmax's expf loop as
 * the CPU attention runs it: a CPU core computes these slower than it streams their bytes). Communicator bandwidth and latency are measured with
 * `mpirun -np 2 mpengine bench comm` when mpirun is there; otherwise the notes say so.
 */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "topology/cluster.h"
#include "common/atomic_file.h"
#include "layers/gelu.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/launcher_env.h"

/* The three GEMMs of a linear layer's training step on n x n x n, as layers/matmul.c calls them:
 * forward out = in W^T, input gradient din = dout W, weight gradient dW = dout^T in. Square NN
 * alone flatters small shapes (64^3 NN ran at 157 GFLOP/s, NT at 97, on a Xeon core). */
static void linear_gemms(int m, int k, int n, float *in, const float *weight, float *out,
                         float *dweight) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, in, k, weight, k, 0.0f, out,
              n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, out, n, weight, k, 0.0f,
              in, k);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, out, n, in, k, 1.0f, dweight,
              k);
}

/* Tokens of the linear layer timed for n features: training GEMMs on a CPU rank are thin (a
 * micro-batch of a few hundred tokens against thousands of features), and OpenBLAS runs them
 * about 10% below a square product of the same FLOPs. */
static int calibration_tokens(int n) { return n / 8 > 32 ? n / 8 : 32; }

/* FLOP/s of a linear layer's three sgemms (linear_gemms: m tokens, k features in, n out) on
 * this thread; 0 when out of memory. */
static double time_linear(int m, int k, int n, double min_seconds) {
  float *in = malloc(sizeof(float) * (size_t)m * (size_t)k);
  float *weight = malloc(sizeof(float) * (size_t)n * (size_t)k);
  float *out = calloc((size_t)m * (size_t)n, sizeof(float));
  float *dweight = calloc((size_t)n * (size_t)k, sizeof(float));
  if (in == NULL || weight == NULL || out == NULL || dweight == NULL) {
    free(in);
    free(weight);
    free(out);
    free(dweight);
    return 0.0;
  }
  for (size_t i = 0; i < (size_t)m * (size_t)k; ++i) in[i] = (float)((i * 7) % 13) * 0.01f;
  for (size_t i = 0; i < (size_t)n * (size_t)k; ++i) weight[i] = (float)((i * 5) % 11) * 0.01f;
  linear_gemms(m, k, n, in, weight, out, dweight);
  long reps = 0;
  const double start = cli_now_seconds();
  double elapsed = 0.0;
  do {
    linear_gemms(m, k, n, in, weight, out, dweight);
    ++reps;
    elapsed = cli_now_seconds() - start;
  } while (elapsed < min_seconds);
  free(in);
  free(weight);
  free(out);
  free(dweight);
  return 3.0 * 2.0 * (double)m * k * n * (double)reps / elapsed;
}

/* The square linear layer of n features (calibration_tokens(n) tokens): the efficiency curve. */
static double time_sgemm(int n, double min_seconds) {
  return time_linear(calibration_tokens(n), n, n, min_seconds);
}

/* A wide linear layer, an LM head's shape: kWideIn features to kWideOut (a vocabulary, 43 times
 * wider: mp_cluster_wide_gemm), calibration_tokens(kWideIn) tokens. */
enum { kWideIn = 768, kWideOut = 32768 };

/* Bytes per second one thread moves updating an array in place from another, a[i] = 0.999 a[i] +
 * b[i] over two arrays of 64 MiB (well beyond the caches): 12 bytes per element (two reads, one
 * write back to the line just read), the pattern of the optimizer and the elementwise kernels.
 * The fastest of the passes timed for min_seconds. 0 when out of memory. */
static double time_memory_bandwidth(double min_seconds) {
  const size_t count = (size_t)16 << 20;
  float *a = malloc(sizeof(float) * count);
  float *b = malloc(sizeof(float) * count);
  if (a == NULL || b == NULL) {
    free(a);
    free(b);
    return 0.0;
  }
  for (size_t i = 0; i < count; ++i) {
    a[i] = 1.0f;
    b[i] = (float)(i % 7) * 0.01f;
  }
  double best = 0.0;
  const double start = cli_now_seconds();
  int passes = 0;
  do {
    const double pass_start = cli_now_seconds();
    for (size_t i = 0; i < count; ++i) a[i] = 0.999f * a[i] + b[i];
    const double seconds = cli_now_seconds() - pass_start;
    const double rate = 12.0 * (double)count / seconds;
    if (seconds > 0 && rate > best) best = rate;
    ++passes;
  } while (passes < 3 || cli_now_seconds() - start < min_seconds);
  volatile float sink = a[count / 2]; /* keeps the loop */
  (void)sink;
  free(a);
  free(b);
  return best;
}

/* The rates of the elementwise kernels' arithmetic on one thread, in the FLOPs of
 * topology/layer_cost.h (an exp or tanh counts 20), over 1 MiB of floats (in cache, so the
 * arithmetic is what is timed), each the fastest of its passes timed for min_seconds / 2:
 * vectorised, the runtime's own GELU forward (layers/gelu.c, 16 lanes: 28 per element); scalar, a
 * causal softmax's row loop as layers/attention.c runs it (max; subtract, expf and sum;
 * normalise: 23 per element). */
static void time_elementwise_rates(double min_seconds, double *vector_rate, double *scalar_rate) {
  enum { kCount = 1 << 18 };
  *vector_rate = *scalar_rate = 0.0;
  float *x = malloc(sizeof(float) * kCount);
  float *y = malloc(sizeof(float) * kCount);
  if (x == NULL || y == NULL) {
    free(x);
    free(y);
    return;
  }
  for (int i = 0; i < kCount; ++i) x[i] = (float)(i % 97) * 0.02f - 1.0f;
  for (int kernel = 0; kernel < 2; ++kernel) {
    double *rate = kernel == 0 ? vector_rate : scalar_rate;
    const double start = cli_now_seconds();
    int passes = 0;
    do {
      const double pass_start = cli_now_seconds();
      if (kernel == 0) {
        mp_gelu_forward_cpu(y, x, kCount);
      } else {
        float maxval = -INFINITY;
        for (int i = 0; i < kCount; ++i) maxval = x[i] > maxval ? x[i] : maxval;
        float sum = 0.0f;
        for (int i = 0; i < kCount; ++i) {
          y[i] = expf(x[i] - maxval);
          sum += y[i];
        }
        const float inverse = 1.0f / sum;
        for (int i = 0; i < kCount; ++i) y[i] *= inverse;
      }
      const double seconds = cli_now_seconds() - pass_start;
      const double flops = (kernel == 0 ? 28.0 : 23.0) * kCount;
      if (seconds > 0 && flops / seconds > *rate) *rate = flops / seconds;
      ++passes;
    } while (passes < 3 || cli_now_seconds() - start < min_seconds / 2);
  }
  volatile float sink = y[kCount / 2]; /* keeps the loops */
  (void)sink;
  free(x);
  free(y);
}

/* A field of /proc/self/status or /proc/meminfo ("VmRSS:", "MemTotal:"), in KiB; 0 when absent. */
static long long proc_kib(const char *file, const char *field) {
  FILE *stream = fopen(file, "r");
  if (stream == NULL) return 0;
  char line[256];
  long long kib = 0;
  const size_t length = strlen(field);
  while (fgets(line, sizeof line, stream) != NULL) {
    if (strncmp(line, field, length) == 0) {
      kib = atoll(line + length);
      break;
    }
  }
  fclose(stream);
  return kib;
}

/* Runs `mpirun -np 2 mpengine bench comm --ops sendrecv,all_reduce --json` and fits the
 * point-to-point link of this machine: latency from the smallest message's one-way time,
 * bandwidth from the largest's; and the all-reduce's bus bandwidth at the largest size over that
 * bandwidth as the link's collective efficiency (Open MPI's shared-memory all-reduce copies and
 * reduces on the cores, far below a send). The largest size is 64 MiB, beyond the caches: a
 * step's gradients (hundreds of MiB, reduced in 16 MiB buckets) come from memory, and a 16 MiB
 * buffer timed over and over stays in the caches (here it measured twice the bus bandwidth of
 * 64 MiB and 256 MiB, which agree). Returns false (leaving the figures alone) when mpirun or the
 * benchmark is not available. */
static bool measure_links(double *latency_s, double *bandwidth_bytes_per_s,
                          double *collective_efficiency, double *collective_latency_s) {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (length <= 0) return false;
  self[length] = '\0';
  char command[8192];
  snprintf(command, sizeof command,
           "OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader} OMPI_MCA_plm_rsh_agent= "
           "mpirun --oversubscribe -np 2 %s '%s' bench comm --ops sendrecv,all_reduce --min-bytes 1K "
           "--max-bytes 64M --iters 10 --warmup 3 --json 2>/dev/null",
           geteuid() == 0 ? "--allow-run-as-root" : "", self);
  FILE *pipe = popen(command, "r");
  if (pipe == NULL) return false;
  char line[1024];
  double smallest_bytes = 0, smallest_us = 0, largest_bytes = 0, largest_busbw = 0;
  double allreduce_bytes = 0, allreduce_busbw = 0, allreduce_smallest = 0, allreduce_us = 0;
  while (fgets(line, sizeof line, pipe) != NULL) {
    cJSON *row = cJSON_Parse(line);
    const cJSON *op = cJSON_GetObjectItemCaseSensitive(row, "op");
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(row, "bytes");
    const cJSON *time_us = cJSON_GetObjectItemCaseSensitive(row, "time_us");
    const cJSON *busbw = cJSON_GetObjectItemCaseSensitive(row, "busbw_gbps");
    const bool all_reduce = cJSON_IsString(op) && strcmp(op->valuestring, "all_reduce") == 0;
    if (all_reduce && cJSON_IsNumber(bytes) && cJSON_IsNumber(busbw) &&
        cJSON_IsNumber(time_us)) {
      if (allreduce_smallest == 0 || bytes->valuedouble < allreduce_smallest) {
        allreduce_smallest = bytes->valuedouble;
        allreduce_us = time_us->valuedouble;
      }
      if (bytes->valuedouble > allreduce_bytes) {
        allreduce_bytes = bytes->valuedouble;
        allreduce_busbw = busbw->valuedouble;
      }
    } else if (cJSON_IsNumber(bytes) && cJSON_IsNumber(time_us) && cJSON_IsNumber(busbw)) {
      if (smallest_bytes == 0 || bytes->valuedouble < smallest_bytes) {
        smallest_bytes = bytes->valuedouble;
        smallest_us = time_us->valuedouble;
      }
      if (bytes->valuedouble > largest_bytes) {
        largest_bytes = bytes->valuedouble;
        largest_busbw = busbw->valuedouble;
      }
    }
    cJSON_Delete(row);
  }
  if (pclose(pipe) != 0 || smallest_bytes == 0 || largest_busbw <= 0) return false;
  *latency_s = smallest_us * 1e-6;
  *bandwidth_bytes_per_s = largest_busbw * 1e9;
  /* A 2-rank ring all-reduce is 2 steps. */
  *collective_latency_s = allreduce_us > 0 ? allreduce_us * 1e-6 / 2.0 : 0.0;
  *collective_efficiency = 1.0;
  if (allreduce_busbw > 0 && allreduce_busbw < largest_busbw) {
    *collective_efficiency = allreduce_busbw / largest_busbw;
  }
  return true;
}

int cmd_calibrate(int argc, char **argv) {
  cli_option options[] = {
      {"out", "CLUSTER.json", "write the description to this file, - for stdout (default: the calibration file plan and run use for cpu-local, ~/.cache/mpengine/cpu-local.json)", NULL},
      {"quick", NULL, "time each shape for 0.02 s instead of 0.1 s (for tests)", NULL},
      {"no-comm", NULL, "skip the point-to-point measurement (mpirun -np 2 bench comm)", NULL},
      {0},
  };
  cli_command command = {
      .command = argv[0],
      .usage = "mpengine calibrate [--out CLUSTER.json|-] [--quick] [--no-comm]",
      .summary = "Measure this machine's fp32 GEMM throughput on one thread (OpenBLAS sgemm over "
                 "linear layers of n features and n/8 tokens), the elementwise kernels' "
                 "arithmetic rate and Open MPI's all-reduce, and write the cpu-local cluster description with the measured "
                 "peak and efficiency curve, one thread's memory bandwidth, the cores the ranks "
                 "share, the memory they share, a bare rank's resident memory (its workspace), and "
                 "the point-to-point latency and bandwidth between two ranks (mpirun -np 2 "
                 "mpengine bench comm). By default it is kept as this "
                 "machine's cpu-local (~/.cache/mpengine/cpu-local.json, or $MPENGINE_CALIBRATION),"
                 " which plan and run then use; run it again to refresh it. Without mpirun the "
                 "link figures stay cpu-local's, and the notes say so.",
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_cluster cluster;
  if (mp_cluster_preset("cpu-local", &cluster, &err) != MP_OK) return cli_report(&command, &err);
  openblas_set_num_threads(1);
  /* A process that has loaded its libraries and OpenBLAS's buffers, before any model: the
   * workspace every rank of `run` needs besides its state and activations. */
  time_sgemm(32, 0.0);
  const long long resident_kib = proc_kib("/proc/self/status", "VmRSS:");
  const int cores = launcher_usable_cores();
  const long long memory_kib = proc_kib("/proc/meminfo", "MemTotal:");
  const int shapes[] = {32, 64, 128, 256, 512, 1024, 2048, 4096};
  enum { kShapes = sizeof shapes / sizeof shapes[0] };
  const double min_seconds = cli_flag(&command, "quick") ? 0.02 : 0.1;
  double rate[kShapes], peak = 0.0;
  for (int i = 0; i < kShapes; ++i) {
    rate[i] = time_sgemm(shapes[i], min_seconds);
    if (rate[i] > peak) peak = rate[i];
    fprintf(stderr, "sgemm %4d tokens x %4d x %4d (NT, NN, TN): %8.2f GFLOP/s\n",
            calibration_tokens(shapes[i]), shapes[i], shapes[i], rate[i] / 1e9);
  }
  if (peak <= 0.0) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory timing GEMMs");
    return cli_report(&command, &err);
  }
  cluster.peak_flops_per_s[MP_DTYPE_FP32] = peak;
  cluster.gemm_efficiency_given = true;
  cluster.gemm_efficiency_points = kShapes;
  for (int i = 0; i < kShapes; ++i) {
    cluster.gemm_efficiency[i].gemm_flops =
        2.0 * calibration_tokens(shapes[i]) * (double)shapes[i] * shapes[i];
    double e = rate[i] / peak;
    cluster.gemm_efficiency[i].efficiency = e > 1e-6 ? e : 1e-6;
  }
  /* The same GEMMs on all the cores as BLAS threads, as `run` gives one rank: the threads' rate
   * over cores x one thread's, over the training GEMMs' range of shapes (256 to 2048 features). */
  if (cores > 1) {
    openblas_set_num_threads(cores);
    double sum = 0.0;
    int counted = 0;
    for (int i = 0; i < kShapes; ++i) {
      if (shapes[i] < 256 || shapes[i] > 2048 || rate[i] <= 0.0) continue;
      const double threaded = time_sgemm(shapes[i], min_seconds);
      if (threaded <= 0.0) continue;
      sum += threaded / ((double)cores * rate[i]);
      ++counted;
    }
    openblas_set_num_threads(1);
    if (counted > 0) {
      const double efficiency = sum / counted;
      cluster.blas_thread_efficiency = efficiency < 1.0 ? efficiency : 1.0;
      fprintf(stderr, "sgemm on %d BLAS threads: %.2f of %d x one thread's rate (256 to 2048 "
                      "features)\n",
              cores, efficiency, cores);
    }
  }
  /* A wide GEMM against the curve's rate for its FLOPs (the curve's points are square). */
  const double wide_flops = 2.0 * calibration_tokens(kWideIn) * (double)kWideIn * kWideOut;
  const double wide_rate = time_linear(calibration_tokens(kWideIn), kWideIn, kWideOut, min_seconds);
  double wide_efficiency = 0.0;
  if (wide_rate > 0) {
    wide_efficiency = wide_rate / (peak * mp_cluster_gemm_efficiency(&cluster, wide_flops));
    if (wide_efficiency > 1.0) wide_efficiency = 1.0;
    cluster.wide_gemm_efficiency = wide_efficiency;
    fprintf(stderr, "sgemm %4d tokens x %4d x %5d (an LM head's shape): %8.2f GFLOP/s, %.2f of "
                    "the curve's rate for its FLOPs\n",
            calibration_tokens(kWideIn), kWideIn, kWideOut, wide_rate / 1e9, wide_efficiency);
  }
  snprintf(cluster.name, sizeof cluster.name, "cpu-local-calibrated");
  /* This machine: its cores, its memory (shared by the ranks of a job: each holds its share,
   * one rank alone all of it; topology/cluster.h "Shared memory"), one thread's memory
   * bandwidth, a bare rank's resident memory. */
  cluster.cores_per_node = cores;
  if (memory_kib > 0) {
    cluster.device_memory_bytes = cluster.node_memory_bytes = memory_kib * 1024;
  }
  const double memory_bandwidth = time_memory_bandwidth(min_seconds);
  if (memory_bandwidth > 0) cluster.memory_bandwidth_bytes_per_s = memory_bandwidth;
  double vector_rate = 0.0, scalar_rate = 0.0;
  time_elementwise_rates(min_seconds, &vector_rate, &scalar_rate);
  if (vector_rate > 0) cluster.vector_flops_per_s = vector_rate;
  if (scalar_rate > 0) cluster.scalar_flops_per_s = scalar_rate;
  if (resident_kib > 0 && resident_kib * 1024 < cluster.device_memory_bytes) {
    cluster.workspace_bytes = resident_kib * 1024;
  }
  fprintf(stderr, "cores: %d; memory %.1f GiB (shared by the ranks: %.2f GiB each of as many "
                  "ranks as cores); memory bandwidth (one thread) "
                  "%.2f GB/s; elementwise arithmetic %.2f GFLOP/s vectorised, %.2f scalar; a bare "
                  "rank's resident memory %.0f MiB\n",
          cores, memory_kib / 1048576.0,
          (double)mp_cluster_device_memory(&cluster, cores) / 1073741824.0,
          cluster.memory_bandwidth_bytes_per_s / 1e9, cluster.vector_flops_per_s / 1e9,
          cluster.scalar_flops_per_s / 1e9, cluster.workspace_bytes / 1048576.0);
  double latency_s = 0, bandwidth = 0, collective_efficiency = 1.0, collective_latency_s = 0;
  const bool links =
      !cli_flag(&command, "no-comm") &&
      measure_links(&latency_s, &bandwidth, &collective_efficiency, &collective_latency_s);
  char link_notes[384];
  if (links) {
    /* Ranks of cpu-local share one machine: inside and across "nodes" is the same link. */
    cluster.intra_node_latency_s = cluster.inter_node_latency_s = latency_s;
    cluster.intra_node_bandwidth_bytes_per_s = cluster.inter_node_bandwidth_bytes_per_s =
        bandwidth;
    cluster.intra_node_efficiency = cluster.inter_node_efficiency = collective_efficiency;
    cluster.intra_node_collective_latency_s = cluster.inter_node_collective_latency_s =
        collective_latency_s;
    snprintf(link_notes, sizeof link_notes,
             "send/recv between two ranks (mpirun -np 2 bench comm) measured %.2f us one way "
             "for 1 KiB and %.2f GB/s for 64 MiB; an all-reduce of 64 MiB %.0f%% of that bus "
             "bandwidth (the links' efficiency), of 1 KiB %.2f us a ring step",
             latency_s * 1e6, bandwidth / 1e9, 100.0 * collective_efficiency,
             collective_latency_s * 1e6);
    fprintf(stderr, "send/recv: %.2f us latency, %.2f GB/s; all-reduce bus bandwidth %.2f GB/s\n",
            latency_s * 1e6, bandwidth / 1e9, collective_efficiency * bandwidth / 1e9);
  } else {
    snprintf(link_notes, sizeof link_notes,
             "the link figures are cpu-local's placeholders (not measured: %s)",
             cli_flag(&command, "no-comm") ? "--no-comm" : "mpirun -np 2 bench comm failed");
  }
  snprintf(cluster.notes, sizeof cluster.notes,
           "Measured by mpengine calibrate: fp32 sgemm (OpenBLAS %s, one thread, a linear layer's "
           "forward, input- and weight-gradient GEMMs) peaks at %.1f GFLOP/s; the efficiency curve "
           "is each shape's throughput over that peak (n features, n/8 tokens); a wide one "
           "(%d to %d features, an LM head's shape) runs at %.2f of the curve's rate "
           "(wide_gemm_efficiency); %s. "
           "%d cores (the ranks of run share them; blas_thread_efficiency: the same GEMMs on all "
           "of them as BLAS threads over cores x one thread's rate); node memory is the "
           "machine's %.1f GiB, shared by a job's ranks; memory bandwidth is one thread's "
           "in-place update over 64 MiB arrays (%.2f GB/s); vector_tflops is one thread's GELU "
           "forward (%.2f GFLOP/s, a tanh counting 20), scalar_tflops a causal softmax's expf loop (%.2f GFLOP/s); workspace is a bare "
           "rank's resident memory (%.0f MiB).",
           openblas_get_corename(), peak / 1e9, kWideIn, kWideOut, wide_efficiency, link_notes,
           cores, memory_kib / 1048576.0,
           cluster.memory_bandwidth_bytes_per_s / 1e9, cluster.vector_flops_per_s / 1e9,
           cluster.scalar_flops_per_s / 1e9,
           cluster.workspace_bytes / 1048576.0);
  cJSON *json = NULL;
  if (mp_cluster_to_json(&cluster, &json, &err) != MP_OK) return cli_report(&command, &err);
  char *text = cJSON_Print(json);
  cJSON_Delete(json);
  if (text == NULL) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory");
    return cli_report(&command, &err);
  }
  const char *out = cli_value(&command, "out");
  char calibration[4096];
  if (out == NULL) {
    /* This machine's cpu-local from now on (topology/cluster.h). */
    if (!mp_cluster_calibration_path(calibration, sizeof calibration)) {
      free(text);
      mp_fail(&err, MP_ERR_INPUT,
              "no calibration file to write (MPENGINE_CALIBRATION is empty, or no HOME); give "
              "--out FILE, or --out - for stdout");
      return cli_report(&command, &err);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", calibration);
    for (char *slash = strchr(dir + 1, '/'); slash != NULL; slash = strchr(slash + 1, '/')) {
      *slash = '\0';
      mkdir(dir, 0777); /* each parent; an existing one is fine, a failure shows at the write */
      *slash = '/';
    }
    out = calibration;
  }
  int code = CLI_EXIT_OK;
  if (strcmp(out, "-") == 0) {
    printf("%s\n", text);
  } else {
    const size_t length = strlen(text);
    mp_atomic_file file;
    mp_status status = mp_atomic_file_open(&file, out, &err);
    if (status == MP_OK) {
      mp_atomic_file_write(&file, text, length);
      mp_atomic_file_write(&file, "\n", 1);
      status = mp_atomic_file_commit(&file, &err);
    }
    if (status != MP_OK) {
      code = cli_report(&command, &err);
    } else {
      fprintf(stderr, "mpengine calibrate: wrote %s (fp32 peak %.1f GFLOP/s)%s\n", out, peak / 1e9,
              out == calibration ? "; plan and run use it for cpu-local from now on (run "
                                   "calibrate again to refresh it)"
                                 : "");
    }
  }
  free(text);
  return code;
}
