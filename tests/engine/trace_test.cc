// tests/engine/trace_test.cc — the trace recorder (engine/trace/trace.h) and its reader
// (engine/trace/trace_reader.h). trace_test.sh runs it under mpirun on 1 and on 2 ranks.
//
// Recorders in one process (no communication): the written file parses as JSON, has one process
// per rank with a compute and a communication thread, one slice per recorded event with its
// arguments, flows that pair each send with the receive of the same message between the same two
// ranks, and the "mpengine" layout object, which the reader gives back; a step read back is the
// schedule the ranks ran, with the times they recorded. Over MPI: mp_trace_write gathers every
// rank's events into rank 0's file, and a write that fails fails alike on every rank. And the
// reader's refusals, with their messages.
#include <gtest/gtest.h>

#include <cjson/cJSON.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "engine/comm/comm.h"
#include "engine/trace/trace.h"
#include "engine/trace/trace_reader.h"
#include "schedules/p2p.h"
#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "tests/support/mpi_gtest_main.h"

namespace {

mp_comm_world *g_world = nullptr;
mp_comm *g_all = nullptr;

int world_rank() { return mp_comm_world_rank(g_world); }
int world_size() { return mp_comm_world_size(g_world); }

// A file name in the test's private directory, distinct per world rank unless shared.
std::string temp_path(const std::string &name, bool shared = false) {
  const char *dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/trace_test_";
  if (!shared) path += "rank" + std::to_string(world_rank()) + "_";
  return path + name;
}

std::string read_file(const std::string &path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string &path, const std::string &text) {
  std::ofstream out(path);
  out << text;
}

mp_trace_layout make_layout(const char *schedule, int dp, int pp, int tp, int v, int m) {
  mp_trace_layout layout;
  std::memset(&layout, 0, sizeof layout);
  std::snprintf(layout.plan, sizeof layout.plan, "%s", "plans/example.json");
  std::snprintf(layout.schedule, sizeof layout.schedule, "%s", schedule);
  layout.dp = dp;
  layout.pp = pp;
  layout.tp = tp;
  layout.virtual_stages = v;
  layout.num_micro_batches = m;
  return layout;
}

int rank_of(const mp_trace_layout &layout, int dp, int pp, int tp) {
  return pp * layout.dp * layout.tp + dp * layout.tp + tp;
}

const cJSON *get(const cJSON *object, const char *key) {
  return cJSON_GetObjectItemCaseSensitive(object, key);
}
double number(const cJSON *object, const char *key) {
  const cJSON *item = get(object, key);
  return item != nullptr ? item->valuedouble : NAN;
}
std::string string_of(const cJSON *object, const char *key) {
  const cJSON *item = get(object, key);
  return cJSON_IsString(item) ? item->valuestring : "";
}

// A generated schedule simulated with unit costs; every rank of a dp x pp x tp layout records
// its pipeline rank's actions at those times (in milliseconds), with the receive before and the
// send after each action, like trace_fixture.
struct Recorded {
  mp_trace_layout layout;
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_sim_costs costs;
  mp_simulation simulation;
  std::vector<mp_trace *> traces;
  long messages = 0; // sends recorded

  Recorded(mp_schedule_kind kind, int dp, int pp, int tp, int v, int m, int steps) {
    layout = make_layout(mp_schedule_kind_name(kind), dp, pp, tp, v, m);
    std::memset(&costs, 0, sizeof costs);
    std::memset(&simulation, 0, sizeof simulation);
    mp_error err = MP_ERROR_INITIALIZER;
    EXPECT_EQ(mp_schedule_generate(kind, pp, m, v, &schedule, &err), MP_OK) << err.message;
    EXPECT_EQ(mp_sim_costs_init_unit(&costs, pp, v, &err), MP_OK) << err.message;
    EXPECT_EQ(mp_schedule_simulate(&schedule, &costs, &simulation, &err), MP_OK) << err.message;
    traces.assign(dp * pp * tp, nullptr);
    for (int d = 0; d < dp; ++d) {
      for (int p = 0; p < pp; ++p) {
        for (int t = 0; t < tp; ++t) {
          const int rank = rank_of(layout, d, p, t);
          EXPECT_EQ(mp_trace_create(&layout, rank, d, p, t, &traces[rank], &err), MP_OK)
              << err.message;
          for (int step = 0; step < steps; ++step) Record(traces[rank], step, d, p, t);
        }
      }
    }
  }
  void Record(mp_trace *trace, int step, int d, int p, int t) {
    const double offset = 1e-3 * step * (simulation.step_time + 1.0);
    const mp_rank_actions *list = &schedule.ranks[p];
    for (int a = 0; a < list->num_actions; ++a) {
      const mp_action *action = &list->actions[a];
      const double start = offset + 1e-3 * simulation.start[p][a];
      const double end = offset + 1e-3 * simulation.end[p][a];
      mp_message message;
      if (mp_action_received_message(&schedule, p, action, &message)) {
        mp_trace_comm(trace, step, "recv", "pp", rank_of(layout, d, action->recv_from, t), 64,
                      &message, start - 1e-4, start);
      }
      mp_trace_action(trace, step, action->kind, action->micro_batch, action->chunk,
                      mp_stage_index(layout.pp, p, action->chunk), start, end);
      if (mp_action_sent_message(&schedule, p, action, &message)) {
        mp_trace_comm(trace, step, "send", "pp", rank_of(layout, d, action->send_to, t), 64,
                      &message, end, end + 1e-5);
        ++messages;
      }
    }
    mp_trace_comm(trace, step, "all-reduce", "dp", -1, 4096, nullptr,
                  offset + 1e-3 * simulation.step_time,
                  offset + 1e-3 * simulation.step_time + 2e-4);
    mp_trace_step(trace, step, offset, offset + 1e-3 * simulation.step_time + 5e-4);
  }
  mp_status Write(const std::string &path, mp_error *err) {
    return mp_trace_write_merged(traces.data(), (int)traces.size(), path.c_str(), err);
  }
  ~Recorded() {
    for (mp_trace *trace : traces) mp_trace_free(trace);
    mp_simulation_free(&simulation);
    mp_sim_costs_free(&costs);
    mp_schedule_free(&schedule);
  }
};

// ---- the file ------------------------------------------------------------------------------

TEST(TraceFile, HasAProcessPerRankTwoThreadsAndASlicePerEvent) {
  mp_trace_layout layout = make_layout("1f1b", 1, 2, 1, 1, 2);
  mp_trace *trace = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_trace_create(&layout, 1, 0, 1, 0, &trace, &err), MP_OK) << err.message;
  mp_trace *first = nullptr;
  ASSERT_EQ(mp_trace_create(&layout, 0, 0, 0, 0, &first, &err), MP_OK) << err.message;
  mp_message message = {MP_MESSAGE_GRADIENT, 1, 1, 0};
  mp_trace_action(trace, 4, MP_ACTION_BACKWARD, 1, 0, 1, 0.0125, 0.0150);
  mp_trace_comm(trace, 4, "send", "pp", 0, 2048, &message, 0.0150, 0.0151);
  mp_trace_comm(trace, 4, "all-reduce", "dp", -1, 4096, nullptr, 0.016, 0.017);
  mp_trace_step(trace, 4, 0.010, 0.018);
  const std::string path = temp_path("slices.json");
  const mp_trace *both[2] = {trace, first};
  ASSERT_EQ(mp_trace_write_merged(both, 2, path.c_str(), &err), MP_OK) << err.message;
  mp_trace_free(trace);
  mp_trace_free(first);

  cJSON *root = cJSON_Parse(read_file(path).c_str());
  ASSERT_NE(root, nullptr) << "not JSON: " << read_file(path);
  const cJSON *mpengine = get(root, "mpengine");
  EXPECT_EQ(string_of(mpengine, "format"), "mpengine-trace");
  EXPECT_EQ(number(mpengine, "version"), 1);
  EXPECT_EQ(string_of(mpengine, "plan"), "plans/example.json");
  EXPECT_EQ(number(mpengine, "world_size"), 2);
  EXPECT_EQ(number(mpengine, "steps"), 1);
  EXPECT_EQ(number(mpengine, "first_step"), 4);
  EXPECT_TRUE(cJSON_IsTrue(get(mpengine, "complete")));
  EXPECT_EQ(cJSON_GetArraySize(get(mpengine, "ranks")), 2);

  std::map<std::string, const cJSON *> slices;
  std::map<int, std::string> process_names;
  std::map<std::pair<int, int>, std::string> thread_names;
  const cJSON *event;
  cJSON_ArrayForEach(event, get(root, "traceEvents")) {
    const std::string ph = string_of(event, "ph"), name = string_of(event, "name");
    const int pid = (int)number(event, "pid"), tid = (int)number(event, "tid");
    const std::string arg_name = string_of(get(event, "args"), "name");
    if (ph == "M" && name == "process_name") process_names[pid] = arg_name;
    if (ph == "M" && name == "thread_name") thread_names[{pid, tid}] = arg_name;
    if (ph == "X") slices[name] = event;
  }
  EXPECT_EQ(process_names[0], "rank 0 (dp 0, pp 0, tp 0)");
  EXPECT_EQ(process_names[1], "rank 1 (dp 0, pp 1, tp 0)");
  EXPECT_EQ((thread_names[{1, 0}]), "compute");
  EXPECT_EQ((thread_names[{1, 1}]), "communication");
  ASSERT_EQ(slices.size(), 4u);
  const cJSON *b1 = slices["B1"];
  ASSERT_NE(b1, nullptr);
  EXPECT_EQ(string_of(b1, "cat"), "compute");
  EXPECT_EQ(number(b1, "pid"), 1);
  EXPECT_EQ(number(b1, "tid"), 0);
  EXPECT_DOUBLE_EQ(number(b1, "ts"), 12500);  // microseconds
  EXPECT_DOUBLE_EQ(number(b1, "dur"), 2500);
  EXPECT_EQ(number(get(b1, "args"), "step"), 4);
  EXPECT_EQ(string_of(get(b1, "args"), "kind"), "backward");
  EXPECT_EQ(number(get(b1, "args"), "stage"), 1);
  const cJSON *send = slices["send gradient 1"];
  ASSERT_NE(send, nullptr);
  EXPECT_EQ(number(send, "tid"), 1);
  EXPECT_EQ(string_of(get(send, "args"), "message"), "gradient");
  EXPECT_EQ(number(get(send, "args"), "peer"), 0);
  EXPECT_EQ(number(get(send, "args"), "bytes"), 2048);
  EXPECT_EQ(number(get(send, "args"), "to_stage"), 0);
  ASSERT_NE(slices["all-reduce dp"], nullptr);
  EXPECT_EQ(number(get(slices["all-reduce dp"], "args"), "peer"), -1);
  ASSERT_NE(slices["step 4"], nullptr);
  EXPECT_EQ(string_of(slices["step 4"], "cat"), "step");
  cJSON_Delete(root);
}

TEST(TraceFile, FlowsPairEachSendWithItsReceive) {
  Recorded recorded(MP_SCHEDULE_1F1B, 2, 2, 1, 1, 3, 2);
  const std::string path = temp_path("flows.json");
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(recorded.Write(path, &err), MP_OK) << err.message;
  cJSON *root = cJSON_Parse(read_file(path).c_str());
  ASSERT_NE(root, nullptr);
  std::map<int, const cJSON *> starts, finishes;
  std::vector<const cJSON *> slices;
  const cJSON *event;
  cJSON_ArrayForEach(event, get(root, "traceEvents")) {
    const std::string ph = string_of(event, "ph");
    if (ph == "s") starts[(int)number(event, "id")] = event;
    if (ph == "f") finishes[(int)number(event, "id")] = event;
    if (ph == "X") slices.push_back(event);
  }
  // Every message of every step of both dp replicas: pp = 2, m = 3 sends 3 activations and 3
  // gradients per step.
  EXPECT_EQ(recorded.messages, 2 * 2 * 6);
  EXPECT_EQ((long)starts.size(), recorded.messages);
  EXPECT_EQ(starts.size(), finishes.size());
  for (const auto &pair : starts) {
    ASSERT_EQ(finishes.count(pair.first), 1u) << "flow " << pair.first << " never arrives";
    const cJSON *s = pair.second, *f = finishes[pair.first];
    EXPECT_EQ(string_of(s, "name"), string_of(f, "name"));
    EXPECT_EQ(string_of(f, "bp"), "e");
    const int sender = (int)number(s, "pid"), receiver = (int)number(f, "pid");
    EXPECT_NE(sender, receiver);
    // Same dp replica (rank = pp * 2 + dp), neighbouring pipeline ranks.
    EXPECT_EQ(sender % 2, receiver % 2);
    // Each binds inside a send on the sender and a receive on the receiver of that message.
    bool in_send = false, in_recv = false;
    for (const cJSON *slice : slices) {
      const double ts = number(slice, "ts"), dur = number(slice, "dur");
      const cJSON *args = get(slice, "args");
      const std::string operation = string_of(args, "operation");
      const double micro_batch = number(args, "micro_batch");  // NaN on a slice without one
      const bool same_message = !std::isnan(micro_batch) &&
                                string_of(args, "message") + " " +
                                        std::to_string((int)micro_batch) ==
                                    string_of(s, "name");
      if (number(slice, "pid") == sender && operation == "send" && same_message &&
          number(s, "ts") >= ts && number(s, "ts") <= ts + dur) {
        EXPECT_EQ(number(args, "peer"), receiver);
        in_send = true;
      }
      if (number(slice, "pid") == receiver && operation == "recv" && same_message &&
          number(f, "ts") >= ts && number(f, "ts") <= ts + dur) {
        EXPECT_EQ(number(args, "peer"), sender);
        in_recv = true;
      }
    }
    EXPECT_TRUE(in_send) << "flow " << pair.first << " does not start inside its send";
    EXPECT_TRUE(in_recv) << "flow " << pair.first << " does not end inside its receive";
  }
  cJSON_Delete(root);
}

TEST(TraceFile, MergeRefusesMissingRepeatedOrForeignRanks) {
  Recorded recorded(MP_SCHEDULE_1F1B, 1, 2, 1, 1, 2, 1);
  mp_error err = MP_ERROR_INITIALIZER;
  const std::string path = temp_path("refused.json");
  const mp_trace *one[1] = {recorded.traces[0]};
  EXPECT_EQ(mp_trace_write_merged(one, 1, path.c_str(), &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": 1 ranks to merge, but the layout dp 1 x pp 2 x tp 1 has 2");
  const mp_trace *twice[2] = {recorded.traces[0], recorded.traces[0]};
  EXPECT_EQ(mp_trace_write_merged(twice, 2, path.c_str(), &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), path + ": rank 0 is given twice");
  mp_trace_layout other = make_layout("gpipe", 1, 2, 1, 1, 2);
  mp_trace *foreign = nullptr;
  ASSERT_EQ(mp_trace_create(&other, 1, 0, 1, 0, &foreign, &err), MP_OK);
  const mp_trace *mixed[2] = {recorded.traces[0], foreign};
  EXPECT_EQ(mp_trace_write_merged(mixed, 2, path.c_str(), &err), MP_ERR_INPUT);
  EXPECT_NE(std::string(err.message).find("another layout"), std::string::npos) << err.message;
  mp_trace_free(foreign);
  EXPECT_EQ(mp_trace_create(&other, 2, 0, 1, 0, &foreign, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            "trace: rank 2 (dp 0, pp 1, tp 0) is outside the layout dp 1 x pp 2 x tp 1");
  std::ifstream absent(path);
  EXPECT_FALSE(absent.good()) << "a refused merge wrote " << path;
}

// ---- read back -----------------------------------------------------------------------------

TEST(TraceReader, LayoutRoundTripsAndAStepIsTheScheduleThatRan) {
  struct Case {
    mp_schedule_kind kind;
    int dp, pp, tp, v, m;
  } cases[] = {
      {MP_SCHEDULE_1F1B, 1, 4, 1, 1, 8},
      {MP_SCHEDULE_GPIPE, 2, 2, 2, 1, 3},
      {MP_SCHEDULE_INTERLEAVED_1F1B, 1, 2, 1, 2, 4},
      {MP_SCHEDULE_ZB_H1, 1, 3, 2, 1, 5},
  };
  for (const Case &c : cases) {
    SCOPED_TRACE(mp_schedule_kind_name(c.kind));
    Recorded recorded(c.kind, c.dp, c.pp, c.tp, c.v, c.m, 3);
    const std::string path = temp_path(std::string("roundtrip_") +
                                       mp_schedule_kind_name(c.kind) + ".json");
    mp_error err = MP_ERROR_INITIALIZER;
    ASSERT_EQ(recorded.Write(path, &err), MP_OK) << err.message;
    mp_trace_file *file = nullptr;
    ASSERT_EQ(mp_trace_read(path.c_str(), &file, &err), MP_OK) << err.message;
    const mp_trace_summary *summary = mp_trace_file_summary(file);
    EXPECT_STREQ(summary->layout.plan, recorded.layout.plan);
    EXPECT_STREQ(summary->layout.schedule, recorded.layout.schedule);
    EXPECT_EQ(summary->layout.dp, c.dp);
    EXPECT_EQ(summary->layout.pp, c.pp);
    EXPECT_EQ(summary->layout.tp, c.tp);
    EXPECT_EQ(summary->layout.virtual_stages, c.v);
    EXPECT_EQ(summary->layout.num_micro_batches, c.m);
    EXPECT_EQ(summary->world_size, c.dp * c.pp * c.tp);
    EXPECT_TRUE(summary->complete);
    EXPECT_EQ(summary->num_steps, 3);
    EXPECT_EQ(summary->first_step, 0);
    EXPECT_EQ(summary->last_step, 2);
    EXPECT_TRUE(mp_trace_file_has_step(file, 1));
    EXPECT_FALSE(mp_trace_file_has_step(file, 3));

    mp_schedule schedule;
    mp_simulation simulation;
    ASSERT_EQ(mp_trace_step_timeline(file, 1, &schedule, &simulation, &err), MP_OK)
        << err.message;
    EXPECT_EQ(schedule.kind, c.kind);
    ASSERT_EQ(schedule.pp, c.pp);
    const mp_simulation &expected = recorded.simulation;
    for (int p = 0; p < c.pp; ++p) {
      const mp_rank_actions &ran = schedule.ranks[p], &planned = recorded.schedule.ranks[p];
      ASSERT_EQ(ran.num_actions, planned.num_actions) << "pipeline rank " << p;
      for (int a = 0; a < ran.num_actions; ++a) {
        EXPECT_EQ(ran.actions[a].kind, planned.actions[a].kind);
        EXPECT_EQ(ran.actions[a].micro_batch, planned.actions[a].micro_batch);
        EXPECT_EQ(ran.actions[a].chunk, planned.actions[a].chunk);
        EXPECT_NEAR(simulation.start[p][a], 1e-3 * expected.start[p][a], 1e-9);
        EXPECT_NEAR(simulation.end[p][a], 1e-3 * expected.end[p][a], 1e-9);
      }
      EXPECT_NEAR(simulation.rank_bubble_fraction[p], expected.rank_bubble_fraction[p], 1e-9);
      EXPECT_EQ(simulation.peak_live[p], expected.peak_live[p]);
    }
    EXPECT_EQ(simulation.time_unit, MP_TIME_SECONDS);
    EXPECT_NEAR(simulation.step_time, 1e-3 * expected.step_time, 1e-9);
    EXPECT_NEAR(simulation.bubble_fraction, expected.bubble_fraction, 1e-9);
    EXPECT_NEAR(simulation.max_peak_activation_memory, expected.max_peak_activation_memory,
                1e-12);

    mp_trace_step_measurement measured;
    ASSERT_EQ(mp_trace_measure_step(file, 1, &measured, &err), MP_OK) << err.message;
    ASSERT_EQ(measured.num_stages, c.pp * c.v);
    for (int s = 0; s < measured.num_stages; ++s) {
      for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
        const double unit = recorded.costs.duration[k][s];
        if (measured.count[k][s] == 0) continue;
        EXPECT_EQ(measured.count[k][s], c.m * c.dp * c.tp) << "stage " << s << " kind " << k;
        EXPECT_NEAR(measured.mean_s[k][s], 1e-3 * unit, 1e-9);
      }
      EXPECT_EQ(measured.count[MP_ACTION_FORWARD][s], c.m * c.dp * c.tp);
    }
    EXPECT_TRUE(measured.step_from_step_slices);
    EXPECT_NEAR(measured.step_s, 1e-3 * expected.step_time + 5e-4, 1e-9);
    mp_trace_step_measurement_free(&measured);
    mp_simulation_free(&simulation);
    mp_schedule_free(&schedule);
    mp_trace_file_free(file);
  }
}

// Writes text to a file and reads it as a trace; returns the status and *message.
mp_status read_text(const std::string &name, const std::string &text, std::string *message,
                    std::string *path_out = nullptr) {
  const std::string path = temp_path(name);
  write_file(path, text);
  if (path_out != nullptr) *path_out = path;
  mp_trace_file *file = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status = mp_trace_read(path.c_str(), &file, &err);
  *message = err.message;
  mp_trace_file_free(file);
  return status;
}

std::string replace(std::string text, const std::string &from, const std::string &to) {
  size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "no " << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

TEST(TraceReader, RefusesWhatIsNotAnMpengineTraceNamingTheFileAndPath) {
  Recorded recorded(MP_SCHEDULE_1F1B, 1, 2, 1, 1, 2, 1);
  const std::string good_path = temp_path("good.json");
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(recorded.Write(good_path, &err), MP_OK) << err.message;
  const std::string good = read_file(good_path);
  std::string message, path;

  EXPECT_EQ(read_text("syntax.json", "{\"mpengine\": {,", &message, &path), MP_ERR_INPUT);
  EXPECT_EQ(message.rfind(path + ":1:", 0), 0u) << message;
  EXPECT_NE(message.find("JSON syntax error"), std::string::npos) << message;

  EXPECT_EQ(read_text("array.json", "[1, 2]", &message, &path), MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $: expected an mpengine trace (a JSON object), got an array");

  EXPECT_EQ(read_text("chrome.json", "{\"traceEvents\": []}", &message, &path), MP_ERR_INPUT);
  EXPECT_EQ(message.rfind(path + ": $: not an mpengine trace: no \"mpengine\" object", 0), 0u)
      << message;

  EXPECT_EQ(read_text("format.json", replace(good, "\"mpengine-trace\"", "\"mpengine-plan\""),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.mpengine.format: expected \"mpengine-trace\", got "
                            "\"mpengine-plan\"; not an mpengine trace");

  EXPECT_EQ(read_text("version.json", replace(good, "\"version\":1", "\"version\":7"), &message,
                      &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.mpengine.version: version 7 is not known; this mpengine reads "
                            "version 1");

  EXPECT_EQ(read_text("nopp.json", replace(good, "\"pp\":2,", ""), &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.mpengine: missing required key \"pp\" (an integer)");

  EXPECT_EQ(read_text("typo.json", replace(good, "\"virtual_stages\":1,", "\"virtual_stage\":1,"),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message.rfind(path + ": $.mpengine: unknown key \"virtual_stage\"; did you mean "
                                 "\"virtual_stages\"?",
                          0),
            0u)
      << message;

  EXPECT_EQ(read_text("world.json", replace(good, "\"world_size\":2", "\"world_size\":3"),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.mpengine.world_size: 3, but dp x pp x tp = 1 x 2 x 1 = 2");

  // The first event after the 8 metadata events of the 2 ranks is rank 0's F0.
  EXPECT_EQ(read_text("nostage.json", replace(good, ",\"stage\":0}", "}"), &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.traceEvents[8].args: missing required key \"stage\" (an integer)");

  EXPECT_EQ(read_text("stage.json",
                      replace(good, "\"chunk\":0,\"stage\":0}", "\"chunk\":0,\"stage\":1}"),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.traceEvents[8].args.stage: 1, but chunk 0 of pipeline rank 0 "
                            "(world rank 0) is stage 0");

  EXPECT_EQ(read_text("pid.json", replace(good, "\"pid\":0,\"tid\":0,\"ts\"",
                                          "\"pid\":5,\"tid\":0,\"ts\""),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message, path + ": $.traceEvents[8].pid: 5 is outside 0 .. 1");

  EXPECT_EQ(read_text("kind.json", replace(good, "\"kind\":\"forward\"", "\"kind\":\"fwd\""),
                      &message, &path),
            MP_ERR_INPUT);
  EXPECT_EQ(message.rfind(path + ": $.traceEvents[8].args.kind: unknown action kind \"fwd\"", 0),
            0u)
      << message;

  const std::string missing = temp_path("does-not-exist.json");
  mp_trace_file *file = nullptr;
  EXPECT_EQ(mp_trace_read(missing.c_str(), &file, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), missing + ": cannot open: No such file or directory");
}

TEST(TraceReader, RefusesAStepThatIsNotThereOrNotWhole) {
  Recorded recorded(MP_SCHEDULE_1F1B, 1, 2, 1, 1, 2, 3);
  const std::string path = temp_path("steps.json");
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(recorded.Write(path, &err), MP_OK) << err.message;
  mp_trace_file *file = nullptr;
  ASSERT_EQ(mp_trace_read(path.c_str(), &file, &err), MP_OK) << err.message;
  mp_schedule schedule;
  mp_simulation simulation;
  EXPECT_EQ(mp_trace_step_timeline(file, 3, &schedule, &simulation, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message),
            path + ": step 3 is not in the trace (it recorded steps 0 to 2)");
  mp_simulation_free(&simulation);
  mp_schedule_free(&schedule);
  mp_trace_step_measurement measured;
  EXPECT_EQ(mp_trace_measure_step(file, -1, &measured, &err), MP_ERR_INPUT);
  mp_trace_step_measurement_free(&measured);
  mp_trace_file_free(file);

  // Rank 1's backward of micro-batch 1 in step 2 lost: the step is not a whole schedule.
  std::string text = read_file(path);
  const std::string lost = "{\"name\":\"B1\",\"cat\":\"compute\",\"ph\":\"X\",\"pid\":1";
  size_t at = text.rfind(lost);
  ASSERT_NE(at, std::string::npos);
  size_t end = text.find('\n', at);
  text.erase(at, end - at + 1);
  std::string message, cut_path;
  ASSERT_EQ(read_text("cut.json", text, &message, &cut_path), MP_OK) << message;
  ASSERT_EQ(mp_trace_read(cut_path.c_str(), &file, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_trace_step_timeline(file, 2, &schedule, &simulation, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message).rfind(
                cut_path + ": step 2: the actions recorded on the pipeline ranks (at dp 0, tp 0) "
                           "are not a whole 1f1b schedule: rank 1: B of micro-batch 1 is missing",
                0),
            0u)
      << err.message;
  mp_simulation_free(&simulation);
  mp_schedule_free(&schedule);
  EXPECT_EQ(mp_trace_step_timeline(file, 1, &schedule, &simulation, &err), MP_OK) << err.message;
  mp_simulation_free(&simulation);
  mp_schedule_free(&schedule);
  mp_trace_file_free(file);
}

// ---- over MPI ------------------------------------------------------------------------------

// The merged trace puts every rank's events on one time axis, so the same moment must read the
// same on every rank's clock. Odd ranks reach the alignment 0.5 s late (as a rank that loads its
// shards slower would); after it, every rank reads its clock as it leaves one more barrier, and
// the readings gathered from every rank agree to the barrier's exit skew. A clock zeroed anywhere
// but at the alignment barrier's exit (at mp_trace_create, or before the barrier) is 0.5 s off
// on the late ranks. 0.1 s leaves room for ranks descheduled on a loaded, oversubscribed machine.
TEST(TraceMpi, ClocksAlignAtTheBarrier) {
  mp_trace_layout layout = make_layout("1f1b", 1, world_size(), 1, 1, 2);
  mp_trace *trace = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  if (world_rank() % 2 == 1) usleep(500 * 1000);
  ASSERT_EQ(mp_trace_create(&layout, world_rank(), 0, world_rank(), 0, &trace, &err), MP_OK);
  ASSERT_EQ(mp_trace_align_clocks(trace, g_all, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_comm_barrier(g_all, &err), MP_OK) << err.message;
  const float now = (float)mp_trace_now(trace);
  std::vector<float> every(world_size());
  ASSERT_EQ(mp_comm_all_gather_f32(g_all, &now, every.data(), 1, &err), MP_OK) << err.message;
  for (int r = 0; r < world_size(); ++r) {
    EXPECT_GE(every[r], 0.0f) << "rank " << r;
    EXPECT_NEAR(every[r], every[0], 0.1) << "rank " << r << "'s clock against rank 0's";
  }
  EXPECT_GE(mp_trace_now(trace), now);
  mp_trace_free(trace);
}

TEST(TraceMpi, RankZeroWritesEveryRanksEvents) {
  // pp = world size, 1F1B with 2 micro-batches; each rank records its own list as it goes.
  const int pp = world_size();
  mp_trace_layout layout = make_layout("1f1b", 1, pp, 1, 1, 2);
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_schedule_generate(MP_SCHEDULE_1F1B, pp, 2, 1, &schedule, &err), MP_OK);
  mp_trace *trace = nullptr;
  const int me = world_rank();
  ASSERT_EQ(mp_trace_create(&layout, me, 0, me, 0, &trace, &err), MP_OK) << err.message;
  ASSERT_EQ(mp_trace_align_clocks(trace, g_all, &err), MP_OK) << err.message;
  long sends = 0;
  for (int step = 0; step < 2; ++step) {
    const double step_start = mp_trace_now(trace);
    for (int a = 0; a < schedule.ranks[me].num_actions; ++a) {
      const mp_action *action = &schedule.ranks[me].actions[a];
      mp_message message;
      if (mp_action_received_message(&schedule, me, action, &message)) {
        const double start = mp_trace_now(trace);
        mp_trace_comm(trace, step, "recv", "pp", action->recv_from, 64, &message, start,
                      mp_trace_now(trace));
      }
      const double start = mp_trace_now(trace);
      mp_trace_action(trace, step, action->kind, action->micro_batch, action->chunk,
                      mp_stage_index(pp, me, action->chunk), start, mp_trace_now(trace));
      if (mp_action_sent_message(&schedule, me, action, &message)) {
        const double sent = mp_trace_now(trace);
        mp_trace_comm(trace, step, "send", "pp", action->send_to, 64, &message, sent,
                      mp_trace_now(trace));
        ++sends;
      }
    }
    mp_trace_step(trace, step, step_start, mp_trace_now(trace));
  }
  const std::string path = temp_path("gathered.json", /*shared=*/true);
  ASSERT_EQ(mp_trace_write(trace, g_all, path.c_str(), &err), MP_OK) << err.message;
  mp_trace_free(trace);
  mp_schedule_free(&schedule);

  // Every rank reads what rank 0 wrote.
  mp_trace_file *file = nullptr;
  ASSERT_EQ(mp_trace_read(path.c_str(), &file, &err), MP_OK) << err.message;
  const mp_trace_summary *summary = mp_trace_file_summary(file);
  EXPECT_EQ(summary->world_size, pp);
  EXPECT_EQ(summary->num_steps, 2);
  mp_schedule ran;
  mp_simulation simulation;
  EXPECT_EQ(mp_trace_step_timeline(file, 1, &ran, &simulation, &err), MP_OK) << err.message;
  EXPECT_EQ(mp_schedule_total_actions(&ran), 2L * 2 * pp);
  mp_simulation_free(&simulation);
  mp_schedule_free(&ran);
  mp_trace_file_free(file);

  cJSON *root = cJSON_Parse(read_file(path).c_str());
  ASSERT_NE(root, nullptr);
  int processes = 0, flows = 0;
  const cJSON *event;
  cJSON_ArrayForEach(event, get(root, "traceEvents")) {
    if (string_of(event, "name") == "process_name") ++processes;
    if (string_of(event, "ph") == "s") ++flows;
  }
  cJSON_Delete(root);
  EXPECT_EQ(processes, pp);
  // Each boundary carries 2 activations and 2 gradients per step.
  EXPECT_EQ(flows, 2 * 4 * (pp - 1));
  float total_sends = (float)sends;
  ASSERT_EQ(mp_comm_all_reduce_sum_f32(g_all, &total_sends, 1, &err), MP_OK);
  EXPECT_EQ(flows, (int)total_sends);
  ASSERT_EQ(mp_comm_barrier(g_all, &err), MP_OK);  // nobody rewrites the file while others read
}

TEST(TraceMpi, AWriteThatFailsFailsOnEveryRank) {
  mp_trace_layout layout = make_layout("1f1b", 1, world_size(), 1, 1, 2);
  mp_trace *trace = nullptr;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_trace_create(&layout, world_rank(), 0, world_rank(), 0, &trace, &err), MP_OK);
  mp_trace_action(trace, 0, MP_ACTION_FORWARD, 0, 0, world_rank(), 0.0, 0.001);
  const std::string path = temp_path("no-such-dir/trace.json", /*shared=*/true);
  EXPECT_EQ(mp_trace_write(trace, g_all, path.c_str(), &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message).rfind(path + ": cannot create", 0), 0u) << err.message;
  mp_trace_free(trace);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test_mpi_gtest_main(argc, argv, "trace_test", &g_world, &g_all, nullptr);
}
