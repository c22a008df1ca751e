// Replication on real processes (issue 23): a monitor with --replicas 1,
// three shards that each back up another's range, two workers. Every
// applied step reaches the range's backup as a record over the shards' own
// connections, and the backups' block checks (a CRC-32 of a block range
// every 16 records, against the primary's) find no difference. Then a
// primary killed mid-training in BSP, SSP and ASP: its backup serves the
// range, and not one acknowledged push is lost.
#include <signal.h>

#include <chrono>
#include <ctime>
#include <iostream>
#include <map>
#include <optional>
#include <regex>
#include <thread>

#include "tests/cluster_harness.h"
#include "tests/pacerctl_util.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// The local time of day in seconds, as the processes' log lines give it
// ("2026-12-04T20:53:22.939 ...": spdlog's local time).
double LocalSecondsOfDay(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()) % 1000;
  return tm.tm_hour * 3600.0 + tm.tm_min * 60.0 + tm.tm_sec +
         static_cast<double>(ms.count()) / 1000;
}
double LogSecondsOfDay(const std::string& stamp) {
  // YYYY-MM-DDTHH:MM:SS.mmm
  return std::stod(stamp.substr(11, 2)) * 3600 + std::stod(stamp.substr(14, 2)) * 60 +
         std::stod(stamp.substr(17));
}

struct ShardReplication {
  uint64_t epoch = 0, records = 0, durable = 0, checks = 0, mismatches = 0;
  std::map<uint32_t, uint64_t> held;  // range (its primary) -> record held through
};

// Trains in `mode` to the target and reads each shard's final replication line.
void TrainReplicated(const std::string& mode) {
  ClusterSpec spec;
  spec.shards = 3;
  spec.workers = 2;
  spec.monitor_flags = {"--mode", mode, "--replicas", "1", "--global-batch", "128",
                        "--target-accuracy", "0.75", "--time-cap", "60", "--eval-interval",
                        "0.5", "--seed", "7"};
  spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  // While it trains, pacerctl status shows each range's epoch, backup and
  // lag (from its primary's heartbeats).
  size_t with_lag = 0;
  nlohmann::json j;
  for (int i = 0; i < 100 && with_lag < 3 && c.monitor->Running(); ++i) {
    j = Status(c);
    with_lag = 0;
    if (!j.is_discarded() && j["state"] == "running") {
      for (const auto& s : j["shards"]) {
        with_lag += s["backups"].size() == 1 && s["epoch"].get<uint64_t>() > 0 &&
                    !s["lag_records"].is_null() && s["lag_seconds"].get<double>() >= 0;
      }
    }
    if (with_lag < 3) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(with_lag, 3u) << j.dump(2);
  if (with_lag == 3) {
    CtlRun table = Ctl(c, {"status"}, "status-table");
    EXPECT_NE(table.out.find("LAG"), std::string::npos) << table.out;
    EXPECT_NE(table.out.find(" rec, "), std::string::npos) << table.out;
  }
  ASSERT_TRUE(c.monitor->Wait(seconds(120)).has_value()) << c.Logs();
  EXPECT_NE(c.monitor->Stdout().find("stop reason: target accuracy"), std::string::npos)
      << c.Logs();
  std::map<uint32_t, ShardReplication> shards;
  const std::regex line(
      "shard ([0-9]+): replication: range epoch ([0-9]+), records ([0-9]+), durable through "
      "record ([0-9]+); replicas held: ([^;]*); replica checks ([0-9]+), mismatches ([0-9]+)");
  const std::regex held("shard ([0-9]+)'s through record ([0-9]+)");
  for (auto& s : c.shards) {
    ASSERT_TRUE(s->Wait(seconds(20)).has_value()) << s->name() << " did not exit\n" << c.Logs();
    const std::string err = s->Stderr();
    std::smatch m;
    ASSERT_TRUE(std::regex_search(err, m, line)) << s->name() << "\n" << err;
    ShardReplication r;
    r.epoch = std::stoull(m[2]);
    r.records = std::stoull(m[3]);
    r.durable = std::stoull(m[4]);
    r.checks = std::stoull(m[6]);
    r.mismatches = std::stoull(m[7]);
    const std::string list = m[5];
    for (std::sregex_iterator it(list.begin(), list.end(), held), end; it != end; ++it) {
      r.held[static_cast<uint32_t>(std::stoul((*it)[1]))] = std::stoull((*it)[2]);
    }
    shards[static_cast<uint32_t>(std::stoul(m[1]))] = r;
  }
  ASSERT_EQ(shards.size(), 3u);
  size_t replicas = 0;
  for (const auto& [id, r] : shards) {
    SCOPED_TRACE("shard " + std::to_string(id));
    EXPECT_GT(r.epoch, 0u);
    EXPECT_GT(r.records, 20u) << c.Logs();
    // Acknowledged by its backup up to the last few records at the stop.
    EXPECT_LE(r.durable, r.records);
    EXPECT_GE(r.durable + 5, r.records);
    EXPECT_EQ(r.mismatches, 0u) << c.Logs();
    // A backup compared its replicas with their primaries (a shard may back
    // up none: placement takes the shards holding or backing fewest ranges).
    if (!r.held.empty()) {
      EXPECT_GE(r.checks, 1u) << c.Logs();
    }
    for (const auto& [range, record] : r.held) {
      ASSERT_NE(range, id);
      ASSERT_EQ(shards.count(range), 1u);
      EXPECT_LE(record, shards[range].records);
      EXPECT_GE(record + 5, shards[range].records);
      ++replicas;
    }
  }
  EXPECT_EQ(replicas, 3u);  // each range on one backup
}

TEST(ReplicationClusterTest, BspStepsReachEveryBackupIdentical) { TrainReplicated("bsp"); }

// kill -9 a primary mid-training in `mode`: its backup serves the range
// after the shard lease, the workers resend what was not durable, and
// training reaches its target with no acknowledged push lost on the
// promoted range.
void KillAPrimary(const std::string& mode) {
  ClusterSpec spec;
  spec.shards = 3;
  spec.workers = 2;
  spec.monitor_flags = {"--mode", mode, "--replicas", "1", "--shard-lease", "1",
                        "--global-batch", "128", "--target-accuracy", "0.8", "--time-cap", "90",
                        "--eval-interval", "0.5", "--seed", "7"};
  spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  auto applied = [&](size_t shard) {
    return MetricValue(FetchMetrics(c.shard_metrics[shard]), "pacer_shard_applied_clock")
        .value_or(-1);
  };
  // Every range has its replica on its backup, and training is under way.
  auto replicas = [&] {
    double n = 0;
    for (size_t i = 0; i < c.shards.size(); ++i) {
      n += MetricValue(FetchMetrics(c.shard_metrics[i]), "pacer_shard_replicas").value_or(0);
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + seconds(60);
  while ((applied(0) < 40 || replicas() < 3) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(applied(0), 40) << c.Logs();
  ASSERT_EQ(replicas(), 3) << c.Logs();
  const double killed_at = LocalSecondsOfDay(std::chrono::system_clock::now());
  c.shards[0]->Signal(SIGKILL);
  ASSERT_TRUE(c.shards[0]->Wait(seconds(5)).has_value());
  // The promoted range's core exports its series beside its host's own,
  // labelled with the range: it steps, and it replicates to a new backup.
  std::optional<double> promoted_steps, promoted_records;
  const auto seen_by = std::chrono::steady_clock::now() + seconds(30);
  while ((!promoted_steps || *promoted_steps <= 0 || !promoted_records ||
          *promoted_records <= 0) &&
         std::chrono::steady_clock::now() < seen_by) {
    for (size_t i = 1; i < c.shards.size(); ++i) {
      const std::string metrics = FetchMetrics(c.shard_metrics[i]);
      if (auto v = MetricValue(metrics, "pacer_shard_steps_total", {"range=\""})) {
        promoted_steps = v;
        promoted_records = MetricValue(metrics, "pacer_shard_replication_records_total",
                                       {"range=\""});
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_GT(promoted_steps.value_or(0), 0) << c.Logs();
  EXPECT_GT(promoted_records.value_or(0), 0) << c.Logs();
  ASSERT_TRUE(c.monitor->Wait(seconds(120)).has_value()) << c.Logs();
  const std::string out = c.monitor->Stdout(), err = c.monitor->Stderr();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << c.Logs();
  EXPECT_NE(err.find("failover: shard"), std::string::npos) << c.Logs();
  std::smatch m;
  size_t promoted = 0;
  for (size_t i = 1; i < c.shards.size(); ++i) {
    ASSERT_TRUE(c.shards[i]->Wait(seconds(20)).has_value()) << c.Logs();
    const std::string serr = c.shards[i]->Stderr();
    if (std::regex_search(serr, m,
                          std::regex("served shard ([0-9]+)'s range since its promotion \\(epoch "
                                     "[0-9]+\\): steps ([0-9]+), applied through clock "
                                     "(-?[0-9]+), updates applied ([0-9]+); ([0-9]+) "
                                     "acknowledged push\\(es\\) lost"))) {
      ++promoted;
      EXPECT_GT(std::stol(m[2]), 10) << serr;  // it trained on after the failover
      EXPECT_EQ(std::stol(m[5]), 0) << c.Logs();
    }
  }
  EXPECT_EQ(promoted, 1u) << c.Logs();
  // How long the range was out: from the kill to the first push a worker
  // sent the new owner again (logged with the time of day, as the kill).
  std::optional<double> resent;
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0) << w->Stderr();
    const std::string werr = w->Stderr();
    const std::regex line(
        "([0-9-]+T[0-9:.]+) info \\[worker\\] sending [0-9]+ push\\(es\\) not yet durable");
    for (std::sregex_iterator it(werr.begin(), werr.end(), line), end; it != end; ++it) {
      const double t = LogSecondsOfDay((*it)[1]);
      if (!resent || t < *resent) resent = t;
    }
  }
  if (resent) {
    std::cout << mode << ": from the kill to the first push sent again to the new owner: "
              << *resent - killed_at << " s\n";
    ::testing::Test::RecordProperty("kill_to_resend_ms",
                                    static_cast<int>((*resent - killed_at) * 1000));
  }
}

// After a failover the promoted range gets a new backup, seeded while
// training goes on; then the shard serving it dies too, and the third
// shard serves every range, still with no acknowledged push lost.
TEST(ReplicationClusterTest, ASecondFailoverAfterTheNewBackupIsSeeded) {
  ClusterSpec spec;
  spec.shards = 3;
  spec.workers = 2;
  spec.monitor_flags = {"--mode", "bsp", "--replicas", "1", "--shard-lease", "1",
                        "--global-batch", "128", "--time-cap", "15", "--eval-interval", "1",
                        "--seed", "7"};
  spec.worker_flags = {"--train-limit", "12000", "--test-limit", "1000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  auto replicas = [&](size_t shard) {
    return MetricValue(FetchMetrics(c.shard_metrics[shard]), "pacer_shard_replicas").value_or(0);
  };
  auto wait_for = [&](auto done, seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return replicas(0) + replicas(1) + replicas(2) == 3; }, seconds(30)))
      << c.Logs();
  c.shards[0]->Signal(SIGKILL);
  ASSERT_TRUE(c.shards[0]->Wait(seconds(5)).has_value());
  // The two left hold three replicas again: the promoted range's new one.
  ASSERT_TRUE(wait_for([&] { return replicas(1) + replicas(2) == 3; }, seconds(20))) << c.Logs();
  const size_t second = replicas(1) == 1 ? 1 : 2;  // the one that backs up a single range
  const size_t last = 3 - second;
  c.shards[second]->Signal(SIGKILL);
  ASSERT_TRUE(c.shards[second]->Wait(seconds(5)).has_value());
  ASSERT_TRUE(c.monitor->Wait(seconds(60)).has_value()) << c.Logs();
  const std::string err = c.monitor->Stderr();
  size_t failovers = 0;
  for (size_t at = err.find("failover: shard"); at != std::string::npos;
       at = err.find("failover: shard", at + 1)) {
    ++failovers;
  }
  EXPECT_EQ(failovers, 3u) << c.Logs();  // one range, then the two the second shard served
  ASSERT_TRUE(c.shards[last]->Wait(seconds(20)).has_value()) << c.Logs();
  const std::string serr = c.shards[last]->Stderr();
  const std::regex served("served shard ([0-9]+)'s range since its promotion \\(epoch [0-9]+\\): "
                          "steps ([0-9]+), applied through clock (-?[0-9]+), updates applied "
                          "([0-9]+); ([0-9]+) acknowledged push\\(es\\) lost");
  size_t promoted = 0;
  for (std::sregex_iterator it(serr.begin(), serr.end(), served), end; it != end; ++it) {
    ++promoted;
    EXPECT_EQ(std::stol((*it)[5]), 0) << c.Logs();
  }
  EXPECT_EQ(promoted, 2u) << c.Logs();
  std::smatch m;
  const std::string out = c.monitor->Stdout();
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  EXPECT_GE(std::stod(m[1]), 0.75) << c.Logs();
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 0) << w->Stderr();
  }
}

TEST(ReplicationClusterTest, BspKillAPrimaryAndItsBackupTakesOver) { KillAPrimary("bsp"); }
TEST(ReplicationClusterTest, SspKillAPrimaryAndItsBackupTakesOver) { KillAPrimary("ssp"); }
TEST(ReplicationClusterTest, AspKillAPrimaryAndItsBackupTakesOver) { KillAPrimary("asp"); }
TEST(ReplicationClusterTest, AspBatchesReachEveryBackupIdentical) { TrainReplicated("asp"); }

}  // namespace
}  // namespace pacer::test
