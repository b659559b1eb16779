// tests/support/mpi_gtest_main.h — main() for GoogleTest suites that run on every rank of an
// mpirun job: MPI through engine/comm/comm.h, one group of all ranks, only world rank 0 writes the
// XML report (Bazel's XML_OUTPUT_FILE), with every rank's failures in it, and any rank's failure
// fails every rank, so mpirun's exit status and rank 0's report agree.
#ifndef MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H
#define MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H

#include "engine/comm/comm.h"

// Runs every test. Before they run, *world and *all hold the MPI world and the group of all its
// ranks (named "tp"), and ready(all) is called (NULL to skip) to set up what the tests share.
// Returns the process exit code. `name` prefixes messages.
int mp_test_mpi_gtest_main(int argc, char **argv, const char *name, mp_comm_world **world,
                           mp_comm **all, void (*ready)(mp_comm *all));

// For a main of its own: call on every rank before ::testing::InitGoogleTest (which installs
// the XML writer from the flag). Rank 0 writes Bazel's XML report (XML_OUTPUT_FILE) and no other
// rank does: GoogleTest reads that variable on every rank by itself, so the ranks raced to write
// one file and the last one's results were the report.
void mp_test_xml_on_rank_zero_only(int world_rank);

// For a main of its own: call on every rank of `all` (every world rank, group rank = world rank)
// after RUN_ALL_TESTS. Each rank sends rank 0 the names of the tests that failed on it and its
// first failure's place and message; rank 0 marks those tests failed in its XML report ("on
// rank R: FILE:LINE: MESSAGE"), so a test that failed on any rank counts as failed there (and
// in tools/test.sh's count). Returns false, having printed why, when the exchange or the
// rewrite fails.
bool mp_test_report_every_rank(mp_comm *all, int world_rank, int world_size, const char *name);

#endif  // MPENGINE_TESTS_SUPPORT_MPI_GTEST_MAIN_H
