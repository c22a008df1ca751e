#include "ps/partition.h"

#include <algorithm>
#include <limits>

namespace pacer {

std::vector<KeyRange> PartitionByBytes(std::span<const wire::KeyLen> keys, size_t num_shards) {
  std::vector<KeyRange> ranges(num_shards);
  uint64_t total = 0;
  for (const auto& k : keys) total += k.length();
  // owner[i]: the shard of key i, chosen by where the key's midpoint falls
  // on the cumulative byte line. Non-decreasing in i, so ranges stay contiguous.
  std::vector<size_t> owner(keys.size());
  long double cum = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    long double mid = cum + keys[i].length() / 2.0L;
    size_t s = total == 0 ? 0 : static_cast<size_t>(mid * num_shards / total);
    owner[i] = std::min(s, num_shards - 1);
    if (i > 0) owner[i] = std::max(owner[i], owner[i - 1]);
    cum += keys[i].length();
  }
  // Boundaries: shard s ends where the first key of a later shard begins;
  // shards left without keys get empty ranges at the top of key space.
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  size_t i = 0;
  for (size_t s = 0; s < num_shards; ++s) {
    ranges[s].begin = s == 0 ? 0 : ranges[s - 1].end;
    while (i < keys.size() && owner[i] == s) ++i;
    ranges[s].end = (s + 1 == num_shards || i == keys.size()) ? kMax : keys[i].key();
  }
  return ranges;
}

}  // namespace pacer
