// pacer-worker's training: the built-in models (an MLP or a CNN, on the CPU
// or a CUDA GPU, worker/builtin/) on Fashion-MNIST, run by the training
// runtime (worker/trainer.h) in one loop. Programs that train a model of
// their own drive a Trainer themselves.
#ifndef PACER_WORKER_WORKER_H_
#define PACER_WORKER_WORKER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/transport.h"
#include "worker/builtin/backend.h"
#include "worker/straggler.h"
#include "worker/trainer.h"

namespace pacer::worker {

// The runtime's options (TrainerOptions) and what pacer-worker trains.
struct WorkerOptions : TrainerOptions {
  // Directory with the Fashion-MNIST IDX .gz files (--dataset).
  std::string dataset_dir = "/usr/share/datasets/fashion-mnist";
  // Train on only the first N training samples (--train-limit); 0: all 60k.
  size_t train_limit = 0;
  // Evaluate on only the first N test samples (--test-limit); 0: all 10k.
  size_t test_limit = 0;
  // The model: layer widths (--layers).
  ModelSpec model;  // --model, --layers, --cnn-channels
  // Where it computes (--device): cpu, cuda, cuda:N, or auto (cuda:0 where
  // a GPU exists). A CUDA device that cannot be used is an error.
  std::string device = "auto";
  // Straggler emulation (worker/straggler.h): compute stretched to this
  // factor, or to the schedule's factor by elapsed training second.
  double slowdown = 1.0;
  std::vector<SlowdownStep> slowdown_schedule;
  // Mode local: the optimizer of the local steps (--local-optimizer,
  // --local-settings; DiLoCo's inner AdamW by default), its state kept
  // across rounds.
  JobOptimizer local_optimizer = {OptimizerKind::kAdamW, DefaultSettings(OptimizerKind::kAdamW)};
  // Before each iteration, with the clock it is about to run; it may block
  // (a paused worker keeps heartbeating). A hook for programs that embed a
  // worker; it runs on the training thread.
  std::function<void(uint64_t clock)> before_iteration;
};

class Worker {
 public:
  // `transport` must outlive the worker.
  Worker(Transport* transport, const WorkerOptions& options);
  ~Worker();
  // Runs until the job stops or this worker finishes its epochs. Returns an
  // error when the monitor cannot be reached, declares it dead, or the data
  // set cannot be read.
  absl::StatusOr<WorkerResult> Run();
  // Asks Run() to return soon; thread-safe.
  void Cancel();
  // For /readyz: "" while this worker trains, else what it is doing
  // instead (loading data, registering, waiting for the run, finished).
  // Thread-safe.
  std::string NotReadyReason() const;

 private:
  WorkerOptions options_;
  const Clock* clock_;
  Trainer trainer_;
};

// Evaluates an exported model file (ps/model_file.h) on the test set of
// options.dataset_dir (options.test_limit samples; 0: all), with the model
// of options.model. FailedPrecondition when the file holds another model.
absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& path, const WorkerOptions& options);

}  // namespace pacer::worker

#endif  // PACER_WORKER_WORKER_H_
