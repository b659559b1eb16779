// tests/topology/cluster_test.cc — cluster descriptions: the preset numbers from the datasheets,
// the example files equal to the presets, JSON round trips, the GEMM efficiency curve, the
// transfer and device-count helpers, and the exact message for each mistake a user can make.
#include "topology/cluster.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

const double kGib = 1073741824.0;

void ExpectSameCluster(const mp_cluster &a, const mp_cluster &b) {
  EXPECT_STREQ(a.name, b.name);
  EXPECT_STREQ(a.notes, b.notes);
  EXPECT_STREQ(a.device, b.device);
  EXPECT_EQ(a.nodes, b.nodes);
  EXPECT_EQ(a.devices_per_node, b.devices_per_node);
  EXPECT_EQ(a.device_memory_bytes, b.device_memory_bytes);
  EXPECT_EQ(a.memory_bandwidth_bytes_per_s, b.memory_bandwidth_bytes_per_s);
  for (int dtype = 0; dtype < MP_DTYPE_COUNT; ++dtype) {
    EXPECT_EQ(a.peak_flops_per_s[dtype], b.peak_flops_per_s[dtype])
        << mp_dtype_name(static_cast<mp_dtype>(dtype));
  }
  EXPECT_EQ(a.intra_node_bandwidth_bytes_per_s, b.intra_node_bandwidth_bytes_per_s);
  EXPECT_EQ(a.intra_node_latency_s, b.intra_node_latency_s);
  EXPECT_EQ(a.inter_node_bandwidth_bytes_per_s, b.inter_node_bandwidth_bytes_per_s);
  EXPECT_EQ(a.inter_node_latency_s, b.inter_node_latency_s);
  EXPECT_EQ(a.memory_efficiency, b.memory_efficiency);
  EXPECT_EQ(a.intra_node_efficiency, b.intra_node_efficiency);
  EXPECT_EQ(a.inter_node_efficiency, b.inter_node_efficiency);
  EXPECT_EQ(a.intra_node_collective_latency_s, b.intra_node_collective_latency_s);
  EXPECT_EQ(a.inter_node_collective_latency_s, b.inter_node_collective_latency_s);
  EXPECT_EQ(a.gemm_efficiency_given, b.gemm_efficiency_given);
  ASSERT_EQ(a.gemm_efficiency_points, b.gemm_efficiency_points);
  for (int i = 0; i < a.gemm_efficiency_points; ++i) {
    EXPECT_EQ(a.gemm_efficiency[i].gemm_flops, b.gemm_efficiency[i].gemm_flops) << i;
    EXPECT_EQ(a.gemm_efficiency[i].efficiency, b.gemm_efficiency[i].efficiency) << i;
  }
  EXPECT_EQ(a.cores_per_node, b.cores_per_node);
  EXPECT_EQ(a.workspace_bytes, b.workspace_bytes);
  EXPECT_EQ(a.node_memory_bytes, b.node_memory_bytes);
}

mp_cluster Preset(const char *name) {
  mp_cluster cluster;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_preset(name, &cluster, &err), MP_OK) << err.message;
  return cluster;
}

// parse(to_json(cluster)), checking every step.
mp_cluster RoundTrip(const mp_cluster &cluster) {
  mp_error err = MP_ERROR_INITIALIZER;
  cJSON *json = nullptr;
  EXPECT_EQ(mp_cluster_to_json(&cluster, &json, &err), MP_OK) << err.message;
  char *text = cJSON_Print(json);
  cJSON_Delete(json);
  mp_cluster back;
  EXPECT_EQ(mp_cluster_parse_text(text, "round-trip.json", &back, &err), MP_OK)
      << err.message << "\n" << text;
  free(text);
  return back;
}

// A valid description; each override replaces (or adds) a top-level key's JSON value, each
// name in `removed` drops a key.
std::string Description(const std::vector<std::pair<std::string, std::string>> &overrides = {},
                        const std::vector<std::string> &removed = {}) {
  std::vector<std::pair<std::string, std::string>> keys = {
      {"name", "\"test\""},
      {"devices_per_node", "8"},
      {"device_memory_gib", "80"},
      {"memory_bandwidth_gbytes_per_s", "3350"},
      {"peak_tflops", "{\"bf16\": 100, \"fp32\": 10}"},
      {"intra_node", "{\"bandwidth_gbytes_per_s\": 450, \"latency_us\": 3}"},
      {"inter_node", "{\"bandwidth_gbytes_per_s\": 50, \"latency_us\": 8}"},
  };
  for (const auto &override_key : overrides) {
    bool replaced = false;
    for (auto &key : keys) {
      if (key.first == override_key.first) {
        key.second = override_key.second;
        replaced = true;
      }
    }
    if (!replaced) keys.push_back(override_key);
  }
  std::string text = "{";
  bool first = true;
  for (const auto &key : keys) {
    bool drop = false;
    for (const auto &name : removed) drop = drop || name == key.first;
    if (drop) continue;
    text += (first ? "\"" : ", \"") + key.first + "\": " + key.second;
    first = false;
  }
  return text + "}";
}

// The message parsing text as "c.json" fails with (and checks that it is an input error).
std::string ParseError(const std::string &text) {
  mp_cluster cluster;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_parse_text(text.c_str(), "c.json", &cluster, &err), MP_ERR_INPUT) << text;
  EXPECT_EQ(err.status, MP_ERR_INPUT);
  return err.message;
}

mp_cluster Parse(const std::string &text) {
  mp_cluster cluster;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_parse_text(text.c_str(), "c.json", &cluster, &err), MP_OK)
      << err.message << "\n" << text;
  return cluster;
}

std::string ReadFile(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// ---- presets -------------------------------------------------------------------------------

TEST(ClusterPresets, NamesAreTheFourPresets) {
  const char *const *names = mp_cluster_preset_names();
  std::vector<std::string> listed;
  for (int i = 0; names[i] != nullptr; ++i) listed.push_back(names[i]);
  EXPECT_EQ(listed, (std::vector<std::string>{"a100-80g", "h100-sxm", "h200-sxm", "cpu-local"}));
  EXPECT_EQ(mp_cluster_preset_json("h100"), nullptr);
}

TEST(ClusterPresets, H100SxmDatasheetNumbers) {
  mp_cluster c = Preset("h100-sxm");
  EXPECT_STREQ(c.name, "h100-sxm");
  EXPECT_STREQ(c.device, "NVIDIA H100 SXM5 80GB");
  EXPECT_EQ(c.nodes, 0);  // as many as the requested devices need
  EXPECT_EQ(c.devices_per_node, 8);
  EXPECT_EQ(c.device_memory_bytes, 80LL * 1073741824LL);
  EXPECT_EQ(c.memory_bandwidth_bytes_per_s, 3350e9);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP32], 67e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_TF32], 494e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_BF16], 989e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP16], 989e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP8], 1979e12);
  EXPECT_EQ(c.intra_node_bandwidth_bytes_per_s, 450e9);
  EXPECT_EQ(c.intra_node_latency_s, 3e-6);
  EXPECT_EQ(c.inter_node_bandwidth_bytes_per_s, 50e9);
  EXPECT_EQ(c.inter_node_latency_s, 8e-6);
  EXPECT_EQ(mp_cluster_training_dtype(&c), MP_DTYPE_BF16);
  EXPECT_FALSE(c.gemm_efficiency_given);
  EXPECT_EQ(c.gemm_efficiency_points, 29);  // 1e6 .. 1e13 FLOPs, four per decade
}

TEST(ClusterPresets, A100DatasheetNumbers) {
  mp_cluster c = Preset("a100-80g");
  EXPECT_EQ(c.devices_per_node, 8);
  EXPECT_EQ(c.device_memory_bytes, 80LL * 1073741824LL);
  EXPECT_EQ(c.memory_bandwidth_bytes_per_s, 2039e9);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP32], 19.5e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_TF32], 156e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_BF16], 312e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP16], 312e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP8], 0.0);  // Ampere has no FP8
  EXPECT_EQ(c.intra_node_bandwidth_bytes_per_s, 300e9);
  EXPECT_EQ(c.inter_node_bandwidth_bytes_per_s, 25e9);
  EXPECT_TRUE(std::isinf(mp_cluster_gemm_seconds(&c, MP_DTYPE_FP8, 1e9)));
}

TEST(ClusterPresets, H200HasH100ComputeAndMoreMemory) {
  mp_cluster h200 = Preset("h200-sxm");
  mp_cluster h100 = Preset("h100-sxm");
  EXPECT_EQ(h200.device_memory_bytes, 141LL * 1073741824LL);
  EXPECT_EQ(h200.memory_bandwidth_bytes_per_s, 4800e9);
  for (int dtype = 0; dtype < MP_DTYPE_COUNT; ++dtype) {
    EXPECT_EQ(h200.peak_flops_per_s[dtype], h100.peak_flops_per_s[dtype]);
  }
  EXPECT_EQ(h200.intra_node_bandwidth_bytes_per_s, 450e9);
  EXPECT_EQ(h200.inter_node_bandwidth_bytes_per_s, 50e9);
}

TEST(ClusterPresets, CpuLocalIsOneMachineWithAnyNumberOfRanks) {
  mp_cluster c = Preset("cpu-local");
  EXPECT_EQ(c.nodes, 1);
  EXPECT_EQ(c.devices_per_node, 4096);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP32], 0.05e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_BF16], 0.0);
  EXPECT_EQ(mp_cluster_training_dtype(&c), MP_DTYPE_FP32);
  EXPECT_EQ(c.device_memory_bytes, 2LL * 1073741824LL);
  EXPECT_EQ(c.intra_node_bandwidth_bytes_per_s, 5e9);
  EXPECT_EQ(c.inter_node_bandwidth_bytes_per_s, 5e9);
  EXPECT_EQ(c.intra_node_latency_s, 2e-6);
  EXPECT_EQ(c.inter_node_latency_s, 2e-6);
  // More ranks than this machine has cores are allowed.
  EXPECT_EQ(mp_cluster_total_devices(&c, 64), 64);
  EXPECT_EQ(mp_cluster_total_devices(&c, 5000), -1);
  EXPECT_TRUE(mp_cluster_same_node(&c, 0, 63));
}

TEST(ClusterPresets, ExampleFilesAreThePresetsByteForByte) {
  for (const char *const *name = mp_cluster_preset_names(); *name != nullptr; ++name) {
    std::string path = std::string("examples/clusters/") + *name + ".json";
    EXPECT_EQ(ReadFile(path), std::string(mp_cluster_preset_json(*name))) << path;
    mp_cluster from_file;
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_cluster_load(path.c_str(), &from_file, &err), MP_OK) << err.message;
    ExpectSameCluster(from_file, Preset(*name));
  }
}

TEST(ClusterPresets, RoundTripEveryPreset) {
  for (const char *const *name = mp_cluster_preset_names(); *name != nullptr; ++name) {
    SCOPED_TRACE(*name);
    mp_cluster preset = Preset(*name);
    ExpectSameCluster(RoundTrip(preset), preset);
    // to_json writes the preset's own JSON back: the same keys and values, nothing added.
    cJSON *written = nullptr;
    cJSON *original = cJSON_Parse(mp_cluster_preset_json(*name));
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(mp_cluster_to_json(&preset, &written, &err), MP_OK);
    char *written_text = cJSON_Print(written);
    EXPECT_TRUE(cJSON_Compare(written, original, 1)) << written_text;
    free(written_text);
    cJSON_Delete(written);
    cJSON_Delete(original);
  }
}

TEST(ClusterPresets, LoadTakesAPresetName) {
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_load("h200-sxm", &c, &err), MP_OK) << err.message;
  EXPECT_STREQ(c.name, "h200-sxm");
}

// ---- round trip of a description with every key --------------------------------------------

TEST(ClusterJson, RoundTripKeepsEveryValueExactly) {
  mp_cluster c = Parse(Description({
      {"notes", "\"measured by hand\""},
      {"device", "\"Test GPU\""},
      {"nodes", "3"},
      {"device_memory_gib", "1.3"},
      {"memory_bandwidth_gbytes_per_s", "0.7"},
      {"memory_efficiency", "0.61"},
      {"peak_tflops", "{\"fp32\": 0.1, \"tf32\": 0.3, \"bf16\": 123.456, \"fp16\": 7e-3, "
                      "\"fp8\": 1e3}"},
      {"intra_node", "{\"bandwidth_gbytes_per_s\": 0.3, \"latency_us\": 0.7, \"efficiency\": 0.7, "
                     "\"collective_latency_us\": 2.5}"},
      {"inter_node", "{\"bandwidth_gbytes_per_s\": 12.5, \"latency_us\": 0}"},
      {"gemm_efficiency", "[{\"gemm_flops\": 1e6, \"efficiency\": 0.1},"
                          " {\"gemm_flops\": 3.3e9, \"efficiency\": 0.45},"
                          " {\"gemm_flops\": 1e12, \"efficiency\": 1}]"},
  }));
  EXPECT_EQ(c.nodes, 3);
  EXPECT_STREQ(c.notes, "measured by hand");
  EXPECT_STREQ(c.device, "Test GPU");
  EXPECT_EQ(c.device_memory_bytes, std::llround(1.3 * kGib));
  EXPECT_EQ(c.intra_node_latency_s, 0.7e-6);
  EXPECT_EQ(c.inter_node_latency_s, 0.0);
  EXPECT_EQ(c.memory_efficiency, 0.61);
  EXPECT_EQ(c.intra_node_efficiency, 0.7);
  EXPECT_EQ(c.inter_node_efficiency, 1.0);  // absent: the bandwidth as given
  EXPECT_EQ(mp_cluster_collective_latency(&c, true), 2.5e-6);
  EXPECT_EQ(mp_cluster_collective_latency(&c, false), 0.0);  // absent: the link's latency, 0 us
  EXPECT_TRUE(c.gemm_efficiency_given);
  EXPECT_EQ(c.gemm_efficiency_points, 3);
  ExpectSameCluster(RoundTrip(c), c);
}

// Rates whose SI value overflows to infinity are refused: JSON cannot write them back and costs
// would turn NaN (tests/fuzz/corpus/cluster_json/regress_inf_*).
TEST(ClusterJson, RefusesRatesThatOverflowToInfinity) {
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "{\"bf16\": 1e300}"}})),
            "c.json: $.peak_tflops.bf16: 1.0000000000000001e+300 is too large");
  EXPECT_EQ(ParseError(Description({{"memory_bandwidth_gbytes_per_s", "1e305"}})),
            "c.json: $.memory_bandwidth_gbytes_per_s: 9.9999999999999994e+304 is too large");
  EXPECT_EQ(ParseError(Description(
                {{"inter_node", "{\"bandwidth_gbytes_per_s\": 1e308, \"latency_us\": 8}"}})),
            "c.json: $.inter_node.bandwidth_gbytes_per_s: 1e+308 is too large");
}

TEST(ClusterJson, FromJsonNamesTheEmbeddingPath) {
  std::string plan = "{\"cluster\": " + Description({{"devices_per_node", "0"}}) + "}";
  cJSON *root = cJSON_Parse(plan.c_str());
  ASSERT_NE(root, nullptr);
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_from_json(cJSON_GetObjectItem(root, "cluster"), "plan.json", "$.cluster",
                                 &c, &err),
            MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "plan.json: $.cluster.devices_per_node: must be a positive integer, got 0");
  cJSON_Delete(root);
}

// ---- GEMM efficiency and time --------------------------------------------------------------

TEST(ClusterGemm, EfficiencyInterpolatesLogLinearlyAndClamps) {
  mp_cluster c = Parse(Description({
      {"gemm_efficiency", "[{\"gemm_flops\": 1e6, \"efficiency\": 0.1},"
                          " {\"gemm_flops\": 1e9, \"efficiency\": 0.4},"
                          " {\"gemm_flops\": 1e12, \"efficiency\": 0.8}]"},
  }));
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&c, 1e6), 0.1);
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&c, 1e9), 0.4);
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&c, 1e12), 0.8);
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&c, 1e3), 0.1);   // below the first point
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&c, 1e15), 0.8);  // above the last
  EXPECT_NEAR(mp_cluster_gemm_efficiency(&c, std::pow(10.0, 7.5)), 0.25, 1e-12);
  EXPECT_NEAR(mp_cluster_gemm_efficiency(&c, 1e10), 0.4 + 0.4 / 3, 1e-12);
  EXPECT_NEAR(mp_cluster_gemm_efficiency(&c, 1e11), 0.4 + 0.8 / 3, 1e-12);
}

TEST(ClusterGemm, SecondsAreFlopsOverPeakTimesEfficiency) {
  mp_cluster c = Parse(Description({
      {"gemm_efficiency", "[{\"gemm_flops\": 1e6, \"efficiency\": 0.5}]"},
  }));
  // bf16 peak 100 TFLOP/s at 50%: 1e12 FLOPs take 1e12 / 5e13 = 20 ms.
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, 1e12), 0.02);
  // fp32 peak 10 TFLOP/s at 50%: 1e9 FLOPs take 200 us.
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_seconds(&c, MP_DTYPE_FP32, 1e9), 2e-4);
  EXPECT_EQ(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, 0), 0.0);
  EXPECT_TRUE(std::isinf(mp_cluster_gemm_seconds(&c, MP_DTYPE_FP8, 1e9)));  // no fp8 peak
}

TEST(ClusterGemm, DefaultCurveIsOverheadPlusThreeQuartersOfPeak) {
  mp_cluster c = Preset("h100-sxm");
  const double overhead_flops = 0.75 * 989e12 * 5e-6;  // 75% of bf16 peak x 5 us
  for (int i = 0; i < c.gemm_efficiency_points; ++i) {
    double flops = std::pow(10.0, 6 + i / 4.0);
    EXPECT_EQ(c.gemm_efficiency[i].gemm_flops, flops);
    EXPECT_DOUBLE_EQ(c.gemm_efficiency[i].efficiency, 0.75 * flops / (flops + overhead_flops));
  }
  EXPECT_NEAR(mp_cluster_gemm_efficiency(&c, 1e6), 2.0217e-4, 1e-8);
  EXPECT_NEAR(mp_cluster_gemm_efficiency(&c, 1e12), 0.74723, 1e-5);
  // At a sampled size a GEMM takes 5 us + flops / (0.75 * peak): 1e12 FLOPs in 1.353163 ms.
  EXPECT_NEAR(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, 1e12), 1.353163e-3, 1e-9);
  EXPECT_NEAR(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, 1e9), 5e-6 + 1e9 / (0.75 * 989e12),
              1e-15);
  EXPECT_EQ(c.gemm_efficiency[4].gemm_flops, 1e7);
  EXPECT_EQ(c.gemm_efficiency[28].gemm_flops, 1e13);
  // Between samples the log-linear interpolation stays within 5% of the formula.
  for (double flops = 1e6; flops <= 1e13; flops *= 1.07) {
    double formula_s = 5e-6 + flops / (0.75 * 989e12);
    EXPECT_NEAR(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, flops) / formula_s, 1.0, 0.05)
        << flops;
  }
  // cpu-local's curve follows its fp32 peak: 0.75 x 0.05 TFLOP/s x 5 us = 1.875e5 FLOPs.
  mp_cluster cpu = Preset("cpu-local");
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_efficiency(&cpu, 1e6), 0.75 * 1e6 / (1e6 + 1.875e5));
}

TEST(ClusterGemm, EmptyCurveMeansPeak) {
  mp_cluster c = Preset("h100-sxm");
  c.gemm_efficiency_points = 0;
  EXPECT_EQ(mp_cluster_gemm_efficiency(&c, 1e9), 1.0);
  EXPECT_DOUBLE_EQ(mp_cluster_gemm_seconds(&c, MP_DTYPE_BF16, 989e9), 1e-3);
}

// ---- transfers, devices and nodes ----------------------------------------------------------

TEST(ClusterLinks, P2pSecondsAreLatencyPlusBytesOverBandwidth) {
  mp_cluster c = Preset("h100-sxm");
  // A collective's bus bandwidth: NVLink 80% of 450 GB/s, InfiniBand 90% of 50 GB/s (the
  // preset's efficiencies); a send the link's own.
  EXPECT_DOUBLE_EQ(mp_cluster_link_bandwidth(&c, true), 360e9);
  EXPECT_DOUBLE_EQ(mp_cluster_link_bandwidth(&c, false), 45e9);
  EXPECT_DOUBLE_EQ(mp_cluster_p2p_seconds(&c, true, 450e6), 3e-6 + 1e-3);   // NVLink
  EXPECT_DOUBLE_EQ(mp_cluster_p2p_seconds(&c, false, 450e6), 8e-6 + 9e-3);  // InfiniBand
  EXPECT_DOUBLE_EQ(mp_cluster_p2p_seconds(&c, true, 1), 3e-6 + 1 / 450e9);
  EXPECT_EQ(mp_cluster_p2p_seconds(&c, false, 0), 0.0);
  EXPECT_DOUBLE_EQ(mp_cluster_memory_bandwidth(&c), 0.85 * 3350e9);
  // A hand-built struct (efficiencies left 0) means the figures as given.
  mp_cluster hand;
  memset(&hand, 0, sizeof hand);
  hand.intra_node_bandwidth_bytes_per_s = 1e9;
  hand.memory_bandwidth_bytes_per_s = 2e9;
  EXPECT_EQ(mp_cluster_link_bandwidth(&hand, true), 1e9);
  EXPECT_EQ(mp_cluster_memory_bandwidth(&hand), 2e9);
}

TEST(ClusterDevices, TotalDevicesNodesUsedAndSameNode) {
  mp_cluster open_ended = Preset("h100-sxm");  // no "nodes": any number
  EXPECT_EQ(mp_cluster_total_devices(&open_ended, 24), 24);
  EXPECT_EQ(mp_cluster_total_devices(&open_ended, 0), -1);
  EXPECT_EQ(mp_cluster_nodes_used(&open_ended, 24), 3);
  EXPECT_EQ(mp_cluster_nodes_used(&open_ended, 9), 2);
  EXPECT_EQ(mp_cluster_nodes_used(&open_ended, 8), 1);
  EXPECT_EQ(mp_cluster_nodes_used(&open_ended, 0), 0);
  EXPECT_TRUE(mp_cluster_same_node(&open_ended, 8, 15));
  EXPECT_FALSE(mp_cluster_same_node(&open_ended, 7, 8));

  mp_cluster two_nodes = Parse(Description({{"nodes", "2"}}));
  EXPECT_EQ(mp_cluster_total_devices(&two_nodes, 0), 16);
  EXPECT_EQ(mp_cluster_total_devices(&two_nodes, 16), 16);
  EXPECT_EQ(mp_cluster_total_devices(&two_nodes, 12), 12);
  EXPECT_EQ(mp_cluster_total_devices(&two_nodes, 17), -1);
}

TEST(ClusterDtypes, NamesAreThePeakKeys) {
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_FP32), "fp32");
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_TF32), "tf32");
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_BF16), "bf16");
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_FP16), "fp16");
  EXPECT_STREQ(mp_dtype_name(MP_DTYPE_FP8), "fp8");
  mp_dtype dtype = MP_DTYPE_FP32;
  EXPECT_TRUE(mp_dtype_from_name("fp16", &dtype));
  EXPECT_EQ(dtype, MP_DTYPE_FP16);
  EXPECT_FALSE(mp_dtype_from_name("float16", &dtype));
}

// ---- --cluster: names, files and suggestions -----------------------------------------------

TEST(ClusterLoad, UnknownNameSuggestsThePreset) {
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_load("h100", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown cluster 'h100'; did you mean 'h100-sxm'? Presets: a100-80g, h100-sxm, "
            "h200-sxm, cpu-local; or give a JSON file path");
  EXPECT_EQ(mp_cluster_load("H200-SXM", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown cluster 'H200-SXM'; did you mean 'h200-sxm'? Presets: a100-80g, h100-sxm, "
            "h200-sxm, cpu-local; or give a JSON file path");
  EXPECT_EQ(mp_cluster_load("cpu-locl", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown cluster 'cpu-locl'; did you mean 'cpu-local'? Presets: a100-80g, h100-sxm, "
            "h200-sxm, cpu-local; or give a JSON file path");
}

TEST(ClusterLoad, UnknownNameWithNothingCloseListsPresets) {
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_load("tpu-v5", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown cluster 'tpu-v5': no preset and no file has that name. Presets: a100-80g, "
            "h100-sxm, h200-sxm, cpu-local; or give a JSON file path");
}

TEST(ClusterLoad, PresetFunctionRefusesOtherNames) {
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_preset("a100", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "unknown cluster preset 'a100'; did you mean 'a100-80g'? Presets: a100-80g, "
            "h100-sxm, h200-sxm, cpu-local");
}

TEST(ClusterLoad, MissingFileIsNamed) {
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_load("no/such/cluster.json", &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "no/such/cluster.json: cannot open: No such file or directory");
}

TEST(ClusterLoad, FileErrorsNameTheFile) {
  const char *tmpdir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(tmpdir != nullptr ? tmpdir : "/tmp") + "/mine.json";
  {
    std::ofstream file(path);
    file << Description({{"intra_node", "{\"bandwidth_gbytes_per_s\": 450, \"latncy_us\": 3}"}});
  }
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_load(path.c_str(), &c, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": $.intra_node: unknown key \"latncy_us\"; did you mean \"latency_us\"? "
                   "(known keys: bandwidth_gbytes_per_s, latency_us, efficiency, "
                   "collective_latency_us)");
  {
    std::ofstream file(path);
    file << Description({{"nodes", "2"}});
  }
  ASSERT_EQ(mp_cluster_load(path.c_str(), &c, &err), MP_OK) << err.message;
  EXPECT_EQ(c.nodes, 2);
  std::remove(path.c_str());
}

// ---- each mistake and its exact message ----------------------------------------------------

TEST(ClusterErrors, UnknownTopLevelKeySuggestsClosest) {
  EXPECT_EQ(ParseError(Description({{"devices_per_nod", "8"}})),
            "c.json: $: unknown key \"devices_per_nod\"; did you mean \"devices_per_node\"? "
            "(known keys: name, notes, device, nodes, devices_per_node, device_memory_gib, "
            "memory_bandwidth_gbytes_per_s, memory_efficiency, peak_tflops, intra_node, "
            "inter_node, gemm_efficiency, flash_attention_efficiency, vector_tflops, "
            "scalar_tflops, cores_per_node, blas_thread_efficiency, wide_gemm_efficiency, "
            "workspace_gib, node_memory_gib)");
}

TEST(ClusterErrors, EfficienciesAreFractions) {
  EXPECT_EQ(ParseError(Description({{"memory_efficiency", "85"}})),
            "c.json: $.memory_efficiency: must be in (0, 1] (a fraction of the figure above), "
            "got 85");
  EXPECT_EQ(ParseError(Description(
                {{"inter_node", "{\"bandwidth_gbytes_per_s\": 50, \"latency_us\": 8, "
                                "\"efficiency\": 0}"}})),
            "c.json: $.inter_node.efficiency: must be in (0, 1] (a fraction of the figure "
            "above), got 0");
  EXPECT_EQ(ParseError(Description({{"memory_efficiency", "\"0.8\""}})),
            "c.json: $.memory_efficiency: must be a number, got a string (\"0.8\"); drop the "
            "quotes");
}

TEST(ClusterErrors, UnknownDtypeSuggestsClosest) {
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "{\"bf_16\": 100}"}})),
            "c.json: $.peak_tflops: unknown key \"bf_16\"; did you mean \"bf16\"? (known keys: "
            "fp32, tf32, bf16, fp16, fp8)");
}

TEST(ClusterErrors, WrongTypes) {
  EXPECT_EQ(ParseError(Description({{"devices_per_node", "\"8\""}})),
            "c.json: $.devices_per_node: must be a positive integer, got a string (\"8\"); drop "
            "the quotes");
  EXPECT_EQ(ParseError(Description({{"devices_per_node", "2.5"}})),
            "c.json: $.devices_per_node: must be a positive integer, got 2.5");
  EXPECT_EQ(ParseError(Description({{"name", "7"}})),
            "c.json: $.name: must be a string, got a number");
  EXPECT_EQ(ParseError(Description({{"intra_node", "450"}})),
            "c.json: $.intra_node: expected an object with bandwidth_gbytes_per_s and "
            "latency_us (a JSON object), got a number");
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "[989]"}})),
            "c.json: $.peak_tflops: expected an object of dense peak TFLOP/s per dtype (a JSON "
            "object), got an array");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency", "{\"gemm_flops\": 1e6}"}})),
            "c.json: $.gemm_efficiency: must be an array, got an object");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency", "[0.5]"}})),
            "c.json: $.gemm_efficiency[0]: expected a point {\"gemm_flops\": F, \"efficiency\": "
            "E} (a JSON object), got a number");
  EXPECT_EQ(ParseError("[1, 2]"),
            "c.json: $: expected a cluster description (a JSON object), got an array");
}

TEST(ClusterErrors, MissingRequiredKeys) {
  EXPECT_EQ(ParseError(Description({}, {"name"})),
            "c.json: $: missing required key \"name\" (a string)");
  EXPECT_EQ(ParseError(Description({}, {"devices_per_node"})),
            "c.json: $: missing required key \"devices_per_node\" (a positive integer)");
  EXPECT_EQ(ParseError(Description({}, {"peak_tflops"})),
            "c.json: $: missing required key \"peak_tflops\" (an object of dense peak TFLOP/s "
            "per dtype)");
  EXPECT_EQ(ParseError(Description({}, {"inter_node"})),
            "c.json: $: missing required key \"inter_node\" (an object with "
            "bandwidth_gbytes_per_s and latency_us)");
  EXPECT_EQ(ParseError(Description({{"intra_node", "{\"bandwidth_gbytes_per_s\": 450}"}})),
            "c.json: $.intra_node: missing required key \"latency_us\" (a non-negative number)");
}

TEST(ClusterErrors, NonPositiveSizes) {
  EXPECT_EQ(ParseError(Description({{"nodes", "0"}})),
            "c.json: $.nodes: must be a positive integer, got 0");
  EXPECT_EQ(ParseError(Description({{"device_memory_gib", "0"}})),
            "c.json: $.device_memory_gib: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description({{"memory_bandwidth_gbytes_per_s", "-3350"}})),
            "c.json: $.memory_bandwidth_gbytes_per_s: must be a positive number, got -3350");
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "{\"bf16\": 0}"}})),
            "c.json: $.peak_tflops.bf16: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description(
                {{"inter_node", "{\"bandwidth_gbytes_per_s\": 0, \"latency_us\": 8}"}})),
            "c.json: $.inter_node.bandwidth_gbytes_per_s: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description(
                {{"inter_node", "{\"bandwidth_gbytes_per_s\": 50, \"latency_us\": -1}"}})),
            "c.json: $.inter_node.latency_us: must be a non-negative number, got -1");
  EXPECT_EQ(ParseError(Description({{"devices_per_node", "2000000"}})),
            "c.json: $.devices_per_node: must be at most 1048576, got 2000000");
  EXPECT_EQ(ParseError(Description({{"device_memory_gib", "1e-12"}})),
            "c.json: $.device_memory_gib: 9.9999999999999998e-13 GiB is less than one byte");
}

TEST(ClusterErrors, NoUsablePeak) {
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "{\"fp8\": 1979, \"fp16\": 989}"}})),
            "c.json: $.peak_tflops: needs \"bf16\" or \"fp32\" (dense TFLOP/s per device); "
            "training computes in one of them");
  EXPECT_EQ(ParseError(Description({{"peak_tflops", "{}"}})),
            "c.json: $.peak_tflops: needs \"bf16\" or \"fp32\" (dense TFLOP/s per device); "
            "training computes in one of them");
}

TEST(ClusterErrors, FP32AloneIsEnough) {
  mp_cluster c = Parse(Description({{"peak_tflops", "{\"fp32\": 2}"}}));
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP32], 2e12);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_BF16], 0.0);
}

TEST(ClusterErrors, EfficiencyOutOfRange) {
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 1e6, \"efficiency\": 0.5},"
                                     " {\"gemm_flops\": 1e9, \"efficiency\": 1.5}]"}})),
            "c.json: $.gemm_efficiency[1].efficiency: must be in (0, 1] (a fraction of peak), "
            "got 1.5");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 1e6, \"efficiency\": 0}]"}})),
            "c.json: $.gemm_efficiency[0].efficiency: must be in (0, 1] (a fraction of peak), "
            "got 0");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 0, \"efficiency\": 0.5}]"}})),
            "c.json: $.gemm_efficiency[0].gemm_flops: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 1e6, \"eficiency\": 0.5}]"}})),
            "c.json: $.gemm_efficiency[0]: unknown key \"eficiency\"; did you mean "
            "\"efficiency\"? (known keys: gemm_flops, efficiency)");
}

TEST(ClusterErrors, EfficiencyPointsMustAscend) {
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 1e9, \"efficiency\": 0.5},"
                                     " {\"gemm_flops\": 1e6, \"efficiency\": 0.1}]"}})),
            "c.json: $.gemm_efficiency[1].gemm_flops: 1000000 is not above the previous "
            "point's 1000000000; list the points in strictly ascending gemm_flops");
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency",
                                     "[{\"gemm_flops\": 1e9, \"efficiency\": 0.5},"
                                     " {\"gemm_flops\": 1e9, \"efficiency\": 0.6}]"}})),
            "c.json: $.gemm_efficiency[1].gemm_flops: 1000000000 is not above the previous "
            "point's 1000000000; list the points in strictly ascending gemm_flops");
}

TEST(ClusterErrors, EfficiencyCurveSize) {
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency", "[]"}})),
            "c.json: $.gemm_efficiency: is empty; it needs at least 1 item");
  std::string points = "[";
  for (int i = 0; i < 33; ++i) {
    points += (i ? ", " : "") + std::string("{\"gemm_flops\": ") + std::to_string(i + 1) +
              ", \"efficiency\": 0.5}";
  }
  points += "]";
  EXPECT_EQ(ParseError(Description({{"gemm_efficiency", points}})),
            "c.json: $.gemm_efficiency: has 33 points; at most 32 are allowed (drop some)");
}

TEST(ClusterErrors, LongStringsAndSyntax) {
  EXPECT_EQ(ParseError(Description({{"name", "\"" + std::string(64, 'x') + "\""}})),
            "c.json: $.name: is 64 characters long; at most 63 are allowed");
  EXPECT_EQ(ParseError(Description({{"name", "\"\""}})), "c.json: $.name: must not be empty");
  // The syntax message itself is common/json_reader's; here only that it names file and place.
  EXPECT_EQ(ParseError("{\"name\": \"x\",}").rfind("c.json:1:14: JSON syntax error", 0), 0u);
}

// ---- shared cores and workspace -------------------------------------------------------------

TEST(ClusterSharedCores, KeysAreOptionalAndRoundTrip) {
  mp_cluster absent = Parse(Description());
  EXPECT_EQ(absent.cores_per_node, 0);
  EXPECT_EQ(absent.workspace_bytes, 0);
  mp_cluster c = Parse(Description({{"cores_per_node", "2"}, {"workspace_gib", "0.17"}}));
  EXPECT_EQ(c.cores_per_node, 2);
  EXPECT_EQ(c.workspace_bytes, std::llround(0.17 * kGib));
  ExpectSameCluster(RoundTrip(c), c);
  // to_json writes them back only when given.
  cJSON *json = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_to_json(&c, &json, &err), MP_OK);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(json, "cores_per_node")->valuedouble, 2.0);
  EXPECT_NE(cJSON_GetObjectItemCaseSensitive(json, "workspace_gib"), nullptr);
  cJSON_Delete(json);
  ASSERT_EQ(mp_cluster_to_json(&absent, &json, &err), MP_OK);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(json, "cores_per_node"), nullptr);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(json, "workspace_gib"), nullptr);
  cJSON_Delete(json);
  // No preset gives them: cpu-local's cores are this machine's, measured by calibrate.
  for (const char *const *name = mp_cluster_preset_names(); *name != nullptr; ++name) {
    EXPECT_EQ(Preset(*name).cores_per_node, 0) << *name;
    EXPECT_EQ(Preset(*name).workspace_bytes, 0) << *name;
    EXPECT_EQ(Preset(*name).node_memory_bytes, 0) << *name;
  }
}

// ---- shared memory (node_memory_gib) and cpu-local's placeholder ---------------------------

TEST(ClusterSharedMemory, RanksOfANodeShareItsMemory) {
  mp_cluster gpus = Parse(Description());
  EXPECT_EQ(gpus.node_memory_bytes, 0);
  // Without node_memory_gib each device holds its own, however many there are.
  EXPECT_EQ(mp_cluster_device_memory(&gpus, 1), 80LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&gpus, 64), 80LL * 1073741824LL);
  mp_cluster c = Parse(Description({{"node_memory_gib", "16"}}));
  EXPECT_EQ(c.node_memory_bytes, 16LL * 1073741824LL);
  ExpectSameCluster(RoundTrip(c), c);
  // The ranks on the fullest node (at most devices_per_node = 8) share its 16 GiB.
  EXPECT_EQ(mp_cluster_device_memory(&c, 1), 16LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 2), 8LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 8), 2LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 64), 2LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 0), c.device_memory_bytes);
  // Never more than a device holds.
  mp_cluster big = Parse(Description({{"node_memory_gib", "1000"}}));
  EXPECT_EQ(mp_cluster_device_memory(&big, 2), 80LL * 1073741824LL);
  cJSON *json = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_to_json(&gpus, &json, &err), MP_OK);
  EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(json, "node_memory_gib"), nullptr);
  cJSON_Delete(json);
  EXPECT_EQ(ParseError(Description({{"node_memory_gib", "0"}})),
            "c.json: $.node_memory_gib: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description({{"node_memory_gib", "1e-12"}})),
            "c.json: $.node_memory_gib: 9.9999999999999998e-13 GiB is less than one byte");
}

// cpu-local uncalibrated: the preset's speeds, the given machine's memory shared by its ranks.
TEST(ClusterSharedMemory, CpuLocalPlaceholderIsDerivedFromTheMachine) {
  const int64_t machine = 24LL * 1073741824LL;
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_cpu_local_placeholder(machine, &c, &err), MP_OK) << err.message;
  const mp_cluster preset = Preset("cpu-local");
  EXPECT_TRUE(c.placeholder);
  EXPECT_STREQ(c.name, "cpu-local");
  EXPECT_EQ(c.device_memory_bytes, machine);
  EXPECT_EQ(c.node_memory_bytes, machine);
  EXPECT_EQ(c.workspace_bytes, std::llround(MP_CLUSTER_CPU_RANK_WORKSPACE_GIB * kGib));
  EXPECT_EQ(c.cores_per_node, 0);  // the cores stay calibrate's to measure
  EXPECT_EQ(c.nodes, preset.nodes);
  EXPECT_EQ(c.devices_per_node, preset.devices_per_node);
  EXPECT_EQ(c.peak_flops_per_s[MP_DTYPE_FP32], preset.peak_flops_per_s[MP_DTYPE_FP32]);
  EXPECT_EQ(c.memory_bandwidth_bytes_per_s, preset.memory_bandwidth_bytes_per_s);
  EXPECT_EQ(c.intra_node_bandwidth_bytes_per_s, preset.intra_node_bandwidth_bytes_per_s);
  EXPECT_NE(std::string(c.notes).find("Uncalibrated placeholder derived from this machine: its "
                                      "memory (24.0 GiB) is shared by the ranks on it"),
            std::string::npos)
      << c.notes;
  // gpt2-124m at dp 2 needs about 3.3 GiB a rank: 2 ranks of a 24 GiB machine hold 12 each.
  EXPECT_EQ(mp_cluster_device_memory(&c, 2), 12LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 8), 3LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 1), machine);
  // The same machine gives the same cluster, and it reads back from its JSON.
  mp_cluster again;
  ASSERT_EQ(mp_cluster_cpu_local_placeholder(machine, &again, &err), MP_OK);
  ExpectSameCluster(again, c);
  ExpectSameCluster(RoundTrip(c), c);
  // A machine whose memory is unknown gets the preset (2 GiB a rank).
  mp_cluster unknown;
  ASSERT_EQ(mp_cluster_cpu_local_placeholder(0, &unknown, &err), MP_OK);
  ExpectSameCluster(unknown, preset);
  EXPECT_TRUE(unknown.placeholder);
}

}  // namespace

// This machine's memory: $MPENGINE_CPU_LOCAL_MEMORY_GIB when set (refused naming it when it is
// not a positive number), else the physical memory; mp_cluster_load("cpu-local") uses it.
TEST(ClusterSharedMemory, MachineMemoryAndTheOverride) {
  int64_t bytes = -1;
  mp_error err = MP_ERROR_INITIALIZER;
  unsetenv("MPENGINE_CPU_LOCAL_MEMORY_GIB");
  ASSERT_EQ(mp_cluster_machine_memory(&bytes, &err), MP_OK);
  EXPECT_GT(bytes, 0);  // Linux says
  setenv("MPENGINE_CPU_LOCAL_MEMORY_GIB", "24", 1);
  ASSERT_EQ(mp_cluster_machine_memory(&bytes, &err), MP_OK);
  EXPECT_EQ(bytes, 24LL * 1073741824LL);
  for (const char *bad : {"0", "-1", "24GiB", "", "lots"}) {
    setenv("MPENGINE_CPU_LOCAL_MEMORY_GIB", bad, 1);
    EXPECT_EQ(mp_cluster_machine_memory(&bytes, &err), MP_ERR_INPUT) << bad;
    EXPECT_EQ(std::string(err.message),
              std::string("MPENGINE_CPU_LOCAL_MEMORY_GIB: expected this machine's memory as a "
                          "positive number of GiB (at most 1048576), got '") +
                  bad + "'; unset it to read the machine's");
  }
  // cpu-local without a calibration file: the placeholder of this (overridden) machine.
  setenv("MPENGINE_CALIBRATION", "", 1);
  setenv("MPENGINE_CPU_LOCAL_MEMORY_GIB", "6", 1);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_load("cpu-local", &c, &err), MP_OK) << err.message;
  EXPECT_TRUE(c.placeholder);
  EXPECT_EQ(c.node_memory_bytes, 6LL * 1073741824LL);
  EXPECT_EQ(mp_cluster_device_memory(&c, 2), 3LL * 1073741824LL);
  setenv("MPENGINE_CPU_LOCAL_MEMORY_GIB", "six", 1);
  EXPECT_EQ(mp_cluster_load("cpu-local", &c, &err), MP_ERR_INPUT);
  // Other presets never read the machine.
  ASSERT_EQ(mp_cluster_load("h100-sxm", &c, &err), MP_OK) << err.message;
  EXPECT_EQ(c.node_memory_bytes, 0);
  unsetenv("MPENGINE_CPU_LOCAL_MEMORY_GIB");
  unsetenv("MPENGINE_CALIBRATION");
}

namespace {

TEST(ClusterSharedCores, BadValuesNameFileAndPath) {
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "0"}})),
            "c.json: $.cores_per_node: must be a positive integer, got 0");
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "-4"}})),
            "c.json: $.cores_per_node: must be a positive integer, got -4");
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "2000000"}})),
            "c.json: $.cores_per_node: must be at most 1048576, got 2000000");
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "1.5"}})),
            "c.json: $.cores_per_node: must be a positive integer, got 1.5");
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "\"2\""}})),
            "c.json: $.cores_per_node: must be a positive integer, got a string (\"2\"); drop "
            "the quotes");
  EXPECT_EQ(ParseError(Description({{"workspace_gib", "0"}})),
            "c.json: $.workspace_gib: must be a positive number, got 0");
  EXPECT_EQ(ParseError(Description({{"workspace_gib", "80"}})),
            "c.json: $.workspace_gib: 80 GiB leaves nothing of the device's 80 GiB "
            "(device_memory_gib); it must be less");
  // Compared as stored (bytes): a value that rounds to the whole device is refused too, so that
  // every accepted description reads back (tests/fuzz/corpus/cluster_json/regress_workspace_*).
  EXPECT_EQ(ParseError(Description({{"device_memory_gib", "1"},
                                    {"workspace_gib", "0.9999999999999"}})),
            "c.json: $.workspace_gib: 0.99999999999989997 GiB leaves nothing of the device's 1 "
            "GiB (device_memory_gib); it must be less");
  EXPECT_EQ(ParseError(Description({{"workspace_gib", "1e300"}})),
            "c.json: $.workspace_gib: 1.0000000000000001e+300 GiB leaves nothing of the device's "
            "80 GiB (device_memory_gib); it must be less");
  EXPECT_EQ(ParseError(Description({{"workspace_gib", "1e-12"}})),
            "c.json: $.workspace_gib: 9.9999999999999998e-13 GiB is less than one byte");
  EXPECT_EQ(ParseError(Description({{"cores_per_nodes", "2"}})).rfind(
                "c.json: $: unknown key \"cores_per_nodes\"", 0),
            0u);
  // Inside a plan the path is the embedding's.
  cJSON *root = cJSON_Parse(Description({{"cores_per_node", "0"}}).c_str());
  mp_cluster c;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_cluster_from_json(root, "plan.json", "$.cluster", &c, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message, "plan.json: $.cluster.cores_per_node: must be a positive integer, got 0");
  cJSON_Delete(root);
}

// max(1, devices x threads / cores) with threads = max(1, cores / devices), as `run` sets them.
TEST(ClusterSharedCores, SlowdownIsRanksTimesThreadsOverCores) {
  mp_cluster c = Parse(Description({{"cores_per_node", "2"}, {"devices_per_node", "4096"}}));
  EXPECT_EQ(mp_cluster_threads_per_device(&c, 8), 1);
  EXPECT_EQ(mp_cluster_compute_slowdown(&c, 8), 4.0);  // the quickstart: 8 ranks on 2 cores
  EXPECT_EQ(mp_cluster_compute_slowdown(&c, 3), 1.5);
  EXPECT_EQ(mp_cluster_threads_per_device(&c, 2), 1);
  EXPECT_EQ(mp_cluster_compute_slowdown(&c, 2), 1.0);
  EXPECT_EQ(mp_cluster_threads_per_device(&c, 1), 2);  // one rank: both cores' BLAS threads
  EXPECT_EQ(mp_cluster_compute_slowdown(&c, 1), 1.0);
  EXPECT_EQ(mp_cluster_compute_slowdown(&c, 0), 1.0);
  mp_cluster eight = Parse(Description({{"cores_per_node", "8"}}));
  EXPECT_EQ(mp_cluster_threads_per_device(&eight, 3), 2);
  EXPECT_EQ(mp_cluster_compute_slowdown(&eight, 3), 1.0);  // 6 of the 8 cores busy
  EXPECT_EQ(mp_cluster_threads_per_device(&eight, 5), 1);
  EXPECT_EQ(mp_cluster_compute_slowdown(&eight, 12), 1.5);
  // Devices on the fullest node: the nodes fill one after another.
  EXPECT_EQ(mp_cluster_devices_on_node(&eight, 64), 8);
  EXPECT_EQ(mp_cluster_devices_on_node(&eight, 5), 5);
  EXPECT_EQ(mp_cluster_devices_on_node(&eight, 0), 0);
  // Without cores_per_node (every GPU preset) a device is its own processor.
  mp_cluster h100 = Preset("h100-sxm");
  EXPECT_EQ(mp_cluster_threads_per_device(&h100, 8), 1);
  EXPECT_EQ(mp_cluster_compute_slowdown(&h100, 8), 1.0);
  EXPECT_EQ(mp_cluster_compute_slowdown(&h100, 4096), 1.0);
}

// calibrate's measured scaling of BLAS threads: 1 for one thread, the figure on all cores, linear
// between; read, written back and bounded by 1.
TEST(ClusterSharedCores, BlasThreadEfficiencyIsMeasuredOnAllCoresAndInterpolated) {
  mp_cluster c = Parse(Description({{"cores_per_node", "4"}, {"blas_thread_efficiency", "0.7"}}));
  EXPECT_DOUBLE_EQ(c.blas_thread_efficiency, 0.7);
  EXPECT_DOUBLE_EQ(mp_cluster_blas_thread_efficiency(&c, 1), 1.0);
  EXPECT_DOUBLE_EQ(mp_cluster_blas_thread_efficiency(&c, 4), 0.7);
  EXPECT_DOUBLE_EQ(mp_cluster_blas_thread_efficiency(&c, 2), 0.9);
  EXPECT_DOUBLE_EQ(mp_cluster_blas_thread_efficiency(&c, 8), 0.7);  // no more than the cores
  mp_cluster plain = Parse(Description({{"cores_per_node", "4"}}));
  EXPECT_DOUBLE_EQ(mp_cluster_blas_thread_efficiency(&plain, 4), 1.0);  // not measured
  cJSON *json = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_to_json(&c, &json, &err), MP_OK) << err.message;
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(json, "blas_thread_efficiency")->valuedouble, 0.7);
  cJSON_Delete(json);
  EXPECT_EQ(ParseError(Description({{"cores_per_node", "2"}, {"blas_thread_efficiency", "1.2"}})),
            "c.json: $.blas_thread_efficiency: 1.2; threads cannot run faster than each alone (at "
            "most 1)");
}

// calibrate's wide GEMM (an LM head's shape) against the curve: read, written back, at most 1,
// and 1 where it is not given (the GPU presets).
TEST(ClusterSharedCores, WideGemmEfficiencyIsAFractionOfTheCurve) {
  mp_cluster c = Parse(Description({{"wide_gemm_efficiency", "0.63"}}));
  EXPECT_DOUBLE_EQ(mp_cluster_wide_gemm_efficiency(&c), 0.63);
  EXPECT_TRUE(mp_cluster_wide_gemm(768, 50304));
  EXPECT_FALSE(mp_cluster_wide_gemm(768, 3072));
  cJSON *json = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_to_json(&c, &json, &err), MP_OK) << err.message;
  EXPECT_DOUBLE_EQ(cJSON_GetObjectItem(json, "wide_gemm_efficiency")->valuedouble, 0.63);
  cJSON_Delete(json);
  const mp_cluster plain = Parse(Description());
  EXPECT_DOUBLE_EQ(mp_cluster_wide_gemm_efficiency(&plain), 1.0);
  EXPECT_EQ(ParseError(Description({{"wide_gemm_efficiency", "1.5"}})),
            "c.json: $.wide_gemm_efficiency: 1.5; a fraction of the curve's rate (at most 1)");
}

// What MFU is measured against: the cores a job keeps busy on shared cores, so that a rank on two
// BLAS threads is not held to one core's peak (an MFU above 100%), nor eight ranks taking turns on
// two cores to eight; on GPUs every device's peak.
TEST(ClusterSharedCores, JobPeakIsTheCoresItKeepsBusy) {
  mp_cluster c = Parse(Description({{"cores_per_node", "2"}, {"devices_per_node", "4096"}}));
  const double peak = c.peak_flops_per_s[MP_DTYPE_FP32];
  ASSERT_GT(peak, 0.0);
  EXPECT_EQ(mp_cluster_job_peak_flops(&c, MP_DTYPE_FP32, 1), 2 * peak);  // two BLAS threads
  EXPECT_EQ(mp_cluster_job_peak_flops(&c, MP_DTYPE_FP32, 2), 2 * peak);
  EXPECT_EQ(mp_cluster_job_peak_flops(&c, MP_DTYPE_FP32, 8), 2 * peak);  // 8 ranks, 2 cores
  EXPECT_EQ(mp_cluster_job_peak_flops(&c, MP_DTYPE_FP32, 0), 0.0);
  mp_cluster eight = Parse(Description({{"cores_per_node", "8"}, {"devices_per_node", "4"}}));
  // Nodes of 4 ranks with 2 threads each: 8 busy cores per node.
  EXPECT_EQ(mp_cluster_job_peak_flops(&eight, MP_DTYPE_FP32, 8), 16 * peak);
  EXPECT_EQ(mp_cluster_job_peak_flops(&eight, MP_DTYPE_FP32, 3), 6 * peak);  // 3 x 2 of 8
  mp_cluster h100 = Preset("h100-sxm");
  EXPECT_EQ(mp_cluster_job_peak_flops(&h100, MP_DTYPE_BF16, 8),
            8 * h100.peak_flops_per_s[MP_DTYPE_BF16]);
}

}  // namespace

// Where this machine's measured cpu-local is kept: $MPENGINE_CALIBRATION (set and empty: nowhere),
// else under $XDG_CACHE_HOME, else under $HOME/.cache; cpu-local is that file when it exists, the
// placeholder preset (marked so) when it does not, and another preset is never replaced.
TEST(ClusterCalibration, CpuLocalIsTheCalibrationFileWhenThereIsOne) {
  char path[4096];
  unsetenv("MPENGINE_CALIBRATION");
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  ASSERT_TRUE(mp_cluster_calibration_path(path, sizeof path));
  EXPECT_STREQ(path, "/x/cache/mpengine/cpu-local.json");
  unsetenv("XDG_CACHE_HOME");
  setenv("HOME", "/x/home", 1);
  ASSERT_TRUE(mp_cluster_calibration_path(path, sizeof path));
  EXPECT_STREQ(path, "/x/home/.cache/mpengine/cpu-local.json");
  setenv("MPENGINE_CALIBRATION", "", 1);
  EXPECT_FALSE(mp_cluster_calibration_path(path, sizeof path));

  const char *base = getenv("TEST_TMPDIR");
  const std::string file = std::string(base != nullptr ? base : "/tmp") + "/calibrated.json";
  setenv("MPENGINE_CALIBRATION", file.c_str(), 1);
  std::remove(file.c_str());
  mp_cluster cluster;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_cluster_load("cpu-local", &cluster, &err), MP_OK) << err.message;
  EXPECT_TRUE(cluster.placeholder);
  EXPECT_STREQ(cluster.name, "cpu-local");
  std::ofstream(file) << "{\"name\": \"cpu-local-calibrated\", \"devices_per_node\": 2, "
                         "\"device_memory_gib\": 4, \"memory_bandwidth_gbytes_per_s\": 20, "
                         "\"peak_tflops\": {\"fp32\": 0.14}, \"intra_node\": "
                         "{\"bandwidth_gbytes_per_s\": 5, \"latency_us\": 2}, \"inter_node\": "
                         "{\"bandwidth_gbytes_per_s\": 5, \"latency_us\": 2}}";
  ASSERT_EQ(mp_cluster_load("cpu-local", &cluster, &err), MP_OK) << err.message;
  EXPECT_FALSE(cluster.placeholder);
  EXPECT_STREQ(cluster.name, "cpu-local-calibrated");
  EXPECT_DOUBLE_EQ(cluster.peak_flops_per_s[MP_DTYPE_FP32], 0.14e12);
  ASSERT_EQ(mp_cluster_load("h100-sxm", &cluster, &err), MP_OK);
  EXPECT_FALSE(cluster.placeholder);
  EXPECT_STREQ(cluster.name, "h100-sxm");
  unsetenv("MPENGINE_CALIBRATION");
}
