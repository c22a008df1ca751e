#include "monitor/policy.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace pacer::policy {

void EwmaTrendPredictor::Observe(uint32_t worker, double x, TimePoint /*at*/) {
  State& s = state_[worker];
  if (s.observations == 0) {
    s.level = x;
    s.trend = 0;
  } else {
    const double previous = s.level;
    s.level = alpha_ * x + (1 - alpha_) * (s.level + s.trend);
    s.trend = beta_ * (s.level - previous) + (1 - beta_) * s.trend;
  }
  ++s.observations;
}

std::optional<double> EwmaTrendPredictor::Predict(uint32_t worker) const {
  auto it = state_.find(worker);
  if (it == state_.end() || it->second.observations == 0) return std::nullopt;
  // A falling trend must not predict zero or negative time.
  return std::max(it->second.level + it->second.trend, 0.1 * it->second.level);
}

namespace {

struct Entry {
  uint32_t id;
  uint32_t lo, hi;  // clamps
  double target;    // wanted size, before rounding
  uint32_t size;
};

// Distributes exactly `total` over the entries: each gets its target scaled
// by one common factor, clamped to [lo, hi], then rounded by largest
// remainder. Water-filling: entries that hit a clamp are fixed and the
// factor is recomputed for the rest.
void Distribute(std::vector<Entry>& e, uint64_t total) {
  std::vector<bool> fixed(e.size(), false);
  std::vector<double> share(e.size());
  for (;;) {
    double free_target = 0;
    double free_total = static_cast<double>(total);
    for (size_t i = 0; i < e.size(); ++i) {
      if (fixed[i]) {
        free_total -= share[i];
      } else {
        free_target += e[i].target;
      }
    }
    bool changed = false;
    for (size_t i = 0; i < e.size(); ++i) {
      if (fixed[i]) continue;
      double s = free_target > 0 ? e[i].target * free_total / free_target : 0;
      if (s < e[i].lo) {
        share[i] = e[i].lo, fixed[i] = true, changed = true;
      } else if (s > e[i].hi) {
        share[i] = e[i].hi, fixed[i] = true, changed = true;
      } else {
        share[i] = s;
      }
    }
    if (!changed) break;
  }
  // Round down, then hand out what is left by largest remainder, within hi.
  uint64_t used = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    e[i].size = static_cast<uint32_t>(std::clamp<double>(std::floor(share[i]), e[i].lo, e[i].hi));
    used += e[i].size;
  }
  std::vector<size_t> order(e.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    double ra = share[a] - std::floor(share[a]), rb = share[b] - std::floor(share[b]);
    return ra != rb ? ra > rb : e[a].id < e[b].id;
  });
  while (used < total) {
    bool gave = false;
    for (size_t i : order) {
      if (used == total) break;
      if (e[i].size < e[i].hi) ++e[i].size, ++used, gave = true;
    }
    if (!gave) break;
  }
  while (used > total) {
    bool took = false;
    for (auto it = order.rbegin(); it != order.rend() && used > total; ++it) {
      if (e[*it].size > e[*it].lo) --e[*it].size, --used, took = true;
    }
    if (!took) break;
  }
}

}  // namespace

absl::StatusOr<std::map<uint32_t, uint32_t>> RebalanceBatches(
    const std::map<uint32_t, WorkerTiming>& workers, const BatchOptions& options) {
  if (workers.empty()) return absl::InvalidArgumentError("no workers to size");
  std::vector<Entry> e;
  uint64_t lo_sum = 0, hi_sum = 0;
  double mean_time = 0;
  for (const auto& [id, w] : workers) {
    uint32_t hi = options.b_max;
    if (w.memory_limit_batch > 0) hi = std::min(hi, w.memory_limit_batch);
    uint32_t lo = std::min(options.b_min, hi);
    lo_sum += lo;
    hi_sum += hi;
    e.push_back({id, lo, hi, 0, 0});
    mean_time += w.batch * w.seconds_per_sample + w.communication_seconds;
  }
  if (lo_sum > options.global_batch || hi_sum < options.global_batch) {
    return absl::InvalidArgumentError("the clamps cannot add up to the global batch " +
                                      std::to_string(options.global_batch));
  }
  mean_time /= static_cast<double>(workers.size());
  size_t i = 0;
  for (const auto& [id, w] : workers) {
    const double t = w.batch * w.seconds_per_sample + w.communication_seconds;
    double target = (t > 0 && w.batch > 0) ? w.batch * mean_time / t : w.batch;
    if (w.batch == 0) target = static_cast<double>(options.global_batch) / workers.size();
    // Deadband: small changes keep the current size.
    if (w.batch > 0 && std::abs(target - w.batch) <= options.deadband * w.batch) target = w.batch;
    e[i++].target = std::max(target, 1e-9);
  }
  Distribute(e, options.global_batch);
  std::map<uint32_t, uint32_t> out;
  for (const auto& x : e) out[x.id] = x.size;
  return out;
}

}  // namespace pacer::policy
