// tests/tools/doctor_report_test.cc — the pure parts of `mpengine doctor` (tools/doctor_report.h).
#include "tools/doctor_report.h"

#include <errno.h>
#include <string.h>

#include <gtest/gtest.h>

TEST(DoctorReport, FactsRoundTrip) {
  mp_doctor_facts facts;
  memset(&facts, 0, sizeof facts);
  strcpy(facts.host, "node1");
  strcpy(facts.hostname, "node1");
  strcpy(facts.version, "0.1.0");
  strcpy(facts.build, "0123456789abcdef");
  strcpy(facts.mpi, "Open MPI v4.1.4");
  strcpy(facts.nccl, "none");
  strcpy(facts.cuda_driver, "12.4");
  facts.gpus = 8;
  facts.gpu_memory_bytes = 85899345920;
  facts.free_memory_bytes = 123456789;
  strcpy(facts.address, "10.88.0.11");
  facts.address_local = true;
  strcpy(facts.interface, "eth0");
  strcpy(facts.interface_address, "10.88.0.11");
  strcpy(facts.interface_rule, "NCCL_SOCKET_IFNAME=eth");
  facts.port = 40123;
  char line[4096];
  ASSERT_TRUE(mp_doctor_facts_format(&facts, line, sizeof line));
  EXPECT_EQ(strchr(line, '\n'), nullptr);
  mp_doctor_facts back;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_doctor_facts_parse(line, "node1", &back, &err), MP_OK) << err.message;
  EXPECT_EQ(memcmp(&facts, &back, sizeof facts), 0);
  EXPECT_FALSE(mp_doctor_facts_format(&facts, line, 20));
}

TEST(DoctorReport, ParseRejectsOtherOutput) {
  mp_doctor_facts facts;
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(mp_doctor_facts_parse("bash: mpengine: command not found", "node2", &facts, &err),
            MP_ERR_RUNTIME);
  EXPECT_NE(strstr(err.message, "node2"), nullptr);
  EXPECT_EQ(mp_doctor_facts_parse("{\"host\":\"node2\"}", "node2", &facts, &err), MP_ERR_RUNTIME);
}

TEST(DoctorReport, ConnectOutcomes) {
  EXPECT_STREQ(mp_doctor_connect_outcome(ECONNREFUSED), "refused");
  EXPECT_STREQ(mp_doctor_connect_outcome(EHOSTUNREACH), "no route");
  EXPECT_STREQ(mp_doctor_connect_outcome(ENETUNREACH), "no route");
  EXPECT_STREQ(mp_doctor_connect_outcome(EACCES), "no route");
  EXPECT_STREQ(mp_doctor_connect_outcome(ETIMEDOUT), "timed out");
}

TEST(DoctorReport, Loopback) {
  EXPECT_TRUE(mp_doctor_is_loopback("127.0.1.1"));
  EXPECT_TRUE(mp_doctor_is_loopback("127.0.0.1"));
  EXPECT_TRUE(mp_doctor_is_loopback("::1"));
  EXPECT_TRUE(mp_doctor_is_loopback("::ffff:127.0.1.1"));
  EXPECT_FALSE(mp_doctor_is_loopback("10.88.0.11"));
  EXPECT_FALSE(mp_doctor_is_loopback("fe80::1"));
}

TEST(DoctorReport, InterfaceSpecs) {
  EXPECT_TRUE(mp_doctor_interface_matches("10.88.0.0/24", "eth0", "10.88.0.11"));
  EXPECT_FALSE(mp_doctor_interface_matches("10.88.0.0/24", "eth1", "10.89.0.11"));
  EXPECT_TRUE(mp_doctor_interface_matches("eth", "eth0", "1.2.3.4"));
  EXPECT_TRUE(mp_doctor_interface_matches("ib,eth", "eth1", "1.2.3.4"));
  EXPECT_FALSE(mp_doctor_interface_matches("=eth", "eth0", "1.2.3.4"));
  EXPECT_TRUE(mp_doctor_interface_matches("=eth0", "eth0", "1.2.3.4"));
  EXPECT_FALSE(mp_doctor_interface_matches("^docker,lo", "docker0", "1.2.3.4"));
  EXPECT_TRUE(mp_doctor_interface_matches("^docker,lo", "eth0", "1.2.3.4"));
}

TEST(DoctorReport, SameValue) {
  const char *hosts[] = {"node1", "node2", "node3"};
  const char *same[] = {"2.27.3", "2.27.3", "2.27.3"};
  const char *differ[] = {"2.27.3", "none", "2.27.3"};
  char line[256];
  EXPECT_TRUE(mp_doctor_same_value(hosts, same, 3, line, sizeof line));
  EXPECT_STREQ(line, "2.27.3 on every host");
  EXPECT_FALSE(mp_doctor_same_value(hosts, differ, 3, line, sizeof line));
  EXPECT_STREQ(line, "node1, node3: 2.27.3; node2: none");
}
