/*
 * tools/run_launcher.h — `mpengine run` started outside an MPI job with a plan of several ranks
 * re-launches itself under mpirun: this is that launcher.
 *
 * It runs `mpirun -np N --oversubscribe [--allow-run-as-root] <this binary> run <same args>` with
 * one machine's defaults unless the user set them (shared-memory transport, no ssh agent, one
 * BLAS / OpenMP thread per core's share), forwards mpirun's stderr byte for byte while reading
 * from it which rank died (Open MPI's "mpirun noticed that process rank N ... exited on signal
 * S"), names that rank in one line, and passes SIGTERM / SIGINT it receives to the ranks as
 * SIGTERM (so they finish the step and save; signalling mpirun would end the job with status 1).
 */
#ifndef MPENGINE_TOOLS_RUN_LAUNCHER_H
#define MPENGINE_TOOLS_RUN_LAUNCHER_H

#include "tools/cli.h"

/* Runs the job of np ranks (argv: the run command's arguments, argv[0] "run") with mpirun and
 * returns the exit code to exit with: mpirun's own (0, 1 or 2), 1 for a lost rank or any other
 * failure, after printing why (a missing mpirun names what to install). */
int run_relaunch(cli_command *command, int argc, char **argv, int np, const char *mpirun);

#endif /* MPENGINE_TOOLS_RUN_LAUNCHER_H */
