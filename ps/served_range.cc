#include "ps/served_range.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "ps/base/rpc.h"
#include "spdlog/spdlog.h"

namespace pacer {

void ServedRange::SendAll(std::vector<ShardCore::Outgoing>* out) {
  for (ShardCore::Outgoing& o : *out) {
    if (o.to_shard != 0) {
      auto b = backups.find(o.to_shard);
      if (b == backups.end()) continue;
      absl::Status st = b->second.socket->Send(std::move(o.frames));
      if (!st.ok()) {
        SPDLOG_DEBUG("shard {}: record to {} dropped: {}", shard, o.to_shard, ErrorText(st));
      }
      continue;
    }
    o.frames.insert(o.frames.begin(), o.peer);
    absl::Status st = router->Send(std::move(o.frames));
    if (!st.ok()) SPDLOG_DEBUG("shard {}: reply dropped: {}", shard, ErrorText(st));
  }
  out->clear();
}

std::vector<uint32_t> ServedRange::ConnectBackups(Transport* transport,
                                                  const std::vector<msg::ShardInfo>& infos,
                                                  const std::vector<uint32_t>& ids) {
  std::map<uint32_t, BackupSocket> kept;
  std::vector<uint32_t> connected;
  for (uint32_t id : ids) {
    auto b = std::find_if(infos.begin(), infos.end(),
                          [&](const msg::ShardInfo& x) { return x.id == id; });
    if (b == infos.end()) continue;
    auto it = backups.find(b->id);
    if (it != backups.end() && it->second.address == b->address) {
      kept[b->id] = std::move(it->second);
    } else {
      // Under CURVE the backup is authenticated by its server key, and
      // knows this shard by its own (the sender-key binding).
      if (!b->public_key.empty()) transport->SetServerKey(b->address, b->public_key);
      auto socket = transport->Connect(b->address);
      if (!socket.ok()) {
        spdlog::warn("shard {}: cannot connect to backup {} at {}: {}", shard, b->id, b->address,
                     ErrorText(socket.status()));
        continue;
      }
      kept[b->id] = {b->address, std::move(*socket)};
    }
    connected.push_back(b->id);
  }
  backups = std::move(kept);
  return connected;
}

void ServedRange::SetBackups(Transport* transport, const std::vector<msg::ShardInfo>& infos,
                             const std::vector<uint32_t>& ids, uint64_t epoch, bool hold,
                             std::vector<ShardCore::Outgoing>* out) {
  std::vector<uint32_t> connected = ConnectBackups(transport, infos, ids);
  if (hold) core->SetDurableHold(true);
  core->SetReplicaSet(epoch, std::move(connected), out);
  if (!hold) core->SetDurableHold(false);
  SendAll(out);
}

void ServedRange::Depose(uint64_t epoch, std::vector<ShardCore::Outgoing>* out) {
  core->Depose(epoch);
  core->SetReplicaSet(0, {}, out);
  SendAll(out);
}

absl::Status ServedRange::Checkpoint(const CheckpointPolicy& policy, bool final,
                                     TimePoint deadline, const Clock* clock) {
  if (!writer) return absl::OkStatus();
  CheckpointProgress& p = checkpointed;
  writer->AgeSeconds();
  if (!core->initialized()) return absl::OkStatus();  // nothing worth keeping yet
  if (final) {
    const std::string what = own() ? "" : " of shard " + std::to_string(range) + "'s range";
    const TimePoint t0 = clock->Now();
    ShardSnapshot snap = core->Snapshot();
    snap.taken_unix = UnixSeconds();
    absl::Status st = writer->Final(std::move(snap), deadline);
    if (!st.ok()) {
      const std::string why =
          "final checkpoint" + what + " at applied clock " + std::to_string(core->applied_clock()) +
          " given up after " + absl::StrFormat("%.1f", ToSeconds(policy.stop_timeout)) +
          " s (--stop-timeout): " + std::string(st.message()) + "; the previous checkpoint stays";
      spdlog::error("shard {}: {}", shard, why);
      return absl::DeadlineExceededError(why);
    }
    spdlog::info("shard {}: final checkpoint{} at applied clock {} in {:.3f} s", shard, what,
                 core->applied_clock(), ToSeconds(clock->Now() - t0));
    return absl::OkStatus();
  }
  const bool keys_moved = core->key_version() != p.keys;
  if (core->updates_applied() == p.updates && core->applied_clock() == p.clock && !keys_moved) {
    return absl::OkStatus();  // nothing new since the last one
  }
  const TimePoint now = clock->Now();
  // Keys that moved in or out: at once, so that a restart has the new set.
  const bool on_time = keys_moved || (policy.interval > Duration::zero() &&
                                      now - p.last >= policy.interval);
  const bool on_count =
      policy.updates > 0 && core->updates_applied() - p.updates >= policy.updates;
  if (!on_time && !on_count) return absl::OkStatus();
  if (!keys_moved && !policy.periodic && p.periodic_taken > 0) return absl::OkStatus();
  if (!keys_moved) ++p.periodic_taken;
  // Shares the buffers: the copy-free hand-over that keeps this cheap.
  ShardSnapshot snap = core->Snapshot();
  snap.taken_unix = UnixSeconds();
  if (!writer->Offer(std::move(snap))) {
    return absl::OkStatus();  // the previous one is still being written
  }
  p.last = now;
  p.updates = core->updates_applied();
  p.clock = core->applied_clock();
  p.keys = core->key_version();
  return absl::OkStatus();
}

}  // namespace pacer
