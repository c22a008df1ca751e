// Multi-process straggler test: a real monitor running the pacer policy, two
// shards and three workers, one of them slowed 4x with --slowdown.
#include <regex>

#include "tests/cluster_harness.h"

namespace pacer::test {
namespace {

using std::chrono::seconds;

// The value of `key=N` in the worker's "worker summary:" line, or -1.
long SummaryField(const std::string& out, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("worker summary:.* " + key + "=([0-9]+)"))) return -1;
  return std::stol(m[1]);
}

// The slowed worker ends with a batch under half of each other worker's,
// the global batch stays 192, and training still reaches the threshold.
TEST(StragglerClusterTest, FourTimesSlowerWorkerGetsUnderHalfTheBatchAndTrainingConverges) {
  ClusterSpec spec;
  spec.monitor_flags = {"--policy", "pacer", "--global-batch", "192", "--target-accuracy", "0.85",
                        "--time-cap", "90", "--eval-interval", "0.5", "--policy-interval", "0.3",
                        "--seed", "3"};
  // Rank 0 evaluates the test set every 0.5 s on a second thread; on two
  // cores the whole 10000-sample set slowed its training enough that the
  // policy once gave it a smaller batch than the slowed worker's (4 vs 11).
  spec.worker_flags = {"--test-limit", "2000"};
  spec.worker_flags_by_index[2] = {"--slowdown", "4"};
  Cluster c(spec);
  ASSERT_TRUE(c.Start());

  ASSERT_TRUE(c.monitor->Wait(seconds(150)).has_value()) << c.Logs();
  const std::string out = c.monitor->Stdout();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("final test accuracy: ([0-9.]+)"))) << c.Logs();
  EXPECT_GE(std::stod(m[1]), 0.85) << c.Logs();
  EXPECT_NE(out.find("stop reason: target accuracy"), std::string::npos) << c.Logs();
  // The monitor logged at least one policy round.
  EXPECT_NE(c.monitor->Stderr().find("policy round"), std::string::npos) << c.Logs();

  std::vector<long> batch;
  for (auto& w : c.workers) {
    auto rc = w->Wait(seconds(20));
    ASSERT_TRUE(rc.has_value()) << w->name() << " did not exit\n" << c.Logs();
    EXPECT_EQ(*rc, 0) << w->Stderr();
    batch.push_back(SummaryField(w->Stdout(), "last_batch"));
    ASSERT_GT(batch.back(), 0) << w->name() << ": no summary\n" << w->Stdout();
  }
  EXPECT_LT(2 * batch[2], batch[0]) << "slow " << batch[2] << ", others " << batch[0];
  EXPECT_LT(2 * batch[2], batch[1]) << "slow " << batch[2] << ", others " << batch[1];
  // Sizes switch at iteration boundaries, so the last ones may straddle a
  // round; they still add up to about B.
  EXPECT_NEAR(batch[0] + batch[1] + batch[2], 192, 192 * 0.15);
  for (auto& s : c.shards) ASSERT_TRUE(s->Wait(seconds(20)).has_value()) << c.Logs();
}

}  // namespace
}  // namespace pacer::test
