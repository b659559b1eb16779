/* tools/doctor_report.c — doctor's facts line, outcome words and comparisons; see doctor_report.h. */
#define _POSIX_C_SOURCE 200809L
#include "tools/doctor_report.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

bool mp_doctor_facts_format(const mp_doctor_facts *facts, char *out, size_t bytes) {
  cJSON *root = cJSON_CreateObject();
  if (root == NULL) return false;
  cJSON_AddStringToObject(root, "host", facts->host);
  cJSON_AddStringToObject(root, "hostname", facts->hostname);
  cJSON_AddStringToObject(root, "version", facts->version);
  cJSON_AddStringToObject(root, "build", facts->build);
  cJSON_AddStringToObject(root, "mpi", facts->mpi);
  cJSON_AddStringToObject(root, "nccl", facts->nccl);
  cJSON_AddStringToObject(root, "cuda_driver", facts->cuda_driver);
  cJSON_AddNumberToObject(root, "gpus", facts->gpus);
  cJSON_AddNumberToObject(root, "gpu_memory_bytes", (double)facts->gpu_memory_bytes);
  cJSON_AddNumberToObject(root, "free_memory_bytes", (double)facts->free_memory_bytes);
  cJSON_AddStringToObject(root, "address", facts->address);
  cJSON_AddBoolToObject(root, "address_local", facts->address_local);
  cJSON_AddStringToObject(root, "interface", facts->interface);
  cJSON_AddStringToObject(root, "interface_address", facts->interface_address);
  cJSON_AddStringToObject(root, "interface_rule", facts->interface_rule);
  cJSON_AddNumberToObject(root, "port", facts->port);
  char *text = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (text == NULL) return false;
  const bool fits = strlen(text) < bytes;
  if (fits) memcpy(out, text, strlen(text) + 1);
  free(text);
  return fits;
}

static bool copy_string(const cJSON *root, const char *key, char *out, size_t bytes) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!cJSON_IsString(item) || strlen(item->valuestring) >= bytes) return false;
  memcpy(out, item->valuestring, strlen(item->valuestring) + 1);
  return true;
}

static bool copy_number(const cJSON *root, const char *key, double *out) {
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, key);
  if (!cJSON_IsNumber(item)) return false;
  *out = item->valuedouble;
  return true;
}

mp_status mp_doctor_facts_parse(const char *line, const char *source, mp_doctor_facts *out,
                                mp_error *err) {
  memset(out, 0, sizeof *out);
  cJSON *root = cJSON_Parse(line);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return mp_fail(err, MP_ERR_RUNTIME, "%s: the agent's answer is not its JSON facts line: '%.200s'",
                   source, line);
  }
  double gpus = 0, gpu_memory = 0, free_memory = 0, port = 0;
  const cJSON *local = cJSON_GetObjectItemCaseSensitive(root, "address_local");
  const bool ok =
      copy_string(root, "host", out->host, sizeof out->host) &&
      copy_string(root, "hostname", out->hostname, sizeof out->hostname) &&
      copy_string(root, "version", out->version, sizeof out->version) &&
      copy_string(root, "build", out->build, sizeof out->build) &&
      copy_string(root, "mpi", out->mpi, sizeof out->mpi) &&
      copy_string(root, "nccl", out->nccl, sizeof out->nccl) &&
      copy_string(root, "cuda_driver", out->cuda_driver, sizeof out->cuda_driver) &&
      copy_number(root, "gpus", &gpus) && copy_number(root, "gpu_memory_bytes", &gpu_memory) &&
      copy_number(root, "free_memory_bytes", &free_memory) &&
      copy_string(root, "address", out->address, sizeof out->address) && cJSON_IsBool(local) &&
      copy_string(root, "interface", out->interface, sizeof out->interface) &&
      copy_string(root, "interface_address", out->interface_address,
                  sizeof out->interface_address) &&
      copy_string(root, "interface_rule", out->interface_rule, sizeof out->interface_rule) &&
      copy_number(root, "port", &port);
  if (ok) {
    out->address_local = cJSON_IsTrue(local);
    out->gpus = (int)gpus;
    out->gpu_memory_bytes = (int64_t)gpu_memory;
    out->free_memory_bytes = (int64_t)free_memory;
    out->port = (int)port;
  }
  cJSON_Delete(root);
  if (!ok) {
    return mp_fail(err, MP_ERR_RUNTIME,
                   "%s: the agent's facts line lacks a key this doctor needs (an agent of another "
                   "mpengine version?): '%.200s'",
                   source, line);
  }
  return MP_OK;
}

const char *mp_doctor_connect_outcome(int error_number) {
  switch (error_number) {
    case ECONNREFUSED:
      return "refused";
    case EHOSTUNREACH:
    case ENETUNREACH:
    case EACCES: /* a prohibit route, an iptables REJECT with an admin-prohibited reply */
    case EPERM:
    case EINVAL: /* a blackhole route */
      return "no route";
    case ETIMEDOUT:
      return "timed out";
    default:
      return strerror(error_number);
  }
}

bool mp_doctor_is_loopback(const char *address) {
  struct in_addr v4;
  if (inet_pton(AF_INET, address, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  struct in6_addr v6;
  if (inet_pton(AF_INET6, address, &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
  }
  return false;
}

/* One item of a spec: "A.B.C.D/N", "=name" or a name prefix. */
static bool item_matches(const char *item, size_t length, const char *name, const char *ipv4) {
  char text[128];
  if (length == 0 || length >= sizeof text) return false;
  memcpy(text, item, length);
  text[length] = '\0';
  char *slash = strchr(text, '/');
  if (slash != NULL) {
    *slash = '\0';
    struct in_addr network, address;
    char *end;
    const long bits = strtol(slash + 1, &end, 10);
    if (*end != '\0' || bits < 0 || bits > 32) return false;
    if (inet_pton(AF_INET, text, &network) != 1 || inet_pton(AF_INET, ipv4, &address) != 1) {
      return false;
    }
    const uint32_t mask = bits == 0 ? 0 : 0xffffffffu << (32 - bits);
    return (ntohl(network.s_addr) & mask) == (ntohl(address.s_addr) & mask);
  }
  if (text[0] == '=') return strcmp(text + 1, name) == 0;
  return strncmp(name, text, strlen(text)) == 0;
}

bool mp_doctor_interface_matches(const char *spec, const char *name, const char *ipv4) {
  const bool exclude = spec[0] == '^';
  const char *item = exclude ? spec + 1 : spec;
  bool matched = false;
  while (*item != '\0') {
    const char *comma = strchr(item, ',');
    const size_t length = comma != NULL ? (size_t)(comma - item) : strlen(item);
    if (item_matches(item, length, name, ipv4)) matched = true;
    if (comma == NULL) break;
    item = comma + 1;
  }
  return exclude ? !matched : matched;
}

bool mp_doctor_same_value(const char *const *hosts, const char *const *values, int n, char *out,
                          size_t bytes) {
  bool same = true;
  for (int i = 1; i < n; ++i) same = same && strcmp(values[i], values[0]) == 0;
  if (same) {
    snprintf(out, bytes, "%s on every host", values[0]);
    return true;
  }
  size_t used = 0;
  out[0] = '\0';
  for (int i = 0; i < n; ++i) {
    bool seen = false;
    for (int j = 0; j < i; ++j) seen = seen || strcmp(values[j], values[i]) == 0;
    if (seen) continue;
    int written = snprintf(out + used, bytes - used, "%s", used > 0 ? "; " : "");
    if (written > 0 && (size_t)written < bytes - used) used += (size_t)written;
    for (int j = i, first = 1; j < n; ++j) {
      if (strcmp(values[j], values[i]) != 0) continue;
      written = snprintf(out + used, bytes - used, "%s%s", first ? "" : ", ", hosts[j]);
      if (written > 0 && (size_t)written < bytes - used) used += (size_t)written;
      first = 0;
    }
    written = snprintf(out + used, bytes - used, ": %s", values[i]);
    if (written > 0 && (size_t)written < bytes - used) used += (size_t)written;
  }
  return false;
}
