// The cluster simulator (bench/cluster_sim.h) against figures worked out by
// hand, so that what bench/RESULTS.md reports from it can be trusted.
#include "bench/cluster_sim.h"

#include <gtest/gtest.h>

namespace pacer::sim {
namespace {

SimOptions Base() {
  SimOptions o;
  o.workers = 3;
  o.batch = 64;
  o.seconds_per_sample = 50e-6;  // 3.2 ms of compute per iteration
  o.communication = 4e-3;
  o.seconds = 30;
  return o;
}

TEST(SimTest, EqualWorkersUnderBspReachTheIdeal) {
  auto r = Simulate(Base());
  ASSERT_TRUE(r.ok()) << r.status();
  // 3 workers x 64 samples per 7.2 ms.
  EXPECT_NEAR(r->ideal_throughput, 3 * 64 / 7.2e-3, 30);
  EXPECT_NEAR(r->fraction, 1.0, 0.01);
  EXPECT_LT(r->wait_fraction, 0.01);
}

TEST(SimTest, BspRunsAtTheStragglersPace) {
  SimOptions o = Base();
  o.scenario = Scenario::kStatic;
  o.slow_factor = 4;
  auto r = Simulate(o);
  ASSERT_TRUE(r.ok());
  // Every clock takes the straggler's 4 x 3.2 + 4 = 16.8 ms.
  EXPECT_NEAR(r->throughput, 3 * 64 / 16.8e-3, 0.01 * 3 * 64 / 16.8e-3);
  EXPECT_NEAR(r->clocks, 30 / 16.8e-3, 5);
}

TEST(SimTest, AdaptiveBatchRecoversAStaticStraggler) {
  SimOptions o = Base();
  o.scenario = Scenario::kStatic;
  o.slow_factor = 4;
  o.policy = policy::Kind::kAdaptiveBatch;
  auto r = Simulate(o);
  ASSERT_TRUE(r.ok());
  EXPECT_GT(r->fraction, 0.9);
  EXPECT_LT(r->min_batch * 2, r->max_batch);  // the straggler got the small batch
  EXPECT_GT(r->rounds, 10u);
}

TEST(SimTest, AspNeverWaitsAndBackupDropsTheStragglersPushes) {
  SimOptions o = Base();
  o.scenario = Scenario::kStatic;
  o.slow_factor = 4;
  o.mode = wire::Mode::Asp;
  auto asp = Simulate(o);
  ASSERT_TRUE(asp.ok());
  // Each worker at its own pace: 2 x 64 per 7.2 ms plus 64 per 16.8 ms.
  const double alone = 2 * 64 / 7.2e-3 + 64 / 16.8e-3;
  EXPECT_NEAR(asp->throughput, alone, 0.01 * alone);
  EXPECT_EQ(asp->wait_fraction, 0);
  // The ideal splits B = 192 by speed (1 : 1 : 1/4): every iteration takes
  // T* = (192 + 4 ms x 45000/s) / 45000/s = 8.27 ms.
  EXPECT_NEAR(asp->ideal_throughput, 192 / ((192 + 4e-3 * 45000) / 45000), 50);
  o.mode = wire::Mode::Backup;
  o.backup_workers = 1;
  auto backup = Simulate(o);
  ASSERT_TRUE(backup.ok());
  EXPECT_GT(backup->dropped, 0u);
  // The two fast workers close every clock: 2 x 64 per 7.2 ms.
  EXPECT_NEAR(backup->throughput, 2 * 64 / 7.2e-3, 0.03 * 2 * 64 / 7.2e-3);
}

TEST(SimTest, SspAbsorbsAShortBurstThatBspWaitsFor) {
  SimOptions o = Base();
  o.scenario = Scenario::kBursts;
  o.burst_rate = 0.5;
  o.burst_seconds = 0.02;  // a few iterations
  o.seed = 5;
  auto bsp = Simulate(o);
  o.mode = wire::Mode::Ssp;
  o.staleness = 3;
  auto ssp = Simulate(o);
  ASSERT_TRUE(bsp.ok() && ssp.ok());
  EXPECT_GT(ssp->throughput, bsp->throughput);
}

// Random 4x bursts on 64 workers: some worker is always in one, so a
// synchronous policy waits on it unless it is re-sized fast (a level shift
// runs a round at the heartbeat that reports it) and the others may run
// ahead for the few clocks it loses before then (pacer's dssp bound).
TEST(SimTest, PacerAbsorbsBurstsAtScaleWhereBspAndSlowRoundsCannot) {
  SimOptions o = Base();
  o.workers = 64;
  o.scenario = Scenario::kBursts;
  o.seconds = 10;
  o.policy_interval = 0.25;
  auto bsp = Simulate(o);
  o.mode = wire::Mode::Dssp;
  o.policy = policy::Kind::kPacer;
  o.staleness = 8;
  o.staleness_range = 4;
  auto pacer = Simulate(o);
  o.level_shift = 0;  // rounds only every 0.25 s
  auto no_shift = Simulate(o);
  ASSERT_TRUE(bsp.ok() && pacer.ok() && no_shift.ok());
  EXPECT_LT(bsp->fraction, 0.7);
  EXPECT_GT(pacer->fraction, 0.9);
  EXPECT_GT(pacer->fraction, no_shift->fraction + 0.02);
  EXPECT_LT(pacer->min_batch * 2, 64u) << "some bursting worker holds a small batch";
}

TEST(SimTest, BadOptionsAreRefused) {
  SimOptions o = Base();
  o.workers = 0;
  EXPECT_FALSE(Simulate(o).ok());
  o = Base();
  o.staleness = 10;
  o.staleness_range = 10;
  EXPECT_FALSE(Simulate(o).ok());
  EXPECT_FALSE(ParseScenario("sideways").ok());
}

}  // namespace
}  // namespace pacer::sim
