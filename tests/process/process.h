// Child processes with their output in files: the one fork/exec helper of
// the chaos runner (pacer-chaos), the benchmarks and the multi-process
// tests. Every process still running when its handle goes is killed
// (SIGKILL), so a failing caller never leaves one behind.
#ifndef PACER_TESTS_PROCESS_PROCESS_H_
#define PACER_TESTS_PROCESS_PROCESS_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/base/clock.h"

namespace pacer::test {

struct ProcessOptions {
  // The path of a network namespace to run in (/run/netns/NAME); "": this one.
  std::string netns;
  // The stderr file is DIR/NAME plus this.
  std::string stderr_suffix = ".err";
  // In a process group of its own (setpgid): a Ctrl-C at the terminal
  // reaches only the caller, which stops its children itself.
  bool own_group = false;
  // When set, stdout and stderr are both appended to this file instead.
  std::string log;
  // argv[0] may be a bare command name, looked up in PATH.
  bool search_path = false;
  // The clock its waits count on.
  const Clock* clock = Clock::Real();
};

class Process {
 public:
  // Starts argv[0] (a path) with stdin from /dev/null and stdout and stderr
  // written to DIR/NAME.out and DIR/NAME.err (ProcessOptions::stderr_suffix).
  static std::unique_ptr<Process> Start(const std::vector<std::string>& argv,
                                        const std::string& dir, const std::string& name,
                                        const ProcessOptions& options = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  // Waits up to `timeout` for a stdout line starting with `prefix` and
  // returns the rest of it; nullopt once it passes, or once the process has
  // exited without printing one.
  std::optional<std::string> WaitForLine(const std::string& prefix,
                                         std::chrono::milliseconds timeout);
  // Waits up to `timeout` for the process to exit; its exit code, 128+signal
  // when killed, or nullopt if still running.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  bool Running();
  // Sends `sig` unless it has been reaped (its pid may be another's then).
  void Signal(int sig);
  std::string Stdout() const;
  std::string Stderr() const;
  int pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& stdout_path() const { return out_path_; }
  std::optional<int> exit_code() const { return exit_code_; }
  // Unix seconds it was started and reaped (0 until then).
  double started() const { return started_; }
  double ended() const { return ended_; }
  // Reaped: safe to read from any thread (a signalling thread checks it).
  bool reaped() const { return reaped_; }

 private:
  Process() = default;
  int pid_ = -1;
  const Clock* clock_ = Clock::Real();
  std::optional<int> exit_code_;
  std::atomic<bool> reaped_{false};
  double started_ = 0, ended_ = 0;
  std::string name_, out_path_, err_path_;
};

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
