#include "monitor/range_table.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace pacer {

bool RangeTable::Backs(size_t i, uint32_t shard) const {
  const RangeState& r = ranges_[i];
  return std::count(r.backups.begin(), r.backups.end(), shard) > 0 ||
         std::count(r.standby.begin(), r.standby.end(), shard) > 0;
}

void RangeTable::Add(uint32_t id) {
  index_[id] = ranges_.size();
  RangeState r;
  r.id = id;
  ranges_.push_back(std::move(r));
}

void RangeTable::Build(const std::vector<KeyRange>& keys) {
  for (size_t i = 0; i < ranges_.size(); ++i) {
    ranges_[i].begin = i < keys.size() ? keys[i].begin : 0;
    ranges_[i].end = i < keys.size() ? keys[i].end : 0;
    ranges_[i].epoch = NextEpoch();
  }
  built_ = true;
  Bump("built");  // v1
}

void RangeTable::Bump(std::string_view why) {
  ++version_;
  metrics_->ShowMapVersion(*this);
  journal_->Mark();
  SPDLOG_DEBUG("shard map v{}: {}", version_, why);
  (void)why;
}

void RangeTable::Save(MonitorRecord* r) const {
  r->map_built = built_;
  r->map_version = version_;
  r->epoch = epoch_;
  for (size_t i = 0; i < ranges_.size() && i < r->shards.size(); ++i) {
    const RangeState& s = ranges_[i];
    MonitorRecord::Shard& m = r->shards[i];
    m.key_begin = s.begin;
    m.key_end = s.end;
    m.backups = s.backups;
    m.epoch = s.epoch;
    m.host = s.host;
    m.served_at = s.served_at;
    m.standby = s.standby;
    m.promoted_from = s.promoted_from;
  }
}

void RangeTable::Restore(const MonitorRecord& r) {
  ranges_.clear();
  index_.clear();
  built_ = r.map_built;
  version_ = r.map_version;
  epoch_ = r.epoch;
  for (const MonitorRecord::Shard& m : r.shards) {
    RangeState s;
    s.id = m.id;
    s.begin = m.key_begin;
    s.end = m.key_end;
    s.backups = m.backups;
    s.epoch = m.epoch;
    s.host = m.host;
    s.served_at = m.served_at;
    s.standby = m.standby;
    s.promoted_from = m.promoted_from;
    index_[s.id] = ranges_.size();
    ranges_.push_back(std::move(s));
  }
  if (built_) metrics_->ShowMapVersion(*this);
}

}  // namespace pacer
