#include "ps/table.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ps/base/parallel.h"

namespace pacer {
namespace {

// A key's step runs in pieces of this many floats (256 KiB of each array)
// on the shared pool's threads; a key of fewer than 4 pieces in one call.
constexpr size_t kStepChunkFloats = size_t{64} * 1024;

std::vector<OptimizerSettings> ResolveGroups(const TableConfig& c) {
  std::vector<OptimizerSettings> out{c.defaults};
  for (const GroupSettings& g : c.groups) out.push_back(Resolve(c.defaults, g));
  return out;
}

bool AnyAmsgrad(const std::vector<OptimizerSettings>& groups) {
  return std::any_of(groups.begin(), groups.end(),
                     [](const OptimizerSettings& s) { return s.amsgrad; });
}

}  // namespace

bool TableSnapshot::operator==(const TableSnapshot& o) const {
  if (!(config == o.config) || keys != o.keys || *params != *o.params ||
      state.size() != o.state.size()) {
    return false;
  }
  for (size_t i = 0; i < state.size(); ++i) {
    if (*state[i] != *o.state[i]) return false;
  }
  return true;
}

void ParamTable::CowBuffer::Reset(std::vector<float> values) {
  buf_ = std::make_shared<std::vector<float>>(std::move(values));
  spare_.reset();
}

std::pair<const float*, float*> ParamTable::CowBuffer::Overwrite() {
  const float* old = buf_->data();
  if (buf_.use_count() > 1) {
    FloatBuffer next;
    if (spare_ && spare_.use_count() == 1 && spare_->size() == buf_->size()) {
      next = std::move(spare_);
    } else {
      next = std::make_shared<std::vector<float>>(buf_->size());
    }
    spare_ = std::move(buf_);
    buf_ = std::move(next);
    old = spare_->data();
  }
  // Pairs with the release in the last holder's shared_ptr decrement: its
  // reads of the buffer happen before our writes.
  std::atomic_thread_fence(std::memory_order_acquire);
  return {old, buf_->data()};
}

float* ParamTable::CowBuffer::Mutable() {
  auto [old, fresh] = Overwrite();
  if (old != fresh) std::memcpy(fresh, old, buf_->size() * sizeof(float));
  return fresh;
}

ParamTable::ParamTable(TableConfig config)
    : config_(std::move(config)), resolved_(ResolveGroups(config_)) {
  optimizer_ = MakeOptimizer(config_.kind, AnyAmsgrad(resolved_));
  state_.resize(optimizer_->state_slots());
}

absl::Status ParamTable::ValidateConfig(const TableConfig& config) {
  if (absl::Status s =
          ValidateSettings(config.kind, config.defaults, "the job's optimizer settings");
      !s.ok()) {
    return s;
  }
  for (const GroupSettings& g : config.groups) {
    if (g.name.empty() || g.name == kDefaultGroupName) {
      return absl::InvalidArgumentError("a parameter group needs a name other than '" +
                                        std::string(kDefaultGroupName) + "'");
    }
    if (absl::Status s = ValidateSettings(config.kind, Resolve(config.defaults, g),
                                          "parameter group '" + g.name + "'");
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 0; i < config.groups.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (config.groups[i].name == config.groups[j].name) {
        return absl::InvalidArgumentError("parameter group '" + config.groups[i].name +
                                          "' is declared twice");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParamTable::SetGroups(std::vector<GroupSettings> groups) {
  TableConfig next = config_;
  next.groups = std::move(groups);
  return SetConfig(std::move(next));
}

absl::Status ParamTable::SetConfig(TableConfig next) {
  if (absl::Status s = ValidateConfig(next); !s.ok()) return s;
  if (!slots_.empty() && next.kind != config_.kind) {
    return absl::InvalidArgumentError("these keys hold " +
                                      std::string(OptimizerName(config_.kind)) +
                                      " state; the job runs " +
                                      std::string(OptimizerName(next.kind)));
  }
  std::vector<OptimizerSettings> resolved = ResolveGroups(next);
  auto optimizer = MakeOptimizer(next.kind, AnyAmsgrad(resolved));
  if (!slots_.empty() && optimizer->state_slots() != optimizer_->state_slots()) {
    return absl::InvalidArgumentError(
        "these groups need another optimizer state (amsgrad) than the keys here hold");
  }
  for (const auto& [key, slot] : slots_) {
    if (slot.group >= resolved.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", key, " is in group ", slot.group, ", which these groups lack"));
    }
  }
  config_ = std::move(next);
  resolved_ = std::move(resolved);
  optimizer_ = std::move(optimizer);
  state_.resize(optimizer_->state_slots());
  return absl::OkStatus();
}

absl::Status ParamTable::Declare(std::span<const TableKey> keys) {
  if (!slots_.empty()) return absl::FailedPreconditionError("the table holds keys already");
  std::map<uint64_t, Slot> slots;
  size_t total = 0;
  for (const TableKey& k : keys) {
    if (k.group >= resolved_.size()) {
      return absl::InvalidArgumentError(absl::StrCat("key ", k.key, " is in group ", k.group,
                                                     "; the model declares ", resolved_.size()));
    }
    if (!slots.emplace(k.key, Slot{total, k.length, k.group, k.steps}).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate key ", k.key));
    }
    total += k.length;
  }
  slots_ = std::move(slots);
  params_.Reset(std::vector<float>(total, 0.0f));
  for (size_t i = 0; i < state_.size(); ++i) {
    std::vector<float> v(total);
    for (const auto& [key, slot] : slots_) {
      std::fill_n(v.begin() + static_cast<long>(slot.offset), slot.length,
                  optimizer_->InitialState(i, resolved_[slot.group]));
    }
    state_[i].Reset(std::move(v));
  }
  return absl::OkStatus();
}

const ParamTable::Slot* ParamTable::Find(uint64_t key) const {
  auto it = slots_.find(key);
  return it == slots_.end() ? nullptr : &it->second;
}

std::span<const float> ParamTable::Param(uint64_t key) const {
  const Slot* s = Find(key);
  if (s == nullptr) return {};
  return {params_.data() + s->offset, s->length};
}

std::span<const float> ParamTable::State(size_t slot, uint64_t key) const {
  const Slot* s = Find(key);
  if (s == nullptr || slot >= state_.size()) return {};
  return {state_[slot].data() + s->offset, s->length};
}

uint32_t ParamTable::Crc(uint64_t begin, uint64_t end) const {
  uint32_t crc = 0;
  const auto first = slots_.lower_bound(begin);
  const auto last = slots_.lower_bound(end);
  for (size_t slot = 0; slot <= state_.size(); ++slot) {
    const float* base = slot == 0 ? params_.data() : state_[slot - 1].data();
    for (auto it = first; it != last; ++it) {
      crc = Crc32(crc, base + it->second.offset, it->second.length * sizeof(float));
    }
  }
  return crc;
}

void ParamTable::Write(const GradientView& values) {
  float* w = params_.Mutable();
  const float* src = values.values.data();
  for (const wire::KeyLen& k : values.keys) {
    const Slot& s = slots_.at(k.key());
    const float* from = values.at_offsets ? values.values.data() + s.offset : src;
    std::memcpy(w + s.offset, from, s.length * sizeof(float));
    src += s.length;
  }
}

void ParamTable::AddInto(std::span<float> acc, const GradientView& grad, float weight) const {
  const float* src = grad.values.data();
  for (const wire::KeyLen& k : grad.keys) {
    const Slot& s = slots_.at(k.key());
    const float* from = grad.at_offsets ? grad.values.data() + s.offset : src;
    Accumulate({acc.data() + s.offset, s.length}, {from, s.length}, weight);
    src += s.length;
  }
}

void ParamTable::Step(const StepRecord& record) {
  const GradientView& grad = record.grad;
  const bool every_key = grad.keys.empty() || grad.keys.size() == slots_.size();
  // A step of every key writes every value: into fresh buffers while a
  // reply or snapshot holds the current ones. Else copy first.
  std::pair<const float*, float*> w;
  std::array<std::pair<const float*, float*>, kMaxStateSlots> st{};
  if (every_key) {
    w = params_.Overwrite();
    for (size_t i = 0; i < state_.size(); ++i) st[i] = state_[i].Overwrite();
  } else {
    float* p = params_.Mutable();
    w = {p, p};
    for (size_t i = 0; i < state_.size(); ++i) {
      float* q = state_[i].Mutable();
      st[i] = {q, q};
    }
  }
  auto step_one = [&](Slot& s, const float* g) {
    BlockStep b;
    b.n = s.length;
    b.w_in = w.first + s.offset;
    b.w_out = w.second + s.offset;
    for (size_t i = 0; i < state_.size(); ++i) {
      b.state_in[i] = st[i].first + s.offset;
      b.state_out[i] = st[i].second + s.offset;
    }
    b.grad = g;
    b.grad_scale = record.grad_scale;
    b.fraction = record.fraction;
    b.lr = s.group < record.lr.size() ? record.lr[s.group] : resolved_[s.group].lr;
    b.step = ++s.steps;
    // The optimizers are elementwise: a big key's step is cut in pieces
    // that the shared pool's threads step at once.
    const OptimizerSettings& settings = resolved_[s.group];
    SharedPool().For(b.n, kStepChunkFloats, [&](size_t begin, size_t end) {
      BlockStep piece = b;
      piece.n = end - begin;
      piece.w_in += begin;
      piece.w_out += begin;
      for (size_t i = 0; i < state_.size(); ++i) {
        piece.state_in[i] += begin;
        piece.state_out[i] += begin;
      }
      piece.grad += begin;
      optimizer_->Step(piece, settings);
    });
  };
  if (grad.keys.empty()) {
    for (auto& [key, s] : slots_) step_one(s, grad.values.data() + s.offset);
    return;
  }
  const float* src = grad.values.data();
  for (const wire::KeyLen& k : grad.keys) {
    Slot& s = slots_.at(k.key());
    step_one(s, grad.at_offsets ? grad.values.data() + s.offset : src);
    src += s.length;
  }
}

void ParamTable::Read(std::span<const wire::KeyLen> keys, std::vector<float>* values,
                      std::vector<uint64_t>* steps) const {
  for (size_t i = 0; i <= state_.size(); ++i) {
    const float* base = i == 0 ? params_.data() : state_[i - 1].data();
    if (keys.empty()) {
      values->insert(values->end(), base, base + params_.size());  // key order, end to end
      continue;
    }
    for (const wire::KeyLen& k : keys) {
      const Slot& s = slots_.at(k.key());
      values->insert(values->end(), base + s.offset, base + s.offset + s.length);
    }
  }
  if (keys.empty()) {
    for (const auto& [key, s] : slots_) steps->push_back(s.steps);
  } else {
    for (const wire::KeyLen& k : keys) steps->push_back(slots_.at(k.key()).steps);
  }
}

void ParamTable::Assign(std::span<const wire::KeyLen> keys, std::span<const float> values,
                        std::span<const uint64_t> steps) {
  const size_t n = params_.size();
  if (keys.empty() || keys.size() == slots_.size()) {
    // Every value is written: into fresh buffers while a reply or snapshot
    // holds the current ones, with no copy first.
    std::memcpy(params_.Overwrite().second, values.data(), n * sizeof(float));
    for (size_t i = 0; i < state_.size(); ++i) {
      std::memcpy(state_[i].Overwrite().second, values.data() + (i + 1) * n, n * sizeof(float));
    }
    size_t j = 0;
    for (auto& [key, s] : slots_) s.steps = steps[j++];
    return;
  }
  size_t total = 0;
  for (const wire::KeyLen& k : keys) total += k.length();
  const float* src = values.data();
  for (size_t i = 0; i <= state_.size(); ++i) {
    float* base = i == 0 ? params_.Mutable() : state_[i - 1].Mutable();
    const float* from = src + i * total;
    for (const wire::KeyLen& k : keys) {
      const Slot& s = slots_.at(k.key());
      std::memcpy(base + s.offset, from, s.length * sizeof(float));
      from += s.length;
    }
  }
  for (size_t j = 0; j < keys.size(); ++j) slots_.at(keys[j].key()).steps = steps[j];
}

TableSlice ParamTable::Extract(uint64_t begin, uint64_t end) const {
  TableSlice out;
  size_t total = 0;
  for (const auto& [key, s] : slots_) {
    if (key < begin || key >= end) continue;
    out.keys.push_back({key, s.length, s.group, s.steps});
    total += s.length;
  }
  out.values.resize(total * (1 + state_.size()));
  size_t at = 0;
  for (const TableKey& k : out.keys) {
    const Slot& s = slots_.at(k.key);
    std::memcpy(out.values.data() + at, params_.data() + s.offset, s.length * sizeof(float));
    for (size_t i = 0; i < state_.size(); ++i) {
      std::memcpy(out.values.data() + (i + 1) * total + at, state_[i].data() + s.offset,
                  s.length * sizeof(float));
    }
    at += s.length;
  }
  return out;
}

void ParamTable::Rebuild(std::map<uint64_t, Slot> slots,
                         const std::map<uint64_t, std::vector<const float*>>& sources) {
  size_t total = 0;
  for (auto& [key, s] : slots) {
    s.offset = total;
    total += s.length;
  }
  std::vector<float> params(total);
  std::vector<std::vector<float>> state(state_.size(), std::vector<float>(total));
  for (const auto& [key, s] : slots) {
    const std::vector<const float*>& src = sources.at(key);
    std::memcpy(params.data() + s.offset, src[0], s.length * sizeof(float));
    for (size_t i = 0; i < state_.size(); ++i) {
      std::memcpy(state[i].data() + s.offset, src[i + 1], s.length * sizeof(float));
    }
  }
  slots_ = std::move(slots);
  params_.Reset(std::move(params));
  for (size_t i = 0; i < state_.size(); ++i) state_[i].Reset(std::move(state[i]));
}

size_t ParamTable::Drop(uint64_t begin, uint64_t end) {
  std::map<uint64_t, Slot> kept;
  std::map<uint64_t, std::vector<const float*>> sources;
  for (const auto& [key, s] : slots_) {
    if (key >= begin && key < end) continue;
    kept.emplace(key, s);
    std::vector<const float*>& src = sources[key];
    src.push_back(params_.data() + s.offset);
    for (const CowBuffer& b : state_) src.push_back(b.data() + s.offset);
  }
  const size_t dropped = slots_.size() - kept.size();
  if (dropped > 0) Rebuild(std::move(kept), sources);
  return dropped;
}

absl::Status ParamTable::Insert(const TableSlice& slice) {
  size_t incoming = 0;
  for (const TableKey& k : slice.keys) {
    if (slots_.count(k.key))
      return absl::InvalidArgumentError(absl::StrCat("key ", k.key, " is already here"));
    if (k.group >= resolved_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("key ", k.key, " is in group ", k.group, ", which this table lacks"));
    }
    incoming += k.length;
  }
  if (slice.values.size() != incoming * (1 + state_.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys of ", incoming, " values with ", state_.size(), " state slot(s) need ",
                     incoming * (1 + state_.size()), " floats; got ", slice.values.size()));
  }
  std::map<uint64_t, Slot> slots = slots_;
  std::map<uint64_t, std::vector<const float*>> sources;
  for (const auto& [key, s] : slots_) {
    std::vector<const float*>& src = sources[key];
    src.push_back(params_.data() + s.offset);
    for (const CowBuffer& b : state_) src.push_back(b.data() + s.offset);
  }
  size_t at = 0;
  for (const TableKey& k : slice.keys) {
    slots.emplace(k.key, Slot{0, k.length, k.group, k.steps});
    std::vector<const float*>& src = sources[k.key];
    for (size_t i = 0; i <= state_.size(); ++i)
      src.push_back(slice.values.data() + i * incoming + at);
    at += k.length;
  }
  Rebuild(std::move(slots), sources);
  return absl::OkStatus();
}

TableSnapshot ParamTable::Snapshot() const {
  TableSnapshot s;
  s.config = config_;
  s.keys.reserve(slots_.size());
  for (const auto& [key, slot] : slots_)
    s.keys.push_back({key, slot.length, slot.group, slot.steps});
  s.params = params_.shared();
  for (const CowBuffer& b : state_) s.state.push_back(b.shared());
  return s;
}

absl::Status ParamTable::Restore(const TableSnapshot& snap) {
  if (snap.config.kind != config_.kind) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint holds ", std::string(OptimizerName(snap.config.kind)),
                     " state; this job runs ", std::string(OptimizerName(config_.kind)),
                     " (as its first worker declared it, else pacer-monitor --optimizer): run "
                     "the job with ",
                     std::string(OptimizerName(snap.config.kind)), ", or remove the checkpoint"));
  }
  TableConfig next = config_;
  next.groups = snap.config.groups;
  if (absl::Status s = ValidateConfig(next); !s.ok()) return s;
  std::vector<OptimizerSettings> resolved = ResolveGroups(next);
  auto optimizer = MakeOptimizer(next.kind, AnyAmsgrad(resolved));
  if (snap.state.size() != optimizer->state_slots()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the checkpoint holds ", snap.state.size(), " optimizer state buffers; ",
                     std::string(OptimizerName(next.kind)), " with its groups keeps ",
                     optimizer->state_slots()));
  }
  std::map<uint64_t, Slot> slots;
  size_t total = 0;
  for (const TableKey& k : snap.keys) {
    if (k.group >= resolved.size()) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint key ", k.key, " is in group ",
                                                     k.group, ", which it does not declare"));
    }
    if (!slots.emplace(k.key, Slot{total, k.length, k.group, k.steps}).second) {
      return absl::InvalidArgumentError(absl::StrCat("checkpoint repeats key ", k.key));
    }
    total += k.length;
  }
  bool adds_up = snap.params && snap.params->size() == total;
  for (const ConstFloatBuffer& b : snap.state) adds_up = adds_up && b && b->size() == total;
  if (!adds_up) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint does not add up: keys hold ", total, " values"));
  }
  config_ = std::move(next);
  resolved_ = std::move(resolved);
  optimizer_ = std::move(optimizer);
  slots_ = std::move(slots);
  params_.Reset(*snap.params);
  state_.resize(optimizer_->state_slots());
  for (size_t i = 0; i < state_.size(); ++i) state_[i].Reset(*snap.state[i]);
  return absl::OkStatus();
}

}  // namespace pacer
