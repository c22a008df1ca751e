// The batch-size policy (monitor/policy.h): pure functions, no clock needed
// beyond the timestamps handed to the predictor.
#include "monitor/policy.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <random>

namespace pacer::policy {
namespace {

uint32_t Sum(const std::map<uint32_t, uint32_t>& b) {
  return std::accumulate(b.begin(), b.end(), 0u, [](uint32_t s, auto& kv) { return s + kv.second; });
}

// Runs `rounds` rounds of the rule on workers with fixed per-sample times.
std::map<uint32_t, uint32_t> RunRounds(const std::vector<double>& seconds_per_sample, int rounds,
                                 const BatchOptions& options, double comm = 0) {
  std::map<uint32_t, uint32_t> b;
  for (uint32_t i = 0; i < seconds_per_sample.size(); ++i) {
    b[i] = options.global_batch / static_cast<uint32_t>(seconds_per_sample.size());
  }
  for (int r = 0; r < rounds; ++r) {
    std::map<uint32_t, WorkerTiming> w;
    for (auto& [id, size] : b) w[id] = {size, seconds_per_sample[id], comm, 0};
    auto next = RebalanceBatches(w, options);
    EXPECT_TRUE(next.ok()) << next.status();
    b = *next;
  }
  return b;
}

TEST(PolicyTest, BatchesConvergeToSpeedProportionalShares) {
  BatchOptions o;
  o.global_batch = 192;
  // Worker 2 is 4x slower: shares 4:4:1 of 192 -> 85.3, 85.3, 21.3.
  auto b = RunRounds({0.001, 0.001, 0.004}, 3, o);
  EXPECT_EQ(Sum(b), 192u);
  EXPECT_NEAR(b[0], 85.3, 1.0);
  EXPECT_NEAR(b[1], 85.3, 1.0);
  EXPECT_NEAR(b[2], 21.3, 1.0);
  // Equal iteration times afterwards: a further round changes nothing.
  EXPECT_EQ(RunRounds({0.001, 0.001, 0.004}, 6, o), b);
}

TEST(PolicyTest, SumIsExactlyTheGlobalBatchForRandomInputs) {
  const unsigned seed = std::getenv("PACER_TEST_SEED") ? std::atoi(std::getenv("PACER_TEST_SEED"))
                                                       : std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed) + " (replay with PACER_TEST_SEED)");
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 64);
    BatchOptions o;
    o.global_batch = static_cast<uint32_t>(n + rng() % 4096);
    o.b_min = 1;
    o.b_max = o.global_batch;
    std::map<uint32_t, WorkerTiming> w;
    for (int i = 0; i < n; ++i) {
      w[static_cast<uint32_t>(i)] = {1 + static_cast<uint32_t>(rng() % 256),
                                     1e-4 * (1 + rng() % 100), 1e-3 * (rng() % 5), 0};
    }
    auto b = RebalanceBatches(w, o);
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(Sum(*b), o.global_batch) << "trial " << trial;
    for (auto& [id, size] : *b) {
      EXPECT_GE(size, o.b_min);
      EXPECT_LE(size, o.b_max);
    }
  }
}

TEST(PolicyTest, DeadbandHoldsSizesSteadyUnderNoise) {
  BatchOptions o;
  o.global_batch = 192;
  o.deadband = 0.05;
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.98, 1.02);  // +-2%, inside the band
  std::map<uint32_t, uint32_t> b = {{0, 64}, {1, 64}, {2, 64}};
  for (int r = 0; r < 50; ++r) {
    std::map<uint32_t, WorkerTiming> w;
    for (auto& [id, size] : b) w[id] = {size, 0.001 * noise(rng), 0, 0};
    auto next = RebalanceBatches(w, o);
    ASSERT_TRUE(next.ok());
    EXPECT_EQ(*next, b) << "round " << r;
  }
  // A real change (worker 2 twice as slow) does move the sizes.
  std::map<uint32_t, WorkerTiming> w = {{0, {64, 0.001, 0, 0}}, {1, {64, 0.001, 0, 0}},
                                        {2, {64, 0.002, 0, 0}}};
  auto moved = RebalanceBatches(w, o);
  ASSERT_TRUE(moved.ok());
  EXPECT_LT((*moved)[2], 64u);
  EXPECT_EQ(Sum(*moved), 192u);
}

TEST(PolicyTest, ClampsAndMemoryLimitsAreRespected) {
  BatchOptions o;
  o.global_batch = 192;
  o.b_min = 16;
  o.b_max = 80;
  // Worker 3 is 10x slower; the fast ones would want ~62 each, the slow one
  // ~6, which b_min raises to 16. Worker 1 fits only 40 in memory.
  std::map<uint32_t, WorkerTiming> w = {{0, {48, 0.001, 0, 0}},
                                        {1, {48, 0.001, 0, 40}},
                                        {2, {48, 0.001, 0, 0}},
                                        {3, {48, 0.010, 0, 0}}};
  auto b = RebalanceBatches(w, o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Sum(*b), 192u);
  EXPECT_EQ((*b)[3], 16u);
  EXPECT_LE((*b)[1], 40u);
  for (auto& [id, size] : *b) {
    EXPECT_GE(size, 16u) << id;
    EXPECT_LE(size, 80u) << id;
  }
}

TEST(PolicyTest, ImpossibleClampsAreAnError) {
  BatchOptions o;
  o.global_batch = 100;
  o.b_max = 20;  // 3 workers can hold at most 60
  std::map<uint32_t, WorkerTiming> w = {{0, {33, 0.001, 0, 0}}, {1, {33, 0.001, 0, 0}},
                                        {2, {34, 0.001, 0, 0}}};
  EXPECT_EQ(RebalanceBatches(w, o).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RebalanceBatches({}, o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(EwmaTrendPredictorTest, TracksLevelAndTrend) {
  EwmaTrendPredictor p(0.5, 0.3);
  TimePoint t{};
  EXPECT_FALSE(p.Predict(1).has_value());
  for (int i = 0; i < 30; ++i) p.Observe(1, 0.002, t);
  EXPECT_NEAR(*p.Predict(1), 0.002, 1e-9);
  // A worker slowing down steadily: the prediction runs ahead of the last
  // observation rather than lagging behind it.
  for (int i = 0; i < 30; ++i) p.Observe(2, 0.001 * (1 + i), t);
  EXPECT_GT(*p.Predict(2), 0.030);
  p.Forget(2);
  EXPECT_FALSE(p.Predict(2).has_value());
  EXPECT_TRUE(p.Predict(1).has_value());
}

TEST(EwmaTrendPredictorTest, AStepIsALevelShiftNotATrend) {
  TimePoint t{};
  EwmaTrendPredictor p(0.5, 0.3, 0.5);
  for (int i = 0; i < 10; ++i) p.Observe(1, 0.001, t);
  // A burst of load: 4x slower at once. Taken as the new level, not averaged
  // in over several observations.
  p.Observe(1, 0.004, t);
  EXPECT_NEAR(*p.Predict(1), 0.004, 1e-12);
  // And back: no downward trend carried below the true speed.
  p.Observe(1, 0.001, t);
  EXPECT_NEAR(*p.Predict(1), 0.001, 1e-12);
  // Noise inside the factor is smoothed as before.
  p.Observe(1, 0.0013, t);
  EXPECT_GT(*p.Predict(1), 0.001);
  EXPECT_LT(*p.Predict(1), 0.0013);
  // With shift detection off, Holt's smoothing lags behind the step.
  EwmaTrendPredictor q(0.5, 0.3, 0);
  for (int i = 0; i < 10; ++i) q.Observe(1, 0.001, t);
  q.Observe(1, 0.004, t);
  EXPECT_LT(*q.Predict(1), 0.0035);
}

// ---------------------------------------------------------------------------
// StragglerPolicy: the rounds the monitor runs, driven by a fake clock.

class StragglerPolicyTest : public ::testing::Test {
 protected:
  static PolicyOptions Options(Kind kind, wire::Mode mode = wire::Mode::Bsp) {
    PolicyOptions o;
    o.kind = kind;
    o.mode = mode;
    o.batch.global_batch = 192;
    o.interval = std::chrono::milliseconds(500);
    o.min_iterations = 2;
    return o;
  }
  // Every worker reports `iterations` iterations at its current batch with
  // seconds-per-sample `spp[id]` and 2 ms of communication each.
  void ReportAll(StragglerPolicy& p, const std::map<uint32_t, double>& spp, uint32_t iterations = 4) {
    for (const auto& [id, a] : p.assignments()) {
      TimingReport r;
      r.iterations = iterations;
      r.samples = uint64_t{a.batch} * iterations;
      r.compute_seconds = spp.at(id) * static_cast<double>(r.samples);
      r.communication_seconds = 0.002 * iterations;
      p.Report(id, r);
    }
  }
  static uint32_t Total(const StragglerPolicy& p) {
    uint32_t t = 0;
    for (const auto& [id, a] : p.assignments()) t += a.batch;
    return t;
  }
  FakeClock clock_{TimePoint{} + std::chrono::hours(1)};
};

TEST_F(StragglerPolicyTest, AdaptiveBatchConvergesToSpeedShareWithinAFewRounds) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  EXPECT_EQ(p.assignment(1).batch, 64u);
  EXPECT_EQ(Total(p), 192u);
  const std::map<uint32_t, double> spp = {{1, 1e-4}, {2, 1e-4}, {3, 4e-4}};  // 3 is 4x slow
  for (int round = 0; round < 4; ++round) {
    ReportAll(p, spp);
    p.Round(clock_.Now());
    EXPECT_EQ(Total(p), 192u) << "round " << round;
    clock_.Advance(std::chrono::milliseconds(500));
  }
  // Equal iteration times b_i * spp_i + comm: 4:4:1 -> about 85, 85, 21.
  EXPECT_NEAR(p.assignment(3).batch, 21.3, 2.0);
  EXPECT_NEAR(p.assignment(1).batch, 85.3, 2.0);
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  EXPECT_EQ(p.rounds(), 4u);
  EXPECT_LT(p.last_decision_seconds(), 0.01);
}

TEST_F(StragglerPolicyTest, RoundsWaitForTheIntervalAndForEveryWorkersReport) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2});
  // Only worker 1 reported: no round.
  TimingReport r{4, 256, 0.1, 0.01, 0, 0};
  p.Report(1, r);
  EXPECT_FALSE(p.Round(clock_.Now()));
  EXPECT_EQ(p.rounds(), 0u);
  TimingReport slow{4, 256, 0.4, 0.01, 0, 0};
  p.Report(2, slow);
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_EQ(p.rounds(), 1u);
  // Fresh reports, but the interval has not passed.
  p.Report(1, r);
  p.Report(2, slow);
  clock_.Advance(std::chrono::milliseconds(100));
  EXPECT_FALSE(p.Round(clock_.Now()));
  clock_.Advance(std::chrono::milliseconds(400));
  p.Round(clock_.Now());
  EXPECT_EQ(p.rounds(), 2u);
}

TEST_F(StragglerPolicyTest, ASpeedShiftRunsARoundAtOnce) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  const std::map<uint32_t, double> even = {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}};
  ReportAll(p, even);
  p.Round(clock_.Now());
  ASSERT_EQ(p.rounds(), 1u);
  clock_.Advance(std::chrono::milliseconds(10));
  auto report = [&](uint32_t id, double spp) {
    TimingReport r;
    r.iterations = 1;
    r.samples = p.assignment(id).batch;
    r.compute_seconds = spp * static_cast<double>(r.samples);
    r.communication_seconds = 0.002;
    p.Report(id, r);
  };
  // 30% slower: noise, not a shift; the round waits for its interval.
  report(3, 1.3e-4);
  EXPECT_FALSE(p.urgent());
  EXPECT_FALSE(p.Round(clock_.Now()));
  // 4x slower: the round runs now, 10 ms after the last one, with only
  // worker 3 having reported; the others keep their predictions.
  report(3, 4e-4);
  EXPECT_TRUE(p.urgent());
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_FALSE(p.urgent());
  EXPECT_EQ(p.rounds(), 2u);
  EXPECT_EQ(Total(p), 192u);
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  // With the shift rule off, the same report waits for the interval.
  PolicyOptions o = Options(Kind::kAdaptiveBatch);
  o.level_shift = 0;
  StragglerPolicy q(o);
  q.SetWorkers({1, 2, 3});
  ReportAll(q, even);
  q.Round(clock_.Now());
  clock_.Advance(std::chrono::milliseconds(10));
  TimingReport r{1, 64, 64 * 4e-4, 0.002, 0, 0};
  q.Report(3, r);
  EXPECT_FALSE(q.urgent());
  EXPECT_FALSE(q.Round(clock_.Now()));
}

TEST_F(StragglerPolicyTest, AShiftIsNotWateredDownByReportsFromBeforeIt) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}});
  p.Round(clock_.Now());
  clock_.Advance(std::chrono::milliseconds(100));
  // Twenty more iterations at the old speed, not yet used by any round...
  TimingReport before{20, 20 * 64, 20 * 64 * 1e-4, 20 * 0.002, 0, 0};
  p.Report(3, before);
  EXPECT_FALSE(p.urgent());
  // ...then two at 4x. Averaged together they would look 1.3x slow: noise.
  TimingReport after{2, 2 * 64, 2 * 64 * 4e-4, 2 * 0.002, 0, 0};
  p.Report(3, after);
  ASSERT_TRUE(p.urgent());
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  EXPECT_NEAR(*p.predicted_seconds_per_sample(3), 4e-4, 1e-9);
}

TEST_F(StragglerPolicyTest, AWorkerThatJustJoinedHoldsBackAnUrgentRound) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2});
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}});
  p.Round(clock_.Now());
  p.SetWorkers({1, 2, 3});  // 3 has no prediction and no report yet
  clock_.Advance(std::chrono::milliseconds(10));
  auto report = [&](uint32_t id, double spp) {
    const uint64_t samples = 2 * uint64_t{p.assignment(id).batch};
    p.Report(id, TimingReport{2, samples, spp * static_cast<double>(samples), 2 * 0.002, 0, 0});
  };
  report(2, 4e-4);
  EXPECT_TRUE(p.urgent());
  EXPECT_FALSE(p.Round(clock_.Now())) << "3 cannot be sized yet";
  EXPECT_TRUE(p.urgent()) << "still pending";
  // Once 3 has reported, the round goes ahead.
  report(3, 1e-4);
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_EQ(Total(p), 192u);
  EXPECT_LT(p.assignment(2).batch * 2, p.assignment(3).batch);
}

TEST_F(StragglerPolicyTest, PacerSizesAWorkerThatFellBehindToCatchUp) {
  for (uint32_t catch_up : {0u, 16u}) {
    PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
    o.staleness_range = 4;
    o.catch_up_iterations = catch_up;
    StragglerPolicy p(o);
    p.SetWorkers({1, 2, 3});
    // Equal speeds, but worker 3 is 8 clocks behind the others (DSSP let
    // them run ahead while it was slow).
    for (const auto& [id, a] : p.assignments()) {
      TimingReport r;
      r.iterations = 4;
      r.samples = uint64_t{a.batch} * 4;
      r.compute_seconds = 1e-4 * static_cast<double>(r.samples);
      r.communication_seconds = 0.008;
      r.clock = id == 3 ? 92 : 100;
      r.at = clock_.Now();
      p.Report(id, r);
    }
    p.Round(clock_.Now());
    EXPECT_EQ(Total(p), 192u);
    if (catch_up == 0) {
      EXPECT_NEAR(p.assignment(3).batch, 64, 1) << "no catch-up: speed shares only";
    } else {
      // Half the common iteration time (1 - 8/16): it gains a clock every
      // two iterations until level.
      EXPECT_LT(p.assignment(3).batch + 20, p.assignment(1).batch);
    }
  }
}

TEST_F(StragglerPolicyTest, FixedNeverMovesAndSplitsEvenly) {
  StragglerPolicy p(Options(Kind::kFixed));
  p.SetWorkers({1, 2, 3, 4, 5});  // 192 / 5 = 38.4: sizes 39,39,38,38,38
  EXPECT_EQ(Total(p), 192u);
  for (const auto& [id, a] : p.assignments()) EXPECT_TRUE(a.batch == 38 || a.batch == 39);
  const auto before = p.assignments();
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}, {4, 1e-4}, {5, 9e-4}});
  EXPECT_FALSE(p.Round(clock_.Now()));
  EXPECT_EQ(p.assignments(), before);
}

TEST_F(StragglerPolicyTest, JoinsAndLeavesKeepTheGlobalBatch) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 4e-4}});
  p.Round(clock_.Now());
  const uint32_t slow = p.assignment(3).batch;
  p.SetWorkers({1, 2, 3, 4});  // a newcomer gets an even share, others shrink
  EXPECT_EQ(Total(p), 192u);
  EXPECT_NEAR(p.assignment(4).batch, 48, 12);
  EXPECT_LE(p.assignment(3).batch, slow);
  p.SetWorkers({1, 4});  // two leave: their share goes to the rest
  EXPECT_EQ(Total(p), 192u);
  EXPECT_EQ(p.assignments().size(), 2u);
  EXPECT_FALSE(p.predicted_seconds_per_sample(3).has_value());
}

TEST_F(StragglerPolicyTest, BoundsFollowTheModeAndCanBeChanged) {
  PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
  o.staleness = 1;
  o.staleness_range = 4;
  StragglerPolicy p(o);
  p.SetWorkers({1, 2});
  EXPECT_EQ(p.assignment(1), (Assignment{96, 1, 4}));
  EXPECT_TRUE(p.SetBounds(2, 0, 2));
  EXPECT_EQ(p.assignment(2), (Assignment{96, 0, 2}));
  EXPECT_FALSE(p.SetBounds(9, 0, 2));

  PolicyOptions b = Options(Kind::kFixed, wire::Mode::Bsp);
  b.staleness = 3;  // ignored: bsp has no bound
  StragglerPolicy q(b);
  q.SetWorkers({1});
  EXPECT_EQ(q.assignment(1), (Assignment{192, 0, 0}));
}

TEST_F(StragglerPolicyTest, MemoryLimitCapsAWorker) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  // Worker 1 is the fastest but holds at most 70 samples.
  for (int round = 0; round < 4; ++round) {
    ReportAll(p, {{1, 0.5e-4}, {2, 1e-4}, {3, 1e-4}});
    p.Report(1, TimingReport{0, 0, 0, 0, 0, 70});
    p.Round(clock_.Now());
    clock_.Advance(std::chrono::seconds(1));
  }
  EXPECT_EQ(p.assignment(1).batch, 70u);
  EXPECT_EQ(Total(p), 192u);
}

TEST_F(StragglerPolicyTest, PacerOpensDsspSlackOnlyWhileOutOfBalance) {
  PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
  o.staleness_range = 4;
  StragglerPolicy p(o);
  p.SetWorkers({1, 2, 3});
  EXPECT_TRUE(p.slack_open());  // nothing measured yet
  EXPECT_EQ(p.assignment(1).staleness_range, 4u);
  // Balanced workers: the slack closes, reads stay fresh.
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}});
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_FALSE(p.slack_open());
  EXPECT_EQ(p.assignment(3).staleness_range, 0u);
  // Worker 3 turns 4x slow: measured times diverge, the slack opens while
  // the batch rule catches up ...
  clock_.Advance(std::chrono::seconds(1));
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 4e-4}});
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_TRUE(p.slack_open());
  EXPECT_GT(p.last_imbalance(), 0.1);
  EXPECT_EQ(p.assignment(1).staleness_range, 4u);
  // ... and closes once the sizes have absorbed it.
  for (int round = 0; round < 4 && p.slack_open(); ++round) {
    clock_.Advance(std::chrono::seconds(1));
    ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 4e-4}});
    p.Round(clock_.Now());
  }
  EXPECT_FALSE(p.slack_open());
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
}

TEST_F(StragglerPolicyTest, OperatorBoundsSurvivePacersSlack) {
  PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
  o.staleness_range = 4;
  StragglerPolicy p(o);
  p.SetWorkers({1, 2});
  ASSERT_TRUE(p.SetBounds(2, 1, 2));
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}});  // balanced: pacer closes the slack
  p.Round(clock_.Now());
  ASSERT_FALSE(p.slack_open());
  EXPECT_EQ(p.assignment(1).staleness_range, 0u);
  EXPECT_EQ(p.assignment(2), (Assignment{96, 1, 2}));
  p.SetWorkers({1, 2, 3});  // a newcomer joins with the slack closed
  EXPECT_EQ(p.assignment(3).staleness_range, 0u);
}

TEST_F(StragglerPolicyTest, MemoryLimitCutsABatchEvenUnderFixed) {
  StragglerPolicy p(Options(Kind::kFixed));
  p.SetWorkers({1, 2, 3});
  p.Report(1, TimingReport{0, 0, 0, 0, 0, 50});
  EXPECT_EQ(p.assignment(1).batch, 50u);
  EXPECT_EQ(Total(p), 192u);
  EXPECT_EQ(p.assignment(2).batch + p.assignment(3).batch, 142u);
}

TEST_F(StragglerPolicyTest, PacerSlackHasHysteresisAgainstNoise) {
  PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
  o.staleness_range = 4;
  o.batch.deadband = 0.99;  // keep sizes still: only the slack is under test
  StragglerPolicy p(o);
  p.SetWorkers({1, 2});
  auto round = [&](double spp2) {
    clock_.Advance(std::chrono::seconds(1));
    ReportAll(p, {{1, 1e-4}, {2, spp2}});
    p.Round(clock_.Now());
  };
  round(1e-4);  // balanced: closes
  ASSERT_FALSE(p.slack_open());
  // 96 x 1.3e-4 + 2 ms against 96 x 1e-4 + 2 ms: about 12% over the mean,
  // noise-sized: stays closed.
  round(1.3e-4);
  EXPECT_FALSE(p.slack_open()) << p.last_imbalance();
  round(4e-4);  // a real straggler: opens
  EXPECT_TRUE(p.slack_open());
  round(1.3e-4);  // still above the closing threshold: stays open
  EXPECT_TRUE(p.slack_open()) << p.last_imbalance();
  round(1e-4);
  EXPECT_FALSE(p.slack_open());
}

TEST(PolicyKindTest, NamesRoundTrip) {
  for (Kind k : {Kind::kFixed, Kind::kAdaptiveBatch, Kind::kPacer}) {
    EXPECT_EQ(ParseKind(KindName(k)), k);
  }
  EXPECT_FALSE(ParseKind("fastest").has_value());
}

}  // namespace
}  // namespace pacer::policy
