// A parameter-server shard: the per-clock barrier, dedup and membership
// around a parameter table (ps/table.h: the keys it owns, their parameters,
// the optimizer and its state). ShardCore is the logic with no sockets and
// an injected clock; ShardServer (shard_server.h) runs it on a transport.
#ifndef PACER_PS_SHARD_H_
#define PACER_PS_SHARD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "ps/checkpoint.h"
#include "ps/base/clock.h"
#include "ps/base/metrics.h"
#include "ps/base/safeguards.h"
#include "ps/table.h"
#include "ps/base/messages.h"
#include "ps/base/server_core.h"
#include "ps/applied_ledger.h"
#include "ps/range_replicator.h"
#include "ps/replica_holder.h"
#include "ps/shard_range.h"
#include "ps/shard_metrics.h"
#include "ps/base/wire.h"

namespace pacer {

struct ShardOptions {
  // Largest accepted message, all frames (--max-message-bytes).
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Compute and verify the envelope's CRC-32 (--no-crc turns it off, for
  // benchmarks; then every peer must turn it off too).
  bool check_crc = true;
  // Fault handlings, all on; switched off only to show a chaos invariant
  // failing (--unsafe-disable): crc-check (what arrives is not verified,
  // so corrupted gradients are applied; replies still carry checks), dedup
  // (a duplicate or retried push is applied again), durable-wait (with
  // backups, a push is called durable as soon as it is applied, so a
  // primary's death loses pushes the workers were told are durable), and
  // the server's own two, checkpoints and fencing (read by ShardServer from
  // ShardServerOptions::shard.safeguards).
  Safeguards safeguards;
  // Apply pushes to the parameters. false only for transport benchmarks:
  // pushes are accepted, verified and acknowledged, and nothing changes.
  bool apply_updates = true;
  // A pull parked on the barrier longer than this gets DeadlineExceeded.
  Duration pull_timeout = std::chrono::seconds(60);
  // A clock open this long logs which live workers it still waits for
  // (then again every such interval).
  Duration stall_report = std::chrono::seconds(5);
  // Where metrics go; a private registry when null.
  std::shared_ptr<prometheus::Registry> registry;
  // Labels on every pacer_shard_* series of this core (ShardMetrics): a
  // core serving a range since a promotion has range="<id>".
  prometheus::Labels metric_labels;
  // Transport security: the monitor's CURVE public key. Under CURVE (a
  // message whose peer key is set) a sender's id must match its key: the
  // monitor's (id 0) this one, a worker's the key of its membership entry.
  std::string monitor_key;
};

// The job-wide settings a shard needs, from the monitor's register reply.
struct ShardJob {
  uint64_t job_id = 0;
  wire::Mode mode = wire::Mode::Bsp;
  // The optimizer and the job's default group (the monitor's --optimizer
  // and its settings); the model's declaration adds its parameter groups.
  TableConfig optimizer;
  // B: in asp each push is one step on its gradient weighted by b_i / B, so
  // a round of pushes moves the model as far as one synchronous step.
  uint32_t global_batch = 192;
  // k of mode Backup: a clock closes once all but k live workers pushed it.
  uint32_t backup_workers = 0;
  // Staleness-aware learning rate (Zhang et al., IJCAI 2016): a gradient
  // computed on parameters tau steps behind the step it joins is weighted
  // 1 / (1 + tau).
  bool staleness_aware_lr = true;
};

// The parts of one worker's push in several parts (Push.parts > 1) a shard
// has received so far, held until the last one; not in snapshots (the
// worker sends them all again when a restarted shard never completes its
// push). Their values go straight to their keys' offsets in a table-sized
// buffer (the member's staging buffer), so the completed push is read from
// there with no per-key copies. At namespace scope: std::optional of a
// nested class with default member initializers does not compile with clang.
struct StagedPush {
  uint64_t seq = 0;
  uint32_t parts = 0;
  uint32_t received = 0;
  uint64_t clock = 0;
  uint32_t batch = 0;
  std::optional<int64_t> read_applied;
  std::optional<uint64_t> read_steps;
  std::vector<wire::GroupLr> lrs;
  std::vector<bool> got;                          // per part
  std::vector<std::vector<uint64_t>> part_keys;   // per part: the keys it carried
  std::map<uint64_t, uint64_t> keys;              // key -> length, of the parts held
};

// What a shard's range answers, as ShardCore::serving() says.
enum class ServingState : uint8_t {
  // Not registered yet (Configure): every message is answered NotReady.
  kUnconfigured,
  // Restored from a checkpoint, until the monitor's first word on the range
  // has been taken (ShardServer): pushes, pulls and inits are answered
  // NotReady, with or without backups (a backup may be serving the range
  // already, promoted because this process restarted).
  kAwaitingMonitor,
  kServing,
  // Its last record went to its backups (Leave): pushes are answered
  // NotReady, no step is applied, pulls are still answered, so that the
  // primary and its backups leave with the same state.
  kLeaving,
  // The monitor gave the range to another shard (a failover while this one
  // was cut off from it): pushes, pulls and inits are answered NotOwner, so
  // that a worker whose map is older than the failover moves on; no step
  // is applied. The range's state stays for the ledger.
  kDeposed,
};

// Single-threaded: one thread calls every method. ShardCore sequences its
// rooms: it checks each message and the serving state's gates (shard.cc),
// then hands it to the push intake (shard_intake.cc), the clock barrier
// (shard_barrier.cc), range transfer (shard_transfer.cc), or replication:
// the primary's side (RangeReplicator, ps/range_replicator.h) and the
// backup's (ReplicaHolder, ps/replica_holder.h). The range's data they
// share is a ShardRange (ps/shard_range.h).
class ShardCore {
 public:
  using Outgoing = ShardOutgoing;
  using BackedRange = ReplicaHolder::BackedRange;
  using ReplicaView = ReplicaHolder::View;

  ShardCore(const ShardOptions& options, const Clock* clock);

  // Sets the job (from registration). Messages before this are NotReady.
  void Configure(const ShardJob& job, uint32_t shard_id);

  // Handles one message from the ROUTER socket: frames[0] is the peer's
  // routing id. Every check runs before anything in it is used; a bad
  // message gets an Error reply and a counter, and the shard keeps serving.
  void Handle(Frames frames, std::vector<Outgoing>* out);

  // Answers parked pulls whose deadline passed.
  void Tick(std::vector<Outgoing>* out);
  // Earliest parked-pull deadline, or TimePoint::max().
  TimePoint NextDeadline() const;

  // Observers, for the server loop and tests. incomplete_steps(): BSP steps
  // that included pushes from workers no longer live when the clock closed
  // (a step never closes without a push from every live worker).
  int64_t applied_clock() const { return range_.applied_clock; }
  uint64_t steps() const { return range_.steps; }
  uint64_t incomplete_steps() const { return incomplete_steps_; }
  // Backup mode: pushes that came after their clock closed, dropped.
  uint64_t dropped_pushes() const { return dropped_pushes_; }
  // Pushes whose gradient was stale (tau > 0), and the sum of their tau.
  uint64_t stale_pushes() const { return stale_pushes_; }
  // The lowest clock every live worker has pushed (-1: none; applied clock
  // when nobody is live).
  int64_t slowest_pushed() const;
  // DSSP: the extra iterations r* granted on the last read of `worker` that
  // went past its lower bound (0 when none).
  uint32_t last_grant(uint32_t worker) const;
  // Worker pushes folded into the parameters (each (worker, clock) once).
  uint64_t updates_applied() const { return updates_applied_; }
  bool initialized() const { return range_.initialized; }
  bool configured() const { return serving_ != ServingState::kUnconfigured; }
  // Whether this shard holds a key range (values or not).
  bool has_keys() const { return !range_.table->empty(); }
  bool stop_requested() const { return stop_requested_; }
  uint64_t membership_version() const { return membership_version_; }
  size_t parked_pulls() const { return parked_.size(); }
  double rejected(wire::ErrorCode code) const { return server_.rejected(code); }
  prometheus::Registry& registry() { return *registry_; }
  // Parameters of one owned key (tests).
  std::span<const float> Param(uint64_t key) const { return range_.table->Param(key); }
  // The parameter table (tests, benchmarks).
  const ParamTable& table() const { return *range_.table; }
  // The job as this core runs it: the registration's, with the optimizer
  // the monitor's declaration gave (the job's first worker's).
  const ShardJob& job() const { return job_; }

  // The learning rates set by hand (pacerctl set-lr, from the monitor's
  // heartbeat replies), by group index: each wins over what pushes carry
  // until a later version leaves it out. Older versions are ignored.
  void SetLrOverrides(uint64_t version, const std::vector<wire::GroupLr>& overrides);

  // Replication (the monitor's --replicas; issue 23): the primary's side
  // is the RangeReplicator room (ps/range_replicator.h), the backup's the
  // ReplicaHolder room (ps/replica_holder.h); these calls reach them.
  //
  // As a range's primary: its epoch and backups (shard ids), from the
  // monitor. Push and pull replies say how far a worker's pushes are
  // durable (durable_seq): through which of its push seqs.
  void SetReplicaSet(uint64_t epoch, std::vector<uint32_t> backups, std::vector<Outgoing>* out) {
    primary_.SetReplicaSet(epoch, std::move(backups), out);
  }
  // As a backup: the ranges it holds replicas of, by their primary's id.
  void SetBacking(std::map<uint32_t, BackedRange> ranges) { replicas_.SetBacking(std::move(ranges)); }
  uint64_t durable_seq(uint32_t worker) const { return primary_.durable_seq(worker); }
  uint64_t replication_epoch() const { return primary_.epoch(); }
  // Records made so far, and how far backup `id` acknowledged them.
  uint64_t replication_record() const { return primary_.record(); }
  uint64_t backup_acked(uint32_t id) const { return primary_.backup_acked(id); }
  // The last record every backup acknowledged (all made, with none).
  uint64_t durable_record() const { return primary_.durable_record(); }
  // Records made and not yet acknowledged by every backup (0 without any).
  uint64_t replication_lag_records() const {
    return primary_.replicated() ? primary_.record() - primary_.durable_record() : 0;
  }
  // The replicas held: range (its primary's id) -> the record held through.
  std::map<uint32_t, uint64_t> replica_records() const { return replicas_.records(); }
  // A replica this shard holds of range `range` (its primary's id): null
  // when none; the record it holds through.
  const ParamTable* replica_table(uint32_t range) const { return replicas_.table(range); }
  uint64_t replica_record(uint32_t range) const { return replicas_.record(range); }
  // Each worker's last applied push seq the replica holds (dedup after a
  // promotion).
  std::map<uint32_t, uint64_t> replica_marks(uint32_t range) const { return replicas_.marks(range); }
  // The replicas held, by range, with their epochs (reported to the
  // monitor, which promotes only a replica of the range's current epoch).
  std::map<uint32_t, uint64_t> replica_epochs() const { return replicas_.epochs(); }
  // Replica `range` as a snapshot a new core of that range restores from
  // (a promotion); nullopt when none is held.
  std::optional<ShardSnapshot> ReplicaSnapshot(uint32_t range) const {
    return replicas_.Snapshot(range, job_.job_id, map_version_);
  }
  // The range's serving state (ServingState), and its moves: a restored
  // core awaits the monitor's word (true) until it comes (false: serving).
  ServingState serving() const { return serving_; }
  void SetAwaitingMonitor(bool awaiting);
  // The monitor gave this shard's range to another shard at `epoch`
  // (kDeposed); 0: given back (the shard it went to was lost before it
  // served it), serving again.
  void Depose(uint64_t epoch);
  uint64_t deposed_epoch() const { return deposed_epoch_; }
  // Fencing (the shard lease): while set, a shard with backups answers
  // pushes, pulls and inits NotReady, whatever its serving state. Not a
  // state of the range but of the process's contact with the monitor: the
  // server sets and clears it on every loop, over any serving state.
  void SetFenced(bool fenced) { fenced_ = fenced; }
  bool replicated() const { return primary_.replicated(); }
  // The shard is leaving (its job stopped, or SIGTERM). With backups: the
  // steps not yet in a record go out in one marked last, which tells each
  // backup that nothing follows, and from then on the core applies no step
  // (pushes are answered NotReady; pulls are still answered), so that the
  // primary and its backups leave with the same state. A second call
  // does nothing. Also the first step of a planned hand-over (pacerctl
  // drain-shard): the range's backups then hold all it ever applied.
  void Leave(std::vector<Outgoing>* out);
  // While set, durability goes no further than it is (durable_seq and
  // durable_ stay; records still go out and are acknowledged): the monitor
  // keeps a backup dropped from the set as a standby it may promote, which
  // lacks what the new set takes from here. Cleared, it catches up at once.
  // With no backup in the set every applied push stays durable at once.
  void SetDurableHold(bool hold) { primary_.SetDurableHold(hold); }
  bool durable_hold() const { return primary_.durable_hold(); }
  // Undoes Leave (the monitor gave a drain up before the backups held the
  // last record): the core serves and applies steps again, and the records
  // go on after the last one (a backup takes a record after a last one as
  // usual). Nothing when not leaving.
  void CancelLeave(std::vector<Outgoing>* out);
  // Every replica held got its primary's last record.
  bool replicas_final() const { return replicas_.final(); }
  // Leave took effect (it had backups to send a last record to).
  bool leaving() const { return serving_ == ServingState::kLeaving; }

  // The ledger: every (worker, seq) this range applied, kept by the
  // primary and by each replica (records carry them; seeds carry the
  // whole ledger), and the range's state as one CRC-32 (parameters, then
  // each state slot) to compare a replica with its primary.
  const AppliedLedger& ledger() const { return primary_.ledger(); }
  uint32_t state_crc() const;
  // The replicas held, by range.
  std::map<uint32_t, ReplicaView> replica_views() const { return replicas_.views(); }
  uint64_t replica_checks() const { return replicas_.checks(); }
  uint64_t replica_mismatches() const { return replicas_.mismatches(); }
  // Records made in asp, ssp and dssp hold this many steps at most (or
  // up to the first that brings them past this many values), and wait
  // this long at most for more. A batch past a few steps of the range
  // costs no more to send (its record carries the state), so a record
  // waits a few steps' time: pushes become durable up to this much later
  // (no worker waits for that in these modes), and records and their
  // acknowledgements go several times less often.
  static constexpr size_t kReplicaBatchSteps = RangeReplicator::kReplicaBatchSteps;
  static constexpr size_t kReplicaBatchValues = RangeReplicator::kReplicaBatchValues;
  static constexpr Duration kReplicaBatchDelay = RangeReplicator::kReplicaBatchDelay;
  // Every this many records carries a check of a block range.
  static constexpr uint64_t kReplicaCheckEvery = RangeReplicator::kReplicaCheckEvery;
  // A backup that owes an acknowledgement (of a record or a seed) for
  // longer than this falls behind: the primary reports it to the monitor
  // (lagging_backups(), in its heartbeats), which drops it from the range's
  // set and gives the range another; durability waits for it until the
  // monitor's new set arrives, never longer.
  static constexpr Duration kBackupLagLimit = RangeReplicator::kBackupLagLimit;
  // The backups that fall behind (kBackupLagLimit), and how long the
  // longest has owed an acknowledgement (0: none owes one).
  std::vector<uint32_t> lagging_backups() const { return primary_.lagging_backups(); }
  double replication_lag_seconds() const { return primary_.lag_seconds(); }

  // Checkpoints (issue 4). Snapshot: what a restart must not lose, taken
  // between two messages, so no step is half applied: the parameter table
  // (parameters, optimizer state, each key's steps), the applied clock and step count, each live worker's pushed clock and
  // last applied push seq, and the membership version. Pushes to clocks
  // still open are not in it. It copies no parameters: it shares the
  // current buffers, and the next step writes into new ones.
  ShardSnapshot Snapshot() const;
  // Loads a snapshot into a shard that is configured and holds no model yet
  // (FailedPrecondition otherwise); InvalidArgument when it belongs to
  // another job or shard, or does not add up. The monitor's declaration of
  // the same keys is then accepted as is, and Init is ignored.
  //
  // Recovery: each worker's first push after a restore tells how many of
  // its acknowledged pushes the snapshot lacks (the gap in its push seq);
  // those are the lost updates (lost_updates(), logged, and counted in
  // pacer_shard_lost_updates_total). A worker that pushes or pulls a clock
  // past the restored one moves its pushed clock there, and clocks that
  // every live worker has passed close without their lost pushes, so the
  // shard catches up with the others instead of waiting for pushes that
  // will never come again.
  absl::Status Restore(const ShardSnapshot& snapshot);
  bool restored() const { return restored_; }
  uint64_t lost_updates() const { return lost_updates_; }
  uint64_t key_version() const { return key_version_; }
  // Clocks closed after a restore with none of their pushes (all lost).
  uint64_t skipped_clocks() const { return skipped_clocks_; }

 private:
  struct OpenClock {
    std::vector<float> acc;        // sum of w_i * b_i * g_i over the pushes so far
    std::set<uint32_t> pushed;     // workers whose push for this clock arrived
    std::map<uint32_t, uint64_t> seqs;  // their push seqs (0: none given)
    uint64_t batch_sum = 0;        // sum of b_i over those pushes
    double weight_sum = 0;         // sum of w_i * b_i (w_i: the staleness weight)
    TimePoint opened{};            // first push, for stall reports
    TimePoint reported{};          // last stall report
    // The lrs of the push with the highest seq that carried any (the step's).
    std::vector<wire::GroupLr> lrs;
    uint64_t lrs_seq = 0;
    bool has_lrs = false;
  };
  struct ParkedPull {
    Frame peer;
    Envelope env;
    uint64_t clock;
    std::vector<wire::KeyLen> keys;
    TimePoint parked_at;
    TimePoint deadline;
  };
  // A live worker, with its bounds from the monitor and its progress here.
  struct Member {
    uint32_t batch = 0;
    uint32_t staleness = 0;        // s (ssp) or s_L (dssp)
    uint32_t staleness_range = 0;  // r_max (dssp)
    std::string public_key;        // CURVE key its messages must come with
    int64_t pushed = -1;           // highest clock pushed (async modes)
    std::deque<double> push_times; // seconds, the last few pushes (dssp)
    uint32_t last_grant = 0;
    uint64_t seq = 0;              // highest push seq handled
    // After a restore: the first push with a seq counts the lost ones.
    bool check_gap = false;
    // The parts of a push in several parts held so far (StagedPush), and
    // the table-sized buffer their values go to (kept between pushes).
    std::optional<StagedPush> staged;
    std::vector<float> staging;
  };
  // One push as the barrier sees it, whether it came in one message or in
  // parts: keys in ascending order, values laid out in that order.
  struct PushArgs {
    uint64_t clock = 0;
    uint32_t batch = 0;
    uint64_t seq = 0;
    std::optional<int64_t> read_applied;
    std::optional<uint64_t> read_steps;
    GradientView grad;
    std::span<const wire::GroupLr> lrs;
  };

  // shard.cc: the sequencing. Every check of a message, the serving
  // state's gates, then the room it belongs to.
  //
  // Under CURVE: whether the sender's id belongs to the key it came with
  // (else it is answered Refused and counted).
  bool SenderMatchesKey(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // Whether a push or pull names an older epoch of this shard's range than
  // the shard's (its sender's shard map is out of date): answered NotOwner
  // and counted (pacer_shard_stale_epoch_requests_total).
  bool StaleEpoch(const Frame& peer, const Envelope& env, uint64_t epoch,
                  std::vector<Outgoing>* out);
  void ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                  const std::string& reason, std::vector<Outgoing>* out);
  // Checks that every key is owned (else NotOwner), has the declared length
  // and comes in ascending order without repeats (else BadLength).
  bool CheckKeys(std::span<const wire::KeyLen> keys, std::string* why,
                 wire::ErrorCode* code) const;
  void OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnInit(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnMembership(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);

  // shard_intake.cc: the push intake.
  void OnPush(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // Whether a push was handled before and must not be applied again: dedup,
  // decided here only. A push with a seq: one at or below the worker's last
  // handled seq. Without one: asp, a clock at or below its last pushed one;
  // the synchronous modes, a clock still open that it pushed already.
  bool Duplicate(uint32_t worker, const Member& member, uint64_t seq, uint64_t clock) const;
  // A part of a push in several parts: held, or the push completed by it
  // handed on.
  void OnPushPart(const Frame& peer, const Decoded& d, const msg::Push& m, Member& member,
                  std::vector<Outgoing>* out);
  void OnAsyncPush(const Frame& peer, const Envelope& env, const PushArgs& push, Member& member,
                   std::vector<Outgoing>* out);
  // False when the push was answered NotReady or Refused for a clock too
  // far ahead (not taken: the worker sends it again).
  bool OnSyncPush(const Frame& peer, const Envelope& env, const PushArgs& push, Member& member,
                  std::vector<Outgoing>* out);
  // tau of a push, and the weight the staleness-aware learning rate gives it.
  float StalenessWeight(const PushArgs& push);
  void RecordPush(Member& member, uint64_t clock);
  // One push folded in: updates_applied_ and its two metrics.
  void CountApplied();
  // Each group's lr for a step, before its scale: a pacerctl set-lr
  // override, else the lr the step's push carried, else the group's
  // declared lr, else the job's default (the last two: the table's
  // settings).
  std::vector<float> StepLrs(std::span<const wire::GroupLr> carried, float scale) const;
  // Sets `step`'s lrs (StepLrs) with the step's weight `scale` (staleness,
  // b_i / B, the clock's mean weight) applied: to the gradient for SGD, to
  // the lr for the optimizers that normalise the gradient; `fraction`, the
  // step's samples over the global batch, becomes StepRecord::fraction.
  void ScaleStep(std::span<const wire::GroupLr> carried, float scale, float fraction,
                 StepRecord* step) const;

  // shard_barrier.cc: the clock barrier and the pulls.
  //
  // Closes every clock that all live workers have pushed, then answers the
  // pulls that became ready.
  void Advance(std::vector<Outgoing>* out);
  // Whether `worker` may read clock `clock` now (the mode's rule).
  bool PullReady(uint32_t worker, uint64_t clock);
  // Moves a live worker's pushed clock up to `clock` (after a restore, the
  // clocks it pushed before are lost, not missing).
  void NotePassed(Member& member, int64_t clock);
  void OnPull(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void AnswerPull(const Frame& peer, const Envelope& to, uint64_t clock,
                  std::span<const wire::KeyLen> keys, double waited, std::vector<Outgoing>* out);
  // A pull with_state: the keys' parameters, then each state slot's values,
  // with the keys' step counts (copied: a tool's read, not the hot path).
  void AnswerStatePull(const Frame& peer, const Envelope& to, std::span<const wire::KeyLen> keys,
                       std::vector<Outgoing>* out);
  // A payload buffer from a pool: reused once ZeroMQ has let go of it.
  std::shared_ptr<std::vector<float>> ReplyBuffer(size_t floats);

  // shard_transfer.cc: range transfer (elastic shards): hand keys over
  // (reply MoveData), take them in, drop them.
  void OnMoveOut(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnMoveIn(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void DropKeys(const Frame& peer, const Decoded& d, uint64_t begin, uint64_t end,
                std::vector<Outgoing>* out);
  // After keys moved in or out: staged parts, spare accumulators and the
  // backups' replicas no longer fit the table's layout.
  void LayoutChanged();

  // Constant after construction.
  const ShardOptions options_;
  const Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  ServerCore server_;  // replies, errors, the sender check
  ShardMetrics metrics_;

  ShardJob job_;
  uint32_t shard_id_ = 0;  // set by Configure
  ServingState serving_ = ServingState::kUnconfigured;
  uint64_t deposed_epoch_ = 0;  // the epoch it was deposed at (kDeposed)
  bool fenced_ = false;         // SetFenced
  bool stop_requested_ = false;

  // The range's data, shared by the rooms: the parameter table, how far it
  // has stepped, the accumulators (ps/shard_range.h).
  ShardRange range_;

  // pacerctl set-lr, by group index, and the version it came with.
  std::map<uint32_t, float> lr_overrides_;
  uint64_t lr_overrides_version_ = 0;
  // A synchronous step whose pushes carried different lrs is logged once.
  bool lr_disagreement_logged_ = false;

  // The shard-map version of the monitor's last declaration.
  uint64_t map_version_ = 0;
  // Membership: the live workers.
  uint64_t membership_version_ = 0;
  std::map<uint32_t, Member> live_;

  // The barrier.
  std::map<uint64_t, OpenClock> open_;
  std::deque<ParkedPull> parked_;
  TimePoint async_reported_{};  // last stall report in the asynchronous modes
  std::vector<std::shared_ptr<std::vector<float>>> reply_pool_;

  uint64_t incomplete_steps_ = 0;
  uint64_t updates_applied_ = 0;
  uint64_t dropped_pushes_ = 0;
  uint64_t stale_pushes_ = 0;

  // The last key move (its request id and reply), repeated if asked again.
  uint64_t last_move_request_ = 0;
  std::string last_move_header_;
  bool move_ok_ = false;  // the move request just handled succeeded
  Frames last_move_reply_;
  // Bumped whenever keys move in or out (a checkpoint is due at once).
  uint64_t key_version_ = 0;

  // Recovery (Restore).
  bool restored_ = false;
  std::map<uint32_t, WorkerMark> restored_marks_;
  uint64_t lost_updates_ = 0;
  uint64_t skipped_clocks_ = 0;

  TimePoint handle_start_{};  // when Handle began with the current message (latency metrics)

  // The rooms of replication: the primary's side (records to the range's
  // backups, durability, the ledger) and the backup's (replicas of other
  // shards' ranges).
  RangeReplicator primary_;
  ReplicaHolder replicas_;
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_H_
