/*
 * tools/build_id.h — which build of mpengine this process is: a hash of its own executable file.
 *
 * `mpengine version` prints it and `mpengine doctor` compares it across hosts. The version string
 * (tools/version.h) only changes when someone bumps it; two builds of different sources share it.
 * The executable's bytes change with every source change and every build option, so hashing them
 * tells builds apart with no step in the build (a stamped id would need Bazel's workspace status,
 * which changes every action's key). Any change to the file, even one byte appended, is another
 * build: the doctor test makes "another build" for one host exactly so.
 */
#ifndef MPENGINE_TOOLS_BUILD_ID_H
#define MPENGINE_TOOLS_BUILD_ID_H

#include <stddef.h>

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_BUILD_ID_BYTES = 17 }; /* 16 hex digits and the NUL */

/* 64-bit FNV-1a of the file at path, as 16 lowercase hex digits. MP_ERR_RUNTIME naming the path
 * when it cannot be read. */
mp_status mp_build_id_of_file(const char *path, char out[MP_BUILD_ID_BYTES], mp_error *err);

/* The same for this process's executable (/proc/self/exe). */
mp_status mp_build_id(char out[MP_BUILD_ID_BYTES], mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOOLS_BUILD_ID_H */
