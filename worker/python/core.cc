// pacer._core: the training runtime (worker/trainer.h) for Python. The
// parameters and the gradient stay in the runtime's flat buffers, handed
// to Python as NumPy arrays over the same memory (the buffer protocol):
// pacer.torch views them with torch.from_numpy, so a pull writes the
// weights in place and backward writes the gradient the push sends. Every
// call that can block releases the GIL. No libtorch here: the module works
// with whatever torch the interpreter has.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <tuple>
#include <cstdlib>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ps/base/cli.h"
#include "ps/base/mutex.h"
#include "ps/base/transport.h"
#include "worker/model.h"
#include "worker/trainer.h"

namespace py = pybind11;

namespace pacer::worker {
namespace {

// A model whose gradient Python computes: the runtime only needs its
// tensor table and the values to start from (the torch module's own).
class PythonModel final : public Model {
 public:
  PythonModel(std::vector<TensorSpec> tensors, std::vector<float> init)
      : tensors_(std::move(tensors)), init_(std::move(init)) {}
  std::string name() const override { return "python"; }
  const std::vector<TensorSpec>& tensors() const override { return tensors_; }
  void Init(uint64_t, std::span<float> params) const override {
    if (params.size() != init_.size()) {
      std::fill(params.begin(), params.end(), std::numeric_limits<float>::quiet_NaN());
      return;
    }
    std::copy(init_.begin(), init_.end(), params.begin());
  }
  float ComputeGradient(std::span<const float>, const Batch&, std::span<float>,
                        GradientSink*) override {
    return std::numeric_limits<float>::quiet_NaN();  // torch computes it
  }
  EvalResult Evaluate(std::span<const float>, const Batch&) override {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {nan, nan, 0};
  }

 private:
  std::vector<TensorSpec> tensors_;
  std::vector<float> init_;
};

// A status as the Python exception a user expects: a bad argument is a
// ValueError, an unreachable or refusing peer a ConnectionError, a
// deadline a TimeoutError, the rest a RuntimeError.
[[noreturn]] void Raise(const absl::Status& s) {
  const std::string text = std::string(s.message());
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition: throw py::value_error(text);
    case absl::StatusCode::kDeadlineExceeded: {
      PyErr_SetString(PyExc_TimeoutError, text.c_str());
      throw py::error_already_set();
    }
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kPermissionDenied: {
      PyErr_SetString(PyExc_ConnectionError, text.c_str());
      throw py::error_already_set();
    }
    default: throw std::runtime_error(text);
  }
}

// One thread that runs what is posted to it, in order.
class CallThread {
 public:
  CallThread() : thread_([this] { Loop(); }) {}
  ~CallThread() {
    {
      MutexLock lock(mu_);
      exit_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Post(std::function<void()> f) {
    {
      MutexLock lock(mu_);
      queue_.push_back(std::move(f));
    }
    cv_.notify_one();
  }

 private:
  void Loop() {
    MutexLock lock(mu_);
    for (;;) {
      cv_.wait(lock.native(), [this] { mu_.AssertHeld(); return exit_ || !queue_.empty(); });
      if (queue_.empty()) return;  // exit_, nothing left
      std::function<void()> f = std::move(queue_.front());
      queue_.pop_front();
      lock.Unlock();
      f();
      lock.Lock();
    }
  }
  Mutex mu_;  // guards queue_, exit_
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

class PyTrainer {
 public:
  // Runs `fn` (a call that may block) without the GIL on the trainer's
  // call thread, while this thread checks Python's signals every 50 ms: a
  // handler (SIGTERM's cancels the trainer) or Ctrl-C's KeyboardInterrupt
  // then act at once instead of after the call. An exception from a
  // handler cancels the trainer, waits for the call to give up, and
  // propagates. One thread for every call (not one per call): a hand-off
  // costs a wake-up, not a thread's start.
  template <typename Fn>
  auto Interruptible(Fn fn) -> decltype(fn()) {
    using Result = decltype(fn());
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(fn));
    std::future<Result> call = task->get_future();
    caller_.Post([task] { (*task)(); });
    py::gil_scoped_release release;
    while (call.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
      py::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {
        trainer_->Cancel();
        py::error_already_set raised;  // takes the exception
        {
          py::gil_scoped_release again;
          call.wait();
        }
        throw raised;
      }
    }
    return call.get();
  }

  PyTrainer(const std::string& monitor, size_t block_floats,
            const std::vector<std::string>& param_groups, const std::string& optimizer,
            const std::string& optimizer_settings, double request_timeout,
            double start_timeout, double progress_interval, uint32_t max_batch,
            const std::string& sample_log, const std::string& ack_log,
            const std::string& step_log, py::object evaluate, int64_t rank_hint,
            const std::string& outer, const std::string& outer_settings,
            const std::vector<std::string>& outer_groups) {
    TrainerOptions o;
    o.monitor = monitor;
    o.block_floats = block_floats;
    for (const std::string& spec : param_groups) {
      auto g = ParseParamGroup(spec);
      if (!g.ok()) Raise(g.status());
      o.param_groups.push_back(*std::move(g));
    }
    if (!optimizer.empty()) {
      auto kind = ParseOptimizerKind(optimizer);
      if (!kind.ok()) Raise(kind.status());
      auto settings = ParseGroupSettings(optimizer_settings);
      if (!settings.ok()) Raise(settings.status());
      o.optimizer = JobOptimizer{*kind, Resolve(DefaultSettings(*kind), *settings)};
    }
    if (!outer.empty()) {
      // Mode local: the outer optimizer, declared there instead.
      auto kind = ParseOptimizerKind(outer);
      if (!kind.ok()) Raise(kind.status());
      auto settings = ParseGroupSettings(outer_settings);
      if (!settings.ok()) Raise(settings.status());
      OuterOptimizer out;
      out.optimizer = JobOptimizer{*kind, Resolve(DefaultSettings(*kind), *settings)};
      for (const std::string& spec : outer_groups) {
        auto g = ParseParamGroup(spec);
        if (!g.ok()) Raise(g.status());
        out.param_groups.push_back(*std::move(g));
      }
      o.outer = std::move(out);
    }
    // The push is whole, after backward (no layer-wise hooks yet).
    o.overlap = false;
    o.request_timeout = FromSeconds(request_timeout);
    o.start_timeout = FromSeconds(start_timeout);
    o.progress_interval = FromSeconds(progress_interval);
    o.max_batch = max_batch;
    o.sample_log = sample_log;
    o.ack_log = ack_log;
    o.step_log = step_log;
    if (rank_hint >= 0) o.rank_hint = static_cast<uint32_t>(rank_hint);
    if (!evaluate.is_none()) {
      // Called on the trainer's evaluation thread, with the GIL taken: the
      // function gets a copy of the freshly pulled parameters and returns
      // (accuracy, loss, samples). evaluate_ holds the reference; the
      // trainer goes first (~PyTrainer).
      evaluate_ = std::move(evaluate);
      PyObject* fn = evaluate_.ptr();
      o.evaluate = [fn](std::span<const float> params) -> absl::StatusOr<EvalResult> {
        py::gil_scoped_acquire gil;
        try {
          py::array_t<float> copy(static_cast<py::ssize_t>(params.size()));
          std::copy(params.begin(), params.end(), copy.mutable_data());
          auto r = py::reinterpret_borrow<py::object>(fn)(copy)
                       .cast<std::tuple<double, double, size_t>>();
          return EvalResult{std::get<0>(r), std::get<1>(r), std::get<2>(r)};
        } catch (py::error_already_set& e) {
          return absl::InternalError(std::string("the evaluate function raised ") + e.what());
        } catch (const py::cast_error& e) {
          return absl::InternalError(
              std::string("the evaluate function's result is not (accuracy, loss, samples): ") +
              e.what());
        }
      };
    }
    TransportOptions t;
    t.max_message_bytes = o.max_message_bytes * 2;
    transport_ = MakeZmqTransport(t);
    trainer_ = std::make_unique<Trainer>(transport_.get(), o);
  }

  void Start(const std::vector<std::string>& names, const std::vector<size_t>& sizes,
             py::array_t<float, py::array::c_style | py::array::forcecast> init, size_t samples) {
    if (names.size() != sizes.size() || names.empty()) {
      throw py::value_error("start: one size per tensor name, and at least one tensor");
    }
    std::vector<TensorSpec> tensors;
    size_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      if (sizes[i] == 0) throw py::value_error("start: tensor '" + names[i] + "' is empty");
      tensors.push_back({names[i], sizes[i], 0});
      total += sizes[i];
    }
    if (static_cast<size_t>(init.size()) != total) {
      throw py::value_error("start: " + std::to_string(init.size()) + " initial values for " +
                            std::to_string(total) + " parameters");
    }
    if (samples == 0) throw py::value_error("start: the data set is empty");
    model_ = std::make_unique<PythonModel>(
        std::move(tensors), std::vector<float>(init.data(), init.data() + init.size()));
    absl::Status s = Interruptible([&] { return trainer_->Start(model_.get(), samples); });
    if (!s.ok()) Raise(s);
  }

  // None when training is over; else (clock, samples, assigned, partition, epoch).
  py::object NextBatch() {
    std::optional<BatchPlan> plan = Interruptible([&] { return trainer_->NextBatch(); });
    if (!plan) return py::none();
    return PlanTuple(*plan);
  }

  static py::tuple PlanTuple(const BatchPlan& plan) {
    py::array_t<uint32_t> samples(static_cast<py::ssize_t>(plan.samples.size()));
    std::copy(plan.samples.begin(), plan.samples.end(), samples.mutable_data());
    return py::make_tuple(plan.clock, samples, plan.assigned, plan.partition, plan.epoch);
  }

  // next_batch and pull in one hand-off to the call thread (the loader's
  // path when no loader process reads while the pull is on its way): as
  // next_batch, or None also when the job stopped while the pull waited.
  py::object NextPulled() {
    struct Step {
      std::optional<BatchPlan> plan;
      absl::StatusOr<int64_t> pulled = int64_t{-1};
    };
    Step step = Interruptible([&] {
      Step r;
      r.plan = trainer_->NextBatch();
      if (r.plan) r.pulled = trainer_->Pull();
      return r;
    });
    if (!step.plan) return py::none();
    if (!step.pulled.ok()) {
      if (trainer_->stopping()) return py::none();
      Raise(step.pulled.status());
    }
    return PlanTuple(*step.plan);
  }

  std::optional<int64_t> Pull() {
    absl::StatusOr<int64_t> r = Interruptible([&] { return trainer_->Pull(); });
    if (r.ok()) return *r;
    if (trainer_->stopping()) return std::nullopt;  // the job stopped: next_batch says None
    Raise(r.status());
  }

  void Push(double loss) {
    absl::Status s = Interruptible([&] {
      trainer_->StartPush();
      return trainer_->FinishPush(static_cast<float>(loss));
    });
    // A push given up because the job stopped is not an error: next_batch
    // says None.
    if (!s.ok() && !trainer_->stopping()) Raise(s);
  }

  void Report(double accuracy, double loss, size_t samples) {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = trainer_->Report({accuracy, loss, samples});
    }
    if (!s.ok()) Raise(s);
  }

  void SetLearningRates(const std::vector<std::pair<uint32_t, float>>& lrs) {
    std::vector<wire::GroupLr> v;
    for (const auto& [group, lr] : lrs) v.emplace_back(group, lr);
    trainer_->SetLearningRates(std::move(v));
  }

  py::dict Finish() {
    absl::StatusOr<WorkerResult> r;
    {
      py::gil_scoped_release release;
      r = trainer_->Finish();
    }
    // The evaluation thread is joined: the function (which may hold the
    // module, whose parameters hold this object's buffers) is let go.
    evaluate_ = py::none();
    if (!r.ok()) Raise(r.status());
    py::dict d;
    d["id"] = r->id;
    d["rank"] = r->rank;
    d["clocks"] = r->clocks;
    d["samples"] = r->samples;
    d["last_batch"] = r->last_batch;
    d["compute_seconds"] = r->compute_seconds;
    d["communication_seconds"] = r->communication_seconds;
    d["wait_seconds"] = r->wait_seconds;
    d["seconds"] = r->seconds;
    d["stop_reason"] = r->stop_reason;
    return d;
  }

  // The buffer as an array over the runtime's memory; `self` keeps it alive.
  py::array Buffer(std::span<float> b, py::object self) {
    if (b.empty()) throw py::value_error("the trainer has not started");
    return py::array_t<float>({static_cast<py::ssize_t>(b.size())}, {sizeof(float)}, b.data(),
                              self);
  }

  Trainer& trainer() { return *trainer_; }

  ~PyTrainer() {
    // The evaluation thread may be waiting for the GIL: the trainer (which
    // joins it) goes without it, before evaluate_ drops its reference.
    py::gil_scoped_release release;
    trainer_.reset();
  }

 private:
  py::object evaluate_;  // the evaluate function, or None
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Trainer> trainer_;
  std::unique_ptr<PythonModel> model_;
  CallThread caller_;  // last: it ends (joins) before the trainer goes
};

}  // namespace
}  // namespace pacer::worker

PYBIND11_MODULE(_core, m) {
  using pacer::worker::PyTrainer;
  m.doc() = "Pacer's training runtime (pacer::worker::Trainer); pacer.torch is built on it";
  // The runtime's log lines go to stderr, as pacer-worker's do (stdout
  // stays the program's); PACER_LOG_LEVEL sets the level (default info).
  const char* level = std::getenv("PACER_LOG_LEVEL");
  pacer::SetupLogging("worker", level != nullptr && *level != '\0' ? level : "info");
  m.def("address_error", &pacer::PeerAddressError, py::arg("address"),
        "What is wrong with a monitor's address ('' when nothing is): tcp://HOST:PORT or "
        "ipc://PATH, as the command-line tools check it");
  py::class_<PyTrainer>(m, "Trainer")
      .def(py::init<const std::string&, size_t, const std::vector<std::string>&,
                    const std::string&, const std::string&, double, double, double, uint32_t,
                    const std::string&, const std::string&, const std::string&, py::object,
                    int64_t, const std::string&, const std::string&,
                    const std::vector<std::string>&>(),
           py::arg("monitor"), py::arg("block_floats") = 32768,
           py::arg("param_groups") = std::vector<std::string>{}, py::arg("optimizer") = "",
           py::arg("optimizer_settings") = "", py::arg("request_timeout") = 60.0,
           py::arg("start_timeout") = 120.0, py::arg("progress_interval") = 1.0,
           py::arg("max_batch") = 0, py::arg("sample_log") = "", py::arg("ack_log") = "",
           py::arg("step_log") = "", py::arg("evaluate") = py::none(),
           py::arg("rank_hint") = -1, py::arg("outer") = "", py::arg("outer_settings") = "",
           py::arg("outer_groups") = std::vector<std::string>{},
           "A worker of the job at `monitor` (tcp://HOST:PORT). param_groups: "
           "'NAME:TENSOR,TENSOR:SETTINGS' (pacer-worker --param-group), group i+1 in order; "
           "optimizer: the kind it declares ('sgd', 'adam', 'adamw', 'adagrad'; '': none) "
           "with its default group's settings ('lr=0.001,betas=0.9:0.999'); evaluate: "
           "called on a side thread when the monitor asks this worker to evaluate, with a "
           "copy of the latest parameters (float32), returning (accuracy, loss, samples); "
           "rank_hint: the rank to ask for (-1: any); outer, outer_settings, outer_groups: "
           "in mode local, the outer optimizer declared instead of optimizer and param_groups "
           "(outer '' there: none)")
      .def("start", &PyTrainer::Start, py::arg("names"), py::arg("sizes"), py::arg("init"),
           py::arg("samples"),
           "Registers, declares the tensors, waits for the run; the first worker sets the "
           "shards' model from `init` (float32, the tensors end to end)")
      .def_property_readonly(
          "data_stream", [](PyTrainer& t) { return t.trainer().data_stream(); },
          "Whether the job reads one data stream (pacer-monitor's default): a plan's epoch is "
          "then the job's epoch over the whole data set")
      .def("next_batch", &PyTrainer::NextBatch,
           "(clock, samples, assigned, partition, epoch) of the next iteration, or None when "
           "training is over (the job stopped, the epochs ran, cancel())")
      .def("next_pulled", &PyTrainer::NextPulled,
           "next_batch() and then pull() in one call: the plan, or None when training is over "
           "or the job stopped while the pull waited")
      .def("pull", &PyTrainer::Pull,
           "Pulls this iteration's parameters into `params`; the applied clock they reflect "
           "(-1: none yet), or None when given up because the job stopped")
      .def("push", &PyTrainer::Push, py::arg("loss") = std::nan(""),
           "Pushes `grads` (the gradient of the batch-mean loss) and waits for the "
           "acknowledgement; then the batch's samples count as trained")
      .def("report", &PyTrainer::Report, py::arg("accuracy"), py::arg("loss") = 0.0,
           py::arg("samples") = 0, "Sends an evaluation to the monitor (--target-accuracy)")
      .def("set_learning_rates", &PyTrainer::SetLearningRates, py::arg("lrs"),
           "[(group, lr), ...]: the lr each later push carries for each group")
      .def("finish", &PyTrainer::Finish, "Ends the run; the run's figures")
      .def("cancel", [](PyTrainer& t) { t.trainer().Cancel(); },
           "Asks the trainer to stop soon; thread- and signal-safe")
      .def_property_readonly("params",
                             [](py::object self) {
                               PyTrainer& t = self.cast<PyTrainer&>();
                               return t.Buffer(t.trainer().params(), self);
                             })
      .def_property_readonly("grads",
                             [](py::object self) {
                               PyTrainer& t = self.cast<PyTrainer&>();
                               return t.Buffer(t.trainer().grads(), self);
                             })
      .def_property_readonly("evaluator",
                             [](PyTrainer& t) { return t.trainer().evaluator(); })
      .def_property_readonly("stopping", [](PyTrainer& t) { return t.trainer().stopping(); })
      .def_property_readonly(
          "local_steps", [](PyTrainer& t) { return t.trainer().local_steps(); },
          "Whether the job runs rounds of local steps (pacer-monitor --mode local): push() "
          "ends a local step the caller took on params, and pushes the round's change when "
          "the round is due")
      .def_property_readonly(
          "round_began", [](PyTrainer& t) { return t.trainer().round_began(); },
          "Mode local: whether the last pull began a round (params holds the shards' "
          "parameters; else the caller's own)")
      .def_property_readonly("optimizer",
                             [](PyTrainer& t) {
                               return std::string(pacer::OptimizerName(t.trainer().optimizer()));
                             })
      .def_property_readonly("id", [](PyTrainer& t) { return t.trainer().id(); })
      .def_property_readonly("rank", [](PyTrainer& t) { return t.trainer().rank(); });
}
