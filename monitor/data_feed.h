// How the job's training set reaches the workers: the data stream (the
// default; monitor/data_stream.h) or data partitions (--data-partitions),
// with every read position, who holds what, and the epochs' log lines.
// It follows the membership: on each change (Reassign) a departed worker's
// share goes to the live ones. No sockets; the monitor's one thread.
#ifndef PACER_MONITOR_DATA_FEED_H_
#define PACER_MONITOR_DATA_FEED_H_

#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "absl/status/status.h"
#include "monitor/data_stream.h"
#include "monitor/journal.h"
#include "monitor/membership.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"

namespace pacer {

// One data partition: who reads it, and where its reading stands.
struct PartitionState {
  uint32_t owner = 0;  // worker id; 0: nobody
  uint32_t epoch = 0;
  uint64_t offset = 0;
  // Moving from this live worker to `owner`: the new owner gets it once
  // the old one has reported its final position and let go (0: not moving).
  uint32_t releasing = 0;
};

class DataFeed {
 public:
  DataFeed(const Membership* members, const Clock* clock, Journal* journal)
      : members_(members), clock_(clock), journal_(journal) {}

  // At the job's start: a stream with `options`, or (nullopt) `partitions`
  // data partitions, for the live workers.
  void Start(const std::optional<DataStreamOptions>& stream, uint32_t partitions);
  // The membership changed: a worker that left gives its partitions and
  // chunks back; a newcomer takes some partitions over.
  void Reassign();

  // A worker's heartbeat: its read positions (only the partitions it reads
  // move, and only forward; one it handed over and no longer reports is
  // released) and its chunk report.
  void TakeReport(const WorkerState& w, const msg::Heartbeat& hb);
  // Into its reply: the partitions it reads.
  void FillReply(const WorkerState& w, msg::HeartbeatReply* reply) const;
  // With the stream: what a worker holds now (chunks handed out while it
  // trains, the job's epoch) into its reply; logs each epoch that ended
  // (`started`: when the job started, for the log).
  void StreamReply(const WorkerState& w, float samples_per_second, bool training,
                   std::optional<TimePoint> started, msg::HeartbeatReply* reply);
  // A live worker's pace at the start or on a resume.
  void SetPace(uint32_t worker, float samples_per_second, uint32_t batch);

  uint32_t partition_count() const { return partition_count_; }
  const std::vector<PartitionState>& partitions() const { return partitions_; }
  // The data stream, once the job has started; else null (--data-partitions).
  const DataStream* stream() const { return stream_ ? &*stream_ : nullptr; }
  // The stream's every epoch is trained.
  bool finished() const { return stream_ && stream_->finished(); }
  // For pacerctl status.
  void FillStatus(msg::StatusReply* r, uint32_t epochs, uint64_t samples) const;

  // Its part of the monitor's saved state. Restore takes the stream's
  // options (the declared training set) when the saved job has one.
  void Save(MonitorRecord* r) const;
  absl::Status Restore(const MonitorRecord& r, const DataStreamOptions& stream);

 private:
  void AssignPartitions();
  void ReleaseDeparted();
  void LogEpochsEnded(std::optional<TimePoint> started);

  const Membership* const members_;
  const Clock* const clock_;
  Journal* const journal_;
  uint32_t partition_count_ = 0;
  std::vector<PartitionState> partitions_;
  std::optional<DataStream> stream_;  // the data stream, from the job's start
  uint32_t logged_epoch_ = 0;         // epochs before it are logged as ended
};

}  // namespace pacer

#endif  // PACER_MONITOR_DATA_FEED_H_
