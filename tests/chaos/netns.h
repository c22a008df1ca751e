// pacer-chaos's real-network mode (--netns): every process of the cluster in
// its own network namespace, so that what crosses between them is real TCP
// over veth links, and a partition is the kernel dropping packets (iptables
// inside the namespace), not Pacer's fault layer.
//
// The namespaces are joined to each other only: each node's `eth0` is one
// end of a veth pair whose other end is a port of a bridge in a hub
// namespace that runs nothing. No veth reaches the host's own namespace (the
// pairs are created inside the hub), no namespace has a default route, and
// every process, pacer-chaos's own probes included, runs inside one, so no
// packet can leave them. Nodes get 10.99.0.N/24.
#ifndef PACER_TESTS_CHAOS_NETNS_H_
#define PACER_TESTS_CHAOS_NETNS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pacer::chaos {

class NetnsLab {
 public:
  // Makes the hub namespace and its bridge; names start with
  // "pchaos<pid>-". FailedPrecondition with the reason where this process
  // may not (not root, no `ip`, no namespace support). Commands and their
  // errors are appended to `log_path`.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<NetnsLab>> Create(
      const std::string& log_path);
  // Deletes every namespace it made (with them, their veth pairs).
  ~NetnsLab();
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  // Deletes namespaces left by earlier runs whose pacer-chaos is gone
  // (killed before it could clean up), after killing what runs in them.
  static void DeleteStale();
  // Whether iptables is installed and works inside a namespace here
  // (partitions need it); else why not.
  absl::Status CheckIptables();

  // Adds node `name` (e.g. "shard0"): its namespace, on the bridge with the
  // next address. Returns that address.
  absl::StatusOr<std::string> AddNode(const std::string& name);
  // The node's address, and its namespace's path for setns(2); "" when
  // there is no such node.
  std::string Address(const std::string& name) const;
  std::string NsPath(const std::string& name) const;
  // Moves the calling thread into the node's namespace.
  absl::Status Enter(const std::string& name);
  // Cuts the node off from every other (iptables DROP on eth0, in and
  // out), or lets it back.
  absl::Status Cut(const std::string& name, bool cut);

 private:
  explicit NetnsLab(std::string log_path);
  // Runs a command (no shell) with output to the log; its exit code.
  int Run(const std::vector<std::string>& argv);

  std::string log_path_;
  std::string prefix_;  // "pchaos<pid>-"
  std::string hub_;     // the hub namespace
  std::vector<std::string> made_;  // namespaces, in creation order
  struct Node {
    std::string ns;
    std::string address;
  };
  std::map<std::string, Node> nodes_;
  int next_host_ = 1;
};

}  // namespace pacer::chaos

#endif  // PACER_TESTS_CHAOS_NETNS_H_
