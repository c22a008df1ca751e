// Replicated key ranges (--replicas K): where each range's backups go,
// failover and promotion when a primary is down or restarted, standbys for
// backups that fell behind, the hand-over of pacerctl drain-shard, and what
// each shard's heartbeat reply says of the ranges it serves and backs up.
// It changes the range table (monitor/range_table.h) and reads the shard
// registry. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_REPLICATION_H_
#define PACER_MONITOR_REPLICATION_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "monitor/journal.h"
#include "monitor/monitor_metrics.h"
#include "monitor/range_table.h"
#include "monitor/shard_registry.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

class Replication {
 public:
  struct Options {
    uint32_t replicas = 0;  // K
    Duration shard_lease = std::chrono::seconds(1);
  };
  Replication(const Options& options, const Clock* clock, ShardRegistry* shards,
              RangeTable* ranges, Journal* journal, MonitorMetrics* metrics)
      : options_(options), clock_(clock), shards_(shards), ranges_(ranges), journal_(journal),
        metrics_(metrics) {}

  // Gives every range up to K backups: live shards other than its primary,
  // not on the primary's host nor on a host one of its backups has while
  // another is left, the fewest ranges held or backed first. A backup stays
  // while it is live. True when a set changed (then the map's version goes
  // up and the state is saved before it goes out).
  bool Assign();
  // Failover: a range whose primary is down goes to a live backup that
  // reported a replica of its epoch, at a new epoch; true when one did.
  // The backup learns it from its heartbeat reply (promote) and reports
  // the address it serves the range at (the map changes then).
  bool FailOver();
  // Shard `at` registered again as a new process (from its checkpoints):
  // each range it was the primary of goes to a backup that holds it, as if
  // the shard had died (it restarted within its lease); a range with none
  // is served from the checkpoint, unless it was promoted to the shard and
  // not served yet (then back to the last that served it). Ranges promoted
  // away from it to a shard lost before serving them come back to it.
  void OnShardRestarted(size_t at);
  // Shard `at`'s heartbeat: the ranges it serves since a promotion (where)
  // and their replication lag.
  void TakeHeartbeat(size_t at, const msg::Heartbeat& hb);
  // Its reply: ranges it serves that another shard serves now, the backups
  // it reported falling behind, a drain's progress (`moving`: a shard move
  // is in progress), what it serves and backs up; a retired shard is told
  // to stop.
  void FillHeartbeatReply(size_t at, const msg::Heartbeat& hb, bool moving,
                          msg::HeartbeatReply* reply);

  // pacerctl drain-shard: whether range i can be handed to a backup (its
  // primary is live and serves only it, and a backup holds it), and the
  // start of that hand-over.
  bool CanHandOff(size_t i) const;
  void StartHandoff(size_t i);
  bool handing_off() const { return handoff_.has_value(); }

  uint64_t failovers() const { return failovers_; }
  // Ranges with fewer than K backups (pacer_monitor_ranges_under_replicated).
  size_t under_replicated() const { return under_replicated_; }
  // A range's lag in pacerctl status comes from its primary's heartbeat
  // (every 0.2 s by default) of at most this age; older: not known.
  static constexpr Duration kLagReportAge = std::chrono::seconds(3);

 private:
  // Range i was promoted to a shard that is lost (`why`) before it served
  // the range: it goes back to the last shard that served it
  // (promoted_from), at a new epoch; to one that is down too only with
  // `to_down`. False when there is none or the range was served.
  bool RevertUnservedPromotion(size_t i, const std::string& why, bool to_down);
  // A live backup of range i, not being drained, that reported a replica of
  // the range's current epoch (nullopt: none can take it over); with
  // `standby`, a standby when no backup in the set can (a failover may use
  // one; a drain, whose backups must hold its last record, may not).
  std::optional<uint32_t> InSyncBackup(size_t i, bool standby = false) const;
  // Drops range i's standbys that are gone or no longer needed.
  bool PruneStandby(size_t i);
  // Gives range i to a live backup that reported a replica of its current
  // epoch, at a new epoch (saved before anyone hears of it); `reason` is
  // logged, and counted as a drain, a restart (`restarted`) or a lease
  // expiry. False when no backup can.
  bool PromoteBackup(size_t i, const std::string& reason, bool restarted = false);
  // The drain of range i: hands the range over when its primary has
  // stopped and its backups hold all it applied.
  void StepHandoff(size_t i, bool handed_off);
  // A primary (shard index `from`) reports backups that fall behind: each
  // leaves its range's set (and is not given that range again for
  // kLagCooldown), kept as a standby; the range gets another where a shard
  // is free.
  void DropLagging(size_t from, const std::vector<msg::ShardInfo>& lagging);
  // Shard `host` reports the addresses it serves promoted ranges at.
  void TakeServing(const ShardProcess& host, const std::vector<msg::ShardInfo>& serving);
  // To shard i's heartbeat reply: its range's epoch and backups, the
  // ranges it serves since a failover, and the ranges it backs up.
  void FillReply(size_t i, msg::HeartbeatReply* reply) const;
  // The shard serving range i (its index in the registry).
  size_t PrimaryIndex(size_t i) const;
  bool usable(size_t shard) const {
    return shards_->Serving(shard) && !(handoff_ && handoff_->shard == shard);
  }
  void UpdateGauges() { metrics_->ShowReplicas(*ranges_, options_.replicas, under_replicated_); }

  static constexpr Duration kLagCooldown = std::chrono::seconds(60);
  // A drain whose primary has not handed its range over by then is given up.
  static constexpr Duration kHandoffTimeout = std::chrono::seconds(60);

  const Options options_;
  const Clock* const clock_;
  ShardRegistry* const shards_;
  RangeTable* const ranges_;
  Journal* const journal_;
  MonitorMetrics* const metrics_;
  // pacerctl drain-shard with --replicas: the primary at `shard` is asked
  // (HeartbeatReply.hand_off) to stop applying pushes and make its backups
  // hold everything it applied; once it says so (Heartbeat.handed_off) a
  // backup is promoted at once, with no lease to wait for.
  struct Handoff {
    size_t shard = 0;
    TimePoint started{};
    TimePoint reported{};  // the last "still waiting" log
  };
  std::optional<Handoff> handoff_;
  // Shards whose drain was given up (kHandoffTimeout): their heartbeat
  // replies say so (hand_off_given_up) until they are drained again.
  std::set<uint32_t> handoff_given_up_;
  uint64_t failovers_ = 0;
  size_t under_replicated_ = 0;  // ranges short of K, as last logged
};

}  // namespace pacer

#endif  // PACER_MONITOR_REPLICATION_H_
