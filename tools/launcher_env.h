/*
 * tools/launcher_env.h — what the MPI launcher (mpirun, srun or another PMI launcher) tells a
 * process through its environment, read before MPI starts: whether it is inside a job, its rank
 * among the ranks of its node (which GPU it takes), and whether it is the job's first rank (the
 * one that prints errors met before MPI starts); and the cores the process may use.
 */
#ifndef MPENGINE_TOOLS_LAUNCHER_ENV_H
#define MPENGINE_TOOLS_LAUNCHER_ENV_H

#include <stdbool.h>

/* True inside a job started by Open MPI's mpirun, or by srun / another PMI launcher. */
bool launcher_inside_job(void);

/* This process's index among the ranks of its node; 0 outside a job. */
int launcher_local_rank(void);

/* The number of the job's ranks on this node; 1 outside a job or when the launcher does not say. */
int launcher_local_size(void);

/* This process's rank in the job and the job's size, as the launcher says (0 and 1 outside a
 * job): what a rank reports errors met before MPI's world is up with. */
int launcher_world_rank(void);
int launcher_world_size(void);

/* False only when the launcher says this is a rank other than 0. */
bool launcher_first_rank(void);

/* The processor cores this process may run on (sched_getaffinity, else the online ones; at least
 * 1): what `run` divides among the ranks it starts, and what `calibrate` writes as
 * cores_per_node. */
int launcher_usable_cores(void);

#endif /* MPENGINE_TOOLS_LAUNCHER_ENV_H */
