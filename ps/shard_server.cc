#include "ps/shard_server.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
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
  s->checkpoint_policy_ = {options.checkpoint_interval, options.checkpoint_updates,
                           options.shard.safeguards.On(Safeguard::kCheckpoints),
                           options.stop_timeout};
  s->registry_ = options.shard.registry ? options.shard.registry
                                        : std::make_shared<prometheus::Registry>();
  auto bound = transport->Bind(options.listen);
  if (!bound.ok()) return bound.status();
  std::unique_ptr<Socket> router = std::move(*bound);
  s->address_ = router->address();
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
                                options.node, std::nullopt};
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
      ServedRange own;
      own.shard = s->id_;
      own.range = s->id_;
      own.core = std::make_unique<ShardCore>(sopts, clock);
      own.core->Configure(job, s->id_);
      own.router = std::move(router);
      own.address = advertised;
      s->job_ = job;
      if (r.job) s->shard_lease_ = std::chrono::milliseconds(r.job->shard_lease_ms);
      if (snapshot) {
        if (absl::Status st = own.core->Restore(*snapshot); !st.ok()) return st;
        s->restored_ = true;
        s->awaiting_monitor_ = true;
        own.core->SetAwaitingMonitor(true);
      }
      s->ranges_.push_back(std::move(own));
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
    s->ranges_[0].writer = std::make_unique<CheckpointWriter>(
        std::move(store), s->registry_, options.checkpoint_interval, clock, options.faults, s->id_);
    s->own_writer_ = s->ranges_[0].writer.get();
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
  const TimePoint deadline = transport_->clock()->Now() + options_.stop_timeout;
  for (ServedRange& r : ranges_) {
    // A range taken over and served elsewhere now has let its writer go
    // (the checkpoint stays).
    if (!r.writer) continue;
    absl::Status st = r.Checkpoint(checkpoint_policy_, final, deadline, transport_->clock());
    if (!st.ok() && stop_status_.ok()) stop_status_ = std::move(st);
  }
}

std::unique_ptr<CheckpointWriter> ShardServer::RangeWriter(uint32_t range) {
  if (options_.data_dir.empty()) return nullptr;
  auto path = RangeCheckpointPath(range);
  absl::StatusOr<std::unique_ptr<CheckpointStore>> store =
      path.ok() ? CheckpointStore::Open(*path) : path.status();
  if (!store.ok()) {
    spdlog::error("shard {}: shard {}'s range will not be checkpointed: {}", id_, range,
                  ErrorText(store.status()));
    return nullptr;
  }
  return std::make_unique<CheckpointWriter>(
      std::move(*store), registry_, options_.checkpoint_interval, transport_->clock(),
      options_.faults, id_, prometheus::Labels{{"range", std::to_string(range)}});
}

absl::StatusOr<std::string> ShardServer::RangeCheckpointPath(uint32_t range) const {
  return DataDirPath(options_.data_dir, "range-" + std::to_string(range));
}

absl::StatusOr<std::optional<ShardSnapshot>> ShardServer::LoadRangeCheckpoint(
    uint32_t range) const {
  if (options_.data_dir.empty()) return std::optional<ShardSnapshot>();
  auto path = RangeCheckpointPath(range);
  if (!path.ok()) return path.status();
  std::error_code ec;
  if (!std::filesystem::exists(*path, ec)) return std::optional<ShardSnapshot>();
  auto store = CheckpointStore::Open(*path);
  if (!store.ok()) return store.status();
  auto loaded = (*store)->Load();
  if (!loaded.ok()) {
    return absl::DataLossError("the checkpoint in " + *path + " cannot be read (" +
                               std::string(loaded.status().message()) + ")");
  }
  if (*loaded && ((*loaded)->shard_id != range || (*loaded)->job_id != job_.job_id)) {
    return absl::FailedPreconditionError(
        "the checkpoint in " + *path + " is of shard " + std::to_string((*loaded)->shard_id) +
        "'s range in job " + std::to_string((*loaded)->job_id) + ", not of shard " +
        std::to_string(range) + "'s in job " + std::to_string(job_.job_id));
  }
  return std::move(*loaded);
}

void ShardServer::HeartbeatLoop() {
  const Clock* clock = transport_->clock();
  RuntimeFaults runtime_faults(options_.faults);
  while (!serving_ended_) {
    const TimePoint next = clock->Now() + options_.heartbeat_interval;
    msg::Heartbeat hb;
    hb.role = wire::Role::Shard;
    hb.clock = static_cast<uint64_t>(std::max<int64_t>(0, applied_clock_.load()));
    hb.checkpoint_age_seconds = own_writer_ ? static_cast<float>(own_writer_->AgeSeconds()) : -1.0f;
    {
      MutexLock lock(mu_);
      hb.replicas = report_.replicas;
      hb.serving = report_.serving;
      hb.lagging = report_.lagging;
      hb.lag = report_.lag;
      hb.handed_off = report_.handed_off;
    }
    const TimePoint sent = clock->Now();
    auto reply = monitor_->Call(hb, sent + options_.request_timeout);
    if (reply.ok() && reply->type() == wire::Body::HeartbeatReply) {
      const msg::HeartbeatReply r = msg::Read<msg::HeartbeatReply>(*reply);
      // The lease runs from when this heartbeat left: the monitor's, from
      // when it arrived, ends later.
      Post(r, (sent + shard_lease_).time_since_epoch().count());
      if (r.state == wire::JobState::Stopped) {
        spdlog::info("shard {}: job stopped", id_);
        job_stopped_ = true;
        return;
      }
      runtime_faults.Apply(r.faults_version, r.faults);
    }
    if (!reply.ok()) SPDLOG_DEBUG("shard {}: heartbeat: {}", id_, ErrorText(reply.status()));
    // Sleep in short steps so that shutdown is prompt; a promotion reports
    // its new address at once.
    while (!serving_ended_ && clock->Now() < next && !heartbeat_now_.exchange(false)) {
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

ShardServer::Directive::Directive() = default;

void ShardServer::Post(const msg::HeartbeatReply& r, int64_t lease_until_ns) {
  // A reply that says the job stopped renews the lease and may name ranges
  // to serve and a drain; it sets nothing else.
  const bool stopped = r.state == wire::JobState::Stopped;
  PromoteConfig promote{r.promote, r.promote_backups, r.hold_durable_ranges};
  const bool promote_changed = !promote.ranges.empty() && !(promote == last_promote_);
  if (promote_changed) last_promote_ = promote;
  ReplicaConfig replication{r.replica_epoch, r.replica_backups, r.backing, r.deposed,
                            r.hold_durable};
  const bool replication_changed = !stopped && !(replication == last_replication_);
  if (replication_changed) last_replication_ = replication;

  MutexLock lock(mu_);
  Directive& d = pending_ ? *pending_ : pending_.emplace();
  if (promote_changed) d.promote = std::move(promote);
  if (replication_changed) d.replication = std::move(replication);
  if (!stopped) {
    if (r.lr_overrides_version > 0 && (!d.lr || d.lr->first < r.lr_overrides_version)) {
      d.lr.emplace(r.lr_overrides_version, r.lr_overrides);
    }
    for (const msg::ShardInfo& g : r.deposed_ranges) d.deposed[g.id] = g.epoch;
  }
  d.hand_off = r.hand_off;
  d.hand_off_given_up = r.hand_off_given_up;
  d.lease_until_ns = lease_until_ns;
}

void ShardServer::Follow(Directive d, std::vector<ShardCore::Outgoing>* out) {
  if (d.lr) {
    for (ServedRange& r : ranges_) r.core->SetLrOverrides(d.lr->first, d.lr->second);
  }
  // Promotions first: the replica set no longer lists a range promoted
  // here as backed up.
  if (d.promote) Promote(*d.promote);
  if (d.replication) {
    ApplyReplication(*d.replication, out);
  }
  for (ServedRange& r : taken_over()) {
    // Served since a promotion, and failed over again elsewhere while this
    // shard was cut off: no longer its to answer for.
    auto g = d.deposed.find(r.range);
    if (g == d.deposed.end() || g->second <= r.epoch || r.core->deposed_epoch() != 0) continue;
    spdlog::warn("shard {}: shard {}'s range, which it served since epoch {}, is served "
                 "elsewhere since epoch {}; it answers nothing of it any more",
                 id_, r.range, r.epoch, g->second);
    r.Depose(g->second, out);
    r.writer.reset();  // its checkpoint stays, of the state it had
  }
  // Asked to hand its range over; a request the monitor no longer asks for
  // is forgotten, and if this shard stopped applying for it but its backups
  // do not hold its last record yet and the monitor says it gave the drain
  // up, it applies again (a monitor that restarted knows of no drain, and
  // finishes it once this shard hands off).
  if (d.hand_off) {
    hand_off_requested_ = true;
  } else if (!left_for_hand_off_) {
    hand_off_requested_ = false;
  } else if (!handed_off_ && d.hand_off_given_up) {
    cancel_hand_off_ = true;
  }
  lease_until_ns_ = d.lease_until_ns;
  if (awaiting_monitor_) {
    // The monitor's word (a deposing among it) is in effect.
    awaiting_monitor_ = false;
    own().SetAwaitingMonitor(false);
  }
}

std::string ShardServer::NotReadyReason() const {
  if (shutdown_ || serving_ended_ || job_stopped_) return "leaving";
  if (holds_keys_ && !holds_values_) return "its key range has no values yet (waiting for Init)";
  return "";
}

void ShardServer::ApplyReplication(const ReplicaConfig& config,
                                   std::vector<ShardCore::Outgoing>* out) {
  std::vector<uint32_t> ids;
  for (const msg::ShardInfo& b : config.backups) ids.push_back(b.id);
  std::map<uint32_t, ShardCore::BackedRange> backing;
  for (const msg::ShardInfo& p : config.backing) backing[p.id] = {p.epoch, p.public_key};
  own().SetBacking(std::move(backing));
  if (config.deposed) {
    // Cut off from the monitor (not dead) while a backup took its range
    // over: the range is no longer this shard's to answer for.
    if (own().deposed_epoch() == 0) {
      spdlog::warn("shard {}: its range is served by another shard since epoch {} (a failover "
                   "while this shard was cut off from the monitor); it answers nothing of it "
                   "any more",
                   id_, config.epoch);
    }
    ranges_[0].ConnectBackups(transport_, config.backups, ids);
    ranges_[0].Depose(config.epoch, out);
    return;
  }
  if (own().deposed_epoch() != 0 && config.epoch > own().deposed_epoch()) {
    // Given back: the shard its range failed over to was lost before it
    // served it (so it acknowledged nothing of it), and this shard's state
    // holds everything acknowledged.
    spdlog::warn("shard {}: serves its range again at epoch {}: the shard it failed over to "
                 "was lost before serving it",
                 id_, config.epoch);
    own().Depose(0);
  }
  ranges_[0].SetBackups(transport_, config.backups, ids, config.epoch, config.hold_durable, out);
}

void ShardServer::Promote(const PromoteConfig& config) {
  const std::vector<msg::ShardInfo>& ranges = config.ranges;
  for (const msg::ShardInfo& r : ranges) {
    const auto served = taken_over();
    if (std::any_of(served.begin(), served.end(),
                    [&](const ServedRange& h) { return h.range == r.id && h.epoch == r.epoch; })) {
      continue;  // serving it already
    }
    std::optional<ShardSnapshot> snapshot = own().ReplicaSnapshot(r.id);
    if (!snapshot) {
      // Served here at an older epoch: given back (the shard it failed over
      // to was lost before serving it, so acknowledged nothing of it), and
      // the latest core of it here holds everything acknowledged.
      ServedRange* old = nullptr;
      for (ServedRange& h : taken_over()) {
        if (h.range == r.id && h.epoch < r.epoch && (old == nullptr || h.epoch > old->epoch)) {
          old = &h;
        }
      }
      if (old != nullptr) {
        for (ServedRange& h : taken_over()) {
          if (&h != old && h.range == r.id) h.writer.reset();  // the store is the latest's
        }
        old->epoch = r.epoch;
        old->core->Depose(0);
        if (!old->writer) old->writer = RangeWriter(r.id);
        spdlog::warn("shard {}: serves shard {}'s range again at {} (epoch {}): the shard it "
                     "failed over to was lost before serving it",
                     id_, r.id, old->address, r.epoch);
        heartbeat_now_ = true;
        continue;
      }
    }
    bool from_checkpoint = false;
    if (!snapshot) {
      // Restarted since it was given the range, and nobody else holds it
      // (the monitor promotes a live replica first): its checkpoint here.
      auto loaded = LoadRangeCheckpoint(r.id);
      if (!loaded.ok()) {
        spdlog::error("shard {}: told to serve shard {}'s range (epoch {}); holds no replica of "
                      "it, and its checkpoint here is of no use: {}",
                      id_, r.id, r.epoch, ErrorText(loaded.status()));
        continue;
      }
      if (!*loaded) {
        spdlog::error("shard {}: told to serve shard {}'s range (epoch {}) but holds no replica "
                      "of it{}",
                      id_, r.id, r.epoch,
                      options_.data_dir.empty() ? " (and has no --data-dir)"
                                                : " and no checkpoint of it");
        continue;
      }
      snapshot = std::move(*loaded);
      from_checkpoint = true;
    }
    for (ServedRange& old : taken_over()) {
      // An older epoch of the same range, served elsewhere meanwhile: its
      // store is this one's now.
      if (old.range == r.id) old.writer.reset();
    }
    // The range keeps its id (the workers' and the monitor's name for it)
    // and gets a socket of its own here, so its messages reach its core.
    std::string listen = options_.listen;
    if (const size_t colon = listen.rfind(':'); colon != std::string::npos) {
      listen = listen.substr(0, colon) + ":0";
    }
    auto router = transport_->Bind(listen);
    if (!router.ok()) {
      spdlog::error("shard {}: cannot bind a socket for shard {}'s range: {}", id_, r.id,
                    ErrorText(router.status()));
      continue;
    }
    ShardOptions sopts = options_.shard;
    // Its series beside this shard's own, told apart by range="<id>".
    sopts.registry = registry_;
    sopts.metric_labels = {{"range", std::to_string(r.id)}};
    auto core = std::make_unique<ShardCore>(sopts, transport_->clock());
    // The job as the own core runs it: its optimizer is the declared one,
    // which the registration's (job_) may predate.
    core->Configure(own().job(), r.id);
    if (absl::Status st = core->Restore(*snapshot); !st.ok()) {
      spdlog::error("shard {}: cannot serve shard {}'s range from its replica: {}", id_, r.id,
                    ErrorText(st));
      continue;
    }
    ServedRange h;
    h.shard = id_;
    h.range = r.id;
    h.epoch = r.epoch;
    h.core = std::move(core);
    h.router = std::move(*router);
    h.address = h.router->address();
    if (!options_.advertise.empty()) {
      // The advertised host, this socket's port.
      const std::string& adv = options_.advertise;
      const size_t a = adv.rfind(':'), b = h.address.rfind(':');
      if (a != std::string::npos && b != std::string::npos) {
        h.address = adv.substr(0, a) + h.address.substr(b);
      }
    }
    h.writer = RangeWriter(r.id);
    if (from_checkpoint) {
      spdlog::warn("shard {}: serves shard {}'s range at {} (epoch {}) from its checkpoint at "
                   "applied clock {}: no replica of it was left; the pushes acknowledged "
                   "since are lost and counted",
                   id_, r.id, h.address, r.epoch, snapshot->applied_clock);
    } else {
      spdlog::warn("shard {}: promoted: serves shard {}'s range at {} (epoch {}) from its "
                   "replica at applied clock {}",
                   id_, r.id, h.address, r.epoch, snapshot->applied_clock);
    }
    ranges_.push_back(std::move(h));
    heartbeat_now_ = true;
  }
  // Each served range's backups: connected, and a seed for each new one.
  std::vector<ShardCore::Outgoing> out;
  for (const msg::ShardInfo& r : ranges) {
    for (ServedRange& h : taken_over()) {
      if (h.range != r.id || h.epoch != r.epoch) continue;
      const bool hold = std::count(config.hold.begin(), config.hold.end(), r.id) > 0;
      h.SetBackups(transport_, config.backups, r.backups, r.epoch, hold, &out);
    }
  }
}

void ShardServer::UpdateReport() {
  Report report;
  for (const auto& [range, epoch] : own().replica_epochs()) {
    msg::ShardInfo r;
    r.id = range;
    r.epoch = epoch;
    report.replicas.push_back(std::move(r));
  }
  for (const ServedRange& h : taken_over()) {
    if (h.core->deposed_epoch() != 0) continue;  // served elsewhere now
    msg::ShardInfo r;
    r.id = h.range;
    r.epoch = h.epoch;
    r.address = h.address;
    report.serving.push_back(std::move(r));
  }
  for (const ServedRange& h : ranges_) {
    const ShardCore& core = *h.core;
    // Backups that fall behind, per range served (the monitor drops them).
    if (std::vector<uint32_t> behind = core.lagging_backups(); !behind.empty()) {
      msg::ShardInfo r;
      r.id = h.range;
      r.backups = std::move(behind);
      report.lagging.push_back(std::move(r));
    }
    // Each range served with backups: how far behind they are.
    if (core.replicated() && core.deposed_epoch() == 0) {
      report.lag.push_back({h.range, h.current_epoch(), core.replication_lag_records(),
                            static_cast<float>(core.replication_lag_seconds())});
    }
  }
  report.handed_off = handed_off_;
  MutexLock lock(mu_);
  report_ = std::move(report);
}

void ShardServer::Run() {
  const Clock* clock = transport_->clock();
  std::vector<ShardCore::Outgoing> out;
  // What the serving loop waits on: each served range's socket and its
  // connections to the range's backups (their replies).
  struct Source {
    Socket* socket;
    ServedRange* range;
    bool dealer;  // a connection to a backup: no routing id
  };
  std::vector<Source> sources;
  std::vector<Socket*> sockets;
  TimePoint next_report{};
  // Leaving (the job stopped, or SIGTERM): the last records go out, and the
  // shard stays until its backups hold them and its replicas got their
  // primaries' last records, or kLeaveWait passed.
  std::optional<TimePoint> leave_by;
  while (true) {
    if (!leave_by && (shutdown_ || job_stopped_ || own().stop_requested())) {
      if (own().stop_requested()) spdlog::info("shard {}: stop received", id_);
      for (ServedRange& r : ranges_) {
        r.core->Leave(&out);
        r.SendAll(&out);
      }
      leave_by = clock->Now() + kLeaveWait;
    }
    if (leave_by && (clock->Now() >= *leave_by || ReplicationSettled())) break;
    TimePoint deadline = clock->Now() + std::chrono::milliseconds(100);
    for (const ServedRange& r : ranges_) deadline = std::min(deadline, r.core->NextDeadline());
    // The monitor's orders from the heartbeat thread, taken whole between
    // messages under mu_ and followed after (a promotion may read a
    // checkpoint from disk, and a writer let go may wait for one; the
    // heartbeats must not wait for that).
    std::optional<Directive> directive;
    {
      MutexLock lock(mu_);
      directive.swap(pending_);
    }
    if (directive) Follow(std::move(*directive), &out);
    if (std::exchange(cancel_hand_off_, false) && left_for_hand_off_ && !handed_off_ &&
        !leave_by) {
      own().CancelLeave(&out);
      ranges_[0].SendAll(&out);
      left_for_hand_off_ = false;
      hand_off_requested_ = false;
      spdlog::warn("shard {}: the monitor gave the drain up before the backups held the last "
                   "record; applying pushes again",
                   id_);
    }
    if (hand_off_requested_ && !own().leaving() && own().replicated()) {
      // pacerctl drain-shard: apply nothing more; the last record takes
      // everything applied to the backups, and the monitor promotes one
      // once they hold it.
      own().Leave(&out);
      ranges_[0].SendAll(&out);
      left_for_hand_off_ = own().leaving();
      spdlog::info("shard {}: handing its range over to its backups (pacerctl drain-shard): "
                   "applies nothing more; last record {}",
                   id_, own().replication_record());
    }
    if (own().leaving() && hand_off_requested_ && !handed_off_ &&
        own().durable_record() >= own().replication_record()) {
      handed_off_ = true;
      {
        MutexLock lock(mu_);
        report_.handed_off = true;
      }
      heartbeat_now_ = true;  // the monitor promotes a backup on hearing it
      spdlog::info("shard {}: its backups hold its last record {}; the range can be handed over",
                   id_, own().replication_record());
    }
    // Fencing: a primary with backups that has not heard from the monitor
    // for its lease stops answering (the monitor may promote a backup).
    const bool expired =
        options_.shard.safeguards.On(Safeguard::kFencing) && clock->Now().time_since_epoch().count() > lease_until_ns_;
    if (expired != fenced_) {
      fenced_ = expired;
      for (ServedRange& r : ranges_) r.core->SetFenced(fenced_);
      if (fenced_ && own().replicated()) {
        spdlog::warn("shard {}: no word from the monitor for its shard lease ({:.2f} s): stops "
                     "answering pushes and pulls until it hears again",
                     id_, ToSeconds(shard_lease_));
      }
    }
    if (ranges_.size() == 1 && ranges_[0].backups.empty()) {
      // One message, then its replies. A message queued behind it is taken
      // by the next Recv at once; asking for one here was a receive that
      // usually found nothing, a wasted system call per message.
      Frames frames;
      auto got = transport_->Recv(ranges_[0].router.get(), &frames, deadline);
      if (!got.ok()) {
        spdlog::error("shard {}: receive failed: {}", id_, ErrorText(got.status()));
        break;
      }
      if (*got) own().Handle(std::move(frames), &out);
      ranges_[0].SendAll(&out);
    } else {
      sources.clear();
      for (ServedRange& r : ranges_) {
        sources.push_back({r.router.get(), &r, false});
        for (auto& [shard, b] : r.backups) sources.push_back({b.socket.get(), &r, true});
      }
      sockets.clear();
      for (const Source& src : sources) sockets.push_back(src.socket);
      auto ready = transport_->Poll(sockets, deadline);
      if (!ready.ok()) {
        spdlog::error("shard {}: poll failed: {}", id_, ErrorText(ready.status()));
        break;
      }
      for (size_t i : *ready) {
        const Source& src = sources[i];
        Frames frames;
        auto got = src.socket->TryRecv(&frames);
        if (!got.ok() || !*got) continue;
        if (src.dealer) frames.insert(frames.begin(), Frame());  // no routing id
        src.range->core->Handle(std::move(frames), &out);
        src.range->SendAll(&out);
      }
    }
    for (ServedRange& r : ranges_) {
      r.core->Tick(&out);
      r.SendAll(&out);
      if (!r.own() && r.core->stop_requested() && !r.stopped) {
        r.stopped = true;
        spdlog::info("shard {}: stop received for shard {}'s range", id_, r.range);
      }
    }
    if (clock->Now() >= next_report) {
      UpdateReport();
      next_report = clock->Now() + std::chrono::milliseconds(50);
    }
    applied_clock_ = own().applied_clock();
    holds_values_ = own().initialized();
    holds_keys_ = own().has_keys();
    MaybeCheckpoint(false);
  }
  MaybeCheckpoint(true);
  const ShardCore& core = own();
  spdlog::info("shard {}: final: steps {}, applied through clock {}, incomplete steps {}, "
               "updates applied {}, stale {}, dropped {}",
               id_, core.steps(), core.applied_clock(), core.incomplete_steps(),
               core.updates_applied(), core.stale_pushes(), core.dropped_pushes());
  if (core.replication_epoch() != 0 || core.replica_checks() > 0) {
    std::string held;
    for (const auto& [range, rec] : core.replica_records()) {
      held += (held.empty() ? "" : ", ") + std::string("shard ") + std::to_string(range) +
              "'s through record " + std::to_string(rec);
    }
    spdlog::info("shard {}: replication: range epoch {}, records {}, durable through record {}; "
                 "replicas held: {}; replica checks {}, mismatches {}",
                 id_, core.replication_epoch(), core.replication_record(),
                 core.durable_record(), held.empty() ? "none" : held, core.replica_checks(),
                 core.replica_mismatches());
  }
  if (core.restored()) {
    spdlog::info("shard {}: since its restore: {} acknowledged push(es) lost, {} clock(s) closed "
                 "with none of their pushes",
                 id_, core.lost_updates(), core.skipped_clocks());
  }
  for (const ServedRange& h : taken_over()) {
    spdlog::info("shard {}: served shard {}'s range since its promotion (epoch {}): steps {}, "
                 "applied through clock {}, updates applied {}; {} acknowledged push(es) lost, {} "
                 "clock(s) closed with none of their pushes",
                 id_, h.range, h.epoch, h.core->steps(), h.core->applied_clock(),
                 h.core->updates_applied(), h.core->lost_updates(), h.core->skipped_clocks());
  }
  if (!options_.ledger.empty()) WriteLedger();
  serving_ended_ = true;
  done_ = true;
}

bool ShardServer::ReplicationSettled() const {
  if (!own().replicas_final()) return false;
  for (const ServedRange& r : ranges_) {
    if (r.core->durable_record() < r.core->replication_record()) return false;
  }
  return true;
}

void ShardServer::WriteLedger() const {
  // Written whole to a temporary name, then renamed: a reader sees all or
  // nothing.
  const std::string tmp = options_.ledger + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    spdlog::error("shard {}: cannot write the ledger to {}: {}", id_, tmp, std::strerror(errno));
    return;
  }
  const auto range = [&](uint32_t id, const char* role, uint64_t epoch, uint64_t record,
                         bool last, uint32_t crc, const AppliedLedger& ledger) {
    std::fprintf(f, "range %u role %s epoch %lu record %lu last %d crc %08x pushes %lu doubles %lu\n%s",
                 id, role, static_cast<unsigned long>(epoch), static_cast<unsigned long>(record),
                 last ? 1 : 0, crc, static_cast<unsigned long>(ledger.size()),
                 static_cast<unsigned long>(ledger.doubles()), ledger.Text().c_str());
  };
  std::fprintf(f, "# pacer-server ledger: shard %u; one block per range it served or backed up\n",
               id_);
  if (own().initialized() && own().has_keys() && own().deposed_epoch() != 0) {
    // Its range failed over while it was cut off: the epoch that took over.
    range(id_, "deposed", own().deposed_epoch(), own().replication_record(), true,
          own().state_crc(), own().ledger());
  } else if (own().initialized() && own().has_keys()) {
    range(id_, "primary", own().replication_epoch(), own().replication_record(), true,
          own().state_crc(), own().ledger());
  }
  for (const ServedRange& h : taken_over()) {
    const bool deposed = h.core->deposed_epoch() != 0;
    range(h.range, deposed ? "deposed" : "primary", deposed ? h.core->deposed_epoch() : h.epoch,
          h.core->replication_record(), true, h.core->state_crc(), h.core->ledger());
  }
  for (const auto& [id, v] : own().replica_views()) {
    range(id, "backup", v.epoch, v.record, v.last, v.crc, *v.ledger);
  }
  const bool ok = std::fflush(f) == 0 && std::ferror(f) == 0;
  std::fclose(f);
  if (!ok || std::rename(tmp.c_str(), options_.ledger.c_str()) != 0) {
    spdlog::error("shard {}: cannot write the ledger to {}: {}", id_, options_.ledger,
                  std::strerror(errno));
    return;
  }
  spdlog::info("shard {}: ledger written to {}", id_, options_.ledger);
}

}  // namespace pacer
