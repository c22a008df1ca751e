// Metrics helpers shared by every role: the HTTP endpoint (/metrics, /livez,
// /readyz), pacer_build_info and the rejected-message counters. Naming
// follows shared/CONVENTIONS.md.
#ifndef PACER_PS_BASE_METRICS_H_
#define PACER_PS_BASE_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "ps/pacer_generated.h"

namespace pacer {

// A process's HTTP endpoint (civetweb, the server prometheus-cpp is built on):
//   /metrics  the registry in Prometheus's text format; with basic auth set,
//             only for that user (401 otherwise);
//   /livez    200 "ok" while the process serves HTTP (no auth: a probe);
//   /readyz   200 "ready" when the readiness check passes, else 503 with its
//             reason (no auth).
class MetricsServer {
 public:
  // `address` is HOST:PORT; port 0 binds an ephemeral port. `basic_auth`,
  // "USER:PASSWORD", guards /metrics (empty: open). Unavailable when it
  // cannot bind.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry,
      const std::string& basic_auth = "");
  ~MetricsServer();
  // The bound HOST:PORT.
  const std::string& address() const { return address_; }
  // Sets what /readyz asks: the check returns "" when ready, else why not.
  // Until set, /readyz answers 503 "starting". Thread-safe; the check runs
  // on an HTTP thread.
  void SetReadiness(std::function<std::string()> check);
  // Adds these labels to every series served from now on (a shard's id,
  // known only once it registered). Thread-safe.
  void SetProcessLabels(std::map<std::string, std::string> labels);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

// Adds pacer_build_info{version, revision, role, cuda} = 1 to `registry`.
void RegisterBuildInfo(prometheus::Registry& registry, const std::string& role);

// pacer_rejected_messages_total{role, reason}: every reason starts at 0.
class RejectCounters {
 public:
  RejectCounters(prometheus::Registry& registry, const std::string& role);
  void Inc(wire::ErrorCode code);
  double Value(wire::ErrorCode code) const;

 private:
  std::map<wire::ErrorCode, prometheus::Counter*> counters_;
};

// Reads one sample's value from a registry (tests and status pages): the
// series of `name` whose labels include all of `labels`, of those the
// first with the fewest (a shard's own, not a promoted range's, which also
// has range="..."); -1 if none.
double ReadMetric(prometheus::Registry& registry, const std::string& name,
                  const std::map<std::string, std::string>& labels = {});

}  // namespace pacer

#endif  // PACER_PS_BASE_METRICS_H_
