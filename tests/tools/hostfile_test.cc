// tests/tools/hostfile_test.cc — tools/hostfile.h: Open MPI's hostfile format, its errors (each
// naming FILE:LINE), and the placement of whole tensor-parallel groups on the hosts.
#include "tools/hostfile.h"

#include <gtest/gtest.h>

#include <string>

namespace {

struct Parsed {
  mp_status status;
  std::string message;
  mp_hostfile hostfile;
};

Parsed Parse(const char *text) {
  Parsed parsed{};
  mp_error err = MP_ERROR_INITIALIZER;
  parsed.status = mp_hostfile_parse("hosts.txt", text, &parsed.hostfile, &err);
  parsed.message = err.message;
  return parsed;
}

TEST(Hostfile, ReadsHostsSlotsCommentsAndBlankLines) {
  Parsed p = Parse("# the cluster\n\nnode1 slots=4   # first\n  node2 slots=2 max_slots=8\n");
  ASSERT_EQ(p.status, MP_OK) << p.message;
  ASSERT_EQ(p.hostfile.count, 2);
  EXPECT_STREQ(p.hostfile.hosts[0].name, "node1");
  EXPECT_EQ(p.hostfile.hosts[0].slots, 4);
  EXPECT_EQ(p.hostfile.hosts[0].line, 3);
  EXPECT_STREQ(p.hostfile.hosts[1].name, "node2");
  EXPECT_EQ(p.hostfile.hosts[1].slots, 2);
  EXPECT_EQ(p.hostfile.hosts[1].max_slots, 8);
  EXPECT_EQ(p.hostfile.hosts[1].line, 4);
  mp_hostfile_free(&p.hostfile);
}

TEST(Hostfile, MalformedLineNamesFileAndLine) {
  Parsed p = Parse("node1 slots=4\nnode2 slots=4 gpus=8\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:2:"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("gpus=8"), std::string::npos) << p.message;
  p = Parse("node1,slots=4\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:1:"), std::string::npos) << p.message;
  p = Parse("node1 slots=four\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:1:"), std::string::npos) << p.message;
  p = Parse("node1\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("has no slots=N"), std::string::npos) << p.message;
  p = Parse("# nothing\n\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("names no host"), std::string::npos) << p.message;
}

TEST(Hostfile, ZeroSlotsIsRefused) {
  Parsed p = Parse("node1 slots=4\n\nnode2 slots=0\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:3:"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("slots=0"), std::string::npos) << p.message;
}

TEST(Hostfile, MaxSlotsBelowSlotsIsRefused) {
  Parsed p = Parse("node1 slots=4 max_slots=2\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:1:"), std::string::npos) << p.message;
}

TEST(Hostfile, HostTwiceNamesBothLines) {
  Parsed p = Parse("node1 slots=4\nnode2 slots=4\nnode1 slots=2\n");
  EXPECT_EQ(p.status, MP_ERR_INPUT);
  EXPECT_NE(p.message.find("hosts.txt:3:"), std::string::npos) << p.message;
  EXPECT_NE(p.message.find("first on line 1"), std::string::npos) << p.message;
}

TEST(Hostfile, UnknownHostNamesItsLine) {
  Parsed p = Parse("localhost slots=2\nno-such-host.invalid slots=2\n");
  ASSERT_EQ(p.status, MP_OK) << p.message;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_hostfile_check_resolves(&p.hostfile, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("hosts.txt:2: host no-such-host.invalid does not resolve"),
            std::string::npos)
      << err.message;
  mp_hostfile_free(&p.hostfile);
}

TEST(Placement, FillsHostsInOrderWithWholeTpGroups) {
  Parsed p = Parse("a slots=4\nb slots=4\nc slots=4\n");
  ASSERT_EQ(p.status, MP_OK);
  mp_placement placement;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_hostfile_place(&p.hostfile, 6, 2, &placement, &err), MP_OK) << err.message;
  EXPECT_EQ(placement.first_rank[0], 0);
  EXPECT_EQ(placement.ranks[0], 4);
  EXPECT_EQ(placement.first_rank[1], 4);
  EXPECT_EQ(placement.ranks[1], 2);
  EXPECT_EQ(placement.ranks[2], 0);
  EXPECT_EQ(mp_placement_host_of(&placement, 3), 0);
  EXPECT_EQ(mp_placement_host_of(&placement, 5), 1);
  EXPECT_EQ(mp_placement_host_of(&placement, 6), -1);
  mp_placement_free(&placement);
  mp_hostfile_free(&p.hostfile);
}

TEST(Placement, SkipsSlotsThatCannotHoldAWholeTpGroup) {
  // tp 2: a host of 3 slots takes 2 ranks; the third slot stays idle.
  Parsed p = Parse("a slots=3\nb slots=2\n");
  ASSERT_EQ(p.status, MP_OK);
  mp_placement placement;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_hostfile_place(&p.hostfile, 4, 2, &placement, &err), MP_OK) << err.message;
  EXPECT_EQ(placement.ranks[0], 2);
  EXPECT_EQ(placement.ranks[1], 2);
  EXPECT_EQ(placement.first_rank[1], 2);
  mp_placement_free(&placement);
  mp_hostfile_free(&p.hostfile);
}

TEST(Placement, SlotsThatSplitTpGroupsAreRefusedNamingTheHost) {
  // 6 slots for 6 ranks, but tp 2 fits only 2 + 2 of them whole.
  Parsed p = Parse("a slots=3\nb slots=3\n");
  ASSERT_EQ(p.status, MP_OK);
  mp_placement placement;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_hostfile_place(&p.hostfile, 6, 2, &placement, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("hosts.txt:1: host a has slots=3"), std::string::npos)
      << err.message;
  mp_hostfile_free(&p.hostfile);
}

TEST(Placement, FewerSlotsThanRanksIsRefused) {
  Parsed p = Parse("a slots=2\nb slots=2\n");
  ASSERT_EQ(p.status, MP_OK);
  mp_placement placement;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_hostfile_place(&p.hostfile, 8, 2, &placement, &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("hosts.txt:2: the hosts have 4 slots"),
            std::string::npos)
      << err.message;
  EXPECT_NE(std::string(err.message).find("plan's 8 ranks"), std::string::npos) << err.message;
  mp_hostfile_free(&p.hostfile);
}

}  // namespace
