// pacer-chaos: runs a chaos scenario (monitor/chaos_scenario.h) against a
// local cluster on 127.0.0.1 and reports pass or fail for each invariant.
//
//   pacer-chaos SCENARIO.yaml [--out DIR] [--seed N] [--bin-dir DIR] [--netns]
//
// --netns runs every process in its own network namespace (chaos_netns.h)
// and partitions with iptables; without root or iptables it exits 77.
//
// The workers it starts are the real pacer-worker, each with --ack-log: a
// journal of every acknowledged push (wall time, push seq, clock, samples),
// written the moment the client library reports the acknowledgement, so
// the record of what the cluster acknowledged is kept at the client
// boundary, not taken from the system's own reports. Metrics are scraped only to see
// what the system did (lost updates, applied pushes, faults counted), and
// compared against that record.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "monitor/chaos_netns.h"
#include "monitor/chaos_scenario.h"
#include "nlohmann/json.hpp"
#include "ps/cli.h"
#include "ps/rpc.h"
#include "ps/scrape.h"
#include "spdlog/spdlog.h"

namespace pacer::chaos {
namespace {

// SIGINT/SIGTERM: the runner stops at its next wait (Interrupted, caught in
// main), so that its processes and namespaces are cleaned up.
std::atomic<bool> g_interrupted{false};
struct Interrupted {};

// Exit code of a run that could not happen here (--netns without root or
// iptables): ctest's SKIP_RETURN_CODE.
constexpr int kExitSkip = 77;

using Millis = std::chrono::milliseconds;

double NowUnix() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A child process with stdout and stderr in files.
class Proc {
 public:
  // `netns`: the path of a network namespace to run it in ("" : this one).
  static std::unique_ptr<Proc> Start(const std::vector<std::string>& argv, const std::string& dir,
                                     const std::string& name, const std::string& netns = "") {
    auto p = std::unique_ptr<Proc>(new Proc());
    p->name_ = name;
    p->out_ = dir + "/" + name + ".out";
    p->err_ = dir + "/" + name + ".log";
    p->started_ = NowUnix();
    const pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      if (!netns.empty()) {
        const int fd = open(netns.c_str(), O_RDONLY);
        if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(126);
        close(fd);
      }
      int out = open(p->out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open(p->err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execv(args[0], args.data());
      _exit(127);
    }
    p->pid_ = pid;
    return p;
  }
  ~Proc() {
    if (Running()) {
      kill(pid_, SIGKILL);
      Wait(Millis(2000));
    }
  }
  std::optional<std::string> WaitLine(const std::string& prefix, Millis timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    do {
      std::ifstream in(out_);
      for (std::string line; std::getline(in, line);) {
        if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
      }
      if (!Running()) break;
      std::this_thread::sleep_for(Millis(50));
    } while (std::chrono::steady_clock::now() < until);
    return std::nullopt;
  }
  bool Running() {
    if (exit_code_) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      ended_ = NowUnix();
      gone = true;
      return false;
    }
    return true;
  }
  std::optional<int> Wait(Millis timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    while (Running() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(Millis(20));
    return exit_code_;
  }
  void Signal(int sig) {
    if (Running()) kill(pid_, sig);
  }
  const std::string& name() const { return name_; }
  pid_t pid() const { return pid_; }
  std::optional<int> exit_code() const { return exit_code_; }
  double started() const { return started_; }
  double ended() const { return ended_; }
  bool killed_on_purpose = false;  // the timeline killed or terminated it
  // SIGSTOPped by the timeline and not continued (a slow action's cycler
  // reads it, so as not to wake a process the timeline froze).
  std::atomic<bool> stopped{false};
  bool hung = false;               // still running long after the job stopped
  std::atomic<bool> gone{false};   // reaped: its pid is no longer its own
  bool cut_off = false;            // --netns: partitioned by iptables (not scraped)
  bool drained = false;            // drain-shard: its keys moved away and it left
  double counts_from = 0;          // a shard: acknowledged pushes reach it from then (unix s)
  std::string metrics;             // its /metrics address
  // Largest value seen of each scraped series key (metric + labels).
  std::map<std::string, double> seen;
  // Each series' value at the last scrape that had it, with when that
  // scrape was asked for and when it was answered (a truncated answer
  // lacks series; their older values stay).
  struct Sample {
    double value, at, done;
  };
  std::map<std::string, Sample> last;
  double last_scrape_at = 0;

 private:
  Proc() = default;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
  std::string name_, out_, err_;
  double started_ = 0, ended_ = 0;
};

struct Ack {
  double at;       // unix seconds, when the hook saw it
  uint64_t seq;
  uint64_t clock;
  uint64_t samples;  // in its batch (0: an empty push, no training)
};

struct Verdict {
  std::string key;   // the invariant's key in the scenario (lost_bound, ...)
  std::string name;
  bool pass = true;
  std::string detail;
  // false: nothing to check in this scenario (printed N/A; it neither
  // passes nor fails).
  bool applicable = true;
};

class Runner {
 public:
  // `netns`: each process in its own network namespace (chaos_netns.h);
  // else all on 127.0.0.1.
  Runner(Scenario s, std::string dir, std::string bin_dir, uint64_t seed, bool netns)
      : s_(std::move(s)), dir_(std::move(dir)), bin_(std::move(bin_dir)), seed_(seed), netns_(netns) {}

  ~Runner() {
    for (auto& t : slowers_) {
      if (t.joinable()) t.join();
    }
  }

  int Run();

 private:
  std::string Bin(const std::string& name) const;
  // Where node `node` ("monitor", "ctl", "shard0", "worker1") binds, and the
  // namespace it runs in ("" without --netns).
  std::string Host(const std::string& node) const;
  std::string Ns(const std::string& node) const;
  // --netns: namespaces for every process the scenario can start.
  bool MakeNodes();
  // --netns: lifts the partitions whose time is up (all with `all`).
  void LiftPartitions(bool all = false);
  // Sleeps ~250 ms between scrapes until unix time `until`.
  void ScrapeUntil(double until);
  bool StartMonitor(const std::string& listen);
  bool StartShard(size_t i);
  bool StartWorker();
  std::vector<Proc*> All();
  Proc* Target(const std::string& target);
  void Scrape();
  int Ctl(const std::vector<std::string>& args, std::string* out = nullptr);
  std::string FaultTarget(const std::string& t);
  bool Do(const Action& a);
  std::vector<Ack> Acks(size_t worker) const;
  // Prints the verdicts; true when the run passed: every invariant holds
  // but those the scenario expects to fail, and those fail.
  bool Check();

  Scenario s_;
  std::string dir_, bin_;
  uint64_t seed_;
  bool netns_;
  std::unique_ptr<NetnsLab> lab_;  // before procs_: its namespaces outlive them
  std::vector<std::pair<double, std::string>> lifts_;  // --netns: (unix s, node) to let back
  std::string monitor_address_;
  std::vector<std::unique_ptr<Proc>> procs_;  // every process ever started
  Proc* monitor_ = nullptr;
  std::vector<Proc*> shards_, workers_;        // current incarnations, by index
  std::vector<uint32_t> shard_ids_, worker_ids_;
  std::vector<std::string> journals_;          // by worker index
  double t0_ = 0;                              // training started (unix s)
  std::vector<double> heals_;                  // unix s
  struct Kill {
    size_t shard;
    double at;
  };
  std::vector<Kill> shard_kills_;
  std::vector<std::thread> slowers_;  // slow: one SIGSTOP/SIGCONT cycler each
  double max_disk_delay_ = 0;  // the longest slow_disk delay injected (s)
  struct Injected {
    std::vector<Proc*> procs;
    std::set<std::string> kinds;
    std::string what;
  };
  std::vector<Injected> injected_;
  std::vector<std::pair<std::string, std::string>> expect_monitor_;  // (metric, why) to rise
  std::vector<Verdict> verdicts_;
  std::optional<double> accuracy_;
};

std::string Runner::Bin(const std::string& name) const {
  for (const std::string& d : {bin_, bin_ + "/../ps", bin_ + "/../monitor", bin_ + "/../worker"}) {
    const std::string p = d + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return bin_ + "/" + name;
}

std::string Runner::Host(const std::string& node) const {
  return lab_ != nullptr ? lab_->Address(node) : "127.0.0.1";
}

std::string Runner::Ns(const std::string& node) const {
  return lab_ != nullptr ? lab_->NsPath(node) : "";
}

bool Runner::MakeNodes() {
  int workers = s_.workers;
  int shards = s_.shards;
  for (const Action& a : s_.timeline) {
    workers += a.what == "add-worker";
    shards += a.what == "add-shard";
  }
  std::vector<std::string> nodes = {"monitor", "ctl"};
  for (int i = 0; i < shards; ++i) nodes.push_back("shard" + std::to_string(i));
  for (int i = 0; i < workers; ++i) nodes.push_back("worker" + std::to_string(i));
  for (const auto& node : nodes) {
    auto address = lab_->AddNode(node);
    if (!address.ok()) {
      spdlog::error("--netns: {}", ErrorText(address.status()));
      return false;
    }
    spdlog::info("--netns: {} at {} ({})", node, *address, lab_->NsPath(node));
  }
  // This process's own probes (scrapes) go out from the ctl namespace too.
  if (auto st = lab_->Enter("ctl"); !st.ok()) {
    spdlog::error("--netns: {}", ErrorText(st));
    return false;
  }
  return true;
}

void Runner::LiftPartitions(bool all) {
  const double now = NowUnix();
  for (auto it = lifts_.begin(); it != lifts_.end();) {
    if (!all && it->first > now) {
      ++it;
      continue;
    }
    if (auto st = lab_->Cut(it->second, false); !st.ok()) spdlog::error("--netns: {}", ErrorText(st));
    spdlog::info("t+{:.1f}s: --netns: {} let back", now - t0_, it->second);
    for (Proc* p : All()) {
      if (p->name() == it->second || p->name() == it->second + "-restarted") p->cut_off = false;
    }
    heals_.push_back(now);  // when it really ended (a blocking action may delay it)
    it = lifts_.erase(it);
  }
}

void Runner::ScrapeUntil(double until) {
  while (NowUnix() < until) {
    if (g_interrupted) throw Interrupted{};
    if (lab_ != nullptr) LiftPartitions();
    Scrape();
    std::this_thread::sleep_for(Millis(250));
  }
}

bool Runner::StartMonitor(const std::string& listen) {
  std::vector<std::string> a = {Bin("pacer-monitor"), "--listen", listen, "--metrics-addr",
                                Host("monitor") + ":0", "--data-dir", dir_ + "/monitor", "--min-shards",
                                std::to_string(s_.shards), "--min-workers",
                                std::to_string(s_.workers), "--time-cap",
                                std::to_string(s_.seconds), "--target-accuracy", "0",
                                "--eval-interval", "1", "--fault-seed", std::to_string(seed_)};
  if (!s_.mode.empty()) a.insert(a.end(), {"--mode", s_.mode});
  a.insert(a.end(), s_.monitor_args.begin(), s_.monitor_args.end());
  procs_.push_back(Proc::Start(a, dir_, monitor_ ? "monitor-restarted" : "monitor", Ns("monitor")));
  monitor_ = procs_.back().get();
  auto addr = monitor_->WaitLine("listening ", Millis(10000));
  auto m = monitor_->WaitLine("metrics ", Millis(10000));
  if (!addr || !m) return false;
  monitor_address_ = *addr;
  monitor_->metrics = *m;
  return true;
}

bool Runner::StartShard(size_t i) {
  const std::string node = "shard" + std::to_string(i);
  std::vector<std::string> a = {Bin("pacer-server"), "--listen", "tcp://" + Host(node) + ":0",
                                "--monitor", monitor_address_, "--metrics-addr", Host(node) + ":0",
                                "--data-dir",
                                dir_ + "/shard" + std::to_string(i), "--checkpoint-interval",
                                std::to_string(s_.checkpoint_interval), "--fault-seed",
                                std::to_string(seed_ + 1 + i), "--register-timeout", "60"};
  a.insert(a.end(), s_.shard_args.begin(), s_.shard_args.end());
  const bool again = i < shards_.size() && shards_[i] != nullptr;
  procs_.push_back(Proc::Start(a, dir_, node + (again ? "-restarted" : ""), Ns(node)));
  if (i >= shards_.size()) shards_.resize(i + 1, nullptr);
  shards_[i] = procs_.back().get();
  auto m = shards_[i]->WaitLine("metrics ", Millis(10000));
  if (!m) return false;
  shards_[i]->metrics = *m;
  // Registered (and restored, after a restart) once it prints its address.
  return shards_[i]->WaitLine("listening ", Millis(60000)).has_value();
}

bool Runner::StartWorker() {
  const size_t i = workers_.size();
  journals_.push_back(dir_ + "/worker" + std::to_string(i) + ".acks");
  std::vector<std::string> a = {Bin("pacer-worker"), "--monitor", monitor_address_,
                                "--ack-log", journals_.back(), "--metrics-addr",
                                Host("worker" + std::to_string(i)) + ":0",
                                "--fault-seed", std::to_string(seed_ + 100 + i)};
  a.insert(a.end(), s_.worker_args.begin(), s_.worker_args.end());
  procs_.push_back(Proc::Start(a, dir_, "worker" + std::to_string(i), Ns("worker" + std::to_string(i))));
  workers_.push_back(procs_.back().get());
  auto m = workers_.back()->WaitLine("metrics ", Millis(10000));
  if (!m) return false;
  workers_.back()->metrics = *m;
  return true;
}

std::vector<Proc*> Runner::All() {
  std::vector<Proc*> all;
  for (auto& p : procs_) all.push_back(p.get());
  return all;
}

Proc* Runner::Target(const std::string& t) {
  if (t == "monitor") return monitor_;
  const auto colon = t.find(':');
  const size_t i = std::stoul(t.substr(colon + 1));
  if (t.rfind("shard:", 0) == 0) return i < shards_.size() ? shards_[i] : nullptr;
  return i < workers_.size() ? workers_[i] : nullptr;
}

void Runner::Scrape() {
  for (Proc* p : All()) {
    if (p->metrics.empty() || p->stopped || p->cut_off || !p->Running()) continue;
    const double at = NowUnix();
    const std::string text = FetchMetrics(p->metrics);
    if (text.empty()) continue;
    p->last_scrape_at = at;
    const double done = NowUnix();
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      const auto sp = line.rfind(' ');
      try {
        const double v = std::stod(line.substr(sp + 1));
        const std::string key = line.substr(0, sp);
        p->last[key] = {v, at, done};
        auto it = p->seen.find(key);
        if (it == p->seen.end() || v > it->second) p->seen[key] = v;
      } catch (const std::exception&) {
      }
    }
  }
}

// Of the series `values` (key: metric + labels), the sum of those named
// `name` whose key contains every label.
double Sum(const std::map<std::string, double>& values, const std::string& name,
           const std::vector<std::string>& labels = {}) {
  double sum = 0;
  for (const auto& [key, v] : values) {
    if (key.rfind(name, 0) != 0) continue;
    const char next = key.size() > name.size() ? key[name.size()] : '\0';
    if (next != '{' && next != '\0') continue;
    bool all = true;
    for (const auto& l : labels) all &= key.find(l) != std::string::npos;
    if (all) sum += v;
  }
  return sum;
}

// Of `p`'s last scrapes, the sum of the series named `name` (as Sum does),
// and the earliest ask and latest answer among those scrapes; nullopt when
// no scrape had it.
struct LastSum {
  double value = 0, at = 0, done = 0;
};
std::optional<LastSum> Last(const std::map<std::string, Proc::Sample>& last, const std::string& name) {
  std::optional<LastSum> r;
  for (const auto& [key, s] : last) {
    if (key.rfind(name, 0) != 0) continue;
    const char next = key.size() > name.size() ? key[name.size()] : '\0';
    if (next != '{' && next != '\0') continue;
    if (!r) r = LastSum{0, s.at, s.done};
    r->value += s.value;
    r->at = std::min(r->at, s.at);
    r->done = std::max(r->done, s.done);
  }
  return r;
}

// The largest value seen of `name` (summed as Sum does) in `p`.
double Seen(const Proc* p, const std::string& name, const std::vector<std::string>& labels = {}) {
  return Sum(p->seen, name, labels);
}

int Runner::Ctl(const std::vector<std::string>& args, std::string* out) {
  std::vector<std::string> a = {Bin("pacerctl"), "--monitor", monitor_address_};
  a.insert(a.end(), args.begin(), args.end());
  static int n = 0;
  auto p = Proc::Start(a, dir_, "pacerctl-" + std::to_string(n++), Ns("ctl"));
  auto rc = p->Wait(Millis(30000));
  if (out != nullptr) {
    std::ifstream in(dir_ + "/" + p->name() + ".out");
    std::stringstream ss;
    ss << in.rdbuf();
    *out = ss.str();
  }
  return rc.value_or(-1);
}

std::string Runner::FaultTarget(const std::string& t) {
  if (t.rfind("shard:", 0) == 0) return "server:" + std::to_string(shard_ids_.at(std::stoul(t.substr(6))));
  if (t.rfind("worker:", 0) == 0) return "worker:" + std::to_string(worker_ids_.at(std::stoul(t.substr(7))));
  return t;
}

bool Runner::Do(const Action& a) {
  const double now = NowUnix();
  spdlog::info("t+{:.1f}s: {} {} {}", now - t0_, a.what, a.target, a.spec);
  if (a.what == "kill" || a.what == "terminate") {
    Proc* p = Target(a.target);
    if (p == nullptr) return false;
    if (a.target.rfind("shard:", 0) == 0 && a.what == "kill") {
      shard_kills_.push_back({std::stoul(a.target.substr(6)), now});
      expect_monitor_.push_back({"pacer_monitor_shard_restarts_total", "shard killed"});
    }
    if (a.target.rfind("worker:", 0) == 0 && a.what == "kill") {
      expect_monitor_.push_back({"pacer_monitor_workers_lost_total", "worker killed"});
    }
    p->killed_on_purpose = true;
    p->Signal(a.what == "kill" ? SIGKILL : SIGTERM);
    p->Wait(Millis(10000));
    return true;
  }
  if (a.what == "restart") {
    heals_.push_back(now);
    if (a.target == "monitor") {
      if (monitor_->Running()) return false;
      expect_monitor_.push_back({"pacer_monitor_membership_changes_total{reason=\"restarted\"}",
                                 "monitor restarted"});
      return StartMonitor(monitor_address_);
    }
    if (a.target.rfind("shard:", 0) == 0) return StartShard(std::stoul(a.target.substr(6)));
    return false;  // a worker comes back as add-worker
  }
  if (a.what == "stop" || a.what == "cont") {
    Proc* p = Target(a.target);
    if (p == nullptr) return false;
    p->Signal(a.what == "stop" ? SIGSTOP : SIGCONT);
    p->stopped = a.what == "stop";
    if (a.what == "cont") heals_.push_back(now);
    if (a.what == "stop" && a.target.rfind("worker:", 0) == 0) {
      expect_monitor_.push_back({"pacer_monitor_worker_clock_lag", "worker stopped"});
    }
    return true;
  }
  if (a.what == "add-worker") {
    heals_.push_back(now);
    return StartWorker();
  }
  if (a.what == "slow") {
    Proc* p = Target(a.target);
    if (p == nullptr || !p->Running()) return false;
    heals_.push_back(now + a.seconds);
    if (a.target.rfind("worker:", 0) == 0) {
      expect_monitor_.push_back({"pacer_monitor_worker_clock_lag", "worker slowed"});
    }
    // Runs 1/factor of every 100 ms: a process on a starved CPU.
    // (The cycler signals this incarnation only: a restarted process is
    // not slowed; one the timeline stops meanwhile stays stopped.)
    slowers_.emplace_back([p, factor = a.factor, seconds = a.seconds] {
      const auto period = Millis(100);
      const auto run = std::chrono::duration_cast<Millis>(period / factor);
      const auto until = std::chrono::steady_clock::now() + FromSeconds(seconds);
      while (std::chrono::steady_clock::now() < until && !p->gone) {
        if (!p->stopped) kill(p->pid(), SIGSTOP);
        std::this_thread::sleep_for(period - run);
        if (!p->stopped) kill(p->pid(), SIGCONT);
        std::this_thread::sleep_for(run);
      }
      if (!p->stopped && !p->gone) kill(p->pid(), SIGCONT);
    });
    return true;
  }
  if (a.what == "add-shard") {
    // A new shard process registers idle; pacerctl add-shard hands it half
    // of the largest key range (the workers are held while the keys move).
    const size_t i = shards_.size();
    if (!StartShard(i)) return false;
    std::string status;
    Ctl({"status", "-o", "json"}, &status);
    const auto j = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
    uint32_t id = 0;
    if (j.is_object()) {
      for (const auto& sh : j.value("shards", nlohmann::json::array())) {
        if (!sh.is_object() || !sh.contains("id") || !sh["id"].is_number_unsigned()) continue;
        const uint32_t sid = sh["id"].get<uint32_t>();
        if (std::find(shard_ids_.begin(), shard_ids_.end(), sid) == shard_ids_.end()) id = sid;
      }
    }
    if (id == 0) return false;
    shard_ids_.push_back(id);
    if (Ctl({"add-shard", std::to_string(id)}) != 0) return false;
    shards_[i]->counts_from = NowUnix();
    heals_.push_back(NowUnix());
    return true;
  }
  if (a.what == "drain-shard") {
    Proc* p = Target(a.target);
    if (p == nullptr) return false;
    const size_t i = std::stoul(a.target.substr(6));
    if (i >= shard_ids_.size()) return false;  // an add-shard before it failed
    p->drained = true;
    if (Ctl({"drain-shard", std::to_string(shard_ids_[i])}) != 0) return false;
    heals_.push_back(NowUnix());
    return true;
  }
  if (a.what == "partition" && lab_ != nullptr) {
    // Real network: the kernel drops every packet to and from the node.
    const std::string node = a.target.substr(0, a.target.find(':')) + a.target.substr(a.target.find(':') + 1);
    if (auto st = lab_->Cut(node, true); !st.ok()) {
      spdlog::error("--netns: {}", ErrorText(st));
      return false;
    }
    if (Proc* p = Target(a.target)) p->cut_off = true;
    lifts_.push_back({now + a.seconds, node});
    if (a.target.rfind("worker:", 0) == 0) {
      expect_monitor_.push_back({"pacer_monitor_workers_lost_total", "worker partitioned (iptables)"});
    }
    return true;
  }
  if (a.what == "faults" || a.what == "partition") {
    Injected inj;
    inj.what = a.what + " " + a.target;
    std::string target = a.target, spec = a.spec;
    if (a.what == "partition") {
      spec = "partition:for=" + std::to_string(a.seconds);
      inj.kinds = {"partition"};
      heals_.push_back(now + a.seconds);
    } else {
      auto rules = ParseFaults(spec);
      for (const auto& r : *rules) {
        inj.kinds.insert(FaultKindName(r.kind));
        if (r.kind == FaultKind::kSlowDisk) {
          max_disk_delay_ = std::max(max_disk_delay_, ToSeconds(r.delay + r.jitter));
        }
        if (r.lasts > Duration::zero()) heals_.push_back(now + ToSeconds(r.lasts));
      }
    }
    if (target == "all") {
      inj.procs = All();
    } else if (target == "server" || target == "worker" || target == "monitor") {
      for (Proc* p : target == "server" ? shards_ : target == "worker" ? workers_
                                                                       : std::vector<Proc*>{monitor_}) {
        inj.procs.push_back(p);
      }
    } else {
      inj.procs.push_back(Target(target));
    }
    injected_.push_back(inj);
    std::string out;
    const int rc = Ctl({"fault", "set", FaultTarget(target), spec}, &out);
    if (rc != 0) return false;
    if (a.what == "partition") {
      // The others drop what the partitioned process sends them.
      const std::string id = FaultTarget(target).substr(FaultTarget(target).find(':') + 1);
      const std::string peers = "partition:peers=" + id + ",for=" + std::to_string(a.seconds);
      if (Ctl({"fault", "set", "monitor", peers}) != 0) return false;
      if (Ctl({"fault", "set", target.rfind("shard:", 0) == 0 ? "worker" : "server", peers}) != 0) {
        return false;
      }
    }
    return true;
  }
  if (a.what == "clear-faults") {
    heals_.push_back(now);
    return Ctl({"fault", "clear"}) == 0;
  }
  return false;
}

std::vector<Ack> Runner::Acks(size_t worker) const {
  std::vector<Ack> acks;
  std::ifstream in(journals_[worker]);
  for (std::string line; std::getline(in, line);) {
    Ack a{};
    std::istringstream ls(line);
    if (ls >> a.at >> a.seq >> a.clock >> a.samples) acks.push_back(a);
  }
  return acks;
}

int Runner::Run() {
  // A directory of an earlier run (it has the marker) is emptied; any other
  // non-empty one is refused (the monitor would resume a stranger's state).
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(dir_) && !fs::is_empty(dir_)) {
    if (!fs::exists(dir_ + "/.pacer-chaos")) {
      std::fprintf(stderr, "pacer-chaos: --out %s is not empty and not an earlier run's\n",
                   dir_.c_str());
      return kExitUsage;
    }
    fs::remove_all(dir_, ec);
  }
  fs::create_directories(dir_);
  std::ofstream(dir_ + "/.pacer-chaos") << s_.name << "\n";
  spdlog::info("scenario {}: {} (seed {}; logs in {})", s_.name, s_.description, seed_, dir_);
  if (netns_) {
    // Without the privilege or the tools, a skip (exit 77), not a failure.
    NetnsLab::DeleteStale();
    const bool partitions = std::any_of(s_.timeline.begin(), s_.timeline.end(),
                                        [](const Action& a) { return a.what == "partition"; });
    absl::Status can;
    auto lab = NetnsLab::Create(dir_ + "/netns.log");
    if (lab.ok()) {
      lab_ = std::move(*lab);
      if (partitions) can = lab_->CheckIptables();
      if (can.ok() && !MakeNodes()) {
        can = absl::FailedPreconditionError("could not make the namespaces and their links; see " +
                                            dir_ + "/netns.log");
      }
    } else {
      can = lab.status();
    }
    if (!can.ok()) {
      std::printf("pacer-chaos: --netns: skipped: %s\n", std::string(can.message()).c_str());
      std::fflush(stdout);
      return kExitSkip;
    }
  }
  if (!StartMonitor("tcp://" + Host("monitor") + ":0")) {
    std::fprintf(stderr, "pacer-chaos: the monitor did not start (see %s)\n", dir_.c_str());
    return kExitFailure;
  }
  for (int i = 0; i < s_.shards; ++i) {
    if (!StartShard(static_cast<size_t>(i))) {
      std::fprintf(stderr, "pacer-chaos: shard %d did not start (see %s)\n", i, dir_.c_str());
      return kExitFailure;
    }
  }
  for (int i = 0; i < s_.workers; ++i) {
    if (!StartWorker()) {
      std::fprintf(stderr, "pacer-chaos: worker %d did not start (see %s)\n", i, dir_.c_str());
      return kExitFailure;
    }
  }
  // Training starts: every worker has an acknowledged push.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < workers_.size(); ++i) all &= !Acks(i).empty();
    if (all) break;
    if (g_interrupted) throw Interrupted{};
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "pacer-chaos: training did not start in 60 s (see %s)\n", dir_.c_str());
      return kExitFailure;
    }
    std::this_thread::sleep_for(Millis(100));
  }
  t0_ = NowUnix();
  heals_.push_back(t0_);
  // Ids, for fault targets: shards registered in order; workers print theirs.
  std::string status;
  for (Proc* w : workers_) worker_ids_.push_back(std::stoul(w->WaitLine("worker id ", Millis(1000)).value_or("0")));
  Ctl({"status", "-o", "json"}, &status);
  const auto j = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    for (const auto& sh : j.value("shards", nlohmann::json::array())) {
      shard_ids_.push_back(sh.value("id", 0u));
    }
  }
  std::sort(shard_ids_.begin(), shard_ids_.end());  // registration order

  for (const Action& a : s_.timeline) {
    ScrapeUntil(t0_ + a.at);
    if (!Do(a)) {
      verdicts_.push_back({"timeline", "timeline", false, "could not " + a.what + " " + a.target});
    }
  }
  // Until 4 s before the end: scrape; then take the model and let it stop.
  while (NowUnix() < t0_ + s_.seconds - 4 && monitor_->Running()) ScrapeUntil(NowUnix() + 0.25);
  if (lab_ != nullptr) LiftPartitions(/*all=*/true);
  Scrape();
  if (s_.invariants.final_accuracy > 0) {
    std::string out;
    if (Ctl({"export-model", dir_ + "/final.model"}, &out) == 0) {
      auto eval = Proc::Start({Bin("pacer-worker"), "--evaluate-model", dir_ + "/final.model"}, dir_,
                              "evaluate", Ns("ctl"));
      eval->Wait(Millis(60000));
      if (auto acc = eval->WaitLine("test accuracy: ", Millis(100))) accuracy_ = std::stod(*acc);
    }
  }
  const double end_of_run = NowUnix();
  // The job stops at its time cap: everyone must leave by themselves.
  monitor_->Wait(Millis(static_cast<int64_t>((t0_ + s_.seconds + 30 - NowUnix()) * 1000)));
  std::vector<std::string> hung;
  const auto leave_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (Proc* p : All()) {
    if (p->name().rfind("pacerctl", 0) == 0 || p->name() == "evaluate") continue;
    if (p->stopped) continue;  // frozen by the timeline until the end
    const auto left = std::chrono::duration_cast<Millis>(leave_by - std::chrono::steady_clock::now());
    if (!p->Wait(std::max(left, Millis(0))) && !p->killed_on_purpose) {
      p->hung = true;
      hung.push_back(p->name());
    }
  }
  for (auto& t : slowers_) t.join();
  for (Proc* p : All()) p->Signal(SIGKILL);

  // --- invariants -------------------------------------------------------------
  const Invariants& inv = s_.invariants;
  std::vector<Ack> all_acks;
  std::vector<std::vector<Ack>> acks;
  for (size_t i = 0; i < workers_.size(); ++i) {
    acks.push_back(Acks(i));
    all_acks.insert(all_acks.end(), acks.back().begin(), acks.back().end());
  }
  if (inv.progress_within > 0) {
    Verdict v{"progress_within", "progress after each fault heals", true, ""};
    for (double h : heals_) {
      if (h > t0_ + s_.seconds - 2) continue;  // no time left to show progress
      const double until = std::min(h + inv.progress_within, t0_ + s_.seconds);
      // Training moved: a push of a real batch (not an empty one) was
      // acknowledged.
      const bool moved = std::any_of(all_acks.begin(), all_acks.end(), [&](const Ack& a) {
        return a.at > h && a.at <= until && a.samples > 0;
      });
      if (!moved) {
        v.pass = false;
        v.detail += fmt::format("no acknowledged batch in the {:.0f} s after t+{:.1f}s; ",
                                until - h, h - t0_);
      }
    }
    if (v.pass) v.detail = fmt::format("{} heal point(s), {} acknowledged pushes", heals_.size(),
                                       all_acks.size());
    verdicts_.push_back(v);
  }
  if (inv.no_crash) {
    Verdict v{"no_crash", "no process crashes", true, ""};
    for (Proc* p : All()) {
      if (p->killed_on_purpose || p->stopped || p->hung || p->name().rfind("pacerctl", 0) == 0 ||
          p->name() == "evaluate") {
        continue;
      }
      if (p->exit_code() && *p->exit_code() != 0 && p->ended() < end_of_run + 60) {
        v.pass = false;
        v.detail += fmt::format("{} exited with {}; ", p->name(), *p->exit_code());
      }
    }
    if (v.pass) v.detail = "every process not killed on purpose exited 0";
    verdicts_.push_back(v);
  }
  if (inv.no_hang) {
    Verdict v{"no_hang", "no process hangs", true, ""};
    for (const auto& h : hung) {
      v.pass = false;
      v.detail += h + " still running 20 s after the job stopped; ";
    }
    if (v.pass) v.detail = "every process left after the job stopped";
    verdicts_.push_back(v);
  }
  if (inv.lost_bound) {
    Verdict v{"lost_bound", "lost updates within the bound", true, ""};
    // Per shard: the pushes the runner saw acknowledged before the shard's
    // last scrape, against the pushes its parameters hold at that scrape
    // (every acknowledged push went to every shard and was applied before
    // its ack was journaled). The difference was lost. The bound, from the
    // scenario's settings rather than the shard's own account: a kill may
    // lose what was acknowledged in the checkpoint interval before it, plus
    // the checkpoint's write (twice any slow_disk delay) and 2 s for clocks
    // still open at the snapshot.
    const double window = s_.checkpoint_interval + 2 * max_disk_delay_ + 2;
    for (size_t i = 0; i < shards_.size(); ++i) {
      const Proc* p = shards_[i];
      if (p != nullptr && p->drained) continue;  // its keys and their history moved away
      const auto model = p == nullptr ? std::nullopt : Last(p->last, "pacer_shard_model_updates");
      if (!model) {
        v.pass = false;
        v.detail += fmt::format("shard{}: never scraped; ", i);
        continue;
      }
      double acked = 0;
      for (const Ack& a : all_acks) acked += a.at >= p->counts_from && a.at < model->at;
      const double held = model->value;
      const double lost = std::max(0.0, acked - held);
      double bound = 0;
      for (const Kill& k : shard_kills_) {
        if (k.shard != i) continue;
        for (const Ack& a : all_acks) bound += (a.at >= k.at - window && a.at <= k.at + 0.5);
      }
      const double reported = Seen(p, "pacer_shard_lost_updates_total");
      if (lost > bound) {
        v.pass = false;
        v.detail += fmt::format("shard{}: {} acknowledged, {} held: {} lost, bound {}; ", i, acked,
                                held, lost, bound);
      } else if (lost > 0 || reported > 0) {
        // Two counts, made differently: the runner's, acknowledged pushes
        // (up to the shard's last scrape) its update counter does not hold;
        // the shard's, the gap in each worker's push sequence numbers at
        // its first push after the restore. A push acknowledged between
        // the last scrape and the kill is in the shard's count only.
        v.detail += fmt::format(
            "shard{}: {} acknowledged pushes lost, within the bound of {} (those acknowledged in "
            "the checkpoint window before a kill); the shard itself counted {} (from sequence-"
            "number gaps after its restore, which also covers pushes acknowledged after its last "
            "scrape); ",
            i, lost, bound, reported);
      }
    }
    if (v.pass && v.detail.empty()) v.detail = "no shard lost an acknowledged push";
    verdicts_.push_back(v);
  }
  if (inv.no_double_apply) {
    Verdict v{"no_double_apply", "no push applied twice", true, ""};
    // A shard folds each acknowledged push in once: what it had applied at
    // its last scrape is at most what was acknowledged from its start to the
    // end of that scrape, plus one push per worker in flight.
    for (Proc* p : All()) {
      if (p->name().rfind("shard", 0) != 0) continue;
      const auto counted = Last(p->last, "pacer_shard_updates_applied_total");
      if (!counted) continue;  // never answered a scrape: nothing to compare
      const double applied = counted->value;
      double acked = 0;
      for (const Ack& a : all_acks) acked += (a.at >= p->started() && a.at <= counted->done);
      const double slack = static_cast<double>(workers_.size());
      if (applied > acked + slack) v.pass = false;
      v.detail += fmt::format("{} applied {} pushes, {} acknowledged while it ran; ", p->name(),
                              applied, acked);
    }
    v.detail += fmt::format(
        "{} (a shard may have applied up to {} more than were acknowledged: one push per worker "
        "whose reply was still on its way at the last scrape)",
        v.pass ? "none applied twice" : "some applied twice", workers_.size());
    verdicts_.push_back(v);
  }
  if (inv.final_accuracy > 0) {
    Verdict v{"final_accuracy", "final test accuracy", true, ""};
    v.pass = accuracy_ && *accuracy_ >= inv.final_accuracy;
    v.detail = accuracy_ ? fmt::format("{:.4f} (threshold {})", *accuracy_, inv.final_accuracy)
                         : "no model could be exported and evaluated";
    verdicts_.push_back(v);
  }
  if (inv.faults_in_metrics) {
    Verdict v{"faults_in_metrics", "every injected fault shows in the metrics", true, ""};
    for (const Injected& inj : injected_) {
      double count = 0;
      for (Proc* p : inj.procs) {
        for (const auto& k : inj.kinds) count += Seen(p, "pacer_faults_injected_total", {"kind=\"" + k + "\""});
      }
      if (count <= 0) {
        v.pass = false;
        v.detail += inj.what + ": no pacer_faults_injected_total; ";
      }
    }
    for (const auto& [metric, why] : expect_monitor_) {
      double count = 0;
      const auto brace = metric.find('{');
      const std::string name = metric.substr(0, brace);
      std::vector<std::string> labels;
      if (brace != std::string::npos) labels.push_back(metric.substr(brace + 1, metric.size() - brace - 2));
      for (Proc* p : All()) {
        if (p->name().rfind("monitor", 0) == 0) count += Seen(p, name, labels);
      }
      if (count <= 0) {
        v.pass = false;
        v.detail += why + ": " + metric + " never rose; ";
      }
    }
    if (v.pass) v.detail = fmt::format("{} fault(s), {} process event(s) seen", injected_.size(),
                                       expect_monitor_.size());
    if (injected_.empty() && expect_monitor_.empty()) {
      v.applicable = false;
      v.detail = "the scenario injected no fault: nothing to check";
    }
    verdicts_.push_back(v);
  }
  return Check() ? kExitOk : kExitFailure;
}

bool Runner::Check() {
  auto expected = [&](const Verdict& v) {
    return std::find(s_.expect_fail.begin(), s_.expect_fail.end(), v.key) != s_.expect_fail.end();
  };
  std::printf("scenario %s\n", s_.name.c_str());
  bool ok = true;
  for (const std::string& key : s_.expect_fail) {
    if (std::none_of(verdicts_.begin(), verdicts_.end(),
                     [&](const Verdict& v) { return v.key == key; })) {
      ok = false;
      std::printf("FAIL  %s: expected to fail, but not checked\n", key.c_str());
    }
  }
  for (const Verdict& v : verdicts_) {
    const bool want_fail = expected(v);
    if (!v.applicable) {
      ok &= !want_fail;
      std::printf("N/A   %s: %s%s\n", v.name.c_str(), v.detail.c_str(),
                  want_fail ? " (expected to FAIL, but not applicable)" : "");
      continue;
    }
    ok &= v.pass != want_fail;
    std::printf("%s  %s: %s%s\n", v.pass ? "PASS" : "FAIL", v.name.c_str(), v.detail.c_str(),
                want_fail ? (v.pass ? " (expected to FAIL: the handling this scenario switches off "
                                      "was not caught)"
                                    : " (expected: this scenario switches its handling off)")
                          : "");
  }
  std::printf("%s (logs in %s)\n", ok ? "scenario passed" : "scenario FAILED", dir_.c_str());
  std::fflush(stdout);
  return ok;
}

}  // namespace
}  // namespace pacer::chaos

int main(int argc, char** argv) {
  std::string scenario_path, out, bin_dir;
  uint64_t seed = 1;
  CLI::App app{"pacer-chaos: runs a chaos scenario (YAML: the cluster, a timeline of faults, the "
               "invariants) against a local cluster on 127.0.0.1 and reports PASS or FAIL for "
               "each invariant. Scenarios ship in deploy/chaos/.",
               "pacer-chaos"};
  app.add_option("SCENARIO", scenario_path, "The scenario file (YAML)")->required();
  app.add_option("--out", out, "Directory for every process's logs and the journals (default: "
                               "a new one under /tmp)");
  app.add_option("--seed", seed, "Seed of every process's fault decisions")
      ->capture_default_str()
      // Not PACER_SEED: the monitor's --seed seeds the model and the data.
      ->envname("PACER_CHAOS_SEED");
  bool netns = false;
  app.add_flag("--netns", netns,
               "Real-network mode: every process in its own network namespace, joined to the "
               "others only (veth pairs to a bridge in a hub namespace, no link to the host's, "
               "no default route), partitions made with iptables. Needs root and iptables; "
               "without them the run is skipped with exit code 77");
  app.add_option("--bin-dir", bin_dir, "Where pacer-monitor, pacer-server, pacer-worker and "
                                       "pacerctl are (default: next to pacer-chaos, or the build "
                                       "tree's folders)");
  if (auto rc = pacer::ParseFlags(app, argc, argv)) return *rc;
  pacer::SetupLogging("chaos", "info");
  std::ifstream in(scenario_path);
  if (!in) {
    std::fprintf(stderr, "pacer-chaos: cannot read %s\n", scenario_path.c_str());
    return pacer::kExitUsage;
  }
  std::stringstream text;
  text << in.rdbuf();
  auto s = pacer::chaos::ParseScenario(text.str());
  if (!s.ok()) {
    std::fprintf(stderr, "pacer-chaos: %s: %s\n", scenario_path.c_str(),
                 std::string(s.status().message()).c_str());
    return pacer::kExitUsage;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return pacer::kExitFailure;
  self[n] = '\0';
  if (bin_dir.empty()) bin_dir = std::filesystem::path(self).parent_path().string();
  if (out.empty()) {
    char tmpl[] = "/tmp/pacer-chaos.XXXXXX";
    out = mkdtemp(tmpl);
  }
  std::signal(SIGINT, [](int) { pacer::chaos::g_interrupted = true; });
  std::signal(SIGTERM, [](int) { pacer::chaos::g_interrupted = true; });
  try {
    pacer::chaos::Runner runner(*s, out, bin_dir, seed, netns);
    return runner.Run();  // its destructor kills what it started, then the namespaces go
  } catch (const pacer::chaos::Interrupted&) {
    std::fprintf(stderr, "pacer-chaos: interrupted; processes stopped (logs in %s)\n", out.c_str());
    return pacer::kExitFailure;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pacer-chaos: %s; processes stopped (logs in %s)\n", e.what(), out.c_str());
    return pacer::kExitFailure;
  }
}
