/*
 * layers/flash_attention_ptx.cuh — private to layers/flash_attention_cuda.cu: the warp-level
 * tensor-core, shared-memory and asynchronous-copy instructions of the fused attention kernels,
 * one inline function each, so the kernels read as tile math and this is the only place with PTX.
 *
 * Fragment layouts (PTX ISA, "mma.m16n8k16" with .bf16, and "ldmatrix"), for lane L of a warp,
 * g = L / 4 (the group) and q = L % 4 (the thread in the group):
 *   A (16 x 16, row-major) in 4 registers of 2 bf16:  {A[g][2q..2q+1], A[g+8][2q..2q+1],
 *                                                      A[g][2q+8..2q+9], A[g+8][2q+8..2q+9]}
 *   B (16 x 8, k x n)      in 2 registers of 2 bf16:  {B[2q..2q+1][g], B[2q+8..2q+9][g]}
 *   C, D (16 x 8, fp32)    in 4 floats:               {C[g][2q], C[g][2q+1], C[g+8][2q], C[g+8][2q+1]}
 * ldmatrix .x4 loads four 8 x 8 bf16 matrices; lane L gives the address of row L % 8 of matrix
 * L / 8, and register j receives row g, columns 2q..2q+1 of matrix j (with .trans: rows 2q..2q+1
 * of column g, i.e. the matrix transposed). The lower 16 bits of a register hold the element with
 * the lower column (or k) index.
 *
 * Needs sm_80 or newer (mma.sync bf16, ldmatrix, cp.async); the build targets sm_80 and sm_90.
 */
#ifndef MPENGINE_LAYERS_FLASH_ATTENTION_PTX_CUH
#define MPENGINE_LAYERS_FLASH_ATTENTION_PTX_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

// D (16 x 8, fp32) += A (16 x 16, bf16) @ B (16 x 8, bf16), one warp, fp32 accumulation.
static __device__ __forceinline__ void mp_mma_bf16_16x8x16(float (&d)[4], const uint32_t (&a)[4],
                                                           uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8 x 8 bf16 matrices from shared memory; `row` is this lane's row address (16 bytes,
// 16-byte aligned).
static __device__ __forceinline__ void mp_ldmatrix_x4(uint32_t (&r)[4], const void *row) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// The same, each matrix transposed on the way into registers.
static __device__ __forceinline__ void mp_ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// 16 bytes global -> shared without passing through registers (both 16-byte aligned); when
// `valid` is false nothing is read and the 16 bytes of shared memory are zeroed.
static __device__ __forceinline__ void mp_cp_async_16(void *shared, const void *global,
                                                      bool valid) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 16 : 0));
}

// 4 bytes global -> shared (both 4-byte aligned); zeroed when `valid` is false.
static __device__ __forceinline__ void mp_cp_async_4(void *shared, const void *global, bool valid) {
  const unsigned address = (unsigned)__cvta_generic_to_shared(shared);
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(address), "l"(global),
               "r"(valid ? 4 : 0));
}

// Closes the group of copies this thread issued since the last commit (an empty group is fine).
static __device__ __forceinline__ void mp_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `Pending` of this thread's committed groups are still in flight. Other
// threads' copies are visible only after a __syncthreads() that follows this.
template <int Pending>
static __device__ __forceinline__ void mp_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Two floats rounded to bf16 (nearest even) in one register, `lo` in the lower 16 bits.
static __device__ __forceinline__ uint32_t mp_pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 pair = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t *>(&pair);
}

// The block's dynamic shared memory (sized at launch), 16-byte aligned.
static __device__ __forceinline__ unsigned char *mp_flash_shared_memory() {
  extern __shared__ __align__(16) unsigned char mp_flash_shared[];
  return mp_flash_shared;
}

#endif  // MPENGINE_LAYERS_FLASH_ATTENTION_PTX_CUH
