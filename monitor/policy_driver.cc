#include "monitor/policy_driver.h"

#include <cmath>
#include <map>

#include "ps/staleness.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// Interval rounds that moved a size are logged at most this often.
constexpr Duration kPolicyLogEvery = std::chrono::seconds(5);

}  // namespace

void PolicyDriver::Start() {
  const std::vector<uint32_t> live = members_->LiveWorkers();
  batch_per_worker_ = static_cast<double>(options_.policy.batch.global_batch) /
                      static_cast<double>(live.size());
  policy_.SetWorkers(live);
  ApplyAssignments();
}

bool PolicyDriver::ApplyAssignments() {
  bool bounds = false;
  for (const auto& [id, a] : policy_.assignments()) {
    WorkerState* w = members_->Find(id);
    if (w == nullptr) continue;
    bounds |= w->staleness != a.staleness || w->staleness_range != a.staleness_range;
    w->batch = a.batch;
    w->staleness = a.staleness;
    w->staleness_range = a.staleness_range;
    metrics_->ShowBatch(w->rank, a.batch);
  }
  return bounds;
}

void PolicyDriver::RescaleBatch(size_t live) {
  if (!options_.rescale_batch || batch_per_worker_ <= 0 || live == 0) return;
  const auto b = static_cast<uint32_t>(std::lround(batch_per_worker_ * static_cast<double>(live)));
  if (b != policy_.global_batch()) {
    spdlog::info("global batch {} -> {} ({} live workers)", policy_.global_batch(), b, live);
    policy_.SetGlobalBatch(b);
  }
}

void PolicyDriver::SetWorkers() {
  const std::vector<uint32_t> live = members_->LiveWorkers();
  RescaleBatch(live.size());
  policy_.SetWorkers(live);
  if (ApplyAssignments()) members_->Change("bounds", "staleness bounds changed");
}

bool PolicyDriver::SetBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range) {
  if (staleness + uint64_t{staleness_range} > kMaxStalenessBound) return false;
  if (!policy_.SetBounds(worker, staleness, staleness_range)) return false;
  if (ApplyAssignments()) {
    members_->Change("bounds", "staleness bounds of worker " + std::to_string(worker));
  }
  spdlog::info("worker {}: staleness bounds set to s={} r_max={}", worker, staleness,
               staleness_range);
  return true;
}

bool PolicyDriver::Report(const WorkerState& w, const msg::Heartbeat& hb) {
  // Every heartbeat reports where the worker is (its clock), even one
  // that finished no iteration: a straggler stuck in a long one must not
  // look as if it kept its old pace.
  policy::TimingReport r;
  r.iterations = hb.iterations;
  r.samples = uint64_t{hb.iterations} * hb.batch;
  r.compute_seconds = double{hb.compute_seconds_per_sample} * static_cast<double>(r.samples);
  if (hb.samples > 0 && hb.iterations > 0) {
    r.samples = hb.samples;
    r.compute_seconds = hb.compute_seconds;
    r.batch_squares = hb.batch_squares;
    r.batch_compute = hb.batch_compute;
    r.min_compute = hb.compute_min_seconds;
    r.max_compute = hb.compute_max_seconds;
  }
  r.communication_seconds = double{hb.communication_seconds} * hb.iterations;
  r.wait_seconds = double{hb.wait_seconds} * hb.iterations;
  r.memory_limit_batch = hb.memory_limit_batch;
  r.clock = hb.clock;
  r.at = w.last_seen;
  policy_.Report(w.id, r);
  // A worker whose speed just shifted gets its new size in this reply
  // rather than a heartbeat later.
  return policy_.urgent();
}

void PolicyDriver::Round(TimePoint now) {
  if (!policy_.Round(now)) return;
  const bool urgent = policy_.last_reason() == policy::RoundReason::kLevelShift;
  if (ApplyAssignments()) {
    members_->Change("bounds", policy_.slack_open() ? "dssp slack opened" : "dssp slack closed");
    spdlog::info("policy: iteration times {:.0f}% out of balance; dssp slack {}",
                 100 * policy_.last_imbalance(), policy_.slack_open() ? "open" : "closed");
  }
  metrics_->decisions->Increment();
  journal_->Mark();
  metrics_->ShowRounds(policy_);
  // Routine rounds (sizes moved within the deadband) go to debug: a calm
  // policy on a noisy node would otherwise log a line every 250 ms. Interval
  // rounds that moved a size are shown at most every kPolicyLogEvery (a
  // straggler at batch 1-3 moves by 100% for 2 samples); confirmed shifts
  // and membership rounds always.
  const bool moved = policy_.last_change() > options_.policy.batch.deadband;
  const bool routine = policy_.last_reason() == policy::RoundReason::kInterval;
  const bool notable = urgent || (moved && (!routine || now - logged_at_ >= kPolicyLogEvery));
  if (!notable) {
    unlogged_ += moved;
    if (!spdlog::should_log(spdlog::level::debug)) return;
  }
  std::string sizes, costs;
  for (const auto& [id, a] : policy_.assignments()) {
    sizes += fmt::format("{}{}:{}", sizes.empty() ? "" : " ", id, a.batch);
    if (auto c = policy_.cost(id)) {
      costs += fmt::format("{}{}:{:.2f}+{:.1f}", costs.empty() ? "" : " ", id,
                           1e3 * c->fixed_seconds, 1e6 * c->per_sample_seconds);
    }
  }
  const std::string since =
      notable && unlogged_ > 0
          ? fmt::format("; {} more that moved a size since the last line", unlogged_)
          : "";
  spdlog::log(notable ? spdlog::level::info : spdlog::level::debug,
              "policy round {} ({}; largest change {:.0f}%{}): batch sizes (worker:batch) {}; "
              "fitted compute (worker:fixed ms+us per sample) {}",
              policy_.rounds(),
              urgent ? "a worker's speed shift was confirmed"
                     : policy::RoundReasonName(policy_.last_reason()),
              100 * policy_.last_change(), since, sizes, costs.empty() ? "none yet" : costs);
  if (notable) {
    logged_at_ = now;
    unlogged_ = 0;
  }
}

std::string PolicyDriver::Summary() const {
  std::string reasons;
  for (size_t r = 0; r < static_cast<size_t>(policy::RoundReason::kCount); ++r) {
    const auto reason = static_cast<policy::RoundReason>(r);
    if (policy_.rounds(reason) == 0) continue;
    reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", policy::RoundReasonName(reason),
                           policy_.rounds(reason));
  }
  std::string sizes;
  for (const auto& [id, a] : policy_.assignments()) {
    sizes += fmt::format("{}{}:{}", sizes.empty() ? "" : " ", id, a.batch);
  }
  return fmt::format("{} policy: {} rounds{}; last batch sizes (worker:batch) {} of B = {}",
                     policy::KindName(options_.policy.kind), policy_.rounds(),
                     reasons.empty() ? "" : " (" + reasons + ")", sizes.empty() ? "none" : sizes,
                     policy_.global_batch());
}

void PolicyDriver::Save(MonitorRecord* r) const {
  r->slack_open = policy_.slack_open();
  r->batch_per_worker = batch_per_worker_;
}

void PolicyDriver::Restore(const MonitorRecord& r) {
  batch_per_worker_ = r.batch_per_worker;
  if (!r.map_built) return;
  std::map<uint32_t, policy::Assignment> saved;
  for (uint32_t id : members_->LiveWorkers()) {
    const WorkerState& w = members_->at(id);
    saved[id] = {w.batch, w.staleness, w.staleness_range};
  }
  const std::vector<uint32_t> live = members_->LiveWorkers();
  RescaleBatch(live.size());
  policy_.SetWorkers(live);
  policy_.Restore(saved, r.slack_open);
  ApplyAssignments();
}

}  // namespace pacer
