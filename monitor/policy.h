// The straggler policy: a pure library (no sockets, no clock of its own), so
// that the live monitor, unit tests and a cluster simulator run the same code.
//
// Semi-dynamic load balancing (LB-BSP, OmniLearn): between iterations each
// worker's batch is re-sized so that all workers finish together,
//   b_i' = b_i * tbar / t_i,
// with t_i worker i's predicted time per iteration and tbar their mean. As
// t_i = a_i + b_i * c_i + comm_i (a fixed compute cost, a per-sample one
// and communication), the rule's fixed point (all t_i equal, sizes adding
// up to B) is solved for directly; each round moves part of the way there
// (damping), changes inside a deadband are skipped, sizes are clamped to
// [b_min, min(b_max, the worker's memory limit)], and the sizes are rescaled
// so that sum(b_i) == B exactly: the global batch stays fixed.
//
// The costs a_i and c_i are fitted per worker from decayed sums of its
// per-iteration (batch, compute time) pairs; the ratio a / c (the fixed cost
// in samples) is pooled across workers, since they run the same model and
// a calm policy gives each worker's own fit too little spread in b. A
// report off the model by more than the noise is acted on only when later
// ones confirm it over a while (a level shift), so that a noisy node's
// single slow heartbeat moves nothing.
//
// StragglerPolicy below wraps the rule, the cost model and the staleness
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
#include "ps/base/clock.h"
#include "ps/base/wire.h"

namespace pacer::policy {

// pacer: rounds (the one that sized it included) in which DSSP's slack
// stays as it is after a worker's first sizing.
inline constexpr uint32_t kSlackSettleRounds = 2;

// What the policy knows of one worker's compute: an iteration at batch b
// takes fixed_seconds + b * per_sample_seconds of compute, plus
// communication_seconds of push and pull that do not depend on b.
struct WorkerCost {
  double fixed_seconds = 0;
  double per_sample_seconds = 0;
  double communication_seconds = 0;
  // The worker's own spread: the mean absolute log ratio of its recent
  // reports to what the model predicted for them.
  double spread = 0;
  // Predicted compute of one iteration at batch b.
  double Compute(double b) const { return fixed_seconds + b * per_sample_seconds; }
};

// Exponentially decayed sums of one worker's per-iteration (batch b,
// compute seconds t) pairs: what a least-squares fit of t = a + b c needs.
struct CostSums {
  double n = 0, b = 0, t = 0, bb = 0, bt = 0, comm = 0;
  void Decay(double factor) {
    n *= factor, b *= factor, t *= factor, bb *= factor, bt *= factor, comm *= factor;
  }
  CostSums& operator+=(const CostSums& o) {
    n += o.n, b += o.b, t += o.t, bb += o.bb, bt += o.bt, comm += o.comm;
    return *this;
  }
  double mean_batch() const { return n > 0 ? b / n : 0; }
  // Variance of b over its mean squared (0 when every batch was the same).
  double relative_batch_variance() const {
    if (n <= 0 || b <= 0) return 0;
    const double m = b / n;
    return std::max(0.0, bb / n - m * m) / (m * m);
  }
};

// The fixed cost of a worker in samples (a / c), fitted by least squares
// from its sums; nullopt when its batches did not vary enough (relative
// standard deviation under 10%: a calm policy's noise-sized moves are
// correlated with the noise itself) or the slope is not positive. Clamped to
// [0, max_samples].
std::optional<double> FitFixedSamples(const CostSums& s, double max_samples);

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
  // Compute per iteration that does not grow with the batch: the rule
  // equalises fixed + b * seconds_per_sample + communication.
  double fixed_seconds = 0;
  // How far to move towards the target in one round (1: all the way).
  double step = 1;
  // The target is multiplied by this after damping (probing the cost).
  double probe = 1;
  // Catch-up (time_share < 1) leaves at least this share of the batch the
  // worker would get at time_share 1.
  double min_share_of_target = 0;
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
  uint64_t samples = 0;  // sum of the iterations' batches
  double compute_seconds = 0;
  double communication_seconds = 0;
  double wait_seconds = 0;
  uint32_t memory_limit_batch = 0;  // 0: no limit
  // Where the worker was when it reported: the clock it reads next, and
  // when (0 / epoch: not known). Lets the policy see who fell behind.
  uint64_t clock = 0;
  TimePoint at{};
  // Over the same iterations: the sum of batch^2 and of batch x compute
  // seconds, so that a window that spans a resize is fitted right. 0 (an
  // older worker): taken as if every iteration had the mean batch.
  double batch_squares = 0;
  double batch_compute = 0;
  // The quickest and the slowest of these iterations' compute (seconds; 0:
  // not known). A straggler slows even the quickest; a descheduled
  // iteration, a noisy node's usual spike, only itself.
  double min_compute = 0;
  double max_compute = 0;
  // Adds another report's totals (clock, at and memory limit untouched).
  TimingReport& operator+=(const TimingReport& r) {
    const TimingReport a = Completed(), b = r.Completed();
    iterations += r.iterations;
    samples += r.samples;
    compute_seconds += r.compute_seconds;
    communication_seconds += r.communication_seconds;
    wait_seconds += r.wait_seconds;
    batch_squares = a.batch_squares + b.batch_squares;
    batch_compute = a.batch_compute + b.batch_compute;
    if (a.iterations == 0 || b.iterations == 0) {
      min_compute = a.iterations ? a.min_compute : b.min_compute;
      max_compute = a.iterations ? a.max_compute : b.max_compute;
    } else if (a.min_compute > 0 && b.min_compute > 0) {
      min_compute = std::min(a.min_compute, b.min_compute);
      max_compute = std::max(a.max_compute, b.max_compute);
    } else {
      min_compute = max_compute = 0;  // one side did not say
    }
    return *this;
  }
  // Whether the timings can be true: finite, not negative, the quickest
  // iteration no slower than the slowest, and the sums of squares within
  // what the batches allow. A report that is not is ignored (a peer that
  // lies must not poison every worker's size).
  bool Plausible() const;
  // This report with batch_squares and batch_compute filled in where they
  // were left 0.
  TimingReport Completed() const {
    TimingReport c = *this;
    if (iterations > 0 && samples > 0 && (batch_squares <= 0 || batch_compute <= 0)) {
      const double mean = static_cast<double>(samples) / iterations;
      c.batch_squares = mean * static_cast<double>(samples);
      c.batch_compute = mean * compute_seconds;
    }
    return c;
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
  // minus 1): a straggler the batch rule has not absorbed. Once the sizes
  // have caught up (imbalance below `imbalance_close`), r_max goes back to
  // 0 and steps stay fresh. The gap between the two keeps measurement
  // noise (rounds on a busy machine vary) from flapping it. It
  // starts closed, and for kSlackSettleRounds rounds after a worker's first
  // sizing it stays as it is.
  double imbalance_open = 0.25;
  double imbalance_close = 0.10;
  // Time between two rounds of the batch rule.
  Duration interval = std::chrono::milliseconds(250);
  // A round needs at least this many fresh iterations from every worker.
  uint32_t min_iterations = 2;
  // The cost model's memory: reports older by this many seconds weigh 1/e
  // of a fresh one. Longer averages more of a noisy node's ups and downs
  // away; a confirmed level shift (below) starts the worker afresh.
  double fit_seconds = 5.0;
  // A report whose compute is off the model's prediction for it by more
  // than a factor (1 + level_shift), and by more than `shift_spreads` times
  // the worker's own spread, either way, is suspect; `shift_reports` such
  // reports in a row, off the same way, are a confirmed level shift (a
  // straggler starting or ending): the worker's model restarts from them
  // and a round runs at once, interval and min_iterations notwithstanding,
  // which moves that worker all the way to its new size. A single suspect
  // report changes nothing, and neither does a streak shorter than
  // `shift_seconds` (a noisy node's bursts: a descheduled iteration, a
  // co-located job's busy slice). Only a report of at least two iterations
  // of which even the quickest (slowest) was off by more than a factor
  // (1 + level_shift_at_once) and by twice the bar is confirmed at once:
  // every iteration moved, not one. So is a streak of suspects that holds
  // at least `shift_iterations` iterations, is off by as much all of them
  // together, and is still off by more than the bar without its most
  // extreme iteration: a descheduled iteration averages away over that
  // many and a single stall is left out, but a straggler's first heartbeat
  // (the real worker reports after every push) confirms within a few
  // iterations. shift_iterations 0: that rule off. level_shift <= 0: off.
  // A report quicker than the model is suspect only past a factor
  // 1 / (1 + level_shift_faster): a worker that sped up holds up nobody.
  double level_shift = 0.5;
  double level_shift_faster = 0.7;
  double shift_spreads = 3.0;
  uint32_t shift_reports = 2;
  double shift_seconds = 0.3;
  double level_shift_at_once = 1.0;
  uint32_t shift_iterations = 6;
  // A worker's first `warmup_reports` reports with iterations (its first
  // iterations: allocation, caches, threads starting) are not used, and no
  // report is judged against its model before that model holds
  // `shift_min_iterations` iterations.
  uint32_t warmup_reports = 2;
  uint32_t shift_min_iterations = 16;
  // Each round moves a size this fraction of the way to its target (1: all
  // the way), so that noise the model did not average away is damped; a
  // worker with a confirmed shift moves all the way.
  double damping = 0.5;
  // The fixed cost of an iteration in samples (fixed seconds over seconds
  // per sample) assumed until the workers' own batches have varied enough
  // to fit it (it is pooled across workers, who run the same model).
  double fixed_cost_samples = 0;
  // Probing, to learn that fixed cost: from the first round on, sizes are
  // set `probe` (relative) above and below their targets, alternating
  // between workers and rounds, for at least `probe_rounds` rounds and
  // until the workers' fits rest on enough spread (at most 4 x
  // probe_rounds). A calm policy gives the fit no spread of its own. 0: off.
  double probe = 0.2;
  uint32_t probe_rounds = 8;
  // pacer over dssp: a worker `lag` clocks behind the median worker
  // (clocks extrapolated from their reports) is sized to take
  // max(0.5, 1 - lag / catch_up_iterations) of the common
  // iteration time's batch, so that it closes the gap rather than trailing
  // by it until the others block on DSSP's bound. Lags up to
  // max(2, staleness_range) clocks are left to DSSP's slack. 0: off.
  uint32_t catch_up_iterations = 16;
  // The least share of its own target batch catch-up may leave a worker,
  // and the least for a worker more than `staleness` (s_L) clocks behind,
  // which holds the others at DSSP's bound. (0.5 for every lag cost the
  // simulator's hetero scenario 2-3 points of the ideal; 0.75 for every
  // lag left bursts at 256 and 1024 workers 2-2.5 points under the old
  // policy's.)
  double catch_up_floor = 0.75;
  double catch_up_blocking_floor = 0.5;
};

// Why a round of the policy ran (pacer_monitor_policy_rounds_total{reason}).
enum class RoundReason { kInterval, kLevelShift, kMembership, kMemoryLimit, kCount };
const char* RoundReasonName(RoundReason reason);

// The straggler policy of one job. Single-threaded; time comes from the
// caller (`now`), so tests drive it with a fake clock. `timer` only times
// the policy's own decisions (last_decision_seconds).
class StragglerPolicy {
 public:
  explicit StragglerPolicy(const PolicyOptions& options, const Clock* timer = Clock::Real());

  // Sets the live workers. New ones get an even share, departed ones are
  // forgotten, and the sizes are redistributed so that they add up to B.
  void SetWorkers(const std::vector<uint32_t>& ids);
  // Accumulates a report from `worker` (ignored for unknown workers).
  void Report(uint32_t worker, const TimingReport& report);
  // Runs a round of the batch rule when one is due (adaptive-batch, pacer)
  // and every worker reported enough since the last one, or at once after
  // a confirmed level shift (see PolicyOptions::level_shift). Returns true
  // when some assignment changed.
  bool Round(TimePoint now);
  // Whether a level shift was confirmed since the last round: the next
  // Round runs whatever the time.
  bool urgent() const { return urgent_; }
  // Why the last Round that ran did (kInterval or kLevelShift).
  RoundReason last_reason() const { return last_reason_; }
  // Rounds run, by reason: Round's, and the redistributions of SetWorkers
  // (kMembership) and of a lowered memory limit (kMemoryLimit).
  uint64_t rounds(RoundReason reason) const { return by_reason_[static_cast<size_t>(reason)]; }
  // The largest change of one worker's batch in the last Round, relative
  // to its previous size (0: nothing moved). The monitor logs a round only
  // when this is above the deadband.
  double last_change() const { return last_change_; }
  // Level shifts confirmed so far.
  uint64_t level_shifts() const { return level_shifts_; }
  // Reports ignored because their timings could not be true.
  uint64_t implausible_reports() const { return implausible_; }
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
  // A worker's fitted cost (nullopt: it has not reported yet).
  std::optional<WorkerCost> cost(uint32_t worker) const;
  // The pooled fixed cost of an iteration, in samples.
  double fixed_cost_samples() const { return fixed_samples_; }
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
    CostSums sums;              // decayed, what the cost model is fitted from
    TimingReport pending;       // since the last round (iterations counted)
    std::vector<TimingReport> suspect;  // reports off the model, not yet confirmed
    int suspect_sign = 0;
    TimePoint suspect_since{};  // the first suspect's report time
    std::vector<double> suspect_learn;  // their spread updates, held back
    double spread = 0.1;        // EWMA of |log(reported / predicted)|
    bool reported = false;      // has any report in its sums
    bool shifted = false;       // a confirmed shift since the last round
    bool sized = false;         // a round has sized it from its own model
    uint32_t warmup_left = 0;   // reports still to skip (set by SetWorkers)
    double iterations = 0;      // in the sums since their last restart, not decayed
    TimePoint last_report{};
    double period = 0;          // time per iteration, waiting included, as last measured
    uint64_t clock = 0;         // from the latest report with a time
    TimePoint clock_at{};
    uint32_t memory_limit = 0;  // 0: none reported
    bool pinned_bounds = false; // set by SetBounds
  };
  WorkerCost CostOf(const Slot& slot) const;
  // Adds a report to a worker's sums, decayed to the report's time.
  void Absorb(Slot& slot, const TimingReport& r);
  // Refits the pooled fixed cost from every worker's sums.
  void RefitFixedCost();

  const PolicyOptions options_;
  BatchOptions batch_;  // options_.batch, with B changed by SetGlobalBatch
  // The same keys in both: the live workers.
  std::map<uint32_t, Assignment> assignments_;
  std::map<uint32_t, Slot> slots_;
  // Scratch of Round, kept to avoid allocations.
  std::vector<std::pair<uint32_t, WorkerTiming>> timings_;
  std::vector<uint32_t> sizes_;
  std::vector<double> lags_, median_, targets_;
  std::optional<TimePoint> last_round_;
  double fixed_samples_ = 0;
  double fit_weight_ = 0;  // what the best recent fit of fixed_samples_ rested on
  uint32_t probe_round_ = 0;  // rounds probed so far
  bool probing_ = true;
  const Clock* timer_;
  double last_decision_seconds_ = 0;
  double last_change_ = 0;
  uint64_t rounds_ = 0;
  uint64_t level_shifts_ = 0;
  uint64_t implausible_ = 0;  // reports ignored as impossible
  uint64_t by_reason_[static_cast<size_t>(RoundReason::kCount)] = {};
  RoundReason last_reason_ = RoundReason::kInterval;
  bool urgent_ = false;
  bool slack_open_ = false;
  double last_imbalance_ = 0;
  // Rounds left before the slack may change again (see Round).
  uint32_t settle_rounds_ = 0;
};

}  // namespace pacer::policy

#endif  // PACER_MONITOR_POLICY_H_
