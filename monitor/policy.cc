#include "monitor/policy.h"

#include "spdlog/spdlog.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <vector>

namespace pacer::policy {

std::optional<double> FitFixedSamples(const CostSums& s, double max_samples) {
  if (s.n < 4 || s.relative_batch_variance() < 0.1 * 0.1) return std::nullopt;
  const double mb = s.b / s.n, mt = s.t / s.n;
  const double var = s.bb / s.n - mb * mb;
  const double cov = s.bt / s.n - mb * mt;
  if (var <= 0 || cov <= 0) return std::nullopt;
  const double slope = cov / var;
  const double intercept = mt - slope * mb;
  return std::clamp(intercept / slope, 0.0, std::max(0.0, max_samples));
}

bool TimingReport::Plausible() const {
  const double values[] = {compute_seconds, communication_seconds, wait_seconds, batch_squares,
                           batch_compute, min_compute, max_compute};
  for (double v : values) {
    if (!std::isfinite(v) || v < 0) return false;
  }
  if (min_compute > max_compute) return false;
  if (iterations > 0 && batch_squares > 0) {
    // Sum of b^2 over n iterations adding up to S lies in [S^2 / n, S^2].
    const double s = static_cast<double>(samples);
    if (batch_squares < s * s / iterations * (1 - 1e-9) || batch_squares > s * s * (1 + 1e-9)) {
      return false;
    }
  }
  return true;
}

const char* RoundReasonName(RoundReason reason) {
  switch (reason) {
    case RoundReason::kInterval: return "interval";
    case RoundReason::kLevelShift: return "level_shift";
    case RoundReason::kMembership: return "membership";
    case RoundReason::kMemoryLimit: return "memory_limit";
    case RoundReason::kCount: break;
  }
  return "?";
}

namespace {

// The fit weight (RefitFixedCost) that ends probing: about 40 iterations'
// worth at a 20% spread.
constexpr double kProbedWeight = 1.0;

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
    mean_time += w.fixed_seconds + w.batch * w.seconds_per_sample + w.communication_seconds;
  }
  if (lo_sum > options.global_batch || hi_sum < options.global_batch) {
    return absl::InvalidArgumentError("the clamps cannot add up to the global batch " +
                                      std::to_string(options.global_batch));
  }
  mean_time /= static_cast<double>(workers.size());
  // The rule b_i' = b_i * tbar / t_i settles where every t_i = a_i + b_i *
  // spp_i + comm_i is the same T. With the sizes adding up to B, and f_i =
  // a_i + comm_i, that fixed point is
  //   T = (B + sum f_i / spp_i) / sum 1 / spp_i,  b_i = (T - f_i) / spp_i,
  // so we aim there directly rather than iterate towards it (f does not
  // shrink with the batch, so plain iteration only creeps up on it).
  double inv_sum = 0, comm_sum = 0;
  bool measured = true;
  for (const auto& [id, w] : workers) {
    if (w.seconds_per_sample <= 0 || w.batch == 0) measured = false;
    if (w.seconds_per_sample > 0) {
      inv_sum += 1 / w.seconds_per_sample;
      comm_sum += (w.fixed_seconds + w.communication_seconds) / w.seconds_per_sample;
    }
  }
  const double time = measured ? (options.global_batch + comm_sum) / inv_sum : 0;
  size_t i = 0;
  for (const auto& [id, w] : workers) {
    double target;
    if (w.batch == 0) {
      target = static_cast<double>(options.global_batch) / workers.size();
    } else if (measured) {
      const double f = w.fixed_seconds + w.communication_seconds;
      target = std::max(0.0, time * w.time_share - f) / w.seconds_per_sample;
      if (w.time_share < 1) {
        target = std::max(target, w.min_share_of_target * std::max(0.0, time - f) /
                                      w.seconds_per_sample);
      }
    } else {
      const double t = w.fixed_seconds + w.batch * w.seconds_per_sample + w.communication_seconds;
      target = t > 0 ? w.batch * mean_time / t : w.batch;
    }
    // Damped, unless the target is more than twice or less than half the
    // size: no noise the cost model averages moves it that far.
    if (w.batch > 0 && target < 2.0 * w.batch && 2.0 * target > w.batch) {
      target = w.batch + std::clamp(w.step, 0.0, 1.0) * (target - w.batch);
    }
    target *= w.probe;
    // Deadband: small changes keep the current size.
    if (w.batch > 0 && std::abs(target - w.batch) <= options.deadband * w.batch) target = w.batch;
    e[i++].target = target > 1e-9 ? target : 1e-9;  // NaN too
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

StragglerPolicy::StragglerPolicy(const PolicyOptions& options, const Clock* timer)
    : options_(options),
      batch_(options.batch),
      fixed_samples_(std::max(0.0, options.fixed_cost_samples)),
      timer_(timer) {}

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
    e.push_back({id, std::min(batch_.b_min, hi), hi, target > 1e-9 ? target : 1e-9, 0});
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
  ++by_reason_[static_cast<size_t>(RoundReason::kMembership)];
  for (auto it = assignments_.begin(); it != assignments_.end();) {
    if (!targets.count(it->first)) {
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
      slots_[id].warmup_left = options_.warmup_reports;
    }
  }
  Redistribute(targets);
}

void StragglerPolicy::Absorb(Slot& slot, const TimingReport& r) {
  // Reports without a time (tests, old callers) count as a heartbeat apart.
  double dt = 0.1;
  if (r.at != TimePoint{} && slot.last_report != TimePoint{}) {
    dt = std::max(0.0, ToSeconds(r.at - slot.last_report));
  }
  if (slot.reported) slot.sums.Decay(std::exp(-dt / std::max(1e-3, options_.fit_seconds)));
  CostSums add;
  add.n = r.iterations;
  add.b = static_cast<double>(r.samples);
  add.t = r.compute_seconds;
  add.bb = r.batch_squares;
  add.bt = r.batch_compute;
  add.comm = r.communication_seconds;
  slot.sums += add;
  slot.iterations += r.iterations;
  if (r.at != TimePoint{}) slot.last_report = r.at;
  slot.reported = true;
}

WorkerCost StragglerPolicy::CostOf(const Slot& slot) const {
  WorkerCost c;
  const CostSums& s = slot.sums;
  c.spread = slot.spread;
  if (s.n <= 0) return c;
  // t = c * (k + b) with the pooled k: one parameter per worker, which
  // needs no spread in the worker's own batches, and never divides by a
  // small batch's time alone.
  const double per = s.b / s.n + fixed_samples_;
  c.per_sample_seconds = per > 0 ? (s.t / s.n) / per : 0;
  c.fixed_seconds = fixed_samples_ * c.per_sample_seconds;
  c.communication_seconds = s.comm / s.n;
  return c;
}

std::optional<WorkerCost> StragglerPolicy::cost(uint32_t worker) const {
  auto it = slots_.find(worker);
  if (it == slots_.end() || !it->second.reported) return std::nullopt;
  return CostOf(it->second);
}

void StragglerPolicy::RefitFixedCost() {
  // Each worker's own fit, weighted by what it rests on: the spread of its
  // batches against the size of its (multiplicative) noise, n var(b) /
  // (k + mean b)^2. The pooled value is their weighted median.
  std::vector<std::pair<double, double>> fits;  // (k, weight)
  double total = 0;
  const double max_k = 4.0 * batch_.global_batch / static_cast<double>(std::max<size_t>(1, slots_.size()));
  for (const auto& [id, slot] : slots_) {
    if (auto k = FitFixedSamples(slot.sums, max_k); k && std::isfinite(*k)) {
      const double mb = slot.sums.mean_batch();
      const double w = slot.sums.n * slot.sums.relative_batch_variance() * mb * mb /
                       ((fixed_samples_ + mb) * (fixed_samples_ + mb));
      fits.emplace_back(*k, w);
      total += w;
    }
  }
  if (fits.empty() || total <= 0) return;
  std::sort(fits.begin(), fits.end());
  double acc = 0, median = fits.back().first;
  for (const auto& [k, w] : fits) {
    acc += w;
    if (acc >= total / 2) {
      median = k;
      break;
    }
  }
  // The fixed cost is the model's, not the moment's: a running mean over
  // every round's fit, weighted by what each rests on, with a long memory
  // (a round's weight halves in about 70 rounds). Noise moves a single
  // round's fit a long way; it does not move this.
  fit_weight_ = 0.99 * fit_weight_ + total;
  fixed_samples_ += (total / fit_weight_) * (median - fixed_samples_);
}

void StragglerPolicy::Report(uint32_t worker, const TimingReport& report) {
  auto it = slots_.find(worker);
  if (it == slots_.end()) return;
  Slot& slot = it->second;
  if (report.memory_limit_batch > 0 && report.memory_limit_batch != slot.memory_limit) {
    slot.memory_limit = report.memory_limit_batch;
    // A worker whose batch no longer fits is cut down at once, whatever the
    // policy; the others take up the difference.
    if (assignments_.at(worker).batch > slot.memory_limit) {
      std::map<uint32_t, double> targets;
      for (const auto& [id, a] : assignments_) targets[id] = a.batch;
      Redistribute(targets);
      ++by_reason_[static_cast<size_t>(RoundReason::kMemoryLimit)];
    }
  }
  if (report.at != TimePoint{} && report.clock >= slot.clock) {
    slot.clock = report.clock;
    slot.clock_at = report.at;
  }
  if (report.iterations == 0) return;
  if (!report.Plausible()) {
    if (implausible_++ < 3) {
      spdlog::warn("policy: worker {} reported timings that cannot be true (compute {} s, "
                   "communication {} s over {} iterations); ignored", worker,
                   report.compute_seconds, report.communication_seconds, report.iterations);
    }
    return;
  }
  const TimingReport r = report.Completed();
  if (slot.warmup_left > 0) {
    --slot.warmup_left;
    return;
  }
  slot.pending += r;
  auto flush_suspects = [&] {
    // Not confirmed: they were noise, data for the model and the spread.
    for (const TimingReport& s : slot.suspect) Absorb(slot, s);
    for (double learn : slot.suspect_learn) slot.spread += learn;
    slot.suspect.clear();
    slot.suspect_learn.clear();
    slot.suspect_sign = 0;
  };
  // Judged only where the iterations had much the same batch (the model's
  // prediction is for one batch; right after a resize, a jump is not news;
  // a sample or two more from the others' rounding is no resize).
  const double mean_batch = r.samples > 0 ? static_cast<double>(r.samples) / r.iterations : 0;
  const bool one_batch =
      mean_batch > 0 &&
      r.batch_squares / r.iterations - mean_batch * mean_batch <= 0.05 * 0.05 * mean_batch * mean_batch;
  if (options_.kind != Kind::kFixed && options_.level_shift > 0 && slot.reported &&
      slot.iterations >= options_.shift_min_iterations && one_batch && r.compute_seconds > 0) {
    const WorkerCost cost = CostOf(slot);  // judges this report and its streak alike
    const double predicted = cost.Compute(mean_batch) * r.iterations;
    if (predicted > 0) {
      const double off = std::log(r.compute_seconds / predicted);
      // Capped at the at-once factor: on a node whose spread grew large, a
      // real 4x straggler must still be able to become suspect. A worker
      // that got faster has a higher bar: until the next (damped) round it
      // costs only its own idle time, while one that slowed down holds up
      // everyone; and a noisy node's quick spells, against a model that
      // still remembers its slow ones, are the false shifts (1/0.66 in the
      // simulator at +-30%, where a recovered straggler is 4x).
      const double bar = std::log1p(off < 0 ? options_.level_shift_faster : options_.level_shift);
      const double threshold =
          std::min(std::max(bar, options_.shift_spreads * slot.spread),
                   std::max(bar, std::log1p(options_.level_shift_at_once)));
      // The spread learns from every report but those of a confirmed
      // shift: on a noisy node big deviations are the norm, and the bar
      // rises with them; a shift is not noise.
      const double learn = 0.05 * (std::min(std::abs(off), 1.0) - slot.spread);
      if (std::abs(off) > threshold) {
        const int sign = off > 0 ? 1 : -1;
        if (sign != slot.suspect_sign) flush_suspects();  // those were noise
        if (slot.suspect.empty()) slot.suspect_since = r.at;
        slot.suspect_learn.push_back(learn);
        slot.suspect_sign = sign;
        slot.suspect.push_back(r);
        // How long the streak has lasted: from the first suspect's report
        // to this one (reports without a time count 0.1 s each).
        const double lasted =
            r.at != TimePoint{} && slot.suspect_since != TimePoint{}
                ? ToSeconds(r.at - slot.suspect_since)
                : 0.1 * static_cast<double>(slot.suspect.size() - 1);
        spdlog::debug("policy: worker {} report off its model by {:+.0f}% (bar {:.0f}%, spread "
                      "{:.2f}), {} in a row over {:.2f} s", worker, 100 * std::expm1(off),
                      100 * std::expm1(threshold), slot.spread, slot.suspect.size(), lasted);
        const double per_iteration = predicted / r.iterations;
        const double every = sign > 0 ? std::log(r.min_compute / per_iteration)
                                      : std::log(r.max_compute / per_iteration);
        const double at_once_bar =
            std::max(std::log1p(options_.level_shift_at_once), 2 * threshold);
        const bool every_moved = r.iterations >= 2 && r.min_compute > 0 &&
                                 r.max_compute >= r.min_compute && sign * every > 0 &&
                                 std::abs(every) > at_once_bar;
        // The streak as one: its iterations, and how far off they are
        // together; and the same without its most extreme iteration, which
        // must still be suspect (one stall, however long, is no shift).
        uint64_t streak_iterations = 0;
        double streak_compute = 0, streak_predicted = 0;
        double extreme = 0, extreme_predicted = 0;
        for (const TimingReport& s : slot.suspect) {
          const double per = cost.Compute(static_cast<double>(s.samples) / s.iterations);
          streak_iterations += s.iterations;
          streak_compute += s.compute_seconds;
          streak_predicted += per * s.iterations;
          const double edge = sign > 0 ? s.max_compute : s.min_compute;
          if (edge > 0 && per > 0 &&
              (extreme == 0 ||
               sign * std::log(edge / per) > sign * std::log(extreme / extreme_predicted))) {
            extreme = edge;
            extreme_predicted = per;
          }
        }
        const double rest_compute = streak_compute - extreme;
        const double rest_predicted = streak_predicted - extreme_predicted;
        const bool heavy = options_.shift_iterations > 0 &&
                           streak_iterations >= options_.shift_iterations &&
                           streak_predicted > 0 && streak_compute > 0 &&
                           sign * std::log(streak_compute / streak_predicted) > at_once_bar &&
                           rest_predicted > 0 && rest_compute > 0 &&
                           sign * std::log(rest_compute / rest_predicted) > threshold;
        if (every_moved || heavy ||
            (slot.suspect.size() >= std::max<uint32_t>(1, options_.shift_reports) &&
             lasted >= options_.shift_seconds - 1e-9)) {
          // Confirmed: the worker's model restarts from the latest report
          // (the first may have straddled the shift); what came before
          // would water it down.
          slot.sums = CostSums{};
          slot.iterations = 0;
          slot.reported = false;
          const TimingReport latest = slot.suspect.back();
          slot.suspect.clear();
          slot.suspect_learn.clear();
          slot.suspect_sign = 0;
          Absorb(slot, latest);
          slot.shifted = true;
          urgent_ = true;
          ++level_shifts_;
        }
        return;
      }
      slot.spread += learn;
    }
  }
  flush_suspects();
  Absorb(slot, r);
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
  // A worker that never reported (one that just joined) cannot be sized
  // yet: the urgent round waits for it like a normal one.
  for (const auto& [id, slot] : slots_) {
    if (urgent && !slot.reported) urgent = false;
  }
  if (!urgent) {
    if (last_round_ && now - *last_round_ < options_.interval) return false;
    for (const auto& [id, slot] : slots_) {
      if (slot.pending.iterations < std::max<uint32_t>(1, options_.min_iterations)) return false;
    }
  }
  const TimePoint started = timer_->Now();
  last_round_ = now;
  urgent_ = false;
  ++rounds_;
  last_reason_ = urgent ? RoundReason::kLevelShift : RoundReason::kInterval;
  ++by_reason_[static_cast<size_t>(last_reason_)];
  // The fixed cost is fitted only from probed rounds: there the sizes moved
  // for reasons of the policy's own, uncorrelated with any worker's noise.
  // Sizes that follow a worker's measured speed move with its noise, and a
  // fit on them confuses the two (a slow spell, then a smaller batch, reads
  // as a fixed cost).
  if (probing_) RefitFixedCost();
  // slots_ and assignments_ hold the same keys: walk them together.
  timings_.clear();
  timings_.reserve(slots_.size());
  double max_time = 0, sum_time = 0;
  size_t measured = 0;
  auto a = assignments_.begin();
  for (auto& [id, slot] : slots_) {
    TimingReport& p = slot.pending;
    if (p.iterations > 0) {
      slot.period = (p.compute_seconds + p.communication_seconds + p.wait_seconds) / p.iterations;
    }
    WorkerTiming t;
    t.batch = a->second.batch;
    t.memory_limit_batch = slot.memory_limit;
    // The even share a worker starts with is no decision to hold on to:
    // its first sizing, like a confirmed shift, goes all the way.
    t.step = slot.shifted || !slot.sized ? 1.0 : options_.damping;
    // The times measured before a worker's first sizing are what that
    // sizing removes: the slack waits for it. (After a confirmed shift the
    // worker is already behind: the slack may open, as below.)
    if (!slot.sized) settle_rounds_ = kSlackSettleRounds;
    if (slot.reported) {
      slot.sized = true;
      const WorkerCost c = CostOf(slot);
      t.seconds_per_sample = c.per_sample_seconds;
      t.fixed_seconds = c.fixed_seconds;
      t.communication_seconds = c.communication_seconds;
      // The imbalance is the model's (smoothed) time at the batch the
      // worker ran, not one window's noisy measurement.
      const double batch = p.iterations > 0 ? static_cast<double>(p.samples) / p.iterations
                                            : static_cast<double>(t.batch);
      const double time = c.Compute(batch) + c.communication_seconds;
      if (time > 0) {
        max_time = std::max(max_time, time);
        sum_time += time;
        ++measured;
      }
    }
    timings_.emplace_back(id, t);
    p = TimingReport{};
    slot.shifted = false;
    ++a;
  }
  // Probing: until the fixed cost rests on enough spread, sizes go a
  // little above and below their targets, alternating, uncorrelated with
  // any worker's noise (a fit on the policy's own moves is not).
  probing_ = options_.probe > 0 && probe_round_ < 4 * std::max<uint32_t>(1, options_.probe_rounds) &&
             (probe_round_ < options_.probe_rounds || fit_weight_ < kProbedWeight);
  if (probing_) {
    // One worker alone cannot be probed (its size is B); the rounds count.
    for (size_t k = 0; k < timings_.size() && timings_.size() >= 2; ++k) {
      timings_[k].second.probe = 1 + ((k + probe_round_) % 2 ? options_.probe : -options_.probe);
    }
    ++probe_round_;
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
    // Lags DSSP's slack covers are left to it: noise makes small lags, and
    // sizing them away turns noise into batch swings.
    const double free_lag = std::max<double>(2, options_.staleness_range);
    for (size_t k = 0; k < timings_.size() && ahead >= 0; ++k) {
      if (lags_[k] < 0) continue;
      const double lag = ahead - lags_[k];
      if (lag > free_lag) {
        timings_[k].second.time_share =
            std::max(0.5, 1 - lag / static_cast<double>(options_.catch_up_iterations));
        timings_[k].second.min_share_of_target =
            lag > options_.staleness ? options_.catch_up_blocking_floor : options_.catch_up_floor;
      }
    }
  }
  bool changed = false;
  last_change_ = 0;
  if (absl::Status s = RebalanceInto(timings_, batch_, &sizes_); s.ok()) {
    size_t k = 0;
    for (auto& [id, assignment] : assignments_) {
      const uint32_t next = sizes_[k++];
      if (assignment.batch != next) {
        changed = true;
        last_change_ = std::max(last_change_, std::abs(static_cast<double>(next) - assignment.batch) /
                                                  std::max<uint32_t>(1, assignment.batch));
      }
      assignment.batch = next;
    }
  } else if (rounds_ == 1 || rounds_ % 100 == 0) {
    spdlog::warn("policy round {}: sizes kept: {}", rounds_, s.ToString());
  }
  const double mean_time = sum_time / static_cast<double>(std::max<size_t>(1, measured));
  last_imbalance_ = mean_time > 0 ? max_time / mean_time - 1 : 0;
  if (options_.kind == Kind::kPacer && options_.mode == wire::Mode::Dssp) {
    // The slack is for an imbalance the sizes have not absorbed. Right
    // after a worker's first sizing it waits (the new sizes are meant to
    // remove what was measured): opened then, it let the fast workers read
    // stale parameters in the first second of training, and a job with a
    // 4x straggler needed more steps than BSP to 0.85 (as many with no
    // slack; bench/RESULTS.md, "Stale reads cost steps").
    bool open = slack_open_;
    if (settle_rounds_ > 0) {
      --settle_rounds_;
    } else {
      open = slack_open_ ? last_imbalance_ >= options_.imbalance_close
                         : last_imbalance_ > options_.imbalance_open;
    }
    // A level-shift round may open the slack (the worker that slowed down is
    // already behind) but not close it.
    if (open != slack_open_ && (open || !urgent)) {
      slack_open_ = open;
      for (auto& [id, assignment] : assignments_) {
        if (slots_.at(id).pinned_bounds) continue;
        assignment.staleness_range = open ? options_.staleness_range : 0;
      }
      changed = true;
    }
  }
  last_decision_seconds_ = ToSeconds(timer_->Now() - started);
  return changed;
}

}  // namespace pacer::policy
