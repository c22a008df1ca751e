// A shard's metrics (pacer_shard_*), registered in one place: ShardCore
// sets ShardMetrics, its checkpoint writer CheckpointMetrics.
#ifndef PACER_PS_SHARD_METRICS_H_
#define PACER_PS_SHARD_METRICS_H_

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "ps/base/clock.h"

namespace pacer {

struct ShardMetrics {
  // Every series carries `extra` beside its own labels: none for a shard's
  // own range; range="<id>" for a range it serves since a promotion, so
  // that both cores' series live in one registry.
  ShardMetrics(prometheus::Registry& r, const prometheus::Labels& extra);

  prometheus::Histogram* push_seconds = nullptr;
  prometheus::Histogram* pull_seconds = nullptr;
  prometheus::Histogram* pull_wait = nullptr;
  prometheus::Counter* push = nullptr;
  prometheus::Counter* pull = nullptr;
  prometheus::Counter* push_bytes = nullptr;
  prometheus::Counter* pull_bytes = nullptr;
  prometheus::Counter* steps = nullptr;
  prometheus::Counter* incomplete = nullptr;
  prometheus::Counter* updates = nullptr;
  prometheus::Gauge* model_updates = nullptr;
  prometheus::Counter* dropped = nullptr;
  prometheus::Counter* duplicates = nullptr;
  prometheus::Counter* push_parts = nullptr;
  prometheus::Counter* grants = nullptr;
  prometheus::Counter* lost = nullptr;
  prometheus::Histogram* staleness = nullptr;
  prometheus::Gauge* clock = nullptr;
  prometheus::Gauge* keys = nullptr;
  prometheus::Gauge* live = nullptr;
  prometheus::Gauge* parked = nullptr;
  // Replication (--replicas): as a primary, and as a backup.
  prometheus::Counter* records = nullptr;
  prometheus::Counter* seeds = nullptr;
  // Payload bytes sent to backups (each backup's copy counted), of records
  // and of seeds.
  prometheus::Counter* record_bytes = nullptr;
  prometheus::Counter* seed_bytes = nullptr;
  prometheus::Gauge* backups = nullptr;
  prometheus::Gauge* lag = nullptr;
  prometheus::Gauge* lag_seconds = nullptr;
  prometheus::Gauge* replicas = nullptr;
  prometheus::Counter* checks = nullptr;
  prometheus::Counter* mismatches = nullptr;
  prometheus::Counter* stale_epochs = nullptr;
};

// A shard's checkpoint series (pacer_shard_checkpoint_*, --data-dir only),
// registered by its CheckpointWriter; `interval` is reported as set. Every
// series carries `extra`, as ShardMetrics' do (range="<id>" for a range
// served since a promotion, which is checkpointed apart).
struct CheckpointMetrics {
  CheckpointMetrics(prometheus::Registry& r, Duration interval, const prometheus::Labels& extra);

  prometheus::Histogram* seconds = nullptr;
  prometheus::Gauge* bytes = nullptr;
  prometheus::Gauge* age = nullptr;
  prometheus::Gauge* last = nullptr;
  prometheus::Counter* ok = nullptr;
  prometheus::Counter* failed = nullptr;
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_METRICS_H_
