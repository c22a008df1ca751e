// The straggler policy: a pure library (no sockets, no clock of its own), so
// that the live monitor, unit tests and a cluster simulator run the same code.
//
// Semi-dynamic load balancing (LB-BSP, OmniLearn): between iterations each
// worker's batch is re-sized so that all workers finish together,
//   b_i' = b_i * tbar / t_i,
// with t_i worker i's predicted time per iteration and tbar their mean;
// changes inside a deadband are skipped, sizes are clamped to
// [b_min, min(b_max, the worker's memory limit)], and the sizes are rescaled
// so that sum(b_i) == B exactly: the global batch stays fixed.
//
// Status: the batch-size rule and the speed predictor. Wiring into the
// monitor, staleness bounds (SSP/DSSP) and the policies `fixed`,
// `adaptive-batch` and `pacer` come next (issue 3).
#ifndef PACER_MONITOR_POLICY_H_
#define PACER_MONITOR_POLICY_H_

#include <cstdint>
#include <map>
#include <optional>

#include "absl/status/statusor.h"
#include "ps/clock.h"

namespace pacer::policy {

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
// prediction = level + trend (never below a small positive floor).
class EwmaTrendPredictor final : public SpeedPredictor {
 public:
  explicit EwmaTrendPredictor(double alpha = 0.5, double beta = 0.3)
      : alpha_(alpha), beta_(beta) {}
  void Observe(uint32_t worker, double seconds_per_sample, TimePoint at) override;
  std::optional<double> Predict(uint32_t worker) const override;
  void Forget(uint32_t worker) override { state_.erase(worker); }

 private:
  struct State {
    double level = 0;
    double trend = 0;
    int observations = 0;
  };
  const double alpha_;
  const double beta_;
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
};

// The next batch sizes. Sizes respect the clamps and add up to
// options.global_batch exactly. InvalidArgument when that is impossible
// (sum of the lower clamps above B, or of the upper clamps below B) or when
// `workers` is empty.
absl::StatusOr<std::map<uint32_t, uint32_t>> RebalanceBatches(
    const std::map<uint32_t, WorkerTiming>& workers, const BatchOptions& options);

}  // namespace pacer::policy

#endif  // PACER_MONITOR_POLICY_H_
