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
// Format version 2 (pacerctl export-model --with-state) also holds the
// optimizer's state; after the key table:
//            4      the optimizer (0 sgd, 1 adam, 2 adamw, 3 adagrad), u32
//            4      S: its state slots, u32 (at most 3)
//            8·K    each key's optimizer steps, u64
//   then the values as above, then S × N floats: each state slot's values,
//   key after key (sgd: momentum; adam and adamw: m, v, max v; adagrad: sum).
#ifndef PACER_PS_MODEL_FILE_H_
#define PACER_PS_MODEL_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/optimizer_config.h"
#include "ps/base/wire.h"

namespace pacer {

struct ModelFile {
  uint64_t job_id = 0;
  uint64_t map_version = 0;
  std::vector<wire::KeyLen> keys;  // ascending
  std::vector<float> values;       // in key order
  // With the optimizer's state (written as format 2): `state` holds
  // state_slots × values.size() floats, slot after slot.
  bool with_state = false;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  uint32_t state_slots = 0;
  std::vector<uint64_t> key_steps;  // parallel to keys
  std::vector<float> state;
};

// Writes `m` to `path` (through a temporary file renamed into place, so a
// reader never sees half a file). InvalidArgument when keys and values
// disagree; Internal on I/O errors.
absl::Status WriteModelFile(const std::string& path, const ModelFile& m);
// Reads and checks a model file; DataLoss when it is damaged or not one.
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path);

}  // namespace pacer

#endif  // PACER_PS_MODEL_FILE_H_
