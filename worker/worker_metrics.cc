#include "worker/worker_metrics.h"

#include <string>

namespace pacer::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, uint32_t rank) {
  const prometheus::Labels l{{"worker_rank", std::to_string(rank)}};
  const prometheus::Histogram::BucketBoundaries seconds{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  compute = &prometheus::BuildHistogram()
                 .Name("pacer_worker_compute_seconds")
                 .Help(
                     "Time one iteration spent computing its gradient (straggler "
                     "emulation's sleep included)")
                 .Register(r)
                 .Add(l, seconds);
  communication = &prometheus::BuildHistogram()
                       .Name("pacer_worker_communication_seconds")
                       .Help(
                           "Time one iteration spent on push and pull, waiting on the "
                           "consistency rule excluded")
                       .Register(r)
                       .Add(l, seconds);
  overlap = &prometheus::BuildHistogram()
                 .Name("pacer_worker_overlap_seconds")
                 .Help(
                     "Layer-wise push: how long one iteration's push was on its way while "
                     "its gradient was still being computed")
                 .Register(r)
                 .Add(l, seconds);
  wait = &prometheus::BuildHistogram()
              .Name("pacer_worker_wait_seconds")
              .Help(
                  "Time one iteration's pull waited on the consistency rule (the barrier, "
                  "the staleness bound)")
              .Register(r)
              .Add(l, seconds);
  staleness = &prometheus::BuildHistogram()
                   .Name("pacer_worker_observed_staleness_steps")
                   .Help("Clocks the parameters one iteration read were behind it (0: fresh)")
                   .Register(r)
                   .Add(l, prometheus::Histogram::BucketBoundaries{0, 1, 2, 3, 4, 6, 8, 12, 16});
  iterations = &prometheus::BuildCounter()
                    .Name("pacer_worker_iterations_total")
                    .Help("Iterations whose push every shard acknowledged")
                    .Register(r)
                    .Add(l);
  samples = &prometheus::BuildCounter()
                 .Name("pacer_worker_samples_total")
                 .Help("Training samples in acknowledged pushes")
                 .Register(r)
                 .Add(l);
  samples_per_second = &prometheus::BuildGauge()
                            .Name("pacer_worker_samples_per_second")
                            .Help("Training samples per second over the last progress interval")
                            .Register(r)
                            .Add(l);
  batch = &prometheus::BuildGauge()
               .Name("pacer_worker_batch_size")
               .Help("The batch size this worker trains with (the policy's assignment)")
               .Register(r)
               .Add(l);
  bound = &prometheus::BuildGauge()
               .Name("pacer_worker_staleness_bound_steps")
               .Help("The staleness bound assigned to this worker: s (ssp) or s_L (dssp)")
               .Register(r)
               .Add(l);
  range = &prometheus::BuildGauge()
               .Name("pacer_worker_staleness_range_steps")
               .Help("dssp: r_max, the extra iterations past s_L this worker may be granted")
               .Register(r)
               .Add(l);
  clock = &prometheus::BuildGauge()
               .Name("pacer_worker_clock")
               .Help("The clock (iteration) this worker runs next")
               .Register(r)
               .Add(l);
  not_durable = &prometheus::BuildGauge()
                     .Name("pacer_worker_pushes_not_durable")
                     .Help(
                         "Pushes kept until their range's backups hold them (monitor "
                         "--replicas), to send again to a new primary after a failover")
                     .Register(r)
                     .Add(l);
  local_steps = &prometheus::BuildCounter()
                     .Name("pacer_worker_local_steps_total")
                     .Help(
                         "Mode local: local steps this worker took (a round that is not taken "
                         "loses its steps' samples, not this count)")
                     .Register(r)
                     .Add(l);
  rounds = &prometheus::BuildCounter()
                .Name("pacer_worker_rounds_total")
                .Help("Mode local: rounds whose push every shard acknowledged")
                .Register(r)
                .Add(l);
  round_steps = &prometheus::BuildGauge()
                     .Name("pacer_worker_round_local_steps")
                     .Help("Mode local: the local steps of this worker's last acknowledged round")
                     .Register(r)
                     .Add(l);
  loss = &prometheus::BuildGauge()
              .Name("pacer_training_loss")
              .Help("Training loss (cross-entropy, moving average over iterations)")
              .Register(r)
              .Add(l);
}

}  // namespace pacer::worker
