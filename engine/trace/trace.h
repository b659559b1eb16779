/*
 * engine/trace/trace.h — the trace recorder of `mpengine run --trace TRACE.json`: every action of
 * the stage worker and every send, receive and collective, on every rank, with start and end times,
 * merged by rank 0 into one Chrome trace (DESIGN.md, "trace") that `mpengine timeline` draws
 * (engine/trace/trace_reader.h reads it back).
 *
 * Clocks. mp_trace_align_clocks is collective over the world: the ranks meet at a barrier and each
 * takes the moment it leaves as its zero, so times on different ranks are comparable to about
 * the barrier's exit skew (microseconds on one machine). Times are seconds from that zero
 * (CLOCK_MONOTONIC).
 *
 * Recording costs one append to a growing array per event (no I/O, no communication), so it can
 * stay on for a whole run. mp_trace_write is the only collective after the alignment. A recorder
 * belongs to one thread (the stage worker's); it takes no locks.
 *
 * The file: one Chrome trace event JSON object (opens in Perfetto and chrome://tracing), one event
 * a line, "ts" and "dur" in microseconds since the aligned zero.
 *   "traceEvents": one process per world rank ("pid" = world rank, named
 *     "rank R (dp D, pp P, tp T)" and sorted by rank);
 *     thread 0 ("compute"): one "X" slice per action, named "F3", "B3", "W3" (the label of
 *       `mpengine schedule`; "F3b" is micro-batch 3 on chunk 1 when there are chunks), "cat"
 *       "compute", args {step, kind (mp_action_kind_name: "forward", "backward", "input-gradient
 *       backward", "weight-gradient backward"), micro_batch, chunk, stage}; and, when the caller
 *       records it, one "X" slice per training step ("step 5", "cat" "step", args {step}) under
 *       which the step's actions nest;
 *     thread 1 ("communication"): one "X" slice per send, recv or collective, named "send
 *       activation 3", "recv gradient 3" or "all-reduce dp", "cat" "communication", args {step,
 *       operation, group, peer (world rank, -1 for a collective), bytes} and, for a send or
 *       receive of a pipeline message, {message ("activation" | "gradient"), micro_batch,
 *       from_stage, to_stage};
 *     flows: "s" (on the send's slice) and "f" ("bp": "e", on the receive's slice), "cat" "p2p",
 *       one id per pair, linking each send to the receive of the same message in the same step
 *       between the same two world ranks.
 *   "mpengine": {"format": "mpengine-trace", "version": 1, "plan", "schedule", "dp", "pp", "tp",
 *     "virtual_stages", "num_micro_batches" (mp_trace_layout), "world_size", "steps" (how many
 *     distinct steps were recorded), "first_step", "last_step" (-1 when none), "complete" (false
 *     when a rank ran out of memory recording and dropped events), "dropped_events", "ranks": [one
 *     {"rank", "dp", "pp", "tp", "events"} per world rank, in rank order]}.
 * mp_trace_layout and the format's name and version are in engine/trace/trace_format.h, which the
 * reader shares without linking MPI.
 */
#ifndef MPENGINE_ENGINE_TRACE_H
#define MPENGINE_ENGINE_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "engine/comm/comm.h"
#include "engine/trace/trace_format.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_trace mp_trace;

/* A recorder for this process: world_rank and its grid coordinates. MP_ERR_INPUT when a size of
 * the layout is below 1 or a coordinate is outside it; MP_ERR_RUNTIME when out of memory. */
mp_status mp_trace_create(const mp_trace_layout *layout, int world_rank, int dp_rank, int pp_rank,
                          int tp_rank, mp_trace **out, mp_error *err);
void mp_trace_free(mp_trace *trace);

/* Collective over world (every rank of the job): barrier, then this rank's zero is now. Until it
 * is called the zero is the moment of mp_trace_create. world NULL: this process is the whole job
 * (no barrier). */
mp_status mp_trace_align_clocks(mp_trace *trace, mp_comm *world, mp_error *err);

/* Seconds since this rank's zero. */
double mp_trace_now(const mp_trace *trace);

/* One action of the stage worker (stage = mp_stage_index of its chunk), start_s <= end_s as
 * given by mp_trace_now. Out of memory drops the event and marks the trace incomplete (the
 * written file says so). */
void mp_trace_action(mp_trace *trace, int64_t step, mp_action_kind kind, int micro_batch,
                     int chunk, int stage, double start_s, double end_s);

/* One communication. operation: "send", "recv", "all-reduce", "all-gather", "reduce-scatter",
 * "broadcast"; group: "pp", "dp", "tp", "embedding", ...; peer: the world rank of the other side of
 * a send or receive, -1 for a collective; message: what a send or receive carries (schedules/p2p.h;
 * it pairs them into flows), NULL for a collective. Operation and group are kept to their first
 * 23 characters. */
void mp_trace_comm(mp_trace *trace, int64_t step, const char *operation, const char *group,
                   int peer, size_t bytes, const mp_message *message, double start_s,
                   double end_s);

/* Optional: the whole of one training step on this rank, from its start to the end of its
 * optimizer update (data loading, the actions, the gradient reduction and the update), as
 * given by mp_trace_now. `mpengine timeline` takes the step time from these slices when they are
 * there, and otherwise from the first to the last event of the step. */
void mp_trace_step(mp_trace *trace, int64_t step, double start_s, double end_s);

/* Collective over world: every rank sends its events to rank 0, which writes the merged Chrome
 * trace to path (temporary name renamed into place, common/atomic_file.h); then rank 0 tells every
 * rank how the write went, so all ranks return the same status and message. world NULL: this
 * process is the whole job. MP_ERR_INPUT naming the path when its directory does not exist;
 * MP_ERR_RUNTIME when it cannot be written or a rank does not answer in time. */
mp_status mp_trace_write(mp_trace *trace, mp_comm *world, const char *path, mp_error *err);

/* What mp_trace_write does on rank 0 once it holds every rank's events: writes the merged trace
 * of recorders held in this process, one per world rank (each rank exactly once, any order, with
 * the same layout), no communication. Tests and tools build multi-rank traces with it without an
 * MPI job. MP_ERR_INPUT when a rank is missing or repeated or the layouts differ, and as
 * mp_trace_write for the file. */
mp_status mp_trace_write_merged(const mp_trace *const *traces, int num_traces, const char *path,
                                mp_error *err);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_ENGINE_TRACE_H */
