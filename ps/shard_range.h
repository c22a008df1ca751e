// What ShardCore's rooms share (ps/shard.h): a message out, and the range a
// core serves (its parameter table, how far it has stepped, the table-sized
// accumulators passed between the clock barrier and replication), with the
// description of a slice of it that key moves and seeds carry.
#ifndef PACER_PS_SHARD_RANGE_H_
#define PACER_PS_SHARD_RANGE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ps/base/frame.h"
#include "ps/base/messages.h"
#include "ps/table.h"

namespace pacer {

// A message a core sends: a reply to `peer` (its routing id), or with
// `to_shard` set a request to that shard (a backup of this one's range),
// sent on the server's connection to it.
struct ShardOutgoing {
  Frame peer;
  Frames frames;
  uint32_t to_shard = 0;
};

// The range a core serves. Single-threaded, with its core.
struct ShardRange {
  // The model: owned keys, parameters, optimizer state (DeclareModel, key
  // moves, Restore). Its buffers are shared with ZeroMQ while a pull reply
  // that references them is in flight, and with checkpoint snapshots; the
  // table writes around them (copy-on-write), so replies go out zero-copy
  // and never see a half-applied step.
  std::unique_ptr<ParamTable> table = std::make_unique<ParamTable>(TableConfig{});
  bool initialized = false;  // parameters set (Init, a move in, a restore)
  int64_t applied_clock = -1;
  uint64_t steps = 0;
  // Table-sized accumulators: spare ones for the next clock, and those lent
  // to replication records in flight (taken back once ZeroMQ lets go).
  std::vector<std::vector<float>> spare_acc;
  std::vector<std::shared_ptr<std::vector<float>>> lent_acc;

  // A zeroed accumulator of the table's size.
  std::vector<float> TakeBuffer();
  // An accumulator no record holds on to serves a later clock.
  void Recycle(std::shared_ptr<std::vector<float>> acc);
  // After keys moved in or out: the spare accumulators no longer fit.
  void LayoutChanged() {
    spare_acc.clear();
    lent_acc.clear();
  }
};

// A move's or a seed's description of `slice` (taken from `table`), and the
// slice a MoveData and its payload describe (sizes checked by the caller:
// groups and key_steps run parallel to keys).
msg::MoveData MoveDataOf(const ParamTable& table, const TableSlice& slice, int64_t applied_clock,
                         uint64_t steps);
TableSlice SliceOf(const msg::MoveData& m, std::span<const float> values);

}  // namespace pacer

#endif  // PACER_PS_SHARD_RANGE_H_
