/*
 * tools/cmd_doctor.c — `mpengine doctor`: checks a cluster of hosts before a job spends it.
 *
 *   mpengine doctor [--hostfile FILE | inside a Slurm allocation] [--config PLAN.json]
 *                   [--out CLUSTER.json]
 *
 * Doctor must work where MPI does not (that is when it is needed), so it does not use mpirun to
 * reach the hosts: it starts `mpengine doctor --agent` (tools/doctor_agent.h) on every host
 * through the remote shell mpirun would use (OMPI_MCA_plm_rsh_agent, else ssh), reads each
 * agent's facts, and has the agents open TCP connections to each other and time their links.
 * Only the all-reduce goes through mpirun (`mpengine bench comm`), after the TCP checks passed:
 * it is the path the job will take. Every step has a deadline, and every agent is killed at the
 * end. One line per check, PASS or FAIL, naming the hosts and the fix; exit 0 only when all pass.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/atomic_file.h"
#include "tools/cli.h"
#include "tools/commands.h"
#include "tools/doctor_agent.h"
#include "tools/doctor_report.h"
#include "tools/hostfile.h"
#include "topology/cluster.h"

/* Deadlines, in seconds; on two hosts the whole run stays well under a minute even when every
 * step runs to its deadline (start 15 + connect 5 + the rest on a healthy link). */
enum { kStartDeadlineS = 15, kConnectTimeoutMs = 5000, kReplyDeadlineS = 10,
       kMeasureDeadlineS = 15, kAllReduceDeadlineS = 25 };
static const double kMaxClockSkewS = 0.5; /* traces of different hosts line up within it */

typedef struct {
  char name[MP_HOSTFILE_NAME_BYTES];
  int slots;
  pid_t pid;
  int to_agent, from_agent, agent_errors;
  char buffer[1 << 16];
  size_t buffered;
  bool answered; /* facts read */
  mp_doctor_facts facts;
  char errors[512]; /* the start of what the remote shell said on stderr */
} doctor_host;

static int g_failures = 0;

static void report(bool pass, const char *check, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
static void report(bool pass, const char *check, const char *format, ...) {
  if (!pass) ++g_failures;
  printf("%s %-11s ", pass ? "PASS" : "FAIL", check);
  va_list args;
  va_start(args, format);
  vprintf(format, args);
  va_end(args);
  printf("\n");
  fflush(stdout);
}

static double now(void) { return cli_now_seconds(); }

/* Reads one line from the agent before the deadline (monotonic seconds); false on timeout/EOF. */
static bool read_line(doctor_host *host, double deadline, char *line, size_t bytes) {
  for (;;) {
    char *newline = memchr(host->buffer, '\n', host->buffered);
    if (newline != NULL) {
      const size_t length = (size_t)(newline - host->buffer);
      snprintf(line, bytes, "%.*s", (int)length, host->buffer);
      memmove(host->buffer, newline + 1, host->buffered - length - 1);
      host->buffered -= length + 1;
      return true;
    }
    const int left_ms = (int)((deadline - now()) * 1000.0);
    if (left_ms <= 0 || host->from_agent < 0 || host->buffered >= sizeof host->buffer - 1) {
      return false;
    }
    struct pollfd wait = {.fd = host->from_agent, .events = POLLIN};
    if (poll(&wait, 1, left_ms) <= 0) continue;
    const ssize_t got = read(host->from_agent, host->buffer + host->buffered,
                             sizeof host->buffer - 1 - host->buffered);
    if (got <= 0) return false;
    host->buffered += (size_t)got;
  }
}

static void send_line(doctor_host *host, const char *text) {
  if (host->to_agent < 0) return;
  const size_t length = strlen(text);
  if (write(host->to_agent, text, length) != (ssize_t)length) return;
}

static void collect_errors(doctor_host *host) {
  if (host->agent_errors < 0) return;
  size_t used = strlen(host->errors);
  ssize_t got;
  while (used < sizeof host->errors - 1 &&
         (got = read(host->agent_errors, host->errors + used, sizeof host->errors - 1 - used)) > 0) {
    used += (size_t)got;
  }
  host->errors[used] = '\0';
  for (char *c = host->errors; *c != '\0'; ++c) {
    if (*c == '\n') *c = ' ';
  }
}

/* The remote shell: what mpirun would use. ssh without questions (a password prompt would hang). */
static const char *remote_shell(void) {
  const char *agent = getenv("OMPI_MCA_plm_rsh_agent");
  return agent != NULL && agent[0] != '\0' ? agent
                                           : "ssh -o BatchMode=yes -o ConnectTimeout=10";
}

static bool start_agent(doctor_host *host, const char *self) {
  int to[2], from[2], errors[2];
  if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0 || pipe2(errors, O_CLOEXEC) != 0) {
    return false;
  }
  /* MPENGINE_DOCTOR_BIN is read on the remote host, by its shell: where mpengine lives at
   * another path on some host, set it there (the test sets it for one host to run another
   * build). */
  char remote[8192];
  snprintf(remote, sizeof remote, "\"${MPENGINE_DOCTOR_BIN:-%s}\" doctor --agent --host %s", self,
           host->name);
  char shell[4096];
  snprintf(shell, sizeof shell, "exec %s \"$0\" \"$1\"", remote_shell());
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    setpgid(0, 0);
    dup2(to[0], 0);
    dup2(from[1], 1);
    dup2(errors[1], 2);
    execl("/bin/sh", "sh", "-c", shell, host->name, remote, (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid);
  close(to[0]);
  close(from[1]);
  close(errors[1]);
  host->pid = pid;
  host->to_agent = to[1];
  host->from_agent = from[0];
  host->agent_errors = errors[0];
  fcntl(host->agent_errors, F_SETFL, O_NONBLOCK);
  return true;
}

static void stop_agent(doctor_host *host) {
  if (host->pid <= 0) return;
  send_line(host, "quit\n");
  close(host->to_agent);
  host->to_agent = -1;
  const double deadline = now() + 2.0;
  int status;
  while (waitpid(host->pid, &status, WNOHANG) == 0) {
    if (now() > deadline) {
      kill(-host->pid, SIGKILL);
      waitpid(host->pid, &status, 0);
      break;
    }
    usleep(10000);
  }
  host->pid = 0;
  if (host->from_agent >= 0) close(host->from_agent);
  if (host->agent_errors >= 0) close(host->agent_errors);
  host->from_agent = host->agent_errors = -1;
}

/* The hosts of a Slurm allocation, one slot each unless SLURM_NTASKS_PER_NODE says more. */
static mp_status slurm_hosts(mp_hostfile *out, mp_error *err) {
  const char *nodes = getenv("SLURM_JOB_NODELIST");
  if (nodes == NULL || nodes[0] == '\0') {
    return mp_fail(err, MP_ERR_INPUT,
                   "no hosts to check: give --hostfile FILE (Open MPI's format, 'host slots=N' a "
                   "line), or run doctor inside a Slurm allocation (SLURM_JOB_NODELIST is not set)");
  }
  const char *per_node = getenv("SLURM_NTASKS_PER_NODE");
  const int slots = per_node != NULL && atoi(per_node) > 0 ? atoi(per_node) : 1;
  FILE *pipe = popen("scontrol show hostnames \"$SLURM_JOB_NODELIST\"", "r");
  if (pipe == NULL) return mp_fail(err, MP_ERR_RUNTIME, "cannot run scontrol to list the nodes");
  memset(out, 0, sizeof *out);
  snprintf(out->path, sizeof out->path, "SLURM_JOB_NODELIST=%s", nodes);
  char line[MP_HOSTFILE_NAME_BYTES];
  while (fgets(line, sizeof line, pipe) != NULL) {
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') continue;
    mp_hostfile_host *grown = realloc(out->hosts, (size_t)(out->count + 1) * sizeof *grown);
    if (grown == NULL) break;
    out->hosts = grown;
    memset(&out->hosts[out->count], 0, sizeof out->hosts[0]);
    snprintf(out->hosts[out->count].name, MP_HOSTFILE_NAME_BYTES, "%s", line);
    out->hosts[out->count].slots = slots;
    out->count++;
  }
  if (pclose(pipe) != 0 || out->count == 0) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "scontrol show hostnames \"%s\" listed no node; is Slurm's scontrol installed "
                   "here? Or give --hostfile FILE", nodes);
  }
  return MP_OK;
}

/* The plan's largest predicted memory of one rank (predicted.memory_bytes_per_pp_rank). */
static mp_status plan_memory_per_rank(const char *path, double *bytes, mp_error *err) {
  FILE *file = fopen(path, "rb");
  if (file == NULL) return mp_fail(err, MP_ERR_INPUT, "cannot read --config %s: %s", path, strerror(errno));
  static char text[1 << 20];
  const size_t length = fread(text, 1, sizeof text - 1, file);
  fclose(file);
  text[length] = '\0';
  cJSON *root = cJSON_Parse(text);
  const cJSON *predicted = cJSON_GetObjectItemCaseSensitive(root, "predicted");
  const cJSON *memory = cJSON_GetObjectItemCaseSensitive(predicted, "memory_bytes_per_pp_rank");
  *bytes = 0;
  const cJSON *item;
  cJSON_ArrayForEach(item, memory) {
    if (cJSON_IsNumber(item) && item->valuedouble > *bytes) *bytes = item->valuedouble;
  }
  cJSON_Delete(root);
  if (*bytes <= 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s: no $.predicted.memory_bytes_per_pp_rank; give a plan written by "
                   "`mpengine plan --out PLAN.json`", path);
  }
  return MP_OK;
}

static const char *gib(double bytes, char *out, size_t size) {
  snprintf(out, size, "%.1f GiB", bytes / 1073741824.0);
  return out;
}

static void check_same(doctor_host *hosts, int n, const char *check, const char *what,
                       const char *fix, void (*value)(const mp_doctor_facts *, char *, size_t)) {
  const char *names[n > 0 ? n : 1];
  const char *values[n > 0 ? n : 1];
  static char texts[1024][160];
  int count = 0;
  for (int i = 0; i < n && count < 1024; ++i) {
    if (!hosts[i].answered) continue;
    value(&hosts[i].facts, texts[count], sizeof texts[count]);
    names[count] = hosts[i].name;
    values[count] = texts[count];
    ++count;
  }
  if (count == 0) return;
  char line[4096];
  const bool same = mp_doctor_same_value(names, values, count, line, sizeof line);
  if (same) {
    report(true, check, "%s %s", what, line);
  } else {
    report(false, check, "%s differs: %s; fix: %s", what, line, fix);
  }
}

static void value_build(const mp_doctor_facts *f, char *out, size_t bytes) {
  snprintf(out, bytes, "%s build %s", f->version, f->build);
}
static void value_mpi(const mp_doctor_facts *f, char *out, size_t bytes) { snprintf(out, bytes, "%s", f->mpi); }
static void value_nccl(const mp_doctor_facts *f, char *out, size_t bytes) { snprintf(out, bytes, "%s", f->nccl); }
static void value_driver(const mp_doctor_facts *f, char *out, size_t bytes) {
  snprintf(out, bytes, "%s", f->cuda_driver);
}

static const char *connect_fix(const char *outcome, const char *from, const char *to,
                               const char *address, char *out, size_t bytes) {
  if (strcmp(outcome, "refused") == 0) {
    snprintf(out, bytes, "%s answered but refused the port: a firewall on %s rejects it; allow TCP "
             "from the job's hosts on all ports (MPI and NCCL pick ports at random)", to, to);
  } else if (strcmp(outcome, "no route") == 0) {
    snprintf(out, bytes, "%s has no route to %s (a prohibit/unreachable route or a rejecting "
             "firewall rule on %s): see `ip route get %s` and the firewall there",
             from, address, from, address);
  } else if (strcmp(outcome, "timed out") == 0) {
    snprintf(out, bytes, "packets between %s and %s vanish, one way or the reply (a firewall that drops them, or the wrong "
             "network): allow TCP between the job's hosts, or pick the interface they share with "
             "OMPI_MCA_btl_tcp_if_include and NCCL_SOCKET_IFNAME", from, to);
  } else {
    snprintf(out, bytes, "check the network between %s and %s", from, to);
  }
  return out;
}

/* One rank per host through mpirun: `mpengine bench comm --ops all_reduce`, under a deadline.
 * Returns false with why in reason. */
static bool mpirun_all_reduce(doctor_host *hosts, int n, const char *self, double *busbw_gbps,
                              double *small_us, char *reason, size_t reason_bytes) {
  char host_list[8192] = "";
  for (int i = 0; i < n; ++i) {
    size_t used = strlen(host_list);
    snprintf(host_list + used, sizeof host_list - used, "%s%s:1", i ? "," : "", hosts[i].name);
  }
  char command[16384];
  snprintf(command, sizeof command,
           "exec timeout -s KILL %d mpirun %s --host %s -np %d '%s' bench comm --ops all_reduce "
           "--min-bytes 16K --max-bytes 16M --factor 1024 --iters 5 --warmup 2 --comm-timeout 10 "
           "--json 2>&1",
           kAllReduceDeadlineS, geteuid() == 0 ? "--allow-run-as-root" : "", host_list, n, self);
  FILE *pipe = popen(command, "r");
  if (pipe == NULL) {
    snprintf(reason, reason_bytes, "cannot run mpirun");
    return false;
  }
  char line[4096], last[512] = "";
  *busbw_gbps = 0;
  *small_us = 0;
  while (fgets(line, sizeof line, pipe) != NULL) {
    cJSON *row = cJSON_Parse(line);
    const cJSON *bytes = cJSON_GetObjectItemCaseSensitive(row, "bytes");
    const cJSON *busbw = cJSON_GetObjectItemCaseSensitive(row, "busbw_gbps");
    const cJSON *time_us = cJSON_GetObjectItemCaseSensitive(row, "time_us");
    if (cJSON_IsNumber(bytes) && cJSON_IsNumber(busbw) && cJSON_IsNumber(time_us)) {
      if (bytes->valuedouble <= 16384) *small_us = time_us->valuedouble;
      else *busbw_gbps = busbw->valuedouble;
    } else if (last[0] == '\0' || strncmp(line, "mpengine", 8) == 0) {
      /* mpengine's own words first: mpirun's banner of dashes says nothing. */
      snprintf(last, sizeof last, "%s", line);
      last[strcspn(last, "\n")] = '\0';
    }
    cJSON_Delete(row);
  }
  const int status = pclose(pipe);
  if (status != 0 || *busbw_gbps <= 0) {
    if (WIFEXITED(status) && WEXITSTATUS(status) == 137) {
      snprintf(reason, reason_bytes, "mpirun did not finish within %d s", kAllReduceDeadlineS);
    } else {
      snprintf(reason, reason_bytes, "mpirun failed (exit %d): %s", WEXITSTATUS(status), last);
    }
    return false;
  }
  return true;
}

static int write_cluster(const char *path, int n, int devices_per_node, double latency_s,
                         double bandwidth, double efficiency, const char *slowest,
                         cli_command *command) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_cluster cluster;
  /* Inside a host: this machine's calibration when `mpengine calibrate` ran (cpu-local), else the
   * placeholder; doctor measures the links between hosts, which calibrate cannot. */
  if (mp_cluster_load("cpu-local", &cluster, &err) != MP_OK) return cli_report(command, &err);
  snprintf(cluster.name, sizeof cluster.name, "doctor-%d-hosts", n);
  cluster.nodes = n;
  cluster.devices_per_node = devices_per_node;
  cluster.inter_node_latency_s = latency_s;
  cluster.inter_node_bandwidth_bytes_per_s = bandwidth;
  cluster.inter_node_efficiency = efficiency;
  cluster.inter_node_collective_latency_s = 0;
  cluster.placeholder = false;
  char notes[sizeof cluster.notes];
  snprintf(notes, sizeof notes,
           "Measured by mpengine doctor on %d hosts: between hosts the slowest pair's TCP link "
           "(%s: 8-byte ping-pong half round trip %.1f us, 32 MiB stream %.3f GB/s), the "
           "all-reduce's efficiency from mpirun bench comm across the hosts; inside a host: %s",
           n, slowest, latency_s * 1e6, bandwidth / 1e9,
           cluster.notes[0] != '\0' ? cluster.notes : "cpu-local");
  snprintf(cluster.notes, sizeof cluster.notes, "%s", notes);
  cJSON *json = NULL;
  if (mp_cluster_to_json(&cluster, &json, &err) != MP_OK) return cli_report(command, &err);
  char *text = cJSON_Print(json);
  cJSON_Delete(json);
  mp_atomic_file file;
  mp_status status = mp_atomic_file_open(&file, path, &err);
  if (status == MP_OK) {
    mp_atomic_file_write(&file, text, strlen(text));
    mp_atomic_file_write(&file, "\n", 1);
    status = mp_atomic_file_commit(&file, &err);
  }
  free(text);
  if (status != MP_OK) return cli_report(command, &err);
  return CLI_EXIT_OK;
}

int cmd_doctor(int argc, char **argv) {
  cli_option options[] = {
      {"hostfile", "FILE", "the hosts, Open MPI's format ('host slots=N'); default: the Slurm "
       "allocation's nodes", NULL},
      {"config", "PLAN.json", "also check each host's free memory against the plan's memory per rank",
       NULL},
      {"out", "CLUSTER.json", "write the measured links as a cluster description for "
       "`plan --cluster`", NULL},
      {"agent", NULL, "(internal) run as the agent on one host", NULL},
      {"host", "NAME", "(internal, with --agent) the host's name in the hostfile", NULL},
      {0},
  };
  cli_command command = {
      .command = "doctor",
      .usage = "mpengine doctor [--hostfile FILE] [--config PLAN.json] [--out CLUSTER.json]",
      .summary = "Check the hosts of a job before it runs: the same build and libraries, name "
                 "resolution, TCP both ways between every pair on the interface MPI and NCCL "
                 "use, GPUs and memory against the slots and the plan, clocks, and the links' "
                 "latency and bandwidth. One line per check, PASS or FAIL with the fix; exit 0 "
                 "only when all pass.",
      .max_positionals = 0,
      .options = options};
  int early = cli_begin(&command, argc, argv);
  if (early >= 0) return early;
  if (cli_flag(&command, "agent")) {
    const char *name = cli_value(&command, "host");
    return doctor_agent_main(name != NULL ? name : "");
  }
  mp_error err = MP_ERROR_INITIALIZER;
  mp_hostfile hostfile;
  const char *hostfile_path = cli_value(&command, "hostfile");
  if (hostfile_path != NULL) {
    if (mp_hostfile_read(hostfile_path, &hostfile, &err) != MP_OK) return cli_report(&command, &err);
  } else if (slurm_hosts(&hostfile, &err) != MP_OK) {
    return cli_report(&command, &err);
  }
  double plan_bytes = 0;
  const char *config = cli_value(&command, "config");
  if (config != NULL && plan_memory_per_rank(config, &plan_bytes, &err) != MP_OK) {
    mp_hostfile_free(&hostfile);
    return cli_report(&command, &err);
  }
  char self[4096];
  const ssize_t self_length = readlink("/proc/self/exe", self, sizeof self - 1);
  if (self_length <= 0) {
    mp_hostfile_free(&hostfile);
    mp_fail(&err, MP_ERR_RUNTIME, "cannot find this binary (/proc/self/exe)");
    return cli_report(&command, &err);
  }
  self[self_length] = '\0';
  signal(SIGPIPE, SIG_IGN);

  const double started = now();
  const int n = hostfile.count;
  doctor_host *hosts = calloc((size_t)n, sizeof *hosts);
  for (int i = 0; i < n; ++i) {
    snprintf(hosts[i].name, sizeof hosts[i].name, "%s", hostfile.hosts[i].name);
    hosts[i].slots = hostfile.hosts[i].slots;
    hosts[i].to_agent = hosts[i].from_agent = hosts[i].agent_errors = -1;
  }
  mp_hostfile_free(&hostfile);
  printf("doctor: %d hosts, agents started through '%s'\n", n, remote_shell());

  /* Agents: started together, each answers with its facts before the deadline or is named. */
  for (int i = 0; i < n; ++i) start_agent(&hosts[i], self);
  const double start_deadline = now() + kStartDeadlineS;
  int answered = 0;
  char line[1 << 16];
  for (int i = 0; i < n; ++i) {
    if (read_line(&hosts[i], start_deadline, line, sizeof line) &&
        mp_doctor_facts_parse(line, hosts[i].name, &hosts[i].facts, &err) == MP_OK) {
      hosts[i].answered = true;
      ++answered;
    } else {
      collect_errors(&hosts[i]);
      report(false, "agent", "%s: no facts from `mpengine doctor --agent` through '%s' within "
             "%d s%s%s; fix: check that '%s %s true' works without a password and that mpengine "
             "is at %s there (or set MPENGINE_DOCTOR_BIN in that host's environment)",
             hosts[i].name, remote_shell(), kStartDeadlineS, hosts[i].errors[0] ? ": " : "",
             hosts[i].errors, remote_shell(), hosts[i].name, self);
    }
  }
  if (answered == n) {
    report(true, "agent", "all %d hosts answered in %.1f s", n, now() - started);
  }
  check_same(hosts, n, "build", "mpengine",
             "install the same mpengine build on every host (or point MPENGINE_DOCTOR_BIN at it)",
             value_build);
  check_same(hosts, n, "open-mpi", "MPI library", "install the same Open MPI version on every host",
             value_mpi);
  check_same(hosts, n, "nccl", "NCCL", "install the same NCCL version on every host", value_nccl);
  check_same(hosts, n, "cuda-driver", "CUDA driver",
             "install the same NVIDIA driver on every host", value_driver);

  /* Names: each host's own name must resolve to an address of its own, not a loopback one. */
  bool resolved_all = true;
  for (int i = 0; i < n; ++i) {
    const mp_doctor_facts *f = &hosts[i].facts;
    if (!hosts[i].answered) continue;
    if (f->address[0] == '\0') {
      resolved_all = false;
      report(false, "resolve", "%s: its name %s does not resolve there; fix: add it to DNS or to "
             "/etc/hosts on every host", hosts[i].name, f->hostname);
    } else if (mp_doctor_is_loopback(f->address)) {
      resolved_all = false;
      report(false, "resolve", "%s: its name %s resolves to %s there, a loopback address the "
             "other hosts cannot reach; fix: in /etc/hosts on %s map %s to the address of its "
             "network interface%s%s, not %s", hosts[i].name, f->hostname, f->address,
             hosts[i].name, f->hostname, f->interface_address[0] ? " " : "",
             f->interface_address, f->address);
    } else if (!f->address_local) {
      resolved_all = false;
      report(false, "resolve", "%s: its name %s resolves to %s there, which is none of its "
             "interfaces' addresses; fix: correct DNS or /etc/hosts", hosts[i].name, f->hostname,
             f->address);
    }
  }
  if (resolved_all && answered > 0) {
    char list[4096] = "";
    for (int i = 0; i < n; ++i) {
      if (!hosts[i].answered) continue;
      size_t used = strlen(list);
      snprintf(list + used, sizeof list - used, "%s%s %s", used ? ", " : "", hosts[i].name,
               hosts[i].facts.address);
    }
    report(true, "resolve", "%s", list);
  }

  /* TCP both ways between every pair, on the interface MPI and NCCL use. */
  bool tcp_ok = answered == n;
  char allow[65536] = "allow";
  for (int i = 0; i < n; ++i) {
    if (!hosts[i].answered) continue;
    const mp_doctor_facts *f = &hosts[i].facts;
    if (f->interface[0] == '\0') {
      tcp_ok = false;
      report(false, "interface", "%s: no interface matches %s; fix: set it to an interface or "
             "address range that every host has", hosts[i].name, f->interface_rule);
      continue;
    }
    size_t used = strlen(allow);
    snprintf(allow + used, sizeof allow - used, " %s", f->interface_address);
  }
  strncat(allow, "\n", sizeof allow - strlen(allow) - 1);
  for (int i = 0; i < n; ++i) {
    if (!hosts[i].answered) continue;
    send_line(&hosts[i], allow);
    if (!read_line(&hosts[i], now() + kReplyDeadlineS, line, sizeof line) || strcmp(line, "ok") != 0) {
      tcp_ok = false;
      report(false, "tcp", "%s: its agent cannot listen on %s; fix: check that interface",
             hosts[i].name, hosts[i].facts.interface_address);
    }
  }
  if (n > 1) {
    for (int i = 0; i < n; ++i) {
      if (!hosts[i].answered || hosts[i].facts.interface[0] == '\0') continue;
      char connect[65536];
      snprintf(connect, sizeof connect, "connect %d", kConnectTimeoutMs);
      for (int j = 0; j < n; ++j) {
        if (j == i || !hosts[j].answered || hosts[j].facts.interface[0] == '\0') continue;
        size_t used = strlen(connect);
        snprintf(connect + used, sizeof connect - used, " %s:%d", hosts[j].facts.interface_address,
                 hosts[j].facts.port);
      }
      strncat(connect, "\n", sizeof connect - strlen(connect) - 1);
      send_line(&hosts[i], connect);
    }
    const double deadline = now() + kConnectTimeoutMs / 1000.0 + kReplyDeadlineS;
    for (int i = 0; i < n; ++i) {
      if (!hosts[i].answered || hosts[i].facts.interface[0] == '\0') continue;
      for (int j = 0; j < n; ++j) {
        if (j == i || !hosts[j].answered || hosts[j].facts.interface[0] == '\0') continue;
        char target[96], outcome[64] = "", fix[1024];
        double seconds = 0;
        if (!read_line(&hosts[i], deadline, line, sizeof line)) {
          tcp_ok = false;
          report(false, "tcp", "%s -> %s: %s's agent did not answer", hosts[i].name, hosts[j].name,
                 hosts[i].name);
          break;
        }
        /* "ADDR:PORT OUTCOME SECONDS", the outcome possibly two words. */
        char *last_space = strrchr(line, ' ');
        char *first_space = strchr(line, ' ');
        if (last_space != NULL && first_space != NULL && last_space > first_space) {
          seconds = atof(last_space + 1);
          snprintf(outcome, sizeof outcome, "%.*s", (int)(last_space - first_space - 1),
                   first_space + 1);
        }
        snprintf(target, sizeof target, "%s:%d", hosts[j].facts.interface_address,
                 hosts[j].facts.port);
        if (strcmp(outcome, "ok") != 0) {
          tcp_ok = false;
          report(false, "tcp", "%s -> %s: %s on %s's %s (%s) %s after %.1f s; fix: %s",
                 hosts[i].name, hosts[j].name, target, hosts[i].name, hosts[i].facts.interface,
                 hosts[i].facts.interface_rule, outcome, seconds,
                 connect_fix(outcome, hosts[i].name, hosts[j].name,
                             hosts[j].facts.interface_address, fix, sizeof fix));
        }
      }
      if (read_line(&hosts[i], deadline, line, sizeof line) && strcmp(line, "end") != 0) {
        tcp_ok = false;
      }
    }
  }
  if (tcp_ok) {
    report(true, "tcp", "every pair of the %d hosts connects both ways on %s (%s), each agent's "
           "listener on its interface address and a port of its own", n,
           hosts[0].facts.interface, hosts[0].facts.interface_rule);
  }

  /* GPUs against slots; memory against the plan. */
  bool gpus_ok = true;
  int gpu_hosts = 0;
  for (int i = 0; i < n; ++i) gpu_hosts += hosts[i].answered && hosts[i].facts.gpus > 0;
  for (int i = 0; i < n; ++i) {
    if (!hosts[i].answered) continue;
    const int gpus = hosts[i].facts.gpus;
    if ((gpu_hosts > 0 && gpus < hosts[i].slots)) {
      gpus_ok = false;
      report(false, "gpus", "%s: %d GPUs for %d slots; fix: give it slots=%d in the hostfile, or "
             "find out why `mpengine version` there sees fewer GPUs", hosts[i].name, gpus,
             hosts[i].slots, gpus);
    }
  }
  if (gpus_ok) {
    if (gpu_hosts == 0) {
      report(true, "gpus", "no GPUs on any host: every slot is a CPU rank");
    } else {
      report(true, "gpus", "every host has at least a GPU per slot");
    }
  }
  {
    bool memory_ok = true;
    char list[4096] = "", a[32], b[32];
    for (int i = 0; i < n; ++i) {
      if (!hosts[i].answered) continue;
      const mp_doctor_facts *f = &hosts[i].facts;
      const bool gpu = f->gpus > 0;
      const double have = gpu ? (double)f->gpu_memory_bytes : (double)f->free_memory_bytes;
      const double need = gpu ? plan_bytes : plan_bytes * hosts[i].slots;
      size_t used = strlen(list);
      snprintf(list + used, sizeof list - used, "%s%s %s %s", used ? ", " : "", hosts[i].name,
               gib(have, a, sizeof a), gpu ? "per GPU" : "free");
      if (plan_bytes > 0 && have < need) {
        memory_ok = false;
        report(false, "memory", "%s: %s %s, the plan needs %s (%s per rank x %d slots); fix: free "
               "memory there, or plan for less (`mpengine plan --cluster` with this cluster)",
               hosts[i].name, gib(have, a, sizeof a), gpu ? "per GPU" : "free",
               gib(need, b, sizeof b), gib(plan_bytes, a, sizeof a), gpu ? 1 : hosts[i].slots);
      }
    }
    if (memory_ok) {
      if (plan_bytes > 0) {
        report(true, "memory", "%s; the plan needs %s per rank", list, gib(plan_bytes, a, sizeof a));
      } else {
        report(true, "memory", "%s (give --config PLAN.json to check against a plan)", list);
      }
    }
  }

  /* Clocks: each host's real-time clock against this one's, halfway through the round trip. */
  {
    double lowest = 0, highest = 0, uncertainty = 0;
    int lowest_at = -1, highest_at = -1;
    for (int i = 0; i < n; ++i) {
      if (!hosts[i].answered) continue;
      struct timespec t0, t1;
      clock_gettime(CLOCK_REALTIME, &t0);
      send_line(&hosts[i], "time\n");
      if (!read_line(&hosts[i], now() + kReplyDeadlineS, line, sizeof line)) continue;
      clock_gettime(CLOCK_REALTIME, &t1);
      double remote = 0;
      if (sscanf(line, "time %lf", &remote) != 1) continue;
      const double a = (double)t0.tv_sec + 1e-9 * t0.tv_nsec, b = (double)t1.tv_sec + 1e-9 * t1.tv_nsec;
      const double skew = remote - 0.5 * (a + b);
      if ((b - a) / 2 > uncertainty) uncertainty = (b - a) / 2;
      if (lowest_at < 0 || skew < lowest) lowest = skew, lowest_at = i;
      if (highest_at < 0 || skew > highest) highest = skew, highest_at = i;
    }
    if (lowest_at >= 0) {
      const double spread = highest - lowest;
      if (spread - 2 * uncertainty > kMaxClockSkewS) {
        report(false, "clock", "%s is %.3f s ahead of %s; fix: run NTP (chrony, systemd-timesyncd) "
               "on every host", hosts[highest_at].name, spread, hosts[lowest_at].name);
      } else {
        report(true, "clock", "largest skew %.3f s (%s against %s, +-%.3f s), under %.1f s", spread,
               hosts[highest_at].name, hosts[lowest_at].name, uncertainty, kMaxClockSkewS);
      }
    }
  }

  /* Links: each pair in turn, so that measurements do not share the wire. */
  double slowest_bw = 0, slowest_latency = 0;
  char slowest[512] = "";
  bool links_ok = tcp_ok && n > 1;
  if (!tcp_ok) {
    report(false, "links", "not measured: fix the tcp lines above first");
  } else if (n > 1) {
    for (int i = 0; i < n && links_ok; ++i) {
      for (int j = i + 1; j < n; ++j) {
        char command_line[256];
        snprintf(command_line, sizeof command_line, "measure %s:%d\n",
                 hosts[j].facts.interface_address, hosts[j].facts.port);
        send_line(&hosts[i], command_line);
        double latency_us = 0, gbps = 0;
        if (!read_line(&hosts[i], now() + kMeasureDeadlineS, line, sizeof line) ||
            sscanf(line, "measure %lf %lf", &latency_us, &gbps) != 2) {
          links_ok = false;
          report(false, "links", "%s <-> %s: %s; fix: see the tcp lines, run doctor again",
                 hosts[i].name, hosts[j].name, line[0] ? line : "no answer");
          break;
        }
        if (slowest[0] == '\0' || gbps < slowest_bw) {
          slowest_bw = gbps;
          slowest_latency = latency_us;
          snprintf(slowest, sizeof slowest, "%s <-> %s", hosts[i].name, hosts[j].name);
        }
      }
    }
    if (links_ok) {
      report(true, "links", "%d pairs over TCP, the slowest %s: %.1f us one way (8 bytes), "
             "%.3f GB/s (32 MiB)", n * (n - 1) / 2, slowest, slowest_latency, slowest_bw);
    }
  } else {
    report(true, "links", "one host: no link between hosts to measure");
  }

  /* The all-reduce through mpirun: the path the job will take, once TCP is known to work. */
  double busbw = 0, small_us = 0;
  bool all_reduce_ok = false;
  if (links_ok) {
    char reason[1024];
    all_reduce_ok = mpirun_all_reduce(hosts, n, self, &busbw, &small_us, reason, sizeof reason);
    if (all_reduce_ok) {
      report(true, "all-reduce", "%d ranks, one a host (mpirun bench comm): 16 MiB at %.3f GB/s "
             "bus bandwidth, 16 KiB in %.1f us", n, busbw, small_us);
    } else {
      report(false, "all-reduce", "one rank a host through mpirun: %s; fix: TCP works between the "
             "hosts, so look at MPI itself: `mpirun --host ... hostname` across them", reason);
    }
  } else if (n > 1) {
    report(false, "all-reduce", "not run: the links above failed");
  }

  for (int i = 0; i < n; ++i) stop_agent(&hosts[i]);
  int code = g_failures == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
  const char *out = cli_value(&command, "out");
  if (out != NULL && links_ok && slowest_bw > 0) {
    int devices = hosts[0].slots;
    for (int i = 0; i < n; ++i) devices = hosts[i].slots < devices ? hosts[i].slots : devices;
    const double efficiency =
        all_reduce_ok && busbw < slowest_bw ? busbw / slowest_bw : 1.0;
    const int written = write_cluster(out, n, devices, slowest_latency * 1e-6, slowest_bw * 1e9,
                                      efficiency, slowest, &command);
    if (written != CLI_EXIT_OK) code = written;
    else printf("doctor: wrote %s (plan --cluster %s)\n", out, out);
  } else if (out != NULL) {
    printf("doctor: did not write %s: the links were not measured\n", out);
  }
  printf("doctor: %s in %.1f s\n", g_failures == 0 ? "every check passed" : "some checks FAILED",
         now() - started);
  free(hosts);
  return code;
}
