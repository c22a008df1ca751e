// Elastic shards: pacerctl add-shard (an idle shard takes half the bytes of
// the largest range) and drain-shard (a range goes to its neighbour, or
// with --replicas is handed to a backup). A move holds the workers at a
// clock, waits until no clock is open anywhere, runs the KeyMove
// (monitor/key_move.h) and puts the new ranges into the map. No sockets;
// the monitor's one thread.
#ifndef PACER_MONITOR_SHARD_MOVES_H_
#define PACER_MONITOR_SHARD_MOVES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "monitor/key_move.h"
#include "monitor/membership.h"
#include "monitor/model_registry.h"
#include "monitor/outgoing.h"
#include "monitor/range_table.h"
#include "monitor/replication.h"
#include "monitor/shard_registry.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

class ShardMoves {
 public:
  struct Options {
    uint64_t job_id = 0;
    size_t max_message_bytes = 0;
  };
  ShardMoves(const Options& options, const Clock* clock, ShardRegistry* shards, RangeTable* ranges,
             const ModelRegistry* model, Membership* members, Replication* replication)
      : options_(options), clock_(clock), shards_(shards), ranges_(ranges), model_(model),
        members_(members), replication_(replication) {}

  // A move in progress (a key move or a drain's hand-over).
  bool moving() const { return move_.has_value() || replication_->handing_off(); }
  bool key_move() const { return move_.has_value(); }
  // pacerctl add-shard / drain-shard of shard `shard_id`: the move starts
  // (the workers are held); a refusal says why not.
  std::optional<std::string> Request(wire::ShardOp op, uint32_t shard_id);
  // Starts the move once the cluster is quiet; re-sends its pending step.
  void Step(std::vector<MonitorOutgoing>* out);
  // A reply from shard `index`'s channel that belongs to the move: its next
  // step, and the new map once it is done. False: not the move's.
  bool OnReply(size_t index, const Decoded& reply, std::vector<MonitorOutgoing>* out);

 private:
  // The values in [begin, end) of the declared model.
  uint64_t ValuesIn(uint64_t begin, uint64_t end) const;
  void Finish(std::vector<MonitorOutgoing>* out);

  const Options options_;
  const Clock* const clock_;
  ShardRegistry* const shards_;
  RangeTable* const ranges_;
  const ModelRegistry* const model_;
  Membership* const members_;
  Replication* const replication_;
  std::optional<KeyMove> move_;
  wire::ShardOp op_ = wire::ShardOp::Add;
};

}  // namespace pacer

#endif  // PACER_MONITOR_SHARD_MOVES_H_
