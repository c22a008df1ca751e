// ShardCore's clock barrier (ps/shard.h): when a worker may read a clock
// (the mode's rule: bsp, ssp, dssp's grants, backup, asp), pulls answered
// or parked until then, and Advance, which closes every clock that all
// live workers have pushed as one step on their batch-weighted gradients
// and hands it to replication.
#include <algorithm>
#include <cstring>

#include "ps/shard.h"
#include "ps/staleness.h"
#include "spdlog/spdlog.h"

namespace pacer {

void ShardCore::NotePassed(Member& member, int64_t clock) {
  if (!restored_ || clock <= member.pushed) return;
  member.pushed = clock;
}


int64_t ShardCore::slowest_pushed() const {
  if (live_.empty()) return range_.applied_clock;
  int64_t slowest = INT64_MAX;
  for (const auto& [id, m] : live_) slowest = std::min(slowest, m.pushed);
  return slowest;
}

uint32_t ShardCore::last_grant(uint32_t worker) const {
  auto it = live_.find(worker);
  return it == live_.end() ? 0 : it->second.last_grant;
}

bool ShardCore::PullReady(uint32_t worker, uint64_t clock) {
  if (!range_.initialized) return false;
  switch (job_.mode) {
    case wire::Mode::Asp:
      return true;
    case wire::Mode::Ssp:
    case wire::Mode::Dssp: {
      // Every clock up to c - s - 1 must be in the parameters read: its step
      // applied, i.e. every live worker pushed it.
      auto me = live_.find(worker);
      const uint32_t s = me == live_.end() ? 0 : me->second.staleness;
      if (SspReadAllowed(clock, range_.applied_clock, s)) return true;
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
      if (!SspReadAllowed(clock, range_.applied_clock, s + r)) return false;
      // Counted once per read that needed the grant.
      me->second.last_grant = r;
      metrics_.grants->Increment(r);
      return true;
    }
    default:  // Bsp, Backup, Local: the previous clock's step has been applied
      return static_cast<int64_t>(clock) <= range_.applied_clock + 1;
  }
}

void ShardCore::OnPull(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out) {
  const msg::Pull m = msg::Read<msg::Pull>(d);
  std::string why;
  if (StaleEpoch(peer, d.env, m.epoch, out)) return;
  if (range_.table->empty()) {
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
    if (!range_.initialized) {
      return ReplyError(peer, d.env, wire::ErrorCode::NotReady, "parameters not initialised", out);
    }
    return AnswerStatePull(peer, d.env, m.keys, out);
  }
  std::vector<wire::KeyLen> keys = m.keys;
  if ((m.latest && range_.initialized) || PullReady(d.env.sender, m.clock)) {
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
  const FloatBuffer& params = range_.table->params();
  for (size_t i = 0; i < keys.size(); ++i) {
    const ParamTable::Slot& s = *range_.table->Find(keys[i].key());
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
      const ParamTable::Slot& s = *range_.table->Find(k.key());
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
  reply.applied_clock = range_.applied_clock;
  reply.keys.assign(keys.begin(), keys.end());
  reply.waited_seconds = static_cast<float>(waited);
  reply.steps = range_.steps;
  reply.durable_seq = primary_.durable_seq(to.sender);
  reply.epoch = primary_.epoch();
  out->push_back({peer, EncodeMessage(server_.ReplyEnvelope(to), reply, std::move(payload),
                                      options_.check_crc)});
}

void ShardCore::AnswerStatePull(const Frame& peer, const Envelope& to,
                                std::span<const wire::KeyLen> keys, std::vector<Outgoing>* out) {
  size_t total = 0;
  for (const wire::KeyLen& k : keys) total += k.length();
  const size_t slots = range_.table->state_slots();
  auto buf = std::make_shared<std::vector<float>>(total * (1 + slots));
  msg::PullReply reply;
  reply.applied_clock = range_.applied_clock;
  reply.keys.assign(keys.begin(), keys.end());
  reply.steps = range_.steps;
  reply.optimizer = range_.table->config().kind;
  reply.state_slots = static_cast<uint32_t>(slots);
  size_t at = 0;
  for (const wire::KeyLen& k : keys) {
    const ParamTable::Slot& s = *range_.table->Find(k.key());
    reply.key_steps.push_back(s.steps);
    std::span<const float> p = range_.table->Param(k.key());
    std::copy(p.begin(), p.end(), buf->begin() + static_cast<long>(at));
    for (size_t i = 0; i < slots; ++i) {
      std::span<const float> v = range_.table->State(i, k.key());
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
  // No step after the last record (Leave), nor once the range is another
  // shard's (Depose).
  if (serving_ == ServingState::kLeaving || serving_ == ServingState::kDeposed) return;
  if (job_.mode != wire::Mode::Asp) {
    // Backup mode closes a clock once all but k live workers pushed it.
    const size_t k = job_.mode == wire::Mode::Backup ? job_.backup_workers : 0;
    const size_t needed = live_.size() > k ? live_.size() - k : 1;
    while (!live_.empty()) {
      const int64_t next = range_.applied_clock + 1;
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
        range_.applied_clock = next;
        metrics_.clock->Set(static_cast<double>(range_.applied_clock));
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
      // drops its last k pushes by design and keeps the plain mean; so
      // does local mode, whose pushes are the workers' rounds (each the
      // change of its weights over its own number of samples): one full
      // outer step on their mean weighted by the samples each trained.
      if (options_.apply_updates && oc.batch_sum > 0 && oc.weight_sum > 0) {
        StepRecord step;
        step.grad = {{}, oc.acc, /*at_offsets=*/true};
        step.grad_scale = static_cast<float>(1.0 / oc.weight_sum);
        double samples = static_cast<double>(oc.batch_sum);
        if (job_.mode != wire::Mode::Backup && job_.mode != wire::Mode::Local) {
          samples = std::max(samples, static_cast<double>(job_.global_batch));
        }
        ScaleStep(oc.lrs, static_cast<float>(oc.weight_sum / samples),
                  static_cast<float>(static_cast<double>(oc.batch_sum) / samples), &step);
        range_.table->Step(step);
        if (primary_.replicated()) {
          // The record carries the accumulator itself (the step's gradient).
          primary_.ReplicateStep(step, std::make_shared<std::vector<float>>(std::move(oc.acc)));
        }
      }
      for (const auto& [worker, seq] : oc.seqs) primary_.NoteApplied(worker, seq);
      if (oc.pushed.size() != from_live) {
        ++incomplete_steps_;  // includes pushes from workers that have since left
        metrics_.incomplete->Increment();
      }
      ++range_.steps;
      metrics_.steps->Increment();
      range_.applied_clock = static_cast<int64_t>(it->first);
      metrics_.clock->Set(static_cast<double>(range_.applied_clock));
      // The step goes to the backups after aggregation, with the clock and
      // step count it leaves (a promoted replica resumes from them): in
      // bsp and backup mode in a record of its own at once; in ssp and
      // dssp, whose workers run ahead, with the next steps, as asp's
      // pushes are batched (kReplicaBatchDelay).
      const bool batched = job_.mode == wire::Mode::Ssp || job_.mode == wire::Mode::Dssp;
      if (!batched || primary_.BatchFull()) primary_.Flush(out);
      if (!oc.acc.empty()) range_.spare_acc.push_back(std::move(oc.acc));
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

}  // namespace pacer
