/* tools/run_launcher.c — `mpengine run` re-launched under mpirun; see run_launcher.h. */
#include "tools/run_launcher.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/error.h"
#include "tools/launcher_env.h"

/* Sets an environment variable unless the user already set it. */
static void default_env(const char *name, const char *value) {
  if (getenv(name) == NULL) setenv(name, value, 1);
}

/* SIGTERM / SIGINT to the launcher while mpirun runs: the ranks (mpirun's children) get SIGTERM
 * directly, so they finish the step, save with --checkpoint-dir and exit 0 (signalling mpirun
 * itself would make it end the job with status 1). */
static volatile sig_atomic_t launcher_signal = 0;

static void on_launcher_signal(int signal_number) { launcher_signal = signal_number; }

/* Sends SIGTERM to every process whose parent is `parent` (from /proc/<pid>/stat); returns how
 * many. */
static int signal_children(pid_t parent) {
  DIR *proc = opendir("/proc");
  if (proc == NULL) return 0;
  int count = 0;
  struct dirent *entry;
  while ((entry = readdir(proc)) != NULL) {
    char *end = NULL;
    const long pid = strtol(entry->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *file = fopen(path, "r");
    if (file == NULL) continue;
    const size_t got = fread(line, 1, sizeof line - 1, file);
    fclose(file);
    line[got] = '\0';
    const char *close_paren = strrchr(line, ')'); /* the name may hold spaces */
    char state = 0;
    long ppid = 0;
    if (close_paren != NULL && sscanf(close_paren + 1, " %c %ld", &state, &ppid) == 2 &&
        ppid == (long)parent) {
      kill((pid_t)pid, SIGTERM);
      ++count;
    }
  }
  closedir(proc);
  return count;
}

/* mpirun's stderr as it passes through the launcher: forwarded as is, and scanned line by line
 * for the launcher's report of a rank that died, in Open MPI 4's words and PRRTE's (Open MPI 5):
 *   "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
 *   "prterun noticed that process rank 1 with PID 4242 on node vm exited on signal 9 (Killed)." */
/* Across hosts it also reads Open MPI's TCP transport giving up on a peer whose connection was
 * refused or blocked (a prohibit route, a REJECT rule):
 *   "[[16817,1],4][...btl_tcp_endpoint.c:793:mca_btl_tcp_endpoint_start_connect] from node2 to:
 *    node1 Unable to connect to the peer 10.88.0.11 on port 1025: Permission denied" */
typedef struct {
  char line[1024];
  size_t length;
  int lost_rank; /* -1 until a rank's death is seen */
  int lost_signal;
  char lost_host[256];  /* the node mpirun names, or "" */
  char unreachable_from[256], unreachable_to[256], unreachable_why[256]; /* "" until seen */
  /* A rank's start-up handshake that timed out (engine/comm: "rank R: start-up: no connection
   * within T s (--comm-timeout) to world ranks A, B, ..."): the first such rank and peer. */
  int silent_from, silent_to;
  double silent_timeout;
} stderr_watch;

static void stderr_watch_line(stderr_watch *watch) {
  watch->line[watch->length] = '\0';
  const char *noticed = strstr(watch->line, " noticed that process rank ");
  int rank = -1, signal_number = 0;
  char host[256] = "";
  if (noticed != NULL && watch->lost_rank < 0 &&
      sscanf(noticed, " noticed that process rank %d with PID %*d on node %255s exited on "
                      "signal %d",
             &rank, host, &signal_number) == 3 &&
      rank >= 0) {
    watch->lost_rank = rank;
    watch->lost_signal = signal_number;
    snprintf(watch->lost_host, sizeof watch->lost_host, "%s", host);
  }
  const char *from = strstr(watch->line, "] from ");
  const char *unable = strstr(watch->line, " Unable to connect to the peer ");
  char to[256] = "";
  if (from != NULL && unable != NULL && watch->unreachable_from[0] == '\0' &&
      sscanf(from, "] from %255s to: %255s", host, to) == 2) {
    snprintf(watch->unreachable_from, sizeof watch->unreachable_from, "%s", host);
    snprintf(watch->unreachable_to, sizeof watch->unreachable_to, "%s", to);
    const char *why = strrchr(unable, ':');
    snprintf(watch->unreachable_why, sizeof watch->unreachable_why, "%s",
             why != NULL ? why + 2 : "refused");
  }
  const char *startup = strstr(watch->line, ": start-up: no connection within ");
  int peer = -1;
  double timeout_s = 0;
  if (startup != NULL && watch->silent_from < 0) {
    const char *rank_text = strstr(watch->line, "rank ");
    const char *peers = strstr(startup, " to world rank");
    if (peers != NULL) peers += strlen(" to world rank");
    if (peers != NULL && *peers == 's') ++peers; /* "ranks 4, 5" or "rank 4" */
    if (rank_text != NULL && rank_text < startup && peers != NULL &&
        sscanf(rank_text, "rank %d", &rank) == 1 &&
        sscanf(startup, ": start-up: no connection within %lf", &timeout_s) == 1 &&
        sscanf(peers, " %d", &peer) == 1) {
      watch->silent_from = rank;
      watch->silent_to = peer;
      watch->silent_timeout = timeout_s;
    }
  }
  watch->length = 0;
}

/* The ranks' own word, whatever mpirun prints: each rank of a job the launcher started creates
 * MPENGINE_RANK_DIR/rank-<world rank> holding its pid as it joins, and removes it when it exits
 * through mpengine's code (a clean end or a reported error). The launcher watches the pids
 * (pidfd_open, Linux 5.3): the first rank whose process ends while its file is still there died
 * without a word (a signal, a crash) and is the lost one. */
typedef struct {
  char dir[PATH_MAX];
  int np;
  int *pidfds;   /* (np) -1 until the rank's file is seen */
  bool *ended;   /* (np) */
  int lost_rank; /* -1 until seen */
} rank_watch;

static char rank_file_path[PATH_MAX];

static void remove_rank_file(void) {
  if (rank_file_path[0] != '\0') unlink(rank_file_path);
}

/* mpirun stops the surviving ranks with SIGTERM when one dies: a rank stopped so has been told,
 * and must not look lost, however late the launcher wakes to see which process ended first.
 * unlink is async-signal-safe; then the default action ends the process as before. */
static void on_terminate_leave(int signal_number) {
  if (rank_file_path[0] != '\0') unlink(rank_file_path);
  signal(signal_number, SIG_DFL);
  raise(signal_number);
}

void run_rank_joined(int world_rank) {
  const char *dir = getenv("MPENGINE_RANK_DIR");
  if (dir == NULL || dir[0] == '\0' || rank_file_path[0] != '\0') return;
  snprintf(rank_file_path, sizeof rank_file_path, "%s/rank-%d", dir, world_rank);
  FILE *file = fopen(rank_file_path, "w");
  if (file == NULL) {
    rank_file_path[0] = '\0';
    return;
  }
  fprintf(file, "%ld\n", (long)getpid());
  fclose(file);
  atexit(remove_rank_file);
  struct sigaction current;
  if (sigaction(SIGTERM, NULL, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_terminate_leave;
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
  }
}

void run_rank_leaving(void) { remove_rank_file(); }

static void rank_watch_scan(rank_watch *watch) {
  for (int r = 0; r < watch->np; ++r) {
    if (watch->pidfds[r] >= 0 || watch->ended[r]) continue;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d", watch->dir, r);
    FILE *file = fopen(path, "r");
    if (file == NULL) continue;
    long pid = 0;
    const bool ok = fscanf(file, "%ld", &pid) == 1 && pid > 0;
    fclose(file);
    if (!ok) continue;
    watch->pidfds[r] = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
    if (watch->pidfds[r] >= 0) continue;
    watch->ended[r] = true; /* gone already, or no pidfd_open */
    /* Gone before the launcher looked, its file still there (a rank that ends through mpengine's
     * code removes it first): it died without a word, however fast. */
    if (errno == ESRCH && watch->lost_rank < 0) watch->lost_rank = r;
  }
}

/* A rank's process ended: lost when its file is still there. */
static void rank_watch_ended(rank_watch *watch, int r) {
  close(watch->pidfds[r]);
  watch->pidfds[r] = -1;
  watch->ended[r] = true;
  char path[PATH_MAX + 32];
  snprintf(path, sizeof path, "%s/rank-%d", watch->dir, r);
  if (watch->lost_rank < 0 && access(path, F_OK) == 0) watch->lost_rank = r;
}

static void rank_watch_free(rank_watch *watch) {
  for (int r = 0; r < watch->np && watch->pidfds != NULL; ++r) {
    if (watch->pidfds[r] >= 0) close(watch->pidfds[r]);
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d", watch->dir, r);
    unlink(path);
  }
  free(watch->pidfds);
  free(watch->ended);
  if (watch->dir[0] != '\0') rmdir(watch->dir);
}

static void stderr_watch_feed(stderr_watch *watch, const char *data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = write(STDERR_FILENO, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == '\n' || watch->length == sizeof watch->line - 1) stderr_watch_line(watch);
    if (data[i] != '\n') watch->line[watch->length++] = data[i];
  }
}

/* The host of rank r: the placement's, else this machine's (buffer holds it). */
static const char *host_of_rank(const run_hosts *hosts, int r, char *buffer, size_t bytes) {
  if (hosts != NULL && hosts->hostfile != NULL) {
    const int h = mp_placement_host_of(hosts->placement, r);
    if (h >= 0) return hosts->hostfile->hosts[h].name;
  }
  if (gethostname(buffer, bytes) != 0) snprintf(buffer, bytes, "this machine");
  buffer[bytes - 1] = '\0';
  return buffer;
}

/* The placement as `--host` wants it ("node1:4,node2:4": the used hosts in rank order, with the
 * ranks each runs, which Open MPI takes as their slots) and as the ranks read it
 * (MPENGINE_RANK_HOSTS, the same text): NULL when out of memory. */
static char *placement_text(const run_hosts *hosts) {
  size_t bytes = 1;
  for (int h = 0; h < hosts->placement->host_count; ++h) {
    bytes += strlen(hosts->hostfile->hosts[h].name) + 16;
  }
  char *text = malloc(bytes);
  if (text == NULL) return NULL;
  size_t used = 0;
  text[0] = '\0';
  for (int h = 0; h < hosts->placement->host_count; ++h) {
    if (hosts->placement->ranks[h] == 0) continue;
    used += (size_t)snprintf(text + used, bytes - used, "%s%s:%d", used > 0 ? "," : "",
                             hosts->hostfile->hosts[h].name, hosts->placement->ranks[h]);
  }
  return text;
}

int run_relaunch(cli_command *command, int argc, char **argv, int np, const char *mpirun,
                 const run_hosts *hosts, bool *lost) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (lost != NULL) *lost = false;
  /* Several tasks of a Slurm job step that are no MPI job: srun without PMIx (--mpi=none, the
   * default where slurm.conf sets no MpiDefault). Each would start an mpirun of its own, whose
   * daemons wait for the CPUs this step holds: a silent hang. */
  const char *step_tasks = getenv("SLURM_STEP_NUM_TASKS");
  if (getenv("SLURM_STEP_ID") != NULL && step_tasks != NULL && atoi(step_tasks) > 1) {
    const char *task = getenv("SLURM_PROCID");
    mp_fail(&err, MP_ERR_INPUT,
            "task %s of %s of a Slurm job step (srun) was started without PMIx, so it is no MPI "
            "rank: start `mpengine run` once inside the allocation (no srun: it starts the %d "
            "ranks through mpirun), or start the ranks with `srun --mpi=pmix` (docs/slurm.md)",
            task != NULL ? task : "?", step_tasks, np);
    return cli_report(command, &err);
  }
  const bool many_hosts = hosts != NULL && hosts->hostfile != NULL;
  char *host_list = many_hosts ? placement_text(hosts) : NULL;
  if (many_hosts && host_list == NULL) {
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory");
    return cli_report(command, &err);
  }
  char self[PATH_MAX];
  /* The path itself: /proc/self/exe in mpirun's arguments would name mpirun's own child. */
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    mp_fail(&err, MP_ERR_RUNTIME, "cannot find this binary (/proc/self/exe): %s", strerror(errno));
    return cli_report(command, &err);
  }
  self[len] = '\0';
  char np_text[16];
  snprintf(np_text, sizeof np_text, "%d", np);
  char **args = calloc((size_t)argc + 40, sizeof *args);
  if (args == NULL) {
    free(host_list);
    mp_fail(&err, MP_ERR_RUNTIME, "out of memory");
    return cli_report(command, &err);
  }
  int n = 0;
  args[n++] = (char *)mpirun;
  args[n++] = "-np";
  args[n++] = np_text;
  setenv("MPENGINE_STDOUT_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
  int ranks_per_host = np;
  if (many_hosts) {
    /* Exactly the placement's ranks on each host, in rank order: Open MPI fills the hosts of
     * --host in order, each up to its count. Nothing else of Open MPI's is set. */
    args[n++] = "--host";
    args[n++] = host_list;
    ranks_per_host = 0;
    for (int h = 0; h < hosts->placement->host_count; ++h) {
      if (hosts->placement->ranks[h] > ranks_per_host) ranks_per_host = hosts->placement->ranks[h];
    }
    setenv("MPENGINE_RANK_HOSTS", host_list, 1);
    /* mpirun passes a rank only the OMPI_* variables of its environment unless told (-x):
     * these reach the ranks on the other hosts (a name set by nobody is skipped). */
    static const char *const forwarded[] = {"MPENGINE_RANK_HOSTS", "MPENGINE_STDOUT_TTY",
                                            "MPENGINE_RANK_DIR", "MPENGINE_FAULT",
                                            "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; ++i) {
      if (strcmp(forwarded[i], "MPENGINE_FAULT") == 0 && getenv(forwarded[i]) == NULL) continue;
      args[n++] = "-x";
      args[n++] = (char *)forwarded[i];
    }
  } else if (getenv("SLURM_JOB_ID") != NULL && getenv("SLURM_STEP_ID") == NULL) {
    /* Inside a Slurm allocation (salloc, sbatch): Open MPI reads the allocation's nodes and
     * slots and starts its daemons through srun (docs/slurm.md), so nothing of one machine's is
     * forced: not shared memory alone, which cannot reach the other nodes, and no
     * oversubscription, so that mpirun refuses more ranks than the allocation's tasks. */
  } else {
    args[n++] = "--oversubscribe"; /* more ranks than cores is allowed (and slow) */
    /* One machine: shared memory and self transports, no ssh agent needed. The user's settings
     * win. */
    default_env("OMPI_MCA_btl", "self,vader");
    default_env("OMPI_MCA_plm_rsh_agent", "");
    default_env("OMPI_MCA_rmaps_base_oversubscribe", "1");
  }
  if (geteuid() == 0) args[n++] = "--allow-run-as-root";
  args[n++] = self;
  for (int i = 0; i < argc; ++i) args[n++] = argv[i]; /* argv[0] is "run" */
  args[n] = NULL;
  /* One BLAS thread per core's share, so the ranks of a host do not fight over its cores (on a
   * hostfile this machine's cores stand for every host's). The cost model assumes these threads
   * (topology/cluster.h, mp_cluster_threads_per_device). */
  const int cores = launcher_usable_cores();
  char threads[16];
  snprintf(threads, sizeof threads, "%d", cores / ranks_per_host > 1 ? cores / ranks_per_host : 1);
  default_env("OPENBLAS_NUM_THREADS", threads);
  default_env("OMP_NUM_THREADS", threads);
  setenv("MPENGINE_STDOUT_TTY", isatty(STDOUT_FILENO) ? "1" : "0", 1);
  rank_watch ranks = {.np = np, .lost_rank = -1};
  ranks.pidfds = malloc((size_t)np * sizeof *ranks.pidfds);
  ranks.ended = calloc((size_t)np, sizeof *ranks.ended);
  const char *tmp = getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp";
  snprintf(ranks.dir, sizeof ranks.dir, "%s/mpengine-ranks-XXXXXX", tmp);
  if (ranks.pidfds == NULL || ranks.ended == NULL || mkdtemp(ranks.dir) == NULL) {
    ranks.dir[0] = '\0'; /* the text of mpirun's report is then the only source */
    ranks.np = 0;
    setenv("MPENGINE_RANK_DIR", "", 1); /* none (and set, for -x) */
  } else {
    for (int r = 0; r < np; ++r) ranks.pidfds[r] = -1;
    setenv("MPENGINE_RANK_DIR", ranks.dir, 1);
  }
  fflush(stdout);
  fflush(stderr);
  /* mpirun's stderr (which carries the ranks' too) comes through a pipe: the launcher forwards
   * every byte and watches for mpirun's line about a rank that died. */
  int err_pipe[2];
  if (pipe(err_pipe) != 0) {
    free(args);
    free(host_list);
    mp_fail(&err, MP_ERR_RUNTIME, "cannot start %s: pipe failed: %s", mpirun, strerror(errno));
    return cli_report(command, &err);
  }
  const pid_t pid = fork();
  if (pid < 0) {
    free(args);
    free(host_list);
    close(err_pipe[0]);
    close(err_pipe[1]);
    mp_fail(&err, MP_ERR_RUNTIME, "cannot start %s: fork failed: %s", mpirun, strerror(errno));
    return cli_report(command, &err);
  }
  if (pid == 0) {
    close(err_pipe[0]);
    dup2(err_pipe[1], STDERR_FILENO);
    close(err_pipe[1]);
    execvp(mpirun, args);
    fprintf(stderr,
            "mpengine run: cannot run %s to start %d ranks: %s; install Open MPI "
            "(tools/setup.sh) or give its path with --mpirun PATH\n",
            mpirun, np, strerror(errno));
    _exit(127);
  }
  free(args);
  free(host_list);
  close(err_pipe[1]);
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_handler = on_launcher_signal; /* no SA_RESTART: poll returns EINTR */
  sigemptyset(&action.sa_mask);
  sigaction(SIGTERM, &action, NULL);
  sigaction(SIGINT, &action, NULL);
  stderr_watch watch = {.lost_rank = -1, .silent_from = -1, .silent_to = -1};
  int status = 0;
  bool exited = false, eof = false;
  /* Until mpirun has exited and its stderr is drained (a process that kept the pipe open past
   * mpirun's end must not keep the launcher waiting, so after the exit reads stop at EAGAIN). */
  struct pollfd *fds = calloc((size_t)np + 1, sizeof *fds);
  int *fd_rank = calloc((size_t)np + 1, sizeof *fd_rank);
  while ((!exited || !eof) && fds != NULL && fd_rank != NULL) {
    /* The stderr pipe, and the pidfds of the ranks seen so far. */
    rank_watch_scan(&ranks);
    int nfds = 0;
    if (!eof) fds[nfds++] = (struct pollfd){.fd = err_pipe[0], .events = POLLIN};
    for (int r = 0; r < ranks.np; ++r) {
      if (ranks.pidfds[r] < 0) continue;
      fd_rank[nfds] = r;
      fds[nfds++] = (struct pollfd){.fd = ranks.pidfds[r], .events = POLLIN};
    }
    const int polled = nfds == 0 ? 0 : poll(fds, (nfds_t)nfds, exited ? 0 : 200);
    for (int i = eof ? 0 : 1; polled > 0 && i < nfds; ++i) {
      if (fds[i].revents != 0) rank_watch_ended(&ranks, fd_rank[i]);
    }
    const int ready = eof ? 0 : polled < 0 ? polled : fds[0].revents != 0 ? 1 : 0;
    if (nfds == 0 && !exited) usleep(200 * 1000);
    if (launcher_signal != 0 && !exited) { /* arrived in poll or anywhere else in the loop */
      launcher_signal = 0;
      if (signal_children(pid) == 0) kill(pid, SIGTERM);
    }
    if (ready > 0) {
      char buffer[4096];
      const ssize_t got = read(err_pipe[0], buffer, sizeof buffer);
      if (got > 0) {
        stderr_watch_feed(&watch, buffer, (size_t)got);
      } else if (got == 0 || errno != EINTR) {
        eof = true;
      }
    } else if (ready == 0 && exited) {
      eof = true;
    }
    if (!exited) {
      const pid_t done = waitpid(pid, &status, WNOHANG);
      if (done == pid) {
        exited = true;
      } else if (done < 0 && errno != EINTR) {
        close(err_pipe[0]);
        mp_fail(&err, MP_ERR_RUNTIME, "waiting for %s: %s", mpirun, strerror(errno));
        return cli_report(command, &err);
      }
    }
  }
  close(err_pipe[0]);
  free(fds);
  free(fd_rank);
  rank_watch_scan(&ranks);
  const int silent_rank = ranks.lost_rank;
  rank_watch_free(&ranks);
  char own_host[256];
  if (watch.lost_rank >= 0) {
    if (lost != NULL) *lost = true;
    fprintf(stderr,
            "mpengine run: rank %d was lost: its process died (signal %d) on host %s during the "
            "run; mpirun stopped the other ranks\n",
            watch.lost_rank, watch.lost_signal,
            watch.lost_host[0] != '\0'
                ? watch.lost_host
                : host_of_rank(hosts, watch.lost_rank, own_host, sizeof own_host));
    return CLI_EXIT_FAILURE;
  }
  if (silent_rank >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    if (lost != NULL) *lost = true;
    fprintf(stderr,
            "mpengine run: rank %d was lost: its process ended without a word from mpengine "
            "(killed by a signal, or crashed) on host %s during the run; mpirun stopped the "
            "other ranks\n",
            silent_rank, host_of_rank(hosts, silent_rank, own_host, sizeof own_host));
    return CLI_EXIT_FAILURE;
  }
  if (watch.unreachable_from[0] != '\0') {
    fprintf(stderr,
            "mpengine run: host %s cannot reach host %s: MPI's TCP connection between them "
            "failed (%s), so the job stopped; a route or firewall blocks MPI's ports between "
            "them (or MPI picked the wrong interface: OMPI_MCA_btl_tcp_if_include); check "
            "every pair of hosts with `mpengine doctor%s%s`\n",
            watch.unreachable_from, watch.unreachable_to, watch.unreachable_why,
            many_hosts ? " --hostfile " : "", many_hosts ? hosts->hostfile->path : "");
    return CLI_EXIT_FAILURE;
  }
  if (watch.silent_from >= 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
    char from_buffer[256], to_buffer[256];
    const char *from = host_of_rank(hosts, watch.silent_from, from_buffer, sizeof from_buffer);
    const char *to = host_of_rank(hosts, watch.silent_to, to_buffer, sizeof to_buffer);
    fprintf(stderr,
            "mpengine run: host %s (rank %d) and host %s (rank %d) could not connect within "
            "--comm-timeout %g s at start-up, so the job stopped: a firewall between them drops "
            "MPI's packets (or MPI picked an interface that does not connect them: "
            "OMPI_MCA_btl_tcp_if_include); check every pair of hosts with `mpengine doctor%s%s`\n",
            from, watch.silent_from, to, watch.silent_to, watch.silent_timeout,
            many_hosts ? " --hostfile " : "", many_hosts ? hosts->hostfile->path : "");
    return CLI_EXIT_FAILURE;
  }
  if (WIFEXITED(status)) {
    const int code = WEXITSTATUS(status);
    /* The ranks exit 0, 1 or 2; anything else (127: no mpirun, 128 + N: a rank ended by
     * signal N) is a failure of the run. */
    return code <= CLI_EXIT_USAGE ? code : CLI_EXIT_FAILURE;
  }
  fprintf(stderr, "mpengine run: %s ended by signal %d\n", mpirun,
          WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  return CLI_EXIT_FAILURE;
}

