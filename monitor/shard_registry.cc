#include "monitor/shard_registry.h"

#include <algorithm>
#include <string_view>

#include "spdlog/spdlog.h"

namespace pacer {

std::optional<size_t> ShardRegistry::AtAddress(const std::string& address) const {
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (shards_[i].address == address) return i;
  }
  return std::nullopt;
}

std::vector<uint32_t> ShardRegistry::Ids() const {
  std::vector<uint32_t> ids;
  for (const ShardProcess& s : shards_) ids.push_back(s.id);
  return ids;
}

std::string ShardRegistry::HostOf(size_t i) const {
  const ShardProcess& s = shards_[i];
  if (!s.node.empty()) return s.node;
  // tcp://HOST:PORT (HOST may be [v6]).
  std::string_view a = s.address;
  if (auto p = a.find("://"); p != std::string_view::npos) a.remove_prefix(p + 3);
  if (auto p = a.rfind(':'); p != std::string_view::npos) a = a.substr(0, p);
  return std::string(a);
}

ShardProcess& ShardRegistry::Add(ShardProcess s) {
  index_[s.id] = shards_.size();
  shards_.push_back(std::move(s));
  journal_->Mark();
  UpdateGauges();
  return shards_.back();
}

bool ShardRegistry::ExpireLeases(TimePoint now, Duration lease) {
  bool any = false;
  for (ShardProcess& s : shards_) {
    if (!s.down && !s.drained && now - s.last_seen > lease) {
      s.down = true;
      any = true;
      spdlog::warn("shard {} at {} silent for {:.1f} s; marked down", s.id, s.address,
                   ToSeconds(now - s.last_seen));
    }
  }
  if (any) UpdateGauges();
  return any;
}

void ShardRegistry::SetDown(size_t i, bool down) {
  shards_[i].down = down;
  UpdateGauges();
}

void ShardRegistry::Returned(size_t i) {
  shards_[i].replicas.clear();
  for (const auto& listener : on_return_) listener(i);
}

void ShardRegistry::UpdateGauges() { metrics_->ShowShards(*this); }

void ShardRegistry::Save(MonitorRecord* r) const {
  for (const ShardProcess& s : shards_) {
    MonitorRecord::Shard& m = r->shards.emplace_back();
    m.id = s.id;
    m.address = s.address;
    m.incarnation = s.incarnation;
    m.applied_clock = s.applied_clock;
    m.restarts = s.restarts;
    m.drained = s.drained;
    m.public_key = s.public_key;
    m.node = s.node;
    m.retired = s.retired;
  }
}

void ShardRegistry::Restore(const MonitorRecord& r, TimePoint now) {
  shards_.clear();
  index_.clear();
  for (const MonitorRecord::Shard& m : r.shards) {
    ShardProcess s;
    s.id = m.id;
    s.address = m.address;
    s.incarnation = m.incarnation;
    s.public_key = m.public_key;
    s.applied_clock = m.applied_clock;
    s.restarts = m.restarts;
    s.drained = m.drained;
    s.node = m.node;
    s.retired = m.retired;
    s.last_seen = now;  // a fresh lease
    index_[s.id] = shards_.size();
    shards_.push_back(std::move(s));
  }
  UpdateGauges();
}

}  // namespace pacer
