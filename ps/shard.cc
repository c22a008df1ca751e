#include "ps/shard.h"

#include <algorithm>
#include <limits>

#include "ps/base/messages.h"
#include "spdlog/spdlog.h"

namespace pacer {

ShardCore::ShardCore(const ShardOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      registry_(options.registry ? options.registry : std::make_shared<prometheus::Registry>()),
      server_(*registry_, "shard", clock, spdlog::level::debug),
      metrics_(*registry_, options.metric_labels),
      primary_({options.check_crc, options.safeguards}, clock, &range_, &metrics_),
      replicas_(&server_, &metrics_) {}

void ShardCore::Configure(const ShardJob& job, uint32_t shard_id) {
  job_ = job;
  range_.table = std::make_unique<ParamTable>(job.optimizer);
  serving_ = ServingState::kServing;
  shard_id_ = shard_id;
  primary_.Configure(job.job_id, shard_id);
  replicas_.Configure(shard_id, job.optimizer);
  server_.SetIdentity(job.job_id, shard_id, "shard " + std::to_string(shard_id));
}

void ShardCore::SetAwaitingMonitor(bool awaiting) {
  if (awaiting && serving_ == ServingState::kServing) serving_ = ServingState::kAwaitingMonitor;
  if (!awaiting && serving_ == ServingState::kAwaitingMonitor) serving_ = ServingState::kServing;
}

void ShardCore::Depose(uint64_t epoch) {
  if (serving_ == ServingState::kUnconfigured) return;
  deposed_epoch_ = epoch;
  if (epoch != 0) {
    serving_ = ServingState::kDeposed;
  } else if (serving_ == ServingState::kDeposed) {
    serving_ = ServingState::kServing;  // given back
  }
}

void ShardCore::ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                           const std::string& reason, std::vector<Outgoing>* out) {
  out->push_back({peer, server_.Error(to, code, reason)});
}

void ShardCore::Handle(Frames frames, std::vector<Outgoing>* out) {
  if (frames.empty()) return;
  handle_start_ = clock_->Now();
  Frame peer = frames[0];
  frames.erase(frames.begin());
  DecodeOptions dopts;
  dopts.job_id = job_.job_id;
  dopts.check_job = configured();
  dopts.max_message_bytes = options_.max_message_bytes;
  dopts.check_crc = options_.check_crc && options_.safeguards.On(Safeguard::kCrcCheck);
  Decoded d;
  DecodeError err;
  if (!Decode(frames, dopts, &d, &err)) {
    if (auto reply = server_.Undecodable(err)) out->push_back({peer, std::move(*reply)});
    return;
  }
  if (!configured()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "shard not registered yet", out);
  }
  if (!SenderMatchesKey(peer, d, out)) return;
  const bool serves_data = d.type() == wire::Body::Push || d.type() == wire::Body::Pull ||
                           d.type() == wire::Body::Init;
  if (fenced_ && replicated() && serves_data) {
    // Cut off from the monitor past the shard lease: a backup may be
    // serving this range by now, so nothing is acknowledged here.
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) +
                          " has not heard from the monitor for its shard lease",
                      out);
  }
  if (serving_ == ServingState::kAwaitingMonitor && serves_data) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) +
                          " restarted from its checkpoint and waits for the monitor's word on "
                          "its range",
                      out);
  }
  if (serving_ == ServingState::kDeposed && serves_data) {
    // Another shard serves this range since a failover (this one was cut
    // off, not dead): whoever still sends here has an older shard map.
    return ReplyError(peer, d.env, wire::ErrorCode::NotOwner,
                      "shard " + std::to_string(shard_id_) +
                          "'s range is served by another shard since epoch " +
                          std::to_string(deposed_epoch_) + " (a failover); take the new shard map",
                      out);
  }
  if (serving_ == ServingState::kLeaving && d.type() == wire::Body::Push) {
    // Its last record went to its backups (Leave): what it applied now
    // would be in the primary and in no backup.
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) + " is leaving", out);
  }
  switch (d.type()) {
    case wire::Body::DeclareModel: return OnDeclare(peer, d, out);
    case wire::Body::Membership: return OnMembership(peer, d, out);
    case wire::Body::Init: return OnInit(peer, d, out);
    case wire::Body::Push: {
      OnPush(peer, d, out);
      metrics_.push_seconds->Observe(ToSeconds(clock_->Now() - handle_start_));
      return;
    }
    case wire::Body::Pull: return OnPull(peer, d, out);
    case wire::Body::MoveOut:
    case wire::Body::MoveData: {
      // The monitor asking again (its reply was lost): the same answer. The
      // header must match too (a restarted monitor reuses request ids).
      const std::string header = frames.size() > 1 ? std::string(reinterpret_cast<const char*>(frames[1].data()), frames[1].size()) : "";
      if (d.env.sender == 0 && last_move_request_ != 0 && d.env.request_id == last_move_request_ &&
          header == last_move_header_) {
        out->push_back({peer, last_move_reply_});
        return;
      }
      const size_t before = out->size();
      move_ok_ = false;
      if (d.type() == wire::Body::MoveOut) {
        OnMoveOut(peer, d, out);
      } else {
        OnMoveIn(peer, d, out);
      }
      if (move_ok_ && out->size() > before) {  // errors are not kept: a retry re-checks
        last_move_request_ = d.env.request_id;
        last_move_header_ = header;
        last_move_reply_ = (*out)[before].frames;
      }
      return;
    }
    case wire::Body::Replicate: return replicas_.OnReplicate(peer, d, out);
    case wire::Body::ReplicateReply: return primary_.OnReply(d);
    case wire::Body::Error: return primary_.OnBackupError(d);  // a backup refused a record
    case wire::Body::Stop: {
      if (d.env.sender != 0) {
        return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor stops a shard",
                          out);
      }
      stop_requested_ = true;
      out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
      return;
    }
    default:
      return ReplyError(peer, d.env, wire::ErrorCode::WrongType,
                        std::string("a shard does not serve ") + wire::EnumNameBody(d.type()), out);
  }
}

bool ShardCore::CheckKeys(std::span<const wire::KeyLen> keys, std::string* why,
                          wire::ErrorCode* code) const {
  uint64_t previous = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const wire::KeyLen& k = keys[i];
    const ParamTable::Slot* slot = range_.table->Find(k.key());
    if (slot == nullptr) {
      *code = wire::ErrorCode::NotOwner;
      *why = "key " + std::to_string(k.key()) + " is not owned by shard " +
             std::to_string(shard_id_);
      return false;
    }
    if (slot->length != k.length()) {
      *code = wire::ErrorCode::BadLength;
      *why = "key " + std::to_string(k.key()) + " has " + std::to_string(slot->length) +
             " values, request says " + std::to_string(k.length());
      return false;
    }
    if (i > 0 && k.key() <= previous) {
      *code = wire::ErrorCode::BadLength;
      *why = "keys must be in ascending order without repeats";
      return false;
    }
    previous = k.key();
  }
  return true;
}

void ShardCore::OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (d.env.sender != 0) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor assigns keys", out);
  }
  const msg::DeclareModel m = msg::Read<msg::DeclareModel>(d);
  if (!m.groups.empty() && m.groups.size() != m.keys.size()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "a declaration names a group for every key or for none", out);
  }
  std::vector<TableKey> keys;
  size_t total = 0;
  for (size_t i = 0; i < m.keys.size(); ++i) {
    const wire::KeyLen& k = m.keys[i];
    total += k.length();
    if (k.length() > options_.max_message_bytes / sizeof(float) || total > (size_t{1} << 34)) {
      return ReplyError(peer, d.env, wire::ErrorCode::BadLength,
                        "key " + std::to_string(k.key()) + " is too large", out);
    }
    keys.push_back({k.key(), static_cast<uint32_t>(k.length()),
                    m.groups.empty() ? kDefaultGroup : m.groups[i], 0});
  }
  std::sort(keys.begin(), keys.end(), [](auto& a, auto& b) { return a.key < b.key; });
  const auto& slots = range_.table->slots();
  const bool same = keys.size() == slots.size() &&
                    std::equal(keys.begin(), keys.end(), slots.begin(), [](auto& a, auto& b) {
                      return a.key == b.first && a.length == b.second.length &&
                             a.group == b.second.group;
                    });
  if (!same && !range_.table->empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "this shard already holds a different model", out);
  }
  // The optimizer (the job's, as its first worker declared it) and the
  // groups' settings: the declaration's. A restored table keeps its state:
  // only settings such as lr or weight decay may differ, not the kind.
  TableConfig config = range_.table->config();
  if (m.optimizer) {
    config.kind = m.optimizer->kind;
    config.defaults = m.optimizer->settings;
  }
  config.groups = m.param_groups;
  if (range_.table->config() != config) {
    if (absl::Status st = range_.table->SetConfig(config); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
    job_.optimizer = {config.kind, config.defaults, {}};
    replicas_.Configure(shard_id_, job_.optimizer);  // the seeds it takes
  }
  if (!same) {
    if (absl::Status st = range_.table->Declare(keys); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
    metrics_.keys->Set(static_cast<double>(range_.table->key_count()));
    spdlog::info("shard {}: holds {} keys, {} values ({} with {} parameter group(s))", shard_id_,
                 range_.table->key_count(), range_.table->values(), OptimizerName(range_.table->config().kind),
                 range_.table->groups());
  }
  map_version_ = std::max(map_version_, m.shard_map_version);
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
}

void ShardCore::OnMembership(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (d.env.sender != 0) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor sets membership",
                      out);
  }
  const msg::Membership m = msg::Read<msg::Membership>(d);
  if (m.version > membership_version_) {
    membership_version_ = m.version;
    std::map<uint32_t, Member> next;
    {
      for (const msg::WorkerInfo& w : m.workers) {
        auto known = live_.find(w.id);
        Member member;
        if (known != live_.end()) {
          member = std::move(known->second);  // keeps its progress
        } else {
          member.pushed = static_cast<int64_t>(w.start_clock) - 1;
          if (restored_) {
            // Where the snapshot left it; a worker it lacks lost every
            // push it made here before the crash.
            auto mark = restored_marks_.find(w.id);
            if (mark != restored_marks_.end()) {
              member.pushed = std::max(member.pushed, mark->second.clock);
              member.seq = mark->second.seq;
            }
            member.check_gap = true;
          }
        }
        member.batch = w.batch;
        member.public_key = w.public_key;
        member.staleness = w.staleness;
        member.staleness_range = w.staleness_range;
        next[w.id] = std::move(member);
      }
    }
    live_ = std::move(next);
    metrics_.live->Set(static_cast<double>(live_.size()));
    SPDLOG_DEBUG("shard {}: membership v{} with {} workers", shard_id_,
                 membership_version_, live_.size());
  }
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  // A parked pull is checked again whenever the live set changes.
  Advance(out);
}

void ShardCore::OnInit(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Init m = msg::Read<msg::Init>(d);
  std::string why;
  if (range_.table->empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "model not declared yet", out);
  }
  if (wire::ErrorCode code; !CheckKeys(m.keys, &why, &code)) {
    return ReplyError(peer, d.env, code, why, out);
  }
  if (m.keys.size() != range_.table->key_count()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "init must carry every key of the shard", out);
  }
  // The first Init sets the model. Under transport security only a member
  // (whose key SenderGuard checked) may send it, not any allowed key.
  if (!peer.peer_key().empty() && !live_.contains(d.env.sender)) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotMember,
                      "worker " + std::to_string(d.env.sender) + " is not in membership v" +
                          std::to_string(membership_version_),
                      out);
  }
  if (!range_.initialized) {
    range_.table->Write({m.keys, d.floats()});
    range_.initialized = true;
    spdlog::info("shard {}: parameters initialised by sender {}", shard_id_, d.env.sender);
  }
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  Advance(out);
}


ShardSnapshot ShardCore::Snapshot() const {
  ShardSnapshot s;
  s.job_id = job_.job_id;
  s.shard_id = shard_id_;
  s.map_version = map_version_;
  s.applied_clock = range_.applied_clock;
  s.steps = range_.steps;
  s.updates_applied = updates_applied_;
  // Shared, not copied: the next write goes to new buffers.
  s.table = range_.table->Snapshot();
  for (const auto& [id, m] : live_) s.workers[id] = {m.pushed, m.seq};
  // Restored workers the monitor has not named again yet keep their marks:
  // a checkpoint taken before the membership arrives must not lose them.
  for (const auto& [id, mark] : restored_marks_) s.workers.emplace(id, mark);
  s.ledger = primary_.ledger().Spans();  // applied pushes only: those of open clocks are not in it
  s.ledger_doubles = primary_.ledger().doubles();
  // Pushes waiting in open clocks are not in the parameters: a worker's
  // mark is the push before its first one still open.
  for (const auto& [clock, oc] : open_) {
    s.updates_applied -= oc.pushed.size();
    for (const auto& [id, seq] : oc.seqs) {
      auto it = s.workers.find(id);
      if (it == s.workers.end()) continue;
      if (seq > 0) it->second.seq = std::min(it->second.seq, seq - 1);
      it->second.clock = std::min(it->second.clock, static_cast<int64_t>(clock) - 1);
    }
  }
  return s;
}

absl::Status ShardCore::Restore(const ShardSnapshot& s) {
  if (!configured()) return absl::FailedPreconditionError("restore before the shard is configured");
  if (!range_.table->empty() || range_.initialized) {
    return absl::FailedPreconditionError("restore into a shard that already holds a model");
  }
  if (s.job_id != job_.job_id || s.shard_id != shard_id_) {
    return absl::InvalidArgumentError(
        "checkpoint of job " + std::to_string(s.job_id) + " shard " + std::to_string(s.shard_id) +
        ", this is job " + std::to_string(job_.job_id) + " shard " + std::to_string(shard_id_));
  }
  if (absl::Status st = range_.table->Restore(s.table); !st.ok()) return st;
  range_.applied_clock = s.applied_clock;
  range_.steps = s.steps;
  updates_applied_ = s.updates_applied;
  metrics_.model_updates->Set(static_cast<double>(updates_applied_));
  restored_marks_ = s.workers;
  primary_.Restore(s);
  map_version_ = s.map_version;
  restored_ = true;
  range_.initialized = true;
  metrics_.keys->Set(static_cast<double>(range_.table->key_count()));
  metrics_.clock->Set(static_cast<double>(range_.applied_clock));
  spdlog::info("shard {}: restored {} keys, {} values with {} state at applied clock {} (step {}, "
               "{} updates){}",
               shard_id_, range_.table->key_count(), range_.table->values(),
               OptimizerName(range_.table->config().kind), range_.applied_clock, range_.steps, updates_applied_,
               s.migrated ? "; migrated from a checkpoint of format 2 (SGD with momentum)" : "");
  return absl::OkStatus();
}

bool ShardCore::StaleEpoch(const Frame& peer, const Envelope& env, uint64_t epoch,
                           std::vector<Outgoing>* out) {
  // 0 on either side: no epoch known (no --replicas, or not heard yet). A
  // higher one than this shard's: the monitor moved the range's epoch on
  // with this shard still its primary (the map's address is this one's);
  // the shard hears of it with its next heartbeat.
  if (epoch == 0 || primary_.epoch() == 0 || epoch >= primary_.epoch()) return false;
  metrics_.stale_epochs->Increment();
  ReplyError(peer, env, wire::ErrorCode::NotOwner,
             "shard " + std::to_string(shard_id_) + "'s range is at epoch " +
                 std::to_string(primary_.epoch()) + ", the sender's shard map at " +
                 std::to_string(epoch) + "; take the new shard map",
             out);
  return true;
}

bool ShardCore::SenderMatchesKey(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  std::string bound;  // none for ids that are not members: answered NotMember, or a tool's
  if (d.env.sender == 0) {
    bound = options_.monitor_key;
  } else if (auto it = live_.find(d.env.sender); it != live_.end()) {
    bound = it->second.public_key;
  } else if (const std::string* key = replicas_.PrimaryKey(d.env.sender)) {
    bound = *key;  // a primary whose range this shard backs up
  }
  auto refused = server_.CheckSender(peer, bound, d);
  if (!refused) return true;
  out->push_back({peer, std::move(*refused)});
  return false;
}

void ShardCore::Tick(std::vector<Outgoing>* out) {
  handle_start_ = clock_->Now();  // for pulls answered from here
  const TimePoint now = clock_->Now();
  // Stall report: which live workers the oldest open clock waits for.
  if (!open_.empty()) {
    OpenClock& oc = open_.begin()->second;
    if (now - oc.reported >= options_.stall_report) {
      oc.reported = now;
      std::string missing;
      for (const auto& [id, member] : live_) {
        if (!oc.pushed.count(id)) missing += (missing.empty() ? "" : ", ") + std::to_string(id);
      }
      if (!missing.empty()) {
        spdlog::warn("shard {}: clock {} open for {:.1f} s, waiting for worker(s) {}", shard_id_,
                     open_.begin()->first, ToSeconds(now - oc.opened), missing);
      }
    }
  }
  if ((job_.mode == wire::Mode::Ssp || job_.mode == wire::Mode::Dssp) && !parked_.empty() &&
      now - parked_.front().parked_at >= options_.stall_report &&
      now - async_reported_ >= options_.stall_report) {
    async_reported_ = now;
    const int64_t slowest = slowest_pushed();
    std::string behind;
    for (const auto& [id, member] : live_) {
      if (member.pushed == slowest) behind += (behind.empty() ? "" : ", ") + std::to_string(id);
    }
    spdlog::warn("shard {}: a read has waited {:.1f} s on the staleness bound; slowest worker(s) {} "
                 "at clock {}",
                 shard_id_, ToSeconds(now - parked_.front().parked_at), behind, slowest);
  }
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (it->deadline <= now) {
      ReplyError(it->peer, it->env, wire::ErrorCode::DeadlineExceeded,
                 "pull for clock " + std::to_string(it->clock) + " waited past its deadline", out);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  metrics_.parked->Set(static_cast<double>(parked_.size()));
  // Replication: asp's batch once it waited long enough, and seeds due.
  primary_.Tick(now, out);
}

TimePoint ShardCore::NextDeadline() const {
  TimePoint t = TimePoint::max();
  for (const auto& p : parked_) t = std::min(t, p.deadline);
  return std::min(t, primary_.NextDeadline());
}


void ShardCore::Leave(std::vector<Outgoing>* out) {
  if (serving_ != ServingState::kServing) return;
  if (primary_.SendLast(out)) serving_ = ServingState::kLeaving;
}

void ShardCore::CancelLeave(std::vector<Outgoing>* out) {
  if (serving_ != ServingState::kLeaving) return;
  serving_ = ServingState::kServing;
  Advance(out);  // a clock whose pushes all came meanwhile closes now
}

uint32_t ShardCore::state_crc() const {
  return range_.table->Crc(0, std::numeric_limits<uint64_t>::max());
}

}  // namespace pacer
