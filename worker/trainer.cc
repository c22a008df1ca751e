#include "worker/trainer.h"
#include "worker/chunk_reader.h"

#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "ps/base/mutex.h"
#include "ps/base/rpc.h"
#include "ps/client.h"
#include "spdlog/spdlog.h"

namespace pacer::worker {

std::vector<wire::KeyLen> BlockKeys(const std::vector<TensorSpec>& tensors, size_t block_floats) {
  std::vector<wire::KeyLen> keys;
  block_floats = std::max<size_t>(1, block_floats);
  uint64_t k = 0;
  for (const TensorSpec& t : tensors) {
    for (size_t off = 0; off < t.size; off += block_floats) {
      keys.emplace_back(k++, std::min(block_floats, t.size - off));
    }
  }
  return keys;
}

absl::StatusOr<msg::DeclareModel> Declaration(const std::vector<TensorSpec>& tensors,
                                              size_t block_floats,
                                              const std::vector<ParamGroupSpec>& param_groups) {
  msg::DeclareModel m;
  for (size_t i = 0; i < param_groups.size(); ++i) {
    const std::string& name = param_groups[i].settings.name;
    if (name.empty() || name == kDefaultGroupName) {
      return absl::InvalidArgumentError("a parameter group needs a name other than 'default'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (param_groups[j].settings.name == name) {
        return absl::InvalidArgumentError("parameter group '" + name + "' is named twice");
      }
    }
    m.param_groups.push_back(param_groups[i].settings);
  }
  m.keys = BlockKeys(tensors, block_floats);
  size_t key = 0;
  bool grouped = false;
  for (const TensorSpec& t : tensors) {
    uint32_t group = kDefaultGroup;
    for (size_t g = 0; g < param_groups.size() && group == kDefaultGroup; ++g) {
      for (const std::string& pattern : param_groups[g].patterns) {
        if (fnmatch(pattern.c_str(), t.name.c_str(), 0) == 0) {
          group = static_cast<uint32_t>(g + 1);
          break;
        }
      }
    }
    grouped |= group != kDefaultGroup;
    for (size_t off = 0; off < t.size; off += std::max<size_t>(1, block_floats), ++key) {
      m.names.push_back(t.name);
      m.groups.push_back(group);
    }
  }
  if (!grouped) m.groups.clear();
  return m;
}

absl::StatusOr<ParamGroupSpec> ParseParamGroup(const std::string& spec) {
  const size_t a = spec.find(':');
  const size_t b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': want NAME:PATTERNS:SETTINGS, e.g. "
                                      "no_decay:*.bias:weight_decay=0");
  }
  auto settings = ParseGroupSettings(spec.substr(b + 1));
  if (!settings.ok()) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': " + std::string(settings.status().message()));
  }
  ParamGroupSpec g;
  g.settings = *settings;
  g.settings.name = spec.substr(0, a);
  for (size_t at = a + 1; at <= b;) {
    const size_t comma = std::min(spec.find(',', at), b);
    if (comma > at) g.patterns.push_back(spec.substr(at, comma - at));
    at = comma + 1;
  }
  if (g.settings.name.empty() || g.patterns.empty()) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': a group needs a name and at least one pattern");
  }
  return g;
}

namespace {

// The least time a heartbeat waits for its reply (at least twice the interval).
constexpr Duration kMinHeartbeatWait = std::chrono::milliseconds(250);

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

// A file opened to append to (the --*-log flags), closed when it goes; null
// for an empty path.
using LogFile = std::unique_ptr<std::FILE, int (*)(std::FILE*)>;
absl::StatusOr<LogFile> OpenLog(const std::string& path, const char* flag) {
  if (path.empty()) return LogFile(nullptr, &std::fclose);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr)
    return absl::InvalidArgumentError(std::string("cannot open ") + flag + " " + path);
  return LogFile(f, &std::fclose);
}

// The gradient sink of a layer-wise push: sends each layer's part as the
// backward pass finishes it. Straggler emulation stretches the compute
// before each part (and the rest after the pass, Finish) by `factor`. An
// asynchronous backend's reports are not timed on this thread, so under a
// slowdown its parts are held until the whole pass is stretched (`defer`).
struct LayerPusher : GradientSink {
  LayerPusher(PsClient& c, const Clock& clk, double f, bool hold)
      : client(c), clock(clk), factor(f), defer(hold && f > 1.0), mark(clk.Now()) {}
  void Ready(size_t stage) override {
    if (defer) {
      held.push_back(stage);
      return;
    }
    Stretch();
    Send(stage);
  }
  // After the pass: the rest of the compute stretched, held parts sent.
  void Finish() {
    Stretch();
    for (size_t stage : held) Send(stage);
    held.clear();
  }
  void Send(size_t stage) {
    if (!error.ok()) return;  // FinishPush is skipped; the caller sends it all again
    const TimePoint start = clock.Now();
    const uint64_t before = client.push_messages();
    error = client.PushStage(stage);
    if (client.push_messages() > before && !early) {
      early = true;
      first_sent = start;
    }
    mark = clock.Now();
    sending += mark - start;
  }
  // Sleeps (factor - 1) times the compute since the last mark.
  void Stretch() {
    const TimePoint now = clock.Now();
    if (factor > 1.0) {
      clock.SleepUntil(now + std::chrono::duration_cast<Duration>((now - mark) * (factor - 1.0)));
    }
    mark = clock.Now();
  }
  PsClient& client;
  const Clock& clock;
  const double factor;
  const bool defer;
  TimePoint mark;
  std::vector<size_t> held;
  absl::Status error;
  bool early = false;  // a part went out before the pass ended
  TimePoint first_sent{};
  Duration sending{};  // time in PushStage (communication, not compute)
};

}  // namespace

// The worker's metrics, labelled with its rank (known once registered).
struct WorkerMetrics {
  WorkerMetrics(prometheus::Registry& r, uint32_t rank) {
    const prometheus::Labels l{{"worker_rank", std::to_string(rank)}};
    const prometheus::Histogram::BucketBoundaries seconds{
        0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    compute = &prometheus::BuildHistogram()
                   .Name("pacer_worker_compute_seconds")
                   .Help(
                       "Time one iteration spent computing its gradient (straggler "
                       "emulation's sleep included)")
                   .Register(r)
                   .Add(l, seconds);
    communication = &prometheus::BuildHistogram()
                         .Name("pacer_worker_communication_seconds")
                         .Help(
                             "Time one iteration spent on push and pull, waiting on the "
                             "consistency rule excluded")
                         .Register(r)
                         .Add(l, seconds);
    overlap = &prometheus::BuildHistogram()
                   .Name("pacer_worker_overlap_seconds")
                   .Help(
                       "Layer-wise push: how long one iteration's push was on its way while "
                       "its gradient was still being computed")
                   .Register(r)
                   .Add(l, seconds);
    wait = &prometheus::BuildHistogram()
                .Name("pacer_worker_wait_seconds")
                .Help(
                    "Time one iteration's pull waited on the consistency rule (the barrier, "
                    "the staleness bound)")
                .Register(r)
                .Add(l, seconds);
    staleness = &prometheus::BuildHistogram()
                     .Name("pacer_worker_observed_staleness_steps")
                     .Help("Clocks the parameters one iteration read were behind it (0: fresh)")
                     .Register(r)
                     .Add(l, prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16});
    iterations = &prometheus::BuildCounter()
                      .Name("pacer_worker_iterations_total")
                      .Help("Iterations whose push every shard acknowledged")
                      .Register(r)
                      .Add(l);
    samples = &prometheus::BuildCounter()
                   .Name("pacer_worker_samples_total")
                   .Help("Training samples in acknowledged pushes")
                   .Register(r)
                   .Add(l);
    samples_per_second = &prometheus::BuildGauge()
                              .Name("pacer_worker_samples_per_second")
                              .Help("Training samples per second over the last progress interval")
                              .Register(r)
                              .Add(l);
    batch = &prometheus::BuildGauge()
                 .Name("pacer_worker_batch_size")
                 .Help("The batch size this worker trains with (the policy's assignment)")
                 .Register(r)
                 .Add(l);
    bound = &prometheus::BuildGauge()
                 .Name("pacer_worker_staleness_bound_steps")
                 .Help("The staleness bound assigned to this worker: s (ssp) or s_L (dssp)")
                 .Register(r)
                 .Add(l);
    range = &prometheus::BuildGauge()
                 .Name("pacer_worker_staleness_range_steps")
                 .Help("dssp: r_max, the extra iterations past s_L this worker may be granted")
                 .Register(r)
                 .Add(l);
    clock = &prometheus::BuildGauge()
                 .Name("pacer_worker_clock")
                 .Help("The clock (iteration) this worker runs next")
                 .Register(r)
                 .Add(l);
    not_durable = &prometheus::BuildGauge()
                       .Name("pacer_worker_pushes_not_durable")
                       .Help(
                           "Pushes kept until their range's backups hold them (monitor "
                           "--replicas), to send again to a new primary after a failover")
                       .Register(r)
                       .Add(l);
    loss = &prometheus::BuildGauge()
                .Name("pacer_training_loss")
                .Help("Training loss (cross-entropy, moving average over iterations)")
                .Register(r)
                .Add(l);
  }
  prometheus::Histogram *compute, *communication, *overlap, *wait, *staleness;
  prometheus::Counter *iterations, *samples;
  prometheus::Gauge *samples_per_second, *batch, *bound, *range, *clock, *loss, *not_durable;
};

struct Trainer::Impl {
  Transport* transport;
  TrainerOptions options;
  const Clock* clock;
  std::atomic<bool> cancel{false};

  uint32_t id = 0;
  uint32_t rank = 0;
  uint64_t job_id = 0;
  // Job settings from the register reply.
  uint32_t epochs = 0;
  bool data_stream = false;  // the job reads one data stream (chunks)
  wire::Mode mode = wire::Mode::Bsp;
  uint64_t seed = 1;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  double eval_interval = 1.0;
  uint32_t eval_clocks = 0;  // also evaluate every this many clocks; 0: off
  Duration heartbeat_interval = std::chrono::milliseconds(100);

  Mutex mu;  // guards view, positions, progress, reported, monitor_up, paused, window
  std::condition_variable cv;
  JobView view ABSL_GUARDED_BY(mu);
  std::atomic<uint64_t> clock_now{0};
  std::atomic<float> samples_per_second{0};
  std::atomic<bool> done{false};  // finished its epochs
  std::atomic<bool> stop{false};  // the job stopped (or we must stop)
  // Set with stop, and by Cancel(): requests in flight give up.
  std::atomic<bool> interrupt{false};
  std::atomic<bool> heartbeat_exit{false};
  // What the worker is doing, for /readyz.
  enum class Phase { kLoading, kRegistering, kWaitingForRun, kTraining, kFinished };
  std::atomic<Phase> phase{Phase::kLoading};
  // The newest shard-map version the monitor announced (view.map holds it).
  std::atomic<uint64_t> map_version{0};
  // Read positions after the last acknowledged push, per owned partition,
  // for the monitor (guarded by mu). progress: bumped with each; reported:
  // the progress the monitor has acknowledged; monitor_up: the last
  // heartbeat got an answer.
  std::map<uint32_t, std::pair<uint32_t, uint64_t>> positions ABSL_GUARDED_BY(mu);
  uint64_t progress ABSL_GUARDED_BY(mu) = 0;
  uint64_t reported ABSL_GUARDED_BY(mu) = 0;
  bool monitor_up ABSL_GUARDED_BY(mu) = true;
  bool paused ABSL_GUARDED_BY(mu) = false;  // held at the monitor's pause clock
  std::condition_variable progress_cv;
  // Timings since the last heartbeat, for the policy (guarded by mu).
  struct Window {
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
  } window ABSL_GUARDED_BY(mu);

  Model* model = nullptr;
  std::vector<wire::KeyLen> keys;
  std::thread heartbeat, eval;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<RpcChannel> report_channel;  // Report's, made when first used
  std::optional<WorkerMetrics> metrics;
  LogFile sample_log{nullptr, &std::fclose}, step_log{nullptr, &std::fclose},
      ack_log{nullptr, &std::fclose};
  uint64_t logged_durable = 0;  // the last "durable" line of ack_log

  // The data: partitions of the training set, each read in a shuffled order
  // per epoch that depends only on (seed, partition, epoch), so whoever owns
  // a partition next continues it where the monitor's position says.
  struct Reader {
    size_t begin = 0, end = 0;  // its samples
    uint32_t epoch = 0;
    uint64_t offset = 0;  // next sample of this epoch's order
    std::vector<uint32_t> order;
    uint32_t order_epoch = UINT32_MAX;
  };
  size_t samples = 0;  // in the data set
  // The data stream: the chunks the monitor gives us.
  std::optional<ChunkReader> chunks ABSL_GUARDED_BY(mu);
  uint32_t partition_count = 1;
  std::map<uint32_t, Reader> readers;
  uint32_t last_read = UINT32_MAX;  // round-robin over the owned partitions

  // The iteration in progress (NextBatch to FinishPush).
  BatchPlan plan;
  Reader* reader = nullptr;  // plan's partition; null: an empty push
  bool stream_batch = false;  // the plan's samples come from a chunk
  bool planned = false;
  int batch = 1;            // the assignment in force
  uint64_t clock_next = 0;  // the clock the next iteration runs
  uint32_t epoch = 0;       // the lowest epoch among the owned partitions (progress lines)
  TimePoint pull_start{}, compute_start{}, compute_begin{};
  double pull_seconds = 0, waited = 0;
  Duration positions_wait{};
  int64_t pulled = -1;  // the applied clock the last pull returned
  std::optional<LayerPusher> pusher;
  bool layer_wise = false;

  // The run's figures and progress.
  WorkerResult result;
  absl::Status failure;  // what ended training, when not the job's stop
  bool started = false;
  TimePoint t0{};
  TimePoint next_progress{};
  uint64_t window_samples = 0;
  TimePoint window_start{};
  double loss_ewma = 0;

  absl::Status Register(RpcChannel& monitor);
  void HeartbeatLoop(std::unique_ptr<RpcChannel> monitor);
  void EvalLoop(ShardMapInfo map);
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
  // Takes the partitions the monitor gives this worker, lets go of those
  // it moved elsewhere.
  void SyncPartitions(const std::vector<wire::PartitionPosition>& owned);
  // The acknowledged push's bookkeeping: logs, read position, metrics,
  // progress.
  void Acknowledged(double compute_seconds, double communication);
  // --sample-log: "SOURCE EPOCH INDEX..." for the plan's samples (SOURCE:
  // the partition, or with the data stream the chunk).
  void LogSamples(const std::string& source) {
    std::FILE* f = sample_log.get();
    if (f == nullptr) return;
    std::string line = source + " " + std::to_string(plan.epoch);
    for (uint32_t sample : plan.samples) {
      line += ' ';
      line += std::to_string(sample);
    }
    line += '\n';
    std::fputs(line.c_str(), f);
    std::fflush(f);
  }
  void Progress();
  // Stops the side threads (after the heartbeat told the monitor we are
  // done).
  void JoinThreads();
  bool Stopping() const { return stop.load() || cancel.load(); }
  RpcOptions Rpc() const {
    RpcOptions r;
    r.job_id = job_id;
    r.sender = id;
    r.max_message_bytes = options.max_message_bytes;
    return r;
  }
};

absl::Status Trainer::Impl::Register(RpcChannel& monitor) {
  const TimePoint give_up = clock->Now() + options.start_timeout;
  // A token that names this worker instance, so that a retried registration
  // (the first may still be queued) gets the same id instead of a new one.
  std::random_device rd;
  const std::string token =
      "worker-" + std::to_string(getpid()) + "-" + std::to_string((uint64_t{rd()} << 32) | rd());
  const TimePoint started = clock->Now();
  TimePoint next_notice = started + kWaitingNoticeFirst;
  for (;;) {
    if (const TimePoint now = clock->Now(); now >= next_notice) {
      // Silence here looks like a hang: say what we wait for, and how long.
      spdlog::info(
          "waiting for the monitor at {}: no answer for {:.0f} s (giving up after {:.0f} s, "
          "--start-timeout)",
          options.monitor, ToSeconds(now - started), ToSeconds(options.start_timeout));
      next_notice = now + kWaitingNoticeEvery;
    }
    msg::Register request;
    request.role = wire::Role::Worker;
    request.address = token;
    auto reply = monitor.Call(request, std::min(give_up, clock->Now() + std::chrono::seconds(1)));
    if (reply.ok() && reply->type() == wire::Body::RegisterReply) {
      const msg::RegisterReply r = msg::Read<msg::RegisterReply>(*reply);
      id = r.id;
      rank = r.rank;
      job_id = reply->env.job_id;
      if (r.job) {
        epochs = r.job->epochs;
        data_stream = r.job->data_stream;
        mode = r.job->mode;
        optimizer = r.job->optimizer;
        seed = r.job->seed;
        eval_interval = r.job->eval_interval_seconds;
        eval_clocks = r.job->eval_interval_clocks;
        heartbeat_interval =
            std::chrono::milliseconds(std::max<uint32_t>(1, r.job->heartbeat_interval_ms));
      }
      return absl::OkStatus();
    }
    absl::Status s = reply.ok() ? absl::InternalError("unexpected register reply") : reply.status();
    if (WireCode(s) == wire::ErrorCode::Refused || WireCode(s) == wire::ErrorCode::WrongVersion) {
      return s;
    }
    if (clock->Now() >= give_up || cancel.load()) {
      return absl::DeadlineExceededError("could not register with monitor " + options.monitor +
                                         ": " + std::string(s.message()));
    }
    clock->SleepUntil(clock->Now() + std::chrono::milliseconds(100));
  }
}

void Trainer::Impl::HeartbeatLoop(std::unique_ptr<RpcChannel> monitor) {
  RuntimeFaults runtime_faults(options.faults);
  while (!heartbeat_exit) {
    const TimePoint next = clock->Now() + heartbeat_interval;
    const bool finishing = done.load();
    Window t;
    msg::Heartbeat hb;
    std::vector<wire::PartitionPosition> pos;
    uint64_t sending = 0;
    bool paused_now = false;
    {
      MutexLock lock(mu);
      t = window;
      window = Window{};
      for (const auto& [index, p] : positions) pos.emplace_back(index, p.first, p.second);
      if (chunks) hb.chunks = chunks->Report();
      sending = progress;
      paused_now = paused;
    }
    const double iters = std::max<uint32_t>(1, t.iterations);
    hb.role = wire::Role::Worker;
    hb.clock = clock_now.load();
    hb.samples_per_second = samples_per_second.load();
    hb.done = finishing;
    hb.iterations = t.iterations;
    hb.batch = static_cast<uint32_t>(std::lround(t.samples / iters));
    hb.compute_seconds_per_sample = static_cast<float>(t.compute / std::max<double>(1, t.samples));
    hb.communication_seconds = static_cast<float>(t.communication / iters);
    hb.wait_seconds = static_cast<float>(t.wait / iters);
    hb.memory_limit_batch = options.max_batch;
    hb.positions = std::move(pos);
    hb.paused = paused_now;
    hb.samples = t.samples;
    hb.compute_seconds = t.compute;
    hb.batch_squares = t.batch_squares;
    hb.batch_compute = t.batch_compute;
    hb.compute_min_seconds = t.compute_min;
    hb.compute_max_seconds = t.compute_max;
    // A heartbeat lost on the way (there or back) is given up soon and the
    // next one sent: the lease (3 s by default) must outlast several tries.
    // A 1 s wait here let three losses in a row (1 in ~1000 heartbeats
    // under 10% loss) expire a live worker's lease.
    auto reply =
        monitor->Call(hb, clock->Now() + std::max(heartbeat_interval * 2, kMinHeartbeatWait));
    {
      MutexLock lock(mu);
      if (!reply.ok() && t.iterations > 0) {
        // Not delivered: the timings go with the next heartbeat.
        window.iterations += t.iterations;
        window.samples += t.samples;
        window.compute += t.compute;
        window.communication += t.communication;
        window.wait += t.wait;
        window.batch_squares += t.batch_squares;
        window.batch_compute += t.batch_compute;
        if (t.iterations > 0) window.AddRange(t.compute_min, t.compute_max);
      }
      monitor_up = reply.ok();
      if (reply.ok()) reported = std::max(reported, sending);
      if (reply.ok() && reply->type() == wire::Body::HeartbeatReply) {
        const msg::HeartbeatReply r = msg::Read<msg::HeartbeatReply>(*reply);
        runtime_faults.Apply(r.faults_version, r.faults);
        view.state = r.state;
        view.partitions = r.partitions;
        view.data_epoch = r.data_epoch;
        // Only a running job's reply lists our chunks.
        if (chunks && r.state == wire::JobState::Running) chunks->Sync(r.chunks);
        if (r.shard_map && !view.have_map) {
          view.map = ShardMapFromWire(*r.shard_map);
          view.have_map = true;
          view.start_clock = r.start_clock;
          view.partition_index = r.partition_index;
          view.partition_count = std::max<uint32_t>(1, r.partition_count);
          map_version = view.map.version;
        } else if (r.shard_map && r.shard_map->version > view.map.version) {
          // A shard moved (restarted elsewhere) or the key ranges changed.
          view.map = ShardMapFromWire(*r.shard_map);
          map_version = view.map.version;
        }
        view.evaluate = r.evaluate;
        view.evaluate_now = r.evaluate_now;
        view.pause_at = r.pause_at;
        if (r.assignment && r.assignment->batch_size > 0) {
          view.batch = r.assignment->batch_size;
          view.staleness_bound = r.assignment->staleness_bound;
          view.staleness_range = r.assignment->staleness_range;
        }
        if (r.state == wire::JobState::Stopped) {
          view.stop_reason = r.stop_reason;
          stop = true;
          if (options.interrupt_on_stop) interrupt = true;
        }
      } else if (!reply.ok() && WireCode(reply.status()) == wire::ErrorCode::NotMember) {
        view.error = absl::FailedPreconditionError("the monitor no longer counts this worker: " +
                                                   std::string(reply.status().message()));
        stop = true;
        interrupt = true;
      } else if (!reply.ok()) {
        SPDLOG_DEBUG("heartbeat: {}", ErrorText(reply.status()));
      }
    }
    cv.notify_all();
    progress_cv.notify_all();
    if (finishing && reply.ok()) break;  // the monitor heard that we are done
    if (stop) break;
    // Until the next heartbeat is due, or at once when a push was
    // acknowledged (the monitor keeps the read positions current).
    MutexLock lock(mu);
    while (!heartbeat_exit && !stop && progress == sending &&
           !clock->WaitUntil(progress_cv, lock.native(), next)) {
    }
  }
}

absl::Status Trainer::Impl::RefreshMap(PsClient& client) {
  if (map_version.load() <= client.map_version()) return absl::OkStatus();
  ShardMapInfo map;
  {
    MutexLock lock(mu);
    map = view.map;
  }
  spdlog::info("worker {}: shard map v{} -> v{}", id, client.map_version(), map.version);
  return client.SetMap(map);
}

void Trainer::Impl::EvalLoop(ShardMapInfo map) {
  // Every worker with an evaluation runs this loop; the one the monitor
  // names (the live worker with the lowest rank) evaluates.
  ClientOptions copts;
  copts.rpc = Rpc();
  copts.request_timeout = std::chrono::seconds(10);
  copts.cancel = &heartbeat_exit;
  copts.latest_map_version = &map_version;
  auto client = PsClient::Create(transport, copts, map, keys);
  auto monitor = RpcChannel::Connect(transport, options.monitor, Rpc());
  if (!client.ok() || !monitor.ok()) return;
  MutexLock lock(mu);
  // Two schedules: every eval_interval seconds, and (if set) every
  // eval_clocks of this worker's clocks; each evaluation says which asked.
  TimePoint next = clock->Now() + FromSeconds(eval_interval);
  uint64_t next_clock = eval_clocks;
  uint64_t answered = 0;  // the last evaluate_now answered
  while (!heartbeat_exit) {
    // `cv` also wakes on every heartbeat and as clocks pass: wait for a
    // deadline of one schedule or the other, or the monitor's request.
    bool by_time = false;
    while (!heartbeat_exit && !(eval_clocks > 0 && clock_now.load() >= next_clock) &&
           view.evaluate_now <= answered) {
      if (clock->WaitUntil(cv, lock.native(), next)) {
        by_time = true;
        break;
      }
    }
    if (heartbeat_exit) break;
    uint32_t every_clocks = 0;
    uint64_t request = 0;
    if (view.evaluate_now > answered) {
      request = answered = view.evaluate_now;
    } else if (by_time) {
      next = clock->Now() + FromSeconds(eval_interval);
    } else {
      every_clocks = eval_clocks;
      // The next multiple past the current clock: a slow evaluation skips
      // the clocks it missed rather than queueing them.
      next_clock = (clock_now.load() / eval_clocks + 1) * eval_clocks;
    }
    if (!view.evaluate) continue;
    lock.Unlock();
    if (absl::Status s = RefreshMap(**client); !s.ok()) {
      spdlog::warn("worker {}: evaluation: {}", id, ErrorText(s));
    }
    auto applied = (*client)->Pull(0, /*latest=*/true);
    if (applied.ok()) {
      absl::StatusOr<EvalResult> r = options.evaluate((*client)->params());
      if (!r.ok()) {
        spdlog::error("worker {}: cannot evaluate: {}", id, ErrorText(r.status()));
        return;
      }
      const msg::AccuracyReport report{static_cast<uint64_t>(std::max<int64_t>(0, *applied)),
                                       static_cast<float>(r->accuracy), static_cast<float>(r->loss),
                                       static_cast<uint32_t>(r->samples), every_clocks,
                                       request, /*scheduled=*/true};
      auto ack = (*monitor)->Call(report, clock->Now() + std::chrono::seconds(2));
      if (!ack.ok()) SPDLOG_DEBUG("accuracy report: {}", ErrorText(ack.status()));
    }
    lock.Lock();
  }
}

Trainer::Trainer(Transport* transport, TrainerOptions options) : impl_(new Impl()) {
  impl_->transport = transport;
  impl_->options = std::move(options);
  impl_->clock = transport->clock();
}

Trainer::~Trainer() { impl_->JoinThreads(); }

void Trainer::Impl::JoinThreads() {
  phase = Phase::kFinished;
  heartbeat_exit = true;
  cv.notify_all();
  progress_cv.notify_all();
  if (eval.joinable()) eval.join();
  if (heartbeat.joinable()) heartbeat.join();
}

std::string Trainer::NotReadyReason() const {
  switch (impl_->phase.load()) {
    case Impl::Phase::kLoading:
      return "loading the data set";
    case Impl::Phase::kRegistering:
      return "registering with the monitor";
    case Impl::Phase::kWaitingForRun:
      return "waiting for the run to start";
    case Impl::Phase::kTraining:
      return "";
    case Impl::Phase::kFinished:
      return "finished";
  }
  return "finished";
}

void Trainer::Cancel() {
  impl_->cancel = true;
  impl_->interrupt = true;
  impl_->cv.notify_all();
}

bool Trainer::stopping() const { return impl_->Stopping(); }
uint32_t Trainer::id() const { return impl_->id; }
uint32_t Trainer::rank() const { return impl_->rank; }
std::span<float> Trainer::params() {
  return impl_->client ? impl_->client->params() : std::span<float>();
}
std::span<float> Trainer::grads() {
  return impl_->client ? impl_->client->grads() : std::span<float>();
}

OptimizerKind Trainer::optimizer() const { return impl_->optimizer; }

bool Trainer::data_stream() const { return impl_->data_stream; }

void Trainer::SetLearningRates(std::vector<wire::GroupLr> lrs) {
  if (impl_->client) impl_->client->SetLearningRates(std::move(lrs));
}

bool Trainer::evaluator() const {
  MutexLock lock(impl_->mu);
  return impl_->view.evaluate;
}

absl::Status Trainer::Start(Model* model, size_t samples) {
  absl::Status s = Begin(model, samples);
  if (!s.ok()) impl_->JoinThreads();  // the heartbeats, once started
  return s;
}

absl::Status Trainer::Begin(Model* model, size_t samples) {
  Impl& w = *impl_;
  TrainerOptions& o = w.options;
  if (w.started) return absl::FailedPreconditionError("the trainer has started already");
  w.started = true;
  w.model = model;
  w.samples = samples;
  if (o.max_batch == 0) o.max_batch = model->max_batch();  // before heartbeats
  auto declaration = Declaration(model->tensors(), o.block_floats, o.param_groups);
  if (!declaration.ok()) return declaration.status();
  declaration->samples = samples;
  w.keys = declaration->keys;

  w.phase = Impl::Phase::kRegistering;
  RpcOptions boot;
  boot.check_job = false;
  boot.max_message_bytes = o.max_message_bytes;
  auto monitor = RpcChannel::Connect(w.transport, o.monitor, boot);
  if (!monitor.ok()) return monitor.status();
  if (absl::Status s = w.Register(**monitor); !s.ok()) return s;
  spdlog::info("worker {}: registered as rank {} (job {})", w.id, w.rank, w.job_id);
  if (o.on_registered) o.on_registered(w.id, w.rank);
  (*monitor)->options() = w.Rpc();
  {
    auto reply = (*monitor)->Call(*declaration, w.clock->Now() + std::chrono::seconds(5));
    if (!reply.ok()) return reply.status();
  }
  if (o.registry) w.metrics.emplace(*o.registry, w.rank);
  if (w.data_stream) {
    MutexLock lock(w.mu);
    w.chunks.emplace(w.seed, samples, o.exact_positions);
  }
  w.phase = Impl::Phase::kWaitingForRun;
  w.heartbeat =
      std::thread([&w, m = std::move(*monitor)]() mutable { w.HeartbeatLoop(std::move(m)); });

  // Wait for the run to start.
  JobView view;
  {
    MutexLock lock(w.mu);
    const TimePoint give_up = w.clock->Now() + o.start_timeout;
    while (!(w.view.state == wire::JobState::Running && w.view.have_map) && !w.Stopping()) {
      if (w.clock->WaitUntil(w.cv, lock.native(), give_up)) {
        return absl::DeadlineExceededError("the job did not start in time");
      }
    }
    view = w.view;
  }
  if (!view.error.ok()) return view.error;
  if (w.Stopping()) return absl::OkStatus();  // NextBatch: none

  ClientOptions copts;
  copts.rpc = w.Rpc();
  copts.request_timeout = o.request_timeout;
  if (!o.resend) copts.resend_after = std::chrono::hours(24 * 365);  // never
  copts.resend_held = o.resend_held;
  copts.cancel = &w.interrupt;  // the job stopped, or Cancel() (SIGTERM)
  copts.latest_map_version = &w.map_version;
  // The parameters and gradient live where the model copies them fastest
  // (page-locked memory for a GPU).
  copts.allocate = [model](size_t n) { return model->AllocateHost(n); };
  auto client = PsClient::Create(w.transport, copts, view.map, w.keys);
  if (!client.ok()) return client.status();
  w.client = *std::move(client);
  if (o.overlap) {
    std::vector<FlatRange> stages;
    for (const GradRange& r : model->stages()) stages.push_back({r.begin, r.end});
    w.client->SetPushStages(std::move(stages));
  }
  if (w.rank == 0) {
    model->Init(w.seed, w.client->params());
    if (absl::Status s = w.client->Init(); !s.ok()) return s;
    spdlog::info("worker {}: initialised {} parameters on {} shard(s)", w.id, model->num_params(),
                 view.map.shards.size());
  }
  if (o.evaluate) w.eval = std::thread([&w, map = view.map] { w.EvalLoop(map); });

  w.partition_count = std::max<uint32_t>(1, view.partition_count);
  w.SyncPartitions(view.partitions);
  w.batch = static_cast<int>(std::max<uint32_t>(1, view.batch));
  for (auto [file, path, flag] : {std::tuple{&w.sample_log, &o.sample_log, "--sample-log"},
                                  std::tuple{&w.step_log, &o.step_log, "--step-log"},
                                  std::tuple{&w.ack_log, &o.ack_log, "--ack-log"}}) {
    auto opened = OpenLog(*path, flag);
    if (!opened.ok()) return opened.status();
    *file = std::move(*opened);
  }
  if (w.data_stream) {
    spdlog::info("worker {}: reads the job's data stream, batch {}, from clock {}", w.id, w.batch,
                 view.start_clock);
  } else {
    spdlog::info("worker {}: {} data partition(s) of {}, batch {}, from clock {}", w.id,
                 w.readers.size(), w.partition_count, w.batch, view.start_clock);
  }
  w.result.id = w.id;
  w.result.rank = w.rank;
  w.clock_next = view.start_clock;
  w.t0 = w.window_start = w.clock->Now();
  w.next_progress = w.t0 + o.progress_interval;
  w.phase = Impl::Phase::kTraining;
  return absl::OkStatus();
}

void Trainer::Impl::SyncPartitions(const std::vector<wire::PartitionPosition>& owned) {
  const size_t n = samples;
  std::set<uint32_t> keep;
  for (const auto& pp : owned) {
    if (pp.index() >= partition_count) continue;
    keep.insert(pp.index());
    if (readers.count(pp.index())) continue;  // ours already: we are ahead
    Reader r;
    r.begin = n * pp.index() / partition_count;
    r.end = n * (pp.index() + 1) / partition_count;
    r.epoch = pp.epoch();
    r.offset = std::min<uint64_t>(pp.offset(), r.end - r.begin);
    readers[pp.index()] = std::move(r);
    spdlog::info("worker {}: reads data partition {}/{} (samples {}..{}) from epoch {} offset {}",
                 id, pp.index(), partition_count, readers[pp.index()].begin,
                 readers[pp.index()].end, pp.epoch(), pp.offset());
    MutexLock lock(mu);
    positions[pp.index()] = {pp.epoch(), pp.offset()};
  }
  for (auto it = readers.begin(); it != readers.end();) {
    if (keep.count(it->first)) {
      ++it;
      continue;
    }
    spdlog::info("worker {}: data partition {} moved to another worker", id, it->first);
    {
      // Let go only once the monitor holds its final position (the next
      // owner starts there).
      MutexLock lock(mu);
      WaitForReportedPositions(lock);
      positions.erase(it->first);
    }
    it = readers.erase(it);
  }
}

std::optional<BatchPlan> Trainer::NextBatch() {
  Impl& w = *impl_;
  const TrainerOptions& o = w.options;
  w.planned = false;
  if (!w.client || w.Stopping() || !w.failure.ok()) return std::nullopt;
  std::vector<wire::PartitionPosition> owned;
  {
    // A new assignment (batch size, partitions) takes effect here, between
    // iterations.
    MutexLock lock(w.mu);
    uint32_t cap = std::numeric_limits<uint32_t>::max();
    if (o.max_batch > 0) cap = o.max_batch;  // our memory limit
    const int assigned = static_cast<int>(std::clamp<uint32_t>(w.view.batch, 1, cap));
    if (assigned != w.batch) {
      SPDLOG_DEBUG("worker {}: batch {} -> {} at clock {}", w.id, w.batch, assigned, w.clock_next);
      w.batch = assigned;
    }
    if (w.metrics) {
      w.metrics->batch->Set(w.batch);
      w.metrics->bound->Set(w.view.staleness_bound);
      w.metrics->range->Set(w.view.staleness_range);
    }
  }
  {
    // Held by the monitor (a shard move, pacerctl pause): wait here, between
    // iterations, with every push acknowledged; heartbeats go on.
    MutexLock lock(w.mu);
    bool logged = false;
    while (w.view.pause_at != 0 && w.clock_next >= w.view.pause_at && !w.Stopping()) {
      if (!logged) {
        spdlog::info("worker {}: held at clock {}", w.id, w.clock_next);
        logged = true;
      }
      w.paused = true;
      w.clock->WaitUntil(w.cv, lock.native(), w.clock->Now() + std::chrono::milliseconds(100));
    }
    if (logged) spdlog::info("worker {}: resumes at clock {}", w.id, w.clock_next);
    w.paused = false;
    owned = w.view.partitions;
  }
  if (w.Stopping()) return std::nullopt;
  if (w.data_stream) {
    // The oldest chunk with samples left; the job stops when every epoch
    // is trained (the monitor says so), not when our chunks run out.
    BatchPlan& plan = w.plan;
    plan.clock = w.clock_next;
    plan.assigned = static_cast<uint32_t>(w.batch);
    plan.partition = 0;
    plan.chunk = 0;
    plan.samples.clear();
    w.reader = nullptr;
    MutexLock lock(w.mu);
    std::optional<ChunkReader::Batch> b = w.chunks->Plan(static_cast<size_t>(w.batch));
    if (!b && w.mode == wire::Mode::Asp) {
      // Nothing at hand, and no clock of ours holds anyone back (asp): wait
      // for the next heartbeat's chunks rather than spin on empty pushes.
      // (In the other modes the others wait for our clock.)
      w.clock->WaitUntil(w.cv, lock.native(), w.clock->Now() + w.heartbeat_interval);
      if (!w.Stopping()) b = w.chunks->Plan(static_cast<size_t>(w.batch));
    }
    w.stream_batch = b.has_value();
    if (b) {
      plan.chunk = b->chunk;
      plan.epoch = w.epoch = b->epoch;
      plan.samples = std::move(b->samples);
    } else {
      plan.epoch = w.view.data_epoch;
    }
    w.planned = true;
    return plan;
  }
  w.SyncPartitions(owned);
  // The next partition with samples left (round-robin), and its batch: the
  // rest of the epoch when less than a batch is left, so none is skipped.
  bool all_done = !w.readers.empty();
  w.epoch = UINT32_MAX;
  for (auto& [index, r] : w.readers) {
    const bool done = w.epochs > 0 && r.epoch >= w.epochs;
    all_done &= done;
    if (!done) w.epoch = std::min(w.epoch, r.epoch);
  }
  if (w.epoch == UINT32_MAX) w.epoch = 0;
  if (all_done) {
    w.done = true;  // every partition we own has run its epochs
    return std::nullopt;
  }
  BatchPlan& plan = w.plan;
  plan.clock = w.clock_next;
  plan.assigned = static_cast<uint32_t>(w.batch);
  plan.samples.clear();
  w.reader = nullptr;
  if (!w.readers.empty()) {
    auto it = w.readers.upper_bound(w.last_read);
    for (size_t tries = 0; tries <= w.readers.size(); ++tries) {
      if (it == w.readers.end()) it = w.readers.begin();
      if (w.epochs == 0 || it->second.epoch < w.epochs) break;
      ++it;
    }
    plan.partition = it->first;
    w.reader = &it->second;
    w.last_read = it->first;
    Impl::Reader& r = *w.reader;
    if (r.order_epoch != r.epoch) {
      r.order.resize(r.end - r.begin);
      std::iota(r.order.begin(), r.order.end(), static_cast<uint32_t>(r.begin));
      std::mt19937_64 rng(w.seed * 1000003 + plan.partition * 7919 + r.epoch);
      std::shuffle(r.order.begin(), r.order.end(), rng);
      r.order_epoch = r.epoch;
    }
    plan.epoch = r.epoch;
    const size_t take = std::min<size_t>(static_cast<size_t>(w.batch), r.order.size() - r.offset);
    plan.samples.assign(r.order.begin() + static_cast<long>(r.offset),
                        r.order.begin() + static_cast<long>(r.offset + take));
  }
  w.planned = true;
  return plan;
}

absl::StatusOr<int64_t> Trainer::Pull(const std::function<void()>& while_in_flight) {
  Impl& w = *impl_;
  if (!w.planned) return absl::FailedPreconditionError("Pull before NextBatch");
  PsClient& client = *w.client;
  w.pull_start = w.clock->Now();
  bool ran = false;
  absl::StatusOr<int64_t> pulled;
  do {
    if (absl::Status s = w.RefreshMap(client); !s.ok()) {
      pulled = s;
      break;
    }
    if (w.options.overlap) {
      // The pull is in flight while the batch is prepared.
      absl::Status started = client.StartPull(w.plan.clock);
      if (started.ok() && !ran && while_in_flight) {
        while_in_flight();
        ran = true;
      }
      pulled = started.ok() ? client.FinishPull() : absl::StatusOr<int64_t>(started);
    } else {
      pulled = client.Pull(w.plan.clock);
    }
  } while (!pulled.ok() && pulled.status().code() == absl::StatusCode::kAborted);
  if (!pulled.ok()) {
    w.planned = false;
    if (!w.Stopping()) w.failure = pulled.status();
    return pulled.status();
  }
  w.pulled = *pulled;
  w.compute_start = w.compute_begin = w.clock->Now();
  w.pull_seconds = ToSeconds(w.compute_start - w.pull_start);
  w.waited = std::min(w.pull_seconds, client.last_wait_seconds());
  w.positions_wait = Duration{};
  if (!ran && while_in_flight) while_in_flight();
  return pulled;
}

GradientSink* Trainer::StartPush(double stretch) {
  Impl& w = *impl_;
  if (!w.planned || !w.client) return nullptr;
  w.layer_wise = w.options.overlap && !w.plan.samples.empty();
  if (w.layer_wise) {
    // The monitor must hold our read positions up to the previous batch
    // before this one is consumed: a replacement then repeats at most this
    // batch. (Not while the monitor is unreachable: training goes on.)
    MutexLock lock(w.mu);
    w.WaitForReportedPositions(lock);
    lock.Unlock();
    w.compute_begin = w.clock->Now();
    w.positions_wait = w.compute_begin - w.compute_start;
  }
  w.pusher.emplace(*w.client, *w.clock, stretch, w.model->asynchronous());
  if (!w.layer_wise) return nullptr;
  w.client->StartPush(w.plan.clock, static_cast<uint32_t>(w.plan.samples.size()));
  return &*w.pusher;
}

absl::Status Trainer::FinishPush(float loss) {
  Impl& w = *impl_;
  if (!w.planned) return absl::FailedPreconditionError("FinishPush before NextBatch and Pull");
  w.planned = false;
  PsClient& client = *w.client;
  if (!w.pusher) StartPush();
  LayerPusher& pusher = *w.pusher;
  const size_t this_batch = w.plan.samples.size();
  const uint64_t clock = w.plan.clock;
  const uint32_t push_batch = static_cast<uint32_t>(this_batch);
  if (this_batch == 0) {
    // No partition to read (more workers than partitions): an empty push
    // (batch 0) keeps the barrier moving and changes nothing.
    std::fill(client.grads().begin(), client.grads().end(), 0.0f);
    loss = static_cast<float>(w.loss_ewma);
  }
  if (std::isnan(loss)) loss = static_cast<float>(w.loss_ewma);  // not told
  pusher.Finish();  // the rest of the compute (all of it without layer-wise push)
  const TimePoint push_start = w.clock->Now();
  const double compute_seconds = ToSeconds(push_start - w.compute_begin - pusher.sending);
  w.loss_ewma = w.result.clocks == 0 ? loss : 0.9 * w.loss_ewma + 0.1 * loss;
  // A shard-map change mid-push: the same push (same seq) to the new map.
  absl::Status pushed;
  if (w.layer_wise) {
    pushed = pusher.error.ok() ? client.FinishPush() : pusher.error;
    if (w.metrics && pusher.early && pushed.ok()) {
      w.metrics->overlap->Observe(ToSeconds(push_start - pusher.first_sent));
    }
  } else {
    {
      MutexLock lock(w.mu);
      w.WaitForReportedPositions(lock);
    }
    pushed = client.Push(clock, push_batch);
  }
  while (pushed.code() == absl::StatusCode::kAborted) {
    pushed = w.RefreshMap(client);
    if (pushed.ok()) pushed = client.Push(clock, push_batch, /*retry=*/true);
  }
  // Timings count even when the push comes too late (backup mode drops it).
  const double communication = w.pull_seconds - w.waited + ToSeconds(w.clock->Now() - push_start) +
                               ToSeconds(w.positions_wait + pusher.sending);
  w.pusher.reset();
  if (this_batch == static_cast<size_t>(w.batch)) {
    // Timed for the policy. An epoch's short tail batch (or an empty push)
    // is not: its fixed costs over fewer samples would read as a slowdown.
    MutexLock lock(w.mu);
    ++w.window.iterations;
    w.window.samples += this_batch;
    w.window.compute += compute_seconds;
    w.window.communication += communication;
    w.window.wait += w.waited;
    const double b = static_cast<double>(this_batch);
    w.window.batch_squares += b * b;
    w.window.batch_compute += b * compute_seconds;
    w.window.AddRange(compute_seconds, compute_seconds);
  }
  if (std::FILE* f = w.step_log.get()) {
    std::fprintf(f, "%.6f %lu %zu %.6f %.6f %.6f\n", ToSeconds(w.compute_start - w.t0),
                 static_cast<unsigned long>(clock), this_batch, compute_seconds, communication,
                 w.waited);
    std::fflush(f);
  }
  if (!pushed.ok()) {
    if (w.Stopping()) return pushed;
    if (WireCode(pushed) == wire::ErrorCode::Stale) {
      // Our clock closed without us (we joined late or were slow): catch up.
      auto latest = client.Pull(clock, /*latest=*/true);
      if (latest.ok()) {
        spdlog::info("worker {}: clock {} already closed; moving to {}", w.id, clock, *latest + 1);
        w.clock_next = static_cast<uint64_t>(*latest + 1);
        return absl::OkStatus();
      }
    }
    w.failure = pushed;
    return pushed;
  }
  w.Acknowledged(compute_seconds, communication);
  return absl::OkStatus();
}

void Trainer::Impl::Acknowledged(double compute_seconds, double communication) {
  const uint64_t clock = plan.clock;
  const size_t this_batch = plan.samples.size();
  if (std::FILE* f = ack_log.get()) {
    // The moment the client reported the acknowledgement.
    const double now = UnixSeconds();
    std::fprintf(f, "%.3f %lu %lu %zu", now, static_cast<unsigned long>(client->push_seq()),
                 static_cast<unsigned long>(clock), this_batch);
    // With --replicas: each range's epoch at the shard that acknowledged
    // it ("RANGE:EPOCH"), so that an audit can tell two primaries of one
    // range acknowledging at the same time (split brain).
    const std::vector<uint64_t>& epochs = client->answered_epochs();
    for (size_t i = 0; i < epochs.size() && i < client->map().shards.size(); ++i) {
      if (epochs[i] == 0) continue;
      std::fprintf(f, " %u:%lu", client->map().shards[i].id, static_cast<unsigned long>(epochs[i]));
    }
    std::fputc('\n', f);
    // With backups, durability comes later than the ack (on later replies):
    // "durable TIME SEQ" once every push acknowledged through SEQ is.
    if (const uint64_t durable = client->durable_through(); durable > logged_durable) {
      std::fprintf(f, "durable %.3f %lu\n", now, static_cast<unsigned long>(durable));
      logged_durable = durable;
    }
    std::fflush(f);
  }
  if (reader != nullptr) {
    // Consumed: record it, move the partition's position, tell the monitor.
    LogSamples(std::to_string(plan.partition));
    reader->offset += this_batch;
    if (reader->offset >= reader->order.size()) {
      ++reader->epoch;
      reader->offset = 0;
    }
    {
      MutexLock lock(mu);
      positions[plan.partition] = {reader->epoch, reader->offset};
      ++progress;
    }
    progress_cv.notify_all();
  } else if (stream_batch) {
    // Consumed: record it, move the chunk's position, tell the monitor.
    LogSamples(std::to_string(plan.chunk));
    {
      MutexLock lock(mu);
      chunks->Ack();
      ++progress;
    }
    progress_cv.notify_all();
  }
  if (options.on_push_acked) options.on_push_acked(client->push_seq(), clock, plan.samples);
  if (metrics) {
    metrics->compute->Observe(compute_seconds);
    metrics->communication->Observe(communication);
    metrics->wait->Observe(waited);
    // Fresh parameters for clock c have every clock before it applied.
    const int64_t behind = static_cast<int64_t>(clock) - 1 - pulled;
    metrics->staleness->Observe(static_cast<double>(std::max<int64_t>(0, behind)));
    metrics->iterations->Increment();
    metrics->samples->Increment(static_cast<double>(this_batch));
    metrics->clock->Set(static_cast<double>(clock + 1));
    metrics->loss->Set(loss_ewma);
    metrics->not_durable->Set(static_cast<double>(client->held_pushes()));
  }
  result.compute_seconds += compute_seconds;
  result.communication_seconds += communication;
  result.wait_seconds += waited;
  result.last_batch = static_cast<uint32_t>(batch);  // the assignment, not a short tail
  clock_next = clock + 1;
  ++result.clocks;
  result.samples += this_batch;
  window_samples += this_batch;
  clock_now = clock_next;
  if (eval_clocks > 0 && clock_next % eval_clocks == 0) {
    // Under the lock, so that the evaluating thread cannot miss it.
    MutexLock lock(mu);
    cv.notify_all();
  }
  result.last_loss = loss_ewma;
  Progress();
}

void Trainer::Impl::Progress() {
  const TimePoint now = clock->Now();
  if (now < next_progress) return;
  double sps = window_samples / std::max(1e-9, ToSeconds(now - window_start));
  samples_per_second = static_cast<float>(sps);
  if (metrics) metrics->samples_per_second->Set(sps);
  double ep = epoch;
  for (const auto& [index, r] : readers) {
    if (r.epoch == epoch && !r.order.empty()) {
      ep = epoch + static_cast<double>(r.offset) / static_cast<double>(r.order.size());
      break;
    }
  }
  if (options.live_progress) {
    std::fprintf(stderr, "\rworker %u  epoch %.2f  clock %lu  loss %.4f  %.0f samples/s   ", id,
                 std::max(0.0, ep), static_cast<unsigned long>(clock_next), loss_ewma, sps);
    std::fflush(stderr);
  } else {
    spdlog::info("epoch {:.2f} clock {} loss {:.4f} {:.0f} samples/s", std::max(0.0, ep),
                 clock_next, loss_ewma, sps);
  }
  window_samples = 0;
  window_start = now;
  next_progress = now + options.progress_interval;
}

absl::Status Trainer::Report(const EvalResult& r) {
  Impl& w = *impl_;
  if (!w.client) return absl::FailedPreconditionError("Report before the run started");
  if (!w.report_channel) {
    auto monitor = RpcChannel::Connect(w.transport, w.options.monitor, w.Rpc());
    if (!monitor.ok()) return monitor.status();
    w.report_channel = *std::move(monitor);
  }
  const msg::AccuracyReport report{static_cast<uint64_t>(std::max<int64_t>(0, w.pulled)),
                                   static_cast<float>(r.accuracy), static_cast<float>(r.loss),
                                   static_cast<uint32_t>(r.samples), 0};
  auto ack = w.report_channel->Call(report, w.clock->Now() + std::chrono::seconds(2));
  return ack.ok() ? absl::OkStatus() : ack.status();
}

absl::StatusOr<WorkerResult> Trainer::Finish() {
  Impl& w = *impl_;
  if (w.options.live_progress && w.client) std::fprintf(stderr, "\n");
  w.result.id = w.id;
  w.result.rank = w.rank;
  if (w.client) w.result.seconds = ToSeconds(w.clock->Now() - w.t0);
  if (!w.failure.ok() && !w.stop) {
    w.JoinThreads();
    return w.failure;
  }
  if (w.client && !w.stop) {
    // Finished our epochs, or told to go (SIGTERM): tell the monitor, so the
    // barrier stops waiting for us.
    w.done = true;
    if (w.cancel) {
      spdlog::info("worker {}: leaving at clock {}", w.id, w.clock_next);
    } else {
      spdlog::info("worker {}: its data partitions finished {} epoch(s) at clock {}", w.id,
                   w.epochs, w.clock_next);
    }
  }
  absl::Status refused;
  {
    MutexLock lock(w.mu);
    refused = w.view.error;
    w.result.stop_reason = w.view.stop_reason.empty() ? "finished" : w.view.stop_reason;
  }
  if (!refused.ok()) {
    w.JoinThreads();
    return refused;
  }
  if (w.done) {
    // Let the heartbeat thread deliver the news before it exits.
    w.clock->SleepUntil(w.clock->Now() + w.heartbeat_interval * 2);
  }
  w.JoinThreads();
  return w.result;
}
}  // namespace pacer::worker
