/*
 * tools/doctor_agent.c — the agent `mpengine doctor` runs on each host; see doctor_agent.h.
 *
 * Plain TCP and no MPI: doctor must work on a cluster where MPI does not, to say why. The listener
 * serves one connection at a time (doctor runs one measurement at a time, so they do not disturb
 * each other) and closes at once any connection from an address that is not one of the job's
 * hosts.
 */
#define _GNU_SOURCE
#include "tools/doctor_agent.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <mpi/mpi.h>

#include "engine/cuda_backend/cuda_backend.h"
#include "engine/device/gpu_probe.h"
#include "tools/build_id.h"
#include "tools/doctor_report.h"
#include "tools/version.h"

enum { kMaxAllowed = 1024, kPingPongs = 200, kIoTimeoutS = 10 };
static const uint64_t kStreamBytes = 32u << 20; /* beyond the socket buffers, quick on any link */

static struct {
  int listen_fd;
  int allowed_count;
  char allowed[kMaxAllowed][64];
  atomic_bool stop;
} g_agent = {.listen_fd = -1};

static double now_seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void copy_text(char *out, size_t bytes, const char *text) { snprintf(out, bytes, "%s", text); }

static int64_t available_memory_bytes(void) {
  FILE *file = fopen("/proc/meminfo", "r");
  if (file == NULL) return 0;
  char line[256];
  long long kib = 0;
  while (fgets(line, sizeof line, file) != NULL) {
    if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1) break;
  }
  fclose(file);
  return (int64_t)kib * 1024;
}

static void library_versions(mp_doctor_facts *facts) {
  char mpi[MPI_MAX_LIBRARY_VERSION_STRING];
  int length = 0;
  /* Allowed before MPI_Init: it reads the library, starts nothing. */
  if (MPI_Get_library_version(mpi, &length) == MPI_SUCCESS && length > 0) {
    char *comma = strchr(mpi, ',');
    if (comma != NULL) *comma = '\0';
    char *newline = strchr(mpi, '\n');
    if (newline != NULL) *newline = '\0';
    copy_text(facts->mpi, sizeof facts->mpi, mpi);
  } else {
    copy_text(facts->mpi, sizeof facts->mpi, "none");
  }
  copy_text(facts->nccl, sizeof facts->nccl, "none");
  copy_text(facts->cuda_driver, sizeof facts->cuda_driver, "none");
  mp_error err = MP_ERROR_INITIALIZER;
  mp_gpu_report report;
  /* What `mpengine version` finds: no backend or no driver is "none", a value like any other. */
  if (mp_cuda_backend_load(&err) != MP_OK || mp_gpu_probe(&report, &err) != MP_OK ||
      !report.built_with_cuda) {
    return;
  }
  if (report.cuda_driver_version > 0) {
    snprintf(facts->cuda_driver, sizeof facts->cuda_driver, "%d.%d",
             report.cuda_driver_version / 1000, report.cuda_driver_version % 1000 / 10);
  }
  if (report.nccl_version > 0) {
    snprintf(facts->nccl, sizeof facts->nccl, "%d.%d.%d", report.nccl_version / 10000,
             report.nccl_version / 100 % 100, report.nccl_version % 100);
  }
  facts->gpus = report.num_devices;
  for (int d = 0; d < report.num_devices; ++d) {
    const int64_t bytes = (int64_t)report.devices[d].memory_bytes;
    if (facts->gpu_memory_bytes == 0 || bytes < facts->gpu_memory_bytes) {
      facts->gpu_memory_bytes = bytes;
    }
  }
}

/* The host's own name resolved as every program on it resolves it (getaddrinfo: /etc/hosts, DNS),
 * IPv4 first as MPI's TCP transport uses it. */
static void resolve_own_name(mp_doctor_facts *facts) {
  struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
  struct addrinfo *found = NULL;
  if (getaddrinfo(facts->hostname, NULL, &hints, &found) != 0) {
    hints.ai_family = AF_UNSPEC;
    if (getaddrinfo(facts->hostname, NULL, &hints, &found) != 0) return;
  }
  char text[64] = "";
  if (found->ai_family == AF_INET) {
    inet_ntop(AF_INET, &((struct sockaddr_in *)found->ai_addr)->sin_addr, text, sizeof text);
  } else {
    inet_ntop(AF_INET6, &((struct sockaddr_in6 *)found->ai_addr)->sin6_addr, text, sizeof text);
  }
  freeaddrinfo(found);
  copy_text(facts->address, sizeof facts->address, text);
}

/* The interface MPI and NCCL will use: the one Open MPI's btl_tcp_if_include or NCCL's
 * NCCL_SOCKET_IFNAME selects when set, else the one that holds the host's resolved address. */
static void choose_interface(mp_doctor_facts *facts) {
  const char *variable = "OMPI_MCA_btl_tcp_if_include";
  const char *spec = getenv(variable);
  if (spec == NULL || spec[0] == '\0') {
    variable = "NCCL_SOCKET_IFNAME";
    spec = getenv(variable);
  }
  if (spec != NULL && spec[0] == '\0') spec = NULL;
  struct ifaddrs *list = NULL;
  if (getifaddrs(&list) != 0) return;
  for (struct ifaddrs *entry = list; entry != NULL; entry = entry->ifa_next) {
    if (entry->ifa_addr == NULL) continue;
    char text[64] = "";
    if (entry->ifa_addr->sa_family == AF_INET) {
      inet_ntop(AF_INET, &((struct sockaddr_in *)entry->ifa_addr)->sin_addr, text, sizeof text);
    } else if (entry->ifa_addr->sa_family == AF_INET6) {
      inet_ntop(AF_INET6, &((struct sockaddr_in6 *)entry->ifa_addr)->sin6_addr, text, sizeof text);
    } else {
      continue;
    }
    if (strcmp(text, facts->address) == 0) facts->address_local = true;
    if (entry->ifa_addr->sa_family != AF_INET || facts->interface[0] != '\0') continue;
    const bool loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    bool chosen;
    if (spec != NULL) {
      chosen = mp_doctor_interface_matches(spec, entry->ifa_name, text) &&
               !(loopback && spec[0] == '^');
    } else {
      chosen = strcmp(text, facts->address) == 0 && !loopback;
    }
    if (chosen) {
      copy_text(facts->interface, sizeof facts->interface, entry->ifa_name);
      copy_text(facts->interface_address, sizeof facts->interface_address, text);
    }
  }
  freeifaddrs(list);
  if (spec != NULL) {
    snprintf(facts->interface_rule, sizeof facts->interface_rule, "%s=%s", variable, spec);
  } else {
    snprintf(facts->interface_rule, sizeof facts->interface_rule, "the address of %s",
             facts->hostname);
  }
}

static int open_listener(mp_doctor_facts *facts) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  if (facts->interface_address[0] != '\0') {
    inet_pton(AF_INET, facts->interface_address, &address.sin_addr);
  }
  socklen_t length = sizeof address;
  if (bind(fd, (struct sockaddr *)&address, sizeof address) != 0 || listen(fd, 16) != 0 ||
      getsockname(fd, (struct sockaddr *)&address, &length) != 0) {
    close(fd);
    return -1;
  }
  facts->port = ntohs(address.sin_port);
  return fd;
}

static bool io_all(int fd, void *data, size_t bytes, bool sending) {
  char *at = data;
  while (bytes > 0) {
    const ssize_t done = sending ? send(fd, at, bytes, MSG_NOSIGNAL) : recv(fd, at, bytes, 0);
    if (done < 0 && errno == EINTR) continue;
    if (done <= 0) return false;
    at += done;
    bytes -= (size_t)done;
  }
  return true;
}

static void set_io_timeouts(int fd) {
  struct timeval timeout = {.tv_sec = kIoTimeoutS};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* One connection: 'c' a bare connect check; 'p' then a count: echo that many 8-byte messages;
 * 's' then a byte count: take that many bytes and answer one. */
static void serve(int fd) {
  set_io_timeouts(fd);
  char op = 0;
  if (!io_all(fd, &op, 1, false)) return;
  if (op == 'p') {
    uint32_t count = 0;
    char message[8];
    if (!io_all(fd, &count, sizeof count, false)) return;
    for (uint32_t i = 0; i < count; ++i) {
      if (!io_all(fd, message, sizeof message, false) || !io_all(fd, message, sizeof message, true)) {
        return;
      }
    }
  } else if (op == 's') {
    uint64_t bytes = 0;
    if (!io_all(fd, &bytes, sizeof bytes, false)) return;
    static char sink[1 << 16];
    while (bytes > 0) {
      const size_t chunk = bytes < sizeof sink ? (size_t)bytes : sizeof sink;
      if (!io_all(fd, sink, chunk, false)) return;
      bytes -= chunk;
    }
    io_all(fd, &op, 1, true);
  }
}

static bool peer_allowed(const struct sockaddr_in *peer) {
  char text[64];
  inet_ntop(AF_INET, &peer->sin_addr, text, sizeof text);
  for (int i = 0; i < g_agent.allowed_count; ++i) {
    if (strcmp(text, g_agent.allowed[i]) == 0) return true;
  }
  return false;
}

static void *accept_loop(void *unused) {
  (void)unused;
  while (!atomic_load(&g_agent.stop)) {
    struct pollfd wait = {.fd = g_agent.listen_fd, .events = POLLIN};
    if (poll(&wait, 1, 100) <= 0) continue;
    struct sockaddr_in peer;
    socklen_t length = sizeof peer;
    const int fd = accept4(g_agent.listen_fd, (struct sockaddr *)&peer, &length, SOCK_CLOEXEC);
    if (fd < 0) continue;
    /* Only the job's own hosts: anyone else is closed before a byte is read. */
    if (length == sizeof peer && peer.sin_family == AF_INET && peer_allowed(&peer)) serve(fd);
    close(fd);
  }
  return NULL;
}

static bool parse_target(const char *text, struct sockaddr_in *out) {
  char host[64];
  const char *colon = strrchr(text, ':');
  if (colon == NULL || (size_t)(colon - text) >= sizeof host) return false;
  memcpy(host, text, (size_t)(colon - text));
  host[colon - text] = '\0';
  memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons((uint16_t)atoi(colon + 1));
  return inet_pton(AF_INET, host, &out->sin_addr) == 1;
}

/* Connects to every target at once, each within timeout_ms; prints one line per target. */
static void connect_all(int timeout_ms, char **targets, int count) {
  int fds[kMaxAllowed];
  int outcome[kMaxAllowed]; /* -1 pending, 0 ok, else errno */
  double finished[kMaxAllowed];
  const double start = now_seconds();
  for (int i = 0; i < count; ++i) {
    struct sockaddr_in address;
    fds[i] = -1;
    outcome[i] = -1;
    finished[i] = 0;
    if (!parse_target(targets[i], &address)) {
      outcome[i] = EINVAL;
      continue;
    }
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fds[i] < 0 ||
        (connect(fds[i], (struct sockaddr *)&address, sizeof address) != 0 &&
         errno != EINPROGRESS)) {
      outcome[i] = errno;
      finished[i] = now_seconds() - start;
    } else if (errno != EINPROGRESS) {
      outcome[i] = 0;
    }
  }
  for (;;) {
    struct pollfd waits[kMaxAllowed];
    int index[kMaxAllowed], pending = 0;
    for (int i = 0; i < count; ++i) {
      if (outcome[i] != -1) continue;
      waits[pending] = (struct pollfd){.fd = fds[i], .events = POLLOUT};
      index[pending++] = i;
    }
    const int left_ms = timeout_ms - (int)((now_seconds() - start) * 1000.0);
    if (pending == 0) break;
    if (left_ms <= 0) {
      for (int p = 0; p < pending; ++p) {
        outcome[index[p]] = ETIMEDOUT;
        finished[index[p]] = now_seconds() - start;
      }
      break;
    }
    if (poll(waits, (nfds_t)pending, left_ms) < 0 && errno != EINTR) break;
    for (int p = 0; p < pending; ++p) {
      if (waits[p].revents == 0) continue;
      int error = 0;
      socklen_t length = sizeof error;
      getsockopt(waits[p].fd, SOL_SOCKET, SO_ERROR, &error, &length);
      outcome[index[p]] = error;
      finished[index[p]] = now_seconds() - start;
    }
  }
  for (int i = 0; i < count; ++i) {
    if (outcome[i] == 0) {
      const char op = 'c';
      io_all(fds[i], (void *)&op, 1, true);
    }
    if (fds[i] >= 0) close(fds[i]);
    printf("%s %s %.3f\n", targets[i], outcome[i] == 0 ? "ok" : mp_doctor_connect_outcome(outcome[i]),
           finished[i]);
  }
  printf("end\n");
}

/* Half a round trip of 8 bytes, and the rate of a 32 MiB stream, to the agent at target. */
static void measure(const char *target) {
  struct sockaddr_in address;
  if (!parse_target(target, &address)) {
    printf("measure error bad target %s\n", target);
    return;
  }
  double latency_us = 0, gbytes_per_s = 0;
  const char *failure = NULL;
  for (int phase = 0; phase < 2 && failure == NULL; ++phase) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    set_io_timeouts(fd);
    if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0) {
      failure = mp_doctor_connect_outcome(errno);
      close(fd);
      break;
    }
    if (phase == 0) {
      const char op = 'p';
      const uint32_t count = kPingPongs;
      char message[8] = {0};
      bool ok = io_all(fd, (void *)&op, 1, true) && io_all(fd, (void *)&count, sizeof count, true);
      const double start = now_seconds();
      for (uint32_t i = 0; ok && i < count; ++i) {
        ok = io_all(fd, message, sizeof message, true) && io_all(fd, message, sizeof message, false);
      }
      latency_us = (now_seconds() - start) / (2.0 * count) * 1e6;
      if (!ok) failure = "the ping-pong broke off";
    } else {
      char op = 's';
      uint64_t bytes = kStreamBytes;
      static char source[1 << 16];
      const double start = now_seconds();
      bool ok = io_all(fd, &op, 1, true) && io_all(fd, &bytes, sizeof bytes, true);
      for (uint64_t sent = 0; ok && sent < bytes; sent += sizeof source) {
        ok = io_all(fd, source, sizeof source, true);
      }
      ok = ok && io_all(fd, &op, 1, false);
      gbytes_per_s = (double)bytes / (now_seconds() - start) / 1e9;
      if (!ok) failure = "the stream broke off";
    }
    close(fd);
  }
  if (failure != NULL) {
    printf("measure error %s\n", failure);
  } else {
    printf("measure %.3f %.4f\n", latency_us, gbytes_per_s);
  }
}

int doctor_agent_main(const char *host) {
  /* No agent outlives its doctor: a lost doctor closes stdin; this covers a hung one too. */
  alarm(MP_DOCTOR_AGENT_LIFETIME_S);
  static mp_doctor_facts facts;
  memset(&facts, 0, sizeof facts);
  copy_text(facts.host, sizeof facts.host, host);
  gethostname(facts.hostname, sizeof facts.hostname - 1);
  copy_text(facts.version, sizeof facts.version, MPENGINE_VERSION);
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_build_id(facts.build, &err) != MP_OK) copy_text(facts.build, sizeof facts.build, "unknown");
  library_versions(&facts);
  facts.free_memory_bytes = available_memory_bytes();
  resolve_own_name(&facts);
  choose_interface(&facts);
  g_agent.listen_fd = open_listener(&facts);
  static char line[1 << 16];
  if (!mp_doctor_facts_format(&facts, line, sizeof line)) return 1;
  printf("%s\n", line);
  fflush(stdout);

  pthread_t acceptor;
  bool accepting = false;
  while (fgets(line, sizeof line, stdin) != NULL) {
    line[strcspn(line, "\r\n")] = '\0';
    char *words[kMaxAllowed + 2];
    int count = 0;
    for (char *word = strtok(line, " "); word != NULL && count < kMaxAllowed + 2;
         word = strtok(NULL, " ")) {
      words[count++] = word;
    }
    if (count == 0) continue;
    if (strcmp(words[0], "quit") == 0) break;
    if (strcmp(words[0], "allow") == 0) {
      for (int i = 1; i < count && g_agent.allowed_count < kMaxAllowed; ++i) {
        copy_text(g_agent.allowed[g_agent.allowed_count++], sizeof g_agent.allowed[0], words[i]);
      }
      if (!accepting && g_agent.listen_fd >= 0) {
        accepting = pthread_create(&acceptor, NULL, accept_loop, NULL) == 0;
      }
      printf(accepting ? "ok\n" : "error no listener\n");
    } else if (strcmp(words[0], "connect") == 0 && count >= 2) {
      connect_all(atoi(words[1]), words + 2, count - 2);
    } else if (strcmp(words[0], "measure") == 0 && count == 2) {
      measure(words[1]);
    } else if (strcmp(words[0], "time") == 0) {
      struct timespec t;
      clock_gettime(CLOCK_REALTIME, &t);
      printf("time %.6f\n", (double)t.tv_sec + 1e-9 * (double)t.tv_nsec);
    } else {
      printf("error unknown command %s\n", words[0]);
    }
    fflush(stdout);
  }
  atomic_store(&g_agent.stop, true);
  if (accepting) pthread_join(acceptor, NULL);
  if (g_agent.listen_fd >= 0) close(g_agent.listen_fd);
  return 0;
}
