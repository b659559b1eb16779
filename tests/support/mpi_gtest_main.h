// tests/support/mpi_gtest_main.h — main() for GoogleTest suites that run on every rank of an
// mpirun job: MPI through engine/comm.h, one group of all ranks, only world rank 0 writes the
// XML report (Bazel's XML_OUTPUT_FILE), and any rank's failure fails every rank, so mpirun's exit
// status and rank 0's report agree.
#ifndef MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H
#define MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H

#include "engine/comm.h"

// Runs every test. Before they run, *world and *all hold the MPI world and the group of all its
// ranks (named "tp"), and ready(all) is called (NULL to skip) to set up what the tests share.
// Returns the process exit code. `name` prefixes messages.
int mp_test_mpi_gtest_main(int argc, char **argv, const char *name, mp_comm_world **world,
                           mp_comm **all, void (*ready)(mp_comm *all));

#endif  // MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H
