// ShardCore's replication (issue 23): the primary's records to its range's
// backups, durable acknowledgements, and the backup's replicas. The rest of
// ShardCore is in shard.cc.
#include <algorithm>
#include <atomic>
#include <limits>

#include "ps/shard.h"
#include "spdlog/spdlog.h"

namespace pacer {

namespace {
// A check window holds about this many values of the parameters (the state
// slots as many again each).
constexpr size_t kCheckWindowValues = size_t{1} << 16;
// A backup that refused a record is seeded again this long after.
constexpr Duration kReseedAfter = std::chrono::milliseconds(200);
}  // namespace

Envelope ShardCore::RequestEnvelope() {
  Envelope env;
  env.job_id = job_.job_id;
  env.sender = shard_id_;
  env.request_id = NewRequestId();
  return env;
}

void ShardCore::SetReplicaSet(uint64_t epoch, std::vector<uint32_t> backups,
                              std::vector<Outgoing>* out) {
  std::sort(backups.begin(), backups.end());
  backups.erase(std::unique(backups.begin(), backups.end()), backups.end());
  std::erase(backups, shard_id_);
  const bool new_epoch = epoch != repl_epoch_;
  std::map<uint32_t, BackupLink> links;
  for (uint32_t id : backups) {
    auto it = backups_.find(id);
    // A new epoch: every backup starts again from a seed of this epoch.
    links[id] = it != backups_.end() && !new_epoch ? it->second : BackupLink{};
  }
  if (links.size() != backups_.size() || new_epoch ||
      !std::equal(links.begin(), links.end(), backups_.begin(),
                  [](const auto& a, const auto& b) { return a.first == b.first; })) {
    std::string list;
    for (uint32_t id : backups) list += (list.empty() ? "" : ", ") + std::to_string(id);
    spdlog::info("shard {}: range epoch {}, backups: {}", shard_id_, epoch,
                 list.empty() ? "none" : list);
  }
  repl_epoch_ = epoch;
  backups_ = std::move(links);
  metrics_.backups->Set(static_cast<double>(backups_.size()));
  if (backups_.empty()) {
    ClearReplicationBatch();
    repl_values_.reset();
    sent_values_.clear();
    repl_lent_.reset();
    unacked_.clear();
  }
  for (auto& [id, link] : backups_) {
    if (!link.seeded && initialized_) SendSeed(id, out);
  }
  UpdateDurable();
}

void ShardCore::SetBacking(std::map<uint32_t, BackedRange> ranges) {
  ranges.erase(shard_id_);
  for (auto it = replicas_.begin(); it != replicas_.end();) {
    if (ranges.count(it->first) == 0) {
      spdlog::info("shard {}: no longer backs up shard {}'s range; its replica is dropped",
                   shard_id_, it->first);
      it = replicas_.erase(it);
    } else {
      ++it;
    }
  }
  backing_ = std::move(ranges);
  metrics_.replicas->Set(static_cast<double>(replicas_.size()));
}

uint64_t ShardCore::durable_seq(uint32_t worker) const {
  auto it = durable_.find(worker);
  return it == durable_.end() ? 0 : it->second;
}

uint64_t ShardCore::backup_acked(uint32_t id) const {
  auto it = backups_.find(id);
  return it == backups_.end() ? 0 : it->second.acked;
}

uint64_t ShardCore::durable_record() const {
  uint64_t held = record_;
  for (const auto& [id, link] : backups_) held = std::min(held, link.acked);
  return held;
}

std::map<uint32_t, uint64_t> ShardCore::replica_records() const {
  std::map<uint32_t, uint64_t> held;
  for (const auto& [range, r] : replicas_) held[range] = r.record;
  return held;
}

const ParamTable* ShardCore::replica_table(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? nullptr : it->second.table.get();
}

uint64_t ShardCore::replica_record(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? 0 : it->second.record;
}

std::map<uint32_t, uint64_t> ShardCore::replica_marks(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? std::map<uint32_t, uint64_t>{} : it->second.marks;
}

void ShardCore::NoteApplied(uint32_t worker, uint64_t seq) {
  if (seq == 0) return;
  ledger_.Add(worker, seq);
  if (!backups_.empty()) {
    repl_applied_.emplace_back(worker, seq);
    repl_first_ = std::min(repl_first_, clock_->Now());
  }
  uint64_t& mark = applied_marks_[worker];
  if (seq <= mark) return;
  mark = seq;
  if (backups_.empty() || !options_.wait_durable) {
    durable_[worker] = seq;  // nothing to wait for (--replicas 0, or no backup left)
    return;
  }
  repl_marks_[worker] = seq;
  repl_first_ = std::min(repl_first_, clock_->Now());
}

void ShardCore::NoteAssignKeys(std::span<const wire::KeyLen> keys) {
  if (keys.empty()) repl_assign_all_ = true;
  if (repl_assign_all_) return;
  for (const wire::KeyLen& k : keys) repl_assign_keys_.push_back(k.key());
}

bool ShardCore::ReplicationBatchFull() const {
  return repl_batch_steps_ >= kReplicaBatchSteps ||
         (repl_values_ && repl_values_->size() >= kReplicaBatchValues);
}

void ShardCore::ReplicateStep(const StepRecord& step, std::shared_ptr<std::vector<float>> lent) {
  if (backups_.empty()) return;
  ++repl_batch_steps_;
  repl_first_ = std::min(repl_first_, clock_->Now());
  if (repl_assign_) {
    // The record will carry these keys' state as SendRecord finds it.
    NoteAssignKeys(step.grad.keys);
    RecycleAccumulator(std::move(lent));
    return;
  }
  msg::ReplicaStep rs;
  rs.keys.assign(step.grad.keys.begin(), step.grad.keys.end());
  rs.grad_scale = step.grad_scale;
  rs.lr = step.lr;
  rs.fraction = step.fraction;
  rs.values = step.grad.values.size();
  if (lent && repl_steps_.empty()) {
    repl_lent_ = std::move(lent);  // the step's accumulator goes out as it is
  } else {
    if (!repl_values_) repl_values_ = TakeRecordBuffer();
    std::vector<float>& values = *repl_values_;
    if (repl_lent_) {
      values.assign(repl_lent_->begin(), repl_lent_->end());
      RecycleAccumulator(std::move(repl_lent_));
    }
    if (step.grad.at_offsets && !step.grad.keys.empty()) {
      // Values at table offsets (a push assembled from parts): the record
      // carries them in key order.
      rs.values = 0;
      for (const wire::KeyLen& k : step.grad.keys) {
        const ParamTable::Slot* slot = table_->Find(k.key());
        const float* src = step.grad.values.data() + slot->offset;
        values.insert(values.end(), src, src + k.length());
        rs.values += k.length();
      }
    } else {
      values.insert(values.end(), step.grad.values.begin(), step.grad.values.end());
    }
    RecycleAccumulator(std::move(lent));  // copied: the next clock's, zeroed
  }
  repl_steps_.push_back(std::move(rs));
  // Gradients past the state they change (asp: a few pushes of a range):
  // the record carries the state instead, read when it goes out; the
  // gradients copied so far are let go.
  const size_t state_values = (1 + table_->state_slots()) * table_->values();
  if (repl_steps_.size() > 1 && repl_values_ && repl_values_->size() > state_values) {
    repl_assign_ = true;
    for (const msg::ReplicaStep& s : repl_steps_) NoteAssignKeys(s.keys);
    repl_steps_.clear();
    repl_values_->clear();
  }
}

void ShardCore::RecycleAccumulator(std::shared_ptr<std::vector<float>> acc) {
  // A step's accumulator not lent to a record (ssp and dssp batch several
  // steps in one): it serves a later clock (TakeBuffer) instead of a fresh
  // table-sized allocation per step.
  if (acc && acc.use_count() == 1 && acc->size() == table_->values()) {
    spare_acc_.push_back(std::move(*acc));
  }
}

std::shared_ptr<std::vector<float>> ShardCore::TakeRecordBuffer() {
  // One a record went out with, once ZeroMQ has let go of it: it keeps its
  // capacity, so that a batch neither grows a new buffer by doubling (a
  // copy per doubling) nor pulls fresh pages from the kernel each time.
  for (auto it = sent_values_.begin(); it != sent_values_.end(); ++it) {
    if (it->use_count() == 1) {
      std::atomic_thread_fence(std::memory_order_acquire);  // ZeroMQ's reads are done
      std::shared_ptr<std::vector<float>> b = std::move(*it);
      sent_values_.erase(it);
      b->clear();
      return b;
    }
  }
  return std::make_shared<std::vector<float>>();
}

std::pair<uint64_t, uint64_t> ShardCore::NextCheckWindow() {
  const auto& slots = table_->slots();
  if (slots.empty()) return {0, 0};
  auto it = slots.lower_bound(check_cursor_);
  if (it == slots.end()) it = slots.begin();
  const uint64_t begin = it->first;
  size_t values = 0;
  while (it != slots.end() && (values == 0 || values + it->second.length <= kCheckWindowValues)) {
    values += it->second.length;
    ++it;
  }
  const uint64_t end = it == slots.end() ? slots.rbegin()->first + 1 : it->first;
  check_cursor_ = it == slots.end() ? 0 : it->first;
  return {begin, end};
}

void ShardCore::FlushReplication(std::vector<Outgoing>* out) {
  if (backups_.empty() ||
      (repl_batch_steps_ == 0 && repl_marks_.empty() && repl_applied_.empty())) {
    return;
  }
  SendRecord(false, out);
}

void ShardCore::Leave(std::vector<Outgoing>* out) {
  if (backups_.empty() || leaving_) return;
  SendRecord(true, out);
  leaving_ = true;
}

void ShardCore::SetDurableHold(bool hold) {
  if (hold == durable_hold_) return;
  durable_hold_ = hold;
  spdlog::info("shard {}: {}", shard_id_,
               hold ? "durability held where it is (a dropped backup stands by)"
                    : "durability goes on (no standby any more)");
  UpdateDurable();
}

void ShardCore::CancelLeave(std::vector<Outgoing>* out) {
  if (!leaving_) return;
  leaving_ = false;
  Advance(out);  // a clock whose pushes all came meanwhile closes now
}

bool ShardCore::replicas_final() const {
  for (const auto& [range, r] : replicas_) {
    if (r.table && !r.last) return false;
  }
  return true;
}

uint32_t ShardCore::state_crc() const {
  return table_->Crc(0, std::numeric_limits<uint64_t>::max());
}

std::map<uint32_t, ShardCore::ReplicaView> ShardCore::replica_views() const {
  std::map<uint32_t, ReplicaView> views;
  for (const auto& [range, r] : replicas_) {
    if (!r.table) continue;
    views[range] = {r.epoch, r.record, r.last, r.table->Crc(0, std::numeric_limits<uint64_t>::max()),
                    &r.ledger};
  }
  return views;
}

void ShardCore::SendRecord(bool last, std::vector<Outgoing>* out) {
  msg::Replicate rec;
  rec.range = shard_id_;
  rec.epoch = repl_epoch_;
  rec.record = ++record_;
  if (repl_assign_) {
    // The state the batch's steps left in the keys they changed (those
    // still here: a layout change since seeds every backup afresh).
    msg::ReplicaStep rs;
    rs.assign = true;
    if (!repl_assign_all_) {
      std::sort(repl_assign_keys_.begin(), repl_assign_keys_.end());
      repl_assign_keys_.erase(std::unique(repl_assign_keys_.begin(), repl_assign_keys_.end()),
                              repl_assign_keys_.end());
      for (uint64_t key : repl_assign_keys_) {
        if (const ParamTable::Slot* slot = table_->Find(key)) {
          rs.keys.emplace_back(key, slot->length);
        }
      }
      if (rs.keys.size() == table_->key_count()) rs.keys.clear();  // every key
    }
    if (!repl_values_) repl_values_ = TakeRecordBuffer();
    table_->Read(rs.keys, repl_values_.get(), &rs.key_steps);
    rs.values = repl_values_->size();
    repl_steps_.assign(1, std::move(rs));
  }
  rec.steps = std::move(repl_steps_);
  rec.marks.assign(repl_marks_.begin(), repl_marks_.end());
  rec.applied = std::move(repl_applied_);
  rec.last = last;
  rec.applied_clock = applied_clock_;
  rec.step_count = steps_;
  if (record_ % kReplicaCheckEvery == 0) {
    std::tie(rec.check_begin, rec.check_end) = NextCheckWindow();
    rec.check = table_->Crc(rec.check_begin, rec.check_end);
  }
  Frame payload;
  if (repl_lent_) {
    payload = Frame(repl_lent_, repl_lent_->data(), repl_lent_->size() * sizeof(float));
    lent_acc_.push_back(std::move(repl_lent_));
  } else if (repl_values_ && !repl_values_->empty()) {
    payload = Frame(repl_values_, repl_values_->data(), repl_values_->size() * sizeof(float));
    // Kept to be used again (TakeRecordBuffer): a few at most, and none
    // much past a batch's bound (one push of a big range may be larger).
    if (sent_values_.size() < kRecordBuffers &&
        repl_values_->capacity() <= 2 * kReplicaBatchValues) {
      sent_values_.push_back(repl_values_);
    }
  }
  repl_values_.reset();
  const double bytes = static_cast<double>(payload.size());
  const Envelope env = RequestEnvelope();
  Frames frames = EncodeMessage(env, rec, std::move(payload), options_.check_crc);
  const TimePoint now = clock_->Now();
  for (auto& [id, link] : backups_) {
    if (!link.seeded) continue;  // its seed will hold this record's state
    out->push_back({Frame(), frames, id});
    metrics_.record_bytes->Increment(bytes);
    if (link.behind_since == TimePoint::max()) link.behind_since = now;
  }
  unacked_.push_back({record_, std::move(rec.marks), now});
  metrics_.records->Increment();
  ClearReplicationBatch();
  UpdateDurable();
}

void ShardCore::ClearReplicationBatch() {
  repl_steps_.clear();
  repl_batch_steps_ = 0;
  repl_assign_ = repl_assign_all_ = false;
  repl_assign_keys_.clear();
  repl_marks_.clear();
  repl_applied_.clear();
  repl_first_ = TimePoint::max();
}

void ShardCore::SendSeed(uint32_t backup, std::vector<Outgoing>* out) {
  auto link = backups_.find(backup);
  if (link == backups_.end() || !initialized_) return;
  FlushReplication(out);  // the seed stands for the state after the last record
  auto slice =
      std::make_shared<TableSlice>(table_->Extract(0, std::numeric_limits<uint64_t>::max()));
  msg::Replicate rec;
  rec.range = shard_id_;
  rec.epoch = repl_epoch_;
  rec.record = record_;
  rec.seed = MoveDataOf(*table_, *slice, applied_clock_, steps_);
  rec.marks.assign(applied_marks_.begin(), applied_marks_.end());
  rec.ledger = ledger_.Spans();
  rec.doubles = ledger_.doubles();
  rec.applied_clock = applied_clock_;
  rec.step_count = steps_;
  Frame payload;
  if (!slice->values.empty()) {
    payload = Frame(slice, slice->values.data(), slice->values.size() * sizeof(float));
  }
  metrics_.seed_bytes->Increment(static_cast<double>(slice->values.size() * sizeof(float)));
  out->push_back({Frame(), EncodeMessage(RequestEnvelope(), rec, std::move(payload),
                                         options_.check_crc),
                  backup});
  link->second.seeded = true;
  link->second.seed_record = record_;
  if (link->second.behind_since == TimePoint::max()) link->second.behind_since = clock_->Now();
  metrics_.seeds->Increment();
  spdlog::info("shard {}: seeding backup {} with its range ({} keys, {} values) at record {}",
               shard_id_, backup, slice->keys.size(), table_->values(), record_);
}

void ShardCore::UpdateDurable() {
  if (backups_.empty()) {
    for (const auto& [worker, seq] : applied_marks_) durable_[worker] = seq;
    metrics_.lag->Set(0);
    metrics_.lag_seconds->Set(0);
    return;
  }
  const uint64_t held = durable_record();
  while (!durable_hold_ && !unacked_.empty() && unacked_.front().record <= held) {
    for (const auto& [worker, seq] : unacked_.front().marks) {
      uint64_t& d = durable_[worker];
      d = std::max(d, seq);
    }
    unacked_.pop_front();
  }
  metrics_.lag->Set(static_cast<double>(record_ - held));
}

void ShardCore::OnReplicateReply(const Decoded& d) {
  const msg::ReplicateReply m = msg::Read<msg::ReplicateReply>(d);
  auto link = backups_.find(d.env.sender);
  if (m.range != shard_id_ || link == backups_.end()) return;  // an old set's
  if (m.need_seed) {
    // It missed a record or lost its replica (restarted): once per seed.
    if (m.record > link->second.seed_record || !link->second.seeded) {
      spdlog::warn("shard {}: backup {} lacks records before {}; seeding it again", shard_id_,
                   d.env.sender, m.record);
      link->second.seeded = false;
      link->second.retry_at = clock_->Now();
    }
    return;
  }
  link->second.acked = std::max(link->second.acked, m.record);
  UpdateBehind(link->second);
  UpdateDurable();
}

void ShardCore::UpdateBehind(BackupLink& link) {
  if (link.acked >= record_) {
    link.behind_since = TimePoint::max();
    return;
  }
  // Owes the first record after what it holds: since that one left.
  for (const UnackedRecord& u : unacked_) {
    if (u.record > link.acked) {
      link.behind_since = u.sent;
      return;
    }
  }
}

std::vector<uint32_t> ShardCore::lagging_backups() const {
  std::vector<uint32_t> lagging;
  const TimePoint now = clock_->Now();
  for (const auto& [id, link] : backups_) {
    if (link.behind_since != TimePoint::max() && now - link.behind_since > kBackupLagLimit) {
      lagging.push_back(id);
    }
  }
  return lagging;
}

double ShardCore::replication_lag_seconds() const {
  TimePoint oldest = TimePoint::max();
  for (const auto& [id, link] : backups_) oldest = std::min(oldest, link.behind_since);
  return oldest == TimePoint::max() ? 0.0 : ToSeconds(clock_->Now() - oldest);
}

void ShardCore::OnBackupError(const Decoded& d) {
  auto link = backups_.find(d.env.sender);
  if (link == backups_.end()) return;
  const msg::Error e = msg::Read<msg::Error>(d);
  spdlog::warn("shard {}: backup {} refused a record: {}; seeding it again in {} ms", shard_id_,
               d.env.sender, e.reason,
               std::chrono::duration_cast<std::chrono::milliseconds>(kReseedAfter).count());
  link->second.seeded = false;
  link->second.retry_at = clock_->Now() + kReseedAfter;
}

void ShardCore::OnReplicate(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Replicate m = msg::Read<msg::Replicate>(d);
  auto backed = backing_.find(m.range);
  if (backed == backing_.end() || d.env.sender != m.range) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "shard " + std::to_string(shard_id_) + " does not back up shard " +
                          std::to_string(m.range) + "'s range (not told so by the monitor)",
                      out);
  }
  if (!peer.peer_key().empty() && peer.peer_key() != backed->second.public_key) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused,
                      "records of shard " + std::to_string(m.range) + " come with its key", out);
  }
  Replica& r = replicas_[m.range];
  const uint64_t floor = std::max(backed->second.epoch, r.table ? r.epoch : 0);
  if (m.epoch < floor) {
    return ReplyError(peer, d.env, wire::ErrorCode::Stale,
                      "epoch " + std::to_string(m.epoch) + " of shard " + std::to_string(m.range) +
                          "'s range is older than " + std::to_string(floor),
                      out);
  }
  std::span<const float> values = d.floats();
  const auto reply = [&](uint64_t record, bool need_seed) {
    out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env),
                                        msg::ReplicateReply{m.range, record, need_seed})});
  };
  if (m.seed) {
    const msg::MoveData& seed = *m.seed;
    TableConfig config = job_.optimizer;
    config.groups = seed.param_groups;
    std::string why;
    if (seed.optimizer != config.kind) {
      why = "a seed with " + std::string(OptimizerName(seed.optimizer)) + " state; this job runs " +
            std::string(OptimizerName(config.kind));
    } else if (seed.groups.size() != seed.keys.size() ||
               seed.key_steps.size() != seed.keys.size()) {
      why = "a seed names each key's group and steps";
    } else if (absl::Status st = ParamTable::ValidateConfig(config); !st.ok()) {
      why = std::string(st.message());
    }
    auto table = why.empty() ? std::make_unique<ParamTable>(config) : nullptr;
    if (table && seed.state_slots != table->state_slots()) {
      why = "a seed with " + std::to_string(seed.state_slots) + " state slot(s), not " +
            std::to_string(table->state_slots());
    }
    if (table && why.empty()) {
      if (absl::Status st = table->Insert(SliceOf(seed, values)); !st.ok()) {
        why = std::string(st.message());
      }
    }
    if (!why.empty()) {
      replicas_.erase(m.range);
      return ReplyError(peer, d.env, wire::ErrorCode::BadLength, why, out);
    }
    r.table = std::move(table);
    r.epoch = m.epoch;
    r.record = m.record;
    r.marks.clear();
    r.marks.insert(m.marks.begin(), m.marks.end());
    r.ledger.Assign(m.ledger, m.doubles);
    r.last = m.last;
    r.applied_clock = m.applied_clock;
    r.steps = m.step_count;
    metrics_.replicas->Set(static_cast<double>(replicas_.size()));
    spdlog::info("shard {}: holds a replica of shard {}'s range ({} keys, {} values) from record "
                 "{}, epoch {}",
                 shard_id_, m.range, r.table->key_count(), r.table->values(), m.record, m.epoch);
    return reply(r.record, false);
  }
  if (r.table && m.record <= r.record && m.epoch == r.epoch) {
    return reply(r.record, false);  // held already (a repeat)
  }
  if (!r.table || m.record != r.record + 1 || m.epoch != r.epoch) {
    return reply(m.record, true);
  }
  // Every check before any step, so that a bad record changes nothing.
  ParamTable& table = *r.table;
  std::vector<StepRecord> steps(m.steps.size());
  size_t offset = 0;
  std::string why;
  for (size_t i = 0; i < m.steps.size() && why.empty(); ++i) {
    const msg::ReplicaStep& s = m.steps[i];
    size_t want = 0;
    if (s.keys.empty()) {
      want = table.values();
    } else {
      uint64_t previous = 0;
      for (size_t k = 0; k < s.keys.size() && why.empty(); ++k) {
        const ParamTable::Slot* slot = table.Find(s.keys[k].key());
        if (slot == nullptr || slot->length != s.keys[k].length() ||
            (k > 0 && s.keys[k].key() <= previous)) {
          why = "step " + std::to_string(i) + " names key " + std::to_string(s.keys[k].key()) +
                " that the replica does not hold so";
        }
        previous = s.keys[k].key();
        want += s.keys[k].length();
      }
    }
    if (!why.empty()) break;
    if (s.assign) want *= 1 + table.state_slots();  // the keys' state, not a gradient
    if (s.values != want || offset + want > values.size()) {
      why = "step " + std::to_string(i) + " carries " + std::to_string(s.values) +
            " values, its keys take " + std::to_string(want);
    } else if (s.assign) {
      const size_t keys = s.keys.empty() ? table.key_count() : s.keys.size();
      if (s.key_steps.size() != keys) {
        why = "step " + std::to_string(i) + " sets the state of " + std::to_string(keys) +
              " keys with " + std::to_string(s.key_steps.size()) + " step counts";
      }
    } else if (s.lr.size() != table.groups()) {
      why = "step " + std::to_string(i) + " has " + std::to_string(s.lr.size()) +
            " learning rates for " + std::to_string(table.groups()) + " groups";
    } else if (!(s.fraction > 0.0f && s.fraction <= 1.0f)) {
      why = "step " + std::to_string(i) + " is a fraction " + std::to_string(s.fraction) +
            " of a step, outside (0, 1]";
    }
    steps[i].grad = {s.keys, values.subspan(offset, want), /*at_offsets=*/s.keys.empty()};
    steps[i].grad_scale = s.grad_scale;
    steps[i].lr = s.lr;
    steps[i].fraction = s.fraction;
    offset += want;
  }
  if (why.empty() && offset != values.size()) {
    why = "the steps take " + std::to_string(offset) + " of the " + std::to_string(values.size()) +
          " values sent";
  }
  if (!why.empty()) {
    replicas_.erase(m.range);  // out of step with its primary: seeded afresh
    metrics_.replicas->Set(static_cast<double>(replicas_.size()));
    return ReplyError(peer, d.env, wire::ErrorCode::BadLength, why, out);
  }
  for (size_t i = 0; i < steps.size(); ++i) {
    if (m.steps[i].assign) {
      table.Assign(steps[i].grad.keys, steps[i].grad.values, m.steps[i].key_steps);
    } else {
      table.Step(steps[i]);
    }
  }
  r.record = m.record;
  for (const auto& [worker, seq] : m.marks) r.marks[worker] = std::max(r.marks[worker], seq);
  for (const auto& [worker, seq] : m.applied) r.ledger.Add(worker, seq);
  r.last = m.last;
  r.applied_clock = m.applied_clock;
  r.steps = m.step_count;
  if (m.check_end > m.check_begin) {
    ++replica_checks_;
    metrics_.checks->Increment();
    if (const uint32_t crc = table.Crc(m.check_begin, m.check_end); crc != m.check) {
      ++replica_mismatches_;
      metrics_.mismatches->Increment();
      spdlog::error("shard {}: the replica of shard {}'s range differs from its primary in keys "
                    "[{}, {}) after record {} (CRC-32 {:08x}, primary's {:08x})",
                    shard_id_, m.range, m.check_begin, m.check_end, m.record, crc, m.check);
    }
  }
  reply(r.record, false);
}

}  // namespace pacer

namespace pacer {

std::map<uint32_t, uint64_t> ShardCore::replica_epochs() const {
  std::map<uint32_t, uint64_t> held;
  for (const auto& [range, r] : replicas_) {
    if (r.table) held[range] = r.epoch;
  }
  return held;
}

std::optional<ShardSnapshot> ShardCore::ReplicaSnapshot(uint32_t range) const {
  auto it = replicas_.find(range);
  if (it == replicas_.end() || !it->second.table) return std::nullopt;
  const Replica& r = it->second;
  ShardSnapshot s;
  s.job_id = job_.job_id;
  s.shard_id = range;
  s.map_version = map_version_;
  s.applied_clock = r.applied_clock;
  s.steps = r.steps;
  s.table = r.table->Snapshot();
  // Each worker pushed at least through the applied clock; its pushes past
  // it come again from the worker (kept until durable).
  for (const auto& [worker, seq] : r.marks) s.workers[worker] = {r.applied_clock, seq};
  s.ledger = r.ledger.Spans();
  s.ledger_doubles = r.ledger.doubles();
  return s;
}

}  // namespace pacer
