/*
 * topology/cluster.c — reading, writing and using cluster descriptions; see cluster.h.
 *
 * One parser serves files, presets (cluster_presets.c holds their JSON text) and the copy a plan
 * embeds. The struct holds SI units; to_json converts back so that every value survives
 * parse(to_json(x)) bit for bit (from_si_units below picks the JSON number that converts back to
 * exactly the stored double).
 */
#include "topology/cluster.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/json_reader.h"

/* Conversions from the JSON file's units to SI: value * multiplier / divisor, with exact
 * constants so that round numbers in a file become the doubles a person expects (3 us -> 3e-6). */
typedef struct {
  double multiplier;
  double divisor;
} unit_conversion;

static const unit_conversion kTera = {1e12, 1.0};
static const unit_conversion kGiga = {1e9, 1.0};
static const unit_conversion kMicro = {1.0, 1e6};
static const unit_conversion kGibi = {1073741824.0, 1.0};

/* Upper bounds that keep the integer fields and byte counts in range. */
enum { MAX_NODES = 1 << 20, MAX_DEVICES_PER_NODE = 1 << 20, MAX_CORES_PER_NODE = 1 << 20 };
static const double kMaxDeviceMemoryGib = 1048576.0; /* 1 PiB per device */

static const char *const kDtypeNames[MP_DTYPE_COUNT] = {"fp32", "tf32", "bf16", "fp16", "fp8"};

static const char *const kClusterKeys[] = {
    "name", "notes", "device", "nodes", "devices_per_node", "device_memory_gib",
    "memory_bandwidth_gbytes_per_s", "memory_efficiency", "peak_tflops", "intra_node",
    "inter_node", "gemm_efficiency", "flash_attention_efficiency", "vector_tflops", "scalar_tflops",
    "cores_per_node", "blas_thread_efficiency", "wide_gemm_efficiency",
    "workspace_gib", "node_memory_gib", NULL};
static const char *const kPeakKeys[] = {"fp32", "tf32", "bf16", "fp16", "fp8", NULL};
static const char *const kLinkKeys[] = {"bandwidth_gbytes_per_s", "latency_us", "efficiency",
                                        "collective_latency_us", NULL};
static const char *const kPointKeys[] = {"gemm_flops", "efficiency", NULL};

static double to_si_units(double value, unit_conversion unit) {
  return value * unit.multiplier / unit.divisor;
}

/* Converts a value read from key to SI units into *out, refusing one whose conversion overflows
 * to infinity (1e300 TFLOP/s): an infinite rate would make costs NaN, and JSON cannot write it
 * back (cJSON prints null), breaking parse(to_json(x)) == x. Found by
 * tests/fuzz/cluster_json_fuzz.c. */
static mp_status to_si_checked(const mp_json_reader *reader, const char *path, const char *key,
                               double value, unit_conversion unit, double *out) {
  double si = to_si_units(value, unit);
  if (!isfinite(si)) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: %.17g is too large", reader->source,
                   path, key, value);
  }
  *out = si;
  return MP_OK;
}

/* The value in the file's unit that to_si_units turns back into exactly si. */
static double from_si_units(double si, unit_conversion unit) {
  double value = si * unit.divisor / unit.multiplier;
  for (int step = 0; step < 8; ++step) {
    double back = to_si_units(value, unit);
    if (back == si) break;
    value = nextafter(value, back < si ? INFINITY : -INFINITY);
  }
  return value;
}

const char *mp_dtype_name(mp_dtype dtype) {
  if ((int)dtype < 0 || dtype >= MP_DTYPE_COUNT) return "?";
  return kDtypeNames[dtype];
}

bool mp_dtype_from_name(const char *name, mp_dtype *out) {
  for (int i = 0; i < MP_DTYPE_COUNT; ++i) {
    if (name != NULL && strcmp(name, kDtypeNames[i]) == 0) {
      *out = (mp_dtype)i;
      return true;
    }
  }
  return false;
}

mp_dtype mp_cluster_training_dtype(const mp_cluster *cluster) {
  return cluster->peak_flops_per_s[MP_DTYPE_BF16] > 0 ? MP_DTYPE_BF16 : MP_DTYPE_FP32;
}

/* ---- parsing ------------------------------------------------------------------------------ */

static mp_status missing_key(const mp_json_reader *reader, const char *path, const char *key,
                             const char *what) {
  return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s: missing required key \"%s\" (%s)",
                 reader->source, path, key, what);
}

/* Copies an optional string into a fixed buffer; "" when absent. */
static mp_status read_string(const mp_json_reader *reader, const cJSON *object, const char *path,
                             const char *key, bool required, char *out, size_t out_bytes) {
  const char *value = "";
  if (required) {
    MP_TRY(mp_json_require_string(reader, object, path, key, &value));
  } else {
    MP_TRY(mp_json_optional_string(reader, object, path, key, "", &value));
  }
  size_t length = strlen(value);
  if (length >= out_bytes) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.%s: is %zu characters long; at most %zu are allowed", reader->source,
                   path, key, length, out_bytes - 1);
  }
  memcpy(out, value, length + 1);
  return MP_OK;
}

static mp_status read_int(const mp_json_reader *reader, const cJSON *object, const char *path,
                          const char *key, bool required, int max_value, int *out) {
  int64_t value = 0;
  if (required) {
    MP_TRY(mp_json_require_int(reader, object, path, key, MP_JSON_POSITIVE, &value));
  } else {
    MP_TRY(mp_json_optional_int(reader, object, path, key, MP_JSON_POSITIVE, 0, &value));
  }
  if (value > max_value) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.%s: must be at most %d, got %lld",
                   reader->source, path, key, max_value, (long long)value);
  }
  *out = (int)value;
  return MP_OK;
}

/* Finds a required object under key and names its path in object_path. */
static mp_status require_object(const mp_json_reader *reader, const cJSON *object,
                                const char *path, const char *key, const char *what,
                                const cJSON **out, char *object_path, size_t object_path_bytes) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(object, key);
  if (item == NULL) return missing_key(reader, path, key, what);
  mp_json_path_key(object_path, object_path_bytes, path, key);
  MP_TRY(mp_json_expect_object(reader, item, object_path, what));
  *out = item;
  return MP_OK;
}

static mp_status read_peaks(const mp_json_reader *reader, const cJSON *root, const char *path,
                            mp_cluster *cluster) {
  const cJSON *peaks = NULL;
  char peaks_path[MP_JSON_PATH_BYTES];
  MP_TRY(require_object(reader, root, path, "peak_tflops",
                        "an object of dense peak TFLOP/s per dtype", &peaks, peaks_path,
                        sizeof peaks_path));
  MP_TRY(mp_json_check_keys(reader, peaks, peaks_path, kPeakKeys));
  for (int dtype = 0; dtype < MP_DTYPE_COUNT; ++dtype) {
    double tflops = 0;
    MP_TRY(mp_json_optional_number(reader, peaks, peaks_path, kDtypeNames[dtype],
                                   MP_JSON_POSITIVE, 0, &tflops));
    MP_TRY(to_si_checked(reader, peaks_path, kDtypeNames[dtype], tflops, kTera,
                         &cluster->peak_flops_per_s[dtype]));
  }
  if (cluster->peak_flops_per_s[MP_DTYPE_BF16] <= 0 &&
      cluster->peak_flops_per_s[MP_DTYPE_FP32] <= 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: needs \"bf16\" or \"fp32\" (dense TFLOP/s per device); training "
                   "computes in one of them",
                   reader->source, peaks_path);
  }
  return MP_OK;
}

/* An optional fraction in (0, 1] under key; default_value when absent. */
static mp_status read_fraction(const mp_json_reader *reader, const cJSON *object,
                               const char *path, const char *key, double default_value,
                               double *out) {
  MP_TRY(mp_json_optional_number(reader, object, path, key, MP_JSON_ANY, default_value, out));
  if (!(*out > 0 && *out <= 1)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.%s: must be in (0, 1] (a fraction of the figure above), got %.17g",
                   reader->source, path, key, *out);
  }
  return MP_OK;
}

static mp_status read_link(const mp_json_reader *reader, const cJSON *root, const char *path,
                           const char *key, double *bandwidth_bytes_per_s, double *latency_s,
                           double *efficiency, double *collective_latency_s) {
  const cJSON *link = NULL;
  char link_path[MP_JSON_PATH_BYTES];
  MP_TRY(require_object(reader, root, path, key,
                        "an object with bandwidth_gbytes_per_s and latency_us", &link, link_path,
                        sizeof link_path));
  MP_TRY(mp_json_check_keys(reader, link, link_path, kLinkKeys));
  double gbytes_per_s = 0, latency_us = 0;
  MP_TRY(mp_json_require_number(reader, link, link_path, "bandwidth_gbytes_per_s",
                                MP_JSON_POSITIVE, &gbytes_per_s));
  MP_TRY(mp_json_require_number(reader, link, link_path, "latency_us", MP_JSON_NONNEGATIVE,
                                &latency_us));
  MP_TRY(to_si_checked(reader, link_path, "bandwidth_gbytes_per_s", gbytes_per_s, kGiga,
                       bandwidth_bytes_per_s));
  MP_TRY(to_si_checked(reader, link_path, "latency_us", latency_us, kMicro, latency_s));
  MP_TRY(read_fraction(reader, link, link_path, "efficiency", 1.0, efficiency));
  double collective_us = 0.0;
  MP_TRY(mp_json_optional_number(reader, link, link_path, "collective_latency_us",
                                 MP_JSON_NONNEGATIVE, 0.0, &collective_us));
  MP_TRY(to_si_checked(reader, link_path, "collective_latency_us", collective_us, kMicro,
                       collective_latency_s));
  return MP_OK;
}

static mp_status read_gemm_efficiency(const mp_json_reader *reader, const cJSON *root,
                                      const char *path, mp_cluster *cluster) {
  const cJSON *points = NULL;
  MP_TRY(mp_json_require_array(reader, root, path, "gemm_efficiency", 1, &points));
  char points_path[MP_JSON_PATH_BYTES];
  mp_json_path_key(points_path, sizeof points_path, path, "gemm_efficiency");
  int count = cJSON_GetArraySize(points);
  if (count > MP_CLUSTER_MAX_EFFICIENCY_POINTS) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s: has %d points; at most %d are allowed (drop some)", reader->source,
                   points_path, count, MP_CLUSTER_MAX_EFFICIENCY_POINTS);
  }
  int index = 0;
  for (const cJSON *point = points->child; point != NULL; point = point->next, ++index) {
    char point_path[MP_JSON_PATH_BYTES];
    mp_json_path_index(point_path, sizeof point_path, points_path, index);
    MP_TRY(mp_json_expect_object(reader, point, point_path,
                                 "a point {\"gemm_flops\": F, \"efficiency\": E}"));
    MP_TRY(mp_json_check_keys(reader, point, point_path, kPointKeys));
    double gemm_flops = 0, efficiency = 0;
    MP_TRY(mp_json_require_number(reader, point, point_path, "gemm_flops", MP_JSON_POSITIVE,
                                  &gemm_flops));
    MP_TRY(mp_json_require_number(reader, point, point_path, "efficiency", MP_JSON_ANY,
                                  &efficiency));
    if (!(efficiency > 0 && efficiency <= 1)) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: %s.efficiency: must be in (0, 1] (a fraction of peak), got %.17g",
                     reader->source, point_path, efficiency);
    }
    if (index > 0 && !(gemm_flops > cluster->gemm_efficiency[index - 1].gemm_flops)) {
      return mp_fail(reader->err, MP_ERR_INPUT,
                     "%s: %s.gemm_flops: %.17g is not above the previous point's %.17g; list the "
                     "points in strictly ascending gemm_flops",
                     reader->source, point_path, gemm_flops,
                     cluster->gemm_efficiency[index - 1].gemm_flops);
    }
    cluster->gemm_efficiency[index].gemm_flops = gemm_flops;
    cluster->gemm_efficiency[index].efficiency = efficiency;
  }
  cluster->gemm_efficiency_points = count;
  cluster->gemm_efficiency_given = true;
  return MP_OK;
}

/* The assumed curve of cluster.h: a fixed overhead plus 75% of peak, sampled four times per
 * decade from 1e6 to 1e13 FLOPs (29 points), so that interpolating between samples stays within
 * 5% of the formula's time. */
static void fill_default_gemm_efficiency(mp_cluster *cluster) {
  double peak_flops_per_s = cluster->peak_flops_per_s[mp_cluster_training_dtype(cluster)];
  /* Solving f / (peak * efficiency) = overhead_s + f / (max_efficiency * peak) for efficiency. */
  double overhead_flops = MP_CLUSTER_DEFAULT_GEMM_MAX_EFFICIENCY * peak_flops_per_s *
                          MP_CLUSTER_DEFAULT_GEMM_OVERHEAD_S;
  int count = 0;
  for (int quarter_decade = 0; quarter_decade <= 28; ++quarter_decade) {
    double gemm_flops = pow(10.0, 6.0 + quarter_decade / 4.0);
    cluster->gemm_efficiency[count].gemm_flops = gemm_flops;
    cluster->gemm_efficiency[count].efficiency =
        MP_CLUSTER_DEFAULT_GEMM_MAX_EFFICIENCY * gemm_flops / (gemm_flops + overhead_flops);
    ++count;
  }
  cluster->gemm_efficiency_points = count;
  cluster->gemm_efficiency_given = false;
}

/* The optional "node_memory_gib" (cluster.h: shared memory). */
static mp_status read_node_memory(const mp_json_reader *reader, const cJSON *object,
                                  const char *path, mp_cluster *cluster) {
  double gib = 0;
  MP_TRY(mp_json_optional_number(reader, object, path, "node_memory_gib", MP_JSON_POSITIVE, 0,
                                 &gib));
  if (gib <= 0) return MP_OK;
  if (gib > kMaxDeviceMemoryGib * MAX_DEVICES_PER_NODE) {
    return mp_fail(reader->err, MP_ERR_INPUT, "%s: %s.node_memory_gib: must be at most %.17g, got "
                   "%.17g", reader->source, path, kMaxDeviceMemoryGib * MAX_DEVICES_PER_NODE, gib);
  }
  const double bytes = llround(to_si_units(gib, kGibi));
  if (bytes <= 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.node_memory_gib: %.17g GiB is less than one byte", reader->source, path,
                   gib);
  }
  cluster->node_memory_bytes = (int64_t)bytes;
  return MP_OK;
}

/* The optional "cores_per_node", "workspace_gib" and "node_memory_gib" (cluster.h: shared cores,
 * workspace, shared memory). */
static mp_status read_shared_cores(const mp_json_reader *reader, const cJSON *object,
                                   const char *path, mp_cluster *cluster) {
  MP_TRY(read_node_memory(reader, object, path, cluster));
  MP_TRY(read_int(reader, object, path, "cores_per_node", false, MAX_CORES_PER_NODE,
                  &cluster->cores_per_node));
  MP_TRY(mp_json_optional_number(reader, object, path, "blas_thread_efficiency",
                                 MP_JSON_POSITIVE, 0, &cluster->blas_thread_efficiency));
  if (cluster->blas_thread_efficiency > 1.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.blas_thread_efficiency: %.17g; threads cannot run faster than each "
                   "alone (at most 1)",
                   reader->source, path, cluster->blas_thread_efficiency);
  }
  MP_TRY(mp_json_optional_number(reader, object, path, "wide_gemm_efficiency", MP_JSON_POSITIVE,
                                 0, &cluster->wide_gemm_efficiency));
  if (cluster->wide_gemm_efficiency > 1.0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.wide_gemm_efficiency: %.17g; a fraction of the curve's rate (at most "
                   "1)",
                   reader->source, path, cluster->wide_gemm_efficiency);
  }
  double workspace_gib = 0;
  MP_TRY(mp_json_optional_number(reader, object, path, "workspace_gib", MP_JSON_POSITIVE, 0,
                                 &workspace_gib));
  if (workspace_gib <= 0) return MP_OK;
  /* Compared in bytes, as stored, so that a written description reads back. */
  const double bytes = llround(to_si_units(fmin(workspace_gib, kMaxDeviceMemoryGib), kGibi));
  if (!(bytes < (double)cluster->device_memory_bytes)) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.workspace_gib: %.17g GiB leaves nothing of the device's %.17g GiB "
                   "(device_memory_gib); it must be less",
                   reader->source, path, workspace_gib,
                   from_si_units((double)cluster->device_memory_bytes, kGibi));
  }
  if (bytes <= 0) {
    return mp_fail(reader->err, MP_ERR_INPUT,
                   "%s: %s.workspace_gib: %.17g GiB is less than one byte", reader->source, path,
                   workspace_gib);
  }
  cluster->workspace_bytes = (int64_t)bytes;
  return MP_OK;
}

mp_status mp_cluster_from_json(const cJSON *object, const char *source, const char *path,
                               mp_cluster *out, mp_error *err) {
  mp_json_reader reader = {source, err};
  mp_cluster cluster;
  memset(&cluster, 0, sizeof cluster);
  MP_TRY(mp_json_expect_object(&reader, object, path, "a cluster description"));
  MP_TRY(mp_json_check_keys(&reader, object, path, kClusterKeys));
  MP_TRY(read_string(&reader, object, path, "name", true, cluster.name, sizeof cluster.name));
  MP_TRY(read_string(&reader, object, path, "notes", false, cluster.notes, sizeof cluster.notes));
  MP_TRY(read_string(&reader, object, path, "device", false, cluster.device,
                     sizeof cluster.device));
  MP_TRY(read_int(&reader, object, path, "nodes", false, MAX_NODES, &cluster.nodes));
  MP_TRY(read_int(&reader, object, path, "devices_per_node", true, MAX_DEVICES_PER_NODE,
                  &cluster.devices_per_node));

  double memory_gib = 0;
  MP_TRY(mp_json_require_number(&reader, object, path, "device_memory_gib", MP_JSON_POSITIVE,
                                &memory_gib));
  if (memory_gib > kMaxDeviceMemoryGib) {
    return mp_fail(err, MP_ERR_INPUT, "%s: %s.device_memory_gib: must be at most %.17g, got %.17g",
                   source, path, kMaxDeviceMemoryGib, memory_gib);
  }
  cluster.device_memory_bytes = (int64_t)llround(to_si_units(memory_gib, kGibi));
  if (cluster.device_memory_bytes <= 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: %s.device_memory_gib: %.17g GiB is less than one byte", source, path,
                   memory_gib);
  }

  double memory_gbytes_per_s = 0;
  MP_TRY(mp_json_require_number(&reader, object, path, "memory_bandwidth_gbytes_per_s",
                                MP_JSON_POSITIVE, &memory_gbytes_per_s));
  MP_TRY(to_si_checked(&reader, path, "memory_bandwidth_gbytes_per_s", memory_gbytes_per_s, kGiga,
                       &cluster.memory_bandwidth_bytes_per_s));

  MP_TRY(read_peaks(&reader, object, path, &cluster));
  MP_TRY(read_fraction(&reader, object, path, "memory_efficiency", 1.0,
                       &cluster.memory_efficiency));
  MP_TRY(read_link(&reader, object, path, "intra_node", &cluster.intra_node_bandwidth_bytes_per_s,
                   &cluster.intra_node_latency_s, &cluster.intra_node_efficiency,
                   &cluster.intra_node_collective_latency_s));
  MP_TRY(read_link(&reader, object, path, "inter_node", &cluster.inter_node_bandwidth_bytes_per_s,
                   &cluster.inter_node_latency_s, &cluster.inter_node_efficiency,
                   &cluster.inter_node_collective_latency_s));
  MP_TRY(read_fraction(&reader, object, path, "flash_attention_efficiency",
                       MP_CLUSTER_DEFAULT_FLASH_ATTENTION_EFFICIENCY,
                       &cluster.flash_attention_efficiency));
  double vector_tflops = 0.0;
  MP_TRY(mp_json_optional_number(&reader, object, path, "vector_tflops", MP_JSON_POSITIVE, 0.0,
                                 &vector_tflops));
  MP_TRY(to_si_checked(&reader, path, "vector_tflops", vector_tflops, kTera,
                       &cluster.vector_flops_per_s));
  double scalar_tflops = 0.0;
  MP_TRY(mp_json_optional_number(&reader, object, path, "scalar_tflops", MP_JSON_POSITIVE, 0.0,
                                 &scalar_tflops));
  MP_TRY(to_si_checked(&reader, path, "scalar_tflops", scalar_tflops, kTera,
                       &cluster.scalar_flops_per_s));
  cluster.flash_attention_efficiency_given =
      cJSON_GetObjectItemCaseSensitive(object, "flash_attention_efficiency") != NULL;
  if (cJSON_GetObjectItemCaseSensitive(object, "gemm_efficiency") != NULL) {
    MP_TRY(read_gemm_efficiency(&reader, object, path, &cluster));
  } else {
    fill_default_gemm_efficiency(&cluster);
  }
  MP_TRY(read_shared_cores(&reader, object, path, &cluster));
  *out = cluster;
  return MP_OK;
}

mp_status mp_cluster_parse_text(const char *text, const char *source, mp_cluster *out,
                                mp_error *err) {
  cJSON *root = NULL;
  MP_TRY(mp_json_parse_text(text, source, &root, err));
  mp_status status = mp_cluster_from_json(root, source, "$", out, err);
  cJSON_Delete(root);
  return status;
}

/* ---- presets and --cluster ---------------------------------------------------------------- */

/* The preset a mistyped name probably meant: the closest by edit distance (ignoring case), else
 * one that contains it ("h100" -> "h100-sxm"); NULL when none fits. */
static const char *suggest_preset(const char *word) {
  char lower[MP_CLUSTER_NAME_BYTES];
  size_t length = 0;
  for (; word[length] != '\0' && length + 1 < sizeof lower; ++length) {
    lower[length] = (char)tolower((unsigned char)word[length]);
  }
  lower[length] = '\0';
  const char *const *names = mp_cluster_preset_names();
  const char *closest = mp_closest_word(lower, names);
  if (closest != NULL) return closest;
  if (length < 3) return NULL;
  for (int i = 0; names[i] != NULL; ++i) {
    if (strstr(names[i], lower) != NULL) return names[i];
  }
  return NULL;
}

/* "a100-80g, h100-sxm, h200-sxm, cpu-local" */
static void list_presets(char *out, size_t out_bytes) {
  const char *const *names = mp_cluster_preset_names();
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; names[i] != NULL && used < out_bytes; ++i) {
    used += (size_t)snprintf(out + used, out_bytes - used, "%s%s", i ? ", " : "", names[i]);
  }
}

mp_status mp_cluster_preset(const char *name, mp_cluster *out, mp_error *err) {
  const char *text = mp_cluster_preset_json(name);
  if (text == NULL) {
    if (name == NULL) name = "";
    char presets[256];
    list_presets(presets, sizeof presets);
    const char *suggestion = suggest_preset(name);
    if (suggestion != NULL) {
      return mp_fail(err, MP_ERR_INPUT,
                     "unknown cluster preset '%s'; did you mean '%s'? Presets: %s", name,
                     suggestion, presets);
    }
    return mp_fail(err, MP_ERR_INPUT, "unknown cluster preset '%s'. Presets: %s", name, presets);
  }
  char source[MP_CLUSTER_NAME_BYTES + 16];
  snprintf(source, sizeof source, "preset %s", name);
  MP_TRY(mp_cluster_parse_text(text, source, out, err));
  out->placeholder = strcmp(name, "cpu-local") == 0;
  return MP_OK;
}

mp_status mp_cluster_machine_memory(int64_t *bytes, mp_error *err) {
  *bytes = 0;
  const char *given = getenv("MPENGINE_CPU_LOCAL_MEMORY_GIB");
  if (given != NULL) {
    char *end = NULL;
    const double gib = strtod(given, &end);
    if (end == given || *end != '\0' || !(gib > 0) || gib > kMaxDeviceMemoryGib) {
      return mp_fail(err, MP_ERR_INPUT,
                     "MPENGINE_CPU_LOCAL_MEMORY_GIB: expected this machine's memory as a positive "
                     "number of GiB (at most %.0f), got '%s'; unset it to read the machine's",
                     kMaxDeviceMemoryGib, given);
    }
    *bytes = llround(to_si_units(gib, kGibi));
    return MP_OK;
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_bytes = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page_bytes > 0) *bytes = (int64_t)pages * (int64_t)page_bytes;
  return MP_OK;
}

mp_status mp_cluster_cpu_local_placeholder(int64_t machine_memory_bytes, mp_cluster *out,
                                           mp_error *err) {
  MP_TRY(mp_cluster_preset("cpu-local", out, err));
  if (machine_memory_bytes <= 0) return MP_OK;
  /* The machine's memory, shared by the ranks on it; a byte count a description writes back. */
  const double gib = from_si_units((double)machine_memory_bytes, kGibi);
  out->device_memory_bytes = out->node_memory_bytes = machine_memory_bytes;
  const int64_t workspace = llround(to_si_units(MP_CLUSTER_CPU_RANK_WORKSPACE_GIB, kGibi));
  out->workspace_bytes = workspace < machine_memory_bytes ? workspace : 0;
  snprintf(out->notes, sizeof out->notes,
           "Uncalibrated placeholder derived from this machine: its memory (%.1f GiB) is shared "
           "by the ranks on it; the speeds are not measured but placeholders for one rank on one "
           "core of a typical x86-64 server: fp32 GEMM through OpenBLAS at about 50 GFLOP/s (AVX2 "
           "FMA), about 10 GB/s of DRAM bandwidth, elementwise arithmetic at about 30 GFLOP/s "
           "vectorised and 6 GFLOP/s in the attention softmax's scalar loop, MPI shared-memory "
           "messages at about 5 GB/s with 2 us latency. Ranks are CPU processes on this machine, "
           "any number of them (up to 4096). Run `mpengine calibrate` to measure this machine.",
           gib);
  return MP_OK;
}

static bool looks_like_path(const char *argument) {
  size_t length = strlen(argument);
  if (strchr(argument, '/') != NULL) return true;
  if (length >= 5 && strcmp(argument + length - 5, ".json") == 0) return true;
  struct stat info;
  return stat(argument, &info) == 0;
}

bool mp_cluster_calibration_path(char *out, size_t out_bytes) {
  const char *explicit_path = getenv("MPENGINE_CALIBRATION");
  if (explicit_path != NULL) {
    if (explicit_path[0] == '\0') return false;
    snprintf(out, out_bytes, "%s", explicit_path);
    return true;
  }
  const char *cache = getenv("XDG_CACHE_HOME");
  if (cache != NULL && cache[0] != '\0') {
    snprintf(out, out_bytes, "%s/mpengine/cpu-local.json", cache);
    return true;
  }
  const char *home = getenv("HOME");
  if (home == NULL || home[0] == '\0') return false;
  snprintf(out, out_bytes, "%s/.cache/mpengine/cpu-local.json", home);
  return true;
}

mp_status mp_cluster_load(const char *name_or_path, mp_cluster *out, mp_error *err) {
  if (name_or_path == NULL) name_or_path = "";
  /* cpu-local is this machine: its measured figures when `mpengine calibrate` kept them. */
  char calibration[4096];
  struct stat calibrated;
  if (strcmp(name_or_path, "cpu-local") == 0 &&
      mp_cluster_calibration_path(calibration, sizeof calibration) &&
      stat(calibration, &calibrated) == 0) {
    name_or_path = calibration;
  } else if (strcmp(name_or_path, "cpu-local") == 0) {
    /* Uncalibrated: the preset's speeds, this machine's memory. */
    int64_t machine_memory = 0;
    MP_TRY(mp_cluster_machine_memory(&machine_memory, err));
    return mp_cluster_cpu_local_placeholder(machine_memory, out, err);
  } else if (mp_cluster_preset_json(name_or_path) != NULL) {
    return mp_cluster_preset(name_or_path, out, err);
  }
  if (name_or_path[0] != '\0' && looks_like_path(name_or_path)) {
    cJSON *root = NULL;
    MP_TRY(mp_json_load_file(name_or_path, &root, err));
    mp_status status = mp_cluster_from_json(root, name_or_path, "$", out, err);
    cJSON_Delete(root);
    return status;
  }
  char presets[256];
  list_presets(presets, sizeof presets);
  const char *suggestion = suggest_preset(name_or_path);
  if (suggestion != NULL) {
    return mp_fail(err, MP_ERR_INPUT,
                   "unknown cluster '%s'; did you mean '%s'? Presets: %s; or give a JSON file "
                   "path",
                   name_or_path, suggestion, presets);
  }
  return mp_fail(err, MP_ERR_INPUT,
                 "unknown cluster '%s': no preset and no file has that name. Presets: %s; or "
                 "give a JSON file path",
                 name_or_path, presets);
}

/* ---- writing ------------------------------------------------------------------------------ */

static bool add_number(cJSON *object, const char *key, double value) {
  return cJSON_AddNumberToObject(object, key, value) != NULL;
}

static cJSON *link_to_json(double bandwidth_bytes_per_s, double latency_s, double efficiency,
                           double collective_latency_s) {
  cJSON *link = cJSON_CreateObject();
  if (link == NULL) return NULL;
  if (!add_number(link, "bandwidth_gbytes_per_s", from_si_units(bandwidth_bytes_per_s, kGiga)) ||
      !add_number(link, "latency_us", from_si_units(latency_s, kMicro)) ||
      (efficiency != 1.0 && !add_number(link, "efficiency", efficiency)) ||
      (collective_latency_s > 0 &&
       !add_number(link, "collective_latency_us", from_si_units(collective_latency_s, kMicro)))) {
    cJSON_Delete(link);
    return NULL;
  }
  return link;
}

/* Builds the JSON object; NULL when out of memory. */
static cJSON *build_json(const mp_cluster *cluster) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return NULL;
  bool ok = cJSON_AddStringToObject(root, "name", cluster->name) != NULL;
  if (ok && cluster->notes[0] != '\0') {
    ok = cJSON_AddStringToObject(root, "notes", cluster->notes) != NULL;
  }
  if (ok && cluster->device[0] != '\0') {
    ok = cJSON_AddStringToObject(root, "device", cluster->device) != NULL;
  }
  if (ok && cluster->nodes > 0) ok = add_number(root, "nodes", cluster->nodes);
  ok = ok && add_number(root, "devices_per_node", cluster->devices_per_node);
  ok = ok && add_number(root, "device_memory_gib",
                        from_si_units((double)cluster->device_memory_bytes, kGibi));
  ok = ok && add_number(root, "memory_bandwidth_gbytes_per_s",
                        from_si_units(cluster->memory_bandwidth_bytes_per_s, kGiga));
  if (ok && cluster->memory_efficiency != 1.0) {
    ok = add_number(root, "memory_efficiency", cluster->memory_efficiency);
  }
  cJSON *peaks = ok ? cJSON_AddObjectToObject(root, "peak_tflops") : NULL;
  ok = peaks != NULL;
  for (int dtype = 0; ok && dtype < MP_DTYPE_COUNT; ++dtype) {
    if (cluster->peak_flops_per_s[dtype] > 0) {
      ok = add_number(peaks, kDtypeNames[dtype],
                      from_si_units(cluster->peak_flops_per_s[dtype], kTera));
    }
  }
  cJSON *intra = ok ? link_to_json(cluster->intra_node_bandwidth_bytes_per_s,
                                   cluster->intra_node_latency_s, cluster->intra_node_efficiency,
                                   cluster->intra_node_collective_latency_s)
                    : NULL;
  ok = intra != NULL && cJSON_AddItemToObject(root, "intra_node", intra);
  cJSON *inter = ok ? link_to_json(cluster->inter_node_bandwidth_bytes_per_s,
                                   cluster->inter_node_latency_s, cluster->inter_node_efficiency,
                                   cluster->inter_node_collective_latency_s)
                    : NULL;
  ok = inter != NULL && cJSON_AddItemToObject(root, "inter_node", inter);
  if (ok && cluster->gemm_efficiency_given) {
    cJSON *points = cJSON_AddArrayToObject(root, "gemm_efficiency");
    ok = points != NULL;
    for (int i = 0; ok && i < cluster->gemm_efficiency_points; ++i) {
      cJSON *point = cJSON_CreateObject();
      ok = point != NULL && cJSON_AddItemToArray(points, point) &&
           add_number(point, "gemm_flops", cluster->gemm_efficiency[i].gemm_flops) &&
           add_number(point, "efficiency", cluster->gemm_efficiency[i].efficiency);
    }
  }
  if (ok && cluster->vector_flops_per_s > 0) {
    ok = add_number(root, "vector_tflops", from_si_units(cluster->vector_flops_per_s, kTera));
  }
  if (ok && cluster->scalar_flops_per_s > 0) {
    ok = add_number(root, "scalar_tflops", from_si_units(cluster->scalar_flops_per_s, kTera));
  }
  if (ok && cluster->flash_attention_efficiency_given) {
    ok = add_number(root, "flash_attention_efficiency", cluster->flash_attention_efficiency);
  }
  if (!ok) {
    cJSON_Delete(root);
    return NULL;
  }
  return root;
}

/* Adds the optional keys of shared cores and workspace that the cluster gives; false when out
 * of memory. */
static bool add_shared_cores_json(cJSON *root, const mp_cluster *cluster) {
  bool ok = true;
  if (cluster->cores_per_node > 0) ok = add_number(root, "cores_per_node", cluster->cores_per_node);
  if (ok && cluster->blas_thread_efficiency > 0) {
    ok = add_number(root, "blas_thread_efficiency", cluster->blas_thread_efficiency);
  }
  if (ok && cluster->wide_gemm_efficiency > 0) {
    ok = add_number(root, "wide_gemm_efficiency", cluster->wide_gemm_efficiency);
  }
  if (ok && cluster->workspace_bytes > 0) {
    ok = add_number(root, "workspace_gib", from_si_units((double)cluster->workspace_bytes, kGibi));
  }
  if (ok && cluster->node_memory_bytes > 0) {
    ok = add_number(root, "node_memory_gib",
                    from_si_units((double)cluster->node_memory_bytes, kGibi));
  }
  return ok;
}

mp_status mp_cluster_to_json(const mp_cluster *cluster, cJSON **out, mp_error *err) {
  *out = build_json(cluster);
  if (*out != NULL && !add_shared_cores_json(*out, cluster)) {
    cJSON_Delete(*out);
    *out = NULL;
  }
  if (*out == NULL) {
    return mp_fail(err, MP_ERR_RUNTIME, "cluster '%s': out of memory writing it as JSON",
                   cluster->name);
  }
  return MP_OK;
}

/* ---- costs -------------------------------------------------------------------------------- */

double mp_cluster_gemm_efficiency(const mp_cluster *cluster, double gemm_flops) {
  int count = cluster->gemm_efficiency_points;
  if (count <= 0) return 1.0;
  const mp_gemm_efficiency_point *points = cluster->gemm_efficiency;
  if (!(gemm_flops > points[0].gemm_flops)) return points[0].efficiency;
  if (gemm_flops >= points[count - 1].gemm_flops) return points[count - 1].efficiency;
  int i = 0;
  while (gemm_flops >= points[i + 1].gemm_flops) ++i;
  double fraction = (log(gemm_flops) - log(points[i].gemm_flops)) /
                    (log(points[i + 1].gemm_flops) - log(points[i].gemm_flops));
  return points[i].efficiency + fraction * (points[i + 1].efficiency - points[i].efficiency);
}

bool mp_cluster_wide_gemm(double k, double n) {
  return k > 0 && n >= MP_CLUSTER_WIDE_GEMM_RATIO * k;
}

double mp_cluster_wide_gemm_efficiency(const mp_cluster *cluster) {
  return cluster->wide_gemm_efficiency > 0 ? cluster->wide_gemm_efficiency : 1.0;
}

double mp_cluster_gemm_seconds(const mp_cluster *cluster, mp_dtype dtype, double gemm_flops) {
  if (!(gemm_flops > 0)) return 0.0;
  if ((int)dtype < 0 || dtype >= MP_DTYPE_COUNT) return INFINITY;
  double peak_flops_per_s = cluster->peak_flops_per_s[dtype];
  if (!(peak_flops_per_s > 0)) return INFINITY;
  return gemm_flops / (peak_flops_per_s * mp_cluster_gemm_efficiency(cluster, gemm_flops));
}

/* A hand-built struct leaves the efficiencies 0: the figure as given. */
static double effective(double figure, double efficiency) {
  return efficiency > 0 ? figure * efficiency : figure;
}

double mp_cluster_memory_bandwidth(const mp_cluster *cluster) {
  return effective(cluster->memory_bandwidth_bytes_per_s, cluster->memory_efficiency);
}

double mp_cluster_vector_flops_per_s(const mp_cluster *cluster) {
  if (cluster->vector_flops_per_s > 0) return cluster->vector_flops_per_s;
  if (cluster->peak_flops_per_s[MP_DTYPE_FP32] > 0) return cluster->peak_flops_per_s[MP_DTYPE_FP32];
  return cluster->peak_flops_per_s[mp_cluster_training_dtype(cluster)];
}

double mp_cluster_scalar_flops_per_s(const mp_cluster *cluster) {
  return cluster->scalar_flops_per_s > 0 ? cluster->scalar_flops_per_s
                                         : mp_cluster_vector_flops_per_s(cluster);
}

double mp_cluster_flash_attention_flops_per_s(const mp_cluster *cluster) {
  return effective(cluster->peak_flops_per_s[mp_cluster_training_dtype(cluster)],
                   cluster->flash_attention_efficiency);
}

double mp_cluster_link_bandwidth(const mp_cluster *cluster, bool same_node) {
  return same_node ? effective(cluster->intra_node_bandwidth_bytes_per_s,
                               cluster->intra_node_efficiency)
                   : effective(cluster->inter_node_bandwidth_bytes_per_s,
                               cluster->inter_node_efficiency);
}

double mp_cluster_collective_latency(const mp_cluster *cluster, bool same_node) {
  const double collective = same_node ? cluster->intra_node_collective_latency_s
                                      : cluster->inter_node_collective_latency_s;
  if (collective > 0) return collective;
  return same_node ? cluster->intra_node_latency_s : cluster->inter_node_latency_s;
}

double mp_cluster_p2p_seconds(const mp_cluster *cluster, bool same_node, double bytes) {
  if (!(bytes > 0)) return 0.0;
  double bandwidth_bytes_per_s = same_node ? cluster->intra_node_bandwidth_bytes_per_s
                                           : cluster->inter_node_bandwidth_bytes_per_s;
  double latency_s = same_node ? cluster->intra_node_latency_s : cluster->inter_node_latency_s;
  if (!(bandwidth_bytes_per_s > 0)) return INFINITY;
  return latency_s + bytes / bandwidth_bytes_per_s;
}

/* ---- devices and nodes -------------------------------------------------------------------- */

int mp_cluster_total_devices(const mp_cluster *cluster, int requested) {
  if (cluster->devices_per_node <= 0) return -1;
  if (cluster->nodes <= 0) return requested > 0 ? requested : -1;
  int64_t capacity = (int64_t)cluster->nodes * cluster->devices_per_node;
  if (requested <= 0) return capacity > 0x7fffffff ? -1 : (int)capacity;
  return requested <= capacity ? requested : -1;
}

int mp_cluster_nodes_used(const mp_cluster *cluster, int devices) {
  if (devices <= 0 || cluster->devices_per_node <= 0) return 0;
  return (int)(((int64_t)devices + cluster->devices_per_node - 1) / cluster->devices_per_node);
}

bool mp_cluster_same_node(const mp_cluster *cluster, int device_a, int device_b) {
  if (cluster->devices_per_node <= 0) return device_a == device_b;
  return device_a / cluster->devices_per_node == device_b / cluster->devices_per_node;
}

/* ---- shared cores and memory -------------------------------------------------------------- */

int64_t mp_cluster_device_memory(const mp_cluster *cluster, int devices) {
  const int on_node = mp_cluster_devices_on_node(cluster, devices);
  if (cluster->node_memory_bytes <= 0 || on_node <= 0) return cluster->device_memory_bytes;
  const int64_t share = cluster->node_memory_bytes / on_node;
  return share < cluster->device_memory_bytes ? share : cluster->device_memory_bytes;
}

int mp_cluster_devices_on_node(const mp_cluster *cluster, int devices) {
  if (devices <= 0) return 0;
  if (cluster->devices_per_node > 0 && devices > cluster->devices_per_node) {
    return cluster->devices_per_node;
  }
  return devices;
}

int mp_cluster_threads_per_device(const mp_cluster *cluster, int devices_on_node) {
  if (cluster->cores_per_node <= 0 || devices_on_node < 1) return 1;
  const int threads = cluster->cores_per_node / devices_on_node;
  return threads > 1 ? threads : 1;
}

double mp_cluster_blas_thread_efficiency(const mp_cluster *cluster, int threads) {
  const double all = cluster->blas_thread_efficiency;
  if (threads <= 1 || all <= 0 || cluster->cores_per_node <= 1) return 1.0;
  const int t = threads < cluster->cores_per_node ? threads : cluster->cores_per_node;
  return 1.0 + (all - 1.0) * (double)(t - 1) / (double)(cluster->cores_per_node - 1);
}

double mp_cluster_job_peak_flops(const mp_cluster *cluster, int dtype, int devices) {
  if (devices <= 0 || dtype < 0 || dtype >= MP_DTYPE_COUNT) return 0.0;
  const double peak = cluster->peak_flops_per_s[dtype];
  if (cluster->cores_per_node <= 0) return peak * (double)devices;
  double busy_cores = 0.0;
  const int per_node = cluster->devices_per_node > 0 ? cluster->devices_per_node : devices;
  for (int left = devices; left > 0; left -= per_node) {
    const int on_node = left < per_node ? left : per_node;
    const int busy = on_node * mp_cluster_threads_per_device(cluster, on_node);
    busy_cores += busy < cluster->cores_per_node ? busy : cluster->cores_per_node;
  }
  return peak * busy_cores;
}

double mp_cluster_compute_slowdown(const mp_cluster *cluster, int devices_on_node) {
  if (cluster->cores_per_node <= 0 || devices_on_node < 1) return 1.0;
  const double busy = (double)devices_on_node *
                      (double)mp_cluster_threads_per_device(cluster, devices_on_node);
  const double slowdown = busy / (double)cluster->cores_per_node;
  return slowdown > 1.0 ? slowdown : 1.0;
}
