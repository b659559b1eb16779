// Reading a range of one layout's shard from another layout's shards (tensor_parallel/shard.h's
// mp_tp_shard_read and mp_tp_shard_runs): what loading an llm.c file, resharding a checkpoint and
// streaming a save rely on. Checked against cutting the shard out of the whole tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tensor_parallel/shard.h"

namespace {

struct Source {
  std::vector<std::vector<float>> shards;  // per source rank
  size_t requested = 0;                    // floats handed out
  int reads = 0;
};

mp_status read_source(void *context, int source_rank, size_t offset, size_t count, float *dest,
                      mp_error *err) {
  auto *s = static_cast<Source *>(context);
  if (source_rank < 0 || source_rank >= (int)s->shards.size() ||
      offset + count > s->shards[source_rank].size()) {
    return mp_fail(err, MP_ERR_RUNTIME, "read outside source rank %d", source_rank);
  }
  std::memcpy(dest, s->shards[source_rank].data() + offset, count * sizeof(float));
  s->requested += count;
  s->reads++;
  return MP_OK;
}

std::vector<float> cut(const std::vector<float> &full, mp_tp_split split, size_t rows,
                       size_t cols, int rank, int size) {
  std::vector<float> shard(mp_tp_shard_floats(split, rows, cols, size));
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_OK, mp_tp_shard_extract(shard.data(), full.data(), split, rows, cols, rank, size,
                                       &err));
  return shard;
}

TEST(ShardRead, EveryRangeOfEveryLayoutFromEveryOtherLayout) {
  const size_t rows = 24, cols = 8;  // qkv: 3 x 8 rows, divisible by 3 x 4
  std::vector<float> full(rows * cols);
  for (size_t i = 0; i < full.size(); ++i) full[i] = (float)i + 0.5f;
  const mp_tp_split splits[] = {MP_TP_REPLICATED, MP_TP_SPLIT_ROWS, MP_TP_SPLIT_COLS,
                                MP_TP_SPLIT_QKV};
  for (mp_tp_split split : splits) {
    for (int source_size : {1, 2, 4}) {
      Source source;
      const int holders = split == MP_TP_REPLICATED ? 1 : source_size;
      for (int r = 0; r < holders; ++r) {
        source.shards.push_back(cut(full, split, rows, cols, r, source_size));
      }
      for (int size : {1, 2, 4, 8}) {
        if (split == MP_TP_SPLIT_QKV && size == 8) continue;
        for (int rank = 0; rank < size; ++rank) {
          const std::vector<float> want = cut(full, split, rows, cols, rank, size);
          for (size_t first : {size_t{0}, size_t{3}, want.size() / 2}) {
            for (size_t count : {want.size() - first, size_t{1}, (want.size() - first) / 3}) {
              std::vector<float> got(count, -1.0f);
              source.requested = 0;
              mp_error err = MP_ERROR_INITIALIZER;
              ASSERT_EQ(MP_OK, mp_tp_shard_read(got.data(), first, count, split, rows, cols, rank,
                                                size, source_size, read_source, &source, &err))
                  << err.message;
              for (size_t k = 0; k < count; ++k) {
                ASSERT_EQ(want[first + k], got[k])
                    << mp_tp_split_name(split) << " rank " << rank << "/" << size << " from "
                    << source_size << " element " << first + k;
              }
              EXPECT_EQ(count, source.requested) << "reads exactly the elements asked for";
            }
          }
        }
      }
    }
  }
}

TEST(ShardRead, WholeWidthBlocksAreOneRequest) {
  // A rows-split shard read from the full tensor is one contiguous run of the file: one read.
  const size_t rows = 8, cols = 4;
  std::vector<float> full(rows * cols, 1.0f);
  Source source;
  source.shards.push_back(full);
  std::vector<float> got(rows * cols / 2);
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(MP_OK, mp_tp_shard_read(got.data(), 0, got.size(), MP_TP_SPLIT_ROWS, rows, cols, 1, 2,
                                    1, read_source, &source, &err));
  EXPECT_EQ(1, source.reads);
}

struct Runs {
  std::vector<float> full;
  const std::vector<float> *shard;
};

mp_status put_run(void *context, size_t full_offset, size_t shard_offset, size_t count,
                  mp_error *err) {
  auto *r = static_cast<Runs *>(context);
  std::memcpy(r->full.data() + full_offset, r->shard->data() + shard_offset,
              count * sizeof(float));
  return MP_OK;
}

TEST(ShardRuns, PiecesOfEveryRankRebuildTheTensor) {
  const size_t rows = 12, cols = 6;
  std::vector<float> full(rows * cols);
  for (size_t i = 0; i < full.size(); ++i) full[i] = (float)i;
  for (mp_tp_split split : {MP_TP_SPLIT_ROWS, MP_TP_SPLIT_COLS, MP_TP_SPLIT_QKV}) {
    const int size = 2;
    Runs runs{std::vector<float>(full.size(), -1.0f), nullptr};
    for (int rank = 0; rank < size; ++rank) {
      const std::vector<float> shard = cut(full, split, rows, cols, rank, size);
      runs.shard = &shard;
      // In pieces of 5 floats, as a streamed save sends them.
      for (size_t first = 0; first < shard.size(); first += 5) {
        const size_t n = shard.size() - first < 5 ? shard.size() - first : 5;
        mp_error err = MP_ERROR_INITIALIZER;
        ASSERT_EQ(MP_OK, mp_tp_shard_runs(split, rows, cols, rank, size, first, n, put_run, &runs,
                                          &err));
      }
    }
    EXPECT_EQ(full, runs.full) << mp_tp_split_name(split);
  }
}

TEST(ShardRuns, RefusesARangeOutsideTheShard) {
  mp_error err = MP_ERROR_INITIALIZER;
  EXPECT_EQ(MP_ERR_INPUT, mp_tp_shard_runs(MP_TP_SPLIT_ROWS, 4, 4, 0, 2, 6, 3, put_run, nullptr,
                                           &err));
  EXPECT_STREQ("elements [6, +3) are outside a shard of 8 of a (4, 4) tensor", err.message);
}

}  // namespace
