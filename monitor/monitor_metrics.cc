#include "monitor/monitor_metrics.h"

#include <algorithm>
#include <optional>
#include <vector>

#include "monitor/data_feed.h"
#include "monitor/membership.h"
#include "monitor/range_table.h"
#include "monitor/shard_registry.h"

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

void MonitorMetrics::ShowShards(const ShardRegistry& reg) {
  shards->Set(static_cast<double>(reg.size()));
  shards_up->Set(static_cast<double>(
      std::count_if(reg.begin(), reg.end(), [](const ShardProcess& s) { return !s.down; })));
}

void MonitorMetrics::ShowReplicas(const RangeTable& ranges, uint32_t replicas,
                                  size_t under_replicated_ranges) {
  replicas_wanted->Set(replicas);
  under_replicated->Set(static_cast<double>(under_replicated_ranges));
  if (replicas == 0) return;
  for (size_t i = 0; i < ranges.size(); ++i) {
    const prometheus::Labels labels{{"shard", std::to_string(ranges[i].id)}};
    if (!ranges.HoldsKeys(i)) {
      range_backups->Remove(&range_backups->Add(labels));
      continue;
    }
    range_backups->Add(labels).Set(static_cast<double>(ranges[i].backups.size()));
  }
}

void MonitorMetrics::ShowMembership(const Membership& members) {
  membership->Set(static_cast<double>(members.version()));
  live_workers->Set(static_cast<double>(members.LiveWorkers().size()));
}

void MonitorMetrics::ShowMapVersion(const RangeTable& ranges) {
  map_version->Set(static_cast<double>(ranges.version()));
}

void MonitorMetrics::ShowEvaluation(double test_accuracy, double loss) {
  accuracy->Set(test_accuracy);
  test_loss->Set(loss);
}

void MonitorMetrics::ShowBatch(uint32_t rank, uint32_t size) {
  batch->Add({{"worker_rank", std::to_string(rank)}}).Set(size);
  gauged_ranks_.insert(rank);  // so that its series goes when it does
}

void MonitorMetrics::ShowRounds(const policy::StragglerPolicy& policy) {
  for (size_t r = 0; r < static_cast<size_t>(policy::RoundReason::kCount); ++r) {
    const uint64_t now = policy.rounds(static_cast<policy::RoundReason>(r));
    if (now > rounds_counted_[r]) rounds[r]->Increment(static_cast<double>(now - rounds_counted_[r]));
    rounds_counted_[r] = now;
  }
}

void MonitorMetrics::ShowStream(const DataFeed& data, const Membership& members) {
  const DataStream* stream = data.stream();
  if (stream == nullptr) return;
  const DataStream& s = *stream;
  data_epoch->Set(s.epoch());
  // Once every epoch is trained the epoch gauge says so; the progress
  // would read 1 more (the dashboard adds the two).
  data_epoch_progress->Set(s.finished() ? 0.0 : s.epoch_progress());
  auto count = [&](const char* event, uint64_t now, uint64_t* counted) {
    if (now > *counted) data_chunks[event]->Increment(static_cast<double>(now - *counted));
    *counted = now;
  };
  count("handed_out", s.chunks_handed_out(), &counted_handed_out_);
  count("taken_over", s.tails_taken_over(), &counted_taken_over_);
  count("returned", s.chunks_returned(), &counted_returned_);
  const auto& samples = s.samples_in_epoch(s.epoch());
  std::set<uint32_t> ranks;
  for (uint32_t id : members.LiveWorkers()) {
    const uint32_t rank = members.at(id).rank;
    auto it = samples.find(id);
    data_samples->Add({{"worker_rank", std::to_string(rank)}})
        .Set(it == samples.end() ? 0 : static_cast<double>(it->second));
    ranks.insert(rank);
  }
  for (uint32_t rank : gauged_stream_ranks_) {
    if (!ranks.count(rank)) {
      data_samples->Remove(&data_samples->Add({{"worker_rank", std::to_string(rank)}}));
    }
  }
  gauged_stream_ranks_ = std::move(ranks);
  if (s.epoch() > 0) {
    if (auto tail = s.tail_seconds(s.epoch() - 1)) data_tail->Set(*tail);
  }
}

void MonitorMetrics::ShowJob(const char* job_state, const Membership& members,
                             const policy::StragglerPolicy& policy, const DataFeed& data,
                             const ShardRegistry& reg) {
  for (auto& [name, g] : state) g->Set(name == job_state ? 1 : 0);
  ShowStream(data, members);
  const std::vector<uint32_t> live = members.LiveWorkers();
  std::vector<double> speeds;
  uint64_t newest = 0;
  const double even = static_cast<double>(policy.global_batch()) /
                      static_cast<double>(std::max<size_t>(1, live.size()));
  auto compute_at_even = [&](uint32_t id) -> std::optional<double> {
    if (auto c = policy.cost(id); c && c->per_sample_seconds > 0) return c->Compute(even);
    return std::nullopt;
  };
  for (uint32_t id : live) {
    if (auto p = compute_at_even(id)) speeds.push_back(*p);
    newest = std::max(newest, members.at(id).clock);
  }
  double median = 0;
  if (!speeds.empty()) {
    std::nth_element(speeds.begin(), speeds.begin() + static_cast<long>(speeds.size() / 2),
                     speeds.end());
    median = speeds[speeds.size() / 2];
  }
  std::set<uint32_t> ranks;
  for (uint32_t id : live) {
    const WorkerState& w = members.at(id);
    const prometheus::Labels labels{{"worker_rank", std::to_string(w.rank)}};
    ranks.insert(w.rank);
    auto p = compute_at_even(id);
    straggler->Add(labels).Set(p && median > 0 ? *p / median : 1.0);
    if (auto c = policy.cost(id)) {
      fixed_cost->Add(labels).Set(c->fixed_seconds);
      sample_cost->Add(labels).Set(c->per_sample_seconds);
    }
    lag->Add(labels).Set(static_cast<double>(newest - w.clock));
    worker_sps->Add(labels).Set(w.samples_per_second);
    worker_clock->Add(labels).Set(static_cast<double>(w.clock));
  }
  // A departed worker's series go, so that max() and count() see live ones.
  for (uint32_t rank : gauged_ranks_) {
    if (ranks.count(rank)) continue;
    const prometheus::Labels labels{{"worker_rank", std::to_string(rank)}};
    for (auto* family : {straggler, lag, worker_sps, worker_clock, batch, fixed_cost, sample_cost}) {
      family->Remove(&family->Add(labels));
    }
  }
  gauged_ranks_ = std::move(ranks);
  ShowRounds(policy);
  for (const ShardProcess& sh : reg) {
    const prometheus::Labels labels{{"shard", std::to_string(sh.id)}};
    if (sh.drained) {
      for (auto* family : {shard_up, shard_clock, shard_ckpt_age}) {
        family->Remove(&family->Add(labels));
      }
      continue;
    }
    shard_up->Add(labels).Set(sh.down ? 0 : 1);
    shard_clock->Add(labels).Set(static_cast<double>(sh.applied_clock));
    // -1 (no checkpoint reported) leaves the series out rather than lying.
    if (sh.checkpoint_age >= 0) shard_ckpt_age->Add(labels).Set(sh.checkpoint_age);
  }
}

}  // namespace pacer
