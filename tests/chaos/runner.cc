#include "tests/chaos/runner.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "ps/base/cli.h"
#include "ps/base/fault.h"
#include "ps/base/rpc.h"
#include "ps/base/scrape.h"
#include "spdlog/spdlog.h"

namespace pacer::chaos {

std::atomic<bool> g_interrupted{false};

std::unique_ptr<Proc> Proc::Start(const std::vector<std::string>& argv, const std::string& dir,
                                  const std::string& name, const std::string& netns) {
  test::ProcessOptions o;
  o.netns = netns;
  o.stderr_suffix = ".log";
  o.own_group = true;  // a Ctrl-C reaches the runner, which stops them all
  auto p = std::unique_ptr<Proc>(new Proc());
  p->process_ = test::Process::Start(argv, dir, name, o);
  return p;
}

Runner::~Runner() {
  for (auto& t : slowers_) {
    if (t.joinable()) t.join();
  }
}

int Runner::Run() {
  if (int rc = PrepareOutDir(); rc != kExitOk) return rc;
  spdlog::info("scenario {}: {} (seed {}; logs in {})", s_.name, s_.description, seed_, dir_);
  if (netns_) {
    if (auto skip = SetUpNetns()) return *skip;
  }
  if (int rc = StartCluster(); rc != kExitOk) return rc;
  if (int rc = WaitForTraining(); rc != kExitOk) return rc;
  PlayTimeline();
  if (s_.invariants.final_accuracy > 0) EvaluateModel();
  end_of_run_ = UnixSeconds();
  hung_ = WaitForEveryoneToLeave();
  CheckInvariants();
  return Report() ? kExitOk : kExitFailure;
}

int Runner::PrepareOutDir() {
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
  return kExitOk;
}

std::optional<int> Runner::SetUpNetns() {
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
  return std::nullopt;
}

int Runner::StartCluster() {
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
  return kExitOk;
}

int Runner::WaitForTraining() {
  // Training starts: every worker has an acknowledged push.
  const auto give_up = clock_->Now() + std::chrono::seconds(60);
  for (;;) {
    bool all = true;
    for (size_t i = 0; i < workers_.size(); ++i) all &= !Acks(i).empty();
    if (all) break;
    if (g_interrupted) throw Interrupted{};
    if (clock_->Now() > give_up) {
      std::fprintf(stderr, "pacer-chaos: training did not start in 60 s (see %s)\n", dir_.c_str());
      return kExitFailure;
    }
    Pause(Millis(100));
  }
  t0_ = UnixSeconds();
  t0_at_ = clock_->Now();
  heals_.push_back(t0_);
  // Ids, for fault targets: shards registered in order; workers print theirs.
  std::string status;
  for (Proc* w : workers_)
    worker_ids_.push_back(std::stoul(w->WaitLine("worker id ", Millis(1000)).value_or("0")));
  Ctl({"status", "-o", "json"}, &status);
  const auto j = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    for (const auto& sh : j.value("shards", nlohmann::json::array())) {
      shard_ids_.push_back(sh.value("id", 0u));
    }
  }
  std::sort(shard_ids_.begin(), shard_ids_.end());  // registration order
  return kExitOk;
}

void Runner::PlayTimeline() {
  for (const Action& a : s_.timeline) {
    ScrapeUntil(t0_at_ + FromSeconds(a.at));
    if (!Do(a)) {
      verdicts_.push_back({"timeline", "timeline", false, "could not " + a.what + " " + a.target});
    }
  }
  // Until 4 s before the end: scrape; then take the model and let it stop.
  while (clock_->Now() < t0_at_ + FromSeconds(s_.seconds - 4) && monitor_->Running()) {
    ScrapeUntil(clock_->Now() + Millis(250));
  }
  if (lab_ != nullptr) LiftPartitions(/*all=*/true);
  Scrape();
}

void Runner::EvaluateModel() {
  std::string out;
  if (Ctl({"export-model", dir_ + "/final.model"}, &out) == 0) {
    auto eval = Proc::Start({Bin("pacer-worker"), "--evaluate-model", dir_ + "/final.model"}, dir_,
                            "evaluate", Ns("ctl"));
    eval->Wait(Millis(60000));
    if (auto acc = eval->WaitLine("test accuracy: ", Millis(100))) accuracy_ = std::stod(*acc);
  }
}

std::vector<std::string> Runner::WaitForEveryoneToLeave() {
  // The job stops at its time cap: everyone must leave by themselves.
  monitor_->Wait(std::chrono::duration_cast<Millis>(t0_at_ + FromSeconds(s_.seconds + 30) -
                                                    clock_->Now()));
  std::vector<std::string> hung;
  const auto leave_by = clock_->Now() + std::chrono::seconds(20);
  for (Proc* p : All()) {
    if (p->name().rfind("pacerctl", 0) == 0 || p->name() == "evaluate") continue;
    if (p->stopped) continue;  // frozen by the timeline until the end
    const auto left = std::chrono::duration_cast<Millis>(leave_by - clock_->Now());
    if (!p->Wait(std::max(left, Millis(0))) && !p->killed_on_purpose) {
      p->hung = true;
      hung.push_back(p->name());
    }
  }
  for (auto& t : slowers_) t.join();
  for (Proc* p : All()) p->Signal(SIGKILL);
  return hung;
}

std::string Runner::Bin(const std::string& name) const {
  // Installed: all in one folder. The build tree: pacer-chaos in
  // tests/chaos/, the others in their planes' folders.
  for (const std::string& d :
       {bin_, bin_ + "/../../ps", bin_ + "/../../monitor", bin_ + "/../../worker"}) {
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
  const TimePoint now_at = clock_->Now();
  const double now = UnixSeconds();
  for (auto it = lifts_.begin(); it != lifts_.end();) {
    if (!all && it->first > now_at) {
      ++it;
      continue;
    }
    if (auto st = lab_->Cut(it->second, false); !st.ok())
      spdlog::error("--netns: {}", ErrorText(st));
    spdlog::info("t+{:.1f}s: --netns: {} let back", now - t0_, it->second);
    for (Proc* p : All()) {
      if (p->name() == it->second || p->name() == it->second + "-restarted") p->cut_off = false;
    }
    heals_.push_back(now);  // when it really ended (a blocking action may delay it)
    it = lifts_.erase(it);
  }
}

void Runner::ScrapeUntil(TimePoint until) {
  while (clock_->Now() < until) {
    if (g_interrupted) throw Interrupted{};
    if (lab_ != nullptr) LiftPartitions();
    Scrape();
    Pause(Millis(250));
  }
}

bool Runner::StartMonitor(const std::string& listen) {
  std::vector<std::string> a = {Bin("pacer-monitor"),
                                "--listen",
                                listen,
                                "--metrics-addr",
                                Host("monitor") + ":0",
                                "--data-dir",
                                dir_ + "/monitor",
                                "--min-shards",
                                std::to_string(s_.shards),
                                "--min-workers",
                                std::to_string(s_.workers),
                                "--time-cap",
                                std::to_string(s_.seconds),
                                "--target-accuracy",
                                "0",
                                "--eval-interval",
                                "1",
                                "--fault-seed",
                                std::to_string(seed_)};
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
  std::vector<std::string> a = {Bin("pacer-server"),
                                "--listen",
                                "tcp://" + Host(node) + ":0",
                                "--monitor",
                                monitor_address_,
                                "--metrics-addr",
                                Host(node) + ":0",
                                "--data-dir",
                                dir_ + "/shard" + std::to_string(i),
                                "--checkpoint-interval",
                                std::to_string(s_.checkpoint_interval),
                                "--fault-seed",
                                std::to_string(seed_ + 1 + i),
                                "--register-timeout",
                                "60",
                                "--ledger",
                                dir_ + "/shard" + std::to_string(i) + ".ledger"};
  a.insert(a.end(), s_.shard_args.begin(), s_.shard_args.end());
  const bool again = i < shards_.size() && shards_[i] != nullptr;
  procs_.push_back(Proc::Start(a, dir_, node + (again ? "-restarted" : ""), Ns(node)));
  if (i >= shards_.size()) shards_.resize(i + 1, nullptr);
  shards_[i] = procs_.back().get();
  auto m = shards_[i]->WaitLine("metrics ", Millis(10000));
  if (!m) return false;
  shards_[i]->metrics = *m;
  // Registered (and restored, after a restart) once it prints its address.
  auto listening = shards_[i]->WaitLine("listening ", Millis(60000));
  if (!listening) return false;
  shards_[i]->address = *listening;
  return true;
}

bool Runner::StartWorker() {
  const size_t i = workers_.size();
  journals_.push_back(dir_ + "/worker" + std::to_string(i) + ".acks");
  sample_logs_.push_back(dir_ + "/worker" + std::to_string(i) + ".samples");
  std::vector<std::string> a = {Bin("pacer-worker"),
                                "--monitor",
                                monitor_address_,
                                "--ack-log",
                                journals_.back(),
                                "--sample-log",
                                sample_logs_.back(),
                                "--metrics-addr",
                                Host("worker" + std::to_string(i)) + ":0",
                                "--fault-seed",
                                std::to_string(seed_ + 100 + i)};
  a.insert(a.end(), s_.worker_args.begin(), s_.worker_args.end());
  procs_.push_back(
      Proc::Start(a, dir_, "worker" + std::to_string(i), Ns("worker" + std::to_string(i))));
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
    const double at = UnixSeconds();
    const std::string text = FetchMetrics(p->metrics);
    if (text.empty()) continue;
    p->last_scrape_at = at;
    const double done = UnixSeconds();
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
  if (t.rfind("shard:", 0) == 0)
    return "server:" + std::to_string(shard_ids_.at(std::stoul(t.substr(6))));
  if (t.rfind("worker:", 0) == 0)
    return "worker:" + std::to_string(worker_ids_.at(std::stoul(t.substr(7))));
  return t;
}

std::string Runner::Resolve(const std::string& t) {
  if (t.rfind("backup:", 0) != 0) return t;
  if (auto it = resolved_.find(t); it != resolved_.end()) return it->second;
  const std::string shard = ResolveNow(t);
  if (!shard.empty()) resolved_[t] = shard;
  return shard;
}

std::string Runner::ResolveNow(const std::string& t) {
  const size_t i = std::stoul(t.substr(7));
  if (i >= shard_ids_.size()) return "";
  std::string status;
  Ctl({"status", "-o", "json"}, &status);
  const auto j = nlohmann::json::parse(status, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "";
  for (const auto& sh : j.value("shards", nlohmann::json::array())) {
    if (sh.value("id", 0u) != shard_ids_[i]) continue;
    for (const auto& b : sh.value("backups", nlohmann::json::array())) {
      const auto at = std::find(shard_ids_.begin(), shard_ids_.end(), b.get<uint32_t>());
      if (at != shard_ids_.end()) return "shard:" + std::to_string(at - shard_ids_.begin());
    }
  }
  return "";  // the range has no backup now
}

bool Runner::Do(const Action& given) {
  const double now = UnixSeconds();
  Action a = given;
  a.target = Resolve(given.target);
  if (a.target.empty() && !given.target.empty()) {
    spdlog::error("t+{:.1f}s: {} {}: the range has no backup now", now - t0_, a.what, given.target);
    return false;
  }
  spdlog::info("t+{:.1f}s: {} {}{} {}", now - t0_, a.what, a.target,
               a.target == given.target ? "" : " (" + given.target + ")", a.spec);
  if (a.what == "kill" || a.what == "terminate") return DoKill(a, now);
  if (a.what == "restart") return DoRestart(a, now);
  if (a.what == "stop" || a.what == "cont") return DoStopOrCont(a, now);
  if (a.what == "add-worker") return DoAddWorker(now);
  if (a.what == "slow") return DoSlow(a, now);
  if (a.what == "add-shard") return DoAddShard();
  if (a.what == "drain-shard") return DoDrainShard(a);
  if (a.what == "partition" && a.from.empty() && lab_ != nullptr) return DoCut(a);
  if (a.what == "faults" || a.what == "partition") return DoFaults(a, now);
  if (a.what == "clear-faults") return DoClearFaults(now);
  return false;
}

// kill (SIGKILL) or terminate (SIGTERM); a shard's kill bounds what it may lose.
bool Runner::DoKill(const Action& a, double now) {
  Proc* p = Target(a.target);
  if (p == nullptr) return false;
  if (a.target.rfind("shard:", 0) == 0 && a.what == "kill") {
    shard_kills_.push_back({std::stoul(a.target.substr(6)), now});
    // With replicas the monitor fails its range over to a backup (and counts
    // a restart only if it comes back).
    const auto r = std::find(s_.monitor_args.begin(), s_.monitor_args.end(), "--replicas");
    const bool replicated = r != s_.monitor_args.end() && r + 1 != s_.monitor_args.end() &&
                            *(r + 1) != "0";
    expect_monitor_.push_back({replicated ? "pacer_monitor_failovers_total"
                                          : "pacer_monitor_shard_restarts_total",
                               "shard killed"});
  }
  if (a.target.rfind("worker:", 0) == 0 && a.what == "kill") {
    expect_monitor_.push_back({"pacer_monitor_workers_lost_total", "worker killed"});
  }
  p->killed_on_purpose = true;
  p->Signal(a.what == "kill" ? SIGKILL : SIGTERM);
  p->Wait(Millis(10000));
  return true;
}

// restart: the monitor at its old address, or a shard on its data directory.
bool Runner::DoRestart(const Action& a, double now) {
  heals_.push_back(now);
  if (a.target == "monitor") {
    if (monitor_->Running()) return false;
    expect_monitor_.push_back(
        {"pacer_monitor_membership_changes_total{reason=\"restarted\"}", "monitor restarted"});
    return StartMonitor(monitor_address_);
  }
  if (a.target.rfind("shard:", 0) == 0) return StartShard(std::stoul(a.target.substr(6)));
  return false;  // a worker comes back as add-worker
}

// stop (SIGSTOP) or cont (SIGCONT).
bool Runner::DoStopOrCont(const Action& a, double now) {
  Proc* p = Target(a.target);
  if (p == nullptr) return false;
  p->Signal(a.what == "stop" ? SIGSTOP : SIGCONT);
  p->stopped = a.what == "stop";
  if (a.what == "stop") p->lost_on_purpose = true;
  if (a.what == "cont") heals_.push_back(now);
  if (a.what == "stop" && a.target.rfind("worker:", 0) == 0) {
    expect_monitor_.push_back({"pacer_monitor_worker_clock_lag", "worker stopped"});
  }
  return true;
}

// add-worker: one more pacer-worker (also how a killed worker comes back).
bool Runner::DoAddWorker(double now) {
  heals_.push_back(now);
  return StartWorker();
}

// slow: the process runs 1/factor of every 100 ms for `seconds`.
bool Runner::DoSlow(const Action& a, double now) {
  Proc* p = Target(a.target);
  if (p == nullptr || !p->Running()) return false;
  heals_.push_back(now + a.seconds);
  if (a.target.rfind("worker:", 0) == 0) {
    expect_monitor_.push_back({"pacer_monitor_worker_clock_lag", "worker slowed"});
  }
  // Runs 1/factor of every 100 ms: a process on a starved CPU.
  // (The cycler signals this incarnation only: a restarted process is
  // not slowed; one the timeline stops meanwhile stays stopped.)
  slowers_.emplace_back([p, clock = clock_, factor = a.factor, seconds = a.seconds] {
    const auto period = Millis(100);
    const auto run = std::chrono::duration_cast<Millis>(period / factor);
    const TimePoint until = clock->Now() + FromSeconds(seconds);
    while (clock->Now() < until && !p->gone()) {
      if (!p->stopped) kill(p->pid(), SIGSTOP);
      clock->SleepUntil(clock->Now() + (period - run));
      if (!p->stopped) kill(p->pid(), SIGCONT);
      clock->SleepUntil(clock->Now() + run);
    }
    if (!p->stopped && !p->gone()) kill(p->pid(), SIGCONT);
  });
  return true;
}

// add-shard: a new pacer-server, then pacerctl add-shard.
bool Runner::DoAddShard() {
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
  shards_[i]->counts_from = UnixSeconds();
  heals_.push_back(UnixSeconds());
  return true;
}

// drain-shard: pacerctl drain-shard; its keys and their history move away.
bool Runner::DoDrainShard(const Action& a) {
  Proc* p = Target(a.target);
  if (p == nullptr) return false;
  const size_t i = std::stoul(a.target.substr(6));
  if (i >= shard_ids_.size()) return false;  // an add-shard before it failed
  p->drained = true;
  if (Ctl({"drain-shard", std::to_string(shard_ids_[i])}) != 0) return false;
  heals_.push_back(UnixSeconds());
  return true;
}

// partition with --netns: iptables in the node's namespace.
bool Runner::DoCut(const Action& a) {
  // Real network: the kernel drops every packet to and from the node.
  const std::string node =
      a.target.substr(0, a.target.find(':')) + a.target.substr(a.target.find(':') + 1);
  if (auto st = lab_->Cut(node, true); !st.ok()) {
    spdlog::error("--netns: {}", ErrorText(st));
    return false;
  }
  if (Proc* p = Target(a.target)) {
    p->cut_off = true;
    p->lost_on_purpose = true;
  }
  lifts_.push_back({clock_->Now() + FromSeconds(a.seconds), node});
  if (a.target.rfind("worker:", 0) == 0) {
    expect_monitor_.push_back(
        {"pacer_monitor_workers_lost_total", "worker partitioned (iptables)"});
  }
  return true;
}

// faults (pacerctl fault set), or partition by the fault layer.
bool Runner::DoFaults(const Action& a, double now) {
  Injected inj;
  inj.what = a.what + " " + a.target;
  std::string target = a.target;
  if (a.what == "partition" && a.target.rfind("worker:", 0) == 0) {
    if (Proc* p = Target(a.target)) p->lost_on_purpose = true;
  }
  // "{shard:I}" in a spec is shard I's id (e.g. peers={shard:0}: messages
  // that shard sends).
  auto expanded = ExpandShardRefs(a.spec, [&](const std::string& ref) -> std::optional<std::string> {
    const std::string id = ref.rfind("shard:", 0) == 0 ? FaultTarget(ref) : "";
    if (id.rfind("server:", 0) != 0) return std::nullopt;
    return id.substr(7);
  });
  if (!expanded.ok()) {
    spdlog::error("chaos: fault spec '{}': {} (names no running shard)", a.spec,
                  std::string(expanded.status().message()));
    return false;
  }
  std::string spec = *expanded;
  if (a.what == "partition" && a.from == "monitor") {
    // Cut off from the monitor only: the target drops what the monitor
    // sends (set first: it hears of its rule in a heartbeat reply), then
    // the monitor the target's heartbeats (all it sends the monitor unasked;
    // the rest are replies to what it no longer hears). Not every message
    // with the target's id: a range keeps its id when a backup is promoted
    // to serve it, so the new primary's replies carry it too. Everyone else
    // still reaches the target.
    inj.what = a.what + " " + a.target + " from the monitor";
    inj.kinds = {"partition"};
    inj.procs = {Target(target), monitor_};
    injected_.push_back(inj);
    constexpr double kHeard = 0.5;  // a heartbeat reply reaches the target meanwhile
    heals_.push_back(now + kHeard + a.seconds);
    const std::string id = FaultTarget(target).substr(FaultTarget(target).find(':') + 1);
    if (Ctl({"fault", "set", FaultTarget(target),
             fmt::format("partition:peers=0,for={:.3f}", a.seconds + kHeard)}) != 0) {
      return false;
    }
    Pause(FromSeconds(kHeard));
    return Ctl({"fault", "set", "monitor",
                fmt::format("partition:peers={},type=Heartbeat,for={:.3f}", id, a.seconds)}) == 0;
  }
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
    for (Proc* p : target == "server"   ? shards_
                   : target == "worker" ? workers_
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

// clear-faults: pacerctl fault clear.
bool Runner::DoClearFaults(double now) {
  heals_.push_back(now);
  return Ctl({"fault", "clear"}) == 0;
}

std::vector<Ack> Runner::Acks(size_t worker, uint64_t* durable) const {
  std::vector<Ack> acks;
  std::ifstream in(journals_[worker]);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ls(line);
    if (line.rfind("durable ", 0) == 0) {
      std::string word;
      double at = 0;
      uint64_t seq = 0;
      if (durable != nullptr && ls >> word >> at >> seq) *durable = std::max(*durable, seq);
      continue;
    }
    Ack a{};
    if (!(ls >> a.at >> a.seq >> a.clock >> a.samples)) continue;
    // "RANGE:EPOCH" per shard that acknowledged it (replicated jobs).
    for (std::string word; ls >> word;) {
      // A line cut short (the worker killed mid-write) reads no further.
      unsigned range = 0;
      unsigned long long epoch = 0;
      if (std::sscanf(word.c_str(), "%u:%llu", &range, &epoch) != 2) break;
      a.epochs.emplace_back(range, epoch);
    }
    acks.push_back(std::move(a));
  }
  return acks;
}

std::vector<LedgerBlock> Runner::Ledgers() const {
  // Each shard's --ledger file (shardI.ledger), written as it left: a block
  // per range, "range R role ROLE epoch E record N last L crc C pushes P
  // doubles D", then "worker W: A-B C ..." lines.
  std::vector<LedgerBlock> blocks;
  for (size_t i = 0; i < shards_.size(); ++i) {
    std::ifstream in(dir_ + "/shard" + std::to_string(i) + ".ledger");
    std::map<uint32_t, std::vector<msg::SeqSpan>> spans;
    const auto close = [&] {
      if (blocks.empty() || blocks.back().shard != i) return;
      std::vector<msg::SeqSpan> all;
      for (auto& [w, v] : spans) all.insert(all.end(), v.begin(), v.end());
      blocks.back().ledger.Assign(all, blocks.back().doubles);
      spans.clear();
    };
    for (std::string line; std::getline(in, line);) {
      std::istringstream ls(line);
      std::string word;
      if (line.rfind("range ", 0) == 0) {
        close();
        LedgerBlock b;
        b.shard = i;
        std::string role, crc;
        int last = 0;
        ls >> word >> b.range >> word >> role >> word >> b.epoch >> word >> b.record >> word >>
            last >> word >> crc >> word >> b.pushes >> word >> b.doubles;
        b.primary = role == "primary";
        b.deposed = role == "deposed";
        b.last = last != 0;
        b.crc = crc;
        blocks.push_back(std::move(b));
      } else if (line.rfind("worker ", 0) == 0 && !blocks.empty() && blocks.back().shard == i) {
        uint32_t worker = 0;
        char colon = 0;
        ls >> word >> worker >> colon;
        for (std::string span; ls >> span;) {
          const size_t dash = span.find('-');
          const uint64_t first = std::stoull(span.substr(0, dash));
          const uint64_t last = dash == std::string::npos ? first : std::stoull(span.substr(dash + 1));
          spans[worker].push_back({worker, first, last});
        }
      }
    }
    close();
  }
  return blocks;
}

}  // namespace pacer::chaos
