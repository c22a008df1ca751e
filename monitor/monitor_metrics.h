// The monitor's metrics (pacer_monitor_*, pacer_training_*), registered in
// one place; MonitorCore sets them.
#ifndef PACER_MONITOR_MONITOR_METRICS_H_
#define PACER_MONITOR_MONITOR_METRICS_H_

#include <map>
#include <string>

#include "monitor/policy.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace pacer {

struct MonitorMetrics {
  explicit MonitorMetrics(prometheus::Registry& r);

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
};

}  // namespace pacer

#endif  // PACER_MONITOR_MONITOR_METRICS_H_
