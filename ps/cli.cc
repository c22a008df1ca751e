#include "ps/cli.h"

#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <iostream>

#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace pacer {

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  app.footer(kExitCodesHelp);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return kExitOk;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return kExitOk;
  } catch (const CLI::CallForVersion&) {
    std::cout << app.version() << "\n";
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << e.what() << "\n"
              << "Run with --help for usage.\n";
    return kExitUsage;
  }
  return std::nullopt;
}

void AddLogLevelFlag(CLI::App& app, std::string* level) {
  app.add_option("--log-level", *level, "Log verbosity")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}))
      ->capture_default_str();
}

void SetupLogging(const std::string& role, const std::string& level) {
  auto logger = spdlog::stderr_color_mt(role);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [" + role + "] %v");
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

void PrintAddress(const std::string& what, const std::string& address) {
  std::printf("%s %s\n", what.c_str(), address.c_str());
  std::fflush(stdout);
}

void AddMetricsFlag(CLI::App& app, std::string* address) {
  app.add_option("--metrics-addr", *address,
                 "Serve Prometheus /metrics on HOST:PORT (port 0: ephemeral; printed as "
                 "'metrics ADDRESS'); off when empty");
}

bool ServeMetrics(const std::string& address, std::shared_ptr<prometheus::Registry> registry,
                  std::unique_ptr<MetricsServer>* server) {
  if (address.empty()) return true;
  auto m = MetricsServer::Start(address, std::move(registry));
  if (!m.ok()) {
    spdlog::error("{}", m.status().ToString());
    return false;
  }
  *server = std::move(*m);
  PrintAddress("metrics", (*server)->address());
  return true;
}

namespace {
std::atomic<bool> g_stop_signal{false};
void OnStopSignal(int) { g_stop_signal = true; }
}  // namespace

const std::atomic<bool>& StopOnSignals() {
  std::signal(SIGINT, OnStopSignal);
  std::signal(SIGTERM, OnStopSignal);
  return g_stop_signal;
}

void TuneAllocatorForLargeBuffers() {
  mallopt(M_MMAP_THRESHOLD, 512 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

}  // namespace pacer
