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
#include "monitor/data_feed.h"
#include "monitor/data_stream.h"
#include "monitor/fault_table.h"
#include "monitor/job_lifecycle.h"
#include "monitor/journal.h"
#include "monitor/membership.h"
#include "monitor/model_registry.h"
#include "monitor/monitor_metrics.h"
#include "monitor/outgoing.h"
#include "monitor/policy.h"
#include "monitor/policy_driver.h"
#include "monitor/range_table.h"
#include "monitor/replication.h"
#include "monitor/shard_moves.h"
#include "monitor/shard_registry.h"
#include "prometheus/registry.h"
#include "ps/checkpoint.h"
#include "ps/base/clock.h"
#include "ps/base/fault.h"
#include "ps/base/metrics.h"
#include "ps/base/rpc.h"
#include "ps/base/safeguards.h"
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
  // Mode local: a round's end, by local steps (--round-steps) or by
  // seconds (--round-seconds); 0: not by that measure.
  uint32_t round_steps = 0;
  double round_seconds = 0;
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
  // Fault handlings, all on; lease-expiry is switched off only to show a
  // chaos invariant failing (--unsafe-disable lease-expiry): a silent worker
  // is never declared dead, so the others wait for it forever.
  Safeguards safeguards;
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

// Single-threaded: one thread calls every method. MonitorCore dispatches
// messages, keeps Tick's order and wires its managers (each in a file of its
// own, each saving and restoring its part of the state):
//   ShardRegistry  the shard processes          monitor/shard_registry.h
//   RangeTable     the shard map's key ranges   monitor/range_table.h
//   Replication    backups, failover, drains    monitor/replication.h
//   ShardMoves     add-shard, drain-shard       monitor/shard_moves.h
//   Membership     workers, leases, the hold    monitor/membership.h
//   DataFeed       the data stream, partitions  monitor/data_feed.h
//   PolicyDriver   the straggler policy         monitor/policy_driver.h
//   ModelRegistry  the declared model, set-lr   monitor/model_registry.h
//   JobLifecycle   start, stop, accuracy        monitor/job_lifecycle.h
//   FaultTable     pacerctl fault               monitor/fault_table.h
// Events reach them through listeners installed in one place
// (InstallListeners); pacerctl's commands are in operator_commands.cc.
class MonitorCore {
 public:
  // A message for the ROUTER socket (peer set) or for shard `shard_index`.
  using Outgoing = MonitorOutgoing;

  MonitorCore(const MonitorOptions& options, const Clock* clock);
  // Its managers point at each other: never copied or moved.
  MonitorCore(const MonitorCore&) = delete;
  MonitorCore& operator=(const MonitorCore&) = delete;

  // One message from the ROUTER socket; frames[0] is the peer's routing id.
  void Handle(Frames frames, std::vector<Outgoing>* out);
  // A reply from shard `index` on the monitor's connection to it.
  void HandleShardReply(size_t index, const Decoded& reply, std::vector<Outgoing>* out);
  // Leases, start and stop decisions, re-sends to shards.
  void Tick(std::vector<Outgoing>* out);

  wire::JobState state() const { return job_.state(); }
  const std::string& stop_reason() const { return job_.stop_reason(); }
  // Whether the job stopped as a failure (every worker was refused).
  bool stop_failed() const { return job_.failed(); }
  // One line on what the straggler policy did: its rounds by reason and
  // the last batch sizes.
  std::string PolicySummary() const { return policy_.Summary(); }
  // True once the job stopped and the grace period has passed.
  bool finished() const { return job_.finished(); }
  uint64_t membership_version() const { return membership_.version(); }
  std::vector<uint32_t> LiveWorkers() const { return membership_.LiveWorkers(); }
  // Every id the monitor has given, live or not (fault targets name these).
  std::vector<uint32_t> KnownWorkerIds() const { return membership_.KnownIds(); }
  std::vector<uint32_t> KnownShardIds() const { return shards_.Ids(); }
  const std::map<uint32_t, WorkerState>& workers() const { return membership_.workers(); }
  size_t num_shards() const { return shards_.size(); }
  uint32_t shard_id(size_t i) const { return shards_[i].id; }
  // Where shard i's range is served: its own address, or after a failover
  // the promoted backup's socket for it (with that shard's key).
  const std::string& shard_address(size_t i) const {
    return ranges_[i].host != 0 && !ranges_[i].served_at.empty() ? ranges_[i].served_at
                                                                  : shards_[i].address;
  }
  // The shard's CURVE public key (empty without transport security).
  const std::string& shard_key(size_t i) const {
    if (ranges_[i].host != 0) {
      if (const auto h = shards_.Index(ranges_[i].host)) return shards_[*h].public_key;
    }
    return shards_[i].public_key;
  }
  // The index of shard `id` (nullopt: no such shard).
  std::optional<size_t> ShardIndex(uint32_t id) const { return shards_.Index(id); }
  // The shard serving shard i's range (its own id before any failover).
  uint32_t shard_host(size_t i) const { return ranges_[i].primary(); }
  uint64_t failovers() const { return replication_.failovers(); }
  // The backups (shard ids) and epoch of shard i's range (--replicas).
  const std::vector<uint32_t>& shard_backups(size_t i) const { return ranges_[i].backups; }
  const std::vector<uint32_t>& shard_standby(size_t i) const { return ranges_[i].standby; }
  uint64_t shard_epoch(size_t i) const { return ranges_[i].epoch; }
  // Ranges with fewer than K backups (pacer_monitor_ranges_under_replicated).
  size_t ranges_under_replicated() const { return replication_.under_replicated(); }
  bool shard_down(size_t i) const { return shards_[i].down; }
  uint64_t map_version() const { return ranges_.version(); }
  uint64_t pause_at() const { return membership_.pause_at(); }
  bool moving() const { return moves_.moving(); }
  const std::vector<PartitionState>& partitions() const { return data_.partitions(); }
  // The data stream (the default), once the job has started; else null
  // (--data-partitions).
  const DataStream* data_stream() const { return data_.stream(); }
  std::optional<double> last_accuracy() const { return job_.last_accuracy(); }
  std::optional<double> time_to_target() const { return job_.time_to_target(); }
  std::optional<double> seconds_running() const { return job_.seconds_running(); }
  const policy::StragglerPolicy& straggler_policy() const { return policy_.policy(); }
  // Changes a live worker's staleness bounds at run time (the shards hear
  // through the next membership). False for an unknown worker or bounds
  // above kMaxStalenessBound together.
  bool SetWorkerBounds(uint32_t worker, uint32_t staleness, uint32_t staleness_range) {
    return policy_.SetBounds(worker, staleness, staleness_range);
  }
  prometheus::Registry& registry() { return *registry_; }
  double rejected(wire::ErrorCode code) const { return server_.rejected(code); }

  // The accuracy whose first crossing is timed (quickstart: 0.85).
  void set_report_threshold(double t) { job_.set_report_threshold(t); }

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
  // Wires the managers' events: a membership change reaches the data feed;
  // a shard that returns, replication.
  void InstallListeners();
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
  void OnShardRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnWorkerRegister(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // A shard restarted from its checkpoint, claiming its old id.
  void OnShardReturn(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnDeclare(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnHeartbeat(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnShardHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                        std::vector<Outgoing>* out);
  void OnWorkerHeartbeat(const Frame& peer, const Envelope& env, const msg::Heartbeat& hb,
                         std::vector<Outgoing>* out);
  // What a live worker is told: the job's state for it, map, assignment,
  // partitions, pause, faults.
  msg::HeartbeatReply WorkerReply(const WorkerState& w) const;
  void OnAccuracy(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl (operator_commands.cc).
  void OnStatus(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnRemoveWorker(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  void OnShardControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl fault: sets, clears or lists the run-time fault table.
  void OnFaultControl(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // pacerctl set-lr: sets or clears a group's lr override.
  void OnSetLr(const Frame& peer, const Decoded& d, std::vector<Outgoing>* out);
  // The first shard map, the data feed and the batch sizes, once enough
  // shards and workers registered and the model is declared.
  void StartJob(std::vector<Outgoing>* out);
  // The stream's options: the declared training set and the job's flags.
  DataStreamOptions StreamOptions() const;
  // The keys (when not acknowledged) and the membership (when behind) to
  // each shard's channel; `force`: without waiting for the re-send time.
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

  Journal journal_;       // marked by every change worth saving at once
  uint32_t next_id_ = 1;  // the job's one id counter (0 is the monitor itself)
  TimePoint next_gauges_{};

  // The managers (built in this order; see the table above).
  ModelRegistry model_;
  ShardRegistry shards_;
  RangeTable ranges_;
  Replication replication_;
  Membership membership_;
  ShardMoves moves_;
  DataFeed data_;
  PolicyDriver policy_;
  JobLifecycle job_;
  FaultTable faults_;  // run-time faults (pacerctl fault), sent with heartbeat replies
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
  bool stop_failed() const { return failed_; }  // the job ended as a failure
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
  bool failed_ = false;
  std::string policy_summary_;
  std::thread thread_;
};

}  // namespace pacer

#endif  // PACER_MONITOR_MONITOR_H_
