#include "monitor/monitor_metrics.h"

namespace pacer {

MonitorMetrics::MonitorMetrics(prometheus::Registry& r) {
  decisions = &prometheus::BuildCounter()
                   .Name("pacer_monitor_policy_decisions_total")
                   .Help("Policy rounds that changed some worker's batch size")
                   .Register(r)
                   .Add({});
  batch = &prometheus::BuildGauge()
               .Name("pacer_monitor_worker_batch_size")
               .Help("Batch size the policy assigns to each worker")
               .Register(r);
  live_workers = &prometheus::BuildGauge()
                      .Name("pacer_monitor_live_workers")
                      .Help("Workers in the current membership")
                      .Register(r)
                      .Add({});
  shards = &prometheus::BuildGauge()
                .Name("pacer_monitor_shards")
                .Help("Registered shards")
                .Register(r)
                .Add({});
  shards_up = &prometheus::BuildGauge()
                   .Name("pacer_monitor_shards_up")
                   .Help("Registered shards that are serving (heartbeating, not left)")
                   .Register(r)
                   .Add({});
  map_version = &prometheus::BuildGauge()
                     .Name("pacer_monitor_shard_map_version")
                     .Help("Version of the shard map (0: not built yet)")
                     .Register(r)
                     .Add({});
  shard_restarts = &prometheus::BuildCounter()
                        .Name("pacer_monitor_shard_restarts_total")
                        .Help("Shards that registered again from their checkpoint")
                        .Register(r)
                        .Add({});
  membership = &prometheus::BuildGauge()
                    .Name("pacer_monitor_membership_version")
                    .Help("Version of the live-worker set")
                    .Register(r)
                    .Add({});
  accuracy = &prometheus::BuildGauge()
                  .Name("pacer_training_test_accuracy_ratio")
                  .Help("Last test accuracy reported by the evaluating worker")
                  .Register(r)
                  .Add({});
  auto& changes = prometheus::BuildCounter()
                      .Name("pacer_monitor_membership_changes_total")
                      .Help(
                          "Membership changes (each bumps the membership version), by reason: "
                          "joined, finished, removed, lost (lease expired), bounds (staleness "
                          "bounds changed), started, restarted (the monitor)")
                      .Register(r);
  for (const char* r :
       {"joined", "finished", "removed", "lost", "bounds", "started", "restarted"}) {
    membership_changes[r] = &changes.Add({{"reason", r}});
  }
  data_epoch = &prometheus::BuildGauge()
                    .Name("pacer_monitor_data_epoch")
                    .Help("The job's epoch over the whole training set (the data stream): the oldest "
                          "not trained in full")
                    .Register(r)
                    .Add({});
  data_epoch_progress = &prometheus::BuildGauge()
                             .Name("pacer_monitor_data_epoch_progress_ratio")
                             .Help("Fraction of the job's current epoch trained (the data stream)")
                             .Register(r)
                             .Add({});
  auto& chunks = prometheus::BuildCounter()
                     .Name("pacer_monitor_data_chunks_total")
                     .Help("Data stream chunks by event: handed_out, taken_over (an epoch's tail "
                           "handed from its holder to a quicker worker), returned (given back by "
                           "a worker that left or died)")
                     .Register(r);
  for (const char* e : {"handed_out", "taken_over", "returned"}) {
    data_chunks[e] = &chunks.Add({{"event", e}});
  }
  data_samples = &prometheus::BuildGauge()
                      .Name("pacer_monitor_data_epoch_samples")
                      .Help("Samples each worker trained in the job's current epoch (the data stream)")
                      .Register(r);
  data_tail = &prometheus::BuildGauge()
                   .Name("pacer_monitor_data_epoch_tail_seconds")
                   .Help("The last ended epoch's tail: seconds from the first worker left with "
                         "nothing of it to read to its end (the data stream)")
                   .Register(r)
                   .Add({});
  auto& states = prometheus::BuildGauge()
                     .Name("pacer_monitor_state")
                     .Help("The job's state: 1 for the current one (waiting, running, stopped)")
                     .Register(r);
  for (const char* st : {"waiting", "running", "stopped"}) {
    state[st] = &states.Add({{"state", st}});
  }
  state["waiting"]->Set(1);
  straggler = &prometheus::BuildGauge()
                   .Name("pacer_monitor_worker_straggler_score")
                   .Help(
                       "A worker's fitted compute time for an even share of the global "
                       "batch over the median of the live workers' (1: typical; 2: twice "
                       "as slow)")
                   .Register(r);
  fixed_cost = &prometheus::BuildGauge()
                    .Name("pacer_monitor_worker_fixed_cost_seconds")
                    .Help(
                        "The policy's fitted fixed compute cost of one iteration of a "
                        "worker, whatever its batch")
                    .Register(r);
  sample_cost = &prometheus::BuildGauge()
                     .Name("pacer_monitor_worker_sample_cost_seconds")
                     .Help(
                         "The policy's fitted compute cost of one more sample in a "
                         "worker's batch")
                     .Register(r);
  auto& by_reason = prometheus::BuildCounter()
                        .Name("pacer_monitor_policy_rounds_total")
                        .Help(
                            "Rounds of the batch-size policy, by why they ran (interval, "
                            "level_shift: a confirmed change of a worker's speed, membership, "
                            "memory_limit)")
                        .Register(r);
  for (size_t r = 0; r < static_cast<size_t>(policy::RoundReason::kCount); ++r) {
    rounds[r] =
        &by_reason.Add({{"reason", policy::RoundReasonName(static_cast<policy::RoundReason>(r))}});
  }
  lag = &prometheus::BuildGauge()
             .Name("pacer_monitor_worker_clock_lag")
             .Help("Clocks a live worker is behind the most advanced live worker")
             .Register(r);
  worker_sps = &prometheus::BuildGauge()
                    .Name("pacer_monitor_worker_samples_per_second")
                    .Help("Training samples per second a live worker last reported")
                    .Register(r);
  worker_clock = &prometheus::BuildGauge()
                      .Name("pacer_monitor_worker_clock")
                      .Help("The clock (iteration) a live worker last reported")
                      .Register(r);
  shard_up = &prometheus::BuildGauge()
                  .Name("pacer_monitor_shard_up")
                  .Help(
                      "1 while a registered shard heartbeats, 0 once it left or missed its "
                      "lease (it keeps its key range)")
                  .Register(r);
  shard_clock = &prometheus::BuildGauge()
                     .Name("pacer_monitor_shard_applied_clock")
                     .Help("The highest clock a shard reported applied (-1: none)")
                     .Register(r);
  shard_ckpt_age = &prometheus::BuildGauge()
                        .Name("pacer_monitor_shard_checkpoint_age_seconds")
                        .Help(
                            "Age of a shard's last checkpoint, from its heartbeats (shards "
                            "with --data-dir only)")
                        .Register(r);
  replicas_wanted = &prometheus::BuildGauge()
                         .Name("pacer_monitor_replicas_wanted")
                         .Help("Backups each key range should have (monitor --replicas)")
                         .Register(r)
                         .Add({});
  range_backups = &prometheus::BuildGauge()
                       .Name("pacer_monitor_range_backups")
                       .Help(
                           "Live shards assigned as backups of the key range whose primary is "
                           "this shard")
                       .Register(r);
  under_replicated = &prometheus::BuildGauge()
                          .Name("pacer_monitor_ranges_under_replicated")
                          .Help("Key ranges with fewer live backups than --replicas asks for")
                          .Register(r)
                          .Add({});
  auto& failover_family = prometheus::BuildCounter()
                              .Name("pacer_monitor_failovers_total")
                              .Help(
                                  "Key ranges handed to a backup (--replicas), by reason: lease "
                                  "(the primary missed its shard lease), restart (the primary "
                                  "registered again as a new process), drain (pacerctl "
                                  "drain-shard handed the range over)")
                              .Register(r);
  failovers = &failover_family.Add({{"reason", "lease"}});
  restart_failovers = &failover_family.Add({{"reason", "restart"}});
  handoffs = &failover_family.Add({{"reason", "drain"}});
  backups_dropped = &prometheus::BuildCounter()
                         .Name("pacer_monitor_backups_dropped_total")
                         .Help(
                             "Backups dropped from a key range's set because they fell behind: "
                             "its primary had waited over 5 s for their acknowledgement")
                         .Register(r)
                         .Add({});
  test_loss = &prometheus::BuildGauge()
                   .Name("pacer_training_test_loss")
                   .Help("Last test-set loss (cross-entropy) reported by the evaluating worker")
                   .Register(r)
                   .Add({});
  accuracy_reports = &prometheus::BuildCounter()
                          .Name("pacer_training_evaluations_total")
                          .Help("Test-set evaluations reported by the evaluating worker")
                          .Register(r)
                          .Add({});
  dead = &prometheus::BuildCounter()
              .Name("pacer_monitor_workers_lost_total")
              .Help("Workers declared dead after missing their lease")
              .Register(r)
              .Add({});
}

}  // namespace pacer
