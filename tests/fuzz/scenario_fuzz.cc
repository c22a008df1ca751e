// libFuzzer target: the chaos scenario parser (tests/chaos/scenario.h),
// YAML through yaml-cpp and then Pacer's own checks.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/chaos/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)pacer::chaos::ParseScenario(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
