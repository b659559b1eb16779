/* engine/comm/poll_wait.c — the bounded poll-with-backoff wait; see poll_wait.h. */
#define _POSIX_C_SOURCE 200809L
#include "engine/comm/poll_wait.h"

#include <sched.h>
#include <time.h>

enum {
  kFirstSleepNs = 10000,  /* past the spin, sleep 10 us between polls, doubling ... */
  kMaxSleepNs = 1000000,  /* ... up to 1 ms */
};

double mp_poll_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

mp_status mp_poll_wait(mp_poll_fn poll, void *context, double deadline_s, double spin_s,
                       bool *timed_out, mp_error *err) {
  const double spin_until = mp_poll_now_s() + spin_s;
  long sleep_ns = kFirstSleepNs;
  *timed_out = false;
  for (;;) {
    bool done = false;
    MP_TRY(poll(context, &done, err));
    if (done) return MP_OK;
    const double now = mp_poll_now_s();
    if (now >= deadline_s) {
      *timed_out = true;
      return MP_OK;
    }
    if (now < spin_until) {
      sched_yield();
    } else {
      struct timespec pause = {0, sleep_ns};
      nanosleep(&pause, NULL);
      sleep_ns = sleep_ns * 2 < kMaxSleepNs ? sleep_ns * 2 : kMaxSleepNs;
    }
  }
}
