// Starts a local Pacer cluster of real processes on 127.0.0.1 for tests.
#ifndef PACER_TESTS_CLUSTER_HARNESS_H_
#define PACER_TESTS_CLUSTER_HARNESS_H_

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/process_util.h"

namespace pacer::test {

struct ClusterSpec {
  int shards = 2;
  int workers = 3;
  std::vector<std::string> monitor_flags;
  std::vector<std::string> shard_flags;
  std::vector<std::string> worker_flags;
  // Extra flags for the i-th worker started (from 0).
  std::map<size_t, std::vector<std::string>> worker_flags_by_index;
  // Workers the test runs itself (in process): the monitor waits for them too.
  int embedded_workers = 0;
  // Give shard i --data-dir DIR/shard<i>, so that it checkpoints.
  bool shard_data_dirs = false;
  // Give the monitor --data-dir DIR/monitor, so that it keeps its state.
  bool monitor_data_dir = false;
};

class Cluster {
 public:
  explicit Cluster(const ClusterSpec& spec) : spec_(spec) {}

  // Starts the monitor and shards and waits for their addresses; then the
  // workers. Returns false (with a gtest failure) when something is missing.
  bool Start() {
    if (!StartMonitor("tcp://127.0.0.1:0")) return false;
    for (int i = 0; i < spec_.shards; ++i) {
      shards.emplace_back();
      shard_metrics.emplace_back();
      shard_addresses.emplace_back();
      if (!StartShard(static_cast<size_t>(i))) return false;
    }
    for (int i = 0; i < spec_.workers; ++i) StartWorker();
    return true;
  }

  // (Re)starts the monitor on `listen` (its old address, to come back where
  // everyone expects it; or port 0 for a new one).
  bool StartMonitor(const std::string& listen) {
    std::vector<std::string> m = {PACER_MONITOR_BIN, "--listen", listen, "--metrics-addr",
                                  "127.0.0.1:0", "--min-shards", std::to_string(spec_.shards),
                                  "--min-workers",
                                  std::to_string(spec_.workers + spec_.embedded_workers)};
    if (spec_.monitor_data_dir) m.insert(m.end(), {"--data-dir", dir.path() + "/monitor"});
    m.insert(m.end(), spec_.monitor_flags.begin(), spec_.monitor_flags.end());
    monitor = Process::Start(m, dir.path(), monitor ? "monitor-restarted" : "monitor");
    auto addr = monitor->WaitForLine("listening ", std::chrono::seconds(10));
    auto metrics = monitor->WaitForLine("metrics ", std::chrono::seconds(10));
    if (!addr || !metrics) {
      ADD_FAILURE() << "monitor did not start: " << monitor->Stderr();
      return false;
    }
    monitor_address = *addr;
    monitor_metrics = *metrics;
    return true;
  }

  // Starts one more shard (it registers idle once the map is built).
  bool AddShard() {
    shards.emplace_back();
    shard_metrics.emplace_back();
    shard_addresses.emplace_back();
    return StartShard(shards.size() - 1);
  }

  // (Re)starts shard i on a fresh port; after a kill -9 with data
  // directories it comes back from its checkpoint.
  bool StartShard(size_t i) {
    std::vector<std::string> s = {PACER_SERVER_BIN, "--listen", "tcp://127.0.0.1:0",
                                  "--monitor", monitor_address, "--metrics-addr", "127.0.0.1:0"};
    if (spec_.shard_data_dirs) {
      s.insert(s.end(), {"--data-dir", dir.path() + "/shard" + std::to_string(i)});
    }
    s.insert(s.end(), spec_.shard_flags.begin(), spec_.shard_flags.end());
    const std::string name = "shard" + std::to_string(i) + (shards[i] ? "-restarted" : "");
    shards[i] = Process::Start(s, dir.path(), name);
    auto sm = shards[i]->WaitForLine("metrics ", std::chrono::seconds(10));
    auto sa = shards[i]->WaitForLine("listening ", std::chrono::seconds(10));
    if (!sm || !sa) {
      ADD_FAILURE() << "shard " << i << " did not start: " << shards[i]->Stderr();
      return false;
    }
    shard_metrics[i] = *sm;
    shard_addresses[i] = *sa;
    return true;
  }

  void StartWorker() {
    std::vector<std::string> w = {PACER_WORKER_BIN, "--monitor", monitor_address, "--progress",
                                  "plain"};
    w.insert(w.end(), spec_.worker_flags.begin(), spec_.worker_flags.end());
    auto extra = spec_.worker_flags_by_index.find(workers.size());
    if (extra != spec_.worker_flags_by_index.end()) {
      w.insert(w.end(), extra->second.begin(), extra->second.end());
    }
    // "{dir}" in a flag is the cluster's directory, "{n}" the worker's number.
    for (auto& arg : w) {
      for (const auto& [key, value] : {std::pair<std::string, std::string>{"{dir}", dir.path()},
                                       {"{n}", std::to_string(started_workers_)}}) {
        for (size_t at = arg.find(key); at != std::string::npos; at = arg.find(key)) {
          arg.replace(at, key.size(), value);
        }
      }
    }
    workers.push_back(Process::Start(w, dir.path(), "worker" + std::to_string(started_workers_)));
    ++started_workers_;
  }

  // Everything each process wrote, for failure messages.
  std::string Logs() const {
    std::string s = "--- monitor\n" + monitor->Stdout() + monitor->Stderr();
    for (const auto& p : shards) s += "--- " + p->name() + "\n" + p->Stderr();
    for (const auto& p : workers) s += "--- " + p->name() + "\n" + p->Stderr();
    return s;
  }

  TempDir dir;
  std::unique_ptr<Process> monitor;
  std::vector<std::unique_ptr<Process>> shards;
  std::vector<std::unique_ptr<Process>> workers;
  std::string monitor_address, monitor_metrics;
  std::vector<std::string> shard_addresses, shard_metrics;

 private:
  ClusterSpec spec_;
  size_t started_workers_ = 0;
};

}  // namespace pacer::test

#endif  // PACER_TESTS_CLUSTER_HARNESS_H_
