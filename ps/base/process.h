// Child processes with their output in files: the one fork/exec helper, of
// pacer-run (worker/run), the chaos runner (pacer-chaos), the benchmarks
// and the multi-process tests. Every process still running when its handle
// goes is killed (SIGKILL), so a failing caller never leaves one behind.
#ifndef PACER_PS_BASE_PROCESS_H_
#define PACER_PS_BASE_PROCESS_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ps/base/clock.h"

namespace pacer {

struct ProcessOptions {
  // The path of a network namespace to run in (/run/netns/NAME); "": this one.
  std::string netns;
  // The stderr file is DIR/NAME plus this.
  std::string stderr_suffix = ".err";
  // In a process group of its own (setpgid): a Ctrl-C at the terminal
  // reaches only the caller, which stops its children itself.
  bool own_group = false;
  // With own_group: once it has exited, whatever it left in its group is
  // killed (SIGKILL) before it is reaped, while its pid (the group's id)
  // is still reserved, so no other process can be hit.
  bool kill_group_on_exit = false;
  // When set, stdout and stderr are both appended to this file instead.
  std::string log;
  // argv[0] may be a bare command name, looked up in PATH.
  bool search_path = false;
  // NAME=VALUE settings added to (or replacing in) the inherited environment.
  std::vector<std::string> env;
  // Sent SIGKILL by the kernel when the thread that started it ends
  // (PR_SET_PDEATHSIG), so that it never outlives a caller killed outright.
  bool die_with_parent = false;
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
  // The same to its whole process group (ProcessOptions::own_group: it and
  // whatever it started that stayed in its group); else as Signal.
  void SignalGroup(int sig);
  std::string Stdout() const;
  std::string Stderr() const;
  int pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& stdout_path() const { return out_path_; }
  const std::string& stderr_path() const { return err_path_; }
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
  bool own_group_ = false;
  bool kill_group_on_exit_ = false;
  double started_ = 0, ended_ = 0;
  std::string name_, out_path_, err_path_;
};

}  // namespace pacer

#endif  // PACER_PS_BASE_PROCESS_H_
