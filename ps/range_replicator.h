// The primary's side of replication (the monitor's --replicas): the range's
// backups, the records of what the range applied that go to them, their
// acknowledgements, and from those how far each worker's pushes are
// durable; also the ledger of every push applied. One of ShardCore's rooms
// (ps/shard.h): the core tells it each step and each push it applies, and
// when to send. No sockets; the core's one thread.
//
// A backup new to the set gets a seed, the whole range, once the range
// holds values; after that every applied step goes to each backup in a
// record, after aggregation: one record per step at once in bsp and backup
// mode, in ssp and dssp the steps of up to kReplicaBatchDelay
// (kReplicaBatchSteps steps), in asp the steps of up to kReplicaBatchSteps
// pushes (kReplicaBatchValues values) or kReplicaBatchDelay per record.
// Once a batch's gradients take more values than the state they changed
// (the parameters and each optimizer state slot), its record carries that
// state instead, which the backup takes as it is (ReplicaStep.assign). A
// worker's push is durable once every backup in the set acknowledged the
// record that holds it. With the set empty nothing is replicated and every
// applied push counts as durable (the guarantee of --replicas 0).
#ifndef PACER_PS_RANGE_REPLICATOR_H_
#define PACER_PS_RANGE_REPLICATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "ps/applied_ledger.h"
#include "ps/base/clock.h"
#include "ps/base/messages.h"
#include "ps/base/safeguards.h"
#include "ps/checkpoint.h"
#include "ps/shard_metrics.h"
#include "ps/shard_range.h"
#include "ps/table.h"

namespace pacer {

class RangeReplicator {
 public:
  struct Options {
    bool check_crc = true;     // records carry message checks
    Safeguards safeguards;     // durable-wait
  };
  RangeReplicator(const Options& options, const Clock* clock, ShardRange* range,
                  ShardMetrics* metrics)
      : options_(options), clock_(clock), range_(range), metrics_(metrics) {}
  // The job's id and the shard's, for the records' envelopes.
  void Configure(uint64_t job_id, uint32_t shard_id) {
    job_id_ = job_id;
    shard_id_ = shard_id;
  }

  // The range's epoch and backups (shard ids), from the monitor.
  void SetReplicaSet(uint64_t epoch, std::vector<uint32_t> backups, std::vector<ShardOutgoing>* out);
  bool replicated() const { return !backups_.empty(); }
  uint64_t epoch() const { return epoch_; }

  // A push applied: worker `worker`'s push `seq` (0: none given) is in the
  // ledger, and durable at once without backups.
  void NoteApplied(uint32_t worker, uint64_t seq);
  // A step applied to the range: into the next record (its gradient copied
  // unless `lent` holds it).
  void ReplicateStep(const StepRecord& step, std::shared_ptr<std::vector<float>> lent);
  // Whether the batch's record is to go now (its steps or values reached
  // kReplicaBatchSteps or kReplicaBatchValues).
  bool BatchFull() const;
  // The next record, of what was applied since the last, to every seeded
  // backup (nothing when nothing is new).
  void Flush(std::vector<ShardOutgoing>* out);
  // The record marked last (Leave): false without backups.
  bool SendLast(std::vector<ShardOutgoing>* out);
  // The batch's delay passed: its record goes; seeds due go.
  void Tick(TimePoint now, std::vector<ShardOutgoing>* out);
  // When Tick has something to do next (max: nothing).
  TimePoint NextDeadline() const;
  // Keys moved in or out: the backups' replicas no longer have this
  // layout, and are seeded afresh.
  void LayoutChanged();
  // A restore: each worker's last applied push seq and the ledger (its
  // dedup state goes with a backup's seed: a promoted replica's new backup
  // must not apply a retried push again).
  void Restore(const ShardSnapshot& s);

  // A backup's acknowledgement, or its refusal of a record.
  void OnReply(const Decoded& d);
  void OnBackupError(const Decoded& d);

  // While held, durability goes no further than it is (records still go out
  // and are acknowledged): the monitor keeps a backup dropped from the set
  // as a standby it may promote, which lacks what the new set takes from
  // here. Released, it catches up at once.
  void SetDurableHold(bool hold);
  bool durable_hold() const { return durable_hold_; }

  // The worker's pushes through this seq are durable (0: none yet).
  uint64_t durable_seq(uint32_t worker) const;
  // Records made so far, how far backup `id` acknowledged them, and the last
  // one every backup acknowledged (all made, with none).
  uint64_t record() const { return record_; }
  uint64_t backup_acked(uint32_t id) const;
  uint64_t durable_record() const;
  // The backups that fall behind (ShardCore::kBackupLagLimit), and how long
  // the longest has owed an acknowledgement (0: none owes one).
  std::vector<uint32_t> lagging_backups() const;
  double lag_seconds() const;
  // Every (worker, seq) the range applied.
  const AppliedLedger& ledger() const { return ledger_; }

  static constexpr size_t kReplicaBatchSteps = 16;
  static constexpr size_t kReplicaBatchValues = size_t{1} << 22;
  static constexpr Duration kReplicaBatchDelay = std::chrono::milliseconds(10);
  static constexpr uint64_t kReplicaCheckEvery = 16;
  static constexpr Duration kBackupLagLimit = std::chrono::seconds(5);

 private:
  struct BackupLink {
    uint64_t acked = 0;        // records it holds through
    bool seeded = false;       // a seed went out; records follow it
    uint64_t seed_record = 0;  // the record the last seed stood for
    TimePoint retry_at{};      // after an error: seed again from then on
    // Since when it has owed an acknowledgement (max: it holds everything
    // sent), for lagging_backups().
    TimePoint behind_since = TimePoint::max();
  };
  struct UnackedRecord {
    uint64_t record = 0;
    std::vector<std::pair<uint32_t, uint64_t>> marks;  // worker, last applied seq
    TimePoint sent{};
  };

  Envelope RequestEnvelope() const;
  void SendRecord(bool last, std::vector<ShardOutgoing>* out);
  void SendSeed(uint32_t backup, std::vector<ShardOutgoing>* out);
  // Forgets the batch of steps, marks and applied pushes not yet in a
  // record (after a record, or with no backups left).
  void ClearBatch();
  // After an acknowledgement or a change of the set: what is durable now.
  void UpdateDurable();
  // After `link` acknowledged: since when it owes the next record (max:
  // nothing).
  void UpdateBehind(BackupLink& link);
  void NoteAssignKeys(std::span<const wire::KeyLen> keys);
  std::shared_ptr<std::vector<float>> TakeRecordBuffer();
  // The next check window: keys from check_cursor_ up to about 64 Ki values.
  std::pair<uint64_t, uint64_t> NextCheckWindow();

  const Options options_;
  const Clock* const clock_;
  ShardRange* const range_;
  ShardMetrics* const metrics_;
  uint64_t job_id_ = 0;
  uint32_t shard_id_ = 0;

  uint64_t epoch_ = 0;
  std::map<uint32_t, BackupLink> backups_;
  uint64_t record_ = 0;  // the last record made
  std::vector<msg::ReplicaStep> steps_;   // applied since the last record
  std::shared_ptr<std::vector<float>> values_;  // their gradients, copied (asp)
  // Buffers records went out with (TakeRecordBuffer), kRecordBuffers at most.
  std::vector<std::shared_ptr<std::vector<float>>> sent_values_;
  static constexpr size_t kRecordBuffers = 2;
  std::shared_ptr<std::vector<float>> lent_;  // a step's accumulator (sync)
  size_t batch_steps_ = 0;  // steps applied since the last record
  // The batch's record carries the state of the keys its steps changed
  // (every key, or those listed), not their gradients (ReplicaStep.assign).
  bool assign_ = false;
  bool assign_all_ = false;
  std::vector<uint64_t> assign_keys_;
  std::map<uint32_t, uint64_t> marks_;          // changed since the last record
  std::map<uint32_t, uint64_t> applied_marks_;  // each worker's last applied seq
  TimePoint first_ = TimePoint::max();          // the oldest step not in a record
  std::deque<UnackedRecord> unacked_;
  std::map<uint32_t, uint64_t> durable_;        // worker -> durable through seq
  AppliedLedger ledger_;                        // every push applied
  std::vector<std::pair<uint32_t, uint64_t>> applied_;  // applied since the last record
  uint64_t check_cursor_ = 0;                   // first key of the next check window
  bool durable_hold_ = false;
};

}  // namespace pacer

#endif  // PACER_PS_RANGE_REPLICATOR_H_
