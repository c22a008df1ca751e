#include "monitor/model_registry.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "ps/optimizer.h"
#include "ps/table.h"
#include "spdlog/spdlog.h"

namespace pacer {
namespace {

// "adamw (lr=0.001,betas=0.9:0.999,eps=1e-08,weight_decay=0.01,amsgrad=false)".
std::string Describe(const JobOptimizer& o) {
  return std::string(OptimizerName(o.kind)) + " (" + FormatSettings(o.kind, o.settings) + ")";
}

}  // namespace

std::optional<ModelRegistry::Refusal> ModelRegistry::Declare(msg::DeclareModel m,
                                                             uint32_t sender) {
  const auto refuse = [](wire::ErrorCode code, std::string reason) {
    return std::optional<Refusal>(Refusal{code, std::move(reason)});
  };
  if (m.keys.empty()) return refuse(wire::ErrorCode::Mismatch, "a model needs at least one key");
  if ((!m.names.empty() && m.names.size() != m.keys.size()) ||
      (!m.groups.empty() && m.groups.size() != m.keys.size())) {
    return refuse(wire::ErrorCode::Mismatch,
                  "a declaration names a tensor and a group for every key or for none");
  }
  // Keys in order, their names and groups with them.
  std::vector<size_t> order(m.keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return m.keys[a].key() < m.keys[b].key(); });
  std::vector<wire::KeyLen> keys;
  std::vector<std::string> names;
  std::vector<uint32_t> groups;
  for (size_t i : order) {
    keys.push_back(m.keys[i]);
    if (!m.names.empty()) names.push_back(m.names[i]);
    if (!m.groups.empty()) groups.push_back(m.groups[i]);
  }
  for (size_t i = 1; i < keys.size(); ++i) {
    if (keys[i].key() == keys[i - 1].key()) {
      return refuse(wire::ErrorCode::Mismatch, "duplicate key in model");
    }
  }
  uint64_t values = 0;
  const uint64_t max_key_values = rules_.max_message_bytes / sizeof(float);
  for (const auto& k : keys) {
    if (k.length() == 0 || k.length() > max_key_values || k.key() == UINT64_MAX) {
      return refuse(wire::ErrorCode::BadLength,
                    "key " + std::to_string(k.key()) + " has " + std::to_string(k.length()) +
                        " values; each key needs 1.." + std::to_string(max_key_values) +
                        " (--max-message-bytes) and key 2^64-1 is reserved");
    }
    values += k.length();
  }
  if (values > (uint64_t{1} << 34)) return refuse(wire::ErrorCode::BadLength, "model too large");
  // The optimizer: the first declaration's becomes the job's; a later
  // one must be the job's. The groups' settings are over it.
  const JobOptimizer job = optimizer();
  if (m.optimizer && !keys_.empty() && *m.optimizer != job) {
    return refuse(wire::ErrorCode::Mismatch,
                  "this worker declares the optimizer " + Describe(*m.optimizer) +
                      "; the job runs " + Describe(job) +
                      (declared_optimizer_ ? ", as its first worker declared"
                                           : " (pacer-monitor --optimizer; its first worker "
                                             "declared none)"));
  }
  const JobOptimizer chosen = m.optimizer && keys_.empty() ? *m.optimizer : job;
  TableConfig config{chosen.kind, chosen.settings, m.param_groups};
  if (absl::Status st = ParamTable::ValidateConfig(config); !st.ok()) {
    return refuse(wire::ErrorCode::Refused, "model declaration: " + std::string(st.message()));
  }
  for (size_t i = 0; i < groups.size(); ++i) {
    if (groups[i] > m.param_groups.size()) {
      return refuse(wire::ErrorCode::Mismatch,
                    "key " + std::to_string(keys[i].key()) + " is in group " +
                        std::to_string(groups[i]) + "; the declaration has " +
                        std::to_string(m.param_groups.size() + 1) + " (with 'default')");
    }
  }
  if (std::all_of(groups.begin(), groups.end(), [](uint32_t g) { return g == kDefaultGroup; })) {
    groups.clear();
  }
  if (rules_.data_stream && m.samples == 0) {
    return refuse(wire::ErrorCode::Refused,
                  "this job reads its training set as one data stream (pacer-monitor's "
                  "default): the model's declaration must say how many samples the "
                  "training set has (a client that reads no data the monitor hands out: "
                  "run the monitor with --data-partitions N)");
  }
  if (m.samples > UINT32_MAX) {
    return refuse(wire::ErrorCode::BadLength,
                  "a training set of " + std::to_string(m.samples) +
                      " samples: at most 2^32 - 1 (sample indices are 32-bit)");
  }
  if (rules_.data_stream && data_samples_ != 0 && m.samples != data_samples_) {
    return refuse(wire::ErrorCode::Mismatch,
                  "this worker's training set has " + std::to_string(m.samples) +
                      " samples; the job's has " + std::to_string(data_samples_));
  }
  if (data_samples_ == 0 && m.samples != 0) {
    data_samples_ = m.samples;
    journal_->Mark();
  }
  if (keys_.empty()) {
    keys_ = std::move(keys);
    names_ = std::move(names);
    groups_ = std::move(groups);
    param_groups_ = std::move(m.param_groups);
    if (m.optimizer) declared_optimizer_ = *m.optimizer;
    journal_->Mark();
    std::string group_list;
    for (const GroupSettings& g : param_groups_) {
      group_list += "; group '" + g.name + "': " + FormatGroupSettings(g);
    }
    spdlog::info("model declared by sender {}: {} keys, {} parameters; {} ({}){}", sender,
                 keys_.size(), values, Describe(chosen),
                 m.optimizer ? "declared" : "pacer-monitor --optimizer: the worker declared none",
                 group_list);
    return std::nullopt;
  }
  const bool same = keys.size() == keys_.size() &&
                    std::equal(keys.begin(), keys.end(), keys_.begin(), [](auto& a, auto& b) {
                      return a.key() == b.key() && a.length() == b.length();
                    });
  if (!same) {
    return refuse(wire::ErrorCode::Mismatch,
                  "model declaration differs from the one already declared");
  }
  if (names != names_ || groups != groups_ || m.param_groups != param_groups_) {
    return refuse(wire::ErrorCode::Mismatch,
                  "model declaration's tensor names or parameter groups differ from the "
                  "ones already declared");
  }
  return std::nullopt;
}

std::optional<ModelRegistry::Refusal> ModelRegistry::SetLr(const msg::SetLr& c) {
  const auto refuse = [](std::string reason) {
    return std::optional<Refusal>(Refusal{wire::ErrorCode::Refused, std::move(reason)});
  };
  if (keys_.empty()) return refuse("no model declared yet: its groups are not known");
  const bool known = c.group == kDefaultGroupName ||
                     std::any_of(param_groups_.begin(), param_groups_.end(),
                                 [&](const GroupSettings& g) { return g.name == c.group; });
  if (!known) {
    std::string groups = kDefaultGroupName;
    for (const GroupSettings& g : param_groups_) groups += ", " + g.name;
    return refuse("no parameter group '" + c.group + "' (the model has: " + groups + ")");
  }
  if (c.clear) {
    if (lr_overrides_.erase(c.group) > 0) {
      ++lr_overrides_version_;
      spdlog::info("pacerctl set-lr: group '{}' no longer overridden", c.group);
    }
  } else {
    if (!std::isfinite(c.lr) || c.lr < 0.0f) {
      return refuse("invalid learning rate " + std::to_string(c.lr) + " (must be >= 0)");
    }
    lr_overrides_[c.group] = c.lr;
    ++lr_overrides_version_;
    spdlog::info("pacerctl set-lr: group '{}' lr {} (wins over what pushes carry until cleared)",
                 c.group, c.lr);
  }
  journal_->Mark();
  return std::nullopt;
}

std::vector<wire::GroupLr> ModelRegistry::LrOverridesByIndex() const {
  std::vector<wire::GroupLr> out;
  for (const auto& [name, lr] : lr_overrides_) {
    if (name == kDefaultGroupName) {
      out.emplace_back(kDefaultGroup, lr);
      continue;
    }
    for (size_t i = 0; i < param_groups_.size(); ++i) {
      if (param_groups_[i].name == name) out.emplace_back(static_cast<uint32_t>(i + 1), lr);
    }
  }
  return out;
}

size_t ModelRegistry::StateSlots() const {
  const JobOptimizer job = optimizer();
  bool amsgrad = job.settings.amsgrad;
  for (const GroupSettings& g : param_groups_) amsgrad = amsgrad || g.amsgrad.value_or(false);
  return MakeOptimizer(job.kind, amsgrad)->state_slots();
}

void ModelRegistry::Save(MonitorRecord* r) const {
  r->model = keys_;
  r->model_names = names_;
  r->model_groups = groups_;
  r->param_groups = param_groups_;
  r->lr_overrides.assign(lr_overrides_.begin(), lr_overrides_.end());
  r->lr_overrides_version = lr_overrides_version_;
  r->model_optimizer = declared_optimizer_;
  r->data_samples = data_samples_;
}

void ModelRegistry::Restore(const MonitorRecord& r) {
  keys_ = r.model;
  names_ = r.model_names;
  groups_ = r.model_groups;
  param_groups_ = r.param_groups;
  lr_overrides_.clear();
  lr_overrides_.insert(r.lr_overrides.begin(), r.lr_overrides.end());
  lr_overrides_version_ = r.lr_overrides_version;
  declared_optimizer_ = r.model_optimizer;
  data_samples_ = r.data_samples;
}

}  // namespace pacer
