// CheckpointStore (ps/checkpoint.h): what is saved comes back bit for bit,
// a newer snapshot replaces an older one whole, and damage is reported
// rather than loaded.
#include "ps/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "prometheus/registry.h"
#include "ps/base/wire.h"
#include "ps/checkpoint_writer.h"
#include "ps/model_file.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"

namespace pacer {
namespace {

// A file system on which unsynced writes are lost in a crash, as on a
// machine that loses power: appends wait in memory until a Sync, and once
// the crash is armed the next sync fails and drops what was waiting, except
// `keep` bytes of it (a torn write); no write reaches the disk after that.
class CrashFs : public rocksdb::FileSystemWrapper {
 public:
  struct State {
    bool crashed = false;
    size_t keep = 0;  // bytes of pending data written anyway at the crash
  };

  explicit CrashFs(std::shared_ptr<State> state)
      : FileSystemWrapper(rocksdb::FileSystem::Default()), state_(std::move(state)) {}
  const char* Name() const override { return "CrashFs"; }

  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    if (state_->crashed) return rocksdb::IOStatus::IOError("crashed");
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), state_);
    return s;
  }
  rocksdb::IOStatus ReopenWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                       std::unique_ptr<rocksdb::FSWritableFile>* r,
                                       rocksdb::IODebugContext* dbg) override {
    if (state_->crashed) return rocksdb::IOStatus::IOError("crashed");
    rocksdb::IOStatus s = target()->ReopenWritableFile(f, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), state_);
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    if (state_->crashed) return rocksdb::IOStatus::IOError("crashed");
    rocksdb::IOStatus s = target()->ReuseWritableFile(f, old, o, r, dbg);
    if (s.ok()) *r = std::make_unique<File>(std::move(*r), state_);
    return s;
  }
  rocksdb::IOStatus RenameFile(const std::string& a, const std::string& b,
                               const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
    if (state_->crashed) return rocksdb::IOStatus::IOError("crashed");
    return target()->RenameFile(a, b, o, dbg);
  }
  rocksdb::IOStatus DeleteFile(const std::string& f, const rocksdb::IOOptions& o,
                               rocksdb::IODebugContext* dbg) override {
    if (state_->crashed) return rocksdb::IOStatus::IOError("crashed");
    return target()->DeleteFile(f, o, dbg);
  }

 private:
  class File : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(std::unique_ptr<rocksdb::FSWritableFile> t, std::shared_ptr<State> state)
        : FSWritableFileOwnerWrapper(std::move(t)), state_(std::move(state)) {}
    ~File() override {
      rocksdb::IOOptions o;
      (void)Close(o, nullptr);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions&,
                             rocksdb::IODebugContext*) override {
      // Accepted into the "page cache"; the crash comes at the sync.
      pending_.append(data.data(), data.size());
      return rocksdb::IOStatus::OK();
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo&,
                             rocksdb::IODebugContext* dbg) override {
      return Append(data, o, dbg);
    }
    rocksdb::IOStatus Flush(const rocksdb::IOOptions&, rocksdb::IODebugContext*) override {
      return rocksdb::IOStatus::OK();
    }
    rocksdb::IOStatus Sync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      return WriteOut(o, dbg, /*sync=*/true);
    }
    rocksdb::IOStatus Fsync(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      return WriteOut(o, dbg, /*sync=*/true);
    }
    rocksdb::IOStatus RangeSync(uint64_t, uint64_t, const rocksdb::IOOptions&,
                                rocksdb::IODebugContext*) override {
      return rocksdb::IOStatus::OK();
    }
    rocksdb::IOStatus Close(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      if (closed_) return rocksdb::IOStatus::OK();
      closed_ = true;
      // A clean close leaves the data in the page cache: a process crash
      // keeps it; only the crash below drops it.
      rocksdb::IOStatus s = WriteOut(o, dbg, /*sync=*/false);
      rocksdb::IOStatus c = target()->Close(o, dbg);
      return s.ok() ? c : s;
    }
    uint64_t GetFileSize(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg) override {
      return target()->GetFileSize(o, dbg) + pending_.size();
    }

   private:
    rocksdb::IOStatus WriteOut(const rocksdb::IOOptions& o, rocksdb::IODebugContext* dbg,
                               bool sync) {
      if (state_->crashed) {
        // The torn write: a prefix of the waiting data made it to disk.
        if (!torn_ && state_->keep > 0 && !pending_.empty()) {
          torn_ = true;
          const size_t n = std::min(state_->keep, pending_.size());
          (void)target()->Append(rocksdb::Slice(pending_.data(), n), o, dbg);
          (void)target()->Flush(o, dbg);
        }
        pending_.clear();
        return rocksdb::IOStatus::IOError("crashed before the sync completed");
      }
      if (!pending_.empty()) {
        rocksdb::IOStatus s = target()->Append(pending_, o, dbg);
        pending_.clear();
        if (!s.ok()) return s;
      }
      rocksdb::IOStatus s = target()->Flush(o, dbg);
      if (s.ok() && sync) s = target()->Sync(o, dbg);
      return s;
    }

    std::shared_ptr<State> state_;
    std::string pending_;
    bool closed_ = false;
    bool torn_ = false;
  };

  std::shared_ptr<State> state_;
};

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
    // Adam with amsgrad (three state slots) and a second group: every
    // part of the optimizer's state is in the round trip.
    TableSnapshot& t = s.table;
    t.config.kind = OptimizerKind::kAdam;
    t.config.defaults = DefaultSettings(OptimizerKind::kAdam);
    GroupSettings no_decay;
    no_decay.name = "no_decay";
    no_decay.weight_decay = 0.0f;
    no_decay.amsgrad = true;
    t.config.groups = {no_decay};
    for (size_t k = 0; k < keys; ++k) {
      t.keys.push_back({10 * k + 1, len, static_cast<uint32_t>(k % 2), 1000 + k});
    }
    auto params = std::make_shared<std::vector<float>>(keys * len);
    for (float& x : *params) x = n(rng);
    t.params = params;
    for (int slot = 0; slot < 3; ++slot) {
      auto v = std::make_shared<std::vector<float>>(keys * len);
      for (float& x : *v) x = n(rng);
      t.state.push_back(v);
    }
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
    EXPECT_GE(*bytes, 4 * s.table.params->size() * sizeof(float));
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
  auto shorter = std::make_shared<std::vector<float>>(*bad.table.state[1]);
  shorter->pop_back();
  bad.table.state[1] = shorter;
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

// Writes a checkpoint of format 2 (before the optimizer menu: SGD with
// momentum, keys without groups or steps) as that build did, byte by byte.
void WriteFormat2(const std::string& path, const std::vector<float>& w, const std::vector<float>& v,
                  uint32_t version = 2) {
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(options, path, &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::string meta = "PCK1";
  auto put = [&](auto x) { meta.append(reinterpret_cast<const char*>(&x), sizeof x); };
  put(version);
  put(uint64_t{7});    // job
  put(uint32_t{2});    // shard
  put(uint64_t{5});    // map version
  put(int64_t{41});    // applied clock
  put(uint64_t{42});   // steps
  put(uint64_t{126});  // updates applied
  put(uint64_t{2});    // keys
  put(uint64_t{1});
  put(uint32_t{2});
  put(uint64_t{9});
  put(uint32_t{1});
  put(uint64_t{1});    // workers
  put(uint32_t{3});
  put(int64_t{41});
  put(uint64_t{120});
  put(uint64_t{w.size()});
  put(CheckpointStore::kChunkFloats);
  const char* wb = reinterpret_cast<const char*>(w.data());
  const char* vb = reinterpret_cast<const char*>(v.data());
  uint32_t crc = Crc32(0, meta.data(), meta.size());
  crc = Crc32(crc, wb, w.size() * sizeof(float));
  crc = Crc32(crc, vb, v.size() * sizeof(float));
  put(crc);
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "p/00000000",
                      rocksdb::Slice(wb, w.size() * sizeof(float))).ok());
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "v/00000000",
                      rocksdb::Slice(vb, v.size() * sizeof(float))).ok());
  ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "meta", meta).ok());
}

TEST_F(CheckpointTest, AFormat2CheckpointIsMigratedToSgdWithMomentum) {
  const std::vector<float> w = {1.0f, 2.0f, 3.0f}, v = {0.5f, -0.5f, 0.25f};
  WriteFormat2(path_, w, v);
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Load();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  const ShardSnapshot& s = **got;
  EXPECT_TRUE(s.migrated);
  EXPECT_EQ(s.applied_clock, 41);
  EXPECT_EQ(s.workers.at(3), (WorkerMark{41, 120}));
  EXPECT_EQ(s.table.config.kind, OptimizerKind::kSgd);
  ASSERT_EQ(s.table.keys.size(), 2u);
  // Each key took the shard's steps, in the default group.
  EXPECT_EQ(s.table.keys[0], (TableKey{1, 2, kDefaultGroup, 42}));
  EXPECT_EQ(s.table.keys[1], (TableKey{9, 1, kDefaultGroup, 42}));
  EXPECT_EQ(*s.table.params, w);
  ASSERT_EQ(s.table.state.size(), 1u);
  EXPECT_EQ(*s.table.state[0], v) << "the momentum";
  // Written again, it is a format-3 checkpoint with the same contents.
  ASSERT_TRUE((*store)->Save(s).ok());
  auto again = (*store)->Load();
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_FALSE((*again)->migrated);
  EXPECT_TRUE(**again == s);
}

TEST_F(CheckpointTest, AnUnknownFormatIsRefusedNotMisread) {
  WriteFormat2(path_, {1.0f, 2.0f, 3.0f}, {0, 0, 0}, /*version=*/4);
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  auto got = (*store)->Load();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(got.status().message()).find("format version 4"), std::string::npos)
      << got.status();
}

TEST_F(CheckpointTest, DamagedOptimizerStateIsDataLoss) {
  {
    auto store = CheckpointStore::Open(path_);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Save(Make(2, 1000, 1)).ok());
  }
  {
    // Flip a value of Adam's second moment (slot 1, "w/").
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path_, &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string chunk;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "w/00000000", &chunk).ok());
    chunk[5] ^= 0x01;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "w/00000000", chunk).ok());
  }
  auto store = CheckpointStore::Open(path_);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Load().status().code(), absl::StatusCode::kDataLoss);
}

// A crash while a checkpoint is being written: the file system drops what
// was not synced (all of it, or all but a torn prefix of the write-ahead
// log record). The previous snapshot must still load, whole.
TEST_F(CheckpointTest, CrashDuringACheckpointLeavesThePreviousSnapshot) {
  for (size_t keep : {size_t{0}, size_t{4096}, size_t{3 << 20}}) {
    SCOPED_TRACE("bytes of the torn write kept: " + std::to_string(keep));
    std::filesystem::remove_all(path_);
    const ShardSnapshot before = Make(3, CheckpointStore::kChunkFloats / 2, 1);
    const ShardSnapshot during = Make(3, CheckpointStore::kChunkFloats / 2, 2);
    auto state = std::make_shared<CrashFs::State>();
    std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(std::make_shared<CrashFs>(state));
    {
      auto store = CheckpointStore::Open(path_, env.get());
      ASSERT_TRUE(store.ok()) << store.status();
      ASSERT_TRUE((*store)->Save(before).ok());
      // The crash comes while the next checkpoint's batch waits for its sync.
      state->crashed = true;
      state->keep = keep;
      EXPECT_FALSE((*store)->Save(during).ok());
    }  // the process is gone; nothing more reaches the disk
    auto store = CheckpointStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    auto got = (*store)->Load();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(got->has_value());
    EXPECT_TRUE(**got == before) << "applied clock " << (*got)->applied_clock;
  }
}

TEST_F(CheckpointTest, UnopenableDirectoryIsAClearError) {
  auto store = CheckpointStore::Open(dir_ + "/no/such/parent/db");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(store.status().message().find("cannot open checkpoint store"), std::string::npos);
  EXPECT_EQ(CheckpointStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}


// CheckpointWriter (ps/checkpoint_writer.h): writes off the caller's thread,
// and a final checkpoint that cannot finish by its deadline is given up,
// leaving the previous snapshot in the store.
class CheckpointWriterTest : public CheckpointTest {
 protected:
  void SetUp() override {
    CheckpointTest::SetUp();
    auto store = CheckpointStore::Open(path_);
    ASSERT_TRUE(store.ok()) << store.status();
    faults_ = std::make_shared<FaultInjector>(1, nullptr);
    writer_ = std::make_unique<CheckpointWriter>(std::move(*store),
                                                 std::make_shared<prometheus::Registry>(),
                                                 std::chrono::seconds(10), Clock::Real(), faults_, 2);
  }
  void SlowDisk(const std::string& spec) {
    auto rules = ParseFaults(spec);
    ASSERT_TRUE(rules.ok()) << rules.status();
    faults_->SetRules(*rules);
  }
  // Offers `s` and waits (up to 10 s) until it is written.
  void WriteAndWait(const ShardSnapshot& s) {
    const double before = writer_->last_success_unix();
    ASSERT_TRUE(writer_->Offer(s));
    const TimePoint until = Clock::Real()->Now() + std::chrono::seconds(10);
    while (writer_->last_success_unix() == before && Clock::Real()->Now() < until) {
      Clock::Real()->SleepUntil(Clock::Real()->Now() + std::chrono::milliseconds(5));
    }
    ASSERT_NE(writer_->last_success_unix(), before);
  }
  // Destroys the writer, then reads what the store holds. The store opens
  // only once the writer's thread has let go of it.
  int64_t AppliedClockInStore() {
    writer_.reset();
    auto store = CheckpointStore::Open(path_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return -100;
    auto got = (*store)->Load();
    EXPECT_TRUE(got.ok() && got->has_value());
    return got.ok() && got->has_value() ? (*got)->applied_clock : -100;
  }
  static ShardSnapshot At(int64_t clock) {
    ShardSnapshot s = Make(2, 100, 1);
    s.applied_clock = clock;
    s.taken_unix = 1000.0 + static_cast<double>(clock);
    return s;
  }
  std::shared_ptr<FaultInjector> faults_;
  std::unique_ptr<CheckpointWriter> writer_;
};

TEST_F(CheckpointWriterTest, AFinalCheckpointIsWrittenBeforeItReturns) {
  WriteAndWait(At(5));
  EXPECT_EQ(writer_->last_success_unix(), 1005.0);
  const absl::Status st = writer_->Final(At(6), Clock::Real()->Now() + std::chrono::seconds(30));
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(writer_->last_success_unix(), 1006.0);
  EXPECT_EQ(AppliedClockInStore(), 6);
}

TEST_F(CheckpointWriterTest, AFinalCheckpointThatCannotBeWrittenInTimeIsGivenUp) {
  WriteAndWait(At(5));
  SlowDisk("slow_disk:ms=60000");
  const absl::Status st = writer_->Final(At(6), Clock::Real()->Now() + std::chrono::milliseconds(200));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("its write had not finished"), std::string::npos) << st;
  EXPECT_FALSE(writer_->Offer(At(7))) << "a given-up writer writes nothing more";
  EXPECT_EQ(AppliedClockInStore(), 5) << "the previous checkpoint stays";
}

TEST_F(CheckpointWriterTest, AFinalCheckpointBehindAStuckOneIsGivenUp) {
  WriteAndWait(At(5));
  SlowDisk("slow_disk:ms=60000");
  ASSERT_TRUE(writer_->Offer(At(6)));  // now in the disk for a minute
  EXPECT_FALSE(writer_->Offer(At(7))) << "one write at a time";
  const absl::Status st = writer_->Final(At(8), Clock::Real()->Now() + std::chrono::milliseconds(200));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_NE(st.message().find("before it was still being written"), std::string::npos) << st;
  EXPECT_EQ(AppliedClockInStore(), 5);
}

}  // namespace
}  // namespace pacer

namespace pacer {
namespace {

// The exported model file (ps/model_file.h): format 1 (parameters) and
// format 2 (with the optimizer's state) round-trip; damage is refused.
TEST(ModelFileTest, BothFormatsRoundTripAndDamageIsRefused) {
  const std::string path = ::testing::TempDir() + "/model-file-test.bin";
  ModelFile m;
  m.job_id = 3;
  m.map_version = 4;
  m.keys = {{1, 2}, {5, 1}};
  m.values = {1.0f, 2.0f, 3.0f};
  ASSERT_TRUE(WriteModelFile(path, m).ok());
  auto got = ReadModelFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(got->with_state);
  EXPECT_EQ(got->values, m.values);
  m.with_state = true;
  m.optimizer = OptimizerKind::kAdam;
  m.state_slots = 2;
  m.key_steps = {7, 9};
  m.state = {0.1f, 0.2f, 0.3f, 1.1f, 1.2f, 1.3f};
  ASSERT_TRUE(WriteModelFile(path, m).ok());
  got = ReadModelFile(path);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->with_state);
  EXPECT_EQ(got->optimizer, OptimizerKind::kAdam);
  EXPECT_EQ(got->key_steps, m.key_steps);
  EXPECT_EQ(got->values, m.values);
  EXPECT_EQ(got->state, m.state);
  m.state.pop_back();
  EXPECT_EQ(WriteModelFile(path, m).code(), absl::StatusCode::kInvalidArgument);
  // One flipped byte: the CRC refuses it.
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[40] ^= 1;
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  EXPECT_EQ(ReadModelFile(path).status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace pacer
