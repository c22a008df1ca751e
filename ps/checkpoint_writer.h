// A shard's checkpoint writer: writes snapshots to its CheckpointStore on a
// thread of its own, so that the serving loop never waits on the disk, and
// gives up a final checkpoint that a stop cannot wait for (a hung disk must
// not hang SIGTERM).
#ifndef PACER_PS_CHECKPOINT_WRITER_H_
#define PACER_PS_CHECKPOINT_WRITER_H_

#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "prometheus/labels.h"
#include "ps/base/clock.h"
#include "ps/base/fault.h"
#include "ps/checkpoint.h"

namespace prometheus {
class Registry;
}

namespace pacer {

class CheckpointWriter {
 public:
  // Starts the writer thread on `store`, registering the checkpoint metrics
  // (pacer_shard_checkpoint_*) in `registry`; `interval` is only reported
  // (pacer_shard_checkpoint_interval_seconds). `faults` may be null; its
  // slow_disk rules delay each write. `shard` names the shard in logs;
  // `labels` go on every series (range="<id>" for a range the shard serves
  // since a promotion).
  CheckpointWriter(std::unique_ptr<CheckpointStore> store,
                   std::shared_ptr<prometheus::Registry> registry, Duration interval,
                   const Clock* clock, std::shared_ptr<FaultInjector> faults, uint32_t shard,
                   const prometheus::Labels& labels = {});
  // Stops and joins the thread, so the store is closed on return. One stuck
  // in the disk past a second is left to finish on its own (it owns what it
  // uses), so that destruction never hangs.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Hands `snap` to the writer; false (and nothing is written) while the
  // previous one is still being written. Never blocks on the disk.
  bool Offer(ShardSnapshot snap);
  // The last checkpoint: waits for the write in flight, then writes `snap`,
  // all by `deadline`. DeadlineExceeded, saying which wait ran out, when it
  // passes: the write is given up (a slow_disk delay still pending is cut
  // short and writes nothing) and the store keeps the previous snapshot
  // (writes are atomic, ps/checkpoint.h). A failed write is logged and
  // counted, as any checkpoint's; it returns OK.
  absl::Status Final(ShardSnapshot snap, TimePoint deadline);
  // Unix time of the state in the last successful checkpoint; 0: none yet.
  double last_success_unix() const;
  // Seconds since that state was captured (since this writer started when
  // there is none); also sets pacer_shard_checkpoint_age_seconds.
  double AgeSeconds() const;

 private:
  struct State;  // shared with the thread, which may outlive this object
  std::shared_ptr<State> state_;
  std::thread thread_;  // joined once it ended, else left to finish (detached)
};

}  // namespace pacer

#endif  // PACER_PS_CHECKPOINT_WRITER_H_
