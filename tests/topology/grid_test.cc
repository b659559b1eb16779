// tests/topology/grid_test.cc — the 4D rank grid against golden tables (Megatron-LM's 16-GPU
// example and small hand-written layouts), and properties over many shapes: coordinates round
// trip, every kind of group partitions the world, and a rank's group is the enumerated one.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "topology/grid.h"

namespace {

using Groups = std::vector<std::vector<int>>;

Groups all_groups(const mp_grid_shape &shape, mp_grid_kind kind) {
  int world = mp_grid_world_size(&shape);
  std::vector<int> members(world), offsets(world + 1);
  int count = mp_grid_groups(&shape, kind, members.data(), offsets.data());
  Groups groups;
  for (int g = 0; g < count; ++g) {
    groups.emplace_back(members.begin() + offsets[g], members.begin() + offsets[g + 1]);
  }
  EXPECT_EQ(offsets[count], world);
  return groups;
}

std::vector<int> group_of(const mp_grid_shape &shape, mp_grid_kind kind, int rank) {
  std::vector<int> members(mp_grid_group_capacity(&shape, kind) + 1, -7);
  int count = mp_grid_group_of(&shape, kind, rank, members.data());
  EXPECT_EQ(members[count], -7) << "wrote past the group's members";
  members.resize(count);
  return members;
}

// Megatron-LM's example (parallel_state.initialize_model_parallel): 16 GPUs, tp 2, pp 4, so dp 2.
TEST(Grid, MegatronSixteenGpuExample) {
  mp_grid_shape shape = {2, 4, 2, 1};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_grid_check(&shape, 16, &err), MP_OK) << err.message;
  EXPECT_EQ(all_groups(shape, MP_GRID_TP),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_PP),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_DP),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_EMBEDDING),
            (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}, {4}, {5}, {6}, {7}, {8}, {9}, {10},
                    {11}}));

  mp_grid_coord coord = mp_grid_coord_of(&shape, 13);
  EXPECT_EQ(coord.tp_rank, 1);
  EXPECT_EQ(coord.dp_rank, 0);
  EXPECT_EQ(coord.pp_rank, 3);
  EXPECT_EQ(mp_grid_rank_of(&shape, mp_grid_coord{1, 2, 0, 0}), 10);  // dp 1, pp 2, tp 0, cp 0

  EXPECT_EQ(group_of(shape, MP_GRID_TP, 7), (std::vector<int>{6, 7}));
  EXPECT_EQ(group_of(shape, MP_GRID_DP, 7), (std::vector<int>{5, 7}));
  EXPECT_EQ(group_of(shape, MP_GRID_PP, 7), (std::vector<int>{3, 7, 11, 15}));
  EXPECT_EQ(group_of(shape, MP_GRID_EMBEDDING, 15), (std::vector<int>{3, 15}));
  EXPECT_EQ(group_of(shape, MP_GRID_EMBEDDING, 3), (std::vector<int>{3, 15}));
  EXPECT_EQ(group_of(shape, MP_GRID_EMBEDDING, 7), (std::vector<int>{7}));
}

// 8 ranks as dp 2 x pp 2 x tp 2, written out by hand.
TEST(Grid, EightRanksTable) {
  mp_grid_shape shape = {2, 2, 2, 1};
  // rank: (dp, pp, tp)
  const int table[8][3] = {{0, 0, 0}, {0, 0, 1}, {1, 0, 0}, {1, 0, 1},
                           {0, 1, 0}, {0, 1, 1}, {1, 1, 0}, {1, 1, 1}};
  for (int rank = 0; rank < 8; ++rank) {
    mp_grid_coord coord = mp_grid_coord_of(&shape, rank);
    EXPECT_EQ(coord.dp_rank, table[rank][0]) << "rank " << rank;
    EXPECT_EQ(coord.pp_rank, table[rank][1]) << "rank " << rank;
    EXPECT_EQ(coord.tp_rank, table[rank][2]) << "rank " << rank;
  }
  EXPECT_EQ(all_groups(shape, MP_GRID_TP), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_DP), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_PP), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_EMBEDDING), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

// pp = 1: the embedding group is the rank alone; tp = 1: tensor groups are singletons.
TEST(Grid, DegenerateDimensions) {
  mp_grid_shape data_only = {4, 1, 1, 1};
  EXPECT_EQ(all_groups(data_only, MP_GRID_DP), (Groups{{0, 1, 2, 3}}));
  EXPECT_EQ(all_groups(data_only, MP_GRID_TP), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(all_groups(data_only, MP_GRID_PP), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(all_groups(data_only, MP_GRID_EMBEDDING), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(mp_grid_group_capacity(&data_only, MP_GRID_EMBEDDING), 1);

  mp_grid_shape pipeline_tensor = {1, 2, 2, 1};  // 4 ranks: the comm tests' layout
  EXPECT_EQ(all_groups(pipeline_tensor, MP_GRID_TP), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(all_groups(pipeline_tensor, MP_GRID_PP), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(all_groups(pipeline_tensor, MP_GRID_DP), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(all_groups(pipeline_tensor, MP_GRID_EMBEDDING), (Groups{{0, 2}, {1, 3}}));

  mp_grid_shape one = {1, 1, 1, 1};
  for (int kind = 0; kind < MP_GRID_NUM_KINDS; ++kind) {
    EXPECT_EQ(all_groups(one, (mp_grid_kind)kind), (Groups{{0}}));
  }
}

TEST(Grid, CheckNamesTheMismatch) {
  mp_error err = MP_ERROR_INITIALIZER;
  mp_grid_shape shape = {2, 2, 2, 1};
  EXPECT_EQ(mp_grid_check(&shape, 8, &err), MP_OK);
  EXPECT_EQ(mp_grid_check(&shape, 6, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "parallel layout dp 2 x cp 1 x pp 2 x tp 2 = 8 ranks does not match the world "
               "size 6; launch 8 ranks or change dp, cp, pp or tp so that dp x cp x pp x tp = 6");
  mp_grid_shape zero = {0, 2, 2, 1};
  EXPECT_EQ(mp_grid_check(&zero, 0, &err), MP_ERR_INPUT);
  EXPECT_STREQ(err.message,
               "parallel layout dp 0 x cp 1 x pp 2 x tp 2: every dimension must be at least 1");
  mp_grid_shape huge = {1 << 16, 1 << 16, 4, 1};
  EXPECT_EQ(mp_grid_check(&huge, 0, &err), MP_ERR_INPUT);
}

TEST(Grid, KindNames) {
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_TP), "tp");
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_DP), "dp");
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_PP), "pp");
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_EMBEDDING), "embedding");
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_CP), "cp");
  EXPECT_STREQ(mp_grid_kind_name(MP_GRID_DP_CP), "dp-cp");
}

// Megatron-LM's order tp-cp-dp-pp (parallel_state with context_parallel_size), written out by
// hand for 16 ranks as tp 2, cp 2, dp 2, pp 2: rank = tp + 2 (cp + 2 (dp + 2 pp)).
TEST(Grid, ContextParallelSixteenRanks) {
  mp_grid_shape shape = {2, 2, 2, 2};
  mp_error err = MP_ERROR_INITIALIZER;
  ASSERT_EQ(mp_grid_check(&shape, 16, &err), MP_OK) << err.message;
  EXPECT_EQ(all_groups(shape, MP_GRID_TP),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_CP),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_DP),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_DP_CP),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(all_groups(shape, MP_GRID_PP),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  mp_grid_coord coord = mp_grid_coord_of(&shape, 14);
  EXPECT_EQ(coord.tp_rank, 0);
  EXPECT_EQ(coord.cp_rank, 1);
  EXPECT_EQ(coord.dp_rank, 1);
  EXPECT_EQ(coord.pp_rank, 1);
  EXPECT_EQ(group_of(shape, MP_GRID_DP_CP, 14), (std::vector<int>{8, 10, 12, 14}));
}

// Expert parallelism folded over the dp x cp replicas (Megatron-Core's parallel folding): an ep
// group is ep consecutive replicas of one (pp, tp) position in the dp-cp group's order, the
// expert-dp group the replicas with the same ep rank.
std::vector<int> ep_members(const mp_grid_shape &shape, int ep, int rank, bool expert_dp) {
  std::vector<int> members(shape.dp * shape.cp + 1, -7);
  const int count = expert_dp ? mp_grid_expert_dp_group(&shape, ep, rank, members.data())
                              : mp_grid_ep_group(&shape, ep, rank, members.data());
  EXPECT_EQ(members[count], -7) << "wrote past the group's members";
  members.resize(count);
  return members;
}

TEST(Grid, ExpertParallelFoldedOverDataAndContext) {
  const mp_grid_shape dp4 = {4, 1, 1, 1};
  EXPECT_EQ(ep_members(dp4, 2, 0, false), (std::vector<int>{0, 1}));
  EXPECT_EQ(ep_members(dp4, 2, 3, false), (std::vector<int>{2, 3}));
  EXPECT_EQ(ep_members(dp4, 2, 1, true), (std::vector<int>{1, 3}));
  EXPECT_EQ(ep_members(dp4, 4, 2, false), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(ep_members(dp4, 4, 2, true), (std::vector<int>{2}));
  EXPECT_EQ(mp_grid_ep_rank(&dp4, 2, 3), 1);
  // dp 2, pp 2, tp 2, cp 2: rank 14's replicas (dp-cp group) are 8, 10, 12, 14, in that order.
  const mp_grid_shape folded = {2, 2, 2, 2};
  EXPECT_EQ(ep_members(folded, 2, 14, false), (std::vector<int>{12, 14}));
  EXPECT_EQ(ep_members(folded, 2, 14, true), (std::vector<int>{10, 14}));
  EXPECT_EQ(ep_members(folded, 2, 11, false), (std::vector<int>{9, 11}));
  EXPECT_EQ(ep_members(folded, 4, 14, false), (std::vector<int>{8, 10, 12, 14}));
  EXPECT_EQ(ep_members(folded, 4, 14, true), (std::vector<int>{14}));
  EXPECT_EQ(mp_grid_ep_rank(&folded, 2, 14), 1);
  EXPECT_EQ(mp_grid_ep_rank(&folded, 4, 12), 2);
}

// Every shape with up to 64 ranks: coordinates round trip in Megatron's order, each kind of group
// partitions the world into ascending lists, a rank's group is the enumerated group holding it,
// and its members differ from it in exactly the group's coordinate.
TEST(Grid, PropertiesOverManyShapes) {
  int shapes = 0;
  for (int dp = 1; dp <= 8; ++dp) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int tp = 1; tp <= 8; ++tp) {
       for (int cp = 1; cp <= 4; ++cp) {
        if (dp * pp * tp * cp > 64) continue;
        ++shapes;
        mp_grid_shape shape = {dp, pp, tp, cp};
        int world = dp * pp * tp * cp;
        SCOPED_TRACE("dp " + std::to_string(dp) + " pp " + std::to_string(pp) + " tp " +
                     std::to_string(tp) + " cp " + std::to_string(cp));
        ASSERT_EQ(mp_grid_check(&shape, world, nullptr), MP_OK);
        ASSERT_EQ(mp_grid_world_size(&shape), world);
        for (int rank = 0; rank < world; ++rank) {
          mp_grid_coord coord = mp_grid_coord_of(&shape, rank);
          ASSERT_EQ(coord.tp_rank, rank % tp);
          ASSERT_EQ(coord.cp_rank, rank / tp % cp);
          ASSERT_EQ(coord.dp_rank, rank / (tp * cp) % dp);
          ASSERT_EQ(coord.pp_rank, rank / (tp * cp * dp));
          ASSERT_EQ(mp_grid_rank_of(&shape, coord), rank);
        }
        for (int kind = 0; kind < MP_GRID_NUM_KINDS; ++kind) {
          mp_grid_kind k = (mp_grid_kind)kind;
          Groups groups = all_groups(shape, k);
          std::vector<int> owner(world, -1);
          for (size_t g = 0; g < groups.size(); ++g) {
            ASSERT_FALSE(groups[g].empty());
            ASSERT_LE((int)groups[g].size(), mp_grid_group_capacity(&shape, k));
            if (g > 0) {
              ASSERT_LT(groups[g - 1][0], groups[g][0]);
            }
            for (size_t i = 0; i < groups[g].size(); ++i) {
              int member = groups[g][i];
              if (i > 0) {
                ASSERT_LT(groups[g][i - 1], member);
              }
              ASSERT_EQ(owner[member], -1) << "rank " << member << " in two groups";
              owner[member] = (int)g;
            }
          }
          for (int rank = 0; rank < world; ++rank) {
            ASSERT_NE(owner[rank], -1) << "rank " << rank << " in no " << mp_grid_kind_name(k)
                                       << " group";
            std::vector<int> mine = group_of(shape, k, rank);
            ASSERT_EQ(mine, groups[owner[rank]]);
            mp_grid_coord self = mp_grid_coord_of(&shape, rank);
            for (int member : mine) {
              mp_grid_coord other = mp_grid_coord_of(&shape, member);
              // Members share every coordinate but the group's own.
              if (k != MP_GRID_TP) {
                ASSERT_EQ(other.tp_rank, self.tp_rank);
              }
              if (k != MP_GRID_DP && k != MP_GRID_DP_CP) {
                ASSERT_EQ(other.dp_rank, self.dp_rank);
              }
              if (k != MP_GRID_CP && k != MP_GRID_DP_CP) {
                ASSERT_EQ(other.cp_rank, self.cp_rank);
              }
              if (k != MP_GRID_PP && k != MP_GRID_EMBEDDING) {
                ASSERT_EQ(other.pp_rank, self.pp_rank);
              }
            }
          }
          int expected_groups = k == MP_GRID_TP ? world / tp
                                : k == MP_GRID_DP ? world / dp
                                : k == MP_GRID_PP ? world / pp
                                : k == MP_GRID_CP ? world / cp
                                : k == MP_GRID_DP_CP ? world / (dp * cp)
                                : pp == 1 ? world
                                          : world / pp * (pp - 1);
          ASSERT_EQ((int)groups.size(), expected_groups);
        }
        // Embedding groups: the first and last stage of each pipeline group; middle stages alone.
        for (int rank = 0; rank < world; ++rank) {
          std::vector<int> pipeline = group_of(shape, MP_GRID_PP, rank);
          std::vector<int> embedding = group_of(shape, MP_GRID_EMBEDDING, rank);
          int stage = mp_grid_coord_of(&shape, rank).pp_rank;
          if (pp == 1) {
            ASSERT_EQ(embedding, (std::vector<int>{rank}));
          } else if (stage == 0 || stage == pp - 1) {
            ASSERT_EQ(embedding, (std::vector<int>{pipeline.front(), pipeline.back()}));
          } else {
            ASSERT_EQ(embedding, (std::vector<int>{rank}));
          }
        }
       }
      }
    }
  }
  EXPECT_GT(shapes, 200);
}

}  // namespace
