"""cuda_library: CUDA sources compiled by nvcc through a genrule, wherever CUDA is installed.

On a machine with /usr/local/cuda (GPU or not) the .cu files are compiled for Ampere (sm_80) and
Hopper (sm_90) and linked with cudart, cuBLAS, cuBLASLt and NCCL. Without CUDA, `fallback_srcs`
(plain C that reports "built without CUDA") take their place, so the CPU engine still builds.

`bazel ... --define mpengine_cuda=emulated` builds every CUDA C API from `emulation_srcs` instead:
plain C that runs the same calls on the CPU ("device" memory is host memory, bf16 stays bf16), so
the GPU code paths above the kernels (the GPU models, the trainer, mpengine run --backend cuda)
run and are tested on machines without a GPU. A library without emulation_srcs uses its
fallback_srcs there (NCCL, for one, is absent).
"""

load("@local_cuda//:defs.bzl", "HAS_CUDA", "CUDA_PATH", "NVCC")

CUDA_ARCH_FLAGS = [
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
]

EMULATED = "//third_party:emulated_cuda"

def cuda_library(name, srcs, hdrs = [], deps = [], fallback_srcs = [], copts = [], nvcc_hdrs = [], emulation_srcs = None, **kwargs):
    """srcs: .cu files; hdrs: the C API they implement; nvcc_hdrs: other headers the .cu files include."""
    emulated = emulation_srcs if emulation_srcs != None else fallback_srcs
    if not HAS_CUDA:
        native.cc_library(
            name = name,
            srcs = select({EMULATED: emulated, "//conditions:default": fallback_srcs}),
            hdrs = hdrs,
            deps = deps,
            **kwargs
        )
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
        srcs = select({EMULATED: emulated, "//conditions:default": objects}),
        hdrs = hdrs,
        deps = deps + select({EMULATED: [], "//conditions:default": ["@local_cuda//:cuda_runtime"]}),
        **kwargs
    )

def cuda_host_library(name, srcs, fallback_srcs = [], deps = [], **kwargs):
    """C sources (compiled by the C compiler) that call CUDA-backed C APIs, such as the GPU model.

    Where CUDA is installed they build from srcs; elsewhere from fallback_srcs, which implement
    the same header by reporting that this build has no CUDA.
    """
    native.cc_library(
        name = name,
        srcs = select({EMULATED: srcs, "//conditions:default": srcs if HAS_CUDA else fallback_srcs}),
        deps = deps,
        **kwargs
    )
