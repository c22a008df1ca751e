#include "ps/checkpoint_writer.h"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "prometheus/registry.h"
#include "ps/base/mutex.h"
#include "ps/base/rpc.h"
#include "ps/shard_metrics.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {
// How long the idle writer sleeps before it re-checks for work (a wait
// with a deadline; a hand-over wakes it at once).
constexpr Duration kIdleRecheck = std::chrono::seconds(1);
// How long destruction waits for the thread to end before leaving it.
constexpr Duration kJoinWait = std::chrono::seconds(1);
}  // namespace

struct CheckpointWriter::State {
  std::unique_ptr<CheckpointStore> store;
  std::shared_ptr<prometheus::Registry> registry;  // keeps the metrics below alive
  const Clock* clock = nullptr;
  std::shared_ptr<FaultInjector> faults;
  uint32_t shard = 0;
  double started_unix = 0;

  std::optional<CheckpointMetrics> metrics;

  Mutex mu;  // guards to_write, busy, exit, abandoned, done
  std::condition_variable cv;
  std::optional<ShardSnapshot> to_write ABSL_GUARDED_BY(mu);
  bool busy ABSL_GUARDED_BY(mu) = false;       // a snapshot is handed over and not yet written
  bool exit ABSL_GUARDED_BY(mu) = false;       // the thread ends once nothing is handed over
  bool abandoned ABSL_GUARDED_BY(mu) = false;  // a stop gave up waiting: write nothing more
  bool done ABSL_GUARDED_BY(mu) = false;  // the thread has ended
  std::atomic<double> last_success_unix{0};

  void Loop();
  // Writes one snapshot (after any slow_disk delay) and records the result.
  void Write(const ShardSnapshot& snap);
};

void CheckpointWriter::State::Loop() {
  for (;;) {
    std::optional<ShardSnapshot> snap;
    {
      MutexLock lock(mu);
      while (!to_write && !exit) clock->WaitUntil(cv, lock.native(), clock->Now() + kIdleRecheck);
      if (!to_write) break;
      snap = std::move(to_write);
      to_write.reset();
    }
    Write(*snap);
    snap.reset();  // lets go of the shared buffers before the shard's next step
    {
      MutexLock lock(mu);
      busy = false;
    }
    cv.notify_all();
  }
  {
    MutexLock lock(mu);
    done = true;
  }
  cv.notify_all();
}

void CheckpointWriter::State::Write(const ShardSnapshot& snap) {
  const TimePoint t0 = clock->Now();
  if (faults) {
    // Injected slow disk I/O (fault slow_disk): the write takes longer,
    // unless a stop gives it up meanwhile.
    const TimePoint until = t0 + faults->DiskDelay();
    MutexLock lock(mu);
    while (!abandoned && clock->Now() < until) clock->WaitUntil(cv, lock.native(), until);
  }
  {
    MutexLock lock(mu);
    if (abandoned) return;
  }
  absl::StatusOr<uint64_t> bytes = store->Save(snap);
  const double seconds = ToSeconds(clock->Now() - t0);
  if (!bytes.ok()) {
    metrics->failed->Increment();
    spdlog::error("shard {}: checkpoint failed: {}", shard, ErrorText(bytes.status()));
    return;
  }
  metrics->ok->Increment();
  metrics->seconds->Observe(seconds);
  metrics->bytes->Set(static_cast<double>(*bytes));
  last_success_unix = snap.taken_unix > 0 ? snap.taken_unix : UnixSeconds();
  metrics->last->Set(last_success_unix);
  SPDLOG_DEBUG("shard {}: checkpoint at applied clock {} ({} bytes in {:.3f} s)", shard,
               snap.applied_clock, *bytes, seconds);
}

CheckpointWriter::CheckpointWriter(std::unique_ptr<CheckpointStore> store,
                                   std::shared_ptr<prometheus::Registry> registry,
                                   Duration interval, const Clock* clock,
                                   std::shared_ptr<FaultInjector> faults, uint32_t shard,
                                   const prometheus::Labels& labels)
    : state_(std::make_shared<State>()) {
  State& s = *state_;
  s.store = std::move(store);
  s.registry = std::move(registry);
  s.clock = clock;
  s.faults = std::move(faults);
  s.shard = shard;
  s.started_unix = UnixSeconds();
  s.metrics.emplace(*s.registry, interval, labels);
  // The thread holds the state too: it can outlive this object.
  thread_ = std::thread([state = state_] { state->Loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  State& s = *state_;
  bool done = false;
  {
    MutexLock lock(s.mu);
    s.exit = true;
    s.cv.notify_all();
    const TimePoint until = s.clock->Now() + kJoinWait;
    while (!s.done && s.clock->Now() < until) s.clock->WaitUntil(s.cv, lock.native(), until);
    done = s.done;
  }
  if (done) {
    // Joined, so that the store is closed when this returns (a shard
    // restarted in the same process opens it again).
    thread_.join();
    return;
  }
  spdlog::warn("shard {}: the checkpoint writer is still in the disk; leaving it to finish",
               s.shard);
  thread_.detach();
}

bool CheckpointWriter::Offer(ShardSnapshot snap) {
  {
    MutexLock lock(state_->mu);
    if (state_->busy || state_->abandoned) return false;
    state_->busy = true;
    state_->to_write = std::move(snap);
  }
  state_->cv.notify_all();
  return true;
}

absl::Status CheckpointWriter::Final(ShardSnapshot snap, TimePoint deadline) {
  State& s = *state_;
  MutexLock lock(s.mu);
  auto give_up = [&](const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mu) {
    s.abandoned = true;
    s.cv.notify_all();
    return absl::DeadlineExceededError(why);
  };
  while (s.busy && s.clock->Now() < deadline) s.clock->WaitUntil(s.cv, lock.native(), deadline);
  if (s.busy) return give_up("the checkpoint before it was still being written");
  if (s.abandoned) return absl::FailedPreconditionError("an earlier stop gave the writer up");
  s.busy = true;
  s.to_write = std::move(snap);
  s.cv.notify_all();
  while (s.busy && s.clock->Now() < deadline) s.clock->WaitUntil(s.cv, lock.native(), deadline);
  if (s.busy) return give_up("its write had not finished");
  return absl::OkStatus();
}

double CheckpointWriter::last_success_unix() const { return state_->last_success_unix.load(); }

double CheckpointWriter::AgeSeconds() const {
  const double last = state_->last_success_unix.load();
  const double age = UnixSeconds() - (last > 0 ? last : state_->started_unix);
  state_->metrics->age->Set(age);
  return age;
}

}  // namespace pacer
