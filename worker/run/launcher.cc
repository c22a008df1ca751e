#include "worker/run/launcher.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>

#include "ps/base/process.h"

namespace pacer::run {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{50};
constexpr size_t kLastLines = 15;  // shown when a process fails

void Nap() { Clock::Real()->SleepUntil(Clock::Real()->Now() + kPoll); }

// One file a child writes, read as it grows: whole lines only.
class Tail {
 public:
  explicit Tail(std::string path) : path_(std::move(path)) {}
  // The lines completed since the last call (at the end, `flush` also hands
  // over a last line without its newline).
  std::vector<std::string> Read(bool flush = false) {
    std::vector<std::string> lines;
    std::error_code ec;
    if (const auto size = fs::file_size(path_, ec); !ec && size < offset_) {
      offset_ = 0;  // truncated: read it again from its start
      partial_.clear();
    }
    std::ifstream in(path_, std::ios::binary);
    if (in) {
      in.seekg(static_cast<std::streamoff>(offset_));
      std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      offset_ += chunk.size();
      partial_ += chunk;
    }
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(partial_.substr(start, nl - start));
    }
    partial_.erase(0, start);
    if (flush && !partial_.empty()) lines.push_back(std::exchange(partial_, ""));
    for (const auto& l : lines) {
      last_.push_back(l);
      if (last_.size() > kLastLines) last_.pop_front();
    }
    return lines;
  }
  const std::deque<std::string>& last() const { return last_; }

 private:
  std::string path_;
  uint64_t offset_ = 0;
  std::string partial_;
  std::deque<std::string> last_;
};

enum class Kind { kMonitor, kShard, kWorker };

struct Child {
  Kind kind;
  std::string label;   // shown in front of its lines
  std::unique_ptr<Process> process;
  std::unique_ptr<Tail> out, err;
  std::optional<int> exit_code;  // once reaped
  bool reported = false;         // its exit was told
  std::string summary;           // a worker's "worker summary:" line, without the words
};

const char* KindName(Kind k) {
  return k == Kind::kMonitor ? "monitor" : k == Kind::kShard ? "shard" : "worker";
}

class Launcher {
 public:
  Launcher(const LaunchOptions& o, const std::atomic<bool>& interrupt)
      : o_(o), interrupt_(interrupt) {}
  int Run();

 private:
  bool Prepare();
  std::string Program(const std::string& name) const;
  Child* Start(Kind kind, uint32_t index, std::vector<std::string> argv,
               std::vector<std::string> env);
  // Waits for the child's "listening ADDRESS" line; "" when it exits first,
  // times out, or the launcher is interrupted.
  std::string AddressOf(Child* c);
  void Pump(bool flush = false);
  void Show(Child& c, const std::string& line, bool err);
  // Reaps whatever exited (Child::exit_code).
  void Reap();
  void ShowLast(const Child& c, const std::string& why);
  // Stops every child still running, each with its process group: workers
  // first (SIGTERM: they leave the job), then the monitor (it stops the
  // job), then the shards; SIGKILL to what is left after the grace. Never
  // signals a process it did not start.
  void StopAll();
  bool AnyRunning(std::optional<Kind> kind = std::nullopt);
  bool loopback() const { return o_.host == "127.0.0.1" || o_.host == "localhost"; }
  void Say(const std::string& line) { std::fprintf(stderr, "[pacer-run] %s\n", line.c_str()); }
  void PrintTable();

  const LaunchOptions& o_;
  const std::atomic<bool>& interrupt_;
  std::string dir_;
  bool temp_dir_ = false;
  std::string monitor_address_;
  std::vector<std::unique_ptr<Child>> children_;
  // The monitor's lines the end-of-run summary repeats.
  std::vector<std::string> monitor_results_;
  std::vector<std::string> epochs_;  // the monitor's "epoch N done" lines
};

bool Launcher::Prepare() {
  if (!o_.out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(o_.out_dir, ec);
    if (ec) {
      Say("cannot make " + o_.out_dir + ": " + ec.message());
      return false;
    }
    dir_ = o_.out_dir;
  } else {
    std::string tmpl = (fs::temp_directory_path() / "pacer-run.XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      Say("cannot make a temporary folder");
      return false;
    }
    dir_ = tmpl;
    temp_dir_ = true;
  }
  return true;
}

std::string Launcher::Program(const std::string& name) const {
  const std::string subdir = name == "pacer-monitor" ? "monitor" : name == "pacer-server" ? "ps"
                                                                                          : "worker";
  std::vector<fs::path> dirs;
  if (!o_.bin_dir.empty()) dirs.push_back(o_.bin_dir);
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back(self.parent_path());  // installed: /usr/bin; build/worker: pacer-worker
    dirs.push_back(self.parent_path().parent_path() / subdir);  // build/monitor, build/ps
  }
  for (const fs::path& d : dirs) {
    const fs::path p = d / name;
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "";
}

Child* Launcher::Start(Kind kind, uint32_t index, std::vector<std::string> argv,
                       std::vector<std::string> env) {
  auto c = std::make_unique<Child>();
  c->kind = kind;
  c->label = kind == Kind::kMonitor ? "monitor" : std::string(KindName(kind)) + " #" + std::to_string(index);
  const std::string name = kind == Kind::kMonitor ? "monitor" : KindName(kind) + std::to_string(index);
  // A folder used before holds the last run's files: they must not be read
  // as this run's (its "listening" line would be another run's port).
  for (const char* ext : {".out", ".log"}) {
    std::error_code ec;
    fs::remove(fs::path(dir_) / (name + ext), ec);
  }
  ProcessOptions po;
  po.own_group = true;       // a Ctrl-C reaches the launcher, which stops them in order
  po.kill_group_on_exit = true;  // what a process leaves behind in its group goes with it
  po.die_with_parent = true;  // and nothing outlives a launcher that was killed
  po.search_path = argv[0].find('/') == std::string::npos;
  po.stderr_suffix = ".log";
  po.env = std::move(env);
  c->process = Process::Start(argv, dir_, name, po);
  c->out = std::make_unique<Tail>(c->process->stdout_path());
  c->err = std::make_unique<Tail>(c->process->stderr_path());
  children_.push_back(std::move(c));
  return children_.back().get();
}

void Launcher::Show(Child& c, const std::string& line, bool err) {
  static const std::regex worker_re("worker ([0-9]+): registered as rank ([0-9]+)");
  static const std::regex shard_re("shard ([0-9]+): registered with");
  std::smatch m;
  if (c.kind == Kind::kWorker && std::regex_search(line, m, worker_re)) {
    c.label = "worker " + m[1].str() + " rank " + m[2].str();
  } else if (c.kind == Kind::kShard && std::regex_search(line, m, shard_re)) {
    c.label = "shard " + m[1].str();
  }
  // pacer-worker's on stdout, pacer.torch's on stderr ("pacer.torch: worker summary: ...").
  if (auto at = line.find("worker summary: "); c.kind == Kind::kWorker && at != std::string::npos) {
    c.summary = line.substr(at + 16);
  }
  // The data stream's epochs, as the monitor logs them ("... [monitor] epoch 3 done at ...").
  if (auto at = line.find("] epoch "); c.kind == Kind::kMonitor && err &&
      at != std::string::npos && line.find(" done at ", at) != std::string::npos) {
    epochs_.push_back(line.substr(at + 2));
  }
  if (c.kind == Kind::kMonitor && !err &&
      (line.rfind("final test accuracy: ", 0) == 0 || line.rfind("time to ", 0) == 0 ||
       line.rfind("stop reason: ", 0) == 0 || line.find(" policy: ") != std::string::npos)) {
    monitor_results_.push_back(line);
  }
  if (loopback() && line.find("transport security is off") != std::string::npos) {
    return;  // said once, at start, for the whole job on this machine
  }
  if (!o_.show_output) return;
  std::fprintf(err ? stderr : stdout, "[%s] %s\n", c.label.c_str(), line.c_str());
}

void Launcher::Pump(bool flush) {
  for (auto& c : children_) {
    for (const std::string& l : c->out->Read(flush)) Show(*c, l, false);
    for (const std::string& l : c->err->Read(flush)) Show(*c, l, true);
  }
  std::fflush(stdout);
  std::fflush(stderr);
}

void Launcher::Reap() {
  for (auto& c : children_) {
    if (!c->exit_code) c->exit_code = c->process->Wait(milliseconds(0));
  }
}

bool Launcher::AnyRunning(std::optional<Kind> kind) {
  Reap();
  return std::any_of(children_.begin(), children_.end(), [&](const auto& c) {
    return !c->exit_code && (!kind || c->kind == *kind);
  });
}

void Launcher::ShowLast(const Child& c, const std::string& why) {
  Say(c.label + " " + why + "; its last lines (" + dir_ + "):");
  std::vector<std::string> lines(c.out->last().begin(), c.out->last().end());
  lines.insert(lines.end(), c.err->last().begin(), c.err->last().end());
  if (lines.empty()) Say("  (none)");
  for (const auto& l : lines) Say("  " + l);
}

std::string Launcher::AddressOf(Child* c) {
  const TimePoint deadline = Clock::Real()->Now() + o_.start_timeout;
  for (;;) {
    Pump();
    for (const std::string& l : c->out->last()) {
      if (l.rfind("listening ", 0) == 0) return l.substr(10);
    }
    Reap();
    if (c->exit_code) {
      Pump(true);
      ShowLast(*c, "exited with code " + std::to_string(*c->exit_code) + " before it listened");
      c->reported = true;
      return "";
    }
    if (interrupt_.load()) return "";
    if (Clock::Real()->Now() >= deadline) {
      ShowLast(*c, "printed no 'listening' line in time");
      return "";
    }
    Nap();
  }
}

void Launcher::StopAll() {
  const Kind order[] = {Kind::kWorker, Kind::kMonitor, Kind::kShard};
  for (Kind k : order) {
    if (!AnyRunning(k)) continue;
    for (auto& c : children_) {
      if (c->kind == k && !c->exit_code) c->process->SignalGroup(SIGTERM);
    }
    const TimePoint deadline = Clock::Real()->Now() + o_.grace;
    while (AnyRunning(k) && Clock::Real()->Now() < deadline) {
      Pump();
      Nap();
    }
  }
  for (auto& c : children_) {
    if (!c->exit_code) {
      Say(c->label + " did not stop within " +
          std::to_string(std::chrono::duration_cast<milliseconds>(o_.grace).count() / 1000.0) +
          " s of SIGTERM: killed");
      c->process->SignalGroup(SIGKILL);
      c->exit_code = c->process->Wait(milliseconds(5000));
      c->reported = true;
    }
  }
  Pump(true);
}

void Launcher::PrintTable() {
  if (std::none_of(children_.begin(), children_.end(),
                   [](const auto& c) { return c->kind == Kind::kWorker; })) {
    return;
  }
  // B, as the monitor last had it ("... of B = 192" in its policy line).
  double global_batch = 0;
  static const std::regex b_re(" of B = ([0-9]+)");
  for (const auto& line : monitor_results_) {
    if (std::smatch m; std::regex_search(line, m, b_re)) global_batch = std::stod(m[1].str());
  }
  std::vector<std::map<std::string, double>> figures(children_.size());
  double total = 0;
  for (size_t i = 0; i < children_.size(); ++i) {
    std::istringstream in(children_[i]->summary);
    for (std::string kv; in >> kv;) {
      if (auto eq = kv.find('='); eq != std::string::npos) {
        figures[i][kv.substr(0, eq)] = std::strtod(kv.c_str() + eq + 1, nullptr);
      }
    }
    if (children_[i]->kind == Kind::kWorker) total += figures[i]["samples"];
  }
  std::fprintf(stderr, "[pacer-run] %-18s %4s %10s %10s %10s %8s %8s %8s %8s\n", "worker", "exit",
               "mean batch", "share of B", "samples", "share", "compute", "comm", "wait");
  for (size_t i = 0; i < children_.size(); ++i) {
    const Child& c = *children_[i];
    if (c.kind != Kind::kWorker) continue;
    const std::string code = c.exit_code ? std::to_string(*c.exit_code) : "-";
    if (c.summary.empty()) {
      std::fprintf(stderr, "[pacer-run] %-18s %4s %10s\n", c.label.c_str(), code.c_str(),
                   "(no summary: it printed no 'worker summary:' line)");
      continue;
    }
    auto& v = figures[i];
    const double t = v["seconds"] > 0 ? v["seconds"] : 1;
    const double mean = v["clocks"] > 0 ? v["samples"] / v["clocks"] : 0;
    std::fprintf(stderr,
                 "[pacer-run] %-18s %4s %10.1f %9.0f%% %10.0f %7.1f%% %7.0f%% %7.0f%% %7.0f%%\n",
                 c.label.c_str(), code.c_str(), mean,
                 global_batch > 0 ? 100 * mean / global_batch : 0.0, v["samples"],
                 total > 0 ? 100 * v["samples"] / total : 0.0, 100 * v["compute_s"] / t,
                 100 * v["communication_s"] / t, 100 * v["wait_s"] / t);
  }
}

int Launcher::Run() {
  if (!Prepare()) return 1;
  int code = 0;
  auto finish = [&](int rc) {
    StopAll();
    constexpr size_t kEpochsShown = 5;
    if (epochs_.size() > kEpochsShown) {
      Say("(" + std::to_string(epochs_.size() - kEpochsShown) + " earlier epochs: monitor.log)");
    }
    for (size_t i = epochs_.size() > kEpochsShown ? epochs_.size() - kEpochsShown : 0;
         i < epochs_.size(); ++i) {
      Say(epochs_[i]);
    }
    for (const auto& line : monitor_results_) Say(line);
    PrintTable();
    if (temp_dir_ && rc == 0) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    } else {
      Say("logs: " + dir_);
    }
    return rc;
  };

  if (o_.role != Role::kJoin) {
    const std::string monitor = Program("pacer-monitor"), server = Program("pacer-server");
    if (monitor.empty() || server.empty()) {
      Say("pacer-monitor or pacer-server not found beside pacer-run (build them, or give "
          "--bin-dir)");
      return finish(1);
    }
    Say(std::to_string(o_.shards) + " shard(s), " + std::to_string(o_.workers) + " worker(s)" +
        (o_.role == Role::kServe ? " to join" : "") + "; logs in " + dir_);
    if (loopback()) {
      Say("plain ZeroMQ on 127.0.0.1: fine on one machine; between machines use CURVE keys "
          "(--monitor-args and --shard-args with --key/--allowed-keys, deploy/README.md)");
    }
    std::vector<std::string> argv = {monitor, "--listen", "tcp://" + o_.host + ":0",
                                     "--min-shards", std::to_string(o_.shards),
                                     "--min-workers", std::to_string(o_.workers)};
    argv.insert(argv.end(), o_.job_flags.begin(), o_.job_flags.end());
    argv.insert(argv.end(), o_.monitor_args.begin(), o_.monitor_args.end());
    Child* m = Start(Kind::kMonitor, 0, argv, {});
    monitor_address_ = AddressOf(m);
    if (monitor_address_.empty()) return finish(interrupt_.load() ? 130 : 1);
    for (uint32_t i = 0; i < o_.shards; ++i) {
      std::vector<std::string> s = {server, "--listen", "tcp://" + o_.host + ":0", "--monitor",
                                    monitor_address_};
      if (!o_.data_dir.empty()) {
        s.push_back("--data-dir");
        s.push_back(o_.data_dir + "/shard" + std::to_string(i));
      }
      s.insert(s.end(), o_.shard_args.begin(), o_.shard_args.end());
      Child* c = Start(Kind::kShard, i, s, {});
      if (AddressOf(c).empty()) return finish(interrupt_.load() ? 130 : 1);
    }
    if (o_.role == Role::kServe) {
      // The one line a script (or the person starting the other machines) needs.
      std::printf("monitor %s\n", monitor_address_.c_str());
      std::fflush(stdout);
      Say("serving: on each machine of workers, run  pacer-run --join " + monitor_address_ +
          " --workers N -- COMMAND");
    }
  } else {
    monitor_address_ = o_.join;
  }

  if (o_.role != Role::kServe) {
    for (uint32_t i = 0; i < o_.workers; ++i) {
      std::vector<std::string> argv = o_.command;
      // One of Pacer's programs (pacer-worker) is the one beside pacer-run;
      // any other bare name is looked up in PATH (a virtualenv's python3).
      if (argv[0].rfind("pacer-", 0) == 0 && argv[0].find('/') == std::string::npos) {
        if (std::string p = Program(argv[0]); !p.empty()) argv[0] = p;
      }
      if (auto it = o_.worker_args.find(i); it != o_.worker_args.end()) {
        argv.insert(argv.end(), it->second.begin(), it->second.end());
      }
      std::vector<std::string> env = {
          "PACER_MONITOR=" + monitor_address_, "PACER_LOCAL_WORKER=" + std::to_string(i),
          "PACER_LOCAL_WORKERS=" + std::to_string(o_.workers), "PYTHONUNBUFFERED=1"};
      // The job's only workers (not --join, where every machine counts from
      // 0): each asks for its launch index as its rank.
      if (o_.role == Role::kLocal) env.push_back("PACER_RANK=" + std::to_string(i));
      Start(Kind::kWorker, i, argv, std::move(env));
    }
  }

  // Until the job ends: the monitor's exit (local, serve) or every worker's
  // (join); a worker that fails, or an interrupt, stops it early.
  for (;;) {
    Pump();
    if (interrupt_.load()) {
      Say("interrupted: stopping the processes pacer-run started");
      code = 130;
      break;
    }
    Reap();
    bool failed = false;
    for (auto& c : children_) {
      if (!c->exit_code || c->reported) continue;
      c->reported = true;
      if (*c->exit_code == 0) continue;  // a shard leaves with 0 only when told to
      Pump(true);
      ShowLast(*c, "exited with code " + std::to_string(*c->exit_code));
      if (c->kind == Kind::kWorker) failed = true;
    }
    if (failed) {
      Say("a worker failed: stopping the job");
      code = 1;
      break;
    }
    const bool monitor_gone = o_.role != Role::kJoin && !AnyRunning(Kind::kMonitor);
    const bool workers_gone = o_.role != Role::kServe && !AnyRunning(Kind::kWorker);
    if (monitor_gone || workers_gone) {
      if (monitor_gone && children_[0]->exit_code != 0) code = 1;
      // The others leave by themselves once they hear the job is over.
      const TimePoint deadline = Clock::Real()->Now() + o_.grace;
      while (AnyRunning() && Clock::Real()->Now() < deadline && !interrupt_.load()) {
        Pump();
        Nap();
      }
      for (auto& c : children_) {
        if (c->exit_code && *c->exit_code != 0 && !c->reported) {
          c->reported = true;
          ShowLast(*c, "exited with code " + std::to_string(*c->exit_code));
          if (c->kind != Kind::kShard) code = 1;
        }
      }
      if (interrupt_.load()) {
        Say("interrupted: stopping the processes pacer-run started");
        code = 130;
      }
      break;
    }
    Nap();
  }
  return finish(code);
}

}  // namespace

int Launch(const LaunchOptions& options, const std::atomic<bool>& interrupt) {
  return Launcher(options, interrupt).Run();
}

}  // namespace pacer::run
