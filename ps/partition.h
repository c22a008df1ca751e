// Range partitioning of the model's keys across shards, balanced by bytes.
#ifndef PACER_PS_PARTITION_H_
#define PACER_PS_PARTITION_H_

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "ps/pacer_generated.h"

namespace pacer {

// [begin, end) of key space owned by one shard.
struct KeyRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool Contains(uint64_t key) const { return key >= begin && key < end; }
};

// Splits `keys` (sorted by key, unique) into `num_shards` contiguous ranges
// so that each shard's parameter bytes are as close to total/num_shards as
// whole keys allow. The ranges cover the whole key space in order: the first
// starts at 0, the last ends at UINT64_MAX, and each begins where the
// previous ends. A shard may get an empty range when keys are fewer than
// shards. num_shards must be >= 1. Key UINT64_MAX is reserved: no range
// can hold it (ranges are half-open), so models must not use it.
std::vector<KeyRange> PartitionByBytes(std::span<const wire::KeyLen> keys, size_t num_shards);

}  // namespace pacer

#endif  // PACER_PS_PARTITION_H_
