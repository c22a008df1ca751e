#include "ps/model_file.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

namespace pacer {
namespace {

static_assert(std::endian::native == std::endian::little, "the model file is little-endian");
constexpr char kModelMagic[8] = {'P', 'A', 'C', 'E', 'R', 'M', 'D', 'L'};
constexpr uint32_t kModelVersion = 1;
constexpr uint32_t kModelWithStateVersion = 2;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

}  // namespace

absl::Status WriteModelFile(const std::string& path, const ModelFile& m) {
  uint64_t total = 0;
  for (size_t i = 0; i < m.keys.size(); ++i) {
    if (i > 0 && m.keys[i].key() <= m.keys[i - 1].key()) {
      return absl::InvalidArgumentError("model keys must be ascending without repeats");
    }
    total += m.keys[i].length();
  }
  if (total != m.values.size()) {
    return absl::InvalidArgumentError("keys hold " + std::to_string(total) + " values, got " +
                                      std::to_string(m.values.size()));
  }
  if (m.with_state && (m.state_slots > kMaxStateSlots || m.key_steps.size() != m.keys.size() ||
                       m.state.size() != total * m.state_slots)) {
    return absl::InvalidArgumentError("the optimizer state does not fit the keys");
  }
  std::string head;
  head.append(kModelMagic, sizeof kModelMagic);
  Put(&head, m.with_state ? kModelWithStateVersion : kModelVersion);
  Put(&head, m.job_id);
  Put(&head, m.map_version);
  Put(&head, static_cast<uint64_t>(m.keys.size()));
  for (const auto& k : m.keys) {
    Put(&head, k.key());
    Put(&head, k.length());
  }
  if (m.with_state) {
    Put(&head, static_cast<uint32_t>(m.optimizer));
    Put(&head, m.state_slots);
    for (uint64_t steps : m.key_steps) Put(&head, steps);
  }
  // The values, then (format 2) the state: one block of floats.
  std::vector<float> floats = m.values;
  if (m.with_state) floats.insert(floats.end(), m.state.begin(), m.state.end());
  const char* data = reinterpret_cast<const char*>(floats.data());
  const size_t bytes = floats.size() * sizeof(float);
  uint32_t crc = Crc32(0, head.data(), head.size());
  crc = Crc32(crc, data, bytes);
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return absl::InternalError("cannot write " + tmp);
  const bool ok = std::fwrite(head.data(), 1, head.size(), f) == head.size() &&
                  std::fwrite(data, 1, bytes, f) == bytes &&
                  std::fwrite(&crc, 1, sizeof crc, f) == sizeof crc;
  if (std::fclose(f) != 0 || !ok) {
    std::remove(tmp.c_str());
    return absl::InternalError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError("cannot rename " + tmp + " to " + path);
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) {
    return absl::DataLossError(path + " is not a usable Pacer model file: " + why);
  };
  constexpr size_t kHead = sizeof kModelMagic + 4 + 8 + 8 + 8;
  if (bytes.size() < kHead + 4 || std::memcmp(bytes.data(), kModelMagic, sizeof kModelMagic) != 0) {
    return bad("bad magic or too short");
  }
  uint32_t crc = 0;
  std::memcpy(&crc, bytes.data() + bytes.size() - 4, 4);
  if (Crc32(0, bytes.data(), bytes.size() - 4) != crc) return bad("CRC mismatch");
  size_t pos = sizeof kModelMagic;
  auto get = [&](auto* v) {
    std::memcpy(v, bytes.data() + pos, sizeof *v);
    pos += sizeof *v;
  };
  uint32_t version = 0;
  uint64_t nkeys = 0;
  ModelFile m;
  get(&version);
  if (version != kModelVersion && version != kModelWithStateVersion) {
    return bad("format version " + std::to_string(version));
  }
  get(&m.job_id);
  get(&m.map_version);
  get(&nkeys);
  if (nkeys > (bytes.size() - kHead - 4) / 16) return bad("key count out of range");
  uint64_t total = 0;
  for (uint64_t i = 0; i < nkeys; ++i) {
    uint64_t key = 0, length = 0;
    get(&key);
    get(&length);
    m.keys.emplace_back(key, length);
    total += length;
  }
  if (version == kModelWithStateVersion) {
    m.with_state = true;
    uint32_t kind = 0;
    if (bytes.size() - 4 - pos < 8 + 8 * nkeys) return bad("truncated optimizer header");
    get(&kind);
    get(&m.state_slots);
    if (kind > static_cast<uint32_t>(OptimizerKind::kAdagrad) || m.state_slots > kMaxStateSlots) {
      return bad("unknown optimizer or state");
    }
    m.optimizer = static_cast<OptimizerKind>(kind);
    m.key_steps.resize(nkeys);
    for (uint64_t& s : m.key_steps) get(&s);
  }
  if (total * (1 + m.state_slots) * sizeof(float) != bytes.size() - 4 - pos) {
    return bad("sizes do not add up");
  }
  m.values.resize(total);
  std::memcpy(m.values.data(), bytes.data() + pos, total * sizeof(float));
  m.state.resize(total * m.state_slots);
  std::memcpy(m.state.data(), bytes.data() + pos + total * sizeof(float),
              m.state.size() * sizeof(float));
  return m;
}

}  // namespace pacer
