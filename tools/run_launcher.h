/*
 * tools/run_launcher.h — `mpengine run` started outside an MPI job with a plan of several ranks
 * re-launches itself under mpirun: this is that launcher.
 *
 * It runs `mpirun -np N --oversubscribe [--allow-run-as-root] <this binary> run <same args>` with
 * one machine's defaults unless the user set them (shared-memory transport, no ssh agent, one
 * BLAS / OpenMP thread per core's share), forwards mpirun's stderr byte for byte while reading
 * from it which rank died (Open MPI 4's "mpirun noticed that process rank N ... exited on signal
 * S", PRRTE's "prterun noticed ..."; and, whatever mpirun prints, the first rank whose process
 * ended without leaving through mpengine's code: run_rank_joined below), names that rank in one
 * line, and passes SIGTERM / SIGINT it receives to the ranks as
 * SIGTERM (so they finish the step and save; signalling mpirun would end the job with status 1).
 */
#ifndef MPENGINE_TOOLS_RUN_LAUNCHER_H
#define MPENGINE_TOOLS_RUN_LAUNCHER_H

#include <stdbool.h>

#include "tools/cli.h"
#include "tools/hostfile.h"

/* Where the job runs. One machine (hostfile NULL): shared-memory transports, no ssh agent,
 * --oversubscribe. On a hostfile's hosts: `--host h1:n1,h2:n2,...` with the ranks the placement
 * puts on each (whole tp groups, in rank order), and nothing of Open MPI's set: its defaults
 * (every transport, tcp included; ssh to reach a host) and the user's OMPI_MCA_* and
 * openmpi-mca-params.conf apply as they would to the user's own mpirun. */
typedef struct {
  const mp_hostfile *hostfile;   /* NULL: this machine */
  const mp_placement *placement; /* with hostfile */
} run_hosts;

/* Runs the job of np ranks (argv: the run command's arguments, argv[0] "run") with mpirun and
 * returns the exit code to exit with: mpirun's own (0, 1 or 2), 1 for a lost rank or any other
 * failure, after printing why (a missing mpirun names what to install; a lost rank with its
 * host; two hosts whose MPI connections were refused, and the fix). *lost (may be NULL) is set
 * when a rank was lost: what `--max-restarts` restarts after. */
int run_relaunch(cli_command *command, int argc, char **argv, int np, const char *mpirun,
                 const run_hosts *hosts, bool *lost);

/* A rank of a job the launcher started says it joined (world_rank) and, at any exit through
 * mpengine's code (exit or return from main; also run at exit), that it is leaving: a process
 * that ends between the two died without a word, and the launcher names it. Nothing outside
 * such a job (no MPENGINE_RANK_DIR). */
void run_rank_joined(int world_rank);
void run_rank_leaving(void);

#endif /* MPENGINE_TOOLS_RUN_LAUNCHER_H */
