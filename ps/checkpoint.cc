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
constexpr uint32_t kFormatVersion = 3;
// Before the optimizer menu: SGD with momentum only (read and migrated).
constexpr uint32_t kFormatSgdOnly = 2;
// Chunk prefixes: parameters, then state slots 0, 1, 2.
constexpr char kParamPrefix = 'p';
constexpr char kStatePrefix[kMaxStateSlots] = {'v', 'w', 'x'};
// Longest group name a header may hold.
constexpr uint32_t kMaxGroupName = 1024;
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
  bool GetString(std::string* v, uint32_t max) {
    uint32_t n = 0;
    if (!Get(&n) || n > max || data_.size() - pos_ < n) return false;
    v->assign(data_.data() + pos_, n);
    pos_ += n;
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

// A group's settings: its name, a mask of the settings it sets, and each
// setting's value (floats, then the two booleans as bytes).
void PutGroup(std::string* out, const GroupSettings& g) {
  Put(out, static_cast<uint32_t>(g.name.size()));
  out->append(g.name);
  const std::optional<float>* floats[] = {&g.lr,    &g.momentum, &g.dampening, &g.weight_decay,
                                          &g.beta1, &g.beta2,    &g.eps,       &g.lr_decay,
                                          &g.initial_accumulator_value};
  const std::optional<bool>* bools[] = {&g.nesterov, &g.amsgrad};
  uint32_t mask = 0, bit = 0;
  for (const auto* f : floats) mask |= (f->has_value() ? 1u : 0u) << bit++;
  for (const auto* b : bools) mask |= (b->has_value() ? 1u : 0u) << bit++;
  Put(out, mask);
  for (const auto* f : floats) Put(out, f->value_or(0.0f));
  for (const auto* b : bools) Put(out, static_cast<uint8_t>(b->value_or(false)));
}

bool GetGroup(Reader& r, GroupSettings* g) {
  if (!r.GetString(&g->name, kMaxGroupName)) return false;
  std::optional<float>* floats[] = {&g->lr,    &g->momentum, &g->dampening, &g->weight_decay,
                                    &g->beta1, &g->beta2,    &g->eps,       &g->lr_decay,
                                    &g->initial_accumulator_value};
  std::optional<bool>* bools[] = {&g->nesterov, &g->amsgrad};
  uint32_t mask = 0, bit = 0;
  if (!r.Get(&mask)) return false;
  for (auto* f : floats) {
    float v = 0;
    if (!r.Get(&v)) return false;
    if (mask & (1u << bit++)) *f = v;
  }
  for (auto* b : bools) {
    uint8_t v = 0;
    if (!r.Get(&v) || v > 1) return false;
    if (mask & (1u << bit++)) *b = v != 0;
  }
  return true;
}

}  // namespace

bool ShardSnapshot::operator==(const ShardSnapshot& o) const {
  return job_id == o.job_id && shard_id == o.shard_id && map_version == o.map_version &&
         applied_clock == o.applied_clock && steps == o.steps &&
         updates_applied == o.updates_applied && table == o.table && workers == o.workers;
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
  const TableSnapshot& t = s.table;
  uint64_t floats = 0;
  for (const TableKey& k : t.keys) floats += k.length;
  bool adds_up = t.params && floats == t.params->size() && t.state.size() <= kMaxStateSlots;
  for (const ConstFloatBuffer& b : t.state) adds_up = adds_up && b && b->size() == floats;
  if (!adds_up) {
    return absl::InvalidArgumentError(
        "snapshot does not add up: keys hold " + std::to_string(floats) + " floats, params " +
        std::to_string(t.params ? t.params->size() : 0) + ", " + std::to_string(t.state.size()) +
        " state slot(s)");
  }
  const uint64_t chunks = Chunks(t.params->size());
  std::string meta;
  meta.append(kCheckpointMagic, sizeof kCheckpointMagic);
  Put(&meta, kFormatVersion);
  Put(&meta, s.job_id);
  Put(&meta, s.shard_id);
  Put(&meta, s.map_version);
  Put(&meta, s.applied_clock);
  Put(&meta, s.steps);
  Put(&meta, s.updates_applied);
  Put(&meta, static_cast<uint32_t>(t.config.kind));
  Put(&meta, static_cast<uint32_t>(t.state.size()));
  Put(&meta, static_cast<uint32_t>(t.config.groups.size()));
  for (const GroupSettings& g : t.config.groups) PutGroup(&meta, g);
  Put(&meta, static_cast<uint64_t>(t.keys.size()));
  for (const TableKey& k : t.keys) {
    Put(&meta, k.key);
    Put(&meta, k.length);
    Put(&meta, k.group);
    Put(&meta, k.steps);
  }
  Put(&meta, static_cast<uint64_t>(s.workers.size()));
  for (const auto& [worker, mark] : s.workers) {
    Put(&meta, worker);
    Put(&meta, mark.clock);
    Put(&meta, mark.seq);
  }
  Put(&meta, static_cast<uint64_t>(t.params->size()));
  Put(&meta, CheckpointStore::kChunkFloats);
  // The CRC covers the header so far and every chunk: params, then each
  // state slot.
  uint32_t crc = Crc32(0, meta.data(), meta.size());
  rocksdb::WriteBatch batch;
  // Chunks of an older snapshot go in the same batch ("p0" sorts right
  // after every "p/..." key; likewise for the state prefixes).
  for (char prefix : {kParamPrefix, kStatePrefix[0], kStatePrefix[1], kStatePrefix[2]}) {
    const std::string from{prefix, '/'}, to{prefix, '0'};
    batch.DeleteRange(from, to);
  }
  uint64_t bytes = 0;
  for (size_t buffer = 0; buffer <= t.state.size(); ++buffer) {
    const std::vector<float>& v = buffer == 0 ? *t.params : *t.state[buffer - 1];
    const char prefix = buffer == 0 ? kParamPrefix : kStatePrefix[buffer - 1];
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
  TableSnapshot& t = s.table;
  uint32_t version = 0;
  uint64_t nkeys = 0, nworkers = 0, floats = 0;
  uint32_t chunk_floats = 0;
  if (!r.Get(&version)) return corrupt("truncated header");
  if (version != kFormatVersion && version != kFormatSgdOnly) {
    return corrupt("format version " + std::to_string(version) + ", this build reads " +
                   std::to_string(kFormatSgdOnly) + " and " + std::to_string(kFormatVersion));
  }
  if (!r.Get(&s.job_id) || !r.Get(&s.shard_id) || !r.Get(&s.map_version) ||
      !r.Get(&s.applied_clock) || !r.Get(&s.steps) || !r.Get(&s.updates_applied)) {
    return corrupt("truncated header");
  }
  uint32_t slots = 1;
  if (version == kFormatSgdOnly) {
    // SGD with momentum: one state slot, no groups; each key took the
    // shard's steps.
    s.migrated = true;
    t.config.kind = OptimizerKind::kSgd;
  } else {
    uint32_t kind = 0, ngroups = 0;
    if (!r.Get(&kind) || !r.Get(&slots) || !r.Get(&ngroups)) return corrupt("truncated header");
    if (kind > static_cast<uint32_t>(OptimizerKind::kAdagrad)) {
      return corrupt("unknown optimizer " + std::to_string(kind));
    }
    t.config.kind = static_cast<OptimizerKind>(kind);
    if (slots > kMaxStateSlots) return corrupt("state slot count out of range");
    if (ngroups > meta.size()) return corrupt("group count out of range");
    for (uint32_t i = 0; i < ngroups; ++i) {
      GroupSettings g;
      if (!GetGroup(r, &g)) return corrupt("truncated parameter groups");
      t.config.groups.push_back(std::move(g));
    }
  }
  t.config.defaults = DefaultSettings(t.config.kind);
  if (!r.Get(&nkeys)) return corrupt("truncated header");
  if (nkeys > meta.size()) return corrupt("key count out of range");
  uint64_t total = 0;
  for (uint64_t i = 0; i < nkeys; ++i) {
    TableKey k;
    if (!r.Get(&k.key) || !r.Get(&k.length)) return corrupt("truncated key layout");
    if (version == kFormatSgdOnly) {
      k.steps = s.steps;
    } else if (!r.Get(&k.group) || !r.Get(&k.steps)) {
      return corrupt("truncated key layout");
    }
    if (k.group > t.config.groups.size()) {
      return corrupt("key " + std::to_string(k.key) + " is in group " + std::to_string(k.group) +
                     ", which the checkpoint does not declare");
    }
    t.keys.push_back(k);
    total += k.length;
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
  std::vector<std::shared_ptr<std::vector<float>>> buffers;
  const uint64_t chunks = Chunks(floats);
  for (uint32_t buffer = 0; buffer <= slots; ++buffer) {
    auto v = std::make_shared<std::vector<float>>();
    const char prefix = buffer == 0 ? kParamPrefix : kStatePrefix[buffer - 1];
    for (uint64_t c = 0; c < chunks; ++c) {
      const std::string key = ChunkKey(prefix, c);
      std::optional<std::string> value = chunk(key);
      if (!value) return corrupt("chunk " + key + " is missing");
      const size_t begin = c * CheckpointStore::kChunkFloats;
      const size_t n = std::min<size_t>(CheckpointStore::kChunkFloats, floats - begin);
      if (value->size() != n * sizeof(float)) return corrupt("chunk " + key + " has the wrong size");
      v->resize(begin + n);
      std::memcpy(v->data() + begin, value->data(), value->size());
      crc = Crc32(crc, value->data(), value->size());
    }
    buffers.push_back(std::move(v));
  }
  if (crc != stored_crc) return corrupt("CRC mismatch");
  t.params = buffers[0];
  for (size_t i = 1; i < buffers.size(); ++i) t.state.push_back(buffers[i]);
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
