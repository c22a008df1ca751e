#include "ps/metrics.h"

#include "ps/wire.h"

namespace pacer {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
  server->exposer_->RegisterCollectable(registry);
  std::string host = address.substr(0, address.rfind(':'));
  auto ports = server->exposer_->GetListeningPorts();
  server->address_ = host + ":" + (ports.empty() ? std::string("?") : std::to_string(ports[0]));
  return server;
}

RejectCounters::RejectCounters(prometheus::Registry& registry, const std::string& role) {
  auto& family = prometheus::BuildCounter()
                     .Name("pacer_rejected_messages_total")
                     .Help("Received messages refused or dropped, by reason")
                     .Register(registry);
  for (auto code : wire::EnumValuesErrorCode()) {
    if (code == wire::ErrorCode::DeadlineExceeded || code == wire::ErrorCode::Unknown) continue;
    counters_[code] = &family.Add({{"role", role}, {"reason", ErrorCodeName(code)}});
  }
}

void RejectCounters::Inc(wire::ErrorCode code) {
  auto it = counters_.find(code);
  if (it != counters_.end()) it->second->Increment();
}

double RejectCounters::Value(wire::ErrorCode code) const {
  auto it = counters_.find(code);
  return it == counters_.end() ? 0 : it->second->Value();
}

double ReadMetric(prometheus::Registry& registry, const std::string& name,
                  const std::map<std::string, std::string>& labels) {
  for (const auto& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const auto& m : family.metric) {
      bool match = true;
      for (const auto& [k, v] : labels) {
        bool found = false;
        for (const auto& lp : m.label) found |= (lp.name == k && lp.value == v);
        match &= found;
      }
      if (!match) continue;
      switch (family.type) {
        case prometheus::MetricType::Counter: return m.counter.value;
        case prometheus::MetricType::Gauge: return m.gauge.value;
        case prometheus::MetricType::Histogram: return static_cast<double>(m.histogram.sample_count);
        default: return -1;
      }
    }
  }
  return -1;
}

}  // namespace pacer
