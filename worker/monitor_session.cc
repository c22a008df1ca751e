#include "worker/monitor_session.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "spdlog/spdlog.h"

namespace pacer::worker {
namespace {

// The least time a heartbeat waits for its reply (at least twice the interval).
constexpr Duration kMinHeartbeatWait = std::chrono::milliseconds(250);

}  // namespace

absl::Status MonitorSession::Register(RpcChannel& monitor) {
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
    request.rank_hint = options.rank_hint;
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
        round_steps = r.job->round_steps;
        round_seconds = r.job->round_seconds;
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

void MonitorSession::HeartbeatLoop(std::unique_ptr<RpcChannel> monitor) {
  RuntimeFaults runtime_faults(options.faults);
  while (!heartbeat_exit) {
    const TimePoint next = clock->Now() + heartbeat_interval;
    const bool finishing = done.load();
    TimingWindow t;
    msg::Heartbeat hb;
    std::vector<wire::PartitionPosition> pos;
    uint64_t sending = 0;
    bool paused_now = false;
    {
      MutexLock lock(mu);
      t = window;
      window = TimingWindow{};
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
          if (options.safeguards.On(Safeguard::kStopInterrupt)) interrupt = true;
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

absl::Status MonitorSession::RefreshMap(PsClient& client) {
  if (map_version.load() <= client.map_version()) return absl::OkStatus();
  ShardMapInfo map;
  {
    MutexLock lock(mu);
    map = view.map;
  }
  spdlog::info("worker {}: shard map v{} -> v{}", id, client.map_version(), map.version);
  return client.SetMap(map);
}

}  // namespace pacer::worker
