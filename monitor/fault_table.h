// The run-time fault table (pacerctl fault): a fault spec per target (all,
// monitor, server, worker, server:ID, worker:ID) and its version. The
// monitor hands each process its share with every heartbeat reply; a
// process applies it when the version changed. Not kept across a monitor
// restart.
#ifndef PACER_MONITOR_FAULT_TABLE_H_
#define PACER_MONITOR_FAULT_TABLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pacer {

class FaultTable {
 public:
  // Sets `target`'s rules (replacing what it had). InvalidArgument, saying
  // why, for a malformed target or spec, or a server:ID / worker:ID whose ID
  // is none of `worker_ids` / `shard_ids` (a typo would set faults nobody
  // ever gets).
  absl::Status Set(const std::string& target, const std::string& spec,
                   const std::vector<uint32_t>& worker_ids, const std::vector<uint32_t>& shard_ids);
  // Clears `target`'s rules, or every target's when it is empty; NotFound
  // when it has none.
  absl::Status Clear(const std::string& target);
  // The spec for process ROLE:ID (role "monitor", "server" or "worker"): the
  // specs of "all", ROLE and ROLE:ID joined.
  std::string For(const std::string& role, uint32_t id) const;
  uint64_t version() const { return version_; }
  // Target -> spec, in the normal form of FaultsToString.
  const std::map<std::string, std::string>& entries() const { return entries_; }

 private:
  std::map<std::string, std::string> entries_;
  uint64_t version_ = 0;
};

}  // namespace pacer

#endif  // PACER_MONITOR_FAULT_TABLE_H_
