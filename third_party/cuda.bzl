"""cuda_library: CUDA sources compiled by nvcc through a genrule, wherever CUDA is installed.

On a machine with /usr/local/cuda (GPU or not) the .cu files are compiled for Ampere (sm_80) and
Hopper (sm_90) and linked with cudart, cuBLAS, cuBLASLt and NCCL. Without CUDA, `fallback_srcs`
(plain C that reports "built without CUDA") take their place, so the CPU engine still builds.
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "CUDA_PATH", "NVCC")

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

def cuda_library(name, srcs, hdrs = [], deps = [], fallback_srcs = [], copts = [], nvcc_hdrs = [], **kwargs):
    """srcs: .cu files; hdrs: the C API they implement; nvcc_hdrs: other headers the .cu files include."""
    if not HAS_CUDA:
        native.cc_library(name = name, srcs = fallback_srcs, hdrs = hdrs, deps = deps, **kwargs)
        return
    objects = []
    for src in srcs:
        obj = "_cuda_objs/%s/%s.o" % (name, src.replace("/", "_").replace(".cu", ""))
        native.genrule(
            name = "%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + nvcc_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c",
                "-O3",
                "-std=c++17",
                "-Xcompiler=-fPIC",
                "-I.",
                "-I$(GENDIR)",
                "-isystem " + CUDA_PATH + "/include",
            ] + CUDA_ARCH_FLAGS + copts + ["$(location %s)" % src, "-o $@"]),
            message = "nvcc %s" % src,
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cuda_runtime"],
        **kwargs
    )

def cuda_host_library(name, srcs, fallback_srcs = [], deps = [], **kwargs):
    """C sources (compiled by the C compiler) that call CUDA-backed C APIs, such as the GPU model.

    Where CUDA is installed they build from srcs; elsewhere from fallback_srcs, which implement
    the same header by reporting that this build has no CUDA.
    """
    native.cc_library(
        name = name,
        srcs = srcs if HAS_CUDA else fallback_srcs,
        deps = deps,
        **kwargs
    )
