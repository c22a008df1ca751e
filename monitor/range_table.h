// The shard map as the monitor keeps it: one key range per registered
// shard, named after it and at its index in the shard registry (a shard
// that registered after the map was built starts with none). Each range
// has its keys, its epoch (up whenever its primary or keys change), its
// primary (the shard it is named after, or after a failover the backup it
// went to), its backups and standbys (--replicas) and its replication lag.
// The map's version moves in one place, Bump. No sockets; the monitor's
// one thread.
#ifndef PACER_MONITOR_RANGE_TABLE_H_
#define PACER_MONITOR_RANGE_TABLE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "monitor/journal.h"
#include "monitor/monitor_metrics.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"
#include "ps/partition.h"

namespace pacer {

struct RangeState {
  uint32_t id = 0;  // the shard it is named after
  uint64_t begin = 0, end = 0;
  uint64_t epoch = 0;
  // After a failover: the shard that serves the range now (0: the one it
  // is named after), the address it serves it at ("" until it reports
  // it), and when the range went to it.
  uint32_t host = 0;
  std::string served_at;
  TimePoint failed_over_at{};
  // The last shard that served the range before the current promotion,
  // until the promoted shard reports serving it (0: none). If that shard
  // is lost before it does (no worker had its address for the range, so
  // it acknowledged nothing of it) and no backup reports holding the
  // range, the range goes back to this one: at once if it is live (its
  // state has everything it acknowledged), else when it returns (its
  // checkpoint is what is left).
  uint32_t promoted_from = 0;
  // Its replica set (--replicas): the backups' shard ids.
  std::vector<uint32_t> backups;
  // Backups dropped from the set for falling behind, each until when it is
  // not given the range again.
  std::map<uint32_t, TimePoint> lag_dropped;
  // Those of them that still hold the range's replica, kept (told to back
  // the range, sent no records) until a backup in the set holds a replica
  // of the range's epoch: everything durable when one was dropped is in
  // its replica, so a primary lost meanwhile fails over to it instead of
  // back to a checkpoint.
  std::vector<uint32_t> standby;
  // The replication lag as the primary last reported it (in its
  // heartbeat), and when: pacerctl status shows it while it is recent and
  // of the range's epoch.
  msg::RangeLag lag;
  TimePoint lag_at{};

  bool holds_keys() const { return begin != end; }
  // The shard serving it: the one it is named after, or its host.
  uint32_t primary() const { return host != 0 ? host : id; }
};

class RangeTable {
 public:
  RangeTable(Journal* journal, MonitorMetrics* metrics) : journal_(journal), metrics_(metrics) {}

  size_t size() const { return ranges_.size(); }
  RangeState& operator[](size_t i) { return ranges_[i]; }
  const RangeState& operator[](size_t i) const { return ranges_[i]; }

  // The range named after shard `id` (nullopt: none).
  std::optional<size_t> Index(uint32_t id) const {
    auto it = index_.find(id);
    if (it == index_.end()) return std::nullopt;
    return it->second;
  }
  // Whether range i holds keys (false: an idle shard's, outside the map,
  // or one whose keys moved away).
  bool HoldsKeys(size_t i) const { return built_ && i < ranges_.size() && ranges_[i].holds_keys(); }
  // Whether shard `shard` is a backup or standby of range i.
  bool Backs(size_t i, uint32_t shard) const;

  // A newly registered shard's range: empty (idle until pacerctl add-shard).
  void Add(uint32_t id);
  // The first map: range i gets keys[i] and an epoch; the version is 1.
  void Build(const std::vector<KeyRange>& keys);
  bool built() const { return built_; }
  uint64_t version() const { return version_; }
  // The shard map changed (a range's address, key, backups or keys): its
  // version goes up (the gauge with it), and the state is saved before the
  // new map goes out. The one place the version moves; `why` is logged at
  // debug.
  void Bump(std::string_view why);
  // A new epoch for a range whose primary or keys change.
  uint64_t NextEpoch() { return ++epoch_; }

  // Its part of the monitor's saved state: the range fields of each entry
  // the shard registry wrote into r->shards, and the map's version.
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r);

 private:
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  std::vector<RangeState> ranges_;
  std::map<uint32_t, size_t> index_;  // id -> index in ranges_
  bool built_ = false;
  uint64_t version_ = 0;
  uint64_t epoch_ = 0;  // the last range epoch given
};

}  // namespace pacer

#endif  // PACER_MONITOR_RANGE_TABLE_H_
