#include "ps/shard_server.h"

#include "ps/rpc.h"
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

  RpcOptions ropts;
  ropts.check_job = false;  // the job id comes with the reply
  ropts.max_message_bytes = options.shard.max_message_bytes;
  auto monitor = RpcChannel::Connect(transport, options.monitor, ropts);
  if (!monitor.ok()) return monitor.status();
  s->monitor_ = std::move(*monitor);

  const Clock* clock = transport->clock();
  const TimePoint give_up = clock->Now() + options.register_timeout;
  absl::Status last = absl::DeadlineExceededError("no reply");
  for (;;) {
    flatbuffers::FlatBufferBuilder fbb(256);
    auto body = wire::CreateRegisterDirect(fbb, wire::Role::Shard, s->address_.c_str());
    auto reply = s->monitor_->Call(fbb, body, std::min(give_up, clock->Now() + options.request_timeout));
    if (reply.ok()) {
      if (reply->type() != wire::Body::RegisterReply) {
        return absl::InternalError("monitor answered register with " +
                                   std::string(wire::EnumNameBody(reply->type())));
      }
      const auto* r = reply->As<wire::RegisterReply>();
      ShardJob job;
      job.job_id = reply->env.job_id;
      if (r->job() != nullptr) {
        job.mode = r->job()->mode();
        job.sgd.learning_rate = r->job()->learning_rate();
        job.sgd.momentum = r->job()->momentum();
        job.global_batch = r->job()->global_batch();
        job.backup_workers = r->job()->backup_workers();
        job.staleness_aware_lr = r->job()->staleness_aware_lr();
      }
      s->id_ = r->id();
      ShardOptions sopts = options.shard;
      sopts.registry = s->registry_;
      s->core_ = std::make_unique<ShardCore>(sopts, clock);
      s->core_->Configure(job, s->id_);
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
    if (clock->Now() >= give_up) {
      return absl::DeadlineExceededError("could not register with monitor " + options.monitor +
                                         ": " + std::string(last.message()));
    }
    clock->SleepUntil(clock->Now() + std::chrono::milliseconds(100));
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

void ShardServer::HeartbeatLoop() {
  const Clock* clock = transport_->clock();
  while (!shutdown_ && !done_) {
    const TimePoint next = clock->Now() + options_.heartbeat_interval;
    flatbuffers::FlatBufferBuilder fbb(64);
    auto body = wire::CreateHeartbeat(
        fbb, wire::Role::Shard, static_cast<uint64_t>(std::max<int64_t>(0, applied_clock_.load())));
    auto reply = monitor_->Call(fbb, body, clock->Now() + options_.request_timeout);
    if (reply.ok() && reply->type() == wire::Body::HeartbeatReply &&
        reply->As<wire::HeartbeatReply>()->state() == wire::JobState::Stopped) {
      spdlog::info("shard {}: job stopped", id_);
      job_stopped_ = true;
      return;
    }
    if (!reply.ok()) SPDLOG_DEBUG("shard {}: heartbeat: {}", id_, reply.status().ToString());
    // Sleep in short steps so that shutdown is prompt.
    while (!shutdown_ && !done_ && clock->Now() < next) {
      clock->SleepUntil(std::min(next, clock->Now() + std::chrono::milliseconds(20)));
    }
  }
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
      spdlog::error("shard {}: receive failed: {}", id_, got.status().ToString());
      break;
    }
    // Handle every ready message before replies go out.
    for (int i = 0; *got && i < 256; ++i) {
      core_->Handle(std::move(frames), &out);
      frames = Frames();
      auto more = router_->TryRecv(&frames);
      if (!more.ok() || !*more) break;
    }
    core_->Tick(&out);
    for (auto& o : out) {
      o.frames.insert(o.frames.begin(), o.peer);
      absl::Status st = router_->Send(std::move(o.frames));
      if (!st.ok()) SPDLOG_DEBUG("shard {}: reply dropped: {}", id_, st.ToString());
    }
    out.clear();
    applied_clock_ = core_->applied_clock();
    if (core_->stop_requested()) {
      spdlog::info("shard {}: stop received", id_);
      break;
    }
  }
  spdlog::info("shard {}: final: steps {}, applied through clock {}, incomplete steps {}, "
               "updates applied {}, stale {}, dropped {}",
               id_, core_->steps(), core_->applied_clock(), core_->incomplete_steps(),
               core_->updates_applied(), core_->stale_pushes(), core_->dropped_pushes());
  done_ = true;
}

}  // namespace pacer
