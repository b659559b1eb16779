// tests/schedules/timeline_test.cc — the three timeline formats: the ascii text itself, an SVG
// whose tags balance with one lane per rank, and Chrome trace JSON that parses, with a slice per
// action and a flow ("s" then "f") per message, each inside its slice.
#include "schedules/timeline.h"

#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "schedules/schedule.h"
#include "schedules/simulator.h"
#include "schedules/text.h"

namespace {

// A generated, simulated schedule and its timeline in one format.
struct Drawn {
  mp_schedule schedule = MP_SCHEDULE_INITIALIZER;
  mp_sim_costs costs = {};
  mp_simulation sim = {};
  mp_text text = MP_TEXT_INITIALIZER;
  mp_error err = MP_ERROR_INITIALIZER;
  mp_status status = MP_OK;

  Drawn(mp_schedule_kind kind, int pp, int m, int v, mp_timeline_format format,
        double seconds_per_unit = 0) {
    status = mp_schedule_generate(kind, pp, m, v, &schedule, &err);
    if (status == MP_OK) status = mp_sim_costs_init_unit(&costs, pp, v, &err);
    if (status != MP_OK) return;
    if (seconds_per_unit > 0) {
      costs.time_unit = MP_TIME_SECONDS;
      for (int k = 0; k < MP_NUM_ACTION_KINDS; ++k) {
        for (int s = 0; s < costs.num_stages; ++s) costs.duration[k][s] *= seconds_per_unit;
      }
    }
    status = mp_schedule_simulate(&schedule, &costs, &sim, &err);
    if (status == MP_OK) status = mp_timeline_write(&schedule, &sim, format, nullptr, &text, &err);
  }
  ~Drawn() {
    mp_text_free(&text);
    mp_simulation_free(&sim);
    mp_sim_costs_free(&costs);
    mp_schedule_free(&schedule);
  }
  std::string str() const { return mp_text_string(&text); }
  int Sends() const {
    int sends = 0;
    for (int r = 0; r < schedule.pp; ++r) {
      for (int a = 0; a < schedule.ranks[r].num_actions; ++a) {
        sends += schedule.ranks[r].actions[a].send_to != MP_NO_PEER;
      }
    }
    return sends;
  }
};

int Count(const std::string &text, const std::string &needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

TEST(AsciiTimeline, DrawsOneRowPerRankWithIdleCellsAndTheBubble) {
  Drawn d(MP_SCHEDULE_1F1B, 2, 2, 1, MP_TIMELINE_ASCII);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  EXPECT_EQ(d.str(),
            "1f1b, pp = 2, m = 2\n"
            "\n"
            "         0              5\n"
            "rank 0 | F0 F1 .. .. B0--- .. B1---  | idle 33.3%\n"
            "rank 1 | .. F0 B0--- F1 B1--- .. ..  | idle 33.3%\n"
            "\n"
            "F forward, B backward, the number is the micro-batch, '.' idle; one cell = 1 time "
            "unit\n"
            "step time: 9 time units\n"
            "bubble fraction: 0.3333 (idle share of the step, mean over ranks)\n"
            "peak micro-batches alive: rank 0: 2, rank 1: 1\n"
            "peak activation memory: 2 micro-batches of one rank's layers\n"
            "checked: complete, ordered, no deadlock under eager point-to-point\n");
}

TEST(AsciiTimeline, LabelsChunksAndSplitBackwards) {
  Drawn interleaved(MP_SCHEDULE_INTERLEAVED_1F1B, 2, 2, 2, MP_TIMELINE_ASCII);
  ASSERT_EQ(interleaved.status, MP_OK) << interleaved.err.message;
  EXPECT_NE(interleaved.str().find("rank 1 | ... F0a F1a F0b F1b B0b---- B1b---- B0a---- B1a----"),
            std::string::npos)
      << interleaved.str();
  EXPECT_NE(interleaved.str().find("one cell = 0.5 time units"), std::string::npos);
  Drawn zb(MP_SCHEDULE_ZB_H1, 4, 8, 1, MP_TIMELINE_ASCII);
  ASSERT_EQ(zb.status, MP_OK) << zb.err.message;
  EXPECT_NE(zb.str().find("rank 3 | .. .. .. F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1"),
            std::string::npos)
      << zb.str();
  EXPECT_NE(zb.str().find("bubble fraction: 0.1111"), std::string::npos);
}

TEST(AsciiTimeline, CoarsensCellsToFitTheWidthAskedFor) {
  Drawn d(MP_SCHEDULE_1F1B, 4, 8, 1, MP_TIMELINE_ASCII);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  mp_timeline_options options = MP_TIMELINE_OPTIONS_INITIALIZER;
  options.max_width = 33;  // 11 cells of 3 characters for a step of 33 units
  mp_text narrow = MP_TEXT_INITIALIZER;
  ASSERT_EQ(mp_timeline_write(&d.schedule, &d.sim, MP_TIMELINE_ASCII, &options, &narrow, &d.err),
            MP_OK);
  const std::string text = mp_text_string(&narrow);
  mp_text_free(&narrow);
  EXPECT_NE(text.find("one cell = 3 time units"), std::string::npos) << text;
  size_t row = text.find("rank 0 | ");
  ASSERT_NE(row, std::string::npos);
  size_t cells_end = text.find("  | idle", row);
  EXPECT_LE(cells_end - (row + 9), 33u) << text;
}

// Tags open and close in order (comments, declarations and self-closing tags aside).
::testing::AssertionResult TagsBalance(const std::string &xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    size_t end = xml.find('>', at);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unclosed '<'";
    std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.empty() || tag[0] == '!' || tag[0] == '?' || tag.back() == '/') continue;
    if (tag[0] == '/') {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) {
        return ::testing::AssertionFailure()
               << "</" << name << "> closes <" << (open.empty() ? "nothing" : open.back()) << ">";
      }
      open.pop_back();
    } else {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> not closed";
  return ::testing::AssertionSuccess();
}

TEST(SvgTimeline, OneFOneBHasALanePerRankArrowsAndItsThreePhases) {
  Drawn d(MP_SCHEDULE_1F1B, 4, 8, 1, MP_TIMELINE_SVG);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  const std::string svg = d.str();
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_TRUE(TagsBalance(svg));
  EXPECT_EQ(Count(svg, "class=\"lane\""), 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(Count(svg, "<g id=\"rank-" + std::to_string(r) + "\""), 1);
  }
  EXPECT_EQ(d.Sends(), 48);  // 8 activations down and 8 gradients up across each of 3 links
  EXPECT_EQ(Count(svg, "marker-end=\"url(#arrow)\"><title>rank"), 48);
  EXPECT_EQ(Count(svg, "fill=\"hsl(212,"), 32 + 1);  // 32 forwards and the legend
  EXPECT_EQ(Count(svg, "fill=\"hsl(140,"), 32 + 1);
  // Rank 0 of 1F1B with p = 4 has all three phases, the last rank no room to name its warm-up.
  EXPECT_EQ(Count(svg, "<title>rank 0 warm-up</title>"), 1);
  EXPECT_EQ(Count(svg, "<title>rank 0 steady</title>"), 1);
  EXPECT_EQ(Count(svg, "<title>rank 0 cool-down</title>"), 1);
  EXPECT_NE(svg.find("bubble fraction 0.2727"), std::string::npos);
  EXPECT_NE(svg.find("time (units)"), std::string::npos);
}

TEST(SvgTimeline, ShowsMillisecondsOnceDurationsAreSeconds) {
  Drawn d(MP_SCHEDULE_GPIPE, 2, 2, 1, MP_TIMELINE_SVG, /*seconds_per_unit=*/0.004);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  EXPECT_TRUE(TagsBalance(d.str()));
  EXPECT_NE(d.str().find("time (ms)"), std::string::npos);
  EXPECT_NE(d.str().find("step time 36 ms"), std::string::npos);  // 9 units of 4 ms
}

TEST(ChromeTimeline, IsTraceEventJsonWithASlicePerActionAndAFlowPerMessage) {
  Drawn d(MP_SCHEDULE_INTERLEAVED_1F1B, 4, 8, 2, MP_TIMELINE_CHROME);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  cJSON *root = cJSON_Parse(d.str().c_str());
  ASSERT_NE(root, nullptr) << "not JSON near: " << cJSON_GetErrorPtr();
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  ASSERT_TRUE(cJSON_IsArray(events));
  std::map<std::string, int> by_phase;
  std::map<int, std::vector<std::pair<double, double>>> slices;  // tid -> (ts, ts + dur)
  std::map<int, int> flow_starts, flow_ends;                        // id -> tid
  std::map<int, double> flow_start_ts;
  std::map<int, std::string> thread_names;
  const cJSON *event = nullptr;
  cJSON_ArrayForEach(event, events) {
    std::string ph = cJSON_GetObjectItemCaseSensitive(event, "ph")->valuestring;
    ++by_phase[ph];
    int tid = cJSON_GetObjectItemCaseSensitive(event, "tid")->valueint;
    EXPECT_EQ(cJSON_GetObjectItemCaseSensitive(event, "pid")->valueint, 0);
    if (ph == "X") {
      double ts = cJSON_GetObjectItemCaseSensitive(event, "ts")->valuedouble;
      double dur = cJSON_GetObjectItemCaseSensitive(event, "dur")->valuedouble;
      EXPECT_GT(dur, 0);
      slices[tid].push_back({ts, ts + dur});
    } else if (ph == "s" || ph == "f") {
      int id = cJSON_GetObjectItemCaseSensitive(event, "id")->valueint;
      double ts = cJSON_GetObjectItemCaseSensitive(event, "ts")->valuedouble;
      bool inside = false;
      for (const auto &slice : slices[tid]) inside |= slice.first <= ts && ts <= slice.second;
      EXPECT_TRUE(inside) << ph << " of flow " << id << " at " << ts << " is in no slice";
      if (ph == "s") {
        flow_starts[id] = tid;
        flow_start_ts[id] = ts;
      } else {
        flow_ends[id] = tid;
        EXPECT_STREQ(cJSON_GetObjectItemCaseSensitive(event, "bp")->valuestring, "e");
        EXPECT_GE(ts, flow_start_ts[id]);  // a message is received after it is sent
      }
    } else if (ph == "M" &&
               std::string(cJSON_GetObjectItemCaseSensitive(event, "name")->valuestring) ==
                   "thread_name") {
      thread_names[tid] =
          cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(event, "args"), "name")
              ->valuestring;
    }
  }
  EXPECT_EQ(by_phase["X"], 4 * 8 * 2 * 2);  // F and B of 8 micro-batches on 2 chunks of 4 ranks
  EXPECT_EQ(by_phase["s"], d.Sends());
  EXPECT_EQ(by_phase["f"], d.Sends());
  EXPECT_EQ(flow_starts.size(), flow_ends.size());
  for (const auto &flow : flow_starts) {
    ASSERT_EQ(flow_ends.count(flow.first), 1u);
    EXPECT_NE(flow_ends[flow.first], flow.second);  // between two ranks
  }
  ASSERT_EQ(thread_names.size(), 4u);
  EXPECT_EQ(thread_names[3], "pp rank 3");
  const cJSON *other = cJSON_GetObjectItemCaseSensitive(root, "otherData");
  EXPECT_NEAR(cJSON_GetObjectItemCaseSensitive(other, "bubble_fraction")->valuedouble,
              3.0 / (2 * 8 + 3), 1e-12);
  cJSON_Delete(root);
}

TEST(ChromeTimeline, WritesSecondsAsMicroseconds) {
  Drawn d(MP_SCHEDULE_1F1B, 2, 1, 1, MP_TIMELINE_CHROME, /*seconds_per_unit=*/0.002);
  ASSERT_EQ(d.status, MP_OK) << d.err.message;
  EXPECT_NE(d.str().find("\"name\": \"F0\", \"cat\": \"forward\", \"ph\": \"X\", \"pid\": 0, "
                         "\"tid\": 1, \"ts\": 2000.000, \"dur\": 2000.000"),
            std::string::npos)
      << d.str();
}

TEST(TimelineFormats, ParseTheirNamesAndRefuseOthers) {
  mp_timeline_format format;
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_timeline_format_parse("chrome", &format, &err), MP_OK);
  EXPECT_EQ(format, MP_TIMELINE_CHROME);
  ASSERT_EQ(mp_timeline_format_parse("png", &format, &err), MP_ERR_INPUT);
  EXPECT_EQ(std::string(err.message), "unknown timeline format 'png' (formats: ascii, svg, chrome)");
}

TEST(Text, GrowsAndFormats) {
  mp_text text = MP_TEXT_INITIALIZER;
  EXPECT_STREQ(mp_text_string(&text), "");
  for (int i = 0; i < 1000; ++i) mp_text_printf(&text, "%d,", i % 10);
  mp_text_repeat(&text, '-', 3);
  EXPECT_EQ(text.length, 2003u);
  EXPECT_EQ(std::string(mp_text_string(&text)).substr(0, 6), "0,1,2,");
  EXPECT_EQ(std::string(mp_text_string(&text)).substr(1998), "9,---");
  mp_text_free(&text);
}

}  // namespace
