// Multi-process loopback tests: a real monitor, shards and workers.
#include <signal.h>

#include <regex>

#include "tests/cluster_harness.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// BSP with 3 workers and 2 shards trains to >= 0.75 test accuracy, measured
// by rank 0 on parameters pulled from the shards, and every shard applied
// exactly one step per clock, each from the pushes of all live workers.
TEST(ClusterTest, BspThreeWorkersTwoShardsTrainsAndStepsOncePerClock) {
  ClusterSpec spec;
  spec.monitor_flags = {"--mode", "bsp", "--global-batch", "192", "--target-accuracy", "0.75",
                        "--time-cap", "90", "--eval-interval", "0.5", "--seed", "7"};
  spec.worker_flags = {"--train-limit", "15000", "--test-limit", "2000"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  std::string out = c.monitor->Stdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  const double accuracy = std::stod(m[1]);
  EXPECT_GE(accuracy, 0.75) << c.Logs();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << out;

  for (auto& s : c.shards) {
    ASSERT_TRUE(s->Wait(seconds(20)).has_value()) << s->name() << " did not exit\n" << c.Logs();
    std::string err = s->Stderr();
    std::smatch f;
    ASSERT_TRUE(std::regex_search(
        err, f,
        std::regex("final: steps ([0-9]+), applied through clock (-?[0-9]+), incomplete steps "
                   "([0-9]+), updates applied ([0-9]+)")))
        << err;
    const long steps = std::stol(f[1]), applied = std::stol(f[2]), incomplete = std::stol(f[3]),
               updates = std::stol(f[4]);
    EXPECT_GT(steps, 10) << s->name();
    // One step per clock: clocks 0..applied, each closed exactly once.
    EXPECT_EQ(steps, applied + 1) << s->name();
    // Each step saw a push from every live worker.
    EXPECT_EQ(incomplete, 0) << s->name();
    // 3 pushes per closed clock, plus at most 2 for the clock left open at the stop.
    EXPECT_GE(updates, 3 * steps) << s->name();
    EXPECT_LE(updates, 3 * steps + 2) << s->name();
  }
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << w->name() << " did not exit";
    EXPECT_EQ(*rc, 0) << w->Stderr();
  }
}

// BSP: kill -9 one worker; once its lease expires the monitor drops it and
// the other workers' clocks keep advancing.
TEST(ClusterTest, DeadWorkerDoesNotStallBsp) {
  ClusterSpec spec;
  spec.monitor_flags = {"--mode", "bsp", "--lease", "1", "--time-cap", "120",
                        "--eval-interval", "5"};
  spec.worker_flags = {"--train-limit", "6000", "--test-limit", "500"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  auto applied_clock = [&](size_t shard) {
    return MetricValue(FetchMetrics(c.shard_metrics[shard]), "pacer_shard_applied_clock")
        .value_or(-1);
  };
  auto wait_for_clock = [&](double target, seconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (applied_clock(0) >= target && applied_clock(1) >= target) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  ASSERT_TRUE(wait_for_clock(20, seconds(60))) << c.Logs();

  c.workers[1]->Signal(SIGKILL);
  ASSERT_TRUE(c.workers[1]->Wait(seconds(5)).has_value());
  const double at_kill = std::max(applied_clock(0), applied_clock(1));

  // The survivors make progress well past where the dead worker stopped.
  ASSERT_TRUE(wait_for_clock(at_kill + 100, seconds(60)))
      << "stalled at " << applied_clock(0) << "\n" << c.Logs();
  std::string mm = FetchMetrics(c.monitor_metrics);
  EXPECT_EQ(MetricValue(mm, "pacer_monitor_live_workers"), 2) << mm;
  EXPECT_EQ(MetricValue(mm, "pacer_monitor_workers_lost_total"), 1) << mm;
  EXPECT_NE(c.monitor->Stderr().find("missed its lease"), std::string::npos);
  EXPECT_TRUE(c.workers[0]->Running());
  EXPECT_TRUE(c.workers[2]->Running());

  c.monitor->Signal(SIGTERM);
  EXPECT_TRUE(c.monitor->Wait(seconds(10)).has_value());
}

}  // namespace
}  // namespace pacer::test
