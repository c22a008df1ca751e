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

}  // namespace
}  // namespace pacer::policy
