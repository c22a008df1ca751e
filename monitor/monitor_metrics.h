// The monitor's metrics (pacer_monitor_*, pacer_training_*), registered in
// one place. Counters count where their events happen; the gauges are read
// here from the managers' views (the Show* calls).
#ifndef PACER_MONITOR_MONITOR_METRICS_H_
#define PACER_MONITOR_MONITOR_METRICS_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "monitor/policy.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace pacer {

class DataFeed;
class Membership;
class RangeTable;
class ShardRegistry;

struct MonitorMetrics {
  explicit MonitorMetrics(prometheus::Registry& r);

  // pacer_monitor_shards, pacer_monitor_shards_up.
  void ShowShards(const ShardRegistry& shards);
  // The replica sets: wanted, each range's backups, the ranges short of K.
  void ShowReplicas(const RangeTable& ranges, uint32_t replicas, size_t under_replicated);
  // pacer_monitor_membership_version and pacer_monitor_live_workers.
  void ShowMembership(const Membership& members);
  // pacer_monitor_shard_map_version.
  void ShowMapVersion(const RangeTable& ranges);
  // The last evaluation: pacer_training_test_accuracy_ratio and its loss.
  void ShowEvaluation(double accuracy, double loss);
  // One worker's assigned batch (its series goes when the worker does).
  void ShowBatch(uint32_t rank, uint32_t batch);
  // pacer_monitor_policy_rounds_total up to the policy's own counts.
  void ShowRounds(const policy::StragglerPolicy& policy);
  // The job's state, the data stream's, the per-worker series (straggler
  // score, clock lag, speed, fitted costs) of the live workers (a departed
  // worker's are removed) and the per-shard ones.
  void ShowJob(const char* state, const Membership& members, const policy::StragglerPolicy& policy,
               const DataFeed& data, const ShardRegistry& shards);

  prometheus::Gauge* live_workers = nullptr;
  prometheus::Gauge* shards = nullptr;
  prometheus::Gauge* shards_up = nullptr;
  prometheus::Gauge* map_version = nullptr;
  prometheus::Counter* shard_restarts = nullptr;
  prometheus::Gauge* membership = nullptr;
  prometheus::Gauge* accuracy = nullptr;
  prometheus::Counter* dead = nullptr;
  prometheus::Counter* decisions = nullptr;
  prometheus::Family<prometheus::Gauge>* batch = nullptr;
  prometheus::Family<prometheus::Gauge>* straggler = nullptr;
  prometheus::Family<prometheus::Gauge>* fixed_cost = nullptr;
  prometheus::Family<prometheus::Gauge>* sample_cost = nullptr;
  prometheus::Counter* rounds[static_cast<size_t>(policy::RoundReason::kCount)] = {};
  prometheus::Family<prometheus::Gauge>* lag = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_sps = nullptr;
  prometheus::Family<prometheus::Gauge>* worker_clock = nullptr;
  prometheus::Family<prometheus::Gauge>* shard_up = nullptr;
  prometheus::Family<prometheus::Gauge>* shard_clock = nullptr;
  prometheus::Family<prometheus::Gauge>* shard_ckpt_age = nullptr;
  // Replica sets (--replicas): backups wanted per range, each range's live
  // backups (by its primary's shard id), and the ranges short of K.
  prometheus::Gauge* replicas_wanted = nullptr;
  prometheus::Family<prometheus::Gauge>* range_backups = nullptr;
  prometheus::Gauge* under_replicated = nullptr;
  // By reason: "lease" (the primary missed its shard lease), "restart"
  // (it registered again as a new process within its lease), "drain"
  // (pacerctl drain-shard handed the range to its backup).
  prometheus::Counter* failovers = nullptr;
  prometheus::Counter* restart_failovers = nullptr;
  prometheus::Counter* handoffs = nullptr;
  prometheus::Counter* backups_dropped = nullptr;
  prometheus::Gauge* test_loss = nullptr;
  prometheus::Counter* accuracy_reports = nullptr;
  // The data stream (the default): the job's epoch and its trained
  // fraction, chunks by event (handed_out, taken_over: a tail handed to
  // another worker, returned: given back by a worker that left), samples
  // each worker trained in the current epoch, and the last ended epoch's
  // tail (from the first worker left with nothing of it to its end).
  prometheus::Gauge* data_epoch = nullptr;
  prometheus::Gauge* data_epoch_progress = nullptr;
  std::map<std::string, prometheus::Counter*> data_chunks;
  prometheus::Family<prometheus::Gauge>* data_samples = nullptr;
  prometheus::Gauge* data_tail = nullptr;
  std::map<std::string, prometheus::Counter*> membership_changes;
  std::map<std::string, prometheus::Gauge*> state;

 private:
  void ShowStream(const DataFeed& data, const Membership& members);

  // What the gauges and counters already show.
  uint64_t rounds_counted_[static_cast<size_t>(policy::RoundReason::kCount)] = {};
  uint64_t counted_handed_out_ = 0, counted_taken_over_ = 0, counted_returned_ = 0;
  std::set<uint32_t> gauged_ranks_;         // ranks with per-worker series
  std::set<uint32_t> gauged_stream_ranks_;  // ranks with a data-samples series
};

}  // namespace pacer

#endif  // PACER_MONITOR_MONITOR_METRICS_H_
