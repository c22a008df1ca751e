#include "ps/checkpoint.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>

#include "ps/base/wire.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace pacer {

namespace {

static_assert(std::endian::native == std::endian::little, "the checkpoint format is little-endian");

constexpr char kCheckpointMagic[4] = {'P', 'C', 'K', '1'};
constexpr uint32_t kFormatVersion = 2;
constexpr char kMetaKey[] = "meta";

std::string ChunkKey(char prefix, uint64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%c/%08llu", prefix, static_cast<unsigned long long>(index));
  return buf;
}

uint64_t Chunks(size_t floats) {
  return (floats + CheckpointStore::kChunkFloats - 1) / CheckpointStore::kChunkFloats;
}

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

// Bounds-checked reads from the header.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  template <typename T>
  bool Get(T* v) {
    if (data_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(v, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view data_;
  size_t pos_ = 0;
};

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  return absl::InternalError(what + ": " + s.ToString());
}

std::span<const char> Bytes(std::span<const float> v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

}  // namespace

bool ShardSnapshot::operator==(const ShardSnapshot& o) const {
  return job_id == o.job_id && shard_id == o.shard_id && map_version == o.map_version &&
         applied_clock == o.applied_clock && steps == o.steps &&
         updates_applied == o.updates_applied && keys == o.keys && *params == *o.params &&
         *velocity == *o.velocity && workers == o.workers;
}

CheckpointStore::CheckpointStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
CheckpointStore::~CheckpointStore() = default;

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const std::string& path) {
  return Open(path, nullptr);
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(const std::string& path,
                                                                      rocksdb::Env* env) {
  if (path.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  rocksdb::Options options;
  if (env != nullptr) options.env = env;
  options.create_if_missing = true;
  // One large batch per checkpoint: let it go to one memtable.
  options.write_buffer_size = 256 << 20;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  if (!s.ok()) {
    return absl::InvalidArgumentError("cannot open checkpoint store '" + path + "': " + s.ToString());
  }
  return std::unique_ptr<CheckpointStore>(new CheckpointStore(std::unique_ptr<rocksdb::DB>(raw)));
}

absl::StatusOr<uint64_t> CheckpointStore::Save(const ShardSnapshot& s) {
  uint64_t floats = 0;
  for (const auto& [key, len] : s.keys) floats += len;
  if (!s.params || !s.velocity || floats != s.params->size() ||
      s.velocity->size() != s.params->size()) {
    return absl::InvalidArgumentError(
        "snapshot does not add up: keys hold " + std::to_string(floats) + " floats, params " +
        std::to_string(s.params ? s.params->size() : 0) + ", velocity " +
        std::to_string(s.velocity ? s.velocity->size() : 0));
  }
  const uint64_t chunks = Chunks(s.params->size());
  std::string meta;
  meta.append(kCheckpointMagic, sizeof kCheckpointMagic);
  Put(&meta, kFormatVersion);
  Put(&meta, s.job_id);
  Put(&meta, s.shard_id);
  Put(&meta, s.map_version);
  Put(&meta, s.applied_clock);
  Put(&meta, s.steps);
  Put(&meta, s.updates_applied);
  Put(&meta, static_cast<uint64_t>(s.keys.size()));
  for (const auto& [key, len] : s.keys) {
    Put(&meta, key);
    Put(&meta, len);
  }
  Put(&meta, static_cast<uint64_t>(s.workers.size()));
  for (const auto& [worker, mark] : s.workers) {
    Put(&meta, worker);
    Put(&meta, mark.clock);
    Put(&meta, mark.seq);
  }
  Put(&meta, static_cast<uint64_t>(s.params->size()));
  Put(&meta, CheckpointStore::kChunkFloats);
  // The CRC covers the header so far and every chunk, params then velocity.
  uint32_t crc = Crc32(0, meta.data(), meta.size());
  rocksdb::WriteBatch batch;
  // Chunks of an older snapshot go in the same batch ("p0" and "v0" sort
  // right after every "p/..." and "v/..." key).
  batch.DeleteRange("p/", "p0");
  batch.DeleteRange("v/", "v0");
  uint64_t bytes = 0;
  for (char prefix : {'p', 'v'}) {
    const std::vector<float>& v = prefix == 'p' ? *s.params : *s.velocity;
    for (uint64_t c = 0; c < chunks; ++c) {
      const size_t begin = c * kChunkFloats;
      const size_t n = std::min<size_t>(kChunkFloats, v.size() - begin);
      std::span<const char> b = Bytes(std::span<const float>(v).subspan(begin, n));
      crc = Crc32(crc, b.data(), b.size());
      batch.Put(ChunkKey(prefix, c), rocksdb::Slice(b.data(), b.size()));
      bytes += b.size();
    }
  }
  Put(&meta, crc);
  batch.Put(kMetaKey, meta);
  bytes += meta.size();
  rocksdb::WriteOptions wo;
  wo.sync = true;
  if (absl::Status st = FromRocks(db_->Write(wo, &batch), "checkpoint write"); !st.ok()) return st;
  return bytes;
}

absl::StatusOr<std::optional<ShardSnapshot>> CheckpointStore::Load() {
  std::string meta;
  rocksdb::Status rs = db_->Get(rocksdb::ReadOptions(), kMetaKey, &meta);
  if (rs.IsNotFound()) return std::optional<ShardSnapshot>();
  if (absl::Status st = FromRocks(rs, "checkpoint read"); !st.ok()) return st;
  absl::Status read_error;
  auto snapshot = ParseCheckpoint(meta, [&](const std::string& key) -> std::optional<std::string> {
    std::string value;
    rocksdb::Status r = db_->Get(rocksdb::ReadOptions(), key, &value);
    if (!r.ok()) {
      if (!r.IsNotFound()) read_error = FromRocks(r, "checkpoint read");
      return std::nullopt;
    }
    return value;
  });
  if (!read_error.ok()) return read_error;
  if (!snapshot.ok()) return snapshot.status();
  return std::optional<ShardSnapshot>(std::move(*snapshot));
}

absl::StatusOr<ShardSnapshot> ParseCheckpoint(
    std::string_view meta, const std::function<std::optional<std::string>(const std::string&)>& chunk) {
  auto corrupt = [](const std::string& why) { return absl::DataLossError("checkpoint: " + why); };
  if (meta.size() < sizeof kCheckpointMagic || std::memcmp(meta.data(), kCheckpointMagic, sizeof kCheckpointMagic) != 0) {
    return corrupt("not a Pacer checkpoint (bad magic)");
  }
  Reader r(meta.substr(sizeof kCheckpointMagic));
  ShardSnapshot s;
  uint32_t version = 0;
  uint64_t nkeys = 0, nworkers = 0, floats = 0;
  uint32_t chunk_floats = 0;
  if (!r.Get(&version)) return corrupt("truncated header");
  if (version != kFormatVersion) {
    return corrupt("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFormatVersion));
  }
  if (!r.Get(&s.job_id) || !r.Get(&s.shard_id) || !r.Get(&s.map_version) ||
      !r.Get(&s.applied_clock) || !r.Get(&s.steps) || !r.Get(&s.updates_applied) ||
      !r.Get(&nkeys)) {
    return corrupt("truncated header");
  }
  if (nkeys > meta.size()) return corrupt("key count out of range");
  uint64_t total = 0;
  for (uint64_t i = 0; i < nkeys; ++i) {
    uint64_t key = 0;
    uint32_t len = 0;
    if (!r.Get(&key) || !r.Get(&len)) return corrupt("truncated key layout");
    s.keys.emplace_back(key, len);
    total += len;
  }
  if (!r.Get(&nworkers) || nworkers > meta.size()) return corrupt("truncated worker marks");
  for (uint64_t i = 0; i < nworkers; ++i) {
    uint32_t worker = 0;
    WorkerMark mark;
    if (!r.Get(&worker) || !r.Get(&mark.clock) || !r.Get(&mark.seq)) {
      return corrupt("truncated worker marks");
    }
    s.workers[worker] = mark;
  }
  if (!r.Get(&floats) || !r.Get(&chunk_floats)) return corrupt("truncated header");
  if (floats != total || chunk_floats != CheckpointStore::kChunkFloats) {
    return corrupt("header does not add up (" + std::to_string(floats) + " floats, keys hold " +
                   std::to_string(total) + ")");
  }
  const size_t crc_at = sizeof kCheckpointMagic + r.pos();
  uint32_t stored_crc = 0;
  if (!r.Get(&stored_crc)) return corrupt("truncated header");
  uint32_t crc = Crc32(0, meta.data(), crc_at);
  // Grown chunk by chunk: the header's count is not trusted with an
  // allocation before the chunks that hold its values are there.
  auto params = std::make_shared<std::vector<float>>();
  auto velocity = std::make_shared<std::vector<float>>();
  const uint64_t chunks = Chunks(floats);
  for (char prefix : {'p', 'v'}) {
    std::vector<float>& v = prefix == 'p' ? *params : *velocity;
    for (uint64_t c = 0; c < chunks; ++c) {
      const std::string key = ChunkKey(prefix, c);
      std::optional<std::string> value = chunk(key);
      if (!value) return corrupt("chunk " + key + " is missing");
      const size_t begin = c * CheckpointStore::kChunkFloats;
      const size_t n = std::min<size_t>(CheckpointStore::kChunkFloats, floats - begin);
      if (value->size() != n * sizeof(float)) return corrupt("chunk " + key + " has the wrong size");
      v.resize(begin + n);
      std::memcpy(v.data() + begin, value->data(), value->size());
      crc = Crc32(crc, value->data(), value->size());
    }
  }
  if (crc != stored_crc) return corrupt("CRC mismatch");
  s.params = std::move(params);
  s.velocity = std::move(velocity);
  return s;
}

absl::StatusOr<std::string> DataDirPath(const std::string& dir, const std::string& name) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError("cannot create --data-dir '" + dir + "': " + ec.message());
  return (std::filesystem::path(dir) / name).string();
}

RecordStore::RecordStore(std::unique_ptr<rocksdb::DB> db) : db_(std::move(db)) {}
RecordStore::~RecordStore() = default;

absl::StatusOr<std::unique_ptr<RecordStore>> RecordStore::Open(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("state directory is empty");
  rocksdb::Options options;
  options.create_if_missing = true;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, path, &raw);
  if (!s.ok()) {
    return absl::InvalidArgumentError("cannot open state store '" + path + "': " + s.ToString());
  }
  return std::unique_ptr<RecordStore>(new RecordStore(std::unique_ptr<rocksdb::DB>(raw)));
}

absl::Status RecordStore::Put(const std::string& key, std::string_view value) {
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Put(wo, key, rocksdb::Slice(value.data(), value.size())), "state write");
}

absl::StatusOr<std::optional<std::string>> RecordStore::Get(const std::string& key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (absl::Status st = FromRocks(s, "state read"); !st.ok()) return st;
  return std::optional<std::string>(std::move(value));
}

}  // namespace pacer
