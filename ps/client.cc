#include "ps/client.h"

#include <algorithm>
#include <cstring>

namespace pacer {

ShardMapInfo ShardMapFromWire(const wire::ShardMap* map) {
  ShardMapInfo info;
  if (map == nullptr) return info;
  info.version = map->version();
  if (map->shards() != nullptr) {
    for (const wire::ShardInfo* s : *map->shards()) {
      ShardEntry e;
      e.id = s->id();
      e.address = s->address() ? s->address()->str() : "";
      e.range = {s->key_begin(), s->key_end()};
      info.shards.push_back(std::move(e));
    }
  }
  return info;
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
  c->map_ = map;
  c->keys_ = std::move(keys);
  c->slices_ = std::move(*slices);
  size_t total = 0;
  for (const auto& k : c->keys_) total += k.length();
  c->params_ = std::make_shared<std::vector<float>>(total, 0.0f);
  c->grads_ = std::make_shared<std::vector<float>>(total, 0.0f);
  for (const auto& shard : map.shards) {
    auto ch = RpcChannel::Connect(transport, shard.address, options.rpc);
    if (!ch.ok()) return ch.status();
    c->channels_.push_back(std::move(*ch));
  }
  return c;
}

absl::Status PsClient::ShardError(size_t i, const absl::Status& s) const {
  absl::Status err(s.code(), "shard " + std::to_string(map_.shards[i].id) + " (" +
                                 map_.shards[i].address + "): " + std::string(s.message()));
  s.ForEachPayload([&](absl::string_view url, const absl::Cord& p) { err.SetPayload(url, p); });
  return err;
}

template <class Build, class OnReply>
absl::Status PsClient::Broadcast(Build build, OnReply on_reply) {
  const size_t n = channels_.size();
  const Clock* clock = transport_->clock();
  const TimePoint deadline = clock->Now() + options_.request_timeout;
  std::vector<uint64_t> ids(n);
  std::vector<TimePoint> resend_at(n);
  std::vector<Duration> backoff(n, options_.retry_backoff);
  for (size_t i = 0; i < n; ++i) {
    absl::StatusOr<uint64_t> id = build(i, *channels_[i]);
    if (!id.ok()) return id.status();
    ids[i] = *id;
    resend_at[i] = clock->Now() + options_.resend_after;
  }
  std::vector<size_t> pending(n);
  for (size_t i = 0; i < n; ++i) pending[i] = i;
  // What shard i's reply means: done (true), still owed (false), or an error.
  auto take = [&](size_t i, absl::StatusOr<std::optional<Decoded>> r) -> absl::StatusOr<bool> {
    if (!r.ok()) {
      const wire::ErrorCode code = WireCode(r.status());
      if (code == wire::ErrorCode::NotOwner) {
        // Keys moved (elastic shards): the caller takes the newer map and
        // asks again; wait a little so that a map not out yet can arrive.
        clock->SleepUntil(clock->Now() + std::chrono::milliseconds(50));
        const absl::Status e = ShardError(i, r.status());
        absl::Status aborted(absl::StatusCode::kAborted, "shard map out of date: " + std::string(e.message()));
        e.ForEachPayload([&](absl::string_view url, const absl::Cord& p) { aborted.SetPayload(url, p); });
        return aborted;
      }
      if (code == wire::ErrorCode::BadCrc || code == wire::ErrorCode::BadHeader ||
          code == wire::ErrorCode::BadLength) {
        // Our message arrived damaged (the shard verified it and applied
        // nothing): send the same bytes again now.
        resend_at[i] = clock->Now();
        return false;
      }
      if (code == wire::ErrorCode::NotReady || code == wire::ErrorCode::NotMember) {
        // Restarting, or not told of us yet: ask again shortly.
        resend_at[i] = clock->Now() + backoff[i];
        backoff[i] = std::min<Duration>(backoff[i] * 2, options_.resend_after);
        return false;
      }
      return ShardError(i, r.status());
    }
    if (!r->has_value()) return false;
    absl::Status s = on_reply(i, **r);
    if (!s.ok()) return s;
    return true;
  };
  std::vector<Socket*> sockets;
  while (!pending.empty()) {
    if (options_.cancel != nullptr && options_.cancel->load()) {
      return absl::CancelledError("request cancelled");
    }
    if (options_.latest_map_version != nullptr && options_.latest_map_version->load() > map_.version) {
      return absl::AbortedError("shard map changed (v" + std::to_string(map_.version) + " -> v" +
                                std::to_string(options_.latest_map_version->load()) + ")");
    }
    const TimePoint now = clock->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError("no reply from " + std::to_string(pending.size()) +
                                         " shard(s), first " + map_.shards[pending[0]].address);
    }
    TimePoint wake = deadline;
    for (size_t i : pending) {
      if (now >= resend_at[i]) {
        if (absl::Status s = channels_[i]->Resend(); !s.ok()) return ShardError(i, s);
        resend_at[i] = now + options_.resend_after;
      }
      wake = std::min(wake, resend_at[i]);
    }
    if (options_.cancel != nullptr || options_.latest_map_version != nullptr) {
      wake = std::min(wake, now + std::chrono::milliseconds(50));
    }
    if (pending.size() == 1) {
      // One reply owed: a plain blocking receive is cheaper than a poll.
      const size_t i = pending[0];
      Frames frames;
      absl::StatusOr<bool> got = transport_->Recv(channels_[i]->socket(), &frames, wake);
      if (!got.ok()) return got.status();
      if (!*got) continue;
      absl::StatusOr<bool> done = take(i, channels_[i]->Match(frames, ids[i]));
      if (!done.ok()) return done.status();
      if (*done) pending.clear();
      continue;
    }
    sockets.clear();
    for (size_t i : pending) sockets.push_back(channels_[i]->socket());
    auto ready = transport_->Poll(sockets, wake);
    if (!ready.ok()) return ready.status();
    for (size_t p = 0; p < pending.size();) {
      const size_t i = pending[p];
      absl::StatusOr<bool> done = take(i, channels_[i]->TryTake(ids[i]));
      if (!done.ok()) return done.status();
      if (*done) {
        pending.erase(pending.begin() + static_cast<long>(p));
      } else {
        ++p;
      }
    }
  }
  return absl::OkStatus();
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
      if (channels_[i] && map_.shards[i].address == shard.address) {
        ch = std::move(channels_[i]);
        break;
      }
    }
    if (!ch) {
      auto c = RpcChannel::Connect(transport_, shard.address, options_.rpc);
      if (!c.ok()) return c.status();
      ch = std::move(*c);
    }
    channels.push_back(std::move(ch));
  }
  map_ = map;
  slices_ = std::move(*slices);
  channels_ = std::move(channels);
  return absl::OkStatus();
}

absl::Status PsClient::Init() {
  return Broadcast(
      [&](size_t i, RpcChannel& ch) {
        const Slice& sl = slices_[i];
        flatbuffers::FlatBufferBuilder fbb(64 + sl.num_keys * sizeof(wire::KeyLen));
        auto kv = fbb.CreateVectorOfStructs(keys_.data() + sl.first_key, sl.num_keys);
        Frame payload(params_, params_->data() + sl.offset, sl.length * sizeof(float));
        return ch.Send(fbb, wire::CreateInit(fbb, kv), sl.length ? payload : Frame());
      },
      [](size_t, const Decoded&) { return absl::OkStatus(); });
}

absl::Status PsClient::Push(uint64_t clock, uint32_t batch, bool retry) {
  if (!retry || push_seq_ == 0) ++push_seq_;
  const uint64_t seq = push_seq_;
  return Broadcast(
      [&](size_t i, RpcChannel& ch) {
        const Slice& sl = slices_[i];
        flatbuffers::FlatBufferBuilder fbb(64 + sl.num_keys * sizeof(wire::KeyLen));
        auto kv = fbb.CreateVectorOfStructs(keys_.data() + sl.first_key, sl.num_keys);
        Frame payload(grads_, grads_->data() + sl.offset, sl.length * sizeof(float));
        wire::PushBuilder pb(fbb);
        pb.add_clock(clock);
        pb.add_batch(batch);
        pb.add_keys(kv);
        if (read_applied_) pb.add_read_applied(*read_applied_);
        if (read_steps_) pb.add_read_steps(*read_steps_);
        pb.add_seq(seq);
        return ch.Send(fbb, pb.Finish(), sl.length ? payload : Frame());
      },
      [](size_t, const Decoded&) { return absl::OkStatus(); });
}

absl::StatusOr<int64_t> PsClient::Pull(uint64_t clock, bool latest) {
  int64_t applied = std::numeric_limits<int64_t>::max();
  uint64_t steps = std::numeric_limits<uint64_t>::max();
  last_wait_seconds_ = 0;
  absl::Status s = Broadcast(
      [&](size_t i, RpcChannel& ch) {
        const Slice& sl = slices_[i];
        flatbuffers::FlatBufferBuilder fbb(64 + sl.num_keys * sizeof(wire::KeyLen));
        auto kv = fbb.CreateVectorOfStructs(keys_.data() + sl.first_key, sl.num_keys);
        return ch.Send(fbb, wire::CreatePull(fbb, clock, kv, latest));
      },
      [&](size_t i, const Decoded& d) -> absl::Status {
        if (d.type() != wire::Body::PullReply) {
          return absl::DataLossError(std::string("pull answered with ") +
                                     wire::EnumNameBody(d.type()));
        }
        const Slice& sl = slices_[i];
        const auto* r = d.As<wire::PullReply>();
        const auto* keys = r->keys();
        size_t nkeys = keys ? keys->size() : 0;
        if (nkeys != sl.num_keys || d.payload.size() != sl.length * sizeof(float)) {
          return absl::DataLossError("pull reply does not match the request");
        }
        for (size_t k = 0; k < nkeys; ++k) {
          if (keys->Get(static_cast<flatbuffers::uoffset_t>(k))->key() != keys_[sl.first_key + k].key()) {
            return absl::DataLossError("pull reply keys out of order");
          }
        }
        if (sl.length) std::memcpy(params_->data() + sl.offset, d.payload.data(), d.payload.size());
        applied = std::min(applied, r->applied_clock());
        steps = std::min(steps, r->steps());
        last_wait_seconds_ = std::max(last_wait_seconds_, static_cast<double>(r->waited_seconds()));
        return absl::OkStatus();
      });
  if (!s.ok()) return s;
  read_applied_ = applied;
  read_steps_ = steps;
  return applied;
}

}  // namespace pacer
