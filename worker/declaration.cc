// The model's declaration to the monitor (worker/trainer.h): its tensors cut
// into keys of at most --block-floats values, each key's tensor name and
// parameter group (--param-group NAME:PATTERNS:SETTINGS, matched with
// fnmatch), and the groups' settings.
#include <fnmatch.h>

#include <algorithm>
#include <string>
#include <vector>

#include "worker/trainer.h"

namespace pacer::worker {

std::vector<wire::KeyLen> BlockKeys(const std::vector<TensorSpec>& tensors, size_t block_floats) {
  std::vector<wire::KeyLen> keys;
  block_floats = std::max<size_t>(1, block_floats);
  uint64_t k = 0;
  for (const TensorSpec& t : tensors) {
    for (size_t off = 0; off < t.size; off += block_floats) {
      keys.emplace_back(k++, std::min(block_floats, t.size - off));
    }
  }
  return keys;
}

absl::StatusOr<msg::DeclareModel> Declaration(const std::vector<TensorSpec>& tensors,
                                              size_t block_floats,
                                              const std::vector<ParamGroupSpec>& param_groups) {
  msg::DeclareModel m;
  for (size_t i = 0; i < param_groups.size(); ++i) {
    const std::string& name = param_groups[i].settings.name;
    if (name.empty() || name == kDefaultGroupName) {
      return absl::InvalidArgumentError("a parameter group needs a name other than 'default'");
    }
    for (size_t j = 0; j < i; ++j) {
      if (param_groups[j].settings.name == name) {
        return absl::InvalidArgumentError("parameter group '" + name + "' is named twice");
      }
    }
    m.param_groups.push_back(param_groups[i].settings);
  }
  m.keys = BlockKeys(tensors, block_floats);
  size_t key = 0;
  bool grouped = false;
  for (const TensorSpec& t : tensors) {
    uint32_t group = kDefaultGroup;
    for (size_t g = 0; g < param_groups.size() && group == kDefaultGroup; ++g) {
      for (const std::string& pattern : param_groups[g].patterns) {
        if (fnmatch(pattern.c_str(), t.name.c_str(), 0) == 0) {
          group = static_cast<uint32_t>(g + 1);
          break;
        }
      }
    }
    grouped |= group != kDefaultGroup;
    for (size_t off = 0; off < t.size; off += std::max<size_t>(1, block_floats), ++key) {
      m.names.push_back(t.name);
      m.groups.push_back(group);
    }
  }
  if (!grouped) m.groups.clear();
  return m;
}

absl::StatusOr<ParamGroupSpec> ParseParamGroup(const std::string& spec) {
  const size_t a = spec.find(':');
  const size_t b = a == std::string::npos ? a : spec.find(':', a + 1);
  if (b == std::string::npos) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': want NAME:PATTERNS:SETTINGS, e.g. "
                                      "no_decay:*.bias:weight_decay=0");
  }
  auto settings = ParseGroupSettings(spec.substr(b + 1));
  if (!settings.ok()) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': " + std::string(settings.status().message()));
  }
  ParamGroupSpec g;
  g.settings = *settings;
  g.settings.name = spec.substr(0, a);
  for (size_t at = a + 1; at <= b;) {
    const size_t comma = std::min(spec.find(',', at), b);
    if (comma > at) g.patterns.push_back(spec.substr(at, comma - at));
    at = comma + 1;
  }
  if (g.settings.name.empty() || g.patterns.empty()) {
    return absl::InvalidArgumentError("--param-group '" + spec +
                                      "': a group needs a name and at least one pattern");
  }
  return g;
}

}  // namespace pacer::worker
