// Test helper: a hand-written envelope, so that tests can put any value in
// any field, including ones Encode never writes. Its checks are computed here
// from ps/base/wire.h's description with libxxhash directly, not with the
// code under test.
#ifndef PACER_TESTS_WIRE_TEST_UTIL_H_
#define PACER_TESTS_WIRE_TEST_UTIL_H_

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "ps/base/wire.h"

namespace pacer::test {

// Frame 0 laid out as ps/base/wire.h documents, for `header` and `payload`
// (frames 1 and 2): the block checks and the check computed, unless `check`
// is given (then no block checks either).
inline Frame RawEnvelope(uint16_t version, uint16_t type, uint64_t job, uint32_t sender,
                         const Frame& header, uint64_t request, const Frame& payload = {},
                         uint32_t magic = kMagic, std::optional<uint64_t> check = std::nullopt) {
  const uint32_t blocks =
      check ? 0 : static_cast<uint32_t>((payload.size() + kCheckBlockBytes - 1) / kCheckBlockBytes);
  std::vector<uint8_t> e(48 + size_t{blocks} * 8);
  uint8_t* p = e.data();
  auto put = [&p](const auto v) {
    std::memcpy(p, &v, sizeof(v));
    p += sizeof(v);
  };
  put(magic);
  put(version);
  put(type);
  put(job);
  put(sender);
  put(blocks);
  put(request);
  put(static_cast<uint64_t>(payload.size()));
  for (uint32_t b = 0; b < blocks; ++b) {
    const size_t off = size_t{b} * kCheckBlockBytes;
    put(static_cast<uint64_t>(
        XXH3_64bits(payload.data() + off, std::min(kCheckBlockBytes, payload.size() - off))));
  }
  const uint64_t seed = XXH3_64bits(e.data(), e.size() - 8);
  put(check ? *check : static_cast<uint64_t>(XXH3_64bits_withSeed(header.data(), header.size(), seed)));
  return Frame::FromVector(std::move(e));
}

}  // namespace pacer::test

#endif  // PACER_TESTS_WIRE_TEST_UTIL_H_
