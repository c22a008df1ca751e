// pacer-worker: trains the model on its data partition against the shards.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <optional>
#include <sstream>

#include "ps/base/cli.h"
#include "ps/base/rpc.h"
#include "spdlog/spdlog.h"
#include "worker/worker.h"

namespace {
pacer::worker::Worker* g_worker = nullptr;
void OnSignal(int) {
  if (g_worker) g_worker->Cancel();
}
}  // namespace

int main(int argc, char** argv) {
  pacer::worker::WorkerOptions opts;
  std::string log_level = "info";
  std::string layers = "784,256,128,10";
  double request_timeout_s = 60, start_timeout_s = 120, progress_s = 1;
  std::string progress = "auto";
  std::string schedule;
  int contention = 0, pin_cpu = -1;

  CLI::App app{"pacer-worker: a Pacer training worker. It registers with the monitor, trains a "
               "model (an MLP, --layers, or a CNN, --model cnn) on its data partitions of "
               "Fashion-MNIST, on the CPU or a CUDA GPU (--device), and pushes gradients to and "
               "pulls parameters from the shards.",
               "pacer-worker"};
  std::string evaluate_model;
  app.add_option("--monitor", opts.monitor,
                 "The monitor's address, tcp://HOST:PORT (required unless --evaluate-model)")
      ->check(pacer::PeerAddress());
  app.add_option("--evaluate-model", evaluate_model,
                 "Evaluate an exported model (pacerctl export-model FILE) on the test set, print "
                 "'test accuracy: A' and 'test loss: L' on stdout, and exit; needs no cluster");
  app.add_option("--dataset", opts.dataset_dir, "Directory with the Fashion-MNIST IDX .gz files")
      ->capture_default_str();
  app.add_option("--train-limit", opts.train_limit,
                 "Use only the first N training samples (0: all)")->capture_default_str();
  app.add_option("--test-limit", opts.test_limit,
                 "Rank 0 evaluates only the first N test samples (0: all)")->capture_default_str();
  std::string model = "mlp", cnn_channels = "16,32";
  app.add_option("--model", model, "The model: mlp (--layers) or cnn (conv-pool-conv-pool-fc, "
                                   "--cnn-channels); every worker of a job must train the same")
      ->check(CLI::IsMember({"mlp", "cnn"}))->capture_default_str();
  app.add_option("--device", opts.device,
                 "Where to compute: cpu, cuda, cuda:N, or auto (cuda:0 where a GPU exists, else "
                 "cpu). A CUDA device that cannot be used is an error, never a CPU fallback")
      ->capture_default_str();
  app.add_option("--layers", layers, "MLP layer widths, comma-separated; first 784, last 10")
      ->capture_default_str();
  app.add_option("--cnn-channels", cnn_channels,
                 "CNN: filters of its two 5x5 convolutions, comma-separated")
      ->capture_default_str();
  app.add_option("--block-floats", opts.block_floats,
                 "Cut each layer into keys of at most this many floats")
      ->capture_default_str()->check(pacer::Positive());
  std::vector<std::string> param_groups;
  app.add_option("--param-group", param_groups,
                 "A parameter group the model declares, NAME:PATTERNS:SETTINGS: the tensors "
                 "whose names match a comma-separated shell pattern (fc1.weight, fc1.bias, ...) "
                 "step with these torch.optim settings over the job's, e.g. "
                 "'no_decay:*.bias:weight_decay=0' or 'head:fc3.*:lr=0.01'; repeatable, the "
                 "first match wins");
  std::string local_optimizer = "adamw", local_settings;
  app.add_option("--local-optimizer", local_optimizer,
                 "Mode local (pacer-monitor --mode local): the optimizer of this worker's local "
                 "steps between a round's pull and its push: sgd, adam, adamw or adagrad, "
                 "torch.optim's update; its state is kept across rounds")
      ->capture_default_str();
  app.add_option("--local-settings", local_settings,
                 "Mode local: the local optimizer's torch.optim settings over its defaults, "
                 "e.g. 'lr=0.001,weight_decay=0.01'");
  std::string overlap = "on";
  app.add_option("--overlap", overlap,
                 "on: push each layer's gradient as soon as the backward pass finishes it, and "
                 "prepare the batch while the pull is answered; off: pull, compute, push")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  app.add_option("--request-timeout", request_timeout_s,
                 "Seconds one push or pull may take, waiting on the barrier included")
      ->capture_default_str()->check(pacer::Positive())
      // Not PACER_REQUEST_TIMEOUT: pacer-server's means something else (1 s).
      ->envname("PACER_WORKER_REQUEST_TIMEOUT");
  app.add_option("--start-timeout", start_timeout_s,
                 "Seconds to wait for registration and for the run to start")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--progress-interval", progress_s, "Seconds between progress lines")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--progress", progress,
                 "Progress style: live (one updating line), plain (a line per interval), "
                 "auto (live on a terminal)")
      ->check(CLI::IsMember({"auto", "live", "plain"}))->capture_default_str();
  app.add_option("--max-message-bytes", opts.max_message_bytes, "Largest accepted message in bytes")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--slowdown", opts.slowdown,
                 "Straggler emulation: stretch every iteration's compute to FACTOR times by "
                 "sleeping")
      ->capture_default_str()->check(CLI::Range(1.0, 1000.0));
  app.add_option("--slowdown-schedule", schedule,
                 "Straggler emulation over time: SECONDS:FACTOR,... by elapsed training second, "
                 "e.g. 0:1,30:4,60:1 (before its first step: --slowdown)");
  app.add_option("--cpu-contention", contention,
                 "Emulate a shared node: start N busy threads in this process (with --pin-cpu "
                 "they share the worker's CPU)")
      ->capture_default_str()->check(CLI::Range(0, 64));
  app.add_option("--pin-cpu", pin_cpu, "Pin the worker (and its --cpu-contention threads) to this CPU")
      ->check(pacer::NonNegative());
  app.add_option("--sample-log", opts.sample_log,
                 "Append one line per acknowledged push to this file: partition, epoch, and the "
                 "training-set indices of the batch (for checking what was trained)");
  app.add_option("--ack-log", opts.ack_log,
                 "Append one line per acknowledged push to this file, the moment the client "
                 "reports it, flushed at once: Unix time, push sequence number, clock, samples "
                 "in the batch (the chaos runner's record of what the cluster acknowledged); with "
                 "replicas each range's epoch at the shard that acknowledged it (RANGE:EPOCH), "
                 "and 'durable TIME SEQ' once every push acknowledged through SEQ is durable");
  app.add_option("--step-log", opts.step_log,
                 "Append one line per iteration to this file: seconds since training started, "
                 "clock, batch, compute, communication and wait seconds");
  app.add_option("--max-batch", opts.max_batch,
                 "Largest batch this worker can hold, reported to the policy as its memory "
                 "limit (0: no limit)")
      ->capture_default_str()
      // Not PACER_MAX_BATCH: the monitor's --max-batch is the policy's bound.
      ->envname("PACER_WORKER_MAX_BATCH");
  int64_t rank_hint = -1;
  app.add_option("--rank", rank_hint,
                 "The rank to ask the monitor for, given when it is below the monitor's "
                 "--min-workers and no live worker holds it (else the lowest free one); "
                 "pacer-run sets PACER_RANK to each worker's launch index; -1: any")
      ->capture_default_str()->check(CLI::Range(int64_t{-1}, int64_t{1} << 20))
      ->envname("PACER_RANK");
  pacer::MetricsFlags metrics_flags;
  pacer::AddMetricsFlags(app, &metrics_flags);
  pacer::FaultFlags fault_flags;
  pacer::AddFaultFlags(app, &fault_flags);
  pacer::SecurityFlags security;
  pacer::AddSecurityFlags(app, &security);
  pacer::UnsafeSwitches unsafe;
  pacer::AddUnsafeDisableFlag(app, &unsafe, pacer::worker::kUnsafeSwitches);
  pacer::AddLogLevelFlag(app, &log_level);
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  if (opts.monitor.empty() && evaluate_model.empty()) {
    std::fprintf(stderr, "pacer-worker: --monitor is required (or --evaluate-model FILE)\n");
    return pacer::kExitUsage;
  }

  // Comma-separated positive integers, or nullopt after saying why.
  auto widths = [](const std::string& flag, const std::string& text) -> std::optional<std::vector<int>> {
    std::vector<int> out;
    std::stringstream ss(text);
    for (std::string item; std::getline(ss, item, ',');) {
      try {
        size_t used = 0;
        const int v = std::stoi(item, &used);
        if (v <= 0 || used != item.size()) throw std::invalid_argument("not a positive integer");
        out.push_back(v);
      } catch (const std::exception&) {
        std::fprintf(stderr, "pacer-worker: %s: '%s' is not a positive integer\n", flag.c_str(),
                     item.c_str());
        return std::nullopt;
      }
    }
    return out;
  };
  auto mlp_layers = widths("--layers", layers);
  if (!mlp_layers) return pacer::kExitUsage;
  opts.model.mlp.layers = *mlp_layers;
  if (opts.model.mlp.layers.size() < 2 || opts.model.mlp.layers.front() != 784 ||
      opts.model.mlp.layers.back() != 10) {
    std::fprintf(stderr, "pacer-worker: --layers must start with 784 and end with 10\n");
    return pacer::kExitUsage;
  }
  auto channels = widths("--cnn-channels", cnn_channels);
  if (!channels) return pacer::kExitUsage;
  if (channels->size() != 2) {
    std::fprintf(stderr, "pacer-worker: --cnn-channels takes two counts, e.g. 16,32\n");
    return pacer::kExitUsage;
  }
  opts.model.cnn.conv1 = (*channels)[0];
  opts.model.cnn.conv2 = (*channels)[1];
  if (model == "cnn") opts.model.kind = pacer::worker::ModelSpec::Kind::kCnn;
  opts.overlap = overlap == "on";
  if (rank_hint >= 0) opts.rank_hint = static_cast<uint32_t>(rank_hint);
  {
    auto kind = pacer::ParseOptimizerKind(local_optimizer);
    auto given = pacer::ParseGroupSettings(local_settings);
    absl::Status st = !kind.ok() ? kind.status() : given.status();
    if (st.ok()) {
      opts.local_optimizer = {*kind, pacer::Resolve(pacer::DefaultSettings(*kind), *given)};
      st = pacer::ValidateSettings(*kind, opts.local_optimizer.settings, "--local-settings");
    }
    if (!st.ok()) {
      std::fprintf(stderr, "pacer-worker: --local-optimizer: %s\n", std::string(st.message()).c_str());
      return pacer::kExitUsage;
    }
  }
  for (const std::string& spec : param_groups) {
    auto group = pacer::worker::ParseParamGroup(spec);
    if (!group.ok()) {
      std::fprintf(stderr, "pacer-worker: %s\n", std::string(group.status().message()).c_str());
      return pacer::kExitUsage;
    }
    opts.param_groups.push_back(std::move(*group));
  }
  if (!schedule.empty()) {
    auto steps = pacer::worker::ParseSlowdownSchedule(schedule);
    if (!steps.ok()) {
      std::fprintf(stderr, "pacer-worker: --slowdown-schedule: %s\n",
                   std::string(steps.status().message()).c_str());
      return pacer::kExitUsage;
    }
    opts.slowdown_schedule = std::move(*steps);
  }
  opts.request_timeout = pacer::FromSeconds(request_timeout_s);
  opts.start_timeout = pacer::FromSeconds(start_timeout_s);
  opts.progress_interval = pacer::FromSeconds(progress_s);
  opts.live_progress = progress == "live" || (progress == "auto" && isatty(STDERR_FILENO));

  pacer::SetupLogging("worker", log_level);
  pacer::WarnUnsafe(unsafe);
  opts.safeguards = unsafe.safeguards();
  pacer::TuneAllocatorForLargeBuffers();
  std::unique_ptr<pacer::worker::CpuContention> contention_threads;
  if (contention > 0 || pin_cpu >= 0) {
    auto c = pacer::worker::CpuContention::Start(contention, pin_cpu);
    if (!c.ok()) {
      spdlog::error("{}", pacer::ErrorText(c.status()));
      return pacer::kExitFailure;
    }
    contention_threads = std::move(*c);
    if (contention > 0) {
      spdlog::info("emulating a shared node: {} busy thread(s){}", contention,
                   pin_cpu >= 0 ? fmt::format(" on CPU {}", pin_cpu) : std::string());
    }
  }
  if (!evaluate_model.empty()) {
    auto r = pacer::worker::EvaluateModelFile(evaluate_model, opts);
    if (!r.ok()) {
      spdlog::error("{}", pacer::ErrorText(r.status()));
      return pacer::kExitFailure;
    }
    std::printf("test accuracy: %.4f\ntest loss: %.4f\ntest samples: %zu\n", r->accuracy, r->loss,
                r->samples);
    return pacer::kExitOk;
  }
  opts.registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<pacer::MetricsServer> metrics;
  if (!pacer::ServeMetrics(metrics_flags, "worker", opts.registry, &metrics)) {
    return pacer::kExitFailure;
  }
  pacer::TransportOptions topts;
  topts.max_message_bytes = opts.max_message_bytes * 2;
  auto keys = pacer::ApplySecurity(security, "worker", opts.registry.get(), &topts);
  if (!keys.ok()) {
    spdlog::error("{}", std::string(keys.status().message()));
    return pacer::kExitUsage;
  }
  std::shared_ptr<pacer::FaultInjector> faults;
  auto transport = pacer::MakeProcessTransport(topts, fault_flags, opts.registry.get(), &faults);
  if (transport == nullptr) return pacer::kExitUsage;
  transport->SetServerKey(opts.monitor, keys->monitor_key);
  opts.faults = faults;
  // Machine-readable, for scripts and the chaos runner: 'worker id N'.
  opts.on_registered = [](uint32_t id, uint32_t) { pacer::PrintAddress("worker id", std::to_string(id)); };
  pacer::worker::Worker worker(transport.get(), opts);
  if (metrics) metrics->SetReadiness([&worker] { return worker.NotReadyReason(); });
  g_worker = &worker;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  auto result = worker.Run();
  g_worker = nullptr;
  if (metrics) metrics->SetReadiness([] { return std::string("finished"); });
  if (!result.ok()) {
    spdlog::error("{}", pacer::ErrorText(result.status()));
    return pacer::kExitFailure;
  }
  spdlog::info("done: rank {}, {} clocks, {} samples in {:.1f} s ({:.0f} samples/s), loss {:.4f}; {}",
               result->rank, result->clocks, result->samples, result->seconds,
               result->samples / std::max(1e-9, result->seconds), result->last_loss,
               result->stop_reason);
  // One machine-readable line for scripts (bench/stragglers, tests).
  std::printf("worker summary: rank=%u clocks=%lu samples=%lu seconds=%.3f compute_s=%.3f "
              "communication_s=%.3f wait_s=%.3f last_batch=%u\n",
              result->rank, static_cast<unsigned long>(result->clocks),
              static_cast<unsigned long>(result->samples), result->seconds,
              result->compute_seconds, result->communication_seconds, result->wait_seconds,
              result->last_batch);
  std::fflush(stdout);
  return pacer::kExitOk;
}
