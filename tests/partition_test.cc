// Tests of PartitionByBytes (ps/partition.h): balance by bytes, and the
// coverage and contiguity invariants of the ranges.
#include "ps/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace pacer {
namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

std::vector<wire::KeyLen> Keys(const std::vector<uint64_t>& lengths, uint64_t first = 0,
                               uint64_t stride = 1) {
  std::vector<wire::KeyLen> keys;
  for (size_t i = 0; i < lengths.size(); ++i) keys.emplace_back(first + i * stride, lengths[i]);
  return keys;
}

// The index of the one range holding `key`; fails the test when not exactly one.
size_t OwnerOf(const std::vector<KeyRange>& ranges, uint64_t key) {
  size_t owner = ranges.size();
  int count = 0;
  for (size_t s = 0; s < ranges.size(); ++s) {
    if (ranges[s].Contains(key)) {
      owner = s;
      ++count;
    }
  }
  EXPECT_EQ(count, 1) << "key " << key << " is owned by " << count << " ranges";
  return owner;
}

// Parameter count (bytes / sizeof(float)) per shard.
std::vector<uint64_t> LoadPerShard(const std::vector<KeyRange>& ranges,
                                   const std::vector<wire::KeyLen>& keys) {
  std::vector<uint64_t> load(ranges.size(), 0);
  for (const auto& k : keys) {
    size_t s = OwnerOf(ranges, k.key());
    if (s < load.size()) load[s] += k.length();
  }
  return load;
}

// First begins at 0, last ends at UINT64_MAX, each begins where the previous
// ends, none is inverted, and every key lies in exactly one range.
void ExpectCoverage(const std::vector<KeyRange>& ranges, const std::vector<wire::KeyLen>& keys,
                    size_t num_shards) {
  ASSERT_EQ(ranges.size(), num_shards);
  EXPECT_EQ(ranges.front().begin, 0u);
  EXPECT_EQ(ranges.back().end, kMax);
  for (size_t s = 0; s < ranges.size(); ++s) {
    EXPECT_LE(ranges[s].begin, ranges[s].end) << "range " << s;
    if (s > 0) {
      EXPECT_EQ(ranges[s].begin, ranges[s - 1].end) << "range " << s;
    }
  }
  for (const auto& k : keys) OwnerOf(ranges, k.key());
}

TEST(PartitionTest, EqualKeysSplitEvenly) {
  auto keys = Keys({100, 100, 100, 100});
  auto ranges = PartitionByBytes(keys, 2);
  ExpectCoverage(ranges, keys, 2);
  EXPECT_EQ(OwnerOf(ranges, 0), 0u);
  EXPECT_EQ(OwnerOf(ranges, 1), 0u);
  EXPECT_EQ(OwnerOf(ranges, 2), 1u);
  EXPECT_EQ(OwnerOf(ranges, 3), 1u);
  EXPECT_EQ(LoadPerShard(ranges, keys), (std::vector<uint64_t>{200, 200}));
}

TEST(PartitionTest, BalancesBytesNotKeyCounts) {
  // One 300-value key and three 100-value keys: 300 | 300, not 2 keys | 2 keys.
  auto keys = Keys({300, 100, 100, 100}, /*first=*/10, /*stride=*/10);
  auto ranges = PartitionByBytes(keys, 2);
  ExpectCoverage(ranges, keys, 2);
  EXPECT_EQ(LoadPerShard(ranges, keys), (std::vector<uint64_t>{300, 300}));
}

TEST(PartitionTest, HugeKeyGetsAShardOfItsOwn) {
  std::vector<uint64_t> lengths = {1000};
  for (int i = 0; i < 10; ++i) lengths.push_back(10);
  auto keys = Keys(lengths);
  auto ranges = PartitionByBytes(keys, 2);
  ExpectCoverage(ranges, keys, 2);
  EXPECT_EQ(LoadPerShard(ranges, keys), (std::vector<uint64_t>{1000, 100}));
}

TEST(PartitionTest, HugeKeyInTheMiddle) {
  auto keys = Keys({10, 10, 10, 10, 10, 1000, 10, 10, 10, 10, 10});
  auto ranges = PartitionByBytes(keys, 2);
  ExpectCoverage(ranges, keys, 2);
  auto load = LoadPerShard(ranges, keys);
  // Whole keys allow 50 | 1050 or 1050 | 50, nothing better.
  EXPECT_EQ(std::max(load[0], load[1]), 1050u);
  EXPECT_EQ(std::min(load[0], load[1]), 50u);
}

TEST(PartitionTest, MoreShardsThanKeysLeavesEmptyRanges) {
  auto keys = Keys({5, 5, 5}, /*first=*/100, /*stride=*/100);
  auto ranges = PartitionByBytes(keys, 5);
  ExpectCoverage(ranges, keys, 5);
  auto load = LoadPerShard(ranges, keys);
  EXPECT_EQ(std::count(load.begin(), load.end(), 0u), 2);
  EXPECT_EQ(std::count(load.begin(), load.end(), 5u), 3);
}

TEST(PartitionTest, NoKeysStillCoversKeySpace) {
  std::vector<wire::KeyLen> keys;
  ExpectCoverage(PartitionByBytes(keys, 3), keys, 3);
}

TEST(PartitionTest, OneShardOwnsEverything) {
  auto keys = Keys({7, 1, 9000, 3}, /*first=*/0, /*stride=*/uint64_t{1} << 60);
  auto ranges = PartitionByBytes(keys, 1);
  ASSERT_EQ(ranges.size(), 1u);
  EXPECT_EQ(ranges[0].begin, 0u);
  EXPECT_EQ(ranges[0].end, kMax);
  for (const auto& k : keys) EXPECT_TRUE(ranges[0].Contains(k.key()));
}

TEST(PartitionTest, ZeroLengthKeysAreStillOwned) {
  auto keys = Keys({0, 0, 0, 0});
  ExpectCoverage(PartitionByBytes(keys, 2), keys, 2);
}

uint64_t TestSeed() {
  if (const char* s = std::getenv("PACER_TEST_SEED")) return std::strtoull(s, nullptr, 10);
  return std::random_device{}();
}

TEST(PartitionTest, RandomizedBalanceBound) {
  const uint64_t seed = TestSeed();
  std::cout << "PartitionTest seed " << seed << " (replay with PACER_TEST_SEED=" << seed << ")\n";
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 500; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const size_t num_keys = std::uniform_int_distribution<size_t>(0, 60)(rng);
    const size_t num_shards = std::uniform_int_distribution<size_t>(1, 10)(rng);
    std::vector<wire::KeyLen> keys;
    uint64_t key = std::uniform_int_distribution<uint64_t>(0, 3)(rng);
    for (size_t i = 0; i < num_keys; ++i) {
      uint64_t len = std::uniform_int_distribution<uint64_t>(1, 1000)(rng);
      if (std::uniform_int_distribution<int>(0, 9)(rng) == 0) len *= 1000;  // some big tensors
      keys.emplace_back(key, len);
      key += std::uniform_int_distribution<uint64_t>(1, uint64_t{1} << 40)(rng);
    }
    auto ranges = PartitionByBytes(keys, num_shards);
    ExpectCoverage(ranges, keys, num_shards);
    uint64_t total = 0, max_len = 0;
    for (const auto& k : keys) {
      total += k.length();
      max_len = std::max<uint64_t>(max_len, k.length());
    }
    auto load = LoadPerShard(ranges, keys);
    uint64_t max_load = *std::max_element(load.begin(), load.end());
    // max_load <= total / n + max_len, in integers.
    EXPECT_LE(max_load * num_shards, total + num_shards * max_len)
        << "max shard " << max_load << ", total " << total << " over " << num_shards
        << " shards, largest key " << max_len;
    if (HasFailure()) return;
  }
}

}  // namespace
}  // namespace pacer
