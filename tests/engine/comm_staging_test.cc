// tests/engine/comm_staging_test.cc — engine/comm/comm_mpi.c's staging of GPU buffers, on CPUs, under
// mpirun (comm_staging_test.sh: 1, 2 and 3 ranks).
//
// This binary defines engine/comm/comm_staging.h itself, so the linker takes these definitions instead
// of the CUDA ones: "device memory" is memory mapped with no access (PROT_NONE), so MPI touching a
// device buffer instead of its staged copy crashes the test, and the copies open it for the
// moment they run. Every operation of engine/comm/comm.h is checked on device buffers (in, out, both,
// or neither): results, that host buffers are never staged, that pinned blocks are reused rather
// than allocated again, and the one-member shortcuts. The real CUDA path runs on a GPU machine
// (tools/device_check.sh: mpirun -np 2 mpengine bench comm --buffers device).
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "engine/comm/comm.h"
#include "engine/comm/comm_staging.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

// --- the fake device -----------------------------------------------------------------------------

std::map<uintptr_t, size_t> g_device;  // start -> bytes of each fake device allocation
int g_copies = 0, g_host_allocs = 0, g_host_frees = 0;

// The allocation holding p, or g_device.end().
std::map<uintptr_t, size_t>::iterator find_device(const void *p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  auto it = g_device.upper_bound(address);
  if (it == g_device.begin()) return g_device.end();
  --it;
  return address < it->first + it->second ? it : g_device.end();
}

void set_access(std::map<uintptr_t, size_t>::iterator it, int protection) {
  ASSERT_EQ(mprotect(reinterpret_cast<void *>(it->first), it->second, protection), 0);
}

float *device_alloc(size_t count) {
  size_t bytes = count * sizeof(float);
  if (bytes == 0) bytes = 1;
  void *p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(p, MAP_FAILED);
  g_device[reinterpret_cast<uintptr_t>(p)] = bytes;
  return static_cast<float *>(p);
}

void device_free(float *p) {
  auto it = find_device(p);
  ASSERT_NE(it, g_device.end());
  munmap(reinterpret_cast<void *>(it->first), it->second);
  g_device.erase(it);
}

void device_write(float *device, const std::vector<float> &host) {
  auto it = find_device(device);
  set_access(it, PROT_READ | PROT_WRITE);
  std::memcpy(device, host.data(), host.size() * sizeof(float));
  set_access(it, PROT_NONE);
}

std::vector<float> device_read(const float *device, size_t count) {
  std::vector<float> host(count);
  auto it = find_device(device);
  set_access(it, PROT_READ);
  std::memcpy(host.data(), device, count * sizeof(float));
  set_access(it, PROT_NONE);
  return host;
}

}  // namespace

extern "C" {

bool mp_staging_is_device(const void *pointer) { return find_device(pointer) != g_device.end(); }

const char *mp_staging_backend(void) { return "fake"; }

mp_status mp_staging_host_alloc(void **out, size_t bytes, mp_error *err) {
  *out = std::malloc(bytes > 0 ? bytes : 1);
  if (*out == nullptr) return mp_fail(err, MP_ERR_RUNTIME, "out of memory");
  ++g_host_allocs;
  return MP_OK;
}

void mp_staging_host_free(void *pointer) {
  if (pointer == nullptr) return;
  ++g_host_frees;
  std::free(pointer);
}

mp_status mp_staging_copy(void *dst, const void *src, size_t bytes, mp_error *err) {
  if (bytes == 0) return MP_OK;
  ++g_copies;
  auto d = find_device(dst), s = find_device(src);
  if (d != g_device.end()) mprotect(reinterpret_cast<void *>(d->first), d->second, PROT_READ | PROT_WRITE);
  if (s != g_device.end()) mprotect(reinterpret_cast<void *>(s->first), s->second, PROT_READ | PROT_WRITE);
  std::memmove(dst, src, bytes);
  if (d != g_device.end()) mprotect(reinterpret_cast<void *>(d->first), d->second, PROT_NONE);
  if (s != g_device.end()) mprotect(reinterpret_cast<void *>(s->first), s->second, PROT_NONE);
  return MP_OK;
}

}  // extern "C"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;  // every rank, named "tp"

int rank() { return mp_comm_rank(g_all); }
int size() { return mp_comm_size(g_all); }

// Small integers, exact in float: rank r's element i.
float value(int r, size_t i) { return (float)((r + 1) * (int)(i % 7 + 1)); }
std::vector<float> values(int r, size_t count, size_t offset = 0) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(r, offset + i);
  return v;
}
float rank_sum() { return (float)(size() * (size() + 1) / 2); }

TEST(CommStaging, TheFakeIsInUse) { EXPECT_STREQ(mp_staging_backend(), "fake"); }

TEST(CommStaging, AllReduceOnADeviceBufferBlockingAndPosted) {
  const size_t n = 1000;
  float *buffer = device_alloc(n);
  for (int posted = 0; posted < 2; ++posted) {
    device_write(buffer, values(rank(), n));
    mp_error err = MP_ERROR_INITIALIZER;
    if (posted) {
      mp_comm_request *request = nullptr;
      ASSERT_EQ(mp_comm_iall_reduce_sum_f32(g_all, buffer, n, &request, &err), MP_OK)
          << err.message;
      ASSERT_EQ(mp_comm_wait(request, &err), MP_OK) << err.message;
    } else {
      ASSERT_EQ(mp_comm_all_reduce_sum_f32(g_all, buffer, n, &err), MP_OK) << err.message;
    }
    std::vector<float> got = device_read(buffer, n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], rank_sum() * (float)(i % 7 + 1)) << i;
  }
  device_free(buffer);
}

TEST(CommStaging, SendAndReceiveBetweenDeviceAndHostBuffers) {
  if (size() < 2) GTEST_SKIP() << "CommStaging.SendAndReceiveBetweenDeviceAndHostBuffers needs 2 ranks";
  const size_t n = 3000;
  float *device = device_alloc(n);
  std::vector<float> host(n, -1.0f);
  mp_error err = MP_ERROR_INITIALIZER;
  // Rank 0 sends a device buffer (blocking, then posted) to rank 1, which receives into a device
  // buffer and then a host buffer; rank 1 answers from its device buffer into rank 0's host one.
  if (rank() == 0) {
    device_write(device, values(0, n));
    ASSERT_EQ(mp_comm_send(g_all, device, n * sizeof(float), 1, &err), MP_OK) << err.message;
    mp_comm_request *request = nullptr;
    ASSERT_EQ(mp_comm_isend(g_all, device, n * sizeof(float), 1, &request, &err), MP_OK)
        << err.message;
    device_write(device, std::vector<float>(n, 0.0f));  // the send copied it out already
    ASSERT_EQ(mp_comm_wait(request, &err), MP_OK) << err.message;
    ASSERT_EQ(mp_comm_recv(g_all, host.data(), n * sizeof(float), 1, &err), MP_OK) << err.message;
    EXPECT_EQ(host, values(1, n));
  } else if (rank() == 1) {
    ASSERT_EQ(mp_comm_recv(g_all, device, n * sizeof(float), 0, &err), MP_OK) << err.message;
    EXPECT_EQ(device_read(device, n), values(0, n));
    ASSERT_EQ(mp_comm_recv(g_all, host.data(), n * sizeof(float), 0, &err), MP_OK) << err.message;
    EXPECT_EQ(host, values(0, n));
    device_write(device, values(1, n));
    ASSERT_EQ(mp_comm_send(g_all, device, n * sizeof(float), 0, &err), MP_OK) << err.message;
  }
  device_free(device);
}

TEST(CommStaging, ReduceScatterAndAllGatherWithDeviceInputsOutputsOrBoth) {
  const size_t count = 257;
  const int n = size();
  for (int where = 1; where < 4; ++where) {  // bit 0: input on the device; bit 1: output
    const bool device_in = where & 1, device_out = where & 2;
    mp_error err = MP_ERROR_INITIALIZER;
    // Reduce-scatter: input (n * count), output (count).
    std::vector<float> in_host = values(rank(), count * n), out_host(count, -1.0f);
    float *in_dev = device_in ? device_alloc(count * n) : nullptr;
    float *out_dev = device_out ? device_alloc(count) : nullptr;
    if (device_in) device_write(in_dev, in_host);
    const float *in = device_in ? in_dev : in_host.data();
    float *out = device_out ? out_dev : out_host.data();
    ASSERT_EQ(mp_comm_reduce_scatter_sum_f32(g_all, in, out, count, &err), MP_OK) << err.message;
    std::vector<float> got = device_out ? device_read(out_dev, count) : out_host;
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], rank_sum() * (float)((rank() * count + i) % 7 + 1)) << where << " " << i;
    }
    if (device_in) device_free(in_dev);
    if (device_out) device_free(out_dev);

    // All-gather: input (count), output (n * count).
    std::vector<float> gin_host = values(rank(), count), gout_host(count * n, -1.0f);
    float *gin_dev = device_in ? device_alloc(count) : nullptr;
    float *gout_dev = device_out ? device_alloc(count * n) : nullptr;
    if (device_in) device_write(gin_dev, gin_host);
    ASSERT_EQ(mp_comm_all_gather_f32(g_all, device_in ? gin_dev : gin_host.data(),
                                     device_out ? gout_dev : gout_host.data(), count, &err),
              MP_OK)
        << err.message;
    got = device_out ? device_read(gout_dev, count * n) : gout_host;
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[r * count + i], value(r, i)) << where;
    }
    if (device_in) device_free(gin_dev);
    if (device_out) device_free(gout_dev);
  }
}

TEST(CommStaging, BroadcastIntoDeviceAndHostBuffers) {
  const size_t n = 500;
  // The root's buffer is on the device; odd ranks receive into the device, even ones into the host.
  const bool device = rank() == 0 || rank() % 2 == 1;
  float *dev = device ? device_alloc(n) : nullptr;
  std::vector<float> host(n, -1.0f);
  if (rank() == 0) device_write(dev, values(0, n));
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_comm_broadcast(g_all, device ? (void *)dev : (void *)host.data(), n * sizeof(float),
                              0, &err),
            MP_OK)
      << err.message;
  EXPECT_EQ(device ? device_read(dev, n) : host, values(0, n));
  if (device) device_free(dev);
}

TEST(CommStaging, HostBuffersAreNeverStaged) {
  const size_t n = 100;
  std::vector<float> buffer = values(rank(), n), out(n * size());
  const int copies = g_copies, allocs = g_host_allocs;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_comm_all_reduce_sum_f32(g_all, buffer.data(), n, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_comm_all_gather_f32(g_all, buffer.data(), out.data(), n, &err), MP_OK)
      << err.message;
  ASSERT_EQ(mp_comm_broadcast(g_all, buffer.data(), n * sizeof(float), 0, &err), MP_OK)
      << err.message;
  EXPECT_EQ(g_copies, copies);
  EXPECT_EQ(g_host_allocs, allocs);
}

TEST(CommStaging, PinnedBlocksAreReusedNotReallocated) {
  if (size() < 2) GTEST_SKIP() << "CommStaging.PinnedBlocksAreReusedNotReallocated needs 2 ranks";
  const size_t n = 4096;
  float *buffer = device_alloc(n);
  mp_error err = MP_ERROR_INITIALIZER;
  device_write(buffer, values(rank(), n));
  ASSERT_EQ(mp_comm_all_reduce_sum_f32(g_all, buffer, n, &err), MP_OK) << err.message;
  const int allocs = g_host_allocs;
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(mp_comm_all_reduce_sum_f32(g_all, buffer, n, &err), MP_OK) << err.message;
    ASSERT_EQ(mp_comm_broadcast(g_all, buffer, 1000, 0, &err), MP_OK) << err.message;
  }
  EXPECT_EQ(g_host_allocs, allocs) << "every operation allocated its own pinned block";
  EXPECT_LE(g_host_allocs - g_host_frees, 8) << "more pinned blocks alive than the world keeps";
  device_free(buffer);
}

TEST(CommStaging, OneMemberGroupsCopyDeviceBuffers) {
  mp_comm *self = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  const int me = mp_comm_world_rank(g_world);
  ASSERT_EQ(mp_comm_group_create(g_world, &me, 1, "self", &self, &err), MP_OK) << err.message;
  const size_t n = 64;
  float *in = device_alloc(n), *out = device_alloc(n);
  device_write(in, values(rank(), n));
  EXPECT_EQ(mp_comm_reduce_scatter_sum_f32(self, in, out, n, &err), MP_OK) << err.message;
  EXPECT_EQ(device_read(out, n), values(rank(), n));
  std::vector<float> host(n, -1.0f);
  EXPECT_EQ(mp_comm_all_gather_f32(self, in, host.data(), n, &err), MP_OK) << err.message;
  EXPECT_EQ(host, values(rank(), n));
  EXPECT_EQ(mp_comm_all_reduce_sum_f32(self, in, n, &err), MP_OK) << err.message;
  EXPECT_EQ(device_read(in, n), values(rank(), n));
  device_free(in);
  device_free(out);
  mp_comm_free(self);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "comm_staging_test", &g_world, &g_all, nullptr);
}
