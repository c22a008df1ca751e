#include "ps/replica_holder.h"

#include <algorithm>
#include <limits>

#include "spdlog/spdlog.h"

namespace pacer {

void ReplicaHolder::SetBacking(std::map<uint32_t, BackedRange> ranges) {
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
  metrics_->replicas->Set(static_cast<double>(replicas_.size()));
}

const std::string* ReplicaHolder::PrimaryKey(uint32_t id) const {
  auto it = backing_.find(id);
  return it == backing_.end() ? nullptr : &it->second.public_key;
}

std::map<uint32_t, uint64_t> ReplicaHolder::records() const {
  std::map<uint32_t, uint64_t> held;
  for (const auto& [range, r] : replicas_) held[range] = r.record;
  return held;
}

std::map<uint32_t, uint64_t> ReplicaHolder::epochs() const {
  std::map<uint32_t, uint64_t> held;
  for (const auto& [range, r] : replicas_) {
    if (r.table) held[range] = r.epoch;
  }
  return held;
}

const ParamTable* ReplicaHolder::table(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? nullptr : it->second.table.get();
}

uint64_t ReplicaHolder::record(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? 0 : it->second.record;
}

std::map<uint32_t, uint64_t> ReplicaHolder::marks(uint32_t range) const {
  auto it = replicas_.find(range);
  return it == replicas_.end() ? std::map<uint32_t, uint64_t>{} : it->second.marks;
}

bool ReplicaHolder::final() const {
  for (const auto& [range, r] : replicas_) {
    if (r.table && !r.last) return false;
  }
  return true;
}

std::map<uint32_t, ReplicaHolder::View> ReplicaHolder::views() const {
  std::map<uint32_t, View> views;
  for (const auto& [range, r] : replicas_) {
    if (!r.table) continue;
    views[range] = {r.epoch, r.record, r.last, r.table->Crc(0, std::numeric_limits<uint64_t>::max()),
                    &r.ledger};
  }
  return views;
}

std::optional<ShardSnapshot> ReplicaHolder::Snapshot(uint32_t range, uint64_t job_id,
                                                     uint64_t map_version) const {
  auto it = replicas_.find(range);
  if (it == replicas_.end() || !it->second.table) return std::nullopt;
  const Replica& r = it->second;
  ShardSnapshot s;
  s.job_id = job_id;
  s.shard_id = range;
  s.map_version = map_version;
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

void ReplicaHolder::OnReplicate(const Frame& peer, const Decoded& d,
                                std::vector<ShardOutgoing>* out) {
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
  const auto reply = [&](uint64_t record, bool need_seed) {
    out->push_back({peer, EncodeMessage(server_->ReplyEnvelope(d.env),
                                        msg::ReplicateReply{m.range, record, need_seed})});
  };
  if (m.seed) {
    if (const std::string why = TakeSeed(m, d.floats(), &r); !why.empty()) {
      replicas_.erase(m.range);
      return ReplyError(peer, d.env, wire::ErrorCode::BadLength, why, out);
    }
    metrics_->replicas->Set(static_cast<double>(replicas_.size()));
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
  if (const std::string why = TakeRecord(m, d.floats(), &r); !why.empty()) {
    replicas_.erase(m.range);  // out of step with its primary: seeded afresh
    metrics_->replicas->Set(static_cast<double>(replicas_.size()));
    return ReplyError(peer, d.env, wire::ErrorCode::BadLength, why, out);
  }
  reply(r.record, false);
}

std::string ReplicaHolder::TakeSeed(const msg::Replicate& m, std::span<const float> values,
                                    Replica* r) {
  const msg::MoveData& seed = *m.seed;
  TableConfig config = optimizer_;
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
  if (!why.empty()) return why;
  r->table = std::move(table);
  r->epoch = m.epoch;
  r->record = m.record;
  r->marks.clear();
  r->marks.insert(m.marks.begin(), m.marks.end());
  r->ledger.Assign(m.ledger, m.doubles);
  r->last = m.last;
  r->applied_clock = m.applied_clock;
  r->steps = m.step_count;
  return "";
}

std::string ReplicaHolder::TakeRecord(const msg::Replicate& m, std::span<const float> values,
                                      Replica* r) {
  // Every check before any step, so that a bad record changes nothing.
  ParamTable& table = *r->table;
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
  if (!why.empty()) return why;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (m.steps[i].assign) {
      table.Assign(steps[i].grad.keys, steps[i].grad.values, m.steps[i].key_steps);
    } else {
      table.Step(steps[i]);
    }
  }
  r->record = m.record;
  for (const auto& [worker, seq] : m.marks) r->marks[worker] = std::max(r->marks[worker], seq);
  for (const auto& [worker, seq] : m.applied) r->ledger.Add(worker, seq);
  r->last = m.last;
  r->applied_clock = m.applied_clock;
  r->steps = m.step_count;
  if (m.check_end > m.check_begin) {
    ++checks_;
    metrics_->checks->Increment();
    if (const uint32_t crc = table.Crc(m.check_begin, m.check_end); crc != m.check) {
      ++mismatches_;
      metrics_->mismatches->Increment();
      spdlog::error("shard {}: the replica of shard {}'s range differs from its primary in keys "
                    "[{}, {}) after record {} (CRC-32 {:08x}, primary's {:08x})",
                    shard_id_, m.range, m.check_begin, m.check_end, m.record, crc, m.check);
    }
  }
  return "";
}

}  // namespace pacer
