// The data partitions a worker reads (--data-partitions; one of the
// trainer's rooms, worker/trainer.cc): each partition is read in a shuffled
// order per epoch that depends only on (seed, partition, epoch), so that
// whoever owns a partition next continues it where the monitor's position
// says. The positions go to the monitor through the session.
#ifndef PACER_WORKER_PARTITION_READER_H_
#define PACER_WORKER_PARTITION_READER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "ps/base/messages.h"
#include "worker/monitor_session.h"
#include "worker/trainer.h"

namespace pacer::worker {

class PartitionReader {
 public:
  explicit PartitionReader(MonitorSession* session) : session_(session) {}
  // The training set's size and its number of partitions.
  void Configure(size_t samples, uint32_t count) {
    samples_ = samples;
    count_ = std::max<uint32_t>(1, count);
  }
  uint32_t count() const { return count_; }
  size_t owned() const { return readers_.size(); }

  // Takes the partitions the monitor gives this worker (from the monitor's
  // positions), lets go of those it moved elsewhere once the monitor holds
  // their final positions.
  void Sync(const std::vector<wire::PartitionPosition>& owned);
  // The next partition with samples left (round-robin) into `plan`
  // (partition, epoch, samples): a batch of `batch`, or the rest of the
  // epoch when less is left, so that none is skipped; no samples when this
  // worker owns no partition. False when every partition it owns has run
  // `epochs` (0: no cap).
  bool Plan(size_t batch, uint32_t epochs, uint64_t seed, BatchPlan* plan);
  // The lowest epoch among the owned partitions not done (0: none), as of
  // the last Plan.
  uint32_t epoch() const { return epoch_; }
  // That epoch with the fraction of it read (progress lines).
  double EpochProgress() const;
  // Whether the last plan read a partition (false: an empty push).
  bool reading() const { return current_ != nullptr; }
  // The last plan's `n` samples were consumed (their push acknowledged):
  // the partition's position moves, and the monitor hears of it. False
  // when the plan read no partition. With `publish` false (a local step of
  // a round, mode local) the position moves here only, and the monitor
  // hears of it at Publish (the round's push acknowledged).
  bool Consumed(size_t n, bool publish = true);
  // Every owned partition's position as read here, to the monitor.
  void Publish();
  // Back to the positions the monitor holds from us (a round whose push
  // was not taken: its samples are read again).
  void Rewind();

 private:
  struct Reader {
    size_t begin = 0, end = 0;  // its samples
    uint32_t epoch = 0;
    uint64_t offset = 0;  // next sample of this epoch's order
    std::vector<uint32_t> order;
    uint32_t order_epoch = UINT32_MAX;
  };

  MonitorSession* const session_;
  size_t samples_ = 0;
  uint32_t count_ = 1;
  std::map<uint32_t, Reader> readers_;
  uint32_t last_read_ = UINT32_MAX;  // round-robin over the owned partitions
  uint32_t epoch_ = 0;
  // The last plan's partition (null: none read).
  Reader* current_ = nullptr;
  uint32_t current_index_ = 0;
};

}  // namespace pacer::worker

#endif  // PACER_WORKER_PARTITION_READER_H_
