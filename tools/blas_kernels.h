/*
 * tools/blas_kernels.h — make OpenBLAS use the vector kernels this CPU has.
 *
 * Debian's OpenBLAS (0.3.21) picks its kernels at load time from the CPU model; on CPUs newer
 * than it knows (Sapphire Rapids, as on our CI machines) it falls back to the SSE3 "Prescott"
 * kernels, two to three times slower than the AVX-512 ones the CPU runs fine. The choice can only
 * be made through OPENBLAS_CORETYPE before the library loads, so when OpenBLAS reports the
 * fallback and the CPU has AVX-512 or AVX2, mpengine sets it and re-executes itself once. A
 * user's own OPENBLAS_CORETYPE is always respected.
 */
#ifndef MPENGINE_TOOLS_BLAS_KERNELS_H
#define MPENGINE_TOOLS_BLAS_KERNELS_H

/* Returns when nothing is to be done or the re-exec failed (then the slow kernels stay). */
void tools_select_blas_kernels(char **argv);

#endif /* MPENGINE_TOOLS_BLAS_KERNELS_H */
