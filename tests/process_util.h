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

// An HTTP/1.0 GET of http://ADDRESS/PATH (ADDRESS is an IPv4 HOST:PORT).
struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string body;
};
HttpResponse HttpGet(const std::string& address, const std::string& path,
                     const std::vector<std::string>& headers = {});
// GET http://ADDRESS/metrics; empty on failure.
std::string FetchMetrics(const std::string& address);
// Percent-encodes a query-string value.
std::string UrlEncode(const std::string& s);
// The value of the first sample named `name` whose label set contains every
// `k="v"` in `labels` (e.g. {"reason=\"bad_crc\""}), or nullopt.
std::optional<double> MetricValue(const std::string& exposition, const std::string& name,
                                  const std::vector<std::string>& labels = {});

// Full text of a file.
std::string ReadFile(const std::string& path);

}  // namespace pacer::test

#endif  // PACER_TESTS_PROCESS_UTIL_H_
