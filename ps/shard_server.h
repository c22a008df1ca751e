// Runs a ShardCore on a transport: binds the shard's ROUTER socket, registers
// with the monitor, then serves on one thread until the job stops.
#ifndef PACER_PS_SHARD_SERVER_H_
#define PACER_PS_SHARD_SERVER_H_

#include <atomic>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "ps/base/mutex.h"
#include "ps/checkpoint_writer.h"
#include "ps/base/fault.h"
#include "ps/shard.h"
#include "ps/base/transport.h"

namespace pacer {

struct ShardServerOptions {
  // Address to bind (--listen); port 0 picks an ephemeral port.
  std::string listen = "tcp://127.0.0.1:0";
  // The monitor's address (--monitor). Required.
  std::string monitor;
  // The address workers and the monitor are told to reach this shard at
  // (--advertise), e.g. behind NAT or a Kubernetes Service; empty: the bound
  // address.
  std::string advertise;
  // The host or Kubernetes node this shard runs on (--node): the monitor
  // places a range's replicas on different ones. Empty: the host of the
  // advertised address.
  std::string node;
  // Core settings (--max-message-bytes, --no-apply, ...).
  ShardOptions shard;
  // How long Start keeps trying to register with the monitor.
  Duration register_timeout = std::chrono::seconds(30);
  // Deadline of one request to the monitor.
  Duration request_timeout = std::chrono::seconds(1);
  // Interval between heartbeats to the monitor.
  Duration heartbeat_interval = std::chrono::milliseconds(200);
  // Checkpoints (--data-dir): empty means none. The shard keeps its RocksDB
  // store in DATA_DIR/checkpoint, loads the latest snapshot at start and
  // registers again under its old id. Each range it serves since a
  // promotion is checkpointed in DATA_DIR/range-<id>, and served from there
  // if the monitor gives it that range again after a restart.
  std::string data_dir;
  // A checkpoint is taken this long after the previous one (0: never on
  // time) or after this many applied pushes (0: never on count), whichever
  // comes first, and once more when the shard stops.
  Duration checkpoint_interval = std::chrono::seconds(10);
  uint64_t checkpoint_updates = 0;
  // How long the final checkpoint may take when the shard stops
  // (--stop-timeout): past it the checkpoint is given up, the previous one
  // stays, and stop_status() says why (pacer-server then exits 1).
  Duration stop_timeout = std::chrono::seconds(30);
  // false only to show a chaos invariant failing (--unsafe-disable
  // checkpoints): after its first checkpoint on time or count the shard
  // takes no more (but for key moves and at exit), so a crash loses
  // everything acknowledged since.
  bool periodic_checkpoints = true;
  // With backups, a primary that has not heard from the monitor for its
  // shard lease stops answering (fencing). false only to show a chaos
  // invariant failing (--unsafe-disable fencing): a primary cut off from
  // the monitor goes on acknowledging after a backup took its range over.
  bool fencing = true;
  // When it leaves, the shard writes to this file (--ledger; empty: none),
  // for each range it serves or holds a replica of: its role, epoch, last
  // record, a CRC-32 of its parameters and optimizer state, and its ledger,
  // every (worker, seq) applied (ShardCore::ledger()). For audits: the
  // chaos runner checks the workers' journals of durable pushes against it.
  std::string ledger;
  // When set and true, Start stops trying to register and returns
  // Cancelled (SIGTERM before the monitor answered).
  const std::atomic<bool>* cancel = nullptr;
  // This process's fault layer (ps/base/fault.h), for the run-time faults the
  // monitor sends with its heartbeat replies; null: none.
  std::shared_ptr<FaultInjector> faults;
};

class ShardServer {
 public:
  // Binds, registers with the monitor (retrying until register_timeout) and
  // starts the serving thread. `transport` and `clock` must outlive the server.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ShardServer>> Start(Transport* transport,
                                                            const ShardServerOptions& options);
  ~ShardServer();

  // The bound address, e.g. tcp://127.0.0.1:40123.
  const std::string& address() const { return address_; }
  uint32_t id() const { return id_; }
  // Asks the serving thread to stop (SIGTERM): it takes a final checkpoint
  // and deregisters from the monitor. Thread-safe.
  void Shutdown() { shutdown_ = true; }
  // Whether this shard started from a checkpoint.
  bool restored() const { return restored_; }
  // Blocks until the serving thread has ended (job stopped or Shutdown).
  void Wait();
  // True once the serving thread has ended.
  bool done() const { return done_; }
  // After Wait(): OK, or why the stop was not clean (the final checkpoint
  // was given up at stop_timeout).
  const absl::Status& stop_status() const { return stop_status_; }
  // For /readyz: "" while this shard can serve: it holds no key range yet
  // (before the shard map, or idle), or holds its range's values (restored
  // from its checkpoint or initialised); else why not (its keys are
  // declared but their values not yet sent, or it is leaving). Thread-safe.
  std::string NotReadyReason() const;
  // The metrics registry (thread-safe to read).
  prometheus::Registry& registry() { return *registry_; }

 private:
  ShardServer() = default;
  // The serving loop: the only user of router_ and core_.
  void Run();
  // Heartbeats to the monitor on their own thread and connection, so the
  // serving loop waits on one socket only; notices when the job stops.
  // After a shutdown it tells the monitor that this shard leaves.
  void HeartbeatLoop();
  // Hands a snapshot of each core (its own range's, and each range's it
  // serves since a promotion) to its writer when one is due (or `final`:
  // one last snapshot of each, given up after stop_timeout).
  void MaybeCheckpoint(bool final);
  // Leaving: how long the shard waits for its last records to be held by
  // its backups and for its replicas' last records.
  static constexpr Duration kLeaveWait = std::chrono::seconds(3);
  // Whether both have happened.
  bool ReplicationSettled() const;
  // Writes options_.ledger (serving thread, after the loop).
  void WriteLedger() const;

  Transport* transport_ = nullptr;
  ShardServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ShardCore> core_;
  std::unique_ptr<Socket> router_;
  std::unique_ptr<class RpcChannel> monitor_;  // used by HeartbeatLoop only
  std::string address_;
  uint32_t id_ = 0;
  std::atomic<bool> shutdown_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> job_stopped_{false};
  std::atomic<int64_t> applied_clock_{-1};  // mirrors core_, for heartbeats
  std::atomic<bool> serving_ended_{false};
  std::atomic<bool> holds_values_{false};  // mirrors core_->initialized()
  std::atomic<bool> holds_keys_{false};    // mirrors core_->has_keys()
  bool restored_ = false;
  std::thread thread_;
  std::thread heartbeat_thread_;

  // Where a core's checkpoints stand (serving thread only): what the last
  // one offered held, and how many were taken on time or count.
  struct CheckpointProgress {
    TimePoint last{};
    uint64_t updates = 0;
    int64_t clock = -2;
    uint64_t keys = 0;
    uint64_t periodic_taken = 0;
  };
  // Offers `core`'s snapshot to `writer` when one is due; `final`: one last
  // snapshot, given up at `deadline`. `range` names a range served since a
  // promotion in logs (0: this shard's own).
  void Checkpoint(ShardCore& core, CheckpointWriter& writer, CheckpointProgress& progress,
                  bool final, TimePoint deadline, uint32_t range);
  // DATA_DIR/range-<id>: where a range served since a promotion is
  // checkpointed, apart from this shard's own (DATA_DIR/checkpoint).
  absl::StatusOr<std::string> RangeCheckpointPath(uint32_t range) const;
  // A writer to that store (null, logged, when it cannot be opened; null
  // without --data-dir).
  std::unique_ptr<CheckpointWriter> RangeWriter(uint32_t range);
  // That range's latest checkpoint here (nullopt: none), for when the
  // monitor tells this shard to serve it and it holds no replica of it (it
  // restarted, and every other holder of the range is gone too).
  absl::StatusOr<std::optional<ShardSnapshot>> LoadRangeCheckpoint(uint32_t range) const;

  // Checkpoints (null: no --data-dir).
  std::unique_ptr<CheckpointWriter> writer_;
  CheckpointProgress checkpointed_;
  absl::Status stop_status_;               // serving thread; read after Wait()
  // Restored from a checkpoint: its own range answers no push, pull or init
  // until the serving thread has taken the monitor's first heartbeat reply
  // (which may say that a backup serves the range now, promoted because
  // this process restarted), so that nothing is acknowledged from the
  // checkpoint's older state beside that backup.
  bool awaiting_monitor_ = false;            // serving thread
  std::atomic<bool> heard_monitor_{false};   // set with a reply's configs, under lr_mu_

  // pacerctl set-lr's overrides (version, by group) from a heartbeat reply,
  // until the serving thread hands them to core_.
  // Guards what the heartbeat thread hands the serving thread (pending_*,
  // lease_until_ns_ with them) and what the serving thread hands back for
  // the heartbeats (report_*).
  Mutex lr_mu_;
  std::optional<std::pair<uint64_t, std::vector<wire::GroupLr>>> pending_lr_ ABSL_GUARDED_BY(lr_mu_);

  // Replication (--replicas on the monitor): the replica set from the last
  // heartbeat reply that changed it, until the serving thread takes it.
  struct ReplicaConfig {
    uint64_t epoch = 0;
    std::vector<msg::ShardInfo> backups;
    std::vector<msg::ShardInfo> backing;
    bool deposed = false;  // its own range is served elsewhere (epoch: the range's)
    bool hold_durable = false;  // a standby of its range may be promoted
  };
  std::optional<ReplicaConfig> pending_replication_ ABSL_GUARDED_BY(lr_mu_);
  // The serving thread's: connects to new backups, lets go of old ones, and
  // hands the set to core_.
  void ApplyReplication(const ReplicaConfig& config, std::vector<ShardCore::Outgoing>* out);
  // Its connections to its range's backups, by shard id.
  struct BackupSocket {
    std::string address;
    std::unique_ptr<Socket> socket;
  };
  std::map<uint32_t, BackupSocket> backup_sockets_;

  // Failover: ranges this shard serves since the monitor promoted its
  // replica of them, each with a core and a socket of its own (the range
  // keeps its id; the map gives the workers the new address).
  struct Hosted {
    uint32_t range = 0;
    uint64_t epoch = 0;
    std::unique_ptr<ShardCore> core;
    std::unique_ptr<Socket> router;
    std::string address;  // as advertised
    bool stopped = false;
    std::map<uint32_t, BackupSocket> backups;  // its range's backups
    // Its checkpoints, in DATA_DIR/range-<id> (null: no --data-dir, or
    // let go once the range is served elsewhere).
    std::unique_ptr<CheckpointWriter> writer;
    CheckpointProgress checkpointed;
  };
  // The list from the last heartbeat reply that changed it: the ranges to
  // serve (each with its backups' ids) and those backups.
  struct PromoteConfig {
    std::vector<msg::ShardInfo> ranges;
    std::vector<msg::ShardInfo> backups;
    std::vector<uint32_t> hold;  // ranges whose durability is held (a standby)
  };
  std::vector<Hosted> hosted_;  // serving thread
  std::optional<PromoteConfig> pending_promote_ ABSL_GUARDED_BY(lr_mu_);
  // Served ranges that failed over again elsewhere (range -> its new
  // epoch), from a heartbeat reply.
  std::map<uint32_t, uint64_t> pending_deposed_ ABSL_GUARDED_BY(lr_mu_);
  // Serves the ranges new to the list from their replicas (from their
  // checkpoints here when it holds none), and sets every served range's
  // backups.
  void Promote(const PromoteConfig& config);
  // Connects to the backups named by `ids` (addresses and keys from
  // `infos`), keeping connections that stay; returns the ids connected.
  std::vector<uint32_t> ConnectBackups(const std::vector<msg::ShardInfo>& infos,
                                       const std::vector<uint32_t>& ids,
                                       std::map<uint32_t, BackupSocket>* sockets);
  // One of a core's outgoing messages: a reply on `router`, or a record to
  // one of `backups`.
  void Send(ShardCore::Outgoing& o, Socket* router, std::map<uint32_t, BackupSocket>& backups);
  // What the heartbeats report (replicas held, ranges served), guarded by
  // lr_mu_, refreshed by the serving thread.
  void UpdateReports();
  std::vector<msg::ShardInfo> report_replicas_ ABSL_GUARDED_BY(lr_mu_);
  std::vector<msg::ShardInfo> report_serving_ ABSL_GUARDED_BY(lr_mu_);
  std::vector<msg::ShardInfo> report_lagging_ ABSL_GUARDED_BY(lr_mu_);  // per range served: backups behind
  std::vector<msg::RangeLag> report_lag_ ABSL_GUARDED_BY(lr_mu_);        // per range served with backups
  std::atomic<bool> heartbeat_now_{false};
  // pacerctl drain-shard with backups: the monitor asked this primary to
  // hand its range over (HeartbeatReply.hand_off); the serving thread has
  // made it stop applying and its backups hold everything (reported in
  // Heartbeat.handed_off).
  std::atomic<bool> hand_off_requested_{false};
  std::atomic<bool> handed_off_{false};
  std::atomic<bool> left_for_hand_off_{false};  // Leave called for it (serving thread)
  // The monitor gave the drain up before the backups held the last record
  // (heartbeat thread): the serving thread applies again (CancelLeave).
  std::atomic<bool> cancel_hand_off_{false};
  ShardJob job_;  // from registration
  // The shard lease (the monitor's --shard-lease): fenced past
  // lease_until_ns_ (the transport clock's nanoseconds).
  Duration shard_lease_ = std::chrono::seconds(1);
  // Renewed under lr_mu_ together with the configs from the same reply (a
  // deposing must not be seen after the lease it came with); read by the
  // serving thread under lr_mu_ too.
  std::atomic<int64_t> lease_until_ns_{std::numeric_limits<int64_t>::max()};
};

}  // namespace pacer

#endif  // PACER_PS_SHARD_SERVER_H_
