// The batch-size policy (monitor/policy.h): pure functions, no clock needed
// beyond the timestamps handed to the predictor.
#include "monitor/policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
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

// Sums of per-iteration (batch, compute) pairs from t = 3 ms + b x 50 us.
CostSums SumsOf(const std::vector<double>& batches) {
  CostSums s;
  for (double b : batches) {
    const double t = 3e-3 + b * 50e-6;
    s.n += 1, s.b += b, s.t += t, s.bb += b * b, s.bt += b * t;
  }
  return s;
}

TEST(CostFitTest, FitsTheFixedCostFromBatchesThatVaried) {
  // a / c = 3 ms / 50 us = 60 samples.
  auto k = FitFixedSamples(SumsOf({80, 120, 100, 90, 110, 100}), 400);
  ASSERT_TRUE(k.has_value());
  EXPECT_NEAR(*k, 60, 1e-6);
  // Every batch the same: nothing to fit an intercept from.
  EXPECT_FALSE(FitFixedSamples(SumsOf({100, 100, 100, 100, 100}), 400).has_value());
  EXPECT_FALSE(FitFixedSamples(SumsOf({80, 120, 100}), 400).has_value()) << "too few";
}

TEST(CostFitTest, AReportWithoutSquaresIsTakenAtItsMeanBatch) {
  TimingReport r{4, 400, 0.032, 0.008, 0, 0};
  const TimingReport c = r.Completed();
  EXPECT_DOUBLE_EQ(c.batch_squares, 4 * 100.0 * 100);
  EXPECT_DOUBLE_EQ(c.batch_compute, 100 * 0.032);
  // Two windows at different batches add up to what a fit needs.
  TimingReport a{2, 100, 2 * (3e-3 + 50 * 50e-6), 0, 0, 0};
  TimingReport b{2, 300, 2 * (3e-3 + 150 * 50e-6), 0, 0, 0};
  a += b;
  EXPECT_DOUBLE_EQ(a.batch_squares, 2 * 50.0 * 50 + 2 * 150.0 * 150);
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
    o.probe = 0;  // on where a test is about probing
    o.warmup_reports = 0;
    o.shift_min_iterations = 0;
    o.shift_seconds = 0;  // two reports in a row confirm
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
  // One report from `id`, stamped now: `iterations` iterations at its
  // current batch, `spp` seconds per sample, 4 ms of communication in all.
  void ReportNow(StragglerPolicy& p, uint32_t id, double spp, uint32_t iterations) {
    TimingReport r;
    r.iterations = iterations;
    r.samples = uint64_t{iterations} * p.assignment(id).batch;
    r.compute_seconds = spp * static_cast<double>(r.samples);
    r.communication_seconds = 0.004;
    r.at = clock_.Now();
    p.Report(id, r);
  }
  // Workers 1-3 report 1e-4 s a sample every 0.1 s for 0.5 s, then a round.
  void WarmEvery100ms(StragglerPolicy& p, uint32_t iterations) {
    for (int i = 0; i < 5; ++i) {
      for (uint32_t id : {1, 2, 3}) ReportNow(p, id, 1e-4, iterations);
      clock_.Advance(std::chrono::milliseconds(100));
    }
    p.Round(clock_.Now());
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
  for (int round = 0; round < 8; ++round) {
    ReportAll(p, spp);
    p.Round(clock_.Now());
    EXPECT_EQ(Total(p), 192u) << "round " << round;
    // The first sizing goes all the way: the even start is no decision.
    if (round == 0) {
      EXPECT_NEAR(p.assignment(3).batch, 21.3, 2.0) << "first sizing";
    }
    clock_.Advance(std::chrono::milliseconds(500));
  }
  // Equal iteration times b_i * spp_i + comm: 4:4:1 -> about 85, 85, 21.
  EXPECT_NEAR(p.assignment(3).batch, 21.3, 3.0);
  EXPECT_NEAR(p.assignment(1).batch, 85.3, 3.0);
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  EXPECT_EQ(p.rounds(), 8u);
  EXPECT_EQ(p.rounds(RoundReason::kInterval), 8u);
  EXPECT_EQ(p.rounds(RoundReason::kMembership), 1u);
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

// With shift_seconds 0 (Options above): two reports in a row confirm.
TEST_F(StragglerPolicyTest, ALevelShiftIsConfirmedByASecondReportThenActedOnAtOnce) {
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
  // 20% slower: noise, not a shift; the round waits for its interval.
  report(3, 1.2e-4);
  EXPECT_FALSE(p.urgent());
  EXPECT_FALSE(p.Round(clock_.Now()));
  // 1.8x slower once: past the bar (1.5x, and 3x its spread), so suspect,
  // but nothing happens yet.
  report(3, 1.8e-4);
  EXPECT_FALSE(p.urgent());
  EXPECT_FALSE(p.Round(clock_.Now()));
  EXPECT_EQ(p.level_shifts(), 0u);
  // The next report confirms it: the round runs now, 10 ms after the last
  // one, with only worker 3 having reported, and worker 3 moves all the way.
  report(3, 1.8e-4);
  EXPECT_TRUE(p.urgent());
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_FALSE(p.urgent());
  EXPECT_EQ(p.rounds(), 2u);
  EXPECT_EQ(p.rounds(RoundReason::kLevelShift), 1u);
  EXPECT_EQ(p.last_reason(), RoundReason::kLevelShift);
  EXPECT_EQ(Total(p), 192u);
  // Equal b spp + 2 ms adding up to 192: T = 9.5 ms, worker 3 at
  // (T - 2 ms) / 180 us = 42.
  EXPECT_NEAR(p.assignment(3).batch, 42, 3);
  // With the shift rule off, the same reports wait for the interval.
  PolicyOptions o = Options(Kind::kAdaptiveBatch);
  o.level_shift = 0;
  StragglerPolicy q(o);
  q.SetWorkers({1, 2, 3});
  ReportAll(q, even);
  q.Round(clock_.Now());
  clock_.Advance(std::chrono::milliseconds(10));
  TimingReport r{1, 64, 64 * 4e-4, 0.002, 0, 0};
  q.Report(3, r);
  q.Report(3, r);
  EXPECT_FALSE(q.urgent());
  EXPECT_FALSE(q.Round(clock_.Now()));
}

// On a noisy node bursts last a fraction of a second (a co-located job's
// busy slice): a streak of slow reports is a level shift only once it has
// lasted shift_seconds, however far off it is.
TEST_F(StragglerPolicyTest, AShiftIsConfirmedOnlyOnceItHasLasted) {
  for (int streak : {5, 6}) {  // 0.4 s and 0.5 s of slow reports
    PolicyOptions o = Options(Kind::kAdaptiveBatch);
    o.shift_seconds = 0.5;
    o.shift_iterations = 0;  // the streak's weight alone (next test) would confirm it
    StragglerPolicy p(o);
    p.SetWorkers({1, 2, 3});
    WarmEvery100ms(p, 2);
    // Worker 4x slow, far past the bar, reporting every 0.1 s.
    for (int i = 0; i < streak; ++i) {
      EXPECT_FALSE(p.urgent()) << "streak " << streak << ", report " << i;
      ReportNow(p, 3, 4e-4, 2);
      clock_.Advance(std::chrono::milliseconds(100));
    }
    if (streak == 5) {
      EXPECT_FALSE(p.urgent()) << "a 0.4 s burst is noise";
      EXPECT_EQ(p.level_shifts(), 0u);
    } else {
      EXPECT_TRUE(p.urgent()) << "0.5 s after the first slow report";
      EXPECT_TRUE(p.Round(clock_.Now()));
      EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
    }
  }
}

// A worker that got quicker holds up nobody, so its bar is higher
// (level_shift_faster): a noisy node's quick spell, 1.6x under a model that
// still remembers its slow spells, is left to the damped rounds, while the
// same factor slower is a shift, and so is a 4x straggler's recovery.
TEST_F(StragglerPolicyTest, AQuickerWorkerHasAHigherBarThanASlowerOne) {
  struct Case {
    double spp;  // the streak's seconds per sample (all were 1e-4 before)
    bool shift;
  };
  for (const Case c : {Case{1e-4 / 1.6, false}, Case{1.6e-4, true}, Case{0.25e-4, true}}) {
    SCOPED_TRACE("seconds per sample " + std::to_string(c.spp));
    PolicyOptions o = Options(Kind::kAdaptiveBatch);
    ASSERT_EQ(o.level_shift, 0.5);
    ASSERT_EQ(o.level_shift_faster, 0.7);
    StragglerPolicy p(o);
    p.SetWorkers({1, 2, 3});
    // One iteration a report: only the two-report rule applies.
    WarmEvery100ms(p, 1);
    for (int i = 0; i < 3; ++i) {
      ReportNow(p, 3, c.spp, 1);
      clock_.Advance(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(p.urgent(), c.shift);
    EXPECT_EQ(p.level_shifts(), c.shift ? 1u : 0u);
  }
}

// A streak heavy with evidence is confirmed before shift_seconds: at least
// shift_iterations iterations, off by more than 2x all together, with the
// most extreme iteration left out (a single descheduled iteration, however
// long, cannot make a streak heavy).
TEST_F(StragglerPolicyTest, AStreakOfManySlowIterationsIsConfirmedAtOnce) {
  PolicyOptions o = Options(Kind::kAdaptiveBatch);
  o.shift_seconds = 10;  // the duration rule never confirms here
  ASSERT_EQ(o.shift_iterations, 6u);
  auto warm = [&](StragglerPolicy& p) {
    p.SetWorkers({1, 2, 3});
    for (int i = 0; i < 4; ++i) {
      ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}});
      p.Round(clock_.Now());
      clock_.Advance(std::chrono::milliseconds(500));
    }
  };
  // The heartbeat of `iterations` iterations of worker 3 whose compute is
  // `times` x the model's per-sample 100 us, quickest and slowest given.
  auto report = [](StragglerPolicy& p, uint32_t iterations, double times, double quickest,
                   double slowest) {
    const uint32_t b = p.assignment(3).batch;
    TimingReport r;
    r.iterations = iterations;
    r.samples = uint64_t{b} * iterations;
    r.compute_seconds = times * 1e-4 * static_cast<double>(r.samples);
    r.min_compute = quickest * 1e-4 * b;
    r.max_compute = slowest * 1e-4 * b;
    r.communication_seconds = 0.002 * iterations;
    p.Report(3, r);
  };
  {
    // One iteration per heartbeat (the real worker's rhythm), each 3x slow:
    // suspects, until the sixth makes the streak heavy enough.
    StragglerPolicy p(o);
    warm(p);
    for (int i = 0; i < 5; ++i) {
      report(p, 1, 3, 3, 3);
      EXPECT_FALSE(p.urgent()) << "report " << i;
    }
    report(p, 1, 3, 3, 3);
    EXPECT_TRUE(p.urgent());
    EXPECT_EQ(p.level_shifts(), 1u);
  }
  {
    // A window that straddles the start of a 4x slowdown: 14 iterations,
    // 3x slow on average, the quickest at the old speed (so not every
    // iteration moved): confirmed by its weight.
    StragglerPolicy p(o);
    warm(p);
    report(p, 14, 3, 1, 4);
    EXPECT_TRUE(p.urgent());
  }
  {
    // 14 iterations, one of them stalled 30x: 3.1x on average, but without
    // the stall the others were on time. Not a shift.
    StragglerPolicy p(o);
    warm(p);
    report(p, 14, (13 + 30) / 14.0, 1, 30);
    EXPECT_FALSE(p.urgent());
    EXPECT_EQ(p.level_shifts(), 0u);
  }
  {
    // Off by 1.8x (suspect, but under 2x) for 30 iterations: left to the
    // duration rule.
    StragglerPolicy p(o);
    warm(p);
    for (int i = 0; i < 30; ++i) report(p, 1, 1.8, 1.8, 1.8);
    EXPECT_FALSE(p.urgent());
  }
}

// Noise is not a level shift: one slow heartbeat among ordinary ones runs
// no round and moves nobody at once (the old policy resized worker 3 to
// about 1/2.5 of the others on it, in the reply). Unconfirmed, it joins the
// model as ordinary data: the next round moves worker 3 by a few percent.
TEST_F(StragglerPolicyTest, ASingleSlowReportIsNotALevelShift) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  const std::map<uint32_t, double> even = {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}};
  for (int round = 0; round < 4; ++round) {
    ReportAll(p, even);
    p.Round(clock_.Now());
    clock_.Advance(std::chrono::milliseconds(500));
  }
  const auto before = p.assignments();
  // One window 2.5x slow (the old policy's bar was 2x), then back to normal.
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 2.5e-4}});
  EXPECT_FALSE(p.urgent());
  EXPECT_FALSE(p.Round(clock_.Now())) << "no round before the interval";
  EXPECT_EQ(p.assignments(), before);
  ReportAll(p, even);
  EXPECT_FALSE(p.urgent());
  EXPECT_EQ(p.level_shifts(), 0u);
  clock_.Advance(std::chrono::milliseconds(500));
  p.Round(clock_.Now());
  EXPECT_NEAR(p.assignment(3).batch, before.at(3).batch, 0.1 * before.at(3).batch);
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
  // ...then two reports at 4x. Averaged in they would look 1.3x slow.
  TimingReport after{2, 2 * 64, 2 * 64 * 4e-4, 2 * 0.002, 0, 0};
  p.Report(3, after);
  p.Report(3, after);
  ASSERT_TRUE(p.urgent());
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  EXPECT_NEAR(p.cost(3)->per_sample_seconds, 4e-4, 1e-9);
}

TEST_F(StragglerPolicyTest, AWorkerThatJustJoinedHoldsBackAnUrgentRound) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2});
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}});
  p.Round(clock_.Now());
  p.SetWorkers({1, 2, 3});  // 3 has no model and no report yet
  clock_.Advance(std::chrono::milliseconds(10));
  auto report = [&](uint32_t id, double spp) {
    const uint64_t samples = 2 * uint64_t{p.assignment(id).batch};
    p.Report(id, TimingReport{2, samples, spp * static_cast<double>(samples), 2 * 0.002, 0, 0});
  };
  report(2, 4e-4);
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

// Identical workers with a 3 ms fixed cost (30% of the iteration) and one
// noisy window: the probes teach the pooled fixed cost (3 ms / 50 us = 60
// samples) and the sizes come back to even. (Without noise in the later
// reports a per-sample-only model would come back too; the fit is what this
// checks.)
TEST_F(StragglerPolicyTest, TheFixedCostIsLearntFromProbesAndSizesComeBackEven) {
  PolicyOptions o = Options(Kind::kAdaptiveBatch);
  o.probe = 0.2;
  StragglerPolicy p(o);
  p.SetWorkers({1, 2, 3});
  auto report_all = [&](double slow3) {
    for (const auto& [id, a] : p.assignments()) {
      TimingReport r;
      r.iterations = 4;
      r.samples = uint64_t{a.batch} * 4;
      r.compute_seconds = 4 * (3e-3 + a.batch * 50e-6) * (id == 3 ? slow3 : 1);
      r.communication_seconds = 4 * 4e-3;
      p.Report(id, r);
    }
  };
  report_all(1.25);  // one window 25% slow: noise the rule acts on a little
  p.Round(clock_.Now());
  EXPECT_LT(p.assignment(3).batch, 64u);
  for (int round = 0; round < 60; ++round) {
    clock_.Advance(std::chrono::milliseconds(500));
    report_all(1);
    p.Round(clock_.Now());
    for (const auto& [id, a] : p.assignments()) {
      EXPECT_GE(a.batch, 32u) << "round " << round << " worker " << id;
    }
  }
  EXPECT_NEAR(p.assignment(3).batch, 64, 64 * 0.1);
  EXPECT_NEAR(p.fixed_cost_samples(), 60, 20) << "3 ms / 50 us";
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
      // Half the common iteration time (1 - 8/16) would leave it 22 of 64
      // samples; catch-up never takes more than half: 32, then scaled up
      // with the others to add up to B (32 x 192 / 160 = 38).
      EXPECT_LT(p.assignment(3).batch + 8, p.assignment(1).batch);
      EXPECT_GE(p.assignment(3).batch, 32u);
    }
  }
}

// Lags that DSSP's slack covers (up to r_max clocks) are left to it: noise
// makes such lags all the time, and sizing them away swings the batches.
// Past that, catch-up never takes a worker below 3/4 of its target while it
// is within s_L of the others, nor below half once it holds them at the
// bound.
TEST_F(StragglerPolicyTest, CatchUpLeavesSmallLagsToTheSlackAndNeverStarves) {
  struct Case {
    uint64_t lag;
    uint32_t s_l;
    uint32_t batch;  // worker 3's
  };
  // 3/4 of 64 = 48, then all three scaled up together to add up to B:
  // 48 x 192 / 176 = 52; half: 32 x 192 / 160 = 38 (half the common
  // iteration time alone would leave it 22).
  for (const Case c : {Case{3, 0, 64}, Case{6, 8, 52}, Case{12, 8, 38}, Case{40, 0, 38}}) {
    SCOPED_TRACE("lag " + std::to_string(c.lag) + ", s_L " + std::to_string(c.s_l));
    PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
    o.staleness = c.s_l;
    o.staleness_range = 4;
    o.damping = 1;
    StragglerPolicy p(o);
    p.SetWorkers({1, 2, 3});
    for (const auto& [id, a] : p.assignments()) {
      TimingReport r;
      r.iterations = 4;
      r.samples = uint64_t{a.batch} * 4;
      r.compute_seconds = 1e-4 * static_cast<double>(r.samples);
      r.communication_seconds = 0.008;
      r.clock = id == 3 ? 100 - c.lag : 100;
      r.at = clock_.Now();
      p.Report(id, r);
    }
    p.Round(clock_.Now());
    EXPECT_NEAR(p.assignment(3).batch, c.batch, 1);
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
  EXPECT_FALSE(p.cost(3).has_value());
  EXPECT_EQ(p.rounds(RoundReason::kMembership), 3u);
}

TEST_F(StragglerPolicyTest, BoundsFollowTheModeAndCanBeChanged) {
  PolicyOptions o = Options(Kind::kPacer, wire::Mode::Dssp);
  o.staleness = 1;
  o.staleness_range = 4;
  StragglerPolicy p(o);
  p.SetWorkers({1, 2});
  EXPECT_EQ(p.assignment(1), (Assignment{96, 1, 0}));  // pacer's slack starts closed
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
  EXPECT_FALSE(p.slack_open());  // fresh reads until something needs the slack
  EXPECT_EQ(p.assignment(1).staleness_range, 0u);
  // Worker 3 is 4x slow from the start: the first round sizes everyone,
  // and the slack waits for those sizes (stale reads while they take
  // effect cost steps) ...
  for (int round = 0; round < 4; ++round) {
    ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 4e-4}});
    p.Round(clock_.Now());
    if (round == 0) {
      EXPECT_GT(p.last_imbalance(), 0.25);
    }
    EXPECT_FALSE(p.slack_open()) << "round " << round << ": " << p.last_imbalance();
    clock_.Advance(std::chrono::seconds(1));
  }
  // ... which absorb it.
  EXPECT_LT(p.assignment(3).batch * 2, p.assignment(1).batch);
  // Worker 1 turns 4x slow mid-run (two reports confirm it): it is already
  // behind, so the slack opens while the batch rule catches up ...
  ReportAll(p, {{1, 4e-4}, {2, 1e-4}, {3, 4e-4}});
  ReportAll(p, {{1, 4e-4}, {2, 1e-4}, {3, 4e-4}});
  EXPECT_TRUE(p.Round(clock_.Now()));
  EXPECT_EQ(p.last_reason(), RoundReason::kLevelShift);
  EXPECT_TRUE(p.slack_open());
  EXPECT_EQ(p.assignment(2).staleness_range, 4u);
  // ... and closes once the sizes have absorbed it.
  for (int round = 0; round < 6 && p.slack_open(); ++round) {
    clock_.Advance(std::chrono::seconds(1));
    ReportAll(p, {{1, 4e-4}, {2, 1e-4}, {3, 4e-4}});
    p.Round(clock_.Now());
  }
  EXPECT_FALSE(p.slack_open());
  EXPECT_LT(p.assignment(1).batch * 2, p.assignment(2).batch);
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
    // Twice: a change past the shift bar needs a second report.
    ReportAll(p, {{1, 1e-4}, {2, spp2}});
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
  round(1.3e-4);  // a shift back (an urgent round, which never closes it)
  round(1.3e-4);  // a regular round, still above the closing threshold: stays open
  EXPECT_EQ(p.last_reason(), RoundReason::kInterval);
  EXPECT_TRUE(p.slack_open()) << p.last_imbalance();
  round(1e-4);
  EXPECT_FALSE(p.slack_open());
}

// A peer that lies (or a broken clock) must not poison every worker's size:
// timings that cannot be true are ignored, and the sizes stay finite.
TEST_F(StragglerPolicyTest, ImpossibleTimingsAreIgnored) {
  StragglerPolicy p(Options(Kind::kAdaptiveBatch));
  p.SetWorkers({1, 2, 3});
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}});
  p.Round(clock_.Now());
  const auto before = p.assignments();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<TimingReport> lies;
  lies.push_back(TimingReport{4, 256, nan, 0.008, 0, 0});
  lies.push_back(TimingReport{4, 256, inf, 0.008, 0, 0});
  lies.push_back(TimingReport{4, 256, -1, 0.008, 0, 0});
  TimingReport squares{4, 256, 0.03, 0.008, 0, 0};
  squares.batch_squares = 10;  // below 256^2 / 4: no four batches add up to that
  lies.push_back(squares);
  TimingReport range{4, 256, 0.03, 0.008, 0, 0};
  range.min_compute = 0.01;
  range.max_compute = 0.005;
  lies.push_back(range);
  for (const TimingReport& r : lies) {
    EXPECT_FALSE(r.Plausible());
    for (int i = 0; i < 3; ++i) p.Report(3, r);
  }
  EXPECT_EQ(p.implausible_reports(), 15u);
  EXPECT_FALSE(p.urgent());
  clock_.Advance(std::chrono::seconds(1));
  ReportAll(p, {{1, 1e-4}, {2, 1e-4}, {3, 1e-4}});
  p.Round(clock_.Now());
  EXPECT_EQ(p.assignments(), before);
  EXPECT_TRUE(std::isfinite(p.cost(3)->per_sample_seconds));
  EXPECT_TRUE(TimingReport({4, 256, 0.03, 0.008, 0, 0}).Plausible());
}

TEST(PolicyKindTest, NamesRoundTrip) {
  for (Kind k : {Kind::kFixed, Kind::kAdaptiveBatch, Kind::kPacer}) {
    EXPECT_EQ(ParseKind(KindName(k)), k);
  }
  EXPECT_FALSE(ParseKind("fastest").has_value());
}

}  // namespace
}  // namespace pacer::policy
