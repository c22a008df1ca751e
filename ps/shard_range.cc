#include "ps/shard_range.h"

#include <algorithm>

namespace pacer {

std::vector<float> ShardRange::TakeBuffer() {
  if (!spare_acc.empty()) {
    std::vector<float> b = std::move(spare_acc.back());
    spare_acc.pop_back();
    std::fill(b.begin(), b.end(), 0.0f);
    return b;
  }
  // An accumulator a record went out with, once ZeroMQ has let go of it.
  for (auto it = lent_acc.begin(); it != lent_acc.end(); ++it) {
    if (it->use_count() == 1) {
      std::vector<float> b = std::move(**it);
      lent_acc.erase(it);
      if (b.size() != table->values()) break;
      std::fill(b.begin(), b.end(), 0.0f);
      return b;
    }
  }
  return std::vector<float>(table->values(), 0.0f);
}

void ShardRange::Recycle(std::shared_ptr<std::vector<float>> acc) {
  // A step's accumulator not lent to a record (ssp and dssp batch several
  // steps in one): it serves a later clock (TakeBuffer) instead of a fresh
  // table-sized allocation per step.
  if (acc && acc.use_count() == 1 && acc->size() == table->values()) {
    spare_acc.push_back(std::move(*acc));
  }
}

msg::MoveData MoveDataOf(const ParamTable& table, const TableSlice& slice, int64_t applied_clock,
                         uint64_t steps) {
  msg::MoveData data;
  data.applied_clock = applied_clock;
  data.steps = steps;
  data.optimizer = table.config().kind;
  data.state_slots = static_cast<uint32_t>(table.state_slots());
  data.param_groups = table.config().groups;
  for (const TableKey& k : slice.keys) {
    data.keys.emplace_back(k.key, k.length);
    data.groups.push_back(k.group);
    data.key_steps.push_back(k.steps);
  }
  return data;
}

TableSlice SliceOf(const msg::MoveData& m, std::span<const float> values) {
  TableSlice slice;
  for (size_t i = 0; i < m.keys.size(); ++i) {
    slice.keys.push_back({m.keys[i].key(), static_cast<uint32_t>(m.keys[i].length()), m.groups[i],
                          m.key_steps[i]});
  }
  slice.values.assign(values.begin(), values.end());
  return slice;
}

}  // namespace pacer
