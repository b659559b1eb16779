/* tests/fuzz/trace_json_fuzz.c — libFuzzer target: traces of `mpengine run --trace`
 * (mp_trace_read of a file, then the first and the last step read back, drawn as ascii and
 * measured, as `mpengine timeline` does). */
#include "tests/fuzz/fuzz_util.h" /* first: it defines _GNU_SOURCE for memfd_create */

#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine/trace/trace_reader.h"
#include "schedules/text.h"
#include "schedules/timeline.h"

static void step(const mp_trace_file *file, int64_t number) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_schedule schedule;
  mp_simulation simulation;
  if (mp_trace_step_timeline(file, number, &schedule, &simulation, &err) == MP_OK) {
    mp_text text = MP_TEXT_INITIALIZER;
    mp_timeline_options options = MP_TIMELINE_OPTIONS_INITIALIZER;
    options.measured = true;
    if (mp_timeline_write(&schedule, &simulation, MP_TIMELINE_ASCII, &options, &text, &err) !=
        MP_OK) {
      abort(); /* a step read back always draws */
    }
    mp_text_free(&text);
  } else if (err.message[0] == '\0') {
    abort(); /* a refusal must say why */
  }
  mp_simulation_free(&simulation);
  mp_schedule_free(&schedule);
  mp_trace_step_measurement measurement;
  err = (mp_error)MP_ERROR_INITIALIZER;
  if (mp_trace_measure_step(file, number, &measurement, &err) != MP_OK && err.message[0] == '\0') {
    abort();
  }
  mp_trace_step_measurement_free(&measurement);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char path[64];
  int fd = fuzz_memfd_path(data, size, path, sizeof path);
  if (fd < 0) return 0;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_trace_file *file = NULL;
  if (mp_trace_read(path, &file, &err) == MP_OK) {
    const mp_trace_summary *summary = mp_trace_file_summary(file);
    step(file, summary->first_step);
    step(file, summary->last_step);
    mp_trace_file_free(file);
  } else if (err.message[0] == '\0') {
    abort();
  }
  close(fd);
  return 0;
}
