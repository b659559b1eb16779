/*
 * tools/cmd_bench_comm.c — `mpengine bench comm`: the communicators of engine/comm/comm.h (MPI) and
 * engine/comm/comm_nccl.h (NCCL) timed on this machine, in the style of nccl-tests.
 *
 *   mpirun -np N mpengine bench comm [--backend mpi|cuda] [--buffers host|device] [--ops LIST]
 *                                    [--min-bytes B] [--max-bytes B] [--factor F] [--iters N]
 *                                    [--warmup N] [--comm-timeout S] [--json]
 *
 * Backends. mpi (the default): engine/comm/comm.h over Open MPI, on CPU buffers, or with
 * --buffers device on GPU buffers, which the MPI communicators stage through pinned host memory
 * (several ranks may share one GPU that way). cuda: engine/comm/comm_nccl.h, NCCL on GPU buffers, one
 * GPU per rank (the rank's local index modulo the visible GPUs); started outside mpirun it runs
 * one rank without MPI. Without a GPU (or in a build without CUDA) the GPU variants exit 2 saying
 * so, before MPI starts.
 *
 * For each operation (all_reduce, reduce_scatter, all_gather, broadcast, sendrecv) and each size
 * from --min-bytes to --max-bytes, multiplying by --factor, over the group of all ranks: warm-up
 * calls, then --iters timed calls between two barriers; the time of one call is averaged over the
 * ranks. Then one more call on fresh inputs is checked against its closed form and the wrong
 * elements of every rank are counted (#wrong); any wrong element makes the exit status 1.
 *
 * The columns follow nccl-tests (doc/PERFORMANCE.md): size is the largest buffer of the call in
 * bytes (for reduce_scatter the input of size x count floats, for all_gather the output), algbw =
 * size / time, and busbw = algbw x the collective's factor, which makes it comparable with the
 * link's bandwidth: all_reduce 2(n-1)/n, reduce_scatter and all_gather (n-1)/n, broadcast 1.
 * sendrecv over MPI is a ping-pong between ranks (0,1), (2,3), ...: time is half a round trip,
 * factor 1. Over NCCL it is nccl-tests' ring: every rank sends to the next and receives from the
 * previous in one group call (one rank sends to itself); time is one such exchange, factor 1.
 * NCCL rows are timed on the host around --iters calls enqueued back to back and one wait.
 *
 * It initialises and finalises MPI itself (mpengine's main does not), so the mpi backend runs only
 * under mpirun (or srun) with at least two ranks. Only rank 0 prints the table or, with --json,
 * one JSON object per row instead.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/comm/comm.h"
#include "engine/comm/comm_nccl.h"
#include "engine/device/device.h"
#include "engine/device/gpu_probe.h"
#include "tools/cli.h"
#include "tools/launcher_env.h"
#include "tools/commands.h"

enum {
  kDefaultIters = 20,
  kDefaultWarmup = 5,
  kDefaultFactor = 4,
  kMaxOps = 5,
};
static const int64_t kDefaultMinBytes = 1024;
static const int64_t kDefaultMaxBytes = 16 << 20;
static const int64_t kLimitBytes = (int64_t)1 << 32; /* 4 GiB: buffers are allocated per rank */
static const double kDefaultTimeoutS = 300.0;

typedef enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_BROADCAST, OP_SENDRECV } bench_op;

static const char *const kOpNames[kMaxOps] = {"all_reduce", "reduce_scatter", "all_gather",
                                              "broadcast", "sendrecv"};
static const char *const kOpNotes[kMaxOps] = {
    " (sum, in place)", " (sum)", "", " (root 0)",
    " (ping-pong between ranks 0-1, 2-3, ...; time is one way)"};
static const char *const kNcclSendrecvNote =
    " (ring: each rank sends to the next and receives from the previous in one group call)";
static const char *const kOpFactors[kMaxOps] = {"2(n-1)/n", "(n-1)/n", "(n-1)/n", "1", "1"};

typedef enum { BACKEND_MPI, BACKEND_CUDA } bench_backend;

typedef struct {
  bench_backend backend;
  bool device_buffers;   /* the calls get GPU buffers (always with cuda) */
  mp_comm_world *world;  /* NULL for cuda outside an MPI job */
  mp_comm *comm;         /* every rank; NULL without MPI */
  mp_nccl_world *nccl_world;
  mp_nccl_comm *nccl;    /* every rank, with cuda */
  int rank, size;
  int iters, warmup;
  bool json;
} bench_context;

typedef struct {
  size_t bytes;    /* the size column */
  size_t count;    /* floats per rank the call is given (per block for reduce_scatter/all_gather) */
  double time_us;  /* one call, averaged over participating ranks */
  double algbw, busbw; /* GB/s (1e9 bytes per second) */
  long long wrong; /* summed over ranks */
} bench_row;

/* "1024", "64K", "16M", "1G" (binary multiples) to bytes. */
static mp_status parse_bytes(const char *name, const char *text, int64_t fallback, int64_t *out,
                             mp_error *err) {
  if (text == NULL) {
    *out = fallback;
    return MP_OK;
  }
  char *end = NULL;
  errno = 0;
  long long value = strtoll(text, &end, 10);
  int64_t scale = 1;
  if (end != text && (*end == 'K' || *end == 'k')) scale = 1 << 10, ++end;
  else if (end != text && (*end == 'M' || *end == 'm')) scale = 1 << 20, ++end;
  else if (end != text && (*end == 'G' || *end == 'g')) scale = 1 << 30, ++end;
  /* The minimum applies to the byte count, after the suffix: "1K" is 1024 bytes. */
  if (errno != 0 || end == text || *end != '\0' || value < 1 || value * scale < 4) {
    return mp_fail(err, MP_ERR_INPUT,
                   "--%s: expected a byte count of at least 4, optionally with K, M or G (binary), "
                   "got '%s'",
                   name, text);
  }
  if (value > kLimitBytes / scale) { /* checked before multiplying, so it cannot overflow */
    return mp_fail(err, MP_ERR_INPUT, "--%s: at most 4G bytes, got '%s'", name, text);
  }
  *out = value * scale;
  return MP_OK;
}

static mp_status parse_ops(const char *text, bool selected[kMaxOps], mp_error *err) {
  for (int op = 0; op < kMaxOps; ++op) selected[op] = text == NULL;
  if (text == NULL) return MP_OK;
  const char *cursor = text;
  while (*cursor != '\0') {
    size_t length = strcspn(cursor, ",");
    int found = -1;
    for (int op = 0; op < kMaxOps; ++op) {
      if (strlen(kOpNames[op]) == length && strncmp(cursor, kOpNames[op], length) == 0) found = op;
    }
    if (found < 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "--ops: unknown operation '%.*s' (known: all_reduce, reduce_scatter, "
                     "all_gather, broadcast, sendrecv)",
                     (int)length, cursor);
    }
    selected[found] = true;
    cursor += length;
    if (*cursor == ',') ++cursor;
  }
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One operation at one size: fill, call, check; time.
 * ------------------------------------------------------------------------------------------- */

typedef struct {
  float *a;          /* the call's input (or in-place buffer), on the host */
  float *b;          /* its output where it has one */
  float *device_a, *device_b; /* their GPU twins, which the calls get with device buffers */
  size_t a_count, b_count;
} bench_buffers;

/* The inputs whose results have a closed form: small integers, exact in float. */
static float input_value(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 13 + 1)); }

/* Fills the host buffers and, with device buffers, copies them to the GPU (ordered before the
 * next NCCL call: the copies run on the legacy default stream, which the communicator waits for). */
static mp_status fill(const bench_context *context, bench_op op, bench_buffers *buffers,
                      mp_error *err) {
  for (size_t i = 0; i < buffers->a_count; ++i) buffers->a[i] = input_value(context->rank, i);
  for (size_t i = 0; i < buffers->b_count; ++i) buffers->b[i] = -1.0f;
  if (op == OP_BROADCAST && context->rank != 0) {
    for (size_t i = 0; i < buffers->a_count; ++i) buffers->a[i] = -1.0f;
  }
  if (!context->device_buffers) return MP_OK;
  MP_TRY(mp_device_copy_to_device(buffers->device_a, buffers->a, buffers->a_count * sizeof(float),
                                  err));
  MP_TRY(mp_device_copy_to_device(buffers->device_b, buffers->b, buffers->b_count * sizeof(float),
                                  err));
  if (context->nccl != NULL) return mp_nccl_comm_wait_stream(context->nccl, NULL, err);
  return MP_OK;
}

/* With device buffers: waits for the calls, then copies the results to the host buffers. */
static mp_status fetch(const bench_context *context, bench_buffers *buffers, mp_error *err) {
  if (!context->device_buffers) return MP_OK;
  if (context->nccl != NULL) MP_TRY(mp_nccl_comm_synchronize(context->nccl, err));
  MP_TRY(mp_device_copy_to_host(buffers->a, buffers->device_a, buffers->a_count * sizeof(float),
                                err));
  return mp_device_copy_to_host(buffers->b, buffers->device_b, buffers->b_count * sizeof(float),
                                err);
}

static int sendrecv_partner(const bench_context *context) {
  int partner = context->rank % 2 == 0 ? context->rank + 1 : context->rank - 1;
  return partner < context->size ? partner : -1;
}

/* NCCL's ring: each rank sends to the next and receives from the previous. */
static int ring_next(const bench_context *context) { return (context->rank + 1) % context->size; }
static int ring_previous(const bench_context *context) {
  return (context->rank + context->size - 1) % context->size;
}

static mp_status call_nccl(const bench_context *context, bench_op op, bench_buffers *buffers,
                           size_t count, mp_error *err) {
  mp_nccl_comm *comm = context->nccl;
  float *a = buffers->device_a, *b = buffers->device_b;
  switch (op) {
    case OP_ALL_REDUCE: return mp_nccl_all_reduce_sum(comm, a, count, MP_NCCL_FLOAT32, err);
    case OP_REDUCE_SCATTER:
      return mp_nccl_reduce_scatter_sum(comm, a, b, count, MP_NCCL_FLOAT32, err);
    case OP_ALL_GATHER: return mp_nccl_all_gather(comm, a, b, count, MP_NCCL_FLOAT32, err);
    case OP_BROADCAST: return mp_nccl_broadcast(comm, a, count * sizeof(float), 0, err);
    case OP_SENDRECV: {
      const mp_nccl_p2p_op ops[2] = {
          {MP_NCCL_SEND, ring_next(context), a, count * sizeof(float)},
          {MP_NCCL_RECV, ring_previous(context), b, count * sizeof(float)},
      };
      return mp_nccl_p2p(comm, ops, 2, err);
    }
  }
  return MP_OK;
}

/* One call. NCCL calls are only enqueued; the caller waits (mp_nccl_comm_synchronize). */
static mp_status call(const bench_context *context, bench_op op, bench_buffers *buffers,
                      size_t count, mp_error *err) {
  if (context->backend == BACKEND_CUDA) return call_nccl(context, op, buffers, count, err);
  mp_comm *comm = context->comm;
  /* MPI on GPU buffers: engine/comm/comm.h stages them through pinned host memory. */
  float *a = context->device_buffers ? buffers->device_a : buffers->a;
  float *b = context->device_buffers ? buffers->device_b : buffers->b;
  switch (op) {
    case OP_ALL_REDUCE: return mp_comm_all_reduce_sum_f32(comm, a, count, err);
    case OP_REDUCE_SCATTER: return mp_comm_reduce_scatter_sum_f32(comm, a, b, count, err);
    case OP_ALL_GATHER: return mp_comm_all_gather_f32(comm, a, b, count, err);
    case OP_BROADCAST: return mp_comm_broadcast(comm, a, count * sizeof(float), 0, err);
    case OP_SENDRECV: {
      int partner = sendrecv_partner(context);
      size_t bytes = count * sizeof(float);
      if (partner < 0) return MP_OK;
      if (context->rank % 2 == 0) {
        MP_TRY(mp_comm_send(comm, a, bytes, partner, err));
        return mp_comm_recv(comm, b, bytes, partner, err);
      }
      MP_TRY(mp_comm_recv(comm, b, bytes, partner, err));
      return mp_comm_send(comm, b, bytes, partner, err);
    }
  }
  return MP_OK;
}

/* Every rank has arrived and, with NCCL, the calls so far are complete. */
static mp_status settle(const bench_context *context, mp_error *err) {
  if (context->nccl != NULL) MP_TRY(mp_nccl_comm_synchronize(context->nccl, err));
  if (context->comm != NULL) MP_TRY(mp_comm_barrier(context->comm, err));
  return MP_OK;
}

/* Wrong elements on this rank after one call on filled buffers. */
static long long check(const bench_context *context, bench_op op, const bench_buffers *buffers,
                       size_t count) {
  int n = context->size, r = context->rank;
  float rank_sum = (float)(n * (n + 1) / 2); /* sum over ranks of (rank + 1) */
  long long wrong = 0;
  switch (op) {
    case OP_ALL_REDUCE:
      for (size_t i = 0; i < count; ++i) {
        wrong += buffers->a[i] != rank_sum * (float)(i % 13 + 1);
      }
      break;
    case OP_REDUCE_SCATTER:
      for (size_t i = 0; i < count; ++i) {
        wrong += buffers->b[i] != rank_sum * (float)(((size_t)r * count + i) % 13 + 1);
      }
      break;
    case OP_ALL_GATHER:
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < count; ++i) {
          wrong += buffers->b[(size_t)j * count + i] != input_value(j, i);
        }
      }
      break;
    case OP_BROADCAST:
      for (size_t i = 0; i < count; ++i) wrong += buffers->a[i] != input_value(0, i);
      break;
    case OP_SENDRECV: {
      if (context->backend == BACKEND_CUDA) { /* the ring: the previous rank's message */
        int origin = ring_previous(context);
        for (size_t i = 0; i < count; ++i) wrong += buffers->b[i] != input_value(origin, i);
        break;
      }
      int partner = sendrecv_partner(context);
      if (partner < 0) break;
      /* The even rank gets its own message back; the odd one got the even rank's. */
      int origin = r % 2 == 0 ? r : partner;
      for (size_t i = 0; i < count; ++i) wrong += buffers->b[i] != input_value(origin, i);
      break;
    }
  }
  return wrong;
}

static double bus_factor(bench_op op, int n) {
  switch (op) {
    case OP_ALL_REDUCE: return 2.0 * (n - 1) / n;
    case OP_REDUCE_SCATTER:
    case OP_ALL_GATHER: return (double)(n - 1) / n;
    case OP_BROADCAST:
    case OP_SENDRECV: return 1.0;
  }
  return 1.0;
}

/* Runs one row; size_bytes is the requested size column. Returns MP_OK with row->count 0 when
 * the size is too small for this op on this many ranks. */
static mp_status bench_one(const bench_context *context, bench_op op, int64_t size_bytes,
                           bench_row *row, mp_error *err) {
  int n = context->size;
  memset(row, 0, sizeof *row);
  size_t floats = (size_t)size_bytes / sizeof(float);
  bench_buffers buffers = {0};
  size_t count = floats;
  if (op == OP_REDUCE_SCATTER || op == OP_ALL_GATHER) count = floats / (size_t)n;
  if (count == 0) return MP_OK;
  switch (op) {
    case OP_ALL_REDUCE: buffers.a_count = count; break;
    case OP_REDUCE_SCATTER: buffers.a_count = count * n, buffers.b_count = count; break;
    case OP_ALL_GATHER: buffers.a_count = count, buffers.b_count = count * n; break;
    case OP_BROADCAST: buffers.a_count = count; break;
    case OP_SENDRECV: buffers.a_count = count, buffers.b_count = count; break;
  }
  buffers.a = malloc(buffers.a_count * sizeof(float));
  buffers.b = malloc((buffers.b_count > 0 ? buffers.b_count : 1) * sizeof(float));
  mp_status status = MP_OK;
  if (buffers.a == NULL || buffers.b == NULL) {
    status = mp_fail(err, MP_ERR_RUNTIME, "rank %d: out of memory for %zu-float buffers",
                     context->rank, buffers.a_count + buffers.b_count);
  }
  if (status == MP_OK && context->device_buffers) {
    status = mp_device_alloc((void **)&buffers.device_a, buffers.a_count * sizeof(float), err);
    if (status == MP_OK) {
      status = mp_device_alloc((void **)&buffers.device_b,
                               (buffers.b_count > 0 ? buffers.b_count : 1) * sizeof(float), err);
    }
    if (status != MP_OK) mp_error_prefix(err, "rank %d: GPU buffers", context->rank);
  }
  if (status == MP_OK) status = fill(context, op, &buffers, err);
  for (int i = 0; i < context->warmup && status == MP_OK; ++i) {
    status = call(context, op, &buffers, count, err);
  }
  if (status == MP_OK) status = settle(context, err);
  double start = cli_now_seconds();
  for (int i = 0; i < context->iters && status == MP_OK; ++i) {
    status = call(context, op, &buffers, count, err);
  }
  if (status == MP_OK && context->nccl != NULL) {
    status = mp_nccl_comm_synchronize(context->nccl, err);
  }
  double seconds = (cli_now_seconds() - start) / context->iters;
  if (op == OP_SENDRECV && context->backend == BACKEND_MPI) seconds /= 2; /* one way */
  long long wrong = 0;
  if (status == MP_OK) status = fill(context, op, &buffers, err);
  if (status == MP_OK) status = call(context, op, &buffers, count, err);
  if (status == MP_OK) status = fetch(context, &buffers, err);
  if (status == MP_OK) wrong = check(context, op, &buffers, count);
  free(buffers.a);
  free(buffers.b);
  mp_device_free(buffers.device_a);
  mp_device_free(buffers.device_b);
  MP_TRY(status);

  /* Sum over ranks: seconds of the ranks that took part, how many did, wrong elements. */
  bool took_part = op != OP_SENDRECV || context->backend == BACKEND_CUDA ||
                   sendrecv_partner(context) >= 0;
  float totals[3] = {took_part ? (float)(seconds * 1e6) : 0.0f, took_part ? 1.0f : 0.0f,
                     (float)wrong};
  if (context->comm != NULL) MP_TRY(mp_comm_all_reduce_sum_f32(context->comm, totals, 3, err));

  row->count = count;
  row->bytes = op == OP_REDUCE_SCATTER ? buffers.a_count * sizeof(float)
               : op == OP_ALL_GATHER   ? buffers.b_count * sizeof(float)
                                       : count * sizeof(float);
  row->time_us = totals[1] > 0 ? totals[0] / totals[1] : 0;
  row->algbw = row->time_us > 0 ? (double)row->bytes / (row->time_us * 1e-6) / 1e9 : 0;
  row->busbw = row->algbw * bus_factor(op, n);
  row->wrong = (long long)totals[2];
  return MP_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The command
 * ------------------------------------------------------------------------------------------- */

static mp_status bench_all(bench_context *context, const bool selected[kMaxOps],
                           int64_t min_bytes, int64_t max_bytes, int64_t factor,
                           long long *total_wrong, mp_error *err) {
  bool print = context->rank == 0;
  const bool nccl = context->backend == BACKEND_CUDA;
  if (print && !context->json) {
    if (nccl) {
      int version = mp_nccl_version();
      printf("# mpengine bench comm: %d rank%s, engine/comm/comm_nccl.h over NCCL %d.%d.%d on GPU "
             "buffers, float32\n",
             context->size, context->size == 1 ? "" : "s", version / 10000, version / 100 % 100,
             version % 100);
    } else {
      printf("# mpengine bench comm: %d ranks, engine/comm/comm.h over Open MPI on %s, float32\n",
             context->size,
             context->device_buffers ? "GPU buffers staged through pinned host memory"
                                     : "CPU buffers");
    }
    printf("# %d timed iterations after %d warm-up; time of one call averaged over the ranks\n"
           "# size = largest buffer of the call; algbw = size / time; busbw = algbw x factor\n",
           context->iters, context->warmup);
  }
  for (int op = 0; op < kMaxOps; ++op) {
    if (!selected[op]) continue;
    if (print && !context->json) {
      printf("#\n# %s%s, busbw factor %s\n", kOpNames[op],
             nccl && op == OP_SENDRECV ? kNcclSendrecvNote : kOpNotes[op], kOpFactors[op]);
      printf("# %12s %12s %6s %11s %12s %12s %8s\n", "size", "count", "type", "time(us)",
             "algbw(GB/s)", "busbw(GB/s)", "#wrong");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
      bench_row row;
      MP_TRY(bench_one(context, (bench_op)op, bytes, &row, err));
      if (row.count == 0) continue;
      *total_wrong += row.wrong;
      if (!print) continue;
      if (context->json) {
        printf("{\"op\": \"%s\", \"backend\": \"%s\", \"buffers\": \"%s\", \"ranks\": %d, "
               "\"bytes\": %zu, \"count\": %zu, \"type\": \"float\", \"time_us\": %.3f, "
               "\"algbw_gbps\": %.4f, \"busbw_gbps\": %.4f, \"wrong\": %lld}\n",
               kOpNames[op], nccl ? "cuda" : "mpi", context->device_buffers ? "device" : "host",
               context->size, row.bytes, row.count, row.time_us, row.algbw, row.busbw,
               row.wrong);
      } else {
        printf("  %12zu %12zu %6s %11.2f %12.3f %12.3f %8lld\n", row.bytes, row.count, "float",
               row.time_us, row.algbw, row.busbw, row.wrong);
      }
      fflush(stdout);
    }
  }
  if (print && !context->json) {
    printf("#\n# #wrong in total: %lld %s\n", *total_wrong, *total_wrong == 0 ? "OK" : "FAILED");
  }
  return MP_OK;
}

/* GPU buffers need a CUDA build and a visible GPU: MP_ERR_INPUT naming what is missing. */
static mp_status require_gpu(const char *what, mp_error *err) {
  mp_gpu_report report;
  mp_error probe_err = MP_ERROR_INITIALIZER;
  if (mp_gpu_probe(&report, &probe_err) != MP_OK) {
    return mp_fail(err, MP_ERR_INPUT, "%s needs a GPU, and probing for one failed: %s", what,
                   probe_err.message);
  }
  if (!report.built_with_cuda) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s needs a GPU, and this mpengine was built without CUDA/NCCL (no "
                   "/usr/local/cuda at build time); build it where CUDA is installed, or use "
                   "--backend mpi with CPU buffers",
                   what);
  }
  if (report.num_devices == 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s needs a GPU, and none is visible on this machine (%s); run it on a GPU "
                   "machine, or use --backend mpi with CPU buffers",
                   what, report.no_device_reason);
  }
  return MP_OK;
}

int cmd_bench_comm(int argc, char **argv) {
  cli_option options[] = {
      {"backend", "mpi|cuda", "mpi: engine/comm/comm.h over Open MPI (default); cuda: NCCL on GPU "
                              "buffers (engine/comm/comm_nccl.h)", NULL},
      {"buffers", "host|device", "with mpi: CPU buffers (default) or GPU buffers staged through "
                                 "pinned host memory (ranks may share a GPU)", NULL},
      {"ops", "LIST", "comma-separated: all_reduce,reduce_scatter,all_gather,broadcast,sendrecv "
                      "(default all)", NULL},
      {"min-bytes", "B", "smallest size, e.g. 1024 or 1K (default 1K)", NULL},
      {"max-bytes", "B", "largest size, e.g. 16M (default 16M, at most 4G)", NULL},
      {"factor", "F", "multiply the size by F from one row to the next (default 4)", NULL},
      {"iters", "N", "timed calls per row (default 20)", NULL},
      {"warmup", "N", "untimed calls before them (default 5)", NULL},
      {"comm-timeout", "S", "seconds any wait may take before it is an error (default 300)",
       NULL},
      {"json", NULL, "one JSON object per row instead of the table", NULL},
      {0},
  };
  cli_command command = {
      .command = "bench comm",
      .usage = "mpirun -np N mpengine bench comm [--backend mpi|cuda] [--buffers host|device] "
               "[--ops LIST] [--min-bytes B] [--max-bytes B] [--factor F] [--iters N] "
               "[--warmup N] [--comm-timeout S] [--json]",
      .summary =
          "Time send/recv and the collectives of engine/comm/comm.h (MPI) or engine/comm/comm_nccl.h (NCCL)\n"
          "over all ranks of the job, in the style of nccl-tests: per size the time of one call\n"
          "(averaged over the ranks), the algorithm bandwidth size/time and the bus bandwidth,\n"
          "algbw times 2(n-1)/n for all_reduce, (n-1)/n for reduce_scatter and all_gather, 1 for\n"
          "broadcast and sendrecv. Each row is checked against its closed form (#wrong); any wrong\n"
          "element exits 1. The mpi backend runs under mpirun with two or more ranks:\n"
          "mpirun -np 2 mpengine bench comm; --buffers device gives it GPU buffers, staged through\n"
          "pinned host memory. --backend cuda runs NCCL on GPU buffers, one GPU per rank, on one\n"
          "rank without mpirun or on every rank of an mpirun job. Without a GPU the GPU variants\n"
          "exit 2.",
      .min_positionals = 0,
      .max_positionals = 0,
      .options = options,
  };
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;

  mp_error err = MP_ERROR_INITIALIZER;
  bool selected[kMaxOps];
  int64_t min_bytes = 0, max_bytes = 0, factor = 0, iters = 0, warmup = 0;
  double timeout_s = kDefaultTimeoutS;
  if (parse_ops(cli_value(&command, "ops"), selected, &err) != MP_OK ||
      parse_bytes("min-bytes", cli_value(&command, "min-bytes"), kDefaultMinBytes, &min_bytes,
                  &err) != MP_OK ||
      parse_bytes("max-bytes", cli_value(&command, "max-bytes"), kDefaultMaxBytes, &max_bytes,
                  &err) != MP_OK ||
      cli_int(&command, "factor", 2, kDefaultFactor, &factor, &err) != MP_OK ||
      cli_int(&command, "iters", 1, kDefaultIters, &iters, &err) != MP_OK ||
      cli_int(&command, "warmup", 0, kDefaultWarmup, &warmup, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  if (max_bytes < min_bytes) {
    mp_fail(&err, MP_ERR_INPUT, "--max-bytes (%lld) is smaller than --min-bytes (%lld)",
            (long long)max_bytes, (long long)min_bytes);
    return cli_report(&command, &err);
  }
  const char *timeout_text = cli_value(&command, "comm-timeout");
  if (timeout_text != NULL) {
    char *end = NULL;
    timeout_s = strtod(timeout_text, &end);
    if (end == timeout_text || *end != '\0' || !(timeout_s > 0) || !isfinite(timeout_s)) {
      mp_fail(&err, MP_ERR_INPUT, "--comm-timeout: expected a positive number of seconds, got '%s'",
              timeout_text);
      return cli_report(&command, &err);
    }
  }
  if (factor > 1024) {
    mp_fail(&err, MP_ERR_INPUT, "--factor: at most 1024, got %lld", (long long)factor);
    return cli_report(&command, &err);
  }
  if (iters > 1000000 || warmup > 1000000) {
    mp_fail(&err, MP_ERR_INPUT, "--iters and --warmup: at most 1000000");
    return cli_report(&command, &err);
  }
  const char *backend_text = cli_value(&command, "backend");
  const char *buffers_text = cli_value(&command, "buffers");
  bench_context context = {.iters = (int)iters, .warmup = (int)warmup,
                           .json = cli_flag(&command, "json")};
  if (backend_text == NULL || strcmp(backend_text, "mpi") == 0) {
    context.backend = BACKEND_MPI;
  } else if (strcmp(backend_text, "cuda") == 0) {
    context.backend = BACKEND_CUDA;
  } else {
    mp_fail(&err, MP_ERR_INPUT, "--backend: expected mpi or cuda, got '%s'", backend_text);
    return cli_report(&command, &err);
  }
  if (buffers_text != NULL && strcmp(buffers_text, "host") != 0 &&
      strcmp(buffers_text, "device") != 0) {
    mp_fail(&err, MP_ERR_INPUT, "--buffers: expected host or device, got '%s'", buffers_text);
    return cli_report(&command, &err);
  }
  if (context.backend == BACKEND_CUDA && buffers_text != NULL &&
      strcmp(buffers_text, "host") == 0) {
    mp_fail(&err, MP_ERR_INPUT,
            "--buffers host: NCCL (--backend cuda) works on GPU buffers only; use --backend mpi "
            "for CPU buffers");
    return cli_report(&command, &err);
  }
  context.device_buffers = context.backend == BACKEND_CUDA ||
                           (buffers_text != NULL && strcmp(buffers_text, "device") == 0);

  /* GPU variants: refuse before MPI starts, once (rank 0 prints), when there is no GPU. */
  if (context.device_buffers &&
      require_gpu(context.backend == BACKEND_CUDA ? "--backend cuda" : "--buffers device",
                  &err) != MP_OK) {
    if (!launcher_first_rank()) return CLI_EXIT_USAGE;
    return cli_report(&command, &err);
  }

  /* MPI: always for the mpi backend; for cuda inside a job (the NCCL ids travel over it). */
  const bool use_mpi = context.backend == BACKEND_MPI || launcher_inside_job();
  mp_status status = MP_OK;
  if (use_mpi) {
    if (mp_comm_world_init(&argc, &argv, timeout_s, &context.world, &err) != MP_OK) {
      mp_error_prefix(&err, "starting MPI");
      return cli_report(&command, &err);
    }
    context.rank = mp_comm_world_rank(context.world);
    context.size = mp_comm_world_size(context.world);
    if (context.backend == BACKEND_MPI && context.size < 2) {
      mp_comm_world_finalize(context.world);
      mp_fail(&err, MP_ERR_INPUT,
              "needs at least 2 ranks and this is a 1-rank job; run it under mpirun, for example: "
              "mpirun -np 2 mpengine bench comm (as root add --allow-run-as-root; with more ranks "
              "than cores add --oversubscribe)");
      return cli_report(&command, &err);
    }
    int *members = malloc((size_t)context.size * sizeof *members);
    if (members == NULL) {
      status = mp_fail(&err, MP_ERR_RUNTIME, "rank %d: out of memory", context.rank);
    } else {
      for (int i = 0; i < context.size; ++i) members[i] = i;
      status = mp_comm_group_create(context.world, members, context.size, "world",
                                    &context.comm, &err);
    }
    free(members);
  } else {
    context.rank = 0;
    context.size = 1;
  }

  /* The GPU of this rank: its index on the node modulo the visible GPUs. */
  if (status == MP_OK && context.device_buffers) {
    int device = launcher_local_rank() % mp_device_count();
    if (context.backend == BACKEND_CUDA) {
      status = mp_nccl_world_create(context.world, device, &context.nccl_world, &err);
      if (status == MP_OK && context.world == NULL) {
        mp_nccl_world_set_timeout(context.nccl_world, timeout_s);
      }
      if (status == MP_OK) {
        status = mp_nccl_comm_create(context.nccl_world, context.comm, &context.nccl, &err);
      }
    } else {
      status = mp_device_select(device, &err);
      if (status != MP_OK) mp_error_prefix(&err, "rank %d: selecting GPU %d", context.rank, device);
    }
  }

  long long total_wrong = 0;
  if (status == MP_OK) {
    status = bench_all(&context, selected, min_bytes, max_bytes, factor, &total_wrong, &err);
  }
  mp_nccl_comm_free(context.nccl);
  mp_nccl_world_free(context.nccl_world);
  mp_comm_free(context.comm);
  mp_comm_world_finalize(context.world);
  if (status != MP_OK) return cli_report(&command, &err);
  if (total_wrong > 0) {
    if (context.rank == 0) {
      fprintf(stderr, "mpengine bench comm: %lld wrong elements: the communicators are broken\n",
              total_wrong);
    }
    return CLI_EXIT_FAILURE;
  }
  return CLI_EXIT_OK;
}
