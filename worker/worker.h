// A training worker: registers with the monitor, declares the model, trains
// on its data partition with a compute backend, and pushes gradients to and
// pulls parameters from the shards through the client library.
#ifndef PACER_WORKER_WORKER_H_
#define PACER_WORKER_WORKER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "prometheus/registry.h"
#include "ps/base/messages.h"
#include "ps/base/optimizer_config.h"
#include "ps/client.h"
#include "ps/base/fault.h"
#include "ps/base/transport.h"
#include "worker/backend.h"
#include "worker/mnist.h"
#include "worker/straggler.h"

namespace pacer::worker {

// A parameter group of the model's declaration (--param-group): its name
// and settings, and the tensors it holds by name (shell globs).
struct ParamGroupSpec {
  GroupSettings settings;  // settings.name is the group's name
  std::vector<std::string> patterns;
};

// The worker's --unsafe-disable names (ps/base/cli.h), with what each does.
inline const std::vector<std::pair<std::string, std::string>> kUnsafeSwitches = {
    {"retry", "an unanswered push or pull is not sent again: the worker waits out "
              "--request-timeout and fails"},
    {"stop-interrupt", "requests in flight are not given up when the job stops, so a worker "
                       "blocked on a dead shard stays until --request-timeout"}};

struct WorkerOptions {
  // The monitor's address (--monitor). Required.
  std::string monitor;
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
  // Tensors are cut into blocks of at most this many floats, one key each,
  // so that range partitioning can balance shards (--block-floats).
  size_t block_floats = 32768;
  // Parameter groups the model declares (--param-group), each with its own
  // optimizer settings over the job's; a tensor goes to the first group
  // with a pattern that matches its name, else to the default group.
  std::vector<ParamGroupSpec> param_groups;
  // Overlap communication with compute (--overlap): each layer's gradient
  // is pushed as soon as the backward pass has finished it (a push in
  // parts), and the pull is in flight while the batch is prepared. Off:
  // pull, compute, then one push.
  bool overlap = true;
  // Deadline of one push or pull, including time waiting on the barrier.
  Duration request_timeout = std::chrono::seconds(60);
  // How long to keep trying to register and to wait for the run to start.
  Duration start_timeout = std::chrono::seconds(120);
  // Progress output: one line per interval; a live line when `live_progress`.
  Duration progress_interval = std::chrono::seconds(1);
  bool live_progress = false;
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Straggler emulation (worker/straggler.h): compute stretched to this
  // factor, or to the schedule's factor by elapsed training second.
  double slowdown = 1.0;
  std::vector<SlowdownStep> slowdown_schedule;
  // The largest batch this worker can hold, reported to the policy as its
  // memory limit (--max-batch); 0: the backend's own (a GPU's memory), or
  // none.
  uint32_t max_batch = 0;
  // Fault handling that --unsafe-disable switches off, only to show a chaos
  // invariant failing: `resend` sends an unanswered push or pull again
  // (off: it waits out request_timeout, then the worker fails);
  // `interrupt_on_stop` gives up requests in flight when the job stops (off:
  // a worker blocked on a dead shard stays until request_timeout).
  bool resend = true;
  bool interrupt_on_stop = true;

  // This process's fault layer (ps/base/fault.h), for the run-time faults the
  // monitor sends with its heartbeat replies; null: none.
  std::shared_ptr<FaultInjector> faults;

  // Where this worker's metrics go (pacer_worker_*, pacer_training_loss,
  // each labelled worker_rank once registered); null: none kept.
  std::shared_ptr<prometheus::Registry> registry;

  // Appends one line per acknowledged push (--sample-log): the partition,
  // its epoch, and the training-set indices of the batch. Empty: none.
  std::string sample_log;
  // Appends one line per acknowledged push (--ack-log), written and flushed
  // the moment the client reports the acknowledgement: Unix time (ms), the
  // push's sequence number, its clock, and the samples in its batch (0: an
  // empty push). The chaos runner's record of what was acknowledged.
  std::string ack_log;
  // Appends one line per iteration (--step-log): seconds since training
  // started, the clock, the batch, and its compute, communication and
  // waiting seconds. Empty: none.
  std::string step_log;

  // Hooks for programs that embed a worker (tests keep their own record of
  // the run through them). They run on the training thread.
  // Once registered: the id and rank the monitor gave.
  std::function<void(uint32_t id, uint32_t rank)> on_registered;
  // Before each iteration, with the clock it is about to run; it may block
  // (a paused worker keeps heartbeating).
  std::function<void(uint64_t clock)> before_iteration;
  // After every shard acknowledged a push: its sequence number, its clock,
  // and the training-set indices of the samples its gradient came from.
  std::function<void(uint64_t seq, uint64_t clock, std::span<const uint32_t> samples)>
      on_push_acked;
};

// Figures of a finished run.
struct WorkerResult {
  uint32_t id = 0;
  uint32_t rank = 0;
  uint64_t clocks = 0;        // iterations completed
  uint64_t samples = 0;       // training samples processed
  uint32_t last_batch = 0;    // the batch size assigned at the last iteration (an epoch tail trains fewer)
  double compute_seconds = 0; // time computing (slowdown included)
  double wait_seconds = 0;    // time parked on the consistency rule
  double communication_seconds = 0;  // push + pull, less waiting
  double seconds = 0;         // training time
  double last_loss = 0;
  std::string stop_reason;
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
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> cancel_{false};
};

// Evaluates an exported model file (ps/model_file.h) on the test set of
// options.dataset_dir (options.test_limit samples; 0: all), with the model
// of options.model. FailedPrecondition when the file holds another model.
absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& path, const WorkerOptions& options);

// The keys of a model: its flat parameter vector cut into blocks of at most
// block_floats, none across a tensor boundary (so none across a layer's,
// BackwardStages), so that a layer-wise push can send a layer's keys as soon
// as that layer is done, and each key belongs to one tensor and its group.
std::vector<wire::KeyLen> BlockKeys(const std::vector<TensorSpec>& tensors, size_t block_floats);

// The model's declaration: BlockKeys' keys, each with its tensor's name and
// group (groups[i] of `param_groups` is group i + 1). InvalidArgument when
// a group's name is taken twice or "default".
absl::StatusOr<msg::DeclareModel> Declaration(const std::vector<TensorSpec>& tensors,
                                              size_t block_floats,
                                              const std::vector<ParamGroupSpec>& param_groups);

// Parses --param-group's NAME:PATTERNS:SETTINGS (patterns comma-separated
// shell globs on tensor names, e.g. "no_decay:*.bias:weight_decay=0").
absl::StatusOr<ParamGroupSpec> ParseParamGroup(const std::string& spec);

}  // namespace pacer::worker

#endif  // PACER_WORKER_WORKER_H_
