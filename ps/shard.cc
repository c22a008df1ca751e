#include "ps/shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ps/base/messages.h"
#include "ps/staleness.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// Clocks a push may run ahead of the last applied one (BSP needs 1; a read
// at most kMaxStalenessBound past it, and its push, one more).
constexpr int64_t kMaxOpenClocks = kMaxStalenessBound + 1;
// Push times kept per worker for DSSP's extrapolation.
constexpr size_t kPushTimes = 8;

double Seconds(TimePoint t) { return ToSeconds(t - TimePoint{}); }

}  // namespace

ShardCore::ShardCore(const ShardOptions& options, const Clock* clock)
    : options_(options),
      clock_(clock),
      registry_(options.registry ? options.registry : std::make_shared<prometheus::Registry>()),
      server_(*registry_, "shard", clock, spdlog::level::debug),
      metrics_(*registry_, options.metric_labels),
      table_(std::make_unique<ParamTable>(TableConfig{})) {}

void ShardCore::Configure(const ShardJob& job, uint32_t shard_id) {
  job_ = job;
  table_ = std::make_unique<ParamTable>(job.optimizer);
  configured_ = true;
  shard_id_ = shard_id;
  server_.SetIdentity(job.job_id, shard_id, "shard " + std::to_string(shard_id));
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
  dopts.check_job = configured_;
  dopts.max_message_bytes = options_.max_message_bytes;
  dopts.check_crc = options_.check_crc && options_.verify_crc;
  Decoded d;
  DecodeError err;
  if (!Decode(frames, dopts, &d, &err)) {
    if (auto reply = server_.Undecodable(err)) out->push_back({peer, std::move(*reply)});
    return;
  }
  if (!configured_) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "shard not registered yet", out);
  }
  if (!SenderMatchesKey(peer, d, out)) return;
  if (fenced_ && replicated() &&
      (d.type() == wire::Body::Push || d.type() == wire::Body::Pull ||
       d.type() == wire::Body::Init)) {
    // Cut off from the monitor past the shard lease: a backup may be
    // serving this range by now, so nothing is acknowledged here.
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) +
                          " has not heard from the monitor for its shard lease",
                      out);
  }
  if (awaiting_monitor_ && (d.type() == wire::Body::Push || d.type() == wire::Body::Pull ||
                            d.type() == wire::Body::Init)) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) +
                          " restarted from its checkpoint and waits for the monitor's word on "
                          "its range",
                      out);
  }
  if (deposed_epoch_ != 0 && (d.type() == wire::Body::Push || d.type() == wire::Body::Pull ||
                              d.type() == wire::Body::Init)) {
    // Another shard serves this range since a failover (this one was cut
    // off, not dead): whoever still sends here has an older shard map.
    return ReplyError(peer, d.env, wire::ErrorCode::NotOwner,
                      "shard " + std::to_string(shard_id_) +
                          "'s range is served by another shard since epoch " +
                          std::to_string(deposed_epoch_) + " (a failover); take the new shard map",
                      out);
  }
  if (leaving_ && d.type() == wire::Body::Push) {
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
    case wire::Body::Replicate: return OnReplicate(peer, d, out);
    case wire::Body::ReplicateReply: return OnReplicateReply(d);
    case wire::Body::Error: return OnBackupError(d);  // a backup refused a record
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
    const ParamTable::Slot* slot = table_->Find(k.key());
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
  const auto& slots = table_->slots();
  const bool same = keys.size() == slots.size() &&
                    std::equal(keys.begin(), keys.end(), slots.begin(), [](auto& a, auto& b) {
                      return a.key == b.first && a.length == b.second.length &&
                             a.group == b.second.group;
                    });
  if (!same && !table_->empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "this shard already holds a different model", out);
  }
  // The groups' settings: the declaration's (a restored table keeps its
  // state; only settings such as lr or weight decay may differ).
  if (table_->config().groups != m.param_groups) {
    if (absl::Status st = table_->SetGroups(m.param_groups); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
  }
  if (!same) {
    if (absl::Status st = table_->Declare(keys); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
    metrics_.keys->Set(static_cast<double>(table_->key_count()));
    spdlog::info("shard {}: holds {} keys, {} values ({} with {} parameter group(s))", shard_id_,
                 table_->key_count(), table_->values(), OptimizerName(table_->config().kind),
                 table_->groups());
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
  if (table_->empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "model not declared yet", out);
  }
  if (wire::ErrorCode code; !CheckKeys(m.keys, &why, &code)) {
    return ReplyError(peer, d.env, code, why, out);
  }
  if (m.keys.size() != table_->key_count()) {
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
  if (!initialized_) {
    table_->Write({m.keys, d.floats()});
    initialized_ = true;
    spdlog::info("shard {}: parameters initialised by sender {}", shard_id_, d.env.sender);
  }
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  Advance(out);
}

void ShardCore::OnMoveOut(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (d.env.sender != 0) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor moves keys", out);
  }
  if (!open_.empty() || !initialized_) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "a clock is still open (the workers must be held first)", out);
  }
  const msg::MoveOut m = msg::Read<msg::MoveOut>(d);
  if (m.drop) return DropKeys(peer, d, m.key_begin, m.key_end, out);
  // A copy: the keys stay here until the monitor says drop (after the new
  // owner has them). The payload: their parameters, then each state slot.
  auto slice = std::make_shared<TableSlice>(table_->Extract(m.key_begin, m.key_end));
  const msg::MoveData data = MoveDataOf(*table_, *slice, applied_clock_, steps_);
  size_t moving_total = 0;
  for (const TableKey& k : slice->keys) moving_total += k.length;
  spdlog::info("shard {}: copied {} keys ({} values, {} state) in [{}, {}) for their new owner",
               shard_id_, slice->keys.size(), moving_total, OptimizerName(data.optimizer),
               m.key_begin, m.key_end);
  Frame frame;
  if (!slice->values.empty()) {
    frame = Frame(slice, slice->values.data(), slice->values.size() * sizeof(float));
  }
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), data, std::move(frame),
                                      options_.check_crc)});
  move_ok_ = true;
}

msg::MoveData ShardCore::MoveDataOf(const ParamTable& table, const TableSlice& slice,
                                    int64_t applied_clock, uint64_t steps) {
  msg::MoveData data;
  data.applied_clock = applied_clock;
  data.steps = steps;
  data.optimizer = table.config().kind;
  data.state_slots = static_cast<uint32_t>(table.state_slots());
  data.param_groups = table.config().groups;
  for (const TableKey& k : slice.keys) {
    data.keys.emplace_back(k.key, k.length);
    data.groups.push_back(k.group);
    data.key_steps.push_back(k.steps);
  }
  return data;
}

TableSlice ShardCore::SliceOf(const msg::MoveData& m, std::span<const float> values) {
  TableSlice slice;
  for (size_t i = 0; i < m.keys.size(); ++i) {
    slice.keys.push_back({m.keys[i].key(), static_cast<uint32_t>(m.keys[i].length()), m.groups[i],
                          m.key_steps[i]});
  }
  slice.values.assign(values.begin(), values.end());
  return slice;
}

void ShardCore::DropKeys(const Frame& peer, const Decoded& d, uint64_t begin, uint64_t end,
                         std::vector<Outgoing>* out) {
  // The Ack first (the repeat cache keeps the first reply), then any
  // parked pull that can no longer be answered here.
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  move_ok_ = true;
  const size_t dropped = table_->Drop(begin, end);
  if (dropped > 0) {
    LayoutChanged();
    // Parked pulls that name a key gone from here: the reader must ask the new owner.
    for (auto it = parked_.begin(); it != parked_.end();) {
      const bool gone = std::any_of(it->keys.begin(), it->keys.end(), [&](const wire::KeyLen& k) {
        return table_->Find(k.key()) == nullptr;
      });
      if (gone) {
        ReplyError(it->peer, it->env, wire::ErrorCode::NotOwner, "keys moved to another shard", out);
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
    spdlog::info("shard {}: dropped {} keys in [{}, {}) (moved); {} keys left", shard_id_, dropped,
                 begin, end, table_->key_count());
  }
}

void ShardCore::LayoutChanged() {
  spare_acc_.clear();
  lent_acc_.clear();
  // The backups' replicas no longer have this layout: seeded afresh.
  for (auto& [id, link] : backups_) link.seeded = false;
  ++key_version_;
  for (auto& [id, member] : live_) {
    member.staged.reset();  // may name keys gone, at old offsets
    member.staging.clear();
  }
  metrics_.keys->Set(static_cast<double>(table_->key_count()));
}

void ShardCore::OnMoveIn(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (d.env.sender != 0) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor moves keys", out);
  }
  if (!open_.empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "a clock is still open (the workers must be held first)", out);
  }
  const msg::MoveData m = msg::Read<msg::MoveData>(d);
  if (m.optimizer != table_->config().kind) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "keys with " + std::string(OptimizerName(m.optimizer)) +
                          " state; this shard runs " +
                          std::string(OptimizerName(table_->config().kind)),
                      out);
  }
  if (m.groups.size() != m.keys.size() || m.key_steps.size() != m.keys.size()) {
    return ReplyError(peer, d.env, wire::ErrorCode::BadLength,
                      "a move names each key's group and steps", out);
  }
  // A shard that holds no keys yet (added idle) takes the model's groups.
  if (table_->empty() && table_->config().groups != m.param_groups) {
    if (absl::Status st = table_->SetGroups(m.param_groups); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
  }
  if (m.state_slots != table_->state_slots()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "keys with " + std::to_string(m.state_slots) + " state slot(s); this shard keeps " +
                          std::to_string(table_->state_slots()),
                      out);
  }
  const TableSlice slice = SliceOf(m, d.floats());
  size_t incoming = 0;
  for (const TableKey& k : slice.keys) incoming += k.length;
  if (absl::Status st = table_->Insert(slice); !st.ok()) {
    const bool here = table_->Find(m.keys.empty() ? 0 : m.keys[0].key()) != nullptr;
    return ReplyError(peer, d.env, here ? wire::ErrorCode::Mismatch : wire::ErrorCode::BadLength,
                      std::string(st.message()), out);
  }
  LayoutChanged();
  if (!initialized_ || applied_clock_ < m.applied_clock) {
    applied_clock_ = m.applied_clock;
    steps_ = std::max(steps_, m.steps);
    metrics_.clock->Set(static_cast<double>(applied_clock_));
  }
  initialized_ = true;
  spdlog::info("shard {}: moved in {} keys ({} values) at applied clock {}", shard_id_,
               m.keys.size(), incoming, applied_clock_);
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  move_ok_ = true;
  Advance(out);
}


ShardSnapshot ShardCore::Snapshot() const {
  ShardSnapshot s;
  s.job_id = job_.job_id;
  s.shard_id = shard_id_;
  s.map_version = map_version_;
  s.applied_clock = applied_clock_;
  s.steps = steps_;
  s.updates_applied = updates_applied_;
  // Shared, not copied: the next write goes to new buffers.
  s.table = table_->Snapshot();
  for (const auto& [id, m] : live_) s.workers[id] = {m.pushed, m.seq};
  // Restored workers the monitor has not named again yet keep their marks:
  // a checkpoint taken before the membership arrives must not lose them.
  for (const auto& [id, mark] : restored_marks_) s.workers.emplace(id, mark);
  s.ledger = ledger_.Spans();  // applied pushes only: those of open clocks are not in it
  s.ledger_doubles = ledger_.doubles();
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
  if (!configured_) return absl::FailedPreconditionError("restore before the shard is configured");
  if (!table_->empty() || initialized_) {
    return absl::FailedPreconditionError("restore into a shard that already holds a model");
  }
  if (s.job_id != job_.job_id || s.shard_id != shard_id_) {
    return absl::InvalidArgumentError(
        "checkpoint of job " + std::to_string(s.job_id) + " shard " + std::to_string(s.shard_id) +
        ", this is job " + std::to_string(job_.job_id) + " shard " + std::to_string(shard_id_));
  }
  if (absl::Status st = table_->Restore(s.table); !st.ok()) return st;
  applied_clock_ = s.applied_clock;
  steps_ = s.steps;
  updates_applied_ = s.updates_applied;
  metrics_.model_updates->Set(static_cast<double>(updates_applied_));
  restored_marks_ = s.workers;
  // Its dedup state goes with the seed of a backup (a promoted replica's
  // new backup must not apply a retried push again).
  for (const auto& [worker, mark] : s.workers) {
    if (mark.seq > 0) applied_marks_[worker] = std::max(applied_marks_[worker], mark.seq);
  }
  ledger_.Assign(s.ledger, s.ledger_doubles);
  map_version_ = s.map_version;
  restored_ = true;
  initialized_ = true;
  metrics_.keys->Set(static_cast<double>(table_->key_count()));
  metrics_.clock->Set(static_cast<double>(applied_clock_));
  spdlog::info("shard {}: restored {} keys, {} values with {} state at applied clock {} (step {}, "
               "{} updates){}",
               shard_id_, table_->key_count(), table_->values(),
               OptimizerName(table_->config().kind), applied_clock_, steps_, updates_applied_,
               s.migrated ? "; migrated from a checkpoint of format 2 (SGD with momentum)" : "");
  return absl::OkStatus();
}

std::vector<float> ShardCore::TakeBuffer() {
  if (!spare_acc_.empty()) {
    std::vector<float> b = std::move(spare_acc_.back());
    spare_acc_.pop_back();
    std::fill(b.begin(), b.end(), 0.0f);
    return b;
  }
  // An accumulator a record went out with, once ZeroMQ has let go of it.
  for (auto it = lent_acc_.begin(); it != lent_acc_.end(); ++it) {
    if (it->use_count() == 1) {
      std::vector<float> b = std::move(**it);
      lent_acc_.erase(it);
      if (b.size() != table_->values()) break;
      std::fill(b.begin(), b.end(), 0.0f);
      return b;
    }
  }
  return std::vector<float>(table_->values(), 0.0f);
}

void ShardCore::NotePassed(Member& member, int64_t clock) {
  if (!restored_ || clock <= member.pushed) return;
  member.pushed = clock;
}

bool ShardCore::StaleEpoch(const Frame& peer, const Envelope& env, uint64_t epoch,
                           std::vector<Outgoing>* out) {
  // 0 on either side: no epoch known (no --replicas, or not heard yet). A
  // higher one than this shard's: the monitor moved the range's epoch on
  // with this shard still its primary (the map's address is this one's);
  // the shard hears of it with its next heartbeat.
  if (epoch == 0 || repl_epoch_ == 0 || epoch >= repl_epoch_) return false;
  metrics_.stale_epochs->Increment();
  ReplyError(peer, env, wire::ErrorCode::NotOwner,
             "shard " + std::to_string(shard_id_) + "'s range is at epoch " +
                 std::to_string(repl_epoch_) + ", the sender's shard map at " +
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
  } else if (auto range = backing_.find(d.env.sender); range != backing_.end()) {
    bound = range->second.public_key;  // a primary whose range this shard backs up
  }
  auto refused = server_.CheckSender(peer, bound, d);
  if (!refused) return true;
  out->push_back({peer, std::move(*refused)});
  return false;
}

void ShardCore::OnPush(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Push m = msg::Read<msg::Push>(d);
  std::string why;
  if (StaleEpoch(peer, d.env, m.epoch, out)) return;
  if (table_->empty() || !initialized_) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "parameters not initialised", out);
  }
  if (wire::ErrorCode code; !CheckKeys(m.keys, &why, &code)) {
    return ReplyError(peer, d.env, code, why, out);
  }
  auto member = live_.find(d.env.sender);
  if (member == live_.end()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotMember,
                      "worker " + std::to_string(d.env.sender) + " is not in membership v" +
                          std::to_string(membership_version_),
                      out);
  }
  metrics_.push->Increment();
  metrics_.push_bytes->Increment(static_cast<double>(d.payload.size()));
  Member& mem = member->second;
  if (const uint64_t seq = m.seq; seq != 0) {
    if (mem.check_gap) {
      // The first push since the restore: every push before it was
      // acknowledged; those after the snapshot's mark are lost.
      mem.check_gap = false;
      if (seq > mem.seq + 1) {
        const uint64_t lost = seq - 1 - mem.seq;
        lost_updates_ += lost;
        metrics_.lost->Increment(static_cast<double>(lost));
        spdlog::warn("shard {}: recovery: worker {} lost {} acknowledged push(es) (seq {}..{}); "
                     "{} lost so far",
                     shard_id_, d.env.sender, lost, mem.seq + 1, seq - 1, lost_updates_);
      }
    }
  }
  if (Duplicate(d.env.sender, mem, m.seq, m.clock)) {
    // A retry of a push already handled (before a timeout, or before the
    // snapshot this shard restarted from): acknowledged, not applied.
    metrics_.duplicates->Increment();
    out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env),
                                        msg::PushReply{m.clock, true, durable_seq(d.env.sender), repl_epoch_})});
    return;
  }
  if (m.parts != 1 || m.part != 0) return OnPushPart(peer, d, m, mem, out);
  PushArgs push;
  push.clock = m.clock;
  push.batch = m.batch;
  push.seq = m.seq;
  push.read_applied = m.read_applied;
  push.read_steps = m.read_steps;
  push.grad = {m.keys, d.floats()};
  push.lrs = m.lrs;
  if (job_.mode == wire::Mode::Asp) return OnAsyncPush(peer, d.env, push, mem, out);
  OnSyncPush(peer, d.env, push, mem, out);
}

bool ShardCore::Duplicate(uint32_t worker, const Member& member, uint64_t seq,
                          uint64_t clock) const {
  if (!options_.dedup) return false;
  if (seq != 0 && seq <= member.seq) return true;
  if (job_.mode == wire::Mode::Asp) {
    // No seq: clocks only move forward.
    return seq == 0 && static_cast<int64_t>(clock) <= member.pushed;
  }
  auto open = open_.find(clock);
  return open != open_.end() && open->second.pushed.count(worker) > 0;
}

void ShardCore::OnPushPart(const Frame& peer, const Decoded& d, const msg::Push& m,
                           Member& member, std::vector<Outgoing>* out) {
  if (m.seq == 0 || m.parts == 0 || m.parts > kMaxPushParts || m.part >= m.parts) {
    // A malformed header (the client sends its bytes again, as for BadCrc:
    // damage that the CRC did not catch, or with the check switched off).
    return ReplyError(peer, d.env, wire::ErrorCode::BadHeader,
                      "push part " + std::to_string(m.part) + " of " +
                          std::to_string(m.parts) + " with seq " + std::to_string(m.seq) +
                          ": parts need a seq, 1.." + std::to_string(kMaxPushParts) +
                          " parts and a part below their count",
                      out);
  }
  metrics_.push_parts->Increment();
  std::vector<uint64_t> keys;
  for (const wire::KeyLen& k : m.keys) keys.push_back(k.key());
  auto& st = member.staged;
  // A part that does not fit what is held for its seq (another layout after
  // a shard-map change, or another clock) starts the push afresh: the
  // worker sends all of its parts again.
  const bool fits = st && st->seq == m.seq && st->parts == m.parts &&
                    (st->received == 0 || (st->clock == m.clock && st->batch == m.batch)) &&
                    (!st->got[m.part] || st->part_keys[m.part] == keys);
  if (!fits) {
    st.emplace();
    st->seq = m.seq;
    st->parts = m.parts;
    st->got.assign(m.parts, false);
    st->part_keys.assign(m.parts, {});
  }
  if (!st->got[m.part]) {
    st->got[m.part] = true;
    st->part_keys[m.part] = std::move(keys);
    ++st->received;
    st->clock = m.clock;
    st->batch = m.batch;
    if (m.read_applied) st->read_applied = m.read_applied;
    if (m.read_steps) st->read_steps = m.read_steps;
    if (!m.lrs.empty()) st->lrs = m.lrs;
    // Each key's values straight to its offset in the staging buffer.
    if (member.staging.size() != table_->values()) member.staging.assign(table_->values(), 0.0f);
    const float* src = d.floats().data();
    for (const wire::KeyLen& k : m.keys) {
      const ParamTable::Slot* slot = table_->Find(k.key());  // CheckKeys passed
      std::memcpy(member.staging.data() + slot->offset, src, k.length() * sizeof(float));
      st->keys[k.key()] = k.length();
      src += k.length();
    }
  }
  if (st->received < st->parts) {
    out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env),
                                        msg::PushReply{m.clock, /*complete=*/false, 0, repl_epoch_})});
    return;
  }
  // The last part: the push, its keys in order, its values where the
  // staging buffer holds them (at the keys' table offsets).
  std::vector<wire::KeyLen> all_keys;
  all_keys.reserve(st->keys.size());
  for (const auto& [key, length] : st->keys) all_keys.emplace_back(key, length);
  PushArgs push;
  push.clock = st->clock;
  push.batch = st->batch;
  push.seq = st->seq;
  push.read_applied = st->read_applied;
  push.read_steps = st->read_steps;
  push.grad = {all_keys, member.staging, /*at_offsets=*/true};
  push.lrs = st->lrs;
  if (job_.mode == wire::Mode::Asp) {
    OnAsyncPush(peer, d.env, push, member, out);
    member.staged.reset();
  } else if (OnSyncPush(peer, d.env, push, member, out)) {
    member.staged.reset();
  } else {
    // Not taken yet (a restored shard catching up): keep the parts; this
    // one, sent again, completes the push again.
    member.staged->got[m.part] = false;
    --member.staged->received;
  }
}

float ShardCore::StalenessWeight(const PushArgs& push) {
  int64_t tau = 0;
  if (job_.mode == wire::Mode::Asp) {
    // Steps applied since the read, counted in rounds of one push per live
    // worker: each push moves the model b_i/B of a step, so a worker in
    // lockstep with the others reads fresh parameters.
    if (const auto read = push.read_steps) {
      const uint64_t since = steps_ > *read ? steps_ - *read : 0;
      tau = static_cast<int64_t>(since / std::max<size_t>(1, live_.size()));
    }
  } else if (const auto read = push.read_applied) {
    // The step this gradient joins is clock c; it was computed on parameters
    // through read_applied, so it missed the steps read_applied+1 .. c-1.
    tau = std::max<int64_t>(0, static_cast<int64_t>(push.clock) - 1 - *read);
  }
  metrics_.staleness->Observe(static_cast<double>(tau));
  if (tau > 0) ++stale_pushes_;
  return job_.staleness_aware_lr ? 1.0f / static_cast<float>(1 + tau) : 1.0f;
}

void ShardCore::RecordPush(Member& member, uint64_t clock) {
  member.pushed = std::max(member.pushed, static_cast<int64_t>(clock));
  member.push_times.push_back(Seconds(clock_->Now()));
  if (member.push_times.size() > kPushTimes) member.push_times.pop_front();
}

void ShardCore::OnAsyncPush(const Frame& peer, const Envelope& env, const PushArgs& push,
                            Member& member, std::vector<Outgoing>* out) {
  const uint64_t clock = push.clock;
  // One optimizer step on this gradient, its lr scaled b_i / B (an empty
  // push, batch 0, is recorded and changes nothing).
  if (options_.apply_updates && !push.grad.keys.empty() && push.batch > 0) {
    const float share = static_cast<float>(push.batch) /
                        static_cast<float>(std::max<uint32_t>(1, job_.global_batch));
    StepRecord step;
    step.grad = push.grad;
    ScaleStep(push.lrs, StalenessWeight(push) * share, std::min(share, 1.0f), &step);
    table_->Step(step);
    ReplicateStep(step, nullptr);
  }
  member.seq = std::max(member.seq, push.seq);
  NoteApplied(env.sender, push.seq);
  RecordPush(member, clock);
  CountApplied();
  ++steps_;
  metrics_.steps->Increment();
  applied_clock_ = std::max<int64_t>(applied_clock_, static_cast<int64_t>(clock));
  metrics_.clock->Set(static_cast<double>(applied_clock_));
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(env),
                                      msg::PushReply{clock, true, durable_seq(env.sender), repl_epoch_})});
  if (ReplicationBatchFull()) {
    FlushReplication(out);
  }
  Advance(out);
}

void ShardCore::ScaleStep(std::span<const wire::GroupLr> carried, float scale, float fraction,
                          StepRecord* step) const {
  step->fraction = fraction;
  if (table_->config().kind == OptimizerKind::kSgd) {
    // SGD: the gradient. Scaling its lr would damp only this step: the
    // momentum buffer keeps the stale gradient whole and applies it, at
    // full lr, in the steps after (a delayed gradient under momentum 0.9
    // made chaos runs diverge). Without momentum the two are the same. The
    // fraction of a full step (samples over the global batch) decays the
    // buffer and weighs its part of the update (BlockStep::fraction).
    step->grad_scale *= scale;
    step->lr = StepLrs(carried, 1.0f);
  } else {
    // Adam, AdamW, Adagrad normalise the gradient: only the lr scales a step.
    step->lr = StepLrs(carried, scale);
  }
}

std::vector<float> ShardCore::StepLrs(std::span<const wire::GroupLr> carried, float scale) const {
  std::vector<float> lr(table_->groups());
  for (uint32_t g = 0; g < lr.size(); ++g) lr[g] = table_->settings(g).lr;
  for (const wire::GroupLr& c : carried) {
    if (c.group() < lr.size() && std::isfinite(c.lr()) && c.lr() >= 0.0f) lr[c.group()] = c.lr();
  }
  for (const auto& [g, value] : lr_overrides_) {
    if (g < lr.size()) lr[g] = value;
  }
  for (float& x : lr) x *= scale;
  return lr;
}

void ShardCore::SetLrOverrides(uint64_t version, const std::vector<wire::GroupLr>& overrides) {
  if (version <= lr_overrides_version_) return;
  lr_overrides_version_ = version;
  lr_overrides_.clear();
  for (const wire::GroupLr& o : overrides) lr_overrides_[o.group()] = o.lr();
  std::string list;
  for (const auto& [g, value] : lr_overrides_) {
    list += (list.empty() ? "" : ", ") + std::string("group ") + std::to_string(g) + " lr " +
            std::to_string(value);
  }
  spdlog::info("shard {}: learning rates set by hand (v{}): {}", shard_id_, version,
               list.empty() ? "none" : list);
}

bool ShardCore::OnSyncPush(const Frame& peer, const Envelope& env, const PushArgs& push,
                           Member& member, std::vector<Outgoing>* out) {
  const uint64_t clock = push.clock;
  // It pushed every clock before this one (the replies said so).
  NotePassed(member, static_cast<int64_t>(clock) - 1);
  if (restored_) Advance(out);
  if (static_cast<int64_t>(clock) <= applied_clock_) {
    member.seq = std::max(member.seq, push.seq);
    if (job_.mode == wire::Mode::Backup) {
      ++dropped_pushes_;
      metrics_.dropped->Increment();
    }
    ReplyError(peer, env, wire::ErrorCode::Stale,
               "clock " + std::to_string(clock) + " is already closed (applied through " +
                   std::to_string(applied_clock_) + ")",
               out);
    return true;
  }
  if (static_cast<int64_t>(clock) > applied_clock_ + kMaxOpenClocks) {
    if (restored_) {
      // Catching up after a restore: the other workers' next pushes or
      // pulls move the applied clock; the worker retries.
      ReplyError(peer, env, wire::ErrorCode::NotReady,
                 "clock " + std::to_string(clock) + " is ahead of the restored clock " +
                     std::to_string(applied_clock_) + "; catching up",
                 out);
      return false;
    }
    // Each open clock holds a full accumulator: refuse runaway clocks.
    ReplyError(peer, env, wire::ErrorCode::Refused,
               "clock " + std::to_string(clock) + " is more than " +
                   std::to_string(kMaxOpenClocks) + " ahead of applied clock " +
                   std::to_string(applied_clock_),
               out);
    return false;
  }
  auto it = open_.find(clock);
  if (it == open_.end()) {
    OpenClock fresh;
    fresh.acc = TakeBuffer();
    fresh.opened = fresh.reported = clock_->Now();
    it = open_.emplace(clock, std::move(fresh)).first;
  }
  OpenClock& oc = it->second;
  // Duplicates were answered before (Duplicate); this push counts.
  oc.pushed.insert(env.sender);
  const float weight = StalenessWeight(push) * static_cast<float>(push.batch);
  if (options_.apply_updates) table_->AddInto(oc.acc, push.grad, weight);
  oc.batch_sum += push.batch;
  oc.weight_sum += weight;
  oc.seqs[env.sender] = push.seq;
  if (!push.lrs.empty()) {
    // The step's lrs: those of the push with the highest seq (one clock).
    const bool differ =
        oc.has_lrs && !std::equal(push.lrs.begin(), push.lrs.end(), oc.lrs.begin(), oc.lrs.end(),
                                  [](const wire::GroupLr& a, const wire::GroupLr& b) {
                                    return a.group() == b.group() && a.lr() == b.lr();
                                  });
    if (differ && !lr_disagreement_logged_) {
      lr_disagreement_logged_ = true;
      spdlog::warn("shard {}: the pushes of clock {} carry different learning rates (worker {}'s "
                   "with seq {} among them); the step takes those of the push with the highest "
                   "seq (logged once)",
                   shard_id_, clock, env.sender, push.seq);
    }
    if (!oc.has_lrs || push.seq >= oc.lrs_seq) {
      oc.lrs.assign(push.lrs.begin(), push.lrs.end());
      oc.lrs_seq = push.seq;
      oc.has_lrs = true;
    }
  }
  member.seq = std::max(member.seq, push.seq);
  RecordPush(member, clock);
  CountApplied();
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(env),
                                      msg::PushReply{clock, true, durable_seq(env.sender), repl_epoch_})});
  Advance(out);
  return true;
}

void ShardCore::CountApplied() {
  metrics_.updates->Increment();
  ++updates_applied_;
  metrics_.model_updates->Set(static_cast<double>(updates_applied_));
}

int64_t ShardCore::slowest_pushed() const {
  if (live_.empty()) return applied_clock_;
  int64_t slowest = INT64_MAX;
  for (const auto& [id, m] : live_) slowest = std::min(slowest, m.pushed);
  return slowest;
}

uint32_t ShardCore::last_grant(uint32_t worker) const {
  auto it = live_.find(worker);
  return it == live_.end() ? 0 : it->second.last_grant;
}

bool ShardCore::PullReady(uint32_t worker, uint64_t clock) {
  if (!initialized_) return false;
  switch (job_.mode) {
    case wire::Mode::Asp:
      return true;
    case wire::Mode::Ssp:
    case wire::Mode::Dssp: {
      // Every clock up to c - s - 1 must be in the parameters read: its step
      // applied, i.e. every live worker pushed it.
      auto me = live_.find(worker);
      const uint32_t s = me == live_.end() ? 0 : me->second.staleness;
      if (SspReadAllowed(clock, applied_clock_, s)) return true;
      if (job_.mode == wire::Mode::Ssp || me == live_.end()) return false;
      // DSSP: this worker would block at s_L; grant it r* extra iterations,
      // chosen from its push times and the slowest worker's.
      const Member* slow = nullptr;
      for (const auto& [id, m] : live_) {
        if (slow == nullptr || m.pushed < slow->pushed) slow = &m;
      }
      std::vector<double> mine(me->second.push_times.begin(), me->second.push_times.end());
      std::vector<double> theirs(slow->push_times.begin(), slow->push_times.end());
      const uint32_t r = DsspExtraIterations(mine, theirs, me->second.staleness_range);
      if (!SspReadAllowed(clock, applied_clock_, s + r)) return false;
      // Counted once per read that needed the grant.
      me->second.last_grant = r;
      metrics_.grants->Increment(r);
      return true;
    }
    default:  // Bsp, Backup: the previous clock's step has been applied
      return static_cast<int64_t>(clock) <= applied_clock_ + 1;
  }
}

void ShardCore::OnPull(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Pull m = msg::Read<msg::Pull>(d);
  std::string why;
  if (StaleEpoch(peer, d.env, m.epoch, out)) return;
  if (table_->empty()) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "model not declared yet", out);
  }
  if (wire::ErrorCode code; !CheckKeys(m.keys, &why, &code)) {
    return ReplyError(peer, d.env, code, why, out);
  }
  metrics_.pull->Increment();
  if (restored_ && !m.latest && job_.mode != wire::Mode::Asp) {
    // A read of clock c comes after the reader's push of c - 1.
    auto me = live_.find(d.env.sender);
    if (me != live_.end() && m.clock > 0) {
      NotePassed(me->second, static_cast<int64_t>(m.clock) - 1);
      Advance(out);
    }
  }
  for (ParkedPull& p : parked_) {
    if (p.env.sender == d.env.sender && p.env.request_id == d.env.request_id) {
      // A resend of a pull already waiting: answer it on the newest connection.
      p.peer = peer;
      return;
    }
  }
  if (m.with_state) {
    // The optimizer's state as it is now (pacerctl export-model --with-state).
    if (!m.latest) {
      return ReplyError(peer, d.env, wire::ErrorCode::BadHeader,
                        "a pull with_state reads the latest values (latest=true)", out);
    }
    if (!initialized_) {
      return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "parameters not initialised", out);
    }
    return AnswerStatePull(peer, d.env, m.keys, out);
  }
  std::vector<wire::KeyLen> keys = m.keys;
  if ((m.latest && initialized_) || PullReady(d.env.sender, m.clock)) {
    return AnswerPull(peer, d.env, m.clock, keys, 0, out);
  }
  const TimePoint now = clock_->Now();
  parked_.push_back({peer, d.env, m.clock, std::move(keys), now, now + options_.pull_timeout});
  metrics_.parked->Set(static_cast<double>(parked_.size()));
}

std::shared_ptr<std::vector<float>> ShardCore::ReplyBuffer(size_t floats) {
  for (auto& b : reply_pool_) {
    if (b.use_count() == 1 && b->size() == floats) return b;
  }
  if (reply_pool_.size() >= 16) {
    // Drop buffers ZeroMQ no longer holds that have the wrong size.
    std::erase_if(reply_pool_, [](const auto& b) { return b.use_count() == 1; });
  }
  reply_pool_.push_back(std::make_shared<std::vector<float>>(floats));
  return reply_pool_.back();
}

void ShardCore::AnswerPull(const Frame& peer, const Envelope& to, uint64_t clock,
                           std::span<const wire::KeyLen> keys, double waited,
                           std::vector<Outgoing>* out) {
  size_t total = 0;
  bool contiguous = true;  // keys laid out back to back in the table
  size_t first = 0;
  const FloatBuffer& params = table_->params();
  for (size_t i = 0; i < keys.size(); ++i) {
    const ParamTable::Slot& s = *table_->Find(keys[i].key());
    if (i == 0) first = s.offset;
    contiguous &= s.offset == first + total;
    total += keys[i].length();
  }
  Frame payload;
  if (total > 0 && contiguous) {
    // Zero-copy: the frame shares the parameters, which the table writes
    // around while the frame is alive.
    payload = Frame(params, params->data() + first, total * sizeof(float));
  } else if (total > 0) {
    auto buf = ReplyBuffer(total);
    float* dst = buf->data();
    for (const auto& k : keys) {
      const ParamTable::Slot& s = *table_->Find(k.key());
      std::memcpy(dst, params->data() + s.offset, s.length * sizeof(float));
      dst += s.length;
    }
    payload = Frame(buf, buf->data(), total * sizeof(float));
  }
  metrics_.pull_bytes->Increment(static_cast<double>(total * sizeof(float)));
  // A parked pull: its time parked; else the time since it arrived.
  metrics_.pull_seconds->Observe(waited > 0 ? waited : ToSeconds(clock_->Now() - handle_start_));
  metrics_.pull_wait->Observe(waited);
  msg::PullReply reply;
  reply.clock = clock;
  reply.applied_clock = applied_clock_;
  reply.keys.assign(keys.begin(), keys.end());
  reply.waited_seconds = static_cast<float>(waited);
  reply.steps = steps_;
  reply.durable_seq = durable_seq(to.sender);
  reply.epoch = repl_epoch_;
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(to), reply, std::move(payload),
                                      options_.check_crc)});
}

void ShardCore::AnswerStatePull(const Frame& peer, const Envelope& to,
                                std::span<const wire::KeyLen> keys, std::vector<Outgoing>* out) {
  size_t total = 0;
  for (const wire::KeyLen& k : keys) total += k.length();
  const size_t slots = table_->state_slots();
  auto buf = std::make_shared<std::vector<float>>(total * (1 + slots));
  msg::PullReply reply;
  reply.applied_clock = applied_clock_;
  reply.keys.assign(keys.begin(), keys.end());
  reply.steps = steps_;
  reply.optimizer = table_->config().kind;
  reply.state_slots = static_cast<uint32_t>(slots);
  size_t at = 0;
  for (const wire::KeyLen& k : keys) {
    const ParamTable::Slot& s = *table_->Find(k.key());
    reply.key_steps.push_back(s.steps);
    std::span<const float> p = table_->Param(k.key());
    std::copy(p.begin(), p.end(), buf->begin() + static_cast<long>(at));
    for (size_t i = 0; i < slots; ++i) {
      std::span<const float> v = table_->State(i, k.key());
      std::copy(v.begin(), v.end(), buf->begin() + static_cast<long>((i + 1) * total + at));
    }
    at += k.length();
  }
  Frame payload;
  if (!buf->empty()) payload = Frame(buf, buf->data(), buf->size() * sizeof(float));
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(to), reply, std::move(payload),
                                      options_.check_crc)});
}

void ShardCore::Advance(std::vector<Outgoing>* out) {
  if (leaving_) return;  // no step after the last record (Leave)
  if (job_.mode != wire::Mode::Asp) {
    // Backup mode closes a clock once all but k live workers pushed it.
    const size_t k = job_.mode == wire::Mode::Backup ? job_.backup_workers : 0;
    const size_t needed = live_.size() > k ? live_.size() - k : 1;
    while (!live_.empty()) {
      const int64_t next = applied_clock_ + 1;
      auto it = open_.begin();
      const bool have = it != open_.end() && static_cast<int64_t>(it->first) == next;
      // Workers that pushed this clock (or, after a restore, passed it).
      size_t passed = 0;
      for (const auto& [id, m] : live_) passed += m.pushed >= next;
      if (passed < needed) break;
      if (!have) {
        if (!restored_) break;
        // Every push of this clock was lost in the crash: close it as is.
        ++skipped_clocks_;
        applied_clock_ = next;
        metrics_.clock->Set(static_cast<double>(applied_clock_));
        continue;
      }
      OpenClock& oc = it->second;
      size_t from_live = 0;
      for (const auto& [id, m] : live_) from_live += oc.pushed.count(id);
      // One synchronous step on the batch-weighted mean of the clock's
      // gradients, g = sum_i w_i b_i g_i / sum_i w_i b_i (w_i the staleness
      // weight, 1 when fresh: then exactly torch's step on the global
      // batch); the weights' mean scales the lr, not the gradient. A clock
      // short of the global batch B steps in proportion, by
      // sum_i w_i b_i / max(sum_i b_i, B): workers take a new batch size at
      // their own clocks, so after the monitor swaps two sizes (1 and 191)
      // the clocks between hold 1 + 1 samples, and full steps on such
      // means, amplified by momentum, could wreck the model; SGD's momentum
      // also takes the clock's fraction of B (BlockStep::fraction), so that
      // the clocks of a worker left alone with batches of 1 at an epoch's
      // end do not each coast a full momentum step. Backup mode
      // drops its last k pushes by design and keeps the plain mean.
      if (options_.apply_updates && oc.batch_sum > 0 && oc.weight_sum > 0) {
        StepRecord step;
        step.grad = {{}, oc.acc, /*at_offsets=*/true};
        step.grad_scale = static_cast<float>(1.0 / oc.weight_sum);
        double samples = static_cast<double>(oc.batch_sum);
        if (job_.mode != wire::Mode::Backup) {
          samples = std::max(samples, static_cast<double>(job_.global_batch));
        }
        ScaleStep(oc.lrs, static_cast<float>(oc.weight_sum / samples),
                  static_cast<float>(static_cast<double>(oc.batch_sum) / samples), &step);
        table_->Step(step);
        if (!backups_.empty()) {
          // The record carries the accumulator itself (the step's gradient).
          ReplicateStep(step, std::make_shared<std::vector<float>>(std::move(oc.acc)));
        }
      }
      for (const auto& [worker, seq] : oc.seqs) NoteApplied(worker, seq);
      if (oc.pushed.size() != from_live) {
        ++incomplete_steps_;  // includes pushes from workers that have since left
        metrics_.incomplete->Increment();
      }
      ++steps_;
      metrics_.steps->Increment();
      applied_clock_ = static_cast<int64_t>(it->first);
      metrics_.clock->Set(static_cast<double>(applied_clock_));
      // The step goes to the backups after aggregation, with the clock and
      // step count it leaves (a promoted replica resumes from them): in
      // bsp and backup mode in a record of its own at once; in ssp and
      // dssp, whose workers run ahead, with the next steps, as asp's
      // pushes are batched (kReplicaBatchDelay).
      const bool batched = job_.mode == wire::Mode::Ssp || job_.mode == wire::Mode::Dssp;
      if (!batched || ReplicationBatchFull()) FlushReplication(out);
      if (!oc.acc.empty()) spare_acc_.push_back(std::move(oc.acc));
      open_.erase(it);
    }
  }
  const TimePoint now = clock_->Now();
  for (auto it = parked_.begin(); it != parked_.end();) {
    if (PullReady(it->env.sender, it->clock)) {
      AnswerPull(it->peer, it->env, it->clock, it->keys, ToSeconds(now - it->parked_at), out);
      it = parked_.erase(it);
    } else {
      ++it;
    }
  }
  metrics_.parked->Set(static_cast<double>(parked_.size()));
}

void ShardCore::Tick(std::vector<Outgoing>* out) {
  handle_start_ = clock_->Now();  // for pulls answered from here
  const TimePoint now = clock_->Now();
  if (!backups_.empty()) metrics_.lag_seconds->Set(replication_lag_seconds());
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
  if (repl_first_ != TimePoint::max() && now - repl_first_ >= kReplicaBatchDelay) {
    FlushReplication(out);
  }
  for (auto& [id, link] : backups_) {
    if (!link.seeded && initialized_ && now >= link.retry_at) SendSeed(id, out);
  }
}

TimePoint ShardCore::NextDeadline() const {
  TimePoint t = TimePoint::max();
  for (const auto& p : parked_) t = std::min(t, p.deadline);
  if (repl_first_ != TimePoint::max()) t = std::min(t, repl_first_ + kReplicaBatchDelay);
  for (const auto& [id, link] : backups_) {
    if (!link.seeded && initialized_) t = std::min(t, link.retry_at);
  }
  return t;
}


}  // namespace pacer
