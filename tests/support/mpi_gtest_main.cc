// tests/support/mpi_gtest_main.cc — see mpi_gtest_main.h.
#include "tests/support/mpi_gtest_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int mp_test_mpi_gtest_main(int argc, char **argv, const char *name, mp_comm_world **world,
                           mp_comm **all, void (*ready)(mp_comm *all)) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_comm_world_init(&argc, &argv, 60.0, world, &err) != MP_OK) {
    std::fprintf(stderr, "%s: %s\n", name, err.message);
    return 1;
  }
  const int world_rank = mp_comm_world_rank(*world), world_size = mp_comm_world_size(*world);
  std::vector<int> members(world_size);
  for (int i = 0; i < world_size; i++) members[i] = i;
  if (mp_comm_group_create(*world, members.data(), world_size, "tp", all, &err) != MP_OK) {
    std::fprintf(stderr, "%s: rank %d: %s\n", name, world_rank, err.message);
    mp_comm_world_finalize(*world);
    return 1;
  }
  if (ready != nullptr) ready(*all);

  // Only world rank 0 writes the XML report (all ranks would write the same file).
  std::vector<std::string> args(argv, argv + argc);
  unsetenv("GTEST_OUTPUT");
  const char *xml = std::getenv("XML_OUTPUT_FILE");
  if (world_rank == 0 && xml != nullptr && xml[0] != '\0') {
    args.push_back(std::string("--gtest_output=xml:") + xml);
  }
  std::vector<char *> cargs;
  for (auto &a : args) cargs.push_back(&a[0]);
  int cargc = (int)cargs.size();
  cargs.push_back(nullptr);
  ::testing::InitGoogleTest(&cargc, cargs.data());
  std::printf("%s: world rank %d of %d\n", name, world_rank, world_size);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  float failures = (float)failed;
  if (mp_comm_all_reduce_sum_f32(*all, &failures, 1, &err) != MP_OK) {
    std::fprintf(stderr, "%s: rank %d: %s\n", name, world_rank, err.message);
    failures = 1.0f;
  }
  if (failures > 0.0f && world_rank == 0) {
    std::fprintf(stderr, "%s: %d of %d ranks failed\n", name, (int)failures, world_size);
  }
  mp_comm_free(*all);
  mp_comm_world_finalize(*world);
  return failures > 0.0f ? 1 : 0;
}
