// Runs pacerctl against a test cluster (tests/cluster_harness.h).
#ifndef PACER_TESTS_PACERCTL_UTIL_H_
#define PACER_TESTS_PACERCTL_UTIL_H_

#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/cluster_harness.h"

namespace pacer::test {

struct CtlRun {
  int code = -1;
  std::string out, err;
};

// pacerctl --monitor <the cluster's monitor> ARGS, its output in DIR/NAME.*.
inline CtlRun Ctl(Cluster& c, const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> argv = {PACERCTL_BIN, "--monitor", c.monitor_address};
  argv.insert(argv.end(), args.begin(), args.end());
  auto p = Process::Start(argv, c.dir.path(), name);
  CtlRun r;
  r.code = p->Wait(std::chrono::seconds(60)).value_or(-1);
  r.out = p->Stdout();
  r.err = p->Stderr();
  return r;
}

// pacerctl status -o json, parsed (discarded when it does not parse).
inline nlohmann::json Status(Cluster& c) {
  CtlRun r = Ctl(c, {"status", "-o", "json"}, "status-json");
  EXPECT_EQ(r.code, 0) << r.err;
  return nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
}

}  // namespace pacer::test

#endif  // PACER_TESTS_PACERCTL_UTIL_H_
