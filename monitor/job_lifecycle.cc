#include "monitor/job_lifecycle.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace pacer {

std::optional<double> JobLifecycle::seconds_running() const {
  if (!started_at_) return std::nullopt;
  return ToSeconds(clock_->Now() - *started_at_);
}

bool JobLifecycle::finished() const {
  return stopped() && clock_->Now() >= stopped_at_ + options_.stop_grace;
}

void JobLifecycle::Run() {
  state_ = wire::JobState::Running;
  started_at_ = clock_->Now();
  journal_->Mark();
}

bool JobLifecycle::Stop(const std::string& reason) {
  if (stopped()) return false;
  state_ = wire::JobState::Stopped;
  stop_reason_ = reason;
  journal_->Mark();
  stopped_at_ = clock_->Now();
  spdlog::info("stopping the job: {}", reason);
  return true;
}

void JobLifecycle::OnRefused(const std::string& reason) {
  ++refused_;
  last_refusal_ = reason;
}

std::optional<std::string> JobLifecycle::DueStop() {
  const bool all_refused = state_ == wire::JobState::Waiting && !taken_ &&
                           refused_ >= std::max<uint32_t>(1, options_.min_workers) &&
                           members_->LiveWorkers().empty();
  if (!all_refused) {
    all_refused_since_.reset();
  } else if (!all_refused_since_) {
    all_refused_since_ = clock_->Now();
  } else if (clock_->Now() - *all_refused_since_ >= options_.refused_grace) {
    failed_ = true;
    return fmt::format("every worker was refused ({} worker(s); the last: {})", refused_,
                       last_refusal_);
  }
  if (!running()) return std::nullopt;
  const TimePoint now = clock_->Now();
  if (options_.time_cap_seconds > 0 && ToSeconds(now - *started_at_) >= options_.time_cap_seconds) {
    return fmt::format("time cap of {:g} s reached", options_.time_cap_seconds);
  }
  if (data_->finished()) {
    const std::string reason =
        fmt::format("{} epoch(s) over the training set done", options_.epochs);
    if (!scheduled_evaluator_ || members_->Evaluator() == 0) {
      return reason;  // no evaluator on a schedule of its own: none to wait for
    }
    if (final_eval_ == 0) {
      // Hold the workers and have the final model evaluated first. A
      // number the evaluator has not answered yet, also after a monitor
      // restart (the membership version only goes up).
      final_eval_ = std::max<uint64_t>(1, members_->version());
      final_eval_since_ = now;
      members_->Hold();
      spdlog::info("{}: the workers are held for a final evaluation", reason);
    } else if (now - final_eval_since_ >= kFinalEvaluationWait) {
      spdlog::warn("no final evaluation came in {:.0f} s; stopping without it",
                   ToSeconds(kFinalEvaluationWait));
      return reason;
    }
    return std::nullopt;
  }
  // (Not while a resumed job waits for its new workers.)
  if (members_->AnyDone() && members_->LiveWorkers().empty() && !members_->awaiting_workers()) {
    return "all workers finished";
  }
  return std::nullopt;
}

std::optional<std::string> JobLifecycle::OnAccuracy(const msg::AccuracyReport& a) {
  last_accuracy_ = a.accuracy;
  scheduled_evaluator_ |= a.scheduled;
  metrics_->ShowEvaluation(a.accuracy, a.loss);
  metrics_->accuracy_reports->Increment();
  auto running_for = seconds_running();
  // The time schedule's line keeps its form; the clock schedule's names itself.
  const std::string every =
      a.every_clocks > 0 ? fmt::format(" (every {} clocks)", a.every_clocks) : "";
  spdlog::info("clock {}{}: test accuracy {:.4f}, loss {:.4f} ({} samples) after {:.2f} s",
               a.clock, every, a.accuracy, a.loss, a.samples, running_for.value_or(0));
  if (!time_to_target_ && a.accuracy >= report_threshold_ && running_for) {
    time_to_target_ = *running_for;
    spdlog::info("reached test accuracy {:.2f} after {:.2f} s", report_threshold_, *running_for);
  }
  if (!running()) return std::nullopt;
  if (options_.target_accuracy > 0 && a.accuracy >= options_.target_accuracy) {
    return fmt::format("target accuracy {:g} reached", options_.target_accuracy);
  }
  if (final_eval_ != 0 && a.request == final_eval_) {
    spdlog::info("final test accuracy after {} epoch(s): {:.4f}", options_.epochs, a.accuracy);
    return fmt::format("{} epoch(s) over the training set done", options_.epochs);
  }
  return std::nullopt;
}

void JobLifecycle::Save(MonitorRecord* r) const {
  r->state = state_;
  r->stop_reason = stop_reason_;
  r->seconds_running = seconds_running();
  r->saved_unix = UnixSeconds();
  if (last_accuracy_) r->last_accuracy = static_cast<float>(*last_accuracy_);
  r->time_to_target = time_to_target_;
}

void JobLifecycle::Restore(const MonitorRecord& r) {
  const TimePoint now = clock_->Now();
  state_ = r.state;
  stop_reason_ = r.stop_reason;
  if (r.seconds_running) {
    // The time it was down counts as running time (the time cap).
    const double down = std::max(0.0, UnixSeconds() - r.saved_unix);
    started_at_ = now - FromSeconds(*r.seconds_running + down);
  }
  if (r.last_accuracy) last_accuracy_ = *r.last_accuracy;
  if (r.time_to_target) time_to_target_ = r.time_to_target;
  if (stopped()) {
    spdlog::warn("job {} had stopped ({}); resuming it", r.job_id, stop_reason_);
    state_ = r.map_built ? wire::JobState::Running : wire::JobState::Waiting;
    stop_reason_.clear();
    if (r.map_built && !started_at_) started_at_ = now;
  }
}

}  // namespace pacer
