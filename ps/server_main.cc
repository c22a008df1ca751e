// pacer-server: one parameter-server shard.
#include <csignal>
#include <cstdlib>
#include <iostream>

#include "ps/base/cli.h"
#include "ps/base/rpc.h"
#include "ps/shard_server.h"
#include "spdlog/spdlog.h"

int main(int argc, char** argv) {
  pacer::ShardServerOptions opts;
  std::string log_level = "info";
  pacer::MetricsFlags metrics_flags;
  double register_timeout_s = 30, heartbeat_ms = 200, pull_timeout_s = 60;
  double request_timeout_s = 1, stall_report_s = 5, checkpoint_interval_s = 10, stop_timeout_s = 30;
  bool no_apply = false, no_crc = false;

  CLI::App app{"pacer-server: a Pacer parameter-server shard. It registers with the monitor, "
               "receives its key range, and serves pushes and pulls from workers.",
               "pacer-server"};
  app.add_option("--listen", opts.listen, "Address to bind, tcp://HOST:PORT (port 0: ephemeral; "
                 "the bound address is printed on stdout as 'listening ADDRESS')")
      ->capture_default_str();
  app.add_option("--monitor", opts.monitor, "The monitor's address, tcp://HOST:PORT")
      ->required()->check(pacer::PeerAddress());
  app.add_option("--advertise", opts.advertise,
                 "Address the monitor hands to workers for this shard, tcp://HOST:PORT, when it "
                 "differs from --listen (NAT, a Kubernetes Service); default: the bound address");
  app.add_option("--node", opts.node,
                 "The host or Kubernetes node this shard runs on: the monitor (--replicas) places "
                 "a key range's replicas on different ones; default: the host of the advertised "
                 "address");
  pacer::AddMetricsFlags(app, &metrics_flags);
  pacer::FaultFlags fault_flags;
  pacer::AddFaultFlags(app, &fault_flags);
  pacer::SecurityFlags security;
  pacer::AddSecurityFlags(app, &security);
  app.add_option("--data-dir", opts.data_dir,
                 "Directory for this shard's checkpoints (RocksDB, in DIR/checkpoint; created if "
                 "missing). A shard restarted with the same directory reloads its latest snapshot "
                 "and takes its key range back. Empty: no checkpoints");
  app.add_option("--ledger", opts.ledger,
                 "When the shard leaves, write to this file each range it serves or backs up "
                 "(role, epoch, last record, a CRC-32 of its parameters and optimizer state) with "
                 "every (worker, push seq) it applied: for audits such as pacer-chaos's");
  app.add_option("--checkpoint-interval", checkpoint_interval_s,
                 "Seconds between checkpoints (0: only by --checkpoint-updates and at exit)")
      ->capture_default_str()->check(pacer::NonNegative());
  app.add_option("--checkpoint-updates", opts.checkpoint_updates,
                 "Also checkpoint after this many applied pushes (0: off)")
      ->capture_default_str();
  app.add_option("--stop-timeout", stop_timeout_s,
                 "Seconds the final checkpoint may take once the shard stops (SIGTERM or the job's "
                 "end); past them it is given up, the previous checkpoint stays, and the process "
                 "exits 1. Keep it under the service manager's stop timeout (systemd 60 s)")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--max-message-bytes", opts.shard.max_message_bytes,
                 "Largest accepted message, all frames, in bytes")
      ->capture_default_str()
      ->check(pacer::Positive());
  app.add_option("--pull-timeout", pull_timeout_s,
                 "Seconds a pull may wait on the barrier before it fails")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--register-timeout", register_timeout_s,
                 "Seconds to keep trying to register with the monitor")
      ->capture_default_str()->check(pacer::Positive());
  app.add_option("--heartbeat-ms", heartbeat_ms, "Milliseconds between heartbeats to the monitor")
      // Not PACER_HEARTBEAT_MS: the monitor's sets the workers' period.
      ->envname("PACER_SERVER_HEARTBEAT_MS")
      ->capture_default_str()->check(pacer::Positive());
  app.add_flag("--no-apply", no_apply,
               "Benchmarks only: acknowledge pushes without applying them (transport-only figure)");
  app.add_flag("--no-crc", no_crc,
               "Benchmarks only: skip the message checks (replies carry none, nothing is "
               "verified); every peer must skip them too");
  app.add_option("--request-timeout", request_timeout_s,
                 "Seconds to wait for the monitor's answer to one request")
      ->capture_default_str()->check(pacer::Positive())
      // Not PACER_REQUEST_TIMEOUT: the worker's means a push or pull (60 s).
      ->envname("PACER_SERVER_REQUEST_TIMEOUT");
  app.add_option("--stall-report", stall_report_s,
                 "Seconds a clock may stay open before the shard logs which workers it waits for")
      ->capture_default_str()->check(pacer::Positive());
  pacer::UnsafeSwitches unsafe;
  pacer::AddUnsafeDisableFlag(
      app, &unsafe,
      {{"dedup", "a duplicate or retried push is applied again"},
       {"crc-check", "what arrives is not checked (the XXH3 message checks), so corrupted gradients are applied"},
       {"checkpoints", "no checkpoint after the first on time or count, so a crash loses "
                       "everything acknowledged since"},
       {"durable-wait", "with backups, a push is called durable as soon as it is applied, "
                        "before any backup holds it, so a primary's death loses pushes workers "
                        "were told are durable"},
       {"fencing", "with backups, a primary cut off from the monitor past its shard lease goes "
                   "on acknowledging pushes, so after a failover two shards acknowledge the "
                   "same range (split brain)"}});
  std::string* lvl = &log_level;
  pacer::AddLogLevelFlag(app, lvl);
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;

  pacer::SetupLogging("server", log_level);
  pacer::WarnUnsafe(unsafe);
  pacer::TuneAllocatorForLargeBuffers();
  opts.shard.safeguards = unsafe.safeguards();
  opts.shard.apply_updates = !no_apply;
  opts.shard.check_crc = !no_crc;
  opts.shard.pull_timeout = pacer::FromSeconds(pull_timeout_s);
  opts.register_timeout = pacer::FromSeconds(register_timeout_s);
  opts.request_timeout = pacer::FromSeconds(request_timeout_s);
  opts.shard.stall_report = pacer::FromSeconds(stall_report_s);
  opts.heartbeat_interval = pacer::FromSeconds(heartbeat_ms / 1000.0);
  opts.checkpoint_interval = pacer::FromSeconds(checkpoint_interval_s);
  opts.stop_timeout = pacer::FromSeconds(stop_timeout_s);
  opts.shard.registry = std::make_shared<prometheus::Registry>();

  // Signals are caught before the metrics line is printed: a SIGTERM right
  // after it (a test, or a quick rollout) stops the shard cleanly, not with
  // the default action.
  const std::atomic<bool>& stop_signal = pacer::StopOnSignals();
  std::unique_ptr<pacer::MetricsServer> metrics;
  if (!pacer::ServeMetrics(metrics_flags, "server", opts.shard.registry, &metrics)) {
    return pacer::kExitFailure;
  }
  if (metrics) metrics->SetReadiness([] { return std::string("registering with the monitor"); });

  pacer::TransportOptions topts;
  topts.max_message_bytes = opts.shard.max_message_bytes * 2;
  auto keys = pacer::ApplySecurity(security, "server", opts.shard.registry.get(), &topts);
  if (!keys.ok()) {
    spdlog::error("{}", std::string(keys.status().message()));
    return pacer::kExitUsage;
  }
  std::shared_ptr<pacer::FaultInjector> faults;
  auto transport = pacer::MakeProcessTransport(topts, fault_flags, opts.shard.registry.get(), &faults);
  if (transport == nullptr) return pacer::kExitUsage;
  transport->SetServerKey(opts.monitor, keys->monitor_key);
  opts.shard.monitor_key = keys->monitor_key;
  opts.faults = faults;
  opts.cancel = &stop_signal;
  auto server = pacer::ShardServer::Start(transport.get(), opts);
  if (!server.ok() && absl::IsCancelled(server.status())) {
    spdlog::info("signal received while registering: leaving");
    return pacer::kExitOk;
  }
  if (!server.ok()) {
    spdlog::error("{}", pacer::ErrorText(server.status()));
    return pacer::kExitFailure;
  }
  pacer::PrintAddress("listening", (*server)->address());
  pacer::ShardServer* shard = server->get();
  if (metrics) {
    metrics->SetProcessLabels({{"shard", std::to_string(shard->id())}});
    metrics->SetReadiness([shard] { return shard->NotReadyReason(); });
  }
  while (!(*server)->done()) {
    if (stop_signal) {
      spdlog::info("signal received: final checkpoint, then leaving");
      (*server)->Shutdown();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  (*server)->Wait();
  if (metrics) metrics->SetReadiness([] { return std::string("stopped"); });
  if (!(*server)->stop_status().ok()) {
    // Logged by the shard. The given-up write may still be in the disk on
    // its own thread: leave without running destructors under it.
    spdlog::shutdown();
    std::_Exit(pacer::kExitFailure);
  }
  return pacer::kExitOk;
}
