// The worker's metrics (pacer_worker_*, pacer_training_loss), registered in
// one place and labelled with its rank (known once registered). The trainer
// sets them (worker/trainer.cc).
#ifndef PACER_WORKER_WORKER_METRICS_H_
#define PACER_WORKER_WORKER_METRICS_H_

#include <cstdint>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pacer::worker {

struct WorkerMetrics {
  WorkerMetrics(prometheus::Registry& r, uint32_t rank);
  prometheus::Histogram *compute, *communication, *overlap, *wait, *staleness;
  prometheus::Counter *iterations, *samples;
  prometheus::Gauge *samples_per_second, *batch, *bound, *range, *clock, *loss, *not_durable;
  // Mode local: local steps taken, rounds taken by every shard, and the
  // local steps of the last one.
  prometheus::Counter *local_steps, *rounds;
  prometheus::Gauge* round_steps;
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_WORKER_METRICS_H_
