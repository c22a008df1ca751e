#include "monitor/fault_table.h"

#include <algorithm>
#include <utility>

#include "ps/base/fault.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

bool ValidTarget(const std::string& t) {
  if (t == "all" || t == "monitor" || t == "server" || t == "worker") return true;
  for (const std::string role : {"server:", "worker:"}) {
    if (t.rfind(role, 0) == 0 && t.size() > role.size() &&
        t.find_first_not_of("0123456789", role.size()) == std::string::npos) {
      return true;
    }
  }
  return false;
}

}  // namespace

absl::Status FaultTable::Set(const std::string& target, const std::string& spec,
                             const std::vector<uint32_t>& worker_ids,
                             const std::vector<uint32_t>& shard_ids) {
  if (!ValidTarget(target)) {
    return absl::InvalidArgumentError(
        "fault target '" + target +
        "' is not all, monitor, server, worker, server:ID or worker:ID");
  }
  for (const auto& [role, ids] :
       {std::pair<std::string, const std::vector<uint32_t>&>{"worker:", worker_ids},
        std::pair<std::string, const std::vector<uint32_t>&>{"server:", shard_ids}}) {
    if (target.rfind(role, 0) != 0) continue;
    // Digits only (ValidTarget), but maybe more than an id holds.
    const std::string digits = target.substr(role.size());
    const uint64_t id = digits.size() <= 10 ? std::stoull(digits) : UINT64_MAX;
    if (std::find(ids.begin(), ids.end(), id) != ids.end()) continue;
    std::string known;
    for (uint32_t k : ids) known += (known.empty() ? "" : ", ") + std::to_string(k);
    return absl::InvalidArgumentError(
        "no " + role.substr(0, role.size() - 1) + " has id " + digits +
        (known.empty() ? std::string(" (none has registered)")
                       : " (ids: " + known + "; pacerctl status lists them)"));
  }
  auto rules = ParseFaults(spec);
  if (!rules.ok()) return rules.status();
  entries_[target] = FaultsToString(*rules);
  ++version_;
  spdlog::warn("faults for {}: {} (version {})", target, entries_[target], version_);
  return absl::OkStatus();
}

absl::Status FaultTable::Clear(const std::string& target) {
  if (target.empty()) {
    entries_.clear();
  } else if (entries_.erase(target) == 0) {
    return absl::NotFoundError("no faults are set for '" + target + "'");
  }
  ++version_;
  spdlog::warn("faults cleared for {} (version {})", target.empty() ? "every target" : target,
               version_);
  return absl::OkStatus();
}

std::string FaultTable::For(const std::string& role, uint32_t id) const {
  std::string spec;
  for (const std::string& target : {std::string("all"), role, role + ":" + std::to_string(id)}) {
    auto it = entries_.find(target);
    if (it == entries_.end() || it->second.empty()) continue;
    spec += (spec.empty() ? "" : ";") + it->second;
  }
  return spec;
}

}  // namespace pacer
