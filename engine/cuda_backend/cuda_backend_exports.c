/* engine/cuda_backend/cuda_backend_exports.c — the table that libmpengine_cuda.so exports: its one
 * visible symbol (cuda_backend_exports.lds hides the rest), read by cuda_backend_loader.c. */
#include "engine/cuda_backend/cuda_backend_table.h"

#if defined(MP_CUDA_BACKEND_EMULATED)
#define BACKEND_KIND "emulated"
#elif defined(MP_CUDA_BACKEND_NONE)
#define BACKEND_KIND "none"
#else
#define BACKEND_KIND "cuda"
#endif

#define EXPORT_STATUS(name, params, args) .name = name,
#define EXPORT_VALUE(ret, name, params, args, fallback) .name = name,
#define EXPORT_VOID(name, params, args) .name = name,

const mp_cuda_backend_table mp_cuda_backend_table_v1 = {
    .signature = MP_CUDA_BACKEND_SIGNATURE,
    .struct_sizes = MP_CUDA_BACKEND_STRUCT_SIZES,
    .kind = BACKEND_KIND,
    MP_CUDA_BACKEND_FUNCTIONS(EXPORT_STATUS, EXPORT_VALUE, EXPORT_VALUE, EXPORT_VOID)};
