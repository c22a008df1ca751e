// The backup's side of replication (the monitor's --replicas): the replicas
// a shard holds of other shards' ranges, built from their primaries' seeds
// and records, checked against the primaries' CRCs, and what a promotion
// restores from. One of ShardCore's rooms (ps/shard.h): the core hands it
// the Replicate messages and the monitor's list of ranges to back up. No
// sockets; the core's one thread.
#ifndef PACER_PS_REPLICA_HOLDER_H_
#define PACER_PS_REPLICA_HOLDER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/applied_ledger.h"
#include "ps/base/messages.h"
#include "ps/base/server_core.h"
#include "ps/checkpoint.h"
#include "ps/shard_metrics.h"
#include "ps/shard_range.h"
#include "ps/table.h"

namespace pacer {

class ReplicaHolder {
 public:
  // A range this shard backs up: its epoch and its primary's CURVE key
  // (empty without transport security).
  struct BackedRange {
    uint64_t epoch = 0;
    std::string public_key;
  };
  // One replica as an audit sees it.
  struct View {
    uint64_t epoch = 0, record = 0;
    bool last = false;  // its primary's last record came
    uint32_t crc = 0;
    const AppliedLedger* ledger = nullptr;
  };

  ReplicaHolder(ServerCore* server, ShardMetrics* metrics) : server_(server), metrics_(metrics) {}
  // The shard's id and the job's optimizer (a seed's table takes it).
  void Configure(uint32_t shard_id, const TableConfig& optimizer) {
    shard_id_ = shard_id;
    optimizer_ = optimizer;
  }

  // The ranges to hold replicas of, by their primary's id. Replicas of
  // ranges no longer listed are dropped; records of a range not listed, or
  // of a lower epoch than listed, are refused.
  void SetBacking(std::map<uint32_t, BackedRange> ranges);
  // The CURVE key the primary `id` of a backed range comes with (null: not
  // a primary whose range this shard backs up).
  const std::string* PrimaryKey(uint32_t id) const;
  // A primary's seed or record: taken (its steps applied to the replica) or
  // refused, and answered.
  void OnReplicate(const Frame& peer, const Decoded& d, std::vector<ShardOutgoing>* out);

  // The replicas held: range -> the record held through, or -> epoch (the
  // monitor promotes only a replica of the range's current epoch).
  std::map<uint32_t, uint64_t> records() const;
  std::map<uint32_t, uint64_t> epochs() const;
  // Replica `range`: null / 0 / empty when none is held.
  const ParamTable* table(uint32_t range) const;
  uint64_t record(uint32_t range) const;
  std::map<uint32_t, uint64_t> marks(uint32_t range) const;
  // Every replica held got its primary's last record.
  bool final() const;
  std::map<uint32_t, View> views() const;
  uint64_t checks() const { return checks_; }
  uint64_t mismatches() const { return mismatches_; }
  // Replica `range` as a snapshot a new core of that range restores from
  // (a promotion): the table, applied clock, steps and each worker's last
  // applied push seq; nullopt when none is held.
  std::optional<ShardSnapshot> Snapshot(uint32_t range, uint64_t job_id,
                                        uint64_t map_version) const;

 private:
  struct Replica {
    std::unique_ptr<ParamTable> table;
    uint64_t epoch = 0;
    uint64_t record = 0;
    int64_t applied_clock = -1;
    uint64_t steps = 0;
    std::map<uint32_t, uint64_t> marks;
    AppliedLedger ledger;
    bool last = false;  // the primary's last record came
  };
  // A seed: the replica of its range afresh; the reason it is refused, or
  // empty.
  std::string TakeSeed(const msg::Replicate& m, std::span<const float> values, Replica* r);
  // A record's steps, every one checked before any is applied: the reason
  // it is refused, or empty.
  std::string TakeRecord(const msg::Replicate& m, std::span<const float> values, Replica* r);
  void ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                  const std::string& reason, std::vector<ShardOutgoing>* out) {
    out->push_back({peer, server_->Error(to, code, reason)});
  }

  ServerCore* const server_;
  ShardMetrics* const metrics_;
  uint32_t shard_id_ = 0;
  TableConfig optimizer_;
  std::map<uint32_t, BackedRange> backing_;
  std::map<uint32_t, Replica> replicas_;
  uint64_t checks_ = 0;
  uint64_t mismatches_ = 0;
};

}  // namespace pacer

#endif  // PACER_PS_REPLICA_HOLDER_H_
