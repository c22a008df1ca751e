#include "ps/range_replicator.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <tuple>

#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// A check window holds about this many values of the parameters (the state
// slots as many again each).
constexpr size_t kCheckWindowValues = size_t{1} << 16;
// A backup that refused a record is seeded again this long after.
constexpr Duration kReseedAfter = std::chrono::milliseconds(200);

}  // namespace

Envelope RangeReplicator::RequestEnvelope() const {
  Envelope env;
  env.job_id = job_id_;
  env.sender = shard_id_;
  env.request_id = NewRequestId();
  return env;
}

void RangeReplicator::SetReplicaSet(uint64_t epoch, std::vector<uint32_t> backups,
                                    std::vector<ShardOutgoing>* out) {
  std::sort(backups.begin(), backups.end());
  backups.erase(std::unique(backups.begin(), backups.end()), backups.end());
  std::erase(backups, shard_id_);
  const bool new_epoch = epoch != epoch_;
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
  epoch_ = epoch;
  backups_ = std::move(links);
  metrics_->backups->Set(static_cast<double>(backups_.size()));
  if (backups_.empty()) {
    ClearBatch();
    values_.reset();
    sent_values_.clear();
    lent_.reset();
    unacked_.clear();
  }
  for (auto& [id, link] : backups_) {
    if (!link.seeded && range_->initialized) SendSeed(id, out);
  }
  UpdateDurable();
}

uint64_t RangeReplicator::durable_seq(uint32_t worker) const {
  auto it = durable_.find(worker);
  return it == durable_.end() ? 0 : it->second;
}

uint64_t RangeReplicator::backup_acked(uint32_t id) const {
  auto it = backups_.find(id);
  return it == backups_.end() ? 0 : it->second.acked;
}

uint64_t RangeReplicator::durable_record() const {
  uint64_t held = record_;
  for (const auto& [id, link] : backups_) held = std::min(held, link.acked);
  return held;
}

void RangeReplicator::NoteApplied(uint32_t worker, uint64_t seq) {
  if (seq == 0) return;
  ledger_.Add(worker, seq);
  if (!backups_.empty()) {
    applied_.emplace_back(worker, seq);
    first_ = std::min(first_, clock_->Now());
  }
  uint64_t& mark = applied_marks_[worker];
  if (seq <= mark) return;
  mark = seq;
  if (backups_.empty() || !options_.safeguards.On(Safeguard::kDurableWait)) {
    durable_[worker] = seq;  // nothing to wait for (--replicas 0, or no backup left)
    return;
  }
  marks_[worker] = seq;
  first_ = std::min(first_, clock_->Now());
}

void RangeReplicator::NoteAssignKeys(std::span<const wire::KeyLen> keys) {
  if (keys.empty()) assign_all_ = true;
  if (assign_all_) return;
  for (const wire::KeyLen& k : keys) assign_keys_.push_back(k.key());
}

bool RangeReplicator::BatchFull() const {
  return batch_steps_ >= kReplicaBatchSteps || (values_ && values_->size() >= kReplicaBatchValues);
}

void RangeReplicator::ReplicateStep(const StepRecord& step,
                                    std::shared_ptr<std::vector<float>> lent) {
  if (backups_.empty()) return;
  const ParamTable& table = *range_->table;
  ++batch_steps_;
  first_ = std::min(first_, clock_->Now());
  if (assign_) {
    // The record will carry these keys' state as SendRecord finds it.
    NoteAssignKeys(step.grad.keys);
    range_->Recycle(std::move(lent));
    return;
  }
  msg::ReplicaStep rs;
  rs.keys.assign(step.grad.keys.begin(), step.grad.keys.end());
  rs.grad_scale = step.grad_scale;
  rs.lr = step.lr;
  rs.fraction = step.fraction;
  rs.values = step.grad.values.size();
  if (lent && steps_.empty()) {
    lent_ = std::move(lent);  // the step's accumulator goes out as it is
  } else {
    if (!values_) values_ = TakeRecordBuffer();
    std::vector<float>& values = *values_;
    if (lent_) {
      values.assign(lent_->begin(), lent_->end());
      range_->Recycle(std::move(lent_));
    }
    if (step.grad.at_offsets && !step.grad.keys.empty()) {
      // Values at table offsets (a push assembled from parts): the record
      // carries them in key order.
      rs.values = 0;
      for (const wire::KeyLen& k : step.grad.keys) {
        const ParamTable::Slot* slot = table.Find(k.key());
        const float* src = step.grad.values.data() + slot->offset;
        values.insert(values.end(), src, src + k.length());
        rs.values += k.length();
      }
    } else {
      values.insert(values.end(), step.grad.values.begin(), step.grad.values.end());
    }
    range_->Recycle(std::move(lent));  // copied: the next clock's, zeroed
  }
  steps_.push_back(std::move(rs));
  // Gradients past the state they change (asp: a few pushes of a range):
  // the record carries the state instead, read when it goes out; the
  // gradients copied so far are let go.
  const size_t state_values = (1 + table.state_slots()) * table.values();
  if (steps_.size() > 1 && values_ && values_->size() > state_values) {
    assign_ = true;
    for (const msg::ReplicaStep& s : steps_) NoteAssignKeys(s.keys);
    steps_.clear();
    values_->clear();
  }
}

std::shared_ptr<std::vector<float>> RangeReplicator::TakeRecordBuffer() {
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

std::pair<uint64_t, uint64_t> RangeReplicator::NextCheckWindow() {
  const auto& slots = range_->table->slots();
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

void RangeReplicator::Flush(std::vector<ShardOutgoing>* out) {
  if (backups_.empty() || (batch_steps_ == 0 && marks_.empty() && applied_.empty())) return;
  SendRecord(false, out);
}

bool RangeReplicator::SendLast(std::vector<ShardOutgoing>* out) {
  if (backups_.empty()) return false;
  SendRecord(true, out);
  return true;
}

void RangeReplicator::SetDurableHold(bool hold) {
  if (hold == durable_hold_) return;
  durable_hold_ = hold;
  spdlog::info("shard {}: {}", shard_id_,
               hold ? "durability held where it is (a dropped backup stands by)"
                    : "durability goes on (no standby any more)");
  UpdateDurable();
}

void RangeReplicator::SendRecord(bool last, std::vector<ShardOutgoing>* out) {
  ParamTable& table = *range_->table;
  msg::Replicate rec;
  rec.range = shard_id_;
  rec.epoch = epoch_;
  rec.record = ++record_;
  if (assign_) {
    // The state the batch's steps left in the keys they changed (those
    // still here: a layout change since seeds every backup afresh).
    msg::ReplicaStep rs;
    rs.assign = true;
    if (!assign_all_) {
      std::sort(assign_keys_.begin(), assign_keys_.end());
      assign_keys_.erase(std::unique(assign_keys_.begin(), assign_keys_.end()),
                         assign_keys_.end());
      for (uint64_t key : assign_keys_) {
        if (const ParamTable::Slot* slot = table.Find(key)) rs.keys.emplace_back(key, slot->length);
      }
      if (rs.keys.size() == table.key_count()) rs.keys.clear();  // every key
    }
    if (!values_) values_ = TakeRecordBuffer();
    table.Read(rs.keys, values_.get(), &rs.key_steps);
    rs.values = values_->size();
    steps_.assign(1, std::move(rs));
  }
  rec.steps = std::move(steps_);
  rec.marks.assign(marks_.begin(), marks_.end());
  rec.applied = std::move(applied_);
  rec.last = last;
  rec.applied_clock = range_->applied_clock;
  rec.step_count = range_->steps;
  if (record_ % kReplicaCheckEvery == 0) {
    std::tie(rec.check_begin, rec.check_end) = NextCheckWindow();
    rec.check = table.Crc(rec.check_begin, rec.check_end);
  }
  Frame payload;
  if (lent_) {
    payload = Frame(lent_, lent_->data(), lent_->size() * sizeof(float));
    range_->lent_acc.push_back(std::move(lent_));
  } else if (values_ && !values_->empty()) {
    payload = Frame(values_, values_->data(), values_->size() * sizeof(float));
    // Kept to be used again (TakeRecordBuffer): a few at most, and none
    // much past a batch's bound (one push of a big range may be larger).
    if (sent_values_.size() < kRecordBuffers && values_->capacity() <= 2 * kReplicaBatchValues) {
      sent_values_.push_back(values_);
    }
  }
  values_.reset();
  const double bytes = static_cast<double>(payload.size());
  const Envelope env = RequestEnvelope();
  Frames frames = EncodeMessage(env, rec, std::move(payload), options_.check_crc);
  const TimePoint now = clock_->Now();
  for (auto& [id, link] : backups_) {
    if (!link.seeded) continue;  // its seed will hold this record's state
    out->push_back({Frame(), frames, id});
    metrics_->record_bytes->Increment(bytes);
    if (link.behind_since == TimePoint::max()) link.behind_since = now;
  }
  unacked_.push_back({record_, std::move(rec.marks), now});
  metrics_->records->Increment();
  ClearBatch();
  UpdateDurable();
}

void RangeReplicator::ClearBatch() {
  steps_.clear();
  batch_steps_ = 0;
  assign_ = assign_all_ = false;
  assign_keys_.clear();
  marks_.clear();
  applied_.clear();
  first_ = TimePoint::max();
}

void RangeReplicator::SendSeed(uint32_t backup, std::vector<ShardOutgoing>* out) {
  auto link = backups_.find(backup);
  if (link == backups_.end() || !range_->initialized) return;
  Flush(out);  // the seed stands for the state after the last record
  const ParamTable& table = *range_->table;
  auto slice = std::make_shared<TableSlice>(table.Extract(0, std::numeric_limits<uint64_t>::max()));
  msg::Replicate rec;
  rec.range = shard_id_;
  rec.epoch = epoch_;
  rec.record = record_;
  rec.seed = MoveDataOf(table, *slice, range_->applied_clock, range_->steps);
  rec.marks.assign(applied_marks_.begin(), applied_marks_.end());
  rec.ledger = ledger_.Spans();
  rec.doubles = ledger_.doubles();
  rec.applied_clock = range_->applied_clock;
  rec.step_count = range_->steps;
  Frame payload;
  if (!slice->values.empty()) {
    payload = Frame(slice, slice->values.data(), slice->values.size() * sizeof(float));
  }
  metrics_->seed_bytes->Increment(static_cast<double>(slice->values.size() * sizeof(float)));
  out->push_back({Frame(),
                  EncodeMessage(RequestEnvelope(), rec, std::move(payload), options_.check_crc),
                  backup});
  link->second.seeded = true;
  link->second.seed_record = record_;
  if (link->second.behind_since == TimePoint::max()) link->second.behind_since = clock_->Now();
  metrics_->seeds->Increment();
  spdlog::info("shard {}: seeding backup {} with its range ({} keys, {} values) at record {}",
               shard_id_, backup, slice->keys.size(), table.values(), record_);
}

void RangeReplicator::UpdateDurable() {
  if (backups_.empty()) {
    for (const auto& [worker, seq] : applied_marks_) durable_[worker] = seq;
    metrics_->lag->Set(0);
    metrics_->lag_seconds->Set(0);
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
  metrics_->lag->Set(static_cast<double>(record_ - held));
}

void RangeReplicator::OnReply(const Decoded& d) {
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

void RangeReplicator::UpdateBehind(BackupLink& link) {
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

std::vector<uint32_t> RangeReplicator::lagging_backups() const {
  std::vector<uint32_t> lagging;
  const TimePoint now = clock_->Now();
  for (const auto& [id, link] : backups_) {
    if (link.behind_since != TimePoint::max() && now - link.behind_since > kBackupLagLimit) {
      lagging.push_back(id);
    }
  }
  return lagging;
}

double RangeReplicator::lag_seconds() const {
  TimePoint oldest = TimePoint::max();
  for (const auto& [id, link] : backups_) oldest = std::min(oldest, link.behind_since);
  return oldest == TimePoint::max() ? 0.0 : ToSeconds(clock_->Now() - oldest);
}

void RangeReplicator::OnBackupError(const Decoded& d) {
  auto link = backups_.find(d.env.sender);
  if (link == backups_.end()) return;
  const msg::Error e = msg::Read<msg::Error>(d);
  spdlog::warn("shard {}: backup {} refused a record: {}; seeding it again in {} ms", shard_id_,
               d.env.sender, e.reason,
               std::chrono::duration_cast<std::chrono::milliseconds>(kReseedAfter).count());
  link->second.seeded = false;
  link->second.retry_at = clock_->Now() + kReseedAfter;
}

void RangeReplicator::Tick(TimePoint now, std::vector<ShardOutgoing>* out) {
  if (!backups_.empty()) metrics_->lag_seconds->Set(lag_seconds());
  // Asp's batch once it waited long enough, and seeds due.
  if (first_ != TimePoint::max() && now - first_ >= kReplicaBatchDelay) Flush(out);
  for (auto& [id, link] : backups_) {
    if (!link.seeded && range_->initialized && now >= link.retry_at) SendSeed(id, out);
  }
}

TimePoint RangeReplicator::NextDeadline() const {
  TimePoint t = TimePoint::max();
  if (first_ != TimePoint::max()) t = std::min(t, first_ + kReplicaBatchDelay);
  for (const auto& [id, link] : backups_) {
    if (!link.seeded && range_->initialized) t = std::min(t, link.retry_at);
  }
  return t;
}

void RangeReplicator::LayoutChanged() {
  for (auto& [id, link] : backups_) link.seeded = false;
}

void RangeReplicator::Restore(const ShardSnapshot& s) {
  for (const auto& [worker, mark] : s.workers) {
    if (mark.seq > 0) applied_marks_[worker] = std::max(applied_marks_[worker], mark.seq);
  }
  ledger_.Assign(s.ledger, s.ledger_doubles);
}

}  // namespace pacer
