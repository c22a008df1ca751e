// The exported model (pacerctl export-model): the trained parameters in one
// file that the worker can load for evaluation (pacer-worker --evaluate-model).
//
// Format, all integers little-endian:
//   offset   size   field
//   0        8      magic "PACERMDL"
//   8        4      format version (1), u32
//   12       8      job id, u64
//   20       8      shard-map version the values were read under, u64
//   28       8      K: number of keys, u64
//   36       16·K   K × (key u64, length u64), keys ascending
//   36+16K   4·N    the values, float32, key after key (N = sum of lengths)
//   end−4    4      CRC-32 (zlib's polynomial) of every byte before it
#ifndef PACER_PS_MODEL_FILE_H_
#define PACER_PS_MODEL_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/wire.h"

namespace pacer {

struct ModelFile {
  uint64_t job_id = 0;
  uint64_t map_version = 0;
  std::vector<wire::KeyLen> keys;  // ascending
  std::vector<float> values;       // in key order
};

// Writes `m` to `path` (through a temporary file renamed into place, so a
// reader never sees half a file). InvalidArgument when keys and values
// disagree; Internal on I/O errors.
absl::Status WriteModelFile(const std::string& path, const ModelFile& m);
// Reads and checks a model file; DataLoss when it is damaged or not one.
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path);

}  // namespace pacer

#endif  // PACER_PS_MODEL_FILE_H_
