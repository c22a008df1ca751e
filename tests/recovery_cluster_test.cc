// Crash recovery across real processes (issue 4): a monitor and shards run as
// processes on 127.0.0.1; the workers run inside the test, so that the test
// keeps its own record of every push the shards acknowledged and can hold the
// workers between iterations.
#include <signal.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <map>
#include <regex>
#include <sstream>
#include <thread>

#include "ps/base/clock.h"
#include "ps/base/transport.h"
#include "tests/cluster_harness.h"
#include "worker/worker.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// Holds embedded workers between iterations: open, closed, or a budget of
// iterations each.
class Gate {
 public:
  explicit Gate(size_t workers) : budget_(workers, 0) {}

  // The before_iteration hook of worker `w`.
  void Before(size_t w) {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_ || budget_[w] > 0; });
    --waiting_;
    if (!open_) --budget_[w];
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Lets each worker run `n` more iterations.
  void Grant(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int& b : budget_) b = n;
    cv_.notify_all();
  }
  // Waits until every worker is held at the gate.
  bool WaitAllHeld(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] {
      return waiting_ == budget_.size() &&
             std::all_of(budget_.begin(), budget_.end(), [](int b) { return b == 0; });
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  size_t waiting_ = 0;
  std::vector<int> budget_;
};

// What the test saw acknowledged, per worker.
struct AckRecord {
  std::mutex mu;
  std::vector<uint64_t> acked;      // pushes acknowledged by every shard
  std::vector<uint64_t> last_seq;   // highest acknowledged seq
  std::vector<uint64_t> clock;      // clock of the next iteration
  std::vector<std::vector<uint64_t>> acked_clocks;  // clock of each acknowledged push
  explicit AckRecord(size_t n) : acked(n), last_seq(n), clock(n), acked_clocks(n) {}
  uint64_t Total() {
    std::lock_guard<std::mutex> lock(mu);
    uint64_t t = 0;
    for (uint64_t a : acked) t += a;
    return t;
  }
};

// kill -9 a shard mid-training and restart it on another port with the same
// --data-dir. It reloads its last checkpoint, takes its key range back (the
// workers follow the new shard map), reports as lost exactly the acknowledged
// pushes that the test's own record says the checkpoint lacks (those after
// it, and one left in an open clock), and training goes on to the accuracy
// target.
TEST(RecoveryClusterTest, KilledShardComesBackFromItsCheckpointAndTrainingReachesTarget) {
  constexpr size_t kWorkers = 2;
  constexpr int kAfterCheckpoint = 6;  // iterations each worker runs between checkpoint and kill
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 0;
  spec.embedded_workers = kWorkers;
  spec.shard_data_dirs = true;
  // A checkpoint every 5 s: none falls between the one the test waits for
  // and the kill a fraction of a second later (checked below).
  spec.shard_flags = {"--checkpoint-interval", "5"};
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "128", "--target-accuracy", "0.75",
                        "--time-cap", "150", "--eval-interval", "0.5", "--seed", "3",
                        "--lease", "5"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  TransportOptions topts;
  auto transport = MakeZmqTransport(topts);
  Gate gate(kWorkers);
  AckRecord record(kWorkers);
  std::vector<absl::StatusOr<worker::WorkerResult>> results(kWorkers,
                                                            absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kWorkers; ++i) {
    threads.emplace_back([&, i] {
      worker::WorkerOptions o;
      o.monitor = c.monitor_address;
      o.train_limit = 15000;
      o.test_limit = 2000;
      o.request_timeout = std::chrono::seconds(30);
      o.before_iteration = [&, i](uint64_t clock) {
        {
          std::lock_guard<std::mutex> lock(record.mu);
          record.clock[i] = clock;
        }
        gate.Before(i);
      };
      o.on_push_acked = [&, i](uint64_t seq, uint64_t clock, std::span<const uint32_t>) {
        std::lock_guard<std::mutex> lock(record.mu);
        ++record.acked[i];
        record.last_seq[i] = seq;
        record.acked_clocks[i].push_back(clock);
      };
      worker::Worker w(transport.get(), o);
      results[i] = w.Run();
    });
  }
  struct Joiner {
    Gate& gate;
    std::vector<std::thread>& threads;
    ~Joiner() {
      gate.Open();
      for (auto& t : threads) t.join();
    }
  } joiner{gate, threads};

  // Train to clock 15, then hold both workers.
  auto min_clock = [&] {
    std::lock_guard<std::mutex> lock(record.mu);
    return *std::min_element(record.clock.begin(), record.clock.end());
  };
  const auto deadline = std::chrono::steady_clock::now() + seconds(90);
  while (min_clock() < 15 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(min_clock(), 15u) << c.Logs();
  gate.Close();
  ASSERT_TRUE(gate.WaitAllHeld(std::chrono::milliseconds(30000))) << c.Logs();
  const double held_at = UnixSeconds();

  // Wait for a checkpoint of shard 0 taken after the hold: it has every
  // push acknowledged so far.
  std::string metrics;
  double checkpoints_ok = -1;
  const auto ckpt_deadline = std::chrono::steady_clock::now() + seconds(15);
  while (std::chrono::steady_clock::now() < ckpt_deadline) {
    metrics = FetchMetrics(c.shard_metrics[0]);
    if (MetricValue(metrics, "pacer_shard_checkpoint_last_success_timestamp_seconds").value_or(0) >
        held_at) {
      checkpoints_ok = MetricValue(metrics, "pacer_shard_checkpoints_total", {"result=\"ok\""})
                           .value_or(-1);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(checkpoints_ok, 0) << "no checkpoint after the hold\n" << metrics << c.Logs();
  EXPECT_GE(MetricValue(metrics, "pacer_shard_checkpoint_size_bytes").value_or(0), 1000);
  const uint64_t acked_at_checkpoint = record.Total();
  // BSP: a clock's step is in the parameters once every worker pushed it.
  // The workers may be held a clock apart; the push of the one ahead then
  // sits in an open clock, acknowledged but not in the checkpoint.
  uint64_t closed_at_checkpoint = UINT64_MAX;
  {
    std::lock_guard<std::mutex> lock(record.mu);
    for (const auto& clocks : record.acked_clocks) {
      closed_at_checkpoint = std::min<uint64_t>(closed_at_checkpoint, clocks.back());
    }
  }

  // A few more iterations, acknowledged, then kill -9.
  gate.Grant(kAfterCheckpoint);
  ASSERT_TRUE(gate.WaitAllHeld(std::chrono::milliseconds(30000))) << c.Logs();
  const uint64_t acked_since_checkpoint = record.Total() - acked_at_checkpoint;
  ASSERT_EQ(acked_since_checkpoint, kWorkers * kAfterCheckpoint);
  // What a crash now loses, by the test's own record: every acknowledged
  // push of a clock past the last one closed at the checkpoint.
  uint64_t expected_lost = 0;
  std::string seqs;
  {
    std::lock_guard<std::mutex> lock(record.mu);
    for (size_t i = 0; i < kWorkers; ++i) {
      seqs += ' ';
      seqs += std::to_string(record.last_seq[i]);
      for (uint64_t clock : record.acked_clocks[i]) expected_lost += clock > closed_at_checkpoint;
    }
  }
  // The pushes acknowledged since the checkpoint, plus at most one waiting
  // in an open clock per worker.
  ASSERT_GE(expected_lost, acked_since_checkpoint);
  ASSERT_LE(expected_lost, acked_since_checkpoint + kWorkers);
  metrics = FetchMetrics(c.shard_metrics[0]);
  ASSERT_EQ(MetricValue(metrics, "pacer_shard_checkpoints_total", {"result=\"ok\""}), checkpoints_ok)
      << "a checkpoint fell between the hold and the kill; the expected count is unknown";
  const std::string old_address = c.shard_addresses[0];
  c.shards[0]->Signal(SIGKILL);
  ASSERT_TRUE(c.shards[0]->Wait(seconds(5)).has_value());

  ASSERT_TRUE(c.StartShard(0)) << c.Logs();
  EXPECT_NE(c.shard_addresses[0], old_address);
  gate.Open();

  // Training goes on to the target; the job stops by itself.
  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  const std::string out = c.monitor->Stdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  EXPECT_GE(std::stod(m[1]), 0.75) << c.Logs();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << c.Logs();
  for (auto& t : threads) t.join();
  threads.clear();
  for (size_t i = 0; i < kWorkers; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status() << c.Logs();
  }
  for (auto& s : c.shards) ASSERT_TRUE(s->Wait(seconds(20)).has_value()) << c.Logs();

  // The restarted shard: loaded the checkpoint, and lost exactly what the
  // test saw acknowledged after it.
  const std::string err = c.shards[0]->Stderr();
  EXPECT_NE(err.find("loaded checkpoint of job"), std::string::npos) << err;
  std::smatch lost;
  ASSERT_TRUE(std::regex_search(err, lost, std::regex("([0-9]+) acknowledged push\\(es\\) lost")))
      << err;
  const uint64_t reported = std::stoull(lost[1]);
  EXPECT_EQ(reported, expected_lost) << "last acknowledged seqs at the kill:" << seqs << "\n"
                                     << c.Logs();
  EXPECT_NE(c.monitor->Stderr().find("is back from its checkpoint"), std::string::npos);
  // It went on stepping after the restore.
  std::smatch fin;
  ASSERT_TRUE(std::regex_search(err, fin, std::regex("final: steps ([0-9]+), applied through clock (-?[0-9]+)")))
      << err;
  EXPECT_GT(std::stol(fin[2]), 15 + kAfterCheckpoint);
}

// Polls a shard's applied clock through its /metrics.
double AppliedClock(const std::string& metrics_address) {
  return MetricValue(FetchMetrics(metrics_address), "pacer_shard_applied_clock").value_or(-1);
}

bool WaitForClock(Cluster& c, double target, seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    bool all = true;
    for (const auto& m : c.shard_metrics) all &= AppliedClock(m) >= target;
    if (all) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// kill -9 the monitor mid-run: shards and workers keep training while it is
// down; restarted at the same address on the same --data-dir it resumes the
// job (same workers, same shard map) and stops it at the accuracy target.
TEST(RecoveryClusterTest, MonitorKilledMidRunResumesFromItsState) {
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 2;
  spec.shard_data_dirs = true;
  spec.monitor_data_dir = true;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "128", "--target-accuracy", "0.75",
                        "--time-cap", "150", "--eval-interval", "0.5", "--seed", "5",
                        "--lease", "5"};
  spec.worker_flags = {"--train-limit", "15000", "--test-limit", "2000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 15, seconds(60))) << c.Logs();

  const std::string address = c.monitor_address;
  c.monitor->Signal(SIGKILL);
  ASSERT_TRUE(c.monitor->Wait(seconds(5)).has_value());
  // Training goes on without the monitor.
  const double at_kill = AppliedClock(c.shard_metrics[0]);
  ASSERT_TRUE(WaitForClock(c, at_kill + 10, seconds(20)))
      << "no progress while the monitor was down\n" << c.Logs();

  ASSERT_TRUE(c.StartMonitor(address)) << c.Logs();
  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  const std::string out = c.monitor->Stdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  EXPECT_GE(std::stod(m[1]), 0.75) << c.Logs();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << c.Logs();
  EXPECT_NE(c.monitor->Stderr().find("resumed job"), std::string::npos) << c.Logs();
  // The same two workers, neither declared dead.
  EXPECT_EQ(c.monitor->Stderr().find("missed its lease"), std::string::npos) << c.Logs();
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << w->name() << " did not exit\n" << c.Logs();
    EXPECT_EQ(*rc, 0) << c.Logs();
  }
}

// Stop the whole cluster with SIGTERM mid-run (shards take a final
// checkpoint, the monitor saves its state), then start it all again on the
// same data directories with new workers: training continues from the
// checkpoints, not from scratch.
TEST(RecoveryClusterTest, StoppedClusterResumesFromItsCheckpoints) {
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 2;
  spec.shard_data_dirs = true;
  spec.monitor_data_dir = true;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "128", "--time-cap", "300",
                        "--eval-interval", "0.3", "--seed", "9", "--lease", "2"};
  spec.worker_flags = {"--train-limit", "15000", "--test-limit", "2000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 60, seconds(90))) << c.Logs();
  // An accuracy well above chance before the stop.
  double before = 0;
  const auto acc_deadline = std::chrono::steady_clock::now() + seconds(30);
  while (before < 0.6 && std::chrono::steady_clock::now() < acc_deadline) {
    before = MetricValue(FetchMetrics(c.monitor_metrics), "pacer_training_test_accuracy_ratio")
                 .value_or(0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(before, 0.6) << c.Logs();

  for (auto& w : c.workers) w->Signal(SIGTERM);
  for (auto& s : c.shards) s->Signal(SIGTERM);
  c.monitor->Signal(SIGTERM);
  for (auto& w : c.workers) ASSERT_TRUE(w->Wait(seconds(10)).has_value()) << c.Logs();
  for (auto& s : c.shards) {
    auto rc = s->Wait(seconds(15));
    ASSERT_TRUE(rc.has_value()) << c.Logs();
    EXPECT_EQ(*rc, 0) << c.Logs();
    EXPECT_NE(s->Stderr().find("final checkpoint"), std::string::npos) << s->Stderr();
  }
  ASSERT_TRUE(c.monitor->Wait(seconds(10)).has_value()) << c.Logs();
  double stopped_at = -1;
  {
    std::smatch f;
    const std::string err = c.shards[0]->Stderr();
    ASSERT_TRUE(std::regex_search(err, f, std::regex("applied through clock (-?[0-9]+)"))) << err;
    stopped_at = std::stod(f[1]);
  }

  // Everything again, on the same directories; new worker processes.
  c.workers.clear();
  ASSERT_TRUE(c.StartMonitor("tcp://127.0.0.1:0"));
  for (size_t i = 0; i < c.shards.size(); ++i) ASSERT_TRUE(c.StartShard(i)) << c.Logs();
  c.StartWorker();
  c.StartWorker();
  // The shards go on from their clock, and the first accuracy after the
  // restart is that of the trained model, not of a fresh one.
  ASSERT_TRUE(WaitForClock(c, stopped_at + 20, seconds(60))) << c.Logs();
  double after = -1;
  const auto after_deadline = std::chrono::steady_clock::now() + seconds(30);
  while (after < 0 && std::chrono::steady_clock::now() < after_deadline) {
    after = MetricValue(FetchMetrics(c.monitor_metrics), "pacer_training_test_accuracy_ratio")
                .value_or(-1);
    if (after <= 0) after = -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // Trained, not fresh (a fresh model scores about 0.1). Not within 0.05
  // of `before`: that reading came some clocks before the stop, and SGD's
  // test accuracy moves more than that between evaluations at this stage
  // (a fresh-clone run of 2026-12-05: 0.773 at clock 84 before the stop,
  // 0.695 for the model of the stop, clock 117, right after the restart,
  // and 0.785 at clock 173).
  EXPECT_GE(after, before - 0.15) << c.Logs();
  for (auto& s : c.shards) {
    EXPECT_NE(s->Stderr().find("loaded checkpoint"), std::string::npos) << s->Stderr();
  }
  EXPECT_NE(c.monitor->Stderr().find("resumed job"), std::string::npos) << c.Logs();
  for (auto& w : c.workers) w->Signal(SIGTERM);
  c.monitor->Signal(SIGTERM);
  for (auto& s : c.shards) s->Signal(SIGTERM);
  EXPECT_TRUE(c.monitor->Wait(seconds(10)).has_value());
}

// A shard whose disk hangs when it stops: its final checkpoint is given up
// at --stop-timeout, logged with its reason, and it exits 1 (a service
// manager sees the failure) instead of hanging SIGTERM. Here every write is
// stuck (slow_disk for a minute), so the writer is still in the first one.
TEST(RecoveryClusterTest, AShardWhoseDiskHangsAtStopGivesUpItsFinalCheckpointAndExits1) {
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 1;
  spec.shard_data_dirs = true;
  spec.shard_flags = {"--checkpoint-interval", "0.2", "--stop-timeout", "1", "--faults",
                      "slow_disk:ms=60000"};
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "64", "--time-cap", "60",
                        "--eval-interval", "1", "--seed", "4"};
  spec.worker_flags = {"--train-limit", "2000", "--test-limit", "500"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 5, seconds(60))) << c.Logs();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a checkpoint is due
  c.shards[0]->Signal(SIGTERM);
  auto rc = c.shards[0]->Wait(seconds(15));
  ASSERT_TRUE(rc.has_value()) << "SIGTERM hung on the disk\n" << c.Logs();
  EXPECT_EQ(*rc, 1) << c.Logs();
  const std::string err = c.shards[0]->Stderr();
  EXPECT_NE(err.find("given up after 1.0 s (--stop-timeout): the checkpoint before it was still "
                     "being written; the previous checkpoint stays"),
            std::string::npos)
      << err;
  for (auto& w : c.workers) w->Signal(SIGTERM);
  c.monitor->Signal(SIGTERM);
  EXPECT_TRUE(c.monitor->Wait(seconds(10)).has_value());
}

// Worker churn: mid-run one worker is killed with SIGKILL and another joins.
// The barrier moves on within the lease; the dead worker's data partition is
// given to another worker, which continues from the monitor's read position.
// By the test's own record (every worker's --sample-log: what each
// acknowledged push trained on), every sample of every partition is trained
// in each epoch, and the only samples trained twice are those of the killed
// worker's last batch.
TEST(RecoveryClusterTest, WorkerChurnSkipsNoSampleAndRepeatsAtMostTheKilledWorkersLastBatch) {
  // Epochs enough that the job outlasts the joining worker's start-up (at
  // 2 epochs, on a loaded machine, the others finished 10 ms before it
  // registered, and it was refused: the job had stopped).
  constexpr int kPartitions = 4, kEpochs = 6, kTrain = 6000;
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 3;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "96", "--data-partitions",
                        std::to_string(kPartitions), "--epochs", std::to_string(kEpochs),
                        "--lease", "1.5", "--time-cap", "150", "--eval-interval", "5"};
  spec.worker_flags = {"--train-limit", std::to_string(kTrain), "--test-limit", "500",
                       "--sample-log", "{dir}/samples-{n}.log"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 15, seconds(60))) << c.Logs();

  c.workers[1]->Signal(SIGKILL);
  ASSERT_TRUE(c.workers[1]->Wait(seconds(5)).has_value());
  const double at_kill = std::max(AppliedClock(c.shard_metrics[0]), AppliedClock(c.shard_metrics[1]));
  const auto killed_at = std::chrono::steady_clock::now();
  // The barrier waits for the dead worker at most its lease (1.5 s), plus
  // the time the shards take to hear of the new membership.
  ASSERT_TRUE(WaitForClock(c, at_kill + 2, seconds(20))) << c.Logs();
  const double stalled = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  EXPECT_LT(stalled, 1.5 + 2.0) << "the barrier waited " << stalled << " s for the dead worker";
  c.StartWorker();  // joins mid-run

  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  EXPECT_NE(c.monitor->Stdout().find("stop reason: all workers finished"), std::string::npos)
      << c.Logs();
  for (size_t i = 0; i < c.workers.size(); ++i) {
    if (i == 1) continue;
    auto rc = c.workers[i]->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << c.workers[i]->name() << " did not exit\n" << c.Logs();
    EXPECT_EQ(*rc, 0) << c.Logs();
  }

  // The test's record: what every acknowledged push trained on.
  std::map<std::pair<int, int>, std::map<uint32_t, int>> trained;  // (partition, epoch) -> counts
  std::vector<uint32_t> killed_last_batch;
  for (int n = 0; n < 4; ++n) {
    std::istringstream log(ReadFile(c.dir.path() + "/samples-" + std::to_string(n) + ".log"));
    std::string line;
    while (std::getline(log, line)) {
      std::istringstream in(line);
      int partition = -1, epoch = -1;
      in >> partition >> epoch;
      ASSERT_TRUE(partition >= 0 && partition < kPartitions && epoch >= 0 && epoch < kEpochs) << line;
      std::vector<uint32_t> batch;
      for (uint32_t sample; in >> sample;) {
        ++trained[{partition, epoch}][sample];
        batch.push_back(sample);
      }
      if (n == 1) killed_last_batch = batch;
    }
  }
  ASSERT_FALSE(killed_last_batch.empty()) << "the killed worker trained nothing";
  size_t repeated = 0;
  for (int p = 0; p < kPartitions; ++p) {
    const uint32_t begin = kTrain * p / kPartitions, end = kTrain * (p + 1) / kPartitions;
    for (int e = 0; e < kEpochs; ++e) {
      const auto& counts = trained[{p, e}];
      size_t missing = 0;
      for (uint32_t i = begin; i < end; ++i) missing += !counts.count(i);
      EXPECT_EQ(missing, 0u) << "partition " << p << " epoch " << e << " skipped samples";
      for (const auto& [sample, count] : counts) {
        EXPECT_TRUE(sample >= begin && sample < end) << "sample " << sample << " in partition " << p;
        if (count > 1) {
          repeated += static_cast<size_t>(count - 1);
          EXPECT_EQ(count, 2) << "sample " << sample;
          EXPECT_NE(std::find(killed_last_batch.begin(), killed_last_batch.end(), sample),
                    killed_last_batch.end())
              << "sample " << sample << " of partition " << p << " epoch " << e
              << " was trained twice, and not in the killed worker's last batch";
        }
      }
    }
  }
  EXPECT_LE(repeated, killed_last_batch.size());
  if (HasFailure()) {
    std::string tail;
    std::istringstream log(ReadFile(c.dir.path() + "/samples-1.log"));
    for (std::string line; std::getline(log, line);) tail = line.substr(0, 60) + "\n" + tail.substr(0, 200);
    ADD_FAILURE() << "killed worker's last lines:\n" << tail << c.Logs();
  }
  EXPECT_NE(c.monitor->Stderr().find("missed its lease"), std::string::npos);
}


// --data-stream's sample logs ("CHUNK EPOCH INDEX..." per acknowledged
// push): the count of each training index per epoch, and each worker's
// last batch.
struct StreamRecord {
  std::map<int, std::map<uint32_t, int>> trained;  // epoch -> index -> count
  std::vector<std::vector<uint32_t>> last_batch;   // per worker log
};
StreamRecord ReadStreamLogs(const Cluster& c, int logs, int epochs) {
  StreamRecord r;
  r.last_batch.resize(static_cast<size_t>(logs));
  for (int n = 0; n < logs; ++n) {
    std::istringstream log(ReadFile(c.dir.path() + "/samples-" + std::to_string(n) + ".log"));
    std::string line;
    while (std::getline(log, line)) {
      std::istringstream in(line);
      long chunk = -1;
      int epoch = -1;
      in >> chunk >> epoch;
      EXPECT_TRUE(chunk > 0 && epoch >= 0 && epoch < epochs) << line;
      std::vector<uint32_t> batch;
      for (uint32_t sample; in >> sample;) {
        ++r.trained[epoch][sample];
        batch.push_back(sample);
      }
      r.last_batch[static_cast<size_t>(n)] = batch;
    }
  }
  return r;
}

// Every index of [0, train) trained once in each of `epochs` epochs; a
// second time only if it is in `may_repeat` (a killed worker's last batch).
void ExpectEachIndexOncePerEpoch(const StreamRecord& r, int epochs, uint32_t train,
                                 const std::vector<uint32_t>& may_repeat) {
  size_t repeated = 0;
  for (int e = 0; e < epochs; ++e) {
    auto it = r.trained.find(e);
    ASSERT_TRUE(it != r.trained.end()) << "epoch " << e << " trained nothing";
    const auto& counts = it->second;
    size_t missing = 0;
    for (uint32_t i = 0; i < train; ++i) missing += !counts.count(i);
    EXPECT_EQ(missing, 0u) << "epoch " << e << " skipped samples";
    for (const auto& [sample, count] : counts) {
      EXPECT_LT(sample, train);
      if (count == 1) continue;
      repeated += static_cast<size_t>(count - 1);
      EXPECT_EQ(count, 2) << "sample " << sample << " epoch " << e;
      EXPECT_NE(std::find(may_repeat.begin(), may_repeat.end(), sample), may_repeat.end())
          << "sample " << sample << " of epoch " << e
          << " was trained twice, and not in a killed worker's last batch";
    }
  }
  EXPECT_LE(repeated, may_repeat.size());
}

// --data-stream, worker churn: one worker is killed with SIGKILL mid-epoch
// and another joins. The killed worker's chunks go back to the pool at the
// positions it reported; by the test's own record (the workers' sample
// logs), every training index is trained exactly once in every epoch of
// the whole set, except that the killed worker's last batch may be
// trained twice; the job stops once its epochs are done.
TEST(RecoveryClusterTest, DataStreamWorkerChurnTrainsEachSampleOncePerEpoch) {
  constexpr int kEpochs = 8;
  constexpr uint32_t kTrain = 6000;
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 3;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "96", "--data-stream",
                        "--chunk-samples", "400", "--epochs", std::to_string(kEpochs),
                        "--lease", "1.5", "--time-cap", "150", "--eval-interval", "5"};
  spec.worker_flags = {"--train-limit", std::to_string(kTrain), "--test-limit", "500",
                       "--sample-log", "{dir}/samples-{n}.log"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 15, seconds(60))) << c.Logs();
  c.workers[1]->Signal(SIGKILL);
  ASSERT_TRUE(c.workers[1]->Wait(seconds(5)).has_value());
  c.StartWorker();  // joins mid-run

  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  EXPECT_NE(c.monitor->Stdout().find("stop reason: 8 epoch(s) over the training set done"),
            std::string::npos)
      << c.Logs();
  for (size_t i = 0; i < c.workers.size(); ++i) {
    if (i == 1) continue;
    auto rc = c.workers[i]->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << c.workers[i]->name() << " did not exit\n" << c.Logs();
    EXPECT_EQ(*rc, 0) << c.Logs();
  }
  const StreamRecord r = ReadStreamLogs(c, 4, kEpochs);
  ASSERT_FALSE(r.last_batch[1].empty()) << "the killed worker trained nothing";
  EXPECT_FALSE(r.last_batch[3].empty()) << "the new worker trained nothing\n" << c.Logs();
  ExpectEachIndexOncePerEpoch(r, kEpochs, kTrain, r.last_batch[1]);
  if (HasFailure()) ADD_FAILURE() << c.Logs();
  EXPECT_NE(c.monitor->Stderr().find("missed its lease"), std::string::npos);
  EXPECT_NE(c.monitor->Stderr().find("epoch 7 done"), std::string::npos);
}

// --data-stream, the monitor killed with SIGKILL mid-epoch and restarted on
// its --data-dir: the workers keep the chunks they hold (and train them
// while it is down), the restarted monitor carries on from its saved state,
// and no training index is skipped or trained twice in any epoch.
TEST(RecoveryClusterTest, DataStreamMonitorKilledMidEpochSkipsAndRepeatsNothing) {
  constexpr int kEpochs = 6;
  constexpr uint32_t kTrain = 6000;
  ClusterSpec spec;
  spec.shards = 2;
  spec.workers = 2;
  spec.monitor_data_dir = true;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "64", "--data-stream",
                        "--chunk-samples", "1500", "--epochs", std::to_string(kEpochs),
                        "--lease", "5", "--time-cap", "150", "--eval-interval", "5"};
  spec.worker_flags = {"--train-limit", std::to_string(kTrain), "--test-limit", "500",
                       "--sample-log", "{dir}/samples-{n}.log", "--slowdown", "20"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  ASSERT_TRUE(WaitForClock(c, 30, seconds(60))) << c.Logs();
  const std::string address = c.monitor_address;
  c.monitor->Signal(SIGKILL);
  ASSERT_TRUE(c.monitor->Wait(seconds(5)).has_value());
  // Back at once, while the workers are still reading the chunks they held
  // (each is a quarter of an epoch, at about 4 s a epoch).
  ASSERT_TRUE(c.StartMonitor(address)) << c.Logs();
  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  EXPECT_NE(c.monitor->Stdout().find("stop reason: 6 epoch(s) over the training set done"),
            std::string::npos)
      << c.Logs();
  EXPECT_NE(c.monitor->Stderr().find("resumed job"), std::string::npos) << c.Logs();
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << w->name() << " did not exit\n" << c.Logs();
    EXPECT_EQ(*rc, 0) << c.Logs();
  }
  ExpectEachIndexOncePerEpoch(ReadStreamLogs(c, 2, kEpochs), kEpochs, kTrain, {});
  if (HasFailure()) ADD_FAILURE() << c.Logs();
}

}  // namespace
}  // namespace pacer::test
