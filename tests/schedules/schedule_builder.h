// tests/schedules/schedule_builder.h — hand-written schedules for the tests, in the notation the
// timelines print: one string per rank, actions separated by spaces, "F0 F1 B0 B1". F forward,
// B whole backward, I the input-gradient B of zero-bubble, W its weight gradient; the number is
// the micro-batch and a trailing letter the chunk ("F3b" is micro-batch 3 on chunk 1). Peers are
// filled in by mp_schedule_append, as a generator would.
#ifndef MPENGINE_TESTS_SCHEDULES_SCHEDULE_BUILDER_H
#define MPENGINE_TESTS_SCHEDULES_SCHEDULE_BUILDER_H

#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "schedules/schedule.h"

namespace mpengine_test {

// Frees its schedule when it goes out of scope.
struct OwnedSchedule {
  mp_schedule s = MP_SCHEDULE_INITIALIZER;
  OwnedSchedule() = default;
  OwnedSchedule(const OwnedSchedule &) = delete;
  OwnedSchedule &operator=(const OwnedSchedule &) = delete;
  ~OwnedSchedule() { mp_schedule_free(&s); }
};

inline ::testing::AssertionResult Build(int pp, int num_micro_batches, int virtual_stages,
                                        const std::vector<std::string> &ranks,
                                        OwnedSchedule *out) {
  mp_error err = MP_ERROR_INITIALIZER;
  if (mp_schedule_init(&out->s, MP_SCHEDULE_CUSTOM, pp, num_micro_batches, virtual_stages,
                       &err) != MP_OK) {
    return ::testing::AssertionFailure() << err.message;
  }
  if (static_cast<int>(ranks.size()) != pp) {
    return ::testing::AssertionFailure() << "need " << pp << " rank strings";
  }
  for (int r = 0; r < pp; ++r) {
    std::istringstream words(ranks[r]);
    std::string word;
    while (words >> word) {
      mp_action_kind kind;
      switch (word[0]) {
        case 'F': kind = MP_ACTION_FORWARD; break;
        case 'B': kind = MP_ACTION_BACKWARD; break;
        case 'I': kind = MP_ACTION_BACKWARD_INPUT; break;
        case 'W': kind = MP_ACTION_BACKWARD_WEIGHT; break;
        default: return ::testing::AssertionFailure() << "bad action '" << word << "'";
      }
      size_t used = 0;
      int micro_batch = std::stoi(word.substr(1), &used);
      int chunk = 1 + used < word.size() ? word[1 + used] - 'a' : 0;
      if (mp_schedule_append(&out->s, r, kind, micro_batch, chunk, &err) != MP_OK) {
        return ::testing::AssertionFailure() << err.message;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The rank's list in the same notation, for comparing generator output with a golden string.
inline std::string Actions(const mp_schedule &s, int rank) {
  std::string text;
  const mp_rank_actions &list = s.ranks[rank];
  for (int a = 0; a < list.num_actions; ++a) {
    const mp_action &action = list.actions[a];
    static const char kLetters[] = {'F', 'B', 'I', 'W'};
    if (a > 0) text += ' ';
    text += kLetters[action.kind];
    text += std::to_string(action.micro_batch);
    if (s.virtual_stages > 1) text += static_cast<char>('a' + action.chunk);
  }
  return text;
}

}  // namespace mpengine_test

#endif  // MPENGINE_TESTS_SCHEDULES_SCHEDULE_BUILDER_H
