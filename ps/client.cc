#include "ps/client.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "spdlog/spdlog.h"

namespace pacer {

ShardMapInfo ShardMapFromWire(const msg::ShardMap& map) {
  ShardMapInfo info;
  info.version = map.version;
  for (const msg::ShardInfo& s : map.shards) {
    ShardEntry e;
    e.id = s.id;
    e.address = s.address;
    e.range = {s.key_begin, s.key_end};
    e.public_key = s.public_key;
    e.backups = s.backups;
    e.epoch = s.epoch;
    info.shards.push_back(std::move(e));
  }
  return info;
}

ShardMapInfo ShardMapFromWire(const wire::ShardMap* map) {
  return map == nullptr ? ShardMapInfo{} : ShardMapFromWire(msg::FromWire(*map));
}

absl::StatusOr<std::vector<Slice>> SplitByShard(std::span<const wire::KeyLen> keys,
                                                const ShardMapInfo& map) {
  std::vector<Slice> slices(map.shards.size());
  for (size_t s = 0; s < slices.size(); ++s) slices[s].shard = s;
  size_t offset = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    size_t s = 0;
    while (s < map.shards.size() && !map.shards[s].range.Contains(keys[i].key())) ++s;
    if (s == map.shards.size()) {
      return absl::FailedPreconditionError("key " + std::to_string(keys[i].key()) +
                                           " has no shard in map v" + std::to_string(map.version));
    }
    // The map lists shards in any order (a shard added mid-run comes last
    // whatever range it took); each one's keys must be one run.
    if (slices[s].num_keys > 0 && slices[s].first_key + slices[s].num_keys != i) {
      return absl::InvalidArgumentError("shard " + std::to_string(map.shards[s].id) +
                                        "'s keys are not contiguous in key order");
    }
    if (slices[s].num_keys == 0) {
      slices[s].first_key = i;
      slices[s].offset = offset;
    }
    ++slices[s].num_keys;
    slices[s].length += keys[i].length();
    offset += keys[i].length();
  }
  for (auto& sl : slices) {
    if (sl.num_keys == 0) sl.offset = offset;  // empty slices point past the end
  }
  return slices;
}

absl::StatusOr<std::unique_ptr<PsClient>> PsClient::Create(Transport* transport,
                                                          const ClientOptions& options,
                                                          const ShardMapInfo& map,
                                                          std::vector<wire::KeyLen> keys) {
  if (map.shards.empty()) return absl::FailedPreconditionError("shard map has no shards");
  std::sort(keys.begin(), keys.end(), [](auto& a, auto& b) { return a.key() < b.key(); });
  auto slices = SplitByShard(keys, map);
  if (!slices.ok()) return slices.status();
  std::unique_ptr<PsClient> c(new PsClient());
  c->transport_ = transport;
  c->options_ = options;
  // Pull replies are checked block by block as they are copied into the
  // parameters (the handler in StartPull): one read of the payload.
  c->options_.rpc.defer_pull_reply_payload = true;
  c->map_ = map;
  c->answered_epochs_.assign(map.shards.size(), 0);
  c->keys_ = std::move(keys);
  c->slices_ = std::move(*slices);
  size_t total = 0;
  for (const auto& k : c->keys_) total += k.length();
  c->size_ = total;
  if (options.allocate) {
    c->params_ = options.allocate(total);
    c->grads_ = options.allocate(total);
    if (!c->params_ || !c->grads_) {
      return absl::ResourceExhaustedError("cannot allocate " + std::to_string(total) +
                                          " floats for the parameters and gradient");
    }
  } else {
    c->params_ = std::shared_ptr<float>(new float[std::max<size_t>(1, total)](),
                                        std::default_delete<float[]>());
    c->grads_ = std::shared_ptr<float>(new float[std::max<size_t>(1, total)](),
                                       std::default_delete<float[]>());
  }
  for (const auto& shard : map.shards) {
    transport->SetServerKey(shard.address, shard.public_key);
    auto ch = RpcChannel::Connect(transport, shard.address, c->options_.rpc);
    if (!ch.ok()) return ch.status();
    c->channels_.push_back(std::move(*ch));
  }
  c->PlanParts();
  return c;
}

absl::Status PsClient::ShardError(size_t i, const absl::Status& s) const {
  absl::Status err(s.code(), "shard " + std::to_string(map_.shards[i].id) + " (" +
                                 map_.shards[i].address + "): " + std::string(s.message()));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& p) { err.SetPayload(url, p); });
  return err;
}

void PsClient::BeginRound(bool parts,
                          std::function<absl::Status(size_t, const Decoded&)> on_reply) {
  const size_t n = channels_.size();
  round_.active = true;
  round_.parts = parts;
  round_.deadline = transport_->clock()->Now() + options_.request_timeout;
  round_.requests.clear();
  round_.expected.assign(n, 1);
  round_.sent.assign(n, 0);
  round_.done.assign(n, false);
  round_.on_reply = std::move(on_reply);
}

template <class Build>
absl::Status PsClient::SendInRound(size_t shard, Build build) {
  absl::StatusOr<uint64_t> id = build(*channels_[shard]);
  if (!id.ok()) {
    round_.active = false;
    return ShardError(shard, id.status());
  }
  Request r;
  r.shard = shard;
  r.id = *id;
  r.frames = channels_[shard]->last_sent();
  r.resend_at = transport_->clock()->Now() + options_.resend_after;
  r.backoff = options_.retry_backoff;
  round_.requests.push_back(std::move(r));
  ++round_.sent[shard];
  return absl::OkStatus();
}

template <class Build, class OnReply>
absl::Status PsClient::Broadcast(Build build, OnReply on_reply) {
  BeginRound(false, on_reply);
  for (size_t i = 0; i < channels_.size(); ++i) {
    absl::Status s = SendInRound(i, [&](RpcChannel& ch) { return build(i, ch); });
    if (!s.ok()) return s;
  }
  return Drain(/*wait=*/true);
}

absl::Status PsClient::TakeReply(size_t r, absl::StatusOr<std::optional<Decoded>> reply) {
  const Clock* clock = transport_->clock();
  Request& req = round_.requests[r];
  const size_t i = req.shard;
  if (!reply.ok()) {
    const wire::ErrorCode code = WireCode(reply.status());
    if (code == wire::ErrorCode::NotOwner) {
      // Keys moved (elastic shards): the caller takes the newer map and
      // asks again; wait a little so that a map not out yet can arrive.
      clock->SleepUntil(clock->Now() + std::chrono::milliseconds(50));
      const absl::Status e = ShardError(i, reply.status());
      absl::Status aborted(absl::StatusCode::kAborted,
                           "shard map out of date: " + std::string(e.message()));
      e.ForEachPayload([&](absl::string_view url, const absl::Cord& p) { aborted.SetPayload(url, p); });
      return aborted;
    }
    if (code == wire::ErrorCode::BadCrc || code == wire::ErrorCode::BadHeader ||
        code == wire::ErrorCode::BadLength) {
      // Our message arrived damaged (the shard verified it and applied
      // nothing), or its reply did (RpcChannel::MatchAny): send the same
      // bytes again now.
      req.resend_at = clock->Now();
      return absl::OkStatus();
    }
    if (code == wire::ErrorCode::NotReady || code == wire::ErrorCode::NotMember) {
      // Restarting, or not told of us yet: ask again shortly.
      req.resend_at = clock->Now() + req.backoff;
      req.backoff = std::min<Duration>(req.backoff * 2, options_.resend_after);
      return absl::OkStatus();
    }
    if (resending_ && code == wire::ErrorCode::Stale) {
      // A kept push for a clock the new owner has closed already: nothing
      // more to send (a push it never had is counted lost there).
      req.answered = true;
      round_.done[i] = true;
      return absl::OkStatus();
    }
    return ShardError(i, reply.status());
  }
  if (!reply->has_value()) return absl::OkStatus();
  const Decoded& d = **reply;
  req.answered = true;
  if (round_.parts) {
    if (d.type() != wire::Body::PushReply) {
      return ShardError(i, absl::DataLossError(std::string("push answered with ") +
                                               wire::EnumNameBody(d.type())));
    }
    const msg::PushReply pr = msg::Read<msg::PushReply>(d);
    Durable(i, pr.durable_seq);
    if (i < answered_epochs_.size()) answered_epochs_[i] = pr.epoch;
    if (pr.complete) {
      round_.done[i] = true;
      return absl::OkStatus();
    }
    // A part held by the shard. When every part was answered and none
    // completed the push, the shard lost some (it restarted): send them all
    // again (same seq and request ids; it applies the push once).
    if (round_.sent[i] < round_.expected[i]) return absl::OkStatus();
    for (const Request& other : round_.requests) {
      if (other.shard == i && !other.answered) return absl::OkStatus();
    }
    for (Request& other : round_.requests) {
      if (other.shard != i) continue;
      other.answered = false;
      other.resend_at = clock->Now();
    }
    return absl::OkStatus();
  }
  if (absl::Status s = round_.on_reply(i, d); !s.ok()) {
    if (WireCode(s) != wire::ErrorCode::BadCrc) return s;
    // The reply was damaged on the way: ask again now (the same request).
    req.answered = false;
    req.resend_at = clock->Now();
    return absl::OkStatus();
  }
  round_.done[i] = true;
  return absl::OkStatus();
}

absl::Status PsClient::Drain(bool wait) {
  if (!round_.active) return absl::FailedPreconditionError("no request in flight");
  const Clock* clock = transport_->clock();
  absl::Status status;
  std::vector<Socket*> sockets;
  std::vector<size_t> owed;  // shards not done
  std::vector<uint64_t> ids;
  std::vector<size_t> index;
  // Takes every message ready on shard i's socket (or `first`, already read).
  auto take_from = [&](size_t i, Frames* first) -> absl::Status {
    for (;;) {
      Frames frames;
      if (first != nullptr) {
        frames = std::move(*first);
        first = nullptr;
      } else {
        absl::StatusOr<bool> got = channels_[i]->socket()->TryRecv(&frames);
        if (!got.ok()) return ShardError(i, got.status());
        if (!*got) return absl::OkStatus();
      }
      ids.clear();
      index.clear();
      for (size_t r = 0; r < round_.requests.size(); ++r) {
        if (round_.requests[r].shard == i && !round_.requests[r].answered) {
          ids.push_back(round_.requests[r].id);
          index.push_back(r);
        }
      }
      size_t which = ids.size();
      auto reply = channels_[i]->MatchAny(frames, ids, &which);
      if (which == ids.size()) {
        // Not an answer to anything outstanding (a late or repeated reply),
        // unless it is unreadable.
        if (!reply.ok()) return ShardError(i, reply.status());
        continue;
      }
      if (absl::Status s = TakeReply(index[which], std::move(reply)); !s.ok()) return s;
      // Done with this shard: what else is queued (late copies) waits for
      // the next round, which skips it, rather than cost a receive here.
      if (round_.done[i]) return absl::OkStatus();
    }
  };
  for (;;) {
    owed.clear();
    for (size_t i = 0; i < round_.done.size(); ++i) {
      if (!round_.done[i]) owed.push_back(i);
    }
    if (owed.empty()) {
      if (!wait) return status;  // the caller ends the round
      break;
    }
    if (options_.cancel != nullptr && options_.cancel->load()) {
      status = absl::CancelledError("request cancelled");
      break;
    }
    if (options_.latest_map_version != nullptr &&
        options_.latest_map_version->load() > map_.version) {
      status = absl::AbortedError("shard map changed (v" + std::to_string(map_.version) + " -> v" +
                                  std::to_string(options_.latest_map_version->load()) + ")");
      break;
    }
    const TimePoint now = clock->Now();
    if (now >= round_.deadline) {
      status = absl::DeadlineExceededError("no reply from " + std::to_string(owed.size()) +
                                           " shard(s), first " + map_.shards[owed[0]].address);
      break;
    }
    TimePoint wake = round_.deadline;
    for (Request& r : round_.requests) {
      if (r.answered || round_.done[r.shard]) continue;
      if (now >= r.resend_at) {
        if (absl::Status s = channels_[r.shard]->socket()->Send(Frames(r.frames)); !s.ok()) {
          status = ShardError(r.shard, s);
          break;
        }
        r.resend_at = now + options_.resend_after;
      }
      wake = std::min(wake, r.resend_at);
    }
    if (!status.ok()) break;
    if (!wait) {
      for (size_t i : owed) {
        status = take_from(i, nullptr);
        if (!status.ok()) break;
      }
      if (status.ok()) return status;  // the round goes on
      break;
    }
    if (options_.cancel != nullptr || options_.latest_map_version != nullptr) {
      wake = std::min(wake, now + std::chrono::milliseconds(50));
    }
    if (owed.size() == 1) {
      // One shard owes replies: a plain blocking receive is cheaper than a poll.
      const size_t i = owed[0];
      Frames frames;
      absl::StatusOr<bool> got = transport_->Recv(channels_[i]->socket(), &frames, wake);
      if (!got.ok()) {
        status = got.status();
        break;
      }
      if (!*got) continue;
      status = take_from(i, &frames);
      if (!status.ok()) break;
      continue;
    }
    sockets.clear();
    for (size_t i : owed) sockets.push_back(channels_[i]->socket());
    auto ready = transport_->Poll(sockets, wake);
    if (!ready.ok()) {
      status = ready.status();
      break;
    }
    for (size_t i : owed) {
      status = take_from(i, nullptr);
      if (!status.ok()) break;
    }
    if (!status.ok()) break;
  }
  round_.active = false;
  return status;
}

absl::Status PsClient::SetMap(const ShardMapInfo& map) {
  if (map.shards.empty()) return absl::FailedPreconditionError("shard map has no shards");
  auto slices = SplitByShard(keys_, map);
  if (!slices.ok()) return slices.status();
  std::vector<std::unique_ptr<RpcChannel>> channels;
  for (const auto& shard : map.shards) {
    // Keep the connection to a shard that stayed where it was.
    std::unique_ptr<RpcChannel> ch;
    for (size_t i = 0; i < map_.shards.size(); ++i) {
      if (channels_[i] && map_.shards[i].address == shard.address &&
          map_.shards[i].public_key == shard.public_key) {
        ch = std::move(channels_[i]);
        break;
      }
    }
    if (!ch) {
      transport_->SetServerKey(shard.address, shard.public_key);
      auto c = RpcChannel::Connect(transport_, shard.address, options_.rpc);
      if (!c.ok()) return c.status();
      ch = std::move(*c);
    }
    channels.push_back(std::move(ch));
  }
  map_ = map;
  answered_epochs_.assign(map_.shards.size(), 0);
  slices_ = std::move(*slices);
  channels_ = std::move(channels);
  round_.active = false;
  PlanParts();
  // Kept pushes of a range now at another address (a failover, or its
  // shard restarted from a checkpoint) go there again before the next push,
  // and its dedup state applies each at most once; a range that no
  // longer exists as it was (keys moved, with the workers held: every push
  // was applied before) lets go of its pushes.
  for (auto it = held_.begin(); it != held_.end();) {
    const ShardEntry* owner = nullptr;
    for (const ShardEntry& e : map_.shards) {
      if (e.range.begin == it->first && e.range.end == it->second.end) owner = &e;
    }
    if (owner == nullptr) {
      it = held_.erase(it);
      continue;
    }
    if (owner->address != it->second.address && !it->second.pushes.empty()) {
      if (options_.safeguards.On(Safeguard::kResendHeld)) {
        it->second.resend = true;
      } else {
        it->second.pushes.clear();  // --unsafe-disable resend-held
      }
    }
    // A range that lost its backups (a failover) keeps what it holds: the
    // new owner says when it is durable (at once with no backup).
    ++it;
  }
  return absl::OkStatus();
}

size_t PsClient::held_pushes() const {
  size_t n = 0;
  for (const auto& [begin, r] : held_) n += r.pushes.size();
  return n;
}

size_t PsClient::held_values() const {
  size_t n = 0;
  for (const auto& [begin, r] : held_) {
    for (const HeldPush& p : r.pushes) n += p.values ? p.values->size() : 0;
  }
  return n;
}

uint64_t PsClient::durable_through() const {
  uint64_t through = push_seq_;
  for (const auto& [begin, r] : held_) {
    if (!r.pushes.empty()) through = std::min(through, r.pushes.front().seq - 1);
  }
  return through;
}

void PsClient::Durable(size_t shard, uint64_t seq) {
  if (seq == 0 || shard >= map_.shards.size()) return;
  auto it = held_.find(map_.shards[shard].range.begin);
  if (it == held_.end() || it->second.address != map_.shards[shard].address) return;
  HeldRange& r = it->second;
  r.durable = std::max(r.durable, seq);
  while (!r.pushes.empty() && r.pushes.front().seq <= r.durable) {
    // Its buffer holds the next push kept (HoldPush), unless a resend's
    // message still has it.
    std::shared_ptr<std::vector<float>>& v = r.pushes.front().values;
    if (v && v.use_count() == 1 && spare_held_.size() < kSpareHeld) {
      std::atomic_thread_fence(std::memory_order_acquire);  // ZeroMQ's reads are done
      spare_held_.push_back(std::move(v));
    }
    r.pushes.pop_front();
  }
}

void PsClient::HoldPush() {
  for (size_t i = 0; i < map_.shards.size(); ++i) {
    const ShardEntry& e = map_.shards[i];
    if (e.backups.empty()) continue;
    HeldRange& r = held_[e.range.begin];
    if (r.address != e.address) {
      // A new owner (the kept pushes went to it already, ResendHeld).
      r.address = e.address;
      r.epoch = e.epoch;
      r.durable = 0;
    }
    r.end = e.range.end;
    if (push_seq_ <= r.durable) continue;  // durable already
    const Slice& sl = slices_[i];
    HeldPush p;
    p.seq = push_seq_;
    p.clock = push_clock_;
    p.batch = push_batch_;
    p.read_applied = read_applied_;
    p.read_steps = read_steps_;
    p.lrs = push_lrs_;
    const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(sl.first_key);
    p.keys.assign(first, first + static_cast<std::ptrdiff_t>(sl.num_keys));
    if (!spare_held_.empty()) {
      p.values = std::move(spare_held_.back());
      spare_held_.pop_back();
      p.values->assign(grads_.get() + sl.offset, grads_.get() + sl.offset + sl.length);
    } else {
      p.values = std::make_shared<std::vector<float>>(grads_.get() + sl.offset,
                                                      grads_.get() + sl.offset + sl.length);
    }
    if (!r.pushes.empty() && r.pushes.back().seq == p.seq) r.pushes.pop_back();  // a retry
    r.pushes.push_back(std::move(p));
  }
}

absl::Status PsClient::ResendHeld() {
  std::vector<std::pair<size_t, HeldRange*>> due;  // shard index, its range
  for (auto& [begin, r] : held_) {
    if (!r.resend) continue;
    for (size_t i = 0; i < map_.shards.size(); ++i) {
      if (map_.shards[i].range.begin == begin) due.emplace_back(i, &r);
    }
  }
  if (due.empty()) return absl::OkStatus();
  for (auto& [i, r] : due) {
    spdlog::info("sending {} push(es) not yet durable (seq {}..{}) again to shard {} at {}, the "
                 "new owner of keys [{}, {})",
                 r->pushes.size(), r->pushes.empty() ? 0 : r->pushes.front().seq,
                 r->pushes.empty() ? 0 : r->pushes.back().seq, map_.shards[i].id,
                 map_.shards[i].address, map_.shards[i].range.begin, map_.shards[i].range.end);
  }
  // In seq order, one push per range per round: a shard drops a push
  // whose seq is below one it applied (dedup).
  for (size_t k = 0;; ++k) {
    bool any = false;
    resending_ = true;
    BeginRound(/*parts=*/true, nullptr);
    std::fill(round_.done.begin(), round_.done.end(), true);
    for (auto& [i, r] : due) {
      if (k >= r->pushes.size()) continue;
      const HeldPush& p = r->pushes[k];
      round_.done[i] = false;
      any = true;
      // Not read inside the lambda: clang 14 cannot capture a structured binding.
      const uint64_t epoch = map_.shards[i].epoch;
      absl::Status s = SendInRound(i, [&](RpcChannel& ch) {
        msg::Push push;
        push.clock = p.clock;
        push.batch = p.batch;
        push.keys = p.keys;
        push.read_applied = p.read_applied;
        push.read_steps = p.read_steps;
        push.seq = p.seq;
        push.lrs = p.lrs;
        push.epoch = epoch;
        Frame payload(p.values, p.values->data(), p.values->size() * sizeof(float));
        return ch.Send(push, p.values->empty() ? Frame() : payload);
      });
      if (!s.ok()) {
        resending_ = false;
        return s;
      }
      ++resent_pushes_;
    }
    if (!any) break;
    absl::Status s = Drain(/*wait=*/true);
    resending_ = false;
    if (!s.ok()) return s;
  }
  resending_ = false;
  for (auto& [i, r] : due) {
    r->resend = false;
    r->address = map_.shards[i].address;
    r->epoch = map_.shards[i].epoch;
  }
  return absl::OkStatus();
}

absl::Status PsClient::Init() {
  return Broadcast(
      [&](size_t i, RpcChannel& ch) {
        const Slice& sl = slices_[i];
        const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(sl.first_key);
        msg::Init init{{first, first + static_cast<std::ptrdiff_t>(sl.num_keys)}};
        Frame payload(params_, params_.get() + sl.offset, sl.length * sizeof(float));
        return ch.Send(init, sl.length ? payload : Frame());
      },
      [](size_t, const Decoded&) { return absl::OkStatus(); });
}

absl::Status PsClient::Push(uint64_t clock, uint32_t batch, bool retry) {
  StartPush(clock, batch, retry);
  return FinishPush();
}

void PsClient::SetPushStages(std::vector<FlatRange> stages) {
  stages_ = std::move(stages);
  PlanParts();
}

void PsClient::PlanParts() {
  // The stage after which each key is final: the last stage touching it
  // (a key no stage covers entirely waits for FinishPush).
  const size_t final_stage = stages_.size();
  std::vector<size_t> key_stage(keys_.size(), final_stage);
  size_t offset = 0;
  for (size_t k = 0; k < keys_.size(); ++k) {
    const size_t begin = offset, end = offset + keys_[k].length();
    offset = end;
    size_t covered = 0, last = 0;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const size_t b = std::max(begin, stages_[s].begin), e = std::min(end, stages_[s].end);
      if (b >= e) continue;
      covered += e - b;
      last = std::max(last, s);
    }
    if (covered >= end - begin && end > begin) key_stage[k] = last;
  }
  parts_.assign(slices_.size(), {});
  part_sent_.assign(slices_.size(), {});
  for (size_t i = 0; i < slices_.size(); ++i) {
    const Slice& sl = slices_[i];
    std::vector<Part>& parts = parts_[i];
    size_t off = sl.offset;
    for (size_t k = sl.first_key; k < sl.first_key + sl.num_keys; ++k) {
      if (parts.empty() || parts.back().stage != key_stage[k]) {
        parts.push_back({key_stage[k], k, 0, off, 0});
      }
      ++parts.back().num_keys;
      parts.back().length += keys_[k].length();
      off += keys_[k].length();
    }
    // A shard without our keys gets one empty push, at the end; one with
    // more runs than a push may have parts gets its keys in one message.
    if (parts.empty() || parts.size() > kMaxPushParts) {
      parts.assign(1, {final_stage, sl.first_key, sl.num_keys, sl.offset, sl.length});
    }
    part_sent_[i].assign(parts.size(), false);
  }
}

void PsClient::StartPush(uint64_t clock, uint32_t batch, bool retry) {
  // After a failover: the kept pushes first (an error here leaves them
  // marked; this push's round then fails the same way and is retried).
  if (absl::Status s = ResendHeld(); !s.ok()) {
    resend_error_ = s;
  }
  if (!retry || push_seq_ == 0) ++push_seq_;
  push_clock_ = clock;
  push_batch_ = batch;
  BeginRound(/*parts=*/true, nullptr);
  for (size_t i = 0; i < parts_.size(); ++i) {
    round_.expected[i] = static_cast<uint32_t>(parts_[i].size());
    std::fill(part_sent_[i].begin(), part_sent_[i].end(), false);
  }
}

absl::Status PsClient::SendPart(size_t shard, size_t part) {
  const Part& p = parts_[shard][part];
  const uint32_t parts = static_cast<uint32_t>(parts_[shard].size());
  part_sent_[shard][part] = true;
  ++push_messages_;
  if (parts > 1) ++push_parts_;
  return SendInRound(shard, [&](RpcChannel& ch) {
    const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(p.first_key);
    msg::Push push;
    push.clock = push_clock_;
    push.batch = push_batch_;
    push.keys.assign(first, first + static_cast<std::ptrdiff_t>(p.num_keys));
    push.read_applied = read_applied_;
    push.read_steps = read_steps_;
    push.seq = push_seq_;
    push.part = static_cast<uint32_t>(part);
    push.parts = parts;
    push.lrs = push_lrs_;
    push.epoch = map_.shards[shard].epoch;
    Frame payload(grads_, grads_.get() + p.offset, p.length * sizeof(float));
    return ch.Send(push, p.length ? payload : Frame());
  });
}

absl::Status PsClient::PushStage(size_t stage) {
  if (!round_.active || !round_.parts) return absl::FailedPreconditionError("no push started");
  for (size_t i = 0; i < parts_.size(); ++i) {
    for (size_t p = 0; p < parts_[i].size(); ++p) {
      if (parts_[i][p].stage != stage || part_sent_[i][p] || round_.done[i]) continue;
      if (absl::Status s = SendPart(i, p); !s.ok()) return s;
    }
  }
  return Drain(/*wait=*/false);
}

absl::Status PsClient::FinishPush() {
  if (!resend_error_.ok()) {
    absl::Status s = std::move(resend_error_);
    resend_error_ = absl::OkStatus();
    round_.active = false;
    return s;
  }
  if (!round_.active || !round_.parts) return absl::FailedPreconditionError("no push started");
  // The deadline counts from here: the backward pass ran since StartPush.
  round_.deadline = transport_->clock()->Now() + options_.request_timeout;
  for (size_t i = 0; i < parts_.size(); ++i) {
    for (size_t p = 0; p < parts_[i].size(); ++p) {
      if (part_sent_[i][p] || round_.done[i]) continue;
      if (absl::Status s = SendPart(i, p); !s.ok()) return s;
    }
  }
  absl::Status s = Drain(/*wait=*/true);
  if (s.ok()) HoldPush();
  return s;
}

absl::StatusOr<int64_t> PsClient::Pull(uint64_t clock, bool latest) {
  if (absl::Status s = StartPull(clock, latest); !s.ok()) return s;
  return FinishPull();
}

absl::Status PsClient::StartPull(uint64_t clock, bool latest) {
  // After a failover the kept pushes go before the pull too: a pull that
  // reached the range's new owner first would tell it this worker had
  // passed the clock of a push it has not got yet, and the clock would
  // close without it (regression: replica-kill-open-clock).
  if (absl::Status s = ResendHeld(); !s.ok()) return s;
  pull_applied_ = std::numeric_limits<int64_t>::max();
  pull_steps_ = std::numeric_limits<uint64_t>::max();
  last_wait_seconds_ = 0;
  BeginRound(false, [this](size_t i, const Decoded& d) -> absl::Status {
    if (d.type() != wire::Body::PullReply) {
      return absl::DataLossError(std::string("pull answered with ") + wire::EnumNameBody(d.type()));
    }
    const Slice& sl = slices_[i];
    const msg::PullReply r = msg::Read<msg::PullReply>(d);
    if (r.keys.size() != sl.num_keys || d.payload.size() != sl.length * sizeof(float)) {
      return absl::DataLossError("pull reply does not match the request");
    }
    for (size_t k = 0; k < r.keys.size(); ++k) {
      if (r.keys[k].key() != keys_[sl.first_key + k].key()) {
        return absl::DataLossError("pull reply keys out of order");
      }
    }
    if (sl.length && !CopyCheckedPayload(d, params_.get() + sl.offset)) {
      // Damaged on the way: the blocks copied so far are right, the rest
      // keep their old values until the shard answers again (TakeReply).
      return ErrorStatus(wire::ErrorCode::BadCrc, "pull reply payload fails its block checks");
    }
    Durable(i, r.durable_seq);
    if (i < answered_epochs_.size()) answered_epochs_[i] = r.epoch;
    pull_applied_ = std::min(pull_applied_, r.applied_clock);
    pull_steps_ = std::min(pull_steps_, r.steps);
    last_wait_seconds_ = std::max(last_wait_seconds_, static_cast<double>(r.waited_seconds));
    return absl::OkStatus();
  });
  for (size_t i = 0; i < channels_.size(); ++i) {
    absl::Status s = SendInRound(i, [&](RpcChannel& ch) {
      const Slice& sl = slices_[i];
      const auto first = keys_.begin() + static_cast<std::ptrdiff_t>(sl.first_key);
      return ch.Send(msg::Pull{clock,
                               {first, first + static_cast<std::ptrdiff_t>(sl.num_keys)},
                               latest,
                               /*with_state=*/false,
                               map_.shards[i].epoch});
    });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> PsClient::FinishPull() {
  if (!round_.active || round_.parts) return absl::FailedPreconditionError("no pull started");
  if (absl::Status s = Drain(/*wait=*/true); !s.ok()) return s;
  read_applied_ = pull_applied_;
  read_steps_ = pull_steps_;
  return pull_applied_;
}

}  // namespace pacer
