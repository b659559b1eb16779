// tests/common/atomic_file_test.cc — files users name are written whole or not at all.
#include "common/atomic_file.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <dirent.h>

namespace {

std::string temp_dir() {
  const char *dir = getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string read(const std::string &path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

int files_in(const std::string &dir) {
  DIR *d = opendir(dir.c_str());
  int n = 0;
  for (dirent *e = readdir(d); e != nullptr; e = readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(d);
  return n;
}

TEST(AtomicFile, ReplacesWholeAndLeavesNoTemporary) {
  const std::string dir = temp_dir() + "/atomic";
  system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string path = dir + "/out.txt";
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_write_file_atomically(path.c_str(), "old", 3, &err), MP_OK) << err.message;
  mp_atomic_file file;
  ASSERT_EQ(mp_atomic_file_open(&file, path.c_str(), &err), MP_OK);
  mp_atomic_file_write(&file, "new ", 4);
  EXPECT_EQ(read(path), "old");  // nothing visible before the commit
  mp_atomic_file_write(&file, "text", 4);
  ASSERT_EQ(mp_atomic_file_commit(&file, &err), MP_OK) << err.message;
  EXPECT_EQ(read(path), "new text");
  EXPECT_EQ(files_in(dir), 1);
}

TEST(AtomicFile, AbortKeepsTheOldContents) {
  const std::string dir = temp_dir() + "/atomic_abort";
  system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  const std::string path = dir + "/out.txt";
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_write_file_atomically(path.c_str(), "kept", 4, &err), MP_OK);
  mp_atomic_file file;
  ASSERT_EQ(mp_atomic_file_open(&file, path.c_str(), &err), MP_OK);
  mp_atomic_file_write(&file, "lost", 4);
  mp_atomic_file_abort(&file);
  EXPECT_EQ(read(path), "kept");
  EXPECT_EQ(files_in(dir), 1);
}

TEST(AtomicFile, MissingDirectoryIsAnInputError) {
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_write_file_atomically("/nonexistent-dir/x", "a", 1, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), "/nonexistent-dir/x: cannot create: No such file or directory");
}

}  // namespace
