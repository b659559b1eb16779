/* tests/fuzz/cluster_json_fuzz.c — libFuzzer target: cluster descriptions
 * (mp_cluster_parse_text), and the cost helpers on whatever parses. */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "topology/cluster.h"

static bool same_cluster(const mp_cluster *a, const mp_cluster *b) {
  bool same = strcmp(a->name, b->name) == 0 && strcmp(a->notes, b->notes) == 0 &&
              strcmp(a->device, b->device) == 0 && a->nodes == b->nodes &&
              a->devices_per_node == b->devices_per_node &&
              a->device_memory_bytes == b->device_memory_bytes &&
              a->memory_bandwidth_bytes_per_s == b->memory_bandwidth_bytes_per_s &&
              a->intra_node_bandwidth_bytes_per_s == b->intra_node_bandwidth_bytes_per_s &&
              a->intra_node_latency_s == b->intra_node_latency_s &&
              a->inter_node_bandwidth_bytes_per_s == b->inter_node_bandwidth_bytes_per_s &&
              a->inter_node_latency_s == b->inter_node_latency_s &&
              a->gemm_efficiency_given == b->gemm_efficiency_given &&
              a->gemm_efficiency_points == b->gemm_efficiency_points;
  same = same && a->cores_per_node == b->cores_per_node && a->workspace_bytes == b->workspace_bytes;
  for (int i = 0; same && i < MP_DTYPE_COUNT; ++i) {
    same = a->peak_flops_per_s[i] == b->peak_flops_per_s[i];
  }
  for (int i = 0; same && i < a->gemm_efficiency_points; ++i) {
    same = a->gemm_efficiency[i].gemm_flops == b->gemm_efficiency[i].gemm_flops &&
           a->gemm_efficiency[i].efficiency == b->gemm_efficiency[i].efficiency;
  }
  return same;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = fuzz_text_copy(data, size);
  if (text == NULL) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_cluster cluster;
  if (mp_cluster_parse_text(text, "fuzz.json", &cluster, &err) == MP_OK) {
    volatile double sink = 0;
    sink += mp_cluster_gemm_seconds(&cluster, mp_cluster_training_dtype(&cluster), 1e9);
    sink += mp_cluster_gemm_efficiency(&cluster, 3e7);
    sink += mp_cluster_p2p_seconds(&cluster, false, 1e6);
    sink += mp_cluster_total_devices(&cluster, 0) + mp_cluster_nodes_used(&cluster, 1000);
    sink += mp_cluster_compute_slowdown(&cluster, mp_cluster_devices_on_node(&cluster, 4096));
    (void)sink;
    /* cluster.h promises that mp_cluster_from_json(mp_cluster_to_json(x)) gives back x. */
    cJSON *json = NULL;
    if (mp_cluster_to_json(&cluster, &json, &err) == MP_OK) {
      mp_cluster again;
      if (mp_cluster_from_json(json, "round-trip", "$", &again, &err) != MP_OK) abort();
      if (!same_cluster(&cluster, &again)) abort();
      cJSON_Delete(json);
    }
  } else if (err.message[0] == '\0') {
    abort();
  }
  free(text);
  return 0;
}
