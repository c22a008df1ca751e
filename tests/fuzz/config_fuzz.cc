// libFuzzer target: the settings parsers. The first byte picks one; the
// rest is its text:
//   0: a --config file (CLI11's TOML-like reader, as every binary uses it)
//   1: --faults / PACER_FAULTS rules (ps/base/fault.h ParseFaults)
//   2: a key file (ps/base/security.h ParseKeyFile)
//   3: an allowed-keys file (ParseAllowedKeys)
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>

#include "CLI/CLI.hpp"
#include "ps/base/fault.h"
#include "ps/base/security.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0: {
      CLI::App app{"fuzz"};
      std::string monitor, listen;
      double lr = 0;
      int workers = 0;
      bool flag = false;
      std::vector<int> layers;
      app.add_option("--monitor", monitor);
      app.add_option("--listen", listen);
      app.add_option("--lr", lr);
      app.add_option("--min-workers", workers);
      app.add_option("--layers", layers)->delimiter(',');
      app.add_flag("--no-crc", flag);
      app.allow_config_extras(false);
      std::istringstream in(text);
      try {
        app.parse_from_stream(in);
      } catch (const CLI::Error&) {
        // A clear error is the expected outcome for bad input.
      }
      break;
    }
    case 1:
      (void)pacer::ParseFaults(text);
      break;
    case 2:
      (void)pacer::ParseKeyFile(text, "fuzz.key");
      break;
    case 3:
      (void)pacer::ParseAllowedKeys(text, "fuzz.allowed");
      break;
  }
  return 0;
}
