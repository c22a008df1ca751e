// The monitor: the control plane of one job. It owns the job's settings,
// registers shards and workers, builds the shard map, tracks worker leases,
// tells the shards who is alive, and decides when the run ends.
//
// MonitorCore is the logic, with no sockets and an injected clock.
// MonitorServer runs it on a transport.
#ifndef PACER_MONITOR_MONITOR_H_
#define PACER_MONITOR_MONITOR_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "monitor/data_stream.h"
#include "monitor/fault_table.h"
#include "monitor/journal.h"
#include "monitor/key_move.h"
#include "monitor/model_registry.h"
#include "monitor/monitor_metrics.h"
#include "monitor/policy.h"
#include "prometheus/registry.h"
#include "ps/checkpoint.h"
#include "ps/base/clock.h"
#include "ps/base/fault.h"
#include "ps/base/metrics.h"
#include "ps/base/rpc.h"
#include "ps/base/messages.h"
#include "ps/base/server_core.h"
#include "ps/base/transport.h"
#include "ps/base/wire.h"

namespace pacer {

struct MonitorOptions {
  // Address to bind (--listen); port 0 picks an ephemeral port.
  std::string listen = "tcp://127.0.0.1:0";
  // The job's id; every message carries it (--job-id). 0 is not allowed.
  uint64_t job_id = 1;
  // Consistency mode (--mode), enforced by the shards.
  wire::Mode mode = wire::Mode::Bsp;
  // k of mode backup (--backup-workers).
  uint32_t backup_workers = 1;
  // Weight a gradient that missed tau steps by 1 / (1 + tau) (--staleness-aware-lr).
  bool staleness_aware_lr = true;
  // The straggler policy (--policy and its flags). Its mode, global batch
  // and kind are taken from this struct's other fields at start.
  policy::PolicyOptions policy;
  // The shards' optimizer (--optimizer) and the job's default parameter
  // group (--lr, --momentum, --weight-decay, ...: torch.optim's settings,
  // each defaulting as DefaultSettings(optimizer) says). The model's
  // declaration may add groups with their own settings.
  OptimizerKind optimizer = OptimizerKind::kSgd;
  OptimizerSettings optimizer_settings = DefaultSettings(OptimizerKind::kSgd);
  // Global batch B (--global-batch): split evenly over the workers present
  // when the run starts; a later worker gets the same share.
  uint32_t global_batch = 192;
  // As workers join or leave, scale B with their number, so each keeps its
  // share (--rescale-batch); false: B is kept and re-split.
  bool rescale_batch = false;
  // Epochs (--epochs); 0: no cap. With data_stream: passes over the whole
  // training set by the job; without: each worker's over its partition.
  uint32_t epochs = 0;
  // Read the training set as one data stream (the default;
  // monitor/data_stream.h): one shuffled order per epoch handed to the
  // workers in chunks that follow their speed, every sample once per
  // epoch, and the epoch's tail taken over by quicker workers. Off: data
  // partitions (--data-partitions N), the special case.
  bool data_stream = true;
  // With data_stream: a fixed chunk size (--chunk-samples); 0: two seconds
  // of the worker's measured speed.
  uint32_t chunk_samples = 0;
  // Stop after this many seconds of training (--time-cap); 0: no cap.
  double time_cap_seconds = 0;
  // Stop once the reported test accuracy reaches this (--target-accuracy); 0: never.
  float target_accuracy = 0;
  // Seed for parameter initialisation and data shuffling (--seed).
  uint64_t seed = 1;
  // The run starts once this many shards and workers have registered.
  uint32_t min_shards = 1;
  uint32_t min_workers = 1;
  // A worker silent for longer than this is declared dead (--lease).
  Duration lease = std::chrono::seconds(3);
  // false only to show a chaos invariant failing (--unsafe-disable
  // lease-expiry): a silent worker is never declared dead, so the others
  // wait for it forever.
  bool lease_expiry = true;
  // Without data_stream, data partitions (--data-partitions N): the
  // training set is cut into this many, each read in its own shuffled order
  // per epoch and owned by one live worker at a time; 0: one per worker
  // present at the start (pacer-monitor's flag takes N >= 1; the
  // one-per-worker layout is for code that builds MonitorOptions).
  uint32_t data_partitions = 0;
  // How often workers and shards should heartbeat (--heartbeat-ms).
  uint32_t heartbeat_interval_ms = 100;
  // How often rank 0 evaluates the test set (--eval-interval).
  double eval_interval_seconds = 1.0;
  // Also evaluate every this many clocks (--eval-every-clocks); 0: only by
  // time. Steps to an accuracy compare fairly between runs whose steps take
  // different times only on a schedule in clocks.
  uint32_t eval_interval_clocks = 0;
  // Backups per key range (--replicas K): each range's primary and up to K
  // other shards, on other hosts (a shard's --node, else its address's
  // host) where there are any. With too few live shards a range has fewer
  // and pacer_monitor_ranges_under_replicated counts it; a shard that
  // registers later (idle, as pacerctl add-shard would use) fills the gap.
  // The sets are saved and handed out with the shard map. Replicating the
  // ranges' data to them is not built yet (issue 23).
  uint32_t replicas = 0;
  // With replicas: a shard silent this long is down and its range fails
  // over to a backup (--shard-lease); a primary cut off from the monitor
  // this long stops answering first. Without: shards go down after --lease.
  Duration shard_lease = std::chrono::seconds(1);
  // Unacknowledged updates to a shard are re-sent after this long.
  Duration shard_resend = std::chrono::milliseconds(300);
  // After the job stops, keep answering for this long so every process hears.
  Duration stop_grace = std::chrono::seconds(2);
  size_t max_message_bytes = kDefaultMaxMessageBytes;
  // Under transport security, the keys pacerctl's commands that change the
  // job (RemoveWorker, ShardControl, FaultControl) are taken from (allowed
  // keys named "operator..."); a message under another key is refused.
  // Plain ZeroMQ (no key on a message) checks nothing.
  std::vector<std::string> operator_keys;
  // Where metrics go; a private registry when null.
  std::shared_ptr<prometheus::Registry> registry;
  // The monitor's state on disk (--data-dir; empty: none): membership, the
  // shard map and the policy's assignments, in RocksDB in DIR/state. A
  // monitor started again on it carries on with the same job (its id
  // replaces job_id).
  std::string data_dir;
  // How often the state is written while the job runs (also at once after
  // a registration, a membership change or a stop).
  Duration save_interval = std::chrono::milliseconds(500);
  // The monitor's own fault layer (ps/base/fault.h; null: none), and the rules
  // its --faults set, kept under the run-time ones.
  std::shared_ptr<FaultInjector> faults;
  std::vector<FaultRule> base_faults;
};

// What the monitor knows of one worker.
struct WorkerState {
  uint32_t id = 0;
  uint32_t rank = 0;
  uint32_t batch = 0;
  uint32_t staleness = 0;        // s or s_L
  uint32_t staleness_range = 0;  // r_max
  uint64_t start_clock = 0;      // the clock it started at
  uint64_t clock = 0;
  uint64_t joined_version = 0;  // membership version that first included it
  TimePoint last_seen{};
  bool alive = true;
  bool done = false;
  float samples_per_second = 0;  // as it last reported
  bool paused = false;           // held at the pause clock, as it last reported
  std::string public_key;        // CURVE key it registered with (empty: plain)
};

// One data partition: who reads it, and where its reading stands.
struct PartitionState {
  uint32_t owner = 0;  // worker id; 0: nobody
  uint32_t epoch = 0;
  uint64_t offset = 0;
  // Moving from this live worker to `owner`: the new owner gets it once
  // the old one has reported its final position and let go (0: not moving).
  uint32_t releasing = 0;
};

// Single-threaded: one thread calls every method.
class MonitorCore {
 public:
  // A message for the ROUTER socket (peer set) or for shard `shard_index`.
  struct Outgoing {
    Frame peer;
    int shard_index = -1;
    Frames frames;
  };

  MonitorCore(const MonitorOptions& options, const Clock* clock);
  // Its managers point at its journal: never copied or moved.
  MonitorCore(const MonitorCore&) = delete;
  MonitorCore& operator=(const MonitorCore&) = delete;

  // One message from the ROUTER socket; frames[0] is the peer's routing id.
  void Handle(Frames frames, std::vector<Outgoing>* out);
  // A reply from shard `index` on the monitor's connection to it.
  void HandleShardReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out);
  // Leases, start and stop decisions, re-sends to shards.
  void Tick(std::vector<Outgoing>* out);

  wire::JobState state() const { return state_; }
  const std::string& stop_reason() const { return stop_reason_; }
  // One line on what the straggler policy did: its rounds by reason and
  // the last batch sizes.
  std::string PolicySummary() const;
  // True once the job stopped and the grace period has passed.
  bool finished() const;
  uint64_t membership_version() const { return membership_version_; }
  std::vector<uint32_t> LiveWorkers() const;
  // Every id the monitor has given, live or not (fault targets name these).
  std::vector<uint32_t> KnownWorkerIds() const;
  std::vector<uint32_t> KnownShardIds() const;
  const std::map<uint32_t, WorkerState>& workers() const { return workers_; }
  size_t num_shards() const { return shards_.size(); }
  uint32_t shard_id(size_t i) const { return shards_[i].id; }
  // Where shard i's range is served: its own address, or after a failover
  // the promoted backup's socket for it (with that shard's key).
  const std::string& shard_address(size_t i) const {
    return shards_[i].host != 0 && !shards_[i].served_at.empty() ? shards_[i].served_at
                                                                  : shards_[i].address;
  }
  // The shard's CURVE public key (empty without transport security).
  const std::string& shard_key(size_t i) const {
    if (shards_[i].host != 0) {
      if (const auto h = ShardIndex(shards_[i].host)) return shards_[*h].public_key;
    }
    return shards_[i].public_key;
  }
  // The index of shard `id` (nullopt: no such shard).
  std::optional<size_t> ShardIndex(uint32_t id) const {
    for (size_t i = 0; i < shards_.size(); ++i) {
      if (shards_[i].id == id) return i;
    }
    return std::nullopt;
  }
  // The shard serving shard i's range (its own id before any failover).
  uint32_t shard_host(size_t i) const { return shards_[i].host != 0 ? shards_[i].host : shards_[i].id; }
  uint64_t failovers() const { return failovers_; }
  // The backups (shard ids) and epoch of shard i's range (--replicas).
  const std::vector<uint32_t>& shard_backups(size_t i) const { return shards_[i].backups; }
  const std::vector<uint32_t>& shard_standby(size_t i) const { return shards_[i].standby; }
  uint64_t shard_epoch(size_t i) const { return shards_[i].epoch; }
  // Ranges with fewer than K backups (pacer_monitor_ranges_under_replicated).
  size_t ranges_under_replicated() const { return under_replicated_; }
  bool shard_down(size_t i) const { return shards_[i].down; }
  uint64_t map_version() const { return map_version_; }
  uint64_t pause_at() const { return pause_at_; }
  bool moving() const { return move_.has_value() || handoff_.has_value(); }
  const std::vector<PartitionState>& partitions() const { return partitions_; }
  // The data stream (the default), once the job has started; else null
  // (--data-partitions).
  const DataStream* data_stream() const { return stream_ ? &*stream_ : nullptr; }
  std::optional<double> last_accuracy() const { return last_accuracy_; }
  std::optional<double> time_to_target() const { return time_to_target_; }
  std::optional<double> seconds_running() const;
  const policy::StragglerPolicy& straggler_policy() const { return policy_; }
  // Changes a live worker's staleness bounds at run time (the shards hear
  // through the next membership). False for an unknown worker or bounds
  // above kMaxStalenessBound together.
  bool SetWorkerBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range);
  prometheus::Registry& registry() { return *registry_; }
  double rejected(wire::ErrorCode code) const { return server_.rejected(code); }

  // The accuracy whose first crossing is timed (quickstart: 0.85).
  void set_report_threshold(double t) { report_threshold_ = t; }

  // The state a restarted monitor needs (a MonitorState flatbuffer).
  std::string SaveState() const;
  // Loads a saved state before the first message: the same job id, ids,
  // ranks, shard map, membership (a new version, so the shards take it) and
  // assignments. Workers get a fresh lease; shards are sent their keys and
  // the live set again. DataLoss when it does not verify.
  absl::Status RestoreState(std::string_view bytes);
  // Whether something worth saving at once changed since the last call.
  bool TakeDirty() { return journal_.Take(); }

 private:
  struct ShardState {
    uint32_t id = 0;
    std::string address;
    uint64_t acked_membership = 0;
    bool acked_model = false;
    uint64_t membership_request = 0;
    uint64_t membership_request_version = 0;  // the version that request carried
    uint64_t model_request = 0;
    TimePoint last_sent{};
    TimePoint last_seen{};
    bool down = false;  // left on SIGTERM, or silent past the lease
    uint32_t restarts = 0;
    uint64_t incarnation = 0;  // of the process that registered last
    std::string public_key;    // CURVE, as it authenticated at registration
    int64_t applied_clock = -1;  // from its heartbeats
    float checkpoint_age = -1;   // seconds, from its heartbeats (-1: none)
    int64_t reported_applied = -1;  // the clock of its last heartbeat
    bool drained = false;        // its range moved away; stopped
    std::string node;            // --node as it registered ("": its address's host)
    // Its range's replica set beside it (--replicas): the backups' shard
    // ids, and the range's epoch (up whenever its primary or keys change).
    std::vector<uint32_t> backups;
    uint64_t epoch = 0;
    // After a failover: the shard that serves this range now (0: this
    // one), and the address it serves it at ("" until it reports it).
    uint32_t host = 0;
    std::string served_at;
    TimePoint failed_over_at{};
    // The last shard that served the range before the current promotion,
    // until the promoted shard reports serving it (0: none). If that shard
    // is lost before it does (no worker had its address for the range, so
    // it acknowledged nothing of it) and no backup reports holding the
    // range, the range goes back to this one: at once if it is live (its
    // state has everything it acknowledged), else when it returns (its
    // checkpoint is what is left).
    uint32_t promoted_from = 0;
    // From its heartbeats: the replicas it holds (range -> epoch).
    std::map<uint32_t, uint64_t> replicas;
    // pacerctl drain-shard handed its range to a backup: the process stops
    // (told so in its heartbeat replies) and never backs anything up; the
    // range lives on at `host`.
    bool retired = false;
    // Backups dropped from this range's set for falling behind, each until
    // when it is not given the range again.
    std::map<uint32_t, TimePoint> lag_dropped;
    // Those of them that still hold the range's replica, kept (told to
    // back the range, sent no records) until a backup in the set holds a
    // replica of the range's epoch: everything durable when one was
    // dropped is in its replica, so a primary lost meanwhile fails over to
    // it instead of back to a checkpoint.
    std::vector<uint32_t> standby;
    // Its range's replication lag as the primary last reported it (in its
    // heartbeat), and when: pacerctl status shows it while it is recent
    // and of the range's epoch.
    msg::RangeLag lag;
    TimePoint lag_at{};
  };

  void Reply(const Frame& peer, const Decoded& to, Frames frames, std::vector<Outgoing>* out);
  // Under CURVE: whether the sender's id belongs to the key its message
  // came with (a worker's or shard's id to the key it registered with);
  // else answers Refused and counts it.
  bool SenderMatchesKey(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // Whether a registration from `peer` may claim `what`, bound to `bound`
  // (empty: not bound); else answers Refused, logs and counts it.
  bool KeyMayClaim(const std::string& bound, const Frame& peer, const std::string& what,
                   const Decoded& d, std::vector<Outgoing>* out);
  void ReplyError(const Frame& peer, const Envelope& to, wire::ErrorCode code,
                  const std::string& reason, std::vector<Outgoing>* out);
  void OnRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // A shard restarted from its checkpoint, claiming its old id.
  void OnShardReturn(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void UpdateShardGauges();
  // Whether shard i's range holds keys (false: an idle shard, outside the
  // map, or one whose keys moved away).
  bool HoldsKeys(size_t i) const {
    return i < ranges_.size() && ranges_[i].first != ranges_[i].second;
  }
  // The shard map changed (a range's address, key, backups or keys): its
  // version goes up (the gauge with it), and the state is saved before the
  // new map goes out. The one place the version moves.
  void BumpMapVersion();
  // What replicas are placed apart by: the shard's --node, else its
  // address's host.
  std::string HostOf(size_t shard) const;
  // Gives every range up to K backups (options_.replicas): live shards other
  // than its primary, not on the primary's host nor on a host one of its
  // backups has while another is left, the fewest ranges held or backed
  // first. A backup stays while it is live. True when a set changed (then
  // the map's version goes up and the state is saved before it goes out).
  bool AssignReplicas();
  void UpdateReplicaGauges();
  // To shard i's heartbeat reply: its range's epoch and backups, and the
  // ranges it backs up (--replicas).
  void FillReplication(size_t i, msg::HeartbeatReply* reply) const;
  // Failover (--replicas): a range whose primary is down goes to a live
  // backup that reported a replica of its epoch, at a new epoch; true when
  // one did. The backup learns it from its heartbeat reply (promote) and
  // reports the address it serves the range at (TakeServing).
  bool FailOver();
  // Shard `at` registered again as a new process (from its checkpoints):
  // it holds no replica now, and each range it was the primary of goes to
  // a backup that holds it, as if the shard had died (it restarted within
  // its lease); a range with none is served from the checkpoint, unless it
  // was promoted to the shard and not served yet (then back to the last
  // that served it). Ranges promoted away from it to a shard lost before
  // serving them come back to it.
  void FailOverRestarted(size_t at);
  // Gives range i to a live backup that reported a replica of its current
  // epoch, at a new epoch (saved before anyone hears of it); `reason` is
  // logged, and counted as a drain, a restart (`restarted`) or a lease
  // expiry. False when no backup can.
  bool PromoteBackup(size_t i, const std::string& reason, bool restarted = false);
  // Range i was promoted to a shard that is lost (`why`) before it served
  // the range: it goes back to the last shard that served it
  // (promoted_from), at a new epoch; to one that is down too only with
  // `to_down`. False when there is none or the range was served.
  bool RevertUnservedPromotion(size_t i, const std::string& why, bool to_down);
  // A live backup of range i, not being drained, that reported a replica of
  // the range's current epoch (nullopt: none can take it over); with
  // `standby`, a standby (ShardState::standby) when no backup in the set
  // can (a failover may use one; a drain, whose backups must hold its last
  // record, may not).
  std::optional<uint32_t> InSyncBackup(size_t i, bool standby = false) const;
  // Drops range i's standbys that are gone or no longer needed.
  bool PruneStandby(size_t i);
  // pacerctl drain-shard with --replicas: hands the range over (handoff_)
  // when its primary has stopped and its backups hold all it applied.
  void StepHandoff(size_t i, bool handed_off);
  // A primary (shard index `from`) reports backups that fall behind: each
  // leaves its range's set (and is not given that range again for
  // kLagCooldown); the range gets another where a shard is free.
  void DropLagging(size_t from, const std::vector<msg::ShardInfo>& lagging);
  static constexpr Duration kLagCooldown = std::chrono::seconds(60);
  // A drain whose primary has not handed its range over by then is given up.
  static constexpr Duration kHandoffTimeout = std::chrono::seconds(60);
  // A range's lag in pacerctl status comes from its primary's heartbeat
  // (every 0.2 s by default) of at most this age; older: not known.
  static constexpr Duration kLagReportAge = std::chrono::seconds(3);
  void TakeServing(ShardState& host, const std::vector<msg::ShardInfo>& serving);
  // The lowest rank no live worker holds: a replacement takes the rank (and
  // so the data partition) of a worker that died.
  uint32_t LowestFreeRank() const;
  // The live worker with the lowest rank (0: none).
  uint32_t Evaluator() const;
  // Gives every partition a live owner, the fewest to each (a worker that
  // left loses its partitions to the others; a newcomer takes some over);
  // positions stay with the partition.
  void AssignPartitions();
  void OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnHeartbeat(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnShardHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                        std::vector<Outgoing>* out);
  void OnWorkerHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                         std::vector<Outgoing>* out);
  // A worker's read positions: only the partitions it reads move, and only
  // forward; one it handed over and no longer reports is released.
  void TakePositions(WorkerState& w, const std::vector<wire::PartitionPosition>& positions);
  // The data stream: a worker's chunk report, and what it holds now (chunks
  // handed out, the job's epoch) into its reply.
  void StreamHeartbeat(WorkerState& w, const msg::Heartbeat& hb, msg::HeartbeatReply* reply);
  // The data stream: workers no longer live give their chunks back.
  void ReleaseDeparted();
  // The stream's options: the declared training set and the job's flags.
  DataStreamOptions StreamOptions() const;
  void UpdateStreamGauges();
  // Logs each epoch that ended since the last call: when, its tail, and
  // each worker's share of its samples.
  void LogEpochsEnded();
  // A worker's timings since its last heartbeat, to the policy (and a
  // round at once after a confirmed shift).
  void ReportTimings(WorkerState& w, const msg::Heartbeat& hb);
  // What a live worker is told: the job's state for it, map, assignment,
  // partitions, pause, faults.
  msg::HeartbeatReply WorkerReply(const WorkerState& w) const;
  void OnAccuracy(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl.
  void OnStatus(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnRemoveWorker(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnShardControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl fault: sets, clears or lists the run-time fault table.
  void OnFaultControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl set-lr: sets or clears a group's lr override.
  void OnSetLr(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // Elastic shards: starts the move in progress once the cluster is quiet,
  // re-sends its pending step.
  void StepMove(std::vector<Outgoing>* out);
  // A reply to the move's pending step; the new shard map once it is done.
  void OnMoveReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out);
  void FinishMove(std::vector<Outgoing>* out);
  // A clock past every live worker's, to hold them at.
  uint64_t PauseClock() const;
  // `reason` is one of the labels of pacer_monitor_membership_changes_total.
  void ChangeMembership(const char* reason, const std::string& why);
  // The state gauge, the per-worker gauges (straggler score, clock lag,
  // speed, batch) of the live workers (a departed worker's series are
  // removed) and the per-shard ones.
  void UpdateWorkerGauges();
  // Gives the policy the current live set and copies its assignments into
  // workers_; bumps the membership when a bound changed.
  void UpdatePolicyWorkers();
  // --rescale-batch: sets the policy's B for `live` workers.
  void RescaleBatch(size_t live);
  // Copies the policy's assignments into workers_; true when a bound changed.
  bool ApplyAssignments();
  // Runs a policy round when one is due and applies what it decides.
  void RunPolicy(TimePoint now);
  // Brings pacer_monitor_policy_rounds_total up to the policy's own counts.
  void SyncPolicyCounters();
  void SendToShards(bool force, std::vector<Outgoing>* out);
  void StopJob(const std::string& reason, std::vector<Outgoing>* out);
  uint64_t MinAckedMembership() const;
  // The job's settings and the shard map, as replies carry them.
  msg::JobConfig Job() const;
  wire::Policy WirePolicy() const;
  msg::ShardMap Map() const;

  // Constant after construction.
  const MonitorOptions options_;
  const Clock* const clock_;
  std::shared_ptr<prometheus::Registry> registry_;
  ServerCore server_;  // replies, errors, the sender check
  MonitorMetrics metrics_;

  wire::JobState state_ = wire::JobState::Waiting;
  std::string stop_reason_;
  std::optional<TimePoint> started_at_;
  TimePoint stopped_at_{};
  TimePoint created_at_{};

  Journal journal_;  // marked by every change worth saving at once
  bool awaiting_workers_ = false;  // resumed with no live worker yet
  std::optional<KeyMove> move_;  // a shard move in progress (pacerctl add-shard / drain-shard)
  // pacerctl drain-shard with --replicas: the primary at `shard` is asked
  // (HeartbeatReply.hand_off) to stop applying pushes and make its backups
  // hold everything it applied; once it says so (Heartbeat.handed_off) a
  // backup is promoted at once, with no lease to wait for.
  struct Handoff {
    size_t shard = 0;
    TimePoint started{};
    TimePoint reported{};  // the last "still waiting" log
  };
  std::optional<Handoff> handoff_;
  // Shards whose drain was given up (kHandoffTimeout): their heartbeat
  // replies say so (hand_off_given_up) until they are drained again.
  std::set<uint32_t> handoff_given_up_;
  wire::ShardOp move_op_ = wire::ShardOp::Add;
  uint64_t pause_at_ = 0;         // workers hold before this clock (0: no pause)
  bool operator_pause_ = false;   // pacerctl pause
  uint32_t next_id_ = 1;  // 0 is the monitor itself
  uint32_t next_rank_ = 0;
  policy::StragglerPolicy policy_;
  uint32_t partition_count_ = 0;
  std::vector<PartitionState> partitions_;
  std::optional<DataStream> stream_;  // the data stream, from the job's start
  // Stream counters already added to the metrics.
  uint64_t counted_handed_out_ = 0, counted_taken_over_ = 0, counted_returned_ = 0;
  std::set<uint32_t> gauged_stream_ranks_;
  uint32_t logged_epoch_ = 0;  // epochs before it are logged as ended
  // The data stream with --epochs: once the last epoch is trained the workers
  // are held and the evaluator asked for a final evaluation (this number;
  // 0: not asked yet); the job stops when it comes, or after
  // kFinalEvaluationWait.
  uint64_t final_eval_ = 0;
  TimePoint final_eval_since_{};
  // An evaluation came from a runtime's own loop (not a program's report):
  // only such an evaluator answers evaluate_now.
  bool scheduled_evaluator_ = false;
  static constexpr Duration kFinalEvaluationWait = std::chrono::seconds(10);
  double batch_per_worker_ = 0;  // B / workers at the start (rescale_batch)
  std::map<uint32_t, WorkerState> workers_;
  std::map<std::string, uint32_t> worker_tokens_;  // registration token -> id
  std::vector<ShardState> shards_;
  uint64_t membership_version_ = 0;

  // The model the first worker declared, and pacerctl set-lr's overrides.
  ModelRegistry model_;
  bool map_built_ = false;
  uint64_t map_version_ = 0;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;  // per shard
  uint64_t epoch_ = 0;  // the last range epoch given
  uint64_t failovers_ = 0;
  size_t under_replicated_ = 0;  // ranges short of K, as last logged

  FaultTable faults_;  // run-time faults (pacerctl fault), sent with heartbeat replies

  std::optional<double> last_accuracy_;
  std::optional<double> time_to_target_;
  double report_threshold_ = 0.85;

  uint64_t rounds_counted_[static_cast<size_t>(policy::RoundReason::kCount)] = {};
  // Interval rounds that changed a size are logged at most every
  // kPolicyLogEvery (the rest at debug); these count the ones in between.
  TimePoint policy_logged_at_{};
  uint64_t policy_unlogged_ = 0;
  std::set<uint32_t> gauged_ranks_;  // ranks with per-worker series
  TimePoint next_gauges_{};
};

class MonitorServer {
 public:
  // Binds and starts serving on its own thread. `transport` must outlive it.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MonitorServer>> Start(Transport* transport,
                                                              const MonitorOptions& options);
  ~MonitorServer();
  const std::string& address() const { return address_; }
  void Shutdown() { shutdown_ = true; }
  void Wait();
  bool done() const { return done_; }
  prometheus::Registry& registry() { return *registry_; }
  uint64_t job_id() const { return options_.job_id; }
  // Whether it carried on from a saved state.
  bool resumed() const { return resumed_; }
  // Valid after done(): the final figures.
  std::optional<double> last_accuracy() const { return last_accuracy_; }
  std::optional<double> time_to_target() const { return time_to_target_; }
  std::string stop_reason() const { return stop_reason_; }
  std::string policy_summary() const { return policy_summary_; }
  void set_report_threshold(double t) { core_->set_report_threshold(t); }

 private:
  MonitorServer() = default;
  void Run();
  void SaveState();

  Transport* transport_ = nullptr;
  MonitorOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MonitorCore> core_;
  std::unique_ptr<Socket> router_;
  std::vector<std::unique_ptr<RpcChannel>> shard_channels_;
  std::vector<std::string> shard_channel_keys_;  // the CURVE key each channel was made with
  std::unique_ptr<RecordStore> store_;
  bool resumed_ = false;
  std::string address_;
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> done_{false};

  std::optional<double> last_accuracy_;
  std::optional<double> time_to_target_;
  std::string stop_reason_;
  std::string policy_summary_;
  std::thread thread_;
};

}  // namespace pacer

#endif  // PACER_MONITOR_MONITOR_H_
