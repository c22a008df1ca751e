#include "worker/chunk_reader.h"

#include <algorithm>
#include <numeric>
#include <random>

namespace pacer::worker {

namespace {

// Every worker must compute the same order, whatever standard library it
// was built with: std::shuffle and std::uniform_int_distribution are
// implementation-defined, mt19937_64's output is not. So the draws and the
// shuffle are our own.

// Uniform in [0, bound), bound > 0: rejection of the engine's top values
// that would bias the remainder.
uint64_t Below(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t skew = (UINT64_MAX % bound + 1) % bound;  // 2^64 mod bound
  uint64_t x = rng();
  while (skew != 0 && x > UINT64_MAX - skew) x = rng();
  return x % bound;
}

// Fisher-Yates.
template <typename T>
void Shuffle(T* first, size_t n, std::mt19937_64& rng) {
  for (size_t i = n; i > 1; --i) std::swap(first[i - 1], first[Below(rng, i)]);
}

}  // namespace

std::vector<uint32_t> EpochOrder(uint64_t seed, uint32_t epoch, size_t samples) {
  std::vector<uint32_t> pool(samples);
  std::iota(pool.begin(), pool.end(), 0u);
  // Not the partitions' seeding (seed, partition, epoch): a stream epoch's
  // order must not equal a partition's.
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t{epoch} * 1000003 + 17);
  if (samples == 0) return pool;
  // S = 2^bits slices; slice s is pool[first[s], first[s + 1]), shuffled.
  size_t bits = 0;
  while ((size_t{2} << bits) <= std::min(samples, kEpochStrata)) ++bits;
  const size_t strata = size_t{1} << bits;
  std::vector<size_t> first(strata + 1);
  for (size_t s = 0; s <= strata; ++s) first[s] = s * samples / strata;
  for (size_t s = 0; s < strata; ++s) {
    Shuffle(pool.data() + first[s], first[s + 1] - first[s], rng);
  }
  std::vector<size_t> reversed(strata, 0);  // bit-reversed step numbers
  for (size_t j = 0; j < strata; ++j) {
    for (size_t b = 0; b < bits; ++b) reversed[j] |= ((j >> b) & 1) << (bits - 1 - b);
  }
  std::vector<uint32_t> order;
  order.reserve(samples);
  for (size_t r = 0; order.size() < samples; ++r) {
    const size_t mask = Below(rng, strata);
    for (size_t j = 0; j < strata; ++j) {
      const size_t s = reversed[j] ^ mask;
      if (first[s] + r < first[s + 1]) order.push_back(pool[first[s] + r]);
    }
  }
  return order;
}

void ChunkReader::Sync(const std::vector<wire::DataChunk>& grants) {
  std::set<uint64_t> listed;
  for (const wire::DataChunk& g : grants) {
    listed.insert(g.id());
    if (done_.count(g.id())) continue;  // trained; the monitor hears next
    auto it = held_.find(g.id());
    if (it == held_.end()) {
      if (g.end() > samples_ || g.begin() > g.pos() || g.pos() > g.end()) continue;
      held_[g.id()] = {g.epoch(), g.begin(), g.end(), g.pos()};
      continue;
    }
    // Ours already: we are ahead of the monitor's position. Its end only
    // comes down (a tail asked for another worker), never below what we
    // have read.
    Held& h = it->second;
    auto in = inflight_.find(g.id());
    const uint64_t read = h.pos + (in == inflight_.end() ? 0 : in->second);
    h.end = std::max(std::min(h.end, g.end()), read);
  }
  for (auto it = held_.begin(); it != held_.end();) {
    if (listed.count(it->first)) {
      ++it;
      continue;
    }
    inflight_.erase(it->first);
    it = held_.erase(it);
  }
  for (uint64_t id : reported_) {
    if (!listed.count(id)) done_.erase(id);
  }
  reported_.clear();
  // Orders of epochs no longer held.
  for (auto it = orders_.begin(); it != orders_.end();) {
    const uint32_t e = it->first;
    const bool used = std::any_of(held_.begin(), held_.end(),
                                  [e](const auto& kv) { return kv.second.epoch == e; });
    it = used ? std::next(it) : orders_.erase(it);
  }
}

const std::vector<uint32_t>& ChunkReader::Order(uint32_t epoch) {
  auto it = orders_.find(epoch);
  if (it == orders_.end()) it = orders_.emplace(epoch, EpochOrder(seed_, epoch, samples_)).first;
  return it->second;
}

uint64_t ChunkReader::Read(uint64_t chunk, const Held& h) const {
  auto in = inflight_.find(chunk);
  return std::min(h.end, h.pos + (in == inflight_.end() ? 0 : in->second));
}

std::optional<ChunkReader::Span> ChunkReader::PlanPositions(size_t n, bool add) {
  if (!add) inflight_.clear();
  std::pair<const uint64_t, Held>* next = nullptr;
  for (auto& kv : held_) {
    if (Read(kv.first, kv.second) >= kv.second.end) continue;
    if (next == nullptr || std::make_pair(kv.second.epoch, kv.first) <
                               std::make_pair(next->second.epoch, next->first)) {
      next = &kv;
    }
  }
  if (next == nullptr || n == 0) return std::nullopt;
  const Held& h = next->second;
  const uint64_t at = Read(next->first, h);
  Span s{next->first, h.epoch, at, std::min<uint64_t>(n, h.end - at)};
  inflight_[s.chunk] += s.count;
  last_batch_ = s.count;
  last_chunk_ = s.chunk;
  return s;
}

std::optional<ChunkReader::Batch> ChunkReader::Plan(size_t n, bool add) {
  const std::optional<Span> s = PlanPositions(n, add);
  if (!s) return std::nullopt;
  const std::vector<uint32_t>& order = Order(s->epoch);
  Batch b;
  b.chunk = s->chunk;
  b.epoch = s->epoch;
  b.samples.assign(order.begin() + static_cast<long>(s->pos),
                   order.begin() + static_cast<long>(s->pos + s->count));
  return b;
}

void ChunkReader::Unplan() {
  auto in = inflight_.find(last_chunk_);
  if (in == inflight_.end()) return;
  in->second -= std::min(in->second, last_batch_);
  if (in->second == 0) inflight_.erase(in);
  last_batch_ = 0;
}

std::set<uint64_t> ChunkReader::Ack() {
  std::set<uint64_t> acked;
  for (const auto& [chunk, n] : inflight_) {
    auto it = held_.find(chunk);
    if (it == held_.end()) continue;
    acked.insert(chunk);
    it->second.pos = std::min(it->second.end, it->second.pos + n);
    if (it->second.pos >= it->second.end) {
      done_[it->first] = it->second;
      held_.erase(it);
    }
  }
  inflight_.clear();
  return acked;
}

std::vector<wire::DataChunk> ChunkReader::Report() {
  std::vector<wire::DataChunk> out;
  for (const auto& [id, h] : held_) {
    const uint64_t pos = exact_positions_ ? h.pos : std::min(h.end, h.pos + last_batch_);
    out.emplace_back(id, h.begin, h.end, pos, h.epoch);
  }
  for (const auto& [id, h] : done_) {
    out.emplace_back(id, h.begin, h.end, h.pos, h.epoch);
    reported_.insert(id);
  }
  return out;
}

bool ChunkReader::has_data() const {
  return std::any_of(held_.begin(), held_.end(), [this](const auto& kv) {
    return Read(kv.first, kv.second) < kv.second.end;
  });
}

}  // namespace pacer::worker
