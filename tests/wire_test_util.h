// Test helper: a hand-written envelope, so that tests can put any value in
// any field, including ones Encode never writes.
#ifndef PACER_TESTS_WIRE_TEST_UTIL_H_
#define PACER_TESTS_WIRE_TEST_UTIL_H_

#include <cstring>
#include <vector>

#include "ps/base/wire.h"

namespace pacer::test {

// Frame 0 laid out as ps/base/wire.h documents.
inline Frame RawEnvelope(uint16_t version, uint16_t type, uint64_t job, uint32_t sender,
                         uint32_t crc, uint64_t request, uint64_t payload_bytes,
                         uint32_t magic = kMagic) {
  std::vector<uint8_t> e(kEnvelopeBytes);
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
  put(crc);
  put(request);
  put(payload_bytes);
  return Frame::FromVector(std::move(e));
}

}  // namespace pacer::test

#endif  // PACER_TESTS_WIRE_TEST_UTIL_H_
