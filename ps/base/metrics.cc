#include "ps/base/metrics.h"

#include <optional>
#include <sstream>

#include "CivetServer.h"
#include "absl/strings/escaping.h"
#include "prometheus/text_serializer.h"
#include "ps/base/mutex.h"
#include "ps/base/wire.h"

namespace pacer {

namespace {

// Compares without an early exit, so the time taken tells nothing of where
// a guessed credential first differs.
bool SameSecret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

// One response: the head and the body in one write. No mg_printf: civetweb's
// worker threads have small stacks, and its vsnprintf (glibc's positional
// path) overflowed one under AddressSanitizer.
void Send(mg_connection* conn, const std::string& status_line, const char* content_type,
          const std::string& body, const char* extra_headers = "") {
  std::string response = "HTTP/1.1 " + status_line + "\r\nContent-Type: ";
  response.append(content_type)
      .append("\r\nContent-Length: ")
      .append(std::to_string(body.size()))
      .append("\r\nCache-Control: no-store\r\n")
      .append(extra_headers)
      .append("Connection: close\r\n\r\n")
      .append(body);
  mg_write(conn, response.data(), response.size());
}

void SendText(mg_connection* conn, int status, const char* reason, const std::string& body,
              const char* extra_headers = "") {
  Send(conn, std::to_string(status).append(" ").append(reason), "text/plain; charset=utf-8", body,
       extra_headers);
}

}  // namespace

struct MetricsServer::Impl {
  std::shared_ptr<prometheus::Registry> registry;
  std::string expected_auth;  // "Basic base64(user:password)"; empty: open
  Mutex mu;  // guards readiness and process_labels (civetweb's threads read them)
  std::function<std::string()> readiness ABSL_GUARDED_BY(mu);
  std::map<std::string, std::string> process_labels ABSL_GUARDED_BY(mu);

  // /metrics: the registry, behind basic auth when set.
  void ServeMetrics(mg_connection* conn) {
    if (!expected_auth.empty()) {
      const char* got = mg_get_header(conn, "Authorization");
      if (got == nullptr || !SameSecret(got, expected_auth)) {
        SendText(conn, 401, "Unauthorized", "unauthorized\n",
                 "WWW-Authenticate: Basic realm=\"pacer metrics\"\r\n");
        return;
      }
    }
    std::vector<prometheus::MetricFamily> families = registry->Collect();
    {
      MutexLock lock(mu);
      for (auto& family : families) {
        for (auto& metric : family.metric) {
          for (const auto& [k, v] : process_labels) {
            metric.label.push_back(prometheus::ClientMetric::Label{k, v});
          }
        }
      }
    }
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    Send(conn, "200 OK", "text/plain; version=0.0.4; charset=utf-8", out.str());
  }
  // /readyz: the readiness check's verdict.
  void ServeReady(mg_connection* conn) {
    std::string why = "starting";
    {
      MutexLock lock(mu);
      if (readiness) why = readiness();
    }
    if (why.empty()) {
      SendText(conn, 200, "OK", "ready\n");
    } else {
      SendText(conn, 503, "Service Unavailable", "not ready: " + why + "\n");
    }
  }

  // Every request, every method, lands here: answers never go through
  // civetweb's own error pages (whose 404 path crashed a worker process).
  class Router final : public CivetHandler {
   public:
    explicit Router(Impl* impl) : impl_(impl) {}
    bool handleGet(CivetServer*, mg_connection* conn) override {
      const mg_request_info* info = mg_get_request_info(conn);
      const std::string uri = info != nullptr && info->local_uri != nullptr ? info->local_uri : "";
      if (uri == "/metrics") {
        impl_->ServeMetrics(conn);
      } else if (uri == "/livez") {
        SendText(conn, 200, "OK", "ok\n");
      } else if (uri == "/readyz") {
        impl_->ServeReady(conn);
      } else {
        SendText(conn, 404, "Not Found", "not found: try /metrics, /livez or /readyz\n");
      }
      return true;
    }
    bool handlePost(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
    bool handleHead(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
    bool handlePut(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
    bool handleDelete(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
    bool handleOptions(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }
    bool handlePatch(CivetServer*, mg_connection* conn) override { return NotAllowed(conn); }

   private:
    static bool NotAllowed(mg_connection* conn) {
      SendText(conn, 405, "Method Not Allowed", "only GET\n", "Allow: GET\r\n");
      return true;
    }
    Impl* impl_;
  };

  Router router{this};
  std::unique_ptr<CivetServer> server;  // last: stops before the handlers go
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry,
    const std::string& basic_auth) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) {
    return absl::InvalidArgumentError("metrics address '" + address + "' is not HOST:PORT");
  }
  if (!basic_auth.empty() && basic_auth.find(':') == std::string::npos) {
    return absl::InvalidArgumentError("metrics basic auth must be USER:PASSWORD");
  }
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  server->impl_ = std::make_unique<Impl>();
  Impl& impl = *server->impl_;
  impl.registry = std::move(registry);
  if (!basic_auth.empty()) impl.expected_auth = "Basic " + absl::Base64Escape(basic_auth);
  // civetweb takes "HOST:PORT" for IPv4 and "[HOST]:PORT" for IPv6 as given.
  const std::vector<std::string> options = {"listening_ports", address, "num_threads", "2",
                                            "request_timeout_ms", "5000"};
  try {
    impl.server = std::make_unique<CivetServer>(options);
  } catch (const std::exception& e) {
    return absl::UnavailableError("cannot serve metrics on " + address + ": " + e.what());
  }
  impl.server->addHandler("/", impl.router);
  const auto ports = impl.server->getListeningPorts();
  if (ports.empty()) return absl::UnavailableError("cannot serve metrics on " + address);
  server->address_ = address.substr(0, colon) + ":" + std::to_string(ports[0]);
  return server;
}

MetricsServer::~MetricsServer() {
  if (impl_ && impl_->server) impl_->server->close();
}

void MetricsServer::SetReadiness(std::function<std::string()> check) {
  MutexLock lock(impl_->mu);
  impl_->readiness = std::move(check);
}

void MetricsServer::SetProcessLabels(std::map<std::string, std::string> labels) {
  MutexLock lock(impl_->mu);
  impl_->process_labels = std::move(labels);
}

void RegisterBuildInfo(prometheus::Registry& registry, const std::string& role) {
  prometheus::BuildGauge()
      .Name("pacer_build_info")
      .Help("Always 1; the labels say which build of Pacer this process runs")
      .Register(registry)
      .Add({{"version", PACER_VERSION},
            {"revision", PACER_REVISION},
            {"role", role},
            {"cuda", PACER_BUILD_CUDA ? "true" : "false"}})
      .Set(1);
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
  const auto value = [](const prometheus::MetricFamily& family, const prometheus::ClientMetric& m) {
    switch (family.type) {
      case prometheus::MetricType::Counter: return m.counter.value;
      case prometheus::MetricType::Gauge: return m.gauge.value;
      case prometheus::MetricType::Histogram: return static_cast<double>(m.histogram.sample_count);
      default: return -1.0;
    }
  };
  std::optional<double> best;
  size_t best_labels = 0;
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
      // Of the matches, the series with the fewest labels (a shard's own,
      // not a promoted range's, which also has range="...").
      if (!best || m.label.size() < best_labels) {
        best = value(family, m);
        best_labels = m.label.size();
      }
    }
  }
  return best.value_or(-1);
}

}  // namespace pacer
