// The straggler policy: a pure library (no sockets, no clock of its own), so
// that the live monitor, unit tests and a cluster simulator run the same code.
//
// Semi-dynamic load balancing (LB-BSP, OmniLearn): between iterations each
// worker's batch is re-sized so that all workers finish together,
//   b_i' = b_i * tbar / t_i,
// with t_i worker i's predicted time per iteration and tbar their mean. As
// t_i = b_i * spp_i + comm_i, the rule's fixed point (all t_i equal, sizes
// adding up to B) is solved for directly, so one round gets there;
// changes inside a deadband are skipped, sizes are clamped to
// [b_min, min(b_max, the worker's memory limit)], and the sizes are rescaled
// so that sum(b_i) == B exactly: the global batch stays fixed.
//
// StragglerPolicy below wraps the rule, a speed predictor and the staleness
// bounds into the three policies the monitor runs: `fixed`, `adaptive-batch`
// and `pacer` (adaptive batch + DSSP), fed by the workers' timing reports.
#ifndef PACER_MONITOR_POLICY_H_
#define PACER_MONITOR_POLICY_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/clock.h"
#include "ps/wire.h"

namespace pacer::policy {

// Whether a measured time x is off a predicted one by more than a factor
// (1 + shift), either way: a level shift (a burst of load starting or
// ending) rather than noise. Never with shift <= 0.
inline bool IsLevelShift(double x, double predicted, double shift) {
  return shift > 0 && (x > predicted * (1 + shift) || x * (1 + shift) < predicted);
}

// Predicts a worker's next time per sample from what it reported. Implement
// this to plug in a better predictor.
class SpeedPredictor {
 public:
  virtual ~SpeedPredictor() = default;
  // One measurement: seconds of compute per sample, taken at `at`.
  virtual void Observe(uint32_t worker, double seconds_per_sample, TimePoint at) = 0;
  // The predicted seconds per sample for the next iteration; nullopt before
  // the first observation.
  virtual std::optional<double> Predict(uint32_t worker) const = 0;
  // Drops what is known of a worker that left.
  virtual void Forget(uint32_t worker) = 0;
};

// Holt's linear (EWMA with trend) smoothing per worker:
//   level' = a*x + (1-a)*(level + trend),  trend' = b*(level' - level) + (1-b)*trend,
// prediction = level + trend (never below half the level).
// Holt's trend follows drift; a step (a burst of load starting or ending)
// would take it several observations to follow and then overshoot. So an
// observation off the prediction by more than a factor (1 + shift) is taken
// as a level shift: level = x, trend = 0. shift <= 0 turns that off.
class EwmaTrendPredictor final : public SpeedPredictor {
 public:
  explicit EwmaTrendPredictor(double alpha = 0.5, double beta = 0.3, double shift = 1.0)
      : alpha_(alpha), beta_(beta), shift_(shift) {}
  void Observe(uint32_t worker, double seconds_per_sample, TimePoint at) override;
  std::optional<double> Predict(uint32_t worker) const override;
  void Forget(uint32_t worker) override { state_.erase(worker); }

 private:
  struct State {
    double level = 0;
    double trend = 0;
    int observations = 0;
    // A falling trend must not predict zero or negative time.
    double Prediction() const { return std::max(level + trend, 0.5 * level); }
  };
  const double alpha_;
  const double beta_;
  const double shift_;
  std::map<uint32_t, State> state_;
};

struct BatchOptions {
  // B: the global batch; the sizes always add up to it.
  uint32_t global_batch = 192;
  // Clamps for every worker; a worker's own memory limit may lower b_max.
  uint32_t b_min = 1;
  uint32_t b_max = 1 << 20;
  // A relative change of at most this much is skipped (keeps sizes steady
  // under measurement noise).
  double deadband = 0.05;
};

// What the policy knows of one worker for one round.
struct WorkerTiming {
  uint32_t batch = 0;                  // current b_i
  double seconds_per_sample = 0;       // predicted compute time per sample
  double communication_seconds = 0;    // per iteration, independent of b_i
  uint32_t memory_limit_batch = 0;     // largest batch that fits; 0: no limit
  // The share of the common iteration time this worker should take: below
  // 1 for one that fell behind (DSSP lets it) and has to catch up.
  double time_share = 1;
};

// The next batch sizes. Sizes respect the clamps and add up to
// options.global_batch exactly. InvalidArgument when that is impossible
// (sum of the lower clamps above B, or of the upper clamps below B) or when
// `workers` is empty.
absl::StatusOr<std::map<uint32_t, uint32_t>> RebalanceBatches(
    const std::map<uint32_t, WorkerTiming>& workers, const BatchOptions& options);
// The same rule on a vector: (*sizes)[i] is the new size of workers[i].
absl::Status RebalanceInto(std::span<const std::pair<uint32_t, WorkerTiming>> workers,
                           const BatchOptions& options, std::vector<uint32_t>* sizes);

enum class Kind { kFixed, kAdaptiveBatch, kPacer };
// "fixed", "adaptive-batch", "pacer"; nullopt for anything else.
std::optional<Kind> ParseKind(const std::string& name);
const char* KindName(Kind kind);

// What the policy sets for one worker.
struct Assignment {
  uint32_t batch = 0;
  uint32_t staleness = 0;        // s (ssp) or s_L (dssp); 0 otherwise
  uint32_t staleness_range = 0;  // r_max (dssp); 0 otherwise
  bool operator==(const Assignment&) const = default;
};

// One worker's timing report: totals over `iterations` iterations.
struct TimingReport {
  uint32_t iterations = 0;
  uint64_t samples = 0;
  double compute_seconds = 0;
  double communication_seconds = 0;
  double wait_seconds = 0;
  uint32_t memory_limit_batch = 0;  // 0: no limit
  // Where the worker was when it reported: the clock it reads next, and
  // when (0 / epoch: not known). Lets the policy see who fell behind.
  uint64_t clock = 0;
  TimePoint at{};
  // Adds another report's totals (clock, at and memory limit untouched).
  TimingReport& operator+=(const TimingReport& r) {
    iterations += r.iterations;
    samples += r.samples;
    compute_seconds += r.compute_seconds;
    communication_seconds += r.communication_seconds;
    wait_seconds += r.wait_seconds;
    return *this;
  }
};

struct PolicyOptions {
  // pacer-monitor defaults to kPacer (with mode dssp); the library to kFixed.
  Kind kind = Kind::kFixed;
  // The job's consistency mode: decides which bounds are set.
  wire::Mode mode = wire::Mode::Bsp;
  BatchOptions batch;
  // s for ssp, s_L for dssp.
  uint32_t staleness = 0;
  // r_max for dssp.
  uint32_t staleness_range = 0;
  // pacer: DSSP's slack (r_max above) is opened when the measured iteration
  // times are out of balance by more than `imbalance_open` (max over mean,
  // minus 1): a straggler the batch rule has not absorbed yet. Once the
  // sizes have caught up (imbalance below `imbalance_close`), r_max goes
  // back to 0 and steps stay fresh. The gap between the two keeps
  // measurement noise (about 10% per round on a busy machine) from
  // flapping it.
  double imbalance_open = 0.25;
  double imbalance_close = 0.10;
  // Time between two rounds of the batch rule.
  Duration interval = std::chrono::milliseconds(250);
  // A round needs at least this many fresh iterations from every worker.
  uint32_t min_iterations = 2;
  // A report whose compute time per sample is off the worker's prediction
  // by more than a factor (1 + level_shift) (a straggler starting or
  // ending) makes the next Round run at once, interval and min_iterations
  // notwithstanding; workers with nothing fresh keep their prediction.
  // Waiting out the interval would leave the others blocked on it (bsp) or
  // let it fall behind by more than DSSP's slack. <= 0: off.
  double level_shift = 1.0;
  // pacer over dssp: a worker `lag` clocks behind the median worker
  // (clocks extrapolated from their reports) is sized to take
  // max(0.5, 1 - lag / catch_up_iterations) of the common iteration time,
  // so that it closes the gap rather than trailing by it until the others
  // block on DSSP's bound. Lags under 2 clocks are left alone. 0: off.
  uint32_t catch_up_iterations = 16;
};

// The straggler policy of one job. Single-threaded; time comes from the
// caller (`now`), so tests drive it with a fake clock.
class StragglerPolicy {
 public:
  StragglerPolicy(const PolicyOptions& options,
                  std::unique_ptr<SpeedPredictor> predictor = nullptr);

  // Sets the live workers. New ones get an even share, departed ones are
  // forgotten, and the sizes are redistributed so that they add up to B.
  void SetWorkers(const std::vector<uint32_t>& ids);
  // Accumulates a report from `worker` (ignored for unknown workers).
  void Report(uint32_t worker, const TimingReport& report);
  // Runs a round of the batch rule when one is due (adaptive-batch, pacer)
  // and every worker reported enough since the last one, or at once after
  // a level shift (see PolicyOptions::level_shift). Returns true when some
  // assignment changed.
  bool Round(TimePoint now);
  // Whether a report since the last round was a level shift: the next
  // Round runs whatever the time.
  bool urgent() const { return urgent_; }
  // Overrides one worker's bounds (an operator's decision; pacer's slack
  // leaves them alone from then on); false for an unknown worker.
  bool SetBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range);

  // Changes B (the monitor's --rescale-batch, as workers come and go); the
  // next SetWorkers or Round spreads the new total.
  void SetGlobalBatch(uint32_t global_batch);
  uint32_t global_batch() const { return batch_.global_batch; }

  // A restarted monitor's saved decisions: the assignments of workers
  // already set by SetWorkers are put back as they were, and the DSSP
  // slack's state. Speeds are measured afresh.
  void Restore(const std::map<uint32_t, Assignment>& saved, bool slack_open);

  const std::map<uint32_t, Assignment>& assignments() const { return assignments_; }
  Assignment assignment(uint32_t worker) const;
  // The last predicted seconds per sample of a worker (nullopt: none yet).
  std::optional<double> predicted_seconds_per_sample(uint32_t worker) const {
    return predictor_->Predict(worker);
  }
  // pacer: whether DSSP's slack is open (see PolicyOptions::imbalance), and
  // the imbalance measured in the last round.
  bool slack_open() const { return slack_open_; }
  double last_imbalance() const { return last_imbalance_; }
  // Seconds the last Round spent deciding (for the simulator and metrics).
  double last_decision_seconds() const { return last_decision_seconds_; }
  uint64_t rounds() const { return rounds_; }
  const PolicyOptions& options() const { return options_; }

 private:
  Assignment Default() const;
  // Spreads B over the current targets (exact sum, within the clamps).
  void Redistribute(const std::map<uint32_t, double>& targets);

  struct Slot {
    TimingReport pending;       // since the last round
    double communication = 0;   // per iteration, as last measured
    double observed_batch = 0;  // mean batch of the last window observed
    double measured = 0;        // time per iteration, waiting excluded, as last measured
    double period = 0;          // time per iteration, waiting included, as last measured
    uint64_t clock = 0;         // from the latest report with a time
    TimePoint clock_at{};
    uint32_t memory_limit = 0;  // 0: none reported
    bool pinned_bounds = false; // set by SetBounds
  };

  const PolicyOptions options_;
  BatchOptions batch_;  // options_.batch, with B changed by SetGlobalBatch
  std::unique_ptr<SpeedPredictor> predictor_;
  // The same keys in both: the live workers.
  std::map<uint32_t, Assignment> assignments_;
  std::map<uint32_t, Slot> slots_;
  // Scratch of Round, kept to avoid allocations.
  std::vector<std::pair<uint32_t, WorkerTiming>> timings_;
  std::vector<uint32_t> sizes_;
  std::vector<double> lags_, median_;
  std::optional<TimePoint> last_round_;
  double last_decision_seconds_ = 0;
  uint64_t rounds_ = 0;
  bool urgent_ = false;
  bool slack_open_ = true;
  double last_imbalance_ = 0;
};

}  // namespace pacer::policy

#endif  // PACER_MONITOR_POLICY_H_
