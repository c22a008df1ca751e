// The worker's session with the monitor (one of the trainer's rooms,
// worker/trainer.cc): registration, and the heartbeat thread that reports
// the worker's timings, read positions and chunks and takes in the
// monitor's view of the job (its state, the shard map, the assignment, the
// data partitions, a hold, an evaluation asked for, faults). The training
// thread and the evaluation thread read that view under `mu`.
#ifndef PACER_WORKER_MONITOR_SESSION_H_
#define PACER_WORKER_MONITOR_SESSION_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ps/base/clock.h"
#include "ps/base/mutex.h"
#include "ps/base/rpc.h"
#include "ps/client.h"
#include "worker/chunk_reader.h"
#include "worker/trainer.h"

namespace pacer::worker {

// What the latest heartbeat reply said, shared with the training thread.
struct JobView {
  wire::JobState state = wire::JobState::Waiting;
  bool have_map = false;
  ShardMapInfo map;
  uint64_t start_clock = 0;
  uint32_t partition_index = 0;
  uint32_t partition_count = 1;
  uint32_t batch = 0;            // the current assignment
  uint32_t staleness_bound = 0;  // its s (ssp) or s_L (dssp)
  uint32_t staleness_range = 0;  // its r_max (dssp)
  bool evaluate = false;         // this worker evaluates the test set
  uint64_t evaluate_now = 0;     // the monitor asks for an evaluation at once
  uint64_t pause_at = 0;         // hold before running this clock (0: no pause)
  // The data partitions this worker owns, with the monitor's positions.
  std::vector<wire::PartitionPosition> partitions;
  uint32_t data_epoch = 0;  // The data stream: the job's epoch
  std::string stop_reason;
  absl::Status error;  // set when the monitor refuses us
};

// Timings since the last heartbeat, for the policy.
struct TimingWindow {
  uint32_t iterations = 0;
  uint64_t samples = 0;
  double compute = 0, communication = 0, wait = 0;
  // Sums of batch^2 and batch x compute seconds, for the policy's fit,
  // and the quickest and slowest iteration's compute.
  double batch_squares = 0, batch_compute = 0;
  double compute_min = 0, compute_max = 0;
  void AddRange(double lo, double hi) {
    compute_min = compute_min > 0 ? std::min(compute_min, lo) : lo;
    compute_max = std::max(compute_max, hi);
  }
};

class MonitorSession {
 public:
  MonitorSession(Transport* t, TrainerOptions o) : transport(t), options(std::move(o)), clock(t->clock()) {}

  // Registers with the monitor (retried until --start-timeout; a refusal
  // ends it at once): the worker's id and rank and the job's settings.
  absl::Status Register(RpcChannel& monitor);
  // The heartbeat thread: one heartbeat per interval (or at once after an
  // acknowledged push, so that the monitor holds the read positions), its
  // reply taken into `view`; until told to exit, the job stops, or the
  // monitor heard that this worker is done.
  void HeartbeatLoop(std::unique_ptr<RpcChannel> monitor);
  // Switches `client` to the newest shard map if it is behind.
  absl::Status RefreshMap(PsClient& client);
  // Waits (at most 1 s) until the monitor holds every read position
  // reported so far; not while the monitor is unreachable. `lock` holds mu.
  void WaitForReportedPositions(MutexLock& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const TimePoint until = clock->Now() + std::chrono::seconds(1);
    while (monitor_up && reported < progress && !stop && !cancel.load() &&
           !clock->WaitUntil(progress_cv, lock.native(), until)) {
    }
  }
  bool Stopping() const { return stop.load() || cancel.load(); }
  RpcOptions Rpc() const {
    RpcOptions r;
    r.job_id = job_id;
    r.sender = id;
    r.max_message_bytes = options.max_message_bytes;
    return r;
  }

  // Constant after construction (options: after Trainer::Start's first
  // lines, before the heartbeats).
  Transport* const transport;
  TrainerOptions options;
  const Clock* const clock;

  // From registration: who we are, and the job's settings.
  uint32_t id = 0;
  uint32_t rank = 0;
  uint64_t job_id = 0;
  uint32_t epochs = 0;
  bool data_stream = false;  // the job reads one data stream (chunks)
  wire::Mode mode = wire::Mode::Bsp;
  // Mode local: a round ends after round_steps local steps, or at the first
  // step that ends round_seconds after the round's pull (0: not by that).
  uint32_t round_steps = 0;
  double round_seconds = 0;
  uint64_t seed = 1;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double eval_interval = 1.0;
  uint32_t eval_clocks = 0;  // also evaluate every this many clocks; 0: off
  Duration heartbeat_interval = std::chrono::milliseconds(100);

  // Shared between the training, heartbeat and evaluation threads.
  Mutex mu;
  std::condition_variable cv;  // a heartbeat's reply, or a clock passed
  JobView view ABSL_GUARDED_BY(mu);
  // Read positions after the last acknowledged push, per owned partition,
  // for the monitor. progress: bumped with each; reported: the progress
  // the monitor has acknowledged; monitor_up: the last heartbeat got an
  // answer.
  std::map<uint32_t, std::pair<uint32_t, uint64_t>> positions ABSL_GUARDED_BY(mu);
  uint64_t progress ABSL_GUARDED_BY(mu) = 0;
  uint64_t reported ABSL_GUARDED_BY(mu) = 0;
  bool monitor_up ABSL_GUARDED_BY(mu) = true;
  bool paused ABSL_GUARDED_BY(mu) = false;  // held at the monitor's pause clock
  std::condition_variable progress_cv;
  TimingWindow window ABSL_GUARDED_BY(mu);
  // The data stream: the chunks the monitor gives us.
  std::optional<ChunkReader> chunks ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> clock_now{0};
  std::atomic<float> samples_per_second{0};
  std::atomic<bool> done{false};  // finished its epochs
  std::atomic<bool> stop{false};  // the job stopped (or we must stop)
  // Set with stop, and by Cancel(): requests in flight give up.
  std::atomic<bool> interrupt{false};
  std::atomic<bool> cancel{false};
  std::atomic<bool> heartbeat_exit{false};
  // The newest shard-map version the monitor announced (view.map holds it).
  std::atomic<uint64_t> map_version{0};
};

// The evaluation thread (TrainerOptions::evaluate): every worker with an
// evaluation runs it; the one the monitor names evaluates, on its own
// client, every eval_interval seconds, every eval_clocks clocks and when
// the monitor asks, and reports to the monitor.
void EvaluationLoop(MonitorSession& session, const std::vector<wire::KeyLen>& keys,
                    ShardMapInfo map);

}  // namespace pacer::worker

#endif  // PACER_WORKER_MONITOR_SESSION_H_
