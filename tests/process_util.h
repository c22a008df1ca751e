// Test helpers for multi-process tests: start Pacer binaries with their
// output captured to files, wait for lines, kill them, and read /metrics.
// Every process is killed (SIGKILL) when its handle goes away, so a failing
// test never leaves one behind.
#ifndef PACER_TESTS_PROCESS_UTIL_H_
#define PACER_TESTS_PROCESS_UTIL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/scrape.h"

namespace pacer::test {

class Process {
 public:
  // Starts argv[0] with stdout and stderr written to DIR/NAME.out and .err.
  static std::unique_ptr<Process> Start(const std::vector<std::string>& argv,
                                        const std::string& dir, const std::string& name);
  ~Process();

  // Waits up to `timeout` for a stdout line starting with `prefix` and
  // returns the rest of it.
  std::optional<std::string> WaitForLine(const std::string& prefix,
                                         std::chrono::milliseconds timeout) const;
  // Waits up to `timeout` for the process to exit; its exit code, 128+signal
  // when killed, or nullopt if still running.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  bool Running();
  void Signal(int sig);
  std::string Stdout() const;
  std::string Stderr() const;
  int pid() const { return pid_; }
  const std::string& name() const { return name_; }

 private:
  Process() = default;
  int pid_ = -1;
  std::optional<int> exit_code_;
  std::string name_, out_path_, err_path_;
};

// A fresh temporary directory, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// HTTP and /metrics helpers live in ps/scrape.h (the chaos runner uses them).
using pacer::FetchMetrics;
using pacer::HttpGet;
using pacer::HttpResponse;
using pacer::MetricValue;
using pacer::UrlEncode;

// Full text of a file.
std::string ReadFile(const std::string& path);

}  // namespace pacer::test

#endif  // PACER_TESTS_PROCESS_UTIL_H_
