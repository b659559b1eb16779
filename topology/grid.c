/* topology/grid.c — rank <-> (dp, cp, pp, tp) with tp fastest, then cp, then dp, then pp; see
 * grid.h. */
#include "topology/grid.h"

#include <limits.h>
#include <stdbool.h>

mp_status mp_grid_check(const mp_grid_shape *shape, int world_size, mp_error *err) {
  if (shape->dp < 1 || shape->pp < 1 || shape->tp < 1 || shape->cp < 1) {
    return mp_fail(err, MP_ERR_INPUT,
                   "parallel layout dp %d x cp %d x pp %d x tp %d: every dimension must be at "
                   "least 1",
                   shape->dp, shape->cp, shape->pp, shape->tp);
  }
  long long product = (long long)shape->dp * shape->pp;
  if (product > INT_MAX || product * shape->tp > INT_MAX ||
      product * shape->tp * shape->cp > INT_MAX ||
      product * shape->tp * shape->cp != world_size) {
    const long long ranks = product * shape->tp * shape->cp;
    return mp_fail(err, MP_ERR_INPUT,
                   "parallel layout dp %d x cp %d x pp %d x tp %d = %lld ranks does not match "
                   "the world size %d; launch %lld ranks or change dp, cp, pp or tp so that "
                   "dp x cp x pp x tp = %d",
                   shape->dp, shape->cp, shape->pp, shape->tp, ranks, world_size, ranks,
                   world_size);
  }
  return MP_OK;
}

int mp_grid_world_size(const mp_grid_shape *shape) {
  return shape->dp * shape->cp * shape->pp * shape->tp;
}

mp_grid_coord mp_grid_coord_of(const mp_grid_shape *shape, int rank) {
  mp_grid_coord coord;
  coord.tp_rank = rank % shape->tp;
  coord.cp_rank = (rank / shape->tp) % shape->cp;
  coord.dp_rank = (rank / (shape->tp * shape->cp)) % shape->dp;
  coord.pp_rank = rank / (shape->tp * shape->cp * shape->dp);
  return coord;
}

int mp_grid_rank_of(const mp_grid_shape *shape, mp_grid_coord coord) {
  return coord.tp_rank +
         shape->tp * (coord.cp_rank + shape->cp * (coord.dp_rank + shape->dp * coord.pp_rank));
}

/* Walking one coordinate from 0 upwards with the others fixed gives ascending ranks, because the
 * rank is increasing in each coordinate. */
int mp_grid_tp_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  for (int i = 0; i < shape->tp; ++i) {
    coord.tp_rank = i;
    members[i] = mp_grid_rank_of(shape, coord);
  }
  return shape->tp;
}

int mp_grid_dp_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  for (int i = 0; i < shape->dp; ++i) {
    coord.dp_rank = i;
    members[i] = mp_grid_rank_of(shape, coord);
  }
  return shape->dp;
}

int mp_grid_pp_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  for (int i = 0; i < shape->pp; ++i) {
    coord.pp_rank = i;
    members[i] = mp_grid_rank_of(shape, coord);
  }
  return shape->pp;
}

int mp_grid_embedding_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  bool first = coord.pp_rank == 0, last = coord.pp_rank == shape->pp - 1;
  if (shape->pp == 1 || (!first && !last)) {
    members[0] = rank;
    return 1;
  }
  coord.pp_rank = 0;
  members[0] = mp_grid_rank_of(shape, coord);
  coord.pp_rank = shape->pp - 1;
  members[1] = mp_grid_rank_of(shape, coord);
  return 2;
}

int mp_grid_cp_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  for (int i = 0; i < shape->cp; ++i) {
    coord.cp_rank = i;
    members[i] = mp_grid_rank_of(shape, coord);
  }
  return shape->cp;
}

/* (dp_rank, cp_rank) in that order walks ascending ranks: cp is the faster of the two. */
int mp_grid_dp_cp_group(const mp_grid_shape *shape, int rank, int *members) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  int count = 0;
  for (int d = 0; d < shape->dp; ++d) {
    for (int c = 0; c < shape->cp; ++c) {
      coord.dp_rank = d;
      coord.cp_rank = c;
      members[count++] = mp_grid_rank_of(shape, coord);
    }
  }
  return count;
}

/* The replica index of rank among its (pp, tp) position's dp x cp replicas (its dp-cp group
 * rank), and the world rank of replica q of that position. */
static int replica_of(const mp_grid_shape *shape, int rank) {
  const mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  return coord.dp_rank * shape->cp + coord.cp_rank;
}

static int replica_rank(const mp_grid_shape *shape, int rank, int q) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  coord.dp_rank = q / shape->cp;
  coord.cp_rank = q % shape->cp;
  return mp_grid_rank_of(shape, coord);
}

int mp_grid_ep_rank(const mp_grid_shape *shape, int ep, int rank) {
  return replica_of(shape, rank) % ep;
}

int mp_grid_ep_group(const mp_grid_shape *shape, int ep, int rank, int *members) {
  const int first = replica_of(shape, rank) / ep * ep;
  for (int i = 0; i < ep; ++i) members[i] = replica_rank(shape, rank, first + i);
  return ep;
}

int mp_grid_expert_dp_group(const mp_grid_shape *shape, int ep, int rank, int *members) {
  const int total = shape->dp * shape->cp;
  int count = 0;
  for (int q = replica_of(shape, rank) % ep; q < total; q += ep) {
    members[count++] = replica_rank(shape, rank, q);
  }
  return count;
}

int mp_grid_group_of(const mp_grid_shape *shape, mp_grid_kind kind, int rank, int *members) {
  switch (kind) {
    case MP_GRID_TP: return mp_grid_tp_group(shape, rank, members);
    case MP_GRID_DP: return mp_grid_dp_group(shape, rank, members);
    case MP_GRID_PP: return mp_grid_pp_group(shape, rank, members);
    case MP_GRID_EMBEDDING: return mp_grid_embedding_group(shape, rank, members);
    case MP_GRID_CP: return mp_grid_cp_group(shape, rank, members);
    case MP_GRID_DP_CP: return mp_grid_dp_cp_group(shape, rank, members);
  }
  return 0;
}

int mp_grid_group_capacity(const mp_grid_shape *shape, mp_grid_kind kind) {
  switch (kind) {
    case MP_GRID_TP: return shape->tp;
    case MP_GRID_DP: return shape->dp;
    case MP_GRID_PP: return shape->pp;
    case MP_GRID_EMBEDDING: return shape->pp < 2 ? shape->pp : 2;
    case MP_GRID_CP: return shape->cp;
    case MP_GRID_DP_CP: return shape->dp * shape->cp;
  }
  return 0;
}

/* Whether rank is the lowest member of its group of this kind. */
static bool opens_group(const mp_grid_shape *shape, mp_grid_kind kind, int rank) {
  mp_grid_coord coord = mp_grid_coord_of(shape, rank);
  switch (kind) {
    case MP_GRID_TP: return coord.tp_rank == 0;
    case MP_GRID_DP: return coord.dp_rank == 0;
    case MP_GRID_PP: return coord.pp_rank == 0;
    case MP_GRID_EMBEDDING: return shape->pp == 1 || coord.pp_rank < shape->pp - 1;
    case MP_GRID_CP: return coord.cp_rank == 0;
    case MP_GRID_DP_CP: return coord.dp_rank == 0 && coord.cp_rank == 0;
  }
  return false;
}

/* Visiting ranks in ascending order and opening a group at each lowest member lists the groups
 * ordered by their first member. */
int mp_grid_groups(const mp_grid_shape *shape, mp_grid_kind kind, int *members, int *offsets) {
  int world = mp_grid_world_size(shape);
  int groups = 0, filled = 0;
  offsets[0] = 0;
  for (int rank = 0; rank < world; ++rank) {
    if (!opens_group(shape, kind, rank)) continue;
    filled += mp_grid_group_of(shape, kind, rank, members + filled);
    offsets[++groups] = filled;
  }
  return groups;
}

const char *mp_grid_kind_name(mp_grid_kind kind) {
  switch (kind) {
    case MP_GRID_TP: return "tp";
    case MP_GRID_DP: return "dp";
    case MP_GRID_PP: return "pp";
    case MP_GRID_EMBEDDING: return "embedding";
    case MP_GRID_CP: return "cp";
    case MP_GRID_DP_CP: return "dp-cp";
  }
  return "?";
}
