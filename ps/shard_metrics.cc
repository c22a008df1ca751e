#include "ps/shard_metrics.h"

namespace pacer {

ShardMetrics::ShardMetrics(prometheus::Registry& r, const prometheus::Labels& extra) {
  // Each series with the core's own labels (a promoted range's: range).
  const auto L = [&](prometheus::Labels labels) {
    labels.insert(extra.begin(), extra.end());
    return labels;
  };
  auto& reqs = prometheus::BuildCounter()
                   .Name("pacer_shard_requests_total")
                   .Help("Push and pull requests served")
                   .Register(r);
  push = &reqs.Add(L({{"op", "push"}}));
  pull = &reqs.Add(L({{"op", "pull"}}));
  auto& bytes = prometheus::BuildCounter()
                    .Name("pacer_shard_payload_bytes_total")
                    .Help("Payload bytes received (push) and sent (pull)")
                    .Register(r);
  push_bytes = &bytes.Add(L({{"op", "push"}}));
  pull_bytes = &bytes.Add(L({{"op", "pull"}}));
  steps = &prometheus::BuildCounter()
               .Name("pacer_shard_steps_total")
               .Help("Optimizer steps taken (one per closed clock in BSP)")
               .Register(r)
               .Add(L({}));
  incomplete = &prometheus::BuildCounter()
                    .Name("pacer_shard_incomplete_steps_total")
                    .Help(
                        "BSP steps whose pushes differ from the live set at close: they include "
                        "pushes from workers that have since left")
                    .Register(r)
                    .Add(L({}));
  updates = &prometheus::BuildCounter()
                 .Name("pacer_shard_updates_applied_total")
                 .Help("Worker pushes folded into the parameters")
                 .Register(r)
                 .Add(L({}));
  model_updates = &prometheus::BuildGauge()
                       .Name("pacer_shard_model_updates")
                       .Help(
                           "Pushes applied to this shard's parameters (or to a clock "
                           "still open), those restored from its checkpoint included; a "
                           "restart starts from the checkpoint's count, without the pushes "
                           "it lost")
                       .Register(r)
                       .Add(L({}));
  dropped = &prometheus::BuildCounter()
                 .Name("pacer_shard_dropped_pushes_total")
                 .Help("Backup mode: pushes that arrived after their clock closed, dropped")
                 .Register(r)
                 .Add(L({}));
  duplicates = &prometheus::BuildCounter()
                    .Name("pacer_shard_duplicate_pushes_total")
                    .Help("Pushes received again (retries), acknowledged and not applied")
                    .Register(r)
                    .Add(L({}));
  push_parts = &prometheus::BuildCounter()
                    .Name("pacer_shard_push_parts_total")
                    .Help(
                        "Messages that carried one part of a push sent in parts (layer-wise "
                        "push); a push in one message is not counted")
                    .Register(r)
                    .Add(L({}));
  lost = &prometheus::BuildCounter()
              .Name("pacer_shard_lost_updates_total")
              .Help(
                  "Acknowledged pushes a restored shard lost: applied after its last "
                  "checkpoint (counted from each worker's push sequence)")
              .Register(r)
              .Add(L({}));
  grants = &prometheus::BuildCounter()
                .Name("pacer_shard_dssp_extra_iterations_total")
                .Help("DSSP: sum of r* over the reads that went past their lower bound s_L")
                .Register(r)
                .Add(L({}));
  staleness = &prometheus::BuildHistogram()
                   .Name("pacer_shard_push_staleness_steps")
                   .Help("Steps a pushed gradient's parameters were behind the step it joins")
                   .Register(r)
                   .Add(L({}), prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16});
  auto& latency = prometheus::BuildHistogram()
                      .Name("pacer_shard_request_duration_seconds")
                      .Help(
                          "From a request's arrival to its reply being queued (a pull's wait "
                          "on the consistency rule included)")
                      .Register(r);
  const prometheus::Histogram::BucketBoundaries latency_buckets{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  push_seconds = &latency.Add(L({{"op", "push"}}), latency_buckets);
  pull_seconds = &latency.Add(L({{"op", "pull"}}), latency_buckets);
  pull_wait = &prometheus::BuildHistogram()
                   .Name("pacer_shard_pull_wait_seconds")
                   .Help(
                       "Time a pull waited on the consistency rule (BSP barrier, SSP/DSSP "
                       "bound) before its answer")
                   .Register(r)
                   .Add(L({}), latency_buckets);
  clock = &prometheus::BuildGauge()
               .Name("pacer_shard_applied_clock")
               .Help("Highest clock whose step has been applied (-1: none)")
               .Register(r)
               .Add(L({}));
  clock->Set(-1);
  keys = &prometheus::BuildGauge()
              .Name("pacer_shard_keys")
              .Help("Keys (tensor blocks) held by this shard")
              .Register(r)
              .Add(L({}));
  records = &prometheus::BuildCounter()
                 .Name("pacer_shard_replication_records_total")
                 .Help(
                     "Records this primary sent its range's backups: the steps applied since "
                     "the previous one, after aggregation (--replicas)")
                 .Register(r)
                 .Add(L({}));
  seeds = &prometheus::BuildCounter()
               .Name("pacer_shard_replication_seeds_total")
               .Help("Whole copies of its range this primary sent to a backup new to the set")
               .Register(r)
               .Add(L({}));
  auto& replicated = prometheus::BuildCounter()
                         .Name("pacer_shard_replication_bytes_total")
                         .Help(
                             "Payload bytes (gradients or state) this primary sent its range's "
                             "backups, each backup's copy counted: in records and in seeds")
                         .Register(r);
  record_bytes = &replicated.Add(L({{"kind", "record"}}));
  seed_bytes = &replicated.Add(L({{"kind", "seed"}}));
  backups = &prometheus::BuildGauge()
                 .Name("pacer_shard_replication_backups")
                 .Help("Backups of this shard's range, as the monitor set them (--replicas)")
                 .Register(r)
                 .Add(L({}));
  lag = &prometheus::BuildGauge()
             .Name("pacer_shard_replication_lag_records")
             .Help(
                 "Records this primary sent that not every backup has acknowledged yet: the "
                 "pushes in them are received, not yet durable")
             .Register(r)
             .Add(L({}));
  lag_seconds = &prometheus::BuildGauge()
                     .Name("pacer_shard_replication_lag_seconds")
                     .Help(
                         "How long the slowest backup of this primary's range has owed an "
                         "acknowledgement (0: every backup holds every record); past 5 s it is "
                         "reported to the monitor, which drops it from the set")
                     .Register(r)
                     .Add(L({}));
  replicas = &prometheus::BuildGauge()
                  .Name("pacer_shard_replicas")
                  .Help("Other shards' ranges this shard holds a replica of (as a backup)")
                  .Register(r)
                  .Add(L({}));
  checks = &prometheus::BuildCounter()
                .Name("pacer_shard_replica_checks_total")
                .Help(
                    "CRC-32 comparisons of a block range of a replica with its primary's, "
                    "made by this backup")
                .Register(r)
                .Add(L({}));
  mismatches = &prometheus::BuildCounter()
                    .Name("pacer_shard_replica_mismatches_total")
                    .Help(
                        "Replica checks whose CRC-32 differed from the primary's: the replica "
                        "no longer holds the same parameters or optimizer state")
                    .Register(r)
                    .Add(L({}));
  stale_epochs = &prometheus::BuildCounter()
                      .Name("pacer_shard_stale_epoch_requests_total")
                      .Help(
                          "Pushes and pulls refused because they named an older epoch of this "
                          "shard's range than its own (the sender's shard map predates a "
                          "failover or a key move)")
                      .Register(r)
                      .Add(L({}));
  live = &prometheus::BuildGauge()
              .Name("pacer_shard_live_workers")
              .Help("Live workers in the shard's current membership")
              .Register(r)
              .Add(L({}));
  parked = &prometheus::BuildGauge()
                .Name("pacer_shard_parked_pulls")
                .Help("Pulls waiting on the barrier")
                .Register(r)
                .Add(L({}));
}

CheckpointMetrics::CheckpointMetrics(prometheus::Registry& r, Duration interval,
                                     const prometheus::Labels& extra) {
  const auto with = [&](prometheus::Labels l) {
    l.insert(extra.begin(), extra.end());
    return l;
  };
  seconds = &prometheus::BuildHistogram()
                 .Name("pacer_shard_checkpoint_duration_seconds")
                 .Help("Time to write one checkpoint (synced)")
                 .Register(r)
                 .Add(extra, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1,
                                                                  0.25, 0.5, 1, 2.5, 5, 10});
  bytes = &prometheus::BuildGauge()
               .Name("pacer_shard_checkpoint_size_bytes")
               .Help("Bytes written by the last successful checkpoint")
               .Register(r)
               .Add(extra);
  age = &prometheus::BuildGauge()
             .Name("pacer_shard_checkpoint_age_seconds")
             .Help(
                 "Age of the state in the last successful checkpoint, in seconds "
                 "(since start when none)")
             .Register(r)
             .Add(extra);
  last = &prometheus::BuildGauge()
              .Name("pacer_shard_checkpoint_last_success_timestamp_seconds")
              .Help(
                  "Unix time the state in the last successful checkpoint was "
                  "captured (0: none yet)")
              .Register(r)
              .Add(extra);
  prometheus::BuildGauge()
      .Name("pacer_shard_checkpoint_interval_seconds")
      .Help("The configured seconds between checkpoints (--checkpoint-interval; 0: by count only)")
      .Register(r)
      .Add(extra)
      .Set(ToSeconds(interval));
  auto& done = prometheus::BuildCounter()
                   .Name("pacer_shard_checkpoints_total")
                   .Help("Checkpoints attempted, by result")
                   .Register(r);
  ok = &done.Add(with({{"result", "ok"}}));
  failed = &done.Add(with({{"result", "failed"}}));
}

}  // namespace pacer
