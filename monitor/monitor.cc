#include "monitor/monitor.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <tuple>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "ps/base/messages.h"
#include "ps/base/rpc.h"
#include "ps/optimizer.h"
#include "ps/partition.h"
#include "ps/shard.h"
#include "ps/table.h"
#include "ps/staleness.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// Interval rounds that moved a size are logged at most this often.
constexpr Duration kPolicyLogEvery = std::chrono::seconds(5);

policy::PolicyOptions PolicyFor(const MonitorOptions& o) {
  policy::PolicyOptions p = o.policy;
  p.mode = o.mode;
  p.batch.global_batch = o.global_batch;
  return p;
}

}  // namespace

MonitorCore::MonitorCore(const MonitorOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      registry_(options.registry ? options.registry : std::make_shared<prometheus::Registry>()),
      server_(*registry_, "monitor", clock, spdlog::level::warn),
      metrics_(*registry_),
      created_at_(clock->Now()),
      policy_(PolicyFor(options), clock),
      model_({options.optimizer, options.optimizer_settings, options.max_message_bytes,
              options.data_stream},
             &journal_) {
  server_.SetIdentity(options_.job_id, 0, "monitor");
  metrics_.replicas_wanted->Set(options_.replicas);
}

bool MonitorCore::finished() const {
  return state_ == wire::JobState::Stopped && clock_->Now() >= stopped_at_ + options_.stop_grace;
}

std::optional<double> MonitorCore::seconds_running() const {
  if (!started_at_) return std::nullopt;
  return ToSeconds(clock_->Now() - *started_at_);
}

std::vector<uint32_t> MonitorCore::LiveWorkers() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, w] : workers_) {
    if (w.alive && !w.done) ids.push_back(id);
  }
  return ids;
}

std::vector<uint32_t> MonitorCore::KnownWorkerIds() const {
  std::vector<uint32_t> ids;
  for (const auto& [id, w] : workers_) ids.push_back(id);
  return ids;
}

std::vector<uint32_t> MonitorCore::KnownShardIds() const {
  std::vector<uint32_t> ids;
  for (const ShardState& s : shards_) ids.push_back(s.id);
  return ids;
}

void MonitorCore::ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                             const std::string& reason, std::vector<Outgoing>* out) {
  out->push_back({peer, -1, server_.Error(to, code, reason)});
}

msg::JobConfig MonitorCore::Job() const {
  msg::JobConfig j;
  j.mode = options_.mode;
  j.optimizer = options_.optimizer;
  j.optimizer_settings = options_.optimizer_settings;
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
  return j;
}

wire::Policy MonitorCore::WirePolicy() const {
  if (options_.policy.kind == policy::Kind::kAdaptiveBatch) return wire::Policy::AdaptiveBatch;
  if (options_.policy.kind == policy::Kind::kPacer) return wire::Policy::Pacer;
  return wire::Policy::Fixed;
}

msg::ShardMap MonitorCore::Map() const {
  msg::ShardMap m;
  m.version = map_version_;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!HoldsKeys(i)) continue;  // idle or drained
    m.shards.push_back({shards_[i].id, shard_address(i), ranges_[i].first, ranges_[i].second,
                        shard_key(i), shards_[i].backups, shards_[i].epoch});
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
  } else if (auto w = workers_.find(sender); w != workers_.end()) {
    bound = w->second.public_key;
  } else {
    for (const ShardState& s : shards_) {
      if (s.id == sender) bound = s.public_key;
    }
  }
  auto refused = server_.CheckSender(peer, bound, d);
  if (!refused) return true;
  out->push_back({peer, -1, std::move(*refused)});
  return false;
}

void MonitorCore::OnRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Register r = msg::Read<msg::Register>(d);
  if (state_ == wire::JobState::Stopped) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "the job has stopped", out);
  }
  if (r.role == wire::Role::Shard) {
    std::string address = r.address;
    if (address.empty()) {
      return ReplyError(peer, d.env, wire::ErrorCode::BadHeader, "a shard must give its address", out);
    }
    if (r.shard_id != 0) return OnShardReturn(peer, d, out);
    for (auto& s : shards_) {
      if (s.address == address) {  // a retried registration, or a restart
        if (!KeyMayClaim(s.public_key, peer, std::string("shard ").append(std::to_string(s.id)), d, out)) return;
        if (map_built_ && r.incarnation != s.incarnation) {
          return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                            "shard " + std::to_string(s.id) + " at " + address +
                                " restarted without a checkpoint: its parameters are lost (run "
                                "shards with --data-dir to make them survive a restart)",
                            out);
        }
        s.incarnation = r.incarnation;
        if (s.public_key != peer.peer_key()) {
          s.public_key = peer.peer_key();
          if (map_built_) {  // workers learn its new key with the map
            BumpMapVersion();
          }
          journal_.Mark();
        }
        out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
        return;
      }
    }
    ShardState s;
    s.id = next_id_++;
    s.address = address;
    s.last_seen = clock_->Now();
    s.incarnation = r.incarnation;
    s.public_key = peer.peer_key();
    s.node = r.node;
    shards_.push_back(s);
    if (map_built_) ranges_.emplace_back(0, 0);  // idle until pacerctl add-shard
    journal_.Mark();
    UpdateShardGauges();
    spdlog::info("shard {} registered at {}{}", s.id, address,
                 map_built_ ? " (idle: pacerctl add-shard gives it keys)" : "");
    out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
    return;
  }
  if (r.role != wire::Role::Worker) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only workers and shards register", out);
  }
  const std::string token = r.address;
  if (!token.empty()) {
    auto known = worker_tokens_.find(token);
    if (known != worker_tokens_.end()) {  // a retried registration
      const WorkerState& w = workers_.at(known->second);
      if (!KeyMayClaim(w.public_key, peer, std::string("worker ").append(std::to_string(w.id)), d, out)) return;
      out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{w.id, w.rank, Job()})});
      return;
    }
  }
  WorkerState w;
  w.id = next_id_++;
  w.public_key = peer.peer_key();
  if (!token.empty()) worker_tokens_[token] = w.id;
  w.rank = LowestFreeRank();
  next_rank_ = std::max(next_rank_, w.rank + 1);
  w.last_seen = clock_->Now();
  if (state_ == wire::JobState::Running) {
    uint64_t min_clock = UINT64_MAX;
    for (uint32_t id : LiveWorkers()) min_clock = std::min(min_clock, workers_[id].clock);
    if (min_clock == UINT64_MAX) {
      // Nobody trains (the whole cluster restarted): start past the
      // furthest clock any shard has applied.
      int64_t applied = -1;
      for (const auto& s : shards_) applied = std::max(applied, s.applied_clock);
      min_clock = static_cast<uint64_t>(applied + 1);
    }
    w.clock = min_clock;
    w.start_clock = w.clock;
  }
  workers_[w.id] = w;
  awaiting_workers_ = false;
  spdlog::info("worker {} registered as rank {}", w.id, w.rank);
  if (map_built_) UpdatePolicyWorkers();
  ChangeMembership("joined", "worker " + std::to_string(w.id) + " joined");
  workers_[w.id].joined_version = membership_version_;
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
  const auto at = ShardIndex(r.shard_id);
  if (!at) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "this monitor has no shard " + std::to_string(r.shard_id) + " in job " +
                          std::to_string(options_.job_id) +
                          " (was the monitor restarted without its --data-dir?)",
                      out);
  }
  ShardState& s = shards_[*at];
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
      if (map_built_) {  // workers learn its new address (or key) with the map
        BumpMapVersion();
      }
    }
    // Tell it its keys and the membership again.
    s.acked_model = false;
    s.acked_membership = 0;
    s.last_sent = TimePoint{};
    s.down = false;
    s.last_seen = clock_->Now();
    journal_.Mark();
    UpdateShardGauges();
    spdlog::info("shard {} is back from its checkpoint (map v{}) at {}{}", s.id,
                 r.checkpoint_map_version, address,
                 moved ? "; it moved: shard map v" + std::to_string(map_version_) : "");
    FailOverRestarted(*at);
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::RegisterReply{s.id, 0, Job()})});
}

uint32_t MonitorCore::LowestFreeRank() const {
  std::set<uint32_t> taken;
  for (uint32_t id : LiveWorkers()) taken.insert(workers_.at(id).rank);
  uint32_t r = 0;
  while (taken.count(r)) ++r;
  return r;
}

void MonitorCore::AssignPartitions() {
  if (partitions_.empty()) return;
  std::map<uint32_t, std::vector<size_t>> owned;  // live worker -> partitions
  std::vector<uint32_t> live = LiveWorkers();
  std::sort(live.begin(), live.end(),
            [&](uint32_t a, uint32_t b) { return workers_.at(a).rank < workers_.at(b).rank; });
  for (uint32_t id : live) owned[id];
  for (size_t p = 0; p < partitions_.size(); ++p) {
    // A worker that died while handing a partition over cannot report any
    // more: the new owner starts from its last reported position.
    if (partitions_[p].releasing != 0 && !owned.count(partitions_[p].releasing)) {
      partitions_[p].releasing = 0;
    }
    auto it = owned.find(partitions_[p].owner);
    if (it != owned.end()) {
      it->second.push_back(p);
    } else {
      partitions_[p].owner = 0;
    }
  }
  if (live.empty()) return;
  auto fewest = [&] {
    uint32_t best = live[0];
    for (uint32_t id : live) {
      if (owned[id].size() < owned[best].size()) best = id;
    }
    return best;
  };
  auto most = [&] {
    uint32_t best = live[0];
    for (uint32_t id : live) {
      if (owned[id].size() > owned[best].size()) best = id;
    }
    return best;
  };
  for (size_t p = 0; p < partitions_.size(); ++p) {
    if (partitions_[p].owner != 0) continue;
    const uint32_t to = fewest();
    partitions_[p].owner = to;
    owned[to].push_back(p);
    spdlog::info("data partition {} (epoch {}, offset {}) -> worker {}", p, partitions_[p].epoch,
                 partitions_[p].offset, to);
  }
  for (;;) {
    const uint32_t from = most(), to = fewest();
    if (owned[from].size() < owned[to].size() + 2) break;
    // Not one that is still being handed over to `from`.
    auto pick = std::find_if(owned[from].rbegin(), owned[from].rend(),
                             [&](size_t q) { return partitions_[q].releasing == 0; });
    if (pick == owned[from].rend()) break;
    const size_t p = *pick;
    owned[from].erase(std::next(pick).base());
    owned[to].push_back(p);
    partitions_[p].owner = to;
    partitions_[p].releasing = from;
    spdlog::info("data partition {} (epoch {}, offset {}) moves from worker {} to worker {}", p,
                 partitions_[p].epoch, partitions_[p].offset, from, to);
  }
}

uint32_t MonitorCore::Evaluator() const {
  uint32_t best = 0, rank = UINT32_MAX;
  for (uint32_t id : LiveWorkers()) {
    if (workers_.at(id).rank < rank) {
      rank = workers_.at(id).rank;
      best = id;
    }
  }
  return best;
}

namespace {
// "2, 3", or "none".
std::string IdList(const std::vector<uint32_t>& ids) {
  std::string s;
  for (uint32_t id : ids) s += (s.empty() ? "" : ", ") + std::to_string(id);
  return s.empty() ? "none" : s;
}
}  // namespace

std::string MonitorCore::HostOf(size_t shard) const {
  const ShardState& s = shards_[shard];
  if (!s.node.empty()) return s.node;
  // tcp://HOST:PORT (HOST may be [v6]).
  std::string_view a = s.address;
  if (auto p = a.find("://"); p != std::string_view::npos) a.remove_prefix(p + 3);
  if (auto p = a.rfind(':'); p != std::string_view::npos) a = a.substr(0, p);
  return std::string(a);
}

bool MonitorCore::AssignReplicas() {
  if (!map_built_) return false;
  auto usable = [&](size_t i) {
    return !shards_[i].down && !shards_[i].drained && !shards_[i].retired &&
           !(handoff_ && handoff_->shard == i);
  };
  std::map<uint32_t, size_t> index;
  for (size_t i = 0; i < shards_.size(); ++i) index[shards_[i].id] = i;
  // The shard that serves range i (itself, or after a failover its host).
  auto primary = [&](size_t i) {
    if (shards_[i].host == 0) return i;
    auto it = index.find(shards_[i].host);
    return it == index.end() ? i : it->second;
  };
  // Ranges each shard holds or backs: new backups go to the least loaded.
  std::vector<size_t> load(shards_.size(), 0);
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (HoldsKeys(i)) ++load[primary(i)];
    for (uint32_t b : shards_[i].backups) {
      if (auto it = index.find(b); it != index.end()) ++load[it->second];
    }
  }
  bool changed = false;
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::vector<uint32_t>& set = shards_[i].backups;
    const std::vector<uint32_t> before = set;
    const size_t want = HoldsKeys(i) ? options_.replicas : 0;
    const size_t p = primary(i);
    // A backup goes when it is down, drained or gone, or the range needs
    // fewer (a smaller --replicas, or the range moved away). Nor is a range
    // backed up by the shard it is named after once it is served elsewhere
    // (a failover, and that shard came back): a shard holds replicas of
    // other ranges only (ShardCore::SetBacking), so it would hold none, and
    // the range would have no copy to fail over to (found by the crash
    // loop, bench/replication/crash_loop.sh).
    std::erase_if(set, [&](uint32_t b) {
      auto it = index.find(b);
      const bool drop =
          it == index.end() || it->second == p || it->second == i || !usable(it->second);
      if (drop && it != index.end()) --load[it->second];
      return drop;
    });
    while (set.size() > want) {
      --load[index.at(set.back())];
      set.pop_back();
    }
    while (set.size() < want) {
      std::optional<size_t> best;
      std::tuple<bool, size_t, size_t> best_key{};
      for (size_t j = 0; j < shards_.size(); ++j) {
        if (j == p || j == i || !usable(j) || std::count(set.begin(), set.end(), shards_[j].id) > 0) {
          continue;
        }
        // Fell behind on this range a short while ago (DropLagging), or
        // stands by for it: its old replica of this epoch would count as in
        // sync before its new seed came.
        if (auto d = shards_[i].lag_dropped.find(shards_[j].id);
            (d != shards_[i].lag_dropped.end() && clock_->Now() < d->second) ||
            std::count(shards_[i].standby.begin(), shards_[i].standby.end(), shards_[j].id) > 0) {
          continue;
        }
        const std::string host = HostOf(j);
        bool shared = host == HostOf(p);
        for (uint32_t b : set) shared = shared || host == HostOf(index.at(b));
        const std::tuple<bool, size_t, size_t> key{shared, load[j], j};
        if (!best || key < best_key) {
          best = j;
          best_key = key;
        }
      }
      if (!best) break;  // too few live shards
      set.push_back(shards_[*best].id);
      ++load[*best];
    }
    if (set != before) {
      changed = true;
      if (want > 0) {
        spdlog::info("keys [{}, {}) on shard {} (epoch {}): backups {}", ranges_[i].first,
                     ranges_[i].second, shards_[i].id, shards_[i].epoch,
                     IdList(set));
      }
    }
  }
  for (size_t i = 0; i < shards_.size(); ++i) PruneStandby(i);
  size_t short_of_k = 0;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (HoldsKeys(i) && shards_[i].backups.size() < options_.replicas) ++short_of_k;
  }
  if (short_of_k != under_replicated_) {
    if (short_of_k > 0) {
      spdlog::warn("{} key range(s) have fewer than {} backup(s): too few live shards (each backup "
                   "must be another shard than its range's primary); a shard that registers "
                   "fills the gap",
                   short_of_k, options_.replicas);
    } else if (options_.replicas > 0) {
      spdlog::info("every key range has its {} backup(s)", options_.replicas);
    }
    under_replicated_ = short_of_k;
  }
  if (changed) {
    BumpMapVersion();
  }
  UpdateReplicaGauges();
  return changed;
}

void MonitorCore::UpdateReplicaGauges() {
  metrics_.replicas_wanted->Set(options_.replicas);
  metrics_.under_replicated->Set(static_cast<double>(under_replicated_));
  if (options_.replicas == 0) return;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const prometheus::Labels labels{{"shard", std::to_string(shards_[i].id)}};
    const bool has_range = HoldsKeys(i);
    if (!has_range) {
      metrics_.range_backups->Remove(&metrics_.range_backups->Add(labels));
      continue;
    }
    metrics_.range_backups->Add(labels).Set(static_cast<double>(shards_[i].backups.size()));
  }
}

void MonitorCore::BumpMapVersion() {
  ++map_version_;
  metrics_.map_version->Set(static_cast<double>(map_version_));
  journal_.Mark();
}

void MonitorCore::UpdateShardGauges() {
  metrics_.shards->Set(static_cast<double>(shards_.size()));
  metrics_.shards_up->Set(static_cast<double>(
      std::count_if(shards_.begin(), shards_.end(), [](const ShardState& s) { return !s.down; })));
}

void MonitorCore::OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (auto refused = model_.Declare(msg::Read<msg::DeclareModel>(d), d.env.sender)) {
    return ReplyError(peer, d.env, refused->code, refused->reason, out);
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void MonitorCore::OnHeartbeat(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Heartbeat hb = msg::Read<msg::Heartbeat>(d);
  if (hb.role == wire::Role::Shard) return OnShardHeartbeat(peer, d.env, hb, out);
  OnWorkerHeartbeat(peer, d.env, hb, out);
}

void MonitorCore::OnShardHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                                   std::vector<Outgoing>* out) {
  const auto at = ShardIndex(env.sender);
  if (at) {
    ShardState* shard = &shards_[*at];
    shard->last_seen = clock_->Now();
    // The heartbeat says max(0, applied clock).
    shard->applied_clock = std::max(shard->applied_clock, static_cast<int64_t>(hb.clock));
    shard->checkpoint_age = hb.checkpoint_age_seconds;
    shard->reported_applied = static_cast<int64_t>(hb.clock);
    shard->replicas.clear();
    for (const msg::ShardInfo& r : hb.replicas) shard->replicas[r.id] = r.epoch;
    TakeServing(*shard, hb.serving);
    for (const msg::RangeLag& r : hb.lag) {
      // From the range's primary (the shard itself, or its host since a
      // failover), at the range's epoch.
      const auto ri = ShardIndex(r.range);
      if (!ri || shards_[*ri].epoch != r.epoch || shard_host(*ri) != shard->id) continue;
      shards_[*ri].lag = r;
      shards_[*ri].lag_at = shard->last_seen;
    }
    if (hb.done && !shard->down) {
      shard->down = true;
      spdlog::warn("shard {} left (SIGTERM, after its final checkpoint); its keys are unserved "
                   "until it registers again",
                   shard->id);
      UpdateShardGauges();
    } else if (!hb.done && shard->down && shard->acked_model) {
      shard->down = false;  // it was only silent for a while
      UpdateShardGauges();
    }
  }
  msg::HeartbeatReply reply;
  reply.state = state_;
  reply.membership_version = membership_version_;
  reply.stop_reason = stop_reason_;
  reply.faults = faults_.For("server", env.sender);
  reply.faults_version = faults_.version();
  reply.lr_overrides = model_.LrOverridesByIndex();
  reply.lr_overrides_version = model_.lr_overrides_version();
  if (at) {
    // Ranges it still serves since a promotion that another shard serves
    // now (they failed over again while it was cut off).
    for (const msg::ShardInfo& r : hb.serving) {
      const auto ri = ShardIndex(r.id);
      if (!ri || shards_[*ri].epoch <= r.epoch) continue;  // not superseded (yet)
      msg::ShardInfo gone;
      gone.id = r.id;
      gone.epoch = shards_[*ri].epoch;
      reply.deposed_ranges.push_back(std::move(gone));
    }
    DropLagging(*at, hb.lagging);
    if (hb.handed_off && !handoff_ && !move_ && shards_[*at].host == 0 && !shards_[*at].retired &&
        HoldsKeys(*at)) {
      // It stopped applying for a drain this monitor does not know of (it
      // restarted meanwhile, or gave the drain up too early): finish it.
      spdlog::warn("shard {} says it handed its range over; finishing that drain", shards_[*at].id);
      handoff_ = Handoff{*at, clock_->Now(), clock_->Now()};
    }
    StepHandoff(*at, hb.handed_off);
    FillReplication(*at, &reply);
    if (shards_[*at].retired) {
      // Drained: its range is served by the backup it handed it to.
      reply.state = wire::JobState::Stopped;
      reply.stop_reason = "drained: its range is served by shard " +
                          std::to_string(shards_[*at].host);
    }
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
}

void MonitorCore::TakeServing(ShardState& host, const std::vector<msg::ShardInfo>& serving) {
  for (const msg::ShardInfo& r : serving) {
    for (ShardState& s : shards_) {
      if (s.id != r.id || s.host != host.id || s.epoch != r.epoch || s.served_at == r.address) {
        continue;
      }
      s.served_at = r.address;
      s.promoted_from = 0;  // served: nothing to go back to
      // Its keys and the membership go to the range's new address; the
      // workers take it with the map.
      s.acked_model = false;
      s.acked_membership = 0;
      s.last_sent = TimePoint{};
      BumpMapVersion();
      spdlog::info("shard {}'s range is served by shard {} at {} (epoch {}): shard map v{}", s.id,
                   host.id, r.address, s.epoch, map_version_);
    }
  }
}

bool MonitorCore::FailOver() {
  if (options_.replicas == 0 || !map_built_ || state_ == wire::JobState::Stopped) return false;
  bool changed = false;
  for (size_t i = 0; i < shards_.size(); ++i) {
    ShardState& s = shards_[i];
    if (!HoldsKeys(i) || s.drained) continue;
    // Its primary: the shard itself, or after a failover the one hosting it.
    const auto h = s.host == 0 ? std::nullopt : ShardIndex(s.host);
    const ShardState* host = h ? &shards_[*h] : nullptr;
    const bool primary_down = s.host == 0 ? s.down : (host == nullptr || host->down);
    if (!primary_down) continue;
    const ShardState& gone = host == nullptr ? s : *host;
    const std::string why = fmt::format("shard {} silent for {:.2f} s (--shard-lease {:.2f} s)",
                                        gone.id, ToSeconds(clock_->Now() - gone.last_seen),
                                        ToSeconds(options_.shard_lease));
    if (handoff_ && handoff_->shard == i) {
      spdlog::warn("drain of shard {}: it died before handing its range over; a failover "
                   "takes it",
                   s.id);
      handoff_.reset();
    }
    // A promotion lost before it was served goes back at once only to a
    // live shard; to a dead one when it returns (FailOverRestarted), so
    // that a backup seeded meanwhile may still report and take it.
    changed |= PromoteBackup(i, why) || RevertUnservedPromotion(i, why, /*to_down=*/false);
  }
  if (changed) UpdateReplicaGauges();
  return changed;
}

bool MonitorCore::RevertUnservedPromotion(size_t i, const std::string& why, bool to_down) {
  ShardState& s = shards_[i];
  if (s.host == 0 || !s.served_at.empty() || s.promoted_from == 0 || s.promoted_from == s.host) {
    return false;
  }
  // No worker heard of the promoted shard's address for the range (it
  // goes out with the map once the shard reports serving it), so it
  // acknowledged nothing of it; what its replica held came from the last
  // shard that served the range, whose state has all of it (or, if it
  // died, its checkpoint is what is left).
  const uint32_t lost = s.host, back = s.promoted_from;
  const auto bi = ShardIndex(back);
  if (!bi || shards_[*bi].retired || shards_[*bi].drained) return false;  // stopped for good
  if (shards_[*bi].down && !to_down) return false;
  s.host = back == s.id ? 0 : back;
  s.promoted_from = 0;
  s.served_at.clear();
  s.epoch = ++epoch_;  // the lost shard, if only cut off, lets go of it
  s.backups.clear();
  s.standby.clear();
  BumpMapVersion();
  spdlog::warn("shard {}'s keys [{}, {}) go back to shard {} at epoch {}: {}, shard {} had not "
               "served them since its promotion, and no backup reported holding them",
               s.id, ranges_[i].first, ranges_[i].second, back, s.epoch, why, lost);
  return true;
}

void MonitorCore::FailOverRestarted(size_t at) {
  ShardState& s = shards_[at];
  // A new process: it holds no replica until its heartbeats say so (a
  // failover must not count on what the old one held).
  s.replicas.clear();
  if (options_.replicas == 0 || !map_built_ || state_ == wire::JobState::Stopped) return;
  bool changed = false;
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (!HoldsKeys(i) || shards_[i].drained ||
        shard_host(i) != s.id) {
      continue;
    }
    // It restarted before its lease ran out (else the range failed over
    // already). Its checkpoint lacks what was applied since; a backup that
    // holds the range has every durable push, and takes it over now. With
    // none, the range comes back from the checkpoint (pushes since lost).
    if (handoff_ && handoff_->shard == i) {
      spdlog::warn("drain of shard {}: it restarted before handing its range over; a failover "
                   "takes it",
                   shards_[i].id);
      handoff_.reset();
    }
    const std::string why = fmt::format(
        "shard {} restarted (a new process: its checkpoint lacks what it applied since)", s.id);
    // Promoted here and not served: the new process holds neither a
    // replica nor a checkpoint of it; back to the last that served it.
    changed |= PromoteBackup(i, why, /*restarted=*/true) ||
               RevertUnservedPromotion(i, why, /*to_down=*/true);
  }
  for (size_t i = 0; i < shards_.size() && i < ranges_.size(); ++i) {
    // Ranges promoted away from it to a shard lost before serving them
    // (FailOver waits for a backup to report, or for this shard): back.
    ShardState& r = shards_[i];
    const auto h = r.host == 0 ? std::nullopt : ShardIndex(r.host);
    if (r.promoted_from != s.id || !r.served_at.empty() || !h || !shards_[*h].down ||
        r.drained || !HoldsKeys(i)) {
      continue;
    }
    const std::string why = fmt::format("shard {} is lost and shard {} is back", r.host, s.id);
    changed |= PromoteBackup(i, why) || RevertUnservedPromotion(i, why, /*to_down=*/false);
  }
  if (changed) UpdateReplicaGauges();
}

std::optional<uint32_t> MonitorCore::InSyncBackup(size_t i, bool standby) const {
  const ShardState& s = shards_[i];
  const auto in_sync = [&](uint32_t b) {
    const auto bi = ShardIndex(b);
    if (!bi || shards_[*bi].down || shards_[*bi].drained || shards_[*bi].retired ||
        (handoff_ && handoff_->shard == *bi)) {
      return false;  // gone, or about to stop (a drain in progress)
    }
    auto held = shards_[*bi].replicas.find(s.id);
    return held != shards_[*bi].replicas.end() && held->second == s.epoch;
  };
  for (uint32_t b : s.backups) {
    if (in_sync(b)) return b;
  }
  if (standby) {
    for (uint32_t b : s.standby) {
      if (in_sync(b)) return b;
    }
  }
  return std::nullopt;
}

bool MonitorCore::PruneStandby(size_t i) {
  ShardState& s = shards_[i];
  if (s.standby.empty()) return false;
  const bool has_range = HoldsKeys(i);
  const uint32_t primary = s.host == 0 ? s.id : s.host;
  // Covered: a backup in the set holds the range. With none in the set the
  // primary calls every applied push durable at once (the guarantee of
  // --replicas 0), so a standby would lack durable pushes: let go too.
  const bool covered = InSyncBackup(i).has_value() || s.backups.empty();
  const std::vector<uint32_t> before = s.standby;
  std::erase_if(s.standby, [&](uint32_t b) {
    const auto bi = ShardIndex(b);
    return covered || !has_range || !bi || b == primary || shards_[*bi].down ||
           shards_[*bi].drained || shards_[*bi].retired ||
           std::count(s.backups.begin(), s.backups.end(), b) > 0;
  });
  if (s.standby == before) return false;
  if (covered) {
    spdlog::info("keys [{}, {}) (shard {}'s range): backup {} holds the range; standby {} lets "
                 "its replica go",
                 ranges_[i].first, ranges_[i].second, s.id, IdList(s.backups), IdList(before));
  }
  journal_.Mark();
  return true;
}

bool MonitorCore::PromoteBackup(size_t i, const std::string& reason, bool restarted) {
  ShardState& s = shards_[i];
  const uint32_t before = s.host == 0 ? s.id : s.host;
  // A live backup that reported a replica of this epoch takes over (a
  // standby, when no backup in the set can, unless this is a drain).
  const bool drain = handoff_ && handoff_->shard == i;
  if (const std::optional<uint32_t> backup = InSyncBackup(i, /*standby=*/!drain)) {
    const uint32_t b = *backup;
    const bool from_standby =
        std::count(s.standby.begin(), s.standby.end(), b) > 0 &&
        std::count(s.backups.begin(), s.backups.end(), b) == 0;
    // Kept until b serves the range (TakeServing): if b is lost before,
    // the range goes back to the last shard that served it (Revert-
    // UnservedPromotion): `before`, unless `before` never served it either.
    if (s.host == 0 || !s.served_at.empty() || s.promoted_from == 0) s.promoted_from = before;
    s.host = b;
    s.served_at.clear();
    s.epoch = ++epoch_;
    // The promoted replica is the primary now; AssignReplicas gives the
    // range a new backup, seeded from it while training goes on.
    s.backups.clear();
    s.standby.clear();
    s.failed_over_at = clock_->Now();
    ++failovers_;
    if (from_standby) {
      spdlog::warn("failover of shard {}'s range: to standby {} (dropped for falling behind; "
                   "durability was held since, so its replica holds every durable push; no "
                   "backup in the set was known to hold the range)",
                   s.id, b);
    }
    (drain ? metrics_.handoffs : restarted ? metrics_.restart_failovers : metrics_.failovers)
        ->Increment();
    journal_.Mark();
    spdlog::warn("failover: {}; shard {}'s keys [{}, {}) go from shard {} to its backup, shard {}, "
                 "at epoch {}",
                 reason, s.id, ranges_[i].first, ranges_[i].second, before, b, s.epoch);
    return true;
  }
  return false;
}

void MonitorCore::DropLagging(size_t from, const std::vector<msg::ShardInfo>& lagging) {
  if (options_.replicas == 0 || !map_built_ || lagging.empty()) return;
  const TimePoint now = clock_->Now();
  bool changed = false;
  for (const msg::ShardInfo& r : lagging) {
    const auto ri = ShardIndex(r.id);
    // Only the range's primary speaks for it (not one it failed over from).
    if (!ri || shard_host(*ri) != shards_[from].id) continue;
    ShardState& s = shards_[*ri];
    for (uint32_t b : r.backups) {
      auto it = std::find(s.backups.begin(), s.backups.end(), b);
      if (it == s.backups.end()) continue;
      s.backups.erase(it);
      s.lag_dropped[b] = now + kLagCooldown;
      // Kept as a standby; its primary is told to hold durability
      // (hold_durable for its own range, hold_durable_ranges for one it
      // serves since a promotion).
      if (std::count(s.standby.begin(), s.standby.end(), b) == 0) {
        s.standby.push_back(b);
      }
      metrics_.backups_dropped->Increment();
      changed = true;
      spdlog::warn("backup {} of shard {}'s range fell behind (its primary, shard {}, waited over "
                   "{:.0f} s for its acknowledgement): dropped from the set, kept as a standby "
                   "until a new backup holds the range; not given this range again for {:.0f} s",
                   b, s.id, shards_[from].id, ToSeconds(ShardCore::kBackupLagLimit),
                   ToSeconds(kLagCooldown));
    }
  }
  if (!changed) return;
  // The new set goes out before anyone counts on the dropped backup; a
  // free shard, if any, takes its place (AssignReplicas counts only its
  // own changes, so the map's version goes up here too).
  AssignReplicas();
  BumpMapVersion();
}

void MonitorCore::StepHandoff(size_t i, bool handed_off) {
  if (!handoff_ || handoff_->shard != i) return;
  ShardState& s = shards_[i];
  const TimePoint now = clock_->Now();
  if (!handed_off) {
    if (now - handoff_->started >= kHandoffTimeout) {
      // Never got going (e.g. the shard's backups never held its last
      // record): given up; the shard forgets the request unless it has
      // stopped applying, and then says so and the drain is finished.
      spdlog::error("drain of shard {}: not handed over after {:.0f} s; given up (pacerctl "
                    "drain-shard may be asked again)",
                    s.id, ToSeconds(kHandoffTimeout));
      handoff_given_up_.insert(s.id);  // told so: it applies again
      handoff_.reset();
      return;
    }
    if (now - handoff_->reported >= std::chrono::seconds(5)) {
      handoff_->reported = now;
      spdlog::warn("drain of shard {}: waiting {:.1f} s for it to stop and for its backups ({}) "
                   "to hold everything it applied",
                   s.id, ToSeconds(now - handoff_->started), IdList(s.backups));
    }
    return;
  }
  const std::string why = fmt::format(
      "pacerctl drain-shard: shard {} stopped applying and its backups hold all it applied "
      "({:.2f} s)",
      s.id, ToSeconds(now - handoff_->started));
  if (!PromoteBackup(i, why)) {
    // Its backups changed meanwhile: wait for one to report this epoch.
    return;
  }
  s.retired = true;
  handoff_.reset();
  AssignReplicas();
  UpdateShardGauges();
}

void MonitorCore::FillReplication(size_t i, msg::HeartbeatReply* reply) const {
  if (options_.replicas == 0 || !map_built_ || i >= ranges_.size()) return;
  const auto info = [&](size_t j) {
    msg::ShardInfo s;
    s.id = shards_[j].id;
    s.address = shards_[j].address;
    s.public_key = shards_[j].public_key;
    s.epoch = shards_[j].epoch;
    return s;
  };
  const auto add_backups = [&](const std::vector<uint32_t>& ids, std::vector<msg::ShardInfo>* to) {
    for (uint32_t b : ids) {
      for (size_t k = 0; k < shards_.size(); ++k) {
        if (shards_[k].id == b) to->push_back(info(k));
      }
    }
  };
  // The ranges it serves since a failover, with their backups.
  for (size_t j = 0; j < shards_.size(); ++j) {
    if (shards_[j].host != shards_[i].id || !HoldsKeys(j)) continue;
    msg::ShardInfo r;
    r.id = shards_[j].id;
    r.epoch = shards_[j].epoch;
    r.key_begin = ranges_[j].first;
    r.key_end = ranges_[j].second;
    r.backups = shards_[j].backups;
    reply->promote.push_back(std::move(r));
    add_backups(shards_[j].backups, &reply->promote_backups);
    // A standby may be promoted: nothing it lacks may become durable.
    if (!shards_[j].standby.empty()) reply->hold_durable_ranges.push_back(shards_[j].id);
  }
  // Its own range, unless that is served elsewhere now: then it is told
  // so (a shard cut off from the monitor while its range failed over still
  // holds it, and workers with an older map may still reach it).
  if (HoldsKeys(i) && shards_[i].host == 0) {
    reply->replica_epoch = shards_[i].epoch;
    add_backups(shards_[i].backups, &reply->replica_backups);
    reply->hand_off = handoff_ && handoff_->shard == i;
    reply->hand_off_given_up = handoff_given_up_.count(shards_[i].id) > 0;
    // A standby may be promoted: nothing it lacks may become durable.
    reply->hold_durable = !shards_[i].standby.empty();
  } else if (HoldsKeys(i)) {
    reply->replica_epoch = shards_[i].epoch;
    reply->deposed = true;
  }
  // The ranges it backs up, each with its primary's key.
  for (size_t j = 0; j < shards_.size(); ++j) {
    if (j == i || !HoldsKeys(j)) continue;
    const auto& b = shards_[j].backups;
    const auto& sb = shards_[j].standby;
    if (std::find(b.begin(), b.end(), shards_[i].id) != b.end() ||
        std::find(sb.begin(), sb.end(), shards_[i].id) != sb.end()) {
      msg::ShardInfo r = info(j);
      r.public_key = shard_key(j);  // after a failover, the host's
      reply->backing.push_back(std::move(r));
    }
  }
}

void MonitorCore::OnWorkerHeartbeat(const Frame& peer, const Envelope& env,
                                    const msg::Heartbeat& hb, std::vector<Outgoing>* out) {
  auto it = workers_.find(env.sender);
  if (it == workers_.end() || !it->second.alive) {
    if (state_ == wire::JobState::Stopped) {
      msg::HeartbeatReply reply;
      reply.state = state_;
      reply.membership_version = membership_version_;
      reply.stop_reason = stop_reason_;
      out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
      return;
    }
    return ReplyError(peer, env, wire::ErrorCode::NotMember,
                      "worker " + std::to_string(env.sender) +
                          " is not a live member (its lease expired?)",
                      out);
  }
  WorkerState& w = it->second;
  w.last_seen = clock_->Now();
  w.samples_per_second = hb.samples_per_second;
  w.paused = hb.paused;
  if (pause_at_ != 0 && w.clock > pause_at_) {
    // It was further along than the monitor knew (heartbeats lag a few
    // iterations) and holds at a later clock: the others run up to it.
    spdlog::info("worker {} is at clock {}; the hold clock moves up from {}", w.id, w.clock,
                 pause_at_);
    pause_at_ = w.clock;
  }
  w.clock = std::max(w.clock, hb.clock);
  // Read positions first: a worker's last heartbeat (done) carries its final ones.
  TakePositions(w, hb.positions);
  if (stream_) stream_->Report(w.id, hb.chunks, w.last_seen);
  if (hb.done && !w.done) {
    w.done = true;
    spdlog::info("worker {} (rank {}) finished at clock {}", w.id, w.rank, hb.clock);
    ChangeMembership("finished", "worker " + std::to_string(w.id) + " finished");
    if (map_built_) UpdatePolicyWorkers();
  } else {
    ReportTimings(w, hb);
  }
  msg::HeartbeatReply reply = WorkerReply(w);
  StreamHeartbeat(w, hb, &reply);
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(env), reply)});
}

void MonitorCore::StreamHeartbeat(WorkerState& w, const msg::Heartbeat& hb,
                                  msg::HeartbeatReply* reply) {
  if (!stream_) return;
  if (w.alive && !w.done && reply->state == wire::JobState::Running &&
      state_ == wire::JobState::Running) {
    stream_->SetPace(w.id, hb.samples_per_second, w.batch);
    reply->chunks = stream_->Assign(w.id, w.last_seen);
  }
  reply->data_epoch = stream_->epoch();
  if (stream_->TakeChanged()) journal_.Mark();  // saved before the reply goes out
  LogEpochsEnded();
}

void MonitorCore::LogEpochsEnded() {
  if (!stream_) return;
  for (; logged_epoch_ < stream_->epoch(); ++logged_epoch_) {
    const uint32_t e = logged_epoch_;
    std::string shares;
    uint64_t total = 0;
    for (const auto& [id, n] : stream_->samples_in_epoch(e)) total += n;
    for (const auto& [id, n] : stream_->samples_in_epoch(e)) {
      auto it = workers_.find(id);
      shares += fmt::format("{}worker {} (rank {}) {:.1f}%", shares.empty() ? "" : ", ", id,
                            it == workers_.end() ? 0u : it->second.rank,
                            100.0 * static_cast<double>(n) / static_cast<double>(std::max<uint64_t>(1, total)));
    }
    const std::optional<double> tail = stream_->tail_seconds(e);
    spdlog::info("epoch {} done{}: tail {}; samples by worker: {}", e,
                 started_at_ ? fmt::format(" at {:.2f} s", ToSeconds(clock_->Now() - *started_at_))
                             : std::string(),
                 tail ? fmt::format("{:.2f} s", *tail) : std::string("not measured"), shares);
  }
}

DataStreamOptions MonitorCore::StreamOptions() const {
  DataStreamOptions so;
  so.samples = model_.data_samples();
  so.epochs = options_.epochs;
  so.chunk_samples = options_.chunk_samples;
  return so;
}

void MonitorCore::ReleaseDeparted() {
  if (!stream_) return;
  const TimePoint now = clock_->Now();
  for (const auto& [id, w] : workers_) {
    if (!w.alive || w.done) stream_->Release(id, now);
  }
  if (stream_->TakeChanged()) journal_.Mark();
}

void MonitorCore::UpdateStreamGauges() {
  if (!stream_) return;
  const DataStream& s = *stream_;
  metrics_.data_epoch->Set(s.epoch());
  // Once every epoch is trained the epoch gauge says so; the progress
  // would read 1 more (the dashboard adds the two).
  metrics_.data_epoch_progress->Set(s.finished() ? 0.0 : s.epoch_progress());
  auto count = [&](const char* event, uint64_t now, uint64_t* counted) {
    if (now > *counted) metrics_.data_chunks[event]->Increment(static_cast<double>(now - *counted));
    *counted = now;
  };
  count("handed_out", s.chunks_handed_out(), &counted_handed_out_);
  count("taken_over", s.tails_taken_over(), &counted_taken_over_);
  count("returned", s.chunks_returned(), &counted_returned_);
  const auto& samples = s.samples_in_epoch(s.epoch());
  std::set<uint32_t> ranks;
  for (uint32_t id : LiveWorkers()) {
    const uint32_t rank = workers_.at(id).rank;
    auto it = samples.find(id);
    metrics_.data_samples->Add({{"worker_rank", std::to_string(rank)}})
        .Set(it == samples.end() ? 0 : static_cast<double>(it->second));
    ranks.insert(rank);
  }
  for (uint32_t rank : gauged_stream_ranks_) {
    if (!ranks.count(rank)) {
      metrics_.data_samples->Remove(&metrics_.data_samples->Add({{"worker_rank", std::to_string(rank)}}));
    }
  }
  gauged_stream_ranks_ = std::move(ranks);
  if (s.epoch() > 0) {
    if (auto tail = s.tail_seconds(s.epoch() - 1)) metrics_.data_tail->Set(*tail);
  }
}

void MonitorCore::TakePositions(WorkerState& w,
                                const std::vector<wire::PartitionPosition>& positions) {
  std::set<uint32_t> reading;
  for (const wire::PartitionPosition& pp : positions) {
    if (pp.index() >= partitions_.size()) continue;
    reading.insert(pp.index());
    PartitionState& ps = partitions_[pp.index()];
    // Only the worker reading a partition moves it, and only forward.
    const bool reader = ps.releasing != 0 ? ps.releasing == w.id : ps.owner == w.id;
    if (!reader) continue;
    if (std::make_pair(pp.epoch(), pp.offset()) > std::make_pair(ps.epoch, ps.offset)) {
      ps.epoch = pp.epoch();
      ps.offset = pp.offset();
    }
  }
  for (auto& ps : partitions_) {
    // It no longer reads the partition it hands over: its position is final.
    if (ps.releasing == w.id && !reading.count(static_cast<uint32_t>(&ps - partitions_.data()))) {
      ps.releasing = 0;
    }
  }
}

void MonitorCore::ReportTimings(WorkerState& w, const msg::Heartbeat& hb) {
  // Every heartbeat reports where the worker is (its clock), even one
  // that finished no iteration: a straggler stuck in a long one must not
  // look as if it kept its old pace.
  policy::TimingReport r;
  r.iterations = hb.iterations;
  r.samples = uint64_t{hb.iterations} * hb.batch;
  r.compute_seconds = double{hb.compute_seconds_per_sample} * static_cast<double>(r.samples);
  if (hb.samples > 0 && hb.iterations > 0) {
    r.samples = hb.samples;
    r.compute_seconds = hb.compute_seconds;
    r.batch_squares = hb.batch_squares;
    r.batch_compute = hb.batch_compute;
    r.min_compute = hb.compute_min_seconds;
    r.max_compute = hb.compute_max_seconds;
  }
  r.communication_seconds = double{hb.communication_seconds} * hb.iterations;
  r.wait_seconds = double{hb.wait_seconds} * hb.iterations;
  r.memory_limit_batch = hb.memory_limit_batch;
  r.clock = hb.clock;
  r.at = w.last_seen;
  policy_.Report(w.id, r);
  // A worker whose speed just shifted gets its new size in this reply
  // rather than a heartbeat later.
  if (state_ == wire::JobState::Running && policy_.urgent()) RunPolicy(w.last_seen);
}

msg::HeartbeatReply MonitorCore::WorkerReply(const WorkerState& w) const {
  // A worker runs once the job runs and every shard knows it is a member.
  wire::JobState state = state_;
  if (state == wire::JobState::Running && MinAckedMembership() < w.joined_version) {
    state = wire::JobState::Waiting;
  }
  msg::HeartbeatReply reply;
  reply.state = state;
  if (state == wire::JobState::Running) reply.shard_map = Map();
  reply.membership_version = membership_version_;
  reply.start_clock = w.clock;
  reply.partition_count = partition_count_;
  reply.assignment = msg::Assignment{w.batch, w.staleness, w.staleness_range};
  reply.stop_reason = stop_reason_;
  for (size_t p = 0; p < partitions_.size(); ++p) {
    if (partitions_[p].owner == w.id && partitions_[p].releasing == 0) {
      reply.partitions.emplace_back(static_cast<uint32_t>(p), partitions_[p].epoch,
                                    partitions_[p].offset);
    }
  }
  reply.partition_index = reply.partitions.empty() ? 0 : reply.partitions[0].index();
  reply.evaluate = state == wire::JobState::Running && Evaluator() == w.id;
  if (reply.evaluate) reply.evaluate_now = final_eval_;
  reply.pause_at = pause_at_;
  reply.faults = faults_.For("worker", w.id);
  reply.faults_version = faults_.version();
  return reply;
}

void MonitorCore::OnAccuracy(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::AccuracyReport a = msg::Read<msg::AccuracyReport>(d);
  last_accuracy_ = a.accuracy;
  scheduled_evaluator_ |= a.scheduled;
  metrics_.accuracy->Set(a.accuracy);
  metrics_.test_loss->Set(a.loss);
  metrics_.accuracy_reports->Increment();
  auto running = seconds_running();
  // The time schedule's line keeps its form; the clock schedule's names itself.
  const std::string every =
      a.every_clocks > 0 ? fmt::format(" (every {} clocks)", a.every_clocks) : "";
  spdlog::info("clock {}{}: test accuracy {:.4f}, loss {:.4f} ({} samples) after {:.2f} s",
               a.clock, every, a.accuracy, a.loss, a.samples, running.value_or(0));
  if (!time_to_target_ && a.accuracy >= report_threshold_ && running) {
    time_to_target_ = *running;
    spdlog::info("reached test accuracy {:.2f} after {:.2f} s", report_threshold_, *running);
  }
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  if (options_.target_accuracy > 0 && a.accuracy >= options_.target_accuracy &&
      state_ == wire::JobState::Running) {
    StopJob(fmt::format("target accuracy {:g} reached", options_.target_accuracy), out);
  } else if (final_eval_ != 0 && a.request == final_eval_ && state_ == wire::JobState::Running) {
    spdlog::info("final test accuracy after {} epoch(s): {:.4f}", options_.epochs, a.accuracy);
    StopJob(fmt::format("{} epoch(s) over the training set done", options_.epochs), out);
  }
}

void MonitorCore::OnStatus(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  msg::StatusReply r;
  r.state = state_;
  r.mode = options_.mode;
  r.policy = WirePolicy();
  r.stop_reason = stop_reason_;
  r.seconds_running = seconds_running().value_or(-1);
  r.last_accuracy = last_accuracy_ ? static_cast<float>(*last_accuracy_) : -1.0f;
  if (map_built_) r.shard_map = Map();
  r.membership_version = membership_version_;
  r.model = model_.keys();
  const TimePoint now = clock_->Now();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardState& sh = shards_[i];
    const auto range = i < ranges_.size() ? ranges_[i] : std::pair<uint64_t, uint64_t>{0, 0};
    // The lag while its primary's report is recent, of this epoch, with backups.
    const bool lag_known = !sh.backups.empty() && sh.lag_at != TimePoint{} &&
                           sh.lag.epoch == sh.epoch && now - sh.lag_at <= kLagReportAge;
    r.shards.push_back({sh.id, sh.address, range.first, range.second, !sh.down, sh.applied_clock,
                        sh.checkpoint_age, sh.restarts, sh.backups, sh.epoch, HostOf(i),
                        lag_known ? static_cast<int64_t>(sh.lag.records) : -1,
                        lag_known ? sh.lag.seconds : -1.0f});
  }
  for (const auto& [id, w] : workers_) {
    msg::WorkerStatus ws{w.id,    w.rank,  w.batch, w.staleness, w.staleness_range, w.clock,
                         w.alive, w.done, w.samples_per_second, {}, w.paused, {}, 0};
    for (size_t p = 0; p < partitions_.size(); ++p) {
      if (partitions_[p].owner == id) ws.partitions.push_back(static_cast<uint32_t>(p));
    }
    if (stream_) {
      ws.chunks = stream_->Grants(id);
      const auto& trained = stream_->samples_in_epoch(stream_->epoch());
      if (auto it = trained.find(id); it != trained.end()) ws.epoch_samples = it->second;
    }
    r.workers.push_back(std::move(ws));
  }
  if (stream_) {
    r.data_stream = msg::DataStreamStatus{
        stream_->epoch(),          options_.epochs,
        static_cast<float>(stream_->epoch_progress()), model_.data_samples(),
        stream_->chunks_handed_out(), stream_->tails_taken_over(),
        stream_->chunks_returned()};
  }
  for (size_t p = 0; p < partitions_.size(); ++p) {
    r.partitions.emplace_back(static_cast<uint32_t>(p), partitions_[p].epoch, partitions_[p].offset);
  }
  r.pause_at = pause_at_;
  r.moving = move_.has_value() || handoff_.has_value();
  r.replicas = options_.replicas;
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), r)});
}

uint64_t MonitorCore::PauseClock() const {
  uint64_t c = 0;
  for (uint32_t id : LiveWorkers()) c = std::max(c, workers_.at(id).clock);
  return c + 2;  // past every worker, heartbeats being a little behind
}

void MonitorCore::OnFaultControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::FaultControl c = msg::Read<msg::FaultControl>(d);
  const std::string& target = c.target;
  const std::string& spec = c.spec;
  absl::Status st;
  if (c.op == wire::FaultOp::Set) st = faults_.Set(target, spec, KnownWorkerIds(), KnownShardIds());
  if (c.op == wire::FaultOp::Clear) st = faults_.Clear(target);
  if (!st.ok()) return ReplyError(peer, d.env, wire::ErrorCode::Refused, std::string(st.message()), out);
  if (c.op != wire::FaultOp::List && options_.faults) {
    // The monitor's own share, applied at once.
    auto own = ParseFaults(faults_.For("monitor", 0));
    std::vector<FaultRule> rules = options_.base_faults;
    if (own.ok()) rules.insert(rules.end(), own->begin(), own->end());
    options_.faults->SetRules(std::move(rules));
  }
  msg::FaultControlReply reply;
  reply.version = faults_.version();
  reply.entries.assign(faults_.entries().begin(), faults_.entries().end());
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), reply)});
}

void MonitorCore::OnSetLr(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (auto refused = model_.SetLr(msg::Read<msg::SetLr>(d))) {
    return ReplyError(peer, d.env, refused->code, refused->reason, out);
  }
  msg::SetLrReply reply;
  reply.overrides.assign(model_.lr_overrides().begin(), model_.lr_overrides().end());
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), reply)});
}

void MonitorCore::OnShardControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::ShardControl c = msg::Read<msg::ShardControl>(d);
  auto refuse = [&](const std::string& why) {
    ReplyError(peer, d.env, wire::ErrorCode::Refused, why, out);
  };
  auto ack = [&] {
    out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  };
  if (state_ != wire::JobState::Running) return refuse("the job is not running");
  switch (c.op) {
    case wire::ShardOp::Pause:
      operator_pause_ = true;
      if (pause_at_ == 0) pause_at_ = PauseClock();
      spdlog::info("workers held at clock {} (pacerctl pause)", pause_at_);
      return ack();
    case wire::ShardOp::Resume:
      operator_pause_ = false;
      if (!move_) pause_at_ = 0;
      spdlog::info("workers resume{}", move_ ? " after the move in progress" : "");
      return ack();
    default:
      break;
  }
  if (move_ || handoff_) return refuse("a shard move is already in progress");
  const auto idx = ShardIndex(c.shard_id);
  if (!idx) return refuse("no shard " + std::to_string(c.shard_id));
  const size_t target = *idx;
  auto bytes_of = [&](size_t i) {
    uint64_t b = 0;
    for (const auto& k : model_.keys()) {
      if (k.key() >= ranges_[i].first && k.key() < ranges_[i].second) b += k.length();
    }
    return b;
  };
  size_t move_from = 0, move_to = 0;
  uint64_t key_begin = 0, key_end = 0;
  if (c.op == wire::ShardOp::Add) {
    if (HoldsKeys(target) || shards_[target].drained || shards_[target].down) {
      return refuse("shard " + std::to_string(c.shard_id) + " is not an idle, live shard");
    }
    size_t from = SIZE_MAX;
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (HoldsKeys(i) && (from == SIZE_MAX || bytes_of(i) > bytes_of(from))) from = i;
    }
    if (from == SIZE_MAX) return refuse("no shard holds keys");
    // Split the largest range where half its bytes lie on each side.
    std::vector<wire::KeyLen> keys;
    for (const auto& k : model_.keys()) {
      if (k.key() >= ranges_[from].first && k.key() < ranges_[from].second) keys.push_back(k);
    }
    if (keys.size() < 2) return refuse("the largest range has a single key; nothing to split");
    const uint64_t total = bytes_of(from);
    uint64_t acc = 0;
    size_t split = 1;
    for (size_t i = 0; i + 1 < keys.size(); ++i) {
      acc += keys[i].length();
      split = i + 1;
      if (2 * acc >= total) break;
    }
    move_from = from;
    move_to = target;
    key_begin = keys[split].key();
    key_end = ranges_[from].second;
  } else {
    if (!HoldsKeys(target)) return refuse("shard " + std::to_string(c.shard_id) + " holds no keys");
    // With backups: the primary hands its range to a backup first (it
    // stops applying, its backups take all it applied, one is promoted at
    // once), so nothing moves and no worker waits for a lease.
    const bool hosts_others = std::any_of(shards_.begin(), shards_.end(), [&](const ShardState& x) {
      return x.host == shards_[target].id;
    });
    if (options_.replicas > 0 && shards_[target].host == 0 && !shards_[target].down &&
        !hosts_others && InSyncBackup(target)) {
      handoff_ = Handoff{target, clock_->Now(), clock_->Now()};
      handoff_given_up_.erase(shards_[target].id);
      spdlog::info("draining shard {}: it hands keys [{}, {}) to its backup ({}) before it stops",
                   c.shard_id, ranges_[target].first, ranges_[target].second,
                   IdList(shards_[target].backups));
      // The ranges it backs up get other backups now: the heartbeat reply
      // that asks it to hand over also tells it to let go of their
      // replicas, long before it stops (a hand-over can finish before the
      // next tick, and a stopped shard hears nothing more).
      AssignReplicas();
      return ack();
    }
    size_t to = SIZE_MAX;
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (i != target && HoldsKeys(i) && ranges_[i].second == ranges_[target].first) to = i;
    }
    for (size_t i = 0; i < shards_.size() && to == SIZE_MAX; ++i) {
      if (i != target && HoldsKeys(i) && ranges_[i].first == ranges_[target].second) to = i;
    }
    if (to == SIZE_MAX) return refuse("no other shard can take the range: add one first");
    move_from = target;
    move_to = to;
    key_begin = ranges_[target].first;
    key_end = ranges_[target].second;
  }
  if (shards_[move_from].down || shards_[move_to].down) {
    return refuse("shard " +
                  std::to_string(shards_[shards_[move_from].down ? move_from : move_to].id) +
                  " is down");
  }
  uint64_t moving = 0;
  for (const auto& k : model_.keys()) {
    if (k.key() >= key_begin && k.key() < key_end) moving += k.length();
  }
  const size_t buffers = 1 + model_.StateSlots();
  if (buffers * moving * sizeof(float) + 65536 > options_.max_message_bytes) {
    return refuse("the range holds " + std::to_string(moving) +
                  " values; moving them with their optimizer state (" + std::to_string(buffers) +
                  " floats each) needs more than --max-message-bytes");
  }
  move_.emplace(move_from, move_to, key_begin, key_end, options_.job_id, clock_->Now());
  move_op_ = c.op;
  if (pause_at_ == 0) pause_at_ = PauseClock();
  spdlog::info("{} shard {}: keys [{}, {}) move from shard {} to shard {}; workers held at clock {}",
               c.op == wire::ShardOp::Add ? "adding" : "draining", c.shard_id, key_begin,
               key_end, shards_[move_from].id, shards_[move_to].id, pause_at_);
  return ack();
}

void MonitorCore::StepMove(std::vector<Outgoing>* out) {
  if (!move_) return;
  const TimePoint now = clock_->Now();
  if (move_->stage() == KeyMove::Stage::kHolding) {
    // Every live worker held at the pause clock, every shard caught up with
    // it: no clock is open anywhere.
    for (uint32_t id : LiveWorkers()) {
      const WorkerState& w = workers_.at(id);
      if (!w.paused || w.clock != pause_at_) return;
    }
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (!HoldsKeys(i) || shards_[i].drained) continue;
      if (shards_[i].reported_applied < static_cast<int64_t>(pause_at_) - 1) return;
    }
    KeyMove::Request r = move_->Start(now);
    out->push_back({Frame(), static_cast<int>(r.shard), std::move(r.frames)});
    return;
  }
  if (auto r = move_->Resend(now)) out->push_back({Frame(), static_cast<int>(r->shard), std::move(r->frames)});
}

void MonitorCore::OnMoveReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out) {
  if (auto r = move_->OnReply(index, reply, clock_->Now())) {
    out->push_back({Frame(), static_cast<int>(r->shard), std::move(r->frames)});
  }
  if (move_->done()) FinishMove(out);
}

void MonitorCore::FinishMove(std::vector<Outgoing>* out) {
  const KeyMove& m = *move_;
  const size_t from = m.from(), to = m.to();
  // Both ranges changed keys: new epochs.
  shards_[to].epoch = ++epoch_;
  if (move_op_ == wire::ShardOp::Add) {
    ranges_[to] = {m.key_begin(), m.key_end()};
    ranges_[from].second = m.key_begin();
    shards_[from].epoch = ++epoch_;
  } else {
    if (ranges_[to].second == m.key_begin()) {
      ranges_[to].second = m.key_end();
    } else {
      ranges_[to].first = m.key_begin();
    }
    ranges_[from] = {0, 0};
    shards_[from].drained = true;
    Envelope env;
    env.job_id = options_.job_id;
    env.request_id = NewRequestId();
    out->push_back({Frame(), static_cast<int>(from), EncodeMessage(env, msg::Stop{"drained"})});
  }
  BumpMapVersion();
  spdlog::info("shard map v{}: keys [{}, {}) now on shard {}{} ({:.2f} s)", map_version_,
               m.key_begin(), m.key_end(), shards_[to].id,
               move_op_ == wire::ShardOp::Drain
                   ? "; shard " + std::to_string(shards_[from].id) + " drained and stopped"
                   : "",
               ToSeconds(clock_->Now() - m.started()));
  move_.reset();
  if (!operator_pause_) pause_at_ = 0;
  UpdateShardGauges();
}

void MonitorCore::OnRemoveWorker(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const uint32_t id = msg::Read<msg::RemoveWorker>(d).id;
  auto it = workers_.find(id);
  if (it == workers_.end() || !it->second.alive || it->second.done) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "worker " + std::to_string(id) + " is not a live member", out);
  }
  it->second.alive = false;
  spdlog::warn("worker {} (rank {}) removed by request", id, it->second.rank);
  ChangeMembership("removed", "worker " + std::to_string(id) + " removed");
  if (map_built_) UpdatePolicyWorkers();
  out->push_back({peer, -1, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void MonitorCore::ChangeMembership(const char* reason, const std::string& why) {
  journal_.Mark();
  if (auto it = metrics_.membership_changes.find(reason); it != metrics_.membership_changes.end()) {
    it->second->Increment();
  }
  AssignPartitions();
  ReleaseDeparted();
  ++membership_version_;
  metrics_.membership->Set(static_cast<double>(membership_version_));
  metrics_.live_workers->Set(static_cast<double>(LiveWorkers().size()));
  SPDLOG_DEBUG("membership v{}: {}", membership_version_, why);
  (void)why;
}

bool MonitorCore::ApplyAssignments() {
  bool bounds = false;
  for (const auto& [id, a] : policy_.assignments()) {
    auto it = workers_.find(id);
    if (it == workers_.end()) continue;
    WorkerState& w = it->second;
    bounds |= w.staleness != a.staleness || w.staleness_range != a.staleness_range;
    w.batch = a.batch;
    w.staleness = a.staleness;
    w.staleness_range = a.staleness_range;
    metrics_.batch->Add({{"worker_rank", std::to_string(w.rank)}}).Set(a.batch);
    gauged_ranks_.insert(w.rank);  // so that its series goes when it does
  }
  return bounds;
}

void MonitorCore::RescaleBatch(size_t live) {
  if (!options_.rescale_batch || batch_per_worker_ <= 0 || live == 0) return;
  const auto b = static_cast<uint32_t>(std::lround(batch_per_worker_ * static_cast<double>(live)));
  if (b != policy_.global_batch()) {
    spdlog::info("global batch {} -> {} ({} live workers)", policy_.global_batch(), b, live);
    policy_.SetGlobalBatch(b);
  }
}

void MonitorCore::UpdatePolicyWorkers() {
  const std::vector<uint32_t> live = LiveWorkers();
  RescaleBatch(live.size());
  policy_.SetWorkers(live);
  if (ApplyAssignments()) ChangeMembership("bounds", "staleness bounds changed");
}

bool MonitorCore::SetWorkerBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range) {
  if (staleness + uint64_t{staleness_range} > kMaxStalenessBound) return false;
  if (!policy_.SetBounds(worker, staleness, staleness_range)) return false;
  if (ApplyAssignments()) ChangeMembership("bounds", "staleness bounds of worker " + std::to_string(worker));
  spdlog::info("worker {}: staleness bounds set to s={} r_max={}", worker, staleness,
               staleness_range);
  return true;
}

uint64_t MonitorCore::MinAckedMembership() const {
  uint64_t v = UINT64_MAX;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardState& s = shards_[i];
    // A drained shard is gone; an idle one that is down holds no keys.
    const bool idle = map_built_ && i < ranges_.size() && !HoldsKeys(i);
    if (!s.drained && !(idle && s.down)) v = std::min(v, s.acked_membership);
  }
  return shards_.empty() ? 0 : v;
}

void MonitorCore::SendToShards(bool force, std::vector<Outgoing>* out) {
  if (!map_built_) return;
  const TimePoint now = clock_->Now();
  std::vector<uint32_t> live = LiveWorkers();
  for (size_t i = 0; i < shards_.size(); ++i) {
    ShardState& s = shards_[i];
    if (s.drained || (s.host != 0 && s.served_at.empty())) continue;
    bool need_model = !s.acked_model;
    bool need_members = s.acked_membership < membership_version_;
    if (!need_model && !need_members) continue;
    if (!force && now < s.last_sent + options_.shard_resend) continue;
    s.last_sent = now;
    Envelope env;
    env.job_id = options_.job_id;
    env.sender = 0;
    if (need_model) {
      msg::DeclareModel declare;
      declare.shard_map_version = map_version_;
      declare.param_groups = model_.param_groups();
      const std::vector<wire::KeyLen>& keys = model_.keys();
      const std::vector<uint32_t>& groups = model_.groups();
      for (size_t k = 0; k < keys.size(); ++k) {
        if (keys[k].key() < ranges_[i].first || keys[k].key() >= ranges_[i].second) continue;
        declare.keys.push_back(keys[k]);
        declare.groups.push_back(groups.empty() ? kDefaultGroup : groups[k]);
      }
      env.request_id = s.model_request = NewRequestId();
      out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, declare)});
    }
    msg::Membership members;
    members.version = membership_version_;
    for (uint32_t id : live) {
      const WorkerState& w = workers_.at(id);
      members.workers.push_back(
          {w.id, w.rank, w.batch, w.start_clock, w.staleness, w.staleness_range, w.public_key});
    }
    env.request_id = s.membership_request = NewRequestId();
    s.membership_request_version = membership_version_;
    out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, members)});
  }
}

void MonitorCore::HandleShardReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out) {
  if (index >= shards_.size()) return;
  ShardState& s = shards_[index];
  if (move_ && move_->Answers(reply)) return OnMoveReply(index, reply, out);
  if (reply.type() == wire::Body::Error) {
    spdlog::warn("shard {} refused an update: {}", s.id, msg::Read<msg::Error>(reply).reason);
    return;
  }
  if (reply.env.request_id == s.model_request) s.acked_model = true;
  if (reply.env.request_id == s.membership_request) {
    // The reply confirms the version that request carried; if membership
    // changed since, SendToShards still sees the shard behind and sends again.
    s.acked_membership = std::max(s.acked_membership, s.membership_request_version);
  }
}

void MonitorCore::StopJob(const std::string& reason, std::vector<Outgoing>* out) {
  if (state_ == wire::JobState::Stopped) return;
  state_ = wire::JobState::Stopped;
  stop_reason_ = reason;
  journal_.Mark();
  stopped_at_ = clock_->Now();
  spdlog::info("stopping the job: {}", reason);
  Envelope env;
  env.job_id = options_.job_id;
  for (size_t i = 0; i < shards_.size(); ++i) {
    env.request_id = NewRequestId();
    out->push_back({Frame(), static_cast<int>(i), EncodeMessage(env, msg::Stop{reason})});
  }
}

void MonitorCore::RunPolicy(TimePoint now) {
  if (!policy_.Round(now)) return;
  const bool urgent = policy_.last_reason() == policy::RoundReason::kLevelShift;
  if (ApplyAssignments()) {
    ChangeMembership("bounds", policy_.slack_open() ? "dssp slack opened" : "dssp slack closed");
    spdlog::info("policy: iteration times {:.0f}% out of balance; dssp slack {}",
                 100 * policy_.last_imbalance(), policy_.slack_open() ? "open" : "closed");
  }
  metrics_.decisions->Increment();
  journal_.Mark();
  SyncPolicyCounters();
  // Routine rounds (sizes moved within the deadband) go to debug: a calm
  // policy on a noisy node would otherwise log a line every 250 ms. Interval
  // rounds that moved a size are shown at most every kPolicyLogEvery (a
  // straggler at batch 1-3 moves by 100% for 2 samples); confirmed shifts
  // and membership rounds always.
  const bool moved = policy_.last_change() > options_.policy.batch.deadband;
  const bool routine = policy_.last_reason() == policy::RoundReason::kInterval;
  const bool notable = urgent || (moved && (!routine || now - policy_logged_at_ >= kPolicyLogEvery));
  if (!notable) {
    policy_unlogged_ += moved;
    if (!spdlog::should_log(spdlog::level::debug)) return;
  }
  std::string sizes, costs;
  for (const auto& [id, a] : policy_.assignments()) {
    sizes += fmt::format("{}{}:{}", sizes.empty() ? "" : " ", id, a.batch);
    if (auto c = policy_.cost(id)) {
      costs += fmt::format("{}{}:{:.2f}+{:.1f}", costs.empty() ? "" : " ", id,
                           1e3 * c->fixed_seconds, 1e6 * c->per_sample_seconds);
    }
  }
  const std::string since =
      notable && policy_unlogged_ > 0
          ? fmt::format("; {} more that moved a size since the last line", policy_unlogged_)
          : "";
  spdlog::log(notable ? spdlog::level::info : spdlog::level::debug,
              "policy round {} ({}; largest change {:.0f}%{}): batch sizes (worker:batch) {}; "
              "fitted compute (worker:fixed ms+us per sample) {}",
              policy_.rounds(),
              urgent ? "a worker's speed shift was confirmed"
                     : policy::RoundReasonName(policy_.last_reason()),
              100 * policy_.last_change(), since, sizes, costs.empty() ? "none yet" : costs);
  if (notable) {
    policy_logged_at_ = now;
    policy_unlogged_ = 0;
  }
}

std::string MonitorCore::PolicySummary() const {
  std::string reasons;
  for (size_t r = 0; r < static_cast<size_t>(policy::RoundReason::kCount); ++r) {
    const auto reason = static_cast<policy::RoundReason>(r);
    if (policy_.rounds(reason) == 0) continue;
    reasons += fmt::format("{}{} {}", reasons.empty() ? "" : ", ", policy::RoundReasonName(reason),
                           policy_.rounds(reason));
  }
  std::string sizes;
  for (const auto& [id, a] : policy_.assignments()) {
    sizes += fmt::format("{}{}:{}", sizes.empty() ? "" : " ", id, a.batch);
  }
  return fmt::format("{} policy: {} rounds{}; last batch sizes (worker:batch) {} of B = {}",
                     policy::KindName(options_.policy.kind), policy_.rounds(),
                     reasons.empty() ? "" : " (" + reasons + ")", sizes.empty() ? "none" : sizes,
                     policy_.global_batch());
}

void MonitorCore::SyncPolicyCounters() {
  for (size_t r = 0; r < static_cast<size_t>(policy::RoundReason::kCount); ++r) {
    const uint64_t now = policy_.rounds(static_cast<policy::RoundReason>(r));
    if (now > rounds_counted_[r]) metrics_.rounds[r]->Increment(static_cast<double>(now - rounds_counted_[r]));
    rounds_counted_[r] = now;
  }
}

void MonitorCore::UpdateWorkerGauges() {
  const char* state = state_ == wire::JobState::Running   ? "running"
                      : state_ == wire::JobState::Stopped ? "stopped"
                                                          : "waiting";
  for (auto& [name, g] : metrics_.state) g->Set(name == state ? 1 : 0);
  UpdateStreamGauges();
  const std::vector<uint32_t> live = LiveWorkers();
  std::vector<double> speeds;
  uint64_t newest = 0;
  const double even = static_cast<double>(policy_.global_batch()) /
                      static_cast<double>(std::max<size_t>(1, live.size()));
  auto compute_at_even = [&](uint32_t id) -> std::optional<double> {
    if (auto c = policy_.cost(id); c && c->per_sample_seconds > 0) return c->Compute(even);
    return std::nullopt;
  };
  for (uint32_t id : live) {
    if (auto p = compute_at_even(id)) speeds.push_back(*p);
    newest = std::max(newest, workers_.at(id).clock);
  }
  double median = 0;
  if (!speeds.empty()) {
    std::nth_element(speeds.begin(), speeds.begin() + static_cast<long>(speeds.size() / 2),
                     speeds.end());
    median = speeds[speeds.size() / 2];
  }
  std::set<uint32_t> ranks;
  for (uint32_t id : live) {
    const WorkerState& w = workers_.at(id);
    const prometheus::Labels labels{{"worker_rank", std::to_string(w.rank)}};
    ranks.insert(w.rank);
    auto p = compute_at_even(id);
    metrics_.straggler->Add(labels).Set(p && median > 0 ? *p / median : 1.0);
    if (auto c = policy_.cost(id)) {
      metrics_.fixed_cost->Add(labels).Set(c->fixed_seconds);
      metrics_.sample_cost->Add(labels).Set(c->per_sample_seconds);
    }
    metrics_.lag->Add(labels).Set(static_cast<double>(newest - w.clock));
    metrics_.worker_sps->Add(labels).Set(w.samples_per_second);
    metrics_.worker_clock->Add(labels).Set(static_cast<double>(w.clock));
  }
  // A departed worker's series go, so that max() and count() see live ones.
  for (uint32_t rank : gauged_ranks_) {
    if (ranks.count(rank)) continue;
    const prometheus::Labels labels{{"worker_rank", std::to_string(rank)}};
    for (auto* family : {metrics_.straggler, metrics_.lag, metrics_.worker_sps, metrics_.worker_clock, metrics_.batch,
                         metrics_.fixed_cost, metrics_.sample_cost}) {
      family->Remove(&family->Add(labels));
    }
  }
  gauged_ranks_ = std::move(ranks);
  SyncPolicyCounters();
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardState& sh = shards_[i];
    const prometheus::Labels labels{{"shard", std::to_string(sh.id)}};
    if (sh.drained) {
      for (auto* family : {metrics_.shard_up, metrics_.shard_clock, metrics_.shard_ckpt_age}) {
        family->Remove(&family->Add(labels));
      }
      continue;
    }
    metrics_.shard_up->Add(labels).Set(sh.down ? 0 : 1);
    metrics_.shard_clock->Add(labels).Set(static_cast<double>(sh.applied_clock));
    // -1 (no checkpoint reported) leaves the series out rather than lying.
    if (sh.checkpoint_age >= 0) metrics_.shard_ckpt_age->Add(labels).Set(sh.checkpoint_age);
  }
}

void MonitorCore::Tick(std::vector<Outgoing>* out) {
  const TimePoint now = clock_->Now();
  if (now >= next_gauges_) {
    UpdateWorkerGauges();
    next_gauges_ = now + std::chrono::milliseconds(250);
  }
  // Shards silent past the lease are marked down (they keep their keys);
  // with replicas the shards' own lease (--shard-lease), and a down
  // primary's range fails over to a backup.
  const Duration shard_lease = options_.replicas > 0 ? options_.shard_lease : options_.lease;
  for (auto& s : shards_) {
    if (!s.down && !s.drained && now - s.last_seen > shard_lease) {
      s.down = true;
      spdlog::warn("shard {} at {} silent for {:.1f} s; marked down", s.id, s.address,
                   ToSeconds(now - s.last_seen));
      UpdateShardGauges();
    }
  }
  // The map changes once the backup reports where it serves the range
  // (TakeServing); until then its old entry stands.
  FailOver();
  // Leases.
  for (auto& [id, w] : workers_) {
    if (!options_.lease_expiry) break;
    if (w.alive && !w.done && now - w.last_seen > options_.lease) {
      w.alive = false;
      metrics_.dead->Increment();
      spdlog::warn("worker {} (rank {}) missed its lease ({:.1f} s without a heartbeat); declared dead",
                   id, w.rank, ToSeconds(now - w.last_seen));
      ChangeMembership("lost", "worker " + std::to_string(id) + " lost");
      if (map_built_) UpdatePolicyWorkers();
    }
  }
  if (state_ == wire::JobState::Stopped) return;

  // Start: enough shards and workers, and a model.
  if (!map_built_ && shards_.size() >= options_.min_shards &&
      LiveWorkers().size() >= options_.min_workers && model_.declared()) {
    std::vector<KeyRange> ranges = PartitionByBytes(model_.keys(), shards_.size());
    ranges_.clear();
    for (const auto& r : ranges) ranges_.emplace_back(r.begin, r.end);
    for (auto& sh : shards_) sh.epoch = ++epoch_;
    map_built_ = true;
    BumpMapVersion();  // v1
    AssignReplicas();
    std::vector<uint32_t> live = LiveWorkers();
    if (options_.data_stream) {
      // One stream over the whole training set instead of partitions.
      stream_.emplace(StreamOptions());
      for (uint32_t id : live) stream_->SetPace(id, 0, 1);
      partition_count_ = 0;
      partitions_.clear();
      spdlog::info("data stream over {} samples: {} epoch(s), chunks of {}", model_.data_samples(),
                   options_.epochs == 0 ? std::string("no cap on") : std::to_string(options_.epochs),
                   options_.chunk_samples > 0 ? std::to_string(options_.chunk_samples) + " samples"
                                              : std::string("2 s of each worker's speed"));
    } else {
      partition_count_ = options_.data_partitions > 0 ? options_.data_partitions
                                                       : static_cast<uint32_t>(live.size());
      partitions_.assign(partition_count_, PartitionState{});
    }
    batch_per_worker_ = static_cast<double>(options_.global_batch) / static_cast<double>(live.size());
    policy_.SetWorkers(live);
    ApplyAssignments();
    ChangeMembership("started", "batch sizes assigned");
    for (auto& [id, w] : workers_) w.joined_version = std::min(w.joined_version, membership_version_);
    spdlog::info("shard map v{} built over {} shards; {} workers share global batch {} ({} policy, "
                 "{} mode)",
                 map_version_, shards_.size(), partition_count_, options_.global_batch,
                 policy::KindName(options_.policy.kind), wire::EnumNameMode(options_.mode));
    SendToShards(true, out);
  }
  if (map_built_) AssignReplicas();
  if (map_built_ && state_ == wire::JobState::Waiting) {
    bool all = std::all_of(shards_.begin(), shards_.end(), [&](const ShardState& s) {
      return s.acked_model && s.acked_membership >= 1;
    });
    if (all) {
      state_ = wire::JobState::Running;
      started_at_ = now;
      journal_.Mark();
      spdlog::info("job {} running ({}, {} lr {}, global batch {})", options_.job_id,
                   wire::EnumNameMode(options_.mode), OptimizerName(options_.optimizer),
                   options_.optimizer_settings.lr,
                   options_.global_batch);
    }
  }
  SendToShards(false, out);
  StepMove(out);

  if (state_ == wire::JobState::Running) RunPolicy(now);
  if (state_ == wire::JobState::Running) {
    if (options_.time_cap_seconds > 0 && ToSeconds(now - *started_at_) >= options_.time_cap_seconds) {
      StopJob(fmt::format("time cap of {:g} s reached", options_.time_cap_seconds), out);
    } else {
      bool any_done = false;
      for (const auto& [id, w] : workers_) any_done |= w.done;
      // (Not while a resumed job waits for its new workers.)
      if (stream_ && stream_->finished()) {
        const std::string reason =
            fmt::format("{} epoch(s) over the training set done", options_.epochs);
        if (!scheduled_evaluator_ || Evaluator() == 0) {
          StopJob(reason, out);  // no evaluator on a schedule of its own: none to wait for
        } else if (final_eval_ == 0) {
          // Hold the workers and have the final model evaluated first.
          // A number the evaluator has not answered yet, also after a
          // monitor restart (the membership version only goes up).
          final_eval_ = std::max<uint64_t>(1, membership_version_);
          final_eval_since_ = now;
          if (pause_at_ == 0) pause_at_ = PauseClock();
          spdlog::info("{}: the workers are held for a final evaluation", reason);
        } else if (now - final_eval_since_ >= kFinalEvaluationWait) {
          spdlog::warn("no final evaluation came in {:.0f} s; stopping without it",
                       ToSeconds(kFinalEvaluationWait));
          StopJob(reason, out);
        }
      } else if (any_done && LiveWorkers().empty() && !awaiting_workers_) {
        StopJob("all workers finished", out);
      }
    }
  }
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
  policy_summary_ = core_->PolicySummary();
  done_ = true;
}

void MonitorServer::SaveState() {
  absl::Status st = store_->Put("monitor", core_->SaveState());
  if (!st.ok()) spdlog::error("cannot save the monitor state: {}", ErrorText(st));
}

}  // namespace pacer
