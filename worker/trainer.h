// The training runtime: everything a worker does besides computing its
// gradient. It registers with the monitor, declares the model, keeps the
// lease with heartbeats (reporting timings, taking batch sizes, staleness
// bounds, data partitions, pauses and the stop), reads the data partitions
// from the monitor's read positions, pulls and pushes through the client
// library (a layer-wise push while the gradient is computed), commits read
// positions once a push is acknowledged, keeps the metrics, and evaluates
// for the monitor when it is named.
//
// It is driven step by step, by pacer-worker's loop (worker/worker.h) or by
// any other (the Python package's):
//
//   Trainer t(transport, options);
//   t.Start(&model, data.size());
//   while (auto plan = t.NextBatch()) {        // which samples, for which clock
//     data.Fill(plan->samples, &batch);
//     if (!t.Pull().ok()) break;               // t.params(): this clock's parameters
//     GradientSink* sink = t.StartPush();      // layer-wise: non-null
//     float loss = model.ComputeGradient(t.params(), batch, t.grads(), sink);
//     if (!t.FinishPush(loss).ok()) break;     // acknowledged: positions move on
//   }
//   auto result = t.Finish();
//
// In mode local (pacer-monitor --mode local) the same loop runs rounds of
// local steps: Pull fetches the parameters at a round's start only (later
// steps keep params() as the caller left it); the caller steps params()
// with its own optimizer before FinishPush, which ends a local step and,
// once the round is due (--round-steps, --round-seconds), pushes the
// change of params() since the round's pull. Read positions move and
// samples count as trained only when that push is acknowledged.
#ifndef PACER_WORKER_TRAINER_H_
#define PACER_WORKER_TRAINER_H_

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
#include "ps/base/fault.h"
#include "ps/base/messages.h"
#include "ps/base/optimizer_config.h"
#include "ps/base/safeguards.h"
#include "ps/base/transport.h"
#include "worker/model.h"

namespace pacer::worker {

// A parameter group of the model's declaration (--param-group): its name
// and settings, and the tensors it holds by name (shell globs).
struct ParamGroupSpec {
  GroupSettings settings;  // settings.name is the group's name
  std::vector<std::string> patterns;
};

// The worker's --unsafe-disable names (ps/base/cli.h), with what each does.
inline const std::vector<std::pair<std::string, std::string>> kUnsafeSwitches = {
    {"retry",
     "an unanswered push or pull is not sent again: the worker waits out "
     "--request-timeout and fails"},
    {"stop-interrupt",
     "requests in flight are not given up when the job stops, so a worker "
     "blocked on a dead shard stays until --request-timeout"},
    {"resend-held",
     "with replicas, pushes not yet durable are dropped instead of sent again "
     "to a range's new owner after a failover, so what the dead primary had "
     "not replicated is lost"},
    {"exact-positions",
     "with the data stream, each chunk's position is reported one batch past "
     "what was acknowledged, so a chunk a dead worker gives back skips samples"}};

// Mode local: the outer optimizer a model declares, with its groups.
struct OuterOptimizer {
  JobOptimizer optimizer;
  std::vector<ParamGroupSpec> param_groups;
};

struct TrainerOptions {
  // The monitor's address (--monitor). Required.
  std::string monitor;
  // Tensors are cut into blocks of at most this many floats, one key each,
  // so that range partitioning can balance shards (--block-floats).
  size_t block_floats = 32768;
  // Parameter groups the model declares (--param-group), each with its own
  // optimizer settings over the job's; a tensor goes to the first group
  // with a pattern that matches its name, else to the default group.
  std::vector<ParamGroupSpec> param_groups;
  // The optimizer the model declares (pacer.torch: the torch optimizer's
  // class and defaults). The first worker's declaration sets the job's
  // (the monitor's --optimizer and its flags are only the default); a
  // later worker that declares another is refused, both named. nullopt:
  // none declared (pacer-worker): the worker trains with the job's.
  std::optional<JobOptimizer> optimizer;
  // Mode local (pacer-monitor --mode local: rounds of local steps, the
  // shards' optimizer the outer one): the outer optimizer the model
  // declares there instead of `optimizer` and `param_groups` (pacer.torch:
  // distribute's outer=), with its own groups. nullopt: in mode local the
  // model declares no optimizer and no groups (the job's: pacer-monitor's
  // default outer sgd, lr 0.7, momentum 0.9, nesterov). Set in another mode:
  // Start fails, naming the mode.
  std::optional<OuterOptimizer> outer;
  // The rank this worker asks for (pacer-worker --rank, default PACER_RANK:
  // pacer-run's launch index); the monitor gives it when it is below
  // --min-workers and no live worker holds it, else the lowest free rank.
  // nullopt: any.
  std::optional<uint32_t> rank_hint;
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
  // The largest batch this worker can hold, reported to the policy as its
  // memory limit (--max-batch); 0: the model's own (a GPU's memory), or
  // none.
  uint32_t max_batch = 0;
  // Fault handling, all on; --unsafe-disable switches one off only to show
  // a chaos invariant failing (kUnsafeSwitches says what each off does):
  // kRetry, kStopInterrupt, kResendHeld, kExactPositions.
  Safeguards safeguards;

  // This process's fault layer (ps/base/fault.h), for the run-time faults the
  // monitor sends with its heartbeat replies; null: none.
  std::shared_ptr<FaultInjector> faults;

  // Where this worker's metrics go (pacer_worker_*, pacer_training_loss,
  // each labelled worker_rank once registered); null: none kept.
  std::shared_ptr<prometheus::Registry> registry;

  // Appends one line per acknowledged push (--sample-log): the partition
  // (with the data stream: the chunk), the epoch, and the training-set
  // indices of the batch; in mode local, when the round's push is
  // acknowledged, "round CLOCK" and then a line per local step of it.
  // Empty: none.
  std::string sample_log;
  // Appends one line per acknowledged push (--ack-log), written and flushed
  // the moment the client reports the acknowledgement: Unix time (ms), the
  // push's sequence number, its clock, and the samples in its batch (0: an
  // empty push). The chaos runner's record of what was acknowledged. With
  // replicas, also "durable TIME SEQ" once every push acknowledged through
  // SEQ is durable (the reply that says so may come with a later push).
  std::string ack_log;
  // Appends one line per iteration (--step-log): seconds since training
  // started, the clock, the batch, and its compute, communication and
  // waiting seconds. Empty: none.
  std::string step_log;

  // Evaluates the parameters for the monitor when it names this worker
  // (every --eval-interval seconds, and --eval-every-clocks): called on a
  // side thread of its own with parameters freshly pulled by its own
  // client. Null: this worker never evaluates (the program reports with
  // Trainer::Report instead).
  std::function<absl::StatusOr<EvalResult>(std::span<const float> params)> evaluate;

  // Hooks for programs that embed a worker (tests keep their own record of
  // the run through them). They run on the training thread.
  // Once registered: the id and rank the monitor gave.
  std::function<void(uint32_t id, uint32_t rank)> on_registered;
  // After every shard acknowledged a push: its sequence number, its clock,
  // and the training-set indices of the samples its gradient came from.
  std::function<void(uint64_t seq, uint64_t clock, std::span<const uint32_t> samples)>
      on_push_acked;
};

// Figures of a finished run.
struct WorkerResult {
  uint32_t id = 0;
  uint32_t rank = 0;
  uint64_t clocks = 0;   // iterations completed
  uint64_t samples = 0;  // training samples processed
  uint32_t last_batch =
      0;  // the batch size assigned at the last iteration (an epoch tail trains fewer)
  double compute_seconds = 0;        // time computing (slowdown included)
  double wait_seconds = 0;           // time parked on the consistency rule
  double communication_seconds = 0;  // push + pull, less waiting
  double seconds = 0;                // training time
  double last_loss = 0;
  std::string stop_reason;
};

// One iteration's batch: the clock it trains for and the training-set
// indices to read (NextBatch).
struct BatchPlan {
  uint64_t clock = 0;
  // The batch size the monitor assigns this worker now.
  uint32_t assigned = 0;
  // The data partition and epoch the samples come from (when there are
  // samples); with the monitor's data stream, `chunk` names the chunk of
  // the whole training set's order (partition: 0) and `epoch` is the job's
  // epoch over the whole set that the samples belong to.
  uint32_t partition = 0;
  uint32_t epoch = 0;
  uint64_t chunk = 0;
  // Fewer than `assigned` at the end of an epoch or chunk (none is
  // skipped); none when this worker has nothing to read (more workers than
  // partitions, or no chunk at hand): the push is then empty and only keeps
  // the barrier moving.
  std::vector<uint32_t> samples;
};

class Trainer {
 public:
  // `transport` must outlive the trainer.
  Trainer(Transport* transport, TrainerOptions options);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Registers, declares `model`'s tensors (cut into keys), starts the
  // heartbeats, waits for the run to start and connects to the shards; the
  // first worker of the job initialises the shards from model->Init. The
  // job's data set has `samples` samples (the same on every worker).
  // `model` must outlive the trainer. An error when the monitor cannot be
  // reached or refuses, or the run does not start within start_timeout.
  // A job that stopped before it ran is not an error: NextBatch says so.
  absl::Status Start(Model* model, size_t samples);

  // The next iteration's batch: where the monitor's assignment, pause,
  // partitions and read positions put it. Blocks while the monitor holds
  // the job (a shard move, pacerctl pause). nullopt when training is over:
  // the job stopped, this worker's partitions ran their epochs, Cancel(),
  // or a step failed.
  std::optional<BatchPlan> NextBatch();

  // Pulls this iteration's parameters into params(), waiting on the
  // consistency rule; `while_in_flight` (may be null) runs once while the
  // pull is on its way (when overlap is on), such as filling the batch.
  // Returns the applied clock the parameters reflect.
  absl::StatusOr<int64_t> Pull(const std::function<void()>& while_in_flight = nullptr);

  // The runtime's flat buffers (num_params floats each, valid from Start
  // to the trainer's end): the parameters the last Pull wrote, and the
  // gradient FinishPush sends.
  std::span<float> params();
  std::span<float> grads();

  // Before the gradient is computed: waits until the monitor holds the
  // read positions up to the previous batch (so that a replacement repeats
  // at most this batch) and, with overlap on and samples to train on,
  // starts the push and returns the sink that sends each of the model's
  // stages as it is told; else null. `stretch` (straggler emulation, >= 1)
  // sleeps stretch - 1 times the compute, stage by stage.
  GradientSink* StartPush(double stretch = 1.0);
  // After the gradient is in grads() (an empty batch: zeroed here): sends
  // what is not sent yet and waits for every shard's acknowledgement; then
  // the plan's samples count as trained and its read position moves on.
  // `loss` is the batch's mean loss, for progress and metrics (NaN: not
  // known, the progress keeps the last). A push for
  // a clock that closed without this worker (a late join, a dropped
  // backup push) moves on to the shards' clock and is not an error.
  absl::Status FinishPush(float loss);

  // Sends an evaluation of the current parameters to the monitor, for
  // programs that evaluate themselves (options.evaluate null): the monitor
  // logs it and stops at --target-accuracy.
  absl::Status Report(const EvalResult& result);
  // Whether the monitor names this worker to evaluate (the live worker
  // with the lowest rank).
  bool evaluator() const;

  // The job's optimizer, known from Start: the one options.optimizer
  // declared (the monitor took it), else the job's when this worker
  // registered (the first declaration's, or pacer-monitor --optimizer).
  OptimizerKind optimizer() const;
  // Whether the job runs rounds of local steps (mode local), known from
  // Start.
  bool local_steps() const;
  // Mode local: whether the last Pull began a round (brought the shards'
  // parameters; else params() holds the caller's own).
  bool round_began() const;
  // Whether the job reads one data stream (pacer-monitor's default),
  // known from Start: then BatchPlan::epoch is the job's epoch over the
  // whole training set, and a program may end its epoch loop's iteration
  // when the next batch's epoch is higher.
  bool data_stream() const;
  // The lr each push carries for each group from now on (the user's
  // scheduler, on this side; ps/client.h); empty: none. The shards' order
  // of precedence is in ps/README.md's optimizer section.
  void SetLearningRates(std::vector<wire::GroupLr> lrs);

  // Ends the run: tells the monitor when this worker finished its epochs
  // or was told to go; the figures, or the error that ended training.
  absl::StatusOr<WorkerResult> Finish();

  // Asks the trainer to stop soon (NextBatch returns nullopt; a request in
  // flight gives up); thread-safe.
  void Cancel();
  // Whether the job stopped, or Cancel was called.
  bool stopping() const;
  // For /readyz: "" while training, else what it is doing instead
  // (registering, waiting for the run, finished). Thread-safe.
  std::string NotReadyReason() const;
  // The id and rank the monitor gave (0 before Start).
  uint32_t id() const;
  uint32_t rank() const;

 private:
  absl::Status Begin(Model* model, size_t samples);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

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

#endif  // PACER_WORKER_TRAINER_H_
