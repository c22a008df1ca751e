#include "tests/chaos/scenario.h"

#include <algorithm>
#include <map>
#include <set>

#include "ps/base/fault.h"
#include "yaml-cpp/yaml.h"

namespace pacer::chaos {

bool Action::Heals() const {
  return what == "restart" || what == "cont" || what == "clear-faults" || what == "add-worker" ||
         what == "add-shard" || what == "drain-shard";
}

namespace {

// Reads `node` as T; an error names `where`.
template <class T>
absl::Status Read(const YAML::Node& node, const std::string& where, T* out) {
  try {
    *out = node.as<T>();
    return absl::OkStatus();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(where + ": " + e.msg);
  }
}

absl::Status CheckKeys(const YAML::Node& node, const std::string& where,
                       const std::set<std::string>& allowed) {
  if (!node.IsMap()) return absl::InvalidArgumentError(where + ": expected a mapping");
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(where + ": keys must be plain names");
    }
    const std::string key = kv.first.as<std::string>();
    if (!allowed.count(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return absl::InvalidArgumentError(where + ": unknown key '" + key + "' (" + list + ")");
    }
  }
  return absl::OkStatus();
}

// "shard:I" / "worker:I" with I < count, "backup:I" (the shard backing up
// shard I's range when the action runs) with I < shards, or "monitor"
// when allowed.
bool ValidProcess(const std::string& t, int shards, int workers, bool monitor_ok) {
  if (t == "monitor") return monitor_ok;
  for (const auto& [role, n] : {std::pair<std::string, int>{"shard:", shards},
                                {"worker:", workers},
                                {"backup:", shards}}) {
    if (t.rfind(role, 0) == 0 && t.size() > role.size() && t.size() <= role.size() + 6 &&
        t.find_first_not_of("0123456789", role.size()) == std::string::npos) {
      return std::stoi(t.substr(role.size())) < n;
    }
  }
  return false;
}

}  // namespace

namespace {
absl::StatusOr<Scenario> ParseChecked(const std::string& yaml);
}  // namespace

absl::StatusOr<std::string> ExpandShardRefs(
    std::string spec, const std::function<std::optional<std::string>(const std::string&)>& resolve) {
  for (size_t at = spec.find("{shard:"); at != std::string::npos; at = spec.find("{shard:", at)) {
    const size_t end = spec.find('}', at);
    const std::string ref = end == std::string::npos ? "" : spec.substr(at + 1, end - at - 1);
    const std::optional<std::string> id = ref.empty() ? std::nullopt : resolve(ref);
    if (!id) return absl::InvalidArgumentError("'" + spec.substr(at) + "' is not {shard:I}");
    spec.replace(at, end - at + 1, *id);
    at += id->size();
  }
  return spec;
}

absl::StatusOr<Scenario> ParseScenario(const std::string& yaml) {
  // Every check below reports what is wrong; this catches what a check
  // missed (found by tests/fuzz/scenario_fuzz: a YAML conversion that threw).
  try {
    return ParseChecked(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError("scenario: " + e.msg);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(std::string("scenario: ") + e.what());
  }
}

namespace {
absl::StatusOr<Scenario> ParseChecked(const std::string& yaml) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError("not YAML: " + e.msg);
  }
  Scenario s;
  if (auto st = CheckKeys(root, "scenario",
                          {"name", "description", "seconds", "cluster", "timeline", "invariants",
                           "expect_fail"});
      !st.ok()) {
    return st;
  }
  if (!root["name"]) return absl::InvalidArgumentError("scenario: 'name' is required");
  if (auto st = Read(root["name"], "name", &s.name); !st.ok()) return st;
  if (root["description"]) {
    if (auto st = Read(root["description"], "description", &s.description); !st.ok()) return st;
  }
  if (root["seconds"]) {
    if (auto st = Read(root["seconds"], "seconds", &s.seconds); !st.ok()) return st;
  }
  if (s.seconds <= 0 || s.seconds > 600) {
    return absl::InvalidArgumentError("seconds: must be in (0, 600]");
  }
  if (const YAML::Node c = root["cluster"]) {
    if (auto st = CheckKeys(c, "cluster",
                            {"shards", "workers", "mode", "checkpoint_interval", "monitor_args",
                             "shard_args", "worker_args"});
        !st.ok()) {
      return st;
    }
    for (const auto& [key, out] : {std::pair<const char*, int*>{"shards", &s.shards},
                                   {"workers", &s.workers}}) {
      if (c[key]) {
        if (auto st = Read(c[key], std::string("cluster.") + key, out); !st.ok()) return st;
      }
    }
    if (c["mode"]) {
      if (auto st = Read(c["mode"], "cluster.mode", &s.mode); !st.ok()) return st;
    }
    if (c["checkpoint_interval"]) {
      if (auto st = Read(c["checkpoint_interval"], "cluster.checkpoint_interval",
                         &s.checkpoint_interval);
          !st.ok()) {
        return st;
      }
    }
    for (const auto& [key, out] :
         {std::pair<const char*, std::vector<std::string>*>{"monitor_args", &s.monitor_args},
          {"shard_args", &s.shard_args},
          {"worker_args", &s.worker_args}}) {
      if (c[key]) {
        if (auto st = Read(c[key], std::string("cluster.") + key, out); !st.ok()) return st;
      }
    }
  }
  if (s.shards < 1 || s.shards > 8) return absl::InvalidArgumentError("cluster.shards: 1..8");
  if (s.workers < 1 || s.workers > 8) return absl::InvalidArgumentError("cluster.workers: 1..8");

  int workers_ever = s.workers;  // add-worker makes more
  int shards_ever = s.shards;    // add-shard too
  if (const YAML::Node t = root["timeline"]) {
    if (!t.IsSequence()) return absl::InvalidArgumentError("timeline: expected a list");
    std::vector<std::pair<std::string, Action>> read;  // (where in the file, action)
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string where = "timeline[" + std::to_string(i) + "]";
      if (auto st = CheckKeys(t[i], where, {"at", "do", "target", "spec", "seconds", "factor", "from"});
          !st.ok()) {
        return st;
      }
      Action a;
      if (!t[i]["at"] || !t[i]["do"]) {
        return absl::InvalidArgumentError(where + ": 'at' and 'do' are required");
      }
      if (auto st = Read(t[i]["at"], where + ".at", &a.at); !st.ok()) return st;
      if (auto st = Read(t[i]["do"], where + ".do", &a.what); !st.ok()) return st;
      if (t[i]["target"]) {
        if (auto st = Read(t[i]["target"], where + ".target", &a.target); !st.ok()) return st;
      }
      if (t[i]["spec"]) {
        if (auto st = Read(t[i]["spec"], where + ".spec", &a.spec); !st.ok()) return st;
      }
      if (t[i]["seconds"]) {
        if (auto st = Read(t[i]["seconds"], where + ".seconds", &a.seconds); !st.ok()) return st;
      }
      if (t[i]["factor"]) {
        if (auto st = Read(t[i]["factor"], where + ".factor", &a.factor); !st.ok()) return st;
      }
      if (t[i]["from"]) {
        if (auto st = Read(t[i]["from"], where + ".from", &a.from); !st.ok()) return st;
      }
      if (a.at < 0 || a.at >= s.seconds) {
        return absl::InvalidArgumentError(where + ".at: must be within the scenario's seconds");
      }
      read.push_back({where, std::move(a)});
    }
    // Checked in the order they will run (a target must exist by then).
    std::stable_sort(read.begin(), read.end(),
                     [](const auto& x, const auto& y) { return x.second.at < y.second.at; });
    for (auto& [where, a] : read) {
      const std::set<std::string> process_actions = {"kill", "restart", "stop", "cont", "terminate"};
      if (process_actions.count(a.what)) {
        if (!ValidProcess(a.target, shards_ever, workers_ever, a.what != "terminate")) {
          return absl::InvalidArgumentError(where + ".target: '" + a.target +
                                            "' is not shard:I, backup:I, worker:I or monitor of this cluster");
        }
      } else if (a.what == "add-worker") {
        ++workers_ever;
      } else if (a.what == "add-shard") {
        ++shards_ever;
      } else if (a.what == "drain-shard") {
        if (a.target.rfind("shard:", 0) != 0 || !ValidProcess(a.target, shards_ever, 0, false)) {
          return absl::InvalidArgumentError(where + ".target: '" + a.target +
                                            "' is not shard:I of this cluster");
        }
      } else if (a.what == "slow") {
        if (!ValidProcess(a.target, shards_ever, workers_ever, true) || a.factor <= 1 ||
            a.factor > 100 || a.seconds <= 0) {
          return absl::InvalidArgumentError(where + ": slow needs a target (shard:I, worker:I or "
                                                    "monitor), factor in (1, 100] and seconds > 0");
        }
        if (a.at + a.seconds > s.seconds) {
          return absl::InvalidArgumentError(where + ": slow must end within the scenario's seconds");
        }
      } else if (a.what == "faults") {
        if (a.target.empty() || a.spec.empty()) {
          return absl::InvalidArgumentError(where + ": faults needs a target and a spec");
        }
        // "{shard:I}" stands for shard I's id, known once it runs.
        auto spec = ExpandShardRefs(a.spec, [&](const std::string& ref) -> std::optional<std::string> {
          if (ref.rfind("shard:", 0) != 0 || !ValidProcess(ref, shards_ever, 0, false)) {
            return std::nullopt;
          }
          return "0";
        });
        if (!spec.ok()) {
          return absl::InvalidArgumentError(where + ".spec: " + std::string(spec.status().message()) +
                                            " of this cluster");
        }
        auto rules = ParseFaults(*spec);
        if (!rules.ok()) return absl::InvalidArgumentError(where + ".spec: " + std::string(rules.status().message()));
        const bool role = a.target == "all" || a.target == "monitor" || a.target == "server" ||
                          a.target == "worker";
        if (!role && !ValidProcess(a.target, s.shards, workers_ever, false)) {
          return absl::InvalidArgumentError(where + ".target: '" + a.target +
                                            "' is not all, monitor, server, worker, shard:I or worker:I");
        }
      } else if (a.what == "clear-faults") {
      } else if (a.what == "partition") {
        if (!ValidProcess(a.target, shards_ever, workers_ever, false) || a.seconds <= 0) {
          return absl::InvalidArgumentError(where + ": partition needs a target shard:I or "
                                                    "worker:I and seconds > 0");
        }
        if (!a.from.empty() && a.from != "monitor") {
          return absl::InvalidArgumentError(where + ".from: '" + a.from +
                                            "' is not monitor (the only peer a partition can "
                                            "cut a process off from alone)");
        }
      } else {
        return absl::InvalidArgumentError(where + ".do: unknown action '" + a.what +
                                          "' (kill, restart, stop, cont, terminate, slow, "
                                          "add-worker, add-shard, drain-shard, faults, "
                                          "clear-faults, partition)");
      }
      if (!a.from.empty() && a.what != "partition") {
        return absl::InvalidArgumentError(where + ".from: only a partition takes it");
      }
      s.timeline.push_back(std::move(a));
    }
  }
  std::stable_sort(s.timeline.begin(), s.timeline.end(),
                   [](const Action& a, const Action& b) { return a.at < b.at; });

  if (const YAML::Node inv = root["invariants"]) {
    if (auto st = CheckKeys(inv, "invariants",
                            {"progress_within", "final_accuracy", "no_crash", "no_hang",
                             "lost_bound", "no_double_apply", "faults_in_metrics",
                             "durable_kept", "acked_kept", "replicas_identical",
                             "no_split_brain", "once_per_epoch"});
        !st.ok()) {
      return st;
    }
    Invariants& v = s.invariants;
    for (const auto& [key, out] : {std::pair<const char*, double*>{"progress_within", &v.progress_within},
                                   {"final_accuracy", &v.final_accuracy}}) {
      if (inv[key]) {
        if (auto st = Read(inv[key], std::string("invariants.") + key, out); !st.ok()) return st;
      }
    }
    for (const auto& [key, out] : {std::pair<const char*, bool*>{"no_crash", &v.no_crash},
                                   {"no_hang", &v.no_hang},
                                   {"lost_bound", &v.lost_bound},
                                   {"no_double_apply", &v.no_double_apply},
                                   {"faults_in_metrics", &v.faults_in_metrics},
                                   {"durable_kept", &v.durable_kept},
                                   {"acked_kept", &v.acked_kept},
                                   {"replicas_identical", &v.replicas_identical},
                                   {"no_split_brain", &v.no_split_brain},
                                   {"once_per_epoch", &v.once_per_epoch}}) {
      if (inv[key]) {
        if (auto st = Read(inv[key], std::string("invariants.") + key, out); !st.ok()) return st;
      }
    }
    if (v.progress_within <= 0) return absl::InvalidArgumentError("invariants.progress_within: > 0");
    if (v.final_accuracy < 0 || v.final_accuracy > 1) {
      return absl::InvalidArgumentError("invariants.final_accuracy: 0..1");
    }
  }
  if (root["expect_fail"]) {
    if (auto st = Read(root["expect_fail"], "expect_fail", &s.expect_fail); !st.ok()) return st;
    const Invariants& v = s.invariants;
    const std::map<std::string, bool> checked = {
        {"progress_within", true},          {"final_accuracy", v.final_accuracy > 0},
        {"no_crash", v.no_crash},           {"no_hang", v.no_hang},
        {"lost_bound", v.lost_bound},       {"no_double_apply", v.no_double_apply},
        {"faults_in_metrics", v.faults_in_metrics}, {"durable_kept", v.durable_kept},
        {"acked_kept", v.acked_kept},
        {"replicas_identical", v.replicas_identical},
        {"no_split_brain", v.no_split_brain},
        {"once_per_epoch", v.once_per_epoch}};
    for (const auto& name : s.expect_fail) {
      auto it = checked.find(name);
      if (it == checked.end()) {
        return absl::InvalidArgumentError("expect_fail: '" + name +
                                          "' is not an invariant (progress_within, "
                                          "final_accuracy, no_crash, no_hang, lost_bound, "
                                          "no_double_apply, faults_in_metrics, durable_kept, "
                                          "acked_kept, replicas_identical, no_split_brain, "
                                          "once_per_epoch)");
      }
      if (!it->second) {
        return absl::InvalidArgumentError("expect_fail: '" + name + "' is not checked");
      }
    }
  }
  return s;
}
}  // namespace

}  // namespace pacer::chaos
