#include "monitor/monitor.h"

#include <algorithm>
#include <random>

#include "ps/base/messages.h"
#include "ps/base/rpc.h"
#include "ps/optimizer.h"
#include "ps/partition.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

PolicyDriver::Options PolicyFor(const MonitorOptions& o) {
  PolicyDriver::Options d;
  d.policy = o.policy;
  d.policy.mode = o.mode;
  d.policy.batch.global_batch = o.global_batch;
  d.rescale_batch = o.rescale_batch;
  return d;
}

}  // namespace

MonitorCore::MonitorCore(const MonitorOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      registry_(options.registry ? options.registry : std::make_shared<prometheus::Registry>()),
      server_(*registry_, "monitor", clock, spdlog::level::warn),
      metrics_(*registry_),
      model_({options.optimizer, options.optimizer_settings, options.max_message_bytes,
              options.data_stream},
             &journal_),
      shards_(&journal_, &metrics_),
      ranges_(&journal_, &metrics_),
      replication_({options.replicas, options.shard_lease}, clock, &shards_, &ranges_, &journal_,
                   &metrics_),
      membership_(&journal_, &metrics_),
      moves_({options.job_id, options.max_message_bytes}, clock, &shards_, &ranges_, &model_,
             &membership_, &replication_),
      data_(&membership_, clock, &journal_),
      policy_(PolicyFor(options), clock, &membership_, &journal_, &metrics_),
      job_({options.epochs, options.time_cap_seconds, options.target_accuracy, options.stop_grace,
            options.min_workers, options.lease},
           clock, &membership_, &data_, &journal_, &metrics_) {
  server_.SetIdentity(options_.job_id, 0, "monitor");
  metrics_.ShowReplicas(ranges_, options_.replicas, 0);  // before any range exists
  InstallListeners();
}

void MonitorCore::InstallListeners() {
  // Every membership change: a departed worker's data goes to the live
  // ones, a newcomer takes some.
  membership_.OnChange([this] { data_.Reassign(); });
  // A worker joined, left or finished: the policy re-splits the batch.
  membership_.OnLiveSetChange([this] {
    if (ranges_.built()) policy_.SetWorkers();
  });
  // A shard came back as a new process: the ranges it served go to backups
  // that hold them.
  shards_.OnReturn([this](size_t i) {
    if (!job_.stopped()) replication_.OnShardRestarted(i);
  });
}

void MonitorCore::ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                             const std::string& reason, std::vector<Outgoing>* out) {
  out->push_back({peer, -1, server_.Error(to, code, reason)});
}

msg::JobConfig MonitorCore::Job() const {
  msg::JobConfig j;
  j.mode = options_.mode;
  const JobOptimizer optimizer = model_.optimizer();
  j.optimizer = optimizer.kind;
  j.optimizer_settings = optimizer.settings;
  j.global_batch = options_.global_batch;
  j.epochs = options_.epochs;
  j.time_cap_seconds = options_.time_cap_seconds;
  j.target_accuracy = options_.target_accuracy;
  j.seed = options_.seed;
  j.eval_interval_seconds = options_.eval_interval_seconds;
  j.heartbeat_interval_ms = options_.heartbeat_interval_ms;
  j.backup_workers = options_.backup_workers;
  j.policy = WirePolicy();
  j.staleness_aware_lr = options_.staleness_aware_lr;
  j.eval_interval_clocks = options_.eval_interval_clocks;
  j.shard_lease_ms = static_cast<uint32_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(options_.shard_lease).count());
  j.data_stream = options_.data_stream;
  j.round_steps = options_.round_steps;
  j.round_seconds = options_.round_seconds;
  return j;
}

wire::Policy MonitorCore::WirePolicy() const {
  if (options_.policy.kind == policy::Kind::kAdaptiveBatch) return wire::Policy::AdaptiveBatch;
  if (options_.policy.kind == policy::Kind::kPacer) return wire::Policy::Pacer;
  return wire::Policy::Fixed;
}

msg::ShardMap MonitorCore::Map() const {
  msg::ShardMap m;
  m.version = ranges_.version();
  for (size_t i = 0; i < ranges_.size(); ++i) {
    if (!ranges_.HoldsKeys(i)) continue;  // idle or drained
    const RangeState& r = ranges_[i];
    m.shards.push_back(
        {r.id, shard_address(i), r.begin, r.end, shard_key(i), r.backups, r.epoch});
  }
  return m;
}

void MonitorCore::Handle(Frames frames, std::vector<Outgoing>* out) {
  if (frames.empty()) return;
  Frame peer = frames[0];
  frames.erase(frames.begin());
  DecodeOptions dopts;
  dopts.job_id = options_.job_id;
  dopts.max_message_bytes = options_.max_message_bytes;
  dopts.allow_unbound_register = true;
  Decoded d;
  DecodeError err;
  if (!Decode(frames, dopts, &d, &err)) {
    if (auto reply = server_.Undecodable(err)) out->push_back({peer, -1, std::move(*reply)});
    return;
  }
  if (!SenderMatchesKey(peer, d, out)) return;
  // Commands that change the job (all but listing the faults).
  const bool command = d.type() == wire::Body::RemoveWorker ||
                       d.type() == wire::Body::ShardControl || d.type() == wire::Body::SetLr ||
                       (d.type() == wire::Body::FaultControl &&
                        msg::Read<msg::FaultControl>(d).op != wire::FaultOp::List);
  if (command) {
    const std::string why = server_.guard().CheckOperator(peer.peer_key(), options_.operator_keys,
                                                 wire::EnumNameBody(d.type()));
    if (!why.empty()) return ReplyError(peer, d.env, wire::ErrorCode::Refused, why, out);
  }
  switch (d.type()) {
    case wire::Body::Register: return OnRegister(peer, d, out);
    case wire::Body::DeclareModel: return OnDeclare(peer, d, out);
    case wire::Body::Heartbeat: return OnHeartbeat(peer, d, out);
    case wire::Body::AccuracyReport: return OnAccuracy(peer, d, out);
    case wire::Body::StatusRequest: return OnStatus(peer, d, out);
    case wire::Body::RemoveWorker: return OnRemoveWorker(peer, d, out);
    case wire::Body::ShardControl: return OnShardControl(peer, d, out);
    case wire::Body::FaultControl: return OnFaultControl(peer, d, out);
    case wire::Body::SetLr: return OnSetLr(peer, d, out);
    default:
      return ReplyError(peer, d.env, wire::ErrorCode::WrongType,
                        std::string("the monitor does not serve ") + wire::EnumNameBody(d.type()),
                        out);
  }
}

bool MonitorCore::KeyMayClaim(const std::string& bound, const Frame& peer,
                              const std::string& what, const Decoded& d,
                              std::vector<Outgoing>* out) {
  const std::string why = server_.guard().CheckClaim(peer.peer_key(), bound, what);
  if (why.empty()) return true;
  ReplyError(peer, d.env, wire::ErrorCode::Refused, why, out);
  return false;
}

bool MonitorCore::SenderMatchesKey(const Frame& peer, const Decoded& d,
                                   std::vector<Outgoing>* out) {
  const uint32_t sender = d.env.sender;
  std::string bound;  // none for tools, and ids nobody holds: the handlers decide
  if (d.type() == wire::Body::Register) {
    // Not bound yet: OnRegister checks what the registration claims.
  } else if (const WorkerState* w = membership_.Find(sender)) {
    bound = w->public_key;
  } else if (const auto at = shards_.Index(sender)) {
    bound = shards_[*at].public_key;
  }
  auto refused = server_.CheckSender(peer, bound, d);
  if (!refused) return true;
  out->push_back({peer, -1, std::move(*refused)});
  return false;
}

void MonitorCore::OnRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Register r = msg::Read<msg::Register>(d);
  if (job_.stopped()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "the job has stopped", out);
  }
  if (r.role == wire::Role::Shard) return OnShardRegister(peer, d, out);
  if (r.role == wire::Role::Worker) return OnWorkerRegister(peer, d, out);
  ReplyError(peer, d.env, wire::ErrorCode::Refused, "only workers and shards register", out);
}

void MonitorCore::OnShardRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Register r = msg::Read<msg::Register>(d);
  const std::string& address = r.address;
  if (address.empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::BadHeader, "a shard must give its address", out);
  }
  if (r.shard_id != 0) return OnShardReturn(peer, d, out);
  if (const auto at = shards_.AtAddress(address)) {  // a retried registration, or a restart
    ShardProcess& s = shards_[*at];
    if (!KeyMayClaim(s.public_key, peer, std::string("shard ").append(std::to_string(s.id)), d, out)) return;
    if (ranges_.built() && r.incarnation != s.incarnation) {
      return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                        "shard " + std::to_string(s.id) + " at " + address +
                            " restarted without a checkpoint: its parameters are lost (run "
                            "shards with --data-dir to make them survive a restart)",
                        out);
    }
    s.incarnation = r.incarnation;
    if (s.public_key != peer.peer_key()) {
      s.public_key = peer.peer_key();
      if (ranges_.built()) ranges_.Bump("a shard's new key");  // workers learn it with the map
      journal_.Mark();
    }
    out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
    return;
  }
  ShardProcess s;
  s.id = next_id_++;
  s.address = address;
  s.last_seen = clock_->Now();
  s.incarnation = r.incarnation;
  s.public_key = peer.peer_key();
  s.node = r.node;
  shards_.Add(s);
  ranges_.Add(s.id);  // idle until pacerctl add-shard, once the map is built
  spdlog::info("shard {} registered at {}{}", s.id, address,
               ranges_.built() ? " (idle: pacerctl add-shard gives it keys)" : "");
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
}

void MonitorCore::OnWorkerRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Register r = msg::Read<msg::Register>(d);
  const std::string& token = r.address;
  if (const WorkerState* known = membership_.ByToken(token)) {  // a retried registration
    if (!KeyMayClaim(known->public_key, peer, std::string("worker ").append(std::to_string(known->id)), d, out)) return;
    out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{known->id, known->rank, Job()})});
    return;
  }
  uint64_t start_clock = 0;
  if (job_.running()) {
    if (const auto min_clock = membership_.MinLiveClock()) {
      start_clock = *min_clock;
      // Mode local: a clock is a round; a newcomer starts at the round
      // after the one in progress, rather than hold that one up.
      if (options_.mode == wire::Mode::Local) ++start_clock;
    } else {
      // Nobody trains (the whole cluster restarted): start past the
      // furthest clock any shard has applied.
      int64_t applied = -1;
      for (const ShardProcess& s : shards_) applied = std::max(applied, s.applied_clock);
      start_clock = static_cast<uint64_t>(applied + 1);
    }
  }
  // A rank asked for is given only below --min-workers: the workers the
  // job starts with then hold ranks 0 .. min-workers - 1, so rank 0 (which
  // sets the shards' model) is among them.
  std::optional<uint32_t> hint = r.rank_hint;
  if (hint && *hint >= std::max<uint32_t>(1, options_.min_workers)) hint.reset();
  const WorkerState& w =
      membership_.Join(next_id_++, token, peer.peer_key(), clock_->Now(), start_clock, hint);
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{w.id, w.rank, Job()})});
}

void MonitorCore::OnShardReturn(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Register r = msg::Read<msg::Register>(d);
  const std::string address = r.address;
  if (r.checkpoint_job != options_.job_id) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "the shard's checkpoint belongs to job " + std::to_string(r.checkpoint_job) +
                          ", this is job " + std::to_string(options_.job_id),
                      out);
  }
  const auto at = shards_.Index(r.shard_id);
  if (!at) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "this monitor has no shard " + std::to_string(r.shard_id) + " in job " +
                          std::to_string(options_.job_id) +
                          " (was the monitor restarted without its --data-dir?)",
                      out);
  }
  ShardProcess& s = shards_[*at];
  // Under CURVE a shard id stays with the key it first registered with:
  // another allowed key claiming it (and so its key range, at an address of
  // its choosing) is refused.
  if (!KeyMayClaim(s.public_key, peer, std::string("shard ").append(std::to_string(s.id)), d, out)) return;
  const bool moved = s.address != address;
  // The same process asking again (its reply was lost) changes nothing.
  const bool retry = r.incarnation != 0 && r.incarnation == s.incarnation;
  s.incarnation = r.incarnation;
  const bool new_key = s.public_key != peer.peer_key();
  s.public_key = peer.peer_key();
  if (s.node != r.node) {
    s.node = r.node;
    journal_.Mark();
  }
  if (!retry) {
    ++s.restarts;
    metrics_.shard_restarts->Increment();
    if (moved || new_key) {
      s.address = address;
      // Workers learn its new address (or key) with the map.
      if (ranges_.built()) ranges_.Bump("a shard is back at a new address or key");
    }
    // Tell it its keys and the membership again.
    s.channel.Resend();
    s.down = false;
    s.last_seen = clock_->Now();
    journal_.Mark();
    shards_.UpdateGauges();
    spdlog::info("shard {} is back from its checkpoint (map v{}) at {}{}", s.id,
                 r.checkpoint_map_version, address,
                 moved ? "; it moved: shard map v" + std::to_string(ranges_.version()) : "");
    shards_.Returned(*at);
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
}

void MonitorCore::OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (auto refused = model_.Declare(msg::Read<msg::DeclareModel>(d), d.env.sender)) {
    // A refused worker will not train: it leaves the membership now rather
    // than at its lease's end (a barrier would wait for it till then).
    if (membership_.Remove(d.env.sender, "refused: " + refused->reason)) {
      job_.OnRefused(refused->reason);
    }
    return ReplyError(peer, d.env, refused->code, refused->reason, out);
  }
  job_.OnDeclarationTaken();
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void MonitorCore::OnHeartbeat(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Heartbeat hb = msg::Read<msg::Heartbeat>(d);
  if (hb.role == wire::Role::Shard) return OnShardHeartbeat(peer, d.env, hb, out);
  OnWorkerHeartbeat(peer, d.env, hb, out);
}

void MonitorCore::OnShardHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                                   std::vector<Outgoing>* out) {
  const auto at = shards_.Index(env.sender);
  if (at) {
    ShardProcess& shard = shards_[*at];
    shard.last_seen = clock_->Now();
    // The heartbeat says max(0, applied clock).
    shard.applied_clock = std::max(shard.applied_clock, static_cast<int64_t>(hb.clock));
    shard.checkpoint_age = hb.checkpoint_age_seconds;
    shard.reported_applied = static_cast<int64_t>(hb.clock);
    shard.replicas.clear();
    for (const msg::ShardInfo& r : hb.replicas) shard.replicas[r.id] = r.epoch;
    replication_.TakeHeartbeat(*at, hb);
    if (hb.done && !shard.down) {
      spdlog::warn("shard {} left (SIGTERM, after its final checkpoint); its keys are unserved "
                   "until it registers again",
                   shard.id);
      shards_.SetDown(*at, true);
    } else if (!hb.done && shard.down && shard.channel.acked_model) {
      shards_.SetDown(*at, false);  // it was only silent for a while
    }
  }
  msg::HeartbeatReply reply;
  reply.state = job_.state();
  reply.membership_version = membership_.version();
  reply.stop_reason = job_.stop_reason();
  reply.faults = faults_.For("server", env.sender);
  reply.faults_version = faults_.version();
  reply.lr_overrides = model_.LrOverridesByIndex();
  reply.lr_overrides_version = model_.lr_overrides_version();
  if (at) replication_.FillHeartbeatReply(*at, hb, moves_.key_move(), &reply);
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
}

void MonitorCore::OnWorkerHeartbeat(const Frame& peer, const Envelope& env,
                                    const msg::Heartbeat& hb, std::vector<Outgoing>* out) {
  WorkerState* found = membership_.Find(env.sender);
  if (found == nullptr || !found->alive) {
    if (job_.stopped()) {
      msg::HeartbeatReply reply;
      reply.state = job_.state();
      reply.membership_version = membership_.version();
      reply.stop_reason = job_.stop_reason();
      out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
      return;
    }
    return ReplyError(peer, env, wire::ErrorCode::NotMember,
                      "worker " + std::to_string(env.sender) +
                          " is not a live member (its lease expired?)",
                      out);
  }
  WorkerState& w = *found;
  w.last_seen = clock_->Now();
  w.samples_per_second = hb.samples_per_second;
  w.paused = hb.paused;
  membership_.RaiseHold(w);
  w.clock = std::max(w.clock, hb.clock);
  // Read positions first: a worker's last heartbeat (done) carries its final ones.
  data_.TakeReport(w, hb);
  if (hb.done && !w.done) {
    membership_.Finish(w.id, hb.clock);
  } else if (policy_.Report(w, hb) && job_.running()) {
    // A worker whose speed just shifted gets its new size in this reply.
    policy_.Round(w.last_seen);
  }
  msg::HeartbeatReply reply = WorkerReply(w);
  const bool training = w.alive && !w.done && reply.state == wire::JobState::Running &&
                        job_.running();
  data_.StreamReply(w, hb.samples_per_second, training, job_.started_at(), &reply);
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
}

msg::HeartbeatReply MonitorCore::WorkerReply(const WorkerState& w) const {
  // A worker runs once the job runs and every shard knows it is a member.
  wire::JobState state = job_.state();
  if (state == wire::JobState::Running && MinAckedMembership() < w.joined_version) {
    state = wire::JobState::Waiting;
  }
  msg::HeartbeatReply reply;
  reply.state = state;
  if (state == wire::JobState::Running) reply.shard_map = Map();
  reply.membership_version = membership_.version();
  reply.start_clock = w.clock;
  reply.assignment = msg::Assignment{w.batch, w.staleness, w.staleness_range};
  reply.stop_reason = job_.stop_reason();
  data_.FillReply(w, &reply);
  reply.evaluate = state == wire::JobState::Running && membership_.Evaluator() == w.id;
  if (reply.evaluate) reply.evaluate_now = job_.final_evaluation();
  reply.pause_at = membership_.pause_at();
  reply.faults = faults_.For("worker", w.id);
  reply.faults_version = faults_.version();
  return reply;
}

void MonitorCore::OnAccuracy(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const std::optional<std::string> stop = job_.OnAccuracy(msg::Read<msg::AccuracyReport>(d));
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  if (stop) StopJob(*stop, out);
}

uint64_t MonitorCore::MinAckedMembership() const {
  uint64_t v = UINT64_MAX;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardProcess& s = shards_[i];
    // A drained shard is gone; an idle one that is down holds no keys.
    const bool idle = ranges_.built() && !ranges_.HoldsKeys(i);
    if (!s.drained && !(idle && s.down)) v = std::min(v, s.channel.acked_membership);
  }
  return shards_.empty() ? 0 : v;
}

void MonitorCore::SendToShards(bool force, std::vector<Outgoing>* out) {
  if (!ranges_.built()) return;
  const TimePoint now = clock_->Now();
  const uint64_t membership_version = membership_.version();
  std::vector<uint32_t> live = membership_.LiveWorkers();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const RangeState& range = ranges_[i];
    if (shards_[i].drained || (range.host != 0 && range.served_at.empty())) continue;
    ShardProcess::Channel& ch = shards_[i].channel;
    bool need_model = !ch.acked_model;
    bool need_members = ch.acked_membership < membership_version;
    if (!need_model && !need_members) continue;
    if (!force && now < ch.last_sent + options_.shard_resend) continue;
    ch.last_sent = now;
    Envelope env;
    env.job_id = options_.job_id;
    env.sender = 0;
    if (need_model) {
      msg::DeclareModel declare;
      declare.shard_map_version = ranges_.version();
      declare.param_groups = model_.param_groups();
      declare.optimizer = model_.optimizer();
      const std::vector<wire::KeyLen>& keys = model_.keys();
      const std::vector<uint32_t>& groups = model_.groups();
      for (size_t k = 0; k < keys.size(); ++k) {
        if (keys[k].key() < range.begin || keys[k].key() >= range.end) continue;
        declare.keys.push_back(keys[k]);
        declare.groups.push_back(groups.empty() ? kDefaultGroup : groups[k]);
      }
      env.request_id = ch.model_request = NewRequestId();
      out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, declare)});
    }
    msg::Membership members;
    members.version = membership_version;
    for (uint32_t id : live) {
      const WorkerState& w = membership_.at(id);
      members.workers.push_back(
          {w.id, w.rank, w.batch, w.start_clock, w.staleness, w.staleness_range, w.public_key});
    }
    env.request_id = ch.membership_request = NewRequestId();
    ch.membership_request_version = membership_version;
    out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, members)});
  }
}

void MonitorCore::HandleShardReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out) {
  if (index >= shards_.size()) return;
  if (moves_.OnReply(index, reply, out)) return;
  ShardProcess& s = shards_[index];
  if (reply.type() == wire::Body::Error) {
    spdlog::warn("shard {} refused an update: {}", s.id, msg::Read<msg::Error>(reply).reason);
    return;
  }
  if (reply.env.request_id == s.channel.model_request) s.channel.acked_model = true;
  if (reply.env.request_id == s.channel.membership_request) {
    // The reply confirms the version that request carried; if membership
    // changed since, SendToShards still sees the shard behind and sends again.
    s.channel.acked_membership =
        std::max(s.channel.acked_membership, s.channel.membership_request_version);
  }
}

void MonitorCore::StopJob(const std::string& reason, std::vector<Outgoing>* out) {
  if (!job_.Stop(reason)) return;
  Envelope env;
  env.job_id = options_.job_id;
  for (size_t i = 0; i < shards_.size(); ++i) {
    env.request_id = NewRequestId();
    out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, msg::Stop{reason})});
  }
}

DataStreamOptions MonitorCore::StreamOptions() const {
  DataStreamOptions so;
  so.samples = model_.data_samples();
  so.epochs = options_.epochs;
  so.chunk_samples = options_.chunk_samples;
  if (options_.mode == wire::Mode::Local) {
    // A round reads on without acknowledgements until its end: a worker
    // holds a round's worth of chunks and one more, so that the data at
    // hand, not a chunk's end, ends a round.
    so.chunk_seconds = std::max(so.chunk_seconds, options_.round_seconds);
    so.hold = 3;
  }
  return so;
}

void MonitorCore::StartJob(std::vector<Outgoing>* out) {
  ranges_.Build(PartitionByBytes(model_.keys(), shards_.size()));  // v1
  replication_.Assign();
  const size_t live = membership_.LiveWorkers().size();
  if (options_.data_stream) {
    data_.Start(StreamOptions(), 0);
  } else {
    data_.Start(std::nullopt, options_.data_partitions > 0 ? options_.data_partitions
                                                           : static_cast<uint32_t>(live));
  }
  policy_.Start();
  membership_.Change("started", "batch sizes assigned");
  for (uint32_t id : membership_.KnownIds()) {
    WorkerState& w = *membership_.Find(id);
    w.joined_version = std::min(w.joined_version, membership_.version());
  }
  spdlog::info("shard map v{} built over {} shards; {} workers share global batch {} ({} policy, "
               "{} mode)",
               ranges_.version(), shards_.size(), data_.partition_count(), options_.global_batch,
               policy::KindName(options_.policy.kind), wire::EnumNameMode(options_.mode));
  SendToShards(true, out);
}

void MonitorCore::Tick(std::vector<Outgoing>* out) {
  const TimePoint now = clock_->Now();
  if (now >= next_gauges_) {
    const char* state = job_.running() ? "running" : job_.stopped() ? "stopped" : "waiting";
    metrics_.ShowJob(state, membership_, policy_.policy(), data_, shards_);
    next_gauges_ = now + std::chrono::milliseconds(250);
  }
  // Shards silent past the lease are marked down (they keep their keys);
  // with replicas the shards' own lease (--shard-lease), and a down
  // primary's range fails over to a backup. The map changes once the
  // backup reports where it serves the range; until then its old entry
  // stands.
  shards_.ExpireLeases(now, options_.replicas > 0 ? options_.shard_lease : options_.lease);
  if (!job_.stopped()) replication_.FailOver();
  if (options_.safeguards.On(Safeguard::kLeaseExpiry)) membership_.ExpireLeases(now, options_.lease);
  if (job_.stopped()) return;

  // Start: enough shards and workers, and a model.
  if (!ranges_.built() && shards_.size() >= options_.min_shards &&
      membership_.LiveWorkers().size() >= options_.min_workers && model_.declared()) {
    StartJob(out);
  }
  if (ranges_.built()) replication_.Assign();
  if (ranges_.built() && job_.state() == wire::JobState::Waiting) {
    const bool all = std::all_of(shards_.begin(), shards_.end(), [](const ShardProcess& s) {
      return s.channel.acked_model && s.channel.acked_membership >= 1;
    });
    if (all) {
      job_.Run();
      const JobOptimizer optimizer = model_.optimizer();
      spdlog::info("job {} running ({}, {} lr {}, global batch {})", options_.job_id,
                   wire::EnumNameMode(options_.mode), OptimizerName(optimizer.kind),
                   optimizer.settings.lr, options_.global_batch);
    }
  }
  SendToShards(false, out);
  moves_.Step(out);
  if (job_.running()) policy_.Round(now);
  if (auto reason = job_.DueStop()) StopJob(*reason, out);
}


// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<MonitorServer>> MonitorServer::Start(Transport* transport,
                                                                    const MonitorOptions& options) {
  std::unique_ptr<MonitorServer> s(new MonitorServer());
  s->transport_ = transport;
  s->options_ = options;
  std::optional<std::string> saved;
  if (!options.data_dir.empty()) {
    auto dir = DataDirPath(options.data_dir, "state");
    if (!dir.ok()) return dir.status();
    auto store = RecordStore::Open(*dir);
    if (!store.ok()) return store.status();
    auto got = (*store)->Get("monitor");
    if (!got.ok()) return got.status();
    saved = std::move(*got);
    s->store_ = std::move(*store);
  }
  if (saved) {
    auto record = DecodeMonitorRecord(*saved);
    if (!record.ok()) {
      return absl::DataLossError("the monitor state in " + options.data_dir + " cannot be read (" +
                                 std::string(record.status().message()) +
                                 "); move it away to start a new job");
    }
    const uint64_t job = record->job_id;
    if (options.job_id != 0 && options.job_id != job) {
      return absl::InvalidArgumentError("--job-id " + std::to_string(options.job_id) + ", but " +
                                        options.data_dir + " holds job " + std::to_string(job));
    }
    s->options_.job_id = job;
  } else if (s->options_.job_id == 0) {
    std::random_device rd;
    s->options_.job_id = (uint64_t{rd()} << 32 | rd()) | 1;
  }
  s->registry_ = options.registry ? options.registry : std::make_shared<prometheus::Registry>();
  s->options_.registry = s->registry_;
  auto router = transport->Bind(options.listen);
  if (!router.ok()) return router.status();
  s->router_ = std::move(*router);
  s->address_ = s->router_->address();
  s->core_ = std::make_unique<MonitorCore>(s->options_, transport->clock());
  if (saved) {
    if (absl::Status st = s->core_->RestoreState(*saved); !st.ok()) return st;
    s->resumed_ = true;
  }
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

MonitorServer::~MonitorServer() {
  Shutdown();
  Wait();
}

void MonitorServer::Wait() {
  if (thread_.joinable()) thread_.join();
}

void MonitorServer::Run() {
  const Clock* clock = transport_->clock();
  std::vector<MonitorCore::Outgoing> out;
  std::vector<Socket*> sockets;
  TimePoint next_tick = clock->Now();
  TimePoint last_save{};
  while (!shutdown_ && !core_->finished()) {
    sockets.assign({router_.get()});
    for (auto& ch : shard_channels_) sockets.push_back(ch->socket());
    auto ready = transport_->Poll(sockets, next_tick);
    if (!ready.ok()) {
      spdlog::error("poll failed: {}", ErrorText(ready.status()));
      break;
    }
    for (int i = 0; i < 256; ++i) {
      Frames frames;
      auto got = router_->TryRecv(&frames);
      if (!got.ok() || !*got) break;
      core_->Handle(std::move(frames), &out);
    }
    for (size_t i = 0; i < shard_channels_.size(); ++i) {
      Frames frames;
      while (true) {
        auto got = shard_channels_[i]->socket()->TryRecv(&frames);
        if (!got.ok() || !*got) break;
        DecodeOptions dopts;
        dopts.job_id = options_.job_id;
        Decoded d;
        DecodeError err;
        if (Decode(frames, dopts, &d, &err)) core_->HandleShardReply(i, d, &out);
      }
    }
    if (clock->Now() >= next_tick) {
      core_->Tick(&out);
      next_tick = clock->Now() + std::chrono::milliseconds(20);
    }
    if (store_) {
      // Structural changes at once; clocks and times every save_interval.
      const TimePoint now = clock->Now();
      if (core_->TakeDirty() || now - last_save >= options_.save_interval) {
        SaveState();
        last_save = now;
      }
    }
    for (auto& o : out) {
      if (o.shard_index >= 0) {
        size_t idx = static_cast<size_t>(o.shard_index);
        while (shard_channels_.size() <= idx) {
          RpcOptions ropts;
          ropts.job_id = options_.job_id;
          const size_t next = shard_channels_.size();
          transport_->SetServerKey(core_->shard_address(next), core_->shard_key(next));
          auto ch = RpcChannel::Connect(transport_, core_->shard_address(next), ropts);
          if (!ch.ok()) {
            spdlog::error("cannot reach shard: {}", ErrorText(ch.status()));
            break;
          }
          shard_channels_.push_back(std::move(*ch));
          shard_channel_keys_.push_back(core_->shard_key(next));
        }
        if (idx < shard_channels_.size() &&
            (shard_channels_[idx]->address() != core_->shard_address(idx) ||
             shard_channel_keys_[idx] != core_->shard_key(idx))) {
          // The shard came back at another address, or with another key.
          RpcOptions ropts;
          ropts.job_id = options_.job_id;
          transport_->SetServerKey(core_->shard_address(idx), core_->shard_key(idx));
          auto ch = RpcChannel::Connect(transport_, core_->shard_address(idx), ropts);
          if (ch.ok()) {
            shard_channels_[idx] = std::move(*ch);
            shard_channel_keys_[idx] = core_->shard_key(idx);
          }
        }
        if (idx < shard_channels_.size()) (void)shard_channels_[idx]->socket()->Send(std::move(o.frames));
      } else {
        o.frames.insert(o.frames.begin(), o.peer);
        (void)router_->Send(std::move(o.frames));
      }
    }
    out.clear();
  }
  if (store_) SaveState();  // SIGTERM: a restart carries on from here
  last_accuracy_ = core_->last_accuracy();
  time_to_target_ = core_->time_to_target();
  stop_reason_ = core_->stop_reason();
  failed_ = core_->stop_failed();
  policy_summary_ = core_->PolicySummary();
  done_ = true;
}

void MonitorServer::SaveState() {
  absl::Status st = store_->Put("monitor", core_->SaveState());
  if (!st.ok()) spdlog::error("cannot save the monitor state: {}", ErrorText(st));
}

}  // namespace pacer
