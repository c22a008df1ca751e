#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>

#include "ps/rpc.h"
#include "spdlog/spdlog.h"
#include "worker/cpu_backend.h"

namespace pacer::worker {

std::vector<wire::KeyLen> BlockKeys(size_t num_params, size_t block_floats) {
  std::vector<wire::KeyLen> keys;
  block_floats = std::max<size_t>(1, block_floats);
  for (size_t off = 0, k = 0; off < num_params; off += block_floats, ++k) {
    keys.emplace_back(k, std::min(block_floats, num_params - off));
  }
  return keys;
}

namespace {

// What the latest heartbeat reply said, shared with the training thread.
struct JobView {
  wire::JobState state = wire::JobState::Waiting;
  bool have_map = false;
  ShardMapInfo map;
  uint64_t start_clock = 0;
  uint32_t partition_index = 0;
  uint32_t partition_count = 1;
  uint32_t batch = 0;       // the current assignment
  bool evaluate = false;    // this worker evaluates the test set
  std::string stop_reason;
  absl::Status error;  // set when the monitor refuses us
};

}  // namespace

struct Worker::Impl {
  Transport* transport;
  WorkerOptions options;
  const Clock* clock;
  std::atomic<bool>* cancel;

  uint32_t id = 0;
  uint32_t rank = 0;
  uint64_t job_id = 0;
  // Job settings from the register reply.
  uint32_t epochs = 0;
  uint64_t seed = 1;
  double eval_interval = 1.0;
  Duration heartbeat_interval = std::chrono::milliseconds(100);

  std::mutex mu;
  std::condition_variable cv;
  JobView view;                       // guarded by mu
  std::atomic<uint64_t> clock_now{0};
  std::atomic<float> samples_per_second{0};
  std::atomic<bool> done{false};      // finished its epochs
  std::atomic<bool> stop{false};      // the job stopped (or we must stop)
  std::atomic<bool> heartbeat_exit{false};
  // The newest shard-map version the monitor announced (view.map holds it).
  std::atomic<uint64_t> map_version{0};
  // Timings since the last heartbeat, for the policy (guarded by mu).
  struct Window {
    uint32_t iterations = 0;
    uint64_t samples = 0;
    double compute = 0, communication = 0, wait = 0;
  } window;

  Dataset train;
  std::unique_ptr<ComputeBackend> backend;
  std::vector<wire::KeyLen> keys;

  absl::Status Register(RpcChannel& monitor);
  void HeartbeatLoop(std::unique_ptr<RpcChannel> monitor);
  void EvalLoop(ShardMapInfo map);
  // Switches `client` to the newest shard map if it is behind.
  absl::Status RefreshMap(PsClient& client);
  RpcOptions Rpc() const {
    RpcOptions r;
    r.job_id = job_id;
    r.sender = id;
    r.max_message_bytes = options.max_message_bytes;
    return r;
  }
};

Worker::Worker(Transport* transport, const WorkerOptions& options) : impl_(new Impl()) {
  impl_->transport = transport;
  impl_->options = options;
  impl_->clock = transport->clock();
  impl_->cancel = &cancel_;
}

Worker::~Worker() = default;

absl::Status Worker::Impl::Register(RpcChannel& monitor) {
  const TimePoint give_up = clock->Now() + options.start_timeout;
  // A token that names this worker instance, so that a retried registration
  // (the first may still be queued) gets the same id instead of a new one.
  std::random_device rd;
  const std::string token = "worker-" + std::to_string(getpid()) + "-" +
                            std::to_string((uint64_t{rd()} << 32) | rd());
  for (;;) {
    flatbuffers::FlatBufferBuilder fbb(128);
    auto body = wire::CreateRegisterDirect(fbb, wire::Role::Worker, token.c_str());
    auto reply = monitor.Call(fbb, body, std::min(give_up, clock->Now() + std::chrono::seconds(1)));
    if (reply.ok() && reply->type() == wire::Body::RegisterReply) {
      const auto* r = reply->As<wire::RegisterReply>();
      id = r->id();
      rank = r->rank();
      job_id = reply->env.job_id;
      if (r->job() != nullptr) {
        epochs = r->job()->epochs();
        seed = r->job()->seed();
        eval_interval = r->job()->eval_interval_seconds();
        heartbeat_interval = std::chrono::milliseconds(std::max<uint32_t>(1, r->job()->heartbeat_interval_ms()));
      }
      return absl::OkStatus();
    }
    absl::Status s = reply.ok() ? absl::InternalError("unexpected register reply") : reply.status();
    if (WireCode(s) == wire::ErrorCode::Refused || WireCode(s) == wire::ErrorCode::WrongVersion) {
      return s;
    }
    if (clock->Now() >= give_up || cancel->load()) {
      return absl::DeadlineExceededError("could not register with monitor " + options.monitor +
                                         ": " + std::string(s.message()));
    }
    clock->SleepUntil(clock->Now() + std::chrono::milliseconds(100));
  }
}

void Worker::Impl::HeartbeatLoop(std::unique_ptr<RpcChannel> monitor) {
  while (!heartbeat_exit) {
    const TimePoint next = clock->Now() + heartbeat_interval;
    const bool finishing = done.load();
    Window t;
    {
      std::lock_guard<std::mutex> lock(mu);
      t = window;
      window = Window{};
    }
    const double iters = std::max<uint32_t>(1, t.iterations);
    flatbuffers::FlatBufferBuilder fbb(128);
    auto body = wire::CreateHeartbeat(
        fbb, wire::Role::Worker, clock_now.load(), samples_per_second.load(), finishing,
        t.iterations, static_cast<uint32_t>(std::lround(t.samples / iters)),
        static_cast<float>(t.compute / std::max<double>(1, t.samples)),
        static_cast<float>(t.communication / iters), static_cast<float>(t.wait / iters),
        options.max_batch);
    auto reply = monitor->Call(fbb, body, clock->Now() + std::max(heartbeat_interval * 5,
                                                                  Duration(std::chrono::seconds(1))));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!reply.ok() && t.iterations > 0) {
        // Not delivered: the timings go with the next heartbeat.
        window.iterations += t.iterations;
        window.samples += t.samples;
        window.compute += t.compute;
        window.communication += t.communication;
        window.wait += t.wait;
      }
      if (reply.ok() && reply->type() == wire::Body::HeartbeatReply) {
        const auto* r = reply->As<wire::HeartbeatReply>();
        view.state = r->state();
        if (r->shard_map() != nullptr && !view.have_map) {
          view.map = ShardMapFromWire(r->shard_map());
          view.have_map = true;
          view.start_clock = r->start_clock();
          view.partition_index = r->partition_index();
          view.partition_count = std::max<uint32_t>(1, r->partition_count());
          map_version = view.map.version;
        } else if (r->shard_map() != nullptr && r->shard_map()->version() > view.map.version) {
          // A shard moved (restarted elsewhere) or the key ranges changed.
          view.map = ShardMapFromWire(r->shard_map());
          map_version = view.map.version;
        }
        view.evaluate = r->evaluate();
        if (r->assignment() != nullptr && r->assignment()->batch_size() > 0) {
          view.batch = r->assignment()->batch_size();
        }
        if (r->state() == wire::JobState::Stopped) {
          view.stop_reason = r->stop_reason() ? r->stop_reason()->str() : "";
          stop = true;
        }
      } else if (!reply.ok() && WireCode(reply.status()) == wire::ErrorCode::NotMember) {
        view.error = absl::FailedPreconditionError("the monitor no longer counts this worker: " +
                                                   std::string(reply.status().message()));
        stop = true;
      } else if (!reply.ok()) {
        SPDLOG_DEBUG("heartbeat: {}", reply.status().ToString());
      }
    }
    cv.notify_all();
    if (finishing && reply.ok()) break;  // the monitor heard that we are done
    if (stop) break;
    clock->SleepUntil(next);
  }
}

absl::Status Worker::Impl::RefreshMap(PsClient& client) {
  if (map_version.load() <= client.map_version()) return absl::OkStatus();
  ShardMapInfo map;
  {
    std::lock_guard<std::mutex> lock(mu);
    map = view.map;
  }
  spdlog::info("worker {}: shard map v{} -> v{}", id, client.map_version(), map.version);
  return client.SetMap(map);
}

void Worker::Impl::EvalLoop(ShardMapInfo map) {
  // Every worker runs this loop; the one the monitor names (the live worker
  // with the lowest rank) evaluates. The test set is loaded when first needed.
  std::optional<Dataset> test;
  size_t n = 0;
  std::unique_ptr<ComputeBackend> eval_backend;
  ClientOptions copts;
  copts.rpc = Rpc();
  copts.request_timeout = std::chrono::seconds(10);
  copts.cancel = &heartbeat_exit;
  copts.latest_map_version = &map_version;
  auto client = PsClient::Create(transport, copts, map, keys);
  auto monitor = RpcChannel::Connect(transport, options.monitor, Rpc());
  if (!client.ok() || !monitor.ok()) return;
  std::unique_lock<std::mutex> lock(mu);
  while (!heartbeat_exit) {
    // `cv` also wakes on every heartbeat: wait out the whole interval.
    const TimePoint next = clock->Now() + FromSeconds(eval_interval);
    while (!heartbeat_exit && !clock->WaitUntil(cv, lock, next)) {
    }
    if (heartbeat_exit) break;
    if (!view.evaluate) continue;
    lock.unlock();
    if (!test) {
      auto loaded = LoadFashionMnist(options.dataset_dir, /*train=*/false);
      if (!loaded.ok()) {
        spdlog::error("worker {}: cannot load the test set: {}", id, loaded.status().ToString());
        return;
      }
      test = std::move(*loaded);
      n = test->size();
      if (options.test_limit > 0) n = std::min(n, options.test_limit);
      eval_backend = MakeCpuBackend(options.model);
      if (eval_backend == nullptr) return;
      spdlog::info("worker {}: evaluating the test set for the monitor", id);
    }
    if (absl::Status s = RefreshMap(**client); !s.ok()) {
      spdlog::warn("worker {}: evaluation: {}", id, s.ToString());
    }
    auto applied = (*client)->Pull(0, /*latest=*/true);
    if (applied.ok()) {
      EvalResult r = eval_backend->Evaluate((*client)->params(), test->images.data(),
                                            test->labels.data(), n);
      flatbuffers::FlatBufferBuilder fbb(128);
      auto body = wire::CreateAccuracyReport(fbb, static_cast<uint64_t>(std::max<int64_t>(0, *applied)),
                                             static_cast<float>(r.accuracy),
                                             static_cast<float>(r.loss), static_cast<uint32_t>(r.samples));
      auto ack = (*monitor)->Call(fbb, body, clock->Now() + std::chrono::seconds(2));
      if (!ack.ok()) SPDLOG_DEBUG("accuracy report: {}", ack.status().ToString());
    }
    lock.lock();
  }
}

absl::StatusOr<WorkerResult> Worker::Run() {
  Impl& w = *impl_;
  const WorkerOptions& o = w.options;
  // Data first: a registered worker is a member the barrier waits for.
  auto train = LoadFashionMnist(o.dataset_dir, /*train=*/true);
  if (!train.ok()) return train.status();
  w.train = std::move(*train);
  if (o.train_limit > 0 && o.train_limit < w.train.size()) {
    w.train.labels.resize(o.train_limit);
    w.train.images.resize(o.train_limit * w.train.features());
  }
  w.backend = MakeCpuBackend(o.model);
  if (w.backend == nullptr) return absl::InvalidArgumentError("invalid model layer widths");
  w.keys = BlockKeys(w.backend->num_params(), o.block_floats);

  RpcOptions boot;
  boot.check_job = false;
  boot.max_message_bytes = o.max_message_bytes;
  auto monitor = RpcChannel::Connect(w.transport, o.monitor, boot);
  if (!monitor.ok()) return monitor.status();
  if (absl::Status s = w.Register(**monitor); !s.ok()) return s;
  spdlog::info("worker {}: registered as rank {} (job {})", w.id, w.rank, w.job_id);
  (*monitor)->options() = w.Rpc();
  {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto kv = fbb.CreateVectorOfStructs(w.keys);
    auto reply = (*monitor)->Call(fbb, wire::CreateDeclareModel(fbb, kv, 0),
                                  w.clock->Now() + std::chrono::seconds(5));
    if (!reply.ok()) return reply.status();
  }
  std::thread heartbeat([&w, m = std::move(*monitor)]() mutable { w.HeartbeatLoop(std::move(m)); });
  struct Joiner {
    Impl& w;
    std::thread& t;
    ~Joiner() {
      w.heartbeat_exit = true;
      w.cv.notify_all();
      if (t.joinable()) t.join();
    }
  } join_heartbeat{w, heartbeat};

  // Wait for the run to start.
  JobView view;
  {
    std::unique_lock<std::mutex> lock(w.mu);
    const TimePoint give_up = w.clock->Now() + o.start_timeout;
    while (!(w.view.state == wire::JobState::Running && w.view.have_map) && !w.stop && !cancel_) {
      if (w.clock->WaitUntil(w.cv, lock, give_up)) {
        return absl::DeadlineExceededError("the job did not start in time");
      }
    }
    view = w.view;
  }
  if (!view.error.ok()) return view.error;
  if (w.stop || cancel_) {
    WorkerResult r;
    r.id = w.id;
    r.rank = w.rank;
    r.stop_reason = view.stop_reason;
    return r;
  }

  ClientOptions copts;
  copts.rpc = w.Rpc();
  copts.request_timeout = o.request_timeout;
  copts.cancel = &w.stop;
  copts.latest_map_version = &w.map_version;
  auto client_or = PsClient::Create(w.transport, copts, view.map, w.keys);
  if (!client_or.ok()) return client_or.status();
  PsClient& client = **client_or;

  if (w.rank == 0) {
    w.backend->InitParams(w.seed, client.params());
    if (absl::Status s = client.Init(); !s.ok()) return s;
    spdlog::info("worker {}: initialised {} parameters on {} shard(s)", w.id,
                 w.backend->num_params(), view.map.shards.size());
  }
  std::thread eval([&w, map = view.map] { w.EvalLoop(map); });
  struct EvalJoiner {
    Impl& w;
    std::thread& t;
    ~EvalJoiner() {
      w.heartbeat_exit = true;
      w.cv.notify_all();
      if (t.joinable()) t.join();
    }
  } join_eval{w, eval};

  // This worker's partition of the training set.
  const size_t n = w.train.size();
  const size_t begin = n * view.partition_index / view.partition_count;
  const size_t end = n * (view.partition_index + 1) / view.partition_count;
  std::vector<uint32_t> order(end - begin);
  std::iota(order.begin(), order.end(), static_cast<uint32_t>(begin));
  int batch = static_cast<int>(std::max<uint32_t>(1, view.batch));
  if (order.size() < static_cast<size_t>(batch)) {
    return absl::FailedPreconditionError(
        "data partition " + std::to_string(view.partition_index) + " has " +
        std::to_string(order.size()) + " samples, fewer than one batch of " +
        std::to_string(batch));
  }
  const size_t features = w.train.features();
  std::vector<float> x;
  std::vector<uint8_t> y;
  spdlog::info("worker {}: partition {}/{} (samples {}..{}), batch {}, from clock {}", w.id,
               view.partition_index, view.partition_count, begin, end, batch, view.start_clock);
  if (o.slowdown != 1.0 || !o.slowdown_schedule.empty()) {
    spdlog::info("worker {}: emulating a straggler: compute slowed {}x{}", w.id, o.slowdown,
                 o.slowdown_schedule.empty() ? "" : " before its schedule");
  }

  WorkerResult result;
  result.id = w.id;
  result.rank = w.rank;
  uint64_t clock = view.start_clock;
  size_t cursor = order.size();  // forces a shuffle at the start
  uint32_t epoch = 0;
  const TimePoint t0 = w.clock->Now();
  TimePoint next_progress = t0 + o.progress_interval;
  uint64_t window_samples = 0;
  TimePoint window_start = t0;
  double loss_ewma = 0;
  const bool tty = o.live_progress;
  absl::Status failure;

  double last_factor = SlowdownAt(o.slowdown_schedule, o.slowdown, 0);
  while (!w.stop && !cancel_) {
    {
      // A new assignment takes effect here, between iterations.
      std::lock_guard<std::mutex> lock(w.mu);
      uint32_t cap = static_cast<uint32_t>(order.size());
      if (o.max_batch > 0) cap = std::min(cap, o.max_batch);  // our memory limit
      const int assigned = static_cast<int>(std::clamp<uint32_t>(w.view.batch, 1, cap));
      if (assigned != batch) {
        SPDLOG_DEBUG("worker {}: batch {} -> {} at clock {}", w.id, batch, assigned, clock);
        batch = assigned;
      }
    }
    if (static_cast<size_t>(batch) > y.size()) {
      x.resize(static_cast<size_t>(batch) * features);
      y.resize(static_cast<size_t>(batch));
    }
    if (cursor + static_cast<size_t>(batch) > order.size()) {
      // Start the next epoch; the tail shorter than a batch is skipped.
      if (w.epochs > 0 && epoch == w.epochs) break;
      std::mt19937_64 rng(w.seed * 1000003 + w.rank * 7919 + epoch);
      std::shuffle(order.begin(), order.end(), rng);
      cursor = 0;
      ++epoch;
    }
    if (o.before_iteration) o.before_iteration(clock);
    if (w.stop || cancel_) break;
    const TimePoint pull_start = w.clock->Now();
    absl::StatusOr<int64_t> pulled;
    do {
      if (absl::Status s = w.RefreshMap(client); !s.ok()) {
        pulled = s;
        break;
      }
      pulled = client.Pull(clock);
    } while (!pulled.ok() && pulled.status().code() == absl::StatusCode::kAborted);
    if (!pulled.ok()) {
      if (w.stop || cancel_) break;
      failure = pulled.status();
      break;
    }
    const TimePoint compute_start = w.clock->Now();
    const double pull_seconds = ToSeconds(compute_start - pull_start);
    const double waited = std::min(pull_seconds, client.last_wait_seconds());
    for (int i = 0; i < batch; ++i) {
      uint32_t s = order[cursor + static_cast<size_t>(i)];
      std::memcpy(x.data() + static_cast<size_t>(i) * features,
                  w.train.images.data() + static_cast<size_t>(s) * features, features * sizeof(float));
      y[static_cast<size_t>(i)] = w.train.labels[s];
    }
    const std::span<const uint32_t> batch_samples(order.data() + cursor, static_cast<size_t>(batch));
    cursor += static_cast<size_t>(batch);
    float loss = w.backend->ComputeGradient(client.params(), x.data(), y.data(), batch, client.grads());
    // Straggler emulation: stretch this iteration's compute by sleeping.
    const double factor = SlowdownAt(o.slowdown_schedule, o.slowdown, ToSeconds(compute_start - t0));
    if (factor != last_factor) {
      spdlog::info("worker {}: slowdown now {}x", w.id, factor);
      last_factor = factor;
    }
    if (factor > 1.0) {
      const Duration spent = w.clock->Now() - compute_start;
      w.clock->SleepUntil(w.clock->Now() + std::chrono::duration_cast<Duration>(spent * (factor - 1.0)));
    }
    const TimePoint push_start = w.clock->Now();
    const double compute_seconds = ToSeconds(push_start - compute_start);
    loss_ewma = result.clocks == 0 ? loss : 0.9 * loss_ewma + 0.1 * loss;
    // A shard-map change mid-push: the same push (same seq) to the new map.
    absl::Status pushed = client.Push(clock, static_cast<uint32_t>(batch));
    while (pushed.code() == absl::StatusCode::kAborted) {
      pushed = w.RefreshMap(client);
      if (pushed.ok()) pushed = client.Push(clock, static_cast<uint32_t>(batch), /*retry=*/true);
    }
    // Timings count even when the push comes too late (backup mode drops it).
    const double communication = pull_seconds - waited + ToSeconds(w.clock->Now() - push_start);
    {
      std::lock_guard<std::mutex> lock(w.mu);
      ++w.window.iterations;
      w.window.samples += static_cast<uint64_t>(batch);
      w.window.compute += compute_seconds;
      w.window.communication += communication;
      w.window.wait += waited;
    }
    if (!pushed.ok()) {
      if (w.stop || cancel_) break;
      if (WireCode(pushed) == wire::ErrorCode::Stale) {
        // Our clock closed without us (we joined late or were slow): catch up.
        auto latest = client.Pull(clock, /*latest=*/true);
        if (latest.ok()) {
          spdlog::info("worker {}: clock {} already closed; moving to {}", w.id, clock, *latest + 1);
          clock = static_cast<uint64_t>(*latest + 1);
          continue;
        }
      }
      failure = pushed;
      break;
    }
    if (o.on_push_acked) o.on_push_acked(client.push_seq(), clock, batch_samples);
    result.compute_seconds += compute_seconds;
    result.communication_seconds += communication;
    result.wait_seconds += waited;
    result.last_batch = static_cast<uint32_t>(batch);
    ++clock;
    ++result.clocks;
    result.samples += static_cast<uint64_t>(batch);
    window_samples += static_cast<uint64_t>(batch);
    w.clock_now = clock;
    result.last_loss = loss_ewma;
    const TimePoint now = w.clock->Now();
    if (now >= next_progress) {
      double sps = window_samples / std::max(1e-9, ToSeconds(now - window_start));
      w.samples_per_second = static_cast<float>(sps);
      double ep = epoch - 1 + static_cast<double>(cursor) / std::max<size_t>(1, order.size());
      if (tty) {
        std::fprintf(stderr, "\rworker %u  epoch %.2f  clock %lu  loss %.4f  %.0f samples/s   ", w.id,
                     std::max(0.0, ep), static_cast<unsigned long>(clock), loss_ewma, sps);
        std::fflush(stderr);
      } else {
        spdlog::info("epoch {:.2f} clock {} loss {:.4f} {:.0f} samples/s", std::max(0.0, ep), clock,
                     loss_ewma, sps);
      }
      window_samples = 0;
      window_start = now;
      next_progress = now + o.progress_interval;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  result.seconds = ToSeconds(w.clock->Now() - t0);
  if (!failure.ok() && !w.stop) return failure;
  if (!w.stop) {
    // Finished our epochs: tell the monitor, so the barrier stops waiting for us.
    w.done = true;
    spdlog::info("worker {}: finished {} epoch(s) at clock {}", w.id, epoch, clock);
  }
  {
    std::lock_guard<std::mutex> lock(w.mu);
    if (!w.view.error.ok()) return w.view.error;
    result.stop_reason = w.view.stop_reason.empty() ? "finished" : w.view.stop_reason;
  }
  if (w.done) {
    // Let the heartbeat thread deliver the news before it exits.
    w.clock->SleepUntil(w.clock->Now() + w.heartbeat_interval * 2);
  }
  return result;
}

}  // namespace pacer::worker
