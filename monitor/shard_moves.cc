#include "monitor/shard_moves.h"

#include <cstdint>

#include "spdlog/spdlog.h"

namespace pacer {

uint64_t ShardMoves::ValuesIn(uint64_t begin, uint64_t end) const {
  uint64_t n = 0;
  for (const auto& k : model_->keys()) {
    if (k.key() >= begin && k.key() < end) n += k.length();
  }
  return n;
}

std::optional<std::string> ShardMoves::Request(wire::ShardOp op, uint32_t shard_id) {
  if (moving()) return "a shard move is already in progress";
  const RangeTable& ranges = *ranges_;
  const ShardRegistry& shards = *shards_;
  const auto idx = shards.Index(shard_id);
  if (!idx) return "no shard " + std::to_string(shard_id);
  const size_t target = *idx;
  auto bytes_of = [&](size_t i) { return ValuesIn(ranges[i].begin, ranges[i].end); };
  size_t move_from = 0, move_to = 0;
  uint64_t key_begin = 0, key_end = 0;
  if (op == wire::ShardOp::Add) {
    if (ranges.HoldsKeys(target) || shards[target].drained || shards[target].down) {
      return "shard " + std::to_string(shard_id) + " is not an idle, live shard";
    }
    size_t from = SIZE_MAX;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (ranges.HoldsKeys(i) && (from == SIZE_MAX || bytes_of(i) > bytes_of(from))) from = i;
    }
    if (from == SIZE_MAX) return "no shard holds keys";
    // Split the largest range where half its bytes lie on each side.
    std::vector<wire::KeyLen> keys;
    for (const auto& k : model_->keys()) {
      if (k.key() >= ranges[from].begin && k.key() < ranges[from].end) keys.push_back(k);
    }
    if (keys.size() < 2) return "the largest range has a single key; nothing to split";
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
    key_end = ranges[from].end;
  } else {
    if (!ranges.HoldsKeys(target)) return "shard " + std::to_string(shard_id) + " holds no keys";
    // With backups: the primary hands its range to a backup first (it
    // stops applying, its backups take all it applied, one is promoted at
    // once), so nothing moves and no worker waits for a lease.
    if (replication_->CanHandOff(target)) {
      replication_->StartHandoff(target);
      return std::nullopt;
    }
    size_t to = SIZE_MAX;
    for (size_t i = 0; i < ranges.size(); ++i) {
      if (i != target && ranges.HoldsKeys(i) && ranges[i].end == ranges[target].begin) to = i;
    }
    for (size_t i = 0; i < ranges.size() && to == SIZE_MAX; ++i) {
      if (i != target && ranges.HoldsKeys(i) && ranges[i].begin == ranges[target].end) to = i;
    }
    if (to == SIZE_MAX) return "no other shard can take the range: add one first";
    move_from = target;
    move_to = to;
    key_begin = ranges[target].begin;
    key_end = ranges[target].end;
  }
  if (shards[move_from].down || shards[move_to].down) {
    return "shard " + std::to_string(shards[shards[move_from].down ? move_from : move_to].id) +
           " is down";
  }
  const uint64_t moving_values = ValuesIn(key_begin, key_end);
  const size_t buffers = 1 + model_->StateSlots();
  if (buffers * moving_values * sizeof(float) + 65536 > options_.max_message_bytes) {
    return "the range holds " + std::to_string(moving_values) +
           " values; moving them with their optimizer state (" + std::to_string(buffers) +
           " floats each) needs more than --max-message-bytes";
  }
  move_.emplace(move_from, move_to, key_begin, key_end, options_.job_id, clock_->Now());
  op_ = op;
  members_->Hold();
  spdlog::info("{} shard {}: keys [{}, {}) move from shard {} to shard {}; workers held at clock {}",
               op == wire::ShardOp::Add ? "adding" : "draining", shard_id, key_begin, key_end,
               shards[move_from].id, shards[move_to].id, members_->pause_at());
  return std::nullopt;
}

void ShardMoves::Step(std::vector<MonitorOutgoing>* out) {
  if (!move_) return;
  const TimePoint now = clock_->Now();
  if (move_->stage() == KeyMove::Stage::kHolding) {
    // Every live worker held at the pause clock, every shard caught up with
    // it: no clock is open anywhere.
    const uint64_t pause_at = members_->pause_at();
    for (uint32_t id : members_->LiveWorkers()) {
      const WorkerState& w = members_->at(id);
      if (!w.paused || w.clock != pause_at) return;
    }
    for (size_t i = 0; i < shards_->size(); ++i) {
      if (!ranges_->HoldsKeys(i) || (*shards_)[i].drained) continue;
      if ((*shards_)[i].reported_applied < static_cast<int64_t>(pause_at) - 1) return;
    }
    KeyMove::Request r = move_->Start(now);
    out->push_back({Frame(), static_cast<int>(r.shard), std::move(r.frames)});
    return;
  }
  if (auto r = move_->Resend(now)) {
    out->push_back({Frame(), static_cast<int>(r->shard), std::move(r->frames)});
  }
}

bool ShardMoves::OnReply(size_t index, const Decoded& reply, std::vector<MonitorOutgoing>* out) {
  if (!move_ || !move_->Answers(reply)) return false;
  if (auto r = move_->OnReply(index, reply, clock_->Now())) {
    out->push_back({Frame(), static_cast<int>(r->shard), std::move(r->frames)});
  }
  if (move_->done()) Finish(out);
  return true;
}

void ShardMoves::Finish(std::vector<MonitorOutgoing>* out) {
  const KeyMove& m = *move_;
  RangeTable& ranges = *ranges_;
  const size_t from = m.from(), to = m.to();
  // Both ranges changed keys: new epochs.
  ranges[to].epoch = ranges.NextEpoch();
  if (op_ == wire::ShardOp::Add) {
    ranges[to].begin = m.key_begin();
    ranges[to].end = m.key_end();
    ranges[from].end = m.key_begin();
    ranges[from].epoch = ranges.NextEpoch();
  } else {
    if (ranges[to].end == m.key_begin()) {
      ranges[to].end = m.key_end();
    } else {
      ranges[to].begin = m.key_begin();
    }
    ranges[from].begin = ranges[from].end = 0;
    (*shards_)[from].drained = true;
    Envelope env;
    env.job_id = options_.job_id;
    env.request_id = NewRequestId();
    out->push_back({Frame(), static_cast<int>(from), EncodeMessage(env, msg::Stop{"drained"})});
  }
  ranges.Bump("keys moved");
  spdlog::info("shard map v{}: keys [{}, {}) now on shard {}{} ({:.2f} s)", ranges.version(),
               m.key_begin(), m.key_end(), (*shards_)[to].id,
               op_ == wire::ShardOp::Drain
                   ? "; shard " + std::to_string((*shards_)[from].id) + " drained and stopped"
                   : "",
               ToSeconds(clock_->Now() - m.started()));
  move_.reset();
  if (!members_->operator_pause()) members_->Release();
  shards_->UpdateGauges();
}

}  // namespace pacer
