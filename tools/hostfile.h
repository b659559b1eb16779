/*
 * tools/hostfile.h — the hostfile of `mpengine run --hostfile FILE`: reading it, and placing the
 * plan's ranks on its hosts.
 *
 * The format is Open MPI's (DeepSpeed's is the same): one host a line,
 *     node1 slots=4            # four ranks may run on node1
 *     node2 slots=4 max_slots=8
 * with `#` comments and blank lines. Unlike mpirun, which counts a host's cores when `slots=` is
 * missing, mpengine needs the number before it reaches any host (it places whole tensor-parallel
 * groups), so `slots=N` is required. Every error is MP_ERR_INPUT naming FILE:LINE and the fix.
 *
 * Placement keeps every tensor-parallel group inside one host: ranks are ordered tp fastest
 * (topology/grid.h, Megatron's order), so a tp group is tp consecutive ranks, and hosts are
 * filled in the file's order, each with as many whole tp groups as its slots hold.
 */
#ifndef MPENGINE_TOOLS_HOSTFILE_H
#define MPENGINE_TOOLS_HOSTFILE_H

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_HOSTFILE_NAME_BYTES = 256 };

typedef struct {
  char name[MP_HOSTFILE_NAME_BYTES];
  int slots;     /* >= 1 */
  int max_slots; /* 0 when not given, else >= slots */
  int line;      /* 1-based line of the file that names it */
} mp_hostfile_host;

typedef struct {
  char path[4096];
  mp_hostfile_host *hosts; /* (count) in the file's order */
  int count;
} mp_hostfile;

/* Where the ranks run: host h (an index into the hostfile) runs ranks first_rank[h] ..
 * first_rank[h] + ranks[h] - 1; hosts after the last used one run none. */
typedef struct {
  int host_count;
  int *first_rank; /* (host_count) */
  int *ranks;      /* (host_count) */
} mp_placement;

/* Parses text (the contents of the file at path, which only names it in messages). MP_ERR_INPUT
 * for a malformed line, a missing or non-positive slots=, max_slots < slots, a host named twice,
 * or a file that names no host. */
mp_status mp_hostfile_parse(const char *path, const char *text, mp_hostfile *out, mp_error *err);

/* Reads and parses the file at path (MP_ERR_INPUT when it cannot be read). */
mp_status mp_hostfile_read(const char *path, mp_hostfile *out, mp_error *err);

/* Checks that every host's name resolves (getaddrinfo): MP_ERR_INPUT naming the first that does
 * not, with its line. */
mp_status mp_hostfile_check_resolves(const mp_hostfile *hostfile, mp_error *err);

/* Places world ranks, tp to a group, on the hosts (see above). MP_ERR_INPUT when the slots cannot
 * hold them all in whole tp groups: naming a host whose slots are not a multiple of tp when
 * that is what falls short, else the file and the slots it has against the ranks it needs. */
mp_status mp_hostfile_place(const mp_hostfile *hostfile, int world, int tp, mp_placement *out,
                            mp_error *err);

/* The index of the host that runs rank, or -1. */
int mp_placement_host_of(const mp_placement *placement, int rank);

void mp_placement_free(mp_placement *placement);
void mp_hostfile_free(mp_hostfile *hostfile);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOOLS_HOSTFILE_H */
