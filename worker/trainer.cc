#include "worker/trainer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>

#include "ps/base/mutex.h"
#include "ps/base/rpc.h"
#include "ps/client.h"
#include "spdlog/spdlog.h"
#include "worker/chunk_reader.h"
#include "worker/layer_pusher.h"
#include "worker/monitor_session.h"
#include "worker/partition_reader.h"
#include "worker/worker_metrics.h"

namespace pacer::worker {

namespace {

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

}  // namespace

// The trainer's inside: the training thread's sequence (NextBatch, Pull,
// StartPush, FinishPush) over its rooms: the monitor session it is (its
// base: registration, heartbeats, the job's view; worker/monitor_session.h),
// the data it reads (partitions, or the data stream's chunks), the layer
// pusher (worker/layer_pusher.h), the evaluation thread (EvaluationLoop)
// and the metrics (worker/worker_metrics.h).
struct Trainer::Impl : MonitorSession {
  Impl(Transport* t, TrainerOptions o) : MonitorSession(t, std::move(o)) {}

  // What the worker is doing, for /readyz.
  enum class Phase { kLoading, kRegistering, kWaitingForRun, kTraining, kFinished };
  std::atomic<Phase> phase{Phase::kLoading};

  Model* model = nullptr;
  std::vector<wire::KeyLen> keys;
  std::thread heartbeat, eval;
  std::unique_ptr<PsClient> client;
  std::unique_ptr<RpcChannel> report_channel;  // Report's, made when first used
  std::optional<WorkerMetrics> metrics;
  LogFile sample_log{nullptr, &std::fclose}, step_log{nullptr, &std::fclose},
      ack_log{nullptr, &std::fclose};
  uint64_t logged_durable = 0;  // the last "durable" line of ack_log

  // The data: the training set's partitions this worker reads (the data
  // stream's chunks are the session's, under its lock).
  size_t samples = 0;  // in the data set
  PartitionReader partitions{this};

  // The iteration in progress (NextBatch to FinishPush).
  BatchPlan plan;
  bool stream_batch = false;  // the plan's samples come from a chunk
  bool planned = false;
  int batch = 1;            // the assignment in force
  uint64_t clock_next = 0;  // the clock the next iteration runs
  uint32_t epoch = 0;       // the epoch read (the lowest among the owned partitions)
  TimePoint pull_start{}, compute_start{}, compute_begin{};
  double pull_seconds = 0, waited = 0;
  Duration positions_wait{};
  int64_t pulled = -1;  // the applied clock the last pull returned
  std::optional<LayerPusher> pusher;
  bool layer_wise = false;

  // Mode local: the round in progress, from its pull to its push. A local
  // step's read positions move here only; the monitor hears of them (and
  // its samples count as trained) once every shard took the round's push,
  // so a worker that dies mid-round loses only its round.
  struct Round {
    struct Step {
      std::string source;  // the partition, or the chunk (--sample-log)
      std::optional<uint64_t> chunk;  // the data stream's chunk
      uint32_t epoch = 0;
      std::vector<uint32_t> samples;
    };
    bool open = false;
    uint64_t clock = 0;
    uint32_t trained_steps = 0;  // its steps with samples (--round-steps)
    TimePoint began{};  // its pull answered
    uint64_t samples = 0;
    double compute = 0;
    std::vector<float> start;  // the parameters its pull brought
    std::vector<Step> steps;
  } round;
  bool local = false;  // mode local: rounds of local steps
  // Mode local: one local step done (the caller stepped params()); the
  // round's push when it is due.
  absl::Status LocalStep(float loss, double compute_seconds);
  bool RoundDue() const;
  // The round's push (the change of the parameters since its pull), and on
  // its acknowledgement its read positions and samples.
  absl::Status EndRound();

  // The run's figures and progress.
  WorkerResult result;
  absl::Status failure;  // what ended training, when not the job's stop
  bool started = false;
  TimePoint t0{};
  TimePoint next_progress{};
  uint64_t window_samples = 0;
  TimePoint window_start{};
  double loss_ewma = 0;

  // The acknowledged push's bookkeeping: logs, read position, metrics,
  // progress.
  void Acknowledged(double compute_seconds, double communication);
  // --ack-log's line for the acknowledged push of `clock`.
  void LogAck(uint64_t clock, size_t this_batch);
  // A push of `clock` taken, with `samples` trained: the figures, the next
  // clock, progress (an iteration's, or in mode local a round's).
  void Trained(uint64_t clock, size_t samples, double compute_seconds, double communication);
  // --sample-log: "SOURCE EPOCH INDEX..." for the plan's samples (SOURCE:
  // the partition, or with the data stream the chunk).
  void LogSamples(const std::string& source) { LogSamples(source, plan.epoch, plan.samples); }
  void LogSamples(const std::string& source, uint32_t epoch, std::span<const uint32_t> samples) {
    std::FILE* f = sample_log.get();
    if (f == nullptr) return;
    std::string line = source + " " + std::to_string(epoch);
    for (uint32_t sample : samples) {
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
};

Trainer::Trainer(Transport* transport, TrainerOptions options)
    : impl_(new Impl(transport, std::move(options))) {}

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
bool Trainer::local_steps() const { return impl_->local; }
bool Trainer::round_began() const {
  return impl_->local && impl_->round.open && impl_->round.steps.empty();
}

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
  declaration->optimizer = o.optimizer;
  w.keys = declaration->keys;

  w.phase = Impl::Phase::kRegistering;
  RpcOptions boot;
  boot.check_job = false;
  boot.max_message_bytes = o.max_message_bytes;
  auto monitor = RpcChannel::Connect(w.transport, o.monitor, boot);
  if (!monitor.ok()) return monitor.status();
  if (absl::Status s = w.Register(**monitor); !s.ok()) return s;
  spdlog::info("worker {}: registered as rank {} (job {})", w.id, w.rank, w.job_id);
  w.local = w.mode == wire::Mode::Local;
  if (w.local) {
    // The shards run the outer optimizer: declare it, or none.
    if (!o.outer && !o.param_groups.empty()) {
      spdlog::warn("worker {}: the job runs rounds of local steps: its parameter groups "
                   "(--param-group) are not declared; the shards run the job's outer optimizer "
                   "over one group",
                   w.id);
    }
    declaration = Declaration(model->tensors(), o.block_floats,
                              o.outer ? o.outer->param_groups : std::vector<ParamGroupSpec>{});
    if (!declaration.ok()) return declaration.status();
    declaration->samples = samples;
    declaration->optimizer = o.outer ? std::optional(o.outer->optimizer) : std::nullopt;
    spdlog::info("worker {}: rounds of local steps ({}), the shards' optimizer the outer one", w.id,
                 w.round_steps > 0 ? std::to_string(w.round_steps) + " steps"
                                   : std::to_string(w.round_seconds) + " s");
  } else if (o.outer) {
    std::string mode = wire::EnumNameMode(w.mode);
    for (char& c : mode) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return absl::FailedPreconditionError(
        "this worker declares an outer optimizer (rounds of local steps), but the job runs "
        "mode " + mode + ": start pacer-monitor with --mode local");
  }
  if (o.on_registered) o.on_registered(w.id, w.rank);
  (*monitor)->options() = w.Rpc();
  {
    auto reply = (*monitor)->Call(*declaration, w.clock->Now() + std::chrono::seconds(5));
    if (!reply.ok()) return reply.status();
    // The monitor took it.
    if (declaration->optimizer) w.optimizer = declaration->optimizer->kind;
  }
  if (o.registry) w.metrics.emplace(*o.registry, w.rank);
  if (w.data_stream) {
    MutexLock lock(w.mu);
    w.chunks.emplace(w.seed, samples, o.safeguards.On(Safeguard::kExactPositions));
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
  if (!o.safeguards.On(Safeguard::kRetry)) copts.resend_after = std::chrono::hours(24 * 365);  // never
  copts.safeguards = o.safeguards;
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
  if (o.evaluate) w.eval = std::thread([&w, map = view.map] { EvaluationLoop(w, w.keys, map); });

  w.partitions.Configure(samples, view.partition_count);
  w.partitions.Sync(view.partitions);
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
                 w.partitions.owned(), w.partitions.count(), w.batch, view.start_clock);
  }
  w.result.id = w.id;
  w.result.rank = w.rank;
  w.clock_next = view.start_clock;
  w.t0 = w.window_start = w.clock->Now();
  w.next_progress = w.t0 + o.progress_interval;
  w.phase = Impl::Phase::kTraining;
  return absl::OkStatus();
}

std::optional<BatchPlan> Trainer::NextBatch() {
  Impl& w = *impl_;
  const TrainerOptions& o = w.options;
  if (w.planned && w.round.open && w.stream_batch) {
    // A round's step planned and not trained: its batch is read again.
    MutexLock lock(w.mu);
    w.chunks->Unplan();
  }
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
    // iterations (in mode local: between rounds), with every push
    // acknowledged; heartbeats go on.
    MutexLock lock(w.mu);
    bool logged = false;
    while (!w.round.open && w.view.pause_at != 0 && w.clock_next >= w.view.pause_at &&
           !w.Stopping()) {
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
  // A round dies with the job's stop: its positions never moved.
  if (w.Stopping()) return std::nullopt;
  if (w.data_stream) {
    // The oldest chunk with samples left; the job stops when every epoch
    // is trained (the monitor says so), not when our chunks run out.
    BatchPlan& plan = w.plan;
    plan.clock = w.round.open ? w.round.clock : w.clock_next;
    plan.assigned = static_cast<uint32_t>(w.batch);
    plan.partition = 0;
    plan.chunk = 0;
    plan.samples.clear();
    MutexLock lock(w.mu);
    // In a round, after the batches of its earlier steps.
    std::optional<ChunkReader::Batch> b =
        w.chunks->Plan(static_cast<size_t>(w.batch), /*add=*/w.round.open);
    if (!b && w.round.open) {
      // Nothing more at hand: the round ends here, and the next one starts
      // (past a hold, with what the next heartbeats bring).
      lock.Unlock();
      if (!w.EndRound().ok()) return std::nullopt;
      return NextBatch();
    }
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
  // Partitions change hands between rounds only: a partition moving away
  // is let go once the monitor holds its position.
  if (!w.round.open) w.partitions.Sync(owned);
  BatchPlan& plan = w.plan;
  plan.clock = w.round.open ? w.round.clock : w.clock_next;
  plan.assigned = static_cast<uint32_t>(w.batch);
  bool more = w.partitions.Plan(static_cast<size_t>(w.batch), w.epochs, w.seed, &plan);
  w.epoch = w.partitions.epoch();
  if (w.round.open && (!more || plan.samples.empty())) {
    // Every partition ran its epochs (or none is ours): the round ends
    // here, and the next plan comes from where it left the positions (a
    // round not taken rewound them).
    if (!w.EndRound().ok()) return std::nullopt;
    return NextBatch();
  }
  if (!more) {
    w.done = true;  // every partition we own has run its epochs
    return std::nullopt;
  }
  w.planned = true;
  return plan;
}

absl::StatusOr<int64_t> Trainer::Pull(const std::function<void()>& while_in_flight) {
  Impl& w = *impl_;
  if (!w.planned) return absl::FailedPreconditionError("Pull before NextBatch");
  PsClient& client = *w.client;
  if (w.local && w.round.open) {
    // A local step of the round: params() is the caller's own.
    w.compute_start = w.compute_begin = w.clock->Now();
    w.positions_wait = Duration{};
    if (while_in_flight) while_in_flight();
    return w.pulled;
  }
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
  if (w.local) {
    // A round begins: the change of the parameters from here is its push.
    Impl::Round& r = w.round;
    r.open = true;
    r.clock = w.plan.clock;
    r.began = w.compute_start;
    r.samples = 0;
    r.compute = 0;
    r.trained_steps = 0;
    r.steps.clear();
    r.start.assign(client.params().begin(), client.params().end());
  }
  if (!ran && while_in_flight) while_in_flight();
  return pulled;
}

GradientSink* Trainer::StartPush(double stretch) {
  Impl& w = *impl_;
  if (!w.planned || !w.client) return nullptr;
  // Mode local: a local step sends nothing.
  w.layer_wise = w.options.overlap && !w.plan.samples.empty() && !w.local;
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
  if (w.local) {
    pusher.Finish();  // the compute, stretched for a straggler's emulation
    w.pusher.reset();
    return w.LocalStep(loss, ToSeconds(w.clock->Now() - w.compute_begin));
  }
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

absl::Status Trainer::Impl::LocalStep(float loss, double compute_seconds) {
  const size_t this_batch = plan.samples.size();
  if (this_batch == 0) loss = static_cast<float>(loss_ewma);
  if (std::isnan(loss)) loss = static_cast<float>(loss_ewma);  // not told
  loss_ewma = result.clocks == 0 && round.steps.empty() ? loss : 0.9 * loss_ewma + 0.1 * loss;
  if (this_batch == static_cast<size_t>(batch)) {
    // Timed for the policy, as a step of the other modes is (a short tail
    // is not); a local step's communication is none.
    MutexLock lock(mu);
    ++window.iterations;
    window.samples += this_batch;
    window.compute += compute_seconds;
    const double b = static_cast<double>(this_batch);
    window.batch_squares += b * b;
    window.batch_compute += b * compute_seconds;
    window.AddRange(compute_seconds, compute_seconds);
  }
  if (std::FILE* f = step_log.get()) {
    std::fprintf(f, "%.6f %lu %zu %.6f %.6f %.6f\n", ToSeconds(compute_start - t0),
                 static_cast<unsigned long>(plan.clock), this_batch, compute_seconds, 0.0, 0.0);
    std::fflush(f);
  }
  // The step's samples are the round's now; its read position moves here
  // only (the stream's chunks keep it in flight until the round's ack).
  if (partitions.reading()) {
    round.steps.push_back({std::to_string(plan.partition), std::nullopt, plan.epoch, plan.samples});
    partitions.Consumed(this_batch, /*publish=*/false);
  } else if (stream_batch) {
    round.steps.push_back({std::to_string(plan.chunk), plan.chunk, plan.epoch, plan.samples});
  } else {
    round.steps.push_back({});
  }
  if (this_batch > 0) ++round.trained_steps;
  round.samples += this_batch;
  round.compute += compute_seconds;
  if (metrics) {
    metrics->compute->Observe(compute_seconds);
    metrics->local_steps->Increment();
  }
  if (RoundDue()) return EndRound();
  return absl::OkStatus();
}

bool Trainer::Impl::RoundDue() const {
  if (round_steps > 0 && round.trained_steps >= round_steps) return true;
  return round_seconds > 0 && ToSeconds(clock->Now() - round.began) >= round_seconds;
}

absl::Status Trainer::Impl::EndRound() {
  PsClient& c = *client;
  round.open = false;
  std::span<float> params = c.params(), grads = c.grads();
  // The round's push: the change of the parameters since its pull (start
  // minus end, a gradient's sign), weighted at the shards by its samples.
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = round.start[i] - params[i];
  const TimePoint push_start = clock->Now();
  {
    // The monitor holds the previous round's positions first: a
    // replacement repeats at most this round.
    MutexLock lock(mu);
    WaitForReportedPositions(lock);
  }
  const uint32_t samples = static_cast<uint32_t>(round.samples);
  absl::Status pushed = c.Push(round.clock, samples);
  while (pushed.code() == absl::StatusCode::kAborted) {
    pushed = RefreshMap(c);
    if (pushed.ok()) pushed = c.Push(round.clock, samples, /*retry=*/true);
  }
  const double communication = pull_seconds - waited + ToSeconds(clock->Now() - push_start);
  if (!pushed.ok()) {
    // Not taken: the round's samples are read again.
    partitions.Rewind();
    if (data_stream) {
      MutexLock lock(mu);
      chunks->Drop();
    }
    if (Stopping()) return pushed;
    if (WireCode(pushed) == wire::ErrorCode::Stale) {
      // Our round closed without us: catch up, losing only this round.
      auto latest = c.Pull(round.clock, /*latest=*/true);
      if (latest.ok()) {
        spdlog::info("worker {}: round {} already closed; moving to {}", id, round.clock,
                     *latest + 1);
        clock_next = static_cast<uint64_t>(*latest + 1);
        return absl::OkStatus();
      }
    }
    failure = pushed;
    return pushed;
  }
  // Taken by every shard: the round's positions move, its samples count.
  LogAck(round.clock, round.samples);
  if (partitions.owned() > 0) partitions.Publish();
  std::set<uint64_t> acked;  // the chunks whose positions moved
  if (data_stream) {
    MutexLock lock(mu);
    acked = chunks->Ack();
    ++progress;
  }
  progress_cv.notify_all();
  if (std::FILE* f = sample_log.get()) {
    std::fprintf(f, "round %lu\n", static_cast<unsigned long>(round.clock));
  }
  for (const Round::Step& s : round.steps) {
    // A chunk the monitor took back mid-round (this worker was past its
    // lease) is read again elsewhere: its steps are not logged as trained.
    if (s.chunk && !acked.count(*s.chunk)) continue;
    if (!s.source.empty()) LogSamples(s.source, s.epoch, s.samples);
    if (options.on_push_acked) options.on_push_acked(c.push_seq(), round.clock, s.samples);
  }
  if (metrics) {
    metrics->rounds->Increment();
    metrics->round_steps->Set(static_cast<double>(round.steps.size()));
  }
  spdlog::debug("worker {}: round {}: {} local steps, {} samples, {:.3f} s computing", id,
                round.clock, round.steps.size(), round.samples, round.compute);
  round.steps.clear();
  Trained(round.clock, round.samples, round.compute, communication);
  return absl::OkStatus();
}

void Trainer::Impl::LogAck(uint64_t clock, size_t this_batch) {
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
}

void Trainer::Impl::Acknowledged(double compute_seconds, double communication) {
  const uint64_t clock = plan.clock;
  const size_t this_batch = plan.samples.size();
  LogAck(clock, this_batch);
  if (partitions.reading()) {
    // Consumed: record it, move the partition's position, tell the monitor.
    LogSamples(std::to_string(plan.partition));
    partitions.Consumed(this_batch);
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
    // Fresh parameters for clock c have every clock before it applied.
    const int64_t behind = static_cast<int64_t>(clock) - 1 - pulled;
    metrics->staleness->Observe(static_cast<double>(std::max<int64_t>(0, behind)));
  }
  Trained(clock, this_batch, compute_seconds, communication);
}

void Trainer::Impl::Trained(uint64_t clock, size_t samples, double compute_seconds,
                            double communication) {
  if (metrics) {
    metrics->communication->Observe(communication);
    metrics->wait->Observe(waited);
    metrics->iterations->Increment();
    metrics->samples->Increment(static_cast<double>(samples));
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
  result.samples += samples;
  window_samples += samples;
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
  const double ep = data_stream ? epoch : partitions.EpochProgress();
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
  if (w.local && w.round.open && w.round.trained_steps > 0 && w.client && w.failure.ok() &&
      !w.Stopping()) {
    // A loop that ended by itself (its own epochs, a break): its round's
    // steps are pushed, not lost. (A stop or Cancel loses the round.)
    if (w.planned && w.stream_batch) {
      MutexLock lock(w.mu);
      w.chunks->Unplan();
    }
    w.planned = false;
    if (absl::Status s = w.EndRound(); !s.ok()) {
      spdlog::warn("worker {}: its last round was not taken: {}", w.id, s.ToString());
    }
  }
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
