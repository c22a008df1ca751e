// A key range a shard serves, with everything it is served with: its core,
// its socket, its connections to the range's backups, and its checkpoints.
// A shard serves its own range, and each range it took over when the
// monitor promoted its replica of it (a failover); ShardServer keeps them
// in one collection and treats them alike. Used by one thread.
#ifndef PACER_PS_SERVED_RANGE_H_
#define PACER_PS_SERVED_RANGE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"
#include "ps/base/transport.h"
#include "ps/checkpoint_writer.h"
#include "ps/shard.h"

namespace pacer {

// When a served range is checkpointed (pacer-server's --checkpoint-interval,
// --checkpoint-updates, --stop-timeout, --unsafe-disable checkpoints).
struct CheckpointPolicy {
  Duration interval = std::chrono::seconds(10);  // 0: never on time
  uint64_t updates = 0;                           // 0: never on count
  // false only to show a chaos invariant failing: after its first
  // checkpoint on time or count a range takes no more (but for key moves
  // and at exit).
  bool periodic = true;
  Duration stop_timeout = std::chrono::seconds(30);  // for the final one
};

struct ServedRange {
  // A connection to one of the range's backups.
  struct BackupSocket {
    std::string address;
    std::unique_ptr<Socket> socket;
  };
  // Where the range's checkpoints stand: what the last one offered held,
  // and how many were taken on time or count.
  struct CheckpointProgress {
    TimePoint last{};
    uint64_t updates = 0;
    int64_t clock = -2;
    uint64_t keys = 0;
    uint64_t periodic_taken = 0;
  };

  uint32_t shard = 0;  // the shard serving it (logs)
  uint32_t range = 0;  // the range's id: the shard that first served it
  // A range taken over: the epoch it was given at (a shard's own range's
  // epoch is its core's replication_epoch()).
  uint64_t epoch = 0;
  std::unique_ptr<ShardCore> core;
  std::unique_ptr<Socket> router;
  std::string address;   // as advertised
  bool stopped = false;  // a range taken over: its core was told to stop
  std::map<uint32_t, BackupSocket> backups;  // by shard id
  // Its checkpoints (null: no --data-dir; for a range taken over, also once
  // it is served elsewhere): a shard's own in DATA_DIR/checkpoint, a range
  // taken over in DATA_DIR/range-<id>.
  std::unique_ptr<CheckpointWriter> writer;
  CheckpointProgress checkpointed;

  // Whether it is the serving shard's own range (else one taken over).
  bool own() const { return range == shard; }
  // The range's epoch as this shard serves it.
  uint64_t current_epoch() const { return own() ? core->replication_epoch() : epoch; }
  // Sends `out` and clears it: replies on the range's socket, records to
  // its backups.
  void SendAll(std::vector<ShardCore::Outgoing>* out);
  // Connects to the backups named by `ids` (addresses and keys from
  // `infos`), keeping connections that stay; returns the ids connected.
  std::vector<uint32_t> ConnectBackups(Transport* transport,
                                       const std::vector<msg::ShardInfo>& infos,
                                       const std::vector<uint32_t>& ids);
  // The range's backups (shard ids `ids`, addresses and keys from `infos`)
  // at `epoch`: connected, and a seed for each new one. With `hold`,
  // durability is held before the new set takes effect (its backups'
  // acknowledgements must not make durable what a standby lacks); without,
  // it is let go after.
  void SetBackups(Transport* transport, const std::vector<msg::ShardInfo>& infos,
                  const std::vector<uint32_t>& ids, uint64_t epoch, bool hold,
                  std::vector<ShardCore::Outgoing>* out);
  // The range is served elsewhere since `epoch` (a failover while this
  // shard was cut off from the monitor): its core answers nothing of it
  // any more and copies to no backup.
  void Depose(uint64_t epoch, std::vector<ShardCore::Outgoing>* out);
  // Offers the core's snapshot to the writer (none: nothing to do) when
  // one is due by `policy`; `final`: one last snapshot, given up at
  // `deadline` (then the error says why; the previous checkpoint stays).
  absl::Status Checkpoint(const CheckpointPolicy& policy, bool final, TimePoint deadline,
                          const Clock* clock);
};

}  // namespace pacer

#endif  // PACER_PS_SERVED_RANGE_H_
