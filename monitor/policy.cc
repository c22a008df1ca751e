#include "monitor/policy.h"

#include "spdlog/spdlog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

namespace pacer::policy {

void EwmaTrendPredictor::Observe(uint32_t worker, double x, TimePoint /*at*/) {
  State& s = state_[worker];
  if (s.observations == 0 || IsLevelShift(x, s.Prediction(), shift_)) {
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
  return it->second.Prediction();
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

absl::Status RebalanceInto(std::span<const std::pair<uint32_t, WorkerTiming>> workers,
                           const BatchOptions& options, std::vector<uint32_t>* sizes) {
  if (workers.empty()) return absl::InvalidArgumentError("no workers to size");
  std::vector<Entry> e;
  e.reserve(workers.size());
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
  // The rule b_i' = b_i * tbar / t_i settles where every t_i = b_i * spp_i +
  // comm_i is the same T. With the sizes adding up to B, that fixed point is
  //   T = (B + sum comm_i / spp_i) / sum 1 / spp_i,  b_i = (T - comm_i) / spp_i,
  // so we go there in one round rather than iterate towards it (comm does
  // not shrink with the batch, so plain iteration only creeps up on it).
  double inv_sum = 0, comm_sum = 0;
  bool measured = true;
  for (const auto& [id, w] : workers) {
    if (w.seconds_per_sample <= 0 || w.batch == 0) measured = false;
    if (w.seconds_per_sample > 0) {
      inv_sum += 1 / w.seconds_per_sample;
      comm_sum += w.communication_seconds / w.seconds_per_sample;
    }
  }
  const double time = measured ? (options.global_batch + comm_sum) / inv_sum : 0;
  size_t i = 0;
  for (const auto& [id, w] : workers) {
    double target;
    if (w.batch == 0) {
      target = static_cast<double>(options.global_batch) / workers.size();
    } else if (measured) {
      target = std::max(0.0, time * w.time_share - w.communication_seconds) / w.seconds_per_sample;
    } else {
      const double t = w.batch * w.seconds_per_sample + w.communication_seconds;
      target = t > 0 ? w.batch * mean_time / t : w.batch;
    }
    // Deadband: small changes keep the current size.
    if (w.batch > 0 && std::abs(target - w.batch) <= options.deadband * w.batch) target = w.batch;
    e[i++].target = std::max(target, 1e-9);
  }
  Distribute(e, options.global_batch);
  sizes->resize(e.size());
  for (size_t k = 0; k < e.size(); ++k) (*sizes)[k] = e[k].size;
  return absl::OkStatus();
}

absl::StatusOr<std::map<uint32_t, uint32_t>> RebalanceBatches(
    const std::map<uint32_t, WorkerTiming>& workers, const BatchOptions& options) {
  std::vector<std::pair<uint32_t, WorkerTiming>> v(workers.begin(), workers.end());
  std::vector<uint32_t> sizes;
  if (absl::Status s = RebalanceInto(v, options, &sizes); !s.ok()) return s;
  std::map<uint32_t, uint32_t> out;
  for (size_t k = 0; k < v.size(); ++k) out.emplace_hint(out.end(), v[k].first, sizes[k]);
  return out;
}

std::optional<Kind> ParseKind(const std::string& name) {
  if (name == "fixed") return Kind::kFixed;
  if (name == "adaptive-batch") return Kind::kAdaptiveBatch;
  if (name == "pacer") return Kind::kPacer;
  return std::nullopt;
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kFixed: return "fixed";
    case Kind::kAdaptiveBatch: return "adaptive-batch";
    case Kind::kPacer: return "pacer";
  }
  return "?";
}

StragglerPolicy::StragglerPolicy(const PolicyOptions& options,
                                 std::unique_ptr<SpeedPredictor> predictor)
    : options_(options),
      batch_(options.batch),
      predictor_(predictor ? std::move(predictor)
                           : std::make_unique<EwmaTrendPredictor>(0.5, 0.3, options.level_shift)) {}

Assignment StragglerPolicy::Default() const {
  Assignment a;
  if (options_.mode == wire::Mode::Ssp || options_.mode == wire::Mode::Dssp) {
    a.staleness = options_.staleness;
  }
  if (options_.mode == wire::Mode::Dssp && (options_.kind != Kind::kPacer || slack_open_)) {
    a.staleness_range = options_.staleness_range;
  }
  return a;
}

Assignment StragglerPolicy::assignment(uint32_t worker) const {
  auto it = assignments_.find(worker);
  return it == assignments_.end() ? Assignment{} : it->second;
}

void StragglerPolicy::Redistribute(const std::map<uint32_t, double>& targets) {
  if (targets.empty()) return;
  std::vector<Entry> e;
  uint64_t lo_sum = 0, hi_sum = 0;
  for (const auto& [id, target] : targets) {
    uint32_t hi = batch_.b_max;
    const uint32_t limit = slots_.at(id).memory_limit;
    if (limit > 0) hi = std::min(hi, limit);
    e.push_back({id, std::min(batch_.b_min, hi), hi, std::max(target, 1e-9), 0});
    lo_sum += e.back().lo;
    hi_sum += hi;
  }
  if (lo_sum > batch_.global_batch || hi_sum < batch_.global_batch) {
    spdlog::warn("policy: {} workers with batch limits [{}, {}] in all cannot hold the global "
                 "batch {}; the sizes will not add up to it",
                 targets.size(), lo_sum, hi_sum, batch_.global_batch);
  }
  Distribute(e, batch_.global_batch);
  for (const auto& x : e) assignments_[x.id].batch = std::max<uint32_t>(1, x.size);
}

void StragglerPolicy::SetGlobalBatch(uint32_t global_batch) {
  batch_.global_batch = std::max<uint32_t>(1, global_batch);
}

void StragglerPolicy::Restore(const std::map<uint32_t, Assignment>& saved, bool slack_open) {
  for (const auto& [id, a] : saved) {
    auto it = assignments_.find(id);
    if (it != assignments_.end() && a.batch > 0) it->second = a;
  }
  slack_open_ = slack_open;
}

void StragglerPolicy::SetWorkers(const std::vector<uint32_t>& ids) {
  std::map<uint32_t, double> targets;
  const double even = static_cast<double>(batch_.global_batch) /
                      static_cast<double>(std::max<size_t>(1, ids.size()));
  bool changed = ids.size() != assignments_.size();
  for (uint32_t id : ids) {
    auto it = assignments_.find(id);
    if (it == assignments_.end() || options_.kind == Kind::kFixed) {
      changed |= it == assignments_.end();
      targets[id] = even;
    } else {
      targets[id] = it->second.batch;
    }
  }
  if (!changed) return;
  for (auto it = assignments_.begin(); it != assignments_.end();) {
    if (!targets.count(it->first)) {
      predictor_->Forget(it->first);
      slots_.erase(it->first);
      it = assignments_.erase(it);
    } else {
      ++it;
    }
  }
  for (const auto& [id, t] : targets) {
    if (!assignments_.count(id)) {
      assignments_[id] = Default();
      slots_[id] = Slot{};
    }
  }
  Redistribute(targets);
}

void StragglerPolicy::Report(uint32_t worker, const TimingReport& r) {
  auto it = slots_.find(worker);
  if (it == slots_.end()) return;
  Slot& slot = it->second;
  if (r.memory_limit_batch > 0 && r.memory_limit_batch != slot.memory_limit) {
    slot.memory_limit = r.memory_limit_batch;
    // A worker whose batch no longer fits is cut down at once, whatever the
    // policy; the others take up the difference.
    if (assignments_.at(worker).batch > slot.memory_limit) {
      std::map<uint32_t, double> targets;
      for (const auto& [id, a] : assignments_) targets[id] = a.batch;
      Redistribute(targets);
    }
  }
  if (r.at != TimePoint{} && r.clock >= slot.clock) {
    slot.clock = r.clock;
    slot.clock_at = r.at;
  }
  if (r.iterations == 0) return;
  TimingReport& p = slot.pending;
  if (options_.kind != Kind::kFixed && r.samples > 0) {
    const std::optional<double> predicted = predictor_->Predict(worker);
    const double x = r.compute_seconds / static_cast<double>(r.samples);
    // Per-sample time moves with the batch when part of an iteration's
    // compute is fixed: right after a resize, a jump is not news.
    const double batch = static_cast<double>(r.samples) / r.iterations;
    const bool same_batch =
        slot.observed_batch <= 0 || std::abs(batch / slot.observed_batch - 1) <= 0.25;
    if (predicted && same_batch && IsLevelShift(x, *predicted, options_.level_shift)) {
      urgent_ = true;
      // What came before the shift would water it down: the round acts on
      // this report alone.
      p = TimingReport{};
    }
  }
  p += r;
}

bool StragglerPolicy::SetBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range) {
  auto it = assignments_.find(worker);
  if (it == assignments_.end()) return false;
  it->second.staleness = staleness;
  it->second.staleness_range = staleness_range;
  slots_.at(worker).pinned_bounds = true;  // pacer's slack no longer moves them
  return true;
}

bool StragglerPolicy::Round(TimePoint now) {
  if (options_.kind == Kind::kFixed || assignments_.empty()) return false;
  bool urgent = urgent_;
  // A worker with no prediction and nothing fresh (one that just joined)
  // cannot be sized yet: the urgent round waits for it like a normal one.
  for (const auto& [id, slot] : slots_) {
    if (urgent && slot.pending.iterations == 0 && !predictor_->Predict(id)) urgent = false;
  }
  if (!urgent) {
    if (last_round_ && now - *last_round_ < options_.interval) return false;
    for (const auto& [id, slot] : slots_) {
      if (slot.pending.iterations < std::max<uint32_t>(1, options_.min_iterations)) return false;
    }
  }
  const auto started = std::chrono::steady_clock::now();
  last_round_ = now;
  urgent_ = false;
  ++rounds_;
  // slots_ and assignments_ hold the same keys: walk them together.
  timings_.clear();
  timings_.reserve(slots_.size());
  double max_time = 0, sum_time = 0;
  size_t measured = 0;
  auto a = assignments_.begin();
  for (auto& [id, slot] : slots_) {
    TimingReport& p = slot.pending;
    // In an urgent round a worker with nothing new keeps its prediction.
    if (p.iterations > 0) {
      predictor_->Observe(
          id, p.compute_seconds / static_cast<double>(std::max<uint64_t>(1, p.samples)), now);
      slot.communication = p.communication_seconds / p.iterations;
      slot.observed_batch = static_cast<double>(p.samples) / p.iterations;
      slot.measured = (p.compute_seconds + p.communication_seconds) / p.iterations;
      slot.period = (p.compute_seconds + p.communication_seconds + p.wait_seconds) / p.iterations;
    }
    // The imbalance counts every worker's latest measurement (in an urgent
    // round most are from earlier).
    if (slot.measured > 0) {
      max_time = std::max(max_time, slot.measured);
      sum_time += slot.measured;
      ++measured;
    }
    WorkerTiming t;
    t.batch = a->second.batch;
    t.seconds_per_sample = predictor_->Predict(id).value_or(0);
    t.communication_seconds = slot.communication;
    t.memory_limit_batch = slot.memory_limit;
    timings_.emplace_back(id, t);
    p = TimingReport{};
    ++a;
  }
  if (options_.kind == Kind::kPacer && options_.mode == wire::Mode::Dssp &&
      options_.catch_up_iterations > 0) {
    // Each worker's clock now, extrapolated from its last report.
    lags_.clear();
    median_.clear();
    for (const auto& [id, slot] : slots_) {
      double c = -1;  // not known
      if (slot.clock_at != TimePoint{} && slot.period > 0) {
        c = static_cast<double>(slot.clock) +
            std::max(0.0, ToSeconds(now - slot.clock_at)) / slot.period;
        median_.push_back(c);
      }
      lags_.push_back(c);
    }
    // The reference is the (lower) median worker, not the one furthest
    // ahead: sizing most workers down against one outlier would hand it the
    // rest of B.
    const size_t mid = median_.empty() ? 0 : (median_.size() - 1) / 2;
    if (median_.size() >= 2) {
      std::nth_element(median_.begin(), median_.begin() + static_cast<std::ptrdiff_t>(mid),
                       median_.end());
    }
    const double ahead = median_.size() >= 2 ? median_[mid] : -1;
    for (size_t k = 0; k < timings_.size() && ahead >= 0; ++k) {
      if (lags_[k] < 0) continue;
      const double lag = ahead - lags_[k];
      if (lag >= 2) {
        timings_[k].second.time_share =
            std::max(0.5, 1 - lag / static_cast<double>(options_.catch_up_iterations));
      }
    }
  }
  bool changed = false;
  if (absl::Status s = RebalanceInto(timings_, batch_, &sizes_); s.ok()) {
    size_t k = 0;
    for (auto& [id, assignment] : assignments_) {
      changed |= assignment.batch != sizes_[k];
      assignment.batch = sizes_[k++];
    }
  } else if (rounds_ == 1 || rounds_ % 100 == 0) {
    spdlog::warn("policy round {}: sizes kept: {}", rounds_, s.ToString());
  }
  const double mean_time = sum_time / static_cast<double>(std::max<size_t>(1, measured));
  last_imbalance_ = mean_time > 0 ? max_time / mean_time - 1 : 0;
  if (options_.kind == Kind::kPacer && options_.mode == wire::Mode::Dssp) {
    const bool open = slack_open_ ? last_imbalance_ >= options_.imbalance_close
                                  : last_imbalance_ > options_.imbalance_open;
    // A level-shift round may open the slack (the worker that slowed down is
    // already behind) but not close it: it sees most workers' times from
    // before earlier resizes.
    if (open != slack_open_ && (open || !urgent)) {
      slack_open_ = open;
      for (auto& [id, assignment] : assignments_) {
        if (slots_.at(id).pinned_bounds) continue;
        assignment.staleness_range = open ? options_.staleness_range : 0;
      }
      changed = true;
    }
  }
  last_decision_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return changed;
}

}  // namespace pacer::policy
