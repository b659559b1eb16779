// The dp communicator's own logic (engine/comm/dp_comm.h): the pieces an MPI communicator stages
// an uneven all-gather of device memory through. Each piece of the output must take exactly the
// elements of each rank's run that fall in it, and this rank's share must start where its run
// meets the piece, whatever the piece size.
#include <cstddef>
#include <vector>

#include <gtest/gtest.h>

extern "C" {
#include "engine/comm/dp_comm_internal.h"
}

namespace {

TEST(DpCommPieces, EveryElementOfEveryRunLandsInExactlyOnePiece) {
  const std::vector<size_t> counts = {5, 0, 7, 3};  // runs [0,5) [5,5) [5,12) [12,15)
  const int size = static_cast<int>(counts.size());
  for (size_t piece = 1; piece <= 16; ++piece) {
    for (int rank = 0; rank < size; ++rank) {
      std::vector<size_t> taken(counts.size(), 0);
      size_t run_start = 0;
      for (int r = 0; r < rank; ++r) run_start += counts[r];
      for (size_t at = 0; at < 15; at += piece) {
        const size_t n = 15 - at < piece ? 15 - at : piece;
        std::vector<size_t> in_piece(counts.size(), 0);
        size_t mine_from = 0;
        mp_dp_comm_piece_counts(counts.data(), size, rank, at, n, in_piece.data(), &mine_from);
        size_t sum = 0;
        for (int r = 0; r < size; ++r) {
          sum += in_piece[r];
          taken[r] += in_piece[r];
        }
        EXPECT_EQ(sum, n) << "piece " << piece << " at " << at;
        if (in_piece[rank] > 0) {
          // This rank's share starts at the later of its run's start and the piece's.
          const size_t expected = at > run_start ? at - run_start : 0;
          EXPECT_EQ(mine_from, expected) << "piece " << piece << " at " << at;
        }
      }
      for (int r = 0; r < size; ++r) EXPECT_EQ(taken[r], counts[r]) << "rank " << r;
    }
  }
}

}  // namespace
