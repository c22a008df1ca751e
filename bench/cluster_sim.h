// A discrete-event simulator of a Pacer cluster: simulated workers with
// speed traces, driven by the same straggler policy (monitor/policy.h) and
// the same shard-side consistency rules (ps/staleness.h) as the real
// processes. It answers "what throughput does this policy keep with these
// stragglers at N workers" far past what one machine can run.
//
// Model of one iteration of worker i at batch b (switched at iteration
// starts, from the policy's assignment):
//   wait until the consistency rule lets it read clock c,
//   pull (comm/2), compute b * spp_i(t) + overhead, push (comm/2),
// where spp_i(t) is the per-sample compute time from its speed trace and
// comm given directly, or (pacer-sim --model-bytes) as pull + push of the
// model: 2 x model bytes / bandwidth + latency. The push joins clock c's step at
// the shard. Differences from the shard: a blocked read is re-checked when
// a clock closes (the shard re-checks on every push), so a DSSP grant that
// only later push times would allow is given one clock later; bounds the
// policy changes reach the shards at once (the monitor sends a new
// membership at its next 20 ms tick, or up to 300 ms later when it sent
// that shard one just before).
// Reports and assignments travel as in the real job: a worker's timings go
// to the policy with its heartbeat (every `report_interval`), and the reply
// carries its batch size, used from its next iteration on.
#ifndef PACER_BENCH_CLUSTER_SIM_H_
#define PACER_BENCH_CLUSTER_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "monitor/policy.h"
#include "ps/base/wire.h"

namespace pacer::sim {

enum class Scenario {
  kNone,     // every worker at base speed
  kStatic,   // one worker `slow_factor` x slower for the whole run
  kHetero,   // static heterogeneity: factors spread evenly over [1, slow_factor]
  kBursts,   // each worker slows `slow_factor` x for random bursts
  kMoving,   // one `slow_factor` x straggler that moves to the next worker
};
absl::StatusOr<Scenario> ParseScenario(const std::string& name);

struct SimOptions {
  int workers = 4;
  wire::Mode mode = wire::Mode::Bsp;
  policy::Kind policy = policy::Kind::kFixed;
  uint32_t batch = 64;                // per worker at the start; B = batch * workers
  uint32_t staleness = 0;             // s (ssp) or s_L (dssp)
  uint32_t staleness_range = 4;       // r_max (dssp)
  uint32_t backup_workers = 1;        // k (backup)
  double policy_interval = 0.5;       // seconds of simulated time
  double report_interval = 0.1;       // heartbeat period; 0: report with every push
  double deadband = 0.05;
  double level_shift = policy::PolicyOptions{}.level_shift;  // PolicyOptions::level_shift
  double level_shift_faster = policy::PolicyOptions{}.level_shift_faster;
  uint32_t catch_up = 16;             // PolicyOptions::catch_up_iterations
  Scenario scenario = Scenario::kNone;
  double slow_factor = 4;
  double move_every = 20;             // kMoving: seconds per worker
  double burst_rate = 0.05;           // kBursts: bursts per worker per second
  double burst_seconds = 2;           // kBursts: length of one burst
  double seconds_per_sample = 33e-6;  // base compute per sample
  double iteration_overhead = 0;      // compute per iteration, any batch
  double communication = 5e-3;        // seconds per iteration (pull + push)
  double seconds = 60;                // simulated time
  uint64_t seed = 1;
  // Noise of a shared node, on every worker and on top of the scenario:
  // each worker's compute is multiplied by 1 + x(t), x an Ornstein-Uhlenbeck
  // (continuous AR(1)) process with standard deviation noise / 2 and
  // correlation time noise_seconds, clipped to [-noise, +noise]. 0: none.
  double noise = 0;
  double noise_seconds = 0.5;
  // Co-located jobs that come and go: on each worker they arrive at
  // colocated_rate per second and last an exponential colocated_seconds on
  // average; each one running multiplies its compute by 1 + colocated_load.
  double colocated_rate = 0;
  double colocated_seconds = 5;
  double colocated_load = 0.3;
  // Policy settings (PolicyOptions) the simulator passes through.
  double fit_seconds = 5.0;
  double damping = 0.5;
  double probe = 0.2;
  double shift_seconds = 0.3;         // PolicyOptions::shift_seconds
  // The data stream (pacer-monitor --data-stream; monitor/data_stream.h),
  // the monitor's own DataStream with each worker reading its chunks as
  // the trainer does (worker/chunk_reader.h; positions only): a training
  // set of data_samples samples for `epochs` passes. The run ends once
  // they are trained (or at `seconds`). A worker with no chunk at hand
  // pushes empty (no compute). The stream hears a worker after each of its
  // pushes and at its heartbeats (no message delay). 0: not modelled, every
  // batch full.
  uint64_t data_samples = 0;
  uint32_t epochs = 0;
  uint32_t chunk_samples = 0;  // --chunk-samples (0: by speed)
};

struct SimResult {
  double samples = 0;           // applied samples (dropped pushes excluded)
  double throughput = 0;        // samples per simulated second
  // The sum of the workers' speeds: B split in proportion to speed, nobody
  // waiting (the best a synchronous policy with global batch B can do).
  double ideal_throughput = 0;
  double fraction = 0;          // throughput / ideal
  double wait_fraction = 0;     // share of worker time spent waiting
  uint64_t clocks = 0;          // steps applied
  uint64_t dropped = 0;         // backup: pushes dropped
  uint64_t rounds = 0;          // policy rounds
  double decision_mean_seconds = 0;  // real time per policy round
  double decision_max_seconds = 0;
  uint32_t min_batch = 0, max_batch = 0;  // final assignment
  // Stability: the share of samples applied in steps where every push had a
  // batch within [0.5, 1.5] x B/n, and the smallest and largest batch any
  // push had, over B/n.
  double stable_fraction = 0;
  double min_batch_ratio = 0, max_batch_ratio = 0;
  // Stragglers, graded against the true speeds (the scenario's factors,
  // without noise): each worker slower than the base is "slow"; its fair
  // share is its batch when B is split so that every worker's true
  // iteration time is equal (with b >= 1). reach: the first simulated time
  // one of its iterations ran with a batch within 25% of its fair share
  // (the latest over the slow workers; -1: some never got there); in_band:
  // the share of its iterations from then on that stayed within 25% (the
  // least over the slow workers; 1 when there are none).
  double fixed_cost_samples = 0;  // the policy's pooled fit at the end
  uint64_t level_shifts = 0;      // level shifts the policy confirmed
  int slow_workers = 0;
  double slow_reach_seconds = -1;
  double slow_in_band_fraction = 1;
  // With data_samples: the epochs trained in full, when the last of them
  // ended (-1: not within `seconds`), the floor (their samples over the
  // ideal throughput) and the longest epoch tail (seconds from the first
  // worker left with nothing of an epoch to its end).
  uint32_t epochs_done = 0;
  double epochs_seconds = -1;
  double epochs_floor_seconds = 0;
  double max_tail_seconds = 0;
  // The monitor's cost of the stream (real time, not simulated): each
  // worker exchange (its report, and a hand-out or take-over if one is
  // due, as on a heartbeat), measured around the DataStream calls. Not in
  // it: the monitor's state save after a change (as for partitions).
  uint64_t stream_calls = 0;
  double stream_mean_us = 0, stream_max_us = 0;
};

// The true fair shares of B over workers whose compute per iteration is
// (overhead + b * seconds_per_sample) * factor[i] plus `communication`:
// equal iteration times, b_i >= 1, adding up to B (not rounded).
std::vector<double> FairShares(const std::vector<double>& factor, double global_batch,
                               double seconds_per_sample, double overhead);

absl::StatusOr<SimResult> Simulate(const SimOptions& options);

}  // namespace pacer::sim

#endif  // PACER_BENCH_CLUSTER_SIM_H_
