/*
 * engine/trace/trace_format.h — what the writer (engine/trace/trace.h, under MPI) and the reader
 * (engine/trace/trace_reader.h, no MPI) of a trace file share: the run's layout as the file's
 * "mpengine" object holds it, and the format's name and version. The format itself is described in
 * trace.h.
 */
#ifndef MPENGINE_ENGINE_TRACE_FORMAT_H
#define MPENGINE_ENGINE_TRACE_FORMAT_H

#ifdef __cplusplus
extern "C" {
#endif

/* What the trace file says about the run (the "mpengine" object). */
typedef struct {
  char plan[1024];        /* the plan file */
  char schedule[32];      /* "1f1b", ... */
  int dp, pp, tp, virtual_stages;
  int num_micro_batches;  /* per dp rank and step */
} mp_trace_layout;

/* "mpengine-trace" and 1: the "format" and "version" of the "mpengine" object. */
#define MP_TRACE_FORMAT "mpengine-trace"
enum { MP_TRACE_VERSION = 1 };

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TRACE_FORMAT_H */
