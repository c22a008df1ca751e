// Metrics helpers shared by every role: a registry, the /metrics endpoint
// and the rejected-message counters. Naming follows shared/CONVENTIONS.md.
#ifndef PACER_PS_METRICS_H_
#define PACER_PS_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"
#include "ps/pacer_generated.h"

namespace pacer {

// Serves a registry over HTTP at /metrics.
class MetricsServer {
 public:
  // `address` is HOST:PORT; port 0 binds an ephemeral port. Returns the bound
  // HOST:PORT, or Unavailable when it cannot bind.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Registry> registry);
  const std::string& address() const { return address_; }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

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
// first series of `name` whose labels include all of `labels`; -1 if none.
double ReadMetric(prometheus::Registry& registry, const std::string& name,
                  const std::map<std::string, std::string>& labels = {});

}  // namespace pacer

#endif  // PACER_PS_METRICS_H_
