#include "ps/cli.h"

#include <malloc.h>

#include <csignal>
#include <cstdio>
#include <fstream>
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

void AddMetricsFlags(CLI::App& app, MetricsFlags* flags) {
  app.add_option("--metrics-addr", flags->address,
                 "Serve /metrics, /livez and /readyz over HTTP on HOST:PORT (':PORT' is "
                 "127.0.0.1:PORT; port 0: ephemeral, printed as 'metrics ADDRESS'; 'off': none)")
      ->envname("PACER_METRICS_ADDR")
      ->capture_default_str();
  app.add_option("--metrics-auth-file", flags->auth_file,
                 "File holding USER:PASSWORD: /metrics then asks for HTTP basic auth (the "
                 "probes /livez and /readyz stay open)")
      ->envname("PACER_METRICS_AUTH_FILE");
}

bool ServeMetrics(const MetricsFlags& flags, const std::string& role,
                  std::shared_ptr<prometheus::Registry> registry,
                  std::unique_ptr<MetricsServer>* server) {
  RegisterBuildInfo(*registry, role);
  if (flags.address.empty() || flags.address == "off") return true;
  std::string address = flags.address;
  if (address[0] == ':') address = "127.0.0.1" + address;
  std::string auth;
  if (!flags.auth_file.empty()) {
    std::ifstream in(flags.auth_file);
    if (!in || !std::getline(in, auth) || auth.find(':') == std::string::npos) {
      spdlog::error("--metrics-auth-file {}: cannot read a USER:PASSWORD line", flags.auth_file);
      return false;
    }
    while (!auth.empty() && (auth.back() == '\r' || auth.back() == ' ')) auth.pop_back();
  }
  auto m = MetricsServer::Start(address, std::move(registry), auth);
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
