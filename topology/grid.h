/*
 * topology/grid.h — the 4D rank grid: world rank <-> (dp, cp, pp, tp) coordinates and the
 * members of every tensor-, context-, data-, pipeline-parallel and embedding group.
 *
 * World size N = dp x cp x pp x tp. Rank order is tp fastest, then cp, then dp, then pp
 * (Megatron-LM's default order "tp-cp-dp-pp"), so a tensor-parallel group is a run of consecutive
 * ranks and sits inside one node on its fast links, with its context-parallel neighbours next:
 *
 *     rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank))
 *
 * A context-parallel group holds the ranks that share each sequence (each holds 1/cp of its
 * tokens); the weights are replicated over dp x cp, so the dp-cp group (Megatron's
 * "data-parallel group with context parallelism") is the one gradients are summed over and ZeRO
 * shards over: its members ordered by (dp_rank, cp_rank), its rank dp_rank x cp + cp_rank. With
 * cp = 1 it is the dp group.
 *
 * Megatron's 16-GPU example (tp 2, pp 4, dp 2, cp 1):
 *     tensor groups    [0,1] [2,3] [4,5] ... [14,15]
 *     pipeline groups  [0,4,8,12] [1,5,9,13] [2,6,10,14] [3,7,11,15]
 *     data groups      [0,2] [1,3] [4,6] [5,7] ... [13,15]
 *     embedding groups [0,12] [1,13] [2,14] [3,15], and [4] ... [11] (see below)
 *
 * The embedding group of a rank holds the first and the last pipeline stage of its pipeline group
 * (the ranks that own the input embedding and the tied LM head, whose gradients are summed). With
 * pp = 1 both are the rank itself. A rank of a middle stage owns neither; it gets a group of just
 * itself, so the groups of every kind partition the world, every rank can build its communicators
 * with the same collective calls, and a sum over a one-member group changes nothing.
 *
 * Everything here is a pure function with no MPI: the planner, `mpengine schedule` and the tests
 * use it on a laptop. Member lists are world ranks in ascending order.
 */
#ifndef MPENGINE_TOPOLOGY_GRID_H
#define MPENGINE_TOPOLOGY_GRID_H

#include "common/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int dp, pp, tp, cp;
} mp_grid_shape;

typedef struct {
  int dp_rank, pp_rank, tp_rank, cp_rank;
} mp_grid_coord;

typedef enum {
  MP_GRID_TP = 0,
  MP_GRID_DP = 1,
  MP_GRID_PP = 2,
  MP_GRID_EMBEDDING = 3,
  MP_GRID_CP = 4,
  MP_GRID_DP_CP = 5,
} mp_grid_kind;

enum { MP_GRID_NUM_KINDS = 6 };

/* Checks that every dimension is >= 1 and dp x cp x pp x tp equals world_size (without
 * overflow). Returns MP_OK, or MP_ERR_INPUT with a message naming the shape and the world size. */
mp_status mp_grid_check(const mp_grid_shape *shape, int world_size, mp_error *err);

/* dp x cp x pp x tp. The shape must have passed mp_grid_check. */
int mp_grid_world_size(const mp_grid_shape *shape);

/* Coordinates of a world rank in [0, world size), and back. */
mp_grid_coord mp_grid_coord_of(const mp_grid_shape *shape, int rank);
int mp_grid_rank_of(const mp_grid_shape *shape, mp_grid_coord coord);

/* The members of rank's group: writes them, ascending, to members and returns their count.
 * members must hold tp (tp group), dp (dp group), pp (pp group), 2 (embedding group), cp (cp
 * group) or dp x cp (dp-cp group) ints. */
int mp_grid_tp_group(const mp_grid_shape *shape, int rank, int *members);
int mp_grid_dp_group(const mp_grid_shape *shape, int rank, int *members);
int mp_grid_pp_group(const mp_grid_shape *shape, int rank, int *members);
int mp_grid_embedding_group(const mp_grid_shape *shape, int rank, int *members);
int mp_grid_cp_group(const mp_grid_shape *shape, int rank, int *members);
int mp_grid_dp_cp_group(const mp_grid_shape *shape, int rank, int *members);

/* The same, by kind; members must hold mp_grid_group_capacity(shape, kind) ints. */
int mp_grid_group_of(const mp_grid_shape *shape, mp_grid_kind kind, int rank, int *members);

/* The largest group of a kind: tp, dp, pp, min(pp, 2) for embedding, cp, dp x cp. */
int mp_grid_group_capacity(const mp_grid_shape *shape, mp_grid_kind kind);

/* Every group of a kind, ordered by their first (lowest) member: returns the number of groups G
 * and writes group g's members, ascending, to members[offsets[g] .. offsets[g + 1]). The groups
 * partition the world, so members must hold world size ints and offsets world size + 1 ints;
 * offsets[G] is the world size. */
int mp_grid_groups(const mp_grid_shape *shape, mp_grid_kind kind, int *members, int *offsets);

/* Expert parallelism (issue 33), folded over the dp x cp replicas as Megatron-Core's "parallel
 * folding" does: the replicas of one (pp, tp) position, in the dp-cp group's order (replica
 * index dp_rank x cp + cp_rank), are cut into runs of ep consecutive replicas, each an ep group
 * (its experts split over it: ep rank = replica index mod ep); the expert-data-parallel group of
 * a rank is the replicas with its ep rank (dp x cp / ep of them, the ranks holding the same
 * experts, over which the experts' gradients are summed). ep must divide dp x cp (the plan
 * checks it). With dp 4, cp 1, tp 1, pp 1 and ep 2: ep groups [0,1] [2,3], expert-dp groups
 * [0,2] [1,3]. Members ascending, as the other groups; members must hold dp x cp ints. */
int mp_grid_ep_group(const mp_grid_shape *shape, int ep, int rank, int *members);
int mp_grid_expert_dp_group(const mp_grid_shape *shape, int ep, int rank, int *members);
/* rank's place in its ep group (its replica index mod ep). */
int mp_grid_ep_rank(const mp_grid_shape *shape, int ep, int rank);

/* "tp", "dp", "pp", "embedding", "cp", "dp-cp": the group names engine/comm/comm.h uses in its messages. */
const char *mp_grid_kind_name(mp_grid_kind kind);

#ifdef __cplusplus
}
#endif

#endif /* MPENGINE_TOPOLOGY_GRID_H */
