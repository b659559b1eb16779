/* tools/launcher_env.c — the launcher's environment variables; see launcher_env.h. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "tools/launcher_env.h"

#include <sched.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

/* The first of names that is set, as an integer, or fallback. */
static int first_set(const char *const *names, size_t count, int fallback) {
  for (size_t i = 0; i < count; ++i) {
    const char *value = getenv(names[i]);
    if (value != NULL) return atoi(value);
  }
  return fallback;
}

bool launcher_inside_job(void) {
  return getenv("OMPI_COMM_WORLD_SIZE") != NULL || getenv("PMI_SIZE") != NULL ||
         getenv("PMIX_RANK") != NULL;
}

int launcher_local_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
                                      "SLURM_LOCALID", "PMIX_LOCAL_RANK"};
  return first_set(names, sizeof names / sizeof names[0], 0);
}

int launcher_local_size(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                      "SLURM_NTASKS_PER_NODE", "PMIX_LOCAL_SIZE"};
  const int size = first_set(names, sizeof names / sizeof names[0], 1);
  return size > 0 ? size : 1;
}

int launcher_world_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  return first_set(names, sizeof names / sizeof names[0], 0);
}

int launcher_world_size(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  const int size = first_set(names, sizeof names / sizeof names[0], 1);
  return size > 0 ? size : 1;
}

bool launcher_first_rank(void) {
  static const char *const names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
  return first_set(names, sizeof names / sizeof names[0], 0) == 0;
}

int launcher_usable_cores(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? (int)online : 1;
}
