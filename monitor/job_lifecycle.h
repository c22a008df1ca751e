// The job's life: waiting for its shards and workers, running, stopped (and
// the grace after it), when it started, and what ends it: a time cap, a
// target accuracy, the last epoch of the data stream (after a final
// evaluation), every worker finished, or every worker that came refused
// before the job could run (a failure). It also keeps the test accuracy
// the evaluator reports. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_JOB_LIFECYCLE_H_
#define PACER_MONITOR_JOB_LIFECYCLE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "monitor/data_feed.h"
#include "monitor/journal.h"
#include "monitor/membership.h"
#include "monitor/monitor_metrics.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

class JobLifecycle {
 public:
  struct Options {
    uint32_t epochs = 0;
    double time_cap_seconds = 0;
    float target_accuracy = 0;
    Duration stop_grace = std::chrono::seconds(2);
    uint32_t min_workers = 1;
    // How long every worker must have been refused (and none be left)
    // before the job stops for it: a correct worker may yet come.
    Duration refused_grace = std::chrono::seconds(3);
  };
  JobLifecycle(const Options& options, const Clock* clock, Membership* members,
               const DataFeed* data, Journal* journal, MonitorMetrics* metrics)
      : options_(options), clock_(clock), members_(members), data_(data), journal_(journal),
        metrics_(metrics) {}

  wire::JobState state() const { return state_; }
  bool running() const { return state_ == wire::JobState::Running; }
  bool stopped() const { return state_ == wire::JobState::Stopped; }
  const std::string& stop_reason() const { return stop_reason_; }
  // Whether it stopped as a failure: every worker was refused.
  bool failed() const { return failed_; }
  std::optional<double> seconds_running() const;
  std::optional<TimePoint> started_at() const { return started_at_; }
  // True once the job stopped and the grace period has passed.
  bool finished() const;

  // Every shard took the model and the membership: the job runs.
  void Run();
  // The job stops (false: it had already).
  bool Stop(const std::string& reason);
  // Why it should stop now (nullopt: not yet). While it runs: a cap, the
  // data stream's last epoch (which first holds the workers for a final
  // evaluation), every worker finished. Before it runs: as many workers as
  // it needs (--min-workers) were refused, none was taken and, for
  // refused_grace, none was left to declare, so nothing will train: it
  // stops as a failure.
  std::optional<std::string> DueStop();

  // A worker's model declaration was taken, or a live worker's refused
  // (for `reason`; once per worker: it leaves the membership).
  void OnDeclarationTaken() { taken_ = true; }
  void OnRefused(const std::string& reason);

  // The evaluator's report; why the job stops because of it (nullopt: it
  // goes on).
  std::optional<std::string> OnAccuracy(const msg::AccuracyReport& a);
  // The final evaluation asked of the evaluator (0: none).
  uint64_t final_evaluation() const { return final_eval_; }
  std::optional<double> last_accuracy() const { return last_accuracy_; }
  std::optional<double> time_to_target() const { return time_to_target_; }
  // The accuracy whose first crossing is timed (quickstart: 0.85).
  void set_report_threshold(double t) { report_threshold_ = t; }

  // Its part of the monitor's saved state. A stopped job resumes (running
  // if its map was built).
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r);

 private:
  static constexpr Duration kFinalEvaluationWait = std::chrono::seconds(10);

  const Options options_;
  const Clock* const clock_;
  Membership* const members_;
  const DataFeed* const data_;
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  wire::JobState state_ = wire::JobState::Waiting;
  std::string stop_reason_;
  std::optional<TimePoint> started_at_;
  TimePoint stopped_at_{};
  // The data stream with --epochs: once the last epoch is trained the
  // workers are held and the evaluator asked for a final evaluation (this
  // number; 0: not asked yet); the job stops when it comes, or after
  // kFinalEvaluationWait.
  uint64_t final_eval_ = 0;
  TimePoint final_eval_since_{};
  // An evaluation came from a runtime's own loop (not a program's report):
  // only such an evaluator answers evaluate_now.
  bool scheduled_evaluator_ = false;
  std::optional<double> last_accuracy_;
  std::optional<double> time_to_target_;
  double report_threshold_ = 0.85;
  // Declarations: whether any was taken; how many were refused, the last why.
  bool taken_ = false;
  uint32_t refused_ = 0;
  std::string last_refusal_;
  std::optional<TimePoint> all_refused_since_;
  bool failed_ = false;
};

}  // namespace pacer

#endif  // PACER_MONITOR_JOB_LIFECYCLE_H_
