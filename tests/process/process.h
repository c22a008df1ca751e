// The tests' and the benchmarks' process helpers over ps/base/process.h (the
// one fork/exec helper): a command run to its end, temporary folders, and
// whole files.
#ifndef PACER_TESTS_PROCESS_PROCESS_H_
#define PACER_TESTS_PROCESS_PROCESS_H_

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ps/base/process.h"

namespace pacer::test {

using ::pacer::Process;
using ::pacer::ProcessOptions;

// Runs argv to its end (at most `timeout`, then it is killed) with its
// output appended to `log`: its exit code, or nullopt when it did not end
// in time or could not be started.
std::optional<int> RunLogged(const std::vector<std::string>& argv, const std::string& log,
                             std::chrono::milliseconds timeout);

// A fresh temporary directory, removed by the destructor (kept when
// PACER_KEEP_TEST_LOGS is set).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Full text of a file ("" when it cannot be read).
std::string ReadFile(const std::string& path);

}  // namespace pacer::test

#endif  // PACER_TESTS_PROCESS_PROCESS_H_
