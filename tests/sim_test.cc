// The cluster simulator (bench/cluster_sim.h) against figures worked out by
// hand, so that what bench/RESULTS.md reports from it can be trusted.
#include "bench/cluster_sim.h"

#include <gtest/gtest.h>

#include <cstdio>

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
  // Above 0.9 with the per-sample policy, which resized on any single
  // report 2x off; the calm policy (issue 18) confirms a shift on a report
  // whose every iteration moved, one heartbeat later where the first
  // straddles the burst's start: 0.89 here. The bursts table in
  // bench/RESULTS.md has the cost by size.
  EXPECT_GT(pacer->fraction, 0.88);
  EXPECT_GT(pacer->fraction, no_shift->fraction + 0.02);
  EXPECT_LT(pacer->min_batch * 2, 64u) << "some bursting worker holds a small batch";
}

// The noisy shared node of issue "a straggler policy that stays calm": the
// pacer policy over dssp as pacer-monitor runs it (s_L 0, r_max 4, rounds
// every 0.25 s, heartbeats every 0.1 s); compute per iteration 3 ms fixed +
// 100 x 50 us, 2 ms of communication: the fixed cost is 30% of a typical
// 10 ms iteration. Noise: each worker's compute x (1 + x(t)), x an
// Ornstein-Uhlenbeck process with standard deviation 0.15 and correlation
// time 0.5 s, clipped to +-30%.
SimOptions Noisy(int workers, uint64_t seed) {
  SimOptions o;
  o.workers = workers;
  o.batch = 100;
  o.seconds_per_sample = 50e-6;
  o.iteration_overhead = 3e-3;
  o.communication = 2e-3;
  o.mode = wire::Mode::Dssp;
  o.policy = policy::Kind::kPacer;
  o.staleness = 0;
  o.staleness_range = 4;
  o.policy_interval = 0.25;
  o.report_interval = 0.1;
  o.noise = 0.3;
  o.noise_seconds = 0.5;
  o.seconds = 60;
  o.seed = seed;
  return o;
}

TEST(SimTest, FairSharesEqualiseTrueIterationTimes) {
  // 3 workers, one 1.5x slow: (3 ms + b 50 us) f equal, b adding up to 300.
  const std::vector<double> b = FairShares({1, 1, 1.5}, 300, 50e-6, 3e-3);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_NEAR(b[0] + b[1] + b[2], 300, 1e-6);
  EXPECT_NEAR((3e-3 + b[0] * 50e-6) * 1, (3e-3 + b[2] * 50e-6) * 1.5, 1e-9);
  // 4x slow: its fixed 12 ms alone is more than the others' whole
  // iteration at 150: it gets the least batch, 1.
  const std::vector<double> s = FairShares({1, 1, 4}, 300, 50e-6, 3e-3);
  EXPECT_EQ(s[2], 1);
  EXPECT_NEAR(s[0], 149.5, 1e-6);
}

// Cases of the tests below that do not meet the bar yet (issue 18 is in
// progress): they are run, printed, and asserted to miss still, so that
// this list is kept true. Anything not listed must meet the bar.
struct KnownMiss {
  int workers;
  int scenario;  // Scenario, as int; -1: identical workers
  double factor;
  uint64_t seed;
};
const KnownMiss kKnownMisses[] = {
    {64, static_cast<int>(Scenario::kHetero), 2, 2},  // 83% of later steps in band
    {64, static_cast<int>(Scenario::kHetero), 2, 4},  // at its share from 4.1 s
};
bool KnownToMiss(int workers, int scenario, double factor, uint64_t seed) {
  for (const KnownMiss& m : kKnownMisses) {
    if (m.workers == workers && m.scenario == scenario && m.factor == factor && m.seed == seed) {
      return true;
    }
  }
  return false;
}

// Identical workers under noise: at least 95% of the samples are applied in
// steps where every batch is within [0.5, 1.5] x B/n, and no batch ever
// falls below 0.25 x B/n.
TEST(SimTest, IdenticalWorkersUnderNoiseKeepEvenBatches) {
  for (int workers : {3, 64}) {
    for (uint64_t seed = 1; seed <= 5; ++seed) {
      SCOPED_TRACE("workers " + std::to_string(workers) + ", seed " + std::to_string(seed));
      auto r = Simulate(Noisy(workers, seed));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_GE(r->min_batch_ratio, 0.25);
      EXPECT_GT(r->clocks, 1000u);
      if (KnownToMiss(workers, -1, 1, seed)) {
        std::printf("known miss: %d workers, seed %lu: %.4f stable\n", workers,
                    static_cast<unsigned long>(seed), r->stable_fraction);
        EXPECT_LT(r->stable_fraction, 0.95) << "meets the bar now: drop it from kKnownMisses";
        continue;
      }
      EXPECT_GE(r->stable_fraction, 0.95);
    }
  }
}

// Stragglers under the same noise, graded against the true speeds: every
// slow worker's batch is within 25% of its fair share within 2 s, and stays
// there in at least 90% of its later steps. One 4x straggler (its fixed
// cost alone, 12 ms, is more than the others' iteration: its fair share is
// the least batch, 1), one 1.5x, and speeds spread evenly over 1x..2x
// (hetero). With a 30% fixed cost, a slow worker's fair share is far more
// sensitive to its speed than its speed is: a 1.5x worker's 60 samples move
// by 12 (20%) for a 10% error in its speed.
struct StragglerCase {
  Scenario scenario;
  double factor;
};
const StragglerCase kStragglerCases[] = {
    {Scenario::kStatic, 4}, {Scenario::kStatic, 1.5}, {Scenario::kHetero, 2}};

bool MeetsStragglerBar(const SimResult& r) {
  return r.slow_workers > 0 && r.slow_reach_seconds >= 0 && r.slow_reach_seconds <= 2 &&
         r.slow_in_band_fraction >= 0.9;
}

TEST(SimTest, SlowWorkersUnderNoiseGetTheirFairShareFastAndKeepIt) {
  for (int workers : {3, 64}) {
    for (const StragglerCase& c : kStragglerCases) {
      for (uint64_t seed = 1; seed <= 5; ++seed) {
        SimOptions o = Noisy(workers, seed);
        o.scenario = c.scenario;
        o.slow_factor = c.factor;
        SCOPED_TRACE("workers " + std::to_string(workers) + ", scenario " +
                     std::to_string(static_cast<int>(c.scenario)) + " x" +
                     std::to_string(c.factor) + ", seed " + std::to_string(seed));
        auto r = Simulate(o);
        ASSERT_TRUE(r.ok()) << r.status();
        if (KnownToMiss(workers, static_cast<int>(c.scenario), c.factor, seed)) {
          std::printf("known miss: %d workers, scenario %d x%.1f, seed %lu: reached at %.2f s, "
                      "then %.3f in band\n", workers, static_cast<int>(c.scenario), c.factor,
                      static_cast<unsigned long>(seed), r->slow_reach_seconds,
                      r->slow_in_band_fraction);
          EXPECT_FALSE(MeetsStragglerBar(*r)) << "meets the bar now: drop it from kKnownMisses";
          continue;
        }
        EXPECT_TRUE(MeetsStragglerBar(*r))
            << r->slow_workers << " slow, reached at " << r->slow_reach_seconds
            << " s, then in band " << r->slow_in_band_fraction;
      }
    }
  }
}

// The bar above can fail: a policy that never moves misses it in every case.
TEST(SimTest, AFixedPolicyFailsTheStragglerBar) {
  for (const StragglerCase& c : kStragglerCases) {
    SimOptions o = Noisy(3, 1);
    o.policy = policy::Kind::kFixed;
    o.scenario = c.scenario;
    o.slow_factor = c.factor;
    auto r = Simulate(o);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(MeetsStragglerBar(*r)) << "scenario " << static_cast<int>(c.scenario);
  }
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


// The data stream in the simulator: BSP at the straggler's pace is the
// worked-out case (every clock 16.8 ms, 192 samples a clock: 2 epochs of
// 192000 samples take 2000 clocks, 33.6 s, and a few more for the short
// batches at chunk ends); with the pacer policy and the stream the epochs
// end near the floor the workers' speeds allow (the policy's first rounds,
// at even sizes, included), and each epoch's tail is short.
TEST(SimTest, DataStreamEpochsEndNearTheFloor) {
  SimOptions o = Base();
  o.scenario = Scenario::kStatic;
  o.slow_factor = 4;
  o.data_samples = 192000;
  o.epochs = 2;
  o.seconds = 60;
  auto bsp = Simulate(o);
  ASSERT_TRUE(bsp.ok()) << bsp.status();
  EXPECT_EQ(bsp->epochs_done, 2u);
  EXPECT_NEAR(bsp->epochs_seconds, 2000 * 16.8e-3, 0.4);
  o.policy = policy::Kind::kPacer;
  o.mode = wire::Mode::Dssp;
  o.staleness = 3;
  auto pacer = Simulate(o);
  ASSERT_TRUE(pacer.ok()) << pacer.status();
  EXPECT_EQ(pacer->epochs_done, 2u);
  EXPECT_LT(pacer->epochs_seconds, 0.75 * bsp->epochs_seconds);
  EXPECT_LT(pacer->epochs_seconds, 1.1 * pacer->epochs_floor_seconds);
  EXPECT_LT(pacer->max_tail_seconds, 0.5);
}

TEST(SimTest, DataStreamNeedsEpochs) {
  SimOptions o = Base();
  o.data_samples = 1000;
  EXPECT_FALSE(Simulate(o).ok());
}

}  // namespace
}  // namespace pacer::sim
