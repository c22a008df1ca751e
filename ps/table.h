// A shard's parameter table: the model's keys it owns, their parameters,
// the optimizer's state and each key block's step count, and the one step
// function every consistency mode calls. The shard (ps/shard.h) decides when
// a step happens and with what (the barrier, dedup, membership); the table
// decides what a step does.
//
// A step is described by a StepRecord: the keys, their gradient, and each
// group's learning rate for this step. Applying the same records in the same
// order to two tables that hold the same state gives the same state, bit for
// bit: the record is what a replica would need.
//
// Copy-on-write: parameters and state buffers are shared, read-only, with
// pull replies in flight and checkpoint snapshots. A step that rewrites
// every value writes into fresh (pooled) buffers and reads the old ones, with
// no copy first; a step of some keys copies first.
//
// Single-threaded: one thread calls every method.
#ifndef PACER_PS_TABLE_H_
#define PACER_PS_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ps/base/optimizer_config.h"
#include "ps/base/wire.h"
#include "ps/optimizer.h"

namespace pacer {

using FloatBuffer = std::shared_ptr<std::vector<float>>;
using ConstFloatBuffer = std::shared_ptr<const std::vector<float>>;

// The optimizer of a table and its groups' settings (group 0 "default": the
// job's; group i + 1: `groups[i]` over the job's).
struct TableConfig {
  OptimizerKind kind = OptimizerKind::kSgd;
  OptimizerSettings defaults = DefaultSettings(OptimizerKind::kSgd);
  std::vector<GroupSettings> groups;
  bool operator==(const TableConfig&) const = default;
};

// One key block: its length, group and steps taken.
struct TableKey {
  uint64_t key = 0;
  uint32_t length = 0;
  uint32_t group = kDefaultGroup;
  uint64_t steps = 0;
  bool operator==(const TableKey&) const = default;
};

// Gradient values of some keys: laid out in key order (a push's payload),
// or each at its key's offset in the table (a table-sized buffer: the
// shard's accumulator, a push assembled from parts).
struct GradientView {
  std::span<const wire::KeyLen> keys;  // ascending, each owned with its length
  std::span<const float> values;
  bool at_offsets = false;
};

// One optimizer step. An empty `grad.keys` means every key, with `values`
// at offsets (the synchronous step on the accumulator).
struct StepRecord {
  GradientView grad;
  // The gradient is grad_scale * values (1 / the sum of the batch weights).
  float grad_scale = 1.0f;
  // Each group's learning rate for this step, scale included (staleness,
  // b_i / B); as many as the table has groups.
  std::vector<float> lr;
  // How much of a full step this is, (0, 1] (BlockStep::fraction): the
  // step's samples over the global batch.
  float fraction = 1.0f;
};

// Keys with everything they hold, as a move carries them and a checkpoint
// stores them: values are the keys' parameters end to end, then each state
// slot's values the same way.
struct TableSlice {
  std::vector<TableKey> keys;
  std::vector<float> values;  // (1 + state slots) * the keys' lengths
};

// The whole table as a checkpoint keeps it; the buffers are shared, never
// written once in a snapshot.
struct TableSnapshot {
  TableConfig config;
  std::vector<TableKey> keys;  // ascending; params and state: their values end to end
  ConstFloatBuffer params = std::make_shared<std::vector<float>>();
  std::vector<ConstFloatBuffer> state;  // one per state slot
  // Compares the values, not the buffers' addresses.
  bool operator==(const TableSnapshot& o) const;
};

class ParamTable {
 public:
  // A table of no keys yet. `config` must have passed ValidateConfig.
  explicit ParamTable(TableConfig config);

  // Settings a table accepts: each group resolved over the defaults passes
  // ValidateSettings. InvalidArgument naming the group otherwise.
  static absl::Status ValidateConfig(const TableConfig& config);

  const TableConfig& config() const { return config_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  size_t state_slots() const { return optimizer_->state_slots(); }
  size_t groups() const { return resolved_.size(); }
  // Group g's settings (the defaults overlaid with its own).
  const OptimizerSettings& settings(uint32_t group) const { return resolved_.at(group); }

  // Replaces the groups (a declaration that names them, after the table was
  // made from the job's settings alone). InvalidArgument as ValidateConfig,
  // or when a state slot count would change and the table holds keys.
  absl::Status SetGroups(std::vector<GroupSettings> groups);
  // Replaces the whole configuration (the job's optimizer as its first
  // worker declared it): as SetGroups, and the kind may change only while
  // the table holds no keys.
  absl::Status SetConfig(TableConfig next);

  // Takes `keys` as the table's (the first declaration): parameters 0,
  // state at its initial value, no steps. InvalidArgument on a repeated key
  // or a group the table does not have; FailedPrecondition when it holds
  // keys already.
  absl::Status Declare(std::span<const TableKey> keys);

  bool empty() const { return slots_.empty(); }
  size_t key_count() const { return slots_.size(); }
  size_t values() const { return params_.size(); }

  struct Slot {
    size_t offset = 0;
    uint32_t length = 0;
    uint32_t group = kDefaultGroup;
    uint64_t steps = 0;
  };
  // nullptr when `key` is not here.
  const Slot* Find(uint64_t key) const;
  const std::map<uint64_t, Slot>& slots() const { return slots_; }

  // The parameters, shared (zero-copy replies; a later write goes elsewhere).
  const FloatBuffer& params() const { return params_.shared(); }
  std::span<const float> Param(uint64_t key) const;
  // State slot `slot` of `key` (tests).
  std::span<const float> State(size_t slot, uint64_t key) const;
  // The CRC-32 (Crc32) of the parameters, then of each state slot, of the
  // keys in [begin, end), each key's values in key order: what a replica
  // compares with its primary's. Step counts are not in it.
  uint32_t Crc(uint64_t begin, uint64_t end) const;

  // Sets the parameters of `grad.keys` to `grad.values` (rank 0's init).
  void Write(const GradientView& values);
  // acc += weight * the gradient, at each key's offset; acc has values() floats.
  void AddInto(std::span<float> acc, const GradientView& grad, float weight) const;
  // One optimizer step: each key of the record (every key when it names
  // none) steps with its group's lr and its own step count, which goes up.
  void Step(const StepRecord& record);

  // The parameters, then each state slot's values, of `keys` (every key
  // when empty), each end to end in key order as a TableSlice lays them
  // out, appended to `values`; the keys' step counts appended to `steps`.
  // Every key must be here with its length.
  void Read(std::span<const wire::KeyLen> keys, std::vector<float>* values,
            std::vector<uint64_t>* steps) const;
  // Sets the parameters, state and step counts of `keys` (every key when
  // empty) to values and steps laid out as Read gives them: a replica
  // taking the state its primary's steps left. The caller checks first
  // (so that a bad record changes nothing) that the keys are here with
  // these lengths, ascending, and that the sizes add up.
  void Assign(std::span<const wire::KeyLen> keys, std::span<const float> values,
              std::span<const uint64_t> steps);

  // Keys in [begin, end) with all they hold (a copy; they stay).
  TableSlice Extract(uint64_t begin, uint64_t end) const;
  // Removes keys in [begin, end); returns how many went.
  size_t Drop(uint64_t begin, uint64_t end);
  // Adds the slice's keys. InvalidArgument when one is here already, its
  // group is unknown, or the values do not add up.
  absl::Status Insert(const TableSlice& slice);

  TableSnapshot Snapshot() const;
  // Replaces everything with the snapshot's. InvalidArgument when it does
  // not add up, or holds another optimizer's state than this table's
  // config (a job restarted with another --optimizer).
  absl::Status Restore(const TableSnapshot& snapshot);

 private:
  // A buffer shared read-only with replies and snapshots, and the spare it
  // was swapped for, reused once nobody else holds it.
  class CowBuffer {
   public:
    size_t size() const { return buf_->size(); }
    const FloatBuffer& shared() const { return buf_; }
    const float* data() const { return buf_->data(); }
    void Reset(std::vector<float> values);
    // The buffer, writable: copied first while someone else holds it.
    float* Mutable();
    // For a write of every value: the buffer, writable without a copy, and
    // the old values to read from (the buffer itself when nobody held it).
    std::pair<const float*, float*> Overwrite();

   private:
    FloatBuffer buf_ = std::make_shared<std::vector<float>>();
    FloatBuffer spare_;
  };

  // Lays the keys out again in key order from (slot, source) pairs.
  void Rebuild(std::map<uint64_t, Slot> slots,
               const std::map<uint64_t, std::vector<const float*>>& sources);

  TableConfig config_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<OptimizerSettings> resolved_;  // per group
  std::map<uint64_t, Slot> slots_;
  CowBuffer params_;
  std::vector<CowBuffer> state_;
};

}  // namespace pacer

#endif  // PACER_PS_TABLE_H_
