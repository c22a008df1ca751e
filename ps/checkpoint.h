// Shard checkpoints in RocksDB (issue 4): a consistent snapshot of what a
// shard must not lose (parameters, optimizer state, per-worker clocks, the
// shard-map version), written as one synced WriteBatch so that a crash leaves
// either the previous snapshot or the new one, never a mix.
//
// Layout in the database (all integers little-endian):
//   "meta"        header: magic "PCK1", format version (3), the scalar
//                 fields, the optimizer (kind, state slots, the parameter
//                 groups' settings), the key layout (key, length, group,
//                 steps), the worker marks, the chunk counts and a CRC-32
//                 over the header and every chunk;
//   "p/NNNNNNNN"  parameter floats, chunks of kChunkFloats;
//   "v/...", "w/...", "x/..."  optimizer state slots 0, 1, 2 (momentum;
//                 Adam's m, v and max v; Adagrad's sum), the same chunking.
// Chunks of an older, larger snapshot are deleted in the same batch.
// Format 2 (before the optimizer menu: SGD with momentum, keys without
// groups or steps) is read and migrated: its "v/" chunks become SGD's
// momentum and every key's step count is the shard's. Any other format, or
// anything that fails the checks, is refused (DataLoss), never misread.
#ifndef PACER_PS_CHECKPOINT_H_
#define PACER_PS_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/messages.h"
#include "ps/table.h"

namespace rocksdb {
class DB;
class Env;
}

namespace pacer {

// Where one worker stood at the snapshot: the highest clock it pushed here,
// and the seq of its last push whose effect is in the snapshot's parameters.
struct WorkerMark {
  int64_t clock = -1;
  uint64_t seq = 0;
  bool operator==(const WorkerMark&) const = default;
};

struct ShardSnapshot {
  // When the state was captured (Unix seconds; not stored): a checkpoint's
  // age is that of the state it holds, not of its write.
  double taken_unix = 0;
  uint64_t job_id = 0;
  uint32_t shard_id = 0;
  uint64_t map_version = 0;
  int64_t applied_clock = -1;
  uint64_t steps = 0;
  // Pushes whose effect is in params (pushes still in open clocks are not).
  uint64_t updates_applied = 0;
  // The parameter table: the owned keys in order (with group and steps),
  // the optimizer and its groups, the parameters and each state slot, their
  // values laid end to end. Shared and never written once in a snapshot:
  // the shard writes its next step into new buffers while a snapshot holds
  // these (no copy on the shard's thread).
  TableSnapshot table;
  std::map<uint32_t, WorkerMark> workers;
  // The range's ledger (ShardCore::ledger()): what a replica hands to the
  // core it is promoted to. Not stored in checkpoints: a shard restored from
  // one keeps a ledger from its restore on.
  std::vector<msg::SeqSpan> ledger;
  uint64_t ledger_doubles = 0;
  // Read from a format-2 checkpoint (migrated; not stored).
  bool migrated = false;
  // Compares the values, not the buffers' addresses.
  bool operator==(const ShardSnapshot& o) const;
};

class CheckpointStore {
 public:
  static constexpr uint32_t kChunkFloats = 1 << 18;  // 1 MiB per value

  // Opens (creating if missing) the database in directory `path`; its parent
  // must exist. InvalidArgument / Internal with RocksDB's reason otherwise.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const std::string& path);
  // The same on a given RocksDB Env (tests: a file system that crashes).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const std::string& path, rocksdb::Env* env);
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;

  // Writes `s` as the latest snapshot, atomically and synced to disk. Returns
  // the bytes written. InvalidArgument when the parameters, the state slots
  // and the key layout disagree.
  absl::StatusOr<uint64_t> Save(const ShardSnapshot& s);
  // The latest complete snapshot; nullopt when none was ever saved.
  // DataLoss when what is stored fails its checks.
  absl::StatusOr<std::optional<ShardSnapshot>> Load();

 private:
  explicit CheckpointStore(std::unique_ptr<rocksdb::DB> db);
  std::unique_ptr<rocksdb::DB> db_;
};

// Reads a snapshot from the store's records: `meta` (the header record) and
// `chunk`, which returns the record under a chunk key or nullopt when it is
// missing. DataLoss on anything that fails its checks. What Load runs; also
// the fuzz target's entry (tests/fuzz).
absl::StatusOr<ShardSnapshot> ParseCheckpoint(
    std::string_view meta, const std::function<std::optional<std::string>(const std::string&)>& chunk);

// DIR/name for a store under a --data-dir, creating DIR (and its parents)
// first; InvalidArgument when it cannot be created.
absl::StatusOr<std::string> DataDirPath(const std::string& dir, const std::string& name);

// Small records in RocksDB, each written synced (the monitor's state).
class RecordStore {
 public:
  // As CheckpointStore::Open.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RecordStore>> Open(const std::string& path);
  ~RecordStore();
  RecordStore(const RecordStore&) = delete;
  RecordStore& operator=(const RecordStore&) = delete;
  absl::Status Put(const std::string& key, std::string_view value);
  // nullopt when the key was never written.
  absl::StatusOr<std::optional<std::string>> Get(const std::string& key);

 private:
  explicit RecordStore(std::unique_ptr<rocksdb::DB> db);
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace pacer

#endif  // PACER_PS_CHECKPOINT_H_
