// libFuzzer target: the checkpoint reader (ps/checkpoint.h ParseCheckpoint).
// Input: the header record as a 4-byte little-endian length and its bytes;
// what follows is handed out as the chunk records, in the order they are
// asked for, each as a 4-byte length and its bytes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ps/checkpoint.h"

namespace {

bool Take(std::string_view* in, std::string* out) {
  if (in->size() < 4) return false;
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>((*in)[static_cast<size_t>(i)]);
  in->remove_prefix(4);
  n = static_cast<uint32_t>(std::min<size_t>(n, in->size()));
  *out = std::string(in->substr(0, n));
  in->remove_prefix(n);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string meta;
  if (!Take(&in, &meta)) return 0;
  (void)pacer::ParseCheckpoint(meta, [&](const std::string&) -> std::optional<std::string> {
    std::string chunk;
    if (!Take(&in, &chunk)) return std::nullopt;
    return chunk;
  });
  return 0;
}
