#include "ps/base/cli.h"

#include <malloc.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <random>

#include "ps/base/mutex.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "prometheus/counter.h"
#include "ps/base/rpc.h"
#include "ps/base/security.h"
#include "ps/base/sender_guard.h"

namespace pacer {

namespace {

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// Applies a --config file: each NAME = VALUE line sets PACER_<NAME> unless
// the environment already has it, so that CLI11 then reads flag, else
// environment, else file. Returns an error message, or "".
std::string ApplyConfigFile(CLI::App& app, const std::string& path) {
  std::ifstream in(path);
  if (!in) return "--config " + path + ": cannot read the file";
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    // A comment starts at a '#' outside quotes.
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '"') quoted = !quoted;
      if (line[i] == '#' && !quoted) {
        line.resize(i);
        break;
      }
    }
    line = Trim(line);
    if (line.empty()) continue;
    if (line[0] == '[') return "--config " + path + ":" + std::to_string(line_no) + ": no sections";
    const auto eq = line.find('=');
    if (eq == std::string::npos) {
      return "--config " + path + ":" + std::to_string(line_no) + ": expected NAME = VALUE";
    }
    const std::string name = Trim(line.substr(0, eq));
    std::string value = Trim(line.substr(eq + 1));
    if (value.size() >= 2 && (value[0] == '"' || value[0] == '\'') && value.back() == value[0]) {
      value = value.substr(1, value.size() - 2);
    }
    const CLI::Option* opt = nullptr;
    for (const CLI::Option* o : app.get_options()) {
      for (const auto& l : o->get_lnames()) {
        if (l == name) opt = o;
      }
    }
    if (opt == nullptr || opt->get_envname().empty() || name == "config") {
      return "--config " + path + ":" + std::to_string(line_no) + ": no setting '" + name + "'";
    }
    setenv(opt->get_envname().c_str(), value.c_str(), /*overwrite=*/0);
  }
  return "";
}

}  // namespace

std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv) {
  app.footer(std::string(kExitCodesHelp) + "\n" + kPrecedenceHelp);
  std::string config;
  app.add_option("--config", config,
                 "Read settings from this file: NAME = VALUE lines (TOML), NAME a long flag "
                 "without its dashes");
  // A flag given twice takes its last value (CLI11's default refuses it):
  // launchers pass their defaults first and the user's flags after them.
  // Repeatable flags (vectors) keep every value, as before.
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_multi_option_policy() == CLI::MultiOptionPolicy::Throw) opt->take_last();
  }
  // Every long flag also reads PACER_<NAME> (--metrics-addr: PACER_METRICS_ADDR).
  for (CLI::Option* opt : app.get_options()) {
    const auto& names = opt->get_lnames();
    if (names.empty() || !opt->get_envname().empty() || names[0] == "help" ||
        names[0] == "config") {
      continue;
    }
    std::string env = "PACER_";
    for (char c : names[0]) env += c == '-' ? '_' : static_cast<char>(std::toupper(c));
    opt->envname(env);
  }
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--config" && i + 1 < argc) config = argv[i + 1];
    if (arg.rfind("--config=", 0) == 0) config = arg.substr(9);
  }
  if (!config.empty()) {
    if (std::string err = ApplyConfigFile(app, config); !err.empty()) {
      std::cerr << app.get_name() << ": " << err << "\nRun with --help for usage.\n";
      return kExitUsage;
    }
  }
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
    std::cerr << app.get_name() << ": " << e.what() << "\n";
    // A mistyped command (pacerctl stats, pacerctl fault sett): say which
    // there are, at the level it went wrong.
    CLI::App* level = &app;
    for (bool deeper = true; deeper;) {
      deeper = false;
      for (CLI::App* sub : level->get_subcommands([](CLI::App*) { return true; })) {
        if (sub->parsed()) {
          level = sub;
          deeper = true;
          break;
        }
      }
    }
    const auto commands = level->get_subcommands([](CLI::App*) { return true; });
    const bool about_commands = dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
                                std::string(e.what()).find("subcommand") != std::string::npos;
    if (about_commands && !commands.empty()) {
      std::string names;
      for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
      std::cerr << "Commands: " << names << ".\n";
    }
    std::cerr << "Run with --help for usage.\n";
    return kExitUsage;
  }
  return std::nullopt;
}

namespace {
CLI::Validator Bounded(bool zero_ok, const char* name) {
  return CLI::Validator(
      [zero_ok](std::string& value) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(value, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != value.size() || !std::isfinite(v)) {
          return "expected a number, got '" + value + "'";
        }
        if (zero_ok ? v >= 0 : v > 0) return "";
        return std::string(zero_ok ? "must be 0 or more" : "must be more than 0") + ", got " + value;
      },
      zero_ok ? "NONNEGATIVE" : "POSITIVE", name);
}
}  // namespace

CLI::Validator Positive() { return Bounded(false, "Positive"); }
CLI::Validator NonNegative() { return Bounded(true, "NonNegative"); }

CLI::Validator PeerAddress() {
  return CLI::Validator(
      [](std::string& value) -> std::string { return PeerAddressError(value); },
      "tcp://HOST:PORT", "PeerAddress");
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
    spdlog::error("{}", ErrorText(m.status()));
    return false;
  }
  *server = std::move(*m);
  PrintAddress("metrics", (*server)->address());
  return true;
}

void AddFaultFlags(CLI::App& app, FaultFlags* flags) {
  app.add_option("--faults", flags->faults,
                 "Inject faults into what this process receives: KIND[:KEY=VALUE,...] joined by "
                 "';', KIND drop|delay|duplicate|reorder|corrupt|partition|slow_disk (slow_disk: "
                 "a shard's checkpoint writes), KEY p (probability), type (message types, '|'), "
                 "peers (sender ids, '|'), ms and jitter (delay, slow_disk), for (seconds until "
                 "the rule ends by itself). E.g. 'drop:p=0.1;delay:ms=200,jitter=50' or "
                 "'partition:peers=3,for=10'. Also settable at run time: pacerctl fault")
      ->check([](const std::string& spec) {
        auto rules = ParseFaults(spec);
        return rules.ok() ? std::string() : std::string(rules.status().message());
      });
  app.add_option("--fault-seed", flags->seed,
                 "Seed of the fault decisions (0: random); logged at start, so a run replays");
}

bool UnsafeSwitches::Off(const std::string& name) const {
  return std::find(off.begin(), off.end(), name) != off.end();
}

Safeguards UnsafeSwitches::safeguards() const {
  Safeguards s;
  for (const std::string& name : off) {
    if (auto g = Safeguards::Named(name)) s.SwitchOff(*g);
  }
  return s;
}

void AddUnsafeDisableFlag(CLI::App& app, UnsafeSwitches* switches,
                          const std::vector<std::pair<std::string, std::string>>& allowed) {
  std::string help =
      "TESTING ONLY, never in a real run: switch off a fault handling so that a chaos scenario "
      "can show the invariant it protects failing (comma-separated):";
  std::vector<std::string> names;
  for (const auto& [name, what] : allowed) {
    help += " '" + name + "': " + what + ";";
    names.push_back(name);
  }
  help.back() = '.';
  app.add_option("--unsafe-disable", switches->off, help)
      ->delimiter(',')
      ->check(CLI::IsMember(names))
      ->group("Testing");
}

void WarnUnsafe(const UnsafeSwitches& switches) {
  for (const auto& name : switches.off) {
    spdlog::warn("UNSAFE: fault handling '{}' is switched off (--unsafe-disable); this process "
                 "is for demonstrating a failure, not for training",
                 name);
  }
}

std::unique_ptr<Transport> MakeProcessTransport(const TransportOptions& options,
                                                const FaultFlags& flags,
                                                prometheus::Registry* registry,
                                                std::shared_ptr<FaultInjector>* injector) {
  auto rules = ParseFaults(flags.faults);
  if (!rules.ok()) {
    spdlog::error("--faults: {}", std::string(rules.status().message()));
    return nullptr;
  }
  uint64_t seed = flags.seed;
  while (seed == 0) seed = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  auto faults = std::make_shared<FaultInjector>(seed, registry);
  faults->SetRules(std::move(*rules));
  if (!flags.faults.empty()) {
    spdlog::warn("injecting faults: {} (fault seed {})", FaultsToString(faults->rules()), seed);
  } else {
    spdlog::info("fault seed {}", seed);
  }
  if (injector != nullptr) *injector = faults;
  return MakeFaultyTransport(MakeZmqTransport(options), std::move(faults));
}

void AddSecurityFlags(CLI::App& app, SecurityFlags* flags) {
  app.add_option("--key", flags->key_file,
                 "This process's CURVE keypair (pacerctl keygen; mode 0600). With "
                 "--allowed-keys: every connection is authenticated and encrypted. Neither: "
                 "plain ZeroMQ, for local runs only");
  app.add_option("--allowed-keys", flags->allowed_keys_file,
                 "The public keys that may connect, one per line as [NAME] KEY; the one named "
                 "'monitor' is the monitor's");
  app.add_option("--io-threads", flags->io_threads,
                 "ZeroMQ I/O threads; each connection is served by one, so a worker's "
                 "connections to several shards send, receive and encrypt in parallel (0: one "
                 "per two cores, at most 4)")
      ->envname("PACER_IO_THREADS")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
}

absl::StatusOr<SecurityKeys> ApplySecurity(const SecurityFlags& flags, const std::string& role,
                                           prometheus::Registry* registry,
                                           TransportOptions* options) {
  options->io_threads = flags.io_threads;
  if (flags.key_file.empty() && flags.allowed_keys_file.empty()) {
    if (role == "pacerctl") return SecurityKeys{};  // a client of one command: no warning
    spdlog::warn("transport security is off (no --key/--allowed-keys): plain ZeroMQ, "
                 "unauthenticated and unencrypted; anyone who reaches this process's ports "
                 "can send it messages");
    return SecurityKeys{};
  }
  if (flags.key_file.empty() || flags.allowed_keys_file.empty()) {
    return absl::InvalidArgumentError("--key and --allowed-keys go together");
  }
  if (!CurveAvailable()) {
    return absl::InvalidArgumentError("--key: this libzmq has no CURVE (built without libsodium)");
  }
  auto keys = ReadKeyFile(flags.key_file);
  if (!keys.ok()) return absl::InvalidArgumentError("--key: " + std::string(keys.status().message()));
  auto allowed = ReadAllowedKeys(flags.allowed_keys_file);
  if (!allowed.ok()) {
    return absl::InvalidArgumentError("--allowed-keys: " + std::string(allowed.status().message()));
  }
  const std::string monitor_key = FindKey(*allowed, "monitor");
  if (monitor_key.empty()) {
    return absl::InvalidArgumentError("--allowed-keys: " + flags.allowed_keys_file +
                                      " has no key named 'monitor'");
  }
  if (role == "monitor" && monitor_key != keys->public_key) {
    return absl::InvalidArgumentError("--allowed-keys: the key named 'monitor' is not this "
                                      "monitor's public key (--key " + flags.key_file + ")");
  }
  options->curve.keys = *keys;
  options->curve.allowed.clear();
  for (const AllowedKey& k : *allowed) options->curve.allowed.push_back(k.public_key);
  prometheus::Counter* refused_key = nullptr;
  prometheus::Counter* refused_handshake = nullptr;
  if (registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("pacer_security_refused_peers_total")
                       .Help("Connections refused by transport security: a CURVE key not in "
                             "--allowed-keys, or a handshake without CURVE")
                       .Register(*registry);
    refused_key = &family.Add({{"reason", "key_not_allowed"}});
    refused_handshake = &family.Add({{"reason", "handshake_failed"}});
  }
  // Called from the transport's ZAP and socket-monitor threads; a peer can
  // cause refusals at will, so the log is throttled per reason.
  struct Throttle {
    Mutex mu;  // guards log
    LogThrottle log ABSL_GUARDED_BY(mu);
  };
  auto throttle = std::make_shared<Throttle>();
  options->curve.on_refused = [refused_key, refused_handshake, throttle](
                                  const std::string& key, const std::string& address,
                                  const std::string& why) {
    prometheus::Counter* c = key.empty() ? refused_handshake : refused_key;
    if (c != nullptr) c->Increment();
    uint64_t left_out = 0;
    {
      MutexLock lock(throttle->mu);
      if (!throttle->log.Allow(key.empty() ? "handshake" : "key", &left_out)) return;
    }
    spdlog::warn("refused a connection from {}{}: {}{}", address.empty() ? "a peer" : address,
                 key.empty() ? "" : " with key " + key, why,
                 left_out == 0 ? std::string()
                               : " (" + std::to_string(left_out) +
                                     " more refused for the same reason since the last line)");
  };
  SecurityKeys out{monitor_key, {}};
  for (const AllowedKey& k : *allowed) {
    if (IsOperatorName(k.name)) out.operator_keys.push_back(k.public_key);
  }
  spdlog::info("transport security: CURVE, public key {}, {} allowed key(s), {} operator key(s)",
               keys->public_key, allowed->size(), out.operator_keys.size());
  if (role == "monitor" && out.operator_keys.empty()) {
    spdlog::warn("--allowed-keys names no operator key ('operator' or 'operator-...'): "
                 "pacerctl commands that change the job will be refused");
  }
  return out;
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
  // One arena: ZeroMQ's I/O threads allocate every received message. In a
  // thread arena (64 MiB heaps) a 64 MiB message cannot fit, so glibc maps
  // it afresh, and every page of it faults, on every message.
  mallopt(M_ARENA_MAX, 1);
}

}  // namespace pacer
