// pacer-sim: runs the cluster simulator (bench/cluster_sim.h) once and
// prints one line of figures, or a CSV row with --csv.
#include <cstdio>
#include <map>

#include "bench/cluster_sim.h"
#include "ps/base/cli.h"

int main(int argc, char** argv) {
  pacer::sim::SimOptions o;
  std::string mode = "bsp", policy = "fixed", scenario = "none";
  bool csv = false, header = false;
  double model_bytes = 0, bandwidth = 1.25e9, latency = 100e-6;
  CLI::App app{"pacer-sim: simulates a Pacer cluster with the real straggler policy and "
               "consistency rules, and prints its throughput as a fraction of the ideal.",
               "pacer-sim"};
  app.add_option("--workers", o.workers, "Simulated workers")->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--mode", mode, "bsp, asp, ssp, dssp or backup")->capture_default_str()
      ->check(CLI::IsMember({"bsp", "asp", "ssp", "dssp", "backup"}));
  app.add_option("--policy", policy, "fixed, adaptive-batch or pacer")->capture_default_str()
      ->check(CLI::IsMember({"fixed", "adaptive-batch", "pacer"}));
  app.add_option("--staleness", o.staleness, "s (ssp) or s_L (dssp)")->capture_default_str();
  app.add_option("--staleness-range", o.staleness_range, "r_max (dssp)")->capture_default_str();
  app.add_option("--backup-workers", o.backup_workers, "k (backup)")->capture_default_str();
  app.add_option("--batch", o.batch, "Batch per worker at the start (B = batch x workers)")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--policy-interval", o.policy_interval, "Seconds between policy rounds")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--report-interval", o.report_interval,
                 "Seconds between a worker's heartbeats, which carry its timings and bring back "
                 "its batch size; 0: with every push")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--level-shift", o.level_shift,
                 "A report off the cost model by more than this (relative) is suspect; see "
                 "pacer-monitor --level-shift; 0: off")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--level-shift-faster", o.level_shift_faster,
                 "The same for a report quicker than the model; see pacer-monitor "
                 "--level-shift-faster")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--catch-up", o.catch_up,
                 "pacer over dssp: iterations over which a worker that fell behind is sized "
                 "to catch up; 0: off")
      ->capture_default_str();
  app.add_option("--scenario", scenario, "none, static, hetero, bursts or moving")
      ->capture_default_str();
  app.add_option("--slow-factor", o.slow_factor, "How much slower a straggler is")
      ->capture_default_str()->check(CLI::Range(1.0, 1000.0));
  app.add_option("--move-every", o.move_every, "moving: seconds before the straggler moves")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--burst-rate", o.burst_rate, "bursts: bursts per worker per second")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--burst-seconds", o.burst_seconds, "bursts: seconds per burst")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--seconds-per-sample", o.seconds_per_sample, "Base compute per sample")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--iteration-overhead", o.iteration_overhead, "Compute seconds per iteration")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--communication", o.communication, "Seconds of pull + push per iteration")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--model-bytes", model_bytes,
                 "When set, communication = 2 x model bytes / --bandwidth + --latency "
                 "(a pull and a push of the model)")
      ->check(pacer::NonNegative());
  app.add_option("--bandwidth", bandwidth, "Bytes per second, with --model-bytes")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--latency", latency, "Seconds per iteration on top, with --model-bytes")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--seconds", o.seconds, "Simulated seconds")->capture_default_str()
      ->check(pacer::Positive());
  app.add_option("--seed", o.seed, "Seed of the burst, noise and co-located job traces")
      ->capture_default_str();
  app.add_option("--noise", o.noise,
                 "Shared-node noise: compute x (1 + x(t)), x an Ornstein-Uhlenbeck process "
                 "with standard deviation NOISE/2, clipped to +-NOISE (0.3: +-30%); 0: none")
      ->capture_default_str()->check(CLI::Range(0.0, 0.9));
  app.add_option("--noise-seconds", o.noise_seconds, "Correlation time of the noise")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--colocated-rate", o.colocated_rate,
                 "Co-located jobs arriving per worker per second; 0: none")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--colocated-seconds", o.colocated_seconds, "Mean length of a co-located job")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--colocated-load", o.colocated_load,
                 "Each co-located job running multiplies compute by 1 + this")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--fit-seconds", o.fit_seconds, "The policy's cost-model memory")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--damping", o.damping, "The policy's step towards its target per round")
      ->capture_default_str()->check(CLI::Range(0.01, 1.0));
  app.add_option("--shift-seconds", o.shift_seconds,
                 "How long a streak of reports off the model must last to be a level shift")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--probe", o.probe,
                 "The policy's probing of sizes (relative) to learn the fixed cost; 0: off")
      ->capture_default_str()->check(CLI::Range(0.0, 0.5));
  app.add_option("--data-samples", o.data_samples,
                 "Model the data stream (pacer-monitor --data-stream) over a training set of this "
                 "many samples, for --epochs passes; the run ends when they are trained (0: off)")
      ->capture_default_str();
  app.add_option("--epochs", o.epochs, "With --data-samples: passes over the training set")
      ->capture_default_str();
  app.add_option("--chunk-samples", o.chunk_samples,
                 "With --data-samples: samples per chunk (0: two seconds of each worker's speed)")
      ->capture_default_str();
  app.add_flag("--csv", csv, "Print one CSV row");
  app.add_flag("--csv-header", header, "Print the CSV header and exit");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  const char* kHeader =
      "workers,mode,policy,scenario,throughput,ideal,fraction,wait_fraction,clocks,dropped,"
      "rounds,decision_mean_ms,decision_max_ms,min_batch,max_batch,stable_fraction,"
      "min_batch_ratio,max_batch_ratio,slow_workers,slow_reach_s,slow_in_band,epochs_done,"
      "epochs_s,epochs_floor_s,max_tail_s,stream_calls,stream_mean_us,stream_max_us";
  if (header) {
    std::printf("%s\n", kHeader);
    return 0;
  }
  o.mode = *pacer::ParseMode(mode);  // CLI11 checked the name
  if (model_bytes > 0) o.communication = 2 * model_bytes / bandwidth + latency;
  o.policy = *pacer::policy::ParseKind(policy);
  auto sc = pacer::sim::ParseScenario(scenario);
  if (!sc.ok()) {
    std::fprintf(stderr, "pacer-sim: %s\n", std::string(sc.status().message()).c_str());
    return pacer::kExitUsage;
  }
  o.scenario = *sc;
  auto r = pacer::sim::Simulate(o);
  if (!r.ok()) {
    std::fprintf(stderr, "pacer-sim: %s\n", std::string(r.status().message()).c_str());
    return pacer::kExitUsage;
  }
  if (csv) {
    std::printf("%d,%s,%s,%s,%.1f,%.1f,%.4f,%.4f,%lu,%lu,%lu,%.4f,%.4f,%u,%u,%.4f,%.3f,%.3f,%d,"
                "%.2f,%.4f,%u,%.3f,%.3f,%.3f,%lu,%.2f,%.1f\n", o.workers,
                mode.c_str(), policy.c_str(), scenario.c_str(), r->throughput,
                r->ideal_throughput, r->fraction, r->wait_fraction,
                static_cast<unsigned long>(r->clocks), static_cast<unsigned long>(r->dropped),
                static_cast<unsigned long>(r->rounds), r->decision_mean_seconds * 1e3,
                r->decision_max_seconds * 1e3, r->min_batch, r->max_batch, r->stable_fraction,
                r->min_batch_ratio, r->max_batch_ratio, r->slow_workers, r->slow_reach_seconds,
                r->slow_in_band_fraction, r->epochs_done, r->epochs_seconds,
                r->epochs_floor_seconds, r->max_tail_seconds,
                static_cast<unsigned long>(r->stream_calls), r->stream_mean_us, r->stream_max_us);
  } else {
    std::printf("workers %d  %s/%s  %s: throughput %.0f samples/s of ideal %.0f (%.3f), "
                "waiting %.1f%%, %lu clocks, %lu dropped, %lu policy rounds "
                "(decision mean %.3f ms, max %.3f ms), batches %u..%u; %.1f%% of samples in "
                "steps with every batch within [0.5, 1.5] x B/n, batches %.2f..%.2f x B/n; "
                "fitted fixed cost %.1f samples; %lu level shifts confirmed",
                o.workers, mode.c_str(), policy.c_str(), scenario.c_str(), r->throughput,
                r->ideal_throughput, r->fraction, 100 * r->wait_fraction,
                static_cast<unsigned long>(r->clocks), static_cast<unsigned long>(r->dropped),
                static_cast<unsigned long>(r->rounds), r->decision_mean_seconds * 1e3,
                r->decision_max_seconds * 1e3, r->min_batch, r->max_batch,
                100 * r->stable_fraction, r->min_batch_ratio, r->max_batch_ratio,
                r->fixed_cost_samples, static_cast<unsigned long>(r->level_shifts));
    if (r->slow_workers > 0) {
      std::printf("; %d slow workers: within 25%% of their fair share from %.2f s, then in %.1f%% "
                  "of their steps", r->slow_workers, r->slow_reach_seconds,
                  100 * r->slow_in_band_fraction);
    }
    if (o.data_samples > 0) {
      std::printf("; data stream: %u of %u epoch(s) in %.2f s (floor %.2f s: %.3f), longest "
                  "tail %.3f s; the monitor's side: %lu calls, %.2f us each on average, %.1f us "
                  "at most", r->epochs_done, o.epochs, r->epochs_seconds,
                  r->epochs_floor_seconds,
                  r->epochs_floor_seconds > 0 ? r->epochs_seconds / r->epochs_floor_seconds : 0,
                  r->max_tail_seconds, static_cast<unsigned long>(r->stream_calls),
                  r->stream_mean_us, r->stream_max_us);
    }
    std::printf("\n");
  }
  return 0;
}
