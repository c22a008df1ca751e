// Fault injection on a live cluster: --faults at start, and pacerctl fault
// at run time (set, list, clear, a self-ending partition), each seen in the
// processes' pacer_faults_injected_total and survived by training.
#include <thread>

#include "tests/pacerctl_util.h"

namespace pacer::test {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

double Injected(const std::string& metrics_address, const std::string& kind) {
  return MetricValue(FetchMetrics(metrics_address), "pacer_faults_injected_total",
                     {"kind=\"" + kind + "\""})
      .value_or(-1);
}

// The lowest clock a live worker reported to the monitor (-1: none yet).
int64_t SlowestClock(Cluster& c) {
  auto st = Status(c);
  int64_t low = -1;
  if (!st.is_object()) return low;
  for (const auto& w : st["workers"]) {
    if (w.value("state", "") != "live") continue;
    const int64_t clock = w.value("clock", int64_t{0});
    low = low < 0 ? clock : std::min(low, clock);
  }
  return low;
}

// Waits until every live worker's clock passed `clock` + `by`.
bool ProgressesPast(Cluster& c, int64_t clock, int64_t by, seconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (SlowestClock(c) >= clock + by) return true;
    std::this_thread::sleep_for(milliseconds(200));
  }
  return false;
}

TEST(FaultClusterTest, StartupAndRunTimeFaultsAreInjectedAndSurvived) {
  ClusterSpec spec;
  spec.shards = 1;
  spec.workers = 2;
  spec.monitor_flags = {"--time-cap", "120", "--target-accuracy", "0"};
  // Every push reaches the shard twice: it must apply each once.
  spec.shard_flags = {"--faults", "duplicate:p=0.5,type=Push", "--fault-seed", "7"};
  spec.worker_flags = {"--train-limit", "6000", "--test-limit", "500"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());
  std::vector<std::string> worker_metrics;
  for (auto& w : c.workers) {
    auto m = w->WaitForLine("metrics ", seconds(10));
    ASSERT_TRUE(m);
    worker_metrics.push_back(*m);
  }
  ASSERT_TRUE(ProgressesPast(c, 0, 20, seconds(60))) << c.Logs();
  EXPECT_NE(c.shards[0]->Stderr().find("fault seed 7"), std::string::npos) << "seed not logged";

  // Startup faults: duplicated pushes, acknowledged and not applied again.
  const std::string shard_metrics = FetchMetrics(c.shard_metrics[0]);
  const double duplicated = Injected(c.shard_metrics[0], "duplicate");
  EXPECT_GT(duplicated, 0) << shard_metrics;
  EXPECT_GT(MetricValue(shard_metrics, "pacer_shard_duplicate_pushes_total").value_or(0), 0)
      << "the shard did not notice any duplicate";

  // Run time: 30% of the pull replies the workers receive are dropped.
  CtlRun set = Ctl(c, {"fault", "set", "worker", "drop:p=0.3,type=PullReply"}, "fault-set");
  ASSERT_EQ(set.code, 0) << set.err;
  EXPECT_NE(set.out.find("worker"), std::string::npos) << set.out;
  int64_t clock = SlowestClock(c);
  EXPECT_TRUE(ProgressesPast(c, clock, 5, seconds(60))) << "no progress under 30% pull loss\n"
                                                       << c.Logs();
  double dropped = 0;
  for (const auto& m : worker_metrics) dropped += std::max(0.0, Injected(m, "drop"));
  EXPECT_GT(dropped, 0) << "the workers never applied the run-time rule";

  // A partition of the shard that ends by itself after 3 s.
  auto st = Status(c);
  const std::string shard = "server:" + std::to_string(st["shards"][0]["id"].get<uint32_t>());
  CtlRun part = Ctl(c, {"fault", "set", shard, "partition:for=3"}, "fault-partition");
  ASSERT_EQ(part.code, 0) << part.err;
  const auto t0 = std::chrono::steady_clock::now();
  while (Injected(c.shard_metrics[0], "partition") <= 0 &&
         std::chrono::steady_clock::now() - t0 < seconds(10)) {
    std::this_thread::sleep_for(milliseconds(100));
  }
  EXPECT_GT(Injected(c.shard_metrics[0], "partition"), 0) << "the shard was never partitioned";
  clock = SlowestClock(c);
  EXPECT_TRUE(ProgressesPast(c, clock, 5, seconds(60))) << "no progress after the partition healed\n"
                                                       << c.Logs();

  // The table, cleared.
  CtlRun list = Ctl(c, {"fault", "list"}, "fault-list");
  EXPECT_EQ(list.code, 0);
  EXPECT_NE(list.out.find("drop:p=0.3"), std::string::npos) << list.out;
  CtlRun clear = Ctl(c, {"fault", "clear"}, "fault-clear");
  EXPECT_EQ(clear.code, 0) << clear.err;
  EXPECT_NE(clear.out.find("no faults set"), std::string::npos) << clear.out;
  std::this_thread::sleep_for(seconds(1));  // a heartbeat brings the news
  const double before = Injected(worker_metrics[0], "drop");
  clock = SlowestClock(c);
  ASSERT_TRUE(ProgressesPast(c, clock, 10, seconds(30)));
  EXPECT_EQ(Injected(worker_metrics[0], "drop"), before) << "drops went on after clear";

  // Bad requests are refused with the reason.
  CtlRun bad = Ctl(c, {"fault", "set", "worker", "explode"}, "fault-bad");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("unknown kind"), std::string::npos) << bad.err;
  CtlRun bad_target = Ctl(c, {"fault", "set", "workers:x", "drop"}, "fault-bad-target");
  EXPECT_EQ(bad_target.code, 1);
  EXPECT_NE(bad_target.err.find("fault target"), std::string::npos) << bad_target.err;
}

}  // namespace
}  // namespace pacer::test
