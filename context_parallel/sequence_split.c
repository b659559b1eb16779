/* context_parallel/sequence_split.c — a cp rank's two chunks of every sequence; see the header. */
#include "context_parallel/sequence_split.h"

mp_status mp_cp_check(int64_t seq_len, int cp, mp_error *err) {
  if (cp < 1) return mp_fail(err, MP_ERR_INPUT, "cp %d: must be at least 1", cp);
  if (cp == 1 || seq_len % (2 * (int64_t)cp) == 0) return MP_OK;
  return mp_fail(err, MP_ERR_INPUT,
                 "sequence length %lld does not divide into 2 x cp = %d chunks; use a multiple "
                 "of %d",
                 (long long)seq_len, 2 * cp, 2 * cp);
}

int64_t mp_cp_position(int64_t seq_len, int cp, int rank, int64_t t) {
  if (cp <= 1) return t;
  const int64_t chunk = seq_len / (2 * (int64_t)cp);
  const int64_t which = t < chunk ? rank : 2 * (int64_t)cp - 1 - rank;
  return which * chunk + t % chunk;
}

void mp_cp_positions(int32_t *positions, int64_t seq_len, int cp, int rank) {
  const int64_t local = seq_len / (cp > 1 ? cp : 1);
  for (int64_t t = 0; t < local; ++t) {
    positions[t] = (int32_t)mp_cp_position(seq_len, cp, rank, t);
  }
}

void mp_cp_take_local(int32_t *local, const int32_t *full, int64_t rows, int64_t seq_len, int cp,
                      int rank) {
  const int64_t per_rank = seq_len / (cp > 1 ? cp : 1);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < per_rank; ++t) {
      local[r * per_rank + t] = full[r * seq_len + mp_cp_position(seq_len, cp, rank, t)];
    }
  }
}
