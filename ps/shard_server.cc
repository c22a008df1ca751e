#include "ps/shard_server.h"

#include <random>

#include "absl/strings/str_format.h"

#include "ps/base/rpc.h"
#include "spdlog/spdlog.h"

namespace pacer {
absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    Transport* transport, const ShardServerOptions& options) {
  if (options.monitor.empty()) return absl::InvalidArgumentError("a shard needs --monitor");
  std::unique_ptr<ShardServer> s(new ShardServer());
  s->transport_ = transport;
  s->options_ = options;
  s->registry_ = options.shard.registry ? options.shard.registry
                                        : std::make_shared<prometheus::Registry>();
  auto router = transport->Bind(options.listen);
  if (!router.ok()) return router.status();
  s->router_ = std::move(*router);
  s->address_ = s->router_->address();
  const std::string advertised = options.advertise.empty() ? s->address_ : options.advertise;

  // The latest snapshot, if this shard ran here before.
  std::optional<ShardSnapshot> snapshot;
  std::unique_ptr<CheckpointStore> store;
  if (!options.data_dir.empty()) {
    auto dir = DataDirPath(options.data_dir, "checkpoint");
    if (!dir.ok()) return dir.status();
    const std::string path = *dir;
    auto opened = CheckpointStore::Open(path);
    if (!opened.ok()) return opened.status();
    store = std::move(*opened);
    const TimePoint t0 = transport->clock()->Now();
    auto loaded = store->Load();
    if (!loaded.ok()) {
      return absl::DataLossError("the checkpoint in " + path + " cannot be read (" +
                                 std::string(loaded.status().message()) +
                                 "); move it away to start this shard empty");
    }
    snapshot = std::move(*loaded);
    if (snapshot) {
      spdlog::info("loaded checkpoint of job {} shard {} ({} values, applied clock {}) from {} in "
                   "{:.3f} s",
                   snapshot->job_id, snapshot->shard_id, snapshot->table.params->size(),
                   snapshot->applied_clock, path, ToSeconds(transport->clock()->Now() - t0));
    }
  }

  RpcOptions ropts;
  ropts.check_job = false;  // the job id comes with the reply
  ropts.max_message_bytes = options.shard.max_message_bytes;
  auto monitor = RpcChannel::Connect(transport, options.monitor, ropts);
  if (!monitor.ok()) return monitor.status();
  s->monitor_ = std::move(*monitor);

  const Clock* clock = transport->clock();
  const uint64_t incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  const TimePoint give_up = clock->Now() + options.register_timeout;
  absl::Status last = absl::DeadlineExceededError("no reply");
  const TimePoint started = clock->Now();
  TimePoint next_notice = started + kWaitingNoticeFirst;
  for (;;) {
    if (const TimePoint now = clock->Now(); now >= next_notice) {
      spdlog::info("waiting for the monitor at {}: no answer for {:.0f} s (giving up after {:.0f} s, "
                   "--register-timeout)",
                   options.monitor, ToSeconds(now - started), ToSeconds(options.register_timeout));
      next_notice = now + kWaitingNoticeEvery;
    }
    const msg::Register request{wire::Role::Shard, advertised, snapshot ? snapshot->shard_id : 0,
                                snapshot ? snapshot->job_id : 0,
                                snapshot ? snapshot->map_version : 0, incarnation,
                                options.node};
    auto reply =
        s->monitor_->Call(request, std::min(give_up, clock->Now() + options.request_timeout));
    if (reply.ok()) {
      if (reply->type() != wire::Body::RegisterReply) {
        return absl::InternalError("monitor answered register with " +
                                   std::string(wire::EnumNameBody(reply->type())));
      }
      const msg::RegisterReply r = msg::Read<msg::RegisterReply>(*reply);
      ShardJob job;
      job.job_id = reply->env.job_id;
      if (r.job) {
        job.mode = r.job->mode;
        job.optimizer.kind = r.job->optimizer;
        job.optimizer.defaults = r.job->optimizer_settings;
        job.global_batch = r.job->global_batch;
        job.backup_workers = r.job->backup_workers;
        job.staleness_aware_lr = r.job->staleness_aware_lr;
      }
      s->id_ = r.id;
      if (snapshot && (snapshot->shard_id != s->id_ || snapshot->job_id != job.job_id)) {
        return absl::FailedPreconditionError(
            "the monitor gave id " + std::to_string(s->id_) + " in job " +
            std::to_string(job.job_id) + " to this shard, whose checkpoint is shard " +
            std::to_string(snapshot->shard_id) + " of job " + std::to_string(snapshot->job_id));
      }
      ShardOptions sopts = options.shard;
      sopts.registry = s->registry_;
      s->core_ = std::make_unique<ShardCore>(sopts, clock);
      s->core_->Configure(job, s->id_);
      if (snapshot) {
        if (absl::Status st = s->core_->Restore(*snapshot); !st.ok()) return st;
        s->restored_ = true;
      }
      s->monitor_->options().job_id = job.job_id;
      s->monitor_->options().sender = s->id_;
      s->monitor_->options().check_job = true;
      spdlog::info("shard {}: registered with {} (job {}, mode {})", s->id_, options.monitor,
                   job.job_id, wire::EnumNameMode(job.mode));
      break;
    }
    last = reply.status();
    if (WireCode(last) == wire::ErrorCode::Refused || WireCode(last) == wire::ErrorCode::WrongVersion) {
      return absl::FailedPreconditionError("monitor refused this shard: " + std::string(last.message()));
    }
    if (options.cancel != nullptr && options.cancel->load()) {
      return absl::CancelledError("stopped before the monitor answered");
    }
    if (clock->Now() >= give_up) {
      return absl::DeadlineExceededError("could not register with monitor " + options.monitor +
                                         ": " + std::string(last.message()));
    }
    clock->SleepUntil(clock->Now() + std::chrono::milliseconds(100));
  }
  if (store) {
    s->writer_ = std::make_unique<CheckpointWriter>(std::move(store), s->registry_,
                                                    options.checkpoint_interval, clock,
                                                    options.faults, s->id_);
  }
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  s->heartbeat_thread_ = std::thread([p = s.get()] { p->HeartbeatLoop(); });
  return s;
}

ShardServer::~ShardServer() {
  Shutdown();
  Wait();
}

void ShardServer::Wait() {
  if (thread_.joinable()) thread_.join();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

void ShardServer::MaybeCheckpoint(bool final) {
  if (!writer_) return;
  writer_->AgeSeconds();
  if (!core_->initialized()) return;  // nothing worth keeping yet
  const Clock* clock = transport_->clock();
  if (final) {
    const TimePoint t0 = clock->Now();
    ShardSnapshot snap = core_->Snapshot();
    snap.taken_unix = UnixSeconds();
    absl::Status st = writer_->Final(std::move(snap), t0 + options_.stop_timeout);
    if (!st.ok()) {
      stop_status_ = absl::DeadlineExceededError(
          "final checkpoint at applied clock " + std::to_string(core_->applied_clock()) +
          " given up after " + absl::StrFormat("%.1f", ToSeconds(options_.stop_timeout)) +
          " s (--stop-timeout): " + std::string(st.message()) + "; the previous checkpoint stays");
      spdlog::error("shard {}: {}", id_, std::string(stop_status_.message()));
      return;
    }
    spdlog::info("shard {}: final checkpoint at applied clock {} in {:.3f} s", id_,
                 core_->applied_clock(), ToSeconds(clock->Now() - t0));
    return;
  }
  const bool keys_moved = core_->key_version() != keys_at_checkpoint_;
  if (core_->updates_applied() == updates_at_checkpoint_ &&
      core_->applied_clock() == clock_at_checkpoint_ && !keys_moved) {
    return;  // nothing new since the last one
  }
  const TimePoint now = clock->Now();
  // Keys that moved in or out: at once, so that a restart has the new set.
  const bool on_time = keys_moved || (options_.checkpoint_interval > Duration::zero() &&
                                      now - last_checkpoint_ >= options_.checkpoint_interval);
  const bool on_count = options_.checkpoint_updates > 0 &&
                        core_->updates_applied() - updates_at_checkpoint_ >= options_.checkpoint_updates;
  if (!on_time && !on_count) return;
  if (!keys_moved && !options_.periodic_checkpoints && periodic_taken_ > 0) return;
  if (!keys_moved) ++periodic_taken_;
  // Shares the buffers: the copy-free hand-over that keeps this cheap.
  ShardSnapshot snap = core_->Snapshot();
  snap.taken_unix = UnixSeconds();
  if (!writer_->Offer(std::move(snap))) return;  // the previous one is still being written
  last_checkpoint_ = now;
  updates_at_checkpoint_ = core_->updates_applied();
  clock_at_checkpoint_ = core_->applied_clock();
  keys_at_checkpoint_ = core_->key_version();
}

void ShardServer::HeartbeatLoop() {
  const Clock* clock = transport_->clock();
  RuntimeFaults runtime_faults(options_.faults);
  while (!serving_ended_) {
    const TimePoint next = clock->Now() + options_.heartbeat_interval;
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    hb.clock = static_cast<uint64_t>(std::max<int64_t>(0, applied_clock_.load()));
    hb.checkpoint_age_seconds = writer_ ? static_cast<float>(writer_->AgeSeconds()) : -1.0f;
    auto reply = monitor_->Call(hb, clock->Now() + options_.request_timeout);
    if (reply.ok() && reply->type() == wire::Body::HeartbeatReply) {
      const msg::HeartbeatReply r = msg::Read<msg::HeartbeatReply>(*reply);
      if (r.state == wire::JobState::Stopped) {
        spdlog::info("shard {}: job stopped", id_);
        job_stopped_ = true;
        return;
      }
      runtime_faults.Apply(r.faults_version, r.faults);
      if (r.lr_overrides_version > 0) {
        std::lock_guard<std::mutex> lock(lr_mu_);
        if (!pending_lr_ || pending_lr_->first < r.lr_overrides_version) {
          pending_lr_.emplace(r.lr_overrides_version, r.lr_overrides);
        }
      }
    }
    if (!reply.ok()) SPDLOG_DEBUG("shard {}: heartbeat: {}", id_, ErrorText(reply.status()));
    // Sleep in short steps so that shutdown is prompt.
    while (!serving_ended_ && clock->Now() < next) {
      clock->SleepUntil(std::min(next, clock->Now() + std::chrono::milliseconds(20)));
    }
  }
  if (shutdown_) {
    // SIGTERM, after the final checkpoint: tell the monitor we leave.
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    hb.clock = static_cast<uint64_t>(std::max<int64_t>(0, applied_clock_.load()));
    hb.done = true;
    auto reply = monitor_->Call(hb, clock->Now() + options_.request_timeout);
    if (reply.ok()) {
      spdlog::info("shard {}: deregistered from the monitor", id_);
    } else {
      spdlog::warn("shard {}: could not deregister: {}", id_, ErrorText(reply.status()));
    }
  }
}

std::string ShardServer::NotReadyReason() const {
  if (shutdown_ || serving_ended_ || job_stopped_) return "leaving";
  if (holds_keys_ && !holds_values_) return "its key range has no values yet (waiting for Init)";
  return "";
}

void ShardServer::Run() {
  const Clock* clock = transport_->clock();
  std::vector<ShardCore::Outgoing> out;
  while (!shutdown_ && !job_stopped_) {
    const TimePoint deadline =
        std::min(core_->NextDeadline(), clock->Now() + std::chrono::milliseconds(100));
    Frames frames;
    auto got = transport_->Recv(router_.get(), &frames, deadline);
    if (!got.ok()) {
      spdlog::error("shard {}: receive failed: {}", id_, ErrorText(got.status()));
      break;
    }
    {
      // pacerctl set-lr, from the heartbeat thread: taken between messages.
      std::lock_guard<std::mutex> lock(lr_mu_);
      if (pending_lr_) {
        core_->SetLrOverrides(pending_lr_->first, pending_lr_->second);
        pending_lr_.reset();
      }
    }
    // One message, then its replies. A message queued behind it is taken by
    // the next Recv at once; asking for one here was a receive that usually
    // found nothing, a system call of about 1.3 us per message.
    if (*got) core_->Handle(std::move(frames), &out);
    core_->Tick(&out);
    for (auto& o : out) {
      o.frames.insert(o.frames.begin(), o.peer);
      absl::Status st = router_->Send(std::move(o.frames));
      if (!st.ok()) SPDLOG_DEBUG("shard {}: reply dropped: {}", id_, ErrorText(st));
    }
    out.clear();
    applied_clock_ = core_->applied_clock();
    holds_values_ = core_->initialized();
    holds_keys_ = core_->has_keys();
    MaybeCheckpoint(false);
    if (core_->stop_requested()) {
      spdlog::info("shard {}: stop received", id_);
      break;
    }
  }
  MaybeCheckpoint(true);
  spdlog::info("shard {}: final: steps {}, applied through clock {}, incomplete steps {}, "
               "updates applied {}, stale {}, dropped {}",
               id_, core_->steps(), core_->applied_clock(), core_->incomplete_steps(),
               core_->updates_applied(), core_->stale_pushes(), core_->dropped_pushes());
  if (core_->restored()) {
    spdlog::info("shard {}: since its restore: {} acknowledged push(es) lost, {} clock(s) closed "
                 "with none of their pushes",
                 id_, core_->lost_updates(), core_->skipped_clocks());
  }
  serving_ended_ = true;
  done_ = true;
}

}  // namespace pacer
