/*
 * layers/matmul_internal.h — private to the matmul's CUDA twin (matmul_cuda.cu) and its emulated
 * and no-CUDA stand-ins (cuda_gemm_emulated.c, cuda_gemm_none.c): the dbias reduction's scratch
 * layout, as plain C, so that every build reports the same scratch size from one definition.
 */
#ifndef MPENGINE_LAYERS_MATMUL_INTERNAL_H
#define MPENGINE_LAYERS_MATMUL_INTERNAL_H

#include <stddef.h>

/* Rows of dout that one block of the dbias reduction sums into one partial per channel. */
enum { MP_MATMUL_DBIAS_ROWS = 128 };

static inline size_t mp_matmul_dbias_row_blocks(int BT) {
  return BT > 0 ? ((size_t)BT + MP_MATMUL_DBIAS_ROWS - 1) / MP_MATMUL_DBIAS_ROWS : 0;
}

#endif /* MPENGINE_LAYERS_MATMUL_INTERNAL_H */
