// Small HTTP helpers for scraping a process's /metrics on loopback: the
// chaos runner (pacer-chaos) and the tests read metrics with them.
#ifndef PACER_PS_BASE_SCRAPE_H_
#define PACER_PS_BASE_SCRAPE_H_

#include <optional>
#include <string>
#include <vector>

namespace pacer {

// An HTTP/1.0 GET of http://ADDRESS/PATH (ADDRESS is an IPv4 HOST:PORT),
// waiting at most 5 s for the answer.
struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
};
HttpResponse HttpGet(const std::string& address, const std::string& path,
                     const std::vector<std::string>& headers = {});
// GET http://ADDRESS/metrics; empty on failure.
std::string FetchMetrics(const std::string& address);
// Percent-encodes a query-string value.
std::string UrlEncode(const std::string& s);
// The value of a sample named `name` whose label set contains every
// `k="v"` in `labels` (e.g. {"reason=\"bad_crc\""}), or nullopt: of those,
// the first with the fewest labels (a shard's own series, not those of a
// range it serves since a promotion, which also have range="...").
std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::vector<std::string>& labels = {});

}  // namespace pacer

#endif  // PACER_PS_BASE_SCRAPE_H_
