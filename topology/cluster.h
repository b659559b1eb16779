/*
 * topology/cluster.h — the machines a plan runs on: how many devices, how fast they compute, how
 * much memory they hold and how fast they talk to each other, inside a node and between nodes.
 *
 * The planner turns a model's FLOPs and bytes into seconds with these numbers; `mpengine plan
 * --cluster NAME|FILE` picks one. A description is JSON, either a built-in preset (from public
 * datasheets) or a file a user wrote or `mpengine calibrate` measured. Presets are JSON text
 * embedded in the program and go through the same parser as files, so they cannot drift from the
 * format; examples/clusters/<preset>.json holds each one verbatim.
 *
 * JSON format (units are in the key names; every key not marked optional is required):
 *
 *   {
 *     "name": "h100-sxm",                    what plans and messages call this cluster
 *     "notes": "...",                        optional: where the numbers come from
 *     "device": "NVIDIA H100 SXM5 80GB",     optional: the device model, for people
 *     "nodes": 4,                            optional: absent means as many nodes as the
 *                                            requested device count needs
 *     "devices_per_node": 8,
 *     "device_memory_gib": 80,               per device
 *     "memory_bandwidth_gbytes_per_s": 3350, per device (HBM; DRAM per rank for cpu-local)
 *     "memory_efficiency": 0.85,             optional, default 1: the fraction of that bandwidth
 *                                            a streaming kernel reaches (STREAM / BabelStream)
 *     "peak_tflops": {                       dense (no sparsity) peak per device; each key is
 *       "fp32": 67, "tf32": 494,             optional, an absent one means "not supported",
 *       "bf16": 989, "fp16": 989,            and bf16 or fp32 must be given
 *       "fp8": 1979
 *     },
 *     "intra_node": {                        device to device inside a node (NVLink, shared
 *       "bandwidth_gbytes_per_s": 450,       memory): per device, per direction
 *       "latency_us": 3,                     one step of a ring collective (NCCL's small-message
 *                                            time / the ring's steps)
 *       "efficiency": 0.8,                   optional, default 1: the bus bandwidth a large
 *                                            collective reaches (nccl-tests' busbw) / bandwidth
 *       "collective_latency_us": 6           optional, default latency_us: one ring step of a
 *                                            collective (a small all-reduce's time / 2(n-1))
 *     },
 *     "inter_node": {                        device to device across nodes: the device's share
 *       "bandwidth_gbytes_per_s": 50,        of the network (its NIC), per direction
 *       "latency_us": 8
 *     },
 *     "gemm_efficiency": [                   optional: fraction of peak a GEMM of that many
 *       {"gemm_flops": 1e6, "efficiency": 0.01},   FLOPs reaches; at most 32 points, gemm_flops
 *       {"gemm_flops": 1e12, "efficiency": 0.8}    strictly ascending, efficiency in (0, 1]
 *     ],
 *     "flash_attention_efficiency": 0.35,    optional: the fraction of peak a fused (flash)
 *                                            attention kernel reaches, forward and backward;
 *                                            default MP_CLUSTER_DEFAULT_FLASH_ATTENTION_EFFICIENCY
 *     "vector_tflops": 0.01,                 optional: the rate of the elementwise kernels'
 *                                            arithmetic (not matrix units; an exp counts 20
 *                                            FLOPs, topology/layer_cost.h); default the fp32
 *                                            peak. A CPU core's exp loops are far below its
 *                                            BLAS peak: `mpengine calibrate` measures it
 *     "scalar_tflops": 0.003,                optional: the same for the kernels our CPU backend
 *                                            runs as scalar loops (the attention softmax);
 *                                            default vector_tflops
 *     "cores_per_node": 2,                   optional: the processor cores the devices of one
 *                                            node share (CPU ranks); absent: each device is its
 *                                            own processor (a GPU). See "Shared cores" below
 *     "blas_thread_efficiency": 0.84,        optional, with cores_per_node: a GEMM on all the
 *                                            node's cores as BLAS threads runs at this fraction
 *                                            of cores x its one-thread rate (OpenBLAS's threads
 *                                            do not scale perfectly on thin GEMMs); absent: 1
 *     "wide_gemm_efficiency": 0.68,          optional: a GEMM whose output is at least 16 times
 *                                            wider than its reduction (an LM head over the
 *                                            vocabulary, mp_cluster_wide_gemm) runs at this
 *                                            fraction of the curve's rate for its FLOPs (its
 *                                            weight streams through the caches: OpenBLAS ran
 *                                            128 x 768 x 50304 at 88 GFLOP/s where square
 *                                            products of those FLOPs ran at 140); absent: 1
 *     "workspace_gib": 0.17,                 optional: memory every device uses besides the
 *                                            model's state and activations (a CPU rank's
 *                                            process: libraries, runtime buffers); absent: the
 *                                            cost model's 5% of device_memory_gib
 *     "node_memory_gib": 23.4                optional: the memory the devices of one node share
 *                                            (CPU ranks: the machine's); a job's D ranks on a
 *                                            node hold node_memory / D each, at most
 *                                            device_memory_gib (mp_cluster_device_memory);
 *                                            absent: each device holds device_memory_gib of its
 *                                            own (a GPU)
 *   }
 *
 * GB and TFLOP are decimal (1e9 bytes, 1e12 FLOP), GiB is 2^30 bytes. In mp_cluster every value
 * is converted to SI units (bytes, seconds, FLOP/s).
 *
 * GEMM efficiency: small GEMMs do not reach peak. Between points the efficiency is interpolated
 * linearly in log(gemm_flops); outside them it is clamped to the first or last point. When
 * "gemm_efficiency" is absent the parser fills a default curve (mp_cluster.gemm_efficiency_given
 * is then false, and mp_cluster_to_json leaves it out again). The default is an assumption, not
 * a measurement: every GEMM pays a fixed cost of MP_CLUSTER_DEFAULT_GEMM_OVERHEAD_S (a kernel
 * launch costs a few microseconds on CUDA, and a small GEMM runs too few tiles to fill the
 * device), and a large GEMM reaches MP_CLUSTER_DEFAULT_GEMM_MAX_EFFICIENCY of dense peak (cuBLAS
 * BF16 GEMMs of 8192^3 reach roughly 70-85% of datasheet peak on A100 and H100). So
 *     seconds(f) = overhead_s + f / (max_efficiency * peak), that is
 *     efficiency(f) = max_efficiency * f / (f + max_efficiency * peak * overhead_s),
 * sampled four times per decade from f = 1e6 to 1e13 FLOPs (interpolation then stays within 5%
 * of the formula), with peak that of the cluster's training dtype
 * (mp_cluster_training_dtype). On h100-sxm that is 2e-4 at 1e6 FLOPs, 0.37 at 3.7e9 and 0.75
 * from 1e12 up; on cpu-local (0.05 TFLOP/s) 0.63 already at 1e6.
 * `mpengine calibrate` replaces the curve with measured points.
 *
 * Shared cores (cpu-local): the peak, the efficiency curve and the memory bandwidth are those of
 * one rank on one core (calibrate times one thread). With "cores_per_node" the ranks of a node
 * share its cores: `mpengine run` gives each of the D ranks of a node
 * mp_cluster_threads_per_device = max(1, floor(cores / D)) BLAS threads (OPENBLAS_NUM_THREADS),
 * so with fewer ranks than cores a rank's GEMMs run on that many threads, and with more the ranks
 * take turns on the cores: every rank's compute, memory traffic and shared-memory messages stretch
 * by mp_cluster_compute_slowdown = max(1, D x threads / cores) (8 ranks of one thread on 2 cores:
 * 4; Open MPI's waits spin, so a waiting rank competes for a core as much as a computing one).
 * `mpengine calibrate` writes the cores it may run on (sched_getaffinity).
 *
 * Shared memory (cpu-local): the ranks of one machine share its memory, so with "node_memory_gib"
 * a job of D ranks on a node gives each node_memory / D (mp_cluster_device_memory; `mpengine
 * plan` plans with that share, and says so). `mpengine calibrate` writes the machine's memory as
 * both node_memory_gib and device_memory_gib (one rank alone may use all of it).
 *
 * cpu-local uncalibrated: the preset's speeds are placeholders (one core of a typical x86-64
 * server), but its memory is this machine's: mp_cluster_load("cpu-local") without a calibration
 * file returns mp_cluster_cpu_local_placeholder(this machine's memory), marked placeholder.
 */
#ifndef MPENGINE_TOPOLOGY_CLUSTER_H
#define MPENGINE_TOPOLOGY_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number formats a device computes in; the order of mp_cluster.peak_flops_per_s. */
typedef enum {
  MP_DTYPE_FP32 = 0,
  MP_DTYPE_TF32 = 1, /* fp32 storage, tensor-core math with a 10-bit mantissa */
  MP_DTYPE_BF16 = 2,
  MP_DTYPE_FP16 = 3,
  MP_DTYPE_FP8 = 4,
  MP_DTYPE_COUNT = 5,
} mp_dtype;

enum {
  MP_CLUSTER_NAME_BYTES = 64,
  MP_CLUSTER_DEVICE_BYTES = 128,
  MP_CLUSTER_NOTES_BYTES = 1024,
  MP_CLUSTER_MAX_EFFICIENCY_POINTS = 32,
};

/* The default GEMM efficiency curve; see the comment at the top of this file. */
#define MP_CLUSTER_DEFAULT_GEMM_OVERHEAD_S 5e-6
#define MP_CLUSTER_DEFAULT_GEMM_MAX_EFFICIENCY 0.75
/* An assumption for a device nobody measured: FlashAttention-2 (Dao 2023) reaches 50-70% of
 * A100's dense peak and about 35% of H100's, forward and backward, at head size 128. */
#define MP_CLUSTER_DEFAULT_FLASH_ATTENTION_EFFICIENCY 0.5

typedef struct {
  double gemm_flops; /* FLOPs of one GEMM (2 * m * n * k) */
  double efficiency; /* fraction of peak it reaches, in (0, 1] */
} mp_gemm_efficiency_point;

/* A parsed cluster description. Plain data: the planner reads the fields. */
typedef struct {
  char name[MP_CLUSTER_NAME_BYTES];
  char notes[MP_CLUSTER_NOTES_BYTES];   /* "" when absent */
  char device[MP_CLUSTER_DEVICE_BYTES]; /* "" when absent */
  int nodes;                            /* 0: as many as the requested device count needs */
  int devices_per_node;
  int64_t device_memory_bytes;
  double memory_bandwidth_bytes_per_s;
  double peak_flops_per_s[MP_DTYPE_COUNT]; /* dense; 0 when the device lacks the dtype */
  double intra_node_bandwidth_bytes_per_s; /* per device, per direction */
  double intra_node_latency_s;
  double intra_node_efficiency;            /* of the bandwidth a large collective reaches */
  double intra_node_collective_latency_s;  /* one ring step of a collective; 0: the latency */
  double inter_node_bandwidth_bytes_per_s; /* per device, per direction */
  double inter_node_latency_s;
  double inter_node_efficiency;
  double inter_node_collective_latency_s;
  double memory_efficiency;                /* of the memory bandwidth streaming kernels reach */
  bool gemm_efficiency_given; /* false: the points below are the default curve */
  int gemm_efficiency_points;
  mp_gemm_efficiency_point gemm_efficiency[MP_CLUSTER_MAX_EFFICIENCY_POINTS]; /* ascending */
  double flash_attention_efficiency;    /* of peak, a fused attention kernel */
  double vector_flops_per_s;            /* elementwise arithmetic; 0: the fp32 peak */
  double scalar_flops_per_s;            /* the same in scalar loops; 0: vector_flops_per_s */
  bool flash_attention_efficiency_given; /* false: the default, and to_json leaves it out */
  bool placeholder; /* cpu-local uncalibrated (no calibration file): the preset's speeds, not
                       this machine's (its memory is: mp_cluster_cpu_local_placeholder) */
  /* Shared cores and workspace (optional keys; 0 when absent). */
  int cores_per_node;      /* processor cores the devices of one node share; 0: one each */
  double blas_thread_efficiency; /* of threads x the one-thread GEMM rate on all cores; 0: 1 */
  double wide_gemm_efficiency;   /* a wide GEMM's rate over the curve's (mp_cluster_wide_gemm);
                                    0: 1 */
  int64_t workspace_bytes; /* per device besides state and activations; 0: the default */
  int64_t node_memory_bytes; /* memory the devices of one node share; 0: each its own */
} mp_cluster;

/* Where `mpengine calibrate` keeps this machine's measured cpu-local description, which
 * mp_cluster_load("cpu-local") then returns instead of the placeholder preset:
 * $MPENGINE_CALIBRATION when it is set (set and empty: none, the preset always; the tests run so),
 * else $XDG_CACHE_HOME/mpengine/cpu-local.json, else $HOME/.cache/mpengine/cpu-local.json.
 * Writes the path into out and returns true; false when there is none (no HOME, or disabled).
 * Refresh it by running `mpengine calibrate` again. */
bool mp_cluster_calibration_path(char *out, size_t out_bytes);

/* This machine's physical memory in bytes, what cpu-local's placeholder shares among its ranks:
 * $MPENGINE_CPU_LOCAL_MEMORY_GIB when it is set (tests fix the machine so; a positive number of
 * GiB), else sysconf's physical pages x page size (MemTotal). *bytes is 0 when neither says.
 * Fails with MP_ERR_INPUT, naming the variable, when it is set but not a positive number. */
mp_status mp_cluster_machine_memory(int64_t *bytes, mp_error *err);

/* cpu-local's placeholder on a machine of machine_memory_bytes (mp_cluster_machine_memory): the
 * preset's speeds and links, with this memory shared by the ranks (node_memory_bytes and
 * device_memory_bytes both the machine's), a bare CPU rank's workspace
 * (MP_CLUSTER_CPU_RANK_WORKSPACE_GIB, where the machine holds more), notes that say so, and
 * placeholder set. machine_memory_bytes <= 0 (unknown): the preset itself (2 GiB per rank).
 * Pure: the same figures give the same cluster. Fails only if the preset does not parse. */
mp_status mp_cluster_cpu_local_placeholder(int64_t machine_memory_bytes, mp_cluster *out,
                                           mp_error *err);

/* A bare CPU rank's resident memory before any model (libraries, OpenBLAS's and Open MPI's
 * buffers): measured VmHWM of tiny-gpt ranks was 172-174 MiB (topology/cost_model.h). */
#define MP_CLUSTER_CPU_RANK_WORKSPACE_GIB 0.17

/* "fp32", "tf32", "bf16", "fp16", "fp8" (the keys of "peak_tflops"); "?" for other values. */
const char *mp_dtype_name(mp_dtype dtype);

/* Finds dtype by its name; returns false when name is none of them. */
bool mp_dtype_from_name(const char *name, mp_dtype *out);

/* The preset names, NULL-terminated: a100-80g, h100-sxm, h200-sxm, cpu-local. */
const char *const *mp_cluster_preset_names(void);

/* The JSON text of a preset (identical to examples/clusters/<name>.json), or NULL when name is
 * not a preset. */
const char *mp_cluster_preset_json(const char *name);

/* Fills out with a preset. Fails with MP_ERR_INPUT when name is not a preset, naming the
 * closest preset and listing them all. */
mp_status mp_cluster_preset(const char *name, mp_cluster *out, mp_error *err);

/* What `--cluster` takes: a preset name, else the path of a cluster JSON file. "cpu-local" is
 * this machine's calibration file when there is one (mp_cluster_calibration_path), else
 * mp_cluster_cpu_local_placeholder of mp_cluster_machine_memory (whose failure it returns).
 * Fails with MP_ERR_INPUT when it is neither (suggesting the closest preset), when the file
 * cannot be read, or when the description is invalid (naming the file and the JSON path). */
mp_status mp_cluster_load(const char *name_or_path, mp_cluster *out, mp_error *err);

/* Parses a cluster description from text; source names it in messages (a file name). */
mp_status mp_cluster_parse_text(const char *text, const char *source, mp_cluster *out,
                                mp_error *err);

/* Reads a cluster description from a JSON object found at path inside source: "$" for a whole
 * file, "$.cluster" for the copy a plan embeds. Validates every key; fails with MP_ERR_INPUT
 * naming source and the JSON path of the first mistake. */
mp_status mp_cluster_from_json(const cJSON *object, const char *source, const char *path,
                               mp_cluster *out, mp_error *err);

/* The description as a JSON object, in the file format above, for a plan to embed; the caller
 * frees *out with cJSON_Delete. mp_cluster_from_json of the result gives back an identical
 * cluster. Fails with MP_ERR_RUNTIME only when out of memory. */
mp_status mp_cluster_to_json(const mp_cluster *cluster, cJSON **out, mp_error *err);

/* The dtype training runs in on this cluster: bf16 when the device has a bf16 peak, else fp32. */
mp_dtype mp_cluster_training_dtype(const mp_cluster *cluster);

/* The fraction of peak a GEMM of gemm_flops FLOPs reaches: the curve interpolated linearly in
 * log(gemm_flops), clamped to its end points; 1 when the curve is empty (a hand-built struct). */
double mp_cluster_gemm_efficiency(const mp_cluster *cluster, double gemm_flops);

/* Seconds one GEMM of gemm_flops FLOPs takes in dtype: flops / (peak * efficiency). 0 for
 * gemm_flops <= 0; +infinity when the device has no peak for dtype. */
double mp_cluster_gemm_seconds(const mp_cluster *cluster, mp_dtype dtype, double gemm_flops);

/* Whether a GEMM of (m x k) x (k x n) is wide: its output at least MP_CLUSTER_WIDE_GEMM_RATIO
 * times wider than its reduction (an LM head's vocabulary over the hidden size), the shape
 * "wide_gemm_efficiency" describes. */
#define MP_CLUSTER_WIDE_GEMM_RATIO 16.0
bool mp_cluster_wide_gemm(double k, double n);
/* The fraction of the curve's rate a wide GEMM reaches on this cluster: wide_gemm_efficiency,
 * or 1. */
double mp_cluster_wide_gemm_efficiency(const mp_cluster *cluster);

/* The bandwidth streaming kernels reach: memory_bandwidth x memory_efficiency, bytes/s. */
double mp_cluster_memory_bandwidth(const mp_cluster *cluster);

/* FLOP/s of the elementwise kernels' arithmetic: vector_tflops, else the fp32 peak, else the
 * training dtype's. */
double mp_cluster_vector_flops_per_s(const mp_cluster *cluster);

/* FLOP/s of the elementwise kernels our CPU backend runs as scalar loops: scalar_tflops, else
 * mp_cluster_vector_flops_per_s. */
double mp_cluster_scalar_flops_per_s(const mp_cluster *cluster);

/* FLOP/s of a fused (flash) attention kernel: the training dtype's peak x
 * flash_attention_efficiency. */
double mp_cluster_flash_attention_flops_per_s(const mp_cluster *cluster);

/* The bus bandwidth a large collective reaches on the intra-node link (same_node) or the
 * inter-node one: bandwidth x efficiency, bytes/s per device per direction. */
double mp_cluster_link_bandwidth(const mp_cluster *cluster, bool same_node);

/* Seconds of one ring step of a collective on the intra-node link (same_node) or the inter-node
 * one: collective_latency_us when given, else latency_us. */
double mp_cluster_collective_latency(const mp_cluster *cluster, bool same_node);

/* Seconds to send bytes from one device to another: latency + bytes / bandwidth over the
 * intra-node link when same_node, else the inter-node one (a send reaches the link's bandwidth;
 * its efficiency is a collective's). 0 for bytes <= 0. */
double mp_cluster_p2p_seconds(const mp_cluster *cluster, bool same_node, double bytes);

/* How many devices a plan gets when it asks for requested: requested itself when the cluster
 * has room for it (always when "nodes" is absent); all nodes * devices_per_node when
 * requested <= 0 and "nodes" is given; -1 when requested exceeds the cluster, or when
 * requested <= 0 and "nodes" is absent (nothing says how many). */
int mp_cluster_total_devices(const mp_cluster *cluster, int requested);

/* Nodes that devices devices occupy, filling each node before the next: ceil(devices /
 * devices_per_node). */
int mp_cluster_nodes_used(const mp_cluster *cluster, int devices);

/* Whether devices a and b (0-based, node-major numbering) sit in the same node. */
bool mp_cluster_same_node(const mp_cluster *cluster, int device_a, int device_b);

/* ---- shared cores and memory (see "Shared cores" and "Shared memory" at the top) ---------- */

/* Bytes one device of a job of `devices` devices holds: device_memory_bytes, or where the devices
 * of a node share its memory (node_memory_bytes) node_memory / mp_cluster_devices_on_node, at
 * most device_memory_bytes. device_memory_bytes for devices <= 0. */
int64_t mp_cluster_device_memory(const mp_cluster *cluster, int devices);

/* The devices on the fullest node when devices devices fill the nodes one after another:
 * min(devices, devices_per_node); 0 for devices <= 0. */
int mp_cluster_devices_on_node(const mp_cluster *cluster, int devices);

/* The BLAS threads `mpengine run` gives each of devices_on_node ranks of a node:
 * max(1, floor(cores_per_node / devices_on_node)); 1 when the cluster does not give
 * cores_per_node (each device its own processor) or devices_on_node < 1. */
int mp_cluster_threads_per_device(const mp_cluster *cluster, int devices_on_node);

/* The GEMM rate of `threads` BLAS threads over threads x one thread's: 1 for one thread, the
 * cluster's blas_thread_efficiency on all cores_per_node, linear in the thread count between
 * (1 without a measured figure). */
double mp_cluster_blas_thread_efficiency(const mp_cluster *cluster, int threads);

/* How much slower every rank computes (and moves memory, and exchanges shared-memory messages)
 * when devices_on_node ranks, each with mp_cluster_threads_per_device threads, share the node's
 * cores: max(1, devices_on_node x threads / cores_per_node). 1 when the cluster does not give
 * cores_per_node (the GPU presets) or devices_on_node < 1. */
double mp_cluster_compute_slowdown(const mp_cluster *cluster, int devices_on_node);

/* The peak FLOP/s of dtype that a job of `devices` ranks can reach, what MFU is measured
 * against: devices x the device's peak, or on shared cores (cores_per_node) the one-thread peak
 * times the cores the job keeps busy, min(D x threads, cores) on each node of D ranks, so that a
 * rank with two BLAS threads is not held to one core's peak and eight ranks taking turns on two
 * cores not to eight. 0 for devices <= 0. */
double mp_cluster_job_peak_flops(const mp_cluster *cluster, int dtype, int devices);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_CLUSTER_H */
