// Helpers every binary's main() shares: flag parsing with usage errors mapped
// to exit code 2, logging set-up, and the one parseable "listening" line.
// Libraries never call these; only main() does.
#ifndef PACER_PS_BASE_CLI_H_
#define PACER_PS_BASE_CLI_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "ps/base/fault.h"
#include "ps/base/metrics.h"
#include "ps/base/safeguards.h"
#include "ps/base/transport.h"

namespace pacer {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// Text appended to every --help.
inline constexpr char kExitCodesHelp[] =
    "Exit codes: 0 success, 1 failure, 2 usage error (bad flag or value).";

// Also appended: where settings come from.
inline constexpr char kPrecedenceHelp[] =
    "Settings: a flag, else its environment variable (shown as Env above: PACER_<NAME>, but a "
    "role's own name where two roles' flags of one name mean different things), else the "
    "--config file, else the default.";

// Parses flags (adding --config FILE and a PACER_<NAME> variable per flag;
// a flag given twice takes its last value). Returns an exit code when
// main() should return now (after --help: 0; after a bad flag, with the
// error printed to stderr: 2), or nullopt to carry on.
std::optional<int> ParseFlags(CLI::App& app, int argc, char** argv);

// CLI11 checks for numbers that must be > 0 or >= 0, whose errors name the
// bound ("must be 0 or more, got -5"; CLI11's own print the largest double).
CLI::Validator Positive();
CLI::Validator NonNegative();

// A CLI11 check for a peer's address, tcp://HOST:PORT (port 1-65535) or
// ipc://PATH: anything else is a usage error that names the form.
CLI::Validator PeerAddress();

// Adds --log-level (trace|debug|info|warn|error|off) bound to `level`.
void AddLogLevelFlag(CLI::App& app, std::string* level);

// Logs to stderr as "[role id] level message"; `level` as for --log-level.
void SetupLogging(const std::string& role, const std::string& level);

// Prints "<what> <address>" on stdout and flushes: the one line a script
// parses to find a port bound as 0, e.g. "listening tcp://127.0.0.1:40123".
void PrintAddress(const std::string& what, const std::string& address);

// The HTTP endpoint's flags (--metrics-addr, --metrics-auth-file).
struct MetricsFlags {
  // HOST:PORT; ":PORT" means 127.0.0.1:PORT; "off" serves nothing.
  std::string address = "127.0.0.1:0";
  // A file holding "USER:PASSWORD" for basic auth on /metrics (empty: open).
  std::string auth_file;
};

// Adds --metrics-addr ($PACER_METRICS_ADDR) and --metrics-auth-file
// ($PACER_METRICS_AUTH_FILE).
void AddMetricsFlags(CLI::App& app, MetricsFlags* flags);

// Registers pacer_build_info{role}, starts /metrics, /livez and /readyz and
// prints "metrics HOST:PORT". Returns false, after logging why, when it
// cannot bind or read the auth file; `server` stays null with "off".
bool ServeMetrics(const MetricsFlags& flags, const std::string& role,
                  std::shared_ptr<prometheus::Registry> registry,
                  std::unique_ptr<MetricsServer>* server);

// Fault injection flags (--faults, --fault-seed), see ps/base/fault.h.
struct FaultFlags {
  std::string faults;  // rules, as ParseFaults reads them
  uint64_t seed = 0;   // 0: random (logged)
};
void AddFaultFlags(CLI::App& app, FaultFlags* flags);

// --unsafe-disable NAME,...: switches off one of this role's fault
// handlings, so that a chaos scenario can show that the invariant it
// protects then fails (tests/chaos/). Never for real runs: each name
// switched off is logged as a warning at start. `allowed` maps each name
// this role accepts to what switching it off does (listed in --help).
struct UnsafeSwitches {
  std::vector<std::string> off;
  bool Off(const std::string& name) const;
  // As the one value the options carry (ps/base/safeguards.h).
  Safeguards safeguards() const;
};
void AddUnsafeDisableFlag(CLI::App& app, UnsafeSwitches* switches,
                          const std::vector<std::pair<std::string, std::string>>& allowed);
// Logs a warning per switched-off handling (after SetupLogging).
void WarnUnsafe(const UnsafeSwitches& switches);

// The process's ZeroMQ transport inside the fault layer (always, so that
// the monitor can set faults at run time), with --faults applied and the
// seed logged ("fault seed N"). Returns null, after logging why, when the
// rules do not parse. `injector` receives the layer's controls.
std::unique_ptr<Transport> MakeProcessTransport(const TransportOptions& options,
                                                const FaultFlags& flags,
                                                prometheus::Registry* registry,
                                                std::shared_ptr<FaultInjector>* injector);

// Transport security (ps/base/security.h): --key FILE (this process's keypair,
// from pacerctl keygen) and --allowed-keys FILE (the public keys that may
// connect; the one named "monitor" is the monitor's).
// The same helper adds --io-threads N (PACER_IO_THREADS; ZeroMQ's I/O
// threads, 0: one per two cores, at most 4), which ApplySecurity copies into the
// transport's options.
struct SecurityFlags {
  std::string key_file;
  std::string allowed_keys_file;
  int io_threads = 0;
};
void AddSecurityFlags(CLI::App& app, SecurityFlags* flags);

// Turns CURVE on in `options` from the flags (both or neither). With both:
// the ZAP handler lets only the allowed keys connect, and each refusal is
// logged as a warning and counted in
// pacer_security_refused_peers_total{reason} (in `registry`, when given).
// Returns the monitor's public key (the allowed key named "monitor"),
// which the caller gives the transport for the monitor's address (the
// monitor itself must be that key), and the operator keys (IsOperatorName).
// With neither flag: plain ZeroMQ, and a warning that anyone who reaches the
// ports can send to this process; returns empty keys. InvalidArgument
// (naming the flag) for one flag without the other, a bad file, or no
// "monitor" key.
struct SecurityKeys {
  std::string monitor_key;
  std::vector<std::string> operator_keys;
};
absl::StatusOr<SecurityKeys> ApplySecurity(const SecurityFlags& flags, const std::string& role,
                                           prometheus::Registry* registry,
                                           TransportOptions* options);

// Makes SIGINT and SIGTERM set the returned flag instead of killing the
// process, so main() can shut down in order.
const std::atomic<bool>& StopOnSignals();

// Process-wide allocator tuning for large message buffers: keeps freed
// multi-megabyte blocks in the heap for reuse instead of unmapping them, so
// a 64 MiB payload does not page-fault afresh on every message.
void TuneAllocatorForLargeBuffers();

}  // namespace pacer

#endif  // PACER_PS_BASE_CLI_H_
