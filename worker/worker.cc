#include "worker/worker.h"

#include <algorithm>
#include <optional>

#include "ps/model_file.h"
#include "worker/local_optimizer.h"
#include "spdlog/spdlog.h"
#include "worker/builtin/builtin.h"
#include "worker/builtin/device.h"

namespace pacer::worker {

absl::StatusOr<EvalResult> EvaluateModelFile(const std::string& path,
                                             const WorkerOptions& options) {
  auto model = ReadModelFile(path);
  if (!model.ok()) return model.status();
  auto made = MakeBackend(options.model, options.device);
  if (!made.ok()) return made.status();
  BackendModel backend(*std::move(made), options.model.name());
  if (model->values.size() != backend.num_params()) {
    return absl::FailedPreconditionError(path + " holds " + std::to_string(model->values.size()) +
                                         " parameters; the " + options.model.name() +
                                         " of --model/--layers/--cnn-channels has " +
                                         std::to_string(backend.num_params()));
  }
  auto test = LoadFashionMnist(options.dataset_dir, /*train=*/false);
  if (!test.ok()) return test.status();
  // The file lays keys out in ascending order, as the worker's flat vector.
  return backend.Evaluate(model->values, DatasetSource(*std::move(test)).First(options.test_limit));
}

namespace {

// The evaluation the monitor asks of pacer-worker: the first --test-limit
// samples of the test set, on a backend of its own (the evaluation thread's),
// both made when first asked for.
std::function<absl::StatusOr<EvalResult>(std::span<const float>)> TestSetEvaluation(
    const WorkerOptions& o) {
  struct State {
    std::optional<Batch> test;
    std::unique_ptr<BackendModel> model;
  };
  auto state = std::make_shared<State>();
  return [o, state](std::span<const float> params) -> absl::StatusOr<EvalResult> {
    if (!state->test) {
      auto loaded = LoadFashionMnist(o.dataset_dir, /*train=*/false);
      if (!loaded.ok()) {
        return absl::Status(loaded.status().code(),
                            "cannot load the test set: " + std::string(loaded.status().message()));
      }
      auto made = MakeBackend(o.model, o.device);
      if (!made.ok()) {
        return absl::Status(made.status().code(),
                            "no backend to evaluate on: " + std::string(made.status().message()));
      }
      state->model = std::make_unique<BackendModel>(*std::move(made), o.model.name());
      state->test = DatasetSource(*std::move(loaded)).First(o.test_limit);
      spdlog::info("evaluating the test set for the monitor");
    }
    return state->model->Evaluate(params, *state->test);
  };
}

}  // namespace

Worker::Worker(Transport* transport, const WorkerOptions& options)
    : options_(options), clock_(transport->clock()), trainer_(transport, [&options] {
        TrainerOptions t = options;
        t.evaluate = TestSetEvaluation(options);
        return t;
      }()) {}

Worker::~Worker() = default;

std::string Worker::NotReadyReason() const { return trainer_.NotReadyReason(); }

void Worker::Cancel() { trainer_.Cancel(); }

absl::StatusOr<WorkerResult> Worker::Run() {
  const WorkerOptions& o = options_;
  // Data first: a registered worker is a member the barrier waits for.
  auto train = LoadFashionMnist(o.dataset_dir, /*train=*/true);
  if (!train.ok()) return train.status();
  if (o.train_limit > 0 && o.train_limit < train->size()) {
    train->labels.resize(o.train_limit);
    train->images.resize(o.train_limit * train->features());
  }
  const DatasetSource data(*std::move(train));
  auto made = MakeBackend(o.model, o.device);
  if (!made.ok()) return made.status();
  BackendModel model(*std::move(made), o.model.name());
  const uint32_t limit = o.max_batch > 0 ? o.max_batch : model.max_batch();
  spdlog::info("worker: {} on {} ({} parameters; batch limit {})", model.name(),
               model.backend().name(), model.num_params(),
               limit > 0 ? std::to_string(limit) : std::string("none"));
  if (absl::Status s = trainer_.Start(&model, data.size()); !s.ok()) return s;
  if (o.slowdown != 1.0 || !o.slowdown_schedule.empty()) {
    spdlog::info("worker {}: emulating a straggler: compute slowed {}x{}", trainer_.id(),
                 o.slowdown, o.slowdown_schedule.empty() ? "" : " before its schedule");
  }
  const Clock& clock = *clock_;
  const TimePoint t0 = clock.Now();
  double last_factor = SlowdownAt(o.slowdown_schedule, o.slowdown, 0);
  Batch batch;
  LocalOptimizer local(o.local_optimizer);
  while (auto plan = trainer_.NextBatch()) {
    if (o.before_iteration) o.before_iteration(plan->clock);
    if (trainer_.stopping()) break;
    // The batch is prepared while the pull is in flight.
    if (!trainer_.Pull([&] { data.Fill(plan->samples, &batch); }).ok()) break;
    // Straggler emulation: stretch this iteration's compute by sleeping.
    const double factor = SlowdownAt(o.slowdown_schedule, o.slowdown, ToSeconds(clock.Now() - t0));
    if (factor != last_factor) {
      spdlog::info("worker {}: slowdown now {}x", trainer_.id(), factor);
      last_factor = factor;
    }
    GradientSink* sink = trainer_.StartPush(factor);
    float loss = 0;
    if (!plan->samples.empty()) {
      loss = model.ComputeGradient(trainer_.params(), batch, trainer_.grads(), sink);
      // Mode local: the step is ours.
      if (trainer_.local_steps()) local.Step(trainer_.params(), trainer_.grads());
    }
    if (!trainer_.FinishPush(loss).ok()) break;
  }
  return trainer_.Finish();
}

}  // namespace pacer::worker
