/*
 * tools/doctor_report.h — the pure parts of `mpengine doctor`: what an agent reports about its host
 * (one JSON line), how a failed connection is named, which interface a network setting selects,
 * and the line that compares one value across hosts.
 *
 * Kept apart from the sockets and processes of tools/cmd_doctor.c so that tests can check them
 * with no network: the words "refused", "no route" and "timed out" are what a user acts on.
 */
#ifndef MPENGINE_TOOLS_DOCTOR_REPORT_H
#define MPENGINE_TOOLS_DOCTOR_REPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "tools/build_id.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What `mpengine doctor --agent` finds on its host, sent to the doctor as one JSON line with
 * these names as keys. Strings say "none" for a library that is not there, so that "none"
 * compares like any version. */
typedef struct {
  char host[256];              /* the name the hostfile gives (the doctor's name for it) */
  char hostname[256];          /* the host's own name (gethostname) */
  char version[32];            /* MPENGINE_VERSION */
  char build[MP_BUILD_ID_BYTES];
  char mpi[128];               /* "Open MPI v4.1.4"; "none" */
  char nccl[32];               /* "2.27.3"; "none" */
  char cuda_driver[32];        /* "12.4"; "none" */
  int gpus;
  int64_t gpu_memory_bytes;    /* the smallest GPU's; 0 without GPUs */
  int64_t free_memory_bytes;   /* MemAvailable */
  char address[64];            /* the host's own name resolved on the host; "" when it does not */
  bool address_local;          /* that address belongs to one of the host's interfaces */
  char interface[64];          /* the interface MPI and NCCL will use; "" when none matched */
  char interface_address[64];  /* its IPv4 address, where the agent listens */
  char interface_rule[256];    /* what chose it, for messages */
  int port;                    /* the agent's listener */
} mp_doctor_facts;

/* The facts as one line of JSON (no newline) in out; false when out is too small. */
bool mp_doctor_facts_format(const mp_doctor_facts *facts, char *out, size_t bytes);

/* Parses such a line; source names it in messages (the host). MP_ERR_RUNTIME when it is not the
 * agent's JSON (another program's output, an agent of another mpengine that speaks otherwise). */
mp_status mp_doctor_facts_parse(const char *line, const char *source, mp_doctor_facts *out,
                                mp_error *err);

/* A failed TCP connect's errno in the words doctor prints: "refused" (ECONNREFUSED: the host
 * answered, nothing listens or a firewall rejects), "no route" (EHOSTUNREACH, ENETUNREACH,
 * EACCES/EPERM from a prohibit route or a rejecting rule), "timed out" (ETIMEDOUT: the packets
 * vanished, a dropping firewall); else strerror's text. */
const char *mp_doctor_connect_outcome(int error_number);

/* True for 127.0.0.0/8, ::1 and an IPv4-mapped loopback: addresses no other host reaches. */
bool mp_doctor_is_loopback(const char *address);

/* Whether an interface (name, IPv4 address text) is selected by spec, a comma-separated list in
 * the forms Open MPI's btl_tcp_if_include and NCCL_SOCKET_IFNAME take: an address range
 * "10.88.0.0/24", a name prefix "eth" (NCCL matches prefixes), "=eth0" an exact name; a spec
 * starting with '^' excludes what the rest matches instead. */
bool mp_doctor_interface_matches(const char *spec, const char *name, const char *ipv4);

/* Compares values[i] of hosts[i] (n >= 1). Returns true when all are equal, writing "VALUE on
 * every host" to out; else false, writing each distinct value with the hosts that have it:
 * "node1: 0.1.0; node2: 0.2.0". */
bool mp_doctor_same_value(const char *const *hosts, const char *const *values, int n, char *out,
                          size_t bytes);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOOLS_DOCTOR_REPORT_H */
