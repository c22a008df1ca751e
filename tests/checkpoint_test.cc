// CheckpointStore (ps/checkpoint.h): what is saved comes back bit for bit,
// a newer snapshot replaces an older one whole, and damage is reported
// rather than loaded.
#include "ps/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "rocksdb/db.h"

namespace pacer {
namespace {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pacer-checkpoint-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/db";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  static ShardSnapshot Make(size_t keys, uint32_t len, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> n;
    ShardSnapshot s;
    s.job_id = 7;
    s.shard_id = 2;
    s.map_version = 5 + seed;
    s.applied_clock = 1000 + static_cast<int64_t>(seed);
    s.steps = 1001;
    s.updates_applied = 3003;
    for (size_t k = 0; k < keys; ++k) s.keys.emplace_back(10 * k + 1, len);
    auto params = std::make_shared<std::vector<float>>(keys * len);
    auto velocity = std::make_shared<std::vector<float>>(keys * len);
    for (float& x : *params) x = n(rng);
    for (float& x : *velocity) x = n(rng);
    s.params = params;
    s.velocity = velocity;
    s.workers = {{3, {999, 4000}}, {4, {1000, 4001}}, {9, {-1, 0}}};
    return s;
  }

  std::string dir_, path_;
};

TEST_F(CheckpointTest, EmptyStoreHasNoSnapshot) {
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto got = (*store)->Load();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->has_value());
}

TEST_F(CheckpointTest, SnapshotRoundTripsAcrossReopen) {
  // More than two chunks, the last one partial.
  const ShardSnapshot s = Make(3, CheckpointStore::kChunkFloats - 5, 1);
  {
    auto store = CheckpointStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto bytes = (*store)->Save(s);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_GE(*bytes, 2 * s.params->size() * sizeof(float));
  }
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok()) << store.status();
  auto got = (*store)->Load();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  EXPECT_TRUE(**got == s);
}

TEST_F(CheckpointTest, ANewerSmallerSnapshotReplacesTheOlderWhole) {
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Save(Make(4, CheckpointStore::kChunkFloats, 1)).ok());
  const ShardSnapshot small = Make(2, 100, 2);
  ASSERT_TRUE((*store)->Save(small).ok());
  auto got = (*store)->Load();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(**got == small);
  store->reset();
  // The older snapshot's extra chunks went in the same batch.
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path_, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string value;
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "p/00000000", &value).ok());
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "p/00000003", &value).IsNotFound());
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "v/00000001", &value).IsNotFound());
}

TEST_F(CheckpointTest, InconsistentSnapshotIsRefusedAndNothingIsLost) {
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  const ShardSnapshot good = Make(2, 100, 1);
  ASSERT_TRUE((*store)->Save(good).ok());
  ShardSnapshot bad = Make(2, 100, 2);
  auto shorter = std::make_shared<std::vector<float>>(*bad.velocity);
  shorter->pop_back();
  bad.velocity = shorter;
  EXPECT_EQ((*store)->Save(bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto got = (*store)->Load();
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(**got == good);
}

TEST_F(CheckpointTest, DamagedDataIsDataLossNotGarbage) {
  {
    auto store = CheckpointStore::Open(path_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Save(Make(2, 1000, 1)).ok());
  }
  {
    // Flip one parameter behind the store's back.
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string chunk;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "p/00000000", &chunk).ok());
    chunk[17] ^= 0x40;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "p/00000000", chunk).ok());
  }
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Load();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
}

TEST_F(CheckpointTest, UnopenableDirectoryIsAClearError) {
  auto store = CheckpointStore::Open(dir_ + "/no/such/parent/db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("cannot open checkpoint store"), std::string::npos);
  EXPECT_EQ(CheckpointStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pacer
