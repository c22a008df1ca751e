// Consistency rules a shard enforces per push and pull, as pure functions so
// that the shard, unit tests and the cluster simulator share them. ps/ owns
// them; the monitor only sets each worker's bounds.
// ShardCore (ps/shard.h) applies them on every read; bench/ 's simulator
// runs the same functions.
#ifndef PACER_PS_STALENESS_H_
#define PACER_PS_STALENESS_H_

#include <cstdint>
#include <span>

namespace pacer {

// The largest staleness bound a shard enforces (s, or s_L + r_max): each
// clock a read may run ahead holds an accumulator at the shard.
inline constexpr uint32_t kMaxStalenessBound = 15;

// SSP (Ho et al., NIPS 2013): a worker at clock `clock` may read once every
// live worker has pushed clock - s - 1, i.e. once `slowest_pushed` (the
// lowest clock pushed by every live worker; -1 when none) is at least that.
// s = 0 is BSP.
inline bool SspReadAllowed(uint64_t clock, int64_t slowest_pushed, uint32_t s) {
  return static_cast<int64_t>(clock) - static_cast<int64_t>(s) - 1 <= slowest_pushed;
}

// DSSP (Zhao et al., ICDCS 2019): when the fastest worker would block at its
// lower bound s_L, grant it r* extra iterations, 0 <= r* <= r_max, chosen so
// that its predicted push time comes closest to the slowest worker's next
// predicted push:
//   r* = argmin_r | (f_last + r * f_interval) - (s_last + s_interval) |,
// where each interval is the mean gap between that worker's recent push
// times (seconds, ascending). With fewer than two push times for either
// worker nothing can be extrapolated and r* = 0. Ties go to the smaller r.
uint32_t DsspExtraIterations(std::span<const double> fastest_push_times,
                             std::span<const double> slowest_push_times, uint32_t r_max);

}  // namespace pacer

#endif  // PACER_PS_STALENESS_H_
