#include "ps/base/process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>


namespace pacer {

namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<Process> Process::Start(const std::vector<std::string>& argv,
                                        const std::string& dir, const std::string& name,
                                        const ProcessOptions& options) {
  std::unique_ptr<Process> p(new Process());
  p->name_ = name;
  p->clock_ = options.clock;
  p->out_path_ = options.log.empty() ? dir + "/" + name + ".out" : options.log;
  p->err_path_ = options.log.empty() ? dir + "/" + name + options.stderr_suffix : options.log;
  const int mode = O_WRONLY | O_CREAT | (options.log.empty() ? O_TRUNC : O_APPEND);
  p->started_ = UnixSeconds();
  // Everything the child needs is made before the fork.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // The environment: this process's, with options.env's settings over it.
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    const bool replaced = std::any_of(options.env.begin(), options.env.end(), [&](const auto& o) {
      return o.compare(0, name.size() + 1, name + "=") == 0;
    });
    if (!replaced) env_store.push_back(kv);
  }
  env_store.insert(env_store.end(), options.env.begin(), options.env.end());
  std::vector<char*> envp;
  for (auto& kv : env_store) envp.push_back(kv.data());
  envp.push_back(nullptr);
  p->own_group_ = options.own_group;
  p->kill_group_on_exit_ = options.own_group && options.kill_group_on_exit;
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {  // as if it ended at once, with -1
    p->exit_code_ = -1;
    p->reaped_ = true;
    return p;
  }
  if (pid == 0) {
    if (options.own_group) setpgid(0, 0);
    if (options.die_with_parent) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);  // the parent is already gone
    }
    if (!options.netns.empty()) {
      const int fd = open(options.netns.c_str(), O_RDONLY);
      if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) _exit(126);
      close(fd);
    }
    const int out = open(p->out_path_.c_str(), mode, 0644);
    const int err = open(p->err_path_.c_str(), mode, 0644);
    const int devnull = open("/dev/null", O_RDONLY);
    if (out < 0 || err < 0 || devnull < 0) _exit(126);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    dup2(devnull, STDIN_FILENO);
    for (int fd : {out, err, devnull}) {
      if (fd > STDERR_FILENO) close(fd);
    }
    if (options.search_path) {
      execvpe(args[0], args.data(), envp.data());
    } else {
      execve(args[0], args.data(), envp.data());
    }
    // Why, in its log (only async-signal-safe calls after a fork).
    const char* why = strerrordesc_np(errno);
    for (const char* part : {"cannot run ", static_cast<const char*>(args[0]), ": ",
                             why != nullptr ? why : "?", "\n"}) {
      if (write(STDERR_FILENO, part, strlen(part)) < 0) break;
    }
    _exit(127);
  }
  if (options.own_group) setpgid(pid, pid);  // as the child does: whichever runs first
  p->pid_ = pid;
  return p;
}

Process::~Process() {
  if (Running()) {
    Signal(SIGKILL);
    Wait(std::chrono::seconds(5));
  }
}

std::string Process::Stdout() const { return Slurp(out_path_); }
std::string Process::Stderr() const { return Slurp(err_path_); }

std::optional<std::string> Process::WaitForLine(const std::string& prefix,
                                                std::chrono::milliseconds timeout) {
  const Clock* clock = clock_;
  const TimePoint deadline = clock->Now() + timeout;
  for (;;) {
    // Whether it still runs before reading: a line printed just before it
    // exited is then still found.
    const bool running = Running();
    std::istringstream in(Stdout());
    for (std::string line; std::getline(in, line);) {
      if (line.rfind(prefix, 0) == 0) return line.substr(prefix.size());
    }
    if (!running || clock->Now() >= deadline) return std::nullopt;
    clock->SleepUntil(std::min(deadline, clock->Now() + std::chrono::milliseconds(20)));
  }
}

std::optional<int> Process::Wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  const Clock* clock = clock_;
  const TimePoint deadline = clock->Now() + timeout;
  for (;;) {
    if (kill_group_on_exit_) {
      // Exited, not reaped yet (WNOWAIT): its group's id cannot be reused.
      siginfo_t info{};
      if (waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
          info.si_pid == pid_) {
        kill(-pid_, SIGKILL);
      }
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      ended_ = UnixSeconds();
      reaped_ = true;
      return exit_code_;
    }
    if (clock->Now() >= deadline) return std::nullopt;
    clock->SleepUntil(std::min(deadline, clock->Now() + std::chrono::milliseconds(10)));
  }
}

bool Process::Running() { return !Wait(std::chrono::milliseconds(0)).has_value(); }

void Process::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

void Process::SignalGroup(int sig) {
  if (!reaped_) kill(own_group_ ? -pid_ : pid_, sig);
}

}  // namespace pacer
