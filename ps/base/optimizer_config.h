// What a job's optimizer is: the kind and the settings of torch.optim
// (PyTorch 1.13) it follows, per parameter group. Plain values, parsed and
// checked here, used by the monitor's flags, the worker's group
// declarations, the wire format and the shard's table (ps/table.h). The
// arithmetic lives in ps/optimizer.h.
#ifndef PACER_PS_BASE_OPTIMIZER_CONFIG_H_
#define PACER_PS_BASE_OPTIMIZER_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pacer {

// Most per-value state buffers an optimizer keeps (Adam with amsgrad: m, v,
// max v); a message that says more is refused.
inline constexpr size_t kMaxStateSlots = 3;

enum class OptimizerKind : uint8_t { kSgd = 0, kAdam = 1, kAdamW = 2, kAdagrad = 3 };

// "sgd", "adam", "adamw", "adagrad".
std::string_view OptimizerName(OptimizerKind kind);
// InvalidArgument naming the choices for anything else.
[[nodiscard]] absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);

// Every setting of every optimizer, with torch.optim's names. Each kind
// reads its own: sgd (lr, momentum, dampening, nesterov, weight_decay),
// adam and adamw (lr, beta1, beta2, eps, weight_decay, amsgrad), adagrad
// (lr, lr_decay, weight_decay, initial_accumulator_value, eps).
struct OptimizerSettings {
  float lr = 0.1f;
  float momentum = 0.9f;
  float dampening = 0.0f;
  bool nesterov = false;
  float weight_decay = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  bool amsgrad = false;
  float lr_decay = 0.0f;
  float initial_accumulator_value = 0.0f;
  bool operator==(const OptimizerSettings&) const = default;
};

// torch 1.13's defaults for `kind`, except Pacer's SGD: lr 0.1 and momentum
// 0.9 (torch: lr required, momentum 0). Adam and AdamW: lr 1e-3, betas
// (0.9, 0.999), eps 1e-8, weight decay 0 (AdamW: 1e-2). Adagrad: lr 1e-2,
// eps 1e-10.
OptimizerSettings DefaultSettings(OptimizerKind kind);

// A job's optimizer: its kind and its default group's settings, every one
// resolved (as the first worker declared it, or the monitor's --optimizer
// and its flags).
struct JobOptimizer {
  OptimizerKind kind = OptimizerKind::kSgd;
  OptimizerSettings settings = DefaultSettings(OptimizerKind::kSgd);
  // The same kind with the same settings of those it reads.
  bool operator==(const JobOptimizer& o) const;
};

// torch's own checks, with its words where it has them: lr, eps, momentum,
// weight_decay, lr_decay and initial_accumulator_value not negative (and
// finite), betas in [0, 1), nesterov only with momentum > 0 and dampening
// 0. InvalidArgument saying which setting and why; `where` (a group's
// name, a flag) starts the message.
absl::Status ValidateSettings(OptimizerKind kind, const OptimizerSettings& s,
                              std::string_view where);

// A parameter group's own settings: each one set here overrides the job's
// default group; the others follow it (as a torch param_group's missing keys
// take the optimizer's defaults).
struct GroupSettings {
  std::string name;
  std::optional<float> lr, momentum, dampening, weight_decay, beta1, beta2, eps, lr_decay,
      initial_accumulator_value;
  std::optional<bool> nesterov, amsgrad;
  bool operator==(const GroupSettings&) const = default;
};

// `base` with the settings `group` sets.
OptimizerSettings Resolve(const OptimizerSettings& base, const GroupSettings& group);

// Parses "key=value,key=value" (torch's names: lr, momentum, dampening,
// nesterov, weight_decay, betas=B1:B2 or beta1/beta2, eps, amsgrad,
// lr_decay, initial_accumulator_value; booleans true/false/1/0) into the
// settings of a group. InvalidArgument naming the bad item.
[[nodiscard]] absl::StatusOr<GroupSettings> ParseGroupSettings(std::string_view spec);
// The settings a group sets, in that form ("" when none).
std::string FormatGroupSettings(const GroupSettings& g);
// Every setting, as a group that sets them all.
GroupSettings AllSettings(const OptimizerSettings& s);
// The settings `kind` reads, as a group that sets only those.
GroupSettings KindSettings(OptimizerKind kind, const OptimizerSettings& s);
// The settings `kind` reads, in that form ("lr=0.001,betas=0.9:0.999,...").
std::string FormatSettings(OptimizerKind kind, const OptimizerSettings& s);

// A model's groups are numbered: 0 is the job's default group ("default",
// the monitor's flags), and the i-th declared group is i + 1.
inline constexpr uint32_t kDefaultGroup = 0;
inline constexpr char kDefaultGroupName[] = "default";

}  // namespace pacer

#endif  // PACER_PS_BASE_OPTIMIZER_CONFIG_H_
