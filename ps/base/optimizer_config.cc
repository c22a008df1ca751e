#include "ps/base/optimizer_config.h"

#include <cmath>
#include <cstdlib>
#include <type_traits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pacer {
namespace {

absl::Status Bad(std::string_view where, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat(std::string(where), where.empty() ? "" : ": ", why));
}

// torch's "Invalid <name> value: <v>" for settings that must be >= 0.
absl::Status NotNegative(std::string_view where, const char* name, float v) {
  if (std::isfinite(v) && v >= 0.0f) return absl::OkStatus();
  return Bad(where,
             absl::StrCat("invalid ", name, " value: ", v, " (must be a finite number >= 0)"));
}

absl::Status Beta(std::string_view where, const char* name, float v) {
  if (std::isfinite(v) && v >= 0.0f && v < 1.0f) return absl::OkStatus();
  return Bad(where, absl::StrCat("invalid ", name, " value: ", v, " (must be in [0, 1))"));
}

std::optional<bool> ParseBool(std::string_view v) {
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return std::nullopt;
}

}  // namespace

std::string_view OptimizerName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdagrad:
      return "adagrad";
  }
  return "unknown";
}

absl::StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  for (OptimizerKind k : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW,
                          OptimizerKind::kAdagrad}) {
    if (name == OptimizerName(k)) return k;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer '", std::string(name),
                                                 "' (choose sgd, adam, adamw or adagrad)"));
}

OptimizerSettings DefaultSettings(OptimizerKind kind) {
  OptimizerSettings s;
  switch (kind) {
    case OptimizerKind::kSgd:
      break;  // Pacer's lr 0.1, momentum 0.9
    case OptimizerKind::kAdam:
      s.lr = 1e-3f;
      break;
    case OptimizerKind::kAdamW:
      s.lr = 1e-3f;
      s.weight_decay = 1e-2f;
      break;
    case OptimizerKind::kAdagrad:
      s.lr = 1e-2f;
      s.eps = 1e-10f;
      break;
  }
  return s;
}

absl::Status ValidateSettings(OptimizerKind kind, const OptimizerSettings& s,
                              std::string_view where) {
  if (absl::Status st = NotNegative(where, "learning rate", s.lr); !st.ok()) return st;
  if (absl::Status st = NotNegative(where, "weight_decay", s.weight_decay); !st.ok()) return st;
  switch (kind) {
    case OptimizerKind::kSgd:
      if (absl::Status st = NotNegative(where, "momentum", s.momentum); !st.ok()) return st;
      if (!std::isfinite(s.dampening)) return Bad(where, "invalid dampening value");
      if (s.nesterov && (s.momentum <= 0.0f || s.dampening != 0.0f)) {
        return Bad(where, "Nesterov momentum requires a momentum and zero dampening");
      }
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (absl::Status st = NotNegative(where, "epsilon", s.eps); !st.ok()) return st;
      if (absl::Status st = Beta(where, "beta parameter at index 0", s.beta1); !st.ok()) return st;
      if (absl::Status st = Beta(where, "beta parameter at index 1", s.beta2); !st.ok()) return st;
      break;
    case OptimizerKind::kAdagrad:
      if (absl::Status st = NotNegative(where, "epsilon", s.eps); !st.ok()) return st;
      if (absl::Status st = NotNegative(where, "lr_decay", s.lr_decay); !st.ok()) return st;
      if (absl::Status st =
              NotNegative(where, "initial_accumulator_value", s.initial_accumulator_value);
          !st.ok()) {
        return st;
      }
      break;
  }
  return absl::OkStatus();
}

OptimizerSettings Resolve(const OptimizerSettings& base, const GroupSettings& g) {
  OptimizerSettings s = base;
  if (g.lr) s.lr = *g.lr;
  if (g.momentum) s.momentum = *g.momentum;
  if (g.dampening) s.dampening = *g.dampening;
  if (g.nesterov) s.nesterov = *g.nesterov;
  if (g.weight_decay) s.weight_decay = *g.weight_decay;
  if (g.beta1) s.beta1 = *g.beta1;
  if (g.beta2) s.beta2 = *g.beta2;
  if (g.eps) s.eps = *g.eps;
  if (g.amsgrad) s.amsgrad = *g.amsgrad;
  if (g.lr_decay) s.lr_decay = *g.lr_decay;
  if (g.initial_accumulator_value) s.initial_accumulator_value = *g.initial_accumulator_value;
  return s;
}

absl::StatusOr<GroupSettings> ParseGroupSettings(std::string_view spec) {
  GroupSettings g;
  if (spec.empty()) return g;
  for (absl::string_view item : absl::StrSplit(absl::string_view(spec.data(), spec.size()), ',')) {
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    if (kv.size() != 2 || kv[0].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is not key=value (e.g. lr=0.01,weight_decay=0)"));
    }
    const absl::string_view key = kv[0], value = kv[1];
    auto number = [&](std::optional<float>* field) -> absl::Status {
      float v = 0;
      if (!absl::SimpleAtof(value, &v)) {
        return absl::InvalidArgumentError(absl::StrCat(key, "=", value, ": not a number"));
      }
      *field = v;
      return absl::OkStatus();
    };
    auto boolean = [&](std::optional<bool>* field) -> absl::Status {
      std::optional<bool> b = ParseBool(std::string_view(value.data(), value.size()));
      if (!b) return absl::InvalidArgumentError(absl::StrCat(key, "=", value, ": not true/false"));
      *field = *b;
      return absl::OkStatus();
    };
    absl::Status st;
    if (key == "lr") {
      st = number(&g.lr);
    } else if (key == "momentum") {
      st = number(&g.momentum);
    } else if (key == "dampening") {
      st = number(&g.dampening);
    } else if (key == "nesterov") {
      st = boolean(&g.nesterov);
    } else if (key == "weight_decay") {
      st = number(&g.weight_decay);
    } else if (key == "beta1") {
      st = number(&g.beta1);
    } else if (key == "beta2") {
      st = number(&g.beta2);
    } else if (key == "betas") {
      std::vector<absl::string_view> b = absl::StrSplit(value, ':');
      float b1 = 0, b2 = 0;
      if (b.size() != 2 || !absl::SimpleAtof(b[0], &b1) || !absl::SimpleAtof(b[1], &b2)) {
        return absl::InvalidArgumentError(absl::StrCat("betas=", value, ": want BETA1:BETA2"));
      }
      g.beta1 = b1;
      g.beta2 = b2;
    } else if (key == "eps") {
      st = number(&g.eps);
    } else if (key == "amsgrad") {
      st = boolean(&g.amsgrad);
    } else if (key == "lr_decay") {
      st = number(&g.lr_decay);
    } else if (key == "initial_accumulator_value") {
      st = number(&g.initial_accumulator_value);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown setting '", key,
          "' (lr, momentum, dampening, nesterov, weight_decay, betas, beta1, beta2, eps, amsgrad, "
          "lr_decay, initial_accumulator_value)"));
    }
    if (!st.ok()) return st;
  }
  return g;
}

std::string FormatGroupSettings(const GroupSettings& g) {
  std::string out;
  auto add = [&](const char* key, const auto& v) {
    if (!v) return;
    if constexpr (std::is_same_v<std::decay_t<decltype(*v)>, bool>) {
      absl::StrAppend(&out, out.empty() ? "" : ",", key, "=", *v ? "true" : "false");
    } else {
      absl::StrAppend(&out, out.empty() ? "" : ",", key, "=", *v);
    }
  };
  add("lr", g.lr);
  add("momentum", g.momentum);
  add("dampening", g.dampening);
  add("nesterov", g.nesterov);
  add("weight_decay", g.weight_decay);
  add("beta1", g.beta1);
  add("beta2", g.beta2);
  add("eps", g.eps);
  add("amsgrad", g.amsgrad);
  add("lr_decay", g.lr_decay);
  add("initial_accumulator_value", g.initial_accumulator_value);
  return out;
}

GroupSettings AllSettings(const OptimizerSettings& s) {
  GroupSettings g;
  g.lr = s.lr;
  g.momentum = s.momentum;
  g.dampening = s.dampening;
  g.nesterov = s.nesterov;
  g.weight_decay = s.weight_decay;
  g.beta1 = s.beta1;
  g.beta2 = s.beta2;
  g.eps = s.eps;
  g.amsgrad = s.amsgrad;
  g.lr_decay = s.lr_decay;
  g.initial_accumulator_value = s.initial_accumulator_value;
  return g;
}

GroupSettings KindSettings(OptimizerKind kind, const OptimizerSettings& s) {
  GroupSettings g;
  g.lr = s.lr;
  g.weight_decay = s.weight_decay;
  switch (kind) {
    case OptimizerKind::kSgd:
      g.momentum = s.momentum;
      g.dampening = s.dampening;
      g.nesterov = s.nesterov;
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      g.beta1 = s.beta1;
      g.beta2 = s.beta2;
      g.eps = s.eps;
      g.amsgrad = s.amsgrad;
      break;
    case OptimizerKind::kAdagrad:
      g.lr_decay = s.lr_decay;
      g.initial_accumulator_value = s.initial_accumulator_value;
      g.eps = s.eps;
      break;
  }
  return g;
}

std::string FormatSettings(OptimizerKind kind, const OptimizerSettings& s) {
  return FormatGroupSettings(KindSettings(kind, s));
}

bool JobOptimizer::operator==(const JobOptimizer& o) const {
  return kind == o.kind && KindSettings(kind, settings) == KindSettings(o.kind, o.settings);
}

}  // namespace pacer
