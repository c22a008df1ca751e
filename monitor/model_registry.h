// The job's model as the monitor knows it: the first worker's declaration
// (its keys in order, each key's tensor name and parameter group, the
// optimizer it declared, else the monitor's, the groups' settings over it,
// the training set's size), to which every later declaration must match, and pacerctl set-lr's
// learning-rate overrides by group. It saves and restores its part of the
// monitor's state. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_MODEL_REGISTRY_H_
#define PACER_MONITOR_MODEL_REGISTRY_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "monitor/journal.h"
#include "ps/base/messages.h"
#include "ps/base/optimizer_config.h"

namespace pacer {

class ModelRegistry {
 public:
  // What a declaration is checked against: the job's optimizer for
  // workers that declare none (--optimizer and its flags), the largest
  // message (no key may outgrow it), and
  // whether the job reads a data stream (then the declaration must say how
  // many samples the training set has).
  struct Rules {
    OptimizerKind optimizer = OptimizerKind::kSgd;
    OptimizerSettings settings = DefaultSettings(OptimizerKind::kSgd);
    size_t max_message_bytes = 0;
    bool data_stream = true;
  };
  // Why a declaration or a command was refused, and the code to answer with.
  struct Refusal {
    wire::ErrorCode code = wire::ErrorCode::Refused;
    std::string reason;
  };

  ModelRegistry(const Rules& rules, Journal* journal) : rules_(rules), journal_(journal) {}

  // A worker's declaration (from `sender`, for the log): the first sets
  // the model and, when it declares one, the job's optimizer; a later one
  // must be the same (an optimizer it declares too); nullopt when it is
  // taken.
  std::optional<Refusal> Declare(msg::DeclareModel m, uint32_t sender);
  // pacerctl set-lr: sets or clears a group's override; nullopt when done.
  std::optional<Refusal> SetLr(const msg::SetLr& c);

  bool declared() const { return !keys_.empty(); }
  // The job's optimizer: the first declaration's, else Rules' default.
  JobOptimizer optimizer() const {
    return declared_optimizer_ ? *declared_optimizer_ : JobOptimizer{rules_.optimizer, rules_.settings};
  }
  // The keys in order, and per key its tensor name and group (empty: none
  // given; every key in the default group).
  const std::vector<wire::KeyLen>& keys() const { return keys_; }
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<uint32_t>& groups() const { return groups_; }
  // The declared groups; group i + 1 is param_groups()[i] (0: the job's).
  const std::vector<GroupSettings>& param_groups() const { return param_groups_; }
  // The training set's size, as declared (0: not yet, or not given).
  uint64_t data_samples() const { return data_samples_; }
  // pacerctl set-lr's overrides by group name, and their version.
  const std::map<std::string, float>& lr_overrides() const { return lr_overrides_; }
  uint64_t lr_overrides_version() const { return lr_overrides_version_; }
  // The overrides by group index, as the shards take them.
  std::vector<wire::GroupLr> LrOverridesByIndex() const;
  // Per-value optimizer state buffers a shard keeps (a key move carries them).
  size_t StateSlots() const;

  // Its part of the monitor's saved state.
  void Save(MonitorRecord* r) const;
  void Restore(const MonitorRecord& r);

 private:
  const Rules rules_;
  Journal* const journal_;
  std::vector<wire::KeyLen> keys_;
  std::vector<std::string> names_;
  std::vector<uint32_t> groups_;
  std::vector<GroupSettings> param_groups_;
  std::optional<JobOptimizer> declared_optimizer_;  // by the first declaration
  uint64_t data_samples_ = 0;
  std::map<std::string, float> lr_overrides_;
  uint64_t lr_overrides_version_ = 0;
};

}  // namespace pacer

#endif  // PACER_MONITOR_MODEL_REGISTRY_H_
