#include "ps/staleness.h"

#include <cmath>

namespace pacer {
namespace {

// Mean gap between consecutive push times; requires at least two.
double MeanInterval(std::span<const double> t) {
  return (t.back() - t.front()) / static_cast<double>(t.size() - 1);
}

}  // namespace

uint32_t DsspExtraIterations(std::span<const double> fastest_push_times,
                             std::span<const double> slowest_push_times, uint32_t r_max) {
  if (fastest_push_times.size() < 2 || slowest_push_times.size() < 2) return 0;
  const double f_interval = MeanInterval(fastest_push_times);
  const double s_next = slowest_push_times.back() + MeanInterval(slowest_push_times);
  const double f_last = fastest_push_times.back();
  uint32_t best = 0;
  double best_gap = std::abs(f_last - s_next);
  for (uint32_t r = 1; r <= r_max; ++r) {
    const double gap = std::abs(f_last + r * f_interval - s_next);
    if (gap < best_gap) {
      best_gap = gap;
      best = r;
    }
  }
  return best;
}

}  // namespace pacer
