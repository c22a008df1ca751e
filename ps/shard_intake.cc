// ShardCore's push intake (ps/shard.h): a push checked, deduplicated
// (Duplicate, the one place), assembled from its parts in the worker's
// staging buffer, weighted for staleness and its share of the global
// batch, and handed to the clock barrier (synchronous modes) or applied
// at once (asp); and the learning rate of each step.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "ps/shard.h"
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

void ShardCore::OnPush(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Push m = msg::Read<msg::Push>(d);
  std::string why;
  if (StaleEpoch(peer, d.env, m.epoch, out)) return;
  if (range_.table->empty() || !range_.initialized) {
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
                                        msg::PushReply{m.clock, true, primary_.durable_seq(d.env.sender), primary_.epoch()})});
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
  if (!options_.safeguards.On(Safeguard::kDedup)) return false;
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
    if (member.staging.size() != range_.table->values()) member.staging.assign(range_.table->values(), 0.0f);
    const float* src = d.floats().data();
    for (const wire::KeyLen& k : m.keys) {
      const ParamTable::Slot* slot = range_.table->Find(k.key());  // CheckKeys passed
      std::memcpy(member.staging.data() + slot->offset, src, k.length() * sizeof(float));
      st->keys[k.key()] = k.length();
      src += k.length();
    }
  }
  if (st->received < st->parts) {
    out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(d.env),
                                        msg::PushReply{m.clock, /*complete=*/false, 0, primary_.epoch()})});
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
      const uint64_t since = range_.steps > *read ? range_.steps - *read : 0;
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
    range_.table->Step(step);
    primary_.ReplicateStep(step, nullptr);
  }
  member.seq = std::max(member.seq, push.seq);
  primary_.NoteApplied(env.sender, push.seq);
  RecordPush(member, clock);
  CountApplied();
  ++range_.steps;
  metrics_.steps->Increment();
  range_.applied_clock = std::max<int64_t>(range_.applied_clock, static_cast<int64_t>(clock));
  metrics_.clock->Set(static_cast<double>(range_.applied_clock));
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(env),
                                      msg::PushReply{clock, true, primary_.durable_seq(env.sender), primary_.epoch()})});
  if (primary_.BatchFull()) {
    primary_.Flush(out);
  }
  Advance(out);
}

void ShardCore::ScaleStep(std::span<const wire::GroupLr> carried, float scale, float fraction,
                          StepRecord* step) const {
  step->fraction = fraction;
  if (range_.table->config().kind == OptimizerKind::kSgd) {
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
  std::vector<float> lr(range_.table->groups());
  for (uint32_t g = 0; g < lr.size(); ++g) lr[g] = range_.table->settings(g).lr;
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
  if (static_cast<int64_t>(clock) <= range_.applied_clock) {
    member.seq = std::max(member.seq, push.seq);
    if (job_.mode == wire::Mode::Backup) {
      ++dropped_pushes_;
      metrics_.dropped->Increment();
    }
    ReplyError(peer, env, wire::ErrorCode::Stale,
               "clock " + std::to_string(clock) + " is already closed (applied through " +
                   std::to_string(range_.applied_clock) + ")",
               out);
    return true;
  }
  if (static_cast<int64_t>(clock) > range_.applied_clock + kMaxOpenClocks) {
    if (restored_) {
      // Catching up after a restore: the other workers' next pushes or
      // pulls move the applied clock; the worker retries.
      ReplyError(peer, env, wire::ErrorCode::NotReady,
                 "clock " + std::to_string(clock) + " is ahead of the restored clock " +
                     std::to_string(range_.applied_clock) + "; catching up",
                 out);
      return false;
    }
    // Each open clock holds a full accumulator: refuse runaway clocks.
    ReplyError(peer, env, wire::ErrorCode::Refused,
               "clock " + std::to_string(clock) + " is more than " +
                   std::to_string(kMaxOpenClocks) + " ahead of applied clock " +
                   std::to_string(range_.applied_clock),
               out);
    return false;
  }
  auto it = open_.find(clock);
  if (it == open_.end()) {
    OpenClock fresh;
    fresh.acc = range_.TakeBuffer();
    fresh.opened = fresh.reported = clock_->Now();
    it = open_.emplace(clock, std::move(fresh)).first;
  }
  OpenClock& oc = it->second;
  // Duplicates were answered before (Duplicate); this push counts.
  oc.pushed.insert(env.sender);
  const float weight = StalenessWeight(push) * static_cast<float>(push.batch);
  if (options_.apply_updates) range_.table->AddInto(oc.acc, push.grad, weight);
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
                                      msg::PushReply{clock, true, primary_.durable_seq(env.sender), primary_.epoch()})});
  Advance(out);
  return true;
}

void ShardCore::CountApplied() {
  metrics_.updates->Increment();
  ++updates_applied_;
  metrics_.model_updates->Set(static_cast<double>(updates_applied_));
}

}  // namespace pacer
