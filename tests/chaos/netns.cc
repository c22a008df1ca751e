#include "tests/chaos/netns.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tests/process/process.h"

namespace pacer::chaos {
namespace {

constexpr const char* kNetnsDir = "/var/run/netns";
constexpr const char* kPrefix = "pchaos";

// How long one ip or iptables command may take.
constexpr std::chrono::seconds kCommandTimeout{30};

// Runs argv (PATH lookup, no shell) with the command line and its output
// appended to `log`; its exit code, or -1 when it could not run or end.
int RunLogged(const std::vector<std::string>& argv, const std::string& log) {
  if (FILE* f = std::fopen(log.c_str(), "a")) {
    std::string line = "$";
    for (const auto& a : argv) line += " " + a;
    std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
  }
  return test::RunLogged(argv, log, kCommandTimeout).value_or(-1);
}

}  // namespace

NetnsLab::NetnsLab(std::string log_path)
    : log_path_(std::move(log_path)), prefix_(std::string(kPrefix) + std::to_string(getpid()) + "-") {}

absl::StatusOr<std::unique_ptr<NetnsLab>> NetnsLab::Create(const std::string& log_path) {
  if (geteuid() != 0) {
    return absl::FailedPreconditionError("network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)");
  }
  auto lab = std::unique_ptr<NetnsLab>(new NetnsLab(log_path));
  lab->hub_ = lab->prefix_ + "hub";
  if (lab->Run({"ip", "netns", "add", lab->hub_}) != 0) {
    return absl::FailedPreconditionError("'ip netns add' failed (no iproute2, or no namespace "
                                         "support here); see " + log_path);
  }
  lab->made_.push_back(lab->hub_);
  if (lab->Run({"ip", "-n", lab->hub_, "link", "add", "br0", "type", "bridge"}) != 0 ||
      lab->Run({"ip", "-n", lab->hub_, "link", "set", "br0", "up"}) != 0) {
    return absl::FailedPreconditionError("cannot make a bridge in a namespace; see " + log_path);
  }
  return lab;
}

NetnsLab::~NetnsLab() {
  for (auto it = made_.rbegin(); it != made_.rend(); ++it) Run({"ip", "netns", "del", *it});
}

void NetnsLab::DeleteStale() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(kNetnsDir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const auto dash = name.find('-');
    if (dash == std::string::npos) continue;
    pid_t pid = 0;
    try {
      pid = static_cast<pid_t>(std::stol(name.substr(std::strlen(kPrefix), dash)));
    } catch (const std::exception&) {
      continue;
    }
    if (pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH)) continue;  // its runner lives
    // Its processes first (a runner killed with SIGKILL left them running).
    if (FILE* pids = popen(("ip netns pids " + name).c_str(), "r")) {
      long p = 0;
      while (std::fscanf(pids, "%ld", &p) == 1) {
        if (p > 1) kill(static_cast<pid_t>(p), SIGKILL);
      }
      pclose(pids);
    }
    RunLogged({"ip", "netns", "del", name}, "/dev/null");
  }
}

absl::Status NetnsLab::CheckIptables() {
  if (RunLogged({"iptables", "--version"}, "/dev/null") != 0) {
    return absl::FailedPreconditionError("iptables is not installed (Debian package iptables)");
  }
  // And it works inside a namespace (the nf_tables backend needs kernel
  // support that a sandbox may lack).
  if (Run({"ip", "netns", "exec", hub_, "iptables", "-w", "-S"}) != 0) {
    return absl::FailedPreconditionError("iptables does not work inside a network namespace "
                                         "here; see " + log_path_);
  }
  return absl::OkStatus();
}

int NetnsLab::Run(const std::vector<std::string>& argv) { return RunLogged(argv, log_path_); }

absl::StatusOr<std::string> NetnsLab::AddNode(const std::string& name) {
  if (nodes_.count(name)) return nodes_[name].address;
  if (next_host_ > 250) return absl::ResourceExhaustedError("more than 250 nodes");
  const int host = next_host_++;
  const std::string ns = prefix_ + name;
  // (Appended, not "v" + to_string(): GCC 12 warns falsely on that form.)
  std::string port = "v", address = "10.99.0.";
  port += std::to_string(host);  // the hub's end
  address += std::to_string(host);
  if (Run({"ip", "netns", "add", ns}) != 0) {
    return absl::InternalError("ip netns add " + ns + " failed; see " + log_path_);
  }
  made_.push_back(ns);
  // Made inside the hub, with the peer put straight into the node: the
  // pair never exists in the host's namespace.
  const std::vector<std::vector<std::string>> steps = {
      {"ip", "-n", hub_, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns},
      {"ip", "-n", hub_, "link", "set", port, "master", "br0"},
      {"ip", "-n", hub_, "link", "set", port, "up"},
      {"ip", "-n", ns, "addr", "add", address + "/24", "dev", "eth0"},
      {"ip", "-n", ns, "link", "set", "eth0", "up"},
      {"ip", "-n", ns, "link", "set", "lo", "up"},
  };
  for (const auto& step : steps) {
    if (Run(step) != 0) return absl::InternalError("setting up " + ns + " failed; see " + log_path_);
  }
  nodes_[name] = {ns, address};
  return address;
}

std::string NetnsLab::Address(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? "" : it->second.address;
}

std::string NetnsLab::NsPath(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? "" : std::string(kNetnsDir) + "/" + it->second.ns;
}

absl::Status NetnsLab::Enter(const std::string& name) {
  const std::string path = NsPath(name);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError("no namespace " + path);
  const int rc = setns(fd, CLONE_NEWNET);
  close(fd);
  if (rc != 0) return absl::InternalError("setns " + path + ": " + std::strerror(errno));
  return absl::OkStatus();
}

absl::Status NetnsLab::Cut(const std::string& name, bool cut) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return absl::NotFoundError("no node " + name);
  const std::string op = cut ? "-A" : "-D";
  for (const auto& rule : {std::vector<std::string>{"INPUT", "-i", "eth0", "-j", "DROP"},
                           std::vector<std::string>{"OUTPUT", "-o", "eth0", "-j", "DROP"}}) {
    std::vector<std::string> argv = {"ip", "netns", "exec", it->second.ns, "iptables", "-w", op};
    argv.insert(argv.end(), rule.begin(), rule.end());
    if (Run(argv) != 0) return absl::InternalError("iptables in " + it->second.ns + " failed; see " + log_path_);
  }
  return absl::OkStatus();
}

}  // namespace pacer::chaos
