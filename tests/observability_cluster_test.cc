// Observability against a live cluster of real processes on 127.0.0.1:
// /metrics, /livez, /readyz and basic auth on every role; `promtool check
// metrics` on each process's output; Debian's Prometheus scraping the
// cluster and evaluating deploy/prometheus/pacer.rules.yml; every PromQL
// expression of the Grafana dashboard and the rules parsed by that
// Prometheus and naming only series it actually scraped or recorded; and
// SIGTERM stopping every process cleanly.
//
// The tests that need Prometheus or promtool (Debian package `prometheus`,
// installed by deploy/setup.sh) skip with a message where they are missing.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "nlohmann/json.hpp"
#include "tests/cluster_harness.h"
#include "tests/pacerctl_util.h"

namespace pacer::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Json = nlohmann::json;

// The path of an executable on $PATH, or "".
std::string Which(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "");
  for (std::string dir; std::getline(ss, dir, ':');) {
    const std::string p = dir + "/" + name;
    if (!dir.empty() && access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// A TCP port on 127.0.0.1 that was free a moment ago (Prometheus cannot
// bind port 0 and tell us).
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
  socklen_t len = sizeof(sa);
  getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
  close(fd);
  return ntohs(sa.sin_port);
}

// Sends `request` as is to ADDRESS; everything the server answered.
std::string RawHttp(const std::string& address, const std::string& request) {
  const auto colon = address.rfind(':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0 &&
      write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

// Runs a command through /bin/sh; its exit code and output.
std::pair<int, std::string> Shell(const std::string& command, const std::string& dir,
                                  const std::string& name) {
  auto p = Process::Start({"/bin/sh", "-c", command}, dir, name);
  auto rc = p->Wait(seconds(60));
  return {rc.value_or(-1), p->Stdout() + p->Stderr()};
}

// The metric names a PromQL expression selects: identifiers outside label
// matchers, ranges and strings that are not functions, aggregations,
// keywords or grouping labels.
std::set<std::string> MetricNames(const std::string& q) {
  static const std::set<std::string> kKeywords = {"and", "or", "unless", "bool", "offset",
                                                  "inf", "nan", "atan2"};
  static const std::set<std::string> kGrouping = {"by", "without", "on", "ignoring",
                                                  "group_left", "group_right"};
  std::set<std::string> names;
  const size_t n = q.size();
  size_t i = 0;
  auto skip_to_close = [&](char open, char close) {  // i at `open`
    int depth = 0;
    for (; i < n; ++i) {
      if (q[i] == open) ++depth;
      if (q[i] == close && --depth == 0) break;
    }
    ++i;
  };
  while (i < n) {
    const char c = q[i];
    if (c == '"' || c == '\'' || c == '`') {
      for (++i; i < n && q[i] != c; ++i) {
        if (q[i] == '\\') ++i;
      }
      ++i;
    } else if (c == '{') {
      skip_to_close('{', '}');
    } else if (c == '[') {
      skip_to_close('[', ']');
    } else if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {
      while (i < n && (std::isalnum(static_cast<unsigned char>(q[i])) || q[i] == '.')) ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':') {
      size_t start = i;
      while (i < n && (std::isalnum(static_cast<unsigned char>(q[i])) || q[i] == '_' || q[i] == ':')) {
        ++i;
      }
      const std::string ident = q.substr(start, i - start);
      size_t j = i;
      while (j < n && std::isspace(static_cast<unsigned char>(q[j]))) ++j;
      // A call, or an aggregation with its grouping first: sum by (x) (...).
      bool call = j < n && q[j] == '(';
      for (const char* g : {"by", "without"}) {
        const size_t len = std::strlen(g);
        call |= q.compare(j, len, g) == 0 &&
                (j + len == n || !(std::isalnum(static_cast<unsigned char>(q[j + len])) ||
                                   q[j + len] == '_'));
      }
      if (kGrouping.count(ident)) {
        if (call) {
          i = j;
          skip_to_close('(', ')');
        }
      } else if (ident == "offset") {
        while (j < n && (std::isalnum(static_cast<unsigned char>(q[j])))) ++j;  // its duration
        i = j;
      } else if (!call && !kKeywords.count(ident)) {
        names.insert(ident);
      }
    } else {
      ++i;
    }
  }
  return names;
}

TEST(MetricNamesTest, FindsSelectorsOnly) {
  EXPECT_EQ(MetricNames("sum by (le, op) (rate(a_bucket{x=\"y\"}[5m])) / on() b > 2"),
            (std::set<std::string>{"a_bucket", "b"}));
  EXPECT_EQ(MetricNames("max(x) == 1 unless on() (max(delta(y[5m])) > 0) and pacer:rec:max"),
            (std::set<std::string>{"x", "y", "pacer:rec:max"}));
}

// Replaces Grafana's variables with values Prometheus takes, and a
// label_values(EXPR, LABEL) variable query with EXPR.
std::string Concrete(std::string e) {
  if (e.rfind("label_values(", 0) == 0) {
    e = e.substr(13, e.rfind(',') - 13);
  }
  for (const auto& [var, value] :
       std::vector<std::pair<std::string, std::string>>{{"$__rate_interval", "1m"},
                                                        {"$__interval", "5s"},
                                                        {"$job", ".*"},
                                                        {"$shard", ".*"},
                                                        {"$worker", ".*"}}) {
    for (size_t at = e.find(var); at != std::string::npos; at = e.find(var)) {
      e.replace(at, var.size(), value);
    }
  }
  return e;
}

class ObservabilityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ClusterSpec spec;
    spec.shards = 2;
    spec.workers = 2;
    spec.shard_data_dirs = true;
    spec.monitor_flags = {"--time-cap", "240", "--eval-interval", "1", "--global-batch", "128",
                          "--data-stream"};
    spec.shard_flags = {"--checkpoint-interval", "1"};
    spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000",
                         "--metrics-addr", "127.0.0.1:0"};
    cluster_ = new Cluster(spec);
    ok_ = cluster_->Start();
    if (!ok_) return;
    for (auto& w : cluster_->workers) {
      auto m = w->WaitForLine("metrics ", seconds(10));
      worker_metrics_.push_back(m.value_or(""));
    }
    // Running: every process ready, and an evaluation reported.
    const auto until = std::chrono::steady_clock::now() + seconds(60);
    while (std::chrono::steady_clock::now() < until) {
      bool ready = true;
      for (const auto& a : Addresses()) ready &= HttpGet(a.second, "/readyz").status == 200;
      auto evals = MetricValue(FetchMetrics(cluster_->monitor_metrics),
                               "pacer_training_evaluations_total");
      if (ready && evals && *evals >= 1) return;
      std::this_thread::sleep_for(milliseconds(200));
    }
    ok_ = false;
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_TRUE(ok_) << "the cluster did not come up\n" << (cluster_ ? cluster_->Logs() : "");
  }

  // (role, metrics address) of every process.
  static std::vector<std::pair<std::string, std::string>> Addresses() {
    std::vector<std::pair<std::string, std::string>> a = {{"monitor", cluster_->monitor_metrics}};
    for (const auto& s : cluster_->shard_metrics) a.emplace_back("server", s);
    for (const auto& w : worker_metrics_) a.emplace_back("worker", w);
    return a;
  }

  static Cluster* cluster_;
  static bool ok_;
  static std::vector<std::string> worker_metrics_;
};
Cluster* ObservabilityTest::cluster_ = nullptr;
bool ObservabilityTest::ok_ = false;
std::vector<std::string> ObservabilityTest::worker_metrics_;

// What the issue asks each role to export, by name (histograms by their
// _count series).
const std::map<std::string, std::vector<std::string>> kRequired = {
    {"worker",
     {"pacer_worker_compute_seconds_count", "pacer_worker_communication_seconds_count",
      "pacer_worker_wait_seconds_count", "pacer_worker_samples_per_second",
      "pacer_worker_batch_size", "pacer_worker_staleness_bound_steps",
      "pacer_worker_observed_staleness_steps_count", "pacer_worker_clock",
      "pacer_training_loss"}},
    {"server",
     {"pacer_shard_requests_total", "pacer_shard_payload_bytes_total",
      "pacer_shard_request_duration_seconds_count", "pacer_shard_updates_applied_total",
      "pacer_shard_keys", "pacer_rejected_messages_total",
      "pacer_shard_checkpoint_duration_seconds_count", "pacer_shard_checkpoint_age_seconds",
      "pacer_shard_checkpoint_size_bytes", "pacer_shard_checkpoints_total",
      "pacer_shard_lost_updates_total"}},
    {"monitor",
     {"pacer_monitor_live_workers", "pacer_monitor_shards_up",
      "pacer_monitor_worker_straggler_score", "pacer_monitor_policy_decisions_total",
      "pacer_monitor_policy_rounds_total", "pacer_monitor_worker_fixed_cost_seconds",
      "pacer_monitor_worker_sample_cost_seconds", "pacer_monitor_shard_map_version", "pacer_training_test_accuracy_ratio",
      "pacer_monitor_state"}}};

TEST_F(ObservabilityTest, EveryProcessServesHealthAndItsMetrics) {
  for (const auto& [role, address] : Addresses()) {
    SCOPED_TRACE(role + " at " + address);
    EXPECT_EQ(HttpGet(address, "/livez").status, 200);
    HttpResponse ready = HttpGet(address, "/readyz");
    EXPECT_EQ(ready.status, 200) << ready.body;
    const std::string metrics = FetchMetrics(address);
    EXPECT_TRUE(MetricValue(metrics, "pacer_build_info", {"role=\"" + role + "\"",
                                                          "version=\""}).value_or(0) == 1)
        << metrics;
    for (const auto& name : kRequired.at(role)) {
      EXPECT_TRUE(MetricValue(metrics, name).has_value()) << name << " missing";
    }
    if (role == "server") {
      // Labelled with its shard id once registered.
      EXPECT_TRUE(MetricValue(metrics, "pacer_shard_keys", {"shard=\""}).has_value()) << metrics;
    }
    EXPECT_EQ(HttpGet(address, "/nothing").status, 404);
    // A malformed request gets an error, and the process serves on.
    EXPECT_EQ(RawHttp(address, "GARBAGE\r\n\r\n").rfind("HTTP/1.0 400", 0), 0u);
    EXPECT_EQ(RawHttp(address, "POST /metrics HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 405", 0), 0u);
    EXPECT_EQ(HttpGet(address, "/livez").status, 200);
  }
}

TEST_F(ObservabilityTest, LayerWisePushIsOnItsWayWhileTheBackwardPassRuns) {
  // The MLP's keys: fc1 in 7, fc2 in 2, fc3 in 1 (none across a layer), over
  // two shards, so at least one shard holds keys of two layers and gets
  // each push in parts, the last layer's first.
  double parts = 0;
  for (const auto& address : cluster_->shard_metrics) {
    parts += MetricValue(FetchMetrics(address), "pacer_shard_push_parts_total").value_or(0);
  }
  EXPECT_GT(parts, 0) << "no shard got a push in parts";
  for (const auto& address : worker_metrics_) {
    SCOPED_TRACE("worker at " + address);
    const std::string metrics = FetchMetrics(address);
    const double overlapped = MetricValue(metrics, "pacer_worker_overlap_seconds_count").value_or(0);
    const double iterations = MetricValue(metrics, "pacer_worker_iterations_total").value_or(0);
    EXPECT_GT(overlapped, 0);
    EXPECT_GE(overlapped, iterations - 1) << "every iteration's push starts before its compute ends";
    EXPECT_GT(MetricValue(metrics, "pacer_worker_overlap_seconds_sum").value_or(0), 0);
  }
}

TEST_F(ObservabilityTest, PromtoolCheckMetricsPassesOnEveryProcess) {
  const std::string promtool = Which("promtool");
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian package 'prometheus', installed by "
                    "deploy/setup.sh): skipping promtool check metrics";
  }
  int n = 0;
  for (const auto& [role, address] : Addresses()) {
    const std::string file = cluster_->dir.path() + "/scrape-" + std::to_string(n) + ".txt";
    std::ofstream(file) << FetchMetrics(address);
    auto [rc, out] = Shell(promtool + " check metrics < " + file, cluster_->dir.path(),
                           "promtool-" + std::to_string(n++));
    EXPECT_EQ(rc, 0) << role << " at " << address << ": " << out;
    EXPECT_EQ(out.find("WARN"), std::string::npos) << out;
  }
}

// Debian's Prometheus on loopback scrapes the cluster and evaluates the
// shipped rules.
class PrometheusServer {
 public:
  bool Start(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& targets,
             std::string* why) {
    const std::string bin = Which("prometheus");
    if (bin.empty()) {
      *why = "prometheus not found";
      return false;
    }
    // The targets in the file_sd format deploy/local-cluster.sh writes.
    Json groups = Json::array();
    for (const auto& [role, address] : targets) {
      groups.push_back({{"targets", {address}}, {"labels", {{"job", "pacer-" + role}}}});
    }
    std::ofstream(dir + "/targets.json") << groups.dump(2);
    std::ofstream(dir + "/prometheus.yml")
        << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        << "rule_files: ['" << PACER_SOURCE_DIR << "/deploy/prometheus/pacer.rules.yml']\n"
        << "scrape_configs:\n"
        << "  - job_name: pacer\n"
        << "    file_sd_configs: [{files: ['" << dir << "/targets.json']}]\n";
    address_ = "127.0.0.1:" + std::to_string(FreePort());
    process_ = Process::Start({bin, "--config.file=" + dir + "/prometheus.yml",
                               "--storage.tsdb.path=" + dir + "/tsdb",
                               "--web.listen-address=" + address_, "--log.level=warn"},
                              dir, "prometheus");
    const auto until = std::chrono::steady_clock::now() + seconds(30);
    while (std::chrono::steady_clock::now() < until) {
      if (HttpGet(address_, "/-/ready").status == 200) return true;
      if (!process_->Running()) break;
      std::this_thread::sleep_for(milliseconds(100));
    }
    *why = "prometheus did not become ready: " + process_->Stderr();
    return false;
  }
  // GET /api/v1/PATH; the parsed answer (status "error" on failure).
  Json Api(const std::string& path) const {
    HttpResponse r = HttpGet(address_, "/api/v1/" + path);
    Json j = Json::parse(r.body, nullptr, false);
    if (j.is_discarded()) return {{"status", "error"}, {"error", "HTTP " + std::to_string(r.status)}};
    return j;
  }
  Json Query(const std::string& expr) const { return Api("query?query=" + UrlEncode(expr)); }
  // Every metric name Prometheus holds series of.
  std::set<std::string> Names() const {
    std::set<std::string> names;
    const Json answer = Api("label/__name__/values");
    for (const auto& n : answer.value("data", Json::array())) names.insert(n.get<std::string>());
    return names;
  }
  std::string Stderr() const { return process_ ? process_->Stderr() : ""; }

 private:
  std::string address_;
  std::unique_ptr<Process> process_;
};

// Reads the dashboard's expressions: every panel target and variable query.
std::vector<std::string> DashboardExpressions(const Json& dash) {
  std::vector<std::string> exprs;
  for (const auto& p : dash["panels"]) {
    for (const auto& t : p.value("targets", Json::array())) exprs.push_back(t.at("expr"));
  }
  for (const auto& v : dash["templating"]["list"]) {
    if (v.value("type", "") == "query") exprs.push_back(v["query"]["query"]);
  }
  return exprs;
}

TEST_F(ObservabilityTest, PrometheusScrapesTheClusterAndEveryQueryNamesLiveSeries) {
  if (Which("prometheus").empty()) {
    GTEST_SKIP() << "prometheus not found (Debian package 'prometheus', installed by "
                    "deploy/setup.sh): skipping the tests against a real Prometheus";
  }
  const std::string dir = cluster_->dir.path() + "/prometheus";
  std::filesystem::create_directories(dir);
  PrometheusServer prom;
  std::string why;
  ASSERT_TRUE(prom.Start(dir, Addresses(), &why)) << why;

  // The rules loaded (parsed) and every recording rule's series recorded,
  // once a few scrapes give the rates two points.
  std::set<std::string> recorded, names;
  Json rules;
  const auto until = std::chrono::steady_clock::now() + seconds(60);
  bool complete = false;
  while (!complete && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(seconds(1));
    rules = prom.Api("rules");
    names = prom.Names();
    recorded.clear();
    complete = rules["status"] == "success" && !rules["data"]["groups"].empty();
    for (const auto& g : rules["data"]["groups"]) {
      for (const auto& r : g["rules"]) {
        if (r["type"] == "recording") {
          recorded.insert(r["name"].get<std::string>());
          complete &= names.count(r["name"].get<std::string>()) > 0;
        }
      }
    }
    auto up = prom.Query("count(up == 1)");
    complete &= up["status"] == "success" && !up["data"]["result"].empty() &&
                up["data"]["result"][0]["value"][1] == std::to_string(Addresses().size());
  }
  std::string missing;
  for (const auto& r : recorded) {
    if (!names.count(r)) missing += " " + r;
  }
  ASSERT_TRUE(complete) << "not every target up and every recording rule recorded in 60 s;"
                        << " not recorded:" << missing << "; " << names.size() << " names; up: "
                        << prom.Query("up").dump() << "\n"
                        << rules.dump(1) << "\n" << prom.Stderr() << cluster_->Logs();
  EXPECT_EQ(recorded.size(), 7u);

  // Expected series read back through the HTTP API.
  auto value_of = [&](const std::string& expr) {
    Json r = prom.Query(expr);
    EXPECT_EQ(r["status"], "success") << expr << ": " << r.dump();
    if (r["data"]["result"].empty()) return -1.0;
    return std::stod(r["data"]["result"][0]["value"][1].get<std::string>());
  };
  EXPECT_EQ(value_of("count(pacer_build_info{job=\"pacer-server\", role=\"server\"})"), 2);
  EXPECT_EQ(value_of("count(pacer_build_info{job=\"pacer-worker\", role=\"worker\"})"), 2);
  EXPECT_EQ(value_of("count(pacer_build_info{job=\"pacer-monitor\", role=\"monitor\"})"), 1);
  EXPECT_EQ(value_of("max(pacer_monitor_live_workers)"), 2);
  EXPECT_EQ(value_of("max(pacer_monitor_shards_up)"), 2);
  EXPECT_EQ(value_of("max(pacer_monitor_state{state=\"running\"})"), 1);
  EXPECT_GT(value_of("min(pacer_worker_iterations_total)"), 0);
  EXPECT_GT(value_of("sum(pacer_shard_checkpoints_total{result=\"ok\"})"), 0);
  // Better than chance (0.1 for ten classes). The cluster trains while this
  // runs, so a slow machine may scrape an early evaluation: poll, bounded.
  double accuracy = value_of("max(pacer_training_test_accuracy_ratio)");
  for (const auto until = std::chrono::steady_clock::now() + seconds(60);
       accuracy <= 0.1 && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(seconds(1));
    accuracy = value_of("max(pacer_training_test_accuracy_ratio)");
  }
  EXPECT_GT(accuracy, 0.1) << "the scraped test accuracy stayed at chance for 60 s\n"
                           << cluster_->Logs();
  EXPECT_GT(value_of("pacer:worker_samples:rate1m"), 0);
  EXPECT_EQ(value_of("count(pacer_monitor_shard_up == 1)"), 2);

  // Every rule healthy, and naming only series Prometheus holds.
  int checked = 0;
  for (const auto& g : rules["data"]["groups"]) {
    for (const auto& r : g["rules"]) {
      const std::string q = r["query"];
      EXPECT_EQ(r["health"], "ok") << r["name"] << ": " << r.dump();
      for (const auto& name : MetricNames(q)) {
        EXPECT_TRUE(names.count(name)) << "rule " << r["name"] << " names " << name
                                       << ", which no scrape returned";
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 14);

  // The dashboard: every expression parses (Prometheus runs it) and names
  // only live series.
  std::ifstream in(std::string(PACER_SOURCE_DIR) + "/deploy/grafana/pacer-dashboard.json");
  const Json dash = Json::parse(in, nullptr, false);
  ASSERT_FALSE(dash.is_discarded()) << "the dashboard is not valid JSON";
  const auto exprs = DashboardExpressions(dash);
  EXPECT_GE(exprs.size(), 30u);
  std::set<std::string> used;
  for (const auto& e : exprs) {
    const std::string q = Concrete(e);
    Json r = prom.Query(q);
    EXPECT_EQ(r["status"], "success") << "dashboard query does not run: " << e << "\n" << r.dump();
    const auto found = MetricNames(q);
    EXPECT_FALSE(found.empty()) << e;
    for (const auto& name : found) {
      used.insert(name);
      EXPECT_TRUE(names.count(name)) << "dashboard query " << e << " names " << name
                                     << ", which no scrape returned";
    }
  }
  // A panel per view the issue lists draws on its metrics.
  for (const char* m : {"pacer_monitor_worker_straggler_score", "pacer_monitor_worker_batch_size",
                        "pacer_shard_request_duration_seconds_bucket",
                        "pacer_shard_checkpoint_age_seconds", "pacer_training_test_accuracy_ratio",
                        "pacer_training_loss", "pacer_worker_observed_staleness_steps_bucket",
                        "pacer_monitor_data_epoch_samples", "pacer_monitor_data_chunks_total",
                        "pacer_monitor_data_epoch_tail_seconds"}) {
    EXPECT_TRUE(used.count(m)) << "no dashboard panel shows " << m;
  }
}

// Runs last: SIGTERM to every process at once, as a Kubernetes rollout or a
// systemd stop does; each one exits 0 by itself.
TEST_F(ObservabilityTest, SigtermStopsEveryProcessCleanly) {
  std::vector<Process*> all = {cluster_->monitor.get()};
  for (auto& s : cluster_->shards) all.push_back(s.get());
  for (auto& w : cluster_->workers) all.push_back(w.get());
  for (Process* p : all) p->Signal(SIGTERM);
  for (Process* p : all) {
    auto rc = p->Wait(seconds(20));
    EXPECT_EQ(rc, std::optional<int>(0)) << p->name() << "\n" << p->Stderr();
  }
  // The shards left a final checkpoint behind.
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(std::filesystem::exists(cluster_->dir.path() + "/shard" + std::to_string(i) +
                                        "/checkpoint/CURRENT"));
  }
}

// Basic auth on /metrics, open probes, and /readyz before a shard has
// registered; SIGTERM while it is still trying to register.
TEST(MetricsEndpointTest, BasicAuthProbesAndReadinessBeforeRegistration) {
  TempDir dir;
  std::ofstream(dir.path() + "/auth") << "prometheus:s3cret\n";
  auto shard = Process::Start({PACER_SERVER_BIN, "--monitor", "tcp://127.0.0.1:1", "--metrics-addr",
                               ":0", "--metrics-auth-file", dir.path() + "/auth",
                               "--register-timeout", "60"},
                              dir.path(), "shard");
  auto addr = shard->WaitForLine("metrics ", seconds(10));
  ASSERT_TRUE(addr) << shard->Stderr();
  EXPECT_EQ(addr->rfind("127.0.0.1:", 0), 0u) << "':0' binds loopback: " << *addr;
  EXPECT_EQ(HttpGet(*addr, "/livez").status, 200);
  HttpResponse ready = HttpGet(*addr, "/readyz");
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("registering"), std::string::npos) << ready.body;
  EXPECT_EQ(HttpGet(*addr, "/metrics").status, 401);
  // base64("prometheus:wrong") and base64("prometheus:s3cret").
  EXPECT_EQ(HttpGet(*addr, "/metrics", {"Authorization: Basic cHJvbWV0aGV1czp3cm9uZw=="}).status,
            401);
  HttpResponse m = HttpGet(*addr, "/metrics", {"Authorization: Basic cHJvbWV0aGV1czpzM2NyZXQ="});
  EXPECT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("pacer_build_info{"), std::string::npos) << m.body;

  shard->Signal(SIGTERM);
  EXPECT_EQ(shard->Wait(seconds(10)), std::optional<int>(0)) << shard->Stderr();
}

TEST(MetricsEndpointTest, BadAuthFileAndBusyPortAreClearErrors) {
  TempDir dir;
  std::ofstream(dir.path() + "/auth") << "no-colon-here\n";
  auto bad = Process::Start({PACER_MONITOR_BIN, "--metrics-auth-file", dir.path() + "/auth"},
                            dir.path(), "bad-auth");
  EXPECT_EQ(bad->Wait(seconds(10)), std::optional<int>(1));
  EXPECT_NE(bad->Stderr().find("USER:PASSWORD"), std::string::npos) << bad->Stderr();

  auto first = Process::Start({PACER_MONITOR_BIN}, dir.path(), "first");
  auto addr = first->WaitForLine("metrics ", seconds(10));
  ASSERT_TRUE(addr);
  auto second = Process::Start({PACER_MONITOR_BIN, "--metrics-addr", *addr}, dir.path(), "second");
  EXPECT_EQ(second->Wait(seconds(10)), std::optional<int>(1));
  EXPECT_NE(second->Stderr().find("cannot serve metrics"), std::string::npos) << second->Stderr();
  first->Signal(SIGTERM);
  EXPECT_EQ(first->Wait(seconds(10)), std::optional<int>(0)) << first->Stderr();
}

// --advertise: the monitor hands workers the advertised address, not the
// bound one, and workers train through it. The shard binds 127.0.0.1:P and
// advertises localhost:P (the same socket under another name).
TEST(AdvertiseTest, WorkersReachTheShardAtItsAdvertisedAddress) {
  // The monitor waits for 1 shard and 1 worker, started here by hand.
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 1;
  spec.monitor_flags = {"--target-accuracy", "0.7", "--time-cap", "60", "--eval-interval", "0.5"};
  Cluster monitor_only(spec);
  ASSERT_TRUE(monitor_only.StartMonitor("tcp://127.0.0.1:0"));
  const int port = FreePort();
  const std::string advertised = "tcp://localhost:" + std::to_string(port);
  auto shard = Process::Start({PACER_SERVER_BIN, "--monitor", monitor_only.monitor_address,
                               "--listen", "tcp://127.0.0.1:" + std::to_string(port),
                               "--advertise", advertised},
                              monitor_only.dir.path(), "shard");
  auto listening = shard->WaitForLine("listening ", seconds(10));
  ASSERT_TRUE(listening) << shard->Stderr();
  EXPECT_EQ(*listening, "tcp://127.0.0.1:" + std::to_string(port)) << "--listen is what it binds";
  auto worker = Process::Start({PACER_WORKER_BIN, "--monitor", monitor_only.monitor_address,
                                "--train-limit", "6000", "--test-limit", "1000"},
                               monitor_only.dir.path(), "worker");
  Json status;
  const auto until = std::chrono::steady_clock::now() + seconds(30);
  while (std::chrono::steady_clock::now() < until) {
    status = Status(monitor_only);
    if (status.is_object() && !status["shards"].empty()) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  ASSERT_TRUE(status.is_object() && !status["shards"].empty()) << status.dump();
  EXPECT_EQ(status["shards"][0]["address"], advertised) << status.dump(1);
  // Training runs through it to the target.
  EXPECT_EQ(monitor_only.monitor->Wait(seconds(60)), std::optional<int>(0));
  EXPECT_NE(monitor_only.monitor->Stdout().find("stop reason: target accuracy"), std::string::npos)
      << monitor_only.monitor->Stdout() << worker->Stderr() << shard->Stderr();
}

}  // namespace
}  // namespace pacer::test
