/* tools/hostfile.c — hostfiles and rank placement; see hostfile.h. */
#include "tools/hostfile.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A host name as Open MPI takes it: letters, digits, '.', '-', '_' (and ':' for IPv6
 * addresses). Anything else is most likely a typo such as "node1,slots=4". */
static int valid_host_name(const char *name) {
  if (name[0] == '\0') return 0;
  for (const char *c = name; *c != '\0'; ++c) {
    if (!isalnum((unsigned char)*c) && *c != '.' && *c != '-' && *c != '_' && *c != ':') return 0;
  }
  return 1;
}

/* Parses the positive integer of "key=value"; 0 on success. */
static int parse_count(const char *value, int *out) {
  char *end = NULL;
  errno = 0;
  const long number = strtol(value, &end, 10);
  if (end == value || *end != '\0' || errno != 0 || number < INT_MIN || number > INT_MAX) return -1;
  *out = (int)number;
  return 0;
}

/* One line (comment and line break already cut off); a blank one adds nothing. */
static mp_status parse_line(const char *path, int line_number, char *line, mp_hostfile *out,
                            int *capacity, mp_error *err) {
  char *save = NULL;
  char *name = strtok_r(line, " \t\r", &save);
  if (name == NULL) return MP_OK;
  if (!valid_host_name(name)) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s:%d: '%s' is not a host name; a line is `HOST slots=N [max_slots=M]`",
                   path, line_number, name);
  }
  if (strlen(name) >= MP_HOSTFILE_NAME_BYTES) {
    return mp_fail(err, MP_ERR_INPUT, "%s:%d: the host name is longer than %d characters", path,
                   line_number, MP_HOSTFILE_NAME_BYTES - 1);
  }
  mp_hostfile_host host = {.slots = -1, .line = line_number};
  snprintf(host.name, sizeof host.name, "%s", name);
  char *field;
  while ((field = strtok_r(NULL, " \t\r", &save)) != NULL) {
    char *equals = strchr(field, '=');
    int *target = NULL;
    if (equals != NULL) {
      *equals = '\0';
      if (strcmp(field, "slots") == 0) target = &host.slots;
      if (strcmp(field, "max_slots") == 0 || strcmp(field, "max-slots") == 0) {
        target = &host.max_slots;
      }
    }
    if (target == NULL) {
      if (equals != NULL) *equals = '=';
      return mp_fail(err, MP_ERR_INPUT,
                     "%s:%d: unknown field '%s' after host %s; a line is `HOST slots=N "
                     "[max_slots=M]`",
                     path, line_number, field, host.name);
    }
    if (parse_count(equals + 1, target) != 0 || *target < 1) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s:%d: %s=%s for host %s: expected a whole number of at least 1 (the ranks "
                     "that host may run)",
                     path, line_number, field, equals + 1, host.name);
    }
  }
  if (host.slots < 0) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s:%d: host %s has no slots=N; mpengine places whole tensor-parallel groups "
                   "before it reaches the hosts, so it needs the ranks each may run: write "
                   "`%s slots=N`",
                   path, line_number, host.name, host.name);
  }
  if (host.max_slots != 0 && host.max_slots < host.slots) {
    return mp_fail(err, MP_ERR_INPUT, "%s:%d: host %s has max_slots=%d below slots=%d; raise "
                   "max_slots or lower slots",
                   path, line_number, host.name, host.max_slots, host.slots);
  }
  for (int h = 0; h < out->count; ++h) {
    if (strcmp(out->hosts[h].name, host.name) == 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s:%d: host %s is named twice (first on line %d); give it one line with "
                     "all its slots",
                     path, line_number, host.name, out->hosts[h].line);
    }
  }
  if (out->count == *capacity) {
    const int grown = *capacity > 0 ? *capacity * 2 : 8;
    mp_hostfile_host *hosts = realloc(out->hosts, (size_t)grown * sizeof *hosts);
    if (hosts == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
    out->hosts = hosts;
    *capacity = grown;
  }
  out->hosts[out->count++] = host;
  return MP_OK;
}

mp_status mp_hostfile_parse(const char *path, const char *text, mp_hostfile *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  snprintf(out->path, sizeof out->path, "%s", path);
  char *copy = strdup(text);
  if (copy == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  int capacity = 0, line_number = 0;
  mp_status status = MP_OK;
  for (char *line = copy; line != NULL && status == MP_OK;) {
    char *next = strchr(line, '\n');
    if (next != NULL) *next++ = '\0';
    ++line_number;
    char *comment = strchr(line, '#');
    if (comment != NULL) *comment = '\0';
    status = parse_line(path, line_number, line, out, &capacity, err);
    line = next;
  }
  free(copy);
  if (status == MP_OK && out->count == 0) {
    status = mp_fail(err, MP_ERR_INPUT,
                     "%s:%d: names no host; write one line per host: `HOST slots=N`", path,
                     line_number > 0 ? line_number : 1);
  }
  if (status != MP_OK) mp_hostfile_free(out);
  return status;
}

mp_status mp_hostfile_read(const char *path, mp_hostfile *out, mp_error *err) {
  memset(out, 0, sizeof *out);
  FILE *file = fopen(path, "rb");
  if (file == NULL) {
    return mp_fail(err, MP_ERR_INPUT, "--hostfile %s: cannot open it: %s", path, strerror(errno));
  }
  size_t size = 0, capacity = 4096;
  char *text = malloc(capacity);
  size_t got;
  while (text != NULL && (got = fread(text + size, 1, capacity - 1 - size, file)) > 0) {
    size += got;
    if (size == capacity - 1) {
      char *grown = realloc(text, capacity * 2);
      if (grown == NULL) free(text);
      text = grown;
      capacity *= 2;
    }
  }
  const int failed = ferror(file);
  fclose(file);
  if (text == NULL) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  if (failed) {
    free(text);
    return mp_fail(err, MP_ERR_INPUT, "--hostfile %s: cannot read it", path);
  }
  text[size] = '\0';
  const mp_status status = mp_hostfile_parse(path, text, out, err);
  free(text);
  return status;
}

mp_status mp_hostfile_check_resolves(const mp_hostfile *hostfile, mp_error *err) {
  for (int h = 0; h < hostfile->count; ++h) {
    const mp_hostfile_host *host = &hostfile->hosts[h];
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo *found = NULL;
    const int code = getaddrinfo(host->name, NULL, &hints, &found);
    if (found != NULL) freeaddrinfo(found);
    if (code != 0) {
      return mp_fail(err, MP_ERR_INPUT,
                     "%s:%d: host %s does not resolve (%s); correct the name, or add it to DNS "
                     "or /etc/hosts on this machine and every host",
                     hostfile->path, host->line, host->name, gai_strerror(code));
    }
  }
  return MP_OK;
}

mp_status mp_hostfile_place(const mp_hostfile *hostfile, int world, int tp, mp_placement *out,
                            mp_error *err) {
  memset(out, 0, sizeof *out);
  if (world < 1 || tp < 1 || world % tp != 0) {
    return mp_fail(err, MP_ERR_INPUT, "placement: %d ranks do not form groups of tp %d", world,
                   tp);
  }
  out->first_rank = calloc((size_t)hostfile->count, sizeof *out->first_rank);
  out->ranks = calloc((size_t)hostfile->count, sizeof *out->ranks);
  if (out->first_rank == NULL || out->ranks == NULL) {
    mp_placement_free(out);
    return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  }
  out->host_count = hostfile->count;
  int placed = 0, total_slots = 0;
  const mp_hostfile_host *split_host = NULL; /* the first host with slots left over from tp */
  for (int h = 0; h < hostfile->count; ++h) {
    const mp_hostfile_host *host = &hostfile->hosts[h];
    total_slots += host->slots;
    if (host->slots % tp != 0 && split_host == NULL) split_host = host;
    const int whole = host->slots / tp * tp;
    const int take = whole < world - placed ? whole : world - placed;
    out->first_rank[h] = placed;
    out->ranks[h] = take;
    placed += take;
  }
  if (placed == world) return MP_OK;
  mp_placement_free(out);
  if (split_host != NULL && total_slots >= world) {
    return mp_fail(err, MP_ERR_INPUT,
                   "%s:%d: host %s has slots=%d, which does not hold whole tensor-parallel groups "
                   "of tp %d (a tp group never spans hosts), so the hosts hold %d of the plan's "
                   "%d ranks; give %s a multiple of %d slots",
                   hostfile->path, split_host->line, split_host->name, split_host->slots, tp,
                   placed, world, split_host->name, tp);
  }
  const mp_hostfile_host *last = &hostfile->hosts[hostfile->count - 1];
  return mp_fail(err, MP_ERR_INPUT,
                 "%s:%d: the hosts have %d slot%s in whole tp groups of %d, fewer than the plan's "
                 "%d ranks; add hosts or slots, or plan for %d ranks (mpengine plan --gpus %d)",
                 hostfile->path, last->line, placed, placed == 1 ? "" : "s", tp, world, placed,
                 placed);
}

int mp_placement_host_of(const mp_placement *placement, int rank) {
  for (int h = 0; h < placement->host_count; ++h) {
    if (rank >= placement->first_rank[h] && rank < placement->first_rank[h] + placement->ranks[h]) {
      return h;
    }
  }
  return -1;
}

void mp_placement_free(mp_placement *placement) {
  free(placement->first_rank);
  free(placement->ranks);
  memset(placement, 0, sizeof *placement);
}

void mp_hostfile_free(mp_hostfile *hostfile) {
  free(hostfile->hosts);
  hostfile->hosts = NULL;
  hostfile->count = 0;
}
