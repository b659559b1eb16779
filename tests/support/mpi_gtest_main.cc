// tests/support/mpi_gtest_main.cc — see mpi_gtest_main.h.
#include "tests/support/mpi_gtest_main.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace {

// The XML report's path: Bazel's XML_OUTPUT_FILE, read once before GoogleTest is told to ignore
// it on ranks other than 0.
std::string g_xml_path;

std::string xml_escape(const std::string &text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n': out += "&#x0A;"; break;
      default: out += c;
    }
  }
  return out;
}

// "Suite.Name\tFILE:LINE: MESSAGE\n" for each test that failed on this rank (its first failure;
// tabs and newlines in the message become spaces).
std::string failed_tests() {
  std::string out;
  const ::testing::UnitTest *unit = ::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit->total_test_suite_count(); ++s) {
    const ::testing::TestSuite *suite = unit->GetTestSuite(s);
    for (int t = 0; t < suite->total_test_count(); ++t) {
      const ::testing::TestInfo *info = suite->GetTestInfo(t);
      const ::testing::TestResult *result = info->result();
      if (!result->Failed()) continue;
      std::string message = "failed";
      for (int p = 0; p < result->total_part_count(); ++p) {
        const ::testing::TestPartResult &part = result->GetTestPartResult(p);
        if (!part.failed()) continue;
        message = std::string(part.file_name() ? part.file_name() : "?") + ":" +
                  std::to_string(part.line_number()) + ": " + part.message();
        break;
      }
      for (char &c : message) {
        if (c == '\t' || c == '\n') c = ' ';
      }
      out += std::string(suite->name()) + "." + info->name() + "\t" + message + "\n";
    }
  }
  return out;
}

// The value of attribute `key` in an XML start tag, or "".
std::string attribute(const std::string &tag, const std::string &key) {
  const std::string needle = " " + key + "=\"";
  size_t at = tag.find(needle);
  if (at == std::string::npos) return "";
  at += needle.size();
  size_t end = tag.find('"', at);
  return end == std::string::npos ? "" : tag.substr(at, end - at);
}

// Adds `added` to the failures="N" attribute of a <testsuite(s) line.
void add_failures(std::string *line, int added) {
  const std::string key = " failures=\"";
  size_t at = line->find(key);
  if (at == std::string::npos || added == 0) return;
  at += key.size();
  size_t end = line->find('"', at);
  if (end == std::string::npos) return;
  const int count = std::atoi(line->substr(at, end - at).c_str()) + added;
  line->replace(at, end - at, std::to_string(count));
}

// Rewrites rank 0's report: each test in `elsewhere` (full name -> failure lines) gets a
// <failure> element per rank it failed on, and the failure counts grow by the tests that were
// not already failed here.
bool mark_failed(const std::string &path, const std::map<std::string, std::vector<std::string>>
                                              &elsewhere,
                 const char *name) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read the XML report %s\n", name, path.c_str());
    return false;
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  in.close();
  // Which tests newly fail, per suite (a <testsuite> line comes before its test cases).
  std::map<std::string, int> added_per_suite;
  int added = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string &line = lines[i];
    if (line.find("<testcase ") == std::string::npos) continue;
    const std::string full = attribute(line, "classname") + "." + attribute(line, "name");
    if (elsewhere.count(full) == 0) continue;
    const bool already = i + 1 < lines.size() && line.find("/>") == std::string::npos &&
                         lines[i + 1].find("<failure") != std::string::npos;
    if (!already) {
      ++added_per_suite[attribute(line, "classname")];
      ++added;
    }
  }
  std::ostringstream out;
  for (std::string line : lines) {
    if (line.find("<testsuites ") != std::string::npos) add_failures(&line, added);
    if (line.find("<testsuite ") != std::string::npos) {
      add_failures(&line, added_per_suite[attribute(line, "name")]);
    }
    if (line.find("<testcase ") == std::string::npos) {
      out << line << "\n";
      continue;
    }
    const std::string full = attribute(line, "classname") + "." + attribute(line, "name");
    auto found = elsewhere.find(full);
    if (found == elsewhere.end()) {
      out << line << "\n";
      continue;
    }
    const size_t indent = line.find('<');
    const std::string pad = line.substr(0, indent) + "  ";
    const size_t self_closing = line.rfind("/>");
    const bool closed = self_closing != std::string::npos &&
                        line.find_first_not_of(" \t", self_closing + 2) == std::string::npos;
    // A test skipped on rank 0 but failed elsewhere is a failure, not a skip.
    size_t skipped = line.find("result=\"skipped\"");
    if (skipped != std::string::npos) line.replace(skipped, 16, "result=\"completed\"");
    if (closed) line = line.substr(0, self_closing) + ">";
    out << line << "\n";
    for (const std::string &failure : found->second) {
      out << pad << "<failure message=\"" << xml_escape(failure) << "\" type=\"\"></failure>\n";
    }
    if (closed) out << line.substr(0, indent) << "</testcase>\n";
  }
  const std::string temporary = path + ".tmp";
  std::ofstream file(temporary);
  file << out.str();
  file.close();
  if (!file || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "%s: cannot rewrite the XML report %s\n", name, path.c_str());
    return false;
  }
  return true;
}

}  // namespace

void mp_test_xml_on_rank_zero_only(int world_rank) {
  const char *xml = std::getenv("XML_OUTPUT_FILE");
  g_xml_path = xml != nullptr ? xml : "";
  if (world_rank == 0) {
    if (!g_xml_path.empty()) GTEST_FLAG_SET(output, "xml:" + g_xml_path);
  } else {
    GTEST_FLAG_SET(output, "");
  }
}

bool mp_test_report_every_rank(mp_comm *all, int world_rank, int world_size, const char *name) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (world_rank != 0) {
    const std::string mine = failed_tests();
    const uint64_t bytes = mine.size();
    if (mp_comm_send(all, &bytes, sizeof bytes, 0, &err) != MP_OK ||
        (bytes > 0 && mp_comm_send(all, mine.data(), bytes, 0, &err) != MP_OK)) {
      std::fprintf(stderr, "%s: rank %d: cannot send its results to rank 0: %s\n", name,
                   world_rank, err.message);
      return false;
    }
    return true;
  }
  std::map<std::string, std::vector<std::string>> elsewhere;
  bool ok = true;
  for (int r = 1; r < world_size; ++r) {
    uint64_t bytes = 0;
    std::string theirs;
    if (mp_comm_recv(all, &bytes, sizeof bytes, r, &err) == MP_OK) {
      theirs.resize(bytes);
      if (bytes > 0 && mp_comm_recv(all, &theirs[0], bytes, r, &err) != MP_OK) bytes = UINT64_MAX;
    } else {
      bytes = UINT64_MAX;
    }
    if (bytes == UINT64_MAX) {
      std::fprintf(stderr, "%s: no results from rank %d: %s\n", name, r, err.message);
      ok = false;
      continue;
    }
    std::istringstream lines(theirs);
    for (std::string line; std::getline(lines, line);) {
      const size_t tab = line.find('\t');
      if (tab == std::string::npos) continue;
      elsewhere[line.substr(0, tab)].push_back("on rank " + std::to_string(r) + ": " +
                                               line.substr(tab + 1));
      std::fprintf(stderr, "%s: %s failed on rank %d\n", name, line.substr(0, tab).c_str(), r);
    }
  }
  if (!elsewhere.empty() && !g_xml_path.empty()) ok = mark_failed(g_xml_path, elsewhere, name) && ok;
  return ok;
}

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

  mp_test_xml_on_rank_zero_only(world_rank);
  ::testing::InitGoogleTest(&argc, argv);
  std::printf("%s: world rank %d of %d\n", name, world_rank, world_size);
  const int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;

  float failures = (float)failed;
  if (!mp_test_report_every_rank(*all, world_rank, world_size, name)) failures += 1.0f;
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
