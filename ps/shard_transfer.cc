// ShardCore's range transfer (elastic shards, ps/shard.h): a key range
// copied out to its new owner (MoveOut), taken in (MoveData), and dropped
// once the new owner has it (MoveOut with drop); each only while no clock is
// open. The monitor sequences the steps (monitor/key_move.h).
#include <algorithm>

#include "ps/shard.h"
#include "spdlog/spdlog.h"

namespace pacer {

void ShardCore::OnMoveOut(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  if (d.env.sender != 0) {
    return ReplyError(peer, d.env, wire::ErrorCode::Refused, "only the monitor moves keys", out);
  }
  if (!open_.empty() || !range_.initialized) {
    return ReplyError(peer, d.env, wire::ErrorCode::NotReady,
                      "a clock is still open (the workers must be held first)", out);
  }
  const msg::MoveOut m = msg::Read<msg::MoveOut>(d);
  if (m.drop) return DropKeys(peer, d, m.key_begin, m.key_end, out);
  // A copy: the keys stay here until the monitor says drop (after the new
  // owner has them). The payload: their parameters, then each state slot.
  auto slice = std::make_shared<TableSlice>(range_.table->Extract(m.key_begin, m.key_end));
  const msg::MoveData data = MoveDataOf(*range_.table, *slice, range_.applied_clock, range_.steps);
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

void ShardCore::DropKeys(const Frame& peer, const Decoded& d, uint64_t begin, uint64_t end,
                         std::vector<Outgoing>* out) {
  // The Ack first (the repeat cache keeps the first reply), then any
  // parked pull that can no longer be answered here.
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  move_ok_ = true;
  const size_t dropped = range_.table->Drop(begin, end);
  if (dropped > 0) {
    LayoutChanged();
    // Parked pulls that name a key gone from here: the reader must ask the new owner.
    for (auto it = parked_.begin(); it != parked_.end();) {
      const bool gone = std::any_of(it->keys.begin(), it->keys.end(), [&](const wire::KeyLen& k) {
        return range_.table->Find(k.key()) == nullptr;
      });
      if (gone) {
        ReplyError(it->peer, it->env, wire::ErrorCode::NotOwner, "keys moved to another shard", out);
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
    spdlog::info("shard {}: dropped {} keys in [{}, {}) (moved); {} keys left", shard_id_, dropped,
                 begin, end, range_.table->key_count());
  }
}

void ShardCore::LayoutChanged() {
  range_.LayoutChanged();
  // The backups' replicas no longer have this layout: seeded afresh.
  primary_.LayoutChanged();
  ++key_version_;
  for (auto& [id, member] : live_) {
    member.staged.reset();  // may name keys gone, at old offsets
    member.staging.clear();
  }
  metrics_.keys->Set(static_cast<double>(range_.table->key_count()));
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
  if (m.optimizer != range_.table->config().kind) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "keys with " + std::string(OptimizerName(m.optimizer)) +
                          " state; this shard runs " +
                          std::string(OptimizerName(range_.table->config().kind)),
                      out);
  }
  if (m.groups.size() != m.keys.size() || m.key_steps.size() != m.keys.size()) {
    return ReplyError(peer, d.env, wire::ErrorCode::BadLength,
                      "a move names each key's group and steps", out);
  }
  // A shard that holds no keys yet (added idle) takes the model's groups.
  if (range_.table->empty() && range_.table->config().groups != m.param_groups) {
    if (absl::Status st = range_.table->SetGroups(m.param_groups); !st.ok()) {
      return ReplyError(peer, d.env, wire::ErrorCode::Mismatch, std::string(st.message()), out);
    }
  }
  if (m.state_slots != range_.table->state_slots()) {
    return ReplyError(peer, d.env, wire::ErrorCode::Mismatch,
                      "keys with " + std::to_string(m.state_slots) + " state slot(s); this shard keeps " +
                          std::to_string(range_.table->state_slots()),
                      out);
  }
  const TableSlice slice = SliceOf(m, d.floats());
  size_t incoming = 0;
  for (const TableKey& k : slice.keys) incoming += k.length;
  if (absl::Status st = range_.table->Insert(slice); !st.ok()) {
    const bool here = range_.table->Find(m.keys.empty() ? 0 : m.keys[0].key()) != nullptr;
    return ReplyError(peer, d.env, here ? wire::ErrorCode::Mismatch : wire::ErrorCode::BadLength,
                      std::string(st.message()), out);
  }
  LayoutChanged();
  if (!range_.initialized || range_.applied_clock < m.applied_clock) {
    range_.applied_clock = m.applied_clock;
    range_.steps = std::max(range_.steps, m.steps);
    metrics_.clock->Set(static_cast<double>(range_.applied_clock));
  }
  range_.initialized = true;
  spdlog::info("shard {}: moved in {} keys ({} values) at applied clock {}", shard_id_,
               m.keys.size(), incoming, range_.applied_clock);
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env), msg::Ack{})});
  move_ok_ = true;
  Advance(out);
}

}  // namespace pacer
