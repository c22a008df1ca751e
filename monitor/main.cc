// pacer-monitor: the control plane of one job.
#include <csignal>
#include <cstdio>
#include <map>
#include <random>

#include "monitor/monitor.h"
#include "ps/base/cli.h"
#include "ps/base/rpc.h"
#include "ps/staleness.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  pacer::MonitorOptions opts;
  std::string log_level = "info";
  pacer::MetricsFlags metrics_flags;
  std::string mode;
  std::string policy_name = "pacer";
  int staleness = -1, staleness_range = -1;
  double policy_interval_s = 0.25;
  double lease_s = 3;
  double report_threshold = 0.85;
  double shard_resend_ms = 300, stop_grace_s = 2;
  opts.job_id = 0;

  CLI::App app{"pacer-monitor: the control plane of a Pacer job. Shards and workers register "
               "with it; it builds the shard map, tracks leases and ends the run.",
               "pacer-monitor"};
  app.add_option("--listen", opts.listen, "Address to bind, tcp://HOST:PORT (port 0: ephemeral; "
                 "the bound address is printed on stdout as 'listening ADDRESS')")
      ->capture_default_str();
  pacer::AddMetricsFlags(app, &metrics_flags);
  pacer::FaultFlags fault_flags;
  pacer::AddFaultFlags(app, &fault_flags);
  pacer::SecurityFlags security;
  pacer::AddSecurityFlags(app, &security);
  app.add_option("--job-id", opts.job_id, "Job id carried by every message (default: random)");
  app.add_option("--policy", policy_name,
                 "Straggler policy: fixed (even batches), adaptive-batch (batch sizes follow "
                 "measured speed, LB-BSP), pacer (adaptive-batch + dssp). Default: pacer, or "
                 "fixed when --mode is given")
      ->check(CLI::IsMember({"fixed", "adaptive-batch", "pacer"}))->capture_default_str();
  app.add_option("--mode", mode,
                 "Consistency mode enforced by the shards: bsp, asp, ssp, dssp, backup, or local "
                 "(rounds of local steps: each worker trains with its own optimizer and pushes "
                 "the change of its weights once per round; the shards' optimizer is the outer "
                 "one, by default sgd with lr 0.7, momentum 0.9, nesterov) "
                 "(default: dssp for --policy pacer, else bsp)")
      ->check(CLI::IsMember({"bsp", "asp", "ssp", "dssp", "backup", "local"}));
  CLI::Option* round_steps_flag =
      app.add_option("--round-steps", opts.round_steps,
                     "local: a worker's round ends after this many local steps")
          ->check(CLI::Range(1u, 1000000u));
  CLI::Option* round_seconds_flag =
      app.add_option("--round-seconds", opts.round_seconds,
                     "local: a worker's round ends at its first local step that ends this many "
                     "seconds after the round's pull, so that a slower worker takes fewer "
                     "steps (default 10, unless --round-steps is given)")
          ->check(CLI::Range(0.001, 86400.0));
  app.add_option("--staleness", staleness,
                 "ssp: the bound s; dssp: its lower bound s_L (default: 3 for ssp, 0 for dssp)")
      ->check(CLI::Range(0, 64));
  app.add_option("--staleness-range", staleness_range,
                 "dssp: r_max, the most extra iterations past s_L (default: 4)")
      ->check(CLI::Range(0, 64));
  app.add_option("--backup-workers", opts.backup_workers,
                 "backup: k, the workers a synchronous round does not wait for")
      ->capture_default_str()->check(CLI::Range(1, 1024));
  app.add_option("--staleness-aware-lr", opts.staleness_aware_lr,
                 "Weight a gradient computed on parameters tau steps old by 1/(1+tau) "
                 "(ssp, dssp, asp)")
      ->capture_default_str();
  app.add_option("--policy-interval", policy_interval_s,
                 "Seconds between rounds of the batch-size rule")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--level-shift", opts.policy.level_shift,
                 "A worker report whose compute time is off the cost model by more than this "
                 "(relative) and by more than --shift-spreads times the worker's own spread is "
                 "suspect; suspects off the same way over --shift-reports reports and "
                 "--shift-seconds are a level shift, which resizes that worker at once (so is "
                 "one report of 2+ iterations whose every iteration is over 2x off, and a streak "
                 "of --shift-iterations iterations over 2x off together); 0: off")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--level-shift-faster", opts.policy.level_shift_faster,
                 "The same bar for a report quicker than the model: suspect only when its "
                 "compute is under 1/(1 + this) of the prediction (a worker that sped up holds "
                 "up nobody, so noise's quick spells are left to the damped rounds)")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--shift-spreads", opts.policy.shift_spreads,
                 "How many times a worker's own spread a report must be off to be suspect")
      ->capture_default_str()->check(CLI::Range(0.0, 100.0));
  app.add_option("--shift-reports", opts.policy.shift_reports,
                 "Suspect reports in a row that confirm a level shift")
      ->capture_default_str()->check(CLI::Range(1, 100));
  app.add_option("--shift-iterations", opts.policy.shift_iterations,
                 "Iterations in a streak of suspect reports that, over 2x off together (and "
                 "still suspect without the most extreme one), confirm a level shift before "
                 "--shift-seconds; 0: off")
      ->capture_default_str()->check(CLI::Range(0, 100000));
  app.add_option("--shift-seconds", opts.policy.shift_seconds,
                 "How long the suspect reports must have lasted to confirm a level shift")
      ->capture_default_str()->check(CLI::Range(0.0, 60.0));
  app.add_option("--fit-seconds", opts.policy.fit_seconds,
                 "Memory of the per-worker cost model (fixed + per-sample compute): reports "
                 "this many seconds old weigh 1/e of a fresh one")
      ->capture_default_str()->check(CLI::Range(0.05, 3600.0));
  app.add_option("--damping", opts.policy.damping,
                 "Fraction of the way to its target a batch size moves in one round (1: all "
                 "the way; a confirmed level shift always moves all the way)")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  app.add_option("--catch-up", opts.policy.catch_up_iterations,
                 "pacer over dssp: a worker more than max(2, r_max) clocks behind the median "
                 "one takes max(0.5, 1 - lag/N) of the common iteration time, but never less "
                 "than 3/4 of the batch it would get without catch-up (half, once it is more "
                 "than s_L behind and holds the others at the bound), until it catches up; "
                 "0: off")
      ->capture_default_str();
  app.add_option("--min-batch", opts.policy.batch.b_min, "Smallest batch the policy assigns")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--max-batch", opts.policy.batch.b_max,
                 "Largest batch the policy assigns (a worker's memory limit may lower it)")
      ->capture_default_str()->check(pacer::Positive())
      // Not PACER_MAX_BATCH: the worker's --max-batch means its memory limit.
      ->envname("PACER_POLICY_MAX_BATCH");
  app.add_option("--deadband", opts.policy.batch.deadband,
                 "Relative batch change the policy skips as noise")
      ->capture_default_str()->check(CLI::Range(0.0, 0.5));
  // The shards' optimizer and the job's default parameter group when the
  // first worker declares none (a pacer.torch script declares its own):
  // torch.optim's settings, each defaulting as torch 1.13 does for the
  // chosen optimizer (Pacer's SGD: lr 0.1, momentum 0.9). Checked after
  // parsing, exit 2.
  std::string optimizer_name = "sgd";
  pacer::OptimizerSettings given;
  app.add_option("--optimizer", optimizer_name,
                 "Server-side optimizer, torch.optim's update of PyTorch 1.13: sgd, adam, adamw "
                 "or adagrad. With its settings (--lr ...), the job's when its first worker "
                 "declares none (pacer-worker); a pacer.torch script declares its own")
      ->capture_default_str();
  struct FloatFlag {
    const char* name;
    float pacer::OptimizerSettings::*field;
    const char* help;
  };
  static constexpr FloatFlag kFloatFlags[] = {
      {"--lr", &pacer::OptimizerSettings::lr,
       "Learning rate (default: 0.1 for sgd, 1e-3 for adam and adamw, 1e-2 for adagrad); a "
       "push's lr or pacerctl set-lr may change it while training runs"},
      {"--momentum", &pacer::OptimizerSettings::momentum, "sgd: momentum (default 0.9)"},
      {"--dampening", &pacer::OptimizerSettings::dampening,
       "sgd: dampening of the momentum (default 0)"},
      {"--weight-decay", &pacer::OptimizerSettings::weight_decay,
       "Weight decay (default 0; adamw 1e-2, decoupled as in AdamW)"},
      {"--beta1", &pacer::OptimizerSettings::beta1, "adam, adamw: beta1 of betas (default 0.9)"},
      {"--beta2", &pacer::OptimizerSettings::beta2, "adam, adamw: beta2 of betas (default 0.999)"},
      {"--eps", &pacer::OptimizerSettings::eps,
       "adam, adamw: eps (default 1e-8); adagrad: eps (default 1e-10)"},
      {"--lr-decay", &pacer::OptimizerSettings::lr_decay, "adagrad: lr_decay (default 0)"},
      {"--initial-accumulator-value", &pacer::OptimizerSettings::initial_accumulator_value,
       "adagrad: initial_accumulator_value (default 0)"},
  };
  std::vector<CLI::Option*> float_options;
  for (const FloatFlag& f : kFloatFlags) {
    float_options.push_back(app.add_option(f.name, given.*f.field, f.help));
  }
  CLI::Option* nesterov_flag =
      app.add_flag("--nesterov", given.nesterov, "sgd: Nesterov momentum (needs a momentum and no dampening)");
  CLI::Option* amsgrad_flag =
      app.add_flag("--amsgrad", given.amsgrad, "adam, adamw: the AMSGrad variant");
  app.add_option("--global-batch", opts.global_batch,
                 "Global batch B, split evenly across the workers present at the start")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--epochs", opts.epochs,
                 "Epochs (0: no cap): passes over the whole training set by the job (with "
                 "--data-partitions, each worker's over its own partition)")
      ->capture_default_str();
  app.add_option("--time-cap", opts.time_cap_seconds, "Stop after this many seconds of training "
                 "(0: no cap)")->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--target-accuracy", opts.target_accuracy,
                 "Stop once the evaluating worker reports this test accuracy (0: never)")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--report-accuracy", report_threshold,
                 "Accuracy whose first crossing is timed and printed as 'time to ACC: S s'")
      ->capture_default_str()->check(CLI::Range(0.0, 1.0));
  app.add_option("--seed", opts.seed, "Seed for initialisation and shuffling")->capture_default_str();
  app.add_option("--min-shards", opts.min_shards, "Shards that must register before the run starts")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--min-workers", opts.min_workers, "Workers that must register before the run starts")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--replicas", opts.replicas,
                 "Backups per key range: other shards, on other hosts (shard --node) where there "
                 "are, named in the shard map and in pacerctl status. Too few shards: a range "
                 "has fewer, counted on pacer_monitor_ranges_under_replicated. Each primary "
                 "copies every applied step to its backups; when it misses its --shard-lease a "
                 "backup serves the range in its place")
      ->capture_default_str()->check(CLI::Range(0, 8));
  double shard_lease_s = 1.0;
  app.add_option("--shard-lease", shard_lease_s,
                 "With --replicas: seconds without a shard's heartbeat before its range fails "
                 "over to a backup; a primary cut off from the monitor this long stops "
                 "answering first (shards heartbeat every 0.2 s)")
      ->capture_default_str()->check(CLI::Range(0.3, 60.0));
  app.add_option("--lease", lease_s,
                 "Seconds without a heartbeat before a worker is declared dead (and a shard "
                 "marked down, without --replicas; with it, --shard-lease)")
      ->capture_default_str()->check(pacer::Positive());
  pacer::UnsafeSwitches unsafe;
  pacer::AddUnsafeDisableFlag(app, &unsafe,
                              {{"lease-expiry", "a worker silent past its lease is never declared "
                                                "dead, so the others wait for it forever"}});
  app.add_option("--heartbeat-ms", opts.heartbeat_interval_ms,
                 "Milliseconds between worker heartbeats (sent to workers)")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--eval-interval", opts.eval_interval_seconds,
                 "Seconds between the evaluating worker's test-set evaluations")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--eval-every-clocks", opts.eval_interval_clocks,
                 "Also evaluate every this many clocks, logged as 'clock C (every N clocks)'; "
                 "steps to an accuracy compare fairly between runs only on such a schedule "
                 "(0: by time only)")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--shard-resend-ms", shard_resend_ms,
                 "Milliseconds before an unacknowledged update to a shard is sent again")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--stop-grace", stop_grace_s,
                 "Seconds the monitor keeps answering after the job stops, so everyone hears")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--max-message-bytes", opts.max_message_bytes, "Largest accepted message in bytes")
      ->capture_default_str()->check(pacer::Positive());
  app.add_flag("--rescale-batch", opts.rescale_batch,
               "As workers join or leave, scale the global batch with their number (each keeps "
               "its share); default: keep --global-batch and split it anew");
  CLI::Option* stream_flag = app.add_flag(
      "--data-stream", opts.data_stream,
      "Read the training set as one data stream (the default; the flag is kept for scripts): "
      "one shuffled order per epoch, handed to the workers in chunks that follow their speed, "
      "every sample once per epoch, the epoch's tail taken over by quicker workers");
  CLI::Option* chunk_option =
      app.add_option("--chunk-samples", opts.chunk_samples,
                     "Data stream: samples per chunk (0: two seconds of each worker's measured "
                     "speed)")
          ->capture_default_str();
  app.add_option("--data-partitions", opts.data_partitions,
                 "Instead of the data stream, cut the training set into N partitions, each read "
                 "by one live worker at a time from where the last one stopped; --epochs then "
                 "counts each worker's passes over its own")
      ->check(pacer::Positive())
      ->excludes(stream_flag)
      ->excludes(chunk_option);
  app.add_option("--data-dir", opts.data_dir,
                 "Directory for the monitor's state (RocksDB, in DIR/state; created if missing): "
                 "membership, shard map, assignments. A monitor restarted on it carries on with "
                 "the same job; empty: no state on disk");
  pacer::AddLogLevelFlag(app, &log_level);
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;

  if (opts.data_partitions > 0) opts.data_stream = false;
  pacer::SetupLogging("monitor", log_level);
  pacer::WarnUnsafe(unsafe);
  if (app.count("--policy") == 0 && !mode.empty()) policy_name = "fixed";
  opts.policy.kind = *pacer::policy::ParseKind(policy_name);
  if (mode.empty()) mode = opts.policy.kind == pacer::policy::Kind::kPacer ? "dssp" : "bsp";
  if (opts.policy.kind == pacer::policy::Kind::kPacer && mode != "dssp") {
    std::fprintf(stderr,
                 "--policy pacer is adaptive-batch with --mode dssp; for adaptive batch sizes "
                 "over --mode %s use --policy adaptive-batch\n",
                 mode.c_str());
    return pacer::kExitUsage;
  }
  opts.mode = *pacer::ParseMode(mode);  // CLI11 checked the name
  if (opts.mode == pacer::wire::Mode::Local) {
    if (round_steps_flag->count() == 0 && round_seconds_flag->count() == 0) opts.round_seconds = 10;
  } else if (round_steps_flag->count() > 0 || round_seconds_flag->count() > 0) {
    std::fprintf(stderr, "--round-steps and --round-seconds need --mode local (the mode is %s)\n",
                 mode.c_str());
    return pacer::kExitUsage;
  }
  opts.policy.staleness = staleness >= 0 ? staleness : (mode == "ssp" ? 3 : 0);
  opts.policy.staleness_range = staleness_range >= 0 ? staleness_range : 4;
  opts.policy.interval = pacer::FromSeconds(policy_interval_s);
  const uint32_t widest =
      opts.policy.staleness + (mode == "dssp" ? opts.policy.staleness_range : 0);
  if (widest > pacer::kMaxStalenessBound) {
    std::fprintf(stderr, "the staleness bound (--staleness%s) comes to %u; at most %u\n",
                 mode == "dssp" ? " plus --staleness-range" : "", widest,
                 pacer::kMaxStalenessBound);
    return pacer::kExitUsage;
  }
  if (uint64_t{opts.policy.batch.b_min} * opts.min_workers > opts.global_batch) {
    std::fprintf(stderr, "--min-batch %u times --min-workers %u is above --global-batch %u\n",
                 opts.policy.batch.b_min, opts.min_workers, opts.global_batch);
    return pacer::kExitUsage;
  }
  if (opts.policy.batch.b_min > opts.policy.batch.b_max) {
    std::fprintf(stderr, "--min-batch %u is above --max-batch %u\n", opts.policy.batch.b_min,
                 opts.policy.batch.b_max);
    return pacer::kExitUsage;
  }
  {
    auto kind = pacer::ParseOptimizerKind(optimizer_name);
    if (!kind.ok()) {
      std::fprintf(stderr, "--optimizer: %s\n", std::string(kind.status().message()).c_str());
      return pacer::kExitUsage;
    }
    // Each setting the command line (or config, or environment) gave wins
    // over the optimizer's default.
    pacer::OptimizerSettings settings = pacer::DefaultSettings(*kind);
    if (opts.mode == pacer::wire::Mode::Local && *kind == pacer::OptimizerKind::kSgd) {
      // The outer optimizer of local steps (DiLoCo's): Nesterov momentum.
      settings.lr = 0.7f;
      settings.nesterov = true;
    }
    for (size_t i = 0; i < float_options.size(); ++i) {
      if (float_options[i]->count() > 0) settings.*kFloatFlags[i].field = given.*kFloatFlags[i].field;
    }
    if (nesterov_flag->count() > 0) settings.nesterov = given.nesterov;
    if (amsgrad_flag->count() > 0) settings.amsgrad = given.amsgrad;
    if (absl::Status st = pacer::ValidateSettings(*kind, settings, "optimizer flags"); !st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      return pacer::kExitUsage;
    }
    opts.optimizer = *kind;
    opts.optimizer_settings = settings;
  }
  opts.lease = pacer::FromSeconds(lease_s);
  opts.shard_lease = pacer::FromSeconds(shard_lease_s);
  opts.safeguards = unsafe.safeguards();
  opts.shard_resend = pacer::FromSeconds(shard_resend_ms / 1000.0);
  opts.stop_grace = pacer::FromSeconds(stop_grace_s);
  opts.registry = std::make_shared<prometheus::Registry>();

  std::unique_ptr<pacer::MetricsServer> metrics;
  if (!pacer::ServeMetrics(metrics_flags, "monitor", opts.registry, &metrics)) {
    return pacer::kExitFailure;
  }
  pacer::TransportOptions topts;
  topts.max_message_bytes = opts.max_message_bytes * 2;
  auto secure = pacer::ApplySecurity(security, "monitor", opts.registry.get(), &topts);
  if (!secure.ok()) {
    spdlog::error("{}", std::string(secure.status().message()));
    return pacer::kExitUsage;
  }
  opts.operator_keys = secure->operator_keys;
  std::shared_ptr<pacer::FaultInjector> faults;
  auto transport = pacer::MakeProcessTransport(topts, fault_flags, opts.registry.get(), &faults);
  if (transport == nullptr) return pacer::kExitUsage;
  opts.faults = faults;
  opts.base_faults = faults->rules();
  const std::atomic<bool>& stop_signal = pacer::StopOnSignals();
  auto server = pacer::MonitorServer::Start(transport.get(), opts);
  if (!server.ok()) {
    spdlog::error("{}", pacer::ErrorText(server.status()));
    return pacer::kExitFailure;
  }
  (*server)->set_report_threshold(report_threshold);
  pacer::PrintAddress("listening", (*server)->address());
  pacer::MonitorServer* monitor = server->get();
  if (metrics) {
    metrics->SetReadiness([monitor] { return monitor->done() ? std::string("stopped") : ""; });
  }
  if (!(*server)->resumed()) {
    spdlog::info("job {} waiting for {} shard(s) and {} worker(s)", (*server)->job_id(),
                 opts.min_shards, opts.min_workers);
  }
  if (opts.replicas > 0) {
    spdlog::info("--replicas {}: each key range is copied to {} backup(s) and fails over to one "
                 "after --shard-lease; see ps/README.md (Replicas) for what is guaranteed",
                 opts.replicas, opts.replicas);
  }
  while (!(*server)->done()) {
    if (stop_signal) {
      spdlog::info("signal received, shutting down");
      (*server)->Shutdown();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  (*server)->Wait();
  // The check must not outlive the server it reads (destroyed first below).
  if (metrics) metrics->SetReadiness([] { return std::string("stopped"); });
  auto acc = (*server)->last_accuracy();
  auto ttt = (*server)->time_to_target();
  std::printf("stop reason: %s\n", (*server)->stop_reason().c_str());
  std::printf("%s\n", (*server)->policy_summary().c_str());
  if (acc) std::printf("final test accuracy: %.4f\n", *acc);
  if (ttt) {
    std::printf("time to %.2f: %.2f s\n", report_threshold, *ttt);
  } else {
    std::printf("time to %.2f: not reached\n", report_threshold);
  }
  std::fflush(stdout);
  // Every worker refused: the job never ran, which a launcher must see.
  return (*server)->stop_failed() ? pacer::kExitFailure : pacer::kExitOk;
}
