// Conversions between plain values and the schema's tables that more than
// one encoder uses: messages.cc (the messages) and monitor_record.cc (the
// monitor's saved state). Internal to ps/base: nothing else includes it.
#ifndef PACER_PS_BASE_WIRE_VALUES_H_
#define PACER_PS_BASE_WIRE_VALUES_H_

#include <string>
#include <utility>
#include <vector>

#include "ps/base/messages.h"

namespace pacer::wire_values {

inline std::string Str(const flatbuffers::String* s) { return s ? s->str() : ""; }
inline const char* OrNull(const std::string& s) { return s.empty() ? nullptr : s.c_str(); }

inline wire::OptimizerKind WireKind(OptimizerKind k) { return static_cast<wire::OptimizerKind>(k); }
inline OptimizerKind KindOf(wire::OptimizerKind k) {
  switch (k) {
    case wire::OptimizerKind::Adam: return OptimizerKind::kAdam;
    case wire::OptimizerKind::AdamW: return OptimizerKind::kAdamW;
    case wire::OptimizerKind::Adagrad: return OptimizerKind::kAdagrad;
    default: return OptimizerKind::kSgd;
  }
}

// A group's settings: only those it sets.
inline flatbuffers::Offset<wire::OptimizerSettings> BuildSettings(flatbuffers::FlatBufferBuilder& fbb,
                                                           const GroupSettings& g) {
  wire::OptimizerSettingsBuilder b(fbb);
  if (g.lr) b.add_lr(*g.lr);
  if (g.momentum) b.add_momentum(*g.momentum);
  if (g.dampening) b.add_dampening(*g.dampening);
  if (g.nesterov) b.add_nesterov(*g.nesterov);
  if (g.weight_decay) b.add_weight_decay(*g.weight_decay);
  if (g.beta1) b.add_beta1(*g.beta1);
  if (g.beta2) b.add_beta2(*g.beta2);
  if (g.eps) b.add_eps(*g.eps);
  if (g.amsgrad) b.add_amsgrad(*g.amsgrad);
  if (g.lr_decay) b.add_lr_decay(*g.lr_decay);
  if (g.initial_accumulator_value) b.add_initial_accumulator_value(*g.initial_accumulator_value);
  return b.Finish();
}

inline GroupSettings SettingsOf(const wire::OptimizerSettings* t, std::string name) {
  GroupSettings g;
  g.name = std::move(name);
  if (t == nullptr) return g;
  if (t->lr()) g.lr = *t->lr();
  if (t->momentum()) g.momentum = *t->momentum();
  if (t->dampening()) g.dampening = *t->dampening();
  if (t->nesterov()) g.nesterov = *t->nesterov();
  if (t->weight_decay()) g.weight_decay = *t->weight_decay();
  if (t->beta1()) g.beta1 = *t->beta1();
  if (t->beta2()) g.beta2 = *t->beta2();
  if (t->eps()) g.eps = *t->eps();
  if (t->amsgrad()) g.amsgrad = *t->amsgrad();
  if (t->lr_decay()) g.lr_decay = *t->lr_decay();
  if (t->initial_accumulator_value()) g.initial_accumulator_value = *t->initial_accumulator_value();
  return g;
}

// An optimizer a message may carry: its kind (absent: none) and settings.
inline std::optional<JobOptimizer> OptimizerOf(flatbuffers::Optional<wire::OptimizerKind> kind,
                                               const wire::OptimizerSettings* settings) {
  if (!kind) return std::nullopt;
  JobOptimizer o;
  o.kind = KindOf(*kind);
  o.settings = Resolve(DefaultSettings(o.kind), SettingsOf(settings, ""));
  return o;
}
inline flatbuffers::Optional<wire::OptimizerKind> OptionalKind(const std::optional<JobOptimizer>& o) {
  if (!o) return flatbuffers::nullopt;
  return WireKind(o->kind);
}
inline flatbuffers::Offset<wire::OptimizerSettings> OptionalSettings(
    flatbuffers::FlatBufferBuilder& fbb, const std::optional<JobOptimizer>& o) {
  if (!o) return 0;
  return BuildSettings(fbb, AllSettings(o->settings));
}

inline flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::ParamGroup>>> BuildGroups(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<GroupSettings>& groups) {
  std::vector<flatbuffers::Offset<wire::ParamGroup>> out;
  for (const GroupSettings& g : groups) {
    auto name = fbb.CreateString(g.name);
    auto settings = BuildSettings(fbb, g);
    out.push_back(wire::CreateParamGroup(fbb, name, settings));
  }
  return fbb.CreateVector(out);
}

inline std::vector<GroupSettings> GroupsOf(
    const flatbuffers::Vector<flatbuffers::Offset<wire::ParamGroup>>* v) {
  std::vector<GroupSettings> out;
  if (v == nullptr) return out;
  for (const wire::ParamGroup* g : *v) out.push_back(SettingsOf(g->settings(), Str(g->name())));
  return out;
}

template <class T>
inline std::vector<T> Scalars(const flatbuffers::Vector<T>* v) {
  return v == nullptr ? std::vector<T>() : std::vector<T>(v->begin(), v->end());
}

template <class T>
inline std::vector<T> Structs(const flatbuffers::Vector<const T*>* v) {
  std::vector<T> out;
  if (v == nullptr) return out;
  for (const T* x : *v) out.push_back(*x);
  return out;
}

inline flatbuffers::Offset<flatbuffers::Vector<flatbuffers::Offset<wire::LrOverride>>> BuildOverrides(
    flatbuffers::FlatBufferBuilder& fbb, const std::vector<std::pair<std::string, float>>& v) {
  std::vector<flatbuffers::Offset<wire::LrOverride>> out;
  for (const auto& [group, lr] : v) out.push_back(wire::CreateLrOverrideDirect(fbb, group.c_str(), lr));
  return fbb.CreateVector(out);
}

inline std::vector<std::pair<std::string, float>> OverridesOf(
    const flatbuffers::Vector<flatbuffers::Offset<wire::LrOverride>>* v) {
  std::vector<std::pair<std::string, float>> out;
  if (v == nullptr) return out;
  for (const wire::LrOverride* o : *v) out.emplace_back(Str(o->group()), o->lr());
  return out;
}

}  // namespace pacer::wire_values

#endif  // PACER_PS_BASE_WIRE_VALUES_H_
