/*
 * topology/cluster_presets.c — the built-in cluster descriptions behind `--cluster NAME`.
 *
 * Each preset is JSON text, not a filled struct, so that presets and user files go through one
 * parser (cluster.c) and a preset is also a valid example of the file format. Each text is
 * byte for byte examples/clusters/<name>.json; tests/topology/cluster_test.cc checks that, so
 * edit both together. The comments above each text name the public source of every figure.
 * Peaks are dense (NVIDIA datasheets print tensor-core figures "with sparsity", twice the dense
 * rate; we halve them). Bandwidths are per device and per direction.
 */
#include <stddef.h>
#include <string.h>

#include "topology/cluster.h"

/*
 * a100-80g — NVIDIA A100 Tensor Core GPU datasheet, column "A100 80GB SXM":
 *   FP32 19.5 TFLOPS; TF32 Tensor Core 156 (312 with sparsity); BF16 and FP16 Tensor Core 312
 *   (624 with sparsity); no FP8. 80GB HBM2e at 2,039 GB/s.
 *   NVLink: 600 GB/s per GPU (third-generation NVLink, 12 links x 50 GB/s, both directions
 *   together) = 300 GB/s per direction.
 * DGX A100 system architecture (NVIDIA technical white paper): 8 A100 per node behind NVSwitch;
 *   8 single-port Mellanox ConnectX-6 HDR InfiniBand adapters, 200 Gb/s each, one per GPU
 *   = 25 GB/s per direction per GPU.
 * Latencies: NCCL's tuning model (src/graph/tuning.cc, hwLat) puts NVLink at ~0.5-3.4 us and the
 *   network at ~3-14 us per hop depending on protocol; we take 3 us inside a node and 8 us
 *   across nodes for a small send/recv.
 */
static const char kA100_80g[] =
    "{\n"
    "  \"name\": \"a100-80g\",\n"
    "  \"notes\": \"From NVIDIA's A100 Tensor Core GPU datasheet (A100 80GB SXM; dense "
    "figures, half the 'with sparsity' ones) and the DGX A100 system architecture (8 GPUs per "
    "node on NVLink 3, 600 GB/s per GPU both directions together; one 200 Gb/s HDR InfiniBand "
    "port per GPU). Latencies are typical NCCL small-message figures. Efficiencies: streaming "
    "kernels reach about 85% of HBM bandwidth (STREAM/BabelStream); NCCL all-reduce on 8 A100 "
    "SXM4 80GB reaches a bus bandwidth of about 200-210 GB/s, 68% of NVLink's 300 (nccl-tests, "
    "NVIDIA/nccl-tests issues 149 and 178), and about 90% of HDR InfiniBand across nodes "
    "(issue 119). Flash attention: FlashAttention-2 (Dao 2023) reaches about 60% of A100's "
    "dense bf16 peak forward and backward at head size 128. Run `mpengine calibrate` on the "
    "real machine for measured numbers.\",\n"
    "  \"device\": \"NVIDIA A100 SXM4 80GB\",\n"
    "  \"devices_per_node\": 8,\n"
    "  \"device_memory_gib\": 80,\n"
    "  \"memory_bandwidth_gbytes_per_s\": 2039,\n"
    "  \"memory_efficiency\": 0.85,\n"
    "  \"peak_tflops\": {\n"
    "    \"fp32\": 19.5,\n"
    "    \"tf32\": 156,\n"
    "    \"bf16\": 312,\n"
    "    \"fp16\": 312\n"
    "  },\n"
    "  \"intra_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 300,\n"
    "    \"latency_us\": 3,\n"
    "    \"efficiency\": 0.68\n"
    "  },\n"
    "  \"inter_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 25,\n"
    "    \"latency_us\": 8,\n"
    "    \"efficiency\": 0.9\n"
    "  },\n"
    "  \"flash_attention_efficiency\": 0.6\n"
    "}\n";

/*
 * h100-sxm — NVIDIA H100 Tensor Core GPU datasheet, column "H100 SXM":
 *   FP32 67 TFLOPS; TF32 Tensor Core 989 with sparsity -> 494 dense; BF16 and FP16 Tensor Core
 *   1,979 with sparsity -> 989 dense; FP8 Tensor Core 3,958 with sparsity -> 1,979 dense (the
 *   H100 architecture white paper's dense table gives 494.7 / 989.4 / 1,978.9; we use the
 *   datasheet's figures halved, rounded down). 80GB HBM3 at 3.35 TB/s.
 *   NVLink: 900 GB/s per GPU (fourth-generation NVLink, 18 links x 50 GB/s, both directions
 *   together) = 450 GB/s per direction.
 * DGX H100 user guide: 8 H100 per node behind NVSwitch; 8 ConnectX-7 ports at 400 Gb/s NDR
 *   InfiniBand, one per GPU = 50 GB/s per direction per GPU.
 * Latencies: as for a100-80g (NCCL's tuning model): 3 us inside a node, 8 us across nodes.
 */
static const char kH100_sxm[] =
    "{\n"
    "  \"name\": \"h100-sxm\",\n"
    "  \"notes\": \"From NVIDIA's H100 Tensor Core GPU datasheet (H100 SXM; dense figures, "
    "half the 'with sparsity' ones, rounded down) and the DGX H100 user guide (8 GPUs per node "
    "on NVLink 4, 900 GB/s per GPU both directions together; one 400 Gb/s NDR InfiniBand port "
    "per GPU). Latencies are typical NCCL small-message figures. Efficiencies: streaming "
    "kernels reach about 85% of HBM bandwidth (STREAM/BabelStream); NCCL all-reduce inside a "
    "DGX H100 reaches a bus bandwidth of about 360 GB/s, 80% of NVLink's 450 (nccl-tests), and "
    "about 90% of NDR InfiniBand across nodes. Flash attention: FlashAttention-2 (Dao 2023) "
    "reaches about 35% of H100's dense bf16 peak forward and backward at head size 128. Run "
    "`mpengine calibrate` on the real machine for measured numbers.\",\n"
    "  \"device\": \"NVIDIA H100 SXM5 80GB\",\n"
    "  \"devices_per_node\": 8,\n"
    "  \"device_memory_gib\": 80,\n"
    "  \"memory_bandwidth_gbytes_per_s\": 3350,\n"
    "  \"memory_efficiency\": 0.85,\n"
    "  \"peak_tflops\": {\n"
    "    \"fp32\": 67,\n"
    "    \"tf32\": 494,\n"
    "    \"bf16\": 989,\n"
    "    \"fp16\": 989,\n"
    "    \"fp8\": 1979\n"
    "  },\n"
    "  \"intra_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 450,\n"
    "    \"latency_us\": 3,\n"
    "    \"efficiency\": 0.8\n"
    "  },\n"
    "  \"inter_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 50,\n"
    "    \"latency_us\": 8,\n"
    "    \"efficiency\": 0.9\n"
    "  },\n"
    "  \"flash_attention_efficiency\": 0.35\n"
    "}\n";

/*
 * h200-sxm — NVIDIA H200 Tensor Core GPU datasheet, column "H200 SXM": the same compute figures
 *   as H100 SXM (FP32 67; TF32 989, BF16/FP16 1,979, FP8 3,958 TFLOPS with sparsity, halved as
 *   above); 141GB HBM3e at 4.8 TB/s; NVLink 900 GB/s (450 per direction).
 *   device_memory_gib is 141: the datasheet's "141GB" is close to GiB in practice (nvidia-smi
 *   reports 143,771 MiB = 140.4 GiB).
 * DGX H200: 8 H200 per node behind NVSwitch, 8 ConnectX-7 at 400 Gb/s = 50 GB/s per GPU.
 * Latencies: as for h100-sxm.
 */
static const char kH200_sxm[] =
    "{\n"
    "  \"name\": \"h200-sxm\",\n"
    "  \"notes\": \"From NVIDIA's H200 Tensor Core GPU datasheet (H200 SXM: the compute of "
    "H100 SXM, 141 GB of HBM3e at 4.8 TB/s; dense figures, half the 'with sparsity' ones, "
    "rounded down) and the DGX H200 system (8 GPUs per node on NVLink 4, 900 GB/s per GPU both "
    "directions together; one 400 Gb/s NDR InfiniBand port per GPU). Latencies are typical "
    "NCCL small-message figures. Efficiencies: as h100-sxm (the same NVLink 4 and NDR "
    "network): 85% of HBM bandwidth, 80% of NVLink, 90% of InfiniBand. Flash attention: as "
    "h100-sxm, 35% of peak (FlashAttention-2, Dao 2023). Run `mpengine calibrate` on the real "
    "machine for measured numbers.\",\n"
    "  \"device\": \"NVIDIA H200 SXM 141GB\",\n"
    "  \"devices_per_node\": 8,\n"
    "  \"device_memory_gib\": 141,\n"
    "  \"memory_bandwidth_gbytes_per_s\": 4800,\n"
    "  \"memory_efficiency\": 0.85,\n"
    "  \"peak_tflops\": {\n"
    "    \"fp32\": 67,\n"
    "    \"tf32\": 494,\n"
    "    \"bf16\": 989,\n"
    "    \"fp16\": 989,\n"
    "    \"fp8\": 1979\n"
    "  },\n"
    "  \"intra_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 450,\n"
    "    \"latency_us\": 3,\n"
    "    \"efficiency\": 0.8\n"
    "  },\n"
    "  \"inter_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 50,\n"
    "    \"latency_us\": 8,\n"
    "    \"efficiency\": 0.9\n"
    "  },\n"
    "  \"flash_attention_efficiency\": 0.35\n"
    "}\n";

/*
 * cpu-local — ranks are CPU processes on this machine (what `run --backend cpu` starts), as
 * many as asked, more than the cores if need be. There is no datasheet: these are placeholders
 * for one rank on one core of a typical x86-64 server, until `mpengine calibrate` measures the
 * machine:
 *   - fp32 0.05 TFLOPS: one AVX2 core peaks at 2 FMA units x 8 lanes x 2 FLOP x ~3 GHz = 96
 *     GFLOP/s; OpenBLAS sgemm reaches about half of that on the small matrices we run.
 *   - no bf16/fp16/tf32/fp8: the CPU backend computes in fp32.
 *   - 2 GiB per rank, 10 GB/s of DRAM bandwidth per rank (a single core's STREAM bandwidth).
 *   - Open MPI shared-memory (vader) messages: ~5 GB/s and ~2 us for a small message, with room
 *     for oversubscribed ranks waiting for a core. Inside and "between" nodes are the same.
 *   - nodes 1 and devices_per_node 4096: one machine, any sensible number of ranks.
 */
static const char kCpu_local[] =
    "{\n"
    "  \"name\": \"cpu-local\",\n"
    "  \"notes\": \"Ranks are CPU processes on this machine, any number of them (up to 4096), "
    "more than the cores when asked, in which case they share the cores. The figures are "
    "placeholders for one rank on one core of a typical x86-64 server, not a datasheet: fp32 "
    "GEMM through OpenBLAS at about 50 GFLOP/s (AVX2 FMA), about 10 GB/s of DRAM bandwidth, "
    "about 2 GiB of memory, and MPI shared-memory messages at about 5 GB/s with 2 us latency. "
    "Elementwise arithmetic at about 30 GFLOP/s in vectorised kernels (GELU's tanh, the "
    "cross-entropy's exps) and 6 GFLOP/s in the attention softmax's scalar expf loop, on one "
    "core. No bf16 peak: the CPU backend computes in fp32. Run `mpengine calibrate` to measure "
    "this machine.\",\n"
    "  \"device\": \"CPU process\",\n"
    "  \"nodes\": 1,\n"
    "  \"devices_per_node\": 4096,\n"
    "  \"device_memory_gib\": 2,\n"
    "  \"memory_bandwidth_gbytes_per_s\": 10,\n"
    "  \"peak_tflops\": {\n"
    "    \"fp32\": 0.05\n"
    "  },\n"
    "  \"vector_tflops\": 0.03,\n"
    "  \"scalar_tflops\": 0.006,\n"
    "  \"intra_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 5,\n"
    "    \"latency_us\": 2\n"
    "  },\n"
    "  \"inter_node\": {\n"
    "    \"bandwidth_gbytes_per_s\": 5,\n"
    "    \"latency_us\": 2\n"
    "  }\n"
    "}\n";

static const char *const kPresetNames[] = {"a100-80g", "h100-sxm", "h200-sxm", "cpu-local", NULL};
static const char *const kPresetTexts[] = {kA100_80g, kH100_sxm, kH200_sxm, kCpu_local, NULL};

const char *const *mp_cluster_preset_names(void) { return kPresetNames; }

const char *mp_cluster_preset_json(const char *name) {
  if (name == NULL) return NULL;
  for (int i = 0; kPresetNames[i] != NULL; ++i) {
    if (strcmp(name, kPresetNames[i]) == 0) return kPresetTexts[i];
  }
  return NULL;
}
